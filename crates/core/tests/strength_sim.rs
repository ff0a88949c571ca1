//! The strength controller driven by simulated page populations.
//!
//! Pages come from `InMemorySource` (all-distinct pages by default,
//! near-identical ones with `set_differing_words`) and are hashed with the
//! real `PartialHasher` at the controller's strength. Each round samples `N`
//! pages, buckets them by hash in a `HashMap`, and counts one false
//! collision whenever a page lands in a bucket that holds no page with the
//! same content (one futile full comparison against a resident). Hashes of
//! the whole population are kept at the current strength and moved with
//! `rehash` when the strength changes, as the index will do.

use pagesift_core::pipeline::hash::{PartialHasher, STRENGTH_FULL, Shifts};
use pagesift_core::pipeline::strength::{
    ControllerState, StrengthConfig, StrengthController, Trigger,
};
use pagesift_core::source::{InMemorySource, MemorySource};
use pagesift_core::{PageRef, PageWords, WORDS_PER_PAGE};
use rand::SeedableRng;
use rand::seq::index::sample;
use rand_chacha::ChaCha8Rng;
use std::collections::HashMap;

/// Pages in a population.
const POPULATION: usize = 2000;
/// Pages sampled per round.
const SAMPLED: usize = 500;

struct Population {
    pages: Vec<Box<PageWords>>,
    content: Vec<u64>,
}

/// `POPULATION` pages from an `InMemorySource`. Content ids are drawn from
/// `id_base + 0..POPULATION * 9 / 10`, so about a tenth of the pages are
/// exact duplicates of another: true matches, which must never count as
/// false collisions. `differing_words = None` gives pages that differ
/// everywhere.
fn population(differing_words: Option<u32>, id_base: u64, seed: u64) -> Population {
    let mut src = InMemorySource::new();
    if let Some(n) = differing_words {
        src.set_differing_words(n);
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let distinct = (POPULATION * 9 / 10) as u64;
    let mut content: Vec<u64> = (0..POPULATION as u64)
        .map(|i| id_base + i % distinct)
        .collect();
    rand::seq::SliceRandom::shuffle(&mut content[..], &mut rng);
    let region = src.map(1, &content);
    let pages = (0..POPULATION as u32)
        .map(|page| {
            let mut b = Box::new([0u32; WORDS_PER_PAGE]);
            src.read_page(PageRef { region, page }, &mut b).unwrap();
            b
        })
        .collect();
    Population { pages, content }
}

struct Sim {
    hasher: PartialHasher,
    pop: Population,
    /// Hash of every page of `pop` at strength `at`.
    hashes: Vec<u32>,
    at: u32,
    rng: ChaCha8Rng,
}

/// What one round saw.
#[derive(Clone, Copy, Debug)]
struct Round {
    strength: u32,
    false_collisions: u64,
    true_matches: u64,
    benefit: f64,
}

impl Sim {
    fn new(pop: Population, strength: u32, seed: u64) -> Self {
        let hasher = PartialHasher::new(seed, Shifts::PAPER);
        let hashes = pop.pages.iter().map(|p| hasher.hash(p, strength)).collect();
        Sim {
            hasher,
            pop,
            hashes,
            at: strength,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed),
        }
    }

    fn replace_population(&mut self, pop: Population) {
        self.hashes = pop
            .pages
            .iter()
            .map(|p| self.hasher.hash(p, self.at))
            .collect();
        self.pop = pop;
    }

    /// Moves every stored hash to `strength` (progressive hash).
    fn sync(&mut self, strength: u32) {
        if strength != self.at {
            for (h, p) in self.hashes.iter_mut().zip(&self.pop.pages) {
                *h = self.hasher.rehash(p, *h, self.at, strength);
            }
            self.at = strength;
        }
    }

    /// Samples and buckets one round at `strength`; returns (false
    /// collisions, true matches).
    fn sample(&mut self, strength: u32) -> (u64, u64) {
        self.sync(strength);
        let mut buckets: HashMap<u32, Vec<u64>> = HashMap::new();
        let (mut false_collisions, mut true_matches) = (0, 0);
        for i in sample(&mut self.rng, POPULATION, SAMPLED) {
            let bucket = buckets.entry(self.hashes[i]).or_default();
            let content = self.pop.content[i];
            if bucket.contains(&content) {
                true_matches += 1;
            } else if !bucket.is_empty() {
                false_collisions += 1;
            }
            bucket.push(content);
        }
        (false_collisions, true_matches)
    }

    /// One round driven by the controller.
    fn round(&mut self, c: &mut StrengthController) -> Round {
        let strength = c.strength();
        let (false_collisions, true_matches) = self.sample(strength);
        c.on_hashed(SAMPLED as u64);
        for _ in 0..false_collisions {
            c.on_false_collision();
        }
        let benefit = c.benefit();
        c.end_round();
        Round {
            strength,
            false_collisions,
            true_matches,
            benefit,
        }
    }

    /// Mean benefit per page of a fixed strength over `rounds` rounds, with
    /// the controller's cost model.
    fn fixed(&mut self, strength: u32, memcmp_cost: u32, rounds: usize) -> (f64, f64) {
        let (mut benefit, mut rate) = (0.0, 0.0);
        for _ in 0..rounds {
            let (fc, _) = self.sample(strength);
            let profit = f64::from(STRENGTH_FULL - strength) * SAMPLED as f64;
            let penalty = fc as f64 * f64::from(memcmp_cost + 2 * strength);
            benefit += (profit - penalty) / SAMPLED as f64;
            rate += fc as f64 / SAMPLED as f64;
        }
        (benefit / rounds as f64, rate / rounds as f64)
    }
}

