//! Cache scrubbing (Singleton): drops the host's page-cache copies of disk
//! blocks that an eligible guest already holds in its RAM.
//!
//! ## One scrub, before the code
//!
//! For every eligible QEMU process (the daemon's eligibility, plus a `comm`
//! prefix from `scrub.comm_prefixes`):
//!
//! 1. **Images** ([`pagesift_linux::disk_images`]): the regular files it has
//!    open read-write (unless `scrub.discover_images = false`) and the
//!    files named in `scrub.images` that it has open. `O_DIRECT` files are
//!    skipped (no page cache).
//! 2. **Index the guest** ([`pagesift_linux::guest_ram`],
//!    [`pagesift_core::pipeline::scrub::GuestIndex`]): every present page of its
//!    guest RAM is hashed (xxh3-64) into the hash table, which also counts
//!    the guest's evictions (§3.3). While the I/O hints flow, only the
//!    first scrub of a guest and every [`FULL_INDEX_EVERY`]-th one read
//!    all of its RAM; the others re-read just the guest pages the hints
//!    named since the last scrub (QEMU's reads into guest RAM and writes
//!    from it: the only pages whose content can newly match the image's
//!    cache), see [`Scrubber::note_io`].
//! 3. **Match the host cache** ([`pagesift_linux::page_cache`]): the
//!    image's cached pages (`mincore`) are read without I/O and hashed; a
//!    hash found in the index is compared byte for byte with the guest page
//!    it names (read again just now). Only an equal page is `Verified`.
//!    A scrub that re-indexed only hinted pages also reads only the cached
//!    pages that may have changed their verdict ([`CacheMemo`]): those
//!    cached since the last scrub, those the last one matched but kept
//!    (dirty, or in a folio it could not drop whole), and those whose
//!    content a re-indexed guest page now has. A page the guest does not
//!    hold stays so until the guest reads it (a hint) or copies it within
//!    its own RAM (seen at the next full pass). In the bench's page-cache
//!    experiment (2026-11-27) each 5 s scrub found 100-125 k cached pages
//!    of which it dropped 45-60 k, at 5-8 µs a cached page: the pages kept
//!    were read and hashed again at every scrub for nothing.
//! 4. **Drop runs** ([`pagesift_core::pipeline::scrub::plan_runs`]): each
//!    run of consecutive verified pages is `DONTNEED`ed as it is, after a
//!    `cachestat` of the run right before; the kernel evicts only the
//!    folios lying wholly inside it, which hold verified pages only.
//! 5. **Folios, for a run that was refused** ([`pagesift_linux::folio`],
//!    [`pagesift_core::pipeline::scrub::plan_drops`]): a run holding a
//!    dirty or writeback page is left alone in step 4; its pages' folios
//!    and their dirty/writeback bits are read, and its whole clean folios
//!    are dropped (each range checked again right before).
//!
//! When to scrub is [`FrequencyControl`] (Algorithm 2): the daemon calls
//! [`Scrubber::tick`] every wake-up with the eligible processes; it scrubs
//! every guest when the timer or memory pressure says so (on the host, or
//! inside a memory cgroup limit a guest lives under,
//! [`pagesift_linux::memcg`]), then feeds the pages dropped and cached back
//! to the period.
//!
//! Invariants: nothing is written to a guest or an image; a page is
//! dropped only after a byte-exact comparison with a present guest page
//! made in this scrub; a guest's failure (it exited, access denied) skips
//! that guest and is reported, never stops the daemon.

use crate::config::ScrubSection;
use pagesift_core::pipeline::scrub::{
    CachedPage, DropRange, FrequencyControl, GuestIndex, Held, MemoryStats, Trigger, plan_drops,
    plan_runs,
};
use pagesift_core::{Nanos, PAGE_SIZE, PageBuffer};
use pagesift_linux::LinuxError;
use pagesift_linux::disk_images::{self, DiskImage};
use pagesift_linux::folio::FolioFinder;
use pagesift_linux::guest_ram::GuestRam;
use pagesift_linux::page_cache::{DropOutcome, ImageCache};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use tracing::{debug, info, warn};

/// Host-cache pages read per `preadv2` while matching.
const READ_BATCH_PAGES: usize = 256;

