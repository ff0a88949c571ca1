//! Avalanche analysis of the progressive hash (UKSM §6.2, Figure 6) and the
//! cost of its steps, printed as markdown.
//!
//! For both candidate shift pairs, (19, 16) from the paper and (8, 12) from
//! the released patch, and for SuperFastHash, the paper's baseline: the
//! full 32768 x 32 bias matrix over random pages
//! ([`pagesift_core::research::avalanche`]), with bad points, mean and max |bias|
//! and how far from the end of the hashing order the bad points reach.
//! Then the cost of a forward and an inverse step, measured with
//! `std::time::Instant` (the fastest of many rounds, so that other load on
//! the machine inflates it as little as possible). Then, unless
//! `--sweep-tail 0`, the paper's exhaustive search over all (left, right)
//! pairs, measured on the last words of the hashing order.
//!
//! Run: `cargo run --release -p pagesift-core --example avalanche [-- --help]`.
//! `scripts/bench-hash` runs it and pastes the output into
//! docs/benchmarks.md.

use std::hint::black_box;
use std::process::ExitCode;
use std::time::Instant;

use pagesift_core::pipeline::hash::{PartialHasher, STRENGTH_FULL, Shifts};
use pagesift_core::research::avalanche::{
    AvalancheConfig, AvalancheReport, DEFAULT_TRIALS, PAPER_THRESHOLD, avalanche,
    avalanche_progressive, avalanche_words, ideal_exceed_probability, ideal_mean_abs_bias,
    sweep_shift_pairs, threshold_for_sigmas,
};
use pagesift_core::research::superfasthash::{super_fast_hash, super_fast_hash_page};
use pagesift_core::{PAGE_SIZE, PageWords, WORDS_PER_PAGE};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Seed of the offset permutation (any fixed seed: the avalanche of a
/// random permutation does not depend on which one).
const PERMUTATION_SEED: u64 = 0x5eed;

/// Words at the end of the hashing order that the finer analysis covers.
const FINE_TAIL: usize = 64;

const USAGE: &str = "\
usage: avalanche [--trials T] [--threshold N] [--seed S] [--sweep-tail W]

  --trials T      random keys per key bit (default 100)
  --threshold N   |bias| above N is a bad point (default 50, the paper's;
                  with --trials and no --threshold: 5 sqrt(T))
  --seed S        seed of the random keys (default 0)
  --sweep-tail W  sweep all (left, right) pairs on the last W words hashed
                  (default 64; 0 skips the sweep)";

struct Args {
    config: AvalancheConfig,
    sweep_tail: usize,
}

fn parse_args() -> Result<Option<Args>, String> {
    let mut trials = None;
    let mut threshold = None;
    let mut seed = 0u64;
    let mut sweep_tail = 64usize;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        if arg == "--help" || arg == "-h" {
            return Ok(None);
        }
        let mut value = |name: &str| -> Result<u64, String> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            v.parse()
                .map_err(|_| format!("{name}: '{v}' is not a non-negative integer"))
        };
        match arg.as_str() {
            "--trials" => trials = Some(value("--trials")?),
            "--threshold" => threshold = Some(value("--threshold")?),
            "--seed" => seed = value("--seed")?,
            "--sweep-tail" => sweep_tail = value("--sweep-tail")? as usize,
            other => return Err(format!("unknown argument '{other}'")),
        }
    }
    let trials = u32::try_from(trials.unwrap_or(DEFAULT_TRIALS as u64))
        .ok()
        .filter(|&t| t >= 1)
        .ok_or("--trials must be in 1..2^32")?;
    let threshold = match threshold {
        Some(t) => u32::try_from(t).map_err(|_| "--threshold is too large")?,
        None if trials == DEFAULT_TRIALS => PAPER_THRESHOLD,
        None => threshold_for_sigmas(trials, 5.0),
    };
    if sweep_tail > WORDS_PER_PAGE {
        return Err(format!("--sweep-tail must be at most {WORDS_PER_PAGE}"));
    }
    Ok(Some(Args {
        config: AvalancheConfig {
            trials,
            threshold,
            seed,
        },
        sweep_tail,
    }))
}

