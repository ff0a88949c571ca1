//! Shared helpers of the sampled-scan live tests: read reports and
//! serialize the big tests. Workloads (always killed, also when a test
//! panics) and the RSS, page-table and pagemap readers come from
//! pagesift-linux's `tests/common`.
//!
//! Big tests hold [`big_test_lock`]: a process-wide mutex and an `flock` on
//! a file in the temp directory, so that two test binaries (or two
//! checkouts on this shared machine) never hold several GiB of workloads
//! at once.

#![allow(dead_code)]

use std::fs::File;
use std::sync::{Mutex, MutexGuard};

// Workloads, root check, binaries, RSS/VmPTE and pagemap readers: shared
// with pagesift-linux's live tests.
#[path = "../../../linux/tests/common/mod.rs"]
mod common;
pub use common::*;
use pagesift_scan::report::{Estimate, Mode, Report};

/// Held while a big test runs.
pub struct BigTest {
    _guard: MutexGuard<'static, ()>,
    _file: File,
}

/// Serializes big tests within this process and across processes.
pub fn big_test_lock() -> BigTest {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::temp_dir().join("pagesift-big-tests.lock");
    let file = File::create(&path).expect("creating the big-test lock file");
    // std's lock is flock(LOCK_EX) on Linux: the scan's test binaries
    // exclude each other through it.
    file.lock().expect("flock");
    BigTest {
        _guard: guard,
        _file: file,
    }
}

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
