//! ksmd, the kernel thread that merges, and its CPU time.
//!
//! It is found by name *and* by the `PF_KTHREAD` flag (a user process may
//! be called ksmd too). Its CPU time comes from two sources:
//! `/proc/<ksmd>/schedstat` (exact ns, when the kernel has schedstats)
//! and utime + stime of `/proc/<ksmd>/stat` (USER_HZ ticks, always);
//! [`KsmdCpu::ns`] prefers the first. A reader every second
//! ([`Ksmd::cpu_ns`]) uses neither: ksmd's CPU-time clock
//! ([`crate::procstat::cpu_ns`]) gives the same exact runtime as
//! `schedstat` with one `clock_gettime`, and no file to open and parse
//! (opening and parsing both files through `procfs` was 5 % of the
//! daemon's CPU beside a short-lived workload, by a perf profile).

use super::error::KsmError;
use crate::LinuxError;
use std::io;

/// The ksmd kernel thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ksmd {
    pid: u32,
}

/// ksmd's CPU time from both sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KsmdCpu {
    /// `/proc/<ksmd>/schedstat` field 1 (exact ns), when the kernel has it.
    pub schedstat_ns: Option<u64>,
    /// (utime + stime) of `/proc/<ksmd>/stat`, converted from USER_HZ
    /// ticks to ns.
    pub ticks_ns: u64,
}

impl KsmdCpu {
    /// The best figure: schedstat, else ticks.
    pub fn ns(&self) -> u64 {
        self.schedstat_ns.unwrap_or(self.ticks_ns)
    }
}

/// PF_KTHREAD in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u32 = 0x0020_0000;

impl Ksmd {
    /// Finds the kernel thread named `ksmd` (a user process called ksmd is
    /// not it).
    pub fn find() -> Result<Ksmd, KsmError> {
        let all = procfs::process::all_processes()
            .map_err(|e| KsmError::io("listing /proc", io::Error::other(e)))?;
        for p in all.flatten() {
            let Ok(stat) = p.stat() else { continue };
            if stat.comm == "ksmd" && stat.flags & PF_KTHREAD != 0 {
                return Ok(Ksmd {
                    pid: stat.pid as u32,
                });
            }
        }
        Err(KsmError::NoKsmd)
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its CPU time from both sources.
    pub fn cpu(&self) -> Result<KsmdCpu, LinuxError> {
        let p = procfs::process::Process::new(self.pid as i32)
            .map_err(|e| LinuxError::io("opening ksmd's /proc entry", io::Error::other(e)))?;
        let stat = p
            .stat()
            .map_err(|e| LinuxError::io("reading ksmd's stat", io::Error::other(e)))?;
        let tick_ns = 1_000_000_000 / procfs::ticks_per_second().max(1);
        Ok(KsmdCpu {
            schedstat_ns: p.schedstat().ok().map(|s| s.sum_exec_runtime),
            ticks_ns: (stat.utime + stat.stime) * tick_ns,
        })
    }

    /// Its CPU time, ns: its CPU-time clock (exact, like `schedstat`).
    pub fn cpu_ns(&self) -> Result<u64, LinuxError> {
        crate::procstat::cpu_ns(self.pid)
    }
}
