//! A `pagesift-workload` process as a guard: started (optionally with
//! `PR_SET_MEMORY_MERGE`, the way a KSM user makes all of its memory
//! mergeable), its one JSON report line read, its stdin commands answered
//! (`checksum`, `rewrite FIRST COUNT`), and always killed.
//!
//! Dropping a [`Workload`] (also when a test panics) SIGKILLs the workload
//! and any children it reported (fork-family), then reaps the workload.

use crate::binaries::workload_bin;
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

/// Arguments of a workload with every kind of page state a page walk
/// must tell apart: 4 MiB of one content with a hole every 6th page, a
/// zero-page mapping every 5th, and 1 MiB never touched after it.
pub const HOLEY_STATIC_DUP: &[&str] = &[
    "static-dup",
    "--mib",
    "4",
    "--hole-every",
    "6",
    "--zero-every",
    "5",
    "--untouched-mib",
    "1",
];

/// A running workload; killed (with its children) on drop.
pub struct Workload {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Its JSON report.
    pub report: Value,
}

impl Workload {
    /// Starts `pagesift-workload <args>` and waits for its report line.
    pub fn start(args: &[&str]) -> Workload {
        let mut cmd = Command::new(workload_bin());
        cmd.args(args);
        Workload::spawn(cmd, args)
    }

    /// Starts `pagesift-workload <args>` with `PR_SET_MEMORY_MERGE` set
    /// between fork and exec: it never calls madvise, its memory is
    /// mergeable because it asked.
    pub fn start_mergeable(args: &[&str]) -> Workload {
        let mut cmd = Command::new(workload_bin());
        cmd.args(args);
        pagesift_linux::ksm::with_memory_merge(&mut cmd);
        Workload::spawn(cmd, args)
    }

    /// Starts `cmd`, which must run (or exec) `pagesift-workload` with
    /// `args` (through `setpriv`, say), and waits for its report line.
    pub fn spawn(mut cmd: Command, args: &[&str]) -> Workload {
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning pagesift-workload");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let read = stdout.read_line(&mut line);
        let report = match read {
            Ok(n) if n > 0 => serde_json::from_str(&line).ok(),
            _ => None,
        };
        let Some(report) = report else {
            let _ = child.kill();
            let _ = child.wait();
            panic!("workload {args:?} printed no report (got {line:?})");
        };
        Workload {
            child,
            stdin,
            stdout,
            report,
        }
    }

    /// The workload's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Pages of its (single) region.
    pub fn pages(&self) -> u64 {
        self.region().1
    }

    /// Whether it is still running (not exited; a zombie has exited).
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Its children's pids (fork-family).
    pub fn children(&self) -> Vec<u32> {
        self.report["children"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_u64().unwrap() as u32).collect())
            .unwrap_or_default()
    }

    /// The workload and its children.
    pub fn pids(&self) -> Vec<u32> {
        let mut v = vec![self.pid()];
        v.extend(self.children());
        v
    }

    /// A count from the report (top level or `family.<key>`).
    pub fn count(&self, key: &str) -> u64 {
        let v = match key.strip_prefix("family.") {
            Some(k) => &self.report["family"][k],
            None => &self.report[key],
        };
        v.as_u64()
            .unwrap_or_else(|| panic!("report has no count {key}: {}", self.report))
    }

    /// Start address and pages of its (single) region.
    pub fn region(&self) -> (u64, u64) {
        let r = &self.report["regions"][0];
        (r["start"].as_u64().unwrap(), r["pages"].as_u64().unwrap())
    }

    /// Sends one stdin command (`checksum`, `rewrite FIRST COUNT`) and
    /// returns the workload's JSON answer.
    pub fn ask(&mut self, command: &str) -> Value {
        writeln!(self.stdin, "{command}").expect("workload stdin");
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("workload stdout");
        serde_json::from_str(&line).expect("a JSON reply")
    }

    /// The workload's checksum of the memory it accessed.
    pub fn checksum(&mut self) -> String {
        let v = self.ask("checksum");
        v["checksum"].as_str().expect("checksum string").to_string()
    }

    /// SIGKILLs the workload and its children now (the guard still reaps).
    pub fn kill(&mut self) {
        for c in self.children() {
            let _ = pagesift_linux::sys::kill(c);
        }
        let _ = self.child.kill();
    }

    /// SIGKILLs the workload only, without reaping it (it stays a zombie
    /// until the guard drops).
    pub fn kill_now(&mut self) {
        let _ = self.child.kill();
    }

    /// Waits for the workload to exit (killed, or `--seconds` passed),
    /// without reaping it: it stays a zombie until the guard drops.
    pub fn wait_exit(&mut self) {
        loop {
            let state = procfs::process::Process::new(self.pid() as i32)
                .and_then(|p| p.stat())
                .map(|s| s.state);
            match state {
                Ok('Z') | Ok('X') | Err(_) => return,
                _ => std::thread::sleep(std::time::Duration::from_millis(20)),
            }
        }
    }

    /// Reaps the workload after [`kill`](Self::kill).
    pub fn wait(&mut self) {
        let _ = self.child.wait();
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.kill();
        let _ = self.child.wait();
    }
}
