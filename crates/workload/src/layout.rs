//! What each page of a workload's region holds, decided before any memory
//! is touched, and the exact counts a scan must find.
//!
//! A region is a sequence of slots. Each slot is one of
//! - [`Slot::Untouched`]: never accessed, so not present (a scan must not
//!   read it: a remote read would fault it in);
//! - [`Slot::Zero`]: read but never written, so mapped to the shared zero
//!   page;
//! - [`Slot::Data`]: written with the page whose *content id* is given.
//!
//! Pages with equal content ids are byte-identical and pages with different
//! ids differ (see [`crate::content`]), so duplicate counts follow from the
//! ids alone: [`Counts::of`] sorts them and counts runs. Nothing here is
//! estimated; a scan of the live process must find exactly these numbers.
//!
//! Content ids live in disjoint namespaces so patterns never collide by
//! accident: duplicated contents `0..K`, random (unique) pages
//! [`RANDOM_BASE`]` + page`, fork-child rewrites [`DIRTY_BASE`]` + page`.
//!
//! Every choice (which runs are duplicated, which pages a child rewrites) is
//! drawn from SplitMix64 seeded by the workload's seed, so a seed fixes the
//! memory byte for byte.

/// First content id of random (never repeated) pages.
pub const RANDOM_BASE: u64 = 1 << 40;
/// First content id of pages rewritten by fork-family children.
pub const DIRTY_BASE: u64 = 2 << 40;

/// What one page of a region holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Slot {
    /// Never touched: not present.
    Untouched,
    /// Read-faulted: the shared zero page.
    Zero,
    /// Written with the page of this content id.
    Data(u64),
}

/// Where untouched and zero pages go in a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Pages of the data part (holes and zero pages included).
    pub data_pages: usize,
    /// Every `hole_every`-th page of the data part is left untouched (0: none).
    pub hole_every: usize,
    /// Every `zero_every`-th page of the data part is only read (0: none).
    pub zero_every: usize,
    /// Untouched pages after the data part (a range with no page tables, so
    /// a stray read would also grow the target's page-table size).
    pub untouched_tail: usize,
}

impl Shape {
    /// All pages of the region.
    pub fn pages(&self) -> usize {
        self.data_pages + self.untouched_tail
    }

    /// The slot kind of page `i`, before contents are assigned.
    fn is_data(&self, i: usize) -> Option<Slot> {
        if i >= self.data_pages {
            return Some(Slot::Untouched);
        }
        if self.hole_every > 0 && i % self.hole_every == self.hole_every - 1 {
            return Some(Slot::Untouched);
        }
        if self.zero_every > 0 && i % self.zero_every == self.zero_every - 1 {
            return Some(Slot::Zero);
        }
        None
    }

    /// Slots with data pages filled in by `content(i)`.
    pub fn slots(&self, mut content: impl FnMut(usize) -> u64) -> Vec<Slot> {
        (0..self.pages())
            .map(|i| self.is_data(i).unwrap_or_else(|| Slot::Data(content(i))))
            .collect()
    }
}

/// SplitMix64: a tiny, fixed, seedable generator (so a seed means the same
/// memory in every build).
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0); the tiny modulo bias is irrelevant here.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}

/// `k` distinct elements of `0..n`, chosen by a partial Fisher–Yates shuffle.
pub fn choose(n: usize, k: usize, rng: &mut SplitMix64) -> Vec<usize> {
    let k = k.min(n);
    let mut v: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let j = i + rng.below(n - i);
        v.swap(i, j);
    }
    v.truncate(k);
    v
}

/// `static-dup`: data page `i` holds duplicated content `i % contents`.
pub fn static_dup(shape: &Shape, contents: u64) -> Vec<Slot> {
    let k = contents.max(1);
    shape.slots(|i| i as u64 % k)
}

/// `random`: every data page distinct.
pub fn random(shape: &Shape) -> Vec<Slot> {
    shape.slots(|i| RANDOM_BASE + i as u64)
}

