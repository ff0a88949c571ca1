//! `pagesift demo`: the daemon at work on a built-in workload, with live
//! figures, on this machine's real KSM.
//!
//! ## What it does, in order
//! 1. **Checks** what it needs before touching anything: root (the daemon
//!    reads page frames with `CAP_SYS_ADMIN`, marks memory mergeable inside
//!    other processes with `CAP_SYS_PTRACE`, and writes
//!    `/sys/kernel/mm/ksm`), KSM in the kernel, x86-64 (remote syscall
//!    injection), and enough free memory (`MemAvailable`).
//! 2. **Starts the static-mixed workload**: two processes of this same
//!    binary (the hidden `pagesift workload` subcommand, so `cargo run -p
//!    pagesift` is all it takes), one filling `--mib` MiB with identical
//!    pages, one `--mib` MiB with distinct (random) pages. Neither marks
//!    anything mergeable; each dies with the demo (`PR_SET_PDEATHSIG`) and
//!    reports the checksum of its memory.
//! 3. **Starts the daemon** as a child, `pagesift run --pid A --pid B`, with
//!    an empty configuration file of its own (so the host's
//!    `/etc/pagesift/pagesift.toml` plays no part) and its own status socket:
//!    it is eligible to touch these two processes and nothing else. As a
//!    separate process its CPU time is its own (`/proc/PID/stat`), and it
//!    restores KSM itself on SIGTERM, through its `KsmGuard`.
//! 4. **Watches**, four times a second, independently of what the daemon
//!    says: the identical region's page frames (pagemap + kpageflags) give
//!    pages merged (mapped to a KSM page) and memory saved (merged pages
//!    minus the distinct KSM frames they share); `/proc/<ksmd>` and
//!    `/proc/<daemon>` give CPU time; the random region's `VmFlags` say
//!    whether it was ever marked mergeable. A progress line is redrawn on a
//!    terminal, or printed once a second as plain lines otherwise.
//! 5. **Stops** at `--seconds` of the daemon's run, or [`SETTLE`] after 99 %
//!    of the identical pages are merged, or on SIGINT/SIGTERM: the daemon
//!    gets SIGTERM (it restores KSM's settings), the workloads are asked for
//!    their checksums again and killed, and the summary compares KSM's
//!    settings with those found before the daemon started.
//!
//! The children run in their own process group, so a Ctrl-C at the
//! terminal reaches only the demo, which then stops them in that order.

use clap::Args;
use pagesift_bench::procs::{self, Spawned};
use pagesift_core::pipeline::governor::Governor;
use pagesift_linux::inspect::{self, PageClass};
use pagesift_linux::kpageflags::{KPageFlags, KpfFlags};
use pagesift_linux::ksm::{GuardOptions, KsmError, KsmGuard, KsmSnapshot, Ksmd, ProcessKsmStat};
use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
use pagesift_linux::sys::DeathSignal;
use serde::Serialize;
use std::collections::{HashMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// Options of `pagesift demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    /// MiB of identical pages, and as many MiB of random pages (two
    /// processes).
    #[arg(long, default_value_t = 512, value_name = "MIB")]
    mib: u64,
    /// CPU governor of the daemon: full, medium, low or quiet.
    #[arg(long, default_value = "full")]
    governor: Governor,
    /// Stop after this many seconds of the daemon's run at the latest (it
    /// stops earlier once 99 % of the identical pages have been merged for
    /// a few seconds).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    seconds: f64,
    /// Print the summary as one JSON object on stdout (the live figures go
    /// to stderr).
    #[arg(long)]
    json: bool,
    /// How long to wait for KSM if another owner (a running pagesift
    /// daemon) holds it.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    ksm_wait: f64,
}

/// How long the demo keeps showing the figures after 99 % are merged.
const SETTLE: Duration = Duration::from_secs(5);
/// Sampling interval of the live figures.
const TICK: Duration = Duration::from_millis(250);
/// The share merged that counts as done (the static-mixed goal: ≥ 99 %).
const DONE: f64 = 0.99;
/// How long the daemon may take to stop after SIGTERM before it is killed
/// (its own grace before restoring KSM without the loop is 30 s).
const STOP_WAIT: Duration = Duration::from_secs(40);
/// How long the demo waits for KSM's lock to read the settings back.
const AFTER_WAIT: Duration = Duration::from_secs(10);
const PAGE: u64 = 4096;
const MIB_PAGES: u64 = (1 << 20) / PAGE;

