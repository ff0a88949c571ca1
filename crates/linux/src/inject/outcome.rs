//! What an injection is told and what it reports: the configuration
//! ([`InjectConfig`]), the outcome per process ([`Outcome`]: done,
//! skipped on purpose, or gone), the reasons for leaving a process alone
//! ([`SkipReason`]), the errors ([`InjectError`]) and the injector's
//! counters ([`InjectStats`]).
//!
//! The split between the three is the module's contract with its callers:
//! a process that exits at any point is [`Outcome::Gone`], never an
//! error; a process that could be harmed by the attach is
//! [`Outcome::Skipped`] with the reason, and nothing ran in it; only a
//! failure of pagesift itself (a missing capability, an invalid call, a
//! tracer that did not answer in time) is an [`InjectError`].

use crate::error::LinuxError;
use std::fmt;
use std::time::Duration;

/// How an [`Injector`](super::Injector) behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InjectConfig {
    /// How long to wait for the chosen thread to stop after
    /// `PTRACE_INTERRUPT` (a blocked thread stops in 6–8 µs, a running one
    /// in 35–38 µs, measured). Past it the process is skipped
    /// ([`SkipReason::StopTimeout`]).
    pub stop_timeout: Duration,
    /// How long one injected call may run before the tracer interrupts the
    /// thread (`prctl(PR_SET_MEMORY_MERGE, 0)` on 128 MiB took 60–69 ms,
    /// measured; unmerging gigabytes takes seconds). A call that has not
    /// started by then is abandoned; one that has is waited for.
    pub syscall_timeout: Duration,
    /// Refuse a batch of `madvise` calls if `VMAs + 2 × calls` could exceed
    /// this fraction of `vm.max_map_count` (0.5: stop at 50 %).
    pub max_map_fraction: f64,
    /// Stop a thread even if it is in a call that returns EINTR to the
    /// application after any stop (`epoll_wait`, `semop`, `sigtimedwait`,
    /// ...) when no other thread can be used. Off by default: such processes
    /// are skipped ([`SkipReason::EintrRisk`]).
    pub allow_eintr_risk: bool,
    /// Count the process's VMAs again after a batch with `madvise`
    /// ([`Injection::vmas_after`]). Off, the next batch's budget check
    /// stands on the bound `VMAs before + 2 × calls` while the count it
    /// grew from is fresh, and `vmas_after` is `None`. A QEMU whose RAM
    /// marks have split its maps has hundreds of lines to format: the
    /// counts before and after batches were 5.3 % of the daemon's CPU
    /// samples in a quick vm-boot run (perf, 2026-12-05), and its
    /// injection thread took 0.16 CPU-s without the count after, 0.18
    /// with it (one run each). The daemon turns it off; on by default.
    pub count_vmas_after: bool,
}

impl Default for InjectConfig {
    fn default() -> Self {
        InjectConfig {
            stop_timeout: Duration::from_millis(500),
            syscall_timeout: Duration::from_secs(10),
            max_map_fraction: 0.5,
            allow_eintr_risk: false,
            count_vmas_after: true,
        }
    }
}

/// What happened to one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every call ran.
    Done(Injection),
    /// Nothing ran, on purpose; the process was not harmed.
    Skipped(SkipReason),
    /// The process exited (before the attach or during it).
    Gone(Gone),
}

impl Outcome {
    /// The injection, if every call ran.
    pub fn done(&self) -> Option<&Injection> {
        match self {
            Outcome::Done(i) => Some(i),
            _ => None,
        }
    }
}

/// A completed injection.
/// [`Default`] is the injection of an empty batch: nothing ran, no thread
/// was stopped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injection {
    /// Each call's return value as the kernel gave it: `>= 0` on success,
    /// `-errno` on failure (e.g. `-12` ENOMEM for a range with a hole).
    pub results: Vec<i64>,
    /// The thread that ran them.
    pub tid: u32,
    /// The syscall the thread was in when it stopped (`orig_rax`), if any.
    pub interrupted_syscall: Option<i64>,
    /// Whether that syscall returns EINTR to the application because of our
    /// stop (it had returned -EINTR when our interrupt stopped the thread,
    /// as `epoll_wait` does; not counted when a group-stop or a signal
    /// stopped it first).
    pub app_sees_eintr: bool,
    /// Signals that arrived during the injection and were delivered again
    /// at the detach.
    pub signals_redelivered: usize,
    /// The number of VMAs before the batch (counted only for batches with
    /// `madvise`).
    pub vmas_before: Option<u64>,
    /// The number of VMAs after it (counted only if
    /// [`InjectConfig::count_vmas_after`]).
    pub vmas_after: Option<u64>,
    /// From `PTRACE_SEIZE` to `PTRACE_DETACH`.
    pub attached_for: Duration,
}

