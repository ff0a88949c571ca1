//! The host page cache of one file: what is cached, its content, and
//! dropping it, all without reading the disk.
//!
//! - **Counts**: `cachestat(2)` (Linux 6.5+) gives cached, dirty and
//!   writeback pages of a range in one call ([`ImageCache::stat`]).
//! - **Which pages**: `mincore` over our own read-only shared mapping of
//!   the file ([`ImageCache::cached_pages`]); it reports residency and
//!   faults nothing in. The mapping is made per chunk and unmapped before
//!   returning, because the kernel does not evict a page that a process
//!   maps.
//! - **Content**: `preadv2(RWF_NOWAIT)` on our own descriptor
//!   ([`ImageCache::read_cached`]), which copies cached pages and returns
//!   short (EAGAIN) where a page would need I/O. Only pages `mincore` just
//!   reported cached are read, so a read that does start I/O can only come
//!   from a page evicted in between; our descriptor is `FADV_RANDOM`, so such
//!   a miss reads no more than the page asked for.
//! - **Drop**: `posix_fadvise(POSIX_FADV_DONTNEED)` over byte ranges
//!   ([`ImageCache::drop_range`]). The kernel evicts only folios lying
//!   wholly inside the range, and never dirty, writeback or mapped ones;
//!   the range's dirty and writeback counts are checked with `cachestat`
//!   right before, and a range with any is left alone, because DONTNEED
//!   would start writeback of its dirty pages (harmless, but not ours to
//!   decide).
//!
//! The file is opened read-only by this process; nothing here writes it.

use crate::error::LinuxError;
use crate::sys::{self, CacheStat, FileMapping};
use std::fs::File;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

/// Largest mapping made at once for `mincore` (and [`crate::folio`]).
pub const CHUNK_BYTES: u64 = 256 << 20;

/// An image's page cache, seen through our own read-only descriptor.
#[derive(Debug)]
pub struct ImageCache {
    path: PathBuf,
    file: File,
}

/// What one [`ImageCache::drop_range`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropOutcome {
    /// DONTNEED was issued; `evicted` pages left the cache (cachestat
    /// before and after).
    Dropped {
        /// Pages the range lost.
        evicted: u64,
    },
    /// Left alone: the range had dirty or writeback pages.
    Busy,
}

impl ImageCache {
    /// Opens `path` read-only (for a process's descriptor, pass
    /// `/proc/PID/fd/N`: the same file, even if renamed).
    pub fn open(path: &Path) -> Result<ImageCache, LinuxError> {
        let file = File::open(path).map_err(|e| LinuxError::Io {
            context: format!("opening {}", path.display()),
            source: e,
        })?;
        // Our own descriptor's read-ahead: none beyond the page asked for.
        let _ = rustix::fs::fadvise(&file, 0, None, rustix::fs::Advice::Random);
        Ok(ImageCache {
            path: path.to_path_buf(),
            file,
        })
    }

    /// The path it was opened by.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file, for [`crate::folio`].
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Its size in bytes now.
    pub fn bytes(&self) -> Result<u64, LinuxError> {
        self.file
            .metadata()
            .map(|m| m.len())
            .map_err(|e| self.io("fstat", e))
    }

    fn io(&self, what: &str, e: std::io::Error) -> LinuxError {
        LinuxError::Io {
            context: format!("{what} {}", self.path.display()),
            source: e,
        }
    }

    /// Page-cache counts of `[offset, offset + len)` (`len == 0`: to the
    /// end).
    pub fn stat(&self, offset: u64, len: u64) -> Result<CacheStat, LinuxError> {
        sys::cachestat(self.file.as_fd(), offset, len).map_err(|e| {
            if e.raw_os_error() == Some(libc::ENOSYS) {
                LinuxError::Unsupported("cachestat(2) (Linux 6.5+)".into())
            } else {
                self.io("cachestat", e)
            }
        })
    }

    /// The indices of the file's cached pages, in order (`mincore`, per
    /// chunk of [`CHUNK_BYTES`]). Only whole pages below the end of the
    /// file are looked at.
    pub fn cached_pages(&self) -> Result<Vec<u64>, LinuxError> {
        let page = crate::PAGE_SIZE;
        let end = self.bytes()? / page * page;
        let mut out = Vec::new();
        let mut at = 0;
        while at < end {
            let len = (end - at).min(CHUNK_BYTES);
            let map = FileMapping::new(self.file.as_fd(), at, len as usize)
                .map_err(|e| self.io("mmap", e))?;
            let resident = map.resident().map_err(|e| self.io("mincore", e))?;
            let first = at / page;
            out.extend(
                resident
                    .iter()
                    .enumerate()
                    .filter(|(_, r)| **r)
                    .map(|(i, _)| first + i as u64),
            );
            at += len;
        }
        Ok(out)
    }

    /// Reads cached pages from page `first` into `out` (whole pages)
    /// without I/O (`RWF_NOWAIT`). Returns how many leading pages were
    /// read: fewer where a page is not cached (or the file ends).
    pub fn read_cached(&self, first: u64, out: &mut [u8]) -> Result<usize, LinuxError> {
        let page = crate::PAGE_SIZE as usize;
        let want = out.len() / page * page;
        let mut done = 0;
        while done < want {
            let mut iov = [std::io::IoSliceMut::new(&mut out[done..want])];
            match rustix::io::preadv2(
                &self.file,
                &mut iov,
                first * page as u64 + done as u64,
                rustix::io::ReadWriteFlags::NOWAIT,
            ) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(self.io("preadv2(RWF_NOWAIT)", e.into())),
            }
        }
        Ok(done / page)
    }

    /// Drops `[offset, offset + len)` from the cache unless it holds dirty
    /// or writeback pages (see the module header). The caller passes whole
    /// folios.
    pub fn drop_range(&self, offset: u64, len: u64) -> Result<DropOutcome, LinuxError> {
        let Some(nonzero) = std::num::NonZeroU64::new(len) else {
            return Ok(DropOutcome::Dropped { evicted: 0 });
        };
        let before = self.stat(offset, len)?;
        if before.dirty > 0 || before.writeback > 0 {
            return Ok(DropOutcome::Busy);
        }
        rustix::fs::fadvise(
            &self.file,
            offset,
            Some(nonzero),
            rustix::fs::Advice::DontNeed,
        )
        .map_err(|e| self.io("posix_fadvise(DONTNEED)", e.into()))?;
        let after = self.stat(offset, len)?;
        Ok(DropOutcome::Dropped {
            evicted: before.cache.saturating_sub(after.cache),
        })
    }

    /// Drops the whole file's clean cache (`DONTNEED` over all of it), as
    /// the bench's Fadvise baseline does. Returns the pages it lost.
    pub fn drop_all(&self) -> Result<u64, LinuxError> {
        let before = self.stat(0, 0)?;
        rustix::fs::fadvise(&self.file, 0, None, rustix::fs::Advice::DontNeed)
            .map_err(|e| self.io("posix_fadvise(DONTNEED)", e.into()))?;
        Ok(before.cache.saturating_sub(self.stat(0, 0)?.cache))
    }
}
