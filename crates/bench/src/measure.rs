//! The figures a run is judged by, computed from its [`Series`]: pure
//! functions, no I/O.
//!
//! ## Definitions (UKSM §8.1.1)
//!
//! - **Time to 99 % merged** (`t99`): the first time the memory saved
//!   reaches 99 % of the workload's mergeable pages (its own exact count),
//!   linearly interpolated between the two samples that straddle the
//!   threshold. With `max_page_sharing = 256` KSM can save at most 255/256
//!   = 99.61 % of N identical pages, so 99 % is reachable.
//! - **CPU-seconds to t99**: the deduplicating system's cumulative CPU
//!   (daemon + ksmd + ksmtuned) at `t99`, interpolated the same way; the
//!   paper's "sum of CPU consumption ratios of each second before all pages
//!   are deduplicated", with the last partial second prorated.
//! - **Efficiency**: MiB saved at `t99` / CPU-seconds to `t99` (the paper's
//!   memory_saving / deduplication_CPU_consumption).
//! - **CPU-seconds over the window**: cumulative CPU at the end of the
//!   fixed window (some KSM settings keep burning CPU after
//!   merging, e.g. on full stable chains).
//! - **Mean saved**: the time-weighted mean of a series over an interval
//!   (trapezoids), for workloads that never settle (COW-broken,
//!   short-lived).
//! - **Rate**: a cumulative series (CPU-seconds) turned into a per-sample
//!   rate over a trailing window (CPU % of one core), for plots.

use crate::series::Series;

/// The value of a piecewise-linear series at `t` (clamped to its ends);
/// `None` for an empty series.
pub fn value_at(points: &[(f64, f64)], t: f64) -> Option<f64> {
    let first = *points.first()?;
    if t <= first.0 {
        return Some(first.1);
    }
    let i = points.partition_point(|&(x, _)| x <= t);
    if i >= points.len() {
        return points.last().map(|&(_, v)| v);
    }
    let (t0, v0) = points[i - 1];
    let (t1, v1) = points[i];
    if t1 <= t0 {
        return Some(v1);
    }
    Some(v0 + (v1 - v0) * (t - t0) / (t1 - t0))
}

/// The first time the series reaches `threshold`, interpolated between the
/// samples around the crossing; `None` if it never does.
pub fn time_to_reach(points: &[(f64, f64)], threshold: f64) -> Option<f64> {
    let mut prev: Option<(f64, f64)> = None;
    for &(t, v) in points {
        if v >= threshold {
            return Some(match prev {
                Some((t0, v0)) if v > v0 => t0 + (t - t0) * (threshold - v0) / (v - v0),
                _ => t,
            });
        }
        prev = Some((t, v));
    }
    None
}

/// Time-weighted mean of the series over `[from, to]` (trapezoids on the
/// interpolated series); `None` if the series is empty or the interval
/// has no length.
pub fn mean_over(points: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    if points.is_empty() || to <= from {
        return None;
    }
    let mut knots = vec![from];
    knots.extend(
        points
            .iter()
            .map(|&(t, _)| t)
            .filter(|&t| t > from && t < to),
    );
    knots.push(to);
    let mut area = 0.0;
    for w in knots.windows(2) {
        let a = value_at(points, w[0])?;
        let b = value_at(points, w[1])?;
        area += (a + b) / 2.0 * (w[1] - w[0]);
    }
    Some(area / (to - from))
}

/// The largest value in `[from, to]`.
pub fn max_over(points: &[(f64, f64)], from: f64, to: f64) -> Option<f64> {
    points
        .iter()
        .filter(|&&(t, _)| t >= from && t <= to)
        .map(|&(_, v)| v)
        .fold(None, |m, v| Some(m.map_or(v, |m: f64| m.max(v))))
}

/// A cumulative series turned into its rate over a trailing `window` of
/// seconds, times `scale` (CPU-seconds → % of one core with 100). The
/// first point has no rate and is dropped.
pub fn rate(cumulative: &Series, window: f64, scale: f64, metric: &str, unit: &str) -> Series {
    let mut out = Series::new(&cumulative.system, metric, unit);
    let p = &cumulative.points;
    for &(t, v) in p.iter().skip(1) {
        let from = (t - window).max(p[0].0);
        if t <= from {
            continue;
        }
        let v0 = value_at(p, from).unwrap_or(v);
        out.push(t, (v - v0) / (t - from) * scale);
    }
    out
}

/// Memory saved per CPU-second; `None` when no CPU was measured.
pub fn efficiency(saved_mib: f64, cpu_seconds: f64) -> Option<f64> {
    (cpu_seconds > 0.0 && saved_mib.is_finite()).then(|| saved_mib / cpu_seconds)
}

/// `value / reference`; `None` when either is missing or the reference is
/// zero.
pub fn ratio(value: Option<f64>, reference: Option<f64>) -> Option<f64> {
    match (value, reference) {
        (Some(v), Some(r)) if r != 0.0 && v.is_finite() && r.is_finite() => Some(v / r),
        _ => None,
    }
}

