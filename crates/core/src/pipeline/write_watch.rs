//! The write verdict: whether a region's watched writes would make it
//! thrash once merged, and if only part of it would, which part.
//!
//! ## Why writes are watched before marking
//! Every write to a merged page is a COW break; ksmd re-merges the page if
//! its content is still a duplicate (UKSM §8.1.2's workload rewrites the
//! same bytes), so a region whose duplicates are written keeps breaking
//! and re-merging: its COW-broken ratio sits near 1 however small the
//! written share is. UKSM sees those breaks in its fault hook after
//! merging and demotes; a user-space daemon can watch writes *before*
//! marking (userfaultfd write protection, read back with `PAGEMAP_SCAN`)
//! and never induce them.
//!
//! ## Judging writes by where they land
//! A region is rarely written evenly. An interpreter's 69 MiB anonymous
//! VMA holds a 48 MiB block read from a file next to the allocator arenas
//! it writes every few milliseconds; a guest's RAM holds its kernel text
//! next to the pages it is filling. Counting writes against the whole
//! region held all of it for the writes of a few MiB. So the watch keeps
//! *where* the writes landed, as a short sorted list of zones (written
//! pages, joined when closer than `zone_gap` pages), and, once the exact
//! sweep has said which pages are duplicates ([`WriteWatch::locate`], a
//! [`DupMap`]), how many writes landed on a duplicate. Only those break a
//! merged page: a write to a page with no twin changes nothing ksmd would
//! merge. Without a map, the writes on duplicates are estimated as the
//! writes times the region's duplicate share (`dup`), as if writes fell
//! anywhere. The verdict:
//!
//! 1. watched for less than `watch_min`: **Watching** (too early to say);
//! 2. the breaks one accounting pass (`pass`) would see if the whole
//!    region were merged, estimated (writes × duplicate share × pass /
//!    watched time) and, once the map has been in force for `watch_min`,
//!    counted on it, are both below `min_breaks`: **Cold**, mark it all
//!    (the estimate alone let a writer that keeps to the duplicates pass
//!    when the sampled share had missed them);
//! 3. else, if the writes fell into at most `max_zones` zones covering at
//!    most `max_zone_share` of the region: zones that stopped spreading
//!    give **ColdExcept** those zones (widened by `zone_gap` on each side,
//!    then to `align` pages): mark the
//!    rest, which no write touched while it was watched, and leave the
//!    zones to the ladder (they become regions of their own once the
//!    marks split the VMA); a zone still spreading (it covers more than a
//!    quarter beyond what it covered at half the watch) is a writer
//!    sweeping the region, **Hot** if its breaks reach `min_breaks`;
//! 4. else the writes are scattered (a guest's page allocator, say):
//!    **Hot** if the breaks per pass reach `min_breaks` and exceed V_cow of
//!    the region's duplicates, the same ratio accounting demotes a merged
//!    region at; otherwise **Cold**: merging saves more than the writes
//!    undo, and accounting backs out after the fact if they outgrow it.
//!    In steps 3 and 4 the breaks are the writes counted on the map's
//!    duplicates (and the duplicates the map's) once the map has been in
//!    force for `watch_min`, the estimate before;
//! 5. a **Hot** verdict from the estimate alone, while the watch is younger
//!    than `await_map`, is **Watching** instead: the map is due within a
//!    sweep epoch or two, and the estimate errs towards holding. (Cold and
//!    ColdExcept need no map: they mark at once.)
//!
//! The map makes steps 3 and 4 exact where the estimate was not. Three booting
//! guests (single runs of `pagesift bench --quick --only vm-boot` on
//! 2026-11-26, their daemon logs read by hand) wrote all
//! over their RAM, on pages that are mostly not duplicates: counted as
//! writes × the duplicate share, about 20 of their 64 MiB regions were
//! held a run, and the run saved 218–282 MiB where the kernel's KSM saved
//! 290–306; with no watch at all the same experiment saved 302 MiB at 964
//! COW breaks, the kernel's KSM about 9 500. A writer that rewrites
//! duplicates (UKSM §8.1.2) writes nothing but duplicates and stays hot.
//!
//! The spreading test tells a buffer rewritten in place (its zone is as
//! wide after a quarter second as after a second) from a writer sweeping
//! the region (UKSM §8.1.2 rewrites one page every 10 ms from start to end:
//! its one zone is always young and doubles when the watch does). Marking
//! around a sweeper's zone would hand ksmd the pages it is about to write.
//!
//! ## Invariants
//! - `zones` is sorted, its zones are disjoint, non-empty, inside
//!   `0..pages`, and separated by more than `zone_gap` pages;
//! - once more zones than `max_zones_kept` would be needed the watch is
//!   *diffuse*: zones are no longer kept (the verdict can only be Cold or
//!   Hot), which bounds memory per watched region;
//! - `history` holds (time, pages covered by the zones) at checkpoints in
//!   time order, at most [`MAX_CHECKPOINTS`] of them (every other one is
//!   dropped when full, so they stay spread over the whole watch);
//! - once located, `located.on_dups` counts exactly the written pages
//!   (each read) that the map in force when they were recorded calls
//!   duplicates, since `located.since`; the map covers the region's pages.
//!
//! Pure: time is passed in.

