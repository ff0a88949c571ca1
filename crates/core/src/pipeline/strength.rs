//! Adaptive hash strength: the controller that picks how many words of a
//! page the partial hash reads (UKSM §6.1; released code: `rshash_adjust`
//! and `judge_rshash_direction`, uksm.c L3955-4141).
//!
//! # Cost model
//!
//! Everything is counted in one unit: the cost of one word-hash step of
//! [`crate::pipeline::hash::PartialHasher`]. A page hashed at strength `s` costs `s`
//! units, a full-strength hash [`STRENGTH_FULL`] = 1024.
//!
//! * **Profit** (UKSM's `rshash_pos`, `page_hash` L1431-1452): each page
//!   hashed at strength `s` saves `FULL - s` against a full-strength hash
//!   ([`StrengthController::on_hashed`]).
//! * **Penalty** (UKSM's `rshash_neg`, L1678, L1952-1955):
//!   - a *false collision*, equal hashes whose full comparison says the
//!     pages differ: `memcmp_cost + 2 s`, the futile compare plus the two
//!     hashes that did not tell the pages apart
//!     ([`StrengthController::on_false_collision`]);
//!   - computing a page's full-strength key (UKSM's `hash_max`, the
//!     second-level key of a crowded bucket): `FULL - s`, the rest of the
//!     page ([`StrengthController::on_hash_max`]);
//!   - anything else the caller charges ([`StrengthController::on_penalty`]).
//! * **Benefit** of a round = `(profit - penalty) / pages hashed`, the net
//!   units saved per sampled page. It is signed: UKSM clamps it at 0
//!   (`get_current_benefit`, L3943-3953), but after the population changes
//!   every strength near the old one can be a net loss, and a clamp would
//!   make them all look equal, so the probe could not see which is less bad.
//!
//! `memcmp_cost` is the cost of one futile full comparison in hash-step
//! units. UKSM measures it at boot as `FULL * t_memcmp / t_full_hash`
//! (`cal_positive_negative_costs`, L5315-5364);
//! [`StrengthConfig::memcmp_cost_from_timings`] does the same arithmetic for
//! a caller that times the two. pagesift must also *read* the partner page
//! (`process_vm_readv`) before it can compare it, so that read belongs in
//! the cost; see [`StrengthConfig::default`] for the measured figures.
//!
//! # The state machine
//!
//! After every global sampling round the caller calls
//! [`StrengthController::end_round`], which judges the round just measured
//! (at the current strength) and may move the strength for the next one.
//!
//! * **Starting** → after the first round, **Probing** (paper: "After the
//!   first sampling round, the system enters a probing state").
//! * **Probing down** (UKSM `RSHASH_TRYDOWN`). The strength steps down by
//!   `delta`, which doubles 1, 2, 4, …, 32 and stays at 32 (paper; code's
//!   `HASH_STRENGTH_DELTA_MAX = 5`). The best round seen is the *down turn
//!   point*. Rounds whose benefit is below the reference (the benefit where
//!   the probe started) are counted in windows of 5 rounds; at 3 such rounds,
//!   or when the judge says *up* (penalty above 90 % of profit), or at the
//!   minimum strength, the probe reverses: the strength jumps to one above
//!   the starting point and `delta` resets to 1.
//! * **Probing up** (`RSHASH_TRYUP`). The mirror image, counting rounds
//!   below the down turn point's benefit and stopping at 3 of them, when
//!   the judge says *down* (no false collision for 2 rounds) or at the
//!   maximum. The strength is then set to the better turn point.
//! * **Settling** (`RSHASH_PRE_STILL`). One round is measured at the chosen
//!   strength; its benefit becomes the stable reference. If the judge says
//!   *up* in that round, the point is no stable point (see below) and a new
//!   probe starts upward from it.
//! * **Stable** (`RSHASH_STILL`). The strength holds until one of the
//!   paper's three triggers starts a new probe (down first):
//!   1. the round's benefit deviates more than 50 % from the reference;
//!   2. there was no false collision in the last two rounds;
//!   3. 1000 rounds have passed in the stable state.
//!
//! # Where this differs from the released code, and why
//!
//! * The stable state follows the paper: the code instead
//!   needs three consecutive >50 % rounds, takes single slow-start steps
//!   down after three penalty-free rounds and up when the penalty exceeds
//!   90 % of the profit without leaving STILL, and forces a probe at every
//!   global round ≡ 10 (mod 256). Here the strength does not move while
//!   stable; a round without collisions starts a downward probe instead of
//!   one step, and a penalty that swamps the profit shows up as a >50 %
//!   deviation.
//! * The code starts in STILL (`RSHASH_NEW`) and first probes at round 10;
//!   we probe after the first round, as the paper says.
//! * The code's TRYDOWN compares against the benefit recorded on entering
//!   STILL; after a >50 % deviation that value describes a population that
//!   is gone, so we compare against the benefit of the round that started
//!   the probe ("checks if this change results in larger benefit", paper).
//! * "No collisions" means no false collision (the paper's "no memcmp caused
//!   by hash collision"); the code's test is "no penalty at all". The judge
//!   uses the same two-round count as the stable trigger (the code waits
//!   for three).
//! * Two additions that keep the controller from settling at a net loss
//!   when the pages change during a probe (found with the simulation in
//!   `tests/strength_sim.rs`: distinct pages replaced by near-identical ones
//!   while the controller sat at strength 1). Near the old point the
//!   benefit is flat and noisy, so the code's "3 rounds below" stopped every
//!   upward probe within 4 words, and a settling round measured on the new
//!   pages became a stable reference of about -35 per page that no trigger
//!   would leave for up to 1000 rounds. (a) In an upward probe, a round the
//!   judge calls *up* (penalty above 90 % of profit) is not counted as
//!   below. (b) A settling round the judge calls *up* starts a fresh upward
//!   probe (cause [`Trigger::Unsettled`]) instead of entering the stable
//!   state. The code covers the same case by stepping up from STILL
//!   whenever the judge says up; here the three stable triggers stay the
//!   only way out of the stable state.
//! * No loop-back above 1024 words (the code's `HASH_STRENGTH_MAX = 1034`):
//!   the full-strength key is the hash at 1024.

