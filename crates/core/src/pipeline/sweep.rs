//! The exact sweep: every present page of the sampling regions hashed once
//! per epoch, so that duplicates are found wherever their twins live.
//!
//! ## Why, beside the ladder's sampling
//! Sampling finds a duplicate only when both copies are sampled in the
//! same epoch, or one of them already sits in the stable index. Twins at
//! the same offset of equally sized regions meet through coordinated
//! sampling ([`crate::pipeline::ladder`]), but twins at unrelated offsets (a file in
//! one guest's page cache and in another's, or twice in one guest: page
//! cache and a tmpfs copy) meet with probability about k²/n per round for
//! k samples of an n-page region: at the bottom level's density, never.
//! Hashing every present page costs about as much as sampling a few of
//! them through the same system calls (the batching makes the difference),
//! and far less than letting ksmd look at every page twice. So a sweep is
//! run at a small CPU share, and its findings steer the ladder:
//!
//! - a region whose present pages are at least V_dup duplicates is raised
//!   to the top level at once ([`crate::pipeline::ladder::Ladder::raise`]), where the
//!   usual rules (write watch, then marking whole or around its written
//!   zones) take over;
//! - in a poorer region, each run of duplicate pages long enough to be
//!   worth a VMA of its own is reported like a sampled duplicate run.
//!
//! ## Equality
//! Pages are compared by a 64-bit content hash. A false match is harmless:
//! the verdict only decides what is offered to ksmd, which compares bytes
//! before it merges. Pages already merged (KSM or zero-page mappings) count
//! as duplicates without being read.
//!
//! - every region's finding carries its duplicate pages as a [`DupMap`], so
//!   that the write watch can tell writes that land on duplicates (they
//!   would break merged pages) from writes beside them (they would not:
//!   [`crate::pipeline::write_watch`]);
//! - and its *unique zones*: stretches of at least [`UNIQUE_ZONE_MIN`]
//!   pages that hold present pages with no twin and no duplicate at all
//!   (broken by no hole longer than [`UNIQUE_HOLE_MAX`]), the
//!   [`UNIQUE_ZONES_MAX`] longest. A promoted region is marked around
//!   them (unless sampling found more duplicates than the zones leave
//!   room for: the sweep reads no merged page, so twins that ksmd merged
//!   elsewhere are invisible to it; the daemon then sets them aside). Why: ksmd visits every marked page on every full scan, a page
//!   with no twin at full cost (checksum, unstable-tree insertion) until
//!   its smart-scan skipping starts after three visits, and each region
//!   marked makes ksmd pass over everything marked before it three more
//!   times. Guest RAM that sampling found duplicated as a whole is often
//!   duplicated in parts only: in one vm-boot run (2026-11-27, daemon log
//!   read by hand) the 64 MiB regions marked whole settled with 72 180 of
//!   their 207 661 pages merged, some with 251 or 905 of 16 384.
//!
//! ## Recall
//! A page merged by ksmd is not read again (that would pin it), so an
//! epoch cannot hash it, and new copies of merged content would find no
//! twin: a third guest reading the files two guests read and merged
//! before finds them only in its own page cache and tmpfs copy. So the
//! sweeper keeps a [`Recall`] of the hashes earlier epochs saw, with a
//! digest of where each was seen: a page whose hash no page of this
//! epoch had yet, but an earlier epoch saw at another place, counts as a
//! duplicate. The content may have gone since (freed, rewritten); then
//! ksmd finds nothing to merge there, which the verdict allows. The
//! recall is bounded (two generations of at most half its capacity each,
//! the newest kept), so memory moving around a long-lived heap costs a
//! few needless marks at most.
//!
//! ## Fingerprints
//! A region whose sweep found nothing left to merge is walked again only
//! rarely (the daemon's sweeper spaces its walks out), and when its time
//! comes it is first compared with a [`Fingerprint`] its last walk left:
//! [`FINGERPRINT_PAGES`] pages spread evenly over it, each as that walk
//! saw it (absent, merged, or the hash of its content). If every one of
//! them is as it was, the region is taken to be unchanged and sits out
//! again without being hashed. Distinct memory that stays distinct then
//! costs a few dozen page reads per check instead of a full walk; memory
//! that changes anywhere near a probe is walked. What a probe misses
//! (a change between probes) waits for the next check, or for the
//! ladder's sampling, which keeps watching every region.
//!
//! ## Invariants
//! `first` holds, per hash seen this epoch, the first location seen with
//! it. A page's bit in its region's tally is set iff another observed page
//! had the same hash (or the page was observed merged), and `dups` counts
//! the set bits. `present <= pages` for every tally.

