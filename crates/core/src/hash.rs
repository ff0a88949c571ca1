//! Progressive partial-page hash (UKSM §6.2, Figures 5 and 7).
//!
//! A page is 1024 little-endian `u32` words. One random permutation of the
//! word offsets is drawn from a seed when the engine starts; `hash(page, s)`
//! folds the first `s` permuted words with
//!
//! ```text
//! h += word;  h += h << left;  h ^= h >> right;
//! ```
//!
//! starting from [`HASH_INIT`]. Every step is invertible, so a stored
//! `(hash, strength)` moves to any other strength at a cost proportional to
//! the difference: up by folding the next words, down by undoing the last
//! ones. That is what lets the strength controller change the global
//! strength without rehashing every indexed page from scratch.
//!
//! Undoing a step: `h ^= h >> r` is undone by xoring in `h >> kr` for every
//! `k` with `kr < 32` (Figure 7); `h += h << l` is `h *= 1 + 2^l (mod 2^32)`,
//! undone by one multiply with the modular inverse of that odd number, which
//! costs the same for every `l` (Figure 7's loop costs `32/l` iterations).

use crate::{PageWords, WORDS_PER_PAGE};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// The value the fold starts from (UKSM's `0xdeadbeef`).
pub const HASH_INIT: u32 = 0xdead_beef;

/// Full strength: every word of the page is hashed.
pub const STRENGTH_FULL: u32 = WORDS_PER_PAGE as u32;

/// The shift pair of the fold step.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct Shifts {
    /// `h += h << left`
    pub left: u32,
    /// `h ^= h >> right`
    pub right: u32,
}

impl Shifts {
    /// The pair the paper chose (UKSM §6.2).
    pub const PAPER: Shifts = Shifts {
        left: 19,
        right: 16,
    };
    /// The pair of the released UKSM patch (`shiftl = 8`, `shiftr = 12`).
    pub const RELEASED: Shifts = Shifts { left: 8, right: 12 };
}

/// Multiplicative inverse of an odd `a` modulo 2^32 (Newton's iteration:
/// each round doubles the number of correct low bits, 5 rounds reach 32).
const fn inverse_mod_2_32(a: u32) -> u32 {
    let mut x = a; // correct to 3 bits for odd a
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u32.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// The progressive hash: a seeded offset permutation and a shift pair.
#[derive(Clone, Debug)]
pub struct PartialHasher {
    offsets: Box<[u16; WORDS_PER_PAGE]>,
    shifts: Shifts,
    /// Inverse of `1 + 2^left` modulo 2^32, undoes `h += h << left`.
    left_inverse: u32,
}

impl PartialHasher {
    /// Draws the offset permutation from `seed`. The same seed gives the
    /// same permutation, so hashes are comparable only within one seed.
    pub fn new(seed: u64, shifts: Shifts) -> Self {
        assert!(
            (1..32).contains(&shifts.left) && (1..32).contains(&shifts.right),
            "shifts must be in 1..32"
        );
        let mut offsets = Box::new([0u16; WORDS_PER_PAGE]);
        for (i, o) in offsets.iter_mut().enumerate() {
            *o = i as u16;
        }
        offsets.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        let left_inverse = inverse_mod_2_32(1u32.wrapping_add(1u32 << shifts.left));
        PartialHasher {
            offsets,
            shifts,
            left_inverse,
        }
    }

    pub fn shifts(&self) -> Shifts {
        self.shifts
    }

    /// The word offsets in the order they are hashed.
    pub fn offsets(&self) -> &[u16; WORDS_PER_PAGE] {
        &self.offsets
    }

    #[inline(always)]
    fn step(&self, h: u32, word: u32) -> u32 {
        let mut h = h.wrapping_add(word);
        h = h.wrapping_add(h << self.shifts.left);
        h ^ (h >> self.shifts.right)
    }

    #[inline(always)]
    fn unstep(&self, h: u32, word: u32) -> u32 {
        // Undo `h ^= h >> right`.
        let mut x = h;
        let mut shift = self.shifts.right;
        while shift < 32 {
            x ^= h >> shift;
            shift += self.shifts.right;
        }
        // Undo `h += h << left`, then `h += word`.
        x.wrapping_mul(self.left_inverse).wrapping_sub(word)
    }

    /// Hash of the first `strength` permuted words of `page`.
    /// `strength` is 0..=1024; 0 gives [`HASH_INIT`].
    #[inline]
    pub fn hash(&self, page: &PageWords, strength: u32) -> u32 {
        self.fold(page, HASH_INIT, 0, strength)
    }

    /// Moves `hash`, the hash of `page` at strength `from`, to strength `to`,
    /// touching only the `|to - from|` words in between.
    #[inline]
    pub fn rehash(&self, page: &PageWords, hash: u32, from: u32, to: u32) -> u32 {
        if to >= from {
            self.fold(page, hash, from, to)
        } else {
            self.unfold(page, hash, from, to)
        }
    }

    fn fold(&self, page: &PageWords, mut h: u32, from: u32, to: u32) -> u32 {
        assert!(from <= to && to <= STRENGTH_FULL, "strength out of range");
        for &pos in &self.offsets[from as usize..to as usize] {
            // The mask lets the compiler drop the bounds check.
            h = self.step(h, page[pos as usize & (WORDS_PER_PAGE - 1)]);
        }
        h
    }

    fn unfold(&self, page: &PageWords, mut h: u32, from: u32, to: u32) -> u32 {
        assert!(to <= from && from <= STRENGTH_FULL, "strength out of range");
        for &pos in self.offsets[to as usize..from as usize].iter().rev() {
            h = self.unstep(h, page[pos as usize & (WORDS_PER_PAGE - 1)]);
        }
        h
    }

    /// One fold step on its own, for cost measurements.
    #[doc(hidden)]
    pub fn step_once(&self, h: u32, word: u32) -> u32 {
        self.step(h, word)
    }

    /// One inverse step on its own, for cost measurements.
    #[doc(hidden)]
    pub fn unstep_once(&self, h: u32, word: u32) -> u32 {
        self.unstep(h, word)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inverse_of_left_shift_add() {
        for l in 1..32 {
            let a = 1u32.wrapping_add(1 << l);
            assert_eq!(a.wrapping_mul(inverse_mod_2_32(a)), 1, "l={l}");
        }
    }

    #[test]
    fn step_roundtrip_both_pairs() {
        for shifts in [Shifts::PAPER, Shifts::RELEASED] {
            let h = PartialHasher::new(1, shifts);
            for (x, w) in [
                (0u32, 0u32),
                (1, 2),
                (u32::MAX, 7),
                (0xdead_beef, 0x1234_5678),
            ] {
                assert_eq!(h.unstep(h.step(x, w), w), x);
            }
        }
    }

    #[test]
    fn permutation_is_seeded_and_complete() {
        let a = PartialHasher::new(7, Shifts::PAPER);
        let b = PartialHasher::new(7, Shifts::PAPER);
        let c = PartialHasher::new(8, Shifts::PAPER);
        assert_eq!(a.offsets(), b.offsets());
        assert_ne!(a.offsets(), c.offsets());
        let mut seen = [false; WORDS_PER_PAGE];
        for &o in a.offsets().iter() {
            assert!(!seen[o as usize]);
            seen[o as usize] = true;
        }
    }
}
