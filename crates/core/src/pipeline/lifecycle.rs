//! The lifecycle of a region: sampled, marked and merging, settled, held,
//! foreign; and which regions the ladder must not see.
//!
//! ## The modes
//! - **Sampling**: on the ladder, not mergeable (every region starts here).
//! - **Promoted**: marked `MADV_MERGEABLE` by pagesift. While ksmd is still
//!   *merging* it, it is hidden from the ladder (sampling it would only
//!   re-find the duplicates that got it promoted); once *settled* it goes
//!   back to the ladder at the bottom, so that its merged pages feed the
//!   stable index and it can climb again.
//! - **Held** until T: unmarked for thrashing, or its writes would make it
//!   thrash once merged. Hidden from the ladder: a region that cannot be
//!   promoted before T would otherwise climb back and take its level's CPU
//!   share, sampled round after round for nothing (UKSM's thrash filter
//!   zeroes the ratio instead, so a thrashing region sinks). The n-th hold
//!   lasts the base hold × 2^(n−1), at most [`MAX_HOLD`] ([`hold_time`]):
//!   a region that keeps thrashing is tried less and less often.
//! - **Foreign**: made mergeable by its own process (or merge-any). It is
//!   accounted, counted for pacing, hidden while merging and merged again
//!   when it climbs back to the top like a promoted region, but never
//!   marked, unmarked or held by pagesift. (Left on the ladder while
//!   merging, it climbed to the top level and stayed there, since pagesift
//!   has nothing to mark in it, and the top level's 95 % share sampled it
//!   round after round: 7.7 of the daemon's 13 CPU-s in `pagesift bench
//!   --quick --only page-cache` on 2026-11-27, whose QEMUs merge their own
//!   RAM.)
//!
//! ## The transitions ([`Lifecycles`]' methods)
//! | from | event | to |
//! |---|---|---|
//! | sampling, promoted, foreign | [`mark`](Lifecycles::mark) (the kernel took `MADV_MERGEABLE`) | promoted, merging |
//! | promoted or foreign, settled | [`remerge`](Lifecycles::remerge) (back at the top: new duplicates) | the same, merging |
//! | promoted or foreign, merging | a pass of [`record`](Lifecycles::record) that settles it | settled |
//! | any | [`hold`](Lifecycles::hold) (thrashing, hot writes, a failed or ignored mark) | held until now + hold time |
//! | held until T | [`release_due`](Lifecycles::release_due) or [`release`](Lifecycles::release) at or after T | sampling |
//! | not foreign | [`foreign`](Lifecycles::foreign) (its process took it over) | foreign, merging |
//! | foreign | [`stop_foreign`](Lifecycles::stop_foreign) (its process unmarked it) | sampling |
//! | promoted | [`trimmed`](Lifecycles::trimmed) (all of it was a trimmed stretch) | sampling |
//! | sampling | [`adopt_settled`](Lifecycles::adopt_settled) (a marked piece of a trimmed region) | promoted, settled |
//! | sampling, new | [`inherit_hold`](Lifecycles::inherit_hold) (it lies mostly over held regions) | held until their hold ends |
//!
//! ## A hold outlives the region's id
//! A region is a VMA (or a 64 MiB piece of one), and its id goes with the
//! VMA's range. Unmarking a thrashing region can make its VMA one with a
//! neighbour that has the same flags (the kernel joins adjacent anonymous
//! VMAs), and marking a run next to a held region splits it: either way
//! the held pages come back under a new id, sampled from scratch, and
//! were promoted and broken again well within the hold. In `pagesift
//! bench --full --only short-lived-2000ms --systems pagesift-full`
//! (2026-12-03, 2-CPU Xeon, the daemon's log read by hand) the
//! workload's heap was demoted for thrashing, came back 3 s later as a
//! region joined with its neighbour, had three runs marked in it at once
//! and was demoted again 16 s later, 711 COW breaks more. So a region new
//! to the books that lies at least half over held regions of the same
//! process takes their hold over ([`HeldState`]: the latest end, the most
//! holds, and whether any was held since a write watch cleared it).
//!
//! ## Settling and COW accounting
//! Promoted and foreign regions are accounted in passes over their pages
//! (the caller reads the page states, pagemap + kpageflags; this module
//! only counts them). A bit per page remembers pages seen merged (KSM page
//! or zero page); such a page later present but not merged is a COW break,
//! added to the region's `cow_total`. A region is *settled* once a pass
//! that started `settle_scans` ksmd full scans after it was marked has
//! ended: by then ksmd has visited each of its pages at least twice, enough
//! to merge every page that can be (KSM merges a page on its second visit,
//! `mm/ksm.c`); a pass that finds pages merged and none unmerged settles
//! it at once (one that finds nothing present at all does not: the region
//! may be filled next, and meanwhile it counts whole for ksmd's pace, as
//! a fresh promotion). A
//! pass that began before that scan cannot settle the region: once the
//! scan is done, [`prepare_passes`](Lifecycles::prepare_passes) restarts
//! it instead of finishing a useless one.
//!
//! ## Passes of merging regions
//! A merging region is passed over again `merging_every` after its last
//! pass ended, and not before ksmd has moved `merging_gap` thousandths of
//! a full scan past where it was then (its position comes from
//! [`crate::pipeline::scan_clock`] through
//! [`set_scan_position`](Lifecycles::set_scan_position)): its pages change
//! state when ksmd visits them or their twins, about once per full scan,
//! so a look before ksmd has moved on reads the same states again. A ksmd
//! that stands still (or a position that is not known) does not stop the
//! passes: one is due `settled_every` after the last ended at the latest,
//! and without a position time alone decides, as before. Settled regions
//! are passed over for the breaks ksmd does not cause, by time only.
//!
//! What a merging region asks of ksmd's pace is
//! [`Lifecycle::waiting_pages`]: its unmerged pages, narrowed to those
//! still expected to merge (when the caller said how many it expects,
//! once ksmd has passed over all of it) or
//! to an eighth once it is quiet (nothing newly merged in two passes, two
//! full scans after its mark), since each page waiting costs ksmd a scan
//! of every mergeable page and what is left of a quiet region is mostly
//! unique. A region merged again counts its expected new merges from the
//! start: the rest of it was merged before, or stayed unique.
//!
//! At the end of each pass a promoted region is flagged for demotion when
//! its COW-broken ratio was above V_cow in [`THRASHING_PASSES`] passes,
//! each within [`THRASHING_WINDOW`] settled-pass intervals of the one
//! before (a minute under the defaults; passes below V_cow in between do
//! not clear the count): breaks in a pass over the larger
//! of the pages newly seen merged in it and the pages merged at the end of
//! the previous pass (UKSM's `cal_dedup_ratio` has the first alone, which
//! calls any region with steady churn thrashing). Each such pass needs a
//! pass before it, at least `min_merged` pages merged before and
//! `min_breaks` breaks; V_cow = 100 % turns demotion off. The caller unmarks a flagged region, then
//! [`hold`](Lifecycles::hold)s it. Why not simply two passes in a row: a
//! region whose merged pages are written soon after it settles climbs
//! back to the top and merges again ([`remerge`](Lifecycles::remerge))
//! before a settled region's next pass (`settled_every`), so each round's
//! breaks are seen by the first pass of the next round only, and the
//! passes that watch it merge again, and the settled one soon after, are
//! below V_cow. Counted in a row, that never thrashed: under the default
//! config a 118-page heap of `pagesift-workload short-lived` (1 s cycles)
//! was merged and broken again every 5 s, 230 COW breaks in 25 s (the
//! daemon's count in its log, 2026-11-28). For
//! the same reason the pass before a round's first one may be the last
//! round's: the passes since the mark count (`marked_passes`), not the
//! round's.
//!
//! ## Trimming a settled region
//! A second bit per page remembers pages the last look found present and
//! not merged. Once a promoted region has settled, those pages are unique
//! or volatile: ksmd has visited each at least twice and merged nothing
//! there. Yet every later full scan visits them again, and they are its
//! dear pages: a checksum, a search of the stable tree and one of the
//! unstable tree, which is rebuilt at every full scan, where a merged page
//! costs a page-table walk. pagesift marks whole regions because that is
//! where the saving is found, but in three booting guests about 45 % of
//! what it had marked never merged (`pagesift bench --quick --only
//! vm-boot`, 2026-12-02, KSM's counters at the window's end, by hand:
//! 33.7 k pages unshared and 26.7 k volatile of about 140 k marked), and
//! each promotion asks ksmd for three full scans of all of it. So the
//! caller may unmark (an option, off by default: on a host whose ksmd is
//! starved of CPU it saved nothing and cost the daemon more,
//! docs/trimming.md) the long stretches of such pages
//! ([`Lifecycle::unmerged_stretches`]): the rest of the region stays
//! marked and settled ([`adopt_settled`](Lifecycles::adopt_settled) for
//! the pieces that become regions of their own), the stretches become
//! sampling regions at the bottom of the ladder, which climb again, or
//! whose runs are marked, if duplicates appear in them later. Pages not
//! present stay marked: a guest fills its untouched RAM with the page
//! cache of files that other guests read too.
//!
//! ## Breaks between settled passes
//! A settled region is passed over only every `settled_every` (30 s under
//! the defaults). A page broken and merged again by ksmd within that time
//! is merged at both looks, and its break is never counted: a region whose
//! merged pages are rewritten every few seconds with content ksmd merges
//! again thrashes unseen, its process taking a COW fault on every write.
//! The kernel counts every such copy machine-wide (`/proc/vmstat`
//! `cow_ksm`), so the caller compares that count with the breaks its
//! passes found and, when more happened than it saw, calls
//! [`hasten_settled_passes`](Lifecycles::hasten_settled_passes): every
//! settled region is passed over again at once (at most once per
//! `min_gap`), while the broken pages are likely still unmerged (ksmd
//! at its trickle takes seconds to minutes to come round). Breaks in
//! other processes' KSM pages move the passes too; the caller's
//! accounting budget still bounds what they cost. Breaks ksmd merges
//! again before the caller's next look at `cow_ksm` (about a second) stay
//! unseen: in the simulated loop test, with ksmd coming round every 2 s,
//! the region is demoted after two rounds of 10 s (12 runs of 12), and
//! without `cow_ksm` not within 14 rounds in 9 runs of 12; with ksmd
//! coming round every second, not either way (one run by hand).
//!
//! ## Invariants (kept by [`Lifecycles`], property-tested below)
//! - **hidden ⇔ held or merging**: the hidden set is exactly the regions
//!   that are held, or promoted or foreign and not settled. Every transition goes
//!   through [`Lifecycles`], which recomputes the region's visibility
//!   after it, so holding a region hides it and releasing it shows it by
//!   construction; every change of visibility (and every hold) raises the
//!   flag [`take_view_changed`](Lifecycles::take_view_changed) returns, so
//!   the caller knows when to re-sync the ladder's view.
//! - a region is in one mode: never held and promoted at once; a held
//!   region is not marked before its hold ends;
//! - a region held since a write watch last found it cold all over
//!   ([`Lifecycle::held_since_cleared`]) is cold again only when a watch
//!   says so ([`Lifecycles::clear_writes`]): released, it re-enters the
//!   ladder at the bottom, where nothing is watched, and "not watched"
//!   must not pass for "not written" (in `pagesift bench --only
//!   short-lived`, 2026-11-27, a heap held for hot writes had a sampled
//!   run marked about 7 s later, its writes unseen);
//! - a hold ends only at or after its `until` (or when the region's own
//!   process takes it over: then pagesift has nothing left to hold back);
//! - the n-th hold lasts [`hold_time`]`(base, n)`: the base doubled n−1
//!   times, never shorter than the base, at most [`MAX_HOLD`];
//! - `cow_total` never decreases; `cursor < pages` between passes, and
//!   the seen-merged bits cover exactly `pages` pages.
//!
//! Pure: time and ksmd's full-scan count are passed in.

