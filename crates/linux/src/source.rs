//! [`LinuxSource`]: the live processes of this machine as a
//! [`MemorySource`].
//!
//! ## Regions and their ids
//! Every VMA that [`discover`] keeps becomes one region, or, when it is
//! longer than [`SourceConfig::max_region_pages`], several *sub-regions*:
//! slices cut at multiples of that size in the address space (not from the
//! VMA's start), so the first and last slices may be shorter. A VMA that
//! fits in one slice is never cut. Aligning the
//! cuts keeps sub-regions stable when the VMA changes shape: marking one
//! sub-region `MADV_MERGEABLE` splits the VMA exactly at slice boundaries,
//! a heap that grows only lengthens its last slice, and two VMAs that merge
//! keep their slices. The core addresses pages of a region with a `u32`, so
//! slices are at most 2^32 - 1 pages. A region's id is keyed by
//! (pid, process start time, first address): [`LinuxSource::refresh`]
//! re-reads the maps and keeps the id of a region that is still there (its
//! length may change, e.g. a growing heap), gives new regions new ids, and
//! forgets unmapped ones. The start time makes a reused pid a new process.
//! Ids are never reused. A VMA unmapped and mapped again at the same
//! addresses between two refreshes keeps its id: the maps cannot tell, but
//! its frames can ([`LinuxSource::check_renewed`], [`crate::renewal`]), and
//! the caller decides what that means.
//!
//! ## How many regions
//! Everything the daemon keeps grows with the regions it tracks (about
//! 2.9 KiB of resident memory per region, measured by `scripts/vma-bound`
//! with one-page VMAs; see docs/reliability.md), and a process can map
//! tens of thousands of VMAs. So at most [`SourceConfig::max_regions`] are
//! tracked: when a discovery finds more, the largest are kept (ties: the
//! longest known first, then the lowest address), which loses the least
//! memory to look at and keeps the choice stable from one refresh to the
//! next; the number left out is [`LinuxSource::left_out`].
//!
//! ## Refreshes
//! Reading `/proc/PID/smaps` makes the kernel walk every present page of
//! the process (for RSS and PSS), which for a guest's QEMU costs
//! milliseconds; `/proc/PID/maps` costs per VMA. Discovery needs smaps only
//! for the `mg` flag (`VM_MERGEABLE`), which maps does not show
//! ([`discover::MapsDiscovery`] decides the rest). So each process keeps
//! the ranges believed mergeable: the `mg` VMAs of its last smaps read,
//! updated with every range pagesift advises ([`LinuxSource::note_advised`]).
//! A refresh reads smaps only for a new process, one whose `ksm_stat` says
//! it makes all its memory mergeable by itself (`PR_SET_MEMORY_MERGE`), or
//! once the last smaps read is [`SMAPS_INTERVAL`] old (a `ksm_stat` saying
//! that no VMA is mergeable counts as such a read); a mark made by the
//! process itself in between is seen that late. A VMA that overlaps a
//! known mergeable range counts as mergeable (its pages are then read
//! through the unpinned path, which is always safe). What is known is cut
//! to the process's VMAs at every maps read: a range that was unmapped is
//! forgotten, so a VMA mapped there later counts as the new, unmarked
//! memory it is (a munmap and an mmap of the same range between two
//! refreshes are not told apart until the next smaps read).
//!
//! A refresh lists every process on the host and reads the maps of each
//! one selected. After pagesift marks ranges in one process, only that
//! process's VMAs changed (the marks split them), and when a process
//! starts only it is new, so [`LinuxSource::refresh_pids`] reads just the
//! processes named (opening new ones, dropping those that exited) and
//! keeps the others' regions as they were: in a vm-boot run the refreshes
//! after marks were most of the refreshes, and listing the host's
//! processes and reading the other QEMUs' maps most of their cost
//! (docs/daemon-cpu.md). While regions are left out for
//! [`SourceConfig::max_regions`], it falls back to a full refresh, since
//! which regions are kept depends on all of them.
//!
//! ## Page states
//! [`MemorySource::page_state`] reads one pagemap entry and, for a present
//! page, its kpageflags word ([`PageInspector`]); [`LinuxSource::inspect`]
//! does the same for a run of pages in two batched reads.
//!
//! ## Reads, and why pages are checked again
//! [`MemorySource::read_pages`] groups the requested pages by process,
//! reads their pagemap entries (clustered `pread`s) right before the read,
//! and reads only the leading pages that are still present. The core's
//! contract already says "read only pages whose state you checked", but
//! the state may be stale by then (the target can free a page at any
//! time), and a remote read of a non-present page would fault it in inside
//! the target. Checking again shrinks that window to the microseconds
//! between two syscalls. The same entries choose the read path
//! ([`crate::read`]): exclusively mapped pages outside `VM_MERGEABLE`
//! regions go through `process_vm_readv`; shared pages (after fork) and
//! everything in mergeable regions (where KSM pages live) through
//! `/proc/PID/mem`, because pinning them would make the kernel copy them
//! in the target. The check costs one pagemap `pread` per cluster of
//! nearby pages (≈0.7 µs for an isolated page, ≈40 ns per page in
//! contiguous runs, measured). [`LinuxSource::read_present`], for a
//! caller that wants a chunk's states and its present pages' contents
//! both (the exact sweep), reads the pagemap entries once and reads by
//! them: the states are as fresh as the check would be.
//!
//! [`MemorySource::sample_pages`] leaves a merged page unread when a sample
//! read a KSM page on the same frame within [`KSM_CONTENT_KNOWN`]: a KSM
//! page is write-protected wherever it is mapped, so its frame's content
//! cannot have changed, and the sampler wants it only for its index. The
//! page's state is given all the same.
//!
//! ## Vanishing processes
//! A process that exits is normal: its regions report
//! [`SourceError::Gone`], it is remembered in [`LinuxSource::gone`], and the
//! next refresh drops it.

use crate::PAGE_SIZE;
use crate::discover::{
    self, MapsDiscovery, ProcessFilter, ProcessInfo, RegionKind, RegionsFrom, SmapsReason,
};
use crate::error::LinuxError;
use crate::inspect::{PageClass, PageInfo, PageInspector};
use crate::kpageflags::{KPageFlags, KpfFlags};
use crate::ksm::ProcessKsmStat;
use crate::pagemap::{Pagemap, PagemapEntry};
use crate::read::{PageBuffer, RemoteReader};
use crate::renewal::Sentinels;
use pagesift_core::ranges::RangeSet;
use pagesift_core::source::{MemorySource, PageState, RegionInfo, SourceError};
use pagesift_core::{PageRef, PageWords, RegionId};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, BinaryHeap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// How long discovery trusts what it knows of a process's `VM_MERGEABLE`
/// ranges (see "Refreshes" in the module header) before it reads smaps
/// again to learn ranges that someone other than pagesift made mergeable.
pub const SMAPS_INTERVAL: Duration = Duration::from_secs(60);

/// Frames remembered as KSM pages for [`LinuxSource::page_states`] (2^20
/// frames, 4 GiB of KSM pages; the table takes up to 2^21 buckets of 17
/// bytes, about 34 MiB, at most); the table starts over when full, which
/// only costs reads.
pub const KSM_FRAMES_KEPT: usize = 1 << 20;