/// Parameters of `mixed`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MixedParams {
    /// Fraction of runs that are duplicated (0..=1).
    pub dup_ratio: f64,
    /// Pages per run.
    pub run_pages: usize,
    /// Distinct contents the duplicated runs cycle through.
    pub dup_contents: u64,
}

/// `mixed`: the data part is cut into runs of `run_pages`; a seeded choice of
/// `round(dup_ratio × runs)` runs are duplicated, the others random. The
/// `q`-th duplicated run (in address order) holds contents
/// `(q × run_pages + j) mod dup_contents` at offset `j`, so with
/// `dup_contents == run_pages` every duplicated run is a copy of the same
/// run of pages.
pub fn mixed(shape: &Shape, p: MixedParams, seed: u64) -> Vec<Slot> {
    let l = p.run_pages.max(1);
    let k = p.dup_contents.max(1);
    let runs = shape.data_pages.div_ceil(l);
    let n_dup = ((p.dup_ratio.clamp(0.0, 1.0) * runs as f64).round() as usize).min(runs);
    let mut rng = SplitMix64::new(seed ^ 0x6d69_7865_6400_0000);
    let mut dup = vec![false; runs];
    for r in choose(runs, n_dup, &mut rng) {
        dup[r] = true;
    }
    // rank[r] = number of duplicated runs before run r.
    let mut rank = vec![0usize; runs];
    let mut q = 0;
    for r in 0..runs {
        rank[r] = q;
        q += dup[r] as usize;
    }
    shape.slots(|i| {
        let r = i / l;
        if dup[r] {
            ((rank[r] * l + i % l) as u64) % k
        } else {
            RANDOM_BASE + i as u64
        }
    })
}

/// The data pages each fork-family child rewrites: child `c` picks
/// `round(fraction × data pages)` of the parent's data pages with its own
/// seeded choice, and writes content [`DIRTY_BASE`]` + page` to each, the
/// same content for the same page in every child.
pub fn child_dirty_sets(
    slots: &[Slot],
    children: usize,
    fraction: f64,
    seed: u64,
) -> Vec<Vec<usize>> {
    let data: Vec<usize> = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s, Slot::Data(_)))
        .map(|(i, _)| i)
        .collect();
    let k = (fraction.clamp(0.0, 1.0) * data.len() as f64).round() as usize;
    (0..children)
        .map(|c| {
            let mut rng = SplitMix64::new(seed ^ 0x6368_696c_6400_0000 ^ (c as u64 + 1));
            let mut set: Vec<usize> = choose(data.len(), k, &mut rng)
                .into_iter()
                .map(|j| data[j])
                .collect();
            set.sort_unstable();
            set
        })
        .collect()
}

/// Exact counts over a multiset of content ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ContentCounts {
    /// Present private pages (zero-page mappings excluded).
    pub present_pages: u64,
    /// Distinct contents among them.
    pub distinct_contents: u64,
    /// `present_pages − distinct_contents`: pages freed if every duplicate
    /// were merged.
    pub duplicate_pages: u64,
    /// Pages whose content occurs at least twice.
    pub pages_with_duplicates: u64,
    /// Contents that occur at least twice.
    pub duplicated_contents: u64,
}

impl ContentCounts {
    /// Counts the ids (any order).
    pub fn of(mut ids: Vec<u64>) -> ContentCounts {
        ids.sort_unstable();
        let mut c = ContentCounts {
            present_pages: ids.len() as u64,
            ..Default::default()
        };
        for run in ids.chunk_by(|a, b| a == b) {
            c.distinct_contents += 1;
            if run.len() > 1 {
                c.duplicated_contents += 1;
                c.pages_with_duplicates += run.len() as u64;
            }
        }
        c.duplicate_pages = c.present_pages - c.distinct_contents;
        c
    }
}

