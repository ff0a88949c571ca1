//! Avalanche bias matrix of a page hash (UKSM §6.2, Figure 6).
//!
//! The paper chose the shift pair of its progressive hash by how well a
//! one-bit change of the page spreads over the 32 hash bits. The method:
//! draw a random page-sized key, flip key bit `i` (`i` in 0..32768), and for
//! every hash bit `j` add +1 to `bias(i, j)` if the bit flipped and -1 if it
//! did not. Repeat over many random keys. For an ideal hash each bit flips
//! with probability 1/2 and every entry stays near 0; a "bad point" is an
//! entry whose |bias| exceeds a threshold (the paper takes 50).
//!
//! ## Trials and threshold
//! After `T` trials an entry is `2X - T` with `X` the number of flips. For
//! an ideal hash `X ~ Binomial(T, 1/2)`, so the entry has mean 0 and
//! standard deviation `sqrt(T)`. A fixed threshold therefore means nothing
//! without `T`, which the paper does not give: with `T = 10_000` even an
//! ideal hash would put most of its 1,048,576 entries beyond 50.
//! We use `T = 100` ([`DEFAULT_TRIALS`]) with the paper's threshold 50
//! ([`PAPER_THRESHOLD`]). Then 50 is `5 sqrt(T)`, and a bad point is an
//! output bit that flipped in fewer than 25 or more than 75 of 100 trials: a
//! strong bias, not noise. An ideal hash exceeds it with probability
//! [`ideal_exceed_probability`] (about 1.8e-7 per entry, so about 0.2 bad
//! points over the whole matrix). For other `T`, scale the threshold as
//! `5 sqrt(T)` ([`threshold_for_sigmas`]) to keep the same false rate.
//!
//! ## Cost
//! The full matrix takes `32768 * T` hashes of a whole page. That is a few
//! seconds per hash function in release mode. For the progressive hash,
//! [`avalanche_progressive`] gives the same numbers at about half the cost.
//! It keeps the hash state before each position of the permutation, so a
//! flipped word only re-folds the words hashed after it. The same trick on
//! only the last words of the permutation makes a sweep over all 961
//! `(left, right)` pairs cheap ([`sweep_shift_pairs`]). That is sound
//! because a word hashed early passes through hundreds of later steps, so
//! bad points sit at the end of the permutation. The full matrices of the
//! candidate pairs check this, and the sweep flags any pair whose window
//! was too short.
//!
//! Everything here is a pure function of the hash and a seed: the keys come
//! from a seeded ChaCha8 stream, so a report is the same on every machine.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::pipeline::hash::{PartialHasher, STRENGTH_FULL, Shifts};
use crate::{PageWords, WORDS_PER_PAGE};

/// Bits in a key (one page).
pub const KEY_BITS: usize = WORDS_PER_PAGE * 32;
/// Bits in a hash value.
pub const OUTPUT_BITS: usize = 32;
/// The paper's bad-point threshold on |bias| (UKSM §6.2: "we take 50").
pub const PAPER_THRESHOLD: u32 = 50;
/// Trials per key bit that make [`PAPER_THRESHOLD`] a 5-sigma test
/// (`50 = 5 * sqrt(100)`); see the module header.
pub const DEFAULT_TRIALS: u32 = 100;

/// How an avalanche matrix is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AvalancheConfig {
    /// Random keys per key bit (`T`).
    pub trials: u32,
    /// An entry with |bias| strictly above this is a bad point.
    pub threshold: u32,
    /// Seed of the key stream.
    pub seed: u64,
}

impl Default for AvalancheConfig {
    /// [`DEFAULT_TRIALS`] trials, the paper's threshold, seed 0.
    fn default() -> Self {
        AvalancheConfig {
            trials: DEFAULT_TRIALS,
            threshold: PAPER_THRESHOLD,
            seed: 0,
        }
    }
}

/// The threshold that is `sigmas` standard deviations of an ideal entry
/// after `trials` trials (`sigmas * sqrt(trials)`, rounded down).
pub fn threshold_for_sigmas(trials: u32, sigmas: f64) -> u32 {
    (sigmas * (trials as f64).sqrt()).floor() as u32
}

