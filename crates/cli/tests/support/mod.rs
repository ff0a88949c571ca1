//! Helpers shared by the live tests of `pagesift run` (`daemon.rs`,
//! `acceptance.rs`): run the `pagesift` binary, start a daemon that is
//! stopped on drop and leaves `/sys/kernel/mm/ksm` as it found it (checked),
//! and read what the kernel says about a target's VMAs and KSM pages.
//!
//! One daemon test at a time per test binary ([`serial`]); across binaries
//! the daemon's own KSM lock serializes every KSM user.

#![allow(dead_code)]

use pagesift_linux::ksm::{GuardOptions, Ksm, KsmGuard};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub fn pagesift() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pagesift"))
}

pub fn run(args: &[&str]) -> Output {
    pagesift().args(args).output().expect("run pagesift")
}

/// One daemon test at a time in this binary.
pub static SERIAL: Mutex<()> = Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagesift-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A free loopback port (bound and released; the daemon takes it next).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The knobs a daemon may change, as they are now.
pub fn knobs() -> Vec<(String, Option<String>)> {
    let ksm = Ksm::open().expect("KSM");
    ["run", "pages_to_scan", "sleep_millisecs", "advisor_mode"]
        .iter()
        .map(|k| (k.to_string(), ksm.read_name(k).unwrap()))
        .collect()
}

/// A running `pagesift run`; stopped, and KSM checked, on drop.
pub struct Daemon {
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub metrics: Option<u16>,
    pub before: Vec<(String, Option<String>)>,
}

impl Daemon {
    pub fn start(dir: &Path, args: &[&str], metrics: bool) -> Daemon {
        // Read the knobs under KSM's lock: another owner may be changing
        // them right now, and will have put them back when it lets go.
        let before = {
            let g = KsmGuard::acquire_with(GuardOptions {
                wait: Some(Duration::from_secs(600)),
                ..GuardOptions::default()
            })
            .expect("KSM's lock");
            let k = knobs();
            assert!(g.release().is_complete());
            k
        };
        let socket = dir.join("pagesift.sock");
        let log = dir.join("daemon.log");
        let port = metrics.then(free_port);
        let mut cmd = pagesift();
        cmd.arg("run")
            .arg("--socket")
            .arg(&socket)
            .args(["--ksm-wait", "600"])
            .args(args)
            // PAGESIFT_TEST_LOG=debug to see every injected call.
            .env(
                "RUST_LOG",
                std::env::var("PAGESIFT_TEST_LOG").unwrap_or_else(|_| "info".into()),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(p) = port {
            cmd.args(["--metrics", &p.to_string()]);
        }
        let child = cmd.spawn().expect("spawning pagesift run");
        Daemon {
            child: Some(child),
            socket,
            log,
            metrics: port,
            before,
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `pagesift status --json`, or `None` while it has no answer.
    pub fn status(&self) -> Option<Value> {
        let out = run(&[
            "status",
            "--json",
            "--socket",
            self.socket.to_str().unwrap(),
        ]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls the status until `pred` holds; panics with the log after
    /// `timeout`.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        what: &str,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Value {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.status()
                && pred(&s)
            {
                return s;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("the daemon exited ({st}) before {what}:\n{}", self.log());
            }
            if t0.elapsed() > timeout {
                panic!(
                    "no {what} within {timeout:?}; last status {:?}\n{}",
                    self.status(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    pub fn scrape(&self) -> String {
        let port = self.metrics.expect("started with --metrics");
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    pub fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(
            Command::new("kill")
                .args(["-s", sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// SIGTERM and wait (at most a minute).
    pub fn stop(&mut self) -> ExitStatus {
        self.signal("TERM");
        let mut child = self.child.take().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the daemon ignored SIGTERM for a minute:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-s", "TERM", &c.id().to_string()])
                .status();
            let t0 = Instant::now();
            while c.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // Whatever happened, KSM goes back: taking the lock restores what a
        // killed daemon still owed; releasing restores the snapshot.
        match KsmGuard::acquire_with(GuardOptions {
            wait: Some(Duration::from_secs(600)),
            ..GuardOptions::default()
        }) {
            Ok(g) => {
                let report = g.release();
                assert!(report.is_complete(), "{report}");
            }
            Err(e) => panic!("cannot check KSM after the test: {e}"),
        }
        if !std::thread::panicking() {
            assert_eq!(knobs(), self.before, "KSM's settings were not restored");
        }
    }
}

/// One VMA of a process, as /proc/PID/smaps shows it.
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// Its KSM line, in kB.
    pub ksm_kb: u64,
    pub flags: Vec<String>,
}

impl Vma {
    pub fn mergeable(&self) -> bool {
        self.flags.iter().any(|f| f == "mg")
    }
}

/// The VMAs of `pid`, from /proc/PID/smaps (empty if it is gone).
pub fn vmas(pid: u32) -> Vec<Vma> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            out.push(Vma {
                start: a,
                end: b,
                ksm_kb: 0,
                flags: Vec::new(),
            });
        } else if let Some(v) = out.last_mut() {
            if let Some(k) = line.strip_prefix("KSM:") {
                v.ksm_kb = k.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            } else if let Some(f) = line.strip_prefix("VmFlags:") {
                v.flags = f.split_whitespace().map(String::from).collect();
            }
        }
    }
    out
}

/// The VMAs of `pid` that overlap `[start, start + len)`.
pub fn vmas_overlapping(pid: u32, start: u64, len: u64) -> Vec<Vma> {
    vmas(pid)
        .into_iter()
        .filter(|v| v.start < start + len && start < v.end)
        .collect()
}

/// The VmFlags of the VMA of `pid` that contains `addr`.
pub fn vm_flags(pid: u32, addr: u64) -> Vec<String> {
    vmas_overlapping(pid, addr, 1)
        .pop()
        .unwrap_or_else(|| panic!("no VMA of {pid} contains {addr:#x}"))
        .flags
}

/// The VMAs of `pid` that overlap `[start, start + len)`, one line each:
/// range, pages, KSM kB and VmFlags (for failure messages).
pub fn vmas_in(pid: u32, start: u64, len: u64) -> String {
    vmas_overlapping(pid, start, len)
        .iter()
        .map(|v| {
            format!(
                "{:#x}-{:#x} {} pages, KSM {} kB, flags {}\n",
                v.start,
                v.end,
                (v.end - v.start) / 4096,
                v.ksm_kb,
                v.flags.join(" ")
            )
        })
        .collect()
}

/// Pages of `[start, start + len)` in mergeable VMAs of `pid`.
pub fn mergeable_pages(pid: u32, start: u64, len: u64) -> u64 {
    vmas_overlapping(pid, start, len)
        .iter()
        .filter(|v| v.mergeable())
        .map(|v| (v.end.min(start + len) - v.start.max(start)) / 4096)
        .sum()
}

/// Whether any VMA of `pid` overlapping `[start, start + len)` is mergeable.
pub fn any_mergeable(pid: u32, start: u64, len: u64) -> bool {
    mergeable_pages(pid, start, len) > 0
}

/// Pages of `pid` mapped to KSM pages now: the `KSM:` line of
/// `/proc/PID/smaps_rollup`, counted by a page-table walk. (Its
/// `ksm_merging_pages` is not used: ksmd updates it lazily, so it stays
/// stale after MADV_UNMERGEABLE once ksmd is stopped.)
pub fn merging_pages(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("KSM:"))
        .expect("smaps_rollup has a KSM line on this kernel")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 4
}

pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
