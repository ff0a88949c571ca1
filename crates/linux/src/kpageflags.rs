//! `/proc/kpageflags`: per physical frame, what kind of page is it?
//!
//! One 64-bit word per PFN (Documentation/admin-guide/mm/pagemap.rst). The
//! bits pagesift uses (pagemap.rst): DIRTY 4
//! and WRITEBACK 8 (for page cache, see `docs/page-cache-scrubbing.md`), ANON 12,
//! COMPOUND_HEAD 15, COMPOUND_TAIL 16, HUGE (hugetlb) 17, NOPAGE 20, KSM 21,
//! THP 22, ZERO_PAGE 24 (set for the zero page and the huge zero page); and
//! SWAPBACKED 14 (pagemap.rst), which the discovery test
//! `maps_discovery_agrees_with_smaps` checks on ordinary and
//! `MAP_DROPPABLE` anonymous pages; ACTIVE 6 (pagemap.rst), which NUMA
//! placement reads before a merge and the two-node guest test exercises.
//!
//! The file is indexed by PFN, so single 8-byte reads cost 290–390 ns each;
//! [`KPageFlags::read_many`] sorts the PFNs and reads clustered ones with
//! one `pread` per cluster. A PFN can change between the pagemap read and
//! this one (migration, compaction, a KSM merge): the flags are hints, and
//! the content read later is what counts.

use crate::caps::{self, Capability};
use crate::error::{LinuxError, WHY_PFN};
use std::fs::File;
use std::os::unix::fs::FileExt;

/// The flags of one frame.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KpfFlags(pub u64);

impl KpfFlags {
    fn bit(self, b: u32) -> bool {
        self.0 >> b & 1 == 1
    }
    /// Dirty: newer than its backing store (bit 4).
    pub fn dirty(self) -> bool {
        self.bit(4)
    }
    /// Under writeback (bit 8).
    pub fn writeback(self) -> bool {
        self.bit(8)
    }
    /// Referenced: used since reclaim last looked at it (bit 2,
    /// `PG_referenced`).
    pub fn referenced(self) -> bool {
        self.bit(2)
    }
    /// On the LRU's active list: used often (bit 6, pagemap.rst).
    /// With the multi-generational LRU on, pages on its lists do not carry
    /// this bit.
    pub fn active(self) -> bool {
        self.bit(6)
    }
    /// An anonymous page.
    pub fn anon(self) -> bool {
        self.bit(12)
    }
    /// Swap-backed: set on every anonymous page except `MADV_FREE`d
    /// (lazily freed) ones and those of `MAP_DROPPABLE` mappings.
    pub fn swapbacked(self) -> bool {
        self.bit(14)
    }
    /// First page of a compound page.
    pub fn compound_head(self) -> bool {
        self.bit(15)
    }
    /// Non-first page of a compound page.
    pub fn compound_tail(self) -> bool {
        self.bit(16)
    }
    /// A hugetlbfs page.
    pub fn hugetlb(self) -> bool {
        self.bit(17)
    }
    /// No page frame at this PFN.
    pub fn nopage(self) -> bool {
        self.bit(20)
    }
    /// A KSM page: already merged.
    pub fn ksm(self) -> bool {
        self.bit(21)
    }
    /// Part of a transparent huge page.
    pub fn thp(self) -> bool {
        self.bit(22)
    }
    /// The zero page or the huge zero page.
    pub fn zero_page(self) -> bool {
        self.bit(24)
    }
}

/// Clustered PFNs closer than this are read with one `pread` (the gap is
/// read and discarded: 64 entries cost about one extra syscall).
const CLUSTER_GAP: u64 = 64;

/// An open `/proc/kpageflags`.
#[derive(Debug)]
pub struct KPageFlags {
    file: File,
    scratch: Vec<u64>,
    order: Vec<usize>,
    /// `/proc/kpagecount`, open only on a kernel that sets KPF_KSM on every
    /// anonymous page (see [`KPageFlags::open`]).
    ksm_fix: Option<Box<KPageFlags>>,
}

