//! Reading another process's pages, by two paths.
//!
//! **Pinned: `process_vm_readv`.** The cost of a remote read is per page
//! (pinning it, about 0.45–0.5 µs), not per byte, so pagesift copies whole
//! pages: gathering a few bytes per page is no faster (measured here).
//! What matters is the number of syscalls: pages with contiguous addresses
//! are coalesced into one remote iovec, and up to `IOV_MAX` (1024) remote
//! iovecs go into one call. The local side is always a single iovec,
//! because the output pages are one contiguous slice.
//!
//! **Unpinned: `/proc/PID/mem`.** `process_vm_readv` pins the target's
//! pages (`FOLL_PIN`), and since Linux 5.19 a read-only pin of an anonymous
//! page that is not exclusive to the process *unshares* it first: the
//! kernel copies the page in the target, as a write fault would. Measured
//! here: reading a fork parent's 1024 pages, of which 930 were shared with
//! its children, left all 1024 exclusive, i.e. it allocated 930 new frames
//! in the target and broke the sharing (a KSM page is unshared the same
//! way, so a read would undo a merge). `/proc/PID/mem` takes plain page
//! references (`FOLL_GET`), which never unshare, at about half the speed
//! (1.2–1.3 M pages/s for 4 MiB reads, 0.8 M/s page by page, measured
//! here). So the pinned path is only for pages pagemap shows *exclusively
//! mapped* (bit 56) that are not KSM pages; every other present page goes
//! through the unpinned path. [`safe_to_pin`] is that rule.
//!
//! **Only present pages may be read, by either path.** The kernel resolves
//! a remote read like a read fault: an untouched anonymous page gets the
//! zero page mapped and page tables allocated *in the target* (verified on
//! this machine). [`RemoteReader`] does not check presence itself (its
//! callers do it in bulk from pagemap, see [`crate::LinuxSource`]); its
//! contract is that every address handed to it was seen present (and,
//! for the pinned path, exclusive).
//!
//! A read stops at the first page that cannot be read (unmapped since it
//! was inspected): the read functions return how many leading pages were
//! read. A target that exited gives [`LinuxError::Gone`]. Both the `mem`
//! file and pagemap pin the target's `mm` when opened, so a reused pid
//! cannot be read by mistake through them.
//!
//! Both paths mark what they read used in the kernel's LRU; when
//! [`crate::read_record`] is on, every read is noted there first, so that
//! that activity is not taken for the process's own.
//!
//! [`PageBuffer`] holds page-aligned pages viewable as
//! [`PageWords`], for callers that want reads to
//! land on page boundaries (the kernel's copy is fastest then).

use crate::caps::Capability;
use crate::error::{LinuxError, WHY_PTRACE, libc_errno};
use crate::proc::PTRACE;
use nix::sys::uio::{RemoteIoVec, process_vm_readv};
use nix::unistd::Pid;
use pagesift_core::{PAGE_SIZE, PageWords};
use std::fs::File;
use std::io::IoSliceMut;
use std::os::unix::fs::FileExt;

/// Whether a page may be read through the pinned path without the kernel
/// unsharing (copying) it in the target: present, mapped by this process
/// only, and not a KSM page. `ksm` is the page's KSM bit if known; pass
/// `true` when unknown in a `VM_MERGEABLE` region.
pub fn safe_to_pin(entry: crate::pagemap::PagemapEntry, ksm: bool) -> bool {
    entry.present() && !entry.swapped() && entry.exclusive() && !ksm
}

pub use pagesift_core::PageBuffer;

/// Most pages per `process_vm_readv` call: bounds the work redone when a
/// call reads short (16 MiB).
const MAX_PAGES_PER_CALL: usize = 4096;

/// Reads pages of one process.
#[derive(Debug)]
pub struct RemoteReader {
    pid: u32,
    mem: File,
    iov_max: usize,
    remote: Vec<RemoteIoVec>,
    calls: u64,
}

impl RemoteReader {
    /// A reader for `pid` (never pagesift's own process). Opens
    /// `/proc/PID/mem`, which needs the same access as `process_vm_readv`
    /// (ptrace attach: `CAP_SYS_PTRACE` for other users' processes).
    pub fn new(pid: u32) -> Result<RemoteReader, LinuxError> {
        if pid == crate::own_pid() {
            return Err(LinuxError::OwnProcess(pid));
        }
        let mem = File::open(format!("/proc/{pid}/mem"))
            .map_err(|e| crate::proc::error(pid, e, "opening /proc/PID/mem", PTRACE))?;
        Ok(RemoteReader {
            pid,
            mem,
            iov_max: crate::sys::iov_max(),
            remote: Vec::new(),
            calls: 0,
        })
    }

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Syscalls made so far (both paths).
    pub fn calls(&self) -> u64 {
        self.calls
    }

