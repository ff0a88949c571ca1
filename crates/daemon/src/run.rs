//! `pagesift run`: the daemon in the foreground, wired to the real machine.
//!
//! Start-up, in order, each failing with a message that says what to fix:
//! the configuration (with `--governor`, `--metrics`, `--socket`, `--pid`
//! and `--unmerge-on-exit` on top), SIGTERM/SIGINT (through
//! `pagesift_linux::ksm::TerminationWatch`, which restores KSM even if the
//! loop were stuck) and SIGHUP handlers, discovery of the eligible
//! processes (names a missing capability), ownership of KSM (its lock, so
//! two daemons or a daemon and a KSM test never fight), the status socket
//! and the metrics endpoint.
//!
//! Then the loop runs until SIGTERM/SIGINT (or `--for`): wake, note the
//! CPU times, sleep in one piece on a socket that SIGTERM, SIGINT and
//! SIGHUP write into (signal-hook's self-pipe), so that a signal is noticed
//! at once without waking up to look for one. The sleep also watches the
//! status bell: a status or metrics reader asking for a snapshot gets one
//! built then, without a wake-up ([`crate::snapshots`]). SIGHUP
//! re-reads the configuration file; a bad file is logged and the old
//! configuration kept. A watchdog thread ([`crate::watchdog`]) logs a
//! wake-up that runs longer than 5 s, with the phase it is stuck in.
//!
//! On the way out: `--unmerge-on-exit` unmarks what pagesift marked, KSM's
//! settings are restored (merged pages stay merged otherwise), the socket
//! is removed.

use crate::config::{Config, ConfigError, metrics_address};
use crate::daemon::Daemon;
use crate::eligibility::Policy;
use crate::ksmd::SysKsm;
use crate::metrics::MetricsServer;
use crate::snapshots::{Bell, Snapshots};
use crate::status::StatusServer;
use crate::target::LinuxTarget;
use pagesift_core::pipeline::governor::Governor;
use pagesift_linux::ksm::TerminationWatch;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use tracing::{error, info, warn};

/// What the command line adds to the configuration.
#[derive(Clone, Debug, Default)]
pub struct RunOptions {
    /// `--config PATH` (must exist); `None`: the default path if present.
    pub config: Option<PathBuf>,
    /// `--governor`.
    pub governor: Option<Governor>,
    /// `--metrics ADDR`.
    pub metrics: Option<String>,
    /// `--socket PATH`.
    pub socket: Option<PathBuf>,
    /// `--pid PID...`: only these processes (deny lists still apply).
    pub pids: Vec<u32>,
    /// `--unmerge-on-exit`.
    pub unmerge_on_exit: bool,
    /// `--for SECONDS`: stop by itself after this long.
    pub duration: Option<Duration>,
    /// How long to wait for KSM's lock (another owner may hold it).
    pub ksm_wait: Option<Duration>,
}

/// Why the daemon could not start, or stopped badly.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A command-line value is unusable.
    #[error("{0}")]
    Usage(String),
    /// The machine refused something at start-up.
    #[error("{0}")]
    Start(String),
    /// KSM's settings could not all be put back.
    #[error("KSM was not fully restored: {0}")]
    Restore(String),
}

/// The loop's sleep, cut short by SIGTERM, SIGINT and SIGHUP.
#[cfg(target_arch = "x86_64")]
struct SignalWaker {
    /// Read end of a socket pair the signals write a byte into.
    rx: UnixStream,
    /// Set by SIGTERM/SIGINT before their byte is written
    /// (`TerminationWatch` notes them from another thread, a moment later).
    stop: Arc<AtomicBool>,
}

#[cfg(target_arch = "x86_64")]
impl SignalWaker {
    fn install() -> std::io::Result<SignalWaker> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
        let (rx, tx) = UnixStream::pair()?;
        let stop = Arc::new(AtomicBool::new(false));
        // signal-hook runs a signal's actions in registration order: the
        // flags (SIGHUP's was registered first) are set before the byte.
        for sig in [SIGTERM, SIGINT] {
            signal_hook::flag::register(sig, stop.clone())?;
        }
        for sig in [SIGTERM, SIGINT, SIGHUP] {
            signal_hook::low_level::pipe::register(sig, tx.try_clone()?)?;
        }
        Ok(SignalWaker { rx, stop })
    }

    /// Sleeps until `at`, a signal, a reader asking for a status snapshot
    /// (`bell` turning readable), or (if given) `hints` turning readable.
    fn sleep_until(&self, at: Instant, hints: Option<BorrowedFd<'_>>, bell: &Bell) -> Slept {
        let left = at.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Slept::TimeUp;
        }
        let mut fds = vec![self.rx.as_fd(), bell.as_fd()];
        fds.extend(hints);
        match pagesift_linux::wait::wait_readable(&fds, left) {
            Ok(ready) => {
                if ready[0] {
                    // Empty the self-pipe; the flags say which signal.
                    let mut buf = [0u8; 64];
                    let _ = self.rx.set_nonblocking(true);
                    let _ = (&self.rx).read(&mut buf);
                    let _ = self.rx.set_nonblocking(false);
                    Slept::Signal
                } else if ready[1] {
                    Slept::Snapshot
                } else if ready.get(2) == Some(&true) {
                    Slept::Hints
                } else if Instant::now() < at {
                    Slept::Signal // interrupted: look at the flags
                } else {
                    Slept::TimeUp
                }
            }
            Err(_) => {
                // Cannot wait on the descriptors: short slices instead.
                std::thread::sleep(left.min(Duration::from_millis(200)));
                if Instant::now() < at {
                    Slept::Signal
                } else {
                    Slept::TimeUp
                }
            }
        }
    }
}

