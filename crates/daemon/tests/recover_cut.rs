//! The crash ledger's recovery ([`pagesift_daemon::ledger::recover`]) when
//! its batches are cut part-way
//! ([`pagesift_linux::inject::cut_batches_before`]), as a target frozen
//! between two calls cuts them: the ranges unmarked before a cut count as
//! unmarked, the rest are tried again, and what is still marked after the
//! last attempt is reported with its count. The target runs on with its
//! memory unchanged.
//!
//! The cut is process-wide, so this binary holds this one test. Root is
//! needed.

use pagesift_daemon::ledger::{MarkEntry, Record, recover};
use pagesift_linux::inject::{Advice, InjectConfig, Injector, Syscall, cut_batches_before};
use pagesift_testkit::Target;
use pagesift_testkit::observe::vmas_flagged;

fn madvise(ranges: &[(u64, u64)], advice: Advice) -> Vec<Syscall> {
    (ranges.iter())
        .map(|&(s, e)| Syscall::Madvise {
            addr: s,
            len: e - s,
            advice,
        })
        .collect()
}

/// Marks `ranges` of `pid` mergeable in one whole batch.
fn mark(inj: &mut Injector, pid: u32, ranges: &[(u64, u64)]) {
    cut_batches_before(None);
    let o = inj.run(pid, &madvise(ranges, Advice::Mergeable)).unwrap();
    let d = o.done().expect("marked by injection");
    assert!(d.results.iter().all(|&r| r == 0), "{:?}", d.results);
    assert_eq!(vmas_flagged(pid, "mg"), ranges.to_vec());
}

#[test]
fn a_recovery_cut_part_way_counts_what_ran_and_retries_the_rest() {
    pagesift_testkit::require_root();
    let _g = pagesift_testkit::serial();
    let t = Target::start("sleep", &["--ms", "20"]);
    let pid = t.pid();
    let (start_time, image) = pagesift_linux::discover::identity(pid).unwrap();
    let record = |ranges: &[(u64, u64)]| Record {
        marks: vec![MarkEntry {
            pid,
            start_time,
            image,
            ranges: ranges.to_vec(),
        }],
        uffd: vec![],
    };
    let mut inj = Injector::new(InjectConfig::default());

    // Cut after two of four: the second attempt runs the other two.
    let four = t.spaced_ranges(4);
    mark(&mut inj, pid, &four);
    cut_batches_before(Some(2));
    let r = recover(&record(&four), &mut inj);
    assert_eq!(r.unmarked, 4, "{r:?}");
    assert_eq!(r.failed, Vec::<String>::new());
    assert_eq!(vmas_flagged(pid, "mg"), vec![], "nothing left marked");

    // Cut after one, every time: each attempt unmarks one range, and the
    // ranges the attempts did not reach are reported, counted.
    let eight = t.spaced_ranges(8);
    mark(&mut inj, pid, &eight);
    cut_batches_before(Some(1));
    let r = recover(&record(&eight), &mut inj);
    assert_eq!(r.unmarked, 4, "four attempts, one range each: {r:?}");
    assert_eq!(r.failed.len(), 1, "{r:?}");
    assert!(
        r.failed[0].contains("4 of 8 ranges left marked"),
        "{:?}",
        r.failed
    );
    assert_eq!(vmas_flagged(pid, "mg"), eight[4..].to_vec());

    // The rest by a whole batch; the target was not harmed.
    cut_batches_before(None);
    let o = inj
        .run(pid, &madvise(&eight[4..], Advice::Unmergeable))
        .unwrap();
    assert!(o.done().is_some_and(|d| d.all_ok()), "{o:?}");
    assert_eq!(vmas_flagged(pid, "mg"), vec![]);
    let report = t.finish();
    assert!(report["iterations"].as_u64().unwrap() > 0, "{report}");
}