use crate::source::PageState;
use crate::{Nanos, RegionId};
use std::collections::{BTreeMap, BTreeSet};

const SEC: Nanos = 1_000_000_000;

/// ksmd full scans after marking before a pass can settle a region (see
/// the module header).
pub const SETTLE_SCANS: u64 = 3;

/// The share of a quiet merging region's pages that counts as waiting for
/// ksmd (see [`Lifecycle::waiting_pages`]): an eighth. pagesift's choice.
pub const QUIET_WAITING_DIVISOR: u64 = 8;

/// Longest hold of a region.
pub const MAX_HOLD: Nanos = 3600 * SEC;

/// Passes above V_cow (within [`THRASHING_WINDOW`]) that flag a promoted
/// region for demotion.
/// One is a burst: a booting guest rewrote all 2 512 merged pages of a
/// 64 MiB region of its RAM within a pass, once (`pagesift bench --quick
/// --only vm-boot`, 2026-11-26, in two of the seven runs read), and the region, held
/// for `actuate.demote_hold_s`, left about 60 MiB unmerged for the rest
/// of the window. Pages rewritten with new content are no duplicates and
/// are not merged again; only a region whose pages merge and break again
/// is above V_cow again soon. pagesift's choice.
pub const THRASHING_PASSES: u32 = 2;

/// Settled-pass intervals (`AccountRules::settled_every`) within which
/// passes above V_cow count together (see the module header): two, a
/// minute under the defaults. pagesift's choice.
pub const THRASHING_WINDOW: u64 = 2;

/// The `n`-th hold of a region (`n` ≥ 1): `base_s` seconds, doubling with
/// each hold, at most [`MAX_HOLD`].
pub fn hold_time(base_s: u64, n: u32) -> Nanos {
    base_s
        .saturating_mul(SEC)
        .saturating_mul(1u64 << n.saturating_sub(1).min(20))
        .min(MAX_HOLD)
}

/// What pagesift does with a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// On the ladder, not mergeable.
    Sampling,
    /// Made mergeable by pagesift.
    Promoted,
    /// Unmarked for thrashing (or never marked: its writes would make it
    /// thrash); not promoted before `until`.
    Held {
        /// End of the hold.
        until: Nanos,
    },
    /// Made mergeable by its own process.
    Foreign,
}

/// A hold as the region that replaces a held one takes it over
/// ([`Lifecycles::inherit_hold`]; the module header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeldState {
    /// End of the hold.
    pub until: Nanos,
    /// How often the region was held (the next hold doubles from here).
    pub holds: u32,
    /// Held since a write watch last found it cold all over.
    pub since_cleared: bool,
}

impl HeldState {
    /// The hold of a region that lies over both: the later end, the more
    /// holds, held since cleared if either was.
    pub fn join(self, other: HeldState) -> HeldState {
        HeldState {
            until: self.until.max(other.until),
            holds: self.holds.max(other.holds),
            since_cleared: self.since_cleared || other.since_cleared,
        }
    }
}

/// Counts of one accounting pass over a region.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Pages merged (KSM page or zero page).
    pub merged: u64,
    /// Merged now, not seen merged by the previous look at the page.
    pub fresh: u64,
    /// Present, not merged.
    pub present: u64,
    /// COW breaks: seen merged before, present and not merged now.
    pub cow: u64,
}

/// The rules of accounting passes (see the module header).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AccountRules {
    /// ksmd full scans after marking before a pass can settle a region.
    pub settle_scans: u64,
    /// A region still merging is passed over again this long after its
    /// last pass ended (settling follows ksmd's full scans).
    pub merging_every: Nanos,
    /// ... and once ksmd has moved this many thousandths of a full scan
    /// past where it was when that pass ended
    /// ([`Lifecycles::set_scan_position`], "Passes of merging regions" in
    /// the module header), or `settled_every` after it ended; 0: time
    /// only.
    pub merging_gap: u64,
    /// A settled region is passed over again this long after its last
    /// pass ended (only to notice COW breaks).
    pub settled_every: Nanos,
    /// V_cow: the COW-broken ratio above which a promoted region thrashes
    /// (1.0: never).
    pub v_cow: f64,
    /// Fewest pages merged at the end of the previous pass for a demotion.
    pub min_merged: u64,
    /// Fewest COW breaks in one pass for a demotion.
    pub min_breaks: u64,
}

impl Default for AccountRules {
    fn default() -> Self {
        AccountRules {
            settle_scans: SETTLE_SCANS,
            merging_every: SEC,
            merging_gap: 0,
            settled_every: 30 * SEC,
            v_cow: 0.5,
            min_merged: 16,
            min_breaks: 16,
        }
    }
}

/// What the end of an accounting pass decided.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassEnd {
    /// The region settled with this pass.
    pub settled: bool,
    /// A promoted region thrashes: the caller should unmark it.
    pub demote: bool,
}

/// The lifecycle of one region. Read-only outside this module: its
/// transitions go through [`Lifecycles`], which keeps the hidden set.
#[derive(Clone, Debug)]
pub struct Lifecycle {
    mode: Mode,
    settled: bool,
    holds: u32,
    /// `holds` when a write watch last found it cold all over.
    cleared_holds: u32,
    /// ksmd full scans when it was marked (or first seen mergeable).
    marked_scan: u64,
    /// When ksmd got it (marked, or first seen mergeable).
    merging_since: Nanos,
    cow_total: u64,
    /// Passes above V_cow, each within [`THRASHING_WINDOW`] settled
    /// intervals of the one before (passes below V_cow in between neither
    /// count nor clear; see the module header).
    thrashing_passes: u32,
    /// When the last pass above V_cow ended.
    last_above: Option<Nanos>,
    /// Passes in a row, since it was last marked, that found nothing newly
    /// merged.
    quiet_passes: u32,
    /// Pages expected merged once it settles, if the caller said
    /// ([`Lifecycles::expect`]); forgotten when it starts merging again.
    expected: Option<u64>,
    /// Pages merged when it was merged again ([`Lifecycles::remerge`]):
    /// `Some` in a round of merging again, `None` in one that began with
    /// a mark. An expectation then counts from the round's start.
    remerged_from: Option<u64>,
    pages: u32,
    /// A bit per page: seen merged by the last look at it.
    seen_merged: Vec<u64>,
    /// A bit per page: seen present and not merged by the last look at
    /// it (what [`Lifecycle::unmerged_stretches`] trims).
    seen_unmerged: Vec<u64>,
    cursor: u32,
    pass: PassCounts,
    last: PassCounts,
    passes: u64,
    /// Passes ended since it was marked (or first seen mergeable): unlike
    /// `passes`, not restarted when it merges again, so that the breaks
    /// the first pass after that finds are weighed against the pages
    /// merged before.
    marked_passes: u64,
    pass_started_scan: u64,
    /// No new pass before this (a pass in progress goes on).
    next_pass_at: Nanos,
    /// Nor before ksmd reaches this scan position, unless its last pass
    /// ended `settled_every` ago (`pass_due_by`); `None`: no such wait.
    next_pass_scan: Option<u64>,
    /// When it passes over anyway if ksmd does not reach `next_pass_scan`.
    pass_due_by: Nanos,
    /// When its last pass ended (0: none yet).
    pass_ended_at: Nanos,
}

impl Lifecycle {
    fn new(pages: u32, now: Nanos) -> Lifecycle {
        Lifecycle {
            mode: Mode::Sampling,
            settled: false,
            holds: 0,
            cleared_holds: 0,
            marked_scan: 0,
            merging_since: now,
            cow_total: 0,
            thrashing_passes: 0,
            last_above: None,
            quiet_passes: 0,
            expected: None,
            remerged_from: None,
            pages,
            seen_merged: vec![0; (pages as usize).div_ceil(64)],
            seen_unmerged: vec![0; (pages as usize).div_ceil(64)],
            cursor: 0,
            pass: PassCounts::default(),
            last: PassCounts::default(),
            passes: 0,
            marked_passes: 0,
            pass_started_scan: 0,
            next_pass_at: 0,
            next_pass_scan: None,
            pass_due_by: 0,
            pass_ended_at: 0,
        }
    }

