//! Remote syscall injection: running `madvise(MADV_MERGEABLE)`,
//! `madvise(MADV_UNMERGEABLE)` and `prctl(PR_SET_MEMORY_MERGE)` inside a
//! process that never asked for KSM, with ptrace (x86-64).
//!
//! `process_madvise` refuses KSM advice for another process (mechanisms.md
//! §2), so the target has to make the call itself. The procedure and its
//! pitfalls were measured in mechanisms.md §1; this module follows them.
//!
//! ## One attach, before the code
//!
//! 1. **Look first** (no ptrace yet). `/proc/PID/stat` and `status`: kernel
//!    threads, zombies, already-traced processes (`TracerPid`, which would
//!    make `PTRACE_SEIZE` fail with EPERM) and processes with seccomp
//!    (`Seccomp:` 1 or 2; the injected call goes through the target's
//!    filter, and `SECCOMP_RET_KILL_PROCESS` killed the target in §1) are
//!    [`Outcome::Skipped`] with the reason, and so is a process in a frozen
//!    cgroup (it would only run the call when thawed). If the batch holds
//!    `madvise` calls, `/proc/PID/maps` is counted: each call may split a
//!    VMA at both ends, so the batch may add `2 × calls` VMAs, and it is
//!    refused if that could pass a fraction (default half) of
//!    `vm.max_map_count`.
//! 2. **Choose a thread** ([`choose_thread`]). `madvise` and `prctl` act on
//!    the whole `mm`, so one stopped thread is enough while the others run.
//!    Best is a thread asleep in a syscall that the kernel restarts
//!    transparently after a ptrace stop (futex, nanosleep, read on a pipe,
//!    poll: the restart table of §1), or one already group-stopped; then a
//!    thread running in user space (no side effect, but the stop needs an
//!    IPI: about 4× the cost); then a thread in a syscall whose behaviour is
//!    unknown (sockets with `SO_RCVTIMEO` return EINTR). Threads in
//!    `epoll_wait` and the other calls that return EINTR after *any* stop
//!    (signal(7), "interruption by stop signals") are used only if
//!    [`InjectConfig::allow_eintr_risk`] says so; otherwise the process is
//!    skipped. `D` threads are never chosen: the stop would only arrive when
//!    they leave `D`. `/proc/PID/task/TID/syscall` tells which call a thread
//!    is in.
//! 3. **Stop it.** `PTRACE_SEIZE` + `PTRACE_INTERRUPT`, then poll
//!    `waitpid(__WALL)` until the stop, at most
//!    [`InjectConfig::stop_timeout`]. A signal-delivery-stop that comes first
//!    is a stop too; its signal is kept for re-delivery.
//! 4. **Prepare** (`Session::prepare`). Save the registers, read the
//!    thread's blocked-signal mask (`SigBlk:`) and its FPU state
//!    (`PTRACE_GETREGSET(NT_X86_XSTATE)`), and find two pieces of the
//!    target's own code (once per process, cached by pid and start time,
//!    re-checked on every attach): a `syscall; ret` sequence (`0f 05 c3`)
//!    and an `rt_sigreturn` trampoline (`mov $15, %rax; syscall`, glibc's
//!    and musl's `__restore_rt`, Go's `runtime.sigreturn`). Then write a
//!    **rescue frame** into the stack below the 128-byte red zone, exactly
//!    where and as the kernel would write a signal frame: an
//!    `rt_sigframe` whose return address is the trampoline and whose
//!    `ucontext` holds the saved registers (with the kernel's no-handler
//!    syscall restart already applied), the saved mask and the saved FPU
//!    state; above it, scratch memory for the calls' ioctl structs.
//! 5. **Run each call** from the `syscall; ret` with `rsp` on the frame,
//!    `rax` = the number, the arguments in `rdi rsi rdx r10 r8 r9`, and
//!    **`orig_rax = -1`** (so the kernel's restart logic cannot rewind our
//!    frame). Resume with `PTRACE_SYSCALL`: the entry stop, then the exit
//!    stop, whose `rax` is the result; a `-ERESTART*` result runs the call
//!    again (the calls are idempotent). The first call blocks every signal
//!    (`rt_sigprocmask(SIG_BLOCK, all)`), the last puts the saved mask
//!    back. No single-step is used: a trap flag left in a thread whose
//!    tracer died would kill it with SIGTRAP.
//! 6. **Restore and detach** (`Session::finish`). After the last call,
//!    one more stop, an interrupt stop (inside the kernel's signal code);
//!    there `PTRACE_SETREGS` puts the saved registers back, `orig_rax` and
//!    `rax` included (restoring with `orig_rax = -1` made `read()` return
//!    errno 512 to the application in §1); the stack bytes under the frame
//!    go back; `PTRACE_DETACH`. The kernel's restart logic then resumes the
//!    interrupted syscall as if nothing had happened (§1 table), and a
//!    group-stopped thread goes back to its stop.
//!
//! ## Signals
//!
//! A signal is never held by the tracer. One that stops the thread before
//! every signal is blocked is delivered at once, in the thread's own
//! context (its registers put back first, its siginfo untouched), and the
//! injection starts again from the new stop (at most 16 times; then
//! [`SkipReason::SignalStorm`]). Nothing runs between seeing that stop and
//! passing the signal on: once a tracer has waited for a signal-delivery
//! stop the kernel keeps the signal for it, and a tracer that died right
//! then would take it along. After the block, signals wait in the kernel's
//! own queue, with their siginfo (`si_code`, `si_pid`, `si_value`), and are
//! delivered by the kernel once the mask is back, each exactly once; a
//! sender under `RLIMIT_SIGPENDING` sees `EAGAIN` from the kernel, as it
//! would from a busy target. Only `SIGSTOP` cannot be blocked: it is kept
//! and sent again (`tgkill`) right before the detach.
//!
//! ## Death of the tracer: the invariant
//!
//! **At every instant, a thread released by the kernel (its tracer thread
//! or process died: SIGKILL, OOM kill, a panic) resumes correctly, with no
//! help.** Before the frame is written its registers are its own. From
//! the first `PTRACE_SETREGS` of a call until the saved registers are put
//! back, its `rip` is on the `syscall; ret` (or just after the `syscall`)
//! and its `rsp` on the frame, so released it finishes the call in hand
//! (each is harmless on its own: `madvise`, the uffd ioctls, `close` of
//! our own fd, a mask change), returns into the trampoline, and
//! `rt_sigreturn` restores its registers, mask and FPU state from the
//! frame. A call abandoned by us ([`InjectConfig::syscall_timeout`], a
//! frozen task) is released the same way, pointed straight at the
//! trampoline so that the call never runs. No trap flag is ever set, so no
//! stray SIGTRAP. The only differences from an undisturbed run: a call
//! interrupted with `-ERESTART_RESTARTBLOCK` (a relative sleep or timeout)
//! starts over from its full duration (`rt_sigreturn` discards the kernel's
//! restart state), a thread already in `restart_syscall` when stopped by a
//! tracer that had not seen it before gets EINTR, and a `SIGSTOP` that
//! arrived during the calls is lost. The tests kill the tracing process
//! at each step of an injection in turn (`PAGESIFT_INJECT_FAULT`).
//!
//! ## Never hang, never harm
//!
//! All ptrace work runs on one tracer thread owned by the [`Injector`], with
//! every signal blocked (so a signal meant for the daemon cannot kill it
//! mid-injection, §1). If a thread does not stop within the timeout, the
//! tracer thread *exits*: the kernel then detaches its tracees and cancels
//! the pending interrupt (a thread that is seized but not stopped cannot be
//! detached otherwise); a new tracer is started for the next call. After
//! [`InjectConfig::syscall_timeout`] the tracer interrupts the thread: if
//! the call has not started (a frozen task) the batch is abandoned (the
//! thread released onto its rescue frame); if it is running, the tracer
//! waits for it. The caller never waits longer than its own bound
//! ([`InjectError::Stuck`]); a stuck tracer finishes in the background. A
//! process that exits at any point gives [`Outcome::Gone`], never an error.
//!
//! The rescue frame is as large as the kernel's own signal frame (about
//! 3 KiB with AVX-512 state). A thread that could not take a signal on its
//! current stack (Go's goroutine stacks rely on an alternate signal stack)
//! could be harmed by it as by a signal delivered there; processes without
//! both code sequences are skipped ([`SkipReason::NoSafeReturn`]).
//!
//! Not handled: 32-bit (compat) processes are skipped; only x86-64 is
//! supported.

