//! Watching writes before marking (the module header of `daemon.rs`,
//! step 2, "watch writes"): which unmarked regions are write-tracked
//! through [`Target::sync_write_tracking`], reading where they were
//! written, and the verdict (`core::pipeline::write_watch`) that holds a
//! region whose writes would break its merged pages.
//!
//! Invariants: at most [`MAX_TRACKED_RANGES`] ranges in
//! [`MAX_TRACKED_PROCS`] processes are tracked at once; a range leaves
//! tracking in the wake that may mark it, before it is marked.

use super::*;

/// Most ranges, and processes, write-tracked at once: each range is a
/// userfaultfd registration in its owner and a page-table walk per read.
/// pagesift's choice.
pub const MAX_TRACKED_RANGES: usize = 64;
/// See [`MAX_TRACKED_RANGES`].
pub const MAX_TRACKED_PROCS: usize = 16;
/// A tracked region is not marked before its writes were watched this
/// long (a region may reach the top level soon after tracking began).
/// About the time a region spends on levels 1 and 2 of the full governor
/// (500 + 200 ms round times), so a steady climber rarely waits; enough
/// for UKSM §8.1.2's one write per 10 ms to show 50 writes. pagesift's
/// choice.
pub const WRITE_WATCH_MIN: Nanos = SEC / 2;
/// Writes of tracked regions are read at most this often.
pub(super) const WRITE_READ_INTERVAL: Nanos = SEC / 4;

/// The rules of the write verdict under `config` (see
/// `core::pipeline::write_watch`): a pass is `actuate.recheck_s`, the floor the one
/// accounting uses to unmark; a watch that the estimate would hold waits
/// up to two sweep spacings for the sweep's duplicate map (none without a
/// sweep).
pub(super) fn write_rules(config: &Config) -> WriteRules {
    let sweeping = config.scan.sweep_share > 0.0;
    WriteRules {
        watch_min: WRITE_WATCH_MIN,
        pass: config.actuate.recheck_s * SEC,
        min_breaks: MIN_BREAKS_FOR_DEMOTION,
        align: RUN_ALIGN_PAGES as u32,
        v_cow: config.ladder.v_cow,
        await_map: if sweeping {
            2 * config.scan.sweep_every_s * SEC
        } else {
            0
        },
        ..WriteRules::default()
    }
}

/// Whether a region's watched writes would make it thrash once merged, and
/// where (`core::pipeline::write_watch`). V_cow = 100 % (writes cannot stop
/// a promotion): cold. Not watched: cold, unless it was held (for its
/// writes, or unmarked for thrashing) since a watch last found it cold
/// (`held_since_cleared`) and writes are watched: then only a watch can
/// clear it again, so it waits for one. A region released from
/// its hold re-enters at the bottom, where nothing is watched, yet sampling
/// there still follows duplicate runs in it: in `pagesift bench --only
/// short-lived` (2026-11-27, daemon log read by hand) a heap held for hot
/// writes had a sampled run marked about 7 s later, its writes unseen.
pub(super) fn write_verdict(
    b: &Book,
    dup: f64,
    config: &Config,
    now: Nanos,
    held_since_cleared: bool,
) -> WriteVerdict {
    let watching = config.actuate.write_tracking && config.ladder.v_cow < 1.0;
    match &b.watch {
        Some(w) if config.ladder.v_cow < 1.0 => w.verdict(dup, now, &write_rules(config)),
        None if watching && held_since_cleared => WriteVerdict::Watching,
        _ => WriteVerdict::Cold,
    }
}

