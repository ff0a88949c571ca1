//! Census: who holds which duplicate, and who would save what.
//!
//! An exact scan (`pagesift scan --exact`) reads every frame once and
//! sorts frames into *content groups* (frames with byte-identical
//! contents; the byte comparison is the caller's job). This module does
//! the bookkeeping that follows, with no I/O, so that it is property-tested
//! against a brute-force count.
//!
//! ## Definitions (shared with the sampled scan, SCAN.md)
//!
//! - A *frame* is a physical page. A frame mapped by several processes
//!   (after fork, not yet copied) is one frame: the caller adds it once,
//!   attributed to the first mapping it met (scan order).
//! - A frame is *duplicated* when another frame of its group exists. It is
//!   counted in the nearest category where such a twin lives: the same
//!   region ([`Attribution::in_region`]), else the same process
//!   ([`Attribution::in_process`]), else another process
//!   ([`Attribution::across`]). A twin is located by the region its frame
//!   is attributed to.
//! - *Saving* is what merging every duplicate would free: for a group of
//!   `n ≥ 2` frames, `n − 1`. **Survivor rule:** the group's first frame in
//!   scan order survives; every other frame counts one page of saving to
//!   the region it is attributed to. Scanning processes by ascending pid
//!   and regions by address, the oldest process (a fork parent) keeps the
//!   survivor and later copies carry the saving.
//!
//! ## The algorithm
//!
//! Frames arrive in scan order, region after region, so a group's frames
//! come as a short list of `(region, count)` entries: one entry per region
//! that holds members, in the order the regions were met. A group costs 12
//! bytes when it lives in one region (the common case), whatever its size;
//! further entries go to a side table. [`Census::attribute`] then walks
//! every group once: an entry with `count ≥ 2` puts all its frames in
//! `in_region`; a lone frame goes to `in_process` if its process holds
//! another entry of the group, else to `across`; the first entry keeps one
//! survivor. A process that vanished mid-scan is dropped
//! ([`Census::drop_process`]): its entries are skipped at attribution, and
//! the survivor is the first frame of a process that is still there.
//!
//! ## Classes
//!
//! [`classify`] turns a region's counts, and what a second read of its
//! duplicated frames found, into the class UKSM's ladder would give it
//! (§5.2): a region whose duplicates changed by more than V_cow between the
//! reads is changing; otherwise one whose duplication ratio, net of
//! changes, is at least V_dup is statically duplicated; anything else is
//! sparse. The thresholds are the ladder's ([`pagesift_core::pipeline::ladder::LadderConfig`]).

use std::collections::HashMap;

/// A region's index in the census (regions are numbered in scan order).
pub type RegionIx = u32;
/// A content group's index.
pub type GroupIx = u32;

const NONE: u32 = u32::MAX;

/// One group's members in one region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    region: RegionIx,
    count: u32,
}

/// A group: its first entry inline, more in the side table.
#[derive(Clone, Copy, Debug)]
struct Group {
    first: Entry,
    /// Index in `Census::more`, or `NONE`.
    more: u32,
}

/// Per-region outcome of [`Census::attribute`]: frames attributed to the
/// region, how many of them are duplicated (by category) and the saving.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Attribution {
    /// Frames attributed to the region (each frame once, system-wide).
    pub frames: u64,
    /// Duplicated frames with a twin in the same region.
    pub in_region: u64,
    /// Duplicated frames whose nearest twin is in another region of the
    /// same process.
    pub in_process: u64,
    /// Duplicated frames whose twins are all in other processes.
    pub across: u64,
    /// Frames merging would free here (survivor rule in the module doc).
    pub saving: u64,
}

impl Attribution {
    /// Duplicated frames, all categories.
    pub fn duplicated(&self) -> u64 {
        self.in_region + self.in_process + self.across
    }

    /// Adds `other` field by field.
    pub fn add(&mut self, other: &Attribution) {
        self.frames += other.frames;
        self.in_region += other.in_region;
        self.in_process += other.in_process;
        self.across += other.across;
        self.saving += other.saving;
    }
}

/// The grouping bookkeeping of an exact scan.
#[derive(Clone, Debug, Default)]
pub struct Census {
    /// Owning process of each region.
    region_process: Vec<u32>,
    dropped: Vec<bool>,
    groups: Vec<Group>,
    more: Vec<Vec<Entry>>,
}

impl Census {
    /// An empty census.
    pub fn new() -> Census {
        Census::default()
    }

    /// An empty census with room for `groups` groups.
    pub fn with_capacity(groups: usize) -> Census {
        Census {
            groups: Vec::with_capacity(groups),
            ..Census::default()
        }
    }

