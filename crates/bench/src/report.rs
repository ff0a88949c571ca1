//! Figures per run, the markdown report, CSV files and the generated
//! section of docs/benchmarks.md.
//!
//! Each experiment gets one table: a row per system with its figures
//! ([`Figures`], defined in [`crate::measure`]) and the ratios of its
//! figures to the reference system's (pagesift) measured in the same run.
//! A ratio is always *system ÷ reference*: a KSM row with "CPU-s × 12.0"
//! spent twelve times pagesift's CPU over the window; "MiB/CPU-s × 0.10"
//! saved a tenth as much per CPU-second.

use crate::BenchError;
use crate::cycles::CycleStats;
use crate::experiment::{Experiment, Goal, GoalSpec, SavedBy};
use crate::measure::{self, ratio};
use crate::run::{RunResult, sanitize};
use crate::sampler::metric;
use crate::series::Series;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// The least mean share of each cycle merged that counts as merging short
/// lived memory at all (`Goal::MoreOfEachCycle`).
const MEANINGFUL_CYCLE_SHARE: f64 = 0.10;

const PAGE_MIB: f64 = pagesift_linux::PAGE_SIZE as f64 / (1024.0 * 1024.0);

/// The figures of one run.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Figures {
    /// Mergeable memory, MiB (the workload's own count).
    pub target_mib: Option<f64>,
    /// Time to 99 % of it merged, s.
    pub t99_s: Option<f64>,
    /// System CPU-seconds until then.
    pub cpu_to_t99_s: Option<f64>,
    /// MiB saved at t99 per CPU-second until t99.
    pub mib_per_cpu_s: Option<f64>,
    /// KSM's counters at the end of the window, MiB.
    pub saved_end_mib: f64,
    /// Σ (Anonymous − Pss_Anon) growth, mean over the second half of the window, MiB.
    pub saved_pss_mean_mib: f64,
    /// Its largest value, MiB.
    pub saved_pss_max_mib: f64,
    /// System CPU-seconds over the whole window.
    pub cpu_window_s: f64,
    /// The same as a mean % of one core.
    pub cpu_percent: f64,
    /// KSM COW breaks (`cow_ksm`) over the window.
    pub cow_breaks: f64,
    /// Samples per second actually taken.
    pub samples_per_s: f64,
}

impl Figures {
    /// Computes the figures of a run.
    pub fn of(r: &RunResult) -> Figures {
        let pts = |m: &str| r.series(m).map(|s| s.points.as_slice()).unwrap_or(&[]);
        let saved = pts(r.saved_by.metric());
        let cpu = pts(metric::CPU);
        let target_mib = r.target_pages.map(|p| p as f64 * PAGE_MIB);
        let t99 = target_mib
            .filter(|&t| t > 0.0)
            .and_then(|t| measure::time_to_reach(saved, 0.99 * t));
        let cpu_to_t99 = t99.and_then(|t| measure::value_at(cpu, t));
        let end = r.window_s;
        let last = |p: &[(f64, f64)]| p.last().map_or(0.0, |&(_, v)| v);
        let cpu_window = last(cpu);
        Figures {
            target_mib,
            t99_s: t99,
            cpu_to_t99_s: cpu_to_t99,
            mib_per_cpu_s: cpu_to_t99
                .zip(target_mib)
                .and_then(|(c, t)| measure::efficiency(0.99 * t, c)),
            saved_end_mib: last(pts(metric::SAVED)),
            saved_pss_mean_mib: measure::mean_over(pts(metric::SAVED_PSS), end / 2.0, end)
                .unwrap_or(0.0),
            saved_pss_max_mib: measure::max_over(pts(metric::SAVED_PSS), 0.0, end).unwrap_or(0.0),
            cpu_window_s: cpu_window,
            cpu_percent: cpu.last().map_or(
                0.0,
                |&(t, v)| {
                    if t > 0.0 { v / t * 100.0 } else { 0.0 }
                },
            ),
            cow_breaks: last(pts(metric::COW)),
            samples_per_s: measure::sample_rate(cpu).unwrap_or(0.0),
        }
    }
}

/// One row of an experiment's table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    /// The system.
    pub system: String,
    /// Its figures.
    pub figures: Figures,
    /// system ÷ reference: time to 99 %.
    pub t99_ratio: Option<f64>,
    /// system ÷ reference: CPU-seconds over the window.
    pub cpu_ratio: Option<f64>,
    /// system ÷ reference: MiB per CPU-second.
    pub efficiency_ratio: Option<f64>,
    /// system ÷ reference: mean PSS saving.
    pub saved_ratio: Option<f64>,
    /// Notes of the run.
    pub notes: Vec<String>,
}

/// An experiment's table: one row per system, ratios against `reference`.
pub fn rows(runs: &[RunResult], reference: &str) -> Vec<Row> {
    let figs: Vec<Figures> = runs.iter().map(Figures::of).collect();
    let rf = runs
        .iter()
        .position(|r| r.system == reference)
        .map(|i| figs[i].clone());
    // A reference below these is noise (a saving of -0.0 MiB, an idle
    // CPU reading of one tick): a ratio to it would mean nothing.
    let nz = |v: f64| (v >= 0.05).then_some(v);
    let some_mib = |v: f64| (v >= 1.0).then_some(v);
    runs.iter()
        .zip(figs)
        .map(|(r, f)| Row {
            system: r.system.clone(),
            t99_ratio: ratio(f.t99_s, rf.as_ref().and_then(|x| x.t99_s)),
            cpu_ratio: ratio(
                Some(f.cpu_window_s),
                rf.as_ref().and_then(|x| nz(x.cpu_window_s)),
            ),
            efficiency_ratio: ratio(f.mib_per_cpu_s, rf.as_ref().and_then(|x| x.mib_per_cpu_s)),
            saved_ratio: ratio(
                Some(f.saved_pss_mean_mib),
                rf.as_ref().and_then(|x| some_mib(x.saved_pss_mean_mib)),
            ),
            figures: f,
            notes: r.notes.clone(),
        })
        .collect()
}

fn num(v: Option<f64>, digits: usize) -> String {
    match v {
        Some(v) if v.is_finite() => format!("{v:.digits$}"),
        _ => "–".into(),
    }
}

fn times(v: Option<f64>) -> String {
    match v {
        Some(v) if v.is_finite() => format!("× {v:.2}"),
        _ => "–".into(),
    }
}

