//! Grouping pages by content, with byte-exact verification.
//!
//! Every page read by the exact scan is hashed (XXH3-64) and looked up in
//! a table of content groups keyed by hash. **A hash equality is never
//! trusted**: a page joins a group only after its bytes were compared with
//! the group's representative (its first page). The representative's bytes
//! come from a bounded cache, or, when they are not cached, are read again
//! from the target:
//!
//! - A new group's content is cached while the cache is nearly empty
//!   (the first [`CACHE_AT_CREATION`] slots): a copy is cheaper than a
//!   re-read when contents repeat right away.
//! - A page whose hash names a group without cached content waits in a
//!   *pending* buffer (its bytes copied). When the buffer is full, at the
//!   end of each process and at the end of the scan, the representatives
//!   of every waiting page are read again in one sorted, batched pass
//!   ([`RepSource`]), checked against their recorded hash (a
//!   representative that changed, vanished or whose process exited is
//!   *lost*: nothing can join its group any more), and the waiting pages
//!   are placed in arrival order. Representatives read this way belong to
//!   groups that are known to repeat, so they enter the cache, evicting
//!   with CLOCK (second chance) when it is full.
//! - Pages with equal hashes but different bytes (a collision, or a lost
//!   representative) start a new group chained to the same hash.
//!
//! The cost of verification is thus one memcmp per duplicate (cached
//! group) or one batched re-read per duplicated content whose
//! representative fell out of the cache; distinct pages cost nothing
//! beyond the hash and one table probe.
//!
//! Group membership is recorded in a [`Census`], which attributes frames,
//! duplicate categories and savings afterwards.
//!
//! The hash → group table ([`HashIndex`]) is open addressing with linear
//! probing over 16-byte slots that hold the hash itself, so a lookup of a
//! new content costs one cache line. In a large scan almost every lookup
//! misses the cache; [`Grouper::prefetch`] loads the home slots of a whole
//! batch first, with independent loads the CPU overlaps, so that the
//! in-order placement that follows finds them in cache.

use crate::stats::census::{Census, GroupIx, RegionIx};
use pagesift_core::PageWords;
use std::collections::HashMap;

const NONE: u32 = u32::MAX;

/// Groups the group vectors are sized for up front.
const RESERVE_GROUPS: usize = 1 << 20;

/// New groups get a cache slot while fewer than this many slots are used
/// (4 MiB): enough to catch contents that repeat right away, without
/// copying the first thousands of distinct pages of a large scan. Later,
/// slots go to groups whose representative was read back (they repeat).
const CACHE_AT_CREATION: usize = 1024;

/// The content hash of a page: XXH3-64 (run-time dispatched to AVX2 where
/// the CPU has it). The scan's one page hash, sampled mode's too: twox-hash
/// took 87 ns per cached page on this machine against 131 ns for
/// xxhash-rust, whose SIMD is chosen at compile time (SSE2 for the default
/// target); both give the same value.
/// It is the daemon's page fingerprint, so the two agree on what "the
/// same content" means.
pub fn page_hash(page: &PageWords) -> u64 {
    pagesift_core::pipeline::hash::fingerprint(page)
}

/// Where a page lives: its region (census numbering) and address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Loc {
    /// Region index.
    pub region: RegionIx,
    /// Page-aligned address in the region's process.
    pub addr: u64,
}

/// Reads representatives again.
pub trait RepSource {
    /// Reads the pages at `locs` (sorted by region, then address) into
    /// `out[i]`, setting `ok[i]` for each page that could be read without
    /// faulting anything in (present when checked, process alive).
    fn read_reps(&mut self, locs: &[Loc], out: &mut [PageWords], ok: &mut [bool]);
}

/// Asks for huge pages behind a large, not yet touched buffer: its first
/// touches then fault once per 2 MiB, not once per 4 KiB (in a virtual
/// machine each first touch can also exit to the host). Only an
/// optimisation, so a refusal is ignored.
fn advise_huge<T>(buf: &[T]) {
    const WORTH: usize = 4 << 20;
    let len = std::mem::size_of_val(buf);
    if len >= WORTH {
        let _ = pagesift_linux::sys::advise_huge_pages(buf.as_ptr() as usize, len);
    }
}

