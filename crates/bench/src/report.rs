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
use crate::experiment::{Experiment, SavedBy};
use crate::measure::{self, ratio};
use crate::run::{RunResult, sanitize};
use crate::sampler::metric;
use crate::series::Series;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

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
        let saved = match r.saved_by {
            SavedBy::KsmCounters => pts(metric::SAVED),
            SavedBy::Pss => pts(metric::SAVED_PSS),
        };
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
}

/// One experiment's results in the report.
#[derive(Clone, Debug)]
pub struct ExperimentResult {
    /// The experiment.
    pub experiment: Experiment,
    /// Its runs, in order.
    pub runs: Vec<RunResult>,
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
         Single runs; on a shared machine timings and CPU figures are noisy.{}\n",
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
