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
//!
//! How long ksmd waited for a CPU, runnable but not running, is
//! `schedstat`'s second field (the scheduler's run delay), which no clock
//! gives: [`KsmdWait`] keeps that file open and reads it with one `pread`.
//! The pacer needs it to tell the sleep it set from the time the scheduler
//! kept ksmd off a busy machine's cores (`core::pipeline::pacing`, step 2).

use super::error::KsmError;
use crate::LinuxError;
use crate::proc::KeptOpen;
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

/// ksmd's `/proc/<ksmd>/schedstat`, kept open, for its wait for a CPU.
#[derive(Debug)]
pub struct KsmdWait {
    file: KeptOpen,
    buf: Vec<u8>,
}

impl KsmdWait {
    /// ksmd's time spent runnable but waiting for a CPU since it started,
    /// ns.
    pub fn ns(&mut self) -> Result<u64, LinuxError> {
        self.file
            .read_into(&mut self.buf)
            .map_err(|e| LinuxError::io(format!("reading {}", self.file.path()), e))?;
        parse_schedstat(&self.buf)
            .map(|s| s.run_delay)
            .map_err(|e| {
                LinuxError::io(
                    format!("parsing {}", self.file.path()),
                    io::Error::new(io::ErrorKind::InvalidData, e.to_string()),
                )
            })
    }
}

/// `/proc/PID/schedstat` as `procfs` parses it (time on a CPU, time
/// waiting for one, in ns, and the number of times it ran), from a buffer
/// read through the kept-open file.
fn parse_schedstat(text: &[u8]) -> procfs::ProcResult<procfs::process::Schedstat> {
    <procfs::process::Schedstat as procfs::FromRead>::from_read(text)
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

    /// A reader of its wait for a CPU; an error when the kernel has no
    /// schedstats (`/proc/<ksmd>/schedstat` missing) or it cannot be read.
    pub fn wait_reader(&self) -> Result<KsmdWait, LinuxError> {
        let path = format!("/proc/{}/schedstat", self.pid);
        let file =
            KeptOpen::open(&path).map_err(|e| LinuxError::io(format!("opening {path}"), e))?;
        let mut reader = KsmdWait {
            file,
            buf: Vec::new(),
        };
        reader.ns()?;
        Ok(reader)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_gives_run_and_wait() {
        let s = parse_schedstat(b"8605773423 5887904471 7637\n").unwrap();
        assert_eq!(
            (s.sum_exec_runtime, s.run_delay),
            (8_605_773_423, 5_887_904_471)
        );
        assert!(parse_schedstat(b"12 34\n").is_err());
        assert!(parse_schedstat(b"12 x 5\n").is_err());
        assert!(parse_schedstat(b"").is_err());
    }

    #[test]
    fn ksmd_wait_is_read_and_never_runs_backwards() {
        // The machines the tests run on have KSM (the KSM tests need it).
        let ksmd = Ksmd::find().expect("no ksmd thread: this kernel has no KSM");
        let mut w = ksmd.wait_reader().unwrap();
        let (a, b) = (w.ns().unwrap(), w.ns().unwrap());
        assert!(b >= a, "{a} then {b}");
        // The same figure as a fresh read of the file.
        let text = std::fs::read(format!("/proc/{}/schedstat", ksmd.pid())).unwrap();
        let fresh = parse_schedstat(&text).unwrap().run_delay;
        assert!(fresh >= b, "{b} then {fresh}");
    }
}
