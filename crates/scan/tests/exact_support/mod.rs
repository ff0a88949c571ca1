//! Shared helpers of the exact-scan tests: run the `pagesift` binary,
//! find processes and regions in a report, and serialize the tests (they
//! use GiBs of memory and both cores). Workloads and the readers that look
//! at them come from pagesift-linux's `tests/common`.

#![allow(dead_code)]

use pagesift_scan::report::{ProcessReport, RegionReport, Report};
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};

// Workloads, root check, binaries, RSS/VmPTE and pagemap readers: shared
// with pagesift-linux's live tests.
#[path = "../../../linux/tests/common/mod.rs"]
mod common;
pub use common::*;

/// One test at a time in this binary: the workloads are large and the
/// machine has two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `pagesift` binary.
pub fn pagesift_bin() -> PathBuf {
    bin("pagesift", "pagesift")
}

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
