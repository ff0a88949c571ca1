//! Recurring regions: a region mapped again where its process's last
//! region of the same size was marked goes to the top of the ladder at
//! once, on its predecessors' evidence.
//!
//! ## Why
//!
//! A region climbs only once it is older than V_life and has lived through
//! a round of each level ([`crate::pipeline::ladder`]); under the
//! short-lived profile (rounds of 50/20/10/5 ms, UKSM §8.1.3) that took
//! 165-200 ms from the daemon's first sight of a 64 MiB region to its mark
//! (`pagesift run` beside `pagesift-workload short-lived --period-ms 200`,
//! debug log read by hand, 2026-11-28). Its region lives about 0.3 s (0.1 s
//! of filling, then T), and ksmd needs two visits after the mark (70 ms
//! each for 16 384 pages on this machine), so no cycle was ever merged:
//! the mark came when the region was about to go.
//!
//! UKSM sees a region in its first round because it lives in the kernel;
//! pagesift sees it within a refresh (20 ms in the profile) but still
//! waits for the climb, although the process has shown, generation after
//! generation, what lives at that place. A program that maps the same
//! buffer over and over (UKSM's short-lived workload; a tool that maps
//! its input, works, unmaps, and starts again; an allocator returning and
//! taking back an arena) usually gets it at the same address, with the
//! same kind of content.
//!
//! ## The rule
//!
//! When a region dies (is unmapped), its process remembers its *place*
//! (first address and size in pages) if it had been marked whole, with
//! its duplication ratio. A region first seen at a remembered place (a new
//! VMA, or one the daemon saw mapped anew in place by its frames) within
//! [`RecurrenceRules::memory`] of that death is *recurring*: the caller
//! raises it to the top level with that ratio, past V_life and the climb
//! ([`crate::pipeline::ladder::Ladder::raise_on_history`]). Everything
//! after the top still applies: a write watch (under the defaults) must
//! find it cold, the lifespan rule may hold it back, and COW accounting
//! may demote it.
//!
//! A recurring region is marked without samples of its own, so the chain
//! must not feed itself: a generation that was raised on history passes
//! its place on only if the caller saw ksmd merge some of its pages
//! before it died (the daemon: an accounting pass, or a probe of the
//! region's first pages each wake-up while it merges, since a region that
//! lives 0.3 s often dies before a pass looks at it). After [`RecurrenceRules::max_blind`] raised
//! generations in a row without a merge seen (they may have died before
//! any pass looked at them), the next one must climb on its own samples.
//! A generation that died without being marked (held, never reached the
//! top) forgets the place.
//!
//! Invariants: per process at most [`RecurrenceRules::kept`] places,
//! distinct by (start, pages), newest last; each `blind` ≤ `max_blind`.

use crate::Nanos;
use std::collections::{BTreeMap, VecDeque};

const SEC: Nanos = 1_000_000_000;

/// The rule's parameters (module header). [`Default`] is pagesift's choice.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RecurrenceRules {
    /// A death counts as evidence for this long after it: a minute, as
    /// for the lifespan rule.
    pub memory: Nanos,
    /// Places kept per process.
    pub kept: usize,
    /// Generations raised on history in a row, without a merge seen,
    /// after which the next one climbs on its own samples.
    pub max_blind: u32,
}

impl Default for RecurrenceRules {
    fn default() -> Self {
        RecurrenceRules {
            memory: 60 * SEC,
            kept: 8,
            max_blind: 4,
        }
    }
}

/// How a region's life ended, as far as the rule cares.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Ending {
    /// It was marked whole, with duplication ratio `dup`. `raised`: it
    /// had been raised on history itself; `merged`: accounting saw ksmd
    /// merge some of its pages.
    Marked {
        dup: f64,
        raised: bool,
        merged: bool,
    },
    /// It was not marked whole (held, never on top, marked by runs).
    Unmarked,
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Place {
    start: u64,
    pages: u32,
    died_at: Nanos,
    dup: f64,
    /// Raised generations in a row without a merge seen.
    blind: u32,
}

/// The places of each process's recently unmapped marked regions.
#[derive(Clone, Debug)]
pub struct Recurrences<K> {
    rules: RecurrenceRules,
    places: BTreeMap<K, VecDeque<Place>>,
}

impl<K: Ord + Copy> Recurrences<K> {
    pub fn new(rules: RecurrenceRules) -> Recurrences<K> {
        Recurrences {
            rules,
            places: BTreeMap::new(),
        }
    }

    /// `proc`'s region at `start`, of `pages` pages, was unmapped at `now`
    /// and ended as `ending`.
    pub fn died(&mut self, proc: K, start: u64, pages: u32, ending: Ending, now: Nanos) {
        let places = self.places.entry(proc).or_default();
        let before = places
            .iter()
            .position(|p| p.start == start && p.pages == pages)
            .and_then(|i| places.remove(i));
        let Ending::Marked {
            dup,
            raised,
            merged,
        } = ending
        else {
            if places.is_empty() {
                self.places.remove(&proc);
            }
            return;
        };
        let blind = match (raised, merged) {
            (false, _) | (true, true) => 0,
            (true, false) => before.map_or(0, |p| p.blind) + 1,
        };
        if blind > self.rules.max_blind {
            if places.is_empty() {
                self.places.remove(&proc);
            }
            return;
        }
        if places.len() == self.rules.kept {
            places.pop_front();
        }
        places.push_back(Place {
            start,
            pages,
            died_at: now,
            dup,
            blind,
        });
    }

