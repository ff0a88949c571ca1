//! Debian's ksmtuned as a benchmark contender: start it, measure its CPU,
//! stop it without leaving anything behind.
//!
//! What ksmtuned does (read from `/usr/sbin/ksmtuned`, Debian package
//! `ksmtuned`, a bash script): at start it computes
//! `thres = max(MemTotal × KSM_THRES_COEF / 100, KSM_THRES_CONST)` (KiB) and
//! `sleep = max(10, KSM_SLEEP_MSEC × 16 GiB / MemTotal)` ms, forks a loop
//! (`loop &`), writes the loop's pid to `$PIDFILE` and exits. Every
//! `KSM_MONITOR_INTERVAL` s (or at once on SIGUSR1) the loop reads
//! `free = MemFree + Buffers + Cached` and `committed` = the RSS of
//! `qemu-system.*-enable-kvm` processes (forking awk, pgrep and ps); when
//! `committed + thres < MemTotal` and `free > thres` it writes `run = 0`,
//! otherwise it writes `run = 1`, `sleep_millisecs = sleep` and
//! `pages_to_scan = npages`, with npages growing by KSM_NPAGES_BOOST (300)
//! while `free < thres` and shrinking by KSM_NPAGES_DECAY (-50) otherwise,
//! clamped to [KSM_NPAGES_MIN, KSM_NPAGES_MAX] = [64, 1250].
//!
//! Why we configure its threshold: with Debian's defaults thres is 20 % of
//! MemTotal (4.7 GiB on a 23.5 GiB host) and our guests run under TCG, so
//! `committed` is always 0; a benchmark workload of a few GiB never pushes
//! free memory below 4.7 GiB here, so ksmtuned would keep KSM off for the
//! whole run and the comparison would be against nothing. The harness
//! therefore picks the [`Threshold`]: [`Threshold::Always`] (the default)
//! sets KSM_THRES_COEF = 100, so thres = MemTotal > free always: ksmtuned
//! acts as on a host under memory pressure, turning KSM on at its first
//! adjustment and boosting pages_to_scan 300, 600, 900, 1200, 1250. That
//! is the only regime where ksmtuned runs KSM at all, so it is the one
//! worth comparing. [`Threshold::FreeBelowKib`] (KSM_THRES_COEF = 0,
//! KSM_THRES_CONST = the value) emulates a host that is tight only once
//! the workload is in: ksmtuned then also stops KSM when merging frees
//! enough. [`Threshold::Debian`] keeps the packaged rule.
//!
//! How we run it: the packaged script, unmodified, with our settings. The
//! script sources `/etc/ksmtuned.conf`, whose settings override the
//! environment, so a locally edited config would silently change the
//! benchmark: when that file exists we bind-mount our own config over it in
//! a private mount namespace of ksmtuned alone (`unshare --mount`, nothing
//! changes for the rest of the host). The same settings are also passed in
//! the environment (for a host without the conffile), and `PIDFILE` points
//! into our state directory so the system's pid file is not touched.
//!
//! CPU: ksmtuned runs in a process group of its own (we spawn it as the
//! group leader and bash without job control keeps `loop &` in it). Its CPU
//! is the start-up shell's (read from its zombie, before we reap it) plus
//! the loop's utime + stime + cutime + cstime (cutime/cstime hold every
//! awk, pgrep, ps and sleep it has forked and reaped) plus the group's
//! live processes (a fork still running). Stopping kills the whole group
//! (SIGTERM, then SIGKILL); [`Drop`] does the same, also on panic.
//!
//! KSM's knobs: ksmtuned writes `run`, `pages_to_scan` and
//! `sleep_millisecs` in /sys/kernel/mm/ksm and leaves them as they are when
//! stopped. The caller must hold a `pagesift_linux::ksm::KsmGuard` for as
//! long as ksmtuned runs: it serializes KSM users and restores the knobs.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal};

/// Where Debian installs ksmtuned.
pub const KSMTUNED: &str = "/usr/sbin/ksmtuned";

/// The config file the script sources.
pub const DEBIAN_CONFIG: &str = "/etc/ksmtuned.conf";

