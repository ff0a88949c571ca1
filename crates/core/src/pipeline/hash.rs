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
//! Undoing a step (Figure 7): `h ^= h >> r` is undone by xoring in `h >> kr`
//! for every `k` with `kr < 32`; `h += h << l` is `h *= 1 + 2^l (mod 2^32)`,
//! undone by a multiply with the modular inverse of that odd number. For
//! `l >= 16` the inverse is `1 - 2^l`, one shift and one subtract. So with
//! both shifts at 16 or more, as in the paper's (19, 16), an inverse step
//! is as short as a forward one. The paper gives that as a reason for its
//! choice.
//!
//! Speed: a step depends on the previous one, so the hash runs at the
//! latency of the chain through `h`, not at the machine's width. The loops
//! compute the same values as Figure 5 in an order that puts the word's
//! share off that chain (4 dependent operations per word instead of 5); see
//! `fold`. `docs/hash.md` has the measured figures and the choice of
//! [`Shifts::DEFAULT`].

use crate::{PageWords, WORDS_PER_PAGE};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

/// A page's full-content fingerprint: XXH3-64 of all its bytes. The
/// partial hash keys the sample index; this is what a hit is checked
/// against (`distill`'s "Verification"): two pages with equal
/// fingerprints are taken to be equal (a false match has probability
/// 2^-64, and costs ksmd one look, since ksmd compares bytes before it
/// merges). It costs about 87 ns for a page in cache on this machine
/// (measured for the scan's page hash, which is this function), less than
/// a tenth of a partial hash at full strength (`docs/hash.md`).
pub fn fingerprint(page: &PageWords) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytemuck::bytes_of(page))
}

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
    /// The pair pagesift uses: the released patch's (8, 12). On our
    /// measurements (docs/hash.md) it has about half the avalanche bad
    /// points of (19, 16) at the same forward cost. Its inverse step is
    /// dearer (two xorshift terms and a multiply), but inverse steps are
    /// only taken when the strength drops.
    pub const DEFAULT: Shifts = Shifts::RELEASED;
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
///
/// ```
/// use pagesift_core::pipeline::hash::{PartialHasher, Shifts};
///
/// let hasher = PartialHasher::new(42, Shifts::DEFAULT);
/// let mut page = [0u32; 1024];
/// page[17] = 0xfeed;
/// let weak = hasher.hash(&page, 8);
/// // Strengthen to 64 words, then weaken back: only the difference is hashed.
/// let strong = hasher.rehash(&page, weak, 8, 64);
/// assert_eq!(strong, hasher.hash(&page, 64));
/// assert_eq!(hasher.rehash(&page, strong, 64, 8), weak);
/// ```
#[derive(Clone, Debug)]
pub struct PartialHasher {
    offsets: Box<[u16; WORDS_PER_PAGE]>,
    shifts: Shifts,
    /// `1 + 2^left`: `h += h << left` is `h *= left_mul`.
    left_mul: u32,
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
        let left_mul = 1u32.wrapping_add(1u32 << shifts.left);
        PartialHasher {
            offsets,
            shifts,
            left_mul,
            left_inverse: inverse_mod_2_32(left_mul),
        }
    }

    /// The shift pair of the fold step.
    pub fn shifts(&self) -> Shifts {
        self.shifts
    }

    /// The word offsets in the order they are hashed.
    pub fn offsets(&self) -> &[u16; WORDS_PER_PAGE] {
        &self.offsets
    }

    /// One step of Figure 5, written as the paper writes it. The loops in
    /// `fold` compute the same thing in a faster order.
    #[inline(always)]
    fn step(&self, h: u32, word: u32) -> u32 {
        let mut h = h.wrapping_add(word);
        h = h.wrapping_add(h << self.shifts.left);
        h ^ (h >> self.shifts.right)
    }

    /// Undoes `h ^= h >> right` (Figure 7, `reverse_xoreq_shiftr`): xor in
    /// `h >> k*right` for every `k*right < 32`. The terms are independent,
    /// so they do not form a chain.
    #[inline(always)]
    fn unxorshift(&self, h: u32) -> u32 {
        let mut x = h;
        let mut shift = self.shifts.right;
        while shift < 32 {
            x ^= h >> shift;
            shift += self.shifts.right;
        }
        x
    }

    #[inline(always)]
    fn unstep(&self, h: u32, word: u32) -> u32 {
        // Undo `h ^= h >> right`, then `h += h << left` (one multiply by the
        // inverse of `1 + 2^left`), then `h += word`.
        self.unxorshift(h)
            .wrapping_mul(self.left_inverse)
            .wrapping_sub(word)
    }

    /// Hash of the first `strength` permuted words of `page`.
    /// `strength` is 0..=1024; 0 gives [`HASH_INIT`]. Panics above 1024.
    #[inline]
    pub fn hash(&self, page: &PageWords, strength: u32) -> u32 {
        self.fold(page, HASH_INIT, 0, strength)
    }

    /// Moves `hash`, the hash of `page` at strength `from`, to strength `to`,
    /// touching only the `|to - from|` words in between. Panics if a
    /// strength is above 1024.
    #[inline]
    pub fn rehash(&self, page: &PageWords, hash: u32, from: u32, to: u32) -> u32 {
        if to >= from {
            self.fold(page, hash, from, to)
        } else {
            self.unfold(page, hash, from, to)
        }
    }

    // Inlined: at the low strengths the controller favours, the call
    // would cost about as much as the hashing.
    #[inline]
    fn fold(&self, page: &PageWords, h: u32, from: u32, to: u32) -> u32 {
        assert!(from <= to && to <= STRENGTH_FULL, "strength out of range");
        let (left, right, left_mul) = (self.shifts.left, self.shifts.right, self.left_mul);
        // The latency of the chain through `h` bounds the speed (nothing
        // else in the loop depends on it), so the step of Figure 5 is
        // rearranged, with the same value mod 2^32:
        // - `(h + w) * (1 + 2^l)` is `(h + w * (1 + 2^l)) + (h << l)`. The
        //   word's share `wc` is then off the chain, and this half of the
        //   step is 2 operations deep on it instead of 3. `left_mul` is a
        //   runtime field, so the compiler cannot factor the sum back.
        // - The loop carries `a`, the value before the xorshift, and the
        //   next word's share, loaded one iteration ahead. LLVM's
        //   reassociation then adds `wc` to `h` first and `h << l` last.
        //   That order keeps the chain at 4 operations per word instead
        //   of 5.
        // The mask lets the compiler drop the bounds check.
        let share = |pos: u16| page[pos as usize & (WORDS_PER_PAGE - 1)].wrapping_mul(left_mul);
        let mix = |h: u32, wc: u32| h.wrapping_add(wc).wrapping_add(h << left);
        let xorshift = |a: u32| a ^ (a >> right);
        let mut offsets = self.offsets[from as usize..to as usize].iter();
        let Some(&first) = offsets.next() else {
            return h;
        };
        // The first step starts from `h` itself, not from an `a`.
        let mut a = mix(h, share(first));
        let Some(&second) = offsets.next() else {
            return xorshift(a);
        };
        let mut wc = share(second);
        for &pos in offsets {
            let next = share(pos);
            a = mix(xorshift(a), wc);
            wc = next;
        }
        xorshift(mix(xorshift(a), wc))
    }

    fn unfold(&self, page: &PageWords, h: u32, from: u32, to: u32) -> u32 {
        assert!(to <= from && from <= STRENGTH_FULL, "strength out of range");
        // Pick a loop whose inverse steps have no inner loops: the number of
        // xorshift terms is fixed per pair, and for left >= 16 the inverse of
        // `1 + 2^left` is `1 - 2^left` (its square vanishes mod 2^32), a
        // shift and a subtract instead of a multiply (Figure 7's loop with
        // one iteration). Shifts of 16 or more on both sides make an
        // inverse step as short as a forward one: the reason the paper gives
        // for (19, 16).
        let wide_left = self.shifts.left >= 16;
        match (31 / self.shifts.right, wide_left) {
            (1, true) => self.unfold_with::<1, true>(page, h, from, to),
            (1, false) => self.unfold_with::<1, false>(page, h, from, to),
            (2, true) => self.unfold_with::<2, true>(page, h, from, to),
            (2, false) => self.unfold_with::<2, false>(page, h, from, to),
            (3, false) => self.unfold_with::<3, false>(page, h, from, to),
            _ => self.unfold_with::<0, false>(page, h, from, to),
        }
    }

    /// The inverse loop. `TERMS` is the number of `h >> k*right` terms that
    /// undo the xorshift (0: count them at run time); `WIDE_LEFT` says
    /// `left >= 16`.
    #[inline(always)]
    fn unfold_with<const TERMS: u32, const WIDE_LEFT: bool>(
        &self,
        page: &PageWords,
        mut h: u32,
        from: u32,
        to: u32,
    ) -> u32 {
        let (left, right) = (self.shifts.left, self.shifts.right);
        let word = |pos: u16| page[pos as usize & (WORDS_PER_PAGE - 1)];
        let step = |h: u32, w: u32| {
            let x = if TERMS == 0 {
                self.unxorshift(h)
            } else {
                let mut x = h;
                for k in 1..=TERMS {
                    x ^= h >> (k * right);
                }
                x
            };
            if WIDE_LEFT {
                // x * (1 - 2^left) - w, with w subtracted off the chain.
                x.wrapping_sub(w).wrapping_sub(x << left)
            } else {
                x.wrapping_mul(self.left_inverse).wrapping_sub(w)
            }
        };
        let mut offsets = self.offsets[to as usize..from as usize].iter().rev();
        let Some(&last) = offsets.next() else {
            return h;
        };
        // As in `fold`, the word is loaded one iteration ahead so that LLVM
        // subtracts it before the shifted term, off the chain.
        let mut w = word(last);
        for &pos in offsets {
            let next = word(pos);
            h = step(h, w);
            w = next;
        }
        step(h, w)
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
    use proptest::prelude::*;

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

    /// Figure 5 as printed: the reference the rearranged loops must match.
    fn figure5(h: &PartialHasher, page: &PageWords, strength: u32) -> u32 {
        let (l, r) = (h.shifts().left, h.shifts().right);
        let mut hash = HASH_INIT;
        for &pos in &h.offsets()[..strength as usize] {
            hash = hash.wrapping_add(page[pos as usize]);
            hash = hash.wrapping_add(hash << l);
            hash ^= hash >> r;
        }
        hash
    }

    /// Figure 7 as printed, then `h -= word`: the paper's inverse step.
    fn figure7_unstep(shifts: Shifts, h: u32, word: u32) -> u32 {
        let reverse_xoreq_shiftr = |mut n: u32| {
            let mut ret = n;
            n >>= shifts.right;
            while n != 0 {
                ret ^= n;
                n >>= shifts.right;
            }
            ret
        };
        let reverse_addeq_shiftl = |mut n: u32| {
            let mut ret = n;
            let mut turn = true;
            n <<= shifts.left;
            while n != 0 {
                ret = if turn {
                    ret.wrapping_sub(n)
                } else {
                    ret.wrapping_add(n)
                };
                turn = !turn;
                n <<= shifts.left;
            }
            ret
        };
        reverse_addeq_shiftl(reverse_xoreq_shiftr(h)).wrapping_sub(word)
    }

    fn page_strategy() -> impl Strategy<Value = Box<PageWords>> {
        prop::collection::vec(any::<u32>(), WORDS_PER_PAGE)
            .prop_map(|v| Box::new(v.try_into().unwrap()))
    }

    fn any_shifts() -> impl Strategy<Value = Shifts> {
        (1..32u32, 1..32u32).prop_map(|(left, right)| Shifts { left, right })
    }

    /// One move of a strength walk: a jump to any strength, or a small
    /// step up or down (the controller's moves are small: at most 32 words).
    #[derive(Clone, Debug)]
    enum Move {
        Jump(u32),
        Step(i32),
    }

    fn walk_strategy() -> impl Strategy<Value = Vec<Move>> {
        prop::collection::vec(
            prop_oneof![
                (0..=STRENGTH_FULL).prop_map(Move::Jump),
                (-40..=40i32).prop_map(Move::Step),
            ],
            1..40,
        )
    }

    /// The released patch's `HASH_FROM_DOWN_TO` for (8, 12).
    #[test]
    fn released_patch_inverse_matches() {
        let h = PartialHasher::new(1, Shifts::RELEASED);
        for (x, w) in [(0u32, 0u32), (0x0123_4567, 0x89ab_cdef), (u32::MAX, 1)] {
            let mut y = h.step(x, w);
            y ^= y >> 12;
            y ^= y >> 24;
            y = y.wrapping_sub(y << 8);
            y = y.wrapping_add(y << 16);
            y = y.wrapping_sub(w);
            assert_eq!(y, x);
            assert_eq!(h.unstep(h.step(x, w), w), x);
        }
    }

    proptest! {
        /// For random pages and random walks of the strength, up and down,
        /// the value carried along by `rehash` is always the value `hash`
        /// computes directly, for both pairs.
        #[test]
        fn rehash_walk_equals_direct_hash(
            page in page_strategy(),
            seed in any::<u64>(),
            start in 0..=STRENGTH_FULL,
            walk in walk_strategy(),
        ) {
            for shifts in [Shifts::PAPER, Shifts::RELEASED] {
                let h = PartialHasher::new(seed, shifts);
                let mut strength = start;
                let mut value = h.hash(&page, strength);
                for m in &walk {
                    let next = match *m {
                        Move::Jump(s) => s,
                        Move::Step(d) => (strength as i32 + d).clamp(0, STRENGTH_FULL as i32) as u32,
                    };
                    value = h.rehash(&page, value, strength, next);
                    prop_assert_eq!(value, h.hash(&page, next), "{:?} {} -> {}", shifts, strength, next);
                    strength = next;
                }
                // All the way down is the start value again.
                prop_assert_eq!(h.rehash(&page, value, strength, 0), HASH_INIT);
            }
        }

        /// Changing one word that is hashed at strength `s` changes the
        /// hash; changing a word beyond `s` does not. The first is a
        /// theorem, not a likelihood: for a fixed word each step is a
        /// bijection of `h`, and for a fixed `h` it is injective in the
        /// word, so the states differ from the changed word on. That is
        /// why it is asserted on every sample.
        #[test]
        fn one_word_decides_within_strength_only(
            page in page_strategy(),
            seed in any::<u64>(),
            strength in 1..=STRENGTH_FULL,
            inside in any::<prop::sample::Index>(),
            outside in any::<prop::sample::Index>(),
            delta in 1..=u32::MAX,
        ) {
            for shifts in [Shifts::PAPER, Shifts::RELEASED] {
                let h = PartialHasher::new(seed, shifts);
                let before = h.hash(&page, strength);

                let mut changed = page.clone();
                let pos = h.offsets()[inside.index(strength as usize)] as usize;
                changed[pos] = changed[pos].wrapping_add(delta);
                prop_assert_ne!(h.hash(&changed, strength), before);

                if strength < STRENGTH_FULL {
                    let mut changed = page.clone();
                    let k = strength as usize + outside.index(WORDS_PER_PAGE - strength as usize);
                    let pos = h.offsets()[k] as usize;
                    changed[pos] = changed[pos].wrapping_add(delta);
                    prop_assert_eq!(h.hash(&changed, strength), before);
                }
            }
        }

        /// For every shift pair, the rearranged forward loop computes
        /// Figure 5 exactly and the specialised inverse loops undo it.
        #[test]
        fn every_pair_matches_the_paper(
            page in page_strategy(),
            shifts in any_shifts(),
            strength in 0..=STRENGTH_FULL,
        ) {
            let h = PartialHasher::new(5, shifts);
            let full = h.hash(&page, STRENGTH_FULL);
            prop_assert_eq!(full, figure5(&h, &page, STRENGTH_FULL));
            prop_assert_eq!(h.hash(&page, strength), figure5(&h, &page, strength));
            prop_assert_eq!(h.rehash(&page, full, STRENGTH_FULL, strength), figure5(&h, &page, strength));
        }

        /// Our inverse step is the paper's (Figure 7) for every pair.
        #[test]
        fn unstep_is_figure7(shifts in any_shifts(), x in any::<u32>(), w in any::<u32>()) {
            let h = PartialHasher::new(0, shifts);
            let y = h.step(x, w);
            prop_assert_eq!(h.unstep(y, w), x);
            prop_assert_eq!(figure7_unstep(shifts, y, w), x);
        }
    }
}
