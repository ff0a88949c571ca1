//! Live tests of write tracking ([`pagesift_linux::uffd::WriteTracker`]):
//! real targets (`examples/inject_target.rs`), a real userfaultfd
//! registered inside them by injection, real `PAGEMAP_SCAN` re-arming.
//!
//! Every test checks that the target was not harmed (its own checksum and
//! syscall checks, a clean exit) and that no userfaultfd is left in it.
//! Writes are made with `process_vm_writev` of the bytes already there:
//! the page is written (its write-protection fault is taken, in kernel
//! mode, which is the harder case for `UFFD_USER_MODE_ONLY`) while its
//! content, and so the target's checksum, stays the same. Root is needed.

use pagesift_linux::discover;
use pagesift_linux::inject::{InjectConfig, Injector, Outcome};
use pagesift_linux::uffd::{TrackOutcome, WriteTracker, close_calls, count_userfaultfds};
use pagesift_testkit::Target;
use std::io::{IoSlice, IoSliceMut};
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;

/// Four pages at 256 MiB, where the injection target maps nothing: a range
/// "unmapped since it was chosen". Each test checks it is still a hole.
const HOLE: (u64, u64) = (0x1000_0000, 0x1000_0000 + 4 * PAGE);

/// One test at a time (pagesift_testkit::serial), as root: the
/// write-tracking tests ptrace other processes.
fn serial() -> pagesift_testkit::Serial {
    pagesift_testkit::require_root();
    pagesift_testkit::serial()
}

/// Writes page `addr` of `pid` with the bytes it already holds.
fn rewrite_page(pid: u32, addr: u64) {
    use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
    let p = nix::unistd::Pid::from_raw(pid as i32);
    let remote = [RemoteIoVec {
        base: addr as usize,
        len: PAGE as usize,
    }];
    let mut buf = vec![0u8; PAGE as usize];
    assert_eq!(
        process_vm_readv(p, &mut [IoSliceMut::new(&mut buf)], &remote).unwrap(),
        PAGE as usize
    );
    assert_eq!(
        process_vm_writev(p, &[IoSlice::new(&buf)], &remote).unwrap(),
        PAGE as usize
    );
}

fn tracking(o: TrackOutcome) -> Vec<(u64, u64)> {
    match o {
        TrackOutcome::Tracking {
            registered,
            unmapped,
        } => {
            assert_eq!(unmapped, vec![], "nothing was unmapped");
            registered
        }
        other => panic!("expected tracking, got {other:?}"),
    }
}

/// A sleeping target with its whole region write-tracked, and the injector
/// and tracker that did it.
fn tracked_sleeper() -> (Target, Injector, WriteTracker) {
    let t = Target::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let mut inj = Injector::new(InjectConfig::default());
    let mut wt = WriteTracker::new();
    tracking(wt.track(&mut inj, pid, &[(addr, addr + len)]).unwrap());
    (t, inj, wt)
}

#[test]
fn writes_are_seen_exactly_and_unregistering_leaves_no_fd() {
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let end = addr + len;
    let mut inj = Injector::new(InjectConfig::default());
    let mut wt = WriteTracker::new();
    assert_eq!(count_userfaultfds(pid), 0);
    let got = tracking(wt.track(&mut inj, pid, &[(addr, end)]).unwrap());
    assert_eq!(got, vec![(addr, end)]);
    assert_eq!(wt.tracked_ranges(), 1);
    assert_eq!(count_userfaultfds(pid), 1, "one userfaultfd in the target");
    // Armed: nothing written since.
    assert_eq!(wt.written_pages(pid, addr, end), Some(0));
    // Write N pages: exactly N reported, then 0 once re-armed.
    let n = 7.min(len / PAGE);
    let pages: Vec<u64> = (0..n).map(|i| addr + i * 3 % (len / PAGE) * PAGE).collect();
    for &p in &pages {
        rewrite_page(pid, p);
    }
    assert_eq!(wt.written_pages(pid, addr, end), Some(pages.len() as u64));
    assert_eq!(wt.written_pages(pid, addr, end), Some(0));
    // Per page: written once → true, then false.
    rewrite_page(pid, pages[1]);
    assert_eq!(wt.take_written(pid, pages[1]), Some(true));
    assert_eq!(wt.take_written(pid, pages[1]), Some(false));
    assert_eq!(wt.take_written(pid, pages[2]), Some(false));
    // Outside the tracked range: no answer.
    assert_eq!(wt.take_written(pid, end), None);
    // Unregister + close in the target.
    let o = wt.untrack_process(&mut inj, pid).unwrap();
    let d = o.done().expect("untracked by injection");
    assert!(d.results.iter().all(|&r| r == 0), "{:?}", d.results);
    assert_eq!(wt.tracked_ranges(), 0);
    assert_eq!(count_userfaultfds(pid), 0, "no userfaultfd left");
    assert_eq!(wt.take_written(pid, pages[0]), None);
    // The page is writable as before (no write-protect left behind).
    rewrite_page(pid, pages[0]);
    let report = t.finish();
    assert!(report["iterations"].as_u64().unwrap() > 0, "{report}");
}

