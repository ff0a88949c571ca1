//! Exact scan against real processes (root): the counts must equal the
//! ones the workloads report about themselves, and the scan must leave
//! the workloads exactly as they were.
//!
//! Every test holds [`serial`] (one multi-GiB test at a time) and its
//! workloads are guards that are killed on drop, also when a test fails.

mod exact_support;

use exact_support::*;
use pagesift_linux::ProcessFilter;
use pagesift_scan::exact::{ExactOptions, ExactStats, run_with_stats};
use pagesift_scan::report::{Class, RegionReport, Report};
use std::time::{Duration, Instant};

fn scan(pids: &[u32], threads: usize, cache_pages: usize) -> (Report, ExactStats) {
    let t = Instant::now();
    let out = run_with_stats(&ExactOptions {
        filter: ProcessFilter::pids(pids.iter().copied()),
        threads,
        cache_pages,
        ..ExactOptions::default()
    })
    .expect("exact scan");
    eprintln!(
        "scan of {pids:?} ({threads} thread(s), cache {cache_pages}): {} frames in {:.2} s, {:.2} M pages/s, {:?}",
        out.1.frames,
        t.elapsed().as_secs_f64(),
        out.1.pages_per_second() / 1e6,
        out.1.group
    );
    assert_eq!(out.0.gone, 0, "nobody exited");
    assert!(out.0.skipped.is_empty(), "skipped: {:?}", out.0.skipped);
    out
}

/// The region counts that the workload's own report fixes, for a
/// single-process workload whose contents repeat only inside its region.
fn assert_matches_workload(r: &RegionReport, w: &Workload) {
    let (_, pages) = w.region();
    let c = &r.counts;
    assert_eq!(c.size_pages, pages, "size");
    assert_eq!(c.zero, w.count("zero_pages"), "zero pages");
    assert_eq!(
        c.present,
        w.count("present_pages") + w.count("zero_pages"),
        "present"
    );
    assert_eq!(c.merged, 0, "merged");
    assert_eq!(
        n(&c.dup_in_region),
        w.count("pages_with_duplicates"),
        "dup in region"
    );
    assert_eq!(n(&c.dup_in_process), 0, "dup in process");
    assert_eq!(n(&c.dup_across), 0, "dup across");
    assert_eq!(n(&c.saving), w.count("duplicate_pages"), "saving");
}

/// What a scan must not change in a target.
struct Untouched {
    pid: u32,
    start: u64,
    pages: u64,
    rss_pte: (u64, u64),
    entries: Vec<pagesift_linux::pagemap::PagemapEntry>,
}

impl Untouched {
    fn take(pid: u32, start: u64, pages: u64) -> Untouched {
        Untouched {
            pid,
            start,
            pages,
            rss_pte: rss_and_pte(pid),
            entries: pagemap_entries(pid, start, pages),
        }
    }

    /// RSS and page-table size not grown, and every page of the region
    /// mapped as before: same presence, same frame, same exclusivity (so
    /// nothing was faulted in, copied or unshared).
    fn check(&self) {
        let (rss, pte) = rss_and_pte(self.pid);
        assert!(
            rss <= self.rss_pte.0,
            "pid {}: RSS grew {} -> {rss} kB",
            self.pid,
            self.rss_pte.0
        );
        assert!(
            pte <= self.rss_pte.1,
            "pid {}: VmPTE grew {} -> {pte} kB",
            self.pid,
            self.rss_pte.1
        );
        let now = pagemap_entries(self.pid, self.start, self.pages);
        let changed = self
            .entries
            .iter()
            .zip(&now)
            .filter(|(a, b)| {
                a.present() != b.present() || a.pfn() != b.pfn() || a.exclusive() != b.exclusive()
            })
            .count();
        assert_eq!(
            changed, 0,
            "pid {}: {changed} pages changed frame or mapping",
            self.pid
        );
    }
}

