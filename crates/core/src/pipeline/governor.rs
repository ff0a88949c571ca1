//! CPU governors: how much CPU each ladder level may use, and how that
//! becomes a number of pages per wake-up (UKSM §5.3 and §7).
//!
//! ## The algorithm
//!
//! The scanner runs in a sleep–scan cycle: it sleeps `T_s`, then scans. A
//! level `l` with CPU share `p_l` (a fraction of one core) may therefore be
//! active for `T_s · p/(1-p)` per wake-up, because that active time `A`
//! gives `A / (A + T_s) = p`. At an estimated cost of `s` ns per sampled
//! page that is
//!
//! ```text
//! pages per wake-up  = T_s · p / (s · (1 - p))           (§5.3)
//! sampling interval  = L_l · s / (t_l · p), at least 1     (§5.3)
//! ```
//!
//! where `L_l` is the number of pages on level `l` and `t_l` the time one
//! sampling round over the level should take: in `t_l` at share `p` the
//! scanner can sample `n = t_l · p / s` pages, so it samples one page in
//! every `L_l / n`. A *governor* fixes `p_l` and `t_l` for every level.
//!
//! ## Where the numbers come from
//!
//! Two sources disagree in detail, so both are kept and labelled.
//!
//! *The paper (§7)*: Full may use up to 95 % CPU and finishes a global
//! sampling round in 2 s; each step from Full to Low doubles the round time
//! and halves the top CPU; Quiet tops out at 1 % with a round of up to 20 s.
//! The bottom level uses 0.2 %, the top level the governor's maximum, each
//! intermediate level half the one above, and the per-level round times
//! are "evenly derived" from the global round time. §5.2 defines the global
//! round time as the sum of the levels' round times.
//!
//! *The released code* (`uksm_cpu_preset` in UKSM's `uksm.c`): a four-rung table of
//! CPU ratios and round times (`cover_msecs`):
//!
//! | governor | rung CPU shares (0..3)         | rung round times (ms) | max CPU |
//! |----------|--------------------------------|-----------------------|---------|
//! | full     | 0.2 %, 0.4 %, 23.75 %, 95 %    | 1000, 500, 200, 50    | 95 %    |
//! | medium   | 0.2 %, 0.3 %, 12.5 %, 50 %     | 1000, 500, 400, 100   | 50 %    |
//! | low      | 0.1 %, 0.2 %, 10 %, 20 %       | 1500, 1000, 1000, 250 | 20 %    |
//! | quiet    | 0.1 %, 0.2 %, 0.4 %, 0.75 %    | 2000, 1000, 1000, 1000| 1 %     |
//!
//! Reconciled as follows:
//! - **4 levels** (the default) use the code's table exactly: it is what
//!   was released and measured, and the paper's prose describes it only
//!   roughly (its round-time sums are 1.75, 2, 3.75 and 5 s, against the
//!   paper's 2, 4, 8 and 20 s; its caps are 95/50/20/1 % against the
//!   paper's 95/47.5/23.75/1 %).
//! - **Any other level count** is derived by the paper's rule: bottom
//!   0.2 %, top = the governor's cap, intermediate levels halving downwards
//!   from the top (never below the bottom's 0.2 %), every level's round
//!   time = the paper's global round time / N (so the levels' times sum to
//!   it, §5.2).
//! - The cap ([`GovernorParams::max_cpu`]) is the code's for every N
//!   (95, 50, 20, 1 %); the global round times are the paper's
//!   (2, 4, 8, 20 s) because the code has no single such number.
//! - A governor carries its cap, as in the code, where choosing a governor
//!   overwrites `max_cpu_percentage` (quirk §9.6). Quiet's 1 % is below the
//!   10 % the sysfs store would accept; it is kept, being the paper's and
//!   the preset's number.
//!
//! ## Per-page cost
//!
//! `s` is measured, not configured: [`CostEma`] keeps the code's
//! exponential moving average of the scanner's CPU time per sampled page
//! (`ema()` and `uksm_calc_scan_pages` in `uksm.c`).

use crate::Nanos;
use std::fmt;
use std::str::FromStr;

/// Nanoseconds in a millisecond.
const MS: Nanos = 1_000_000;