/// Tracks and untracks over and over while the target's thread is blocked
/// in `mode`'s syscall; the target checks that every call completed.
fn hammer_track(mode: &str, args: &[&str]) {
    let mut t = Target::start(mode, args);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let mut inj = Injector::new(InjectConfig::default());
    let mut wt = WriteTracker::new();
    let mut rounds = 0u64;
    let mut sent = 0u64;
    let stop = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < stop {
        if mode == "read" {
            t.send(&sent.to_le_bytes());
            sent += 1;
        }
        tracking(wt.track(&mut inj, pid, &[(addr, addr + len)]).unwrap());
        rewrite_page(pid, addr);
        assert_eq!(wt.written_pages(pid, addr, addr + len), Some(1));
        wt.untrack_process(&mut inj, pid).unwrap();
        rounds += 1;
    }
    assert_eq!(count_userfaultfds(pid), 0);
    let report = t.finish();
    if mode == "read" {
        assert_eq!(report["iterations"].as_u64(), Some(sent), "{report}");
    } else {
        assert!(report["iterations"].as_u64().unwrap() >= 20, "{report}");
    }
    eprintln!("{mode}: {rounds} track/untrack rounds, {report}");
}

#[test]
fn blocked_threads_see_no_error() {
    let _g = serial();
    hammer_track("sleep", &["--ms", "20"]);
    hammer_track("futex", &["--ms", "20"]);
    hammer_track("read", &[]);
}

#[test]
fn a_range_with_another_userfaultfd_is_skipped() {
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let mut inj = Injector::new(InjectConfig::default());
    // The first tracker stands for an application's own userfaultfd.
    let mut first = WriteTracker::new();
    tracking(first.track(&mut inj, pid, &[(addr, addr + len)]).unwrap());
    let mut second = WriteTracker::new();
    match second.track(&mut inj, pid, &[(addr, addr + len)]).unwrap() {
        TrackOutcome::Skipped(why) => assert!(why.contains("already uses userfaultfd"), "{why}"),
        other => panic!("expected a skip, got {other:?}"),
    }
    assert_eq!(second.tracked_ranges(), 0);
    assert_eq!(
        count_userfaultfds(pid),
        1,
        "the skipped attempt closed its fd"
    );
    first.untrack_process(&mut inj, pid).unwrap();
    assert_eq!(count_userfaultfds(pid), 0);
    t.finish();
}

/// A range unmapped between the daemon's choice and the registration
/// (here one the target never mapped) is reported unmapped, not refused:
/// the range beside it is registered, writes there are seen, and a call
/// with only such a range leaves no userfaultfd in the target.
#[test]
fn a_range_that_is_not_mapped_is_reported_unmapped_not_refused() {
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let end = addr + len;
    let hole = HOLE;
    assert!(
        !discover::range_mapped(pid, hole.0, hole.1),
        "256 MiB is a hole"
    );
    assert!(discover::range_mapped(pid, addr, end));
    let mut inj = Injector::new(InjectConfig::default());
    let mut wt = WriteTracker::new();
    let only_hole = TrackOutcome::Tracking {
        registered: vec![],
        unmapped: vec![hole],
    };
    // The hole alone: nothing tracked, nothing refused, the fd opened for
    // it closed again.
    assert_eq!(wt.track(&mut inj, pid, &[hole]).unwrap(), only_hole);
    assert_eq!(wt.tracked_ranges(), 0);
    assert_eq!(count_userfaultfds(pid), 0);
    // Beside the region: the region is tracked.
    assert_eq!(
        wt.track(&mut inj, pid, &[(addr, end), hole]).unwrap(),
        TrackOutcome::Tracking {
            registered: vec![(addr, end)],
            unmapped: vec![hole],
        }
    );
    assert_eq!(count_userfaultfds(pid), 1);
    // The hole again, with the fd open: the same answer, the fd kept.
    assert_eq!(wt.track(&mut inj, pid, &[hole]).unwrap(), only_hole);
    assert_eq!(count_userfaultfds(pid), 1);
    rewrite_page(pid, addr);
    assert_eq!(wt.written_pages(pid, addr, end), Some(1));
    wt.untrack_process(&mut inj, pid).unwrap();
    assert_eq!(count_userfaultfds(pid), 0);
    t.finish();
}

