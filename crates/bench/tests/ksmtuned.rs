//! Debian's ksmtuned driven by the harness, live (root): with our
//! threshold it turns KSM on at its first adjustment and the pages of a
//! mergeable workload get merged; its CPU is measured; stopping it (or
//! dropping it, also in a panic) leaves no process of its group behind,
//! and the caller's KsmGuard restores the knobs it changed.
//!
//! Skipped with a message when ksmtuned is not installed, unless
//! PAGESIFT_REQUIRE_GUESTS=1 (then a missing ksmtuned fails the test).

use std::path::Path;
use std::time::{Duration, Instant};

use pagesift_bench::ksmtuned::{KSMTUNED, Ksmtuned, KsmtunedOptions, Threshold};
use pagesift_linux::ksm::{self, Ksm, KsmGuard, Run};

/// Whether ksmtuned is there to test; prints why not.
fn have_ksmtuned() -> bool {
    if Path::new(KSMTUNED).is_file() {
        return true;
    }
    assert!(
        std::env::var("PAGESIFT_REQUIRE_GUESTS").as_deref() != Ok("1"),
        "{KSMTUNED} is missing and PAGESIFT_REQUIRE_GUESTS=1: run scripts/setup"
    );
    eprintln!("skipping: {KSMTUNED} is missing (run scripts/setup)");
    false
}