use crate::pipeline::hash::STRENGTH_FULL;

/// Largest probing step, in words (paper: "doubled each time till the max
/// value 32"; code: `HASH_STRENGTH_DELTA_MAX = 5`, a shift).
pub const MAX_DELTA: u32 = 32;
/// Rounds per window in which "below" rounds are counted
/// (`lookup_window_index % 5`, L4020-4141).
const WINDOW_ROUNDS: u32 = 5;
/// "Below" rounds within one window that end a probing direction
/// (`below_count >= 3`).
const BELOW_LIMIT: u32 = 3;
/// The judge says *up* when the penalty exceeds this share of the profit
/// (`current_neg_ratio > 90`, L3955-4012).
const UP_PENALTY_SHARE: f64 = 0.9;

/// Settings of the strength controller.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct StrengthConfig {
    /// Strength of the first round, in words.
    pub initial: u32,
    /// Cost of one futile full-page comparison, in units of one word-hash
    /// step (see the module header).
    pub memcmp_cost: u32,
    /// Lowest strength the controller may choose (at least 1).
    pub min: u32,
    /// Highest strength the controller may choose (at most 1024).
    pub max: u32,
    /// Relative deviation of a stable round's benefit from the stable
    /// reference that starts a new probe (paper §6.1: 50 %).
    pub max_deviation: f64,
    /// Consecutive rounds without a false collision that start a new probe
    /// from the stable state and end an upward probe (paper §6.1: 2).
    pub quiet_rounds: u32,
    /// Rounds in the stable state after which a probe is forced (paper §6.1:
    /// every 1000 sampling rounds).
    pub reprobe_rounds: u32,
}

impl Default for StrengthConfig {
    /// * `initial = 64`: the released code's `FULL >> 4` (L625), not the
    ///   paper's half of full (512). The paper reports strengths "usually
    ///   within 100 words" on real workloads and 2-17 on SPEC CPU2006 (§8.3),
    ///   so 64 starts near where the probe ends and the first probe does not
    ///   pay for hundreds of words per page.
    /// * `memcmp_cost = 1088`. Measured on the development machine (AMD
    ///   EPYC, 2 vCPUs, 2026-11-21, release build): a full-strength
    ///   [`crate::pipeline::hash::PartialHasher::hash`] takes 1.4-1.9 µs, comparing two
    ///   4 KiB pages that differ in the last byte (UKSM's calibration pair)
    ///   88-123 ns, i.e. 53-83 units, and fetching the partner page with
    ///   `process_vm_readv` 1.3-1.6 µs, about one full hash (1024 units).
    ///   1088 = 1024 + 64. Callers that can time these should set it with
    ///   [`StrengthConfig::memcmp_cost_from_timings`].
    /// * `min = 1`, `max = 1024`: one word up to the whole page (the released
    ///   code's range, without its loop-back above 1024).
    /// * `max_deviation = 0.5`, `quiet_rounds = 2`, `reprobe_rounds = 1000`:
    ///   the three triggers of paper §6.1.
    fn default() -> Self {
        StrengthConfig {
            initial: STRENGTH_FULL >> 4,
            memcmp_cost: 1088,
            min: 1,
            max: STRENGTH_FULL,
            max_deviation: 0.5,
            quiet_rounds: 2,
            reprobe_rounds: 1000,
        }
    }
}

/// A [`StrengthConfig`] value that cannot work, naming the key and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StrengthConfigError {
    /// The offending field.
    pub key: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

impl std::fmt::Display for StrengthConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "strength.{}: {}", self.key, self.reason)
    }
}

impl std::error::Error for StrengthConfigError {}

impl StrengthConfig {
    /// `memcmp_cost` from two timings on the same clock, as UKSM computes it
    /// at boot (`FULL * t_memcmp / t_hash`, L5315-5364): `full_hash` is the
    /// time of one full-strength hash, `compare` the time of one futile
    /// comparison (in pagesift including the read of the partner page).
    /// At least 1; a zero `full_hash` gives `u32::MAX`.
    pub fn memcmp_cost_from_timings(full_hash: crate::Nanos, compare: crate::Nanos) -> u32 {
        if full_hash == 0 {
            return u32::MAX;
        }
        let units = u128::from(STRENGTH_FULL) * u128::from(compare) / u128::from(full_hash);
        units.clamp(1, u128::from(u32::MAX)) as u32
    }

