//! The machine as the loop sees it: a [`MemorySource`] plus where each
//! region lives (process, addresses, VMA, `VM_MERGEABLE`), the processes
//! with the facts eligibility needs, and the cheap counters accounting
//! needs. [`LinuxTarget`] is the real one, over
//! [`pagesift_linux::LinuxSource`]; the loop's unit tests use a simulated
//! one.
//!
//! ## Refreshing cheaply
//! Re-reading every process's maps means reading `/proc/PID/smaps`, which
//! walks page tables (10–17 ms per resident GiB, measured): on a
//! host with GiBs of memory a refresh every second would cost more than the
//! whole bottom level's 0.2 % budget. So [`Target::processes_changed`] is a
//! single read of the `/proc` directory, and the loop refreshes only when
//! processes came or went, after it marked something, or when a long
//! interval has passed (mappings of a live process change too), never more
//! often than the refresh CPU share allows. A region unmapped and mapped
//! again at the same addresses keeps the size the check compares; its
//! frames tell ([`Target::check_renewed`]), at every check for every
//! region and in between for a few of the regions the lifespan rule
//! judges at each wake-up.

use crate::actuate::ProcKey;
use crate::eligibility::ProcessFacts;
use crate::ksm_stat_reads::KsmStatReads;
use pagesift_core::source::{MemorySource, PageState, RegionInfo, SourceError};
use pagesift_core::{PageRef, PageWords, RegionId};
use pagesift_linux::source::{DiscoveryCounts, SmapsReads};
use pagesift_linux::{LinuxSource, ProcessFilter, SourceConfig, host, ksm, proc, vma_counts};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

/// Where a region lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    /// Its process.
    pub proc: ProcKey,
    /// First address.
    pub start: u64,
    /// Length in pages.
    pub pages: u32,
    /// The VMA it is part of.
    pub vma_start: u64,
    /// End (exclusive) of that VMA.
    pub vma_end: u64,
    /// `VM_MERGEABLE` (VmFlags `mg`) at the last refresh.
    pub mergeable: bool,
    /// Mapped file or pseudo-path (`[heap]`), if any.
    pub name: Option<String>,
}

impl Span {
    /// End address (exclusive).
    pub fn end(&self) -> u64 {
        self.start + self.pages as u64 * pagesift_linux::PAGE_SIZE
    }
}

/// What changed since the last refresh, as far as a cheap look tells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Changes {
    /// Something changed that only a full refresh sorts out (the process
    /// list could not be read).
    pub processes: bool,
    /// Processes that came (any on the host, selected or not: reading them
    /// tells) or went (selected ones) since the last look.
    pub came_or_went: BTreeSet<u32>,
    /// Known processes whose address space changed size: re-reading their
    /// maps is enough.
    pub mappings: BTreeSet<u32>,
}

/// A selected process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcEntry {
    /// Its key.
    pub key: ProcKey,
    /// What eligibility looks at.
    pub facts: ProcessFacts,
    /// It set PR_SET_MEMORY_MERGE (`ksm_merge_any: yes`): it manages KSM
    /// itself and pagesift leaves its settings alone.
    pub merge_any: bool,
    /// The cgroup its savings are reported under (its cgroup v2 path; see
    /// `pagesift_linux::ProcessInfo::cgroup`).
    pub cgroup: String,
}