/// `ln C(n, k)` for all `k` in `0..=n`.
fn ln_binomials(n: u32) -> Vec<f64> {
    let mut out = Vec::with_capacity(n as usize + 1);
    let mut acc = 0.0f64;
    out.push(acc);
    for k in 1..=n {
        acc += ((n - k + 1) as f64).ln() - (k as f64).ln();
        out.push(acc);
    }
    out
}

/// Probability that an entry of an ideal hash (each bit flips with
/// probability 1/2, independently per trial) has |bias| above `threshold`
/// after `trials` trials. Exact binomial tail.
pub fn ideal_exceed_probability(trials: u32, threshold: u32) -> f64 {
    let ln2 = (trials as f64) * std::f64::consts::LN_2;
    ln_binomials(trials)
        .iter()
        .enumerate()
        .filter(|&(x, _)| (2 * x as i64 - trials as i64).unsigned_abs() > threshold as u64)
        .map(|(_, lc)| (lc - ln2).exp())
        .sum()
}

/// Expected |bias| of an entry of an ideal hash after `trials` trials
/// (about `sqrt(2 T / pi)`). Exact binomial mean.
pub fn ideal_mean_abs_bias(trials: u32) -> f64 {
    let ln2 = (trials as f64) * std::f64::consts::LN_2;
    ln_binomials(trials)
        .iter()
        .enumerate()
        .map(|(x, lc)| (2 * x as i64 - trials as i64).unsigned_abs() as f64 * (lc - ln2).exp())
        .sum()
}

/// A measured bias matrix: one block of 32 x 32 entries (key bit within the
/// word, hash bit) for every page word whose bits were flipped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AvalancheReport {
    config: AvalancheConfig,
    words: Vec<u16>,
    /// Flip counts, `[row][key bit][hash bit]` flattened; bias = 2 count - T.
    flips: Vec<u32>,
}

impl AvalancheReport {
    fn new(config: AvalancheConfig, words: Vec<u16>) -> Self {
        let flips = vec![0; words.len() * 32 * OUTPUT_BITS];
        AvalancheReport {
            config,
            words,
            flips,
        }
    }

    /// Adds one trial's outcome for key bit `bit` of row `row`: `diff` is
    /// the xor of the hash before and after the flip.
    #[inline(always)]
    fn record(&mut self, row: usize, bit: usize, diff: u32) {
        let counts = &mut self.flips[(row * 32 + bit) * OUTPUT_BITS..][..OUTPUT_BITS];
        for (j, c) in counts.iter_mut().enumerate() {
            *c += (diff >> j) & 1;
        }
    }

    /// How the matrix was measured.
    pub fn config(&self) -> AvalancheConfig {
        self.config
    }

    /// The page words whose bits were flipped, one row block each, in the
    /// order of the rows (page order for [`avalanche`], hashing order for
    /// [`avalanche_progressive`]).
    pub fn words(&self) -> &[u16] {
        &self.words
    }

    /// Entries in the matrix (`rows * 32 * 32`).
    pub fn points(&self) -> usize {
        self.flips.len()
    }

    /// `bias(i, j)` for bit `bit` of the word of row `row` and hash bit
    /// `output_bit`: +1 per trial in which the hash bit flipped, -1 per
    /// trial in which it did not.
    pub fn bias(&self, row: usize, bit: usize, output_bit: usize) -> i32 {
        assert!(bit < 32 && output_bit < OUTPUT_BITS);
        self.bias_of(self.flips[(row * 32 + bit) * OUTPUT_BITS + output_bit])
    }

    fn bias_of(&self, flips: u32) -> i32 {
        2 * flips as i32 - self.config.trials as i32
    }

