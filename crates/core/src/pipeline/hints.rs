//! XLH's deduplication hints: a bounded circular stack of pages that just
//! received file data, interleaved with the linear scan (K. Miller's
//! dissertation, §4.3.3 "Hint Storage" and §4.3.4 "Hint Processing").
//!
//! ## Why a bounded, newest-first stack
//! A hint says "this page was just filled from a file; another copy may
//! exist". It is only worth something soon after it was issued: once the
//! linear scan reaches the page anyway the hint adds nothing (§4.3.3).
//! Hints arrive at whatever rate I/O runs, decoupled from the rate the
//! scanner consumes them, so some must be discarded, and "it is however
//! better to discard old hints than new hints" (§4.3.3). XLH therefore keeps
//! them in a *bounded circular stack* with these properties (§4.3.3): a hard
//! upper bound on stored hints; no dynamic allocation when storing one; the
//! oldest unprocessed hint is overwritten when the stack is full; the newest
//! hints are handed out first; and the soft maximum age follows from the
//! stack size chosen as a function of the scan rate.
//!
//! [`HintStack`] is that structure: a ring buffer, a top index and a
//! length. One difference, on purpose: the ring grows to its bound on
//! demand instead of being allocated whole at start, so pushes allocate
//! (amortised) until the stack first fills, never after. A stack sized by
//! the drain rule can hold 2^20 hints (24 MiB); filling that at start was
//! 13 % of the CPU of a one-second daemon run (perf, 2026-11-24, on the
//! 2-core development machine), for hints most runs never store. `push` writes at the top and, when full, thereby
//! overwrites the oldest slot; `pop` takes the newest. On top of the soft
//! bound it enforces a hard maximum age: a popped hint older than `max_age`
//! is dropped and counted, without consuming the caller's quota (XLH drops
//! outdated hints "before visiting the hinted pages themselves", §5.4.1).
//! The default maximum age is the dissertation's: "a maximum age of around
//! 15 seconds led to the most effective deduplication" (§4.3.3).
//!
//! ## Stack size from the scan rate
//! XLH's rule of thumb (§5.4.1): "the deduplication quantity is at its
//! maximum, if a full hint buffer can be drained in about 15 seconds at the
//! fixed scan-rate and pages-to-scan setting", where the drain rate depends
//! "on the scan-rate as well as on the interleaving ratio". Hints are
//! consumed at `scan_rate × hint_share` per second (`hint_share` is the
//! interleaving ratio's share of hint slots), so a full stack of `C` hints
//! drains in `C / (scan_rate × hint_share)` seconds; setting that to 15 s
//! gives
//!
//! ```text
//! C = 15 s × scan_rate × hint_share
//! ```
//!
//! Check against the dissertation's Table 5.2 (scan rates 5 300, 1 100 and
//! 530 pages/s; stack sizes 40 960, 8 192 and 4 096): with a 1:1
//! interleaving the rule gives 39 750, 8 250 and 3 975, all within 3 % of
//! the table. The dissertation does not state its ratio; 1:1 is what its
//! table implies, and it is [`Interleave`]'s default.
//!
//! ## Interleaving (§4.3.4)
//! Hints must neither starve the linear scan (it finds the non-I/O
//! duplicates) nor be starved by it. XLH decides per wake-up "based on a
//! defined interleaving ratio" and fills the quota from the linear scan
//! when hints run out. [`Interleave`] makes the same decision per page: of
//! every `hints + linear` consecutive picks, `hints` (spread evenly) are
//! hint slots. A hint slot takes the newest live hint, or falls back to the
//! linear scan when the stack is empty; a linear slot always goes to the
//! linear scan, so the ratio holds whenever hints are available. Deciding
//! per page keeps the ratio even when a wake-up's budget is smaller than a
//! cycle.

use crate::{Nanos, PageRef};

/// Maximum age of a hint: "around 15 seconds" (§4.3.3).
pub const DEFAULT_MAX_AGE: Nanos = 15_000_000_000;

/// Time in which a full stack should drain at the scan rate (§5.4.1).
pub const DRAIN_SECONDS: f64 = 15.0;

/// Largest stack [`HintStack::for_scan_rate`] builds: 2^20 hints (24 MiB).
/// At a 1:1 ratio that is a scan rate of 140 000 pages/s (546 MiB/s), above
/// the 385 MiB/s the dissertation measured as KSM's limit (§6.1.3).
pub const MAX_CAPACITY: usize = 1 << 20;