/// Bottom level's CPU share for derived ladders (paper §7: "0.2% should be
/// acceptable for general systems").
pub const BOTTOM_CPU_SHARE: f64 = 0.002;

/// Fewest samples a level round may take, however small its budget
/// (`RUNG_SAMPLED_MIN = 3` in `uksm.c`): a round always looks at a few
/// pages of its level.
pub const MIN_ROUND_SAMPLES: u64 = 3;

/// Per-page cost the estimate starts from and returns to on reset, in ns
/// (`UKSM_PAGE_TIME_DEFAULT = 500` in `uksm.c`).
pub const DEFAULT_PAGE_NS: f64 = 500.0;

/// Smallest per-page cost the arithmetic accepts, in ns. Sampling a page
/// costs far more than this; the floor only keeps divisions finite.
pub const MIN_PAGE_NS: f64 = 1.0;

/// The default sleep between wake-ups (UKSM's `sleep_millisecs = 100`).
pub const DEFAULT_SLEEP: Nanos = 100 * MS;

/// Longest sleep between wake-ups: the code caps `uksm_sleep_real` at one
/// second for responsiveness, and `sleep_millisecs` accepts 0..1000.
pub const MAX_SLEEP: Nanos = 1000 * MS;

/// Units of the code's CPU ratios: 1/10000 of one CPU (`TIME_RATIO_SCALE`).
const RATIO_SCALE: f64 = 10_000.0;

/// Relative slack when turning a computed count into an integer: shares
/// such as 0.95 are not exact in binary, and `0.95 / 0.05` must give 19,
/// not 18.999…, or the worked example loses a page.
const FLOOR_SLACK: f64 = 1e-9;

/// How aggressively pagesift scans (UKSM §7). Names follow the kernel's
/// `cpu_governor` file.
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Governor {
    /// Up to 95 % of a core; the most responsive, UKSM's default.
    #[default]
    Full,
    /// Up to 50 % of a core (paper: half of Full's).
    Medium,
    /// Up to 20 % of a core (paper: a quarter of Full's).
    Low,
    /// Up to 1 % of a core, for battery-powered, mostly static systems.
    Quiet,
}

/// The released code's preset for one governor (`uksm_cpu_preset`,
/// uksm.c:L527-542): CPU ratios in 1/10000 of a CPU, where a
/// negative `-r` means `r/10000` of `max_cpu` (`MAX/n` in sysfs), round
/// times in ms, and the cap in percent.
struct ReleasedPreset {
    cpu_ratio: [i32; 4],
    cover_ms: [u64; 4],
    max_cpu_percent: u32,
}

impl ReleasedPreset {
    /// `rung_real_ratio` (uksm.c:L4291-4304): a relative ratio is scaled by
    /// the cap, and a result of 0 is forced to 1.
    fn real_ratio(&self, rung: usize) -> u32 {
        let r = self.cpu_ratio[rung];
        let real = if r > 0 {
            r as u32
        } else {
            r.unsigned_abs() * self.max_cpu_percent / 100
        };
        real.max(1)
    }
}

impl Governor {
    /// All governors, from the most to the least aggressive.
    pub const ALL: [Governor; 4] = [
        Governor::Full,
        Governor::Medium,
        Governor::Low,
        Governor::Quiet,
    ];

