//! Renewal: a region that was unmapped and mapped again at the same
//! addresses between two looks at its process.
//!
//! ## Why
//!
//! `/proc/PID/maps` shows such a region with the same line as before, and
//! the loop's cheap check for mapping changes (the address-space size in
//! `statm`, about once a second) sees nothing when every check falls in
//! the same phase of a map/unmap cycle: checks 1.0–1.1 s apart over a
//! cycle of 2 s (mapped 1 s, unmapped 1 s) often do, and over a cycle of
//! 0.4 s they say nothing at all. The region then looks long-lived: its
//! age counts from its first sight, it climbs the ladder and is marked,
//! although each of its generations lives one period. In `pagesift bench
//! --quick --only short-lived-1000ms,short-lived-200ms --systems
//! pagesift-full --repeat 2` (2026-11-28, by hand, daemon logs read), the
//! 64 MiB cycle was marked whole at an apparent age of 3.8–4.0 s in 4 of 4
//! runs, and ksmd spent up to 0.049 CPU-s of the 8 s window on it, more
//! than the whole 0.5 % goal of the real-workloads issue allows.
//!
//! ## The rule
//!
//! A freshly mapped region gets fresh frames. So each region keeps the
//! pagemap entries of two *sentinel* pages, its first and its last, as of
//! the last check. It is *renewed* when both were present at the last
//! check, and each is now either not present and not in swap (a new
//! mapping not yet touched, or the range unmapped right now), or present
//! in another frame. The zero page counts as no evidence either way: a
//! range that was only read maps it before and after.
//!
//! A page that stays mapped keeps its frame unless the kernel moves it.
//! KSM does (merging, and breaking COW), so regions in mergeable VMAs are
//! not checked. Compaction, NUMA balancing and THP collapse migrate one
//! page or one 2 MiB range at a time, and a false renewal needs both ends
//! moved within one interval. Its cost is bounded: the region is taken for
//! a new one and starts its life again. A remap whose fresh frames happen
//! to be the old ones (the allocator hands back what was just freed) is
//! missed, and the region stays what it was.
//!
//! Invariants: [`Sentinels`] holds the entries read at the last check of
//! its region, first page then last; [`Sentinels::renewed_by`] is true
//! only if both old entries name an exclusively mapped frame.

use crate::pagemap::PagemapEntry;

/// The pagemap entries of a region's first and last pages at the last
/// check (module header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sentinels(pub [PagemapEntry; 2]);

impl Sentinels {
    /// Whether entries read now, `now`, say the region was mapped anew
    /// since these were read (module header).
    pub fn renewed_by(&self, now: &Sentinels) -> bool {
        self.0.iter().zip(&now.0).all(|(&old, &new)| {
            let Some(was) = own_frame(old) else {
                return false;
            };
            if new.swapped() {
                return false;
            }
            if !new.present() {
                return true;
            }
            own_frame(new).is_some_and(|is| is != was)
        })
    }
}

/// The frame of a page mapped by this process alone (neither the zero
/// page nor shared), when PFNs are visible.
fn own_frame(e: PagemapEntry) -> Option<u64> {
    e.pfn().filter(|&f| f != 0 && e.exclusive())
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRESENT: u64 = 1 << 63;
    const SWAPPED: u64 = 1 << 62;
    const EXCLUSIVE: u64 = 1 << 56;

    fn at(a: u64, b: u64) -> Sentinels {
        Sentinels([PagemapEntry(a), PagemapEntry(b)])
    }
    /// Present and mapped by this process alone.
    fn p(pfn: u64) -> u64 {
        PRESENT | EXCLUSIVE | pfn
    }
    /// Present and mapped elsewhere too (the zero page, a page shared
    /// after fork).
    fn shared(pfn: u64) -> u64 {
        PRESENT | pfn
    }

    #[test]
    fn both_ends_in_new_frames_or_gone_is_a_renewal() {
        let old = at(p(10), p(20));
        assert!(old.renewed_by(&at(p(11), p(21))));
        assert!(old.renewed_by(&at(0, 0)), "unmapped now");
        assert!(old.renewed_by(&at(p(11), 0)));
    }

    #[test]
    fn one_end_moved_swapped_or_unchanged_is_not() {
        let old = at(p(10), p(20));
        assert!(!old.renewed_by(&old));
        assert!(!old.renewed_by(&at(p(11), p(20))), "one migration");
        assert!(!old.renewed_by(&at(SWAPPED | 5, SWAPPED | 6)));
        assert!(!old.renewed_by(&at(shared(77), shared(78))));
    }

    #[test]
    fn without_two_old_frames_there_is_no_evidence() {
        for old in [
            at(0, p(20)),
            at(shared(10), p(20)),
            at(p(0), p(0)),
            at(0, 0),
        ] {
            assert!(!old.renewed_by(&at(p(11), p(21))), "{old:?}");
            assert!(!old.renewed_by(&at(0, 0)), "{old:?}");
        }
    }
}