    /// Adds a region of process `process` (any caller-chosen number; equal
    /// numbers mean the same process). Regions are numbered in the order
    /// they are added, which should be scan order.
    pub fn add_region(&mut self, process: u32) -> RegionIx {
        self.region_process.push(process);
        (self.region_process.len() - 1) as RegionIx
    }

    /// Regions added so far.
    pub fn regions(&self) -> usize {
        self.region_process.len()
    }

    /// The process a region belongs to.
    pub fn process_of(&self, region: RegionIx) -> u32 {
        self.region_process[region as usize]
    }

    /// Groups so far.
    pub fn groups(&self) -> usize {
        self.groups.len()
    }

    /// Forgets every frame of `process` (it exited mid-scan): they are
    /// ignored by [`attribute`](Self::attribute).
    pub fn drop_process(&mut self, process: u32) {
        if self.dropped.len() <= process as usize {
            self.dropped.resize(process as usize + 1, false);
        }
        self.dropped[process as usize] = true;
    }

    fn is_dropped(&self, region: RegionIx) -> bool {
        let p = self.region_process[region as usize] as usize;
        self.dropped.get(p).copied().unwrap_or(false)
    }

    /// Starts a new group whose first frame (its survivor) is in `region`.
    pub fn new_group(&mut self, region: RegionIx) -> GroupIx {
        debug_assert!((region as usize) < self.region_process.len());
        self.groups.push(Group {
            first: Entry { region, count: 1 },
            more: NONE,
        });
        (self.groups.len() - 1) as GroupIx
    }

    /// Adds a frame in `region` to `group`.
    pub fn add_frame(&mut self, group: GroupIx, region: RegionIx) {
        debug_assert!((region as usize) < self.region_process.len());
        let g = &mut self.groups[group as usize];
        if g.first.region == region {
            g.first.count += 1;
            return;
        }
        if g.more == NONE {
            g.more = self.more.len() as u32;
            self.more.push(vec![Entry { region, count: 1 }]);
            return;
        }
        let list = &mut self.more[g.more as usize];
        // Frames arrive region by region: the last entry is almost always
        // the one; search the rest only if the caller went back.
        match list.last_mut() {
            Some(e) if e.region == region => e.count += 1,
            _ => match list.iter_mut().find(|e| e.region == region) {
                Some(e) => e.count += 1,
                None => list.push(Entry { region, count: 1 }),
            },
        }
    }

    /// Frames in `group`, over all regions (dropped processes included).
    pub fn frames(&self, group: GroupIx) -> u64 {
        let g = &self.groups[group as usize];
        let more = if g.more == NONE {
            0
        } else {
            self.more[g.more as usize]
                .iter()
                .map(|e| e.count as u64)
                .sum()
        };
        g.first.count as u64 + more
    }

    /// Frames of live (not dropped) processes in `group`.
    pub fn live_frames(&self, group: GroupIx) -> u64 {
        self.entries(group).map(|e| e.count as u64).sum()
    }

    /// Whether `group` has at least two frames in live processes.
    pub fn is_duplicated(&self, group: GroupIx) -> bool {
        self.live_frames(group) >= 2
    }

    /// The live entries of a group, in the order they were met.
    fn entries(&self, group: GroupIx) -> impl Iterator<Item = Entry> + '_ {
        let g = &self.groups[group as usize];
        let more: &[Entry] = if g.more == NONE {
            &[]
        } else {
            &self.more[g.more as usize]
        };
        std::iter::once(g.first)
            .chain(more.iter().copied())
            .filter(|e| !self.is_dropped(e.region))
    }

    /// Distinct contents among live frames (groups with a live frame).
    pub fn distinct(&self) -> u64 {
        (0..self.groups.len() as GroupIx)
            .filter(|&g| self.live_frames(g) > 0)
            .count() as u64
    }

    /// Per-region attribution, indexed by [`RegionIx`]. Regions of dropped
    /// processes get zeros.
    pub fn attribute(&self) -> Vec<Attribution> {
        let mut out = vec![Attribution::default(); self.region_process.len()];
        let mut list: Vec<Entry> = Vec::new();
        let mut per_process: HashMap<u32, u64> = HashMap::new();
        for g in 0..self.groups.len() as GroupIx {
            list.clear();
            list.extend(self.entries(g));
            let total: u64 = list.iter().map(|e| e.count as u64).sum();
            for e in &list {
                out[e.region as usize].frames += e.count as u64;
            }
            if total < 2 {
                continue;
            }
            if list.len() > 1 {
                per_process.clear();
                for e in &list {
                    *per_process.entry(self.process_of(e.region)).or_default() += e.count as u64;
                }
            }
            for (k, e) in list.iter().enumerate() {
                let a = &mut out[e.region as usize];
                let n = e.count as u64;
                if n >= 2 {
                    a.in_region += n;
                } else if per_process[&self.process_of(e.region)] >= 2 {
                    a.in_process += n;
                } else {
                    a.across += n;
                }
                // The first live entry holds the survivor.
                a.saving += if k == 0 { n - 1 } else { n };
            }
        }
        out
    }
}

