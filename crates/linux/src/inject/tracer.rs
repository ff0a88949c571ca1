//! One injection attempt, as the tracer thread runs it: from the first
//! look at `/proc` to the detach (steps 1 to 6 of the parent module's
//! header), and the state the tracer keeps between attempts.
//!
//! The order is the safety argument: everything that can refuse a
//! process without touching it comes first (kernel thread, zombie, frozen
//! cgroup, the VMA budget, a tracer or seccomp on the chosen thread), then
//! the seize and the stop, then the checks only a stopped thread allows
//! (still the same program image, 64-bit, no seccomp filter installed
//! since, the gadgets still in place), and only then is the rescue frame
//! written. Every way out after the seize goes through
//! [`Session::finish`] or [`Session::release`] (or, if the thread cannot
//! be released from where it is, the exit of the tracer thread, which the
//! kernel turns into a detach).
//!
//! Kept between attempts ([`Tracer`]), each bounded at 65,536 entries and
//! keyed by pid or tid together with the process's start time, so a
//! reused id never inherits a stale entry: the gadgets per process, the
//! cgroup path per process, the threads known to sit in EINTR-prone
//! calls, and the call a thread was restarting through `restart_syscall`.
//! The VMA count after a batch is kept in [`crate::vma_counts`], which
//! every budget check of the process shares, under the same key.

use super::calls::{ERESTART_RESTARTBLOCK, Syscall, nr};
use super::facts::{ProcStat, ThreadStatus, cgroup_frozen, cgroup_path, map_budget};
use super::fault::{checkpoint, cut_point};
use super::gadgets::Gadgets;
use super::outcome::{Gone, InjectConfig, InjectError, Injection, Outcome, SkipReason, WHY_INJECT};
use super::rescue::{SCRATCH_ALL_SIGNALS, SCRATCH_OWN_MASK};
use super::session::{
    Held, MAX_SIGNAL_RESTARTS, NR_RT_SIGPROCMASK, Prep, SIG_BLOCK, SIG_SETMASK, Session, StepError,
    os,
};
use super::thread::{
    EINTR_AFTER_STOP, EintrProne, NoChoice, ThreadChoice, ThreadRank, choose, rank_thread,
};
use crate::caps::Capability;
use crate::error::{LinuxError, libc_errno};
use crate::proc::max_map_count;
use crate::ptrace::{self, Regs, Stop};
use crate::vma_counts;
use std::collections::HashMap;
use std::io;
use std::time::Instant;

/// One batch for the tracer thread.
pub(super) struct Job {
    pub(super) pid: u32,
    pub(super) tid: Option<u32>,
    /// The program image the caller judged (`discover::image_id`): checked
    /// again once the thread is stopped.
    pub(super) image: Option<u64>,
    pub(super) calls: Vec<Syscall>,
    pub(super) config: InjectConfig,
}

/// The tracer's answer.
pub(super) struct Reply {
    pub(super) result: Result<Outcome, InjectError>,
    /// The tracer thread exits after this reply (a thread is seized but
    /// never stopped; the exit detaches it).
    pub(super) exiting: bool,
}

/// tid → (its process's start time, rip, the call) of threads seen stopped
/// in a call that restarts through `restart_syscall`.
type Restarts = HashMap<u32, (u64, u64, i64)>;

/// The [`Restarts`] seen by any tracer of this process (see
/// [`Tracer::restart_origin`]).
static RESTARTS: std::sync::Mutex<Option<Restarts>> = std::sync::Mutex::new(None);

/// Whether a tracer of this process saw thread `tid` (of the process that
/// started at `start_time`) stop in a call that restarts through
/// `restart_syscall`: its next attach in `restart_syscall` can then restore
/// it (the thread chooser prefers threads for which this holds).
pub(super) fn restart_known(tid: u32, start_time: u64) -> bool {
    let restarts = RESTARTS.lock().unwrap_or_else(|e| e.into_inner());
    restarts
        .as_ref()
        .and_then(|r| r.get(&tid))
        .is_some_and(|&(st, _, _)| st == start_time)
}

