//! Shared helpers of the exact-scan tests: start `pagesift-workload`
//! processes (killed on drop, also when a test panics), read their reports
//! and checksums, look at their page maps without touching them, run the
//! `pagesift` binary, and serialize the tests (they use GiBs of memory and
//! both cores).
//!
//! The workload and CLI binaries belong to other packages, so Cargo does
//! not build them for this package's tests: [`bin`] runs `cargo build -p
//! <package>` once per binary (a no-op when fresh) with the same profile
//! and target directory.

#![allow(dead_code)]

use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
use pagesift_scan::report::{ProcessReport, RegionReport, Report};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, MutexGuard};

/// One test at a time in this binary: the workloads are large and the
/// machine has two cores.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Panics unless running as root.
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the exact-scan tests need root (CAP_SYS_ADMIN for PFNs, CAP_SYS_PTRACE to read processes)"
    );
}

/// Path of binary `name` of package `package`, built on first use.
pub fn bin(package: &'static str, name: &'static str) -> PathBuf {
    static BINS: Mutex<Vec<(&'static str, PathBuf)>> = Mutex::new(Vec::new());
    let mut bins = BINS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = bins.iter().find(|(n, _)| *n == name) {
        return p.clone();
    }
    // target/<profile>/deps/<test> -> target/<profile>
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", package]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build");
    assert!(status.success(), "building {package} failed");
    let path = dir.join(name);
    assert!(path.exists(), "{} missing after build", path.display());
    bins.push((name, path.clone()));
    path
}

/// The `pagesift-workload` binary.
pub fn workload_bin() -> PathBuf {
    bin("pagesift-workload", "pagesift-workload")
}

/// The `pagesift` binary.
pub fn pagesift_bin() -> PathBuf {
    bin("pagesift", "pagesift")
}

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
        let mut child = Command::new(workload_bin())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawning pagesift-workload");
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let report = match stdout.read_line(&mut line) {
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

    /// Its children's pids (fork-family).
    pub fn children(&self) -> Vec<u32> {
        self.report["children"]
            .as_array()
            .map(|a| a.iter().map(|v| v.as_u64().unwrap() as u32).collect())
            .unwrap_or_default()
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

    /// The workload's checksum of the memory it accessed.
    pub fn checksum(&mut self) -> String {
        writeln!(self.stdin, "checksum").expect("workload stdin");
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("workload stdout");
        let v: Value = serde_json::from_str(&line).expect("checksum reply");
        v["checksum"].as_str().expect("checksum string").to_string()
    }

    /// SIGKILLs the workload now, without reaping it (it stays a zombie
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
}

impl Drop for Workload {
    fn drop(&mut self) {
        for c in self.children() {
            let _ = pagesift_linux::sys::kill(c);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `VmRSS` and `VmPTE` of a process, in kB.
pub fn rss_and_pte(pid: u32) -> (u64, u64) {
    let s = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.status())
        .expect("status");
    (s.vmrss.unwrap_or(0), s.vmpte.unwrap_or(0))
}

/// pagemap entries of `pages` pages from `start` (read as root, never
/// faulting anything).
pub fn pagemap_entries(pid: u32, start: u64, pages: u64) -> Vec<PagemapEntry> {
    let pm = Pagemap::open(pid).expect("pagemap");
    let mut v = vec![PagemapEntry(0); pages as usize];
    pm.read(start, &mut v).expect("pagemap read");
    v
}

/// A pid that cannot exist (above the kernel's pid_max limit of 2^22).
pub const NO_SUCH_PID: u32 = 999_999_999;

/// The process `pid` in a report.
pub fn process(r: &Report, pid: u32) -> &ProcessReport {
    r.processes
        .iter()
        .find(|p| p.pid == pid)
        .unwrap_or_else(|| panic!("pid {pid} not in the report"))
}

/// The region of `pid` that starts at `start`.
pub fn region(r: &Report, pid: u32, start: u64) -> &RegionReport {
    process(r, pid)
        .regions
        .iter()
        .find(|x| x.start == start)
        .unwrap_or_else(|| panic!("pid {pid} has no region at {start:#x} in the report"))
}

/// An exact count from an estimate (which must be exact).
pub fn n(e: &pagesift_scan::report::Estimate) -> u64 {
    assert!(e.is_exact(), "an exact scan gives exact counts: {e:?}");
    e.value as u64
}
