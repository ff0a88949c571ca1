//! Pacing ksmd: turning a CPU share into `pages_to_scan` and
//! `sleep_millisecs`, in a closed loop on ksmd's measured CPU time.
//!
//! ## The model
//!
//! ksmd alternates between a batch and a sleep (`ksm_scan_thread` in
//! `mm/ksm.c`): it
//! scans `pages_to_scan` pages (`P`), costing `P·c + o` of CPU (`c` per
//! page, `o` per wake-up), then sleeps `sleep_millisecs` (`S`, which the
//! kernel rounds up to whole jiffies). Its CPU share, as a fraction of one
//! core, is therefore
//!
//! ```text
//! m = (P·c + o) / (P·c + o + S_eff)
//! ```
//!
//! the same active/sleep equation as the governor's pages per wake-up
//! (UKSM §5.3, see [`crate::pipeline::governor`]). For a target share `s` and a
//! known cost this gives `P = S · s / ((1 − s) · c)`.
//!
//! ## Why a closed loop
//!
//! The cost per page is not a constant. Measured on this machine (its 6.18
//! kernel, KSM alone on synthetic workloads): 0.7–1.0 µs for a
//! checksum-only first visit in batches of ≥ 1000 pages and 1.5–1.7 µs in
//! batches of 100; about 3 µs per merge (a merge phase: 223,092 pages/s at
//! 67.7 % CPU), but 26–31 µs when a thread of the target runs on another
//! CPU, as a guest's vCPU does, because each merge's TLB flush is then an
//! IPI (docs/benchmarks.md, section `merge-cost`); 5–10 µs to insert a
//! random page into the unstable tree
//! (from the second pass: 31,339 pages/s at 29.7 %); and about 100 µs per
//! page once every KSM page of a stable chain is full. A fixed model would be off by up to two
//! orders of magnitude, so the pacer *measures* instead.
//!
//! ## The algorithm
//!
//! 1. **Seed.** The effective cost starts at [`PacingConfig::seed_cost_ns`],
//!    3 µs: the merge-phase cost above, the geometric middle of the
//!    0.7–10 µs range, so the first tick is at most ~3.5× off either way.
//! 2. **Measure.** Each tick the caller passes ksmd's CPU time and the wall
//!    time since the previous tick, which ran under the pace in force. The
//!    measured share `m` is inverted through the model into the cost that
//!    explains it: `ĉ = m/(1 − m) · S / P`, that is the CPU time over the
//!    number of batches, counted as the time ksmd slept divided by `S`.
//!    The time ksmd waited for a CPU, runnable but not running (its
//!    `schedstat` run delay, passed in the tick), is not sleep and is left
//!    out: `ĉ = cpu · S / ((wall − cpu − wait) · P)`. Counting it as sleep
//!    made a starved ksmd look cheap. With three TCG guests keeping both
//!    cores busy (the vm-boot experiment, a by-hand run on 2026-11-28),
//!    ksmd waited 70–98 % of the wall time under pagesift and under the
//!    kernel's own pace alike, and the loop raised `pages_to_scan` to
//!    2 000–5 000 pages: every time the scheduler let ksmd run it ran that
//!    much longer, for a share it never reached (an integral wind-up; the
//!    unit test `a_ksmd_starved_of_cpu_keeps_the_batch_its_cost_gives`
//!    shows the same wind-up in simulation). How much ksmd waits varies
//!    from machine to machine: in the same experiment on 2026-12-01 (the
//!    pace log of two runs, by hand, 61 one-second ticks each) the median
//!    tick's wait was under 1 %, nine ticks in ten waited at most 11 %,
//!    and the worst 59–64 %. With the wait left out, a starved ksmd keeps
//!    the batch its real cost gives, and the share the scheduler denies it
//!    is not chased. This *effective* cost absorbs
//!    everything the model leaves out: the per-wake-up cost `o` and the
//!    jiffy rounding of the sleep are folded into it. At the fixed point the
//!    measured share is therefore exactly the target: if `P` solves the
//!    model for the estimate `ĉ` and `ĉ` is what the measurement gives
//!    back, then `m = s`. The iteration converges because `o/(P·c + o) < 1`
//!    (a contraction).
//! 3. **Smooth and limit.** The estimate moves towards `ĉ` by a weight
//!    ([`PacingConfig::smoothing`]) in the log domain, and by at most a
//!    factor per tick: the cost may rise fast ([`PacingConfig::max_cut`],
//!    which cuts `P` quickly when ksmd overshoots and burns CPU other tasks
//!    wanted) but falls slowly ([`PacingConfig::max_raise`], so a quiet
//!    tick, e.g. ksmd momentarily short of work, does not open the
//!    throttle all at once). This is an integral controller on the log of
//!    the share error, with clamped steps.
//! 4. **Solve.** `P` is solved with the preferred sleep
//!    ([`PacingConfig::active_sleep_ms`], KSM's default 20 ms). When `P`
//!    would leave `[min_pages, max_pages]` the sleep moves instead, by
//!    powers of two (so it stays a whole number of jiffies and the kernel's
//!    rounding cannot set up a limit cycle), within
//!    `[min_sleep_ms, max_sleep_ms]`; beyond both bounds the share is
//!    simply not reachable and the output stays at the bound. Outputs never
//!    leave the configured bounds.
//! 5. **Enough, not more.** While promoted memory is unmerged, the daemon
//!    needs ksmd to pass over every mergeable page a few times (a page is
//!    merged on its second visit, and a region counts as settled after
//!    three full scans, see the daemon's module header), not to spin: the
//!    governor's share is an upper bound. When the daemon says how many
//!    pages one full scan covers ([`PacingDemand::scan_pages`]), the active
//!    share is capped at what [`PacingConfig::active_scans_per_s`] full
//!    scans a second cost at the estimated cost per page, in proportion
//!    to the share of the scan that waits to be merged below
//!    [`PacingConfig::full_pace_unmerged`] (half): every page marked
//!    makes ksmd pass over everything merged before it twice, so a small
//!    run beside a large merged set is worth fewer scans a second than a
//!    fresh promotion; a small set
//!    gets [`PacingConfig::quick_scans_per_s`] (eight) as long as they cost
//!    at most [`PacingConfig::quick_pages_per_s`] pages a second (a small
//!    set is cheap to re-scan and should merge at once; a set under
//!    [`PacingConfig::quick_min_pages`], 1 MiB, is not worth it and gets
//!    the active rate), and that rate too
//!    is weighed by the share that waits: a quick rate paid in full for a
//!    few waiting pages kept ksmd at the kernel's own pages_to_scan 1000
//!    pace through most of a vm-boot window (three booting guests, the
//!    daemon's `pagesift::pace` log of one run on 2026-11-26: 1 000–1 800
//!    pages every 20 ms while 2 to 10 000 of 45 000 pages waited), as
//!    costly as KSM scanning everything. A small run
//!    marked beside a large merged region thus no longer sends ksmd
//!    re-scanning that region at 95 % of a core for the second or two it
//!    takes to settle; a large promotion still gets the whole share.
//! 6. **Trickle.** When nothing promoted is left unmerged, ksmd only needs
//!    to notice COW breaks and other processes' KSM memory, so the pacer
//!    switches to a trickle: the same loop with the target
//!    [`PacingConfig::trickle_share`] (0.1 %, half of UKSM's bottom level,
//!    §7), a long sleep and at most [`PacingConfig::trickle_max_pages`]
//!    per batch. The trickle keeps its own cost estimate, because 100-page
//!    batches once a second amortise the wake-up differently (1.5–1.7 µs a
//!    page in batches of 100 against 0.7–1.0 µs in batches of ≥ 1000).
//!
//! Time is passed in ([`Nanos`]); the module reads no clock and no file.

