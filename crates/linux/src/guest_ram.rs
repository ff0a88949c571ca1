//! A guest's RAM, read from its QEMU process.
//!
//! QEMU allocates guest RAM as large private anonymous read-write
//! mappings (TCG's translation buffer is also anonymous but executable).
//! A guest-RAM range here is every anonymous, readable, writable,
//! not-executable span of at least `min_bytes` (the operator's
//! `scrub.guest_ram_min_mib`): the guest's own pages dominate QEMU's large
//! anonymous mappings, and a page of QEMU's heap that happens to hold the
//! same bytes as a cached disk block is a correct match too (the content is
//! in memory).
//!
//! A span is a run of such VMAs that touch end to end, not one VMA: the
//! kernel splits a VMA wherever its flags change over part of it, and
//! pagesift's own `MADV_MERGEABLE` on sub-regions of guest RAM cuts it into
//! pieces far smaller than `min_bytes` (measured: after the daemon marked a
//! 256 MiB guest, 1275 of the 8201 host-cached pages of a file the guest
//! held lay in pieces a per-VMA filter skipped, and were never dropped).
//! For the same reason the ranges are re-read before every pass
//! ([`GuestRam::refresh`]).
//!
//! Pages are read as the rest of pagesift reads them (see [`crate::read`]):
//! only pages pagemap shows present (`PAGEMAP_SCAN`; zero-page mappings are
//! skipped: a guest never wrote them), through `/proc/PID/mem`, which never
//! pins and so never unshares a KSM-merged guest page. Nothing is written.

use crate::error::LinuxError;
use crate::pagemap::{Pagemap, category};
use crate::read::RemoteReader;
use pagesift_core::{PAGE_SIZE, PageWords};
use procfs::process::{MMPermissions, MMapPath, Process};
use std::ops::Range;

/// Pages read per `/proc/PID/mem` call (4 MiB).
const BATCH_PAGES: usize = 1024;

/// The guest-RAM ranges of `pid` (see the module header).
pub fn guest_ram_ranges(pid: u32, min_bytes: u64) -> Result<Vec<Range<u64>>, LinuxError> {
    let maps = Process::new(pid as i32)
        .and_then(|p| p.maps())
        .map_err(|e| {
            crate::proc::procfs_error(pid, e, "reading /proc/PID/maps", crate::proc::PTRACE)
        })?;
    let ram_like = maps.iter().filter(|m| {
        m.pathname == MMapPath::Anonymous
            && m.perms.contains(MMPermissions::READ)
            && m.perms.contains(MMPermissions::WRITE)
            && !m.perms.contains(MMPermissions::EXECUTE)
    });
    Ok(spans(ram_like.map(|m| m.address.0..m.address.1), min_bytes))
}

/// Joins `vmas` (in address order) that touch end to end, and keeps the
/// joined spans of at least `min_bytes`.
fn spans(vmas: impl Iterator<Item = Range<u64>>, min_bytes: u64) -> Vec<Range<u64>> {
    let mut joined: Vec<Range<u64>> = Vec::new();
    for vma in vmas {
        match joined.last_mut() {
            Some(last) if last.end == vma.start => last.end = vma.end,
            _ => joined.push(vma),
        }
    }
    joined.retain(|r| r.end - r.start >= min_bytes);
    joined
}

/// Reads one guest's RAM.
#[derive(Debug)]
pub struct GuestRam {
    pid: u32,
    ranges: Vec<Range<u64>>,
    min_bytes: u64,
    pagemap: Pagemap,
    reader: RemoteReader,
}

impl GuestRam {
    /// Opens QEMU process `pid`'s RAM (ranges as [`guest_ram_ranges`]).
    pub fn open(pid: u32, min_bytes: u64) -> Result<GuestRam, LinuxError> {
        let ranges = guest_ram_ranges(pid, min_bytes)?;
        Ok(GuestRam {
            pid,
            ranges,
            min_bytes,
            pagemap: Pagemap::open(pid)?,
            reader: RemoteReader::new(pid)?,
        })
    }

    /// Re-reads the ranges (guest RAM may have been split, added or
    /// removed since the last pass).
    pub fn refresh(&mut self) -> Result<(), LinuxError> {
        self.ranges = guest_ram_ranges(self.pid, self.min_bytes)?;
        Ok(())
    }

    /// The process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The ranges read.
    pub fn ranges(&self) -> &[Range<u64>] {
        &self.ranges
    }

