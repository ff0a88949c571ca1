//! [`RangeSet`]: a set of addresses kept as disjoint half-open ranges.
//!
//! The daemon uses it to remember which address ranges of a process are
//! `VM_MERGEABLE`: the ones it advised itself, plus those an occasional
//! smaps read showed. Knowing them lets discovery read `/proc/PID/maps`
//! (cost per VMA) instead of smaps (cost per present page) at most
//! refreshes.
//!
//! ## Invariants
//! Ranges are non-empty, sorted, disjoint and never adjacent: inserting
//! `[a, b)` next to `[b, c)` leaves one range `[a, c)`. So two sets holding
//! the same addresses are equal, whatever order they were built in.

use std::collections::BTreeMap;

/// Disjoint, coalesced half-open ranges `[start, end)`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeSet {
    /// start → end; see the module invariants.
    ranges: BTreeMap<u64, u64>,
}

impl RangeSet {
    /// The empty set.
    pub fn new() -> RangeSet {
        RangeSet::default()
    }

    /// Whether the set holds no address.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// How many disjoint ranges the set holds (its memory is about
    /// proportional to this).
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    /// Removes every range.
    pub fn clear(&mut self) {
        self.ranges.clear();
    }

    /// The ranges, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.ranges.iter().map(|(&s, &e)| (s, e))
    }

    /// Adds `[start, end)` (nothing if empty).
    pub fn insert(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let (mut s, mut e) = (start, end);
        // Absorb every range that overlaps or touches [s, e).
        let touching: Vec<u64> = self
            .ranges
            .range(..=e)
            .rev()
            .take_while(|&(_, &re)| re >= s)
            .map(|(&rs, _)| rs)
            .collect();
        for rs in touching {
            let re = self.ranges.remove(&rs).expect("listed");
            s = s.min(rs);
            e = e.max(re);
        }
        self.ranges.insert(s, e);
    }

    /// Removes `[start, end)` (nothing if empty).
    pub fn remove(&mut self, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let overlapping: Vec<(u64, u64)> = self
            .ranges
            .range(..end)
            .rev()
            .take_while(|&(_, &re)| re > start)
            .map(|(&rs, &re)| (rs, re))
            .collect();
        for (rs, re) in overlapping {
            self.ranges.remove(&rs);
            if rs < start {
                self.ranges.insert(rs, start);
            }
            if re > end {
                self.ranges.insert(end, re);
            }
        }
    }

    /// Keeps only the addresses that are also in `other` (the
    /// intersection): what was known of mappings that are gone is dropped.
    pub fn retain_within(&mut self, other: &RangeSet) {
        let mut kept = RangeSet::new();
        for (s, e) in self.iter() {
            for (os, oe) in other.ranges.range(..e) {
                if *oe > s {
                    kept.insert(s.max(*os), e.min(*oe));
                }
            }
        }
        *self = kept;
    }

    /// Whether some address of `[start, end)` is in the set.
    pub fn overlaps(&self, start: u64, end: u64) -> bool {
        start < end
            && self
                .ranges
                .range(..end)
                .next_back()
                .is_some_and(|(_, &re)| re > start)
    }

    /// Whether every address of `[start, end)` is in the set (true for an
    /// empty range).
    pub fn covers(&self, start: u64, end: u64) -> bool {
        start >= end
            || self
                .ranges
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &re)| re >= end)
    }
}

impl FromIterator<(u64, u64)> for RangeSet {
    fn from_iter<I: IntoIterator<Item = (u64, u64)>>(iter: I) -> Self {
        let mut s = RangeSet::new();
        for (a, b) in iter {
            s.insert(a, b);
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn adjacent_ranges_coalesce_and_removal_splits() {
        let mut s = RangeSet::new();
        s.insert(10, 20);
        s.insert(20, 30);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(10, 30)]);
        s.remove(14, 16);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(10, 14), (16, 30)]);
        assert!(s.covers(10, 14) && !s.covers(10, 15));
        assert!(s.overlaps(13, 17) && !s.overlaps(14, 16));
        s.insert(0, 100);
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![(0, 100)]);
        s.remove(0, 100);
        assert!(s.is_empty());
    }

    /// An operation on the set: insert or remove a small range.
    fn op() -> impl Strategy<Value = (bool, u64, u64)> {
        (any::<bool>(), 0u64..64, 0u64..16).prop_map(|(ins, a, len)| (ins, a, a + len))
    }

    proptest! {
        /// The intersection holds exactly the addresses both sets hold.
        #[test]
        fn retain_within_is_the_intersection(a in proptest::collection::vec(op(), 0..20),
                                             b in proptest::collection::vec(op(), 0..20)) {
            let build = |ops: &[(bool, u64, u64)]| -> RangeSet {
                ops.iter().map(|&(_, x, y)| (x, y)).collect()
            };
            let (mut s, t) = (build(&a), build(&b));
            let addrs = |r: &RangeSet| -> BTreeSet<u64> { r.iter().flat_map(|(x, y)| x..y).collect() };
            let want: BTreeSet<u64> = addrs(&s).intersection(&addrs(&t)).copied().collect();
            s.retain_within(&t);
            prop_assert_eq!(addrs(&s), want);
            let v: Vec<(u64, u64)> = s.iter().collect();
            for w in v.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "disjoint and not adjacent: {v:?}");
            }
        }

        /// The set answers like a plain set of addresses, and keeps its
        /// invariants, after any sequence of inserts and removes.
        #[test]
        fn behaves_like_a_set_of_addresses(ops in proptest::collection::vec(op(), 0..40),
                                           q in (0u64..80, 0u64..20)) {
            let mut s = RangeSet::new();
            let mut model = BTreeSet::new();
            for (ins, a, b) in ops {
                if ins {
                    s.insert(a, b);
                    model.extend(a..b);
                } else {
                    s.remove(a, b);
                    for x in a..b { model.remove(&x); }
                }
            }
            let v: Vec<(u64, u64)> = s.iter().collect();
            for w in v.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "disjoint and not adjacent: {v:?}");
            }
            for &(a, b) in &v {
                prop_assert!(a < b);
            }
            let held: BTreeSet<u64> = v.iter().flat_map(|&(a, b)| a..b).collect();
            prop_assert_eq!(&held, &model);
            let (a, len) = q;
            let b = a + len;
            prop_assert_eq!(s.overlaps(a, b), (a..b).any(|x| model.contains(&x)));
            prop_assert_eq!(s.covers(a, b), (a..b).all(|x| model.contains(&x)));
        }
    }
}