use crate::{PageRef, RegionId};
use fixedbitset::FixedBitSet;
use hashbrown::HashMap;
use std::collections::BTreeMap;

/// Which pages of a region an epoch found duplicated (or merged): a bit
/// per page (a `FixedBitSet` of exactly the region's pages).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DupMap(FixedBitSet);

impl DupMap {
    /// A map of `pages` pages, none of them duplicated.
    pub fn new(pages: u32) -> DupMap {
        DupMap(FixedBitSet::with_capacity(pages as usize))
    }

    /// Pages the map covers.
    pub fn pages(&self) -> u32 {
        self.0.len() as u32
    }

    /// Marks `page` duplicated; returns whether it was not yet. Pages past
    /// the end are ignored.
    pub fn set(&mut self, page: u32) -> bool {
        (page < self.pages()) && !self.0.put(page as usize)
    }

    /// Whether `page` is duplicated (false past the end).
    pub fn get(&self, page: u32) -> bool {
        self.0.contains(page as usize)
    }

    /// Duplicated pages in `[first, end)` (clipped to the map).
    pub fn count_in(&self, first: u32, end: u32) -> u64 {
        let end = end.min(self.pages());
        if first >= end {
            return 0;
        }
        self.0.count_ones(first as usize..end as usize) as u64
    }

    /// Duplicated pages in all.
    pub fn count(&self) -> u64 {
        self.0.count_ones(..) as u64
    }

    /// Pages set in both maps.
    fn common(&self, other: &DupMap) -> u32 {
        self.0.intersection_count(&other.0) as u32
    }
}

/// Shortest stretch without duplicates worth leaving out of a marked
/// region: 1 MiB, so that the VMA it costs (a VMA split on each side)
/// spares ksmd at least 256 page visits a full scan.
pub const UNIQUE_ZONE_MIN: u32 = 256;

/// Longest hole (pages not present) inside a unique zone: a longer one
/// ends it, since a page not present costs ksmd nothing now, and one
/// filled later with a duplicate is better marked.
pub const UNIQUE_HOLE_MAX: u32 = 64;

/// Most unique zones reported per region (the longest), bounding the VMA
/// splits that marking around them costs: at most twice this per region.
pub const UNIQUE_ZONES_MAX: usize = 8;

/// One region's tally.
#[derive(Clone, Debug, Default)]
struct Tally {
    present: u32,
    dups: u32,
    map: DupMap,
    /// Pages observed present and not merged.
    unmerged: DupMap,
}

impl Tally {
    fn set(&mut self, page: u32) {
        if self.map.set(page) {
            self.dups += 1;
        }
    }

    /// Duplicates observed unmerged: what ksmd could still merge.
    fn unmerged_dups(&self) -> u32 {
        self.map.common(&self.unmerged)
    }

    fn get(&self, page: u32) -> bool {
        self.map.get(page)
    }