/// The markdown table of one experiment.
pub fn table(rows: &[Row], window_s: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| system | time to 99 % [s] | CPU-s to 99 % | MiB per CPU-s | saved at end, KSM counters [MiB] | saved, PSS, mean of 2nd half [MiB] | CPU-s over {window_s:.0} s | mean CPU [% of a core] | COW breaks | time to 99 % ÷ ref | CPU-s ÷ ref | MiB per CPU-s ÷ ref | PSS saved ÷ ref |"
    );
    let _ = writeln!(
        s,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for r in rows {
        let f = &r.figures;
        let t99 = match (f.t99_s, f.target_mib) {
            (Some(t), _) => format!("{t:.2}"),
            (None, Some(_)) => format!("not in {window_s:.0} s"),
            (None, None) => "–".into(),
        };
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.2} | {:.2} | {:.0} | {} | {} | {} | {} |",
            r.system,
            t99,
            num(f.cpu_to_t99_s, 2),
            num(f.mib_per_cpu_s, 0),
            f.saved_end_mib,
            f.saved_pss_mean_mib,
            f.cpu_window_s,
            f.cpu_percent,
            f.cow_breaks,
            times(r.t99_ratio),
            times(r.cpu_ratio),
            times(r.efficiency_ratio),
            times(r.saved_ratio),
        );
    }
    s
}

/// A goal judged from the runs of one experiment.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Verdict {
    /// Where the goal was set (`UKSM §8.2.1`, `real-workload goal 2`).
    pub source: String,
    /// The goal in words.
    pub goal: String,
    /// Met or not; `None` when it could not be judged (a system did not
    /// run, failed, or a figure is missing).
    pub met: Option<bool>,
    /// The measured figures it was judged by.
    pub evidence: String,
}

impl Verdict {
    /// `met`, `not met` or `not judged`.
    pub fn word(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "not met",
            None => "not judged",
        }
    }
}

/// The run of `system` that produced series.
fn run_of<'a>(runs: &'a [RunResult], system: &str) -> Option<&'a RunResult> {
    runs.iter()
        .find(|r| r.system == system && !r.series.is_empty())
}

/// The series a target is reached on: the file data's saving for
/// guest-files, else the PSS saving.
fn target_saving(r: &RunResult) -> &[(f64, f64)] {
    let metric = match r.saved_by {
        SavedBy::FileData => metric::FILE_SAVED,
        SavedBy::Pss | SavedBy::KsmCounters => metric::SAVED_PSS,
    };
    r.series(metric).map_or(&[][..], |s| s.points.as_slice())
}

/// When `r`'s saving reaches `fraction` of its exact saving at the start
/// (its target), and that saving in MiB. The saving is the series its
/// experiment measures savings by (PSS; the file data's for guest-files).
pub fn time_to_fraction(r: &RunResult, fraction: f64) -> (Option<f64>, Option<f64>) {
    let target = r.target_pages.map(|p| p as f64 * PAGE_MIB);
    let saved = target_saving(r);
    let t = target
        .filter(|&t| t > 0.0)
        .and_then(|t| measure::time_to_reach(saved, fraction * t));
    (t, target)
}

fn or_dash(v: Option<f64>, unit: &str) -> String {
    v.map_or("–".into(), |v| format!("{v:.2}{unit}"))
}