/// How long after a kpageflags read last showed a frame to be a KSM page
/// [`LinuxSource::page_states`] takes a page mapped more than once on it
/// as merged without reading again. A KSM page that every sharer has
/// broken is freed, and its frame can come back as an ordinary page, which
/// would be taken for merged only if it were again mapped more than once
/// in a mergeable VMA (shared after a fork); the period bounds that error.
/// pagesift's choice (one flags read per merged page every 30 s at most).
pub const KSM_FRAMES_TRUSTED: Duration = Duration::from_secs(30);

/// How long after a sample read a KSM page's content
/// [`MemorySource::sample_pages`] leaves a page on the same frame unread
/// (its state is still given). A KSM page is write-protected in every
/// mapping: a write copies it, and the frame keeps its content for as long
/// as it is a KSM page. The sampler reads a merged page only to put its
/// content in its stable index, where it already is after the first read.
/// In one quick vm-boot run (2026-12-05, by hand, counters added for the
/// run) 31 187 of the 96 902 pages that sampling read were merged, and
/// 21 999 of those were frames read within the previous 60 s. A frame
/// freed and taken by another KSM page within the period has its new
/// content indexed that much later; nothing else follows from it.
/// pagesift's choice.
pub const KSM_CONTENT_KNOWN: Duration = Duration::from_secs(60);

/// How [`LinuxSource`] cuts memory into regions.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceConfig {
    /// VMAs longer than this many pages are tracked as sub-regions: slices
    /// cut at multiples of this many pages in the address space (see the
    /// module header).
    pub max_region_pages: u32,
    /// Keep private file mappings (only their COWed pages are candidates).
    pub private_file: bool,
    /// Most regions tracked (see "How many regions" in the module header).
    pub max_regions: usize,
}

impl Default for SourceConfig {
    fn default() -> Self {
        SourceConfig {
            max_region_pages: u32::MAX,
            private_file: true,
            max_regions: usize::MAX,
        }
    }
}

/// A region as [`LinuxSource`] tracks it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LinuxRegion {
    /// Its id.
    pub id: RegionId,
    /// The owning process.
    pub pid: u32,
    /// First address.
    pub start: u64,
    /// Length in pages.
    pub pages: u32,
    /// Whether all present pages or only COWed ones are candidates.
    pub kind: RegionKind,
    /// The mapped file or pseudo-path, if any.
    pub path: Option<PathBuf>,
    /// `VM_MERGEABLE` at the last refresh: KSM pages can only be here, so
    /// its pages are always read through the unpinned path.
    pub mergeable: bool,
    /// First address of the VMA the region is part of (equal to `start`
    /// unless the region is a sub-region).
    pub vma_start: u64,
    /// End address (exclusive) of that VMA.
    pub vma_end: u64,
}

/// A region found by a discovery, before the largest are kept.
struct Found {
    /// (pid, start time, first address): what its id is keyed by.
    key: (u32, u64, u64),
    /// It had an id before this discovery.
    known: bool,
    region: LinuxRegion,
}

/// Which region is kept over which: larger first, then one already known
/// (it keeps its place from one refresh to the next), then the lower key.
type Rank = (u32, bool, Reverse<(u32, u64, u64)>);

impl Found {
    fn rank(&self) -> Rank {
        (self.region.pages, self.known, Reverse(self.key))
    }
}

impl PartialEq for Found {
    fn eq(&self, other: &Self) -> bool {
        self.rank() == other.rank()
    }
}
impl Eq for Found {}
impl PartialOrd for Found {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Found {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl LinuxRegion {
    /// Address of page `page`.
    pub fn address(&self, page: u32) -> u64 {
        self.start + page as u64 * crate::PAGE_SIZE
    }
}

#[derive(Debug)]
struct Proc {
    info: ProcessInfo,
    inspector: PageInspector,
    reader: RemoteReader,
    gone: bool,
    /// Ranges believed `VM_MERGEABLE`: the `mg` VMAs of the last smaps
    /// read, kept current with [`LinuxSource::note_advised`].
    mergeable: RangeSet,
    /// Ranges of private anonymous VMAs the last discovery kept (so not
    /// `VM_DROPPABLE`).
    anonymous: RangeSet,
    /// When smaps was last read (`None`: never).
    smaps_at: Option<Instant>,
    /// Reads of its regions from smaps, and the reason of the last one.
    smaps_reads: u64,
    smaps_last: Option<SmapsReason>,
}

/// How discovery read the processes' regions since start. Each read came
/// from `/proc/PID/maps`, which costs per VMA, or from `/proc/PID/smaps`,
/// which makes the kernel walk every present page of the process (for a
/// guest's QEMU, milliseconds), for a [`SmapsReason`]. Shown in status so
/// that an operator can tell which processes make discovery costly and why.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiscoveryCounts {
    /// Reads from maps.
    pub maps: u64,
    /// Reads from smaps, by reason (reasons never met are absent).
    pub smaps: BTreeMap<SmapsReason, u64>,
}

impl DiscoveryCounts {
    /// Reads from smaps, all reasons.
    pub fn smaps_total(&self) -> u64 {
        self.smaps.values().sum()
    }
}

/// A live process whose regions were read from smaps at least once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SmapsReads {
    /// The process.
    pub pid: u32,
    /// Its reads from smaps since it was discovered.
    pub reads: u64,
    /// Why the last one was made.
    pub last: SmapsReason,
}

/// Live processes as a [`MemorySource`]. Read-only: it never writes a
/// target's memory, mappings or KSM state.
#[derive(Debug)]
pub struct LinuxSource {
    filter: ProcessFilter,
    config: SourceConfig,
    procs: BTreeMap<u32, Proc>,
    regions: BTreeMap<RegionId, LinuxRegion>,
    ids: HashMap<(u32, u64, u64), RegionId>,
    next_id: u64,
    gone: Vec<u32>,
    skipped: Vec<(u32, String)>,
    entries: Vec<PagemapEntry>,
    checked: Vec<PagemapEntry>,
    order: Vec<usize>,
    addrs: Vec<u64>,
    unpinned: Vec<bool>,
    /// Scratch of [`MemorySource::sample_pages`].
    batch: SampleScratch,
    /// Discovery from `/proc/PID/maps` (its file-kind cache).
    maps: MapsDiscovery,
    /// For the droppable check of maps discovery.
    kpf: KPageFlags,
    /// Frames seen as KSM pages (bounded by [`KSM_FRAMES_KEPT`]), each with
    /// the second (since `ksm_frames_since`) of the last read that showed
    /// it: in a mergeable VMA an exclusively mapped page needs its flags
    /// read only if its frame is one of these, and a page mapped more than
    /// once only if its frame was not shown within [`KSM_FRAMES_TRUSTED`]
    /// (see [`LinuxSource::page_states`]).
    /// hashbrown's default hasher, not std's SipHash: the table is asked for
    /// every page an accounting pass reads, and with SipHash its lookups,
    /// inserts and hashing took 4.5 % of the daemon's CPU samples in a
    /// quick vm-boot run, 1.3 % without (perf by hand, 2026-12-03,
    /// 2-CPU Intel Xeon; docs/daemon-cpu.md).
    ksm_frames: hashbrown::HashMap<u64, u32>,
    ksm_frames_since: Instant,
    /// KSM frames whose content a sample read, each with the second (since
    /// `ksm_frames_since`) of that read, bounded by [`KSM_FRAMES_KEPT`]:
    /// merged pages on them are left unread for [`KSM_CONTENT_KNOWN`].
    ksm_contents_read: hashbrown::HashMap<u64, u32>,
    /// How the processes' regions were read since start.
    discovery: DiscoveryCounts,
    /// Regions left out at the last discovery (over `max_regions`).
    left_out: usize,
    /// Write tracking of candidate ranges; answers `take_written`.
    #[cfg(target_arch = "x86_64")]
    writes: crate::uffd::WriteTracker,
    /// Per region checked by [`LinuxSource::check_renewed`], its sentinel
    /// entries at the last check; only ids of tracked regions.
    sentinels: HashMap<RegionId, Sentinels>,
}