/// What the demo measured; `--json` prints it as is.
#[derive(Serialize, Debug, Default)]
struct Summary {
    /// MiB of identical pages (and of random pages).
    mib: u64,
    /// The daemon's governor.
    governor: String,
    /// pids of the identical and random workloads and of the daemon.
    pids: Pids,
    /// Seconds the daemon ran (from its first status to the stop).
    seconds: f64,
    /// Stopped by SIGINT/SIGTERM.
    interrupted: bool,
    /// Seconds from the daemon's start until 99 % of the identical pages
    /// were merged, if they were.
    time_to_99_percent_s: Option<f64>,
    /// Pages of the identical region.
    identical_pages: u64,
    /// Of those, mapped to a KSM page at the end.
    merged_pages: u64,
    /// merged / identical, percent.
    merged_percent: f64,
    /// Frames freed: merged pages minus the KSM frames they share.
    saved_pages: u64,
    /// The same in MiB.
    saved_mib: f64,
    /// saved / identical, percent.
    saved_percent: f64,
    /// The daemon's CPU time (all threads, from its start).
    daemon_cpu_s: f64,
    /// ksmd's CPU time while the daemon owned KSM.
    ksmd_cpu_s: f64,
    /// The demo process's own CPU time: starting, watching, waiting for
    /// KSM's lock (not part of the daemon's cost).
    demo_cpu_s: f64,
    /// Whether the random region was ever seen mergeable (VmFlags `mg`), or
    /// the random process with PR_SET_MEMORY_MERGE.
    random_ever_marked: bool,
    /// Pages of the random region mapped to KSM pages at the end.
    random_merged_pages: u64,
    /// Both workloads' memory checksums equal those they had when filled.
    checksums_unchanged: bool,
    /// `/sys/kernel/mm/ksm` holds the settings found before the daemon
    /// started.
    ksm_restored: bool,
    /// Whether the demo read the settings back itself (under KSM's lock);
    /// false when another owner took KSM first and kept it, and then
    /// `ksm_restored` is the daemon's own restore report.
    ksm_read_back: bool,
    /// Knobs that differ (name, before, after), if any.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    ksm_differences: Vec<(String, Option<String>, Option<String>)>,
}

/// The demo's processes.
#[derive(Serialize, Debug, Default, Clone, Copy)]
struct Pids {
    identical: u32,
    random: u32,
    daemon: u32,
}

/// Why the demo failed: the message and the exit code.
struct Failure(u8, String);

impl<E: std::fmt::Display> From<E> for Failure {
    fn from(e: E) -> Failure {
        Failure(1, e.to_string())
    }
}

/// Runs `pagesift demo`. Exit codes: 0 done (also when 99 % was not reached
/// in time: the summary says so), 1 the machine lacks something (named) or
/// a check failed, 2 usage error, 130 interrupted (after cleaning up).
pub fn run(args: DemoArgs) -> ExitCode {
    let code = match demo(&args) {
        Ok(s) => {
            if s.interrupted {
                130
            } else if s.random_ever_marked || !s.checksums_unchanged || !s.ksm_restored {
                eprintln!("pagesift demo: a check failed (see the summary)");
                1
            } else {
                0
            }
        }
        Err(Failure(code, msg)) => {
            eprintln!("pagesift demo: {msg}");
            code
        }
    };
    ExitCode::from(code)
}