/// Exact counts of one region (or one process).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Counts {
    /// All pages of the regions.
    pub pages: u64,
    /// Pages mapped to the shared zero page.
    pub zero_pages: u64,
    /// Pages never touched (not present).
    pub untouched_pages: u64,
    /// Counts over the written pages.
    #[serde(flatten)]
    pub content: ContentCounts,
}

impl Counts {
    /// Counts the slots.
    pub fn of(slots: &[Slot]) -> Counts {
        let mut c = Counts {
            pages: slots.len() as u64,
            ..Default::default()
        };
        let mut ids = Vec::with_capacity(slots.len());
        for s in slots {
            match *s {
                Slot::Untouched => c.untouched_pages += 1,
                Slot::Zero => c.zero_pages += 1,
                Slot::Data(id) => ids.push(id),
            }
        }
        c.content = ContentCounts::of(ids);
        c
    }
}

/// Exact counts over a fork family (parent plus children).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FamilyCounts {
    /// Parent plus children.
    pub processes: u64,
    /// Pages each child rewrote.
    pub dirty_pages_per_child: u64,
    /// Present private pages summed over processes (a frame shared after
    /// fork counts once per process).
    pub virtual_present_pages: u64,
    /// Distinct frames: the parent's pages plus every child's rewrites
    /// (unmodified pages stay shared with the parent).
    pub physical_pages: u64,
    /// Distinct contents across the family.
    pub distinct_contents: u64,
    /// `physical_pages − distinct_contents`: frames freed if every duplicate
    /// were merged.
    pub duplicate_pages: u64,
    /// `virtual_present_pages − distinct_contents`: the same for a scan that
    /// does not know frames are shared.
    pub duplicate_pages_virtual: u64,
    /// Zero-page mappings summed over processes.
    pub zero_pages: u64,
}

