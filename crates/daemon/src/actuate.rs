//! Turning decisions into `madvise` calls inside the owner process.
//!
//! A stock kernel only merges `VM_MERGEABLE` ranges, and only the owner can
//! set that flag (`process_madvise` refuses MADV_MERGEABLE remotely), so
//! the calls run inside the target by ptrace syscall injection
//! (`pagesift_linux::inject`). [`Actuator`] is that capability as the
//! loop sees it: one *batch* of calls per process, run under one attach
//! (≈10 µs fixed + 13 µs per call, measured), with an outcome that
//! separates "done", "skipped and why" (traced, seccomp-filtered) and
//! "gone" (a process that exits is normal).
//!
//! [`Marks`] is the ledger of what pagesift itself marked. It is the only
//! thing pagesift ever unmarks: ranges a process made mergeable on its own
//! (VmFlags `mg`, `ksm_merge_any`) are never in it.

use std::collections::{BTreeMap, HashMap};

/// One `madvise` call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
pub struct Advice {
    /// Page-aligned start address.
    pub start: u64,
    /// Length in bytes (a multiple of the page size).
    pub len: u64,
    /// `MADV_MERGEABLE` when true, `MADV_UNMERGEABLE` when false.
    pub mergeable: bool,
}

impl Advice {
    /// End address (exclusive).
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// What happened to one batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// The calls ran, in order; per call, `Ok` or the errno it returned.
    /// Fewer results than calls: the injector abandoned the batch after
    /// them (a call could not start in time, e.g. the target froze), and
    /// the calls past them did not run.
    Done(Vec<Result<(), i32>>),
    /// Not attempted, and why (already traced, seccomp filter, …): the
    /// process is left alone and reported as skipped.
    Skipped(String),
    /// Not attempted because of the moment, not the process (a thread was
    /// stopped inside an rseq critical section, which a call of ours would
    /// have cut short without the abort rseq promises): tried again soon.
    Busy(String),
    /// The process exited.
    Gone,
    /// The attach or injection failed otherwise; the target was left as
    /// it was.
    Failed(String),
}

/// Runs batches of `madvise` calls inside target processes.
pub trait Actuator {
    /// Runs `batch` in process `pid` under one attach, in order.
    fn advise(&mut self, pid: u32, batch: &[Advice]) -> BatchOutcome;

    /// Runs `batch` in process `key`, only if it is still that process
    /// (same image) once stopped: an `execve` between the caller's check and
    /// the attach makes it [`BatchOutcome::Gone`] (the old image is gone).
    fn advise_as(&mut self, key: ProcKey, batch: &[Advice]) -> BatchOutcome {
        self.advise(key.pid, batch)
    }
}

/// Where marks are written down before they are made: a daemon killed
/// between a mark and the end of its wake-up (when the crash ledger is
/// saved) must still leave the mark recorded, or its successor could not
/// take it away (`crate::ledger`).
pub trait Journal {
    /// `ranges` of `key` are about to be marked `MADV_MERGEABLE`. An error
    /// says why they could not be written down; then they are not marked.
    fn intend(&mut self, key: ProcKey, ranges: &[(u64, u64)]) -> Result<(), String>;
}

/// A process as the ledger keys it: a pid with its start time, so a reused
/// pid is a different process, and the image it runs, so that a process
/// that calls execve is a different process too: the ranges recorded for
/// the old image are forgotten (never marked or unmarked in the new one,
/// which may be a setuid program) and the new image is judged afresh.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub struct ProcKey {
    /// pid.
    pub pid: u32,
    /// Start time (clock ticks after boot).
    pub start_time: u64,
    /// Identity of the program image (`pagesift_linux::discover::image_id`).
    pub image: u64,
}

/// The address ranges pagesift marked mergeable, per process. Ranges are
/// kept disjoint and coalesced.
#[derive(Clone, Debug, Default)]
pub struct Marks {
    procs: HashMap<ProcKey, BTreeMap<u64, u64>>,
}

impl Marks {
    /// An empty ledger.
    pub fn new() -> Marks {
        Marks::default()
    }

