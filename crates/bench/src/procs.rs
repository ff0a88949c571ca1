//! Processes the harness starts, and the guarantee that none outlives it.
//! `pagesift demo` starts its workloads and its daemon through this module
//! too, so the bench and the demo share one way to start, talk to and stop
//! a child.
//!
//! Every child (workload, daemon) is started
//! 1. as the leader of **its own process group**, so a terminal's Ctrl-C
//!    reaches only the harness (which then stops everything in order) and
//!    a workload's own children (fork-family) can be found and killed as
//!    one group;
//! 2. with a **parent-death signal** (SIGKILL for workloads, SIGTERM for the
//!    daemon so it restores KSM), so even a SIGKILLed harness leaves
//!    nothing behind;
//! 3. inside a [`Spawned`] guard whose drop stops the group: SIGTERM (the
//!    daemon restores KSM's settings on it), a grace period, then SIGKILL
//!    to the whole group, and reaping.
//!
//! A workload prints one JSON line when its memory is filled
//! ([`Workload::start`] waits for it); its counts are the ground truth of
//! what can be merged.

use crate::BenchError;
use pagesift_linux::procstat::{self, GroupSignal};
use pagesift_linux::sys::{DeathSignal, die_with_parent_before_exec};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A child process group, stopped when dropped.
#[derive(Debug)]
pub struct Spawned {
    child: Option<Child>,
    name: String,
    grace: Duration,
}

impl Spawned {
    /// Spawns `cmd` in its own process group with a parent-death signal.
    /// `grace`: how long [`stop`](Self::stop) waits after SIGTERM.
    pub fn spawn(
        name: &str,
        cmd: &mut Command,
        death: DeathSignal,
        grace: Duration,
    ) -> Result<Spawned, BenchError> {
        cmd.process_group(0);
        die_with_parent_before_exec(cmd, death);
        let child = cmd
            .spawn()
            .map_err(|e| BenchError::Spawn(format!("{name}: {e}")))?;
        Ok(Spawned {
            child: Some(child),
            name: name.to_string(),
            grace,
        })
    }