    /// What pagesift does with it.
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether ksmd has merged what it can (meaningful while promoted or
    /// foreign).
    pub fn settled(&self) -> bool {
        self.settled
    }

    /// Whether it is held now.
    pub fn held(&self) -> bool {
        matches!(self.mode, Mode::Held { .. })
    }

    /// How often it was held.
    pub fn holds(&self) -> u32 {
        self.holds
    }

    /// Its hold, if it is held now.
    pub fn held_state(&self) -> Option<HeldState> {
        match self.mode {
            Mode::Held { until } => Some(HeldState {
                until,
                holds: self.holds,
                since_cleared: self.held_since_cleared(),
            }),
            _ => None,
        }
    }

    /// Whether it was held (for its writes, or unmarked for thrashing)
    /// since a write watch last found it cold all over: then it is not
    /// cold until a watch says so again (module header).
    pub fn held_since_cleared(&self) -> bool {
        self.holds > self.cleared_holds
    }

    /// When ksmd got it (marked, or first seen mergeable).
    pub fn merging_since(&self) -> Nanos {
        self.merging_since
    }

    /// COW breaks counted over its life.
    pub fn cow_total(&self) -> u64 {
        self.cow_total
    }

    /// Its length in pages.
    pub fn pages(&self) -> u32 {
        self.pages
    }

    /// The next page the pass in progress reads.
    pub fn cursor(&self) -> u32 {
        self.cursor
    }

    /// Accounting passes ended since it started merging.
    pub fn passes(&self) -> u64 {
        self.passes
    }

    /// The counts of the last pass that ended.
    pub fn last_pass(&self) -> PassCounts {
        self.last
    }

    /// Whether it is accounted: mergeable, by pagesift or its process.
    pub fn accounted(&self) -> bool {
        matches!(self.mode, Mode::Promoted | Mode::Foreign)
    }

    /// Whether ksmd is still merging it (accounted, not settled).
    pub fn merging(&self) -> bool {
        self.accounted() && !self.settled
    }

    /// Whether the ladder must not see it: held, or still merging.
    pub fn hidden(&self) -> bool {
        self.held() || self.merging()
    }

    /// Pages merged now, as far as accounting knows (the pass in progress
    /// before the first one ended).
    pub fn merged_now(&self) -> u64 {
        if self.passes == 0 {
            self.pass.merged
        } else {
            self.last.merged
        }
    }

    /// The pages of it that wait for ksmd, as the pacer should count them
    /// when ksmd has done `full_scans` full scans: none once settled (or
    /// when not accounted), else what a full scan covers
    /// ([`scan_pages`](Self::scan_pages)), narrowed in two cases to what is
    /// still worth a fresh promotion's pace, never below a
    /// [`QUIET_WAITING_DIVISOR`]-th of it (at least a page), so that the
    /// deciding scan that settles it still comes:
    /// - **expected merges** ([`Lifecycles::expect`]), once ksmd has passed
    ///   over all of it (two full scans ended since the mark: the scan in
    ///   progress at the mark may have passed it already), or at once in a
    ///   round of merging again ([`Lifecycles::remerge`]): the pages the
    ///   caller expected to merge that have not merged yet. A region
    ///   merged again holds its earlier merged pages and a few new
    ///   duplicates among pages that stayed unique, and the evidence that
    ///   sent it back counts those duplicates; counted by its unmerged
    ///   pages it asked ksmd to re-scan everything mergeable three times
    ///   at up to a quarter of a core for a few hundred pages (by hand,
    ///   `pagesift bench --quick --only page-cache`, 2026-12-02, the
    ///   daemon's pace log: three 16 384-page regions of guest RAM merged
    ///   again 9 s in, 12 000–31 000 pages waiting for the next 17 s, and
    ///   ksmd 2.33 CPU-s in the window against the kernel's own pace's
    ///   0.59). Not before, after a mark: a
    ///   first visit merges every page whose twin is merged already (it is
    ///   compared with the stable tree), and an expectation from the
    ///   duplicate share that promoted a region understates one whose
    ///   twins are merged elsewhere, which is only evidence above V_dup (in
    ///   `pagesift bench --quick --only files` without hints, 2026-11-27,
    ///   three regions of a reader's file copy promoted on such a share
    ///   waited at an eighth of the pace from their mark and did not merge
    ///   in the remaining 14 s of the window);
    /// - **quiet**: two full scans have ended since it was marked, and its
    ///   last two passes found nothing newly merged. ksmd has by then
    ///   visited every page that could merge at least once and most of
    ///   them twice, so what is left unmerged is mostly unique.
    ///
    /// Why: ksmd's pace is proportional to the pages waiting, and each of
    /// them costs ksmd's re-scanning *every* mergeable page (a page merges
    /// on its second visit), so a promotion costs in proportion to the
    /// whole mergeable set, whatever it holds. A region with few duplicates
    /// is worth only a fraction of that. In one `pagesift bench --quick
    /// --only vm-boot` run (three booting guests, 2026-11-27, counted by
    /// hand from the daemon's "settled" log lines) the regions that settled
    /// with under a fifth of their pages merged made up 62 % of the
    /// page-seconds waited; in another, one 11 744-page region raised by
    /// the sweep 50 s in was followed by 0.6 CPU-s of ksmd (its CSV) for
    /// 2 MiB more saved.
    pub fn waiting_pages(&self, full_scans: u64) -> u64 {
        if !self.merging() {
            return 0;
        }
        let pages = self.scan_pages().max(1);
        let floor = (pages / QUIET_WAITING_DIVISOR).max(1);
        // ksmd has passed over all of it (see above).
        let passed = full_scans >= self.marked_scan.saturating_add(2);
        match self.expected {
            _ if passed && self.quiet_passes >= 2 => floor,
            Some(e) if passed || self.remerged_from.is_some() => {
                e.saturating_sub(self.merged_known()).clamp(floor, pages)
            }
            _ => pages,
        }
    }

    /// Pages merged as far as accounting knows, for what waits: in the
    /// first pass of a round of merging again, at least what was merged
    /// when the round began (the pass has not reached all of them yet).
    fn merged_known(&self) -> u64 {
        match self.remerged_from {
            Some(from) if self.passes == 0 => self.pass.merged.max(from),
            _ => self.merged_now(),
        }
    }

    /// What one ksmd full scan of it covers: all of it until a pass has
    /// counted it, then its unmerged present pages. A merging region
    /// whose last pass found nothing present, merged or not, counts whole
    /// too: marked before its process filled it, it is a fresh promotion
    /// to hurry for. Counted by its present pages (none) it would ask for
    /// one page, which beside any other marked memory is the trickle.
    pub fn scan_pages(&self) -> u64 {
        let empty = self.last.present == 0 && self.last.merged == 0;
        if self.passes == 0 || (empty && !self.settled) {
            u64::from(self.pages)
        } else {
            self.last.present
        }
    }

    /// The stretches of it to trim (see "Trimming a settled region" in
    /// the module header): maximal runs of pages that the last look found
    /// present and not merged, page for page, cut inward to whole blocks
    /// of `align` pages of the address space (`base`: the address-space
    /// page number of its first page), each at least `min_pages` long
    /// after the cut, as `[first, end)` page offsets in increasing order.
    /// Only a promoted region that has settled has any: before that, what
    /// is unmerged may merge yet, and a foreign region is its process's.
    pub fn unmerged_stretches(&self, base: u64, min_pages: u32, align: u32) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        if self.mode != Mode::Promoted || !self.settled || min_pages == 0 {
            return out;
        }
        let align = u64::from(align.max(1));
        let bit = |p: u32| self.seen_unmerged[(p / 64) as usize] & (1 << (p % 64)) != 0;
        let mut p = 0;
        while p < self.pages {
            if !bit(p) {
                p += 1;
                continue;
            }
            let first = p;
            while p < self.pages && bit(p) {
                p += 1;
            }
            // Inward to whole blocks of the address space.
            let s = (base + u64::from(first)).div_ceil(align) * align;
            let e = (base + u64::from(p)) / align * align;
            if e > s && e - s >= u64::from(min_pages) {
                out.push(((s - base) as u32, (e - base) as u32));
            }
        }
        out
    }

    /// Whether an accounting pass over it should run at `now`, ksmd being
    /// at scan position `scan` (one in progress goes on).
    pub fn pass_due(&self, now: Nanos, scan: Option<u64>) -> bool {
        let moved = match (self.next_pass_scan, scan) {
            (Some(want), Some(at)) => at >= want || now >= self.pass_due_by,
            _ => true,
        };
        self.accounted() && (self.cursor > 0 || (now >= self.next_pass_at && moved))
    }

    fn resize(&mut self, pages: u32) {
        self.pages = pages;
        self.seen_merged.resize((pages as usize).div_ceil(64), 0);
        self.seen_unmerged.resize((pages as usize).div_ceil(64), 0);
        // Bits past the new end would read as pages of a regrown region.
        for bits in [&mut self.seen_merged, &mut self.seen_unmerged] {
            if let (Some(last), r @ 1..) = (bits.last_mut(), pages % 64) {
                *last &= (1u64 << r) - 1;
            }
        }
        if self.cursor >= pages {
            self.cursor = 0;
        }
    }

    /// Starts tracking merging from scratch (just marked, or first seen
    /// mergeable): its thrashing history starts over too.
    fn start_marked(&mut self, full_scans: u64, now: Nanos) {
        self.remerged_from = None;
        self.marked_passes = 0;
        self.thrashing_passes = 0;
        self.last_above = None;
        self.start_merging(full_scans, now);
    }

    /// Starts tracking a merging round (marked, or merged again): what
    /// the thrashing rule knows of earlier rounds stays.
    fn start_merging(&mut self, full_scans: u64, now: Nanos) {
        self.marked_scan = full_scans;
        self.merging_since = now;
        self.next_pass_at = now;
        self.next_pass_scan = None;
        self.settled = false;
        self.cursor = 0;
        self.pass = PassCounts::default();
        self.passes = 0;
        self.quiet_passes = 0;
        self.expected = None;
        self.pass_started_scan = full_scans;
    }

    fn hold(&mut self, now: Nanos, base_s: u64) -> Nanos {
        self.holds = self.holds.saturating_add(1);
        let until = now.saturating_add(hold_time(base_s, self.holds));
        self.mode = Mode::Held { until };
        until
    }

    fn release(&mut self, now: Nanos) -> bool {
        match self.mode {
            Mode::Held { until } if now >= until => {
                self.mode = Mode::Sampling;
                true
            }
            _ => false,
        }
    }

    /// The deciding scan (see the module header).
    fn settle_scan(&self, settle_scans: u64) -> u64 {
        self.marked_scan.saturating_add(settle_scans)
    }

    /// A pass that began before the deciding scan cannot settle the
    /// region: once that scan is done, the deciding pass starts at once.
    fn restart_undecided(&mut self, full_scans: u64, now: Nanos, settle_scans: u64) {
        let deciding = self.settle_scan(settle_scans);
        if self.cursor > 0 && self.pass_started_scan < deciding && full_scans >= deciding {
            self.cursor = 0;
            self.pass = PassCounts::default();
            self.pass_started_scan = full_scans;
            self.next_pass_at = now;
            self.next_pass_scan = None;
        }
    }

    /// Counts the states of the pages from the cursor on (at most to the
    /// end of the region); ends the pass if they reach the end.
    fn record(
        &mut self,
        states: &[PageState],
        now: Nanos,
        full_scans: u64,
        rules: &AccountRules,
        scan: Option<u64>,
    ) -> Option<PassEnd> {
        let n = states
            .len()
            .min((self.pages - self.cursor.min(self.pages)) as usize);
        if n == 0 || !self.accounted() {
            return None;
        }
        let from = self.cursor as usize;
        for (i, s) in states[..n].iter().enumerate() {
            let p = from + i;
            let (w, bit) = (p / 64, 1u64 << (p % 64));
            match s {
                PageState::Merged | PageState::Zero => {
                    self.pass.merged += 1;
                    self.pass.fresh += u64::from(self.seen_merged[w] & bit == 0);
                    self.seen_merged[w] |= bit;
                    self.seen_unmerged[w] &= !bit;
                }
                PageState::Present => {
                    self.pass.present += 1;
                    self.seen_unmerged[w] |= bit;
                    if self.seen_merged[w] & bit != 0 {
                        self.pass.cow += 1;
                        self.cow_total += 1;
                        self.seen_merged[w] &= !bit;
                    }
                }
                PageState::NotPresent => {
                    self.seen_merged[w] &= !bit;
                    self.seen_unmerged[w] &= !bit;
                }
            }
        }
        self.cursor += n as u32;
        (self.cursor >= self.pages).then(|| self.end_pass(now, full_scans, rules, scan))
    }

    fn end_pass(
        &mut self,
        now: Nanos,
        full_scans: u64,
        rules: &AccountRules,
        scan: Option<u64>,
    ) -> PassEnd {
        let prev_merged = self.last.merged;
        self.last = self.pass;
        self.pass = PassCounts::default();
        self.passes += 1;
        self.marked_passes += 1;
        self.quiet_passes = if self.last.fresh == 0 {
            self.quiet_passes.saturating_add(1)
        } else {
            0
        };
        self.cursor = 0;
        self.pass_ended_at = now;
        // Whether it was settled before this pass: one that settles now is
        // passed over again soon, as while it merged.
        self.next_pass_at = now.saturating_add(if self.settled {
            rules.settled_every
        } else {
            rules.merging_every
        });
        // All merged settles at once; nothing at all does not: a region
        // marked before its process filled it (raised on its place's
        // history in the wake that first sees it, or guest RAM not
        // touched yet) would otherwise settle on an empty first pass and
        // leave the fill that follows to the trickle.
        let all_merged = self.last.present == 0 && self.last.merged > 0;
        let settled = !self.settled
            && (all_merged || self.pass_started_scan >= self.settle_scan(rules.settle_scans));
        self.settled |= settled;
        self.pass_started_scan = full_scans;
        // Still merging: the next look waits for ksmd to move on too.
        self.next_pass_scan = match scan {
            Some(at) if !self.settled && rules.merging_gap > 0 => {
                Some(at.saturating_add(rules.merging_gap))
            }
            _ => None,
        };
        self.pass_due_by = now.saturating_add(rules.settled_every);
        let above = self.mode == Mode::Promoted
            && rules.v_cow < 1.0
            && self.marked_passes >= 2
            && prev_merged >= rules.min_merged.max(1)
            && self.last.cow >= rules.min_breaks
            && self.last.cow as f64 / self.last.fresh.max(prev_merged).max(1) as f64 > rules.v_cow;
        if above {
            let window = rules.settled_every.saturating_mul(THRASHING_WINDOW);
            let near = self
                .last_above
                .is_some_and(|t| now.saturating_sub(t) <= window);
            self.thrashing_passes = if near {
                self.thrashing_passes.saturating_add(1)
            } else {
                1
            };
            self.last_above = Some(now);
        }
        let demote = above && self.thrashing_passes >= THRASHING_PASSES;
        PassEnd { settled, demote }
    }
}

