//! Promotion and demotion (the module header of `daemon.rs`, step 3):
//! which regions and runs are marked `MADV_MERGEABLE` or unmarked this
//! wake-up, and the injection batches that do it.
//!
//! ## One actuation
//! 1. Regions on the top level are judged: one whose write watch has not
//!    given its verdict yet waits, one whose writes would thrash is held,
//!    one whose process is expected to unmap it young waits
//!    (`recurring.rs`); the rest is marked whole, or around its written
//!    and unique zones. Regions that accounting found thrashing are
//!    unmarked.
//! 2. Duplicate runs (sampled, hinted, or found by the sweep and judged
//!    cold by their region's watch) are padded, aligned to
//!    [`RUN_ALIGN_PAGES`], clamped to their region and joined
//!    ([`Daemon::run_items`]), within each process's VMA-split budget and
//!    at most [`MAX_RUN_MARKS_PER_WAKE`] a wake-up. Unmerged stretches of
//!    settled regions (queued by `accounting`) are unmarked within the
//!    same budget and limit ([`Daemon::trim_items`]).
//! 3. Each process gets one injection batch ([`Daemon::run_batch`]):
//!    adjacent ranges coalesced, the marks written ahead in the crash
//!    ledger (`Journal`), and a process that cannot be injected now
//!    skipped and retried later.
//!
//! Invariants: only ranges in the [`Marks`] ledger are ever unmarked; a
//! range enters it once the call that marked it succeeded, and the crash
//! ledger on disk names it from before the call on (`crate::ledger`).

use super::*;

/// How far sampling's duplicate share must exceed the share of a region
/// outside its unique zones for the zones to be set aside
/// ([`zones_contradicted`]): half the default V_dup, so that sampling
/// noise around a region's true share does not. pagesift's choice.
pub(super) const ZONE_CONTRADICTION: f64 = 0.05;

/// Longest a region raised by the sweep stays parked on the top level
/// without being marked or held (its process was skipped, its watch kept
/// saying "watching"): then it is sampled again like any top-level region.
pub(super) const RAISED_PARK_MAX: Nanos = 30 * SEC;
/// Most runs marked in one process per wake-up: bounds the VMA splits one
/// wake can add (two per run at most) well below any split budget.
pub const MAX_RUN_MARKS_PER_WAKE: usize = 16;

/// One `madvise` the loop wants, and for which region.
#[derive(Clone, Copy, Debug)]
pub(super) struct Item {
    pub(super) id: RegionId,
    pub(super) advice: Advice,
    /// The whole region (promotion or demotion), or a run inside it.
    pub(super) whole: bool,
}

impl Item {
    /// `MADV_MERGEABLE` on `[start, end)`, a part of region `id`.
    pub(super) fn mark_part(id: RegionId, start: u64, end: u64) -> Item {
        Item {
            id,
            advice: Advice {
                start,
                len: end - start,
                mergeable: true,
            },
            whole: false,
        }
    }
}