    /// Checks every field; the error names the first bad key.
    pub fn validate(&self) -> Result<(), StrengthConfigError> {
        let err = |key, reason: String| Err(StrengthConfigError { key, reason });
        if !(1..=STRENGTH_FULL).contains(&self.min) {
            return err("min", format!("{} is not in 1..={STRENGTH_FULL}", self.min));
        }
        if !(self.min..=STRENGTH_FULL).contains(&self.max) {
            return err(
                "max",
                format!(
                    "{} is not in min..={STRENGTH_FULL} ({}..={STRENGTH_FULL})",
                    self.max, self.min
                ),
            );
        }
        if !(self.min..=self.max).contains(&self.initial) {
            return err(
                "initial",
                format!(
                    "{} is not in min..=max ({}..={})",
                    self.initial, self.min, self.max
                ),
            );
        }
        if !(self.max_deviation.is_finite() && self.max_deviation > 0.0) {
            return err(
                "max_deviation",
                format!("{} is not a positive number", self.max_deviation),
            );
        }
        if self.quiet_rounds == 0 {
            return err("quiet_rounds", "must be at least 1".into());
        }
        if self.reprobe_rounds == 0 {
            return err("reprobe_rounds", "must be at least 1".into());
        }
        Ok(())
    }

    /// The nearest valid config: strengths clamped into 1..=1024 and
    /// `min <= initial <= max`, bad trigger settings replaced by defaults.
    fn sanitized(mut self) -> Self {
        let d = StrengthConfig::default();
        self.min = self.min.clamp(1, STRENGTH_FULL);
        self.max = self.max.clamp(self.min, STRENGTH_FULL);
        self.initial = self.initial.clamp(self.min, self.max);
        if !(self.max_deviation.is_finite() && self.max_deviation > 0.0) {
            self.max_deviation = d.max_deviation;
        }
        if self.quiet_rounds == 0 {
            self.quiet_rounds = d.quiet_rounds;
        }
        if self.reprobe_rounds == 0 {
            self.reprobe_rounds = d.reprobe_rounds;
        }
        self
    }
}

/// Which way a probe is moving the strength.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Direction {
    /// Fewer words per page (UKSM `RSHASH_TRYDOWN`).
    Down,
    /// More words per page (UKSM `RSHASH_TRYUP`).
    Up,
}

/// Why a probe started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Trigger {
    /// The first round after start-up.
    Start,
    /// A stable round's benefit deviated more than `max_deviation` from the
    /// stable reference.
    Deviation,
    /// No false collision for `quiet_rounds` rounds.
    NoCollisions,
    /// `reprobe_rounds` rounds passed in the stable state.
    Periodic,
    /// Not a stable-state trigger: the point a probe chose lost more than
    /// 90 % of its profit to collisions in the settling round (the pages
    /// changed during the probe), so a new probe continues upward from it.
    Unsettled,
}

/// Where the controller is in its state machine.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub enum ControllerState {
    /// No round measured yet (UKSM `RSHASH_NEW`).
    Starting,
    /// Searching for a better strength.
    Probing {
        direction: Direction,
        /// The size, in words, of the next step in `direction`
        /// (1, 2, 4, …, [`MAX_DELTA`]).
        delta: u32,
        /// What started this probe.
        cause: Trigger,
    },
    /// The strength was set to the best point of the probe; the next round
    /// measures the stable reference (UKSM `RSHASH_PRE_STILL`).
    Settling,
    /// Holding the strength (UKSM `RSHASH_STILL`).
    Stable {
        /// The reference benefit, measured in the settling round.
        benefit: f64,
        /// Rounds measured since entering the stable state.
        rounds: u32,
    },
}

/// What one finished round looked like, for reports and metrics.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct RoundStats {
    /// The strength the round was hashed at.
    pub strength: u32,
    /// Pages hashed.
    pub pages: u64,
    /// Units saved against full-strength hashing.
    pub profit: u64,
    /// Units wasted (false collisions, full-strength keys, other charges).
    pub penalty: u64,
    /// Futile full comparisons.
    pub false_collisions: u64,
    /// `(profit - penalty) / pages`.
    pub benefit: f64,
}

/// What the judge (`judge_rshash_direction`) makes of a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Judgement {
    /// No false collision for `quiet_rounds` rounds: the strength is higher
    /// than the pages need.
    Down,
    /// False collisions eat more than 90 % of the profit.
    Up,
    Hold,
}

/// Bookkeeping of the current (or last) probe.
#[derive(Clone, Copy, Debug)]
struct Probe {
    /// Strength where the probe started (`stable_point`).
    start: u32,
    /// Benefit measured at `start` in the round that started the probe.
    reference: f64,
    /// Best round going down: strength and benefit (`turn_point_down`).
    best_down: (u32, f64),
    /// Best round going up (`turn_point_up`).
    best_up: (u32, f64),
    /// Rounds in this direction (`lookup_window_index`).
    window: u32,
    /// "Below" rounds in the current window (`below_count`).
    below: u32,
}

impl Probe {
    /// A probe starting at strength `s`, whose benefit there is `cur`.
    fn at(s: u32, cur: f64) -> Probe {
        Probe {
            start: s,
            reference: cur,
            best_down: (s, cur),
            best_up: (s, cur),
            window: 0,
            below: 0,
        }
    }
}

/// The adaptive hash-strength controller (see the module header).
#[derive(Clone, Debug)]
pub struct StrengthController {
    config: StrengthConfig,
    strength: u32,
    state: ControllerState,
    probe: Probe,
    // This round's accounting.
    pages: u64,
    profit: u64,
    penalty: u64,
    false_collisions: u64,
    /// Consecutive measured rounds without a false collision.
    quiet: u32,
    rounds: u64,
    last: Option<RoundStats>,
}

