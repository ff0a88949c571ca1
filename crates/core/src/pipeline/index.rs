//! Sample index: partial hash → candidate pages, in two sets, merged
//! ("stable") and not yet merged ("unstable").
//!
//! ## What it is for
//! The distiller hashes every sampled page at the current strength and asks
//! the index for pages that may have the same content: first among the
//! stable set (pages already merged, one representative per merged page),
//! then among the unstable set (sampled pages without a partner yet). A hash
//! hit is **never trusted**: weak strengths collide a lot (UKSM §6.1), so
//! every candidate with the hash is offered, one by one, to a comparator the
//! caller supplies, and only a candidate it confirms is returned. Each entry
//! carries the page's full-content fingerprint (a 64-bit hash of all its
//! bytes) taken when it was indexed, and the candidate is offered with it,
//! so the comparator can check the candidate without reading it again
//! (the distiller does; see `distill`'s "Verification"). The comparisons
//! made and the ones that failed are
//! counted ([`IndexStats`]); the strength controller weighs those.
//!
//! ## Hash tables, not trees
//! KSM indexes pages in red-black trees keyed by page content. The unstable
//! tree is not write-protected, so a page that changes after insertion can
//! cut off whole subtrees ("degeneration", XLH dissertation §4.2.1, §4.3.5:
//! "Entire sub-trees (at most half of the tree) can become unreachable after
//! the modification of a single referenced page"). XLH HT replaced it with a
//! hash table, where a changed page "can at most break the reachability of
//! that page from this hash" (§4.3.5); Singleton (§2.4) replaced both trees
//! with hash tables: "Collisions are resolved by chaining. To reduce
//! collisions, the number of slots in the hash-table is made equal to the
//! total number of pages." pagesift does the same: each set is a chained
//! hash table keyed by the page's partial hash, whose bucket count follows
//! its entries (a power of two ≥ the entries, so the load stays ≤ 1). All
//! pages with one hash sit in one chain, so a bucket holds every candidate
//! for that hash, and distinct pages sharing a hash are all offered to the
//! comparator, newest first (a recently hashed page is the likeliest still
//! to have the content it was indexed with).
//!
//! ## Sharded by hash bits (nuKSM's forest)
//! nuKSM (§IV-C) keeps "two forests i.e., many stable and many unstable
//! trees", with "one stable and one unstable trees per 100 MiB memory", and
//! picks a page's tree from its checksum ("index = page checksum(page) %
//! number of trees") so that identical pages always meet in the same tree
//! and a lookup searches one tree only. pagesift shards the same way, by
//! content hash, and the shard count follows the memory tracked
//! ([`SampleIndex::set_tracked_pages`]): at least one shard (a stable and an
//! unstable table) per [`IndexConfig::shard_pages`] tracked pages, 25 600 by
//! default (100 MiB of 4 KiB pages), rounded up to a power of two and capped
//! at 2^[`MAX_SHARD_BITS`].
//!
//! A 32-bit hash is first spread by a 64-bit mixer (weak-strength hashes
//! are not uniform in their low bits). The shard is the mixed value's top
//! `log2(shards)` bits, the bucket inside the shard its low bits. So a
//! lookup computes one shard and one bucket and never looks at another
//! shard, and equal hashes (hence identical pages) always land in the same
//! shard. Unlike nuKSM's `% trees`, power-of-two shard counts and top bits
//! make growth a split: when the count doubles, shard `s` becomes shards
//! `2s` and `2s+1`, and every entry goes to one of those two.
//!
//! For a hash table the forest's original reason (the height of a tree,
//! hence the comparisons per lookup) does not arise: a chained table whose
//! buckets follow its entries already costs O(1) expected probes. What
//! shards still buy is growth in bounded steps: each shard doubles its own
//! buckets when its entries exceed them, so one insert relinks at most one
//! shard's entries, never the whole index.
//!
//! **Re-sharding cost.** When the shard count changes, every entry of both
//! sets is relinked into its new shard: O(entries + buckets) time, a
//! transient buffer of 4 bytes per entry, no entry moves in memory and the
//! page map is untouched. It happens when the tracked memory crosses a power
//! of two times `shard_pages` upwards, so the total relinking work is
//! amortized O(1) per tracked page added. The count drops only when four
//! times fewer shards would do (hysteresis, so memory hovering at a boundary
//! does not re-shard back and forth).
//!
//! ## Entries and memory per indexed page
//! An entry is 28 bytes ([`SampleIndex::ENTRY_BYTES`]): the hash (u32), the
//! fingerprint (two u32), the
//! region as a u32 slot in a small per-region table (a [`RegionId`] is 8
//! bytes and a [`PageRef`] 16 with padding; regions are few, pages many),
//! the page index (u32) and the two chain links (u32 slab indices, doubly
//! linked so that removing a page is O(1) even when thousands of pages
//! share a weak hash). Entries live in one slab per set; a free list reuses
//! the slots of removed entries. A page map (an open-addressing table of
//! 4-byte slab indices keyed by region and page) finds a page's entry for
//! [`SampleIndex::remove_page`] without knowing its hash.
//!
//! Heap bytes per indexed page, at most: the slab, 28 × 1.5 (it grows by
//! half, so at most a third of it is slack) = 42; the bucket heads, 4 × 2
//! (a shard's buckets double when its entries exceed them) = 8; the page
//! map, 5 bytes per slot (index and control byte) at a load of 7/16..7/8
//! (hashbrown) = 11.4; in all ≈ 61.4, plus per-shard (32 bytes) and
//! per-region (about 30 bytes) overhead. [`MAX_HEAP_BYTES_PER_ENTRY`] (64)
//! is the bound the tests hold the measured [`SampleIndex::heap_bytes`] to.
//! `heap_bytes_per_entry_stays_below_the_documented_bound` prints the
//! measured bytes per entry while it fills an index to 300 000 entries.
//! Capacity is kept when entries leave (the unstable set refills every
//! round); `shrink_to_fit` gives it back.
//!
//! ## Lifecycle (the caller drives it)
//! - The unstable set is cleared ([`SampleIndex::clear_unstable`]) after
//!   each global round and whenever the hash strength changes.
//! - The stable set is never re-keyed: the distiller keys it by content
//!   (a page's fingerprint), which no strength change alters
//!   (`distill.rs`, module header).
//! - A page is indexed at most once: inserting it into either set first
//!   removes any entry it already has.
//! - When regions change shape (a VMA cut in two), the caller moves their
//!   entries to the pages that now hold them
//!   ([`SampleIndex::remap_regions`]): same set, hash, fingerprint and
//!   place in the chain, only the page's name changes.

use crate::{PAGE_SIZE, PageRef, RegionId};
use hashbrown::HashTable;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Tracked pages per shard by default: nuKSM's "one stable and one unstable
/// trees per 100 MiB memory" (§IV-C), in 4 KiB pages (25 600).
pub const DEFAULT_SHARD_PAGES: u64 = (100 << 20) / PAGE_SIZE as u64;

/// At most 2^16 shards (6.4 TiB tracked at the default `shard_pages`).
/// Beyond that shards just grow; their hash tables stay O(1) per lookup.
pub const MAX_SHARD_BITS: u32 = 16;

/// Bound on [`SampleIndex::heap_bytes`] per indexed page, once the index
/// holds a few thousand entries (below that, fixed overheads dominate). The
/// module header derives it: ≈ 61.4 worst case plus fixed overheads.
pub const MAX_HEAP_BYTES_PER_ENTRY: usize = 64;

/// Fewest buckets a non-empty shard table gets.
const MIN_BUCKETS: usize = 8;
/// Fewest slots the slab grows by.
const MIN_SLAB_GROWTH: usize = 64;
/// End of a chain / empty bucket / end of the free list.
const NIL: u32 = u32::MAX;
/// Region slot of a free slab entry.
const FREE: u32 = u32::MAX;

