//! Lifespans: whether a region is likely to be unmapped before ksmd could
//! merge it, judged by how long its process's earlier regions lived.
//!
//! ## Why
//!
//! V_life (UKSM §5.2, [`crate::pipeline::ladder`]) keeps a region younger
//! than 100 ms off the upper levels, and the ladder's rounds add more: under
//! the full governor a region reaches the top about two seconds after it is
//! first seen. A region that lives a little longer than that is marked just
//! before it is unmapped, and ksmd spends its two visits on pages that are
//! gone a moment later. In `pagesift bench --quick --only short-lived` under
//! the defaults (2026-11-28, daemon log read by hand), the 64 MiB cycles of
//! the 2 s case were marked whole at an age of 1.83 s, 0.17 s before their
//! unmap; ksmd used 0.057 CPU-s over that daemon's run, more than the
//! whole 0.5 % goal allows in the 8 s window (0.04 CPU-s).
//!
//! A process that maps and unmaps large regions in a loop (UKSM §8.1.3's
//! short-lived workload; an allocator returning arenas; a tool run over
//! and over) shows it: its regions die young, and at about the same age.
//!
//! ## The rule
//!
//! Each process keeps the ages at death of its last [`LifespanRules::kept`]
//! regions of at least [`LifespanRules::min_pages`] pages that died within
//! [`LifespanRules::memory`] of now. A region is judged by the deaths of
//! regions at least half its size (a process's small buffers say nothing
//! of its large mappings: QEMU maps and unmaps 1 MiB regions all the time
//! beside its guest RAM). If any of those died younger than
//! [`LifespanRules::short`], the region is *expected short* until it is
//! older than [`LifespanRules::margin`] times the oldest of their ages: one
//! that outlives that has proved to be another kind of region, and is
//! judged as any other. An expected-short region is not
//! marked (neither whole nor by runs); it is still sampled, so nothing is
//! lost but the marks that would have come too late.
//!
//! Ages count from the daemon's first sight of a region, so memory mapped
//! before the daemon started looks young at first. Exempting it was tried
//! and taken back: a workload that unmaps and maps again at the same
//! address between two refreshes keeps one region, first seen at the
//! start, which then was never held back (short-lived under the defaults,
//! by hand on 2026-11-28: 1.75, 1.13, 0.99, 0.69 % of a core at T = 2, 1,
//! 0.5, 0.2 s, against 0.92, 0.72, 0.69, 1.14 % without the exemption).
//! The size rule is what keeps a QEMU's small buffers from holding back
//! its guest RAM. A cycle that unmaps and maps again at the same address
//! between two refreshes is now told by its frames
//! (`pagesift_linux::renewal`): the daemon counts a death at the age the
//! region had reached and starts its age again.
//!
//! A process with no recent early death is never gated, so a region of a
//! long-running process is marked as soon as the ladder says so. The cost
//! of a wrong guess is delay, not loss: a region gated by an unrelated
//! early death waits at most `margin` times that death's age (a few
//! seconds), then is marked as before.
//!
//! Invariants: per process, at most `kept` deaths, newest last, each of a
//! region of at least `min_pages` pages; the key is the process's identity
//! (a pid reused by another process is another key).

use crate::Nanos;
use std::collections::{BTreeMap, VecDeque};

const SEC: Nanos = 1_000_000_000;

/// The rule's parameters (module header). [`Default`] is pagesift's choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LifespanRules {
    /// Smallest region whose death counts (pages): small mappings come and
    /// go in every process (stacks of short threads, I/O buffers), and
    /// marking them costs ksmd little anyway. 256 pages, 1 MiB.
    pub min_pages: u32,
    /// A death counts as evidence for this long after it.
    pub memory: Nanos,
    /// A death at an age below this is an early one. 10 s: five times the
    /// climb to the top under the full governor.
    pub short: Nanos,
    /// An expected-short region is judged normally once older than this
    /// times the oldest recent death age. 3: a region's age is the time
    /// since the daemon first saw it, and an unmap and map again that no
    /// look caught (the refresh spaced out, the renewal check not yet
    /// round to it) adds a whole cycle to it. At 1.5 the 2 s cycles of the
    /// full short-lived experiment under the defaults were marked whole at
    /// apparent ages of 3.5-3.6 s, twice in one run, and ksmd spent 0.81
    /// CPU-s on them (2026-12-02, the daemon's log read by hand); at 3 one
    /// uncaught cycle is not enough. The cost is delay: a long-lived region
    /// of such a process waits 3 times its early deaths' age.
    pub margin: f64,
    /// Deaths kept per process.
    pub kept: usize,
}