/// For a thread stopped in `restart_syscall`, the call it restarts, if
/// a tracer of this process stopped it in that call before (at the
/// same `rip`); records the call of a thread stopped in it with
/// `-ERESTART_RESTARTBLOCK` for next time. Shared by every tracer of
/// the process ([`RESTARTS`]): the daemon marks through one injector
/// and registers write tracking through another, and the sleep one of
/// them cut short is continued when the other attaches.
pub(super) fn restart_origin(tid: u32, start_time: u64, regs: &Regs) -> Option<i64> {
    let nr = regs.orig_rax as i64;
    if nr < 0 || -(regs.rax as i64) != ERESTART_RESTARTBLOCK {
        return None;
    }
    let mut restarts = RESTARTS.lock().unwrap_or_else(|e| e.into_inner());
    let restarts = restarts.get_or_insert_with(HashMap::new);
    if nr != nr::RESTART_SYSCALL {
        if restarts.len() >= 65_536 {
            restarts.clear();
        }
        restarts.insert(tid, (start_time, regs.rip, nr));
        return None;
    }
    restarts
        .get(&tid)
        .filter(|&&(st, rip, _)| st == start_time && rip == regs.rip)
        .map(|&(_, _, n)| n)
}

/// The state of the tracer thread.
#[derive(Default)]
pub(super) struct Tracer {
    /// pid → (start time, the gadgets found in it).
    insns: HashMap<u32, (u64, Gadgets)>,
    /// Threads known to sit in EINTR-prone calls.
    prone: EintrProne,
    /// pid → (start time, cgroup v2 path): a process rarely changes cgroup.
    /// If it moved into a frozen one, the call timeout catches it (the
    /// batch is abandoned cleanly) and the entry is dropped.
    cgroups: HashMap<u32, (u64, Option<String>)>,
}

/// How long a process's VMA count, read after a batch, stands for the next
/// batch's budget check. Reading `/proc/PID/maps` twice a batch was a
/// tenth of the daemon's CPU on three booting QEMU guests (perf,
/// `pagesift bench --quick --only vm-boot`, 2026-11-26: the maps of a
/// guest whose RAM marks had split run to hundreds of lines, each path
/// formatted by the kernel). pagesift's choice.
const VMA_COUNT_FRESH: std::time::Duration = std::time::Duration::from_secs(2);
/// VMAs a process may add by itself within [`VMA_COUNT_FRESH`], on top of
/// a cached count, for the budget check to stand on it: a count that
/// close to the budget is read again. pagesift's choice.
const VMA_COUNT_SLACK: u64 = 1024;

impl Tracer {
    /// Whether the process's cgroup is frozen (its path cached).
    fn frozen(&mut self, pid: u32, start_time: u64) -> bool {
        if self.cgroups.len() >= 65_536 {
            self.cgroups.clear();
        }
        let entry = self
            .cgroups
            .entry(pid)
            .and_modify(|e| {
                if e.0 != start_time {
                    *e = (start_time, cgroup_path(pid));
                }
            })
            .or_insert_with(|| (start_time, cgroup_path(pid)));
        entry.1.as_deref().is_some_and(cgroup_frozen)
    }

    /// The gadgets of the stopped process, from the cache if they are still
    /// there.
    pub(super) fn gadgets(&mut self, pid: u32, start_time: u64) -> Option<Gadgets> {
        if let Some(&(st, g)) = self.insns.get(&pid)
            && st == start_time
            && g.intact(pid)
        {
            return Some(g);
        }
        self.insns.remove(&pid);
        // The same C library as a process seen before: no search.
        let g = Gadgets::find_like(pid, self.insns.values().map(|(_, g)| g))
            .or_else(|| Gadgets::find(pid))?;
        if self.insns.len() >= 65_536 {
            self.insns.clear();
        }
        self.insns.insert(pid, (start_time, g));
        Some(g)
    }

    pub(super) fn attempt(&mut self, job: &Job) -> Reply {
        let mut exiting = false;
        let result = self.attempt_inner(job, &mut exiting);
        match &result {
            Ok(Outcome::Gone(Gone { attached: true, .. })) => {
                self.insns.remove(&job.pid);
            }
            // Perhaps moved into a frozen cgroup: look again next time.
            Ok(Outcome::Skipped(SkipReason::SyscallTimeout { .. })) => {
                self.cgroups.remove(&job.pid);
            }
            _ => {}
        }
        Reply { result, exiting }
    }

