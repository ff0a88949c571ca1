//! Sampled `pagesift scan` against the budget: pages sampled per second
//! and the error of the estimated saving, on real workloads.
//!
//! Starts `pagesift-workload` processes (a `mixed` workload: duplicated
//! runs at 30 % inside random data; and a `fork-family`: a parent like
//! `mixed` and three children that each rewrite 25 % of the pages), then,
//! for each budget and seed, runs a sampled scan of them and prints, as
//! Markdown:
//! - where the time went (discovery + census, sampling, estimation);
//! - pages sampled and sampled pages per second of sampling;
//! - the estimated saving of the workload's data region(s) against the
//!   workload's own exact count, in percentage points of its frames, the
//!   mean half-width of the 95 % interval, and how many intervals held
//!   the exact value.
//!
//! Run (as root; `scripts/bench-scan-sampled` does this and writes
//! docs/benchmarks.md):
//! ```text
//! cargo build --release -p pagesift-workload
//! cargo run --release -p pagesift-scan --example bench_sampled -- --mib 1024
//! ```

use pagesift_linux::ProcessFilter;
use pagesift_scan::report::{Mode, Report};
use pagesift_scan::sampled::{Budget, SampledOptions, ScanStats, run_with_stats};
use serde_json::Value;
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

struct Args {
    mib: u64,
    budgets: Vec<u64>,
    trials: u64,
    workload: std::path::PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        mib: 1024,
        budgets: vec![100, 250, 500, 1000, 2000],
        trials: 5,
        workload: std::env::current_exe()
            .ok()
            .and_then(|p| Some(p.parent()?.parent()?.join("pagesift-workload")))
            .unwrap_or_else(|| "target/release/pagesift-workload".into()),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--mib" => a.mib = v.parse().expect("--mib N"),
            "--trials" => a.trials = v.parse().expect("--trials N"),
            "--budgets" => {
                a.budgets = v
                    .split(',')
                    .map(|b| b.trim().parse().expect("--budgets MS,MS,..."))
                    .collect()
            }
            "--workload" => a.workload = v.into(),
            _ => panic!("unknown argument {k} (--mib, --trials, --budgets, --workload)"),
        }
    }
    a
}

/// A workload process (and its children), killed on drop.
struct Workload {
    child: Child,
    report: Value,
}

impl Workload {
    fn start(bin: &std::path::Path, args: &[&str]) -> Workload {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .expect("workload report");
        let report = serde_json::from_str(&line).expect("workload JSON");
        Workload { child, report }
    }

    fn pids(&self) -> Vec<u32> {
        let mut v = vec![self.child.id()];
        if let Some(c) = self.report["children"].as_array() {
            v.extend(c.iter().map(|p| p.as_u64().unwrap() as u32));
        }
        v
    }

    fn start_addr(&self) -> u64 {
        self.report["regions"][0]["start"].as_u64().unwrap()
    }

