//! A simulated machine for the loop's unit tests: processes and regions in
//! an [`InMemorySource`], an actuator that flips `VM_MERGEABLE` on the
//! ranges it is given, and a ksmd that, on every pacing call, makes one
//! full pass merging every page of a mergeable region that has a twin in
//! some mergeable region. A range inside one region (a duplicate run) is
//! kept as a *partial* mark of that region instead of splitting it: its
//! pages are mergeable, the region's span is not. Unmarking part of a
//! mergeable region (a trim) splits it, as the kernel splits the VMA.

use crate::actuate::{Actuator, Advice, BatchOutcome, ProcKey};
use crate::eligibility::ProcessFacts;
use crate::ksmd::{KsmControl, KsmSample, Pacing};
use crate::target::{Changes, ProcEntry, Span, Target};
use pagesift_core::source::{InMemorySource, MemorySource, PageState, RegionInfo, SourceError};
use pagesift_core::{Nanos, PageRef, PageWords, RegionId};
use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::rc::Rc;

/// The simulated machine.
#[derive(Default)]
pub struct World {
    pub mem: InMemorySource,
    pub spans: BTreeMap<RegionId, Span>,
    pub procs: Vec<ProcEntry>,
    pub full_scans: u64,
    /// Pages the passes visited (KSM's `pages_scanned`).
    pub pages_visited: u64,
    /// Every batch the actuator received: (pid, calls).
    pub batches: Vec<(u32, Vec<Advice>)>,
    /// Pids whose injection is refused, with the reason.
    pub refuse: HashMap<u32, String>,
    /// Pids whose next injections meet a bad moment (answered
    /// `BatchOutcome::Busy`), and how many more times.
    pub busy: HashMap<u32, u32>,
    /// Pids whose next batch the injector abandons after this many calls
    /// (a call that could not start in time): the rest do not run.
    pub cut: HashMap<u32, usize>,
    /// The batches cut so: (pid, calls asked, calls run).
    pub cuts: Vec<(u32, usize, usize)>,
    pub vma_counts: HashMap<u32, u64>,
    pub max_map_count: u64,
    pub shares: Vec<f64>,
    pub restored: u32,
    /// Injection attempts per pid (refused ones included).
    pub attempts: HashMap<u32, u32>,
    pub next_addr: u64,
    pub gone: Vec<u32>,
    /// Mergeable ranges inside regions: (pid, start, end).
    pub partial: Vec<(u32, u64, u64)>,
    /// Write-tracked ranges: (pid, start, end).
    pub tracked: Vec<(u32, u64, u64)>,
    /// Every range that was ever write-tracked.
    pub ever_tracked: Vec<(u32, u64, u64)>,
    /// ksmd merges only while it is paced above the trickle (a real ksmd
    /// at the trickle takes minutes to get round); off by default: it
    /// merges everything mergeable on every pace call.
    pub idle_at_trickle: bool,
    /// At the trickle, ksmd makes its pass on every `trickle_every`-th
    /// pace call only (0 or 1: every call): a real ksmd comes round in
    /// seconds, long after a write broke a merged page.
    pub trickle_every: u32,
    trickle_calls: u32,
    /// Above the trickle, ksmd makes its pass on every `merge_every`-th
    /// pace call only (0 or 1: every call): a real ksmd's full scan of a
    /// large mergeable set takes many seconds.
    pub merge_every: u32,
    merge_calls: u32,
    /// Pages whose states were read, per region (accounting's and the
    /// sweep's reads).
    pub states_read: HashMap<RegionId, u64>,
    /// `/proc/vmstat` `cow_ksm`, if the test keeps it (adding the merged
    /// pages it writes); `None`: the kernel's figure is unknown.
    pub cow_ksm: Option<u64>,
    /// A region was mapped or unmapped since the daemon last asked (what
    /// the real target learns from statm), taken as processes that came or
    /// went.
    pub maps_changed: bool,
    /// Processes whose address space changed size since the daemon last
    /// asked (what the real target learns from statm).
    pub sizes_changed: BTreeSet<u32>,
    /// Processes that came or went since the daemon last asked (what the
    /// real target learns from /proc's pid list).
    pub came_or_went: BTreeSet<u32>,
    /// Regions mapped anew in place since the daemon last looked
    /// ([`World::renew`]).
    pub renewed: Vec<RegionId>,
    /// The refreshes the daemon asked for, in order: `None` for a full
    /// one, the pids for one of some processes only.
    pub refreshes: Vec<Option<Vec<u32>>>,
}

/// A shared handle on the world.
pub type Shared = Rc<RefCell<World>>;