fn demo(args: &DemoArgs) -> Result<Summary, Failure> {
    if args.mib == 0 || args.mib > 1 << 20 {
        return Err(Failure(
            2,
            format!("--mib must be 1 to 1048576, got {}", args.mib),
        ));
    }
    if !(args.seconds.is_finite() && args.seconds > 0.0) {
        return Err(Failure(
            2,
            format!("--seconds must be positive, got {}", args.seconds),
        ));
    }
    if !(args.ksm_wait.is_finite() && args.ksm_wait >= 0.0) {
        return Err(Failure(
            2,
            format!("--ksm-wait must be seconds, got {}", args.ksm_wait),
        ));
    }
    preflight(args.mib)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    // Named after the demo's pid, so that its test can check it is gone.
    let dir = tempfile::Builder::new()
        .prefix(&format!("pagesift-demo-{}-", std::process::id()))
        .tempdir()?;
    let mut out = Output::new(args.json);
    let ksm_wait = Duration::from_secs_f64(args.ksm_wait);
    let ksm_before = match ksm_settings(ksm_wait, &stop, &mut out)? {
        KsmRead::Read(s) => s,
        KsmRead::Interrupted => return Ok(interrupted()),
        KsmRead::Busy { holder, path } => {
            return Err(Failure(
                1,
                format!(
                    "KSM is in use by pid {holder} (it holds the lock {}) and stayed so for \
                     {ksm_wait:?}; stop that pagesift daemon, or wait longer with --ksm-wait",
                    path.display()
                ),
            ));
        }
    };

    let exe = std::env::current_exe()?;
    let mut dup = Workload::start(&exe, "static-dup", args.mib, 1)?;
    let mut rnd = Workload::start(&exe, "random", args.mib, 2)?;
    if stop.load(Ordering::SeqCst) {
        return Ok(interrupted());
    }
    let ksmd = Ksmd::find().ok();
    let ksmd_cpu = || ksmd.as_ref().and_then(|k| k.cpu_ns().ok()).unwrap_or(0);
    // ksmd's CPU time when the daemon took KSM (ksmd may have worked for
    // another owner while the daemon waited for the lock).
    let mut ksmd_cpu0 = ksmd_cpu();
    let mut daemon = Daemon::start(&exe, &dir, args, [dup.pid, rnd.pid])?;
    let pids = Pids {
        identical: dup.pid,
        random: rnd.pid,
        daemon: daemon.pid(),
    };
    out.line(&format!(
        "pagesift demo: {m} MiB of identical pages (pid {}) and {m} MiB of random pages (pid {}),\n\
         in two processes that mark nothing mergeable themselves. The daemon (pid {}, governor\n\
         {}) may touch these two only; Ctrl-C stops it and restores KSM's settings.\n\
         merged: identical pages now mapped to a KSM page; saved: memory freed; CPU: % of one core",
        dup.pid,
        rnd.pid,
        daemon.pid(),
        args.governor,
        m = args.mib
    ));

    let mut meter = Meter::open(dup.pid, dup.start, dup.pages)?;
    let mut cpu = CpuWindow::default();
    let mut started: Option<Instant> = None;
    let mut reached: Option<Instant> = None;
    let mut random_marked = false;
    let mut last_status = Instant::now() - Duration::from_secs(1);
    let spawned = Instant::now();
    let start_limit = Duration::from_secs_f64(args.ksm_wait) + Duration::from_secs(30);
    let (mut merged, mut saved) = (0, 0);
    let mut daemon_cpu = 0;
    let mut interrupted = false;
    loop {
        if stop.load(Ordering::SeqCst) {
            interrupted = true;
            break;
        }
        if let Some(st) = daemon.exited() {
            return Err(Failure(
                1,
                format!("the daemon stopped ({st}):\n{}", daemon.log_tail()),
            ));
        }
        let now = Instant::now();
        if started.is_none() && now - last_status >= Duration::from_secs(1) {
            last_status = now;
            if let Ok((_, st)) = pagesift_daemon::status::query(&socket(&dir)) {
                started = Some(now - Duration::from_secs_f64(st.daemon.uptime_s));
                // The daemon measured ksmd from its start to this status.
                ksmd_cpu0 = ksmd_cpu().saturating_sub((st.ksm.cpu_seconds * 1e9) as u64);
            } else if now - spawned > start_limit {
                return Err(Failure(
                    1,
                    format!("the daemon did not start:\n{}", daemon.log_tail()),
                ));
            }
        }
        (merged, saved) = meter.measure()?;
        random_marked |= rnd.marked()?;
        daemon_cpu = process_cpu_ns(daemon.pid()).unwrap_or(daemon_cpu);
        if let Some(t0) = started {
            cpu.push(now, daemon_cpu, ksmd_cpu().saturating_sub(ksmd_cpu0));
            if reached.is_none() && merged as f64 >= DONE * dup.pages as f64 {
                reached = Some(now);
            }
            let elapsed = now - t0;
            let (d, k) = cpu.shares();
            // Under 80 columns, so that a terminal redraws it in place.
            out.progress(&format!(
                "{:6.1} s  merged {:5.1} %  saved {:6.1} MiB  CPU: daemon {:4.1} %, ksmd {:4.1} %{}",
                elapsed.as_secs_f64(),
                100.0 * merged as f64 / dup.pages as f64,
                saved as f64 / MIB_PAGES as f64,
                100.0 * d,
                100.0 * k,
                if random_marked { "  RANDOM MARKED" } else { "" },
            ));
            if elapsed.as_secs_f64() >= args.seconds || reached.is_some_and(|r| now - r >= SETTLE) {
                break;
            }
        } else {
            out.progress(&format!(
                "{:6.1} s  starting the daemon{}",
                (now - spawned).as_secs_f64(),
                if now - spawned > Duration::from_secs(3) {
                    format!(" (waiting for KSM: pid {} owns it)", ksm_holder())
                } else {
                    String::new()
                }
            ));
        }
        std::thread::sleep(TICK.saturating_sub(now.elapsed()));
    }
    out.end_progress();
    let ran = started.map_or(0.0, |t| t.elapsed().as_secs_f64());
    if interrupted {
        out.line("interrupted: stopping the daemon (it restores KSM's settings)");
    }

    // Stop the daemon first (the workloads must still be there for their
    // checksums, and merged pages stay merged), then check and kill them.
    daemon_cpu = process_cpu_ns(daemon.pid()).unwrap_or(daemon_cpu);
    let ksmd_cpu_s = if started.is_some() {
        ksmd_cpu().saturating_sub(ksmd_cpu0) as f64 / 1e9
    } else {
        0.0
    };
    let daemon_result = daemon.stop();
    random_marked |= rnd.marked()?;
    // The random region's own pages, as its `marked` check looks at it:
    // elsewhere in the process (the workload binary's data, shared with
    // the identical process's copy) pages may be true duplicates, and
    // merging those is right.
    let (random_merged, _) = Meter::open(rnd.pid, rnd.start, rnd.pages)?.measure()?;
    let checksums_unchanged = dup.checksum_unchanged() && rnd.checksum_unchanged();
    dup.kill();
    rnd.kill();
    // Under the lock again, so that another owner that took KSM meanwhile
    // has given it back. If it keeps KSM longer, the daemon's own restore
    // report (its exit status) is all there is.
    let (ksm_read_back, ksm_differences) =
        match ksm_settings(AFTER_WAIT, &AtomicBool::new(false), &mut out)? {
            KsmRead::Read(after) => (true, ksm_before.diff(&after)),
            _ => (false, Vec::new()),
        };
    if let Err(msg) = &daemon_result {
        eprintln!("pagesift demo: {msg}");
    }
    let n = dup.pages as f64;
    let summary = Summary {
        mib: args.mib,
        governor: args.governor.to_string(),
        pids,
        seconds: ran,
        interrupted,
        time_to_99_percent_s: reached.zip(started).map(|(r, s)| (r - s).as_secs_f64()),
        identical_pages: dup.pages,
        merged_pages: merged,
        merged_percent: 100.0 * merged as f64 / n,
        saved_pages: saved,
        saved_mib: saved as f64 / MIB_PAGES as f64,
        saved_percent: 100.0 * saved as f64 / n,
        daemon_cpu_s: daemon_cpu as f64 / 1e9,
        ksmd_cpu_s,
        demo_cpu_s: pagesift_linux::host::process_cpu_ns() as f64 / 1e9,
        random_ever_marked: random_marked,
        random_merged_pages: random_merged,
        checksums_unchanged,
        ksm_restored: daemon_result.is_ok() && ksm_differences.is_empty(),
        ksm_read_back,
        ksm_differences,
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&summary).expect("a summary serializes")
        );
    } else {
        out.line(&render(&summary));
    }
    Ok(summary)
}

