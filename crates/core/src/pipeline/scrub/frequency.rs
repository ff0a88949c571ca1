//! When to scrub: Singleton's frequency control (Algorithm 2, §3.4).
//!
//! ## The algorithm, before the code
//!
//! A scrub costs CPU (hashing guest RAM and the host cache) and each one
//! shrinks the host cache, so how often it runs decides both the overhead
//! and how large the duplicate cache grows between scrubs. Singleton keeps
//! a period `t` and two thresholds, fractions of total memory:
//! `cached_frac` (most memory the page cache may hold, 50 % in the paper's
//! §4.1) and `free_frac` (least memory that must stay free, 10 %).
//!
//! - **Case 1, the timer expires**: scrub, then
//!   `t = t * (Cached + Dropped) / Cached`. No pressure, so the period
//!   *lengthens*, the more the larger the share of the cache the scrub
//!   found to drop.
//! - **Case 2, memory pressure** (`Cached > cached_frac * Memory` or
//!   `Free < free_frac * Memory`) before the timer expires: scrub early,
//!   then `t = t * (Cached - Dropped) / Cached`. The period *shortens* by
//!   the share dropped.
//! - `t` stays within `[period_min, period_max]` ("not shown in the
//!   algorithm", §3.4); the paper ran at 100,000..200,000 pages scanned by
//!   KSM, "of the order of once every 30-60 seconds" (§4.1).
//!
//! **The pseudo-code's timer never fires.** Algorithm 2 ends every call
//! with `cycle_count = t`, including calls that did not scrub, so the
//! `cycle_count-- <= 0` test of the next call starts from `t` again and
//! (for any `t > 1`) is never true: only memory pressure would ever scrub.
//! The text says the period governs the scrubbing rate, so this module
//! implements that intent: the countdown is re-armed only when a scrub
//! happens, and the timer fires `t` after the last scrub.
//!
//! Two more choices the paper leaves open:
//! - **Time, not pages scanned.** pagesift does not run inside ksmd, so `t`
//!   is in nanoseconds of the caller's clock.
//! - **Pressure does not scrub back to back.** Algorithm 2 is called after
//!   every 1,000 pages KSM scans and scrubs on *every* call while pressure
//!   lasts; a scrub that cannot relieve the pressure (the cache holds
//!   nothing the guests hold) would then run without pause. Here a pressure
//!   scrub waits at least `period_min` after the previous scrub.
//!
//! `Cached` in the update rules is the cached pages the scrub looked at
//! (the images' host cache), `Dropped` the pages it dropped from them: the
//! ratio is then the share of the scrubbable cache that was duplicate,
//! which is what the period should answer to.
//!
//! **Memory is every domain the guests' caches compete in.** The pressure
//! test is applied to the host's totals and to each memory cgroup limit
//! the scrubbed guests live under ([`MemoryStats`] each), and pressure in
//! any one scrubs. The paper's host ran its guests in all of its 8 GB; a
//! host that confines its guests with a cgroup limit sees their cache
//! reclaimed against their RAM inside that limit, while the host as a
//! whole may be nowhere near a threshold, so the host-wide test alone
//! would never fire there.
//!
//! Invariants: `period_min <= period() <= period_max` always; after a
//! timer scrub the period never shrinks and after a pressure scrub it
//! never grows; the next timer scrub is `period()` after the last scrub.

use crate::Nanos;

/// The thresholds of Algorithm 2, all operator settings (`[scrub]`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FrequencyParams {
    /// Shortest period, and the least time between two scrubs.
    pub period_min: Nanos,
    /// Longest period.
    pub period_max: Nanos,
    /// The period before the first scrub has given feedback.
    pub period_initial: Nanos,
    /// Scrub early when the host's page cache exceeds this fraction of
    /// memory (`th_frac_cached`, 0.5 in §4.1).
    pub cached_frac: f64,
    /// Scrub early when free memory falls below this fraction of memory
    /// (`th_frac_free`, 0.1 in §4.1).
    pub free_frac: f64,
}

impl Default for FrequencyParams {
    /// §4.1's thresholds; a period of 5..60 s around the paper's "once every
    /// 30-60 seconds", shorter at the low end because pagesift scrubs a
    /// host cache that a guest fills in seconds.
    fn default() -> Self {
        FrequencyParams {
            period_min: 5_000_000_000,
            period_max: 60_000_000_000,
            period_initial: 30_000_000_000,
            cached_frac: 0.5,
            free_frac: 0.1,
        }
    }
}