/// How the index is sized.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexConfig {
    /// Tracked pages per shard (stable + unstable table pair); the shard
    /// count is `ceil(tracked / shard_pages)` rounded up to a power of two.
    pub shard_pages: u64,
}

impl Default for IndexConfig {
    fn default() -> Self {
        IndexConfig {
            shard_pages: DEFAULT_SHARD_PAGES,
        }
    }
}

impl IndexConfig {
    /// Checks the configuration; the error names the key and the reason.
    pub fn validate(&self) -> Result<(), String> {
        if self.shard_pages == 0 {
            return Err("index.shard_pages must be at least 1 (pages per shard)".into());
        }
        Ok(())
    }
}

/// Which set a page is indexed in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum IndexSet {
    /// Merged pages (one representative per merged page).
    Stable,
    /// Sampled pages that have no verified partner yet.
    Unstable,
}

/// Cumulative counters. Take the difference of two snapshots
/// ([`IndexStats::since`]) for one round.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct IndexStats {
    /// Stable candidates offered to the comparator.
    pub stable_compared: u64,
    /// Stable candidates the comparator rejected (same hash, other content).
    pub stable_collisions: u64,
    /// Unstable candidates offered to the comparator.
    pub unstable_compared: u64,
    /// Unstable candidates the comparator rejected. This includes
    /// candidates whose page changed since it was indexed: the index cannot
    /// tell a stale entry from a true collision.
    pub unstable_collisions: u64,
    /// Times the shard count changed.
    pub reshards: u64,
}

impl IndexStats {
    /// Candidates compared in both sets.
    pub fn compared(&self) -> u64 {
        self.stable_compared + self.unstable_compared
    }

    /// Failed comparisons (collisions) in both sets.
    pub fn collisions(&self) -> u64 {
        self.stable_collisions + self.unstable_collisions
    }

    /// The counts accumulated since the snapshot `earlier`.
    pub fn since(&self, earlier: &IndexStats) -> IndexStats {
        IndexStats {
            stable_compared: self.stable_compared - earlier.stable_compared,
            stable_collisions: self.stable_collisions - earlier.stable_collisions,
            unstable_compared: self.unstable_compared - earlier.unstable_compared,
            unstable_collisions: self.unstable_collisions - earlier.unstable_collisions,
            reshards: self.reshards - earlier.reshards,
        }
    }
}

/// One indexed page: 28 bytes, all u32 so there is no padding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Entry {
    /// Partial hash at the strength it was indexed with.
    hash: u32,
    /// The page's full-content fingerprint when it was indexed (a 64-bit
    /// hash of every byte, as two halves so the entry has no padding).
    fingerprint: [u32; 2],
    /// Slot in [`Regions`], or [`FREE`] for a free slab entry.
    region: u32,
    /// Page index within the region.
    page: u32,
    /// Next entry in the bucket chain (or in the free list), or [`NIL`].
    next: u32,
    /// Previous entry in the bucket chain, or [`NIL`] at the head.
    prev: u32,
}

impl Entry {
    fn fingerprint(&self) -> u64 {
        u64::from(self.fingerprint[0]) | (u64::from(self.fingerprint[1]) << 32)
    }
}

/// A fingerprint as the two halves an [`Entry`] stores.
fn split(fingerprint: u64) -> [u32; 2] {
    [fingerprint as u32, (fingerprint >> 32) as u32]
}

/// Spreads bits (splitmix64's finalizer): weak partial hashes and page
/// numbers are far from uniform in their low bits.
fn mix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Where a content hash lives: top bits pick the shard, low bits the bucket.
fn content_key(hash: u32) -> u64 {
    mix64(u64::from(hash))
}

/// Key of the page map.
fn page_key(region: u32, page: u32) -> u64 {
    mix64((u64::from(region) << 32) | u64::from(page))
}

fn bucket_of(key: u64, buckets: usize) -> usize {
    (key as usize) & (buckets - 1)
}

/// Buckets for a shard table of `entries`: load ≤ 1 (Singleton §2.4).
fn bucket_count_for(entries: usize) -> usize {
    if entries == 0 {
        0
    } else {
        entries.next_power_of_two().max(MIN_BUCKETS)
    }
}

/// `log2` of the shard count for `pages` tracked pages.
fn shard_bits_for(pages: u64, shard_pages: u64) -> u32 {
    let shards = pages.div_ceil(shard_pages.max(1)).max(1);
    // ceil(log2(shards)): 1 → 0, 2 → 1, 3 → 2, ...
    (64 - (shards - 1).leading_zeros()).min(MAX_SHARD_BITS)
}

/// One shard's chained hash table: the bucket heads. The entries are in
/// the set's slab.
#[derive(Debug, Default)]
struct Shard {
    heads: Vec<u32>,
    len: usize,
}

/// One set (stable or unstable): a slab of entries, a page map and the
/// shards' bucket heads.
#[derive(Debug)]
struct Table {
    slab: Vec<Entry>,
    /// Head of the free list threaded through `Entry::next`.
    free: u32,
    len: usize,
    /// Slab indices, keyed by `page_key(region, page)` of the entry.
    by_page: HashTable<u32>,
    shards: Vec<Shard>,
    shard_bits: u32,
}

impl Table {
    fn new(shard_bits: u32) -> Self {
        Table {
            slab: Vec::new(),
            free: NIL,
            len: 0,
            by_page: HashTable::new(),
            shards: (0..1usize << shard_bits)
                .map(|_| Shard::default())
                .collect(),
            shard_bits,
        }
    }

    fn shard_of(&self, key: u64) -> usize {
        if self.shard_bits == 0 {
            0
        } else {
            (key >> (64 - self.shard_bits)) as usize
        }
    }

    fn heap_bytes(&self) -> usize {
        self.slab.capacity() * size_of::<Entry>()
            + self.by_page.allocation_size()
            + self.shards.capacity() * size_of::<Shard>()
            + self
                .shards
                .iter()
                .map(|s| s.heads.capacity() * size_of::<u32>())
                .sum::<usize>()
    }

    fn find_page(&self, region: u32, page: u32) -> Option<u32> {
        let slab = &self.slab;
        self.by_page
            .find(page_key(region, page), |&i| {
                let e = &slab[i as usize];
                e.region == region && e.page == page
            })
            .copied()
    }

    /// Offers each entry with `hash` to `same`, newest first; returns the
    /// first one it confirms. Looks at one shard and one bucket only.
    fn search(
        &self,
        hash: u32,
        regions: &Regions,
        same: &mut impl FnMut(PageRef, u64) -> bool,
        compared: &mut u64,
    ) -> Option<u32> {
        let key = content_key(hash);
        let shard = &self.shards[self.shard_of(key)];
        if shard.heads.is_empty() {
            return None;
        }
        let mut i = shard.heads[bucket_of(key, shard.heads.len())];
        while i != NIL {
            let e = &self.slab[i as usize];
            if e.hash == hash {
                *compared += 1;
                let page = PageRef {
                    region: regions.id(e.region),
                    page: e.page,
                };
                if same(page, e.fingerprint()) {
                    return Some(i);
                }
            }
            i = e.next;
        }
        None
    }