    fn attempt_inner(&mut self, job: &Job, exiting: &mut bool) -> Result<Outcome, InjectError> {
        let pid = job.pid;
        let cfg = &job.config;
        let gone = |attached, completed| {
            Ok(Outcome::Gone(Gone {
                attached,
                completed,
            }))
        };
        let Some(stat) = ProcStat::of_process(pid)? else {
            return gone(false, vec![]);
        };
        if let Some(r) = stat.skip_reason() {
            return Ok(Outcome::Skipped(r));
        }
        if self.frozen(pid, stat.start_time) {
            return Ok(Outcome::Skipped(SkipReason::Frozen));
        }
        let splitting = job.calls.iter().filter(|c| c.may_split()).count();
        // The count the budget check stands on, and when it was read.
        let counted = if splitting > 0 {
            let limit = max_map_count()?;
            // The count after the last batch stands while it is fresh and,
            // with room for what the process may have mapped since, well
            // inside the budget; else it is read again.
            let cached = vma_counts::known(pid, stat.start_time).filter(|&(n, at)| {
                at.elapsed() < VMA_COUNT_FRESH
                    && map_budget(n + VMA_COUNT_SLACK, splitting, limit, cfg.max_map_fraction)
                        .is_ok()
            });
            let count = match cached.map_or_else(|| vma_counts::count(pid, stat.start_time), Ok) {
                Ok(c) => c,
                Err(LinuxError::Gone(_) | LinuxError::NoSuchProcess(_)) => {
                    return gone(false, vec![]);
                }
                Err(e) => return Err(e.into()),
            };
            if let Err(r) = map_budget(count.0, splitting, limit, cfg.max_map_fraction) {
                return Ok(Outcome::Skipped(r));
            }
            // Until this batch's bound is recorded, its splits are not in
            // any count: a batch that ends early leaves none.
            vma_counts::forget(pid);
            Some(count)
        } else {
            None
        };
        let vmas_before = counted.map(|(n, _)| n);

        // Choose a thread, check it, seize it; a thread that exits in
        // between is replaced (three tries).
        let mut tries = 0;
        let choice = loop {
            let choice = match job.tid {
                Some(tid) => {
                    if !std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists() {
                        return Err(InjectError::NoSuchThread { pid, tid });
                    }
                    rank_thread(pid, tid).unwrap_or(ThreadChoice {
                        tid,
                        rank: ThreadRank::Unknown,
                        syscall: None,
                    })
                }
                None => match choose(pid, &stat, cfg.allow_eintr_risk, &mut self.prone) {
                    Ok(c) => c,
                    Err(NoChoice::Gone) => return gone(false, vec![]),
                    Err(NoChoice::Skip(r)) => return Ok(Outcome::Skipped(r)),
                },
            };
            let status = ThreadStatus::read(pid, choice.tid)?;
            if let Some(st) = status {
                if st.tgid != pid {
                    return Err(InjectError::NotAProcess {
                        tid: pid,
                        tgid: st.tgid,
                    });
                }
                if let Some(r) = st.skip_reason() {
                    return Ok(Outcome::Skipped(r));
                }
            }
            let seized = match status {
                Some(_) => ptrace::seize(choice.tid),
                None => Err(io::Error::from_raw_os_error(libc_errno::ESRCH)),
            };
            match seized {
                Ok(()) => break choice,
                Err(e) if e.raw_os_error() == Some(libc_errno::ESRCH) => {
                    let alive =
                        ProcStat::of_process(pid)?.is_some_and(|s| s.skip_reason().is_none());
                    if !alive {
                        return gone(false, vec![]);
                    }
                    tries += 1;
                    if tries >= 3 || job.tid.is_some() {
                        return Ok(Outcome::Skipped(SkipReason::NoStoppableThread));
                    }
                }
                Err(e) if e.raw_os_error() == Some(libc_errno::EPERM) => {
                    // The kernel refuses to attach to a thread that is
                    // exiting: the process is going, which is no error.
                    let path = format!("/proc/{pid}/task/{}/stat", choice.tid);
                    match ProcStat::read(pid, &path)? {
                        None => return gone(false, vec![]),
                        Some(st) if st.exiting || matches!(st.state, 'Z' | 'X' | 'x') => {
                            return Ok(Outcome::Skipped(SkipReason::Zombie));
                        }
                        Some(_) => {}
                    }
                    // Traced (or filtered) since we looked?
                    return match ThreadStatus::read(pid, choice.tid)? {
                        None => gone(false, vec![]),
                        Some(st) if st.skip_reason().is_some() => {
                            Ok(Outcome::Skipped(st.skip_reason().expect("checked")))
                        }
                        Some(_) => Err(LinuxError::from_process_op(
                            pid,
                            e,
                            "attaching with PTRACE_SEIZE",
                            Capability::SysPtrace,
                            WHY_INJECT,
                        )
                        .into()),
                    };
                }
                Err(e) => return Err(LinuxError::io(format!("PTRACE_SEIZE of {pid}"), e).into()),
            }
        };
        let attached_at = Instant::now();
        let tid = choice.tid;
        let mut s = Session {
            pid,
            tid,
            reap_exit: !(tid == pid && stat.ppid == crate::own_pid()),
            saved: None,
            mask: 0,
            gadgets: None,
            rescue: None,
            blocked: false,
            delivered: 0,
            deferred_stops: 0,
            last: Stop::Event { sig: 0, event: 0 },
        };
        checkpoint();

        // Stop it.
        let held = ptrace::interrupt(tid)
            .map_err(os("PTRACE_INTERRUPT"))
            .and_then(|()| s.hold(Instant::now() + cfg.stop_timeout));
        let mut by_interrupt = matches!(
            s.last,
            Stop::Event {
                sig: libc::SIGTRAP,
                ..
            }
        ) && s.delivered == 0;
        match held {
            Ok(Held::Stopped) => {}
            Ok(Held::Timeout) => {
                // Seized but not stopped: only the exit of this thread can
                // detach it now.
                *exiting = true;
                return Ok(Outcome::Skipped(SkipReason::StopTimeout { tid }));
            }
            Err(e) => return self.fail(&mut s, e, vec![], exiting),
        }
        checkpoint();
        // The call a sleep this stop cut short continues with
        // (`restart_syscall` from now on), whatever happens below: released
        // by a skip, the thread sleeps on in `restart_syscall`, and the next
        // attach must know what that restarts (`Session::prepare`), or it
        // would leave the thread alone (`SkipReason::UnknownRestart`).
        if let Ok(regs) = ptrace::get_regs(tid) {
            restart_origin(tid, stat.start_time, &regs);
        }
        // The identity once more, now that the thread is stopped: an execve
        // since the caller looked would make these calls land in another
        // program (perhaps a setuid one).
        if let Some(want) = job.image {
            let now = procfs::process::Process::new(pid as i32)
                .and_then(|p| p.stat())
                .ok()
                .filter(|st| st.starttime == stat.start_time)
                .map(|st| crate::discover::image_id(pid, &st));
            if now != Some(want) {
                return match s.release() {
                    Ok(()) => Ok(Outcome::Skipped(SkipReason::ImageChanged)),
                    Err(e) => self.fail(&mut s, os("PTRACE_DETACH")(e), vec![], exiting),
                };
            }
        }

        // Prepare, and block every signal; a signal that comes before the
        // block is delivered and the thread stopped again.
        let mut starts = 0;
        loop {
            match s.prepare(self, stat.start_time) {
                Ok(()) => {}
                Err(Prep::Skip(reason)) => {
                    return match s.release() {
                        Ok(()) => Ok(Outcome::Skipped(reason)),
                        Err(e) => self.fail(&mut s, os("PTRACE_DETACH")(e), vec![], exiting),
                    };
                }
                Err(Prep::Step(e)) => return self.fail(&mut s, e, vec![], exiting),
            }
            let scratch = s.rescue.as_ref().expect("installed").scratch;
            let block = [SIG_BLOCK, scratch + SCRATCH_ALL_SIGNALS, 0, 8, 0, 0];
            match s.call(NR_RT_SIGPROCMASK, block, &[], cfg) {
                Ok(0) => {
                    s.blocked = true;
                    break;
                }
                Ok(r) => {
                    let what = format!("rt_sigprocmask(SIG_BLOCK) returned {r}");
                    return self.fail(&mut s, StepError::Unexpected(what), vec![], exiting);
                }
                Err(StepError::SignalFirst(sig)) if starts < MAX_SIGNAL_RESTARTS => {
                    starts += 1;
                    by_interrupt = false;
                    match s.deliver_and_hold(sig, cfg) {
                        Ok(Held::Stopped) => continue,
                        Ok(Held::Timeout) => {
                            *exiting = true;
                            return Ok(Outcome::Skipped(SkipReason::StopTimeout { tid }));
                        }
                        Err(e) => return self.fail(&mut s, e, vec![], exiting),
                    }
                }
                Err(StepError::SignalFirst(_)) => {
                    return match s.release() {
                        Ok(()) => Ok(Outcome::Skipped(SkipReason::SignalStorm)),
                        Err(e) => self.fail(&mut s, os("PTRACE_DETACH")(e), vec![], exiting),
                    };
                }
                Err(StepError::Aborted) => {
                    return match s.release() {
                        Ok(()) => Ok(Outcome::Skipped(SkipReason::SyscallTimeout {
                            completed: vec![],
                        })),
                        Err(e) => self.fail(&mut s, os("PTRACE_DETACH")(e), vec![], exiting),
                    };
                }
                Err(e) => return self.fail(&mut s, e, vec![], exiting),
            }
        }
        let saved = s.saved.expect("prepared");
        let scratch = s.rescue.as_ref().expect("installed").scratch;

        let mut results = Vec::with_capacity(job.calls.len());
        let cut = cut_point(&job.calls);
        for (i, call) in job.calls.iter().enumerate() {
            let (number, args, bytes) = match call.encode(&results, scratch) {
                Ok(e) => e,
                Err(r) => {
                    results.push(r);
                    continue;
                }
            };
            let step = if cut == Some(i) {
                Err(StepError::Aborted)
            } else {
                s.call(number, args, &bytes, cfg)
            };
            match step {
                Ok(r) => results.push(r),
                Err(StepError::Aborted) => {
                    return match s.release() {
                        Ok(()) => Ok(Outcome::Skipped(SkipReason::SyscallTimeout {
                            completed: results,
                        })),
                        Err(e) => self.fail(&mut s, os("PTRACE_DETACH")(e), results, exiting),
                    };
                }
                Err(e) => return self.fail(&mut s, e, results, exiting),
            }
        }
        // The thread's own mask back (the exit stop of this call is the last
        // moment our registers are in the thread).
        let unblock = [SIG_SETMASK, scratch + SCRATCH_OWN_MASK, 0, 8, 0, 0];
        match s.call(NR_RT_SIGPROCMASK, unblock, &[], cfg) {
            Ok(0) => s.blocked = false,
            Ok(r) => {
                let what = format!("rt_sigprocmask(SIG_SETMASK) returned {r}");
                return self.fail(&mut s, StepError::Unexpected(what), results, exiting);
            }
            Err(e) => return self.fail(&mut s, e, results, exiting),
        }
        match s.finish(cfg) {
            Ok(true) => {}
            // It did not stop again: leaving it (this tracer exits) lets it
            // run into its rescue frame, which restores it.
            Ok(false) => *exiting = true,
            Err(e) => return self.fail(&mut s, e, results, exiting),
        }
        let attached_for = attached_at.elapsed();
        // Counted now, or bounded (a madvise splits at most two VMAs) and
        // as fresh as the count the bound grew from: a chain of bounds
        // never stands longer than VMA_COUNT_FRESH after a real count.
        let vmas_after = match counted {
            Some(_) if cfg.count_vmas_after => vma_counts::count(pid, stat.start_time).ok(),
            Some(from) => {
                vma_counts::grown(pid, stat.start_time, from, 2 * splitting as u64);
                None
            }
            None => None,
        }
        .map(|(n, _)| n);
        let interrupted_syscall = ((saved.orig_rax as i64) >= 0).then_some(saved.orig_rax as i64);
        if let Some(nr) = interrupted_syscall
            && EINTR_AFTER_STOP.contains(&nr)
        {
            self.prone.insert(tid, (stat.start_time, nr));
        }
        if self.prone.len() > 65_536 {
            self.prone.clear();
        }
        Ok(Outcome::Done(Injection {
            results,
            tid,
            interrupted_syscall,
            // Ours only if our interrupt stopped it: a group-stop or a
            // signal would have caused the EINTR anyway.
            app_sees_eintr: by_interrupt
                && interrupted_syscall.is_some()
                && saved.rax as i64 == -(libc::EINTR as i64),
            signals_redelivered: s.delivered + s.deferred_stops,
            vmas_before,
            vmas_after,
            attached_for,
        }))
    }