/// A summary that says only that the demo was interrupted before it began.
fn interrupted() -> Summary {
    eprintln!("pagesift demo: interrupted before the daemon started");
    Summary {
        interrupted: true,
        ..Summary::default()
    }
}

/// What reading KSM's settings under its lock gave.
enum KsmRead {
    /// The settings.
    Read(KsmSnapshot),
    /// SIGINT/SIGTERM while waiting for the lock.
    Interrupted,
    /// Another owner kept the lock for the whole wait.
    Busy {
        /// Its pid, as it recorded it.
        holder: String,
        /// The lock file.
        path: PathBuf,
    },
}

/// KSM's settings, read under KSM's lock (so never in the middle of
/// another owner's session, whose changes would look like ours), waiting
/// at most `wait` for it.
fn ksm_settings(wait: Duration, stop: &AtomicBool, out: &mut Output) -> Result<KsmRead, Failure> {
    let t0 = Instant::now();
    let mut told = false;
    loop {
        match KsmGuard::acquire_with(GuardOptions {
            wait: Some(Duration::from_millis(200)),
            ..GuardOptions::default()
        }) {
            Ok(g) => {
                let snap = g.snapshot().clone();
                // Nothing was changed: releasing writes nothing back.
                let _ = g.release();
                return Ok(KsmRead::Read(snap));
            }
            Err(KsmError::LockTimeout { holder, path, .. }) => {
                if t0.elapsed() >= wait {
                    return Ok(KsmRead::Busy { holder, path });
                }
                if !told {
                    told = true;
                    out.line(&format!(
                        "waiting for KSM: pid {holder} owns it (a pagesift daemon or test)"
                    ));
                }
            }
            Err(e) => return Err(Failure(1, format!("cannot read KSM's settings: {e}"))),
        }
        if stop.load(Ordering::SeqCst) {
            return Ok(KsmRead::Interrupted);
        }
    }
}