    /// Adds an entry for a page that is not in this table.
    fn insert(&mut self, hash: u32, fingerprint: u64, region: u32, page: u32) -> u32 {
        let entry = Entry {
            hash,
            fingerprint: split(fingerprint),
            region,
            page,
            next: NIL,
            prev: NIL,
        };
        let idx = if self.free != NIL {
            let idx = self.free;
            self.free = self.slab[idx as usize].next;
            self.slab[idx as usize] = entry;
            idx
        } else {
            assert!(
                self.slab.len() < NIL as usize,
                "sample index: more than 2^32-1 entries in one set"
            );
            if self.slab.len() == self.slab.capacity() {
                // Grow by half rather than double: bounds the slack per
                // entry (module header) at an amortized O(1) copy cost.
                self.slab
                    .reserve_exact((self.slab.len() / 2).max(MIN_SLAB_GROWTH));
            }
            self.slab.push(entry);
            (self.slab.len() - 1) as u32
        };
        let slab = &self.slab;
        self.by_page
            .insert_unique(page_key(region, page), idx, |&i| {
                let e = &slab[i as usize];
                page_key(e.region, e.page)
            });
        self.len += 1;
        self.link(idx);
        idx
    }

    /// Puts entry `idx` at the head of its bucket chain, growing its shard
    /// first if the shard would exceed one entry per bucket.
    fn link(&mut self, idx: u32) {
        let key = content_key(self.slab[idx as usize].hash);
        let s = self.shard_of(key);
        let len = self.shards[s].len + 1;
        if len > self.shards[s].heads.len() {
            self.resize_shard(s, bucket_count_for(len));
        }
        self.shards[s].len = len;
        self.push_front(s, key, idx);
    }

    fn push_front(&mut self, s: usize, key: u64, idx: u32) {
        let heads = &mut self.shards[s].heads;
        let b = bucket_of(key, heads.len());
        let old = heads[b];
        heads[b] = idx;
        let e = &mut self.slab[idx as usize];
        e.next = old;
        e.prev = NIL;
        if old != NIL {
            self.slab[old as usize].prev = idx;
        }
    }

    /// Appends shard `s`'s entries to `out`, each chain from tail to head:
    /// pushing them to the front in this order rebuilds every chain's
    /// relative order.
    fn chain_order(&self, s: usize, out: &mut Vec<u32>) {
        for &head in &self.shards[s].heads {
            if head == NIL {
                continue;
            }
            let mut i = head;
            while self.slab[i as usize].next != NIL {
                i = self.slab[i as usize].next;
            }
            loop {
                out.push(i);
                if i == head {
                    break;
                }
                i = self.slab[i as usize].prev;
            }
        }
    }

    fn full_order(&self) -> Vec<u32> {
        let mut order = Vec::with_capacity(self.len);
        for s in 0..self.shards.len() {
            self.chain_order(s, &mut order);
        }
        order
    }

    /// Rehashes one shard into `buckets` buckets: O(its entries).
    fn resize_shard(&mut self, s: usize, buckets: usize) {
        let mut order = Vec::with_capacity(self.shards[s].len);
        self.chain_order(s, &mut order);
        self.shards[s].heads = vec![NIL; buckets];
        for i in order {
            let key = content_key(self.slab[i as usize].hash);
            self.push_front(s, key, i);
        }
    }

    /// Rebuilds all shards from `order`, which lists every live entry.
    fn rebuild(&mut self, order: &[u32], shard_bits: u32) {
        debug_assert_eq!(order.len(), self.len);
        self.shard_bits = shard_bits;
        let mut counts = vec![0usize; 1 << shard_bits];
        for &i in order {
            counts[self.shard_of(content_key(self.slab[i as usize].hash))] += 1;
        }
        self.shards = counts
            .iter()
            .map(|&len| Shard {
                heads: vec![NIL; bucket_count_for(len)],
                len,
            })
            .collect();
        for &i in order {
            let key = content_key(self.slab[i as usize].hash);
            let s = self.shard_of(key);
            self.push_front(s, key, i);
        }
    }

    fn reshard(&mut self, shard_bits: u32) {
        let order = self.full_order();
        self.rebuild(&order, shard_bits);
    }

    /// Takes entry `idx` out of its chain.
    fn unlink(&mut self, idx: u32) {
        let e = self.slab[idx as usize];
        let key = content_key(e.hash);
        let s = self.shard_of(key);
        if e.prev != NIL {
            self.slab[e.prev as usize].next = e.next;
        } else {
            let heads = &mut self.shards[s].heads;
            let b = bucket_of(key, heads.len());
            debug_assert_eq!(heads[b], idx);
            heads[b] = e.next;
        }
        if e.next != NIL {
            self.slab[e.next as usize].prev = e.prev;
        }
        self.shards[s].len -= 1;
    }

    /// Frees entry `idx` (already out of its chain, or about to be dropped
    /// with all chains); returns its region slot for the caller to release.
    fn release(&mut self, idx: u32) -> u32 {
        self.unmap_page(idx);
        self.free_entry(idx)
    }

    /// Takes entry `idx` out of the page map.
    fn unmap_page(&mut self, idx: u32) {
        let e = self.slab[idx as usize];
        match self
            .by_page
            .find_entry(page_key(e.region, e.page), |&i| i == idx)
        {
            Ok(found) => {
                found.remove();
            }
            Err(_) => unreachable!("sample index: entry missing from the page map"),
        }
    }

    /// Puts entry `idx` into the page map under its region and page.
    fn map_page(&mut self, idx: u32) {
        let slab = &self.slab;
        let e = slab[idx as usize];
        self.by_page
            .insert_unique(page_key(e.region, e.page), idx, |&i| {
                let e = &slab[i as usize];
                page_key(e.region, e.page)
            });
    }

    /// Frees entry `idx`, which is out of its chain and out of the page
    /// map; returns its region slot for the caller to release.
    fn free_entry(&mut self, idx: u32) -> u32 {
        let e = self.slab[idx as usize];
        self.slab[idx as usize] = Entry {
            hash: 0,
            fingerprint: [0; 2],
            region: FREE,
            page: 0,
            next: self.free,
            prev: NIL,
        };
        self.free = idx;
        self.len -= 1;
        e.region
    }

    fn remove(&mut self, idx: u32) -> u32 {
        self.unlink(idx);
        self.release(idx)
    }

    /// Removes every entry of region slot `region`; O(slab).
    fn remove_region(&mut self, region: u32) -> u32 {
        let mut removed = 0;
        for idx in 0..self.slab.len() as u32 {
            if self.slab[idx as usize].region == region {
                self.remove(idx);
                removed += 1;
            }
        }
        removed
    }

    /// Gives every entry of a region slot in `slots` the (slot, page)
    /// `to` returns for its (slot, page), keeping its hash, fingerprint
    /// and place in its chain; drops it on `None`, or when its new page
    /// already has an entry here (`to` is meant to be one-to-one).
    /// Returns how many moved, how many were dropped, and the slots to
    /// release: every old slot, and the new one `to` gave an entry that
    /// was refused. O(entries).
    fn repoint(
        &mut self,
        slots: &[u32],
        mut to: impl FnMut(u32, u32) -> Option<(u32, u32)>,
    ) -> (u64, u64, Vec<u32>) {
        let picked: Vec<u32> = (0..self.slab.len() as u32)
            .filter(|&i| slots.contains(&self.slab[i as usize].region))
            .collect();
        // All out of the page map first: an entry may move onto the page
        // another one leaves.
        for &i in &picked {
            self.unmap_page(i);
        }
        let (mut moved, mut dropped) = (0, 0);
        let mut release = Vec::with_capacity(picked.len());
        for &i in &picked {
            let e = self.slab[i as usize];
            release.push(e.region);
            match to(e.region, e.page) {
                Some((region, page)) if self.find_page(region, page).is_none() => {
                    let entry = &mut self.slab[i as usize];
                    (entry.region, entry.page) = (region, page);
                    self.map_page(i);
                    moved += 1;
                }
                refused => {
                    self.unlink(i);
                    self.free_entry(i);
                    dropped += 1;
                    if let Some((region, _)) = refused {
                        release.push(region);
                    }
                }
            }
        }
        (moved, dropped, release)
    }

