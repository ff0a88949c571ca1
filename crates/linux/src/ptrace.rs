//! ptrace and wait primitives for remote syscall injection
//! ([`crate::inject`]), x86-64 only.
//!
//! Most requests go through `nix`'s safe wrappers. Three cannot, because
//! `nix::sys::signal::Signal` has no real-time signals (`SIGRTMIN..`),
//! which a stopped tracee may well have received (glibc's timers and thread
//! cancellation use them): `PTRACE_SINGLESTEP` and `PTRACE_DETACH` with a
//! signal to deliver, and `tgkill`. Those are raw `libc` calls here, each
//! with a `// SAFETY:` comment. For the same reason waiting does not use
//! nix's decoder (it fails with `EINVAL` on a stop by a real-time signal):
//! [`wait_nohang`] calls `rustix`'s `waitid`/`waitpid` with `__WALL` (a
//! seized thread that is not its process's leader reports only to `__WALL`
//! waits) and decodes the raw status itself ([`Stop::decode`]).
//!
//! Every function takes a thread id. Errors are the OS's: `ESRCH` means the
//! thread is gone or not stopped, `EPERM` that it cannot be traced.
#![allow(unsafe_code)]

use nix::sys::ptrace as np;
use nix::unistd::Pid;
use std::io;

/// The general-purpose registers of a stopped tracee (`PTRACE_GETREGS`),
/// including `orig_rax`, the syscall number the kernel's restart logic looks
/// at.
pub type Regs = libc::user_regs_struct;

/// `PTRACE_EVENT_STOP` (`<linux/ptrace.h>`): the event of an interrupt stop
/// or, for a seized tracee, of a group-stop.
pub const PTRACE_EVENT_STOP: i32 = 128;

fn pid(tid: u32) -> Pid {
    Pid::from_raw(tid as i32)
}

/// `PTRACE_SEIZE` with `PTRACE_O_TRACESYSGOOD` (syscall stops report
/// `SIGTRAP | 0x80`, [`Stop::Syscall`], never confused with a real
/// SIGTRAP): the thread keeps running until [`interrupt`]. Deliberately no
/// `PTRACE_O_EXITKILL`: if the tracer dies the tracee must survive
/// (docs/reliability.md).
pub fn seize(tid: u32) -> io::Result<()> {
    np::seize(pid(tid), np::Options::PTRACE_O_TRACESYSGOOD).map_err(io::Error::from)
}

/// `PTRACE_INTERRUPT`: asks a seized thread to enter a ptrace-stop; the stop
/// is then reported by [`wait_nohang`].
pub fn interrupt(tid: u32) -> io::Result<()> {
    np::interrupt(pid(tid)).map_err(io::Error::from)
}

/// `PTRACE_GETREGS`.
pub fn get_regs(tid: u32) -> io::Result<Regs> {
    np::getregs(pid(tid)).map_err(io::Error::from)
}

/// `PTRACE_SETREGS`.
pub fn set_regs(tid: u32, regs: &Regs) -> io::Result<()> {
    np::setregs(pid(tid), *regs).map_err(io::Error::from)
}

/// `PTRACE_GETSIGINFO`: the siginfo of the signal that caused the current
/// stop.
pub fn get_siginfo(tid: u32) -> io::Result<libc::siginfo_t> {
    np::getsiginfo(pid(tid)).map_err(io::Error::from)
}

/// `PTRACE_SETSIGINFO`: replaces the siginfo of the current stop; a signal
/// passed to the next restart with the same number keeps this siginfo.
pub fn set_siginfo(tid: u32, info: &libc::siginfo_t) -> io::Result<()> {
    np::setsiginfo(pid(tid), info).map_err(io::Error::from)
}

fn check(ret: libc::c_long) -> io::Result<()> {
    if ret == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// `PTRACE_SINGLESTEP`, delivering signal `sig` (0 for none).
pub fn single_step(tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: PTRACE_SINGLESTEP reads no memory of ours: `addr` is ignored
    // and `data` is a signal number passed by value (the kernel checks it is
    // a valid signal). The call cannot affect this process's memory.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_SINGLESTEP,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            sig as libc::c_long as *mut libc::c_void,
        )
    })
}

/// `PTRACE_SYSCALL`: resume until the next syscall entry or exit
/// ([`Stop::Syscall`]), delivering signal `sig` (0 for none). Unlike
/// `PTRACE_SINGLESTEP` it sets no trap flag in the thread: a tracer that
/// dies leaves nothing behind (the kernel clears the syscall-trace work
/// when it unlinks the tracee).
pub fn syscall(tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: as for PTRACE_SINGLESTEP: `addr` is ignored and `data` is a
    // signal number by value; no memory of ours is read or written.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_SYSCALL,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            sig as libc::c_long as *mut libc::c_void,
        )
    })
}

/// `PTRACE_CONT`, delivering signal `sig` (0 for none).
pub fn cont(tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: as for PTRACE_SINGLESTEP: `addr` is ignored and `data` is a
    // signal number by value; no memory of ours is read or written.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_CONT,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            sig as libc::c_long as *mut libc::c_void,
        )
    })
}

