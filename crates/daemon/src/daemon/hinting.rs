//! I/O hints in the loop (the XLH dissertation, §4.3): from the BPF
//! program's ring to the bounded stack, and from the stack into the
//! distiller's wake-ups.
//!
//! ## Flow
//! 1. **Start** ([`Daemon::start_hints`]): unless `[hints] enabled` is
//!    false, the hint source is opened (`pagesift_linux::iohint`); if it
//!    cannot be (no `CAP_BPF`/`CAP_PERFMON`, no kernel BTF, lockdown, a
//!    load failure) the reason, which names what is missing, is logged
//!    and shown in status, and the loop runs on without hints. The stack
//!    is sized once: `[hints] capacity`, or what drains in 15 s at the
//!    scan rate the governor's budgets give at start and the interleave's
//!    hint share (`HintStack::capacity_for`, §5.4.1).
//! 2. **Watch**: after every refresh the program's tgid map is made equal
//!    to the eligible processes, and the stacked hints follow their pages
//!    by address to the regions that hold them now (`addresses`: a mark
//!    cuts its region, and a hint names a page by region and offset).
//! 3. **Feed** (each wake-up, before distilling): the ring is drained;
//!    each hinted range is cut into pages of the regions it overlaps; the
//!    pages of regions that are sampling, and the pages a read filled in
//!    regions held for their writes (a write hint there is counted and
//!    dropped: see `Daemon::feed_hints`), are pushed on the stack, newest last, stamped with the wake's time; those
//!    of regions already mergeable are counted apart from the rest, which
//!    are untracked. The CPU time of this step over the
//!    pages pushed is the per-hint cost.
//! 4. **Distil**: while the stack holds hints the wake-up is
//!    `Distiller::wake_with_hints` at the configured ratio; the maximum
//!    age is the configured one, narrowed to the time the ladder's walk
//!    takes to visit every page of the bottom level once (XLH's bound is
//!    "the time between page visits by a regular scanner", §4.3.3: past
//!    it the walk has reached the page anyway; see `bottom_pass_time`).
//! 5. **Mark**: hinted runs go to the loop's run marking (`run_items`),
//!    which takes them even when one page long, in held regions too (from
//!    read hints only, step 3), and
//!    without waiting for a write verdict (XLH does not filter hinted
//!    pages, §4.3.4: file data is rarely rewritten soon).

use super::addresses::Moves;
use super::{Daemon, Mode};
use crate::actuate::Actuator;
use crate::config::HintsSection;
use crate::ksmd::KsmControl;
use crate::status::HintsStatus;
use crate::target::{Target, View};
use pagesift_core::pipeline::distill::{Distiller, WakeReport};
use pagesift_core::pipeline::hints::{Hint, HintStack, Interleave};
use pagesift_core::{Nanos, PageRef};
use pagesift_linux::host;
use tracing::{debug, info, warn};

const MS: Nanos = 1_000_000;
const PAGE: u64 = 4096;

/// How long the ladder's walk of the bottom level takes to visit every
/// page once: its round time times the rounds a pass takes (each round
/// takes one cluster of `cluster_pages` every `interval` pages of the
/// level, the next of each region's permutation; see
/// `core::pipeline::ladder`). XLH bounds a hint's age by "the time between
/// page visits by a regular scanner" (§4.3.3), and its scanner, KSM's,
/// visits every page once a round; the ladder's rounds visit a fraction of
/// the pages each. Bounding by one global round instead dropped hints long
/// before the walk reached their pages, whenever the wake-ups' budgets
/// (which the hints share with the walk) could not look them all up
/// within a round (the loop test
/// `hints_outlive_global_rounds_until_the_walk_could_reach_their_pages`:
/// 13 775 of 16 384 hints dropped unread under a small CPU cap).
fn bottom_pass_time(distiller: &Distiller) -> Nanos {
    let ladder = distiller.ladder();
    let cluster = u64::from(ladder.config().cluster_pages.max(1));
    let rounds = ladder.interval(0).div_ceil(cluster).max(1);
    distiller.params().levels[0]
        .round_time
        .saturating_mul(rounds)
        .max(1)
}

