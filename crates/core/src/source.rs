//! Where pages come from: the [`MemorySource`] trait, and [`InMemorySource`],
//! a machine simulated in memory for tests and the simulation.
//!
//! The Linux implementation (pagemap, kpageflags, process_vm_readv) lives in
//! `pagesift-linux`. The trait is shaped by what Linux can do cheaply: page
//! states come from pagemap/kpageflags without touching the page, and page
//! contents are read in batches.

use crate::{PageRef, PageWords, RegionId};
use std::collections::BTreeMap;

/// What is known about a page without reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum PageState {
    /// Not backed by memory; reading it would fault a page in, so it is
    /// never read.
    NotPresent,
    /// Mapped to the shared zero page (or KSM's zero page): nothing to save.
    Zero,
    /// Already merged by KSM.
    Merged,
    /// Present, private, not merged: a candidate.
    Present,
}

/// A region as the source sees it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionInfo {
    pub id: RegionId,
    /// Length in pages.
    pub pages: u32,
    /// The owning process (a pid on Linux); regions of one owner are
    /// actuated together.
    pub owner: u32,
}

/// Why a read failed. A region that disappears is normal on a live machine
/// (the process exited, the VMA was unmapped), so it is its own variant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceError {
    /// The region (or its owner) no longer exists.
    Gone(RegionId),
    /// The page index is past the region's end.
    OutOfRange(PageRef),
    /// Anything else, described for the operator.
    Other(String),
}

impl std::fmt::Display for SourceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourceError::Gone(r) => write!(f, "region {} is gone", r.0),
            SourceError::OutOfRange(p) => {
                write!(
                    f,
                    "page {} is past the end of region {}",
                    p.page, p.region.0
                )
            }
            SourceError::Other(s) => f.write_str(s),
        }
    }
}

impl std::error::Error for SourceError {}

/// Memory as pagesift's algorithms see it.
pub trait MemorySource {
    /// The regions that exist now.
    fn regions(&self) -> Vec<RegionInfo>;

    /// The state of one page, without reading or faulting it.
    fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError>;

    /// Reads one present page. Callers never read a page whose state is
    /// not `Present`, `Merged` or `Zero`.
    fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError>;

    /// Whether the page was written since the previous call for it, if
    /// this source can tell (on Linux: uffd-wp through PAGEMAP_SCAN). A
    /// write to a page that was found duplicated is a COW break that would
    /// have happened had it been merged.
    fn take_written(&mut self, _page: PageRef) -> Option<bool> {
        None
    }

    /// Samples several pages at once: `states[i]` receives the state of
    /// `pages[i]` and, when it is `Present` or `Merged`, `out[i]` receives
    /// its words and `read[i]` is true (false when it could not be read,
    /// e.g. unmapped in between, or for a `Merged` page whose content the
    /// source knows it gave recently: merged pages are write-protected). A sampler asks for a batch of pages at a
    /// time because on Linux the per-call cost dominates: sources that can
    /// batch (pagemap, kpageflags, process_vm_readv) override this; the
    /// default asks page by page. A source that wraps another must forward
    /// this call, or it falls back to that default without a sound.
    /// Callers pass page-aligned pages (a [`crate::PageBuffer`]): the Linux
    /// source copies each page it read into `out`, and that copy cost ten
    /// times more into a `Vec<PageWords>` (see `PageBuffer`).
    ///
    /// # Panics
    /// If `out`, `states` or `read` is shorter than `pages`.
    fn sample_pages(
        &mut self,
        pages: &[PageRef],
        out: &mut [PageWords],
        states: &mut [Result<PageState, SourceError>],
        read: &mut [bool],
    ) {
        assert!(
            out.len() >= pages.len() && states.len() >= pages.len() && read.len() >= pages.len()
        );
        for (i, &p) in pages.iter().enumerate() {
            states[i] = self.page_state(p);
            read[i] = matches!(states[i], Ok(PageState::Present | PageState::Merged))
                && self.read_page(p, &mut out[i]).is_ok();
        }
    }

    /// Reads several pages; `out[i]` receives `pages[i]`. Returns how many
    /// leading pages were read before the first failure; sources that can
    /// batch (process_vm_readv) override this.
    fn read_pages(&mut self, pages: &[PageRef], out: &mut [PageWords]) -> usize {
        let mut done = 0;
        for (p, o) in pages.iter().zip(out.iter_mut()) {
            if self.read_page(*p, o).is_err() {
                break;
            }
            done += 1;
        }
        done
    }
}

/// One simulated page. Contents are kept as a small "content id" expanded
/// on read, so a simulated machine of many GiB costs a few bytes per page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SimPage {
    content: u64,
    state: PageState,
    written: bool,
}

#[derive(Clone, Debug)]
struct SimRegion {
    owner: u32,
    pages: Vec<SimPage>,
    cow_breaks: u64,
}