/// With I/O hints, one scrub in this many indexes all of a guest's RAM;
/// the others only the pages hinted since the last scrub. The full ones
/// catch content the hints cannot see (the guest copying data within its
/// own RAM); until then such a page's host copy is only kept, never
/// wrongly dropped.
pub const FULL_INDEX_EVERY: u64 = 8;

/// What one image looked like at its last scrub.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageStatus {
    /// The QEMU process.
    pub pid: u32,
    /// The image file.
    pub path: String,
    /// Its pages in the host page cache after the last scrub (cachestat).
    pub cached_pages: u64,
    /// Cached pages the last scrub found.
    pub cached_before: u64,
    /// Of those, verified byte for byte against the guest.
    pub held_pages: u64,
    /// Pages dropped from it since the daemon started.
    pub dropped_pages: u64,
}

/// The scrubber in `pagesift status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ScrubStatus {
    /// Scrubs run.
    pub scrubs: u64,
    /// Pages dropped, all images.
    pub dropped_pages: u64,
    /// Ranges left alone because they held dirty or writeback pages.
    pub busy_ranges: u64,
    /// CPU time spent scrubbing.
    pub cpu_seconds: f64,
    /// The current period `t`, seconds.
    pub period_s: f64,
    /// Why the last scrub ran (`timer`, `cache_high`, `free_low`).
    pub last_trigger: String,
    /// Guest page replacements seen (Singleton §3.3's eviction signal).
    pub guest_evictions: u64,
    /// Guest pages read to index guest RAM, all scrubs.
    #[serde(default)]
    pub indexed_pages: u64,
    /// Index passes over a guest's whole RAM; the others re-read only
    /// hinted pages.
    #[serde(default)]
    pub full_indexes: u64,
    /// Host-cache pages read and matched, all scrubs (between full passes
    /// only those that may have changed their verdict, see [`CacheMemo`]).
    #[serde(default)]
    pub examined_pages: u64,
    /// Per image.
    pub images: Vec<ImageStatus>,
    /// The last error per guest, if any.
    pub errors: Vec<String>,
}

/// The result of scrubbing one image once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ImagePass {
    /// Cached pages found.
    pub cached: u64,
    /// Of which read and matched (all of them in a full pass).
    pub examined: u64,
    /// Of which the guest holds (verified).
    pub held: u64,
    /// Pages whose hash matched but whose bytes did not (or whose guest
    /// page was gone).
    pub hash_only: u64,
    /// Pages dropped (cachestat before and after each range).
    pub dropped: u64,
    /// Ranges left alone: dirty or writeback.
    pub busy: u64,
    /// The ranges `DONTNEED`ed (whole folios, file order).
    pub dropped_ranges: Vec<DropRange>,
}

/// One guest: its RAM reader, its index, its images.
#[derive(Debug)]
struct Guest {
    ram: GuestRam,
    index: GuestIndex,
    images: BTreeMap<(u64, u64), (DiskImage, ImageStatus)>,
    /// Per image (device, inode): what the last scrubs learnt of its
    /// cached pages.
    memos: BTreeMap<(u64, u64), CacheMemo>,
    /// Scrubs since its last full index pass (`None`: none yet).
    since_full: Option<u64>,
    /// Guest pages the I/O hints named since the last scrub: (first
    /// address, pages).
    hinted: Vec<(u64, u64)>,
    /// Their sum.
    hinted_pages: u64,
    /// More were named than a full pass reads: do one.
    hinted_overflow: bool,
}

/// What the scrubs learnt of one image's cached pages: each page that was
/// examined and kept, with its content key and verdict then (module header,
/// step 3). Invariant: only pages the last `mincore` found cached, none
/// that a scrub dropped since it was examined.
#[derive(Debug, Default)]
struct CacheMemo {
    kept: HashMap<u64, (u64, Held)>,
}

impl CacheMemo {
    /// Whether page `index` must be read and matched again when the guest
    /// pages re-indexed since the last scrub have the keys `fresh`.
    fn examine(&self, index: u64, fresh: &HashSet<u64>) -> bool {
        match self.kept.get(&index) {
            None => true,
            Some(&(key, held)) => held != Held::No || fresh.contains(&key),
        }
    }
}

