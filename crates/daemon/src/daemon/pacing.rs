//! Pacing ksmd (the module header of `daemon.rs`, step 5): what is
//! waiting for ksmd and what one of its full scans covers, turned into
//! `pages_to_scan` and `sleep_millisecs` by `core::pipeline::pacing`.
//!
//! The counters are read once every [`PACE_INTERVAL`], and at once when
//! the demand switches between merging and trickling or jumps.

use super::*;

/// How often ksmd's counters are read and its pace revised, unless the
/// demand switches between merging and trickling.
pub(super) const PACE_INTERVAL: Nanos = SEC;

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    pub(super) fn pace(&mut self, now: Nanos) -> f64 {
        // Pages waiting for ksmd: those of unsettled regions that a full
        // scan covers (a region not yet counted through counts whole, so
        // that a fresh promotion gets the full pace; at least one page per
        // region; narrowed to those still expected to merge, or to an
        // eighth once it merges nothing new: see
        // `Lifecycle::waiting_pages`). The pacer weighs them against the
        // full scan below. Runs marked since the last refresh count too
        // (see `pending_run_pages`).
        let full_scans = self.ksm_now.full_scans;
        // (Only merging regions wait: their index, not every region, is
        // walked at every wake-up.)
        let unmerged: u64 = (self.lives.merging_values())
            .map(|l| l.waiting_pages(full_scans))
            .sum::<u64>()
            + self.pending_run_pages;
        // And what one full scan of ksmd covers, as far as pagesift knows
        // (promoted and foreign regions; other processes' mergeable memory
        // is scanned too, unseen): the pacer spends no more than a few such
        // scans a second. A region not yet counted through counts whole,
        // so that a fresh promotion is never starved.
        let scan_pages: u64 = (self.lives.accounted_values())
            .map(|l| l.scan_pages())
            .sum::<u64>()
            + self.pending_run_pages;
        // Reading KSM's counters and ksmd's CPU costs a dozen file reads:
        // once a second is enough (the pacer is built for that interval),
        // but a change between merging and trickling acts at once, and so
        // does a promotion that more than doubles what ksmd has to scan:
        // paced for the small set before it, ksmd would take up to a
        // second to start on it (measured under the short-lived profile:
        // a 64 MiB region promoted 150 ms before it was unmapped went
        // unmerged at 53 pages a batch).
        let merging = unmerged > 0;
        let grew = crate::ksmd::demand_jumped(scan_pages, self.paced_scan_pages);
        if now < self.next_pace && merging == self.merging && !grew {
            return self.pacing.share;
        }
        self.next_pace = now + PACE_INTERVAL;
        self.merging = merging;
        self.paced_scan_pages = scan_pages;
        match self.ksm.sample() {
            Ok(s) => {
                self.ksm_now = s;
                self.ksm_start.get_or_insert(s);
            }
            Err(e) => debug!(error = %e, "reading KSM counters failed"),
        }
        let target = self.config.merge_share();
        match self.ksm.pace(target, unmerged, scan_pages, now) {
            Ok(p) => {
                debug!(
                    target: "pagesift::pace",
                    unmerged,
                    scan_pages,
                    target,
                    share = p.share,
                    pages_to_scan = p.pages_to_scan,
                    sleep_ms = p.sleep_ms,
                    wait_share = p.wait_share,
                    "ksmd paced"
                );
                self.pacing = p;
            }
            Err(e) => warn!(error = %e, "pacing ksmd failed"),
        }
        self.pacing.share
    }
}