    /// Pinned path: reads the pages at the page-aligned addresses `addrs`
    /// into `out[..addrs.len()]` with `process_vm_readv`. Every page must
    /// satisfy [`safe_to_pin`] (see the module comment). Returns how many
    /// leading pages were read; fewer than `addrs.len()` means page `n`
    /// could not be read (it was unmapped since).
    pub fn read_pages(
        &mut self,
        addrs: &[u64],
        out: &mut [PageWords],
    ) -> Result<usize, LinuxError> {
        assert!(
            out.len() >= addrs.len(),
            "output shorter than the address list"
        );
        let mut done = 0;
        while done < addrs.len() {
            // One call: up to IOV_MAX runs of contiguous pages.
            self.remote.clear();
            let mut n = 0;
            while done + n < addrs.len() && n < MAX_PAGES_PER_CALL {
                let a = addrs[done + n];
                debug_assert_eq!(a % PAGE_SIZE as u64, 0, "unaligned page address");
                let full = self.remote.len() == self.iov_max;
                match self.remote.last_mut() {
                    Some(r) if (r.base + r.len) as u64 == a => r.len += PAGE_SIZE,
                    _ if full => break,
                    _ => self.remote.push(RemoteIoVec {
                        base: a as usize,
                        len: PAGE_SIZE,
                    }),
                }
                n += 1;
            }
            let got = self.call(&mut out[done..done + n])?;
            done += got;
            if got < n {
                // Short: retry from the first unread page alone to tell an
                // unreadable page from a call cut short.
                self.remote.clear();
                self.remote.push(RemoteIoVec {
                    base: addrs[done] as usize,
                    len: PAGE_SIZE,
                });
                if self.call(&mut out[done..done + 1])? == 0 {
                    return Ok(done);
                }
                done += 1;
            }
        }
        Ok(done)
    }

    /// Pinned path for `out.len()` contiguous pages starting at `start`,
    /// all satisfying [`safe_to_pin`]. Returns how many leading pages were
    /// read.
    pub fn read_range(&mut self, start: u64, out: &mut [PageWords]) -> Result<usize, LinuxError> {
        let mut done = 0;
        while done < out.len() {
            let n = (out.len() - done).min(MAX_PAGES_PER_CALL);
            self.remote.clear();
            self.remote.push(RemoteIoVec {
                base: (start + (done * PAGE_SIZE) as u64) as usize,
                len: n * PAGE_SIZE,
            });
            let got = self.call(&mut out[done..done + n])?;
            done += got;
            if got < n {
                return Ok(done);
            }
        }
        Ok(done)
    }

    /// Unpinned path: like [`read_pages`](Self::read_pages) through
    /// `/proc/PID/mem`, for any present page (shared after fork, KSM, or
    /// not known to be exclusive). One `pread` per run of contiguous pages.
    pub fn read_pages_unpinned(
        &mut self,
        addrs: &[u64],
        out: &mut [PageWords],
    ) -> Result<usize, LinuxError> {
        assert!(
            out.len() >= addrs.len(),
            "output shorter than the address list"
        );
        let mut done = 0;
        while done < addrs.len() {
            let mut n = 1;
            while done + n < addrs.len()
                && n < MAX_PAGES_PER_CALL
                && addrs[done + n] == addrs[done] + (n * PAGE_SIZE) as u64
            {
                n += 1;
            }
            let got = self.read_range_unpinned(addrs[done], &mut out[done..done + n])?;
            done += got;
            if got < n {
                return Ok(done);
            }
        }
        Ok(done)
    }

    /// Unpinned path for `out.len()` contiguous present pages from `start`.
    pub fn read_range_unpinned(
        &mut self,
        start: u64,
        out: &mut [PageWords],
    ) -> Result<usize, LinuxError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        crate::read_record::note(self.pid, start, start + bytes.len() as u64);
        let mut done = 0;
        while done < bytes.len() {
            self.calls += 1;
            match self.mem.read_at(&mut bytes[done..], start + done as u64) {
                // The mm is gone (the process exited).
                Ok(0) => return Err(LinuxError::Gone(self.pid)),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                // Nothing mapped at the address (any more).
                Err(e) if e.raw_os_error() == Some(libc_errno::EIO) => break,
                Err(e) => {
                    return Err(LinuxError::from_process_op(
                        self.pid,
                        e,
                        "reading /proc/PID/mem",
                        Capability::SysPtrace,
                        WHY_PTRACE,
                    ));
                }
            }
        }
        Ok(done / PAGE_SIZE)
    }

    /// One `process_vm_readv` of `self.remote` into `out`; whole pages read.
    fn call(&mut self, out: &mut [PageWords]) -> Result<usize, LinuxError> {
        crate::read_record::note_all(
            self.pid,
            (self.remote.iter()).map(|r| (r.base as u64, (r.base + r.len) as u64)),
        );
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let mut local = [IoSliceMut::new(bytes)];
        let pid = Pid::from_raw(self.pid as i32);
        loop {
            self.calls += 1;
            match process_vm_readv(pid, &mut local, &self.remote) {
                Ok(n) => return Ok(n / PAGE_SIZE),
                Err(nix::errno::Errno::EINTR) => continue,
                // The first remote page is not mapped (any more).
                Err(nix::errno::Errno::EFAULT) => return Ok(0),
                Err(e) => {
                    let e = std::io::Error::from_raw_os_error(e as i32);
                    if e.raw_os_error() == Some(libc_errno::ESRCH) {
                        return Err(LinuxError::Gone(self.pid));
                    }
                    return Err(LinuxError::from_process_op(
                        self.pid,
                        e,
                        "reading memory (process_vm_readv)",
                        Capability::SysPtrace,
                        WHY_PTRACE,
                    ));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_refused() {
        assert!(matches!(
            RemoteReader::new(crate::own_pid()),
            Err(LinuxError::OwnProcess(_))
        ));
    }
}
