//! Which thread of a target to stop.
//!
//! `madvise` and `prctl` act on the whole `mm`, so one stopped thread is
//! enough while the others run. Threads are ranked ([`ThreadRank`]) by
//! what a ptrace stop does to them, from their state in `stat` and, for a
//! sleeping thread, the call it sleeps in (`/proc/PID/task/TID/syscall`):
//!
//! 1. **Quiet**: asleep in a call the kernel restarts transparently after
//!    a stop (`RESTARTS_TRANSPARENTLY`, and I/O on a file descriptor that
//!    is not a socket), or already group-stopped. The first such thread
//!    ends the search.
//! 2. **Running** in user space: no side effect, but the stop needs an
//!    IPI (about 4× the cost). A thread seen running is looked at a few
//!    more times, 100 µs apart: one that only woke briefly from an
//!    EINTR-prone call would be caught back inside it.
//! 3. **Unknown**: asleep in any other call (a socket with `SO_RCVTIMEO`
//!    returns EINTR), or in `restart_syscall` continuing a sleep that no
//!    tracer of this process saw start: the session releases such a
//!    thread untouched (`SkipReason::UnknownRestart`), so it comes last
//!    but one.
//! 4. **EintrRisk**: asleep in a call that returns EINTR to the
//!    application after *any* stop (`EINTR_AFTER_STOP`); chosen only when
//!    the caller allows it.
//!
//! Threads in `D` are never chosen (the stop would wait until they leave
//! it), nor traced or dead ones, nor io_uring's I/O workers
//! (`PF_IO_WORKER`: kernel threads inside the process that ptrace refuses
//! and that never run user code). The main thread is looked at first: the
//! process's own `stat` already carries its state, so a single-threaded
//! process costs no extra read.

use super::calls::nr;
use super::facts::ProcStat;
use super::outcome::SkipReason;
use crate::proc::read_small;
use std::collections::HashMap;
use std::time::Duration;

/// How suitable a thread is for a stop; lower is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThreadRank {
    /// Asleep in a call that restarts transparently, or group-stopped.
    Quiet,
    /// Running (or runnable) in user space: no side effect, costlier stop.
    Running,
    /// Asleep in a call whose behaviour after a stop is not known.
    Unknown,
    /// Asleep in a call that returns EINTR to the application after a stop.
    EintrRisk,
}

/// Calls that return EINTR to the application after any stop, even without
/// a signal handler (signal(7), "Interruption of system calls and library
/// functions by stop signals"; `epoll_wait` measured).
pub(super) const EINTR_AFTER_STOP: &[i64] = &[
    nr::EPOLL_WAIT,
    nr::EPOLL_PWAIT,
    nr::EPOLL_PWAIT2,
    nr::SEMOP,
    nr::SEMTIMEDOP,
    nr::RT_SIGTIMEDWAIT,
    nr::IO_GETEVENTS,
    nr::IO_PGETEVENTS,
    nr::IO_URING_ENTER,
];

/// Calls that the kernel restarts transparently after a ptrace stop (they
/// return `-ERESTARTSYS`/`-ERESTARTNOHAND`/`-ERESTART_RESTARTBLOCK`;
/// nanosleep, read on a pipe and futex measured).
const RESTARTS_TRANSPARENTLY: &[i64] = &[
    nr::POLL,
    nr::SELECT,
    nr::PAUSE,
    nr::NANOSLEEP,
    nr::WAIT4,
    nr::MSGSND,
    nr::MSGRCV,
    nr::FLOCK,
    nr::RT_SIGSUSPEND,
    nr::FUTEX,
    nr::RESTART_SYSCALL,
    nr::CLOCK_NANOSLEEP,
    nr::WAITID,
    nr::PSELECT6,
    nr::PPOLL,
    nr::FUTEX_WAITV,
];

/// Calls on a file descriptor that restart transparently unless the file is
/// a socket (a socket with `SO_RCVTIMEO`/`SO_SNDTIMEO` returns EINTR).
const FD_IO: &[i64] = &[
    nr::READ,
    nr::WRITE,
    nr::PREAD64,
    nr::PWRITE64,
    nr::READV,
    nr::WRITEV,
    nr::PREADV,
    nr::PWRITEV,
];