    /// Ends an attach that went wrong: a vanished thread is `Gone`; anything
    /// else releases the thread (see [`Session::release`]), then reports
    /// the error.
    fn fail(
        &mut self,
        s: &mut Session,
        e: StepError,
        completed: Vec<i64>,
        exiting: &mut bool,
    ) -> Result<Outcome, InjectError> {
        let pid = s.pid;
        let what = match e {
            StepError::Gone => {
                s.settle_gone();
                return Ok(Outcome::Gone(Gone {
                    attached: true,
                    completed,
                }));
            }
            StepError::Aborted => "the call was abandoned".to_string(),
            StepError::SignalFirst(sig) => format!("signal {sig} before the block"),
            StepError::Unexpected(w) => w,
            StepError::Os(op, err) => format!("{op} failed: {err}"),
        };
        if let Err(err) = s.release() {
            if err.raw_os_error() == Some(libc_errno::ESRCH) && !task_exists(s.pid, s.tid) {
                s.settle_gone();
                return Ok(Outcome::Gone(Gone {
                    attached: true,
                    completed,
                }));
            }
            // Could not release it (not in a stop): exiting this thread
            // detaches it, and its rescue frame restores it.
            *exiting = true;
        }
        Err(InjectError::Unexpected { pid, what })
    }
}

/// Whether thread `tid` of `pid` still exists.
fn task_exists(pid: u32, tid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}/task/{tid}")).exists()
}