/// A page that just received file data, and when.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Hint {
    /// The hinted page.
    pub page: PageRef,
    /// When the hint was issued, on the caller's clock.
    pub time: Nanos,
}

/// Cumulative hint counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HintStats {
    /// Hints pushed.
    pub pushed: u64,
    /// Hints handed out by `pop`.
    pub popped: u64,
    /// Hints lost because the stack was full (the oldest was overwritten).
    pub overwritten: u64,
    /// Hints dropped at `pop` because they were older than the maximum age.
    pub expired: u64,
    /// Hints dropped by [`HintStack::remap`]: their page was no longer in
    /// any region.
    #[serde(default)]
    pub unmapped: u64,
}

/// XLH's bounded circular stack of hints (module header).
#[derive(Clone, Debug)]
pub struct HintStack {
    /// Grows on demand up to `cap` and never beyond (a stack sized for
    /// the drain rule can hold a million hints; most runs use a few
    /// thousand, so the memory is not touched up front). Invariant:
    /// `top <= buf.len() <= cap`, and while `buf.len() < cap` the stored
    /// hints are `buf[top - len..top]` (the ring has not wrapped yet).
    buf: Vec<Hint>,
    cap: usize,
    /// Slot the next push writes (one past the newest hint).
    top: usize,
    len: usize,
    max_age: Nanos,
    stats: HintStats,
}

impl HintStack {
    /// A stack holding at most `capacity` hints, each kept at most
    /// `max_age`. A capacity of 0 keeps nothing: every push is lost (XLH
    /// "with a zero hint buffer size is behaving exactly like KSM", §5.4.1).
    pub fn new(capacity: usize, max_age: Nanos) -> Self {
        HintStack {
            buf: Vec::new(),
            cap: capacity,
            top: 0,
            len: 0,
            max_age,
            stats: HintStats::default(),
        }
    }

    /// The capacity for which a full stack drains in [`DRAIN_SECONDS`] when
    /// `pages_per_sec` pages are visited per second and `interleave` gives
    /// hints their share of them: `ceil(15 × rate × share)`, capped at
    /// [`MAX_CAPACITY`]. A rate that is not a positive number gives 0.
    pub fn capacity_for(pages_per_sec: f64, interleave: &Interleave) -> usize {
        let c = (DRAIN_SECONDS * pages_per_sec * interleave.hint_share()).ceil();
        if c.is_nan() || c <= 0.0 {
            0
        } else {
            (c as usize).min(MAX_CAPACITY)
        }
    }

    /// A stack sized by [`HintStack::capacity_for`].
    pub fn for_scan_rate(pages_per_sec: f64, interleave: &Interleave, max_age: Nanos) -> Self {
        Self::new(Self::capacity_for(pages_per_sec, interleave), max_age)
    }

    /// Stores `hint` as the newest, overwriting the oldest when full.
    /// Allocates only while the buffer grows towards the capacity.
    pub fn push(&mut self, hint: Hint) {
        self.stats.pushed += 1;
        let cap = self.cap;
        if cap == 0 {
            self.stats.overwritten += 1;
            return;
        }
        if self.len == cap {
            // The slot at `top` holds the oldest hint when full.
            self.stats.overwritten += 1;
        } else {
            self.len += 1;
        }
        if self.top == self.buf.len() {
            self.buf.push(hint);
        } else {
            self.buf[self.top] = hint;
        }
        self.top = (self.top + 1) % cap;
    }

    /// Takes the newest hint that is at most `max_age` old at `now`;
    /// older hints met on the way are dropped and counted as expired.
    pub fn pop(&mut self, now: Nanos) -> Option<Hint> {
        while self.len > 0 {
            // Before the ring wraps, `top >= len > 0`: no wrap here either.
            self.top = (self.top + self.cap - 1) % self.cap;
            self.len -= 1;
            let hint = self.buf[self.top];
            if now.saturating_sub(hint.time) > self.max_age {
                self.stats.expired += 1;
                continue;
            }
            self.stats.popped += 1;
            return Some(hint);
        }
        None
    }

    /// Hints stored (some may have expired; `pop` drops those).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no hint is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Most hints the stack holds.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Maximum age of a hint.
    pub fn max_age(&self) -> Nanos {
        self.max_age
    }

    /// Changes the maximum age: the caller narrows it to the time of one
    /// scan round, since "XLH skips hints that were issued in the last
    /// scan round" (§4.3.3), once the linear scan has passed them anyway.
    pub fn set_max_age(&mut self, max_age: Nanos) {
        self.max_age = max_age;
    }