pub fn world() -> Shared {
    Rc::new(RefCell::new(World {
        mem: InMemorySource::new(),
        max_map_count: 65_530,
        next_addr: 0x7f00_0000_0000,
        ..World::default()
    }))
}

impl World {
    /// Adds a process.
    pub fn spawn(&mut self, pid: u32, comm: &str, merge_any: bool) {
        let cgroup = format!("/test.slice/{comm}.scope");
        self.procs.push(ProcEntry {
            key: ProcKey {
                pid,
                start_time: 100 + pid as u64,
                image: 0,
            },
            facts: ProcessFacts {
                pid,
                comm: comm.into(),
                uid: 1000,
                cgroups: vec![cgroup.clone()],
                exe: Some(format!("/usr/bin/{comm}").into()),
            },
            merge_any,
            cgroup,
        });
    }

    /// Maps a region with the given content ids into `pid`; `mergeable`
    /// as if the process had marked it itself.
    pub fn map(&mut self, pid: u32, contents: &[u64], mergeable: bool) -> RegionId {
        let start = self.next_addr;
        self.next_addr += contents.len() as u64 * 4096 + (1 << 20);
        self.map_at(pid, start, contents, mergeable)
    }

    /// Maps a region at `start` (a program mapping again where it unmapped
    /// a region before: `mmap` usually returns the same hole).
    pub fn map_at(&mut self, pid: u32, start: u64, contents: &[u64], mergeable: bool) -> RegionId {
        let id = self.mem.map(pid, contents);
        self.maps_changed = true;
        let key = self
            .procs
            .iter()
            .find(|p| p.key.pid == pid)
            .expect("spawned")
            .key;
        let len = contents.len() as u64 * 4096;
        self.spans.insert(
            id,
            Span {
                proc: key,
                start,
                pages: contents.len() as u32,
                vma_start: start,
                vma_end: start + len,
                mergeable,
                name: None,
            },
        );
        id
    }

    /// Maps one VMA of `slices × per` pages with the given content ids,
    /// tracked as `slices` adjacent sub-regions.
    pub fn map_sliced(&mut self, pid: u32, contents: &[u64], per: usize) -> Vec<RegionId> {
        let key = self
            .procs
            .iter()
            .find(|p| p.key.pid == pid)
            .expect("spawned")
            .key;
        let vma_start = self.next_addr;
        let vma_end = vma_start + contents.len() as u64 * 4096;
        self.next_addr = vma_end + (1 << 20);
        contents
            .chunks(per)
            .enumerate()
            .map(|(i, c)| {
                let id = self.mem.map(pid, c);
                let start = vma_start + (i * per) as u64 * 4096;
                self.spans.insert(
                    id,
                    Span {
                        proc: key,
                        start,
                        pages: c.len() as u32,
                        vma_start,
                        vma_end,
                        mergeable: false,
                        name: None,
                    },
                );
                id
            })
            .collect()
    }

    /// Unmaps one region and maps `contents` at the same addresses between
    /// two looks of the daemon: the maps show the same line, and only the
    /// frames tell (`Target::check_renewed`). The new VMA is not mergeable.
    pub fn renew(&mut self, id: RegionId, contents: &[u64]) {
        let s = self.spans.get_mut(&id).expect("mapped");
        assert_eq!(s.pages as usize, contents.len(), "same size");
        s.mergeable = false;
        let (pid, start, end) = (s.proc.pid, s.start, s.start + u64::from(s.pages) * 4096);
        (self.partial).retain(|&(p, a, e)| p != pid || e <= start || end <= a);
        assert!(self.mem.renew(id, contents));
        self.renewed.push(id);
    }

    /// Cuts region `id` at page `at` into two VMAs, as an `madvise` over
    /// part of a VMA does in the kernel (the simulated actuator keeps such
    /// a mark partial instead): `id` keeps pages `..at`, and the rest is a
    /// new region, whose id is returned. Contents, states and marks stay.
    pub fn split(&mut self, id: RegionId, at: u32) -> RegionId {
        let new = self.mem.split(id, at).expect("inside the region");
        let s = self.spans.get_mut(&id).expect("mapped");
        let tail = Span {
            start: s.start + u64::from(at) * 4096,
            pages: s.pages - at,
            vma_start: s.start + u64::from(at) * 4096,
            ..s.clone()
        };
        s.pages = at;
        s.vma_end = tail.start;
        self.spans.insert(new, tail);
        self.maps_changed = true;
        new
    }