/// The orchestration (see the module header).
#[derive(Debug)]
pub struct Scrubber {
    config: ScrubSection,
    named: Vec<(u64, u64)>,
    control: FrequencyControl,
    guests: BTreeMap<u32, Guest>,
    folios: Option<FolioFinder>,
    status: ScrubStatus,
    /// Whether the I/O hints flow (see [`Scrubber::note_io`]).
    io_hints: bool,
    pressure: Pressure,
}

impl Scrubber {
    /// A scrubber for a validated `[scrub]` section, starting at `now`.
    pub fn new(config: ScrubSection, now: Nanos) -> Scrubber {
        let named = config
            .images
            .iter()
            .filter_map(|p| match disk_images::identity(p) {
                Ok(id) => Some(id),
                Err(e) => {
                    warn!(path = %p.display(), error = %e, "scrub.images: cannot stat; ignored");
                    None
                }
            })
            .collect();
        Scrubber {
            control: FrequencyControl::new(config.frequency(), now),
            named,
            config,
            guests: BTreeMap::new(),
            folios: None,
            status: ScrubStatus::default(),
            io_hints: false,
            pressure: Pressure::default(),
        }
    }

    /// Says whether the I/O hints flow. Without them every scrub indexes
    /// all of each guest's RAM.
    pub fn set_io_hints(&mut self, on: bool) {
        if on != self.io_hints {
            self.io_hints = on;
            for g in self.guests.values_mut() {
                g.since_full = None; // hints missed or about to be: start over
                g.hinted.clear();
                g.hinted_pages = 0;
            }
        }
    }

    /// An I/O hint: process `pid` read file data into (or wrote it from)
    /// `pages` pages at `start`. Kept for the guest's next scrub, which
    /// re-indexes just these pages (module header, step 2).
    pub fn note_io(&mut self, pid: u32, start: u64, pages: u64) {
        let Some(g) = self.guests.get_mut(&pid) else {
            return; // not a guest yet: its first scrub reads all of it
        };
        if g.hinted_overflow {
            return;
        }
        g.hinted.push((start, pages));
        g.hinted_pages += pages;
        if g.hinted_pages > g.ram.pages() {
            g.hinted.clear();
            g.hinted_pages = 0;
            g.hinted_overflow = true;
        }
    }

    /// The status snapshot.
    pub fn status(&self) -> ScrubStatus {
        let mut s = self.status.clone();
        s.period_s = self.control.period() as f64 / 1e9;
        s
    }

    /// Whether `comm` is a process this scrubber looks at.
    pub fn wants(&self, comm: &str) -> bool {
        self.config
            .comm_prefixes
            .iter()
            .any(|p| comm.starts_with(p.as_str()))
    }

    /// Called every wake-up with the eligible processes (pid, comm):
    /// scrubs them all when a scrub is due. Returns the trigger if it did.
    pub fn tick(&mut self, now: Nanos, eligible: &[(u32, String)]) -> Option<Trigger> {
        let pids: Vec<u32> = eligible
            .iter()
            .filter(|(_, c)| self.wants(c))
            .map(|&(p, _)| p)
            .collect();
        let trigger = self.control.due(now, self.pressure.domains(now, &pids))?;
        let (cpu0, examined0) = (self.status.cpu_seconds, self.status.examined_pages);
        let (dropped, cached) = self.scrub_all(&pids);
        let period = self.control.scrubbed(now, trigger, dropped, cached);
        self.status.last_trigger = trigger.name().into();
        info!(
            trigger = trigger.name(),
            guests = pids.len(),
            cached,
            examined = self.status.examined_pages - examined0,
            dropped,
            cpu_ms = (self.status.cpu_seconds - cpu0) * 1e3,
            next_s = period as f64 / 1e9,
            "scrubbed the host page cache"
        );
        Some(trigger)
    }