/// When ksmtuned considers memory tight (and so runs KSM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Threshold {
    /// Always tight (KSM_THRES_COEF = 100: thres = MemTotal): KSM is on
    /// from the first adjustment, boosted every interval.
    Always,
    /// Tight while free memory (MemFree + Buffers + Cached) is below this
    /// many KiB (KSM_THRES_COEF = 0, KSM_THRES_CONST = KiB).
    FreeBelowKib(u64),
    /// Debian's rule: 20 % of MemTotal, at least 2048 KiB.
    Debian,
}

impl Threshold {
    /// A threshold `kib` below the free memory right now: memory turns
    /// tight once a workload takes more than `kib` KiB.
    pub fn below_current_free(kib: u64) -> Result<Threshold, KsmtunedError> {
        Ok(Threshold::FreeBelowKib(free_kib()?.saturating_sub(kib)))
    }

    /// (KSM_THRES_COEF, KSM_THRES_CONST).
    fn coef_const(self) -> (u64, u64) {
        match self {
            Threshold::Always => (100, 2048),
            Threshold::FreeBelowKib(kib) => (0, kib),
            Threshold::Debian => (20, 2048),
        }
    }
}

/// ksmtuned's settings. [`Default`] is Debian's defaults (ksmtuned.conf)
/// except the threshold, [`Threshold::Always`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KsmtunedOptions {
    /// The script to run.
    pub script: PathBuf,
    /// KSM_MONITOR_INTERVAL: seconds between adjustments (Debian: 60; the
    /// first adjustment comes one interval after start, or at
    /// [`Ksmtuned::retune`]).
    pub monitor_interval_s: u32,
    /// KSM_SLEEP_MSEC: sleep_millisecs for a 16 GiB host, scaled by
    /// 16 GiB / MemTotal, at least 10 (Debian: 10).
    pub sleep_msec: u32,
    /// KSM_NPAGES_BOOST: pages_to_scan added per interval while tight (300).
    pub npages_boost: i32,
    /// KSM_NPAGES_DECAY: pages_to_scan added per interval while not (-50).
    pub npages_decay: i32,
    /// KSM_NPAGES_MIN (64).
    pub npages_min: u32,
    /// KSM_NPAGES_MAX (1250).
    pub npages_max: u32,
    /// When memory counts as tight.
    pub threshold: Threshold,
    /// ksmtuned's debug log (DEBUG=1, LOGFILE), if wanted. Each line costs
    /// it a fork of `date`, which counts in its CPU.
    pub log: Option<PathBuf>,
}

impl Default for KsmtunedOptions {
    fn default() -> Self {
        KsmtunedOptions {
            script: KSMTUNED.into(),
            monitor_interval_s: 60,
            sleep_msec: 10,
            npages_boost: 300,
            npages_decay: -50,
            npages_min: 64,
            npages_max: 1250,
            threshold: Threshold::Always,
            log: None,
        }
    }
}

impl KsmtunedOptions {
    /// The settings as (variable, value) pairs, in ksmtuned's names.
    pub fn variables(&self, pid_file: &Path) -> Vec<(&'static str, String)> {
        let (coef, konst) = self.threshold.coef_const();
        let mut v = vec![
            (
                "KSM_MONITOR_INTERVAL",
                self.monitor_interval_s.max(1).to_string(),
            ),
            ("KSM_SLEEP_MSEC", self.sleep_msec.to_string()),
            ("KSM_NPAGES_BOOST", self.npages_boost.to_string()),
            ("KSM_NPAGES_DECAY", self.npages_decay.to_string()),
            ("KSM_NPAGES_MIN", self.npages_min.to_string()),
            ("KSM_NPAGES_MAX", self.npages_max.to_string()),
            ("KSM_THRES_COEF", coef.to_string()),
            ("KSM_THRES_CONST", konst.to_string()),
            ("PIDFILE", pid_file.display().to_string()),
        ];
        if let Some(log) = &self.log {
            v.push(("DEBUG", "1".into()));
            v.push(("LOGFILE", log.display().to_string()));
        }
        v
    }

    /// The config file text (shell assignments, values single-quoted).
    pub fn config_text(&self, pid_file: &Path) -> String {
        let mut s = String::from("# Written by pagesift bench for one ksmtuned run.\n");
        for (k, v) in self.variables(pid_file) {
            let _ = writeln!(s, "{k}='{}'", v.replace('\'', r"'\''"));
        }
        s
    }
}