/// Judges `spec` from `runs` (one experiment's runs, same invocation).
pub fn judge(spec: &GoalSpec, runs: &[RunResult], window_s: f64) -> Verdict {
    let (system, against) = spec.goal.systems();
    let (system, against) = (system.name(), against.name());
    let mut v = Verdict {
        source: spec.source.to_string(),
        goal: String::new(),
        met: None,
        evidence: String::new(),
    };
    match spec.goal {
        Goal::ReachExact {
            fraction,
            within_s,
            max_cpu_ratio,
            ..
        } => {
            let pct = fraction * 100.0;
            v.goal = format!(
                "{system} reaches {pct:.0} % of the exact saving at the start within {within_s:.0} \
                 s, at ≤ {max_cpu_ratio} × {against}'s CPU-seconds over the {window_s:.0} s window"
            );
            let (Some(me), Some(them)) = (run_of(runs, &system), run_of(runs, &against)) else {
                v.evidence = format!("{system} and {against} must both run in the same invocation");
                return v;
            };
            let (t, target) = time_to_fraction(me, fraction);
            let (t_them, target_them) = time_to_fraction(them, fraction);
            let (cpu, cpu_them) = (Figures::of(me).cpu_window_s, Figures::of(them).cpu_window_s);
            let cpu_ratio = ratio(Some(cpu), (cpu_them > 0.0).then_some(cpu_them));
            let reached = |t: Option<f64>| match t {
                Some(t) => format!("at {t:.2} s"),
                None => format!("not in {window_s:.0} s"),
            };
            v.evidence = format!(
                "{system}: {pct:.0} % of {} MiB {}, {cpu:.2} CPU-s; {against}: {pct:.0} % of {} \
                 MiB {}, {cpu_them:.2} CPU-s; CPU {}",
                or_dash(target, ""),
                reached(t),
                or_dash(target_them, ""),
                reached(t_them),
                times(cpu_ratio),
            );
            if target.is_some_and(|t| t > 0.0) && cpu_ratio.is_some() {
                v.met = Some(
                    t.is_some_and(|t| t <= within_s)
                        && cpu_ratio.is_some_and(|r| r <= max_cpu_ratio),
                );
            }
        }
        Goal::SaveAsMuch {
            min_saved_ratio,
            max_cpu_ratio,
            ..
        } => {
            v.goal = format!(
                "{system} saves ≥ {min_saved_ratio} × what {against} saves (PSS, mean of the 2nd \
                 half), at ≤ {max_cpu_ratio} × its CPU-seconds over the {window_s:.0} s window"
            );
            let (Some(me), Some(them)) = (run_of(runs, &system), run_of(runs, &against)) else {
                v.evidence = format!("{system} and {against} must both run in the same invocation");
                return v;
            };
            let (f, g) = (Figures::of(me), Figures::of(them));
            let saved_ratio = ratio(
                Some(f.saved_pss_mean_mib),
                (g.saved_pss_mean_mib > 0.0).then_some(g.saved_pss_mean_mib),
            );
            let cpu_ratio = ratio(
                Some(f.cpu_window_s),
                (g.cpu_window_s > 0.0).then_some(g.cpu_window_s),
            );
            // Against a system that saved nothing (under 0.05 MiB), any
            // saving is more than a multiple of it: the ratio is undefined
            // but the saving half of the goal holds, and CPU decides.
            let saved_ok = match saved_ratio {
                Some(s) => Some(s >= min_saved_ratio),
                None if g.saved_pss_mean_mib < 0.05 && f.saved_pss_mean_mib >= 0.05 => Some(true),
                None => None,
            };
            let cpu_ok = cpu_ratio.map(|c| c <= max_cpu_ratio);
            v.evidence = format!(
                "{system}: {:.1} MiB at {:.2} CPU-s; {against}: {:.1} MiB at {:.2} CPU-s; saved \
                 {}, CPU {}",
                f.saved_pss_mean_mib,
                f.cpu_window_s,
                g.saved_pss_mean_mib,
                g.cpu_window_s,
                match (saved_ratio, saved_ok) {
                    (None, Some(true)) => "something against nothing".to_string(),
                    _ => times(saved_ratio),
                },
                times(cpu_ratio)
            );
            v.met = match (saved_ok, cpu_ok) {
                (Some(a), Some(b)) => Some(a && b),
                (Some(false), _) | (_, Some(false)) => Some(false),
                _ => None,
            };
        }
        Goal::Sooner {
            fractions,
            min_speedup,
            max_cpu_ratio,
            ..
        } => {
            let pcts: Vec<String> = fractions
                .iter()
                .map(|f| format!("{:.0} %", f * 100.0))
                .collect();
            v.goal = format!(
                "{system} reaches {} of the target ≥ {min_speedup} × sooner than {against}{}",
                pcts.join(" and "),
                max_cpu_ratio.map_or(String::new(), |c| format!(
                    ", at ≤ {c} × its CPU-seconds over the {window_s:.0} s window"
                ))
            );
            let (Some(me), Some(them)) = (run_of(runs, &system), run_of(runs, &against)) else {
                v.evidence = format!("{system} and {against} must both run in the same invocation");
                return v;
            };
            let mut parts = Vec::new();
            let mut met = Some(true);
            for f in fractions {
                let (t, _) = time_to_fraction(me, f);
                let (t_them, _) = time_to_fraction(them, f);
                let pct = f * 100.0;
                match (t, t_them) {
                    (Some(t), Some(u)) => {
                        let r = u / t.max(1e-3);
                        parts.push(format!("{pct:.0} %: {t:.2} s vs {u:.2} s ({r:.1}×)"));
                        met = met.map(|m| m && r >= min_speedup);
                    }
                    (Some(t), None) => {
                        let r = window_s / t.max(1e-3);
                        parts.push(format!(
                            "{pct:.0} %: {t:.2} s vs not in {window_s:.0} s (> {r:.1}×)"
                        ));
                        met = met.map(|m| m && r >= min_speedup);
                    }
                    (None, u) => {
                        parts.push(format!(
                            "{pct:.0} %: not in {window_s:.0} s vs {}",
                            u.map_or(format!("not in {window_s:.0} s"), |u| format!("{u:.2} s"))
                        ));
                        met = Some(false);
                    }
                }
            }
            if let Some(max) = max_cpu_ratio {
                let (cpu, cpu_them) =
                    (Figures::of(me).cpu_window_s, Figures::of(them).cpu_window_s);
                let r = ratio(Some(cpu), (cpu_them > 0.0).then_some(cpu_them));
                parts.push(format!("CPU {cpu:.2} s vs {cpu_them:.2} s ({})", times(r)));
                met = match (met, r) {
                    (Some(m), Some(r)) => Some(m && r <= max),
                    (Some(false), None) => Some(false),
                    _ => None,
                };
            }
            v.evidence = format!("{system} vs {against}: {}", parts.join("; "));
            v.met = met;
        }
        Goal::CacheSmaller { factor, .. } => {
            v.goal = format!(
                "{system}'s host page cache of the guest images is ≥ {factor} × smaller than {against}'s (mean of the {window_s:.0} s window's 2nd half)"
            );
            let cache = |r: &str| {
                run_of(runs, r)
                    .and_then(|r| r.series(metric::IMAGE_CACHE_MIB))
                    .map(|s| measure::mean_second_half(&s.points))
            };
            let (me, them) = (cache(&system), cache(&against));
            let r = ratio(them, me.filter(|&m| m > 0.0));
            v.evidence = format!(
                "{system}: {} MiB; {against}: {} MiB; {against} ÷ {system} {}",
                or_dash(me, ""),
                or_dash(them, ""),
                times(r)
            );
            if let (Some(me), Some(them)) = (me, them) {
                v.met = Some(me * factor <= them);
            }
        }
        Goal::Throughput {
            min_ratio,
            strictly,
            ..
        } => {
            let cmp = if strictly { ">" } else { "≥" };
            v.goal = if min_ratio == 1.0 {
                format!("the guests read {cmp} {against}'s MiB/s under {system}")
            } else {
                format!("the guests read {cmp} {min_ratio} × {against}'s MiB/s under {system}")
            };
            let tp = |r: &str| {
                run_of(runs, r)
                    .and_then(|r| r.series(metric::GUEST_READ_MIB_S))
                    .and_then(|s| s.points.last().map(|p| p.1))
            };
            let (me, them) = (tp(&system), tp(&against));
            let r = ratio(me, them.filter(|&t| t > 0.0));
            v.evidence = format!(
                "{system}: {} MiB/s; {against}: {} MiB/s; ratio {}",
                or_dash(me, ""),
                or_dash(them, ""),
                times(r)
            );
            if let Some(r) = r {
                v.met = Some(if strictly {
                    r > min_ratio
                } else {
                    r >= min_ratio
                });
            }
        }
        Goal::DataIntact { .. } => {
            v.goal = format!(
                "under {system}, every guest's data is byte-identical to what was written (md5 inside the guest)"
            );
            let ok = run_of(runs, &system)
                .and_then(|r| r.series(metric::DATA_INTACT))
                .and_then(|s| s.points.last().map(|p| p.1));
            v.evidence = match ok {
                Some(x) if x >= 1.0 => "every guest's md5 matched the host's".into(),
                Some(_) => "a guest's md5 differed from the host's".into(),
                None => "no md5 was reported".into(),
            };
            v.met = ok.map(|x| x >= 1.0);
        }
        Goal::EachCycle { share, .. } => {
            let pct = share * 100.0;
            v.goal = format!(
                "under {system}, every cycle mapped and unmapped within the {window_s:.0} s window has ≥ {pct:.0} % of its pages merged before its unmap"
            );
            let stats = run_of(runs, &system).and_then(|r| CycleStats::of(&r.cycles));
            v.evidence = cycle_evidence(&system, stats);
            v.met = stats.map(|s| s.min >= share);
        }
        Goal::MoreOfEachCycle { .. } => {
            v.goal = format!(
                "{system} merges more of each cycle's pages before its unmap than {against} (mean over the cycles within the {window_s:.0} s window, and at least 10 %)"
            );
            let stats = |name: &str| run_of(runs, name).and_then(|r| CycleStats::of(&r.cycles));
            let (me, them) = (stats(&system), stats(&against));
            v.evidence = format!(
                "{}; {}",
                cycle_evidence(&system, me),
                cycle_evidence(&against, them)
            );
            // Both merging next to nothing is no win for either: a share
            // of a percent is a page or two ksmd caught as the region went.
            if let (Some(me), Some(them)) = (me, them) {
                v.met = Some(me.mean > them.mean && me.mean >= MEANINGFUL_CYCLE_SHARE);
            }
        }
        Goal::SkipsCycles { max_cpu_share, .. } => {
            v.goal = format!(
                "{system} leaves the cycles alone (< 10 % of their pages merged on average) at ≤ {:.1} % of a core over the {window_s:.0} s window",
                max_cpu_share * 100.0
            );
            let Some(r) = run_of(runs, &system) else {
                v.evidence = format!("{system} did not run");
                return v;
            };
            let stats = CycleStats::of(&r.cycles);
            let share = Figures::of(r).cpu_window_s / window_s;
            v.evidence = format!(
                "{}; CPU {:.2} % of a core",
                cycle_evidence(&system, stats),
                share * 100.0
            );
            v.met = stats.map(|s| s.mean < 0.1 && share <= max_cpu_share);
        }
    }
    v
}