    /// Drops every entry; keeps the capacity for the next round.
    fn clear(&mut self, regions: &mut Regions) {
        for e in &self.slab {
            if e.region != FREE {
                regions.release(e.region, 1);
            }
        }
        self.slab.clear();
        self.free = NIL;
        self.len = 0;
        self.by_page.clear();
        for shard in &mut self.shards {
            shard.heads.fill(NIL);
            shard.len = 0;
        }
    }

    /// Moves the entries to the front of a right-sized slab and sizes the
    /// page map and the buckets to the entries.
    fn shrink_to_fit(&mut self) {
        let order = self.full_order();
        let slab: Vec<Entry> = order.iter().map(|&i| self.slab[i as usize]).collect();
        self.slab = slab;
        self.free = NIL;
        self.by_page = HashTable::with_capacity(self.len);
        for (i, e) in self.slab.iter().enumerate() {
            let slab = &self.slab;
            self.by_page
                .insert_unique(page_key(e.region, e.page), i as u32, |&j| {
                    let e = &slab[j as usize];
                    page_key(e.region, e.page)
                });
        }
        let order: Vec<u32> = (0..self.len as u32).collect();
        self.rebuild(&order, self.shard_bits);
    }
}

/// Interned regions: entries store a u32 slot instead of the 8-byte id.
/// A slot lives while some entry refers to it.
#[derive(Debug, Default)]
struct Regions {
    by_id: HashTable<u32>,
    ids: Vec<RegionId>,
    refs: Vec<u32>,
    free: Vec<u32>,
}

impl Regions {
    fn key(id: RegionId) -> u64 {
        mix64(id.0)
    }

    fn id(&self, slot: u32) -> RegionId {
        self.ids[slot as usize]
    }

    fn lookup(&self, id: RegionId) -> Option<u32> {
        let ids = &self.ids;
        self.by_id
            .find(Self::key(id), |&s| ids[s as usize] == id)
            .copied()
    }

    /// The slot of `id`, counting one more entry on it.
    fn acquire(&mut self, id: RegionId) -> u32 {
        if let Some(slot) = self.lookup(id) {
            self.refs[slot as usize] += 1;
            return slot;
        }
        let slot = match self.free.pop() {
            Some(slot) => {
                self.ids[slot as usize] = id;
                self.refs[slot as usize] = 1;
                slot
            }
            None => {
                assert!(
                    self.ids.len() < FREE as usize,
                    "sample index: more than 2^32-1 regions"
                );
                self.ids.push(id);
                self.refs.push(1);
                (self.ids.len() - 1) as u32
            }
        };
        let ids = &self.ids;
        self.by_id
            .insert_unique(Self::key(id), slot, |&s| Self::key(ids[s as usize]));
        slot
    }

    /// `n` entries on `slot` are gone; frees the slot at zero.
    fn release(&mut self, slot: u32, n: u32) {
        let refs = &mut self.refs[slot as usize];
        *refs -= n;
        if *refs == 0 {
            let id = self.ids[slot as usize];
            match self.by_id.find_entry(Self::key(id), |&s| s == slot) {
                Ok(found) => {
                    found.remove();
                }
                Err(_) => unreachable!("sample index: region slot missing"),
            }
            self.free.push(slot);
        }
    }

    fn heap_bytes(&self) -> usize {
        self.by_id.allocation_size()
            + self.ids.capacity() * size_of::<RegionId>()
            + self.refs.capacity() * size_of::<u32>()
            + self.free.capacity() * size_of::<u32>()
    }

    fn shrink_to_fit(&mut self) {
        let ids = &self.ids;
        self.by_id.shrink_to_fit(|&s| Self::key(ids[s as usize]));
        self.free.shrink_to_fit();
    }
}

/// Counters behind [`IndexStats`]; atomics so that the `&self` lookup can
/// count (relaxed: they are statistics, one add per lookup).
#[derive(Debug, Default)]
struct Counters {
    stable_compared: AtomicU64,
    stable_collisions: AtomicU64,
    unstable_compared: AtomicU64,
    unstable_collisions: AtomicU64,
    reshards: AtomicU64,
}

/// The sample index: stable and unstable sets of sampled pages, each a
/// sharded chained hash table keyed by partial hash (module header).
#[derive(Debug)]
pub struct SampleIndex {
    config: IndexConfig,
    tracked_pages: u64,
    shard_bits: u32,
    stable: Table,
    unstable: Table,
    regions: Regions,
    counters: Counters,
}

impl SampleIndex {
    /// Size of one entry in bytes (hash, region slot, page, two links).
    pub const ENTRY_BYTES: usize = size_of::<Entry>();

    /// An empty index with one shard.
    ///
    /// # Panics
    /// If `config` is invalid ([`IndexConfig::validate`] says why).
    pub fn new(config: IndexConfig) -> Self {
        if let Err(why) = config.validate() {
            panic!("{why}");
        }
        SampleIndex {
            config,
            tracked_pages: 0,
            shard_bits: 0,
            stable: Table::new(0),
            unstable: Table::new(0),
            regions: Regions::default(),
            counters: Counters::default(),
        }
    }

    /// The configuration the index was made with.
    pub fn config(&self) -> IndexConfig {
        self.config
    }

    /// Tells the index how many pages pagesift tracks; the shard count
    /// follows (module header: grows at once, shrinks with hysteresis, and
    /// relinks every entry when it changes).
    pub fn set_tracked_pages(&mut self, pages: u64) {
        self.tracked_pages = pages;
        let want = shard_bits_for(pages, self.config.shard_pages);
        if want > self.shard_bits || want + 2 <= self.shard_bits {
            self.shard_bits = want;
            self.stable.reshard(want);
            self.unstable.reshard(want);
            *self.counters.reshards.get_mut() += 1;
        }
    }

    /// The tracked pages last set.
    pub fn tracked_pages(&self) -> u64 {
        self.tracked_pages
    }

    /// Number of shards (stable and unstable table pairs).
    pub fn shards(&self) -> usize {
        1 << self.shard_bits
    }

    /// Offers every stable page with `hash`, and the fingerprint it was
    /// indexed with, to `same` (the caller's check against the page being
    /// looked up) and returns the first it confirms. Nothing is removed.
    /// If the page looked up is itself a stable entry, it is among the
    /// candidates.
    pub fn find_stable(
        &self,
        hash: u32,
        mut same: impl FnMut(PageRef, u64) -> bool,
    ) -> Option<PageRef> {
        let mut compared = 0;
        let found = self
            .stable
            .search(hash, &self.regions, &mut same, &mut compared);
        self.count(IndexSet::Stable, compared, found.is_some());
        found.map(|i| self.page_ref(&self.stable, i))
    }

    /// Indexes `page` as a stable (merged) page under `hash`, with the
    /// full-content `fingerprint` it has now, first removing any entry the
    /// page already has in either set.
    pub fn insert_stable(&mut self, hash: u32, page: PageRef, fingerprint: u64) {
        self.remove_page(page);
        let slot = self.regions.acquire(page.region);
        self.stable.insert(hash, fingerprint, slot, page.page);
    }

