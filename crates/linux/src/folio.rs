//! The folio a cached file page sits in, and whether it is dirty or under
//! writeback.
//!
//! ## Why, and how
//!
//! The page cache holds a file in *folios*: one page, or a naturally
//! aligned power-of-two run of pages that the kernel allocates, reads and
//! evicts as a unit. `POSIX_FADV_DONTNEED` evicts a folio only when the
//! range covers all of it (measured here: 4 KiB to 256 KiB ranges inside
//! 1 MiB folios evicted nothing), so a scrubber must know the folios.
//! No syscall reports them, but `/proc/kpageflags` marks the first frame of
//! a multi-page folio `COMPOUND_HEAD` (bit 15) and the others
//! `COMPOUND_TAIL` (bit 16), and its DIRTY (4) and WRITEBACK (8) bits give
//! the folio's state. To learn the frame of a cached page, this module maps
//! the file read-only and shared in its own address space, reads the
//! page's first byte (a minor fault: the page is cached) and reads its PFN
//! from `/proc/self/pagemap`. Then:
//!
//! - neither head nor tail: a folio of one page;
//! - otherwise the head is the nearest `COMPOUND_HEAD` frame at or before
//!   it (within 511 frames: folios of the page cache are at most 2 MiB
//!   here), and the folio runs from the head over the `COMPOUND_TAIL`
//!   frames that follow. Its first file page is the page's index minus its
//!   distance from the head; a result that is not naturally aligned, or
//!   does not contain the page, is discarded (the frame changed under us).
//!
//! Our mapping is removed before the function returns: the kernel does not
//! evict pages a process maps. Flags are a snapshot: a page can be dirtied
//! after it is read here, which is why [`crate::page_cache`] checks
//! `cachestat` again right before it drops anything.
//!
//! Needs `CAP_SYS_ADMIN` (PFNs in pagemap, `/proc/kpageflags`).

use crate::error::LinuxError;
use crate::kpageflags::{KPageFlags, KpfFlags};
use crate::page_cache::{CHUNK_BYTES, ImageCache};
use crate::pagemap::PagemapEntry;
use crate::sys::FileMapping;
use pagesift_core::pipeline::scrub::Folio;
use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

/// Largest folio looked for, in pages (2 MiB: PMD size on x86-64).
pub const MAX_FOLIO_PAGES: u64 = 512;

/// A folio and its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FolioState {
    /// Its extent in the file, in pages.
    pub folio: Folio,
    /// Dirty (newer than the disk).
    pub dirty: bool,
    /// Under writeback.
    pub writeback: bool,
}

/// Where the page at `window[center]` sits in its folio, from the flags of
/// the frames around it: `(pages before it in the folio, folio pages)`.
/// `None` when the flags do not describe a folio containing it (a tail
/// without a head in the window).
pub fn extent(window: &[KpfFlags], center: usize) -> Option<(u64, u64)> {
    let c = window[center];
    if !c.compound_head() && !c.compound_tail() {
        return Some((0, 1));
    }
    let mut head = center;
    while !window[head].compound_head() {
        if head == 0 || !window[head].compound_tail() {
            return None;
        }
        head -= 1;
    }
    let mut end = head + 1;
    while end < window.len() && window[end].compound_tail() && !window[end].compound_head() {
        end += 1;
    }
    if end <= center {
        return None;
    }
    Some(((center - head) as u64, (end - head) as u64))
}

/// Finds folios of cached file pages (see the module header).
#[derive(Debug)]
pub struct FolioFinder {
    own_pagemap: File,
    kpf: KPageFlags,
}

impl FolioFinder {
    /// Opens our own pagemap and `/proc/kpageflags` (`CAP_SYS_ADMIN`).
    pub fn open() -> Result<FolioFinder, LinuxError> {
        let kpf = KPageFlags::open()?;
        let own_pagemap = File::open("/proc/self/pagemap")
            .map_err(|e| LinuxError::io("opening /proc/self/pagemap", e))?;
        Ok(FolioFinder { own_pagemap, kpf })
    }

    /// The folios holding `pages` (sorted page indices of `cache`, each
    /// cached when listed), each folio once, in file order. Pages whose
    /// folio could not be determined (evicted or moved meanwhile) are left
    /// out, and so is any folio that reaches past the end of the file.
    pub fn folios(
        &mut self,
        cache: &ImageCache,
        pages: &[u64],
    ) -> Result<Vec<FolioState>, LinuxError> {
        let page = crate::PAGE_SIZE;
        let end_page = cache.bytes()? / page;
        let chunk_pages = CHUNK_BYTES / page;
        let mut out: Vec<FolioState> = Vec::new();
        let mut k = 0;
        while k < pages.len() {
            let chunk = pages[k] / chunk_pages;
            let first = chunk * chunk_pages;
            let last = (first + chunk_pages).min(end_page);
            let mut j = k;
            while j < pages.len() && pages[j] < last {
                j += 1;
            }
            if j == k {
                break; // pages past the end of the file
            }
            self.chunk(cache, first, last, &pages[k..j], &mut out)?;
            k = j;
        }
        out.dedup_by_key(|f| f.folio);
        Ok(out)
    }