    /// The lowercase name used in configs, on the command line and in
    /// UKSM's sysfs.
    pub fn name(self) -> &'static str {
        match self {
            Governor::Full => "full",
            Governor::Medium => "medium",
            Governor::Low => "low",
            Governor::Quiet => "quiet",
        }
    }

    fn released(self) -> ReleasedPreset {
        // uksm.c:L527-542.
        match self {
            Governor::Full => ReleasedPreset {
                cpu_ratio: [20, 40, -2500, -10000],
                cover_ms: [1000, 500, 200, 50],
                max_cpu_percent: 95,
            },
            Governor::Medium => ReleasedPreset {
                cpu_ratio: [20, 30, -2500, -10000],
                cover_ms: [1000, 500, 400, 100],
                max_cpu_percent: 50,
            },
            Governor::Low => ReleasedPreset {
                cpu_ratio: [10, 20, -5000, -10000],
                cover_ms: [1500, 1000, 1000, 250],
                max_cpu_percent: 20,
            },
            Governor::Quiet => ReleasedPreset {
                cpu_ratio: [10, 20, 40, 75],
                cover_ms: [2000, 1000, 1000, 1000],
                max_cpu_percent: 1,
            },
        }
    }

    /// The governor's CPU cap as a fraction of one core: the code's
    /// `max_cpu_percentage` preset (95, 50, 20, 1 %). The paper
    /// says 95 % halving per step (47.5, 23.75 %) and 1 % for Quiet.
    pub fn max_cpu(self) -> f64 {
        f64::from(self.released().max_cpu_percent) / 100.0
    }

    /// The paper's global sampling round time (§7): 2 s for Full, doubling
    /// per step to Low (4, 8 s), and "up to 20 s" for Quiet.
    pub fn global_round_time(self) -> Nanos {
        match self {
            Governor::Full => 2000 * MS,
            Governor::Medium => 4000 * MS,
            Governor::Low => 8000 * MS,
            Governor::Quiet => 20_000 * MS,
        }
    }

    /// Per-level CPU shares and round times for a ladder of `levels`
    /// levels (index 0 = bottom). Four levels give the released code's
    /// table; any other count is derived by the paper's §7 rule (see the
    /// module header). `levels == 0` gives no levels.
    pub fn params(self, levels: usize) -> GovernorParams {
        let max_cpu = self.max_cpu();
        let levels = if levels == 4 {
            let preset = self.released();
            (0..4)
                .map(|rung| LevelBudget {
                    cpu_share: f64::from(preset.real_ratio(rung)) / RATIO_SCALE,
                    round_time: preset.cover_ms[rung] * MS,
                })
                .collect()
        } else {
            derived_levels(max_cpu, self.global_round_time(), levels)
        };
        GovernorParams { max_cpu, levels }
    }
}

/// The paper's §7 rule for `n` levels: bottom 0.2 %, top `max_cpu`, each
/// intermediate level half the one above it but not below the bottom, and
/// an equal share of the global round time each.
fn derived_levels(max_cpu: f64, global_round: Nanos, n: usize) -> Vec<LevelBudget> {
    if n == 0 {
        return Vec::new();
    }
    let round_time = global_round / n as u64;
    let mut shares = vec![0.0; n];
    shares[n - 1] = max_cpu;
    for l in (0..n - 1).rev() {
        shares[l] = if l == 0 {
            BOTTOM_CPU_SHARE
        } else {
            (shares[l + 1] / 2.0).max(BOTTOM_CPU_SHARE)
        };
    }
    // With one level, that level is both bottom and top; the governor's
    // cap wins because the governor is the operator's explicit choice.
    shares
        .into_iter()
        .map(|cpu_share| LevelBudget {
            cpu_share,
            round_time,
        })
        .collect()
}

impl fmt::Display for Governor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A governor name that is not one of full, medium, low or quiet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseGovernorError(pub String);

impl fmt::Display for ParseGovernorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown governor `{}`: expected one of full, medium, low, quiet",
            self.0
        )
    }
}

impl std::error::Error for ParseGovernorError {}

impl FromStr for Governor {
    type Err = ParseGovernorError;

    /// Accepts the lowercase names, ignoring ASCII case and surrounding
    /// whitespace (so `echo full >` style input works).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim();
        Governor::ALL
            .into_iter()
            .find(|g| g.name().eq_ignore_ascii_case(t))
            .ok_or_else(|| ParseGovernorError(s.to_string()))
    }
}

/// One level's budget.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LevelBudget {
    /// CPU share as a fraction of one core (0.002 = 0.2 %).
    pub cpu_share: f64,
    /// Target time for one sampling round over the level (`t_l`).
    pub round_time: Nanos,
}

/// A governor's budgets for a ladder of a given height.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct GovernorParams {
    /// The governor's CPU cap as a fraction of one core.
    pub max_cpu: f64,
    /// One budget per level, index 0 = bottom.
    pub levels: Vec<LevelBudget>,
}

