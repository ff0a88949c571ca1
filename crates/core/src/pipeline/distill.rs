//! One wake-up of region distilling: sample → hash → index → ladder
//! (UKSM §5.3, Figure 4, and UKSM's released `uksm.c`).
//!
//! Each wake-up, level `l` gets `pages_per_wakeup(p_l, T_s, s)` samples and
//! walks its flat page space at `sampling_interval(L_l, s, t_l, p_l)`. A
//! level does at most one round per wake-up: UKSM keeps scanning a finished
//! rung, but pagesift hands top-level regions to ksmd, so re-sampling a
//! small top level many times per wake-up would only burn CPU.
//!
//! A level's walk is sampled in batches ([`SAMPLE_BATCH`] pages, whole
//! clusters of the ladder's `cluster_pages`): the source reports the
//! batch's page states and reads its present pages in one
//! [`MemorySource::sample_pages`] call, then each page is taken in turn.
//!
//! For every sampled page:
//! - **not present**: a sample without duplicate (never read: reading it
//!   would fault it in on Linux);
//! - **zero page / merged**: counts as merged; a merged page's content is
//!   entered into the stable set so new copies of it are found at once;
//! - **present**: read, hashed at the current strength and fingerprinted;
//!   looked up in the stable set by its fingerprint (the stable set is
//!   keyed by content, below), then in the unstable set by its hash.
//!   Every hash hit is verified
//!   (below); a failed check is a false collision and is charged to the
//!   strength controller. A verified pair moves into the stable set and
//!   both regions are credited (UKSM §5.3: "increase the counters of both
//!   regions").
//!
//! **Verification.** UKSM compares a hash hit's two pages byte by byte,
//! because it merges them right away. pagesift does not merge: a verified
//! pair only counts toward its region's duplication ratio, and ksmd
//! compares bytes before it merges anything. So a hit is verified against
//! the candidate's *fingerprint* (XXH3-64 of every byte,
//! [`crate::pipeline::hash::fingerprint`]), taken when the candidate was
//! indexed and kept in its index entry, instead of by reading the candidate
//! again. The sampled page was read whole anyway (a remote read costs per
//! page, not per byte), so its fingerprint costs one pass over a page in
//! cache, where the re-read cost a pagemap read and a remote read of a page
//! that is usually no longer in any cache: measured on 1 GiB of distinct
//! and 256 MiB of identical memory, the re-reads were a quarter of the
//! distil phase's CPU (docs/sampling-cost.md). What the check gives up:
//! a candidate written since it was indexed still matches the content it
//! had. That staleness is bounded: unstable entries live one global round,
//! stable entries are merged pages (a write COW-breaks them, which the
//! probes below see) and are replaced whenever the walk samples their page
//! again. At worst a region is credited one duplicate too many, and ksmd
//! finds nothing to merge for that page.
//!
//! COW breaks cannot be hooked from user space, so each region keeps a few
//! *probes*: sampled pages that were merged or duplicated. Each merged or
//! duplicate sample checks the oldest probe once it is at least one round
//! of the region's level old: a probe that was merged and is now an
//! ordinary present page, or that the source reports written since it was
//! seen, is a COW break (real, or the one a merge would have suffered).
//! The ratio the ladder sees is therefore "of the duplicates seen, how many
//! were written within a round", UKSM's COW-broken ratio measured without
//! a fault hook. It is what demotes a region whose duplicates do not stay
//! duplicates.
//!
//! **Runs.** A region poor in duplicates never climbs, yet it may hold a
//! run of pages that some other place holds too (a library loaded twice, a
//! guest's copy of a file). Such copies are usually copies of whole runs:
//! if page `p` equals page `q`, page `p + k` tends to equal `q + k`. So when
//! a sample of a region that the ladder has judged at least once, and
//! found below V_dup, is a verified duplicate, the distiller follows the
//! run from it: it compares `p ± k` with `q ± k` in full (or checks that
//! they are zero, for a run of zero pages), up to [`RUN_EXTEND_PAGES`] in
//! each direction, stopping at the first page that differs, is not
//! present (never read: that would fault it in) or is outside either
//! region. Every page read is charged to the level's budget. A region
//! follows at most one run per round of its level, and never from inside
//! a run it reported that recently. Runs of at least two pages are
//! reported ([`DupRun`]) with where their twin run starts; the caller
//! decides whether a run is worth making mergeable on its own (a run of
//! verified duplicate pages inside a region that does not climb).
//!
//! **Hints** (XLH, dissertation §4.3.4). [`Distiller::wake_with_hints`]
//! takes pages that just received file data from a [`HintStack`] and
//! interleaves them with the ladder's walk at the [`Interleave`] ratio:
//! the wake-up's total budget is a sequence of picks; a hint slot samples
//! the newest live hint, a linear slot (or a hint slot with no hint left)
//! goes to the levels, which then split the linear picks in proportion to
//! their budgets. The hint slots' pages are looked up a batch at a time:
//! picks are made until [`SAMPLE_BATCH`] hinted pages are chosen (or the
//! budget or the stack runs out), and the source reports their states and
//! reads them in one [`MemorySource::sample_pages`] call, as for the
//! levels' walk. A file read hints hundreds of adjacent pages at once; one
//! page at a time, each look-up cost a pagemap read and a remote read of
//! its own. A batch can read pages that a run
//! followed from an earlier hint of the same batch then covers: those are
//! skipped after the read, as before it for runs of earlier batches. The
//! hints of one read come off the stack page after page, so a duplicate
//! found at a batch's first page usually covers the rest of it: the next
//! batch after one that found a duplicate is one page, and each batch that
//! finds none doubles the next, up to [`SAMPLE_BATCH`] (as a run's reads
//! grow, `Distiller::reach`). With whole batches of 64 after every hit,
//! the loop test `hints_outlive_global_rounds_until_the_walk_could_reach_their_pages`
//! left 2 219 of 16 384 hints unread in 30 s under its CPU cap (one suite
//! run, 2026-12-03): the wasted reads cost the look-ups their budget.
//! A hinted page is always looked up, whatever its region's
//! level ("when processing a hint, the page is always looked-up", §4.3.4),
//! is never recorded on the ladder (hints are no uniform sample of their
//! region), and when it is a verified duplicate its run is followed at
//! once, up to [`HINT_RUN_EXTEND_PAGES`] a side, in any region and without
//! the one-run-per-round limit, and
//! reported even if it is one page long (`DupRun::hinted`): a file read is
//! exactly the run of duplicates the rule above waits a round for. A hint
//! inside a run reported recently is skipped without reading. The pages
//! of a run followed from a hint go into the stable set (each matched
//! pair's hinted side), so a third copy hinted later finds its twin there
//! though only two pages of the run were looked up. Marking the run cuts
//! its region in the kernel (the run becomes a VMA, hence a region, of
//! its own), so the caller moves those entries to the new regions
//! ([`Distiller::remap_regions`]); an entry left past a shortened region's
//! end would name a twin that cannot be read, and [`Distiller::sync_regions`]
//! drops any it finds. A hinted
//! page of a region the distiller does not track (held by the caller) is
//! looked up too, and reported as a run of one page (its region's bounds
//! are unknown here).
//!
//! Levels are walked top-down, so a region that climbs at the end of a
//! level's round waits for the next wake-up to be sampled on its new level
//! instead of racing up several levels at once.
//!
//! A global round ends when every non-empty level has finished a round;
//! then the strength controller adjusts, and the unstable set is rebuilt
//! at the new strength. The stable set is keyed by its pages' fingerprints
//! (XXH3-64 of every byte, folded to 32 bits: [`stable_key`]), not by the
//! partial hash: every page the walk reads is fingerprinted anyway, so the
//! key costs nothing, and a strength change leaves the stable set as it is.
//! (UKSM's code re-keys every stable node at each change, by delta hashing
//! from its old hash: in the kernel a page costs a memory read, here a
//! remote read of a few µs. Until 2026-12-02 pagesift re-keyed too, by
//! reading every stable page again once a new strength had held for three
//! global rounds: 7.7 % of the daemon's CPU samples in a quick vm-boot run
//! of three booting guests, perf, by hand.)

use crate::pipeline::governor::{
    CostEma, Governor, GovernorParams, pages_per_wakeup, sampling_interval,
};
use crate::pipeline::hash::{PartialHasher, Shifts, fingerprint};
use crate::pipeline::hints::{HintStack, Interleave, Next};
use crate::pipeline::index::{IndexConfig, IndexSet, SampleIndex};
use crate::pipeline::ladder::{Ladder, LadderConfig, MAX_CLUSTER_PAGES, Move, Sample};
use crate::pipeline::strength::{StrengthConfig, StrengthController};
use crate::source::{MemorySource, PageState, SourceError};
use crate::{Nanos, PageBuffer, PageRef, PageWords, RegionId, WORDS_PER_PAGE};
use hashbrown::HashMap;
use std::collections::VecDeque;

/// Probes kept per region for COW detection.
const PROBES_PER_REGION: usize = 16;

/// Most pages a run is followed from a duplicate sample, in each
/// direction: 64 pages (256 KiB) a side bound the cost of one follow to
/// about 256 page reads, a few hundred µs. pagesift's choice; a longer run
/// is found again from a sample further along it.
pub const RUN_EXTEND_PAGES: u32 = 64;

/// Most pages a run found from a hint is followed in each direction: a
/// file read is one long run (4 MiB here), and following it whole in one
/// go marks it with one call instead of splitting its region into many
/// marked pieces that each restart at the bottom of the ladder. The reads
/// are charged to the wake's budget like any other. pagesift's choice.
pub const HINT_RUN_EXTEND_PAGES: u32 = 1024;

/// Runs remembered per region, so that a sample inside a run reported
/// within the last round does not follow it again.
const RUNS_PER_REGION: usize = 8;

/// A run of consecutive pages of one region, each verified equal (full
/// comparison) to the page at the same offset of its twin run, or each a
/// zero page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DupRun {
    /// The region holding the run.
    pub region: RegionId,
    /// Its first page.
    pub first: u32,
    /// Its length in pages (at least 2).
    pub pages: u32,
    /// Where the twin run starts (page `first + k` equals `twin.page + k`);
    /// `None` for a run of zero pages, which merge among themselves.
    pub twin: Option<PageRef>,
    /// Found from a hint (module header): reported even when one page long
    /// and in a region the ladder does not hold.
    pub hinted: bool,
}

