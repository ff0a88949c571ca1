//! A workload region in real memory: an anonymous mapping plus the slots
//! that say what each page holds.
//!
//! Filling follows the slots exactly: untouched pages are never accessed
//! (so they stay non-present), zero slots are read once (so the kernel maps
//! the shared zero page), data slots are written with their content. The
//! checksum covers the pages that were accessed, in address order, and never
//! touches an untouched page, so asking for it does not change what is
//! present.

use crate::content::{PAGE, PageMaker};
use crate::layout::Slot;
use pagesift_linux::sys::{AnonMapping, HugePages};
use std::hash::Hasher;
use twox_hash::XxHash3_64;

/// One region of a workload.
pub struct Memory {
    map: AnonMapping,
    slots: Vec<Slot>,
}

impl Memory {
    /// Maps a region for `slots` (not yet filled).
    pub fn map(slots: Vec<Slot>, huge: HugePages) -> std::io::Result<Memory> {
        let map = AnonMapping::new(slots.len() * PAGE, huge)?;
        Ok(Memory { map, slots })
    }

    /// First address.
    pub fn addr(&self) -> u64 {
        self.map.addr()
    }

    /// Splits the region into VMAs of `pages` pages (see
    /// `AnonMapping::split_vmas`); returns how many it is now.
    pub fn split_vmas(&self, pages: usize) -> std::io::Result<usize> {
        self.map.split_vmas(pages)
    }

    /// The slots.
    pub fn slots(&self) -> &[Slot] {
        &self.slots
    }

    /// Writes (or reads, for zero slots) every page as its slot says.
    pub fn fill(&mut self, maker: &PageMaker) {
        // Fault runs of pages in with one madvise each: one page fault per
        // page would cost more than writing the page.
        let mut i = 0;
        while i < self.slots.len() {
            let kind = std::mem::discriminant(&self.slots[i]);
            let mut j = i + 1;
            while j < self.slots.len() && std::mem::discriminant(&self.slots[j]) == kind {
                j += 1;
            }
            let write = matches!(self.slots[i], Slot::Data(_));
            if self.slots[i] != Slot::Untouched {
                // Best effort: a failure only means slower page faults below.
                let _ = self.map.populate(i * PAGE, (j - i) * PAGE, write);
            }
            i = j;
        }
        let bytes = self.map.as_mut_slice();
        for (page, slot) in bytes.chunks_exact_mut(PAGE).zip(&self.slots) {
            match *slot {
                Slot::Untouched => {}
                // A read fault on untouched anonymous memory maps the zero
                // page; black_box keeps the read.
                Slot::Zero => {
                    std::hint::black_box(page[0]);
                }
                Slot::Data(id) => maker.write(id, page),
            }
        }
    }

    /// Rewrites page `i` with content `id` (a fork child's rewrite, or the
    /// cow-broken workload's same-content memset).
    pub fn write_page(&mut self, i: usize, id: u64, maker: &PageMaker) {
        let page = &mut self.map.as_mut_slice()[i * PAGE..(i + 1) * PAGE];
        maker.write(id, page);
        self.slots[i] = Slot::Data(id);
    }

    /// Writes page `i`'s first byte back as it is: a merged page is
    /// copied (a COW break) and keeps its content, so ksmd can merge it
    /// again. Only data pages: a write to an untouched or zero-page slot
    /// would fault a new page in, and the slot would no longer say what
    /// is mapped. Whether it wrote.
    pub fn touch_page(&mut self, i: usize) -> bool {
        if !matches!(self.slots.get(i), Some(Slot::Data(_))) {
            return false;
        }
        let page = &mut self.map.as_mut_slice()[i * PAGE..(i + 1) * PAGE];
        // The compiler must not drop a store of the value just loaded.
        page[0] = std::hint::black_box(page[0]);
        true
    }

    /// xxh3-64 over the accessed pages (index and bytes), as hex.
    pub fn checksum(&self) -> String {
        let mut h = XxHash3_64::new();
        let bytes = self.map.as_slice();
        for (i, (page, slot)) in bytes.chunks_exact(PAGE).zip(&self.slots).enumerate() {
            if *slot != Slot::Untouched {
                h.write(&(i as u64).to_le_bytes());
                h.write(page);
            }
        }
        format!("{:016x}", h.finish())
    }
}
