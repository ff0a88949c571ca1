//! One run: one system on a fresh copy of one experiment's workload.
//!
//! ## Protocol
//!
//! 1. **Clean slate.** Take KSM's lock ([`KsmGuard`]), write `run=2` and
//!    wait until `pages_shared` and `pages_sharing` are 0, so that no merge
//!    of an earlier run (or of anyone else) is counted; then `run=0`.
//! 2. **Set the system up with ksmd stopped.** KSM systems: the advisor
//!    off (or on, for `ksm-advisor`), `pages_to_scan`, `sleep_millisecs` =
//!    20; the guard is kept for the whole run. pagesift: the guard is given
//!    back (the daemon takes the same lock itself and restores KSM when it
//!    stops).
//! 3. **Start the workload** processes in order and wait until each has
//!    filled its memory and printed its counts. KSM systems start them with
//!    `PR_SET_MEMORY_MERGE`; pagesift's are not mergeable by themselves.
//!    The guest-files experiment's guests boot here, all at once (QEMU's
//!    mem-merge on for KSM, off for pagesift), and wait for their read
//!    order, which they get at t = 0 ([`crate::guest_files`]).
//! 4. **t = 0**: write `run=1` (KSM), start ksmtuned, or spawn the daemon
//!    (`pagesift run --governor G --pid ...`, its own process group).
//! 5. **Sample** every `interval` (250 ms: ≥ 2 Hz) until the window ends;
//!    a paced KSM gets a pacer tick once a second.
//! 6. **Stop** the system (the daemon with SIGTERM, which restores KSM),
//!    kill the workloads, and unmerge again (step 1), so runs are
//!    independent and the machine is left as found.
//!
//! A termination request (SIGINT/SIGTERM, see [`crate::Context`]) ends the
//! run at the next sample with [`BenchError::Interrupted`]; the guards
//! ([`Spawned`], [`KsmGuard`]) then stop every process and restore KSM as
//! they drop.

use crate::experiment::{Experiment, SavedBy};
use crate::guest::{Guest, GuestError, GuestOptions};
use crate::guest_files::{self, FileCopies};
use crate::interpreters;
use crate::ksmtuned::{Ksmtuned, KsmtunedOptions};
use crate::procs::{self, Spawned, Workload};
use crate::sampler::{Sampler, metric};
use crate::series::Series;
use crate::system::System;
use crate::{BenchError, Context};
use pagesift_core::pipeline::pacing::{KsmdTick, Pacer, PacingConfig, PacingDemand};
use pagesift_linux::ksm::{AdvisorMode, GuardOptions, Knob, KsmError, KsmGuard, Run};
use pagesift_linux::sys::DeathSignal;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// What one run produced.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The experiment's name.
    pub experiment: String,
    /// The system's name.
    pub system: String,
    /// Every measured series.
    pub series: Vec<Series>,
    /// Mergeable pages, from the workload's own counts.
    pub target_pages: Option<u64>,
    /// Which series time-to-99 % reads.
    pub saved_by: SavedBy,
    /// Seconds the workload took to fill its memory (before t = 0).
    pub fill_seconds: f64,
    /// The window, s.
    pub window_s: f64,
    /// Anything the reader should know about this run.
    pub notes: Vec<String>,
    /// The short-lived workload's cycles within the window
    /// ([`crate::cycles`]); empty for the other workloads.
    pub cycles: Vec<crate::cycles::Cycle>,
}

impl RunResult {
    /// The series of `metric`.
    pub fn series(&self, metric: &str) -> Option<&Series> {
        self.series.iter().find(|s| s.metric == metric)
    }
}

const PAGE_MIB: f64 = pagesift_linux::PAGE_SIZE as f64 / (1024.0 * 1024.0);

/// How long a daemon gets to restore KSM after SIGTERM.
const DAEMON_GRACE: Duration = Duration::from_secs(20);
/// How long the guest-files experiment's guests may take to boot (all at
/// once, before t = 0).
const GUEST_FILES_BOOT_TIMEOUT: Duration = Duration::from_secs(300);
/// How long unmerging may take before the run fails.
const UNMERGE_TIMEOUT: Duration = Duration::from_secs(120);