    /// Unmaps one region (`munmap` of its VMA), with the marks inside it.
    pub fn unmap(&mut self, id: RegionId) {
        self.maps_changed = true;
        if let Some(s) = self.spans.remove(&id) {
            let (start, end) = (s.start, s.start + u64::from(s.pages) * 4096);
            (self.partial).retain(|&(pid, a, e)| pid != s.proc.pid || e <= start || end <= a);
        }
        self.mem.unmap(id);
    }

    /// Unmaps every region of a process (its mm goes: exit or exec).
    fn unmap_all(&mut self, pid: u32) {
        let ids: Vec<RegionId> = self
            .spans
            .iter()
            .filter(|(_, s)| s.proc.pid == pid)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            self.spans.remove(&id);
            self.mem.unmap(id);
        }
    }

    /// Lets a process exit.
    pub fn exit(&mut self, pid: u32) {
        self.unmap_all(pid);
        self.procs.retain(|p| p.key.pid != pid);
        self.gone.push(pid);
    }

    /// The process calls execve: its memory goes (a new mm), it keeps its
    /// pid and start time, runs a new image (a new [`ProcKey::image`]),
    /// and takes the new program's name.
    pub fn exec(&mut self, pid: u32, comm: &str) {
        self.unmap_all(pid);
        let p = self
            .procs
            .iter_mut()
            .find(|p| p.key.pid == pid)
            .expect("spawned");
        p.key.image += 1;
        p.facts.comm = comm.into();
        p.facts.exe = Some(format!("/usr/bin/{comm}").into());
    }

    /// Pages of a region in the given state.
    pub fn count(&self, id: RegionId, state: PageState) -> u64 {
        let pages = self.spans[&id].pages;
        (0..pages)
            .filter(|&page| self.mem.state(PageRef { region: id, page }) == Ok(state))
            .count() as u64
    }

    /// Whether page `page` of region `id` is in a mergeable range.
    pub fn page_mergeable(&self, id: RegionId, page: u32) -> bool {
        let s = &self.spans[&id];
        let addr = s.start + page as u64 * 4096;
        s.mergeable
            || self
                .partial
                .iter()
                .any(|&(pid, a, b)| pid == s.proc.pid && a <= addr && addr < b)
    }

    /// What `MADV_UNMERGEABLE` does to a region's pages: every merged
    /// page is copied back.
    fn unmerge(&mut self, id: RegionId) {
        for page in 0..self.spans[&id].pages {
            let p = PageRef { region: id, page };
            if self.mem.state(p) == Ok(PageState::Merged) {
                let c = self.mem.content(p).unwrap();
                self.mem.write(p, c).unwrap();
            }
        }
    }

    /// One ksmd pass.
    fn ksmd_pass(&mut self) {
        let pages: Vec<PageRef> = self
            .spans
            .iter()
            .flat_map(|(id, s)| (0..s.pages).map(|page| PageRef { region: *id, page }))
            .filter(|p| self.page_mergeable(p.region, p.page))
            .collect();
        let mut counts: HashMap<u64, u64> = HashMap::new();
        for &p in &pages {
            if matches!(
                self.mem.state(p),
                Ok(PageState::Present | PageState::Merged)
            ) {
                *counts.entry(self.mem.content(p).unwrap()).or_default() += 1;
            }
        }
        for &p in &pages {
            if self.mem.state(p) == Ok(PageState::Present)
                && counts[&self.mem.content(p).unwrap()] >= 2
            {
                self.mem.merge(p).unwrap();
            }
        }
        self.pages_visited += pages.len() as u64;
        self.full_scans += 1;
    }
}

/// The target side of the world.
pub struct SimTarget(pub Shared);
/// The actuator side.
pub struct SimActuator(pub Shared);
/// The ksmd side.
pub struct SimKsm(pub Shared);

impl MemorySource for SimTarget {
    fn regions(&self) -> Vec<RegionInfo> {
        let w = self.0.borrow();
        w.mem
            .regions()
            .into_iter()
            .filter(|r| w.spans.contains_key(&r.id))
            .collect()
    }
    fn page_state(&mut self, page: PageRef) -> Result<PageState, SourceError> {
        self.0.borrow_mut().mem.page_state(page)
    }
    fn read_page(&mut self, page: PageRef, out: &mut PageWords) -> Result<(), SourceError> {
        self.0.borrow_mut().mem.read_page(page, out)
    }
    fn take_written(&mut self, page: PageRef) -> Option<bool> {
        self.0.borrow_mut().mem.take_written(page)
    }
}