    /// Records that `[start, end)` of `p` was marked by pagesift.
    pub fn add(&mut self, p: ProcKey, start: u64, end: u64) {
        if start >= end {
            return;
        }
        let m = self.procs.entry(p).or_default();
        let (mut s, mut e) = (start, end);
        // Absorb every range that overlaps or touches [s, e).
        let touching: Vec<(u64, u64)> = m
            .range(..=e)
            .filter(|&(_, &re)| re >= s)
            .map(|(&rs, &re)| (rs, re))
            .collect();
        for (rs, re) in touching {
            m.remove(&rs);
            s = s.min(rs);
            e = e.max(re);
        }
        m.insert(s, e);
    }

    /// Forgets `[start, end)` of `p` (it was unmarked).
    pub fn remove(&mut self, p: ProcKey, start: u64, end: u64) {
        let Some(m) = self.procs.get_mut(&p) else {
            return;
        };
        let overlapping: Vec<(u64, u64)> = m
            .range(..end)
            .filter(|&(_, &re)| re > start)
            .map(|(&rs, &re)| (rs, re))
            .collect();
        for (rs, re) in overlapping {
            m.remove(&rs);
            if rs < start {
                m.insert(rs, start);
            }
            if re > end {
                m.insert(end, re);
            }
        }
        if m.is_empty() {
            self.procs.remove(&p);
        }
    }

    /// Whether pagesift marked all of `[start, end)` of `p`.
    pub fn covers(&self, p: ProcKey, start: u64, end: u64) -> bool {
        self.procs.get(&p).is_some_and(|m| {
            m.range(..=start)
                .next_back()
                .is_some_and(|(_, &re)| re >= end)
        })
    }

    /// Whether pagesift marked any part of `[start, end)` of `p`.
    pub fn overlaps(&self, p: ProcKey, start: u64, end: u64) -> bool {
        self.procs
            .get(&p)
            .is_some_and(|m| m.range(..end).any(|(_, &re)| re > start))
    }

    /// The ranges marked in `p`, in address order.
    pub fn ranges(&self, p: ProcKey) -> Vec<(u64, u64)> {
        self.procs
            .get(&p)
            .map(|m| m.iter().map(|(&s, &e)| (s, e)).collect())
            .unwrap_or_default()
    }

    /// The `MADV_UNMERGEABLE` calls that undo every mark of `p`.
    pub fn unmark_calls(&self, p: ProcKey) -> Vec<Advice> {
        self.ranges(p)
            .into_iter()
            .map(|(s, e)| Advice {
                start: s,
                len: e - s,
                mergeable: false,
            })
            .collect()
    }

    /// Processes with marks.
    pub fn processes(&self) -> Vec<ProcKey> {
        let mut v: Vec<ProcKey> = self.procs.keys().copied().collect();
        v.sort();
        v
    }

    /// Forgets a process (it exited: its marks went with it).
    pub fn forget(&mut self, p: ProcKey) {
        self.procs.remove(&p);
    }

    /// Bytes marked over all processes.
    pub fn bytes(&self) -> u64 {
        self.procs
            .values()
            .flat_map(|m| m.iter().map(|(s, e)| e - s))
            .sum()
    }
}

/// What [`unmark_all`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unmarked {
    /// Every range was unmarked (bytes); the process is out of the ledger.
    Done(u64),
    /// Some calls failed (errno per range start); those ranges stay in the
    /// ledger, the rest left it.
    Partly(Vec<(u64, i32)>),
    /// The process exited: forgotten.
    Gone,
    /// Not attempted or failed (traced, seccomp, …): everything stays in
    /// the ledger, to be tried again.
    NotNow(String),
}