/// Every tracked region's [`Lifecycle`], and the set of regions hidden from
/// the ladder, which it keeps equal to the regions that are held or still
/// merging (see the module header's invariants).
///
/// Three indexes let the per-wake work cost only the regions it concerns,
/// not every tracked one: on a host of ten booting guests the daemon tracks
/// hundreds of regions and wakes every 20 ms, and walking all of them for
/// due holds and passes took about 6 % of its samples (docs/daemon-cpu.md,
/// "At the full size"). Like `hidden`, they are brought in line with a
/// region after every transition ([`Lifecycles::apply`]) and property-tested
/// against the lifecycles themselves:
/// - `holds`: `(until, id)` for every held region, in release order;
/// - `merging`: the accounted regions that have not settled (ksmd's pace
///   weighs what they wait for, [`Lifecycles::merging_values`]);
/// - `accounted`: the promoted and foreign regions (what one of ksmd's
///   full scans covers, [`Lifecycles::accounted_values`]).
///
/// `sampling_changes` counts every region that started or stopped
/// sampling, or was tracked new or forgotten: a caller that keeps a verdict
/// about the sampling regions (the daemon's short-lived set) knows from it
/// when the set it judged changed.
#[derive(Clone, Debug, Default)]
pub struct Lifecycles {
    regions: BTreeMap<RegionId, Lifecycle>,
    hidden: BTreeSet<RegionId>,
    holds: BTreeSet<(Nanos, RegionId)>,
    merging: BTreeSet<RegionId>,
    accounted: BTreeSet<RegionId>,
    sampling_changes: u64,
    /// ksmd's scan position as the caller last said
    /// (`core::pipeline::scan_clock`).
    scan: Option<u64>,
    view_changed: bool,
}

/// What [`Lifecycles`]' indexes know of one region.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Indexed {
    held_until: Option<Nanos>,
    merging: bool,
    accounted: bool,
}

impl Indexed {
    /// A region not tracked, or sampling.
    const NONE: Indexed = Indexed {
        held_until: None,
        merging: false,
        accounted: false,
    };

    fn of(l: &Lifecycle) -> Indexed {
        Indexed {
            held_until: match l.mode {
                Mode::Held { until } => Some(until),
                _ => None,
            },
            merging: l.merging(),
            accounted: l.accounted(),
        }
    }
}

impl Lifecycles {
    /// No regions.
    pub fn new() -> Lifecycles {
        Lifecycles::default()
    }

    /// Starts tracking `id` (sampling) if it is new; follows a change of
    /// its length otherwise (a new region is visible: nothing to re-sync).
    pub fn track(&mut self, id: RegionId, pages: u32, now: Nanos) {
        match self.regions.get_mut(&id) {
            Some(l) if l.pages != pages => l.resize(pages),
            Some(_) => {}
            None => {
                self.regions.insert(id, Lifecycle::new(pages, now));
                self.sampling_changes += 1;
            }
        }
    }

    /// Stops tracking `id` (it is gone); returns its lifecycle. The view
    /// follows at the caller's next sync of the ladder (the region left the
    /// machine too), so this raises no flag.
    pub fn forget(&mut self, id: RegionId) -> Option<Lifecycle> {
        self.hidden.remove(&id);
        let l = self.regions.remove(&id)?;
        self.sampling_changes += 1;
        self.reindex(id, Indexed::of(&l), Indexed::NONE);
        Some(l)
    }

    /// The lifecycle of `id`, if tracked.
    pub fn get(&self, id: RegionId) -> Option<&Lifecycle> {
        self.regions.get(&id)
    }

    /// Its mode, if tracked.
    pub fn mode(&self, id: RegionId) -> Option<Mode> {
        self.regions.get(&id).map(|l| l.mode)
    }

    /// Every tracked region, in id order.
    pub fn iter(&self) -> impl Iterator<Item = (RegionId, &Lifecycle)> {
        self.regions.iter().map(|(&id, l)| (id, l))
    }

    /// Every tracked region's lifecycle.
    pub fn values(&self) -> impl Iterator<Item = &Lifecycle> {
        self.regions.values()
    }

    /// The lifecycles of the accounted regions (promoted or foreign), in
    /// id order, from their index: what ksmd's pace weighs, without a walk
    /// over every tracked region.
    pub fn accounted_values(&self) -> impl Iterator<Item = &Lifecycle> {
        (self.accounted.iter()).filter_map(|id| self.regions.get(id))
    }

    /// The lifecycles of the merging regions (accounted, not settled), in
    /// id order, from their index.
    pub fn merging_values(&self) -> impl Iterator<Item = &Lifecycle> {
        (self.merging.iter()).filter_map(|id| self.regions.get(id))
    }

    /// How many regions are tracked.
    pub fn len(&self) -> usize {
        self.regions.len()
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// The regions the ladder must not see: held, or promoted and merging.
    pub fn hidden(&self) -> &BTreeSet<RegionId> {
        &self.hidden
    }

    /// Whether `id` is hidden from the ladder.
    pub fn is_hidden(&self, id: RegionId) -> bool {
        self.hidden.contains(&id)
    }

    /// ksmd's position in its full scans now
    /// (`core::pipeline::scan_clock`; `None`: unknown): what the passes of
    /// merging regions wait for (`AccountRules::merging_gap`).
    pub fn set_scan_position(&mut self, scan: Option<u64>) {
        self.scan = scan;
    }

    /// How many times a region was tracked new, forgotten, or started or
    /// stopped sampling so far: equal counts mean the same sampling
    /// regions.
    pub fn sampling_changes(&self) -> u64 {
        self.sampling_changes
    }

    /// Whether the hidden set changed, or a region was held, since the
    /// last call: the ladder's view must be synced again. Clears the flag.
    pub fn take_view_changed(&mut self) -> bool {
        std::mem::take(&mut self.view_changed)
    }

    /// Applies `f` to `id`'s lifecycle, then brings the hidden set in line
    /// with it: the one place visibility changes.
    fn apply<R>(&mut self, id: RegionId, f: impl FnOnce(&mut Lifecycle) -> R) -> Option<R> {
        let l = self.regions.get_mut(&id)?;
        let was = Indexed::of(l);
        let was_sampling = l.mode == Mode::Sampling;
        let r = f(l);
        let is = Indexed::of(l);
        self.sampling_changes += u64::from(was_sampling != (l.mode == Mode::Sampling));
        let changed = if l.hidden() {
            self.hidden.insert(id)
        } else {
            self.hidden.remove(&id)
        };
        self.view_changed |= changed;
        self.reindex(id, was, is);
        Some(r)
    }

    /// Moves `id` in the indexes from what they knew of it (`was`) to
    /// what it is now (`is`).
    fn reindex(&mut self, id: RegionId, was: Indexed, is: Indexed) {
        if was == is {
            return;
        }
        if was.held_until != is.held_until {
            if let Some(t) = was.held_until {
                self.holds.remove(&(t, id));
            }
            if let Some(t) = is.held_until {
                self.holds.insert((t, id));
            }
        }
        for (set, a, b) in [
            (&mut self.merging, was.merging, is.merging),
            (&mut self.accounted, was.accounted, is.accounted),
        ] {
            match (a, b) {
                (false, true) => {
                    set.insert(id);
                }
                (true, false) => {
                    set.remove(&id);
                }
                _ => {}
            }
        }
    }

    /// The kernel took `MADV_MERGEABLE` for all of `id` (or its range is
    /// found marked by pagesift): promoted, merging from scratch, hidden
    /// until it settles. A held region is not marked before its hold ends
    /// (`false`, as for an unknown one).
    pub fn mark(&mut self, id: RegionId, full_scans: u64, now: Nanos) -> bool {
        self.apply(id, |l| {
            if l.held() {
                return false;
            }
            l.mode = Mode::Promoted;
            l.start_marked(full_scans, now);
            true
        })
        .unwrap_or(false)
    }

    /// Tells how many of a merging region's pages are expected to be
    /// merged once it settles (from the evidence that marked it or made it
    /// merge again): ksmd's pace counts no more of it than have yet to
    /// merge (see [`Lifecycle::waiting_pages`]). No effect on a region that
    /// is not merging; forgotten when it starts merging again.
    pub fn expect(&mut self, id: RegionId, merged: u64) {
        if let Some(l) = self.regions.get_mut(&id).filter(|l| l.merging()) {
            l.expected = Some(merged);
        }
    }

    /// A settled promoted or foreign region back at the top of the
    /// ladder: merged pages are no duplicates to the sampler, so new ones
    /// appeared in it. It merges again from scratch, hidden until it
    /// settles. Whether it was such a region.
    pub fn remerge(&mut self, id: RegionId, full_scans: u64, now: Nanos) -> bool {
        self.apply(id, |l| {
            let again = l.accounted() && l.settled;
            if again {
                let merged = l.merged_now();
                l.start_merging(full_scans, now);
                l.remerged_from = Some(merged);
            }
            again
        })
        .unwrap_or(false)
    }

    /// Holds `id` for its next hold time (`base_s` seconds, doubled with
    /// every hold before): hidden until the hold ends. Returns the end.
    /// Always raises the view flag, even for a region already hidden (a
    /// merging region found thrashing), as the daemon always re-synced
    /// after a hold.
    pub fn hold(&mut self, id: RegionId, now: Nanos, base_s: u64) -> Option<Nanos> {
        let until = self.apply(id, |l| l.hold(now, base_s))?;
        self.view_changed = true;
        Some(until)
    }

    /// A write watch found `id` cold all over: the holds so far are
    /// cleared (see [`Lifecycle::held_since_cleared`]).
    pub fn clear_writes(&mut self, id: RegionId) {
        if let Some(l) = self.regions.get_mut(&id) {
            l.cleared_holds = l.holds;
        }
    }

    /// `id`, a sampling region new to the caller, lies mostly over regions
    /// held as `held` says (their VMAs were joined or split, see the
    /// module header): it is held until the same end, with as many holds
    /// (the next one doubles from there). Nothing happens to a region
    /// not sampling, or when that hold has ended by `now`. Whether it is
    /// held now.
    pub fn inherit_hold(&mut self, id: RegionId, held: HeldState, now: Nanos) -> bool {
        if held.until <= now {
            return false;
        }
        let inherited = self
            .apply(id, |l| {
                if l.mode != Mode::Sampling {
                    return false;
                }
                l.holds = l.holds.max(held.holds).max(1);
                l.cleared_holds = if held.since_cleared {
                    l.cleared_holds.min(l.holds - 1)
                } else {
                    l.holds
                };
                l.mode = Mode::Held { until: held.until };
                true
            })
            .unwrap_or(false);
        self.view_changed |= inherited;
        inherited
    }

    /// Ends `id`'s hold if it is held and its hold ended by `now`: back to
    /// sampling, shown to the ladder (which puts it at the bottom). Whether
    /// it ended.
    pub fn release(&mut self, id: RegionId, now: Nanos) -> bool {
        self.apply(id, |l| l.release(now)).unwrap_or(false)
    }

    /// Ends every hold that ended by `now`; returns the regions released.
    /// In release order (earliest end first), not id order.
    pub fn release_due(&mut self, now: Nanos) -> Vec<RegionId> {
        let due: Vec<RegionId> = (self.holds.iter())
            .take_while(|&&(until, _)| until <= now)
            .map(|&(_, id)| id)
            .collect();
        for &id in &due {
            self.release(id, now);
        }
        due
    }

    /// A marked piece of a promoted region that had settled, now a region
    /// of its own (trimming split its VMA): promoted and settled at once,
    /// its first pass due now. Its pages were visited by the scans that
    /// settled the region it was part of; counted as a fresh mark, it
    /// would ask ksmd for three more full scans of everything mergeable.
    /// Only a sampling region (new to the caller) is adopted. Whether it was.
    pub fn adopt_settled(&mut self, id: RegionId, full_scans: u64, now: Nanos) -> bool {
        self.apply(id, |l| {
            if l.mode != Mode::Sampling {
                return false;
            }
            l.mode = Mode::Promoted;
            l.start_marked(full_scans, now);
            l.settled = true;
            true
        })
        .unwrap_or(false)
    }

    /// The caller unmarked all of promoted region `id` as a trimmed
    /// stretch (see "Trimming a settled region" in the module header):
    /// sampling again, shown to the ladder, not held, since it did not
    /// thrash. Whether it was promoted.
    pub fn trimmed(&mut self, id: RegionId) -> bool {
        self.apply(id, |l| {
            let was = l.mode == Mode::Promoted;
            if was {
                l.mode = Mode::Sampling;
                l.settled = false;
            }
            was
        })
        .unwrap_or(false)
    }

    /// Its process made `id` mergeable itself (or uses merge-any): foreign,
    /// merging from scratch; whatever pagesift held or marked is its
    /// process's now. Returns the mode it had (`None`: unknown); already
    /// foreign, nothing changes.
    pub fn foreign(&mut self, id: RegionId, full_scans: u64, now: Nanos) -> Option<Mode> {
        self.apply(id, |l| {
            let was = l.mode;
            if was != Mode::Foreign {
                l.mode = Mode::Foreign;
                l.start_marked(full_scans, now);
            }
            was
        })
    }

    /// Its process made a foreign region unmergeable again: sampling.
    pub fn stop_foreign(&mut self, id: RegionId) {
        self.apply(id, |l| {
            if l.mode == Mode::Foreign {
                l.mode = Mode::Sampling;
            }
        });
    }

    /// Before a wake's accounting: restarts the passes of merging regions
    /// that began too early to settle them, once ksmd's deciding scan is
    /// done (see the module header). Whether any region is merging.
    pub fn prepare_passes(&mut self, full_scans: u64, now: Nanos, settle_scans: u64) -> bool {
        // Restarting a pass changes no mode: the index stays true.
        for id in &self.merging {
            if let Some(l) = self.regions.get_mut(id) {
                l.restart_undecided(full_scans, now, settle_scans);
            }
        }
        !self.merging.is_empty()
    }

    /// Unexplained COW breaks on the machine (see "Breaks between settled
    /// passes" in the module header): the next pass of every settled,
    /// accounted region between passes starts at `now`, or `min_gap`
    /// after its last pass ended if that is later; never later than it
    /// was due anyway. Returns how many regions' passes moved.
    pub fn hasten_settled_passes(&mut self, now: Nanos, min_gap: Nanos) -> usize {
        let mut moved = 0;
        for id in &self.accounted {
            let Some(l) = self.regions.get_mut(id) else {
                continue;
            };
            if !(l.settled && l.cursor == 0) {
                continue;
            }
            let at = l.pass_ended_at.saturating_add(min_gap).max(now);
            if at < l.next_pass_at {
                l.next_pass_at = at;
                moved += 1;
            }
        }
        moved
    }

    /// The accounted regions whose pass should go on or start at `now`, in
    /// id order.
    pub fn passes_due(&self, now: Nanos) -> Vec<RegionId> {
        (self.accounted.iter())
            .copied()
            .filter(|id| {
                self.regions
                    .get(id)
                    .is_some_and(|l| l.pass_due(now, self.scan))
            })
            .collect()
    }

    /// Counts the states of `id`'s pages from its cursor on (read by the
    /// caller); when they reach its end, the pass ends and says whether the
    /// region settled (a promoted one is then shown to the ladder again)
    /// and whether it thrashes. `None`: the pass goes on, or `id` is
    /// unknown.
    pub fn record(
        &mut self,
        id: RegionId,
        states: &[PageState],
        now: Nanos,
        full_scans: u64,
        rules: &AccountRules,
    ) -> Option<PassEnd> {
        let scan = self.scan;
        self.apply(id, |l| l.record(states, now, full_scans, rules, scan))
            .flatten()
    }
}

impl std::ops::Index<RegionId> for Lifecycles {
    type Output = Lifecycle;