/// A system's cycles, for a verdict's evidence.
fn cycle_evidence(system: &str, stats: Option<CycleStats>) -> String {
    match stats {
        Some(s) => format!(
            "{system}: {} cycles, mean {:.1} % merged, least {:.1} %, {} with ≥ 90 %",
            s.count,
            s.mean * 100.0,
            s.min * 100.0,
            s.at_least_90
        ),
        None => format!("{system}: no cycle within the window"),
    }
}

/// Per system: the target, the times to 50 % and 90 % of it and the CPU
/// over the window (the files experiment's table).
pub fn sooner_table(runs: &[RunResult], window_s: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| system | target [MiB] | time to 50 % [s] | time to 90 % [s] | saved toward the target, mean of 2nd half [MiB] | CPU-s over {window_s:.0} s (daemon + ksmd) |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
    for r in runs.iter().filter(|r| !r.series.is_empty()) {
        let (t50, target) = time_to_fraction(r, 0.5);
        let (t90, _) = time_to_fraction(r, 0.9);
        let f = Figures::of(r);
        let at =
            |t: Option<f64>| t.map_or(format!("not in {window_s:.0} s"), |t| format!("{t:.2}"));
        let saved = measure::mean_over(target_saving(r), window_s / 2.0, window_s).unwrap_or(0.0);
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} | {:.2} |",
            r.system,
            num(target, 1),
            at(t50),
            at(t90),
            saved,
            f.cpu_window_s
        );
    }
    s
}

/// Every goal of `e`, judged.
pub fn verdicts(e: &Experiment, runs: &[RunResult]) -> Vec<Verdict> {
    e.goals.iter().map(|g| judge(g, runs, e.window_s)).collect()
}

/// The table behind a [`Goal::ReachExact`]: per system, the exact saving
/// at the start, the time to `fraction` of it, the CPU-seconds over the
/// window, and both as ratios to `against`.
pub fn reach_table(runs: &[RunResult], fraction: f64, against: &str, window_s: f64) -> String {
    let pct = fraction * 100.0;
    let reference = run_of(runs, against);
    let (t_ref, _) = reference.map_or((None, None), |r| time_to_fraction(r, fraction));
    let cpu_ref = reference
        .map(|r| Figures::of(r).cpu_window_s)
        .filter(|&c| c > 0.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| system | exact saving at start [MiB] | time to {pct:.0} % of it [s] | CPU-s to then | CPU-s over {window_s:.0} s (daemon + ksmd) | time to {pct:.0} % ÷ {against} | CPU-s ÷ {against} |"
    );
    let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|---:|");
    for r in runs.iter().filter(|r| !r.series.is_empty()) {
        let (t, target) = time_to_fraction(r, fraction);
        let f = Figures::of(r);
        let cpu_then = t.and_then(|t| {
            measure::value_at(
                r.series(metric::CPU)
                    .map_or(&[][..], |s| s.points.as_slice()),
                t,
            )
        });
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.2} | {} | {} |",
            r.system,
            num(target, 1),
            t.map_or(format!("not in {window_s:.0} s"), |t| format!("{t:.2}")),
            num(cpu_then, 2),
            f.cpu_window_s,
            times(ratio(t, t_ref)),
            times(ratio(Some(f.cpu_window_s), cpu_ref)),
        );
    }
    s
}

/// The goals section of one experiment: the tables behind them and one
/// line per goal, met or not met.
pub fn goals_markdown(e: &Experiment, runs: &[RunResult]) -> String {
    let mut s = String::new();
    let mut tables = Vec::new();
    for g in &e.goals {
        if let Goal::ReachExact {
            fraction, against, ..
        } = g.goal
        {
            let key = (format!("{fraction}"), against.name());
            if !tables.contains(&key) {
                s.push('\n');
                s.push_str(&reach_table(runs, fraction, &against.name(), e.window_s));
                tables.push(key);
            }
        }
    }
    if e.goals
        .iter()
        .any(|g| matches!(g.goal, Goal::Sooner { .. }))
    {
        s.push('\n');
        s.push_str(&sooner_table(runs, e.window_s));
    }
    for v in verdicts(e, runs) {
        let _ = writeln!(
            s,
            "\n**Goal ({}): {}: {}.** {}.",
            v.source,
            v.goal,
            v.word(),
            v.evidence
        );
    }
    s
}