impl GovernorParams {
    /// Each level's page quota for one wake-up after sleeping `sleep`, at
    /// `per_page_ns` per sampled page ([`pages_per_wakeup`]).
    pub fn wakeup_budgets(&self, sleep: Nanos, per_page_ns: f64) -> Vec<u64> {
        self.levels
            .iter()
            .map(|l| pages_per_wakeup(l.cpu_share, sleep, per_page_ns))
            .collect()
    }

    /// Each level's sampling interval for the given level sizes
    /// ([`sampling_interval`]). Missing sizes count as empty levels.
    pub fn intervals(&self, level_pages: &[u64], per_page_ns: f64) -> Vec<u64> {
        self.levels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let pages = level_pages.get(i).copied().unwrap_or(0);
                sampling_interval(pages, per_page_ns, l.round_time, l.cpu_share)
            })
            .collect()
    }

    /// The largest share of any level: the share the whole scanner stays
    /// under when only that level has work.
    pub fn top_share(&self) -> f64 {
        self.levels.iter().map(|l| l.cpu_share).fold(0.0, f64::max)
    }
}

/// Floors a non-negative count, forgiving binary rounding just below an
/// integer and saturating at `u64::MAX`.
fn floor_count(x: f64) -> u64 {
    if x.is_nan() || x <= 0.0 {
        return 0;
    }
    // `as` saturates at u64::MAX for huge values and infinity.
    (x * (1.0 + FLOOR_SLACK)).floor() as u64
}

/// §5.3: the sampling interval of a level of `level_pages` pages whose
/// rounds should take `round_time` at `cpu_share` of a core and
/// `per_page_ns` per page: `L_l · s / (t_l · p)`, at least 1.
///
/// As in the code (`uksm_calc_rung_step`) the target sample
/// count `t_l · p / s` is at least [`MIN_ROUND_SAMPLES`], and a round time
/// of 0 means "every page" (interval 1).
pub fn sampling_interval(
    level_pages: u64,
    per_page_ns: f64,
    round_time: Nanos,
    cpu_share: f64,
) -> u64 {
    if round_time == 0 {
        return 1;
    }
    let s = per_page_ns.max(MIN_PAGE_NS);
    let p = if cpu_share > 0.0 {
        cpu_share.min(1.0)
    } else {
        0.0
    };
    let samples = floor_count(round_time as f64 * p / s).max(MIN_ROUND_SAMPLES);
    (level_pages / samples).max(1)
}

/// §5.3: pages a level may sample in one wake-up after sleeping `sleep`:
/// `T_s · p / (s · (1 - p))`, rounded down, so the CPU the level uses,
/// `pages · s / (T_s + pages · s)`, stays at or below `cpu_share`.
///
/// A share of 0 (or NaN) gives 0 pages; a share of 1 or more gives
/// `u64::MAX` (no limit).
///
/// The code computes the same quantity in integer arithmetic
/// (`cpu_ratio_to_nsec`: `1000 · sleep_us / (10000 - r) · r`) and
/// truncates the quotient before multiplying, so it can come out a few
/// pages lower: for Full's rung 2 at 100 ms and 500 ns/page it gives
/// 62 291 where the exact formula gives 62 295. pagesift uses the exact
/// formula.
pub fn pages_per_wakeup(cpu_share: f64, sleep: Nanos, per_page_ns: f64) -> u64 {
    if cpu_share.is_nan() || cpu_share <= 0.0 {
        return 0;
    }
    if cpu_share >= 1.0 {
        return u64::MAX;
    }
    let s = per_page_ns.max(MIN_PAGE_NS);
    let active_ns = sleep as f64 * cpu_share / (1.0 - cpu_share);
    floor_count(active_ns / s)
}

/// The sleep that keeps the duty cycle at `cpu_share` after `active_ns` of
/// scanning: `active · (1 - p) / p`, rounded up.
///
/// The code uses this twice: to lengthen the sleep when the
/// bottom level could not afford even one page per period
/// (`active_ns` = one page's cost, at the bottom's share), and after a
/// burst, to sleep long enough for the largest share that scanned (then
/// capped at [`MAX_SLEEP`] by the caller). A share of 0 gives `u64::MAX`,
/// a share of 1 or more gives 0.
pub fn sleep_for_share(active_ns: f64, cpu_share: f64) -> Nanos {
    if cpu_share.is_nan() || cpu_share <= 0.0 {
        return Nanos::MAX;
    }
    if cpu_share >= 1.0 || active_ns.is_nan() || active_ns <= 0.0 {
        return 0;
    }
    // `as` saturates.
    (active_ns * (1.0 - cpu_share) / cpu_share).ceil() as Nanos
}