    fn index(&self, id: RegionId) -> &Lifecycle {
        &self.regions[&id]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const R: RegionId = RegionId(1);

    fn one(pages: u32) -> Lifecycles {
        let mut l = Lifecycles::new();
        l.track(R, pages, 0);
        l
    }

    fn states(merged: usize, present: usize) -> Vec<PageState> {
        let mut v = vec![PageState::Merged; merged];
        v.resize(merged + present, PageState::Present);
        v
    }

    #[test]
    fn hold_time_doubles_from_the_base_up_to_an_hour() {
        assert_eq!(hold_time(60, 1), 60 * SEC);
        assert_eq!(hold_time(60, 2), 120 * SEC);
        assert_eq!(hold_time(60, 3), 240 * SEC);
        assert_eq!(hold_time(60, 7), MAX_HOLD);
        assert_eq!(hold_time(60, u32::MAX), MAX_HOLD);
        assert_eq!(hold_time(4, 0), 4 * SEC, "the first hold, counted from 0");
        assert_eq!(hold_time(0, 5), 0);
    }

    #[test]
    fn a_hold_stands_until_a_watch_clears_it() {
        let mut l = one(64);
        assert!(!l[R].held_since_cleared(), "never held");
        let until = l.hold(R, 0, 4).unwrap();
        assert!(l.release(R, until));
        assert_eq!(l.mode(R), Some(Mode::Sampling));
        assert!(l[R].held_since_cleared(), "released is not cleared");
        l.clear_writes(R);
        assert!(!l[R].held_since_cleared());
        l.hold(R, until, 4);
        assert!(l[R].held_since_cleared(), "held again");
    }

    #[test]
    fn a_new_region_samples_and_is_seen() {
        let mut l = one(64);
        assert_eq!(l.mode(R), Some(Mode::Sampling));
        assert!(!l.is_hidden(R));
        assert!(
            !l.take_view_changed(),
            "nothing to re-sync for a new region"
        );
        assert!(!l[R].accounted());
        assert!(
            l.passes_due(0).is_empty(),
            "only accounted regions are passed over"
        );
    }

    #[test]
    fn marking_hides_it_until_it_settles() {
        let mut l = one(64);
        assert!(l.mark(R, 10, 5));
        assert_eq!(l.mode(R), Some(Mode::Promoted));
        assert!(l.is_hidden(R) && l[R].merging());
        assert!(l.take_view_changed());
        assert_eq!(l[R].merging_since(), 5);
        assert_eq!(l.passes_due(5), vec![R]);
        // All merged: nothing left for ksmd, settled at once.
        let end = l.record(R, &states(64, 0), 6, 10, &AccountRules::default());
        assert_eq!(
            end,
            Some(PassEnd {
                settled: true,
                demote: false
            })
        );
        assert!(l[R].settled() && !l.is_hidden(R));
        assert!(l.take_view_changed(), "back to the ladder");
        assert_eq!(l[R].merged_now(), 64);
    }

    #[test]
    fn a_merging_region_is_passed_over_again_once_ksmd_moved_on() {
        let rules = AccountRules {
            merging_gap: 250,
            ..AccountRules::default()
        };
        let mut l = one(64);
        l.set_scan_position(Some(4_100));
        l.mark(R, 4, 0);
        assert_eq!(l.passes_due(0), vec![R], "the first pass at once");
        assert_eq!(
            l.record(R, &states(8, 56), SEC, 4, &rules),
            Some(PassEnd::default())
        );
        // A second later ksmd has moved a tenth of a scan: nothing new to see.
        l.set_scan_position(Some(4_200));
        assert!(l.passes_due(2 * SEC).is_empty(), "waits for ksmd");
        // A quarter of a scan on from where the pass ended: due.
        l.set_scan_position(Some(4_350));
        assert_eq!(l.passes_due(2 * SEC), vec![R]);
        // Still due only after merging_every.
        l.record(R, &states(16, 48), 3 * SEC, 4, &rules);
        l.set_scan_position(Some(5_000));
        assert!(l.passes_due(3 * SEC + 1).is_empty());
        assert_eq!(l.passes_due(4 * SEC), vec![R]);
        // A ksmd that stands still: passed over anyway settled_every after
        // the last pass ended.
        l.record(R, &states(16, 48), 4 * SEC, 5, &rules);
        assert!(l.passes_due(4 * SEC + rules.settled_every - 1).is_empty());
        assert_eq!(l.passes_due(4 * SEC + rules.settled_every), vec![R]);
        // Without a position, time alone.
        l.set_scan_position(None);
        assert_eq!(l.passes_due(5 * SEC), vec![R]);
        // A settled region waits for settled_every only (ksmd's position
        // says nothing of the breaks its passes look for).
        l.set_scan_position(Some(9_000));
        let end = l.record(R, &states(64, 0), 6 * SEC, 9, &rules).unwrap();
        assert!(end.settled);
        l.record(R, &states(64, 0), 7 * SEC, 9, &rules);
        assert!(l.passes_due(7 * SEC + rules.settled_every - 1).is_empty());
        assert_eq!(l.passes_due(7 * SEC + rules.settled_every), vec![R]);
    }

    #[test]
    fn it_settles_only_with_a_pass_begun_after_the_deciding_scan() {
        let rules = AccountRules::default();
        let mut l = one(64);
        l.mark(R, 10, 0);
        // A pass begun at scan 10 ends with unmerged pages: not settled,
        // even once ksmd is far past its deciding scan.
        assert_eq!(
            l.record(R, &states(32, 32), SEC, 20, &rules),
            Some(PassEnd::default())
        );
        assert!(l.is_hidden(R) && !l[R].settled());
        assert!(!l[R].pass_due(SEC + 1, None), "waits merging_every");
        assert!(l[R].pass_due(2 * SEC, None));
        // The next began at scan 20 ≥ 10 + 3: it decides.
        let end = l.record(R, &states(40, 24), 2 * SEC, 21, &rules).unwrap();
        assert!(end.settled && l[R].settled() && !l.is_hidden(R));
        // Settled with this pass: passed over again soon, then every
        // settled_every.
        assert!(l[R].pass_due(3 * SEC, None));
        l.record(R, &states(40, 24), 3 * SEC, 22, &rules);
        assert!(!l[R].pass_due(4 * SEC, None));
        assert!(l[R].pass_due(3 * SEC + rules.settled_every, None));
    }

    #[test]
    fn a_region_empty_at_its_first_pass_waits_for_its_fill() {
        let rules = AccountRules::default();
        let mut l = one(64);
        l.mark(R, 10, 0);
        // Marked before its process wrote a page: nothing present, nothing
        // merged. Not settled (the old rule settled it here, leaving the
        // fill that follows to the trickle).
        let empty = vec![PageState::NotPresent; 64];
        assert_eq!(
            l.record(R, &empty, SEC, 10, &rules),
            Some(PassEnd::default())
        );
        assert!(l[R].merging() && l.is_hidden(R));
        // It waits whole, as a fresh promotion, not a page.
        assert_eq!(l[R].scan_pages(), 64);
        assert_eq!(l[R].waiting_pages(10), 64);
        // Filled: the next pass sees it unmerged and waits for ksmd.
        assert_eq!(
            l.record(R, &states(0, 64), 2 * SEC, 11, &rules),
            Some(PassEnd::default())
        );
        assert!(l[R].merging());
        // ksmd merged all of it: settled at once.
        let end = l.record(R, &states(64, 0), 3 * SEC, 12, &rules).unwrap();
        assert!(end.settled && l[R].settled());
        // Still empty after the deciding scan: settled like any region.
        let mut l = one(64);
        l.mark(R, 10, 0);
        l.record(R, &empty, SEC, 10, &rules);
        l.record(R, &empty, 2 * SEC, 13, &rules);
        assert!(l[R].merging(), "that pass began before the deciding scan");
        let end = l.record(R, &empty, 3 * SEC, 14, &rules).unwrap();
        assert!(end.settled && l[R].settled());
        // Settled empty, it covers nothing in ksmd's scan.
        assert_eq!(l[R].scan_pages(), 0);
        assert_eq!(l[R].waiting_pages(14), 0);
    }

    #[test]
    fn a_quiet_region_waits_for_an_eighth_of_the_pace() {
        let rules = AccountRules::default();
        let mut l = one(1024);
        assert_eq!(l[R].waiting_pages(0), 0, "not merging");
        l.mark(R, 10, 0);
        assert_eq!(
            l[R].waiting_pages(10),
            1024,
            "a fresh promotion counts whole"
        );
        // Two passes that merge nothing, but ksmd is not two scans on yet.
        l.record(R, &states(0, 1024), SEC, 10, &rules);
        l.record(R, &states(0, 1024), 2 * SEC, 11, &rules);
        assert_eq!(l[R].waiting_pages(11), 1024);
        // Two scans on: quiet.
        assert_eq!(l[R].waiting_pages(12), 1024 / QUIET_WAITING_DIVISOR);
        // A page merged again: whole (its unmerged pages) at once.
        l.record(R, &states(8, 1016), 3 * SEC, 12, &rules);
        assert_eq!(l[R].waiting_pages(12), 1016);
        // Quiet again after two more passes without a new merge, until the
        // deciding pass settles it.
        l.record(R, &states(8, 1016), 4 * SEC, 12, &rules);
        assert_eq!(l[R].waiting_pages(13), 1016);
        l.record(R, &states(8, 1016), 5 * SEC, 13, &rules);
        assert_eq!(l[R].waiting_pages(13), 1016 / QUIET_WAITING_DIVISOR);
        let end = l.record(R, &states(8, 1016), 6 * SEC, 14, &rules).unwrap();
        assert!(end.settled);
        assert_eq!(l[R].waiting_pages(14), 0);
    }

    #[test]
    fn expected_merges_narrow_what_waits() {
        let rules = AccountRules::default();
        let mut l = one(1024);
        l.expect(R, 100);
        l.mark(R, 10, 0);
        assert_eq!(
            l[R].waiting_pages(10),
            1024,
            "an expectation before the mark is ignored"
        );
        l.expect(R, 300);
        assert_eq!(
            l[R].waiting_pages(11),
            1024,
            "whole until ksmd has passed over all of it"
        );
        assert_eq!(l[R].waiting_pages(12), 300);
        l.record(R, &states(100, 924), SEC, 12, &rules);
        assert_eq!(l[R].waiting_pages(12), 200, "those that have yet to merge");
        // Never below an eighth of what a full scan covers, nor above it.
        l.record(R, &states(290, 734), 2 * SEC, 12, &rules);
        assert_eq!(l[R].waiting_pages(12), 734 / QUIET_WAITING_DIVISOR);
        l.expect(R, 5000);
        assert_eq!(l[R].waiting_pages(12), 734);
        // Merging again forgets it.
        let end = l.record(R, &states(1024, 0), 3 * SEC, 13, &rules).unwrap();
        assert!(end.settled);
        assert!(l.remerge(R, 20, 4 * SEC));
        assert_eq!(
            l[R].waiting_pages(20),
            1024,
            "whole until a pass has counted it"
        );
        l.record(R, &states(1000, 24), 5 * SEC, 20, &rules);
        assert_eq!(l[R].waiting_pages(20), 24);
    }

    #[test]
    fn a_region_merged_again_waits_for_its_new_duplicates_only() {
        let rules = AccountRules::default();
        let mut l = one(4000);
        l.mark(R, 10, 0);
        // Settled with 1 000 merged and 3 000 unique pages present.
        l.record(R, &states(1000, 3000), SEC, 13, &rules);
        let end = l
            .record(R, &states(1000, 3000), 2 * SEC, 13, &rules)
            .unwrap();
        assert!(end.settled);
        // Back at the top with evidence of 200 new duplicates.
        assert!(l.remerge(R, 20, 3 * SEC));
        assert_eq!(l[R].waiting_pages(20), 4000, "no expectation: whole");
        l.expect(R, 1000 + 200);
        // At once, not two full scans on: 200 wait, never below an eighth
        // of what a full scan covers (all of it until a pass counted it).
        assert_eq!(l[R].waiting_pages(20), 4000 / QUIET_WAITING_DIVISOR);
        // A pass halfway through has counted 300 merged: the earlier
        // 1 000 are still known.
        l.record(R, &states(300, 700), 4 * SEC, 20, &rules);
        assert_eq!(l[R].merged_known(), 1000);
        // Counted through: 1 100 merged, 100 of the new ones to come, an
        // eighth of the 2 900 unmerged pages a full scan covers.
        l.record(R, &states(800, 2200), 5 * SEC, 21, &rules);
        assert_eq!(l[R].merged_now(), 1100);
        assert_eq!(l[R].waiting_pages(21), 2900 / QUIET_WAITING_DIVISOR);
        // Marked afresh, an expectation waits for ksmd's two scans again.
        let mut m = one(4096);
        m.mark(R, 10, 0);
        m.expect(R, 200);
        assert_eq!(m[R].waiting_pages(10), 4096);
    }

    #[test]
    fn an_undecided_pass_restarts_at_the_deciding_scan() {
        let mut l = one(64);
        l.mark(R, 10, 0);
        assert_eq!(
            l.record(R, &states(10, 10), 0, 10, &AccountRules::default()),
            None
        );
        assert_eq!(l[R].cursor(), 20);
        assert!(l.prepare_passes(12, SEC, SETTLE_SCANS), "merging");
        assert_eq!(l[R].cursor(), 20, "ksmd not at its deciding scan yet");
        assert!(l.prepare_passes(13, SEC, SETTLE_SCANS));
        assert_eq!(l[R].cursor(), 0, "restarted");
        // The restarted pass began at scan 13: it settles the region.
        let end = l.record(R, &states(60, 4), SEC, 13, &AccountRules::default());
        assert!(end.unwrap().settled);
        assert!(
            !l.prepare_passes(14, 2 * SEC, SETTLE_SCANS),
            "nothing merging"
        );
    }

    #[test]
    fn a_hold_hides_until_it_ends_and_each_hold_is_twice_as_long() {
        let mut l = one(64);
        assert_eq!(l.hold(R, 100, 4), Some(100 + 4 * SEC));
        assert!(l.is_hidden(R) && l.take_view_changed());
        assert!(!l.release(R, 100 + 4 * SEC - 1), "not before its end");
        assert!(l.release_due(100 + 4 * SEC - 1).is_empty());
        assert_eq!(l.release_due(100 + 4 * SEC), vec![R]);
        assert_eq!(l.mode(R), Some(Mode::Sampling));
        assert!(!l.is_hidden(R) && l.take_view_changed());
        assert_eq!(l.hold(R, 0, 4), Some(8 * SEC), "the second hold doubles");
        assert_eq!(l[R].holds(), 2);
        assert!(!l.mark(R, 0, SEC), "not marked while held");
        assert!(l.release(R, 8 * SEC));
        assert!(!l.release(R, 9 * SEC), "released once");
    }

    #[test]
    fn holding_a_merging_region_keeps_it_hidden_and_asks_for_a_sync() {
        let mut l = one(64);
        l.mark(R, 0, 0);
        l.take_view_changed();
        l.hold(R, 0, 60);
        assert!(l.is_hidden(R));
        assert!(l.take_view_changed(), "every hold re-syncs");
    }

    #[test]
    fn a_settled_region_back_at_the_top_merges_again() {
        let mut l = one(64);
        assert!(!l.remerge(R, 0, 0), "sampling: nothing to merge again");
        l.mark(R, 0, 0);
        assert!(!l.remerge(R, 0, 0), "still merging");
        l.record(R, &states(64, 0), 0, 0, &AccountRules::default());
        l.take_view_changed();
        assert!(l.remerge(R, 7, 9));
        assert!(l.is_hidden(R) && l[R].merging() && l.take_view_changed());
        assert_eq!((l[R].passes(), l[R].merging_since()), (0, 9));
    }

    #[test]
    fn foreign_regions_are_accounted_and_hidden_while_merging() {
        let mut l = one(64);
        l.mark(R, 0, 0);
        assert_eq!(l.foreign(R, 3, 1), Some(Mode::Promoted));
        assert!(l.is_hidden(R) && l[R].merging() && l[R].accounted());
        assert_eq!(l.foreign(R, 4, 2), Some(Mode::Foreign));
        assert_eq!(l[R].merging_since(), 1, "already foreign: nothing restarts");
        // Settled: back on the ladder; at the top again, merged again
        // (hidden), as a promoted region is.
        l.take_view_changed();
        let end = l.record(R, &states(64, 0), 0, 0, &AccountRules::default());
        assert!(end.unwrap().settled && !l.is_hidden(R) && l.take_view_changed());
        assert!(l.remerge(R, 7, 9));
        assert!(l.is_hidden(R) && l[R].merging() && l.take_view_changed());
        assert!(!l.remerge(R, 8, 10), "still merging");
        l.stop_foreign(R);
        assert_eq!(l.mode(R), Some(Mode::Sampling));
        assert!(!l.is_hidden(R) && !l.remerge(R, 9, 11));
        // A held region taken over by its process: its process's now,
        // merging and hidden like any foreign region, never demoted.
        l.hold(R, 0, 60);
        l.foreign(R, 0, 0);
        assert!(!l[R].held() && l.is_hidden(R));
        let end = l.record(R, &states(8, 56), 0, 0, &AccountRules::default());
        assert!(!end.unwrap().demote, "foreign regions are never demoted");
    }

    /// `n` pages of each state, in the order given.
    fn pattern(parts: &[(PageState, usize)]) -> Vec<PageState> {
        parts
            .iter()
            .flat_map(|&(s, n)| std::iter::repeat_n(s, n))
            .collect()
    }

    #[test]
    fn a_settled_region_trims_its_long_unmerged_stretches_only() {
        use PageState::*;
        let rules = AccountRules::default();
        let mut l = one(4096);
        let look = pattern(&[
            (Merged, 1000),
            (Present, 1000),
            (NotPresent, 10),
            (Present, 990),
            (Merged, 600),
            (Present, 100),
            (Merged, 396),
        ]);
        // Not promoted, or promoted and not settled: nothing to trim.
        assert!(l[R].unmerged_stretches(0, 256, 16).is_empty());
        l.mark(R, 0, 0);
        // A pass ending at ksmd's deciding scan (3): the next one decides.
        assert_eq!(l.record(R, &look, 0, 3, &rules), Some(PassEnd::default()));
        assert!(l[R].unmerged_stretches(0, 256, 16).is_empty());
        let end = l.record(R, &look, SEC, 4, &rules).unwrap();
        assert!(end.settled);
        // Settled: the present, unmerged stretches cut inward to 16-page
        // blocks; the pages not present split them; the 100-page one is
        // too short.
        assert_eq!(
            l[R].unmerged_stretches(0, 256, 16),
            vec![(1008, 2000), (2016, 2992)]
        );
        // Blocks of the address space: a region starting 8 pages into one.
        assert_eq!(
            l[R].unmerged_stretches(8, 256, 16),
            vec![(1000, 1992), (2024, 3000)]
        );
        assert_eq!(
            l[R].unmerged_stretches(0, 1000, 16),
            Vec::<(u32, u32)>::new()
        );
        assert!(
            l[R].unmerged_stretches(0, 0, 16).is_empty(),
            "0 turns it off"
        );
        // Pages merged since split a stretch: the last look counts.
        let mut later = look.clone();
        later[1500..1510].fill(Merged);
        l.record(R, &later, 2 * SEC, 5, &rules).unwrap();
        assert_eq!(
            l[R].unmerged_stretches(0, 256, 16),
            vec![(1008, 1488), (1520, 2000), (2016, 2992)]
        );
        // A foreign region is its process's: never trimmed.
        let mut f = one(4096);
        f.foreign(R, 0, 0);
        f.record(R, &look, 0, 3, &rules).unwrap();
        f.record(R, &look, SEC, 4, &rules).unwrap();
        assert!(f[R].settled() && f[R].unmerged_stretches(0, 256, 16).is_empty());
    }

    #[test]
    fn a_trimmed_region_samples_and_a_kept_piece_is_settled_at_once() {
        let rules = AccountRules::default();
        let mut l = one(512);
        // A marked piece of a settled region: promoted, settled, shown to
        // the ladder, asking ksmd for nothing, its first pass due now.
        assert!(l.adopt_settled(R, 7, 3 * SEC));
        assert_eq!(l.mode(R), Some(Mode::Promoted));
        assert!(l[R].settled() && !l.is_hidden(R));
        assert_eq!(l[R].waiting_pages(7), 0);
        assert_eq!(l.passes_due(3 * SEC), vec![R]);
        let end = l.record(R, &states(500, 12), 3 * SEC, 7, &rules).unwrap();
        assert!(!end.settled, "settled before this pass");
        assert!(!l[R].pass_due(4 * SEC, None), "then every settled_every");
        // Only a sampling region is adopted.
        assert!(!l.adopt_settled(R, 7, 4 * SEC));
        // Trimmed whole: sampling, shown, not held.
        assert!(l.trimmed(R));
        assert_eq!(l.mode(R), Some(Mode::Sampling));
        assert!(!l.is_hidden(R) && l[R].holds() == 0);
        assert!(!l.trimmed(R), "only a promoted region");
        assert!(l.mark(R, 8, 5 * SEC), "and it can be marked again");
    }

    #[test]
    fn cow_breaks_are_pages_seen_merged_then_present() {
        let rules = AccountRules::default();
        let mut l = one(4);
        l.mark(R, 0, 0);
        use PageState::*;
        l.record(R, &[Merged, Zero, Merged, NotPresent], 0, 0, &rules);
        assert_eq!(l[R].last_pass().fresh, 3);
        l.record(R, &[Present, Merged, NotPresent, Present], 0, 0, &rules);
        let p = l[R].last_pass();
        assert_eq!((p.merged, p.fresh, p.present, p.cow), (1, 0, 2, 1));
        assert_eq!(l[R].cow_total(), 1, "page 2 was unmapped, not broken");
        l.record(R, &[Merged, Present, Present, Present], 0, 0, &rules);
        assert_eq!(l[R].cow_total(), 2);
        assert_eq!(l[R].last_pass().fresh, 1);
    }

    #[test]
    fn a_thrashing_region_is_flagged_for_demotion() {
        let rules = AccountRules::default();
        let mut l = one(256);
        l.mark(R, 0, 0);
        let end = l.record(R, &states(256, 0), 0, 0, &rules).unwrap();
        assert!(!end.demote, "one pass is not enough");
        // 128 of the 256 merged pages broken: 0.5 is not above V_cow.
        let mut s = states(128, 128);
        let end = l.record(R, &s, 0, 0, &rules).unwrap();
        assert!(!end.demote);
        // Merged again, then 129 breaks over the 256 pages merged before:
        // one pass above V_cow is a burst, not yet thrashing.
        s = vec![PageState::Merged; 256];
        l.record(R, &s, 0, 0, &rules);
        s = states(127, 129);
        assert!(!l.record(R, &s, 0, 0, &rules).unwrap().demote);
        // The 127 still merged broken too in the very next pass:
        // thrashing.
        assert!(l.record(R, &states(0, 256), 0, 0, &rules).unwrap().demote);
        // V_cow = 100 % turns demotion off.
        let off = AccountRules {
            v_cow: 1.0,
            ..rules
        };
        l.record(R, &[PageState::Merged; 256], 0, 0, &off);
        assert!(!l.record(R, &states(127, 129), 0, 0, &off).unwrap().demote);
    }

    #[test]
    fn a_burst_that_rewrites_every_merged_page_once_is_no_thrashing() {
        let rules = AccountRules::default();
        let mut l = one(2512);
        l.mark(R, 0, 0);
        l.record(R, &states(2512, 0), 0, 0, &rules);
        l.record(R, &states(2512, 0), 0, 0, &rules);
        // Every merged page written with new content, then left alone.
        for _ in 0..5 {
            let end = l.record(R, &states(0, 2512), 0, 0, &rules).unwrap();
            assert!(!end.demote);
        }
        assert_eq!(l[R].cow_total(), 2512);
    }

    /// Merged, written, back at the top and merged again, round after
    /// round, each round's breaks seen by its first pass only: thrashing,
    /// though no two passes in a row are above V_cow, and a settled pass
    /// below it follows each round (a heap of `pagesift-workload
    /// short-lived` did this every 5 s under the defaults). Bursts further
    /// apart than the window are not.
    #[test]
    fn a_region_that_breaks_in_every_merging_round_is_flagged() {
        let rules = AccountRules::default();
        // A round at `t` s: two passes, the second begun after the deciding
        // scan (settled), with 53 pages merged, and a settled pass a
        // second later that finds them still merged.
        let round = |l: &mut Lifecycles, scans: &mut u64, t: u64| {
            let a = l.record(R, &states(53, 65), t * SEC, *scans + 5, &rules);
            *scans += 5;
            let b = l.record(R, &states(53, 65), t * SEC, *scans, &rules);
            let c = l.record(R, &states(53, 65), (t + 1) * SEC, *scans, &rules);
            let (a, b, c) = (a.unwrap(), b.unwrap(), c.unwrap());
            assert!(b.settled && !a.demote && !b.demote && !c.demote);
        };
        // Written 5 s after each round: the first pass of the next round
        // finds all 53 broken.
        let burst = |l: &mut Lifecycles, scans: u64, t: u64| {
            assert!(l.remerge(R, scans, t * SEC));
            l.record(R, &states(0, 118), t * SEC, scans, &rules)
                .unwrap()
        };
        let mut l = one(118);
        l.mark(R, 0, 0);
        let mut scans = 0;
        round(&mut l, &mut scans, 0);
        assert!(
            !burst(&mut l, scans, 5).demote,
            "one burst is not thrashing"
        );
        round(&mut l, &mut scans, 5);
        assert!(burst(&mut l, scans, 10).demote, "broken again: thrashing");

        // The same bursts more than two settled intervals (60 s) apart.
        let mut l = one(118);
        l.mark(R, 0, 0);
        let mut scans = 0;
        round(&mut l, &mut scans, 0);
        assert!(!burst(&mut l, scans, 5).demote);
        round(&mut l, &mut scans, 5);
        assert!(
            !burst(&mut l, scans, 70).demote,
            "bursts apart: no thrashing"
        );
        round(&mut l, &mut scans, 70);
        assert!(burst(&mut l, scans, 80).demote);
    }

    #[test]
    fn unexplained_breaks_bring_settled_passes_forward_within_the_gap() {
        let rules = AccountRules::default();
        let mut l = Lifecycles::new();
        let (settled, merging, sampling) = (RegionId(1), RegionId(2), RegionId(3));
        for id in [settled, merging, sampling] {
            l.track(id, 64, 0);
        }
        l.mark(settled, 0, 0);
        l.mark(merging, 0, 0);
        // `settled` settles in a pass ending at 9 s, is passed over once
        // more a second later (as while it merged), then every 30 s: next
        // at 40 s.
        let end = l.record(settled, &states(64, 0), 9 * SEC, 0, &rules);
        assert!(end.unwrap().settled);
        l.record(settled, &states(64, 0), 10 * SEC, 0, &rules);
        assert!(!l[settled].pass_due(39 * SEC, None) && l[settled].pass_due(40 * SEC, None));
        // Breaks 2 s after that pass: not before 5 s after it ended.
        assert_eq!(l.hasten_settled_passes(12 * SEC, 5 * SEC), 1);
        assert!(!l[settled].pass_due(14 * SEC, None) && l[settled].pass_due(15 * SEC, None));
        // Later: at once; asking again moves nothing.
        assert_eq!(l.hasten_settled_passes(20 * SEC, 5 * SEC), 0);
        assert!(l[settled].pass_due(20 * SEC, None));
        // Neither a merging region (passed over often anyway) nor one
        // that is not accounted, nor one in the middle of a pass.
        assert!(!l[merging].settled() && !l[sampling].accounted());
        let mut l2 = one(128);
        l2.mark(R, 0, 0);
        l2.record(R, &states(128, 0), 0, 0, &rules);
        l2.record(R, &states(64, 0), SEC, 0, &rules);
        assert_eq!(l2[R].cursor(), 64);
        assert_eq!(l2.hasten_settled_passes(60 * SEC, SEC), 0);
    }

    #[test]
    fn a_few_breaks_are_no_thrashing() {
        let rules = AccountRules::default();
        let mut l = one(32);
        l.mark(R, 0, 0);
        l.record(R, &states(32, 0), 0, 0, &rules);
        let end = l.record(R, &states(17, 15), 0, 0, &rules).unwrap();
        assert!(!end.demote, "15 breaks < min_breaks");
    }

    #[test]
    fn resizing_keeps_the_cursor_inside() {
        let mut l = one(128);
        l.mark(R, 0, 0);
        l.record(R, &states(100, 0), 0, 0, &AccountRules::default());
        l.track(R, 64, 0);
        assert_eq!((l[R].cursor(), l[R].pages()), (0, 64));
        assert_eq!(
            l.record(R, &states(80, 0), 0, 0, &AccountRules::default())
                .map(|e| e.settled),
            Some(true)
        );
    }

    /// A region that replaces a held one (its VMA joined or split) is
    /// held to the same end, hidden from the ladder, released then, and
    /// its next hold doubles from the holds it took over. A region not
    /// sampling, or a hold already over, takes nothing.
    #[test]
    fn a_region_that_replaces_a_held_one_takes_its_hold_over() {
        let old = RegionId(R.0 + 1);
        let mut l = one(64);
        l.track(old, 128, 0);
        let until = l.hold(old, 0, 60).unwrap();
        let held = l[old].held_state().unwrap();
        assert_eq!(
            held,
            HeldState {
                until,
                holds: 1,
                since_cleared: true
            }
        );
        assert!(l[R].held_state().is_none());
        l.forget(old);
        assert!(!l.inherit_hold(R, held, until), "over at its end");
        l.take_view_changed();
        assert!(l.inherit_hold(R, held, 10 * SEC));
        assert_eq!(l[R].mode(), Mode::Held { until });
        assert!(l.is_hidden(R) && l.take_view_changed());
        assert!(l[R].held_since_cleared());
        assert!(!l.inherit_hold(R, held, 10 * SEC), "held already");
        assert!(l.release_due(until - 1).is_empty());
        assert_eq!(l.release_due(until), vec![R]);
        let next = l.hold(R, until, 60).unwrap();
        assert_eq!(next - until, hold_time(60, 2));
        // Joined with one a watch found cold: cold too.
        let mut l = one(64);
        let cold = HeldState {
            until: SEC,
            holds: 3,
            since_cleared: false,
        };
        let warm = HeldState {
            until: 2 * SEC,
            holds: 1,
            since_cleared: false,
        };
        assert!(l.inherit_hold(R, cold.join(warm), 0));
        assert_eq!(
            (l[R].mode(), l[R].holds()),
            (Mode::Held { until: 2 * SEC }, 3)
        );
        assert!(!l[R].held_since_cleared());
        let mut l = one(64);
        l.mark(R, 0, 0);
        assert!(!l.inherit_hold(R, warm, 0), "promoted");
        assert_eq!(l[R].mode(), Mode::Promoted);
    }

    #[test]
    fn forgetting_a_region_drops_it_from_the_hidden_set() {
        let mut l = one(64);
        l.hold(R, 0, 60);
        assert!(l.forget(R).is_some_and(|x| x.held()));
        assert!(l.hidden().is_empty() && l.is_empty());
        assert!(l.hold(R, 0, 60).is_none() && !l.mark(R, 0, 0));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Track(u8, u32),
        Forget(u8),
        Mark(u8),
        Remerge(u8),
        Hold(u8, u64),
        Inherit(u8, u64, u32, bool),
        Release(u8),
        ReleaseDue,
        Foreign(u8),
        StopForeign(u8),
        Adopt(u8),
        Trimmed(u8),
        Prepare,
        Hasten(u64),
        ScanMoves(u64),
        Record(u8, Vec<u8>),
        Tick(u64),
        Scan,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0u8..6, 1u32..300).prop_map(|(i, p)| Op::Track(i, p)),
            1 => (0u8..6).prop_map(Op::Forget),
            3 => (0u8..6).prop_map(Op::Mark),
            1 => (0u8..6).prop_map(Op::Remerge),
            3 => (0u8..6, 0u64..100).prop_map(|(i, b)| Op::Hold(i, b)),
            2 => (0u8..6, 0u64..200 * SEC, 0u32..8, any::<bool>())
                .prop_map(|(i, t, n, c)| Op::Inherit(i, t, n, c)),
            2 => (0u8..6).prop_map(Op::Release),
            2 => Just(Op::ReleaseDue),
            1 => (0u8..6).prop_map(Op::Foreign),
            1 => (0u8..6).prop_map(Op::StopForeign),
            1 => (0u8..6).prop_map(Op::Adopt),
            1 => (0u8..6).prop_map(Op::Trimmed),
            1 => Just(Op::Prepare),
            1 => (0u64..60 * SEC).prop_map(Op::Hasten),
            2 => (0u64..600).prop_map(Op::ScanMoves),
            4 => (0u8..6, prop::collection::vec(0u8..4, 0..300)).prop_map(|(i, s)| Op::Record(i, s)),
            3 => (0u64..200 * SEC).prop_map(Op::Tick),
            1 => Just(Op::Scan),
        ]
    }