impl LinuxSource {
    /// Discovers the processes `filter` selects and their mergeable regions.
    ///
    /// Errors: a named pid that does not exist, pagesift's own pid, or a
    /// missing capability (`CAP_SYS_ADMIN` for PFNs, checked first;
    /// `CAP_SYS_PTRACE` when a target refuses access).
    ///
    /// Each selected process holds two open files (pagemap and mem), so the
    /// soft limit on open files is raised to the hard limit.
    pub fn new(filter: ProcessFilter, config: SourceConfig) -> Result<LinuxSource, LinuxError> {
        // Fail early, and by name, without CAP_SYS_ADMIN.
        let kpf = KPageFlags::open()?;
        raise_open_file_limit();
        let mut s = LinuxSource {
            filter,
            config,
            procs: BTreeMap::new(),
            regions: BTreeMap::new(),
            ids: HashMap::new(),
            next_id: 0,
            gone: Vec::new(),
            skipped: Vec::new(),
            entries: Vec::new(),
            checked: Vec::new(),
            order: Vec::new(),
            addrs: Vec::new(),
            unpinned: Vec::new(),
            maps: MapsDiscovery::new(),
            kpf,
            ksm_frames: hashbrown::HashMap::new(),
            ksm_frames_since: Instant::now(),
            ksm_contents_read: hashbrown::HashMap::new(),
            batch: SampleScratch::default(),
            discovery: DiscoveryCounts::default(),
            left_out: 0,
            #[cfg(target_arch = "x86_64")]
            writes: crate::uffd::WriteTracker::new(),
            sentinels: HashMap::new(),
        };
        s.discover(true)?;
        Ok(s)
    }

    /// Re-reads processes and maps. Region ids of unchanged regions are
    /// kept; processes that exited are dropped and recorded in
    /// [`gone`](Self::gone).
    pub fn refresh(&mut self) -> Result<(), LinuxError> {
        self.discover(false)
    }

    /// Pids of processes that exited after they were discovered (or while
    /// being discovered), since the last [`take_gone`](Self::take_gone).
    pub fn gone(&self) -> &[u32] {
        &self.gone
    }