/// Map from a content hash to the newest group with that hash (older
/// groups with the same hash are chained through [`GroupRec::next`]).
///
/// Open addressing, linear probing, at most half full. A slot is
/// `[hash, group + 1]`, 0 meaning empty, so a new table is zeroed memory
/// the kernel hands out lazily (`vec![[0; 2]; n]` allocates zeroed), and
/// the key needs no hashing of its own: it is already a uniform hash.
struct HashIndex {
    slots: Vec<[u64; 2]>,
    len: usize,
}

impl HashIndex {
    fn new() -> HashIndex {
        HashIndex {
            slots: vec![[0; 2]; 1024],
            len: 0,
        }
    }

    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The group stored for `hash`, or NONE.
    fn get(&self, hash: u64) -> GroupIx {
        let mask = self.mask();
        let mut i = hash as usize & mask;
        loop {
            let [h, g] = self.slots[i];
            if g == 0 {
                return NONE;
            }
            if h == hash {
                return (g - 1) as GroupIx;
            }
            i = (i + 1) & mask;
        }
    }

    /// Stores `g` for `hash`; returns the group it replaces, or NONE.
    fn insert(&mut self, hash: u64, g: GroupIx) -> GroupIx {
        if (self.len + 1) * 2 > self.slots.len() {
            self.grow(self.len + 1);
        }
        let mask = self.mask();
        let mut i = hash as usize & mask;
        loop {
            let [h, old] = self.slots[i];
            if old == 0 {
                self.slots[i] = [hash, g as u64 + 1];
                self.len += 1;
                return NONE;
            }
            if h == hash {
                self.slots[i][1] = g as u64 + 1;
                return (old - 1) as GroupIx;
            }
            i = (i + 1) & mask;
        }
    }

    /// Reads the home slot of each hash and returns a value that depends
    /// on all of them: independent loads the CPU issues in parallel, which
    /// bring the slots into cache before they are probed in order.
    fn touch(&self, hashes: &[u64]) -> u64 {
        let mask = self.mask();
        hashes
            .iter()
            .fold(0, |acc, &h| acc ^ self.slots[h as usize & mask][1])
    }