use crate::caps::Capability;
use crate::error::{LinuxError, libc_errno};
use crate::ptrace::{self, Regs, Stop};
use std::collections::HashMap;
use std::fmt;
use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------
// Calls

/// x86-64 syscall numbers (`arch/x86/entry/syscalls/syscall_64.tbl`).
mod nr {
    pub const READ: i64 = 0;
    pub const WRITE: i64 = 1;
    pub const POLL: i64 = 7;
    pub const PREAD64: i64 = 17;
    pub const PWRITE64: i64 = 18;
    pub const READV: i64 = 19;
    pub const WRITEV: i64 = 20;
    pub const SELECT: i64 = 23;
    pub const MADVISE: i64 = 28;
    pub const PAUSE: i64 = 34;
    pub const NANOSLEEP: i64 = 35;
    pub const GETPID: i64 = 39;
    pub const WAIT4: i64 = 61;
    pub const SEMOP: i64 = 65;
    pub const MSGSND: i64 = 69;
    pub const MSGRCV: i64 = 70;
    pub const FLOCK: i64 = 73;
    pub const RT_SIGTIMEDWAIT: i64 = 128;
    pub const RT_SIGSUSPEND: i64 = 130;
    pub const PRCTL: i64 = 157;
    pub const FUTEX: i64 = 202;
    pub const IO_GETEVENTS: i64 = 208;
    pub const RESTART_SYSCALL: i64 = 219;
    pub const SEMTIMEDOP: i64 = 220;
    pub const CLOCK_NANOSLEEP: i64 = 230;
    pub const EPOLL_WAIT: i64 = 232;
    pub const WAITID: i64 = 247;
    pub const PSELECT6: i64 = 270;
    pub const PPOLL: i64 = 271;
    pub const EPOLL_PWAIT: i64 = 281;
    pub const PREADV: i64 = 295;
    pub const PWRITEV: i64 = 296;
    pub const IO_PGETEVENTS: i64 = 333;
    pub const IO_URING_ENTER: i64 = 426;
    pub const EPOLL_PWAIT2: i64 = 441;
    pub const FUTEX_WAITV: i64 = 449;
    pub const CLOSE: i64 = 3;
    pub const IOCTL: i64 = 16;
    pub const USERFAULTFD: i64 = 323;
}

/// userfaultfd ABI (`include/uapi/linux/userfaultfd.h`), for write
/// tracking ([`crate::uffd`], mechanisms.md §9).
pub mod uffd_abi {
    /// `UFFD_API`.
    pub const API: u64 = 0xAA;
    /// `UFFDIO_API = _IOWR(0xAA, 0x3F, struct uffdio_api)` (24 bytes).
    pub const UFFDIO_API: u64 = 0xc018_aa3f;
    /// `UFFDIO_REGISTER = _IOWR(0xAA, 0x00, struct uffdio_register)` (32 bytes).
    pub const UFFDIO_REGISTER: u64 = 0xc020_aa00;
    /// `UFFDIO_UNREGISTER = _IOR(0xAA, 0x01, struct uffdio_range)` (16 bytes).
    pub const UFFDIO_UNREGISTER: u64 = 0x8010_aa01;
    /// `UFFDIO_REGISTER_MODE_WP`.
    pub const MODE_WP: u64 = 1 << 1;
    /// `UFFD_FEATURE_WP_UNPOPULATED`: never-touched pages are armed too.
    pub const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
    /// `UFFD_FEATURE_WP_ASYNC`: the kernel resolves write-protect faults
    /// itself (it just unprotects the page), so nobody has to read the fd.
    pub const FEATURE_WP_ASYNC: u64 = 1 << 15;
    /// `UFFD_USER_MODE_ONLY`: lets an unprivileged target create the fd
    /// with `vm.unprivileged_userfaultfd = 0`. Kernel-mode faults would get
    /// SIGBUS/EFAULT instead of a message, but in WP async mode no fault is
    /// ever handed to the fd (`do_wp_page` unprotects the page itself), and
    /// only WP mode is registered; the tests check `read()` into a tracked
    /// page.
    pub const USER_MODE_ONLY: u64 = 1;
}

/// `PR_SET_MEMORY_MERGE` / `PR_GET_MEMORY_MERGE` (`include/uapi/linux/prctl.h`,
/// Linux 6.4+; verified by injection in mechanisms.md §1).
const PR_SET_MEMORY_MERGE: u64 = 67;
const PR_GET_MEMORY_MERGE: u64 = 68;
/// `MADV_MERGEABLE` / `MADV_UNMERGEABLE` (`include/uapi/asm-generic/mman-common.h`).
const MADV_MERGEABLE: u64 = 12;
const MADV_UNMERGEABLE: u64 = 13;

/// Kernel-internal "restart me" codes (`include/linux/errno.h`) that a
/// syscall returns when a signal interrupted it; user space never sees them
/// unless the restart logic is bypassed.
const ERESTARTSYS: i64 = 512;
const ERESTARTNOINTR: i64 = 513;
const ERESTARTNOHAND: i64 = 514;
const ERESTART_RESTARTBLOCK: i64 = 516;

fn is_restart(ret: i64) -> bool {
    matches!(
        -ret,
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
    )
}

/// KSM advice for a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Advice {
    /// `MADV_MERGEABLE`: ksmd may merge the range's pages (sets `mg`).
    Mergeable,
    /// `MADV_UNMERGEABLE`: unmerge every merged page of the range (walks
    /// it: 0.8 ms per resident 16 MiB, mechanisms.md §1) and clear `mg`.
    Unmergeable,
}

/// A file-descriptor argument of an injected call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fd {
    /// This descriptor number of the target.
    Number(i32),
    /// The descriptor returned by call `n` (an earlier call of the same
    /// batch). If that call failed, this one is not run and its result is
    /// `-ECANCELED`.
    ResultOf(usize),
    /// This descriptor number, but only if call `n` of the same batch
    /// succeeded (else `-ECANCELED`, not run): "close it if it proved to be
    /// a userfaultfd".
    NumberIfOk(i32, usize),
}

/// `ECANCELED`: the result of a call not run because the call it depends
/// on failed.
pub const ECANCELED: i64 = 125;

