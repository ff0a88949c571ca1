//! Where ksmd is in its scan of all mergeable memory: a position counted
//! in thousandths of a full scan, from KSM's own counters.
//!
//! ## Why
//! ksmd walks every mergeable page once per full scan, and a merging
//! region's pages change state (merged, or not yet) when ksmd visits them
//! or their twins. So a look at a merging region's page states tells
//! something new only once ksmd has moved on by a good part of a scan.
//! Accounting looked at each merging region every second whatever ksmd
//! had done: with ten booting guests, whose full scans took tens of
//! seconds (ksmd waited for a CPU three quarters of the time), that was
//! 47 M of the 62 M pages accounting read in one run, and accounting took
//! 7 of the daemon's 19 CPU-s (`pagesift bench --full --only vm-boot
//! --systems pagesift-full`, 2026-12-03, 2-CPU Intel Xeon, counted by
//! hand with a build that counted the pages). With a position, the caller
//! spaces those looks by a share of a scan instead
//! (`core::pipeline::lifecycle`, `AccountRules::merging_gap`).
//!
//! ## How
//! KSM counts its full scans (`full_scans`) and the pages it visited
//! (`pages_scanned`, and `pages_skipped` for those its smart scan passed
//! over, since 6.6 and 6.7). The pages visited between two ends of a full
//! scan are the length of a scan; the position is the full scans ended, in
//! thousands, plus the pages visited since the last end as thousandths of
//! that length (at most 999: a scan that grew is not finished until KSM
//! says so). The caller reads the counters now and then; an end seen
//! between two readings is taken to have happened at the later one, and
//! several ends seen at once share the pages visited between them.
//!
//! There is no position before a scan length is known (no end of a scan
//! seen since the clock started), or without the page counters.
//!
//! Invariants: the position never decreases while `full_scans` and the
//! visited count do not; it lies in `[1000 × full_scans, 1000 × full_scans
//! + 999]`.

/// Thousandths of a full scan in one full scan.
pub const PER_SCAN: u64 = 1000;

/// ksmd's position in its scans, from its counters (module header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScanClock {
    /// `full_scans` and the pages visited when an end of a scan was last
    /// seen (or when the clock started).
    last_end: Option<(u64, u64)>,
    /// Whether `last_end` is a real end of a scan (not the start).
    ended: bool,
    /// Pages visited in one full scan, as the last ends measured it.
    length: Option<u64>,
    /// The last position returned.
    position: Option<u64>,
}

impl ScanClock {
    /// A clock that has seen nothing.
    pub fn new() -> ScanClock {
        ScanClock::default()
    }

    /// Reads KSM's counters: `full_scans`, and `visited` (pages scanned
    /// plus pages skipped; `None` on a kernel without them). Returns the
    /// position, if known.
    pub fn observe(&mut self, full_scans: u64, visited: Option<u64>) -> Option<u64> {
        let Some(visited) = visited else {
            self.position = None;
            return None;
        };
        match self.last_end {
            None => self.last_end = Some((full_scans, visited)),
            Some((scans, at)) if full_scans > scans => {
                // The pages visited since the last end of a scan cover
                // the scans that ended since; from the start of the clock
                // they cover only part of the first, so no length yet.
                if self.ended {
                    let n = full_scans - scans;
                    self.length = Some((visited.saturating_sub(at) / n).max(1));
                }
                self.last_end = Some((full_scans, visited));
                self.ended = true;
            }
            Some(_) => {}
        }
        let (scans, at) = self.last_end?;
        let position = self.length.map(|len| {
            let into = visited.saturating_sub(at).saturating_mul(PER_SCAN) / len;
            scans.saturating_mul(PER_SCAN) + into.min(PER_SCAN - 1)
        });
        // Never backwards (a length measured shorter at a scan's end moves
        // nothing back: that scan's position starts at its thousand).
        self.position = match (position, self.position) {
            (Some(p), Some(q)) => Some(p.max(q)),
            (p, _) => p,
        };
        self.position
    }

    /// The last position [`observe`](ScanClock::observe) returned.
    pub fn position(&self) -> Option<u64> {
        self.position
    }

    /// Pages visited in one full scan, once measured.
    pub fn scan_length(&self) -> Option<u64> {
        self.length
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn no_position_until_a_whole_scan_was_seen() {
        let mut c = ScanClock::new();
        assert_eq!(c.observe(5, Some(1_000)), None);
        assert_eq!(c.observe(5, Some(3_000)), None);
        // The first end seen: the scan before it was seen in part only.
        assert_eq!(c.observe(6, Some(4_000)), None);
        assert_eq!(c.scan_length(), None);
        // A second end measures a whole scan: 10 000 pages.
        assert_eq!(c.observe(7, Some(14_000)), Some(7_000));
        assert_eq!(c.scan_length(), Some(10_000));
        // A quarter of the next one.
        assert_eq!(c.observe(7, Some(16_500)), Some(7_250));
        // A scan that grew stops short of its end until KSM says so.
        assert_eq!(c.observe(7, Some(40_000)), Some(7_999));
        assert_eq!(c.observe(8, Some(41_000)), Some(8_000));
        assert_eq!(c.scan_length(), Some(27_000));
    }

    #[test]
    fn several_ends_at_once_share_the_pages() {
        let mut c = ScanClock::new();
        c.observe(0, Some(0));
        c.observe(1, Some(100));
        assert_eq!(c.observe(4, Some(3_100)), Some(4_000));
        assert_eq!(c.scan_length(), Some(1_000));
        assert_eq!(c.observe(4, Some(3_600)), Some(4_500));
    }

    #[test]
    fn without_the_page_counters_there_is_no_position() {
        let mut c = ScanClock::new();
        for s in 0..5 {
            assert_eq!(c.observe(s, None), None);
        }
        assert_eq!(c.position(), None);
    }

    proptest! {
        /// Whatever the counters do (each only grows), the position never
        /// goes back and stays within the scan KSM says it is in.
        #[test]
        fn the_position_only_moves_on(steps in prop::collection::vec((0u64..3, 0u64..50_000), 1..200)) {
            let mut c = ScanClock::new();
            let (mut scans, mut visited) = (0u64, 0u64);
            let mut last = None;
            for (ds, dv) in steps {
                scans += ds;
                visited += dv;
                let p = c.observe(scans, Some(visited));
                if let Some(p) = p {
                    prop_assert!(p >= scans * PER_SCAN && p < (scans + 1) * PER_SCAN);
                    prop_assert!(last.is_none_or(|q| p >= q), "went back: {:?} → {}", last, p);
                    last = Some(p);
                } else {
                    prop_assert!(last.is_none(), "lost a known position");
                }
            }
        }
    }
}
