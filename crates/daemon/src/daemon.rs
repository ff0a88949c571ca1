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
//!    about once a second, with up to 8× the budget while any is, settled
//!    ones every `actuate.recheck_s`. Per region, a bit per
//!    page remembers pages seen merged (KSM page or zero page); such a page
//!    later present but not merged is a COW break. After a whole pass the
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
//!    what is still unmerged is unique or volatile; a pass that finds no
//!    unmerged page settles it at once. Settled promoted regions
//!    return to the ladder, at the bottom: their merged pages feed the
//!    stable index, and they can climb again.
//! 5. **Pace**: while any promoted or foreign region is unsettled, ksmd gets
//!    the governor's top-level share (the CPU UKSM would spend merging the
//!    region itself), but no more than two full scans a second of the
//!    promoted and foreign regions cost (`core::pipeline::pacing`: three settle a
//!    region; more would only re-scan merged memory); otherwise a trickle (`ksm.trickle_share`, 0.1 %: half
//!    of UKSM's bottom level, the daemon's own bottom-level sampling using
//!    the other half).
//! 6. **Sleep** T_s, stretched so that the daemon stays under its CPU cap
//!    (UKSM's `uksm_sleep_real` in `uksm.c`, capped at 1 s). While only the
//!    bottom level holds regions and nothing waits for ksmd, T_s is 1 s
//!    ([`IDLE_SLEEP`]) and the distiller's budgets grow with it: the same
//!    samples per second in a tenth of the wake-ups.

mod hinting;

pub use hinting::{HintTap, HintedRange, open_source as open_hint_source};

use crate::actuate::{Actuator, Advice, BatchOutcome, Marks, ProcKey, Unmarked, coalesce};
use crate::config::Config;
use crate::eligibility::Policy;
use crate::ksmd::{KsmControl, KsmSample, Pacing};
use crate::status::{
    DaemonStatus, KsmStatus, LevelStatus, MAX_LISTED, RegionStatus, Skipped, Status, Totals,
};
use crate::sweep::Sweeper;
use crate::target::{Span, Target, View};
use crate::watchdog::WakeWatch;
use pagesift_core::pipeline::distill::{Distiller, DistillerConfig, DupRun};
use pagesift_core::pipeline::governor::{MAX_SLEEP, sleep_for_share};
use pagesift_core::pipeline::lifecycle::{AccountRules, Lifecycle, Lifecycles};
pub use pagesift_core::pipeline::lifecycle::{MAX_HOLD, Mode, SETTLE_SCANS};
use pagesift_core::pipeline::lifespan::{LifespanRules, Lifespans};
use pagesift_core::pipeline::recurrence::{Ending, RecurrenceRules, Recurrences};
use pagesift_core::pipeline::savings::{Breakdown, ProcessSavings, Savings, breakdown};
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
/// (see `Daemon::pending_run_pages`).
pub const FORCED_REFRESH_CPU: f64 = 0.005;

/// Pages a probe of a region raised on history looks at
/// (`Daemon::probe_recurring`).
const PROBE_PAGES: usize = 64;

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
/// How often ksmd's counters are read and its pace revised, unless the
/// demand switches between merging and trickling.
const PACE_INTERVAL: Nanos = SEC;
/// CPU share of `actuate.account_pages_per_s` at its default, about 155 ns
/// a page (measured on the 2-core development machine): the unit of the
/// accounting boost.
const ACCOUNT_BASE_SHARE: f64 = 0.02;
/// Pages inspected per accounting call.
const ACCOUNT_CHUNK: usize = 512;
/// Largest region that gets its first accounting pass at once when it
/// merges again from the top (16 MiB: its pagemap and kpageflags read in
/// chunks, at about 155 ns a page: 0.6 ms), see [`Daemon::actuate`].
/// pagesift's choice.
const REMERGE_PASS_PAGES: u64 = 4096;

/// COW breaks `cow_ksm` must show beyond those the passes counted before
/// settled regions are passed over again ([`Daemon::check_unseen_breaks`]):
/// fewer could not flag a region anyway (`MIN_BREAKS_FOR_DEMOTION`).
const UNSEEN_BREAKS_MIN: u64 = MIN_BREAKS_FOR_DEMOTION;

/// The least time between the end of a settled region's pass and one
/// brought forward by unseen breaks: other processes' KSM pages breaking
/// all the time would otherwise pass every settled region over without
/// pause (the accounting budget still bounds the cost). A region rewritten
/// every few seconds is still seen thrashing within the minute the rule
/// allows. pagesift's choice.
const UNSEEN_BREAKS_GAP: Nanos = 5 * SEC;
/// Fewest COW breaks in one accounting pass that can unmark a region: a
/// few writes to merged pages are normal life, not thrashing. pagesift's
/// choice (the same 16 as `actuate.min_merged_for_demotion`).
pub const MIN_BREAKS_FOR_DEMOTION: u64 = 16;
/// Marked runs are widened to multiples of this many pages (64 KiB), so
/// that runs found near each other mark overlapping ranges that join into
/// one VMA instead of splitting it again and again. pagesift's choice.
pub const RUN_ALIGN_PAGES: u64 = 16;
/// Fewest unmerged duplicates (pages) a sweep must find in a settled
/// promoted region to make ksmd merge it again at the active pace: fewer
/// are left to the trickle. The n-th such remerge of a region waits 2^n
/// sweep spacings after the last (at most 64). pagesift's choice (a
/// 64-page run is 256 KiB).
const REMERGE_MIN_PAGES: u32 = 64;
/// Longest a region raised by the sweep waits for a write watch before it
/// may be marked without one (the watch's capacity is bounded).
const RAISED_WATCH_WAIT: Nanos = 5 * SEC;

/// How long a sweep's unique zones are trusted for marking around them:
/// three sweep epochs at the default spacing (memory that changes faster
/// makes a stale zone cost little: it becomes a region of its own, sampled
/// and marked when it holds duplicates).
const UNIQUE_ZONES_FRESH: Nanos = 15 * SEC;
/// How far sampling's duplicate share must exceed the share of a region
/// outside its unique zones for the zones to be set aside
/// ([`zones_contradicted`]): half the default V_dup, so that sampling
/// noise around a region's true share does not. pagesift's choice.
const ZONE_CONTRADICTION: f64 = 0.05;

/// The spans of the regions known before a refresh, with when each was
/// first seen, to date the pieces a mark split off them. Marking a run
/// splits its VMA, and each piece is a region of its own at the next
/// refresh, new to the books; counted as new, it waited
/// `scan.sweep_min_age_s` (5 s) again for the sweep after every mark
/// nearby. In one `pagesift bench --quick --only vm-boot` run (2026-11-27,
/// read by hand from the daemon's log and the run's CSV) the
/// 15 552-page rest of a guest's RAM, split off by a 160-page run marked
/// at 29 s, was swept only at 41 s (two epochs later) and held 60 MiB of
/// duplicates that ksm-1000 had merged by 33 s.
struct KnownSpans(Vec<KnownSpan>);

/// A known region: its process, its VMA's range, its own range, and when
/// it was first seen.
struct KnownSpan {
    proc: ProcKey,
    vma: (u64, u64),
    range: (u64, u64),
    first_seen: Nanos,
}

impl KnownSpans {
    fn of<'a>(books: impl Iterator<Item = &'a Book>) -> KnownSpans {
        let mut v: Vec<_> = books
            .map(|b| KnownSpan {
                proc: b.span.proc,
                vma: (b.span.vma_start, b.span.vma_end),
                range: (b.span.start, b.span.end()),
                first_seen: b.first_seen,
            })
            .collect();
        v.sort_unstable_by_key(|k| (k.proc, k.vma.0));
        KnownSpans(v)
    }

    /// The earliest first sight of the known regions of the same process
    /// that overlap `span` and whose VMA held all of `span`'s VMA: a
    /// mapping made anew elsewhere, or larger, is not such a piece.
    fn known_since(&self, span: &Span) -> Option<Nanos> {
        let from = self.0.partition_point(|k| k.proc < span.proc);
        (self.0[from..].iter())
            .take_while(|k| k.proc == span.proc && k.vma.0 <= span.vma_start)
            .filter(|k| span.vma_end <= k.vma.1 && k.range.0 < span.end() && span.start < k.range.1)
            .map(|k| k.first_seen)
            .min()
    }
}

/// `a` and `b` (lists of zones `[first, end)`) joined into one sorted list
/// of disjoint zones.
fn join_zones(a: &[(u32, u32)], b: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut set = pagesift_core::ranges::RangeSet::new();
    for &(s, e) in a.iter().chain(b) {
        set.insert(u64::from(s), u64::from(e));
    }
    set.iter().map(|(s, e)| (s as u32, e as u32)).collect()
}
/// Longest a region raised by the sweep stays parked on the top level
/// without being marked or held (its process was skipped, its watch kept
/// saying "watching"): then it is sampled again like any top-level region.
const RAISED_PARK_MAX: Nanos = 30 * SEC;
/// Most runs marked in one process per wake-up: bounds the VMA splits one
/// wake can add (two per run at most) well below any split budget.
pub const MAX_RUN_MARKS_PER_WAKE: usize = 16;
const PAGE: u64 = 4096;
/// Most ranges, and processes, write-tracked at once: each range is a
/// userfaultfd registration in its owner and a page-table walk per read.
/// pagesift's choice.
pub const MAX_TRACKED_RANGES: usize = 64;
/// See [`MAX_TRACKED_RANGES`].
pub const MAX_TRACKED_PROCS: usize = 16;
/// A tracked region is not marked before its writes were watched this
/// long (a region may reach the top level soon after tracking began).
/// About the time a region spends on levels 1 and 2 of the full governor
/// (500 + 200 ms round times), so a steady climber rarely waits; enough
/// for UKSM §8.1.2's one write per 10 ms to show 50 writes. pagesift's
/// choice.
pub const WRITE_WATCH_MIN: Nanos = SEC / 2;
/// Writes of tracked regions are read at most this often.
const WRITE_READ_INTERVAL: Nanos = SEC / 4;

/// The main thread's CPU time per phase of [`Daemon::wake`], ns since
/// start: what `status` and the metrics break the daemon's CPU down by.
/// The wake-up's phases in the order [`Daemon::wake`] runs them (the
/// names of [`PhaseCpu`]'s fields), as the watchdog reports them.
pub const PHASES: [&str; 10] = [
    "refresh", "hints", "distil", "sweep", "account", "numa", "watch", "actuate", "pace", "scrub",
];

#[derive(Clone, Copy, Debug, Default)]
struct PhaseCpu {
    refresh: u64,
    hints: u64,
    distil: u64,
    sweep: u64,
    account: u64,
    numa: u64,
    watch: u64,
    actuate: u64,
    pace: u64,
    scrub: u64,
}

impl PhaseCpu {
    fn seconds(&self) -> BTreeMap<String, f64> {
        [
            ("refresh", self.refresh),
            ("hints", self.hints),
            ("distil", self.distil),
            ("sweep", self.sweep),
            ("account", self.account),
            ("numa", self.numa),
            ("watch", self.watch),
            ("actuate", self.actuate),
            ("pace", self.pace),
            ("scrub", self.scrub),
        ]
        .into_iter()
        .map(|(name, ns)| (name.to_string(), ns as f64 / 1e9))
        .collect()
    }
}

/// A stopwatch over the thread's CPU clock: each [`Lap::to`] adds the CPU
/// time since the previous lap to a phase's total, and tells the watch
/// that the next phase of [`PHASES`] runs.
struct Lap {
    cpu: u64,
    next: usize,
    watch: WakeWatch,
}

impl Lap {
    fn start(cpu: u64, watch: WakeWatch) -> Lap {
        watch.begin();
        Lap {
            cpu,
            next: 1,
            watch,
        }
    }

    fn to(&mut self, total: &mut u64) {
        let t = host::thread_cpu_ns();
        *total += t.saturating_sub(self.cpu);
        self.cpu = t;
        self.watch.enter(self.next);
        self.next += 1;
    }
}