/// A call pagesift may inject. Deliberately not "any syscall": only these
/// are ever run inside another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syscall {
    /// `madvise(addr, len, advice)`. `addr` and `len` must be page-aligned
    /// and the range must have no holes (else `-ENOMEM`). A sub-range of a
    /// VMA splits it, which counts against `vm.max_map_count`.
    Madvise {
        /// First address.
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// The advice.
        advice: Advice,
    },
    /// `prctl(PR_SET_MEMORY_MERGE, on)`: every compatible VMA of the process,
    /// present and future, mergeable (or none); inherited across fork and
    /// kept across execve (mechanisms.md §1).
    SetMemoryMerge(bool),
    /// `prctl(PR_GET_MEMORY_MERGE)`: 1 if set, 0 if not.
    GetMemoryMerge,
    /// `getpid()`: does nothing; returns the target's pid. A probe, and the
    /// baseline for measuring injection cost.
    Getpid,
    /// `userfaultfd(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY)`: a new
    /// userfaultfd in the target; returns the descriptor.
    Userfaultfd,
    /// `ioctl(fd, UFFDIO_API, {UFFD_API, features})`. The struct is written
    /// into scratch memory below the stopped thread's stack red zone.
    UffdApi {
        /// The userfaultfd.
        fd: Fd,
        /// `UFFD_FEATURE_*` bits requested.
        features: u64,
    },
    /// `ioctl(fd, UFFDIO_REGISTER, {addr, len, mode})`. `-EBUSY` when the
    /// range is already registered with another userfaultfd.
    UffdRegister {
        /// The userfaultfd.
        fd: Fd,
        /// First address (page-aligned).
        addr: u64,
        /// Length in bytes (page-aligned).
        len: u64,
        /// `UFFDIO_REGISTER_MODE_*` bits.
        mode: u64,
    },
    /// `ioctl(fd, UFFDIO_UNREGISTER, {addr, len})`: ends the registration
    /// and drops the range's write-protect bits.
    UffdUnregister {
        /// The userfaultfd.
        fd: Fd,
        /// First address (page-aligned).
        addr: u64,
        /// Length in bytes (page-aligned).
        len: u64,
    },
    /// `close(fd)`. Only for descriptors pagesift opened in the target.
    Close(Fd),
}

impl Syscall {
    #[cfg(test)]
    fn number_and_args(&self) -> (i64, [u64; 6]) {
        let (n, a, _) = self.encode(&[], 0).expect("no dependency");
        (n, a)
    }

    /// The syscall number, its arguments and the bytes to write at
    /// `scratch` first (the ioctl structs). `results` are the earlier calls'
    /// results; `Err(-ECANCELED)` when a call this one depends on failed.
    fn encode(&self, results: &[i64], scratch: u64) -> Result<(i64, [u64; 6], Vec<u8>), i64> {
        let fd = |f: Fd| -> Result<u64, i64> {
            let ok = |i: usize| results.get(i).is_some_and(|&r| r >= 0);
            match f {
                Fd::Number(n) => Ok(n as u64),
                Fd::ResultOf(i) if ok(i) => Ok(results[i] as u64),
                Fd::NumberIfOk(n, i) if ok(i) => Ok(n as u64),
                _ => Err(-ECANCELED),
            }
        };
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        use uffd_abi::*;
        Ok(match *self {
            Syscall::Userfaultfd => {
                let flags = libc::O_CLOEXEC as u64 | libc::O_NONBLOCK as u64 | USER_MODE_ONLY;
                (nr::USERFAULTFD, [flags, 0, 0, 0, 0, 0], vec![])
            }
            Syscall::UffdApi { fd: f, features } => (
                nr::IOCTL,
                [fd(f)?, UFFDIO_API, scratch, 0, 0, 0],
                words(&[API, features, 0]),
            ),
            Syscall::UffdRegister {
                fd: f,
                addr,
                len,
                mode,
            } => (
                nr::IOCTL,
                [fd(f)?, UFFDIO_REGISTER, scratch, 0, 0, 0],
                words(&[addr, len, mode, 0]),
            ),
            Syscall::UffdUnregister { fd: f, addr, len } => (
                nr::IOCTL,
                [fd(f)?, UFFDIO_UNREGISTER, scratch, 0, 0, 0],
                words(&[addr, len]),
            ),
            Syscall::Close(f) => (nr::CLOSE, [fd(f)?, 0, 0, 0, 0, 0], vec![]),
            _ => {
                let (n, a) = self.plain();
                (n, a, vec![])
            }
        })
    }

    fn plain(&self) -> (i64, [u64; 6]) {
        match *self {
            Syscall::Madvise { addr, len, advice } => {
                let a = match advice {
                    Advice::Mergeable => MADV_MERGEABLE,
                    Advice::Unmergeable => MADV_UNMERGEABLE,
                };
                (nr::MADVISE, [addr, len, a, 0, 0, 0])
            }
            Syscall::SetMemoryMerge(on) => {
                (nr::PRCTL, [PR_SET_MEMORY_MERGE, on as u64, 0, 0, 0, 0])
            }
            Syscall::GetMemoryMerge => (nr::PRCTL, [PR_GET_MEMORY_MERGE, 0, 0, 0, 0, 0]),
            Syscall::Getpid => (nr::GETPID, [0; 6]),
            _ => unreachable!("encoded by `encode`"),
        }
    }

    /// Whether the call can split VMAs (a `madvise` on part of a VMA).
    pub fn may_split(&self) -> bool {
        matches!(
            self,
            Syscall::Madvise { .. } | Syscall::UffdRegister { .. } | Syscall::UffdUnregister { .. }
        )
    }