use crate::Nanos;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Bounds and tuning of the pacer. [`Default`] holds the values justified
/// in the module header.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct PacingConfig {
    /// Fewest pages per batch the pacer ever asks for (≥ 1).
    pub min_pages: u32,
    /// Most pages per batch the pacer ever asks for.
    pub max_pages: u32,
    /// Shortest sleep between batches, ms (≥ 1).
    pub min_sleep_ms: u32,
    /// Longest sleep between batches, ms.
    pub max_sleep_ms: u32,
    /// Preferred sleep while promoted memory is unmerged, ms.
    pub active_sleep_ms: u32,
    /// ksmd's CPU share (fraction of one core) while nothing promoted is
    /// unmerged.
    pub trickle_share: f64,
    /// Preferred sleep of the trickle, ms.
    pub trickle_sleep_ms: u32,
    /// Most pages per batch of the trickle.
    pub trickle_max_pages: u32,
    /// Highest share the pacer aims at, whatever it is asked (ksmd is one
    /// thread; at 100 % it would never sleep).
    pub max_share: f64,
    /// Full scans per second that the active share is capped at, when the
    /// demand says how many pages a full scan covers (0: no cap).
    pub active_scans_per_s: f64,
    /// Share of a full scan that, waiting to be merged, earns the whole
    /// [`active_scans_per_s`](Self::active_scans_per_s); less earns
    /// proportionally fewer scans a second (never below the quick rate),
    /// in (0, 1].
    pub full_pace_unmerged: f64,
    /// Full scans per second of a small promoted set: as many as cost at
    /// most [`quick_pages_per_s`](Self::quick_pages_per_s) pages a second
    /// (a small set is cheap to re-scan, and merges at once).
    pub quick_scans_per_s: f64,
    /// The page rate up to which a set gets
    /// [`quick_scans_per_s`](Self::quick_scans_per_s); the cap never falls
    /// below it for a larger set.
    pub quick_pages_per_s: f64,
    /// Smallest set (pages of a full scan) that gets the quick rate; a
    /// smaller one gets [`active_scans_per_s`](Self::active_scans_per_s).
    pub quick_min_pages: u64,
    /// Initial effective cost per scanned page, ns.
    pub seed_cost_ns: f64,
    /// Weight of a new measurement in the (log-domain) cost estimate, in
    /// (0, 1].
    pub smoothing: f64,
    /// Largest factor by which one tick may lower the cost estimate (and so
    /// raise pages per batch), > 1.
    pub max_raise: f64,
    /// Largest factor by which one tick may raise the cost estimate (and so
    /// cut pages per batch), > 1.
    pub max_cut: f64,
    /// ksmd CPU time below which a tick carries no information (ksmd had
    /// nothing to scan, or the tick was too short), ns.
    pub min_measured_cpu_ns: u64,
}

impl Default for PacingConfig {
    fn default() -> Self {
        PacingConfig {
            min_pages: 10,
            max_pages: 100_000,
            min_sleep_ms: 10,
            max_sleep_ms: 5_000,
            // KSM's own default `sleep_millisecs` (20).
            active_sleep_ms: 20,
            // Half of UKSM's bottom level (0.2 %, governor table, §7): the
            // daemon's own idle sampling gets the other half of the 0.2 %
            // idle aim.
            trickle_share: 0.001,
            trickle_sleep_ms: 1_000,
            // KSM's default batch (`pages_to_scan` 100), once a second.
            trickle_max_pages: 100,
            // UKSM's full governor caps at 95 % (governor table, §7).
            max_share: 0.95,
            // pagesift's choice: a page merges on ksmd's second visit and
            // three full scans settle a region, so two scans a second
            // settle a marked region in 1.5 s. Four (the earlier default)
            // bought little: in the quick vm-boot experiment (three
            // booting guests, one run each, this project's 2-core Xeon)
            // ksmd scanned 2.84 M pages at 4.16 CPU-s with four
            // (2026-11-24), 2.46 M at 3.39 CPU-s with two (2026-11-25),
            // saving 278 and 267 MiB; with one it saved only 224 MiB
            // (2.36 CPU-s, 2026-11-25): marked regions waited.
            active_scans_per_s: 2.0,
            // pagesift's choice: a set at least half unmerged is a fresh
            // promotion and gets the full rate. A few small runs marked
            // beside hundreds of MiB already merged get a rate in
            // proportion: in the quick vm-boot experiment (2026-11-25),
            // ksmd went on at about 1800 pages a batch for the last 12 s
            // of the window, for 10 MiB more, because each new run restarts
            // the two scans a second over everything merged before.
            full_pace_unmerged: 0.5,
            // Small sets as before the cap fell to two scans: with two
            // alone, 4 readers' 12 k pages of freshly read file data (the
            // files experiment) merged to 90 % at 1.77 s instead of 0.99 s.
            // A flat floor of 50 000 pages a second instead sent ksmd over
            // a guest's few thousand page-cache pages that COW breaks keep
            // unsettled (the page-cache experiment) at 2.5 CPU-s, against
            // 1.0 with four scans. Eight (capped at the same page rate)
            // merge the file data guests read (the guest-files
            // experiment: 3 guests, 12 k pages marked run by run as the
            // hints arrive) to 50 % at 0.99 s instead of 1.36 s (one run
            // each by hand, 2026-11-27, AMD EPYC, 2 cores); the bench's
            // `--repeat 3` with eight: 0.88-1.05 s (08:03 UTC,
            // docs/bench/guest-files). The page-cache experiment's ksmd
            // took 1.36 CPU-s with eight (07:24 UTC, docs/bench/page-cache).
            quick_scans_per_s: 8.0,
            // KSM's pace at pages_to_scan 1000 (1000 pages every 20 ms).
            quick_pages_per_s: 50_000.0,
            // pagesift's choice, 1 MiB (the lifespan rule's smallest
            // region): a set smaller than that saves less than eight
            // scans a second cost. Under the defaults, short-lived at
            // T = 0.5 s had a 122-page heap run and a 68-page arena marked;
            // ksmd spent 0.02 CPU-s on them in the 8 s window (the quick
            // run on 96db82d, 2026-11-28, report in commit 15b5710; which
            // regions, from its daemon log), half of the 0.5 % goal, for
            // 63 pages merged.
            quick_min_pages: 256,
            // Measured: 223,092 merges/s at 67.7 % CPU ≈ 3.0 µs (module header).
            seed_cost_ns: 3_000.0,
            smoothing: 0.8,
            max_raise: 2.0,
            max_cut: 8.0,
            min_measured_cpu_ns: 50_000,
        }
    }
}

