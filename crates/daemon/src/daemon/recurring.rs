//! Short-lived and recurring regions (docs/short-lived.md): regions of a
//! process whose large regions die young wait before they are marked
//! (`core::pipeline::lifespan`), and a region mapped again where a marked
//! one was is raised to the top at once on its predecessors' evidence
//! (`core::pipeline::recurrence`), then probed until merging is seen.
//!
//! Invariants: `short_lived` is rebuilt from the books at each look
//! ([`Daemon::hide_short_lived`]), which comes whenever the regions or
//! the sampling set changed and at least every [`SHORT_LOOK_EVERY`]; it
//! holds only regions that were sampling at the last look;
//! `probing` holds regions raised on history until one is seen merging,
//! leaves the top level unmarked, stops merging or is gone.

use super::*;

/// Longest the short-lived verdicts go unjudged while the regions and the
/// sampling set stay the same ([`Daemon::short_look_due`]): only time
/// moves them then, by letting a region outlive its process's early
/// deaths (it comes back to the ladder up to this late, after living
/// seconds at least) or a death age out of the rule's memory. Judging
/// every region at every wake-up took 5.7 % of the daemon's samples with
/// ten guests, whose QEMUs all had early deaths (docs/daemon-cpu.md, "At
/// the full size"); the daemon woke about eight times a second there, so
/// a tenth of a second saved nothing (a quick vm-boot run by hand,
/// 2026-12-03: 458 of 459 looks came from the timer). pagesift's choice.
pub(super) const SHORT_LOOK_EVERY: Nanos = SEC;

/// Pages a probe of a region raised on history looks at
/// (`Daemon::probe_recurring`).
pub(super) const PROBE_PAGES: usize = 64;

/// How a region's life ended, for the recurrence rule: `marked` whole by
/// pagesift when it went, with `life` its lifecycle then.
pub(super) fn ending_of(b: &Book, life: Option<&Lifecycle>, marked: bool) -> Ending {
    match (life, b.marked_dup) {
        (Some(l), Some(dup)) if marked => Ending::Marked {
            dup,
            raised: b.raised_on_history,
            merged: b.seen_merged || l.merged_now() > 0,
        },
        _ => Ending::Unmarked,
    }
}

