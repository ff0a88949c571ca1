//! Estimating how much deduplication would save from a sample of pages
//! (`pagesift scan`'s default, sampled mode), with honest 95 % intervals.
//!
//! ## The problem
//!
//! The quantity wanted is the *saving*: frames minus distinct contents,
//! `S = Σ_c (m_c − 1)` over contents `c` held by `m_c` frames. Written per
//! frame it is `S = Σ_f (1 − 1/m_f)`, where `m_f` is the multiplicity of
//! frame `f`'s content: a frame of a content held twice carries ½, one of a
//! content held 1000 times carries 0.999, a unique frame 0. That per-frame
//! form is also how saving is attributed to regions and processes here
//! (each frame carries `1 − 1/m`, the expected share under a survivor
//! chosen at random; see `docs/estimator.md` for how it relates to exact
//! mode's survivor rule).
//!
//! A sampled frame's `m` is not observed: its partners must be sampled too.
//! A content with two copies in a stratum sampled at rate `t` is seen as
//! duplicated only with probability `t²`, and no estimator of the number of
//! distinct values from a uniform sample is good in general (an unbiased
//! one exists, but its variance explodes for `t < ½`). So the design, not
//! only the formula, carries the accuracy:
//!
//! 1. **Stratified, with permanent random numbers.** Each unit (a frame) has
//!    a *key*, its page index inside its VMA, and a permanent random number
//!    [`prn`]`(seed, key)`. A cell (one VMA's frames within one chunk) is
//!    sampled by reading its units in increasing PRN order, so its sample
//!    is always `{u < t_cell}` for a threshold `t_cell`: stopping anywhere
//!    (budget exhausted) leaves a valid sample. Units of different VMAs
//!    with the same key share their PRN, so the samples are *coordinated*:
//!    the same page of a fork parent and of its children (or of two VMs'
//!    guest memories) is read in both or in neither, and a pair of such
//!    copies is seen with probability `min(t_i, t_j)`, not `t_i · t_j`.
//!    Cells of VMAs with the same start and length in different processes
//!    (a fork family) form one *stratum* and share its rate, so for them
//!    the partner of a sampled page is always sampled.
//! 2. **The ladder sets the rates** ([`pagesift_core::pipeline::ladder`], UKSM §5.2). A pilot
//!    samples every stratum at a low rate `t_0`; after each round the
//!    ladder judges each stratum on its sampled duplication ratio,
//!    *corrected for the chance of finding a partner* (a page whose only
//!    sampled twin had probability `p` of being sampled with it counts
//!    `1/p`), and a stratum that climbs to level `l` is read at
//!    `t_l = t_0 · K^l`, the top level reading it completely.
//!    Duplicate-rich strata thus end up read nearly completely (nearly
//!    exact), distinct-looking ones lightly. Budget left over when nothing
//!    climbs goes where it reduces the variance most (Neyman allocation,
//!    `n_h ∝ N_h σ_h`). If the budget covers every unit, every unit is read
//!    and the result is exact.
//! 3. **Multiplicity from found partners, corrected for the chance of
//!    finding them.** For a sampled frame `i` with sampled twins `j`,
//!    `r_ij = π_i/π_ij` is `t_i / min(t_i, t_j)` for a twin at the same key
//!    (1 when it is sampled at least as densely) and `1/t_j` for a twin
//!    elsewhere (it stands for the copies not sampled);
//!    `m̂_i = 1 + Σ_j r_ij` is the Horvitz–Thompson estimate of `m`
//!    (`E[m̂_i | i sampled] = m_i`), with estimated variance
//!    `Σ_j r_ij (r_ij − 1)`. The group's multiplicity `M` is the `m̂` of
//!    its member(s) with the smallest variance (a page whose twin lies in a
//!    completely read region knows `m` exactly). The frame contributes
//!    `(m̂_i − 1)/M` to the saving and `(m̂_i − 1)/(M − 1)` to "has a
//!    twin": with `M = m` both are exactly unbiased for any rates.
//! 4. **Hájek per cell.** A cell's total is `N_c · mean(y)` over its `n_c`
//!    sampled frames (`N_c` is known exactly from the page maps). Regions,
//!    processes and the system are sums of cells.
//! 5. **Intervals.** The variance is the Horvitz–Thompson variance of the
//!    linearised estimator under this design: per cell the stratified
//!    `N²(1 − f) s²/n` (with the finite-population correction, so a fully
//!    read cell has none), plus, for units that share a key in different
//!    cells, the covariance terms `e_i e_j (1/(π_i π_j) − 1/min(π_i, π_j))`
//!    that coordination creates (within a process for per-process
//!    intervals, everywhere for the total). A cell whose sample shows no
//!    spread (all distinct, say) still gets the variance of a Beta
//!    posterior, `q(1 − q)/(n + 3)` with `q = (Σy + 1)/(n + 2)` (about
//!    `1/n²`; close to the rule of three), so 0 of 20 is not "exactly 0".
//!    The interval is `value ± 1.96 · 1.1 σ` (the 1.1, [`DESIGN_EFFECT`],
//!    covers what the linearised variance misses of an adaptive design
//!    stopped by a deadline), clipped to `[0, frames]`. Two-copy
//!    groups found by chance (different keys, rates below 1) could be true
//!    pairs, whose unbiased estimate is `1/π_ij`, or samples of larger
//!    groups: the upper end reaches the pair reading. Cells never sampled
//!    widen the interval to the whole range of their frames.
//!
//! Duplicated pages per category (twin in the same region, else the same
//! process, else another process) are estimated the same way from the
//! nearest sampled twin. Already-merged (KSM) frames take part as partners
//! and in the saving, never in the duplicate counts.
//!
//! ## Where it is biased (docs/estimator.md has the figures)
//! - Twins at *different* keys in strata that stay at a low rate `t` are
//!   found with probability `t`; for a content with two such copies the
//!   expected contribution is `2t/(1 + t)` instead of 1. The ladder's
//!   corrected ratio pushes `t` up wherever such pairs show, and the
//!   interval reaches up to the pair reading; a stratum whose pilot found
//!   none of its pairs is under-estimated and its interval does not cover
//!   that.
//! - Rates chosen from the data (climbing) make the design adaptive; the
//!   bias this causes was not measurable in the simulations below or live.
//!
//! The core has no clock: callers convert their time budget into pages
//! ([`Sampler::plan_round`]) and read the units it hands out.

use pagesift_core::RegionId;
use pagesift_core::pipeline::ladder::{Ladder, LadderConfig, Sample};
use pagesift_core::{Nanos, PageRef};

/// Two-sided 95 % quantile of the standard normal distribution.
pub const Z_95: f64 = 1.959_963_984_540_054;

/// The standard error is multiplied by this before the interval is drawn:
/// the linearised variance treats the per-cell sample sizes as fixed, but
/// the design chooses them from the data (the ladder, Neyman allocation)
/// and a wall-time deadline stops it at a point that depends slightly on
/// what was read. Measured: z-scores (error over the linearised standard
/// error) had a standard deviation of 0.99–1.04 over 3000 simulated trials
/// with noisy round budgets, and 1.05–1.09 over 300 live trials each on a
/// 256 MiB `mixed` workload (60 and 150 ms budgets, coverage 92–94 %).
/// 1.1 brings both back to at least 95 %.
pub const DESIGN_EFFECT: f64 = 1.1;

/// 2^32: PRNs are `u32`, a threshold `t` admits the PRNs below `t · 2^32`.
const PRN_SCALE: f64 = 4_294_967_296.0;

/// Samples a stratum's ratio is fed to the ladder with, at most (the
/// ladder judges a ratio; more records would only cost time).
const LADDER_RECORDS: u64 = 256;

/// A round plans at least this many pages, or none (smaller rounds cost
/// more in bookkeeping than they read).
const MIN_ROUND_PAGES: u64 = 16;

/// Populations up to this many units may be read completely in the first
/// round; larger ones always start with the pilot, whose cost the caller
/// measures before it trusts a budget to cover everything.
const SMALL_POPULATION: u64 = 4096;

/// SplitMix64's finaliser.
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The permanent random number of a unit key under a scan seed: uniform on
/// `u32`, the same for every cell (VMA) that has the key.
pub fn prn(seed: u64, key: u32) -> u32 {
    let z = mix64(seed ^ mix64(u64::from(key).wrapping_add(0x9e37_79b9_7f4a_7c15)));
    (z >> 32) as u32
}

/// One estimation cell: the frames (units) of one region (VMA) inside one
/// chunk of it, all in one stratum.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CellSpec {
    /// The region (VMA) the cell belongs to: a dense index `0..regions`
    /// chosen by the caller; estimates are reported per region.
    pub region: u32,
    /// The owning process (any id; a pid on Linux).
    pub owner: u32,
    /// The stratum: cells of one stratum are sampled at one rate. A dense
    /// index `0..strata` chosen by the caller.
    pub stratum: u32,
    /// The units' keys (page index within the region), unique within the
    /// region.
    pub keys: Vec<u32>,
}

/// How the sampler spends its budget.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// The ladder. Its `levels` set the rate steps (`t_0 … 1`), `v_dup`
    /// the duplication ratio a stratum needs to climb; `v_life` is ignored
    /// (a scan judges after whole rounds).
    pub ladder: LadderConfig,
    /// Share of the first round's budget the pilot may use (the rest is
    /// for climbing and allocation).
    pub pilot_share: f64,
    /// Units read in every cell at least (small VMAs are then read
    /// completely).
    pub min_per_cell: u32,
    /// A round hands out each cell's pages in this many slices, cells
    /// interleaved, so a round cut short by the deadline leaves every cell
    /// about equally advanced.
    pub slices: u32,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        SamplerConfig {
            ladder: LadderConfig {
                v_life: 0,
                // The estimate needs every region's samples, whatever
                // its verdict.
                early_decision: false,
                ..LadderConfig::default()
            },
            pilot_share: 0.25,
            min_per_cell: 8,
            slices: 8,
        }
    }
}