/// The machine, for the loop.
pub trait Target: MemorySource {
    /// Which processes came or went, and which selected ones mapped or
    /// unmapped memory (their address space changed size), since the last
    /// look (cheap: no maps are read).
    fn processes_changed(&mut self) -> Changes;
    /// Re-reads processes and their maps.
    fn refresh(&mut self) -> Result<(), String>;
    /// Re-reads the maps and facts of these processes only (after marks
    /// in them, or when they came or went); every other process and region
    /// stays as the last refresh found it. A target may refresh everything
    /// instead. `Ok(false)`: none of them is selected, nothing changed.
    fn refresh_pids(&mut self, pids: &BTreeSet<u32>) -> Result<bool, String>;
    /// The selected, live processes.
    fn processes(&self) -> Vec<ProcEntry>;
    /// Processes discovery could not open, with why.
    fn discovery_skipped(&self) -> Vec<(u32, String)>;
    /// Where a region lives.
    fn span(&self, id: RegionId) -> Option<Span>;
    /// States of pages `first..first + out.len()` of a region, without
    /// touching them.
    fn page_states(
        &mut self,
        id: RegionId,
        first: u32,
        out: &mut [PageState],
    ) -> Result<(), SourceError>;
    /// [`Target::page_states`] of pages `first..first + states.len()`,
    /// then the contents of the `Present` ones, in order (the `k`-th
    /// present page in `out[k]`): how many of those were read. `out` must
    /// hold `states.len()` pages. The default reads them with
    /// [`MemorySource::read_pages`], which looks at their states again.
    fn read_present(
        &mut self,
        id: RegionId,
        first: u32,
        states: &mut [PageState],
        out: &mut [PageWords],
    ) -> Result<usize, SourceError> {
        self.page_states(id, first, states)?;
        let pages: Vec<PageRef> = (states.iter().enumerate())
            .filter(|(_, s)| **s == PageState::Present)
            .map(|(i, _)| PageRef {
                region: id,
                page: first + i as u32,
            })
            .collect();
        Ok(self.read_pages(&pages, out))
    }
    /// The runs of present pages of a region (zero-page mappings
    /// included), as `[first, end)` page offsets in order, found without
    /// reading an entry per page; `None` where that cannot be done (then
    /// every page is looked at). The default finds none.
    fn present_runs(&mut self, _id: RegionId) -> Option<Vec<(u32, u32)>> {
        None
    }
    /// VMAs of a process: now, or as read at most a second ago if
    /// pagesift advised it nothing since (a budget check's bound).
    fn vma_count(&self, pid: u32) -> Option<u64>;
    /// `vm.max_map_count`.
    fn max_map_count(&self) -> u64;
    /// `/proc/vmstat` `cow_ksm`: copies made by writes to KSM pages, since
    /// boot.
    fn cow_ksm(&self) -> Option<u64>;
    /// Pids that exited since the last call.
    fn take_gone(&mut self) -> Vec<u32>;
    /// What the kernel says KSM merged of process `pid` now
    /// (`/proc/PID/ksm_stat`); `None` where it cannot be read, and then
    /// the loop's own per-region counts stand in. The default reads
    /// nothing.
    fn ksm_stat(&self, _pid: u32) -> Option<ksm::ProcessKsmStat> {
        None
    }
    /// Per selected process, the pages that joined its resident set
    /// beyond what it mapped anew (a guest filling its RAM, a heap growing
    /// in place), counted from start at each
    /// [`Target::processes_changed`]; monotonic per process. The default
    /// counts none.
    fn filled_pages(&self) -> BTreeMap<u32, u64> {
        BTreeMap::new()
    }
    /// Whether the process `key` names still lives as that process (its
    /// pid was not reused, it did not exec), selected or not, as of now:
    /// checked before every injection. The default knows the selected ones.
    fn same_process(&self, key: ProcKey) -> bool {
        self.processes().iter().any(|p| p.key == key)
    }
    /// Selects other processes, or cuts sub-regions at another size, or
    /// tracks another number of regions (a reloaded config); region ids
    /// may all change.
    fn reconfigure(&mut self, _filter: ProcessFilter, _limits: RegionLimits) -> Result<(), String> {
        Ok(())
    }
    /// Regions left out at the last refresh because there were more than
    /// [`RegionLimits::max_regions`].
    fn regions_left_out(&self) -> usize {
        0
    }
    /// Regions of at least `min_pages` pages, of those in `only` (all
    /// when `None`), that were unmapped and mapped again at the same
    /// addresses since they were last looked at (see
    /// `pagesift_linux::renewal`). They keep their ids. The default finds
    /// none (a simulated unmap is seen as such).
    fn check_renewed(
        &mut self,
        _min_pages: u32,
        _only: Option<&BTreeSet<RegionId>>,
    ) -> Vec<RegionId> {
        Vec::new()
    }
    /// Write-tracks exactly the `(pid, start, end)` ranges of `wanted`:
    /// starts the new ones, stops the ones not wanted any more (an empty
    /// set stops everything). Returns how many ranges are tracked. The
    /// default tracks nothing.
    fn sync_write_tracking(&mut self, _wanted: &[(u32, u64, u64)]) -> usize {
        0
    }
    /// The runs `[start, end)` (addresses) of a tracked range written since
    /// last asked (or since it was armed); `None` if it is not tracked.
    fn written_runs(&mut self, _pid: u32, _start: u64, _end: u64) -> Option<Vec<(u64, u64)>> {
        None
    }
    /// pagesift made `[start, end)` of `pid` mergeable (`mergeable`) or
    /// unmergeable: discovery may take the range's `mg` flag from this
    /// instead of reading smaps.
    fn note_advised(&mut self, _pid: u32, _start: u64, _end: u64, _mergeable: bool) {}
    /// What is known of `pid`'s mergeable ranges may be wrong (a call
    /// failed part-way): the next refresh reads them from smaps.
    fn distrust_mergeable(&mut self, _pid: u32) {}
    /// How the processes' regions were read since start (maps, or smaps
    /// and why), and the live processes read from smaps, most reads
    /// first. The default read nothing.
    fn discovery(&self) -> (DiscoveryCounts, Vec<SmapsReads>) {
        (DiscoveryCounts::default(), Vec::new())
    }
}

