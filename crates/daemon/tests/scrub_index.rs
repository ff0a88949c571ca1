//! The scrubber's guest index between full passes: with I/O hints on, a
//! scrub re-reads only the guest pages the hints named, reads only the
//! host cache pages whose verdict may have changed, and a host cache page
//! whose content reached the guest through a hinted read is dropped at
//! once. A real process stands in for the guest (a `qemu`-named python3
//! holding an image file open read-write and 64 MiB of anonymous "RAM");
//! the hints are given by hand (the BPF path that produces them is tested
//! in `pagesift-linux`'s iohint tests and the bench's guest tests). The
//! stand-in's memory is checked unchanged: scrubbing only reads it.
//! Root is needed (`/proc/PID/mem`, `/proc/kpageflags`).

use pagesift_daemon::config::ScrubSection;
use pagesift_daemon::scrub::{FULL_INDEX_EVERY, Scrubber};
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{Child, Command, Stdio};

const MIB: u64 = 1 << 20;
const IMAGE_MIB: u64 = 4;

/// The stand-in: names itself `qemu-standin`, opens `image` read-write,
/// maps 80 MiB of anonymous memory filled with distinct pages, prints its
/// pid and the mapping's address, then on "load OFF" copies the image
/// into the mapping at offset OFF, on "wipe OFF LEN" writes distinct
/// pages over that range, and on "sum" prints a checksum of it.
const STANDIN: &str = r#"
import ctypes, hashlib, mmap, os, sys
ctypes.CDLL(None).prctl(15, b"qemu-standin", 0, 0, 0)
f = open(sys.argv[1], "r+b")
ram = mmap.mmap(-1, 80 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, 80 << 20, 4096):
    ram[off:off + 16] = b"standin-page" + off.to_bytes(4, "little")
addr = ctypes.addressof(ctypes.c_char.from_buffer(ram))
print(os.getpid(), addr, flush=True)
for line in sys.stdin:
    cmd = line.split()
    if cmd[0] == "load":
        off = int(cmd[1])
        f.seek(0)
        data = f.read()
        ram[off:off + len(data)] = data
        print("loaded", flush=True)
    elif cmd[0] == "wipe":
        off, n = int(cmd[1]), int(cmd[2])
        for o in range(off, off + n, 4096):
            ram[o:o + 16] = b"wiped-page-" + o.to_bytes(5, "little")
        print("wiped", flush=True)
    elif cmd[0] == "sum":
        print(hashlib.blake2b(ram[:], digest_size=16).hexdigest(), flush=True)
"#;

struct Standin {
    child: Child,
    out: BufReader<std::process::ChildStdout>,
    pid: u32,
    addr: u64,
}

impl Standin {
    fn start(image: &std::path::Path) -> Standin {
        let mut child = Command::new("python3")
            .args(["-c", STANDIN])
            .arg(image)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let mut it = line.split_whitespace().map(|w| w.parse::<u64>().unwrap());
        let (pid, addr) = (it.next().unwrap() as u32, it.next().unwrap());
        Standin {
            child,
            out,
            pid,
            addr,
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }
}

impl Drop for Standin {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Reads the whole image, so that all of it is in the host page cache.
fn cache(image: &std::path::Path) {
    let f = std::fs::File::open(image).unwrap();
    let mut buf = vec![0u8; MIB as usize];
    for k in 0..IMAGE_MIB {
        f.read_at(&mut buf, k * MIB).unwrap();
    }
}

#[test]
fn hinted_guest_pages_are_indexed_without_a_full_pass() {
    pagesift_testkit::require_root();
    let tmp = pagesift_testkit::temp_dir("scrub-index");
    let image = tmp.path().join("disk.img");
    let data: Vec<u8> = (0..IMAGE_MIB * MIB)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8 ^ (i / 4096) as u8)
        .collect();
    // Written back before the first scrub: dirty pages are never dropped.
    let mut f = std::fs::File::create(&image).unwrap();
    f.write_all(&data).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut guest = Standin::start(&image);
    let pages = IMAGE_MIB * MIB / 4096;