/// Whether `b` is expected to be unmapped before ksmd could merge it, its
/// process's large regions having died young (`core::pipeline::lifespan`),
/// and the config says to wait.
pub(super) fn expected_short(
    lifespans: &Lifespans<ProcKey>,
    config: &Config,
    b: &Book,
    now: Nanos,
) -> bool {
    config.actuate.skip_short_lived
        && lifespans.expected_short(b.span.proc, b.span.pages, b.first_seen, now)
}

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    /// Whether the short-lived verdicts must be judged again at `now`: the
    /// regions changed (a refresh or a new ladder asks for a sync), a
    /// region started or stopped sampling, or [`SHORT_LOOK_EVERY`] passed.
    pub(super) fn short_look_due(&self, now: Nanos) -> bool {
        let changes = self.lives.sampling_changes();
        self.need_sync
            || self.short_looked.is_none_or(|(at, seen)| {
                seen != changes || now >= at.saturating_add(SHORT_LOOK_EVERY)
            })
    }

    /// The regions expected to be unmapped young (see `expected_short`)
    /// that are sampling: kept out of the ladder, as held ones are, so
    /// that they neither climb nor keep the upper levels (and the daemon)
    /// busy for memory that will be gone before it could be merged. One
    /// that outlives its process's early deaths comes back at the bottom.
    /// Whether the set changed.
    pub(super) fn hide_short_lived(&mut self, now: Nanos) -> bool {
        self.short_looked = Some((now, self.lives.sampling_changes()));
        if self.lifespans.is_empty() && self.short_lived.is_empty() {
            return false;
        }
        let mut short = BTreeSet::new();
        let allowed = &self.allowed;
        (self.short_logged).retain(|k| allowed.get(&k.pid) == Some(k));
        for (&id, b) in &mut self.books {
            // The lifespan test first: it is false for most regions and
            // asks a map of a few processes, where the mode's lookup
            // searches every region's.
            if !expected_short(&self.lifespans, &self.config, b, now)
                || self.lives.mode(id) != Some(Mode::Sampling)
            {
                continue;
            }
            short.insert(id);
            if !b.short_noted {
                b.short_noted = true;
                // Once per process at info: a process that maps anew every
                // second would otherwise write a line a second for good.
                let first = self.short_logged.insert(b.span.proc);
                let (pid, start, pages, age_s) =
                    (b.span.proc.pid, b.span.start, b.span.pages, b.age_s(now));
                let what = "its process's regions are unmapped young: not sampled or marked until it outlives them";
                if first {
                    info!(pid, start, pages, age_s, "{what} (said once per process)");
                } else {
                    debug!(pid, start, pages, age_s, "{what}");
                }
            }
        }
        if short == self.short_lived {
            return false;
        }
        self.short_lived = short;
        true
    }

    /// Raises the regions mapped where their process's last region of
    /// their size was marked (`core::pipeline::recurrence`) to the top
    /// level, once the ladder has them: actuation marks them as it does a
    /// region raised by the sweep (after a write watch, with write
    /// tracking on).
    pub(super) fn raise_recurring(&mut self, now: Nanos) {
        let watching = self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0;
        for (&id, b) in &mut self.books {
            let Some(dup) = b.recurring else {
                continue;
            };
            if !self.distiller.ladder().contains(id) {
                // Hidden (held, expected short): no longer a candidate.
                if self.lives.mode(id) != Some(Mode::Sampling) || self.short_lived.contains(&id) {
                    b.recurring = None;
                }
                continue;
            }
            b.recurring = None;
            if !self.distiller.raise_on_history(id, dup) {
                continue;
            }
            b.raised_on_history = true;
            self.probing.insert(id);
            b.raised_at = Some(now);
            let parked = watching && self.distiller.park(id);
            b.parked_at = parked.then_some(now);
            self.counters.raised_on_history += 1;
            debug!(
                pid = b.span.proc.pid,
                start = b.span.start,
                pages = b.span.pages,
                dup,
                "mapped again where its predecessor was marked: raised to the top level"
            );
        }
    }

    /// Looks at the first [`PROBE_PAGES`] pages of each region raised on
    /// history and marked, while it merges, until one of them is merged:
    /// such a region is often unmapped before an accounting pass sees it merge, and a
    /// raised generation passes its place on only if merging was seen
    /// (`core::pipeline::recurrence`). ksmd walks a region in address
    /// order, so its first pages merge first. One pagemap and one
    /// kpageflags read of 64 entries a region and wake-up, for at most a
    /// region's short life.
    pub(super) fn probe_recurring(&mut self) {
        let (books, lives, target, states) = (
            &mut self.books,
            &self.lives,
            &mut self.target,
            &mut self.states,
        );
        self.probing.retain(|&id| {
            let Some(b) = books.get_mut(&id) else {
                return false; // gone
            };
            // Not marked yet (a write watch first): wait. Once settled,
            // its accounting passes have counted it.
            match lives.get(id) {
                Some(l) if l.mode() == Mode::Sampling => return b.raised_on_history,
                Some(l) if l.mode() == Mode::Promoted && l.merging() => {}
                _ => return false,
            }
            if !b.raised_on_history || b.seen_merged {
                return false;
            }
            let n = (PROBE_PAGES as u32).min(b.span.pages) as usize;
            states.clear();
            states.resize(n, PageState::NotPresent);
            if target.page_states(id, 0, states).is_ok() {
                b.seen_merged = states.contains(&PageState::Merged);
            }
            !b.seen_merged
        });
    }
}