impl FrequencyParams {
    /// Why these parameters cannot be used, if they cannot.
    pub fn check(&self) -> Result<(), String> {
        if self.period_min == 0 {
            return Err("period_min must be positive".into());
        }
        if self.period_min > self.period_max {
            return Err("period_min must not exceed period_max".into());
        }
        if !(self.period_min..=self.period_max).contains(&self.period_initial) {
            return Err("period_initial must lie within period_min..=period_max".into());
        }
        for (name, f) in [
            ("cached_frac", self.cached_frac),
            ("free_frac", self.free_frac),
        ] {
            if !(0.0..=1.0).contains(&f) {
                return Err(format!("{name} must be a fraction in 0..=1"));
            }
        }
        Ok(())
    }
}

/// One memory domain: the host as `/proc/meminfo` reports it, or a
/// memory cgroup a guest is confined to (any one unit).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    /// All memory (`MemTotal`, or the cgroup's limit).
    pub total: u64,
    /// Page cache (`Cached`, or the cgroup's page cache).
    pub cached: u64,
    /// Free memory (`MemFree`, or the limit less the cgroup's usage).
    pub free: u64,
}

/// Why a scrub is due.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// Case 1: the period ran out.
    Timer,
    /// Case 2: the page cache exceeds `cached_frac` of memory.
    CacheHigh,
    /// Case 2: free memory is below `free_frac` of memory.
    FreeLow,
}

impl Trigger {
    /// A short name for status and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Trigger::Timer => "timer",
            Trigger::CacheHigh => "cache_high",
            Trigger::FreeLow => "free_low",
        }
    }

    /// Case 2 (memory pressure), as opposed to the timer.
    pub fn pressure(self) -> bool {
        self != Trigger::Timer
    }
}

/// The control loop's state: the period and when the last scrub was.
#[derive(Clone, Debug)]
pub struct FrequencyControl {
    params: FrequencyParams,
    period: Nanos,
    last_scrub: Nanos,
}

impl FrequencyControl {
    /// Starts the loop at `now`: the first timer scrub is `period_initial`
    /// later. The parameters must pass [`FrequencyParams::check`]; values
    /// out of order are put in order rather than trusted.
    pub fn new(params: FrequencyParams, now: Nanos) -> FrequencyControl {
        let period_min = params.period_min.max(1);
        let period_max = params.period_max.max(period_min);
        let params = FrequencyParams {
            period_min,
            period_max,
            period_initial: params.period_initial.clamp(period_min, period_max),
            ..params
        };
        FrequencyControl {
            params,
            period: params.period_initial,
            last_scrub: now,
        }
    }

    /// The current period `t`.
    pub fn period(&self) -> Nanos {
        self.period
    }

    /// The parameters in force.
    pub fn params(&self) -> &FrequencyParams {
        &self.params
    }

    /// When the timer fires next.
    pub fn next_timer(&self) -> Nanos {
        self.last_scrub.saturating_add(self.period)
    }

    /// Whether a scrub is due at `now` with the memory domains `mems`, and
    /// why. The timer wins over pressure (Algorithm 2 tests it first); a
    /// cache over its share wins over free memory, in any domain.
    pub fn due(&self, now: Nanos, mems: &[MemoryStats]) -> Option<Trigger> {
        if now >= self.next_timer() {
            return Some(Trigger::Timer);
        }
        if now < self.last_scrub.saturating_add(self.params.period_min) {
            return None;
        }
        let over =
            |mem: &MemoryStats| mem.cached as f64 > mem.total as f64 * self.params.cached_frac;
        let short =
            |mem: &MemoryStats| (mem.free as f64) < mem.total as f64 * self.params.free_frac;
        if mems.iter().any(over) {
            Some(Trigger::CacheHigh)
        } else if mems.iter().any(short) {
            Some(Trigger::FreeLow)
        } else {
            None
        }
    }