impl FamilyCounts {
    /// Counts a family whose parent holds `slots` and whose children rewrote
    /// `dirty` (from [`child_dirty_sets`]).
    pub fn of(slots: &[Slot], dirty: &[Vec<usize>]) -> FamilyCounts {
        let parent = Counts::of(slots);
        let mut rewritten = vec![false; slots.len()];
        for set in dirty {
            for &i in set {
                rewritten[i] = true;
            }
        }
        let union = rewritten.iter().filter(|&&b| b).count() as u64;
        let k = dirty.len() as u64;
        let d = dirty.first().map_or(0, |s| s.len() as u64);
        let present = parent.content.present_pages;
        let distinct = parent.content.distinct_contents + union;
        let physical = present + k * d;
        let virt = (k + 1) * present;
        FamilyCounts {
            processes: k + 1,
            dirty_pages_per_child: d,
            virtual_present_pages: virt,
            physical_pages: physical,
            distinct_contents: distinct,
            duplicate_pages: physical - distinct,
            duplicate_pages_virtual: virt - distinct,
            zero_pages: (k + 1) * parent.zero_pages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn shape(data: usize) -> Shape {
        Shape {
            data_pages: data,
            hole_every: 0,
            zero_every: 0,
            untouched_tail: 0,
        }
    }

    #[test]
    fn static_dup_counts() {
        let s = Shape {
            data_pages: 100,
            hole_every: 10,
            zero_every: 7,
            untouched_tail: 5,
        };
        let c = Counts::of(&static_dup(&s, 3));
        assert_eq!(c.pages, 105);
        assert_eq!(c.untouched_pages, 10 + 5);
        // Zero slots: i % 7 == 6 and not a hole (69 is both 69%10==9).
        let zeros = (0..100).filter(|i| i % 7 == 6 && i % 10 != 9).count() as u64;
        assert_eq!(c.zero_pages, zeros);
        assert_eq!(c.content.present_pages, 100 - 10 - zeros);
        assert_eq!(c.content.distinct_contents, 3);
        assert_eq!(c.content.duplicate_pages, c.content.present_pages - 3);
    }

    #[test]
    fn random_has_no_duplicates() {
        let c = Counts::of(&random(&shape(50)));
        assert_eq!(c.content.distinct_contents, 50);
        assert_eq!(c.content.duplicate_pages, 0);
        assert_eq!(c.content.pages_with_duplicates, 0);
    }

    #[test]
    fn mixed_is_deterministic_and_hits_the_ratio() {
        let p = MixedParams {
            dup_ratio: 0.3,
            run_pages: 16,
            dup_contents: 16,
        };
        let a = mixed(&shape(16 * 1000), p, 7);
        assert_eq!(a, mixed(&shape(16 * 1000), p, 7));
        assert_ne!(a, mixed(&shape(16 * 1000), p, 8));
        let c = Counts::of(&a);
        // 300 duplicated runs of the same 16 contents, 700 random runs.
        assert_eq!(c.content.distinct_contents, 16 + 700 * 16);
        assert_eq!(c.content.duplicate_pages, 300 * 16 - 16);
        assert_eq!(c.content.pages_with_duplicates, 300 * 16);
    }

    #[test]
    fn family_counts_by_hand() {
        // Parent: 4 random pages; 2 children each rewrite 2 pages.
        let slots = random(&shape(4));
        let dirty = vec![vec![0, 1], vec![1, 2]];
        let f = FamilyCounts::of(&slots, &dirty);
        assert_eq!(f.physical_pages, 4 + 2 * 2);
        // Contents: 4 parent + dirty(0), dirty(1), dirty(2).
        assert_eq!(f.distinct_contents, 7);
        assert_eq!(f.duplicate_pages, 1); // the two children's dirty(1)
        assert_eq!(f.virtual_present_pages, 12);
        assert_eq!(f.duplicate_pages_virtual, 5);
    }

    proptest! {
        #[test]
        fn counts_are_consistent(
            data in 1usize..3000, hole in 0usize..9, zero in 0usize..9, tail in 0usize..50,
            ratio in 0.0f64..=1.0, run in 1usize..40, k in 1u64..60, seed: u64,
        ) {
            let s = Shape { data_pages: data, hole_every: hole, zero_every: zero, untouched_tail: tail };
            let slots = mixed(&s, MixedParams { dup_ratio: ratio, run_pages: run, dup_contents: k }, seed);
            let c = Counts::of(&slots);
            prop_assert_eq!(c.pages, (data + tail) as u64);
            prop_assert_eq!(c.untouched_pages + c.zero_pages + c.content.present_pages, c.pages);
            prop_assert!(c.content.distinct_contents <= c.content.present_pages);
            prop_assert!(c.content.pages_with_duplicates >= 2 * c.content.duplicated_contents);
            prop_assert_eq!(
                c.content.duplicate_pages,
                c.content.pages_with_duplicates - c.content.duplicated_contents
            );
            // Random pages never repeat.
            let mut r: Vec<u64> = slots.iter().filter_map(|s| match s {
                Slot::Data(id) if *id >= RANDOM_BASE => Some(*id), _ => None }).collect();
            let n = r.len();
            r.dedup();
            prop_assert_eq!(r.len(), n);
        }

        #[test]
        fn dirty_sets_have_the_asked_size_and_are_data_pages(
            data in 1usize..500, hole in 0usize..5, children in 0usize..5, f in 0.0f64..=1.0, seed: u64,
        ) {
            let s = Shape { data_pages: data, hole_every: hole, zero_every: 0, untouched_tail: 3 };
            let slots = random(&s);
            let sets = child_dirty_sets(&slots, children, f, seed);
            let n_data = slots.iter().filter(|s| matches!(s, Slot::Data(_))).count();
            for set in &sets {
                prop_assert_eq!(set.len(), (f * n_data as f64).round() as usize);
                for &i in set { prop_assert!(matches!(slots[i], Slot::Data(_))); }
                let mut u = set.clone(); u.dedup();
                prop_assert_eq!(u.len(), set.len());
            }
        }
    }
}