    /// Scrubs the guests `pids` now, whatever the timer says; returns
    /// (pages dropped, cached pages found) over all their images.
    pub fn scrub_all(&mut self, pids: &[u32]) -> (u64, u64) {
        let cpu0 = pagesift_linux::host::thread_cpu_ns();
        self.guests.retain(|pid, _| pids.contains(pid));
        let mut errors = Vec::new();
        let (mut dropped, mut cached) = (0, 0);
        for &pid in pids {
            match self.scrub_guest(pid) {
                Ok(passes) => {
                    for (_, p) in passes {
                        dropped += p.dropped;
                        cached += p.cached;
                        self.status.busy_ranges += p.busy;
                    }
                }
                Err(e) => {
                    self.guests.remove(&pid);
                    debug!(pid, error = %e, "scrub skipped a guest");
                    errors.push(format!("pid {pid}: {e}"));
                }
            }
        }
        self.status.scrubs += 1;
        self.status.dropped_pages += dropped;
        self.status.errors = errors;
        self.status.images = self
            .guests
            .values()
            .flat_map(|g| g.images.values().map(|(_, s)| s.clone()))
            .collect();
        self.status.guest_evictions = self.guests.values().map(|g| g.index.evictions()).sum();
        let cpu = pagesift_linux::host::thread_cpu_ns().saturating_sub(cpu0);
        self.status.cpu_seconds += cpu as f64 / 1e9;
        (dropped, cached)
    }

    /// One guest: index its RAM, then scrub each of its images. Returns
    /// each image's path and pass.
    pub fn scrub_guest(&mut self, pid: u32) -> Result<Vec<(PathBuf, ImagePass)>, LinuxError> {
        let found = disk_images::disk_images_with(pid, self.config.discover_images, &self.named)?;
        let found: Vec<DiskImage> = found.into_iter().filter(|i| !i.direct).collect();
        if found.is_empty() {
            self.guests.remove(&pid);
            return Ok(Vec::new());
        }
        let min_bytes = self.config.guest_ram_min_mib << 20;
        if let std::collections::btree_map::Entry::Vacant(slot) = self.guests.entry(pid) {
            slot.insert(Guest {
                ram: GuestRam::open(pid, min_bytes)?,
                index: GuestIndex::new(),
                images: BTreeMap::new(),
                memos: BTreeMap::new(),
                since_full: None,
                hinted: Vec::new(),
                hinted_pages: 0,
                hinted_overflow: false,
            });
        }
        if self.folios.is_none() {
            self.folios = Some(FolioFinder::open()?);
        }
        let guest = self.guests.get_mut(&pid).expect("inserted above");
        guest.ram.refresh()?;
        guest
            .images
            .retain(|id, _| found.iter().any(|i| (i.dev, i.ino) == *id));
        guest
            .memos
            .retain(|id, _| found.iter().any(|i| (i.dev, i.ino) == *id));
        let full = !self.io_hints
            || guest.hinted_overflow
            || guest.since_full.is_none_or(|n| n + 1 >= FULL_INDEX_EVERY);
        // The keys of the guest pages re-indexed (a partial pass), which
        // the host pages kept so far are matched against; `None`: a full
        // pass, every cached page is matched.
        let (read, fresh) = if full {
            guest.since_full = Some(0);
            self.status.full_indexes += 1;
            (index_guest(guest)?, None)
        } else {
            guest.since_full = guest.since_full.map(|n| n + 1);
            let (read, keys) = update_index(guest)?;
            (read, Some(keys))
        };
        guest.hinted.clear();
        guest.hinted_pages = 0;
        guest.hinted_overflow = false;
        self.status.indexed_pages += read;
        let mut passes = Vec::new();
        for image in found {
            let id = (image.dev, image.ino);
            let cache = ImageCache::open(&PathBuf::from(format!("/proc/{pid}/fd/{}", image.fd)))?;
            let folios = self.folios.as_mut().expect("opened above");
            let memo = guest.memos.entry(id).or_default();
            let pass = scrub_image(
                &cache,
                &mut guest.ram,
                &guest.index,
                folios,
                memo,
                fresh.as_ref(),
            )?;
            self.status.examined_pages += pass.examined;
            let after = cache.stat(0, 0).map(|s| s.cache).unwrap_or(0);
            if !self.config.host_readahead && !guest.images.contains_key(&id) {
                pagesift_linux::readahead::set_random(pid, image.fd, true)?;
            }
            let entry = guest.images.entry(id).or_insert_with(|| {
                (
                    image.clone(),
                    ImageStatus {
                        pid,
                        path: image.path.display().to_string(),
                        ..ImageStatus::default()
                    },
                )
            });
            entry.1.cached_pages = after;
            entry.1.cached_before = pass.cached;
            entry.1.held_pages = pass.held;
            entry.1.dropped_pages += pass.dropped;
            passes.push((image.path.clone(), pass));
        }
        Ok(passes)
    }
}

