//! [`Sweeper`]: runs the exact sweep (`pagesift_core::pipeline::sweep`) over the
//! sampling regions, a slice per wake-up, within its CPU share.
//!
//! ## Pacing
//! The first epoch starts one [`Sweeper::min_epoch`] after the daemon
//! (sampling looks first). An epoch walks every region that was sampling
//! when it began, in id order, a chunk of [`CHUNK_PAGES`] pages at a
//! time, jumping over the holes that one `PAGEMAP_SCAN` walk found when
//! the region's walk began (`Target::present_runs`): page states from
//! pagemap (and kpageflags), then one batched
//! read of the present, unmerged pages, each hashed (XXH3-64). A wake-up may spend
//! `share × (time since the last wake-up)` of CPU on it, converted to
//! pages at the measured cost per page (an average of past slices), so the
//! sweep's CPU stays near its share whatever the sleep. A slice walks whole
//! chunks, so it may spend more than it was given; the excess is a debt
//! that the next wakes pay before the sweep walks again. (Until 2026-12-03
//! there was no debt: at a share of 0.04 % a wake was given a few dozen
//! pages and walked 512, and the capped files run's sweep took 0.025
//! CPU-s where its share allowed 0.011.) An epoch ends when
//! every region was walked; its findings go back to the daemon, and the
//! next epoch starts after [`Sweeper::min_epoch`] has passed since the
//! previous one began (a sweep of little memory would otherwise start over
//! at once), or a multiple of it after epochs that found nothing new
//! ([`Sweeper::fruitful`]). A region in which a sweep found no duplicate
//! left to merge sits out the next 2, 4, … up to 64 epochs: distinct (or
//! merged) memory is hashed rarely, and the ladder's sampling keeps
//! watching it meanwhile. An epoch that filling memory called (below)
//! takes back a region sitting out whose present pages have at least
//! doubled since its last sweep: it holds new content.
//! One with fewer than [`MIN_PRESENT`] present pages does not: a guest's
//! RAM is empty when the guest starts and was sent out for a minute
//! before it had booted. A region of fewer than [`MIN_PRESENT`] pages in
//! all does, since it can never hold more.
//!
//! A *fill epoch* starts at once, spacing and back-off waived, for the
//! processes that filled at least [`FILL_PAGES`] pages of mappings they
//! already had since an epoch last walked them for it
//! ([`Sweeper::note_filled`], from `statm`, read with the check for
//! changed processes: resident growth beyond growth in size): new memory
//! is where new duplicates are, and a guest that boots fills hundreds of
//! MiB of RAM that was mapped before it started. It walks only those
//! processes' regions, sampling ones and the promoted ones ksmd has
//! settled (a guest goes on filling RAM that was marked early, and the
//! duplicates that appear there would otherwise wait for ksmd's trickle),
//! and it neither moves the full epochs' schedule nor counts for their
//! back-off or for the regions sitting out. The twins of its pages that
//! other processes hold merged are found through the recall
//! (`core::pipeline::sweep`). A full epoch walks the settled regions of
//! the processes that filled too. (Until 2026-11-27 any fill started a
//! full epoch, counted only where a process's size held, which QEMU's
//! never does while its guest boots: the trigger fired once per vm-boot
//! run.)
//!
//! A region whose time out is over is not walked at once: its
//! [`Fingerprint`] (a few pages its last walk saw, `core::pipeline::sweep`)
//! is read first, and if every probed page is as it was the region sits
//! out again, twice as long (up to the same 64 epochs). Only a region
//! that changed near a probe is walked. This holds while the last epoch
//! found no page through the recall: new copies of remembered content
//! mean that memory sitting out may hold their twins, which only a walk
//! tells, so then regions are walked when their time is out, probe or
//! not. (Until 2026-11-27 every such region was walked: on an idle host
//! with 4 GiB of distinct memory in 93 regions the daemon hashed all of
//! it again about 30 s after its first epoch ended, 80 s after its start:
//! 1.9 % of a core over `scripts/bench-idle`'s minute.)
//!
//! An epoch takes only regions the daemon has known for
//! `scan.sweep_min_age_s` (the daemon's list): hashing every page pays
//! for memory that stays, and memory mapped and unmapped within seconds
//! is the ladder's. While no region qualifies no epoch starts (an empty
//! one would count as fruitless and space the next out); the sweep looks
//! again [`EMPTY_RETRY`] later. Regions that only sit out still get their
//! (empty) epochs, since their time out is counted in epochs.
//!
//! ## What it touches
//! Nothing is written: pages are read through the source's checked paths
//! (only pages pagemap showed present a moment before, KSM and shared
//! pages never pinned), as for sampling.

use crate::target::Target;
use pagesift_core::pipeline::sweep::{Fingerprint, Recall, RegionFinding, Seen, Sweep};
use pagesift_core::source::PageState;
use pagesift_core::{Nanos, PageBuffer, PageRef, RegionId};
use pagesift_linux::host;
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