#[test]
fn identical_and_random_gib_match_the_workloads_with_one_and_two_threads() {
    require_root();
    let _g = serial();
    let mut same = Workload::start(&["static-dup", "--mib", "2048", "--seed", "11"]);
    let mut rand = Workload::start(&["random", "--mib", "2048", "--seed", "12"]);
    let sums = (same.checksum(), rand.checksum());
    let before = [
        Untouched::take(same.pid(), same.region().0, same.region().1),
        Untouched::take(rand.pid(), rand.region().0, rand.region().1),
    ];
    let pids = [same.pid(), rand.pid()];
    let (one, s1) = scan(&pids, 1, 8192);
    let (two, s2) = scan(&pids, 2, 8192);
    for r in [&one, &two] {
        let a = region(r, same.pid(), same.region().0);
        assert_matches_workload(a, &same);
        assert_eq!(n(&a.counts.saving), 524_287, "2 GiB of one content");
        let b = region(r, rand.pid(), rand.region().0);
        assert_matches_workload(b, &rand);
        assert_eq!(n(&b.counts.saving), 0);
        assert!(
            r.processes
                .iter()
                .all(|p| p.regions.iter().all(|x| x.class.is_none()))
        );
    }
    // Same frames, same groups, whatever the threading.
    assert_eq!(s1.frames, s2.frames);
    assert_eq!(s1.distinct, s2.distinct);
    assert_eq!(one.totals, two.totals);
    // The report is sorted by saving: the identical pages come first.
    assert_eq!(one.processes[0].pid, same.pid());
    assert_eq!(one.processes[0].regions[0].start, same.region().0);
    // Harmless.
    assert_eq!((same.checksum(), rand.checksum()), sums, "memory unchanged");
    for u in &before {
        u.check();
    }
}

#[test]
fn thirty_percent_mix_with_holes_zero_pages_and_untouched_tail_matches_and_faults_nothing_in() {
    require_root();
    let _g = serial();
    let mut w = Workload::start(&[
        "mixed",
        "--mib",
        "2048",
        "--dup-ratio",
        "0.3",
        "--hole-every",
        "7",
        "--zero-every",
        "5",
        "--untouched-mib",
        "64",
        "--seed",
        "21",
    ]);
    let (start, pages) = w.region();
    let sum = w.checksum();
    let before = Untouched::take(w.pid(), start, pages);
    let (r, _) = scan(&[w.pid()], 1, 8192);
    assert_matches_workload(region(&r, w.pid(), start), &w);
    assert!(w.count("zero_pages") > 0 && w.count("untouched_pages") > 16384);
    before.check();
    // With no cache every duplicate is verified by reading its
    // representative again: same counts.
    let (again, s) = scan(&[w.pid()], 1, 0);
    assert_matches_workload(region(&again, w.pid(), start), &w);
    assert!(s.group.reps_read > 0, "{s:?}");
    assert_eq!(s.group.reps_lost, 0);
    before.check();
    assert_eq!(w.checksum(), sum, "memory unchanged");
}

#[test]
fn fork_family_counts_each_frame_once_and_keeps_every_frame_in_place() {
    require_root();
    let _g = serial();
    let mut w = Workload::start(&[
        "fork-family",
        "--mib",
        "2048",
        "--children",
        "3",
        "--dirty-fraction",
        "0.25",
        "--zero-every",
        "9",
        "--seed",
        "31",
    ]);
    let (start, pages) = w.region();
    let children = w.children();
    assert_eq!(children.len(), 3);
    let family: Vec<u32> = std::iter::once(w.pid())
        .chain(children.iter().copied())
        .collect();
    let sum = w.checksum();
    let before: Vec<Untouched> = family
        .iter()
        .map(|&p| Untouched::take(p, start, pages))
        .collect();
    // The family shares frames: most of the parent's pages are not
    // exclusive, and must be read without pinning.
    assert!(
        before[0]
            .entries
            .iter()
            .filter(|e| e.present() && !e.exclusive())
            .count()
            > 100_000
    );

    for threads in [1, 2] {
        let (r, _) = scan(&family, threads, 8192);
        let parent = region(&r, w.pid(), start);
        // The parent's own contents repeat only in its region.
        assert_matches_workload(parent, &w);
        let regions: Vec<&RegionReport> = family.iter().map(|&p| region(&r, p, start)).collect();
        let sum_of = |f: &dyn Fn(&RegionReport) -> u64| regions.iter().map(|x| f(x)).sum::<u64>();
        // Frames once: the saving is physical − distinct, not virtual.
        assert_eq!(
            sum_of(&|x| n(&x.counts.saving)),
            w.count("family.duplicate_pages"),
            "family saving (virtual would be {})",
            w.count("family.duplicate_pages_virtual")
        );
        assert_eq!(
            sum_of(&|x| x.counts.present),
            w.count("family.virtual_present_pages") + w.count("family.zero_pages")
        );
        assert_eq!(sum_of(&|x| x.counts.zero), w.count("family.zero_pages"));
        for c in &regions[1..] {
            // A child's rewrites are distinct within it; their twins are
            // in the other children.
            assert_eq!(n(&c.counts.dup_in_region), 0);
            assert_eq!(n(&c.counts.dup_in_process), 0);
            assert!(n(&c.counts.dup_across) > 0);
            assert_eq!(c.counts.present, parent.counts.present);
        }
    }
    for u in &before {
        u.check();
    }
    assert_eq!(w.checksum(), sum, "parent memory unchanged");
}

