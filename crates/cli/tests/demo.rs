//! `pagesift demo` as a new user meets it: the real binary, its own
//! workload processes, the real daemon, ptrace injection and kernel KSM.
//!
//! The live tests need root. They run one at a time (`pagesift_testkit::
//! serial`, across test binaries too; KSM's own lock serializes the demo's
//! daemon with every other KSM user besides), and each checks that the demo left the
//! machine as it found it: `/sys/kernel/mm/ksm` (read under KSM's lock, so
//! never in the middle of another owner's session) and no process of the
//! demo left running.

mod support;

use pagesift_linux::ksm::{GuardOptions, KsmGuard, KsmSnapshot};
use pagesift_testkit::{require_root, serial};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::pagesift;

/// KSM's settings, read while holding its lock.
fn ksm_settings() -> KsmSnapshot {
    let g = KsmGuard::acquire_with(GuardOptions {
        wait: Some(Duration::from_secs(600)),
        ..GuardOptions::default()
    })
    .expect("KSM's lock");
    let s = g.snapshot().clone();
    assert!(g.release().is_complete());
    s
}

/// pids whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    procfs::process::all_processes()
        .unwrap()
        .flatten()
        .filter_map(|p| p.stat().ok())
        .filter(|s| s.ppid == pid as i32)
        .map(|s| s.pid as u32)
        .collect()
}

/// Whether `pid` still exists (a zombie counts as gone: it holds no memory
/// and runs nothing).
fn alive(pid: u32) -> bool {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.state != 'Z' && s.state != 'X')
}

/// Processes whose arguments name the demo's directory (its daemon's
/// config and socket), whoever their parent is now.
fn demo_processes(demo_pid: u32) -> Vec<(u32, String)> {
    let dir = format!("pagesift-demo-{demo_pid}");
    procfs::process::all_processes()
        .unwrap()
        .flatten()
        .filter_map(|p| Some((p.pid as u32, p.cmdline().ok()?.join(" "))))
        .filter(|(_, cmd)| cmd.contains(&dir))
        .collect()
}