/// Whether sampling's duplicate share `dup` (of a region of `pages`
/// pages) exceeds, by [`ZONE_CONTRADICTION`] or more, the share of the
/// region outside its unique zones `unique`: the samples found duplicates
/// where the sweep saw none. The sweep cannot see the twins that are
/// merged pages (it reads no KSM page, and settled regions are not in
/// its full epochs), which the sampler's stable index holds: in `pagesift
/// bench --quick --only files` without hints (2026-11-27, daemon log read
/// by hand), the readers whose file data ksmd had merged before the first
/// epoch left the fourth reader's copy without a twin, all of it a unique
/// zone, and its region was held instead of marked (36.5 of 48 MiB saved
/// at the end of the 30 s window). A region the sweep raised carries the
/// sweep's own ratio, which never exceeds the share outside its zones.
pub(super) fn zones_contradicted(unique: &[(u32, u32)], pages: u32, dup: f64) -> bool {
    if unique.is_empty() || pages == 0 {
        return false;
    }
    let inside: u64 = unique.iter().map(|&(s, e)| u64::from(e - s)).sum();
    let outside = 1.0 - inside as f64 / f64::from(pages);
    dup >= outside + ZONE_CONTRADICTION
}

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    pub(super) fn actuate(&mut self, now: Nanos, summary: &mut WakeSummary) {
        let top = self.distiller.ladder().levels() - 1;
        let watching = self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0;
        let mut batches: BTreeMap<u32, Vec<Item>> = BTreeMap::new();
        for id in self.distiller.ladder().regions_at(top) {
            let Some(b) = self.books.get_mut(&id) else {
                continue;
            };
            if let Some(Mode::Held { until }) = self.lives.mode(id) {
                if now < until {
                    continue;
                }
                self.lives.release(id, now);
            }
            // Merged, settled, and back at the top: merged pages are no
            // duplicates to the sampler, so new ones appeared in it (a
            // guest filled pages, say) that the trickle would take minutes
            // to reach. ksmd merges it again at the active pace, as UKSM
            // gives a climbing region the top level's CPU (out of the
            // ladder again until it settles). ksmd's pace counts the new
            // duplicates the ladder's last verdict found in it (merged
            // pages are no duplicates to the sampler), not all of its
            // unmerged pages (`Lifecycle::waiting_pages`).
            let merged = self.lives.get(id).map_or(0, |l| l.merged_now());
            if self.lives.remerge(id, self.ksm_now.full_scans, now) {
                let new = (dup_share(self.distiller.ladder(), id) * f64::from(b.span.pages)).ceil();
                self.lives.expect(id, merged + new as u64);
                self.counters.remerges += 1;
                summary.remerging.push(id);
                info!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    "new duplicates in a merged region: merging it again"
                );
                continue;
            }
            let sampling = self.lives.mode(id) == Some(Mode::Sampling);
            if b.parked_at
                .is_some_and(|t| !sampling || now >= t + RAISED_PARK_MAX)
            {
                b.parked_at = None;
                self.distiller.readmit(id);
            }
            if !sampling || b.awaits_watch(watching, now) {
                continue;
            }
            if expected_short(&self.lifespans, &self.config, b, now) {
                // On the top level when its process's first early death
                // was seen: hidden from the next wake on.
                continue;
            }
            let dup = dup_share(self.distiller.ladder(), id);
            let verdict = match &b.exclude {
                Some(zones) => WriteVerdict::ColdExcept(zones.clone()),
                None => write_verdict(
                    b,
                    dup,
                    &self.config,
                    now,
                    held_since_cleared(&self.lives, id),
                ),
            };
            let exclude = match verdict {
                WriteVerdict::Hot => {
                    // Out of the ladder while held (see `release_holds`).
                    self.lives.hold(id, now, self.config.actuate.write_hold_s);
                    let w = b.watch.as_ref();
                    info!(
                        pid = b.span.proc.pid,
                        start = b.span.start,
                        pages = b.span.pages,
                        dup,
                        writes = w.map_or(0, |w| w.writes()),
                        on_duplicates = w.and_then(|w| w.writes_on_duplicates()),
                        watched_s =
                            w.map_or(0.0, |w| now.saturating_sub(w.since()) as f64 / SEC as f64),
                        "writes would break its merged pages: not promoted, held"
                    );
                    continue;
                }
                WriteVerdict::Watching => {
                    // Watched long enough but waiting for the sweep's map
                    // of its duplicates: parked, as a raised region is,
                    // since top-level samples would only spend the top
                    // level's share re-finding what got it here.
                    let waiting = b
                        .watch
                        .as_ref()
                        .is_some_and(|w| now >= w.since() + WRITE_WATCH_MIN);
                    if waiting && b.parked_at.is_none() && self.distiller.park(id) {
                        b.parked_at = Some(now);
                    }
                    continue;
                }
                WriteVerdict::Cold => None,
                WriteVerdict::ColdExcept(zones) => Some(zones),
            };
            // Stretches the last sweep found without duplicates are left
            // out too: ksmd would visit them every full scan for nothing.
            // Unless sampling contradicts them (see `zones_contradicted`):
            // then the sweep was blind to the twins (merged content) or
            // its view is older than the samples, and marking around the
            // zones would leave duplicates out.
            // (Only a real judgement counts: `dup` assumes the worst
            // before the first.)
            let mut unique = b.fresh_unique(now);
            let sampled = (self.distiller.ladder().region_stats(id)).filter(|s| s.judged > 0);
            if sampled.is_some_and(|s| zones_contradicted(&unique, b.span.pages, s.last_dup_ratio))
            {
                info!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    dup,
                    unique_zones = unique.len(),
                    "sampling found more duplicates than the sweep's unique zones leave room \
                     for: marking without them"
                );
                unique.clear();
            }
            // And pages held under another id (their VMA was joined or
            // split since the hold, `HeldSpans`): marked, they would be
            // broken again.
            let held = self.held_spans.zones(&b.span, now);
            let (unique_zones, held_zones) = (unique.len(), held.len());
            if !held.is_empty() {
                unique = join_zones(&unique, &held);
            }
            let exclude = match (exclude, unique.is_empty()) {
                (exclude, true) => exclude,
                (written, false) => Some(join_zones(&written.unwrap_or_default(), &unique)),
            };
            let pid = b.span.proc.pid;
            if self.self_managed.contains(&pid)
                || self
                    .inject_skips
                    .get(&pid)
                    .is_some_and(|s| s.retry_at.is_some_and(|t| now < t))
            {
                continue;
            }
            let Some(zones) = exclude else {
                b.expected_dups = Some((dup * f64::from(b.span.pages)).ceil() as u64);
                batches.entry(pid).or_default().push(Item {
                    id,
                    advice: Advice {
                        start: b.span.start,
                        len: b.span.end() - b.span.start,
                        mergeable: true,
                    },
                    whole: true,
                });
                continue;
            };
            // Written in places only: mark the rest, in pieces long enough
            // to be worth a VMA of their own; the written zones stay
            // unmarked and become regions of their own (see
            // core::pipeline::write_watch).
            let min = (self.config.actuate.run_min_pages as u64).max(RUN_ALIGN_PAGES);
            let mut from = 0u64;
            let (mut pieces, mut worth) = (0, 0);
            for &(zs, ze) in zones
                .iter()
                .chain(std::iter::once(&(b.span.pages, b.span.pages)))
            {
                let (zs, ze) = (u64::from(zs), u64::from(ze));
                if zs >= from + min {
                    worth += 1;
                    let (s, e) = (b.span.start + from * PAGE, b.span.start + zs * PAGE);
                    if !self.marks.covers(b.span.proc, s, e) {
                        batches
                            .entry(pid)
                            .or_default()
                            .push(Item::mark_part(id, s, e));
                        pieces += 1;
                    }
                }
                from = from.max(ze);
            }
            if pieces > 0 {
                self.counters.partial_marks += 1;
                info!(
                    pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    zones = zones.len(),
                    unique_zones,
                    pieces,
                    "written or unique in places: marking the rest of the region"
                );
            } else if worth == 0 && (unique_zones > 0 || held_zones > 0) {
                // Nothing but stretches without duplicates (sampling's
                // evidence is older than the sweep's or was luck) or held
                // under another id. Held, so that it is not judged again
                // at every wake.
                self.lives.hold(id, now, self.config.actuate.write_hold_s);
                info!(
                    pid,
                    start = b.span.start,
                    pages = b.span.pages,
                    unique_zones,
                    held_zones,
                    "no duplicates outside its unique or held zones: not promoted, held"
                );
            }
        }
        // A region merged again from the top has its first pass now, before
        // ksmd is paced for it: the pages it lost since it settled are its
        // COW breaks (`core::pipeline::lifecycle`'s thrashing rule), and a
        // ksmd at a small set's quick rate can merge them again before the
        // next wake-up's pass would see them broken. Larger regions take
        // ksmd longer than that and wait for the budgeted pass.
        let rules = account_rules(&self.config);
        for id in summary.remerging.clone() {
            let small = self
                .lives
                .get(id)
                .is_some_and(|l| u64::from(l.pages()) <= REMERGE_PASS_PAGES);
            if small {
                let mut budget = REMERGE_PASS_PAGES;
                self.account_region(id, now, self.ksm_now.full_scans, &rules, &mut budget);
            }
        }
        self.ready_sweep_runs();
        for (pid, item) in self.run_items(now, &batches) {
            batches.entry(pid).or_default().push(item);
        }
        for id in std::mem::take(&mut self.pending_unmarks) {
            let Some(b) = self.books.get(&id) else {
                continue;
            };
            if self.lives.mode(id) != Some(Mode::Promoted)
                || !self.marks.covers(b.span.proc, b.span.start, b.span.end())
            {
                continue; // never unmark what pagesift did not mark
            }
            batches.entry(b.span.proc.pid).or_default().push(Item {
                id,
                advice: Advice {
                    start: b.span.start,
                    len: b.span.end() - b.span.start,
                    mergeable: false,
                },
                whole: true,
            });
        }
        for (pid, item) in self.trim_items(now, &batches) {
            batches.entry(pid).or_default().push(item);
        }
        for (pid, items) in batches {
            self.run_batch(pid, items, now, summary);
        }
    }

    /// The `MADV_UNMERGEABLE` calls for the unmerged stretches of settled
    /// regions that `accounting` queued ("Trimming a settled region" in
    /// `core::pipeline::lifecycle`), per process, within its VMA-split
    /// budget after the calls already in `batches` (a stretch inside a
    /// marked VMA splits it in three) and at most
    /// [`MAX_RUN_MARKS_PER_WAKE`] a wake-up; the rest wait for the next
    /// wake. A stretch is dropped once its region is no longer promoted
    /// or no longer holds it, or once the range is not all pagesift's.
    pub(super) fn trim_items(
        &mut self,
        now: Nanos,
        batches: &BTreeMap<u32, Vec<Item>>,
    ) -> Vec<(u32, Item)> {
        let limit = self.vma_limit();
        // Per process: VMAs once this wake's marks are made, trims taken.
        let mut used: BTreeMap<u32, (u64, usize)> = BTreeMap::new();
        let mut out = Vec::new();
        for (id, s, e) in std::mem::take(&mut self.pending_trims) {
            let Some(b) = self.books.get(&id) else {
                continue;
            };
            let pid = b.span.proc.pid;
            let demoted_now = batches
                .get(&pid)
                .is_some_and(|v| v.iter().any(|i| i.id == id && i.whole));
            if self.lives.mode(id) != Some(Mode::Promoted)
                || s < b.span.start
                || e > b.span.end()
                || !self.marks.covers(b.span.proc, s, e)
                || demoted_now
            {
                continue;
            }
            let (vmas, taken) = used
                .entry(pid)
                .or_insert_with(|| (self.vmas_after_marks(pid, batches), 0));
            let n = self.splits(id, s, e);
            if !self.injectable(pid, now)
                || *taken == MAX_RUN_MARKS_PER_WAKE
                || vmas.saturating_add(n) > limit
            {
                self.pending_trims.push((id, s, e));
                continue;
            }
            *vmas += n;
            *taken += 1;
            out.push((
                pid,
                Item {
                    id,
                    advice: Advice {
                        start: s,
                        len: e - s,
                        mergeable: false,
                    },
                    whole: false,
                },
            ));
        }
        out
    }

    /// Without write watching, the sweep's runs are marked at once (with
    /// it, [`Daemon::watch_writes`] releases them region by region, once
    /// the region's watch has judged it cold all over: the sweep sees
    /// content, not writes, and a page rewritten with the same bytes looks
    /// stable to it, while marking it would induce COW faults).
    pub(super) fn ready_sweep_runs(&mut self) {
        if !(self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0) {
            self.runs.append(&mut self.sweep_runs);
        }
    }

    /// VMA splits that marking `[start, end)` of region `id` adds: one on
    /// each side that falls inside its VMA.
    pub(super) fn splits(&self, id: RegionId, start: u64, end: u64) -> u64 {
        self.books.get(&id).map_or(0, |b| {
            u64::from(b.span.vma_start < start) + u64::from(b.span.vma_end > end)
        })
    }

    /// The VMA count no process is taken past (`actuate.max_map_count_fraction`
    /// of `vm.max_map_count`).
    pub(super) fn vma_limit(&self) -> u64 {
        (self.target.max_map_count() as f64 * self.config.actuate.max_map_count_fraction) as u64
    }

    /// `pid`'s VMAs once the marks already in `batches` are made (unknown:
    /// as many as can be, so that nothing more is split).
    pub(super) fn vmas_after_marks(&self, pid: u32, batches: &BTreeMap<u32, Vec<Item>>) -> u64 {
        let marks: u64 = (batches.get(&pid).into_iter().flatten())
            .filter(|i| i.advice.mergeable)
            .map(|i| self.splits(i.id, i.advice.start, i.advice.end()))
            .sum();
        (self.target.vma_count(pid).unwrap_or(u64::MAX)).saturating_add(marks)
    }

    /// Whether pagesift may inject into `pid` now.
    pub(super) fn injectable(&self, pid: u32, now: Nanos) -> bool {
        let waiting = self
            .inject_skips
            .get(&pid)
            .is_some_and(|s| s.retry_at.is_some_and(|t| now < t));
        !self.self_managed.contains(&pid) && !waiting
    }

    /// The `MADV_MERGEABLE` calls for the runs of the last wake (see the
    /// `daemon.rs` module header, step 3), per process, within each process's
    /// VMA-split budget after the calls already in `batches`.
    pub(super) fn run_items(
        &mut self,
        now: Nanos,
        batches: &BTreeMap<u32, Vec<Item>>,
    ) -> Vec<(u32, Item)> {
        let runs = std::mem::take(&mut self.runs);
        let min = self.config.actuate.run_min_pages;
        if min == 0 {
            return Vec::new();
        }
        let pad = self.config.actuate.run_pad_pages as u64;
        let align = RUN_ALIGN_PAGES * PAGE;
        // Both sides of every long enough run, as page ranges of regions.
        let mut sides: Vec<(RegionId, u64, u64, bool)> = Vec::new();
        for run in runs.iter().filter(|r| r.pages >= min || r.hinted) {
            sides.push((run.region, run.first as u64, run.end() as u64, run.hinted));
            if let Some(t) = run.twin {
                let end = t.page as u64 + run.pages as u64;
                sides.push((t.region, t.page as u64, end, run.hinted));
            }
        }
        // Padded, aligned, clamped address ranges of sampling regions.
        let mut ranges: BTreeMap<u32, Vec<(RegionId, u64, u64)>> = BTreeMap::new();
        for (id, first, end, hinted) in sides {
            let Some(b) = self.books.get(&id) else {
                continue;
            };
            let pid = b.span.proc.pid;
            let whole_now = batches
                .get(&pid)
                .is_some_and(|v| v.iter().any(|i| i.id == id && i.whole));
            // Hinted runs: held regions too, no write verdict (`hinting`).
            let mode = self.lives.mode(id);
            let held = matches!(mode, Some(Mode::Held { .. }));
            if !(mode == Some(Mode::Sampling) || (hinted && held))
                || whole_now
                || (!hinted && expected_short(&self.lifespans, &self.config, b, now))
                || !self.injectable(pid, now)
                || (!hinted
                    && write_verdict(
                        b,
                        dup_share(self.distiller.ladder(), id),
                        &self.config,
                        now,
                        held_since_cleared(&self.lives, id),
                    ) != WriteVerdict::Cold)
            {
                continue;
            }
            // A hinted run was followed page by page to where it ends (up
            // to HINT_RUN_EXTEND_PAGES a side): padding it would only hand
            // ksmd pages no hint named (guest page cache is scattered
            // through guest RAM, so most hinted runs are short).
            let pad = if hinted { 0 } else { pad };
            let s = (b.span.start + first.saturating_sub(pad) * PAGE) / align * align;
            let e = (b.span.start + (end + pad) * PAGE).div_ceil(align) * align;
            let (s, e) = (s.max(b.span.start), e.min(b.span.end()));
            // A run over pages held under another id: not before the
            // hold ends (`HeldSpans`), unless a hint names it, as above.
            if s < e
                && !self.marks.covers(b.span.proc, s, e)
                && (hinted || !self.held_spans.touches(b.span.proc, s, e, now))
            {
                if hinted {
                    self.hints.marked((e - s) / PAGE);
                }
                ranges.entry(pid).or_default().push((id, s, e));
            }
        }
        let limit = self.vma_limit();
        let mut out = Vec::new();
        for (pid, mut rs) in ranges {
            // Join overlapping or touching ranges of one region.
            rs.sort_by_key(|&(id, s, _)| (id, s));
            let mut joined: Vec<(RegionId, u64, u64)> = Vec::with_capacity(rs.len());
            for (id, s, e) in rs {
                match joined.last_mut() {
                    Some(l) if l.0 == id && s <= l.2 => l.2 = l.2.max(e),
                    _ => joined.push((id, s, e)),
                }
            }
            // The split budget left after this wake's whole-region marks.
            let mut used = self.vmas_after_marks(pid, batches);
            let mut taken = 0;
            for (id, s, e) in joined {
                let n = self.splits(id, s, e);
                if taken == MAX_RUN_MARKS_PER_WAKE || used.saturating_add(n) > limit {
                    debug!(
                        pid,
                        start = s,
                        len = e - s,
                        used,
                        limit,
                        "a duplicate run waits: VMA budget"
                    );
                    continue;
                }
                used += n;
                taken += 1;
                out.push((pid, Item::mark_part(id, s, e)));
            }
        }
        out
    }

    pub(super) fn run_batch(
        &mut self,
        pid: u32,
        items: Vec<Item>,
        now: Nanos,
        summary: &mut WakeSummary,
    ) {
        let Some(&key) = self.allowed.get(&pid) else {
            return;
        };
        if !self.target.same_process(key) {
            // It exec'd (or exited) since the refresh: these ranges are the
            // old image's. Judge the new one at the next refresh.
            self.force_refresh = true;
            return;
        }
        let calls = coalesce(items.iter().map(|i| i.advice).collect());
        // VMA splits: a marked range that starts or ends inside its VMA.
        let splits_of = |c: &Advice| -> u64 {
            let first = items.iter().find(|i| i.advice.start == c.start);
            let last = items.iter().find(|i| i.advice.end() == c.end());
            let mut n = 0;
            if let Some(i) = first
                && self
                    .books
                    .get(&i.id)
                    .is_some_and(|b| b.span.vma_start < c.start)
            {
                n += 1;
            }
            if let Some(i) = last
                && self
                    .books
                    .get(&i.id)
                    .is_some_and(|b| b.span.vma_end > c.end())
            {
                n += 1;
            }
            n
        };
        // A trim (an unmark inside a region) splits too; a demotion unmarks
        // what was marked whole, which split its VMA already.
        let trims_in = |c: &Advice| {
            items.iter().any(|i| {
                !i.whole
                    && !i.advice.mergeable
                    && i.advice.start >= c.start
                    && i.advice.end() <= c.end()
            })
        };
        let splits: Vec<u64> = calls
            .iter()
            .map(|c| {
                if c.mergeable || trims_in(c) {
                    splits_of(c)
                } else {
                    0
                }
            })
            .collect();
        let new_splits: u64 = splits.iter().sum();
        if new_splits > 0 {
            let limit = self.vma_limit();
            let vmas = self.target.vma_count(pid).unwrap_or(u64::MAX);
            if vmas.saturating_add(new_splits) > limit {
                self.skip_injection(
                    pid,
                    format!(
                        "VMA budget: {vmas} VMAs, marking would add {new_splits}, limit {limit} \
                         (actuate.max_map_count_fraction of vm.max_map_count)"
                    ),
                    now,
                    SKIP_RETRY,
                );
                return;
            }
        }
        // Written down before they are made (`Journal`): a daemon killed
        // between the marks and the end of this wake-up must leave them
        // in its ledger.
        let ahead: Vec<(u64, u64)> = (calls.iter())
            .filter(|c| c.mergeable)
            .map(|c| (c.start, c.end()))
            .collect();
        if let (false, Some(journal)) = (ahead.is_empty(), self.journal.as_mut())
            && let Err(e) = journal.intend(key, &ahead)
        {
            self.skip_injection(
                pid,
                format!("{e}: nothing is marked until it can be"),
                now,
                SKIP_RETRY,
            );
            return;
        }
        summary.batches += 1;
        self.counters.batches += 1;
        for c in &calls {
            debug!(
                pid,
                start = c.start,
                len = c.len,
                mergeable = c.mergeable,
                "madvise"
            );
        }
        let outcome = self.actuator.advise_as(key, &calls);
        self.marked_pids.insert(pid); // see the new flags and splits
        if let BatchOutcome::Done(results) = &outcome {
            for (c, r) in calls.iter().zip(results) {
                match r {
                    Ok(()) => self.target.note_advised(pid, c.start, c.end(), c.mergeable),
                    Err(_) => self.target.distrust_mergeable(pid),
                }
            }
        }
        match outcome {
            BatchOutcome::Done(results) => {
                self.inject_skips.remove(&pid);
                if results.len() < calls.len() {
                    // Abandoned part-way: what ran is recorded below, the
                    // rest is tried again soon.
                    self.skip_injection(
                        pid,
                        "a call could not start in time (frozen?): the rest of the batch did not run"
                            .into(),
                        now,
                        BUSY_RETRY,
                    );
                }
                for ((call, res), split) in calls.iter().zip(results).zip(splits) {
                    let inside: Vec<Item> = items
                        .iter()
                        .filter(|i| {
                            i.advice.mergeable == call.mergeable
                                && i.advice.start >= call.start
                                && i.advice.end() <= call.end()
                        })
                        .copied()
                        .collect();
                    for i in inside.iter().filter(|i| !i.whole && i.advice.mergeable) {
                        if res.is_ok() {
                            self.counters.run_marks += 1;
                            self.pending_run_pages += i.advice.len / PAGE;
                            summary.run_marks.push((pid, i.advice));
                            info!(
                                pid,
                                start = i.advice.start,
                                pages = i.advice.len / PAGE,
                                "marked part of a region mergeable (a duplicate run, or around written zones)"
                            );
                        }
                    }
                    let covered: Vec<RegionId> =
                        inside.iter().filter(|i| i.whole).map(|i| i.id).collect();
                    match res {
                        Ok(()) if call.mergeable => {
                            self.marks.add(key, call.start, call.end());
                            self.counters.marks += 1;
                            self.counters.vma_splits += split;
                            for id in covered {
                                if let Some(b) = self.books.get_mut(&id) {
                                    // Out of the ladder until it settles.
                                    self.lives.mark(id, self.ksm_now.full_scans, now);
                                    if let Some(e) = b.expected_dups.take() {
                                        self.lives.expect(id, e);
                                        b.marked_dup = Some(
                                            (e as f64 / f64::from(b.span.pages.max(1))).min(1.0),
                                        );
                                    }
                                    summary.promoted.push(id);
                                    info!(
                                        pid,
                                        start = b.span.start,
                                        pages = b.span.pages,
                                        age_s = b.age_s(now),
                                        "promoted: marked mergeable"
                                    );
                                }
                            }
                        }
                        Ok(()) => {
                            self.marks.remove(key, call.start, call.end());
                            self.counters.unmarks += 1;
                            self.counters.vma_splits += split;
                            for i in inside.iter().filter(|i| !i.whole) {
                                let Some(b) = self.books.get(&i.id) else {
                                    continue;
                                };
                                self.counters.trims += 1;
                                self.counters.trimmed_pages += i.advice.len / PAGE;
                                self.trimmed_spans.push((key, b.span.start, b.span.end()));
                                info!(
                                    pid,
                                    start = i.advice.start,
                                    pages = i.advice.len / PAGE,
                                    region_start = b.span.start,
                                    region_pages = b.span.pages,
                                    "trimmed: unmarked a stretch ksmd left unmerged in a settled region"
                                );
                            }
                            for id in covered {
                                if let Some(b) = self.books.get(&id) {
                                    // Out of the ladder while held (see
                                    // `release_holds`).
                                    let pass = self.lives[id].last_pass();
                                    self.lives.hold(id, now, self.config.actuate.demote_hold_s);
                                    summary.demoted.push(id);
                                    info!(
                                        pid,
                                        start = b.span.start,
                                        pages = b.span.pages,
                                        merged = pass.merged,
                                        cow = pass.cow,
                                        "demoted: thrashing, unmarked"
                                    );
                                }
                            }
                        }
                        Err(errno) => {
                            warn!(
                                pid,
                                start = call.start,
                                len = call.len,
                                errno,
                                mergeable = call.mergeable,
                                "madvise failed in the target"
                            );
                            for id in covered {
                                if self.books.contains_key(&id) && call.mergeable {
                                    self.lives.hold(id, now, self.config.actuate.demote_hold_s);
                                }
                            }
                        }
                    }
                }
            }
            BatchOutcome::Skipped(reason) => self.skip_injection(pid, reason, now, SKIP_RETRY),
            BatchOutcome::Busy(reason) => self.skip_injection(pid, reason, now, BUSY_RETRY),
            BatchOutcome::Gone => {}
            BatchOutcome::Failed(reason) => {
                warn!(pid, reason = %reason, "injection failed");
                self.skip_injection(pid, format!("injection failed: {reason}"), now, SKIP_RETRY);
            }
        }
    }

    pub(super) fn skip_injection(&mut self, pid: u32, reason: String, now: Nanos, retry: Nanos) {
        let comm = self.comms.get(&pid).cloned().unwrap_or_default();
        if self
            .inject_skips
            .get(&pid)
            .is_none_or(|s| s.reason != reason)
        {
            info!(pid, comm = %printable(&comm), reason = %reason, "process skipped");
        }
        self.inject_skips.insert(
            pid,
            SkipEntry {
                comm,
                reason,
                retry_at: Some(now + retry),
            },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_are_contradicted_only_by_more_duplicates_than_room_outside_them() {
        // No zones: nothing to contradict.
        assert!(!zones_contradicted(&[], 1024, 1.0));
        // Zones over the whole region: any duplicate share of 5 % or more.
        assert!(zones_contradicted(&[(0, 1024)], 1024, 0.1));
        assert!(!zones_contradicted(&[(0, 1024)], 1024, 0.04));
        // Half the region in zones: sampling's 50 % fits beside them, 60 % not.
        let half = [(0, 256), (512, 768)];
        assert!(!zones_contradicted(&half, 1024, 0.5));
        assert!(zones_contradicted(&half, 1024, 0.6));
    }
}
