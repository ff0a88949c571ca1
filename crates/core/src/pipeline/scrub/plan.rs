//! Which host-cache pages of one image to drop.
//!
//! ## The rule, before the code
//!
//! The input is what the Linux side found about the cached pages of one
//! disk image: for each page its index in the file, whether the guest holds
//! its content ([`Held`]: only a byte-for-byte comparison with a guest page
//! counts, a matching hash is a candidate), whether the kernel has it dirty
//! or under writeback, and the folios (the kernel's unit of page cache,
//! one page or a naturally aligned power-of-two run) the pages belong to.
//!
//! A folio is dropped only if **every** page of it is cached, held by the
//! guest (verified), clean and not under writeback. Whole folios only:
//! `POSIX_FADV_DONTNEED` evicts a folio only when the range covers all of
//! it, so asking for part of one does nothing and would count as dropped
//! what was not. Dirty and writeback pages are never dropped: the host
//! copy is then the newest copy of the data, or on its way to disk. A page
//! whose content the guest does not hold is the only other copy in memory;
//! keeping it is the point of exclusive caching.
//!
//! The output is byte ranges for `DONTNEED`, whole folios, adjacent ones
//! merged, in file order.
//!
//! **Before the folios are known: runs.** Learning a page's folio is the
//! dearest step of a drop (the Linux side maps the file and faults every
//! page in to read its frame), and on the hosts measured the images are
//! cached in one-page folios. So the caller first drops [`plan_runs`]: the
//! maximal runs of droppable pages, as if every page were its own folio.
//! That is safe whatever the real folios are, because the kernel's
//! `DONTNEED` evicts only folios lying wholly inside the range: a large
//! folio inside a run has only droppable pages (a run has no other) and
//! goes, one reaching out of the run stays, as [`plan_drops`] would have
//! decided. Dirty and writeback pages are not known yet at that point; the
//! caller checks each run's counts right before its `DONTNEED` and plans a
//! run that has any with its folios ([`plan_drops`]), so that its clean
//! folios still go.
//!
//! Invariants (property-tested): every dropped page is in the input with
//! `Held::Verified`, clean, not under writeback; every range of
//! [`plan_drops`] is a union of whole input folios; every range of
//! [`plan_runs`] is a maximal run of consecutive droppable pages; nothing
//! is dropped twice.

use crate::PAGE_SIZE;

/// Whether the guest holds a host page's content.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Held {
    /// No guest page has its hash.
    No,
    /// A guest page has its hash, but the bytes were not (yet) compared,
    /// or the comparison failed.
    HashOnly,
    /// A guest page was compared byte for byte and is equal.
    Verified,
}

/// One cached page of an image, as found on the host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CachedPage {
    /// Page index in the file.
    pub index: u64,
    /// Whether the guest holds its content.
    pub held: Held,
    /// The kernel has it dirty (newer than the disk).
    pub dirty: bool,
    /// The kernel is writing it to disk.
    pub writeback: bool,
}

impl CachedPage {
    /// Whether this page alone allows dropping.
    pub fn droppable(&self) -> bool {
        self.held == Held::Verified && !self.dirty && !self.writeback
    }
}

/// A folio of the image's page cache: `pages` pages from index `first`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Folio {
    /// Index of its first page in the file.
    pub first: u64,
    /// Its pages (1 for an order-0 folio).
    pub pages: u64,
}

impl Folio {
    /// One past its last page index.
    pub fn end(&self) -> u64 {
        self.first.saturating_add(self.pages)
    }
}

/// A byte range of the file to `DONTNEED`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DropRange {
    /// First byte.
    pub offset: u64,
    /// Bytes (whole pages).
    pub len: u64,
}

impl DropRange {
    /// The pages it covers.
    pub fn pages(&self) -> u64 {
        self.len / PAGE_SIZE as u64
    }