    /// Returns and forgets the pids in [`gone`](Self::gone) (a long-running
    /// caller drains it after counting).
    pub fn take_gone(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.gone)
    }

    /// Regions left out at the last discovery because more than
    /// [`SourceConfig::max_regions`] were found (see "How many regions" in
    /// the module header).
    pub fn left_out(&self) -> usize {
        self.left_out
    }

    /// Processes that were selected but could not be opened at the last
    /// discovery, with why (e.g. refused by an LSM despite the
    /// capabilities).
    pub fn skipped(&self) -> &[(u32, String)] {
        &self.skipped
    }

    /// How the processes' regions were read since start (maps or smaps,
    /// and why).
    pub fn discovery(&self) -> &DiscoveryCounts {
        &self.discovery
    }

    /// The live processes whose regions were read from smaps, most reads
    /// first (then by pid).
    pub fn smaps_reads(&self) -> Vec<SmapsReads> {
        let mut v: Vec<SmapsReads> = (self.procs.iter())
            .filter(|(_, p)| !p.gone)
            .filter_map(|(&pid, p)| {
                Some(SmapsReads {
                    pid,
                    reads: p.smaps_reads,
                    last: p.smaps_last?,
                })
            })
            .collect();
        v.sort_by(|a, b| b.reads.cmp(&a.reads).then(a.pid.cmp(&b.pid)));
        v
    }

    /// The selected processes that are alive (as of the last access).
    pub fn processes(&self) -> impl Iterator<Item = &ProcessInfo> {
        self.procs.values().filter(|p| !p.gone).map(|p| &p.info)
    }

    /// A region's details.
    pub fn region(&self, id: RegionId) -> Option<&LinuxRegion> {
        self.regions.get(&id)
    }

    /// All tracked regions, by id.
    pub fn linux_regions(&self) -> impl Iterator<Item = &LinuxRegion> {
        self.regions.values()
    }

    fn discover(&mut self, first: bool) -> Result<(), LinuxError> {
        let listed = if self.filter.pids.is_empty() || first {
            discover::list_processes(&self.filter)?
        } else {
            self.list_named(&self.filter.pids)?
        };
        self.rebuild(listed, None)
    }

    /// Re-reads these processes only, and keeps every other process's
    /// regions as the last refresh found them (see "Refreshes" in the
    /// module header): what the daemon needs after it marked ranges in a
    /// process, or when processes came or went, without listing every
    /// process on the host and reading all their maps. A pid not selected
    /// (or this process's own) is passed over; one that exited or exec'd
    /// is dropped as a full refresh would; a new selected one is opened
    /// and read.
    /// While regions are left out (more than `max_regions`), which ones
    /// are kept depends on every process's regions: that is a full
    /// refresh.
    ///
    /// Returns whether anything was read or dropped: `false` when none of
    /// the pids is a selected process, known or new (a host's short-lived
    /// commands come and go all the time).
    pub fn refresh_pids(&mut self, pids: &BTreeSet<u32>) -> Result<bool, LinuxError> {
        if self.left_out > 0 {
            return self.discover(false).map(|()| true);
        }
        let own = crate::own_pid();
        let named: Vec<u32> = (pids.iter())
            .copied()
            .filter(|&pid| {
                pid != own && (self.filter.pids.is_empty() || self.filter.pids.contains(&pid))
            })
            .collect();
        let listed = self.list_named(&named)?;
        if listed.is_empty() && !pids.iter().any(|pid| self.procs.contains_key(pid)) {
            return Ok(false);
        }
        self.rebuild(listed, Some(pids))?;
        Ok(true)
    }

    /// The selected processes among `pids`; those that exited are left
    /// out, not errors.
    fn list_named(&self, pids: &[u32]) -> Result<Vec<ProcessInfo>, LinuxError> {
        let mut v = Vec::new();
        for &pid in pids {
            let one = ProcessFilter {
                pids: vec![pid],
                ..self.filter.clone()
            };
            match discover::list_processes(&one) {
                Ok(mut p) => v.append(&mut p),
                Err(LinuxError::NoSuchProcess(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(v)
    }

    /// Makes the processes and regions those of `listed`, read now, or,
    /// with `only`, those of `listed` for the pids in `only` and what was
    /// known before for every other process.
    fn rebuild(
        &mut self,
        listed: Vec<ProcessInfo>,
        only: Option<&BTreeSet<u32>>,
    ) -> Result<(), LinuxError> {
        let looked_at = |pid: &u32| only.is_none_or(|o| o.contains(pid));
        self.skipped.retain(|(pid, _)| !looked_at(pid));
        // Drop processes that vanished, whose pid now names another, or
        // that exec'd another image since they were opened (same pid and
        // start time, a new program: its old facts and ranges are void,
        // and the daemon's marks of the old image must not follow it).
        let keep: HashMap<u32, (u64, u64)> = listed
            .iter()
            .map(|p| (p.pid, (p.start_time, p.image)))
            .collect();
        let stale: Vec<(u32, bool)> = self
            .procs
            .iter()
            .filter(|(pid, _)| looked_at(pid))
            .filter(|(pid, p)| p.gone || keep.get(pid) != Some(&(p.info.start_time, p.info.image)))
            .map(|(&pid, p)| (pid, p.gone))
            .collect();
        for (pid, counted) in stale {
            if !counted {
                self.mark_gone(pid);
            }
            self.procs.remove(&pid);
        }
        // The regions found, the largest `max_regions` of them: a min-heap
        // of that size, so that memory stays bounded however many VMAs
        // the processes map (see "How many regions"). Those of processes
        // not looked at this time are found as they were.
        let mut found: BinaryHeap<Reverse<Found>> = BinaryHeap::new();
        let mut found_all = 0usize;
        for r in self.regions.values().filter(|r| !looked_at(&r.pid)) {
            let Some(p) = self.procs.get(&r.pid).filter(|p| !p.gone) else {
                continue;
            };
            found_all += 1;
            found.push(Reverse(Found {
                key: (r.pid, p.info.start_time, r.start),
                known: true,
                region: r.clone(),
            }));
        }
        for info in listed {
            let pid = info.pid;
            match self.procs.entry(pid) {
                // Known (same start time, see above): its name, uid and
                // cgroups may have changed since, and eligibility and the
                // savings per cgroup follow them; its identity stays.
                std::collections::btree_map::Entry::Occupied(mut known) => {
                    let p = &mut known.get_mut().info;
                    p.comm = info.comm;
                    p.uid = info.uid;
                    p.cgroup = info.cgroup;
                    p.cgroups = info.cgroups;
                }
                std::collections::btree_map::Entry::Vacant(slot) => match open_proc(info) {
                    Ok(p) => {
                        slot.insert(p);
                    }
                    Err(e) if e.is_gone() || matches!(e, LinuxError::NoSuchProcess(_)) => {
                        self.mark_gone(pid);
                        continue;
                    }
                    Err(e @ LinuxError::PermissionDenied { .. }) => {
                        self.skipped.push((pid, e.to_string()));
                        continue;
                    }
                    Err(e) => return Err(e),
                },
            }
            let start_time = self.procs[&pid].info.start_time;
            let maps = match self.process_regions(pid) {
                Ok(m) => m,
                Err(LinuxError::NoSuchProcess(_)) | Err(LinuxError::Gone(_)) => {
                    self.procs.remove(&pid);
                    self.mark_gone(pid);
                    continue;
                }
                Err(e) => return Err(e),
            };
            for r in &maps.rejected {
                if r.reason == discover::Ineligible::OwnUserfaultfd {
                    self.skipped.push((
                        pid,
                        format!(
                            "range {:#x}-{:#x} skipped: the process's own userfaultfd \
                             (missing or minor mode) would make reads wait for it",
                            r.start, r.end
                        ),
                    ));
                }
            }
            for r in maps.eligible {
                if r.kind == RegionKind::PrivateFile && !self.config.private_file {
                    continue;
                }
                let slice_bytes = self.config.max_region_pages.max(1) as u64 * crate::PAGE_SIZE;
                let whole = r.end - r.start <= slice_bytes;
                let mut start = r.start;
                while start < r.end {
                    // Cut at the next multiple of the slice size (a VMA
                    // that fits in one slice stays whole).
                    let cut = if whole {
                        r.end
                    } else {
                        (start / slice_bytes + 1).saturating_mul(slice_bytes)
                    };
                    let end = cut.min(r.end);
                    let pages = ((end - start) / crate::PAGE_SIZE) as u32;
                    let key = (pid, start_time, start);
                    found_all += 1;
                    let known = self.ids.contains_key(&key);
                    let rank = (pages, known, Reverse(key));
                    let max = self.config.max_regions;
                    if found.len() >= max {
                        // Full: only a larger one gets in (the smallest
                        // goes out).
                        match found.peek() {
                            Some(Reverse(least)) if least.rank() < rank => {
                                found.pop();
                            }
                            _ => {
                                start = end;
                                continue;
                            }
                        }
                    }
                    found.push(Reverse(Found {
                        key,
                        known,
                        region: LinuxRegion {
                            id: RegionId(0),
                            pid,
                            start,
                            pages,
                            kind: r.kind,
                            path: r.path.clone(),
                            mergeable: r.mergeable,
                            vma_start: r.start,
                            vma_end: r.end,
                        },
                    }));
                    start = end;
                }
            }
        }
        self.left_out = found_all - found.len();
        // Ids: kept for regions still there, new for new ones; forgotten
        // for regions not seen (or left out) this time.
        // New ids in address order, as discovery meets them.
        let mut found: Vec<Found> = found.into_iter().map(|Reverse(f)| f).collect();
        found.sort_unstable_by_key(|f| f.key);
        let mut ids = HashMap::with_capacity(found.len());
        self.regions.clear();
        for f in found {
            let id = self.ids.get(&f.key).copied().unwrap_or_else(|| {
                self.next_id += 1;
                RegionId(self.next_id)
            });
            ids.insert(f.key, id);
            self.regions.insert(id, LinuxRegion { id, ..f.region });
        }
        self.ids = ids;
        let regions = &self.regions;
        self.sentinels.retain(|id, _| regions.contains_key(id));
        Ok(())
    }

    /// Checks the tracked anonymous regions of at least `min_pages`
    /// pages outside mergeable VMAs, those in `only` (all when `None`),
    /// for renewal ([`crate::renewal`]): two one-entry pagemap reads each.
    /// Returns the renewed ones; they keep their ids (the caller decides
    /// what a new life means), and their sentinels start over from what
    /// was read now.
    pub fn check_renewed(
        &mut self,
        min_pages: u32,
        only: Option<&std::collections::BTreeSet<RegionId>>,
    ) -> Vec<RegionId> {
        let mut renewed = Vec::new();
        let regions: Box<dyn Iterator<Item = &LinuxRegion>> = match only {
            Some(ids) => Box::new(ids.iter().filter_map(|id| self.regions.get(id))),
            None => Box::new(self.regions.values()),
        };
        for r in regions {
            if r.kind != RegionKind::Anonymous || r.mergeable || r.pages < min_pages.max(2) {
                continue;
            }
            let Some(p) = self.procs.get(&r.pid).filter(|p| !p.gone) else {
                continue;
            };
            if p.mergeable.overlaps(r.start, r.address(r.pages)) {
                // Advised by pagesift since the last refresh: KSM moves
                // its frames.
                continue;
            }
            let pagemap = p.inspector.pagemap();
            let (mut first, mut last) = ([PagemapEntry(0)], [PagemapEntry(0)]);
            if pagemap.read(r.start, &mut first).is_err()
                || pagemap.read(r.address(r.pages - 1), &mut last).is_err()
            {
                continue;
            }
            let now = Sentinels([first[0], last[0]]);
            if let Some(before) = self.sentinels.insert(r.id, now)
                && before.renewed_by(&now)
            {
                renewed.push(r.id);
            }
        }
        renewed
    }

    /// Records that pagesift made `[start, end)` of `pid` mergeable
    /// (`mergeable`) or unmergeable, so that the next refresh knows the
    /// range's `mg` flag without reading smaps.
    pub fn note_advised(&mut self, pid: u32, start: u64, end: u64, mergeable: bool) {
        if let Some(p) = self.procs.get_mut(&pid) {
            if mergeable {
                p.mergeable.insert(start, end);
            } else {
                p.mergeable.remove(start, end);
            }
        }
    }

    /// Forgets what is known of `pid`'s mergeable ranges: the next refresh
    /// reads them from smaps.
    pub fn distrust_mergeable(&mut self, pid: u32) {
        if let Some(p) = self.procs.get_mut(&pid) {
            p.smaps_at = None;
        }
    }

    /// A process's VMAs, from maps where what is known of its mergeable
    /// ranges allows, from smaps otherwise (see "Refreshes" in the module
    /// header).
    fn process_regions(&mut self, pid: u32) -> Result<discover::ProcessRegions, LinuxError> {
        let p = self.procs.get_mut(&pid).expect("opened before");
        let stat = ProcessKsmStat::of(pid).ok();
        let nothing_mergeable = stat.is_some_and(|s| s.mergeable == Some(false));
        if nothing_mergeable {
            // Nothing is mergeable: nothing to remember either. And this
            // look is as good as an smaps read for the `mg` flags, so it
            // counts as one: otherwise the first refresh after pagesift's
            // first mark in the process paid smaps' page walk (9.4 ms for
            // the short-lived workload's 512 MiB region, after which the
            // refresh budget let no refresh run for 19 s and the daemon
            // marked regions that had been unmapped and mapped again:
            // `pagesift bench --full --only short-lived-2000ms`,
            // 2026-12-02, by hand).
            p.mergeable.clear();
            p.smaps_at = Some(Instant::now());
        }
        let known = nothing_mergeable
            || (p.smaps_at.is_some_and(|t| t.elapsed() < SMAPS_INTERVAL)
                && stat.is_some_and(|s| s.merge_any == Some(false)));
        let (regions, from) = if known {
            #[cfg(target_arch = "x86_64")]
            let own_userfaultfds = usize::from(self.writes.target_fd(pid).is_some());
            #[cfg(not(target_arch = "x86_64"))]
            let own_userfaultfds = 0;
            let known = discover::KnownRanges {
                mergeable: &p.mergeable,
                anonymous: &p.anonymous,
                own_userfaultfds,
            };
            self.maps
                .process_regions_known(pid, p.inspector.pagemap(), &mut self.kpf, known)?
        } else {
            let reason = match stat {
                Some(s) if s.merge_any == Some(false) && p.smaps_at.is_none() => {
                    SmapsReason::MergeableUnknown
                }
                Some(s) if s.merge_any == Some(false) => SmapsReason::MergeableRecheck,
                _ => SmapsReason::MergeAny,
            };
            (discover::process_regions(pid)?, RegionsFrom::Smaps(reason))
        };
        if let RegionsFrom::Smaps(reason) = from {
            *self.discovery.smaps.entry(reason).or_default() += 1;
            p.smaps_reads += 1;
            p.smaps_last = Some(reason);
            p.smaps_at = Some(Instant::now());
            p.mergeable = regions
                .eligible
                .iter()
                .filter(|r| r.mergeable)
                .map(|r| (r.start, r.end))
                .collect();
        } else {
            self.discovery.maps += 1;
            // A range advised for a VMA that is gone says nothing of a VMA
            // mapped there later (munmap drops VM_MERGEABLE with the VMA):
            // keep only what lies inside the process's VMAs now, so that
            // memory mapped again where a marked region was is seen as
            // new, unmarked memory once a refresh has seen the gap.
            let live: RangeSet = (regions.eligible.iter().map(|r| (r.start, r.end)))
                .chain(regions.rejected.iter().map(|r| (r.start, r.end)))
                .collect();
            p.mergeable.retain_within(&live);
        }
        p.anonymous = regions
            .eligible
            .iter()
            .filter(|r| r.kind == RegionKind::Anonymous)
            .map(|r| (r.start, r.end))
            .collect();
        Ok(regions)
    }

    fn mark_gone(&mut self, pid: u32) {
        if !self.gone.contains(&pid) {
            self.gone.push(pid);
        }
        if let Some(p) = self.procs.get_mut(&pid) {
            p.gone = true;
        }
    }

    /// The region and live process of `page`, or the core's error.
    fn locate(&self, page: PageRef) -> Result<(&LinuxRegion, u32), SourceError> {
        let r = self
            .regions
            .get(&page.region)
            .ok_or(SourceError::Gone(page.region))?;
        if page.page >= r.pages {
            return Err(SourceError::OutOfRange(page));
        }
        match self.procs.get(&r.pid) {
            Some(p) if !p.gone => Ok((r, r.pid)),
            _ => Err(SourceError::Gone(page.region)),
        }
    }

    fn fail(&mut self, region: RegionId, pid: u32, e: LinuxError) -> SourceError {
        if e.is_gone() {
            self.mark_gone(pid);
        }
        e.into_source_error(region)
    }

    /// The region and live process of pages `first..first + len` of
    /// `region`, or the core's error (the run passes the region's end:
    /// `OutOfRange`).
    fn locate_run(
        &self,
        region: RegionId,
        first: u32,
        len: usize,
    ) -> Result<(&LinuxRegion, u32), SourceError> {
        let (r, pid) = self.locate(PageRef {
            region,
            page: first,
        })?;
        if first as u64 + len as u64 > r.pages as u64 {
            return Err(SourceError::OutOfRange(PageRef {
                region,
                page: r.pages,
            }));
        }
        Ok((r, pid))
    }

    /// Fills `out[i]` with what is known about page `first + i` of
    /// `region`, in one pagemap read and clustered kpageflags reads.
    pub fn inspect(
        &mut self,
        region: RegionId,
        first: u32,
        out: &mut [PageInfo],
    ) -> Result<(), SourceError> {
        let (r, pid) = self.locate_run(region, first, out.len())?;
        let addr = r.address(first);
        let res = self
            .procs
            .get_mut(&pid)
            .expect("located")
            .inspector
            .inspect(addr, out);
        res.map_err(|e| self.fail(region, pid, e))
    }

    /// The state of page `first + i` of `region` in `out[i]`, from one
    /// pagemap read and the kpageflags words of only those pages whose
    /// class needs them ([`crate::inspect::flags_needed`]): in a region
    /// that is not `VM_MERGEABLE`, an exclusively mapped anonymous page is
    /// neither the zero page nor a KSM page. Guest RAM before it is
    /// marked is nearly all such pages, and its frames are scattered, so
    /// [`LinuxSource::inspect`] would spend a `pread` of kpageflags on
    /// nearly every one. Once merged, the same RAM is nearly all KSM pages
    /// on scattered frames, which the accounting passes look at again and
    /// again: a page mapped more than once in a mergeable anonymous VMA
    /// whose frame was seen as a KSM page within [`KSM_FRAMES_TRUSTED`] is
    /// taken as merged without a read. The range counts as mergeable if
    /// the region was at the last refresh or pagesift has advised any of
    /// it since.
    pub fn page_states(
        &mut self,
        region: RegionId,
        first: u32,
        out: &mut [PageState],
    ) -> Result<(), SourceError> {
        let (r, pid) = self.locate_run(region, first, out.len())?;
        let (addr, anon) = (r.address(first), r.kind == RegionKind::Anonymous);
        let p = &self.procs[&pid];
        let mergeable = r.mergeable
            || p.mergeable
                .overlaps(addr, addr + out.len() as u64 * PAGE_SIZE);
        self.entries.clear();
        self.entries.resize(out.len(), PagemapEntry(0));
        if let Err(e) = p.inspector.pagemap().read(addr, &mut self.entries) {
            return Err(self.fail(region, pid, e));
        }
        let second = frame_clock(self.ksm_frames_since);
        let trusted_since = second.saturating_sub(KSM_FRAMES_TRUSTED.as_secs() as u32);
        let b = &mut self.batch;
        b.pfns.clear();
        b.of_pfn.clear();
        b.known_ksm.clear();
        for (i, e) in self.entries.iter().enumerate() {
            let Some(pfn) = e.pfn() else { continue };
            if !crate::inspect::flags_needed(*e, anon, mergeable) {
                continue;
            }
            // A frame mapped more than once that was a KSM page lately is
            // one still (see KSM_FRAMES_TRUSTED for the exception): in
            // merged guest RAM these reads were 16 % of the daemon's CPU
            // samples (quick vm-boot, perf by hand, 2026-12-05;
            // docs/daemon-cpu.md).
            // Asked only where one of the two rules below can use it.
            let seen = (mergeable && !e.file_or_shared())
                .then(|| self.ksm_frames.get(&pfn).copied())
                .flatten();
            if mergeable
                && anon
                && !e.exclusive()
                && !e.file_or_shared()
                && seen.is_some_and(|at| at >= trusted_since)
            {
                b.known_ksm.push(i);
                continue;
            }
            // In a mergeable VMA an exclusive page is a KSM page only if it
            // was one while shared, with a sharer gone since: a page turns
            // KSM by getting a second mapping. So only the frames seen as
            // KSM pages are read; the others are ordinary pages. (Read for
            // every page, scattered frames cost a kpageflags read each:
            // in `pagesift bench --quick --only cow-broken-2pct`, one run
            // each by hand on 2026-11-27, AMD EPYC, 2 cores, accounting
            // took 0.14 CPU-s against ksmd's 0.15 before, 0.01 after, by
            // the daemon's per-phase summary.) A KSM page never seen
            // shared saves nothing, so calling it ordinary is what the
            // accounting wants.
            let ordinary = mergeable && e.exclusive() && !e.file_or_shared() && seen.is_none();
            if !ordinary {
                b.pfns.push(pfn);
                b.of_pfn.push(i);
            }
        }
        if b.pfns.contains(&0) {
            return Err(pfn_hidden());
        }
        b.flags.clear();
        b.flags.resize(b.pfns.len(), KpfFlags(0));
        if let Err(e) = self.kpf.read_many(&b.pfns, &mut b.flags) {
            return Err(SourceError::Other(e.to_string()));
        }
        for (o, e) in out.iter_mut().zip(&self.entries) {
            *o = crate::inspect::classify(*e, None).state();
        }
        for &i in &b.known_ksm {
            out[i] = PageState::Merged;
        }
        for (k, (&i, &f)) in b.of_pfn.iter().zip(&b.flags).enumerate() {
            out[i] = crate::inspect::classify(self.entries[i], Some(f)).state();
            if f.ksm() {
                if self.ksm_frames.len() >= KSM_FRAMES_KEPT {
                    self.ksm_frames.clear();
                }
                self.ksm_frames.insert(b.pfns[k], second);
            } else {
                // A KSM frame freed and given out again.
                self.ksm_frames.remove(&b.pfns[k]);
            }
        }
        Ok(())
    }

    /// The runs of present pages of `region` (zero-page mappings
    /// included), as `[first, end)` page offsets in order, from
    /// `PAGEMAP_SCAN` walks of the page tables: no entry is read for the
    /// holes, so a sparse region (an idle guest's RAM, a JIT's reserved
    /// code buffer) costs a look at its populated parts only.
    /// `Unsupported` before Linux 6.7.
    pub fn present_page_runs(&mut self, region: RegionId) -> Result<Vec<(u32, u32)>, SourceError> {
        let (r, pid) = self.locate(PageRef { region, page: 0 })?;
        let (start, pages) = (r.address(0), r.pages);
        let end = start + u64::from(pages) * PAGE_SIZE;
        let runs = self
            .procs
            .get(&pid)
            .expect("located")
            .inspector
            .pagemap()
            .present_runs(start, end);
        let runs = runs.map_err(|e| self.fail(region, pid, e))?;
        Ok(runs
            .iter()
            .map(|run| {
                let first = ((run.start.max(start) - start) / PAGE_SIZE) as u32;
                let last = ((run.end.min(end) - start).div_ceil(PAGE_SIZE)) as u32;
                (first, last)
            })
            .filter(|(a, b)| a < b)
            .collect())
    }

    /// The write tracker behind [`MemorySource::take_written`]: the caller
    /// registers and unregisters ranges with it (it needs an injector).
    #[cfg(target_arch = "x86_64")]
    pub fn write_tracker(&mut self) -> &mut crate::uffd::WriteTracker {
        &mut self.writes
    }

    /// The write tracker, to look at.
    pub fn writes(&self) -> &crate::uffd::WriteTracker {
        &self.writes
    }

    /// The process and address of a page.
    pub fn page_address(&self, page: PageRef) -> Option<(u32, u64)> {
        let r = self.regions.get(&page.region)?;
        (page.page < r.pages).then(|| (r.pid, r.address(page.page)))
    }

    /// Reads as many leading `pages` as are present, re-checking presence
    /// (and exclusivity, which picks the read path) first; returns how many
    /// were read and, if fewer than all, why.
    fn read_checked(
        &mut self,
        pages: &[PageRef],
        out: &mut [PageWords],
    ) -> (usize, Option<SourceError>) {
        let mut done = 0;
        while done < pages.len() {
            // A group: consecutive pages of one process.
            let pid = match self.locate(pages[done]) {
                Ok((_, pid)) => pid,
                Err(e) => return (done, Some(e)),
            };
            self.addrs.clear();
            self.unpinned.clear();
            let mut stop = None;
            for &p in &pages[done..] {
                match self
                    .locate(p)
                    .map(|(r, q)| (q, r.address(p.page), r.mergeable))
                {
                    Ok((q, a, mergeable)) if q == pid => {
                        self.addrs.push(a);
                        // KSM pages live only in VM_MERGEABLE regions; there
                        // the KSM bit is not checked here, so never pin.
                        self.unpinned.push(mergeable);
                    }
                    Ok(_) => break,
                    Err(e) => {
                        stop = Some(e);
                        break;
                    }
                }
            }
            let n = self.addrs.len();
            let region = pages[done].region;
            if let Err(e) = self.check_entries(pid) {
                return (done, Some(self.fail(region, pid, e)));
            }
            let k = match self.read_entries(pid, region, &mut out[done..done + n]) {
                Ok(k) => k,
                Err((i, e)) => {
                    let e = e.unwrap_or_else(|| {
                        let p = pages[done + i];
                        SourceError::Other(format!(
                            "page {} of region {} was unmapped before it could be read",
                            p.page, p.region.0
                        ))
                    });
                    return (done + i, Some(e));
                }
            };
            done += k;
            if k < n {
                let p = pages[done];
                return (
                    done,
                    Some(SourceError::Other(format!(
                        "page {} of region {} is not present; pagesift never reads a \
                         non-present page (it would fault it in)",
                        p.page, p.region.0
                    ))),
                );
            }
            if let Some(e) = stop {
                return (done, Some(e));
            }
        }
        (done, None)
    }

    /// Reads the pages at `self.addrs` into `out`, each by the path its
    /// pagemap entry in `self.checked` allows (`self.unpinned[i]` set: never
    /// pinned), up to the first that the entry shows not resident: returns
    /// how many leading pages were read. On a failure, the index of the
    /// page that failed and the error (`None`: it was unmapped before it
    /// could be read).
    fn read_entries(
        &mut self,
        pid: u32,
        region: RegionId,
        out: &mut [PageWords],
    ) -> Result<usize, (usize, Option<SourceError>)> {
        let n = self.addrs.len();
        // Leading pages that are resident, each with its read path.
        let mut k = 0;
        while k < n {
            let e = self.checked[k];
            if !e.present() || e.swapped() {
                break;
            }
            if !crate::read::safe_to_pin(e, self.unpinned[k]) {
                self.unpinned[k] = true;
            }
            k += 1;
        }
        // Read runs of pages that share a path, in order.
        let mut i = 0;
        while i < k {
            let path = self.unpinned[i];
            let mut j = i + 1;
            while j < k && self.unpinned[j] == path {
                j += 1;
            }
            let reader = &mut self.procs.get_mut(&pid).expect("located").reader;
            let res = if path {
                reader.read_pages_unpinned(&self.addrs[i..j], &mut out[i..j])
            } else {
                reader.read_pages(&self.addrs[i..j], &mut out[i..j])
            };
            let got = match res {
                Ok(g) => g,
                Err(e) => return Err((i, Some(self.fail(region, pid, e)))),
            };
            if got < j - i {
                return Err((i + got, None));
            }
            i = j;
        }
        Ok(k)
    }

    /// The states of pages `first..first + states.len()` of `region`, as
    /// [`LinuxSource::page_states`] gives them, and the contents of the
    /// `Present` ones, in order, in `out` (the `k`-th present page in
    /// `out[k]`): returns how many of them were read (fewer than all if
    /// one was unmapped meanwhile). The read goes by the pagemap entries
    /// the states came from, a moment before, instead of reading pagemap
    /// again as [`MemorySource::read_pages`] must for pages it is merely
    /// given: in the exact sweep, that second read was a tenth of the
    /// sweep's CPU (a vm-boot run's profile, docs/daemon-cpu.md).
    pub fn read_present(
        &mut self,
        region: RegionId,
        first: u32,
        states: &mut [PageState],
        out: &mut [PageWords],
    ) -> Result<usize, SourceError> {
        self.page_states(region, first, states)?;
        let (r, pid) = self.locate_run(region, first, states.len())?;
        let start = r.address(first);
        let end = start + states.len() as u64 * PAGE_SIZE;
        // KSM pages live only in mergeable ranges: as in `page_states`,
        // those pagesift advised since the last refresh count too.
        let never_pin = r.mergeable || self.procs[&pid].mergeable.overlaps(start, end);
        self.addrs.clear();
        self.checked.clear();
        for (i, s) in states.iter().enumerate() {
            if *s == PageState::Present {
                self.addrs.push(start + i as u64 * PAGE_SIZE);
                self.checked.push(self.entries[i]);
            }
        }
        self.unpinned.clear();
        self.unpinned.resize(self.addrs.len(), never_pin);
        let n = self.addrs.len();
        assert!(out.len() >= n, "output shorter than the present pages");
        match self.read_entries(pid, region, &mut out[..n]) {
            Ok(k) => Ok(k),
            Err((i, None)) => Ok(i),
            Err((_, Some(e))) => Err(e),
        }
    }

    /// Fills `self.checked[i]` with the current pagemap entry of
    /// `self.addrs[i]`, from clustered pagemap reads.
    fn check_entries(&mut self, pid: u32) -> Result<(), LinuxError> {
        let pagemap: &Pagemap = self.procs[&pid].inspector.pagemap();
        let n = self.addrs.len();
        self.order.clear();
        self.order.extend(0..n);
        let addrs = &self.addrs;
        self.order.sort_unstable_by_key(|&i| addrs[i]);
        self.checked.clear();
        self.checked.resize(n, PagemapEntry(0));
        // Nearby pages share one pread: a gap of up to 32 pages costs less
        // than another syscall (measured: 0.7 µs per call, ~35 ns per
        // entry).
        const GAP: u64 = 32 * crate::PAGE_SIZE;
        const SPAN: u64 = 4096 * crate::PAGE_SIZE;
        let mut k = 0;
        while k < n {
            let first = addrs[self.order[k]];
            let mut last = first;
            let mut j = k + 1;
            while j < n {
                let a = addrs[self.order[j]];
                if a - last > GAP || a - first >= SPAN {
                    break;
                }
                last = a;
                j += 1;
            }
            let count = ((last - first) / crate::PAGE_SIZE + 1) as usize;
            self.entries.clear();
            self.entries.resize(count, PagemapEntry(0));
            pagemap.read(first, &mut self.entries)?;
            for &i in &self.order[k..j] {
                self.checked[i] = self.entries[((addrs[i] - first) / crate::PAGE_SIZE) as usize];
            }
            k = j;
        }
        Ok(())
    }
}

/// The error for a present page whose PFN pagemap hid: the source was
/// opened without `CAP_SYS_ADMIN`.
fn pfn_hidden() -> SourceError {
    SourceError::Other(
        LinuxError::MissingCapability {
            cap: crate::Capability::SysAdmin,
            why: crate::error::WHY_PFN,
        }
        .to_string(),
    )
}

/// Scratch buffers of one [`MemorySource::sample_pages`] call, kept
/// between calls so a batch allocates nothing.
#[derive(Debug, Default)]
struct SampleScratch {
    /// (pid, address, index in the batch) of the batch's located pages,
    /// sorted.
    order: Vec<(u32, u64, usize)>,
    /// Frames whose flags are read, and the batch index of each.
    pfns: Vec<u64>,
    of_pfn: Vec<usize>,
    flags: Vec<KpfFlags>,
    /// Indices taken as KSM pages without a read ([`LinuxSource::page_states`]).
    known_ksm: Vec<usize>,
    /// Per located page of one process: its flags, if read.
    page_flags: Vec<Option<KpfFlags>>,
    /// Addresses to read by each path, and the batch index of each.
    pinned: (Vec<u64>, Vec<usize>),
    unpinned: (Vec<u64>, Vec<usize>),
    /// Merged pages of one process to read: batch index and frame.
    merged_read: Vec<(usize, u64)>,
    words: Option<PageBuffer>,
}

impl LinuxSource {
    /// [`MemorySource::sample_pages`] for the located pages of one
    /// process: `self.batch.order[range]`.
    fn sample_process(
        &mut self,
        range: std::ops::Range<usize>,
        pages: &[PageRef],
        out: &mut [PageWords],
        states: &mut [Result<PageState, SourceError>],
        read: &mut [bool],
    ) {
        let pid = self.batch.order[range.start].0;
        self.addrs.clear();
        self.addrs
            .extend(self.batch.order[range.clone()].iter().map(|&(_, a, _)| a));
        if let Err(e) = self.check_entries(pid) {
            let first = pages[self.batch.order[range.start].2].region;
            let err = self.fail(first, pid, e);
            for &(_, _, i) in &self.batch.order[range] {
                states[i] = Err(match &err {
                    SourceError::Gone(_) => SourceError::Gone(pages[i].region),
                    other => other.clone(),
                });
            }
            return;
        }
        // Flags only where the class needs them (see inspect::flags_needed):
        // an exclusive anonymous page outside a mergeable VMA, most samples,
        // is neither the zero page nor a KSM page.
        let b = &mut self.batch;
        b.pfns.clear();
        b.of_pfn.clear();
        b.page_flags.clear();
        for (m, &(_, _, i)) in b.order[range.clone()].iter().enumerate() {
            let e = self.checked[m];
            b.page_flags.push(None);
            let r = &self.regions[&pages[i].region];
            let anon = r.kind == RegionKind::Anonymous;
            if let Some(pfn) = e.pfn()
                && crate::inspect::flags_needed(e, anon, r.mergeable)
            {
                b.pfns.push(pfn);
                b.of_pfn.push(m);
            }
        }
        if b.pfns.contains(&0) {
            let err = pfn_hidden();
            for &(_, _, i) in &b.order[range] {
                states[i] = Err(err.clone());
            }
            return;
        }
        b.flags.clear();
        b.flags.resize(b.pfns.len(), KpfFlags(0));
        if let Err(e) = self.kpf.read_many(&b.pfns, &mut b.flags) {
            let err = SourceError::Other(e.to_string());
            for &(_, _, i) in &b.order[range] {
                states[i] = Err(err.clone());
            }
            return;
        }
        for (&m, &f) in b.of_pfn.iter().zip(&b.flags) {
            b.page_flags[m] = Some(f);
        }
        // Classes, and which pages to read by which path.
        b.pinned.0.clear();
        b.pinned.1.clear();
        b.unpinned.0.clear();
        b.unpinned.1.clear();
        b.merged_read.clear();
        let second = frame_clock(self.ksm_frames_since);
        let known_since = second.saturating_sub(KSM_CONTENT_KNOWN.as_secs() as u32);
        for (m, &(_, addr, i)) in b.order[range.clone()].iter().enumerate() {
            let e = self.checked[m];
            let class = crate::inspect::classify(e, b.page_flags[m]);
            let state = class.state();
            states[i] = Ok(state);
            if !matches!(state, PageState::Present | PageState::Merged) {
                continue;
            }
            if class == PageClass::Merged
                && let Some(pfn) = e.pfn()
            {
                // Its content is in the caller's index already (see
                // KSM_CONTENT_KNOWN).
                if (self.ksm_contents_read.get(&pfn)).is_some_and(|&at| at >= known_since) {
                    continue;
                }
                b.merged_read.push((i, pfn));
            }
            let mergeable = self.regions[&pages[i].region].mergeable;
            let pin = !mergeable && crate::read::safe_to_pin(e, class == PageClass::Merged);
            let path = if pin { &mut b.pinned } else { &mut b.unpinned };
            path.0.push(addr);
            path.1.push(i);
        }
        // Read them right after their entries were read.
        let most = b.pinned.0.len().max(b.unpinned.0.len());
        if b.words.as_ref().is_none_or(|w| w.len() < most) {
            b.words = Some(PageBuffer::new(most.max(64)));
        }
        let reader = &mut self.procs.get_mut(&pid).expect("located").reader;
        let words = b.words.as_mut().expect("allocated");
        for pinned in [true, false] {
            let (addrs, idx) = if pinned { &b.pinned } else { &b.unpinned };
            if addrs.is_empty() {
                continue;
            }
            let buf = &mut words.pages_mut()[..addrs.len()];
            let got = if pinned {
                reader.read_pages(addrs, buf)
            } else {
                reader.read_pages_unpinned(addrs, buf)
            };
            // Pages past a failed read stay unread (read[i] false): the
            // sampler skips them, as it skips a page unmapped in between.
            let got = got.unwrap_or(0);
            for (k, &i) in idx.iter().enumerate().take(got) {
                out[i] = buf[k];
                read[i] = true;
            }
        }
        if self.ksm_contents_read.len() + b.merged_read.len() > KSM_FRAMES_KEPT {
            self.ksm_contents_read.clear();
        }
        for &(i, pfn) in &b.merged_read {
            if read[i] {
                self.ksm_contents_read.insert(pfn, second);
            }
        }
    }
}

/// Whole seconds since `since` (`ksm_frames_since`): the clock of the
/// frame tables (`ksm_frames`, `ksm_contents_read`).
fn frame_clock(since: Instant) -> u32 {
    since.elapsed().as_secs() as u32
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (best effort).
fn raise_open_file_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let mut l = getrlimit(Resource::Nofile);
    if l.current < l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
}

fn open_proc(info: ProcessInfo) -> Result<Proc, LinuxError> {
    let pid = info.pid;
    Ok(Proc {
        inspector: PageInspector::open(pid)?,
        reader: RemoteReader::new(pid)?,
        info,
        gone: false,
        mergeable: RangeSet::new(),
        anonymous: RangeSet::new(),
        smaps_at: None,
        smaps_reads: 0,
        smaps_last: None,
    })
}

impl MemorySource for LinuxSource {
    /// Answered by the [`write_tracker`](LinuxSource::write_tracker) for
    /// pages of tracked ranges (written since last asked; re-arms); `None`
    /// elsewhere.
    fn take_written(&mut self, page: PageRef) -> Option<bool> {
        #[cfg(target_arch = "x86_64")]
        {
            let (pid, addr) = self.page_address(page)?;
            self.writes.take_written(pid, addr)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = page;
            None
        }
    }

    fn regions(&self) -> Vec<RegionInfo> {
        self.regions
            .values()
            .filter(|r| self.procs.get(&r.pid).is_some_and(|p| !p.gone))
            .map(|r| RegionInfo {
                id: r.id,
                pages: r.pages,
                owner: r.pid,
            })
            .collect()
    }

    fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError> {
        let mut info = [PageInfo::default()];
        self.inspect(page.region, page.page, &mut info)?;
        Ok(info[0].class().state())
    }

    fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError> {
        match self.read_checked(&[page], std::slice::from_mut(out)) {
            (1, _) => Ok(()),
            (_, Some(e)) => Err(e),
            (_, None) => Err(SourceError::Other("page not read".into())),
        }
    }

    fn read_pages(&mut self, pages: &[PageRef], out: &mut [PageWords]) -> usize {
        let n = pages.len().min(out.len());
        self.read_checked(&pages[..n], &mut out[..n]).0
    }

    /// The batch in a few calls per process: its pages' pagemap entries
    /// (clustered reads), the kpageflags words of only those pages whose
    /// class needs them, and the contents of the `Present` and `Merged`
    /// ones right after, by path ([`crate::read`]): one
    /// `process_vm_readv` for the pages safe to pin, `/proc/PID/mem` for
    /// the rest. docs/sampling-cost.md has what each step costs.
    fn sample_pages(
        &mut self,
        pages: &[PageRef],
        out: &mut [PageWords],
        states: &mut [Result<PageState, SourceError>],
        read: &mut [bool],
    ) {
        let n = pages.len();
        assert!(out.len() >= n && states.len() >= n && read.len() >= n);
        read[..n].fill(false);
        let mut order = std::mem::take(&mut self.batch.order);
        order.clear();
        for (i, &p) in pages.iter().enumerate() {
            match self.locate(p) {
                Ok((r, pid)) => order.push((pid, r.address(p.page), i)),
                Err(e) => states[i] = Err(e),
            }
        }
        order.sort_unstable();
        self.batch.order = order;
        let mut k = 0;
        while k < self.batch.order.len() {
            let pid = self.batch.order[k].0;
            let j = k + self.batch.order[k..].partition_point(|&(q, _, _)| q == pid);
            self.sample_process(k..j, pages, out, states, read);
            k = j;
        }
    }
}