    fn state(k: u8) -> PageState {
        [
            PageState::NotPresent,
            PageState::Zero,
            PageState::Merged,
            PageState::Present,
        ][k as usize % 4]
    }

    proptest! {
        /// After any sequence of operations: the hidden set is exactly the
        /// held and merging regions, and the indexes of holds, merging and
        /// accounted regions match the lifecycles; the sampling set never
        /// changes without `sampling_changes` moving; a change of visibility always raises
        /// the flag; a region is never held and promoted; holds end only at
        /// or after their end (or when their process takes them over), and
        /// the n-th lasts hold_time(base, n); COW totals never decrease;
        /// cursors stay inside their regions.
        #[test]
        fn lifecycles_keep_their_invariants(ops in prop::collection::vec(op(), 1..120)) {
            let rules = AccountRules {
                min_merged: 1,
                min_breaks: 1,
                merging_gap: 250,
                ..AccountRules::default()
            };
            let mut l = Lifecycles::new();
            let (mut now, mut scans) = (0u64, 0u64);
            let mut cow: HashMap<RegionId, u64> = HashMap::new();
            for op in ops {
                let before: HashMap<RegionId, Lifecycle> =
                    l.iter().map(|(id, x)| (id, x.clone())).collect();
                let hidden_before = l.hidden().clone();
                let sampling_before: BTreeSet<RegionId> =
                    l.iter().filter(|(_, x)| x.mode() == Mode::Sampling).map(|(id, _)| id).collect();
                let changes_before = l.sampling_changes();
                let mut forgot = None;
                let mut released_by_op = false;
                let mut must_change = false;
                match op {
                    Op::Track(i, p) => l.track(RegionId(i.into()), p, now),
                    Op::Forget(i) => {
                        forgot = Some(RegionId(i.into()));
                        l.forget(RegionId(i.into()));
                        cow.remove(&RegionId(i.into()));
                    }
                    Op::Mark(i) => {
                        let id = RegionId(i.into());
                        let held = l.get(id).is_some_and(|x| x.held());
                        let done = l.mark(id, scans, now);
                        prop_assert_eq!(done, l.get(id).is_some() && !held);
                    }
                    Op::Remerge(i) => { l.remerge(RegionId(i.into()), scans, now); }
                    Op::Hold(i, base) => {
                        let id = RegionId(i.into());
                        let n = l.get(id).map(|x| x.holds());
                        if let Some(until) = l.hold(id, now, base) {
                            let n = n.unwrap() + 1;
                            prop_assert_eq!(l[id].holds(), n);
                            prop_assert_eq!(until, now + hold_time(base, n));
                            prop_assert!(until - now >= (base * SEC).min(MAX_HOLD));
                            must_change = true;
                            prop_assert!(l.is_hidden(id));
                        }
                    }
                    Op::Inherit(i, t, n, c) => {
                        let id = RegionId(i.into());
                        let was = l.get(id).map(|x| (x.mode(), x.holds()));
                        let held = HeldState { until: t, holds: n, since_cleared: c };
                        let done = l.inherit_hold(id, held, now);
                        prop_assert_eq!(
                            done,
                            t > now && matches!(was, Some((Mode::Sampling, _)))
                        );
                        if done {
                            let x = &l[id];
                            prop_assert_eq!(x.mode(), Mode::Held { until: t });
                            prop_assert_eq!(x.holds(), was.unwrap().1.max(n).max(1));
                            if c {
                                prop_assert!(x.held_since_cleared());
                            } else {
                                prop_assert!(!x.held_since_cleared());
                            }
                            must_change = true;
                            prop_assert!(l.is_hidden(id));
                        } else {
                            prop_assert_eq!(l.get(id).map(|x| (x.mode(), x.holds())), was);
                        }
                    }
                    Op::Release(i) => { l.release(RegionId(i.into()), now); released_by_op = true; }
                    Op::ReleaseDue => {
                        let mut due: Vec<RegionId> = (l.iter())
                            .filter(|(_, x)| matches!(x.mode(), Mode::Held { until } if until <= now))
                            .map(|(id, _)| id)
                            .collect();
                        let mut released = l.release_due(now);
                        released.sort();
                        due.sort();
                        prop_assert_eq!(&released, &due, "release_due released other regions");
                        for id in released {
                            prop_assert_eq!(l.mode(id), Some(Mode::Sampling));
                        }
                        released_by_op = true;
                    }
                    Op::Foreign(i) => { l.foreign(RegionId(i.into()), scans, now); }
                    Op::StopForeign(i) => l.stop_foreign(RegionId(i.into())),
                    Op::Adopt(i) => {
                        let id = RegionId(i.into());
                        let sampling = l.mode(id) == Some(Mode::Sampling);
                        prop_assert_eq!(l.adopt_settled(id, scans, now), sampling);
                        if sampling {
                            prop_assert!(l[id].settled() && !l.is_hidden(id));
                        }
                    }
                    Op::Trimmed(i) => {
                        let id = RegionId(i.into());
                        let promoted = l.mode(id) == Some(Mode::Promoted);
                        prop_assert_eq!(l.trimmed(RegionId(i.into())), promoted);
                    }
                    Op::Prepare => { l.prepare_passes(scans, now, rules.settle_scans); }
                    Op::ScanMoves(d) => {
                        // Unknown now and then, as on a kernel without the
                        // page counters.
                        let at = l.scan.map_or(scans * 1000, |p| p + d);
                        l.set_scan_position((d % 7 != 0).then_some(at));
                    }
                    Op::Hasten(gap) => {
                        let movable = (l.iter())
                            .filter(|(_, x)| {
                                x.accounted() && x.settled() && x.cursor() == 0
                                    && x.pass_ended_at.saturating_add(gap).max(now) < x.next_pass_at
                            })
                            .count();
                        prop_assert_eq!(l.hasten_settled_passes(now, gap), movable);
                    }
                    Op::Record(i, s) => {
                        let s: Vec<PageState> = s.into_iter().map(state).collect();
                        l.record(RegionId(i.into()), &s, now, scans, &rules);
                    }
                    Op::Tick(dt) => now += dt,
                    Op::Scan => scans += 1,
                }
                // The sampling regions never change unseen.
                let sampling: BTreeSet<RegionId> =
                    l.iter().filter(|(_, x)| x.mode() == Mode::Sampling).map(|(id, _)| id).collect();
                if sampling != sampling_before {
                    prop_assert!(l.sampling_changes() > changes_before, "the sampling set changed unseen");
                }
                // The indexes agree with the lifecycles.
                let holds: BTreeSet<(Nanos, RegionId)> = (l.iter())
                    .filter_map(|(id, x)| match x.mode() {
                        Mode::Held { until } => Some((until, id)),
                        _ => None,
                    })
                    .collect();
                prop_assert_eq!(&l.holds, &holds);
                let merging: BTreeSet<RegionId> =
                    l.iter().filter(|(_, x)| x.merging()).map(|(id, _)| id).collect();
                prop_assert_eq!(&l.merging, &merging);
                let accounted: BTreeSet<RegionId> =
                    l.iter().filter(|(_, x)| x.accounted()).map(|(id, _)| id).collect();
                prop_assert_eq!(&l.accounted, &accounted);
                let waiting: u64 = l.values().map(|x| x.waiting_pages(3)).sum();
                prop_assert_eq!(l.merging_values().map(|x| x.waiting_pages(3)).sum::<u64>(), waiting);
                prop_assert_eq!(l.accounted_values().count(), accounted.len());
                let due: Vec<RegionId> =
                    l.iter().filter(|(_, x)| x.pass_due(now, l.scan)).map(|(id, _)| id).collect();
                prop_assert_eq!(l.passes_due(now), due);
                // hidden ⇔ held or merging, and nothing else is hidden.
                let expected: BTreeSet<RegionId> =
                    l.iter().filter(|(_, x)| x.hidden()).map(|(id, _)| id).collect();
                prop_assert_eq!(l.hidden(), &expected);
                let changed = l.take_view_changed();
                let mut seen_before = hidden_before.clone();
                if let Some(id) = forgot {
                    seen_before.remove(&id);
                }
                if &seen_before != l.hidden() {
                    prop_assert!(changed, "visibility changed without the flag");
                }
                prop_assert!(changed || !must_change, "a hold without the flag");
                for (id, x) in l.iter() {
                    prop_assert_eq!(x.held(), l.is_hidden(id) && !x.merging());
                    prop_assert!(!(x.held() && x.accounted()));
                    prop_assert!(x.cursor() < x.pages() || x.pages() == 0);
                    prop_assert_eq!(x.seen_merged.len(), (x.pages() as usize).div_ceil(64));
                    prop_assert_eq!(x.seen_unmerged.len(), x.seen_merged.len());
                    // A page is seen merged or unmerged, never both.
                    for (m, u) in x.seen_merged.iter().zip(&x.seen_unmerged) {
                        prop_assert_eq!(m & u, 0);
                    }
                    // Trimmed stretches: inside the region, in order,
                    // long enough, aligned, and unmerged page for page.
                    let mut last_end = 0;
                    for (s, e) in x.unmerged_stretches(3, 4, 4) {
                        prop_assert!(last_end <= s && s < e && e <= x.pages());
                        prop_assert!(e - s >= 4 && (s + 3) % 4 == 0 && (e + 3) % 4 == 0);
                        for p in s..e {
                            prop_assert!(x.seen_unmerged[(p / 64) as usize] & (1 << (p % 64)) != 0);
                        }
                        last_end = e;
                    }
                    let c = cow.entry(id).or_insert(0);
                    prop_assert!(x.cow_total() >= *c, "COW total decreased");
                    *c = x.cow_total();
                    if let Some(Mode::Held { until }) = before.get(&id).map(|b| b.mode())
                        && !x.held()
                    {
                        // Ended: by a release at or after its end, or its
                        // process took it over.
                        prop_assert!(
                            (released_by_op && now >= until) || x.mode() == Mode::Foreign,
                            "a hold ended early"
                        );
                    }
                }
            }
        }

        /// Each hold is twice the one before until the cap, never shorter
        /// than the base (or the cap).
        #[test]
        fn hold_times_double_and_never_undercut_the_base(base in 0u64..10_000, n in 1u32..40) {
            let t = hold_time(base, n);
            prop_assert!(t >= (base * SEC).min(MAX_HOLD));
            prop_assert!(t <= MAX_HOLD);
            prop_assert_eq!(hold_time(base, n + 1), (2 * t).min(MAX_HOLD));
        }
    }
}
