//! What `pagesift status` and the metrics show: a [`Status`] snapshot of
//! the loop (counters, KSM, CPU per phase, regions, savings by process
//! and cgroup). Reading it changes nothing but the CPU window it keeps.

use super::*;

impl<T: Target, A: Actuator, K: KsmControl> Daemon<T, A, K> {
    /// Adds a point to the CPU window and drops those older than five
    /// seconds (keeping two).
    pub(super) fn push_cpu(&mut self, now: Nanos) {
        let cpu = host::process_cpu_ns();
        self.cpu_window
            .push_back((now, cpu, self.ksm_now.ksmd_cpu_ns));
        while self.cpu_window.len() > 2
            && self
                .cpu_window
                .front()
                .is_some_and(|&(t, _, _)| now - t > 5 * SEC)
        {
            self.cpu_window.pop_front();
        }
    }

    /// The status snapshot at `now`; also adds a point to the CPU window.
    pub fn status(&mut self, now: Nanos) -> Status {
        self.push_cpu(now);
        let cpu = self.cpu_window.back().map_or(0, |&(_, c, _)| c);
        let share = |i: usize| -> f64 {
            let (a, b) = (self.cpu_window.front(), self.cpu_window.back());
            match (a, b) {
                (Some(a), Some(b)) if b.0 > a.0 => {
                    let d = if i == 1 {
                        b.1.saturating_sub(a.1)
                    } else {
                        b.2.saturating_sub(a.2)
                    };
                    d as f64 / (b.0 - a.0) as f64
                }
                _ => 0.0,
            }
        };
        let ladder = self.distiller.ladder();
        let params = self.distiller.params();
        let lives = &self.lives;
        let region = |id: RegionId, b: &Book| -> RegionStatus {
            let stats = ladder.region_stats(id);
            let life = &lives[id];
            RegionStatus {
                id: id.0,
                pid: b.span.proc.pid,
                comm: self
                    .comms
                    .get(&b.span.proc.pid)
                    .cloned()
                    .unwrap_or_default(),
                start: b.span.start,
                pages: b.span.pages,
                name: b.span.name.clone(),
                level: stats.map(|s| s.level),
                state: match life.mode() {
                    Mode::Sampling => "sampling",
                    Mode::Promoted if life.settled() => "promoted",
                    Mode::Promoted => "merging",
                    Mode::Held { .. } => "held",
                    Mode::Foreign => "foreign",
                }
                .into(),
                merged_pages: life.merged_now(),
                cow_breaks: life.cow_total(),
                age_s: b.age_s(now),
                dup_ratio: stats.map_or(0.0, |s| s.last_dup_ratio),
            }
        };
        let mut levels: Vec<LevelStatus> = (0..ladder.levels())
            .map(|l| LevelStatus {
                level: l,
                cpu_share: params.levels.get(l).map_or(0.0, |p| p.cpu_share),
                round_time_ms: params.levels.get(l).map_or(0, |p| p.round_time / MS),
                region_count: 0,
                pages: ladder.level_pages(l),
                regions: Vec::new(),
            })
            .collect();
        // Each list is chosen by its key first, and only the regions
        // listed are described: with the region cap full (131 072), a
        // description of every region per status was most of the daemon's
        // CPU under a status poll a second (docs/reliability.md).
        let books = &self.books;
        let listed = |keyed: Vec<(u64, RegionId)>, most: usize| -> Vec<RegionStatus> {
            largest(keyed, most)
                .into_iter()
                .filter_map(|id| books.get(&id).map(|b| region(id, b)))
                .collect()
        };
        // One pass over the regions, in id order, for every count and
        // list: with the cap full, a pass per figure with a tree lookup
        // per region was most of a status (docs/reliability.md).
        let mut by_level: Vec<Vec<(u64, RegionId)>> = vec![Vec::new(); ladder.levels()];
        let (mut merged, mut held) = (Vec::new(), Vec::new());
        let mut tally = Tally::default();
        for (id, life, book) in with_books(lives, books) {
            tally.add(life, book);
            let Some(b) = book else { continue };
            let pages = u64::from(b.span.pages);
            if let Some(l) = ladder.level_of(id).filter(|&l| l < by_level.len()) {
                by_level[l].push((pages, id));
            }
            if life.merged_now() > 0 {
                merged.push((life.merged_now(), id));
            }
            if life.held() {
                held.push((pages, id));
            }
        }
        for (l, keyed) in by_level.into_iter().enumerate() {
            levels[l].region_count = ladder.regions_at(l).len() as u64;
            levels[l].regions = listed(keyed, MAX_LISTED);
        }
        let top = listed(merged, 20);
        let held = listed(held, MAX_LISTED);
        let totals = Totals {
            processes: self.allowed.len() as u64,
            regions: self.books.len() as u64,
            promoted_regions: tally.promoted_regions,
            promoted_pages: tally.promoted_pages,
            merging_regions: tally.merging_regions,
            held_regions: tally.held_regions,
            foreign_regions: tally.foreign_regions,
            marked_bytes: self.marks.bytes(),
            merged_pages: tally.merged_pages,
            cow_breaks: tally.cow_breaks,
            marks: self.counters.marks,
            unmarks: self.counters.unmarks,
            batches: self.counters.batches,
            vma_splits: self.counters.vma_splits,
            regions_left_out: self.target.regions_left_out() as u64,
            run_marks: self.counters.run_marks,
            partial_marks: self.counters.partial_marks,
            remerges: self.counters.remerges,
            trims: self.counters.trims,
            trimmed_pages: self.counters.trimmed_pages,
            unseen_break_alarms: self.counters.unseen_break_alarms,
            raised_on_history: self.counters.raised_on_history,
            write_tracked_ranges: self.tracked as u64,
            sampled_pages: self.counters.sampled,
            wakes: self.counters.wakes,
            global_rounds: self.distiller.global_rounds(),
        };
        let start = self.ksm_start.unwrap_or_default();
        let ksm = KsmStatus {
            pages_shared: self.ksm_now.pages_shared,
            pages_sharing: self.ksm_now.pages_sharing,
            full_scans: self.ksm_now.full_scans,
            cpu_share: share(2),
            cpu_seconds: self.ksm_now.ksmd_cpu_ns.saturating_sub(start.ksmd_cpu_ns) as f64 / 1e9,
            target_share: self.pacing.share,
            pages_to_scan: self.pacing.pages_to_scan,
            sleep_ms: self.pacing.sleep_ms,
            wait_share: self.pacing.wait_share,
            // The last look's, at most a second old (a read of
            // /proc/vmstat costs about 30 µs).
            cow_ksm: match (
                self.cow_seen
                    .map(|(c, _)| c)
                    .or_else(|| self.target.cow_ksm()),
                self.cow_ksm_start,
            ) {
                (Some(n), Some(s)) => Some(n.saturating_sub(s)),
                _ => None,
            },
        };
        let daemon = DaemonStatus {
            pid: std::process::id(),
            uptime_s: now.saturating_sub(self.started) as f64 / SEC as f64,
            cpu_share: share(1),
            cpu_cap: self.config.cpu_cap(),
            cap_unmet: self.cap_clipped >= crate::status::CAP_UNMET_WAKES,
            cpu_seconds: cpu.saturating_sub(self.cpu_start_ns) as f64 / 1e9,
            per_page_ns: self.distiller.per_page_ns(),
            strength: self.distiller.controller().strength(),
            config: self.config_path.as_ref().map(|p| p.display().to_string()),
            sweep: self.sweeper.stats,
            cpu_by_phase: self.phase_cpu.seconds(),
            cpu_by_thread: cpu_by_thread(),
            index: {
                let ix = self.distiller.index();
                IndexStatus {
                    stable: ix.stable_len() as u64,
                    unstable: ix.unstable_len() as u64,
                    heap_bytes: ix.heap_bytes() as u64,
                }
            },
        };
        let mut skipped: Vec<Skipped> = self
            .skipped
            .iter()
            .chain(&self.inject_skips)
            .map(|(pid, s)| Skipped {
                pid: *pid,
                comm: s.comm.clone(),
                reason: s.reason.clone(),
            })
            .collect();
        for pid in &self.self_managed {
            skipped.push(Skipped {
                pid: *pid,
                comm: self.comms.get(pid).cloned().unwrap_or_default(),
                reason: "uses KSM itself (ksm_merge_any): its settings are left as they are".into(),
            });
        }
        skipped.sort_by_key(|s| s.pid);
        let savings = self.savings();
        let discovery = {
            let (counts, by_process) = self.target.discovery();
            DiscoveryStatus {
                maps_reads: counts.maps,
                smaps_reads: counts.smaps_total(),
                smaps_by_reason: (counts.smaps.iter())
                    .map(|(r, n)| (r.name().to_string(), *n))
                    .collect(),
                smaps_processes: (by_process.iter().take(MAX_LISTED))
                    .map(|p| SmapsProcess {
                        pid: p.pid,
                        comm: self.comms.get(&p.pid).cloned().unwrap_or_default(),
                        reads: p.reads,
                        last_reason: p.last.name().to_string(),
                    })
                    .collect(),
            }
        };
        Status {
            governor: self.config.governor.name().into(),
            levels,
            top_regions: top,
            held_regions: held,
            totals,
            ksm,
            daemon,
            skipped,
            hints: self.hints.status(),
            scrub: self.scrub.as_ref().map(|s| s.status()),
            numa: self.numa.as_ref().map(|n| n.status()),
            savings,
            discovery,
        }
    }

