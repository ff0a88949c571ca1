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
//! They are searched in the executable mappings of the process (asked of
//! the kernel with `PROCMAP_QUERY`, or read from `/proc/PID/maps` on a
//! kernel before 6.11), the C library first (glibc has both), then the
//! dynamic loader, then the rest, with `process_vm_readv` in 1 MiB chunks,
//! at most 256 MiB per process.
//! The tracer caches them per process (pid and start time) and checks
//! that the bytes are still there on every attach ([`Gadgets::intact`]):
//! code can be unmapped or replaced between two attaches. A process
//! without both is skipped, never injected.
//!
//! A search reads up to a few MiB (about 30 ms a process, measured on the
//! 2-core development machine), but most processes map the same C
//! library: a gadget found in a file mapping remembers where it sits in
//! that file (device, inode, file offset), and a new process that maps
//! the same file executable is first tried at the matching address
//! ([`Gadgets::find_like`]), its bytes checked, before any search.

use super::remote::read_remote;
use crate::sys::QueriedVma;

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
    /// Where each was found in a file, if it was in a file mapping.
    call_file: Option<FilePlace>,
    sigreturn_file: Option<FilePlace>,
}

/// A place in a mapped file: its device and inode (as `/proc/PID/maps`
/// prints them) and the byte offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FilePlace {
    dev: u64,
    inode: u64,
    offset: u64,
}

/// One executable mapping of `/proc/PID/maps`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ExecMap {
    start: u64,
    end: u64,
    /// File offset of `start`.
    offset: u64,
    /// `(device, inode)`, or `None` for anonymous memory.
    file: Option<(u64, u64)>,
    /// Search order: the C library, then the loader, then the rest.
    order: u8,
}

impl ExecMap {
    /// The file place of `addr` inside this mapping.
    fn place(&self, addr: u64) -> Option<FilePlace> {
        let (dev, inode) = self.file?;
        Some(FilePlace {
            dev,
            inode,
            offset: self.offset + (addr - self.start),
        })
    }

    /// The address of file place `p` in this mapping, if it maps it.
    fn address(&self, p: FilePlace) -> Option<u64> {
        if self.file != Some((p.dev, p.inode)) || p.offset < self.offset {
            return None;
        }
        let addr = self.start + (p.offset - self.offset);
        (addr < self.end).then_some(addr)
    }
}

/// The executable mappings of `pid` (`[vsyscall]` left out), in search
/// order: asked of the kernel one by one ([`crate::vma_query`]), so the
/// cost does not grow with the process's other VMAs, or read from the
/// text of `/proc/PID/maps` on a kernel without `PROCMAP_QUERY`.
fn exec_maps(pid: u32) -> Option<Vec<ExecMap>> {
    let mut exec: Vec<ExecMap> = match crate::vma_query::executable_vmas(pid) {
        Ok(Some(vmas)) => vmas.iter().filter_map(queried_exec_map).collect(),
        Ok(None) => {
            let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).ok()?;
            maps.lines().filter_map(parse_exec_map).collect()
        }
        Err(_) => return None,
    };
    exec.sort_by_key(|m| m.order);
    Some(exec)
}

/// A queried executable VMA as an [`ExecMap`].
fn queried_exec_map(v: &QueriedVma) -> Option<ExecMap> {
    if v.name == "[vsyscall]" {
        return None;
    }
    Some(ExecMap {
        start: v.start,
        end: v.end,
        offset: v.offset,
        file: (v.inode != 0).then_some(((u64::from(v.dev.0) << 32) | u64::from(v.dev.1), v.inode)),
        order: search_order(&v.name),
    })
}

/// Where a mapping named `name` comes in the search: the C library, then
/// the loader, then the rest.
fn search_order(name: &str) -> u8 {
    if name.contains("libc") {
        0
    } else if name.contains("ld-") {
        1
    } else {
        2
    }
}

/// One line of `/proc/PID/maps`, if it is an executable mapping:
/// `start-end perms offset major:minor inode [path]`.
fn parse_exec_map(line: &str) -> Option<ExecMap> {
    let mut f = line.split_whitespace();
    let (s, e) = f.next()?.split_once('-')?;
    let perms = f.next()?;
    let offset = u64::from_str_radix(f.next()?, 16).ok()?;
    let (major, minor) = f.next()?.split_once(':')?;
    let inode: u64 = f.next()?.parse().ok()?;
    let name = f.next().unwrap_or("");
    if !perms.contains('x') || name == "[vsyscall]" {
        return None;
    }
    let dev = (u64::from_str_radix(major, 16).ok()? << 32) | u64::from_str_radix(minor, 16).ok()?;
    let order = search_order(name);
    Some(ExecMap {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        offset,
        file: (inode != 0).then_some((dev, inode)),
        order,
    })
}