    /// The unique zones (see the module header): maximal stretches that
    /// begin and end with a present page without twin, hold no duplicate
    /// and no hole longer than [`UNIQUE_HOLE_MAX`], and are at least
    /// [`UNIQUE_ZONE_MIN`] long; the [`UNIQUE_ZONES_MAX`] longest, sorted.
    fn unique_zones(&self) -> Vec<(u32, u32)> {
        let pages = self.map.pages();
        let mut zones: Vec<(u32, u32)> = Vec::new();
        // The current stretch: its first and last unique page.
        let mut stretch: Option<(u32, u32)> = None;
        let mut close = |stretch: &mut Option<(u32, u32)>| {
            if let Some((s, l)) = stretch.take()
                && l + 1 - s >= UNIQUE_ZONE_MIN
            {
                zones.push((s, l + 1));
            }
        };
        for p in 0..pages {
            if self.map.get(p) {
                close(&mut stretch);
            } else if self.unmerged.get(p) {
                stretch = match stretch {
                    Some((s, l)) if p - l - 1 <= UNIQUE_HOLE_MAX => Some((s, p)),
                    _ => {
                        close(&mut stretch);
                        Some((p, p))
                    }
                };
            }
        }
        close(&mut stretch);
        if zones.len() > UNIQUE_ZONES_MAX {
            zones.sort_by_key(|&(s, e)| (std::cmp::Reverse(e - s), s));
            zones.truncate(UNIQUE_ZONES_MAX);
            zones.sort_unstable();
        }
        zones
    }
}

/// What an epoch found in one region.
#[derive(Clone, Debug, PartialEq)]
pub struct RegionFinding {
    /// The region.
    pub region: RegionId,
    /// Present pages observed.
    pub present: u32,
    /// Of those, duplicates (or already merged).
    pub dups: u32,
    /// Runs `[first, end)` of duplicate pages, joined over gaps of up to
    /// the `gap` given to [`Sweep::finish`], at least `min_run` long.
    pub runs: Vec<(u32, u32)>,
    /// Every duplicate (or merged) page.
    pub map: DupMap,
    /// Of the duplicates, those observed present and not merged: what
    /// ksmd could still merge (all of them in a region never marked).
    pub unmerged_dups: u32,
    /// Its unique zones `[first, end)`, sorted: stretches holding present
    /// pages with no twin and no duplicate (see the module header).
    pub unique: Vec<(u32, u32)>,
}

impl RegionFinding {
    /// Duplicates over present pages (0 with none present).
    pub fn dup_ratio(&self) -> f64 {
        if self.present == 0 {
            0.0
        } else {
            f64::from(self.dups) / f64::from(self.present)
        }
    }
}

/// Pages a [`Fingerprint`] holds (fewer in a smaller region): a 512th of
/// the pages a 64 MiB region's walk reads, though read one by one rather
/// than in runs. pagesift's choice.
pub const FINGERPRINT_PAGES: u32 = 32;

/// How a walk saw one page of a [`Fingerprint`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Seen {
    /// Not present (or not reached: a walk that stopped early).
    #[default]
    Absent,
    /// Merged, or mapped to the zero page: not read.
    Merged,
    /// Present and unmerged, with this content hash.
    Content(u64),
}

/// A few pages spread evenly over a region, as its last walk saw them
/// (see the module header's *Fingerprints*).
///
/// Invariant: `probes` is strictly increasing, every probe is below
/// `pages`, and `seen` has one entry per probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    pages: u32,
    probes: Vec<u32>,
    seen: Vec<Seen>,
}

impl Fingerprint {
    /// The fingerprint of a region of `pages` pages, every probe
    /// [`Seen::Absent`] until [`Fingerprint::record`]ed: the middle page
    /// of each of [`FINGERPRINT_PAGES`] equal stretches.
    pub fn new(pages: u32) -> Fingerprint {
        let k = FINGERPRINT_PAGES.min(pages);
        let probes: Vec<u32> = (0..k)
            .map(|i| {
                let (a, b) = (
                    u64::from(i) * u64::from(pages) / u64::from(k),
                    u64::from(i + 1) * u64::from(pages) / u64::from(k),
                );
                ((a + b) / 2) as u32
            })
            .collect();
        Fingerprint {
            pages,
            seen: vec![Seen::Absent; probes.len()],
            probes,
        }
    }

    /// The region's length it was taken for.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// The probed pages, in order.
    pub fn probes(&self) -> &[u32] {
        &self.probes
    }

    /// Notes how the walk saw `page`, if it is a probe.
    pub fn record(&mut self, page: u32, seen: Seen) {
        if let Ok(i) = self.probes.binary_search(&page) {
            self.seen[i] = seen;
        }
    }

