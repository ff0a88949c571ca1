//! A sampled scan is harmless and says what it did: targets' memory
//! checksums, RSS, page-table size and page maps (every frame, every
//! exclusive bit) are unchanged by a scan that samples and by one whose
//! budget covers everything; a budget that covers every page gives exact,
//! zero-width results that match the workload's own counts; a process that
//! exits mid-scan is counted as gone and left out; a pid that does not
//! exist says so.

mod sampled_common;

use pagesift_linux::{LinuxError, ProcessFilter};
use pagesift_scan::report::{Report, ScanError};
use pagesift_scan::sampled::{Budget, SampledOptions, run};
use sampled_common::*;
use std::time::Duration;

fn scan(pids: &[u32], budget: Budget) -> Result<Report, ScanError> {
    run(&SampledOptions {
        filter: ProcessFilter::pids(pids.iter().copied()),
        budget,
        ..SampledOptions::default()
    })
}

/// Everything a scan must leave as it was, for one process and region.
#[derive(Debug, PartialEq)]
struct Snapshot {
    rss_kb: u64,
    pte_kb: u64,
    pagemap: Vec<u64>,
}

/// The first of `ms` budgets whose scan samples some but not all pages
/// (discovery and census take a load-dependent share of a budget).
fn sampling_budget(pids: &[u32], ms: &[u64]) -> Budget {
    for &ms in ms {
        let budget = Budget::Time(Duration::from_millis(ms));
        let (sampled, exhaustive) = sampled_pages(&scan(pids, budget).expect("scan"));
        if sampled > 0 && !exhaustive {
            return budget;
        }
    }
    panic!("none of the budgets {ms:?} ms sampled part of the pages");
}

fn snapshot(pid: u32, start: u64, pages: u64) -> Snapshot {
    let (rss_kb, pte_kb) = rss_and_pte(pid);
    Snapshot {
        rss_kb,
        pte_kb,
        pagemap: pagemap_entries(pid, start, pages)
            .into_iter()
            .map(|e| e.0)
            .collect(),
    }
}

fn assert_unchanged(before: &Snapshot, after: &Snapshot, what: &str) {
    assert!(
        after.rss_kb <= before.rss_kb,
        "{what}: RSS grew from {} to {} kB",
        before.rss_kb,
        after.rss_kb
    );
    assert!(
        after.pte_kb <= before.pte_kb,
        "{what}: VmPTE grew from {} to {} kB",
        before.pte_kb,
        after.pte_kb
    );
    let changed = before
        .pagemap
        .iter()
        .zip(&after.pagemap)
        .filter(|(a, b)| a != b)
        .count();
    assert_eq!(changed, 0, "{what}: {changed} pagemap entries changed");
}

#[test]
fn scans_leave_memory_rss_and_page_tables_unchanged() {
    require_root();
    let _serial = serial();
    // Holes (never touched), zero-page mappings and an untouched tail
    // without page tables: a stray read would fault pages in.
    let mut a = Workload::start(&[
        "static-dup",
        "--mib",
        "96",
        "--contents",
        "5",
        "--hole-every",
        "7",
        "--zero-every",
        "5",
        "--untouched-mib",
        "32",
    ]);
    let mut b = Workload::start(&["mixed", "--mib", "96", "--hole-every", "3", "--seed", "9"]);
    let (sa, sb) = (a.checksum(), b.checksum());
    let (ra, rb) = (a.region(), b.region());
    let before = [snapshot(a.pid(), ra.0, ra.1), snapshot(b.pid(), rb.0, rb.1)];
    let small = sampling_budget(&[a.pid(), b.pid()], &[15, 25, 40, 60, 90, 130]);
    for budget in [small, Budget::default()] {
        let r = scan(&[a.pid(), b.pid()], budget).expect("scan");
        println!("{budget}: {}", summary(&r));
        let after = [snapshot(a.pid(), ra.0, ra.1), snapshot(b.pid(), rb.0, rb.1)];
        assert_unchanged(&before[0], &after[0], &format!("static-dup after {budget}"));
        assert_unchanged(&before[1], &after[1], &format!("mixed after {budget}"));
        assert_eq!(a.checksum(), sa, "static-dup memory changed");
        assert_eq!(b.checksum(), sb, "mixed memory changed");
    }
}

#[test]
fn a_fork_family_keeps_its_shared_pages_shared() {
    require_root();
    let _serial = serial();
    let mut w = Workload::start(&[
        "fork-family",
        "--mib",
        "128",
        "--children",
        "3",
        "--dirty-fraction",
        "0.3",
        "--seed",
        "8",
    ]);
    let pids = w.pids();
    let (start, pages) = w.region();
    let sum = w.checksum();
    let before: Vec<Snapshot> = pids.iter().map(|&p| snapshot(p, start, pages)).collect();
    // Children share most pages with the parent: not exclusive.
    let shared = before[1]
        .pagemap
        .iter()
        .filter(|&&e| e >> 63 == 1 && e >> 56 & 1 == 0)
        .count();
    assert!(shared > 1000, "only {shared} shared pages in a child");
    let small = sampling_budget(&pids, &[40, 60, 90, 130, 200, 300]);
    for budget in [small, Budget::default()] {
        let r = scan(&pids, budget).expect("scan");
        println!("{budget}: {}", summary(&r));
        for (i, &p) in pids.iter().enumerate() {
            let after = snapshot(p, start, pages);
            assert_unchanged(&before[i], &after, &format!("process {p} after {budget}"));
        }
        assert_eq!(w.checksum(), sum, "the parent's memory changed");
    }
}

