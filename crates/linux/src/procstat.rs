//! Per-process readings for measuring a deduplication system from outside
//! (`pagesift bench`): memory footprint, CPU time, process-group members,
//! and signalling a process group.
//!
//! ## What is read, and why these sources
//!
//! - **Footprint** ([`MemoryRollup`]): `/proc/PID/smaps_rollup`, parsed by
//!   the `procfs` crate. PSS divides every page among the processes that
//!   map it, so a page merged by KSM into one frame mapped 256 times counts
//!   1/256 in each. Unlike KSM's own counters, which only notice a COW
//!   break when ksmd next visits the address, PSS
//!   changes the moment a write copies a page: it is the physical truth.
//!   Reading it walks the page tables of the process (a few ms per GiB),
//!   so a sampler should read it a few times a second, not more.
//! - **CPU time** ([`cpu_ns`]): utime + stime of `/proc/PID/stat`, in
//!   USER_HZ ticks (10 ms). It sums every thread, including threads that
//!   have exited, which `/proc/PID/schedstat` (the main thread only) does
//!   not; the tick granularity is the price.
//! - **Group members** ([`group_members`]): every process whose process
//!   group is `pgid`, from `/proc/*/stat`. A harness that starts each
//!   workload as the leader of its own group finds the workload's children
//!   (fork-family) this way, without knowing their pids.
//! - **The machine** ([`machine`]): CPU model, CPUs, RAM, kernel and
//!   load average, for the header of a benchmark report.
//! - **Signalling** ([`signal_group`]): `kill(-pgid, sig)`, so a process
//!   and all of its children are stopped together.
//!
//! A process that exits between two readings gives [`LinuxError::Gone`] or
//! [`LinuxError::NoSuchProcess`]; callers measuring a workload skip it.

use crate::LinuxError;
use crate::proc::{self, PTRACE};
use std::io;

/// A process's memory footprint from `/proc/PID/smaps_rollup`, in KiB.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryRollup {
    /// Resident set: every present page mapped, shared ones in full.
    pub rss_kib: u64,
    /// Proportional set: shared pages divided among their mappers.
    pub pss_kib: u64,
    /// Anonymous memory.
    pub anonymous_kib: u64,
    /// The anonymous part of PSS: `anonymous_kib − pss_anon_kib` is the
    /// anonymous memory shared with other mappings (KSM merges, or frames
    /// shared since a fork).
    pub pss_anon_kib: u64,
    /// Pages mapped to KSM pages (`KSM:` line, 6.x kernels; 0 if absent).
    pub ksm_kib: u64,
}

/// Reads `/proc/PID/smaps_rollup` (needs ptrace read access to the
/// process: root, or its owner).
pub fn memory_rollup(pid: u32) -> Result<MemoryRollup, LinuxError> {
    let p = procfs::process::Process::new(pid as i32)
        .map_err(|e| proc::procfs_error(pid, e, "opening /proc", PTRACE))?;
    let rollup = p
        .smaps_rollup()
        .map_err(|e| proc::procfs_error(pid, e, "reading smaps_rollup", PTRACE))?;
    let mut r = MemoryRollup::default();
    // procfs gives the values in bytes; one [rollup] pseudo-map holds them.
    for map in rollup.memory_map_rollup.0 {
        let get = |k: &str| map.extension.map.get(k).copied().unwrap_or(0) / 1024;
        r.rss_kib += get("Rss");
        r.pss_kib += get("Pss");
        r.anonymous_kib += get("Anonymous");
        r.pss_anon_kib += get("Pss_Anon");
        r.ksm_kib += get("KSM");
    }
    Ok(r)
}