/// One `madvise` the loop wants, and for which region.
#[derive(Clone, Copy, Debug)]
struct Item {
    id: RegionId,
    advice: Advice,
    /// The whole region (promotion or demotion), or a run inside it.
    whole: bool,
}

impl Item {
    /// `MADV_MERGEABLE` on `[start, end)`, a part of region `id`.
    fn mark_part(id: RegionId, start: u64, end: u64) -> Item {
        Item {
            id,
            advice: Advice {
                start,
                len: end - start,
                mergeable: true,
            },
            whole: false,
        }
    }
}

/// What the loop keeps about one region besides its lifecycle (mode,
/// holds, settling, COW accounting: `core::pipeline::lifecycle`, in
/// [`Daemon`]'s `lives`, which also keeps the regions hidden from the
/// ladder).
#[derive(Clone, Debug)]
struct Book {
    span: Span,
    first_seen: Nanos,
    /// Write tracking of the region: since when, and where it was written.
    watch: Option<WriteWatch>,
    /// The zones (page ranges) its watch found written when it was judged
    /// markable around them: marking leaves them out, however long the
    /// marking waits (core::pipeline::write_watch, ColdExcept).
    exclude: Option<Vec<(u32, u32)>>,
    /// When the exact sweep raised it to the top level (see
    /// [`Book::awaits_watch`]).
    raised_at: Option<Nanos>,
    /// Since when it is parked on the top level (raised by the sweep,
    /// waiting for its write watch's verdict): see [`RAISED_PARK_MAX`].
    parked_at: Option<Nanos>,
    /// Its duplicate pages, as the last sweep epoch found them: its watch
    /// counts the writes that land on them (core::pipeline::write_watch).
    dups: Option<DupMap>,
    /// Its unique zones (stretches without duplicates) as the last sweep
    /// epoch found them, and when: promotion marks around them while they
    /// are recent (see [`UNIQUE_ZONES_FRESH`]).
    unique: Vec<(u32, u32)>,
    unique_at: Nanos,
    /// Times a sweep found it settled with duplicates left and made ksmd
    /// merge it again, and the earliest time it may do so again (see
    /// [`REMERGE_MIN_PAGES`]).
    sweep_remerges: u32,
    sweep_remerge_after: Nanos,
    /// Pages expected to merge, from the duplicate share that promoted it
    /// whole, until the mark is done (then handed to its lifecycle, see
    /// `Lifecycles::expect`).
    expected_dups: Option<u64>,
    /// Whether the log said it waits for its process's regions to live
    /// longer (once per book).
    short_noted: bool,
    /// Mapped where its process's last region of its size was marked: the
    /// predecessor's duplication ratio, until it is raised to the top
    /// (`Daemon::raise_recurring`).
    recurring: Option<f64>,
    /// Raised to the top on its predecessors' evidence, not on its own
    /// samples (`core::pipeline::recurrence`).
    raised_on_history: bool,
    /// The duplicate share it was marked whole with.
    marked_dup: Option<f64>,
    /// Raised on history and seen merging by a probe
    /// (`Daemon::probe_recurring`): its place is passed on.
    seen_merged: bool,
}

impl Book {
    /// A region the sweep raised straight to the top level has not been
    /// watched on the way up, as a climbing one is from level 1: with write
    /// watching on, it waits up to [`RAISED_WATCH_WAIT`] for a watch (and
    /// its verdict) before it may be marked, so that a region rewritten
    /// with the same bytes (which the sweep cannot see) is not marked on
    /// the sweep's word alone.
    fn awaits_watch(&self, watching: bool, now: Nanos) -> bool {
        watching
            && self.watch.is_none()
            && self.raised_at.is_some_and(|t| now < t + RAISED_WATCH_WAIT)
    }

    /// Its age at `now` (since first seen, or since mapped anew), seconds.
    fn age_s(&self, now: Nanos) -> f64 {
        now.saturating_sub(self.first_seen) as f64 / SEC as f64
    }

    fn new(span: Span, now: Nanos) -> Book {
        Book {
            span,
            first_seen: now,
            watch: None,
            exclude: None,
            raised_at: None,
            parked_at: None,
            dups: None,
            unique: Vec::new(),
            unique_at: 0,
            sweep_remerges: 0,
            sweep_remerge_after: 0,
            expected_dups: None,
            short_noted: false,
            recurring: None,
            raised_on_history: false,
            marked_dup: None,
            seen_merged: false,
        }
    }

    /// Mapped anew in place (`Daemon::note_renewals`): what it knew of the
    /// old generation's pages and marks does not hold for the new one.
    fn reborn(&mut self) {
        self.resized();
        self.exclude = None;
        self.raised_at = None;
        self.parked_at = None;
        self.expected_dups = None;
        self.recurring = None;
        self.raised_on_history = false;
        self.marked_dup = None;
        self.seen_merged = false;
    }

    /// Its length changed (its lifecycle follows in `Lifecycles::track`).
    fn resized(&mut self) {
        // Zones and duplicate maps are offsets into the old span.
        self.exclude = None;
        self.watch = None;
        self.dups = None;
        self.unique.clear();
    }

    /// Its unique zones if a sweep found them within
    /// [`UNIQUE_ZONES_FRESH`] of `now`, shrunk inwards to whole
    /// [`RUN_ALIGN_PAGES`] (what is left out is never more than the sweep
    /// saw unique).
    fn fresh_unique(&self, now: Nanos) -> Vec<(u32, u32)> {
        if now > self.unique_at + UNIQUE_ZONES_FRESH {
            return Vec::new();
        }
        let a = RUN_ALIGN_PAGES as u32;
        (self.unique.iter())
            .map(|&(s, e)| (s.div_ceil(a) * a, e / a * a))
            .filter(|&(s, e)| s < e)
            .collect()
    }

