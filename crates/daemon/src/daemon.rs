//! The loop: distil, promote, pace, account, demote.
//!
//! ## One wake-up
//! 1. **Refresh** (not every wake-up: see [`crate::target`]): re-read
//!    processes and maps; judge every process against the eligibility
//!    [`Policy`]; note processes that manage KSM themselves
//!    (`ksm_merge_any`); classify every region of an eligible process:
//!    - *sampling*: on the ladder, not mergeable;
//!    - *foreign*: `VM_MERGEABLE` set by its process (or merge-any): it is
//!      accounted and counted for pacing, hidden while merging and merged
//!      again when it climbs back to the top, never marked or unmarked;
//!    - *promoted*: pagesift marked it (it is in the [`Marks`] ledger);
//!    - *held*: pagesift unmarked it for thrashing, or its writes would
//!      make it thrash: out of the ladder (not sampled) until its hold
//!      ends, then back at the bottom.
//!
//!    The modes, their transitions, settling, COW accounting and hold
//!    times are `core::pipeline::lifecycle` ([`Lifecycles`], the `lives`
//!    field), which also owns the set of regions hidden from the ladder
//!    (held, or promoted or foreign and still merging): this loop does the I/O
//!    (page states, injections) and tells `lives` what happened; it never
//!    edits the hidden set itself.
//! 2. **Distil**: `Distiller::sync_regions` (only when regions changed) and
//!    `Distiller::wake` over the eligible regions, minus promoted regions
//!    ksmd is still merging (re-sampling them would only re-find the
//!    duplicates that got them promoted). The thread's CPU time over the
//!    wake, per sampled page, feeds `observe_cost` (UKSM measures its
//!    scanner the same way, `uksm.c`'s `uksm_sleep_real`).
//!    Then one slice of the **exact sweep** ([`crate::sweep`],
//!    `scan.sweep_share`): every present page of the sampling regions
//!    known for `scan.sweep_min_age_s` is hashed, a slice per wake-up, so that duplicates are found wherever
//!    their twins live (sampling meets twins at unrelated offsets only by
//!    chance). At the end of an epoch a region whose present pages are at
//!    least V_dup duplicates is raised straight to the top level; it then
//!    waits for a write watch and its verdict (up to `RAISED_WATCH_WAIT`)
//!    like any region that climbed. In a poorer region each run of
//!    duplicates of at least `actuate.run_min_pages` waits for its region's
//!    watch to judge it cold, then is marked like a sampled run.
//!    Then **watch writes** (`actuate.write_tracking`): unmarked regions on
//!    level 1 and up (at most [`MAX_TRACKED_RANGES`] in
//!    [`MAX_TRACKED_PROCS`] processes) are write-tracked through
//!    [`Target::sync_write_tracking`]; a top-level region watched long
//!    enough whose writes would make it thrash once merged
//!    (`write_verdict`) is held (out of the ladder) instead of marked, so the COW breaks
//!    accounting would find after merging are never induced (UKSM's fault
//!    hook sees them before demotion; we see them before promotion). A
//!    range leaves tracking in the wake that may mark it, before marking.
//! 3. **Promote and demote**: every sampling region on the top level is
//!    marked `MADV_MERGEABLE` in its owner. So is every run of at least
//!    `actuate.run_min_pages` verified duplicates that the wake followed
//!    inside a region too poor to climb (`DupRun`, see `core::pipeline::distill`),
//!    together with its twin run: padded by `actuate.run_pad_pages` on
//!    each side, widened to [`RUN_ALIGN_PAGES`], clamped to its region,
//!    overlapping runs of one region joined, and only while the process
//!    stays within its VMA-split budget (runs that do not fit wait for the
//!    next round; they never cost the process its whole-region marks). On
//!    Linux the marked run becomes a VMA of its own, hence a region of its
//!    own at the next refresh, which is then accounted like any promoted
//!    region. Every promoted region found
//!    thrashing by accounting is marked `MADV_UNMERGEABLE` and held. All
//!    calls for one process go in one injection batch per wake-up, adjacent
//!    ranges coalesced. Marking part of a VMA splits it: the splits are
//!    counted, and a process whose VMA count would pass a fraction of
//!    `vm.max_map_count` is skipped. Only ranges in the ledger are ever
//!    unmarked.
//! 4. **Account**: a budget of pages per second of promoted and foreign
//!    regions is inspected (pagemap + kpageflags): regions ksmd is merging
//!    about once a second, but only once ksmd has moved a quarter of a full
//!    scan on since the last look (`core::pipeline::scan_clock`), with up
//!    to 8× the budget while any is, settled ones every
//!    `actuate.recheck_s`. Per region, a bit per page remembers pages seen
//!    merged (KSM page or zero page); such a page later present but not
//!    merged is a COW break. After a whole pass the
//!    region's COW-broken ratio is compared with V_cow: above it in two
//!    passes (`core::pipeline::lifecycle::THRASHING_PASSES`; one is a
//!    burst) within two settled-pass intervals of each other, the region
//!    is unmarked (a region merged again after each burst is below V_cow
//!    while it merges, and is thrashing all the same). A region of up to
//!    [`REMERGE_PASS_PAGES`] that merges again from the top gets its
//!    first pass at once, so that its breaks are counted before ksmd
//!    merges them again. A settled region's breaks that ksmd merges
//!    again before its next pass would go unseen: once a second the
//!    kernel's `cow_ksm` is compared with the breaks counted, and when it
//!    rose by more, every settled region is passed over again at once
//!    ([`Daemon::check_unseen_breaks`]). The ratio is UKSM's (§5.2, `uksm.c`'s `cal_dedup_ratio`: COW faults on
//!    merged pages in a round over pages merged in that round), with one
//!    change: breaks seen in this pass over the larger of the pages newly
//!    seen merged in it and the pages merged at the end of the previous
//!    pass. UKSM's own denominator alone calls any region with steady
//!    churn thrashing: once a region is merged, each pass's new merges are
//!    mostly the re-merges of its breaks, a ratio near 1 however small the
//!    written share is. Booting guests were unmarked that way: each
//!    `pagesift bench --quick --only vm-boot` run logged 2–6 demotions of
//!    64 MiB guest-RAM regions, each then held for a minute.
//!    Over the merged pages, the ratio says how much of what is saved a
//!    pass undoes: above V_cow, merged pages live less than two passes on
//!    average and the region thrashes. Regions whose writes would make them
//!    thrash are found before they are marked (the write watch), so this is
//!    the backstop. At least [`MIN_BREAKS_FOR_DEMOTION`]
//!    breaks are needed (a one-off write is no thrashing), and V_cow = 100 %
//!    turns demotion off. A region is *settled* once a pass that started three ksmd
//!    full scans after it was marked has ended: by then ksmd has visited
//!    each of its pages at least twice, enough to merge every page that can
//!    be (KSM merges a page on its second visit: its checksum must be
//!    unchanged since the first, `mm/ksm.c`), so
//!    what is still unmerged is unique or volatile; a pass that finds pages
//!    merged and none unmerged settles it at once (one that finds nothing
//!    present does not: the region may not be filled yet, and it counts
//!    whole for the pace meanwhile). Settled promoted regions
//!    return to the ladder, at the bottom: their merged pages feed the
//!    stable index, and they can climb again. When `actuate.trim_min_pages`
//!    is set (off by default, docs/trimming.md), the stretches of at least
//!    that many pages that the settling pass found present and
//!    unmerged are then unmarked, within the VMA-split budget (*trimmed*:
//!    "Trimming a settled region" in `core::pipeline::lifecycle`): ksmd
//!    would otherwise pay a checksum and two tree searches for each of
//!    their pages at every later full scan. At the next refresh the
//!    region's marked pieces are adopted as settled, and the trimmed ones
//!    are sampling regions.
//! 5. **Pace**: while any promoted or foreign region is unsettled, ksmd gets
//!    the governor's top-level share (the CPU UKSM would spend merging the
//!    region itself), but no more than two full scans a second of the
//!    promoted and foreign regions cost (`core::pipeline::pacing`: three settle a
//!    region; more would only re-scan merged memory); otherwise a trickle (`ksm.trickle_share`, 0.1 %: half
//!    of UKSM's bottom level, the daemon's own bottom-level sampling using
//!    the other half).
//! 6. **Sleep** T_s, stretched so that the daemon stays under its CPU cap
//!    (UKSM's `uksm_sleep_real` in `uksm.c`, capped at 1 s). I/O hints
//!    arriving cut a sleep short, but never below what the cap asks for
//!    after the wake-up's CPU (`WakeSummary::cap_sleep`): a process that
//!    reads all the time would otherwise wake the loop ten times a second
//!    whatever its cap. While only the
//!    bottom level holds regions and nothing waits for ksmd, T_s is 1 s
//!    ([`IDLE_SLEEP`]) and the distiller's budgets grow with it: the same
//!    samples per second in a tenth of the wake-ups.
//!
//! ## Where each step lives
//! This file holds the daemon's state and the wake-up's order; each step
//! is a child module that adds methods to [`Daemon`]: `refresh` (step 1:
//! maps, renewals, departed processes), `hinting` (I/O hints), `sweeping`
//! (the exact sweep), `writes` (the write watch and its verdict),
//! `recurring` (short-lived and recurring regions), `marking` (step 3),
//! `accounting` (step 4), `pacing` (step 5) and `reporting` (status).
//! `books` is what the loop keeps per region beside its lifecycle, and
//! `phases` the CPU time per step.