/// CPU time (user + system, all threads, exited ones included) a process
/// has used, in ns: its process CPU-time clock (`clock_getcpuclockid`),
/// the scheduler's exact runtime. `/proc/PID/stat`'s utime + stime count
/// in USER_HZ ticks (10 ms here): 0.125 % of a core over the bench's 8 s
/// short-lived windows, a quarter of their 0.5 % goal.
pub fn cpu_ns(pid: u32) -> Result<u64, LinuxError> {
    let gone = |e: nix::errno::Errno, what: &str| {
        if e == nix::errno::Errno::ESRCH {
            LinuxError::Gone(pid)
        } else {
            LinuxError::io(
                format!("{what} of pid {pid}"),
                std::io::Error::from_raw_os_error(e as i32),
            )
        }
    };
    // A pid of 0 would name the caller, and one past i32::MAX a negative
    // number that the clock id encoding turns into another process.
    let raw = i32::try_from(pid)
        .ok()
        .filter(|&p| p > 0)
        .ok_or(LinuxError::Gone(pid))?;
    let clock = nix::time::clock_getcpuclockid(nix::unistd::Pid::from_raw(raw))
        .map_err(|e| gone(e, "finding the CPU-time clock"))?;
    let t = nix::time::clock_gettime(clock).map_err(|e| gone(e, "reading the CPU-time clock"))?;
    Ok(t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
}

/// Every live process whose process group is `pgid` (zombies excluded),
/// in pid order.
pub fn group_members(pgid: u32) -> Result<Vec<u32>, LinuxError> {
    let all = procfs::process::all_processes()
        .map_err(|e| LinuxError::io("listing /proc", io::Error::other(e)))?;
    let mut v: Vec<u32> = all
        .flatten()
        .filter_map(|p| p.stat().ok())
        .filter(|s| s.pgrp == pgid as i32 && s.state != 'Z')
        .map(|s| s.pid as u32)
        .collect();
    v.sort_unstable();
    Ok(v)
}

/// Whether a process with this pid exists (a zombie counts as gone).
pub fn is_alive(pid: u32) -> bool {
    procfs::process::Process::new(pid as i32)
        .and_then(|p| p.stat())
        .is_ok_and(|s| s.state != 'Z')
}

/// Signals that [`signal_group`] sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupSignal {
    /// SIGTERM: asks to stop (a daemon restores what it owns).
    Term,
    /// SIGKILL.
    Kill,
    /// SIGINT.
    Int,
}

/// Sends `sig` to every process of process group `pgid`. A group that no
/// longer exists is not an error (returns `Ok(false)`).
pub fn signal_group(pgid: u32, sig: GroupSignal) -> Result<bool, LinuxError> {
    use rustix::process::{Pid, Signal, kill_process_group};
    let pid = Pid::from_raw(pgid as i32)
        .ok_or_else(|| LinuxError::Parse(format!("process group {pgid}")))?;
    let s = match sig {
        GroupSignal::Term => Signal::TERM,
        GroupSignal::Kill => Signal::KILL,
        GroupSignal::Int => Signal::INT,
    };
    match kill_process_group(pid, s) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(LinuxError::io(
            format!("signalling process group {pgid}"),
            e.into(),
        )),
    }
}

/// Sends `sig` to one process. A process that has gone is not an error
/// (returns `Ok(false)`).
pub fn signal(pid: u32, sig: GroupSignal) -> Result<bool, LinuxError> {
    use rustix::process::{Pid, Signal, kill_process};
    let p = Pid::from_raw(pid as i32).ok_or_else(|| LinuxError::Parse(format!("pid {pid}")))?;
    let s = match sig {
        GroupSignal::Term => Signal::TERM,
        GroupSignal::Kill => Signal::KILL,
        GroupSignal::Int => Signal::INT,
    };
    match kill_process(p, s) {
        Ok(()) => Ok(true),
        Err(rustix::io::Errno::SRCH) => Ok(false),
        Err(e) => Err(LinuxError::io(
            format!("signalling process {pid}"),
            e.into(),
        )),
    }
}

