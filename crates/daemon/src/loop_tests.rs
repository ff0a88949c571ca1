//! The loop on a simulated machine: what gets marked, what never does,
//! demotion, pacing, skips and shutdown.

use crate::config::Config;
use crate::daemon::{Daemon, Mode, WakeSummary};
use crate::eligibility::Policy;
use crate::sim::*;
use pagesift_core::source::PageState;
use pagesift_core::{Nanos, PageRef, RegionId};

const WAKE: Nanos = 100_000_000;
const SEC: Nanos = 1_000_000_000;

type D = Daemon<SimTarget, SimActuator, SimKsm>;

fn daemon(w: &Shared, toml: &str, pids: &[u32]) -> D {
    let config = Config::from_toml(toml, "test").unwrap();
    let policy = Policy::new(&config, pids, 1, Some("/usr/sbin/pagesift".into()));
    Daemon::new(
        config,
        None,
        policy,
        SimTarget(w.clone()),
        SimActuator(w.clone()),
        SimKsm(w.clone()),
        0,
    )
}

fn run(d: &mut D, now: &mut Nanos, wakes: usize) -> Vec<WakeSummary> {
    (0..wakes)
        .map(|_| {
            *now += WAKE;
            d.wake(*now)
        })
        .collect()
}

const ALL: &str = "[eligible]\nall = true\n";
/// [`ALL`] with settled regions trimmed of their unmerged megabytes.
const TRIM: &str = "[actuate]\ntrim_min_pages = 256\n[eligible]\nall = true\n";

/// Two processes: pid 10 maps 1024 identical pages, pid 11 1024 distinct
/// ones; their regions.
fn dup_and_rand(w: &Shared) -> (RegionId, RegionId) {
    let mut m = w.borrow_mut();
    m.spawn(10, "dup", false);
    m.spawn(11, "rand", false);
    (
        m.map(10, &[7; 1024], false),
        m.map(11, &distinct(1000, 1024), false),
    )
}

#[test]
fn the_identical_region_is_promoted_and_merged_the_random_one_never_marked() {
    let w = world();
    let (dup, rand) = dup_and_rand(&w);
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let s = run(&mut d, &mut now, 300);
    let m = w.borrow();
    assert!(
        m.spans[&dup].mergeable,
        "the identical region was not marked"
    );
    assert!(!m.spans[&rand].mergeable, "the random region was marked");
    assert!(
        m.batches.iter().all(|(pid, _)| *pid == 10),
        "{:?}",
        m.batches
    );
    assert_eq!(m.count(dup, PageState::Merged), 1024);
    assert_eq!(d.mode(dup), Some(Mode::Promoted));
    assert_eq!(d.mode(rand), Some(Mode::Sampling));
    assert!(s.iter().any(|s| s.promoted == vec![dup]));
    // ksmd got the top share while merging, then a trickle.
    assert!(m.shares.contains(&0.95), "{:?}", &m.shares[..10]);
    assert_eq!(*m.shares.last().unwrap(), 0.001);
    drop(m);
    let st = d.status(now);
    assert_eq!(st.top_regions[0].id, dup.0);
    assert_eq!(st.top_regions[0].merged_pages, 1024);
    assert_eq!(st.top_regions[0].state, "promoted");
    assert_eq!(st.totals.merged_pages, 1024);
    assert_eq!(st.totals.promoted_regions, 1);
    assert_eq!(st.totals.marks, 1);
    assert_eq!(st.totals.unmarks, 0);
    assert_eq!(st.totals.cow_breaks, 0);
    assert_eq!(st.totals.promoted_pages, 1024);
    assert_eq!(st.totals.regions, 2);
    // Settled: it is back on the ladder, at the bottom.
    assert!(d.distiller().ladder().level_of(dup).is_some());
}

/// The status lists each region on the level the ladder has it on, with
/// the level's count, while one region has climbed and the other has not.
#[test]
fn the_status_lists_each_region_on_its_ladder_level() {
    let w = world();
    let (dup, rand) = dup_and_rand(&w);
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let level = |d: &Daemon<_, _, _>, id| d.distiller().ladder().level_of(id);
    for _ in 0..300 {
        if level(&d, dup).is_some_and(|l| l > 0) {
            break;
        }
        run(&mut d, &mut now, 1);
    }
    assert!(level(&d, dup).is_some_and(|l| l > 0), "never climbed");
    let st = d.status(now);
    for id in [dup, rand] {
        let on: Vec<usize> = (st.levels.iter())
            .filter(|l| l.regions.iter().any(|r| r.id == id.0))
            .map(|l| l.level)
            .collect();
        assert_eq!(on, vec![level(&d, id).unwrap()], "{id:?}");
    }
    for l in &st.levels {
        assert_eq!(l.region_count, l.regions.len() as u64, "level {}", l.level);
    }
    assert_eq!(st.totals.regions, 2);
}

#[test]
fn a_merged_region_with_new_duplicates_climbs_back_and_is_merged_again() {
    let w = world();
    // Half identical, half distinct; ksmd idles at the trickle.
    let region = {
        let mut m = w.borrow_mut();
        m.idle_at_trickle = true;
        m.spawn(12, "guest", false);
        let mut contents = vec![7; 512];
        contents.extend(distinct(5000, 512));
        m.map(12, &contents, false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(region), Some(Mode::Promoted));
    assert_eq!(w.borrow().count(region, PageState::Merged), 512);
    assert_eq!(*w.borrow().shares.last().unwrap(), 0.001, "not settled");
    // The distinct half is filled with the common content: 512 new
    // duplicates the trickle does not merge.
    {
        let mut m = w.borrow_mut();
        for page in 512..1024 {
            m.mem.write(PageRef { region, page }, 7).unwrap();
        }
    }
    let s = run(&mut d, &mut now, 300);
    assert!(
        s.iter().any(|s| s.remerging == vec![region]),
        "never merged again"
    );
    assert_eq!(w.borrow().count(region, PageState::Merged), 1024);
    let st = d.status(now);
    assert!(st.totals.remerges >= 1);
    assert_eq!(st.totals.unmarks, 0);
    // Settled again, and ksmd back at the trickle.
    assert_eq!(*w.borrow().shares.last().unwrap(), 0.001);
}

/// A promoted region whose second half ksmd left unmerged (distinct
/// content) has that half unmarked once it settles ("Trimming a settled
/// region" in `core::pipeline::lifecycle`), so that ksmd's later full
/// scans skip it. The half left marked stays merged and settled: it asks
/// ksmd for nothing. The trimmed half is sampled again, never marked
/// while it stays distinct, and marked again once duplicates fill it.
/// A process 13 ("guest") with one region: 1024 pages of one content, then
/// 1024 distinct pages.
fn half_duplicated_guest(w: &Shared) -> RegionId {
    let mut m = w.borrow_mut();
    m.spawn(13, "guest", false);
    let mut contents = vec![7; 1024];
    contents.extend(distinct(9000, 1024));
    m.map(13, &contents, false)
}

/// A region ksmd is merging is read by accounting about once per ksmd
/// full scan, not every second, when ksmd's scans take seconds: its pages
/// change only when ksmd comes round (`core::pipeline::scan_clock`).
#[test]
fn a_merging_region_is_read_again_once_ksmd_came_round() {
    let w = world();
    // A full scan every fifth pace call (about 5 s) while merging, every
    // call at the trickle.
    w.borrow_mut().merge_every = 5;
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    // ksmd's scans before the guest comes: the daemon learns where ksmd
    // is (a position needs two ends of a scan seen).
    run(&mut d, &mut now, 30);
    let region = half_duplicated_guest(&w);
    let mut wakes = 0;
    while d.mode(region) != Some(Mode::Promoted) {
        run(&mut d, &mut now, 1);
        wakes += 1;
        assert!(wakes < 600, "never promoted");
    }
    // From the mark to ksmd's second full scan after it: still merging
    // (a region settles with a pass begun after its third).
    let (scans0, read0, t0) = {
        let m = w.borrow();
        let read = m.states_read.get(&region).copied().unwrap_or(0);
        (m.full_scans, read, now)
    };
    while w.borrow().full_scans < scans0 + 2 {
        run(&mut d, &mut now, 1);
        assert!(now - t0 < 60 * SEC, "ksmd never came round");
    }
    assert_eq!(
        d.status(now).totals.merging_regions,
        1,
        "still merging: else the test looked too late"
    );
    let m = w.borrow();
    let read = m.states_read[&region] - read0;
    // By the clock alone it was a pass a second: at least eight here.
    assert!(
        now - t0 >= 8 * SEC,
        "ksmd's scans took {} ms",
        (now - t0) / 1_000_000
    );
    // One pass at the mark, then one per scan, and one in progress.
    assert!(read <= 4 * 2048, "{read} pages read over two full scans");
    assert!(read >= 2048, "passed over at least once: {read}");
}

#[test]
fn a_settled_region_is_trimmed_of_what_ksmd_left_unmerged() {
    let w = world();
    let region = half_duplicated_guest(&w);
    let mut d = daemon(&w, TRIM, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    let rest = {
        let m = w.borrow();
        // The region keeps its first half, marked and merged.
        assert_eq!(m.spans[&region].pages, 1024, "not trimmed");
        assert!(m.spans[&region].mergeable);
        assert_eq!(m.count(region, PageState::Merged), 1024);
        // The second half is a region of its own, unmarked, its content
        // untouched.
        let (&rest, span) = (m.spans.iter())
            .find(|(id, s)| s.proc.pid == 13 && **id != region)
            .expect("the trim split the region");
        assert_eq!(span.pages, 1024);
        assert!(!span.mergeable);
        for page in 0..1024 {
            let p = PageRef { region: rest, page };
            assert_eq!(m.mem.content(p), Ok(9000 + u64::from(page)));
        }
        assert_eq!(*m.shares.last().unwrap(), 0.001, "ksmd left at the trickle");
        rest
    };
    assert_eq!(d.mode(region), Some(Mode::Promoted));
    assert_eq!(d.mode(rest), Some(Mode::Sampling), "sampled, not held");
    let st = d.status(now);
    assert_eq!((st.totals.trims, st.totals.trimmed_pages), (1, 1024));
    assert_eq!((st.totals.marks, st.totals.unmarks), (1, 1));
    assert_eq!((st.totals.merging_regions, st.totals.held_regions), (0, 0));
    // Duplicates fill the trimmed half: it is marked again, and merged.
    {
        let mut m = w.borrow_mut();
        for page in 0..1024 {
            m.mem.write(PageRef { region: rest, page }, 7).unwrap();
        }
    }
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(rest), Some(Mode::Promoted));
    assert_eq!(w.borrow().count(rest, PageState::Merged), 1024);
    assert_eq!(w.borrow().count(region, PageState::Merged), 1024);
}

/// A region its own process made mergeable (QEMU's mem-merge) is hidden
/// from the ladder while ksmd merges it, and when it climbs back to the
/// top with new duplicates it is merged again, as a promoted region is.
/// Before, it stayed on the top level, where pagesift has nothing to mark,
/// and the top level's share sampled it round after round.
#[test]
fn a_foreign_region_that_climbs_to_the_top_is_merged_again_not_sampled_there() {
    let w = world();
    let region = {
        let mut m = w.borrow_mut();
        m.idle_at_trickle = true;
        m.spawn(25, "qemu", false);
        let mut contents = vec![7; 512];
        contents.extend(distinct(5000, 512));
        m.map(25, &contents, true)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(region), Some(Mode::Foreign));
    assert_eq!(w.borrow().count(region, PageState::Merged), 512);
    assert_eq!(*w.borrow().shares.last().unwrap(), 0.001, "not settled");
    {
        let mut m = w.borrow_mut();
        for page in 512..1024 {
            m.mem.write(PageRef { region, page }, 7).unwrap();
        }
    }
    let top = d.distiller().ladder().levels() - 1;
    let (mut at_top, mut remerged) = (0, false);
    for _ in 0..300 {
        now += WAKE;
        remerged |= d.wake(now).remerging == vec![region];
        at_top += usize::from(d.distiller().ladder().level_of(region) == Some(top));
    }
    assert!(remerged, "never merged again");
    assert_eq!(w.borrow().count(region, PageState::Merged), 1024);
    assert!(at_top <= 2, "left on the top level for {at_top} wakes");
    assert_eq!(d.mode(region), Some(Mode::Foreign));
    assert!(
        w.borrow().batches.is_empty(),
        "a foreign region was advised"
    );
}

#[test]
fn what_a_process_marked_itself_is_accounted_but_never_touched() {
    let w = world();
    let (own, any, ours) = {
        let mut m = w.borrow_mut();
        m.spawn(20, "selfmarked", false);
        m.spawn(21, "mergeany", true);
        m.spawn(22, "plain", false);
        (
            m.map(20, &[5; 512], true),
            m.map(21, &[6; 512], true),
            m.map(22, &[8; 512], false),
        )
    };
    let mut d = daemon(
        &w,
        "[actuate]\nrecheck_s = 1\n[eligible]\nall = true\n",
        &[],
    );
    let mut now = 0;
    run(&mut d, &mut now, 200);
    // Thrash the foreign regions: pagesift must still not unmark them.
    for _ in 0..30 {
        {
            let mut m = w.borrow_mut();
            for (id, c) in [(own, 5), (any, 6)] {
                for page in 0..512 {
                    m.mem.write(PageRef { region: id, page }, c).unwrap();
                }
            }
        }
        run(&mut d, &mut now, 1);
    }
    let m = w.borrow();
    assert!(
        m.batches.iter().all(|(pid, _)| *pid == 22),
        "a self-managed process was advised: {:?}",
        m.batches
    );
    assert!(m.spans[&own].mergeable && m.spans[&any].mergeable);
    assert!(m.spans[&ours].mergeable);
    drop(m);
    assert_eq!(d.mode(own), Some(Mode::Foreign));
    assert_eq!(d.mode(any), Some(Mode::Foreign));
    let st = d.status(now);
    assert_eq!(st.totals.foreign_regions, 2);
    assert!(
        st.totals.cow_breaks > 0,
        "COW breaks in foreign regions are counted"
    );
    assert!(
        st.skipped
            .iter()
            .any(|s| s.pid == 21 && s.reason.contains("ksm_merge_any")),
        "{:?}",
        st.skipped
    );
    assert!(!d.marks().overlaps(
        crate::actuate::ProcKey {
            pid: 20,
            start_time: 120,
            image: 0,
        },
        0,
        u64::MAX
    ));
}

#[test]
fn a_thrashing_promoted_region_is_unmarked_and_held_out_of_the_ladder() {
    let w = world();
    let dup = {
        let mut m = w.borrow_mut();
        m.spawn(30, "thrash", false);
        m.map(30, &[9; 1024], false)
    };
    let (mut d, mut now) = promoted_then_demoted(&w, dup);
    assert!(matches!(d.mode(dup), Some(Mode::Held { .. })));
    {
        let m = w.borrow();
        assert!(!m.spans[&dup].mergeable);
        let (_, last) = m.batches.last().unwrap();
        assert!(last.iter().all(|a| !a.mergeable));
    }
    assert_eq!(d.marks().bytes(), 0);
    // Held: not promoted again within the hold (60 s), though its pages
    // are still identical.
    let before = w.borrow().batches.len();
    run(&mut d, &mut now, 300);
    assert_eq!(
        w.borrow().batches.len(),
        before,
        "re-promoted during the hold"
    );
    let st = d.status(now);
    assert_eq!(st.totals.held_regions, 1);
    assert_eq!(st.totals.unmarks, 1);
    assert!(st.totals.cow_breaks >= 1024);
}

/// A daemon over `w` (regions passed over every second once settled)
/// that promotes `dup` (1024 pages of content 9) and merges it, then,
/// with its pages rewritten, demotes it ([`thrash_until_demoted`]).
/// Returns the daemon and the time of the demotion.
fn promoted_then_demoted(w: &Shared, dup: RegionId) -> (D, Nanos) {
    let mut d = daemon(w, "[actuate]\nrecheck_s = 1\n[eligible]\nall = true\n", &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(dup), Some(Mode::Promoted));
    assert_eq!(w.borrow().count(dup, PageState::Merged), 1024);
    assert!(
        thrash_until_demoted(w, &mut d, &mut now, dup),
        "never demoted"
    );
    (d, now)
}

/// Rewrites half of `dup`'s pages (content 9, unchanged) at a time, the
/// halves taking turns about once an accounting pass: every merge is
/// broken, merged again by ksmd and broken again, pass after pass (one
/// pass of breaks alone is a burst, not thrashing: THRASHING_PASSES),
/// until the daemon demotes it, or 50 turns. Whether it was demoted.
fn thrash_until_demoted(w: &Shared, d: &mut D, now: &mut Nanos, dup: RegionId) -> bool {
    for i in 0..50u32 {
        {
            let mut m = w.borrow_mut();
            for page in (0..1024).filter(|p| p % 2 == i % 2) {
                m.mem.write(PageRef { region: dup, page }, 9).unwrap();
            }
        }
        if run(d, now, 10).iter().any(|s| s.demoted == vec![dup]) {
            return true;
        }
    }
    false
}

/// A region of 1024 pages of one content, promoted, then rewritten until
/// it is demoted for thrashing, and a neighbour of `next_pages` distinct
/// pages right after it; then the kernel joins the two VMAs (same flags
/// once the region is unmarked), so that they come back as one region
/// under a new id. Returns the daemon, the world, the joined region and
/// when the demotion was.
fn demoted_then_joined(next_pages: usize) -> (Shared, D, RegionId, Nanos, Nanos) {
    let w = world();
    let (dup, next, start) = {
        let mut m = w.borrow_mut();
        m.spawn(33, "thrash", false);
        let dup = m.map(33, &[9; 1024], false);
        let start = m.spans[&dup].start;
        let next = m.map_at(
            33,
            start + 1024 * 4096,
            &distinct(500_000, next_pages),
            false,
        );
        (dup, next, start)
    };
    let (d, now) = promoted_then_demoted(&w, dup);
    let demoted_at = now;
    let joined = {
        let mut m = w.borrow_mut();
        m.unmap(dup);
        m.unmap(next);
        let mut contents = vec![9; 1024];
        contents.extend(distinct(500_000, next_pages));
        m.map_at(33, start, &contents, false)
    };
    (w, d, joined, now, demoted_at)
}

/// The joined region lies mostly over the held one, so it is held as
/// that one was: not sampled, not marked, not broken again before the
/// hold ends (`Lifecycles::inherit_hold`); then it is marked again.
#[test]
fn a_held_region_joined_with_its_neighbour_stays_held() {
    let (w, mut d, joined, mut now, demoted_at) = demoted_then_joined(256);
    let before = w.borrow().batches.len();
    run(&mut d, &mut now, 300);
    assert!(
        matches!(d.mode(joined), Some(Mode::Held { .. })),
        "{:?}",
        d.mode(joined)
    );
    assert_eq!(
        w.borrow().batches.len(),
        before,
        "the joined region was marked during the hold"
    );
    // The hold (60 s from the demotion) ends, and it is marked again.
    while now < demoted_at + 60 * SEC {
        run(&mut d, &mut now, 10);
    }
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(joined), Some(Mode::Promoted));
    assert!(w.borrow().count(joined, PageState::Merged) >= 1024);
}