/// `PTRACE_GETREGSET(NT_X86_XSTATE)`: the thread's extended FPU state in
/// the standard (non-compacted) XSAVE layout, as long as the kernel's user
/// buffer (`fpu_user_cfg.max_size`). Bytes 464..472 hold the XCR0 value.
/// On a CPU without XSAVE (QEMU's TCG default CPU, say) the kernel has no
/// such regset and answers `ENODEV`: see [`get_fxstate`].
pub fn get_xstate(tid: u32) -> io::Result<Vec<u8>> {
    const NT_X86_XSTATE: libc::c_long = 0x202;
    get_regset(tid, NT_X86_XSTATE, 32 * 1024)
}

/// `PTRACE_GETREGSET(NT_PRFPREG)`: the thread's x87 and SSE state in the
/// 512-byte `FXSAVE` layout (`struct user_i387_struct`), which every
/// x86-64 CPU has.
pub fn get_fxstate(tid: u32) -> io::Result<Vec<u8>> {
    const NT_PRFPREG: libc::c_long = 2;
    get_regset(tid, NT_PRFPREG, 512)
}

fn get_regset(tid: u32, note: libc::c_long, max: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; max];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the kernel writes at most `iov_len` bytes to `iov_base`, which
    // points into `buf` (alive and exclusively borrowed for the call), and
    // then shrinks `iov_len` to what it wrote; `iov` lives on our stack.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_GETREGSET,
            tid as libc::pid_t,
            note as *mut libc::c_void,
            (&mut iov as *mut libc::iovec).cast::<libc::c_void>(),
        )
    })?;
    let n = iov.iov_len.min(buf.len());
    buf.truncate(n);
    Ok(buf)
}

/// `PTRACE_DETACH`, delivering signal `sig` (0 for none) if the tracee is in
/// a signal-delivery-stop.
pub fn detach(tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: as for PTRACE_SINGLESTEP: `addr` is ignored and `data` is a
    // signal number by value; no memory of ours is read or written.
    check(unsafe {
        libc::ptrace(
            libc::PTRACE_DETACH,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            sig as libc::c_long as *mut libc::c_void,
        )
    })
}

/// Whether the stopped thread `tid` runs under a seccomp filter, asked with
/// `PTRACE_SECCOMP_GET_FILTER` for the length of its first filter: `EINVAL`
/// means it is not in filter mode (none, or strict mode, which only
/// `/proc/PID/status` shows), a length or `EMEDIUMTYPE` (filter kept without
/// its original program) means a filter. `None` if it cannot tell (the
/// caller lacks `CAP_SYS_ADMIN`, or is itself under seccomp).
pub fn has_seccomp_filter(tid: u32) -> io::Result<Option<bool>> {
    // PTRACE_SECCOMP_GET_FILTER (<linux/ptrace.h>).
    const PTRACE_SECCOMP_GET_FILTER: libc::c_uint = 0x420c;
    // SAFETY: with `data` NULL the kernel only returns the filter's length
    // and writes nothing; `addr` is the filter index, by value.
    let ret = unsafe {
        libc::ptrace(
            PTRACE_SECCOMP_GET_FILTER,
            tid as libc::pid_t,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_void>(),
        )
    };
    if ret >= 0 {
        return Ok(Some(true));
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EINVAL) => Ok(Some(false)),
        Some(libc::EMEDIUMTYPE) => Ok(Some(true)),
        Some(libc::EACCES) => Ok(None),
        _ => Err(e),
    }
}

/// The address of the thread's registered `struct rseq`
/// (`PTRACE_GET_RSEQ_CONFIGURATION`, Linux 5.13+), or `None` if it has
/// none (or the kernel cannot say: older kernels answer EIO).
pub fn rseq_area(tid: u32) -> io::Result<Option<u64>> {
    // <linux/ptrace.h>.
    const PTRACE_GET_RSEQ_CONFIGURATION: libc::c_uint = 0x420f;
    /// `struct ptrace_rseq_configuration`.
    #[repr(C)]
    #[derive(Default)]
    struct Conf {
        rseq_abi_pointer: u64,
        rseq_abi_size: u32,
        signature: u32,
        flags: u32,
        pad: u32,
    }
    let mut conf = Conf::default();
    // SAFETY: the kernel copies at most `addr` bytes, the size of `conf`,
    // into `conf`, which lives on this frame for the whole call.
    let ret = unsafe {
        libc::ptrace(
            PTRACE_GET_RSEQ_CONFIGURATION,
            tid as libc::pid_t,
            std::mem::size_of::<Conf>(),
            &mut conf as *mut Conf,
        )
    };
    if ret < 0 {
        let e = io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EIO) => Ok(None),
            _ => Err(e),
        };
    }
    Ok((conf.rseq_abi_pointer != 0).then_some(conf.rseq_abi_pointer))
}