/// Pages whose states are read at once.
pub const CHUNK_PAGES: u32 = 512;
/// The cost per page assumed before the first slice is measured, in ns.
const INITIAL_NS_PER_PAGE: f64 = 2000.0;
/// Duplicate pages this close (in pages) join one run: marking the
/// unique pages between them costs ksmd a look each, less than the VMA
/// splits of separate marks.
pub const RUN_GAP: u32 = 8;
/// Most the spacing between epochs grows, as a multiple of the shortest
/// (5 s by default: 80 s).
pub const MAX_BACKOFF: u64 = 16;
/// Most CPU time one wake-up gives the sweep, in ns, however long the
/// sleep before it was.
const MAX_SLICE_NS: f64 = 50e6;
/// How soon a sweep that found no region to walk looks again.
const EMPTY_RETRY: Nanos = 1_000_000_000;
/// Pages that filled existing mappings since the last epoch began that
/// start the next one at once (32 MiB: under two seconds of a booting
/// guest, whose present RAM grew by about 190 MiB in its first 9 s in
/// `pagesift bench --quick --only vm-boot` on 2026-11-26, read by hand
/// from its pagemap). pagesift's choice.
pub const FILL_PAGES: u64 = 8192;

/// Hashes the recall keeps from earlier epochs (`core::pipeline::sweep`'s
/// *Recall*): 2^20, enough for 4 GiB of distinct content. Its two tables
/// of up to 2^19 entries take up to 2^20 buckets of 17 bytes each, about
/// 34 MiB at most (`scripts/vma-bound`'s peak rose from 381 to 387 MiB
/// with it, docs/reliability.md). pagesift's choice.
pub const RECALL_CAPACITY: usize = 1 << 20;

/// A region left out of the sweep: until the epoch `until`, after
/// `streak` fruitless sweeps in a row, the last of which found `present`
/// pages present.
#[derive(Clone, Copy, Debug, Default)]
struct Quiet {
    until: u64,
    streak: u32,
    present: u32,
}

/// A region whose sweep found no duplicate sits out the next 2, 4, 8, …
/// epochs, up to 2^this (64 epochs, minutes), so distinct memory is hashed
/// rarely; the ladder's sampling goes on watching it meanwhile.
pub const MAX_QUIET_SHIFT: u32 = 6;

/// Fewest present pages a sweep needs to judge a region: fewer neither
/// raise it (the daemon) nor send it out of the next epochs, unless the
/// region is smaller than this in all. pagesift's choice.
pub const MIN_PRESENT: u32 = 64;

/// Figures for status and metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SweepStats {
    /// Epochs finished.
    pub epochs: u64,
    /// Pages hashed since start.
    pub pages_hashed: u64,
    /// Pages whose state was looked up since start.
    pub pages_walked: u64,
    /// CPU time spent, in ns.
    pub cpu_ns: u64,
    /// Regions raised to the top level on the sweep's evidence.
    pub raised: u64,
    /// Duplicate runs handed to marking.
    pub runs: u64,
    /// Duration of the last finished epoch, in ns.
    pub last_epoch_ns: u64,
    /// Of the epochs, those that filling processes called, walking only
    /// them.
    #[serde(default)]
    pub fill_epochs: u64,
    /// Regions whose time out was over that were checked against their
    /// fingerprint instead of walked.
    #[serde(default)]
    pub probed: u64,
    /// Of those, the ones found unchanged (sent out again, not walked).
    #[serde(default)]
    pub probed_unchanged: u64,
}

/// The sweep's state between wake-ups.
pub struct Sweeper {
    share: f64,
    min_epoch: Nanos,
    queue: VecDeque<RegionId>,
    cursor: Option<(RegionId, u32)>,
    /// The present page runs of the region under the cursor, read when
    /// its walk began (`None`: unknown, every page is looked at).
    present: Option<Vec<(u32, u32)>>,
    sweep: Sweep,
    /// What earlier epochs saw, lent to the epoch under way.
    recall: Recall,
    epoch_started: Option<Nanos>,
    next_epoch_at: Nanos,
    backoff: u64,
    /// Regions whose last sweeps found no duplicate, skipped for a while.
    quiet: HashMap<RegionId, Quiet>,
    /// Each walked region's fingerprint from its last walk (kept for the
    /// regions sitting out).
    prints: HashMap<RegionId, Fingerprint>,
    /// Whether the last epoch found pages through the recall alone: then
    /// no region is let off on its fingerprint.
    recalled: bool,
    last_wake: Option<Nanos>,
    /// Each process's fill count ([`Sweeper::note_filled`]) now, and at
    /// the start of the last epoch that walked it because it filled (or
    /// when first seen).
    filled: BTreeMap<u32, u64>,
    filled_at_epoch: BTreeMap<u32, u64>,
    /// Full epochs finished: the clock of the regions sitting out (fill
    /// epochs walk a few processes and do not advance it).
    full_epochs: u64,
    /// Whether the epoch under way (or the last one) was a fill epoch.
    fill_epoch: bool,
    /// No fill epoch before this: the last one due had no region to walk
    /// (its process's regions all younger than the sweep's minimum age).
    fill_retry_at: Nanos,
    ns_per_page: f64,
    /// CPU the sweep may still spend, in ns: its share of the time since
    /// each wake, less what it spent. Negative after a slice overspent (a
    /// slice walks whole chunks), a debt the next wakes pay off first.
    credit_ns: f64,
    states: Vec<PageState>,
    pages: Vec<PageRef>,
    /// Page-aligned: see [`PageBuffer`].
    words: PageBuffer,
    /// Figures so far.
    pub stats: SweepStats,
}

