//! One attached thread, step by step: hold it stopped, prepare it, run
//! each call, and either finish (restore and detach) or release it.
//!
//! A call is stepped with `PTRACE_SYSCALL`: set the registers (`rip` on
//! the `syscall; ret` gadget, `rsp` on the rescue frame, the number and
//! arguments, `orig_rax = -1` so the kernel's restart logic never rewinds
//! our frame), then the entry stop, then the exit stop, whose `rax` is the
//! result. A `-ERESTART*` result (a `SIGSTOP` got through) runs the call
//! again; the calls are idempotent. Waits poll `waitpid(WNOHANG)` with a
//! growing pause ([`wait_stop`]), so every wait has a bound: a blocking
//! wait could not be interrupted without a signal handler in the daemon.
//!
//! Invariants:
//! - Between two steps the thread is in one of two states only: its own
//!   registers (before the frame exists, or after they are put back), or
//!   on the gadget with `rsp` on the frame. Released in either, by us or
//!   by the kernel when the tracer dies, it resumes correctly with no help
//!   ([`Session::release`] points a thread with a pending call straight at
//!   the `rt_sigreturn`, so the call never runs).
//! - A signal is never held: one that arrives before every signal is
//!   blocked is delivered at once in the thread's own context
//!   ([`Session::deliver_and_hold`]); after the block only `SIGSTOP` can
//!   arrive, and it is sent again just before the detach.
//! - Every step of interest is a [`checkpoint`], where the tests kill the
//!   tracer.

use super::calls::is_restart;
use super::facts::blocked_mask;
use super::fault::checkpoint;
use super::gadgets::Gadgets;
use super::outcome::{InjectConfig, SkipReason};
use super::remote::write_remote;
use super::rescue::Rescue;
use super::tracer::Tracer;
use crate::error::libc_errno;
use crate::ptrace::{self, Regs, Stop};
use std::io;
use std::time::{Duration, Instant};

/// x86-64 user code segment selector (`__USER_CS`); a compat (32-bit) task
/// runs with `__USER32_CS` = 0x23.
const USER_CS: u64 = 0x33;

/// Bounds on the stepping loop of one call.
const MAX_STOPS_PER_CALL: u32 = 100_000;
const MAX_RESTARTS_PER_CALL: u32 = 64;

/// Why stepping a call stopped early.
pub(super) enum StepError {
    /// The thread (and so, its process or image) is gone.
    Gone,
    /// Our timeout interrupt found the call not started.
    Aborted,
    /// A signal-delivery stop came before every signal was blocked.
    SignalFirst(i32),
    /// The thread stopped where it should not have.
    Unexpected(String),
    /// A ptrace or wait error.
    Os(&'static str, io::Error),
}

pub(super) fn os(what: &'static str) -> impl FnOnce(io::Error) -> StepError {
    move |e| {
        if e.raw_os_error() == Some(libc_errno::ESRCH) {
            StepError::Gone
        } else {
            StepError::Os(what, e)
        }
    }
}

/// Waits for the next report of `tid`, polling: yielding for the first
/// 200 µs (a blocked thread stops in 6–8 µs, a running one in 35–38 µs,
/// measured), then sleeping with a growing pause. `None` when
/// `deadline` passed. (A blocking `waitpid` could not be bounded without a
/// signal handler in the daemon.)
fn wait_stop(tid: u32, reap_exit: bool, deadline: Option<Instant>) -> io::Result<Option<Stop>> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(20);
    loop {
        if let Some(s) = ptrace::wait_nohang(tid, reap_exit)? {
            return Ok(Some(s));
        }
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Ok(None);
        }
        if now - start < Duration::from_micros(200) {
            std::thread::yield_now();
        } else {
            let mut p = pause;
            if let Some(d) = deadline {
                p = p.min(d - now);
            }
            std::thread::sleep(p);
            // At most 1 ms late for a slow stop (a thread waiting for a CPU
            // on a busy machine), and at most 1000 polls per second during a
            // long call.
            pause = (pause * 2).min(Duration::from_millis(1));
        }
    }
}