impl Default for LifespanRules {
    fn default() -> Self {
        LifespanRules {
            min_pages: 256,
            memory: 60 * SEC,
            short: 10 * SEC,
            margin: 3.0,
            kept: 4,
        }
    }
}

/// The recent deaths of each process's large regions.
#[derive(Clone, Debug)]
pub struct Lifespans<K> {
    rules: LifespanRules,
    /// Per process: (when it died, its age then, its pages), oldest first.
    deaths: BTreeMap<K, VecDeque<(Nanos, Nanos, u32)>>,
}

impl<K: Ord + Copy> Lifespans<K> {
    pub fn new(rules: LifespanRules) -> Lifespans<K> {
        Lifespans {
            rules,
            deaths: BTreeMap::new(),
        }
    }

    /// The rule's parameters.
    pub fn rules(&self) -> &LifespanRules {
        &self.rules
    }

    /// A region of `pages` pages of `proc`, first seen at `first_seen`,
    /// was unmapped at `now`.
    pub fn died(&mut self, proc: K, pages: u32, first_seen: Nanos, now: Nanos) {
        if pages < self.rules.min_pages {
            return;
        }
        let age = now.saturating_sub(first_seen);
        let d = self.deaths.entry(proc).or_default();
        if d.len() == self.rules.kept {
            d.pop_front();
        }
        d.push_back((now, age, pages));
    }

    /// Whether a region of `proc` of `pages` pages, first seen at
    /// `first_seen`, is expected at `now` to be unmapped young (module
    /// header).
    pub fn expected_short(&self, proc: K, pages: u32, first_seen: Nanos, now: Nanos) -> bool {
        let Some(d) = self.deaths.get(&proc) else {
            return false;
        };
        let age = now.saturating_sub(first_seen);
        let recent = || {
            d.iter()
                .filter(|&&(at, _, size)| {
                    now.saturating_sub(at) <= self.rules.memory
                        && u64::from(size) * 2 >= u64::from(pages)
                })
                .map(|&(_, age, _)| age)
        };
        if !recent().any(|a| a < self.rules.short) {
            return false;
        }
        let oldest = recent().max().unwrap_or(0);
        (age as f64) <= oldest as f64 * self.rules.margin
    }

    /// The processes with a death kept.
    pub fn procs(&self) -> impl Iterator<Item = &K> {
        self.deaths.keys()
    }

    /// Whether no death is kept: then nothing is expected short.
    pub fn is_empty(&self) -> bool {
        self.deaths.is_empty()
    }

    /// `proc` exited, or left the eligible set.
    pub fn forget(&mut self, proc: K) {
        self.deaths.remove(&proc);
    }