impl DupRun {
    /// One past the last page.
    pub fn end(&self) -> u32 {
        self.first + self.pages
    }
}

/// Everything a [`Distiller`] needs to start.
#[derive(Clone, Debug)]
pub struct DistillerConfig {
    pub ladder: LadderConfig,
    pub governor: Governor,
    /// T_s, the sleep between wake-ups (UKSM's default 100 ms).
    pub sleep: Nanos,
    pub index: IndexConfig,
    pub strength: StrengthConfig,
    pub shifts: Shifts,
    /// Seeds the hash permutation and the ladder's offsets.
    pub seed: u64,
}

impl Default for DistillerConfig {
    fn default() -> Self {
        DistillerConfig {
            ladder: LadderConfig::default(),
            governor: Governor::default(),
            sleep: 100_000_000,
            index: IndexConfig::default(),
            strength: StrengthConfig::default(),
            shifts: Shifts::DEFAULT,
            seed: 0x7061_6765_7369_6674, // "pagesift"
        }
    }
}

/// What one wake-up did.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct WakeReport {
    /// Pages sampled per level.
    pub sampled: Vec<u64>,
    /// The governor's page budget per level for this wake-up.
    pub budget: Vec<u64>,
    /// Sampled pages found duplicated (verified).
    pub duplicates: u64,
    /// Sampled pages already merged or zero.
    pub merged: u64,
    /// COW breaks detected through probes.
    pub cow_breaks: u64,
    /// Runs of verified duplicates followed from this wake's samples (see
    /// the module header), in the order found.
    pub runs: Vec<DupRun>,
    /// Pages read while following runs (charged to the levels' budgets,
    /// included in `sampled`).
    pub run_pages_read: u64,
    /// Hash hits that a full comparison rejected.
    pub false_collisions: u64,
    /// Hinted pages looked up (module header, "Hints").
    pub hints_sampled: u64,
    /// Hinted pages found duplicated (verified).
    pub hint_duplicates: u64,
    /// Hints skipped because their page lies in a run reported lately.
    pub hints_in_runs: u64,
    /// Pages read for hints (hinted pages and their runs), beside
    /// `sampled`: the hints' share of the wake's budget.
    pub hint_pages_read: u64,
    /// Ladder moves made at the end of level rounds.
    pub moves: Vec<Move>,
    /// Regions that disappeared while being sampled.
    pub gone: Vec<RegionId>,
    /// Whether a global round ended in this wake-up.
    pub global_round_ended: bool,
    /// Hash strength after this wake-up.
    pub strength: u32,
}

#[derive(Clone, Copy, Debug)]
struct Probe {
    page: u32,
    merged: bool,
    seen_at: Nanos,
}

#[derive(Clone, Debug, Default)]
struct Tracked {
    pages: u32,
    probes: VecDeque<Probe>,
    /// When a run was last followed in this region.
    run_at: Option<Nanos>,
    /// Runs reported lately: (first, end, when).
    runs: VecDeque<(u32, u32, Nanos)>,
}

/// Pages a level's walk samples in one [`MemorySource::sample_pages`]
/// call. On Linux a sample costs mostly syscalls (a pagemap read, maybe a
/// kpageflags read, a remote read), and a batch shares the remote read
/// among its pages: one `process_vm_readv` with an iovec per page. 64
/// pages hold 256 KiB of words, and are read within microseconds of their
/// states (the contents are as fresh as a page-by-page read's). pagesift's
/// choice; docs/sampling-cost.md has the measurements.
pub const SAMPLE_BATCH: usize = 64;

/// Steps of a run read in its first batch, and in its largest (see
/// `Distiller::reach`). pagesift's choice. The first batch is one step:
/// most runs found from I/O hints in guest RAM are a page long (guest
/// page cache is scattered), and a first batch of 4 read 8 pages for
/// each of them where 2 were needed (page-cache experiment, 2026-11-25:
/// 7.7 CPU-s of distilling in 80 s).
const RUN_STEPS_FIRST: u32 = 1;
const RUN_STEPS_MOST: u32 = 32;
// A run's batch holds both sides of its largest step batch.
const _: () = assert!(2 * RUN_STEPS_MOST as usize <= SAMPLE_BATCH);

/// A run being followed from `page` (twin `twin`, `None`: zero pages) in
/// regions of `pages` and `twin_pages` pages, at most `limit` steps a side
/// and until `WakeReport::run_pages_read` reaches `read_limit`.
struct RunWalk {
    page: PageRef,
    twin: Option<PageRef>,
    pages: u32,
    twin_pages: u32,
    limit: u32,
    read_limit: u64,
    /// Put each matched pair's page into the stable set (module header,
    /// "Hints"): a run found from a hint.
    index: bool,
}

/// One batch of pages sampled together: the pages, then what the source
/// found.
struct Batch {
    pages: Vec<PageRef>,
    words: PageBuffer,
    states: Vec<Result<PageState, SourceError>>,
    read: Vec<bool>,
}

impl Batch {
    /// Room for a batch and the cluster that may end it.
    const ROOM: usize = SAMPLE_BATCH + MAX_CLUSTER_PAGES as usize;

    fn new() -> Batch {
        Batch {
            pages: Vec::with_capacity(Self::ROOM),
            words: PageBuffer::new(Self::ROOM),
            states: vec![Ok(PageState::NotPresent); Self::ROOM],
            read: vec![false; Self::ROOM],
        }
    }
}

/// The page being sampled, kept apart from the rest so a verification
/// closure can borrow it while the index is borrowed too. Its words stay
/// in `Distiller::batch` (slot `at`), which nothing refills until the
/// sample is over: copying them out cost about a third of a µs a page
/// (perf by hand, 2026-12-04, docs/sampling-cost.md).
struct Scratch {
    /// The slot of `Distiller::batch.words` that holds the page's words.
    at: usize,
    /// [`fingerprint`] of those words, set with `at`.
    fingerprint: u64,
}

/// UKSM's scanner, minus the merging: it decides, the caller actuates.
pub struct Distiller {
    config: DistillerConfig,
    hasher: PartialHasher,
    controller: StrengthController,
    index: SampleIndex,
    ladder: Ladder,
    params: GovernorParams,
    cost: CostEma,
    regions: HashMap<RegionId, Tracked>,
    round_done: Vec<bool>,
    /// When each level's current round started (`None`: never).
    round_started: Vec<Option<Nanos>>,
    /// Levels whose round was walked early: judged when its time is up.
    judgement_due: Vec<bool>,
    global_rounds: u64,
    zero_hash: u32,
    scratch: Scratch,
    /// The level walk's batch.
    batch: Batch,
    /// A run's batch (a run is followed while the walk's batch is in use).
    run_batch: Batch,
    /// Hinted pages the next hint batch reads: 1 after a batch that found
    /// a duplicate, doubling after each batch that found none, up to
    /// [`SAMPLE_BATCH`] (module header, "Hints").
    hint_batch: usize,
}

impl Distiller {
    pub fn new(config: DistillerConfig) -> Self {
        let hasher = PartialHasher::new(config.seed, config.shifts);
        let controller = StrengthController::new(config.strength);
        let strength = controller.strength();
        let zero_hash = hasher.hash(&[0; WORDS_PER_PAGE], strength);
        let levels = config.ladder.levels;
        Distiller {
            params: config.governor.params(levels),
            ladder: Ladder::new(config.ladder.clone(), config.seed ^ 0x6c61_6464_6572),
            index: SampleIndex::new(config.index),
            hasher,
            controller,
            cost: CostEma::new(),
            regions: HashMap::new(),
            round_done: vec![false; levels],
            round_started: vec![None; levels],
            judgement_due: vec![false; levels],
            global_rounds: 0,
            zero_hash,
            scratch: Scratch {
                at: 0,
                fingerprint: 0,
            },
            batch: Batch::new(),
            run_batch: Batch::new(),
            hint_batch: 1,
            config,
        }
    }

    pub fn config(&self) -> &DistillerConfig {
        &self.config
    }
    pub fn ladder(&self) -> &Ladder {
        &self.ladder
    }
    /// Raises a region to the top level on outside evidence
    /// ([`Ladder::raise`]); returns whether it moved.
    pub fn raise(&mut self, id: RegionId, dup_ratio: f64, now: Nanos) -> bool {
        self.ladder.raise(id, dup_ratio, now).is_some()
    }
    /// Raises a region to the top level on its predecessors' evidence
    /// ([`Ladder::raise_on_history`]); returns whether it moved.
    pub fn raise_on_history(&mut self, id: RegionId, dup_ratio: f64) -> bool {
        self.ladder.raise_on_history(id, dup_ratio).is_some()
    }
    /// Parks a region on its level ([`Ladder::park`]).
    pub fn park(&mut self, id: RegionId) -> bool {
        self.ladder.park(id)
    }
    /// Ends a region's park ([`Ladder::readmit`]).
    pub fn readmit(&mut self, id: RegionId) -> bool {
        self.ladder.readmit(id)
    }
    pub fn index(&self) -> &SampleIndex {
        &self.index
    }
    pub fn controller(&self) -> &StrengthController {
        &self.controller
    }
    pub fn params(&self) -> &GovernorParams {
        &self.params
    }
    /// Global rounds completed.
    pub fn global_rounds(&self) -> u64 {
        self.global_rounds
    }
    /// The per-page cost the budgets currently assume, in ns.
    pub fn per_page_ns(&self) -> f64 {
        self.cost.value()
    }

    /// Switches governor; takes effect at the next wake-up.
    pub fn set_governor(&mut self, governor: Governor) {
        self.config.governor = governor;
        self.params = governor.params(self.config.ladder.levels);
    }

    /// Replaces the per-level budgets (a governor's, with the round time
    /// or CPU cap an operator configured); takes effect at the next
    /// wake-up.
    ///
    /// # Panics
    /// If `params` does not hold exactly one budget per level.
    pub fn set_params(&mut self, params: GovernorParams) {
        assert_eq!(
            params.levels.len(),
            self.config.ladder.levels,
            "one budget per level"
        );
        self.params = params;
    }