    /// Moves every stored hint to the page `f` says now holds its data, and
    /// drops (and counts as unmapped) those `f` maps to `None`; the order
    /// and the times stay. For the caller whose regions changed shape: a
    /// hint names a page by its region and its offset there, so when a
    /// region is split (a run of it marked mergeable becomes a VMA of its
    /// own) the offsets past its new end name pages it no longer has, and
    /// the hints for them would be lost. Allocates a new buffer; the caller
    /// does it only when its regions changed.
    pub fn remap(&mut self, mut f: impl FnMut(PageRef) -> Option<PageRef>) {
        if self.len == 0 {
            return;
        }
        let cap = self.cap;
        // Oldest first: `top − len`, wrapping (before the ring wraps the
        // indices stay below `top`, within the buffer).
        let mut kept: Vec<Hint> = (0..self.len)
            .map(|k| self.buf[(self.top + cap - self.len + k) % cap])
            .filter_map(|h| {
                let page = f(h.page);
                if page.is_none() {
                    self.stats.unmapped += 1;
                }
                page.map(|page| Hint { page, ..h })
            })
            .collect();
        // Rebuilt unwrapped: the stored hints are `buf[0..len]` and the
        // next push goes to `len` (to 0 when full, the oldest's slot).
        self.len = kept.len();
        self.top = self.len % cap;
        kept.shrink_to_fit();
        self.buf = kept;
    }

    /// Drops every stored hint (not counted as expired or overwritten).
    pub fn clear(&mut self) {
        self.len = 0;
        self.top = 0;
    }

    /// Cumulative counters.
    pub fn stats(&self) -> HintStats {
        self.stats
    }
}

/// Where the next page to sample comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Visit the hinted page.
    Hint(Hint),
    /// Continue the linear scan.
    Linear,
}

/// Counts of what [`Interleave::next`] chose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct InterleaveStats {
    /// Picks served by a hint.
    pub hints: u64,
    /// Picks served by the linear scan (including fallbacks).
    pub linear: u64,
    /// Hint slots that fell back to the linear scan (no live hint).
    pub fallbacks: u64,
}

/// The interleaving ratio between hints and the linear scan, and the
/// position in its cycle (module header).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interleave {
    hints: u32,
    linear: u32,
    step: u64,
    stats: InterleaveStats,
}

impl Default for Interleave {
    /// 1:1, the ratio the dissertation's Table 5.2 implies (module header).
    fn default() -> Self {
        Interleave::new(1, 1)
    }
}

impl Interleave {
    /// `hints` hint slots for every `linear` linear slots. `hints == 0` is
    /// KSM (linear only); `linear == 0` gives hints absolute priority while
    /// they last.
    pub fn new(hints: u32, linear: u32) -> Self {
        Interleave {
            hints,
            linear,
            step: 0,
            stats: InterleaveStats::default(),
        }
    }

    /// The ratio as `(hints, linear)`.
    pub fn ratio(&self) -> (u32, u32) {
        (self.hints, self.linear)
    }

    /// Share of picks that are hint slots: `hints / (hints + linear)`.
    pub fn hint_share(&self) -> f64 {
        let cycle = u64::from(self.hints) + u64::from(self.linear);
        if cycle == 0 {
            0.0
        } else {
            f64::from(self.hints) / cycle as f64
        }
    }

    /// Whether the next pick is a hint slot: of each cycle of
    /// `hints + linear` picks, slot `i` is a hint slot when
    /// `floor((i+1)·h/n) > floor(i·h/n)`, which spreads the `h` hint slots
    /// evenly (Bresenham).
    fn hint_slot(&self) -> bool {
        let h = u64::from(self.hints);
        let n = h + u64::from(self.linear);
        if h == 0 {
            return false;
        }
        let i = self.step % n;
        (i + 1) * h / n > i * h / n
    }

    /// Decides where the next page comes from, taking the hint from
    /// `stack` when it is a hint slot and a live hint exists.
    pub fn next(&mut self, stack: &mut HintStack, now: Nanos) -> Next {
        let slot = self.hint_slot();
        self.step = self.step.wrapping_add(1);
        if slot {
            if let Some(hint) = stack.pop(now) {
                self.stats.hints += 1;
                return Next::Hint(hint);
            }
            self.stats.fallbacks += 1;
        }
        self.stats.linear += 1;
        Next::Linear
    }