    fn count(&self, key: &str) -> u64 {
        let v = match key.strip_prefix("family.") {
            Some(k) => &self.report["family"][k],
            None => &self.report[key],
        };
        v.as_u64().unwrap_or_else(|| panic!("no count {key}"))
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        for p in self.pids().into_iter().skip(1) {
            let _ = pagesift_linux::sys::kill(p);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The saving estimate of the data region in every process: value, low,
/// high.
fn region_saving(r: &Report, pids: &[u32], start: u64) -> (f64, f64, f64) {
    let mut s = (0.0, 0.0, 0.0);
    for p in r.processes.iter().filter(|p| pids.contains(&p.pid)) {
        for g in p.regions.iter().filter(|g| g.start == start) {
            s.0 += g.counts.saving.value;
            s.1 += g.counts.saving.low;
            s.2 += g.counts.saving.high;
        }
    }
    s
}

#[derive(Default)]
struct Row {
    elapsed: f64,
    setup: f64,
    sampling: f64,
    estimation: f64,
    sampled: f64,
    units: f64,
    rate: f64,
    abs_err: f64,
    max_err: f64,
    half: f64,
    covered: u64,
    exhaustive: u64,
}

fn measure(
    name: &str,
    w: &Workload,
    exact: u64,
    frames: u64,
    budgets: &[u64],
    trials: u64,
) -> Vec<(u64, Row)> {
    let pids = w.pids();
    let start = w.start_addr();
    let pct = |x: f64| 100.0 * x / frames as f64;
    let mut rows = Vec::new();
    for &ms in budgets {
        let mut row = Row::default();
        for seed in 1..=trials {
            let opts = SampledOptions {
                filter: ProcessFilter::pids(pids.iter().copied()),
                budget: Budget::Time(Duration::from_millis(ms)),
                seed,
                ..SampledOptions::default()
            };
            let (r, st): (Report, ScanStats) = run_with_stats(&opts).expect("scan");
            let (v, lo, hi) = region_saving(&r, &pids, start);
            let err = (pct(v) - pct(exact as f64)).abs();
            row.elapsed += r.elapsed_ms as f64;
            row.setup += (st.discovery + st.census).as_secs_f64() * 1e3;
            row.sampling += st.sampling.as_secs_f64() * 1e3;
            row.estimation += st.estimation.as_secs_f64() * 1e3;
            row.sampled += st.sampled as f64;
            row.units += st.units as f64;
            row.rate += st.sampled as f64 / st.sampling.as_secs_f64().max(1e-9);
            row.abs_err += err;
            row.max_err = row.max_err.max(err);
            row.half += pct((hi - lo) / 2.0);
            row.covered += (lo - 0.5 <= exact as f64 && exact as f64 <= hi + 0.5) as u64;
            if let Mode::Sampled { exhaustive, .. } = r.mode {
                row.exhaustive += exhaustive as u64;
            }
        }
        let t = trials as f64;
        for x in [
            &mut row.elapsed,
            &mut row.setup,
            &mut row.sampling,
            &mut row.estimation,
            &mut row.sampled,
            &mut row.units,
            &mut row.rate,
            &mut row.abs_err,
            &mut row.half,
        ] {
            *x /= t;
        }
        eprintln!("{name}: {ms} ms done");
        rows.push((ms, row));
    }
    rows
}

fn print_table(name: &str, exact: u64, frames: u64, trials: u64, rows: &[(u64, Row)]) {
    println!(
        "**{name}**: {frames} frames in the data region(s), exact saving {exact} pages = {:.2} % \
         of them; {trials} seeds per budget, means over seeds. The scan covers the workload \
         processes' other VMAs too (heap, stack, libraries: \"sampled fraction\" is of all their \
         frames); errors and intervals are of the data region(s), in percentage points of its \
         frames.\n",
        100.0 * exact as f64 / frames as f64
    );
    println!(
        "| budget | elapsed | discovery + census | sampling | estimation | pages sampled | \
         sampled fraction | sampled pages/s | mean abs error | max abs error | mean 95 % half-width | \
         intervals holding exact | exhaustive |"
    );
    println!("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (ms, r) in rows {
        println!(
            "| {ms} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} | {:.1} % | {:.2} M/s | \
             {:.2} pp | {:.2} pp | {:.2} pp | {}/{trials} | {}/{trials} |",
            r.elapsed,
            r.setup,
            r.sampling,
            r.estimation,
            r.sampled,
            100.0 * r.sampled / r.units,
            r.rate / 1e6,
            r.abs_err,
            r.max_err,
            r.half,
            r.covered,
            r.exhaustive
        );
    }
    println!();
}

fn main() {
    let a = args();
    use pagesift_linux::caps::{Capability, has};
    assert!(
        has(Capability::SysAdmin) && has(Capability::SysPtrace),
        "run as root (CAP_SYS_ADMIN for PFNs, CAP_SYS_PTRACE to read processes)"
    );
    assert!(
        a.workload.exists(),
        "{} missing: cargo build --release -p pagesift-workload",
        a.workload.display()
    );
    let mib = a.mib.to_string();
    let half = (a.mib / 2).max(1).to_string();
    {
        let w = Workload::start(
            &a.workload,
            &["mixed", "--mib", &mib, "--dup-ratio", "0.3", "--seed", "4"],
        );
        let (exact, frames) = (w.count("duplicate_pages"), w.count("present_pages"));
        let rows = measure("mixed", &w, exact, frames, &a.budgets, a.trials);
        print_table(
            &format!("mixed, {mib} MiB, 30 % duplicated runs"),
            exact,
            frames,
            a.trials,
            &rows,
        );
    }
    {
        let w = Workload::start(
            &a.workload,
            &[
                "fork-family",
                "--mib",
                &half,
                "--children",
                "3",
                "--dirty-fraction",
                "0.25",
                "--seed",
                "3",
            ],
        );
        let (exact, frames) = (
            w.count("family.duplicate_pages"),
            w.count("family.physical_pages"),
        );
        let rows = measure("fork-family", &w, exact, frames, &a.budgets, a.trials);
        print_table(
            &format!(
                "fork-family, parent {half} MiB (30 % duplicated runs), 3 children rewriting 25 % each"
            ),
            exact,
            frames,
            a.trials,
            &rows,
        );
    }
}
