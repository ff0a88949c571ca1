//! KSM ownership and pacing against the real kernel KSM (root).
//!
//! Every test takes the KSM lock through [`KsmGuard`] (so concurrent test
//! binaries take turns) and checks, with a *second* acquisition, that the
//! machine is back at the settings the first one saw: under the lock
//! protocol that comparison is race-free, because anyone who changed KSM in
//! between has restored it too. `run` in particular goes back to its
//! original value (0 on this machine at rest).
//!
//! - Snapshot/restore round-trips every knob the kernel has, including the
//!   ordering traps (`advisor_mode` resets `pages_to_scan`; the advisor
//!   refuses `pages_to_scan` writes).
//! - A panic inside a guarded scope restores.
//! - SIGTERM restores (through [`TerminationWatch`]) and the process still
//!   dies of SIGTERM; after SIGKILL the next owner finds the settings in
//!   the lock file and restores them.
//! - Knobs that need nothing merged are reported, not silently left, and
//!   are restored once unmerging is allowed; merged memory is unharmed.
//! - The closed loop: a workload that made its own memory mergeable
//!   (PR_SET_MEMORY_MERGE set before exec) with 256 MiB of identical pages
//!   is merged by ksmd paced by [`Pacer`], and ksmd's measured CPU share
//!   over the run is within tolerance of the target.

use pagesift_core::pipeline::pacing::{KsmdTick, PaceMode, Pacer, PacingConfig, PacingDemand};
use pagesift_linux::ksm::{
    self, AdvisorMode, Knob, Ksm, KsmGuard, KsmSnapshot, KsmVmstat, Ksmd, ProcessKsmStat, Run,
    TerminationWatch,
};
use pagesift_testkit::{HOLEY_STATIC_DUP, Workload, require_root, serial};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The settings on this machine when nobody owns KSM: acquire, read,
/// release.
fn settings_at_rest() -> KsmSnapshot {
    let g = KsmGuard::acquire().expect("KSM lock");
    let s = g.snapshot().clone();
    assert_eq!(
        g.ksm().snapshot().unwrap(),
        s,
        "snapshot differs from sysfs"
    );
    assert!(g.release().is_complete());
    s
}

/// Asserts a fresh owner finds `before` (knob by knob, for a readable
/// failure).
fn assert_restored(before: &KsmSnapshot) {
    let g = KsmGuard::acquire().expect("KSM lock");
    let now = g.ksm().snapshot().unwrap();
    assert!(
        now.diff(before).is_empty(),
        "KSM not restored: (knob, now, before) {:?}",
        now.diff(before)
    );
    assert_eq!(g.snapshot(), before);
    assert!(g.release().is_complete());
}