    fn validate(&self, index: usize) -> Result<(), String> {
        let dep = match *self {
            Syscall::UffdApi { fd, .. }
            | Syscall::UffdRegister { fd, .. }
            | Syscall::UffdUnregister { fd, .. }
            | Syscall::Close(fd) => match fd {
                Fd::ResultOf(i) | Fd::NumberIfOk(_, i) => Some(i),
                Fd::Number(_) => None,
            },
            _ => None,
        };
        if dep.is_some_and(|i| i >= index) {
            return Err(format!("call {index} depends on a later call"));
        }
        let range = match *self {
            Syscall::Madvise { addr, len, .. }
            | Syscall::UffdRegister { addr, len, .. }
            | Syscall::UffdUnregister { addr, len, .. } => Some((addr, len)),
            _ => None,
        };
        if let Some((addr, len)) = range {
            let page = crate::PAGE_SIZE;
            if addr % page != 0 || len % page != 0 {
                return Err(format!(
                    "madvise range {addr:#x}+{len:#x} is not page-aligned"
                ));
            }
            if len == 0 {
                return Err("madvise of an empty range".into());
            }
            // The x86-64 user address space ends below 2^47 (4-level paging)
            // or 2^56 (5-level); anything past that is a caller's bug.
            if addr.checked_add(len).is_none_or(|end| end > 1 << 56) {
                return Err(format!(
                    "madvise range {addr:#x}+{len:#x} is outside user space"
                ));
            }
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Configuration, outcomes, errors

/// How an [`Injector`] behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct InjectConfig {
    /// How long to wait for the chosen thread to stop after
    /// `PTRACE_INTERRUPT` (a blocked thread stops in 6–8 µs, a running one
    /// in 35–38 µs, mechanisms.md §1). Past it the process is skipped
    /// ([`SkipReason::StopTimeout`]).
    pub stop_timeout: Duration,
    /// How long one injected call may run before the tracer interrupts the
    /// thread (`prctl(PR_SET_MEMORY_MERGE, 0)` on 128 MiB took 60–69 ms,
    /// §1; unmerging gigabytes takes seconds). A call that has not started
    /// by then is abandoned; one that has is waited for.
    pub syscall_timeout: Duration,
    /// Refuse a batch of `madvise` calls if `VMAs + 2 × calls` could exceed
    /// this fraction of `vm.max_map_count` (0.5: stop at 50 %).
    pub max_map_fraction: f64,
    /// Stop a thread even if it is in a call that returns EINTR to the
    /// application after any stop (`epoll_wait`, `semop`, `sigtimedwait`,
    /// ...) when no other thread can be used. Off by default: such processes
    /// are skipped ([`SkipReason::EintrRisk`]).
    pub allow_eintr_risk: bool,
}

impl Default for InjectConfig {
    fn default() -> Self {
        InjectConfig {
            stop_timeout: Duration::from_millis(500),
            syscall_timeout: Duration::from_secs(10),
            max_map_fraction: 0.5,
            allow_eintr_risk: false,
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
#[derive(Clone, Debug, PartialEq, Eq)]
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
    /// The number of VMAs after it.
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
    /// The thread given to [`Injector::run_on_thread`] is not in the process.
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

/// Counters of an [`Injector`] since it was made.
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
const WHY_INJECT: &str = "to stop another process's thread and run madvise/prctl in it \
     (PTRACE_SEIZE needs ptrace attach access)";

// ---------------------------------------------------------------------------
// /proc facts

/// Reads a small /proc file: open, read until EOF, close. (`std::fs::read`
/// also stats and seeks the file; two syscalls more cost 2–6 µs per file
/// here, where generating `status` alone takes about 10 µs.) `Ok(None)` if
/// the file (so, the process or thread) is gone.
fn read_small(path: &str) -> io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc_errno::ENOENT | libc_errno::ESRCH)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(2 * n, 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A process that exits while its file is read.
            Err(e) if e.raw_os_error() == Some(libc_errno::ESRCH) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(Some(buf))
}

fn proc_error(pid: u32, e: io::Error) -> LinuxError {
    LinuxError::from_process_op(pid, e, "reading /proc", Capability::SysPtrace, WHY_INJECT)
}

/// `PF_KTHREAD` (`include/linux/sched.h`).
const PF_KTHREAD: u64 = 0x0020_0000;
/// `PF_EXITING` (`include/linux/sched.h`): the thread has begun to exit.
const PF_EXITING: u64 = 0x0000_0004;

/// What `/proc/PID/stat` says about a process (or `/proc/PID/task/TID/stat`
/// about a thread). A process's `stat` shows its main thread's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ProcStat {
    state: char,
    ppid: u32,
    kthread: bool,
    /// `PF_EXITING`: the thread is on its way out.
    exiting: bool,
    threads: u64,
    start_time: u64,
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
        threads: f.get(17)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

impl ProcStat {
    fn read(pid: u32, path: &str) -> Result<Option<ProcStat>, LinuxError> {
        match read_small(path).map_err(|e| proc_error(pid, e))? {
            None => Ok(None),
            Some(t) => parse_stat(&t)
                .map(Some)
                .ok_or_else(|| LinuxError::Parse(path.to_string())),
        }
    }

    fn of_process(pid: u32) -> Result<Option<ProcStat>, LinuxError> {
        ProcStat::read(pid, &format!("/proc/{pid}/stat"))
    }

    fn skip_reason(&self) -> Option<SkipReason> {
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
struct ThreadStatus {
    tgid: u32,
    tracer: u32,
    seccomp: u32,
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

    fn read(pid: u32, tid: u32) -> Result<Option<ThreadStatus>, LinuxError> {
        let path = format!("/proc/{pid}/task/{tid}/status");
        match read_small(&path).map_err(|e| proc_error(pid, e))? {
            None => Ok(None),
            Some(t) => ThreadStatus::parse(&String::from_utf8_lossy(&t))
                .map(Some)
                .ok_or(LinuxError::Parse(path)),
        }
    }

    fn skip_reason(&self) -> Option<SkipReason> {
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
fn cgroup_path(pid: u32) -> Option<String> {
    let text = read_small(&format!("/proc/{pid}/cgroup")).ok()??;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|p| p.trim().to_string())
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid hosts), from `/proc/self/mountinfo`;
/// read once.
fn cgroup2_root() -> Option<&'static str> {
    static ROOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        parse_cgroup2_root(&info)
    })
    .as_deref()
}

/// The mount point of the first `cgroup2` line of a mountinfo text (the
/// fifth field; the file system type follows the ` - ` separator).
fn parse_cgroup2_root(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(str::to_string))?
    })
}

/// Whether cgroup v2 `path` is frozen (`cgroup.events`: `frozen 1`). False
/// when unknown. (A cgroup v1 freezer puts tasks in an uninterruptible
/// state, `D`, which thread choice already avoids.)
fn cgroup_frozen(path: &str) -> bool {
    let Some(root) = cgroup2_root() else {
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

/// The number of VMAs of `pid` (lines of `/proc/PID/maps`).
pub fn map_count(pid: u32) -> Result<u64, LinuxError> {
    match read_small(&format!("/proc/{pid}/maps")).map_err(|e| proc_error(pid, e))? {
        Some(text) => Ok(text.iter().filter(|&&b| b == b'\n').count() as u64),
        None => Err(LinuxError::Gone(pid)),
    }
}

/// `vm.max_map_count`: the most VMAs a process may have (65530 by default);
/// past it `mmap` and VMA splits fail with ENOMEM.
pub fn max_map_count() -> Result<u64, LinuxError> {
    let text = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map_err(|e| LinuxError::io("reading /proc/sys/vm/max_map_count", e))?;
    text.trim()
        .parse()
        .map_err(|_| LinuxError::Parse("/proc/sys/vm/max_map_count".into()))
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

// ---------------------------------------------------------------------------
// Choosing the thread

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
/// functions by stop signals"; `epoll_wait` measured in mechanisms.md §1).
const EINTR_AFTER_STOP: &[i64] = &[
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
/// nanosleep, read on a pipe and futex measured in mechanisms.md §1).
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

/// Ranks one thread from its own `stat`.
fn rank_thread(pid: u32, tid: u32) -> Option<ThreadChoice> {
    let stat = ProcStat::read(pid, &format!("/proc/{pid}/task/{tid}/stat")).ok()??;
    rank_state(pid, tid, stat.state)
}

/// Why no thread was chosen.
#[derive(Debug)]
enum NoChoice {
    Gone,
    Skip(SkipReason),
}

/// Threads seen in a call that returns EINTR after a stop, by sampling or at
/// a stop: thread id → (its process's start time, so that a reused id does
/// not inherit the mark; the call).
type EintrProne = HashMap<u32, (u64, i64)>;

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
fn choose(
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

// ---------------------------------------------------------------------------
// The target's own code we run on, and the rescue frame

/// `syscall; ret`.
const CALL_RET: [u8; 3] = [0x0f, 0x05, 0xc3];
/// `mov $15, %rax; syscall`: `rt_sigreturn` (glibc's and musl's
/// `__restore_rt`, Go's `runtime.sigreturn`).
const SIGRETURN_RAX: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05];
/// `mov $15, %eax; syscall`: the same, shorter.
const SIGRETURN_EAX: [u8; 7] = [0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05];

/// Two pieces of the target's own executable memory the injection runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Gadgets {
    /// A `syscall; ret` sequence: each injected call runs here, and the
    /// `ret` takes the thread to `sigreturn` if nobody stops it first.
    call: u64,
    /// A `mov $15, %rax; syscall` (`rt_sigreturn`) sequence.
    sigreturn: u64,
    /// Its length (9 or 7 bytes), to re-check it.
    sigreturn_len: usize,
}

/// The offset of the first `syscall` instruction (`0f 05`) in `code`.
pub fn find_syscall_insn(code: &[u8]) -> Option<usize> {
    code.windows(2).position(|w| w == [0x0f, 0x05])
}

fn find(code: &[u8], pattern: &[u8]) -> Option<usize> {
    code.windows(pattern.len()).position(|w| w == pattern)
}

/// Reads `buf.len()` bytes of `pid` at `addr` (`process_vm_readv`).
fn read_remote(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    use nix::sys::uio::{RemoteIoVec, process_vm_readv};
    let len = buf.len();
    let n = process_vm_readv(
        nix::unistd::Pid::from_raw(pid as i32),
        &mut [io::IoSliceMut::new(buf)],
        &[RemoteIoVec {
            base: addr as usize,
            len,
        }],
    )?;
    if n == len {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc_errno::EIO))
    }
}

fn bytes_at(pid: u32, addr: u64, want: &[u8]) -> bool {
    let mut b = vec![0u8; want.len()];
    read_remote(pid, addr, &mut b).is_ok() && b == want
}

impl Gadgets {
    /// Looks for both sequences in the executable mappings of `pid`: the C
    /// library first (glibc has both), then the dynamic loader, then the
    /// rest, at most 256 MiB read.
    fn find(pid: u32) -> Option<Gadgets> {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
        let mut exec: Vec<(u64, u64, u8)> = maps
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let (s, e) = f.next()?.split_once('-')?;
                let perms = f.next()?;
                let name = l.split_whitespace().nth(5).unwrap_or("");
                if !perms.contains('x') || name == "[vsyscall]" {
                    return None;
                }
                let order = if name.contains("libc") {
                    0
                } else if name.contains("ld-") {
                    1
                } else {
                    2
                };
                Some((
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                    order,
                ))
            })
            .collect();
        exec.sort_by_key(|m| m.2);
        const CHUNK: u64 = 1 << 20;
        let mut budget: u64 = 256 << 20;
        let (mut call, mut sigreturn) = (None, None);
        let mut buf = vec![0u8; CHUNK as usize + 16];
        for (start, end, _) in exec {
            let mut at = start;
            while at < end && budget > 0 {
                let n = (end - at).min(CHUNK + 16);
                let b = &mut buf[..n as usize];
                if read_remote(pid, at, b).is_err() {
                    break;
                }
                budget = budget.saturating_sub(n);
                if call.is_none() {
                    call = find(b, &CALL_RET).map(|o| at + o as u64);
                }
                if sigreturn.is_none() {
                    sigreturn = find(b, &SIGRETURN_RAX)
                        .map(|o| (at + o as u64, SIGRETURN_RAX.len()))
                        .or_else(|| {
                            find(b, &SIGRETURN_EAX).map(|o| (at + o as u64, SIGRETURN_EAX.len()))
                        });
                }
                if let (Some(call), Some((sigreturn, sigreturn_len))) = (call, sigreturn) {
                    return Some(Gadgets {
                        call,
                        sigreturn,
                        sigreturn_len,
                    });
                }
                at += CHUNK;
            }
        }
        None
    }