use crate::Nanos;
pub use crate::pipeline::sweep::DupMap;

/// Zones kept per watch before it is called diffuse. pagesift's choice: far
/// more than any verdict uses, few enough to cost nothing.
pub const MAX_ZONES_KEPT: usize = 32;

/// Growth (pages) of the zones within which they count as not spreading,
/// whatever their size: a few pages' jitter at the edge of a buffer.
pub const SPREAD_SLACK: u64 = 4;

/// Checkpoints of the zones' coverage kept per watch.
pub const MAX_CHECKPOINTS: usize = 64;

/// The rules of the verdict (see the module header).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WriteRules {
    /// Shortest watch that can give a verdict.
    pub watch_min: Nanos,
    /// One accounting pass: the horizon breaks are predicted over.
    pub pass: Nanos,
    /// Fewest predicted breaks per pass that make writes matter (the floor
    /// accounting uses to unmark a merged region).
    pub min_breaks: u64,
    /// Written pages closer than this are one zone.
    pub zone_gap: u32,
    /// Zones are widened to multiples of this many pages (the marks'
    /// alignment), so marking around them splits as little as possible.
    pub align: u32,
    /// Most zones a region may be marked around.
    pub max_zones: usize,
    /// Largest share of the region the zones may cover.
    pub max_zone_share: f64,
    /// V_cow: the share of a region's duplicates that scattered writes may
    /// break per pass before the region counts as hot.
    pub v_cow: f64,
    /// How long a watch whose writes the estimate calls not cold waits
    /// for a duplicate map (and then `watch_min` of writes counted on it)
    /// before the estimate judges it (0: never waits).
    pub await_map: Nanos,
}

impl Default for WriteRules {
    fn default() -> Self {
        WriteRules {
            watch_min: 500_000_000,
            pass: 30_000_000_000,
            min_breaks: 16,
            zone_gap: 64,
            align: 16,
            max_zones: 4,
            max_zone_share: 0.5,
            v_cow: 0.5,
            await_map: 0,
        }
    }
}

/// What a region's watched writes say about marking it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteVerdict {
    /// Not watched, or its writes would not make it thrash: mark it all.
    Cold,
    /// Watched too briefly to tell.
    Watching,
    /// Mark it except these page ranges `[first, end)` (sorted, disjoint,
    /// aligned, inside the region), where its writes landed.
    ColdExcept(Vec<(u32, u32)>),
    /// Its writes, spread over it, would break its merged pages faster than
    /// V_cow allows: hold it.
    Hot,
}

/// Where a region's duplicates are, and the writes that landed on them.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Located {
    map: DupMap,
    /// When the first map arrived: writes on duplicates are counted since.
    since: Nanos,
    on_dups: u64,
}

/// The writes of one region since it began to be watched.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteWatch {
    since: Nanos,
    pages: u32,
    writes: u64,
    zones: Vec<(u32, u32)>,
    diffuse: bool,
    history: Vec<(Nanos, u64)>,
    located: Option<Located>,
}