    /// T_s, the sleep the next wake-up's budgets assume.
    pub fn sleep(&self) -> Nanos {
        self.config.sleep
    }

    /// Sets T_s for the next wake-up's budgets: the caller that sleeps
    /// longer (or shorter) than the configured T_s says so, and each level
    /// keeps its share of the CPU, hence its pages per unit of time, with
    /// more (or fewer) pages per wake-up. A sleep of 0 is taken as 1 ns.
    pub fn set_sleep(&mut self, sleep: Nanos) {
        self.config.sleep = sleep.max(1);
    }

    /// Feeds the measured CPU cost of the last wake-up's samples (ns per
    /// page) into the EMA the budgets use. The caller measures: the core
    /// has no clock.
    pub fn observe_cost(&mut self, ns_per_page: f64) {
        if ns_per_page.is_finite() && ns_per_page > 0.0 {
            self.cost.update(ns_per_page);
        }
    }

    /// Brings the tracked regions in line with the source: new regions
    /// enter the bottom level, vanished ones leave, resized ones are
    /// resized.
    pub fn sync_regions(&mut self, src: &impl MemorySource, now: Nanos) {
        self.sync_regions_keeping(src, now, |_| false);
    }

    /// [`sync_regions`](Self::sync_regions) for a caller that hides
    /// regions from the source's view while they still exist (held for
    /// their writes, or marked and merging): a region that left the view
    /// and for which `hidden` is true leaves the ladder, but its pages stay
    /// in the index. Those are the pages of marked runs, the very twins a
    /// later copy's hint must find; dropped when the marks hid their
    /// regions, they left the files experiment's last reader, whose hints
    /// for a stretch it read late came after the mark, without a twin
    /// (about one run in five, 2026-12-02: 368 hinted pages looked up, no
    /// duplicate found, marked by the ladder 15–26 s later). A caller that
    /// keeps entries this way drops them itself when their region goes
    /// ([`remap_regions`](Self::remap_regions)).
    pub fn sync_regions_keeping(
        &mut self,
        src: &impl MemorySource,
        now: Nanos,
        hidden: impl Fn(RegionId) -> bool,
    ) {
        let current = src.regions();
        let mut live: HashMap<RegionId, u32> = HashMap::with_capacity(current.len());
        let mut shrunk = Vec::new();
        for r in &current {
            live.insert(r.id, r.pages);
            match self.regions.get_mut(&r.id) {
                Some(t) if t.pages != r.pages => {
                    if r.pages < t.pages {
                        shrunk.push(r.id);
                    }
                    t.pages = r.pages;
                    t.probes.retain(|p| p.page < r.pages);
                    t.runs.retain(|&(_, end, _)| end <= r.pages);
                    self.ladder.resize(r.id, r.pages);
                }
                Some(_) => {}
                None => {
                    self.regions.insert(
                        r.id,
                        Tracked {
                            pages: r.pages,
                            ..Tracked::default()
                        },
                    );
                    self.ladder.insert(r.id, r.pages, now);
                }
            }
        }
        let gone: Vec<RegionId> = self
            .regions
            .keys()
            .filter(|&id| !live.contains_key(id))
            .copied()
            .collect();
        for id in gone {
            if hidden(id) {
                self.regions.remove(&id);
                self.ladder.remove(id);
            } else {
                self.forget(id);
            }
        }
        // Entries past a shorter region's end name pages it no longer has
        // (a caller that knows where they went moves them first, with
        // `remap_regions`).
        if !shrunk.is_empty() {
            self.index
                .remap_regions(&shrunk, |p| (p.page < live[&p.region]).then_some(p));
        }
        let tracked: u64 = live.values().map(|&p| p as u64).sum();
        self.index.set_tracked_pages(tracked);
    }

    /// Moves the index's entries of `regions` to the pages `to` says now
    /// hold them, dropping those it maps to `None` ([`SampleIndex::remap_regions`]):
    /// for a caller whose regions changed shape, before the next
    /// [`sync_regions`](Self::sync_regions). The pages of a run followed
    /// from a hint are stable entries that later hints look their twins
    /// up among; when marking the run cut its region, the entries past the
    /// cut would otherwise name offsets the region no longer has, and a
    /// later copy's hint would find only twins that cannot be read.
    /// Returns (moved, dropped).
    pub fn remap_regions(
        &mut self,
        regions: &[RegionId],
        to: impl FnMut(PageRef) -> Option<PageRef>,
    ) -> (u64, u64) {
        self.index.remap_regions(regions, to)
    }

    fn forget(&mut self, id: RegionId) {
        self.regions.remove(&id);
        self.ladder.remove(id);
        self.index.remove_region(id);
    }

    /// The page budget of each level for one wake-up at the current cost.
    pub fn budgets(&self) -> Vec<u64> {
        self.params
            .levels
            .iter()
            .map(|l| pages_per_wakeup(l.cpu_share, self.config.sleep, self.cost.value()))
            .collect()
    }

    /// One wake-up: sample every level within its budget.
    pub fn wake(&mut self, src: &mut impl MemorySource, now: Nanos) -> WakeReport {
        let budget = self.budgets();
        self.wake_levels(src, now, budget.clone(), budget)
    }

    /// One wake-up whose budget is shared between the hints on `stack` and
    /// the ladder's walk at the `interleave` ratio (module header, "Hints").
    pub fn wake_with_hints(
        &mut self,
        src: &mut impl MemorySource,
        now: Nanos,
        stack: &mut HintStack,
        interleave: &mut Interleave,
    ) -> WakeReport {
        let budget = self.budgets();
        let total: u64 = budget.iter().sum();
        let mut report = WakeReport::default();
        let (mut spent, mut linear) = (0u64, 0u64);
        while spent < total {
            if stack.is_empty() {
                // No hint can come before the wake-up ends: the rest is
                // the ladder's.
                interleave.skip_linear(total - spent);
                linear += total - spent;
                spent = total;
                break;
            }
            // The next picks, until a batch of hints to look up is full
            // (module header, "Hints": looked up a batch at a time).
            self.batch.pages.clear();
            while spent < total && self.batch.pages.len() < self.hint_batch && !stack.is_empty() {
                spent += 1;
                match interleave.next(stack, now) {
                    Next::Hint(h) if self.in_recent_run(h.page) => report.hints_in_runs += 1,
                    Next::Hint(h) => self.batch.pages.push(h.page),
                    Next::Linear => linear += 1,
                }
            }
            let n = self.batch.pages.len();
            if n == 0 {
                continue;
            }
            self.sample_batch(src);
            let found_before = report.hint_duplicates;
            for i in 0..n {
                let page = self.batch.pages[i];
                // A run followed from an earlier hint of this batch may
                // hold this one: read for nothing, but not followed twice.
                if self.in_recent_run(page) {
                    report.hints_in_runs += 1;
                    continue;
                }
                let (state, read) = self.take_sampled(i);
                let read_before = report.run_pages_read;
                let left = total.saturating_sub(spent);
                self.look_up_hint(src, page, state, read, now, left, &mut report);
                spent += report.run_pages_read - read_before;
            }
            self.hint_batch = if report.hint_duplicates > found_before {
                1
            } else {
                (self.hint_batch * 2).min(SAMPLE_BATCH)
            };
        }
        // The levels share the linear picks in proportion to their budgets.
        let scaled: Vec<u64> = if total == 0 {
            budget.clone()
        } else {
            budget
                .iter()
                .map(|&b| (b as u128 * linear as u128 / total as u128) as u64)
                .collect()
        };
        let mut levels = self.wake_levels(src, now, budget, scaled);
        levels.hints_sampled = report.hints_sampled;
        levels.hint_duplicates = report.hint_duplicates;
        levels.hints_in_runs = report.hints_in_runs;
        levels.hint_pages_read = spent - linear;
        levels.false_collisions += report.false_collisions;
        let mut runs = std::mem::take(&mut report.runs);
        runs.append(&mut levels.runs);
        levels.runs = runs;
        for id in report.gone {
            if !levels.gone.contains(&id) {
                levels.gone.push(id);
            }
        }
        levels
    }

    /// Walks every level within `budget` (reported as the wake's budget is
    /// `shown`).
    fn wake_levels(
        &mut self,
        src: &mut impl MemorySource,
        now: Nanos,
        shown: Vec<u64>,
        budget: Vec<u64>,
    ) -> WakeReport {
        let levels = self.ladder.levels();
        let mut report = WakeReport {
            sampled: vec![0; levels],
            budget: shown,
            ..Default::default()
        };
        let s = self.cost.value();
        for level in (0..levels).rev() {
            let pages = self.ladder.level_pages(level);
            if pages == 0 {
                self.round_done[level] = true;
                continue;
            }
            let lb = self.params.levels[level];
            // A sample point costs a cluster of pages.
            let k = f64::from(self.config.ladder.cluster_pages);
            self.ladder.set_interval(
                level,
                sampling_interval(pages, s * k, lb.round_time, lb.cpu_share),
            );
            if self.ladder.round_finished(level) {
                // With early decisions a level can walk its round well
                // before the round's time is up; the round still lasts
                // that time: its verdicts come, and the next round starts,
                // when it is up (see the ladder's header), so only samples
                // are saved.
                if self.round_early(level, now, lb.round_time) {
                    continue;
                }
                if self.judgement_due[level] {
                    self.judgement_due[level] = false;
                    report.moves.extend(self.ladder.end_round(level, now));
                    self.round_done[level] = true;
                }
                self.ladder.start_round(level);
                self.round_started[level] = Some(now);
            }
            let mut walked = false;
            while !walked && report.sampled[level] < budget[level] {
                // The next batch of the level's walk, sampled in one go.
                let want = (budget[level] - report.sampled[level]).min(SAMPLE_BATCH as u64);
                self.batch.pages.clear();
                while (self.batch.pages.len() as u64) < want {
                    let Some(first) = self.ladder.next_sample(level) else {
                        walked = true;
                        break;
                    };
                    let cluster = (0..self.ladder.cluster_len(first)).map(|j| PageRef {
                        region: first.region,
                        page: first.page + j,
                    });
                    self.batch.pages.extend(cluster);
                }
                let n = self.batch.pages.len();
                if n == 0 {
                    break;
                }
                self.sample_batch(src);
                for i in 0..n {
                    report.sampled[level] += 1;
                    let page = self.batch.pages[i];
                    let (state, read) = self.take_sampled(i);
                    // Pages of this batch still to come keep their share.
                    let ahead = (n - 1 - i) as u64;
                    let left = budget[level].saturating_sub(report.sampled[level] + ahead);
                    let read_before = report.run_pages_read;
                    self.sample(
                        src,
                        page,
                        state,
                        read,
                        now,
                        lb.round_time,
                        left,
                        &mut report,
                    );
                    report.sampled[level] += report.run_pages_read - read_before;
                }
            }
            if self.ladder.round_finished(level) {
                if self.round_early(level, now, lb.round_time) {
                    self.judgement_due[level] = true;
                } else {
                    report.moves.extend(self.ladder.end_round(level, now));
                    self.round_done[level] = true;
                }
            }
        }
        for id in report.gone.clone() {
            self.forget(id);
        }
        let all_done = (0..levels).all(|l| self.round_done[l] || self.ladder.level_pages(l) == 0);
        if all_done {
            self.end_global_round();
            report.global_round_ended = true;
        }
        report.strength = self.controller.strength();
        report
    }

