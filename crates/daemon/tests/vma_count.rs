//! `LinuxTarget::vma_count`, the VMA budget's input, against a real
//! process: the count `/proc/PID/maps` gives, kept for a second unless
//! pagesift advises the process, which drops it. A python3 process maps
//! new VMAs on request; its memory is only looked at (root:
//! `/proc/PID/maps`, pagemap and kpageflags for the source).

use pagesift_daemon::target::{LinuxTarget, RegionLimits, Target, VMA_COUNT_FRESH};
use pagesift_linux::{ProcessFilter, proc};
use pagesift_testkit::require_root;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

/// Maps `n` small anonymous VMAs of alternating protections (so the
/// kernel cannot join them) for each line `n` read, then answers "ok".
const MAPPER: &str = r#"
import mmap, sys
keep = []
print("ready", flush=True)
for line in sys.stdin:
    for i in range(int(line)):
        prot = mmap.PROT_READ if i % 2 == 0 else mmap.PROT_READ | mmap.PROT_WRITE
        keep.append(mmap.mmap(-1, 2 * 4096, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=prot))
    print("ok", flush=True)
"#;

#[test]
fn a_vma_count_is_kept_a_second_and_dropped_when_pagesift_advises() {
    require_root();
    let mut child = Command::new("python3")
        .args(["-c", MAPPER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let pid = child.id();
    let mut input = child.stdin.take().unwrap();
    let mut output = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut ask = |n: u32, line: &mut String| {
        if n > 0 {
            writeln!(input, "{n}").unwrap();
        }
        line.clear();
        output.read_line(line).unwrap();
    };
    ask(0, &mut line);
    assert_eq!(line.trim(), "ready");
    let mut target = LinuxTarget::new(
        ProcessFilter::pids([pid]),
        RegionLimits {
            subregion_pages: 16_384,
            max_regions: 1024,
        },
    )
    .expect("target");
    let before = target.vma_count(pid).expect("count");
    assert_eq!(Some(before), proc::map_count(pid).ok());

    ask(4, &mut line);
    assert_eq!(line.trim(), "ok");
    let now = proc::map_count(pid).unwrap();
    assert!(now > before, "{before} -> {now}");
    // Kept: the budget checks of one wake-up read maps once.
    assert_eq!(target.vma_count(pid), Some(before));
    // pagesift's advice drops it.
    target.note_advised(pid, 0, 4096, false);
    assert_eq!(target.vma_count(pid), Some(now));
    // So does time.
    ask(4, &mut line);
    std::thread::sleep(VMA_COUNT_FRESH + std::time::Duration::from_millis(50));
    assert_eq!(target.vma_count(pid), proc::map_count(pid).ok());
    assert!(target.vma_count(pid).unwrap() > now);
    assert!(child.try_wait().unwrap().is_none(), "the process died");
    drop(input);
    assert!(child.wait().unwrap().success());
}