    /// Whether both sequences are still where they were found.
    fn intact(&self, pid: u32) -> bool {
        let sr: &[u8] = if self.sigreturn_len == SIGRETURN_RAX.len() {
            &SIGRETURN_RAX
        } else {
            &SIGRETURN_EAX
        };
        bytes_at(pid, self.call, &CALL_RET) && bytes_at(pid, self.sigreturn, sr)
    }
}

/// `struct rt_sigframe` (arch/x86/include/asm/sigframe.h): `pretcode` (8),
/// `struct ucontext` (304), `struct siginfo` (128).
const SIGFRAME_LEN: u64 = 440;
/// Offsets in it: `uc.uc_flags`, `uc.uc_stack.ss_flags`, `uc.uc_mcontext`,
/// `uc.uc_sigmask`.
const UC_FLAGS: usize = 8;
const UC_SS_FLAGS: usize = 32;
const UC_MCONTEXT: usize = 48;
const UC_SIGMASK: usize = 304;
/// `UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS`
/// (arch/x86/include/uapi/asm/ucontext.h), as the kernel sets them.
const UC_FLAGS_VALUE: u64 = 0x1 | 0x2 | 0x4;
/// `struct _fpx_sw_bytes` magic numbers (arch/x86/include/uapi/asm/sigcontext.h).
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// The legacy `FXSAVE` area (x87 and SSE), all a CPU without XSAVE has.
const FXSAVE_LEN: usize = 512;
/// The smallest XSAVE area: the legacy 512 bytes and the 64-byte header.
const MIN_XSTATE: usize = 576;
/// Scratch for the calls' argument structs, between the red zone and the
/// frame: the ioctl structs at 0 (32 bytes at most), the all-signals set at
/// 64, the thread's own signal mask at 72.
const SCRATCH_LEN: u64 = 128;
const SCRATCH_ALL_SIGNALS: u64 = 64;
const SCRATCH_OWN_MASK: u64 = 72;
/// The x86-64 ABI's red zone below `rsp`, which a leaf function may use
/// without moving `rsp`: never touched.
const RED_ZONE: u64 = 128;

fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}

/// The registers `regs` with the kernel's no-handler restart applied: a
/// thread stopped in a syscall that a signal interrupted (`-ERESTART*`,
/// `orig_rax` its number) goes back to its `syscall` instruction with the
/// number in `rax`, exactly what `arch_do_signal_or_restart` does when no
/// handler runs. `rt_sigreturn` sets `orig_rax = -1`, so without this the
/// application would see errno 512 (`ERESTARTSYS`) from its interrupted
/// call.
///
/// `-ERESTART_RESTARTBLOCK` is the exception: the kernel would call
/// `restart_syscall`, which continues from state kept in the thread (the
/// time left to sleep), but `rt_sigreturn` discards that state (the call
/// would then fail with EINTR). So the original call runs again from the
/// start with its own arguments (still in its registers): a relative sleep
/// or timeout starts over, which the application cannot tell from a late
/// wake-up. `origin` is that call's number when the thread is already in
/// `restart_syscall` (known only if this tracer saw it before).
fn restart_applied(regs: &Regs, origin: Option<i64>) -> Regs {
    let mut r = *regs;
    if (r.orig_rax as i64) >= 0 {
        match -(r.rax as i64) {
            ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND => {
                r.rax = r.orig_rax;
                r.rip = r.rip.wrapping_sub(2);
            }
            ERESTART_RESTARTBLOCK => {
                r.rax = if r.orig_rax as i64 == nr::RESTART_SYSCALL {
                    origin.unwrap_or(nr::RESTART_SYSCALL) as u64
                } else {
                    r.orig_rax
                };
                r.rip = r.rip.wrapping_sub(2);
            }
            _ => {}
        }
    }
    r.orig_rax = u64::MAX;
    r
}

/// A signal frame that `rt_sigreturn` turns back into `regs` (restart
/// applied), signal mask `mask` and the FPU state at `fpstate`; its return
/// address (`pretcode`) is `sigreturn`.
fn build_sigframe(
    regs: &Regs,
    origin: Option<i64>,
    mask: u64,
    fpstate: u64,
    sigreturn: u64,
) -> Vec<u8> {
    let r = restart_applied(regs, origin);
    let mut f = vec![0u8; SIGFRAME_LEN as usize];
    put64(&mut f, 0, sigreturn);
    put64(&mut f, UC_FLAGS, UC_FLAGS_VALUE);
    // An invalid `ss_flags` mode: `rt_sigreturn` then leaves the thread's
    // alternate signal stack as it is (`restore_altstack` ignores the
    // EINVAL), where a real value would replace it.
    put32(&mut f, UC_SS_FLAGS, 4);
    let gregs = [
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx, r.rdx,
        r.rax, r.rcx, r.rsp, r.rip, r.eflags,
    ];
    for (i, v) in gregs.iter().enumerate() {
        put64(&mut f, UC_MCONTEXT + 8 * i, *v);
    }
    // cs, gs, fs, ss (16 bits each) after the 18 words.
    let segs = UC_MCONTEXT + 8 * gregs.len();
    f[segs..segs + 2].copy_from_slice(&(r.cs as u16).to_ne_bytes());
    f[segs + 6..segs + 8].copy_from_slice(&(r.ss as u16).to_ne_bytes());
    // err, trapno, oldmask, cr2 stay 0; then the fpstate pointer.
    put64(&mut f, segs + 8 + 32, fpstate);
    put64(&mut f, UC_SIGMASK, mask);
    f
}