    /// Makes room for `len` entries without growing.
    fn grow(&mut self, len: usize) {
        let cap = (len * 2).next_power_of_two().max(1024);
        if cap <= self.slots.len() {
            return;
        }
        let old = std::mem::replace(&mut self.slots, vec![[0; 2]; cap]);
        advise_huge(&self.slots);
        let mask = cap - 1;
        for [h, g] in old.into_iter().filter(|s| s[1] != 0) {
            let mut i = h as usize & mask;
            while self.slots[i][1] != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = [h, g];
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct GroupRec {
    hash: u64,
    /// The representative's address and region (a `Loc`, split so that
    /// the record packs into 32 bytes).
    rep_addr: u64,
    rep_region: RegionIx,
    /// Next group with the same hash, or NONE.
    next: GroupIx,
    /// Cache slot, or NONE.
    slot: u32,
    /// The representative could not be read again: no page can be
    /// verified against it any more.
    lost: bool,
}

impl GroupRec {
    fn rep(&self) -> Loc {
        Loc {
            region: self.rep_region,
            addr: self.rep_addr,
        }
    }
}

/// Bounded representative contents, CLOCK eviction.
struct Cache {
    cap: usize,
    pages: Vec<PageWords>,
    owner: Vec<GroupIx>,
    referenced: Vec<bool>,
    hand: usize,
}

impl Cache {
    fn new(cap: usize) -> Cache {
        Cache {
            cap,
            // Reserved, not touched: memory is used as the cache fills.
            pages: Vec::with_capacity(cap),
            owner: Vec::with_capacity(cap),
            referenced: Vec::with_capacity(cap),
            hand: 0,
        }
    }

    fn has_free(&self) -> bool {
        self.pages.len() < self.cap
    }

    /// Stores `page` for group `g`; returns the slot, or NONE when the
    /// cache has no room (capacity 0). An evicted owner loses its slot.
    fn insert(&mut self, g: GroupIx, page: &PageWords, groups: &mut [GroupRec]) -> u32 {
        if self.cap == 0 {
            return NONE;
        }
        if self.has_free() {
            self.pages.push(*page);
            self.owner.push(g);
            self.referenced.push(false);
            return (self.pages.len() - 1) as u32;
        }
        // CLOCK: skip (and clear) recently used slots.
        loop {
            let h = self.hand;
            self.hand = (self.hand + 1) % self.cap;
            if self.referenced[h] {
                self.referenced[h] = false;
                continue;
            }
            groups[self.owner[h] as usize].slot = NONE;
            self.pages[h] = *page;
            self.owner[h] = g;
            return h as u32;
        }
    }
}

/// One page waiting for its candidates' representatives.
#[derive(Clone, Copy, Debug)]
struct Pending {
    hash: u64,
    loc: Loc,
}

/// Counters of the grouping work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupStats {
    /// Pages placed (joined or started a group).
    pub pages: u64,
    /// Pages that joined a group after a byte comparison.
    pub verified_joins: u64,
    /// Pages whose hash matched a group but whose bytes did not (hash
    /// collisions, or representatives that changed or vanished).
    pub mismatches: u64,
    /// Representatives read again for verification.
    pub reps_read: u64,
    /// Representatives that could not be read again (changed, unmapped,
    /// process exited).
    pub reps_lost: u64,
    /// Pending flushes.
    pub flushes: u64,
}

/// A placed page, kept when the caller asked for records (for a rescan).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageRecord {
    /// Where it is.
    pub loc: Loc,
    /// Its hash at the first read.
    pub hash: u64,
    /// Its group.
    pub group: GroupIx,
}

/// Content groups of an exact scan.
pub struct Grouper {
    table: HashIndex,
    groups: Vec<GroupRec>,
    census: Census,
    cache: Cache,
    pending: Vec<Pending>,
    pending_pages: Vec<PageWords>,
    pending_cap: usize,
    records: Option<Vec<PageRecord>>,
    stats: GroupStats,
    hash: fn(&PageWords) -> u64,
}

impl Grouper {
    /// A grouper whose cache holds up to `cache_pages` contents and whose
    /// pending buffer holds up to `pending_pages` pages (at least 1).
    /// `records`: keep a [`PageRecord`] per placed page.
    pub fn new(cache_pages: usize, pending_pages: usize, records: bool) -> Grouper {
        let mut groups = Vec::with_capacity(RESERVE_GROUPS);
        advise_huge(groups.spare_capacity_mut());
        Grouper {
            // The hash table grows by doubling: its slots are touched at
            // random, so reserving room up front would fault in all of it
            // even for a small scan. The group vectors fill sequentially:
            // room for a million contents (4 GiB of distinct pages) up
            // front costs only address space, and saves copying them as
            // they grow.
            table: HashIndex::new(),
            groups,
            census: Census::with_capacity(RESERVE_GROUPS),
            cache: Cache::new(cache_pages),
            pending: Vec::new(),
            pending_pages: Vec::new(),
            pending_cap: pending_pages.max(1),
            records: records.then(Vec::new),
            stats: GroupStats::default(),
            hash: page_hash,
        }
    }

    /// The same with another hash function (tests use weak ones to force
    /// collisions).
    #[cfg(test)]
    pub fn with_hash(mut self, hash: fn(&PageWords) -> u64) -> Grouper {
        self.hash = hash;
        self
    }

    /// The census, for adding regions and dropping processes.
    pub fn census_mut(&mut self) -> &mut Census {
        &mut self.census
    }

    /// Makes room in the hash table for `pages` more contents, so that a
    /// large region does not grow it by doubling (each doubling rehashes
    /// and faults in a new table). Capped at [`RESERVE_GROUPS`]; the
    /// table's memory is zeroed lazily by the kernel, page by page as it
    /// is touched.
    pub fn reserve(&mut self, pages: u64) {
        let more = pages.min(RESERVE_GROUPS as u64) as usize;
        self.table.grow(self.table.len + more);
    }