/// Weight of the newest measurement in the per-page cost average
/// (`EMA_ALPHA 20` in `uksm.c`).
pub const EMA_ALPHA: f64 = 0.20;

/// A measurement more than this many times the average is treated as a
/// burst: the average only doubles (the code's "binary approach to avoid
/// runaway").
pub const EMA_RUNAWAY_FACTOR: f64 = 10.0;

/// An average above this many ns is discarded and the default restored
/// (as the code does).
pub const EMA_RESET_ABOVE_NS: f64 = 100_000.0;

/// The average is reset to the default every this many evaluation rounds,
/// so a stale estimate cannot persist forever (as the code does).
pub const EMA_RESET_ROUNDS: u64 = 256;

/// Exponential moving average of the scanner's CPU time per sampled page,
/// in ns: the `s` of every budget (the code's `ema_per_page_time`).
///
/// The caller measures the CPU time of a batch (thread CPU time, not wall
/// time) and divides it by the pages sampled in that batch.
///
/// Differs from the code on purpose in one place: the code resets the
/// average in *every* batch while `eval_round % 256 == 0` (which pins it at
/// 500 ns for the whole first round); here the reset happens once, when
/// the 256th round ends ([`CostEma::eval_round_finished`]).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CostEma {
    value: f64,
    eval_rounds: u64,
}

impl Default for CostEma {
    fn default() -> Self {
        Self::new()
    }
}

impl CostEma {
    /// Starts at [`DEFAULT_PAGE_NS`].
    pub fn new() -> Self {
        CostEma {
            value: DEFAULT_PAGE_NS,
            eval_rounds: 0,
        }
    }

    /// Folds in one batch's measured cost per page and returns the new
    /// average. Non-finite or negative measurements are ignored.
    ///
    /// `ema = 0.2 · cur + 0.8 · last`, except that a measurement over 10×
    /// the average only doubles it, and an average above 100 µs is reset
    /// to 500 ns (uksm.c `ema()` and `uksm_calc_scan_pages`).
    pub fn update(&mut self, ns_per_page: f64) -> f64 {
        if !ns_per_page.is_finite() || ns_per_page < 0.0 {
            return self.value;
        }
        let last = self.value;
        let next = if ns_per_page > EMA_RUNAWAY_FACTOR * last {
            2.0 * last
        } else {
            EMA_ALPHA * ns_per_page + (1.0 - EMA_ALPHA) * last
        };
        self.value = if next > EMA_RESET_ABOVE_NS {
            DEFAULT_PAGE_NS
        } else {
            // The code guards a zero average by taking the next sample
            // whole; a floor does the same job without a special case.
            next.max(MIN_PAGE_NS)
        };
        self.value
    }

    /// The current estimate in ns per page.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// Restores the default estimate.
    pub fn reset(&mut self) {
        self.value = DEFAULT_PAGE_NS;
    }