/// A configuration the pacer refuses, naming the field and the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PacingConfigError {
    /// The offending field.
    pub field: &'static str,
    /// Why it is refused.
    pub reason: String,
}

impl fmt::Display for PacingConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "pacing.{}: {}", self.field, self.reason)
    }
}

impl std::error::Error for PacingConfigError {}

impl PacingConfig {
    /// Checks the bounds are consistent and the tuning values in range.
    pub fn validate(&self) -> Result<(), PacingConfigError> {
        let err = |field, reason: String| Err(PacingConfigError { field, reason });
        if self.min_pages == 0 {
            return err("min_pages", "must be at least 1".into());
        }
        if self.max_pages < self.min_pages {
            return err(
                "max_pages",
                format!("{} is below min_pages {}", self.max_pages, self.min_pages),
            );
        }
        if self.min_sleep_ms == 0 {
            return err("min_sleep_ms", "must be at least 1".into());
        }
        if self.max_sleep_ms < self.min_sleep_ms {
            return err(
                "max_sleep_ms",
                format!(
                    "{} is below min_sleep_ms {}",
                    self.max_sleep_ms, self.min_sleep_ms
                ),
            );
        }
        for (field, v) in [
            ("active_sleep_ms", self.active_sleep_ms),
            ("trickle_sleep_ms", self.trickle_sleep_ms),
        ] {
            if !(self.min_sleep_ms..=self.max_sleep_ms).contains(&v) {
                return err(
                    field,
                    format!(
                        "{v} is outside [min_sleep_ms, max_sleep_ms] = [{}, {}]",
                        self.min_sleep_ms, self.max_sleep_ms
                    ),
                );
            }
        }
        if !(self.min_pages..=self.max_pages).contains(&self.trickle_max_pages) {
            return err(
                "trickle_max_pages",
                format!(
                    "{} is outside [min_pages, max_pages] = [{}, {}]",
                    self.trickle_max_pages, self.min_pages, self.max_pages
                ),
            );
        }
        if !(self.max_share > 0.0 && self.max_share < 1.0) {
            return err("max_share", format!("{} is not in (0, 1)", self.max_share));
        }
        if !(self.trickle_share > 0.0 && self.trickle_share <= self.max_share) {
            return err(
                "trickle_share",
                format!("{} is not in (0, max_share]", self.trickle_share),
            );
        }
        for (key, v) in [
            ("quick_scans_per_s", self.quick_scans_per_s),
            ("quick_pages_per_s", self.quick_pages_per_s),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return err(key, format!("{v} is not a number ≥ 0"));
            }
        }
        if !(self.full_pace_unmerged > 0.0 && self.full_pace_unmerged <= 1.0) {
            return err(
                "full_pace_unmerged",
                format!("{} is not in (0, 1]", self.full_pace_unmerged),
            );
        }
        if !(self.active_scans_per_s.is_finite() && self.active_scans_per_s >= 0.0) {
            return err(
                "active_scans_per_s",
                format!("{} is not a number ≥ 0", self.active_scans_per_s),
            );
        }
        if !(self.seed_cost_ns.is_finite() && self.seed_cost_ns > 0.0) {
            return err(
                "seed_cost_ns",
                format!("{} is not a positive number", self.seed_cost_ns),
            );
        }
        if !(self.smoothing > 0.0 && self.smoothing <= 1.0) {
            return err("smoothing", format!("{} is not in (0, 1]", self.smoothing));
        }
        for (field, v) in [("max_raise", self.max_raise), ("max_cut", self.max_cut)] {
            if !(v.is_finite() && v > 1.0) {
                return err(field, format!("{v} is not a finite number above 1"));
            }
        }
        Ok(())
    }
}

/// What ksmd is told: the two sysfs knobs the pacer owns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KsmdPace {
    /// `/sys/kernel/mm/ksm/pages_to_scan`.
    pub pages_to_scan: u32,
    /// `/sys/kernel/mm/ksm/sleep_millisecs`.
    pub sleep_millisecs: u32,
}

/// Which regime the pacer is in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum PaceMode {
    /// Promoted memory is unmerged: ksmd gets the target share.
    Active,
    /// Nothing promoted is unmerged (or the target is zero): ksmd trickles.
    Trickle,
}

/// ksmd's CPU time, its wait for a CPU and the wall time of one tick, all
/// measured by the caller over the same interval, during which the
/// pacer's previous [`KsmdPace`] was in force.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KsmdTick {
    /// ksmd's CPU time in the interval, ns (`/proc/<ksmd>/schedstat` delta).
    pub cpu_ns: u64,
    /// Time ksmd spent runnable but waiting for a CPU in the interval, ns
    /// (`/proc/<ksmd>/schedstat` field 2 delta; 0 when unknown). It is
    /// neither work nor the sleep the pacer sets (module header, step 2).
    pub wait_ns: u64,
    /// Length of the interval, ns.
    pub wall_ns: Nanos,
}

impl KsmdTick {
    /// ksmd's CPU share over the tick (fraction of one core), or `None` for
    /// an empty interval.
    pub fn share(&self) -> Option<f64> {
        (self.wall_ns > 0).then(|| self.cpu_ns as f64 / self.wall_ns as f64)
    }
}

/// What the daemon wants from ksmd for the next tick.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PacingDemand {
    /// The governor's CPU share for promoted-but-unmerged memory (fraction
    /// of one core). Values outside `[0, max_share]` are clamped; NaN counts
    /// as zero.
    pub target_share: f64,
    /// Pages promoted (marked mergeable by pagesift) that are not merged yet.
    pub unmerged_pages: u64,
    /// Pages one full scan of ksmd covers (every mergeable page it knows
    /// of), or 0 if unknown: then the active share is not capped.
    pub scan_pages: u64,
}

/// The closed-loop pacer. Call [`Pacer::start`] once when ksmd is started,
/// then [`Pacer::tick`] at a steady interval (about a second) with what
/// ksmd did since the previous call, and write the returned pace to sysfs.
#[derive(Clone, Debug)]
pub struct Pacer {
    config: PacingConfig,
    /// Effective cost per page, ns, for each mode.
    cost_active: f64,
    cost_trickle: f64,
    mode: PaceMode,
    pace: KsmdPace,
    target: f64,
}