    /// Forgets every process not in `live`, and deaths no longer recent
    /// at `now`, so that [`Lifespans::is_empty`] lets the caller skip the
    /// rule once no process has shown an early death for a while.
    pub fn retain(&mut self, now: Nanos, mut live: impl FnMut(&K) -> bool) {
        let memory = self.rules.memory;
        self.deaths.retain(|k, d| {
            d.retain(|&(at, _, _)| now.saturating_sub(at) <= memory);
            !d.is_empty() && live(k)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Nanos = 1_000_000;

    fn spans() -> Lifespans<u32> {
        Lifespans::new(LifespanRules::default())
    }

    /// Whether a region of `pages` pages aged `age` at `now` is expected
    /// short.
    fn short(l: &Lifespans<u32>, proc: u32, pages: u32, age: Nanos, now: Nanos) -> bool {
        l.expected_short(proc, pages, now - age, now)
    }

    /// `proc`'s region of `pages` pages died at `now`, aged `age`.
    fn died(l: &mut Lifespans<u32>, proc: u32, pages: u32, age: Nanos, now: Nanos) {
        l.died(proc, pages, now - age, now);
    }

    #[test]
    fn a_process_without_early_deaths_is_never_gated() {
        let mut l = spans();
        assert!(!short(&l, 1, 16384, 0, 0));
        died(&mut l, 1, 16384, 30 * SEC, 40 * SEC);
        assert!(!short(&l, 1, 16384, 0, 41 * SEC));
        // Small regions do not count, however young.
        died(&mut l, 2, 255, 100 * MS, 41 * SEC);
        assert!(!short(&l, 2, 16384, 0, 42 * SEC));
    }

    #[test]
    fn after_a_young_death_its_siblings_wait_until_older_than_the_margin() {
        let mut l = spans();
        died(&mut l, 1, 16384, 2 * SEC, 10 * SEC);
        assert!(short(&l, 1, 16384, 1_830 * MS, 12 * SEC));
        // One cycle (2 s mapped, 2 s unmapped) that no look caught.
        assert!(short(&l, 1, 16384, 6 * SEC, 16 * SEC));
        assert!(!short(&l, 1, 16384, 6 * SEC + 1, 16 * SEC));
        // Other processes are not affected.
        assert!(!short(&l, 2, 16384, SEC, 12 * SEC));
        // The oldest recent death sets the bar.
        died(&mut l, 1, 16384, 4 * SEC, 14 * SEC);
        assert!(short(&l, 1, 16384, 5 * SEC, 15 * SEC));
        assert!(short(&l, 1, 16384, 12 * SEC, 15 * SEC));
        assert!(!short(&l, 1, 16384, 12 * SEC + 1, 15 * SEC));
    }

    #[test]
    fn only_deaths_of_regions_at_least_half_as_large_count() {
        let mut l = spans();
        died(&mut l, 1, 256, 2 * SEC, 10 * SEC);
        assert!(short(&l, 1, 512, SEC, 11 * SEC));
        assert!(!short(&l, 1, 513, SEC, 11 * SEC));
        assert!(!short(&l, 1, 16384, SEC, 11 * SEC));
    }

    #[test]
    fn evidence_expires_and_is_forgotten_with_the_process() {
        let mut l = spans();
        died(&mut l, 1, 16384, 2 * SEC, 10 * SEC);
        assert!(!short(&l, 1, 16384, SEC, 10 * SEC + 60 * SEC + 1));
        died(&mut l, 2, 16384, 2 * SEC, 10 * SEC);
        l.forget(2);
        assert!(!short(&l, 2, 16384, SEC, 11 * SEC));
        died(&mut l, 3, 16384, 2 * SEC, 10 * SEC);
        l.retain(11 * SEC, |&k| k != 3);
        assert!(!short(&l, 3, 16384, SEC, 11 * SEC));
        assert!(!l.is_empty(), "process 1's death is still recent");
        l.retain(10 * SEC + 60 * SEC + 1, |_| true);
        assert!(l.is_empty(), "expired deaths are dropped");
    }

    #[test]
    fn only_the_last_deaths_are_kept() {
        let mut l = spans();
        died(&mut l, 1, 16384, 2 * SEC, 10 * SEC);
        for i in 0..4 {
            died(&mut l, 1, 16384, 30 * SEC, (41 + i) * SEC);
        }
        // The early death was pushed out: no early death left.
        assert!(!short(&l, 1, 16384, SEC, 50 * SEC));
    }

    proptest! {
        #[test]
        fn a_region_older_than_every_gate_is_never_gated(
            deaths in proptest::collection::vec((1u32..100_000, 0u64..20 * SEC), 0..12),
            age in 0u64..100 * SEC,
            pages in 1u32..200_000,
        ) {
            let mut l = spans();
            let mut now = 200 * SEC;
            for &(pages, a) in &deaths {
                now += SEC;
                died(&mut l, 7, pages, a, now);
            }
            // The last four deaths kept, of those as large as half the
            // region asked about.
            let kept = || deaths.iter().rev().filter(|d| d.0 >= 256).take(4)
                .filter(|d| u64::from(d.0) * 2 >= u64::from(pages));
            let bar = kept().map(|d| d.1).max().unwrap_or(0) as f64 * LifespanRules::default().margin;
            let short = short(&l, 7, pages, age, now);
            if age as f64 > bar {
                prop_assert!(!short);
            }
            if !kept().any(|d| d.1 < 10 * SEC) {
                prop_assert!(!short);
            }
            // And the rule is exact: gated iff both.
            prop_assert_eq!(short, age as f64 <= bar && kept().any(|d| d.1 < 10 * SEC));
        }
    }
}
