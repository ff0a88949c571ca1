//! ksmd's scan position from the real kernel: `SysKsm::sample` reports the
//! pages ksmd visited (`pages_scanned + pages_skipped`), and, while ksmd
//! scans a real process's mergeable memory, `core::pipeline::scan_clock`
//! learns the length of a full scan from them and gives a position that
//! moves on. The process's pages are distinct (nothing merges) and it
//! keeps running to the end; KSM is given back as it was found (ksmd runs
//! until it has forgotten the process, then the guard restores the knobs).

use pagesift_core::pipeline::pacing::PacingConfig;
use pagesift_core::pipeline::scan_clock::ScanClock;
use pagesift_daemon::ksmd::{KsmControl, SysKsm};
use pagesift_linux::ksm::Ksm;
use pagesift_testkit::{require_root, serial};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// 16 MiB of distinct pages, marked mergeable by the process itself;
/// prints "ready", then waits for its stdin to close.
const MERGEABLE: &str = r#"
import mmap, os, sys
n = 16 << 20
area = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
for off in range(0, n, 4096):
    area[off:off + 16] = os.urandom(16)
area.madvise(mmap.MADV_MERGEABLE)
print("ready", flush=True)
sys.stdin.read()
"#;

#[test]
fn the_scan_position_follows_the_real_ksmd() {
    require_root();
    let _serial = serial();
    let mut ksm = SysKsm::acquire(PacingConfig::default(), Some(Duration::from_secs(120)))
        .expect("taking KSM");
    let sysfs = Ksm::open().unwrap();
    let before = sysfs.counters().unwrap();
    let s = ksm.sample().unwrap();
    let want = before
        .pages_scanned
        .zip(before.pages_skipped)
        .map(|(a, b)| a + b);
    assert!(want.is_some(), "this kernel (6.7+) has both counters");
    assert_eq!(
        s.pages_visited, want,
        "the sample is the sum of the counters"
    );

    let mut child = Command::new("python3")
        .args(["-c", MERGEABLE])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");

    // ksmd paced as for 4096 pages waiting: it scans the process's pages.
    let mut clock = ScanClock::new();
    let t0 = Instant::now();
    let mut positions = Vec::new();
    // The most pages ksmd visited between two readings: an end of a scan
    // is dated at the reading after it, so a measured length is off by up
    // to that much either way (in the suite of 2026-12-03: 3691 pages).
    let (mut last_visited, mut step) = (None, 0);
    while t0.elapsed() < Duration::from_secs(30) && positions.len() < 8 {
        let now = t0.elapsed().as_nanos() as u64;
        ksm.pace(0.2, 4096, 4096, now).unwrap();
        let s = ksm.sample().unwrap();
        if let (Some(a), Some(b)) = (last_visited, s.pages_visited) {
            step = step.max(b - a);
        }
        last_visited = s.pages_visited;
        if let Some(p) = clock.observe(s.full_scans, s.pages_visited) {
            positions.push((p, s.full_scans));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the process kept running"
    );
    drop(child.stdin.take());
    let status = child.wait().unwrap();
    assert!(
        status.success(),
        "the process ended as it meant to: {status}"
    );
    // ksmd forgets a process that exited at its next visit: kept running
    // until its page counts are back where they were, so that nothing of
    // the test's is left in KSM's books.
    let rest =
        |c: &pagesift_linux::ksm::KsmCounters| (c.pages_unshared, c.pages_volatile, c.pages_shared);
    let t1 = Instant::now();
    while rest(&sysfs.counters().unwrap()) != rest(&before) {
        assert!(
            t1.elapsed() < Duration::from_secs(30),
            "ksmd kept the exited process's pages"
        );
        ksm.pace(0.2, 4096, 4096, t0.elapsed().as_nanos() as u64)
            .unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    ksm.restore().unwrap();

    assert!(
        positions.len() >= 2,
        "no position within 30 s of ksmd scanning: {positions:?}"
    );
    // One full scan visits the process's 4096 pages (and whatever else
    // on the machine is mergeable now: nothing at rest), as measured
    // between readings.
    let len = clock.scan_length().unwrap();
    assert!(
        len + step >= 4096,
        "a full scan of {len} pages, {step} pages between readings at most"
    );
    for w in positions.windows(2) {
        assert!(w[1].0 >= w[0].0, "the position went back: {positions:?}");
    }
    for &(p, scans) in &positions {
        assert_eq!(p / 1000, scans, "the position is in the scan KSM is in");
    }
    assert!(
        positions.last().unwrap().0 > positions[0].0,
        "the position moved on: {positions:?}"
    );
}
