//! Live runs of the harness with real processes and the real KSM (root).
//!
//! - A short real run of one small experiment (static-mixed, 64 MiB + 64
//!   MiB, pagesift-full and ksm-10000, 10 s window) produces CSV series
//!   sampled at ≥ 2 Hz, a report with both systems' rows, a saving > 0 for
//!   both, KSM's knobs as they were, and no child process left.
//! - Interrupting `pagesift bench` with SIGINT in the middle of a pagesift
//!   run leaves no workload or daemon behind and KSM's knobs as they were.
//!
//! Knob snapshots are taken under KSM's lock, so another KSM user (a test
//! of another crate) cannot be caught half-way.

use pagesift_bench::experiment::{Experiment, SavedBy};
use pagesift_bench::system::System;
use pagesift_bench::{BenchOptions, measure};
use pagesift_core::pipeline::governor::Governor;
use pagesift_linux::ksm::KsmGuard;
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// KSM's writable knobs now, read under the lock.
fn knobs() -> String {
    let g = KsmGuard::acquire().expect("KSM lock");
    let s = g.snapshot().clone();
    drop(g);
    let mut v: Vec<String> = s.iter().map(|(k, v)| format!("{k}={v}")).collect();
    v.sort();
    v.join(" ")
}

/// Pids whose parent is `ppid`.
fn children_of(ppid: u32) -> BTreeSet<u32> {
    procfs::process::all_processes()
        .unwrap()
        .flatten()
        .filter_map(|p| p.stat().ok())
        .filter(|s| s.ppid == ppid as i32 && s.state != 'Z')
        .map(|s| s.pid as u32)
        .collect()
}

/// A fresh output directory for the bench (it makes it itself), inside a
/// temporary directory removed when the guard drops.
fn out_dir(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = pagesift_testkit::temp_dir(&format!("bench-test-{name}"));
    let out = tmp.path().join("out");
    (tmp, out)
}

#[test]
fn a_short_run_measures_both_systems_and_leaves_nothing_behind() {
    // The tests look for leftover children of this process: one at a time.
    let _serial = pagesift_testkit::serial();
    pagesift_testkit::require_root();
    let pagesift = pagesift_testkit::pagesift_bin();
    let workload = pagesift_testkit::workload_bin();
    let before = knobs();
    let (_tmp, out) = out_dir("short");
    let pagesift_full = System::pagesift(Governor::Full);
    let ksm = System::Ksm {
        pages_to_scan: 10000,
    };
    let exp = Experiment {
        name: "static-mixed".into(),
        group: "static-mixed",
        paper: "UKSM §8.1.1",
        about: "64 MiB identical + 64 MiB random".into(),
        guests: None,
        interpreters: None,
        files: None,
        guest_files: None,
        workloads: vec![
            ["static-dup", "--mib", "64", "--seed", "1"]
                .map(String::from)
                .to_vec(),
            ["random", "--mib", "64", "--seed", "2"]
                .map(String::from)
                .to_vec(),
        ],
        target: Some("duplicate_pages"),
        saved_by: SavedBy::KsmCounters,
        systems: vec![pagesift_full, ksm],
        window_s: 10.0,
        reference: pagesift_full,
        goals: Vec::new(),
    };
    let mut opts = BenchOptions::new(out.clone(), pagesift, workload);
    opts.experiments = Some(vec![exp]);
    opts.quiet = true;
    let summary = pagesift_bench::run(&opts).expect("the bench runs");

    // Figures: both systems saved memory, and the table has both rows.
    let rows = &summary.experiments[0].rows;
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert!(
            r.figures.saved_end_mib > 0.0 && r.figures.saved_pss_max_mib > 0.0,
            "{} saved nothing: {:?}",
            r.system,
            r.figures
        );
        assert!(
            r.figures.cpu_window_s > 0.0,
            "{}: {:?}",
            r.system,
            r.figures
        );
        assert!(
            r.figures.samples_per_s >= 2.0,
            "{}: {:?}",
            r.system,
            r.figures
        );
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for s in ["| pagesift-full |", "| ksm-10000 |", "Machine:", "Linux "] {
        assert!(report.contains(s), "report lacks {s:?}:\n{report}");
    }
    // CSV: every series of both systems, sampled at ≥ 2 Hz over the window.
    for sys in ["pagesift-full", "ksm-10000"] {
        for m in [
            "saved_mib",
            "saved_pss_mib",
            "pss_mib",
            "cpu_seconds",
            "cow_breaks",
        ] {
            let p = out.join(format!("csv/static-mixed/{sys}__{m}.csv"));
            let mut rdr = csv::Reader::from_path(&p).unwrap_or_else(|e| panic!("{p:?}: {e}"));
            let pts: Vec<(f64, f64)> = rdr
                .records()
                .map(|r| {
                    let r = r.unwrap();
                    (r[0].parse().unwrap(), r[1].parse().unwrap())
                })
                .collect();
            let rate = measure::sample_rate(&pts).unwrap();
            assert!(rate >= 2.0, "{p:?}: {rate} Hz");
            assert!(pts.last().unwrap().0 >= 9.5, "{p:?} ends early");
        }
    }
    // Nothing left: no child of ours, KSM's knobs as they were.
    assert!(children_of(std::process::id()).is_empty());
    assert_eq!(knobs(), before);
    std::fs::remove_dir_all(&out).unwrap();
}

#[test]
fn sigint_stops_everything_and_restores_ksm() {
    // The tests look for leftover children of this process: one at a time.
    let _serial = pagesift_testkit::serial();
    pagesift_testkit::require_root();
    let pagesift = pagesift_testkit::pagesift_bin();
    pagesift_testkit::workload_bin();
    let before = knobs();
    let (_tmp, out) = out_dir("sigint");
    let mut bench = Command::new(&pagesift)
        .args([
            "bench",
            "--only",
            "static-mixed",
            "--systems",
            "pagesift-full",
            "--out",
        ])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = bench.id();
    // Wait until the daemon and both workloads run (three children).
    let end = Instant::now() + Duration::from_secs(600);
    let mut seen = BTreeSet::new();
    while seen.len() < 3 {
        assert!(Instant::now() < end, "the run never started");
        assert!(bench.try_wait().unwrap().is_none(), "bench exited early");
        seen.extend(children_of(pid));
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_secs(2));
    seen.extend(children_of(pid));
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let status = bench.wait().unwrap();
    let mut err = String::new();
    for l in BufReader::new(bench.stderr.take().unwrap()).lines() {
        err.push_str(&l.unwrap());
        err.push('\n');
    }
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    for p in &seen {
        assert!(
            !pagesift_linux::procstat::is_alive(*p),
            "child {p} survived: {err}"
        );
    }
    assert_eq!(knobs(), before);
    let _ = std::fs::remove_dir_all(&out);
}
