//! End-to-end: the four region kinds of UKSM §5.1 through ladder + hash +
//! index, on the in-memory machine, deterministic for a seed.

use pagesift_core::pipeline::ladder::Move;
use pagesift_core::research::sim::{Kind, SimConfig, Simulation, Step};

const SECOND: u64 = 1_000_000_000;

fn run(seed: u64, seconds: u64) -> (Simulation, Vec<Step>) {
    let mut config = SimConfig {
        seed,
        ..SimConfig::default()
    };
    config.distiller.seed = seed;
    let mut sim = Simulation::new(config);
    let mut steps = Vec::new();
    while sim.now() < seconds * SECOND {
        steps.push(sim.step());
    }
    (sim, steps)
}

fn top(sim: &Simulation) -> usize {
    sim.distiller().ladder().levels() - 1
}

#[test]
fn statically_duplicated_regions_reach_the_top_within_a_few_rounds() {
    let (sim, steps) = run(1, 20);
    let top = top(&sim);
    let n = SimConfig::default().regions_per_kind;
    // The global round in which every static region first sits on the top level.
    let mut rounds = 0;
    let reached = steps.iter().find(|s| {
        rounds += s.wake.global_round_ended as u32;
        s.levels[&Kind::Static][top] == n
    });
    let reached = reached.expect("static regions never all reached the top level");
    assert!(
        rounds <= 6,
        "static regions needed {rounds} global rounds to reach the top (at {} ms)",
        reached.now / 1_000_000
    );
    // And the ksmd model, merging the top level, merged most of them.
    let last = steps.last().unwrap();
    let static_pages = (n as u64) * SimConfig::default().region_pages as u64;
    assert!(
        last.merged_pages >= static_pages * 9 / 10,
        "only {} of {static_pages} static pages merged",
        last.merged_pages
    );
}

#[test]
fn sparse_regions_stay_at_the_bottom() {
    let (_, steps) = run(2, 20);
    for s in &steps {
        let sparse = &s.levels[&Kind::Sparse];
        assert_eq!(
            sparse.iter().skip(1).sum::<usize>(),
            0,
            "a sparse region left the bottom at {} ms: {sparse:?}",
            s.now / 1_000_000
        );
    }
}

#[test]
fn cow_broken_regions_are_demoted() {
    let (sim, steps) = run(3, 30);
    let top = top(&sim);
    let drops = steps
        .iter()
        .flat_map(|s| &s.kind_moves)
        .filter(|(k, m)| {
            *k == Kind::CowBroken && matches!(m, Move::Drop { .. } | Move::Bottom { .. })
        })
        .count();
    assert!(drops > 0, "no COW-broken region was ever demoted");
    // They never settle on the upper levels: at most a fifth of the
    // region-steps above level 1, where static regions are promoted. (A
    // region that climbs into a level mid-round is judged only after the
    // level's next whole round, so each climb costs up to a round and a
    // half there: 14 % of the steps with seed 3. Until 2026-11-27 such a
    // region was dropped at the end of the round it joined, whatever its
    // samples said, and this bound was a tenth.)
    let high: usize = steps
        .iter()
        .map(|s| s.levels[&Kind::CowBroken][2..=top].iter().sum::<usize>())
        .sum();
    let all = steps.len() * SimConfig::default().regions_per_kind;
    assert!(
        high * 5 <= all,
        "COW-broken regions spent {high} of {all} region-steps on levels 2 and up"
    );
}

#[test]
fn short_lived_regions_never_climb() {
    let (_, steps) = run(4, 20);
    for s in &steps {
        let climbs: Vec<_> = s
            .kind_moves
            .iter()
            .filter(|(k, m)| *k == Kind::ShortLived && matches!(m, Move::Climb { .. }))
            .collect();
        assert!(
            climbs.is_empty(),
            "short-lived region climbed at {} ms: {climbs:?}",
            s.now / 1_000_000
        );
    }
}

#[test]
fn pages_sampled_stay_within_the_governors_budget() {
    let (_, steps) = run(5, 20);
    for s in &steps {
        for (level, (&sampled, &budget)) in s.wake.sampled.iter().zip(&s.wake.budget).enumerate() {
            assert!(
                sampled <= budget,
                "level {level} sampled {sampled} pages over a budget of {budget}"
            );
        }
    }
    // And the budget was actually used: the bottom level is never starved.
    let bottom: u64 = steps.iter().map(|s| s.wake.sampled[0]).sum();
    assert!(bottom > 0, "the bottom level was never sampled");
}

#[test]
fn the_simulation_is_deterministic_for_a_seed() {
    let (_, a) = run(9, 5);
    let (_, b) = run(9, 5);
    let key = |s: &Step| {
        (
            s.now,
            s.wake.sampled.clone(),
            s.levels.clone(),
            s.merged_pages,
        )
    };
    assert_eq!(
        a.iter().map(key).collect::<Vec<_>>(),
        b.iter().map(key).collect::<Vec<_>>()
    );
}