/// Why [`SignalWaker::sleep_until`] returned.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slept {
    /// The time came.
    TimeUp,
    /// A signal's byte (or an interruption): the caller looks at its flags.
    Signal,
    /// I/O hints arrived.
    Hints,
    /// A reader asked for a status snapshot.
    Snapshot,
}

/// Builds and publishes a status snapshot if a reader asked for one
/// (`crate::snapshots`).
#[cfg(target_arch = "x86_64")]
fn answer_snapshot(
    daemon: &mut Daemon<LinuxTarget, crate::actuate::InjectActuator, SysKsm>,
    snapshots: &Snapshots,
    now: pagesift_core::Nanos,
) {
    if snapshots.take_wanted() {
        snapshots.publish(Arc::new(daemon.status(now)));
    }
}

/// Grace after SIGTERM before KSM is restored without the loop's help.
const TERM_GRACE: Duration = Duration::from_secs(30);

/// Loads the configuration and applies the command line to it.
pub fn effective_config(opts: &RunOptions) -> Result<(Config, Option<PathBuf>), RunError> {
    let (mut config, path) = Config::load(opts.config.as_deref())?;
    apply_options(&mut config, opts)?;
    Ok((config, path))
}

fn apply_options(config: &mut Config, opts: &RunOptions) -> Result<(), RunError> {
    if let Some(g) = opts.governor {
        config.governor = g;
    }
    if let Some(m) = &opts.metrics {
        metrics_address(m).map_err(|e| RunError::Usage(format!("--metrics: {e}")))?;
        config.metrics.address = Some(m.clone());
    }
    if let Some(s) = &opts.socket {
        config.status.socket = s.clone();
    }
    if opts.unmerge_on_exit {
        config.actuate.unmerge_on_exit = true;
    }
    Ok(())
}

fn now_ns(t0: Instant) -> u64 {
    t0.elapsed().as_nanos() as u64
}

