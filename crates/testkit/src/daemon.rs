//! `pagesift run` as a guard: started on a socket and log in a test's
//! directory, polled through `pagesift status --json`, scraped on its
//! metrics port, signalled, and stopped on drop.
//!
//! Dropping a [`Daemon`] (also when the test panics) SIGTERMs it, SIGKILLs
//! it after 30 s, then takes KSM's lock, which puts back whatever a killed
//! daemon still owed, and (unless the test is already panicking) checks
//! that the knobs a daemon may change are what they were before it
//! started. The knobs are read under KSM's lock, so never in the middle of
//! another owner's session.

use pagesift_linux::ksm::{GuardOptions, Ksm, KsmGuard};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

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
    /// The `pagesift` binary it runs (also for `status`).
    pub bin: PathBuf,
    pub child: Option<Child>,
    pub socket: PathBuf,
    pub log: PathBuf,
    pub metrics: Option<u16>,
    pub before: Vec<(String, Option<String>)>,
}

impl Daemon {
    /// Starts `BIN run --socket DIR/pagesift.sock --ksm-wait 600 ARGS`
    /// (and `--metrics PORT` on a free port if `metrics`), its log in
    /// `DIR/daemon.log`, after reading KSM's knobs under KSM's lock.
    pub fn start(bin: &Path, dir: &Path, args: &[&str], metrics: bool) -> Daemon {
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
        let mut cmd = Command::new(bin);
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
            bin: bin.to_path_buf(),
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
        let out = Command::new(&self.bin)
            .args(["status", "--json", "--socket"])
            .arg(&self.socket)
            .output()
            .expect("run pagesift status");
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
