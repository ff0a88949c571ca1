//! Page contents from (seed, content id), fast enough to fill GiBs.
//!
//! The first 8 bytes of a page are its content id xor a fixed tag, so pages
//! with different ids always differ; the rest is an xorshift64* stream
//! seeded from the seed and the id, so pages look random (no page is all
//! zero, none shares a partial-hash prefix by construction) and the same
//! (seed, id) always gives the same bytes. Generating a page costs about
//! 512 multiply-xorshift steps (≈0.3–0.5 µs); small sets of duplicated
//! contents are generated once and copied.

use crate::layout::SplitMix64;

/// Bytes in a page.
pub const PAGE: usize = 4096;
const TAG: u64 = 0x7061_6765_7369_6674; // "pagesift"

/// Writes the page of content `id` under `seed` into `out`.
pub fn fill_page(seed: u64, id: u64, out: &mut [u8]) {
    debug_assert_eq!(out.len(), PAGE);
    let mut words = out.chunks_exact_mut(8);
    words
        .next()
        .expect("a page has words")
        .copy_from_slice(&(id ^ TAG).to_le_bytes());
    let mut x = SplitMix64::new(seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15)).next_u64() | 1;
    for w in words {
        // xorshift64*: never 0 from a non-zero state.
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        w.copy_from_slice(&x.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes());
    }
}

/// Generates pages, caching the contents of small ids (the duplicated
/// contents `0..cache`).
pub struct PageMaker {
    seed: u64,
    cache: Vec<Box<[u8]>>,
}

impl PageMaker {
    /// Caches contents `0..cache` (each 4 KiB).
    pub fn new(seed: u64, cache: u64) -> PageMaker {
        let cache = (0..cache.min(4096))
            .map(|id| {
                let mut b = vec![0u8; PAGE].into_boxed_slice();
                fill_page(seed, id, &mut b);
                b
            })
            .collect();
        PageMaker { seed, cache }
    }

    /// Writes content `id` into `out`.
    pub fn write(&self, id: u64, out: &mut [u8]) {
        match self.cache.get(id as usize) {
            Some(p) => out.copy_from_slice(p),
            None => fill_page(self.seed, id, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_distinct() {
        let page = |s, id| {
            let mut b = vec![0u8; PAGE];
            fill_page(s, id, &mut b);
            b
        };
        assert_eq!(page(1, 5), page(1, 5));
        assert_ne!(page(1, 5), page(1, 6));
        assert_ne!(page(1, 5), page(2, 5));
        assert!(page(0, 0).iter().any(|&b| b != 0));
        let m = PageMaker::new(3, 4);
        let mut a = vec![0u8; PAGE];
        m.write(2, &mut a);
        assert_eq!(a, page(3, 2));
        m.write(1 << 40, &mut a);
        assert_eq!(a, page(3, 1 << 40));
    }
}