    /// What each eligible process saves, grouped by cgroup and bounded by
    /// `[savings]` (`core::pipeline::savings`). Merged pages and bytes saved are the
    /// kernel's (`/proc/PID/ksm_stat`), read only for processes with
    /// memory KSM may merge (promoted or foreign regions: nothing else of
    /// theirs can be merged); where it cannot be read, the regions' last
    /// accounting passes stand in, a page saved per page merged. COW
    /// breaks are the loop's own count per region.
    pub(super) fn savings(&self) -> Breakdown {
        #[derive(Default)]
        struct Regions {
            merged: u64,
            cow: u64,
            mergeable: bool,
        }
        let mut per_pid: BTreeMap<u32, Regions> = self
            .allowed
            .keys()
            .map(|&pid| (pid, Regions::default()))
            .collect();
        for (_, life, b) in with_books(&self.lives, &self.books) {
            let Some(b) = b else { continue };
            if let Some(r) = per_pid.get_mut(&b.span.proc.pid) {
                r.merged += life.merged_now();
                r.cow += life.cow_total();
                r.mergeable |= life.accounted();
            }
        }
        let processes: Vec<ProcessSavings> = per_pid
            .into_iter()
            .map(|(pid, r)| {
                let kernel = r.mergeable.then(|| self.target.ksm_stat(pid)).flatten();
                let merged = kernel.and_then(|k| k.merging_pages).map_or(r.merged, |m| {
                    m + kernel.and_then(|k| k.zero_pages).unwrap_or(0)
                });
                let saved = kernel
                    .and_then(|k| k.process_profit)
                    .unwrap_or((merged * PAGE) as i64);
                ProcessSavings {
                    pid,
                    comm: self.comms.get(&pid).cloned().unwrap_or_default(),
                    cgroup: self.cgroups.get(&pid).cloned().unwrap_or_default(),
                    savings: Savings {
                        merged_pages: merged,
                        saved_bytes: saved,
                        cow_breaks: r.cow,
                    },
                }
            })
            .collect();
        breakdown(&processes, self.config.savings.limits())
    }
}