/// Joined with a larger neighbour, the region is mostly pages that were
/// never held, and it is sampled like any other (`HeldSpans`); but until
/// the hold ends, nothing marks the held pages in it: whatever is marked
/// of it is marked around them.
#[test]
fn held_pages_inside_a_larger_joined_region_are_marked_around() {
    let (w, mut d, joined, mut now, demoted_at) = demoted_then_joined(2048);
    let marked_held = |w: &Shared| {
        (0..1024)
            .filter(|&p| w.borrow().page_mergeable(joined, p))
            .count()
    };
    while now < demoted_at + 55 * SEC {
        run(&mut d, &mut now, 10);
        assert_eq!(marked_held(&w), 0, "held pages marked at {} s", now / SEC);
    }
    assert_eq!(
        d.mode(joined).map(|m| matches!(m, Mode::Held { .. })),
        Some(false)
    );
}

/// Under the defaults (a settled region passed over every 30 s), a region
/// whose merged pages are all rewritten a few seconds after each merge
/// climbs back to the top and merges again before any settled pass. It
/// is demoted all the same, within a few rounds, and the COW faults it
/// costs its process stop: the breaks of each round are counted by a
/// pass at the remerge, before ksmd (here at once) merges them again.
#[test]
fn a_region_broken_after_every_merge_is_demoted_across_rounds() {
    let w = world();
    let dup = {
        let mut m = w.borrow_mut();
        m.spawn(32, "thrash", false);
        // A real ksmd at the trickle takes minutes to get round: the
        // rewritten pages wait for the daemon to merge them again.
        m.idle_at_trickle = true;
        m.map(32, &[9; 1024], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(dup), Some(Mode::Promoted));
    assert_eq!(w.borrow().count(dup, PageState::Merged), 1024);
    let (mut rounds, mut remerges, mut demoted) = (0, 0, false);
    'rounds: for _ in 0..20 {
        // Merged: every page rewritten (same content), then 5 s.
        if w.borrow().count(dup, PageState::Merged) == 1024 {
            rounds += 1;
            let mut m = w.borrow_mut();
            for page in 0..1024 {
                m.mem.write(PageRef { region: dup, page }, 9).unwrap();
            }
        }
        for s in run(&mut d, &mut now, 50) {
            remerges += s.remerging.len();
            if s.demoted == vec![dup] {
                demoted = true;
                break 'rounds;
            }
        }
    }
    assert!(remerges >= 2, "merged again {remerges} times");
    assert!(
        demoted,
        "never demoted in {rounds} rounds of merges and breaks"
    );
    assert!(rounds <= 3, "demoted after {rounds} rounds");
    assert!(matches!(d.mode(dup), Some(Mode::Held { .. })));
    assert!(!w.borrow().spans[&dup].mergeable);
    assert!(d.status(now).totals.cow_breaks >= 2048);
}

/// A settled region whose merged pages are rewritten every 10 s, with
/// content ksmd merges again within 2 s at its trickle: the settled passes
/// (every 30 s) find it merged every time and never see a break. The
/// kernel's `cow_ksm` counts them, and the passes it brings forward see
/// them before ksmd comes round: demoted within a minute or so. Without
/// the kernel's figure (`cow_ksm` unknown) the same region is, in most
/// runs, still merged, and broken, after 14 rounds. (A ksmd that comes
/// round within a second, before the next look at `cow_ksm`, beats both.)
#[test]
fn breaks_merged_again_between_settled_passes_are_seen_through_cow_ksm() {
    let rounds_until_demoted = |kernel_counts: bool| -> Option<u32> {
        let w = world();
        let dup = {
            let mut m = w.borrow_mut();
            m.spawn(33, "churn", false);
            m.trickle_every = 2;
            m.cow_ksm = kernel_counts.then_some(0);
            m.map(33, &[9; 1024], false)
        };
        let mut d = daemon(&w, ALL, &[]);
        let mut now = 0;
        run(&mut d, &mut now, 600);
        assert_eq!(d.mode(dup), Some(Mode::Promoted));
        let settled = d
            .status(now)
            .top_regions
            .iter()
            .any(|r| r.state == "promoted");
        assert!(settled, "merged and settled before the first rewrite");
        for round in 1..=14 {
            {
                let mut m = w.borrow_mut();
                let merged = m.count(dup, PageState::Merged) as u64;
                for page in 0..1024 {
                    m.mem.write(PageRef { region: dup, page }, 9).unwrap();
                }
                if let Some(c) = m.cow_ksm.as_mut() {
                    *c += merged;
                }
            }
            if run(&mut d, &mut now, 100)
                .iter()
                .any(|s| s.demoted == vec![dup])
            {
                assert!(matches!(d.mode(dup), Some(Mode::Held { .. })));
                assert!(!w.borrow().spans[&dup].mergeable);
                return Some(round);
            }
        }
        None
    };
    let seen = rounds_until_demoted(true);
    eprintln!("demoted after {seen:?} rounds");
    assert!(
        seen.is_some_and(|r| r <= 3),
        "demoted after {seen:?} rounds of 10 s"
    );
    // Without it, runs differ with the hasher's seed (what is sampled):
    // by hand, demoted after 2-3 rounds in 3 runs of 12, not in 14 rounds
    // in the other 9 (likely a remerge from the top, whose pass saw the
    // breaks; not checked). Eight runs, at least two blind.
    let blind = (0..8)
        .filter(|_| rounds_until_demoted(false).is_none())
        .count();
    assert!(blind >= 2, "the blind spot showed in {blind} of 8 runs");
}