/// The pid recorded in KSM's lock file by its current owner, or "another
/// process".
fn ksm_holder() -> String {
    std::fs::read_to_string(pagesift_linux::ksm::LOCK_PATH)
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("# pagesift KSM lock: owner pid "))
                .map(|p| p.trim().to_string())
        })
        .unwrap_or_else(|| "another process".into())
}

/// Fails with what is missing, before anything is started.
fn preflight(mib: u64) -> Result<(), Failure> {
    if !cfg!(target_arch = "x86_64") {
        return Err(Failure(
            1,
            "the daemon marks memory mergeable by remote syscall injection, implemented for \
             x86-64 only"
                .into(),
        ));
    }
    use pagesift_linux::Capability;
    let missing: Vec<&str> = [Capability::SysAdmin, Capability::SysPtrace]
        .into_iter()
        .filter(|c| !pagesift_linux::caps::has(*c))
        .map(|c| c.name())
        .collect();
    if !missing.is_empty() || !rustix::process::geteuid().is_root() {
        return Err(Failure(
            1,
            format!(
                "needs root: the daemon reads page frames (CAP_SYS_ADMIN), marks memory \
                 mergeable inside its workload processes (CAP_SYS_PTRACE) and writes \
                 /sys/kernel/mm/ksm (uid 0){}; run it with sudo",
                if missing.is_empty() {
                    String::new()
                } else {
                    format!(", and {} missing", missing.join(" and "))
                }
            ),
        ));
    }
    if !Path::new("/sys/kernel/mm/ksm/run").exists() {
        return Err(Failure(
            1,
            "this kernel has no KSM: /sys/kernel/mm/ksm/run is missing (a kernel built with \
             CONFIG_KSM=y is needed)"
                .into(),
        ));
    }
    let avail_kib: Option<u64> = {
        use procfs::Current;
        // procfs gives bytes.
        procfs::Meminfo::current()?.mem_available.map(|b| b / 1024)
    };
    // Both workloads, plus a margin for the daemon and the page tables.
    let need_mib = 2 * mib + mib / 8 + 64;
    if let Some(kib) = avail_kib
        && kib / 1024 < need_mib
    {
        return Err(Failure(
            1,
            format!(
                "needs about {need_mib} MiB of free memory for --mib {mib}, but MemAvailable \
                 is {} MiB; try a smaller --mib",
                kib / 1024
            ),
        ));
    }
    Ok(())
}

/// The summary as text.
fn render(s: &Summary) -> String {
    let merged_line = match s.time_to_99_percent_s {
        Some(t) => format!("99 % of the identical pages merged {t:.1} s after the daemon started"),
        None => format!(
            "99 % of the identical pages were not merged within {:.1} s",
            s.seconds
        ),
    };
    let ok = |b: bool, yes: &str, no: &str| if b { yes.to_string() } else { no.to_string() };
    let mut ksm = match (s.ksm_restored, s.ksm_read_back) {
        (true, true) => "restored to what they were before the demo".to_string(),
        (true, false) => "restored, says the daemon (another owner took KSM before the demo \
                          could read them back)"
            .to_string(),
        (false, _) => "NOT restored".to_string(),
    };
    for (k, before, after) in &s.ksm_differences {
        ksm.push_str(&format!(
            "; {k}: {} before, {} now",
            before.as_deref().unwrap_or("-"),
            after.as_deref().unwrap_or("-")
        ));
    }
    format!(
        "\nSummary ({} MiB identical + {} MiB random, governor {}, {:.1} s{})\n\
         \x20 {merged_line}\n\
         \x20 merged:          {} of {} identical pages ({:.1} %)\n\
         \x20 memory saved:    {:.1} MiB ({:.1} % of the identical part)\n\
         \x20 CPU time:        daemon {:.2} s, ksmd {:.2} s (the demo itself: {:.2} s)\n\
         \x20 random region:   {}\n\
         \x20 memory contents: {}\n\
         \x20 KSM settings:    {ksm}",
        s.mib,
        s.mib,
        s.governor,
        s.seconds,
        if s.interrupted { ", interrupted" } else { "" },
        s.merged_pages,
        s.identical_pages,
        s.merged_percent,
        s.saved_mib,
        s.saved_percent,
        s.daemon_cpu_s,
        s.ksmd_cpu_s,
        s.demo_cpu_s,
        if s.random_ever_marked {
            "WAS MARKED MERGEABLE".to_string()
        } else {
            format!(
                "never marked mergeable ({} pages merged)",
                s.random_merged_pages
            )
        },
        ok(
            s.checksums_unchanged,
            "both workloads' checksums unchanged",
            "CHECKSUM CHANGED"
        ),
    )
}

