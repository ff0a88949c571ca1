//! `/proc/PID/pagemap`: per virtual page, is it present, and which frame?
//!
//! pagemap holds one 64-bit entry per virtual page
//! (Documentation/admin-guide/mm/pagemap.rst):
//!
//! | bits | meaning |
//! |---|---|
//! | 0–54 | PFN if present (0 without `CAP_SYS_ADMIN`) |
//! | 55 | soft-dirty (`CONFIG_MEM_SOFT_DIRTY` is off on this machine's kernel) |
//! | 56 | exclusively mapped (cleared once a page is shared: fork, KSM) |
//! | 57 | userfaultfd write-protected |
//! | 61 | file page or shared anonymous |
//! | 62 | swapped |
//! | 63 | present |
//!
//! Reading it never faults a page in, so it is how pagesift decides which
//! pages it may read. Reads are batched: one `pread` of 512 entries costs
//! 33–42 ns per page against 0.7–0.8 µs for a single entry (measured
//! here). The file is opened once per process; the kernel pins the process's
//! `mm` at open, so a read after the process exits returns 0 bytes and is
//! reported as [`LinuxError::Gone`] (and a reused pid cannot be confused
//! with the old process).
//!
//! [`Pagemap::present_runs`] uses the `PAGEMAP_SCAN` ioctl (6.7+) to find
//! the present runs of a large, sparse range in one call (36 ns per page).

use crate::caps::{self, Capability};
use crate::error::{LinuxError, WHY_PFN, WHY_PTRACE, libc_errno};
use crate::proc::PTRACE;
use crate::sys::{self, PageRegion, ScanQuery};
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

/// One pagemap entry.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PagemapEntry(pub u64);

impl PagemapEntry {
    const PFN_MASK: u64 = (1 << 55) - 1;

    /// Backed by a frame in RAM.
    pub fn present(self) -> bool {
        self.0 >> 63 & 1 == 1
    }
    /// In swap.
    pub fn swapped(self) -> bool {
        self.0 >> 62 & 1 == 1
    }
    /// A page-cache page, or shared anonymous memory.
    pub fn file_or_shared(self) -> bool {
        self.0 >> 61 & 1 == 1
    }
    /// Mapped by this process only.
    pub fn exclusive(self) -> bool {
        self.0 >> 56 & 1 == 1
    }
    /// Soft-dirty (always clear without CONFIG_MEM_SOFT_DIRTY).
    pub fn soft_dirty(self) -> bool {
        self.0 >> 55 & 1 == 1
    }
    /// The frame number of a present page; 0 when PFNs are hidden.
    pub fn pfn(self) -> Option<u64> {
        (self.present() && !self.swapped()).then_some(self.0 & Self::PFN_MASK)
    }
}

/// `PAGE_IS_*` categories of `PAGEMAP_SCAN` (`<linux/fs.h>`).
pub mod category {
    /// A file page (or shared anonymous).
    pub const FILE: u64 = 1 << 2;
    /// Present in RAM.
    pub const PRESENT: u64 = 1 << 3;
    /// In swap.
    pub const SWAPPED: u64 = 1 << 4;
    /// Mapped to the zero page (or the huge zero page).
    pub const PFNZERO: u64 = 1 << 5;
    /// Mapped by a PMD (THP) or hugetlb.
    pub const HUGE: u64 = 1 << 6;
}

/// A run of pages from [`Pagemap::present_runs`].
pub type PageRun = PageRegion;

/// An open `/proc/PID/pagemap`.
#[derive(Debug)]
pub struct Pagemap {
    pid: u32,
    file: File,
    pfns_visible: bool,
}

impl Pagemap {
    /// Opens the pagemap of `pid`. Whether PFNs are shown is fixed at open:
    /// the kernel checks the opener's `CAP_SYS_ADMIN` then.
    pub fn open(pid: u32) -> Result<Pagemap, LinuxError> {
        if pid == crate::own_pid() {
            return Err(LinuxError::OwnProcess(pid));
        }
        Self::open_unchecked(pid)
    }

    /// Opens this process's own pagemap, for a program that reports on its
    /// own memory (the bench's workloads count their merged pages). The
    /// daemon never looks at itself; [`Pagemap::open`] refuses to.
    pub fn open_own() -> Result<Pagemap, LinuxError> {
        Self::open_unchecked(crate::own_pid())
    }

    fn open_unchecked(pid: u32) -> Result<Pagemap, LinuxError> {
        let pfns_visible = caps::has(Capability::SysAdmin);
        let file = File::open(format!("/proc/{pid}/pagemap"))
            .map_err(|e| crate::proc::error(pid, e, "opening /proc/PID/pagemap", PTRACE))?;
        Ok(Pagemap {
            pid,
            file,
            pfns_visible,
        })
    }

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether this pagemap shows PFNs.
    pub fn pfns_visible(&self) -> bool {
        self.pfns_visible
    }