    /// The leader's pid (also the process group id).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, |c| c.id())
    }

    /// Its name, for messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The leader's stdout, if piped and not yet taken.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    /// The leader's stdin, if piped and not yet taken.
    pub fn take_stdin(&mut self) -> Option<ChildStdin> {
        self.child.as_mut()?.stdin.take()
    }

    /// Whether the leader is still running (not exited, not a zombie).
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// The leader's exit status, if it has exited (reaped by this call).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.child.as_mut()?.try_wait().ok().flatten()
    }

    /// Stops the group: SIGTERM, up to the grace period for the leader to
    /// exit, then SIGKILL to every member; reaps the leader. Returns whether
    /// the leader exited by itself within the grace (a daemon that did
    /// restored KSM).
    pub fn stop(&mut self) -> bool {
        self.child.is_none() || self.stop_with_status().is_some()
    }

    /// [`stop`](Self::stop), returning the leader's exit status if it
    /// exited by itself (before or within the grace), `None` if it had to
    /// be killed or was already stopped.
    pub fn stop_with_status(&mut self) -> Option<ExitStatus> {
        let mut child = self.child.take()?;
        let pgid = child.id();
        let mut status = child.try_wait().ok().flatten();
        if status.is_none() && !self.grace.is_zero() {
            let _ = procstat::signal(pgid, GroupSignal::Term);
            let end = Instant::now() + self.grace;
            while Instant::now() < end {
                if let Ok(Some(st)) = child.try_wait() {
                    status = Some(st);
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // The rest of the group (a workload's children) in any case.
        let _ = procstat::signal_group(pgid, GroupSignal::Kill);
        let _ = child.wait();
        // Members that were not the leader's children are reaped by init;
        // wait until they are gone so memory is really freed.
        let end = Instant::now() + Duration::from_secs(10);
        while Instant::now() < end && !procstat::group_members(pgid).unwrap_or_default().is_empty()
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        status
    }
}

/// Waits until the daemon `d` listens on `socket`, which it opens right
/// after taking KSM's lock (another KSM user may hold that lock for a
/// while). `each_poll` runs every 20 ms with the time waited so far: it
/// stops the wait with its error (an interrupt) or notes a long wait.
/// Fails if the daemon exits or `limit` passes first (naming its `log`).
/// Returns how long it waited.
pub fn wait_until_listening(
    d: &mut Spawned,
    socket: &Path,
    limit: Duration,
    log: &Path,
    mut each_poll: impl FnMut(Duration) -> Result<(), BenchError>,
) -> Result<Duration, BenchError> {
    let since = Instant::now();
    while !socket.exists() {
        each_poll(since.elapsed())?;
        if !d.running() || since.elapsed() > limit {
            return Err(BenchError::System(format!(
                "{} did not start (log {})",
                d.name(),
                log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(since.elapsed())
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A running `pagesift-workload` and its report.
#[derive(Debug)]
pub struct Workload {
    /// The process group.
    pub proc: Spawned,
    /// Its JSON report (pid, counts, children).
    pub report: serde_json::Value,
    /// Seconds it took to fill its memory (start to report).
    pub fill_seconds: f64,
    stdout: BufReader<ChildStdout>,
    /// Piped for workloads that take commands (`read` for `read-files`,
    /// `checksum` for the demo's).
    stdin: Option<ChildStdin>,
}

impl Workload {
    /// Starts `bin args...` (with `PR_SET_MEMORY_MERGE` when `merge_any`,
    /// the way a KSM user makes all of a process's memory mergeable) and
    /// waits for its report line.
    pub fn start(bin: &Path, args: &[String], merge_any: bool) -> Result<Workload, BenchError> {
        // The workload's kind, after any `workload` prefix (pagesift's own
        // hidden subcommand).
        let kind = args.iter().find(|a| *a != "workload").map_or("", |s| s);
        Workload::start_named(&format!("pagesift-workload {kind}"), bin, args, merge_any)
    }

    /// [`start`](Self::start) with its stdin piped whatever its kind, for
    /// callers that ask it `checksum` (`pagesift demo`). Only `read-files`
    /// gets a pipe otherwise: a workload's command thread then ends at once
    /// on the closed stdin, so the bench's targets carry no extra thread for
    /// the injector to choose from.
    pub fn start_with_commands(
        bin: &Path,
        args: &[String],
        merge_any: bool,
    ) -> Result<Workload, BenchError> {
        let kind = args.iter().find(|a| *a != "workload").map_or("", |s| s);
        let name = format!("pagesift-workload {kind}");
        Workload::spawn(&name, bin, args, merge_any, true)
    }

    /// [`start`](Self::start) for any program that prints one JSON line
    /// when it is ready (the interpreter workers); `name` is for messages.
    pub fn start_named(
        name: &str,
        bin: &Path,
        args: &[String],
        merge_any: bool,
    ) -> Result<Workload, BenchError> {
        // `read-files` reads on command; the others ignore stdin.
        let commands = args.iter().any(|a| a == "read-files");
        Workload::spawn(name, bin, args, merge_any, commands)
    }

    fn spawn(
        name: &str,
        bin: &Path,
        args: &[String],
        merge_any: bool,
        commands: bool,
    ) -> Result<Workload, BenchError> {
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(if commands {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if merge_any {
            pagesift_linux::ksm::with_memory_merge(&mut cmd);
        }
        let t = Instant::now();
        let mut proc = Spawned::spawn(name, &mut cmd, DeathSignal::Kill, Duration::ZERO)?;
        let mut out = BufReader::new(proc.take_stdout().expect("stdout is piped"));
        let stdin = proc.take_stdin();
        let mut line = String::new();
        let n = out
            .read_line(&mut line)
            .map_err(|e| BenchError::Workload(format!("{name}: reading its report: {e}")))?;
        if n == 0 {
            return Err(BenchError::Workload(format!(
                "{name} exited before printing its report"
            )));
        }
        let report: serde_json::Value = serde_json::from_str(&line)
            .map_err(|e| BenchError::Workload(format!("{name}: bad report {line:?}: {e}")))?;
        Ok(Workload {
            proc,
            report,
            fill_seconds: t.elapsed().as_secs_f64(),
            stdout: out,
            stdin,
        })
    }

    /// Sends one command line (`read`, `checksum`) and returns the JSON
    /// answer.
    pub fn ask(&mut self, command: &str) -> Result<serde_json::Value, BenchError> {
        use std::io::Write;
        let name = self.proc.name().to_string();
        let err = |e: String| BenchError::Workload(format!("{name}: {command}: {e}"));
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| err("takes no commands".into()))?;
        writeln!(stdin, "{command}").map_err(|e| err(e.to_string()))?;
        stdin.flush().map_err(|e| err(e.to_string()))?;
        let mut line = String::new();
        self.stdout
            .read_line(&mut line)
            .map_err(|e| err(e.to_string()))?;
        let v: serde_json::Value =
            serde_json::from_str(&line).map_err(|e| err(format!("bad answer {line:?}: {e}")))?;
        if let Some(e) = v["error"].as_str() {
            return Err(err(e.to_string()));
        }
        Ok(v)
    }

    /// A count of the report: a top-level key, or `family.<key>`.
    pub fn count(&self, key: &str) -> u64 {
        let v = match key.strip_prefix("family.") {
            Some(k) => &self.report["family"][k],
            None => &self.report[key],
        };
        v.as_u64().unwrap_or(0)
    }

    /// Its process group id (the workload's pid).
    pub fn pgid(&self) -> u32 {
        self.proc.pid()
    }

    /// The workload and its children (fork-family) now.
    pub fn pids(&self) -> Vec<u32> {
        procstat::group_members(self.pgid()).unwrap_or_default()
    }
}
