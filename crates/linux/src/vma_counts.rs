//! Each process's VMA count as pagesift last knew it, shared by every
//! check of the VMA budget in this process: the daemon's before it plans a
//! batch, and the tracer thread of each injector (the actuator's and the
//! write tracker's) before it runs one.
//!
//! A process may hold at most `vm.max_map_count` VMAs, and a `madvise`
//! over part of a VMA splits it, so every batch that may split is checked
//! against a budget first. Counting means reading all of
//! `/proc/PID/maps`, where the kernel formats every line: 3.0 ms for a
//! process of 10 000 VMAs (median, example `vma_read_cost`,
//! docs/benchmarks.md). With one
//! store per checker, each batch into such a process was counted up to
//! three times, 15 % of the daemon's CPU samples at 500 of them
//! (`scripts/vma-bound`, perf, 2026-12-05). One store lets a count serve
//! them all.
//!
//! An entry is `(start time, n, at)`: `n` bounds from above the VMAs the
//! process had when it was counted at `at`, plus what pagesift's own calls
//! may have added since (two a splitting `madvise`, [`grown`]). The start
//! time is part of the key, so a pid reused by a later process never
//! inherits a count. How old an entry may be is the reader's call: a
//! process maps and unmaps by itself too. The daemon drops the entry
//! once it learns of advice it gave, so that its next check counts
//! exactly; an injector's bound serves the checks until then. A batch that ends without its
//! bound being recorded leaves no entry ([`forget`] before it runs), so
//! the next check counts again.

use crate::error::LinuxError;
use crate::proc::map_count;
use std::collections::HashMap;
use std::sync::{LazyLock, Mutex, MutexGuard};
use std::time::Instant;

/// pid → (start time, bound on the VMA count, when it was counted).
type Counts = HashMap<u32, (u64, u64, Instant)>;

static COUNTS: LazyLock<Mutex<Counts>> = LazyLock::new(|| Mutex::new(HashMap::new()));

/// Most processes kept: beyond, the store starts again (it is a cache).
const MOST: usize = 65_536;

fn counts() -> MutexGuard<'static, Counts> {
    // A panic while holding the lock leaves a map that is still a valid
    // cache: every entry is a bound some checker recorded whole.
    COUNTS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The bound known for the process `(pid, start_time)`, and when the count
/// it grew from was read.
pub fn known(pid: u32, start_time: u64) -> Option<(u64, Instant)> {
    let c = counts();
    c.get(&pid)
        .filter(|e| e.0 == start_time)
        .map(|&(_, n, at)| (n, at))
}

/// Counts the VMAs of `(pid, start_time)` now and keeps the count.
pub fn count(pid: u32, start_time: u64) -> Result<(u64, Instant), LinuxError> {
    let at = Instant::now();
    let n = map_count(pid)?;
    record(pid, start_time, n, at);
    Ok((n, at))
}

/// Keeps `n` as the VMA count of `(pid, start_time)` read at `at`.
pub fn record(pid: u32, start_time: u64, n: u64, at: Instant) {
    let mut c = counts();
    if c.len() >= MOST && !c.contains_key(&pid) {
        c.clear();
    }
    c.insert(pid, (start_time, n, at));
}

/// Raises the bound of `(pid, start_time)` by `added` VMAs that pagesift's
/// calls may have made, keeping when it was counted: a chain of bounds
/// never stands longer than its readers allow after a real count.
pub fn grown(pid: u32, start_time: u64, from: (u64, Instant), added: u64) {
    record(pid, start_time, from.0 + added, from.1);
}

/// Drops what is known of `pid`: it is about to change in ways not yet
/// bounded, or it exited.
pub fn forget(pid: u32) {
    counts().remove(&pid);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_count_is_kept_per_process_and_start_time() {
        let me = std::process::id();
        let (n, at) = count(me, 7).unwrap();
        assert!(n > 0);
        assert_eq!(known(me, 7), Some((n, at)));
        // Another process that reused the pid knows nothing.
        assert_eq!(known(me, 8), None);
        grown(me, 7, (n, at), 4);
        assert_eq!(known(me, 7), Some((n + 4, at)));
        forget(me);
        assert_eq!(known(me, 7), None);
        assert!(matches!(
            count(u32::MAX >> 1, 1),
            Err(LinuxError::NoSuchProcess(_))
        ));
    }
}