    /// Offers every unstable candidate with this hash, and its fingerprint,
    /// to `same`; returns the first verified twin and removes it from the
    /// unstable set (the caller will insert the pair's representative into
    /// stable); if none, inserts `page` with its `fingerprint` into the
    /// unstable set and returns None.
    ///
    /// Any entry `page` already has (in either set) is removed first, so a
    /// page is never offered to itself.
    pub fn find_or_insert_unstable(
        &mut self,
        hash: u32,
        page: PageRef,
        fingerprint: u64,
        mut same: impl FnMut(PageRef, u64) -> bool,
    ) -> Option<PageRef> {
        self.remove_page(page);
        let mut compared = 0;
        let found = self
            .unstable
            .search(hash, &self.regions, &mut same, &mut compared);
        self.count(IndexSet::Unstable, compared, found.is_some());
        match found {
            Some(i) => {
                let twin = self.page_ref(&self.unstable, i);
                let slot = self.unstable.remove(i);
                self.regions.release(slot, 1);
                Some(twin)
            }
            None => {
                let slot = self.regions.acquire(page.region);
                self.unstable.insert(hash, fingerprint, slot, page.page);
                None
            }
        }
    }

    /// Removes `page` from whichever set holds it, in O(1) (expected).
    /// Returns whether it was indexed.
    pub fn remove_page(&mut self, page: PageRef) -> bool {
        let Some(slot) = self.regions.lookup(page.region) else {
            return false;
        };
        for table in [&mut self.stable, &mut self.unstable] {
            if let Some(i) = table.find_page(slot, page.page) {
                table.remove(i);
                // A page has one entry at most: stop here (the slot may be
                // freed by this release).
                self.regions.release(slot, 1);
                return true;
            }
        }
        false
    }

    /// Removes every page of `region` (it was unmapped) from both sets, in
    /// O(entries). Returns how many entries went.
    pub fn remove_region(&mut self, region: RegionId) -> usize {
        let Some(slot) = self.regions.lookup(region) else {
            return 0;
        };
        let removed = self.stable.remove_region(slot) + self.unstable.remove_region(slot);
        self.regions.release(slot, removed);
        removed as usize
    }

    /// Moves every entry of the `regions` to the page `to` names for it,
    /// in the same set with the same hash, fingerprint and place in its
    /// chain, or drops it on `None`. For regions whose shape changed (a
    /// refresh found one cut in two, e.g. a run of it marked mergeable
    /// became a VMA of its own): their entries past the cut name offsets
    /// they no longer have, and a twin found among those could not be
    /// read, while the pages the entries stand for, now in another region,
    /// still hold the content indexed. `to` must be one-to-one and name no
    /// page indexed outside `regions` (a map by address is); an entry it
    /// maps onto a page that has one is dropped. O(entries of both sets).
    /// Returns (moved, dropped).
    pub fn remap_regions(
        &mut self,
        regions: &[RegionId],
        mut to: impl FnMut(PageRef) -> Option<PageRef>,
    ) -> (u64, u64) {
        let slots: Vec<u32> = regions
            .iter()
            .filter_map(|&r| self.regions.lookup(r))
            .collect();
        if slots.is_empty() {
            return (0, 0);
        }
        let (mut moved, mut dropped, mut release) = (0, 0, Vec::new());
        for table in [&mut self.stable, &mut self.unstable] {
            let ids = &mut self.regions;
            // The new page's slot is acquired here and the old one
            // released below, after both sets: a slot is freed only when
            // no entry names it.
            let (m, d, r) = table.repoint(&slots, |slot, page| {
                let p = to(PageRef {
                    region: ids.id(slot),
                    page,
                })?;
                Some((ids.acquire(p.region), p.page))
            });
            (moved, dropped) = (moved + m, dropped + d);
            release.extend(r);
        }
        for slot in release {
            self.regions.release(slot, 1);
        }
        (moved, dropped)
    }

    /// Empties the unstable set (after each global round and on every
    /// strength change). Its capacity is kept for the next round.
    pub fn clear_unstable(&mut self) {
        self.unstable.clear(&mut self.regions);
    }

    /// Every stable entry: its page and the hash it is indexed under, in
    /// the table's order.
    pub fn stable_entries(&self) -> Vec<(PageRef, u32)> {
        self.stable
            .full_order()
            .into_iter()
            .map(|i| {
                let e = self.stable.slab[i as usize];
                let page = PageRef {
                    region: self.regions.id(e.region),
                    page: e.page,
                };
                (page, e.hash)
            })
            .collect()
    }

    /// Which set holds `page`, and the hash it was indexed under.
    pub fn lookup_page(&self, page: PageRef) -> Option<(IndexSet, u32)> {
        let slot = self.regions.lookup(page.region)?;
        for (set, table) in [
            (IndexSet::Stable, &self.stable),
            (IndexSet::Unstable, &self.unstable),
        ] {
            if let Some(i) = table.find_page(slot, page.page) {
                return Some((set, table.slab[i as usize].hash));
            }
        }
        None
    }

    /// Entries in the stable set.
    pub fn stable_len(&self) -> usize {
        self.stable.len
    }

    /// Entries in the unstable set.
    pub fn unstable_len(&self) -> usize {
        self.unstable.len
    }

    /// Heap bytes held, computed from the capacities of every allocation
    /// (slabs, page maps, bucket heads, shard arrays, region table).
    pub fn heap_bytes(&self) -> usize {
        self.stable.heap_bytes() + self.unstable.heap_bytes() + self.regions.heap_bytes()
    }

    /// Returns spare capacity: compacts the slabs and sizes the page maps
    /// and buckets to the entries. O(entries); entry order is kept.
    pub fn shrink_to_fit(&mut self) {
        self.stable.shrink_to_fit();
        self.unstable.shrink_to_fit();
        self.regions.shrink_to_fit();
    }

    /// A snapshot of the cumulative counters.
    pub fn stats(&self) -> IndexStats {
        let c = &self.counters;
        IndexStats {
            stable_compared: c.stable_compared.load(Relaxed),
            stable_collisions: c.stable_collisions.load(Relaxed),
            unstable_compared: c.unstable_compared.load(Relaxed),
            unstable_collisions: c.unstable_collisions.load(Relaxed),
            reshards: c.reshards.load(Relaxed),
        }
    }

    fn count(&self, set: IndexSet, compared: u64, hit: bool) {
        let collisions = compared - u64::from(hit);
        let (c, f) = match set {
            IndexSet::Stable => (
                &self.counters.stable_compared,
                &self.counters.stable_collisions,
            ),
            IndexSet::Unstable => (
                &self.counters.unstable_compared,
                &self.counters.unstable_collisions,
            ),
        };
        if compared > 0 {
            c.fetch_add(compared, Relaxed);
        }
        if collisions > 0 {
            f.fetch_add(collisions, Relaxed);
        }
    }