    /// Whether `level`'s round, walked by `now`, is early: early
    /// decisions are on and its round time will not be up by the next
    /// wake-up (a round due before then ends now, as a walk at a fixed
    /// density would: waiting a wake-up would only delay its verdicts).
    fn round_early(&self, level: usize, now: Nanos, round_time: Nanos) -> bool {
        self.config.ladder.early_decision
            && self.round_started[level]
                .is_some_and(|t| now.saturating_add(self.sleep()) < t.saturating_add(round_time))
    }

    fn end_global_round(&mut self) {
        self.global_rounds += 1;
        self.round_done.iter_mut().for_each(|d| *d = false);
        let old = self.controller.strength();
        if let Some(new) = self.controller.end_round()
            && new != old
        {
            self.zero_hash = self.hasher.hash(&[0; WORDS_PER_PAGE], new);
        }
        self.index.clear_unstable();
        // Coordinated sampling restarts with the unstable set: regions of
        // one size sample the same offsets until the next global round.
        self.ladder.new_epoch();
    }

    /// Takes one sample: `page` in `state`, its words in `scratch`'s batch slot if
    /// `read` (the batch read them).
    #[allow(clippy::too_many_arguments)]
    fn sample(
        &mut self,
        src: &mut impl MemorySource,
        page: PageRef,
        state: Result<PageState, SourceError>,
        read: bool,
        now: Nanos,
        probe_age: Nanos,
        run_budget: u64,
        report: &mut WakeReport,
    ) {
        let state = match state {
            Ok(s) => s,
            Err(SourceError::Gone(id)) => {
                if !report.gone.contains(&id) {
                    report.gone.push(id);
                }
                return;
            }
            Err(_) => return,
        };
        let mut sample = Sample {
            duplicate: false,
            merged: false,
            cow_broken: false,
        };
        match state {
            PageState::NotPresent => {}
            PageState::Zero => sample.merged = true,
            PageState::Merged => {
                sample.merged = true;
                if read {
                    let key = stable_key(self.scratch.fingerprint);
                    if self.find(IndexSet::Stable, key, page, report).is_none() {
                        self.index
                            .insert_stable(key, page, self.scratch.fingerprint);
                    }
                }
            }
            PageState::Present => {
                let Some(hash) = self.hash_read(read) else {
                    return;
                };
                self.controller.on_hashed(1);
                let mut twin = None;
                if hash == self.zero_hash && self.sampled_words().iter().all(|&w| w == 0) {
                    // KSM merges zero pages into the zero page (use_zero_pages)
                    // or with each other: a duplicate either way.
                    sample.duplicate = true;
                } else if let Some(t) = self.find(
                    IndexSet::Stable,
                    stable_key(self.scratch.fingerprint),
                    page,
                    report,
                ) {
                    sample.duplicate = true;
                    twin = Some(t);
                } else if let Some(t) = self.find(IndexSet::Unstable, hash, page, report) {
                    twin = Some(t);
                    sample.duplicate = true;
                    self.index.insert_stable(
                        stable_key(self.scratch.fingerprint),
                        t,
                        self.scratch.fingerprint,
                    );
                    self.ladder.record(
                        t,
                        Sample {
                            duplicate: true,
                            merged: false,
                            cow_broken: false,
                        },
                    );
                }
                if sample.duplicate
                    && let Some(run) =
                        self.follow_run(src, page, twin, now, probe_age, run_budget, report)
                {
                    report.runs.push(run);
                }
            }
        }
        if sample.duplicate || sample.merged {
            sample.cow_broken = self.check_probe(src, page, state, now, probe_age);
            if sample.cow_broken {
                report.cow_breaks += 1;
            }
        }
        report.duplicates += sample.duplicate as u64;
        report.merged += sample.merged as u64;
        self.ladder.record(page, sample);
    }

    /// Checks the oldest probe of the page's region if it is `min_age` old,
    /// and makes the page (sampled in `state`) a probe if there is room.
    /// Returns whether the probe was COW-broken.
    fn check_probe(
        &mut self,
        src: &mut impl MemorySource,
        page: PageRef,
        state: PageState,
        now: Nanos,
        min_age: Nanos,
    ) -> bool {
        let Some(t) = self.regions.get_mut(&page.region) else {
            return false;
        };
        let mut broken = false;
        if t.probes.front().is_some_and(|p| now - p.seen_at >= min_age) {
            let old = t.probes.pop_front().expect("front exists");
            let at = PageRef {
                region: page.region,
                page: old.page,
            };
            let unmerged = old.merged && src.page_state(at) == Ok(PageState::Present);
            broken = unmerged || src.take_written(at) == Some(true);
        }
        if t.probes.len() < PROBES_PER_REGION && !t.probes.iter().any(|p| p.page == page.page) {
            // Reset the write flag: only writes after now count.
            let _ = src.take_written(page);
            let merged = state == PageState::Merged;
            t.probes.push_back(Probe {
                page: page.page,
                merged,
                seen_at: now,
            });
        }
        broken
    }

    /// Follows the run of verified duplicates through `page` (whose words
    /// are in `scratch`'s batch slot), whose twin is `twin` (`None`: a zero page),
    /// if its region may follow one now (see the module header), reading at
    /// most `budget` pages. Returns the run if it is at least two pages
    /// long.
    #[allow(clippy::too_many_arguments)]
    fn follow_run(
        &mut self,
        src: &mut impl MemorySource,
        page: PageRef,
        twin: Option<PageRef>,
        now: Nanos,
        round_time: Nanos,
        budget: u64,
        report: &mut WakeReport,
    ) -> Option<DupRun> {
        let stats = self.ladder.region_stats(page.region)?;
        // Rich regions climb on their own; unjudged ones may yet.
        if stats.judged == 0 || stats.last_dup_ratio >= self.config.ladder.v_dup {
            return None;
        }
        let t = self.regions.get_mut(&page.region)?;
        let fresh = |at: Nanos| now.saturating_sub(at) < round_time;
        t.runs.retain(|&(_, _, at)| fresh(at));
        if t.run_at.is_some_and(fresh)
            || t.runs.iter().any(|&(a, b, _)| (a..b).contains(&page.page))
        {
            return None;
        }
        t.run_at = Some(now);
        let run = self.extend_run(src, page, twin, budget, false, report);
        if run.pages < 2 {
            return None;
        }
        self.remember_run(&run, now);
        Some(run)
    }

    /// Remembers `run` in its region so that samples inside it do not
    /// follow it again soon.
    fn remember_run(&mut self, run: &DupRun, now: Nanos) {
        if let Some(t) = self.regions.get_mut(&run.region) {
            if t.runs.len() == RUNS_PER_REGION {
                t.runs.pop_front();
            }
            t.runs.push_back((run.first, run.end(), now));
        }
    }

    /// The run of verified duplicates through `page` (its words in
    /// `scratch`'s batch slot), twin `twin`, reading at most `budget` pages: the
    /// page alone if its region is not tracked. A run
    /// followed from a hint (`hinted`) goes further and is indexed
    /// ([`HINT_RUN_EXTEND_PAGES`], module header, "Hints").
    fn extend_run(
        &mut self,
        src: &mut impl MemorySource,
        page: PageRef,
        twin: Option<PageRef>,
        budget: u64,
        hinted: bool,
        report: &mut WakeReport,
    ) -> DupRun {
        let alone = DupRun {
            region: page.region,
            first: page.page,
            pages: 1,
            twin,
            hinted: false,
        };
        let Some(pages) = self.regions.get(&page.region).map(|t| t.pages) else {
            return alone;
        };
        // A twin in a region the caller hides (its index entries stay,
        // `sync_regions_keeping`) has no known end here: the walk's reads
        // stop there instead (a page past the end cannot be read).
        let twin_pages = match twin {
            Some(q) => self.regions.get(&q.region).map_or(u32::MAX, |t| t.pages),
            None => 0,
        };
        let read_limit = report.run_pages_read + budget;
        let run = RunWalk {
            page,
            twin,
            pages,
            twin_pages,
            limit: if hinted {
                HINT_RUN_EXTEND_PAGES
            } else {
                RUN_EXTEND_PAGES
            },
            read_limit,
            index: hinted,
        };
        let back = self.reach(src, &run, -1, report);
        let ahead = self.reach(src, &run, 1, report);
        DupRun {
            region: page.region,
            first: page.page - back,
            pages: back + ahead + 1,
            twin: twin.map(|q| PageRef {
                region: q.region,
                page: q.page - back,
            }),
            hinted: false,
        }
    }