    /// Brings the table slots of `hashes` (a batch about to be placed)
    /// into the cache; see the module doc.
    pub fn prefetch(&self, hashes: &[u64]) {
        std::hint::black_box(self.table.touch(hashes));
    }

    /// The hash this grouper uses for `page`.
    pub fn hash_of(&self, page: &PageWords) -> u64 {
        (self.hash)(page)
    }

    /// Hashes and places one page.
    #[cfg(test)]
    pub fn add(&mut self, page: &PageWords, loc: Loc, src: &mut dyn RepSource) {
        self.add_hashed(page, self.hash_of(page), loc, src);
    }

    /// Places one page whose hash ([`hash_of`](Self::hash_of)) is `hash`.
    pub fn add_hashed(&mut self, page: &PageWords, hash: u64, loc: Loc, src: &mut dyn RepSource) {
        // One probe for a new content (the common case in a large scan).
        let mut g = self.table.get(hash);
        if g == NONE {
            self.table.insert(hash, self.groups.len() as GroupIx);
            let g = self.push_group(hash, loc, NONE);
            self.cache_if_room(g, page);
            return;
        }
        let mut unverified = false;
        while g != NONE {
            let rec = self.groups[g as usize];
            if rec.slot != NONE {
                if self.cache.pages[rec.slot as usize] == *page {
                    self.cache.referenced[rec.slot as usize] = true;
                    self.stats.verified_joins += 1;
                    self.join(g, loc, hash);
                    return;
                }
            } else if !rec.lost {
                unverified = true;
            }
            g = rec.next;
        }
        if unverified {
            self.pending.push(Pending { hash, loc });
            self.pending_pages.push(*page);
            if self.pending.len() >= self.pending_cap {
                self.flush(src);
            }
            return;
        }
        self.stats.mismatches += 1;
        let g = self.create(hash, loc);
        self.cache_if_room(g, page);
    }

    /// Caches a new group's content while the cache is nearly empty.
    fn cache_if_room(&mut self, g: GroupIx, page: &PageWords) {
        if self.cache.pages.len() < CACHE_AT_CREATION.min(self.cache.cap) {
            let slot = self.cache.insert(g, page, &mut self.groups);
            self.groups[g as usize].slot = slot;
        }
    }

    fn join(&mut self, g: GroupIx, loc: Loc, hash: u64) {
        self.census.add_frame(g, loc.region);
        self.count_page(g, loc, hash);
    }

    /// Counts a page placed in group `g`, and records it when asked to.
    fn count_page(&mut self, g: GroupIx, loc: Loc, hash: u64) {
        self.stats.pages += 1;
        if let Some(r) = &mut self.records {
            r.push(PageRecord {
                loc,
                hash,
                group: g,
            });
        }
    }

    /// A new group with representative `loc`, chained first for `hash`.
    fn create(&mut self, hash: u64, loc: Loc) -> GroupIx {
        let next = self.table.insert(hash, self.groups.len() as GroupIx);
        self.push_group(hash, loc, next)
    }

    /// Appends a group (the table already points at it).
    fn push_group(&mut self, hash: u64, loc: Loc, next: GroupIx) -> GroupIx {
        let g = self.census.new_group(loc.region);
        debug_assert_eq!(g as usize, self.groups.len());
        self.groups.push(GroupRec {
            hash,
            rep_addr: loc.addr,
            rep_region: loc.region,
            next,
            slot: NONE,
            lost: false,
        });
        self.count_page(g, loc, hash);
        g
    }

