//! The ladder: hierarchical region distilling (UKSM §5.1-5.3; released
//! code's `scan_rung`, `judge_slot` and `cal_dedup_ratio` in `uksm.c`).
//!
//! ## The algorithm
//!
//! Regions sit on N levels (4 by default, §7); a new region enters the
//! bottom. Every region is on exactly one level. A region may be *parked*
//! on its level ([`Ladder::park`]): still a member, but holding no pages
//! of the level's flat space, so rounds neither sample nor judge it until
//! [`Ladder::readmit`]. The caller parks a region whose fate is decided
//! elsewhere for a while (the exact sweep raised it, and a write watch is
//! to judge it before it is marked).
//!
//! **A level round.** A level is sampled as one flat, linear space made of
//! its regions' pages laid end to end (§5.3). A round starts at a random
//! offset in `0..interval` and puts a sample point every `interval` pages
//! until it passes the end of the space. A point that falls in a region
//! samples *one page of that region*, but not the page under the point:
//! the next page of the region's own offset permutation. So a region gets
//! about `pages / interval` samples per round, successive rounds pick
//! different pages, and every page of a region that lives long enough is
//! visited once per pass (§5.3, Figure 2). The caller sets each level's
//! interval from its governor ([`crate::pipeline::governor::sampling_interval`]):
//! higher levels get more CPU and so smaller intervals.
//!
//! **Clusters.** With `cluster_pages = k` above 1 (pagesift's addition; 1
//! is UKSM's page-by-page walk), a sample point takes a *cluster*: the `k`
//! consecutive pages starting at a multiple of `k` (fewer at the region's
//! end), and the region's permutation is a permutation of its clusters.
//! Every page of a cluster counts as sampled and is judged like any other
//! sample, so the duplication ratio stays a ratio of pages. Why: from user
//! space a scattered page costs a page-table walk and a pinned read of its
//! own, which is most of the cost of sampling it, and its neighbours share
//! both (docs/sampling-cost.md). Pages of a cluster are correlated (copies
//! come in runs), so a cluster carries less news than `k` scattered pages,
//! but more pages are hashed per CPU-second, and every hashed page can meet
//! its twin. The caller sets the interval from the cost of a whole point;
//! an interval below `k` is raised to `k`, so a round never samples a page
//! twice.
//!
//! **Coordinated sampling.** Permutations are not drawn per region but
//! per *epoch* and region size: in one epoch every region of `n` pages
//! walks the same permutation of `0..n`, from its head (a region that
//! joins or is resized mid-epoch starts at the head too). The distiller
//! starts a new epoch with every global round, when it empties its
//! unstable set ([`Ladder::new_epoch`]). Why: duplicates between
//! processes very often sit at the same offset of equally sized regions
//! (a file read into a buffer of its size by each worker, the same
//! kernel image at the same guest-physical address of each guest's RAM).
//! With independent permutations, two such regions sampled `k` times in
//! a round of `n`-page regions meet at the same offset only about
//! `k²/n` times, so at a bottom-level density (`k/n` ≈ 1/250) a region
//! whose every page has a twin looked 99 % unique and never climbed
//! (measured 2026-11-24 on the 2-core development machine: six python3
//! workers sharing a 48 MiB file stayed on the bottom level through a
//! 40 s run; coordinated, they climbed within 2 s). Coordinated, the first `k` offsets of the
//! epoch's permutation are the same in both, so every sample of the
//! later one finds its twin in the unstable set, and since a level with
//! a smaller interval only takes a longer prefix, regions on different
//! levels still share their samples. Within an epoch a region's samples
//! are still a pass of distinct pages; across epochs they are fresh
//! draws.
//!
//! **Judgement.** When a level's round ends, every region sampled in that
//! round is judged on the samples of the round (§5.2, code `judge_slot`):
//! - all of its sampled pages were already merged → back to the bottom
//!   (there is nothing left to find; the bottom keeps an eye on it);
//! - younger than V_life, or joined the level after its round began → no
//!   verdict: it stays, and the next round (a whole one) judges it;
//! - duplication ratio ≥ V_dup (and > 0) → climb one level (capped at the
//!   top);
//! - otherwise → drop one level (floored at the bottom).
//!
//! **Early decisions** (`LadderConfig::early_decision`, on by default; not
//! in UKSM). A level samples its regions at one density, so a region whose
//! verdict is plain after a few dozen samples (a guest's kernel text, all
//! duplicates; a heap of distinct objects, none) costs as many samples as
//! one near V_dup. Once a region's round holds at least
//! [`EARLY_MIN_SAMPLES`] outcomes, none merged or COW-broken, and the 99 %
//! Wilson interval of its duplicate share lies wholly above or below V_dup
//! ([`SampleCounts::decided`]), the rest of its round is skipped: the
//! cursor moves past it in step with the interval. The walk then ends
//! sooner, but the caller keeps the round's time: it judges the round and
//! starts the next one when the round time is up (at once if it is up by
//! the next wake-up), so verdicts come at UKSM's pace and the samples
//! saved are CPU saved (the upper levels, with 23.75 % and 95 % of a core
//! under Full, are where it counts). A skipped region is judged on the samples it
//! had; the chance that more would have flipped its verdict is the
//! interval's 1 % tail.
//!
//! The duplication ratio follows the code (`cal_dedup_ratio`): duplicates net
//! of COW breaks, over the pages sampled; when COW breaks exceed V_cow of
//! the duplicates, the region is thrashing and its ratio counts as 0.
//!
//! ## Data structures
//!
//! - A region's permutation is not stored: [`OffsetPermutation`] computes a
//!   seeded bijection of `0..n` on the fly (a small Feistel network over
//!   the next power of two, with cycle-walking), seeded from the epoch,
//!   the region's size and the pass within the epoch.
//! - Each level keeps its members in the order they joined, with a
//!   Fenwick (binary indexed) tree over their page counts, the role of
//!   UKSM's sum tree over a rung's slots: the region holding the k-th page of the
//!   level, a member's first page, joining, leaving and resizing are all
//!   O(log n), so a level of thousands of regions costs no more per sample
//!   than a level of ten. A member that leaves becomes a zero-page
//!   tombstone; tombstones are swept out once they outnumber the members.
//! - The round cursor is stored relative to a region (its join number and
//!   an offset from its first page), not as an absolute offset: regions
//!   that join a level are appended at its end, ahead of the cursor, and
//!   when the cursor's own region leaves, the cursor is re-anchored on the
//!   next region at the same place in the flat space (or at its first
//!   page if the cursor was still inside the leaver). Membership changes
//!   mid-round therefore never make the cursor skip or repeat another
//!   region's pages. A region that joined after the round began is
//!   passed over until the next round, whose samples can judge it.
//!
//! ## Driving it
//!
//! Per level: [`Ladder::set_interval`] (from the governor), then
//! [`Ladder::start_round`]; take up to the wake-up's page budget with
//! [`Ladder::next_sample`], report each outcome with [`Ladder::record`];
//! when `next_sample` returns `None` the round is over:
//! [`Ladder::end_round`] judges and returns the [`Move`]s, and the next
//! `start_round` begins a new round from a new random offset.
//!
//! ## Decided on purpose (differences from the released code)
//!
//! - Passes: every pass is a fresh, exact permutation. The code meant the
//!   same, but its re-randomisation runs on a pool of entries that can
//!   lose or repeat addresses; a computed bijection cannot.
//! - Age: the code never uses a region's age; pagesift applies
//!   the paper's V_life (100 ms) to climbing.
//! - A region that completes a permutation pass is *not* sent back to the
//!   bottom (the code does, through `thrash_threshold != 0`):
//!   that bounced small, hot regions off the top every round. The
//!   all-merged rule covers the case the code had in mind.
//! - The code's second promotion path (`round_update_ladder`, promoting
//!   regions that *others* merged against) is left to the caller:
//!   it can be approximated by recording a duplicate sample
//!   ([`Ladder::record`]) on the partner region's matching page.
//! - Resizing keeps a region's level and counters and restarts its
//!   permutation pass; the code throws the slot away and re-enters it at
//!   the bottom. A caller that wants the code's behaviour removes and
//!   re-inserts.
//! - The climb threshold is "at or above V_dup" as in the code and its
//!   sysfs documentation (the paper says "above"); the COW cut-off is
//!   "COW breaks over duplicates above V_cow", as in the code.

use crate::{Nanos, PageRef, RegionId};
use hashbrown::HashMap;
use rand::{Rng, RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Nanoseconds in a millisecond.
const MS: Nanos = 1_000_000;

/// Most levels a ladder may have. The paper tried 2 to 5 (§7); more than a
/// handful only slows promotion down.
pub const MAX_LEVELS: usize = 16;

/// Thresholds and height of the ladder (UKSM Table 1, §5.2).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LadderConfig {
    /// Number of levels (§7: 4 by default).
    pub levels: usize,
    /// V_dup: duplication ratio (fraction) a region needs to climb (§5.2:
    /// 10 %; code `abundant_threshold = 10`).
    pub v_dup: f64,
    /// V_cow: COW-broken ratio (fraction of duplicates) above which a
    /// region's duplication ratio counts as 0 (§5.2: 50 %; code
    /// `thrash_threshold = 50`).
    pub v_cow: f64,
    /// V_life: minimum age for a region to climb (§5.2: 100 ms).
    pub v_life: Nanos,
    /// Pages per sample: each sample point takes a *cluster* of this many
    /// consecutive pages (fewer at a region's end), see "Clusters" in the
    /// module header. 1 is UKSM's page-by-page sampling.
    #[serde(default = "one")]
    pub cluster_pages: u32,
    /// Stop sampling a region for the rest of a round once its verdict is
    /// certain; the round still lasts its round time (see "Early
    /// decisions" in the module header). Off: UKSM's fixed density.
    #[serde(default = "yes")]
    pub early_decision: bool,
}

fn one() -> u32 {
    1
}

fn yes() -> bool {
    true
}

/// Most pages a cluster may hold.
pub const MAX_CLUSTER_PAGES: u32 = 16;

impl Default for LadderConfig {
    fn default() -> Self {
        LadderConfig {
            levels: 4,
            v_dup: 0.10,
            v_cow: 0.50,
            v_life: 100 * MS,
            cluster_pages: 1,
            early_decision: true,
        }
    }
}

impl LadderConfig {
    /// Checks every field; the error names the field and the reason.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=MAX_LEVELS).contains(&self.levels) {
            return Err(format!(
                "levels: must be between 1 and {MAX_LEVELS}, got {}",
                self.levels
            ));
        }
        if !(1..=MAX_CLUSTER_PAGES).contains(&self.cluster_pages) {
            return Err(format!(
                "cluster_pages: must be between 1 and {MAX_CLUSTER_PAGES}, got {}",
                self.cluster_pages
            ));
        }
        for (name, v) in [("v_dup", self.v_dup), ("v_cow", self.v_cow)] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!(
                    "{name}: must be a fraction between 0 and 1 (0.1 = 10 %), got {v}"
                ));
            }
        }
        Ok(())
    }
}

/// What the caller learned about one sampled page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sample {
    /// The page is a duplicate of another page and was not merged yet: a
    /// new merge (the code's `pages_merged`).
    pub duplicate: bool,
    /// The page was already merged when sampled.
    pub merged: bool,
    /// The page was seen merged or duplicate before and has been written
    /// since (a COW break, the code's `pages_cowed`).
    pub cow_broken: bool,
}