/// Takes KSM's lock, unmerges everything and stops ksmd (step 1).
pub fn clean_slate(ctx: &Context) -> Result<KsmGuard, BenchError> {
    let acquire = |wait| {
        KsmGuard::acquire_with(GuardOptions {
            wait: Some(wait),
            ..GuardOptions::default()
        })
    };
    let asked = Instant::now();
    let guard = match acquire(Duration::from_secs(3)) {
        Err(KsmError::LockTimeout { holder, .. }) => {
            // Another KSM user (a test, a daemon) holds it: say so, wait.
            ctx.progress.note(&format!(
                "waiting for KSM's lock, held by pid {holder} (up to {:?})",
                ctx.ksm_wait
            ));
            acquire(ctx.ksm_wait)?
        }
        r => r?,
    };
    ctx.add_lock_wait(asked.elapsed());
    guard.set_run(Run::Unmerge)?;
    let end = Instant::now() + UNMERGE_TIMEOUT;
    loop {
        let c = guard.ksm().counters()?;
        if c.pages_shared.unwrap_or(0) == 0 && c.pages_sharing.unwrap_or(0) == 0 {
            break;
        }
        if Instant::now() > end {
            return Err(BenchError::Ksm(format!(
                "KSM still holds {} shared pages {UNMERGE_TIMEOUT:?} after run=2",
                c.pages_shared.unwrap_or(0)
            )));
        }
        if ctx.term.requested() {
            return Err(BenchError::Interrupted);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    guard.set_run(Run::Stop)?;
    Ok(guard)
}

/// Puts the advisor in `mode` if this kernel has one.
fn advisor(guard: &KsmGuard, mode: AdvisorMode) -> Result<(), BenchError> {
    if guard.ksm().has(Knob::AdvisorMode) && guard.ksm().advisor_mode()? != Some(mode) {
        guard.set_advisor_mode(mode)?;
    } else if mode == AdvisorMode::ScanTime && !guard.ksm().has(Knob::AdvisorMode) {
        return Err(BenchError::Ksm(
            "this kernel's KSM has no advisor_mode (Linux 6.8 or later)".into(),
        ));
    }
    Ok(())
}

/// Runs `system` on a fresh copy of `exp`'s workload.
pub fn run_one(ctx: &Context, exp: &Experiment, system: System) -> Result<RunResult, BenchError> {
    let name = system.name();
    let mut notes = Vec::new();
    let guard = clean_slate(ctx)?;
    let mut pacer = None;
    // Step 2, ksmd stopped.
    let guard = match system {
        System::Pagesift { .. } => {
            drop(guard); // the daemon takes the lock itself
            None
        }
        System::Ksm { pages_to_scan } => {
            advisor(&guard, AdvisorMode::None)?;
            guard.set_pages_to_scan(pages_to_scan)?;
            guard.set_sleep_millisecs(20)?;
            Some(guard)
        }
        System::KsmSleep {
            pages_to_scan,
            sleep_ms,
        } => {
            advisor(&guard, AdvisorMode::None)?;
            guard.set_pages_to_scan(pages_to_scan)?;
            guard.set_sleep_millisecs(sleep_ms)?;
            Some(guard)
        }
        System::KsmAdvisor => {
            advisor(&guard, AdvisorMode::ScanTime)?;
            guard.set_sleep_millisecs(20)?;
            notes.push(
                "the scan-time advisor's pages_to_scan depends on ksmd's lifetime CPU \
                 (`scan_time_advisor` in mm/ksm.c)"
                    .into(),
            );
            Some(guard)
        }
        System::KsmPaced { share } => {
            advisor(&guard, AdvisorMode::None)?;
            let mut p = Pacer::new(PacingConfig::default())
                .map_err(|e| BenchError::Ksm(format!("pacer: {e}")))?;
            let demand = PacingDemand {
                target_share: share,
                unmerged_pages: 1,
                // The equal-CPU comparison: the whole share, no cap.
                scan_pages: 0,
            };
            guard.set_pace(p.start(demand))?;
            pacer = Some((p, demand));
            Some(guard)
        }
        System::Ksmtuned => {
            advisor(&guard, AdvisorMode::None)?;
            Some(guard)
        }
        System::KsmFadvise { .. } => {
            return Err(BenchError::Usage(
                "the fadvise system runs only in the page-cache experiment".into(),
            ));
        }
    };
    // Step 3.
    let mut loads = Vec::new();
    let mut cycle_logs = Vec::new();
    for args in &exp.workloads {
        if ctx.term.requested() {
            return Err(BenchError::Interrupted);
        }
        ctx.progress.note(&format!(
            "{} · {name}: starting pagesift-workload {}",
            exp.name,
            args.join(" ")
        ));
        let mut argv: Vec<String> = ctx.workload_prefix.iter().chain(args).cloned().collect();
        if crate::cycles::logs_cycles(args) {
            let path = ctx.work_dir.join(format!(
                "{}-{}-cycles-{}.jsonl",
                exp.name,
                sanitize(&name),
                loads.len()
            ));
            let _ = std::fs::remove_file(&path);
            argv.push("--cycle-log".into());
            argv.push(path.display().to_string());
            cycle_logs.push(path);
        }
        loads.push(Workload::start(
            &ctx.workload_bin,
            &argv,
            system.workload_mergeable(),
        )?);
    }
    let mut target_pages = exp
        .target
        .map(|k| loads.iter().map(|w| w.count(k)).sum::<u64>());
    if let Some(plan) = &exp.interpreters {
        if ctx.term.requested() {
            return Err(BenchError::Interrupted);
        }
        let data = ctx.interpreter_data(plan)?;
        ctx.progress.note(&format!(
            "{} · {name}: starting {} × {} -c worker.py ({} MiB of {} + {} MiB private)",
            exp.name,
            plan.count,
            interpreters::PYTHON,
            plan.data_mib,
            data.display(),
            plan.private_mib
        ));
        let workers = interpreters::start_workers(plan, &data, system.workload_mergeable())?;
        let pids: Vec<u32> = workers.iter().flat_map(|w| w.pids()).collect();
        // The exact saving at the start: ksmd is stopped and no daemon
        // runs yet, so nothing is merged.
        let exact = interpreters::exact_saving(&ctx.pagesift_bin, &pids)?;
        notes.push(format!(
            "exact saving at the start (`pagesift scan --exact`, {} ms): {:.1} MiB of {:.1} MiB \
             present",
            exact.elapsed_ms,
            exact.saving_pages as f64 * PAGE_MIB,
            exact.present_pages as f64 * PAGE_MIB
        ));
        target_pages = Some(exact.saving_pages);
        loads.extend(workers);
    }
    let mut readers = Vec::new();
    if let Some(plan) = &exp.files {
        let sets = crate::files::file_set(&ctx.work_dir, plan)?;
        ctx.progress.note(&format!(
            "{} · {name}: starting {} readers of {} × {} MiB ({} MiB private each)",
            exp.name, plan.readers, plan.files, plan.file_mib, plan.private_mib
        ));
        for (k, set) in sets.iter().enumerate() {
            let args = crate::files::reader_args(plan, k, set);
            let argv: Vec<String> = ctx.workload_prefix.iter().chain(&args).cloned().collect();
            let w = Workload::start(&ctx.workload_bin, &argv, system.workload_mergeable())?;
            readers.push(loads.len());
            loads.push(w);
        }
        target_pages = Some(plan.target_pages());
    }
    let mut guests: Vec<Guest> = Vec::new();
    let mut file_copies = None;
    if let Some(plan) = &exp.guest_files {
        // Booted before t = 0 (ksmd stopped, no daemon yet), waiting for
        // their read order.
        if ctx.term.requested() {
            return Err(BenchError::Interrupted);
        }
        let image = ctx.guest_files_image(plan)?;
        ctx.progress.note(&format!(
            "{} · {name}: booting {} guests of {} MiB",
            exp.name, plan.guests, plan.mem_mib
        ));
        guests = guest_files::boot(
            &image.image,
            plan,
            &sanitize(&name),
            system.workload_mergeable(),
            GUEST_FILES_BOOT_TIMEOUT,
            &|| ctx.term.requested(),
        )?;
        file_copies = Some(FileCopies::new(&name, &image.files, &mut guests)?);
        target_pages = Some(plan.target_pages());
    }
    let fill_seconds: f64 = loads.iter().map(|w| w.fill_seconds).sum::<f64>() + 0.0;
    let groups: Vec<u32> = loads
        .iter()
        .map(|w| w.pgid())
        .chain(guests.iter().map(|g| g.pid()))
        .collect();
    let load_pids: Vec<u32> = loads.iter().flat_map(|w| w.pids()).collect();
    let marks_before = (!load_pids.is_empty())
        .then(|| access_marks(&load_pids))
        .flatten();
    // Step 4: t = 0.
    let mut daemon = None;
    let mut tuned: Option<Ksmtuned> = None;
    match system {
        System::Pagesift { governor, .. } => {
            let mut stem = format!("{}-{}", exp.name, sanitize(&name));
            if let Some(k) = ctx.repetition.get() {
                stem.push_str(&format!("-run{k}"));
            }
            let mut text = system.config_toml().unwrap_or_default();
            if exp.guests.is_some() {
                // Guests start after the daemon: eligible by executable.
                let qemu = &ctx.guest_image()?.tools().qemu;
                let qemu = std::fs::canonicalize(qemu).unwrap_or_else(|_| qemu.clone());
                text.push_str(&format!(
                    "\n[eligible]\nexes = [{:?}]\n",
                    qemu.display().to_string()
                ));
            }
            let pids: Vec<u32> = loads
                .iter()
                .flat_map(|w| w.pids())
                .chain(guests.iter().map(|g| g.pid()))
                .collect();
            let governor = governor.to_string();
            let (d, socket, log_path, waited) =
                start_daemon(ctx, &stem, &text, &["--governor", &governor], &pids)?;
            ctx.add_lock_wait(waited);
            // t = 0 once the daemon has started: its hint program loaded
            // (or the daemon said why not) and, for readers that read at
            // t = 0, their processes seen. Start-up is a one-time cost
            // (mostly loading the BPF program and the kernel's BTF, about
            // 60 ms of CPU on the development machine), so it stays out of
            // the window and gets a note of its own.
            let readers_first = exp.files.is_some() || exp.guest_files.is_some();
            let end = Instant::now() + Duration::from_secs(30);
            while Instant::now() < end
                && daemon_status(ctx, &socket).is_none_or(|s| {
                    s["hints"]["state"] == "starting"
                        || (readers_first && s["totals"]["processes"].as_u64() == Some(0))
                })
            {
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Ok(ns) = pagesift_linux::procstat::cpu_ns(d.pid()) {
                notes.push(format!(
                    "pagesift's start-up before t = 0 (not in the window's CPU): {:.3} CPU-s",
                    ns as f64 / 1e9
                ));
            }
            daemon = Some((d, log_path, socket.clone()));
        }
        System::Ksmtuned => {
            // Debian's settings, memory counted as tight (see ksmtuned.rs:
            // otherwise it never turns KSM on here), and its first
            // adjustment now (SIGUSR1) rather than a 60 s interval later,
            // as if it had been running when the workload arrived.
            let t = Ksmtuned::start(KsmtunedOptions::default())
                .map_err(|e| BenchError::Missing(e.to_string()))?;
            t.retune().map_err(|e| BenchError::System(e.to_string()))?;
            notes.push(
                "ksmtuned with Debian's settings (60 s interval, pages_to_scan +300 per \
                 interval up to 1250) and memory counted as tight; first adjustment at t = 0"
                    .into(),
            );
            tuned = Some(t);
        }
        _ => {
            if let Some(g) = &guard {
                g.set_run(Run::Run)?;
            }
        }
    }
    // t = 0 on the clock the workloads' cycle logs use.
    let t0_unix = pagesift_workload::unix_now();
    let mut sampler = Sampler::start(&name, groups, daemon.as_ref().map(|(d, _, _)| d.pid()))?;
    if let Some(plan) = &exp.files {
        // t = 0: every reader reads its files now.
        let mut secs = Vec::new();
        for &i in &readers {
            secs.push(crate::files::read_now(&mut loads[i], plan)?);
        }
        notes.push(format!(
            "the readers read their files at t = 0 in {} s",
            secs.iter()
                .map(|s| format!("{s:.2}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let mut reads = None;
    if let Some(plan) = &exp.guest_files {
        // t = 0: every guest reads its files now.
        guest_files::start_reading(&mut guests, plan.files)?;
    }
    // Step 5.
    let mut next = Instant::now();
    // ksmd's CPU and its wait for a CPU, which the pacer does not count as
    // sleep (`core::pipeline::pacing`, step 2), as in the daemon.
    let mut last_tick = (Instant::now(), 0u64, sampler.ksmd_wait_ns().unwrap_or(0));
    let mut last_progress = Instant::now();
    loop {
        sampler.sample(tuned.as_ref().map(|t| t.cpu_seconds()))?;
        if let (Some(fc), Some(plan)) = (file_copies.as_mut(), &exp.guest_files) {
            fc.sample(sampler.elapsed())?;
            if !fc.located()
                && let Some(r) =
                    guest_files::reads_done(&guests, &ctx.guest_files_image(plan)?.md5)?
            {
                notes.push(located_note(
                    &fc.locate()?,
                    fc.file_pages(),
                    "once every guest had read its files",
                ));
                reads = Some(r);
            }
            for g in &mut guests {
                if !g.is_running() {
                    return Err(BenchError::System(format!(
                        "guest {} exited during the run (serial log {})",
                        g.name(),
                        g.serial_log().display()
                    )));
                }
            }
        }
        let t = sampler.elapsed();
        if t >= exp.window_s {
            break;
        }
        if let Some(plan) = exp.guests {
            while guests.len() < plan.count && t >= guests.len() as f64 * plan.interval_s {
                let g = Guest::start(
                    ctx.guest_image()?,
                    GuestOptions {
                        name: format!("{}-{}", sanitize(&name), guests.len()),
                        mem_mib: plan.mem_mib,
                        // QEMU's default for KSM; pagesift decides itself.
                        mem_merge: system.workload_mergeable(),
                        input_port: false,
                    },
                )
                .map_err(guest_error)?;
                sampler.add_group(g.pid());
                guests.push(g);
            }
            for g in &mut guests {
                g.poll_ready()
                    .map_err(|e| BenchError::System(e.to_string()))?;
            }
        }
        if ctx.term.requested() {
            return Err(BenchError::Interrupted);
        }
        if let Some((d, log, _)) = daemon.as_mut()
            && !d.running()
        {
            let tail = std::fs::read_to_string(&*log).unwrap_or_default();
            let tail: Vec<&str> = tail.lines().rev().take(5).collect();
            return Err(BenchError::System(format!(
                "pagesift run exited during the run (log {}): {}",
                log.display(),
                tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
            )));
        }
        if let (Some((p, demand)), Some(g)) = (pacer.as_mut(), guard.as_ref())
            && last_tick.0.elapsed() >= Duration::from_secs(1)
        {
            let (cpu, wait) = (sampler.ksmd_cpu_ns()?, sampler.ksmd_wait_ns().unwrap_or(0));
            let tick = KsmdTick {
                cpu_ns: cpu.saturating_sub(last_tick.1),
                wait_ns: wait.saturating_sub(last_tick.2),
                wall_ns: last_tick.0.elapsed().as_nanos() as u64,
            };
            g.set_pace(p.tick(tick, *demand))?;
            last_tick = (Instant::now(), cpu, wait);
        }
        if last_progress.elapsed() >= ctx.progress.every() {
            ctx.progress.status(&format!(
                "{} · {name} · {t:.0}/{:.0} s · saved {:.0} MiB (PSS {:.0}) · CPU {:.2} s",
                exp.name,
                exp.window_s,
                sampler.last(metric::SAVED).unwrap_or(0.0),
                sampler.last(metric::SAVED_PSS).unwrap_or(0.0),
                sampler.last(metric::CPU).unwrap_or(0.0),
            ));
            last_progress = Instant::now();
        }
        next += ctx.interval;
        let now = Instant::now();
        if next > now {
            std::thread::sleep(next - now);
        } else {
            next = now; // a slow sample: do not try to catch up
        }
    }
    // Step 6.
    if let (Some(b), Some(a)) = (marks_before, access_marks(&load_pids)) {
        notes.push(format!(
            "the workload's anonymous pages as the kernel's LRU sees them (kpageflags), t = 0 → \
             window's end: referenced {} → {}, active {} → {}, of {} → {} present; use steps \
             (referenced + 2 × active) {:+} (`linux::access_marks`: pagesift's reads mark the \
             pages they read used; ksmd marks only the page a merge keeps)",
            b.referenced,
            a.referenced,
            b.active,
            a.active,
            b.present,
            a.present,
            a.use_steps() as i64 - b.use_steps() as i64
        ));
    }
    // Guest RAM: the guests boot after t = 0 (vm-boot) and use their
    // pages themselves, so only the end is read, to compare the systems of
    // the run with one another.
    let guest_pids: Vec<u32> = guests.iter().map(|g| g.pid()).collect();
    if let Some(m) = (!guest_pids.is_empty())
        .then(|| access_marks(&guest_pids))
        .flatten()
    {
        notes.push(format!(
            "the guests' RAM as the kernel's LRU sees it at the window's end (kpageflags over \
             the QEMU processes' anonymous pages): referenced {}, active {}, of {} present (the \
             guests' own use marks pages too: compare the systems of this run)",
            m.referenced, m.active, m.present
        ));
    }
    let mut cycles = Vec::new();
    for path in &cycle_logs {
        cycles.extend(
            crate::cycles::read_log(path, t0_unix, exp.window_s).map_err(BenchError::Workload)?,
        );
    }
    if !cycle_logs.is_empty() {
        notes.push(match crate::cycles::CycleStats::of(&cycles) {
            Some(s) => s.note(),
            None => "no cycle was mapped and unmapped within the window".into(),
        });
    }
    if let Some(fc) = file_copies.as_mut() {
        if !fc.located() {
            notes.push(located_note(
                &fc.locate()?,
                fc.file_pages(),
                "at the window's end: the guests had not all read their files by then",
            ));
        }
        target_pages = fc.target_pages().filter(|&t| t > 0).or(target_pages);
        match &reads {
            Some(r) => notes.push(format!(
                "the guests read their files in {} s (guest clock; md5 of every file as the host's)",
                r.iter()
                    .map(|r| format!("{:.2}", r.stop_s - r.start_s))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            None => notes.push("the guests did not all finish reading within the window".into()),
        }
    }
    if (exp.files.is_some() || exp.guest_files.is_some())
        && let Some((_, _, socket)) = &daemon
        && let Some(st) = daemon_status(ctx, socket)
    {
        let h = &st["hints"];
        notes.push(format!(
            "hints {}{}: {} events, {} pages received, {} pushed, {} already mergeable, {} untracked, {} lost to a full ring, {} stale, {} unmapped, {} overwritten, {} looked up, {} duplicates, {} pages marked; {:.0} ns per hint from the ring to the stack (drain, map, push; stack of {})",
            h["state"].as_str().unwrap_or("?"),
            h["reason"]
                .as_str()
                .map_or(String::new(), |r| format!(" ({r})")),
            h["events"],
            h["received"],
            h["pushed"],
            h["mergeable"],
            h["untracked"],
            h["dropped_ring"],
            h["dropped_stale"],
            h["dropped_unmapped"],
            h["overwritten"],
            h["sampled"],
            h["duplicates"],
            h["pages_marked"],
            h["per_hint_ns"].as_f64().unwrap_or(0.0),
            h["capacity"]
        ));
    }
    if exp.guests.is_some() && !guests.is_empty() {
        // What was left to merge: the guests' duplicates at the window's
        // end, exactly, beside what this system had freed by then. It
        // tells a system that merged little of what was there from one
        // whose guests held little alike.
        // A diagnostic: its failure is noted, and the run stands.
        let pids: Vec<u32> = guests.iter().map(|g| g.pid()).collect();
        notes.push(match interpreters::exact_saving(&ctx.pagesift_bin, &pids) {
            Ok(exact) => format!(
                "at the window's end (`pagesift scan --exact`, {} ms): the guests' unmerged \
                 pages held {:.1} MiB of duplicates among themselves (not counting those of a \
                 page KSM had merged already) in {:.1} MiB present; freed by then: {:.1} MiB \
                 (PSS)",
                exact.elapsed_ms,
                exact.saving_pages as f64 * PAGE_MIB,
                exact.present_pages as f64 * PAGE_MIB,
                sampler.last(metric::SAVED_PSS).unwrap_or(0.0)
            ),
            Err(e) => format!("at the window's end, the exact scan of the guests failed: {e}"),
        });
    }
    notes.extend(scan_cost(
        &mut sampler,
        daemon
            .as_ref()
            .and_then(|(_, _, socket)| daemon_status(ctx, socket)),
    )?);
    if let Some((mut d, log, _)) = daemon.take()
        && !d.stop()
    {
        notes.push(format!(
            "pagesift run did not stop within {DAEMON_GRACE:?} of SIGTERM (log {})",
            log.display()
        ));
    }
    if let Some(t) = tuned.take() {
        t.stop();
    }
    if !guests.is_empty() {
        let boots: Vec<String> = guests
            .iter()
            .map(|g| {
                g.boot_time()
                    .map_or("not ready".into(), |d| format!("{:.1}", d.as_secs_f64()))
            })
            .collect();
        notes.push(format!("guests ready after [s]: {}", boots.join(", ")));
    }
    drop(guests);
    let mut series = sampler.finish();
    series.extend(file_copies.map(FileCopies::into_series));
    drop(loads);
    drop(guard);
    drop(clean_slate(ctx)?);
    if let Some(plan) = &exp.files
        && system == exp.reference
    {
        // Once per experiment, with no system running.
        let sets = crate::files::file_set(&ctx.work_dir, plan)?;
        ctx.progress
            .note("measuring the I/O hint program's overhead");
        let costs = crate::files::hint_overhead(
            (&ctx.workload_bin, &ctx.workload_prefix),
            &sets[0],
            None,
            &crate::files::CALL_BYTES,
        )?;
        notes.extend(costs.iter().map(|c| c.line()));
        let costs = crate::files::program_overhead(&sets[0], None)?;
        notes.extend(costs.iter().map(|c| c.line()));
    }
    Ok(RunResult {
        experiment: exp.name.clone(),
        system: name,
        series,
        target_pages,
        saved_by: exp.saved_by,
        fill_seconds,
        window_s: exp.window_s,
        notes,
        cycles,
    })
}

/// The LRU's evidence of use over the anonymous memory of `pids`, summed
/// (`None` if it cannot be read, e.g. without `CAP_SYS_ADMIN`). Read at
/// t = 0, before the system starts, and at the window's end, while it
/// still runs (the read takes a fraction of a second of its minute): a
/// static workload does not touch its pages, so what turns referenced or
/// active in between is the deduplicating system's doing.
fn access_marks(pids: &[u32]) -> Option<pagesift_linux::access_marks::AccessMarks> {
    let mut flags = pagesift_linux::kpageflags::KPageFlags::open().ok()?;
    let mut sum = pagesift_linux::access_marks::AccessMarks::default();
    for &pid in pids {
        match pagesift_linux::access_marks::of_process(pid, &mut flags) {
            Ok(m) => sum += m,
            Err(
                pagesift_linux::LinuxError::Gone(_) | pagesift_linux::LinuxError::NoSuchProcess(_),
            ) => {}
            Err(_) => return None,
        }
    }
    Some(sum)
}

/// What a page looked at cost, in this run (the real-workload goal 6): ksmd's
/// CPU per page it scanned, and, under pagesift, the daemon's sampling CPU
/// (its distil phase) per page it sampled, from its status at the end of
/// the window.
fn scan_cost(
    sampler: &mut Sampler,
    status: Option<serde_json::Value>,
) -> Result<Vec<String>, BenchError> {
    let mut notes = Vec::new();
    let ksmd_s = sampler.ksmd_cpu_ns()? as f64 / 1e9;
    if let Some(scanned) = sampler.ksmd_pages_scanned()?.filter(|&n| n > 0) {
        notes.push(format!(
            "scan cost: ksmd scanned {scanned} pages at {ksmd_s:.2} CPU-s, {:.2} µs per page",
            ksmd_s * 1e6 / scanned as f64
        ));
    }
    // How busy the machine kept ksmd: time it was runnable but waited for
    // a CPU. Under a CPU-bound workload (the guests) it is what the pacer
    // does not count as ksmd's sleep, and it varies from run to run.
    if let Some(wait) = sampler.ksmd_wait_ns() {
        let window = sampler.elapsed();
        notes.push(format!(
            "ksmd waited {:.2} s for a CPU ({:.1} % of the {window:.0} s since t = 0)",
            wait as f64 / 1e9,
            wait as f64 / 1e7 / window.max(1e-9)
        ));
    }
    // On a shared virtual machine the hypervisor takes CPU time too, and
    // more in some runs than in others: this is one reason the same
    // system's figures differ between runs.
    if let Some(stolen) = sampler.stolen_ms() {
        let window = sampler.elapsed();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        notes.push(format!(
            "the hypervisor took {:.2} CPU-s from the machine's {cpus} CPUs ({:.1} % of their time \
             over the {window:.0} s since t = 0)",
            stolen as f64 / 1e3,
            stolen as f64 / 10.0 / (window * cpus as f64).max(1e-9)
        ));
    }
    if let Some(st) = status {
        let sampled = st["totals"]["sampled_pages"].as_u64().unwrap_or(0);
        let distil = st["daemon"]["cpu_by_phase"]["distil"]
            .as_f64()
            .unwrap_or(0.0);
        if sampled > 0 {
            notes.push(format!(
                "sampling cost: pagesift sampled {sampled} pages at {distil:.2} CPU-s of its \
                 distil phase, {:.2} µs per page (goal: ≤ 1 µs and below ksmd's per scanned page)",
                distil * 1e6 / sampled as f64
            ));
        }
    }
    Ok(notes)
}

/// `pagesift run ARGS --pid PID...` as the bench runs it: its config
/// (`config`) in `work_dir/STEM.toml`, its log in `log_dir/STEM.log`.
/// Returns once its status socket listens, which it opens right after
/// taking KSM's lock (another KSM user, a test, may hold that for a while;
/// until then the counters are not the daemon's): the daemon, its socket,
/// its log, and how long it waited for the lock.
pub(crate) fn start_daemon(
    ctx: &Context,
    stem: &str,
    config: &str,
    args: &[&str],
    pids: &[u32],
) -> Result<(Spawned, PathBuf, PathBuf, Duration), BenchError> {
    let config_path = ctx.work_dir.join(format!("{stem}.toml"));
    std::fs::write(&config_path, config)
        .map_err(|e| BenchError::Output(format!("{}: {e}", config_path.display())))?;
    let socket = ctx
        .work_dir
        .join(format!("pagesift-bench-{}.sock", std::process::id()));
    let log_path = ctx.log_dir.join(format!("{stem}.log"));
    let log = std::fs::File::create(&log_path)
        .map_err(|e| BenchError::Output(format!("{}: {e}", log_path.display())))?;
    let mut cmd = Command::new(&ctx.pagesift_bin);
    cmd.arg("run")
        .args(args)
        .arg("--config")
        .arg(&config_path)
        .arg("--socket")
        .arg(&socket)
        .arg("--ksm-wait")
        .arg(ctx.ksm_wait.as_secs().to_string());
    for pid in pids {
        cmd.arg("--pid").arg(pid.to_string());
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(log);
    let _ = std::fs::remove_file(&socket);
    let mut d = Spawned::spawn("pagesift run", &mut cmd, DeathSignal::Term, DAEMON_GRACE)?;
    let mut told = false;
    let waited = procs::wait_until_listening(
        &mut d,
        &socket,
        ctx.ksm_wait + Duration::from_secs(30),
        &log_path,
        |waited| {
            if ctx.term.requested() {
                return Err(BenchError::Interrupted);
            }
            if !told && waited > Duration::from_secs(3) {
                ctx.progress
                    .note("waiting for pagesift run to take KSM's lock (another user holds it)");
                told = true;
            }
            Ok(())
        },
    )?;
    Ok((d, socket, log_path, waited))
}

/// `pagesift status --json` of the daemon on `socket`, if it answers.
fn daemon_status(ctx: &Context, socket: &std::path::Path) -> Option<serde_json::Value> {
    let out = Command::new(&ctx.pagesift_bin)
        .args(["status", "--json", "--socket"])
        .arg(socket)
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// The note on the copies of the file data found in guest RAM.
fn located_note(per_guest: &[u64], file_pages: usize, when: &str) -> String {
    let each: Vec<String> = per_guest.iter().map(u64::to_string).collect();
    format!(
        "file data located in guest RAM {when}: {} copies of the {file_pages} file pages per guest \
         (pages equal to a file page, byte for byte)",
        each.join(", ")
    )
}

fn guest_error(e: GuestError) -> BenchError {
    match e {
        GuestError::Missing { .. } | GuestError::Unsuitable(_) => {
            BenchError::Missing(e.to_string())
        }
        e => BenchError::System(e.to_string()),
    }
}

/// A system name as a file-name part (`ksm-paced@2%` → `ksm-paced-2pct`).
pub fn sanitize(name: &str) -> String {
    name.replace('@', "-").replace('%', "pct")
}