    /// A watch of it armed at `now`, told where its duplicates are if a
    /// sweep has said.
    fn arm_watch(&mut self, now: Nanos) {
        let mut w = WriteWatch::new(self.span.pages, now);
        if let Some(m) = &self.dups {
            w.locate(m.clone(), now);
        }
        self.watch = Some(w);
    }
}

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
    /// CPU per wake-up phase (status and metrics).
    phase_cpu: PhaseCpu,
    /// Which phase the running wake-up is in, for the watchdog.
    wake_watch: WakeWatch,
    skipped: BTreeMap<u32, SkipEntry>,
    inject_skips: BTreeMap<u32, SkipEntry>,
    /// Regions left out at the last refresh (logged when it changes from 0).
    left_out: usize,
    pending_unmarks: Vec<RegionId>,
    /// Duplicate runs the last wake followed, for `actuate`.
    runs: Vec<DupRun>,
    /// The ladder's view must be synced (a refresh, a reload); changes of
    /// visibility are `lives`' own flag.
    need_sync: bool,
    force_refresh: bool,
    pending_change: bool,
    /// The target's fill counts were read again (at the last check for
    /// changed processes) and the sweeper has not been told yet: they
    /// change only then, so they are not copied at every wake.
    fill_counts_new: bool,
    next_check: Nanos,
    earliest_refresh: Nanos,
    /// No refresh the loop asks for itself (after marking, a process gone)
    /// before this: see [`FORCED_REFRESH_CPU`].
    earliest_forced: Nanos,
    /// The periodic refresh is due (see [`MAX_REFRESH_INTERVAL`]).
    next_periodic_refresh: Nanos,
    last_account: Nanos,
    account_from: Option<RegionId>,
    counters: Counters,
    ksm_now: KsmSample,
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
    cpu_window: VecDeque<(Nanos, u64, u64)>,
    last_publish: Option<Nanos>,
    states: Vec<PageState>,
    /// Ranges write-tracked now, and when their writes were last read.
    tracked: usize,
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
    /// Placement of merged pages on a NUMA host (`None`: one node, or off).
    numa: Option<crate::numa::NumaPlacement>,
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
            renewal_cursor: None,
            phase_cpu: PhaseCpu::default(),
            wake_watch: WakeWatch::new(),
            skipped: BTreeMap::new(),
            inject_skips: BTreeMap::new(),
            left_out: 0,
            pending_unmarks: Vec::new(),
            runs: Vec::new(),
            need_sync: true,
            force_refresh: false,
            pending_change: false,
            next_check: now,
            earliest_refresh: now,
            earliest_forced: now,
            next_periodic_refresh: now + MAX_REFRESH_INTERVAL,
            last_account: now,
            account_from: None,
            counters: Counters::default(),
            ksm_now: KsmSample::default(),
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
            last_publish: None,
            states: Vec::new(),
            sweeper,
            sweep_runs: Vec::new(),
            numa,
        };
        if let Ok(s) = d.ksm.sample() {
            d.ksm_now = s;
            d.ksm_start = Some(s);
        }
        // The target discovered its processes when it was built.
        d.after_refresh(now);
        d
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
        let sleep = sleep_for_share(active as f64, self.config.cpu_cap())
            .max(base)
            .min(MAX_SLEEP);
        summary.sleep = sleep;
        self.counters.wakes += 1;
        summary
    }

    /// One slice of the exact sweep over the sampling regions of eligible
    /// processes; when it finishes an epoch, its findings steer the ladder
    /// (`core::pipeline::sweep`): a region with at least V_dup duplicates among its
    /// present pages is raised to the top level, where the write watch
    /// and marking take over; in a poorer region each long enough run of
    /// duplicates joins this wake's runs, marked like sampled ones (each
    /// side is found by the sweep, so no twin is needed).
    fn sweep(&mut self, now: Nanos) {
        let (books, lives, allowed, managed) =
            (&self.books, &self.lives, &self.allowed, &self.self_managed);
        let min_age = (self.config.scan.sweep_min_age_s * SEC as f64) as Nanos;
        let regions = |filling: &BTreeSet<u32>, full: bool| {
            books
                .iter()
                .filter_map(|(&id, b)| {
                    // A full epoch walks every sampling region; a fill
                    // epoch those of the processes that filled. Both walk
                    // the settled promoted regions of those processes (a
                    // guest filling RAM that was marked early): new
                    // duplicates in them would wait for the trickle.
                    let pid = b.span.proc.pid;
                    let filled = filling.contains(&pid);
                    let walk = match lives.mode(id) {
                        Some(Mode::Sampling) => full || filled,
                        Some(Mode::Promoted) => filled,
                        _ => false,
                    };
                    (walk
                        && !lives.is_hidden(id)
                        && allowed.contains_key(&pid)
                        && !managed.contains(&pid)
                        && now.saturating_sub(b.first_seen) >= min_age)
                        .then_some((id, filled))
                })
                .collect()
        };
        let min_run = self.config.actuate.run_min_pages.max(1);
        if std::mem::take(&mut self.fill_counts_new) {
            self.sweeper.note_filled(self.target.filled_pages());
        }
        let Some(findings) = self.sweeper.step(&mut self.target, now, min_run, regions) else {
            return;
        };
        // The new epoch's runs replace the last one's that still wait (a
        // fill epoch's, those of the regions it walked).
        if self.sweeper.fill_epoch() {
            let walked: HashSet<RegionId> = findings.iter().map(|f| f.region).collect();
            self.sweep_runs.retain(|r| !walked.contains(&r.region));
        } else {
            self.sweep_runs.clear();
        }
        let watching = self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0;
        let top = self.distiller.ladder().levels() - 1;
        let (mut raised, mut runs, mut remerged) = (0u64, 0u64, 0u64);
        for mut f in findings {
            // Its watch, now or later, learns where its duplicates are.
            if let Some(b) = self.books.get_mut(&f.region) {
                let map = std::mem::take(&mut f.map);
                if let Some(w) = &mut b.watch {
                    w.locate(map.clone(), now);
                }
                b.dups = Some(map);
                b.unique = std::mem::take(&mut f.unique);
                b.unique_at = now;
            }
            if !self.books.contains_key(&f.region) || self.lives.is_hidden(f.region) {
                continue;
            }
            if self.lives.mode(f.region) == Some(Mode::Promoted) {
                // Settled, yet holding duplicates ksmd has not merged: a
                // guest that went on filling its RAM after its regions
                // were marked. ksmd's trickle would take minutes; the
                // region merges again at the active pace.
                let b = self.books.get_mut(&f.region).expect("checked above");
                let merged = self.lives[f.region].merged_now();
                if f.unmerged_dups >= REMERGE_MIN_PAGES
                    && now >= b.sweep_remerge_after
                    && self.lives.remerge(f.region, self.ksm_now.full_scans, now)
                {
                    self.lives
                        .expect(f.region, merged + u64::from(f.unmerged_dups));
                    // Duplicates ksmd cannot merge (pinned pages, say)
                    // would send it back every epoch: each time it waits
                    // twice as long, up to 64 sweep spacings.
                    b.sweep_remerges += 1;
                    b.sweep_remerge_after =
                        now + self.sweeper.min_epoch() * (1 << b.sweep_remerges.min(6));
                    remerged += 1;
                    self.counters.remerges += 1;
                    info!(
                        pid = b.span.proc.pid,
                        start = b.span.start,
                        pages = b.span.pages,
                        unmerged_dups = f.unmerged_dups,
                        "sweep: new duplicates in a merged region: merging it again"
                    );
                }
                continue;
            }
            if self.lives.mode(f.region) != Some(Mode::Sampling) {
                continue;
            }
            if f.present >= crate::sweep::MIN_PRESENT
                && self.distiller.raise(f.region, f.dup_ratio(), now)
            {
                raised += 1;
                // Parked on the top level until its watch decides: top-level
                // samples would only misjudge it (its twins sit at offsets
                // sampling does not meet), cost the top level's CPU share,
                // and drop it before the watch is done.
                let parked = watching && self.distiller.park(f.region);
                if let Some(b) = self.books.get_mut(&f.region) {
                    b.raised_at = Some(now);
                    b.parked_at = parked.then_some(now);
                }
                let b = &self.books[&f.region];
                debug!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    present = f.present,
                    dups = f.dups,
                    "sweep: duplicates all over, raised to the top level"
                );
                continue;
            }
            if self.distiller.ladder().level_of(f.region) == Some(top) {
                continue;
            }
            for (first, end) in f.runs {
                runs += 1;
                self.sweep_runs.push(DupRun {
                    region: f.region,
                    first,
                    pages: end - first,
                    twin: None,
                    hinted: false,
                });
            }
        }
        self.sweeper.fruitful(raised + runs + remerged > 0);
        self.sweeper.stats.raised += raised;
        self.sweeper.stats.runs += runs;
        info!(
            epoch = self.sweeper.stats.epochs,
            seconds = self.sweeper.stats.last_epoch_ns as f64 / SEC as f64,
            ns_per_page = self.sweeper.ns_per_page() as u64,
            raised,
            runs,
            remerged,
            "sweep done"
        );
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

    /// Whether a status snapshot is due (about once a second).
    pub fn publish_due(&self, now: Nanos) -> bool {
        self.last_publish.is_none_or(|t| now >= t + SEC)
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

    /// Reads the writes of the tracked regions, then tracks exactly the
    /// candidates: unmarked regions on level 1 and up, or holding duplicate
    /// runs the sweep found, highest first,
    /// bounded; never a range that this wake may mark (a top-level region
    /// watched long enough and cold, a region with a duplicate run), so
    /// tracking always stops before marking.
    fn watch_writes(&mut self, now: Nanos) {
        // V_cow = 100 %: writes cannot stop a promotion, so none are watched.
        if !self.config.actuate.write_tracking || self.config.ladder.v_cow >= 1.0 {
            if self.tracked > 0 {
                self.tracked = self.target.sync_write_tracking(&[]);
                self.books.values_mut().for_each(|b| b.watch = None);
            }
            return;
        }
        let read = now >= self.last_write_read + WRITE_READ_INTERVAL;
        if read {
            self.last_write_read = now;
        }
        let ladder = self.distiller.ladder();
        let top = ladder.levels() - 1;
        let runs: BTreeSet<RegionId> = (self.runs.iter())
            .flat_map(|r| std::iter::once(r.region).chain(r.twin.map(|t| t.region)))
            .collect();
        let swept: BTreeSet<RegionId> = self.sweep_runs.iter().map(|r| r.region).collect();
        let (mut swept_ready, mut swept_hot) = (BTreeSet::new(), BTreeSet::new());
        let mut candidates: Vec<(usize, RegionId)> = Vec::new();
        let rules = write_rules(&self.config);
        for (&id, b) in &mut self.books {
            if read && let Some(w) = &mut b.watch {
                let s = &b.span;
                match self.target.written_runs(s.proc.pid, s.start, s.end()) {
                    Some(runs) => {
                        for (a, e) in runs {
                            let first = (a.saturating_sub(s.start) / PAGE) as u32;
                            let end = (e.saturating_sub(s.start)).div_ceil(PAGE) as u32;
                            w.record(first, end, rules.zone_gap);
                        }
                        w.checkpoint(now);
                    }
                    None => b.watch = None,
                }
            }
            let level = ladder.level_of(id).unwrap_or(0);
            // A bottom-level region neither watched nor swept is none of
            // the cases below: skip the verdict (this loop runs every
            // wake-up over every region).
            if level == 0 && b.watch.is_none() && !swept.contains(&id) {
                continue;
            }
            let held = held_since_cleared(&self.lives, id);
            let verdict = write_verdict(b, dup_share(ladder, id), &self.config, now, held);
            // Cold all over: cleared (the watch stops as soon as the
            // region may be marked, the clearance stays). Cold except some
            // zones is not (the zones outlive the watch in `exclude`, for
            // a whole mark only).
            if b.watch.is_some() && verdict == WriteVerdict::Cold {
                self.lives.clear_writes(id);
            }
            if swept.contains(&id) && b.watch.is_some() {
                match verdict {
                    WriteVerdict::Cold => {
                        swept_ready.insert(id);
                    }
                    WriteVerdict::Watching => {}
                    WriteVerdict::Hot | WriteVerdict::ColdExcept(_) => {
                        swept_hot.insert(id);
                    }
                }
            }
            // Duplicate runs are marked only in regions cold all over.
            let verdict_cold = verdict == WriteVerdict::Cold;
            let cold = verdict_cold || matches!(verdict, WriteVerdict::ColdExcept(_));
            let mode = self.lives.mode(id);
            let markable =
                level == top && mode == Some(Mode::Sampling) && cold && !b.awaits_watch(true, now);
            if markable && let WriteVerdict::ColdExcept(zones) = verdict {
                // Tracking stops below; the zones must outlive the watch.
                b.exclude = Some(zones);
            }
            if (level >= 1 || swept.contains(&id))
                && matches!(mode, Some(Mode::Sampling | Mode::Held { .. }))
                && !markable
                && !(runs.contains(&id) && verdict_cold)
                && !swept_ready.contains(&id)
                && self.allowed.contains_key(&b.span.proc.pid)
                && !self.self_managed.contains(&b.span.proc.pid)
                && !self.marks.overlaps(b.span.proc, b.span.start, b.span.end())
            {
                candidates.push((level, id));
            }
        }
        // The sweep's runs in regions judged cold are marked this wake
        // (tracking stops below first); in regions found hot they are
        // dropped; the others wait for their watch.
        for run in std::mem::take(&mut self.sweep_runs) {
            if swept_ready.contains(&run.region) {
                self.runs.push(run);
            } else if !swept_hot.contains(&run.region) {
                self.sweep_runs.push(run);
            }
        }
        candidates.sort_by_key(|&(level, id)| (std::cmp::Reverse(level), id));
        let mut pids = BTreeSet::new();
        let mut wanted = Vec::new();
        for (_, id) in candidates {
            let s = &self.books[&id].span;
            if wanted.len() == MAX_TRACKED_RANGES
                || (pids.len() == MAX_TRACKED_PROCS && !pids.contains(&s.proc.pid))
            {
                continue;
            }
            pids.insert(s.proc.pid);
            wanted.push((s.proc.pid, s.start, s.end(), id));
        }
        let ranges: Vec<(u32, u64, u64)> = wanted.iter().map(|w| (w.0, w.1, w.2)).collect();
        self.tracked = self.target.sync_write_tracking(&ranges);
        let wanted: BTreeSet<RegionId> = wanted.iter().map(|w| w.3).collect();
        for (id, b) in &mut self.books {
            if !wanted.contains(id) {
                b.watch = None;
            } else if b.watch.is_none() {
                // Armed by the sync if it took: the first read says.
                let s = &b.span;
                if self
                    .target
                    .written_runs(s.proc.pid, s.start, s.end())
                    .is_some()
                {
                    b.arm_watch(now);
                    // The watch takes over from the wait for one.
                    b.raised_at = None;
                }
            }
        }
    }

    fn maybe_refresh(&mut self, now: Nanos) -> bool {
        if now >= self.next_check {
            // The check reads /proc's pid list and one statm per selected
            // process (about 2 µs each): with thousands of processes it is
            // spaced out to stay within `scan.refresh_cpu` too.
            let t0 = host::thread_cpu_ns();
            if self.target.processes_changed() {
                self.pending_change = true;
            }
            // A region unmapped and mapped again at the same addresses
            // between two checks keeps the size the check compares (a
            // cycle the checks alias with): its frames tell.
            self.note_renewals(now, None);
            self.fill_counts_new = true;
            let cost = host::thread_cpu_ns().saturating_sub(t0);
            let spacing = (cost as f64 / self.config.scan.refresh_cpu) as Nanos;
            self.next_check = now + (self.config.scan.refresh_ms * MS).max(spacing);
        } else {
            // Between checks, a few of the regions whose age the lifespan
            // rule judges are looked at every wake-up: a cycle shorter
            // than the check's interval would otherwise be caught only
            // when two checks in a row find it mapped.
            let turn = self.renewal_turn(now);
            if !turn.is_empty() {
                self.note_renewals(now, Some(&turn));
            }
        }
        let due = (self.force_refresh && now >= self.earliest_forced)
            || (self.pending_change && now >= self.earliest_refresh)
            || now >= self.next_periodic_refresh;
        if !due {
            return false;
        }
        let t0 = host::thread_cpu_ns();
        if let Err(e) = self.target.refresh() {
            warn!(error = %e, "refreshing processes failed");
            self.force_refresh = false;
            return false;
        }
        let cost = host::thread_cpu_ns().saturating_sub(t0);
        self.earliest_refresh = now + (cost as f64 / self.config.scan.refresh_cpu) as Nanos;
        self.earliest_forced = now + (cost as f64 / FORCED_REFRESH_CPU) as Nanos;
        // At least every MAX_REFRESH_INTERVAL, but no more CPU than
        // FORCED_REFRESH_CPU for it when a refresh is that costly.
        self.next_periodic_refresh =
            now + MAX_REFRESH_INTERVAL.max((cost as f64 / FORCED_REFRESH_CPU) as Nanos);
        self.force_refresh = false;
        self.pending_change = false;
        self.pending_run_pages = 0;
        self.after_refresh(now);
        debug!(
            cost_us = cost / 1000,
            regions = self.books.len(),
            "refreshed"
        );
        true
    }

    /// The regions to look at for renewal at this wake-up between checks:
    /// the next [`RENEWAL_LOOKS_PER_WAKE`] after the last one looked at,
    /// in id order and wrapping around, among those the lifespan rule
    /// judges (at least its smallest size, and younger than its early age
    /// or of a process with an early death). A QEMU has hundreds of such
    /// regions while its guest boots, so they take turns.
    pub(crate) fn renewal_turn(&mut self, now: Nanos) -> BTreeSet<RegionId> {
        let rules = *self.lifespans.rules();
        let early: HashSet<ProcKey> = self.lifespans.procs().copied().collect();
        let judged = |(_, b): &(&RegionId, &Book)| {
            b.span.pages >= rules.min_pages
                && (now.saturating_sub(b.first_seen) < rules.short || early.contains(&b.span.proc))
        };
        let after = self
            .renewal_cursor
            .map_or(Bound::Unbounded, Bound::Excluded);
        // In visiting order, so that the cursor is the last one visited
        // (after a wrap, one near the start).
        let mut order: Vec<RegionId> = (self.books.range((after, Bound::Unbounded)))
            .filter(judged)
            .map(|(&id, _)| id)
            .take(RENEWAL_LOOKS_PER_WAKE)
            .collect();
        let more = RENEWAL_LOOKS_PER_WAKE - order.len();
        if more > 0 {
            let wrapped: Vec<RegionId> = (self.books.iter())
                .filter(judged)
                .map(|(&id, _)| id)
                .take_while(|id| !order.contains(id))
                .take(more)
                .collect();
            order.extend(wrapped);
        }
        self.renewal_cursor = order.last().copied();
        order.into_iter().collect()
    }

    /// Regions mapped anew at the same addresses since the last look
    /// (`Target::check_renewed`; `only`: the regions to look at, all
    /// when `None`). Each generation is a life of its own: the old one
    /// died now, at the age it had reached, and the new one is first seen
    /// now, so that the lifespan rule sees a cycle that the maps cannot.
    fn note_renewals(&mut self, now: Nanos, only: Option<&BTreeSet<RegionId>>) {
        let min_pages = self.lifespans.rules().min_pages;
        for id in self.target.check_renewed(min_pages, only) {
            let Some(b) = self.books.get_mut(&id) else {
                continue;
            };
            debug!(
                pid = b.span.proc.pid,
                start = b.span.start,
                pages = b.span.pages,
                age_s = b.age_s(now),
                "mapped anew at the same addresses: a new life"
            );
            self.lifespans
                .died(b.span.proc, b.span.pages, b.first_seen, now);
            b.first_seen = now;
            if self.lives.mode(id) == Some(Mode::Promoted) {
                // Its mark went with the old VMA: the new generation is
                // unmarked memory, judged afresh (and recurring, if its
                // place says so). Without this, the next refresh took the
                // unmarked range for one the kernel or the process had
                // unmarked, and held it for `demote_hold_s`.
                let life = self.lives.forget(id);
                self.marks.remove(b.span.proc, b.span.start, b.span.end());
                let ending = ending_of(b, life.as_ref(), true);
                self.recurrences
                    .died(b.span.proc, b.span.start, b.span.pages, ending, now);
                self.lives.track(id, b.span.pages, now);
                b.reborn();
                b.recurring = (self.config.ladder.raise_recurring)
                    .then(|| {
                        self.recurrences
                            .predecessor(b.span.proc, b.span.start, b.span.pages, now)
                    })
                    .flatten();
                // Discovery's memory of what pagesift advised there is
                // stale: the next refresh reads the process's smaps.
                self.target.distrust_mergeable(b.span.proc.pid);
                self.need_sync = true;
            }
        }
    }

    fn after_refresh(&mut self, now: Nanos) {
        for pid in self.target.take_gone() {
            self.inject_skips.remove(&pid);
        }
        let procs = self.target.processes();
        self.allowed.clear();
        self.self_managed.clear();
        self.comms.clear();
        self.cgroups.clear();
        self.skipped.clear();
        for p in &procs {
            self.comms.insert(p.key.pid, p.facts.comm.clone());
            self.cgroups.insert(p.key.pid, p.cgroup.clone());
            match self.policy.judge(&p.facts) {
                Ok(()) => {
                    self.allowed.insert(p.key.pid, p.key);
                    if p.merge_any {
                        self.self_managed.insert(p.key.pid);
                    }
                }
                Err(reason) => {
                    // Processes that were never candidates are not news.
                    if crate::eligibility::refusal_is_news(&reason) {
                        self.skipped.insert(
                            p.key.pid,
                            SkipEntry {
                                comm: p.facts.comm.clone(),
                                reason,
                                retry_at: None,
                            },
                        );
                    }
                }
            }
        }
        for (pid, reason) in self.target.discovery_skipped() {
            self.skipped.insert(
                pid,
                SkipEntry {
                    comm: String::new(),
                    reason,
                    retry_at: None,
                },
            );
        }
        self.inject_skips
            .retain(|pid, _| self.allowed.contains_key(pid));
        self.unmark_departed();
        let left_out = self.target.regions_left_out();
        if left_out > 0 && self.left_out == 0 {
            warn!(
                left_out,
                max_regions = self.config.scan.max_regions,
                "eligible processes map more regions than scan.max_regions: the smallest are left out"
            );
        }
        self.left_out = left_out;
        // Regions of eligible processes. A region new to this refresh that
        // is a piece of a region known before (a mark split its VMA) is as
        // old as that region: see `known_since`.
        let before = KnownSpans::of(self.books.values());
        let regions = self.target.regions();
        let mut seen = BTreeSet::new();
        for r in regions {
            if !self.allowed.contains_key(&r.owner) {
                continue;
            }
            let Some(span) = self.target.span(r.id) else {
                continue;
            };
            seen.insert(r.id);
            let full_scans = self.ksm_now.full_scans;
            let self_managed = self.self_managed.contains(&span.proc.pid);
            let ours = self.marks.covers(span.proc, span.start, span.end());
            let recurring = (self.config.ladder.raise_recurring && !self.books.contains_key(&r.id))
                .then(|| {
                    self.recurrences
                        .predecessor(span.proc, span.start, span.pages, now)
                })
                .flatten();
            let book = self.books.entry(r.id).or_insert_with(|| {
                let mut b = Book::new(span.clone(), before.known_since(&span).unwrap_or(now));
                b.recurring = recurring;
                b
            });
            if book.span.pages != span.pages {
                book.resized();
            }
            self.lives.track(r.id, span.pages, now);
            book.span = span;
            let mergeable = book.span.mergeable;
            let foreign = self_managed || (mergeable && !ours);
            // Visibility follows each transition (`lives`): a region held
            // or merging is out of the ladder, and back when it is not.
            match (self.lives.mode(r.id), foreign) {
                (Some(Mode::Foreign), true) | (None, _) => {}
                (Some(mode), true) => {
                    if mode == Mode::Promoted {
                        // The process took over (merge-any): its range now,
                        // never to be unmarked by pagesift.
                        self.marks
                            .remove(book.span.proc, book.span.start, book.span.end());
                    }
                    self.lives.foreign(r.id, full_scans, now);
                }
                (Some(Mode::Foreign), false) => {
                    // The process made it unmergeable again.
                    self.lives.stop_foreign(r.id);
                }
                (Some(Mode::Promoted), false) if !mergeable => {
                    warn!(
                        pid = book.span.proc.pid,
                        start = book.span.start,
                        "a range pagesift marked is not mergeable (the kernel ignored \
                         MADV_MERGEABLE or the process unmarked it): holding it"
                    );
                    self.marks
                        .remove(book.span.proc, book.span.start, book.span.end());
                    self.lives
                        .hold(r.id, now, self.config.actuate.demote_hold_s);
                }
                (Some(Mode::Sampling), false) if ours && mergeable => {
                    // Marked in an earlier life of this book (ids rebuilt),
                    // or a marked run that became a VMA of its own: out of
                    // the ladder until ksmd has merged it.
                    self.lives.mark(r.id, full_scans, now);
                }
                _ => {}
            }
        }
        let gone: Vec<RegionId> = self
            .books
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        for id in gone {
            let life = self.lives.forget(id);
            let Some(b) = self.books.remove(&id) else {
                continue;
            };
            let renumbered = self.books.values().any(|o| {
                o.span.proc == b.span.proc
                    && o.span.start < b.span.end()
                    && b.span.start < o.span.end()
            });
            if renumbered {
                continue;
            }
            // Unmapped: its marks went with it.
            let marked = life.as_ref().is_some_and(|l| l.mode() == Mode::Promoted);
            if marked {
                self.marks.remove(b.span.proc, b.span.start, b.span.end());
            }
            self.lifespans
                .died(b.span.proc, b.span.pages, b.first_seen, now);
            let ending = ending_of(&b, life.as_ref(), marked);
            self.recurrences
                .died(b.span.proc, b.span.start, b.span.pages, ending, now);
        }
        let live: HashSet<ProcKey> = self.allowed.values().copied().collect();
        self.lifespans.retain(now, |k| live.contains(k));
        self.recurrences.retain(now, |k| live.contains(k));
        for key in self.marks.processes() {
            if !live.contains(&key) {
                self.marks.forget(key);
            }
        }
        self.need_sync = true;
        self.sync_hints();
    }

    /// Unmarks what pagesift marked in processes that left the eligible
    /// set ("ineligible always wins"): an `[ineligible]`
    /// entry after a reload, a uid or cgroup change, an exec (a new
    /// identity, see [`ProcKey`]). Their ledger ranges move to `departed`
    /// and get `MADV_UNMERGEABLE` in one batch per process, through the
    /// actuator that marked them, at this refresh; a batch that cannot run
    /// now (traced, seccomp) is tried again at the next refresh. A process
    /// that exited, or whose pid now names another process or image, is
    /// forgotten untouched: its marks went with it.
    fn unmark_departed(&mut self) {
        for key in self.marks.processes() {
            if self.allowed.get(&key.pid) != Some(&key) {
                for (s, e) in self.marks.ranges(key) {
                    self.departed.add(key, s, e);
                }
                self.marks.forget(key);
            }
        }
        for key in self.departed.processes() {
            if self.allowed.get(&key.pid) == Some(&key) {
                // Eligible again before the unmark could run: still marked.
                for (s, e) in self.departed.ranges(key) {
                    self.marks.add(key, s, e);
                }
                self.departed.forget(key);
                continue;
            }
            if !self.target.same_process(key) {
                self.departed.forget(key);
                continue;
            }
            let comm = self.comms.get(&key.pid).cloned().unwrap_or_default();
            self.counters.batches += 1;
            self.target.distrust_mergeable(key.pid);
            match crate::actuate::unmark_all(&mut self.actuator, &mut self.departed, key) {
                Unmarked::Done(bytes) => {
                    self.counters.unmarks += 1;
                    self.force_refresh = true;
                    info!(pid = key.pid, comm = %printable(&comm), bytes, "left the eligible set: unmarked");
                }
                Unmarked::Partly(failed) => {
                    warn!(pid = key.pid, comm = %printable(&comm), ?failed, "left the eligible set: some ranges could not be unmarked");
                    self.departed.forget(key);
                }
                Unmarked::Gone => {}
                Unmarked::NotNow(reason) => {
                    warn!(pid = key.pid, comm = %printable(&comm), reason = %reason, "left the eligible set, but cannot be unmarked now: trying again at the next refresh");
                }
            }
        }
    }

    /// The regions expected to be unmapped young (see `expected_short`)
    /// that are sampling: kept out of the ladder, as held ones are, so
    /// that they neither climb nor keep the upper levels (and the daemon)
    /// busy for memory that will be gone before it could be merged. One
    /// that outlives its process's early deaths comes back at the bottom.
    /// Whether the set changed.
    fn hide_short_lived(&mut self, now: Nanos) -> bool {
        if self.lifespans.is_empty() && self.short_lived.is_empty() {
            return false;
        }
        let mut short = BTreeSet::new();
        for (&id, b) in &mut self.books {
            if self.lives.mode(id) != Some(Mode::Sampling)
                || !expected_short(&self.lifespans, &self.config, b, now)
            {
                continue;
            }
            short.insert(id);
            if !b.short_noted {
                b.short_noted = true;
                info!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    age_s = b.age_s(now),
                    "its process's regions are unmapped young: not sampled or marked until it outlives them"
                );
            }
        }
        if short == self.short_lived {
            return false;
        }
        self.short_lived = short;
        true
    }

    /// Raises the regions mapped where their process's last region of
    /// their size was marked (`core::pipeline::recurrence`) to the top
    /// level, once the ladder has them: actuation marks them as it does a
    /// region raised by the sweep (after a write watch, with write
    /// tracking on).
    fn raise_recurring(&mut self, now: Nanos) {
        let watching = self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0;
        for (&id, b) in &mut self.books {
            let Some(dup) = b.recurring else {
                continue;
            };
            if !self.distiller.ladder().contains(id) {
                // Hidden (held, expected short): no longer a candidate.
                if self.lives.mode(id) != Some(Mode::Sampling) || self.short_lived.contains(&id) {
                    b.recurring = None;
                }
                continue;
            }
            b.recurring = None;
            if !self.distiller.raise_on_history(id, dup) {
                continue;
            }
            b.raised_on_history = true;
            self.probing.insert(id);
            b.raised_at = Some(now);
            let parked = watching && self.distiller.park(id);
            b.parked_at = parked.then_some(now);
            self.counters.raised_on_history += 1;
            debug!(
                pid = b.span.proc.pid,
                start = b.span.start,
                pages = b.span.pages,
                dup,
                "mapped again where its predecessor was marked: raised to the top level"
            );
        }
    }

    fn distil(&mut self, now: Nanos) -> u64 {
        // Both flags are cleared here (no short circuit).
        let view_changed = self.lives.take_view_changed() | self.hide_short_lived(now);
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
            self.distiller.sync_regions(&view, now);
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

    fn actuate(&mut self, now: Nanos, summary: &mut WakeSummary) {
        let top = self.distiller.ladder().levels() - 1;
        let watching = self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0;
        let mut batches: BTreeMap<u32, Vec<Item>> = BTreeMap::new();
        for id in self.distiller.ladder().regions_at(top) {
            let Some(b) = self.books.get_mut(&id) else {
                continue;
            };
            if let Some(Mode::Held { until }) = self.lives.mode(id) {
                if now < until {
                    continue;
                }
                self.lives.release(id, now);
            }
            // Merged, settled, and back at the top: merged pages are no
            // duplicates to the sampler, so new ones appeared in it (a
            // guest filled pages, say) that the trickle would take minutes
            // to reach. ksmd merges it again at the active pace, as UKSM
            // gives a climbing region the top level's CPU (out of the
            // ladder again until it settles).
            if self.lives.remerge(id, self.ksm_now.full_scans, now) {
                self.counters.remerges += 1;
                summary.remerging.push(id);
                info!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    "new duplicates in a merged region: merging it again"
                );
                continue;
            }
            let sampling = self.lives.mode(id) == Some(Mode::Sampling);
            if b.parked_at
                .is_some_and(|t| !sampling || now >= t + RAISED_PARK_MAX)
            {
                b.parked_at = None;
                self.distiller.readmit(id);
            }
            if !sampling || b.awaits_watch(watching, now) {
                continue;
            }
            if expected_short(&self.lifespans, &self.config, b, now) {
                // On the top level when its process's first early death
                // was seen: hidden from the next wake on.
                continue;
            }
            let dup = dup_share(self.distiller.ladder(), id);
            let verdict = match &b.exclude {
                Some(zones) => WriteVerdict::ColdExcept(zones.clone()),
                None => write_verdict(
                    b,
                    dup,
                    &self.config,
                    now,
                    held_since_cleared(&self.lives, id),
                ),
            };
            let exclude = match verdict {
                WriteVerdict::Hot => {
                    // Out of the ladder while held (see `release_holds`).
                    self.lives.hold(id, now, self.config.actuate.write_hold_s);
                    let w = b.watch.as_ref();
                    info!(
                        pid = b.span.proc.pid,
                        start = b.span.start,
                        pages = b.span.pages,
                        dup,
                        writes = w.map_or(0, |w| w.writes()),
                        on_duplicates = w.and_then(|w| w.writes_on_duplicates()),
                        watched_s =
                            w.map_or(0.0, |w| now.saturating_sub(w.since()) as f64 / SEC as f64),
                        "writes would break its merged pages: not promoted, held"
                    );
                    continue;
                }
                WriteVerdict::Watching => {
                    // Watched long enough but waiting for the sweep's map
                    // of its duplicates: parked, as a raised region is,
                    // since top-level samples would only spend the top
                    // level's share re-finding what got it here.
                    let waiting = b
                        .watch
                        .as_ref()
                        .is_some_and(|w| now >= w.since() + WRITE_WATCH_MIN);
                    if waiting && b.parked_at.is_none() && self.distiller.park(id) {
                        b.parked_at = Some(now);
                    }
                    continue;
                }
                WriteVerdict::Cold => None,
                WriteVerdict::ColdExcept(zones) => Some(zones),
            };
            // Stretches the last sweep found without duplicates are left
            // out too: ksmd would visit them every full scan for nothing.
            // Unless sampling contradicts them (see `zones_contradicted`):
            // then the sweep was blind to the twins (merged content) or
            // its view is older than the samples, and marking around the
            // zones would leave duplicates out.
            // (Only a real judgement counts: `dup` assumes the worst
            // before the first.)
            let mut unique = b.fresh_unique(now);
            let sampled = (self.distiller.ladder().region_stats(id)).filter(|s| s.judged > 0);
            if sampled.is_some_and(|s| zones_contradicted(&unique, b.span.pages, s.last_dup_ratio))
            {
                info!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    dup,
                    unique_zones = unique.len(),
                    "sampling found more duplicates than the sweep's unique zones leave room \
                     for: marking without them"
                );
                unique.clear();
            }
            let unique_zones = unique.len();
            let exclude = match (exclude, unique.is_empty()) {
                (exclude, true) => exclude,
                (written, false) => Some(join_zones(&written.unwrap_or_default(), &unique)),
            };
            let pid = b.span.proc.pid;
            if self.self_managed.contains(&pid)
                || self
                    .inject_skips
                    .get(&pid)
                    .is_some_and(|s| s.retry_at.is_some_and(|t| now < t))
            {
                continue;
            }
            let Some(zones) = exclude else {
                b.expected_dups = Some((dup * f64::from(b.span.pages)).ceil() as u64);
                batches.entry(pid).or_default().push(Item {
                    id,
                    advice: Advice {
                        start: b.span.start,
                        len: b.span.end() - b.span.start,
                        mergeable: true,
                    },
                    whole: true,
                });
                continue;
            };
            // Written in places only: mark the rest, in pieces long enough
            // to be worth a VMA of their own; the written zones stay
            // unmarked and become regions of their own (see
            // core::pipeline::write_watch).
            let min = (self.config.actuate.run_min_pages as u64).max(RUN_ALIGN_PAGES);
            let mut from = 0u64;
            let (mut pieces, mut worth) = (0, 0);
            for &(zs, ze) in zones
                .iter()
                .chain(std::iter::once(&(b.span.pages, b.span.pages)))
            {
                let (zs, ze) = (u64::from(zs), u64::from(ze));
                if zs >= from + min {
                    worth += 1;
                    let (s, e) = (b.span.start + from * PAGE, b.span.start + zs * PAGE);
                    if !self.marks.covers(b.span.proc, s, e) {
                        batches
                            .entry(pid)
                            .or_default()
                            .push(Item::mark_part(id, s, e));
                        pieces += 1;
                    }
                }
                from = from.max(ze);
            }
            if pieces > 0 {
                self.counters.partial_marks += 1;
                info!(
                    pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    zones = zones.len(),
                    unique_zones,
                    pieces,
                    "written or unique in places: marking the rest of the region"
                );
            } else if worth == 0 && unique_zones > 0 {
                // Nothing but stretches without duplicates: sampling's
                // evidence is older than the sweep's or was luck. Held, so
                // that it is not judged again at every wake.
                self.lives.hold(id, now, self.config.actuate.write_hold_s);
                info!(
                    pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    unique_zones,
                    "no duplicates outside its unique zones: not promoted, held"
                );
            }
        }
        // A region merged again from the top has its first pass now, before
        // ksmd is paced for it: the pages it lost since it settled are its
        // COW breaks (`core::pipeline::lifecycle`'s thrashing rule), and a
        // ksmd at a small set's quick rate can merge them again before the
        // next wake-up's pass would see them broken. Larger regions take
        // ksmd longer than that and wait for the budgeted pass.
        let rules = account_rules(&self.config);
        for id in summary.remerging.clone() {
            let small = self
                .lives
                .get(id)
                .is_some_and(|l| u64::from(l.pages()) <= REMERGE_PASS_PAGES);
            if small {
                let mut budget = REMERGE_PASS_PAGES;
                self.account_region(id, now, self.ksm_now.full_scans, &rules, &mut budget);
            }
        }
        self.ready_sweep_runs();
        for (pid, item) in self.run_items(now, &batches) {
            batches.entry(pid).or_default().push(item);
        }
        for id in std::mem::take(&mut self.pending_unmarks) {
            let Some(b) = self.books.get(&id) else {
                continue;
            };
            if self.lives.mode(id) != Some(Mode::Promoted)
                || !self.marks.covers(b.span.proc, b.span.start, b.span.end())
            {
                continue; // never unmark what pagesift did not mark
            }
            batches.entry(b.span.proc.pid).or_default().push(Item {
                id,
                advice: Advice {
                    start: b.span.start,
                    len: b.span.end() - b.span.start,
                    mergeable: false,
                },
                whole: true,
            });
        }
        for (pid, items) in batches {
            self.run_batch(pid, items, now, summary);
        }
    }

    /// Without write watching, the sweep's runs are marked at once (with
    /// it, [`Daemon::watch_writes`] releases them region by region, once
    /// the region's watch has judged it cold all over: the sweep sees
    /// content, not writes, and a page rewritten with the same bytes looks
    /// stable to it, while marking it would induce COW faults).
    fn ready_sweep_runs(&mut self) {
        if !(self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0) {
            self.runs.append(&mut self.sweep_runs);
        }
    }

    /// VMA splits that marking `[start, end)` of region `id` adds: one on
    /// each side that falls inside its VMA.
    fn splits(&self, id: RegionId, start: u64, end: u64) -> u64 {
        self.books.get(&id).map_or(0, |b| {
            u64::from(b.span.vma_start < start) + u64::from(b.span.vma_end > end)
        })
    }

    /// Whether pagesift may inject into `pid` now.
    fn injectable(&self, pid: u32, now: Nanos) -> bool {
        let waiting = self
            .inject_skips
            .get(&pid)
            .is_some_and(|s| s.retry_at.is_some_and(|t| now < t));
        !self.self_managed.contains(&pid) && !waiting
    }

    /// The `MADV_MERGEABLE` calls for the runs of the last wake (see the
    /// module header, step 3), per process, within each process's
    /// VMA-split budget after the calls already in `batches`.
    fn run_items(&mut self, now: Nanos, batches: &BTreeMap<u32, Vec<Item>>) -> Vec<(u32, Item)> {
        let runs = std::mem::take(&mut self.runs);
        let min = self.config.actuate.run_min_pages;
        if min == 0 {
            return Vec::new();
        }
        let pad = self.config.actuate.run_pad_pages as u64;
        let align = RUN_ALIGN_PAGES * PAGE;
        // Both sides of every long enough run, as page ranges of regions.
        let mut sides: Vec<(RegionId, u64, u64, bool)> = Vec::new();
        for run in runs.iter().filter(|r| r.pages >= min || r.hinted) {
            sides.push((run.region, run.first as u64, run.end() as u64, run.hinted));
            if let Some(t) = run.twin {
                let end = t.page as u64 + run.pages as u64;
                sides.push((t.region, t.page as u64, end, run.hinted));
            }
        }
        // Padded, aligned, clamped address ranges of sampling regions.
        let mut ranges: BTreeMap<u32, Vec<(RegionId, u64, u64)>> = BTreeMap::new();
        for (id, first, end, hinted) in sides {
            let Some(b) = self.books.get(&id) else {
                continue;
            };
            let pid = b.span.proc.pid;
            let whole_now = batches
                .get(&pid)
                .is_some_and(|v| v.iter().any(|i| i.id == id && i.whole));
            // Hinted runs: held regions too, no write verdict (`hinting`).
            let mode = self.lives.mode(id);
            let held = matches!(mode, Some(Mode::Held { .. }));
            if !(mode == Some(Mode::Sampling) || (hinted && held))
                || whole_now
                || (!hinted && expected_short(&self.lifespans, &self.config, b, now))
                || !self.injectable(pid, now)
                || (!hinted
                    && write_verdict(
                        b,
                        dup_share(self.distiller.ladder(), id),
                        &self.config,
                        now,
                        held_since_cleared(&self.lives, id),
                    ) != WriteVerdict::Cold)
            {
                continue;
            }
            // A hinted run was followed page by page to where it ends (up
            // to HINT_RUN_EXTEND_PAGES a side): padding it would only hand
            // ksmd pages no hint named (guest page cache is scattered
            // through guest RAM, so most hinted runs are short).
            let pad = if hinted { 0 } else { pad };
            let s = (b.span.start + first.saturating_sub(pad) * PAGE) / align * align;
            let e = (b.span.start + (end + pad) * PAGE).div_ceil(align) * align;
            let (s, e) = (s.max(b.span.start), e.min(b.span.end()));
            if s < e && !self.marks.covers(b.span.proc, s, e) {
                if hinted {
                    self.hints.marked((e - s) / PAGE);
                }
                ranges.entry(pid).or_default().push((id, s, e));
            }
        }
        let limit = (self.target.max_map_count() as f64
            * self.config.actuate.max_map_count_fraction) as u64;
        let mut out = Vec::new();
        for (pid, mut rs) in ranges {
            // Join overlapping or touching ranges of one region.
            rs.sort_by_key(|&(id, s, _)| (id, s));
            let mut joined: Vec<(RegionId, u64, u64)> = Vec::with_capacity(rs.len());
            for (id, s, e) in rs {
                match joined.last_mut() {
                    Some(l) if l.0 == id && s <= l.2 => l.2 = l.2.max(e),
                    _ => joined.push((id, s, e)),
                }
            }
            // The split budget left after this wake's whole-region marks.
            let mut used = self
                .target
                .vma_count(pid)
                .unwrap_or(u64::MAX)
                .saturating_add(
                    batches
                        .get(&pid)
                        .into_iter()
                        .flatten()
                        .filter(|i| i.advice.mergeable)
                        .map(|i| self.splits(i.id, i.advice.start, i.advice.end()))
                        .sum(),
                );
            let mut taken = 0;
            for (id, s, e) in joined {
                let n = self.splits(id, s, e);
                if taken == MAX_RUN_MARKS_PER_WAKE || used.saturating_add(n) > limit {
                    debug!(
                        pid,
                        start = s,
                        len = e - s,
                        used,
                        limit,
                        "a duplicate run waits: VMA budget"
                    );
                    continue;
                }
                used += n;
                taken += 1;
                out.push((pid, Item::mark_part(id, s, e)));
            }
        }
        out
    }

    fn run_batch(&mut self, pid: u32, items: Vec<Item>, now: Nanos, summary: &mut WakeSummary) {
        let Some(&key) = self.allowed.get(&pid) else {
            return;
        };
        if !self.target.same_process(key) {
            // It exec'd (or exited) since the refresh: these ranges are the
            // old image's. Judge the new one at the next refresh.
            self.force_refresh = true;
            return;
        }
        let calls = coalesce(items.iter().map(|i| i.advice).collect());
        // VMA splits: a marked range that starts or ends inside its VMA.
        let splits_of = |c: &Advice| -> u64 {
            let first = items.iter().find(|i| i.advice.start == c.start);
            let last = items.iter().find(|i| i.advice.end() == c.end());
            let mut n = 0;
            if let Some(i) = first
                && self
                    .books
                    .get(&i.id)
                    .is_some_and(|b| b.span.vma_start < c.start)
            {
                n += 1;
            }
            if let Some(i) = last
                && self
                    .books
                    .get(&i.id)
                    .is_some_and(|b| b.span.vma_end > c.end())
            {
                n += 1;
            }
            n
        };
        let splits: Vec<u64> = calls
            .iter()
            .map(|c| if c.mergeable { splits_of(c) } else { 0 })
            .collect();
        let new_splits: u64 = splits.iter().sum();
        if new_splits > 0 {
            let limit = (self.target.max_map_count() as f64
                * self.config.actuate.max_map_count_fraction) as u64;
            let vmas = self.target.vma_count(pid).unwrap_or(u64::MAX);
            if vmas.saturating_add(new_splits) > limit {
                self.skip_injection(
                    pid,
                    format!(
                        "VMA budget: {vmas} VMAs, marking would add {new_splits}, limit {limit} \
                         (actuate.max_map_count_fraction of vm.max_map_count)"
                    ),
                    now,
                    SKIP_RETRY,
                );
                return;
            }
        }
        summary.batches += 1;
        self.counters.batches += 1;
        for c in &calls {
            debug!(
                pid,
                start = c.start,
                len = c.len,
                mergeable = c.mergeable,
                "madvise"
            );
        }
        let outcome = self.actuator.advise_as(key, &calls);
        self.force_refresh = true; // see the new flags and splits
        if let BatchOutcome::Done(results) = &outcome {
            for (c, r) in calls.iter().zip(results) {
                match r {
                    Ok(()) => self.target.note_advised(pid, c.start, c.end(), c.mergeable),
                    Err(_) => self.target.distrust_mergeable(pid),
                }
            }
        }
        match outcome {
            BatchOutcome::Done(results) => {
                self.inject_skips.remove(&pid);
                for ((call, res), split) in calls.iter().zip(results).zip(splits) {
                    let inside: Vec<Item> = items
                        .iter()
                        .filter(|i| {
                            i.advice.mergeable == call.mergeable
                                && i.advice.start >= call.start
                                && i.advice.end() <= call.end()
                        })
                        .copied()
                        .collect();
                    for i in inside.iter().filter(|i| !i.whole) {
                        if res.is_ok() {
                            self.counters.run_marks += 1;
                            self.pending_run_pages += i.advice.len / PAGE;
                            summary.run_marks.push((pid, i.advice));
                            info!(
                                pid,
                                start = i.advice.start,
                                pages = i.advice.len / PAGE,
                                "marked part of a region mergeable (a duplicate run, or around written zones)"
                            );
                        }
                    }
                    let covered: Vec<RegionId> =
                        inside.iter().filter(|i| i.whole).map(|i| i.id).collect();
                    match res {
                        Ok(()) if call.mergeable => {
                            self.marks.add(key, call.start, call.end());
                            self.counters.marks += 1;
                            self.counters.vma_splits += split;
                            for id in covered {
                                if let Some(b) = self.books.get_mut(&id) {
                                    // Out of the ladder until it settles.
                                    self.lives.mark(id, self.ksm_now.full_scans, now);
                                    if let Some(e) = b.expected_dups.take() {
                                        self.lives.expect(id, e);
                                        b.marked_dup = Some(
                                            (e as f64 / f64::from(b.span.pages.max(1))).min(1.0),
                                        );
                                    }
                                    summary.promoted.push(id);
                                    info!(
                                        pid,
                                        start = b.span.start,
                                        pages = b.span.pages,
                                        age_s = b.age_s(now),
                                        "promoted: marked mergeable"
                                    );
                                }
                            }
                        }
                        Ok(()) => {
                            self.marks.remove(key, call.start, call.end());
                            self.counters.unmarks += 1;
                            for id in covered {
                                if let Some(b) = self.books.get(&id) {
                                    // Out of the ladder while held (see
                                    // `release_holds`).
                                    let pass = self.lives[id].last_pass();
                                    self.lives.hold(id, now, self.config.actuate.demote_hold_s);
                                    summary.demoted.push(id);
                                    info!(
                                        pid,
                                        start = b.span.start,
                                        pages = b.span.pages,
                                        merged = pass.merged,
                                        cow = pass.cow,
                                        "demoted: thrashing, unmarked"
                                    );
                                }
                            }
                        }
                        Err(errno) => {
                            warn!(
                                pid,
                                start = call.start,
                                len = call.len,
                                errno,
                                mergeable = call.mergeable,
                                "madvise failed in the target"
                            );
                            for id in covered {
                                if self.books.contains_key(&id) && call.mergeable {
                                    self.lives.hold(id, now, self.config.actuate.demote_hold_s);
                                }
                            }
                        }
                    }
                }
            }
            BatchOutcome::Skipped(reason) => self.skip_injection(pid, reason, now, SKIP_RETRY),
            BatchOutcome::Busy(reason) => self.skip_injection(pid, reason, now, BUSY_RETRY),
            BatchOutcome::Gone => {}
            BatchOutcome::Failed(reason) => {
                warn!(pid, reason = %reason, "injection failed");
                self.skip_injection(pid, format!("injection failed: {reason}"), now, SKIP_RETRY);
            }
        }
    }

    fn skip_injection(&mut self, pid: u32, reason: String, now: Nanos, retry: Nanos) {
        let comm = self.comms.get(&pid).cloned().unwrap_or_default();
        if self
            .inject_skips
            .get(&pid)
            .is_none_or(|s| s.reason != reason)
        {
            info!(pid, comm = %printable(&comm), reason = %reason, "process skipped");
        }
        self.inject_skips.insert(
            pid,
            SkipEntry {
                comm,
                reason,
                retry_at: Some(now + retry),
            },
        );
    }

    /// Accounting (module header, step 4): the page states of promoted and
    /// foreign regions are read here, within the wake's budget, and counted
    /// by `lives` (`core::pipeline::lifecycle`: COW breaks, settling, the
    /// demotion rule).
    fn account(&mut self, now: Nanos) {
        self.check_unseen_breaks(now);
        self.probe_recurring();
        let dt = now.saturating_sub(self.last_account).min(SEC);
        self.last_account = now;
        let full_scans = self.ksm_now.full_scans;
        let merging = self.lives.prepare_passes(full_scans, now, SETTLE_SCANS);
        // While ksmd merges, accounting runs faster (up to 8×, within the
        // governor's top share at ≈2 % per base budget) so that progress
        // shows and settled regions hand ksmd back to the trickle sooner.
        let boost = if merging {
            (self.config.merge_share() / ACCOUNT_BASE_SHARE).clamp(1.0, 8.0)
        } else {
            1.0
        };
        let mut budget = (self.config.actuate.account_pages_per_s as f64 * boost * dt as f64
            / SEC as f64) as u64;
        let ids = self.lives.passes_due(now);
        if ids.is_empty() || budget == 0 {
            return;
        }
        let first = self
            .account_from
            .and_then(|from| ids.iter().position(|&id| id >= from))
            .unwrap_or(0);
        let rules = account_rules(&self.config);
        for k in 0..ids.len() {
            if budget == 0 {
                break;
            }
            let id = ids[(first + k) % ids.len()];
            self.account_from = Some(id);
            self.account_region(id, now, full_scans, &rules, &mut budget);
        }
    }

    /// Looks at the first [`PROBE_PAGES`] pages of each region raised on
    /// history and marked, while it merges, until one of them is merged:
    /// such a region is often unmapped before an accounting pass sees it merge, and a
    /// raised generation passes its place on only if merging was seen
    /// (`core::pipeline::recurrence`). ksmd walks a region in address
    /// order, so its first pages merge first. One pagemap and one
    /// kpageflags read of 64 entries a region and wake-up, for at most a
    /// region's short life.
    fn probe_recurring(&mut self) {
        let (books, lives, target, states) = (
            &mut self.books,
            &self.lives,
            &mut self.target,
            &mut self.states,
        );
        self.probing.retain(|&id| {
            let Some(b) = books.get_mut(&id) else {
                return false; // gone
            };
            // Not marked yet (a write watch first): wait. Once settled,
            // its accounting passes have counted it.
            match lives.get(id) {
                Some(l) if l.mode() == Mode::Sampling => return b.raised_on_history,
                Some(l) if l.mode() == Mode::Promoted && l.merging() => {}
                _ => return false,
            }
            if !b.raised_on_history || b.seen_merged {
                return false;
            }
            let n = (PROBE_PAGES as u32).min(b.span.pages) as usize;
            states.clear();
            states.resize(n, PageState::NotPresent);
            if target.page_states(id, 0, states).is_ok() {
                b.seen_merged = states.contains(&PageState::Merged);
            }
            !b.seen_merged
        });
    }

    /// Breaks the passes did not see (`core::pipeline::lifecycle`, "Breaks
    /// between settled passes"): about once a second, the kernel's
    /// machine-wide `cow_ksm` against the breaks pagesift's passes
    /// counted. When at least [`UNSEEN_BREAKS_MIN`] more happened than
    /// they found, every settled region is passed over again at once, or
    /// [`UNSEEN_BREAKS_GAP`] after its last pass.
    fn check_unseen_breaks(&mut self, now: Nanos) {
        if now < self.next_cow_look {
            return;
        }
        self.next_cow_look = now + SEC;
        let Some(cow) = self.target.cow_ksm() else {
            return;
        };
        let counted: u64 = self.lives.values().map(|l| l.cow_total()).sum();
        if let Some((cow0, counted0)) = self.cow_seen {
            // Regions forgotten since take their counts with them: the
            // count may fall, and then explains nothing.
            let unseen =
                (cow.saturating_sub(cow0)).saturating_sub(counted.saturating_sub(counted0));
            if unseen >= UNSEEN_BREAKS_MIN {
                let moved = self.lives.hasten_settled_passes(now, UNSEEN_BREAKS_GAP);
                self.counters.unseen_break_alarms += 1;
                debug!(
                    unseen,
                    regions = moved,
                    "COW breaks the passes did not see: settled regions passed over again"
                );
            }
        }
        self.cow_seen = Some((cow, counted));
    }

    /// One region's accounting from its cursor on, within `budget` pages
    /// (taken from it), to the end of its pass at most.
    fn account_region(
        &mut self,
        id: RegionId,
        now: Nanos,
        full_scans: u64,
        rules: &AccountRules,
        budget: &mut u64,
    ) {
        while let Some(life) = self.lives.get(id) {
            let n = (life.pages() - life.cursor())
                .min(ACCOUNT_CHUNK as u32)
                .min(*budget as u32) as usize;
            if n == 0 {
                break;
            }
            let from = life.cursor();
            self.states.clear();
            self.states.resize(n, PageState::NotPresent);
            match self.target.page_states(id, from, &mut self.states) {
                Ok(()) => {}
                Err(SourceError::Gone(_)) => {
                    self.force_refresh = true;
                    break;
                }
                Err(e) => {
                    debug!(region = id.0, error = %e, "accounting read failed");
                    self.force_refresh = true;
                    break;
                }
            }
            *budget -= n as u64;
            let Some(end) = self.lives.record(id, &self.states, now, full_scans, rules) else {
                continue;
            };
            // A pass ended. Settled: nothing present is left unmerged,
            // or ksmd has had its chances (see the module header); a
            // promoted region is back on the ladder, at the bottom.
            let life = &self.lives[id];
            if end.settled
                && let Some(b) = self.books.get(&id)
            {
                info!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    merged = life.last_pass().merged,
                    pages = b.span.pages,
                    seconds = now.saturating_sub(life.merging_since()) as f64 / SEC as f64,
                    "settled: ksmd has merged what it can"
                );
            }
            if end.demote {
                self.pending_unmarks.push(id);
            }
            break;
        }
    }

    fn pace(&mut self, now: Nanos) -> f64 {
        // Pages waiting for ksmd: those of unsettled regions that a full
        // scan covers (a region not yet counted through counts whole, so
        // that a fresh promotion gets the full pace; at least one page per
        // region; narrowed to those still expected to merge, or to an
        // eighth once it merges nothing new: see
        // `Lifecycle::waiting_pages`). The pacer weighs them against the
        // full scan below. Runs marked since the last refresh count too
        // (see `pending_run_pages`).
        let full_scans = self.ksm_now.full_scans;
        let unmerged: u64 = (self.lives.values())
            .map(|l| l.waiting_pages(full_scans))
            .sum::<u64>()
            + self.pending_run_pages;
        // And what one full scan of ksmd covers, as far as pagesift knows
        // (promoted and foreign regions; other processes' mergeable memory
        // is scanned too, unseen): the pacer spends no more than a few such
        // scans a second. A region not yet counted through counts whole,
        // so that a fresh promotion is never starved.
        let scan_pages: u64 = (self.lives.values())
            .filter(|l| l.accounted())
            .map(|l| l.scan_pages())
            .sum::<u64>()
            + self.pending_run_pages;
        // Reading KSM's counters and ksmd's CPU costs a dozen file reads:
        // once a second is enough (the pacer is built for that interval),
        // but a change between merging and trickling acts at once, and so
        // does a promotion that more than doubles what ksmd has to scan:
        // paced for the small set before it, ksmd would take up to a
        // second to start on it (measured under the short-lived profile:
        // a 64 MiB region promoted 150 ms before it was unmapped went
        // unmerged at 53 pages a batch).
        let merging = unmerged > 0;
        let grew = crate::ksmd::demand_jumped(scan_pages, self.paced_scan_pages);
        if now < self.next_pace && merging == self.merging && !grew {
            return self.pacing.share;
        }
        self.next_pace = now + PACE_INTERVAL;
        self.merging = merging;
        self.paced_scan_pages = scan_pages;
        match self.ksm.sample() {
            Ok(s) => {
                self.ksm_now = s;
                self.ksm_start.get_or_insert(s);
            }
            Err(e) => debug!(error = %e, "reading KSM counters failed"),
        }
        let target = self.config.merge_share();
        match self.ksm.pace(target, unmerged, scan_pages, now) {
            Ok(p) => {
                debug!(
                    target: "pagesift::pace",
                    unmerged,
                    scan_pages,
                    target,
                    share = p.share,
                    pages_to_scan = p.pages_to_scan,
                    sleep_ms = p.sleep_ms,
                    "ksmd paced"
                );
                self.pacing = p;
            }
            Err(e) => warn!(error = %e, "pacing ksmd failed"),
        }
        self.pacing.share
    }

    /// The status snapshot at `now`; also remembers the CPU window.
    pub fn status(&mut self, now: Nanos) -> Status {
        self.last_publish = Some(now);
        let cpu = host::process_cpu_ns();
        self.cpu_window
            .push_back((now, cpu, self.ksm_now.ksmd_cpu_ns));
        while self.cpu_window.len() > 2
            && self
                .cpu_window
                .front()
                .is_some_and(|&(t, _, _)| now - t > 5 * SEC)
        {
            self.cpu_window.pop_front();
        }
        let share = |i: usize| -> f64 {
            let (a, b) = (self.cpu_window.front(), self.cpu_window.back());
            match (a, b) {
                (Some(a), Some(b)) if b.0 > a.0 => {
                    let d = if i == 1 {
                        b.1.saturating_sub(a.1)
                    } else {
                        b.2.saturating_sub(a.2)
                    };
                    d as f64 / (b.0 - a.0) as f64
                }
                _ => 0.0,
            }
        };
        let ladder = self.distiller.ladder();
        let params = self.distiller.params();
        let lives = &self.lives;
        let region = |id: RegionId, b: &Book| -> RegionStatus {
            let stats = ladder.region_stats(id);
            let life = &lives[id];
            RegionStatus {
                id: id.0,
                pid: b.span.proc.pid,
                comm: self
                    .comms
                    .get(&b.span.proc.pid)
                    .cloned()
                    .unwrap_or_default(),
                start: b.span.start,
                pages: b.span.pages,
                name: b.span.name.clone(),
                level: stats.map(|s| s.level),
                state: match life.mode() {
                    Mode::Sampling => "sampling",
                    Mode::Promoted if life.settled() => "promoted",
                    Mode::Promoted => "merging",
                    Mode::Held { .. } => "held",
                    Mode::Foreign => "foreign",
                }
                .into(),
                merged_pages: life.merged_now(),
                cow_breaks: life.cow_total(),
                age_s: b.age_s(now),
                dup_ratio: stats.map_or(0.0, |s| s.last_dup_ratio),
            }
        };
        let mut levels: Vec<LevelStatus> = (0..ladder.levels())
            .map(|l| LevelStatus {
                level: l,
                cpu_share: params.levels.get(l).map_or(0.0, |p| p.cpu_share),
                round_time_ms: params.levels.get(l).map_or(0, |p| p.round_time / MS),
                region_count: 0,
                pages: ladder.level_pages(l),
                regions: Vec::new(),
            })
            .collect();
        for l in 0..ladder.levels() {
            let ids = ladder.regions_at(l);
            levels[l].region_count = ids.len() as u64;
            let mut rs: Vec<RegionStatus> = ids
                .iter()
                .filter_map(|id| self.books.get(id).map(|b| region(*id, b)))
                .collect();
            rs.sort_by(|a, b| b.pages.cmp(&a.pages).then(a.id.cmp(&b.id)));
            rs.truncate(MAX_LISTED);
            levels[l].regions = rs;
        }
        let mut top: Vec<RegionStatus> = self
            .books
            .iter()
            .filter(|(id, _)| lives[**id].merged_now() > 0)
            .map(|(id, b)| region(*id, b))
            .collect();
        top.sort_by(|a, b| b.merged_pages.cmp(&a.merged_pages).then(a.id.cmp(&b.id)));
        top.truncate(20);
        let mut held: Vec<RegionStatus> = self
            .books
            .iter()
            .filter(|(id, _)| lives[**id].held())
            .map(|(id, b)| region(*id, b))
            .collect();
        held.sort_by(|a, b| b.pages.cmp(&a.pages).then(a.id.cmp(&b.id)));
        held.truncate(MAX_LISTED);
        let count = |f: &dyn Fn(&pagesift_core::pipeline::lifecycle::Lifecycle) -> bool| {
            lives.values().filter(|l| f(l)).count() as u64
        };
        let totals = Totals {
            processes: self.allowed.len() as u64,
            regions: self.books.len() as u64,
            promoted_regions: count(&|l| l.mode() == Mode::Promoted),
            promoted_pages: self
                .books
                .iter()
                .filter(|(id, _)| lives[**id].mode() == Mode::Promoted)
                .map(|(_, b)| b.span.pages as u64)
                .sum(),
            merging_regions: count(&|l| l.mode() == Mode::Promoted && !l.settled()),
            held_regions: count(&|l| l.held()),
            foreign_regions: count(&|l| l.mode() == Mode::Foreign),
            marked_bytes: self.marks.bytes(),
            merged_pages: lives.values().map(|l| l.merged_now()).sum(),
            cow_breaks: lives.values().map(|l| l.cow_total()).sum(),
            marks: self.counters.marks,
            unmarks: self.counters.unmarks,
            batches: self.counters.batches,
            vma_splits: self.counters.vma_splits,
            regions_left_out: self.target.regions_left_out() as u64,
            run_marks: self.counters.run_marks,
            partial_marks: self.counters.partial_marks,
            remerges: self.counters.remerges,
            unseen_break_alarms: self.counters.unseen_break_alarms,
            raised_on_history: self.counters.raised_on_history,
            write_tracked_ranges: self.tracked as u64,
            sampled_pages: self.counters.sampled,
            wakes: self.counters.wakes,
            global_rounds: self.distiller.global_rounds(),
        };
        let start = self.ksm_start.unwrap_or_default();
        let ksm = KsmStatus {
            pages_shared: self.ksm_now.pages_shared,
            pages_sharing: self.ksm_now.pages_sharing,
            full_scans: self.ksm_now.full_scans,
            cpu_share: share(2),
            cpu_seconds: self.ksm_now.ksmd_cpu_ns.saturating_sub(start.ksmd_cpu_ns) as f64 / 1e9,
            target_share: self.pacing.share,
            pages_to_scan: self.pacing.pages_to_scan,
            sleep_ms: self.pacing.sleep_ms,
            // The last look's, at most a second old (a read of
            // /proc/vmstat costs about 30 µs).
            cow_ksm: match (
                self.cow_seen
                    .map(|(c, _)| c)
                    .or_else(|| self.target.cow_ksm()),
                self.cow_ksm_start,
            ) {
                (Some(n), Some(s)) => Some(n.saturating_sub(s)),
                _ => None,
            },
        };
        let daemon = DaemonStatus {
            pid: std::process::id(),
            uptime_s: now.saturating_sub(self.started) as f64 / SEC as f64,
            cpu_share: share(1),
            cpu_seconds: cpu.saturating_sub(self.cpu_start_ns) as f64 / 1e9,
            per_page_ns: self.distiller.per_page_ns(),
            strength: self.distiller.controller().strength(),
            config: self.config_path.as_ref().map(|p| p.display().to_string()),
            sweep: self.sweeper.stats,
            cpu_by_phase: self.phase_cpu.seconds(),
        };
        let mut skipped: Vec<Skipped> = self
            .skipped
            .iter()
            .chain(&self.inject_skips)
            .map(|(pid, s)| Skipped {
                pid: *pid,
                comm: s.comm.clone(),
                reason: s.reason.clone(),
            })
            .collect();
        for pid in &self.self_managed {
            skipped.push(Skipped {
                pid: *pid,
                comm: self.comms.get(pid).cloned().unwrap_or_default(),
                reason: "uses KSM itself (ksm_merge_any): its settings are left as they are".into(),
            });
        }
        skipped.sort_by_key(|s| s.pid);
        let savings = self.savings();
        Status {
            governor: self.config.governor.name().into(),
            levels,
            top_regions: top,
            held_regions: held,
            totals,
            ksm,
            daemon,
            skipped,
            hints: self.hints.status(),
            scrub: self.scrub.as_ref().map(|s| s.status()),
            numa: self.numa.as_ref().map(|n| n.status()),
            savings,
        }
    }

    /// What each eligible process saves, grouped by cgroup and bounded by
    /// `[savings]` (`core::pipeline::savings`). Merged pages and bytes saved are the
    /// kernel's (`/proc/PID/ksm_stat`), read only for processes with
    /// memory KSM may merge (promoted or foreign regions: nothing else of
    /// theirs can be merged); where it cannot be read, the regions' last
    /// accounting passes stand in, a page saved per page merged. COW
    /// breaks are the loop's own count per region.
    fn savings(&self) -> Breakdown {
        #[derive(Default)]
        struct Regions {
            merged: u64,
            cow: u64,
            mergeable: bool,
        }
        let mut per_pid: BTreeMap<u32, Regions> = self
            .allowed
            .keys()
            .map(|&pid| (pid, Regions::default()))
            .collect();
        for (id, b) in &self.books {
            let life = &self.lives[*id];
            if let Some(r) = per_pid.get_mut(&b.span.proc.pid) {
                r.merged += life.merged_now();
                r.cow += life.cow_total();
                r.mergeable |= life.accounted();
            }
        }
        let processes: Vec<ProcessSavings> = per_pid
            .into_iter()
            .map(|(pid, r)| {
                let kernel = r.mergeable.then(|| self.target.ksm_stat(pid)).flatten();
                let merged = kernel.and_then(|k| k.merging_pages).map_or(r.merged, |m| {
                    m + kernel.and_then(|k| k.zero_pages).unwrap_or(0)
                });
                let saved = kernel
                    .and_then(|k| k.process_profit)
                    .unwrap_or((merged * PAGE) as i64);
                ProcessSavings {
                    pid,
                    comm: self.comms.get(&pid).cloned().unwrap_or_default(),
                    cgroup: self.cgroups.get(&pid).cloned().unwrap_or_default(),
                    savings: Savings {
                        merged_pages: merged,
                        saved_bytes: saved,
                        cow_breaks: r.cow,
                    },
                }
            })
            .collect();
        breakdown(&processes, self.config.savings.limits())
    }
}

