//! The index of guest RAM content (Singleton §2.4) and guest-eviction
//! detection (§3.3).
//!
//! ## The algorithm, before the code
//!
//! **Index.** Singleton replaced KSM's search trees with a hash table of
//! page checksums, one slot per guest page, chains for collisions,
//! cleared and refilled every pass because guest pages change with no
//! notice. Here a pass ([`GuestIndex::begin_pass`] .. inserts ..
//! [`GuestIndex::end_pass`]) inserts every present guest page as (hash,
//! location). A lookup by the hash of a host cache page returns *one*
//! guest location with that hash: the caller compares the two pages byte
//! for byte before anything is dropped, so a hash collision costs a
//! comparison, never a wrong drop, and one location per hash is enough
//! (if the guest page at it no longer matches, the host page is kept).
//! The table is reserved for as many entries as the guest has pages.
//!
//! **Eviction detection.** Singleton does not ask the guest what it
//! evicted; it infers a replacement when a guest page's checksum *and* its
//! first eight bytes both changed since the previous pass (a write to a
//! page usually leaves its start alone; a page reused for other data does
//! not). [`GuestIndex::insert`] classifies each page against the previous
//! pass the same way ([`Change`]) and counts replacements: the guest
//! evicted what the page held. Content the guest evicted is no longer in
//! the index, so its host copy is kept from then on: the host cache holds
//! guest evictions (eviction-based placement) without any bookkeeping of
//! its own.
//!
//! **Updates between passes.** A full pass reads every guest page, and
//! was most of a scrub's CPU (perf: about 170 ms a scrub for two 256 MiB
//! guests, more than matching and dropping 30 k host pages). Yet the
//! guest pages a host cache page can match are, after a first pass, the
//! ones whose content came from or went to the image since then, and the
//! I/O hints name exactly those (QEMU's reads into guest RAM and writes
//! from it). [`GuestIndex::update`] re-stamps one such page outside a
//! pass: its old hash stops pointing at it, its new one does, and a
//! replacement counts as an eviction as in a pass. A page changed by
//! anything else (the guest copying data in its own memory) is missed
//! until the next full pass, which costs a kept host page, never a wrong
//! drop; the caller runs full passes periodically.
//!
//! Invariants: a lookup only returns locations inserted in the current
//! pass (after `end_pass`, the last complete pass) or updated since; a
//! hash whose location was updated to other content no longer returns it;
//! the counts of [`Change`]s of one pass add up to the pages inserted in
//! it.

// hashbrown with foldhash rather than std's SipHash: the keys are content
// hashes and addresses, nothing to defend against, and the inserts were a
// tenth of a scrub's CPU (perf, one 256 MiB guest).
use hashbrown::HashMap;

/// What the index remembers of one guest page between passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageStamp {
    /// The page's content hash.
    pub hash: u64,
    /// Its first eight bytes.
    pub head: u64,
}

/// How a guest page changed since the previous pass (§3.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Not seen in the previous pass.
    New,
    /// Same content hash.
    Unchanged,
    /// Hash changed, first eight bytes the same: a write.
    Mutated,
    /// Hash and first eight bytes changed: the guest replaced the page's
    /// content (it evicted what was there).
    Replaced,
}

/// Classifies `now` against `before` (see [`Change`]).
pub fn classify(before: Option<PageStamp>, now: PageStamp) -> Change {
    match before {
        None => Change::New,
        Some(b) if b.hash == now.hash => Change::Unchanged,
        Some(b) if b.head == now.head => Change::Mutated,
        Some(_) => Change::Replaced,
    }
}

/// Counts of one pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassCounts {
    /// Pages inserted.
    pub pages: u64,
    /// Of which new since the previous pass.
    pub new: u64,
    /// Of which unchanged.
    pub unchanged: u64,
    /// Of which written.
    pub mutated: u64,
    /// Of which replaced (guest evictions).
    pub replaced: u64,
}