    /// Whether `now` (one entry per probe, in order) is what the walk
    /// saw, for a region still `pages` long.
    pub fn unchanged(&self, pages: u32, now: &[Seen]) -> bool {
        pages == self.pages && now == self.seen.as_slice()
    }
}

/// Content seen by earlier epochs: hash → where (a 32-bit digest of the
/// page's place, [`spot`]). See the module header's *Recall*.
///
/// Invariant: `recent.len() + older.len() <= 2 × half`, where `half` is
/// half the capacity given to [`Recall::new`]: `recent` takes an epoch's
/// hashes until it would pass `half`, then becomes `older` (the previous
/// `older` is dropped).
#[derive(Clone, Debug, Default)]
pub struct Recall {
    recent: HashMap<u64, u32>,
    older: HashMap<u64, u32>,
    half: usize,
}

impl Recall {
    /// A recall of at most `capacity` hashes (0: off).
    pub fn new(capacity: usize) -> Recall {
        Recall {
            half: capacity / 2,
            ..Recall::default()
        }
    }

    /// Hashes remembered.
    pub fn len(&self) -> usize {
        self.recent.len() + self.older.len()
    }

    /// Whether nothing is remembered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether an earlier epoch saw `hash` at another place than `page`.
    fn elsewhere(&self, hash: u64, page: PageRef) -> bool {
        let here = spot(page);
        (self.recent.get(&hash).or_else(|| self.older.get(&hash))).is_some_and(|&s| s != here)
    }

    /// Takes in one epoch's first places of its hashes.
    fn absorb(&mut self, first: &HashMap<u64, PageRef>) {
        if self.half == 0 {
            return;
        }
        if self.recent.len() + first.len() > self.half {
            self.older = std::mem::take(&mut self.recent);
        }
        for (&hash, &page) in first.iter().take(self.half) {
            self.recent.insert(hash, spot(page));
        }
    }
}

/// A 32-bit digest of a page's place: the recall only needs to tell "the
/// same page seen again" from "another page" (a collision makes a
/// duplicate look like the same page: one missed, nothing wrong marked).
fn spot(page: PageRef) -> u32 {
    let x = page
        .region
        .0
        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(u64::from(page.page));
    (x ^ (x >> 32)) as u32
}

/// One epoch of the exact sweep (see the module header).
#[derive(Clone, Debug, Default)]
pub struct Sweep {
    first: HashMap<u64, PageRef>,
    regions: BTreeMap<RegionId, Tally>,
    recall: Recall,
    /// Pages counted duplicated through the recall only.
    recalled: u64,
}

impl Sweep {
    /// An empty epoch.
    pub fn new() -> Sweep {
        Sweep::default()
    }

    /// An empty epoch that also finds twins in what earlier epochs saw.
    pub fn with_recall(recall: Recall) -> Sweep {
        Sweep {
            recall,
            ..Sweep::default()
        }
    }

    /// The recall, with this epoch's hashes taken in (call before
    /// [`Sweep::finish`]; the sweep keeps an empty one).
    pub fn take_recall(&mut self) -> Recall {
        let mut r = std::mem::take(&mut self.recall);
        r.absorb(&self.first);
        r
    }

    /// Regions observed so far.
    pub fn regions(&self) -> usize {
        self.regions.len()
    }

    /// Starts (or restarts) the tally of a region of `pages` pages.
    pub fn begin_region(&mut self, region: RegionId, pages: u32) {
        self.regions.insert(
            region,
            Tally {
                map: DupMap::new(pages),
                unmerged: DupMap::new(pages),
                ..Tally::default()
            },
        );
    }

