//! # pagesift-core: the deduplication algorithms, without the operating system
//!
//! pagesift merges identical pages of many processes through the kernel's
//! KSM, but decides itself *which* memory is worth merging and *when*. This
//! crate holds that decision logic. It makes no syscalls and does no I/O:
//! memory is reached through the [`source::MemorySource`] trait and time is
//! passed in by the caller, so every algorithm runs, and is tested, without
//! root.
//!
//! ## The algorithm, before the code
//!
//! Memory is a set of *regions* (a VMA, or a fixed-size slice of a large one).
//! Most regions are not worth deduplicating: their pages are distinct
//! (sparse), rewritten soon after a merge (COW-broken) or gone within a
//! second (short-lived). UKSM's observation is that a little sampling tells
//! the kinds apart, so CPU goes where duplicates are.
//!
//! 1. **Ladder** ([`pipeline::ladder`]). Regions sit on N levels (4 by
//!    default); new regions enter the bottom. Each level is sampled as one
//!    flat page space at an interval that the level's CPU share, its round
//!    time and the per-page cost set, so higher levels are sampled more
//!    densely. Every region walks its own offset permutation, so successive
//!    rounds sample different pages. After a round a region climbs one level
//!    when its sampled duplication ratio is above V_dup, its COW-broken ratio
//!    below V_cow and its age above V_life; otherwise it drops one level.
//! 2. **Governor** ([`pipeline::governor`]). full, medium, low and quiet fix
//!    each level's CPU share and round time, which become page budgets per
//!    wake-up.
//! 3. **Partial hash** ([`pipeline::hash`]). A sampled page is hashed over
//!    only `strength` of its 1024 words, chosen by a seeded permutation. The
//!    hash is progressive and reversible: it moves to another strength at
//!    the cost of the difference.
//! 4. **Strength controller** ([`pipeline::strength`]). After each global
//!    round it weighs hashing saved against full comparisons wasted on false
//!    collisions and probes the strength, TCP-slow-start fashion, towards
//!    the best net benefit.
//! 5. **Sample index** ([`pipeline::index`]). Hash tables of merged
//!    ("stable") and not-yet-merged ("unstable") sampled pages, sharded as
//!    memory grows (nuKSM). A hash hit is only a candidate: a full
//!    comparison decides.
//! 6. **Hints** ([`pipeline::hints`]). XLH's bounded newest-first stack of
//!    pages that just received file data, interleaved with the linear scan.
//! 7. **Distiller** ([`pipeline::distill`]). One wake-up: take each level's
//!    budget of samples, hash, look up, verify, and feed the results back to
//!    the ladder and the controller.
//!
//! ## Layout
//!
//! - [`pipeline`]: the algorithms above and the rest of the daemon's loop
//!   (sweep, write watch, ksmd pacing, NUMA placement, savings, Singleton
//!   scrubbing), one module per stage, in the order a page meets them.
//! - [`source`] (the [`source::MemorySource`] trait every stage reads
//!   through, and an in-memory machine), [`ranges`] (disjoint address
//!   ranges) and [`text`] (escaping names that processes chose): shared
//!   ground.
//! - `research` (cargo feature `research`, off by default): the seeded
//!   simulation and the papers' hash baselines, for `pagesift simulate`,
//!   benchmarks and examples; nothing in the daemon uses them.
//!
//! The scan's statistics (exact census, sampled estimator) live in
//! `pagesift-scan`, their only user.
//!
//! The Linux side (reading /proc, ptrace, KSM's sysfs) lives in
//! `pagesift-linux`; it implements [`source::MemorySource`] and turns the
//! ladder's decisions into `MADV_MERGEABLE` ranges.

#![forbid(unsafe_code)]

pub mod pipeline;
pub mod ranges;
#[cfg(feature = "research")]
pub mod research;
pub mod source;
pub mod text;

/// Bytes in a page. pagesift works on 4 KiB base pages, as KSM does.
pub const PAGE_SIZE: usize = 4096;
/// 32-bit words in a page.
pub const WORDS_PER_PAGE: usize = PAGE_SIZE / 4;
/// A page viewed as its 1024 host-endian 32-bit words.
pub type PageWords = [u32; WORDS_PER_PAGE];