    fn page_ref(&self, table: &Table, i: u32) -> PageRef {
        let e = &table.slab[i as usize];
        PageRef {
            region: self.regions.id(e.region),
            page: e.page,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{HashMap, HashSet};

    fn p(region: u64, page: u32) -> PageRef {
        PageRef {
            region: RegionId(region),
            page,
        }
    }

    fn small(shard_pages: u64) -> SampleIndex {
        SampleIndex::new(IndexConfig { shard_pages })
    }

    /// Walks every structure and checks that they agree.
    fn check_invariants(ix: &SampleIndex) {
        let mut refs: HashMap<u32, u32> = HashMap::new();
        let mut pages = HashSet::new();
        for table in [&ix.stable, &ix.unstable] {
            assert_eq!(table.shard_bits, ix.shard_bits);
            assert_eq!(table.shards.len(), 1 << ix.shard_bits);
            let mut seen = HashSet::new();
            for (s, shard) in table.shards.iter().enumerate() {
                assert!(shard.heads.len() >= shard.len, "load above 1");
                if shard.len > 0 {
                    assert!(shard.heads.len().is_power_of_two());
                }
                let mut n = 0;
                for (b, &head) in shard.heads.iter().enumerate() {
                    let mut prev = NIL;
                    let mut i = head;
                    while i != NIL {
                        let e = table.slab[i as usize];
                        assert_ne!(e.region, FREE, "free entry in a chain");
                        assert_eq!(e.prev, prev, "broken back link");
                        let key = content_key(e.hash);
                        assert_eq!(table.shard_of(key), s, "entry in the wrong shard");
                        assert_eq!(bucket_of(key, shard.heads.len()), b, "wrong bucket");
                        assert!(seen.insert(i), "entry linked twice");
                        assert_eq!(table.find_page(e.region, e.page), Some(i));
                        assert!(pages.insert((e.region, e.page)), "page indexed twice");
                        *refs.entry(e.region).or_default() += 1;
                        prev = i;
                        i = e.next;
                        n += 1;
                    }
                }
                assert_eq!(n, shard.len, "shard length");
            }
            assert_eq!(seen.len(), table.len);
            assert_eq!(table.by_page.len(), table.len);
            let mut free = 0;
            let mut i = table.free;
            while i != NIL {
                assert_eq!(table.slab[i as usize].region, FREE);
                free += 1;
                i = table.slab[i as usize].next;
            }
            assert_eq!(free + table.len, table.slab.len(), "leaked slab slots");
        }
        assert_eq!(ix.regions.by_id.len(), refs.len(), "live regions");
        for (&slot, &n) in &refs {
            assert_eq!(ix.regions.refs[slot as usize], n, "region refcount");
            assert_eq!(ix.regions.lookup(ix.regions.id(slot)), Some(slot));
        }
    }

    #[test]
    fn default_shard_is_100_mib_of_pages() {
        assert_eq!(IndexConfig::default().shard_pages, 25_600);
        assert!(
            IndexConfig { shard_pages: 0 }
                .validate()
                .unwrap_err()
                .contains("shard_pages")
        );
    }

    #[test]
    fn entry_is_28_bytes() {
        assert_eq!(SampleIndex::ENTRY_BYTES, 28);
        // Smaller than the naive layout: page, fingerprint, hash, links.
        assert!(SampleIndex::ENTRY_BYTES < size_of::<(PageRef, u64, u32, u32, u32)>());
    }

    #[test]
    fn shard_count_follows_tracked_memory() {
        let mut ix = SampleIndex::new(IndexConfig::default());
        assert_eq!(ix.shards(), 1);
        ix.set_tracked_pages(25_600);
        assert_eq!(ix.shards(), 1);
        ix.set_tracked_pages(25_601);
        assert_eq!(ix.shards(), 2);
        // 10 GiB: 2621440 pages / 25600 = 102.4 → 103 → 128 shards.
        ix.set_tracked_pages(10 << 18);
        assert_eq!(ix.shards(), 128);
        // Down to 40 shards' worth: 64 > 128/4, keep 128 (hysteresis).
        ix.set_tracked_pages(40 * 25_600);
        assert_eq!(ix.shards(), 128);
        // Down to 20 shards' worth: 32 ≤ 128/4, shrink.
        ix.set_tracked_pages(20 * 25_600);
        assert_eq!(ix.shards(), 32);
        ix.set_tracked_pages(u64::MAX);
        assert_eq!(ix.shards(), 1 << MAX_SHARD_BITS);
        assert_eq!(ix.stats().reshards, 4);
    }

    #[test]
    fn every_candidate_with_the_hash_is_offered_and_only_a_verified_one_wins() {
        let mut ix = small(1);
        // Three distinct pages collide on hash 7; one page with hash 8.
        for (i, pg) in [p(1, 0), p(1, 1), p(2, 5)].into_iter().enumerate() {
            assert_eq!(
                ix.find_or_insert_unstable(7, pg, 0, |_, _| false),
                None,
                "{i}"
            );
        }
        ix.find_or_insert_unstable(8, p(3, 3), 0, |_, _| false);
        assert_eq!(ix.unstable_len(), 4);
        let before = ix.stats();
        let mut offered = Vec::new();
        let twin = ix.find_or_insert_unstable(7, p(9, 9), 0, |c, _| {
            offered.push(c);
            c == p(1, 0)
        });
        assert_eq!(twin, Some(p(1, 0)));
        // Newest first; the page with hash 8 is never offered.
        assert_eq!(offered, vec![p(2, 5), p(1, 1), p(1, 0)]);
        let d = ix.stats().since(&before);
        assert_eq!((d.unstable_compared, d.unstable_collisions), (3, 2));
        // The twin left the unstable set; the query page was not inserted.
        assert_eq!(ix.unstable_len(), 3);
        assert_eq!(ix.lookup_page(p(1, 0)), None);
        assert_eq!(ix.lookup_page(p(9, 9)), None);
        check_invariants(&ix);
    }

    /// Region 1 is cut at page 4 into region 1 (pages 0..4) and region 9
    /// (pages 4..8 → 0..4); its page 6 was unmapped. Its entries follow
    /// their pages in both sets, with hash, fingerprint and chain order;
    /// the unmapped page's entry goes; region 2 is untouched.
    #[test]
    fn remapped_entries_follow_their_pages() {
        let mut ix = small(1);
        ix.insert_stable(5, p(1, 1), 11);
        ix.insert_stable(5, p(1, 5), 15);
        ix.insert_stable(5, p(2, 5), 25);
        ix.find_or_insert_unstable(6, p(1, 7), 17, |_, _| false);
        ix.find_or_insert_unstable(7, p(1, 6), 16, |_, _| false);
        let (moved, dropped) = ix.remap_regions(&[RegionId(1)], |q| match q.page {
            0..4 => Some(q),
            6 => None,
            k => Some(p(9, k - 4)),
        });
        assert_eq!((moved, dropped), (3, 1));
        assert_eq!((ix.stable_len(), ix.unstable_len()), (3, 1));
        assert_eq!(ix.lookup_page(p(1, 5)), None);
        assert_eq!(ix.lookup_page(p(9, 1)), Some((IndexSet::Stable, 5)));
        assert_eq!(ix.lookup_page(p(9, 3)), Some((IndexSet::Unstable, 6)));
        assert_eq!(ix.lookup_page(p(1, 1)), Some((IndexSet::Stable, 5)));
        assert_eq!(ix.lookup_page(p(2, 5)), Some((IndexSet::Stable, 5)));
        // Newest first, as before the cut: region 2's page, then the moved
        // page 5 (now 9:1), then page 1.
        let mut offered = Vec::new();
        ix.find_stable(5, |c, fp| {
            offered.push((c, fp));
            false
        });
        assert_eq!(offered, vec![(p(2, 5), 25), (p(9, 1), 15), (p(1, 1), 11)]);
        // Unknown regions move nothing; a moved entry can be removed.
        assert_eq!(ix.remap_regions(&[RegionId(4)], Some), (0, 0));
        assert!(ix.remove_page(p(9, 1)));
        assert_eq!(ix.remove_region(RegionId(9)), 1);
        assert_eq!(ix.remove_region(RegionId(1)), 1);
        // Two entries mapped onto one page: the second is refused, and
        // the region slots stay counted right (the old and new regions
        // can be removed and reused).
        ix.insert_stable(8, p(3, 0), 30);
        ix.insert_stable(8, p(3, 1), 31);
        assert_eq!(ix.remap_regions(&[RegionId(3)], |_| Some(p(4, 0))), (1, 1));
        assert_eq!(ix.stable_len(), 2);
        assert_eq!(ix.remove_region(RegionId(3)), 0);
        assert_eq!(ix.remove_region(RegionId(4)), 1);
        ix.insert_stable(8, p(3, 2), 32);
        assert_eq!(ix.lookup_page(p(3, 2)), Some((IndexSet::Stable, 8)));
    }

    #[test]
    fn a_hash_hit_alone_is_never_trusted() {
        let mut ix = small(1);
        ix.insert_stable(42, p(1, 1), 0);
        assert_eq!(ix.find_stable(42, |_, _| false), None);
        assert_eq!(ix.find_stable(42, |c, _| c == p(1, 1)), Some(p(1, 1)));
        assert_eq!(ix.find_stable(43, |_, _| true), None);
        let s = ix.stats();
        assert_eq!((s.stable_compared, s.stable_collisions), (2, 1));
        assert_eq!(
            ix.find_or_insert_unstable(42, p(2, 2), 0, |_, _| false),
            None
        );
        assert_eq!(ix.lookup_page(p(2, 2)), Some((IndexSet::Unstable, 42)));
    }

    #[test]
    fn a_page_is_indexed_once_and_never_offered_to_itself() {
        let mut ix = small(1);
        ix.find_or_insert_unstable(5, p(1, 1), 0, |_, _| false);
        // Re-sampled with a new hash: the old entry goes.
        let mut offered = Vec::new();
        ix.find_or_insert_unstable(5, p(1, 1), 0, |c, _| {
            offered.push(c);
            true
        });
        assert!(offered.is_empty());
        assert_eq!(ix.unstable_len(), 1);
        ix.insert_stable(6, p(1, 1), 0);
        assert_eq!(ix.lookup_page(p(1, 1)), Some((IndexSet::Stable, 6)));
        assert_eq!((ix.stable_len(), ix.unstable_len()), (1, 0));
        check_invariants(&ix);
    }

    #[test]
    fn removing_from_the_middle_of_a_long_collision_chain_keeps_the_rest() {
        let mut ix = small(1);
        for page in 0..1000 {
            ix.insert_stable(1, p(1, page), 0);
        }
        for page in (0..1000).step_by(3) {
            assert!(ix.remove_page(p(1, page)));
        }
        assert!(!ix.remove_page(p(1, 0)));
        check_invariants(&ix);
        let mut offered = HashSet::new();
        assert_eq!(ix.find_stable(1, |c, _| !offered.insert(c)), None);
        let expected: HashSet<_> = (0..1000).filter(|x| x % 3 != 0).map(|x| p(1, x)).collect();
        assert_eq!(offered, expected);
    }

    #[test]
    fn remove_region_takes_only_that_region_from_both_sets() {
        let mut ix = small(1);
        for page in 0..50 {
            ix.insert_stable(page % 7, p(1, page), 0);
            ix.find_or_insert_unstable(page % 5, p(2, page), 0, |_, _| false);
            ix.find_or_insert_unstable(page % 5, p(1, 100 + page), 0, |_, _| false);
        }
        assert_eq!(ix.remove_region(RegionId(1)), 100);
        assert_eq!(ix.remove_region(RegionId(1)), 0);
        assert_eq!((ix.stable_len(), ix.unstable_len()), (0, 50));
        assert!(
            ix.regions.lookup(RegionId(1)).is_none(),
            "region slot freed"
        );
        assert_eq!(ix.lookup_page(p(2, 7)), Some((IndexSet::Unstable, 2)));
        check_invariants(&ix);
    }

    #[test]
    fn clear_unstable_keeps_stable_and_capacity() {
        let mut ix = small(1);
        for page in 0..500 {
            ix.insert_stable(page, p(1, page), 0);
            ix.find_or_insert_unstable(page, p(2, page), 0, |_, _| false);
        }
        let bytes = ix.heap_bytes();
        let unstable_bytes = ix.unstable.heap_bytes();
        ix.clear_unstable();
        assert_eq!((ix.stable_len(), ix.unstable_len()), (500, 0));
        assert_eq!(
            ix.unstable.heap_bytes(),
            unstable_bytes,
            "capacity kept for the next round"
        );
        assert!(ix.regions.lookup(RegionId(2)).is_none());
        assert_eq!(ix.find_stable(3, |c, _| c == p(1, 3)), Some(p(1, 3)));
        check_invariants(&ix);
        ix.shrink_to_fit();
        assert!(ix.heap_bytes() < bytes, "shrink_to_fit returns capacity");
        assert_eq!(ix.find_stable(3, |c, _| c == p(1, 3)), Some(p(1, 3)));
        check_invariants(&ix);
    }

    #[test]
    fn each_candidate_is_offered_with_the_fingerprint_it_was_indexed_with() {
        let mut ix = small(1);
        let big = 0xdead_beef_0123_4567_u64;
        ix.insert_stable(9, p(1, 1), big);
        ix.find_or_insert_unstable(9, p(2, 2), 0, |_, _| false);
        ix.find_or_insert_unstable(9, p(2, 3), u64::MAX, |_, _| false);
        let mut stable = Vec::new();
        ix.find_stable(9, |c, f| {
            stable.push((c, f));
            false
        });
        assert_eq!(stable, vec![(p(1, 1), big)]);
        let mut unstable = Vec::new();
        let twin = ix.find_or_insert_unstable(9, p(3, 3), 7, |c, f| {
            unstable.push((c, f));
            f == 0
        });
        assert_eq!(unstable, vec![(p(2, 3), u64::MAX), (p(2, 2), 0)]);
        assert_eq!(twin, Some(p(2, 2)));
        // Re-inserting a page replaces its fingerprint.
        ix.insert_stable(9, p(1, 1), 1);
        assert_eq!(ix.find_stable(9, |_, f| f == 1), Some(p(1, 1)));
        check_invariants(&ix);
    }

    #[test]
    fn resharding_keeps_every_entry_and_the_candidate_order() {
        let mut ix = small(10);
        for page in 0..300 {
            ix.find_or_insert_unstable(page % 17, p(1, page), 0, |_, _| false);
            ix.insert_stable(page % 13, p(2, page), 0);
        }
        let order = |ix: &SampleIndex, h: u32| {
            let mut v = Vec::new();
            ix.find_stable(h, |c, _| {
                v.push(c);
                false
            });
            v
        };
        let before: Vec<_> = (0..13).map(|h| order(&ix, h)).collect();
        for tracked in [100, 1000, 5000, 40, 0] {
            ix.set_tracked_pages(tracked);
            check_invariants(&ix);
            assert_eq!((ix.stable_len(), ix.unstable_len()), (300, 300));
            let after: Vec<_> = (0..13).map(|h| order(&ix, h)).collect();
            assert_eq!(after, before, "at {tracked} tracked pages");
        }
        assert_eq!(ix.shards(), 1);
        // Newest first within a hash.
        // 299 = 13 × 23 is the last page inserted with hash 0.
        assert_eq!(before[0][0], p(2, 299));
    }

    #[test]
    fn lookups_touch_one_shard_only() {
        // Each hash's candidates all live in the shard its top bits name, so
        // a lookup that reads one shard sees all of them (check_invariants
        // also asserts every entry sits in shard_of(its hash)).
        let mut ix = small(1);
        ix.set_tracked_pages(256);
        for page in 0..2000 {
            ix.insert_stable(page % 50, p(page as u64 % 7, page), 0);
        }
        for h in 0..50 {
            let s = ix.stable.shard_of(content_key(h));
            let in_shard = ix.stable.shards[s].len;
            let mut n = 0;
            ix.find_stable(h, |_, _| {
                n += 1;
                false
            });
            assert_eq!(n, 40);
            assert!(in_shard >= 40);
        }
        let used = ix.stable.shards.iter().filter(|s| s.len > 0).count();
        assert!(used > 30, "50 hashes spread over 256 shards, got {used}");
        check_invariants(&ix);
    }

    /// Builds an index the way the engine fills it (random hashes, 3/4 of
    /// the entries unstable, sampling one page in 16 of the tracked memory)
    /// and measures heap bytes per entry at many sizes.
    #[test]
    fn heap_bytes_per_entry_stays_below_the_documented_bound() {
        let mut ix = SampleIndex::new(IndexConfig::default());
        let mut x: u64 = 0x1234_5678_9abc_def1;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let (mut min, mut max, mut sum, mut n) = (f64::MAX, 0f64, 0f64, 0u32);
        for i in 0..300_000u32 {
            let r = rand();
            let page = p(u64::from(i / 4096), i % 4096);
            if r % 4 == 0 {
                ix.insert_stable(r as u32 >> 2, page, 0);
            } else {
                ix.find_or_insert_unstable(r as u32 >> 2, page, 0, |_, _| false);
            }
            let len = (i + 1) as usize;
            if len >= 4096 && len.is_multiple_of(97) {
                ix.set_tracked_pages(len as u64 * 16);
                let per = ix.heap_bytes() as f64 / (ix.stable_len() + ix.unstable_len()) as f64;
                min = min.min(per);
                max = max.max(per);
                sum += per;
                n += 1;
            }
        }
        assert_eq!(ix.stable_len() + ix.unstable_len(), 300_000);
        assert!(ix.shards() >= 128, "{} shards", ix.shards());
        println!(
            "heap bytes per entry over {n} sizes 4k..300k: min {min:.1} mean {:.1} max {max:.1} (bound {MAX_HEAP_BYTES_PER_ENTRY})",
            sum / f64::from(n)
        );
        assert!(max <= MAX_HEAP_BYTES_PER_ENTRY as f64, "max {max:.1}");
        assert!(
            min >= SampleIndex::ENTRY_BYTES as f64,
            "accounting misses the slab"
        );
        // After shrink_to_fit only the unavoidable slack is left.
        ix.shrink_to_fit();
        let per = ix.heap_bytes() as f64 / 300_000.0;
        println!("after shrink_to_fit: {per:.1} bytes per entry");
        assert!(per < max);
    }

    // ---- property test against a simple model ----

    #[derive(Clone, Debug)]
    enum Op {
        Track(u64),
        InsertStable(u32, PageRef),
        FindStable(u32, u8),
        FindOrInsert(u32, PageRef),
        RemovePage(PageRef),
        RemoveRegion(u64),
        ClearUnstable,
        Shrink,
    }

    /// Content of a page in the model: pages with one hash are equal or not.
    fn content(pg: PageRef) -> u8 {
        ((pg.region.0 * 5 + u64::from(pg.page)) % 3) as u8
    }

    fn page_strategy() -> impl Strategy<Value = PageRef> {
        (0u64..4, 0u32..10).prop_map(|(r, pg)| p(r, pg))
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        let hash = 0u32..6;
        prop_oneof![
            1 => (0u64..200).prop_map(Op::Track),
            4 => (hash.clone(), page_strategy()).prop_map(|(h, pg)| Op::InsertStable(h, pg)),
            3 => (hash.clone(), 0u8..3).prop_map(|(h, c)| Op::FindStable(h, c)),
            8 => (hash, page_strategy()).prop_map(|(h, pg)| Op::FindOrInsert(h, pg)),
            2 => page_strategy().prop_map(Op::RemovePage),
            1 => (0u64..5).prop_map(Op::RemoveRegion),
            1 => Just(Op::ClearUnstable),
            1 => Just(Op::Shrink),
        ]
    }

    /// Checks one lookup against the model's candidates; returns nothing,
    /// panics on a difference.
    fn check_lookup(
        candidates: &[PageRef],
        offered: &[PageRef],
        found: Option<PageRef>,
        want: u8,
        stats: IndexStats,
        set: IndexSet,
    ) {
        let cands: HashSet<_> = candidates.iter().copied().collect();
        let offered_set: HashSet<_> = offered.iter().copied().collect();
        assert_eq!(offered_set.len(), offered.len(), "candidate offered twice");
        assert!(
            offered_set.is_subset(&cands),
            "offered a page without the hash"
        );
        match found {
            Some(x) => {
                assert_eq!(
                    offered.last(),
                    Some(&x),
                    "returned page was not the confirmed one"
                );
                assert_eq!(content(x), want);
                assert!(
                    offered[..offered.len() - 1]
                        .iter()
                        .all(|&c| content(c) != want)
                );
            }
            None => {
                assert_eq!(offered_set, cands, "a candidate was not offered");
                assert!(cands.iter().all(|&c| content(c) != want));
            }
        }
        let (compared, collisions) = match set {
            IndexSet::Stable => (stats.stable_compared, stats.stable_collisions),
            IndexSet::Unstable => (stats.unstable_compared, stats.unstable_collisions),
        };
        assert_eq!(compared, offered.len() as u64);
        assert_eq!(
            collisions,
            offered.len() as u64 - u64::from(found.is_some())
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        #[test]
        fn behaves_like_a_list_of_hash_page_pairs(
            shard_pages in 1u64..20,
            ops in prop::collection::vec(op_strategy(), 1..120),
        ) {
            let mut ix = small(shard_pages);
            let mut model: Vec<(IndexSet, u32, PageRef)> = Vec::new();
            for op in ops {
                let before = ix.stats();
                match op {
                    Op::Track(t) => ix.set_tracked_pages(t),
                    Op::InsertStable(h, pg) => {
                        ix.insert_stable(h, pg, 0);
                        model.retain(|e| e.2 != pg);
                        model.push((IndexSet::Stable, h, pg));
                    }
                    Op::FindStable(h, want) => {
                        let mut offered = Vec::new();
                        let found = ix.find_stable(h, |c, _| { offered.push(c); content(c) == want });
                        let cands: Vec<_> = model.iter()
                            .filter(|e| e.0 == IndexSet::Stable && e.1 == h).map(|e| e.2).collect();
                        check_lookup(&cands, &offered, found, want, ix.stats().since(&before), IndexSet::Stable);
                    }
                    Op::FindOrInsert(h, pg) => {
                        let mut offered = Vec::new();
                        let want = content(pg);
                        let found = ix.find_or_insert_unstable(h, pg, 0, |c, _| { offered.push(c); content(c) == want });
                        model.retain(|e| e.2 != pg);
                        let cands: Vec<_> = model.iter()
                            .filter(|e| e.0 == IndexSet::Unstable && e.1 == h).map(|e| e.2).collect();
                        check_lookup(&cands, &offered, found, want, ix.stats().since(&before), IndexSet::Unstable);
                        match found {
                            Some(x) => model.retain(|e| e.2 != x),
                            None => model.push((IndexSet::Unstable, h, pg)),
                        }
                    }
                    Op::RemovePage(pg) => {
                        let was = model.iter().any(|e| e.2 == pg);
                        prop_assert_eq!(ix.remove_page(pg), was);
                        model.retain(|e| e.2 != pg);
                    }
                    Op::RemoveRegion(r) => {
                        let n = model.iter().filter(|e| e.2.region == RegionId(r)).count();
                        prop_assert_eq!(ix.remove_region(RegionId(r)), n);
                        model.retain(|e| e.2.region != RegionId(r));
                    }
                    Op::ClearUnstable => {
                        ix.clear_unstable();
                        model.retain(|e| e.0 == IndexSet::Stable);
                    }
                    Op::Shrink => ix.shrink_to_fit(),
                }
                check_invariants(&ix);
                let stable = model.iter().filter(|e| e.0 == IndexSet::Stable).count();
                prop_assert_eq!(ix.stable_len(), stable);
                prop_assert_eq!(ix.unstable_len(), model.len() - stable);
                for r in 0..4 {
                    for pg in 0..10 {
                        let pg = p(r, pg);
                        let want = model.iter().find(|e| e.2 == pg).map(|e| (e.0, e.1));
                        prop_assert_eq!(ix.lookup_page(pg), want);
                    }
                }
            }
        }
    }
}
