//! What `/proc` says about a target before (and while) it is attached:
//! its `stat` (state, parent, kernel thread or not, threads, start time),
//! a thread's `status` (its process, its tracer, its seccomp mode) and
//! blocked-signal mask, whether its cgroup v2 is frozen, and the VMA
//! budget of a batch.
//!
//! These are read on every attach, so through [`crate::proc::read_small`]
//! (the fast reader) and parsed by hand: `stat` after the last `)`, since
//! the command may hold spaces and parentheses. A file that is gone means
//! the process or thread is gone (`Ok(None)`), which the tracer reports as
//! [`Outcome::Gone`](super::Outcome::Gone), never as an error.
//!
//! The VMA budget ([`map_budget`]): each `madvise` may split a VMA at both
//! ends, so a batch of `n` splitting calls may add `2n` VMAs; it is
//! refused when that could pass a fraction of `vm.max_map_count`, past
//! which the target's own `mmap` calls would fail with ENOMEM.

use super::outcome::{SkipReason, WHY_INJECT};
use crate::error::LinuxError;
use crate::proc::{self, Access, read_small};

/// `PF_KTHREAD` (`include/linux/sched.h`).
const PF_KTHREAD: u64 = 0x0020_0000;
/// `PF_EXITING` (`include/linux/sched.h`): the thread has begun to exit.
const PF_EXITING: u64 = 0x0000_0004;
/// `PF_IO_WORKER` (`include/linux/sched.h`): a kernel I/O thread living in
/// the process (io_uring's `iou-wrk-*` and `iou-sqp-*`).
const PF_IO_WORKER: u64 = 0x0000_0010;

/// What `/proc/PID/stat` says about a process (or `/proc/PID/task/TID/stat`
/// about a thread). A process's `stat` shows its main thread's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ProcStat {
    pub(super) state: char,
    pub(super) ppid: u32,
    pub(super) kthread: bool,
    /// `PF_EXITING`: the thread is on its way out.
    pub(super) exiting: bool,
    /// `PF_IO_WORKER`: an io_uring worker; ptrace refuses to attach to it
    /// (EPERM) and it never returns to user space to run injected code.
    pub(super) io_worker: bool,
    pub(super) threads: u64,
    pub(super) start_time: u64,
}

/// Fields 3, 4, 9, 20 and 22 of proc(5)'s `stat`; the command may contain
/// spaces and parentheses, so parse after the last `)`.
fn parse_stat(text: &[u8]) -> Option<ProcStat> {
    let close = text.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&text[close + 1..]).ok()?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let flags: u64 = f.get(6)?.parse().ok()?;
    Some(ProcStat {
        state: f.first()?.chars().next()?,
        ppid: f.get(1)?.parse().ok()?,
        kthread: flags & PF_KTHREAD != 0,
        exiting: flags & PF_EXITING != 0,
        io_worker: flags & PF_IO_WORKER != 0,
        threads: f.get(17)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

impl ProcStat {
    pub(super) fn read(pid: u32, path: &str) -> Result<Option<ProcStat>, LinuxError> {
        match read_small(path)
            .map_err(|e| proc::error(pid, e, "reading /proc", Access::Ptrace(WHY_INJECT)))?
        {
            None => Ok(None),
            Some(t) => parse_stat(&t)
                .map(Some)
                .ok_or_else(|| LinuxError::Parse(path.to_string())),
        }
    }

    pub(super) fn of_process(pid: u32) -> Result<Option<ProcStat>, LinuxError> {
        ProcStat::read(pid, &format!("/proc/{pid}/stat"))
    }

    pub(super) fn skip_reason(&self) -> Option<SkipReason> {
        if self.kthread {
            Some(SkipReason::KernelThread)
        } else if matches!(self.state, 'Z' | 'X' | 'x') {
            Some(SkipReason::Zombie)
        } else {
            None
        }
    }
}

/// What a thread's `status` says: its process, tracer and seccomp mode.
/// Seccomp filters and tracers are per thread, so this is read for the
/// thread that will be stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ThreadStatus {
    pub(super) tgid: u32,
    pub(super) tracer: u32,
    pub(super) seccomp: u32,
}

fn status_field(text: &str, key: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.trim().parse().ok())
}

impl ThreadStatus {
    fn parse(text: &str) -> Option<ThreadStatus> {
        Some(ThreadStatus {
            tgid: status_field(text, "Tgid")?,
            tracer: status_field(text, "TracerPid")?,
            // Absent without CONFIG_SECCOMP: then there is no filter.
            seccomp: status_field(text, "Seccomp").unwrap_or(0),
        })
    }

    pub(super) fn read(pid: u32, tid: u32) -> Result<Option<ThreadStatus>, LinuxError> {
        let path = format!("/proc/{pid}/task/{tid}/status");
        match read_small(&path)
            .map_err(|e| proc::error(pid, e, "reading /proc", Access::Ptrace(WHY_INJECT)))?
        {
            None => Ok(None),
            Some(t) => ThreadStatus::parse(&String::from_utf8_lossy(&t))
                .map(Some)
                .ok_or(LinuxError::Parse(path)),
        }
    }

