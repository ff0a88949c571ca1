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

use std::fs::File;
use std::sync::{Mutex, MutexGuard};

/// The lock file shared by every test binary of every checkout.
const LOCK_FILE: &str = "pagesift-tests.lock";

/// Held while a test runs; dropping it lets the next one in.
pub struct Serial {
    // Field order is drop order: the file is unlocked before the mutex
    // lets a sibling thread in, so the sibling finds the file free.
    _file: File,
    _guard: MutexGuard<'static, ()>,
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
        _file: file,
        _guard: guard,
    }
}