/// A machine in memory. Page contents are identified by a 64-bit content
/// id: equal ids give byte-identical pages. By default different ids give
/// pages that differ everywhere; [`InMemorySource::set_differing_words`]
/// makes near-identical pages instead, for the strength controller.
#[derive(Clone, Debug, Default)]
pub struct InMemorySource {
    regions: BTreeMap<RegionId, SimRegion>,
    next_id: u64,
    differing_words: u32,
    reads: u64,
}

/// Content id of the all-zero page.
pub const ZERO_CONTENT: u64 = 0;

/// Pages just mapped with these contents: present (or the zero page),
/// none merged or written.
fn fresh_pages(contents: &[u64]) -> Vec<SimPage> {
    contents
        .iter()
        .map(|&c| SimPage {
            content: c,
            state: if c == ZERO_CONTENT {
                PageState::Zero
            } else {
                PageState::Present
            },
            written: false,
        })
        .collect()
}

impl InMemorySource {
    pub fn new() -> Self {
        InMemorySource {
            differing_words: crate::WORDS_PER_PAGE as u32,
            ..Default::default()
        }
    }

    /// Each content id then overwrites only `n` words of a shared background,
    /// at offsets it chooses itself, so two different pages differ in at
    /// most `2n` words.
    pub fn set_differing_words(&mut self, n: u32) {
        self.differing_words = n.clamp(1, crate::WORDS_PER_PAGE as u32);
    }

    /// Maps a new region whose page `i` has content id `contents[i]`.
    pub fn map(&mut self, owner: u32, contents: &[u64]) -> RegionId {
        self.next_id += 1;
        let id = RegionId(self.next_id);
        self.regions.insert(
            id,
            SimRegion {
                owner,
                pages: fresh_pages(contents),
                cow_breaks: 0,
            },
        );
        id
    }

    /// Maps `contents` anew in place of region `id`, keeping its id: fresh
    /// pages, none merged or written (an `munmap` and an `mmap` of the same
    /// size that returned the same addresses). Returns whether it existed.
    pub fn renew(&mut self, id: RegionId, contents: &[u64]) -> bool {
        let Some(r) = self.regions.get_mut(&id) else {
            return false;
        };
        r.pages = fresh_pages(contents);
        r.cow_breaks = 0;
        true
    }

    /// Cuts region `id` at page `at`, as an madvise over part of a VMA
    /// splits it: `id` keeps pages `..at`, and pages `at..` become a new
    /// region of the same owner, with their contents and states, whose id
    /// is returned (`None` if `id` does not exist or `at` is not inside it).
    pub fn split(&mut self, id: RegionId, at: u32) -> Option<RegionId> {
        let r = self.regions.get_mut(&id)?;
        if at == 0 || at as usize >= r.pages.len() {
            return None;
        }
        let tail = r.pages.split_off(at as usize);
        let owner = r.owner;
        self.next_id += 1;
        let new = RegionId(self.next_id);
        self.regions.insert(
            new,
            SimRegion {
                owner,
                pages: tail,
                cow_breaks: 0,
            },
        );
        Some(new)
    }

    /// Unmaps a region; later accesses report [`SourceError::Gone`].
    pub fn unmap(&mut self, id: RegionId) -> bool {
        self.regions.remove(&id).is_some()
    }

    /// Writes new content into a page. A write to a merged page breaks the
    /// merge (copy-on-write) and is counted.
    pub fn write(&mut self, page: PageRef, content: u64) -> Result<(), SourceError> {
        let r = self
            .regions
            .get_mut(&page.region)
            .ok_or(SourceError::Gone(page.region))?;
        let p = r
            .pages
            .get_mut(page.page as usize)
            .ok_or(SourceError::OutOfRange(page))?;
        if p.state == PageState::Merged {
            r.cow_breaks += 1;
        }
        p.content = content;
        p.written = true;
        p.state = if content == ZERO_CONTENT {
            PageState::Zero
        } else {
            PageState::Present
        };
        Ok(())
    }

    /// Takes a page out of memory (never touched yet, or reclaimed): it
    /// reads as not present until it is written.
    pub fn evict(&mut self, page: PageRef) -> Result<(), SourceError> {
        let p = self.page_mut(page)?;
        p.state = PageState::NotPresent;
        Ok(())
    }

    /// Marks a page merged, as KSM would after finding its twin.
    pub fn merge(&mut self, page: PageRef) -> Result<(), SourceError> {
        let p = self.page_mut(page)?;
        if p.state == PageState::Present {
            p.state = PageState::Merged;
        }
        Ok(())
    }

    /// The content id of a page (the simulation's ground truth).
    pub fn content(&self, page: PageRef) -> Result<u64, SourceError> {
        self.page_ref(page).map(|p| p.content)
    }