/// One page-aligned page.
#[repr(C, align(4096))]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct AlignedPage(PageWords);

/// A buffer of page-aligned pages, viewable as a slice of [`PageWords`].
///
/// Why aligned: pages are read into these buffers from other processes
/// and copied between them, and a 4 KiB copy whose destination is not
/// page-aligned while its source is costs several times more. Measured
/// by hand in the daemon (2026-12-04, 2-CPU AMD EPYC, Linux 6.18.44, a
/// 1 GiB process of distinct pages sampled under the defaults, timers
/// around the copy): copying each sampled page from the aligned read
/// buffer into the distiller's 16-byte-aligned `Vec<PageWords>` took
/// 2.4 µs a page, against 1.0 µs for the `process_vm_readv` that read
/// it; into this buffer, 0.24 µs.
pub struct PageBuffer {
    pages: Vec<AlignedPage>,
}

impl std::fmt::Debug for PageBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PageBuffer({} pages)", self.pages.len())
    }
}

impl PageBuffer {
    /// `n` zeroed pages.
    pub fn new(n: usize) -> PageBuffer {
        PageBuffer {
            pages: vec![AlignedPage([0; WORDS_PER_PAGE]); n],
        }
    }

    /// Number of pages.
    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Makes the buffer hold at least `n` pages, zeroing the new ones. It
    /// never shrinks: a buffer reused for reads of varying size would
    /// otherwise zero pages again on every regrowth.
    pub fn grow_to(&mut self, n: usize) {
        if self.pages.len() < n {
            self.pages.resize(n, AlignedPage([0; WORDS_PER_PAGE]));
        }
    }

    /// Whether it holds no page.
    pub fn is_empty(&self) -> bool {
        self.pages.is_empty()
    }

    /// The pages.
    pub fn pages(&self) -> &[PageWords] {
        bytemuck::cast_slice(&self.pages)
    }

    /// The pages, writable (e.g. as the output of a read).
    pub fn pages_mut(&mut self) -> &mut [PageWords] {
        bytemuck::cast_slice_mut(&mut self.pages)
    }

    /// Page `i` as bytes.
    pub fn bytes(&self, i: usize) -> &[u8] {
        bytemuck::bytes_of(&self.pages[i].0)
    }
}

impl std::ops::Deref for PageBuffer {
    type Target = [PageWords];
    fn deref(&self) -> &[PageWords] {
        self.pages()
    }
}

impl std::ops::DerefMut for PageBuffer {
    fn deref_mut(&mut self) -> &mut [PageWords] {
        self.pages_mut()
    }
}
/// Time on the caller's monotonic clock, in nanoseconds. The core never
/// reads a clock itself.
pub type Nanos = u64;

/// Identifies a region for as long as pagesift tracks it. Ids are never
/// reused, so a stale id simply finds nothing.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct RegionId(pub u64);

/// One page of one region: the unit that is sampled, hashed and indexed.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct PageRef {
    pub region: RegionId,
    /// Page index within the region (a region is at most 2^32 pages, 16 TiB).
    pub page: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_buffer_is_page_aligned_and_viewable() {
        let mut b = PageBuffer::new(3);
        assert_eq!(b.len(), 3);
        for p in b.pages() {
            assert_eq!(p.as_ptr() as usize % PAGE_SIZE, 0);
        }
        b.pages_mut()[1][5] = 7;
        assert_eq!(b.bytes(1)[20], 7u32.to_ne_bytes()[0]);
        assert_eq!(b[1][5], 7, "viewed through Deref");
        b.grow_to(2);
        assert_eq!(b.len(), 3, "never shrinks");
        b.grow_to(5);
        assert_eq!(b.len(), 5);
        assert_eq!(b[1][5], 7, "kept");
        assert!(b[4].iter().all(|&w| w == 0));
        assert_eq!(b[4].as_ptr() as usize % PAGE_SIZE, 0);
    }
}