impl Sweeper {
    /// A sweeper that may use `share` of one core (0: off), starting an
    /// epoch at most every `min_epoch`.
    pub fn new(share: f64, min_epoch: Nanos) -> Sweeper {
        Sweeper {
            share,
            min_epoch,
            queue: VecDeque::new(),
            cursor: None,
            present: None,
            sweep: Sweep::new(),
            recall: Recall::new(RECALL_CAPACITY),
            epoch_started: None,
            // Sampling looks first: the first epoch starts one spacing
            // after the daemon, by when the duplicates sampling finds at
            // once are merged, and merged pages are tallied without a read.
            next_epoch_at: min_epoch,
            backoff: 1,
            quiet: HashMap::new(),
            prints: HashMap::new(),
            recalled: false,
            last_wake: None,
            filled: BTreeMap::new(),
            filled_at_epoch: BTreeMap::new(),
            full_epochs: 0,
            fill_epoch: false,
            fill_retry_at: 0,
            ns_per_page: INITIAL_NS_PER_PAGE,
            credit_ns: 0.0,
            states: Vec::new(),
            pages: Vec::new(),
            words: PageBuffer::new(0),
            stats: SweepStats::default(),
        }
    }

    /// The shortest time between the starts of two epochs.
    pub fn min_epoch(&self) -> Nanos {
        self.min_epoch
    }

    /// Changes the share and the epoch spacing (a reloaded config).
    pub fn set_pace(&mut self, share: f64, min_epoch: Nanos) {
        self.share = share;
        self.min_epoch = min_epoch;
    }

    /// Each process's pages that filled mappings it already had, counted
    /// since the daemon started (`Target::filled_pages`). A process that
    /// filled [`FILL_PAGES`] more than when an epoch last walked it for
    /// filling (or than when first seen) gets a fill epoch at once.
    pub fn note_filled(&mut self, filled: BTreeMap<u32, u64>) {
        for (&pid, &n) in &filled {
            self.filled_at_epoch.entry(pid).or_insert(n);
        }
        self.filled_at_epoch
            .retain(|pid, _| filled.contains_key(pid));
        self.filled = filled;
    }

    /// The processes that filled [`FILL_PAGES`] since an epoch last walked
    /// them for it.
    fn filling(&self) -> BTreeSet<u32> {
        (self.filled.iter())
            .filter(|&(pid, &n)| {
                n >= (self.filled_at_epoch.get(pid).copied().unwrap_or(n))
                    .saturating_add(FILL_PAGES)
            })
            .map(|(&pid, _)| pid)
            .collect()
    }

    /// Whether the epoch under way, or the last one, is a fill epoch.
    pub fn fill_epoch(&self) -> bool {
        self.fill_epoch
    }

    /// Measured CPU per walked page, in ns.
    pub fn ns_per_page(&self) -> f64 {
        self.ns_per_page
    }