impl SimTarget {
    /// The region whose span is exactly `[start, end)` of `pid`.
    fn region_at(&self, pid: u32, start: u64, end: u64) -> Option<(RegionId, u32)> {
        let w = self.0.borrow();
        w.spans
            .iter()
            .find(|(_, s)| s.proc.pid == pid && s.start == start && s.end() == end)
            .map(|(&id, s)| (id, s.pages))
    }
}

impl Target for SimTarget {
    /// In memory: the ranges are remembered; a range must be a region's
    /// whole span (what the loop asks for).
    fn sync_write_tracking(&mut self, wanted: &[(u32, u64, u64)]) -> usize {
        let mut w = self.0.borrow_mut();
        for r in wanted {
            if !w.ever_tracked.contains(r) {
                w.ever_tracked.push(*r);
            }
        }
        w.tracked = wanted.to_vec();
        w.tracked.len()
    }
    /// The pages of the region written since last asked (the in-memory
    /// source's written flags, which this resets), one run per page.
    fn written_runs(&mut self, pid: u32, start: u64, end: u64) -> Option<Vec<(u64, u64)>> {
        if !self.0.borrow().tracked.contains(&(pid, start, end)) {
            return None;
        }
        let (region, pages) = self.region_at(pid, start, end)?;
        let mut w = self.0.borrow_mut();
        let page_size = pagesift_linux::PAGE_SIZE;
        Some(
            (0..pages)
                .filter(|&page| w.mem.take_written(PageRef { region, page }) == Some(true))
                .map(|page| {
                    let a = start + u64::from(page) * page_size;
                    (a, a + page_size)
                })
                .collect(),
        )
    }

    fn processes_changed(&mut self) -> Changes {
        let w = &mut self.0.borrow_mut();
        Changes {
            processes: std::mem::take(&mut w.maps_changed),
            came_or_went: std::mem::take(&mut w.came_or_went),
            mappings: std::mem::take(&mut w.sizes_changed),
        }
    }
    fn check_renewed(
        &mut self,
        _min_pages: u32,
        only: Option<&std::collections::BTreeSet<RegionId>>,
    ) -> Vec<RegionId> {
        let mut w = self.0.borrow_mut();
        let (seen, kept) = std::mem::take(&mut w.renewed)
            .into_iter()
            .partition(|id| only.is_none_or(|o| o.contains(id)));
        w.renewed = kept;
        seen
    }
    fn refresh(&mut self) -> Result<(), String> {
        self.0.borrow_mut().refreshes.push(None);
        Ok(())
    }
    fn refresh_pids(&mut self, pids: &BTreeSet<u32>) -> Result<bool, String> {
        (self.0.borrow_mut().refreshes).push(Some(pids.iter().copied().collect()));
        Ok(true)
    }
    fn processes(&self) -> Vec<ProcEntry> {
        self.0.borrow().procs.clone()
    }
    fn discovery_skipped(&self) -> Vec<(u32, String)> {
        Vec::new()
    }
    fn span(&self, id: RegionId) -> Option<Span> {
        self.0.borrow().spans.get(&id).cloned()
    }
    fn page_states(
        &mut self,
        id: RegionId,
        first: u32,
        out: &mut [PageState],
    ) -> Result<(), SourceError> {
        let mut w = self.0.borrow_mut();
        *w.states_read.entry(id).or_default() += out.len() as u64;
        for (i, o) in out.iter_mut().enumerate() {
            *o = w.mem.state(PageRef {
                region: id,
                page: first + i as u32,
            })?;
        }
        Ok(())
    }
    fn present_runs(&mut self, id: RegionId) -> Option<Vec<(u32, u32)>> {
        let pages = self.span(id)?.pages;
        let w = self.0.borrow();
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for page in 0..pages {
            let state = w.mem.state(PageRef { region: id, page }).ok()?;
            if state == PageState::NotPresent {
                continue;
            }
            match runs.last_mut() {
                Some(run) if run.1 == page => run.1 = page + 1,
                _ => runs.push((page, page + 1)),
            }
        }
        Some(runs)
    }
    fn vma_count(&self, pid: u32) -> Option<u64> {
        Some(self.0.borrow().vma_counts.get(&pid).copied().unwrap_or(20))
    }
    fn max_map_count(&self) -> u64 {
        self.0.borrow().max_map_count
    }
    fn cow_ksm(&self) -> Option<u64> {
        self.0.borrow().cow_ksm
    }
    fn take_gone(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.0.borrow_mut().gone)
    }
}

