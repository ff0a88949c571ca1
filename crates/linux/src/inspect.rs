//! Page classes from pagemap + kpageflags, without touching the pages.
//!
//! [`PageInspector`] combines a process's pagemap with `/proc/kpageflags`:
//! pagemap says present/swapped/file and the PFN; the PFN's flags say zero
//! page, KSM page or THP. The result is a [`PageClass`], which maps onto the
//! core's [`PageState`]:
//!
//! | class | meaning | core state | read? |
//! |---|---|---|---|
//! | `NotPresent` | no frame (never touched, or freed) | NotPresent | never |
//! | `Swapped` | in swap | NotPresent | never (a read would swap it in) |
//! | `File` | page cache in a private file mapping (not COWed) | NotPresent | no: KSM never merges it |
//! | `Zero` | mapped to the shared zero page | Zero | allowed, nothing to save |
//! | `Merged` | a KSM page | Merged | allowed |
//! | `Anon` | private anonymous page: a candidate | Present | yes |
//!
//! `File` pages are reported as NotPresent to the core because the trait
//! has no "present but not a candidate" state; nothing is lost, since KSM
//! could not merge them anyway.
//!
//! [`classify`] is the one place pagemap and kpageflags become a class:
//! the daemon's source (through [`PageInspector`]), the exact scan and the
//! demo's meter all call it. A caller may skip the kpageflags read of a page
//! that [`flags_needed`] says can be neither the zero page nor a KSM page;
//! then it passes `None` and gets the same class as with the flags.
//! kpageflags is indexed by frame, so the flags of scattered frames cost a
//! `pread` each. The `skipping_kpageflags_reads` test
//! (crates/linux/tests/live.rs) measures it on a 32 MiB mixed workload
//! (8192 pages, 1638 of them zero-page mappings that need their flags):
//! 513 ns per page with every page's flags, 11 ns per page with only the
//! needed ones (this machine, 2026-11-24). [`PageInspector`] reads them all
//! because its callers also want the THP bit; the exact scan and the demo's
//! meter read only what the class needs.

use crate::error::LinuxError;
use crate::kpageflags::{KPageFlags, KpfFlags};
use crate::pagemap::{Pagemap, PagemapEntry};
use pagesift_core::source::PageState;

/// What a virtual page is, from pagemap and kpageflags.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PageClass {
    /// Not backed by a frame.
    NotPresent,
    /// In swap.
    Swapped,
    /// A page-cache page (not COWed) of a private file mapping.
    File,
    /// The shared zero page.
    Zero,
    /// A KSM page.
    Merged,
    /// A private anonymous page: a merge candidate.
    Anon,
}

impl PageClass {
    /// The core's view of it.
    pub fn state(self) -> PageState {
        match self {
            PageClass::NotPresent | PageClass::Swapped | PageClass::File => PageState::NotPresent,
            PageClass::Zero => PageState::Zero,
            PageClass::Merged => PageState::Merged,
            PageClass::Anon => PageState::Present,
        }
    }

    /// Whether `process_vm_readv` can read the page without faulting
    /// anything in (a present PTE exists).
    pub fn resident(self) -> bool {
        matches!(
            self,
            PageClass::File | PageClass::Zero | PageClass::Merged | PageClass::Anon
        )
    }
}

/// The class of one virtual page from its pagemap entry and, when read, its
/// frame's kpageflags. `flags` may be `None` only for a page that
/// [`flags_needed`] rules out as the zero page or a KSM page; the class is
/// then what the flags would have said.
///
/// Order matters: swap and absence first (no frame, the flags mean
/// nothing), then the zero page and KSM pages (the huge zero page shows
/// pagemap's file bit, so the flags decide before that bit does), then page
/// cache and shared memory, which KSM never merges.
pub fn classify(entry: PagemapEntry, flags: Option<KpfFlags>) -> PageClass {
    if entry.swapped() {
        return PageClass::Swapped;
    }
    if !entry.present() {
        return PageClass::NotPresent;
    }
    if let Some(f) = flags {
        if f.zero_page() {
            return PageClass::Zero;
        }
        if f.ksm() {
            return PageClass::Merged;
        }
    }
    if entry.file_or_shared() {
        return PageClass::File;
    }
    PageClass::Anon
}

