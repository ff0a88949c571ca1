//! The self-checking target of the injection tests
//! (`examples/inject_target.rs`) as a guard: started with a mode, its
//! ready line parsed, its later lines collected, and [`Target::finish`]
//! checking that it was not harmed (no failed self-check, the same
//! checksum, a clean exit). Used by pagesift-linux's `tests/inject.rs` and
//! `tests/uffd.rs`, and by the daemon's acceptance and torture tests
//! (`crates/cli/tests`).
//!
//! Every target maps its memory with the same pseudo-random fill, so two
//! targets hold the same pages: a daemon finds them duplicated.

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// The target binary, built on first use with the test's profile.
pub fn target_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        crate::binaries::cargo_artifact(
            &["-p", "pagesift-linux", "--example", "inject_target"],
            "examples/inject_target",
        )
    })
    .clone()
}

/// A running target; SIGKILLed and reaped on drop.
pub struct Target {
    /// The process.
    pub child: Child,
    /// Its stdin (closing it ends the mode).
    pub stdin: Option<ChildStdin>,
    lines: Receiver<Value>,
    /// Its ready line.
    pub ready: Value,
}

impl Target {
    pub fn start(mode: &str, args: &[&str]) -> Target {
        let mut child = Command::new(target_bin())
            .arg(mode)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning inject_target");
        let stdin = child.stdin.take();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in stdout.lines() {
                let Ok(line) = line else { break };
                match serde_json::from_str(&line) {
                    Ok(v) => {
                        if tx.send(v).is_err() {
                            break;
                        }
                    }
                    Err(_) => eprintln!("target said: {line}"),
                }
            }
        });
        let mut t = Target {
            child,
            stdin,
            lines,
            ready: Value::Null,
        };
        t.ready = t
            .line(Duration::from_secs(10))
            .expect("target's ready line");
        t
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn addr(&self) -> u64 {
        self.ready["addr"].as_u64().unwrap()
    }

    /// Bytes of its mapping (never empty, so no `is_empty`).
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.ready["len"].as_u64().unwrap()
    }

    /// `n` ranges of two pages each, one page apart, from the start of its
    /// mapping: ranges that stay separate VMAs once each is advised.
    pub fn spaced_ranges(&self, n: u64) -> Vec<(u64, u64)> {
        const PAGE: u64 = 4096;
        assert!(3 * n * PAGE <= self.len(), "{n} ranges do not fit");
        (0..n)
            .map(|i| {
                let start = self.addr() + 3 * i * PAGE;
                (start, start + 2 * PAGE)
            })
            .collect()
    }

    pub fn tid(&self, name: &str) -> u32 {
        self.ready["tids"][name].as_u64().unwrap() as u32
    }

    pub fn line(&self, timeout: Duration) -> Option<Value> {
        match self.lines.recv_timeout(timeout) {
            Ok(v) => Some(v),
            Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => None,
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        let s = self.stdin.as_mut().expect("stdin open");
        s.write_all(bytes).unwrap();
        s.flush().unwrap();
    }

    /// Closes stdin, reads the final report and the exit status, and checks
    /// that the target was not harmed: no failed self-check, the same
    /// checksum, a clean exit. Returns the report.
    pub fn finish(mut self) -> Value {
        drop(self.stdin.take());
        let deadline = Instant::now() + Duration::from_secs(10);
        let report = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let v = self.line(left).expect("the target's final report");
            if v["final"] == true {
                break v;
            }
        };
        let status = self.child.wait().expect("wait for target");
        assert!(status.success(), "target exited with {status}");
        assert_eq!(
            report["errors"],
            serde_json::json!([]),
            "the target saw errors"
        );
        assert_eq!(
            report["checksum"], self.ready["checksum"],
            "the target's memory changed"
        );
        report
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