#[test]
fn a_small_demo_merges_the_identical_pages_and_leaves_the_machine_as_it_was() {
    require_root();
    let _serial = serial();
    let before = ksm_settings();
    let t0 = Instant::now();
    let out = pagesift()
        .args([
            "demo",
            "--mib",
            "64",
            "--json",
            "--seconds",
            "60",
            "--ksm-wait",
            "600",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", out.status);
    let s: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
    eprintln!("{s}\n(demo took {:.1} s)", t0.elapsed().as_secs_f64());

    // The identical process was merged: ≥ 99 % of its pages map to KSM
    // pages, and the memory saved is all but the KSM frames themselves
    // (one per 256 mappings at max_page_sharing 256).
    let pages = s["identical_pages"].as_u64().unwrap();
    assert_eq!(pages, 64 * 256);
    assert!(s["merged_percent"].as_f64().unwrap() >= 99.0, "{s}");
    assert!(s["merged_pages"].as_u64().unwrap() >= pages * 99 / 100);
    assert!(
        s["saved_pages"].as_u64().unwrap() >= pages * 98 / 100,
        "{s}"
    );
    let t99 = s["time_to_99_percent_s"].as_f64().expect("99 % reached");
    assert!(t99 >= 0.0 && t99 <= s["seconds"].as_f64().unwrap());
    // It stopped early, a few seconds after merging was done.
    assert!(s["seconds"].as_f64().unwrap() < 60.0, "{s}");
    assert!(!s["interrupted"].as_bool().unwrap());
    // The work was measured, not assumed: ksmd merged 16384 pages and the
    // daemon sampled them.
    assert!(s["ksmd_cpu_s"].as_f64().unwrap() > 0.0, "{s}");
    assert!(s["daemon_cpu_s"].as_f64().unwrap() > 0.0, "{s}");
    // The random region was never marked, nor merged; no memory changed.
    assert_eq!(s["random_ever_marked"], false, "{s}");
    assert_eq!(s["random_merged_pages"], 0, "{s}");
    assert_eq!(s["checksums_unchanged"], true, "{s}");
    assert_eq!(s["ksm_restored"], true, "{s}");
    // Live figures went to stderr (stdout holds only the JSON), as plain
    // lines since stderr is not a terminal.
    let live: Vec<&str> = err.lines().filter(|l| l.contains("merged ")).collect();
    assert!(live.len() >= 3, "{err}");
    assert!(!err.contains('\r') && !err.contains('\x1b'), "{err:?}");
    assert!(
        live.iter()
            .any(|l| l.contains("100.0 %") || l.contains(" 99."))
    );

    // Nothing left behind.
    let pids = &s["pids"];
    for who in ["identical", "random", "daemon"] {
        let pid = pids[who].as_u64().unwrap() as u32;
        assert!(!alive(pid), "the {who} process {pid} is still running");
    }
    assert_eq!(ksm_settings(), before, "KSM's settings were not restored");
}

#[test]
fn an_interrupted_demo_cleans_up_the_same_way() {
    require_root();
    let _serial = serial();
    let before = ksm_settings();
    let mut demo = pagesift()
        .args([
            "demo",
            "--mib",
            "256",
            "--seconds",
            "120",
            "--ksm-wait",
            "600",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = demo.id();
    let mut stdout = BufReader::new(demo.stdout.take().unwrap());
    // Mid-run: the daemon answers and the live figures have begun.
    let mut text = String::new();
    loop {
        let mut line = String::new();
        if stdout.read_line(&mut line).unwrap() == 0 {
            panic!("the demo ended before its live figures: {text}");
        }
        text.push_str(&line);
        if line.contains("merged ") && line.contains("CPU") {
            break;
        }
    }
    let children = children_of(pid);
    assert_eq!(
        children.len(),
        3,
        "two workloads and the daemon: {children:?}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    text.push_str(&rest);
    let status = demo.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(demo.stderr.as_mut().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(130), "{text}\n{err}");
    assert!(text.contains("interrupted"), "{text}");
    assert!(text.contains("KSM settings:    restored"), "{text}\n{err}");
    assert!(text.contains("checksums unchanged"), "{text}");
    assert!(text.contains("never marked mergeable"), "{text}");
    for c in children {
        assert!(!alive(c), "process {c} of the demo is still running");
    }
    assert!(demo_processes(pid).is_empty(), "{:?}", demo_processes(pid));
    let prefix = format!("pagesift-demo-{pid}-");
    let left: Vec<_> = std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "its directory is removed: {left:?}");
    assert_eq!(ksm_settings(), before, "KSM's settings were not restored");
}

#[test]
fn without_the_capabilities_the_demo_names_them_and_starts_nothing() {
    require_root();
    // Root's uid, but no capabilities at all (setpriv, util-linux).
    let out = Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(env!("CARGO_BIN_EXE_pagesift"))
        .args(["demo", "--mib", "8"])
        .output()
        .expect("setpriv (util-linux)");
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("needs root")
            && err.contains("CAP_SYS_ADMIN")
            && err.contains("CAP_SYS_PTRACE"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "nothing started: {out:?}");
}

#[test]
fn bad_options_are_usage_errors() {
    for (args, want) in [
        (&["--mib", "0"][..], "--mib"),
        (&["--seconds", "0"][..], "--seconds"),
        (&["--governor", "turbo"][..], "turbo"),
    ] {
        let out = pagesift().arg("demo").args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn the_help_shows_demo_and_hides_the_workload_subcommand() {
    let out = pagesift().arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("demo"), "{help}");
    assert!(!help.contains("workload "), "{help}");
    // The hidden subcommand is the workload's own command line.
    let out = pagesift().args(["workload", "--help"]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("static-dup"),
        "{text}"
    );
}