    /// A present page with content hash `hash`. Ignored for a region not
    /// begun or a page beyond its end.
    pub fn observe(&mut self, page: PageRef, hash: u64) {
        // One lookup of the page's tally and one of its hash: at millions
        // of pages an epoch, this is most of the sweep's own CPU.
        let Some(t) = self.regions.get_mut(&page.region) else {
            return;
        };
        if page.page >= t.map.pages() {
            return;
        }
        t.present += 1;
        t.unmerged.set(page.page);
        let twin = match self.first.entry(hash) {
            hashbrown::hash_map::Entry::Vacant(v) => {
                v.insert(page);
                // Its twin may have been seen by an earlier epoch and be
                // merged now (not read, so not hashed in this one).
                if self.recall.elsewhere(hash, page) {
                    t.set(page.page);
                    self.recalled += 1;
                }
                return;
            }
            hashbrown::hash_map::Entry::Occupied(o) => *o.get(),
        };
        t.set(page.page);
        if twin.region == page.region {
            t.set(twin.page);
        } else if let Some(tt) = self.regions.get_mut(&twin.region) {
            tt.set(twin.page);
        }
    }

    /// Pages this epoch counted duplicated through the recall alone (a
    /// twin an earlier epoch saw elsewhere): new copies of remembered
    /// content.
    pub fn recalled(&self) -> u64 {
        self.recalled
    }

    /// A page already merged (a KSM page or a zero-page mapping).
    pub fn observe_merged(&mut self, page: PageRef) {
        if !self.counts(page) {
            return;
        }
        let t = self.regions.get_mut(&page.region).expect("counted");
        t.present += 1;
        t.set(page.page);
    }

    fn counts(&self, page: PageRef) -> bool {
        self.regions
            .get(&page.region)
            .is_some_and(|t| page.page < t.map.pages())
    }