/// Each tracked region's lifecycle with its book, if it has one, in id
/// order: one merge of two maps sorted by id, instead of a tree lookup in
/// one per region of the other.
fn with_books<'a>(
    lives: &'a Lifecycles,
    books: &'a BTreeMap<RegionId, Book>,
) -> impl Iterator<Item = (RegionId, &'a Lifecycle, Option<&'a Book>)> {
    let mut b = books.iter().peekable();
    lives.iter().map(move |(id, life)| {
        while b.next_if(|(k, _)| **k < id).is_some() {}
        (id, life, b.next_if(|(k, _)| **k == id).map(|(_, v)| v))
    })
}

/// The status's region totals, counted in one pass.
#[derive(Default)]
struct Tally {
    promoted_regions: u64,
    /// Pages of the promoted regions that have a book.
    promoted_pages: u64,
    merging_regions: u64,
    held_regions: u64,
    foreign_regions: u64,
    merged_pages: u64,
    cow_breaks: u64,
}

impl Tally {
    fn add(&mut self, life: &Lifecycle, book: Option<&Book>) {
        let promoted = life.mode() == Mode::Promoted;
        self.promoted_regions += u64::from(promoted);
        if promoted && let Some(b) = book {
            self.promoted_pages += u64::from(b.span.pages);
        }
        self.merging_regions += u64::from(promoted && !life.settled());
        self.held_regions += u64::from(life.held());
        self.foreign_regions += u64::from(life.mode() == Mode::Foreign);
        self.merged_pages += life.merged_now();
        self.cow_breaks += life.cow_total();
    }
}

/// The daemon's live threads' CPU seconds by name (the main thread as
/// `main`), empty if `/proc/self/task` cannot be read.
fn cpu_by_thread() -> BTreeMap<String, f64> {
    let me = std::process::id();
    let mut out = BTreeMap::new();
    for t in pagesift_linux::host::own_threads_cpu().unwrap_or_default() {
        let name = if t.tid == me {
            "main".to_string()
        } else {
            t.name
        };
        *out.entry(name).or_insert(0.0) += t.cpu_ns as f64 / 1e9;
    }
    out
}

/// The ids of the `most` largest keys of `keyed`, largest first (equal
/// keys: the lower id first), without sorting all of them.
fn largest(mut keyed: Vec<(u64, RegionId)>, most: usize) -> Vec<RegionId> {
    let order = |a: &(u64, RegionId), b: &(u64, RegionId)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
    if keyed.len() > most && most > 0 {
        keyed.select_nth_unstable_by(most - 1, order);
    }
    keyed.truncate(most);
    keyed.sort_by(order);
    keyed.into_iter().map(|(_, id)| id).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_picks_the_largest_keys_in_order_lower_ids_first_on_ties() {
        let r = RegionId;
        let keyed = vec![
            (5, r(1)),
            (9, r(2)),
            (5, r(0)),
            (1, r(3)),
            (9, r(4)),
            (7, r(5)),
        ];
        assert_eq!(largest(keyed.clone(), 3), vec![r(2), r(4), r(5)]);
        assert_eq!(largest(keyed.clone(), 4), vec![r(2), r(4), r(5), r(0)]);
        assert_eq!(largest(keyed.clone(), 10).len(), 6);
        assert_eq!(largest(keyed, 0), vec![]);
        assert_eq!(largest(vec![], 3), vec![]);
    }
}