#[test]
fn a_budget_covering_everything_is_exact() {
    require_root();
    let _serial = serial();
    let w = Workload::start(&[
        "mixed",
        "--mib",
        "32",
        "--zero-every",
        "9",
        "--hole-every",
        "11",
        "--seed",
        "5",
    ]);
    let (start, _) = w.region();
    let r = scan(&[w.pid()], Budget::default()).expect("scan");
    let (sampled, exhaustive) = sampled_pages(&r);
    assert!(exhaustive, "not exhaustive: {}", summary(&r));
    assert_eq!(sampled, r.totals.present - r.totals.zero - r.totals.merged);
    let region = r.processes[0]
        .regions
        .iter()
        .find(|g| g.start == start)
        .expect("the data region");
    let c = &region.counts;
    assert_eq!(c.zero, w.count("zero_pages"));
    assert_eq!(c.present, w.count("present_pages") + w.count("zero_pages"));
    // A group with copies outside the data region (the workload's heap may
    // hold a copy of a duplicated content: its PageMaker caches them) shares its saving between
    // the regions in proportion to their copies, so the region's figure may
    // exceed its own duplicates by a fraction of one page.
    let own = w.count("duplicate_pages") as f64;
    assert!(
        (c.saving.value - own).abs() < 1.0,
        "region saving {} vs the workload's {own}",
        c.saving.value
    );
    assert_eq!(
        c.dup_in_region.value,
        w.count("pages_with_duplicates") as f64
    );
    for e in [
        c.saving,
        c.dup_in_region,
        c.dup_in_process,
        c.dup_across,
        r.totals.saving,
    ] {
        assert_eq!(e.low, e.value);
        assert_eq!(e.high, e.value);
    }
}

#[test]
fn a_process_that_exits_mid_scan_is_counted_as_gone() {
    require_root();
    let _serial = serial();
    let stays = Workload::start(&["static-dup", "--mib", "64"]);
    // 1 GiB of distinct pages that exits 0.3 s after it is ready: long
    // before a 4 s scan has read it.
    let leaves = Workload::start(&["random", "--mib", "1024", "--seconds", "0.3"]);
    let r = scan(
        &[stays.pid(), leaves.pid()],
        Budget::Time(Duration::from_secs(4)),
    )
    .expect("scan");
    println!("{}", summary(&r));
    assert_eq!(r.gone, 1);
    assert!(r.processes.iter().all(|p| p.pid != leaves.pid()));
    assert!(r.processes.iter().any(|p| p.pid == stays.pid()));
    assert!(r.totals.saving.value >= 16_000.0, "{}", summary(&r));
}

#[test]
fn a_pid_that_does_not_exist_says_so() {
    require_root();
    let e = scan(&[NO_SUCH_PID], Budget::default()).unwrap_err();
    assert!(
        matches!(e, ScanError::Linux(LinuxError::NoSuchProcess(NO_SUCH_PID))),
        "{e:?}"
    );
    assert!(e.to_string().contains(&NO_SUCH_PID.to_string()), "{e}");
}

#[test]
fn a_bad_budget_names_the_option() {
    let e = run(&SampledOptions {
        budget: Budget::CpuShare {
            share: 1.5,
            window: Duration::from_secs(1),
        },
        ..SampledOptions::default()
    })
    .unwrap_err();
    assert!(e.to_string().contains("budget"), "{e}");
}

#[test]
fn a_cpu_share_budget_paces_the_scan() {
    require_root();
    let _serial = serial();
    let w = Workload::start(&["random", "--mib", "512", "--seed", "7"]);
    let cpu = || Duration::from_nanos(pagesift_linux::host::thread_cpu_ns());
    let (share, window) = (0.25, Duration::from_millis(1600));
    let (t0, c0) = (std::time::Instant::now(), cpu());
    let r = scan(&[w.pid()], Budget::CpuShare { share, window }).expect("scan");
    let (wall, used) = (t0.elapsed(), cpu() - c0);
    println!("{}; wall {wall:?}, cpu {used:?}", summary(&r));
    let (sampled, exhaustive) = sampled_pages(&r);
    assert!(sampled > 0 && !exhaustive, "{}", summary(&r));
    // At most the share of the window (plus one batch and the estimation),
    // and the window is kept (plus the same slack).
    assert!(
        used <= window.mul_f64(share) + Duration::from_millis(60),
        "CPU {used:?}"
    );
    assert!(wall <= window + Duration::from_millis(150), "wall {wall:?}");
    // Paced: the scan did not run flat out.
    assert!(wall >= used.mul_f64(2.0), "wall {wall:?} vs CPU {used:?}");
}
