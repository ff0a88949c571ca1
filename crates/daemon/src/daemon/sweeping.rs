//! The exact sweep in the loop (the module header of `daemon.rs`, step 2,
//! and [`crate::sweep`]): a slice of hashing per wake-up, and at the end
//! of an epoch its findings: regions raised to the top, duplicate runs
//! waiting for their region's watch, settled regions made to merge again.

use super::*;

/// Fewest unmerged duplicates (pages) a sweep must find in a settled
/// promoted region to make ksmd merge it again at the active pace: fewer
/// are left to the trickle. The n-th such remerge of a region waits 2^n
/// sweep spacings after the last (at most 64). pagesift's choice (a
/// 64-page run is 256 KiB).
pub(super) const REMERGE_MIN_PAGES: u32 = 64;

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    /// One slice of the exact sweep over the sampling regions of eligible
    /// processes; when it finishes an epoch, its findings steer the ladder
    /// (`core::pipeline::sweep`): a region with at least V_dup duplicates among its
    /// present pages is raised to the top level, where the write watch
    /// and marking take over; in a poorer region each long enough run of
    /// duplicates joins this wake's runs, marked like sampled ones (each
    /// side is found by the sweep, so no twin is needed).
    pub(super) fn sweep(&mut self, now: Nanos) {
        let (books, lives, allowed, managed) =
            (&self.books, &self.lives, &self.allowed, &self.self_managed);
        let min_age = (self.config.scan.sweep_min_age_s * SEC as f64) as Nanos;
        let regions = |filling: &BTreeSet<u32>, full: bool| {
            books
                .iter()
                .filter_map(|(&id, b)| {
                    // A full epoch walks every sampling region; a fill
                    // epoch those of the processes that filled. Both walk
                    // the settled promoted regions of those processes (a
                    // guest filling RAM that was marked early): new
                    // duplicates in them would wait for the trickle.
                    let pid = b.span.proc.pid;
                    let filled = filling.contains(&pid);
                    let walk = match lives.mode(id) {
                        Some(Mode::Sampling) => full || filled,
                        Some(Mode::Promoted) => filled,
                        _ => false,
                    };
                    (walk
                        && !lives.is_hidden(id)
                        && allowed.contains_key(&pid)
                        && !managed.contains(&pid)
                        && now.saturating_sub(b.first_seen) >= min_age)
                        .then_some((id, filled))
                })
                .collect()
        };
        let min_run = self.config.actuate.run_min_pages.max(1);
        if std::mem::take(&mut self.fill_counts_new) {
            self.sweeper.note_filled(self.target.filled_pages());
        }
        let Some(findings) = self.sweeper.step(&mut self.target, now, min_run, regions) else {
            return;
        };
        // The new epoch's runs replace the last one's that still wait (a
        // fill epoch's, those of the regions it walked).
        if self.sweeper.fill_epoch() {
            let walked: HashSet<RegionId> = findings.iter().map(|f| f.region).collect();
            self.sweep_runs.retain(|r| !walked.contains(&r.region));
        } else {
            self.sweep_runs.clear();
        }
        let watching = self.config.actuate.write_tracking && self.config.ladder.v_cow < 1.0;
        let top = self.distiller.ladder().levels() - 1;
        let (mut raised, mut runs, mut remerged) = (0u64, 0u64, 0u64);
        for mut f in findings {
            // Its watch, now or later, learns where its duplicates are.
            if let Some(b) = self.books.get_mut(&f.region) {
                let map = std::mem::take(&mut f.map);
                if let Some(w) = &mut b.watch {
                    w.locate(map.clone(), now);
                }
                b.dups = Some(map);
                b.unique = std::mem::take(&mut f.unique);
                b.unique_at = now;
            }
            if !self.books.contains_key(&f.region) || self.lives.is_hidden(f.region) {
                continue;
            }
            if self.lives.mode(f.region) == Some(Mode::Promoted) {
                // Settled, yet holding duplicates ksmd has not merged: a
                // guest that went on filling its RAM after its regions
                // were marked. ksmd's trickle would take minutes; the
                // region merges again at the active pace.
                let b = self.books.get_mut(&f.region).expect("checked above");
                let merged = self.lives[f.region].merged_now();
                if f.unmerged_dups >= REMERGE_MIN_PAGES
                    && now >= b.sweep_remerge_after
                    && self.lives.remerge(f.region, self.ksm_now.full_scans, now)
                {
                    self.lives
                        .expect(f.region, merged + u64::from(f.unmerged_dups));
                    // Duplicates ksmd cannot merge (pinned pages, say)
                    // would send it back every epoch: each time it waits
                    // twice as long, up to 64 sweep spacings.
                    b.sweep_remerges += 1;
                    b.sweep_remerge_after =
                        now + self.sweeper.min_epoch() * (1 << b.sweep_remerges.min(6));
                    remerged += 1;
                    self.counters.remerges += 1;
                    info!(
                        pid = b.span.proc.pid,
                        start = b.span.start,
                        pages = b.span.pages,
                        unmerged_dups = f.unmerged_dups,
                        "sweep: new duplicates in a merged region: merging it again"
                    );
                }
                continue;
            }
            if self.lives.mode(f.region) != Some(Mode::Sampling) {
                continue;
            }
            if f.present >= crate::sweep::MIN_PRESENT
                && self.distiller.raise(f.region, f.dup_ratio(), now)
            {
                raised += 1;
                // Parked on the top level until its watch decides: top-level
                // samples would only misjudge it (its twins sit at offsets
                // sampling does not meet), cost the top level's CPU share,
                // and drop it before the watch is done.
                let parked = watching && self.distiller.park(f.region);
                if let Some(b) = self.books.get_mut(&f.region) {
                    b.raised_at = Some(now);
                    b.parked_at = parked.then_some(now);
                }
                let b = &self.books[&f.region];
                debug!(
                    pid = b.span.proc.pid,
                    start = b.span.start,
                    present = f.present,
                    dups = f.dups,
                    "sweep: duplicates all over, raised to the top level"
                );
                continue;
            }
            if self.distiller.ladder().level_of(f.region) == Some(top) {
                continue;
            }
            for (first, end) in f.runs {
                runs += 1;
                self.sweep_runs.push(DupRun {
                    region: f.region,
                    first,
                    pages: end - first,
                    twin: None,
                    hinted: false,
                });
            }
        }
        self.sweeper.fruitful(raised + runs + remerged > 0);
        self.sweeper.stats.raised += raised;
        self.sweeper.stats.runs += runs;
        info!(
            epoch = self.sweeper.stats.epochs,
            seconds = self.sweeper.stats.last_epoch_ns as f64 / SEC as f64,
            ns_per_page = self.sweeper.ns_per_page() as u64,
            raised,
            runs,
            remerged,
            "sweep done"
        );
    }
}