    /// One wake-up's slice. `regions` lists the regions to sweep, asked
    /// for only when an epoch starts, given the processes that filled
    /// ([`FILL_PAGES`]) and whether the epoch is a full one (else it
    /// walks only those processes); each region comes with whether its
    /// process filled. Returns the findings when this slice finished an
    /// epoch: each region's counts, and its duplicate runs of at least
    /// `min_run` pages joined over gaps of up to [`RUN_GAP`].
    pub fn step<T: Target>(
        &mut self,
        target: &mut T,
        now: Nanos,
        min_run: u32,
        regions: impl FnOnce(&BTreeSet<u32>, bool) -> Vec<(RegionId, bool)>,
    ) -> Option<Vec<RegionFinding>> {
        let since = now.saturating_sub(self.last_wake.unwrap_or(now));
        self.last_wake = Some(now);
        if self.share <= 0.0 {
            return None;
        }
        let started = match self.epoch_started {
            Some(t) => t,
            None => {
                let full = now >= self.next_epoch_at;
                if !full && now < self.fill_retry_at {
                    return None;
                }
                let filling = self.filling();
                if !full && filling.is_empty() {
                    return None;
                }
                let epoch = self.full_epochs;
                let candidates = regions(&filling, full);
                if candidates.is_empty() {
                    // Nothing to walk yet (no region old enough, say): no
                    // epoch, so no fruitless one that would space the next
                    // out, and the fill stays counted. Look again shortly.
                    // (Regions sitting out do start one, empty or not:
                    // their time out is counted in epochs.)
                    let retry = now + EMPTY_RETRY.min(self.min_epoch);
                    if full {
                        self.next_epoch_at = retry;
                    } else {
                        self.fill_retry_at = retry;
                    }
                    return None;
                }
                self.wake_filled(target, epoch, &candidates);
                if !self.recalled {
                    self.let_off_unchanged(target, epoch, &candidates);
                }
                let quiet = &self.quiet;
                self.queue = candidates
                    .into_iter()
                    .filter(|(id, _)| quiet.get(id).is_none_or(|q| q.until <= epoch))
                    .map(|(id, _)| id)
                    .collect();
                self.cursor = None;
                self.sweep = Sweep::with_recall(std::mem::take(&mut self.recall));
                self.epoch_started = Some(now);
                self.fill_epoch = !full;
                for pid in filling {
                    if let Some(&n) = self.filled.get(&pid) {
                        self.filled_at_epoch.insert(pid, n);
                    }
                }
                now
            }
        };
        // Earned since the last wake, less what earlier slices overspent
        // (a slice walks whole chunks): no more than one slice banked.
        self.credit_ns = (self.credit_ns + self.share * since as f64).min(MAX_SLICE_NS);
        if self.credit_ns <= 0.0 {
            return None;
        }
        let mut budget = (self.credit_ns / self.ns_per_page.max(1.0)).ceil() as u64;
        let cpu0 = host::thread_cpu_ns();
        let mut walked = 0u64;
        while budget > 0 {
            let (id, first) = match self.cursor {
                Some(c) => c,
                None => match self.queue.pop_front() {
                    Some(id) => match target.span(id) {
                        Some(s) => {
                            self.sweep.begin_region(id, s.pages);
                            self.prints.insert(id, Fingerprint::new(s.pages));
                            self.present = target.present_runs(id);
                            (id, 0)
                        }
                        None => continue,
                    },
                    None => break,
                },
            };
            let pages = target.span(id).map_or(0, |s| s.pages);
            // Holes are skipped: they hold nothing to tally.
            let first = match &self.present {
                Some(runs) => next_present(runs, first).unwrap_or(pages),
                None => first,
            };
            let n = CHUNK_PAGES.min(pages.saturating_sub(first));
            if n == 0 {
                self.cursor = None;
                continue;
            }
            self.walk(target, id, first, n);
            walked += u64::from(n);
            budget = budget.saturating_sub(u64::from(n));
            self.cursor = (first + n < pages).then_some((id, first + n));
        }
        let cpu = host::thread_cpu_ns().saturating_sub(cpu0);
        self.credit_ns -= cpu as f64;
        if walked > 0 {
            let sample = cpu as f64 / walked as f64;
            self.ns_per_page = 0.8 * self.ns_per_page + 0.2 * sample;
        }
        self.stats.cpu_ns += cpu;
        self.stats.pages_walked += walked;
        if self.cursor.is_some() || !self.queue.is_empty() {
            return None;
        }
        self.stats.epochs += 1;
        self.stats.last_epoch_ns = now.saturating_sub(started);
        self.epoch_started = None;
        if self.fill_epoch {
            self.stats.fill_epochs += 1;
        } else {
            self.full_epochs += 1;
            self.next_epoch_at = started + self.min_epoch * self.backoff;
        }
        let mut sweep = std::mem::take(&mut self.sweep);
        self.recalled = sweep.recalled() > 0;
        self.recall = sweep.take_recall();
        let findings = sweep.finish(min_run, RUN_GAP);
        let epoch = self.full_epochs;
        for f in &findings {
            // A region with (next to) nothing present says nothing about
            // what it will hold: a guest's RAM is empty when its guest
            // starts, and fills with duplicates while it boots. A region
            // too small ever to hold MIN_PRESENT pages is judged on what
            // it holds: a QEMU has a hundred or more such mappings
            // (stacks, small heaps), and walked at every epoch they were
            // a thousand walks of one or two pages each per epoch in a
            // vm-boot run (docs/daemon-cpu.md).
            let small = target.span(f.region).is_some_and(|s| s.pages < MIN_PRESENT);
            if f.unmerged_dups > 0 || (f.present < MIN_PRESENT && !small) {
                self.quiet.remove(&f.region);
            } else {
                let q = self.quiet.entry(f.region).or_default();
                q.streak = (q.streak + 1).min(MAX_QUIET_SHIFT);
                q.until = epoch + (1 << q.streak);
                q.present = f.present;
            }
        }
        if !self.fill_epoch {
            let live: std::collections::HashSet<RegionId> =
                findings.iter().map(|f| f.region).collect();
            // A region whose time out ends with the next epoch keeps its
            // entry for that epoch's fingerprint check; one that was
            // neither walked nor checked is gone.
            self.quiet
                .retain(|id, q| live.contains(id) || q.until >= epoch);
        }
        let quiet = &self.quiet;
        self.prints.retain(|id, _| quiet.contains_key(id));
        Some(findings)
    }

    /// Says whether the last epoch's findings changed anything. Epochs
    /// that change nothing space out, doubling up to [`MAX_BACKOFF`] times
    /// the shortest spacing, so that memory with nothing new to merge
    /// costs little; a fruitful epoch brings the spacing back.
    pub fn fruitful(&mut self, yes: bool) {
        // A fill epoch walked a few processes: it says nothing of the rest.
        if self.fill_epoch {
            return;
        }
        self.backoff = if yes {
            1
        } else {
            (self.backoff * 2).min(MAX_BACKOFF)
        };
    }