/// The rules of the write verdict under `config` (see
/// `core::pipeline::write_watch`): a pass is `actuate.recheck_s`, the floor the one
/// accounting uses to unmark; a watch that the estimate would hold waits
/// up to two sweep spacings for the sweep's duplicate map (none without a
/// sweep).
fn write_rules(config: &Config) -> WriteRules {
    let sweeping = config.scan.sweep_share > 0.0;
    WriteRules {
        watch_min: WRITE_WATCH_MIN,
        pass: config.actuate.recheck_s * SEC,
        min_breaks: MIN_BREAKS_FOR_DEMOTION,
        align: RUN_ALIGN_PAGES as u32,
        v_cow: config.ladder.v_cow,
        await_map: if sweeping {
            2 * config.scan.sweep_every_s * SEC
        } else {
            0
        },
        ..WriteRules::default()
    }
}

/// Whether a region's watched writes would make it thrash once merged, and
/// where (`core::pipeline::write_watch`). V_cow = 100 % (writes cannot stop
/// a promotion): cold. Not watched: cold, unless it was held (for its
/// writes, or unmarked for thrashing) since a watch last found it cold
/// (`held_since_cleared`) and writes are watched: then only a watch can
/// clear it again, so it waits for one. A region released from
/// its hold re-enters at the bottom, where nothing is watched, yet sampling
/// there still follows duplicate runs in it: in `pagesift bench --only
/// short-lived` (2026-11-27, daemon log read by hand) a heap held for hot
/// writes had a sampled run marked about 7 s later, its writes unseen.
fn write_verdict(
    b: &Book,
    dup: f64,
    config: &Config,
    now: Nanos,
    held_since_cleared: bool,
) -> WriteVerdict {
    let watching = config.actuate.write_tracking && config.ladder.v_cow < 1.0;
    match &b.watch {
        Some(w) if config.ladder.v_cow < 1.0 => w.verdict(dup, now, &write_rules(config)),
        None if watching && held_since_cleared => WriteVerdict::Watching,
        _ => WriteVerdict::Cold,
    }
}