/// Lowest and highest effective cost the estimate may take, ns per page.
/// The cheapest visit measured is 0.67 µs and the worst about 100 µs (a
/// full stable chain, module header); a decade of margin either side.
const COST_FLOOR_NS: f64 = 50.0;
const COST_CEILING_NS: f64 = 1_000_000.0;

/// A measured share at or above this says ksmd ran without sleeping (or
/// the measurement is off): the model cannot be inverted there. The
/// ratio of work to sleep that [`Pacer::learn`] inverts is capped at the
/// same point (99 to 1).
const SATURATED_SHARE: f64 = 0.99;

impl Pacer {
    /// A pacer with `config`, refused if the config is inconsistent.
    pub fn new(config: PacingConfig) -> Result<Pacer, PacingConfigError> {
        config.validate()?;
        let mut p = Pacer {
            config,
            cost_active: config.seed_cost_ns,
            cost_trickle: config.seed_cost_ns,
            mode: PaceMode::Trickle,
            pace: KsmdPace {
                pages_to_scan: config.trickle_max_pages,
                sleep_millisecs: config.trickle_sleep_ms,
            },
            target: config.trickle_share,
        };
        p.pace = p.solve(PaceMode::Trickle, config.trickle_share);
        Ok(p)
    }

    /// The first pace, from the seeded model, before any measurement.
    pub fn start(&mut self, demand: PacingDemand) -> KsmdPace {
        self.decide(demand)
    }

    /// One control step: `measured` is what ksmd did under the pace
    /// returned last; `demand` is what is wanted next. Returns the pace to
    /// write.
    pub fn tick(&mut self, measured: KsmdTick, demand: PacingDemand) -> KsmdPace {
        self.learn(measured);
        self.decide(demand)
    }

    /// The pace in force (the last one returned).
    pub fn pace(&self) -> KsmdPace {
        self.pace
    }

    /// The regime of the pace in force.
    pub fn mode(&self) -> PaceMode {
        self.mode
    }

    /// The share the pace in force aims at.
    pub fn target_share(&self) -> f64 {
        self.target
    }

    /// The current effective cost estimate of `mode`, ns per scanned page.
    pub fn cost_ns_per_page(&self, mode: PaceMode) -> f64 {
        match mode {
            PaceMode::Active => self.cost_active,
            PaceMode::Trickle => self.cost_trickle,
        }
    }

    /// The share the model predicts for the pace in force (it equals the
    /// target unless a bound was hit).
    pub fn predicted_share(&self) -> f64 {
        let work = self.pace.pages_to_scan as f64 * self.cost_ns_per_page(self.mode);
        work / (work + self.pace.sleep_millisecs as f64 * 1e6)
    }

    /// The configuration.
    pub fn config(&self) -> &PacingConfig {
        &self.config
    }

    /// Updates the cost estimate of the mode in force from one tick.
    fn learn(&mut self, t: KsmdTick) {
        if t.wall_ns == 0 || t.cpu_ns < self.config.min_measured_cpu_ns {
            return;
        }
        // The time ksmd slept as told: the tick less its work and less its
        // wait for a CPU. Batches = asleep / S, so the cost per page is
        // cpu · S / (asleep · P); without a wait this is m/(1 − m) · S/P.
        let (cpu, wall) = (t.cpu_ns as f64, t.wall_ns as f64);
        let sleep_ns = self.pace.sleep_millisecs as f64 * 1e6;
        let asleep = (wall - cpu - t.wait_ns as f64).max(0.0);
        if t.wait_ns > 0 && asleep < wall * (1.0 - SATURATED_SHARE) {
            // Next to nothing left asleep once the wait is taken out: the
            // scheduler, not the batch, filled the tick, and the batches
            // cannot be counted. (The kernel adds a wait to the run delay
            // when it ends, so a short tick may even be given more wait
            // than its length.) A tick shorter than one sleep is still
            // counted, as before: the trickle sleeps a second, as long as
            // the tick.
            return;
        }
        let work_per_sleep = if asleep > 0.0 {
            (cpu / asleep).min(SATURATED_SHARE / (1.0 - SATURATED_SHARE))
        } else {
            SATURATED_SHARE / (1.0 - SATURATED_SHARE)
        };
        let observed = (work_per_sleep * sleep_ns / self.pace.pages_to_scan as f64)
            .clamp(COST_FLOOR_NS, COST_CEILING_NS);
        let c = self.config;
        let old = self.cost_ns_per_page(self.mode);
        let blended = (old.ln() + c.smoothing * (observed.ln() - old.ln())).exp();
        let new = blended
            .clamp(old / c.max_raise, old * c.max_cut)
            .clamp(COST_FLOOR_NS, COST_CEILING_NS);
        match self.mode {
            PaceMode::Active => self.cost_active = new,
            PaceMode::Trickle => self.cost_trickle = new,
        }
    }

    /// Picks the regime and solves the model for it.
    fn decide(&mut self, d: PacingDemand) -> KsmdPace {
        let wanted = if d.target_share.is_nan() {
            0.0
        } else {
            d.target_share.min(self.config.max_share)
        };
        let (mode, share) = if d.unmerged_pages > 0 && wanted > 0.0 {
            (
                PaceMode::Active,
                self.enough(wanted, d.scan_pages, d.unmerged_pages),
            )
        } else if wanted > 0.0 {
            // A trickle never costs more than the active budget would.
            (PaceMode::Trickle, self.config.trickle_share.min(wanted))
        } else {
            // No budget at all: ksmd still trickles (COW breaks, other
            // processes' KSM memory); stopping it is the caller's call.
            (PaceMode::Trickle, self.config.trickle_share)
        };
        self.mode = mode;
        self.target = share;
        self.pace = self.solve(mode, share);
        self.pace
    }

    /// The active share: `wanted`, capped at the share that the scan rate
    /// costs at the estimated cost per page (a page rate `r` at cost `c`
    /// keeps ksmd busy a fraction `r·c` of the time), never below the
    /// trickle. The rate is `active_scans_per_s` full scans of
    /// `scan_pages` pages, or (a set of at least `quick_min_pages`)
    /// `quick_scans_per_s` of them up to `quick_pages_per_s` pages a second
    /// if that is more, in proportion
    /// to the share of them that waits (`unmerged`) up to
    /// `full_pace_unmerged`.
    fn enough(&self, wanted: f64, scan_pages: u64, unmerged: u64) -> f64 {
        let c = &self.config;
        if scan_pages == 0 || c.active_scans_per_s == 0.0 {
            return wanted;
        }
        let n = scan_pages as f64;
        let quick = if scan_pages >= c.quick_min_pages {
            (c.quick_scans_per_s * n).min(c.quick_pages_per_s)
        } else {
            0.0
        };
        let worth = (unmerged as f64 / (n * c.full_pace_unmerged)).min(1.0);
        let rate = worth * (c.active_scans_per_s * n).max(quick);
        let needed = rate * self.cost_active * 1e-9;
        wanted.min(needed.max(c.trickle_share))
    }