/// Whether [`classify`] needs the frame's flags of this page, in a VMA that
/// is anonymous (`anon`: the page can be the zero page) or `VM_MERGEABLE`
/// (`mergeable`: the only place KSM pages live).
///
/// The zero page and KSM pages are mapped by more than one process, or lie
/// in a mergeable VMA (a KSM page can be exclusive there), or, for the huge
/// zero page, show pagemap's file bit in an anonymous VMA. So an exclusively
/// mapped page outside a mergeable VMA is neither, and page cache of a
/// private file mapping (file bit, not anonymous) is never a candidate:
/// neither needs a kpageflags read, which is most pages of most processes.
pub fn flags_needed(entry: PagemapEntry, anon: bool, mergeable: bool) -> bool {
    if !entry.present() || entry.swapped() {
        return false;
    }
    let file = entry.file_or_shared();
    if file && !anon {
        return false;
    }
    !entry.exclusive() || mergeable || file
}

/// Everything known about one virtual page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct PageInfo {
    /// The raw pagemap entry.
    pub entry: PagemapEntry,
    /// The frame's flags (0 when not present).
    pub flags: KpfFlags,
}

impl PageInfo {
    /// The page's class ([`classify`], with the flags
    /// [`PageInspector::inspect`] read for every present page).
    pub fn class(&self) -> PageClass {
        classify(self.entry, Some(self.flags))
    }

    /// Part of a transparent huge page (KSM would split it to merge).
    pub fn thp(&self) -> bool {
        self.flags.thp()
    }

    /// Mapped by this process only (a fork child's untouched pages and KSM
    /// pages are not).
    pub fn exclusive(&self) -> bool {
        self.entry.exclusive()
    }

    /// The frame, when present.
    pub fn pfn(&self) -> Option<u64> {
        self.entry.pfn()
    }
}

/// pagemap + kpageflags for one process.
#[derive(Debug)]
pub struct PageInspector {
    pagemap: Pagemap,
    kpageflags: KPageFlags,
    entries: Vec<PagemapEntry>,
    pfns: Vec<u64>,
    idx: Vec<usize>,
    flags: Vec<KpfFlags>,
}

impl PageInspector {
    /// Opens the pagemap of `pid` and `/proc/kpageflags`. Needs PFNs, so
    /// `CAP_SYS_ADMIN` (named in the error when missing).
    pub fn open(pid: u32) -> Result<PageInspector, LinuxError> {
        let kpageflags = KPageFlags::open()?;
        let pagemap = Pagemap::open(pid)?;
        pagemap.require_pfns()?;
        Ok(Self::with(pagemap, kpageflags))
    }

    /// [`PageInspector::open`] for this process itself
    /// ([`Pagemap::open_own`]).
    pub fn open_own() -> Result<PageInspector, LinuxError> {
        let kpageflags = KPageFlags::open()?;
        let pagemap = Pagemap::open_own()?;
        pagemap.require_pfns()?;
        Ok(Self::with(pagemap, kpageflags))
    }

    /// Combines an open pagemap (which must show PFNs) with kpageflags.
    pub fn with(pagemap: Pagemap, kpageflags: KPageFlags) -> PageInspector {
        PageInspector {
            pagemap,
            kpageflags,
            entries: Vec::new(),
            pfns: Vec::new(),
            idx: Vec::new(),
            flags: Vec::new(),
        }
    }

    /// The process's pagemap.
    pub fn pagemap(&self) -> &Pagemap {
        &self.pagemap
    }