/// A level change decided at the end of a level round. `to` is the new
/// level; regions that do not change level are reported as `Stay`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Move {
    /// Rich in duplicates, not thrashing, old enough: one level up.
    Climb { region: RegionId, to: usize },
    /// Not (or no longer) worth its level: one level down.
    Drop { region: RegionId, to: usize },
    /// Every sampled page was already merged: back to the bottom.
    Bottom { region: RegionId },
    /// Judged, but already at the top (climb) or bottom (drop).
    Stay { region: RegionId },
}

impl Move {
    /// The region the move is about.
    pub fn region(&self) -> RegionId {
        match *self {
            Move::Climb { region, .. }
            | Move::Drop { region, .. }
            | Move::Bottom { region }
            | Move::Stay { region } => region,
        }
    }
}

/// Sample outcome counters, per round or over a region's life.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SampleCounts {
    /// Pages handed out by [`Ladder::next_sample`].
    pub sampled: u64,
    /// Outcomes reported through [`Ladder::record`].
    pub recorded: u64,
    /// Of those, duplicates (new merges).
    pub duplicates: u64,
    /// Of those, pages already merged.
    pub merged: u64,
    /// Of those, COW breaks.
    pub cow_broken: u64,
}

impl SampleCounts {
    fn add(&mut self, s: Sample) {
        self.recorded += 1;
        self.duplicates += u64::from(s.duplicate);
        self.merged += u64::from(s.merged);
        self.cow_broken += u64::from(s.cow_broken);
    }

    /// Pages the ratios are taken over: the samples handed out, or the
    /// outcomes recorded if the caller recorded more (pages it sampled
    /// itself, e.g. hints), so a ratio never exceeds 1.
    pub fn denominator(&self) -> u64 {
        self.sampled.max(self.recorded)
    }

    /// COW breaks per duplicate (the code's `pages_cowed / pages_merged`);
    /// 0 without duplicates.
    pub fn cow_ratio(&self) -> f64 {
        if self.duplicates == 0 {
            0.0
        } else {
            self.cow_broken as f64 / self.duplicates as f64
        }
    }

    /// The duplication ratio (code `cal_dedup_ratio`):
    /// `(duplicates - cow_broken) / sampled`, or 0 when there were no
    /// duplicates or the COW ratio exceeds `v_cow`.
    pub fn dup_ratio(&self, v_cow: f64) -> f64 {
        let denom = self.denominator();
        if denom == 0 || self.duplicates == 0 || self.cow_ratio() > v_cow {
            return 0.0;
        }
        self.duplicates.saturating_sub(self.cow_broken) as f64 / denom as f64
    }

    /// Every sample of the round was of an already merged page.
    pub fn all_merged(&self) -> bool {
        self.merged > 0 && self.merged >= self.denominator()
    }

    /// Whether more samples this round could not change the region's
    /// verdict, but with a chance of [`EARLY_Z`]'s tail: at least
    /// [`EARLY_MIN_SAMPLES`] recorded, no COW break and no merged page
    /// among them (those verdicts weigh other counts), and the Wilson
    /// score interval of the duplicate share entirely above or below
    /// `v_dup`. See "Early decisions" in the module header.
    pub fn decided(&self, v_dup: f64) -> bool {
        let n = self.recorded;
        if n < EARLY_MIN_SAMPLES || self.cow_broken > 0 || self.merged > 0 {
            return false;
        }
        let (n, p) = (n as f64, self.duplicates as f64 / n as f64);
        let z2 = EARLY_Z * EARLY_Z;
        let centre = (p + z2 / (2.0 * n)) / (1.0 + z2 / n);
        let half = EARLY_Z * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / (1.0 + z2 / n);
        centre - half > v_dup || centre + half < v_dup
    }
}

/// Fewest samples of a region in a round before its verdict may be taken
/// early.
pub const EARLY_MIN_SAMPLES: u64 = 32;

/// z of the Wilson interval of an early decision: 2.58, a two-sided 99 %
/// interval. With 32 duplicates in 32 samples the share is above 0.83;
/// with none in 64 below 0.094, so an all-unique region is let go after
/// about 70 samples.
pub const EARLY_Z: f64 = 2.58;

/// A region as the ladder sees it ([`Ladder::region_stats`]).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RegionStats {
    /// Current level (0 = bottom).
    pub level: usize,
    /// Length in pages.
    pub pages: u32,
    /// When the region was inserted (caller's clock).
    pub inserted_at: Nanos,
    /// Counters of the round in progress (since the last judgement).
    pub round: SampleCounts,
    /// Counters over the region's life.
    pub total: SampleCounts,
    /// Times the region was judged.
    pub judged: u64,
    /// Duplication ratio at the last judgement (0 before the first).
    pub last_dup_ratio: f64,
    /// Completed permutation passes: every page visited this many times.
    pub passes: u64,
    /// Pages visited in the current pass.
    pub pass_progress: u32,
}

impl RegionStats {
    /// Age of the region at `now`.
    pub fn age(&self, now: Nanos) -> Nanos {
        now.saturating_sub(self.inserted_at)
    }
}

/// Rounds of the Feistel network. Any number gives a bijection; six mix
/// small domains well enough that consecutive passes look unrelated.
const FEISTEL_ROUNDS: usize = 6;

/// SplitMix64's finaliser: a cheap, well-mixing 64-bit function.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A seeded pseudo-random permutation of `0..n`, computed on the fly in
/// O(1) memory (so a region of GiBs needs no per-page array).
///
/// The domain is rounded up to `2^b ≥ n` and split into a high and a low
/// half; each Feistel round xors one half with a keyed hash of the other,
/// which is its own inverse, so the whole network is a bijection of
/// `0..2^b`. Values `≥ n` are walked along their cycle until they land in
/// `0..n` ("cycle-walking"), which keeps the result a bijection of `0..n`;
/// since `2^b < 2n` this takes fewer than two steps on average.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OffsetPermutation {
    n: u32,
    lo_bits: u32,
    hi_bits: u32,
    keys: [u64; FEISTEL_ROUNDS],
}

impl OffsetPermutation {
    /// The permutation of `0..n` drawn from `seed`.
    pub fn new(n: u32, seed: u64) -> Self {
        let bits = if n <= 1 {
            0
        } else {
            u32::BITS - (n - 1).leading_zeros()
        };
        let lo_bits = bits.div_ceil(2);
        let mut keys = [0u64; FEISTEL_ROUNDS];
        for (r, k) in keys.iter_mut().enumerate() {
            *k = mix64(seed ^ mix64(r as u64 + 1));
        }
        OffsetPermutation {
            n,
            lo_bits,
            hi_bits: bits - lo_bits,
            keys,
        }
    }

    /// Size of the permuted range.
    pub fn len(&self) -> u32 {
        self.n
    }

    /// Whether the range is empty.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    fn round_trip(&self, x: u64) -> u64 {
        let lo_mask = (1u64 << self.lo_bits) - 1;
        let hi_mask = (1u64 << self.hi_bits) - 1;
        let (mut hi, mut lo) = (x >> self.lo_bits, x & lo_mask);
        for (r, &k) in self.keys.iter().enumerate() {
            if r % 2 == 0 {
                lo ^= mix64(k ^ hi) & lo_mask;
            } else {
                hi ^= mix64(k ^ lo) & hi_mask;
            }
        }
        (hi << self.lo_bits) | lo
    }

    /// The `i`-th element of the permutation.
    ///
    /// # Panics
    /// If `i >= len()`.
    pub fn get(&self, i: u32) -> u32 {
        assert!(i < self.n, "permutation index {i} out of 0..{}", self.n);
        let mut x = u64::from(i);
        loop {
            x = self.round_trip(x);
            if x < u64::from(self.n) {
                return x as u32;
            }
        }
    }
}

/// A region on the ladder.
#[derive(Clone, Debug)]
struct Region {
    /// The sampling epoch its permutation belongs to (see
    /// [`Ladder::new_epoch`]).
    epoch: u64,
    level: usize,
    /// Join number within its level: position in the level's flat space.
    seq: u64,
    pages: u32,
    inserted_at: Nanos,
    /// Its level's `rounds_started` when it joined: it may climb only after
    /// a round that started after that.
    joined_round: u64,
    perm: OffsetPermutation,
    pass_pos: u32,
    passes: u64,
    /// Passes completed within the current epoch.
    epoch_passes: u64,
    round: SampleCounts,
    total: SampleCounts,
    /// On its level's list of regions to judge at the round's end.
    listed: bool,
    judged: u64,
    last_dup_ratio: f64,
    /// Parked ([`Ladder::park`]): a member of its level with no pages in
    /// the level's flat space, so it is never sampled nor judged.
    parked: bool,
}

impl Region {
    /// Its pages in its level's flat space: none while parked.
    fn space_pages(&self) -> u32 {
        if self.parked { 0 } else { self.pages }
    }

    /// The first page of the next cluster of the region's permutation
    /// (clusters of `k` pages). In a new epoch the walk restarts at the
    /// head of that epoch's coordinated permutation; a pass completed
    /// within an epoch is followed by the next one.
    fn next_page(&mut self, epoch: &Epoch, k: u32) -> u32 {
        debug_assert!(self.pages > 0);
        let clusters = self.pages.div_ceil(k);
        if self.epoch != epoch.number {
            self.epoch = epoch.number;
            self.pass_pos = 0;
            self.epoch_passes = 0;
            self.perm = epoch.permutation(clusters, 0);
        }
        let page = self.perm.get(self.pass_pos) * k;
        self.pass_pos += 1;
        if self.pass_pos == clusters {
            self.pass_pos = 0;
            self.passes += 1;
            self.epoch_passes += 1;
            self.perm = epoch.permutation(clusters, self.epoch_passes);
        }
        page
    }
}

/// Where the next sample point of a round is: `offset` pages past the
/// first page of the first member whose join number is `>= seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Cursor {
    seq: u64,
    offset: u64,
}

/// One member slot of a level's flat space.
#[derive(Clone, Copy, Debug)]
struct Slot {
    seq: u64,
    id: RegionId,
    /// 0 for a tombstone.
    pages: u64,
    live: bool,
}

/// A level's flat space: members in join order (strictly increasing join
/// numbers) and a Fenwick tree of their page counts.
#[derive(Clone, Debug, Default)]
struct FlatSpace {
    slots: Vec<Slot>,
    /// Fenwick tree, 1-based node `k` stored at `tree[k - 1]`: the sum of
    /// slots `k - lowbit(k) .. k` (0-based, half-open). Arithmetic wraps:
    /// the true sums are never negative, so wrapped deltas cancel exactly.
    tree: Vec<u64>,
    total: u64,
    live: usize,
}

fn lowbit(k: usize) -> usize {
    k & k.wrapping_neg()
}

impl FlatSpace {
    /// Pages of slots `0..n`.
    fn prefix(&self, n: usize) -> u64 {
        let (mut k, mut sum) = (n, 0u64);
        while k > 0 {
            sum = sum.wrapping_add(self.tree[k - 1]);
            k &= k - 1;
        }
        sum
    }

    fn add(&mut self, i: usize, delta: u64) {
        let mut k = i + 1;
        while k <= self.tree.len() {
            self.tree[k - 1] = self.tree[k - 1].wrapping_add(delta);
            k += lowbit(k);
        }
    }

    /// Appends a member; `seq` must exceed every join number present.
    fn push(&mut self, seq: u64, id: RegionId, pages: u64) {
        debug_assert!(self.slots.last().is_none_or(|s| s.seq < seq));
        let i = self.slots.len();
        let k = i + 1;
        // Node k covers slots k - lowbit(k) .. k: the new one and the
        // lowbit(k) - 1 before it.
        let node = pages
            .wrapping_add(self.prefix(i))
            .wrapping_sub(self.prefix(k - lowbit(k)));
        self.slots.push(Slot {
            seq,
            id,
            pages,
            live: true,
        });
        self.tree.push(node);
        self.total += pages;
        self.live += 1;
    }