/// Live (not zombie) processes of process group `pgid`.
fn live_in_group(pgid: u32) -> Vec<(u32, String)> {
    procfs::process::all_processes()
        .unwrap()
        .flatten()
        .filter_map(|p| {
            let s = p.stat().ok()?;
            (s.pgrp == pgid as i32 && s.state != 'Z').then_some((s.pid as u32, s.comm))
        })
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// ksmtuned's sleep_millisecs on this host: max(10, 10 × 16 GiB / MemTotal).
fn expected_sleep_ms() -> u64 {
    let total_kib = <procfs::Meminfo as procfs::Current>::current()
        .unwrap()
        .mem_total
        / 1024;
    (10 * 16 * 1024 * 1024 / total_kib).max(10)
}

#[test]
fn ksmtuned_turns_ksm_on_merges_a_workload_and_leaves_nothing_behind() {
    if !have_ksmtuned() {
        return;
    }
    pagesift_testkit::require_root();
    let guard = KsmGuard::acquire().expect("taking KSM");
    // The workload's pages are merged when it exits; with ksmd stopped by
    // the restore, their stable-tree nodes would stay counted in
    // pages_shared (no memory behind them) until KSM next ran. run=2
    // before the restore removes them.
    guard.set_unmerge_on_restore(true);
    let before = guard.snapshot().clone();
    // A state ksmtuned must change: KSM off, slow.
    guard.set_run(Run::Stop).unwrap();
    guard.set_pages_to_scan(100).unwrap();
    guard.set_sleep_millisecs(200).unwrap();

    let workload = pagesift_testkit::Workload::start_mergeable(&["static-dup", "--mib", "64"]);
    let wpid = workload.pid();
    assert_eq!(
        ksm::merging_pages(wpid).unwrap(),
        0,
        "nothing merged while KSM is off"
    );

    let tuned = Ksmtuned::start(KsmtunedOptions {
        monitor_interval_s: 1,
        threshold: Threshold::Always,
        ..KsmtunedOptions::default()
    })
    .expect("starting ksmtuned");
    let (pid, pgid) = (tuned.pid(), tuned.pgid());
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    assert!(cmdline.contains("ksmtuned"), "pid {pid} is {cmdline:?}");
    assert!(tuned.is_running());
    // It sees our config at Debian's path; the host's file is untouched.
    let seen = std::fs::read_to_string(format!("/proc/{pid}/root/etc/ksmtuned.conf")).unwrap();
    assert!(
        seen.contains("KSM_THRES_COEF='100'"),
        "ksmtuned sees {seen:?}"
    );
    if let Ok(host) = std::fs::read_to_string("/etc/ksmtuned.conf") {
        assert!(!host.contains("pagesift"), "the host's config was changed");
    }
    tuned.retune().unwrap();

    let k = Ksm::open().unwrap();
    let t0 = Instant::now();
    wait_for("ksmtuned to set run = 1", Duration::from_secs(10), || {
        k.run().unwrap() == Run::Run
    });
    eprintln!("KSM on {:?} after start", t0.elapsed());
    // Its first boost is 300 pages, then 300 more per interval up to 1250.
    let pages = k.pages_to_scan().unwrap();
    assert!(
        [300, 600, 900, 1200, 1250].contains(&pages),
        "pages_to_scan {pages}"
    );
    assert_eq!(u64::from(k.sleep_millisecs().unwrap()), expected_sleep_ms());

    // 64 MiB of one content: 16384 pages, all but one mergeable.
    wait_for("the workload to be merged", Duration::from_secs(60), || {
        ksm::merging_pages(wpid).unwrap_or(0) >= 16384 * 9 / 10
    });
    let merged = ksm::merging_pages(wpid).unwrap();
    eprintln!("{merged} pages merged after {:?}", t0.elapsed());

    // A few more intervals: its forks (awk, pgrep, ps, sleep) cost CPU.
    std::thread::sleep(Duration::from_secs(3));
    let cpu = tuned.cpu_seconds();
    let pages = k.pages_to_scan().unwrap();
    eprintln!(
        "ksmtuned CPU {cpu:.3} s over {:?}; pages_to_scan now {pages}",
        t0.elapsed()
    );
    assert!(cpu > 0.0, "ksmtuned's CPU was measured");
    assert!(pages >= 600, "it kept boosting: pages_to_scan {pages}");
    assert!(tuned.cpu_seconds() >= cpu, "CPU never decreases");

    tuned.stop();
    let left = live_in_group(pgid);
    assert!(left.is_empty(), "ksmtuned processes left: {left:?}");
    drop(workload);

    let report = guard.release();
    assert!(report.is_complete(), "{report:?}");
    let after = k.snapshot().unwrap();
    assert_eq!(before.diff(&after), vec![], "KSM knobs restored");
    assert_eq!(
        k.counters().unwrap().pages_shared,
        Some(0),
        "no KSM page left counted"
    );
}

#[test]
fn dropping_ksmtuned_in_a_panic_kills_its_group() {
    if !have_ksmtuned() {
        return;
    }
    pagesift_testkit::require_root();
    let guard = KsmGuard::acquire().expect("taking KSM");
    let before = guard.snapshot().clone();
    let pgid = std::sync::Mutex::new(0u32);
    let tmp = pagesift_testkit::temp_dir("ksmtuned-test");
    let log = tmp.path().join("ksmtuned.log");
    let result = std::panic::catch_unwind(|| {
        let tuned = Ksmtuned::start(KsmtunedOptions {
            monitor_interval_s: 1,
            log: Some(log.clone()),
            ..KsmtunedOptions::default()
        })
        .expect("starting ksmtuned");
        *pgid.lock().unwrap() = tuned.pgid();
        std::thread::sleep(Duration::from_millis(1500));
        assert!(!live_in_group(tuned.pgid()).is_empty());
        panic!("a benchmark failed while ksmtuned ran");
    });
    assert!(result.is_err());
    let pgid = *pgid.lock().unwrap();
    assert_ne!(pgid, 0);
    // Its debug log: the threshold it computed (thres = MemTotal here) and
    // at least one adjustment that started KSM.
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(
        text.contains("thres") && text.contains("KSMCTL start"),
        "log: {text}"
    );
    let left = live_in_group(pgid);
    assert!(left.is_empty(), "ksmtuned processes left: {left:?}");
    drop(guard);
    let after = Ksm::open().unwrap().snapshot().unwrap();
    assert_eq!(before.diff(&after), vec![], "KSM knobs restored");
}