fn run(sim: &mut Sim, c: &mut StrengthController, rounds: usize) -> Vec<Round> {
    (0..rounds).map(|_| sim.round(c)).collect()
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.collect();
    v.iter().sum::<f64>() / v.len() as f64
}

/// Causes of the probes started while running `rounds` rounds, with the
/// round index at which each began.
fn run_watching(
    sim: &mut Sim,
    c: &mut StrengthController,
    rounds: usize,
) -> (Vec<Round>, Vec<(usize, Trigger)>) {
    let mut probes = vec![];
    let mut out = vec![];
    for i in 0..rounds {
        let was_probing = matches!(c.state(), ControllerState::Probing { .. });
        out.push(sim.round(c));
        if let ControllerState::Probing { cause, .. } = *c.state()
            && !was_probing
        {
            probes.push((i, cause));
        }
    }
    (out, probes)
}

#[test]
fn converges_to_one_on_distinct_pages() {
    let mut sim = Sim::new(population(None, 1, 11), 64, 11);
    let mut c = StrengthController::new(StrengthConfig::default());
    let rounds = run(&mut sim, &mut c, 60);
    let first_at_one = rounds.iter().position(|r| r.strength == 1).unwrap();
    let tail = &rounds[30..];
    let at_one = tail.iter().filter(|r| r.strength == 1).count();
    let highest = tail.iter().map(|r| r.strength).max().unwrap();
    println!(
        "distinct: first round at 1: {first_at_one}; last 30 rounds: {at_one} at strength 1, highest {highest}, mean {:.2}",
        mean(tail.iter().map(|r| f64::from(r.strength)))
    );
    assert!(first_at_one <= 10, "reached 1 only at round {first_at_one}");
    // Stable at 1 re-probes after two quiet rounds (trigger 2): one round
    // in four at strength 2, the rest at 1.
    assert!(at_one >= 22, "{at_one} of 30 rounds at strength 1");
    assert!(highest <= 2, "strength rose to {highest}");
    // Exact duplicates were sampled but never charged as false collisions.
    assert!(tail.iter().map(|r| r.true_matches).sum::<u64>() > 0);
    assert_eq!(tail.iter().map(|r| r.false_collisions).sum::<u64>(), 0);
}

#[test]
fn climbs_on_near_identical_pages_and_settles_near_the_best_fixed_strength() {
    let cfg = StrengthConfig::default();
    let mut sim = Sim::new(population(Some(4), 1, 12), cfg.initial, 12);

    // The landscape, for reference: benefit of fixed strengths.
    let mut best = (0, f64::MIN, 0.0);
    for s in (1..=STRENGTH_FULL).step_by(32).chain([STRENGTH_FULL]) {
        let (b, rate) = sim.fixed(s, cfg.memcmp_cost, 4);
        if b > best.1 {
            best = (s, b, rate);
        }
    }
    let (b1, rate1) = sim.fixed(1, cfg.memcmp_cost, 4);

    let mut c = StrengthController::new(cfg);
    let rounds = run(&mut sim, &mut c, 200);
    let tail = &rounds[100..];
    let mean_strength = mean(tail.iter().map(|r| f64::from(r.strength)));
    let mean_benefit = mean(tail.iter().map(|r| r.benefit));
    let rate = mean(
        tail.iter()
            .map(|r| r.false_collisions as f64 / SAMPLED as f64),
    );
    let final_strength = c.strength();
    println!(
        "near-identical (4 words): strength 1 benefit {b1:.0}, false collisions {:.1} %; best fixed strength {} benefit {:.0}, {:.1} %",
        rate1 * 100.0,
        best.0,
        best.1,
        best.2 * 100.0
    );
    println!(
        "controller, rounds 100-199: mean strength {mean_strength:.0}, mean benefit {mean_benefit:.0}, false collisions {:.1} %; final strength {final_strength}, state {:?}",
        rate * 100.0,
        c.state()
    );
    assert!(rate1 > 0.9, "strength 1 should collide almost always");
    assert!(final_strength >= 200, "final strength {final_strength}");
    assert!(mean_strength >= 200.0, "mean strength {mean_strength}");
    assert!(
        rate < 0.15,
        "false collisions at the settled strength: {rate}"
    );
    assert!(
        mean_benefit >= 0.85 * best.1,
        "mean benefit {mean_benefit:.0} vs best fixed {:.0}",
        best.1
    );
    // It settled: the tail is mostly stable rounds near one strength.
    let spread = tail
        .iter()
        .filter(|r| (f64::from(r.strength) - mean_strength).abs() > 100.0)
        .count();
    println!("rounds more than 100 words off the mean strength: {spread} of 100");
    assert!(
        spread <= 20,
        "{spread} of 100 rounds more than 100 words off the mean"
    );
}

