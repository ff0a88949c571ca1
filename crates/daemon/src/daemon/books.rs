//! What the loop keeps about each region besides its lifecycle: its
//! [`Book`] (write watch, the sweep's findings, how it was raised and
//! marked), [`KnownSpans`], which dates the pieces a mark splits off a
//! known region, and [`HeldSpans`], which holds the regions that replace
//! held ones.
//!
//! Invariants: a book's zones, duplicate map and watch are offsets into
//! its current span; they are dropped whenever the span changes length
//! ([`Book::resized`]) or is mapped anew in place ([`Book::reborn`]).
//! Books are added and removed only by the refresh (`refresh.rs`): after
//! it, there is one for each region the target reported.

use super::*;

/// Longest a region raised by the sweep waits for a write watch before it
/// may be marked without one (the watch's capacity is bounded).
pub(super) const RAISED_WATCH_WAIT: Nanos = 5 * SEC;

/// How long a sweep's unique zones are trusted for marking around them:
/// three sweep epochs at the default spacing (memory that changes faster
/// makes a stale zone cost little: it becomes a region of its own, sampled
/// and marked when it holds duplicates).
pub(super) const UNIQUE_ZONES_FRESH: Nanos = 15 * SEC;

/// The spans of the regions known before a refresh, with when each was
/// first seen, to date the pieces a mark split off them. Marking a run
/// splits its VMA, and each piece is a region of its own at the next
/// refresh, new to the books; counted as new, it waited
/// `scan.sweep_min_age_s` (5 s) again for the sweep after every mark
/// nearby. In one `pagesift bench --quick --only vm-boot` run (2026-11-27,
/// read by hand from the daemon's log and the run's CSV) the
/// 15 552-page rest of a guest's RAM, split off by a 160-page run marked
/// at 29 s, was swept only at 41 s (two epochs later) and held 60 MiB of
/// duplicates that ksm-1000 had merged by 33 s.
pub(super) struct KnownSpans(Vec<KnownSpan>);

/// A known region: its process, its VMA's range, its own range, and when
/// it was first seen.
pub(super) struct KnownSpan {
    pub(super) proc: ProcKey,
    pub(super) vma: (u64, u64),
    pub(super) range: (u64, u64),
    pub(super) first_seen: Nanos,
}

impl KnownSpans {
    pub(super) fn of<'a>(books: impl Iterator<Item = &'a Book>) -> KnownSpans {
        let mut v: Vec<_> = books
            .map(|b| KnownSpan {
                proc: b.span.proc,
                vma: (b.span.vma_start, b.span.vma_end),
                range: (b.span.start, b.span.end()),
                first_seen: b.first_seen,
            })
            .collect();
        v.sort_unstable_by_key(|k| (k.proc, k.vma.0));
        KnownSpans(v)
    }

    /// The earliest first sight of the known regions of the same process
    /// that overlap `span` and whose VMA held all of `span`'s VMA: a
    /// mapping made anew elsewhere, or larger, is not such a piece.
    pub(super) fn known_since(&self, span: &Span) -> Option<Nanos> {
        let from = self.0.partition_point(|k| k.proc < span.proc);
        (self.0[from..].iter())
            .take_while(|k| k.proc == span.proc && k.vma.0 <= span.vma_start)
            .filter(|k| span.vma_end <= k.vma.1 && k.range.0 < span.end() && span.start < k.range.1)
            .map(|k| k.first_seen)
            .min()
    }
}

/// The address ranges of holds in force, by process, so that the pages
/// of a held region stay held whatever id they come back under
/// (`Lifecycles::inherit_hold`, whose module header says why). A range is
/// remembered from the refresh that finds its region held until its hold
/// ends, its pages are unmapped, or its process leaves: the unmarks and
/// marks around a thrashing region can join and split its VMA several
/// times within one hold (in `pagesift bench --full --only
/// short-lived-1000ms`, 2026-12-03, the heap of 2062 pages came back as
/// pieces of 16 to 1789 pages, each judged afresh).
///
/// Invariant: sorted by process, start and end, one entry per range;
/// every entry's hold ends after the last [`renew`](HeldSpans::renew).
#[derive(Default)]
pub(super) struct HeldSpans(Vec<(ProcKey, u64, u64, HeldState)>);