    /// How far `run` goes in direction `dir` (±1): pages p + dir·k equal
    /// to twin pages q + dir·k (or zero), k = 1, 2, …, up to `run.limit`
    /// steps and `run.read_limit` pages read in all. The steps are read in
    /// batches of [`RUN_STEPS_FIRST`] steps, doubling up to [`RUN_STEPS_MOST`]:
    /// a run's pages and its twin's are contiguous, so a batch costs the
    /// source a pagemap read and a remote read per side instead of four
    /// calls a step, and most runs a sample lands in are short, so the
    /// first batches are small. Every page the batches read is charged,
    /// including those past the run's end.
    fn reach(
        &mut self,
        src: &mut impl MemorySource,
        run: &RunWalk,
        dir: i64,
        report: &mut WakeReport,
    ) -> u32 {
        let per_step: u64 = if run.twin.is_some() { 2 } else { 1 };
        // Steps possible before leaving either region. A twin found in the
        // index may lie past the end of a region that was cut shorter
        // since (a refresh after a config reload): no room there.
        let room = |first: u32, len: u32| -> u32 {
            if first >= len {
                0
            } else if dir < 0 {
                first
            } else {
                len - 1 - first
            }
        };
        let mut bound = run.limit.min(room(run.page.page, run.pages));
        if let Some(q) = run.twin {
            bound = bound.min(room(q.page, run.twin_pages));
        }
        let mut k = 0u32;
        let mut chunk = RUN_STEPS_FIRST;
        while k < bound {
            let affordable = run.read_limit.saturating_sub(report.run_pages_read) / per_step;
            let n = chunk
                .min(bound - k)
                .min(affordable.min(u32::MAX as u64) as u32);
            if n == 0 {
                break;
            }
            let at = |start: u32, step: u32| (start as i64 + dir * (k + 1 + step) as i64) as u32;
            let b = &mut self.run_batch;
            b.pages.clear();
            for step in 0..n {
                b.pages.push(PageRef {
                    region: run.page.region,
                    page: at(run.page.page, step),
                });
            }
            if let Some(q) = run.twin {
                for step in 0..n {
                    b.pages.push(PageRef {
                        region: q.region,
                        page: at(q.page, step),
                    });
                }
            }
            let Batch {
                pages,
                words,
                states,
                read,
            } = b;
            src.sample_pages(pages, words, states, read);
            report.run_pages_read += read[..pages.len()].iter().filter(|&&r| r).count() as u64;
            let n = n as usize;
            let matched = (0..n)
                .take_while(|&i| {
                    let here = (&states[i], read[i]);
                    match run.twin {
                        None => match here {
                            (Ok(PageState::Zero), _) => true,
                            (_, true) => words[i].iter().all(|&w| w == 0),
                            _ => false,
                        },
                        Some(_) => read[i] && read[n + i] && words[i] == words[n + i],
                    }
                })
                .count();
            if run.index && run.twin.is_some() {
                // The run's pages are known duplicates now, but only the
                // hinted page and its twin were looked up, and the pages
                // looked up before wait in the unstable set, which every
                // global round empties. A copy hinted later (another
                // reader's hints, drained in a later wake-up) must find
                // them in the stable set, or it finds no twin and is left
                // to the ladder.
                let Distiller {
                    index, run_batch, ..
                } = self;
                for i in 0..matched {
                    let fp = fingerprint(&run_batch.words[i]);
                    index.insert_stable(stable_key(fp), run_batch.pages[i], fp);
                }
            }
            k += matched as u32;
            if matched < n {
                break;
            }
            chunk = (chunk * 2).min(RUN_STEPS_MOST);
        }
        k
    }

    /// Looks a hinted page up and follows its run if it is a duplicate
    /// (module header, "Hints"), reading at most `budget` more pages.
    /// Asks the source for the states and words of `batch.pages` in one
    /// call.
    fn sample_batch(&mut self, src: &mut impl MemorySource) {
        let Batch {
            pages,
            words,
            states,
            read,
        } = &mut self.batch;
        src.sample_pages(pages, words, states, read);
    }

    /// The state of the batch's page `i`, and whether it was read; if so
    /// its slot and fingerprint are put in `scratch`.
    fn take_sampled(&mut self, i: usize) -> (Result<PageState, SourceError>, bool) {
        let state = std::mem::replace(&mut self.batch.states[i], Ok(PageState::NotPresent));
        let read = self.batch.read[i];
        if read {
            self.scratch.at = i;
            self.scratch.fingerprint = fingerprint(&self.batch.words[i]);
        }
        (state, read)
    }

    /// Whether `page` lies in a run its region reported lately (a hint
    /// there is skipped: the run was followed already).
    fn in_recent_run(&self, page: PageRef) -> bool {
        self.regions
            .get(&page.region)
            .is_some_and(|t| t.runs.iter().any(|&(a, b, _)| (a..b).contains(&page.page)))
    }

    /// Looks one hinted page up: `state` is its state and, if `read`, its
    /// words and fingerprint are in `scratch` (the hint batch read them).
    /// A verified duplicate's run is followed at once, within `budget`
    /// pages read.
    #[allow(clippy::too_many_arguments)]
    fn look_up_hint(
        &mut self,
        src: &mut impl MemorySource,
        page: PageRef,
        state: Result<PageState, SourceError>,
        read: bool,
        now: Nanos,
        budget: u64,
        report: &mut WakeReport,
    ) {
        report.hints_sampled += 1;
        match state {
            Ok(PageState::Present) => {}
            Err(SourceError::Gone(id)) => {
                if self.regions.contains_key(&id) && !report.gone.contains(&id) {
                    report.gone.push(id);
                }
                return;
            }
            // Not present, merged or zero: nothing to find.
            _ => return,
        }
        let Some(hash) = self.hash_read(read) else {
            return;
        };
        self.controller.on_hashed(1);
        let twin = if hash == self.zero_hash && self.sampled_words().iter().all(|&w| w == 0) {
            None
        } else if let Some(t) = self.find(
            IndexSet::Stable,
            stable_key(self.scratch.fingerprint),
            page,
            report,
        ) {
            Some(t)
        } else if let Some(t) = self.find(IndexSet::Unstable, hash, page, report) {
            self.index.insert_stable(
                stable_key(self.scratch.fingerprint),
                t,
                self.scratch.fingerprint,
            );
            Some(t)
        } else {
            return;
        };
        report.hint_duplicates += 1;
        let mut run = self.extend_run(src, page, twin, budget, true, report);
        run.hinted = true;
        self.remember_run(&run, now);
        report.runs.push(run);
    }

    /// The hash of the sampled page's words, if they were `read`.
    fn hash_read(&self, read: bool) -> Option<u32> {
        read.then(|| {
            self.hasher
                .hash(self.sampled_words(), self.controller.strength())
        })
    }

    /// The words of the page being sampled (see [`Scratch`]).
    fn sampled_words(&self) -> &PageWords {
        &self.batch.words[self.scratch.at]
    }

    /// Looks `page` (whose words and fingerprint are in `scratch`) up in
    /// the stable set, or in the unstable set where it is inserted if no
    /// twin is found.
    fn find(
        &mut self,
        set: IndexSet,
        hash: u32,
        page: PageRef,
        report: &mut WakeReport,
    ) -> Option<PageRef> {
        let Distiller {
            index,
            scratch,
            controller,
            ..
        } = self;
        let fp = scratch.fingerprint;
        let same = |cand, cand_fp| verify(controller, report, page, fp, cand, cand_fp);
        match set {
            IndexSet::Stable => index.find_stable(hash, same),
            IndexSet::Unstable => index.find_or_insert_unstable(hash, page, fp, same),
        }
    }
}

/// The check behind every hash hit (module header, "Verification"): the
/// sampled page's fingerprint against the one the candidate was indexed
/// with. A candidate whose fingerprint differs is a false collision of the
/// partial hash.
fn verify(
    controller: &mut StrengthController,
    report: &mut WakeReport,
    page: PageRef,
    fp: u64,
    cand: PageRef,
    cand_fp: u64,
) -> bool {
    if cand == page {
        return false;
    }
    let same = fp == cand_fp;
    if !same {
        controller.on_false_collision();
        report.false_collisions += 1;
    }
    same
}

