//! Keeping the books equal to the processes' maps (the module header of
//! `daemon.rs`, step 1): when to re-read them, what changed, regions
//! mapped anew in place (renewals), and the marks of processes that left
//! the eligible set.
//!
//! Invariants: after [`Daemon::after_refresh`] there is one book and one
//! lifecycle per region the target reported, none for any other; a
//! renewed region is a new, unmarked generation.

use super::*;

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    pub(super) fn maybe_refresh(&mut self, now: Nanos) -> bool {
        if now >= self.next_check {
            // The check reads /proc's pid list and one statm per selected
            // process (about 2 µs each): with thousands of processes it is
            // spaced out to stay within `scan.refresh_cpu` too.
            let t0 = host::thread_cpu_ns();
            let changes = self.target.processes_changed();
            self.pending_procs |= changes.processes;
            self.pending_pids.extend(changes.came_or_went);
            self.pending_maps.extend(changes.mappings);
            // A region unmapped and mapped again at the same addresses
            // between two checks keeps the size the check compares (a
            // cycle the checks alias with): its frames tell.
            self.note_renewals(now, None);
            self.fill_counts_new = true;
            let cost = host::thread_cpu_ns().saturating_sub(t0);
            let spacing = (cost as f64 / self.config.scan.refresh_cpu) as Nanos;
            self.next_check = now + (self.config.scan.refresh_ms * MS).max(spacing);
        } else {
            // Between checks, a few of the regions whose age the lifespan
            // rule judges are looked at every wake-up: a cycle shorter
            // than the check's interval would otherwise be caught only
            // when two checks in a row find it mapped.
            let turn = self.renewal_turn(now);
            if !turn.is_empty() {
                self.note_renewals(now, Some(&turn));
            }
        }
        let forced = now >= self.earliest_forced;
        let pending = self.pending_procs || !self.pending_maps.is_empty();
        // A refresh of some processes, within FORCED_REFRESH_CPU: those
        // that came or went (a guest started is read within a second, not
        // after `scan.refresh_cpu`'s spacing, 14 s for a 7 ms full
        // refresh), and those pagesift marked ranges in (their maps only
        // changed, by the marks' splits), with those whose size changed.
        // Every other process's regions stay as they were.
        let full = (self.force_refresh && forced)
            || (pending && now >= self.earliest_refresh)
            || now >= self.next_periodic_refresh;
        let only_some =
            !full && forced && !(self.marked_pids.is_empty() && self.pending_pids.is_empty());
        if !full && !only_some {
            return false;
        }
        let t0 = host::thread_cpu_ns();
        let mut some = std::mem::take(&mut self.marked_pids);
        some.append(&mut self.pending_pids);
        if only_some {
            some.append(&mut self.pending_maps);
        }
        let refreshed = if only_some {
            self.target.refresh_pids(&some)
        } else {
            self.target.refresh().map(|()| true)
        };
        let cost = host::thread_cpu_ns().saturating_sub(t0);
        match refreshed {
            Ok(true) => {}
            Ok(false) => {
                // Only processes that are not candidates came or went:
                // nothing to reconcile.
                self.earliest_forced = now + (cost as f64 / FORCED_REFRESH_CPU) as Nanos;
                return false;
            }
            Err(e) => {
                warn!(error = %e, "refreshing processes failed");
                // A failed refresh of some processes is followed by a full
                // one, whose failure is not retried until asked again.
                self.force_refresh = only_some;
                return false;
            }
        }
        if !only_some {
            // Spaced by its cost, but a one-off costly refresh (the
            // periodic smaps read) counts as at most twice the usual one:
            // spaced by its whole cost it left the daemon blind to unmaps
            // for 19 s.
            self.earliest_refresh = now
                + self
                    .refresh_spacing
                    .after(cost, self.config.scan.refresh_cpu);
            // At least every MAX_REFRESH_INTERVAL, but no more CPU than
            // FORCED_REFRESH_CPU for it when a refresh is that costly.
            self.next_periodic_refresh =
                now + MAX_REFRESH_INTERVAL.max((cost as f64 / FORCED_REFRESH_CPU) as Nanos);
            self.force_refresh = false;
            self.pending_procs = false;
            self.pending_maps.clear();
        }
        self.pending_run_pages = 0;
        self.after_refresh(now);
        // A refresh of some processes is spaced by everything it cost, the
        // books' reconciliation included: on a host where processes come
        // and go every second, that is most of it.
        let spaced_by = if only_some {
            host::thread_cpu_ns().saturating_sub(t0)
        } else {
            cost
        };
        self.earliest_forced = now + (spaced_by as f64 / FORCED_REFRESH_CPU) as Nanos;
        debug!(
            cost_us = cost / 1000,
            regions = self.books.len(),
            only = ?only_some.then_some(&some),
            "refreshed"
        );
        true
    }

    /// The regions to look at for renewal at this wake-up between checks:
    /// the next [`RENEWAL_LOOKS_PER_WAKE`] after the last one looked at,
    /// in id order and wrapping around, among those the lifespan rule
    /// judges (at least its smallest size, and younger than its early age
    /// or of a process with an early death). A QEMU has hundreds of such
    /// regions while its guest boots, so they take turns.
    pub(crate) fn renewal_turn(&mut self, now: Nanos) -> BTreeSet<RegionId> {
        if self.renewal_sized.is_empty() {
            return BTreeSet::new();
        }
        let rules = *self.lifespans.rules();
        let early: HashSet<ProcKey> = self.lifespans.procs().copied().collect();
        let books = &self.books;
        let judged = |id: &&RegionId| {
            books.get(id).is_some_and(|b| {
                b.span.pages >= rules.min_pages
                    && (now.saturating_sub(b.first_seen) < rules.short
                        || early.contains(&b.span.proc))
            })
        };
        let after = self
            .renewal_cursor
            .map_or(Bound::Unbounded, Bound::Excluded);
        // In visiting order, so that the cursor is the last one visited
        // (after a wrap, one near the start).
        let mut order: Vec<RegionId> = (self.renewal_sized.range((after, Bound::Unbounded)))
            .filter(judged)
            .copied()
            .take(RENEWAL_LOOKS_PER_WAKE)
            .collect();
        let more = RENEWAL_LOOKS_PER_WAKE - order.len();
        if more > 0 {
            let wrapped: Vec<RegionId> = (self.renewal_sized.iter())
                .filter(judged)
                .copied()
                .take_while(|id| !order.contains(id))
                .take(more)
                .collect();
            order.extend(wrapped);
        }
        self.renewal_cursor = order.last().copied();
        order.into_iter().collect()
    }

    /// Regions mapped anew at the same addresses since the last look
    /// (`Target::check_renewed`; `only`: the regions to look at, all
    /// when `None`). Each generation is a life of its own: the old one
    /// died now, at the age it had reached, and the new one is first seen
    /// now, so that the lifespan rule sees a cycle that the maps cannot.
    pub(super) fn note_renewals(&mut self, now: Nanos, only: Option<&BTreeSet<RegionId>>) {
        let min_pages = self.lifespans.rules().min_pages;
        for id in self.target.check_renewed(min_pages, only) {
            let Some(b) = self.books.get_mut(&id) else {
                continue;
            };
            debug!(
                pid = b.span.proc.pid,
                start = b.span.start,
                pages = b.span.pages,
                age_s = b.age_s(now),
                "mapped anew at the same addresses: a new life"
            );
            self.lifespans
                .died(b.span.proc, b.span.pages, b.first_seen, now);
            b.first_seen = now;
            // What the index holds of it is the old generation's content.
            self.distiller.remap_regions(&[id], |_| None);
            if self.lives.mode(id) == Some(Mode::Promoted) {
                // Its mark went with the old VMA: the new generation is
                // unmarked memory, judged afresh (and recurring, if its
                // place says so). Without this, the next refresh took the
                // unmarked range for one the kernel or the process had
                // unmarked, and held it for `demote_hold_s`.
                let life = self.lives.forget(id);
                self.marks.remove(b.span.proc, b.span.start, b.span.end());
                let ending = ending_of(b, life.as_ref(), true);
                self.recurrences
                    .died(b.span.proc, b.span.start, b.span.pages, ending, now);
                self.lives.track(id, b.span.pages, now);
                b.reborn();
                b.recurring = (self.config.ladder.raise_recurring)
                    .then(|| {
                        self.recurrences
                            .predecessor(b.span.proc, b.span.start, b.span.pages, now)
                    })
                    .flatten();
                // Discovery's memory of what pagesift advised there is
                // stale: the next refresh reads the process's smaps.
                self.target.distrust_mergeable(b.span.proc.pid);
                self.need_sync = true;
            }
        }
    }

    pub(super) fn after_refresh(&mut self, now: Nanos) {
        for pid in self.target.take_gone() {
            self.inject_skips.remove(&pid);
        }
        let procs = self.target.processes();
        self.allowed.clear();
        self.self_managed.clear();
        self.comms.clear();
        self.cgroups.clear();
        self.skipped.clear();
        for p in &procs {
            self.comms.insert(p.key.pid, p.facts.comm.clone());
            self.cgroups.insert(p.key.pid, p.cgroup.clone());
            match self.policy.judge(&p.facts) {
                Ok(()) => {
                    self.allowed.insert(p.key.pid, p.key);
                    if p.merge_any {
                        self.self_managed.insert(p.key.pid);
                    }
                }
                Err(reason) => {
                    // Processes that were never candidates are not news.
                    if crate::eligibility::refusal_is_news(&reason) {
                        self.skipped.insert(
                            p.key.pid,
                            SkipEntry {
                                comm: p.facts.comm.clone(),
                                reason,
                                retry_at: None,
                            },
                        );
                    }
                }
            }
        }
        for (pid, reason) in self.target.discovery_skipped() {
            self.skipped.insert(
                pid,
                SkipEntry {
                    comm: String::new(),
                    reason,
                    retry_at: None,
                },
            );
        }
        self.inject_skips
            .retain(|pid, _| self.allowed.contains_key(pid));
        self.unmark_departed();
        let left_out = self.target.regions_left_out();
        if left_out > 0 && self.left_out == 0 {
            warn!(
                left_out,
                max_regions = self.config.scan.max_regions,
                "eligible processes map more regions than scan.max_regions: the smallest are left out"
            );
        }
        self.left_out = left_out;
        // Regions of eligible processes. A region new to this refresh that
        // is a piece of a region known before (a mark split its VMA) is as
        // old as that region: see `known_since`.
        let before = KnownSpans::of(self.books.values());
        (self.held_spans).renew(&self.books, &self.lives, &self.allowed, now);
        let regions = self.target.regions();
        let mut seen = BTreeSet::new();
        for r in regions {
            if !self.allowed.contains_key(&r.owner) {
                continue;
            }
            let Some(span) = self.target.span(r.id) else {
                continue;
            };
            seen.insert(r.id);
            let full_scans = self.ksm_now.full_scans;
            let self_managed = self.self_managed.contains(&span.proc.pid);
            let ours = self.marks.covers(span.proc, span.start, span.end());
            // A piece of a region trimmed since the last refresh.
            let trimmed_piece = (self.trimmed_spans.iter())
                .any(|&(p, s, e)| p == span.proc && s <= span.start && span.end() <= e);
            let recurring = (self.config.ladder.raise_recurring && !self.books.contains_key(&r.id))
                .then(|| {
                    self.recurrences
                        .predecessor(span.proc, span.start, span.pages, now)
                })
                .flatten();
            let new = !self.books.contains_key(&r.id);
            let book = self.books.entry(r.id).or_insert_with(|| {
                let mut b = Book::new(span.clone(), before.known_since(&span).unwrap_or(now));
                b.recurring = recurring;
                b
            });
            if book.span.pages != span.pages {
                book.resized();
            }
            self.lives.track(r.id, span.pages, now);
            book.span = span;
            let mergeable = book.span.mergeable;
            let foreign = self_managed || (mergeable && !ours);
            // Visibility follows each transition (`lives`): a region held
            // or merging is out of the ladder, and back when it is not.
            match (self.lives.mode(r.id), foreign) {
                (Some(Mode::Foreign), true) | (None, _) => {}
                (Some(mode), true) => {
                    if mode == Mode::Promoted {
                        // The process took over (merge-any): its range now,
                        // never to be unmarked by pagesift.
                        self.marks
                            .remove(book.span.proc, book.span.start, book.span.end());
                    }
                    self.lives.foreign(r.id, full_scans, now);
                }
                (Some(Mode::Foreign), false) => {
                    // The process made it unmergeable again.
                    self.lives.stop_foreign(r.id);
                }
                (Some(Mode::Promoted), false) if !mergeable && trimmed_piece => {
                    // All of it is a stretch pagesift trimmed: sampled
                    // again, not held (it did not thrash).
                    self.lives.trimmed(r.id);
                }
                (Some(Mode::Promoted), false) if !mergeable => {
                    warn!(
                        pid = book.span.proc.pid,
                        start = book.span.start,
                        "a range pagesift marked is not mergeable (the kernel ignored \
                         MADV_MERGEABLE or the process unmarked it): holding it"
                    );
                    self.marks
                        .remove(book.span.proc, book.span.start, book.span.end());
                    self.lives
                        .hold(r.id, now, self.config.actuate.demote_hold_s);
                }
                (Some(Mode::Sampling), false) if ours && mergeable && trimmed_piece => {
                    // A marked piece of a settled region that trimming
                    // split: ksmd has visited its pages already.
                    self.lives.adopt_settled(r.id, full_scans, now);
                }
                (Some(Mode::Sampling), false) if ours && mergeable => {
                    // Marked in an earlier life of this book (ids rebuilt),
                    // or a marked run that became a VMA of its own: out of
                    // the ladder until ksmd has merged it.
                    self.lives.mark(r.id, full_scans, now);
                }
                _ => {}
            }
            // Held pages back under a new id (their VMA was joined with a
            // neighbour, or split): still held (`HeldSpans`).
            if new
                && !mergeable
                && let Some(h) = self.held_spans.over(&book.span, now)
                && self.lives.inherit_hold(r.id, h, now)
            {
                info!(
                    pid = book.span.proc.pid,
                    start = book.span.start,
                    pages = book.span.pages,
                    held_s = (h.until - now) as f64 / SEC as f64,
                    "held as the held regions it lies over were (their VMAs were joined or split)"
                );
            }
        }
        let gone: Vec<RegionId> = self
            .books
            .keys()
            .filter(|id| !seen.contains(id))
            .copied()
            .collect();
        // The regions kept, by process and start: a gone region that one
        // of them overlaps was renumbered, not unmapped. (Looked up, not
        // searched for: a process with thousands of regions that exits
        // took a scan of every book per region gone.) A process's regions
        // do not overlap, so the one to check is the last that starts
        // before the gone one ends.
        let kept: BTreeSet<(ProcKey, u64, u64)> = if gone.is_empty() {
            BTreeSet::new()
        } else {
            (self.books.iter())
                .filter(|(id, _)| seen.contains(id))
                .map(|(_, b)| (b.span.proc, b.span.start, b.span.end()))
                .collect()
        };
        for id in gone {
            let life = self.lives.forget(id);
            let Some(b) = self.books.remove(&id) else {
                continue;
            };
            let renumbered = kept
                .range(..(b.span.proc, b.span.end(), 0))
                .next_back()
                .is_some_and(|&(p, _, end)| p == b.span.proc && b.span.start < end);
            if renumbered {
                continue;
            }
            self.held_spans
                .unmapped(b.span.proc, b.span.start, b.span.end());
            // Unmapped: its marks went with it.
            let marked = life.as_ref().is_some_and(|l| l.mode() == Mode::Promoted);
            if marked {
                self.marks.remove(b.span.proc, b.span.start, b.span.end());
            }
            self.lifespans
                .died(b.span.proc, b.span.pages, b.first_seen, now);
            let ending = ending_of(&b, life.as_ref(), marked);
            self.recurrences
                .died(b.span.proc, b.span.start, b.span.pages, ending, now);
        }
        let min_pages = self.lifespans.rules().min_pages;
        self.renewal_sized = (self.books.iter())
            .filter(|(_, b)| b.span.pages >= min_pages)
            .map(|(&id, _)| id)
            .collect();
        let live: HashSet<ProcKey> = self.allowed.values().copied().collect();
        self.lifespans.retain(now, |k| live.contains(k));
        self.recurrences.retain(now, |k| live.contains(k));
        for key in self.marks.processes() {
            if !live.contains(&key) {
                self.marks.forget(key);
            }
        }
        // The pieces of trimmed regions were judged above.
        self.trimmed_spans.clear();
        self.need_sync = true;
        // Named pages follow their addresses (`addresses`): the index's
        // entries of the regions that changed shape, and stacked hints.
        let by_address = AddressMap::of(self.books.iter());
        if by_address == self.by_address {
            self.sync_hints(None);
            return;
        }
        let moves = self.by_address.moves_to(&by_address);
        let (moved, dropped) = self
            .distiller
            .remap_regions(&moves.changed, |p| moves.page(p));
        if moved + dropped > 0 {
            debug!(
                regions = moves.changed.len(),
                moved, dropped, "index entries followed their pages"
            );
        }
        self.sync_hints(Some(&moves));
        self.by_address = by_address;
    }

    /// Unmarks what pagesift marked in processes that left the eligible
    /// set ("ineligible always wins"): an `[ineligible]`
    /// entry after a reload, a uid or cgroup change, an exec (a new
    /// identity, see [`ProcKey`]). Their ledger ranges move to `departed`
    /// and get `MADV_UNMERGEABLE` in one batch per process, through the
    /// actuator that marked them, at this refresh; a batch that cannot run
    /// now (traced, seccomp) is tried again at the next refresh. A process
    /// that exited, or whose pid now names another process or image, is
    /// forgotten untouched: its marks went with it.
    pub(super) fn unmark_departed(&mut self) {
        for key in self.marks.processes() {
            if self.allowed.get(&key.pid) != Some(&key) {
                for (s, e) in self.marks.ranges(key) {
                    self.departed.add(key, s, e);
                }
                self.marks.forget(key);
            }
        }
        for key in self.departed.processes() {
            if self.allowed.get(&key.pid) == Some(&key) {
                // Eligible again before the unmark could run: still marked.
                for (s, e) in self.departed.ranges(key) {
                    self.marks.add(key, s, e);
                }
                self.departed.forget(key);
                continue;
            }
            if !self.target.same_process(key) {
                self.departed.forget(key);
                continue;
            }
            let comm = self.comms.get(&key.pid).cloned().unwrap_or_default();
            self.counters.batches += 1;
            self.target.distrust_mergeable(key.pid);
            match crate::actuate::unmark_all(&mut self.actuator, &mut self.departed, key) {
                Unmarked::Done(bytes) => {
                    self.counters.unmarks += 1;
                    self.force_refresh = true;
                    info!(pid = key.pid, comm = %printable(&comm), bytes, "left the eligible set: unmarked");
                }
                Unmarked::Partly(failed) => {
                    warn!(pid = key.pid, comm = %printable(&comm), ?failed, "left the eligible set: some ranges could not be unmarked");
                    self.departed.forget(key);
                }
                Unmarked::Gone => {}
                Unmarked::NotNow(reason) => {
                    warn!(pid = key.pid, comm = %printable(&comm), reason = %reason, "left the eligible set, but cannot be unmarked now: trying again at the next refresh");
                }
            }
        }
    }
}