/// The index of one guest's RAM (see the module header). Locations are
/// the caller's (an address in the guest's host process).
#[derive(Clone, Debug, Default)]
pub struct GuestIndex {
    by_hash: HashMap<u64, u64>,
    stamps: HashMap<u64, PageStamp>,
    previous: HashMap<u64, PageStamp>,
    building: HashMap<u64, u64>,
    counts: PassCounts,
    last: PassCounts,
    evictions: u64,
}

impl GuestIndex {
    /// An empty index.
    pub fn new() -> GuestIndex {
        GuestIndex::default()
    }

    /// Starts a pass over a guest of `pages` pages: lookups keep answering
    /// from the last complete pass until [`end_pass`](Self::end_pass).
    pub fn begin_pass(&mut self, pages: usize) {
        self.previous = std::mem::take(&mut self.stamps);
        self.stamps.reserve(pages);
        self.building = HashMap::with_capacity(pages);
        self.counts = PassCounts::default();
    }

    /// Inserts the page at `location` with content hash `hash` and first
    /// eight bytes `head`, and says how it changed since the last pass.
    pub fn insert(&mut self, location: u64, hash: u64, head: u64) -> Change {
        let stamp = PageStamp { hash, head };
        let change = classify(self.previous.get(&location).copied(), stamp);
        self.stamps.insert(location, stamp);
        self.building.entry(hash).or_insert(location);
        self.counts.pages += 1;
        match change {
            Change::New => self.counts.new += 1,
            Change::Unchanged => self.counts.unchanged += 1,
            Change::Mutated => self.counts.mutated += 1,
            Change::Replaced => {
                self.counts.replaced += 1;
                self.evictions += 1;
            }
        }
        change
    }

    /// Ends the pass: lookups now answer from it.
    pub fn end_pass(&mut self) {
        self.by_hash = std::mem::take(&mut self.building);
        self.previous = HashMap::new();
        self.last = self.counts;
    }

    /// Re-stamps the page at `location` outside a pass (see the module
    /// header): it now has content hash `hash` and first eight bytes
    /// `head`. Returns how it changed since it was last seen.
    pub fn update(&mut self, location: u64, hash: u64, head: u64) -> Change {
        debug_assert!(self.building.is_empty(), "update during a pass");
        let stamp = PageStamp { hash, head };
        let before = self.stamps.insert(location, stamp);
        let change = classify(before, stamp);
        if let Some(b) = before
            && b.hash != hash
            && self.by_hash.get(&b.hash) == Some(&location)
        {
            self.by_hash.remove(&b.hash);
        }
        self.by_hash.insert(hash, location);
        if change == Change::Replaced {
            self.evictions += 1;
        }
        change
    }

    /// A guest location whose content had hash `hash` in the last complete
    /// pass (or since, see [`update`](Self::update)).
    pub fn lookup(&self, hash: u64) -> Option<u64> {
        self.by_hash.get(&hash).copied()
    }

    /// Distinct contents in the last complete pass.
    pub fn distinct(&self) -> usize {
        self.by_hash.len()
    }

    /// The counts of the last complete pass.
    pub fn last_pass(&self) -> PassCounts {
        self.last
    }