    /// An error if PFNs are hidden: they are needed to tell zero, KSM and
    /// THP pages apart.
    pub fn require_pfns(&self) -> Result<(), LinuxError> {
        if self.pfns_visible {
            Ok(())
        } else {
            Err(LinuxError::MissingCapability {
                cap: Capability::SysAdmin,
                why: WHY_PFN,
            })
        }
    }

    /// Reads the entries of the `out.len()` pages starting at page-aligned
    /// address `start`, in as few `pread`s as the kernel allows.
    pub fn read(&self, start: u64, out: &mut [PagemapEntry]) -> Result<(), LinuxError> {
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(out);
        let mut done = 0;
        let offset = start / crate::PAGE_SIZE * 8;
        while done < bytes.len() {
            match self.file.read_at(&mut bytes[done..], offset + done as u64) {
                // The target's mm is gone: it exited.
                Ok(0) => return Err(LinuxError::Gone(self.pid)),
                Ok(n) => done += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => {
                    return Err(LinuxError::from_process_op(
                        self.pid,
                        e,
                        "reading /proc/PID/pagemap",
                        Capability::SysPtrace,
                        WHY_PTRACE,
                    ));
                }
            }
        }
        Ok(())
    }

    /// The first pages in `[start, end)` whose `PAGE_IS_*` categories
    /// include all of `required` and none of `excluded`: up to `max_pages`
    /// pages, in runs (one `PAGEMAP_SCAN` that stops at the limit, so a
    /// dense region is not walked to its end).
    pub fn first_pages(
        &self,
        start: u64,
        end: u64,
        required: u64,
        excluded: u64,
        max_pages: u64,
    ) -> Result<Vec<PageRun>, LinuxError> {
        let query = ScanQuery {
            required,
            excluded,
            returned: required,
            max_pages,
        };
        let mut buf = vec![PageRegion::default(); max_pages.clamp(1, 64) as usize];
        let (n, _) =
            sys::pagemap_scan(self.file.as_fd(), start, end, query, &mut buf).map_err(|e| {
                LinuxError::from_process_op(
                    self.pid,
                    e,
                    "PAGEMAP_SCAN on /proc/PID/pagemap",
                    Capability::SysPtrace,
                    WHY_PTRACE,
                )
            })?;
        buf.truncate(n);
        Ok(buf)
    }

    /// The runs of present pages in `[start, end)`, with their `PAGE_IS_*`
    /// categories (FILE, PFNZERO, HUGE) via `PAGEMAP_SCAN`. Runs are split
    /// where categories change.
    pub fn present_runs(&self, start: u64, end: u64) -> Result<Vec<PageRun>, LinuxError> {
        let query = ScanQuery {
            required: category::PRESENT,
            excluded: 0,
            returned: category::PRESENT | category::FILE | category::PFNZERO | category::HUGE,
            max_pages: 0,
        };
        let mut out = Vec::new();
        let mut buf = vec![PageRegion::default(); 512];
        let mut at = start;
        while at < end {
            let (n, walk_end) = sys::pagemap_scan(self.file.as_fd(), at, end, query, &mut buf)
                .map_err(|e| match e.raw_os_error() {
                    Some(libc_errno::ENOTTY) | Some(libc_errno::EINVAL)
                        if out.is_empty() && at == start =>
                    {
                        LinuxError::Unsupported(format!("PAGEMAP_SCAN ioctl (Linux 6.7+): {e}"))
                    }
                    _ => LinuxError::from_process_op(
                        self.pid,
                        e,
                        "PAGEMAP_SCAN on /proc/PID/pagemap",
                        Capability::SysPtrace,
                        WHY_PTRACE,
                    ),
                })?;
            out.extend_from_slice(&buf[..n]);
            if walk_end <= at {
                break; // no progress: the mm is gone or the range is empty
            }
            at = walk_end;
        }
        // The kernel may split one run across calls: merge touching runs
        // with equal categories.
        out.dedup_by(|b, a| {
            if a.end == b.start && a.categories == b.categories {
                a.end = b.end;
                true
            } else {
                false
            }
        });
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entry_bits() {
        let e = PagemapEntry(1 << 63 | 1 << 56 | 0x3b34);
        assert!(e.present() && e.exclusive() && !e.swapped() && !e.file_or_shared());
        assert_eq!(e.pfn(), Some(0x3b34));
        let s = PagemapEntry(1 << 62 | 0x1234);
        assert!(!s.present() && s.swapped());
        assert_eq!(s.pfn(), None);
        assert_eq!(PagemapEntry(0).pfn(), None);
        assert!(PagemapEntry(1 << 63 | 1 << 61).file_or_shared());
    }
}