/// ksmtuned could not be started or measured.
#[derive(Debug, thiserror::Error)]
pub enum KsmtunedError {
    /// The script is not installed.
    #[error("{} is missing: ksmtuned is not installed (run scripts/setup)", path.display())]
    Missing {
        /// The path looked for.
        path: PathBuf,
    },
    /// An I/O step failed.
    #[error("ksmtuned: {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// It ran but did not come up as expected.
    #[error("ksmtuned did not start: {0}")]
    NotStarted(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> KsmtunedError {
    let what = what.into();
    move |source| KsmtunedError::Io { what, source }
}

/// Free memory as ksmtuned counts it: MemFree + Buffers + Cached, KiB.
pub fn free_kib() -> Result<u64, KsmtunedError> {
    let text = std::fs::read_to_string("/proc/meminfo").map_err(io_err("reading /proc/meminfo"))?;
    Ok(free_kib_of(&text))
}

fn free_kib_of(meminfo: &str) -> u64 {
    meminfo
        .lines()
        .filter_map(|l| {
            let (k, rest) = l.split_once(':')?;
            matches!(k, "MemFree" | "Buffers" | "Cached")
                .then(|| rest.split_whitespace().next()?.parse::<u64>().ok())?
        })
        .sum()
}

/// A running ksmtuned; stopped (its whole process group killed) on drop.
#[derive(Debug)]
pub struct Ksmtuned {
    /// The loop's pid (its pid file), what `systemctl` would track.
    pid: u32,
    /// Its process group (the start-up shell's pid).
    pgid: u32,
    /// CPU of the start-up shell and its children, seconds.
    startup_cpu: f64,
    /// The largest CPU figure seen, as f64 bits: returned once the loop is
    /// gone and keeps the figure monotonic.
    last_cpu: AtomicU64,
    state_dir: PathBuf,
    stopped: Mutex<bool>,
}

fn ticks_per_second() -> f64 {
    procfs::ticks_per_second().max(1) as f64
}

/// (utime + stime + cutime + cstime) of `pid` in ticks, its state and its
/// process group; `None` when it is gone.
fn stat_of(pid: u32) -> Option<(u64, char, u32)> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    let own = stat.utime + stat.stime;
    let children = (stat.cutime.max(0) + stat.cstime.max(0)) as u64;
    Some((own + children, stat.state, stat.pgrp.max(0) as u32))
}

/// Live (not zombie) processes of process group `pgid`, with their CPU
/// (utime + stime, ticks).
fn group_members(pgid: u32) -> Vec<(u32, u64)> {
    let Ok(all) = procfs::process::all_processes() else {
        return Vec::new();
    };
    all.flatten()
        .filter_map(|p| {
            let s = p.stat().ok()?;
            (s.pgrp == pgid as i32 && !matches!(s.state, 'Z' | 'X'))
                .then_some((s.pid as u32, s.utime + s.stime))
        })
        .collect()
}

fn signal_group(pgid: u32, signal: Signal) {
    if let Some(pid) = Pid::from_raw(pgid as i32) {
        // ESRCH (the group is gone) is the outcome we want anyway.
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

static STARTS: AtomicU64 = AtomicU64::new(0);

impl Ksmtuned {
    /// Starts ksmtuned with `opts` and waits until its loop runs. The
    /// caller holds a `KsmGuard` (ksmtuned writes KSM's knobs) and needs
    /// root (the knobs, and the mount namespace for the config).
    pub fn start(opts: KsmtunedOptions) -> Result<Ksmtuned, KsmtunedError> {
        if !opts.script.is_file() {
            return Err(KsmtunedError::Missing { path: opts.script });
        }
        let state_dir = std::env::temp_dir().join(format!(
            "pagesift-ksmtuned-{}-{}",
            std::process::id(),
            STARTS.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&state_dir);
        std::fs::create_dir_all(&state_dir)
            .map_err(io_err(format!("creating {}", state_dir.display())))?;
        let cleanup = |e| {
            let _ = std::fs::remove_dir_all(&state_dir);
            e
        };
        let pid_file = state_dir.join("ksmtune.pid");
        let config = state_dir.join("ksmtuned.conf");
        let stderr_path = state_dir.join("stderr");
        std::fs::write(&config, opts.config_text(&pid_file))
            .map_err(io_err(format!("writing {}", config.display())))
            .map_err(cleanup)?;
        let stderr = std::fs::File::create(&stderr_path)
            .map_err(io_err(format!("creating {}", stderr_path.display())))
            .map_err(cleanup)?;

        let mut cmd = if Path::new(DEBIAN_CONFIG).exists() {
            // Our config in place of the host's, for ksmtuned's eyes only.
            let mut c = Command::new("unshare");
            c.args(["--mount", "--propagation", "private", "--", "/bin/sh", "-c"])
                .arg(r#"mount --bind "$1" "$2" && exec "$3""#)
                .arg("sh")
                .arg(&config)
                .arg(DEBIAN_CONFIG)
                .arg(&opts.script);
            c
        } else {
            Command::new(&opts.script)
        };
        cmd.envs(opts.variables(&pid_file))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd
            .spawn()
            .map_err(io_err("spawning unshare/ksmtuned"))
            .map_err(cleanup)?;
        let pgid = child.id();

        // The start-up shell forks the loop and exits: read its CPU from
        // its zombie (utime/stime/cutime/cstime stay readable until
        // reaped), then reap it.
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut startup_ticks = 0;
        loop {
            match stat_of(pgid) {
                Some((ticks, 'Z' | 'X', _)) => {
                    startup_ticks = ticks;
                    break;
                }
                None => break,
                Some((ticks, _, _)) => startup_ticks = ticks,
            }
            if Instant::now() > deadline {
                signal_group(pgid, Signal::KILL);
                let _ = child.wait();
                let _ = std::fs::remove_dir_all(&state_dir);
                return Err(KsmtunedError::NotStarted(
                    "its start-up shell did not exit within 10 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let status = child
            .wait()
            .map_err(io_err("waiting for ksmtuned's start-up shell"))?;
        let fail = |reason: String| {
            signal_group(pgid, Signal::KILL);
            let err = std::fs::read_to_string(&stderr_path).unwrap_or_default();
            let _ = std::fs::remove_dir_all(&state_dir);
            KsmtunedError::NotStarted(format!("{reason}; its stderr: {:?}", err.trim()))
        };
        if !status.success() {
            return Err(fail(format!("its start-up shell exited with {status}")));
        }
        let pid = match std::fs::read_to_string(&pid_file).map(|s| s.trim().parse::<u32>()) {
            Ok(Ok(pid)) => pid,
            _ => return Err(fail(format!("no pid in {}", pid_file.display()))),
        };
        match stat_of(pid) {
            Some((_, state, pgrp)) if pgrp == pgid && !matches!(state, 'Z' | 'X') => {}
            other => {
                return Err(fail(format!(
                    "its loop (pid {pid}) is not running in group {pgid}: {other:?}"
                )));
            }
        }
        Ok(Ksmtuned {
            pid,
            pgid,
            startup_cpu: startup_ticks as f64 / ticks_per_second(),
            last_cpu: AtomicU64::new(0f64.to_bits()),
            state_dir,
            stopped: Mutex::new(false),
        })
    }

    /// Its loop's pid (what its pid file holds).
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its process group.
    pub fn pgid(&self) -> u32 {
        self.pgid
    }

    /// CPU seconds (user + system) of ksmtuned and every process it has
    /// forked so far, the exited ones included. Tick resolution
    /// (USER_HZ, 10 ms); never decreases, and keeps its last figure once
    /// ksmtuned is gone.
    pub fn cpu_seconds(&self) -> f64 {
        let last = f64::from_bits(self.last_cpu.load(Ordering::Relaxed));
        let Some((loop_ticks, state, _)) = stat_of(self.pid) else {
            return last;
        };
        if matches!(state, 'Z' | 'X') {
            return last;
        }
        let running: u64 = group_members(self.pgid)
            .into_iter()
            .filter(|&(p, _)| p != self.pid)
            .map(|(_, t)| t)
            .sum();
        let now = self.startup_cpu + (loop_ticks + running) as f64 / ticks_per_second();
        // A fork reaped between the two reads can be counted twice for one
        // read, or a read can land between its exit and its reaping; keep
        // the figure monotonic.
        let now = now.max(last);
        self.last_cpu.store(now.to_bits(), Ordering::Relaxed);
        now
    }

    /// Makes it adjust KSM now (SIGUSR1, what ksmtuned's header asks for
    /// after a VM starts or stops) instead of at the end of its interval.
    pub fn retune(&self) -> Result<(), KsmtunedError> {
        let pid = Pid::from_raw(self.pid as i32)
            .ok_or_else(|| KsmtunedError::NotStarted("pid 0".into()))?;
        rustix::process::kill_process(pid, Signal::USR1)
            .map_err(|e| io_err(format!("signalling ksmtuned (pid {})", self.pid))(e.into()))
    }

    /// Whether any process of its group is still alive (not a zombie).
    pub fn is_running(&self) -> bool {
        !group_members(self.pgid).is_empty()
    }

    /// Stops it: SIGTERM to its process group, SIGKILL after 2 s, and waits
    /// until no process of the group is left. KSM's knobs stay as ksmtuned
    /// left them; the caller's `KsmGuard` restores them.
    pub fn stop(self) {
        self.shutdown();
    }

    fn shutdown(&self) {
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        if *stopped {
            return;
        }
        *stopped = true;
        self.cpu_seconds(); // the last figure, while the loop is still there
        'signals: for (signal, wait) in [(Signal::TERM, 2), (Signal::KILL, 5)] {
            signal_group(self.pgid, signal);
            let deadline = Instant::now() + Duration::from_secs(wait);
            while Instant::now() < deadline {
                if group_members(self.pgid).is_empty() {
                    break 'signals;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        let _ = std::fs::remove_dir_all(&self.state_dir);
    }
}

impl Drop for Ksmtuned {
    fn drop(&mut self) {
        self.shutdown();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_memory_is_memfree_buffers_and_cached() {
        let meminfo = "MemTotal:       24000000 kB\nMemFree:        1000 kB\nMemAvailable:   9999 kB\n\
                       Buffers:          20 kB\nCached:          300 kB\nSwapCached:        7 kB\n";
        assert_eq!(free_kib_of(meminfo), 1320);
        assert!(free_kib().unwrap() > 0);
    }

    #[test]
    fn thresholds_map_to_ksmtuned_variables() {
        let pid_file = Path::new("/tmp/x/ksmtune.pid");
        let get = |o: &KsmtunedOptions, k: &str| {
            o.variables(pid_file)
                .into_iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v)
        };
        let mut o = KsmtunedOptions::default();
        assert_eq!(get(&o, "KSM_THRES_COEF").as_deref(), Some("100"));
        assert_eq!(get(&o, "KSM_MONITOR_INTERVAL").as_deref(), Some("60"));
        assert_eq!(get(&o, "PIDFILE").as_deref(), Some("/tmp/x/ksmtune.pid"));
        assert_eq!(get(&o, "DEBUG"), None);
        o.threshold = Threshold::FreeBelowKib(123_456);
        assert_eq!(get(&o, "KSM_THRES_COEF").as_deref(), Some("0"));
        assert_eq!(get(&o, "KSM_THRES_CONST").as_deref(), Some("123456"));
        o.threshold = Threshold::Debian;
        assert_eq!(get(&o, "KSM_THRES_COEF").as_deref(), Some("20"));
        o.log = Some("/tmp/k.log".into());
        assert_eq!(get(&o, "DEBUG").as_deref(), Some("1"));
        o.monitor_interval_s = 0;
        assert_eq!(get(&o, "KSM_MONITOR_INTERVAL").as_deref(), Some("1"));
    }

    #[test]
    fn config_text_is_sourceable_by_a_shell() {
        let o = KsmtunedOptions {
            log: Some("/tmp/it's here.log".into()),
            ..KsmtunedOptions::default()
        };
        let text = o.config_text(Path::new("/tmp/p.pid"));
        let out = Command::new("bash")
            .arg("-c")
            .arg(format!(
                "{text}\necho \"$KSM_THRES_COEF|$LOGFILE|$PIDFILE|$KSM_NPAGES_DECAY\""
            ))
            .output()
            .unwrap();
        assert!(out.status.success());
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "100|/tmp/it's here.log|/tmp/p.pid|-50"
        );
    }

    #[test]
    fn a_missing_script_says_to_run_setup() {
        let opts = KsmtunedOptions {
            script: "/nonexistent/ksmtuned".into(),
            ..KsmtunedOptions::default()
        };
        let err = Ksmtuned::start(opts).unwrap_err();
        assert!(matches!(err, KsmtunedError::Missing { .. }));
        let msg = err.to_string();
        assert!(
            msg.contains("/nonexistent/ksmtuned") && msg.contains("run scripts/setup"),
            "{msg}"
        );
    }
}