    /// Index of the member with join number `seq`.
    fn index_of(&self, seq: u64) -> Option<usize> {
        self.slots.binary_search_by_key(&seq, |s| s.seq).ok()
    }

    fn set_pages(&mut self, i: usize, pages: u64) {
        let old = self.slots[i].pages;
        self.slots[i].pages = pages;
        self.add(i, pages.wrapping_sub(old));
        self.total = self.total - old + pages;
    }

    /// Turns member `i` into a tombstone; sweeps tombstones out when they
    /// outnumber the members (join numbers, and so cursors, are kept).
    fn kill(&mut self, i: usize) {
        self.set_pages(i, 0);
        self.slots[i].live = false;
        self.live -= 1;
        let dead = self.slots.len() - self.live;
        if dead > self.live.max(32) {
            self.slots.retain(|s| s.live);
            self.tree = self.slots.iter().map(|s| s.pages).collect();
            let n = self.tree.len();
            for k in 1..=n {
                let parent = k + lowbit(k);
                if parent <= n {
                    self.tree[parent - 1] = self.tree[parent - 1].wrapping_add(self.tree[k - 1]);
                }
            }
        }
    }

    /// Absolute offset of `c`: `c.offset` past the first page of the first
    /// slot whose join number is `>= c.seq`.
    fn position(&self, c: Cursor) -> u64 {
        let i = self.slots.partition_point(|s| s.seq < c.seq);
        if i == self.slots.len() {
            self.total
        } else {
            self.prefix(i).saturating_add(c.offset)
        }
    }

    /// The slot holding page `pos` (`pos < total`) and that slot's first
    /// page. Zero-page slots and tombstones hold no page and are skipped.
    fn find(&self, pos: u64) -> (usize, u64) {
        debug_assert!(pos < self.total);
        let n = self.tree.len();
        let (mut k, mut before) = (0usize, 0u64);
        let mut step = if n == 0 { 0 } else { 1 << n.ilog2() };
        while step > 0 {
            let next = k + step;
            if next <= n && before.wrapping_add(self.tree[next - 1]) <= pos {
                k = next;
                before = before.wrapping_add(self.tree[next - 1]);
            }
            step >>= 1;
        }
        (k, before)
    }

    fn members(&self) -> impl Iterator<Item = RegionId> + '_ {
        self.slots.iter().filter(|s| s.live).map(|s| s.id)
    }
}

#[derive(Clone, Debug)]
struct Level {
    space: FlatSpace,
    interval: u64,
    /// `None`: no round in progress.
    cursor: Option<Cursor>,
    /// Regions sampled (or recorded) since the last judgement.
    to_judge: Vec<RegionId>,
    /// Rounds started on this level so far.
    rounds_started: u64,
}

impl Level {
    /// An empty level whose interval is one cluster of `k` pages.
    fn new(k: u32) -> Self {
        Level {
            space: FlatSpace::default(),
            interval: u64::from(k),
            cursor: None,
            to_judge: Vec::new(),
            rounds_started: 0,
        }
    }
}

/// The hierarchy of levels regions climb and drop on. See the module
/// header for the algorithm.
///
/// Level indices passed to the methods must be `< levels()`; a larger one
/// is a programming error and panics.
#[derive(Clone, Debug)]
pub struct Ladder {
    config: LadderConfig,
    levels: Vec<Level>,
    regions: HashMap<RegionId, Region>,
    next_seq: u64,
    rng: ChaCha8Rng,
    epoch: Epoch,
}

/// A sampling epoch: every region of `n` pages walks the same
/// permutation of `0..n` in it, from its head (see the module header,
/// "Coordinated sampling").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Epoch {
    number: u64,
    seed: u64,
}

impl Epoch {
    /// The permutation of `0..pages` (of a region's pages, or of its
    /// clusters) for the `pass`-th pass within this epoch, the same for
    /// every region of that size.
    fn permutation(&self, pages: u32, pass: u64) -> OffsetPermutation {
        OffsetPermutation::new(
            pages,
            mix64(self.seed ^ mix64(u64::from(pages) ^ mix64(pass.wrapping_add(1)))),
        )
    }
}

impl Ladder {
    /// An empty ladder; `seed` fixes every random choice (start offsets
    /// and permutations), so a run can be replayed.
    ///
    /// # Panics
    /// If `config.validate()` fails; validate configs from users first.
    pub fn new(config: LadderConfig, seed: u64) -> Self {
        if let Err(e) = config.validate() {
            panic!("invalid ladder config: {e}");
        }
        Ladder {
            levels: (0..config.levels)
                .map(|_| Level::new(config.cluster_pages))
                .collect(),
            config,
            regions: HashMap::new(),
            // Join numbers start at 1 so that 0 means "before every member".
            next_seq: 1,
            rng: ChaCha8Rng::seed_from_u64(seed),
            epoch: Epoch {
                number: 0,
                seed: mix64(seed ^ 0x5eed_e90c),
            },
        }
    }

    /// Starts a new sampling epoch (the distiller calls it at every global
    /// round, when its unstable set is emptied): from now on every region
    /// walks a freshly seeded permutation shared by all regions of its
    /// size, from its head.
    pub fn new_epoch(&mut self) {
        self.epoch = Epoch {
            number: self.epoch.number + 1,
            seed: self.rng.next_u64(),
        };
    }

    /// The number of the current sampling epoch (0 before the first
    /// [`Ladder::new_epoch`]).
    pub fn epoch(&self) -> u64 {
        self.epoch.number
    }

    /// The configuration the ladder was built with.
    pub fn config(&self) -> &LadderConfig {
        &self.config
    }

    /// Number of levels.
    pub fn levels(&self) -> usize {
        self.levels.len()
    }

    /// Number of regions on the ladder.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether the ladder holds no region.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Whether `id` is on the ladder.
    pub fn contains(&self, id: RegionId) -> bool {
        self.regions.contains_key(&id)
    }

    fn level_mut(&mut self, level: usize) -> &mut Level {
        let n = self.levels.len();
        self.levels
            .get_mut(level)
            .unwrap_or_else(|| panic!("level {level} out of 0..{n}"))
    }

    fn level_ref(&self, level: usize) -> &Level {
        self.levels
            .get(level)
            .unwrap_or_else(|| panic!("level {level} out of 0..{}", self.levels.len()))
    }

    /// Appends `id` to `level`'s flat space, at its end: a round under way
    /// passes over it (see `next_sample`), and the cursor of that round
    /// keeps its place.
    fn attach(&mut self, id: RegionId, level: usize) {
        let seq = self.next_seq;
        self.next_seq += 1;
        let r = self.regions.get_mut(&id).expect("attach: region exists");
        r.level = level;
        r.seq = seq;
        r.joined_round = self.levels[level].rounds_started;
        let pages = u64::from(r.space_pages());
        self.levels[level].space.push(seq, id, pages);
    }

    /// Takes the member with join number `seq` out of `level`. A cursor
    /// anchored on it is re-anchored on its successor: at the same place
    /// in the flat space if the cursor was already past the member, else
    /// at the successor's first page.
    fn detach(&mut self, level: usize, seq: u64, pages: u32) {
        let lvl = &mut self.levels[level];
        let i = lvl.space.index_of(seq).expect("detach: member exists");
        lvl.space.kill(i);
        if let Some(c) = &mut lvl.cursor
            && c.seq == seq
        {
            *c = Cursor {
                seq: seq + 1,
                offset: c.offset.saturating_sub(u64::from(pages)),
            };
        }
    }

    /// Adds a region of `pages` pages at the bottom level, born at `now`.
    /// Inserting an id that is already present replaces that region.
    pub fn insert(&mut self, id: RegionId, pages: u32, now: Nanos) {
        self.remove(id);
        let region = Region {
            epoch: self.epoch.number,
            level: 0,
            seq: 0,
            pages,
            inserted_at: now,
            joined_round: 0,
            perm: self
                .epoch
                .permutation(pages.div_ceil(self.config.cluster_pages), 0),
            pass_pos: 0,
            passes: 0,
            epoch_passes: 0,
            round: SampleCounts::default(),
            total: SampleCounts::default(),
            listed: false,
            judged: 0,
            last_dup_ratio: 0.0,
            parked: false,
        };
        self.regions.insert(id, region);
        self.attach(id, 0);
    }

    /// Removes a region (unmapped, or its process exited). Returns whether
    /// it was on the ladder.
    pub fn remove(&mut self, id: RegionId) -> bool {
        let Some(r) = self.regions.remove(&id) else {
            return false;
        };
        self.detach(r.level, r.seq, r.space_pages());
        true
    }

    /// Changes a region's length. It keeps its level and counters; its
    /// permutation pass restarts over the new length. Unknown ids are
    /// ignored.
    pub fn resize(&mut self, id: RegionId, pages: u32) {
        let epoch = self.epoch;
        let k = self.config.cluster_pages;
        let Some(r) = self.regions.get_mut(&id) else {
            return;
        };
        if r.pages == pages {
            return;
        }
        r.pages = pages;
        let space = &mut self.levels[r.level].space;
        let i = space.index_of(r.seq).expect("resize: member exists");
        space.set_pages(i, u64::from(r.space_pages()));
        r.perm = epoch.permutation(pages.div_ceil(k), 0);
        r.epoch = epoch.number;
        r.epoch_passes = 0;
        r.pass_pos = 0;
    }

    /// The level of a region, if it is on the ladder.
    pub fn level_of(&self, id: RegionId) -> Option<usize> {
        self.regions.get(&id).map(|r| r.level)
    }

    /// Pages on a level: `L_l` of §5.3.
    pub fn level_pages(&self, level: usize) -> u64 {
        self.level_ref(level).space.total
    }

    /// The regions on a level, in the order of its flat space.
    pub fn regions_at(&self, level: usize) -> Vec<RegionId> {
        self.level_ref(level).space.members().collect()
    }

    /// Sets a level's sampling interval (pages between sample points; at
    /// least one cluster, see `LadderConfig::cluster_pages`). Takes effect
    /// from the next sample point.
    pub fn set_interval(&mut self, level: usize, interval: u64) {
        // Points closer than a cluster would sample a page more than once
        // per round.
        let k = u64::from(self.config.cluster_pages);
        self.level_mut(level).interval = interval.max(k);
    }

    /// A level's current sampling interval (the cluster size until set).
    pub fn interval(&self, level: usize) -> u64 {
        self.level_ref(level).interval
    }

    /// Starts a new round on a level: the cursor goes to a random offset
    /// in `0..interval` of the level's flat space (the code's
    /// `prandom % step`). Restarting a round in progress keeps the
    /// samples taken so far for the next judgement.
    pub fn start_round(&mut self, level: usize) {
        let interval = self.level_ref(level).interval;
        let offset = self.rng.random_range(0..interval);
        self.levels[level].cursor = Some(Cursor { seq: 0, offset });
        self.levels[level].rounds_started += 1;
    }