    fn abs_biases(&self) -> impl Iterator<Item = u32> + '_ {
        self.flips.iter().map(|&c| self.bias_of(c).unsigned_abs())
    }

    /// Entries whose |bias| exceeds the threshold.
    pub fn bad_points(&self) -> u64 {
        let t = self.config.threshold;
        self.abs_biases().filter(|&b| b > t).count() as u64
    }

    /// Bad points among the 32 x 32 entries of row `row`.
    pub fn bad_points_in_row(&self, row: usize) -> u32 {
        let t = self.config.threshold;
        self.flips[row * 32 * OUTPUT_BITS..][..32 * OUTPUT_BITS]
            .iter()
            .filter(|&&c| self.bias_of(c).unsigned_abs() > t)
            .count() as u32
    }

    /// Mean |bias| over all entries. An ideal hash gives
    /// [`ideal_mean_abs_bias`] (about 7.97 for 100 trials).
    pub fn mean_abs_bias(&self) -> f64 {
        let sum: u64 = self.abs_biases().map(u64::from).sum();
        sum as f64 / self.points() as f64
    }

    /// Largest |bias| (at most the number of trials).
    pub fn max_abs_bias(&self) -> u32 {
        self.abs_biases().max().unwrap_or(0)
    }

    /// Bad points an ideal hash would show on a matrix of this size, on
    /// average: the floor below which a count is noise.
    pub fn ideal_bad_points(&self) -> f64 {
        self.points() as f64 * ideal_exceed_probability(self.config.trials, self.config.threshold)
    }
}

/// The key stream: one page of random words per trial.
struct Keys(ChaCha8Rng);

impl Keys {
    fn new(seed: u64) -> Self {
        Keys(ChaCha8Rng::seed_from_u64(seed))
    }

    fn fill(&mut self, page: &mut PageWords) {
        for w in page.iter_mut() {
            *w = self.0.next_u32();
        }
    }
}

/// The full bias matrix (all 32768 key bits) of `hash` over page-sized
/// keys. Key bit `i` is bit `i % 32` of word `i / 32`, which is bit `i % 8`
/// of byte `i / 8` of the page in little-endian order.
pub fn avalanche<F: FnMut(&PageWords) -> u32>(hash: F, config: AvalancheConfig) -> AvalancheReport {
    let all: Vec<u16> = (0..WORDS_PER_PAGE as u16).collect();
    avalanche_words(hash, config, &all)
}

/// The rows of the bias matrix for the bits of the given page words only.
pub fn avalanche_words<F: FnMut(&PageWords) -> u32>(
    mut hash: F,
    config: AvalancheConfig,
    words: &[u16],
) -> AvalancheReport {
    assert!(words.iter().all(|&w| (w as usize) < WORDS_PER_PAGE));
    let mut report = AvalancheReport::new(config, words.to_vec());
    let mut keys = Keys::new(config.seed);
    let mut page = Box::new([0u32; WORDS_PER_PAGE]);
    for _ in 0..config.trials {
        keys.fill(&mut page);
        let base = hash(&page);
        for (row, &w) in words.iter().enumerate() {
            let w = w as usize;
            for bit in 0..32 {
                // Flip, hash, flip back: no copy of the page per flip.
                page[w] ^= 1 << bit;
                let diff = base ^ hash(&page);
                page[w] ^= 1 << bit;
                report.record(row, bit, diff);
            }
        }
    }
    report
}