/// How a region's life ended, for the recurrence rule: `marked` whole by
/// pagesift when it went, with `life` its lifecycle then.
fn ending_of(b: &Book, life: Option<&Lifecycle>, marked: bool) -> Ending {
    match (life, b.marked_dup) {
        (Some(l), Some(dup)) if marked => Ending::Marked {
            dup,
            raised: b.raised_on_history,
            merged: b.seen_merged || l.merged_now() > 0,
        },
        _ => Ending::Unmarked,
    }
}

/// Whether `b` is expected to be unmapped before ksmd could merge it, its
/// process's large regions having died young (`core::pipeline::lifespan`),
/// and the config says to wait.
fn expected_short(lifespans: &Lifespans<ProcKey>, config: &Config, b: &Book, now: Nanos) -> bool {
    config.actuate.skip_short_lived
        && lifespans.expected_short(b.span.proc, b.span.pages, b.first_seen, now)
}

/// Whether `id` was held since a watch last judged it cold
/// (`Lifecycle::held_since_cleared`).
fn held_since_cleared(lives: &Lifecycles, id: RegionId) -> bool {
    lives.get(id).is_some_and(|l| l.held_since_cleared())
}

/// Whether sampling's duplicate share `dup` (of a region of `pages`
/// pages) exceeds, by [`ZONE_CONTRADICTION`] or more, the share of the
/// region outside its unique zones `unique`: the samples found duplicates
/// where the sweep saw none. The sweep cannot see the twins that are
/// merged pages (it reads no KSM page, and settled regions are not in
/// its full epochs), which the sampler's stable index holds: in `pagesift
/// bench --quick --only files` without hints (2026-11-27, daemon log read
/// by hand), the readers whose file data ksmd had merged before the first
/// epoch left the fourth reader's copy without a twin, all of it a unique
/// zone, and its region was held instead of marked (36.5 of 48 MiB saved
/// at the end of the 30 s window). A region the sweep raised carries the
/// sweep's own ratio, which never exceeds the share outside its zones.
fn zones_contradicted(unique: &[(u32, u32)], pages: u32, dup: f64) -> bool {
    if unique.is_empty() || pages == 0 {
        return false;
    }
    let inside: u64 = unique.iter().map(|&(s, e)| u64::from(e - s)).sum();
    let outside = 1.0 - inside as f64 / f64::from(pages);
    dup >= outside + ZONE_CONTRADICTION
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

/// The rules of accounting passes under `config`
/// (`core::pipeline::lifecycle`): settled after [`SETTLE_SCANS`] ksmd full
/// scans; merging regions passed over about once a second, settled ones
/// every `actuate.recheck_s`; unmarked above V_cow with at least
/// [`MIN_BREAKS_FOR_DEMOTION`] breaks.
fn account_rules(config: &Config) -> AccountRules {
    AccountRules {
        settle_scans: SETTLE_SCANS,
        merging_every: SEC,
        settled_every: config.actuate.recheck_s.saturating_mul(SEC),
        v_cow: config.ladder.v_cow,
        min_merged: config.actuate.min_merged_for_demotion,
        min_breaks: MIN_BREAKS_FOR_DEMOTION,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_are_joined_sorted_and_disjoint() {
        let written = vec![(0, 16), (100, 200)];
        let unique = vec![(16, 48), (150, 400), (500, 600)];
        assert_eq!(
            join_zones(&written, &unique),
            vec![(0, 48), (100, 400), (500, 600)]
        );
        assert_eq!(join_zones(&[], &[(3, 9)]), vec![(3, 9)]);
    }

    fn span_of(pid: u32, vma: (u64, u64), start: u64, pages: u32) -> Span {
        Span {
            proc: ProcKey {
                pid,
                start_time: 0,
                image: 0,
            },
            start,
            pages,
            vma_start: vma.0,
            vma_end: vma.1,
            mergeable: false,
            name: None,
        }
    }

    #[test]
    fn a_piece_split_off_a_known_region_is_as_old_as_it() {
        let vma = (1 << 30, (1 << 30) + 4096 * PAGE);
        let books = [
            Book::new(span_of(7, vma, vma.0, 2048), 5 * SEC),
            Book::new(span_of(7, vma, vma.0 + 2048 * PAGE, 2048), 9 * SEC),
            Book::new(span_of(8, vma, vma.0, 4096), SEC),
        ];
        let known = KnownSpans::of(books.iter());
        // A mark split pages 100..116 off: the rest after it is a VMA of
        // its own inside the old one, overlapping both old regions.
        let rest = (vma.0 + 116 * PAGE, vma.1);
        assert_eq!(
            known.known_since(&span_of(7, rest, rest.0, 3980)),
            Some(5 * SEC)
        );
        let tail = (vma.0 + 3000 * PAGE, vma.1);
        assert_eq!(
            known.known_since(&span_of(7, tail, tail.0, 1096)),
            Some(9 * SEC)
        );
        // Another process, a larger mapping, or a mapping elsewhere: new.
        assert_eq!(known.known_since(&span_of(9, rest, rest.0, 3980)), None);
        let larger = (vma.0, vma.1 + PAGE);
        assert_eq!(known.known_since(&span_of(7, larger, vma.0, 4097)), None);
        let elsewhere = (vma.1, vma.1 + 64 * PAGE);
        assert_eq!(
            known.known_since(&span_of(7, elsewhere, elsewhere.0, 64)),
            None
        );
    }

    #[test]
    fn unique_zones_shrink_to_whole_runs_and_go_stale() {
        let span = Span {
            proc: ProcKey {
                pid: 1,
                start_time: 0,
                image: 0,
            },
            start: 0,
            pages: 1024,
            vma_start: 0,
            vma_end: 1024 * PAGE,
            mergeable: false,
            name: None,
        };
        let mut b = Book::new(span, 0);
        b.unique = vec![(5, 300), (400, 410)];
        b.unique_at = SEC;
        // Inwards to multiples of 16; a zone that shrinks away is dropped.
        assert_eq!(b.fresh_unique(2 * SEC), vec![(16, 288)]);
        assert!(b.fresh_unique(SEC + UNIQUE_ZONES_FRESH + 1).is_empty());
        b.resized();
        assert!(b.fresh_unique(2 * SEC).is_empty());
    }

    #[test]
    fn zones_are_contradicted_only_by_more_duplicates_than_room_outside_them() {
        // No zones: nothing to contradict.
        assert!(!zones_contradicted(&[], 1024, 1.0));
        // Zones over the whole region: any duplicate share of 5 % or more.
        assert!(zones_contradicted(&[(0, 1024)], 1024, 0.1));
        assert!(!zones_contradicted(&[(0, 1024)], 1024, 0.04));
        // Half the region in zones: sampling's 50 % fits beside them, 60 % not.
        let half = [(0, 256), (512, 768)];
        assert!(!zones_contradicted(&half, 1024, 0.5));
        assert!(zones_contradicted(&half, 1024, 0.6));
    }
}