    pub(super) fn skip_reason(&self) -> Option<SkipReason> {
        if self.tracer != 0 {
            Some(SkipReason::Traced {
                tracer: self.tracer,
            })
        } else if self.seccomp != 0 {
            Some(SkipReason::Seccomp { mode: self.seccomp })
        } else {
            None
        }
    }
}

/// The cgroup v2 path of `pid` (`/proc/PID/cgroup`, `0::PATH`).
pub(super) fn cgroup_path(pid: u32) -> Option<String> {
    let text = read_small(&format!("/proc/{pid}/cgroup")).ok()??;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// Whether cgroup v2 `path` is frozen (`cgroup.events`: `frozen 1`). False
/// when unknown. (A cgroup v1 freezer puts tasks in an uninterruptible
/// state, `D`, which thread choice already avoids.)
pub(super) fn cgroup_frozen(path: &str) -> bool {
    let Some(root) = proc::cgroup2_mount() else {
        return false;
    };
    read_small(&format!("{root}{path}/cgroup.events"))
        .ok()
        .flatten()
        .is_some_and(|ev| {
            String::from_utf8_lossy(&ev)
                .lines()
                .any(|l| l.trim() == "frozen 1")
        })
}

/// The map-count rule: a batch of `splitting_calls` madvise calls may add
/// two VMAs each; refuse if `count` plus that could pass `fraction` of
/// `limit`.
pub fn map_budget(
    count: u64,
    splitting_calls: usize,
    limit: u64,
    fraction: f64,
) -> Result<(), SkipReason> {
    let projected = count + 2 * splitting_calls as u64;
    let allowed = (limit as f64 * fraction).floor() as u64;
    if projected > allowed {
        Err(SkipReason::MapCountNearLimit {
            count,
            projected,
            limit,
        })
    } else {
        Ok(())
    }
}

/// The thread's blocked-signal mask (`SigBlk:` of its `status`), read while
/// it is stopped (only the thread itself changes it).
pub(super) fn blocked_mask(pid: u32, tid: u32) -> Option<u64> {
    let text = read_small(&format!("/proc/{pid}/task/{tid}/status")).ok()??;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_status_parse() {
        let stat = b"42 (a (weird) name) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 3 0 987654 1000 100";
        let st = parse_stat(stat).unwrap();
        assert_eq!(
            st,
            ProcStat {
                state: 'S',
                ppid: 1,
                kthread: false,
                exiting: false,
                io_worker: false,
                threads: 3,
                start_time: 987654
            }
        );
        assert_eq!(st.skip_reason(), None);
        let kstat = b"2 (kthreadd) S 0 0 0 0 -1 2129984 0 0 0 0 0 0 0 0 20 0 1 0 5 0 0";
        assert_eq!(
            parse_stat(kstat).unwrap().skip_reason(),
            Some(SkipReason::KernelThread)
        );
        let zstat = String::from_utf8_lossy(stat).replace(") S ", ") Z ");
        assert_eq!(
            parse_stat(zstat.as_bytes()).unwrap().skip_reason(),
            Some(SkipReason::Zombie)
        );
        // A command that is not UTF-8 does not matter.
        let mut odd = b"7 (\xff\xfe) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 55 0 0".to_vec();
        odd[3] = 0xff;
        assert_eq!(parse_stat(&odd).map(|s| s.start_time), Some(55));
        assert_eq!(parse_stat(b"garbage"), None);

        let status = "Name:\tx\nState:\tS (sleeping)\nTgid:\t42\nPid:\t43\nPPid:\t1\nTracerPid:\t0\nSeccomp:\t2\nSeccomp_filters:\t1\n";
        let t = ThreadStatus::parse(status).unwrap();
        assert_eq!((t.tgid, t.tracer, t.seccomp), (42, 0, 2));
        assert_eq!(t.skip_reason(), Some(SkipReason::Seccomp { mode: 2 }));
        let traced = status.replace("TracerPid:\t0", "TracerPid:\t77");
        assert_eq!(
            ThreadStatus::parse(&traced).unwrap().skip_reason(),
            Some(SkipReason::Traced { tracer: 77 })
        );
        let plain = status.replace("Seccomp:\t2", "Seccomp:\t0");
        assert_eq!(ThreadStatus::parse(&plain).unwrap().skip_reason(), None);
    }

    #[test]
    fn map_budget_stops_at_the_fraction() {
        assert!(map_budget(100, 10, 65530, 0.5).is_ok());
        assert!(map_budget(32_745, 10, 65530, 0.5).is_ok()); // 32765 = floor(0.5 × 65530)
        assert_eq!(
            map_budget(32_746, 10, 65530, 0.5),
            Err(SkipReason::MapCountNearLimit {
                count: 32_746,
                projected: 32_766,
                limit: 65530
            })
        );
        assert!(map_budget(10, 0, 20, 0.5).is_ok());
        assert!(map_budget(11, 0, 20, 0.5).is_err());
    }
}
