//! One live test at a time, within a test binary and across test binaries.
//!
//! The live tests start workloads of hundreds of MiB on a two-core machine,
//! ptrace processes and own KSM, one global resource. Within a binary the
//! test harness runs tests on parallel threads: a mutex (a static of this
//! crate, so one per test binary) makes them take turns. Across binaries
//! (`cargo test` runs them one after another, but two checkouts or two
//! `cargo test` runs on a shared machine do not) an `flock` on one file in
//! the temporary directory does. KSM's own lock (`ksm::KsmGuard`, a file
//! lock too) still serializes every KSM user besides: the daemons the tests
//! start take it themselves.
//!
//! The order is mutex, then file: a thread waits for its siblings before it
//! competes with other processes, and never holds the file while waiting
//! for the mutex. The lock is not reentrant: a test takes it once.
//!
//! ## KSM pages left counted
//!
//! A test whose processes exit merged leaves KSM's stable-tree nodes
//! counted in `pages_shared` (and their mappings in `pages_sharing`) while
//! ksmd is stopped: KSM drops a node only when ksmd next finds it stale.
//! The daemon stops ksmd as it found it (run 0) and, by design, does not
//! unmerge on exit (`actuate.unmerge_on_exit`), so every live test of a
//! daemon that merged something left such counts behind (by hand on
//! 2026-12-02, each test run alone: 256 pages shared and 5 888 sharing
//! after the hints test, 65 and 16 382 after its no-BTF sibling). So a test that found KSM stopped with nothing
//! merged leaves it that way: when the guard drops (after the test's own
//! processes, which are declared after it), a stopped KSM that counts
//! merged pages is unmerged (run 2) under KSM's lock, then put back as it
//! was. KSM that was running, or held merged pages, when the test began is
//! someone else's and is left alone.

use pagesift_linux::ksm::{GuardOptions, Ksm, KsmGuard, Run};
use std::fs::File;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// The lock file shared by every test binary of every checkout.
const LOCK_FILE: &str = "pagesift-tests.lock";

/// Held while a test runs; dropping it lets the next one in.
pub struct Serial {
    /// KSM was stopped with nothing merged when the test began.
    ksm_found_clean: bool,
    // Field order is drop order: the file is unlocked before the mutex
    // lets a sibling thread in, so the sibling finds the file free.
    _file: File,
    _guard: MutexGuard<'static, ()>,
}

impl Drop for Serial {
    /// Runs before the locks are released, so no other test sees KSM
    /// half-cleaned (module header, "KSM pages left counted"). Only a
    /// stopped KSM is touched: one left running is a knob the test did not
    /// put back, not stale counts, and unmerging would not mend it.
    fn drop(&mut self) {
        if self.ksm_found_clean
            && let Some((true, merged)) = ksm_state()
            && merged > 0
        {
            // A daemon still holding KSM's lock (a test that failed before
            // stopping it) makes this give up after a short wait.
            unmerge_all(Some(Duration::from_secs(5)));
        }
    }
}

/// Whether KSM is stopped (run 0), and how many pages it counts merged
/// (`pages_shared` + `pages_sharing`). `None` where KSM cannot be read:
/// without root or without KSM, nothing is cleaned.
fn ksm_state() -> Option<(bool, u64)> {
    let ksm = Ksm::open().ok()?;
    let stopped = matches!(ksm.run().ok()?, Run::Stop);
    let c = ksm.counters().ok()?;
    Some((
        stopped,
        c.pages_shared.unwrap_or(0) + c.pages_sharing.unwrap_or(0),
    ))
}

/// Unmerges everything (run 2) under KSM's lock, waiting for the lock at
/// most `wait` (`None`: until it is free), puts KSM's settings back, and
/// returns the pages KSM still counts shared (`None`: KSM could not be
/// taken or read). What [`Serial`] does after a test that left merged
/// pages; a test without the guard calls it itself.
pub fn unmerge_all(wait: Option<Duration>) -> Option<u64> {
    let opts = GuardOptions {
        wait,
        ..GuardOptions::default()
    };
    match KsmGuard::acquire_with(opts) {
        Ok(guard) => {
            guard.set_unmerge_on_restore(true);
            let report = guard.release();
            if !report.is_complete() {
                eprintln!("pagesift-testkit: KSM restore after the test: {report:?}");
            }
        }
        Err(e) => {
            eprintln!("pagesift-testkit: could not unmerge what the test left: {e}");
            return None;
        }
    }
    Ksm::open().ok()?.counters().ok()?.pages_shared
}

/// Waits for the other tests of this binary and of every other test binary
/// holding it, then returns the guard. A test that panicked while holding
/// it does not poison it for the rest.
pub fn serial() -> Serial {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::temp_dir().join(LOCK_FILE);
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .unwrap_or_else(|e| panic!("opening the test lock {}: {e}", path.display()));
    // std's lock() is flock(LOCK_EX) on Linux, released when the file is
    // closed, also when the process dies.
    file.lock()
        .unwrap_or_else(|e| panic!("locking {}: {e}", path.display()));
    Serial {
        ksm_found_clean: ksm_state() == Some((true, 0)),
        _file: file,
        _guard: guard,
    }
}