impl HeldSpans {
    /// Drops the holds over by `now` and those of processes not in
    /// `allowed`, and adds the regions held now.
    pub(super) fn renew(
        &mut self,
        books: &BTreeMap<RegionId, Book>,
        lives: &Lifecycles,
        allowed: &HashMap<u32, ProcKey>,
        now: Nanos,
    ) {
        self.0
            .retain(|(p, _, _, h)| h.until > now && allowed.get(&p.pid) == Some(p));
        for (id, h) in lives
            .iter()
            .filter_map(|(id, l)| Some((id, l.held_state()?)))
        {
            if let Some(b) = books.get(&id)
                && h.until > now
            {
                (self.0).push((b.span.proc, b.span.start, b.span.end(), h));
            }
        }
        // One entry per range: a region still held is found again at
        // every refresh.
        self.0.sort_unstable_by_key(|&(p, s, e, _)| (p, s, e));
        self.0.dedup_by(|later, kept| {
            let same = (later.0, later.1, later.2) == (kept.0, kept.1, kept.2);
            if same {
                kept.3 = kept.3.join(later.3);
            }
            same
        });
    }

    /// Forgets the holds over `[start, end)` of `proc`: unmapped.
    pub(super) fn unmapped(&mut self, proc: ProcKey, start: u64, end: u64) {
        self.0
            .retain(|&(p, s, e, _)| p != proc || e <= start || end <= s);
    }

    /// The holds of `proc` in force at `now` over `[start, end)`.
    fn over_range(
        &self,
        proc: ProcKey,
        start: u64,
        end: u64,
        now: Nanos,
    ) -> impl Iterator<Item = &(ProcKey, u64, u64, HeldState)> {
        let from = self.0.partition_point(|&(p, ..)| p < proc);
        (self.0[from..].iter())
            .take_while(move |&&(p, s, ..)| p == proc && s < end)
            .filter(move |&&(_, _, e, h)| start < e && h.until > now)
    }

    /// The joined hold of the holds that cover at least half of `span`,
    /// or `None`.
    pub(super) fn over(&self, span: &Span, now: Nanos) -> Option<HeldState> {
        let covered: u32 = self.zones(span, now).iter().map(|(s, e)| e - s).sum();
        if covered * 2 < span.pages {
            return None;
        }
        (self.over_range(span.proc, span.start, span.end(), now))
            .map(|&(.., h)| h)
            .reduce(HeldState::join)
    }

    /// The pages of `span` under holds in force at `now`, as sorted,
    /// disjoint zones `[first, end)` of page offsets.
    pub(super) fn zones(&self, span: &Span, now: Nanos) -> Vec<(u32, u32)> {
        let (start, end) = (span.start, span.end());
        let mut set = pagesift_core::ranges::RangeSet::new();
        for &(_, s, e, _) in self.over_range(span.proc, start, end, now) {
            set.insert(
                (s.max(start) - start) / PAGE,
                (e.min(end) - start).div_ceil(PAGE),
            );
        }
        set.iter().map(|(s, e)| (s as u32, e as u32)).collect()
    }

    /// Whether a hold in force at `now` lies over any of `[start, end)`:
    /// a run there is not marked.
    pub(super) fn touches(&self, proc: ProcKey, start: u64, end: u64, now: Nanos) -> bool {
        self.over_range(proc, start, end, now).next().is_some()
    }
}

/// `a` and `b` (lists of zones `[first, end)`) joined into one sorted list
/// of disjoint zones.
pub(super) fn join_zones(a: &[(u32, u32)], b: &[(u32, u32)]) -> Vec<(u32, u32)> {
    let mut set = pagesift_core::ranges::RangeSet::new();
    for &(s, e) in a.iter().chain(b) {
        set.insert(u64::from(s), u64::from(e));
    }
    set.iter().map(|(s, e)| (s as u32, e as u32)).collect()
}