impl Drop for Scrubber {
    /// Gives the guests their read-ahead back (`scrub.host_readahead =
    /// false` turned it off).
    fn drop(&mut self) {
        if self.config.host_readahead {
            return;
        }
        for (pid, g) in &self.guests {
            for (image, _) in g.images.values() {
                if let Err(e) = pagesift_linux::readahead::set_random(*pid, image.fd, false) {
                    debug!(pid, fd = image.fd, error = %e, "could not restore read-ahead");
                }
            }
        }
    }
}

/// How often the memory the guests compete for is read again. Reading it
/// at every wake-up (meminfo, each guest's `/proc/PID/cgroup` and the
/// mount table to find its memory cgroup, then the cgroup's files) was
/// about 12 % of the daemon's CPU in `pagesift bench --quick --only
/// page-cache` (perf, 2026-11-27); pressure that builds within half a
/// second is met that much later.
const PRESSURE_EVERY: Nanos = 500_000_000;
/// How long a guest's memory cgroup directory is trusted before it is
/// looked up again (a guest moved to another cgroup is seen that late).
const CGROUP_DIR_FRESH: Nanos = 10_000_000_000;

/// The memory the guests compete for (see
/// [`pagesift_core::pipeline::scrub::FrequencyControl::due`]): the host's,
/// and each distinct memory cgroup limit they live under, read at most
/// every [`PRESSURE_EVERY`].
#[derive(Debug, Default)]
struct Pressure {
    read_at: Option<Nanos>,
    domains: Vec<MemoryStats>,
    /// Each guest's memory cgroup directory (`None`: none, or it could not
    /// be read), and when it was looked up.
    dirs: BTreeMap<u32, (Option<PathBuf>, Nanos)>,
}

impl Pressure {
    /// The domains of the guests `pids` as of at most [`PRESSURE_EVERY`]
    /// ago. A domain that cannot be read is left out (the guest may have
    /// just exited).
    fn domains(&mut self, now: Nanos, pids: &[u32]) -> &[MemoryStats] {
        if self.read_at.is_some_and(|t| now < t + PRESSURE_EVERY) {
            return &self.domains;
        }
        self.dirs
            .retain(|pid, (_, at)| pids.contains(pid) && now < *at + CGROUP_DIR_FRESH);
        let mut domains: Vec<MemoryStats> =
            pagesift_linux::host::memory_kib().into_iter().collect();
        let mut seen = Vec::new();
        for &pid in pids {
            let dir = self
                .dirs
                .entry(pid)
                .or_insert_with(|| {
                    let dir = pagesift_linux::memcg::memory_cgroup_dir(pid).ok().flatten();
                    (dir, now)
                })
                .0
                .clone();
            let Some(dir) = dir else {
                continue;
            };
            if seen.contains(&dir) {
                continue;
            }
            let total = domains.first().map_or(u64::MAX, |host| host.total);
            if let Ok(Some(mem)) = pagesift_linux::memcg::read_limited(&dir, total) {
                domains.push(mem);
            }
            seen.push(dir);
        }
        self.domains = domains;
        self.read_at = Some(now);
        &self.domains
    }
}

/// Bytes of a page that [`page_hash`] reads: four evenly spaced pieces of
/// this size, from the page's first byte to its last.
const HASH_PIECE: usize = 256;