/// The rows of the full-strength bias matrix of `hasher` for the last
/// `tail` words in its hashing order (`hasher.offsets()[1024 - tail..]`,
/// rows in that order). With `tail = 1024` this is the whole matrix. Equal
/// to [`avalanche_words`] of `|p| hasher.hash(p, STRENGTH_FULL)` over those
/// words, but a flip re-folds only the words hashed after the flipped one.
pub fn avalanche_progressive(
    hasher: &PartialHasher,
    config: AvalancheConfig,
    tail: usize,
) -> AvalancheReport {
    assert!(tail <= WORDS_PER_PAGE, "tail is at most 1024 words");
    let first = WORDS_PER_PAGE - tail;
    let words = hasher.offsets()[first..].to_vec();
    let mut report = AvalancheReport::new(config, words);
    let mut keys = Keys::new(config.seed);
    let mut page = Box::new([0u32; WORDS_PER_PAGE]);
    // states[k] is the hash at strength first + k.
    let mut states = vec![0u32; tail + 1];
    for _ in 0..config.trials {
        keys.fill(&mut page);
        states[0] = hasher.hash(&page, first as u32);
        for k in 0..tail {
            let p = (first + k) as u32;
            states[k + 1] = hasher.rehash(&page, states[k], p, p + 1);
        }
        let base = states[tail];
        for (k, &before) in states[..tail].iter().enumerate() {
            let p = (first + k) as u32;
            let w = report.words[k] as usize;
            for bit in 0..32 {
                page[w] ^= 1 << bit;
                // The flipped word is hashed at position p, so the state
                // before it is unchanged.
                let diff = base ^ hasher.rehash(&page, before, p, STRENGTH_FULL);
                page[w] ^= 1 << bit;
                report.record(k, bit, diff);
            }
        }
    }
    report
}

/// One shift pair's result in [`sweep_shift_pairs`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweepEntry {
    /// The pair.
    pub shifts: Shifts,
    /// Bad points among the swept rows.
    pub bad_points: u64,
    /// Mean |bias| over the swept rows.
    pub mean_abs_bias: f64,
    /// The earliest-hashed word of the window still had bad points, so
    /// earlier words may have some too: `bad_points` is a lower bound.
    pub truncated: bool,
}