impl Actuator for SimActuator {
    fn advise(&mut self, pid: u32, batch: &[Advice]) -> BatchOutcome {
        let mut w = self.0.borrow_mut();
        *w.attempts.entry(pid).or_default() += 1;
        if let Some(r) = w.refuse.get(&pid) {
            return BatchOutcome::Skipped(r.clone());
        }
        if let Some(n) = w.busy.get_mut(&pid).filter(|n| **n > 0) {
            *n -= 1;
            return BatchOutcome::Busy("a thread is inside an rseq critical section".into());
        }
        if !w.procs.iter().any(|p| p.key.pid == pid) {
            return BatchOutcome::Gone;
        }
        let batch = match w.cut.remove(&pid) {
            Some(n) => {
                let ran = n.min(batch.len());
                w.cuts.push((pid, batch.len(), ran));
                &batch[..ran]
            }
            None => batch,
        };
        // The loop stops write tracking before it marks a range.
        for a in batch.iter().filter(|a| a.mergeable) {
            assert!(
                !w.tracked
                    .iter()
                    .any(|&(p, s, e)| p == pid && s < a.end() && a.start < e),
                "marking {a:?} of {pid} while it is write-tracked"
            );
        }
        w.batches.push((pid, batch.to_vec()));
        let mut out = Vec::new();
        for a in batch {
            let hit: Vec<RegionId> = w
                .spans
                .iter()
                .filter(|(_, s)| s.proc.pid == pid && s.start >= a.start && s.end() <= a.end())
                .map(|(id, _)| *id)
                .collect();
            for id in &hit {
                w.spans.get_mut(id).unwrap().mergeable = a.mergeable;
                if !a.mergeable {
                    w.unmerge(*id);
                }
            }
            // MADV_UNMERGEABLE on part of a mergeable VMA splits it, as the
            // kernel does: the part becomes a region of its own, not
            // mergeable, its merged pages copied back.
            let marked_vma = (w.spans.iter())
                .find(|(_, s)| {
                    s.proc.pid == pid && s.mergeable && s.start <= a.start && a.end() <= s.end()
                })
                .map(|(&id, s)| (id, s.start, s.end()));
            if let (true, false, Some((id, start, end))) = (hit.is_empty(), a.mergeable, marked_vma)
            {
                let mut part = id;
                if a.start > start {
                    part = w.split(id, ((a.start - start) / 4096) as u32);
                }
                if a.end() < end {
                    let from = w.spans[&part].start;
                    w.split(part, ((a.end() - from) / 4096) as u32);
                }
                w.spans.get_mut(&part).unwrap().mergeable = false;
                w.unmerge(part);
                out.push(Ok(()));
                continue;
            }
            let inside = w
                .spans
                .values()
                .any(|s| s.proc.pid == pid && s.start <= a.start && a.end() <= s.end());
            if hit.is_empty() && inside {
                // Part of one region: a partial mark.
                if a.mergeable {
                    w.partial.push((pid, a.start, a.end()));
                } else {
                    w.partial
                        .retain(|&(p, s, e)| p != pid || e <= a.start || a.end() <= s);
                }
                out.push(Ok(()));
                continue;
            }
            out.push(if hit.is_empty() { Err(12) } else { Ok(()) });
        }
        BatchOutcome::Done(out)
    }
}

impl KsmControl for SimKsm {
    fn sample(&mut self) -> Result<KsmSample, String> {
        Ok(KsmSample {
            full_scans: self.0.borrow().full_scans,
            pages_visited: Some(self.0.borrow().pages_visited),
            ..KsmSample::default()
        })
    }
    fn pace(
        &mut self,
        target: f64,
        unmerged: u64,
        _scan_pages: u64,
        _now: Nanos,
    ) -> Result<Pacing, String> {
        let share = if unmerged > 0 { target } else { 0.001 };
        let mut w = self.0.borrow_mut();
        w.shares.push(share);
        let trickling = unmerged == 0;
        if trickling {
            w.trickle_calls += 1;
        }
        let comes_round = w.trickle_every <= 1 || w.trickle_calls.is_multiple_of(w.trickle_every);
        if !trickling {
            w.merge_calls += 1;
        }
        let merge_round = w.merge_every <= 1 || w.merge_calls.is_multiple_of(w.merge_every);
        if (!trickling && merge_round) || (trickling && !w.idle_at_trickle && comes_round) {
            w.ksmd_pass();
        }
        Ok(Pacing {
            share,
            pages_to_scan: 100,
            sleep_ms: 20,
            wait_share: 0.0,
        })
    }
    fn restore(&mut self) -> Result<(), String> {
        self.0.borrow_mut().restored += 1;
        Ok(())
    }
}

/// Distinct content ids starting at `from`.
pub fn distinct(from: u64, n: usize) -> Vec<u64> {
    (from..from + n as u64).collect()
}