#[test]
fn duplicates_across_processes_survive_in_the_lower_pid_and_verify_by_reread() {
    require_root();
    let _g = serial();
    // Same seed: page i of one is byte-identical to page i of the other.
    let a = Workload::start(&["random", "--mib", "256", "--seed", "41"]);
    let b = Workload::start(&["random", "--mib", "256", "--seed", "41"]);
    let (lo, hi) = if a.pid() < b.pid() {
        (&a, &b)
    } else {
        (&b, &a)
    };
    let pages = 65536;
    for cache in [8192, 0] {
        let (r, s) = scan(&[a.pid(), b.pid()], 1, cache);
        let x = region(&r, lo.pid(), lo.region().0);
        let y = region(&r, hi.pid(), hi.region().0);
        for z in [x, y] {
            assert_eq!(n(&z.counts.dup_across), pages);
            assert_eq!(n(&z.counts.dup_in_region), 0);
            assert_eq!(n(&z.counts.dup_in_process), 0);
        }
        assert_eq!(n(&x.counts.saving), 0, "the lower pid keeps the survivors");
        assert_eq!(n(&y.counts.saving), pages);
        // Every one of those duplicates was verified byte by byte, from
        // the cache or by reading the survivor again.
        assert!(s.group.verified_joins >= pages, "{s:?}");
        if cache == 0 {
            assert!(s.group.reps_read >= pages, "{s:?}");
        }
    }
}

#[test]
fn transparent_huge_pages_are_read_and_counted_like_small_ones() {
    require_root();
    let _g = serial();
    let same = Workload::start(&["static-dup", "--mib", "256", "--thp", "--seed", "51"]);
    let rand = Workload::start(&["random", "--mib", "256", "--thp", "--seed", "52"]);
    let (r, _) = scan(&[same.pid(), rand.pid()], 1, 8192);
    assert_matches_workload(region(&r, same.pid(), same.region().0), &same);
    assert_matches_workload(region(&r, rand.pid(), rand.region().0), &rand);
}

#[test]
fn rescan_classifies_static_sparse_and_changing_regions() {
    require_root();
    let _g = serial();
    let same = Workload::start(&["static-dup", "--mib", "64", "--seed", "61"]);
    let mix = Workload::start(&["mixed", "--mib", "64", "--dup-ratio", "0.5", "--seed", "62"]);
    let rand = Workload::start(&["random", "--mib", "64", "--seed", "63"]);
    // Mapped for 3 s from now, then unmapped for 3 s: the first read
    // (well within 3 s) sees it, the second one (3.2 s later) does not.
    let short = Workload::start(&[
        "short-lived",
        "--mib",
        "64",
        "--period-ms",
        "3000",
        "--seed",
        "64",
    ]);
    let t = Instant::now();
    let pids = [same.pid(), mix.pid(), rand.pid(), short.pid()];
    let (r, s) = run_with_stats(&ExactOptions {
        filter: ProcessFilter::pids(pids),
        rescan: Some(Duration::from_millis(3200)),
        ..ExactOptions::default()
    })
    .expect("exact scan with rescan");
    let first_read = Duration::from_nanos(s.scan_ns);
    assert!(
        first_read < Duration::from_millis(2500),
        "the first read took {first_read:?}: too slow for the short-lived window"
    );
    eprintln!(
        "rescan test: {:?} in all, {} frames re-read",
        t.elapsed(),
        s.rescanned
    );
    let class = |w: &Workload| region(&r, w.pid(), w.region().0).class;
    assert_eq!(class(&same), Some(Class::StaticallyDuplicated));
    assert_eq!(class(&mix), Some(Class::StaticallyDuplicated));
    assert_eq!(class(&rand), Some(Class::Sparse));
    assert_eq!(class(&short), Some(Class::Changing));
    // Every region got a class.
    assert!(
        r.processes
            .iter()
            .all(|p| p.regions.iter().all(|x| x.class.is_some()))
    );
    // The counts are the first read's.
    assert_matches_workload(region(&r, short.pid(), short.region().0), &short);
}