    /// The next sample of a level, or `None` when the level has no round
    /// in progress (never started, or ended), or its round has passed the
    /// end of the level's flat space. The sample is the cluster of
    /// [`Ladder::cluster_len`] pages that starts at the returned page;
    /// every page of it counts as sampled, and the caller records each.
    pub fn next_sample(&mut self, level: usize) -> Option<PageRef> {
        let lvl = self.level_ref(level);
        let cursor = lvl.cursor?;
        let pos = lvl.space.position(cursor);
        if pos >= lvl.space.total {
            return None;
        }
        let (mut i, mut start) = lvl.space.find(pos);
        let mut pos = pos;
        let interval = lvl.interval;
        {
            // Regions that joined the level after this round began (their
            // samples could not judge them: see `end_round`), and with
            // early decisions regions whose verdict is certain, are passed
            // over: the cursor moves to the first sample point past their
            // end, in step with the interval, as if their samples had
            // been taken.
            let rounds = lvl.rounds_started;
            loop {
                let slot = lvl.space.slots[i];
                let r = &self.regions[&slot.id];
                let skip = r.joined_round >= rounds
                    || (self.config.early_decision && r.round.decided(self.config.v_dup));
                if !skip {
                    break;
                }
                let end = start + slot.pages;
                pos += (end - pos).div_ceil(interval) * interval;
                if pos >= lvl.space.total {
                    let lvl = &mut self.levels[level];
                    lvl.cursor = Some(Cursor {
                        seq: slot.seq,
                        offset: pos - start,
                    });
                    return None;
                }
                (i, start) = lvl.space.find(pos);
            }
        }
        let Slot { seq, id, .. } = lvl.space.slots[i];
        let k = self.config.cluster_pages;
        let r = self.regions.get_mut(&id).expect("member is a region");
        let page = r.next_page(&self.epoch, k);
        let len = u64::from(k.min(r.pages - page));
        r.round.sampled += len;
        r.total.sampled += len;
        let newly_listed = !r.listed;
        r.listed = true;
        let lvl = &mut self.levels[level];
        if newly_listed {
            lvl.to_judge.push(id);
        }
        lvl.cursor = Some(Cursor {
            seq,
            offset: (pos - start).saturating_add(interval),
        });
        Some(PageRef { region: id, page })
    }

    /// Pages of the cluster that starts at `page` (a page [`Ladder::next_sample`]
    /// returned): `cluster_pages`, fewer at its region's end, 0 for a
    /// region not on the ladder.
    pub fn cluster_len(&self, page: PageRef) -> u32 {
        self.regions.get(&page.region).map_or(0, |r| {
            self.config
                .cluster_pages
                .min(r.pages.saturating_sub(page.page))
        })
    }

    /// Whether a level has no round in progress: none was started, the
    /// last one was ended, or its cursor has passed the end of the level.
    pub fn round_finished(&self, level: usize) -> bool {
        let lvl = self.level_ref(level);
        lvl.cursor
            .is_none_or(|c| lvl.space.position(c) >= lvl.space.total)
    }

    /// Records the outcome of sampling `page`. Outcomes for regions no
    /// longer on the ladder are ignored. A region that was not handed out
    /// by [`Ladder::next_sample`] this round (a page the caller sampled on
    /// its own, e.g. a hint) is judged at the end of its level's round too.
    pub fn record(&mut self, page: PageRef, sample: Sample) {
        let Some(r) = self.regions.get_mut(&page.region) else {
            return;
        };
        r.round.add(sample);
        r.total.add(sample);
        if !r.listed {
            r.listed = true;
            let level = r.level;
            self.levels[level].to_judge.push(page.region);
        }
    }

    /// Ends a level's round (finished or not): judges every region sampled
    /// on it since its last judgement, moves them, resets their round
    /// counters and leaves the level without a round until
    /// [`Ladder::start_round`]. Regions that move are appended to their
    /// new level's flat space, behind that level's cursor.
    pub fn end_round(&mut self, level: usize, now: Nanos) -> Vec<Move> {
        let to_judge = std::mem::take(&mut self.level_mut(level).to_judge);
        self.levels[level].cursor = None;
        let top = self.levels.len() - 1;
        let mut moves = Vec::with_capacity(to_judge.len());
        for id in to_judge {
            let Some(r) = self.regions.get_mut(&id) else {
                continue; // removed during the round
            };
            if !r.listed || r.level != level {
                continue; // already judged (duplicate entry)
            }
            if r.parked {
                // Recorded on its own (a hint) while parked: not judged.
                r.round = SampleCounts::default();
                r.listed = false;
                continue;
            }
            let ratio = r.round.dup_ratio(self.config.v_cow);
            // Lifetime (UKSM §5.2): older than V_life, and lived through a
            // whole round of this level ("only those regions which live
            // across this sleep-scan cycle time may get sampled"), so a
            // region mapped mid-round cannot climb on a partial view.
            let old_enough = now.saturating_sub(r.inserted_at) > self.config.v_life
                && r.joined_round < self.levels[level].rounds_started;
            // Not old enough is no verdict. A region that joined the level
            // after its round began is passed over by `next_sample`, so
            // only samples recorded on their own (hints) get it here. It
            // used to be sampled on the round's tail and dropped, which
            // sent twins that climb at the same pace back and forth
            // between two levels for as long as each arrived mid-round
            // (in the daemon's loop test of two identical regions, now
            // `sampling_that_contradicts_the_sweeps_unique_zones_marks_the_region_whole`,
            // they never left levels 0 and 1 in 90 s, on 7b3c852).
            // It stays, and the next round, a whole one, judges it.
            let target = if r.round.all_merged() {
                0
            } else if !old_enough {
                level
            } else if ratio > 0.0 && ratio >= self.config.v_dup {
                (level + 1).min(top)
            } else {
                level.saturating_sub(1)
            };
            let mv = if target == level {
                Move::Stay { region: id }
            } else if r.round.all_merged() {
                Move::Bottom { region: id }
            } else if target > level {
                Move::Climb {
                    region: id,
                    to: target,
                }
            } else {
                Move::Drop {
                    region: id,
                    to: target,
                }
            };
            r.last_dup_ratio = ratio;
            r.judged += 1;
            r.round = SampleCounts::default();
            r.listed = false;
            if target != level {
                let (seq, pages) = (r.seq, r.space_pages());
                self.detach(level, seq, pages);
                self.attach(id, target);
            }
            moves.push(mv);
        }
        moves
    }

    /// Moves a region to the top level on evidence from outside the
    /// sampling rounds (the exact sweep measured `dup_ratio` of its present
    /// pages as duplicates), if the ratio passes V_dup and the region is
    /// older than V_life: the evidence is there, so the region need not
    /// climb round by round. Its judgement counts as one. Returns the move,
    /// or `None` if the region stays where it is (unknown, already on top,
    /// too young or too poor).
    pub fn raise(&mut self, id: RegionId, dup_ratio: f64, now: Nanos) -> Option<Move> {
        let young = now.saturating_sub(self.regions.get(&id)?.inserted_at) <= self.config.v_life;
        if young {
            return None;
        }
        self.raise_on_history(id, dup_ratio)
    }

    /// Moves a region to the top level on its predecessors' evidence (a
    /// region mapped again where its process's last one of that size was
    /// marked, [`crate::pipeline::recurrence`]), whatever its age: V_life
    /// asks whether a region lives long enough to be worth merging, and
    /// its predecessors have answered that. Otherwise as [`Ladder::raise`].
    pub fn raise_on_history(&mut self, id: RegionId, dup_ratio: f64) -> Option<Move> {
        let top = self.levels.len() - 1;
        let r = self.regions.get_mut(&id)?;
        if r.level == top || !(dup_ratio > 0.0 && dup_ratio >= self.config.v_dup) {
            return None;
        }
        let (from, seq, pages) = (r.level, r.seq, r.space_pages());
        r.last_dup_ratio = dup_ratio;
        r.judged += 1;
        r.round = SampleCounts::default();
        r.listed = false;
        self.detach(from, seq, pages);
        self.attach(id, top);
        Some(Move::Climb {
            region: id,
            to: top,
        })
    }

    /// Parks a region on its level: it stays a member (listed by
    /// [`Ladder::regions_at`], on the same level) but holds no pages of the
    /// level's flat space, so rounds neither sample nor judge it and the
    /// level's page count (hence its sampling interval) leaves it out.
    /// For a region whose fate is decided elsewhere for a while: one the
    /// exact sweep raised waits for a write watch's verdict, and top-level
    /// samples could only misjudge it (its duplicates' twins sit at
    /// offsets sampling does not meet) and drop it. Returns whether it was
    /// parked now (unknown or already parked: `false`).
    pub fn park(&mut self, id: RegionId) -> bool {
        let Some(r) = self.regions.get_mut(&id) else {
            return false;
        };
        if r.parked {
            return false;
        }
        r.parked = true;
        r.round = SampleCounts::default();
        let (level, seq, pages) = (r.level, r.seq, r.pages);
        let lvl = &mut self.levels[level];
        let i = lvl.space.index_of(seq).expect("park: member exists");
        lvl.space.set_pages(i, 0);
        // A cursor inside it moves on as if it had left.
        if let Some(c) = &mut lvl.cursor
            && c.seq == seq
        {
            *c = Cursor {
                seq: seq + 1,
                offset: c.offset.saturating_sub(u64::from(pages)),
            };
        }
        true
    }

    /// Ends a park: the region's pages are back in its level's flat space
    /// where it stood, sampled from the next sample point on. Returns
    /// whether it was parked.
    pub fn readmit(&mut self, id: RegionId) -> bool {
        let Some(r) = self.regions.get_mut(&id) else {
            return false;
        };
        if !r.parked {
            return false;
        }
        r.parked = false;
        let (level, seq, pages) = (r.level, r.seq, r.pages);
        let space = &mut self.levels[level].space;
        let i = space.index_of(seq).expect("readmit: member exists");
        space.set_pages(i, u64::from(pages));
        true
    }

    /// Whether a region is parked.
    pub fn is_parked(&self, id: RegionId) -> bool {
        self.regions.get(&id).is_some_and(|r| r.parked)
    }