    fn chunk(
        &mut self,
        cache: &ImageCache,
        first: u64,
        last: u64,
        pages: &[u64],
        out: &mut Vec<FolioState>,
    ) -> Result<(), LinuxError> {
        let page = crate::PAGE_SIZE;
        let map = FileMapping::new(
            cache.file().as_fd(),
            first * page,
            ((last - first) * page) as usize,
        )
        .map_err(|e| LinuxError::io(format!("mmap of {}", cache.path().display()), e))?;
        for &p in pages {
            map.touch((p - first) as usize);
        }
        let mut entries = vec![PagemapEntry(0); (last - first) as usize];
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut entries);
        self.own_pagemap
            .read_exact_at(bytes, map.addr() / page * 8)
            .map_err(|e| LinuxError::io("reading /proc/self/pagemap", e))?;
        // Every page's own flags in one batched read (`read_many` groups
        // neighbouring frames) rather than a syscall per page.
        let pfns: Vec<u64> = pages
            .iter()
            .filter_map(|&p| entries[(p - first) as usize].pfn())
            .collect();
        let mut centers = vec![KpfFlags(0); pfns.len()];
        self.kpf.read_many(&pfns, &mut centers)?;
        let mut centers = pfns.iter().zip(centers);
        let mut covered_until = 0u64;
        for &p in pages {
            let Some(pfn) = entries[(p - first) as usize].pfn() else {
                continue;
            };
            let (_, center) = centers.next().expect("one flags entry per pfn");
            if p < covered_until {
                continue;
            }
            let found = if center.compound_head() || center.compound_tail() {
                self.folio_around(pfn)?
            } else {
                Some((0, 1, center))
            };
            let Some((before, len, head)) = found else {
                continue;
            };
            let Some(start) = p.checked_sub(before) else {
                continue;
            };
            if !len.is_power_of_two() || !start.is_multiple_of(len) || start + len > last {
                continue;
            }
            out.push(FolioState {
                folio: Folio {
                    first: start,
                    pages: len,
                },
                dirty: head.dirty(),
                writeback: head.writeback(),
            });
            covered_until = start + len;
        }
        drop(map);
        Ok(())
    }

    /// The folio around frame `pfn` (part of a multi-page folio):
    /// `(frames before it, folio frames, the head's flags)`.
    ///
    /// A folio of 2^k frames starts at a frame number that is a multiple
    /// of 2^k, so it lies inside one aligned block of any size ≥ 2^k.
    /// The flags of the aligned block of [`SMALL_BLOCK`] frames around
    /// `pfn` settle it unless the folio may be larger: its head is not in
    /// the block, or the head starts the block and the tails fill it. Only
    /// then is the aligned block of [`MAX_FOLIO_PAGES`] read. (Reading the
    /// 1023 frames on both sides of every folio's first page was a tenth
    /// of a scrub's CPU, perf, with ext4's large folios.)
    fn folio_around(&mut self, pfn: u64) -> Result<Option<(u64, u64, KpfFlags)>, LinuxError> {
        for block in [SMALL_BLOCK, MAX_FOLIO_PAGES] {
            let lo = pfn / block * block;
            let pfns: Vec<u64> = (lo..lo + block).collect();
            let mut window = vec![KpfFlags(0); pfns.len()];
            self.kpf.read_many(&pfns, &mut window)?;
            let at = (pfn - lo) as usize;
            let Some((before, len)) = extent(&window, at) else {
                continue;
            };
            let head = at - before as usize;
            if head == 0 && len == block && block < MAX_FOLIO_PAGES {
                continue; // it may go on past the block
            }
            return Ok(Some((before, len, window[head])));
        }
        Ok(None)
    }
}

/// Frames read first around a page of a multi-page folio (see
/// [`FolioFinder::folio_around`]).
const SMALL_BLOCK: u64 = 64;

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: KpfFlags = KpfFlags(1 << 15);
    const TAIL: KpfFlags = KpfFlags(1 << 16);
    const PLAIN: KpfFlags = KpfFlags(0);

    #[test]
    fn an_order0_page_is_its_own_folio() {
        assert_eq!(extent(&[PLAIN], 0), Some((0, 1)));
    }

    #[test]
    fn a_tail_finds_its_head_and_the_folio_its_end() {
        let w = [PLAIN, HEAD, TAIL, TAIL, TAIL, HEAD, TAIL];
        assert_eq!(extent(&w, 1), Some((0, 4)));
        assert_eq!(extent(&w, 3), Some((2, 4)));
        assert_eq!(extent(&w, 6), Some((1, 2)));
    }

    #[test]
    fn a_tail_without_a_head_is_unknown() {
        assert_eq!(extent(&[TAIL, TAIL], 1), None);
        assert_eq!(extent(&[PLAIN, TAIL], 1), None);
    }
}