/// Content key of a page, for the index and the host cache alike: xxh3-64
/// of a quarter of the page, in four pieces spread over it. A key is only a
/// candidate: every match is compared byte for byte before anything is
/// dropped, so two pages that differ only outside the pieces cost a
/// comparison, never a wrong drop. Hashing the whole page was a third of a
/// scrub's CPU (perf, one 256 MiB guest: xxh3's loop 36 % of the scrubbing
/// thread), and a scrub hashes every present page of every guest.
pub fn page_hash(bytes: &[u8]) -> u64 {
    if bytes.len() < 8 * HASH_PIECE {
        return twox_hash::XxHash3_64::oneshot(bytes);
    }
    // Evenly spaced, the first at the page's start and the last at its end.
    let step = (bytes.len() - HASH_PIECE) / 3;
    let mut pieces = [0u8; 4 * HASH_PIECE];
    for (i, piece) in pieces.chunks_exact_mut(HASH_PIECE).enumerate() {
        piece.copy_from_slice(&bytes[i * step..i * step + HASH_PIECE]);
    }
    twox_hash::XxHash3_64::oneshot(&pieces)
}

/// The first eight bytes of a page (the index's "head", §3.3).
fn page_head(bytes: &[u8]) -> u64 {
    u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"))
}

/// A full index pass over the guest's RAM; returns the pages read.
fn index_guest(guest: &mut Guest) -> Result<u64, LinuxError> {
    let index = &mut guest.index;
    index.begin_pass(guest.ram.pages() as usize);
    let read = guest.ram.for_each_page(|addr, page| {
        let bytes: &[u8] = bytemuck::bytes_of(page);
        index.insert(addr, page_hash(bytes), page_head(bytes));
    })?;
    index.end_pass();
    Ok(read)
}

/// Re-indexes the pages the hints named since the last scrub (module
/// header, step 2); returns the pages read and their content keys. A page
/// that is not present (any more) is left as it was: a match on it fails
/// its byte check.
fn update_index(guest: &mut Guest) -> Result<(u64, HashSet<u64>), LinuxError> {
    let page = PAGE_SIZE as u64;
    let mut addrs: Vec<u64> = guest
        .hinted
        .iter()
        .flat_map(|&(start, pages)| (0..pages).map(move |k| start + k * page))
        .collect();
    addrs.sort_unstable();
    addrs.dedup();
    let mut read = 0;
    let mut keys = HashSet::new();
    let mut pages = PageBuffer::new(READ_BATCH_PAGES);
    let mut present = vec![false; READ_BATCH_PAGES];
    for chunk in addrs.chunks(READ_BATCH_PAGES) {
        guest.ram.read_pages(chunk, &mut pages, &mut present)?;
        for (i, &addr) in chunk.iter().enumerate() {
            if present[i] {
                let bytes: &[u8] = bytemuck::bytes_of(&pages[i]);
                let key = page_hash(bytes);
                guest.index.update(addr, key, page_head(bytes));
                keys.insert(key);
                read += 1;
            }
        }
    }
    Ok((read, keys))
}