impl StrengthController {
    /// A controller at `config.initial`. An invalid config is first moved to
    /// the nearest valid one (strengths clamped into range, bad trigger
    /// settings replaced by their defaults); use
    /// [`StrengthConfig::validate`] to report such input instead.
    pub fn new(config: StrengthConfig) -> Self {
        let config = config.sanitized();
        let s = config.initial;
        StrengthController {
            config,
            strength: s,
            state: ControllerState::Starting,
            probe: Probe {
                start: s,
                reference: 0.0,
                best_down: (s, 0.0),
                best_up: (s, 0.0),
                window: 0,
                below: 0,
            },
            pages: 0,
            profit: 0,
            penalty: 0,
            false_collisions: 0,
            quiet: 0,
            rounds: 0,
            last: None,
        }
    }

    /// The config in effect (after clamping).
    pub fn config(&self) -> &StrengthConfig {
        &self.config
    }

    /// Words per page to hash now.
    pub fn strength(&self) -> u32 {
        self.strength
    }

    /// Where the state machine is.
    pub fn state(&self) -> &ControllerState {
        &self.state
    }

    /// Rounds measured so far (rounds in which no page was hashed do not
    /// count).
    pub fn rounds(&self) -> u64 {
        self.rounds
    }

    /// The last finished round, if any.
    pub fn last_round(&self) -> Option<&RoundStats> {
        self.last.as_ref()
    }

    /// `pages` were hashed at the current strength: profit `FULL - strength`
    /// each.
    pub fn on_hashed(&mut self, pages: u64) {
        let saved = u64::from(STRENGTH_FULL.saturating_sub(self.strength));
        self.pages = self.pages.saturating_add(pages);
        self.profit = self.profit.saturating_add(saved.saturating_mul(pages));
    }

    /// A page's full-strength key was computed: penalty `FULL - strength`,
    /// the words the partial hash had skipped.
    pub fn on_hash_max(&mut self) {
        self.on_penalty(u64::from(STRENGTH_FULL.saturating_sub(self.strength)));
    }

    /// Equal hashes, but the full comparison found different pages:
    /// penalty `memcmp_cost + 2 * strength` (L1952-1955).
    pub fn on_false_collision(&mut self) {
        self.false_collisions = self.false_collisions.saturating_add(1);
        self.on_penalty(u64::from(self.config.memcmp_cost) + 2 * u64::from(self.strength));
    }

    /// Any other cost, in word-hash units.
    pub fn on_penalty(&mut self, units: u64) {
        self.penalty = self.penalty.saturating_add(units);
    }

    /// This round so far: `(profit - penalty) / pages`, 0 before any page.
    pub fn benefit(&self) -> f64 {
        if self.pages == 0 {
            return 0.0;
        }
        (self.profit as f64 - self.penalty as f64) / self.pages as f64
    }

    /// Ends a global sampling round: judges it and returns the new strength
    /// if it changed. A round in which no page was hashed says nothing about
    /// any strength; it is skipped and its charges carry over (as UKSM's
    /// `encode_benefit` returns early).
    pub fn end_round(&mut self) -> Option<u32> {
        if self.pages == 0 {
            return None;
        }
        let before = self.strength;
        let cur = self.benefit();
        if self.false_collisions == 0 {
            self.quiet = self.quiet.saturating_add(1);
        } else {
            self.quiet = 0;
        }
        let judged = self.judge();

        self.state = match self.state.clone() {
            ControllerState::Starting => self.start_probe(cur, Trigger::Start),
            ControllerState::Probing {
                direction: Direction::Down,
                delta,
                cause,
            } => self.probe_down(cur, judged, delta, cause),
            ControllerState::Probing {
                direction: Direction::Up,
                delta,
                cause,
            } => self.probe_up(cur, judged, delta, cause),
            ControllerState::Settling => {
                if judged == Judgement::Up && self.strength < self.config.max {
                    // The chosen point loses most of its profit to
                    // collisions: the pages changed under the probe. It is
                    // no stable point; search upward from here afresh.
                    self.start_probe_up(cur)
                } else {
                    ControllerState::Stable {
                        benefit: cur,
                        rounds: 0,
                    }
                }
            }
            ControllerState::Stable { benefit, rounds } => {
                let rounds = rounds.saturating_add(1);
                let deviation = (cur - benefit).abs() > self.config.max_deviation * benefit.abs();
                if deviation {
                    self.start_probe(cur, Trigger::Deviation)
                } else if self.quiet >= self.config.quiet_rounds {
                    self.start_probe(cur, Trigger::NoCollisions)
                } else if rounds >= self.config.reprobe_rounds {
                    self.start_probe(cur, Trigger::Periodic)
                } else {
                    ControllerState::Stable { benefit, rounds }
                }
            }
        };

        self.last = Some(RoundStats {
            strength: before,
            pages: self.pages,
            profit: self.profit,
            penalty: self.penalty,
            false_collisions: self.false_collisions,
            benefit: cur,
        });
        self.rounds += 1;
        self.pages = 0;
        self.profit = 0;
        self.penalty = 0;
        self.false_collisions = 0;
        (self.strength != before).then_some(self.strength)
    }

    /// `judge_rshash_direction` without its periodic OBSCURE (the stable
    /// state has its own triggers) and with `quiet_rounds` for its "three
    /// zero rounds".
    fn judge(&self) -> Judgement {
        if self.false_collisions == 0 {
            if self.quiet >= self.config.quiet_rounds {
                Judgement::Down
            } else {
                Judgement::Hold
            }
        } else if self.penalty > 0 && self.penalty as f64 > UP_PENALTY_SHARE * self.profit as f64 {
            Judgement::Up
        } else {
            Judgement::Hold
        }
    }