mod accounting;
mod addresses;
mod books;
mod hinting;
mod marking;
mod pacing;
mod phases;
mod recurring;
mod refresh;
mod reporting;
mod sweeping;
mod writes;

pub use accounting::MIN_BREAKS_FOR_DEMOTION;
use accounting::{REMERGE_PASS_PAGES, account_rules};
use addresses::AddressMap;
use books::{Book, HeldSpans, KnownSpans, join_zones};
pub use marking::MAX_RUN_MARKS_PER_WAKE;
pub use phases::PHASES;
use phases::{Lap, PhaseCpu};
use recurring::{ending_of, expected_short};
pub use writes::{MAX_TRACKED_PROCS, MAX_TRACKED_RANGES, WRITE_WATCH_MIN};
use writes::{held_since_cleared, write_verdict};

pub use hinting::{HintTap, HintedRange, open_source as open_hint_source};

use crate::actuate::{Actuator, Advice, BatchOutcome, Journal, Marks, ProcKey, Unmarked, coalesce};
use crate::config::Config;
use crate::eligibility::Policy;
use crate::ksmd::{KsmControl, KsmSample, Pacing};
use crate::status::{
    DaemonStatus, DiscoveryStatus, IndexStatus, KsmStatus, LevelStatus, MAX_LISTED, RegionStatus,
    Skipped, SmapsProcess, Status, Totals,
};
use crate::sweep::Sweeper;
use crate::target::{Span, Target, View};
use crate::watchdog::WakeWatch;
use pagesift_core::pipeline::distill::{Distiller, DistillerConfig, DupRun};
use pagesift_core::pipeline::governor::{MAX_SLEEP, sleep_for_share};
use pagesift_core::pipeline::lifecycle::{AccountRules, HeldState, Lifecycle, Lifecycles};
pub use pagesift_core::pipeline::lifecycle::{MAX_HOLD, Mode, SETTLE_SCANS};
use pagesift_core::pipeline::lifespan::{LifespanRules, Lifespans};
use pagesift_core::pipeline::recurrence::{Ending, RecurrenceRules, Recurrences};
use pagesift_core::pipeline::savings::{Breakdown, ProcessSavings, Savings, breakdown};
use pagesift_core::pipeline::scan_clock::ScanClock;
use pagesift_core::pipeline::spacing::CostSpacing;
use pagesift_core::pipeline::write_watch::{DupMap, WriteRules, WriteVerdict, WriteWatch};
use pagesift_core::source::{PageState, SourceError};
use pagesift_core::text::printable;
use pagesift_core::{Nanos, RegionId};
use pagesift_linux::host;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::ops::Bound;
use std::path::PathBuf;
use tracing::{debug, info, warn};