/// Whole pages of one process's memory that a syscall just filled from a
/// file, or wrote out to one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HintedRange {
    pub tgid: u32,
    /// Page-aligned first address.
    pub start: u64,
    pub pages: u64,
    /// A read (the pages received file data), not a write.
    pub read: bool,
}

/// Where hints come from: the BPF program, or a stand-in in tests.
pub trait HintTap: Send {
    /// Makes the processes that produce hints exactly `tgids`.
    fn watch(&mut self, tgids: &mut dyn Iterator<Item = u32>);
    /// Hands every pending hinted range to `f`; returns the syscall events
    /// read.
    fn drain(&mut self, f: &mut dyn FnMut(HintedRange)) -> u64;
    /// Events the kernel dropped because the ring was full, so far.
    fn ring_dropped(&self) -> u64;
    /// Calls on something other than file data that the program left
    /// unhinted, so far.
    fn not_file_data(&self) -> u64 {
        0
    }
    /// Calls that hinted the same pages as the last call of their process
    /// (a reused buffer) that the program left unhinted, so far.
    fn repeated(&self) -> u64 {
        0
    }
    /// A descriptor that turns readable when hints arrive after a drain,
    /// for the loop's sleep to wake on; `None` if there is none.
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        None
    }
    /// Where the program is attached, if it is a BPF program.
    fn hook(&self) -> Option<&'static str> {
        None
    }
}

#[cfg(target_arch = "x86_64")]
impl HintTap for pagesift_linux::iohint::HintSource {
    fn watch(&mut self, tgids: &mut dyn Iterator<Item = u32>) {
        let failed = pagesift_linux::iohint::HintSource::watch(self, tgids);
        if failed > 0 {
            warn!(
                failed,
                "the hint program's tgid map is full: some processes give no hints"
            );
        }
    }
    fn drain(&mut self, f: &mut dyn FnMut(HintedRange)) -> u64 {
        pagesift_linux::iohint::HintSource::drain(self, |h| {
            f(HintedRange {
                tgid: h.tgid,
                start: h.start,
                pages: h.pages,
                read: h.syscall.is_read(),
            })
        })
    }
    fn ring_dropped(&self) -> u64 {
        self.counters().ring_full
    }
    fn not_file_data(&self) -> u64 {
        self.counters().not_file_data
    }
    fn repeated(&self) -> u64 {
        self.counters().repeated
    }
    fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        Some(pagesift_linux::iohint::HintSource::wake_fd(self))
    }
    fn hook(&self) -> Option<&'static str> {
        Some(pagesift_linux::iohint::HintSource::hook(self).name())
    }
}

/// Opens the BPF hint source as `[hints]` says, or says why it cannot.
#[cfg(target_arch = "x86_64")]
pub fn open_source(config: &HintsSection) -> Result<Box<dyn HintTap>, String> {
    use pagesift_linux::iohint::{HintSource, HintSourceConfig, Syscall};
    let syscalls = config
        .syscalls
        .iter()
        .filter_map(|n| Syscall::from_name(n))
        .collect();
    use crate::config::HintHook;
    use pagesift_linux::iohint::Hook;
    let source = HintSource::open(&HintSourceConfig {
        syscalls,
        btf: config.btf.clone(),
        hook: match config.hook {
            HintHook::Auto => None,
            HintHook::Fexit => Some(Hook::Fexit),
            HintHook::SysExit => Some(Hook::SysExit),
        },
    })
    .map_err(|e| e.to_string())?;
    tracing::info!(hook = source.hook().name(), "I/O hints attached");
    if source.hook() == Hook::SysExit {
        // The raw tracepoint turns on the syscall slow path for every task,
        // not only the eligible ones the program watches: on the
        // development machine a 4 KiB `pread64` of a process pagesift does
        // not watch took 0.2-0.4 µs longer, a 64 KiB one 0.3-0.7 µs (the
        // files experiment's "attached but not watching" figures,
        // docs/benchmarks.md). The operator should hear of a cost that
        // falls on the whole host.
        tracing::warn!(
            "I/O hints use the raw sys_exit tracepoint (this kernel allows no BPF trampoline \
             for fexit, or [hints] hook says so): every syscall of every process on this host \
             passes through it while pagesift runs, watched or not; [hints] enabled = false \
             turns hints off"
        );
    }
    Ok(Box::new(source))
}