/// An unregistration that cannot run now (another tracer holds the
/// target, so the attach is skipped) forgets nothing: the range stays
/// tracked and the descriptor known, and the next call, once the target
/// can be attached, leaves nothing in it.
#[test]
fn an_untrack_that_cannot_attach_is_kept_for_later() {
    let _g = serial();
    let (t, mut inj, mut wt) = tracked_sleeper();
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let hold = pagesift_testkit::SeizedHold::new(pid);
    let o = wt.untrack_process(&mut inj, pid).unwrap();
    assert!(matches!(o, Outcome::Skipped(_)), "{o:?}");
    assert_eq!(wt.ranges(pid), &[(addr, addr + len)], "still tracked");
    assert!(wt.target_fd(pid).is_some(), "the descriptor still known");
    assert_eq!(count_userfaultfds(pid), 1);
    hold.release();
    let o = wt.untrack_process(&mut inj, pid).unwrap();
    assert!(matches!(o, Outcome::Done(_)), "{o:?}");
    assert_eq!(wt.tracked_ranges(), 0);
    assert_eq!(wt.target_fd(pid), None);
    assert_eq!(count_userfaultfds(pid), 0);
    t.finish();
}

/// The calls that end tracking close the descriptor even when every range
/// registered with it is gone, whose unregisters fail (EINVAL): the close
/// waits for `UFFDIO_WAKE`'s proof, not for an unregister.
#[test]
fn the_descriptor_is_closed_even_when_its_ranges_are_gone() {
    let _g = serial();
    let (t, mut inj, mut wt) = tracked_sleeper();
    let pid = t.pid();
    let fd = wt.target_fd(pid).unwrap();
    let hole = HOLE;
    assert!(
        !discover::range_mapped(pid, hole.0, hole.1),
        "256 MiB is a hole"
    );
    let Outcome::Done(i) = inj.run(pid, &close_calls(fd, &[hole])).unwrap() else {
        panic!("the attach did not run");
    };
    assert_eq!(i.results[0], -22, "the unregister of a gone range fails");
    assert_eq!(&i.results[1..], &[0, 0], "proved, then closed");
    assert_eq!(count_userfaultfds(pid), 0);
    wt.forget(pid);
    t.finish();
}

#[test]
fn a_target_that_exits_mid_tracking_is_fine() {
    let _g = serial();
    let (mut t, mut inj, mut wt) = tracked_sleeper();
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    t.child.kill().unwrap();
    t.child.wait().unwrap();
    assert_eq!(wt.take_written(pid, addr), None);
    let o = wt.untrack_process(&mut inj, pid).unwrap();
    assert!(matches!(o, Outcome::Gone(_)), "{o:?}");
    assert_eq!(wt.tracked_ranges(), 0);
    // Tracking a pid that no longer exists is Gone too.
    let again = wt.track(&mut inj, pid, &[(addr, addr + len)]).unwrap();
    assert_eq!(again, TrackOutcome::Gone);
}

#[test]
fn linux_source_answers_take_written_for_tracked_ranges_only() {
    use pagesift_core::PageRef;
    use pagesift_core::source::MemorySource;
    use pagesift_linux::{LinuxSource, ProcessFilter, SourceConfig};
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let mut src = LinuxSource::new(ProcessFilter::pids([pid]), SourceConfig::default()).unwrap();
    let region = src
        .linux_regions()
        .find(|r| r.pid == pid && r.start <= addr && addr < r.start + r.pages as u64 * PAGE)
        .expect("the target's region")
        .clone();
    let page = ((addr - region.start) / PAGE) as u32;
    let at = PageRef {
        region: region.id,
        page,
    };
    // Not tracked yet: no answer.
    assert_eq!(src.take_written(at), None);
    let mut inj = Injector::new(InjectConfig::default());
    tracking(
        src.write_tracker()
            .track(&mut inj, pid, &[(addr, addr + len)])
            .unwrap(),
    );
    assert_eq!(src.take_written(at), Some(false));
    rewrite_page(pid, addr);
    assert_eq!(src.take_written(at), Some(true));
    assert_eq!(src.take_written(at), Some(false));
    src.write_tracker().untrack_process(&mut inj, pid).unwrap();
    assert_eq!(src.take_written(at), None);
    assert_eq!(count_userfaultfds(pid), 0);
    t.finish();
}

