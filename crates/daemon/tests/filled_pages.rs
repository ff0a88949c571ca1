//! `LinuxTarget::filled_pages`, the trigger of the sweep's fill epochs,
//! against real processes: a python3 process that fills memory it mapped
//! earlier counts it (as a guest filling its RAM does), one that maps new
//! memory and fills it between two checks does not, and an idle process
//! counts nothing. The processes are only looked at (`statm`).

use pagesift_daemon::target::{LinuxTarget, RegionLimits, Target};
use pagesift_linux::ProcessFilter;
use pagesift_testkit::require_root;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Maps 64 MiB at start. "fill N": writes N MiB of that mapping, from
/// where the last fill stopped. "new N": maps N MiB more and writes all
/// of it. Answers "ok" to each line.
const FILLER: &str = r#"
import mmap, sys
area = mmap.mmap(-1, 64 << 20, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
done = 0
keep = []
print("ready", flush=True)
for line in sys.stdin:
    what, n = line.split()
    n = int(n) << 20
    if what == "fill":
        for off in range(done, done + n, 4096):
            area[off] = 1
        done += n
    else:
        m = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        for off in range(0, n, 4096):
            m[off] = 1
        keep.append(m)
    print("ok", flush=True)
"#;

struct Filler {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Filler {
    fn start() -> Filler {
        let mut child = Command::new("python3")
            .args(["-c", FILLER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        let mut f = Filler {
            child,
            input,
            output,
        };
        assert_eq!(f.answer(), "ready");
        f
    }

    fn answer(&mut self) -> String {
        let mut line = String::new();
        self.output.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    fn ask(&mut self, what: &str) {
        writeln!(self.input, "{what}").unwrap();
        assert_eq!(self.answer(), "ok");
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn filling_memory_already_mapped_counts_and_mapping_new_memory_does_not() {
    require_root();
    let mut filler = Filler::start();
    let idle = Filler::start();
    let (pid, idle_pid) = (filler.child.id(), idle.child.id());
    let mut target = LinuxTarget::new(
        ProcessFilter::pids([pid, idle_pid]),
        RegionLimits {
            subregion_pages: 16_384,
            max_regions: 1024,
        },
    )
    .expect("target");
    target.refresh().expect("refresh");
    target.processes_changed();
    let count = |t: &LinuxTarget, pid: u32| t.filled_pages().get(&pid).copied();
    assert_eq!(count(&target, pid), Some(0));

    // 16 MiB of the mapping it had: 4096 pages filled.
    filler.ask("fill 16");
    target.processes_changed();
    let filled = count(&target, pid).expect("counted");
    assert!(
        (4096..4096 + 512).contains(&filled),
        "counted {filled} of 4096"
    );

    // 16 MiB mapped and filled between two checks: new memory, not a fill.
    filler.ask("new 16");
    target.processes_changed();
    let after = count(&target, pid).expect("counted");
    assert!(
        after - filled < 512,
        "counted {} for new memory",
        after - filled
    );

    // Another 8 MiB of the old mapping: counted again.
    filler.ask("fill 8");
    target.processes_changed();
    let last = count(&target, pid).expect("counted");
    assert!(
        (2048..2048 + 512).contains(&(last - after)),
        "counted {}",
        last - after
    );

    assert!(count(&target, idle_pid).expect("counted") < 64);
    assert!(
        filler.child.try_wait().unwrap().is_none(),
        "the filler died"
    );
}