/// The machine a measurement ran on, for reports.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Machine {
    /// `model name` of the first CPU in `/proc/cpuinfo`.
    pub cpu_model: String,
    /// CPUs this process may run on.
    pub cpus: usize,
    /// `MemTotal` of `/proc/meminfo`, KiB.
    pub mem_total_kib: u64,
    /// Kernel release (`/proc/sys/kernel/osrelease`).
    pub kernel: String,
    /// Load average over 1, 5 and 15 minutes (`/proc/loadavg`).
    pub load_average: [f64; 3],
}

/// Reads [`Machine`]; a file that cannot be read leaves its field empty.
pub fn machine() -> Machine {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name")?.split_once(':'))
        .map(|(_, v)| v.trim().to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_total_kib = {
        use procfs::Current;
        procfs::Meminfo::current().map_or(0, |m| m.mem_total / 1024)
    };
    let load = read("/proc/loadavg");
    let mut it = load.split_whitespace().map(|v| v.parse().unwrap_or(0.0));
    Machine {
        cpu_model,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        mem_total_kib,
        kernel: read("/proc/sys/kernel/osrelease").trim().to_string(),
        load_average: [
            it.next().unwrap_or(0.0),
            it.next().unwrap_or(0.0),
            it.next().unwrap_or(0.0),
        ],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_footprint_and_cpu_are_readable() {
        let me = crate::own_pid();
        // Touch 8 MiB so the footprint is clearly above zero.
        let v = vec![7u8; 8 << 20];
        std::hint::black_box(&v);
        let r = memory_rollup(me).unwrap();
        assert!(r.rss_kib >= 8 << 10, "{r:?}");
        assert!(r.pss_kib > 0 && r.pss_kib <= r.rss_kib, "{r:?}");
        assert!(r.anonymous_kib >= 8 << 10, "{r:?}");
        assert!(
            r.pss_anon_kib > 0 && r.pss_anon_kib <= r.anonymous_kib,
            "{r:?}"
        );
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(cpu_ns(me).unwrap() > 0);
        assert!(is_alive(me));
    }

    /// Another process's CPU time is read to the nanosecond, not in whole
    /// USER_HZ ticks: a spinning child's readings are not whole
    /// milliseconds (both would be with odds of one in 10^12).
    #[test]
    fn another_process_cpu_time_is_read_finer_than_a_tick() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .unwrap();
        let pid = child.id();
        std::thread::sleep(std::time::Duration::from_millis(50));
        let a = cpu_ns(pid).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(1));
        let b = cpu_ns(pid).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(a > 0 && b >= a, "{a} {b}");
        assert!(
            !a.is_multiple_of(1_000_000) || !b.is_multiple_of(1_000_000),
            "tick-rounded: {a} {b}"
        );
    }

    #[test]
    fn a_group_is_found_and_signalled() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .unwrap();
        let pid = child.id();
        assert_eq!(group_members(pid).unwrap(), vec![pid]);
        assert!(signal_group(pid, GroupSignal::Kill).unwrap());
        let status = child.wait().unwrap();
        assert!(!status.success());
        assert!(!is_alive(pid));
        assert!(group_members(pid).unwrap().is_empty());
        assert!(!signal_group(pid, GroupSignal::Kill).unwrap());
    }

    #[test]
    fn the_machine_is_described() {
        let m = machine();
        assert!(m.cpus >= 1 && m.mem_total_kib > 0, "{m:?}");
        assert!(!m.kernel.is_empty() && !m.cpu_model.is_empty(), "{m:?}");
    }

    #[test]
    fn a_missing_pid_is_an_error() {
        assert!(memory_rollup(u32::MAX - 1).is_err());
        assert!(cpu_ns(u32::MAX - 1).is_err());
        assert!(cpu_ns(0).is_err(), "pid 0 is not this process");
        // A pid in range that no process has.
        let max: u32 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(matches!(cpu_ns(max), Err(LinuxError::Gone(p)) if p == max));
        assert!(!is_alive(u32::MAX - 1));
    }
}