/// The smallest gap between two consecutive samples, and the mean rate
/// (samples per second) of a series: the sampler promises ≥ 2 Hz.
pub fn sample_rate(points: &[(f64, f64)]) -> Option<f64> {
    let (first, last) = (points.first()?, points.last()?);
    (last.0 > first.0).then(|| (points.len() - 1) as f64 / (last.0 - first.0))
}

/// Mean of the values in the second half of the series' time span.
pub fn mean_second_half(points: &[(f64, f64)]) -> f64 {
    let (Some(first), Some(last)) = (points.first(), points.last()) else {
        return 0.0;
    };
    let mid = (first.0 + last.0) / 2.0;
    let half: Vec<f64> = points.iter().filter(|p| p.0 >= mid).map(|p| p.1).collect();
    if half.is_empty() {
        0.0
    } else {
        half.iter().sum::<f64>() / half.len() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_crossing_is_interpolated() {
        let p = [(0.0, 0.0), (1.0, 0.0), (2.0, 100.0), (3.0, 100.0)];
        assert_eq!(time_to_reach(&p, 99.0), Some(1.99));
        assert_eq!(time_to_reach(&p, 0.0), Some(0.0));
        assert_eq!(time_to_reach(&p, 101.0), None);
        assert_eq!(time_to_reach(&[], 1.0), None);
        // A jump at the first sample is reached at that sample.
        assert_eq!(time_to_reach(&[(0.5, 10.0)], 5.0), Some(0.5));
    }

    #[test]
    fn values_between_samples_are_interpolated_and_clamped() {
        let p = [(1.0, 10.0), (3.0, 30.0)];
        assert_eq!(value_at(&p, 0.0), Some(10.0));
        assert_eq!(value_at(&p, 2.0), Some(20.0));
        assert_eq!(value_at(&p, 9.0), Some(30.0));
        assert_eq!(value_at(&[], 1.0), None);
    }

    #[test]
    fn the_mean_weights_by_time() {
        // 0 for 1 s, then a ramp to 100 over 1 s, then 100 for 2 s.
        let p = [(0.0, 0.0), (1.0, 0.0), (2.0, 100.0), (4.0, 100.0)];
        let m = mean_over(&p, 0.0, 4.0).unwrap();
        assert!((m - 62.5).abs() < 1e-9, "{m}");
        assert!((mean_over(&p, 2.0, 4.0).unwrap() - 100.0).abs() < 1e-9);
        assert!((mean_over(&p, 1.5, 2.0).unwrap() - 75.0).abs() < 1e-9);
        assert_eq!(mean_over(&p, 2.0, 2.0), None);
        assert_eq!(max_over(&p, 0.0, 1.5), Some(0.0));
        assert_eq!(max_over(&p, 0.0, 4.0), Some(100.0));
    }

    #[test]
    fn a_cumulative_series_becomes_a_rate() {
        let mut cpu = Series::new("ksm-100", "cpu_seconds", "s");
        for i in 0..=8 {
            // 0.25 CPU-s per second: 25 % of a core.
            cpu.push(i as f64 * 0.25, i as f64 * 0.0625);
        }
        let r = rate(&cpu, 1.0, 100.0, "cpu_percent", "% of a core");
        assert_eq!(r.points.len(), 8);
        assert!(
            r.points.iter().all(|&(_, v)| (v - 25.0).abs() < 1e-9),
            "{r:?}"
        );
        assert_eq!(r.system, "ksm-100");
    }

    #[test]
    fn efficiency_and_ratios_refuse_zero() {
        assert_eq!(efficiency(2048.0, 2.0), Some(1024.0));
        assert_eq!(efficiency(2048.0, 0.0), None);
        assert_eq!(ratio(Some(6.0), Some(2.0)), Some(3.0));
        assert_eq!(ratio(Some(6.0), Some(0.0)), None);
        assert_eq!(ratio(None, Some(2.0)), None);
        assert_eq!(
            sample_rate(&[(0.0, 0.0), (0.25, 0.0), (0.5, 0.0)]),
            Some(4.0)
        );
    }

    proptest! {
        /// On a non-decreasing series the crossing time lies between the
        /// samples around it, and the series' value there is the threshold.
        #[test]
        fn crossing_is_where_the_value_is_the_threshold(
            steps in proptest::collection::vec((0.01f64..2.0, 0.0f64..50.0), 2..40),
            frac in 0.0f64..1.0,
        ) {
            let mut p = Vec::new();
            let (mut t, mut v) = (0.0, 0.0);
            for (dt, dv) in steps {
                t += dt;
                v += dv;
                p.push((t, v));
            }
            let top = p.last().unwrap().1;
            let thr = p[0].1 + (top - p[0].1) * frac;
            let at = time_to_reach(&p, thr).unwrap();
            prop_assert!(at >= p[0].0 && at <= t);
            let val = value_at(&p, at).unwrap();
            prop_assert!(val >= thr - 1e-6 * top.max(1.0), "{val} < {thr}");
            // The mean lies within the range of the values.
            let m = mean_over(&p, p[0].0, t).unwrap();
            prop_assert!(m >= p[0].1 - 1e-9 && m <= top + 1e-9);
        }
    }
}