/// Runs the daemon until SIGTERM/SIGINT or `opts.duration`.
#[cfg(target_arch = "x86_64")]
pub fn run(opts: RunOptions) -> Result<(), RunError> {
    use crate::actuate::InjectActuator;

    let (config, config_path) = effective_config(&opts)?;
    // Before anything is touched: a --socket that names a regular file (or
    // a live daemon's socket) fails here, and the file is kept.
    crate::status::check_socket_path(&config.status.socket).map_err(|e| {
        RunError::Start(format!(
            "cannot serve status on {}: {e}",
            config.status.socket.display()
        ))
    })?;
    let term = TerminationWatch::install(TERM_GRACE)
        .map_err(|e| RunError::Start(format!("cannot handle SIGTERM: {e}")))?;
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hup.clone())
        .map_err(|e| RunError::Start(format!("cannot handle SIGHUP: {e}")))?;
    let waker = SignalWaker::install()
        .map_err(|e| RunError::Start(format!("cannot watch for signals: {e}")))?;

    let own_exe = std::env::current_exe().ok();
    let policy = Policy::new(&config, &opts.pids, std::process::id(), own_exe.clone());
    if policy.allows_nothing() {
        warn!(
            "no process is eligible: list processes under [eligible] in the config (or \
             `all = true`), or pass --pid; merging across processes is a side channel, so \
             pagesift merges nothing by default"
        );
    }
    let target = LinuxTarget::new(policy.process_filter(), config.region_limits())
        .map_err(RunError::Start)?;
    let ksm = SysKsm::acquire(
        config.pacing(),
        Some(opts.ksm_wait.unwrap_or(Duration::from_secs(30))),
    )
    .map_err(RunError::Start)?;
    // KSM is ours, so no other daemon runs: take away what a crashed
    // predecessor left in other processes (see `ledger`).
    let ledger_path = std::path::Path::new(crate::ledger::LEDGER_PATH);
    match crate::ledger::previous(ledger_path) {
        Ok(Some(rec)) => {
            let mut injector = pagesift_linux::inject::Injector::new(
                pagesift_linux::inject::InjectConfig::default(),
            );
            let r = crate::ledger::recover(&rec, &mut injector);
            info!(
                unmarked = r.unmarked,
                closed_userfaultfds = r.closed,
                gone = r.gone,
                "took away what the previous daemon left (its ledger)"
            );
            for f in &r.failed {
                warn!(what = %f, "could not take away what the previous daemon left");
            }
        }
        Ok(None) => {}
        Err(e) => warn!(error = %e, "ledger not used"),
    }
    let ledger = crate::ledger::SharedLedger::new(crate::ledger::Ledger::new(ledger_path));
    let (snapshots, bell) = Snapshots::new()
        .map_err(|e| RunError::Start(format!("cannot make the status bell: {e}")))?;
    let status_server =
        StatusServer::start(&config.status.socket, snapshots.clone()).map_err(|e| {
            RunError::Start(format!(
                "cannot serve status on {}: {e}",
                config.status.socket.display()
            ))
        })?;
    let metrics_server = match &config.metrics.address {
        Some(a) => {
            let addr = metrics_address(a).map_err(RunError::Usage)?;
            let s = MetricsServer::start(addr, snapshots.clone())
                .map_err(|e| RunError::Start(format!("metrics: {e}")))?;
            info!(address = %s.addr(), "serving Prometheus metrics");
            Some(s)
        }
        None => None,
    };
    let actuator = InjectActuator::new(config.actuate.max_map_count_fraction);
    let unmerge_on_exit = config.actuate.unmerge_on_exit;
    let t0 = Instant::now();
    info!(
        governor = %config.governor,
        config = %config_path.as_ref().map_or("defaults".into(), |p| p.display().to_string()),
        socket = %status_server.path().display(),
        "pagesift daemon started"
    );
    let mut daemon = Daemon::new(
        config,
        config_path.clone(),
        policy,
        target,
        actuator,
        ksm,
        now_ns(t0),
    );
    daemon.set_journal(Box::new(ledger.clone()));
    daemon.target_mut().set_journal(Box::new(ledger.clone()));
    start_pending_hints(&mut daemon);
    let _watchdog = crate::watchdog::Watchdog::spawn(
        daemon.wake_watch(),
        &crate::daemon::PHASES,
        crate::watchdog::WatchdogTimes::default(),
        |phase, ran| {
            warn!(
                phase,
                running_s = ran.as_secs_f64(),
                "a wake-up is taking long: the loop is stuck in this phase"
            )
        },
    )
    .map_err(|e| RunError::Start(format!("cannot start the watchdog thread: {e}")))?;
    let deadline = opts.duration.map(|d| t0 + d);
    let stopping = || term.requested() || waker.stop.load(Ordering::SeqCst);
    loop {
        if stopping() || deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if hup.swap(false, Ordering::SeqCst) {
            reload(&mut daemon, &opts, config_path.as_ref(), own_exe.clone());
        }
        let woke = Instant::now();
        let now = now_ns(t0);
        let summary = daemon.wake(now);
        save_ledger(&mut ledger.borrow_mut(), &daemon);
        daemon.note_cpu(now);
        answer_snapshot(&mut daemon, &snapshots, now_ns(t0));
        let mut wake_at = Instant::now() + Duration::from_nanos(summary.sleep);
        if let Some(d) = deadline {
            wake_at = wake_at.min(d);
        }
        // Hints arriving cut the sleep short, but never below the loop's
        // base sleep after this wake-up began, nor below what its CPU cap
        // asks for after this wake-up's work: a process that reads all the
        // time must not turn the loop into a spin, nor take it over its cap.
        let earliest = (woke + Duration::from_nanos(daemon.config().sleep()))
            .max(Instant::now() + Duration::from_nanos(summary.cap_sleep));
        let asleep = Instant::now();
        let planned = wake_at;
        let mut watch_hints = true;
        while !stopping() && !hup.load(Ordering::SeqCst) {
            let hints = daemon.hint_wake_fd().filter(|_| watch_hints);
            match waker.sleep_until(wake_at, hints, &bell) {
                Slept::TimeUp => break,
                Slept::Signal => {}
                Slept::Snapshot => {
                    bell.drain();
                    answer_snapshot(&mut daemon, &snapshots, now_ns(t0));
                }
                Slept::Hints => {
                    wake_at = wake_at.min(earliest.max(Instant::now()));
                    watch_hints = false;
                }
            }
        }
        if wake_at < planned {
            daemon.slept_only(asleep.elapsed().as_nanos() as u64);
        }
    }
    info!("stopping");
    let snap = daemon.status(now_ns(t0));
    info!(
        merged_pages = snap.totals.merged_pages,
        promoted_regions = snap.totals.promoted_regions,
        cow_breaks = snap.totals.cow_breaks,
        daemon_cpu_s = snap.daemon.cpu_seconds,
        ksmd_cpu_s = snap.ksm.cpu_seconds,
        cpu_by_phase = ?snap.daemon.cpu_by_phase,
        cpu_by_thread = ?snap.daemon.cpu_by_thread,
        "summary"
    );
    let restored = daemon.shutdown(unmerge_on_exit);
    // What is left now (marks kept without unmerge_on_exit) stays recorded;
    // with nothing left the file goes.
    save_ledger(&mut ledger.borrow_mut(), &daemon);
    drop(metrics_server);
    drop(status_server);
    drop(daemon); // releases KSM's lock
    match restored {
        Ok(()) => {
            info!("KSM settings restored");
            Ok(())
        }
        Err(e) => Err(RunError::Restore(e)),
    }
}