impl Injection {
    /// VMAs added by the batch (negative when `MADV_UNMERGEABLE` let split
    /// VMAs merge back). Other threads of the target may map or unmap
    /// meanwhile, so this is the batch's effect plus any such noise.
    pub fn vma_delta(&self) -> Option<i64> {
        Some(self.vmas_after? as i64 - self.vmas_before? as i64)
    }

    /// Whether every call returned `>= 0`.
    pub fn all_ok(&self) -> bool {
        self.results.iter().all(|&r| r >= 0)
    }
}

/// A process that exited.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gone {
    /// Whether it exited while attached (mid-injection).
    pub attached: bool,
    /// Results of the calls that completed before it went.
    pub completed: Vec<i64>,
}

/// Why a process was left alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// It is pagesift's own process.
    OwnProcess,
    /// A kernel thread: no user memory.
    KernelThread,
    /// A zombie: its memory is gone.
    Zombie,
    /// Already traced (strace, gdb): `PTRACE_SEIZE` would fail with EPERM.
    Traced {
        /// The tracer's thread id (`TracerPid`).
        tracer: u32,
    },
    /// Seccomp is on (`Seccomp:` 1 strict or 2 filter): the injected call
    /// goes through the target's filter, which may kill it.
    Seccomp {
        /// The mode.
        mode: u32,
    },
    /// In a frozen cgroup: the call would only run when it is thawed.
    Frozen,
    /// Every usable thread is in a call that would return EINTR to the
    /// application (see [`InjectConfig::allow_eintr_risk`]).
    EintrRisk {
        /// The thread whose call that is.
        tid: u32,
        /// The syscall number.
        syscall: i64,
    },
    /// No thread can be stopped (all in uninterruptible sleep or traced).
    NoStoppableThread,
    /// The chosen thread did not stop in time.
    StopTimeout {
        /// The thread.
        tid: u32,
    },
    /// An injected call did not start in time (e.g. the process was frozen
    /// meanwhile); the rest of the batch was abandoned.
    SyscallTimeout {
        /// Results of the calls that did complete.
        completed: Vec<i64>,
    },
    /// Not a 64-bit process.
    Not64Bit,
    /// No `syscall` instruction was found in its executable memory.
    NoSyscallInstruction,
    /// The stopped thread's stack below the red zone is not readable, so
    /// there is no scratch memory for the call's argument struct.
    NoScratch,
    /// No `syscall; ret` sequence and no `rt_sigreturn` trampoline were
    /// found in its executable memory: without them a tracer that died
    /// mid-injection could not leave the thread able to restore itself.
    NoSafeReturn,
    /// The process no longer runs the program image the caller judged (it
    /// called `execve`); nothing ran.
    ImageChanged,
    /// Signals kept arriving before every signal could be blocked; each was
    /// delivered, and the process left alone this time.
    SignalStorm,
    /// The stopped thread was inside a restartable-sequence (rseq)
    /// critical section. Running a call from elsewhere would make the
    /// kernel forget the section (it clears `rseq_cs` when the thread
    /// returns to user space outside it), so the section would not be
    /// aborted after the stop: the thread was released untouched, and the
    /// kernel aborts the section as for any preemption.
    RseqCriticalSection,
    /// The stopped thread was in `restart_syscall`, continuing a sleep or
    /// timeout whose remaining time only the kernel holds, and no tracer of
    /// this process had seen the call it continues. Restored register by register
    /// it would be fine, but released onto its rescue frame (an abandoned
    /// call, or the tracer's death) `rt_sigreturn` discards that state and
    /// the sleep returns EINTR to the application: the thread was released
    /// untouched, and the kernel resumes its sleep. Try again later (the
    /// sleep ends, or the tracer sees its next one start).
    UnknownRestart {
        /// The thread.
        tid: u32,
    },
    /// The batch could push the process's VMA count past the allowed
    /// fraction of `vm.max_map_count`.
    MapCountNearLimit {
        /// VMAs now.
        count: u64,
        /// VMAs in the worst case after the batch.
        projected: u64,
        /// `vm.max_map_count`.
        limit: u64,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::OwnProcess => write!(f, "pagesift's own process"),
            SkipReason::KernelThread => write!(f, "kernel thread"),
            SkipReason::Zombie => write!(f, "zombie"),
            SkipReason::Traced { tracer } => write!(f, "already traced by {tracer}"),
            SkipReason::Seccomp { mode } => write!(f, "seccomp mode {mode}"),
            SkipReason::Frozen => write!(f, "in a frozen cgroup"),
            SkipReason::EintrRisk { tid, syscall } => write!(
                f,
                "every usable thread is in a call that would see EINTR (thread {tid} in syscall {syscall})"
            ),
            SkipReason::NoStoppableThread => write!(f, "no thread can be stopped"),
            SkipReason::StopTimeout { tid } => write!(f, "thread {tid} did not stop in time"),
            SkipReason::SyscallTimeout { completed } => write!(
                f,
                "an injected call did not start in time ({} completed)",
                completed.len()
            ),
            SkipReason::Not64Bit => write!(f, "not a 64-bit process"),
            SkipReason::NoSyscallInstruction => write!(f, "no syscall instruction found"),
            SkipReason::NoScratch => write!(f, "no writable stack memory below the red zone"),
            SkipReason::NoSafeReturn => write!(
                f,
                "no `syscall; ret` and `rt_sigreturn` code in its executable memory"
            ),
            SkipReason::ImageChanged => write!(f, "it exec'd another program"),
            SkipReason::RseqCriticalSection => write!(
                f,
                "the stopped thread was inside an rseq critical section; released untouched"
            ),
            SkipReason::UnknownRestart { tid } => write!(
                f,
                "thread {tid} was continuing an interrupted sleep (restart_syscall) that an abandoned injection would end with EINTR; released untouched"
            ),
            SkipReason::SignalStorm => {
                write!(f, "signals kept arriving before they could be blocked")
            }
            SkipReason::MapCountNearLimit {
                count,
                projected,
                limit,
            } => write!(
                f,
                "{count} VMAs, up to {projected} after the batch, too close to vm.max_map_count = {limit}"
            ),
        }
    }
}