/// Scrubs one image of one guest whose index is fresh (steps 3 to 5 of the
/// module header): every cached page if `fresh` is `None` (a full index
/// pass), else those `memo` says may have changed their verdict; `memo` is
/// brought up to date.
fn scrub_image(
    cache: &ImageCache,
    ram: &mut GuestRam,
    index: &GuestIndex,
    folios: &mut FolioFinder,
    memo: &mut CacheMemo,
    fresh: Option<&HashSet<u64>>,
) -> Result<ImagePass, LinuxError> {
    let all = cache.cached_pages()?;
    // Forget what left the cache (mincore's list is in file order).
    memo.kept.retain(|i, _| all.binary_search(i).is_ok());
    let cached: Vec<u64> = match fresh {
        None => all.clone(),
        Some(fresh) => all
            .iter()
            .copied()
            .filter(|&i| memo.examine(i, fresh))
            .collect(),
    };
    let mut pass = ImagePass {
        cached: all.len() as u64,
        examined: cached.len() as u64,
        ..ImagePass::default()
    };
    // The key of each page of `pages` (below), if it could be read.
    let mut keys: Vec<Option<u64>> = Vec::with_capacity(cached.len());
    let mut batch_keys: Vec<Option<u64>> = vec![None; READ_BATCH_PAGES];
    let mut pages: Vec<CachedPage> = Vec::with_capacity(cached.len());
    let mut buf = vec![0u8; READ_BATCH_PAGES * PAGE_SIZE];
    // The guest side of one batch: candidates (guest address, slot in the
    // batch) in address order, so that neighbouring guest pages are read
    // together (`GuestRam::read_pages`).
    let mut candidates: Vec<(u64, usize)> = Vec::with_capacity(READ_BATCH_PAGES);
    let mut addrs: Vec<u64> = Vec::with_capacity(READ_BATCH_PAGES);
    let mut guest_pages = PageBuffer::new(READ_BATCH_PAGES);
    let mut guest_present = vec![false; READ_BATCH_PAGES];
    let mut held = vec![Held::No; READ_BATCH_PAGES];
    let mut k = 0;
    while k < cached.len() {
        // A run of consecutive cached pages, at most one batch.
        let mut n = 1;
        while k + n < cached.len() && n < READ_BATCH_PAGES && cached[k + n] == cached[k] + n as u64
        {
            n += 1;
        }
        // Pages past `got` were evicted since mincore: nothing to drop.
        let got = cache.read_cached(cached[k], &mut buf[..n * PAGE_SIZE])?;
        candidates.clear();
        for i in 0..got.min(n) {
            let bytes = &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            let key = page_hash(bytes);
            batch_keys[i] = Some(key);
            if let Some(addr) = index.lookup(key) {
                candidates.push((addr, i));
            }
        }
        candidates.sort_unstable();
        addrs.clear();
        addrs.extend(candidates.iter().map(|c| c.0));
        ram.read_pages(&addrs, &mut guest_pages, &mut guest_present)?;
        held[..n].fill(Held::No);
        batch_keys[got.min(n)..n].fill(None);
        for (c, &(_, i)) in candidates.iter().enumerate() {
            let bytes = &buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
            held[i] = if guest_present[c] && bytemuck::bytes_of(&guest_pages[c]) == bytes {
                Held::Verified
            } else {
                Held::HashOnly
            };
        }
        for i in 0..n {
            let index_in_file = cached[k + i];
            match held[i] {
                Held::Verified => pass.held += 1,
                Held::HashOnly => pass.hash_only += 1,
                Held::No => {}
            }
            pages.push(CachedPage {
                index: index_in_file,
                held: held[i],
                dirty: false,
                writeback: false,
            });
            keys.push(batch_keys[i]);
        }
        k += n;
    }
    if pass.held > 0 {
        drop_verified(cache, folios, &mut pages, &mut pass)?;
    }
    // Remember the pages examined and kept; a page examined but not read
    // (evicted since mincore) or dropped is forgotten: if it is cached
    // again, it is new.
    let ranges = &pass.dropped_ranges;
    for (p, key) in pages.iter().zip(keys) {
        let r = ranges.partition_point(|r| r.first_page() + r.pages() <= p.index);
        let dropped = ranges.get(r).is_some_and(|r| r.first_page() <= p.index);
        match key {
            Some(key) if !dropped => memo.kept.insert(p.index, (key, p.held)),
            _ => memo.kept.remove(&p.index),
        };
    }
    Ok(pass)
}

/// Steps 4 and 5 of the module header for the verified pages among
/// `pages` (all in file order): each run of them is dropped as it is
/// ([`plan_runs`]); a run with dirty or writeback pages is planned again
/// with its folios' states ([`plan_folios`]), so that its clean folios
/// still go. The folio step maps the file and faults in every page it
/// looks at; for every verified page it took 12 % of the scrub's CPU
/// samples (perf, page-cache bench, 2-CPU Intel Xeon, 2026-12-03), and
/// the images here are cached in one-page folios, where the runs alone
/// drop the same pages (`plan`'s module header says why that holds for
/// any folios).
fn drop_verified(
    cache: &ImageCache,
    folios: &mut FolioFinder,
    pages: &mut [CachedPage],
    pass: &mut ImagePass,
) -> Result<(), LinuxError> {
    let runs = plan_runs(pages);
    let mut busy: Vec<u64> = Vec::new();
    for range in &runs {
        match cache.drop_range(range.offset, range.len)? {
            DropOutcome::Dropped { evicted } => {
                pass.dropped += evicted;
                pass.dropped_ranges.push(*range);
            }
            DropOutcome::Busy => {
                let first = range.first_page();
                busy.extend(first..first + range.pages());
            }
        }
    }
    debug!(
        verified = pass.held,
        runs = runs.len(),
        run_pages = runs.iter().map(|r| r.pages()).sum::<u64>(),
        busy_pages = busy.len(),
        "scrub runs"
    );
    if !busy.is_empty() {
        plan_folios(cache, folios, &busy, pages, pass)?;
        pass.dropped_ranges.sort_unstable_by_key(|r| r.offset);
    }
    Ok(())
}