    /// Its first page index.
    pub fn first_page(&self) -> u64 {
        self.offset / PAGE_SIZE as u64
    }
}

/// The ranges to drop (see the module header). `pages` may come in any
/// order; a page index listed twice counts as droppable only if every
/// entry is. Folios that overlap each other are ignored (the kernel's
/// folios never overlap; if two reports disagree, neither is trusted).
pub fn plan_drops(pages: &[CachedPage], folios: &[Folio]) -> Vec<DropRange> {
    let mut by_index: Vec<(u64, bool)> = pages.iter().map(|p| (p.index, p.droppable())).collect();
    by_index.sort_unstable();
    // Merge duplicates: droppable only if all entries are.
    let mut merged: Vec<(u64, bool)> = Vec::with_capacity(by_index.len());
    for (i, ok) in by_index {
        match merged.last_mut() {
            Some((j, prev)) if *j == i => *prev &= ok,
            _ => merged.push((i, ok)),
        }
    }
    let mut folios: Vec<Folio> = folios.iter().copied().filter(|f| f.pages > 0).collect();
    folios.sort_unstable();
    let mut out: Vec<DropRange> = Vec::new();
    for (k, f) in folios.iter().enumerate() {
        let overlaps_prev = k > 0 && folios[k - 1].end() > f.first;
        let overlaps_next = k + 1 < folios.len() && folios[k + 1].first < f.end();
        if overlaps_prev || overlaps_next {
            continue;
        }
        let start = merged.partition_point(|&(i, _)| i < f.first);
        let span = &merged[start..];
        let whole = (span.len() as u64) >= f.pages
            && span[..f.pages as usize]
                .iter()
                .enumerate()
                .all(|(n, &(i, ok))| ok && i == f.first + n as u64);
        if !whole {
            continue;
        }
        let (offset, len) = (f.first * PAGE_SIZE as u64, f.pages * PAGE_SIZE as u64);
        match out.last_mut() {
            Some(r) if r.offset + r.len == offset => r.len += len,
            _ => out.push(DropRange { offset, len }),
        }
    }
    out
}