/// `tgkill(tgid, tid, sig)`: sends `sig` to one thread of a process.
pub fn tgkill(tgid: u32, tid: u32, sig: i32) -> io::Result<()> {
    // SAFETY: a raw syscall taking three integers by value; it touches no
    // memory of this process.
    check(unsafe {
        libc::syscall(
            libc::SYS_tgkill,
            tgid as libc::c_long,
            tid as libc::c_long,
            sig as libc::c_long,
        )
    })
}

/// What a wait reported about a traced thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stop {
    /// The thread exited (its exit code; for a thread killed by its
    /// process's exit, the process's code).
    Exited(i32),
    /// The thread was killed by this signal.
    Killed(i32),
    /// A signal-delivery-stop: the signal has been dequeued and is delivered
    /// only if the tracer passes it to the next restart.
    Signal(i32),
    /// A syscall-entry or syscall-exit stop after `PTRACE_SYSCALL` (with
    /// `PTRACE_O_TRACESYSGOOD`: `SIGTRAP | 0x80`).
    Syscall,
    /// A `PTRACE_EVENT_*` stop; for a seized thread `PTRACE_EVENT_STOP` is an
    /// interrupt stop (`sig` = SIGTRAP) or a group-stop (`sig` = the stop
    /// signal).
    Event {
        /// The signal part of the status.
        sig: i32,
        /// The event (`status >> 16`).
        event: i32,
    },
}

impl Stop {
    /// Decodes a raw `wait` status.
    pub fn decode(status: i32) -> Stop {
        if libc::WIFEXITED(status) {
            Stop::Exited(libc::WEXITSTATUS(status))
        } else if libc::WIFSIGNALED(status) {
            Stop::Killed(libc::WTERMSIG(status))
        } else {
            let sig = libc::WSTOPSIG(status);
            let event = (status >> 16) & 0xffff;
            if event == 0 && sig == libc::SIGTRAP | 0x80 {
                Stop::Syscall
            } else if event == 0 {
                Stop::Signal(sig)
            } else {
                Stop::Event { sig, event }
            }
        }
    }

    /// Whether the thread no longer exists.
    pub fn is_exit(self) -> bool {
        matches!(self, Stop::Exited(_) | Stop::Killed(_))
    }
}

/// The thread's next stop or exit (`__WALL`, without blocking), or `None`
/// if nothing is pending.
///
/// Stops are consumed. An exit report is consumed only if `reap_exit`:
/// consuming it lets the target's real parent see the exit, but when the
/// tracer's process *is* the real parent and the thread is the process's
/// leader, consuming it would reap the whole child and steal its exit
/// status from whoever waits for it. So the report is first peeked at with
/// `waitid(WNOWAIT)`.
pub fn wait_nohang(tid: u32, reap_exit: bool) -> io::Result<Option<Stop>> {
    use rustix::process::{Pid as RPid, WaitId, WaitIdOptions, WaitOptions, waitid, waitpid};
    let p = RPid::from_raw(tid as i32).ok_or_else(|| io::Error::from_raw_os_error(libc::EINVAL))?;
    let all = libc::__WALL as u32;
    let peek = WaitIdOptions::EXITED
        | WaitIdOptions::STOPPED
        | WaitIdOptions::NOHANG
        | WaitIdOptions::NOWAIT
        | WaitIdOptions::from_bits_retain(all);
    let info = loop {
        match waitid(WaitId::Pid(p), peek) {
            Ok(info) => break info,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let Some(info) = info else {
        return Ok(None);
    };
    if (info.exited() || info.killed() || info.dumped()) && !reap_exit {
        return Ok(Some(match info.exit_status() {
            Some(code) => Stop::Exited(code),
            None => Stop::Killed(info.terminating_signal().unwrap_or(0)),
        }));
    }
    let opts = WaitOptions::NOHANG | WaitOptions::from_bits_retain(all);
    loop {
        match waitpid(Some(p), opts) {
            Ok(None) => return Ok(None),
            Ok(Some((_, status))) => return Ok(Some(Stop::decode(status.as_raw()))),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_decode() {
        // Raw statuses as the kernel builds them (wait(2), ptrace(2)).
        assert_eq!(Stop::decode(3 << 8), Stop::Exited(3));
        assert_eq!(Stop::decode(libc::SIGKILL), Stop::Killed(libc::SIGKILL));
        let stopped = |sig: i32| (sig << 8) | 0x7f;
        assert_eq!(Stop::decode(stopped(libc::SIGTRAP)), Stop::Signal(5));
        // Real-time signals decode (nix's decoder rejects them).
        assert_eq!(
            Stop::decode(stopped(libc::SIGRTMIN() + 2)),
            Stop::Signal(libc::SIGRTMIN() + 2)
        );
        assert_eq!(
            Stop::decode(stopped(libc::SIGTRAP) | (PTRACE_EVENT_STOP << 16)),
            Stop::Event {
                sig: libc::SIGTRAP,
                event: PTRACE_EVENT_STOP
            }
        );
        assert_eq!(Stop::decode(stopped(libc::SIGTRAP | 0x80)), Stop::Syscall);
        assert!(Stop::decode(0).is_exit());
        assert!(!Stop::decode(stopped(libc::SIGSTOP)).is_exit());
    }
}