/// Most distinct file places [`Gadgets::find_like`] tries before a search.
const LIKE_TRIES: usize = 8;

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
        let exec = exec_maps(pid)?;
        const CHUNK: u64 = 1 << 20;
        let mut budget: u64 = 256 << 20;
        let (mut call, mut sigreturn) = (None, None);
        let mut buf = vec![0u8; CHUNK as usize + 16];
        for m in &exec {
            let mut at = m.start;
            while at < m.end && budget > 0 {
                let n = (m.end - at).min(CHUNK + 16);
                let b = &mut buf[..n as usize];
                if read_remote(pid, at, b).is_err() {
                    break;
                }
                budget = budget.saturating_sub(n);
                if call.is_none() {
                    call = find(b, &CALL_RET).map(|o| (at + o as u64, m.place(at + o as u64)));
                }
                if sigreturn.is_none() {
                    sigreturn = find(b, &SIGRETURN_RAX)
                        .map(|o| (at + o as u64, SIGRETURN_RAX.len()))
                        .or_else(|| {
                            find(b, &SIGRETURN_EAX).map(|o| (at + o as u64, SIGRETURN_EAX.len()))
                        })
                        .map(|(a, len)| (a, len, m.place(a)));
                }
                if let (Some((call, call_file)), Some((sigreturn, sigreturn_len, sigreturn_file))) =
                    (call, sigreturn)
                {
                    return Some(Gadgets {
                        call,
                        sigreturn,
                        sigreturn_len,
                        call_file,
                        sigreturn_file,
                    });
                }
                at += CHUNK;
            }
        }
        None
    }

    /// The gadgets of `pid` at the file places where they were found in
    /// other processes (`known`, both in file mappings), if `pid` maps
    /// those files executable there and the bytes are in place: the first
    /// of at most [`LIKE_TRIES`] distinct places that fits. `None` means
    /// search.
    pub(super) fn find_like<'a>(
        pid: u32,
        known: impl IntoIterator<Item = &'a Gadgets>,
    ) -> Option<Gadgets> {
        let mut tried: Vec<(FilePlace, FilePlace)> = Vec::new();
        let mut exec: Option<Vec<ExecMap>> = None;
        for k in known {
            let (Some(cf), Some(sf)) = (k.call_file, k.sigreturn_file) else {
                continue;
            };
            if tried.contains(&(cf, sf)) {
                continue;
            }
            if tried.len() == LIKE_TRIES {
                break;
            }
            tried.push((cf, sf));
            let maps = exec.get_or_insert_with(|| exec_maps(pid).unwrap_or_default());
            let (Some(call), Some(sigreturn)) = (
                maps.iter().find_map(|m| m.address(cf)),
                maps.iter().find_map(|m| m.address(sf)),
            ) else {
                continue;
            };
            let g = Gadgets {
                call,
                sigreturn,
                ..*k
            };
            if g.intact(pid) {
                return Some(g);
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
    fn maps_lines_give_file_places() {
        let libc = "7f0000001000-7f0000003000 r-xp 00028000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6";
        let m = parse_exec_map(libc).unwrap();
        assert_eq!((m.order, m.file), (0, Some(((0xfd << 32) | 1, 1234))));
        let p = m.place(0x7f0000001010).unwrap();
        assert_eq!(p.offset, 0x28010);
        // The same file mapped elsewhere in another process.
        let other = parse_exec_map(
            "55aa00000000-55aa00002000 r-xp 00028000 fd:01 1234 /usr/lib/x86_64-linux-gnu/libc.so.6",
        )
        .unwrap();
        assert_eq!(other.address(p), Some(0x55aa00000010));
        // Another file, or a range that does not cover the offset.
        let ld = parse_exec_map(
            "7f0000005000-7f0000006000 r-xp 00001000 fd:01 99 /usr/lib/ld-linux-x86-64.so.2",
        )
        .unwrap();
        assert_eq!(ld.order, 1);
        assert_eq!(ld.address(p), None);
        let short =
            parse_exec_map("7f0000001000-7f0000001010 r-xp 00028000 fd:01 1234 /x/libc.so.6")
                .unwrap();
        assert_eq!(short.address(p), None);
        // Not executable, the vsyscall page, anonymous code.
        assert!(parse_exec_map("7f0000001000-7f0000003000 r--p 00000000 fd:01 1234 /x").is_none());
        assert!(
            parse_exec_map("ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]")
                .is_none()
        );
        let anon = parse_exec_map("7f0000009000-7f000000a000 r-xp 00000000 00:00 0").unwrap();
        assert_eq!((anon.file, anon.order), (None, 2));
    }

    #[test]
    fn syscall_instruction_is_found() {
        assert_eq!(find_syscall_insn(&[0x90, 0x0f, 0x05, 0xc3]), Some(1));
        assert_eq!(find_syscall_insn(&[0x0f, 0x0f, 0x0f]), None);
        assert_eq!(find_syscall_insn(&[]), None);
    }
}