/// How regions are cut from VMAs, and how many are tracked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RegionLimits {
    /// VMAs longer than this many pages become sub-regions of this size.
    pub subregion_pages: u32,
    /// Most regions tracked; beyond, the smallest are left out
    /// (`pagesift_linux::source`, "How many regions").
    pub max_regions: usize,
}

/// How long a process's VMA count read for a budget check answers the
/// next checks, if pagesift advised nothing in it meanwhile.
pub const VMA_COUNT_FRESH: Duration = Duration::from_secs(1);

/// A write-tracking registration: (pid, the userfaultfd's number in the
/// target, registered `[start, end)` ranges).
pub type Registration = (u32, i32, Vec<(u64, u64)>);

/// Where write tracking is written down before a batch that may open a
/// userfaultfd in a target: a daemon killed between that batch and the end
/// of its wake-up (when the crash ledger is saved with the descriptor's
/// number) must still leave it recorded, or its successor could not close
/// it (`crate::ledger`, [`crate::ledger::OPENING`]).
pub trait TrackJournal {
    /// Ranges of `pid` (started at `start_time`) are about to be
    /// registered by a batch that may open a descriptor; `before` lists
    /// the userfaultfds it has now. An error says why this could not be
    /// written down; then the batch does not run.
    fn intend_tracking(
        &mut self,
        pid: u32,
        start_time: u64,
        before: &[i32],
        ranges: &[(u64, u64)],
    ) -> Result<(), String>;
}

/// The live processes of this machine.
pub struct LinuxTarget {
    src: LinuxSource,
    filter: ProcessFilter,
    limits: RegionLimits,
    pids: BTreeSet<u32>,
    procs: Vec<ProcEntry>,
    /// Each selected process's address-space size (pages) at the last
    /// refresh: a change means it mapped or unmapped something, which the
    /// next check turns into a refresh (see [`Target::processes_changed`]).
    vm_pages: BTreeMap<u32, u64>,
    /// Each selected process's `statm` at the last check, for
    /// [`Target::filled_pages`].
    statm: BTreeMap<u32, proc::Statm>,
    /// Per selected process, the pages that joined its resident set
    /// beyond its growth in size, since start.
    filled: BTreeMap<u32, u64>,
    max_map_count: u64,
    /// Injects the write tracker's userfaultfd calls.
    #[cfg(target_arch = "x86_64")]
    injector: pagesift_linux::inject::Injector,
    /// Processes write tracking gave up on (skipped or failed): not
    /// attached again for it.
    untrackable: BTreeSet<u32>,
    /// `/proc/vmstat`, kept open for `cow_ksm` (read with every status).
    vmstat: Option<proc::KeptOpen>,
    /// The status's `ksm_stat` reads, at a bounded cost.
    ksm_stats: RefCell<KsmStatReads>,
    /// Where batches that may open a descriptor are written down first
    /// (none: not written down, in tests without a ledger).
    journal: Option<Box<dyn TrackJournal>>,
}

