//! Accounting (the module header of `daemon.rs`, step 4): the page states
//! of promoted and foreign regions, read within the wake's budget and
//! counted by `core::pipeline::lifecycle` (merges, COW breaks, settling,
//! the demotion rule; merging regions looked at again once ksmd has moved
//! a quarter of a full scan on, `core::pipeline::scan_clock`), the check
//! of the kernel's `cow_ksm` for breaks that happened between the passes
//! of settled regions, and the stretches a settling pass found unmerged,
//! queued for trimming ("Trimming a settled region" in
//! `core::pipeline::lifecycle`; `marking` unmarks them).
//!
//! Invariants: a pass reads the states of a region's pages (pagemap and
//! kpageflags), never their content, in chunks of [`ACCOUNT_CHUNK`]
//! pages, resuming where the last call stopped.

use super::*;

/// CPU share of `actuate.account_pages_per_s` at its default, about 155 ns
/// a page (measured on the 2-core development machine): the unit of the
/// accounting boost.
pub(super) const ACCOUNT_BASE_SHARE: f64 = 0.02;
/// Thousandths of ksmd's full scan between the passes over a merging
/// region (`AccountRules::merging_gap`, `core::pipeline::scan_clock`): four
/// looks a scan. Progress shows (and a region that merged all it could
/// settles) within a quarter of a scan of ksmd's work, while a region
/// ksmd has not come back to is not read again for nothing. pagesift's
/// choice.
pub(super) const MERGING_PASS_GAP: u64 = 250;

/// Pages inspected per accounting call.
pub(super) const ACCOUNT_CHUNK: usize = 512;
/// Largest region that gets its first accounting pass at once when it
/// merges again from the top (16 MiB: its pagemap and kpageflags read in
/// chunks, at about 155 ns a page: 0.6 ms), see [`Daemon::actuate`].
/// pagesift's choice.
pub(super) const REMERGE_PASS_PAGES: u64 = 4096;

/// COW breaks `cow_ksm` must show beyond those the passes counted before
/// settled regions are passed over again ([`Daemon::check_unseen_breaks`]):
/// fewer could not flag a region anyway (`MIN_BREAKS_FOR_DEMOTION`).
pub(super) const UNSEEN_BREAKS_MIN: u64 = MIN_BREAKS_FOR_DEMOTION;

/// The least time between the end of a settled region's pass and one
/// brought forward by unseen breaks: other processes' KSM pages breaking
/// all the time would otherwise pass every settled region over without
/// pause (the accounting budget still bounds the cost). A region rewritten
/// every few seconds is still seen thrashing within the minute the rule
/// allows. pagesift's choice.
pub(super) const UNSEEN_BREAKS_GAP: Nanos = 5 * SEC;
/// Fewest COW breaks in one accounting pass that can unmark a region: a
/// few writes to merged pages are normal life, not thrashing. pagesift's
/// choice (the same 16 as `actuate.min_merged_for_demotion`).
pub const MIN_BREAKS_FOR_DEMOTION: u64 = 16;