/// Opens the BPF hint source: only x86-64 has one.
#[cfg(not(target_arch = "x86_64"))]
pub fn open_source(_config: &HintsSection) -> Result<Box<dyn HintTap>, String> {
    Err("I/O hints need x86-64 (the BPF program reads its syscall registers)".into())
}

#[derive(Clone, Debug, Default)]
struct Counts {
    events: u64,
    received: u64,
    pushed: u64,
    untracked: u64,
    mergeable: u64,
    held_writes: u64,
    sampled: u64,
    duplicates: u64,
    pages_marked: u64,
    feed_cpu_ns: u64,
}

/// The loop's hint state (module header).
pub struct HintFeed {
    tap: Option<Box<dyn HintTap>>,
    /// `None`: on or not started; `Some`: why hints are off.
    off: Option<String>,
    stack: HintStack,
    interleave: Interleave,
    max_age: Nanos,
    counts: Counts,
}

impl HintFeed {
    /// Hints as `config` says, not started yet.
    pub fn new(config: &HintsSection) -> HintFeed {
        let (h, l) = config.ratio().unwrap_or((1, 1));
        HintFeed {
            tap: None,
            off: (!config.enabled).then(|| "disabled ([hints] enabled = false)".to_string()),
            stack: HintStack::new(0, config.max_age_ms * MS),
            interleave: Interleave::new(h, l),
            max_age: config.max_age_ms * MS,
            counts: Counts::default(),
        }
    }

    /// Whether hints flow.
    pub fn on(&self) -> bool {
        self.tap.is_some()
    }

    /// Takes a changed `[hints]`: the program in use is dropped (which
    /// detaches it) and a new one waits to be started
    /// ([`Daemon::start_hints`]); the counts so far are kept.
    pub fn reconfigure(&mut self, config: &HintsSection) {
        let counts = std::mem::take(&mut self.counts);
        *self = HintFeed::new(config);
        self.counts = counts;
    }