    /// Hint slots among the first `steps` picks of the cycle sequence:
    /// `h` per full cycle plus `floor(r·h/n)` in a partial one of `r`
    /// (the sum of the Bresenham increments of [`Self::hint_slot`]).
    fn hint_slots_before(&self, steps: u64) -> u64 {
        let h = u64::from(self.hints);
        let n = h + u64::from(self.linear);
        if h == 0 {
            return 0;
        }
        (steps / n) * h + (steps % n) * h / n
    }

    /// The next `picks` picks when `stack` holds no hint: all linear. The
    /// same step, counters and result as `picks` calls of [`Self::next`]
    /// on an empty stack, in O(1). The distiller's wake-up spends most of
    /// its budget this way when no I/O hints arrive; a call a page was a
    /// few percent of the daemon's CPU on booting guests (perf).
    pub fn skip_linear(&mut self, picks: u64) {
        let from = self.step;
        let to = from.wrapping_add(picks);
        // Hint slots in [from, to): differences of the prefix count. The
        // step wraps only after 2^64 picks.
        let slots = self.hint_slots_before(to) - self.hint_slots_before(from);
        self.step = to;
        self.stats.fallbacks += slots;
        self.stats.linear += picks;
    }

    /// Cumulative counters.
    pub fn stats(&self) -> InterleaveStats {
        self.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RegionId;
    use proptest::prelude::*;
    use std::collections::VecDeque;

    const SEC: Nanos = 1_000_000_000;

    fn hint(page: u32, time: Nanos) -> Hint {
        Hint {
            page: PageRef {
                region: RegionId(1),
                page,
            },
            time,
        }
    }

    #[test]
    fn remapped_hints_follow_their_pages_and_keep_their_order() {
        // Region 1 is split at page 4: pages 4.. are region 2 now, and page
        // 6 was unmapped. Tried on a ring that has wrapped and on one that
        // has not.
        let split = |p: PageRef| match p.page {
            6 => None,
            0..4 => Some(p),
            n => Some(PageRef {
                region: RegionId(2),
                page: n - 4,
            }),
        };
        for (cap, pushed) in [(16usize, 8u32), (5, 8)] {
            let mut s = HintStack::new(cap, DEFAULT_MAX_AGE);
            for page in 0..pushed {
                s.push(hint(page, u64::from(page)));
            }
            s.remap(split);
            let first = pushed - (cap as u32).min(pushed);
            let mut want: Vec<Hint> = (first..pushed)
                .rev()
                .filter_map(|n| {
                    let page = split(hint(n, 0).page)?;
                    Some(Hint {
                        page,
                        time: u64::from(n),
                    })
                })
                .collect();
            assert_eq!(s.len(), want.len(), "cap {cap}");
            assert_eq!(s.stats().unmapped, 1);
            // Pushes after a remap keep the bound and the order.
            s.push(hint(0, 100));
            want.insert(0, hint(0, 100));
            want.truncate(cap);
            let got: Vec<Hint> = std::iter::from_fn(|| s.pop(100)).collect();
            assert_eq!(got, want, "cap {cap}");
        }
    }

    #[test]
    fn newest_first_and_oldest_overwritten() {
        let mut s = HintStack::new(3, DEFAULT_MAX_AGE);
        for page in 0..5 {
            s.push(hint(page, 0));
        }
        assert_eq!(s.len(), 3);
        assert_eq!(s.stats().overwritten, 2);
        let popped: Vec<_> = std::iter::from_fn(|| s.pop(0))
            .map(|h| h.page.page)
            .collect();
        assert_eq!(
            popped,
            vec![4, 3, 2],
            "newest first; 0 and 1 were overwritten"
        );
        assert!(s.is_empty());
    }

    #[test]
    fn the_buffer_grows_to_the_capacity_then_never_moves() {
        let mut s = HintStack::new(1000, DEFAULT_MAX_AGE);
        assert_eq!(s.buf.capacity(), 0, "nothing allocated up front");
        let mut full_at = None;
        for page in 0..10_000 {
            s.push(hint(page, u64::from(page)));
            if page % 7 == 0 {
                s.pop(u64::from(page));
            }
            assert!(s.buf.len() <= 1000);
            assert_eq!(s.capacity(), 1000);
            match full_at {
                None if s.buf.len() == 1000 => full_at = Some(s.buf.as_ptr()),
                Some(ptr) => assert_eq!(s.buf.as_ptr(), ptr, "buffer moved once full"),
                None => {}
            }
        }
        assert!(full_at.is_some());
    }

    #[test]
    fn expired_hints_are_skipped_and_counted() {
        let mut s = HintStack::new(8, DEFAULT_MAX_AGE);
        s.push(hint(1, 0));
        s.push(hint(2, 10 * SEC));
        s.push(hint(3, 2 * SEC));
        // At 17 s: hint 3 is 15 s old (kept: not older than the maximum),
        // hint 2 is 7 s old, hint 1 is 17 s old (dropped).
        assert_eq!(s.pop(17 * SEC).map(|h| h.page.page), Some(3));
        assert_eq!(s.pop(17 * SEC).map(|h| h.page.page), Some(2));
        assert_eq!(s.pop(17 * SEC), None);
        assert_eq!(s.stats().expired, 1);
        assert_eq!(s.stats().popped, 2);
        assert_eq!(DEFAULT_MAX_AGE, 15 * SEC);
    }

    #[test]
    fn zero_capacity_behaves_like_ksm() {
        let mut s = HintStack::new(0, DEFAULT_MAX_AGE);
        s.push(hint(1, 0));
        assert_eq!(s.stats().overwritten, 1);
        let mut il = Interleave::default();
        assert_eq!(il.next(&mut s, 0), Next::Linear);
        assert_eq!(il.next(&mut s, 0), Next::Linear);
        assert_eq!(il.stats().fallbacks, 1);
    }

    #[test]
    fn capacity_from_scan_rate_matches_the_dissertation_table() {
        // Table 5.2: (effective scan rate, stack size).
        let il = Interleave::default();
        for (rate, table) in [(5300.0, 40_960.0), (1100.0, 8_192.0), (530.0, 4_096.0)] {
            let c = HintStack::capacity_for(rate, &il) as f64;
            assert!(
                ((c - table) / table).abs() < 0.03,
                "{rate} pages/s: {c} vs {table}"
            );
        }
        assert_eq!(
            HintStack::capacity_for(1000.0, &Interleave::new(1, 3)),
            3750
        );
        assert_eq!(HintStack::capacity_for(1000.0, &Interleave::new(0, 1)), 0);
        assert_eq!(HintStack::capacity_for(f64::NAN, &il), 0);
        assert_eq!(HintStack::capacity_for(-5.0, &il), 0);
        assert_eq!(HintStack::capacity_for(1e12, &il), MAX_CAPACITY);
    }

    /// Simulates the scanner: a full stack, pages visited at the scan rate,
    /// picks interleaved 1:1; the stack empties after about 15 s.
    #[test]
    fn a_full_stack_drains_in_about_15_seconds() {
        for (rate, ratio) in [(5300u64, (1, 1)), (530, (1, 1)), (1000, (1, 3))] {
            let il0 = Interleave::new(ratio.0, ratio.1);
            let mut s = HintStack::for_scan_rate(rate as f64, &il0, Nanos::MAX);
            for page in 0..s.capacity() as u32 {
                s.push(hint(page, 0));
            }
            let mut il = il0;
            let mut visits = 0u64;
            while !s.is_empty() {
                il.next(&mut s, 0);
                visits += 1;
            }
            let secs = visits as f64 / rate as f64;
            assert!(
                (secs - DRAIN_SECONDS).abs() < 0.01,
                "{rate} pages/s {ratio:?}: {secs} s"
            );
            assert_eq!(il.stats().fallbacks, 0);
        }
    }

    #[test]
    fn interleave_honours_the_ratio_and_falls_back_to_linear() {
        let mut s = HintStack::new(100, DEFAULT_MAX_AGE);
        for page in 0..100 {
            s.push(hint(page, 0));
        }
        let mut il = Interleave::new(2, 3);
        let picks: Vec<bool> = (0..10)
            .map(|_| matches!(il.next(&mut s, 0), Next::Hint(_)))
            .collect();
        // Two hint slots per five picks, spread out.
        assert_eq!(
            picks,
            [
                false, false, true, false, true, false, false, true, false, true
            ]
        );
        s.clear();
        for _ in 0..10 {
            assert_eq!(il.next(&mut s, 0), Next::Linear);
        }
        let st = il.stats();
        assert_eq!((st.hints, st.linear, st.fallbacks), (4, 16, 4));
        // Hints only: every pick is a hint while they last.
        let mut s = HintStack::new(3, DEFAULT_MAX_AGE);
        for page in 0..3 {
            s.push(hint(page, 0));
        }
        let mut il = Interleave::new(1, 0);
        let picks: Vec<_> = (0..4).map(|_| il.next(&mut s, 0)).collect();
        assert_eq!(picks[3], Next::Linear);
        assert!(picks[..3].iter().all(|p| matches!(p, Next::Hint(_))));
    }

    #[derive(Clone, Debug)]
    enum Op {
        Push(u32, Nanos),
        Pop(Nanos),
    }

    proptest! {
        /// Skipping `k` picks at once leaves the interleave exactly where
        /// `k` picks on an empty stack would, counters included.
        #[test]
        fn skip_linear_is_k_picks_on_an_empty_stack(
            hints in 0u32..6,
            linear in 0u32..6,
            before in 0u64..40,
            k in 0u64..60,
            after in 0u64..20,
        ) {
            prop_assume!(hints + linear > 0);
            let mut empty = HintStack::new(4, 10);
            let mut stepped = Interleave::new(hints, linear);
            let mut skipped = Interleave::new(hints, linear);
            for _ in 0..before {
                stepped.next(&mut empty, 0);
                skipped.next(&mut empty, 0);
            }
            for _ in 0..k {
                prop_assert_eq!(stepped.next(&mut empty, 0), Next::Linear);
            }
            skipped.skip_linear(k);
            prop_assert_eq!(stepped, skipped);
            // And the slots that follow line up.
            let mut full = HintStack::new(64, 10);
            let mut full2 = HintStack::new(64, 10);
            for p in 0..40 {
                full.push(hint(p, 0));
                full2.push(hint(p, 0));
            }
            for _ in 0..after {
                prop_assert_eq!(stepped.next(&mut full, 0), skipped.next(&mut full2, 0));
            }
        }

        /// The stack behaves like a deque that drops from the front when
        /// full and pops live hints from the back.
        #[test]
        fn stack_matches_a_deque_model(
            capacity in 0usize..8,
            max_age in 0u64..20,
            ops in prop::collection::vec(prop_oneof![
                (any::<u32>(), 0u64..5).prop_map(|(p, dt)| Op::Push(p, dt)),
                (0u64..5).prop_map(Op::Pop),
            ], 0..200),
        ) {
            let mut s = HintStack::new(capacity, max_age);
            let mut model: VecDeque<Hint> = VecDeque::new();
            let mut m = HintStats::default();
            let mut now = 0;
            for op in ops {
                match op {
                    Op::Push(page, dt) => {
                        now += dt;
                        // Some hints arrive stamped a little in the past.
                        let h = hint(page, now.saturating_sub(dt * 2));
                        s.push(h);
                        m.pushed += 1;
                        model.push_back(h);
                        if model.len() > capacity {
                            model.pop_front();
                            m.overwritten += 1;
                        }
                    }
                    Op::Pop(dt) => {
                        now += dt;
                        let want = loop {
                            match model.pop_back() {
                                None => break None,
                                Some(h) if now - h.time > max_age => m.expired += 1,
                                Some(h) => { m.popped += 1; break Some(h) }
                            }
                        };
                        prop_assert_eq!(s.pop(now), want);
                    }
                }
                prop_assert_eq!(s.len(), model.len());
                prop_assert_eq!(s.stats(), m);
                prop_assert!(s.buf.len() <= capacity, "grew past the capacity");
            }
        }

        /// Whenever hints are available, every full cycle of h + l picks
        /// holds exactly h hints; with none, every pick is linear.
        #[test]
        fn interleave_ratio_over_cycles(
            h in 0u32..5,
            l in 0u32..5,
            available in 0usize..60,
            cycles in 1usize..8,
        ) {
            let n = (h + l) as usize;
            let mut s = HintStack::new(64, Nanos::MAX);
            for page in 0..available as u32 {
                s.push(hint(page, 0));
            }
            let mut il = Interleave::new(h, l);
            let total = cycles * n.max(1);
            let picks: Vec<bool> = (0..total)
                .map(|_| matches!(il.next(&mut s, 0), Next::Hint(_)))
                .collect();
            let hints = picks.iter().filter(|&&x| x).count();
            let slots = if n == 0 { 0 } else { cycles * h as usize };
            prop_assert_eq!(hints, slots.min(available));
            if n > 0 && available >= slots {
                for c in picks.chunks(n) {
                    prop_assert_eq!(c.iter().filter(|&&x| x).count(), h as usize);
                }
            }
            let st = il.stats();
            prop_assert_eq!(st.hints + st.linear, total as u64);
            prop_assert_eq!(st.fallbacks as usize, slots - slots.min(available));
        }
    }
}