/// What the loop keeps about one region besides its lifecycle (mode,
/// holds, settling, COW accounting: `core::pipeline::lifecycle`, in
/// [`Daemon`]'s `lives`, which also keeps the regions hidden from the
/// ladder).
#[derive(Clone, Debug)]
pub(super) struct Book {
    pub(super) span: Span,
    pub(super) first_seen: Nanos,
    /// Write tracking of the region: since when, and where it was written.
    pub(super) watch: Option<WriteWatch>,
    /// The zones (page ranges) its watch found written when it was judged
    /// markable around them: marking leaves them out, however long the
    /// marking waits (core::pipeline::write_watch, ColdExcept).
    pub(super) exclude: Option<Vec<(u32, u32)>>,
    /// When the exact sweep raised it to the top level (see
    /// [`Book::awaits_watch`]).
    pub(super) raised_at: Option<Nanos>,
    /// Since when it is parked on the top level (raised by the sweep,
    /// waiting for its write watch's verdict): see [`RAISED_PARK_MAX`].
    pub(super) parked_at: Option<Nanos>,
    /// Its duplicate pages, as the last sweep epoch found them: its watch
    /// counts the writes that land on them (core::pipeline::write_watch).
    pub(super) dups: Option<DupMap>,
    /// Its unique zones (stretches without duplicates) as the last sweep
    /// epoch found them, and when: promotion marks around them while they
    /// are recent (see [`UNIQUE_ZONES_FRESH`]).
    pub(super) unique: Vec<(u32, u32)>,
    pub(super) unique_at: Nanos,
    /// Times a sweep found it settled with duplicates left and made ksmd
    /// merge it again, and the earliest time it may do so again (see
    /// [`REMERGE_MIN_PAGES`]).
    pub(super) sweep_remerges: u32,
    pub(super) sweep_remerge_after: Nanos,
    /// Pages expected to merge, from the duplicate share that promoted it
    /// whole, until the mark is done (then handed to its lifecycle, see
    /// `Lifecycles::expect`).
    pub(super) expected_dups: Option<u64>,
    /// Whether the log said it waits for its process's regions to live
    /// longer (once per book).
    pub(super) short_noted: bool,
    /// Mapped where its process's last region of its size was marked: the
    /// predecessor's duplication ratio, until it is raised to the top
    /// (`Daemon::raise_recurring`).
    pub(super) recurring: Option<f64>,
    /// Raised to the top on its predecessors' evidence, not on its own
    /// samples (`core::pipeline::recurrence`).
    pub(super) raised_on_history: bool,
    /// The duplicate share it was marked whole with.
    pub(super) marked_dup: Option<f64>,
    /// Raised on history and seen merging by a probe
    /// (`Daemon::probe_recurring`): its place is passed on.
    pub(super) seen_merged: bool,
}

impl Book {
    /// A region the sweep raised straight to the top level has not been
    /// watched on the way up, as a climbing one is from level 1: with write
    /// watching on, it waits up to [`RAISED_WATCH_WAIT`] for a watch (and
    /// its verdict) before it may be marked, so that a region rewritten
    /// with the same bytes (which the sweep cannot see) is not marked on
    /// the sweep's word alone.
    pub(super) fn awaits_watch(&self, watching: bool, now: Nanos) -> bool {
        watching
            && self.watch.is_none()
            && self.raised_at.is_some_and(|t| now < t + RAISED_WATCH_WAIT)
    }

    /// Its age at `now` (since first seen, or since mapped anew), seconds.
    pub(super) fn age_s(&self, now: Nanos) -> f64 {
        now.saturating_sub(self.first_seen) as f64 / SEC as f64
    }

    pub(super) fn new(span: Span, now: Nanos) -> Book {
        Book {
            span,
            first_seen: now,
            watch: None,
            exclude: None,
            raised_at: None,
            parked_at: None,
            dups: None,
            unique: Vec::new(),
            unique_at: 0,
            sweep_remerges: 0,
            sweep_remerge_after: 0,
            expected_dups: None,
            short_noted: false,
            recurring: None,
            raised_on_history: false,
            marked_dup: None,
            seen_merged: false,
        }
    }

    /// Mapped anew in place (`Daemon::note_renewals`): what it knew of the
    /// old generation's pages and marks does not hold for the new one.
    pub(super) fn reborn(&mut self) {
        self.resized();
        self.exclude = None;
        self.raised_at = None;
        self.parked_at = None;
        self.expected_dups = None;
        self.recurring = None;
        self.raised_on_history = false;
        self.marked_dup = None;
        self.seen_merged = false;
    }

    /// Its length changed (its lifecycle follows in `Lifecycles::track`).
    pub(super) fn resized(&mut self) {
        // Zones and duplicate maps are offsets into the old span.
        self.exclude = None;
        self.watch = None;
        self.dups = None;
        self.unique.clear();
    }