/// The median of `v` (the mean of the middle two for an even count).
fn median(v: &[f64]) -> Option<f64> {
    let mut v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// With `--repeat`: per system, the headline figures of every run with
/// their median and range, then every goal's verdict per run.
pub fn repeats_markdown(r: &ExperimentResult) -> String {
    let e = &r.experiment;
    let all: Vec<&[RunResult]> = std::iter::once(r.runs.as_slice())
        .chain(r.repeats.iter().map(Vec::as_slice))
        .collect();
    let mut s = repeated_table_head(all.len());
    let has_target = r.runs.iter().any(|x| x.target_pages.is_some());
    type Pick = fn(&Figures) -> Option<f64>;
    let mut figures: Vec<(&str, Pick)> = vec![
        ("saved, PSS, mean of 2nd half [MiB]", |f| {
            Some(f.saved_pss_mean_mib)
        }),
        ("CPU-s over the window", |f| Some(f.cpu_window_s)),
    ];
    if has_target {
        figures.push(("time to 99 % [s]", |f| f.t99_s));
    }
    for sys in &e.systems {
        let name = sys.name();
        for (label, pick) in &figures {
            let vals: Vec<Option<f64>> = all
                .iter()
                .map(|runs| {
                    runs.iter()
                        .find(|x| x.system == name && !x.series.is_empty())
                        .and_then(|x| pick(&Figures::of(x)))
                })
                .collect();
            s.push_str(&repeated_figure_row(&name, label, &vals));
        }
    }
    let by_run: Vec<Vec<Verdict>> = all.iter().map(|runs| verdicts(e, runs)).collect();
    if !e.goals.is_empty() {
        s.push_str(&goals_by_run_markdown(&by_run));
    }
    s.push_str(&later_notes_markdown(&all[1..]));
    s
}

/// The notes of runs 2, 3, … (the experiment's tables show the first run
/// only): what a goal missed in one run often shows only in that run's
/// notes (hint counts, ksmd's wait, the scan cost).
fn later_notes_markdown(later: &[&[RunResult]]) -> String {
    let mut s = String::new();
    for (k, runs) in later.iter().enumerate() {
        for x in runs.iter() {
            for n in &x.notes {
                let _ = writeln!(s, "\n- run {}, {}: {n}", k + 2, x.system);
            }
        }
    }
    if s.is_empty() {
        return s;
    }
    format!("\nNotes of the later runs:\n{s}")
}

/// The title and column heads of a *Repeated runs* table of `n` runs.
pub fn repeated_table_head(n: usize) -> String {
    let heads: Vec<String> = (1..=n).map(|k| format!("run {k}")).collect();
    format!(
        "\n**Repeated runs** ({n} runs, systems interleaved)\n\n\
         | system | figure | {} | median | range |\n|---|---|{}---:|---:|\n",
        heads.join(" | "),
        "---:|".repeat(n)
    )
}

/// One row of a *Repeated runs* table: a figure of one system in every
/// run (– where missing), its median and its range.
pub fn repeated_figure_row(system: &str, label: &str, vals: &[Option<f64>]) -> String {
    let got: Vec<f64> = vals.iter().flatten().copied().collect();
    let cells: Vec<String> = vals
        .iter()
        .map(|v| v.map_or("–".into(), |v| format!("{v:.2}")))
        .collect();
    let (lo, hi) = got
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    format!(
        "| {system} | {label} | {} | {} | {} |\n",
        cells.join(" | "),
        median(&got).map_or("–".into(), |m| format!("{m:.2}")),
        if got.is_empty() {
            "–".into()
        } else {
            format!("{lo:.2}–{hi:.2}")
        }
    )
}

/// Every goal's verdict in every run (`by_run[k]`: run k + 1's verdicts,
/// the same goals in the same order) and how many runs met it, then the
/// evidence of runs 2 and later.
pub fn goals_by_run_markdown(by_run: &[Vec<Verdict>]) -> String {
    let n = by_run.len();
    let mut s = String::new();
    let Some(first_run) = by_run.first() else {
        return s;
    };
    let heads: Vec<String> = (1..=n).map(|k| format!("run {k}")).collect();
    let _ = writeln!(s, "\n| goal | {} | met in |", heads.join(" | "));
    let _ = writeln!(s, "|---|{}---:|", "---|".repeat(n));
    for (g, first) in first_run.iter().enumerate() {
        let words: Vec<&str> = by_run.iter().map(|v| v[g].word()).collect();
        let met = by_run.iter().filter(|v| v[g].met == Some(true)).count();
        let _ = writeln!(
            s,
            "| {} ({}) | {} | {met} of {n} |",
            first.goal,
            first.source,
            words.join(" | ")
        );
    }
    for (k, verdicts) in by_run.iter().enumerate().skip(1) {
        for v in verdicts {
            let _ = writeln!(s, "\n- run {}: {}: {}.", k + 1, v.source, v.evidence);
        }
    }
    s
}

/// Everything the report needs about the whole invocation.
#[derive(Clone, Debug, Serialize)]
pub struct Header {
    /// The command line.
    pub command: String,
    /// `quick` or `full`.
    pub mode: String,
    /// UTC, RFC 3339, at the start.
    pub started: String,
    /// Wall seconds of the whole invocation.
    pub wall_s: f64,
    /// Of which waiting for KSM's lock (another KSM user held it).
    pub lock_wait_s: f64,
    /// CPU model.
    pub cpu_model: String,
    /// CPUs.
    pub cpus: usize,
    /// RAM, GiB.
    pub ram_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// Load average before and after.
    pub load_before: [f64; 3],
    /// Load average after.
    pub load_after: [f64; 3],
    /// Sampling interval, s.
    pub interval_s: f64,
    /// Whether the harness (and so, normally, the daemon next to it) was
    /// built without optimisations, which inflates pagesift's CPU figures.
    pub debug_build: bool,
    /// Runs of every experiment (`--repeat`).
    pub repeat: u32,
}

/// One experiment's results in the report.
#[derive(Clone, Debug)]
pub struct ExperimentResult {
    /// The experiment.
    pub experiment: Experiment,
    /// Its runs, in order (the first run of each system with `--repeat`).
    pub runs: Vec<RunResult>,
    /// With `--repeat N`: runs 2..=N, each the systems in order.
    pub repeats: Vec<Vec<RunResult>>,
    /// Plot files written (relative to the output directory).
    pub plots: Vec<String>,
}

/// The markdown report. `images`: include the plots (the docs section
/// leaves them out, since they live in the output directory).
pub fn markdown(h: &Header, results: &[ExperimentResult], images: bool) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Generated by `{}` ({} mode) on {}, {:.0} s in all, {:.0} s of it waiting for other \
         KSM users to release KSM's lock.\n",
        h.command, h.mode, h.started, h.wall_s, h.lock_wait_s
    );
    let _ = writeln!(
        s,
        "Machine: {}, {} CPUs, {:.1} GiB RAM, Linux {}. Load average (1, 5, 15 min) before: {:.2} {:.2} {:.2}, after: {:.2} {:.2} {:.2}. \
         {}; on a shared machine timings and CPU figures are noisy.{}\n",
        h.cpu_model,
        h.cpus,
        h.ram_gib,
        h.kernel,
        h.load_before[0],
        h.load_before[1],
        h.load_before[2],
        h.load_after[0],
        h.load_after[1],
        h.load_after[2],
        if h.repeat > 1 {
            format!(
                "Every experiment ran {} times, its systems interleaved; the tables show the \
                 first run, *Repeated runs* all of them",
                h.repeat
            )
        } else {
            "Single runs".to_string()
        },
        if h.debug_build {
            " **Debug build**: pagesift's own CPU is inflated; measure with `--release`."
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "Every system runs on a fresh copy of the workload, one after the other, with everything \
         unmerged (KSM run=2) in between. t = 0 is when the system starts, after the workload has \
         filled its memory. Sampled every {:.0} ms. CPU is the deduplicating system's: pagesift \
         daemon + ksmd (+ ksmtuned). *Saved, PSS*: the growth of Σ (Anonymous − Pss_Anon) over the \
         workload's processes, i.e. frames really freed in the workload (smaps_rollup). *Time to \
         99 %*: that saving reaches 99 % of the workload's own count of mergeable pages. *Saved, \
         KSM counters*: (pages_sharing + ksm_zero_pages) × 4 KiB; they are global (another \
         process's mergeable memory counts too) and lag behind COW breaks. *MiB per CPU-s*: \
         memory saved at 99 % over the CPU-seconds until then (UKSM §8.1.1's efficiency). Ratios \
         are system ÷ reference (the pagesift configuration named, same run).\n",
        h.interval_s * 1000.0
    );
    for r in results {
        let e = &r.experiment;
        let reference = e.reference.name();
        let _ = writeln!(s, "### {} ({})\n", e.name, e.paper);
        let _ = writeln!(
            s,
            "{}. Window {:.0} s; reference {}.",
            e.about, e.window_s, reference
        );
        if let Some(t) = r.runs.iter().find_map(|x| x.target_pages) {
            let _ = writeln!(s, " Mergeable: {t} pages ({:.1} MiB).", t as f64 * PAGE_MIB);
        }
        if !e.workloads.is_empty() {
            let fill: Vec<String> = r
                .runs
                .iter()
                .map(|x| format!("{:.1}", x.fill_seconds))
                .collect();
            let _ = writeln!(s, " Workload fill time per run [s]: {}.", fill.join(", "));
        }
        s.push('\n');
        let rws = rows(&r.runs, &reference);
        s.push_str(&table(&rws, e.window_s));
        for row in &rws {
            for n in &row.notes {
                let _ = writeln!(s, "\n- {}: {n}", row.system);
            }
        }
        s.push_str(&goals_markdown(e, &r.runs));
        if !r.repeats.is_empty() {
            s.push_str(&repeats_markdown(r));
        }
        if images {
            for p in &r.plots {
                let _ = writeln!(s, "\n![{p}]({p})");
            }
        }
        s.push('\n');
    }
    s
}

