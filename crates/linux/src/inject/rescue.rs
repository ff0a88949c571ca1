//! The rescue frame: what lets a thread restore itself if its tracer dies
//! at any instant of an injection.
//!
//! Before the first call, the frame is written into the stopped thread's
//! stack below its 128-byte red zone, exactly where and as the kernel
//! would write a signal frame. Top down:
//!
//! ```text
//!   rsp ──► red zone (128 bytes, never touched)
//!           scratch (128 bytes): the calls' ioctl structs at 0, the
//!                    all-signals set at 64, the thread's own mask at 72
//!           FPU state, 64-byte aligned (XRSTOR needs it): the thread's
//!                    XSAVE area with the software bytes that tell
//!                    rt_sigreturn it holds extended state (or the bare
//!                    FXSAVE area on a CPU without XSAVE)
//!   base ──► struct rt_sigframe (16-byte aligned): pretcode = the
//!                    rt_sigreturn trampoline; ucontext = the saved
//!                    registers, mask and a pointer to the FPU state
//! ```
//!
//! Every call runs with `rsp = base`, so the `ret` after its `syscall`
//! pops `pretcode` and the trampoline's `rt_sigreturn` restores the
//! thread from the frame. The saved registers have the kernel's
//! no-handler syscall restart already applied ([`restart_applied`]):
//! `rt_sigreturn` sets `orig_rax = -1`, so without it the application
//! would see errno 512 from the call it was in. The bytes the frame
//! covers are kept ([`Rescue::old`]) and put back at the end.
//!
//! Layouts are the kernel's: `struct rt_sigframe`
//! (`arch/x86/include/asm/sigframe.h`), `struct ucontext` and its flags
//! (`arch/x86/include/uapi/asm/ucontext.h`), `struct _fpx_sw_bytes`
//! (`arch/x86/include/uapi/asm/sigcontext.h`).

use super::calls::{ERESTART_RESTARTBLOCK, ERESTARTNOHAND, ERESTARTNOINTR, ERESTARTSYS, nr};
use super::gadgets::Gadgets;
use super::outcome::SkipReason;
use super::remote::{read_remote, write_remote};
use crate::ptrace::Regs;

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
pub(super) const SCRATCH_ALL_SIGNALS: u64 = 64;
pub(super) const SCRATCH_OWN_MASK: u64 = 72;
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
/// `restart_syscall` (known only if this tracer saw it before; when it is
/// not, the session releases the thread untouched instead,
/// `SkipReason::UnknownRestart`).
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
pub(super) struct Rescue {
    /// The frame's first byte: `rsp` while a call is injected (the `ret`
    /// pops `pretcode`).
    pub(super) base: u64,
    /// Scratch memory for the calls' structs.
    pub(super) scratch: u64,
    /// `[base, rsp - red zone)` as it was, put back at the end.
    pub(super) old: Vec<u8>,
}

impl Rescue {
    /// Lays the frame out for `regs`, reads what is there and writes the
    /// frame; `None` if that stack memory is not readable and writable.
    pub(super) fn install(
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
    pub(super) fn sigreturn_regs(&self, saved: &Regs, g: &Gadgets) -> Regs {
        let mut r = *saved;
        r.rip = g.sigreturn;
        r.rsp = self.base + 8;
        r.orig_rax = u64::MAX;
        r
    }
}