    /// Guest evictions (replacements) detected since the index was made.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn replacement_needs_both_the_hash_and_the_head_to_change() {
        let a = PageStamp { hash: 1, head: 10 };
        assert_eq!(classify(None, a), Change::New);
        assert_eq!(classify(Some(a), a), Change::Unchanged);
        assert_eq!(
            classify(Some(a), PageStamp { hash: 2, head: 10 }),
            Change::Mutated
        );
        assert_eq!(
            classify(Some(a), PageStamp { hash: 2, head: 11 }),
            Change::Replaced
        );
    }

    #[test]
    fn lookups_answer_from_the_last_complete_pass() {
        let mut ix = GuestIndex::new();
        ix.begin_pass(2);
        ix.insert(0x1000, 7, 0);
        assert_eq!(ix.lookup(7), None, "the pass is not complete");
        ix.end_pass();
        assert_eq!(ix.lookup(7), Some(0x1000));
        // Next pass: the page now holds other content.
        ix.begin_pass(2);
        assert_eq!(ix.insert(0x1000, 8, 1), Change::Replaced);
        assert_eq!(ix.lookup(7), Some(0x1000), "still the old pass");
        ix.end_pass();
        assert_eq!(ix.lookup(7), None, "evicted content is no longer held");
        assert_eq!(ix.lookup(8), Some(0x1000));
        assert_eq!(ix.evictions(), 1);
        assert_eq!(ix.last_pass().replaced, 1);
    }

    #[test]
    fn a_page_gone_from_the_guest_is_new_when_it_returns() {
        let mut ix = GuestIndex::new();
        ix.begin_pass(1);
        ix.insert(0x1000, 7, 0);
        ix.end_pass();
        ix.begin_pass(1);
        ix.end_pass();
        ix.begin_pass(1);
        assert_eq!(ix.insert(0x1000, 9, 9), Change::New);
    }

    #[test]
    fn an_update_moves_the_hash_and_counts_a_replacement() {
        let mut ix = GuestIndex::new();
        ix.begin_pass(2);
        ix.insert(0x1000, 7, 1);
        ix.insert(0x2000, 8, 2);
        ix.end_pass();
        // The guest read new data into 0x1000 (new hash, new head).
        assert_eq!(ix.update(0x1000, 9, 3), Change::Replaced);
        assert_eq!(ix.lookup(9), Some(0x1000));
        assert_eq!(ix.lookup(7), None, "the old content is gone from it");
        assert_eq!(ix.lookup(8), Some(0x2000));
        assert_eq!(ix.evictions(), 1);
        // A page never seen before.
        assert_eq!(ix.update(0x3000, 8, 2), Change::New);
        assert_eq!(ix.update(0x3000, 8, 2), Change::Unchanged);
        // Same head, new hash: a write, not an eviction.
        assert_eq!(ix.update(0x3000, 10, 2), Change::Mutated);
        assert_eq!(ix.lookup(10), Some(0x3000));
        assert_eq!(ix.evictions(), 1);
    }

    proptest! {
        /// After any mix of passes and updates, a lookup answers with a
        /// location whose latest stamp has that hash (never a page known
        /// to hold something else); an updated page is found by its new
        /// hash at once; a pass's pages all are.
        #[test]
        fn lookups_follow_the_latest_stamps(
            ops in proptest::collection::vec((any::<bool>(), 0u64..16, 0u64..8, 0u64..4), 0..200),
        ) {
            let mut ix = GuestIndex::new();
            // The model: each location's latest hash and head.
            let mut latest: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
            for &(full, loc, hash, head) in &ops {
                latest.insert(loc, (hash, head));
                if full {
                    // A full pass re-reads every location the model has.
                    ix.begin_pass(latest.len());
                    for (&l, &(h, hd)) in &latest {
                        ix.insert(l, h, hd);
                    }
                    ix.end_pass();
                    for &(h, _) in latest.values() {
                        prop_assert!(ix.lookup(h).is_some());
                    }
                } else {
                    ix.update(loc, hash, head);
                    prop_assert_eq!(ix.lookup(hash), Some(loc));
                }
                for h in 0..8u64 {
                    if let Some(l) = ix.lookup(h) {
                        prop_assert_eq!(latest.get(&l).map(|x| x.0), Some(h));
                    }
                }
            }
        }

        #[test]
        fn every_inserted_hash_is_found_and_counts_add_up(
            first in proptest::collection::vec((0u64..64, any::<u64>(), 0u64..4), 0..100),
            second in proptest::collection::vec((0u64..64, any::<u64>(), 0u64..4), 0..100),
        ) {
            let mut ix = GuestIndex::new();
            for pass in [&first, &second] {
                ix.begin_pass(pass.len());
                for &(loc, hash, head) in pass.iter() {
                    ix.insert(loc * 4096, hash, head);
                }
                ix.end_pass();
                for &(_, hash, _) in pass.iter() {
                    prop_assert!(ix.lookup(hash).is_some());
                }
                let c = ix.last_pass();
                prop_assert_eq!(c.pages, pass.len() as u64);
                prop_assert_eq!(c.new + c.unchanged + c.mutated + c.replaced, c.pages);
            }
        }
    }
}