/// The stable set's key for a page of fingerprint `fp` (module header):
/// its two halves folded, since the index keys are 32 bits.
fn stable_key(fp: u64) -> u32 {
    (fp ^ (fp >> 32)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::{InMemorySource, ZERO_CONTENT};
    use std::collections::BTreeSet;

    const MS: Nanos = 1_000_000;
    const SEC: Nanos = 1_000_000_000;

    fn distiller() -> Distiller {
        Distiller::new(DistillerConfig::default())
    }

    /// A distiller at UKSM's fixed sampling density (no early decisions),
    /// for tests of what that density gives.
    fn fixed_density() -> Distiller {
        let mut c = DistillerConfig::default();
        c.ladder.early_decision = false;
        Distiller::new(c)
    }

    /// Wakes until a global round has ended, returning the reports.
    fn one_global_round(
        d: &mut Distiller,
        src: &mut InMemorySource,
        now: &mut Nanos,
    ) -> Vec<WakeReport> {
        let mut out = Vec::new();
        loop {
            *now += 100 * MS;
            d.sync_regions(src, *now);
            let r = d.wake(src, *now);
            let ended = r.global_round_ended;
            out.push(r);
            if ended {
                return out;
            }
        }
    }

    #[test]
    fn duplicates_across_regions_are_found_and_verified() {
        let mut src = InMemorySource::new();
        // Two small regions holding the same 8 contents: every page has a twin
        // in the other region, none in its own.
        let contents: Vec<u64> = (100..108).collect();
        let a = src.map(1, &contents);
        let b = src.map(2, &contents);
        let mut d = distiller();
        let mut now = 0;
        // Rounds of these tiny regions last one wake-up (100 ms): they can
        // climb once older than V_life (100 ms), in the third.
        let mut reports = Vec::new();
        for _ in 0..3 {
            reports.extend(one_global_round(&mut d, &mut src, &mut now));
        }
        let dups: u64 = reports.iter().map(|r| r.duplicates).sum();
        let sampled: u64 = reports.iter().map(|r| r.sampled.iter().sum::<u64>()).sum();
        assert!(sampled >= 16, "both tiny regions are read whole: {sampled}");
        assert!(
            dups >= 8,
            "every second sample finds its twin: {dups} of {sampled}"
        );
        // Both regions climb: the finder and, credited, the partner.
        let moves: Vec<Move> = reports.iter().flat_map(|r| r.moves.clone()).collect();
        for id in [a, b] {
            assert!(
                moves.contains(&Move::Climb { region: id, to: 1 }),
                "{id:?} did not climb: {moves:?}"
            );
        }
    }

    /// Clusters of 4: the same two-region setup as above, larger, still
    /// finds its duplicates and climbs, and a wake never samples more
    /// than its budget plus the rest of one cluster (runs aside).
    #[test]
    fn clustered_sampling_finds_duplicates_within_budget() {
        let mut src = InMemorySource::new();
        let contents: Vec<u64> = (100..356).collect();
        let a = src.map(1, &contents);
        let b = src.map(2, &contents);
        let mut d = Distiller::new(DistillerConfig {
            ladder: LadderConfig {
                cluster_pages: 4,
                ..LadderConfig::default()
            },
            ..DistillerConfig::default()
        });
        let mut now = 0;
        let mut reports = Vec::new();
        for _ in 0..3 {
            reports.extend(one_global_round(&mut d, &mut src, &mut now));
        }
        for r in &reports {
            for (level, (&got, &budget)) in r.sampled.iter().zip(&r.budget).enumerate() {
                assert!(
                    got <= budget + 3 + r.run_pages_read,
                    "level {level}: {got} sampled on a budget of {budget}"
                );
            }
        }
        let dups: u64 = reports.iter().map(|r| r.duplicates).sum();
        assert!(dups >= 64, "{dups} duplicates found");
        let moves: Vec<Move> = reports.iter().flat_map(|r| r.moves.clone()).collect();
        for id in [a, b] {
            assert!(
                moves.contains(&Move::Climb { region: id, to: 1 }),
                "{id:?} did not climb: {moves:?}"
            );
        }
    }

    #[test]
    fn the_stable_set_is_keyed_by_content_whatever_the_strength() {
        let mut src = InMemorySource::new();
        let contents: Vec<u64> = (500..756).collect();
        // Region 1 is merged: its samples enter the stable set, where
        // region 2's copies find them.
        let merged = src.map(1, &contents);
        for page in 0..contents.len() as u32 {
            src.merge(PageRef {
                region: merged,
                page,
            })
            .unwrap();
        }
        src.map(2, &contents);
        let mut d = distiller();
        let mut now = 0;
        // Every stable entry is keyed by its page's fingerprint, so the
        // controller's moves never leave it at a stale key.
        let check = |d: &Distiller, src: &mut InMemorySource| {
            let mut words = [0; WORDS_PER_PAGE];
            let entries = d.index.stable_entries();
            for &(page, key) in &entries {
                src.read_page(page, &mut words).unwrap();
                assert_eq!(key, stable_key(fingerprint(&words)), "{page:?}");
            }
            entries.len()
        };
        let first = d.controller.strength();
        let mut strengths = BTreeSet::new();
        let mut after_move = None;
        for _ in 0..40 {
            one_global_round(&mut d, &mut src, &mut now);
            assert!(check(&d, &mut src) > 0, "no stable entry");
            strengths.insert(d.controller.strength());
            if after_move.is_none() && d.controller.strength() != first {
                after_move = Some(d.index.stats());
            }
        }
        assert!(
            strengths.len() > 1,
            "the strength never moved: {strengths:?}"
        );
        // Pages sampled after the moves found the twins indexed before
        // them (a candidate that is the page itself counts as a collision).
        let s = d.index.stats().since(&after_move.unwrap());
        assert!(
            s.stable_compared > s.stable_collisions,
            "no stable hit after the strength moved: {s:?}"
        );
    }

    #[test]
    fn set_params_replaces_the_budgets() {
        let mut d = distiller();
        let before = d.budgets();
        let mut p = d.params().clone();
        for l in &mut p.levels {
            l.cpu_share /= 2.0;
        }
        d.set_params(p.clone());
        assert_eq!(d.params(), &p);
        for (a, b) in d.budgets().iter().zip(&before) {
            assert!(a < b, "halving every share must shrink every budget");
        }
    }

    #[test]
    fn early_decisions_save_samples_but_keep_the_rounds_pace() {
        // 8 000 distinct pages and 8 000 duplicated ones: both plain
        // after a few dozen samples a round.
        let mut contents: Vec<u64> = (1..=8_000).collect();
        contents.extend(std::iter::repeat_n(7, 8_000));
        let run = |mut d: Distiller| -> (u64, u64, Vec<Option<usize>>) {
            let mut src = InMemorySource::new();
            let a = src.map(1, &contents[..8_000]);
            let b = src.map(2, &contents[8_000..]);
            d.sync_regions(&src, 0);
            let mut sampled = 0;
            for k in 1..=100 {
                sampled += d.wake(&mut src, k * 100 * MS).sampled.iter().sum::<u64>();
            }
            let levels = vec![d.ladder().level_of(a), d.ladder().level_of(b)];
            (sampled, d.global_rounds(), levels)
        };
        let (early, early_rounds, early_levels) = run(distiller());
        let (fixed, fixed_rounds, fixed_levels) = run(fixed_density());
        assert!(
            early * 4 < fixed,
            "early decisions sampled {early} pages, a fixed density {fixed}"
        );
        // Rounds keep their time (a round due before the next wake-up ends
        // at once, so they may end up to a wake-up sooner).
        assert!(
            early_rounds >= fixed_rounds && early_rounds * 4 <= fixed_rounds * 5 + 4,
            "global rounds: {early_rounds} early, {fixed_rounds} fixed"
        );
        // The same verdicts: the distinct region at the bottom, the other
        // one climbed as far.
        assert_eq!(early_levels, fixed_levels);
        assert_eq!(early_levels[0], Some(0));
        assert!(early_levels[1] > Some(0));
    }

    #[test]
    fn a_longer_sleep_keeps_the_pages_per_second() {
        // 40 000 distinct pages on the bottom level: one wake-up after 1 s
        // samples what ten wake-ups 100 ms apart sample.
        let contents: Vec<u64> = (1..=40_000).collect();
        let sampled = |sleep: Nanos, wakes: u64| -> u64 {
            let mut src = InMemorySource::new();
            src.map(1, &contents);
            let mut d = fixed_density();
            d.set_sleep(sleep);
            assert_eq!(d.sleep(), sleep);
            d.sync_regions(&src, 0);
            (1..=wakes)
                .map(|k| d.wake(&mut src, k * sleep).sampled.iter().sum::<u64>())
                .sum()
        };
        let short = sampled(100 * MS, 10);
        let long = sampled(1000 * MS, 1);
        assert!(short > 1000, "the bottom level samples: {short}");
        assert!(
            long.abs_diff(short) * 20 <= short,
            "1 s of sampling differs: {long} in one wake-up, {short} in ten"
        );
        let mut d = distiller();
        let base = d.budgets();
        d.set_sleep(1000 * MS);
        for (a, b) in d.budgets().iter().zip(&base) {
            assert!(a / 10 >= b - 1 && a / 10 <= b + 1, "{a} vs 10 x {b}");
        }
    }

    #[test]
    fn distinct_pages_are_never_reported_duplicate() {
        let mut src = InMemorySource::new();
        src.set_differing_words(1); // near-identical pages: weak hashes collide
        let r = src.map(1, &(1..=512).collect::<Vec<u64>>());
        let mut d = distiller();
        let mut now = 0;
        for _ in 0..3 {
            let reports = one_global_round(&mut d, &mut src, &mut now);
            assert_eq!(reports.iter().map(|r| r.duplicates).sum::<u64>(), 0);
        }
        assert_eq!(d.ladder().level_of(r), Some(0));
    }

    #[test]
    fn a_hash_hit_is_verified_without_reading_the_candidate_again() {
        let mut src = InMemorySource::new();
        src.map(1, &[7; 256]);
        let mut d = distiller();
        let mut now = 0;
        let reports = one_global_round(&mut d, &mut src, &mut now);
        let sum = |f: fn(&WakeReport) -> u64| reports.iter().map(f).sum::<u64>();
        let sampled = sum(|r| r.sampled.iter().sum());
        assert!(
            sum(|r| r.duplicates) > sampled / 2,
            "identical pages are duplicates"
        );
        // Each sampled page is read once, and runs read their own pages:
        // no read is left for checking a twin.
        assert_eq!(src.reads(), sampled + sum(|r| r.run_pages_read));
    }

    #[test]
    fn a_candidate_that_differs_only_where_the_partial_hash_does_not_look_is_no_twin() {
        // Pages that differ in one word: at low strengths their partial
        // hashes collide, and only the fingerprint tells them apart.
        let mut src = InMemorySource::new();
        src.set_differing_words(1);
        src.map(1, &(1..=256).collect::<Vec<u64>>());
        let mut d = distiller();
        let mut now = 0;
        let reports = one_global_round(&mut d, &mut src, &mut now);
        let collisions: u64 = reports.iter().map(|r| r.false_collisions).sum();
        let dups: u64 = reports.iter().map(|r| r.duplicates).sum();
        assert_eq!(dups, 0);
        assert!(
            collisions > 0,
            "the weak hash collided and the fingerprint caught it"
        );
    }

    #[test]
    fn zero_and_merged_pages_count_as_merged_and_send_a_region_to_the_bottom() {
        let mut src = InMemorySource::new();
        let r = src.map(1, &[ZERO_CONTENT; 64]);
        let mut d = distiller();
        let mut now = 0;
        let reports = one_global_round(&mut d, &mut src, &mut now);
        let merged: u64 = reports.iter().map(|r| r.merged).sum();
        let sampled: u64 = reports.iter().map(|r| r.sampled.iter().sum::<u64>()).sum();
        assert_eq!(merged, sampled);
        assert_eq!(d.ladder().level_of(r), Some(0));
    }

    #[test]
    fn an_unmapped_region_leaves_the_ladder_and_the_index() {
        let mut src = InMemorySource::new();
        let a = src.map(1, &[7; 32]);
        let mut d = distiller();
        let mut now = 0;
        one_global_round(&mut d, &mut src, &mut now);
        assert!(d.ladder().level_of(a).is_some());
        assert!(d.index().stable_len() > 0);
        src.unmap(a);
        d.sync_regions(&src, now);
        assert_eq!(d.ladder().level_of(a), None);
        assert_eq!(d.index().stable_len() + d.index().unstable_len(), 0);
    }

    /// Every run a report holds, checked against the simulation's ground
    /// truth: inside both regions, at least two pages, page by page equal
    /// to its twin.
    fn check_runs(src: &InMemorySource, reports: &[WakeReport]) -> Vec<DupRun> {
        let mut runs = Vec::new();
        for run in reports.iter().flat_map(|r| &r.runs) {
            assert!(run.pages >= 2 && run.pages <= 2 * RUN_EXTEND_PAGES + 1);
            let twin = run.twin.expect("no zero runs in these tests");
            for k in 0..run.pages {
                let here = src.content(PageRef {
                    region: run.region,
                    page: run.first + k,
                });
                let there = src.content(PageRef {
                    region: twin.region,
                    page: twin.page + k,
                });
                assert!(here.is_ok() && here == there, "{run:?} differs at {k}");
            }
            runs.push(*run);
        }
        runs
    }

    #[test]
    fn a_run_inside_a_poor_region_is_followed_to_its_ends() {
        let mut src = InMemorySource::new();
        // A: 512 distinct pages, of which 100..132 repeat B's first 32.
        let mut a_contents: Vec<u64> = (10_000..10_512).collect();
        a_contents[100..132].copy_from_slice(&(5000..5032).collect::<Vec<u64>>());
        let a = src.map(1, &a_contents);
        let mut b_contents: Vec<u64> = (5000..5032).collect();
        b_contents.extend(20_000..20_032);
        let b = src.map(2, &b_contents);
        // At a fixed density: an early decision would let A go after about
        // 70 samples a round, and its run would take more rounds to meet.
        let mut d = fixed_density();
        let mut now = 0;
        let mut reports = Vec::new();
        for _ in 0..12 {
            reports.extend(one_global_round(&mut d, &mut src, &mut now));
        }
        // A is poor (6 % duplicates): it never climbs, but its run is found.
        assert_eq!(d.ladder().level_of(a), Some(0));
        let runs = check_runs(&src, &reports);
        let whole = DupRun {
            region: a,
            first: 100,
            pages: 32,
            twin: Some(PageRef { region: b, page: 0 }),
            hinted: false,
        };
        assert!(runs.contains(&whole), "{runs:?}");
        // B is rich (50 %): it climbs on its own and follows no run.
        assert!(runs.iter().all(|r| r.region == a), "{runs:?}");
        let read: u64 = reports.iter().map(|r| r.run_pages_read).sum();
        assert!(read >= 62, "the run's pages were compared: {read}");
        // At most one follow per region per bottom round.
        let follows = runs.len() as u64;
        assert!(follows <= d.global_rounds(), "{follows} follows");
    }

    /// Two regions share a 64-page run (a file read twice). Hints on one
    /// page of each find and follow the whole run in the first wake-up;
    /// the same wake-up without hints finds nothing.
    #[test]
    fn hints_find_a_shared_run_in_the_first_wake() {
        use crate::pipeline::hints::{Hint, HintStack, Interleave};
        let setup = || {
            let mut src = InMemorySource::new();
            let mut a_contents: Vec<u64> = (10_000..14_096).collect();
            a_contents[1000..1064].copy_from_slice(&(5000..5064).collect::<Vec<u64>>());
            let a = src.map(1, &a_contents);
            let mut b_contents: Vec<u64> = (5000..5064).collect();
            b_contents.extend(20_000..24_032);
            let b = src.map(2, &b_contents);
            (src, a, b)
        };
        let (mut src, a, b) = setup();
        let mut d = distiller();
        d.sync_regions(&src, 0);
        let plain = d.wake(&mut src, 100 * MS);
        assert!(plain.runs.is_empty(), "{:?}", plain.runs);

        let (mut src, a2, b2) = setup();
        assert_eq!((a, b), (a2, b2));
        let mut d = distiller();
        d.sync_regions(&src, 0);
        let mut stack = HintStack::new(64, crate::pipeline::hints::DEFAULT_MAX_AGE);
        // b's read came first, a's last: a's hint is popped first, enters
        // the unstable set; b's finds it.
        stack.push(Hint {
            page: PageRef {
                region: b,
                page: 10,
            },
            time: 0,
        });
        stack.push(Hint {
            page: PageRef {
                region: a,
                page: 1010,
            },
            time: 0,
        });
        let mut il = Interleave::default();
        let r = d.wake_with_hints(&mut src, 100 * MS, &mut stack, &mut il);
        assert_eq!(r.hints_sampled, 2);
        assert_eq!(r.hint_duplicates, 1);
        let hinted: Vec<_> = r.runs.iter().filter(|x| x.hinted).collect();
        assert_eq!(hinted.len(), 1, "{:?}", r.runs);
        let run = hinted[0];
        assert_eq!((run.region, run.first, run.pages), (b, 0, 64));
        assert_eq!(
            run.twin,
            Some(PageRef {
                region: a,
                page: 1000
            })
        );
        check_runs(&src, std::slice::from_ref(&r));
        // The budget was shared: the levels sampled fewer pages than their
        // budget by what the hints and the run cost.
        let sampled: u64 = r.sampled.iter().sum();
        let budget: u64 = r.budget.iter().sum();
        assert!(r.hint_pages_read >= 2 + 2 * 63, "{}", r.hint_pages_read);
        assert!(
            sampled + r.hint_pages_read <= budget + 2,
            "{sampled} + {} > {budget}",
            r.hint_pages_read
        );
        // A hint inside the run just reported is skipped without a read.
        stack.push(Hint {
            page: PageRef {
                region: b,
                page: 30,
            },
            time: 0,
        });
        let r = d.wake_with_hints(&mut src, 200 * MS, &mut stack, &mut il);
        assert_eq!((r.hints_in_runs, r.hints_sampled), (1, 0));
    }

    /// Three processes that each hold one 64-page run in 512 pages of
    /// their own: `a` at page 100, `b` at `b_at`, `c` at 300; a distiller
    /// synced to them.
    fn three_copies(b_at: usize) -> (InMemorySource, [RegionId; 3], Distiller) {
        let mut src = InMemorySource::new();
        let shared: Vec<u64> = (5000..5064).collect();
        let regions =
            [(1, 10_000, 100), (2, 20_000, b_at), (3, 30_000, 300)].map(|(owner, first, at)| {
                let mut contents: Vec<u64> = (first..first + 512).collect();
                contents[at..at + 64].copy_from_slice(&shared);
                src.map(owner, &contents)
            });
        let mut d = distiller();
        d.sync_regions(&src, 0);
        (src, regions, d)
    }

    fn hint_at(region: RegionId, page: u32) -> crate::pipeline::hints::Hint {
        crate::pipeline::hints::Hint {
            page: PageRef { region, page },
            time: 0,
        }
    }

    /// A third copy of a shared run, hinted later at a page of the run
    /// other than the two looked up, still finds a twin: the run's pages
    /// went into the index when it was followed (a reader whose hints
    /// come in a later drain than the first two readers').
    #[test]
    fn a_later_hint_finds_its_twin_among_a_followed_runs_pages() {
        use crate::pipeline::hints::{DEFAULT_MAX_AGE, HintStack, Interleave};
        let (mut src, [a, b, c], mut d) = three_copies(0);
        let mut il = Interleave::default();
        let mut stack = HintStack::new(64, DEFAULT_MAX_AGE);
        stack.push(hint_at(b, 10));
        stack.push(hint_at(a, 110));
        let r = d.wake_with_hints(&mut src, 100 * MS, &mut stack, &mut il);
        assert_eq!(r.hint_duplicates, 1, "{:?}", r.runs);
        // c's hint names the shared run's page 40: in a and b only pages
        // 10 were looked up.
        stack.push(hint_at(c, 340));
        let r = d.wake_with_hints(&mut src, 200 * MS, &mut stack, &mut il);
        assert_eq!((r.hints_sampled, r.hint_duplicates), (1, 1));
        let run = r.runs.iter().find(|x| x.region == c).expect("c's run");
        assert_eq!((run.first, run.pages), (300, 64), "{run:?}");
        check_runs(&src, std::slice::from_ref(&r));
    }

    /// As above, but marking the first two copies' run cut their regions
    /// before the third copy's hint came (the run became a VMA of its own,
    /// a new region): the index's entries follow the pages to their new
    /// regions, so the third copy still finds a twin it can read and its
    /// whole run. Left at their old offsets, past the cut regions' ends,
    /// the twins could not be read and the hint found a run of one page.
    #[test]
    fn a_later_hint_finds_its_twin_after_the_run_was_cut_out() {
        use crate::pipeline::hints::{DEFAULT_MAX_AGE, HintStack, Interleave};
        let (mut src, [a, b, c], mut d) = three_copies(50);
        let mut il = Interleave::default();
        let mut stack = HintStack::new(64, DEFAULT_MAX_AGE);
        stack.push(hint_at(b, 60));
        stack.push(hint_at(a, 110));
        let r = d.wake_with_hints(&mut src, 100 * MS, &mut stack, &mut il);
        assert_eq!(r.hint_duplicates, 1, "{:?}", r.runs);
        // Both runs are cut out of their regions.
        let a_run = src.split(a, 100).unwrap();
        let a_rest = src.split(a_run, 64).unwrap();
        let b_run = src.split(b, 50).unwrap();
        let b_rest = src.split(b_run, 64).unwrap();
        let cut = |p: PageRef, region, at, run, rest| -> PageRef {
            match p.page {
                k if p.region != region || k < at => p,
                k if k < at + 64 => PageRef {
                    region: run,
                    page: k - at,
                },
                k => PageRef {
                    region: rest,
                    page: k - at - 64,
                },
            }
        };
        let (moved, dropped) = d.remap_regions(&[a, b], |p| {
            Some(cut(cut(p, a, 100, a_run, a_rest), b, 50, b_run, b_rest))
        });
        assert!(moved > 0 && dropped == 0, "{moved} {dropped}");
        d.sync_regions(&src, 150 * MS);
        stack.push(hint_at(c, 340));
        let r = d.wake_with_hints(&mut src, 200 * MS, &mut stack, &mut il);
        assert_eq!((r.hints_sampled, r.hint_duplicates), (1, 1));
        let run = r.runs.iter().find(|x| x.region == c).expect("c's run");
        assert_eq!((run.first, run.pages), (300, 64), "{run:?}");
        check_runs(&src, std::slice::from_ref(&r));
    }

    /// Four readers of one 4096-page file; the last one had not read a
    /// middle stretch when the first hints were looked up, and its hints
    /// for that stretch come in a later wake-up, after the other readers'
    /// runs were marked and their regions hidden: the first of them finds
    /// a twin in a hidden region, and the run covers the stretch.
    #[test]
    fn a_stretch_read_late_finds_its_twins() {
        use crate::pipeline::hints::{DEFAULT_MAX_AGE, HintStack, Interleave};
        let mut src = InMemorySource::new();
        let file: Vec<u64> = (5000..5000 + 4096).collect();
        let regions: Vec<RegionId> = (0..4).map(|r| src.map(r + 1, &file)).collect();
        let gap = 2054..2422u32;
        for p in gap.clone() {
            src.evict(PageRef {
                region: regions[3],
                page: p,
            })
            .unwrap();
        }
        let mut d = distiller();
        d.sync_regions(&src, 0);
        let mut il = Interleave::default();
        let mut stack = HintStack::new(1 << 16, DEFAULT_MAX_AGE);
        for &r in &regions[..3] {
            for p in 0..4096 {
                stack.push(hint_at(r, p));
            }
        }
        for p in (0..1408).map(|k| k * 2) {
            if !gap.contains(&p) {
                stack.push(hint_at(regions[3], p));
            }
        }
        let mut now = 100 * MS;
        for _ in 0..4 {
            d.wake_with_hints(&mut src, now, &mut stack, &mut il);
            now += 100 * MS;
        }
        // The first three readers' data was marked: the caller hides
        // their regions while ksmd merges them.
        let hidden: Vec<RegionId> = regions[..3].to_vec();
        let mut view = Hiding {
            src: &mut src,
            hidden: hidden.clone(),
        };
        d.sync_regions_keeping(&view, now, |id| hidden.contains(&id));
        for p in gap.clone() {
            let page = PageRef {
                region: regions[3],
                page: p,
            };
            view.src.write(page, file[p as usize]).unwrap();
            stack.push(hint_at(regions[3], p));
        }
        let r = d.wake_with_hints(&mut view, now, &mut stack, &mut il);
        assert_eq!(r.hint_duplicates, 1, "{:?} {r:?}", d.index().stats());
        let run = r.runs.iter().find(|x| x.hinted).expect("a hinted run");
        assert!(run.first <= gap.start && run.end() >= gap.end, "{run:?}");
        assert!(hidden.contains(&run.twin.unwrap().region), "{run:?}");
    }

    /// A source whose `hidden` regions are left out of `regions()`, as the
    /// daemon's view leaves out the regions it holds or that are merging.
    struct Hiding<'a> {
        src: &'a mut InMemorySource,
        hidden: Vec<RegionId>,
    }

    impl MemorySource for Hiding<'_> {
        fn regions(&self) -> Vec<crate::source::RegionInfo> {
            let mut v = self.src.regions();
            v.retain(|r| !self.hidden.contains(&r.id));
            v
        }
        fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError> {
            self.src.page_state(page)
        }
        fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError> {
            self.src.read_page(page, out)
        }
        fn sample_pages(
            &mut self,
            pages: &[PageRef],
            out: &mut [PageWords],
            states: &mut [Result<PageState, SourceError>],
            read: &mut [bool],
        ) {
            self.src.sample_pages(pages, out, states, read)
        }
    }

    /// A source that counts how it is asked: page by page, or in batches.
    struct Counting<'a> {
        src: &'a mut InMemorySource,
        single_calls: u64,
        batch_calls: u64,
        batch_pages: u64,
    }

    impl MemorySource for Counting<'_> {
        fn regions(&self) -> Vec<crate::source::RegionInfo> {
            self.src.regions()
        }
        fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError> {
            self.single_calls += 1;
            self.src.page_state(page)
        }
        fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError> {
            self.single_calls += 1;
            self.src.read_page(page, out)
        }
        fn sample_pages(
            &mut self,
            pages: &[PageRef],
            out: &mut [PageWords],
            states: &mut [Result<PageState, SourceError>],
            read: &mut [bool],
        ) {
            self.batch_calls += 1;
            self.batch_pages += pages.len() as u64;
            self.src.sample_pages(pages, out, states, read)
        }
    }

    /// Hinted pages are looked up a batch at a time: a file read hints
    /// hundreds of pages at once, and a call per page cost the source a
    /// pagemap read and a remote read each. The batches still find every
    /// duplicate: 4 readers of the same 256 pages, all hinted, every copy
    /// in runs.
    #[test]
    fn hinted_pages_are_looked_up_a_batch_at_a_time() {
        use crate::pipeline::hints::{DEFAULT_MAX_AGE, HintStack, Interleave};
        let mut src = InMemorySource::new();
        let file: Vec<u64> = (5000..5256).collect();
        let readers: Vec<RegionId> = (0..4)
            .map(|r| {
                let mut contents: Vec<u64> = (0..1024).map(|i| 100_000 * (r + 1) + i).collect();
                contents[512..768].copy_from_slice(&file);
                src.map(r as u32 + 1, &contents)
            })
            .collect();
        let mut d = distiller();
        d.sync_regions(&src, 0);
        let mut stack = HintStack::new(4096, DEFAULT_MAX_AGE);
        for &r in &readers {
            for page in 512..768 {
                stack.push(hint_at(r, page));
            }
        }
        // Hints only, so that every pick of the budget is a hint.
        let mut il = Interleave::new(1, 0);
        let mut counting = Counting {
            src: &mut src,
            single_calls: 0,
            batch_calls: 0,
            batch_pages: 0,
        };
        let mut now = 0;
        let mut runs = Vec::new();
        let mut looked_up = 0;
        while !stack.is_empty() && now < 100 * SEC {
            now += 100 * MS;
            let r = d.wake_with_hints(&mut counting, now, &mut stack, &mut il);
            looked_up += r.hints_sampled;
            runs.extend(r.runs);
        }
        assert_eq!(counting.single_calls, 0, "page-by-page calls");
        assert!(looked_up > 0);
        // Each batch call of hints holds up to SAMPLE_BATCH hinted pages
        // (run follows and the levels' walk add batches of their own).
        assert!(
            counting.batch_pages >= looked_up && counting.batch_calls * 8 <= counting.batch_pages,
            "{} pages in {} calls, {looked_up} hints looked up",
            counting.batch_pages,
            counting.batch_calls
        );
        // Every reader but the first looked up has its whole copy in runs.
        let mut covered = vec![std::collections::BTreeSet::new(); 4];
        for run in runs.iter().filter(|r| r.hinted) {
            let i = readers.iter().position(|&x| x == run.region).unwrap();
            covered[i].extend(run.first..run.end());
            if let Some(t) = run.twin {
                let j = readers.iter().position(|&x| x == t.region).unwrap();
                covered[j].extend(t.page..t.page + run.pages);
            }
        }
        for (i, c) in covered.iter().enumerate() {
            assert_eq!(c.len(), 256, "reader {i}: {} of 256 pages in runs", c.len());
        }
        for run in runs.iter().filter(|r| r.hinted) {
            let twin = run.twin.expect("no zero pages here");
            for k in 0..run.pages {
                let at = |region, page| src.content(PageRef { region, page });
                assert_eq!(
                    at(run.region, run.first + k),
                    at(twin.region, twin.page + k),
                    "{run:?} differs at {k}"
                );
            }
        }
    }

    #[test]
    fn a_region_rich_in_duplicates_follows_no_run() {
        let mut src = InMemorySource::new();
        let rich = src.map(1, &[7; 256]);
        src.map(2, &(1000..1256).collect::<Vec<u64>>());
        let mut d = distiller();
        let mut now = 0;
        for _ in 0..6 {
            let reports = one_global_round(&mut d, &mut src, &mut now);
            assert!(reports.iter().all(|r| r.runs.is_empty()));
            assert_eq!(reports.iter().map(|r| r.run_pages_read).sum::<u64>(), 0);
        }
        assert!(d.ladder().level_of(rich) > Some(0), "it climbed instead");
    }

    proptest::proptest! {
        /// Whatever the layout, every reported run is real.
        #[test]
        fn reported_runs_are_verified_page_by_page(
            a in proptest::collection::vec(1u64..40, 64..256),
            b in proptest::collection::vec(1u64..40, 16..64),
            spread in 1u64..5_000,
        ) {
            let mut src = InMemorySource::new();
            // Mostly distinct pages, with the small alphabet appearing in
            // stretches so that runs exist.
            let spread_out = |v: &[u64], base: u64| -> Vec<u64> {
                v.iter()
                    .enumerate()
                    .map(|(i, &c)| if c % 3 == 0 { base + i as u64 * spread } else { c })
                    .collect()
            };
            src.map(1, &spread_out(&a, 1_000_000));
            src.map(2, &spread_out(&b, 9_000_000));
            let mut d = distiller();
            let mut now = 0;
            let mut reports = Vec::new();
            for _ in 0..4 {
                reports.extend(one_global_round(&mut d, &mut src, &mut now));
            }
            check_runs(&src, &reports);
        }
    }

    #[test]
    fn written_duplicates_are_cow_breaks() {
        let mut src = InMemorySource::new();
        let r = src.map(1, &[9; 256]);
        let mut d = distiller();
        let mut now = 0;
        let mut cow = 0;
        // Probes are checked once they are a bottom round (1 s) old.
        for _ in 0..20 {
            // Rewrite every page with the same content between rounds: the
            // duplicates stay duplicates but would not stay merged.
            for page in 0..256 {
                src.write(PageRef { region: r, page }, 9).unwrap();
            }
            cow += one_global_round(&mut d, &mut src, &mut now)
                .iter()
                .map(|r| r.cow_breaks)
                .sum::<u64>();
        }
        assert!(cow > 0, "no COW break detected");
        let stats = d.ladder().region_stats(r).unwrap();
        assert!(stats.total.cow_broken > 0);
    }
}