impl LinuxTarget {
    /// Discovers the processes `filter` selects, cutting and counting
    /// regions as `limits` says.
    pub fn new(filter: ProcessFilter, limits: RegionLimits) -> Result<LinuxTarget, String> {
        let src = open_source(&filter, limits)?;
        let mut t = LinuxTarget {
            src,
            filter,
            limits,
            pids: host::pids().unwrap_or_default(),
            procs: Vec::new(),
            vm_pages: BTreeMap::new(),
            statm: BTreeMap::new(),
            filled: BTreeMap::new(),
            max_map_count: proc::max_map_count().unwrap_or(65_530),
            // As the actuator's: the count after each batch only starts the
            // next budget check, which the bound serves
            // (`InjectConfig::count_vmas_after`); with 10 000 VMAs a process
            // that count was a sixth of the daemon's CPU samples
            // (docs/reliability.md, "Memory with very many VMAs").
            #[cfg(target_arch = "x86_64")]
            injector: pagesift_linux::inject::Injector::new(pagesift_linux::inject::InjectConfig {
                count_vmas_after: false,
                ..Default::default()
            }),
            untrackable: BTreeSet::new(),
            vmstat: proc::KeptOpen::open("/proc/vmstat").ok(),
            ksm_stats: RefCell::new(KsmStatReads::default()),
            journal: None,
        };
        t.read_facts(None);
        Ok(t)
    }

    /// Writes batches that may open a userfaultfd in a target down in
    /// `journal` before they run.
    pub fn set_journal(&mut self, journal: Box<dyn TrackJournal>) {
        self.journal = Some(journal);
    }

    /// The userfaultfd registrations made for write tracking: (pid, the
    /// descriptor's number in the target, ranges), for the crash ledger.
    pub fn write_registrations(&self) -> Vec<Registration> {
        let w = self.src.writes();
        w.pids()
            .into_iter()
            .filter_map(|pid| Some((pid, w.target_fd(pid)?, w.ranges(pid).to_vec())))
            .collect()
    }

    /// The underlying source.
    pub fn source(&self) -> &LinuxSource {
        &self.src
    }

    /// The facts of the source's processes, read again for those in `only`
    /// (all when `None`); the others keep what was read before.
    fn read_facts(&mut self, only: Option<&BTreeSet<u32>>) {
        let looked_at = |pid: &u32| only.is_none_or(|o| o.contains(pid));
        let before: BTreeMap<u32, ProcEntry> = std::mem::take(&mut self.procs)
            .into_iter()
            .map(|p| (p.key.pid, p))
            .collect();
        self.procs = self
            .src
            .processes()
            .map(|p| {
                if !looked_at(&p.pid)
                    && let Some(e) = before.get(&p.pid)
                {
                    return e.clone();
                }
                let merge_any = ksm::ProcessKsmStat::of(p.pid)
                    .ok()
                    .and_then(|s| s.merge_any)
                    .unwrap_or(false);
                ProcEntry {
                    key: ProcKey {
                        pid: p.pid,
                        start_time: p.start_time,
                        image: p.image,
                    },
                    facts: ProcessFacts {
                        pid: p.pid,
                        comm: p.comm.clone(),
                        uid: p.uid,
                        cgroups: p.cgroups.clone(),
                        exe: host::exe(p.pid),
                    },
                    merge_any,
                    cgroup: p.cgroup.clone(),
                }
            })
            .collect();
        let live: BTreeSet<u32> = self.procs.iter().map(|p| p.key.pid).collect();
        self.vm_pages
            .retain(|pid, _| live.contains(pid) && !looked_at(pid));
        for pid in live.iter().filter(|pid| looked_at(pid)) {
            if let Ok(n) = proc::vm_pages(*pid) {
                self.vm_pages.insert(*pid, n);
            }
        }
    }