/// Ranks a thread asleep in syscall `nr`, whose first argument is a socket
/// when `fd_is_socket`.
pub fn rank_syscall(nr: i64, fd_is_socket: bool) -> ThreadRank {
    if RESTARTS_TRANSPARENTLY.contains(&nr) || (FD_IO.contains(&nr) && !fd_is_socket) {
        ThreadRank::Quiet
    } else if EINTR_AFTER_STOP.contains(&nr) {
        ThreadRank::EintrRisk
    } else {
        ThreadRank::Unknown
    }
}

/// `/proc/PID/task/TID/syscall`: `running`, `-1 sp pc` (asleep outside a
/// syscall) or `nr arg1 .. arg6 sp pc`. Returns the number and first
/// argument, `None` when running.
fn parse_syscall_file(text: &str) -> Option<(i64, u64)> {
    let mut f = text.split_whitespace();
    let nr: i64 = f.next()?.parse().ok()?;
    let arg0 = f
        .next()
        .and_then(|a| u64::from_str_radix(a.trim_start_matches("0x"), 16).ok())
        .unwrap_or(0);
    Some((nr, arg0))
}

/// A thread chosen for the stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadChoice {
    /// The thread.
    pub tid: u32,
    /// How suitable it is.
    pub rank: ThreadRank,
    /// The syscall it was asleep in, if any.
    pub syscall: Option<i64>,
}

/// Ranks a thread in `state`; `None` if it cannot be stopped now (D,
/// traced, dead).
fn rank_state(pid: u32, tid: u32, state: char) -> Option<ThreadChoice> {
    let (rank, syscall) = match state {
        'R' => (ThreadRank::Running, None),
        'T' => (ThreadRank::Quiet, None),
        'S' => {
            let text = read_small(&format!("/proc/{pid}/task/{tid}/syscall")).ok()??;
            match parse_syscall_file(&String::from_utf8_lossy(&text)) {
                None => (ThreadRank::Running, None),
                Some((-1, _)) => (ThreadRank::Unknown, None),
                Some((nr, arg0)) => {
                    let socket = FD_IO.contains(&nr)
                        && std::fs::read_link(format!("/proc/{pid}/fd/{arg0}"))
                            .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"));
                    (rank_syscall(nr, socket), Some(nr))
                }
            }
        }
        // D: the stop would wait until it leaves D; t: traced; Z/X: dead.
        _ => return None,
    };
    Some(ThreadChoice { tid, rank, syscall })
}

/// Ranks one thread from its own `stat`; an io_uring worker is never a
/// candidate.
pub(super) fn rank_thread(pid: u32, tid: u32) -> Option<ThreadChoice> {
    let stat = ProcStat::read(pid, &format!("/proc/{pid}/task/{tid}/stat")).ok()??;
    if stat.io_worker {
        return None;
    }
    rank_state(pid, tid, stat.state)
}

/// Why no thread was chosen.
#[derive(Debug)]
pub(super) enum NoChoice {
    Gone,
    Skip(SkipReason),
}

/// Threads seen in a call that returns EINTR after a stop, by sampling or at
/// a stop: thread id → (its process's start time, so that a reused id does
/// not inherit the mark; the call).
pub(super) type EintrProne = HashMap<u32, (u64, i64)>;

/// Picks the best thread of `pid` (see the module header); stops looking at
/// the first [`ThreadRank::Quiet`] one.
pub fn choose_thread(pid: u32, allow_eintr_risk: bool) -> Result<ThreadChoice, SkipReason> {
    let Ok(Some(stat)) = ProcStat::of_process(pid) else {
        return Err(SkipReason::Zombie);
    };
    choose(pid, &stat, allow_eintr_risk, &mut EintrProne::new()).map_err(|e| match e {
        NoChoice::Gone => SkipReason::Zombie,
        NoChoice::Skip(r) => r,
    })
}

/// Whether a thread seen running is in fact mostly asleep in an EINTR-prone
/// call: a thread that only woke briefly from `epoll_wait` reads as running
/// about 2 % of the time on this machine (sampled), and the stop would then
/// catch it back inside the call. It is marked if it was ever seen in such a
/// call, or if a few more looks, 100 µs apart, find it there.
fn really_running(pid: u32, start: u64, tid: u32, prone: &mut EintrProne) -> ThreadChoice {
    if let Some(&(st, nr)) = prone.get(&tid)
        && st == start
    {
        return ThreadChoice {
            tid,
            rank: ThreadRank::EintrRisk,
            syscall: Some(nr),
        };
    }
    for _ in 0..3 {
        std::thread::sleep(Duration::from_micros(100));
        let Some(c) = rank_thread(pid, tid) else {
            break;
        };
        match c.rank {
            ThreadRank::Running => continue,
            ThreadRank::EintrRisk => {
                prone.insert(tid, (start, c.syscall.unwrap_or(-1)));
                return c;
            }
            _ => return c,
        }
    }
    ThreadChoice {
        tid,
        rank: ThreadRank::Running,
        syscall: None,
    }
}