impl KPageFlags {
    /// Opens `/proc/kpageflags` (root only, and meaningful only with PFNs,
    /// i.e. `CAP_SYS_ADMIN`).
    pub fn open() -> Result<KPageFlags, LinuxError> {
        if !caps::has(Capability::SysAdmin) {
            return Err(LinuxError::MissingCapability {
                cap: Capability::SysAdmin,
                why: WHY_PFN,
            });
        }
        let file = File::open("/proc/kpageflags").map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                LinuxError::Unsupported("/proc/kpageflags (CONFIG_PROC_PAGE_MONITOR is off)".into())
            }
            _ => LinuxError::io("opening /proc/kpageflags (mode 0400, owned by root)", e),
        })?;
        let mut flags = KPageFlags {
            file,
            scratch: Vec::new(),
            order: Vec::new(),
            ksm_fix: None,
        };
        // Linux 6.9 rewrote stable_page_flags() and tested KSM as
        // `mapping & PAGE_MAPPING_KSM`, true for every anonymous page (KSM
        // is both mapping bits): some 6.9–6.12 kernels (Debian's 6.12.117
        // among them) report KPF_KSM on every anonymous page. Seen on a
        // fresh private page of our own, a KPF_KSM is then only believed
        // for frames mapped more than once (`/proc/kpagecount`).
        if flags.ksm_on_a_private_page() {
            let counts = File::open("/proc/kpagecount")
                .map_err(|e| LinuxError::io("opening /proc/kpagecount", e))?;
            flags.ksm_fix = Some(Box::new(KPageFlags {
                file: counts,
                scratch: Vec::new(),
                order: Vec::new(),
                ksm_fix: None,
            }));
        }
        Ok(flags)
    }

    /// Whether the kernel reports KPF_KSM for a private anonymous page of
    /// this process, written just now (which KSM cannot have merged: this
    /// process's memory is not mergeable).
    fn ksm_on_a_private_page(&mut self) -> bool {
        let page = crate::PAGE_SIZE as usize;
        let mut buf = vec![0u8; 2 * page];
        let at = buf.as_ptr() as usize;
        let first = at.div_ceil(page) * page;
        let off = first - at;
        buf[off] = 0x5a; // fault it in, private
        std::hint::black_box(&mut buf);
        let Ok(pm) = File::open("/proc/self/pagemap") else {
            return false;
        };
        let mut entry = [0u8; 8];
        if read_exact_at(&pm, &mut entry, (first / page) as u64 * 8).is_err() {
            return false;
        }
        let e = crate::pagemap::PagemapEntry(u64::from_le_bytes(entry));
        let Some(pfn) = e.pfn().filter(|&p| p != 0) else {
            return false;
        };
        let mut out = [KpfFlags(0)];
        let found = self.read_raw(&[pfn], &mut out).is_ok() && out[0].anon() && out[0].ksm();
        drop(buf);
        found
    }

    /// The flags of one frame.
    pub fn read_one(&mut self, pfn: u64) -> Result<KpfFlags, LinuxError> {
        let mut out = [KpfFlags(0)];
        self.read_many(&[pfn], &mut out)?;
        Ok(out[0])
    }

    /// `out[i]` receives the flags of `pfns[i]`.
    pub fn read_many(&mut self, pfns: &[u64], out: &mut [KpfFlags]) -> Result<(), LinuxError> {
        self.read_raw(pfns, out)?;
        if let Some(counts) = &mut self.ksm_fix {
            let idx: Vec<usize> = (0..out.len()).filter(|&i| out[i].ksm()).collect();
            let some: Vec<u64> = idx.iter().map(|&i| pfns[i]).collect();
            let mut n = vec![KpfFlags(0); some.len()];
            counts.read_raw(&some, &mut n)?;
            for (&i, c) in idx.iter().zip(&n) {
                if c.0 < 2 {
                    out[i].0 &= !(1 << 21);
                }
            }
        }
        Ok(())
    }

    /// Whether KPF_KSM is corrected with mapping counts on this kernel.
    pub fn ksm_flag_corrected(&self) -> bool {
        self.ksm_fix.is_some()
    }

    fn read_raw(&mut self, pfns: &[u64], out: &mut [KpfFlags]) -> Result<(), LinuxError> {
        assert_eq!(pfns.len(), out.len());
        self.order.clear();
        self.order.extend(0..pfns.len());
        self.order.sort_unstable_by_key(|&i| pfns[i]);
        let mut k = 0;
        while k < self.order.len() {
            // One cluster: sorted PFNs with gaps below CLUSTER_GAP.
            let first = pfns[self.order[k]];
            let mut last = first;
            let mut j = k + 1;
            while j < self.order.len() && pfns[self.order[j]] - last < CLUSTER_GAP {
                last = pfns[self.order[j]];
                j += 1;
            }
            let n = (last - first + 1) as usize;
            self.scratch.clear();
            self.scratch.resize(n, 0);
            read_exact_at(
                &self.file,
                bytemuck::cast_slice_mut(&mut self.scratch),
                first * 8,
            )?;
            for &i in &self.order[k..j] {
                out[i] = KpfFlags(self.scratch[(pfns[i] - first) as usize]);
            }
            k = j;
        }
        Ok(())
    }
}