/// The FPU state of a signal frame from `PTRACE_GETREGSET(NT_X86_XSTATE)`:
/// the same XSAVE layout, with the software bytes (464..512) that tell
/// `rt_sigreturn` it holds extended state, and the second magic after it;
/// or, from `NT_PRFPREG` on a CPU without XSAVE, the bare FXSAVE area.
/// `None` if the buffer is neither an FXSAVE area nor an XSAVE area with x87
/// and SSE state.
fn build_fpstate(xstate: &[u8]) -> Option<Vec<u8>> {
    if xstate.len() == FXSAVE_LEN {
        // A CPU without XSAVE: its frames hold the bare FXSAVE area, and
        // `rt_sigreturn` restores it with FXRSTOR; the software bytes stay
        // clear (no extended-state magic).
        let mut b = xstate.to_vec();
        b[464..512].fill(0);
        return Some(b);
    }
    if xstate.len() < MIN_XSTATE {
        return None;
    }
    let xcr0 = u64::from_ne_bytes(xstate[464..472].try_into().ok()?);
    if xcr0 & 3 != 3 {
        return None;
    }
    let len = xstate.len();
    let mut b = xstate.to_vec();
    b[464..512].fill(0);
    put32(&mut b, 464, FP_XSTATE_MAGIC1);
    put32(&mut b, 468, (len + 4) as u32);
    put64(&mut b, 472, xcr0);
    put32(&mut b, 480, len as u32);
    b.extend_from_slice(&FP_XSTATE_MAGIC2.to_ne_bytes());
    Some(b)
}

/// Where the rescue frame sits in a stopped thread's stack, below its red
/// zone (top down: red zone, scratch, FPU state aligned to 64 bytes as
/// `XRSTOR` requires, signal frame).
#[derive(Clone, Debug)]
struct Rescue {
    /// The frame's first byte: `rsp` while a call is injected (the `ret`
    /// pops `pretcode`).
    base: u64,
    /// Scratch memory for the calls' structs.
    scratch: u64,
    /// `[base, rsp - red zone)` as it was, put back at the end.
    old: Vec<u8>,
}

impl Rescue {
    /// Lays the frame out for `regs`, reads what is there and writes the
    /// frame; `None` if that stack memory is not readable and writable.
    fn install(
        pid: u32,
        regs: &Regs,
        origin: Option<i64>,
        mask: u64,
        xstate: &[u8],
        g: &Gadgets,
    ) -> Result<Option<Rescue>, SkipReason> {
        let fp_bytes = build_fpstate(xstate).ok_or(SkipReason::NoScratch)?;
        let top = regs.rsp.wrapping_sub(RED_ZONE);
        let scratch = (top - SCRATCH_LEN) & !63;
        let fpstate = (scratch - fp_bytes.len() as u64) & !63;
        let base = (fpstate - SIGFRAME_LEN) & !15;
        if base > top || top - base > 64 * 1024 {
            return Err(SkipReason::NoScratch);
        }
        let mut old = vec![0u8; (top - base) as usize];
        if read_remote(pid, base, &mut old).is_err() {
            return Ok(None);
        }
        let mut new = old.clone();
        let frame = build_sigframe(regs, origin, mask, fpstate, g.sigreturn);
        new[..frame.len()].copy_from_slice(&frame);
        let at = (fpstate - base) as usize;
        new[at..at + fp_bytes.len()].copy_from_slice(&fp_bytes);
        let s = (scratch - base) as usize;
        new[s..s + SCRATCH_LEN as usize].fill(0);
        put64(&mut new, s + SCRATCH_ALL_SIGNALS as usize, u64::MAX);
        put64(&mut new, s + SCRATCH_OWN_MASK as usize, mask);
        if write_remote(pid, base, &new).is_err() {
            return Ok(None);
        }
        Ok(Some(Rescue { base, scratch, old }))
    }

    /// The registers of a thread about to run `rt_sigreturn` on the frame:
    /// released in this state, it restores itself without running anything
    /// else.
    fn sigreturn_regs(&self, saved: &Regs, g: &Gadgets) -> Regs {
        let mut r = *saved;
        r.rip = g.sigreturn;
        r.rsp = self.base + 8;
        r.orig_rax = u64::MAX;
        r
    }
}

/// Writes `buf` into `pid` at `addr` (`process_vm_writev`).
fn write_remote(pid: u32, addr: u64, buf: &[u8]) -> io::Result<()> {
    use nix::sys::uio::{RemoteIoVec, process_vm_writev};
    let len = buf.len();
    let n = process_vm_writev(
        nix::unistd::Pid::from_raw(pid as i32),
        &[io::IoSlice::new(buf)],
        &[RemoteIoVec {
            base: addr as usize,
            len,
        }],
    )?;
    if n == len {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc_errno::EIO))
    }
}

/// The thread's blocked-signal mask (`SigBlk:` of its `status`), read while
/// it is stopped (only the thread itself changes it).
fn blocked_mask(pid: u32, tid: u32) -> Option<u64> {
    let text = read_small(&format!("/proc/{pid}/task/{tid}/status")).ok()??;
    let text = String::from_utf8_lossy(&text);
    text.lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
}

// ---------------------------------------------------------------------------
// Fault injection, for the tests of the release path