const SEC: Nanos = 1_000_000_000;
const MS: Nanos = 1_000_000;

/// How long a process whose injection was skipped is left alone before it
/// is tried again.
pub const SKIP_RETRY: Nanos = 60 * SEC;
/// Most CPU (fraction of one core) the refreshes the loop asks for itself
/// may use: after marking (to see the new flags and VMA splits), when a
/// process is gone or exec'd. Each is otherwise due at the next wake-up;
/// with hundreds of thousands of VMAs a refresh takes seconds, and one per
/// mark took 60 % of a core (50 processes of 10 000 VMAs each). Three
/// booting guests marked run by run have a refresh of about 5 ms every
/// 0.3 s: at 2 % refreshes took 0.27-0.33 CPU-s of the daemon's 2.2 in
/// `pagesift bench --quick --only vm-boot` (2026-11-26/27, AMD EPYC, 2
/// cores), at 0.5 % 0.18-0.28 CPU-s (`--repeat 3`, 2026-11-27 07:34 UTC,
/// docs/bench/repeat). A run marked waits for no refresh to pace ksmd
/// (see `Daemon::pending_run_pages`). Since 2026-12-05 the refresh after
/// a mark reads the marked process only (`Daemon::marked_pids`), 2.5 ms
/// instead of 7 ms in that experiment, and processes that came or went
/// are read by such a refresh too, within this share, instead of waiting
/// for `scan.refresh_cpu`'s spacing (docs/daemon-cpu.md).
pub const FORCED_REFRESH_CPU: f64 = 0.005;

/// Regions looked at for renewal per wake-up between checks (see
/// `Daemon::maybe_refresh`): two one-entry pagemap reads each, so at most
/// about 32 reads per wake-up. A process cycling a few large regions has
/// each looked at every wake-up; a QEMU with hundreds of young regions has
/// each looked at about once a second, as the check does anyway.
pub const RENEWAL_LOOKS_PER_WAKE: usize = 16;
/// How long a process whose injection met a bad moment (a thread inside
/// an rseq critical section, which lasts nanoseconds to microseconds) is
/// left alone before it is tried again.
pub const BUSY_RETRY: Nanos = SEC;
/// Longest time between two refreshes, even when no process came or went
/// (mappings of live processes change too), unless a refresh costs so much
/// that this would take more than [`FORCED_REFRESH_CPU`].
pub const MAX_REFRESH_INTERVAL: Nanos = 60 * SEC;
/// T_s while only the bottom level has work and nothing waits (see
/// [`Daemon::wake`]): UKSM's longest sleep, 1 s (`uksm_sleep_real` is
/// capped there in `uksm.c`). UKSM's rule, sleep ≥
/// active·(1−r)/r for the largest share r that scanned, keeps its kernel
/// thread near 100 ms, whose wake-up costs next to nothing; applied to the
/// daemon's whole wake-up (fixed clock and /proc reads, scheduling, as
/// much again as its samples at the bottom's 0.2 %) it grows the sleep
/// wake by wake up to the cap, so pagesift goes there at once.
pub const IDLE_SLEEP: Nanos = MAX_SLEEP;
/// Marked runs are widened to multiples of this many pages (64 KiB), so
/// that runs found near each other mark overlapping ranges that join into
/// one VMA instead of splitting it again and again. pagesift's choice.
pub const RUN_ALIGN_PAGES: u64 = 16;
const PAGE: u64 = 4096;
#[derive(Clone, Debug)]
struct SkipEntry {
    comm: String,
    reason: String,
    retry_at: Option<Nanos>,
}

#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    marks: u64,
    unmarks: u64,
    batches: u64,
    vma_splits: u64,
    run_marks: u64,
    /// Regions marked around their written zones.
    partial_marks: u64,
    /// Unmerged stretches of settled regions unmarked, and their pages.
    trims: u64,
    trimmed_pages: u64,
    remerges: u64,
    /// See [`Daemon::check_unseen_breaks`].
    unseen_break_alarms: u64,
    /// See [`Daemon::raise_recurring`].
    raised_on_history: u64,
    sampled: u64,
    wakes: u64,
}