/// Writes the crash ledger if what pagesift left in other processes changed.
#[cfg(target_arch = "x86_64")]
fn save_ledger(
    ledger: &mut crate::ledger::Ledger,
    daemon: &Daemon<LinuxTarget, crate::actuate::InjectActuator, SysKsm>,
) {
    let mut rec = crate::ledger::Record::default();
    rec.add_marks(daemon.marks());
    rec.add_marks(daemon.departed_marks());
    for (pid, fd, ranges) in daemon.target().write_registrations() {
        rec.uffd.push(crate::ledger::UffdEntry {
            pid,
            start_time: 0,
            fd,
            ranges,
            before: vec![],
        });
    }
    if !ledger.changed(&rec) {
        return;
    }
    for u in &mut rec.uffd {
        u.start_time = pagesift_linux::discover::identity(u.pid).map_or(0, |(st, _)| st);
    }
    if let Err(e) = ledger.save(&rec) {
        warn!(error = %e, "cannot write the ledger");
    }
}

/// Opens the hint source `[hints]` asks for, if one is wanted and not
/// running (at start, and after a reload changed `[hints]`).
#[cfg(target_arch = "x86_64")]
fn start_pending_hints(daemon: &mut Daemon<LinuxTarget, crate::actuate::InjectActuator, SysKsm>) {
    if daemon.hints_pending() {
        let tap = crate::daemon::open_hint_source(&daemon.config().hints);
        daemon.start_hints(tap);
    }
}

#[cfg(target_arch = "x86_64")]
fn reload(
    daemon: &mut Daemon<LinuxTarget, crate::actuate::InjectActuator, SysKsm>,
    opts: &RunOptions,
    path: Option<&PathBuf>,
    own_exe: Option<PathBuf>,
) {
    // Re-read the file the daemon started with (or the default path).
    let opts = RunOptions {
        config: path.cloned().or_else(|| opts.config.clone()),
        ..opts.clone()
    };
    match effective_config(&opts) {
        Ok((config, _)) => {
            if config.status != daemon.config().status || config.metrics != daemon.config().metrics
            {
                warn!("the status socket and the metrics address change only on restart");
            }
            let policy = Policy::new(&config, &opts.pids, std::process::id(), own_exe);
            info!(governor = %config.governor, "configuration reloaded");
            daemon.reload(config, policy);
            start_pending_hints(daemon);
        }
        Err(e) => error!(error = %e, "configuration not reloaded; keeping the old one"),
    }
}

/// Remote injection exists for x86-64 only.
#[cfg(not(target_arch = "x86_64"))]
pub fn run(_opts: RunOptions) -> Result<(), RunError> {
    Err(RunError::Start(
        "pagesift run needs remote syscall injection, implemented for x86-64 only; \
         use `pagesift exec` to start processes mergeable instead"
            .into(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_overrides_the_file() {
        let mut c = Config::default();
        apply_options(
            &mut c,
            &RunOptions {
                governor: Some(Governor::Quiet),
                metrics: Some("9464".into()),
                socket: Some("/tmp/x.sock".into()),
                unmerge_on_exit: true,
                ..RunOptions::default()
            },
        )
        .unwrap();
        assert_eq!(c.governor, Governor::Quiet);
        assert_eq!(c.metrics.address.as_deref(), Some("9464"));
        assert_eq!(c.status.socket, PathBuf::from("/tmp/x.sock"));
        assert!(c.actuate.unmerge_on_exit);
        let e = apply_options(
            &mut c,
            &RunOptions {
                metrics: Some("not an address".into()),
                ..RunOptions::default()
            },
        )
        .unwrap_err();
        assert!(e.to_string().starts_with("--metrics:"), "{e}");
    }
}