/// The target's own user-mode writes to armed pages are resolved by the
/// kernel (async mode) and counted exactly; the target keeps running.
#[test]
fn a_targets_own_writes_are_counted_and_it_keeps_running() {
    let _g = serial();
    let mut w = pagesift_testkit::Workload::start(&["static-dup", "--mib", "8"]);
    let (pid, (start, pages)) = (w.pid(), w.region());
    let end = start + pages * PAGE;
    let mut inj = Injector::new(InjectConfig::default());
    let mut wt = WriteTracker::new();
    tracking(wt.track(&mut inj, pid, &[(start, end)]).unwrap());
    assert_eq!(wt.written_pages(pid, start, end), Some(0));
    let before = w.checksum();
    let r = w.ask("rewrite 0 25");
    assert_eq!(r["rewritten"].as_u64(), Some(25), "{r}");
    assert_eq!(wt.written_pages(pid, start, end), Some(25));
    assert_eq!(wt.written_pages(pid, start, end), Some(0));
    // Rewritten again while armed: same content, still counted as written.
    w.ask("rewrite 0 25");
    assert_eq!(wt.written_pages(pid, start, end), Some(25));
    wt.untrack_process(&mut inj, pid).unwrap();
    assert_eq!(count_userfaultfds(pid), 0);
    let after = w.checksum();
    assert_ne!(before, after, "the rewrite changed the pages it wrote");
    assert_eq!(w.checksum(), after, "and nothing else changes them");
}

/// A userfaultfd opened in a target whose handshake never ran (a batch
/// abandoned right after `userfaultfd()`) answers no other ioctl, so the
/// close's proof (`UFFDIO_WAKE`) fails on it. pagesift completes the
/// handshake on its own duplicate (`sys::uffd_api`), as write tracking
/// does for such a batch; then the usual close calls prove it and close
/// it, and the target keeps running with its memory as it was.
#[test]
fn a_handshake_done_on_our_duplicate_lets_the_usual_close_take_the_descriptor_out() {
    use pagesift_linux::inject::{Syscall, uffd_abi};
    use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    use std::os::fd::AsFd;
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "20"]);
    let pid = t.pid();
    let mut inj = Injector::new(InjectConfig::default());
    let Outcome::Done(i) = inj.run(pid, &[Syscall::Userfaultfd]).unwrap() else {
        panic!("the attach did not run");
    };
    let fd = i.results[0];
    assert!(fd >= 0, "{i:?}");
    let fd = fd as i32;
    assert_eq!(count_userfaultfds(pid), 1);
    // Without the handshake the proof fails, so the close does not run.
    let Outcome::Done(i) = inj.run(pid, &close_calls(fd, &[])).unwrap() else {
        panic!("the attach did not run");
    };
    assert_eq!(i.results[0], -22, "UFFDIO_WAKE before the handshake: {i:?}");
    assert_eq!(count_userfaultfds(pid), 1, "not closed without the proof");
    // The handshake, on our duplicate.
    let pidfd = pidfd_open(Pid::from_raw(pid as i32).unwrap(), PidfdFlags::empty()).unwrap();
    let dup = pidfd_getfd(pidfd.as_fd(), fd, PidfdGetfdFlags::empty()).unwrap();
    pagesift_linux::sys::uffd_api(
        dup.as_fd(),
        uffd_abi::FEATURE_WP_ASYNC | uffd_abi::FEATURE_WP_UNPOPULATED,
    )
    .expect("UFFDIO_API on the duplicate");
    assert!(
        pagesift_linux::sys::uffd_api(dup.as_fd(), 0).is_err(),
        "a second handshake is refused: the first one took"
    );
    drop(dup);
    let Outcome::Done(i) = inj.run(pid, &close_calls(fd, &[])).unwrap() else {
        panic!("the attach did not run");
    };
    assert_eq!(i.results, vec![0, 0], "proved, then closed: {i:?}");
    assert_eq!(count_userfaultfds(pid), 0);
    t.finish();
}
