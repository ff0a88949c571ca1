//! Shared helpers of the live tests: start `pagesift-workload` processes,
//! read their reports, ask them for checksums, and always kill them.
//!
//! The workload binary belongs to another package of the workspace, so
//! Cargo does not build it for this package's tests; [`workload_bin`] runs
//! `cargo build -p pagesift-workload` once (a no-op when it is fresh) with
//! the same profile and target directory. The scan crate's tests use this
//! file too (`#[path]`), so it stays free of anything specific to one crate.
//!
//! [`Workload`] is a guard: dropping it (also when a test panics) SIGKILLs
//! the workload and any children it reported, then reaps the workload.

#![allow(dead_code)]

use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::Mutex;

/// Panics unless running as root: these tests read other processes'
/// page maps (CAP_SYS_PTRACE) and PFNs (CAP_SYS_ADMIN). (Checked as those
/// capabilities, so that the crates that include this file need no
/// syscall crate of their own.)
pub fn require_root() {
    use pagesift_linux::caps::{Capability, has};
    assert!(
        has(Capability::SysAdmin) && has(Capability::SysPtrace),
        "the live tests need root (CAP_SYS_ADMIN for PFNs, CAP_SYS_PTRACE to read processes)"
    );
}

/// Path of binary `name` of workspace package `package`, built on first
/// use (`cargo build -p`, a no-op when fresh) with this test's profile.
pub fn bin(package: &'static str, name: &'static str) -> PathBuf {
    static BINS: Mutex<Vec<(&'static str, PathBuf)>> = Mutex::new(Vec::new());
    let mut bins = BINS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = bins.iter().find(|(n, _)| *n == name) {
        return p.clone();
    }
    let path = cargo_artifact(&["-p", package], name);
    bins.push((name, path.clone()));
    path
}

/// Runs `cargo build --quiet ARGS` with this test's profile and returns
/// `target/<profile>/<artifact>`, which must exist afterwards.
pub fn cargo_artifact(args: &[&str], artifact: &str) -> PathBuf {
    // target/<profile>/deps/<test> -> target/<profile>
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet"]).args(args);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
    let path = dir.join(artifact);
    assert!(path.exists(), "{} missing after build", path.display());
    path
}

/// The `pagesift-workload` binary.
pub fn workload_bin() -> PathBuf {
    bin("pagesift-workload", "pagesift-workload")
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
        let mut cmd = Command::new(workload_bin());
        cmd.args(args);
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

/// A child process (a `pagesift run` daemon, say) that is SIGKILLed and
/// reaped when the guard drops, also when the test panics: a daemon left
/// behind keeps the test runner's output pipe open and holds KSM.
pub struct Reaped(pub Child);

impl Reaped {
    /// Waits for the child to exit by itself.
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
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

/// How many of those pages are present.
pub fn present_count(pid: u32, start: u64, pages: u64) -> usize {
    pagemap_entries(pid, start, pages)
        .iter()
        .filter(|e| e.present())
        .count()
}

/// A pid that cannot exist (above the kernel's pid_max limit of 2^22).
pub const NO_SUCH_PID: u32 = 999_999_999;

/// cgroup v2 directories made for one test below the v2 mount
/// (`/sys/fs/cgroup`, or `/sys/fs/cgroup/unified` on a hybrid host), all
/// under one parent named after the test and its pid. Dropping the guard
/// (also when the test panics) moves any process still in them to the root
/// cgroup and removes them, deepest first. Declare it before the workloads
/// it holds, so that they are killed and reaped first.
pub struct TestCgroups {
    mount: PathBuf,
    /// The parent's path as `/proc/PID/cgroup` shows it.
    parent: String,
    /// Paths made, in creation order (the parent first).
    made: Vec<String>,
}

impl TestCgroups {
    /// Makes the parent cgroup `/<name>-<pid>`; panics without cgroup v2.
    pub fn new(name: &str) -> TestCgroups {
        let mount = pagesift_linux::proc::cgroup2_mount()
            .expect("this test needs cgroup v2 (no cgroup2 mount in /proc/self/mountinfo)");
        let mut c = TestCgroups {
            mount: PathBuf::from(mount),
            parent: format!("/{name}-{}", std::process::id()),
            made: Vec::new(),
        };
        let parent = c.parent.clone();
        c.make(&parent);
        c
    }

    fn make(&mut self, path: &str) {
        let dir = self.dir(path);
        // A directory left by a killed run of this test is reused.
        if !dir.is_dir() {
            std::fs::create_dir(&dir)
                .unwrap_or_else(|e| panic!("creating cgroup {}: {e}", dir.display()));
        }
        self.made.push(path.to_string());
    }

    /// Makes `REL` (`a/vm`: each component in turn) below the parent and
    /// returns its path as `/proc/PID/cgroup` shows it.
    pub fn create(&mut self, rel: &str) -> String {
        let mut path = self.parent.clone();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            path = format!("{path}/{part}");
            if !self.made.contains(&path) {
                self.make(&path);
            }
        }
        path
    }

    /// The directory of cgroup `path`.
    pub fn dir(&self, path: &str) -> PathBuf {
        self.mount.join(path.trim_start_matches('/'))
    }

    /// The parent's path, as `/proc/PID/cgroup` shows it.
    pub fn parent(&self) -> &str {
        &self.parent
    }

    /// Starts `pagesift-workload ARGS` inside cgroup `path` (a shell moves
    /// itself there, then execs the workload, so its memory is its own
    /// from the start).
    pub fn spawn(&self, path: &str, args: &[&str]) -> Workload {
        let mut cmd = Command::new("/bin/sh");
        cmd.arg("-c")
            .arg("echo $$ > \"$1/cgroup.procs\" && shift && exec \"$@\"")
            .arg("sh")
            .arg(self.dir(path))
            .arg(workload_bin())
            .args(args);
        let w = Workload::spawn(cmd, args);
        assert_eq!(cgroup_of(w.pid()), path, "workload {} not moved", w.pid());
        w
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        let root_procs = self.mount.join("cgroup.procs");
        for path in self.made.iter().rev() {
            let dir = self.dir(path);
            let t0 = std::time::Instant::now();
            loop {
                // Anything still inside (the test panicked before its
                // workloads dropped) goes back to the root cgroup.
                let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace() {
                    let _ = std::fs::write(&root_procs, pid);
                }
                match std::fs::remove_dir(&dir) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    // EBUSY while an exiting task is still being released.
                    Err(e) if t0.elapsed() > std::time::Duration::from_secs(10) => {
                        eprintln!("could not remove cgroup {}: {e}", dir.display());
                        break;
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(50)),
                }
            }
        }
    }
}

/// The cgroup v2 path of process `pid` (`0::PATH` of `/proc/PID/cgroup`).
pub fn cgroup_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string()
}
