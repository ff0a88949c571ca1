# A worker of pagesift bench's interpreter-workers experiment
# (crates/bench/src/interpreters.rs), run by the system's python3:
#
#   python3 -I -c "$(cat worker.py)" DATA_FILE PRIVATE_BYTES WRITE_EVERY_MS WRITE_BYTES SEED
#
# It reads DATA_FILE, which every worker of a run shares, into one bytes
# object, fills a private bytearray of PRIVATE_BYTES with fresh random
# bytes, prints one JSON line (its pid and sizes) and then, forever, every
# WRITE_EVERY_MS overwrites WRITE_BYTES of the bytearray at a random offset
# with new random bytes. The shared block never changes; the private one is
# never the same in two workers, nor from one second to the next.
import json
import os
import random
import sys
import time

path = sys.argv[1]
private_bytes = int(sys.argv[2])
every = float(sys.argv[3]) / 1000.0
write_bytes = int(sys.argv[4])
rng = random.Random(int(sys.argv[5]))

with open(path, "rb") as f:
    data = f.read()
private = bytearray(os.urandom(private_bytes))
print(
    json.dumps(
        {
            "pid": os.getpid(),
            "python": sys.version.split()[0],
            "executable": sys.executable,
            "data_bytes": len(data),
            "private_bytes": len(private),
        }
    ),
    flush=True,
)

due = time.monotonic()
while True:
    at = rng.randrange(0, private_bytes - write_bytes + 1)
    private[at : at + write_bytes] = os.urandom(write_bytes)
    due += every
    wait = due - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    else:
        due = time.monotonic()  # late: do not try to catch up