/// Drops the whole clean folios among the `verified` pages (file order) of
/// `pages`: their folios' states, the plan ([`plan_drops`]), the drops.
fn plan_folios(
    cache: &ImageCache,
    folios: &mut FolioFinder,
    verified: &[u64],
    pages: &mut [CachedPage],
    pass: &mut ImagePass,
) -> Result<(), LinuxError> {
    let states = folios.folios(cache, verified)?;
    // Dirty and writeback are folio-wide: mark every page of such a folio.
    // `pages` is in file order (mincore's), so each folio's pages are one
    // slice, found by binary search.
    for s in states.iter().filter(|s| s.dirty || s.writeback) {
        let from = pages.partition_point(|p| p.index < s.folio.first);
        let to = pages.partition_point(|p| p.index < s.folio.end());
        for p in &mut pages[from..to] {
            p.dirty |= s.dirty;
            p.writeback |= s.writeback;
        }
    }
    let folio_list: Vec<_> = states.iter().map(|s| s.folio).collect();
    let plan = plan_drops(pages, &folio_list);
    debug!(
        cached = pass.cached,
        held = pass.held,
        hash_only = pass.hash_only,
        folios = folio_list.len(),
        folio_pages = folio_list.iter().map(|f| f.pages).sum::<u64>(),
        largest_folio = folio_list.iter().map(|f| f.pages).max().unwrap_or(0),
        dirty_folios = states.iter().filter(|s| s.dirty).count(),
        writeback_folios = states.iter().filter(|s| s.writeback).count(),
        planned_pages = plan.iter().map(|r| r.pages()).sum::<u64>(),
        "scrub plan"
    );
    for range in plan {
        match cache.drop_range(range.offset, range.len)? {
            DropOutcome::Dropped { evicted } => {
                pass.dropped += evicted;
                pass.dropped_ranges.push(range);
            }
            DropOutcome::Busy => pass.busy += 1,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::page_hash;
    use super::{PRESSURE_EVERY, Pressure};

    /// The memory pressure is read again only every half second; a guest
    /// that is gone loses its cgroup directory at the next read.
    #[test]
    fn pressure_is_read_at_most_every_half_second() {
        let mut p = Pressure::default();
        let me = std::process::id();
        assert!(!p.domains(0, &[me]).is_empty(), "the host's memory");
        assert_eq!(p.read_at, Some(0));
        assert!(p.dirs.contains_key(&me));
        p.domains(PRESSURE_EVERY - 1, &[me]);
        assert_eq!(p.read_at, Some(0));
        p.domains(PRESSURE_EVERY, &[]);
        assert_eq!(p.read_at, Some(PRESSURE_EVERY));
        assert!(p.dirs.is_empty());
    }

    fn page(seed: u8) -> Vec<u8> {
        (0..4096u32)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    #[test]
    fn the_page_key_reads_four_spread_pieces() {
        // Pieces at 0, 1280, 2560 and 3840, 256 bytes each.
        let a = page(1);
        assert_eq!(page_hash(&a), page_hash(&a.clone()));
        assert_ne!(page_hash(&a), page_hash(&page(2)));
        // A change in any quarter's piece changes the key...
        for at in [0, 255, 1280 + 17, 2560 + 255, 3840, 4095] {
            let mut b = a.clone();
            b[at] ^= 0xff;
            assert_ne!(page_hash(&a), page_hash(&b), "byte {at}");
        }
        // ... one between the pieces does not: the byte-for-byte check
        // before a drop tells such pages apart.
        let mut c = a.clone();
        c[512] ^= 0xff;
        assert_eq!(page_hash(&a), page_hash(&c));
        // Short input is hashed whole.
        assert_ne!(page_hash(&a[..64]), page_hash(&a[..63]));
    }
}
