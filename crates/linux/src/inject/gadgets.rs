//! The two pieces of the target's own code an injection runs on.
//!
//! - A `syscall; ret` sequence (`0f 05 c3`): each injected call runs from
//!   it, with `rsp` on the rescue frame, so the `ret` takes a thread
//!   released mid-call straight into the frame's return address.
//! - An `rt_sigreturn` trampoline (`mov $15, %rax; syscall`, or the shorter
//!   `mov $15, %eax; syscall`: glibc's and musl's `__restore_rt`, Go's
//!   `runtime.sigreturn`): the frame's return address, which restores the
//!   thread's registers, mask and FPU state from the frame.
//!
//! They are searched in the executable mappings of `/proc/PID/maps`, the C
//! library first (glibc has both), then the dynamic loader, then the rest,
//! with `process_vm_readv` in 1 MiB chunks, at most 256 MiB per process.
//! The tracer caches them per process (pid and start time) and checks
//! that the bytes are still there on every attach ([`Gadgets::intact`]):
//! code can be unmapped or replaced between two attaches. A process
//! without both is skipped, never injected.

use super::remote::read_remote;

/// `syscall; ret`.
const CALL_RET: [u8; 3] = [0x0f, 0x05, 0xc3];
/// `mov $15, %rax; syscall`: `rt_sigreturn` (glibc's and musl's
/// `__restore_rt`, Go's `runtime.sigreturn`).
const SIGRETURN_RAX: [u8; 9] = [0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05];
/// `mov $15, %eax; syscall`: the same, shorter.
const SIGRETURN_EAX: [u8; 7] = [0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05];

/// Two pieces of the target's own executable memory the injection runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Gadgets {
    /// A `syscall; ret` sequence: each injected call runs here, and the
    /// `ret` takes the thread to `sigreturn` if nobody stops it first.
    pub(super) call: u64,
    /// A `mov $15, %rax; syscall` (`rt_sigreturn`) sequence.
    pub(super) sigreturn: u64,
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

fn bytes_at(pid: u32, addr: u64, want: &[u8]) -> bool {
    let mut b = vec![0u8; want.len()];
    read_remote(pid, addr, &mut b).is_ok() && b == want
}

impl Gadgets {
    /// Looks for both sequences in the executable mappings of `pid`: the C
    /// library first (glibc has both), then the dynamic loader, then the
    /// rest, at most 256 MiB read.
    pub(super) fn find(pid: u32) -> Option<Gadgets> {
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
    pub(super) fn intact(&self, pid: u32) -> bool {
        let sr: &[u8] = if self.sigreturn_len == SIGRETURN_RAX.len() {
            &SIGRETURN_RAX
        } else {
            &SIGRETURN_EAX
        };
        bytes_at(pid, self.call, &CALL_RET) && bytes_at(pid, self.sigreturn, sr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_instruction_is_found() {
        assert_eq!(find_syscall_insn(&[0x90, 0x0f, 0x05, 0xc3]), Some(1));
        assert_eq!(find_syscall_insn(&[0x0f, 0x0f, 0x0f]), None);
        assert_eq!(find_syscall_insn(&[]), None);
    }
}