    /// Stable → probing (the STILL/OBSCURE branch): remember where we are
    /// and take the first step down by 1.
    fn start_probe(&mut self, cur: f64, cause: Trigger) -> ControllerState {
        let s = self.strength;
        self.probe = Probe::at(s, cur);
        self.step_down(1);
        ControllerState::Probing {
            direction: Direction::Down,
            delta: 2,
            cause,
        }
    }

    /// Settling → probing up: the settling round's point becomes the start
    /// and the reference of a new probe that begins with a step up by 1.
    fn start_probe_up(&mut self, cur: f64) -> ControllerState {
        let s = self.strength;
        self.probe = Probe::at(s, cur);
        self.strength = s.saturating_add(1).min(self.config.max);
        ControllerState::Probing {
            direction: Direction::Up,
            delta: 2,
            cause: Trigger::Unsettled,
        }
    }

    /// Counts "below" rounds in windows of [`WINDOW_ROUNDS`].
    fn count_window(&mut self) {
        if self.probe.window.is_multiple_of(WINDOW_ROUNDS) {
            self.probe.below = 0;
        }
        self.probe.window += 1;
    }

    /// TRYDOWN: was this round worse than where we started?
    fn probe_down(
        &mut self,
        cur: f64,
        judged: Judgement,
        delta: u32,
        cause: Trigger,
    ) -> ControllerState {
        let s = self.strength;
        self.count_window();
        if cur < self.probe.reference {
            self.probe.below += 1;
        } else if cur > self.probe.best_down.1 {
            self.probe.best_down = (s, cur);
        }
        if self.probe.below >= BELOW_LIMIT || judged == Judgement::Up || s == self.config.min {
            // Reverse: restart one above the starting point, delta back to 1.
            self.strength = self.probe.start.saturating_add(1).min(self.config.max);
            self.probe.window = 0;
            ControllerState::Probing {
                direction: Direction::Up,
                delta: 1,
                cause,
            }
        } else {
            self.step_down(delta);
            ControllerState::Probing {
                direction: Direction::Down,
                delta: (delta * 2).min(MAX_DELTA),
                cause,
            }
        }
    }

    /// TRYUP: was this round worse than the best point going down? A round
    /// the judge calls *up* is no evidence against going up, whatever noise
    /// did to its benefit.
    fn probe_up(
        &mut self,
        cur: f64,
        judged: Judgement,
        delta: u32,
        cause: Trigger,
    ) -> ControllerState {
        let s = self.strength;
        self.count_window();
        if judged != Judgement::Up && cur < self.probe.best_down.1 {
            self.probe.below += 1;
        } else if cur > self.probe.best_up.1 {
            self.probe.best_up = (s, cur);
        }
        if self.probe.below >= BELOW_LIMIT || judged == Judgement::Down || s == self.config.max {
            let (up, down) = (self.probe.best_up, self.probe.best_down);
            self.strength = if up.1 > down.1 { up.0 } else { down.0 };
            ControllerState::Settling
        } else {
            self.strength = s.saturating_add(delta).min(self.config.max);
            ControllerState::Probing {
                direction: Direction::Up,
                delta: (delta * 2).min(MAX_DELTA),
                cause,
            }
        }
    }

    /// `dec_hash_strength`: down by `delta`, never below `min`.
    fn step_down(&mut self, delta: u32) {
        self.strength = self.strength.saturating_sub(delta).max(self.config.min);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A config with a cheap compare, so a test can dial any benefit with
    /// [`round_with`].
    fn config(initial: u32) -> StrengthConfig {
        StrengthConfig {
            initial,
            memcmp_cost: 10,
            ..StrengthConfig::default()
        }
    }

    const PAGES: u64 = 1000;

    /// One round of `PAGES` pages whose benefit is exactly `benefit`, with
    /// one false collision (so the round is not "quiet").
    fn round_with(c: &mut StrengthController, benefit: f64) -> Option<u32> {
        let s = u64::from(c.strength());
        c.on_hashed(PAGES);
        c.on_false_collision();
        let profit = (1024 - s) * PAGES;
        let charged = u64::from(c.config().memcmp_cost) + 2 * s;
        let target = (benefit * PAGES as f64) as i64;
        let extra = profit as i64 - target - charged as i64;
        assert!(extra >= 0, "benefit {benefit} unreachable at strength {s}");
        c.on_penalty(extra as u64);
        assert!((c.benefit() - benefit).abs() < 1e-9);
        c.end_round()
    }

    /// One round without any collision: benefit is the full profit.
    fn quiet_round(c: &mut StrengthController) -> Option<u32> {
        c.on_hashed(PAGES);
        c.end_round()
    }

    fn probing(c: &StrengthController) -> Option<(Direction, u32, Trigger)> {
        match *c.state() {
            ControllerState::Probing {
                direction,
                delta,
                cause,
            } => Some((direction, delta, cause)),
            _ => None,
        }
    }

    /// Drives a fresh controller at `initial` into the stable state at
    /// `initial` with reference benefit `b`.
    fn stable_at(initial: u32, b: f64) -> StrengthController {
        let mut c = StrengthController::new(config(initial));
        round_with(&mut c, b); // start: probe down
        for _ in 0..3 {
            round_with(&mut c, b / 2.0); // below the reference three times
        }
        assert_eq!(probing(&c).map(|p| p.0), Some(Direction::Up));
        for _ in 0..3 {
            round_with(&mut c, b / 2.0); // below the best point going down
        }
        assert_eq!(*c.state(), ControllerState::Settling);
        assert_eq!(c.strength(), initial, "the start point was the best");
        round_with(&mut c, b);
        assert_eq!(
            *c.state(),
            ControllerState::Stable {
                benefit: b,
                rounds: 0
            }
        );
        c
    }

    #[test]
    fn default_config_is_valid_and_cites_its_sources() {
        let d = StrengthConfig::default();
        assert_eq!(d.validate(), Ok(()));
        assert_eq!((d.initial, d.min, d.max), (64, 1, 1024));
        assert_eq!(
            (d.max_deviation, d.quiet_rounds, d.reprobe_rounds),
            (0.5, 2, 1000)
        );
    }

    #[test]
    fn validate_names_the_bad_key() {
        let bad = |f: fn(&mut StrengthConfig)| {
            let mut c = StrengthConfig::default();
            f(&mut c);
            c.validate().unwrap_err().key
        };
        assert_eq!(bad(|c| c.min = 0), "min");
        assert_eq!(bad(|c| c.max = 2000), "max");
        assert_eq!(bad(|c| c.initial = 1025), "initial");
        assert_eq!(bad(|c| c.max_deviation = f64::NAN), "max_deviation");
        assert_eq!(bad(|c| c.quiet_rounds = 0), "quiet_rounds");
        assert_eq!(bad(|c| c.reprobe_rounds = 0), "reprobe_rounds");
        let e = StrengthConfig {
            initial: 5,
            min: 10,
            ..StrengthConfig::default()
        }
        .validate()
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "strength.initial: 5 is not in min..=max (10..=1024)"
        );
    }

