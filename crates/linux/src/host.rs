//! Small facts about processes and the host that the daemon needs besides
//! their memory and KSM ([`crate::ksm`] has per-process KSM state and
//! vmstat, [`crate::proc`] the VMA count and `vm.max_map_count`):
//! executables, which processes exist, memory totals, and CPU clocks.
//!
//! Everything here is a read of one small `/proc` file or a clock; none
//! touches a target's memory. The clocks are here so that crates above
//! this one read them without a syscall crate of their own.

use crate::error::LinuxError;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// The executable of a process (`/proc/PID/exe`), `None` when it has none
/// (kernel threads) or cannot be read.
pub fn exe(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
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

/// CPU time the calling thread has used, in ns (the cost a scanner
/// charges itself, unaffected by other threads and by time spent waiting
/// for a CPU).
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time the hypervisor took from this machine's CPUs since boot, in
/// ms, all CPUs together (`steal` of `/proc/stat`; `None` when the kernel
/// does not count it). On a shared virtual machine it is what made timings
/// noisy: a figure measured while it grew is a figure of a slower machine.
pub fn stolen_ms() -> Option<u64> {
    use procfs::CurrentSI;
    procfs::KernelStats::current().ok()?.total.steal_ms()
}

/// `MemTotal`, `Cached` and `MemFree` of `/proc/meminfo`, KiB, as the
/// scrubber's frequency control reads them.
pub fn memory_kib() -> Result<pagesift_core::pipeline::scrub::MemoryStats, LinuxError> {
    use procfs::Current;
    // procfs gives bytes.
    let m = procfs::Meminfo::current()
        .map_err(|e| LinuxError::io("reading /proc/meminfo", std::io::Error::other(e)))?;
    Ok(pagesift_core::pipeline::scrub::MemoryStats {
        total: m.mem_total / 1024,
        cached: m.cached / 1024,
        free: m.mem_free / 1024,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_facts_are_readable() {
        let me = crate::own_pid();
        assert!(exe(me).is_some());
        assert!(pids().unwrap().contains(&me));
        let a = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_ns() > a);
        assert!(process_cpu_ns() >= thread_cpu_ns());
        // Never counts back (None on a kernel without the column).
        if let Some(a) = stolen_ms() {
            assert!(stolen_ms().unwrap() >= a);
        }
    }
}