/// Lets ksmd clean up after processes that exited while it was stopped:
/// their stable nodes stay counted in pages_shared until ksmd visits
/// their mm again (observed here). Returns whether nothing is merged
/// any more. Leaves `run` at whatever the guard restores.
fn drain_exited(g: &KsmGuard, limit: Duration) -> bool {
    let start = Instant::now();
    let idle = |k: &Ksm| {
        let c = k.counters().unwrap();
        c.pages_shared == Some(0) && c.pages_sharing == Some(0)
    };
    if idle(g.ksm()) {
        return true;
    }
    g.set_advisor_mode(AdvisorMode::None).ok();
    g.set_pages_to_scan(10_000).unwrap();
    g.set_sleep_millisecs(10).unwrap();
    g.set_run(Run::Run).unwrap();
    while start.elapsed() < limit {
        if idle(g.ksm()) {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    g.set_run(Run::Stop).unwrap();
    idle(g.ksm())
}

/// Its KSM figures (`/proc/PID/ksm_stat`).
fn ksm_stat(w: &Workload) -> ProcessKsmStat {
    ProcessKsmStat::of(w.pid()).expect("ksm_stat")
}

// ---------------------------------------------------------------------------

/// A value different from `v` that the kernel accepts for `knob`.
fn other_value(knob: Knob, v: &str) -> String {
    let n: u64 = v.parse().unwrap_or(0);
    match knob {
        Knob::Run => unreachable!("run is changed separately"),
        Knob::AdvisorMode => if v == "none" { "scan-time" } else { "none" }.into(),
        Knob::MergeAcrossNodes | Knob::UseZeroPages | Knob::SmartScan => {
            if n == 0 { "1" } else { "0" }.into()
        }
        // max_page_sharing must stay >= 2.
        Knob::MaxPageSharing => (n + 1).to_string(),
        // advisor_max_cpu is a percentage.
        Knob::AdvisorMaxCpu => if n > 50 { n - 1 } else { n + 1 }.to_string(),
        _ => (n + 1 + n / 10).to_string(),
    }
}

#[test]
fn snapshot_and_restore_round_trip_every_knob() {
    require_root();
    let _s = serial();
    let before = settings_at_rest();
    {
        let g = KsmGuard::acquire().unwrap();
        // max_page_sharing and merge_across_nodes need nothing merged.
        assert!(
            drain_exited(&g, Duration::from_secs(30)),
            "pages stay merged by a live process; cannot test the EBUSY knobs"
        );
        let ksm = g.ksm().clone();
        let mut changed = Vec::new();
        // pages_to_scan first: once the advisor is on it refuses writes.
        let order = [Knob::PagesToScan]
            .into_iter()
            .chain(
                Knob::ALL
                    .into_iter()
                    .filter(|k| !matches!(k, Knob::PagesToScan | Knob::Run | Knob::AdvisorMode)),
            )
            .chain([Knob::AdvisorMode]);
        for knob in order {
            let Some(v) = before.get(knob) else {
                eprintln!("this kernel has no {knob}");
                continue;
            };
            let new = other_value(knob, v);
            g.set(knob, &new)
                .unwrap_or_else(|e| panic!("setting {knob} = {new}: {e}"));
            assert_eq!(ksm.read(knob).unwrap().as_deref(), Some(new.as_str()));
            changed.push(knob);
        }
        // Entering scan-time reset pages_to_scan to advisor_min_pages_to_scan,
        // which we changed too.
        if before.get(Knob::AdvisorMode) == Some("none") {
            assert_eq!(
                ksm.read(Knob::PagesToScan).unwrap(),
                ksm.read(Knob::AdvisorMinPagesToScan).unwrap()
            );
            // ... and the advisor refuses pages_to_scan writes, saying why.
            let e = g.set_pages_to_scan(777).unwrap_err().to_string();
            assert!(e.contains("advisor"), "{e}");
        }
        g.set_run(Run::Run).unwrap();
        assert_eq!(ksm.run().unwrap(), Run::Run);
        let now = ksm.snapshot().unwrap();
        let differ: Vec<String> = now.diff(&before).into_iter().map(|d| d.0).collect();
        for k in &changed {
            assert!(differ.contains(&k.file_name().to_string()), "{k} unchanged");
        }
        assert!(differ.contains(&"run".to_string()));
        eprintln!("changed {} knobs: {differ:?}", differ.len());
        let report = g.release();
        assert!(report.is_complete(), "{report}");
        // advisor_mode went back before pages_to_scan, and run last.
        let names: Vec<&str> = report.written.iter().map(|w| w.0.as_str()).collect();
        // (pages_to_scan is only written if leaving scan-time did not
        // already reset it to the original.)
        let at = |n: &str| names.iter().rposition(|x| *x == n);
        if changed.contains(&Knob::AdvisorMode) && at("pages_to_scan").is_some() {
            assert!(at("advisor_mode") < at("pages_to_scan"), "{names:?}");
        }
        // ksmd (left running above) was stopped before any knob changed,
        // and run ends at its original value.
        assert_eq!(report.written.first(), Some(&("run".into(), "0".into())));
        assert_eq!(
            report.written.last().unwrap().0 == "run",
            before.get(Knob::Run) != Some("0")
        );
    }
    assert_restored(&before);
}

#[test]
fn a_panic_inside_a_guarded_scope_restores() {
    require_root();
    let _s = serial();
    let before = settings_at_rest();
    let r = std::panic::catch_unwind(|| {
        let g = KsmGuard::acquire().unwrap();
        g.set_pages_to_scan(4321).unwrap();
        g.set_sleep_millisecs(3).unwrap();
        g.set_flag(Knob::UseZeroPages, true).unwrap();
        g.set_run(Run::Run).unwrap();
        assert_eq!(g.ksm().run().unwrap(), Run::Run);
        panic!("a test failing while it owns KSM");
    });
    assert!(r.is_err());
    assert_restored(&before);
    assert_eq!(
        Ksm::open().unwrap().run().unwrap(),
        before.settings().run.unwrap()
    );
}

/// Env var that turns [`ksm_owner_child`] on.
const CHILD_ENV: &str = "PAGESIFT_KSM_TEST_CHILD";

/// Helper run in a child process by the signal tests: owns KSM, changes
/// it, says READY and waits to be killed.
#[test]
#[ignore = "helper: the signal tests run it in a child process"]
fn ksm_owner_child() {
    let Ok(mode) = std::env::var(CHILD_ENV) else {
        return;
    };
    if mode == "term" {
        TerminationWatch::install(Duration::ZERO).unwrap();
    }
    let g = KsmGuard::acquire().unwrap();
    g.set_pages_to_scan(2345).unwrap();
    g.set_sleep_millisecs(7).unwrap();
    g.set_run(Run::Run).unwrap();
    println!("READY {}", std::process::id());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(120));
    drop(g);
}

/// Runs [`ksm_owner_child`] in `mode`, waits for READY, sends `sig`, and
/// returns how the child ended and its pid.
fn run_child(mode: &str, sig: rustix::process::Signal) -> (std::process::ExitStatus, u32) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "ksm_owner_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, mode)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let pid = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
        // The harness prints "test ksm_owner_child ... " before it.
        if let Some(p) = line.split("READY ").nth(1) {
            break p.trim().parse::<u32>().unwrap();
        }
    };
    // It owns KSM and has changed it.
    let ksm = Ksm::open().unwrap();
    assert_eq!(ksm.pages_to_scan().unwrap(), 2345);
    assert_eq!(ksm.run().unwrap(), Run::Run);
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig)
        .unwrap();
    (child.wait().unwrap(), pid)
}