    /// Verifies and places every pending page (see the module doc).
    pub fn flush(&mut self, src: &mut dyn RepSource) {
        if self.pending.is_empty() {
            return;
        }
        self.stats.flushes += 1;
        // Groups whose representative must be read: uncached, not lost,
        // on the chain of a pending page's hash.
        let mut need: Vec<GroupIx> = Vec::new();
        for p in &self.pending {
            let mut g = self.table.get(p.hash);
            while g != NONE {
                let rec = &self.groups[g as usize];
                if rec.slot == NONE && !rec.lost {
                    need.push(g);
                }
                g = rec.next;
            }
        }
        need.sort_unstable_by_key(|&g| (self.groups[g as usize].rep(), g));
        need.dedup();
        let locs: Vec<Loc> = need
            .iter()
            .map(|&g| self.groups[g as usize].rep())
            .collect();
        // Contents available during this flush: group → index in `held`.
        let mut held: Vec<PageWords> = vec![[0u32; pagesift_core::WORDS_PER_PAGE]; locs.len()];
        let mut ok = vec![false; locs.len()];
        src.read_reps(&locs, &mut held, &mut ok);
        let mut held_of: HashMap<GroupIx, usize> = HashMap::with_capacity(need.len());
        for (i, &g) in need.iter().enumerate() {
            if ok[i] {
                self.stats.reps_read += 1;
            }
            // The representative must still hold the content it was
            // grouped by.
            if ok[i] && (self.hash)(&held[i]) == self.groups[g as usize].hash {
                held_of.insert(g, i);
            } else {
                self.groups[g as usize].lost = true;
                self.stats.reps_lost += 1;
            }
        }
        let pending = std::mem::take(&mut self.pending);
        let pages = std::mem::take(&mut self.pending_pages);
        let mut new_groups: Vec<GroupIx> = Vec::new();
        for (p, page) in pending.iter().zip(&pages) {
            let mut g = self.table.get(p.hash);
            let mut placed = false;
            while g != NONE {
                let rec = self.groups[g as usize];
                let content = if rec.slot != NONE {
                    Some(&self.cache.pages[rec.slot as usize])
                } else {
                    held_of.get(&g).map(|&i| &held[i])
                };
                if content.is_some_and(|c| c == page) {
                    if rec.slot != NONE {
                        self.cache.referenced[rec.slot as usize] = true;
                    }
                    self.stats.verified_joins += 1;
                    self.join(g, p.loc, p.hash);
                    placed = true;
                    break;
                }
                g = rec.next;
            }
            if !placed {
                self.stats.mismatches += 1;
                let g = self.create(p.hash, p.loc);
                held_of.insert(g, held.len());
                held.push(*page);
                new_groups.push(g);
            }
        }
        // Representatives that were read back belong to groups that repeat:
        // cache them (evicting if needed). Groups born in this flush get a
        // slot only if one is free.
        for (&g, &i) in &held_of {
            let is_new = i >= locs.len();
            let room = self.cache.pages.len() < CACHE_AT_CREATION.min(self.cache.cap);
            if self.groups[g as usize].slot != NONE || (is_new && !room) {
                continue;
            }
            let slot = self.cache.insert(g, &held[i], &mut self.groups);
            self.groups[g as usize].slot = slot;
        }
        // Keep the buffers' allocations for the next round.
        self.pending = pending;
        self.pending.clear();
        self.pending_pages = pages;
        self.pending_pages.clear();
    }