    /// The state of a page, without needing `&mut` (the simulation's view).
    pub fn state(&self, page: PageRef) -> Result<PageState, SourceError> {
        self.page_ref(page).map(|p| p.state)
    }

    fn page_ref(&self, page: PageRef) -> Result<&SimPage, SourceError> {
        let r = self
            .regions
            .get(&page.region)
            .ok_or(SourceError::Gone(page.region))?;
        r.pages
            .get(page.page as usize)
            .ok_or(SourceError::OutOfRange(page))
    }

    /// COW breaks of merged pages in a region so far.
    pub fn cow_breaks(&self, id: RegionId) -> Option<u64> {
        self.regions.get(&id).map(|r| r.cow_breaks)
    }

    /// Pages read so far (to check that samplers stay within budget).
    pub fn reads(&self) -> u64 {
        self.reads
    }

    /// Expands a content id into page words.
    pub fn fill(&self, content: u64, out: &mut PageWords) {
        if content == ZERO_CONTENT {
            out.fill(0);
            return;
        }
        let n = self.differing_words as usize;
        // Shared background, the same for every content id.
        for (i, w) in out.iter_mut().enumerate() {
            *w = (i as u32).wrapping_mul(0x9e37_79b9) ^ 0x5bd1_e995;
        }
        // `n` words derived from the content id, at offsets it chooses.
        let mut x = content ^ 0x243f_6a88_85a3_08d3;
        for k in 0..n {
            x = splitmix(x);
            let off = if n == crate::WORDS_PER_PAGE {
                k
            } else {
                (x >> 40) as usize % crate::WORDS_PER_PAGE
            };
            out[off] = (x as u32) ^ (content as u32);
        }
    }

    fn page_mut(&mut self, page: PageRef) -> Result<&mut SimPage, SourceError> {
        let r = self
            .regions
            .get_mut(&page.region)
            .ok_or(SourceError::Gone(page.region))?;
        r.pages
            .get_mut(page.page as usize)
            .ok_or(SourceError::OutOfRange(page))
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl MemorySource for InMemorySource {
    fn regions(&self) -> Vec<RegionInfo> {
        self.regions
            .iter()
            .map(|(&id, r)| RegionInfo {
                id,
                pages: r.pages.len() as u32,
                owner: r.owner,
            })
            .collect()
    }

    fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError> {
        self.page_mut(page).map(|p| p.state)
    }

    fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError> {
        let content = self.content(page)?;
        self.reads += 1;
        self.fill(content, out);
        Ok(())
    }

    fn take_written(&mut self, page: PageRef) -> Option<bool> {
        self.page_mut(page)
            .ok()
            .map(|p| std::mem::replace(&mut p.written, false))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::WORDS_PER_PAGE;

    fn read(src: &mut InMemorySource, p: PageRef) -> Box<PageWords> {
        let mut b = Box::new([0u32; WORDS_PER_PAGE]);
        src.read_page(p, &mut b).unwrap();
        b
    }

    #[test]
    fn equal_ids_equal_pages_distinct_ids_distinct() {
        let mut s = InMemorySource::new();
        let r = s.map(1, &[5, 5, 6, ZERO_CONTENT]);
        let p = |i| PageRef { region: r, page: i };
        assert_eq!(read(&mut s, p(0)), read(&mut s, p(1)));
        assert_ne!(read(&mut s, p(0)), read(&mut s, p(2)));
        assert!(read(&mut s, p(3)).iter().all(|&w| w == 0));
        assert_eq!(s.page_state(p(3)), Ok(PageState::Zero));
    }

    #[test]
    fn near_identical_pages_differ_in_few_words() {
        let mut s = InMemorySource::new();
        s.set_differing_words(3);
        let r = s.map(1, &[10, 11]);
        let a = read(&mut s, PageRef { region: r, page: 0 });
        let b = read(&mut s, PageRef { region: r, page: 1 });
        let diff = a.iter().zip(b.iter()).filter(|(x, y)| x != y).count();
        assert!((1..=6).contains(&diff), "{diff} words differ");
    }

    #[test]
    fn cow_break_counted_and_unmap_is_gone() {
        let mut s = InMemorySource::new();
        let r = s.map(1, &[7, 7]);
        let p = PageRef { region: r, page: 0 };
        s.merge(p).unwrap();
        assert_eq!(s.page_state(p), Ok(PageState::Merged));
        assert_eq!(s.take_written(p), Some(false));
        s.write(p, 8).unwrap();
        assert_eq!(s.page_state(p), Ok(PageState::Present));
        assert_eq!(s.take_written(p), Some(true));
        assert_eq!(s.take_written(p), Some(false));
        assert_eq!(s.cow_breaks(r), Some(1));
        assert!(s.unmap(r));
        assert_eq!(s.page_state(p), Err(SourceError::Gone(r)));
    }
}