/// Every `(left, right)` pair in `1..32 x 1..32`, measured on the last
/// `tail` words of the hashing order of one permutation (seed
/// `permutation_seed`), best first: fewest bad points, then smallest mean
/// |bias|. The paper's exhaustive search, at the cost of `tail` words per pair.
pub fn sweep_shift_pairs(
    permutation_seed: u64,
    config: AvalancheConfig,
    tail: usize,
) -> Vec<SweepEntry> {
    assert!(tail >= 1, "the window needs at least one word");
    let mut out = Vec::with_capacity(31 * 31);
    for left in 1..32 {
        for right in 1..32 {
            let shifts = Shifts { left, right };
            let hasher = PartialHasher::new(permutation_seed, shifts);
            let r = avalanche_progressive(&hasher, config, tail);
            out.push(SweepEntry {
                shifts,
                bad_points: r.bad_points(),
                mean_abs_bias: r.mean_abs_bias(),
                truncated: r.bad_points_in_row(0) > 0,
            });
        }
    }
    out.sort_by(|a, b| {
        a.bad_points
            .cmp(&b.bad_points)
            .then(a.mean_abs_bias.total_cmp(&b.mean_abs_bias))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(trials: u32) -> AvalancheConfig {
        AvalancheConfig {
            trials,
            threshold: PAPER_THRESHOLD,
            seed: 3,
        }
    }

    #[test]
    fn ideal_statistics() {
        // 50 is five standard deviations at 100 trials: rare but possible.
        let p = ideal_exceed_probability(100, 50);
        assert!(p > 1e-8 && p < 1e-6, "p = {p}");
        // |bias| > 0 is certain for odd T and misses only x = T/2 for even T.
        assert!((ideal_exceed_probability(101, 0) - 1.0).abs() < 1e-12);
        let m = ideal_mean_abs_bias(100);
        let approx = (2.0 * 100.0 / std::f64::consts::PI).sqrt();
        assert!((m - approx).abs() < 0.1, "{m} vs {approx}");
        assert_eq!(threshold_for_sigmas(100, 5.0), 50);
        assert_eq!(threshold_for_sigmas(400, 5.0), 100);
    }

    #[test]
    fn constant_hash_is_all_bad() {
        let r = avalanche_words(|_| 7, small(10), &[0, 5]);
        assert_eq!(r.points(), 2 * 32 * 32);
        // Nothing ever flips: every entry is -T.
        assert_eq!(r.bias(1, 3, 4), -10);
        assert_eq!(r.mean_abs_bias(), 10.0);
        let r = avalanche_words(|_| 7, small(100), &[0, 5]);
        assert_eq!(r.bad_points(), 2 * 32 * 32);
    }

    #[test]
    fn identity_hash_flips_exactly_its_own_bit() {
        // The hash is word 9: flipping its bit b flips output bit b only.
        let r = avalanche_words(|p| p[9], small(100), &[9, 10]);
        for b in 0..32 {
            for j in 0..32 {
                assert_eq!(r.bias(0, b, j), if b == j { 100 } else { -100 });
                assert_eq!(r.bias(1, b, j), -100);
            }
        }
        assert_eq!(r.bad_points(), r.points() as u64);
    }

    #[test]
    fn strong_hash_has_no_bad_points() {
        let bytes = |p: &PageWords| -> Vec<u8> { p.iter().flat_map(|w| w.to_le_bytes()).collect() };
        let r = avalanche_words(
            |p| twox_hash::XxHash3_64::oneshot(&bytes(p)) as u32,
            small(100),
            &[0, 511, 1023],
        );
        assert_eq!(r.bad_points(), 0);
        let ideal = ideal_mean_abs_bias(100);
        assert!(
            (r.mean_abs_bias() - ideal).abs() < 0.5,
            "mean |bias| {} vs ideal {ideal}",
            r.mean_abs_bias()
        );
    }

    #[test]
    fn progressive_matches_generic() {
        for shifts in [Shifts::PAPER, Shifts::RELEASED] {
            let h = PartialHasher::new(11, shifts);
            let tail = 6;
            let fast = avalanche_progressive(&h, small(20), tail);
            let words = &h.offsets()[WORDS_PER_PAGE - tail..];
            let slow = avalanche_words(|p| h.hash(p, STRENGTH_FULL), small(20), words);
            assert_eq!(fast, slow);
        }
    }

    #[test]
    fn bad_points_sit_at_the_end_of_the_permutation() {
        let h = PartialHasher::new(11, Shifts::PAPER);
        let r = avalanche_progressive(&h, small(100), 64);
        // The last word hashed goes through one step only: its top bit
        // changes just two hash bits (h += w flips bit 31, which the
        // multiply by 1 + 2^19 keeps, and h ^= h >> 16 copies to bit 15).
        assert_eq!(r.bias(63, 31, 31), 100);
        assert_eq!(r.bias(63, 31, 15), 100);
        assert_eq!(r.bias(63, 31, 0), -100);
        assert!(r.bad_points_in_row(63) > 500);
        // Words hashed 60 steps before the end are thoroughly mixed.
        assert_eq!(r.bad_points_in_row(0), 0);
    }

    #[test]
    fn sweep_covers_all_pairs_in_order_and_flags_short_windows() {
        // 4 trials, bad = all 4 alike. With a window of one word (the last
        // one hashed) every pair is flagged: that word's top bit always
        // flips exactly two hash bits (bit 31 and bit 31 - right) and never
        // the other 30, so all 32 entries of that key bit are bad.
        let config = AvalancheConfig {
            trials: 4,
            threshold: 3,
            seed: 9,
        };
        let out = sweep_shift_pairs(5, config, 1);
        assert_eq!(out.len(), 31 * 31);
        let pairs: std::collections::HashSet<_> = out
            .iter()
            .map(|e| (e.shifts.left, e.shifts.right))
            .collect();
        assert_eq!(pairs.len(), 31 * 31);
        assert!(out.windows(2).all(|w| w[0].bad_points <= w[1].bad_points));
        assert!(out.iter().all(|e| e.truncated && e.bad_points >= 32));
        // Each entry is the report of that pair.
        for shifts in [Shifts::PAPER, Shifts::RELEASED] {
            let e = out.iter().find(|e| e.shifts == shifts).unwrap();
            let r = avalanche_progressive(&PartialHasher::new(5, shifts), config, 1);
            assert_eq!(e.bad_points, r.bad_points());
            assert_eq!(e.mean_abs_bias, r.mean_abs_bias());
        }
    }
}
