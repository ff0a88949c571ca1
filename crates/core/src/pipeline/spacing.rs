//! Spacing a costly look at the system by its cost: a CPU share turned into
//! the wait before the next look, so that one expensive look does not stop
//! the caller from looking for long.
//!
//! ## Why
//!
//! The daemon re-reads a process's maps when its mappings changed, at most
//! at a share of a core (`scan.refresh_cpu`, 0.05 %): after a look that
//! cost `c` it waited `c / share` before the next one. Most looks cost the
//! same (about 0.6 ms for the short-lived workload), but now and then one
//! costs ten times more: the periodic smaps read, which makes the kernel
//! walk every present page of the process (9.4 ms for a 512 MiB region).
//! Spaced by its own cost, such a look left the daemon blind for 19 s, and
//! a region unmapped and mapped again in that time looked like one region
//! that lived on (`pagesift bench --full --only short-lived-2000ms`,
//! 2026-12-02, by hand: the daemon marked 512 MiB cycles again and again,
//! and ksmd spent 0.66 CPU-s on pages that were gone a moment later).
//!
//! ## The rule
//!
//! The cost that spaces a look is its own cost, but at most
//! [`SPIKE_FACTOR`] times the smoothed cost of the looks before it (an
//! exponential average with weight [`WEIGHT`], which the look's whole cost
//! then joins). A one-off spike is therefore spaced like two ordinary
//! looks; a cost that stays high lifts the average, by a factor of at
//! least `1 + WEIGHT · (SPIKE_FACTOR − 1)` per look, until the spacing is
//! the plain `cost / share` again. The CPU the share does not cover is
//! what the spikes cost above twice the average: for one smaps read a
//! minute, about 8 ms a minute (0.013 % of a core) for that workload.
//!
//! Invariant: the wait is never longer than `cost / share` (the rule it
//! replaces) and never shorter than `min(cost, SPIKE_FACTOR · average) /
//! share`.
//!
//! Time and costs are passed in ([`Nanos`]); the module reads no clock.

use crate::Nanos;

/// A look is counted at most this many times the average look.
pub const SPIKE_FACTOR: f64 = 2.0;
/// Weight of the newest look in the average.
pub const WEIGHT: f64 = 0.125;

/// The smoothed cost of one kind of look. The share of a core the looks
/// may take is passed at each look, so that a reloaded configuration
/// applies at once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CostSpacing {
    average: Option<f64>,
}

impl CostSpacing {
    /// No look made yet.
    pub fn new() -> CostSpacing {
        CostSpacing::default()
    }

    /// Folds in the cost of the look just made and returns how long to
    /// wait before the next one, for looks that may take `share` of a core
    /// (in (0, 1]; module header).
    pub fn after(&mut self, cost: Nanos, share: f64) -> Nanos {
        assert!(share > 0.0 && share <= 1.0, "share {share} not in (0, 1]");
        let c = cost as f64;
        let counted = match self.average {
            Some(avg) => c.min(SPIKE_FACTOR * avg),
            None => c,
        };
        self.average = Some(match self.average {
            Some(avg) => avg + WEIGHT * (c - avg),
            None => c,
        });
        (counted / share) as Nanos
    }

    /// The smoothed cost of a look, ns (`None` before the first).
    pub fn average(&self) -> Option<f64> {
        self.average
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Nanos = 1_000_000;

    /// Equal within a microsecond (the shares are not exact in binary).
    fn close(a: Nanos, b: Nanos) -> bool {
        a.abs_diff(b) < 1_000
    }

    #[test]
    fn steady_looks_are_spaced_by_their_cost() {
        let mut s = CostSpacing::new();
        for _ in 0..10 {
            let wait = s.after(MS / 2, 0.0005);
            assert!(close(wait, 1_000 * MS), "{wait}");
        }
    }

    /// The case that motivated the rule: 0.6 ms looks, then one smaps read
    /// of 9.4 ms. The plain rule waited 19 s; this one waits as for two
    /// ordinary looks, and the next ordinary look is spaced as before.
    #[test]
    fn a_one_off_spike_waits_as_two_ordinary_looks() {
        let mut s = CostSpacing::new();
        for _ in 0..20 {
            s.after(600_000, 0.0005);
        }
        let wait = s.after(9_400_000, 0.0005);
        assert!(close(wait, 2_400 * MS), "{wait}");
        let wait = s.after(600_000, 0.0005);
        assert!(close(wait, 1_200 * MS), "{wait}");
    }

    #[test]
    fn a_cost_that_stays_high_is_spaced_in_full_within_a_dozen_looks() {
        let mut s = CostSpacing::new();
        for _ in 0..20 {
            s.after(MS, 0.001);
        }
        let waits: Vec<Nanos> = (0..12).map(|_| s.after(10 * MS, 0.001)).collect();
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert!(close(*waits.last().unwrap(), 10_000 * MS), "{waits:?}");
    }

    proptest! {
        /// The invariant of the module header, for any sequence of costs.
        #[test]
        fn the_wait_stays_between_its_bounds(
            costs in proptest::collection::vec(0u64..50_000_000, 1..60),
            share in 0.0001f64..1.0,
        ) {
            let mut s = CostSpacing::new();
            for c in costs {
                let avg = s.average();
                let wait = s.after(c, share);
                let plain = (c as f64 / share) as Nanos;
                prop_assert!(wait <= plain);
                let floor = match avg {
                    Some(a) => (c as f64).min(SPIKE_FACTOR * a),
                    None => c as f64,
                };
                prop_assert!(wait >= (floor / share) as Nanos);
            }
        }
    }
}