#[test]
fn with_v_cow_at_100_percent_a_rewritten_region_stays_merged() {
    let w = world();
    let dup = {
        let mut m = w.borrow_mut();
        m.spawn(31, "thrash", false);
        m.map(31, &[9; 1024], false)
    };
    let mut d = daemon(
        &w,
        "[ladder]\nv_cow = 1.0\n[actuate]\nrecheck_s = 1\n[eligible]\nall = true\n",
        &[],
    );
    let mut now = 0;
    run(&mut d, &mut now, 300);
    for _ in 0..30 {
        {
            let mut m = w.borrow_mut();
            for page in 0..1024 {
                m.mem.write(PageRef { region: dup, page }, 9).unwrap();
            }
        }
        run(&mut d, &mut now, 1);
    }
    assert_eq!(d.mode(dup), Some(Mode::Promoted));
    assert!(
        w.borrow()
            .batches
            .iter()
            .all(|(_, b)| b.iter().all(|a| a.mergeable))
    );
}

#[test]
fn one_batch_per_process_per_wake_with_adjacent_ranges_coalesced() {
    let w = world();
    let slices = {
        let mut m = w.borrow_mut();
        m.spawn(40, "vm", false);
        let mut contents = vec![3u64; 2048];
        contents.extend(distinct(5000, 1024)); // the VMA's last slice is random
        m.map_sliced(40, &contents, 512)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let summaries = run(&mut d, &mut now, 400);
    let m = w.borrow();
    for s in &summaries {
        assert!(
            s.batches <= 1,
            "more than one batch for one process in a wake-up"
        );
    }
    for (_, calls) in &m.batches {
        for a in calls.windows(2) {
            assert!(
                a[0].end() != a[1].start || a[0].mergeable != a[1].mergeable,
                "adjacent calls not coalesced: {calls:?}"
            );
        }
    }
    for &id in &slices[..4] {
        assert!(m.spans[&id].mergeable, "an identical slice was not marked");
    }
    for &id in &slices[4..] {
        assert!(!m.spans[&id].mergeable, "a random slice was marked");
    }
    drop(m);
    let st = d.status(now);
    assert!(st.totals.vma_splits >= 1, "marking inside a VMA splits it");
    assert!(st.totals.vma_splits <= 2 * st.totals.marks);
}

#[test]
fn a_process_that_refuses_injection_is_skipped_with_its_reason_and_retried_slowly() {
    let w = world();
    let dup = {
        let mut m = w.borrow_mut();
        m.spawn(50, "traced", false);
        m.refuse.insert(50, "already traced by pid 99".into());
        m.map(50, &[4; 512], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300); // 30 s
    let m = w.borrow();
    assert!(!m.spans[&dup].mergeable);
    let attempts = m.attempts[&50];
    assert_eq!(attempts, 1, "retried within a minute");
    drop(m);
    let st = d.status(now);
    let s = st
        .skipped
        .iter()
        .find(|s| s.pid == 50)
        .expect("listed as skipped");
    assert_eq!(s.reason, "already traced by pid 99");
    assert_eq!(s.comm, "traced");
    run(&mut d, &mut now, 400); // past the minute: tried again
    assert_eq!(w.borrow().attempts[&50], 2);
}

#[test]
fn a_process_met_at_a_bad_moment_is_retried_within_seconds() {
    let w = world();
    let dup = {
        let mut m = w.borrow_mut();
        m.spawn(51, "tcmalloc", false);
        m.busy.insert(51, 2);
        m.map(51, &[4; 512], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300); // 30 s
    let m = w.borrow();
    assert!(m.spans[&dup].mergeable, "marked after two busy answers");
    assert_eq!(m.attempts[&51], 3, "two busy, then done");
    drop(m);
    assert!(
        d.status(now).skipped.iter().all(|s| s.pid != 51),
        "no longer listed as skipped"
    );
}

#[test]
fn a_batch_abandoned_part_way_records_what_ran_and_retries_the_rest() {
    let w = world();
    let (a, b) = {
        let mut m = w.borrow_mut();
        m.spawn(52, "freezing", false);
        m.cut.insert(52, 1);
        let a = m.map(52, &[4; 512], false);
        m.map(52, &distinct(7000, 512), false);
        (a, m.map(52, &[5; 512], false))
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300); // 30 s
    let m = w.borrow();
    assert_eq!(m.cuts.len(), 1, "{:?}", m.cuts);
    let (_, asked, ran) = m.cuts[0];
    assert!(asked >= 2 && ran == 1, "{:?}", m.cuts);
    assert!(
        m.spans[&a].mergeable && m.spans[&b].mergeable,
        "both marked in the end"
    );
    assert!(m.attempts[&52] >= 2, "the rest was tried again");
    let marked: u64 = [a, b]
        .iter()
        .map(|id| m.spans[id].pages as u64 * 4096)
        .sum();
    drop(m);
    assert_eq!(
        d.status(now).totals.marked_bytes,
        marked,
        "the ledger holds what ran in the cut batch and what ran after"
    );
}

#[test]
fn the_vma_budget_stops_splitting_a_crowded_process() {
    let w = world();
    let (slices, whole) = {
        let mut m = w.borrow_mut();
        m.spawn(60, "crowded", false);
        m.spawn(61, "crowded2", false);
        // Both are above 0.5 × 65530 VMAs.
        m.vma_counts.insert(60, 40_000);
        m.vma_counts.insert(61, 40_000);
        let mut c = vec![2u64; 1024];
        c.extend(distinct(9000, 1024));
        let slices = m.map_sliced(60, &c, 512);
        (slices, m.map(61, &[2; 512], false))
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    let m = w.borrow();
    assert!(!m.spans[&slices[0]].mergeable, "split a crowded process");
    assert!(
        !m.attempts.contains_key(&60),
        "injected into a crowded process"
    );
    // Marking a whole VMA splits nothing: allowed however crowded.
    assert!(m.spans[&whole].mergeable);
    drop(m);
    let st = d.status(now);
    let s = st.skipped.iter().find(|s| s.pid == 60).expect("listed");
    assert!(
        s.reason.starts_with("VMA budget: 40000 VMAs"),
        "{}",
        s.reason
    );
    assert_eq!(st.totals.vma_splits, 0);
}

#[test]
fn shutdown_unmarks_only_what_pagesift_marked_and_restores_ksm() {
    let w = world();
    let (ours, foreign) = {
        let mut m = w.borrow_mut();
        m.spawn(70, "a", false);
        m.spawn(71, "b", false);
        (m.map(70, &[1; 512], false), m.map(71, &[1; 512], true))
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert!(w.borrow().spans[&ours].mergeable);
    d.shutdown(true).unwrap();
    let m = w.borrow();
    assert!(!m.spans[&ours].mergeable, "not unmarked on exit");
    assert!(m.spans[&foreign].mergeable, "a foreign range was unmarked");
    assert!(m.batches.iter().all(|(pid, _)| *pid == 70));
    assert_eq!(m.restored, 1);
    drop(m);

    let w = world();
    let ours = {
        let mut m = w.borrow_mut();
        m.spawn(72, "a", false);
        m.map(72, &[1; 512], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    run(&mut d, &mut now, 300);
    let n = w.borrow().batches.len();
    d.shutdown(false).unwrap();
    assert_eq!(w.borrow().batches.len(), n, "merged pages stay merged");
    assert!(w.borrow().spans[&ours].mergeable);
    assert_eq!(w.borrow().restored, 1);
}

#[test]
fn ineligible_processes_are_neither_sampled_nor_marked() {
    let w = world();
    let (yes, no, denied) = {
        let mut m = w.borrow_mut();
        m.spawn(80, "guest", false);
        m.spawn(81, "other", false);
        m.spawn(82, "guest", false);
        (
            m.map(80, &[1; 512], false),
            m.map(81, &[1; 512], false),
            m.map(82, &[1; 512], false),
        )
    };
    // 82 is a "guest" too, but denied by pid through --pid narrowing.
    // The simulated processes run as uid 1000: a name alone does not admit
    // them (names are not trust), a name with their uid does.
    let mut d = daemon(&w, "[eligible]\ncomms = [\"guest\"]\n", &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert!(
        !w.borrow().spans[&yes].mergeable,
        "uid 1000 admitted by name"
    );
    assert_eq!(d.distiller().ladder().level_of(yes), None, "sampled");
    let st = d.status(now);
    assert!(
        st.skipped
            .iter()
            .any(|s| s.pid == 80 && s.reason.starts_with("untrusted uid 1000")),
        "{:?}",
        st.skipped
    );
    let mut d = daemon(&w, "[eligible]\ncomms = [\"guest\"]\nuids = [1000]\n", &[]);
    run(&mut d, &mut now, 300);
    assert!(w.borrow().spans[&yes].mergeable);
    assert!(!w.borrow().spans[&no].mergeable);
    assert_eq!(d.distiller().ladder().level_of(no), None, "sampled");
    assert_eq!(d.mode(no), None);
    let _ = denied;

    let w2 = world();
    let (a, b) = {
        let mut m = w2.borrow_mut();
        m.spawn(90, "guest", false);
        m.spawn(91, "guest", false);
        (m.map(90, &[1; 512], false), m.map(91, &[1; 512], false))
    };
    let mut d = daemon(&w2, "[ineligible]\ncomms = [\"nobody\"]\n", &[90]);
    run(&mut d, &mut now, 300);
    assert!(w2.borrow().spans[&a].mergeable);
    assert!(
        !w2.borrow().spans[&b].mergeable,
        "--pid narrows to the named pids"
    );
}

#[test]
fn nothing_is_eligible_by_default() {
    let w = world();
    let r = {
        let mut m = w.borrow_mut();
        m.spawn(95, "x", false);
        m.map(95, &[1; 512], false)
    };
    let mut d = daemon(&w, "", &[]);
    let mut now = 0;
    run(&mut d, &mut now, 100);
    assert!(w.borrow().batches.is_empty());
    assert_eq!(d.distiller().ladder().level_of(r), None);
}

#[test]
fn a_process_that_exits_after_promotion_is_forgotten() {
    let w = world();
    let (a, b) = {
        let mut m = w.borrow_mut();
        m.spawn(100, "a", false);
        m.spawn(101, "b", false);
        (m.map(100, &[1; 512], false), m.map(101, &[2; 512], false))
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(a), Some(Mode::Promoted));
    w.borrow_mut().exit(100);
    d.request_refresh();
    run(&mut d, &mut now, 50);
    assert_eq!(d.mode(a), None);
    assert_eq!(d.mode(b), Some(Mode::Promoted));
    assert_eq!(d.marks().processes().len(), 1);
    let st = d.status(now);
    assert_eq!(st.totals.processes, 1);
    let _: RegionId = b;
}

/// Process 10 with one region of 1024 identical pages, run under `toml`
/// until it is marked: the world, the daemon, the region and the time.
fn one_marked_region(toml: &str) -> (Shared, D, RegionId, Nanos) {
    let w = world();
    let id = {
        let mut m = w.borrow_mut();
        m.spawn(10, "cycler", false);
        m.map(10, &[7; 1024], false)
    };
    let mut d = daemon(&w, toml, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert_eq!(d.mode(id), Some(Mode::Promoted));
    (w, d, id, now)
}

/// A region of one content is marked and merged, then unmapped; the
/// process maps the same content again at the same place, and, elsewhere,
/// a region like it. Returns the wakes (of [`WAKE`]) until each of the two
/// new regions was marked, if within `wakes`.
fn mapped_again(toml: &str, wakes: usize) -> (Option<usize>, Option<usize>) {
    let (w, mut d, first, mut now) = one_marked_region(toml);
    let start = w.borrow().spans[&first].start;
    w.borrow_mut().unmap(first);
    d.request_refresh();
    run(&mut d, &mut now, 2);
    let (again, elsewhere) = {
        let mut m = w.borrow_mut();
        (
            m.map_at(10, start, &[7; 1024], false),
            m.map(10, &[8; 1024], false),
        )
    };
    d.request_refresh();
    let (mut a, mut e) = (None, None);
    for i in 1..=wakes {
        run(&mut d, &mut now, 1);
        let m = w.borrow();
        if a.is_none() && m.spans[&again].mergeable {
            a = Some(i);
        }
        if e.is_none() && m.spans[&elsewhere].mergeable {
            e = Some(i);
        }
    }
    (a, e)
}

#[test]
fn a_region_mapped_again_where_a_marked_one_was_is_marked_at_once() {
    let toml = "[eligible]\nall = true\n[actuate]\nwrite_tracking = false\n";
    let (again, elsewhere) = mapped_again(toml, 30);
    // Raised to the top on its predecessor's evidence: marked in the wake
    // that first sees it, younger than V_life (100 ms, one wake).
    assert_eq!(again, Some(1));
    // A region like it at another place climbs on its own samples, level
    // by level (1.2 s here, 12 wakes).
    assert!(elsewhere.is_none_or(|e| e > 5), "{elsewhere:?}");
    let off = format!("{toml}[ladder]\nraise_recurring = false\n");
    let (again, _) = mapped_again(&off, 30);
    assert!(again.is_none_or(|a| a > 5), "{again:?}");
}

/// A marked region unmapped and mapped again at the same addresses between
/// two looks (the maps show the same line; its frames tell) is a new,
/// unmarked generation: it is marked again at once on its predecessor's
/// evidence. Before, the daemon kept it as promoted, and the next refresh
/// took the unmarked range for a mark the kernel or the process had
/// dropped and held it for a minute.
#[test]
fn a_marked_region_mapped_anew_in_place_is_marked_again_as_a_new_generation() {
    let toml = "[eligible]\nall = true\n[actuate]\nwrite_tracking = false\n";
    let (w, mut d, id, mut now) = one_marked_region(toml);
    w.borrow_mut().renew(id, &[7; 1024]);
    let mut again = None;
    for i in 1..=30 {
        run(&mut d, &mut now, 1);
        if w.borrow().spans[&id].mergeable {
            again = Some(i);
            break;
        }
    }
    // Seen at the next check (a second, 10 wakes), marked at once.
    assert!(again.is_some_and(|i| i <= 12), "{again:?}");
    assert_eq!(d.mode(id), Some(Mode::Promoted));
    assert_eq!(d.status(now).totals.raised_on_history, 1);
    run(&mut d, &mut now, 100);
    assert_eq!(w.borrow().count(id, PageState::Merged), 1024);
}

#[test]
fn the_daemon_stays_under_its_cpu_cap_by_sleeping_longer() {
    let w = world();
    {
        let mut m = w.borrow_mut();
        m.spawn(110, "big", false);
        m.map(110, &distinct(1, 1 << 16), false);
    }
    // A 0.1 % cap: whatever a wake-up costs, the sleep after it is at least
    // 999 times as long.
    let mut d = daemon(&w, "[scan]\ncpu_cap = 0.001\n[eligible]\nall = true\n", &[]);
    let mut now = 0;
    for _ in 0..20 {
        let t0 = pagesift_linux::host::thread_cpu_ns();
        now += WAKE;
        let s = d.wake(now);
        let active = pagesift_linux::host::thread_cpu_ns() - t0;
        assert!(
            s.sleep as f64 >= (active as f64 * 0.9) * 999.0 || s.sleep == 1_000_000_000,
            "slept {} ns after {} ns of work",
            s.sleep,
            active
        );
        // Hints arriving may cut the sleep short, but not below what the
        // cap asks for: the wake-up says how far.
        assert!(
            s.cap_sleep <= s.sleep
                && (s.cap_sleep as f64 >= (active as f64 * 0.9) * 999.0 || s.cap_sleep == s.sleep),
            "may wake {} ns after {} ns of work (sleep {})",
            s.cap_sleep,
            active,
            s.sleep
        );
    }
    // Under the governor's cap (95 %) a wake-up's work asks for no sleep
    // longer than T_s: hints may wake the loop after T_s, as before.
    let mut d = daemon(&w, "[eligible]\nall = true\n", &[]);
    now += WAKE;
    let s = d.wake(now);
    assert!(s.cap_sleep <= d.config().sleep(), "{s:?}");
}

/// A cap no wake-up a second can keep (a ten-millionth of a core: 0.1 µs
/// of work a second) is reported out of reach, in status and its text,
/// after `CAP_UNMET_WAKES` wake-ups; the governor's cap is not. (At 10 µs
/// a second a quiet wake-up of a debug build sometimes fitted: one suite
/// run, 2026-12-03.)
#[test]
fn a_cap_out_of_reach_is_reported() {
    let w = world();
    {
        let mut m = w.borrow_mut();
        m.spawn(110, "big", false);
        m.map(110, &distinct(1, 1 << 14), false);
    }
    let mut d = daemon(
        &w,
        "[scan]\ncpu_cap = 0.0000001\n[eligible]\nall = true\n",
        &[],
    );
    let mut now = 0;
    for i in 0..crate::status::CAP_UNMET_WAKES {
        assert!(!d.status(now).daemon.cap_unmet, "after {i} wake-ups");
        now += WAKE;
        let s = d.wake(now);
        assert_eq!(s.sleep, 1_000_000_000, "{s:?}");
    }
    let st = d.status(now);
    assert!(
        st.daemon.cap_unmet && st.daemon.cpu_cap == 1e-7,
        "{:?}",
        st.daemon
    );
    let text = crate::status::render(&st);
    assert!(text.contains("cap 0.000 %, out of reach"), "{text}");

    let mut d = daemon(&w, "[eligible]\nall = true\n", &[]);
    for _ in 0..2 * crate::status::CAP_UNMET_WAKES {
        now += WAKE;
        d.wake(now);
    }
    let st = d.status(now);
    assert!(
        !st.daemon.cap_unmet && st.daemon.cpu_cap == 0.95,
        "{:?}",
        st.daemon
    );
}

/// Two poor processes sharing one run of 48 pages (a library loaded in
/// both, say), and a random one.
fn run_world() -> (Shared, RegionId, RegionId, RegionId) {
    let w = world();
    let (a, b, rand) = {
        let mut m = w.borrow_mut();
        m.spawn(30, "vm", false);
        m.spawn(31, "lib", false);
        m.spawn(32, "rand", false);
        let shared = distinct(500_000, 48);
        let mut a = distinct(100_000, 2048);
        a[512..560].copy_from_slice(&shared);
        let mut b = distinct(200_000, 2048);
        b[1000..1048].copy_from_slice(&shared);
        (
            m.map(30, &a, false),
            m.map(31, &b, false),
            m.map(32, &distinct(300_000, 1024), false),
        )
    };
    (w, a, b, rand)
}

#[test]
fn a_run_of_duplicates_inside_poor_regions_is_marked_on_both_sides_and_merged() {
    let (w, a, b, rand) = run_world();
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let s = run(&mut d, &mut now, 1500);
    let m = w.borrow();
    // Neither region climbed to be marked whole: 2 % duplicates.
    assert!(!m.spans[&a].mergeable && !m.spans[&b].mergeable);
    assert_eq!(d.mode(a), Some(Mode::Sampling));
    // The run was marked in both processes: padded by 64 pages, aligned to
    // 16, inside the region; nothing else was.
    let marks: Vec<(u32, u64, u64)> = s
        .iter()
        .flat_map(|s| s.run_marks.iter().map(|(pid, a)| (*pid, a.start, a.end())))
        .collect();
    let page = |id: RegionId, p: u64| m.spans[&id].start + p * 4096;
    for (pid, id, first) in [(30, a, 512), (31, b, 1000)] {
        let (start, end) = (page(id, first), page(id, first + 48));
        let mine: Vec<_> = marks.iter().filter(|x| x.0 == pid).collect();
        assert!(!mine.is_empty(), "no run marked in {pid}: {marks:?}");
        for &&(_, s, e) in &mine {
            assert!(
                s <= start && end <= e,
                "{pid}: {s:#x}..{e:#x} misses the run"
            );
            assert!(s >= page(id, first - 64 - 16) && e <= page(id, first + 48 + 64 + 16));
            assert_eq!((s - m.spans[&id].start) % (16 * 4096), 0, "aligned");
        }
        // Every page of the run is merged; pages never marked are not.
        for p in 0..2048u32 {
            let state = m
                .mem
                .state(PageRef {
                    region: id,
                    page: p,
                })
                .unwrap();
            let in_run = (first as u32..first as u32 + 48).contains(&p);
            assert_eq!(
                state == PageState::Merged,
                in_run,
                "{pid} page {p}: {state:?}"
            );
            if !m.page_mergeable(id, p) {
                assert_eq!(state, PageState::Present);
            }
        }
    }
    // Once marked, a run is not marked again.
    assert_eq!(marks.len(), 2, "{marks:?}");
    assert!(m.batches.iter().all(|(pid, _)| *pid != 32));
    assert!((0..1024).all(|p| !m.page_mergeable(rand, p)));
    drop(m);
    let st = d.status(now);
    assert_eq!(st.totals.run_marks, 2);
    assert_eq!(st.totals.promoted_regions, 0);
    assert_eq!(st.totals.vma_splits, 4, "two splits a side");
}

#[test]
fn ksmd_is_paced_for_a_marked_run_in_the_wake_that_marks_it() {
    // A marked run becomes a region of its own only at the next refresh,
    // which the forced-refresh budget may put off by seconds: ksmd must
    // not trickle until then.
    let (w, _, _, _) = run_world();
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let trickle = pagesift_core::pipeline::pacing::PacingConfig::default().trickle_share;
    let mut marked = 0;
    for _ in 0..1500 {
        now += WAKE;
        let s = d.wake(now);
        if !s.run_marks.is_empty() {
            marked += 1;
            assert!(
                s.ksm_share > trickle,
                "ksmd trickles ({}) while the run it was just given waits",
                s.ksm_share
            );
        }
    }
    assert!(marked > 0, "no run was marked");
}

#[test]
fn runs_stay_within_the_vma_budget_and_never_cost_the_whole_region_marks() {
    let (w, a, b, _) = run_world();
    let whole = {
        let mut m = w.borrow_mut();
        // Process 30 is one VMA short of its budget (half of 65530): a run
        // would add two, a whole VMA none.
        m.vma_counts.insert(30, 65_530 / 2 - 1);
        m.map(30, &[9; 512], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let s = run(&mut d, &mut now, 1500);
    let m = w.borrow();
    let marked: Vec<u32> = s
        .iter()
        .flat_map(|s| s.run_marks.iter().map(|(pid, _)| *pid))
        .collect();
    assert!(!marked.contains(&30), "{marked:?}");
    assert!(marked.contains(&31), "the twin side still fits: {marked:?}");
    assert!(
        m.spans[&whole].mergeable,
        "the whole region was still marked"
    );
    assert_eq!(d.mode(whole), Some(Mode::Promoted));
    assert!((512..560).all(|p| !m.page_mergeable(a, p)));
    assert!((1000..1048).all(|p| m.page_mergeable(b, p)));
    drop(m);
    assert!(d.status(now).skipped.is_empty(), "nobody skipped for a run");
}

#[test]
fn run_promotion_can_be_turned_off() {
    let (w, _, _, _) = run_world();
    let mut d = daemon(
        &w,
        "[actuate]\nrun_min_pages = 0\n[eligible]\nall = true\n",
        &[],
    );
    let mut now = 0;
    let s = run(&mut d, &mut now, 1500);
    assert!(s.iter().all(|s| s.run_marks.is_empty()));
    assert!(w.borrow().batches.is_empty());
}

/// A region written (same content) a few pages every wake while it climbs:
/// with write tracking (the default) it is watched, found hot and held,
/// never marked; without tracking, or with V_cow = 100 %, it is marked.
fn climb_while_written(toml: &str) -> (Shared, D, RegionId, RegionId, Nanos) {
    let w = world();
    let (hot, calm) = {
        let mut m = w.borrow_mut();
        m.spawn(40, "cow", false);
        m.spawn(41, "calm", false);
        (m.map(40, &[9; 1024], false), m.map(41, &[9; 1024], false))
    };
    let mut d = daemon(&w, &format!("{toml}[eligible]\nall = true\n"), &[]);
    let mut now = 0;
    for i in 0..300u32 {
        {
            let mut m = w.borrow_mut();
            for k in 0..4 {
                let page = (i * 4 + k) % 1024;
                m.mem.write(PageRef { region: hot, page }, 9).unwrap();
            }
        }
        run(&mut d, &mut now, 1);
    }
    (w, d, hot, calm, now)
}

#[test]
fn a_region_written_while_it_climbs_is_watched_and_never_marked() {
    let (w, mut d, hot, calm, now) = climb_while_written("");
    let m = w.borrow();
    let span = |id: RegionId| {
        let s = &m.spans[&id];
        (s.proc.pid, s.start, s.end())
    };
    assert!(m.ever_tracked.contains(&span(hot)), "never watched");
    assert!(m.ever_tracked.contains(&span(calm)), "never watched");
    assert!(!m.spans[&hot].mergeable, "the written region was marked");
    assert!(
        m.batches.iter().all(|(pid, _)| *pid == 41),
        "{:?}",
        m.batches
    );
    // The calm twin is marked (and was untracked first: the actuator
    // asserts it) and merged with itself.
    assert!(m.spans[&calm].mergeable);
    assert!(!m.tracked.contains(&span(calm)));
    // Held: out of the ladder, so neither sampled nor watched until the
    // hold ends.
    assert!(matches!(d.mode(hot), Some(Mode::Held { .. })));
    assert!(m.tracked.is_empty(), "{:?}", m.tracked);
    drop(m);
    let st = d.status(now);
    assert!(
        st.levels
            .iter()
            .all(|l| l.regions.iter().all(|r| r.id != hot.0)),
        "a held region is in the ladder"
    );
    assert_eq!(st.totals.write_tracked_ranges, 0);
    assert_eq!(st.totals.unmarks, 0);
    assert_eq!(st.totals.held_regions, 1);
    d.shutdown(false).unwrap();
    assert!(w.borrow().tracked.is_empty(), "tracking left at exit");
}

#[test]
fn a_held_region_comes_back_at_the_bottom_when_its_hold_ends() {
    let (w, mut d, hot, _, mut now) = climb_while_written("");
    let Some(Mode::Held { until }) = d.mode(hot) else {
        panic!("not held: {:?}", d.mode(hot));
    };
    // No more writes. Until the hold ends: out of the ladder, unmarked.
    while now + WAKE < until {
        run(&mut d, &mut now, 1);
        assert_eq!(d.distiller().ladder().level_of(hot), None);
    }
    // Then back at the bottom, watched again while it climbs, and marked
    // once it is cold at the top.
    run(&mut d, &mut now, 2);
    assert!(d.distiller().ladder().level_of(hot).is_some(), "not back");
    assert_eq!(d.mode(hot), Some(Mode::Sampling));
    let mut watched = false;
    for _ in 0..600 {
        run(&mut d, &mut now, 1);
        let m = w.borrow();
        let s = &m.spans[&hot];
        watched |= m.tracked.contains(&(s.proc.pid, s.start, s.end()));
        if s.mergeable {
            break;
        }
    }
    assert!(watched, "re-promoted without watching its writes again");
    assert!(
        w.borrow().spans[&hot].mergeable,
        "never marked after the hold"
    );
}

#[test]
fn without_write_tracking_or_with_v_cow_100_the_written_region_is_marked() {
    for toml in [
        "[actuate]\nwrite_tracking = false\n",
        "[ladder]\nv_cow = 1.0\n",
    ] {
        let (w, _d, _, _, _) = climb_while_written(toml);
        let m = w.borrow();
        // Marked (without tracking, accounting may back out later).
        assert!(
            m.batches
                .iter()
                .any(|(pid, b)| *pid == 40 && b.iter().any(|a| a.mergeable)),
            "{toml}: never marked"
        );
        if toml.contains("write_tracking") {
            assert!(m.ever_tracked.is_empty(), "tracked though off");
        }
    }
}

#[test]
fn the_daemon_wakes_once_a_second_while_only_the_bottom_has_work() {
    let w = world();
    let dup = {
        let mut m = w.borrow_mut();
        m.spawn(120, "rand", false);
        m.spawn(121, "dup", false);
        m.map(120, &distinct(1, 1 << 14), false);
        m.map(121, &[9; 1024], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let (mut now, mut idle_wakes, mut promoted_at) = (0, 0, None);
    for k in 0..300 {
        let s = d.wake(now);
        let ladder = d.distiller().ladder();
        let above = (1..ladder.levels()).any(|l| ladder.level_pages(l) > 0);
        let waiting =
            d.mode(dup) == Some(Mode::Promoted) && w.borrow().count(dup, PageState::Merged) < 1024;
        if above || waiting || !s.promoted.is_empty() {
            // Something climbed or waits for ksmd: the short sleep at once.
            assert_eq!(s.sleep, WAKE, "wake {k}: above {above}, waiting {waiting}");
        } else if s.sleep == 1_000_000_000 {
            idle_wakes += 1;
        }
        // The budgets follow the sleep that comes next.
        assert_eq!(d.distiller().sleep(), s.sleep.clamp(WAKE, 1_000_000_000));
        if !s.promoted.is_empty() {
            promoted_at.get_or_insert(k);
        }
        now += s.sleep;
    }
    assert!(
        promoted_at.is_some(),
        "the identical region was never promoted"
    );
    assert!(idle_wakes > 10, "only {idle_wakes} one-second sleeps");
    // Once merged and settled, only the bottom has work again: 1 s sleeps.
    assert_eq!(d.mode(dup), Some(Mode::Promoted));
    assert_eq!(d.wake(now).sleep, 1_000_000_000);
}

/// Reloads `d` with `toml` (as SIGHUP does) and returns the wake-ups until
/// (and including) the next refresh.
fn reload(d: &mut D, toml: &str, now: &mut Nanos) -> Vec<WakeSummary> {
    let config = Config::from_toml(toml, "test").unwrap();
    let policy = Policy::new(&config, &[], 1, Some("/usr/sbin/pagesift".into()));
    d.reload(config, policy);
    let mut out = Vec::new();
    loop {
        *now += WAKE;
        let s = d.wake(*now);
        let refreshed = s.refreshed;
        out.push(s);
        if refreshed {
            return out;
        }
    }
}

#[test]
fn a_process_that_leaves_the_eligible_set_is_unmarked_at_the_next_refresh() {
    let w = world();
    let (a, b) = {
        let mut m = w.borrow_mut();
        m.spawn(60, "stay", false);
        m.spawn(61, "leave", false);
        (m.map(60, &[3; 512], false), m.map(61, &[4; 512], false))
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert!(w.borrow().spans[&a].mergeable && w.borrow().spans[&b].mergeable);
    let key_b = w.borrow().spans[&b].proc;
    assert!(!d.marks().ranges(key_b).is_empty());
    let before = w.borrow().batches.len();
    // [ineligible] names it: within the refresh that follows the reload,
    // one MADV_UNMERGEABLE batch of exactly its marks.
    reload(
        &mut d,
        "[eligible]\nall = true\n[ineligible]\ncomms = [\"leave\"]\n",
        &mut now,
    );
    {
        let m = w.borrow();
        assert!(!m.spans[&b].mergeable, "still marked after leaving the set");
        assert!(m.spans[&a].mergeable, "the one that stayed was unmarked");
        let unmarks: Vec<_> = m.batches[before..]
            .iter()
            .filter(|(pid, batch)| *pid == 61 && batch.iter().all(|c| !c.mergeable))
            .collect();
        assert_eq!(unmarks.len(), 1, "{:?}", &m.batches[before..]);
        let span = &m.spans[&b];
        assert!(
            unmarks[0]
                .1
                .iter()
                .any(|c| c.start <= span.start && span.end() <= c.end())
        );
    }
    assert!(d.marks().ranges(key_b).is_empty());
    // And it is never marked again while ineligible.
    run(&mut d, &mut now, 300);
    assert!(!w.borrow().spans[&b].mergeable);
    assert!(
        w.borrow().batches[before..]
            .iter()
            .filter(|(pid, _)| *pid == 61)
            .all(|(_, batch)| batch.iter().all(|c| !c.mergeable))
    );
}

#[test]
fn a_departed_process_that_cannot_be_injected_now_is_unmarked_later() {
    let w = world();
    let b = {
        let mut m = w.borrow_mut();
        m.spawn(62, "leave", false);
        m.map(62, &[4; 512], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert!(w.borrow().spans[&b].mergeable);
    w.borrow_mut().refuse.insert(62, "traced".into());
    reload(
        &mut d,
        "[eligible]\nall = true\n[ineligible]\ncomms = [\"leave\"]\n",
        &mut now,
    );
    assert!(w.borrow().spans[&b].mergeable, "refused, so still marked");
    w.borrow_mut().refuse.remove(&62);
    d.request_refresh();
    run(&mut d, &mut now, 2);
    assert!(!w.borrow().spans[&b].mergeable, "not unmarked on the retry");
}

#[test]
fn exec_starts_a_new_identity_whose_old_marks_are_forgotten_not_unmarked() {
    let w = world();
    let old = {
        let mut m = w.borrow_mut();
        m.spawn(64, "guest", false);
        m.map(64, &[5; 512], false)
    };
    let mut d = daemon(&w, "[eligible]\ncomms = [\"guest\"]\nuids = [1000]\n", &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert!(w.borrow().spans[&old].mergeable);
    let old_key = w.borrow().procs[0].key;
    assert!(!d.marks().ranges(old_key).is_empty());
    // execve: same pid and start time, a new image mapped at the very
    // addresses the old one had marked, not eligible under its new name.
    let (new, before) = {
        let mut m = w.borrow_mut();
        m.exec(64, "setuid-tool");
        m.next_addr = 0x7f00_0000_0000;
        (m.map(64, &[5; 512], false), m.batches.len())
    };
    let new_key = w.borrow().procs[0].key;
    assert_ne!(new_key, old_key);
    assert_eq!(
        (new_key.pid, new_key.start_time),
        (old_key.pid, old_key.start_time)
    );
    // No refresh asked for: the pid set did not change, so nothing but the
    // identity check before each injection stands between the old image's
    // ranges and the new image until the daemon refreshes.
    run(&mut d, &mut now, 300);
    let m = w.borrow();
    assert!(
        m.batches[before..].iter().all(|(pid, _)| *pid != 64),
        "the new image was injected into: {:?}",
        &m.batches[before..]
    );
    assert!(!m.spans[&new].mergeable);
    assert!(d.marks().ranges(old_key).is_empty(), "old marks kept");
    assert!(d.marks().ranges(new_key).is_empty());
    drop(m);
    // Under an eligible name the new image is judged afresh: sampled from
    // the bottom and marked on its own merits.
    let again = {
        let mut m = w.borrow_mut();
        m.exec(64, "guest");
        m.map(64, &[6; 512], false)
    };
    d.request_refresh();
    run(&mut d, &mut now, 300);
    assert!(w.borrow().spans[&again].mergeable);
    let key = w.borrow().procs[0].key;
    assert!(!d.marks().ranges(key).is_empty());
}

#[test]
fn a_uid_change_out_of_the_set_unmarks_at_the_next_refresh() {
    let w = world();
    let r = {
        let mut m = w.borrow_mut();
        m.spawn(66, "svc", false);
        m.map(66, &[8; 512], false)
    };
    let mut d = daemon(&w, "[eligible]\nuids = [1000]\n", &[]);
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert!(w.borrow().spans[&r].mergeable);
    let before = w.borrow().batches.len();
    // The process drops to another uid (setuid): same process, no longer
    // in the set. The next refresh unmarks it.
    w.borrow_mut().procs[0].facts.uid = 1001;
    d.request_refresh();
    run(&mut d, &mut now, 1);
    let m = w.borrow();
    assert!(!m.spans[&r].mergeable, "still marked after leaving by uid");
    assert!(
        m.batches[before..]
            .iter()
            .all(|(pid, b)| *pid == 66 && b.iter().all(|c| !c.mergeable)),
        "{:?}",
        &m.batches[before..]
    );
}

#[test]
fn the_sweep_raises_regions_whose_duplicates_sit_at_other_offsets_and_they_merge() {
    let w = world();
    let (a, b, rand) = {
        let mut m = w.borrow_mut();
        m.spawn(40, "guest-a", false);
        m.spawn(41, "guest-b", false);
        m.spawn(42, "rand", false);
        let a = distinct(100_000, 1024);
        // B holds A's first half as its second half: every duplicate is
        // 512 pages away from its twin's offset.
        let mut b = distinct(900_000, 1024);
        b[512..].copy_from_slice(&a[..512]);
        (
            m.map(40, &a, false),
            m.map(41, &b, false),
            m.map(42, &distinct(300_000, 1024), false),
        )
    };
    let mut d = daemon(
        &w,
        "[eligible]\nall = true\n[scan]\nsweep_every_s = 1\nsweep_min_age_s = 0.0\nsweep_share = 0.3\n",
        &[],
    );
    let mut now = 0;
    // The sweep's slices are sized by its CPU time measured on this
    // machine: under a loaded test run the first epoch takes more wakes.
    // A debug build hashes a page in about 8 µs, so at the default 3 %
    // the epoch would take most of a second of the simulated clock, and
    // sampling, which finds A's and B's twins too, could mark A whole
    // before the sweep's zones exist: the share is raised so that the
    // sweep is what this test watches.
    for _ in 0..2000 {
        run(&mut d, &mut now, 1);
        if d.status(now).daemon.sweep.epochs >= 1 {
            break;
        }
    }
    run(&mut d, &mut now, 200);
    let st = d.status(now);
    assert!(st.daemon.sweep.epochs >= 1, "{:?}", st.daemon.sweep);
    assert!(st.daemon.sweep.pages_hashed >= 3 * 1024);
    let m = w.borrow();
    // Each is marked around its unique half (512 pages without a twin,
    // a unique zone of the sweep): ksmd is never shown those pages.
    for (region, dups) in [(a, 0..512u32), (b, 512..1024)] {
        for p in 0..1024 {
            assert_eq!(
                m.page_mergeable(region, p),
                dups.contains(&p),
                "page {p} of {region:?}"
            );
        }
    }
    assert!(!m.spans[&rand].mergeable, "the distinct region was marked");
    assert_eq!(m.count(a, PageState::Merged), 512);
    assert_eq!(m.count(b, PageState::Merged), 512);
}

/// A region that climbs to the top while the last sweep saw nothing but
/// unique pages in it (its content changed since, or its twins are merged
/// pages the sweep does not read) is not held on the sweep's word:
/// sampling found duplicates where the zones leave no room for them, so
/// the zones are set aside and the region is marked while they are still
/// fresh, and merged.
#[test]
fn sampling_that_contradicts_the_sweeps_unique_zones_marks_the_region_whole() {
    let w = world();
    let (a, b) = {
        let mut m = w.borrow_mut();
        m.spawn(40, "guest-a", false);
        m.spawn(41, "guest-b", false);
        (
            m.map(40, &distinct(100_000, 1024), false),
            m.map(41, &distinct(200_000, 1024), false),
        )
    };
    // Sweeps a minute apart (the first after a minute): the test's
    // 14 s below see one epoch's zones only, all fresh. Sampled duplicate
    // runs are off: they are verified pairs, marked whatever the zones say.
    let mut d = daemon(
        &w,
        "[eligible]\nall = true\n[scan]\nsweep_every_s = 60\nsweep_min_age_s = 0.0\n\
         [actuate]\nrun_min_pages = 0\n",
        &[],
    );
    let mut now = 0;
    while d.status(now).daemon.sweep.epochs == 0 {
        assert!(now < 120 * SEC, "no sweep epoch");
        run(&mut d, &mut now, 1);
    }
    let swept = now;
    {
        let st = d.status(now);
        assert!(
            st.daemon.sweep.pages_hashed >= 2 * 1024,
            "{:?}",
            st.daemon.sweep
        );
    }
    // Now A holds B's content: all of both are duplicates, which sampling
    // finds, while the sweep's zones still say "all unique".
    {
        let mut m = w.borrow_mut();
        for page in 0..1024 {
            let content = 200_000 + u64::from(page);
            m.mem.write(PageRef { region: a, page }, content).unwrap();
        }
    }
    while now < swept + 14 * SEC {
        run(&mut d, &mut now, 1);
        assert!(
            !matches!(d.mode(a), Some(Mode::Held { .. })),
            "A was held on the sweep's word"
        );
        let m = w.borrow();
        if m.count(a, PageState::Merged) == 1024 && m.count(b, PageState::Merged) == 1024 {
            break;
        }
    }
    assert!(
        now < swept + 14 * SEC,
        "not merged while the zones were fresh"
    );
    assert_eq!(d.status(now).daemon.sweep.epochs, 1);
}

/// The sweep leaves a region alone until it has been known for
/// `scan.sweep_min_age_s`, then hashes it: memory that comes and goes
/// within seconds costs no sweep. A sweep due while no region is old
/// enough is no epoch (a fruitless one would double the spacing): it looks
/// again a second later.
#[test]
fn the_sweep_waits_for_a_region_to_reach_its_minimum_age() {
    let w = world();
    {
        let mut m = w.borrow_mut();
        m.spawn(40, "guest-a", false);
        m.map(40, &distinct(100_000, 1024), false);
    }
    let config = "[eligible]\nall = true\n[scan]\nsweep_every_s = 5\nsweep_min_age_s = 6.0\n";
    let mut d = daemon(&w, config, &[]);
    let mut now = 0;
    while now < 5 * SEC + SEC / 2 {
        run(&mut d, &mut now, 1);
    }
    let st = d.status(now);
    assert_eq!(st.daemon.sweep.pages_hashed, 0, "{:?}", st.daemon.sweep);
    assert_eq!(st.daemon.sweep.epochs, 0, "{:?}", st.daemon.sweep);
    // Old enough at 6 s; the next look, within a second, walks it.
    while now < 8 * SEC + SEC / 2 {
        run(&mut d, &mut now, 1);
    }
    let st = d.status(now);
    assert!(
        st.daemon.sweep.pages_hashed >= 1024,
        "{:?}",
        st.daemon.sweep
    );
}

/// A hint source that hands out what the test queued.
struct QueuedHints(
    std::sync::Arc<std::sync::Mutex<Vec<(u32, u64, u64)>>>,
    Vec<u32>,
);

/// A read of `pages` pages at `start` by `tgid`, as [`QueuedHints`] hands
/// it out; a queued range with the pages' top bit set is a write.
const WRITE: u64 = 1 << 63;

impl crate::daemon::HintTap for QueuedHints {
    fn watch(&mut self, tgids: &mut dyn Iterator<Item = u32>) {
        self.1 = tgids.collect();
    }
    fn drain(&mut self, f: &mut dyn FnMut(crate::daemon::HintedRange)) -> u64 {
        let v: Vec<_> = std::mem::take(&mut *self.0.lock().unwrap());
        let mut n = 0;
        for &(tgid, start, p) in &v {
            // The kernel filters by the watched tgids.
            if self.1.contains(&tgid) {
                f(crate::daemon::HintedRange {
                    tgid,
                    start,
                    pages: p & !WRITE,
                    read: p & WRITE == 0,
                });
                n += 1;
            }
        }
        n
    }
    fn ring_dropped(&self) -> u64 {
        0
    }
}

/// Two processes poor in duplicates share one 64-page run (a file each
/// read). With the reads hinted, the run is found and marked on both sides
/// in the first wake-up; without hints the same wake-up marks nothing.
#[test]
fn a_hinted_file_run_is_marked_at_once() {
    use crate::target::Target;
    let setup = || {
        let w = world();
        let (a, b) = {
            let mut m = w.borrow_mut();
            m.spawn(20, "reader-a", false);
            m.spawn(21, "reader-b", false);
            let mut ca = distinct(100_000, 4096);
            ca[1000..1064].copy_from_slice(&distinct(7_000, 64));
            let mut cb = distinct(200_000, 4096);
            cb[3000..3064].copy_from_slice(&distinct(7_000, 64));
            (m.map(20, &ca, false), m.map(21, &cb, false))
        };
        (w, a, b)
    };
    let (w, a, b) = setup();
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // The exact sweep would find the run too, in its own time: off here,
    // so that what is marked is what the hints found.
    let config = "[eligible]\nall = true\n[scan]\nsweep_share = 0.0\n";
    let mut d = daemon(&w, config, &[]);
    d.start_hints(Ok(Box::new(QueuedHints(queue.clone(), Vec::new()))));
    let (sa, sb) = (
        d.target().span(a).unwrap().start,
        d.target().span(b).unwrap().start,
    );
    queue.lock().unwrap().extend([
        (21, sb + 3000 * 4096, 64),
        (20, sa + 1000 * 4096, 64),
        // A process that is not watched, and memory nobody tracks.
        (99, sa, 64),
        (20, 0x1000, 4),
    ]);
    let mut now = 0;
    run(&mut d, &mut now, 1);
    {
        let m = w.borrow();
        assert!(
            (1000..1064).all(|p| m.page_mergeable(a, p)),
            "a's run not marked"
        );
        assert!(
            (3000..3064).all(|p| m.page_mergeable(b, p)),
            "b's run not marked"
        );
        assert!(!m.page_mergeable(a, 0) && !m.page_mergeable(b, 4095));
    }
    let h = d.status(now).hints;
    assert_eq!(h.state, "on");
    assert_eq!((h.events, h.received, h.pushed), (3, 132, 128), "{h:?}");
    assert_eq!((h.untracked, h.mergeable), (4, 0), "{h:?}");
    assert!(h.duplicates >= 1 && h.pages_marked >= 128, "{h:?}");
    assert!(h.capacity > 0);

    // The same wake-up without hints marks nothing.
    let (w, a, b) = setup();
    let mut d = daemon(&w, config, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 1);
    let m = w.borrow();
    assert!(!(1000..1064).any(|p| m.page_mergeable(a, p)));
    assert!(!(3000..3064).any(|p| m.page_mergeable(b, p)));
    assert_eq!(d.status(now).hints.state, "starting");
}

/// Four readers read the same 16 MiB "file" in their own orders of its
/// 64-page chunks (the files experiment): every chunk is a run of its
/// own, so each needs its own hinted look-up, and under a small CPU cap
/// the wake-ups' budgets take many global rounds to reach them all. Hints
/// are kept until the ladder's walk could have visited their pages
/// (`bottom_pass_time`), so none is dropped as stale, and in the end
/// every page is marked. Kept only for a global round (the rule before
/// 2026-12-01), 13 775 of the 16 384 were dropped unread.
///
/// Also with trimming on: settled regions' stretches unmerged while their
/// twins were not marked yet are trimmed, climb again and are
/// write-tracked, and their hinted runs (marked whatever the write
/// verdict) must leave tracking before they are marked. Before that was
/// so, the simulated actuator caught a hinted run marked while tracked.
#[test]
fn hints_outlive_global_rounds_until_the_walk_could_reach_their_pages() {
    for trim in ["0", "256"] {
        hinted_readers_are_marked_whole(trim);
    }
}

fn hinted_readers_are_marked_whole(trim_min_pages: &str) {
    use crate::target::Target;
    let w = world();
    let chunks = 64usize;
    let file = distinct(7_000, 64 * chunks);
    let mut regions = Vec::new();
    {
        let mut m = w.borrow_mut();
        for r in 0..4u32 {
            m.spawn(30 + r, "reader", false);
            // Chunk order: a stride through the chunks, different for
            // each reader.
            let stride = [1, 7, 13, 29][r as usize];
            let mut c = distinct(100_000 * u64::from(r + 1), 64 * chunks);
            for k in 0..chunks {
                let from = (k * stride % chunks) * 64;
                c[k * 64..k * 64 + 64].copy_from_slice(&file[from..from + 64]);
            }
            regions.push(m.map(30 + r, &c, false));
        }
    }
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    // A small CPU cap: the look-ups take many wake-ups, as the daemon's
    // real budgets make them take on a host (the simulated pages cost
    // next to nothing to read). The hard maximum age is raised past the
    // test's 30 s: the budgets are real CPU time, and a debug build under
    // a loaded suite had not looked up 667 of the hints after 15 s (about
    // one run in seven, 2026-12-03), which is the cap doing its job, not
    // the round rule this test watches.
    let config = format!(
        "[actuate]\ntrim_min_pages = {trim_min_pages}\n\
         [eligible]\nall = true\n[scan]\nsweep_share = 0.0\ncpu_cap = 0.002\n\
         [hints]\nmax_age_ms = 60000\n"
    );
    let mut d = daemon(&w, &config, &[]);
    d.start_hints(Ok(Box::new(QueuedHints(queue.clone(), Vec::new()))));
    for (r, &id) in regions.iter().enumerate() {
        let start = d.target().span(id).unwrap().start;
        for k in 0..chunks as u64 {
            queue
                .lock()
                .unwrap()
                .push((30 + r as u32, start + k * 64 * 4096, 64));
        }
    }
    let unmarked = || -> usize {
        let m = w.borrow();
        (regions.iter())
            .map(|&id| {
                (0..64 * chunks as u32)
                    .filter(|&p| !m.page_mergeable(id, p))
                    .count()
            })
            .sum()
    };
    // 300 wakes (30 s) are enough on an idle machine; the cap is real CPU
    // time, so a loaded debug suite may need more (320 pages were still
    // unmarked at 30 s in one suite, 2026-12-04, and 32 at 50 s in
    // another, 2026-12-05, none dropped, the stack empty: the ladder's
    // walk was still reaching the last ones). Up to 80 s: drops are
    // counted from the start, so a longer run cannot hide one.
    let mut now = 0;
    run(&mut d, &mut now, 300);
    for _ in 0..10 {
        if unmarked() == 0 {
            break;
        }
        run(&mut d, &mut now, 50);
    }
    let h = d.status(now).hints;
    assert_eq!(unmarked(), 0, "trim_min_pages {trim_min_pages}: {h:?}");
    assert_eq!(h.dropped_stale, 0, "trim_min_pages {trim_min_pages}: {h:?}");
}

/// A reader whose hints come after the other readers' runs were marked,
/// and cut out of their regions (each marked run is a VMA of its own in
/// the kernel), still has its data found whole from its hints: the
/// index's entries of the run's pages followed them into the new regions.
/// Left at their old offsets, past the end of the cut regions, the twins
/// they named could not be read (the files experiment, about one run in
/// five, 2026-12-01: the fourth reader's data between two marked runs was
/// left to the ladder for 15–26 s).
#[test]
fn a_late_readers_hints_find_the_runs_cut_out_before_them() {
    use crate::target::Target;
    let w = world();
    let file = distinct(7_000, 1024);
    let mut regions = Vec::new();
    {
        let mut m = w.borrow_mut();
        for r in 0..4u32 {
            m.spawn(30 + r, "reader", false);
            // 16 private pages, the file's 1024, 16 private pages; the
            // last reader's buffer holds other data until it reads.
            let mut c = distinct(100_000 * u64::from(r + 1), 1056);
            if r < 3 {
                c[16..1040].copy_from_slice(&file);
            }
            regions.push(m.map(30 + r, &c, false));
        }
    }
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let config = "[eligible]\nall = true\n[scan]\nsweep_share = 0.0\n";
    let mut d = daemon(&w, config, &[]);
    d.start_hints(Ok(Box::new(QueuedHints(queue.clone(), Vec::new()))));
    let read = |d: &D, r: usize| {
        let start = d.target().span(regions[r]).unwrap().start + 16 * 4096;
        let mut q = queue.lock().unwrap();
        for k in 0..16u64 {
            q.push((30 + r as u32, start + k * 64 * 4096, 64));
        }
    };
    let file_marked = |region: RegionId| {
        let m = w.borrow();
        (16..16 + 1024).all(|p| m.page_mergeable(region, p))
    };
    for r in 0..3 {
        read(&d, r);
    }
    let mut now = 0;
    run(&mut d, &mut now, 20);
    for (r, &id) in regions[..3].iter().enumerate() {
        assert!(file_marked(id), "reader {r}");
    }
    // The marks cut the first three readers' regions; then the fourth
    // reads.
    {
        let mut m = w.borrow_mut();
        for &id in &regions[..3] {
            let run = m.split(id, 16);
            m.split(run, 1024);
        }
    }
    d.request_refresh();
    run(&mut d, &mut now, 1);
    {
        let mut m = w.borrow_mut();
        for (k, &c) in file.iter().enumerate() {
            let page = PageRef {
                region: regions[3],
                page: 16 + k as u32,
            };
            m.mem.write(page, c).unwrap();
        }
    }
    let before = d.status(now).hints;
    read(&d, 3);
    run(&mut d, &mut now, 5);
    let h = d.status(now).hints;
    assert!(file_marked(regions[3]), "{h:?}");
    // Its first hint looked up finds a twin and the whole run; the rest
    // fall inside that run. With the entries dropped instead of moved, 24
    // hints were looked up before one met a twin the ladder had sampled
    // again; left stale, each of 1 024 hints found a run of one page.
    assert_eq!(h.duplicates - before.duplicates, 1, "{h:?}");
    assert!(h.sampled - before.sampled <= 2, "{h:?}");
}

/// Status shows the sample index's size: the stable pages of two
/// processes' shared runs once they are found, and the heap it holds.
#[test]
fn status_shows_the_sample_index() {
    let w = world();
    {
        let mut m = w.borrow_mut();
        let shared = distinct(9_000, 256);
        for pid in [50, 51] {
            m.spawn(pid, "twin", false);
            m.map(pid, &shared, false);
        }
    }
    let mut d = daemon(&w, ALL, &[]);
    let empty = d.status(0).daemon.index;
    assert_eq!((empty.stable, empty.unstable), (0, 0));
    let mut now = 0;
    run(&mut d, &mut now, 20);
    let ix = d.status(now).daemon.index;
    assert!(ix.stable > 0, "{ix:?}");
    assert!(ix.heap_bytes >= (ix.stable + ix.unstable) * 28, "{ix:?}");
}

/// A region held for its writes gets the hints of what a read filled in
/// it, not those of what its process wrote out from it: a buffer that a
/// process builds, writes to a file and builds again is what the hold is
/// about (the short-lived workload's cycle log, written from its heap, had
/// a run of its held heap marked, in a full-size bench on 2026-11-28).
#[test]
fn a_held_region_takes_read_hints_but_not_write_hints() {
    use crate::target::Target;
    let (_w, mut d, hot, _, mut now) = climb_while_written("");
    assert!(matches!(d.mode(hot), Some(Mode::Held { .. })));
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    d.start_hints(Ok(Box::new(QueuedHints(queue.clone(), Vec::new()))));
    d.request_refresh();
    run(&mut d, &mut now, 1);
    let start = d.target().span(hot).unwrap().start;
    queue
        .lock()
        .unwrap()
        .extend([(40, start, 64 | WRITE), (40, start + 64 * 4096, 64)]);
    run(&mut d, &mut now, 1);
    assert!(matches!(d.mode(hot), Some(Mode::Held { .. })));
    let h = d.status(now).hints;
    assert_eq!((h.events, h.received), (2, 128), "{h:?}");
    assert_eq!((h.pushed, h.held_writes, h.mergeable), (64, 64, 0), "{h:?}");
}

#[test]
fn hints_disabled_or_unavailable_say_so() {
    let w = world();
    let mut d = daemon(&w, "[hints]\nenabled = false\n", &[]);
    d.start_hints(Err("never asked".into()));
    let h = d.status(0).hints;
    assert_eq!(h.state, "off");
    assert!(h.reason.unwrap().contains("enabled = false"));
    let mut d = daemon(&w, ALL, &[]);
    d.start_hints(Err("missing capability CAP_BPF: ...".into()));
    let h = d.status(0).hints;
    assert_eq!(h.state, "unavailable");
    assert!(h.reason.unwrap().contains("CAP_BPF"));
}

/// SIGHUP with a changed `[hints]`: the running source is dropped and a
/// new one is asked for; turning hints off says so; an unchanged `[hints]`
/// keeps the source.
#[test]
fn a_reload_that_changes_hints_restarts_them() {
    let w = world();
    w.borrow_mut().spawn(20, "reader", false);
    let queue = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut d = daemon(&w, ALL, &[]);
    assert!(d.hints_pending(), "wanted at start");
    d.start_hints(Ok(Box::new(QueuedHints(queue.clone(), Vec::new()))));
    assert!(!d.hints_pending());
    assert_eq!(d.status(0).hints.state, "on");
    let mut now = 0;
    reload(&mut d, ALL, &mut now);
    assert_eq!(d.status(now).hints.state, "on", "unchanged: kept");
    reload(
        &mut d,
        &format!("{ALL}[hints]\nmax_age_ms = 5000\n"),
        &mut now,
    );
    assert!(d.hints_pending(), "changed: a new source is wanted");
    assert_eq!(d.status(0).hints.state, "starting");
    d.start_hints(Ok(Box::new(QueuedHints(queue.clone(), Vec::new()))));
    assert_eq!(d.status(0).hints.state, "on");
    reload(
        &mut d,
        &format!("{ALL}[hints]\nenabled = false\n"),
        &mut now,
    );
    assert!(!d.hints_pending());
    let h = d.status(0).hints;
    assert_eq!(h.state, "off");
    assert!(h.reason.unwrap().contains("enabled = false"));
}

#[test]
fn status_shows_each_cgroups_own_savings_and_sums_the_rest() {
    let w = world();
    // Three processes in three cgroups (the simulation's
    // /test.slice/COMM.scope): 1024 and 256 identical pages, and distinct
    // pages that save nothing.
    let (a, b) = {
        let mut m = w.borrow_mut();
        m.spawn(40, "vm-a", false);
        m.spawn(41, "vm-b", false);
        m.spawn(42, "idle", false);
        m.map(42, &distinct(5000, 512), false);
        (m.map(40, &[5; 1024], false), m.map(41, &[6; 256], false))
    };
    let mut d = daemon(
        &w,
        "[actuate]\nrecheck_s = 1\n[savings]\ncgroup_depth = 2\ntop_cgroups = 2\ntop_processes = 1\n[eligible]\nall = true\n",
        &[],
    );
    let mut now = 0;
    run(&mut d, &mut now, 300);
    assert_eq!(w.borrow().count(a, PageState::Merged), 1024);
    assert_eq!(w.borrow().count(b, PageState::Merged), 256);
    // 32 of vm-b's merged pages are rewritten with new content: COW breaks
    // there, none in vm-a.
    {
        let mut m = w.borrow_mut();
        for page in 0..32 {
            m.mem
                .write(PageRef { region: b, page }, 9000 + page as u64)
                .unwrap();
        }
    }
    run(&mut d, &mut now, 40);
    assert_eq!(d.mode(b), Some(Mode::Promoted), "32 of 256 is no thrashing");
    let s = d.status(now).savings;
    assert_eq!(s.cgroup_depth, 2);
    let lines: Vec<(&str, u64, u64, i64, u64)> = s
        .cgroups
        .top
        .iter()
        .map(|c| {
            let f = c.savings;
            (
                c.cgroup.as_str(),
                c.processes,
                f.merged_pages,
                f.saved_bytes,
                f.cow_breaks,
            )
        })
        .collect();
    // Without the kernel's ksm_stat (a simulation), a page saved per page
    // merged.
    assert_eq!(
        lines,
        [
            ("/test.slice/vm-a.scope", 1, 1024, 1024 * 4096, 0),
            ("/test.slice/vm-b.scope", 1, 224, 224 * 4096, 32),
        ]
    );
    let rest = s.cgroups.rest.expect("idle's cgroup is beyond the top 2");
    assert_eq!(
        (rest.entries, rest.processes, rest.savings.merged_pages),
        (1, 1, 0)
    );
    assert_eq!(s.processes.top.len(), 1);
    assert_eq!(s.processes.top[0].pid, 40);
    assert_eq!(s.processes.top[0].comm, "vm-a");
    assert_eq!(s.processes.rest.as_ref().map(|r| r.entries), Some(2));
    assert_eq!(s.total.cow_breaks, 32);
}

#[test]
fn a_held_region_still_written_after_its_hold_is_never_marked_by_a_run() {
    // Two regions of one content in two processes, written a few pages
    // every wake (same bytes): both are watched, found hot and held. Then
    // most of each is rewritten with distinct data (a heap reused, say),
    // and the writes go on in the 128 pages they still share. Back at the
    // bottom the regions are poor in duplicates and not watched (the
    // bottom is not), but sampling there finds the run they share: it
    // must not be marked on the strength of "no watch, so no writes".
    let w = world();
    let (a, b) = {
        let mut m = w.borrow_mut();
        m.spawn(40, "cow", false);
        m.spawn(42, "cow", false);
        (m.map(40, &[9; 1024], false), m.map(42, &[9; 1024], false))
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let held = |d: &D| [a, b].map(|id| matches!(d.mode(id), Some(Mode::Held { .. })));
    let mut rewritten = false;
    // 150 s: the unwatched marks came at 18 and 36 s. Later, a watch at an
    // upper level judged the 128 written pages cold in 5 runs of 60 (at 69
    // and 134 s, the hashbrown seed varying the runs): the sampled
    // duplicate share had missed them, and the verdict's early "few
    // writes" weighed the writes by it alone; it now counts them on the
    // sweep's map too (core::pipeline::write_watch), and 200 of 200 runs
    // passed.
    for i in 0..1500u32 {
        {
            let mut m = w.borrow_mut();
            let span = if rewritten { 128 } else { 1024 };
            for k in 0..4 {
                let page = (i * 4 + k) % span;
                for id in [a, b] {
                    m.mem.write(PageRef { region: id, page }, 9).unwrap();
                }
            }
        }
        let s = run(&mut d, &mut now, 1);
        if !rewritten && held(&d) == [true, true] {
            rewritten = true;
            let mut m = w.borrow_mut();
            for (n, id) in [a, b].into_iter().enumerate() {
                for page in 128..1024u32 {
                    let c = 1_000_000 * (n as u64 + 1) + u64::from(page);
                    m.mem.write(PageRef { region: id, page }, c).unwrap();
                }
            }
        }
        assert!(
            s[0].run_marks.is_empty(),
            "a run of a written region was marked at {:.1} s: {:?}",
            now as f64 / SEC as f64,
            s[0].run_marks
        );
    }
    assert!(rewritten, "not held for their writes");
    let m = w.borrow();
    assert!(!m.spans[&a].mergeable && !m.spans[&b].mergeable);
    assert!(m.batches.is_empty(), "{:?}", m.batches);
}

/// A process that maps a 1024-page region of one content, keeps it
/// `life`, unmaps it and maps the next one `life` later, for `wakes`
/// wakes. Whether each cycle's region was marked while it lived.
fn cycles(toml: &str, life: Nanos, wakes: usize) -> Vec<bool> {
    let w = world();
    w.borrow_mut().spawn(50, "cycler", false);
    let mut d = daemon(&w, &format!("{toml}[eligible]\nall = true\n"), &[]);
    let (mut now, mut marked) = (0, Vec::new());
    let mut current: Option<(RegionId, Nanos)> = None;
    let mut next_map = 0;
    for _ in 0..wakes {
        match current {
            None if now >= next_map => {
                let id = w.borrow_mut().map(50, &[9; 1024], false);
                current = Some((id, now));
                marked.push(false);
            }
            Some((id, at)) if now >= at + life => {
                w.borrow_mut().unmap(id);
                current = None;
                next_map = now + life;
            }
            _ => {}
        }
        run(&mut d, &mut now, 1);
        if let Some((id, _)) = current {
            let m = w.borrow();
            *marked.last_mut().unwrap() |=
                m.spans[&id].mergeable || (0..1024).any(|p| m.page_mergeable(id, p));
        }
    }
    marked
}

#[test]
fn regions_of_a_process_whose_regions_die_young_are_not_marked() {
    // Each region lives 8 s, long enough to climb to the top and be marked
    // (the first one is: nothing was known of the process yet). Once one
    // died at 8 s, the next ones are expected to die young too, and wait
    // until they outlive 3 x 8 s, which they never do.
    let marked = cycles("", 8 * SEC, 1000);
    assert!(marked.len() >= 6, "{marked:?}");
    assert!(marked[0], "the first region was not marked: {marked:?}");
    assert!(marked[1..].iter().all(|m| !m), "{marked:?}");
    // The short-lived profile's setting marks them all.
    let marked = cycles("[actuate]\nskip_short_lived = false\n", 8 * SEC, 1000);
    assert!(marked.iter().all(|m| *m), "{marked:?}");
}

#[test]
fn a_region_that_outlives_its_process_s_early_deaths_is_marked() {
    // Regions of 8 s, then one that stays: it waits until 24 s, then is
    // marked as any other.
    let marked = cycles("", 8 * SEC, 300);
    assert!(marked[0]);
    let w = world();
    w.borrow_mut().spawn(50, "cycler", false);
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let first = w.borrow_mut().map(50, &[9; 1024], false);
    run(&mut d, &mut now, 80);
    w.borrow_mut().unmap(first);
    run(&mut d, &mut now, 10);
    let kept = w.borrow_mut().map(50, &[9; 1024], false);
    let mapped_at = now;
    let mut marked_at = None;
    let mut hidden = false;
    for _ in 0..600 {
        run(&mut d, &mut now, 1);
        // Meanwhile it is out of the ladder: neither sampled nor climbing.
        hidden |= d.distiller().ladder().level_of(kept).is_none();
        if w.borrow().spans[&kept].mergeable {
            marked_at = Some(now - mapped_at);
            break;
        }
    }
    let at = marked_at.expect("the lasting region was never marked");
    assert!(
        at > 24 * SEC,
        "marked at {} ms, before it outlived 3 x 8 s",
        at / 1_000_000
    );
    assert!(hidden, "sampled on the ladder while it waited");
}

/// Between checks, the regions the lifespan rule judges take turns to be
/// looked at for renewal (`Daemon::renewal_turn`): 40 young regions, 16 a
/// wake-up, are all looked at within three turns, none twice before every
/// one has been.
#[test]
fn young_regions_take_turns_to_be_looked_at_for_renewal() {
    use crate::daemon::RENEWAL_LOOKS_PER_WAKE;
    use std::collections::BTreeSet;
    let w = world();
    let ids: BTreeSet<RegionId> = {
        let mut m = w.borrow_mut();
        m.spawn(40, "cow", false);
        (0..40u64).map(|k| m.map(40, &[k; 512], false)).collect()
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    run(&mut d, &mut now, 1);
    let turns: Vec<BTreeSet<RegionId>> = (0..3).map(|_| d.renewal_turn(now)).collect();
    assert!(turns.iter().all(|t| t.len() == RENEWAL_LOOKS_PER_WAKE));
    assert!(turns[0].is_disjoint(&turns[1]), "{turns:?}");
    let all: BTreeSet<RegionId> = turns.iter().flatten().copied().collect();
    assert_eq!(all, ids);
    // The third turn wrapped around to the first regions.
    assert_eq!(turns[2].intersection(&turns[0]).count(), 8, "{turns:?}");
}

/// What a [`TestJournal`] was given: the batches the actuator had run by
/// then, the pid, the ranges.
type Intents = std::rc::Rc<std::cell::RefCell<Vec<(usize, u32, Vec<(u64, u64)>)>>>;

/// Journal of a test: what was written ahead, with how many batches the
/// actuator had run by then; or a refusal.
struct TestJournal {
    world: Shared,
    intents: Intents,
    refuse: bool,
}

impl crate::actuate::Journal for TestJournal {
    fn intend(
        &mut self,
        key: crate::actuate::ProcKey,
        ranges: &[(u64, u64)],
    ) -> Result<(), String> {
        if self.refuse {
            return Err("cannot write the ledger: read-only file system".into());
        }
        let ran = self.world.borrow().batches.len();
        self.intents
            .borrow_mut()
            .push((ran, key.pid, ranges.to_vec()));
        Ok(())
    }
}

#[test]
fn every_mark_is_written_ahead_before_its_batch_runs() {
    let w = world();
    {
        let mut m = w.borrow_mut();
        m.spawn(60, "twins", false);
        m.map(60, &[5; 512], false);
        m.map(60, &[6; 256], false);
    }
    let intents = Intents::default();
    let mut d = daemon(&w, ALL, &[]);
    d.set_journal(Box::new(TestJournal {
        world: w.clone(),
        intents: intents.clone(),
        refuse: false,
    }));
    let mut now = 0;
    run(&mut d, &mut now, 300);
    let m = w.borrow();
    let marking: Vec<(usize, &(u32, Vec<crate::actuate::Advice>))> = (m.batches.iter())
        .enumerate()
        .filter(|(_, (_, b))| b.iter().any(|a| a.mergeable))
        .collect();
    assert!(!marking.is_empty(), "something was marked");
    let intents = intents.borrow();
    for (i, (pid, batch)) in marking {
        // Written down while exactly the batches before it had run.
        let written = intents
            .iter()
            .find(|(ran, p, _)| *ran == i && p == pid)
            .unwrap_or_else(|| panic!("batch {i} of {pid} was not written ahead: {intents:?}"));
        for a in batch.iter().filter(|a| a.mergeable) {
            assert!(
                written.2.contains(&(a.start, a.end())),
                "{a:?} missing from {written:?}"
            );
        }
    }
}

#[test]
fn nothing_is_marked_when_the_marks_cannot_be_written_ahead() {
    let w = world();
    let dup = {
        let mut m = w.borrow_mut();
        m.spawn(61, "twins", false);
        m.map(61, &[5; 512], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    d.set_journal(Box::new(TestJournal {
        world: w.clone(),
        intents: Default::default(),
        refuse: true,
    }));
    let mut now = 0;
    run(&mut d, &mut now, 300);
    let m = w.borrow();
    assert!(!m.spans[&dup].mergeable);
    assert!(
        m.batches
            .iter()
            .all(|(_, b)| b.iter().all(|a| !a.mergeable)),
        "{:?}",
        m.batches
    );
    drop(m);
    let st = d.status(now);
    let s = (st.skipped.iter())
        .find(|s| s.pid == 61)
        .expect("listed as skipped");
    assert!(s.reason.contains("cannot write the ledger"), "{}", s.reason);
}

/// The refresh after a mark reads the marked process only, and one that
/// comes is read alone; what only a full refresh sorts out still gets
/// one.
#[test]
fn the_refresh_after_a_mark_is_of_the_marked_process_only() {
    let w = world();
    let id = {
        let mut m = w.borrow_mut();
        m.spawn(10, "marked", false);
        m.spawn(11, "bystander", false);
        m.map(11, &(0..1024).collect::<Vec<u64>>(), false);
        m.map(10, &[7; 1024], false)
    };
    let mut d = daemon(&w, ALL, &[]);
    let mut now = 0;
    let mut marked_at = None;
    for _ in 0..300 {
        run(&mut d, &mut now, 1);
        if marked_at.is_none() && w.borrow().spans[&id].mergeable {
            marked_at = Some(w.borrow().refreshes.len());
        }
    }
    let from = marked_at.expect("the duplicate region was marked");
    let after: Vec<_> = w.borrow().refreshes[from..].to_vec();
    assert_eq!(
        after.first(),
        Some(&Some(vec![10])),
        "the first refresh after the mark: {after:?}"
    );
    assert!(
        !after.iter().flatten().any(|pids| pids.contains(&11)),
        "the unmarked process is in no refresh of some processes: {after:?}"
    );
    // A process that comes is read at the next refresh of some processes,
    // alone.
    w.borrow_mut().spawn(12, "newcomer", false);
    w.borrow_mut().came_or_went.insert(12);
    let n = w.borrow().refreshes.len();
    run(&mut d, &mut now, 20);
    assert_eq!(
        w.borrow().refreshes[n..].first(),
        Some(&Some(vec![12])),
        "{:?}",
        &w.borrow().refreshes[n..]
    );
    // A change only a full refresh sorts out gets one.
    w.borrow_mut().maps_changed = true;
    let n = w.borrow().refreshes.len();
    run(&mut d, &mut now, 100);
    assert!(
        w.borrow().refreshes[n..].contains(&None),
        "{:?}",
        &w.borrow().refreshes[n..]
    );
}