/// Fastest per-call time in ns over `rounds` rounds of `calls` calls.
fn min_ns_per_call(rounds: usize, calls: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..calls {
        f(); // warm-up
    }
    let mut best = f64::INFINITY;
    for _ in 0..rounds {
        let t = Instant::now();
        for _ in 0..calls {
            f();
        }
        best = best.min(t.elapsed().as_nanos() as f64 / calls as f64);
    }
    best
}

fn random_page(seed: u64) -> Box<PageWords> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut page = Box::new([0u32; WORDS_PER_PAGE]);
    for w in page.iter_mut() {
        *w = rng.next_u32();
    }
    page
}

/// murmur3's 32-bit finaliser (a bijection of u32).
fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^ (h >> 16)
}

/// How many of the last words in hashing order hold bad points: rows are
/// in hashing order, so this is the distance from the end of the earliest
/// row with a bad point.
fn bad_tail(report: &AvalancheReport) -> usize {
    let rows = report.words().len();
    (0..rows)
        .find(|&row| report.bad_points_in_row(row) > 0)
        .map_or(0, |row| rows - row)
}

struct Row {
    name: String,
    report: AvalancheReport,
    forward_ns: f64,
    inverse_ns: Option<f64>,
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("avalanche: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let config = args.config;
    let start = Instant::now();
    let progress = |what: &str| eprintln!("[{:6.1} s] {what}", start.elapsed().as_secs_f64());

    let page = random_page(1);
    let bytes: Vec<u8> = page.iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(bytes.len(), PAGE_SIZE);
    let (rounds, calls) = (100, 200);

    let mut rows = Vec::new();
    for (name, shifts) in [("paper", Shifts::PAPER), ("released", Shifts::RELEASED)] {
        progress(&format!("full matrix, progressive hash {name} {shifts:?}"));
        let h = PartialHasher::new(PERMUTATION_SEED, shifts);
        let report = avalanche_progressive(&h, config, WORDS_PER_PAGE);
        let full = h.hash(&page, STRENGTH_FULL);
        let forward_ns = min_ns_per_call(rounds, calls, || {
            black_box(h.hash(black_box(&page), black_box(STRENGTH_FULL)));
        }) / WORDS_PER_PAGE as f64;
        let inverse_ns = min_ns_per_call(rounds, calls, || {
            black_box(h.rehash(black_box(&page), black_box(full), STRENGTH_FULL, 0));
        }) / WORDS_PER_PAGE as f64;
        rows.push(Row {
            name: format!("progressive ({}, {}) [{name}]", shifts.left, shifts.right),
            report,
            forward_ns,
            inverse_ns: Some(inverse_ns),
        });
    }
    progress("full matrix, SuperFastHash");
    let report = avalanche(super_fast_hash_page, config);
    let forward_ns = min_ns_per_call(rounds, calls, || {
        black_box(super_fast_hash(black_box(&bytes)));
    }) / WORDS_PER_PAGE as f64;
    rows.push(Row {
        name: "SuperFastHash".into(),
        report,
        forward_ns,
        inverse_ns: None,
    });

    let points = rows[0].report.points();
    println!(
        "Full bias matrix ({} key bits x 32 hash bits = {points} points), {} random pages per key bit \
         (seed {}), bad point = |bias| > {}. An ideal hash has mean |bias| {:.2} and {:.2} bad points \
         on average (each point exceeds with probability {:.2e}). Step costs: fastest of {rounds} \
         rounds of {calls} full pages, divided by 1024 words (SuperFastHash: per 4-byte block).",
        points / 32,
        config.trials,
        config.seed,
        config.threshold,
        ideal_mean_abs_bias(config.trials),
        points as f64 * ideal_exceed_probability(config.trials, config.threshold),
        ideal_exceed_probability(config.trials, config.threshold),
    );
    println!();
    println!(
        "| hash (left, right) | bad points | mean abs bias | max abs bias | bad points within the last N words hashed | forward ns/word | inverse ns/word |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {:.2} | {} | {} | {:.3} | {} |",
            r.name,
            r.report.bad_points(),
            r.report.mean_abs_bias(),
            r.report.max_abs_bias(),
            bad_tail(&r.report),
            r.forward_ns,
            r.inverse_ns.map_or("n/a".into(), |ns| format!("{ns:.3}")),
        );
    }

