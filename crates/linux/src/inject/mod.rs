//! Remote syscall injection: running `madvise(MADV_MERGEABLE)`,
//! `madvise(MADV_UNMERGEABLE)` and `prctl(PR_SET_MEMORY_MERGE)` inside a
//! process that never asked for KSM, with ptrace (x86-64).
//!
//! `process_madvise` refuses KSM advice for another process (for a remote
//! process it accepts only `MADV_COLD`, `MADV_PAGEOUT`, `MADV_WILLNEED` and
//! `MADV_COLLAPSE`, `mm/madvise.c`), so the target has to make the call
//! itself. The procedure below, and the pitfalls it avoids, were measured
//! on this machine before the code was written; the figures quoted in this
//! module's files are those measurements.
//!
//! One module per job: `calls` (what may be run, and its
//! encoding), `facts` (what `/proc` says before the attach), `thread`
//! (which thread to stop), `gadgets` (the target's own code the calls run
//! on), `remote` (reading and writing the target's memory), `rescue` (the
//! frame that lets a released thread restore itself), `session` (one
//! attached thread, step by step), `tracer` (one attempt, from the first
//! look to the detach), `worker` (the tracer thread), `fault` (fault
//! injection for the tests) and `injector` (the public [`Injector`]).
//! Configuration, outcomes and errors are in `outcome`.
//!
//! ## One attach, before the code
//!
//! 1. **Look first** (no ptrace yet). `/proc/PID/stat` and `status`: kernel
//!    threads, zombies, already-traced processes (`TracerPid`, which would
//!    make `PTRACE_SEIZE` fail with EPERM) and processes with seccomp
//!    (`Seccomp:` 1 or 2; the injected call goes through the target's
//!    filter, and a `SECCOMP_RET_KILL_PROCESS` filter killed the target
//!    when tried) are [`Outcome::Skipped`] with the reason, and so is a
//!    process in a frozen cgroup (it would only run the call when thawed).
//!    If the batch holds `madvise` calls, `/proc/PID/maps` is counted: each
//!    call may split a VMA at both ends, so the batch may add `2 × calls`
//!    VMAs, and it is refused if that could pass a fraction (default half)
//!    of `vm.max_map_count`.
//! 2. **Choose a thread** ([`choose_thread`]). `madvise` and `prctl` act on
//!    the whole `mm`, so one stopped thread is enough while the others run.
//!    Best is a thread asleep in a syscall that the kernel restarts
//!    transparently after a ptrace stop (futex, nanosleep, read on a pipe,
//!    poll: the restart table in `thread`), or one already group-stopped;
//!    then a thread running in user space (no side effect, but the stop
//!    needs an IPI: about 4× the cost); then a thread in a syscall whose
//!    behaviour is unknown (sockets with `SO_RCVTIMEO` return EINTR). Threads in
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
//!    errno 512 to the application when tried); the stack bytes under the
//!    frame go back; `PTRACE_DETACH`. The kernel's restart logic then
//!    resumes the interrupted syscall as if nothing had happened (the
//!    restart table), and a group-stopped thread goes back to its stop.
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
//! restart state), and a `SIGSTOP` that arrived during the calls is lost.
//! A thread already in `restart_syscall` when stopped, continuing a call
//! no tracer of this process had seen, is not injected into at all
//! ([`SkipReason::UnknownRestart`]): released onto its frame, nothing
//! could restart it but the kernel's own state, which `rt_sigreturn`
//! resets, so it is released untouched. (Until 2026-11-28 it was injected
//! into, and an abandoned call then ended its sleep with EINTR: the
//! frozen-target test caught a target's 5 ms nanosleep ending so, once in
//! a full run of the suite.) The tests kill the tracing process
//! at each step of an injection in turn (`PAGESIFT_INJECT_FAULT`).
//!
//! ## Never hang, never harm
//!
//! All ptrace work runs on one tracer thread owned by the [`Injector`], with
//! every signal blocked (so a signal meant for the daemon cannot kill it
//! mid-injection). If a thread does not stop within the timeout, the
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

mod calls;
mod facts;
mod fault;
mod gadgets;
mod injector;
mod outcome;
mod remote;
mod rescue;
mod session;
mod thread;
mod tracer;
mod worker;

pub use crate::proc::{map_count, max_map_count};
pub use calls::{Advice, ECANCELED, Fd, Syscall, uffd_abi};
pub use facts::map_budget;
pub use fault::{CutRule, cut_batches, cut_batches_before};
pub use gadgets::find_syscall_insn;
pub use injector::Injector;
pub use outcome::{Gone, InjectConfig, InjectError, InjectStats, Injection, Outcome, SkipReason};
pub use thread::{ThreadChoice, ThreadRank, choose_thread, rank_syscall};