    /// Flushes and returns the census, the records (if kept) and the
    /// counters.
    pub fn finish(mut self, src: &mut dyn RepSource) -> (Census, Vec<PageRecord>, GroupStats) {
        self.flush(src);
        (self.census, self.records.unwrap_or_default(), self.stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Pages in memory, by location; `lost` ones cannot be read back.
    #[derive(Default)]
    struct Mem {
        pages: BTreeMap<Loc, PageWords>,
        unreadable: Vec<Loc>,
        reads: u64,
    }

    impl RepSource for Mem {
        fn read_reps(&mut self, locs: &[Loc], out: &mut [PageWords], ok: &mut [bool]) {
            assert!(locs.windows(2).all(|w| w[0] <= w[1]), "sorted");
            for (i, l) in locs.iter().enumerate() {
                self.reads += 1;
                match self.pages.get(l) {
                    Some(p) if !self.unreadable.contains(l) => {
                        out[i] = *p;
                        ok[i] = true;
                    }
                    _ => ok[i] = false,
                }
            }
        }
    }

    fn page(content: u32) -> PageWords {
        let mut p = [0u32; 1024];
        p[0] = content;
        p[1023] = content.wrapping_mul(2654435761);
        p
    }

    /// A hash that collides a lot: only the low 2 bits of the content.
    fn weak_hash(p: &PageWords) -> u64 {
        (p[0] & 3) as u64
    }

    fn id_hash(p: &PageWords) -> u64 {
        p[0] as u64
    }

    fn run(
        contents: &[(u32, u32)],
        cache: usize,
        pending: usize,
        hash: fn(&PageWords) -> u64,
    ) -> (Census, GroupStats, Mem) {
        let mut mem = Mem::default();
        let mut g = Grouper::new(cache, pending, false).with_hash(hash);
        let regions = contents.iter().map(|&(r, _)| r).max().map_or(0, |m| m + 1);
        for r in 0..regions {
            g.census_mut().add_region(r);
        }
        for (i, &(r, c)) in contents.iter().enumerate() {
            let loc = Loc {
                region: r,
                addr: i as u64 * 4096,
            };
            let p = page(c);
            mem.pages.insert(loc, p);
            g.add(&p, loc, &mut mem);
        }
        let (census, _, stats) = g.finish(&mut mem);
        (census, stats, mem)
    }

    fn distinct(contents: &[(u32, u32)]) -> u64 {
        let mut v: Vec<u32> = contents.iter().map(|&(_, c)| c).collect();
        v.sort_unstable();
        v.dedup();
        v.len() as u64
    }

    #[test]
    fn group_records_are_32_bytes() {
        assert_eq!(std::mem::size_of::<GroupRec>(), 32);
    }

    #[test]
    fn cached_groups_join_by_memcmp_without_rereads() {
        let contents: Vec<(u32, u32)> = (0..100).map(|i| (0, i % 3)).collect();
        let (c, s, mem) = run(&contents, 16, 8, id_hash);
        assert_eq!(c.distinct(), 3);
        assert_eq!(s.verified_joins, 97);
        assert_eq!(mem.reads, 0);
        assert_eq!(c.attribute()[0].saving, 97);
    }

    #[test]
    fn without_a_cache_representatives_are_read_back_once_per_flush() {
        let contents: Vec<(u32, u32)> = (0..100).map(|i| (0, i % 3)).collect();
        let (c, s, mem) = run(&contents, 0, 1000, id_hash);
        assert_eq!(c.distinct(), 3);
        assert_eq!(c.attribute()[0].saving, 97);
        // One flush at the end: the three representatives, once each.
        assert_eq!(mem.reads, 3);
        assert_eq!(s.reps_read, 3);
    }

    #[test]
    fn collisions_never_join_different_bytes() {
        // Contents 0, 4, 8 share a weak hash but differ.
        let contents = [(0, 0), (0, 4), (0, 8), (0, 4), (0, 0)];
        for cache in [0, 1, 8] {
            let (c, s, _) = run(&contents, cache, 2, weak_hash);
            assert_eq!(c.distinct(), 3, "cache {cache}");
            assert_eq!(c.attribute()[0].saving, 2, "cache {cache}");
            assert!(s.mismatches >= 2, "cache {cache}: {s:?}");
        }
    }

    #[test]
    fn a_lost_representative_takes_no_new_members() {
        let mut mem = Mem::default();
        let mut g = Grouper::new(0, 100, false).with_hash(id_hash);
        g.census_mut().add_region(0);
        let a = Loc { region: 0, addr: 0 };
        let b = Loc {
            region: 0,
            addr: 4096,
        };
        let c = Loc {
            region: 0,
            addr: 8192,
        };
        for l in [a, b, c] {
            mem.pages.insert(l, page(5));
        }
        // The representative changes before it is read back.
        g.add(&page(5), a, &mut mem);
        mem.pages.insert(a, page(6));
        g.add(&page(5), b, &mut mem);
        g.add(&page(5), c, &mut mem);
        let (census, _, s) = g.finish(&mut mem);
        assert_eq!(s.reps_lost, 1);
        // b starts a new group (verified against nothing), c joins it.
        assert_eq!(census.groups(), 2);
        assert_eq!(census.attribute()[0].saving, 1);
    }

    proptest! {
        /// The open-addressing index behaves like a map from hash to the
        /// newest group, through growth and with colliding home slots.
        #[test]
        fn hash_index_is_a_map(
            ops in prop::collection::vec((0u64..5000, any::<bool>()), 0..3000),
            reserve in 0usize..3000,
        ) {
            let mut ix = HashIndex::new();
            ix.grow(reserve);
            let mut model: HashMap<u64, GroupIx> = HashMap::new();
            for (n, &(key, insert)) in ops.iter().enumerate() {
                // Keys that share low bits collide in any table size.
                let hash = (key << 20) | (key % 7);
                if insert {
                    let old = model.insert(hash, n as GroupIx).unwrap_or(NONE);
                    prop_assert_eq!(ix.insert(hash, n as GroupIx), old);
                } else {
                    prop_assert_eq!(ix.get(hash), model.get(&hash).copied().unwrap_or(NONE));
                }
            }
            prop_assert_eq!(ix.len, model.len());
            prop_assert!(ix.len * 2 <= ix.slots.len());
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        /// Whatever the cache size, the pending size and the hash quality,
        /// groups are exactly the distinct contents.
        #[test]
        fn groups_are_exactly_the_contents(
            contents in prop::collection::vec((0u32..3, 0u32..20), 0..200),
            cache in 0usize..6, pending in 1usize..10, weak: bool,
        ) {
            let mut contents = contents;
            contents.sort_by_key(|&(r, _)| r);
            let h = if weak { weak_hash } else { id_hash };
            let (c, s, _) = run(&contents, cache, pending, h);
            prop_assert_eq!(c.distinct(), distinct(&contents));
            let total: u64 = c.attribute().iter().map(|a| a.saving).sum();
            prop_assert_eq!(total, contents.len() as u64 - distinct(&contents));
            prop_assert_eq!(s.pages, contents.len() as u64);
            prop_assert_eq!(s.reps_lost, 0);
        }
    }
}

#[cfg(test)]
mod timing {
    use super::*;

    struct NoReads;
    impl RepSource for NoReads {
        fn read_reps(&mut self, _: &[Loc], _: &mut [PageWords], ok: &mut [bool]) {
            ok.fill(false);
        }
    }

    /// ns per page to place 1 M distinct pages (hashes given), as the exact
    /// scan does for a random workload. Run with `--ignored --nocapture`.
    #[test]
    #[ignore = "timing, not a check"]
    fn time_distinct_pages() {
        let n = 1usize << 20;
        let page = [0u32; 1024];
        let mut best = f64::MAX;
        // Thread CPU time: the machine may be shared.
        let cpu = || pagesift_linux::host::thread_cpu_ns() as f64;
        for _ in 0..5 {
            let mut g = Grouper::new(8192, 4096, false);
            g.census_mut().add_region(0);
            g.reserve(n as u64);
            let t = cpu();
            let mut h = 0x9e37_79b9_7f4a_7c15u64;
            let mut hashes = Vec::with_capacity(512);
            for chunk in 0..n / 512 {
                hashes.clear();
                for _ in 0..512 {
                    // splitmix64: uniform like XXH3's output.
                    h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = h;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    hashes.push(z ^ (z >> 31));
                }
                let locs: Vec<Loc> = (0..512)
                    .map(|i| Loc {
                        region: 0,
                        addr: ((chunk * 512 + i) * 4096) as u64,
                    })
                    .collect();
                g.prefetch(&hashes);
                for (hash, loc) in hashes.iter().zip(&locs) {
                    g.add_hashed(&page, *hash, *loc, &mut NoReads);
                }
            }
            best = best.min((cpu() - t) / n as f64);
            assert_eq!(g.finish(&mut NoReads).2.pages, n as u64);
        }
        println!("GROUP distinct: {best:.1} ns/page of thread CPU time");
    }
}