    #[test]
    fn new_clamps_an_invalid_config() {
        let c = StrengthController::new(StrengthConfig {
            initial: 5000,
            min: 0,
            max: 4000,
            quiet_rounds: 0,
            ..StrengthConfig::default()
        });
        assert_eq!(c.strength(), 1024);
        assert_eq!(c.config().min, 1);
        assert_eq!(c.config().quiet_rounds, 2);
        assert_eq!(c.config().validate(), Ok(()));
    }

    #[test]
    fn memcmp_cost_from_timings_is_uksm_formula() {
        // FULL * t_memcmp / t_hash
        assert_eq!(StrengthConfig::memcmp_cost_from_timings(1500, 90), 61);
        assert_eq!(StrengthConfig::memcmp_cost_from_timings(1500, 3000), 2048);
        assert_eq!(StrengthConfig::memcmp_cost_from_timings(1500, 0), 1);
        assert_eq!(StrengthConfig::memcmp_cost_from_timings(0, 5), u32::MAX);
    }

    #[test]
    fn cost_model() {
        let mut c = StrengthController::new(config(100));
        assert_eq!(c.benefit(), 0.0);
        c.on_hashed(10); // profit 10 * 924
        assert_eq!(c.benefit(), 924.0);
        c.on_false_collision(); // 10 + 2*100
        c.on_hash_max(); // 924
        c.on_penalty(6);
        assert_eq!(c.benefit(), (9240.0 - 210.0 - 924.0 - 6.0) / 10.0);
        c.end_round();
        let r = *c.last_round().unwrap();
        assert_eq!(
            (r.strength, r.pages, r.profit, r.penalty, r.false_collisions),
            (100, 10, 9240, 1140, 1)
        );
        // The accounting starts afresh.
        assert_eq!(c.benefit(), 0.0);
    }

    #[test]
    fn empty_round_changes_nothing_and_keeps_charges() {
        let mut c = StrengthController::new(config(64));
        c.on_penalty(500);
        assert_eq!(c.end_round(), None);
        assert_eq!(*c.state(), ControllerState::Starting);
        assert_eq!(c.rounds(), 0);
        c.on_hashed(1);
        assert_eq!(c.benefit(), 960.0 - 500.0);
    }

    #[test]
    fn first_round_starts_a_downward_probe() {
        let mut c = StrengthController::new(config(64));
        assert_eq!(round_with(&mut c, 500.0), Some(63));
        assert_eq!(probing(&c), Some((Direction::Down, 2, Trigger::Start)));
    }