/// Writes every series of `runs` as `csv/<experiment>/<system>__<metric>.csv`
/// (columns `seconds` and the metric with its unit) under `dir`; returns
/// the files written.
pub fn write_csv(dir: &Path, runs: &[RunResult]) -> Result<Vec<PathBuf>, BenchError> {
    let mut out = Vec::new();
    for r in runs {
        let d = dir.join("csv").join(&r.experiment);
        std::fs::create_dir_all(&d)
            .map_err(|e| BenchError::Output(format!("{}: {e}", d.display())))?;
        for s in &r.series {
            let path = d.join(format!("{}__{}.csv", sanitize(&s.system), s.metric));
            write_series(&path, s)?;
            out.push(path);
        }
    }
    Ok(out)
}

/// One series as CSV.
pub fn write_series(path: &Path, s: &Series) -> Result<(), BenchError> {
    let err = |e: csv::Error| BenchError::Output(format!("{}: {e}", path.display()));
    let mut w = csv::Writer::from_path(path).map_err(err)?;
    w.write_record(["seconds", &format!("{} ({})", s.metric, s.unit)])
        .map_err(err)?;
    for &(t, v) in &s.points {
        w.write_record([format!("{t:.3}"), format!("{v}")])
            .map_err(err)?;
    }
    w.flush()
        .map_err(|e| BenchError::Output(format!("{}: {e}", path.display())))
}