    /// `P = S · s/((1 − s) · c)` at the mode's preferred sleep. When `P`
    /// would leave its bounds the sleep moves instead, in powers of two of
    /// the preferred sleep: 20 ms · 2^k is a whole number of jiffies at
    /// HZ = 100, 250, 300 and 1000, so the kernel's rounding of the sleep
    /// (msecs_to_jiffies) does not change from one tick to the next and
    /// cannot set up a limit cycle.
    fn solve(&self, mode: PaceMode, share: f64) -> KsmdPace {
        let c = &self.config;
        let (pref_sleep, max_pages) = match mode {
            PaceMode::Active => (c.active_sleep_ms, c.max_pages),
            PaceMode::Trickle => (c.trickle_sleep_ms, c.trickle_max_pages),
        };
        let cost = self.cost_ns_per_page(mode);
        // Pages per ms of sleep that give the share.
        let per_ms = share / (1.0 - share) * 1e6 / cost;
        let pages = per_ms * pref_sleep as f64;
        let doublings = if pages < c.min_pages as f64 {
            (c.min_pages as f64 / pages).log2().ceil()
        } else if pages > max_pages as f64 && mode == PaceMode::Active {
            // Active: sleep less to spend the budget. (The trickle's page
            // cap is the point of it: it keeps its long sleep.)
            -(pages / max_pages as f64).log2().ceil()
        } else {
            0.0
        };
        let sleep = (pref_sleep as f64 * doublings.clamp(-30.0, 30.0).exp2())
            .round()
            .clamp(c.min_sleep_ms as f64, c.max_sleep_ms as f64);
        let pages = (per_ms * sleep)
            .round()
            .clamp(c.min_pages as f64, max_pages as f64);
        KsmdPace {
            pages_to_scan: pages as u32,
            sleep_millisecs: sleep as u32,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A ksmd whose costs the pacer does not know: `cost_ns` per page,
    /// `wake_ns` per batch, sleeps rounded up to `jiffy_ms`, and optional
    /// multiplicative noise on each measurement.
    #[derive(Clone, Debug)]
    struct SimKsmd {
        cost_ns: f64,
        wake_ns: f64,
        jiffy_ms: u32,
        noise: f64,
        rng: u64,
        /// Time waited for a CPU per batch, as a multiple of the batch's
        /// work (a machine whose other tasks keep every core busy).
        starved: f64,
        /// Whether the tick reports that wait (`KsmdTick::wait_ns`).
        reports_wait: bool,
    }

    impl SimKsmd {
        fn new(cost_ns: f64, wake_ns: f64) -> Self {
            SimKsmd {
                cost_ns,
                wake_ns,
                // CONFIG_HZ=250 here (/proc/config.gz).
                jiffy_ms: 4,
                noise: 0.0,
                rng: 0x9E37_79B9_7F4A_7C15,
                starved: 0.0,
                reports_wait: true,
            }
        }

        /// The share this ksmd would use under `pace`.
        fn share(&self, pace: KsmdPace) -> f64 {
            self.shares(pace).0
        }

        /// The shares of the wall time this ksmd would work and wait for a
        /// CPU under `pace`.
        fn shares(&self, pace: KsmdPace) -> (f64, f64) {
            let sleep_ms = pace.sleep_millisecs.div_ceil(self.jiffy_ms).max(1) * self.jiffy_ms;
            let work = pace.pages_to_scan as f64 * self.cost_ns + self.wake_ns;
            let wait = work * self.starved;
            let cycle = work + wait + sleep_ms as f64 * 1e6;
            (work / cycle, wait / cycle)
        }

        /// Runs for `wall_ns` under `pace`.
        fn run(&mut self, pace: KsmdPace, wall_ns: u64) -> KsmdTick {
            // xorshift64: uniform noise in [-noise, noise].
            self.rng ^= self.rng << 13;
            self.rng ^= self.rng >> 7;
            self.rng ^= self.rng << 17;
            let u = (self.rng >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            let (share, wait) = self.shares(pace);
            let share = share * (1.0 + self.noise * u);
            KsmdTick {
                cpu_ns: (share * wall_ns as f64) as u64,
                wait_ns: if self.reports_wait {
                    (wait * wall_ns as f64) as u64
                } else {
                    0
                },
                wall_ns,
            }
        }
    }

    const SEC: u64 = 1_000_000_000;

    fn active(target: f64) -> PacingDemand {
        PacingDemand {
            target_share: target,
            unmerged_pages: 1 << 20,
            scan_pages: 0,
        }
    }

    /// Runs `ticks` ticks; returns the simulated share of each.
    fn drive(p: &mut Pacer, k: &mut SimKsmd, d: PacingDemand, ticks: usize) -> Vec<f64> {
        let mut shares = Vec::new();
        let mut pace = p.pace();
        for _ in 0..ticks {
            let t = k.run(pace, SEC);
            shares.push(t.share().unwrap());
            pace = p.tick(t, d);
        }
        shares
    }

    fn in_bounds(c: &PacingConfig, pace: KsmdPace) -> bool {
        (c.min_pages..=c.max_pages).contains(&pace.pages_to_scan)
            && (c.min_sleep_ms..=c.max_sleep_ms).contains(&pace.sleep_millisecs)
    }

    #[test]
    fn default_config_is_valid() {
        PacingConfig::default().validate().unwrap();
    }

    #[test]
    fn bad_configs_name_the_field() {
        let base = PacingConfig::default();
        let cases: Vec<(PacingConfig, &str)> = vec![
            (
                PacingConfig {
                    min_pages: 0,
                    ..base
                },
                "min_pages",
            ),
            (
                PacingConfig {
                    max_pages: 5,
                    ..base
                },
                "max_pages",
            ),
            (
                PacingConfig {
                    max_sleep_ms: 1,
                    ..base
                },
                "max_sleep_ms",
            ),
            (
                PacingConfig {
                    active_sleep_ms: 1,
                    ..base
                },
                "active_sleep_ms",
            ),
            (
                PacingConfig {
                    max_share: 1.0,
                    ..base
                },
                "max_share",
            ),
            (
                PacingConfig {
                    trickle_share: 0.0,
                    ..base
                },
                "trickle_share",
            ),
            (
                PacingConfig {
                    smoothing: 0.0,
                    ..base
                },
                "smoothing",
            ),
            (
                PacingConfig {
                    max_cut: 1.0,
                    ..base
                },
                "max_cut",
            ),
            (
                PacingConfig {
                    seed_cost_ns: f64::NAN,
                    ..base
                },
                "seed_cost_ns",
            ),
            (
                PacingConfig {
                    trickle_max_pages: 1_000_000,
                    ..base
                },
                "trickle_max_pages",
            ),
        ];
        for (cfg, field) in cases {
            let e = Pacer::new(cfg).unwrap_err();
            assert_eq!(e.field, field, "{e}");
            assert!(e.to_string().starts_with(&format!("pacing.{field}: ")));
        }
    }

    #[test]
    fn start_solves_the_seeded_model() {
        let mut p = Pacer::new(PacingConfig::default()).unwrap();
        let pace = p.start(active(0.10));
        // 20 ms · 0.1/0.9 / 3 µs = 740.7 pages.
        assert_eq!(
            pace,
            KsmdPace {
                pages_to_scan: 741,
                sleep_millisecs: 20
            }
        );
        assert_eq!(p.mode(), PaceMode::Active);
        assert!((p.predicted_share() - 0.10).abs() < 1e-3);
    }

    #[test]
    fn converges_on_costs_it_does_not_know() {
        // From the cheapest first-pass visit to the all-full-chain case
        // (module header).
        for cost in [700.0, 3_000.0, 9_500.0, 100_000.0] {
            for target in [0.02, 0.10, 0.30] {
                let mut p = Pacer::new(PacingConfig::default()).unwrap();
                let mut k = SimKsmd::new(cost, 20_000.0);
                p.start(active(target));
                let shares = drive(&mut p, &mut k, active(target), 20);
                // Whole pages: with few pages per batch the share can only
                // alternate around the target.
                for (i, s) in shares.iter().enumerate().skip(10) {
                    assert!(
                        (s / target - 1.0).abs() < 0.05,
                        "cost {cost} target {target}: tick {i} share {s:.4} ({shares:?})"
                    );
                }
                let mean = shares[10..].iter().sum::<f64>() / 10.0;
                assert!(
                    (mean / target - 1.0).abs() < 0.02,
                    "cost {cost} target {target}: mean {mean:.4} ({shares:?})"
                );
            }
        }
    }

    #[test]
    fn the_active_share_is_capped_at_a_few_full_scans_a_second() {
        let c = PacingConfig::default();
        // A fresh promotion: everything the scan covers waits.
        let demand = |scan_pages: u64| PacingDemand {
            target_share: 0.95,
            unmerged_pages: scan_pages.max(1),
            scan_pages,
        };
        let mut p = Pacer::new(c).unwrap();
        // 100 000 pages at the seed cost, 3 µs: 2 scans a second keep
        // ksmd busy 60 % of the time.
        p.start(demand(100_000));
        assert_eq!(p.mode(), PaceMode::Active);
        assert!(
            (p.target_share() - 0.60).abs() < 1e-9,
            "{}",
            p.target_share()
        );
        // 5 000 pages: small, eight scans (40 000 pages a second, under
        // the quick limit of 50 000) cost 12 %.
        p.start(demand(5_000));
        assert!(
            (p.target_share() - 0.12).abs() < 1e-9,
            "{}",
            p.target_share()
        );
        // 20 000 pages: eight scans would be 160 000 pages a second, so
        // the quick limit, 50 000, costs 15 % (two scans would cost 12 %).
        p.start(demand(20_000));
        assert!(
            (p.target_share() - 0.15).abs() < 1e-9,
            "{}",
            p.target_share()
        );
        // A million pages: the cap is above the governor's share, which wins;
        // unknown (0): no cap.
        for pages in [1 << 20, 0] {
            p.start(demand(pages));
            assert_eq!(p.target_share(), 0.95, "{pages} pages");
        }
        // A handful: never below the trickle.
        p.start(demand(1));
        assert_eq!(p.target_share(), c.trickle_share);
        assert_eq!(p.mode(), PaceMode::Active);
    }

    #[test]
    fn a_few_pages_waiting_beside_a_merged_set_get_fewer_scans_a_second() {
        let c = PacingConfig::default();
        let mut p = Pacer::new(c).unwrap();
        let share = |p: &mut Pacer, unmerged_pages| {
            p.start(PacingDemand {
                target_share: 0.95,
                unmerged_pages,
                scan_pages: 400_000,
            });
            assert_eq!(p.mode(), PaceMode::Active);
            p.target_share()
        };
        // Half or more of the scan waiting: two full scans a second,
        // 800 000 pages at 3 µs, more than the governor's share.
        assert_eq!(share(&mut p, 200_000), 0.95);
        assert_eq!(share(&mut p, 400_000), 0.95);
        // A tenth waiting: a fifth of the rate, 160 000 pages a second
        // (48 %).
        let tenth = share(&mut p, 40_000);
        assert!((tenth - 0.48).abs() < 1e-9, "{tenth}");
        // A few pages: a share of the rate in proportion, down to the
        // trickle (4 000 waiting: a fiftieth of 800 000 pages a second,
        // 16 000, 4.8 %).
        let few = share(&mut p, 4_000);
        assert!((few - 0.048).abs() < 1e-9, "{few}");
        for few in [10, 1] {
            assert_eq!(share(&mut p, few), c.trickle_share, "{few}");
        }
        // A small set with a few pages waiting: its quick rate in
        // proportion (5 000 pages, a tenth waiting: a fifth of 40 000
        // pages a second, 2.4 %).
        p.start(PacingDemand {
            target_share: 0.95,
            unmerged_pages: 500,
            scan_pages: 5_000,
        });
        assert!(
            (p.target_share() - 0.024).abs() < 1e-9,
            "{}",
            p.target_share()
        );
    }

    #[test]
    fn a_set_under_a_mib_gets_the_active_rate_not_the_quick_one() {
        let c = PacingConfig::default();
        let mut p = Pacer::new(c).unwrap();
        let mut share = |scan_pages: u64| {
            p.start(PacingDemand {
                target_share: 0.95,
                unmerged_pages: scan_pages,
                scan_pages,
            });
            p.target_share()
        };
        // 300 pages all waiting: eight scans a second, 2 400 pages at
        // 3 µs (0.72 %).
        let quick = share(300);
        assert!((quick - 0.0072).abs() < 1e-9, "{quick}");
        // 200 pages: two, 400 pages a second (0.12 %).
        let active = share(200);
        assert!((active - 0.0012).abs() < 1e-9, "{active}");
    }

    #[test]
    fn full_pace_unmerged_is_validated_by_name() {
        for bad in [0.0, -0.5, 1.5, f64::NAN] {
            let c = PacingConfig {
                full_pace_unmerged: bad,
                ..PacingConfig::default()
            };
            assert_eq!(
                c.validate().unwrap_err().field,
                "full_pace_unmerged",
                "{bad}"
            );
        }
    }

    #[test]
    fn the_capped_share_follows_the_learnt_cost() {
        // ksmd really costs 1 µs a page (the pacer starts from 3 µs): 2 full
        // scans a second of 50 000 pages are 10 % of a core, and the loop
        // gets there as it learns the cost.
        let mut p = Pacer::new(PacingConfig::default()).unwrap();
        let mut k = SimKsmd::new(1_000.0, 20_000.0);
        let d = PacingDemand {
            target_share: 0.95,
            unmerged_pages: 50_000,
            scan_pages: 50_000,
        };
        p.start(d);
        let shares = drive(&mut p, &mut k, d, 30);
        let mean = shares[20..].iter().sum::<f64>() / 10.0;
        assert!((mean - 0.10).abs() < 0.01, "mean {mean:.4} ({shares:?})");
    }

    #[test]
    fn a_ksmd_starved_of_cpu_keeps_the_batch_its_cost_gives() {
        // Both cores busy with other work: ksmd waits three times its
        // batch's work for a CPU after every wake-up. Its real cost is
        // 5 µs a page; at a 25 % target the model's batch (20 ms sleep)
        // is 20e6 · 0.25 / (0.75 · 5 000) ≈ 1 333 pages.
        let cfg = PacingConfig::default();
        let run = |reports_wait: bool| {
            let mut p = Pacer::new(cfg).unwrap();
            let mut k = SimKsmd::new(5_000.0, 0.0);
            k.jiffy_ms = 1;
            k.starved = 3.0;
            k.reports_wait = reports_wait;
            p.start(active(0.25));
            let shares = drive(&mut p, &mut k, active(0.25), 30);
            (p, shares)
        };
        let (p, shares) = run(true);
        let cost = p.cost_ns_per_page(PaceMode::Active);
        assert!((cost / 5_000.0 - 1.0).abs() < 0.05, "cost {cost:.0} ns");
        let pages = p.pace().pages_to_scan as f64;
        assert!((pages / 1_333.0 - 1.0).abs() < 0.05, "{pages} pages");
        // The share it gets is what the scheduler leaves it, not chased:
        // work 6.7 ms, wait 20 ms, sleep 20 ms: 1/7 of the wall time.
        assert!((shares[29] - 1.0 / 7.0).abs() < 0.01, "{shares:?}");
        // Counted as sleep, the wait made the cost look ever cheaper and
        // the batch wind up to the bound (the bug this guards against).
        let (blind, blind_shares) = run(false);
        assert!(
            blind.pace().pages_to_scan as f64 > 10.0 * pages,
            "{:?}",
            blind.pace()
        );
        assert!(blind_shares[29] > 0.2, "{blind_shares:?}");
    }

    #[test]
    fn a_tick_filled_by_the_wait_for_a_cpu_teaches_nothing() {
        let mut p = Pacer::new(PacingConfig::default()).unwrap();
        p.start(active(0.1));
        let c0 = p.cost_ns_per_page(PaceMode::Active);
        // A short tick (a jump in demand) credited with a wait that began
        // before it, and a tick the wait filled all but a few ms of.
        for (cpu_ns, wait_ns, wall_ns) in [
            (5_000_000, 80_000_000, 10_000_000),
            (100_000_000, 895_000_000, SEC),
        ] {
            p.tick(
                KsmdTick {
                    cpu_ns,
                    wait_ns,
                    wall_ns,
                },
                active(0.1),
            );
            assert_eq!(p.cost_ns_per_page(PaceMode::Active), c0);
        }
        // Without a wait the same work is a saturated ksmd: the cost rises.
        p.tick(
            KsmdTick {
                cpu_ns: SEC - 5_000_000,
                wait_ns: 0,
                wall_ns: SEC,
            },
            active(0.1),
        );
        assert!(p.cost_ns_per_page(PaceMode::Active) > c0);
    }

    #[test]
    fn a_cost_jump_is_cut_within_a_few_ticks() {
        // Merging finishes and the all-full stable chain makes every page
        // ~30x dearer (module header).
        let mut p = Pacer::new(PacingConfig::default()).unwrap();
        let mut k = SimKsmd::new(3_000.0, 10_000.0);
        p.start(active(0.1));
        drive(&mut p, &mut k, active(0.1), 10);
        k.cost_ns = 100_000.0;
        let shares = drive(&mut p, &mut k, active(0.1), 10);
        // The first tick pays for the old pace; the cut then comes fast.
        assert!(shares[0] > 0.5, "{shares:?}");
        assert!(shares[3] < 0.12, "{shares:?}");
        assert!((shares[9] / 0.1 - 1.0).abs() < 0.02, "{shares:?}");
    }

    #[test]
    fn a_cost_drop_is_followed_no_faster_than_max_raise() {
        let cfg = PacingConfig::default();
        let mut p = Pacer::new(cfg).unwrap();
        let mut k = SimKsmd::new(30_000.0, 0.0);
        p.start(active(0.1));
        drive(&mut p, &mut k, active(0.1), 10);
        let before = p.pace().pages_to_scan as f64;
        k.cost_ns = 1_000.0;
        let mut pace = p.pace();
        for _ in 0..3 {
            let prev = pace.pages_to_scan as f64;
            pace = p.tick(k.run(pace, SEC), active(0.1));
            assert!(pace.pages_to_scan as f64 <= prev * cfg.max_raise + 1.0);
        }
        assert!(pace.pages_to_scan as f64 > before * 4.0);
        let shares = drive(&mut p, &mut k, active(0.1), 15);
        assert!((shares[14] / 0.1 - 1.0).abs() < 0.02, "{shares:?}");
    }

    #[test]
    fn trickles_when_nothing_promoted_is_unmerged() {
        let cfg = PacingConfig::default();
        let mut p = Pacer::new(cfg).unwrap();
        let mut k = SimKsmd::new(3_000.0, 20_000.0);
        p.start(active(0.2));
        drive(&mut p, &mut k, active(0.2), 5);
        let busy = p.pace();
        let idle = PacingDemand {
            target_share: 0.2,
            unmerged_pages: 0,
            scan_pages: 0,
        };
        let shares = drive(&mut p, &mut k, idle, 10);
        assert_eq!(p.mode(), PaceMode::Trickle);
        let pace = p.pace();
        assert!(pace.pages_to_scan <= cfg.trickle_max_pages);
        assert!(pace.sleep_millisecs >= cfg.trickle_sleep_ms);
        assert!(pace.pages_to_scan < busy.pages_to_scan);
        // Capped by trickle_max_pages (100 pages · 3 µs + 20 µs a second).
        for s in &shares[1..] {
            assert!(*s <= cfg.trickle_share * 1.05, "{shares:?}");
        }
        // Back to work at once when something is promoted again, with the
        // active estimate intact.
        let again = p.tick(k.run(pace, SEC), active(0.2));
        assert_eq!(p.mode(), PaceMode::Active);
        assert!((again.pages_to_scan as f64 / busy.pages_to_scan as f64 - 1.0).abs() < 0.1);
    }

    #[test]
    fn the_trickle_itself_is_held_to_its_share_when_pages_are_dear() {
        // In the all-full-chain case 100 pages/s would cost 1 %. Also when
        // ksmd waits a little for a CPU after each batch: the trickle's
        // sleep is as long as a tick, and its ticks still teach.
        for starved in [0.0, 0.05] {
            let cfg = PacingConfig::default();
            let mut p = Pacer::new(cfg).unwrap();
            let mut k = SimKsmd::new(100_000.0, 20_000.0);
            k.starved = starved;
            let idle = PacingDemand::default();
            p.start(idle);
            let shares = drive(&mut p, &mut k, idle, 20);
            assert!(
                (shares[19] / cfg.trickle_share - 1.0).abs() < 0.05,
                "starved {starved}: {shares:?}"
            );
        }
    }

    #[test]
    fn zero_target_trickles() {
        let mut p = Pacer::new(PacingConfig::default()).unwrap();
        p.start(PacingDemand {
            target_share: 0.0,
            unmerged_pages: 10,
            scan_pages: 0,
        });
        assert_eq!(p.mode(), PaceMode::Trickle);
        assert_eq!(p.target_share(), PacingConfig::default().trickle_share);
    }

    #[test]
    fn uninformative_ticks_leave_the_estimate_alone() {
        let mut p = Pacer::new(PacingConfig::default()).unwrap();
        p.start(active(0.1));
        let c0 = p.cost_ns_per_page(PaceMode::Active);
        // ksmd had nothing to scan, and an empty interval.
        p.tick(
            KsmdTick {
                cpu_ns: 1_000,
                wall_ns: SEC,
                ..KsmdTick::default()
            },
            active(0.1),
        );
        p.tick(
            KsmdTick {
                cpu_ns: 0,
                wall_ns: 0,
                ..KsmdTick::default()
            },
            active(0.1),
        );
        assert_eq!(p.cost_ns_per_page(PaceMode::Active), c0);
    }

    #[test]
    fn unreachable_targets_stay_at_the_bounds() {
        let cfg = PacingConfig::default();
        // Too cheap to reach 0.9 within max_pages at min_sleep: all the
        // pages, the shortest sleep.
        let mut p = Pacer::new(cfg).unwrap();
        let mut k = SimKsmd::new(50.0, 0.0);
        p.start(active(0.9));
        drive(&mut p, &mut k, active(0.9), 30);
        assert_eq!(
            p.pace(),
            KsmdPace {
                pages_to_scan: cfg.max_pages,
                sleep_millisecs: cfg.min_sleep_ms
            }
        );
        // Too dear to stay under 0.0001: fewest pages, longest sleep.
        let mut p = Pacer::new(cfg).unwrap();
        let mut k = SimKsmd::new(500_000.0, 0.0);
        p.start(active(0.0001));
        drive(&mut p, &mut k, active(0.0001), 30);
        assert_eq!(
            p.pace(),
            KsmdPace {
                pages_to_scan: cfg.min_pages,
                sleep_millisecs: cfg.max_sleep_ms
            }
        );
    }

    /// The share range the bounds allow for a simulated ksmd.
    fn reachable(cfg: &PacingConfig, k: &SimKsmd, target: f64) -> bool {
        let lo = k.share(KsmdPace {
            pages_to_scan: cfg.min_pages,
            sleep_millisecs: cfg.max_sleep_ms,
        });
        let hi = k.share(KsmdPace {
            pages_to_scan: cfg.max_pages,
            sleep_millisecs: cfg.min_sleep_ms,
        });
        // With a margin: near a bound the pace is quantised.
        target > lo * 1.5 && target < hi / 1.5
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// On any ksmd in the measured cost range (and well beyond), with
        /// a per-batch cost and ±5 % measurement noise, the mean share over
        /// ticks 30–39 is within 5 % of a reachable target.
        #[test]
        fn converges_to_any_reachable_target(
            cost_ns in 300.0f64..200_000.0,
            wake_ns in 0.0f64..50_000.0,
            target in 0.003f64..0.8,
            noise in 0.0f64..0.05,
        ) {
            let cfg = PacingConfig::default();
            let mut k = SimKsmd::new(cost_ns, wake_ns);
            k.noise = noise;
            prop_assume!(reachable(&cfg, &k, target));
            let mut p = Pacer::new(cfg).unwrap();
            p.start(active(target));
            let shares = drive(&mut p, &mut k, active(target), 40);
            let mean = shares[30..].iter().sum::<f64>() / 10.0;
            prop_assert!((mean / target - 1.0).abs() < 0.05,
                "target {} mean {} shares {:?}", target, mean, shares);
        }

        /// Whatever it is fed (garbage measurements, NaN or out-of-range
        /// targets), every pace is within the configured bounds, and the
        /// trickle never exceeds its page cap.
        #[test]
        fn never_leaves_the_bounds(
            steps in proptest::collection::vec(
                (0u64..4_000_000_000, 0u64..2_000_000_000, -1.0f64..2.0, 0u64..3, any::<bool>()),
                1..60),
            min_pages in 1u32..200,
            span in 1u32..100_000,
            min_sleep in 1u32..50,
            sleep_span in 0u32..5_000,
        ) {
            let cfg = PacingConfig {
                min_pages,
                max_pages: min_pages + span,
                min_sleep_ms: min_sleep,
                max_sleep_ms: min_sleep + sleep_span,
                active_sleep_ms: min_sleep + sleep_span / 3,
                trickle_sleep_ms: min_sleep + sleep_span,
                trickle_max_pages: min_pages + span / 10,
                ..PacingConfig::default()
            };
            let mut p = Pacer::new(cfg).unwrap();
            let pace = p.start(active(0.1));
            prop_assert!(in_bounds(&cfg, pace));
            for (cpu_ns, wall_ns, target, unmerged, nan) in steps {
                let d = PacingDemand {
                    target_share: if nan { f64::NAN } else { target },
                    unmerged_pages: unmerged,
                    scan_pages: 0,
                };
                let pace = p.tick(KsmdTick {
                    cpu_ns,
                    wall_ns,
                    ..KsmdTick::default()
                }, d);
                prop_assert!(in_bounds(&cfg, pace), "{:?} {:?}", cfg, pace);
                if p.mode() == PaceMode::Trickle {
                    prop_assert!(pace.pages_to_scan <= cfg.trickle_max_pages);
                }
                let c = p.cost_ns_per_page(p.mode());
                prop_assert!(c.is_finite() && c > 0.0);
            }
        }

        /// One tick never moves the cost estimate by more than the limits.
        #[test]
        fn steps_are_limited(cpu_ns in 0u64..1_000_000_000, wall_ns in 1u64..2_000_000_000) {
            let cfg = PacingConfig::default();
            let mut p = Pacer::new(cfg).unwrap();
            p.start(active(0.1));
            let before = p.cost_ns_per_page(PaceMode::Active);
            p.tick(KsmdTick {
                    cpu_ns,
                    wall_ns,
                    ..KsmdTick::default()
                }, active(0.1));
            let after = p.cost_ns_per_page(PaceMode::Active);
            prop_assert!(after >= before / cfg.max_raise * 0.999_999);
            prop_assert!(after <= before * cfg.max_cut * 1.000_001);
        }
    }
}