/// Whether `id` was held since a watch last judged it cold
/// (`Lifecycle::held_since_cleared`).
pub(super) fn held_since_cleared(lives: &Lifecycles, id: RegionId) -> bool {
    lives.get(id).is_some_and(|l| l.held_since_cleared())
}

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    /// Reads the writes of the tracked regions, then tracks exactly the
    /// candidates: unmarked regions on level 1 and up, or holding duplicate
    /// runs the sweep found, highest first,
    /// bounded; never a range that this wake may mark (a top-level region
    /// watched long enough and cold, a region with a duplicate run), so
    /// tracking always stops before marking.
    pub(super) fn watch_writes(&mut self, now: Nanos) {
        // V_cow = 100 %: writes cannot stop a promotion, so none are watched.
        if !self.config.actuate.write_tracking || self.config.ladder.v_cow >= 1.0 {
            if self.tracked > 0 {
                self.tracked = self.target.sync_write_tracking(&[]);
                self.books.values_mut().for_each(|b| b.watch = None);
                self.watched.clear();
            }
            return;
        }
        let read = now >= self.last_write_read + WRITE_READ_INTERVAL;
        if read {
            self.last_write_read = now;
        }
        let ladder = self.distiller.ladder();
        let top = ladder.levels() - 1;
        let runs: BTreeSet<RegionId> = (self.runs.iter())
            .flat_map(|r| std::iter::once(r.region).chain(r.twin.map(|t| t.region)))
            .collect();
        // Hinted runs are marked whatever the region's verdict (`hinting`):
        // their regions leave tracking now, whatever it says.
        let hinted: BTreeSet<RegionId> = (self.runs.iter())
            .filter(|r| r.hinted)
            .flat_map(|r| std::iter::once(r.region).chain(r.twin.map(|t| t.region)))
            .collect();
        let swept: BTreeSet<RegionId> = self.sweep_runs.iter().map(|r| r.region).collect();
        let (mut swept_ready, mut swept_hot) = (BTreeSet::new(), BTreeSet::new());
        let mut candidates: Vec<(usize, RegionId)> = Vec::new();
        let rules = write_rules(&self.config);
        // A bottom-level region neither watched nor swept is none of the
        // cases below: only the others are visited (with many thousands
        // of regions, a walk over every book at every wake-up was a large
        // part of the daemon's CPU, docs/reliability.md).
        let mut visit: BTreeSet<RegionId> = self.watched.clone();
        visit.extend(&swept);
        for level in 1..ladder.levels() {
            visit.extend(ladder.regions_at(level));
        }
        for id in visit {
            let Some(b) = self.books.get_mut(&id) else {
                continue;
            };
            if read && let Some(w) = &mut b.watch {
                let s = &b.span;
                match self.target.written_runs(s.proc.pid, s.start, s.end()) {
                    Some(runs) => {
                        for (a, e) in runs {
                            let first = (a.saturating_sub(s.start) / PAGE) as u32;
                            let end = (e.saturating_sub(s.start)).div_ceil(PAGE) as u32;
                            w.record(first, end, rules.zone_gap);
                        }
                        w.checkpoint(now);
                    }
                    None => b.watch = None,
                }
            }
            let level = ladder.level_of(id).unwrap_or(0);
            let held = held_since_cleared(&self.lives, id);
            let verdict = write_verdict(b, dup_share(ladder, id), &self.config, now, held);
            // Cold all over: cleared (the watch stops as soon as the
            // region may be marked, the clearance stays). Cold except some
            // zones is not (the zones outlive the watch in `exclude`, for
            // a whole mark only).
            if b.watch.is_some() && verdict == WriteVerdict::Cold {
                self.lives.clear_writes(id);
            }
            if swept.contains(&id) && b.watch.is_some() {
                match verdict {
                    WriteVerdict::Cold => {
                        swept_ready.insert(id);
                    }
                    WriteVerdict::Watching => {}
                    WriteVerdict::Hot | WriteVerdict::ColdExcept(_) => {
                        swept_hot.insert(id);
                    }
                }
            }
            // Duplicate runs are marked only in regions cold all over.
            let verdict_cold = verdict == WriteVerdict::Cold;
            let cold = verdict_cold || matches!(verdict, WriteVerdict::ColdExcept(_));
            let mode = self.lives.mode(id);
            let markable =
                level == top && mode == Some(Mode::Sampling) && cold && !b.awaits_watch(true, now);
            if markable && let WriteVerdict::ColdExcept(zones) = verdict {
                // Tracking stops below; the zones must outlive the watch.
                b.exclude = Some(zones);
            }
            if (level >= 1 || swept.contains(&id))
                && matches!(mode, Some(Mode::Sampling | Mode::Held { .. }))
                && !markable
                && !(runs.contains(&id) && verdict_cold)
                && !hinted.contains(&id)
                && !swept_ready.contains(&id)
                && self.allowed.contains_key(&b.span.proc.pid)
                && !self.self_managed.contains(&b.span.proc.pid)
                && !self.marks.overlaps(b.span.proc, b.span.start, b.span.end())
            {
                candidates.push((level, id));
            }
        }
        // The sweep's runs in regions judged cold are marked this wake
        // (tracking stops below first); in regions found hot they are
        // dropped; the others wait for their watch.
        for run in std::mem::take(&mut self.sweep_runs) {
            if swept_ready.contains(&run.region) {
                self.runs.push(run);
            } else if !swept_hot.contains(&run.region) {
                self.sweep_runs.push(run);
            }
        }
        candidates.sort_by_key(|&(level, id)| (std::cmp::Reverse(level), id));
        let mut pids = BTreeSet::new();
        let mut wanted = Vec::new();
        for (_, id) in candidates {
            let s = &self.books[&id].span;
            if wanted.len() == MAX_TRACKED_RANGES
                || (pids.len() == MAX_TRACKED_PROCS && !pids.contains(&s.proc.pid))
            {
                continue;
            }
            pids.insert(s.proc.pid);
            wanted.push((s.proc.pid, s.start, s.end(), id));
        }
        let ranges: Vec<(u32, u64, u64)> = wanted.iter().map(|w| (w.0, w.1, w.2)).collect();
        self.tracked = self.target.sync_write_tracking(&ranges);
        let wanted: BTreeSet<RegionId> = wanted.iter().map(|w| w.3).collect();
        let before = std::mem::take(&mut self.watched);
        for id in before.union(&wanted) {
            let Some(b) = self.books.get_mut(id) else {
                continue;
            };
            if !wanted.contains(id) {
                b.watch = None;
            } else if b.watch.is_none() {
                // Armed by the sync if it took: the first read says.
                let s = &b.span;
                if self
                    .target
                    .written_runs(s.proc.pid, s.start, s.end())
                    .is_some()
                {
                    b.arm_watch(now);
                    // The watch takes over from the wait for one.
                    b.raised_at = None;
                }
            }
        }
        self.watched = wanted;
    }
}