    /// The selected processes whose address space changed size since the
    /// last refresh (one `statm` read each, about 2 µs measured). The same
    /// read counts the pages that filled mappings that kept their size
    /// ([`Target::filled_pages`]).
    fn mappings_changed(&mut self) -> BTreeSet<u32> {
        let mut changed = BTreeSet::new();
        let mut now = BTreeMap::new();
        for (&pid, &seen) in &self.vm_pages {
            let Ok(m) = proc::statm(pid) else {
                continue;
            };
            if m.size != seen {
                changed.insert(pid);
            }
            // Resident growth beyond the growth in size: memory that filled
            // mappings the process had. (Counting only where the size held
            // counted nothing for QEMU, which maps 16-18 000-page areas
            // while its guest boots: `statm` read once a second in a
            // vm-boot run on 2026-11-26.) A region mapped and filled
            // between two checks counts nothing; one filled later does,
            // but the sweep walks only regions older than
            // `scan.sweep_min_age_s`.
            if let Some(before) = self.statm.get(&pid) {
                let grew = m.resident.saturating_sub(before.resident);
                let mapped = m.size.saturating_sub(before.size);
                *self.filled.entry(pid).or_default() += grew.saturating_sub(mapped);
            } else {
                self.filled.entry(pid).or_default();
            }
            now.insert(pid, m);
        }
        self.filled.retain(|pid, _| now.contains_key(pid));
        self.statm = now;
        changed
    }
}

fn open_source(filter: &ProcessFilter, limits: RegionLimits) -> Result<LinuxSource, String> {
    LinuxSource::new(
        filter.clone(),
        SourceConfig {
            max_region_pages: limits.subregion_pages,
            max_regions: limits.max_regions,
            ..SourceConfig::default()
        },
    )
    .map_err(|e| e.to_string())
}

impl MemorySource for LinuxTarget {
    fn regions(&self) -> Vec<RegionInfo> {
        self.src.regions()
    }
    fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError> {
        self.src.page_state(page)
    }
    fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError> {
        self.src.read_page(page, out)
    }
    fn read_pages(&mut self, pages: &[PageRef], out: &mut [PageWords]) -> usize {
        self.src.read_pages(pages, out)
    }
    fn sample_pages(
        &mut self,
        pages: &[PageRef],
        out: &mut [PageWords],
        states: &mut [Result<PageState, SourceError>],
        read: &mut [bool],
    ) {
        self.src.sample_pages(pages, out, states, read)
    }
    fn take_written(&mut self, page: PageRef) -> Option<bool> {
        self.src.take_written(page)
    }
}