impl WriteWatch {
    /// A watch of a region of `pages` pages, armed at `now`.
    pub fn new(pages: u32, now: Nanos) -> WriteWatch {
        WriteWatch {
            since: now,
            pages,
            writes: 0,
            zones: Vec::new(),
            diffuse: false,
            history: Vec::new(),
            located: None,
        }
    }

    /// Tells the watch where the region's duplicates are (the exact
    /// sweep's last word, `map` over the region's pages; a map of another
    /// size is ignored). From now on the writes landing on duplicates are
    /// counted, and they, not the writes times the duplicate share, decide
    /// the verdict once they have been counted for `watch_min`. A later
    /// map replaces the earlier one; the count goes on.
    pub fn locate(&mut self, map: DupMap, now: Nanos) {
        if map.pages() != self.pages {
            return;
        }
        match &mut self.located {
            Some(l) => l.map = map,
            None => {
                self.located = Some(Located {
                    map,
                    since: now,
                    on_dups: 0,
                });
            }
        }
    }

    /// Writes counted on known duplicates since the first map (`None`
    /// before one).
    pub fn writes_on_duplicates(&self) -> Option<u64> {
        self.located.as_ref().map(|l| l.on_dups)
    }

    /// Pages the zones cover now.
    pub fn covered(&self) -> u64 {
        self.zones.iter().map(|&(s, e)| u64::from(e - s)).sum()
    }

    /// Notes what the zones cover at `now` (after the writes read then
    /// were recorded), for the spreading test.
    pub fn checkpoint(&mut self, now: Nanos) {
        if self.history.len() == MAX_CHECKPOINTS {
            let mut i = 0;
            self.history.retain(|_| {
                i += 1;
                i % 2 == 0
            });
        }
        self.history.push((now, self.covered()));
    }

    /// Whether the zones still grow: they cover more than a quarter (and
    /// more than [`SPREAD_SLACK`] pages) beyond what they covered at the
    /// last checkpoint of the watch's first half. `None` without such a
    /// checkpoint (too early to tell).
    fn spreading(&self, now: Nanos) -> Option<bool> {
        let half = self.since + now.saturating_sub(self.since) / 2;
        let then = self
            .history
            .iter()
            .take_while(|&&(t, _)| t <= half)
            .last()?
            .1;
        Some(self.covered() > then + (then / 4).max(SPREAD_SLACK))
    }

    /// When it was armed.
    pub fn since(&self) -> Nanos {
        self.since
    }

    /// Pages written so far (a page written in two reads counts twice).
    pub fn writes(&self) -> u64 {
        self.writes
    }

    /// The zones written so far (empty once diffuse).
    pub fn zones(&self) -> &[(u32, u32)] {
        &self.zones
    }

    /// Whether writes were too scattered to keep as zones.
    pub fn is_diffuse(&self) -> bool {
        self.diffuse
    }

    /// Records the pages `[first, end)` as written (clipped to the region;
    /// `zone_gap` joins it with zones that close).
    pub fn record(&mut self, first: u32, end: u32, zone_gap: u32) {
        let end = end.min(self.pages);
        if first >= end {
            return;
        }
        self.writes += u64::from(end - first);
        if let Some(l) = &mut self.located {
            l.on_dups += l.map.count_in(first, end);
        }
        if self.diffuse {
            return;
        }
        // Every zone within `zone_gap` of [first, end) joins it.
        let lo = first.saturating_sub(zone_gap);
        let hi = end.saturating_add(zone_gap);
        let a = self.zones.partition_point(|&(_, e)| e < lo);
        let b = self.zones.partition_point(|&(s, _)| s <= hi);
        let (mut s, mut e) = (first, end);
        if a < b {
            s = s.min(self.zones[a].0);
            e = e.max(self.zones[b - 1].1);
        }
        self.zones.splice(a..b, std::iter::once((s, e)));
        if self.zones.len() > MAX_ZONES_KEPT {
            self.zones = Vec::new();
            self.diffuse = true;
        }
    }