    /// Pages in the ranges.
    pub fn pages(&self) -> u64 {
        self.ranges
            .iter()
            .map(|r| (r.end - r.start) / PAGE_SIZE as u64)
            .sum()
    }

    /// Calls `each(address, page)` for every present, not-zero-page guest
    /// page. Returns the pages visited.
    pub fn for_each_page(
        &mut self,
        mut each: impl FnMut(u64, &PageWords),
    ) -> Result<u64, LinuxError> {
        let mut buf = vec![[0u32; pagesift_core::WORDS_PER_PAGE]; BATCH_PAGES];
        let mut visited = 0;
        for range in self.ranges.clone() {
            let runs = self.pagemap.present_runs(range.start, range.end)?;
            for run in runs {
                if run.categories & category::PFNZERO != 0 {
                    continue;
                }
                let mut at = run.start;
                while at < run.end {
                    let n = (((run.end - at) / PAGE_SIZE as u64) as usize).min(BATCH_PAGES);
                    let got = self.reader.read_range_unpinned(at, &mut buf[..n])?;
                    for (i, page) in buf[..got].iter().enumerate() {
                        each(at + (i * PAGE_SIZE) as u64, page);
                    }
                    visited += got as u64;
                    if got < n {
                        break; // unmapped meanwhile: the rest of the run is gone
                    }
                    at += (n * PAGE_SIZE) as u64;
                }
            }
        }
        Ok(visited)
    }

    /// Reads the guest pages at `addrs` (ascending; repeats allowed) into
    /// `out`, one slot each; `present[i]` says whether slot `i` was read
    /// (a page that is not present is not held). Consecutive addresses
    /// share one pagemap read and one `/proc/PID/mem` read: a scrub
    /// verifies tens of thousands of pages, and guest page cache filled by
    /// a block read sits in runs of neighbouring pages, so reading them one
    /// by one cost two syscalls a page.
    pub fn read_pages(
        &mut self,
        addrs: &[u64],
        out: &mut [PageWords],
        present: &mut [bool],
    ) -> Result<(), LinuxError> {
        assert!(out.len() >= addrs.len() && present.len() >= addrs.len());
        debug_assert!(addrs.windows(2).all(|w| w[0] <= w[1]));
        let page = PAGE_SIZE as u64;
        let mut entries = Vec::new();
        let mut i = 0;
        while i < addrs.len() {
            // A run of consecutive addresses, addrs[i..j].
            let mut j = i + 1;
            while j < addrs.len() && addrs[j] == addrs[j - 1] + page {
                j += 1;
            }
            entries.clear();
            entries.resize(j - i, crate::pagemap::PagemapEntry(0));
            self.pagemap.read(addrs[i], &mut entries)?;
            // Each present sub-run with one read.
            let mut k = 0;
            while k < entries.len() {
                if !entries[k].present() {
                    present[i + k] = false;
                    k += 1;
                    continue;
                }
                let mut m = k + 1;
                while m < entries.len() && entries[m].present() {
                    m += 1;
                }
                let got = self
                    .reader
                    .read_range_unpinned(addrs[i + k], &mut out[i + k..i + m])?;
                for (n, p) in present[i + k..i + m].iter_mut().enumerate() {
                    *p = n < got;
                }
                k = m;
            }
            i = j;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::spans;

    const MIB: u64 = 1 << 20;

    #[test]
    fn pieces_of_one_mapping_are_one_span() {
        // 256 MiB of guest RAM cut into 1 MiB VMAs by per-region advice,
        // a gap, then a 2 MiB heap arena.
        let ram = (0..256).map(|i| (i * MIB)..((i + 1) * MIB));
        let heap = std::iter::once((300 * MIB)..(302 * MIB));
        assert_eq!(spans(ram.chain(heap), 16 * MIB), vec![0..256 * MIB]);
    }

    #[test]
    fn only_touching_vmas_join() {
        let vmas = [
            0..8 * MIB,
            8 * MIB..12 * MIB,
            13 * MIB..20 * MIB,
            20 * MIB..30 * MIB,
        ];
        assert_eq!(
            spans(vmas.clone().into_iter(), 10 * MIB),
            vec![0..12 * MIB, 13 * MIB..30 * MIB]
        );
        assert!(spans(vmas.into_iter(), 64 * MIB).is_empty());
    }
}
