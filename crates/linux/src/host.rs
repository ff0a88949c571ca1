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

/// One live thread of this process and the CPU time it has used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ThreadCpu {
    /// Its thread id (the process's pid for the main thread).
    pub tid: u32,
    /// Its name (`comm`, as `pthread_setname_np` or `Builder::name` set it).
    pub name: String,
    /// CPU time used, ns: `schedstat`'s first field (exact), or `utime +
    /// stime` in clock ticks where the kernel keeps no schedstat.
    pub cpu_ns: u64,
}

/// This process's live threads and the CPU time each has used (one
/// `/proc/self/task/TID/` read per thread). A thread that has exited is
/// not listed: its time counts only in [`process_cpu_ns`]. Why: the
/// per-phase clock covers the main thread's wake-ups only, and about a
/// fifth of the daemon's CPU in a vm-boot run fell outside them (other
/// threads, such as the tracer that injects marks, and start-up).
///
/// Two small reads a thread, `schedstat` and `comm`, each a number or a
/// name; `stat` (through procfs, which parses all of its fields) only
/// where the kernel keeps no schedstat. The daemon takes this once a
/// second for its status: 8 % of the CPU of a daemon sampling 1 GiB of
/// distinct pages with procfs's parsed `stat` and `schedstat`, 6.7 % so
/// (perf by hand, 2026-12-04, 2-CPU AMD EPYC); the rest is the kernel's
/// opening of the files.
pub fn own_threads_cpu() -> Result<Vec<ThreadCpu>, LinuxError> {
    let dir = std::fs::read_dir("/proc/self/task")
        .map_err(|e| LinuxError::io("reading /proc/self/task", e))?;
    let mut out = Vec::new();
    for entry in dir {
        let Some(tid) = entry
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<u32>().ok())
        else {
            continue;
        };
        // A thread can exit between the listing and the reads.
        let Some(name) = std::fs::read_to_string(format!("/proc/self/task/{tid}/comm")).ok() else {
            continue;
        };
        let Some(cpu_ns) = thread_schedstat_ns(tid).or_else(|| thread_ticks_ns(tid)) else {
            continue;
        };
        out.push(ThreadCpu {
            tid,
            name: name.trim_end_matches('\n').to_string(),
            cpu_ns,
        });
    }
    Ok(out)
}

/// The first field of `/proc/self/task/TID/schedstat`: CPU time, ns.
fn thread_schedstat_ns(tid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/self/task/{tid}/schedstat"))
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `utime + stime` of `/proc/self/task/TID/stat`, in ns (clock ticks).
fn thread_ticks_ns(tid: u32) -> Option<u64> {
    let stat = procfs::process::Process::myself()
        .ok()?
        .task_from_tid(tid as i32)
        .ok()?
        .stat()
        .ok()?;
    let ticks = procfs::ticks_per_second().max(1);
    Some((stat.utime + stat.stime) * 1_000_000_000 / ticks)
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

    #[test]
    fn a_named_thread_is_listed_with_the_cpu_it_used() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::Builder::new()
            .name("busy-thread-x".into())
            .spawn(move || {
                // Burn at least 60 ms of this thread's CPU, then wait to
                // be read.
                let t0 = thread_cpu_ns();
                let mut x = 0u64;
                while thread_cpu_ns() - t0 < 60_000_000 {
                    x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(1));
                }
                tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32)
                    .unwrap();
                let _ = done_rx.recv();
            })
            .unwrap();
        let tid = rx.recv().unwrap();
        let threads = own_threads_cpu().unwrap();
        done_tx.send(()).unwrap();
        t.join().unwrap();
        let busy = threads.iter().find(|t| t.tid == tid).expect("listed");
        assert_eq!(busy.name, "busy-thread-x");
        // Ticks are 10 ms where schedstat is missing.
        assert!(busy.cpu_ns >= 50_000_000, "{busy:?}");
        let me = crate::own_pid();
        assert!(threads.iter().any(|t| t.tid == me), "the main thread");
        let sum: u64 = threads.iter().map(|t| t.cpu_ns).sum();
        assert!(sum <= process_cpu_ns() + 20_000_000, "{sum}");
    }
}
