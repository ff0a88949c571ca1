//! Per-process KSM figures (`/proc/PID/ksm_stat`) for the status, read at
//! a bounded share of a core.
//!
//! The status reports what each eligible process saves, from the kernel's
//! `ksm_stat`. Reading it walks the process's VMAs in the kernel (the
//! `ksm_mergeable` line looks for a `VM_MERGEABLE` one under the mmap
//! lock), so a status over 500 processes of 10 000 VMAs each made 5 M VMA
//! visits, and a poll a second spent 14 % of the daemon's CPU samples on
//! them (`scripts/vma-bound`, perf, 2026-12-05).
//!
//! The rule: a process's figures are read again only once they are older
//! than the time all the cached figures took to read, divided by
//! [`SHARE`]. Whatever the poll rate, the reads then cost at most that
//! share of a core. A few processes with few VMAs cost microseconds, so
//! their figures are always fresh to a human; at the size above they are
//! up to about ten seconds old.
//!
//! Invariant: `cost` is the sum of the entries' read times, so a check is
//! O(1).

use pagesift_linux::ksm::ProcessKsmStat;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// The share of one core that status reads of `ksm_stat` may take.
/// pagesift's choice: 1 %.
pub const SHARE: f64 = 0.01;

/// The last `ksm_stat` read of each process asked about, and what the
/// reads cost.
#[derive(Debug, Default)]
pub struct KsmStatReads {
    /// pid → (figures, when read, what the read took).
    entries: HashMap<u32, (Option<ProcessKsmStat>, Instant, Duration)>,
    /// The sum of the entries' read times.
    cost: Duration,
}

impl KsmStatReads {
    /// `pid`'s figures, if read recently enough at `now` to stand.
    pub fn fresh(&self, pid: u32, now: Instant) -> Option<Option<ProcessKsmStat>> {
        let &(stat, at, _) = self.entries.get(&pid)?;
        let stands = self.cost.as_secs_f64() / SHARE;
        (now.saturating_duration_since(at).as_secs_f64() < stands).then_some(stat)
    }

    /// Keeps `stat`, read for `pid` at `at` in `took`.
    pub fn record(&mut self, pid: u32, stat: Option<ProcessKsmStat>, at: Instant, took: Duration) {
        if let Some((_, _, old)) = self.entries.insert(pid, (stat, at, took)) {
            self.cost = self.cost.saturating_sub(old);
        }
        self.cost += took;
    }

    /// Drops a process that exited (its pid may come back as another).
    pub fn forget(&mut self, pid: u32) {
        if let Some((_, _, took)) = self.entries.remove(&pid) {
            self.cost = self.cost.saturating_sub(took);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stat(pages: u64) -> Option<ProcessKsmStat> {
        Some(ProcessKsmStat {
            merging_pages: Some(pages),
            ..Default::default()
        })
    }

    #[test]
    fn figures_stand_for_their_cost_over_the_share() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut r = KsmStatReads::default();
        assert_eq!(r.fresh(1, t0), None);
        // Two reads of 1 ms: 2 ms in all, so each stands for 200 ms.
        r.record(1, stat(10), t0, ms(1));
        r.record(2, stat(20), t0, ms(1));
        assert_eq!(r.fresh(1, t0 + ms(199)), Some(stat(10)));
        assert_eq!(r.fresh(2, t0 + ms(199)), Some(stat(20)));
        assert_eq!(r.fresh(1, t0 + ms(201)), None);
        // A read again replaces its cost, not adds to it.
        r.record(1, stat(11), t0 + ms(201), ms(1));
        assert_eq!(r.fresh(1, t0 + ms(400)), Some(stat(11)));
        assert_eq!(r.fresh(1, t0 + ms(402)), None);
        // A process gone takes its cost along: 1 ms left, 100 ms.
        r.forget(2);
        assert_eq!(r.fresh(2, t0 + ms(1)), None);
        assert_eq!(r.fresh(1, t0 + ms(300)), Some(stat(11)));
        assert_eq!(r.fresh(1, t0 + ms(302)), None);
        // Unreadable figures stand as well (the status falls back).
        r.record(3, None, t0, ms(1));
        assert_eq!(r.fresh(3, t0), Some(None));
    }
}