    /// Its unique zones if a sweep found them within
    /// [`UNIQUE_ZONES_FRESH`] of `now`, shrunk inwards to whole
    /// [`RUN_ALIGN_PAGES`] (what is left out is never more than the sweep
    /// saw unique).
    pub(super) fn fresh_unique(&self, now: Nanos) -> Vec<(u32, u32)> {
        if now > self.unique_at + UNIQUE_ZONES_FRESH {
            return Vec::new();
        }
        let a = RUN_ALIGN_PAGES as u32;
        (self.unique.iter())
            .map(|&(s, e)| (s.div_ceil(a) * a, e / a * a))
            .filter(|&(s, e)| s < e)
            .collect()
    }

    /// A watch of it armed at `now`, told where its duplicates are if a
    /// sweep has said.
    pub(super) fn arm_watch(&mut self, now: Nanos) {
        let mut w = WriteWatch::new(self.span.pages, now);
        if let Some(m) = &self.dups {
            w.locate(m.clone(), now);
        }
        self.watch = Some(w);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zones_are_joined_sorted_and_disjoint() {
        let written = vec![(0, 16), (100, 200)];
        let unique = vec![(16, 48), (150, 400), (500, 600)];
        assert_eq!(
            join_zones(&written, &unique),
            vec![(0, 48), (100, 400), (500, 600)]
        );
        assert_eq!(join_zones(&[], &[(3, 9)]), vec![(3, 9)]);
    }

    fn span_of(pid: u32, vma: (u64, u64), start: u64, pages: u32) -> Span {
        Span {
            proc: ProcKey {
                pid,
                start_time: 0,
                image: 0,
            },
            start,
            pages,
            vma_start: vma.0,
            vma_end: vma.1,
            mergeable: false,
            name: None,
        }
    }

    #[test]
    fn a_piece_split_off_a_known_region_is_as_old_as_it() {
        let vma = (1 << 30, (1 << 30) + 4096 * PAGE);
        let books = [
            Book::new(span_of(7, vma, vma.0, 2048), 5 * SEC),
            Book::new(span_of(7, vma, vma.0 + 2048 * PAGE, 2048), 9 * SEC),
            Book::new(span_of(8, vma, vma.0, 4096), SEC),
        ];
        let known = KnownSpans::of(books.iter());
        // A mark split pages 100..116 off: the rest after it is a VMA of
        // its own inside the old one, overlapping both old regions.
        let rest = (vma.0 + 116 * PAGE, vma.1);
        assert_eq!(
            known.known_since(&span_of(7, rest, rest.0, 3980)),
            Some(5 * SEC)
        );
        let tail = (vma.0 + 3000 * PAGE, vma.1);
        assert_eq!(
            known.known_since(&span_of(7, tail, tail.0, 1096)),
            Some(9 * SEC)
        );
        // Another process, a larger mapping, or a mapping elsewhere: new.
        assert_eq!(known.known_since(&span_of(9, rest, rest.0, 3980)), None);
        let larger = (vma.0, vma.1 + PAGE);
        assert_eq!(known.known_since(&span_of(7, larger, vma.0, 4097)), None);
        let elsewhere = (vma.1, vma.1 + 64 * PAGE);
        assert_eq!(
            known.known_since(&span_of(7, elsewhere, elsewhere.0, 64)),
            None
        );
    }

    #[test]
    fn unique_zones_shrink_to_whole_runs_and_go_stale() {
        let span = Span {
            proc: ProcKey {
                pid: 1,
                start_time: 0,
                image: 0,
            },
            start: 0,
            pages: 1024,
            vma_start: 0,
            vma_end: 1024 * PAGE,
            mergeable: false,
            name: None,
        };
        let mut b = Book::new(span, 0);
        b.unique = vec![(5, 300), (400, 410)];
        b.unique_at = SEC;
        // Inwards to multiples of 16; a zone that shrinks away is dropped.
        assert_eq!(b.fresh_unique(2 * SEC), vec![(16, 288)]);
        assert!(b.fresh_unique(SEC + UNIQUE_ZONES_FRESH + 1).is_empty());
        b.resized();
        assert!(b.fresh_unique(2 * SEC).is_empty());
    }
}