/// Unmarks (`MADV_UNMERGEABLE`) every range `ledger` holds for `p`, in one
/// batch through `actuator` (the same injection that marked them), and
/// takes what was unmarked out of the ledger. Only ledger ranges are
/// touched, so nothing the process made mergeable itself is undone.
pub fn unmark_all<A: Actuator + ?Sized>(
    actuator: &mut A,
    ledger: &mut Marks,
    p: ProcKey,
) -> Unmarked {
    let calls = ledger.unmark_calls(p);
    if calls.is_empty() {
        return Unmarked::Done(0);
    }
    match actuator.advise_as(p, &calls) {
        BatchOutcome::Done(results) => {
            let cut = results.len() < calls.len();
            let mut failed = Vec::new();
            let mut bytes = 0;
            for (c, r) in calls.iter().zip(results) {
                match r {
                    Ok(()) => {
                        ledger.remove(p, c.start, c.end());
                        bytes += c.len;
                    }
                    Err(errno) => failed.push((c.start, errno)),
                }
            }
            if cut {
                // What did not run (and what failed) stays in the ledger,
                // for the next try.
                Unmarked::NotNow(
                    "the batch was abandoned part-way (a call could not start in time)".into(),
                )
            } else if !failed.is_empty() {
                Unmarked::Partly(failed)
            } else {
                Unmarked::Done(bytes)
            }
        }
        BatchOutcome::Gone => {
            ledger.forget(p);
            Unmarked::Gone
        }
        BatchOutcome::Skipped(r) | BatchOutcome::Busy(r) | BatchOutcome::Failed(r) => {
            Unmarked::NotNow(r)
        }
    }
}

/// Joins advice for adjacent ranges (same direction, end of one = start of
/// the next) into one call, so a promoted run of sub-regions costs one call
/// and one VMA split at most on each side. Input order is kept for the
/// rest.
pub fn coalesce(mut calls: Vec<Advice>) -> Vec<Advice> {
    calls.sort_by_key(|a| (!a.mergeable, a.start));
    let mut out: Vec<Advice> = Vec::with_capacity(calls.len());
    for a in calls {
        match out.last_mut() {
            Some(l) if l.mergeable == a.mergeable && l.end() == a.start => l.len += a.len,
            _ => out.push(a),
        }
    }
    out
}

/// The real actuator: ptrace syscall injection
/// ([`pagesift_linux::inject::Injector`]), one attach per batch. Processes
/// that are traced, seccomp-filtered, frozen, or whose every thread would
/// see EINTR come back [`BatchOutcome::Skipped`] with the injector's
/// reason; a process that exits is [`BatchOutcome::Gone`].
#[cfg(target_arch = "x86_64")]
pub struct InjectActuator {
    injector: pagesift_linux::inject::Injector,
}

#[cfg(target_arch = "x86_64")]
impl InjectActuator {
    /// An actuator whose injector refuses batches that could take a
    /// process past `max_map_fraction` of `vm.max_map_count`.
    pub fn new(max_map_fraction: f64) -> InjectActuator {
        InjectActuator {
            // The count after each batch is only the next budget check's
            // start, which the bound serves (InjectConfig::count_vmas_after).
            injector: pagesift_linux::inject::Injector::new(pagesift_linux::inject::InjectConfig {
                max_map_fraction,
                count_vmas_after: false,
                ..pagesift_linux::inject::InjectConfig::default()
            }),
        }
    }

    /// The injector's counters.
    pub fn stats(&self) -> pagesift_linux::inject::InjectStats {
        *self.injector.stats()
    }
}

#[cfg(target_arch = "x86_64")]
impl Actuator for InjectActuator {
    fn advise(&mut self, pid: u32, batch: &[Advice]) -> BatchOutcome {
        self.advise_checked(pid, None, batch)
    }

    fn advise_as(&mut self, key: ProcKey, batch: &[Advice]) -> BatchOutcome {
        self.advise_checked(key.pid, Some(key.image), batch)
    }
}

#[cfg(target_arch = "x86_64")]
impl InjectActuator {
    fn advise_checked(&mut self, pid: u32, image: Option<u64>, batch: &[Advice]) -> BatchOutcome {
        use pagesift_linux::inject::{Advice as Madv, Syscall};
        let calls: Vec<Syscall> = batch
            .iter()
            .map(|a| Syscall::Madvise {
                addr: a.start,
                len: a.len,
                advice: if a.mergeable {
                    Madv::Mergeable
                } else {
                    Madv::Unmergeable
                },
            })
            .collect();
        let outcome = match image {
            Some(image) => self.injector.run_as(pid, image, &calls),
            None => self.injector.run(pid, &calls),
        };
        batch_outcome(outcome)
    }
}