    /// What the ladder knows about a region.
    pub fn region_stats(&self, id: RegionId) -> Option<RegionStats> {
        self.regions.get(&id).map(|r| RegionStats {
            level: r.level,
            pages: r.pages,
            inserted_at: r.inserted_at,
            round: r.round,
            total: r.total,
            judged: r.judged,
            last_dup_ratio: r.last_dup_ratio,
            passes: r.passes,
            pass_progress: r.pass_pos,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashSet};

    /// The pages a level round hands out, per region.
    fn round_pages(l: &mut Ladder, level: usize) -> HashMap<RegionId, Vec<u32>> {
        let mut got: HashMap<RegionId, Vec<u32>> = HashMap::new();
        l.start_round(level);
        while let Some(p) = l.next_sample(level) {
            got.entry(p.region).or_default().push(p.page);
        }
        got
    }

    #[test]
    fn a_raised_region_is_on_top_only_with_the_evidence_and_the_age() {
        let cfg = LadderConfig::default();
        let top = cfg.levels - 1;
        let old = cfg.v_life + 1;
        let mut l = Ladder::new(cfg.clone(), 3);
        l.insert(RegionId(1), 512, 0);
        l.insert(RegionId(2), 512, 0);
        // Too young, then too poor.
        assert_eq!(l.raise(RegionId(1), 0.9, cfg.v_life), None);
        assert_eq!(l.raise(RegionId(1), cfg.v_dup / 2.0, old), None);
        assert_eq!(l.level_of(RegionId(1)), Some(0));
        assert!(
            matches!(l.raise(RegionId(1), 0.5, old), Some(Move::Climb { to, .. }) if to == top)
        );
        assert_eq!(l.level_of(RegionId(1)), Some(top));
        assert_eq!(l.level_pages(top), 512);
        assert_eq!(l.level_pages(0), 512);
        let s = l.region_stats(RegionId(1)).unwrap();
        assert_eq!((s.judged, s.last_dup_ratio), (1, 0.5));
        // Already on top: nothing to do; the other region still samples.
        assert_eq!(l.raise(RegionId(1), 0.9, old), None);
        assert_eq!(l.regions_at(0), vec![RegionId(2)]);
    }

    #[test]
    fn a_region_raised_on_history_needs_the_evidence_but_not_the_age() {
        let cfg = LadderConfig::default();
        let top = cfg.levels - 1;
        let mut l = Ladder::new(cfg.clone(), 3);
        l.insert(RegionId(1), 512, 0);
        assert_eq!(l.raise_on_history(RegionId(1), cfg.v_dup / 2.0), None);
        assert_eq!(l.raise_on_history(RegionId(9), 0.9), None, "unknown");
        assert_eq!(l.level_of(RegionId(1)), Some(0));
        // Just inserted, far younger than V_life.
        assert!(matches!(
            l.raise_on_history(RegionId(1), 0.9),
            Some(Move::Climb { to, .. }) if to == top
        ));
        assert_eq!(l.level_pages(top), 512);
        assert_eq!(l.region_stats(RegionId(1)).unwrap().last_dup_ratio, 0.9);
        assert_eq!(l.raise_on_history(RegionId(1), 0.9), None, "already on top");
    }

    #[test]
    fn a_parked_region_keeps_its_level_and_is_neither_sampled_nor_judged() {
        let cfg = LadderConfig::default();
        let top = cfg.levels - 1;
        let mut l = Ladder::new(cfg.clone(), 5);
        for i in 1..=3 {
            l.insert(RegionId(i), 100, 0);
        }
        assert!(l.raise(RegionId(2), 0.5, cfg.v_life + 1).is_some());
        assert!(l.raise(RegionId(3), 0.5, cfg.v_life + 1).is_some());
        assert!(l.park(RegionId(2)));
        assert!(!l.park(RegionId(2)), "parked once");
        assert_eq!(l.level_of(RegionId(2)), Some(top));
        assert_eq!(l.regions_at(top), vec![RegionId(2), RegionId(3)]);
        assert_eq!(l.level_pages(top), 100, "only the other region's pages");
        // A whole round of the top samples only region 3; the end of the
        // round judges only it, even if a hint was recorded on region 2.
        l.set_interval(top, 1);
        let got = round_pages(&mut l, top);
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![RegionId(3)]);
        l.record(
            PageRef {
                region: RegionId(2),
                page: 0,
            },
            Sample::default(),
        );
        let moves = l.end_round(top, cfg.v_life * 10);
        assert!(moves.iter().all(|m| m.region() == RegionId(3)), "{moves:?}");
        assert_eq!(l.level_of(RegionId(2)), Some(top));
        // Resized while parked: back with its new size.
        l.resize(RegionId(2), 40);
        assert_eq!(l.level_pages(top), 0);
        assert!(l.readmit(RegionId(2)));
        assert!(!l.readmit(RegionId(2)));
        assert_eq!(l.level_pages(top), 40);
        let got = round_pages(&mut l, top);
        assert_eq!(got[&RegionId(2)].len(), 40);
        // Removing a parked region leaves the level consistent.
        l.park(RegionId(2));
        assert!(l.remove(RegionId(2)));
        assert_eq!(l.level_pages(top), 0);
    }

    #[test]
    fn regions_of_one_size_sample_the_same_offsets_within_an_epoch() {
        let mut l = Ladder::new(LadderConfig::default(), 7);
        // Two twins of 4096 pages, one of another size between them, and
        // a twin that joins after a round was taken.
        l.insert(RegionId(1), 4096, 0);
        l.insert(RegionId(2), 1000, 0);
        l.insert(RegionId(3), 4096, 0);
        l.set_interval(0, 64);
        let first = round_pages(&mut l, 0);
        l.end_round(0, 0);
        let (a, b) = (&first[&RegionId(1)], &first[&RegionId(3)]);
        let shared = a.iter().filter(|p| b.contains(p)).count();
        // Each takes about 64 samples; uncoordinated they would share
        // about one offset.
        assert!(a.len() >= 60 && b.len() >= 60, "{} {}", a.len(), b.len());
        assert!(
            shared + 2 >= a.len().min(b.len()),
            "shared {shared} of {}",
            a.len()
        );
        // A late twin starts at the head of the same permutation.
        l.insert(RegionId(4), 4096, 0);
        let second = round_pages(&mut l, 0);
        l.end_round(0, 0);
        let late = &second[&RegionId(4)];
        let head: Vec<u32> = a.iter().take(late.len().min(40)).copied().collect();
        assert_eq!(&late[..head.len()], &head[..]);
        // A new epoch draws a new permutation.
        l.new_epoch();
        assert_eq!(l.epoch(), 1);
        let third = round_pages(&mut l, 0);
        let c = &third[&RegionId(1)];
        let again = c.iter().filter(|p| a.contains(p)).count();
        assert!(again < c.len() / 4, "{again} of {} repeated", c.len());
        let d = &third[&RegionId(4)];
        assert!(c.iter().filter(|p| d.contains(p)).count() + 2 >= c.len().min(d.len()));
    }

    const DUP: Sample = Sample {
        duplicate: true,
        merged: false,
        cow_broken: false,
    };
    const MERGED: Sample = Sample {
        duplicate: false,
        merged: true,
        cow_broken: false,
    };
    const COW: Sample = Sample {
        duplicate: false,
        merged: false,
        cow_broken: true,
    };
    const PLAIN: Sample = Sample {
        duplicate: false,
        merged: false,
        cow_broken: false,
    };

    fn ladder() -> Ladder {
        Ladder::new(LadderConfig::default(), 42)
    }

    /// Runs one full round on `level`, answering each sample with the
    /// next outcome of `outcomes` (cycled), and returns the pages sampled.
    fn run_round(l: &mut Ladder, level: usize, outcomes: &[Sample]) -> Vec<PageRef> {
        l.start_round(level);
        let mut seen = Vec::new();
        while let Some(p) = l.next_sample(level) {
            l.record(p, outcomes[seen.len() % outcomes.len()]);
            seen.push(p);
        }
        assert!(l.round_finished(level));
        seen
    }

    /// A single 10-page region at `level`, old enough to climb.
    fn region_at(level: usize) -> (Ladder, RegionId) {
        let mut l = ladder();
        let id = RegionId(1);
        l.insert(id, 10, 0);
        for lv in 0..level {
            run_round(&mut l, lv, &[DUP]);
            let moves = l.end_round(lv, SEC);
            assert_eq!(
                moves,
                vec![Move::Climb {
                    region: id,
                    to: lv + 1
                }]
            );
        }
        (l, id)
    }

    const SEC: Nanos = 1_000_000_000;

    /// `dups` duplicates, `cows` COW breaks and the rest plain, over 10
    /// samples of a 10-page region at interval 1.
    fn outcomes(dups: usize, cows: usize) -> Vec<Sample> {
        let mut v = vec![DUP; dups];
        v.extend(vec![COW; cows]);
        v.resize(10, PLAIN);
        v
    }

    #[test]
    fn config_default_and_validation() {
        let c = LadderConfig::default();
        assert_eq!(
            (c.levels, c.v_dup, c.v_cow, c.v_life),
            (4, 0.10, 0.50, 100 * MS)
        );
        assert!(c.validate().is_ok());
        let bad = |f: fn(&mut LadderConfig)| {
            let mut c = LadderConfig::default();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(bad(|c| c.levels = 0).starts_with("levels:"));
        assert!(bad(|c| c.levels = MAX_LEVELS + 1).starts_with("levels:"));
        assert!(bad(|c| c.v_dup = 1.5).starts_with("v_dup:"));
        assert!(bad(|c| c.v_dup = f64::NAN).starts_with("v_dup:"));
        assert!(bad(|c| c.v_cow = -0.1).starts_with("v_cow:"));
    }

    #[test]
    #[should_panic(expected = "invalid ladder config: levels")]
    fn new_rejects_a_bad_config() {
        Ladder::new(
            LadderConfig {
                levels: 0,
                ..LadderConfig::default()
            },
            1,
        );
    }

    #[test]
    #[should_panic(expected = "level 4 out of 0..4")]
    fn level_out_of_range_panics() {
        ladder().set_interval(4, 1);
    }

    #[test]
    fn regions_enter_the_bottom() {
        let mut l = ladder();
        l.insert(RegionId(1), 10, 0);
        l.insert(RegionId(2), 5, 0);
        assert_eq!(l.level_of(RegionId(1)), Some(0));
        assert_eq!(l.regions_at(0), vec![RegionId(1), RegionId(2)]);
        assert_eq!(l.level_pages(0), 15);
        assert_eq!((l.levels(), l.len()), (4, 2));
        assert_eq!(l.level_of(RegionId(3)), None);
    }

    #[test]
    fn a_round_samples_every_page_once_in_flat_order() {
        let mut l = ladder();
        l.insert(RegionId(1), 5, 0);
        l.insert(RegionId(2), 0, 0); // occupies no space
        l.insert(RegionId(3), 7, 0);
        let seen = run_round(&mut l, 0, &[PLAIN]);
        assert_eq!(seen.len(), 12);
        // Flat order: all of region 1, then all of region 3.
        assert!(seen[..5].iter().all(|p| p.region == RegionId(1)));
        assert!(seen[5..].iter().all(|p| p.region == RegionId(3)));
        let pages1: BTreeSet<u32> = seen[..5].iter().map(|p| p.page).collect();
        let pages3: BTreeSet<u32> = seen[5..].iter().map(|p| p.page).collect();
        assert_eq!(pages1, (0..5).collect());
        assert_eq!(pages3, (0..7).collect());
        // The order within a region is the permutation, not 0, 1, 2, ...
        let order3: Vec<u32> = seen[5..].iter().map(|p| p.page).collect();
        assert_ne!(order3, (0..7).collect::<Vec<_>>());
    }

    #[test]
    fn no_round_no_samples() {
        let mut l = ladder();
        l.insert(RegionId(1), 5, 0);
        assert!(l.round_finished(0));
        assert_eq!(l.next_sample(0), None);
        // An empty level's round is finished at once.
        l.start_round(1);
        assert!(l.round_finished(1));
        assert_eq!(l.next_sample(1), None);
    }

    #[test]
    fn successive_rounds_sample_different_pages() {
        let mut l = ladder();
        l.insert(RegionId(1), 1000, 0);
        l.set_interval(0, 100);
        let a: HashSet<u32> = run_round(&mut l, 0, &[PLAIN])
            .iter()
            .map(|p| p.page)
            .collect();
        l.end_round(0, 0);
        let b: HashSet<u32> = run_round(&mut l, 0, &[PLAIN])
            .iter()
            .map(|p| p.page)
            .collect();
        assert_eq!((a.len(), b.len()), (10, 10));
        assert!(a.is_disjoint(&b), "same pass never repeats a page");
    }

    #[test]
    fn climb_on_duplicates() {
        let (mut l, id) = region_at(0);
        run_round(&mut l, 0, &outcomes(2, 0));
        assert_eq!(l.end_round(0, SEC), vec![Move::Climb { region: id, to: 1 }]);
        assert_eq!(l.level_of(id), Some(1));
        assert_eq!(l.regions_at(0), vec![]);
        assert_eq!(l.regions_at(1), vec![id]);
        assert_eq!(l.level_pages(1), 10);
        let s = l.region_stats(id).unwrap();
        assert_eq!(s.last_dup_ratio, 0.2);
        assert_eq!(s.round, SampleCounts::default());
        assert_eq!((s.total.sampled, s.total.duplicates, s.judged), (10, 2, 1));
    }

    #[test]
    fn v_dup_is_at_or_above() {
        // 1 of 10 = exactly 10 %: climbs (code: dedup >= abundant_threshold).
        let (mut l, id) = region_at(0);
        run_round(&mut l, 0, &outcomes(1, 0));
        assert_eq!(l.end_round(0, SEC), vec![Move::Climb { region: id, to: 1 }]);
        // A stricter threshold keeps it down.
        let mut l = Ladder::new(
            LadderConfig {
                v_dup: 0.11,
                ..LadderConfig::default()
            },
            1,
        );
        l.insert(id, 10, 0);
        run_round(&mut l, 0, &outcomes(1, 0));
        assert_eq!(l.end_round(0, SEC), vec![Move::Stay { region: id }]);
    }

    #[test]
    fn drop_without_duplicates_and_floor_at_bottom() {
        let (mut l, id) = region_at(2);
        run_round(&mut l, 2, &outcomes(0, 0));
        assert_eq!(l.end_round(2, SEC), vec![Move::Drop { region: id, to: 1 }]);
        run_round(&mut l, 1, &outcomes(0, 0));
        assert_eq!(l.end_round(1, SEC), vec![Move::Drop { region: id, to: 0 }]);
        run_round(&mut l, 0, &outcomes(0, 0));
        assert_eq!(l.end_round(0, SEC), vec![Move::Stay { region: id }]);
        assert_eq!(l.level_of(id), Some(0));
    }

    /// A ladder sampling clusters of 4 with one region of `pages` pages,
    /// its bottom level's interval set to 1 (raised to the cluster).
    fn clustered(pages: u32) -> (Ladder, RegionId) {
        let mut l = Ladder::new(
            LadderConfig {
                cluster_pages: 4,
                ..LadderConfig::default()
            },
            7,
        );
        let id = RegionId(1);
        l.insert(id, pages, 0);
        l.set_interval(0, 1);
        (l, id)
    }

    /// Clusters of 4 over a 10-page region: one pass of its permutation
    /// visits the clusters starting at 0, 4 and 8 once each (the last one
    /// 2 pages long), whatever rounds it spans; every page counts as
    /// sampled; an interval below the cluster size is raised to it.
    #[test]
    fn a_pass_of_clusters_covers_every_page_once() {
        let (mut l, id) = clustered(10);
        assert_eq!(l.interval(0), 4);
        let mut pages = Vec::new();
        for _ in 0..3 {
            let first = match l.next_sample(0) {
                Some(p) => p,
                None => {
                    l.start_round(0);
                    l.next_sample(0).expect("a new round samples")
                }
            };
            let len = l.cluster_len(first);
            assert_eq!(first.page % 4, 0, "clusters start at multiples of 4");
            pages.extend(first.page..first.page + len);
        }
        pages.sort_unstable();
        assert_eq!(pages, (0..10).collect::<Vec<u32>>());
        let stats = l.region_stats(id).unwrap();
        assert_eq!(stats.total.sampled, 10);
        assert_eq!(stats.pass_progress, 0, "the pass of 3 clusters is done");
        assert_eq!(stats.passes, 1);
        assert_eq!(
            l.cluster_len(PageRef {
                region: id,
                page: 8
            }),
            2
        );
        assert_eq!(
            l.cluster_len(PageRef {
                region: RegionId(9),
                page: 0
            }),
            0
        );
    }

    /// Duplicates judged by page: a round of clusters whose pages are
    /// half duplicates climbs like a round of single pages would.
    #[test]
    fn clusters_are_judged_per_page() {
        let (mut l, id) = clustered(16);
        l.start_round(0);
        let mut n = 0;
        while let Some(first) = l.next_sample(0) {
            for j in 0..l.cluster_len(first) {
                let page = PageRef {
                    region: id,
                    page: first.page + j,
                };
                l.record(page, if j % 2 == 0 { DUP } else { Sample::default() });
                n += 1;
            }
        }
        assert_eq!(n, 16);
        assert_eq!(l.end_round(0, SEC), vec![Move::Climb { region: id, to: 1 }]);
        assert_eq!(l.region_stats(id).unwrap().last_dup_ratio, 0.5);
    }

    #[test]
    fn cluster_pages_is_validated_by_name() {
        for k in [0, MAX_CLUSTER_PAGES + 1] {
            let e = LadderConfig {
                cluster_pages: k,
                ..LadderConfig::default()
            }
            .validate()
            .unwrap_err();
            assert!(e.starts_with("cluster_pages:"), "{e}");
        }
    }

    #[test]
    fn climb_is_capped_at_the_top() {
        let (mut l, id) = region_at(3);
        run_round(&mut l, 3, &[DUP]);
        assert_eq!(l.end_round(3, SEC), vec![Move::Stay { region: id }]);
        assert_eq!(l.level_of(id), Some(3));
    }

    #[test]
    fn cow_cut_off() {
        // 4 duplicates, 3 COW breaks: 75 % > 50 %, ratio counts as 0.
        let (mut l, id) = region_at(1);
        run_round(&mut l, 1, &outcomes(4, 3));
        assert_eq!(l.end_round(1, SEC), vec![Move::Drop { region: id, to: 0 }]);
        assert_eq!(l.region_stats(id).unwrap().last_dup_ratio, 0.0);
        // 4 duplicates, 2 COW breaks: exactly 50 % is not above V_cow; the
        // net ratio (4 - 2) / 10 = 20 % climbs.
        let (mut l, id) = region_at(1);
        run_round(&mut l, 1, &outcomes(4, 2));
        assert_eq!(l.end_round(1, SEC), vec![Move::Climb { region: id, to: 2 }]);
        assert_eq!(l.region_stats(id).unwrap().last_dup_ratio, 0.2);
        // Net of COW breaks: 2 duplicates, 1 break = 10 %, still climbs;
        // 3 duplicates, 1 break under V_dup = 25 % does not.
        let (mut l, id) = region_at(1);
        run_round(&mut l, 1, &outcomes(2, 1));
        assert_eq!(l.end_round(1, SEC), vec![Move::Climb { region: id, to: 2 }]);
        let mut l = Ladder::new(
            LadderConfig {
                v_dup: 0.25,
                ..LadderConfig::default()
            },
            1,
        );
        l.insert(id, 10, 0);
        run_round(&mut l, 0, &outcomes(3, 1));
        assert_eq!(l.end_round(0, SEC), vec![Move::Stay { region: id }]);
    }

    #[test]
    fn zero_ratio_never_climbs_even_at_v_dup_zero() {
        let mut l = Ladder::new(
            LadderConfig {
                v_dup: 0.0,
                ..LadderConfig::default()
            },
            1,
        );
        let id = RegionId(1);
        l.insert(id, 10, 0);
        run_round(&mut l, 0, &[PLAIN]);
        assert_eq!(l.end_round(0, SEC), vec![Move::Stay { region: id }]);
        run_round(&mut l, 0, &outcomes(1, 0));
        assert_eq!(l.end_round(0, SEC), vec![Move::Climb { region: id, to: 1 }]);
    }

    #[test]
    fn young_regions_do_not_climb() {
        let mut l = ladder();
        let id = RegionId(7);
        l.insert(id, 10, SEC);
        run_round(&mut l, 0, &[DUP]);
        // Age exactly V_life is not "longer than" V_life.
        assert_eq!(
            l.end_round(0, SEC + 100 * MS),
            vec![Move::Stay { region: id }]
        );
        run_round(&mut l, 0, &[DUP]);
        assert_eq!(
            l.end_round(0, SEC + 100 * MS + 1),
            vec![Move::Climb { region: id, to: 1 }]
        );
        assert_eq!(l.region_stats(id).unwrap().age(SEC + 150 * MS), 150 * MS);
    }

    fn counts(recorded: u64, duplicates: u64) -> SampleCounts {
        SampleCounts {
            sampled: recorded,
            recorded,
            duplicates,
            ..SampleCounts::default()
        }
    }

    #[test]
    fn a_verdict_is_decided_early_only_when_the_interval_clears_v_dup() {
        // Too few samples, however plain.
        assert!(!counts(31, 31).decided(0.1));
        assert!(counts(32, 32).decided(0.1));
        // None in 64: the interval's top is 9.4 %, under 10 %.
        assert!(!counts(40, 0).decided(0.1));
        assert!(counts(64, 0).decided(0.1));
        // Near V_dup: never early.
        assert!(!counts(1000, 100).decided(0.1));
        assert!(!counts(200, 30).decided(0.1));
        assert!(counts(200, 60).decided(0.1));
        // A merged page or a COW break weighs other rules: never early.
        let mut c = counts(100, 100);
        c.merged = 1;
        assert!(!c.decided(0.1));
        let mut c = counts(100, 100);
        c.cow_broken = 1;
        assert!(!c.decided(0.1));
    }

    #[test]
    fn a_decided_region_is_skipped_for_the_rest_of_its_round_and_still_judged() {
        let mut l = ladder();
        let (rich, near) = (RegionId(1), RegionId(2));
        l.insert(rich, 4096, 0);
        l.insert(near, 4096, 0);
        l.set_interval(0, 8);
        l.start_round(0);
        let mut taken: std::collections::BTreeMap<RegionId, u64> = Default::default();
        let mut k = 0u64;
        while let Some(p) = l.next_sample(0) {
            // The rich region is all duplicates; the other one in ten.
            let dup = p.region == rich || k.is_multiple_of(10);
            k += 1;
            l.record(p, if dup { DUP } else { PLAIN });
            *taken.entry(p.region).or_default() += 1;
        }
        // 512 sample points each at a fixed density.
        assert_eq!(taken[&rich], EARLY_MIN_SAMPLES);
        assert_eq!(taken[&near], 512);
        let moves = l.end_round(0, SEC);
        assert!(
            moves.contains(&Move::Climb {
                region: rich,
                to: 1
            }),
            "{moves:?}"
        );
        // Next round, the rich one is sampled afresh.
        let seen = run_round(&mut l, 1, &[DUP]);
        assert_eq!(seen.len() as u64, EARLY_MIN_SAMPLES);
        // Off: UKSM's density.
        let mut l = Ladder::new(
            LadderConfig {
                early_decision: false,
                ..LadderConfig::default()
            },
            42,
        );
        l.insert(rich, 4096, 0);
        l.set_interval(0, 8);
        assert_eq!(run_round(&mut l, 0, &[DUP]).len(), 512);
    }

    #[test]
    fn all_merged_returns_to_the_bottom() {
        let (mut l, id) = region_at(2);
        run_round(&mut l, 2, &[MERGED]);
        assert_eq!(l.end_round(2, SEC), vec![Move::Bottom { region: id }]);
        assert_eq!(l.level_of(id), Some(0));
        // At the bottom already: stays.
        run_round(&mut l, 0, &[MERGED]);
        assert_eq!(l.end_round(0, SEC), vec![Move::Stay { region: id }]);
        // One page not merged: an ordinary drop, not the all-merged rule.
        let (mut l, id) = region_at(2);
        let mut o = vec![MERGED; 9];
        o.push(PLAIN);
        run_round(&mut l, 2, &o);
        assert_eq!(l.end_round(2, SEC), vec![Move::Drop { region: id, to: 1 }]);
    }

    #[test]
    fn unrecorded_samples_dilute_the_ratio() {
        // 10 samples handed out, only 2 recorded (both duplicates): 20 %.
        let (mut l, id) = region_at(0);
        l.start_round(0);
        let mut n = 0;
        while let Some(p) = l.next_sample(0) {
            if n < 2 {
                l.record(p, DUP);
            }
            n += 1;
        }
        assert_eq!(n, 10);
        assert_eq!(l.end_round(0, SEC), vec![Move::Climb { region: id, to: 1 }]);
        assert_eq!(l.region_stats(id).unwrap().last_dup_ratio, 0.2);
    }

    #[test]
    fn a_region_joining_mid_round_climbs_only_after_a_whole_round() {
        let mut l = ladder();
        let (old, young) = (RegionId(1), RegionId(2));
        l.insert(old, 10, 0);
        l.start_round(0);
        l.insert(young, 10, 0); // mapped while the round runs
        for round in 0..2 {
            if round > 0 {
                l.start_round(0);
            }
            while let Some(p) = l.next_sample(0) {
                l.record(p, DUP);
            }
            let moves = l.end_round(0, SEC);
            let young_move = moves.iter().find(|m| m.region() == young);
            if round == 0 {
                // Not sampled in the round it joined: nothing to judge.
                assert!(moves.contains(&Move::Climb { region: old, to: 1 }));
                assert_eq!(young_move, None);
                assert_eq!(l.level_of(young), Some(0));
            } else {
                let young_move = young_move.unwrap();
                assert_eq!(
                    *young_move,
                    Move::Climb {
                        region: young,
                        to: 1
                    }
                );
            }
        }
    }

    #[test]
    fn recorded_hints_are_judged_too() {
        let mut l = ladder();
        let id = RegionId(3);
        l.insert(id, 100, 0);
        l.set_interval(0, 1000);
        l.start_round(0);
        // Never sampled by the ladder; the caller recorded 4 hint pages.
        for page in 0..4 {
            l.record(PageRef { region: id, page }, DUP);
        }
        assert_eq!(l.end_round(0, SEC), vec![Move::Climb { region: id, to: 1 }]);
        assert_eq!(l.region_stats(id).unwrap().last_dup_ratio, 1.0);
        // Unknown regions are ignored.
        l.record(
            PageRef {
                region: RegionId(99),
                page: 0,
            },
            DUP,
        );
        assert_eq!(l.end_round(1, SEC), vec![]);
    }

    #[test]
    fn only_sampled_regions_are_judged() {
        let mut l = ladder();
        l.insert(RegionId(1), 10, 0);
        l.insert(RegionId(2), 10, 0);
        l.set_interval(0, 20);
        // 20 pages at interval 20 from an offset in 0..20: exactly one
        // sample, in region 1 or 2.
        let seen = run_round(&mut l, 0, &[DUP]);
        assert_eq!(seen.len(), 1);
        let moves = l.end_round(0, SEC);
        let hit = seen[0].region;
        let other = if hit == RegionId(1) {
            RegionId(2)
        } else {
            RegionId(1)
        };
        assert_eq!(moves, vec![Move::Climb { region: hit, to: 1 }]);
        assert_eq!(l.level_of(other), Some(0));
        assert_eq!(l.region_stats(other).unwrap().judged, 0);
    }

    #[test]
    fn remove_mid_round() {
        let mut l = ladder();
        let (a, b, c) = (RegionId(1), RegionId(2), RegionId(3));
        l.insert(a, 10, 0);
        l.insert(b, 10, 0);
        l.insert(c, 10, 0);
        l.start_round(0);
        for _ in 0..3 {
            let p = l.next_sample(0).unwrap();
            assert_eq!(p.region, a);
            l.record(p, DUP);
        }
        // The cursor's region leaves: the round continues at b's start.
        assert!(l.remove(a));
        assert!(!l.remove(a));
        assert_eq!(l.level_of(a), None);
        assert_eq!(l.region_stats(a), None);
        // A region ahead of the cursor leaves: its pages just vanish.
        assert!(l.remove(c));
        let rest: Vec<PageRef> = std::iter::from_fn(|| l.next_sample(0)).collect();
        assert_eq!(rest.len(), 10);
        assert!(rest.iter().all(|p| p.region == b));
        // a was sampled but is gone: not judged.
        // b was sampled with nothing recorded: a drop, floored at the bottom.
        let moves = l.end_round(0, SEC);
        assert_eq!(moves, vec![Move::Stay { region: b }]);
        assert_eq!(l.level_pages(0), 10);
    }

    #[test]
    fn remove_with_cursor_past_the_region_keeps_the_stride() {
        let mut l = ladder();
        let (a, b, c) = (RegionId(1), RegionId(2), RegionId(3));
        l.insert(a, 10, 0);
        l.insert(b, 1, 0);
        l.insert(c, 100, 0);
        l.set_interval(0, 15);
        // The offset is random in 0..15; retry until the first sample
        // lands in a (offset < 10). The next point, 15 pages on, is then
        // in c (pages 11..111), past the one-page b.
        loop {
            l.start_round(0);
            if l.next_sample(0).unwrap().region == a {
                break;
            }
        }
        let undisturbed = l.clone();
        // a leaving must not move the next points: the rest of the round
        // is exactly what it would have been.
        l.remove(a);
        let got: Vec<PageRef> = std::iter::from_fn(|| l.next_sample(0)).collect();
        let mut twin = undisturbed;
        let want: Vec<PageRef> = std::iter::from_fn(|| twin.next_sample(0)).collect();
        assert_eq!(got[0].region, c);
        assert_eq!(got, want);
    }

    #[test]
    fn joining_mid_round_does_not_disturb_the_cursor() {
        let mut l = ladder();
        l.insert(RegionId(1), 10, 0);
        l.insert(RegionId(2), 10, 0);
        l.start_round(0);
        let mut seen: Vec<PageRef> = (0..5).map(|_| l.next_sample(0).unwrap()).collect();
        // A new region joins: it is appended behind the cursor, and passed
        // over until the next round (its samples could not judge it).
        l.insert(RegionId(3), 10, 0);
        assert!(!l.round_finished(0));
        seen.extend(std::iter::from_fn(|| l.next_sample(0)));
        assert_eq!(seen.len(), 20);
        assert!(seen.iter().all(|p| p.region != RegionId(3)));
        l.end_round(0, SEC);
        l.start_round(0);
        seen.extend(std::iter::from_fn(|| l.next_sample(0)).filter(|p| p.region == RegionId(3)));
        for r in 1..=3 {
            let pages: BTreeSet<u32> = seen
                .iter()
                .filter(|p| p.region == RegionId(r))
                .map(|p| p.page)
                .collect();
            assert_eq!(pages, (0..10).collect(), "region {r}");
        }
    }

    /// A region that climbs into a level while that level's round is
    /// under way is passed over for the rest of that round, and a sample
    /// recorded for it anyway (a hint) gives no verdict: it stays on its
    /// new level. (It used to be sampled and judged on the round's tail,
    /// and dropped as too young, so twins arriving mid-round went back
    /// and forth between two levels.) The next round, a whole one, judges
    /// it.
    #[test]
    fn climbing_into_a_level_mid_round() {
        let mut l = ladder();
        let (a, b) = (RegionId(1), RegionId(2));
        l.insert(a, 10, 0);
        run_round(&mut l, 0, &[DUP]);
        l.end_round(0, SEC); // a climbs to 1
        l.insert(b, 10, 0);
        l.start_round(1);
        let first: Vec<PageRef> = (0..4).map(|_| l.next_sample(1).unwrap()).collect();
        run_round(&mut l, 0, &[DUP]);
        assert_eq!(l.end_round(0, SEC), vec![Move::Climb { region: b, to: 1 }]);
        let rest: Vec<PageRef> = std::iter::from_fn(|| l.next_sample(1)).collect();
        assert!(first.iter().all(|p| p.region == a));
        assert_eq!(rest.len(), 6);
        assert!(rest.iter().all(|p| p.region == a));
        for p in first.iter().chain(&rest) {
            l.record(*p, DUP);
        }
        // A unique page of b recorded on its own (a hint).
        l.record(PageRef { region: b, page: 3 }, PLAIN);
        let moves = l.end_round(1, 2 * SEC);
        assert!(moves.contains(&Move::Stay { region: b }), "{moves:?}");
        assert_eq!(l.level_of(b), Some(1));
        // The next round is a whole one: b is sampled and judged on it.
        let seen = run_round(&mut l, 1, &[DUP]);
        assert_eq!(seen.iter().filter(|p| p.region == b).count(), 10);
        let moves = l.end_round(1, 3 * SEC);
        assert!(
            moves.contains(&Move::Climb { region: b, to: 2 }),
            "{moves:?}"
        );
    }

    #[test]
    fn resize_keeps_level_and_restarts_the_pass() {
        let (mut l, id) = region_at(1);
        l.start_round(1);
        l.next_sample(1).unwrap();
        l.resize(id, 25);
        assert_eq!(l.level_of(id), Some(1));
        assert_eq!(l.level_pages(1), 25);
        let s = l.region_stats(id).unwrap();
        assert_eq!((s.pages, s.pass_progress, s.round.sampled), (25, 0, 1));
        // Interval 1, one page done: the other 24 pages of the grown
        // region follow, all distinct.
        let rest: Vec<PageRef> = std::iter::from_fn(|| l.next_sample(1)).collect();
        assert_eq!(rest.len(), 24);
        let distinct: BTreeSet<u32> = rest.iter().map(|p| p.page).collect();
        assert_eq!(distinct.len(), 24);
        assert!(rest.iter().all(|p| p.page < 25));
        // Shrinking mid-round ends the round sooner.
        l.start_round(1);
        l.next_sample(1).unwrap();
        l.resize(id, 3);
        assert_eq!(std::iter::from_fn(|| l.next_sample(1)).count(), 2);
        assert!(l.round_finished(1));
        l.resize(RegionId(99), 5); // unknown: ignored
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn reinserting_replaces() {
        let (mut l, id) = region_at(2);
        l.insert(id, 4, 5);
        assert_eq!(l.level_of(id), Some(0));
        assert_eq!(l.level_pages(2), 0);
        assert_eq!(l.level_pages(0), 4);
        let s = l.region_stats(id).unwrap();
        assert_eq!((s.inserted_at, s.judged, s.total.sampled), (5, 0, 0));
    }

    #[test]
    fn tombstones_are_swept_without_disturbing_a_round() {
        let mut l = ladder();
        for i in 0..200 {
            l.insert(RegionId(i), 5, 0);
        }
        l.set_interval(0, 3);
        l.start_round(0);
        let first = l.next_sample(0).unwrap();
        // Remove most regions ahead of the cursor: enough to sweep.
        for i in 0..200 {
            if i % 4 != 0 && RegionId(i) != first.region {
                assert!(l.remove(RegionId(i)));
            }
        }
        assert!(l.levels[0].space.slots.len() < 200, "tombstones swept");
        let live = l.regions_at(0);
        assert_eq!(l.level_pages(0), 5 * live.len() as u64);
        // The rest of the round walks the survivors at the interval.
        let rest: Vec<PageRef> = std::iter::from_fn(|| l.next_sample(0)).collect();
        let total = l.level_pages(0);
        assert!(rest.len() as u64 >= total / 3 - 2 && rest.len() as u64 <= total / 3 + 1);
        assert!(rest.iter().all(|p| live.contains(&p.region)));
    }

    #[test]
    fn permutation_small_domains_are_bijections() {
        for n in 0..=257u32 {
            for seed in 0..4 {
                let p = OffsetPermutation::new(n, seed);
                let got: BTreeSet<u32> = (0..n).map(|i| p.get(i)).collect();
                assert_eq!(got.len(), n as usize, "n={n} seed={seed}");
                assert!(got.iter().all(|&x| x < n.max(1)));
            }
        }
        // Different seeds give different orders.
        let a: Vec<u32> = (0..100)
            .map(|i| OffsetPermutation::new(100, 1).get(i))
            .collect();
        let b: Vec<u32> = (0..100)
            .map(|i| OffsetPermutation::new(100, 2).get(i))
            .collect();
        assert_ne!(a, b);
    }

    #[test]
    fn permutation_of_a_huge_region_is_cheap() {
        // 2^32 - 1 pages (16 TiB): no array, O(1) per element.
        let p = OffsetPermutation::new(u32::MAX, 9);
        let xs: HashSet<u32> = (0..10_000).map(|i| p.get(i)).collect();
        assert_eq!(xs.len(), 10_000);
    }

    #[test]
    #[should_panic(expected = "out of 0..5")]
    fn permutation_index_out_of_range() {
        OffsetPermutation::new(5, 0).get(5);
    }

    #[test]
    fn ratio_arithmetic() {
        let c = SampleCounts {
            sampled: 20,
            recorded: 20,
            duplicates: 6,
            merged: 0,
            cow_broken: 2,
        };
        assert_eq!(c.cow_ratio(), 2.0 / 6.0);
        assert_eq!(c.dup_ratio(0.5), 0.2);
        assert_eq!(c.dup_ratio(0.3), 0.0);
        // COW breaks without duplicates: nothing to net, ratio 0.
        let c = SampleCounts {
            sampled: 10,
            recorded: 10,
            cow_broken: 3,
            ..Default::default()
        };
        assert_eq!(c.dup_ratio(1.0), 0.0);
        assert_eq!(SampleCounts::default().dup_ratio(0.5), 0.0);
        assert!(!SampleCounts::default().all_merged());
    }

    /// Operations for the random-sequence property test.
    #[derive(Clone, Debug)]
    enum Op {
        Insert(u32),
        Remove(usize),
        Resize(usize, u32),
        Sample(usize, usize, u8),
        Hint(usize, u8),
        StartRound(usize),
        EndRound(usize, Nanos),
        SetInterval(usize, u64),
        Park(usize),
        Readmit(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => (0u32..300).prop_map(Op::Insert),
            1 => any::<usize>().prop_map(Op::Remove),
            1 => (any::<usize>(), 0u32..300).prop_map(|(i, p)| Op::Resize(i, p)),
            4 => (0usize..4, 1usize..60, any::<u8>()).prop_map(|(l, n, k)| Op::Sample(l, n, k)),
            1 => (any::<usize>(), any::<u8>()).prop_map(|(i, k)| Op::Hint(i, k)),
            2 => (0usize..4).prop_map(Op::StartRound),
            2 => (0usize..4, 0u64..300_000_000).prop_map(|(l, t)| Op::EndRound(l, t)),
            1 => (0usize..4, 1u64..50).prop_map(|(l, k)| Op::SetInterval(l, k)),
            1 => any::<usize>().prop_map(Op::Park),
            1 => any::<usize>().prop_map(Op::Readmit),
        ]
    }

    fn outcome(k: u8) -> Sample {
        Sample {
            duplicate: k.is_multiple_of(3),
            merged: k % 7 == 1,
            cow_broken: k % 11 == 2,
        }
    }

    fn check_invariants(l: &Ladder, live: &HashMap<RegionId, u32>) -> Result<(), TestCaseError> {
        let mut seen = HashSet::new();
        for lv in 0..l.levels() {
            let at = l.regions_at(lv);
            let mut pages = 0u64;
            for id in at {
                prop_assert!(seen.insert(id), "{id:?} on two levels");
                prop_assert_eq!(l.level_of(id), Some(lv));
                prop_assert!(live.contains_key(&id), "{:?} not live", id);
                if !l.is_parked(id) {
                    pages += u64::from(live[&id]);
                }
            }
            prop_assert_eq!(l.level_pages(lv), pages);
        }
        prop_assert_eq!(seen.len(), live.len(), "every live region on one level");
        prop_assert_eq!(l.len(), live.len());
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        /// Any sequence of operations keeps every live region on exactly
        /// one level, level sizes right, samples inside their regions and
        /// moves consistent with the levels they report.
        #[test]
        fn random_operations_keep_the_ladder_consistent(
            ops in prop::collection::vec(op(), 1..120),
            seed in any::<u64>(),
        ) {
            let mut l = Ladder::new(LadderConfig::default(), seed);
            let mut live: HashMap<RegionId, u32> = HashMap::new();
            let mut order: Vec<RegionId> = Vec::new();
            let mut next_id = 0u64;
            let mut now: Nanos = 0;
            for op in ops {
                match op {
                    Op::Insert(pages) => {
                        next_id += 1;
                        let id = RegionId(next_id);
                        l.insert(id, pages, now);
                        live.insert(id, pages);
                        order.push(id);
                    }
                    Op::Remove(i) if !order.is_empty() => {
                        let id = order.remove(i % order.len());
                        prop_assert!(l.remove(id));
                        live.remove(&id);
                    }
                    Op::Resize(i, pages) if !order.is_empty() => {
                        let id = order[i % order.len()];
                        l.resize(id, pages);
                        live.insert(id, pages);
                    }
                    Op::Sample(lv, n, k) => {
                        for j in 0..n {
                            let Some(p) = l.next_sample(lv) else {
                                prop_assert!(l.round_finished(lv));
                                break;
                            };
                            prop_assert_eq!(l.level_of(p.region), Some(lv));
                            prop_assert!(!l.is_parked(p.region), "a parked region sampled");
                            prop_assert!(p.page < live[&p.region]);
                            l.record(p, outcome(k.wrapping_add(j as u8)));
                        }
                    }
                    Op::Hint(i, k) if !order.is_empty() => {
                        let id = order[i % order.len()];
                        if live[&id] > 0 {
                            l.record(PageRef { region: id, page: 0 }, outcome(k));
                        }
                    }
                    Op::StartRound(lv) => l.start_round(lv),
                    Op::EndRound(lv, dt) => {
                        now += dt;
                        let before: HashMap<RegionId, usize> = live
                            .keys()
                            .map(|&id| (id, l.level_of(id).unwrap()))
                            .collect();
                        for m in l.end_round(lv, now) {
                            let id = m.region();
                            prop_assert_eq!(before[&id], lv, "judged off its level");
                            prop_assert!(!l.is_parked(id), "a parked region judged");
                            let after = l.level_of(id).unwrap();
                            match m {
                                Move::Climb { to, .. } => {
                                    prop_assert_eq!(to, lv + 1);
                                    prop_assert_eq!(after, to);
                                }
                                Move::Drop { to, .. } => {
                                    prop_assert_eq!(to + 1, lv);
                                    prop_assert_eq!(after, to);
                                }
                                Move::Bottom { .. } => {
                                    prop_assert!(lv > 0);
                                    prop_assert_eq!(after, 0);
                                }
                                Move::Stay { .. } => prop_assert_eq!(after, lv),
                            }
                        }
                        prop_assert!(l.round_finished(lv));
                    }
                    Op::SetInterval(lv, k) => l.set_interval(lv, k),
                    Op::Park(i) if !order.is_empty() => {
                        let id = order[i % order.len()];
                        let was = l.is_parked(id);
                        let level = l.level_of(id);
                        prop_assert_eq!(l.park(id), !was);
                        prop_assert!(l.is_parked(id));
                        prop_assert_eq!(l.level_of(id), level, "parking keeps the level");
                    }
                    Op::Readmit(i) if !order.is_empty() => {
                        let id = order[i % order.len()];
                        let was = l.is_parked(id);
                        prop_assert_eq!(l.readmit(id), was);
                        prop_assert!(!l.is_parked(id));
                    }
                    _ => {}
                }
                check_invariants(&l, &live)?;
            }
        }

        /// One round over a level takes level_pages / interval samples,
        /// within one (the brief allows ± the number of regions).
        #[test]
        fn samples_per_round_follow_the_interval(
            sizes in prop::collection::vec(0u32..500, 1..40),
            interval in 1u64..200,
            seed in any::<u64>(),
        ) {
            let mut l = Ladder::new(LadderConfig::default(), seed);
            for (i, &s) in sizes.iter().enumerate() {
                l.insert(RegionId(i as u64), s, 0);
            }
            l.set_interval(0, interval);
            let total = l.level_pages(0);
            for _ in 0..3 {
                l.start_round(0);
                let n = std::iter::from_fn(|| l.next_sample(0)).count() as u64;
                prop_assert!(n >= total / interval && n <= total.div_ceil(interval),
                    "{n} samples for {total} pages at {interval}");
                l.end_round(0, 0);
            }
        }

        /// The Fenwick flat space agrees with a plain list under any mix of
        /// joins, leaves (including tombstone sweeps) and resizes.
        #[test]
        fn flat_space_matches_a_plain_list(
            ops in prop::collection::vec((0u8..3, any::<usize>(), 0u64..50), 1..400),
        ) {
            let mut space = FlatSpace::default();
            // (seq, pages) of live members, in order.
            let mut naive: Vec<(u64, u64)> = Vec::new();
            let mut seq = 0;
            for (kind, pick, pages) in ops {
                match kind {
                    0 => {
                        seq += 1;
                        space.push(seq, RegionId(seq), pages);
                        naive.push((seq, pages));
                    }
                    1 if !naive.is_empty() => {
                        let (s, _) = naive.remove(pick % naive.len());
                        space.kill(space.index_of(s).unwrap());
                    }
                    2 if !naive.is_empty() => {
                        let j = pick % naive.len();
                        naive[j].1 = pages;
                        space.set_pages(space.index_of(naive[j].0).unwrap(), pages);
                    }
                    _ => {}
                }
                let total: u64 = naive.iter().map(|m| m.1).sum();
                prop_assert_eq!(space.total, total);
                prop_assert_eq!(space.live, naive.len());
                let ids: Vec<RegionId> = space.members().collect();
                let want: Vec<RegionId> = naive.iter().map(|m| RegionId(m.0)).collect();
                prop_assert_eq!(ids, want);
                // Every member's first page, and the owner of every page.
                let mut start = 0;
                for &(s, pages) in &naive {
                    let c = Cursor { seq: s, offset: 0 };
                    prop_assert_eq!(space.position(c), start);
                    for pos in [start, start + pages.saturating_sub(1)] {
                        if pages > 0 {
                            let (i, first) = space.find(pos);
                            prop_assert_eq!(space.slots[i].seq, s);
                            prop_assert_eq!(first, start);
                        }
                    }
                    start += pages;
                }
            }
        }

        /// The permutation is a bijection of 0..n for any n and seed.
        #[test]
        fn permutation_is_a_bijection(n in 1u32..20_000, seed in any::<u64>()) {
            let p = OffsetPermutation::new(n, seed);
            let mut hit = vec![false; n as usize];
            for i in 0..n {
                let x = p.get(i) as usize;
                prop_assert!(x < n as usize);
                prop_assert!(!hit[x], "{} twice", x);
                hit[x] = true;
            }
        }

        /// Through the ladder, whatever the interval and neighbours, a
        /// region's samples come in passes that each visit every page
        /// exactly once.
        #[test]
        fn passes_visit_every_page_exactly_once(
            n in 1u32..300,
            others in prop::collection::vec(1u32..300, 0..5),
            interval in 1u64..20,
            seed in any::<u64>(),
        ) {
            let mut l = Ladder::new(LadderConfig::default(), seed);
            let target = RegionId(0);
            l.insert(target, n, 0);
            for (i, &s) in others.iter().enumerate() {
                l.insert(RegionId(i as u64 + 1), s, 0);
            }
            l.set_interval(0, interval);
            let mut pages = Vec::new();
            let mut rounds = 0;
            while pages.len() < 2 * n as usize {
                rounds += 1;
                prop_assert!(rounds < 100_000);
                l.start_round(0);
                while let Some(p) = l.next_sample(0) {
                    if p.region == target {
                        pages.push(p.page);
                    }
                }
                // Judging must not move it away: nothing is recorded, so
                // it stays at the bottom.
                l.end_round(0, 0);
            }
            for pass in pages.chunks(n as usize).take(2) {
                let set: BTreeSet<u32> = pass.iter().copied().collect();
                prop_assert_eq!(set.len(), n as usize);
            }
            prop_assert!(l.region_stats(target).unwrap().passes >= 2);
        }
    }
}