/// Where the live figures go: stdout, or stderr with `--json`; redrawn in
/// place on a terminal, one plain line a second otherwise.
struct Output {
    json: bool,
    tty: bool,
    drawn: bool,
    last: Option<Instant>,
}

impl Output {
    fn new(json: bool) -> Output {
        let tty = if json {
            std::io::stderr().is_terminal()
        } else {
            std::io::stdout().is_terminal()
        };
        Output {
            json,
            tty,
            drawn: false,
            last: None,
        }
    }

    fn write(&self, text: &str) {
        // A closed pipe is no reason to stop the demo half-way.
        let _ = if self.json {
            std::io::stderr().lock().write_all(text.as_bytes())
        } else {
            let mut o = std::io::stdout().lock();
            o.write_all(text.as_bytes()).and_then(|()| o.flush())
        };
    }

    fn progress(&mut self, line: &str) {
        if self.tty {
            // Carriage return, erase the line, redraw.
            self.write(&format!("\r\x1b[2K{line}"));
            self.drawn = true;
        } else if self
            .last
            .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
        {
            self.last = Some(Instant::now());
            self.write(&format!("{line}\n"));
        }
    }

    fn end_progress(&mut self) {
        if self.drawn {
            self.write("\n");
            self.drawn = false;
        }
    }

    fn line(&mut self, text: &str) {
        self.end_progress();
        self.write(&format!("{text}\n"));
    }
}

/// The socket the daemon answers `status` on, in the demo's directory.
fn socket(dir: &TempDir) -> PathBuf {
    dir.path().join("status.sock")
}

/// A workload process of this binary, started and stopped through the
/// bench's process control (`pagesift_bench::procs`: its own process
/// group, a parent-death SIGKILL, the whole group SIGKILLed and reaped on
/// drop), and where its region is.
struct Workload {
    proc: procs::Workload,
    pid: u32,
    start: u64,
    pages: u64,
    checksum: String,
}

impl Workload {
    fn start(exe: &Path, kind: &str, mib: u64, seed: u64) -> Result<Workload, Failure> {
        let args = [
            "workload".to_string(),
            kind.to_string(),
            "--mib".to_string(),
            mib.to_string(),
            "--seed".to_string(),
            seed.to_string(),
        ];
        let proc = procs::Workload::start_with_commands(exe, &args, false)
            .map_err(|e| format!("cannot start the {kind} workload: {e}"))?;
        // Its one JSON line says where its region is and what it holds.
        let report = &proc.report;
        let region = &report["regions"][0];
        match (
            region["start"].as_u64(),
            region["pages"].as_u64(),
            report["checksum"].as_str(),
        ) {
            (Some(start), Some(pages), Some(sum)) => Ok(Workload {
                pid: proc.pgid(),
                start,
                pages,
                checksum: sum.to_string(),
                proc,
            }),
            _ => Err(Failure(
                1,
                format!("the {kind} workload's report is not understood: {report}"),
            )),
        }
    }

