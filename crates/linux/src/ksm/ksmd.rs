//! ksmd, the kernel thread that merges, and its CPU time.
//!
//! It is found by name *and* by the `PF_KTHREAD` flag (a user process may
//! be called ksmd too). Its CPU time comes from two sources:
//! `/proc/<ksmd>/schedstat` (exact ns, when the kernel has schedstats)
//! and utime + stime of `/proc/<ksmd>/stat` (USER_HZ ticks, always);
//! [`KsmdCpu::ns`] prefers the first. A reader of it every second keeps
//! both files open ([`KsmdClock`]): ksmd never exits, so its pid names the
//! same thread for as long as the machine runs.

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
        self.clock()?.cpu()
    }

    /// Its CPU time, ns (schedstat, else ticks).
    pub fn cpu_ns(&self) -> Result<u64, LinuxError> {
        self.clock()?.ns()
    }

    /// Its CPU-time files, opened once to be read many times.
    pub fn clock(&self) -> Result<KsmdClock, LinuxError> {
        let open = |file: &str| KeptOpen::open(format!("/proc/{}/{file}", self.pid));
        let stat = open("stat").map_err(|e| LinuxError::io("opening ksmd's /proc/PID/stat", e))?;
        Ok(KsmdClock {
            schedstat: open("schedstat").ok(),
            stat,
            tick_ns: 1_000_000_000 / procfs::ticks_per_second().max(1),
        })
    }
}

/// ksmd's `schedstat` (if the kernel has it) and `stat`, kept open.
#[derive(Debug)]
pub struct KsmdClock {
    schedstat: Option<KeptOpen>,
    stat: KeptOpen,
    tick_ns: u64,
}

impl KsmdClock {
    /// Its CPU time from both sources.
    pub fn cpu(&self) -> Result<KsmdCpu, LinuxError> {
        Ok(KsmdCpu {
            schedstat_ns: self.schedstat_ns(),
            ticks_ns: self.ticks_ns()?,
        })
    }

    /// Its CPU time, ns: schedstat, else ticks (one read either way).
    pub fn ns(&self) -> Result<u64, LinuxError> {
        match self.schedstat_ns() {
            Some(ns) => Ok(ns),
            None => self.ticks_ns(),
        }
    }

    /// `schedstat`'s first field, run time in ns.
    fn schedstat_ns(&self) -> Option<u64> {
        let text = self.schedstat.as_ref()?.read_text().ok()?;
        text.split_whitespace().next()?.parse().ok()
    }

    /// utime + stime of `stat` (fields 14 and 15), in ns.
    fn ticks_ns(&self) -> Result<u64, LinuxError> {
        let text = (self.stat.read_text())
            .map_err(|e| LinuxError::io("reading ksmd's /proc/PID/stat", e))?;
        parse_stat_ticks(&text)
            .map(|t| t * self.tick_ns)
            .ok_or_else(|| LinuxError::Parse(format!("ksmd's stat: {text:?}")))
    }
}

/// utime + stime (fields 14 and 15) of a `/proc/PID/stat` text, in ticks.
/// The fields are counted after the command name's closing parenthesis
/// (the name may hold spaces and parentheses itself).
fn parse_stat_ticks(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    // `rest` starts with field 3 (the state).
    let mut fields = rest.split_whitespace().skip(14 - 3);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_ticks_are_counted_after_the_name() {
        let line = "37 (ks) md)) S 2 0 0 0 -1 2129984 0 0 0 0 150 27 0 0 25 5 1 0 38 0 0";
        assert_eq!(parse_stat_ticks(line), Some(177));
        assert_eq!(parse_stat_ticks("37 (ksmd) S 2"), None);
        assert_eq!(parse_stat_ticks("no parenthesis"), None);
    }

    #[test]
    fn the_kept_clock_agrees_with_a_fresh_read_of_our_own_thread() {
        // The clock reads any task's files; this test's own thread
        // (/proc/thread-self names its tid) stands in for ksmd.
        let tid: u32 = std::fs::read_link("/proc/thread-self")
            .unwrap()
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let me = Ksmd { pid: tid };
        let clock = me.clock().unwrap();
        let a = clock.cpu().unwrap();
        // Burn some CPU: the kept files must show it.
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < std::time::Duration::from_millis(50) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let b = clock.cpu().unwrap();
        assert!(b.ns() > a.ns(), "{a:?} → {b:?}");
        let fresh = me.cpu().unwrap();
        assert!(fresh.ns() >= b.ns(), "{b:?} then {fresh:?}");
    }
}