/// One attached thread.
pub(super) struct Session {
    pub(super) pid: u32,
    pub(super) tid: u32,
    /// Reap the thread's exit report (false only for the leader of our own
    /// child, whose exit status belongs to us as its parent: reaping it
    /// here would steal it from the code that waits for the child).
    pub(super) reap_exit: bool,
    /// The registers at the stop, put back at the end.
    pub(super) saved: Option<Regs>,
    /// The thread's own signal mask, put back by the last call.
    pub(super) mask: u64,
    /// The code the calls run on.
    pub(super) gadgets: Option<Gadgets>,
    /// The rescue frame in the thread's stack, once written.
    pub(super) rescue: Option<Rescue>,
    /// Whether every blockable signal is blocked in the thread now.
    pub(super) blocked: bool,
    /// Signals that arrived before the block, delivered at once (the
    /// injection then starts again from the new state).
    pub(super) delivered: usize,
    /// `SIGSTOP`s (which cannot be blocked) that arrived after the block:
    /// sent again just before the detach.
    pub(super) deferred_stops: usize,
    /// The stop the thread is in.
    pub(super) last: Stop,
}

/// How the wait for the first stop ended.
pub(super) enum Held {
    /// Stopped (an interrupt stop or a group-stop).
    Stopped,
    /// It did not stop in time.
    Timeout,
}

/// `rt_sigprocmask` (x86-64 number 14) `how` values.
pub(super) const NR_RT_SIGPROCMASK: i64 = 14;
pub(super) const SIG_BLOCK: u64 = 0;
pub(super) const SIG_SETMASK: u64 = 2;
/// Times a batch starts over because a signal came before the block.
pub(super) const MAX_SIGNAL_RESTARTS: u32 = 16;

impl Session {
    fn wait(&self, deadline: Option<Instant>) -> Result<Option<Stop>, StepError> {
        wait_stop(self.tid, self.reap_exit, deadline).map_err(|e| {
            if e.raw_os_error() == Some(libc::ECHILD) {
                StepError::Gone
            } else {
                StepError::Os("waitpid", e)
            }
        })
    }

    /// After an ESRCH or an exit report: makes sure the exit is reaped (so
    /// the target's parent sees it), bounded.
    pub(super) fn settle_gone(&self) {
        let deadline = Instant::now() + Duration::from_secs(1);
        while let Ok(Some(stop)) = wait_stop(self.tid, self.reap_exit, Some(deadline)) {
            if stop.is_exit() {
                return;
            }
        }
    }

    /// Waits for the interrupt stop (or a group-stop). A signal-delivery
    /// stop that comes first is let through at once, with its own siginfo
    /// untouched, and the interrupt is asked for again.
    pub(super) fn hold(&mut self, deadline: Instant) -> Result<Held, StepError> {
        loop {
            let Some(stop) = self.wait(Some(deadline))? else {
                return Ok(Held::Timeout);
            };
            if stop.is_exit() {
                return Err(StepError::Gone);
            }
            self.last = stop;
            match stop {
                Stop::Signal(sig) => {
                    ptrace::cont(self.tid, sig).map_err(os("PTRACE_CONT"))?;
                    self.delivered += 1;
                    ptrace::interrupt(self.tid).map_err(os("PTRACE_INTERRUPT"))?;
                }
                Stop::Event { .. } => return Ok(Held::Stopped),
                // Not resumed with PTRACE_SYSCALL yet: cannot happen; go on.
                Stop::Syscall => {
                    ptrace::cont(self.tid, 0).map_err(os("PTRACE_CONT"))?;
                    ptrace::interrupt(self.tid).map_err(os("PTRACE_INTERRUPT"))?;
                }
                Stop::Exited(_) | Stop::Killed(_) => unreachable!("handled above"),
            }
        }
    }