    /// At the start of an epoch: each region whose time out is over and
    /// whose fingerprint's pages all read as its last walk saw them sits
    /// out again, twice as long (see the module header). A page that
    /// cannot be read, a region of another length or one without a
    /// fingerprint is walked.
    fn let_off_unchanged<T: Target>(
        &mut self,
        target: &mut T,
        epoch: u64,
        candidates: &[(RegionId, bool)],
    ) {
        let cpu0 = host::thread_cpu_ns();
        for &(id, _) in candidates {
            let (Some(q), Some(print)) = (self.quiet.get_mut(&id), self.prints.get(&id)) else {
                continue;
            };
            if q.until > epoch {
                continue;
            }
            let Some(span) = target.span(id) else {
                continue;
            };
            self.pages.clear();
            self.pages.extend(
                print
                    .probes()
                    .iter()
                    .map(|&page| PageRef { region: id, page }),
            );
            let n = self.pages.len();
            self.words.grow_to(n);
            let mut states = vec![Ok(PageState::NotPresent); n];
            let mut read = vec![false; n];
            target.sample_pages(&self.pages, &mut self.words[..n], &mut states, &mut read);
            let now: Option<Vec<Seen>> = (0..n)
                .map(|i| match (&states[i], read[i]) {
                    (Ok(PageState::NotPresent), _) => Some(Seen::Absent),
                    (Ok(PageState::Merged | PageState::Zero), _) => Some(Seen::Merged),
                    (Ok(PageState::Present), true) => Some(Seen::Content(
                        pagesift_scan::exact::page_hash(&self.words[i]),
                    )),
                    _ => None,
                })
                .collect();
            self.stats.probed += 1;
            if now.is_some_and(|now| print.unchanged(span.pages, &now)) {
                self.stats.probed_unchanged += 1;
                q.streak = (q.streak + 1).min(MAX_QUIET_SHIFT);
                // As the end of this epoch would set it.
                q.until = epoch + 1 + (1 << q.streak);
            }
        }
        self.stats.cpu_ns += host::thread_cpu_ns().saturating_sub(cpu0);
    }

    /// At the start of an epoch: a region of a process that filled,
    /// sitting out, whose present pages at least doubled since its last
    /// (fruitless) sweep is walked in this one. A guest's RAM sub-region
    /// swept while its guest was booting holds other content once it has
    /// filled, and would otherwise sit out up to 64 epochs. One
    /// `PAGEMAP_SCAN` walk per such region sitting out (of the processes
    /// that filled only: a host of thousands of quiet regions paid one
    /// walk each at every epoch a single process's fill called).
    fn wake_filled<T: Target>(
        &mut self,
        target: &mut T,
        epoch: u64,
        candidates: &[(RegionId, bool)],
    ) {
        for &(id, _) in candidates.iter().filter(|&&(_, filled)| filled) {
            let Some(q) = self.quiet.get_mut(&id).filter(|q| q.until > epoch) else {
                continue;
            };
            let Some(runs) = target.present_runs(id) else {
                continue;
            };
            let present: u64 = runs.iter().map(|&(a, b)| u64::from(b - a)).sum();
            if present >= 2 * u64::from(q.present.max(MIN_PRESENT)) {
                q.until = epoch;
            }
        }
    }

    /// Tallies pages `first..first + n` of region `id`.
    fn walk<T: Target>(&mut self, target: &mut T, id: RegionId, first: u32, n: u32) {
        self.states.clear();
        self.states.resize(n as usize, PageState::NotPresent);
        self.words.grow_to(n as usize);
        // One pagemap read for the states and the read's checks.
        let Ok(got) =
            target.read_present(id, first, &mut self.states, &mut self.words[..n as usize])
        else {
            return;
        };
        let mut print = self.prints.get_mut(&id);
        let mut read = 0;
        for (i, s) in self.states.iter().enumerate() {
            let page = PageRef {
                region: id,
                page: first + i as u32,
            };
            match s {
                PageState::Present if read < got => {
                    let hash = pagesift_scan::exact::page_hash(&self.words[read]);
                    read += 1;
                    self.sweep.observe(page, hash);
                    if let Some(f) = print.as_deref_mut() {
                        f.record(page.page, Seen::Content(hash));
                    }
                }
                PageState::Merged | PageState::Zero => {
                    self.sweep.observe_merged(page);
                    if let Some(f) = print.as_deref_mut() {
                        f.record(page.page, Seen::Merged);
                    }
                }
                PageState::Present | PageState::NotPresent => {}
            }
        }
        self.stats.pages_hashed += got as u64;
    }
}