/// `PAGESIFT_INJECT_FAULT=N` makes the process SIGKILL itself at the N-th
/// checkpoint of its tracer threads (counted from 1 over the process's
/// life); `N:panic` panics the tracer thread there instead, `N:stall`
/// waits 100 ms before the SIGKILL (a window for a test to act in). The
/// checkpoints are the moments between two ptrace steps of an injection.
/// Unset (always, outside tests), a checkpoint is one atomic load.
fn checkpoint() {
    use std::sync::OnceLock;
    use std::sync::atomic::{AtomicU64, Ordering};
    static PLAN: OnceLock<Option<(u64, u8)>> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let plan = PLAN.get_or_init(|| {
        let v = std::env::var("PAGESIFT_INJECT_FAULT").ok()?;
        let (n, how) = match v.split_once(':') {
            Some((n, "panic")) => (n.to_string(), 1),
            Some((n, "stall")) => (n.to_string(), 2),
            _ => (v.clone(), 0),
        };
        Some((n.parse().ok()?, how))
    });
    let Some((n, how)) = *plan else {
        return;
    };
    if COUNT.fetch_add(1, Ordering::SeqCst) + 1 != n {
        return;
    }
    if how == 1 {
        panic!("PAGESIFT_INJECT_FAULT: tracer panics at checkpoint {n}");
    }
    if how == 2 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

// ---------------------------------------------------------------------------
// The tracer

/// x86-64 user code segment selector (`__USER_CS`); a compat (32-bit) task
/// runs with `__USER32_CS` = 0x23.
const USER_CS: u64 = 0x33;

/// Bounds on the stepping loop of one call.
const MAX_STOPS_PER_CALL: u32 = 100_000;
const MAX_RESTARTS_PER_CALL: u32 = 64;

/// One batch for the tracer thread.
struct Job {
    pid: u32,
    tid: Option<u32>,
    /// The program image the caller judged (`discover::image_id`): checked
    /// again once the thread is stopped.
    image: Option<u64>,
    calls: Vec<Syscall>,
    config: InjectConfig,
}

/// The tracer's answer.
struct Reply {
    result: Result<Outcome, InjectError>,
    /// The tracer thread exits after this reply (a thread is seized but
    /// never stopped; the exit detaches it).
    exiting: bool,
}

/// Why stepping a call stopped early.
enum StepError {
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

fn os(what: &'static str) -> impl FnOnce(io::Error) -> StepError {
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
/// mechanisms.md §1), then sleeping with a growing pause. `None` when
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
struct Session {
    pid: u32,
    tid: u32,
    /// Reap the thread's exit report (false only for the leader of our own
    /// child, whose exit status belongs to us as its parent: reaping it
    /// here would steal it from the code that waits for the child).
    reap_exit: bool,
    /// The registers at the stop, put back at the end.
    saved: Option<Regs>,
    /// The thread's own signal mask, put back by the last call.
    mask: u64,
    /// The code the calls run on.
    gadgets: Option<Gadgets>,
    /// The rescue frame in the thread's stack, once written.
    rescue: Option<Rescue>,
    /// Whether every blockable signal is blocked in the thread now.
    blocked: bool,
    /// Signals that arrived before the block, delivered at once (the
    /// injection then starts again from the new state).
    delivered: usize,
    /// `SIGSTOP`s (which cannot be blocked) that arrived after the block:
    /// sent again just before the detach.
    deferred_stops: usize,
    /// The stop the thread is in.
    last: Stop,
}

/// How the wait for the first stop ended.
enum Held {
    /// Stopped (an interrupt stop or a group-stop).
    Stopped,
    /// It did not stop in time.
    Timeout,
}

/// `rt_sigprocmask` (x86-64 number 14) `how` values.
const NR_RT_SIGPROCMASK: i64 = 14;
const SIG_BLOCK: u64 = 0;
const SIG_SETMASK: u64 = 2;
/// Times a batch starts over because a signal came before the block.
const MAX_SIGNAL_RESTARTS: u32 = 16;

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
    fn settle_gone(&self) {
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
    fn hold(&mut self, deadline: Instant) -> Result<Held, StepError> {
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
    fn prepare(&mut self, tracer: &mut Tracer, start_time: u64) -> Result<(), Prep> {
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
        let origin = tracer.restart_origin(tid, start_time, &saved);
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
    fn call(
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
    fn deliver_and_hold(&mut self, sig: i32, config: &InjectConfig) -> Result<Held, StepError> {
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
    fn finish(&mut self, config: &InjectConfig) -> Result<bool, StepError> {
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
    fn release(&mut self) -> io::Result<()> {
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
enum Prep {
    Skip(SkipReason),
    Step(StepError),
}

/// The state of the tracer thread.
#[derive(Default)]
struct Tracer {
    /// pid → (start time, the gadgets found in it).
    insns: HashMap<u32, (u64, Gadgets)>,
    /// tid → (its process's start time, rip, the call) of threads seen
    /// stopped in a call that restarts through `restart_syscall`.
    restarts: HashMap<u32, (u64, u64, i64)>,
    /// Threads known to sit in EINTR-prone calls.
    prone: EintrProne,
    /// pid → (start time, cgroup v2 path): a process rarely changes cgroup.
    /// If it moved into a frozen one, the call timeout catches it (the
    /// batch is abandoned cleanly) and the entry is dropped.
    cgroups: HashMap<u32, (u64, Option<String>)>,
}

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

    /// For a thread stopped in `restart_syscall`, the call it restarts, if
    /// this tracer stopped it in that call before (at the same `rip`);
    /// records the call of a thread stopped in it with
    /// `-ERESTART_RESTARTBLOCK` for next time.
    fn restart_origin(&mut self, tid: u32, start_time: u64, regs: &Regs) -> Option<i64> {
        let nr = regs.orig_rax as i64;
        if nr < 0 || -(regs.rax as i64) != ERESTART_RESTARTBLOCK {
            return None;
        }
        if nr != nr::RESTART_SYSCALL {
            if self.restarts.len() >= 65_536 {
                self.restarts.clear();
            }
            self.restarts.insert(tid, (start_time, regs.rip, nr));
            return None;
        }
        self.restarts
            .get(&tid)
            .filter(|&&(st, rip, _)| st == start_time && rip == regs.rip)
            .map(|&(_, _, n)| n)
    }

    /// The gadgets of the stopped process, from the cache if they are still
    /// there.
    fn gadgets(&mut self, pid: u32, start_time: u64) -> Option<Gadgets> {
        if let Some(&(st, g)) = self.insns.get(&pid)
            && st == start_time
            && g.intact(pid)
        {
            return Some(g);
        }
        self.insns.remove(&pid);
        let g = Gadgets::find(pid)?;
        if self.insns.len() >= 65_536 {
            self.insns.clear();
        }
        self.insns.insert(pid, (start_time, g));
        Some(g)
    }

    fn attempt(&mut self, job: &Job) -> Reply {
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
        let vmas_before = if splitting > 0 {
            let count = match map_count(pid) {
                Ok(c) => c,
                Err(LinuxError::Gone(_)) => return gone(false, vec![]),
                Err(e) => return Err(e.into()),
            };
            if let Err(r) = map_budget(count, splitting, max_map_count()?, cfg.max_map_fraction) {
                return Ok(Outcome::Skipped(r));
            }
            Some(count)
        } else {
            None
        };

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
                    let stat =
                        ProcStat::read(pid, &format!("/proc/{pid}/task/{}/stat", choice.tid))?;
                    match stat {
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
        for call in &job.calls {
            let (number, args, bytes) = match call.encode(&results, scratch) {
                Ok(e) => e,
                Err(r) => {
                    results.push(r);
                    continue;
                }
            };
            match s.call(number, args, &bytes, cfg) {
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
        let vmas_after = match vmas_before {
            Some(_) => map_count(pid).ok(),
            None => None,
        };
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

// ---------------------------------------------------------------------------
// The injector

/// The tracer thread and its channels.
struct Worker {
    jobs: mpsc::Sender<Job>,
    replies: mpsc::Receiver<Reply>,
    handle: std::thread::JoinHandle<()>,
    /// Its kernel thread id: the tracer of its tracees.
    tid: u32,
}

impl Worker {
    fn spawn() -> io::Result<Worker> {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (reply_tx, replies) = mpsc::channel::<Reply>();
        let (tid_tx, tid_rx) = mpsc::channel::<u32>();
        let handle = std::thread::Builder::new()
            .name("pagesift-tracer".into())
            .spawn(move || {
                let _ = tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32);
                // No signal may interrupt (or kill, via a default action)
                // this thread while a target holds our registers; process
                // signals go to the daemon's other threads.
                use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
                let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None);
                let mut tracer = Tracer::default();
                while let Ok(job) = job_rx.recv() {
                    let reply = tracer.attempt(&job);
                    let exiting = reply.exiting;
                    // The caller may have stopped waiting: then just go on.
                    let _ = reply_tx.send(reply);
                    if exiting {
                        break;
                    }
                }
            })?;
        let tid = tid_rx
            .recv()
            .map_err(|_| io::Error::other("the tracer thread did not start"))?;
        Ok(Worker {
            jobs,
            replies,
            handle,
            tid,
        })
    }

    /// Joins a tracer that announced its exit and waits (bounded) until the
    /// kernel has released it: only then are its tracees detached (a join
    /// returns when the thread's stack is free, slightly earlier).
    fn retire(self) {
        let _ = self.handle.join();
        let task = format!("/proc/self/task/{}", self.tid);
        let deadline = Instant::now() + Duration::from_millis(200);
        while std::path::Path::new(&task).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}

/// Runs syscalls inside other processes (see the module header).
///
/// ```no_run
/// use pagesift_linux::inject::{Advice, Injector, Outcome, Syscall};
/// let mut inj = Injector::new(Default::default());
/// let calls = [Syscall::Madvise { addr: 0x7f00_0000_0000, len: 1 << 20, advice: Advice::Mergeable }];
/// match inj.run(1234, &calls)? {
///     Outcome::Done(i) => println!("results {:?}", i.results),
///     Outcome::Skipped(why) => println!("skipped: {why}"),
///     Outcome::Gone(_) => println!("exited"),
/// }
/// # Ok::<(), pagesift_linux::inject::InjectError>(())
/// ```
pub struct Injector {
    config: InjectConfig,
    worker: Option<Worker>,
    stats: InjectStats,
}

impl fmt::Debug for Injector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Injector")
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Injector {
    /// An injector; its tracer thread starts on first use.
    pub fn new(config: InjectConfig) -> Injector {
        Injector {
            config,
            worker: None,
            stats: InjectStats::default(),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &InjectConfig {
        &self.config
    }

    /// Counters since it was made.
    pub fn stats(&self) -> &InjectStats {
        &self.stats
    }

    /// Runs `calls` in process `pid`, in order, in one attach, from a thread
    /// chosen as the module header describes.
    pub fn run(&mut self, pid: u32, calls: &[Syscall]) -> Result<Outcome, InjectError> {
        self.submit(pid, None, None, calls)
    }

    /// Like [`run`](Self::run), but only if the process still runs the
    /// program image `image` (`discover::image_id`) once its thread is
    /// stopped: a process that called `execve` between the caller's check
    /// and the attach is [`SkipReason::ImageChanged`], and nothing runs in
    /// the new image. (After the stop, an `execve` by another thread kills
    /// the stopped one: the calls then cannot run either.)
    pub fn run_as(
        &mut self,
        pid: u32,
        image: u64,
        calls: &[Syscall],
    ) -> Result<Outcome, InjectError> {
        self.submit(pid, None, Some(image), calls)
    }

    /// Like [`run`](Self::run), but stops thread `tid` of `pid` whatever its
    /// state (the caller takes the EINTR and `D`-state risks).
    pub fn run_on_thread(
        &mut self,
        pid: u32,
        tid: u32,
        calls: &[Syscall],
    ) -> Result<Outcome, InjectError> {
        self.submit(pid, Some(tid), None, calls)
    }

    fn submit(
        &mut self,
        pid: u32,
        tid: Option<u32>,
        image: Option<u64>,
        calls: &[Syscall],
    ) -> Result<Outcome, InjectError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(InjectError::Unsupported);
        }
        for (index, c) in calls.iter().enumerate() {
            c.validate(index)
                .map_err(|reason| InjectError::InvalidCall { index, reason })?;
        }
        if pid == crate::own_pid() {
            return Ok(self.count(Outcome::Skipped(SkipReason::OwnProcess)));
        }
        if calls.is_empty() {
            return Ok(Outcome::Done(Injection {
                results: vec![],
                tid: 0,
                interrupted_syscall: None,
                app_sees_eintr: false,
                signals_redelivered: 0,
                vmas_before: None,
                vmas_after: None,
                attached_for: Duration::ZERO,
            }));
        }
        let worker = match &mut self.worker {
            Some(w) => w,
            None => self.worker.insert(
                Worker::spawn().map_err(|e| LinuxError::io("starting the tracer thread", e))?,
            ),
        };
        let job = Job {
            pid,
            tid,
            image,
            calls: calls.to_vec(),
            config: self.config,
        };
        if worker.jobs.send(job).is_err() {
            self.worker = None;
            return Err(InjectError::Unexpected {
                pid,
                what: "the tracer thread has died".into(),
            });
        }
        // The tracer's own bounds plus slack: the stop, then each call.
        let bound = self.config.stop_timeout * 2
            + self.config.syscall_timeout * (calls.len() as u32 + 1)
            + Duration::from_secs(1);
        match worker.replies.recv_timeout(bound) {
            Ok(reply) => {
                if reply.exiting {
                    self.worker.take().expect("present").retire();
                }
                reply.result.map(|o| self.count(o))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Leave it to finish in the background; start afresh.
                self.worker = None;
                self.stats.stuck += 1;
                Err(InjectError::Stuck { pid, waited: bound })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // It panicked: its exit released its tracee (which restores
                // itself, see the module header); wait until the kernel has
                // let go of it, so that the next attach finds it free.
                if let Some(w) = self.worker.take() {
                    w.retire();
                }
                Err(InjectError::Unexpected {
                    pid,
                    what: "the tracer thread has died".into(),
                })
            }
        }
    }

    fn count(&mut self, o: Outcome) -> Outcome {
        let s = &mut self.stats;
        match &o {
            Outcome::Done(i) => {
                s.done += 1;
                s.syscalls += i.results.len() as u64;
                s.signals_redelivered += i.signals_redelivered as u64;
                s.eintr_caused += i.app_sees_eintr as u64;
                s.vma_delta += i.vma_delta().unwrap_or(0);
            }
            Outcome::Skipped(SkipReason::SyscallTimeout { completed }) => {
                s.skipped += 1;
                s.syscalls += completed.len() as u64;
            }
            Outcome::Skipped(_) => s.skipped += 1,
            Outcome::Gone(g) => {
                s.gone += 1;
                s.gone_attached += g.attached as u64;
                s.syscalls += g.completed.len() as u64;
            }
        }
        o
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            drop(w.jobs);
            // The tracer is idle (every run waited for its reply), so it
            // exits at once.
            let _ = w.handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_encode_as_the_kernel_expects() {
        let m = Syscall::Madvise {
            addr: 0x1000,
            len: 0x2000,
            advice: Advice::Mergeable,
        };
        assert_eq!(m.number_and_args(), (28, [0x1000, 0x2000, 12, 0, 0, 0]));
        let u = Syscall::Madvise {
            addr: 0x1000,
            len: 0x2000,
            advice: Advice::Unmergeable,
        };
        assert_eq!(u.number_and_args().1[2], 13);
        assert_eq!(
            Syscall::SetMemoryMerge(true).number_and_args(),
            (157, [67, 1, 0, 0, 0, 0])
        );
        assert_eq!(Syscall::GetMemoryMerge.number_and_args().1[0], 68);
        assert_eq!(Syscall::Getpid.number_and_args().0, 39);
        // The numbers agree with libc's table for this target.
        assert_eq!(nr::MADVISE, libc::SYS_madvise);
        assert_eq!(nr::PRCTL, libc::SYS_prctl);
        assert_eq!(nr::EPOLL_WAIT, libc::SYS_epoll_wait);
        assert_eq!(nr::CLOCK_NANOSLEEP, libc::SYS_clock_nanosleep);
        assert_eq!(nr::FUTEX_WAITV, libc::SYS_futex_waitv);
        assert_eq!(MADV_MERGEABLE, libc::MADV_MERGEABLE as u64);
        assert!(m.may_split() && !Syscall::SetMemoryMerge(true).may_split());
    }

    #[test]
    fn bad_ranges_are_refused() {
        let mk = |addr, len| Syscall::Madvise {
            addr,
            len,
            advice: Advice::Mergeable,
        };
        assert!(mk(0x1000, 0x1000).validate(0).is_ok());
        assert!(mk(0x1001, 0x1000).validate(0).is_err());
        assert!(mk(0x1000, 0x10).validate(0).is_err());
        assert!(mk(0x1000, 0).validate(0).is_err());
        assert!(mk(u64::MAX - 0xfff, 0x2000).validate(0).is_err());
        let mut inj = Injector::new(InjectConfig::default());
        let err = inj.run(1, &[Syscall::Getpid, mk(3, 4096)]).unwrap_err();
        assert!(
            matches!(err, InjectError::InvalidCall { index: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn own_process_is_skipped() {
        let mut inj = Injector::new(InjectConfig::default());
        let o = inj.run(std::process::id(), &[Syscall::Getpid]).unwrap();
        assert_eq!(o, Outcome::Skipped(SkipReason::OwnProcess));
        assert_eq!(inj.stats().skipped, 1);
    }

    #[test]
    fn restart_codes() {
        for r in [-512, -513, -514, -516] {
            assert!(is_restart(r));
        }
        for r in [0, 1, -4, -515, 512] {
            assert!(!is_restart(r));
        }
    }

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
    fn cgroup2_mount_is_found() {
        let hybrid = "25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
27 25 0:25 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";
        assert_eq!(
            parse_cgroup2_root(hybrid).as_deref(),
            Some("/sys/fs/cgroup/unified")
        );
        let pure = "30 1 0:26 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(parse_cgroup2_root(pure).as_deref(), Some("/sys/fs/cgroup"));
        assert_eq!(
            parse_cgroup2_root("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }

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

    #[test]
    fn syscall_instruction_is_found() {
        assert_eq!(find_syscall_insn(&[0x90, 0x0f, 0x05, 0xc3]), Some(1));
        assert_eq!(find_syscall_insn(&[0x0f, 0x0f, 0x0f]), None);
        assert_eq!(find_syscall_insn(&[]), None);
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

    #[test]
    fn own_vmas_are_counted_and_the_limit_read() {
        // Our own maps: a count readable through the same path.
        let n = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count() as u64;
        assert!(n > 5);
        let limit = max_map_count().unwrap();
        assert!(limit > n, "vm.max_map_count {limit}");
    }
}