/// Why an injection could not be attempted or finished.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// A call's arguments are invalid; nothing was done.
    #[error("invalid call #{index}: {reason}")]
    InvalidCall {
        /// Its index in the batch.
        index: usize,
        /// What is wrong.
        reason: String,
    },
    /// The pid is a thread of another process.
    #[error("{tid} is a thread of process {tgid}, not a process")]
    NotAProcess {
        /// The id given.
        tid: u32,
        /// Its process.
        tgid: u32,
    },
    /// The thread given to [`Injector::run_on_thread`](super::Injector::run_on_thread)
    /// is not in the process.
    #[error("thread {tid} is not in process {pid}")]
    NoSuchThread {
        /// The process.
        pid: u32,
        /// The thread.
        tid: u32,
    },
    /// A capability is missing, access was refused, or the OS failed.
    #[error(transparent)]
    Linux(#[from] LinuxError),
    /// The tracer did not answer within its bound; it keeps the target
    /// until the injected call returns, then restores it and detaches.
    #[error(
        "injection into {pid} did not finish within {waited:?}; it will be completed in the background"
    )]
    Stuck {
        /// The process.
        pid: u32,
        /// How long the caller waited.
        waited: Duration,
    },
    /// The target's thread stopped somewhere it should not have; its
    /// registers were restored and it was released.
    #[error("unexpected ptrace state in {pid}: {what}")]
    Unexpected {
        /// The process.
        pid: u32,
        /// What was seen.
        what: String,
    },
    /// Remote injection is implemented for x86-64 only.
    #[error("remote syscall injection is only implemented for x86-64")]
    Unsupported,
}

/// Counters of an [`Injector`](super::Injector) since it was made.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InjectStats {
    /// Batches that ran completely.
    pub done: u64,
    /// Calls run (including those of batches cut short by an exit).
    pub syscalls: u64,
    /// Processes skipped.
    pub skipped: u64,
    /// Processes that exited before or during the injection.
    pub gone: u64,
    /// ... of which during an attach.
    pub gone_attached: u64,
    /// Signals re-delivered.
    pub signals_redelivered: u64,
    /// Injections after which the application saw EINTR.
    pub eintr_caused: u64,
    /// Sum of VMA count changes over batches with `madvise`.
    pub vma_delta: i64,
    /// Times the caller stopped waiting for the tracer.
    pub stuck: u64,
}

/// Why `CAP_SYS_PTRACE` is needed here.
pub(super) const WHY_INJECT: &str = "to stop another process's thread and run madvise/prctl in it \
     (PTRACE_SEIZE needs ptrace attach access)";
