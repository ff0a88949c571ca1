//! Paul Hsieh's SuperFastHash, the baseline of UKSM's partial hash (§6, §6.2).
//!
//! UKSM's progressive hash is judged against SuperFastHash: at full strength
//! it should be about as fast (the paper measured 2% slower) and avalanche
//! about as well (Figure 6). pagesift does not use SuperFastHash to index
//! pages; it is public here only as that baseline, for the benchmarks
//! (`benches/hash.rs`) and the avalanche analysis ([`crate::research::avalanche`]).
//!
//! Written from the public description (azillionmonkeys.com/qed/hash.html,
//! the paper's reference 19). The hash starts from the key length. Each
//! 4-byte block is read as two little-endian 16-bit halves `lo` and `hi`:
//!
//! ```text
//! h += lo;  t = (hi << 11) ^ h;  h = (h << 16) ^ t;  h += h >> 11;
//! ```
//!
//! A tail of 1 to 3 bytes gets its own short mix. The odd byte of the tail
//! is read as a *signed* char, as in the C original, so bytes >= 0x80 are
//! sign-extended. A final six-step shift/add/xor cascade avalanches the
//! last bits. An empty key hashes to 0.

use crate::PageWords;

/// One 4-byte block of the main loop; `lo` and `hi` are its little-endian
/// 16-bit halves.
#[inline(always)]
fn block(mut h: u32, lo: u32, hi: u32) -> u32 {
    h = h.wrapping_add(lo);
    let t = (hi << 11) ^ h;
    h = (h << 16) ^ t;
    h.wrapping_add(h >> 11)
}

/// The final avalanche cascade.
#[inline(always)]
fn finish(mut h: u32) -> u32 {
    h ^= h << 3;
    h = h.wrapping_add(h >> 5);
    h ^= h << 4;
    h = h.wrapping_add(h >> 17);
    h ^= h << 25;
    h.wrapping_add(h >> 6)
}

/// SuperFastHash of `data`. The length enters the hash as a `u32` (the C
/// original takes an `int`), so keys of 4 GiB or more wrap; an empty key
/// gives 0, as in the original.
pub fn super_fast_hash(data: &[u8]) -> u32 {
    if data.is_empty() {
        return 0;
    }
    let mut h = data.len() as u32;
    let blocks = data.chunks_exact(4);
    let tail = blocks.remainder();
    for b in blocks {
        let lo = u16::from_le_bytes([b[0], b[1]]) as u32;
        let hi = u16::from_le_bytes([b[2], b[3]]) as u32;
        h = block(h, lo, hi);
    }
    match *tail {
        [a, b, c] => {
            h = h.wrapping_add(u16::from_le_bytes([a, b]) as u32);
            h ^= h << 16;
            // Signed char, sign-extended before the shift.
            h ^= ((c as i8 as i32) << 18) as u32;
            h = h.wrapping_add(h >> 11);
        }
        [a, b] => {
            h = h.wrapping_add(u16::from_le_bytes([a, b]) as u32);
            h ^= h << 11;
            h = h.wrapping_add(h >> 17);
        }
        [a] => {
            h = h.wrapping_add(a as i8 as i32 as u32);
            h ^= h << 10;
            h = h.wrapping_add(h >> 1);
        }
        _ => {}
    }
    finish(h)
}

/// SuperFastHash of a page's bytes in little-endian order, read straight
/// from its words: equal to `super_fast_hash` of the page's 4096
/// little-endian bytes, without converting them first.
pub fn super_fast_hash_page(page: &PageWords) -> u32 {
    let mut h = crate::PAGE_SIZE as u32;
    for &w in page.iter() {
        h = block(h, w & 0xffff, w >> 16);
    }
    finish(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Published vectors. The first four are from Yandex's `util/digest`
    /// SuperFastHash unit test (key bytes 0, 1, 2, ... of lengths 256 down to
    /// 253, so every tail length is covered and the length-255 and 253
    /// tails end in bytes >= 0x80, which exercises the signed-char
    /// reads); the last three are from Hashlib.NET's SuperFast tests.
    #[test]
    fn published_vectors() {
        let ramp: Vec<u8> = (0..=255u8).collect();
        assert_eq!(super_fast_hash(&ramp[..256]), 3_840_866_583);
        assert_eq!(super_fast_hash(&ramp[..255]), 325_350_515);
        assert_eq!(super_fast_hash(&ramp[..254]), 2_920_741_773);
        assert_eq!(super_fast_hash(&ramp[..253]), 3_586_628_615);
        assert_eq!(super_fast_hash(b"foob"), 0x58C9_CBD5);
        assert_eq!(super_fast_hash(b"fooba"), 0xF9D8_71C8);
        assert_eq!(super_fast_hash(b"foobar"), 0xA6BC_DCA9);
    }

    #[test]
    fn empty_key_is_zero() {
        assert_eq!(super_fast_hash(&[]), 0);
    }

    proptest! {
        /// The word-wise page entry point is the byte hash of the page's
        /// little-endian bytes.
        #[test]
        fn page_entry_matches_bytes(words in prop::collection::vec(any::<u32>(), crate::WORDS_PER_PAGE)) {
            let page: PageWords = words.try_into().unwrap();
            let bytes: Vec<u8> = page.iter().flat_map(|w| w.to_le_bytes()).collect();
            prop_assert_eq!(super_fast_hash_page(&page), super_fast_hash(&bytes));
        }

        /// Changing one byte of a key changes its hash. Not a theorem (the
        /// `h += h >> 11` steps wrap, so they are not bijections), but a
        /// collision should come about once in 2^32 cases, so a failure here
        /// means a broken implementation, not bad luck.
        #[test]
        fn one_byte_change_changes_hash(
            data in prop::collection::vec(any::<u8>(), 1..300),
            pos in any::<prop::sample::Index>(),
            delta in 1..=255u8,
        ) {
            let mut other = data.clone();
            let i = pos.index(data.len());
            other[i] = other[i].wrapping_add(delta);
            prop_assert_ne!(super_fast_hash(&data), super_fast_hash(&other));
        }
    }
}
