//! Which pages of which processes pagesift itself has read.
//!
//! Every remote read marks the page it reads used, as a use by the
//! process would (see [`crate::access_marks`]): the first read sets
//! `PG_referenced`, a second moves an inactive page to the active list.
//! Anonymous pages are otherwise only activated by reclaim, when it finds
//! their accessed bit set, so on a host without memory pressure most of
//! the activity a `/proc/kpageflags` reader sees on the pages pagesift
//! samples is pagesift's own. Whoever reads the active bit as evidence of
//! the process's use (nuKSM's fair placement does) must set aside the
//! pages pagesift read: this record says which.
//!
//! ## How
//! Off until [`enable`] (only NUMA placement asks), so that hosts that
//! never consult it pay one relaxed atomic load per read call. Once on,
//! [`crate::RemoteReader`] notes every range it is about to read, on both
//! paths, before the syscall (a read that then fails is still noted: the
//! record may claim too much, never too little).
//!
//! ## Invariants
//! - Per process, the pages read are kept as coalesced ranges
//!   ([`RangeSet`]). Over all processes at most [`RANGE_LIMIT`] ranges are
//!   kept: a process whose note would pass it is marked *read whole*, and
//!   from then on every page of it counts as read. The record can only
//!   grow towards "read", never forget a read of a live process.
//! - A process is forgotten only when its owner says it is gone
//!   ([`retain`]); a pid reused before then inherits the old marks, which
//!   again errs towards "read".
//! - The state is process-wide (one `Mutex`), because every reader of the
//!   daemon, whichever thread or module owns it, touches the same targets.

use pagesift_core::ranges::RangeSet;
use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

/// Most ranges kept over all processes (a `BTreeMap` entry each, about
/// 40 bytes: 10 MiB at most).
pub const RANGE_LIMIT: usize = 256 * 1024;

/// What is known of one process.
#[derive(Default)]
struct Reads {
    /// Page ranges read, when `whole` is false.
    ranges: RangeSet,
    /// Every page counts as read (its ranges passed the limit).
    whole: bool,
}

#[derive(Default)]
struct Record {
    by_pid: HashMap<u32, Reads>,
    /// Ranges held over all processes.
    ranges: usize,
}

static ON: AtomicBool = AtomicBool::new(false);
static RECORD: Mutex<Option<Record>> = Mutex::new(None);

fn with<T>(f: impl FnOnce(&mut Record) -> T) -> T {
    // A panic elsewhere while the lock was held leaves a record that is
    // still a valid over-approximation: keep using it.
    let mut g = RECORD.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(Record::default))
}

/// Starts recording (idempotent). Reads made before are not known.
pub fn enable() {
    ON.store(true, Ordering::Relaxed);
}

/// Whether reads are being recorded.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Notes that `[start, end)` of `pid` is about to be read.
pub fn note(pid: u32, start: u64, end: u64) {
    note_all(pid, [(start, end)]);
}

/// Notes that each `[start, end)` of `ranges` of `pid` is about to be read
/// (one call's iovecs: the lock is taken once).
pub fn note_all(pid: u32, ranges: impl IntoIterator<Item = (u64, u64)>) {
    if !enabled() {
        return;
    }
    with(|r| {
        let reads = r.by_pid.entry(pid).or_default();
        for (start, end) in ranges {
            if reads.whole {
                return;
            }
            let before = reads.ranges.len();
            reads.ranges.insert(start, end);
            // Inserting can merge ranges as well as add one.
            r.ranges = r.ranges + reads.ranges.len() - before;
            if r.ranges > RANGE_LIMIT {
                reads.whole = true;
                r.ranges -= reads.ranges.len();
                reads.ranges.clear();
            }
        }
    });
}

/// Whether pagesift may have read the page at `addr` of `pid` since
/// recording began (or since `pid` was last forgotten).
pub fn was_read(pid: u32, addr: u64) -> bool {
    if !enabled() {
        return false;
    }
    let page = crate::PAGE_SIZE;
    let start = addr - addr % page;
    with(|r| {
        r.by_pid
            .get(&pid)
            .is_some_and(|x| x.whole || x.ranges.overlaps(start, start + page))
    })
}

/// Forgets every process for which `keep` is false (they are gone).
pub fn retain(keep: impl Fn(u32) -> bool) {
    if !enabled() {
        return;
    }
    with(|r| {
        r.by_pid.retain(|&pid, _| keep(pid));
        r.ranges = r.by_pid.values().map(|x| x.ranges.len()).sum();
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    // The record is process-wide: each test uses its own pids.

    #[test]
    fn reads_are_known_by_page_and_only_for_their_process() {
        enable();
        note(900_001, 0x10_000, 0x13_000);
        assert!(was_read(900_001, 0x10_000));
        assert!(was_read(900_001, 0x12_fff), "any address of a read page");
        assert!(!was_read(900_001, 0x13_000));
        assert!(!was_read(900_001, 0xf_000));
        assert!(!was_read(900_002, 0x10_000), "another process");
        retain(|pid| pid != 900_001);
        assert!(!was_read(900_001, 0x10_000), "forgotten");
    }

    #[test]
    fn a_process_past_the_limit_counts_as_read_whole() {
        enable();
        let pid = 900_101;
        // Every other page: each note is a range of its own.
        let page = crate::PAGE_SIZE;
        for i in 0..(RANGE_LIMIT as u64 + 1) {
            note(pid, 2 * i * page, (2 * i + 1) * page);
        }
        assert!(was_read(pid, page), "a page never read counts as read");
        assert!(was_read(pid, 1 << 40));
        let held = with(|r| r.ranges);
        assert!(held <= RANGE_LIMIT, "{held} ranges held");
        retain(|p| p != pid);
    }
}