    /// Ends the epoch: per region, its counts and its duplicate runs of at
    /// least `min_run` pages, joined over gaps of up to `gap` pages.
    pub fn finish(self, min_run: u32, gap: u32) -> Vec<RegionFinding> {
        self.regions
            .into_iter()
            .map(|(region, t)| {
                let mut runs: Vec<(u32, u32)> = Vec::new();
                let pages = t.map.pages();
                let mut p = 0;
                while p < pages {
                    if !t.get(p) {
                        p += 1;
                        continue;
                    }
                    let s = p;
                    while p < pages && t.get(p) {
                        p += 1;
                    }
                    match runs.last_mut() {
                        Some(last) if s - last.1 <= gap => last.1 = p,
                        _ => runs.push((s, p)),
                    }
                }
                runs.retain(|&(s, e)| e - s >= min_run.max(1));
                RegionFinding {
                    region,
                    present: t.present,
                    dups: t.dups,
                    runs,
                    unmerged_dups: t.unmerged_dups(),
                    unique: t.unique_zones(),
                    map: t.map,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(r: u64, p: u32) -> PageRef {
        PageRef {
            region: RegionId(r),
            page: p,
        }
    }

    #[test]
    fn a_fingerprint_spreads_its_probes_and_tells_a_change() {
        let mut f = Fingerprint::new(16_384);
        assert_eq!(f.probes().len(), FINGERPRINT_PAGES as usize);
        assert_eq!(f.probes()[0], 256);
        assert!(f.probes().windows(2).all(|w| w[1] - w[0] == 512));
        for (i, &p) in f.probes().to_vec().iter().enumerate() {
            f.record(p, Seen::Content(i as u64));
        }
        f.record(1, Seen::Merged); // not a probe: ignored
        let mut now: Vec<Seen> = (0..32).map(|i| Seen::Content(i as u64)).collect();
        assert!(f.unchanged(16_384, &now));
        assert!(
            !f.unchanged(16_385, &now),
            "another length is another region"
        );
        now[7] = Seen::Merged;
        assert!(!f.unchanged(16_384, &now));
        // A small region probes each page.
        let small = Fingerprint::new(5);
        assert_eq!(small.probes(), &[0, 1, 2, 3, 4]);
        assert!(small.unchanged(5, &[Seen::Absent; 5]));
        assert!(Fingerprint::new(0).probes().is_empty());
    }

    proptest! {
        #[test]
        fn fingerprint_probes_are_increasing_and_inside(pages in 0u32..5_000_000) {
            let f = Fingerprint::new(pages);
            prop_assert_eq!(f.probes().len() as u32, FINGERPRINT_PAGES.min(pages));
            prop_assert!(f.probes().windows(2).all(|w| w[0] < w[1]));
            prop_assert!(f.probes().iter().all(|&p| p < pages));
        }
    }

    #[test]
    fn pages_found_through_the_recall_alone_are_counted() {
        let mut s = Sweep::with_recall(Recall::new(100));
        s.begin_region(RegionId(1), 4);
        for p in 0..4 {
            s.observe(at(1, p), 10 + u64::from(p));
        }
        let recall = s.take_recall();
        assert_eq!(s.recalled(), 0);
        let mut s = Sweep::with_recall(recall);
        s.begin_region(RegionId(2), 4);
        // Two remembered contents, one new, and one twin within the epoch.
        for (p, h) in [(0, 10), (1, 11), (2, 99), (3, 99)] {
            s.observe(at(2, p), h);
        }
        assert_eq!(s.recalled(), 2);
        assert_eq!(s.finish(1, 0)[0].dups, 4);
    }

    #[test]
    fn twins_at_unrelated_offsets_are_both_duplicates() {
        let mut s = Sweep::new();
        s.begin_region(RegionId(1), 100);
        s.begin_region(RegionId(2), 100);
        for p in 0..100 {
            s.observe(at(1, p), 1000 + u64::from(p));
        }
        // Region 2 holds pages 10..40 of region 1 at offset 60, and
        // unique pages elsewhere.
        for p in 0..100 {
            let h = if (60..90).contains(&p) {
                1000 + u64::from(p) - 50
            } else {
                5000 + u64::from(p)
            };
            s.observe(at(2, p), h);
        }
        let f = s.finish(16, 0);
        assert_eq!(f[0].dups, 30);
        assert_eq!(f[0].runs, vec![(10, 40)]);
        assert_eq!(f[1].runs, vec![(60, 90)]);
        assert!((f[1].dup_ratio() - 0.3).abs() < 1e-9);
    }

    #[test]
    fn runs_join_over_small_gaps_and_short_runs_are_dropped() {
        let mut s = Sweep::new();
        s.begin_region(RegionId(1), 64);
        for p in [0, 1, 2, 5, 6, 7, 30, 31] {
            s.observe_merged(at(1, p));
        }
        let f = s.finish(4, 2);
        assert_eq!(f[0].runs, vec![(0, 8)]);
        assert_eq!(f[0].dups, 8);
        assert_eq!(f[0].present, 8);
    }

    #[test]
    fn pages_of_unknown_regions_or_past_the_end_are_ignored() {
        let mut s = Sweep::new();
        s.begin_region(RegionId(1), 10);
        s.observe(at(1, 10), 7);
        s.observe(at(9, 0), 7);
        s.observe(at(1, 3), 7);
        let f = s.finish(1, 0);
        assert_eq!((f[0].present, f[0].dups), (1, 0));
    }

    #[test]
    fn a_twin_an_earlier_epoch_saw_makes_a_duplicate_but_the_page_itself_does_not() {
        // Epoch 1: region 1 holds content 0..50, unmerged, no twin.
        let mut s = Sweep::with_recall(Recall::new(1000));
        s.begin_region(RegionId(1), 50);
        for p in 0..50 {
            s.observe(at(1, p), 7000 + u64::from(p));
        }
        let recall = s.take_recall();
        assert_eq!(s.finish(1, 0)[0].dups, 0);
        assert_eq!(recall.len(), 50);
        // Epoch 2: region 1's pages 0..20 are merged now (not read), the
        // rest unchanged; region 2 holds copies of pages 0..20 and 30..40.
        let mut s = Sweep::with_recall(recall);
        s.begin_region(RegionId(1), 50);
        s.begin_region(RegionId(2), 50);
        for p in 0..50 {
            if p < 20 {
                s.observe_merged(at(1, p));
            } else {
                s.observe(at(1, p), 7000 + u64::from(p));
            }
        }
        for p in 0..50 {
            let h = if p < 20 || (30..40).contains(&p) {
                7000 + u64::from(p)
            } else {
                9000 + u64::from(p)
            };
            s.observe(at(2, p), h);
        }
        let f = s.finish(1, 0);
        // Region 1: its merged pages, and 30..40 twinned in this epoch;
        // 20..30 and 40..50, seen again where they were, are no twins.
        assert_eq!(f[0].runs, vec![(0, 20), (30, 40)]);
        // Region 2: the copies of merged content count, through recall.
        assert_eq!(f[1].runs, vec![(0, 20), (30, 40)]);
        assert_eq!(f[1].unmerged_dups, 30);
    }

    #[test]
    fn the_recall_stays_within_its_capacity_and_keeps_the_newest() {
        let mut recall = Recall::new(100);
        for epoch in 0..10u64 {
            let mut s = Sweep::with_recall(recall);
            s.begin_region(RegionId(1), 40);
            for p in 0..40 {
                s.observe(at(1, p), epoch * 1000 + u64::from(p));
            }
            recall = s.take_recall();
            assert!(recall.len() <= 100, "{}", recall.len());
        }
        // The last epoch's content is remembered, the first's is not.
        let mut s = Sweep::with_recall(recall);
        s.begin_region(RegionId(2), 2);
        s.observe(at(2, 0), 9000);
        s.observe(at(2, 1), 5);
        let f = s.finish(1, 0);
        assert_eq!(f[0].runs, vec![(0, 1)]);
        // Off: nothing is remembered.
        let mut s = Sweep::with_recall(Recall::new(0));
        s.begin_region(RegionId(1), 4);
        s.observe(at(1, 0), 1);
        assert!(s.take_recall().is_empty());
    }

    /// Observes region 1 of `n` pages: `Some(h)` a present page of
    /// content `h`, `None` a hole; hashes from 1 000 on are unique.
    fn unique_of(pages: &[Option<u64>]) -> RegionFinding {
        let mut s = Sweep::new();
        s.begin_region(RegionId(1), pages.len() as u32);
        for (p, h) in pages.iter().enumerate() {
            if let Some(h) = h {
                s.observe(at(1, p as u32), *h);
            }
        }
        s.finish(16, 0).remove(0)
    }

    #[test]
    fn unique_zones_cover_stretches_without_duplicates() {
        // 0..100 duplicated (pairs), 100..700 unique with a 50-page hole
        // at 300 (kept inside) and a 100-page hole at 500 (ends the zone),
        // 700..800 duplicated, 800..1000 unique (too short).
        let mut pages: Vec<Option<u64>> = Vec::new();
        for p in 0..1000u64 {
            pages.push(match p {
                0..100 | 700..800 => Some(p % 50),
                300..350 | 500..600 => None,
                _ => Some(1000 + p),
            });
        }
        let f = unique_of(&pages);
        assert_eq!(f.unique, vec![(100, 500)]);
        // The 600..700 stretch is 100 pages: too short, as is 800..1000.
        assert!(f.unique.iter().all(|&(s, e)| e - s >= UNIQUE_ZONE_MIN));
    }

    #[test]
    fn a_merged_page_ends_a_unique_zone_and_zones_are_bounded() {
        let mut s = Sweep::new();
        let n = 300 * (UNIQUE_ZONES_MAX as u32 + 2);
        s.begin_region(RegionId(1), n);
        for p in 0..n {
            if p % 300 == 0 {
                s.observe_merged(at(1, p));
            } else {
                // Zones of 299 pages, the last ones a page shorter.
                let short = p / 300 >= UNIQUE_ZONES_MAX as u32 && p % 300 == 299;
                if !short {
                    s.observe(at(1, p), 10_000 + u64::from(p));
                }
            }
        }
        let f = s.finish(16, 0).remove(0);
        assert_eq!(f.unique.len(), UNIQUE_ZONES_MAX);
        assert_eq!(f.unique[0], (1, 300));
        assert!(
            f.unique.iter().all(|&(s, e)| e - s == 299),
            "{:?}",
            f.unique
        );
        assert!(f.unique.windows(2).all(|w| w[0].1 <= w[1].0));
    }

    proptest! {
        /// Unique zones hold no duplicate or merged page, begin and end
        /// with a present page, have no hole longer than the bound, are
        /// long enough, sorted, disjoint and bounded in number.
        #[test]
        fn unique_zones_hold_no_duplicate(
            pages in proptest::collection::vec(
                prop_oneof![
                    6 => (0u64..1_000_000).prop_map(Some),
                    1 => (0u64..5).prop_map(Some),
                    2 => Just(None),
                ],
                0..3000,
            ),
        ) {
            let f = unique_of(&pages);
            let mut count = std::collections::HashMap::new();
            for h in pages.iter().flatten() {
                *count.entry(*h).or_insert(0) += 1;
            }
            prop_assert!(f.unique.len() <= UNIQUE_ZONES_MAX);
            prop_assert!(f.unique.windows(2).all(|w| w[0].1 < w[1].0));
            for &(s, e) in &f.unique {
                prop_assert!(e - s >= UNIQUE_ZONE_MIN);
                prop_assert!(pages[s as usize].is_some() && pages[e as usize - 1].is_some());
                let mut hole = 0;
                for p in s..e {
                    match pages[p as usize] {
                        Some(h) => {
                            prop_assert_eq!(count[&h], 1, "page {} is a duplicate", p);
                            hole = 0;
                        }
                        None => {
                            hole += 1;
                            prop_assert!(hole <= UNIQUE_HOLE_MAX);
                        }
                    }
                }
            }
        }
    }

    proptest! {
        /// `count_in` counts exactly the set pages of any range, clipped.
        #[test]
        fn count_in_counts_the_set_pages(
            pages in 0u32..400,
            set in proptest::collection::vec(0u32..420, 0..120),
            first in 0u32..420,
            len in 0u32..420,
        ) {
            let mut m = DupMap::new(pages);
            for &p in &set {
                m.set(p);
            }
            let end = first.saturating_add(len);
            let want = (first..end.min(pages)).filter(|&p| set.contains(&p)).count() as u64;
            prop_assert_eq!(m.count_in(first, end), want);
            prop_assert!(m.count() <= u64::from(pages));
        }

        /// A page is a duplicate iff some other observed page has its hash
        /// (or it is merged), and the counts agree with the runs.
        #[test]
        fn duplicates_are_exactly_the_shared_hashes(
            hashes in proptest::collection::vec(proptest::option::of(0u64..20), 1..200),
            merged in proptest::collection::vec(any::<bool>(), 200),
        ) {
            let n = hashes.len() as u32;
            let mut s = Sweep::new();
            s.begin_region(RegionId(1), n);
            let mut count = std::collections::HashMap::new();
            for (p, h) in hashes.iter().enumerate() {
                match h {
                    Some(h) if !merged[p] => {
                        s.observe(at(1, p as u32), *h);
                        *count.entry(*h).or_insert(0) += 1;
                    }
                    Some(_) => s.observe_merged(at(1, p as u32)),
                    None => {}
                }
            }
            let want: Vec<bool> = hashes.iter().enumerate().map(|(p, h)| match h {
                Some(_) if merged[p] => true,
                Some(h) => count[h] > 1,
                None => false,
            }).collect();
            let f = s.finish(1, 0);
            let mut got = vec![false; n as usize];
            for &(a, b) in &f[0].runs {
                for p in a..b { got[p as usize] = true; }
            }
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(f[0].dups as usize, want.iter().filter(|&&d| d).count());
            for (p, &w) in want.iter().enumerate() {
                prop_assert_eq!(f[0].map.get(p as u32), w);
            }
            prop_assert_eq!(f[0].map.count(), u64::from(f[0].dups));
            let unmerged = hashes.iter().enumerate()
                .filter(|&(p, h)| matches!(h, Some(h) if !merged[p] && count[h] > 1))
                .count();
            prop_assert_eq!(f[0].unmerged_dups as usize, unmerged);
            prop_assert_eq!(f[0].present as usize, hashes.iter().filter(|h| h.is_some()).count());
        }
    }
}