/// What an injection of a batch of `madvise` calls did, as the loop sees
/// it. A batch abandoned part-way is `Done` with the results of the calls
/// that ran: those marks and unmarks happened and must be recorded.
fn batch_outcome(
    outcome: Result<pagesift_linux::inject::Outcome, pagesift_linux::inject::InjectError>,
) -> BatchOutcome {
    use pagesift_linux::inject::{InjectError, Outcome, SkipReason};
    let results = |r: &[i64]| -> Vec<Result<(), i32>> {
        (r.iter())
            .map(|&r| if r >= 0 { Ok(()) } else { Err((-r) as i32) })
            .collect()
    };
    match outcome {
        Ok(Outcome::Skipped(SkipReason::ImageChanged)) => BatchOutcome::Gone,
        Ok(Outcome::Done(inj)) => BatchOutcome::Done(results(&inj.results)),
        Ok(Outcome::Skipped(SkipReason::SyscallTimeout { completed })) if !completed.is_empty() => {
            BatchOutcome::Done(results(&completed))
        }
        Ok(Outcome::Skipped(why @ SkipReason::RseqCriticalSection)) => {
            BatchOutcome::Busy(why.to_string())
        }
        Ok(Outcome::Skipped(why)) => BatchOutcome::Skipped(why.to_string()),
        Ok(Outcome::Gone(_)) => BatchOutcome::Gone,
        Err(InjectError::Linux(e)) if e.is_gone() => BatchOutcome::Gone,
        Err(e) => BatchOutcome::Failed(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const P: ProcKey = ProcKey {
        pid: 1,
        start_time: 5,
        image: 0,
    };

    #[test]
    fn ledger_coalesces_and_splits() {
        let mut m = Marks::new();
        m.add(P, 0x1000, 0x3000);
        m.add(P, 0x3000, 0x5000);
        assert_eq!(m.ranges(P), vec![(0x1000, 0x5000)]);
        assert!(m.covers(P, 0x2000, 0x4000));
        m.remove(P, 0x2000, 0x3000);
        assert_eq!(m.ranges(P), vec![(0x1000, 0x2000), (0x3000, 0x5000)]);
        assert!(!m.covers(P, 0x1000, 0x4000));
        assert!(m.overlaps(P, 0x1800, 0x2800));
        assert!(!m.overlaps(P, 0x2000, 0x3000));
        let other = ProcKey {
            pid: 1,
            start_time: 6,
            image: 0,
        };
        assert!(
            !m.overlaps(other, 0x1000, 0x5000),
            "a reused pid is another process"
        );
        let execd = ProcKey { image: 9, ..P };
        assert!(
            !m.overlaps(execd, 0x1000, 0x5000),
            "an exec'd image is another process"
        );
        m.forget(P);
        assert_eq!(m.bytes(), 0);
    }

    /// Records calls; answers with a scripted outcome.
    struct Scripted {
        calls: Vec<(u32, Vec<Advice>)>,
        answer: fn(&[Advice]) -> BatchOutcome,
    }

    impl Actuator for Scripted {
        fn advise(&mut self, pid: u32, batch: &[Advice]) -> BatchOutcome {
            self.calls.push((pid, batch.to_vec()));
            (self.answer)(batch)
        }
    }

    #[test]
    fn unmark_all_unmarks_exactly_the_ledger_and_keeps_what_failed() {
        let mut m = Marks::new();
        m.add(P, 0x1000, 0x3000);
        m.add(P, 0x8000, 0x9000);
        let other = ProcKey {
            pid: 2,
            start_time: 5,
            image: 0,
        };
        m.add(other, 0x1000, 0x2000);
        let mut a = Scripted {
            calls: Vec::new(),
            answer: |b| BatchOutcome::Done(b.iter().map(|_| Ok(())).collect()),
        };
        assert_eq!(unmark_all(&mut a, &mut m, P), Unmarked::Done(0x3000));
        assert_eq!(a.calls.len(), 1);
        assert_eq!(a.calls[0].0, 1);
        assert!(a.calls[0].1.iter().all(|c| !c.mergeable));
        assert_eq!(
            a.calls[0]
                .1
                .iter()
                .map(|c| (c.start, c.end()))
                .collect::<Vec<_>>(),
            vec![(0x1000, 0x3000), (0x8000, 0x9000)]
        );
        assert!(m.ranges(P).is_empty());
        assert_eq!(m.ranges(other), vec![(0x1000, 0x2000)], "others untouched");
        // Nothing in the ledger: no injection at all.
        assert_eq!(unmark_all(&mut a, &mut m, P), Unmarked::Done(0));
        assert_eq!(a.calls.len(), 1);
        // A failed call keeps its range; a skipped batch keeps everything.
        m.add(P, 0x1000, 0x2000);
        m.add(P, 0x4000, 0x5000);
        let mut a = Scripted {
            calls: Vec::new(),
            answer: |b| BatchOutcome::Done(vec![Ok(()), Err(12)][..b.len()].to_vec()),
        };
        assert_eq!(
            unmark_all(&mut a, &mut m, P),
            Unmarked::Partly(vec![(0x4000, 12)])
        );
        assert_eq!(m.ranges(P), vec![(0x4000, 0x5000)]);
        let mut a = Scripted {
            calls: Vec::new(),
            answer: |_| BatchOutcome::Skipped("traced".into()),
        };
        assert!(matches!(unmark_all(&mut a, &mut m, P), Unmarked::NotNow(_)));
        assert_eq!(m.ranges(P), vec![(0x4000, 0x5000)]);
        // A batch abandoned after its first call: that range is out of the
        // ledger, the one whose call did not run stays for the next try.
        m.add(P, 0x8000, 0x9000);
        let mut a = Scripted {
            calls: Vec::new(),
            answer: |_| BatchOutcome::Done(vec![Ok(())]),
        };
        assert!(matches!(unmark_all(&mut a, &mut m, P), Unmarked::NotNow(_)));
        assert_eq!(m.ranges(P), vec![(0x8000, 0x9000)]);
        let mut a = Scripted {
            calls: Vec::new(),
            answer: |_| BatchOutcome::Gone,
        };
        assert_eq!(unmark_all(&mut a, &mut m, P), Unmarked::Gone);
        assert!(m.ranges(P).is_empty());
    }

    #[test]
    fn a_batch_abandoned_part_way_reports_the_calls_that_ran() {
        use pagesift_linux::inject::{Outcome, SkipReason};
        let cut = |completed: Vec<i64>| {
            batch_outcome(Ok(Outcome::Skipped(SkipReason::SyscallTimeout {
                completed,
            })))
        };
        assert_eq!(cut(vec![0, -12]), BatchOutcome::Done(vec![Ok(()), Err(12)]));
        assert!(matches!(cut(vec![]), BatchOutcome::Skipped(_)));
    }

    #[test]
    fn coalesce_joins_adjacent_same_direction() {
        let a = |start, len, mergeable| Advice {
            start,
            len,
            mergeable,
        };
        let out = coalesce(vec![
            a(0x3000, 0x1000, true),
            a(0x1000, 0x2000, true),
            a(0x4000, 0x1000, false),
            a(0x9000, 0x1000, true),
        ]);
        assert_eq!(
            out,
            vec![
                a(0x1000, 0x3000, true),
                a(0x9000, 0x1000, true),
                a(0x4000, 0x1000, false)
            ]
        );
    }

    proptest! {
        /// The ledger agrees with a page-set model under any sequence of
        /// adds and removes.
        #[test]
        fn ledger_matches_a_page_set(ops in proptest::collection::vec((any::<bool>(), 0u64..64, 1u64..16), 0..40)) {
            let mut m = Marks::new();
            let mut model = std::collections::BTreeSet::new();
            for (add, s, n) in ops {
                let (start, end) = (s * 4096, (s + n) * 4096);
                if add {
                    m.add(P, start, end);
                    model.extend(s..s + n);
                } else {
                    m.remove(P, start, end);
                    for p in s..s + n { model.remove(&p); }
                }
            }
            for p in 0..80u64 {
                prop_assert_eq!(m.covers(P, p * 4096, (p + 1) * 4096), model.contains(&p));
            }
            let ranges = m.ranges(P);
            for w in ranges.windows(2) {
                prop_assert!(w[0].1 < w[1].0, "disjoint and not touching: {:?}", ranges);
            }
            prop_assert_eq!(m.bytes(), model.len() as u64 * 4096);
        }
    }
}