    /// The verdict at `now` for a region whose duplicate share is `dup`
    /// (see the module header).
    pub fn verdict(&self, dup: f64, now: Nanos, rules: &WriteRules) -> WriteVerdict {
        let watched = now.saturating_sub(self.since);
        if watched < rules.watch_min {
            return WriteVerdict::Watching;
        }
        let per_pass_of =
            |writes: f64, over: Nanos| writes * rules.pass as f64 / over.max(1) as f64;
        // The breaks a pass would see, and the duplicates they are weighed
        // against: counted where the map is known long enough, estimated
        // from the duplicate share otherwise (as if writes fell anywhere).
        let estimate = per_pass_of(self.writes as f64 * dup, watched);
        let (per_pass, dups, counted) = match &self.located {
            Some(l) if now.saturating_sub(l.since) >= rules.watch_min => (
                per_pass_of(l.on_dups as f64, now.saturating_sub(l.since)),
                l.map.count() as f64,
                true,
            ),
            _ => (estimate, dup * f64::from(self.pages), false),
        };
        // Few writes at all: nothing to fear, whatever they land on. Few
        // by the estimate *and* by the count where the map is known: a
        // writer that keeps to the region's duplicates (128 shared pages
        // of 1024, rewritten 40 times a second) has few writes once
        // weighed by the duplicate share, and the estimate alone judged
        // it cold while the map said every write broke a merge (the loop
        // test a_held_region_still_written_after_its_hold_is_never_marked_by_a_run,
        // run over 150 s, marked a run of its duplicates 3 times in 60).
        if estimate.max(per_pass) < rules.min_breaks as f64 {
            return WriteVerdict::Cold;
        }
        let verdict = self.judge_writes(per_pass, dups, now, rules);
        // The estimate alone would keep it from merging: wait a while for
        // the map that tells whether the writes land on its duplicates.
        if verdict == WriteVerdict::Hot && !counted && watched < rules.await_map {
            return WriteVerdict::Watching;
        }
        verdict
    }

