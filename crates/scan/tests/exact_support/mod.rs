//! Shared helpers of the exact-scan tests: find processes and regions in a
//! report. Workloads, the readers that look at them, the `pagesift` binary
//! and the lock that serializes the tests (they use GiBs of memory and both
//! cores) come from pagesift-testkit.

#![allow(dead_code)]

use pagesift_scan::report::{ProcessReport, RegionReport, Report};

pub use pagesift_testkit::*;

/// The process `pid` in a report.
pub fn process(r: &Report, pid: u32) -> &ProcessReport {
    r.processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in the report"))
}

/// The region of `pid` that starts at `start`.
pub fn region(r: &Report, pid: u32, start: u64) -> &RegionReport {
    process(r, pid)
        .regions
        .iter()
        .find(|x| x.start == start)
        .unwrap_or_else(|| panic!("pid {pid} has no region at {start:#x} in the report"))
}

/// An exact count from an estimate (which must be exact).
pub fn n(e: &pagesift_scan::report::Estimate) -> u64 {
    assert!(e.is_exact(), "an exact scan gives exact counts: {e:?}");
    e.value as u64
}