/// `stat` is the process's: it carries the main thread's state, so the
/// main thread, looked at first, costs no extra read, and a single-threaded
/// process needs no task listing.
pub(super) fn choose(
    pid: u32,
    stat: &ProcStat,
    allow_eintr_risk: bool,
    prone: &mut EintrProne,
) -> Result<ThreadChoice, NoChoice> {
    let start = stat.start_time;
    let mut tids = vec![pid];
    if stat.threads > 1 {
        let dir = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|_| NoChoice::Gone)?;
        tids.extend(
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .filter(|&t| t != pid),
        );
        tids[1..].sort_unstable();
    }
    let mut others = Vec::new();
    for tid in tids {
        let c = if tid == pid {
            rank_state(pid, tid, stat.state)
        } else {
            rank_thread(pid, tid)
        };
        let Some(c) = c else {
            continue;
        };
        match c.rank {
            // Continuing a sleep no tracer saw start: the session would
            // release it untouched (`SkipReason::UnknownRestart`), so any
            // other thread that can be stopped is better.
            ThreadRank::Quiet
                if c.syscall == Some(nr::RESTART_SYSCALL)
                    && !super::tracer::restart_known(tid, start) =>
            {
                others.push(ThreadChoice {
                    rank: ThreadRank::Unknown,
                    ..c
                });
                continue;
            }
            ThreadRank::Quiet => return Ok(c),
            ThreadRank::EintrRisk => {
                prone.insert(tid, (start, c.syscall.unwrap_or(-1)));
            }
            _ => {}
        }
        others.push(c);
    }
    // No quiet thread: the best of the rest, looking twice at running ones.
    others.sort_by_key(|c| c.rank);
    let mut risky = None;
    for c in others {
        let c = match c.rank {
            ThreadRank::Running => really_running(pid, start, c.tid, prone),
            _ => c,
        };
        if c.rank == ThreadRank::EintrRisk {
            risky = risky.or(Some(c));
            continue;
        }
        return Ok(c);
    }
    match risky {
        None => Err(NoChoice::Skip(SkipReason::NoStoppableThread)),
        Some(c) if allow_eintr_risk => Ok(c),
        Some(c) => Err(NoChoice::Skip(SkipReason::EintrRisk {
            tid: c.tid,
            syscall: c.syscall.unwrap_or(-1),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_file_parses() {
        assert_eq!(parse_syscall_file("running\n"), None);
        assert_eq!(
            parse_syscall_file("-1 0x7ffd5f0 0x7f00\n"),
            Some((-1, 0x7ffd5f0))
        );
        assert_eq!(
            parse_syscall_file("0 0x3 0x7f0000 0x8 0x0 0x0 0x0 0x7ffd 0x7f01\n"),
            Some((0, 3))
        );
        assert_eq!(
            parse_syscall_file("232 0x4 0x7ffd 0x1 0x14 0x0 0x0 0x7ffd 0x7f01\n").map(|x| x.0),
            Some(232)
        );
    }

    #[test]
    fn threads_rank_by_restart_behaviour() {
        assert_eq!(rank_syscall(nr::FUTEX, false), ThreadRank::Quiet);
        assert_eq!(rank_syscall(nr::CLOCK_NANOSLEEP, false), ThreadRank::Quiet);
        assert_eq!(rank_syscall(nr::READ, false), ThreadRank::Quiet);
        assert_eq!(rank_syscall(nr::READ, true), ThreadRank::Unknown);
        assert_eq!(rank_syscall(nr::EPOLL_WAIT, false), ThreadRank::EintrRisk);
        assert_eq!(
            rank_syscall(nr::RT_SIGTIMEDWAIT, false),
            ThreadRank::EintrRisk
        );
        assert_eq!(rank_syscall(45, false), ThreadRank::Unknown); // recvfrom
        assert!(ThreadRank::Quiet < ThreadRank::Running);
        assert!(ThreadRank::Running < ThreadRank::Unknown);
        assert!(ThreadRank::Unknown < ThreadRank::EintrRisk);
    }
}