    /// Steps 3 and 4 of the verdict, for writes that would break
    /// `per_pass` merged pages a pass of a region with `dups` duplicates.
    fn judge_writes(
        &self,
        per_pass: f64,
        dups: f64,
        now: Nanos,
        rules: &WriteRules,
    ) -> WriteVerdict {
        // Scattered writes: hot only if a pass would break more than V_cow
        // of the region's duplicates; below that, merging saves more than
        // the writes undo, and accounting demotes the region after the
        // fact if its breaks outgrow its merges.
        let breaks = per_pass >= rules.min_breaks as f64;
        let scattered = |per_pass: f64| {
            if breaks && per_pass > rules.v_cow * dups {
                WriteVerdict::Hot
            } else {
                WriteVerdict::Cold
            }
        };
        if self.diffuse || self.zones.is_empty() || self.zones.len() > rules.max_zones {
            return scattered(per_pass);
        }
        // A zone is widened by `zone_gap` on each side, then aligned: a
        // buffer written at random has unwritten pages at its edges after
        // a short watch, as it has inside, where `zone_gap` already joins
        // its writes. Without the margin those edge pages were marked and
        // merged, and their next write was a COW break (the python3
        // workers' test in crates/cli/tests/real_workloads.rs saw 166 of
        // them on the CI machine, 2026-11-27: the watch had missed the
        // first 16 pages of a 1024-page buffer written once a second).
        let align = rules.align.max(1);
        let mut widened: Vec<(u32, u32)> = Vec::with_capacity(self.zones.len());
        for &(s, e) in &self.zones {
            let s = s.saturating_sub(rules.zone_gap) / align * align;
            let e = e
                .saturating_add(rules.zone_gap)
                .div_ceil(align)
                .saturating_mul(align)
                .min(self.pages);
            match widened.last_mut() {
                Some(l) if s <= l.1 => l.1 = l.1.max(e),
                _ => widened.push((s, e)),
            }
        }
        let covered: u64 = widened.iter().map(|&(s, e)| u64::from(e - s)).sum();
        if covered as f64 > rules.max_zone_share * f64::from(self.pages) {
            return scattered(per_pass);
        }
        match self.spreading(now) {
            None => WriteVerdict::Watching,
            // A writer sweeping pages that have no twin breaks nothing.
            Some(true) if !breaks => WriteVerdict::Cold,
            Some(true) => WriteVerdict::Hot,
            Some(false) => WriteVerdict::ColdExcept(widened),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: Nanos = 1_000_000_000;

    fn rules() -> WriteRules {
        WriteRules::default()
    }

    /// An interpreter's private buffer over one second: 200 writes to
    /// pages 12 300..12 400, read back every 250 ms.
    fn rewrite_buffer(w: &mut WriteWatch) {
        for i in 0..200u32 {
            let p = 12_300 + (i * 7) % 100;
            w.record(p, p + 1, 64);
            if i % 50 == 49 {
                w.checkpoint(Nanos::from(i + 1) * S / 200);
            }
        }
    }

    /// UKSM §8.1.2's writer over one second: one page every 10 ms from
    /// page 1000 on, read back every 250 ms.
    fn sweep_pages(w: &mut WriteWatch) {
        for i in 0..100u32 {
            w.record(1000 + i, 1001 + i, 64);
            if i % 25 == 24 {
                w.checkpoint(Nanos::from(i + 1) * S / 100);
            }
        }
    }

    #[test]
    fn too_early_to_tell() {
        let mut w = WriteWatch::new(1000, 0);
        w.record(0, 1000, 64);
        assert_eq!(w.verdict(1.0, S / 4, &rules()), WriteVerdict::Watching);
    }

    #[test]
    fn few_writes_are_cold() {
        let mut w = WriteWatch::new(16384, 0);
        // 2 writes in 1 s: 60 a pass at dup 1.0 would be hot; at dup 0.1, 6.
        w.record(10, 11, 64);
        w.record(9000, 9001, 64);
        assert_eq!(w.verdict(0.1, S, &rules()), WriteVerdict::Cold);
        assert_eq!(w.writes(), 2);
    }

    #[test]
    fn concentrated_writes_leave_the_rest_markable() {
        // An interpreter's heap: a duplicate block of 12288 pages, its
        // allocator writing pages 12300..12400 over and over.
        let mut w = WriteWatch::new(16384, 0);
        rewrite_buffer(&mut w);
        assert_eq!(w.zones().len(), 1);
        match w.verdict(0.75, S, &rules()) {
            WriteVerdict::ColdExcept(z) => {
                // 12300..12400 and 64 pages either side, aligned to 16.
                assert_eq!(z, vec![(12224, 12464)]);
            }
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn a_buffer_edge_the_watch_missed_is_not_marked() {
        // python3 workers (crates/cli/tests/real_workloads.rs): a 4096-page
        // duplicate block, then a 1024-page buffer written at random. The
        // watch saw no write on the buffer's first 16 pages; they are left
        // out all the same, and the block keeps all but a zone_gap's edge.
        let mut w = WriteWatch::new(5120, 0);
        for i in 0..400u32 {
            let p = 4112 + (i * 37) % 1008;
            w.record(p, p + 1, 64);
            if i % 100 == 99 {
                w.checkpoint(Nanos::from(i + 1) * S / 400);
            }
        }
        assert_eq!(w.zones().first().map(|z| z.0), Some(4112));
        match w.verdict(0.8, S, &rules()) {
            WriteVerdict::ColdExcept(z) => assert_eq!(z, vec![(4048, 5120)]),
            v => panic!("{v:?}"),
        }
    }

    #[test]
    fn scattered_writes_are_hot_only_past_v_cow_of_the_duplicates() {
        // One page every 10 ms anywhere in 2 GiB: 3000 breaks a pass of
        // 524 288 duplicates, far below V_cow: merging wins.
        let mut w = WriteWatch::new(524_288, 0);
        for i in 0..100u32 {
            let p = i.wrapping_mul(2_654_435_761) % 524_288;
            w.record(p, p + 1, 64);
        }
        assert!(w.is_diffuse());
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Cold);
        // The same writes in 4096 pages: 3000 a pass > half of them.
        let mut w = WriteWatch::new(4096, 0);
        for i in 0..100u32 {
            let p = i.wrapping_mul(2_654_435_761) % 4096;
            w.record(p, p + 1, 64);
        }
        assert!(w.is_diffuse() || w.zones().len() > rules().max_zones);
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Hot);
        // Whatever its duplicate share, while writes would break any.
        assert_eq!(w.verdict(0.05, S, &rules()), WriteVerdict::Hot);
    }

    #[test]
    fn a_sweeping_writer_is_hot() {
        // UKSM §8.1.2: one page every 10 ms from start to end, read back
        // every 250 ms: one zone, always growing.
        let mut w = WriteWatch::new(524_288, 0);
        sweep_pages(&mut w);
        assert_eq!(w.zones().len(), 1);
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Hot);
        // The same writes confined to 16 pages, over and over: not spreading.
        let mut w = WriteWatch::new(524_288, 0);
        for i in 0..100u32 {
            w.record(1000 + i % 16, 1001 + i % 16, 64);
            if i % 25 == 24 {
                w.checkpoint(Nanos::from(i + 1) * S / 100);
            }
        }
        assert_eq!(
            w.verdict(1.0, S, &rules()),
            WriteVerdict::ColdExcept(vec![(928, 1088)])
        );
    }

    /// A map of `pages` pages whose pages `dups` are duplicated.
    fn map(pages: u32, dups: impl IntoIterator<Item = u32>) -> DupMap {
        let mut m = DupMap::new(pages);
        for p in dups {
            m.set(p);
        }
        m
    }

    #[test]
    fn writes_beside_the_duplicates_break_nothing() {
        // A guest's RAM: its first half duplicates (kernel text, files
        // read by every guest), its allocator writing 400 pages a second
        // all over the second half. Estimated from the duplicate share
        // the writes are hot; located, none lands on a duplicate.
        let writes = |w: &mut WriteWatch| {
            for i in 0..400u32 {
                let p = 8192 + i.wrapping_mul(2_654_435_761) % 8192;
                w.record(p, p + 1, 64);
            }
        };
        let mut w = WriteWatch::new(16_384, 0);
        writes(&mut w);
        assert_eq!(w.verdict(0.5, S, &rules()), WriteVerdict::Hot);
        let mut w = WriteWatch::new(16_384, 0);
        w.locate(map(16_384, 0..8192), 0);
        writes(&mut w);
        assert_eq!(w.writes_on_duplicates(), Some(0));
        assert_eq!(w.verdict(0.5, S, &rules()), WriteVerdict::Cold);
        // The same writes landing on the duplicates are hot again.
        let mut w = WriteWatch::new(16_384, 0);
        w.locate(map(16_384, 8192..16_384), 0);
        writes(&mut w);
        assert_eq!(w.writes_on_duplicates(), Some(400));
        assert_eq!(w.verdict(0.5, S, &rules()), WriteVerdict::Hot);
    }

    #[test]
    fn a_sweeping_writer_of_duplicates_stays_hot_once_located() {
        // UKSM §8.1.2 again, every page a duplicate.
        let mut w = WriteWatch::new(16_384, 0);
        w.locate(map(16_384, 0..16_384), 0);
        sweep_pages(&mut w);
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Hot);
        // Sweeping pages that have no twin: nothing to break.
        let mut w = WriteWatch::new(16_384, 0);
        w.locate(map(16_384, 4096..16_384), 0);
        sweep_pages(&mut w);
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Cold);
    }

    #[test]
    fn writes_kept_to_the_duplicates_are_not_cold_by_a_share_that_missed_them() {
        // 128 duplicates in 1024 pages, and every one of 40 writes in a
        // second lands on them. The sampled duplicate share missed the
        // block (0): weighed by it the writes are none, counted on the
        // map every one breaks a merge.
        let mut w = WriteWatch::new(1024, 0);
        w.locate(map(1024, 0..128), 0);
        for i in 0..40u32 {
            let p = (i * 4) % 128;
            w.record(p, p + 1, 64);
            if i % 10 == 9 {
                w.checkpoint(Nanos::from(i + 1) * S / 40);
            }
        }
        assert_eq!(w.writes_on_duplicates(), Some(40));
        let v = w.verdict(0.0, S, &rules());
        assert!(!matches!(v, WriteVerdict::Cold), "{v:?}");
        // Without the map, the share is all there is to go on.
        let mut w = WriteWatch::new(1024, 0);
        for i in 0..40u32 {
            w.record((i * 4) % 128, (i * 4) % 128 + 1, 64);
        }
        assert_eq!(w.verdict(0.0, S, &rules()), WriteVerdict::Cold);
    }

    #[test]
    fn a_buffer_rewritten_in_place_is_marked_around_even_beside_duplicates() {
        // The interpreter again, its duplicate block known: the writes land
        // on none of it, but the buffer they rewrite is still left out, so
        // ksmd is not handed pages that change under it.
        let mut w = WriteWatch::new(16_384, 0);
        w.locate(map(16_384, 0..12_288), 0);
        rewrite_buffer(&mut w);
        assert_eq!(w.writes_on_duplicates(), Some(0));
        assert_eq!(
            w.verdict(0.75, S, &rules()),
            WriteVerdict::ColdExcept(vec![(12_224, 12_464)])
        );
    }

    #[test]
    fn a_map_counts_only_from_its_arrival_and_only_when_it_fits() {
        let mut w = WriteWatch::new(1000, 0);
        // Of another size (the region changed): ignored.
        w.locate(map(999, 0..999), 0);
        assert_eq!(w.writes_on_duplicates(), None);
        w.record(0, 600, 64);
        // Located after the writes: they are not counted as on duplicates,
        // and the estimate decides until the map is watch_min old.
        w.locate(map(1000, 0..1000), S / 2);
        assert_eq!(w.writes_on_duplicates(), Some(0));
        assert_eq!(w.verdict(1.0, S / 2 + S / 4, &rules()), WriteVerdict::Hot);
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Cold);
        // A new map replaces the old one; the count goes on.
        w.record(0, 10, 64);
        w.locate(map(1000, 500..1000), S);
        w.record(0, 10, 64);
        w.record(600, 610, 64);
        assert_eq!(w.writes_on_duplicates(), Some(20));
    }

    #[test]
    fn an_estimate_that_would_hold_waits_for_the_map() {
        let r = WriteRules {
            await_map: 4 * S,
            ..rules()
        };
        let mut w = WriteWatch::new(1000, 0);
        w.record(0, 600, 64);
        assert_eq!(w.verdict(1.0, S, &r), WriteVerdict::Watching);
        // No map in time: the estimate decides.
        assert_eq!(w.verdict(1.0, 4 * S, &r), WriteVerdict::Hot);
        // A map that arrived meanwhile decides once it is watch_min old.
        let mut w = WriteWatch::new(1000, 0);
        w.record(0, 600, 64);
        w.locate(map(1000, 900..1000), S);
        assert_eq!(w.verdict(1.0, S + S / 4, &r), WriteVerdict::Watching);
        assert_eq!(w.verdict(1.0, 2 * S, &r), WriteVerdict::Cold);
        // Cold by the estimate needs no map, nor does a buffer rewritten
        // in place (an interpreter's private bytearray): marked around.
        let w = WriteWatch::new(1000, 0);
        assert_eq!(w.verdict(1.0, S, &r), WriteVerdict::Cold);
        let mut w = WriteWatch::new(16_384, 0);
        rewrite_buffer(&mut w);
        assert_eq!(
            w.verdict(0.75, S, &r),
            WriteVerdict::ColdExcept(vec![(12_224, 12_464)])
        );
    }

    #[test]
    fn zones_covering_most_of_the_region_are_judged_as_scattered() {
        let mut w = WriteWatch::new(1000, 0);
        w.record(0, 600, 64);
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Hot);
        // One zone over 60 % of 100 000 pages, 1000 writes a second: 30 000
        // a pass, below half the region.
        let mut w = WriteWatch::new(100_000, 0);
        for i in 0..1000 {
            w.record(i * 60, i * 60 + 1, 64);
        }
        assert_eq!(w.zones().len(), 1);
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Cold);
    }

    #[test]
    fn too_many_zones_are_judged_as_scattered() {
        let mut w = WriteWatch::new(10_000, 0);
        for z in 0..6u32 {
            w.record(z * 1_000, z * 1_000 + 20, 64);
            w.record(z * 1_000, z * 1_000 + 20, 64);
        }
        assert_eq!(w.zones().len(), 6);
        // 240 writes a second: 7200 a pass, past half of 10 000 pages; the
        // duplicate share cancels out (breaks and duplicates both scale
        // with it).
        assert_eq!(w.verdict(1.0, S, &rules()), WriteVerdict::Hot);
        assert_eq!(w.verdict(0.2, S, &rules()), WriteVerdict::Hot);
        // Over three seconds: 2400 a pass, below.
        assert_eq!(w.verdict(1.0, 3 * S, &rules()), WriteVerdict::Cold);
    }

    #[test]
    fn nearby_writes_join_and_far_ones_do_not() {
        let mut w = WriteWatch::new(10_000, 0);
        w.record(100, 101, 64);
        w.record(150, 151, 64);
        w.record(1000, 1001, 64);
        assert_eq!(w.zones(), &[(100, 151), (1000, 1001)]);
        // A write bridging both joins all three.
        w.record(200, 990, 64);
        assert_eq!(w.zones(), &[(100, 1001)]);
        // Clipped to the region.
        w.record(9990, 20_000, 64);
        assert_eq!(w.zones().last(), Some(&(9990, 10_000)));
    }

    proptest! {
        /// The zones stay sorted, disjoint, separated by more than the gap,
        /// inside the region, and cover every written page (until the
        /// watch turns diffuse).
        #[test]
        fn zones_cover_every_write_and_stay_ordered(
            pages in 1u32..50_000,
            writes in prop::collection::vec((0u32..60_000, 1u32..40), 0..80),
            gap in 0u32..200,
        ) {
            let mut w = WriteWatch::new(pages, 0);
            let mut written = Vec::new();
            for &(s, len) in &writes {
                w.record(s, s + len, gap);
                for p in s..(s + len).min(pages) {
                    written.push(p);
                }
            }
            if !w.is_diffuse() {
                let z = w.zones();
                for pair in z.windows(2) {
                    prop_assert!(pair[0].1 + gap < pair[1].0, "{:?}", z);
                }
                for &(s, e) in z {
                    prop_assert!(s < e && e <= pages);
                }
                for p in written {
                    prop_assert!(z.iter().any(|&(s, e)| s <= p && p < e), "page {} not in {:?}", p, z);
                }
            }
        }

        /// ColdExcept never leaves a written page outside its zones, its
        /// zones are aligned (but for the region's end) and cover no more
        /// than the allowed share.
        #[test]
        fn cold_except_excludes_every_written_page(
            pages in 64u32..50_000,
            writes in prop::collection::vec((0u32..50_000, 1u32..8), 1..300),
        ) {
            let r = rules();
            let mut w = WriteWatch::new(pages, 0);
            for &(s, len) in &writes {
                w.record(s, s + len, r.zone_gap);
            }
            w.checkpoint(S / 4);
            if let WriteVerdict::ColdExcept(z) = w.verdict(1.0, S, &r) {
                let covered: u32 = z.iter().map(|&(s, e)| e - s).sum();
                prop_assert!(f64::from(covered) <= r.max_zone_share * f64::from(pages));
                for &(s, e) in &z {
                    prop_assert!(s % r.align == 0 && (e % r.align == 0 || e == pages));
                }
                for &(s, len) in &writes {
                    for p in s..(s + len).min(pages) {
                        prop_assert!(z.iter().any(|&(a, b)| a <= p && p < b));
                    }
                }
            }
        }
    }
}