/// `doc` with the text between `<!-- BEGIN key -->` and `<!-- END key -->`
/// replaced by `section` (appended with its markers when they are
/// missing). Each kind of invocation (`bench-quick`,
/// `bench-full-static-mixed`, ...) has its own section, so the quick report
/// and the full static-mixed table live side by side.
pub fn splice_docs(doc: &str, key: &str, section: &str) -> String {
    let (begin, end) = (
        format!("<!-- BEGIN {key} -->"),
        format!("<!-- END {key} -->"),
    );
    let block = format!("{begin}\n{}\n{end}", section.trim_end());
    match (doc.find(&begin), doc.find(&end)) {
        (Some(a), Some(b)) if a < b => {
            format!("{}{}{}", &doc[..a], block, &doc[b + end.len()..])
        }
        _ => format!("{}\n\n{}\n", doc.trim_end(), block),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(system: &str, saved: &[(f64, f64)], cpu: &[(f64, f64)]) -> RunResult {
        let mut s = Series::new(system, metric::SAVED, "MiB");
        let mut p = Series::new(system, metric::SAVED_PSS, "MiB");
        for &(t, v) in saved {
            s.push(t, v);
            p.push(t, v);
        }
        let mut c = Series::new(system, metric::CPU, "CPU-s");
        for &(t, v) in cpu {
            c.push(t, v);
        }
        RunResult {
            experiment: "static-mixed".into(),
            system: system.into(),
            series: vec![s, p, c],
            target_pages: Some(256 * 100), // 100 MiB
            saved_by: SavedBy::KsmCounters,
            fill_seconds: 0.1,
            window_s: 10.0,
            notes: vec![],
            cycles: vec![],
        }
    }

    #[test]
    fn figures_follow_the_definitions() {
        // Merges 100 MiB linearly from 1 s to 2 s, at 1 CPU-s per second
        // until 2 s, then idle.
        let r = run(
            "pagesift-full",
            &[(0.0, 0.0), (1.0, 0.0), (2.0, 100.0), (10.0, 100.0)],
            &[(0.0, 0.0), (2.0, 2.0), (10.0, 2.0)],
        );
        let f = Figures::of(&r);
        assert!((f.t99_s.unwrap() - 1.99).abs() < 1e-9);
        assert!((f.cpu_to_t99_s.unwrap() - 1.99).abs() < 1e-9);
        assert!((f.mib_per_cpu_s.unwrap() - 99.0 / 1.99).abs() < 1e-9);
        assert_eq!(f.cpu_window_s, 2.0);
        assert!((f.cpu_percent - 20.0).abs() < 1e-9);
        assert_eq!(f.saved_pss_mean_mib, 100.0);
        assert_eq!(f.saved_end_mib, 100.0);
    }

    #[test]
    fn ratios_are_against_the_reference_and_unreached_targets_say_so() {
        let fast = run(
            "pagesift-full",
            &[(0.0, 0.0), (1.0, 100.0), (10.0, 100.0)],
            &[(0.0, 0.0), (10.0, 1.0)],
        );
        let slow = run(
            "ksm-1000",
            &[(0.0, 0.0), (4.0, 100.0), (10.0, 100.0)],
            &[(0.0, 0.0), (10.0, 8.0)],
        );
        let never = run(
            "ksm-100",
            &[(0.0, 0.0), (10.0, 10.0)],
            &[(0.0, 0.0), (10.0, 0.5)],
        );
        let rows = rows(&[fast, slow, never], "pagesift-full");
        assert_eq!(rows[0].cpu_ratio, Some(1.0));
        assert!((rows[1].t99_ratio.unwrap() - 4.0).abs() < 1e-9);
        assert!((rows[1].cpu_ratio.unwrap() - 8.0).abs() < 1e-9);
        assert_eq!(rows[2].t99_ratio, None);
        let t = table(&rows, 10.0);
        assert_eq!(t.lines().count(), 5, "{t}");
        assert!(t.contains("| ksm-1000 | 3.96 |"), "{t}");
        assert!(t.contains("not in 10 s"), "{t}");
        assert!(t.contains("× 8.00"), "{t}");
    }

    fn reach_goal() -> GoalSpec {
        GoalSpec {
            source: "real-workload goal 2",
            goal: Goal::ReachExact {
                system: crate::system::System::pagesift(
                    pagesift_core::pipeline::governor::Governor::Full,
                ),
                against: crate::system::System::Ksm {
                    pages_to_scan: 1000,
                },
                fraction: 0.9,
                within_s: 30.0,
                max_cpu_ratio: 0.5,
            },
        }
    }

    #[test]
    fn reach_goal_is_judged_from_the_measured_figures() {
        // Exact saving 100 MiB. pagesift: 90 MiB at 20 s with 2 CPU-s;
        // KSM: 90 MiB at 5 s with 8 CPU-s over the 40 s window.
        let me = run(
            "pagesift-full",
            &[(0.0, 0.0), (10.0, 0.0), (30.0, 180.0), (40.0, 180.0)],
            &[(0.0, 0.0), (40.0, 2.0)],
        );
        let ksm = run(
            "ksm-1000",
            &[(0.0, 0.0), (10.0, 180.0), (40.0, 180.0)],
            &[(0.0, 0.0), (40.0, 8.0)],
        );
        let mut runs = vec![me, ksm];
        for r in &mut runs {
            r.window_s = 40.0;
        }
        let v = judge(&reach_goal(), &runs, 40.0);
        assert_eq!(v.met, Some(true), "{v:?}");
        assert!(v.evidence.contains("at 20.00 s"), "{v:?}");
        assert!(v.evidence.contains("× 0.25"), "{v:?}");
        // Over half of KSM's CPU: not met.
        runs[0].series[2] = {
            let mut c = Series::new("pagesift-full", metric::CPU, "CPU-s");
            c.push(0.0, 0.0);
            c.push(40.0, 4.5);
            c
        };
        assert_eq!(judge(&reach_goal(), &runs, 40.0).met, Some(false));
        // 90 % never reached: not met.
        let mut slow = runs.clone();
        slow[0].series[1].points = vec![(0.0, 0.0), (40.0, 80.0)];
        slow[0].series[2].points = vec![(0.0, 0.0), (40.0, 1.0)];
        let v = judge(&reach_goal(), &slow, 40.0);
        assert_eq!(v.met, Some(false), "{v:?}");
        assert!(v.evidence.contains("not in 40 s"), "{v:?}");
        // 90 % after 30 s: not met.
        slow[0].series[1].points = vec![(0.0, 0.0), (35.0, 0.0), (36.0, 100.0)];
        assert_eq!(judge(&reach_goal(), &slow, 40.0).met, Some(false));
        // KSM did not run: not judged.
        let v = judge(&reach_goal(), &runs[..1], 40.0);
        assert_eq!((v.met, v.word()), (None, "not judged"));
        let e = crate::experiment::all(crate::experiment::Mode::Quick)
            .into_iter()
            .find(|e| e.name == "interpreter-workers")
            .unwrap();
        let md = goals_markdown(&e, &runs);
        assert!(md.contains("| pagesift-full | 100.0 | 20.00 |"), "{md}");
        assert!(md.contains("| ksm-1000 | 100.0 | 5.00 |"), "{md}");
        assert!(
            md.contains("**Goal (real-workload goal 2): pagesift-full reaches 90 %"),
            "{md}"
        );
        assert!(md.contains(": not met.**"), "{md}");
    }

    #[test]
    fn repeated_runs_show_every_run_the_median_and_the_goal_per_run() {
        let e = crate::experiment::all(crate::experiment::Mode::Quick)
            .into_iter()
            .find(|e| e.name == "interpreter-workers")
            .unwrap();
        // pagesift reaches 90 % of 100 MiB at 20 s in every run; its CPU is
        // 2, 4.5 and 3 CPU-s against KSM's 8: met, not met, met.
        let pair = |cpu: f64| {
            let mut me = run(
                "pagesift-full",
                &[(0.0, 0.0), (10.0, 0.0), (30.0, 180.0), (40.0, 180.0)],
                &[(0.0, 0.0), (40.0, cpu)],
            );
            let mut ksm = run(
                "ksm-1000",
                &[(0.0, 0.0), (10.0, 180.0), (40.0, 180.0)],
                &[(0.0, 0.0), (40.0, 8.0)],
            );
            me.window_s = 40.0;
            ksm.window_s = 40.0;
            me.notes = vec![format!("ran at {cpu} CPU-s")];
            vec![me, ksm]
        };
        let r = ExperimentResult {
            experiment: e,
            runs: pair(2.0),
            repeats: vec![pair(4.5), pair(3.0)],
            plots: Vec::new(),
        };
        let md = repeats_markdown(&r);
        assert!(md.contains("3 runs, systems interleaved"), "{md}");
        assert!(
            md.contains(
                "| pagesift-full | CPU-s over the window | 2.00 | 4.50 | 3.00 | 3.00 | 2.00–4.50 |"
            ),
            "{md}"
        );
        assert!(
            md.contains(
                "| ksm-1000 | CPU-s over the window | 8.00 | 8.00 | 8.00 | 8.00 | 8.00–8.00 |"
            ),
            "{md}"
        );
        assert!(md.contains("| met | not met | met | 2 of 3 |"), "{md}");
        assert!(md.contains("- run 2: real-workload goal 2:"), "{md}");
        // The later runs' notes (the first run's are under its table).
        assert!(
            md.contains("- run 2, pagesift-full: ran at 4.5 CPU-s"),
            "{md}"
        );
        assert!(
            md.contains("- run 3, pagesift-full: ran at 3 CPU-s"),
            "{md}"
        );
        assert!(!md.contains("ran at 2 CPU-s"), "{md}");
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }

    #[test]
    fn save_as_much_goal_compares_saving_and_cpu() {
        let g = GoalSpec {
            source: "real-workload goal 1",
            goal: Goal::SaveAsMuch {
                system: crate::system::System::pagesift(
                    pagesift_core::pipeline::governor::Governor::Full,
                ),
                against: crate::system::System::Ksm {
                    pages_to_scan: 1000,
                },
                min_saved_ratio: 1.0,
                max_cpu_ratio: 1.0,
            },
        };
        let me = run(
            "pagesift-full",
            &[(0.0, 0.0), (10.0, 50.0)],
            &[(0.0, 0.0), (10.0, 1.0)],
        );
        let ksm = run(
            "ksm-1000",
            &[(0.0, 0.0), (10.0, 100.0)],
            &[(0.0, 0.0), (10.0, 2.0)],
        );
        let v = judge(&g, &[me.clone(), ksm.clone()], 10.0);
        assert_eq!(v.met, Some(false), "{v:?}");
        assert!(v.evidence.contains("saved × 0.50"), "{v:?}");
        // Runs are found by name, not position.
        assert_eq!(judge(&g, &[ksm.clone(), me], 10.0).met, Some(false));
        let mut big = ksm;
        big.system = "pagesift-full".into();
        let small = run(
            "ksm-1000",
            &[(0.0, 0.0), (10.0, 80.0)],
            &[(0.0, 0.0), (10.0, 3.0)],
        );
        assert_eq!(judge(&g, &[big.clone(), small], 10.0).met, Some(true));
        // Against a system that saved nothing, the CPU decides.
        let nothing = |cpu: f64| {
            run(
                "ksm-1000",
                &[(0.0, 0.0), (10.0, 0.0)],
                &[(0.0, 0.0), (10.0, cpu)],
            )
        };
        let v = judge(&g, &[big.clone(), nothing(0.5)], 10.0);
        assert_eq!(v.met, Some(false), "{v:?}");
        assert!(v.evidence.contains("something against nothing"), "{v:?}");
        assert!(v.evidence.contains("CPU × 4.00"), "{v:?}");
        assert_eq!(judge(&g, &[big, nothing(2.0)], 10.0).met, Some(true));
    }

    #[test]
    fn sooner_at_equal_cpu_reads_the_file_data_series_and_judges_cpu() {
        use crate::system::{System, Tuning};
        use pagesift_core::pipeline::governor::Governor;
        let hints = System::pagesift(Governor::Full);
        let nohints = System::Pagesift {
            governor: Governor::Full,
            tuning: Tuning::NoHints,
        };
        let g = GoalSpec {
            source: "issue 12",
            goal: Goal::Sooner {
                system: hints,
                against: nohints,
                fractions: [0.5, 0.9],
                min_speedup: 2.0,
                max_cpu_ratio: Some(1.0),
            },
        };
        // File data (target 100 MiB): hints reach it at 2 s, no hints at
        // 8 s; the PSS series (everything) says otherwise and is ignored.
        let guest_run = |system: &str, file: &[(f64, f64)], cpu: f64| {
            let mut r = run(
                system,
                &[(0.0, 0.0), (40.0, 500.0)],
                &[(0.0, 0.0), (40.0, cpu)],
            );
            r.saved_by = SavedBy::FileData;
            let mut f = Series::new(system, metric::FILE_SAVED, "MiB");
            for &(t, v) in file {
                f.push(t, v);
            }
            r.series.push(f);
            r.window_s = 40.0;
            r
        };
        let fast = guest_run(
            "pagesift-full",
            &[(0.0, 0.0), (2.0, 100.0), (40.0, 100.0)],
            1.0,
        );
        let slow = guest_run(
            "pagesift-full-nohints",
            &[(0.0, 0.0), (8.0, 100.0), (40.0, 100.0)],
            1.2,
        );
        let v = judge(&g, &[fast.clone(), slow.clone()], 40.0);
        assert_eq!(v.met, Some(true), "{v:?}");
        assert!(
            v.evidence.contains("50 %: 1.00 s vs 4.00 s (4.0×)"),
            "{v:?}"
        );
        assert!(v.evidence.contains("CPU 1.00 s vs 1.20 s"), "{v:?}");
        assert!(v.goal.contains("at ≤ 1 × its CPU-seconds"), "{v:?}");
        // Sooner, but at more CPU: not met.
        let mut costly = fast.clone();
        costly.series[2].points = vec![(0.0, 0.0), (40.0, 1.5)];
        assert_eq!(judge(&g, &[costly, slow.clone()], 40.0).met, Some(false));
        // Equal CPU but not 2× sooner: not met.
        let close = guest_run(
            "pagesift-full",
            &[(0.0, 0.0), (6.0, 100.0), (40.0, 100.0)],
            1.0,
        );
        assert_eq!(judge(&g, &[close, slow.clone()], 40.0).met, Some(false));
        // The table reads the same series.
        let t = sooner_table(&[fast, slow], 40.0);
        assert!(
            t.contains("| pagesift-full | 100.0 | 1.00 | 1.80 | 100.0 | 1.00 |"),
            "{t}"
        );
    }

    #[test]
    fn the_docs_section_is_replaced_between_markers_only() {
        let doc = "# b\n\nkeep\n<!-- BEGIN bench -->\nold\n<!-- END bench -->\ntail\n";
        let d = splice_docs(doc, "bench", "new\n");
        assert_eq!(
            d,
            "# b\n\nkeep\n<!-- BEGIN bench -->\nnew\n<!-- END bench -->\ntail\n"
        );
        let added = splice_docs("# b\n", "bench", "x");
        assert!(added.ends_with("<!-- BEGIN bench -->\nx\n<!-- END bench -->\n"));
        assert_eq!(splice_docs(&added, "bench", "x"), added);
        // Another key leaves this section alone.
        let two = splice_docs(&added, "bench-full", "y");
        assert!(two.contains("<!-- BEGIN bench -->\nx\n<!-- END bench -->"));
        assert!(two.ends_with("<!-- BEGIN bench-full -->\ny\n<!-- END bench-full -->\n"));
    }

    #[test]
    fn series_become_csv_files() {
        let dir = std::env::temp_dir().join(format!("pagesift-bench-csv-{}", std::process::id()));
        let r = run(
            "ksm-paced@2%",
            &[(0.0, 0.0), (0.25, 1.5)],
            &[(0.0, 0.0), (0.25, 0.1)],
        );
        let files = write_csv(&dir, &[r]).unwrap();
        assert_eq!(files.len(), 3);
        let text = std::fs::read_to_string(&files[0]).unwrap();
        assert_eq!(text, "seconds,saved_mib (MiB)\n0.000,0\n0.250,1.5\n");
        assert!(files[0].ends_with("csv/static-mixed/ksm-paced-2pct__saved_mib.csv"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
