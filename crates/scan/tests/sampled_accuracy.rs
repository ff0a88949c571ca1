//! Sampled scans of real workloads of ≥ 1 GiB: the estimated total saving
//! is within ±3 percentage points of the workloads' own exact counts,
//! with the default budget (2 s) and with a budget small enough that only
//! a minority of the pages is read (so the estimator, not a full read, is
//! what is tested).
//!
//! Percentage points are of the frames the workloads hold (their present
//! pages; distinct frames for a fork family). Each workload's data region
//! is checked on its own, and the scan's system total too (it includes the
//! workloads' other VMAs: heap, stack, libraries' data, a few thousand
//! pages at most).
//!
//! Root only; each test holds the big-test lock (GiBs of workloads).

mod sampled_common;

use pagesift_linux::ProcessFilter;
use pagesift_scan::report::Report;
use pagesift_scan::sampled::{Budget, SampledOptions, run};
use sampled_common::*;
use std::time::Duration;

/// Small budgets to try, smallest first: the first that leaves time for a
/// sample of at least [`MIN_SAMPLE`] of the frames after discovery and
/// census (their cost depends on the machine's load) is the one checked.
const SMALL: [u64; 5] = [300, 450, 650, 900, 1300];

/// Fraction of the frames the small-budget scan must sample, at least.
const MIN_SAMPLE: f64 = 0.02;

fn scan(pids: &[u32], budget: Budget, seed: u64) -> Report {
    run(&SampledOptions {
        filter: ProcessFilter::pids(pids.iter().copied()),
        budget,
        seed,
        ..SampledOptions::default()
    })
    .expect("sampled scan")
}

fn pct(pages: f64, frames: u64) -> f64 {
    100.0 * pages / frames as f64
}

/// Asserts the data regions' estimate and the total are within 3 points
/// of `exact`, and that the regions' interval holds it.
fn check(r: &Report, what: &str, parts: &[(u32, u64)], exact: u64, frames: u64) {
    let region = region_saving(r, parts);
    let exact_pct = pct(exact as f64, frames);
    let region_pct = pct(region.value, frames);
    let total_pct = pct(r.totals.saving.value, frames);
    println!(
        "{what}: exact {exact} = {exact_pct:.2} %, regions {:.0} [{:.0}, {:.0}] = {region_pct:.2} %, \
         total {total_pct:.2} %; {}",
        region.value,
        region.low,
        region.high,
        summary(r)
    );
    assert!(
        (region_pct - exact_pct).abs() <= 3.0,
        "{what}: regions {region_pct:.2} % vs exact {exact_pct:.2} %; {}",
        summary(r)
    );
    assert!(
        (total_pct - exact_pct).abs() <= 3.0,
        "{what}: total {total_pct:.2} % vs exact {exact_pct:.2} %; {}",
        summary(r)
    );
    // Honest intervals (sums of per-region intervals are wider still).
    let x = exact as f64;
    assert!(
        region.low - 0.5 <= x && x <= region.high + 0.5,
        "{what}: {region:?} does not hold {exact}"
    );
}

/// Runs the default-budget scan and a small-budget one that samples a
/// minority of the frames, checking both.
fn both_budgets(what: &str, pids: &[u32], parts: &[(u32, u64)], exact: u64, frames: u64) {
    let r = scan(pids, Budget::default(), 1);
    check(&r, &format!("{what}, default budget"), parts, exact, frames);
    let mut small = None;
    for ms in SMALL {
        let r = scan(pids, Budget::Time(Duration::from_millis(ms)), 2);
        let (sampled, _) = sampled_pages(&r);
        if sampled as f64 >= MIN_SAMPLE * frames as f64 {
            small = Some((ms, r));
            break;
        }
        println!(
            "{what}: {ms} ms left too little for a sample: {}",
            summary(&r)
        );
    }
    let (ms, r) = small.expect("no small budget left time for a sample");
    let (sampled, exhaustive) = sampled_pages(&r);
    assert!(
        !exhaustive && sampled * 2 < frames,
        "{what}: the small budget did not sample: {}",
        summary(&r)
    );
    check(&r, &format!("{what}, budget {ms} ms"), parts, exact, frames);
}

#[test]
fn static_mixed_2_gib_is_within_3_points() {
    require_root();
    let _serial = serial();
    // UKSM §8.1.1's static-mixed: identical pages beside random ones.
    let dup = Workload::start(&["static-dup", "--mib", "1024"]);
    let rnd = Workload::start(&["random", "--mib", "1024", "--seed", "2"]);
    let frames = dup.count("present_pages") + rnd.count("present_pages");
    let exact = dup.count("duplicate_pages") + rnd.count("duplicate_pages");
    assert_eq!(exact, 262_143);
    let parts = [(dup.pid(), dup.region().0), (rnd.pid(), rnd.region().0)];
    both_budgets(
        "static-mixed 2 GiB",
        &[dup.pid(), rnd.pid()],
        &parts,
        exact,
        frames,
    );
}

#[test]
fn fork_family_1_gib_is_within_3_points() {
    require_root();
    let _serial = serial();
    // Parent: 1 GiB, 30 % duplicated runs; 3 children each rewrite 25 %,
    // the same new content per page in every child (pairs and triples
    // across processes, at the same address).
    let w = Workload::start(&[
        "fork-family",
        "--mib",
        "1024",
        "--children",
        "3",
        "--dirty-fraction",
        "0.25",
        "--seed",
        "3",
    ]);
    let pids = w.pids();
    assert_eq!(pids.len(), 4);
    let start = w.region().0;
    let parts: Vec<(u32, u64)> = pids.iter().map(|&p| (p, start)).collect();
    both_budgets(
        "fork-family 1 GiB",
        &pids,
        &parts,
        w.count("family.duplicate_pages"),
        w.count("family.physical_pages"),
    );
}