/// The rules of accounting passes under `config`
/// (`core::pipeline::lifecycle`): settled after [`SETTLE_SCANS`] ksmd full
/// scans; merging regions passed over about once a second once ksmd has
/// moved [`MERGING_PASS_GAP`] of a full scan on, settled ones
/// every `actuate.recheck_s`; unmarked above V_cow with at least
/// [`MIN_BREAKS_FOR_DEMOTION`] breaks.
pub(super) fn account_rules(config: &Config) -> AccountRules {
    AccountRules {
        settle_scans: SETTLE_SCANS,
        merging_every: SEC,
        merging_gap: MERGING_PASS_GAP,
        settled_every: config.actuate.recheck_s.saturating_mul(SEC),
        v_cow: config.ladder.v_cow,
        min_merged: config.actuate.min_merged_for_demotion,
        min_breaks: MIN_BREAKS_FOR_DEMOTION,
    }
}

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    /// Accounting (`daemon.rs` module header, step 4): the page states of promoted and
    /// foreign regions are read here, within the wake's budget, and counted
    /// by `lives` (`core::pipeline::lifecycle`: COW breaks, settling, the
    /// demotion rule).
    pub(super) fn account(&mut self, now: Nanos) {
        self.check_unseen_breaks(now);
        self.probe_recurring();
        let dt = now.saturating_sub(self.last_account).min(SEC);
        self.last_account = now;
        let full_scans = self.ksm_now.full_scans;
        let scan = (self.scan_clock).observe(full_scans, self.ksm_now.pages_visited);
        self.lives.set_scan_position(scan);
        let merging = self.lives.prepare_passes(full_scans, now, SETTLE_SCANS);
        // While ksmd merges, accounting runs faster (up to 8×, within the
        // governor's top share at ≈2 % per base budget) so that progress
        // shows and settled regions hand ksmd back to the trickle sooner.
        let boost = if merging {
            (self.config.merge_share() / ACCOUNT_BASE_SHARE).clamp(1.0, 8.0)
        } else {
            1.0
        };
        let mut budget = (self.config.actuate.account_pages_per_s as f64 * boost * dt as f64
            / SEC as f64) as u64;
        let ids = self.lives.passes_due(now);
        if ids.is_empty() || budget == 0 {
            return;
        }
        let first = self
            .account_from
            .and_then(|from| ids.iter().position(|&id| id >= from))
            .unwrap_or(0);
        let rules = account_rules(&self.config);
        for k in 0..ids.len() {
            if budget == 0 {
                break;
            }
            let id = ids[(first + k) % ids.len()];
            self.account_from = Some(id);
            self.account_region(id, now, full_scans, &rules, &mut budget);
        }
    }

    /// Breaks the passes did not see (`core::pipeline::lifecycle`, "Breaks
    /// between settled passes"): about once a second, the kernel's
    /// machine-wide `cow_ksm` against the breaks pagesift's passes
    /// counted. When at least [`UNSEEN_BREAKS_MIN`] more happened than
    /// they found, every settled region is passed over again at once, or
    /// [`UNSEEN_BREAKS_GAP`] after its last pass.
    pub(super) fn check_unseen_breaks(&mut self, now: Nanos) {
        if now < self.next_cow_look {
            return;
        }
        self.next_cow_look = now + SEC;
        let Some(cow) = self.target.cow_ksm() else {
            return;
        };
        let counted: u64 = self.lives.values().map(|l| l.cow_total()).sum();
        if let Some((cow0, counted0)) = self.cow_seen {
            // Regions forgotten since take their counts with them: the
            // count may fall, and then explains nothing.
            let unseen =
                (cow.saturating_sub(cow0)).saturating_sub(counted.saturating_sub(counted0));
            if unseen >= UNSEEN_BREAKS_MIN {
                let moved = self.lives.hasten_settled_passes(now, UNSEEN_BREAKS_GAP);
                self.counters.unseen_break_alarms += 1;
                debug!(
                    unseen,
                    regions = moved,
                    "COW breaks the passes did not see: settled regions passed over again"
                );
            }
        }
        self.cow_seen = Some((cow, counted));
    }

    /// One region's accounting from its cursor on, within `budget` pages
    /// (taken from it), to the end of its pass at most.
    pub(super) fn account_region(
        &mut self,
        id: RegionId,
        now: Nanos,
        full_scans: u64,
        rules: &AccountRules,
        budget: &mut u64,
    ) {
        while let Some(life) = self.lives.get(id) {
            let n = (life.pages() - life.cursor())
                .min(ACCOUNT_CHUNK as u32)
                .min(*budget as u32) as usize;
            if n == 0 {
                break;
            }
            let from = life.cursor();
            self.states.clear();
            self.states.resize(n, PageState::NotPresent);
            match self.target.page_states(id, from, &mut self.states) {
                Ok(()) => {}
                Err(SourceError::Gone(_)) => {
                    self.force_refresh = true;
                    break;
                }
                Err(e) => {
                    debug!(region = id.0, error = %e, "accounting read failed");
                    self.force_refresh = true;
                    break;
                }
            }
            *budget -= n as u64;
            let Some(end) = self.lives.record(id, &self.states, now, full_scans, rules) else {
                continue;
            };
            // A pass ended. Settled: nothing present is left unmerged,
            // or ksmd has had its chances (see the `daemon.rs` module header); a
            // promoted region is back on the ladder, at the bottom.
            let life = &self.lives[id];
            if end.settled
                && let Some(b) = self.books.get(&id)
            {
                info!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    merged = life.last_pass().merged,
                    pages = b.span.pages,
                    seconds = now.saturating_sub(life.merging_since()) as f64 / SEC as f64,
                    "settled: ksmd has merged what it can"
                );
                // Only what pagesift marked (a foreign region has none).
                let stretches = life.unmerged_stretches(
                    b.span.start / PAGE,
                    self.config.actuate.trim_min_pages,
                    RUN_ALIGN_PAGES as u32,
                );
                for (s, e) in stretches {
                    let (s, e) = (
                        b.span.start + u64::from(s) * PAGE,
                        b.span.start + u64::from(e) * PAGE,
                    );
                    if self.marks.covers(b.span.proc, s, e) {
                        self.pending_trims.push((id, s, e));
                    }
                }
            }
            if end.demote {
                self.pending_unmarks.push(id);
            }
            break;
        }
    }
}