/// What one wake-up did (for logs and tests).
#[derive(Clone, Debug, Default)]
pub struct WakeSummary {
    /// Whether maps were re-read.
    pub refreshed: bool,
    /// Pages sampled.
    pub sampled: u64,
    /// Regions marked mergeable.
    pub promoted: Vec<RegionId>,
    /// Regions unmarked for thrashing.
    pub demoted: Vec<RegionId>,
    /// Runs of duplicates marked mergeable inside regions that did not
    /// climb: (pid, range).
    pub run_marks: Vec<(u32, Advice)>,
    /// Promoted regions that climbed back with new duplicates: merging
    /// again.
    pub remerging: Vec<RegionId>,
    /// Injection batches run (one per process at most).
    pub batches: u64,
    /// ksmd share asked for.
    pub ksm_share: f64,
    /// How long to sleep before the next wake-up.
    pub sleep: Nanos,
    /// The shortest sleep after this wake-up that keeps it within the CPU
    /// cap (at most `sleep`): hints arriving may cut `sleep` short, but
    /// not below this (module header, step 6).
    pub cap_sleep: Nanos,
}

/// The daemon's state; [`Daemon::wake`] runs one wake-up.
pub struct Daemon<T: Target, A: Actuator, K: KsmControl> {
    config: Config,
    config_path: Option<PathBuf>,
    policy: Policy,
    distiller: Distiller,
    target: T,
    actuator: A,
    ksm: K,
    books: BTreeMap<RegionId, Book>,
    /// The books' regions by process and address, as of the last refresh
    /// (`addresses`): hints are cut into pages by it, and it tells where
    /// named pages went when a refresh changed the regions' shapes.
    by_address: AddressMap,
    marks: Marks,
    /// Marks of processes that left the eligible set, still to be unmarked
    /// (see [`Daemon::unmark_departed`]).
    departed: Marks,
    allowed: HashMap<u32, ProcKey>,
    comms: HashMap<u32, String>,
    /// The cgroup each selected process's savings are reported under.
    cgroups: HashMap<u32, String>,
    self_managed: HashSet<u32>,
    /// Every region's lifecycle, and the regions hidden from the ladder
    /// (held, or promoted and still merging): see `core::pipeline::lifecycle`.
    lives: Lifecycles,
    /// How long each process's large regions lived: regions of a process
    /// whose regions die young wait before they are marked
    /// (`core::pipeline::lifespan`).
    lifespans: Lifespans<ProcKey>,
    /// The sampling regions `lifespans` expects to die young, hidden from
    /// the ladder (`Daemon::hide_short_lived`).
    short_lived: BTreeSet<RegionId>,
    /// The processes whose regions `hide_short_lived` has logged at info
    /// (once per process; the rest at debug).
    short_logged: BTreeSet<ProcKey>,
    /// When `short_lived` was last judged, and `Lifecycles::sampling_changes`
    /// then (`Daemon::short_look_due`).
    short_looked: Option<(Nanos, u64)>,
    /// Where each process's recently unmapped marked regions were: a
    /// region mapped again there goes to the top at once
    /// (`core::pipeline::recurrence`).
    recurrences: Recurrences<ProcKey>,
    /// The regions raised on history that `probe_recurring` still looks at
    /// (marked, merging, no merge seen yet): a few at a time, so that the
    /// wake-up does not walk every book for them.
    probing: BTreeSet<RegionId>,
    /// The last region looked at for renewal between checks (they are
    /// looked at in turn, [`RENEWAL_LOOKS_PER_WAKE`] a wake-up).
    renewal_cursor: Option<RegionId>,
    /// The regions large enough for the lifespan rule (at least its
    /// smallest size), as of the last refresh: the only ones a renewal
    /// turn looks among, so that a turn does not walk every book (with
    /// thousands of small VMAs it walked them all at every wake-up).
    renewal_sized: BTreeSet<RegionId>,
    /// CPU per wake-up phase (status and metrics).
    phase_cpu: PhaseCpu,
    /// Which phase the running wake-up is in, for the watchdog.
    wake_watch: WakeWatch,
    skipped: BTreeMap<u32, SkipEntry>,
    inject_skips: BTreeMap<u32, SkipEntry>,
    /// Regions left out at the last refresh (logged when it changes from 0).
    left_out: usize,
    pending_unmarks: Vec<RegionId>,
    /// Unmerged stretches of settled regions to unmark (`accounting`,
    /// "Trimming a settled region" in `core::pipeline::lifecycle`):
    /// region and address range.
    pending_trims: Vec<(RegionId, u64, u64)>,
    /// Spans of promoted regions trimmed since the last refresh: the
    /// refresh that finds them split adopts their marked pieces as
    /// settled and returns their unmarked ones to sampling.
    trimmed_spans: Vec<(ProcKey, u64, u64)>,
    /// Address ranges of holds in force, whatever ids their pages have
    /// now (`books::HeldSpans`).
    held_spans: HeldSpans,
    /// Duplicate runs the last wake followed, for `actuate`.
    runs: Vec<DupRun>,
    /// The ladder's view must be synced (a refresh, a reload); changes of
    /// visibility are `lives`' own flag.
    need_sync: bool,
    force_refresh: bool,
    /// Processes pagesift marked or unmarked ranges in since the last
    /// refresh: their maps are read again (and only theirs, when nothing
    /// else asks for a full refresh) at the next forced refresh, to see
    /// the new flags and splits.
    marked_pids: BTreeSet<u32>,
    /// Something changed that only a full refresh sorts out.
    pending_procs: bool,
    /// Processes that came or went since they were last read: read (or
    /// dropped) at the next refresh of some processes.
    pending_pids: BTreeSet<u32>,
    /// Known processes whose address space changed size since the last
    /// refresh of their maps.
    pending_maps: BTreeSet<u32>,
    /// The target's fill counts were read again (at the last check for
    /// changed processes) and the sweeper has not been told yet: they
    /// change only then, so they are not copied at every wake.
    fill_counts_new: bool,
    next_check: Nanos,
    earliest_refresh: Nanos,
    /// The smoothed cost of a refresh, which spaces the refreshes a change
    /// asks for within `scan.refresh_cpu` (`core::pipeline::spacing`).
    refresh_spacing: CostSpacing,
    /// No refresh the loop asks for itself (after marking, a process gone)
    /// before this: see [`FORCED_REFRESH_CPU`].
    earliest_forced: Nanos,
    /// The periodic refresh is due (see [`MAX_REFRESH_INTERVAL`]).
    next_periodic_refresh: Nanos,
    last_account: Nanos,
    account_from: Option<RegionId>,
    counters: Counters,
    ksm_now: KsmSample,
    /// Where ksmd is in its full scans, from `ksm_now`: what the passes
    /// over merging regions wait for (`accounting`).
    scan_clock: ScanClock,
    ksm_start: Option<KsmSample>,
    pacing: Pacing,
    next_pace: Nanos,
    merging: bool,
    /// `scan_pages` at the last pace (see [`Daemon::pace`]).
    paced_scan_pages: u64,
    /// Pages of duplicate runs marked since the last refresh. Such a run
    /// becomes a region of its own (and so counts in the pace as merging)
    /// only at the refresh after the mark, which [`FORCED_REFRESH_CPU`]
    /// may put off by seconds; until then ksmd is paced for these pages.
    /// Zero after every refresh.
    pending_run_pages: u64,
    cow_ksm_start: Option<u64>,
    /// `cow_ksm` and the breaks pagesift's passes had counted at the last
    /// look ([`Daemon::check_unseen_breaks`]), and when the next look is.
    cow_seen: Option<(u64, u64)>,
    next_cow_look: Nanos,
    started: Nanos,
    cpu_start_ns: u64,
    /// (when, the daemon's CPU ns, ksmd's CPU ns), the last five seconds
    /// and at least two points: the CPU shares the status shows.
    cpu_window: VecDeque<(Nanos, u64, u64)>,
    states: Vec<PageState>,
    /// Ranges write-tracked now, and when their writes were last read.
    tracked: usize,
    /// The regions whose write watch may be on: those write tracking was
    /// asked for at the last [`Daemon::watch_writes`]. Every book with a
    /// watch is among them (watches are armed only there), so the next
    /// call need not walk every book to find them.
    watched: BTreeSet<RegionId>,
    last_write_read: Nanos,
    /// The exact sweep (see [`crate::sweep`] and [`Daemon::sweep`]).
    sweeper: Sweeper,
    /// Duplicate runs the last sweep found, waiting for their region's
    /// write watch (see [`Daemon::ready_sweep_runs`]).
    sweep_runs: Vec<DupRun>,
    /// I/O hints (see `hinting`).
    hints: hinting::HintFeed,
    /// Host page-cache scrubbing (`[scrub]`), when enabled.
    scrub: Option<crate::scrub::Scrubber>,
    /// Consecutive wake-ups after which the cap asked for a sleep longer
    /// than [`MAX_SLEEP`] (status: `cap_unmet`), and whether that was
    /// logged.
    cap_clipped: u32,
    cap_warned: bool,
    /// Placement of merged pages on a NUMA host (`None`: one node, or off).
    numa: Option<crate::numa::NumaPlacement>,
    /// Where marks are written down before they are made (the crash
    /// ledger, `crate::ledger`); `None` in the simulation.
    journal: Option<Box<dyn Journal>>,
}

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    /// A daemon over `target`, marking through `actuator`, pacing `ksm`.
    /// `policy` decides eligibility; `now` is the caller's monotonic clock.
    pub fn new(
        config: Config,
        config_path: Option<PathBuf>,
        policy: Policy,
        target: T,
        actuator: A,
        ksm: K,
        now: Nanos,
    ) -> Self {
        let distiller = new_distiller(&config);
        let sweeper = Sweeper::new(config.sweep_share(), config.scan.sweep_every_s * SEC);
        let cow_ksm_start = target.cow_ksm();
        let hints = hinting::HintFeed::new(&config.hints);
        let numa = crate::numa::NumaPlacement::for_host(&config.numa);
        let mut d = Daemon {
            hints,
            config,
            config_path,
            policy,
            distiller,
            target,
            actuator,
            ksm,
            books: BTreeMap::new(),
            by_address: AddressMap::default(),
            marks: Marks::new(),
            departed: Marks::new(),
            allowed: HashMap::new(),
            comms: HashMap::new(),
            cgroups: HashMap::new(),
            self_managed: HashSet::new(),
            lives: Lifecycles::new(),
            lifespans: Lifespans::new(LifespanRules::default()),
            recurrences: Recurrences::new(RecurrenceRules::default()),
            probing: BTreeSet::new(),
            short_lived: BTreeSet::new(),
            short_logged: BTreeSet::new(),
            short_looked: None,
            renewal_cursor: None,
            watched: BTreeSet::new(),
            renewal_sized: BTreeSet::new(),
            phase_cpu: PhaseCpu::default(),
            wake_watch: WakeWatch::new(),
            skipped: BTreeMap::new(),
            inject_skips: BTreeMap::new(),
            left_out: 0,
            pending_unmarks: Vec::new(),
            pending_trims: Vec::new(),
            trimmed_spans: Vec::new(),
            held_spans: HeldSpans::default(),
            runs: Vec::new(),
            need_sync: true,
            force_refresh: false,
            marked_pids: BTreeSet::new(),
            pending_procs: false,
            pending_pids: BTreeSet::new(),
            pending_maps: BTreeSet::new(),
            next_check: now,
            earliest_refresh: now,
            refresh_spacing: CostSpacing::new(),
            earliest_forced: now,
            next_periodic_refresh: now + MAX_REFRESH_INTERVAL,
            last_account: now,
            account_from: None,
            counters: Counters::default(),
            ksm_now: KsmSample::default(),
            scan_clock: ScanClock::new(),
            ksm_start: None,
            pacing: Pacing::default(),
            next_pace: now,
            paced_scan_pages: 0,
            pending_run_pages: 0,
            fill_counts_new: false,
            merging: false,
            cow_ksm_start,
            cow_seen: None,
            next_cow_look: now,
            tracked: 0,
            last_write_read: 0,
            scrub: None,
            started: now,
            cpu_start_ns: host::process_cpu_ns(),
            cpu_window: VecDeque::new(),
            states: Vec::new(),
            sweeper,
            sweep_runs: Vec::new(),
            cap_clipped: 0,
            cap_warned: false,
            numa,
            journal: None,
        };
        if let Ok(s) = d.ksm.sample() {
            d.ksm_now = s;
            d.ksm_start = Some(s);
        }
        // The target discovered its processes when it was built.
        d.after_refresh(now);
        d
    }

    /// Writes marks down in `journal` before they are made, from now on.
    pub fn set_journal(&mut self, journal: Box<dyn Journal>) {
        self.journal = Some(journal);
    }

    /// The configuration in force.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The distiller (ladder, index, strength).
    pub fn distiller(&self) -> &Distiller {
        &self.distiller
    }

    /// The target.
    pub fn target(&self) -> &T {
        &self.target
    }

    /// The target, mutably (tests drive simulated machines through it).
    pub fn target_mut(&mut self) -> &mut T {
        &mut self.target
    }

    /// The actuator.
    pub fn actuator(&self) -> &A {
        &self.actuator
    }

    /// The ledger of ranges pagesift marked.
    pub fn marks(&self) -> &Marks {
        &self.marks
    }

    /// What the loop does with a region, if it tracks it.
    pub fn mode(&self, id: RegionId) -> Option<Mode> {
        self.lives.mode(id)
    }

    /// Whether `[hints]` wants a hint source that has not been started
    /// (at start, and after a reload changed `[hints]`).
    pub fn hints_pending(&self) -> bool {
        self.hints.pending()
    }

    /// A descriptor that turns readable when I/O hints arrive after the
    /// last drain: the loop's sleep wakes on it (no sooner than
    /// `scan.sleep_ms` after the last wake-up), so hinted pages are not left
    /// waiting for an idle sleep of up to a second.
    pub fn hint_wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.hints.wake_fd()
    }

    /// Tells the loop that its last sleep was cut short after `slept` ns
    /// (I/O hints arrived): the coming wake-up samples for the time that
    /// passed, not for the sleep that was planned, so that hints that keep
    /// arriving do not multiply the sampling rate.
    pub fn slept_only(&mut self, slept: Nanos) {
        self.distiller.set_sleep(slept.max(1));
    }

    /// Which phase the running wake-up is in (for
    /// [`crate::watchdog::Watchdog`]; phases named by [`PHASES`]).
    pub fn wake_watch(&self) -> WakeWatch {
        self.wake_watch.clone()
    }

    /// Asks for a refresh at the next wake-up.
    pub fn request_refresh(&mut self) {
        self.force_refresh = true;
    }

    /// Applies a new configuration (SIGHUP). Thresholds of the ladder
    /// restart distilling (regions re-enter at the bottom; what is
    /// promoted stays promoted). A changed `[hints]` drops the hint
    /// source, and [`Daemon::hints_pending`] then asks the caller for a
    /// new one. The socket and metrics address need a restart and are
    /// kept.
    pub fn reload(&mut self, mut config: Config, policy: Policy) {
        config.status = self.config.status.clone();
        config.metrics = self.config.metrics.clone();
        let ladder_changed =
            config.ladder != self.config.ladder || config.scan.seed != self.config.scan.seed;
        let sleep_changed = config.scan.sleep_ms != self.config.scan.sleep_ms;
        if let Err(e) = self
            .target
            .reconfigure(policy.process_filter(), config.region_limits())
        {
            warn!(error = %e, "the reloaded configuration selects processes that cannot be read; keeping the old selection");
        }
        if self.numa.as_ref().map(|n| n.section()) != Some(&config.numa) {
            self.numa = crate::numa::NumaPlacement::for_host(&config.numa);
        }
        if config.hints != self.config.hints {
            info!("[hints] changed: the hint source restarts with it");
            self.hints.reconfigure(&config.hints);
        }
        self.config = config;
        self.policy = policy;
        self.sweeper.set_pace(
            self.config.sweep_share(),
            self.config.scan.sweep_every_s * SEC,
        );
        if ladder_changed || sleep_changed {
            info!("ladder thresholds changed: distilling restarts from the bottom");
            self.distiller = new_distiller(&self.config);
            self.need_sync = true;
        } else {
            self.distiller.set_params(self.config.governor_params());
        }
        self.force_refresh = true;
        self.scrub = None; // rebuilt from the new [scrub] at the next wake-up
    }

    /// One wake-up at `now`; returns what it did, including how long to
    /// sleep.
    pub fn wake(&mut self, now: Nanos) -> WakeSummary {
        let cpu0 = host::thread_cpu_ns();
        let mut lap = Lap::start(cpu0, self.wake_watch.clone());
        let mut summary = WakeSummary {
            refreshed: self.maybe_refresh(now),
            ..WakeSummary::default()
        };
        lap.to(&mut self.phase_cpu.refresh);
        self.release_holds(now);
        self.feed_hints(now);
        lap.to(&mut self.phase_cpu.hints);
        summary.sampled = self.distil(now);
        lap.to(&mut self.phase_cpu.distil);
        self.sweep(now);
        lap.to(&mut self.phase_cpu.sweep);
        self.account(now);
        lap.to(&mut self.phase_cpu.account);
        if let Some(numa) = &mut self.numa {
            let (marks, allowed, ladder, target) = (
                &self.marks,
                &self.allowed,
                self.distiller.ladder(),
                &self.target,
            );
            numa.wake(now, allowed, || {
                crate::numa::watched(marks, allowed, ladder, |id| target.span(id))
            });
        }
        lap.to(&mut self.phase_cpu.numa);
        self.watch_writes(now);
        lap.to(&mut self.phase_cpu.watch);
        self.actuate(now, &mut summary);
        lap.to(&mut self.phase_cpu.actuate);
        summary.ksm_share = self.pace(now);
        lap.to(&mut self.phase_cpu.pace);
        self.scrub_tick(now);
        lap.to(&mut self.phase_cpu.scrub);
        self.wake_watch.end();
        let active = host::thread_cpu_ns().saturating_sub(cpu0);
        let base = self.next_sleep(&summary);
        self.distiller.set_sleep(base);
        let capped = sleep_for_share(active as f64, self.config.cpu_cap());
        let sleep = capped.max(base).min(MAX_SLEEP);
        summary.sleep = sleep;
        summary.cap_sleep = capped.min(sleep);
        self.note_cap(capped, active);
        self.counters.wakes += 1;
        summary
    }

    /// Counts the wake-ups whose work the cap could keep only with a
    /// sleep longer than [`MAX_SLEEP`]: under a cap that low the daemon
    /// uses more than its cap (UKSM caps its sleep there too, and a longer
    /// one would leave hints and new processes waiting). After
    /// [`crate::status::CAP_UNMET_WAKES`] in a row, status says so and the
    /// log says it once, with the wake-up's cost.
    fn note_cap(&mut self, capped: Nanos, active: u64) {
        if capped <= MAX_SLEEP {
            self.cap_clipped = 0;
            return;
        }
        self.cap_clipped = self.cap_clipped.saturating_add(1);
        if self.cap_clipped >= crate::status::CAP_UNMET_WAKES && !self.cap_warned {
            self.cap_warned = true;
            let cap = self.config.cpu_cap();
            warn!(
                cap_percent = cap * 100.0,
                wake_ms = active as f64 / 1e6,
                uses_percent = active as f64 / (active + MAX_SLEEP) as f64 * 100.0,
                "the CPU cap is out of reach: a wake-up costs more than one wake-up a second \
                 can keep under it, so the daemon uses more than its cap (scan.cpu_cap)"
            );
        }
    }

    /// Host page-cache scrubbing of the eligible guests (`crate::scrub`).
    fn scrub_tick(&mut self, now: Nanos) {
        if !self.config.scrub.enabled {
            return;
        }
        let config = &self.config.scrub;
        let scrub = self
            .scrub
            .get_or_insert_with(|| crate::scrub::Scrubber::new(config.clone(), now));
        let eligible: Vec<(u32, String)> = (self.allowed.keys())
            .map(|pid| (*pid, self.comms.get(pid).cloned().unwrap_or_default()))
            .collect();
        scrub.set_io_hints(self.hints.on());
        scrub.tick(now, &eligible);
    }

    /// Held regions are out of the ladder: one that cannot be promoted
    /// until its hold ends would otherwise climb back and take its level's
    /// CPU share, sampled round after round for nothing (UKSM's thrash
    /// filter instead zeroes the ratio, so a thrashing region sinks). When
    /// the hold ends it re-enters at the bottom and has to climb, and be
    /// watched for writes, again. (`lives` shows it to the ladder again
    /// and asks for the sync.)
    fn release_holds(&mut self, now: Nanos) {
        self.lives.release_due(now);
    }

    /// T_s before the next wake-up (module header, step 6): the configured
    /// sleep, or [`IDLE_SLEEP`] while only the bottom level holds regions
    /// and nothing waits for ksmd or for an injection. The distiller's
    /// budgets follow T_s, so the bottom level samples as many pages per
    /// second either way (a bottom round takes its round time, 1 s under
    /// Full, either way too); only the fixed cost of a wake-up is paid
    /// less often. Anything that climbs, gets marked or waits for ksmd
    /// brings the configured sleep back at the end of the wake-up that
    /// saw it.
    fn next_sleep(&self, summary: &WakeSummary) -> Nanos {
        let base = self.config.sleep();
        let ladder = self.distiller.ladder();
        let quiet = !self.merging
            && self.pending_unmarks.is_empty()
            && summary.promoted.is_empty()
            && summary.demoted.is_empty()
            && summary.run_marks.is_empty()
            && summary.remerging.is_empty()
            && self.hints.idle()
            && (1..ladder.levels()).all(|l| ladder.level_pages(l) == 0);
        if !quiet {
            return base;
        }
        // At most one bottom round per wake-up (see `core::pipeline::distill`): a
        // longer sleep than the round would sample less per second.
        let bottom_round = self.distiller.params().levels[0].round_time;
        IDLE_SLEEP.min(bottom_round).max(base)
    }

    /// The ranges of processes that left the eligible set, not unmarked
    /// yet (for the crash ledger).
    pub fn departed_marks(&self) -> &Marks {
        &self.departed
    }

    /// Notes the daemon's and ksmd's CPU time for the status's CPU shares
    /// over the last seconds, at most once a second (two clock reads): the
    /// status itself is built only when asked (`crate::snapshots`), and the
    /// shares must cover the seconds before that.
    pub fn note_cpu(&mut self, now: Nanos) {
        if self
            .cpu_window
            .back()
            .is_none_or(|&(t, _, _)| now >= t + SEC)
        {
            self.push_cpu(now);
        }
    }

    /// Stops: unmarks what pagesift marked when `unmerge` (merged pages are
    /// copied back), and gives KSM its settings back.
    pub fn shutdown(&mut self, unmerge: bool) -> Result<(), String> {
        if unmerge {
            for key in self.marks.processes() {
                match crate::actuate::unmark_all(&mut self.actuator, &mut self.marks, key) {
                    Unmarked::Partly(failed) => {
                        warn!(pid = key.pid, ?failed, "could not unmark ranges on exit")
                    }
                    Unmarked::NotNow(r) => {
                        warn!(pid = key.pid, reason = %r, "could not unmark on exit")
                    }
                    Unmarked::Done(_) | Unmarked::Gone => {}
                }
            }
        }
        // Processes that left the eligible set are unmarked whatever
        // `unmerge` says (ineligible always wins).
        for key in self.departed.processes() {
            if self.target.same_process(key) {
                let _ = crate::actuate::unmark_all(&mut self.actuator, &mut self.departed, key);
            }
        }
        self.target.sync_write_tracking(&[]);
        self.ksm.restore()
    }

    fn distil(&mut self, now: Nanos) -> u64 {
        // Both flags are cleared here (no short circuit).
        let view_changed = self.lives.take_view_changed();
        let view_changed = (self.short_look_due(now) && self.hide_short_lived(now)) | view_changed;
        let joined;
        let hidden = if self.short_lived.is_empty() {
            self.lives.hidden()
        } else {
            joined = (self.lives.hidden().iter())
                .chain(&self.short_lived)
                .copied()
                .collect::<BTreeSet<_>>();
            &joined
        };
        let mut synced = false;
        if self.need_sync || view_changed {
            let view = View {
                target: &mut self.target,
                allowed: &self.allowed,
                hidden,
            };
            // Hidden regions leave the ladder but keep their pages in the
            // index: a marked run's pages are the twins later hints look
            // for (`Distiller::sync_regions_keeping`); `addresses` drops
            // them when their region goes.
            self.distiller
                .sync_regions_keeping(&view, now, |id| hidden.contains(&id));
            self.need_sync = false;
            synced = true;
        }
        let mut view = View {
            target: &mut self.target,
            allowed: &self.allowed,
            hidden,
        };
        let c0 = host::thread_cpu_ns();
        let mut report = self.hints.wake(&mut self.distiller, &mut view, now);
        self.runs = std::mem::take(&mut report.runs);
        let cpu = host::thread_cpu_ns().saturating_sub(c0);
        let sampled: u64 = report.sampled.iter().sum::<u64>() + report.hint_pages_read;
        if sampled > 0 {
            self.distiller.observe_cost(cpu as f64 / sampled as f64);
        }
        if !report.gone.is_empty() {
            self.force_refresh = true;
        }
        self.counters.sampled += sampled;
        if synced {
            self.raise_recurring(now);
        }
        sampled
    }
}

/// The share of a region's pages that are duplicates, as its last
/// judgement estimated it (1 before any: assume the worst).
fn dup_share(ladder: &pagesift_core::pipeline::ladder::Ladder, id: RegionId) -> f64 {
    match ladder.region_stats(id) {
        Some(s) if s.judged > 0 => s.last_dup_ratio,
        _ => 1.0,
    }
}

fn new_distiller(config: &Config) -> Distiller {
    let mut d = Distiller::new(DistillerConfig {
        ladder: config.ladder_config(),
        governor: config.governor,
        sleep: config.sleep(),
        seed: config.scan.seed,
        ..DistillerConfig::default()
    });
    d.set_params(config.governor_params());
    d
}