    /// Asks for the checksum of its memory now and compares it with the
    /// one it reported when filled.
    fn checksum_unchanged(&mut self) -> bool {
        let now = self.proc.ask("checksum").ok();
        now.as_ref().and_then(|v| v["checksum"].as_str()) == Some(self.checksum.as_str())
    }
    /// Whether its region is mergeable now (any VMA overlapping it with
    /// `mg` in VmFlags), or the whole process is (PR_SET_MEMORY_MERGE).
    fn marked(&self) -> Result<bool, Failure> {
        // ksm_stat is cheap; smaps walks the page tables, so it is read
        // only when some VMA of the process is mergeable.
        if let Ok(st) = ProcessKsmStat::of(self.pid) {
            if st.merge_any == Some(true) {
                return Ok(true);
            }
            if st.mergeable == Some(false) {
                return Ok(false);
            }
        }
        let end = self.start + self.pages * PAGE;
        let smaps = std::fs::read_to_string(format!("/proc/{}/smaps", self.pid))
            .map_err(|e| format!("reading /proc/{}/smaps: {e}", self.pid))?;
        let mut overlaps = false;
        for line in smaps.lines() {
            if let Some((range, _)) = line.split_once(' ')
                && let Some((a, b)) = range.split_once('-')
                && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
            {
                overlaps = a < end && self.start < b;
            } else if overlaps
                && let Some(flags) = line.strip_prefix("VmFlags:")
                && flags.split_whitespace().any(|f| f == "mg")
            {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// SIGKILLs it (and its group) and reaps it.
    fn kill(&mut self) {
        self.proc.proc.stop();
    }
}

/// `pagesift run` as a child (`pagesift_bench::procs::Spawned`: its own
/// process group, SIGTERM should the demo die); on drop (an error path)
/// SIGTERMed, and SIGKILLed if it does not stop within `STOP_WAIT`, after
/// which KSM is restored here.
struct Daemon {
    proc: Spawned,
    log: PathBuf,
}

impl Daemon {
    fn start(
        exe: &Path,
        dir: &TempDir,
        args: &DemoArgs,
        pids: [u32; 2],
    ) -> Result<Daemon, Failure> {
        // An empty configuration: the built-in defaults, whatever
        // /etc/pagesift/pagesift.toml says.
        let config = dir.path().join("demo.toml");
        std::fs::write(&config, "# pagesift demo: built-in defaults\n")?;
        let log = dir.path().join("daemon.log");
        let mut cmd = Command::new(exe);
        cmd.arg("run")
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(socket(dir))
            .args(["--governor", &args.governor.to_string()])
            .args(["--ksm-wait", &args.ksm_wait.to_string()])
            // A backstop should the demo itself be SIGKILLed.
            .args(["--for", &(args.seconds + args.ksm_wait + 120.0).to_string()]);
        for p in pids {
            cmd.args(["--pid", &p.to_string()]);
        }
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info");
        }
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?);
        let proc = Spawned::spawn("pagesift run", &mut cmd, DeathSignal::Term, STOP_WAIT)
            .map_err(|e| format!("cannot start the daemon: {e}"))?;
        Ok(Daemon { proc, log })
    }

    fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Its exit status, if it has exited.
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.exit_status()
    }