impl SamplerConfig {
    /// Checks every field; the error names the field and the reason.
    pub fn validate(&self) -> Result<(), String> {
        self.ladder.validate()?;
        if !(self.pilot_share > 0.0 && self.pilot_share <= 1.0) {
            return Err(format!(
                "pilot_share: must be in (0, 1], got {}",
                self.pilot_share
            ));
        }
        if self.slices == 0 {
            return Err("slices: must be at least 1".into());
        }
        Ok(())
    }
}

/// A unit to read: key `key` of cell `cell`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Unit {
    /// Index of the cell in the order given to [`Sampler::new`].
    pub cell: u32,
    /// The unit's key (page index within the cell's region).
    pub key: u32,
}

/// What reading a unit gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The page was read; `group` identifies its content (equal groups =
    /// byte-identical pages, a dense id chosen by the caller). `merged`:
    /// the frame is already a KSM page (a partner, never a duplicate).
    Content { group: u32, merged: bool },
    /// The page could not be read (freed or unmapped since it was listed):
    /// it leaves the population.
    Failed,
}

/// A value with its 95 % interval. Exact values have `low == high ==
/// value`.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Interval {
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

impl Interval {
    /// A value known exactly.
    pub fn exact(value: f64) -> Self {
        Interval {
            value,
            low: value,
            high: value,
        }
    }

    /// `high − low`.
    pub fn width(&self) -> f64 {
        self.high - self.low
    }

    /// Whether `x` lies in `[low, high]` (with a relative tolerance of
    /// 1e-9 for values computed exactly in floating point).
    pub fn contains(&self, x: f64) -> bool {
        let eps = 1e-9 * x.abs().max(1.0);
        x >= self.low - eps && x <= self.high + eps
    }
}

/// Estimates for one domain: a region, a process, or the whole scan.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct DomainEstimate {
    /// Frames (units) in the domain.
    pub frames: u64,
    /// Of those, read.
    pub sampled: u64,
    /// Frames minus distinct contents, attributed `1 − 1/m` per frame.
    pub saving: Interval,
    /// Frames (not KSM) with a twin in the same region.
    pub dup_in_region: Interval,
    /// Frames with a twin in the same process but none in the region.
    pub dup_in_process: Interval,
    /// Frames whose twins are all in other processes.
    pub dup_across: Interval,
}

impl DomainEstimate {
    /// A domain without frames.
    pub fn zero() -> Self {
        DomainEstimate {
            frames: 0,
            sampled: 0,
            saving: Interval::exact(0.0),
            dup_in_region: Interval::exact(0.0),
            dup_in_process: Interval::exact(0.0),
            dup_across: Interval::exact(0.0),
        }
    }

    /// The four estimates in the order of the estimator's variables.
    fn vars_mut(&mut self) -> [&mut Interval; VARS] {
        [
            &mut self.saving,
            &mut self.dup_in_region,
            &mut self.dup_in_process,
            &mut self.dup_across,
        ]
    }
}

/// Everything [`Sampler::estimate`] found.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Estimates {
    /// Per region index (`0..=max region` of the cells).
    pub regions: Vec<DomainEstimate>,
    /// Per owner, sorted by owner id.
    pub owners: Vec<(u32, DomainEstimate)>,
    /// The whole population.
    pub total: DomainEstimate,
    /// Every unit was read: the estimates are exact.
    pub exhaustive: bool,
    /// Units read.
    pub sampled: u64,
    /// Units that could not be read (left the population).
    pub failed: u64,
    /// The saving the verified twins alone prove, Σ (x − 1) over their
    /// groups: a certain lower bound of the true saving, and the floor of
    /// `total.saving.low` (which, being the low end of a 95 % interval
    /// otherwise, may lie above the truth in a rare sample).
    pub verified_saving: f64,
}

/// The per-frame variables: saving share, then the three categories.
const VARS: usize = 4;

#[derive(Clone, Debug)]
struct Cell {
    region: u32,
    owner: u32,
    stratum: u32,
    /// `(prn, key)`, sorted: units are read in this order.
    units: Vec<(u32, u32)>,
    /// Units handed out so far (a prefix of `units`).
    next: u32,
    /// Where the current round stops.
    target: u32,
    /// Units handed out per turn this round.
    step: u32,
    /// The rate the cell was last planned at: its sample is `{u < cut}`
    /// if the round reached its target.
    cut: f64,
    read: u32,
    failed: u32,
}

impl Cell {
    fn len(&self) -> u32 {
        self.units.len() as u32
    }

    /// Units with PRN below `t` (a fraction).
    fn count_below(&self, t: f64) -> u32 {
        if t >= 1.0 {
            return self.len();
        }
        let cut = (t.max(0.0) * PRN_SCALE) as u64;
        self.units.partition_point(|&(p, _)| u64::from(p) < cut) as u32
    }

    /// The cell's threshold: every read unit's PRN is below it and every
    /// unread unit's is not. The planned rate when the round reached it
    /// (then cells of one stratum share it exactly), else the PRN of the
    /// first unit not read.
    fn threshold(&self) -> f64 {
        let Some(&(next, _)) = self.units.get(self.next as usize) else {
            return 1.0;
        };
        let cut = (self.cut * PRN_SCALE) as u64;
        let last_below = self.next == 0 || u64::from(self.units[self.next as usize - 1].0) < cut;
        if last_below && cut <= u64::from(next) {
            self.cut
        } else {
            (f64::from(next) / PRN_SCALE).max(f64::MIN_POSITIVE)
        }
    }

    /// Plans the cell up to rate `t` (never below what it has).
    fn plan(&mut self, t: f64) {
        self.target = self.count_below(t).max(self.next);
        self.cut = t;
    }

    /// Frames in the population (failed reads left it).
    fn population(&self) -> u32 {
        self.len() - self.failed
    }
}

#[derive(Clone, Debug)]
struct Stratum {
    cells: Vec<u32>,
    units: u64,
    /// The rate the stratum has been planned at.
    rate: f64,
    /// Samples read, and found duplicated weighted by the inverse chance
    /// of finding their partner (at the last judgement).
    read: u64,
    dup: f64,
}

#[derive(Clone, Copy, Debug)]
struct SampleRec {
    cell: u32,
    key: u32,
    group: u32,
    merged: bool,
}

/// What the next round does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum RoundKind {
    /// Every remaining unit (the budget covers them).
    Complete,
    /// The first round: every stratum at `t_0`.
    Pilot,
    /// Strata that climbed are raised to their level's rate.
    Climb,
    /// Leftover budget by Neyman allocation.
    Allocate,
}

/// The sampling driver: plans rounds within a page budget, hands out units
/// in PRN order, records what they held, lets the ladder move strata, and
/// computes the estimates. See the module header.
pub struct Sampler {
    config: SamplerConfig,
    cells: Vec<Cell>,
    strata: Vec<Stratum>,
    ladder: Ladder,
    /// Rate of each ladder level, fixed by the pilot.
    level_rates: Vec<f64>,
    samples: Vec<SampleRec>,
    group_sizes: Vec<u32>,
    /// The first two samples of each group (`u32::MAX`: none yet).
    group_pairs: Vec<[u32; 2]>,
    rounds: u32,
    last_kind: Option<RoundKind>,
    /// Cells with units left in this round, and the turn position.
    queue: Vec<u32>,
    turn: usize,
}