    /// The hint source's wake-up descriptor, if hints flow (see
    /// [`HintTap::wake_fd`]).
    pub fn wake_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.tap.as_ref()?.wake_fd()
    }

    /// Whether hints are wanted but no source has been started yet.
    pub fn pending(&self) -> bool {
        self.tap.is_none() && self.off.is_none()
    }

    /// Whether no hint waits on the stack.
    pub fn idle(&self) -> bool {
        self.stack.is_empty()
    }

    /// Counts pages a hinted run submitted for marking.
    pub fn marked(&mut self, pages: u64) {
        self.counts.pages_marked += pages;
    }

    /// One wake-up of `distiller` over `view`: with the hints if any wait
    /// (module header, step 4).
    pub fn wake<T: Target>(
        &mut self,
        distiller: &mut Distiller,
        view: &mut View<'_, T>,
        now: Nanos,
    ) -> WakeReport {
        let report = if self.stack.is_empty() {
            distiller.wake(view, now)
        } else {
            distiller.wake_with_hints(view, now, &mut self.stack, &mut self.interleave)
        };
        self.counts.sampled += report.hints_sampled;
        self.counts.duplicates += report.hint_duplicates;
        if report.hints_sampled + report.hints_in_runs > 0
            && tracing::enabled!(tracing::Level::DEBUG)
        {
            let runs: Vec<(u64, u32, u32)> = (report.runs.iter())
                .filter(|r| r.hinted)
                .map(|r| (r.region.0, r.first, r.pages))
                .collect();
            debug!(
                sampled = report.hints_sampled,
                in_runs = report.hints_in_runs,
                duplicates = report.hint_duplicates,
                left = self.stack.len(),
                false_collisions = report.false_collisions,
                stable = distiller.index().stable_len(),
                unstable = distiller.index().unstable_len(),
                stable_compared = distiller.index().stats().stable_compared,
                ?runs,
                "hints looked up (runs: region, first page, pages)"
            );
        }
        if report.global_round_ended {
            self.stack
                .set_max_age(self.max_age.min(bottom_pass_time(distiller)));
        }
        report
    }

    /// The status section.
    pub fn status(&self) -> HintsStatus {
        let c = &self.counts;
        let st = self.stack.stats();
        let state = match (&self.off, self.on()) {
            (_, true) => "on",
            (Some(r), false) if r.starts_with("disabled") => "off",
            (Some(_), false) => "unavailable",
            (None, false) => "starting",
        };
        HintsStatus {
            state: state.into(),
            reason: self.off.clone(),
            hook: self.tap.as_ref().and_then(|t| t.hook()).map(String::from),
            events: c.events,
            received: c.received,
            pushed: c.pushed,
            untracked: c.untracked,
            mergeable: c.mergeable,
            held_writes: c.held_writes,
            dropped_ring: self.tap.as_ref().map_or(0, |t| t.ring_dropped()),
            not_file_data: self.tap.as_ref().map_or(0, |t| t.not_file_data()),
            repeated: self.tap.as_ref().map_or(0, |t| t.repeated()),
            dropped_stale: st.expired,
            dropped_unmapped: st.unmapped,
            overwritten: st.overwritten,
            sampled: c.sampled,
            duplicates: c.duplicates,
            pages_marked: c.pages_marked,
            capacity: self.stack.capacity() as u64,
            stacked: self.stack.len() as u64,
            max_age_ms: self.stack.max_age() / MS,
            per_hint_ns: if c.pushed == 0 {
                0.0
            } else {
                c.feed_cpu_ns as f64 / c.pushed as f64
            },
        }
    }
}

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    /// Starts hints with `tap` (`Ok`), or records why there are none
    /// (`Err`, which names what is missing) and runs on without (module
    /// header, step 1). Does nothing when `[hints]` disables them.
    pub fn start_hints(&mut self, tap: Result<Box<dyn HintTap>, String>) {
        if self.hints.off.is_some() {
            return;
        }
        match tap {
            Ok(tap) => {
                let rate = self.distiller.budgets().iter().sum::<u64>() as f64
                    / (self.config.sleep() as f64 / 1e9);
                let capacity = self
                    .config
                    .hints
                    .capacity
                    .unwrap_or_else(|| HintStack::capacity_for(rate, &self.hints.interleave));
                self.hints.stack = HintStack::new(capacity, self.hints.max_age);
                self.hints.tap = Some(tap);
                info!(capacity, scan_pages_per_s = rate as u64, "I/O hints on");
                self.sync_hints(None);
            }
            Err(reason) => {
                warn!(reason = %reason, "I/O hints unavailable: running without them");
                self.hints.off = Some(reason);
            }
        }
    }

    /// After a refresh: the program watches the eligible processes, and
    /// the stacked hints follow their pages to the regions that hold them
    /// now (module header, step 2). Hints whose page is in no region now
    /// are dropped and counted.
    pub(super) fn sync_hints(&mut self, moves: Option<&Moves>) {
        let Some(tap) = self.hints.tap.as_mut() else {
            return;
        };
        tap.watch(&mut self.allowed.keys().copied());
        if let Some(moves) = moves
            && !self.hints.stack.is_empty()
        {
            self.hints.stack.remap(|p| moves.page(p));
        }
    }

    /// Drains the ring onto the stack (module header, step 3).
    pub(super) fn feed_hints(&mut self, now: Nanos) {
        let Some(tap) = self.hints.tap.as_mut() else {
            return;
        };
        let t0 = host::thread_cpu_ns();
        let mut ranges = Vec::new();
        self.hints.counts.events += tap.drain(&mut |r| ranges.push(r));
        // The scrubber re-indexes the guest pages that file data reached.
        if let Some(scrub) = self.scrub.as_mut() {
            for r in &ranges {
                scrub.note_io(r.tgid, r.start, r.pages);
            }
        }
        let feed = &mut self.hints;
        let debugging = tracing::enabled!(tracing::Level::DEBUG);
        let mut pushed_to: std::collections::BTreeMap<u64, u64> = Default::default();
        for HintedRange {
            tgid,
            start,
            pages,
            read,
        } in ranges
        {
            feed.counts.received += pages;
            let end = start.saturating_add(pages.saturating_mul(PAGE));
            let Some(regions) = self.by_address.of_process(tgid) else {
                feed.counts.untracked += pages;
                continue;
            };
            let mut covered = 0;
            // The first region that ends after `start`.
            let from = regions.partition_point(|&(_, e, _)| e <= start);
            for &(rs, re, id) in &regions[from..] {
                if rs >= end {
                    break;
                }
                let (a, b) = (rs.max(start), re.min(end));
                let n = (b - a) / PAGE;
                covered += n;
                match self.lives.mode(id) {
                    Some(Mode::Sampling) => {}
                    // Held for its writes: a read says the pages now hold
                    // file data, which is rarely rewritten soon (XLH
                    // §4.3.4); a write says only that the process wrote
                    // them out, and a buffer it writes from is the kind
                    // of memory the hold is about (a log line built and
                    // written, then built again).
                    Some(Mode::Held { .. }) if read => {}
                    Some(Mode::Held { .. }) => {
                        feed.counts.held_writes += n;
                        continue;
                    }
                    mode => {
                        // Said at debug: in about one run in five of the
                        // files experiment (2026-12-01) a reader's data
                        // between two marked runs was counted here though
                        // it was never marked; why is still open.
                        tracing::debug!(
                            tgid,
                            region = id.0,
                            start = rs,
                            end = re,
                            ?mode,
                            pages = n,
                            "hinted pages of a region already mergeable: not stacked"
                        );
                        feed.counts.mergeable += n;
                        continue;
                    }
                }
                for k in 0..n {
                    let page = ((a - rs) / PAGE + k) as u32;
                    feed.stack.push(Hint {
                        page: PageRef { region: id, page },
                        time: now,
                    });
                }
                feed.counts.pushed += n;
                if debugging {
                    *pushed_to.entry(id.0).or_default() += n;
                }
            }
            feed.counts.untracked += pages - covered.min(pages);
        }
        if !pushed_to.is_empty() {
            debug!(?pushed_to, "hinted pages stacked (region: pages)");
        }
        feed.counts.feed_cpu_ns += host::thread_cpu_ns().saturating_sub(t0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pagesift_core::RegionId;
    use pagesift_core::pipeline::hints::Hint;

    fn at(region: u64, page: u32) -> Hint {
        Hint {
            page: PageRef {
                region: RegionId(region),
                page,
            },
            time: 0,
        }
    }

    #[test]
    fn hints_follow_their_pages_when_a_region_is_cut() {
        // Region 1 (16 pages) is cut after its first 4 pages: pages 4..10
        // are region 2, pages 10.. were unmapped (`addresses::tests::a_cut`).
        let (before, after) = super::super::addresses::tests::a_cut();
        let moves = before.moves_to(&after);
        let mut stack = HintStack::new(16, u64::MAX);
        for h in [at(1, 2), at(1, 5), at(1, 9), at(1, 13), at(3, 1), at(4, 0)] {
            stack.push(h);
        }
        stack.remap(|p| moves.page(p));
        let got: Vec<(u64, u32)> = std::iter::from_fn(|| stack.pop(0))
            .map(|h| (h.page.region.0, h.page.page))
            .collect();
        // Newest first; page 13 is in no region now, and region 4 was
        // never known.
        assert_eq!(got, [(3, 1), (2, 5), (2, 1), (1, 2)]);
        assert_eq!(stack.stats().unmapped, 2);
    }
}