    /// Everything before the first call, with the thread stopped: its
    /// registers, mask and FPU state, the code to run on, the rescue frame.
    pub(super) fn prepare(&mut self, tracer: &mut Tracer, start_time: u64) -> Result<(), Prep> {
        let tid = self.tid;
        let saved = ptrace::get_regs(tid).map_err(|e| Prep::Step(os("PTRACE_GETREGS")(e)))?;
        self.saved = Some(saved);
        // Seccomp once more, now that the thread is stopped: a filter
        // installed since `status` was read (TSYNC from another thread)
        // would see our calls.
        let filtered = ptrace::has_seccomp_filter(tid)
            .map_err(|e| Prep::Step(os("PTRACE_SECCOMP_GET_FILTER")(e)))?;
        if saved.cs != USER_CS {
            return Err(Prep::Skip(SkipReason::Not64Bit));
        }
        if filtered == Some(true) {
            return Err(Prep::Skip(SkipReason::Seccomp { mode: 2 }));
        }
        if in_rseq_critical_section(self.pid, tid, saved.rip) {
            return Err(Prep::Skip(SkipReason::RseqCriticalSection));
        }
        let Some(g) = tracer.gadgets(self.pid, start_time) else {
            return Err(Prep::Skip(SkipReason::NoSafeReturn));
        };
        self.gadgets = Some(g);
        let Some(mask) = blocked_mask(self.pid, tid) else {
            return Err(Prep::Step(StepError::Gone));
        };
        self.mask = mask;
        // Without XSAVE the kernel keeps (and its signal frames hold) the
        // legacy 512-byte FXSAVE area instead.
        let xstate = match ptrace::get_xstate(tid) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => ptrace::get_fxstate(tid),
            r => r,
        }
        .map_err(|e| Prep::Step(os("PTRACE_GETREGSET")(e)))?;
        let origin = super::tracer::restart_origin(tid, start_time, &saved);
        if origin.is_none() && restarting_unknown(&saved) {
            // Nothing written yet: released as it is, the kernel restarts
            // the sleep with the time it has left.
            return Err(Prep::Skip(SkipReason::UnknownRestart { tid }));
        }
        checkpoint();
        match Rescue::install(self.pid, &saved, origin, mask, &xstate, &g) {
            Ok(Some(r)) => self.rescue = Some(r),
            Ok(None) => return Err(Prep::Skip(SkipReason::NoScratch)),
            Err(reason) => return Err(Prep::Skip(reason)),
        }
        checkpoint();
        Ok(())
    }

    /// Runs syscall `number` with `args` from the `syscall; ret` gadget,
    /// with `rsp` on the rescue frame; `bytes` go to the scratch memory
    /// first. Resumes with `PTRACE_SYSCALL`: entry stop, exit stop, result
    /// in `rax`; the thread is left in the exit stop.
    pub(super) fn call(
        &mut self,
        number: i64,
        args: [u64; 6],
        bytes: &[u8],
        config: &InjectConfig,
    ) -> Result<i64, StepError> {
        let saved = self.saved.expect("registers saved before a call");
        let g = self.gadgets.expect("gadgets found before a call");
        let rescue = self.rescue.as_ref().expect("rescue frame before a call");
        if !bytes.is_empty() {
            write_remote(self.pid, rescue.scratch, bytes).map_err(os("process_vm_writev"))?;
        }
        let mut frame = saved;
        frame.rip = g.call;
        frame.rsp = rescue.base;
        frame.rax = number as u64;
        // -1: the kernel's restart logic must never rewind our frame.
        frame.orig_rax = u64::MAX;
        frame.rdi = args[0];
        frame.rsi = args[1];
        frame.rdx = args[2];
        frame.r10 = args[3];
        frame.r8 = args[4];
        frame.r9 = args[5];
        ptrace::set_regs(self.tid, &frame).map_err(os("PTRACE_SETREGS"))?;
        checkpoint();
        let mut entered = false;
        let mut restarts = 0;
        let mut deadline = Some(Instant::now() + config.syscall_timeout);
        let mut interrupted = false;
        let mut resume = true;
        for _ in 0..MAX_STOPS_PER_CALL {
            if resume {
                ptrace::syscall(self.tid, 0).map_err(os("PTRACE_SYSCALL"))?;
            }
            resume = true;
            let stop = match self.wait(deadline)? {
                Some(s) => s,
                None => {
                    // The call has not come back in time: ask for a stop. If
                    // the call never started we get it before the `syscall`
                    // and can abandon cleanly; if it is running, its exit
                    // stop comes first. Either way, wait without a bound now.
                    ptrace::interrupt(self.tid).map_err(os("PTRACE_INTERRUPT"))?;
                    interrupted = true;
                    deadline = None;
                    resume = false;
                    continue;
                }
            };
            if stop.is_exit() {
                return Err(StepError::Gone);
            }
            self.last = stop;
            match stop {
                Stop::Syscall if !entered => {
                    entered = true;
                    checkpoint();
                }
                Stop::Syscall => {
                    let r = ptrace::get_regs(self.tid)
                        .map_err(os("PTRACE_GETREGS"))?
                        .rax as i64;
                    checkpoint();
                    if is_restart(r) && restarts < MAX_RESTARTS_PER_CALL {
                        // Interrupted (by SIGSTOP, the only signal that gets
                        // through the block): run it again; the calls are
                        // idempotent.
                        restarts += 1;
                        entered = false;
                        ptrace::set_regs(self.tid, &frame).map_err(os("PTRACE_SETREGS"))?;
                        continue;
                    }
                    return Ok(r);
                }
                Stop::Signal(sig) if !self.blocked => return Err(StepError::SignalFirst(sig)),
                Stop::Signal(libc::SIGSTOP) => {
                    // Not delivered now (it would stop the thread with our
                    // registers in it): sent again before the detach.
                    self.deferred_stops += 1;
                }
                Stop::Signal(sig) => {
                    return Err(StepError::Unexpected(format!(
                        "signal {sig} got through the block at {:#x}",
                        ptrace::get_regs(self.tid).map_or(0, |r| r.rip)
                    )));
                }
                Stop::Event { .. } if interrupted && !entered => return Err(StepError::Aborted),
                // A group-stop (another thread took a stop signal): go on;
                // the thread rejoins the stop when detached.
                Stop::Event { .. } => {}
                Stop::Exited(_) | Stop::Killed(_) => unreachable!("handled above"),
            }
        }
        Err(StepError::Unexpected(format!(
            "more than {MAX_STOPS_PER_CALL} stops during one call"
        )))
    }

    /// A signal came before the block: put the thread back as it was,
    /// deliver the signal in its own context (siginfo untouched), and stop
    /// it again for a fresh start.
    ///
    /// Nothing else happens between seeing the stop and passing the signal
    /// on: once a tracer has waited for a signal-delivery stop the kernel
    /// holds the signal for it alone, so a tracer that died in between
    /// would take the signal with it. (The stack bytes under the frame are
    /// not put back: the handler's own frame goes there now.)
    pub(super) fn deliver_and_hold(
        &mut self,
        sig: i32,
        config: &InjectConfig,
    ) -> Result<Held, StepError> {
        let saved = self.saved.take().expect("registers saved");
        ptrace::set_regs(self.tid, &saved).map_err(os("PTRACE_SETREGS"))?;
        ptrace::cont(self.tid, sig).map_err(os("PTRACE_CONT"))?;
        self.rescue = None;
        self.delivered += 1;
        checkpoint();
        ptrace::interrupt(self.tid).map_err(os("PTRACE_INTERRUPT"))?;
        self.hold(Instant::now() + config.stop_timeout)
    }

    /// The normal end, from the exit stop of the last call (which put the
    /// thread's mask back): one more stop, this time inside the kernel's
    /// signal code (an interrupt stop), so that once the saved registers
    /// are back the kernel's own restart logic resumes the interrupted
    /// syscall; the stack bytes go back; detach. Pending signals are then
    /// delivered by the kernel, each once, with its siginfo. `Ok(false)`
    /// if the thread did not stop in time (it is left to its rescue frame).
    pub(super) fn finish(&mut self, config: &InjectConfig) -> Result<bool, StepError> {
        ptrace::interrupt(self.tid).map_err(os("PTRACE_INTERRUPT"))?;
        ptrace::cont(self.tid, 0).map_err(os("PTRACE_CONT"))?;
        checkpoint();
        let deadline = Instant::now() + config.stop_timeout.max(Duration::from_secs(1));
        loop {
            let Some(stop) = self.wait(Some(deadline))? else {
                return Ok(false);
            };
            if stop.is_exit() {
                return Err(StepError::Gone);
            }
            self.last = stop;
            match stop {
                Stop::Event { .. } => break,
                // The interrupt trap is taken before any signal is
                // dequeued, so this is not expected; deliver it at once in
                // the thread's own context (see `deliver_and_hold`).
                Stop::Signal(sig) => {
                    let saved = self.saved.expect("registers saved");
                    ptrace::set_regs(self.tid, &saved).map_err(os("PTRACE_SETREGS"))?;
                    ptrace::detach(self.tid, sig).map_err(os("PTRACE_DETACH"))?;
                    self.rescue = None;
                    return Ok(true);
                }
                Stop::Syscall => {
                    ptrace::cont(self.tid, 0).map_err(os("PTRACE_CONT"))?;
                }
                Stop::Exited(_) | Stop::Killed(_) => unreachable!("handled above"),
            }
        }
        checkpoint();
        let saved = self.saved.expect("registers saved");
        ptrace::set_regs(self.tid, &saved).map_err(os("PTRACE_SETREGS"))?;
        checkpoint();
        if let Some(r) = self.rescue.take() {
            write_remote(self.pid, r.base, &r.old).map_err(os("process_vm_writev"))?;
        }
        checkpoint();
        for _ in 0..self.deferred_stops {
            ptrace::tgkill(self.pid, self.tid, libc::SIGSTOP).map_err(os("tgkill"))?;
        }
        ptrace::detach(self.tid, 0).map_err(os("PTRACE_DETACH"))?;
        Ok(true)
    }

    /// Lets the thread go from whatever stop it is in. Before the rescue
    /// frame exists, its registers were never changed (or are put back)
    /// and it is simply detached. After, it is pointed at the frame's
    /// `rt_sigreturn` (no pending call runs) and detached: its first act is
    /// to restore its registers, mask and FPU state itself. A signal in
    /// whose delivery stop it sits is delivered (its handler runs first and
    /// returns into the `rt_sigreturn`).
    pub(super) fn release(&mut self) -> io::Result<()> {
        let sig = match self.last {
            Stop::Signal(sig) => sig,
            _ => 0,
        };
        match (&self.rescue, &self.saved, &self.gadgets) {
            (Some(r), Some(saved), Some(g)) => {
                ptrace::set_regs(self.tid, &r.sigreturn_regs(saved, g))?;
            }
            (None, Some(saved), _) => ptrace::set_regs(self.tid, saved)?,
            _ => {}
        }
        for _ in 0..self.deferred_stops {
            ptrace::tgkill(self.pid, self.tid, libc::SIGSTOP)?;
        }
        ptrace::detach(self.tid, sig)
    }
}