#[test]
fn sigterm_restores_and_the_owner_still_dies_of_it() {
    use std::os::unix::process::ExitStatusExt;
    require_root();
    let _s = serial();
    let before = settings_at_rest();
    let (status, _) = run_child("term", rustix::process::Signal::TERM);
    assert_eq!(status.signal(), Some(15), "{status:?}");
    // Restored by the child itself: nothing owed in the lock file.
    assert_eq!(std::fs::read_to_string(ksm::LOCK_PATH).unwrap(), "");
    let g = KsmGuard::acquire().unwrap();
    assert!(g.recovered().is_none());
    drop(g);
    assert_restored(&before);
}

#[test]
fn after_sigkill_the_next_owner_restores_from_the_lock_file() {
    use std::os::unix::process::ExitStatusExt;
    require_root();
    let _s = serial();
    let before = settings_at_rest();
    let (status, pid) = run_child("kill", rustix::process::Signal::KILL);
    assert_eq!(status.signal(), Some(9), "{status:?}");
    // The dead owner left KSM running, changed, and its record behind.
    let ksm = Ksm::open().unwrap();
    assert_eq!(ksm.run().unwrap(), Run::Run);
    let text = std::fs::read_to_string(ksm::LOCK_PATH).unwrap();
    assert!(
        text.contains(&format!("owner pid {pid}")),
        "lock file: {text:?}"
    );
    assert_eq!(KsmSnapshot::from_text(&text).unwrap(), before);
    let g = KsmGuard::acquire().unwrap();
    let rec = g.recovered().expect("the next owner recovers");
    assert!(rec.is_complete(), "{rec}");
    assert!(rec.written.iter().any(|(k, _)| k == "run"));
    assert!(g.ksm().snapshot().unwrap().diff(&before).is_empty());
    drop(g);
    assert_restored(&before);
}

