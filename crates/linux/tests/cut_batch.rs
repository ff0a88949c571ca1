//! Write tracking when its injected batch is cut part-way
//! ([`pagesift_linux::inject::cut_batches_before`]): a target frozen
//! between two calls of the batch that opens its userfaultfd and registers
//! ranges. Whatever ran before the cut (the descriptor, some
//! registrations) must stay known to the tracker, so that untracking
//! leaves nothing of ours in the target, and the target must run on with
//! its memory unchanged. A splitting batch cut part-way must leave no VMA
//! count that misses its splits.
//!
//! The cut is process-wide, so the tests here run one at a time
//! ([`pagesift_testkit::serial`]) and turn it off when they end, even when
//! they fail ([`Cutting`]). Root is needed.

use pagesift_linux::inject::{
    InjectConfig, Injector, Outcome, Syscall, cut_batches, cut_batches_before,
};
use pagesift_linux::uffd::{TrackOutcome, WriteTracker, count_userfaultfds};
use pagesift_testkit::Target;

/// Turns cutting off when dropped.
struct Cutting;

impl Drop for Cutting {
    fn drop(&mut self) {
        cut_batches(None);
    }
}

const PAGE: u64 = 4096;

/// The VMAs of `pid` registered for userfaultfd write protection.
fn uffd_wp_vmas(pid: u32) -> Vec<(u64, u64)> {
    pagesift_testkit::observe::vmas_flagged(pid, "uw")
}

fn skipped(o: TrackOutcome) -> String {
    match o {
        TrackOutcome::Skipped(why) => why,
        other => panic!("expected a cut batch to be skipped, got {other:?}"),
    }
}

#[test]
fn a_cut_track_batch_keeps_what_ran_and_untracking_leaves_nothing() {
    pagesift_testkit::require_root();
    let _g = pagesift_testkit::serial();
    let _off = Cutting;
    let t = Target::start("sleep", &["--ms", "20"]);
    let pid = t.pid();
    let four = t.spaced_ranges(4);
    let mut inj = Injector::new(InjectConfig::default());

    // Cut before the first call: nothing ran, nothing is kept.
    let mut wt = WriteTracker::new();
    cut_batches_before(Some(0));
    let why = skipped(wt.track(&mut inj, pid, &four).unwrap());
    assert!(why.contains("(0 completed)"), "{why}");
    assert_eq!(count_userfaultfds(pid), 0, "no descriptor was opened");
    assert_eq!(wt.tracked_processes(), 0);

    // Cut after the descriptor was opened, before its handshake: the
    // tracker does the handshake itself, keeps the descriptor with no
    // range, and closes it when told to.
    cut_batches_before(Some(1));
    skipped(wt.track(&mut inj, pid, &four).unwrap());
    assert_eq!(count_userfaultfds(pid), 1, "the descriptor the cut left");
    assert!(wt.target_fd(pid).is_some(), "known to the tracker");
    assert_eq!(wt.ranges(pid), &[] as &[(u64, u64)]);
    cut_batches_before(None);
    let o = wt.untrack_process(&mut inj, pid).unwrap();
    assert!(matches!(o, Outcome::Done(_)), "{o:?}");
    assert_eq!(count_userfaultfds(pid), 0, "closed by the untrack");
    assert_eq!(wt.target_fd(pid), None);

    // Cut after two of the four registrations (calls: userfaultfd, the
    // handshake, four registrations): those two are tracked, the other
    // two are not registered at all.
    cut_batches_before(Some(4));
    skipped(wt.track(&mut inj, pid, &four).unwrap());
    assert_eq!(wt.ranges(pid), &four[..2], "what ran is tracked");
    assert_eq!(uffd_wp_vmas(pid), four[..2].to_vec(), "and only that");
    assert_eq!(count_userfaultfds(pid), 1);
    // Tracking the rest in a whole batch uses the same descriptor.
    cut_batches_before(None);
    match wt.track(&mut inj, pid, &four).unwrap() {
        TrackOutcome::Tracking { registered, .. } => assert_eq!(registered, four[2..].to_vec()),
        other => panic!("expected tracking, got {other:?}"),
    }
    assert_eq!(count_userfaultfds(pid), 1);
    assert_eq!(uffd_wp_vmas(pid), four);

    // Untracking leaves nothing of ours.
    let o = wt.untrack_process(&mut inj, pid).unwrap();
    let d = o.done().expect("untracked by injection");
    assert!(d.results.iter().all(|&r| r == 0), "{:?}", d.results);
    assert_eq!(wt.tracked_processes(), 0);
    assert_eq!(count_userfaultfds(pid), 0, "no userfaultfd left");
    assert_eq!(uffd_wp_vmas(pid), vec![], "no registration left");
    let report = t.finish();
    assert!(report["iterations"].as_u64().unwrap() > 0, "{report}");
}