/// Why preparing a stopped thread did not succeed.
/// Whether stopped thread `tid` of `pid` is inside a restartable-sequence
/// critical section at `ip`: its `struct rseq` (registered with the
/// kernel) points at a `struct rseq_cs` whose `[start_ip, start_ip +
/// post_commit_offset)` holds `ip` (`in_rseq_cs` in the kernel's
/// `kernel/rseq.c`). Layouts from `<linux/rseq.h>`: `rseq_cs` is the u64 at
/// offset 8 of `struct rseq`; `struct rseq_cs` is version, flags (u32
/// each), then start_ip, post_commit_offset, abort_ip (u64 each).
///
/// A thread whose registration or section cannot be read counts as inside
/// one: leaving it alone costs a retry, the other way could break its
/// section.
fn in_rseq_critical_section(pid: u32, tid: u32, ip: u64) -> bool {
    let area = match ptrace::rseq_area(tid) {
        Ok(None) => return false,
        Ok(Some(a)) => a,
        Err(_) => return true,
    };
    let mut cs_ptr = [0u8; 8];
    if super::remote::read_remote(pid, area + 8, &mut cs_ptr).is_err() {
        return true;
    }
    let cs = u64::from_ne_bytes(cs_ptr);
    if cs == 0 {
        return false;
    }
    let mut desc = [0u8; 32];
    if super::remote::read_remote(pid, cs, &mut desc).is_err() {
        return true;
    }
    let word = |at: usize| u64::from_ne_bytes(desc[at..at + 8].try_into().expect("8 bytes"));
    let (start, post_commit) = (word(8), word(16));
    ip.wrapping_sub(start) < post_commit
}

pub(super) enum Prep {
    Skip(SkipReason),
    Step(StepError),
}

/// Whether a thread stopped with `regs` was in `restart_syscall` and its
/// sleep was cut short by the stop (`-ERESTART_RESTARTBLOCK`): the kernel
/// would continue it from the time it has left, kept in the thread's
/// restart block, which the rescue frame's `rt_sigreturn` resets (the
/// sleep would then return EINTR).
fn restarting_unknown(regs: &Regs) -> bool {
    regs.orig_rax as i64 == super::calls::nr::RESTART_SYSCALL
        && -(regs.rax as i64) == super::calls::ERESTART_RESTARTBLOCK
}