#[test]
fn busy_knobs_are_reported_and_restored_once_unmerging_is_allowed() {
    require_root();
    let _s = serial();
    let before = settings_at_rest();
    let g = KsmGuard::acquire().unwrap();
    assert!(drain_exited(&g, Duration::from_secs(30)));
    let mps = g.ksm().max_page_sharing().unwrap();
    g.set_number(Knob::MaxPageSharing, mps as u64 + 44).unwrap();
    // 8 MiB of identical pages, merged quickly.
    let mut w = Workload::start_mergeable(&["static-dup", "--mib", "8"]);
    let sum = w.checksum();
    g.set_advisor_mode(AdvisorMode::None).unwrap();
    g.set_pages_to_scan(5_000).unwrap();
    g.set_sleep_millisecs(10).unwrap();
    g.set_run(Run::Run).unwrap();
    let start = Instant::now();
    while ksm_stat(&w).merging_pages.unwrap_or(0) < w.pages() {
        assert!(start.elapsed() < Duration::from_secs(60), "not merged");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The kernel refuses to change max_page_sharing back.
    let r = g.restore();
    assert_eq!(r.unrestored.len(), 1, "{r}");
    let u = &r.unrestored[0];
    assert_eq!(u.knob, "max_page_sharing");
    assert_eq!(u.wanted, mps.to_string());
    assert!(u.reason.contains("EBUSY"), "{}", u.reason);
    // Everything else is back, ksmd is stopped, the pages stay merged.
    assert_eq!(g.ksm().run().unwrap(), before.settings().run.unwrap());
    assert!(ksm_stat(&w).merging_pages.unwrap() >= w.pages());
    // The lock file says what is owed.
    let owed = KsmSnapshot::from_text(&std::fs::read_to_string(ksm::LOCK_PATH).unwrap()).unwrap();
    assert_eq!(
        owed.get(Knob::MaxPageSharing),
        Some(mps.to_string().as_str())
    );
    assert_eq!(owed.len(), 1);
    // With unmerging allowed, run=2 goes first and everything comes back.
    g.set_unmerge_on_restore(true);
    let r = g.restore();
    assert!(r.is_complete(), "{r}");
    assert_eq!(r.written.first().map(|w| w.1.as_str()), Some("2"));
    assert_eq!(g.ksm().max_page_sharing().unwrap(), mps);
    assert_eq!(ksm_stat(&w).merging_pages, Some(0));
    assert!(w.alive());
    assert_eq!(
        w.checksum(),
        sum,
        "merging and unmerging changed the memory"
    );
    drop(w);
    assert!(g.release().is_complete());
    assert_restored(&before);
}

// ---------------------------------------------------------------------------
// The closed loop

/// What one tick of the closed-loop run saw.
#[derive(Debug)]
struct TickLog {
    t: f64,
    share: f64,
    pages_to_scan: u32,
    sleep_ms: u32,
    merged: u64,
}

#[test]
fn paced_ksmd_merges_256_mib_at_the_target_share() {
    require_root();
    let _s = serial();
    let before = settings_at_rest();
    let g = KsmGuard::acquire().unwrap();
    drain_exited(&g, Duration::from_secs(30));
    let ksmd = Ksmd::find().unwrap();
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{}/comm", ksmd.pid()))
            .unwrap()
            .trim(),
        "ksmd"
    );
    let cow0 = KsmVmstat::read().unwrap().cow_ksm.unwrap();

    let mut w = Workload::start_mergeable(&["static-dup", "--mib", "256"]);
    let pages = w.pages();
    assert_eq!(pages, 65_536);
    let st = ksm_stat(&w);
    assert_eq!(
        st.merge_any,
        Some(true),
        "PR_SET_MEMORY_MERGE not inherited"
    );
    assert_eq!(st.mergeable, Some(true));
    let sum = w.checksum();

    // 5 % of one core by default (another share can be tried with
    // PAGESIFT_KSM_TARGET, for the figures in the report).
    let target: f64 = std::env::var("PAGESIFT_KSM_TARGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.05);
    const TICK: Duration = Duration::from_millis(500);
    let mut pacer = Pacer::new(PacingConfig::default()).unwrap();
    let demand = |merged: u64| PacingDemand {
        target_share: target,
        unmerged_pages: pages.saturating_sub(merged),
        scan_pages: 0,
    };
    g.set_advisor_mode(AdvisorMode::None).unwrap();
    g.set_pace(pacer.start(demand(0))).unwrap();
    let cpu_start = ksmd.cpu().unwrap();
    let t_start = Instant::now();
    g.set_run(Run::Run).unwrap();

    let mut log = Vec::new();
    let (mut cpu_prev, mut t_prev) = (cpu_start.ns(), t_start);
    let mut merged = 0;
    while pacer.mode() == PaceMode::Active {
        assert!(
            t_start.elapsed() < Duration::from_secs(120),
            "not merged in 120 s: {log:?}"
        );
        std::thread::sleep(TICK.saturating_sub(t_prev.elapsed()));
        let (cpu, now) = (ksmd.cpu_ns().unwrap(), Instant::now());
        let tick = KsmdTick {
            cpu_ns: cpu - cpu_prev,
            wall_ns: (now - t_prev).as_nanos() as u64,
            ..KsmdTick::default()
        };
        merged = ksm_stat(&w).merging_pages.unwrap();
        let pace = pacer.tick(tick, demand(merged));
        g.set_pace(pace).unwrap();
        log.push(TickLog {
            t: (now - t_start).as_secs_f64(),
            share: tick.share().unwrap(),
            pages_to_scan: pace.pages_to_scan,
            sleep_ms: pace.sleep_millisecs,
            merged,
        });
        (cpu_prev, t_prev) = (cpu, now);
    }
    let cpu_end = ksmd.cpu().unwrap();
    // The CPU-time clock the pacer reads agrees with schedstat, read
    // right after it (ksmd may run a little in between).
    let clock = ksmd.cpu_ns().unwrap();
    if let Some(sched) = cpu_end.schedstat_ns {
        assert!(
            clock >= sched && clock - sched < 50_000_000,
            "clock {clock} ns, schedstat {sched} ns"
        );
    }
    let run_s = (t_prev - t_start).as_secs_f64();
    let share = (cpu_end.ns() - cpu_start.ns()) as f64 / 1e9 / run_s;
    let ticks_share = (cpu_end.ticks_ns - cpu_start.ticks_ns) as f64 / 1e9 / run_s;

    // The trickle that follows.
    let trickle_s = 5.0;
    let c0 = ksmd.cpu_ns().unwrap();
    let t0 = Instant::now();
    let mut prev = (c0, t0);
    while t0.elapsed().as_secs_f64() < trickle_s {
        std::thread::sleep(Duration::from_secs(1));
        let (cpu, now) = (ksmd.cpu_ns().unwrap(), Instant::now());
        let tick = KsmdTick {
            cpu_ns: cpu - prev.0,
            wall_ns: (now - prev.1).as_nanos() as u64,
            ..KsmdTick::default()
        };
        g.set_pace(pacer.tick(tick, demand(ksm_stat(&w).merging_pages.unwrap())))
            .unwrap();
        prev = (cpu, now);
    }
    let trickle_share = (prev.0 - c0) as f64 / 1e9 / (prev.1 - t0).as_secs_f64();
    let trickle_pace = pacer.pace();

    for l in &log {
        eprintln!(
            "t={:5.2}s share={:6.2}% pages_to_scan={:6} sleep={:4}ms merged={}",
            l.t,
            l.share * 100.0,
            l.pages_to_scan,
            l.sleep_ms,
            l.merged
        );
    }
    let ticks_after_first: Vec<f64> = log.iter().skip(1).map(|l| l.share).collect();
    eprintln!(
        "closed loop: target {:.1}%, measured {:.2}% (schedstat) / {:.2}% (stat ticks) over \
         {run_s:.1} s to merge {merged} of {pages} pages; ksmd {:.3} CPU-s; cost estimate \
         {:.0} ns/page; trickle {:.3}% over {trickle_s} s at {:?}",
        target * 100.0,
        share * 100.0,
        ticks_share * 100.0,
        (cpu_end.ns() - cpu_start.ns()) as f64 / 1e9,
        pacer.cost_ns_per_page(PaceMode::Active),
        trickle_share * 100.0,
        trickle_pace,
    );

    // No harm, no COW: the workload never wrote.
    assert_eq!(w.checksum(), sum);
    assert_eq!(KsmVmstat::read().unwrap().cow_ksm.unwrap(), cow0);
    let st = ksm_stat(&w);
    assert!(st.merging_pages.unwrap() >= pages);
    assert_eq!(
        ksm::merging_pages(w.pid()).unwrap(),
        st.merging_pages.unwrap()
    );
    assert!(st.process_profit.unwrap() > 0);

    // The two CPU sources agree (stat is sampled in USER_HZ ticks).
    let (exact, ticks) = (
        (cpu_end.ns() - cpu_start.ns()) as f64,
        (cpu_end.ticks_ns - cpu_start.ticks_ns) as f64,
    );
    assert!(
        (exact - ticks).abs() <= 20e6 + 0.15 * exact,
        "schedstat {exact} ns vs stat {ticks} ns"
    );
    // The share over the whole run, first tick included, within 25 % of
    // the target. Why 25 %: the run is ~12 ticks of 0.5 s, in two phases
    // whose cost per page differs about threefold (a checksum-only first
    // pass at ~0.9 µs/page, then merging at ~2-3 µs, measured here). The
    // pacer starts from the 3 µs seed and needs ~3 ticks to
    // learn each phase (raises are limited to 2x per tick), which in
    // measured runs cost up to ~10 % of the run's CPU below target at the
    // start and ~7 % above it at the switch to merging; the 25 % bound
    // covers both landing on the same side plus the noise of a 2-vCPU
    // machine shared with other jobs (ksmd runs at nice 5). 5 % is the
    // target because it makes the run long enough (the whole job is ~0.3
    // CPU-s) for the loop to matter, and stays reachable for a nice-5
    // thread even when both CPUs are busy.
    assert!(
        (share / target - 1.0).abs() <= 0.25,
        "measured {share:.4} vs target {target}: {log:?}"
    );
    assert!(!ticks_after_first.is_empty());
    // Idle: a trickle well under the 0.5 % the daemon issue allows.
    assert_eq!(pacer.mode(), PaceMode::Trickle);
    assert!(trickle_share < 0.005, "trickle {trickle_share}");

    drop(w);
    assert!(drain_exited(&g, Duration::from_secs(30)));
    assert!(g.release().is_complete());
    assert_restored(&before);
    // ksmd is not left running.
    assert_eq!(
        Ksm::open().unwrap().run().unwrap(),
        before.settings().run.unwrap()
    );
}

/// A `HOLEY_STATIC_DUP` workload that makes all its memory mergeable
/// (`PR_SET_MEMORY_MERGE`), with every present page merged by ksmd run
/// fast under `g` and then stopped; and its present pages.
fn merged_holey_static_dup(g: &KsmGuard) -> (Workload, u64) {
    assert!(drain_exited(g, Duration::from_secs(30)));
    let w = Workload::start_mergeable(HOLEY_STATIC_DUP);
    g.set_advisor_mode(AdvisorMode::None).unwrap();
    g.set_pages_to_scan(5_000).unwrap();
    g.set_sleep_millisecs(10).unwrap();
    g.set_run(Run::Run).unwrap();
    let want = w.count("present_pages");
    let start = Instant::now();
    while ksm_stat(&w).merging_pages.unwrap_or(0) < want {
        assert!(start.elapsed() < Duration::from_secs(60), "not merged");
        std::thread::sleep(Duration::from_millis(50));
    }
    g.set_run(Run::Stop).unwrap();
    (w, want)
}

/// `LinuxSource::page_states` reads kpageflags only for the pages whose
/// class needs it (`inspect::flags_needed`, and in a mergeable region only
/// shared pages or frames seen as KSM pages before); every page must still
/// get the state that reading every present page's flags (`inspect`)
/// gives (no KSM page here has lost all its sharers but one): KSM
/// pages of a mergeable region, zero-page mappings, holes, pages shared
/// with fork children and private pages, in three processes. So must a
/// second look, which takes the KSM frames it knows as merged without a
/// read, and a third after the target broke some of its merged pages.
/// `read_present` (the sweep's one pagemap read for the states and the
/// read) must give the same states and the contents `read_pages` reads.
#[test]
fn page_states_skip_flags_without_changing_a_state() {
    use pagesift_core::source::{MemorySource, PageState};
    use pagesift_core::{PageBuffer, PageRef};
    use pagesift_linux::discover::ProcessFilter;
    use pagesift_linux::inspect::PageInfo;
    use pagesift_linux::{LinuxSource, SourceConfig};

    require_root();
    let _s = serial();
    let before = settings_at_rest();
    {
        let g = KsmGuard::acquire().unwrap();
        let (mut merged, want) = merged_holey_static_dup(&g);
        let mut plain = Workload::start(HOLEY_STATIC_DUP);
        let mut fam = Workload::start(&["fork-family", "--mib", "8", "--seed", "3"]);
        let sums = (merged.checksum(), plain.checksum());

        let pids = [merged.pid(), plain.pid(), fam.pid()];
        let mut src = LinuxSource::new(
            ProcessFilter::pids(pids.iter().copied()),
            SourceConfig::default(),
        )
        .expect("LinuxSource");
        let ids: Vec<_> = src.linux_regions().map(|r| (r.id, r.pages)).collect();
        let compare = |src: &mut LinuxSource| {
            let mut seen = std::collections::HashMap::new();
            for &(id, pages) in &ids {
                for first in (0..pages).step_by(512) {
                    let n = 512.min(pages - first) as usize;
                    let mut infos = vec![PageInfo::default(); n];
                    let mut states = vec![PageState::NotPresent; n];
                    src.inspect(id, first, &mut infos).expect("inspect");
                    src.page_states(id, first, &mut states)
                        .expect("page_states");
                    for (i, (info, state)) in infos.iter().zip(&states).enumerate() {
                        assert_eq!(
                            *state,
                            info.class().state(),
                            "region {id:?} page {}: {info:?}",
                            first as usize + i
                        );
                        *seen.entry(format!("{state:?}")).or_insert(0u64) += 1;
                    }
                    // The sweep's path: the same states, and the present
                    // pages' contents as the checked read gives them.
                    let mut again = vec![PageState::NotPresent; n];
                    let mut words = PageBuffer::new(n);
                    let got = src
                        .read_present(id, first, &mut again, &mut words[..n])
                        .expect("read_present");
                    assert_eq!(again, states, "region {id:?} from page {first}");
                    let present: Vec<PageRef> = (0..n as u32)
                        .filter(|&i| states[i as usize] == PageState::Present)
                        .map(|i| PageRef {
                            region: id,
                            page: first + i,
                        })
                        .collect();
                    let mut want = PageBuffer::new(present.len().max(1));
                    assert_eq!(src.read_pages(&present, &mut want[..]), present.len());
                    assert_eq!(got, present.len(), "region {id:?} from page {first}");
                    assert!(
                        words[..got] == want[..got],
                        "region {id:?} from page {first}: contents differ"
                    );
                }
            }
            seen
        };
        let seen = compare(&mut src);
        for s in ["Merged", "Zero", "Present", "NotPresent"] {
            assert!(seen.get(s).is_some_and(|&n| n > 0), "no {s} page: {seen:?}");
        }
        assert!(seen["Merged"] >= want, "{seen:?}");
        // Again, now that the KSM frames are known (taken as merged
        // without a read): the same states.
        assert_eq!(compare(&mut src), seen);
        // The target rewrites its first 64 pages (merged ones among them,
        // and zero-page mappings and holes): each gets a frame of its own,
        // which the known KSM frames must not hide.
        let broken = 64;
        let r = merged.ask(&format!("rewrite 0 {broken}"));
        assert_eq!(r["rewritten"], broken, "{r}");
        let after = compare(&mut src);
        assert_eq!(
            after["Present"],
            seen["Present"] + broken,
            "{after:?} {seen:?}"
        );
        assert!(after["Merged"] < seen["Merged"], "{after:?} {seen:?}");
        let sums = (r["checksum"].as_str().unwrap().to_string(), sums.1);
        assert!(merged.alive() && plain.alive() && fam.alive());
        assert_eq!((merged.checksum(), plain.checksum()), sums);
    }
    assert_restored(&before);
}

/// `sample_pages` reads a merged page's content once, then leaves pages on
/// the same KSM frame unread for `KSM_CONTENT_KNOWN` while still giving
/// their state; a page the target wrote since (its own frame now) is read
/// again, with the content it has. The target keeps its memory and runs.
#[test]
fn sample_pages_reads_a_merged_frame_once_and_still_gives_every_state() {
    use pagesift_core::source::{MemorySource, PageState};
    use pagesift_core::{PageBuffer, PageRef};
    use pagesift_linux::discover::ProcessFilter;
    use pagesift_linux::{LinuxSource, SourceConfig};

    require_root();
    let _s = serial();
    let before = settings_at_rest();
    {
        let g = KsmGuard::acquire().unwrap();
        let (mut w, _) = merged_holey_static_dup(&g);

        let mut src = LinuxSource::new(ProcessFilter::pids([w.pid()]), SourceConfig::default())
            .expect("LinuxSource");
        let (start, _) = w.region();
        let r = (src.linux_regions())
            .find(|r| r.pid == w.pid() && r.start == start)
            .map(|r| (r.id, r.pages))
            .expect("the workload's region");
        let n = 512.min(r.1) as usize;
        let pages: Vec<PageRef> = (0..n as u32)
            .map(|page| PageRef { region: r.0, page })
            .collect();
        let mut out = PageBuffer::new(n);
        let mut states = vec![Ok(PageState::NotPresent); n];
        let mut read = vec![false; n];
        let mut sample = |src: &mut LinuxSource| {
            src.sample_pages(&pages, out.pages_mut(), &mut states, &mut read);
            let mut by_state = std::collections::BTreeMap::new();
            for (i, s) in states.iter().enumerate() {
                let s = s.clone().expect("a state");
                let e = by_state.entry(format!("{s:?}")).or_insert((0u32, 0u32));
                e.0 += 1;
                if read[i] {
                    e.1 += 1;
                    // What was read is the page's content now.
                    let mut one = [0u32; pagesift_core::WORDS_PER_PAGE];
                    src.read_page(pages[i], &mut one).unwrap();
                    assert_eq!(out.pages()[i], one, "page {i}");
                }
            }
            by_state
        };
        let first = sample(&mut src);
        let (merged, merged_read) = first["Merged"];
        assert!(merged > 64, "{first:?}");
        assert_eq!(
            merged_read, merged,
            "every merged page read the first time: {first:?}"
        );
        let again = sample(&mut src);
        assert_eq!(
            again["Merged"],
            (merged, 0),
            "merged pages on frames just read are left unread, their state given: {again:?}"
        );
        // The target writes its first 64 pages (merged ones among them,
        // and zero-page mappings and holes): they are its own now, and are
        // read.
        let rw = w.ask("rewrite 0 64");
        assert_eq!(rw["rewritten"], 64, "{rw}");
        let after = sample(&mut src);
        let present = after.get("Present").copied().unwrap_or((0, 0));
        assert!(present.0 >= 64 && present.1 == present.0, "{after:?}");
        assert!(
            after["Merged"].0 < merged && after["Merged"].1 == 0,
            "{after:?}"
        );
        assert!(w.alive());
        assert_eq!(w.checksum(), rw["checksum"].as_str().unwrap());
    }
    assert_restored(&before);
}