    /// Records a scrub at `now` that found `cached` pages in the host
    /// cache it looked at and dropped `dropped` of them, and moves the
    /// period (see the module header). Returns the new period.
    pub fn scrubbed(&mut self, now: Nanos, trigger: Trigger, dropped: u64, cached: u64) -> Nanos {
        self.last_scrub = now;
        self.period = next_period(&self.params, self.period, trigger, dropped, cached);
        self.period
    }
}

/// Algorithm 2's update of `t`, clamped to the bounds. With nothing cached
/// the ratio is undefined and `t` stays; `dropped` above `cached` counts as
/// all of it.
pub fn next_period(
    params: &FrequencyParams,
    period: Nanos,
    trigger: Trigger,
    dropped: u64,
    cached: u64,
) -> Nanos {
    let next = if cached == 0 {
        period
    } else {
        let (cached, dropped) = (u128::from(cached), u128::from(dropped.min(cached)));
        // t * (C - D) / C and t + t * D / C: each product fits in u128.
        let period = u128::from(period);
        let scaled = if trigger.pressure() {
            period * (cached - dropped) / cached
        } else {
            period + period * dropped / cached
        };
        u64::try_from(scaled).unwrap_or(u64::MAX)
    };
    next.clamp(params.period_min, params.period_max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;

    fn params() -> FrequencyParams {
        FrequencyParams {
            period_min: 2 * S,
            period_max: 64 * S,
            period_initial: 8 * S,
            cached_frac: 0.5,
            free_frac: 0.1,
        }
    }

    fn calm() -> MemoryStats {
        MemoryStats {
            total: 1000,
            cached: 100,
            free: 500,
        }
    }

    #[test]
    fn the_timer_fires_once_the_period_has_passed_and_not_before() {
        // The paper's pseudo-code re-arms its countdown on every call and
        // never fires; here repeated calls before the deadline must not
        // postpone it.
        let c = FrequencyControl::new(params(), 0);
        for now in (0..8 * S).step_by((S / 2) as usize) {
            assert_eq!(c.due(now, &[calm()]), None, "at {now}");
        }
        assert_eq!(c.due(8 * S, &[calm()]), Some(Trigger::Timer));
    }

    #[test]
    fn a_timer_scrub_lengthens_the_period_by_the_dropped_share() {
        let mut c = FrequencyControl::new(params(), 0);
        // A quarter of the cache dropped: t grows by a quarter.
        assert_eq!(c.scrubbed(8 * S, Trigger::Timer, 250, 1000), 10 * S);
        assert_eq!(c.next_timer(), 18 * S);
        // Nothing dropped: t stays.
        assert_eq!(c.scrubbed(18 * S, Trigger::Timer, 0, 1000), 10 * S);
    }

    #[test]
    fn a_pressure_scrub_shortens_the_period_by_the_dropped_share() {
        let mut c = FrequencyControl::new(params(), 0);
        assert_eq!(c.scrubbed(3 * S, Trigger::FreeLow, 250, 1000), 6 * S);
        // Everything dropped: down to the floor, not to zero.
        assert_eq!(c.scrubbed(6 * S, Trigger::CacheHigh, 1000, 1000), 2 * S);
    }

    #[test]
    fn pressure_scrubs_early_but_not_back_to_back() {
        let mut c = FrequencyControl::new(params(), 0);
        let full = MemoryStats {
            total: 1000,
            cached: 600,
            free: 300,
        };
        let starved = MemoryStats {
            total: 1000,
            cached: 100,
            free: 50,
        };
        assert_eq!(c.due(S, &[full]), None, "within period_min of the start");
        assert_eq!(c.due(2 * S, &[full]), Some(Trigger::CacheHigh));
        assert_eq!(c.due(2 * S, &[starved]), Some(Trigger::FreeLow));
        c.scrubbed(2 * S, Trigger::CacheHigh, 0, 100);
        assert_eq!(c.due(3 * S, &[full]), None);
        assert_eq!(c.due(4 * S, &[full]), Some(Trigger::CacheHigh));
        // Exactly at the thresholds is not pressure.
        let edge = MemoryStats {
            total: 1000,
            cached: 500,
            free: 100,
        };
        assert_eq!(c.due(4 * S, &[edge]), None);
    }

    #[test]
    fn pressure_in_any_domain_scrubs() {
        let c = FrequencyControl::new(params(), 0);
        // A calm host, and a guest cgroup whose cache fills half its limit.
        let cgroup_full = MemoryStats {
            total: 100,
            cached: 51,
            free: 30,
        };
        let cgroup_tight = MemoryStats {
            total: 100,
            cached: 20,
            free: 9,
        };
        assert_eq!(
            c.due(2 * S, &[calm(), cgroup_full]),
            Some(Trigger::CacheHigh)
        );
        assert_eq!(
            c.due(2 * S, &[calm(), cgroup_tight]),
            Some(Trigger::FreeLow)
        );
        assert_eq!(
            c.due(2 * S, &[cgroup_tight, calm(), cgroup_full]),
            Some(Trigger::CacheHigh),
            "a full cache anywhere names the trigger"
        );
        assert_eq!(c.due(2 * S, &[calm(), calm()]), None);
        assert_eq!(c.due(2 * S, &[]), None);
    }

    #[test]
    fn nothing_cached_leaves_the_period_alone() {
        let p = params();
        assert_eq!(next_period(&p, 8 * S, Trigger::Timer, 5, 0), 8 * S);
        assert_eq!(next_period(&p, 8 * S, Trigger::FreeLow, 5, 0), 8 * S);
    }

    #[test]
    fn bad_parameters_are_named() {
        let mut p = params();
        p.period_min = 100 * S;
        assert!(p.check().unwrap_err().contains("period_min"));
        let mut p = params();
        p.period_initial = 100 * S;
        assert!(p.check().unwrap_err().contains("period_initial"));
        let mut p = params();
        p.free_frac = 1.5;
        assert!(p.check().unwrap_err().contains("free_frac"));
        assert!(FrequencyParams::default().check().is_ok());
    }

    fn any_trigger() -> impl Strategy<Value = Trigger> {
        prop_oneof![
            Just(Trigger::Timer),
            Just(Trigger::CacheHigh),
            Just(Trigger::FreeLow)
        ]
    }

    proptest! {
        #[test]
        fn the_period_always_stays_within_its_bounds(
            min in 1u64..1_000,
            span in 0u64..1_000_000,
            steps in proptest::collection::vec((any_trigger(), any::<u64>(), any::<u64>()), 0..50),
        ) {
            let p = FrequencyParams {
                period_min: min,
                period_max: min + span,
                period_initial: min + span / 2,
                cached_frac: 0.5,
                free_frac: 0.1,
            };
            let mut c = FrequencyControl::new(p, 0);
            let mut now = 0u64;
            for (t, dropped, cached) in steps {
                now = now.saturating_add(c.period());
                let period = c.scrubbed(now, t, dropped, cached);
                prop_assert!((p.period_min..=p.period_max).contains(&period));
            }
        }

        #[test]
        fn the_response_is_monotone_in_the_dropped_share(
            period in 2 * S..=64 * S,
            cached in 1u64..1_000_000,
            a in 0u64..1_000_000,
            b in 0u64..1_000_000,
        ) {
            let p = params();
            let (less, more) = (a.min(b), a.max(b));
            // Timer: more dropped, a longer (or equal) period, never shorter
            // than before.
            let t_less = next_period(&p, period, Trigger::Timer, less, cached);
            let t_more = next_period(&p, period, Trigger::Timer, more, cached);
            prop_assert!(t_less <= t_more);
            prop_assert!(t_less >= period);
            // Pressure: more dropped, a shorter (or equal) period, never
            // longer than before.
            let p_less = next_period(&p, period, Trigger::FreeLow, less, cached);
            let p_more = next_period(&p, period, Trigger::FreeLow, more, cached);
            prop_assert!(p_less >= p_more);
            prop_assert!(p_less <= period);
        }

        #[test]
        fn the_timer_is_never_later_than_the_period_after_the_last_scrub(
            period_after in proptest::collection::vec((0u64..1000, 1u64..1000), 1..20),
        ) {
            let mut c = FrequencyControl::new(params(), 0);
            let mut now = 0;
            for (dropped, cached) in period_after {
                now += c.period();
                prop_assert_eq!(c.due(now, &[calm()]), Some(Trigger::Timer));
                prop_assert_eq!(c.due(now - 1, &[calm()]), None);
                c.scrubbed(now, Trigger::Timer, dropped, cached);
            }
        }
    }
}