/// The first page at or after `page` inside one of the sorted, disjoint
/// `[first, end)` `runs`, if any.
fn next_present(runs: &[(u32, u32)], page: u32) -> Option<u32> {
    let i = runs.partition_point(|&(_, end)| end <= page);
    runs.get(i).map(|&(first, _)| first.max(page))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{SimTarget, distinct, world};

    #[test]
    fn the_walk_jumps_to_the_next_present_page() {
        let runs = [(10, 20), (100, 101), (600, 1200)];
        assert_eq!(next_present(&runs, 0), Some(10));
        assert_eq!(next_present(&runs, 15), Some(15));
        assert_eq!(next_present(&runs, 20), Some(100));
        assert_eq!(next_present(&runs, 101), Some(600));
        assert_eq!(next_present(&runs, 1199), Some(1199));
        assert_eq!(next_present(&runs, 1200), None);
        assert_eq!(next_present(&[], 0), None);
    }

    /// Fill counts: process `pid` filled `n` pages.
    fn filled(pid: u32, n: u64) -> BTreeMap<u32, u64> {
        BTreeMap::from([(pid, n)])
    }

    /// The daemon's choice of regions for a world of one region `a` of
    /// process `pid`: walked by full epochs, and by fill epochs of `pid`.
    fn only(a: RegionId, pid: u32) -> impl FnOnce(&BTreeSet<u32>, bool) -> Vec<(RegionId, bool)> {
        move |filling, full| {
            let filled = filling.contains(&pid);
            if full || filled {
                vec![(a, filled)]
            } else {
                vec![]
            }
        }
    }

    /// A process with one region of 1024 distinct pages.
    fn one_region() -> (SimTarget, RegionId) {
        let w = world();
        let a = {
            let mut m = w.borrow_mut();
            m.spawn(40, "a", false);
            m.map(40, &distinct(1_000, 1024), false)
        };
        (SimTarget(w), a)
    }

    #[test]
    fn memory_that_fills_starts_an_epoch_at_once() {
        let (mut target, a) = one_region();
        let spacing: Nanos = 5_000_000_000;
        let mut s = Sweeper::new(1.0, spacing);
        s.note_filled(filled(40, 100));
        assert!(s.step(&mut target, 0, 1, only(a, 40)).is_none());
        // Less than FILL_PAGES: the spacing stands.
        s.note_filled(filled(40, 100 + FILL_PAGES - 1));
        assert!(s.step(&mut target, 100_000_000, 1, only(a, 40)).is_none());
        assert_eq!(s.stats.pages_walked, 0);
        // FILL_PAGES since the count's first value: due now.
        s.note_filled(filled(40, 100 + FILL_PAGES));
        let mut now = 200_000_000;
        let mut done = None;
        while done.is_none() && now < spacing {
            done = s.step(&mut target, now, 1, only(a, 40));
            now += 100_000_000;
        }
        assert!(done.is_some(), "no epoch before the spacing");
        assert_eq!(s.stats.fill_epochs, 1);
        // Counted again from that epoch's start: nothing new, not due.
        s.fruitful(false);
        assert!(s.step(&mut target, now, 1, only(a, 40)).is_none());
        assert_eq!(s.stats.epochs, 1);
        // Another process's fill does not call an epoch for this one.
        let mut more = filled(40, 100 + FILL_PAGES);
        more.insert(41, 0);
        s.note_filled(more.clone());
        more.insert(41, 10 * FILL_PAGES);
        s.note_filled(more);
        assert!(s.step(&mut target, now, 1, only(a, 40)).is_none());
        assert_eq!(s.stats.epochs, 1);
    }

    /// A fill epoch with nothing to walk yet (the process's regions are
    /// all too young) is asked for again a second later, not every wake.
    #[test]
    fn a_fill_epoch_without_a_region_is_retried_a_second_later() {
        let (mut target, a) = one_region();
        let spacing: Nanos = 5_000_000_000;
        let mut s = Sweeper::new(1.0, spacing);
        s.note_filled(filled(40, 0));
        s.note_filled(filled(40, FILL_PAGES));
        let asked = std::cell::Cell::new(0);
        let mut now = 100_000_000;
        while now < 1_000_000_000 {
            let r = s.step(&mut target, now, 1, |_, _| {
                asked.set(asked.get() + 1);
                vec![]
            });
            assert!(r.is_none());
            now += 100_000_000;
        }
        assert_eq!(asked.get(), 1, "asked every wake");
        // A second on, the regions are old enough: the fill epoch runs.
        let mut done = None;
        while done.is_none() && now < spacing {
            done = s.step(&mut target, now, 1, only(a, 40));
            now += 100_000_000;
        }
        assert!(done.is_some());
        assert_eq!(s.stats.fill_epochs, 1);
    }

    /// Runs full epochs until one ends with `walked` pages walked in all
    /// (or 200 s pass); returns whether it got there.
    fn run_until_walked(
        s: &mut Sweeper,
        target: &mut SimTarget,
        a: RegionId,
        now: &mut Nanos,
        walked: u64,
    ) -> bool {
        let end = *now + 200 * 1_000_000_000;
        while s.stats.pages_walked < walked && *now < end {
            if s.step(target, *now, 1, only(a, 40)).is_some() {
                s.fruitful(false);
            }
            *now += 100_000_000;
        }
        s.stats.pages_walked >= walked
    }

    /// A region with no duplicate sits out epochs (the epochs still come
    /// while it is the only region). When its time is out its fingerprint
    /// is read: unchanged, it sits out again without a walk; changed at a
    /// probed page, it is walked.
    #[test]
    fn a_region_sitting_out_is_walked_again_only_when_it_changed() {
        let (mut target, a) = one_region();
        let mut s = Sweeper::new(1.0, 1_000_000_000);
        let mut now = 0;
        assert!(run_until_walked(&mut s, &mut target, a, &mut now, 1024));
        let again = run_until_walked(&mut s, &mut target, a, &mut now, 2048);
        assert!(!again, "{:?}", s.stats);
        assert_eq!(
            s.stats.pages_walked, 1024,
            "walked unchanged: {:?}",
            s.stats
        );
        assert!(s.stats.probed_unchanged >= 2, "{:?}", s.stats);
        assert_eq!(s.stats.probed, s.stats.probed_unchanged);
        // Page 16 is the first probe of 1024 pages (the middle of 0..32).
        let probe = PageRef {
            region: a,
            page: 16,
        };
        target.0.borrow_mut().mem.write(probe, 77_777).unwrap();
        // Its time out has grown: up to 200 s at the grown epoch spacing.
        assert!(run_until_walked(&mut s, &mut target, a, &mut now, 2048));
        assert_eq!(s.stats.probed, s.stats.probed_unchanged + 1);
    }

    /// A region too small ever to hold MIN_PRESENT pages sits out like
    /// any region without duplicates; a large region with fewer present
    /// pages than that (a guest's RAM before it boots) does not: it is
    /// walked at every epoch until it holds enough to judge.
    #[test]
    fn a_small_region_without_duplicates_sits_out_and_an_empty_large_one_does_not() {
        let w = world();
        let (small, large) = {
            let mut m = w.borrow_mut();
            m.spawn(40, "a", false);
            let small = m.map(40, &distinct(1_000, 16), false);
            let large = m.map(40, &distinct(50_000, 4096), false);
            for page in 16..4096 {
                m.mem
                    .evict(PageRef {
                        region: large,
                        page,
                    })
                    .unwrap();
            }
            (small, large)
        };
        let mut target = SimTarget(w.clone());
        let both = |_: &BTreeSet<u32>, _: bool| vec![(small, false), (large, false)];
        let mut s = Sweeper::new(1.0, 1_000_000_000);
        let mut now = 0;
        let mut walked: BTreeMap<RegionId, u32> = BTreeMap::new();
        for _ in 0..6 {
            let end = now + 60 * 1_000_000_000;
            let mut found = None;
            while found.is_none() && now < end {
                now += 100_000_000;
                found = s.step(&mut target, now, 1, both);
            }
            s.fruitful(false);
            for f in found.expect("an epoch ended") {
                *walked.entry(f.region).or_default() += 1;
            }
        }
        assert_eq!(walked.get(&large), Some(&6), "{walked:?}");
        // Walked by the first epoch, then out for 2, then 4.
        assert!(walked.get(&small).is_some_and(|&n| n <= 2), "{walked:?}");
    }

    /// After an epoch found new copies of remembered content, a region
    /// whose time out is over is walked whatever its fingerprint says:
    /// it may hold their twins.
    #[test]
    fn after_recalled_twins_a_region_is_walked_without_a_probe() {
        let w = world();
        let (a, b) = {
            let mut m = w.borrow_mut();
            m.spawn(40, "a", false);
            let a = m.map(40, &distinct(1_000, 1024), false);
            (a, m.map(40, &distinct(50_000, 1024), false))
        };
        let mut target = SimTarget(w.clone());
        let both = |_: &BTreeSet<u32>, _: bool| vec![(a, false), (b, false)];
        let mut s = Sweeper::new(1.0, 1_000_000_000);
        let mut now = 0;
        // One epoch; a sweeper that stops ending them fails the test
        // instead of hanging it (epochs are at most 16 s apart here).
        let mut epoch = |s: &mut Sweeper, target: &mut SimTarget| {
            let end = now + 60 * 1_000_000_000;
            while now < end {
                now += 100_000_000;
                if let Some(f) = s.step(target, now, 1, both) {
                    s.fruitful(false);
                    return f;
                }
            }
            panic!("no epoch ended in 60 s: {:?}", s.stats);
        };
        epoch(&mut s, &mut target);
        assert_eq!(s.stats.pages_walked, 2048);
        // Region b now holds a's content (which the recall remembers),
        // away from b's probes: b's page 17 onwards.
        for page in 17..30 {
            let p = PageRef { region: b, page };
            w.borrow_mut()
                .mem
                .write(p, 1_000 + u64::from(page))
                .unwrap();
        }
        // Both sit out their two epochs, then are probed: both unchanged
        // at their probes, so neither is walked, and b's new twins wait.
        for _ in 0..10 {
            if s.stats.probed >= 2 {
                break;
            }
            epoch(&mut s, &mut target);
        }
        assert_eq!((s.stats.pages_walked, s.stats.probed_unchanged), (2048, 2));
        // A probe page of b changes to more of a's content: b is walked
        // and finds a's content through the recall ...
        let p = PageRef {
            region: b,
            page: 16,
        };
        w.borrow_mut().mem.write(p, 1_000 + 16).unwrap();
        let mut f = None;
        for _ in 0..20 {
            let found = epoch(&mut s, &mut target);
            if s.stats.pages_walked > 2048 {
                f = Some(found);
                break;
            }
        }
        let f = f.expect("b not walked in 20 epochs");
        assert_eq!(s.stats.pages_walked, 3072, "only b walked");
        assert!(f.iter().any(|f| f.region == b && f.dups == 14), "{f:?}");
        // ... so a, whose twins they are, is walked at its next turn
        // without a probe.
        let probed = s.stats.probed;
        for _ in 0..20 {
            if s.stats.pages_walked >= 4096 {
                break;
            }
            epoch(&mut s, &mut target);
        }
        assert_eq!(s.stats.pages_walked, 4096, "a not walked in 20 epochs");
        assert_eq!(s.stats.probed, probed, "a was probed after recalled twins");
    }

    /// With no region to walk at all, no epoch starts (none is counted
    /// fruitless); one starts within a second of a region appearing.
    #[test]
    fn no_epoch_starts_without_a_region() {
        let (mut target, a) = one_region();
        let spacing: Nanos = 5_000_000_000;
        let mut s = Sweeper::new(1.0, spacing);
        let mut now = spacing;
        while now < 3 * spacing {
            assert!(s.step(&mut target, now, 1, |_, _| vec![]).is_none());
            now += 100_000_000;
        }
        assert_eq!(s.stats.epochs, 0);
        let until = now + 1_100_000_000;
        let mut done = None;
        while done.is_none() && now < until {
            done = s.step(&mut target, now, 1, only(a, 40));
            now += 100_000_000;
        }
        assert!(done.is_some(), "no epoch within a second");
    }

    /// A region swept while mostly empty sits out the next epochs; an
    /// epoch that filling memory calls walks it again once its present
    /// pages have doubled, and not before.
    #[test]
    fn a_region_that_filled_since_its_sweep_is_walked_again() {
        let (mut target, a) = one_region();
        for page in 128..1024 {
            target
                .0
                .borrow_mut()
                .mem
                .evict(PageRef { region: a, page })
                .unwrap();
        }
        let spacing: Nanos = 1_000_000_000;
        let mut s = Sweeper::new(1.0, spacing);
        s.note_filled(filled(40, 1));
        let mut now = spacing;
        let epoch = |s: &mut Sweeper, target: &mut SimTarget, now: &mut Nanos| {
            let until = *now + 10 * spacing;
            while *now < until {
                *now += 100_000_000;
                if s.step(target, *now, 1, only(a, 40)).is_some() {
                    s.fruitful(false);
                    return;
                }
            }
            panic!("no epoch ended");
        };
        epoch(&mut s, &mut target, &mut now);
        assert_eq!(s.stats.pages_hashed, 128);
        // Filled elsewhere in its process: the region kept its pages, so
        // it sits out.
        s.note_filled(filled(40, 1 + FILL_PAGES));
        epoch(&mut s, &mut target, &mut now);
        assert_eq!(s.stats.pages_hashed, 128, "walked while sitting out");
        // Its own pages fill: walked at the next filling epoch.
        for page in 128..1024 {
            target
                .0
                .borrow_mut()
                .mem
                .write(PageRef { region: a, page }, 50_000 + u64::from(page))
                .unwrap();
        }
        s.note_filled(filled(40, 1 + 2 * FILL_PAGES));
        epoch(&mut s, &mut target, &mut now);
        assert_eq!(s.stats.pages_hashed, 128 + 1024);
    }

    #[test]
    fn the_first_epoch_waits_one_spacing_for_sampling() {
        let (mut target, a) = one_region();
        let spacing: Nanos = 5_000_000_000;
        let mut s = Sweeper::new(1.0, spacing);
        let mut now = 0;
        while now < spacing {
            assert!(s.step(&mut target, now, 1, only(a, 40)).is_none());
            now += 100_000_000;
        }
        assert_eq!(
            s.stats.pages_walked, 0,
            "walked before sampling had its look"
        );
        let mut done = None;
        while done.is_none() && now < 3 * spacing {
            done = s.step(&mut target, now, 1, only(a, 40));
            now += 100_000_000;
        }
        assert!(done.is_some(), "no epoch ended");
        assert_eq!(s.stats.pages_walked, 1024);
    }

    /// At a small share a wake is given fewer pages than a chunk, and the
    /// chunk it walks anyway is a debt: over many wakes the sweep spends
    /// its share, give or take one chunk, not a chunk a wake.
    #[test]
    fn a_slice_that_overspends_is_paid_back_by_the_next_wakes() {
        let w = world();
        let a = {
            let mut m = w.borrow_mut();
            m.spawn(40, "a", false);
            m.map(40, &distinct(1_000, 1 << 16), false)
        };
        let mut target = SimTarget(w);
        let share = 0.0004;
        let mut s = Sweeper::new(share, 1_000_000_000);
        let wake: Nanos = 20_000_000;
        let mut now = 1_000_000_000;
        let end = now + 30 * 1_000_000_000;
        while now < end {
            s.step(&mut target, now, 1, only(a, 40));
            now += wake;
        }
        let allowed = share * (end - 1_000_000_000) as f64;
        let chunk = s.ns_per_page() * f64::from(CHUNK_PAGES);
        assert!(s.stats.pages_walked > 0, "{:?}", s.stats);
        assert!(
            (s.stats.cpu_ns as f64) <= allowed + 2.0 * chunk,
            "spent {} ns, allowed {allowed:.0} + a chunk of {chunk:.0}: {:?}",
            s.stats.cpu_ns,
            s.stats
        );
    }
}