impl Target for LinuxTarget {
    fn processes_changed(&mut self) -> Changes {
        let mut changes = Changes::default();
        if !self.filter.pids.is_empty() {
            // Named pids: only their exits and their mappings matter.
            changes.came_or_went = (self.filter.pids.iter())
                .copied()
                .filter(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
                .collect();
        } else {
            match host::pids() {
                Ok(now) => {
                    let selected: BTreeSet<u32> = self.procs.iter().map(|p| p.key.pid).collect();
                    let came = now.difference(&self.pids).copied();
                    let went = (self.pids.difference(&now)).filter(|p| selected.contains(p));
                    changes.came_or_went = came.chain(went.copied()).collect();
                    changes.came_or_went.remove(&std::process::id());
                    self.pids = now;
                }
                Err(_) => changes.processes = true,
            }
        }
        changes.mappings = self.mappings_changed();
        changes
    }

    fn refresh(&mut self) -> Result<(), String> {
        self.src.refresh().map_err(|e| e.to_string())?;
        self.max_map_count = proc::max_map_count().unwrap_or(self.max_map_count);
        self.read_facts(None);
        Ok(())
    }

    fn refresh_pids(&mut self, pids: &BTreeSet<u32>) -> Result<bool, String> {
        if !self.src.refresh_pids(pids).map_err(|e| e.to_string())? {
            return Ok(false);
        }
        self.read_facts(Some(pids));
        Ok(true)
    }

    fn processes(&self) -> Vec<ProcEntry> {
        self.procs.clone()
    }

    fn filled_pages(&self) -> BTreeMap<u32, u64> {
        self.filled.clone()
    }

    fn discovery_skipped(&self) -> Vec<(u32, String)> {
        self.src.skipped().to_vec()
    }

    fn span(&self, id: RegionId) -> Option<Span> {
        let r = self.src.region(id)?;
        let proc = self
            .procs
            .iter()
            .find(|p| p.key.pid == r.pid)
            .map(|p| p.key)?;
        Some(Span {
            proc,
            start: r.start,
            pages: r.pages,
            vma_start: r.vma_start,
            vma_end: r.vma_end,
            mergeable: r.mergeable,
            name: r.path.as_ref().map(|p| p.display().to_string()),
        })
    }

    fn page_states(
        &mut self,
        id: RegionId,
        first: u32,
        out: &mut [PageState],
    ) -> Result<(), SourceError> {
        self.src.page_states(id, first, out)
    }

    fn present_runs(&mut self, id: RegionId) -> Option<Vec<(u32, u32)>> {
        self.src.present_page_runs(id).ok()
    }

    fn read_present(
        &mut self,
        id: RegionId,
        first: u32,
        states: &mut [PageState],
        out: &mut [PageWords],
    ) -> Result<usize, SourceError> {
        self.src.read_present(id, first, states, out)
    }

    /// Counting a process's VMAs means reading all of `/proc/PID/maps`
    /// (a guest's QEMU has hundreds of lines), and a wake-up that marks runs
    /// asks twice per process. The count is the one every budget check of
    /// this process shares (`pagesift_linux::vma_counts`), so the
    /// injector that runs the batch stands on it too. pagesift's own
    /// advice drops it ([`Target::note_advised`]: the next check counts
    /// exactly), and the process's own mappings move it, within
    /// [`VMA_COUNT_FRESH`], by a few VMAs against a budget of thousands.
    fn vma_count(&self, pid: u32) -> Option<u64> {
        let start_time = (self.procs.iter())
            .find(|p| p.key.pid == pid)
            .map(|p| p.key.start_time)
            .or_else(|| pagesift_linux::discover::identity(pid).map(|(st, _)| st))?;
        if let Some((n, at)) = vma_counts::known(pid, start_time)
            && at.elapsed() < VMA_COUNT_FRESH
        {
            return Some(n);
        }
        vma_counts::count(pid, start_time).ok().map(|(n, _)| n)
    }

    fn note_advised(&mut self, pid: u32, start: u64, end: u64, mergeable: bool) {
        vma_counts::forget(pid);
        self.src.note_advised(pid, start, end, mergeable);
    }

    fn distrust_mergeable(&mut self, pid: u32) {
        self.src.distrust_mergeable(pid);
    }

    fn regions_left_out(&self) -> usize {
        self.src.left_out()
    }

    fn discovery(&self) -> (DiscoveryCounts, Vec<SmapsReads>) {
        (self.src.discovery().clone(), self.src.smaps_reads())
    }

    fn check_renewed(
        &mut self,
        min_pages: u32,
        only: Option<&BTreeSet<RegionId>>,
    ) -> Vec<RegionId> {
        self.src.check_renewed(min_pages, only)
    }

    fn reconfigure(&mut self, filter: ProcessFilter, limits: RegionLimits) -> Result<(), String> {
        if filter == self.filter && limits == self.limits {
            return Ok(());
        }
        #[allow(unused_mut)]
        let mut src = open_source(&filter, limits)?;
        // The old source's write tracker goes with it: unregister its
        // ranges first (and close its userfaultfds in the targets), or
        // they would stay registered in processes nobody tracks any more.
        // What could not be taken out now (an attach skipped or failed)
        // moves to the new source's tracker: the next sync unregisters
        // every range nobody wants, and the ledger written at exit
        // records what is still left. Dropped with the old source, it
        // stayed in the target for good.
        #[cfg(target_arch = "x86_64")]
        {
            let old = self.src.write_tracker();
            old.untrack_all(&mut self.injector);
            *src.write_tracker() = std::mem::take(old);
        }
        // Processes of the old source that the new one does not select are
        // not "gone": forget them quietly.
        self.src = src;
        self.filter = filter;
        self.limits = limits;
        self.read_facts(None);
        Ok(())
    }

    fn max_map_count(&self) -> u64 {
        self.max_map_count
    }

    fn same_process(&self, key: ProcKey) -> bool {
        // Read now, not from the last refresh: an exec since then must stop
        // an injection of the old image's ranges.
        pagesift_linux::discover::identity(key.pid) == Some((key.start_time, key.image))
    }

    fn cow_ksm(&self) -> Option<u64> {
        let v = match &self.vmstat {
            Some(f) => ksm::KsmVmstat::read_from(f),
            None => ksm::KsmVmstat::read(),
        };
        v.ok().and_then(|v| v.cow_ksm)
    }

    /// Read again only when the last read is older than the rule of
    /// [`KsmStatReads`] allows: a status a second over hundreds of
    /// processes with thousands of VMAs would otherwise spend a good part
    /// of a core walking their VMAs in the kernel.
    fn ksm_stat(&self, pid: u32) -> Option<ksm::ProcessKsmStat> {
        let now = Instant::now();
        if let Some(stat) = self.ksm_stats.borrow().fresh(pid, now) {
            return stat;
        }
        let stat = ksm::ProcessKsmStat::of(pid).ok();
        (self.ksm_stats.borrow_mut()).record(pid, stat, now, now.elapsed());
        stat
    }

    fn take_gone(&mut self) -> Vec<u32> {
        let gone = self.src.take_gone();
        for &pid in &gone {
            self.ksm_stats.get_mut().forget(pid);
        }
        #[cfg(target_arch = "x86_64")]
        for &pid in &gone {
            self.src.write_tracker().forget(pid);
            self.untrackable.remove(&pid);
        }
        gone
    }

    #[cfg(target_arch = "x86_64")]
    fn sync_write_tracking(&mut self, wanted: &[(u32, u64, u64)]) -> usize {
        use pagesift_linux::inject::Outcome;
        use pagesift_linux::uffd::TrackOutcome;
        let wt = self.src.write_tracker();
        // Stop first: a range leaves tracking before anything marks it.
        let mut pids: BTreeSet<u32> = wanted.iter().map(|w| w.0).collect();
        pids.extend(self.procs.iter().map(|p| p.key.pid));
        // Processes that left the selection keep their registrations until
        // they are unregistered here.
        pids.extend(wt.pids());
        for &pid in &pids {
            let gone: Vec<(u64, u64)> = wt
                .ranges(pid)
                .iter()
                .copied()
                .filter(|&(s, e)| !wanted.contains(&(pid, s, e)))
                .collect();
            // A descriptor known with no range left (its close did not run
            // when it was opened) is closed too, unless the process has
            // ranges to track.
            let leftover = gone.is_empty()
                && wt.ranges(pid).is_empty()
                && wt.target_fd(pid).is_some()
                && !wanted.iter().any(|w| w.0 == pid);
            if gone.is_empty() && !leftover {
                continue;
            }
            tracing::debug!(pid, ranges = ?gone, "write tracking: unregister");
            // What did not run stays tracked (`WriteTracker::untrack`) and
            // is tried again at the next sync: forgotten, it stayed in the
            // target.
            match wt.untrack(&mut self.injector, pid, &gone) {
                Ok(Outcome::Skipped(why)) => {
                    tracing::debug!(pid, reason = %why, "could not stop write tracking yet");
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!(pid, error = %e, "could not stop write tracking yet");
                }
            }
        }
        let mut new: BTreeMap<u32, Vec<(u64, u64)>> = BTreeMap::new();
        for &(pid, s, e) in wanted {
            if !wt.ranges(pid).contains(&(s, e)) && !self.untrackable.contains(&pid) {
                new.entry(pid).or_default().push((s, e));
            }
        }
        for (pid, ranges) in new {
            if wt.opens_descriptor(pid)
                && let Some(j) = &mut self.journal
            {
                let Some((start_time, _)) = pagesift_linux::discover::identity(pid) else {
                    continue; // gone
                };
                let before = pagesift_linux::uffd::userfaultfds(pid);
                if let Err(e) = j.intend_tracking(pid, start_time, &before, &ranges) {
                    tracing::warn!(pid, error = %e, "write tracking not started");
                    continue;
                }
            }
            tracing::debug!(pid, ranges = ?ranges, "write tracking: register");
            match wt.track(&mut self.injector, pid, &ranges) {
                Ok(TrackOutcome::Tracking {
                    registered,
                    unmapped,
                }) => {
                    if registered.len() + unmapped.len() < ranges.len() {
                        // Some range refused (e.g. it uses userfaultfd
                        // itself): do not ask again every wake. A range
                        // unmapped meanwhile is no refusal: taken for one,
                        // a process whose regions come and go lost write
                        // tracking for good, and its heap buffer, rewritten
                        // with the same bytes, was then marked unwatched
                        // and thrashed (`pagesift bench --full --only
                        // short-lived`, 2026-12-04, by hand).
                        self.untrackable.insert(pid);
                    }
                    if !unmapped.is_empty() {
                        tracing::debug!(pid, ranges = ?unmapped, "write tracking: unmapped before registered");
                    }
                }
                Ok(TrackOutcome::Gone) => {}
                Ok(TrackOutcome::Skipped(why)) => {
                    tracing::debug!(pid, reason = %why, "write tracking skipped");
                    self.untrackable.insert(pid);
                }
                Err(e) => {
                    tracing::debug!(pid, error = %e, "write tracking failed");
                    self.untrackable.insert(pid);
                }
            }
        }
        wt.tracked_ranges()
    }

    #[cfg(target_arch = "x86_64")]
    fn written_runs(&mut self, pid: u32, start: u64, end: u64) -> Option<Vec<(u64, u64)>> {
        self.src.write_tracker().written(pid, start, end)
    }
}

/// A target's regions narrowed to eligible processes and minus the regions
/// the loop hides from distilling (promoted regions that ksmd is still
/// merging: sampling them would only re-find the duplicates that got them
/// promoted).
pub struct View<'a, T> {
    /// The target.
    pub target: &'a mut T,
    /// Eligible pids.
    pub allowed: &'a HashMap<u32, ProcKey>,
    /// Regions not shown.
    pub hidden: &'a BTreeSet<RegionId>,
}

impl<T: Target> MemorySource for View<'_, T> {
    fn regions(&self) -> Vec<RegionInfo> {
        self.target
            .regions()
            .into_iter()
            .filter(|r| self.allowed.contains_key(&r.owner) && !self.hidden.contains(&r.id))
            .collect()
    }
    fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError> {
        self.target.page_state(page)
    }
    fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError> {
        self.target.read_page(page, out)
    }
    fn read_pages(&mut self, pages: &[PageRef], out: &mut [PageWords]) -> usize {
        self.target.read_pages(pages, out)
    }
    fn sample_pages(
        &mut self,
        pages: &[PageRef],
        out: &mut [PageWords],
        states: &mut [Result<PageState, SourceError>],
        read: &mut [bool],
    ) {
        self.target.sample_pages(pages, out, states, read)
    }
    fn take_written(&mut self, page: PageRef) -> Option<bool> {
        self.target.take_written(page)
    }
}