    /// Tells the average an evaluation round (all levels' rounds) ended;
    /// every [`EMA_RESET_ROUNDS`]th call resets it. Returns whether it did.
    pub fn eval_round_finished(&mut self) -> bool {
        self.eval_rounds += 1;
        if self.eval_rounds.is_multiple_of(EMA_RESET_ROUNDS) {
            self.reset();
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The code's integer `cpu_ratio_to_nsec` then `/ ema` (uksm.c
    /// L4284-4288, L4337-4343), to show where its integer order differs.
    fn released_pages(ratio: u64, sleep_us: u64, ema_ns: u64) -> u64 {
        1000 * sleep_us / (10_000 - ratio) * ratio / ema_ns
    }

    #[test]
    fn full_matches_the_released_table() {
        let p = Governor::Full.params(4);
        let shares: Vec<f64> = p.levels.iter().map(|l| l.cpu_share).collect();
        assert_eq!(shares, vec![0.002, 0.004, 0.2375, 0.95]);
        let times: Vec<Nanos> = p.levels.iter().map(|l| l.round_time / MS).collect();
        assert_eq!(times, vec![1000, 500, 200, 50]);
        assert_eq!(p.max_cpu, 0.95);
    }

    #[test]
    fn every_released_preset_real_ratios() {
        // The real ratios the released presets give (negative ratios
        // resolved against the cap).
        let expect: [(Governor, [f64; 4], f64); 4] = [
            (Governor::Full, [0.002, 0.004, 0.2375, 0.95], 0.95),
            (Governor::Medium, [0.002, 0.003, 0.125, 0.5], 0.5),
            (Governor::Low, [0.001, 0.002, 0.1, 0.2], 0.2),
            (Governor::Quiet, [0.001, 0.002, 0.004, 0.0075], 0.01),
        ];
        for (g, shares, max) in expect {
            let p = g.params(4);
            let got: Vec<f64> = p.levels.iter().map(|l| l.cpu_share).collect();
            assert_eq!(got, shares.to_vec(), "{g}");
            assert_eq!(p.max_cpu, max, "{g}");
            // No level exceeds the cap.
            assert!(p.top_share() <= p.max_cpu, "{g}");
        }
        let low = Governor::Low.params(4);
        let times: Vec<Nanos> = low.levels.iter().map(|l| l.round_time / MS).collect();
        assert_eq!(times, vec![1500, 1000, 1000, 250]);
    }

    #[test]
    fn worked_example_full_100ms_500ns() {
        // "full", sleep 100 ms, 500 ns/page.
        let budgets = Governor::Full.params(4).wakeup_budgets(100 * MS, 500.0);
        // The exact §5.3 formula; the code's integer order gives 62 291
        // for rung 2, see below.
        assert_eq!(budgets, vec![400, 803, 62_295, 3_800_000]);
        let released: Vec<u64> = [20, 40, 2375, 9500]
            .into_iter()
            .map(|r| released_pages(r, 100_000, 500))
            .collect();
        assert_eq!(released, vec![400, 803, 62_291, 3_800_000]);
        // The two differ only by the code's truncation, and the exact
        // figure is the larger one: the code under-spends slightly.
        for (exact, code) in budgets.iter().zip(&released) {
            assert!(exact >= code && exact - code <= 4, "{exact} vs {code}");
        }
    }

    #[test]
    fn paper_section7_relations() {
        // Global round doubles from Full to Low; Quiet is 20 s.
        let t: Vec<Nanos> = Governor::ALL
            .iter()
            .map(|g| g.global_round_time() / MS)
            .collect();
        assert_eq!(t, vec![2000, 4000, 8000, 20_000]);
        // Top CPU: 95 % for Full, 1 % for Quiet; decreasing in between.
        assert_eq!(Governor::Full.max_cpu(), 0.95);
        assert_eq!(Governor::Quiet.max_cpu(), 0.01);
        let caps: Vec<f64> = Governor::ALL.iter().map(|g| g.max_cpu()).collect();
        assert!(caps.windows(2).all(|w| w[0] > w[1]));
        // The code's round times sum to roughly the paper's for Full.
        let sum: Nanos = Governor::Full
            .params(4)
            .levels
            .iter()
            .map(|l| l.round_time)
            .sum();
        assert_eq!(sum / MS, 1750);
    }

    #[test]
    fn derived_ladders_follow_the_paper_rule() {
        let p = Governor::Full.params(5);
        let shares: Vec<f64> = p.levels.iter().map(|l| l.cpu_share).collect();
        assert_eq!(shares, vec![0.002, 0.11875, 0.2375, 0.475, 0.95]);
        assert!(p.levels.iter().all(|l| l.round_time == 400 * MS));
        let p = Governor::Full.params(2);
        let shares: Vec<f64> = p.levels.iter().map(|l| l.cpu_share).collect();
        assert_eq!(shares, vec![0.002, 0.95]);
        assert!(p.levels.iter().all(|l| l.round_time == 1000 * MS));
        // Quiet halves below the bottom's share: floored at 0.2 %.
        let p = Governor::Quiet.params(6);
        let shares: Vec<f64> = p.levels.iter().map(|l| l.cpu_share).collect();
        assert_eq!(shares, vec![0.002, 0.002, 0.002, 0.0025, 0.005, 0.01]);
        let one = Governor::Low.params(1);
        assert_eq!(one.levels.len(), 1);
        assert_eq!(one.levels[0].cpu_share, 0.2);
        assert_eq!(one.levels[0].round_time, 8000 * MS);
        assert!(Governor::Full.params(0).levels.is_empty());
    }

    #[test]
    fn names_parse_display_and_serde() {
        for g in Governor::ALL {
            assert_eq!(g.to_string().parse::<Governor>().unwrap(), g);
            let json = serde_json::to_string(&g).unwrap();
            assert_eq!(json, format!("\"{}\"", g.name()));
            assert_eq!(serde_json::from_str::<Governor>(&json).unwrap(), g);
        }
        assert_eq!(" Quiet\n".parse::<Governor>().unwrap(), Governor::Quiet);
        let err = "turbo".parse::<Governor>().unwrap_err();
        assert!(err.to_string().contains("turbo"), "{err}");
        assert!(serde_json::from_str::<Governor>("\"Full\"").is_err());
        assert_eq!(Governor::default(), Governor::Full);
    }

    #[test]
    fn sampling_interval_examples() {
        // Full rung 0: 1 s at 0.2 % and 500 ns is 4000 samples a round,
        // so a 4 M-page level is sampled every 1000 pages.
        assert_eq!(sampling_interval(4_000_000, 500.0, 1000 * MS, 0.002), 1000);
        // Top rung: 50 ms at 95 % is 95 000 samples.
        assert_eq!(sampling_interval(950_000, 500.0, 50 * MS, 0.95), 10);
        // A level smaller than the round's samples is read whole.
        assert_eq!(sampling_interval(100, 500.0, 1000 * MS, 0.95), 1);
        assert_eq!(sampling_interval(0, 500.0, 1000 * MS, 0.95), 1);
        // Round time 0 means every page (the code's cover_msecs = 0).
        assert_eq!(sampling_interval(1 << 30, 500.0, 0, 0.002), 1);
        // A budget too small for 3 samples still takes 3.
        assert_eq!(sampling_interval(300, 1e9, MS, 0.001), 100);
        assert_eq!(sampling_interval(300, 500.0, MS, 0.0), 100);
    }

    #[test]
    fn pages_per_wakeup_edges() {
        assert_eq!(pages_per_wakeup(0.0, DEFAULT_SLEEP, 500.0), 0);
        assert_eq!(pages_per_wakeup(f64::NAN, DEFAULT_SLEEP, 500.0), 0);
        assert_eq!(pages_per_wakeup(1.0, DEFAULT_SLEEP, 500.0), u64::MAX);
        assert_eq!(pages_per_wakeup(0.5, 0, 500.0), 0);
        // 50 % for 1 ms at 1 µs/page is 1000 pages.
        assert_eq!(pages_per_wakeup(0.5, MS, 1000.0), 1000);
        // A nonsensical per-page cost is floored at 1 ns, not divided by.
        assert_eq!(pages_per_wakeup(0.5, 1000, 0.0), 1000);
    }

    #[test]
    fn sleep_for_share_examples() {
        // 1 ms of work at 50 % needs 1 ms of sleep; at 20 % 4 ms.
        assert_eq!(sleep_for_share(1e6, 0.5), MS);
        assert_eq!(sleep_for_share(1e6, 0.2), 4 * MS);
        // The code's "bottom rung cannot afford one page" case: 500 ns at
        // 0.1 % needs 499.5 µs of sleep.
        assert_eq!(sleep_for_share(500.0, 0.001), 499_500);
        assert_eq!(sleep_for_share(1e6, 0.0), Nanos::MAX);
        assert_eq!(sleep_for_share(1e6, 1.0), 0);
    }

    #[test]
    fn cost_ema_rules() {
        let mut e = CostEma::new();
        assert_eq!(e.value(), 500.0);
        // 20 % of the new value, 80 % of the old.
        assert_eq!(e.update(1000.0), 600.0);
        // A burst over 10x only doubles the estimate.
        assert_eq!(e.update(6001.0), 1200.0);
        // Exactly 10x is not a burst.
        assert_eq!(e.update(12_000.0), 0.2 * 12_000.0 + 0.8 * 1200.0);
        // Garbage is ignored.
        let v = e.value();
        assert_eq!(e.update(f64::NAN), v);
        assert_eq!(e.update(-5.0), v);
        // Zero cost decays towards the floor, never to 0.
        for _ in 0..200 {
            e.update(0.0);
        }
        assert_eq!(e.value(), MIN_PAGE_NS);
        // And recovers from there.
        assert!(e.update(5.0) > MIN_PAGE_NS);
    }

    #[test]
    fn cost_ema_runaway_reset() {
        let mut e = CostEma::new();
        // Doubling from 500: 1000, 2000, ..., 64 000, then 128 000 > 100 µs.
        let mut seen = Vec::new();
        for _ in 0..8 {
            seen.push(e.update(1e9));
        }
        assert_eq!(
            seen,
            vec![
                1000.0, 2000.0, 4000.0, 8000.0, 16_000.0, 32_000.0, 64_000.0, 500.0
            ]
        );
    }

    #[test]
    fn cost_ema_resets_every_256_rounds() {
        let mut e = CostEma::new();
        e.update(2000.0);
        let v = e.value();
        for _ in 0..EMA_RESET_ROUNDS - 1 {
            assert!(!e.eval_round_finished());
        }
        assert_eq!(e.value(), v);
        assert!(e.eval_round_finished());
        assert_eq!(e.value(), DEFAULT_PAGE_NS);
    }

    proptest! {
        /// The budget never lets a level spend more than its share, and is
        /// the largest budget that does not (one page more would exceed it).
        #[test]
        fn budget_cpu_stays_within_share(
            share in 1e-4f64..0.999,
            sleep in 1_000u64..=MAX_SLEEP,
            per_page in 20.0f64..200_000.0,
        ) {
            let pages = pages_per_wakeup(share, sleep, per_page);
            let used = |n: u64| {
                let scan = n as f64 * per_page;
                scan / (sleep as f64 + scan)
            };
            // Float slack: the floor forgives 1e-9 relative rounding.
            prop_assert!(used(pages) <= share * (1.0 + 1e-8),
                "{pages} pages use {} > {share}", used(pages));
            prop_assert!(used(pages + 1) > share * (1.0 - 1e-8),
                "{} pages would still fit in {share}", pages + 1);
        }

        /// Every governor's budgets, at every level count, respect the
        /// level shares and never exceed the governor's cap.
        #[test]
        fn governor_budgets_within_cap(
            g in prop::sample::select(Governor::ALL.to_vec()),
            n in 1usize..8,
            sleep in 1_000u64..=MAX_SLEEP,
            per_page in 20.0f64..200_000.0,
        ) {
            let p = g.params(n);
            prop_assert_eq!(p.levels.len(), n);
            let budgets = p.wakeup_budgets(sleep, per_page);
            for (l, pages) in p.levels.iter().zip(budgets) {
                prop_assert!(l.cpu_share <= p.max_cpu);
                let scan = pages as f64 * per_page;
                prop_assert!(scan / (sleep as f64 + scan) <= l.cpu_share * (1.0 + 1e-8));
            }
            // Shares never decrease going up the ladder.
            prop_assert!(p.levels.windows(2).all(|w| w[0].cpu_share <= w[1].cpu_share));
        }

        /// A round at the computed interval takes at least the target
        /// number of samples (so at least the round time at that share)
        /// and less than twice as many.
        #[test]
        fn interval_gives_the_round_time(
            pages in 0u64..(1 << 36),
            per_page in 20.0f64..200_000.0,
            round_ms in 1u64..20_000,
            share in 1e-4f64..0.99,
        ) {
            let t = round_ms * MS;
            let interval = sampling_interval(pages, per_page, t, share);
            prop_assert!(interval >= 1);
            let target = ((t as f64 * share / per_page) as u64).max(MIN_ROUND_SAMPLES);
            let samples = pages.div_ceil(interval);
            if pages >= target {
                prop_assert!(samples + 1 >= target, "{samples} < {target}");
                prop_assert!(samples <= 2 * target + 1, "{samples} > 2 x {target}");
            } else {
                prop_assert_eq!(interval, 1);
            }
        }
    }
}