/// What a region looks like to UKSM's ladder, from an exact count and a
/// second read of its duplicated frames.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionClass {
    /// Duplication ratio (net of changes) at least V_dup, duplicates
    /// stable.
    StaticallyDuplicated,
    /// Duplication ratio below V_dup.
    Sparse,
    /// More than V_cow of its duplicated frames changed (were rewritten,
    /// unmapped or replaced) between the two reads.
    Changing,
}

/// The class of a region with `frames` frames attributed to it, of which
/// `duplicated` were duplicated at the first read and `changed` of those
/// differed (content, frame, or presence) at the second read. Follows the
/// ladder's judgement (UKSM §5.2, code `cal_dedup_ratio`): the COW-broken
/// ratio is `changed / duplicated`; above `v_cow` the region is changing;
/// else the ratio `(duplicated − changed) / frames` decides between
/// statically duplicated (`≥ v_dup`, and above 0) and sparse.
pub fn classify(frames: u64, duplicated: u64, changed: u64, v_dup: f64, v_cow: f64) -> RegionClass {
    let changed = changed.min(duplicated);
    if duplicated > 0 && changed as f64 / duplicated as f64 > v_cow {
        return RegionClass::Changing;
    }
    if frames == 0 {
        return RegionClass::Sparse;
    }
    let ratio = (duplicated - changed) as f64 / frames as f64;
    if ratio > 0.0 && ratio >= v_dup {
        RegionClass::StaticallyDuplicated
    } else {
        RegionClass::Sparse
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Brute force: frames as (region, content) in scan order.
    fn brute(
        region_process: &[u32],
        dropped: &[u32],
        frames: &[(RegionIx, u32)],
    ) -> Vec<Attribution> {
        let live: Vec<(RegionIx, u32)> = frames
            .iter()
            .copied()
            .filter(|(r, _)| !dropped.contains(&region_process[*r as usize]))
            .collect();
        let mut out = vec![Attribution::default(); region_process.len()];
        let mut seen_content: Vec<u32> = Vec::new();
        for (i, &(r, c)) in live.iter().enumerate() {
            let a = &mut out[r as usize];
            a.frames += 1;
            let twins: Vec<RegionIx> = live
                .iter()
                .enumerate()
                .filter(|&(j, &(_, c2))| j != i && c2 == c)
                .map(|(_, &(r2, _))| r2)
                .collect();
            if twins.is_empty() {
                continue;
            }
            let p = region_process[r as usize];
            if twins.contains(&r) {
                a.in_region += 1;
            } else if twins.iter().any(|&t| region_process[t as usize] == p) {
                a.in_process += 1;
            } else {
                a.across += 1;
            }
            if seen_content.contains(&c) {
                a.saving += 1;
            } else {
                seen_content.push(c);
            }
        }
        out
    }

    /// Feeds frames in order, one group per content.
    fn census_of(region_process: &[u32], dropped: &[u32], frames: &[(RegionIx, u32)]) -> Census {
        let mut c = Census::new();
        for &p in region_process {
            c.add_region(p);
        }
        let mut group_of: HashMap<u32, GroupIx> = HashMap::new();
        for &(r, content) in frames {
            match group_of.get(&content) {
                Some(&g) => c.add_frame(g, r),
                None => {
                    let g = c.new_group(r);
                    group_of.insert(content, g);
                }
            }
        }
        for &p in dropped {
            c.drop_process(p);
        }
        c
    }

    #[test]
    fn categories_by_hand() {
        // Process 0: regions 0 and 1; process 1: region 2.
        let rp = [0, 0, 1];
        // Content 7: twice in region 0 → in_region, survivor in region 0.
        // Content 8: region 0 and region 1 → in_process.
        // Content 9: region 1 and region 2 → across.
        // Content 10: alone.
        let frames = [(0, 7), (0, 7), (0, 8), (1, 8), (1, 9), (2, 9), (2, 10)];
        let c = census_of(&rp, &[], &frames);
        let a = c.attribute();
        assert_eq!(
            a[0],
            Attribution {
                frames: 3,
                in_region: 2,
                in_process: 1,
                across: 0,
                saving: 1
            }
        );
        assert_eq!(
            a[1],
            Attribution {
                frames: 2,
                in_region: 0,
                in_process: 1,
                across: 1,
                saving: 1
            }
        );
        assert_eq!(
            a[2],
            Attribution {
                frames: 2,
                in_region: 0,
                in_process: 0,
                across: 1,
                saving: 1
            }
        );
        assert_eq!(c.distinct(), 4);
        assert_eq!(a, brute(&rp, &[], &frames));
    }

    #[test]
    fn survivor_moves_when_its_process_is_dropped() {
        let rp = [0, 1, 2];
        let frames = [(0, 1), (1, 1), (2, 1)];
        let mut c = census_of(&rp, &[], &frames);
        assert_eq!(c.attribute()[0].saving, 0);
        assert_eq!(c.attribute()[1].saving, 1);
        c.drop_process(0);
        let a = c.attribute();
        assert_eq!(a[0], Attribution::default());
        assert_eq!(a[1].saving, 0, "region 1 now holds the survivor");
        assert_eq!(a[2].saving, 1);
        assert_eq!(a[1].across + a[2].across, 2);
        assert!(c.is_duplicated(0));
        c.drop_process(1);
        assert!(!c.is_duplicated(0));
        assert_eq!(
            c.attribute()[2],
            Attribution {
                frames: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn classes_follow_the_ladder_thresholds() {
        let (v_dup, v_cow) = (0.10, 0.50);
        assert_eq!(
            classify(100, 50, 0, v_dup, v_cow),
            RegionClass::StaticallyDuplicated
        );
        assert_eq!(
            classify(100, 10, 0, v_dup, v_cow),
            RegionClass::StaticallyDuplicated
        );
        assert_eq!(classify(100, 9, 0, v_dup, v_cow), RegionClass::Sparse);
        assert_eq!(classify(100, 0, 0, v_dup, v_cow), RegionClass::Sparse);
        assert_eq!(classify(0, 0, 0, v_dup, v_cow), RegionClass::Sparse);
        assert_eq!(classify(100, 50, 26, v_dup, v_cow), RegionClass::Changing);
        // Exactly V_cow is not above it; the net ratio 25 % still climbs.
        assert_eq!(
            classify(100, 50, 25, v_dup, v_cow),
            RegionClass::StaticallyDuplicated
        );
        // Net of changes below V_dup.
        assert_eq!(classify(100, 12, 5, v_dup, v_cow), RegionClass::Sparse);
    }

    fn scenario() -> impl Strategy<Value = (Vec<u32>, Vec<u32>, Vec<(RegionIx, u32)>)> {
        (1usize..8, 1u32..5).prop_flat_map(|(regions, procs)| {
            let rp = prop::collection::vec(0..procs, regions);
            rp.prop_flat_map(move |mut rp| {
                // Regions of one process are contiguous in scan order.
                rp.sort_unstable();
                let n = rp.len() as RegionIx;
                let frames = prop::collection::vec((0..n, 0u32..12), 0..60).prop_map(|mut f| {
                    f.sort_by_key(|&(r, _)| r);
                    f
                });
                let dropped = prop::collection::vec(0..procs, 0..2);
                (Just(rp), dropped, frames)
            })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]
        #[test]
        fn matches_brute_force((rp, dropped, frames) in scenario()) {
            let c = census_of(&rp, &dropped, &frames);
            let a = c.attribute();
            prop_assert_eq!(&a, &brute(&rp, &dropped, &frames));
            // Totals: saving = frames − distinct, duplicated ≥ saving.
            let mut t = Attribution::default();
            for x in &a { t.add(x); }
            prop_assert_eq!(t.saving, t.frames - c.distinct());
            prop_assert!(t.duplicated() >= t.saving);
            prop_assert!(t.duplicated() <= t.frames);
        }

        #[test]
        fn order_of_arrival_inside_the_scan_does_not_matter_for_categories(
            (rp, _d, frames) in scenario(), seed: u64,
        ) {
            // Frames of one region may come in any order; categories and
            // totals stay the same (only the survivor's place may move).
            let mut shuffled = frames.clone();
            let mut x = seed | 1;
            for i in (1..shuffled.len()).rev() {
                x ^= x << 13; x ^= x >> 7; x ^= x << 17;
                shuffled.swap(i, (x % (i as u64 + 1)) as usize);
            }
            let a = census_of(&rp, &[], &frames).attribute();
            let b = census_of(&rp, &[], &shuffled).attribute();
            let key = |v: &[Attribution]| v.iter().map(|x| (x.frames, x.in_region, x.in_process, x.across)).collect::<Vec<_>>();
            prop_assert_eq!(key(&a), key(&b));
            let total = |v: &[Attribution]| v.iter().map(|x| x.saving).sum::<u64>();
            prop_assert_eq!(total(&a), total(&b));
        }
    }
}