    #[test]
    fn delta_doubles_to_32_going_down() {
        let mut c = StrengthController::new(config(500));
        let mut seen = vec![c.strength()];
        let mut deltas = vec![];
        for i in 0..9 {
            // Each step down is better than the last: keep going.
            round_with(&mut c, 100.0 + i as f64);
            seen.push(c.strength());
            deltas.push(probing(&c).unwrap().1);
        }
        let steps: Vec<u32> = seen.windows(2).map(|w| w[0] - w[1]).collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 32, 32, 32, 32]);
        assert_eq!(deltas, [2, 4, 8, 16, 32, 32, 32, 32, 32]);
        assert!(probing(&c).unwrap().0 == Direction::Down);
    }

    #[test]
    fn delta_resets_on_reversal_and_doubles_again_going_up() {
        let mut c = StrengthController::new(config(500));
        round_with(&mut c, 300.0); // reference 300 at 500; now 499
        round_with(&mut c, 200.0); // below 1; now 497
        round_with(&mut c, 200.0); // below 2; now 493
        assert_eq!(probing(&c), Some((Direction::Down, 8, Trigger::Start)));
        // Third round below the reference: reverse to one above the start.
        assert_eq!(round_with(&mut c, 200.0), Some(501));
        assert_eq!(probing(&c), Some((Direction::Up, 1, Trigger::Start)));
        let mut seen = vec![501];
        for i in 0..7 {
            round_with(&mut c, 400.0 + i as f64); // better and better
            seen.push(c.strength());
        }
        let steps: Vec<u32> = seen.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(steps, [1, 2, 4, 8, 16, 32, 32]);
        // Three rounds worse than the best point going down end the probe
        // at the best point seen (the last round of the climb, 564).
        for _ in 0..3 {
            round_with(&mut c, 100.0);
        }
        assert_eq!(*c.state(), ControllerState::Settling);
        assert_eq!(c.strength(), 564);
    }

    #[test]
    fn below_rounds_are_counted_per_window_of_five() {
        let mut c = StrengthController::new(config(500));
        round_with(&mut c, 300.0);
        // Window 1: two below, three above.
        for b in [200.0, 200.0, 301.0, 302.0, 303.0] {
            round_with(&mut c, b);
        }
        // Window 2 starts afresh: two more below do not reverse.
        round_with(&mut c, 200.0);
        round_with(&mut c, 200.0);
        assert_eq!(probing(&c).unwrap().0, Direction::Down);
        round_with(&mut c, 200.0);
        assert_eq!(probing(&c).unwrap().0, Direction::Up);
    }

    #[test]
    fn heavy_penalty_turns_the_downward_probe_at_once() {
        let mut c = StrengthController::new(config(500));
        round_with(&mut c, 300.0);
        // Penalty > 90 % of profit: the judge says up.
        let profit = 1024.0 - f64::from(c.strength());
        assert_eq!(round_with(&mut c, 0.05 * profit), Some(501));
        assert_eq!(probing(&c).unwrap().0, Direction::Up);
    }

    #[test]
    fn quiet_rounds_end_the_upward_probe() {
        let mut c = StrengthController::new(config(500));
        round_with(&mut c, 300.0);
        for _ in 0..3 {
            round_with(&mut c, 200.0);
        }
        assert_eq!(probing(&c).unwrap().0, Direction::Up);
        // 501 and 502 are better than anything seen, but without
        // collisions; after two such rounds the judge says down.
        quiet_round(&mut c);
        assert_eq!(probing(&c).unwrap().0, Direction::Up);
        quiet_round(&mut c);
        assert_eq!(*c.state(), ControllerState::Settling);
        assert_eq!(c.strength(), 501, "best point: first quiet round");
    }

    #[test]
    fn rounds_the_judge_calls_up_do_not_stop_an_upward_probe() {
        let mut c = StrengthController::new(config(500));
        round_with(&mut c, 300.0);
        for _ in 0..3 {
            round_with(&mut c, 200.0);
        }
        assert_eq!(c.strength(), 501);
        // Far below the best point going down, but the penalty is above
        // 90 % of the profit: keep climbing 501, 502, 504, 508, 516, 532.
        for _ in 0..5 {
            let profit = 1024.0 - f64::from(c.strength());
            round_with(&mut c, 0.05 * profit);
            assert_eq!(probing(&c).unwrap().0, Direction::Up);
        }
        assert_eq!(c.strength(), 532);
    }

    #[test]
    fn settling_at_a_loss_probes_upward_afresh() {
        let mut c = StrengthController::new(config(500));
        round_with(&mut c, 300.0);
        for _ in 0..6 {
            round_with(&mut c, 200.0);
        }
        assert_eq!((c.state(), c.strength()), (&ControllerState::Settling, 500));
        // The pages changed: the chosen point now loses to collisions.
        assert_eq!(round_with(&mut c, 10.0), Some(501));
        assert_eq!(probing(&c), Some((Direction::Up, 2, Trigger::Unsettled)));
        // The new probe compares with what it measured at 500 (10), not with
        // the old probe's 300: better rounds are not "below".
        for _ in 0..4 {
            round_with(&mut c, 100.0);
        }
        assert_eq!(c.strength(), 501 + 2 + 4 + 8 + 16);
        assert_eq!(probing(&c).unwrap().0, Direction::Up);
    }

    #[test]
    fn settling_at_a_loss_at_max_is_stable() {
        let mut c = StrengthController::new(StrengthConfig {
            max: 20,
            ..config(20)
        });
        round_with(&mut c, 900.0); // probe: 19
        for _ in 0..3 {
            round_with(&mut c, 800.0); // below: reverse to 20 = max
        }
        assert_eq!(c.strength(), 20);
        round_with(&mut c, 800.0); // at max: settle at the start, 20
        assert_eq!(*c.state(), ControllerState::Settling);
        round_with(&mut c, 10.0);
        assert!(matches!(c.state(), ControllerState::Stable { .. }));
    }

    #[test]
    fn probe_stops_at_min_and_max() {
        let mut c = StrengthController::new(StrengthConfig {
            min: 10,
            max: 20,
            ..config(12)
        });
        round_with(&mut c, 900.0); // 11
        round_with(&mut c, 901.0); // 10 (12 - 1 - 2 clamped)
        assert_eq!(c.strength(), 10);
        round_with(&mut c, 902.0); // at min: reverse to 13
        assert_eq!((c.strength(), probing(&c).unwrap().0), (13, Direction::Up));
        for b in [800.0, 801.0] {
            round_with(&mut c, b); // climbing, counted below
        }
        // 13 -> 14 -> 16 -> 20 (clamped), at max the probe ends.
        assert_eq!(c.strength(), 16);
        round_with(&mut c, 950.0);
        assert_eq!(c.strength(), 20);
        round_with(&mut c, 951.0);
        assert_eq!(*c.state(), ControllerState::Settling);
        assert_eq!(c.strength(), 20, "best point is the top");
    }

    #[test]
    fn stable_holds_within_half_deviation() {
        let mut c = stable_at(300, 400.0);
        for b in [400.0, 201.0, 599.0, 450.0] {
            assert_eq!(round_with(&mut c, b), None);
        }
        assert_eq!(
            *c.state(),
            ControllerState::Stable {
                benefit: 400.0,
                rounds: 4
            }
        );
    }

    #[test]
    fn deviation_above_half_starts_a_probe() {
        for b in [199.0, 601.0] {
            let mut c = stable_at(300, 400.0);
            round_with(&mut c, 400.0);
            assert_eq!(round_with(&mut c, b), Some(299));
            assert_eq!(probing(&c), Some((Direction::Down, 2, Trigger::Deviation)));
        }
    }

    #[test]
    fn two_rounds_without_collisions_start_a_probe() {
        let mut c = stable_at(300, 700.0);
        // The benefit without collisions (724) is within 50 % of 700.
        assert_eq!(quiet_round(&mut c), None);
        assert!(matches!(c.state(), ControllerState::Stable { .. }));
        assert_eq!(quiet_round(&mut c), Some(299));
        assert_eq!(
            probing(&c),
            Some((Direction::Down, 2, Trigger::NoCollisions))
        );
        // A collision in between resets the count.
        let mut c = stable_at(300, 700.0);
        quiet_round(&mut c);
        round_with(&mut c, 700.0);
        quiet_round(&mut c);
        assert!(matches!(
            c.state(),
            ControllerState::Stable { rounds: 3, .. }
        ));
    }

    #[test]
    fn a_probe_is_forced_after_1000_stable_rounds() {
        let mut c = stable_at(300, 400.0);
        for _ in 0..999 {
            assert_eq!(round_with(&mut c, 400.0), None);
        }
        assert!(matches!(
            c.state(),
            ControllerState::Stable { rounds: 999, .. }
        ));
        assert_eq!(round_with(&mut c, 400.0), Some(299));
        assert_eq!(probing(&c), Some((Direction::Down, 2, Trigger::Periodic)));
    }

    #[test]
    fn state_and_round_serialize_for_metrics() {
        let c = stable_at(300, 400.0);
        assert_eq!(
            serde_json::to_string(c.state()).unwrap(),
            r#"{"Stable":{"benefit":400.0,"rounds":0}}"#
        );
        let mut c = StrengthController::new(config(64));
        round_with(&mut c, 500.0);
        assert_eq!(
            serde_json::to_string(c.state()).unwrap(),
            r#"{"Probing":{"direction":"Down","delta":2,"cause":"Start"}}"#
        );
        let r = serde_json::to_value(c.last_round().unwrap()).unwrap();
        assert_eq!(r["strength"], 64);
        assert_eq!(r["false_collisions"], 1);
        assert_eq!(r["benefit"], 500.0);
        let cfg: StrengthConfig = serde_json::from_str(r#"{"memcmp_cost": 300}"#).unwrap();
        assert_eq!((cfg.memcmp_cost, cfg.initial), (300, 64));
        assert!(serde_json::from_str::<StrengthConfig>(r#"{"strenght": 3}"#).is_err());
    }

    #[derive(Clone, Debug)]
    enum Event {
        Hashed(u16),
        HashMax,
        FalseCollision,
        Penalty(u32),
        EndRound,
    }

    fn event() -> impl Strategy<Value = Event> {
        prop_oneof![
            3 => any::<u16>().prop_map(Event::Hashed),
            1 => Just(Event::HashMax),
            2 => Just(Event::FalseCollision),
            1 => any::<u32>().prop_map(Event::Penalty),
            3 => Just(Event::EndRound),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn strength_stays_within_bounds(
            min in 1u32..=1024,
            span in 0u32..=1024,
            at in 0u32..=1024,
            memcmp_cost in 0u32..5000,
            events in proptest::collection::vec(event(), 0..400),
        ) {
            let max = (min + span).min(1024);
            let initial = min + at % (max - min + 1);
            let cfg = StrengthConfig { initial, memcmp_cost, min, max, ..StrengthConfig::default() };
            prop_assert_eq!(cfg.validate(), Ok(()));
            let mut c = StrengthController::new(cfg);
            for e in events {
                let before = c.strength();
                match e {
                    Event::Hashed(n) => c.on_hashed(u64::from(n)),
                    Event::HashMax => c.on_hash_max(),
                    Event::FalseCollision => c.on_false_collision(),
                    Event::Penalty(u) => c.on_penalty(u64::from(u)),
                    Event::EndRound => {
                        let changed = c.end_round();
                        match changed {
                            Some(s) => prop_assert!(s != before && s == c.strength()),
                            None => prop_assert_eq!(c.strength(), before),
                        }
                    }
                }
                prop_assert!((min..=max).contains(&c.strength()),
                    "strength {} outside {}..={}", c.strength(), min, max);
                if let ControllerState::Probing { delta, .. } = c.state() {
                    prop_assert!(delta.is_power_of_two() && *delta <= MAX_DELTA);
                }
            }
        }
    }
}