    /// The last lines of its log.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
    }

    /// SIGTERM, and wait: `Ok` if it stopped cleanly (it then restored
    /// KSM's settings itself).
    fn stop(&mut self) -> Result<(), String> {
        if self.proc.pid() == 0 {
            return Ok(()); // stopped already
        }
        match self.proc.stop_with_status() {
            Some(st) if st.success() => Ok(()),
            Some(st) => Err(format!(
                "the daemon stopped with {st}:\n{}",
                self.log_tail()
            )),
            None => {
                // Taking KSM's lock puts back what the killed owner still
                // owed.
                let restored = KsmGuard::acquire_with(GuardOptions {
                    wait: Some(Duration::from_secs(10)),
                    ..GuardOptions::default()
                })
                .map(|g| g.release());
                Err(format!(
                    "the daemon did not stop within {STOP_WAIT:?} and was killed; restoring KSM \
                     here: {}",
                    match restored {
                        Ok(r) => r.to_string(),
                        Err(e) => e.to_string(),
                    }
                ))
            }
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// Pages merged and frames saved in one region, from its page frames.
///
/// pagemap gives each page's frame and whether this process is its only
/// mapper; only frames mapped more than once can be KSM pages that save
/// anything (a KSM frame left with one mapping saves nothing), so only
/// those are looked up in kpageflags, each frame once: a few hundred once
/// merged, where the region has tens of thousands of pages (what reading
/// every page's flags would cost instead: the `skipping_kpageflags_reads`
/// test of pagesift-linux). Whether a frame is a KSM page is
/// `pagesift_linux::inspect::classify`'s answer, the same as everywhere.
struct Meter {
    pagemap: Pagemap,
    kpageflags: KPageFlags,
    start: u64,
    entries: Vec<PagemapEntry>,
    /// Per shared frame: one of its pagemap entries, and its mappings here.
    mappings: HashMap<u64, (PagemapEntry, u64)>,
    pfns: Vec<u64>,
    flags: Vec<KpfFlags>,
}

impl Meter {
    fn open(pid: u32, start: u64, pages: u64) -> Result<Meter, Failure> {
        let pagemap = Pagemap::open(pid)?;
        pagemap.require_pfns()?;
        Ok(Meter {
            pagemap,
            kpageflags: KPageFlags::open()?,
            start,
            entries: vec![PagemapEntry::default(); pages as usize],
            mappings: HashMap::new(),
            pfns: Vec::new(),
            flags: Vec::new(),
        })
    }

    /// (pages mapped to a KSM page, those minus the distinct KSM frames).
    fn measure(&mut self) -> Result<(u64, u64), Failure> {
        self.pagemap.read(self.start, &mut self.entries)?;
        self.mappings.clear();
        for e in &self.entries {
            if !e.exclusive()
                && !e.file_or_shared()
                && let Some(pfn) = e.pfn()
            {
                self.mappings.entry(pfn).or_insert((*e, 0)).1 += 1;
            }
        }
        self.pfns.clear();
        self.pfns.extend(self.mappings.keys());
        self.flags.clear();
        self.flags.resize(self.pfns.len(), KpfFlags(0));
        self.kpageflags.read_many(&self.pfns, &mut self.flags)?;
        let (mut merged, mut frames) = (0, 0);
        for (pfn, f) in self.pfns.iter().zip(&self.flags) {
            let (entry, count) = self.mappings[pfn];
            if inspect::classify(entry, Some(*f)) == PageClass::Merged {
                merged += count;
                frames += 1;
            }
        }
        Ok((merged, merged - frames))
    }
}

/// CPU time of a process (all threads), ns.
fn process_cpu_ns(pid: u32) -> Option<u64> {
    pagesift_linux::procstat::cpu_ns(pid).ok()
}

/// CPU shares over the last second or so.
#[derive(Default)]
struct CpuWindow(VecDeque<(Instant, u64, u64)>);

impl CpuWindow {
    fn push(&mut self, at: Instant, daemon_ns: u64, ksmd_ns: u64) {
        self.0.push_back((at, daemon_ns, ksmd_ns));
        while self.0.len() > 2 && at - self.0[1].0 >= Duration::from_secs(1) {
            self.0.pop_front();
        }
    }

    /// (daemon, ksmd), fractions of one core.
    fn shares(&self) -> (f64, f64) {
        let (Some(a), Some(b)) = (self.0.front(), self.0.back()) else {
            return (0.0, 0.0);
        };
        let dt = (b.0 - a.0).as_nanos() as f64;
        if dt <= 0.0 {
            return (0.0, 0.0);
        }
        (
            b.1.saturating_sub(a.1) as f64 / dt,
            b.2.saturating_sub(a.2) as f64 / dt,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_window_covers_about_a_second() {
        let mut w = CpuWindow::default();
        let t0 = Instant::now();
        for i in 0..20u64 {
            // The daemon at half a core, ksmd at a quarter.
            w.push(
                t0 + Duration::from_millis(250 * i),
                125_000_000 * i,
                62_500_000 * i,
            );
        }
        let (d, k) = w.shares();
        assert!((d - 0.5).abs() < 1e-9 && (k - 0.25).abs() < 1e-9, "{d} {k}");
        let span = w.0.back().unwrap().0 - w.0.front().unwrap().0;
        assert!(span >= Duration::from_secs(1) && span < Duration::from_millis(1500));
    }

    #[test]
    fn the_summary_says_what_failed() {
        let mut s = Summary {
            mib: 64,
            governor: "full".into(),
            identical_pages: 16384,
            checksums_unchanged: true,
            ksm_restored: true,
            ksm_read_back: true,
            ..Summary::default()
        };
        let text = render(&s);
        assert!(text.contains("were not merged within"), "{text}");
        assert!(
            text.contains("never marked") && !text.contains("NOT"),
            "{text}"
        );
        s.time_to_99_percent_s = Some(3.25);
        s.random_ever_marked = true;
        s.ksm_restored = false;
        s.ksm_differences = vec![("run".into(), Some("0".into()), Some("1".into()))];
        let text = render(&s);
        assert!(
            text.contains("merged 3.2 s after") || text.contains("merged 3.3 s after"),
            "{text}"
        );
        assert!(text.contains("WAS MARKED MERGEABLE"), "{text}");
        assert!(
            text.contains("NOT restored; run: 0 before, 1 now"),
            "{text}"
        );
    }
}
