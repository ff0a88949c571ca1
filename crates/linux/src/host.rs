//! Small facts about processes and the host that the daemon needs besides
//! their memory and KSM ([`crate::ksm`] has per-process KSM state and
//! vmstat): executables, VMA counts, `vm.max_map_count`, which processes
//! exist, and CPU clocks.
//!
//! Everything here is a read of one small `/proc` file or a clock; none
//! touches a target's memory. Reads of a process that has exited give
//! [`LinuxError::Gone`] (the caller saw the pid before), so a vanishing
//! process is never an error.

use crate::error::LinuxError;
use std::collections::BTreeSet;
use std::path::PathBuf;

fn read_proc(pid: u32, file: &str, what: &'static str) -> Result<String, LinuxError> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).map_err(|e| {
        LinuxError::from_process_op(
            pid,
            e,
            what,
            crate::Capability::SysPtrace,
            crate::error::WHY_PTRACE,
        )
    })
}

/// The executable of a process (`/proc/PID/exe`), `None` when it has none
/// (kernel threads) or cannot be read.
pub fn exe(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// Number of VMAs of a process (lines of `/proc/PID/maps`; reading maps
/// does not walk page tables, unlike smaps).
pub fn vma_count(pid: u32) -> Result<u64, LinuxError> {
    read_proc(pid, "maps", "reading /proc/PID/maps").map(|t| t.lines().count() as u64)
}

/// `vm.max_map_count`: the most VMAs one process may have.
pub fn max_map_count() -> Result<u64, LinuxError> {
    let t = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map_err(|e| LinuxError::io("reading /proc/sys/vm/max_map_count", e))?;
    t.trim()
        .parse()
        .map_err(|_| LinuxError::Parse(format!("/proc/sys/vm/max_map_count: {t:?}")))
}

/// The pids under `/proc` (processes, not threads): one directory read, so
/// a caller can tell cheaply whether processes came or went.
pub fn pids() -> Result<BTreeSet<u32>, LinuxError> {
    let dir = std::fs::read_dir("/proc").map_err(|e| LinuxError::io("listing /proc", e))?;
    Ok(dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// CPU time this process has used, all threads, in ns.
pub fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time the calling thread has used, in ns (UKSM measures its scanner
/// the same way, notes uksm-implementation.md §10).
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// `MemTotal`, `Cached` and `MemFree` of `/proc/meminfo`, KiB, as the
/// scrubber's frequency control reads them.
pub fn memory_kib() -> Result<pagesift_core::scrub::MemoryStats, LinuxError> {
    let text = std::fs::read_to_string("/proc/meminfo")
        .map_err(|e| LinuxError::io("reading /proc/meminfo", e))?;
    let field = |name: &str| -> Result<u64, LinuxError> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .ok_or_else(|| LinuxError::Parse(format!("/proc/meminfo: {name}")))
    };
    Ok(pagesift_core::scrub::MemoryStats {
        total: field("MemTotal")?,
        cached: field("Cached")?,
        free: field("MemFree")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_facts_are_readable() {
        let me = crate::own_pid();
        assert!(vma_count(me).unwrap() > 5);
        assert!(exe(me).is_some());
        assert!(pids().unwrap().contains(&me));
        assert!(max_map_count().unwrap() >= 1024);
        let a = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_ns() > a);
        assert!(process_cpu_ns() >= thread_cpu_ns());
    }

    #[test]
    fn a_missing_pid_is_an_error() {
        assert!(vma_count(u32::MAX - 1).is_err());
    }
}