    /// Fills `out[i]` for the page at `start + i * PAGE_SIZE`.
    pub fn inspect(&mut self, start: u64, out: &mut [PageInfo]) -> Result<(), LinuxError> {
        self.entries.clear();
        self.entries.resize(out.len(), PagemapEntry(0));
        self.pagemap.read(start, &mut self.entries)?;
        self.pfns.clear();
        self.idx.clear();
        for (i, e) in self.entries.iter().enumerate() {
            if let Some(pfn) = e.pfn() {
                if pfn == 0 {
                    // Present but PFN hidden: opened without CAP_SYS_ADMIN
                    // in the initial user namespace.
                    return Err(LinuxError::MissingCapability {
                        cap: crate::Capability::SysAdmin,
                        why: crate::error::WHY_PFN,
                    });
                }
                self.pfns.push(pfn);
                self.idx.push(i);
            }
        }
        self.flags.clear();
        self.flags.resize(self.pfns.len(), KpfFlags(0));
        self.kpageflags.read_many(&self.pfns, &mut self.flags)?;
        for (o, e) in out.iter_mut().zip(&self.entries) {
            *o = PageInfo {
                entry: *e,
                flags: KpfFlags(0),
            };
        }
        for (&i, &f) in self.idx.iter().zip(&self.flags) {
            out[i].flags = f;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(entry: u64, flags: u64) -> PageInfo {
        PageInfo {
            entry: PagemapEntry(entry),
            flags: KpfFlags(flags),
        }
    }

    #[test]
    fn classes() {
        const P: u64 = 1 << 63;
        assert_eq!(info(0, 0).class(), PageClass::NotPresent);
        assert_eq!(info(1 << 62, 0).class(), PageClass::Swapped);
        assert_eq!(info(P | 1 << 61 | 7, 0).class(), PageClass::File);
        assert_eq!(info(P | 7, 1 << 24).class(), PageClass::Zero);
        assert_eq!(info(P | 7, 1 << 21 | 1 << 12).class(), PageClass::Merged);
        assert_eq!(info(P | 7, 1 << 12).class(), PageClass::Anon);
        assert!(info(P | 7, 1 << 12 | 1 << 22).thp());
        assert_eq!(PageClass::File.state(), PageState::NotPresent);
        assert!(PageClass::File.resident() && !PageClass::Swapped.resident());
    }

    /// Skipping the flags where `flags_needed` says so never changes a
    /// class: every entry shape, every flag that matters, every VMA kind.
    #[test]
    fn skipped_flags_never_change_the_class() {
        const P: u64 = 1 << 63;
        const SWAP: u64 = 1 << 62;
        const FILE: u64 = 1 << 61;
        const EXCL: u64 = 1 << 56;
        let flag_sets = [0, 1 << 12, 1 << 21 | 1 << 12, 1 << 24, 1 << 22 | 1 << 12];
        for bits in [0, SWAP, P, P | FILE, P | EXCL, P | FILE | EXCL] {
            let e = PagemapEntry(bits | 7);
            for anon in [false, true] {
                for mergeable in [false, true] {
                    if flags_needed(e, anon, mergeable) {
                        continue;
                    }
                    let without = classify(e, None);
                    for f in flag_sets {
                        // Flags a frame of this shape can have: a page
                        // ruled out is neither the zero page nor KSM's.
                        let f = KpfFlags(f);
                        if f.zero_page() || f.ksm() {
                            continue;
                        }
                        assert_eq!(
                            classify(e, Some(f)),
                            without,
                            "{bits:#x} {anon} {mergeable}"
                        );
                    }
                    assert!(!matches!(without, PageClass::Zero | PageClass::Merged));
                }
            }
        }
        // Where the zero page or a KSM page can be, the flags are read.
        assert!(flags_needed(PagemapEntry(P | 7), true, false));
        assert!(flags_needed(PagemapEntry(P | EXCL | 7), true, true));
        assert!(flags_needed(PagemapEntry(P | FILE | EXCL | 7), true, false));
        assert!(!flags_needed(PagemapEntry(P | EXCL | 7), true, false));
        assert!(!flags_needed(PagemapEntry(P | FILE | 7), false, true));
    }
}