impl Sampler {
    /// A sampler over `cells` (every cell's keys unique; empty cells are
    /// allowed). `seed` fixes the PRNs and the ladder's choices.
    ///
    /// # Panics
    /// If `config` is invalid ([`SamplerConfig::validate`] says why).
    pub fn new(cells: Vec<CellSpec>, config: SamplerConfig, seed: u64) -> Self {
        if let Err(e) = config.validate() {
            panic!("invalid sampler config: {e}");
        }
        let n_strata = cells.iter().map(|c| c.stratum + 1).max().unwrap_or(0) as usize;
        let mut strata = vec![
            Stratum {
                cells: Vec::new(),
                units: 0,
                rate: 0.0,
                read: 0,
                dup: 0.0,
            };
            n_strata
        ];
        let cells: Vec<Cell> = cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                let mut units: Vec<(u32, u32)> =
                    c.keys.iter().map(|&k| (prn(seed, k), k)).collect();
                units.sort_unstable();
                let s = &mut strata[c.stratum as usize];
                s.cells.push(i as u32);
                s.units += units.len() as u64;
                Cell {
                    region: c.region,
                    owner: c.owner,
                    stratum: c.stratum,
                    units,
                    next: 0,
                    target: 0,
                    step: 0,
                    cut: 0.0,
                    read: 0,
                    failed: 0,
                }
            })
            .collect();
        let mut ladder = Ladder::new(config.ladder.clone(), seed ^ 0x6573_7469_6d61_7465);
        for (h, s) in strata.iter().enumerate() {
            ladder.insert(
                RegionId(h as u64),
                s.units.min(u64::from(u32::MAX)) as u32,
                0,
            );
        }
        for l in 0..ladder.levels() {
            ladder.start_round(l);
        }
        Sampler {
            config,
            cells,
            strata,
            ladder,
            level_rates: Vec::new(),
            samples: Vec::new(),
            group_sizes: Vec::new(),
            group_pairs: Vec::new(),
            rounds: 0,
            last_kind: None,
            queue: Vec::new(),
            turn: 0,
        }
    }

    /// Units in the population.
    pub fn units(&self) -> u64 {
        self.cells.iter().map(|c| u64::from(c.len())).sum()
    }

    /// Units not handed out yet.
    pub fn unread(&self) -> u64 {
        self.cells.iter().map(|c| u64::from(c.len() - c.next)).sum()
    }

    /// Units read so far.
    pub fn sampled(&self) -> u64 {
        self.samples.len() as u64
    }

    /// Rounds planned so far.
    pub fn rounds(&self) -> u32 {
        self.rounds
    }

    /// The kind of the last round planned.
    pub fn last_round(&self) -> Option<RoundKind> {
        self.last_kind
    }

    /// The ladder level of a stratum.
    pub fn stratum_level(&self, stratum: u32) -> Option<usize> {
        self.ladder.level_of(RegionId(u64::from(stratum)))
    }

    /// Plans the next round within `budget` more page reads; returns the
    /// units it will hand out (0: nothing left worth a round, sampling is
    /// over). Units not handed out from the previous round are dropped from
    /// it first.
    ///
    /// The first round of a population of more than a few thousand units
    /// is always the pilot, even when `budget` seems to cover everything:
    /// the caller's first budget rests on a guessed page cost, and a
    /// complete round cut short by the real cost would leave a uniform
    /// sample that never let the ladder steer.
    pub fn plan_round(&mut self, budget: u64) -> u64 {
        for c in &mut self.cells {
            c.target = c.next;
        }
        self.queue.clear();
        let unread = self.unread();
        if unread == 0 || budget < MIN_ROUND_PAGES.min(unread) {
            return 0;
        }
        let first_of_many = self.rounds == 0 && unread > SMALL_POPULATION;
        let kind = if budget >= unread && !first_of_many {
            for c in &mut self.cells {
                c.plan(1.0);
            }
            for s in &mut self.strata {
                s.rate = 1.0;
            }
            RoundKind::Complete
        } else if self.rounds == 0 {
            self.plan_pilot(budget);
            RoundKind::Pilot
        } else if self.plan_climb(budget) > 0 {
            RoundKind::Climb
        } else {
            self.plan_allocation(budget);
            RoundKind::Allocate
        };
        let planned: u64 = self
            .cells
            .iter()
            .map(|c| u64::from(c.target - c.next))
            .sum();
        if planned == 0 {
            return 0;
        }
        let slices = self.config.slices;
        for (i, c) in self.cells.iter_mut().enumerate() {
            let pending = c.target - c.next;
            if pending > 0 {
                c.step = pending.div_ceil(slices).max(1);
                self.queue.push(i as u32);
            }
        }
        self.turn = 0;
        self.rounds += 1;
        self.last_kind = Some(kind);
        planned
    }

    fn plan_pilot(&mut self, budget: u64) {
        let n = self.units().max(1) as f64;
        let t0 = (self.config.pilot_share * budget as f64 / n).clamp(1.0 / PRN_SCALE, 1.0);
        let levels = self.ladder.levels();
        let k = if levels > 1 {
            (1.0 / t0).powf(1.0 / (levels - 1) as f64)
        } else {
            1.0
        };
        self.level_rates = (0..levels)
            .map(|l| (t0 * k.powi(l as i32)).min(1.0))
            .collect();
        if let Some(top) = self.level_rates.last_mut() {
            *top = 1.0;
        }
        // The pilot with the per-cell minimum; if that alone is too much,
        // a minimum of one; the plain rate otherwise.
        for min in [self.config.min_per_cell, 1, 0] {
            for c in &mut self.cells {
                c.plan(t0);
                c.target = c.target.max(min.min(c.len()));
            }
            let demand: u64 = self.cells.iter().map(|c| u64::from(c.target)).sum();
            if demand <= budget {
                break;
            }
        }
        for s in &mut self.strata {
            s.rate = t0;
        }
    }

    /// Targets for strata whose level asks for more than they have; scaled
    /// down together if the budget is short. Returns the demand planned.
    fn plan_climb(&mut self, budget: u64) -> u64 {
        let want: Vec<f64> = (0..self.strata.len())
            .map(|h| {
                let level = self.stratum_level(h as u32).unwrap_or(0);
                let t = self.level_rates.get(level).copied().unwrap_or(1.0);
                t.max(self.strata[h].rate)
            })
            .collect();
        let demand_at = |me: &Self, lambda: f64| -> u64 {
            me.strata
                .iter()
                .zip(&want)
                .map(|(s, &w)| {
                    let t = s.rate + lambda * (w - s.rate);
                    s.cells
                        .iter()
                        .map(|&c| {
                            let c = &me.cells[c as usize];
                            u64::from(c.count_below(t).saturating_sub(c.next))
                        })
                        .sum::<u64>()
                })
                .sum()
        };
        let full = demand_at(self, 1.0);
        if full == 0 {
            return 0;
        }
        let lambda = if full <= budget {
            1.0
        } else {
            let (mut lo, mut hi) = (0.0, 1.0);
            for _ in 0..30 {
                let mid = 0.5 * (lo + hi);
                if demand_at(self, mid) <= budget {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            lo
        };
        self.apply_rates(|h, s| s.rate + lambda * (want[h] - s.rate))
    }

    /// Neyman allocation of `budget` more units over the strata:
    /// `n_h ∝ N_h σ_h`, each between what it has and all of it.
    ///
    /// `σ_h` is pooled over the strata of the same ladder level: a stratum
    /// given pages because its own sample looked more spread would have its
    /// own noise steer its allocation, which both biases the estimate and
    /// widens its error beyond the stratified formula (simulated with
    /// time-based round budgets: z-scores of standard deviation 1.07 with
    /// per-stratum σ). The ladder already separates duplicate-rich strata
    /// from the others; within a level they are treated alike.
    fn plan_allocation(&mut self, budget: u64) {
        let levels = self.ladder.levels();
        let mut pooled = vec![(0.0f64, 0.0f64); levels];
        for (h, s) in self.strata.iter().enumerate() {
            let l = self.stratum_level(h as u32).unwrap_or(0);
            pooled[l].0 += s.dup;
            pooled[l].1 += s.read as f64;
        }
        let level_sigma: Vec<f64> = pooled
            .iter()
            .map(|&(dup, read)| {
                let q = ((dup + 1.0) / (read + 2.0)).min(1.0);
                (q * (1.0 - q)).sqrt().max(1e-6)
            })
            .collect();
        let sigma: Vec<f64> = (0..self.strata.len())
            .map(|h| level_sigma[self.stratum_level(h as u32).unwrap_or(0)])
            .collect();
        let have: Vec<f64> = self
            .strata
            .iter()
            .map(|s| {
                s.cells
                    .iter()
                    .map(|&c| f64::from(self.cells[c as usize].next))
                    .sum()
            })
            .collect();
        let total_now: f64 = have.iter().sum();
        let goal = total_now + budget as f64;
        let alloc = |kappa: f64| -> Vec<f64> {
            self.strata
                .iter()
                .enumerate()
                .map(|(h, s)| (kappa * s.units as f64 * sigma[h]).clamp(have[h], s.units as f64))
                .collect()
        };
        let (mut lo, mut hi) = (0.0f64, 1.0f64);
        while alloc(hi).iter().sum::<f64>() < goal && hi < 1e12 {
            hi *= 2.0;
        }
        for _ in 0..60 {
            let mid = 0.5 * (lo + hi);
            if alloc(mid).iter().sum::<f64>() <= goal {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        let n = alloc(lo);
        self.apply_rates(|h, s| {
            if s.units == 0 {
                s.rate
            } else {
                (n[h] / s.units as f64).max(s.rate)
            }
        });
    }

    /// Sets each stratum's rate from `rate(h, stratum)` (never lowering
    /// it) and its cells' targets; returns the units planned.
    fn apply_rates(&mut self, rate: impl Fn(usize, &Stratum) -> f64) -> u64 {
        let mut planned = 0;
        for h in 0..self.strata.len() {
            let t = rate(h, &self.strata[h]).clamp(self.strata[h].rate, 1.0);
            self.strata[h].rate = t;
            for &c in &self.strata[h].cells {
                let c = &mut self.cells[c as usize];
                c.plan(t);
                planned += u64::from(c.target - c.next);
            }
        }
        planned
    }

    /// Units of the current round not handed out yet.
    pub fn pending(&self) -> u64 {
        self.queue
            .iter()
            .map(|&c| {
                let c = &self.cells[c as usize];
                u64::from(c.target - c.next)
            })
            .sum()
    }

    /// Cuts the rest of the current round down to at most `max` units,
    /// every cell in proportion (the caller found pages dearer than it
    /// planned with). Cells stopped short keep a valid sample: everything
    /// below the first unit they did not read.
    pub fn shrink_round(&mut self, max: u64) {
        let pending = self.pending();
        if pending <= max {
            return;
        }
        let keep = max as f64 / pending as f64;
        for &c in &self.queue {
            let c = &mut self.cells[c as usize];
            c.target = c.next + (f64::from(c.target - c.next) * keep) as u32;
        }
        let cells = &self.cells;
        self.queue
            .retain(|&c| cells[c as usize].target > cells[c as usize].next);
        self.turn = 0;
    }

    /// Hands out up to `max` units of the current round (cells in turn, a
    /// slice each), appending them to `out`; returns how many. Every unit
    /// handed out must be [`record`](Self::record)ed before
    /// [`estimate`](Self::estimate). Units of one cell come out in PRN
    /// order, and consecutive units of one turn belong to one cell.
    pub fn next_batch(&mut self, max: usize, out: &mut Vec<Unit>) -> usize {
        let mut given = 0;
        while given < max && !self.queue.is_empty() {
            if self.turn >= self.queue.len() {
                self.turn = 0;
            }
            let ci = self.queue[self.turn];
            let c = &mut self.cells[ci as usize];
            let take = (c.target - c.next).min(c.step).min((max - given) as u32);
            let mut slice: Vec<u32> = c.units[c.next as usize..(c.next + take) as usize]
                .iter()
                .map(|&(_, k)| k)
                .collect();
            // Address order within the slice reads faster.
            slice.sort_unstable();
            out.extend(slice.into_iter().map(|key| Unit { cell: ci, key }));
            c.next += take;
            given += take as usize;
            if c.next >= c.target {
                self.queue.swap_remove(self.turn);
            } else {
                self.turn += 1;
            }
        }
        given
    }

    /// Records what a handed-out unit held.
    pub fn record(&mut self, unit: Unit, outcome: Outcome) {
        let c = &mut self.cells[unit.cell as usize];
        match outcome {
            Outcome::Failed => c.failed += 1,
            Outcome::Content { group, merged } => {
                c.read += 1;
                let g = group as usize;
                if g >= self.group_sizes.len() {
                    self.group_sizes.resize(g + 1, 0);
                    self.group_pairs.resize(g + 1, [u32::MAX; 2]);
                }
                if self.group_sizes[g] < 2 {
                    self.group_pairs[g][self.group_sizes[g] as usize] = self.samples.len() as u32;
                }
                self.group_sizes[g] += 1;
                self.samples.push(SampleRec {
                    cell: unit.cell,
                    key: unit.key,
                    group,
                    merged,
                });
            }
        }
    }

    /// Takes every cell of these owners out of the population, with their
    /// samples (their processes exited: they are reported as gone, not
    /// estimated). Units of theirs still to be handed out are dropped.
    pub fn remove_owners(&mut self, owners: &[u32]) {
        if owners.is_empty() {
            return;
        }
        let gone: Vec<bool> = self
            .cells
            .iter()
            .map(|c| owners.contains(&c.owner))
            .collect();
        for (c, &g) in self.cells.iter_mut().zip(&gone) {
            if g {
                c.units.clear();
                c.next = 0;
                c.target = 0;
                c.read = 0;
                c.failed = 0;
            }
        }
        for s in &mut self.strata {
            s.units = s
                .cells
                .iter()
                .map(|&c| self.cells[c as usize].units.len() as u64)
                .sum();
        }
        self.queue.retain(|&c| !gone[c as usize]);
        self.samples.retain(|r| !gone[r.cell as usize]);
        self.group_sizes.iter_mut().for_each(|g| *g = 0);
        self.group_pairs.iter_mut().for_each(|p| *p = [u32::MAX; 2]);
        for (i, r) in self.samples.iter().enumerate() {
            let g = r.group as usize;
            if self.group_sizes[g] < 2 {
                self.group_pairs[g][self.group_sizes[g] as usize] = i as u32;
            }
            self.group_sizes[g] += 1;
        }
    }

    /// Ends a round: every stratum's duplication ratio so far goes to the
    /// ladder, which moves strata up or down a level (UKSM §5.2). `now` is
    /// the caller's clock (only its order matters).
    ///
    /// The ratio is corrected for the chance of finding a partner: a page
    /// whose only sampled twin had probability `p` of being sampled with
    /// it counts `1/p` (a pilot at rate 2.5 % that finds 25 pairs among
    /// 1000 pages is looking at a stratum of pairs, not a 2.5 % one), so
    /// strata of low-multiplicity duplicates climb and get read densely.
    pub fn end_round(&mut self, now: Nanos) {
        for s in &mut self.strata {
            s.read = 0;
            s.dup = 0.0;
        }
        let t: Vec<f64> = self.cells.iter().map(Cell::threshold).collect();
        let mut merged = vec![0u64; self.strata.len()];
        for (i, r) in self.samples.iter().enumerate() {
            let h = self.cells[r.cell as usize].stratum as usize;
            self.strata[h].read += 1;
            if r.merged {
                merged[h] += 1;
                continue;
            }
            let g = r.group as usize;
            match self.group_sizes[g] {
                0 | 1 => {}
                2 => {
                    let [a, b] = self.group_pairs[g];
                    let other = if a as usize == i { b } else { a } as usize;
                    let (pi_ab, _) = self.pair_inclusion(&t, i, other);
                    let p = pi_ab / t[r.cell as usize];
                    self.strata[h].dup += 1.0 / p.max(1e-9);
                }
                _ => self.strata[h].dup += 1.0,
            }
        }
        for (h, s) in self.strata.iter().enumerate() {
            if s.read == 0 {
                continue;
            }
            let k = s.read.min(LADDER_RECORDS);
            let ratio = (s.dup / s.read as f64).min(1.0);
            let dups = ((k as f64 * ratio).ceil() as u64).min(k);
            let merges = ((k * merged[h]) / s.read).min(k - dups);
            let page = PageRef {
                region: RegionId(h as u64),
                page: 0,
            };
            for i in 0..k {
                self.ladder.record(
                    page,
                    Sample {
                        duplicate: i < dups,
                        merged: i >= dups && i < dups + merges,
                        cow_broken: false,
                    },
                );
            }
        }
        let now = now.max(1);
        for l in (0..self.ladder.levels()).rev() {
            self.ladder.end_round(l, now);
        }
        for l in 0..self.ladder.levels() {
            self.ladder.start_round(l);
        }
    }

    /// The joint inclusion probability of samples `a` and `b` under the
    /// cells' thresholds `t`, and whether finding them together was left to
    /// chance (not both read completely, not one key at one rate).
    fn pair_inclusion(&self, t: &[f64], a: usize, b: usize) -> (f64, bool) {
        let (ra, rb) = (&self.samples[a], &self.samples[b]);
        let (ta, tb) = (t[ra.cell as usize], t[rb.cell as usize]);
        if ra.key == rb.key {
            (ta.min(tb), ta != tb)
        } else {
            (ta * tb, ta < 1.0 || tb < 1.0)
        }
    }

    /// The estimates from everything recorded so far (module header).
    // Per-variable loops index several parallel `[f64; VARS]` arrays.
    #[allow(clippy::needless_range_loop)]
    pub fn estimate(&self) -> Estimates {
        let cells = &self.cells;
        let nc = cells.len();
        let t: Vec<f64> = cells.iter().map(Cell::threshold).collect();
        let pop: Vec<f64> = cells.iter().map(|c| f64::from(c.population())).collect();
        let n: Vec<f64> = cells.iter().map(|c| f64::from(c.read)).collect();
        let pi: Vec<f64> = (0..nc)
            .map(|c| if pop[c] > 0.0 { n[c] / pop[c] } else { 1.0 })
            .collect();
        let y = self.frame_values(&t);

        // Per cell: sums of y and y², by variable.
        let mut sum = vec![[0.0f64; VARS]; nc];
        let mut sumsq = vec![[0.0f64; VARS]; nc];
        for (r, yi) in self.samples.iter().zip(&y) {
            let c = r.cell as usize;
            for v in 0..VARS {
                sum[c][v] += yi[v];
                sumsq[c][v] += yi[v] * yi[v];
            }
        }

        let n_regions = cells
            .iter()
            .map(|c| c.region as usize + 1)
            .max()
            .unwrap_or(0);
        let mut owners: Vec<u32> = cells.iter().map(|c| c.owner).collect();
        owners.sort_unstable();
        owners.dedup();
        let owner_ix = |o: u32| owners.binary_search(&o).expect("owner listed");

        // Accumulators per domain: value, variance, widening down/up.
        #[derive(Clone, Copy, Default)]
        struct Acc {
            frames: f64,
            sampled: f64,
            value: [f64; VARS],
            var: [f64; VARS],
            wide_lo: [f64; VARS],
            wide_hi: [f64; VARS],
            /// How far the "ambiguous pairs are pairs" reading lies above.
            pairs_hi: [f64; VARS],
            /// Its variance.
            pairs_var: [f64; VARS],
        }
        let mut reg = vec![Acc::default(); n_regions];
        let mut own = vec![Acc::default(); owners.len()];
        let mut tot = Acc::default();

        // The ratio unsampled cells are filled in with.
        let mut ratio = [0.0f64; VARS];
        let sampled_pop: f64 = (0..nc).filter(|&c| n[c] > 0.0).map(|c| pop[c]).sum();
        if sampled_pop > 0.0 {
            for (v, r) in ratio.iter_mut().enumerate() {
                *r = (0..nc)
                    .filter(|&c| n[c] > 0.0)
                    .map(|c| pop[c] / n[c] * sum[c][v])
                    .sum::<f64>()
                    / sampled_pop;
            }
        }

        for c in 0..nc {
            let mut a = Acc {
                frames: pop[c],
                sampled: n[c],
                ..Acc::default()
            };
            if pop[c] > 0.0 {
                if n[c] == 0.0 {
                    for v in 0..VARS {
                        a.value[v] = pop[c] * ratio[v];
                        a.wide_lo[v] = a.value[v];
                        a.wide_hi[v] = pop[c] - a.value[v];
                    }
                } else {
                    let fpc = (1.0 - n[c] / pop[c]).max(0.0);
                    for v in 0..VARS {
                        let mean = sum[c][v] / n[c];
                        a.value[v] = pop[c] * mean;
                        if fpc > 0.0 {
                            let ss = (sumsq[c][v] - n[c] * mean * mean).max(0.0);
                            let s2_over_n = if n[c] >= 2.0 {
                                ss / (n[c] - 1.0) / n[c]
                            } else {
                                0.0
                            };
                            let q = (sum[c][v] + 1.0) / (n[c] + 2.0);
                            let floor = q * (1.0 - q) / (n[c] + 3.0);
                            a.var[v] = pop[c] * pop[c] * fpc * s2_over_n.max(floor);
                        }
                    }
                }
            }
            let cell = &cells[c];
            for acc in [
                &mut reg[cell.region as usize],
                &mut own[owner_ix(cell.owner)],
                &mut tot,
            ] {
                acc.frames += a.frames;
                acc.sampled += a.sampled;
                for v in 0..VARS {
                    acc.value[v] += a.value[v];
                    acc.var[v] += a.var[v];
                    acc.wide_lo[v] += a.wide_lo[v];
                    acc.wide_hi[v] += a.wide_hi[v];
                }
            }
        }

        // Two-copy groups found by chance could be true pairs (their pair
        // HT estimate 1/π_ab is unbiased then) or a sample of a larger
        // group (then the per-frame estimate is right): the data cannot
        // tell, so the interval reaches up to the pair reading.
        for (g, &[a, b]) in self.group_pairs.iter().enumerate() {
            if self.group_sizes[g] != 2 {
                continue;
            }
            let (a, b) = (a as usize, b as usize);
            let (pi_ab, ambiguous) = self.pair_inclusion(&t, a, b);
            if !ambiguous {
                continue;
            }
            let mut as_frames = [0.0; VARS];
            let mut as_pairs = [0.0; VARS];
            as_pairs[0] = 1.0 / pi_ab;
            for i in [a, b] {
                let c = self.samples[i].cell as usize;
                for v in 0..VARS {
                    as_frames[v] += y[i][v] * pop[c] / n[c];
                    if v > 0 && y[i][v] > 0.0 {
                        as_pairs[v] += 1.0 / pi_ab;
                    }
                }
            }
            for i in [a, b] {
                let cell = &cells[self.samples[i].cell as usize];
                let own_acc = owner_ix(cell.owner);
                for v in 0..VARS {
                    let above = 0.5 * (as_pairs[v] - as_frames[v]).max(0.0);
                    let var = 0.5 * (1.0 - pi_ab) * as_pairs[v] * as_pairs[v];
                    for acc in [&mut reg[cell.region as usize], &mut own[own_acc], &mut tot] {
                        acc.pairs_hi[v] += above;
                        acc.pairs_var[v] += var;
                    }
                }
            }
        }

        // Covariances of coordinated units: same key, different cells.
        let mut by_key: Vec<u32> = (0..self.samples.len() as u32).collect();
        by_key.sort_unstable_by_key(|&i| {
            let r = &self.samples[i as usize];
            (r.key, cells[r.cell as usize].owner)
        });
        let mut run: Vec<(f64, [f64; VARS], u32)> = Vec::new();
        let mut i = 0;
        while i < by_key.len() {
            let key = self.samples[by_key[i] as usize].key;
            let mut j = i;
            run.clear();
            while j < by_key.len() && self.samples[by_key[j] as usize].key == key {
                let s = by_key[j] as usize;
                let c = self.samples[s].cell as usize;
                // A unit of a fully read cell has no covariance with any
                // other: 1/(1·π_j) − 1/min(1, π_j) = 0.
                if pi[c] < 1.0 {
                    let mut e = [0.0; VARS];
                    for v in 0..VARS {
                        e[v] = y[s][v] - sum[c][v] / n[c];
                    }
                    run.push((pi[c], e, cells[c].owner));
                }
                j += 1;
            }
            if run.len() >= 2 {
                let cross = cross_terms(&mut run);
                for v in 0..VARS {
                    tot.var[v] += cross[v];
                }
                // Within each owner (run is sorted by owner).
                let mut a = 0;
                while a < run.len() {
                    let mut b = a;
                    while b < run.len() && run[b].2 == run[a].2 {
                        b += 1;
                    }
                    if b - a >= 2 {
                        let owner = run[a].2;
                        let cross = cross_terms(&mut run[a..b]);
                        let o = &mut own[owner_ix(owner)];
                        for v in 0..VARS {
                            o.var[v] += cross[v];
                        }
                    }
                    a = b;
                }
            }
            i = j;
        }

        // Verified twins are certain: the saving is at least Σ (x − 1).
        let certain: f64 = self
            .group_sizes
            .iter()
            .filter(|&&x| x >= 2)
            .map(|&x| f64::from(x - 1))
            .sum();

        let exhaustive = cells
            .iter()
            .all(|c| c.next == c.len() && c.read + c.failed == c.len());
        let finish = |a: &Acc, lower: f64| -> DomainEstimate {
            let mut d = DomainEstimate::zero();
            d.frames = a.frames as u64;
            d.sampled = a.sampled as u64;
            for (v, iv) in d.vars_mut().into_iter().enumerate() {
                let mut value = a.value[v].clamp(0.0, a.frames);
                // Sums of 1 − 1/m over whole groups are integers: drop the
                // rounding noise.
                if (value - value.round()).abs() < 1e-6 {
                    value = value.round();
                }
                if exhaustive {
                    *iv = Interval::exact(value);
                    continue;
                }
                let var = a.var[v].max(0.0) * DESIGN_EFFECT * DESIGN_EFFECT;
                let half = Z_95 * var.sqrt();
                let up = if a.pairs_hi[v] > 0.0 {
                    half.max(a.pairs_hi[v] + Z_95 * (var + a.pairs_var[v]).sqrt())
                } else {
                    half
                };
                let floor = if v == 0 { lower.min(value) } else { 0.0 };
                *iv = Interval {
                    value,
                    low: (value - half - a.wide_lo[v]).max(floor).max(0.0),
                    high: (value + up + a.wide_hi[v]).min(a.frames),
                };
            }
            d
        };
        Estimates {
            regions: reg.iter().map(|a| finish(a, 0.0)).collect(),
            owners: owners
                .iter()
                .zip(&own)
                .map(|(&o, a)| (o, finish(a, 0.0)))
                .collect(),
            total: finish(&tot, certain),
            exhaustive,
            sampled: self.samples.len() as u64,
            failed: cells.iter().map(|c| u64::from(c.failed)).sum(),
            verified_saving: certain,
        }
    }

    /// Per sample: `[z, in_region, in_process, across]` (module header).
    fn frame_values(&self, t: &[f64]) -> Vec<[f64; VARS]> {
        let s = &self.samples;
        let cells = &self.cells;
        let mut y = vec![[0.0; VARS]; s.len()];
        let mut order: Vec<u32> = (0..s.len() as u32)
            .filter(|&i| self.group_sizes[s[i as usize].group as usize] >= 2)
            .collect();
        order.sort_unstable_by_key(|&i| (s[i as usize].group, s[i as usize].key));
        let mut same_key: Vec<(f64, u32)> = Vec::new();
        let mut places: Vec<(u32, u32)> = Vec::new();
        // Per member of the current group: (m̂ − 1, estimated Var m̂).
        let mut est: Vec<(u32, f64, f64)> = Vec::new();
        let mut g0 = 0;
        while g0 < order.len() {
            let group = s[order[g0] as usize].group;
            let mut g1 = g0;
            while g1 < order.len() && s[order[g1] as usize].group == group {
                g1 += 1;
            }
            let members = &order[g0..g1];
            let tt = |i: u32| t[s[i as usize].cell as usize];
            // A twin found with probability 1/r stands for r copies; the
            // estimated variance of that term is r(r − 1).
            let all: f64 = members.iter().map(|&i| 1.0 / tt(i)).sum();
            let all_var: f64 = members
                .iter()
                .map(|&i| (1.0 / tt(i)) * (1.0 / tt(i) - 1.0))
                .sum();
            est.clear();
            // Multiplicity per member, key by key.
            let mut k0 = 0;
            while k0 < members.len() {
                let key = s[members[k0] as usize].key;
                let mut k1 = k0;
                while k1 < members.len() && s[members[k1] as usize].key == key {
                    k1 += 1;
                }
                same_key.clear();
                same_key.extend(members[k0..k1].iter().map(|&i| (tt(i), i)));
                same_key.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
                let here: f64 = same_key.iter().map(|&(ti, _)| 1.0 / ti).sum();
                let here_var: f64 = same_key
                    .iter()
                    .map(|&(ti, _)| (1.0 / ti) * (1.0 / ti - 1.0))
                    .sum();
                // Σ 1/t_j and Σ 1/t_j² over strictly smaller t_j.
                let mut below = 0.0;
                let mut below_sq = 0.0;
                let mut p = 0;
                while p < same_key.len() {
                    let mut q = p;
                    while q < same_key.len() && same_key[q].0 == same_key[p].0 {
                        q += 1;
                    }
                    let ti = same_key[p].0;
                    // Twins at this key sampled at least as densely count 1;
                    // sparser ones t_i / t_j.
                    let same = (same_key.len() - p - 1) as f64 + ti * below;
                    let partners = (all - here) + same;
                    // r = t_i/t_j for the sparser same-key twins.
                    let same_var = ti * ti * below_sq - ti * below;
                    let var = (all_var - here_var).max(0.0) + same_var.max(0.0);
                    for &(_, i) in &same_key[p..q] {
                        est.push((i, partners, var));
                    }
                    below += (q - p) as f64 / ti;
                    below_sq += (q - p) as f64 / (ti * ti);
                    p = q;
                }
                k0 = k1;
            }
            // One multiplicity for the whole group, from the member(s)
            // whose view of their twins is the most certain (a page whose
            // twin lives in a completely read region knows m exactly).
            // With the true m, (m̂_i − 1)/m is unbiased for 1 − 1/m and
            // (m̂_i − 1)/(m − 1) for "has a twin", whatever the rates.
            let best = est.iter().map(|e| e.2).fold(f64::INFINITY, f64::min);
            let tol = 1e-9 * best.max(1.0);
            let (sum_m, count) = est
                .iter()
                .filter(|e| e.2 <= best + tol)
                .fold((0.0, 0.0), |(a, b), e| (a + e.1, b + 1.0));
            let m_group = 1.0 + sum_m / count;
            for &(i, partners, _) in &est {
                y[i as usize][0] = partners / m_group;
            }
            // Nearest twin: same region, else same owner, else elsewhere.
            places.clear();
            places.extend(members.iter().map(|&i| {
                let c = &cells[s[i as usize].cell as usize];
                (c.region, c.owner)
            }));
            places.sort_unstable();
            let count_region = |r: u32| {
                let a = places.partition_point(|p| p.0 < r);
                let b = places.partition_point(|p| p.0 <= r);
                b - a
            };
            let mut by_owner: Vec<u32> = places.iter().map(|p| p.1).collect();
            by_owner.sort_unstable();
            let count_owner = |o: u32| {
                let a = by_owner.partition_point(|&p| p < o);
                let b = by_owner.partition_point(|&p| p <= o);
                b - a
            };
            for &i in members {
                let r = &s[i as usize];
                if r.merged {
                    continue;
                }
                let c = &cells[r.cell as usize];
                let v = if count_region(c.region) >= 2 {
                    1
                } else if count_owner(c.owner) >= 2 {
                    2
                } else {
                    3
                };
                y[i as usize][v] = y[i as usize][0] * m_group / (m_group - 1.0);
            }
            g0 = g1;
        }
        y
    }
}

/// `Σ_{i≠j} e_i e_j (1/(π_i π_j) − 1/min(π_i, π_j))` per variable, for
/// units that share a key (and so a PRN): their joint inclusion
/// probability is `min(π_i, π_j)`. O(k log k) for `k` units.
fn cross_terms(run: &mut [(f64, [f64; VARS], u32)]) -> [f64; VARS] {
    run.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = [0.0; VARS];
    for (v, o) in out.iter_mut().enumerate() {
        let mut s = 0.0;
        let mut s2 = 0.0;
        for &(p, e, _) in run.iter() {
            s += e[v] / p;
            s2 += (e[v] / p).powi(2);
        }
        // Pairs (i before j in π order) have min = π_i.
        let mut suffix = 0.0;
        let mut min_part = 0.0;
        for &(p, e, _) in run.iter().rev() {
            min_part += e[v] / p * suffix;
            suffix += e[v];
        }
        *o = (s * s - s2) - 2.0 * min_part;
    }
    // Restore owner order for the caller's per-owner pass.
    run.sort_by_key(|a| a.2);
    out
}

#[cfg(test)]
#[allow(clippy::needless_range_loop)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A synthetic population: cells of units with content ids; `merged`
    /// marks KSM frames.
    #[derive(Clone, Debug)]
    struct Pop {
        cells: Vec<CellSpec>,
        content: Vec<Vec<u64>>,
        merged: Vec<Vec<bool>>,
    }

    impl Pop {
        fn new() -> Self {
            Pop {
                cells: Vec::new(),
                content: Vec::new(),
                merged: Vec::new(),
            }
        }

        /// Adds a region of `contents` cut into cells of `chunk` units;
        /// `stratum_base` + chunk index is the stratum (aligned regions pass
        /// the same base).
        fn region(
            &mut self,
            region: u32,
            owner: u32,
            stratum_base: u32,
            chunk: usize,
            contents: &[u64],
        ) {
            for (k, part) in contents.chunks(chunk.max(1)).enumerate() {
                let first = (k * chunk) as u32;
                self.cells.push(CellSpec {
                    region,
                    owner,
                    stratum: stratum_base + k as u32,
                    keys: (first..first + part.len() as u32).collect(),
                });
                self.content.push(part.to_vec());
                self.merged.push(vec![false; part.len()]);
            }
        }

        fn units(&self) -> u64 {
            self.content.iter().map(|c| c.len() as u64).sum()
        }

        /// Exact truth with the same attribution: per region and in total,
        /// `[Σ (1 − 1/m), in_region, in_process, across]`.
        fn truth(&self) -> (Vec<[f64; VARS]>, [f64; VARS]) {
            let mut where_: HashMap<u64, Vec<(u32, u32)>> = HashMap::new();
            for (c, cell) in self.cells.iter().enumerate() {
                for &x in &self.content[c] {
                    where_.entry(x).or_default().push((cell.region, cell.owner));
                }
            }
            let regions = self
                .cells
                .iter()
                .map(|c| c.region as usize + 1)
                .max()
                .unwrap_or(0);
            let mut per = vec![[0.0; VARS]; regions];
            let mut tot = [0.0; VARS];
            for (c, cell) in self.cells.iter().enumerate() {
                for (u, &x) in self.content[c].iter().enumerate() {
                    let w = &where_[&x];
                    let m = w.len() as f64;
                    let mut y = [0.0; VARS];
                    y[0] = 1.0 - 1.0 / m;
                    if m >= 2.0 && !self.merged[c][u] {
                        let in_region = w.iter().filter(|p| p.0 == cell.region).count() >= 2;
                        let in_proc = w.iter().filter(|p| p.1 == cell.owner).count() >= 2;
                        y[if in_region {
                            1
                        } else if in_proc {
                            2
                        } else {
                            3
                        }] = 1.0;
                    }
                    for v in 0..VARS {
                        per[cell.region as usize][v] += y[v];
                        tot[v] += y[v];
                    }
                }
            }
            (per, tot)
        }

        /// Runs the sampler with a page budget split over rounds as a
        /// caller with a clock would (each round gets what is left).
        fn run(&self, budget: u64, seed: u64) -> (Estimates, Sampler) {
            let mut s = Sampler::new(self.cells.clone(), SamplerConfig::default(), seed);
            let mut ids: HashMap<u64, u32> = HashMap::new();
            let mut left = budget;
            let mut batch = Vec::new();
            let mut round = 0;
            while s.plan_round(left) > 0 {
                round += 1;
                loop {
                    batch.clear();
                    if s.next_batch(1024.min(left as usize), &mut batch) == 0 {
                        break;
                    }
                    for u in &batch {
                        let c = u.cell as usize;
                        let first = self.cells[c].keys[0];
                        let i = (u.key - first) as usize;
                        let x = self.content[c][i];
                        let next = ids.len() as u32;
                        let group = *ids.entry(x).or_insert(next);
                        s.record(
                            *u,
                            Outcome::Content {
                                group,
                                merged: self.merged[c][i],
                            },
                        );
                    }
                    left -= batch.len() as u64;
                }
                s.end_round(round);
            }
            (s.estimate(), s)
        }
    }

    /// `static-mixed`: `dup` identical pages and `rnd` distinct pages in two
    /// processes.
    fn static_mixed(dup: usize, rnd: usize) -> Pop {
        let mut p = Pop::new();
        p.region(0, 1, 0, 4096, &vec![7u64; dup]);
        let random: Vec<u64> = (0..rnd as u64).map(|i| 1_000_000 + i).collect();
        p.region(1, 2, 1000, 4096, &random);
        p
    }

    /// The workload's `mixed`: runs of 16 pages, `ratio` of them copies of
    /// the same 16 contents, the others distinct.
    fn mixed(pages: usize, ratio: f64, seed: u64) -> Pop {
        let mut rng = seed;
        let contents: Vec<u64> = (0..pages / 16)
            .flat_map(|r| {
                rng = mix64(rng.wrapping_add(0x9e37_79b9_7f4a_7c15));
                let dup = (rng >> 11) as f64 / (1u64 << 53) as f64 * 1.0 < ratio;
                (0..16u64).map(move |j| {
                    if dup {
                        j
                    } else {
                        1_000_000 + (r as u64) * 16 + j
                    }
                })
            })
            .collect();
        let mut p = Pop::new();
        p.region(0, 1, 0, 4096, &contents);
        p
    }

    /// A fork family: parent region of `pages` (a `mixed` layout), and
    /// `children` aligned copies of which each rewrote a `dirty` fraction
    /// with content `DIRTY + page` (the same in every child), as the
    /// workload does; untouched child pages are the parent's frames and
    /// not units of the child.
    fn fork_family(pages: usize, children: u32, dirty: f64, seed: u64) -> Pop {
        let parent = mixed(pages, 0.3, seed);
        let mut p = Pop::new();
        p.region(0, 1, 0, 4096, &parent.content.concat());
        let mut rng = seed ^ 0xc4;
        for child in 0..children {
            let mut keys = Vec::new();
            for k in 0..pages as u32 {
                rng = mix64(rng.wrapping_add(0x9e37_79b9_7f4a_7c15));
                if ((rng >> 11) as f64 / (1u64 << 53) as f64) < dirty {
                    keys.push(k);
                }
            }
            for (chunk, part) in keys.chunk_by(|a, b| a / 4096 == b / 4096).enumerate() {
                let _ = chunk;
                let stratum = part[0] / 4096;
                p.cells.push(CellSpec {
                    region: 1 + child,
                    owner: 2 + child,
                    stratum,
                    keys: part.to_vec(),
                });
                p.content
                    .push(part.iter().map(|&k| 1 << 40 | u64::from(k)).collect());
                p.merged.push(vec![false; part.len()]);
            }
        }
        p
    }

    fn run_sparse(p: &Pop, budget: u64, seed: u64) -> Estimates {
        let mut s = Sampler::new(p.cells.clone(), SamplerConfig::default(), seed);
        let lookup: Vec<HashMap<u32, usize>> = p
            .cells
            .iter()
            .map(|c| c.keys.iter().enumerate().map(|(i, &k)| (k, i)).collect())
            .collect();
        let mut ids: HashMap<u64, u32> = HashMap::new();
        let mut left = budget;
        let mut batch = Vec::new();
        let mut round = 0;
        while s.plan_round(left) > 0 {
            round += 1;
            loop {
                batch.clear();
                if s.next_batch(1024.min(left as usize), &mut batch) == 0 {
                    break;
                }
                for u in &batch {
                    let c = u.cell as usize;
                    let i = lookup[c][&u.key];
                    let x = p.content[c][i];
                    let next = ids.len() as u32;
                    let group = *ids.entry(x).or_insert(next);
                    s.record(
                        *u,
                        Outcome::Content {
                            group,
                            merged: p.merged[c][i],
                        },
                    );
                }
                left -= batch.len() as u64;
            }
            s.end_round(round);
        }
        s.estimate()
    }

    fn assert_exact(e: &Estimates, p: &Pop) {
        let (per, tot) = p.truth();
        assert!(e.exhaustive);
        let get = |d: &DomainEstimate| [d.saving, d.dup_in_region, d.dup_in_process, d.dup_across];
        for v in 0..VARS {
            let iv = get(&e.total)[v];
            assert!(
                (iv.value - tot[v]).abs() < 1e-6,
                "var {v}: {} vs {}",
                iv.value,
                tot[v]
            );
            assert_eq!(iv.width(), 0.0, "var {v}: {iv:?}");
        }
        for (r, truth) in per.iter().enumerate() {
            for v in 0..VARS {
                let iv = get(&e.regions[r])[v];
                assert!((iv.value - truth[v]).abs() < 1e-6, "region {r} var {v}");
                assert_eq!(iv.width(), 0.0);
            }
        }
    }

    #[test]
    fn prn_is_uniform_and_shared_by_key() {
        assert_eq!(prn(5, 77), prn(5, 77));
        assert_ne!(prn(5, 77), prn(6, 77));
        // Uniform: 16 buckets of 64k keys within 2 %.
        let mut b = [0u32; 16];
        for k in 0..(1 << 16) {
            b[(prn(9, k) >> 28) as usize] += 1;
        }
        // Binomial sd is 62: allow 4 sd.
        for &x in &b {
            assert!((x as f64 - 4096.0).abs() < 250.0, "{b:?}");
        }
    }

    #[test]
    fn a_budget_covering_everything_gives_exact_zero_width_results() {
        let p = static_mixed(5000, 7000);
        let (e, s) = p.run(p.units(), 1);
        assert_eq!(s.last_round(), Some(RoundKind::Complete));
        assert_exact(&e, &p);
        assert_eq!(e.total.saving.value, 4999.0);
    }

    #[test]
    fn pilot_then_climb_concentrates_on_duplicates() {
        let p = static_mixed(40_000, 40_000);
        let (e, s) = p.run(20_000, 3);
        assert!(!e.exhaustive);
        // The duplicate region's strata climbed; the random one's did not.
        assert!(s.stratum_level(0).unwrap() >= 1, "{:?}", s.stratum_level(0));
        assert_eq!(s.stratum_level(1000), Some(0));
        let dup = e.regions[0].sampled as f64 / e.regions[0].frames as f64;
        let rnd = e.regions[1].sampled as f64 / e.regions[1].frames as f64;
        assert!(dup > 2.0 * rnd, "dup rate {dup}, random rate {rnd}");
        assert!(e.total.sampled <= 20_000);
        let err = (e.total.saving.value - 39_999.0).abs() / 80_000.0;
        assert!(err < 0.01, "{:?}", e.total.saving);
        assert!(e.total.saving.contains(39_999.0));
    }

    #[test]
    fn coordinated_fork_pairs_are_found_unbiased() {
        // 3 children dirtying 25 %: ≈ 14 % of pages are in cross-child
        // pairs, found only because samples are coordinated by key.
        let p = fork_family(16_384, 3, 0.25, 11);
        let (_, tot) = p.truth();
        let trials = 40;
        let mut sum = 0.0;
        let mut covered = 0;
        for seed in 0..trials {
            let e = run_sparse(&p, p.units() / 5, seed);
            assert!(!e.exhaustive);
            sum += e.total.saving.value;
            covered += e.total.saving.contains(tot[0]) as u32;
            // The cross-process category is where the pairs show.
            assert!(
                e.total.dup_across.value > 0.5 * tot[3],
                "{:?} vs {}",
                e.total.dup_across,
                tot[3]
            );
        }
        let mean = sum / trials as f64;
        assert!(
            (mean - tot[0]).abs() < 0.01 * tot[0],
            "mean {mean} vs {}",
            tot[0]
        );
        assert!(covered >= 36, "covered {covered}/{trials}");
    }

    #[test]
    fn intervals_cover_on_mixed_populations() {
        // The coverage the live test asserts, here over 200 seeds.
        let p = mixed(65_536, 0.3, 5);
        let (_, tot) = p.truth();
        let trials = 200;
        let mut covered = 0;
        let mut bias = 0.0;
        for seed in 0..trials {
            let (e, _) = p.run(8_000, 100 + seed);
            covered += e.total.saving.contains(tot[0]) as u32;
            bias += e.total.saving.value - tot[0];
            assert!(e.total.saving.width() > 0.0);
        }
        let rel_bias = bias / trials as f64 / tot[0];
        assert!(rel_bias.abs() < 0.01, "relative bias {rel_bias}");
        assert!(
            covered as f64 >= 0.9 * trials as f64,
            "covered {covered}/{trials}"
        );
    }

    #[test]
    fn independent_pairs_in_a_light_stratum_are_underestimated_as_documented() {
        // Pairs at unrelated keys only, no other duplicates: the pilot sees
        // a few, the stratum may climb; at rate t a pair contributes
        // 2t/(1+t) in expectation, so the estimate must fall short.
        let mut p = Pop::new();
        let contents: Vec<u64> = (0..40_000u64).map(|i| i % 20_000).collect();
        p.region(0, 1, 0, 40_000, &contents);
        let (_, tot) = p.truth();
        let mut sum = 0.0;
        let mut covered = 0;
        for seed in 0..20 {
            let (e, s) = p.run(4_000, seed);
            sum += e.total.saving.value;
            covered += e.total.saving.contains(tot[0]) as u32;
            // The partner-corrected ratio made the stratum climb.
            assert!(s.stratum_level(0).unwrap() >= 1);
        }
        let mean = sum / 20.0;
        assert!(mean < 0.5 * tot[0], "mean {mean} vs truth {}", tot[0]);
        // The interval reaches up to the pairs reading and covers.
        assert!(covered >= 18, "covered {covered}/20");
    }

    #[test]
    fn unsampled_cells_widen_the_interval_to_their_whole_range() {
        // 300 single-unit cells and a budget of 16: most cells unsampled.
        let mut p = Pop::new();
        for r in 0..300u32 {
            p.region(r, r, r, 1, &[u64::from(r % 2)]);
        }
        let (_, tot) = p.truth();
        let (e, _) = p.run(16, 1);
        assert!(e.total.sampled <= 16);
        assert!(e.total.saving.contains(tot[0]));
        assert!(e.total.saving.high >= 290.0, "{:?}", e.total.saving);
    }

    #[test]
    fn a_shrunk_round_keeps_every_cell_advancing_and_the_sample_valid() {
        let p = static_mixed(40_000, 40_000);
        let mut s = Sampler::new(p.cells.clone(), SamplerConfig::default(), 9);
        // A large population starts with the pilot even if the budget
        // seems to cover it (a quarter of the budget: 20 000 units).
        let planned = s.plan_round(p.units());
        assert_eq!(s.last_round(), Some(RoundKind::Pilot));
        assert!(planned < p.units() / 3, "{planned}");
        let mut batch = Vec::new();
        s.next_batch(2048, &mut batch);
        s.shrink_round(3_000);
        assert!(s.pending() <= 3_000);
        let mut total = batch.len();
        loop {
            let n = s.next_batch(1024, &mut batch);
            if n == 0 {
                break;
            }
            total += n;
        }
        assert!(total <= 2048 + 3_000);
        for u in &batch {
            let c = u.cell as usize;
            let x = p.content[c][(u.key - p.cells[c].keys[0]) as usize];
            let group = if x < 1_000_000 {
                0
            } else {
                (x - 999_999) as u32
            };
            s.record(
                *u,
                Outcome::Content {
                    group,
                    merged: false,
                },
            );
        }
        let e = s.estimate();
        // Every cell was read (a sliced round), none completely.
        assert!(
            e.regions
                .iter()
                .all(|r| r.sampled > 0 && r.sampled < r.frames)
        );
        assert!(e.total.saving.contains(39_999.0), "{:?}", e.total.saving);
    }

    #[test]
    fn removed_owners_leave_no_trace() {
        let mut p = Pop::new();
        p.region(0, 1, 0, 64, &[5, 6, 7, 8]);
        p.region(1, 2, 10, 64, &[5, 6, 9]);
        let mut s = Sampler::new(p.cells.clone(), SamplerConfig::default(), 3);
        assert!(s.plan_round(100) > 0);
        let mut batch = Vec::new();
        s.next_batch(100, &mut batch);
        for u in &batch {
            let c = u.cell as usize;
            let x = p.content[c][(u.key - p.cells[c].keys[0]) as usize];
            s.record(
                *u,
                Outcome::Content {
                    group: x as u32,
                    merged: false,
                },
            );
        }
        assert_eq!(s.estimate().total.saving.value, 2.0);
        s.remove_owners(&[2]);
        let e = s.estimate();
        assert_eq!(e.total.saving.value, 0.0);
        assert_eq!(e.total.frames, 4);
        assert!(e.exhaustive);
    }

    #[test]
    fn merged_frames_are_partners_but_not_duplicates() {
        let mut p = Pop::new();
        p.region(0, 1, 0, 16, &[5, 6, 7, 8]);
        p.region(1, 2, 10, 16, &[5, 9]);
        p.merged[1][0] = true;
        let (e, _) = p.run(100, 1);
        assert_exact(&e, &p);
        assert_eq!(e.total.saving.value, 1.0);
        assert_eq!(e.regions[1].dup_across.value, 0.0);
        assert_eq!(e.regions[0].dup_across.value, 1.0);
    }

    /// The evidence behind [`DESIGN_EFFECT`]: coverage and z-scores (error
    /// over the linearised standard error, before the design effect) when
    /// the caller's round budgets are noisy, as time-based ones are (each
    /// round planned with `left × noise`, shrunk after each batch with
    /// fresh noise, stopped at the true budget):
    /// `TRIALS=3000 cargo test --release -p pagesift-core --lib
    /// estimate::tests::noisy_round_budgets -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn noisy_round_budgets() {
        let p = mixed(65_536, 0.3, 4);
        let (_, tot) = p.truth();
        let trials: u64 = std::env::var("TRIALS")
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(300);
        for (budget, lo, hi) in [
            (13_000u64, 1.0f64, 1.0f64),
            (13_000, 0.1, 1.0),
            (6_000, 0.3, 3.0),
            (6_000, 1.0, 1.0),
        ] {
            let mut zs = Vec::new();
            let mut covered = 0;
            for seed in 0..trials {
                let mut rng = seed ^ 0x5eed;
                let mut noise = || {
                    rng = mix64(rng.wrapping_add(0x9e37_79b9_7f4a_7c15));
                    lo + (hi - lo) * ((rng >> 11) as f64 / (1u64 << 53) as f64)
                };
                let mut s = Sampler::new(p.cells.clone(), SamplerConfig::default(), seed);
                let mut ids: HashMap<u64, u32> = HashMap::new();
                let mut left = budget;
                let mut batch = Vec::new();
                let mut round = 0;
                'rounds: loop {
                    let guess = (left as f64 * noise()) as u64;
                    let planned = s.plan_round(guess);
                    if planned == 0 {
                        break;
                    }
                    let share = (planned as f64 / guess.max(1) as f64).min(1.0);
                    round += 1;
                    loop {
                        batch.clear();
                        if s.next_batch(1024, &mut batch) == 0 {
                            break;
                        }
                        for u in &batch {
                            let c = u.cell as usize;
                            let x = p.content[c][(u.key - p.cells[c].keys[0]) as usize];
                            let next = ids.len() as u32;
                            let group = *ids.entry(x).or_insert(next);
                            s.record(
                                *u,
                                Outcome::Content {
                                    group,
                                    merged: false,
                                },
                            );
                        }
                        left = left.saturating_sub(batch.len() as u64);
                        if left == 0 {
                            s.end_round(round);
                            break 'rounds;
                        }
                        s.shrink_round((left as f64 * noise() * share) as u64);
                    }
                    s.end_round(round);
                }
                let e = s.estimate();
                covered += e.total.saving.contains(tot[0]) as u32;
                let se = (e.total.saving.high - e.total.saving.low) / (2.0 * Z_95 * DESIGN_EFFECT);
                zs.push((e.total.saving.value - tot[0]) / se);
            }
            let m = zs.iter().sum::<f64>() / zs.len() as f64;
            let sd =
                (zs.iter().map(|z| (z - m).powi(2)).sum::<f64>() / (zs.len() - 1) as f64).sqrt();
            println!(
                "budget {budget}, noise {lo}..{hi}: coverage {covered}/{trials}, \
                 z mean {m:.3} sd {sd:.3}"
            );
        }
    }

    /// The simulation table of docs/estimator.md:
    /// `cargo test --release -p pagesift-core --lib estimate::tests::simulation_table -- --ignored --nocapture`
    #[test]
    #[ignore]
    fn simulation_table() {
        println!(
            "| population | units | budget | truth | mean estimate | bias | RMSE | mean 95 % half-width | coverage |"
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
        let show = |name: &str, p: &Pop, budget: u64, trials: u64, sparse: bool| {
            let (_, tot) = p.truth();
            let (mut cov, mut sum, mut w, mut sq) = (0, 0.0, 0.0, 0.0);
            for seed in 0..trials {
                let e = if sparse {
                    run_sparse(p, budget, seed)
                } else {
                    p.run(budget, seed).0
                };
                cov += e.total.saving.contains(tot[0]) as u32;
                sum += e.total.saving.value;
                sq += (e.total.saving.value - tot[0]).powi(2);
                w += e.total.saving.width();
            }
            let t = trials as f64;
            let pct = |x: f64| 100.0 * x / tot[0];
            println!(
                "| {name} | {} | {budget} | {:.0} | {:.0} | {:+.1} % | {:.1} % | {:.1} % | {cov}/{trials} |",
                p.units(),
                tot[0],
                sum / t,
                pct(sum / t - tot[0]),
                pct((sq / t).sqrt()),
                pct(w / t / 2.0)
            );
        };
        show(
            "mixed (30 % runs of 16 contents)",
            &mixed(65_536, 0.3, 5),
            8_000,
            200,
            false,
        );
        show(
            "mixed (30 % runs of 16 contents)",
            &mixed(65_536, 0.3, 5),
            2_000,
            200,
            false,
        );
        show(
            "mixed (30 % runs of 16 contents)",
            &mixed(262_144, 0.3, 5),
            30_000,
            50,
            false,
        );
        show(
            "static-mixed (identical + distinct)",
            &static_mixed(65_536, 65_536),
            10_000,
            100,
            false,
        );
        show(
            "fork family (3 children, 25 % rewritten)",
            &fork_family(65_536, 3, 0.25, 3),
            25_000,
            50,
            true,
        );
        show(
            "fork family (3 children, 25 % rewritten)",
            &fork_family(65_536, 3, 0.25, 3),
            8_000,
            50,
            true,
        );
        let mut p = Pop::new();
        let contents: Vec<u64> = (0..40_000u64).map(|i| i % 20_000).collect();
        p.region(0, 1, 0, 40_000, &contents);
        show("pairs at unrelated offsets", &p, 4_000, 20, false);
        show("pairs at unrelated offsets", &p, 20_000, 20, false);
        // Mid multiplicity: duplicated runs cycle through 4096 contents (m ≈ 5).
        let mut rng = 7u64;
        let contents: Vec<u64> = (0..65_536 / 16)
            .flat_map(|r| {
                rng = mix64(rng.wrapping_add(0x9e37_79b9_7f4a_7c15));
                let dup = ((rng >> 11) as f64 / (1u64 << 53) as f64) < 0.3;
                (0..16u64).map(move |j| {
                    if dup {
                        (r as u64 * 16 + j) % 4096
                    } else {
                        1_000_000 + r as u64 * 16 + j
                    }
                })
            })
            .collect();
        let mut p = Pop::new();
        p.region(0, 1, 0, 4096, &contents);
        show("mid multiplicity (m ≈ 5, scattered)", &p, 8_000, 40, false);
        show("mid multiplicity (m ≈ 5, scattered)", &p, 20_000, 40, false);
        // One small region, its twins scattered in a big one.
        let mut p = Pop::new();
        p.region(0, 1, 0, 4096, &(0..2000u64).collect::<Vec<_>>());
        let big: Vec<u64> = (0..60_000u64)
            .map(|i| if i % 30 == 0 { i / 30 } else { 1_000_000 + i })
            .collect();
        p.region(1, 2, 100, 4096, &big);
        show(
            "small region, twins scattered in a big one",
            &p,
            8_000,
            40,
            false,
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn full_budget_is_exact_for_any_population(
            regions in proptest::collection::vec(
                (0u32..4, proptest::collection::vec(0u64..40, 1..200), 1usize..64), 1..8),
            seed: u64,
        ) {
            let mut p = Pop::new();
            for (r, (owner, contents, chunk)) in regions.iter().enumerate() {
                p.region(r as u32, *owner, 100 * r as u32, *chunk, contents);
            }
            let (e, _) = p.run(p.units(), seed);
            assert_exact(&e, &p);
        }

        #[test]
        fn intervals_are_ordered_and_within_the_frames(
            contents in proptest::collection::vec(0u64..300, 100..3000),
            budget in 16u64..2000,
            seed: u64,
        ) {
            let mut p = Pop::new();
            let half = contents.len() / 2;
            p.region(0, 1, 0, 256, &contents[..half]);
            p.region(1, 2, 50, 256, &contents[half..]);
            let (e, _) = p.run(budget, seed);
            prop_assert!(e.total.sampled <= budget.max(16));
            for d in e.regions.iter().chain(std::iter::once(&e.total)) {
                for iv in [d.saving, d.dup_in_region, d.dup_in_process, d.dup_across] {
                    prop_assert!(iv.low <= iv.value && iv.value <= iv.high, "{:?}", iv);
                    prop_assert!(iv.low >= 0.0 && iv.high <= d.frames as f64, "{:?}", iv);
                }
            }
            // Verified twins bound the total saving from below, and floor
            // the interval's low end. (The low end itself may exceed the
            // truth: it is a 95 % interval's. Seed ea96c252… in
            // proptest-regressions gave a low of 1335.018 against a true
            // 1335 pages, 0.018 above, with the floor below both.)
            let (_, tot) = p.truth();
            prop_assert!(e.verified_saving <= tot[0] + 1e-9, "{} against {}", e.verified_saving, tot[0]);
            prop_assert!(
                e.total.saving.low + 1e-9 >= e.verified_saving.min(e.total.saving.value),
                "{:?} under the verified {}", e.total.saving, e.verified_saving
            );
        }
    }
}
