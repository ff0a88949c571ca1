//! Where each region lies in its process's address space, and where a
//! page named by region and offset went when a refresh changed the
//! regions' shapes.
//!
//! The distiller's index and the hint stack name pages by region and
//! offset, and a region's id is its process and first address. Marking a
//! run mergeable splits its VMA: the piece before the run keeps the
//! region's first address, hence its id, and the run and the rest become
//! regions of their own. Past the cut, the old (region, offset) names
//! pages the region no longer has, while the pages themselves, now in
//! other regions, still hold what was indexed or hinted. So after every
//! refresh the daemon compares the map of the regions before it with the
//! map after it ([`AddressMap::moves_to`]) and moves those names by
//! address ([`Moves::page`]): to the region that holds the address now,
//! or nowhere if none does.
//!
//! Invariants: an [`AddressMap`] holds, for each pid, that process's
//! regions sorted by first address, and they do not overlap (they are the
//! books' spans, which come from the process's maps). [`Moves::changed`]
//! lists exactly the regions of the earlier map whose process, first
//! address or end differ in the later one, or that it lacks.

use super::Book;
use pagesift_core::{PageRef, RegionId};
use std::collections::{HashMap, HashSet};

/// Bytes in a page.
const PAGE: u64 = 4096;

/// Each process's regions as (first address, end, id), sorted by first
/// address.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct AddressMap(HashMap<u32, Vec<(u64, u64, RegionId)>>);

impl AddressMap {
    /// The map of the books' regions.
    pub(super) fn of<'a>(books: impl Iterator<Item = (&'a RegionId, &'a Book)>) -> AddressMap {
        let mut map: HashMap<u32, Vec<(u64, u64, RegionId)>> = HashMap::new();
        for (&id, b) in books {
            (map.entry(b.span.proc.pid).or_default()).push((b.span.start, b.span.end(), id));
        }
        for v in map.values_mut() {
            v.sort_unstable();
        }
        AddressMap(map)
    }

    /// The regions of process `pid`, sorted by first address.
    pub(super) fn of_process(&self, pid: u32) -> Option<&[(u64, u64, RegionId)]> {
        self.0.get(&pid).map(Vec::as_slice)
    }

    /// The page at `addr` in process `pid`, if a region holds it.
    fn page_at(&self, pid: u32, addr: u64) -> Option<PageRef> {
        let v = self.0.get(&pid)?;
        let &(s, e, id) = v.get(v.partition_point(|&(_, e, _)| e <= addr))?;
        (s <= addr && addr < e).then(|| PageRef {
            region: id,
            page: ((addr - s) / PAGE) as u32,
        })
    }

    /// How pages named in this map's regions move to `after`'s.
    pub(super) fn moves_to<'a>(&self, after: &'a AddressMap) -> Moves<'a> {
        let kept: HashSet<(u32, u64, u64, RegionId)> = (after.0.iter())
            .flat_map(|(&pid, v)| v.iter().map(move |&(s, e, id)| (pid, s, e, id)))
            .collect();
        let mut was = HashMap::new();
        let mut changed = Vec::new();
        for (&pid, v) in &self.0 {
            for &(s, e, id) in v {
                was.insert(id, (pid, s));
                if !kept.contains(&(pid, s, e, id)) {
                    changed.push(id);
                }
            }
        }
        changed.sort_unstable();
        Moves {
            was,
            after,
            changed,
        }
    }
}

/// Where the pages of one map's regions are in a later map.
pub(super) struct Moves<'a> {
    /// Each earlier region's process and first address.
    was: HashMap<RegionId, (u32, u64)>,
    after: &'a AddressMap,
    /// The earlier regions whose span changed or that are gone, sorted.
    pub(super) changed: Vec<RegionId>,
}

impl Moves<'_> {
    /// The page that holds, in the later map, what `p` named in the
    /// earlier one; `None` if its address is in no region now, or `p`'s
    /// region was not in the earlier map.
    pub(super) fn page(&self, p: PageRef) -> Option<PageRef> {
        let &(pid, start) = self.was.get(&p.region)?;
        self.after.page_at(pid, start + u64::from(p.page) * PAGE)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Process 7's region 1 spans 16 pages from 0x10000. A run of its
    /// first 4 pages was marked and became a VMA of its own: region 1
    /// keeps those, pages 4..10 are region 2, and pages 10.. were
    /// unmapped. Process 8's region 3 is untouched.
    pub(in crate::daemon) fn a_cut() -> (AddressMap, AddressMap) {
        let before = AddressMap(HashMap::from([
            (7, vec![(0x10000, 0x20000, RegionId(1))]),
            (8, vec![(0x10000, 0x12000, RegionId(3))]),
        ]));
        let after = AddressMap(HashMap::from([
            (
                7,
                vec![
                    (0x10000, 0x14000, RegionId(1)),
                    (0x14000, 0x1a000, RegionId(2)),
                ],
            ),
            (8, vec![(0x10000, 0x12000, RegionId(3))]),
        ]));
        (before, after)
    }

    fn p(region: u64, page: u32) -> PageRef {
        PageRef {
            region: RegionId(region),
            page,
        }
    }

    #[test]
    fn pages_move_by_address_to_the_region_that_holds_them_now() {
        let (before, after) = a_cut();
        let moves = before.moves_to(&after);
        assert_eq!(moves.changed, [RegionId(1)]);
        assert_eq!(moves.page(p(1, 2)), Some(p(1, 2)));
        assert_eq!(moves.page(p(1, 4)), Some(p(2, 0)));
        assert_eq!(moves.page(p(1, 9)), Some(p(2, 5)));
        assert_eq!(moves.page(p(1, 10)), None);
        assert_eq!(moves.page(p(3, 1)), Some(p(3, 1)));
        assert_eq!(moves.page(p(4, 0)), None);
        // Nothing changes between equal maps; a region that went away is
        // changed.
        assert!(after.moves_to(&after).changed.is_empty());
        assert_eq!(
            before.moves_to(&AddressMap::default()).changed,
            [RegionId(1), RegionId(3)]
        );
    }
}