    // A finer look at the end of the hashing order, where all the bad
    // points above are: 10x the trials, so a 5-sigma threshold catches much
    // milder biases (|2p - 1| > 0.16 instead of 0.5).
    let fine = AvalancheConfig {
        trials: 10 * config.trials,
        threshold: threshold_for_sigmas(10 * config.trials, 5.0),
        seed: config.seed,
    };
    let tail_words: Vec<u16> = (WORDS_PER_PAGE - FINE_TAIL..WORDS_PER_PAGE)
        .map(|w| w as u16)
        .collect();
    progress(&format!(
        "fine look at the last {FINE_TAIL} words, {} trials",
        fine.trials
    ));
    let mut fine_rows = Vec::new();
    for shifts in [Shifts::PAPER, Shifts::RELEASED] {
        let h = PartialHasher::new(PERMUTATION_SEED, shifts);
        fine_rows.push((
            format!("progressive ({}, {})", shifts.left, shifts.right),
            avalanche_progressive(&h, fine, FINE_TAIL),
        ));
    }
    // The same hash behind murmur3's 32-bit finaliser, a bijection: it
    // cannot add or remove a single collision, so this row shows how much of
    // the tail bias is just the missing final mix.
    let h = PartialHasher::new(PERMUTATION_SEED, Shifts::DEFAULT);
    fine_rows.push((
        format!(
            "progressive ({}, {}) then fmix32",
            Shifts::DEFAULT.left,
            Shifts::DEFAULT.right
        ),
        avalanche_words(
            |p| fmix32(h.hash(p, STRENGTH_FULL)),
            fine,
            &h.offsets()[WORDS_PER_PAGE - FINE_TAIL..],
        ),
    ));
    // SuperFastHash reads the page in order: its last words are the last ones.
    fine_rows.push((
        "SuperFastHash".into(),
        avalanche_words(super_fast_hash_page, fine, &tail_words),
    ));
    println!();
    println!(
        "The last {FINE_TAIL} words hashed ({} points), {} random pages per key bit, bad point = \
         |bias| > {} (5 sqrt(T)); an ideal hash has mean |bias| {:.2} and {:.3} bad points on average.",
        FINE_TAIL * 32 * 32,
        fine.trials,
        fine.threshold,
        ideal_mean_abs_bias(fine.trials),
        (FINE_TAIL * 32 * 32) as f64 * ideal_exceed_probability(fine.trials, fine.threshold),
    );
    println!();
    println!(
        "| hash (left, right) | bad points | mean abs bias | max abs bias | bad points within the last N words hashed |"
    );
    println!("|---|---:|---:|---:|---:|");
    for (name, r) in &fine_rows {
        println!(
            "| {name} | {} | {:.2} | {} | {} |",
            r.bad_points(),
            r.mean_abs_bias(),
            r.max_abs_bias(),
            bad_tail(r)
        );
    }

    if args.sweep_tail > 0 {
        progress(&format!(
            "sweep of all 961 pairs on the last {} words",
            args.sweep_tail
        ));
        let sweep = sweep_shift_pairs(PERMUTATION_SEED, config, args.sweep_tail);
        let rank = |s: Shifts| sweep.iter().position(|e| e.shifts == s).unwrap() + 1;
        let truncated = sweep.iter().filter(|e| e.truncated).count();
        println!();
        println!(
            "Sweep of all (left, right) in 1..32 x 1..32, on the last {} words of the hashing order \
             ({} points per pair; same keys and threshold). Best first. (19, 16) ranks {} and (8, 12) \
             ranks {} of 961. {truncated} pairs still had bad points at the window's first word, so \
             their counts are lower bounds (marked >=).",
            args.sweep_tail,
            args.sweep_tail * 32 * 32,
            rank(Shifts::PAPER),
            rank(Shifts::RELEASED),
        );
        println!();
        println!("| rank | (left, right) | bad points | mean abs bias |");
        println!("|---:|---|---:|---:|");
        let shown: Vec<usize> = (0..10)
            .chain([rank(Shifts::PAPER) - 1, rank(Shifts::RELEASED) - 1])
            .filter(|&i| i < sweep.len())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        for i in shown {
            let e = &sweep[i];
            println!(
                "| {} | ({}, {}) | {}{} | {:.2} |",
                i + 1,
                e.shifts.left,
                e.shifts.right,
                if e.truncated { ">=" } else { "" },
                e.bad_points,
                e.mean_abs_bias
            );
        }
    }
    progress("done");
    ExitCode::SUCCESS
}