/// The maximal runs of consecutive droppable pages of `pages` (any
/// order), as byte ranges in file order: [`plan_drops`] with every page
/// its own folio (see the module header for why that is safe before the
/// folios are known).
pub fn plan_runs(pages: &[CachedPage]) -> Vec<DropRange> {
    let mut order0: Vec<Folio> = pages
        .iter()
        .map(|p| Folio {
            first: p.index,
            pages: 1,
        })
        .collect();
    // A page listed twice gives two equal folios, which plan_drops takes
    // for overlapping reports and ignores: list each index once.
    order0.sort_unstable();
    order0.dedup();
    plan_drops(pages, &order0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: u64 = PAGE_SIZE as u64;

    fn page(index: u64, held: Held) -> CachedPage {
        CachedPage {
            index,
            held,
            dirty: false,
            writeback: false,
        }
    }

    fn order0(range: std::ops::Range<u64>) -> Vec<Folio> {
        range.map(|first| Folio { first, pages: 1 }).collect()
    }

    #[test]
    fn verified_clean_order0_pages_are_dropped_and_merged() {
        let pages: Vec<_> = (0..4).map(|i| page(i, Held::Verified)).collect();
        assert_eq!(
            plan_drops(&pages, &order0(0..4)),
            vec![DropRange {
                offset: 0,
                len: 4 * P
            }]
        );
    }

    #[test]
    fn a_page_the_guest_does_not_hold_is_kept() {
        let pages = [
            page(0, Held::Verified),
            page(1, Held::No),
            page(2, Held::HashOnly),
            page(3, Held::Verified),
        ];
        assert_eq!(
            plan_drops(&pages, &order0(0..4)),
            vec![
                DropRange { offset: 0, len: P },
                DropRange {
                    offset: 3 * P,
                    len: P
                }
            ]
        );
    }

    #[test]
    fn dirty_and_writeback_pages_are_kept() {
        let mut dirty = page(1, Held::Verified);
        dirty.dirty = true;
        let mut wb = page(2, Held::Verified);
        wb.writeback = true;
        let pages = [page(0, Held::Verified), dirty, wb];
        assert_eq!(
            plan_drops(&pages, &order0(0..3)),
            vec![DropRange { offset: 0, len: P }]
        );
    }

    #[test]
    fn a_large_folio_goes_whole_or_not_at_all() {
        let big = [Folio { first: 8, pages: 8 }];
        let all: Vec<_> = (8..16).map(|i| page(i, Held::Verified)).collect();
        assert_eq!(
            plan_drops(&all, &big),
            vec![DropRange {
                offset: 8 * P,
                len: 8 * P
            }]
        );
        // One page of it not held: the whole folio stays.
        let mut one_missing = all.clone();
        one_missing[5].held = Held::No;
        assert!(plan_drops(&one_missing, &big).is_empty());
        // One page of it not even cached (not listed): stays.
        assert!(plan_drops(&all[..7], &big).is_empty());
        // One page dirty: stays.
        let mut dirty = all.clone();
        dirty[0].dirty = true;
        assert!(plan_drops(&dirty, &big).is_empty());
    }

    #[test]
    fn a_page_without_a_folio_is_not_dropped() {
        assert!(plan_drops(&[page(0, Held::Verified)], &[]).is_empty());
    }

    #[test]
    fn contradictory_reports_drop_nothing() {
        // A page listed twice with different verdicts.
        let pages = [page(0, Held::Verified), page(0, Held::No)];
        assert!(plan_drops(&pages, &order0(0..1)).is_empty());
        // Overlapping folios.
        let pages: Vec<_> = (0..4).map(|i| page(i, Held::Verified)).collect();
        let folios = [Folio { first: 0, pages: 4 }, Folio { first: 2, pages: 1 }];
        assert!(plan_drops(&pages, &folios).is_empty());
    }

    fn any_page() -> impl Strategy<Value = CachedPage> {
        (
            0u64..64,
            prop_oneof![Just(Held::No), Just(Held::HashOnly), Just(Held::Verified)],
            proptest::bool::weighted(0.1),
            proptest::bool::weighted(0.1),
        )
            .prop_map(|(index, held, dirty, writeback)| CachedPage {
                index,
                held,
                dirty,
                writeback,
            })
    }

    /// Naturally aligned folios of order 0..=3 tiling 0..64.
    fn any_folios() -> impl Strategy<Value = Vec<Folio>> {
        proptest::collection::vec(0u32..4, 64).prop_map(|orders| {
            let mut out = Vec::new();
            let mut i = 0u64;
            while i < 64 {
                let mut order = orders[i as usize];
                while order > 0 && (!i.is_multiple_of(1 << order) || i + (1 << order) > 64) {
                    order -= 1;
                }
                out.push(Folio {
                    first: i,
                    pages: 1 << order,
                });
                i += 1 << order;
            }
            out
        })
    }

    proptest! {
        #[test]
        fn only_whole_folios_of_verified_clean_pages_are_dropped(
            pages in proptest::collection::vec(any_page(), 0..80),
            folios in any_folios(),
        ) {
            let drops = plan_drops(&pages, &folios);
            let mut dropped = std::collections::BTreeSet::new();
            for r in &drops {
                prop_assert_eq!(r.offset % P, 0);
                prop_assert_eq!(r.len % P, 0);
                prop_assert!(r.len > 0);
                for i in r.first_page()..r.first_page() + r.pages() {
                    prop_assert!(dropped.insert(i), "page {} dropped twice", i);
                    // Every entry for this page allows it.
                    let entries: Vec<_> = pages.iter().filter(|p| p.index == i).collect();
                    prop_assert!(!entries.is_empty(), "page {} not cached", i);
                    for p in entries {
                        prop_assert!(p.held == Held::Verified && !p.dirty && !p.writeback);
                    }
                }
            }
            // Whole folios: a folio is either fully dropped or untouched.
            for f in &folios {
                let n = (f.first..f.end()).filter(|i| dropped.contains(i)).count() as u64;
                prop_assert!(n == 0 || n == f.pages, "folio {:?} split", f);
            }
        }

        #[test]
        fn every_droppable_folio_is_dropped(folios in any_folios(), held in proptest::collection::vec(any::<bool>(), 64)) {
            // With no dirty pages and every page cached, a folio is dropped
            // exactly when all of its pages are verified.
            let pages: Vec<_> = (0..64u64)
                .map(|i| page(i, if held[i as usize] { Held::Verified } else { Held::No }))
                .collect();
            let drops = plan_drops(&pages, &folios);
            let dropped: u64 = drops.iter().map(|r| r.pages()).sum();
            let expected: u64 = folios
                .iter()
                .filter(|f| (f.first..f.end()).all(|i| held[i as usize]))
                .map(|f| f.pages)
                .sum();
            prop_assert_eq!(dropped, expected);
        }

        #[test]
        fn runs_are_maximal_and_hold_only_droppable_pages(
            pages in proptest::collection::vec(any_page(), 0..80),
        ) {
            let ok = |i: u64| {
                let entries: Vec<_> = pages.iter().filter(|p| p.index == i).collect();
                !entries.is_empty() && entries.iter().all(|p| p.droppable())
            };
            let runs = plan_runs(&pages);
            let mut covered = std::collections::BTreeSet::new();
            for (k, r) in runs.iter().enumerate() {
                prop_assert!(r.len > 0 && r.offset % P == 0 && r.len % P == 0);
                let (first, end) = (r.first_page(), r.first_page() + r.pages());
                for i in first..end {
                    prop_assert!(ok(i), "page {} is not droppable", i);
                    prop_assert!(covered.insert(i), "page {} twice", i);
                }
                prop_assert!(first == 0 || !ok(first - 1), "run {:?} not maximal", r);
                prop_assert!(!ok(end), "run {:?} not maximal", r);
                prop_assert!(k == 0 || runs[k - 1].offset + runs[k - 1].len < r.offset);
            }
            for i in 0..64 {
                prop_assert_eq!(ok(i), covered.contains(&i), "page {}", i);
            }
        }

        #[test]
        fn the_kernel_evicts_from_runs_what_the_folio_plan_drops(
            pages in proptest::collection::vec(any_page(), 0..80),
            folios in any_folios(),
        ) {
            // DONTNEED over a range evicts the folios lying wholly inside
            // it; every page belongs to one folio (they tile 0..64).
            let evicted = |ranges: &[DropRange]| -> std::collections::BTreeSet<u64> {
                folios
                    .iter()
                    .filter(|f| ranges.iter().any(|r| {
                        r.first_page() <= f.first && f.end() <= r.first_page() + r.pages()
                    }))
                    .flat_map(|f| f.first..f.end())
                    .collect()
            };
            prop_assert_eq!(evicted(&plan_runs(&pages)), evicted(&plan_drops(&pages, &folios)));
        }
    }

    #[test]
    fn runs_join_consecutive_droppable_pages() {
        let mut dirty = page(3, Held::Verified);
        dirty.dirty = true;
        let pages = [
            page(5, Held::Verified),
            page(0, Held::Verified),
            page(1, Held::Verified),
            page(1, Held::Verified),
            page(2, Held::HashOnly),
            dirty,
            page(4, Held::Verified),
            page(6, Held::Verified),
        ];
        assert_eq!(
            plan_runs(&pages),
            vec![
                DropRange {
                    offset: 0,
                    len: 2 * P
                },
                DropRange {
                    offset: 4 * P,
                    len: 3 * P
                }
            ]
        );
    }
}