/// An open `/proc/kpagecount`: per frame, how many mappings it has (the
/// same file layout as `/proc/kpageflags`, one 64-bit word per PFN, read the
/// same clustered way). A KSM page's count is its number of sharers'
/// mappings, so a reader that saw fewer mappings knows a sharer it did not
/// see exists.
#[derive(Debug)]
pub struct KPageCount {
    table: KPageFlags,
    words: Vec<KpfFlags>,
}

impl KPageCount {
    /// Opens `/proc/kpagecount` (root only, meaningful only with PFNs).
    pub fn open() -> Result<KPageCount, LinuxError> {
        if !caps::has(Capability::SysAdmin) {
            return Err(LinuxError::MissingCapability {
                cap: Capability::SysAdmin,
                why: WHY_PFN,
            });
        }
        let file = File::open("/proc/kpagecount").map_err(|e| {
            LinuxError::io("opening /proc/kpagecount (mode 0400, owned by root)", e)
        })?;
        Ok(KPageCount {
            table: KPageFlags {
                file,
                scratch: Vec::new(),
                order: Vec::new(),
                ksm_fix: None,
            },
            words: Vec::new(),
        })
    }

    /// `out[i]` receives the mapping count of `pfns[i]`.
    pub fn read_many(&mut self, pfns: &[u64], out: &mut [u64]) -> Result<(), LinuxError> {
        assert_eq!(pfns.len(), out.len());
        self.words.clear();
        self.words.resize(pfns.len(), KpfFlags(0));
        self.table.read_raw(pfns, &mut self.words)?;
        for (o, w) in out.iter_mut().zip(&self.words) {
            *o = w.0;
        }
        Ok(())
    }
}

fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> Result<(), LinuxError> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset + done as u64) {
            Ok(0) => {
                return Err(LinuxError::Parse(format!(
                    "/proc/kpageflags (or kpagecount) ends before PFN {}",
                    (offset + done as u64) / 8
                )));
            }
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(LinuxError::io(
                    "reading /proc/kpageflags (or kpagecount)",
                    e,
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_bits() {
        let f = KpfFlags(1 << 21 | 1 << 12);
        assert!(f.ksm() && f.anon() && !f.thp() && !f.zero_page());
        assert!(KpfFlags(1 << 24).zero_page());
        assert!(KpfFlags(1 << 22 | 1 << 16).thp());
    }

    #[test]
    fn many_matches_one_by_one_in_any_order() {
        if !caps::has(Capability::SysAdmin) {
            return; // needs root; the integration tests cover the error
        }
        let mut k = KPageFlags::open().unwrap();
        let pfns = [5000u64, 17, 5001, 4_000, 18, 5000, 1 << 20];
        let mut many = vec![KpfFlags(0); pfns.len()];
        k.read_many(&pfns, &mut many).unwrap();
        for (i, &p) in pfns.iter().enumerate() {
            assert_eq!(k.read_one(p).unwrap(), many[i], "pfn {p}");
        }
    }
}