/// A descriptor opened for ranges that were all refused (here: another
/// userfaultfd holds them) is closed at once, in a batch of its own. When
/// that close is cut, the descriptor stays known to the tracker, and the
/// next untrack closes it: it is not left in the target.
#[test]
fn a_refused_tracks_close_that_is_cut_leaves_the_descriptor_known() {
    pagesift_testkit::require_root();
    let _g = pagesift_testkit::serial();
    let _off = Cutting;
    let t = Target::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let mut inj = Injector::new(InjectConfig::default());
    // The first tracker stands for an application's own userfaultfd.
    let mut first = WriteTracker::new();
    match first.track(&mut inj, pid, &[(addr, addr + len)]).unwrap() {
        TrackOutcome::Tracking { registered, .. } => {
            assert_eq!(registered, vec![(addr, addr + len)])
        }
        other => panic!("expected tracking, got {other:?}"),
    }
    // Only batches with a close are cut, before it.
    cut_batches(Some(Box::new(|calls: &[Syscall]| {
        calls.iter().position(|c| matches!(c, Syscall::Close(_)))
    })));
    let mut second = WriteTracker::new();
    let why = skipped(second.track(&mut inj, pid, &[(addr, addr + len)]).unwrap());
    assert!(why.contains("already uses userfaultfd"), "{why}");
    assert_eq!(count_userfaultfds(pid), 2, "the close did not run");
    assert!(
        second.target_fd(pid).is_some(),
        "the descriptor is kept known"
    );
    assert_eq!(second.ranges(pid), &[] as &[(u64, u64)]);
    cut_batches(None);
    let o = second.untrack_process(&mut inj, pid).unwrap();
    assert!(matches!(o, Outcome::Done(_)), "{o:?}");
    assert_eq!(second.target_fd(pid), None);
    assert_eq!(
        count_userfaultfds(pid),
        1,
        "closed; the first one's is left"
    );
    first.untrack_process(&mut inj, pid).unwrap();
    assert_eq!(count_userfaultfds(pid), 0);
    assert_eq!(uffd_wp_vmas(pid), vec![]);
    let report = t.finish();
    assert!(report["iterations"].as_u64().unwrap() > 0, "{report}");
}

/// A splitting batch cut part-way leaves no VMA count behind
/// (`pagesift_linux::vma_counts`): its splits before the cut are in no
/// bound, so the next batch's budget check counts again instead of
/// standing on the bound the batch before left.
#[test]
fn a_cut_splitting_batch_leaves_the_vma_count_to_be_read_again() {
    use pagesift_linux::inject::{Advice, SkipReason};
    pagesift_testkit::require_root();
    let _g = pagesift_testkit::serial();
    let _off = Cutting;
    let t = Target::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let third = len / 3 / PAGE * PAGE;
    let middle = |advice| Syscall::Madvise {
        addr: addr + third,
        len: third,
        advice,
    };
    let mut inj = Injector::new(InjectConfig {
        count_vmas_after: false,
        ..InjectConfig::default()
    });
    let before = |o: Outcome| match o {
        Outcome::Done(i) => i.vmas_before,
        other => panic!("expected a batch run, got {other:?}"),
    };
    let vmas = pagesift_linux::inject::map_count(pid).unwrap();
    // Split in three: the bound after it is two more.
    assert_eq!(
        before(inj.run(pid, &[middle(Advice::Mergeable)]).unwrap()),
        Some(vmas)
    );
    // Joined again, then cut: the join ran, the bound would be stale.
    cut_batches_before(Some(1));
    match inj
        .run(pid, &[middle(Advice::Unmergeable), Syscall::Getpid])
        .unwrap()
    {
        Outcome::Skipped(SkipReason::SyscallTimeout { completed }) => {
            assert_eq!(completed, vec![0]);
        }
        other => panic!("expected the cut, got {other:?}"),
    }
    cut_batches_before(None);
    assert_eq!(pagesift_linux::inject::map_count(pid).unwrap(), vmas);
    assert_eq!(
        before(inj.run(pid, &[middle(Advice::Mergeable)]).unwrap()),
        Some(vmas),
        "counted again, not the bound of before the cut"
    );
    before(inj.run(pid, &[middle(Advice::Unmergeable)]).unwrap());
    let report = t.finish();
    assert!(report["iterations"].as_u64().unwrap() > 0, "{report}");
}
