//! Live test of the page-cache experiment's read throttle
//! (`pagesift_bench::cgroups::ReadThrottle`): a process in the throttled
//! cgroup reads from the disk at the limit, not at the disk's speed, and
//! at the disk's speed again once the limit is lifted; the cgroups are
//! gone afterwards. Needs root (cgroups); the suite runs as root.

use pagesift_bench::cgroups::{MemoryCgroup, ReadThrottle, disk_of};
use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Time for a process in `memory` (and `throttle`) to read `reads` 4 KiB
/// blocks of `file` with `O_DIRECT` (every read reaches the disk).
fn direct_reads(
    file: &Path,
    reads: u32,
    memory: &MemoryCgroup,
    throttle: &ReadThrottle,
) -> Duration {
    // The shell waits for a line, so that it is in the cgroups before dd
    // issues its first read.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read go && exec dd if={} of=/dev/null bs=4096 count={reads} iflag=direct 2>/dev/null",
            file.display()
        ))
        .stdin(Stdio::piped())
        .spawn()
        .expect("sh");
    memory.add(child.id()).expect("into the memory cgroup");
    throttle.add(child.id()).expect("into the throttled cgroup");
    let t = Instant::now();
    writeln!(child.stdin.take().unwrap(), "go").unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "dd failed: {status}");
    t.elapsed()
}

#[test]
fn a_throttled_process_reads_at_the_limit_until_it_is_lifted() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("read-throttle");
    std::fs::create_dir_all(&dir).unwrap();
    let Some(disk) = disk_of(&dir) else {
        eprintln!("skipped: {} is on no block device", dir.display());
        return;
    };
    let file = dir.join("blocks.bin");
    std::fs::write(&file, vec![0x5a_u8; 1 << 20]).unwrap();
    let f = std::fs::File::open(&file).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let name = format!("pagesift-test-read-throttle-{}", std::process::id());
    let memory = MemoryCgroup::create(&name, 1 << 30).expect("a memory cgroup (root?)");
    // 40 reads at 20 a second: about two seconds (the disk alone: a few
    // milliseconds).
    let throttle = ReadThrottle::create(&name, &memory, disk, 20).expect("a read throttle");
    let slow = direct_reads(&file, 40, &memory, &throttle);
    assert!(
        slow >= Duration::from_millis(1200),
        "40 reads at 20 a second took {slow:?}"
    );
    throttle.lift().unwrap();
    let fast = direct_reads(&file, 40, &memory, &throttle);
    assert!(
        fast < Duration::from_millis(600) && fast * 2 < slow,
        "40 reads after the lift took {fast:?} (throttled: {slow:?})"
    );
    drop(throttle);
    drop(memory);
    for root in [
        "/sys/fs/cgroup/blkio",
        "/sys/fs/cgroup/memory",
        "/sys/fs/cgroup",
    ] {
        let left = Path::new(root).join(&name);
        assert!(!left.exists(), "{} left behind", left.display());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