    let mut scrub = Scrubber::new(
        ScrubSection {
            enabled: true,
            ..ScrubSection::default()
        },
        0,
    );
    scrub.set_io_hints(true);

    // 1. The first scrub indexes all of the guest; it holds none of the
    // image yet, so nothing is dropped.
    cache(&image);
    let (dropped, cached) = scrub.scrub_all(&[guest.pid]);
    let st = scrub.status();
    assert!(st.errors.is_empty(), "{:?}", st.errors);
    assert_eq!((dropped, cached), (0, pages), "{st:?}");
    assert_eq!(st.full_indexes, 1);
    let full_pass = st.indexed_pages;
    assert!(full_pass >= 80 * MIB / 4096, "{st:?}");
    assert_eq!(
        st.examined_pages, pages,
        "a full pass reads every cached page"
    );

    // 1b. Nothing was read into the guest since: a scrub between full
    // passes reads none of the cached pages again (the guest held none of
    // them, and none of its pages changed), and drops nothing.
    let (dropped, cached) = scrub.scrub_all(&[guest.pid]);
    let st = scrub.status();
    assert_eq!((dropped, cached), (0, pages), "{st:?}");
    assert_eq!(st.full_indexes, 1);
    assert_eq!(st.examined_pages, pages, "cached pages were read again");

    // 2. The guest "reads" the image into its RAM at 1 MiB; the hint names
    // those pages. The next scrub re-reads only them, reads again the
    // cached pages that now have a twin among them, and drops the whole
    // cached image.
    let at = guest.addr + MIB;
    assert_eq!(guest.ask(&format!("load {MIB}")), "loaded");
    let sum = guest.ask("sum");
    scrub.note_io(guest.pid, at, pages);
    cache(&image);
    let (dropped, cached) = scrub.scrub_all(&[guest.pid]);
    let st = scrub.status();
    assert_eq!(st.full_indexes, 1, "no second full pass");
    assert_eq!(st.indexed_pages - full_pass, pages, "only the hinted pages");
    assert_eq!(cached, pages);
    assert_eq!(dropped, pages, "{st:?}");
    assert_eq!(st.examined_pages, 2 * pages);

    // 3. Changes the hints do not see: the guest overwrites its copy and
    // loads the image again elsewhere, with no hint. The index still names
    // the old copy, whose bytes no longer match, so the host copy is kept
    // (never dropped on a stale index) ...
    assert_eq!(
        guest.ask(&format!("wipe {MIB} {}", IMAGE_MIB * MIB)),
        "wiped"
    );
    assert_eq!(guest.ask(&format!("load {}", 40 * MIB)), "loaded");
    cache(&image);
    let before = scrub.status().full_indexes;
    let (dropped, cached) = scrub.scrub_all(&[guest.pid]);
    assert_eq!(scrub.status().full_indexes, before);
    assert_eq!((dropped, cached), (0, pages), "{:?}", scrub.status());
    // ... until the next full pass, at most FULL_INDEX_EVERY scrubs on,
    // finds the new copy.
    let mut scrubs = 0;
    let dropped = loop {
        cache(&image);
        let (dropped, _) = scrub.scrub_all(&[guest.pid]);
        scrubs += 1;
        if scrub.status().full_indexes > before || scrubs > FULL_INDEX_EVERY {
            break dropped;
        }
        assert_eq!(dropped, 0);
    };
    assert_eq!(scrub.status().full_indexes, before + 1);
    assert_eq!(dropped, pages);

    // Scrubbing only read the stand-in: its memory is as it left it, and
    // it still answers.
    let sum_after = guest.ask("sum");
    assert_ne!(sum, sum_after, "it loaded a second copy");
    assert_eq!(guest.ask("sum"), sum_after);
    assert!(guest.child.try_wait().unwrap().is_none());
}
