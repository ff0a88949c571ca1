//! Shared helpers of the sampled-scan live tests: start `pagesift-workload`
//! processes (always killed, also when a test panics), read their reports,
//! checksums, RSS and page-table sizes, and serialize the big tests.
//!
//! The workload binary belongs to another package, so Cargo does not
//! build it for this package's tests; [`workload_bin`] runs
//! `cargo build -p pagesift-workload` once with the same profile.
//!
//! Big tests hold [`big_test_lock`]: a process-wide mutex and an `flock` on
//! a file in the temp directory, so that two test binaries (or two
//! checkouts on this shared machine) never hold several GiB of workloads
//! at once.

#![allow(dead_code)]

use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
use serde_json::Value;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Panics unless running as root: the scans read other processes' page
/// maps (CAP_SYS_PTRACE) and PFNs (CAP_SYS_ADMIN).
pub fn require_root() {
    assert!(
        rustix::process::geteuid().is_root(),
        "the live tests need root (CAP_SYS_ADMIN for PFNs, CAP_SYS_PTRACE to read processes)"
    );
}

/// Held while a big test runs.
pub struct BigTest {
    _guard: MutexGuard<'static, ()>,
    _file: File,
}

/// Serializes big tests within this process and across processes.
pub fn big_test_lock() -> BigTest {
    static LOCK: Mutex<()> = Mutex::new(());
    let guard = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let path = std::env::temp_dir().join("pagesift-big-tests.lock");
    let file = File::create(&path).expect("creating the big-test lock file");
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive).expect("flock");
    BigTest {
        _guard: guard,
        _file: file,
    }
}

/// Path of the `pagesift-workload` binary, built on first use.
pub fn workload_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let exe = std::env::current_exe().expect("current_exe");
        let dir = exe
            .parent()
            .and_then(|d| d.parent())
            .expect("test binary lives in target/<profile>/deps")
            .to_path_buf();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "pagesift-workload"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd
            .status()
            .expect("running cargo build -p pagesift-workload");
        assert!(status.success(), "building pagesift-workload failed");
        let bin = dir.join("pagesift-workload");
        assert!(bin.exists(), "{} missing after build", bin.display());
        bin
    })
    .clone()
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

    /// The workload's checksum of the memory it accessed.
    pub fn checksum(&mut self) -> String {
        writeln!(self.stdin, "checksum").expect("workload stdin");
        self.stdin.flush().unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("workload stdout");
        let v: Value = serde_json::from_str(&line).expect("checksum reply");
        v["checksum"].as_str().expect("checksum string").to_string()
    }

    /// SIGKILLs the workload and its children now (the guard still reaps).
    pub fn kill(&mut self) {
        for c in self.children() {
            let _ = pagesift_linux::sys::kill(c);
        }
        let _ = self.child.kill();
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.kill();
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

use pagesift_scan::report::{Estimate, Mode, Report};

/// The sampled pages and the exhaustive flag of a sampled report.
pub fn sampled_pages(r: &Report) -> (u64, bool) {
    match r.mode {
        Mode::Sampled {
            sampled_pages,
            exhaustive,
            ..
        } => (sampled_pages, exhaustive),
        Mode::Exact => panic!("not a sampled report"),
    }
}

/// The sum of the saving estimates (value, low, high) of the regions
/// `(pid, start)` (a workload's data region, in every member of a fork
/// family, or the data regions of several workloads).
pub fn region_saving(r: &Report, parts: &[(u32, u64)]) -> Estimate {
    let mut e = Estimate {
        value: 0.0,
        low: 0.0,
        high: 0.0,
    };
    for &(pid, start) in parts {
        let reg = r
            .processes
            .iter()
            .filter(|p| p.pid == pid)
            .flat_map(|p| p.regions.iter())
            .find(|g| g.start == start)
            .unwrap_or_else(|| panic!("no region of {pid} at {start:#x} in the report"));
        e.value += reg.counts.saving.value;
        e.low += reg.counts.saving.low;
        e.high += reg.counts.saving.high;
    }
    e
}

/// A one-line summary for failure messages and `--nocapture` runs.
pub fn summary(r: &Report) -> String {
    let (sampled, exhaustive) = sampled_pages(r);
    format!(
        "sampled {sampled} (exhaustive {exhaustive}) of {} present, saving {:.0} [{:.0}, {:.0}], {} ms, {} pages read",
        r.totals.present,
        r.totals.saving.value,
        r.totals.saving.low,
        r.totals.saving.high,
        r.elapsed_ms,
        r.pages_read
    )
}
