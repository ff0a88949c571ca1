//! Shared helpers of the sampled-scan live tests: read reports.
//! Workloads (always killed, also when a test panics), the RSS, page-table
//! and pagemap readers, and the lock that keeps two big tests (of any test
//! binary or checkout on this shared machine) from holding several GiB of
//! workloads at once (`serial`) come from pagesift-testkit.

#![allow(dead_code)]

use pagesift_scan::report::{Estimate, Mode, Report};
pub use pagesift_testkit::*;

/// The sampled pages and the exhaustive flag of a sampled report.
pub fn sampled_pages(r: &Report) -> (u64, bool) {
    match r.mode {
        Mode::Sampled {
            sampled_pages,
            exhaustive,
            ..
        } => (sampled_pages, exhaustive),
        Mode::Exact => panic!("not a sampled report"),
    }
}

/// The sum of the saving estimates (value, low, high) of the regions
/// `(pid, start)` (a workload's data region, in every member of a fork
/// family, or the data regions of several workloads).
pub fn region_saving(r: &Report, parts: &[(u32, u64)]) -> Estimate {
    let mut e = Estimate {
        value: 0.0,
        low: 0.0,
        high: 0.0,
    };
    for &(pid, start) in parts {
        let reg = r
            .processes
            .iter()
            .filter(|p| p.pid == pid)
            .flat_map(|p| p.regions.iter())
            .find(|g| g.start == start)
            .unwrap_or_else(|| panic!("no region of {pid} at {start:#x} in the report"));
        e.value += reg.counts.saving.value;
        e.low += reg.counts.saving.low;
        e.high += reg.counts.saving.high;
    }
    e
}

/// A one-line summary for failure messages and `--nocapture` runs.
pub fn summary(r: &Report) -> String {
    let (sampled, exhaustive) = sampled_pages(r);
    format!(
        "sampled {sampled} (exhaustive {exhaustive}) of {} present, saving {:.0} [{:.0}, {:.0}], {} ms, {} pages read",
        r.totals.present,
        r.totals.saving.value,
        r.totals.saving.low,
        r.totals.saving.high,
        r.elapsed_ms,
        r.pages_read
    )
}