    /// If a region of `proc` first seen now at `start`, of `pages` pages,
    /// is recurring (module header): its predecessor's duplication ratio,
    /// to raise it with.
    pub fn predecessor(&self, proc: K, start: u64, pages: u32, now: Nanos) -> Option<f64> {
        let p = self
            .places
            .get(&proc)?
            .iter()
            .find(|p| p.start == start && p.pages == pages)?;
        (now.saturating_sub(p.died_at) <= self.rules.memory && p.blind < self.rules.max_blind)
            .then_some(p.dup)
    }

    /// Whether no place is kept.
    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }

    /// Forgets every process not in `live`, and places whose death is no
    /// longer recent at `now`.
    pub fn retain(&mut self, now: Nanos, mut live: impl FnMut(&K) -> bool) {
        let memory = self.rules.memory;
        self.places.retain(|k, places| {
            places.retain(|p| now.saturating_sub(p.died_at) <= memory);
            !places.is_empty() && live(k)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Nanos = 1_000_000;
    const START: u64 = 0x7f00_0000_0000;

    fn rec() -> Recurrences<u32> {
        Recurrences::new(RecurrenceRules::default())
    }

    fn marked(raised: bool, merged: bool) -> Ending {
        Ending::Marked {
            dup: 0.9,
            raised,
            merged,
        }
    }

    #[test]
    fn a_region_at_the_place_of_a_marked_one_is_recurring() {
        let mut r = rec();
        assert_eq!(r.predecessor(1, START, 16384, 0), None);
        r.died(1, START, 16384, marked(false, false), SEC);
        assert_eq!(r.predecessor(1, START, 16384, SEC + 200 * MS), Some(0.9));
        // Another size, another address, another process: not the place.
        assert_eq!(r.predecessor(1, START, 16383, SEC), None);
        assert_eq!(r.predecessor(1, START + 4096, 16384, SEC), None);
        assert_eq!(r.predecessor(2, START, 16384, SEC), None);
        // A minute later the evidence is stale.
        assert_eq!(r.predecessor(1, START, 16384, 61 * SEC + 1), None);
    }

    #[test]
    fn a_generation_that_was_not_marked_forgets_the_place() {
        let mut r = rec();
        r.died(1, START, 16384, marked(false, false), SEC);
        r.died(1, START, 16384, Ending::Unmarked, 2 * SEC);
        assert_eq!(r.predecessor(1, START, 16384, 2 * SEC), None);
        assert!(r.is_empty());
    }

    #[test]
    fn raised_generations_without_a_merge_seen_end_the_chain() {
        let mut r = rec();
        r.died(1, START, 16384, marked(false, false), 0);
        let max = RecurrenceRules::default().max_blind;
        for i in 1..max {
            r.died(1, START, 16384, marked(true, false), u64::from(i) * SEC);
            assert!(r.predecessor(1, START, 16384, u64::from(i) * SEC).is_some());
        }
        r.died(1, START, 16384, marked(true, false), u64::from(max) * SEC);
        assert_eq!(r.predecessor(1, START, 16384, u64::from(max) * SEC), None);
        // A generation that climbed on its own samples starts it again.
        r.died(1, START, 16384, marked(false, false), 20 * SEC);
        assert!(r.predecessor(1, START, 16384, 20 * SEC).is_some());
        // And a raised one that merged keeps it going indefinitely.
        for i in 0..20 {
            r.died(1, START, 16384, marked(true, true), (21 + i) * SEC);
        }
        assert!(r.predecessor(1, START, 16384, 41 * SEC).is_some());
    }

    #[test]
    fn places_expire_and_are_forgotten_with_the_process() {
        let mut r = rec();
        r.died(1, START, 16384, marked(false, false), SEC);
        r.died(2, START, 16384, marked(false, false), SEC);
        r.retain(2 * SEC, |&k| k != 2);
        assert!(r.predecessor(2, START, 16384, 2 * SEC).is_none());
        assert!(r.predecessor(1, START, 16384, 2 * SEC).is_some());
        r.retain(62 * SEC, |_| true);
        assert!(r.is_empty());
    }

    proptest! {
        #[test]
        fn places_stay_bounded_and_distinct(
            deaths in proptest::collection::vec((0u64..12, any::<bool>(), any::<bool>(), any::<bool>()), 0..64),
        ) {
            let mut r = rec();
            for (i, &(slot, marked_whole, raised, merged)) in deaths.iter().enumerate() {
                let ending = if marked_whole { marked(raised, merged) } else { Ending::Unmarked };
                r.died(7, START + slot * (1 << 26), 16384, ending, i as u64 * MS);
                let places = r.places.get(&7).map_or(0, |p| p.len());
                prop_assert!(places <= 8);
                if let Some(p) = r.places.get(&7) {
                    let mut starts: Vec<u64> = p.iter().map(|p| p.start).collect();
                    starts.sort_unstable();
                    starts.dedup();
                    prop_assert_eq!(starts.len(), p.len());
                    prop_assert!(p.iter().all(|p| p.blind <= 4));
                }
                // The place just unmarked is never recurring.
                if !marked_whole {
                    prop_assert!(r.predecessor(7, START + slot * (1 << 26), 16384, i as u64 * MS).is_none());
                }
            }
        }
    }
}