/// Runs rounds until the controller is in the stable state (at most
/// `limit`).
fn run_until_stable(sim: &mut Sim, c: &mut StrengthController, limit: usize) {
    for _ in 0..limit {
        if matches!(c.state(), ControllerState::Stable { .. }) {
            return;
        }
        sim.round(c);
    }
    panic!("not stable after {limit} rounds: {:?}", c.state());
}

#[test]
fn probes_again_when_the_population_changes() {
    let cfg = StrengthConfig::default();
    let mut sim = Sim::new(population(None, 1, 13), cfg.initial, 13);
    let mut c = StrengthController::new(cfg);

    run(&mut sim, &mut c, 40);
    run_until_stable(&mut sim, &mut c, 10);
    assert_eq!(c.strength(), 1, "distinct pages");

    // Near-identical pages appear: at strength 1 almost everything collides,
    // the benefit falls from ~1023 to below 0.
    sim.replace_population(population(Some(4), 100_000, 14));
    let (rounds, probes) = run_watching(&mut sim, &mut c, 150);
    let climbed_at = rounds.iter().position(|r| r.strength >= 200);
    println!(
        "to near-identical: probes {:?}, strength >= 200 from round {climbed_at:?}, after {} rounds: {}",
        &probes[..probes.len().min(5)],
        rounds.len(),
        c.strength()
    );
    assert_eq!(probes.first(), Some(&(0, Trigger::Deviation)), "{probes:?}");
    assert!(
        climbed_at.is_some_and(|i| i <= 30),
        "climbed at {climbed_at:?}"
    );
    assert!(
        c.strength() >= 200,
        "near-identical pages: strength {}",
        c.strength()
    );

    // Back to distinct pages: no collisions, the strength must come down.
    run_until_stable(&mut sim, &mut c, 100);
    sim.replace_population(population(None, 200_000, 15));
    let (rounds, probes) = run_watching(&mut sim, &mut c, 80);
    let down_at = rounds.iter().position(|r| r.strength <= 2);
    println!(
        "back to distinct: probes {:?}, first round at strength <= 2: {down_at:?}",
        &probes[..probes.len().min(3)]
    );
    // Without collisions the benefit jumps to 1024 - strength: more than
    // 50 % above the reference starts a probe at once, less leaves it to the
    // second quiet round (with this seed, the latter).
    assert!(
        matches!(
            probes.first(),
            Some((0, Trigger::Deviation) | (1, Trigger::NoCollisions))
        ),
        "{probes:?}"
    );
    assert!(
        down_at.is_some_and(|i| i <= 30),
        "strength came down at {down_at:?}"
    );
    assert!(
        c.strength() <= 2,
        "distinct again: strength {}",
        c.strength()
    );
}

#[test]
fn the_1000_round_trigger_fires_in_a_steady_population() {
    let cfg = StrengthConfig::default();
    let mut sim = Sim::new(population(Some(4), 1, 16), cfg.initial, 16);
    let mut c = StrengthController::new(cfg);
    // Settle first, then watch for the forced probe.
    run(&mut sim, &mut c, 100);
    let ControllerState::Stable { rounds: start, .. } = *c.state() else {
        panic!("not stable after 100 rounds: {:?}", c.state());
    };
    let (rounds, probes) = run_watching(&mut sim, &mut c, 1100);
    println!("steady near-identical population: probes {probes:?}");
    let (at, cause) = probes.first().copied().expect("no probe in 1100 rounds");
    // Counting the stable rounds already behind us, the forced probe is due
    // exactly when the stable state reaches 1000 rounds, and nothing else
    // fired before it.
    assert_eq!(cause, Trigger::Periodic, "{probes:?}");
    assert_eq!(
        at as u32 + 1 + start,
        1000,
        "probe at round {at}, stable since {start}"
    );
    assert!(rounds[..at].iter().all(|r| r.false_collisions > 0));
}
