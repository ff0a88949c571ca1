//! ns per page of the progressive partial hash (UKSM §6.2) against the
//! full-page baselines: xxh3-64, SuperFastHash (the paper's baseline) and a
//! full-page comparison of two equal pages (what a false collision costs).
//!
//! `scripts/bench-hash` runs this and turns criterion's estimates into the
//! hash section of docs/benchmarks.md, with the goals checked there:
//! strength 1024 no slower than SuperFastHash, strength 1 at least 50x and
//! strength 8 at least 10x faster than full-page xxh3.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use pagesift_core::pipeline::hash::{HASH_INIT, PartialHasher, STRENGTH_FULL, Shifts};
use pagesift_core::research::superfasthash::super_fast_hash;
use pagesift_core::{PAGE_SIZE, PageWords, WORDS_PER_PAGE};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// A page of random words: no structure for any hash to exploit.
fn random_page(seed: u64) -> Box<PageWords> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut page = Box::new([0u32; WORDS_PER_PAGE]);
    for w in page.iter_mut() {
        *w = rng.next_u32();
    }
    page
}

fn page_bytes(page: &PageWords) -> Box<[u8; PAGE_SIZE]> {
    let mut bytes = Box::new([0u8; PAGE_SIZE]);
    for (chunk, w) in bytes.chunks_exact_mut(4).zip(page.iter()) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    bytes
}

/// Figure 5 exactly as printed, at full strength.
#[inline(never)]
fn figure5(h: &PartialHasher, page: &PageWords) -> u32 {
    let (l, r) = (black_box(h.shifts().left), black_box(h.shifts().right));
    let mut hash = HASH_INIT;
    for &pos in h.offsets().iter() {
        hash = hash.wrapping_add(page[pos as usize & (WORDS_PER_PAGE - 1)]);
        hash = hash.wrapping_add(hash << l);
        hash ^= hash >> r;
    }
    hash
}

fn pair_name(shifts: Shifts) -> String {
    format!("l{}_r{}", shifts.left, shifts.right)
}

fn bench_hash(c: &mut Criterion) {
    let page = random_page(1);
    let bytes = page_bytes(&page);

    let mut g = c.benchmark_group("hash");
    g.throughput(Throughput::Elements(1));

    // The chosen pair at the strengths the controller moves between.
    let default = PartialHasher::new(42, Shifts::DEFAULT);
    for strength in [1u32, 8, 64, 256, 1024] {
        g.bench_with_input(
            BenchmarkId::new("strength", strength),
            &strength,
            |b, &s| b.iter(|| default.hash(black_box(&page), black_box(s))),
        );
    }

    // Both candidate pairs at full strength, forward and inverse.
    for shifts in [Shifts::PAPER, Shifts::RELEASED] {
        let h = PartialHasher::new(42, shifts);
        g.bench_function(BenchmarkId::new("full", pair_name(shifts)), |b| {
            b.iter(|| h.hash(black_box(&page), black_box(STRENGTH_FULL)))
        });
        let full = h.hash(&page, STRENGTH_FULL);
        g.bench_function(BenchmarkId::new("inverse", pair_name(shifts)), |b| {
            b.iter(|| {
                h.rehash(
                    black_box(&page),
                    black_box(full),
                    black_box(STRENGTH_FULL),
                    black_box(0),
                )
            })
        });
    }

    // Figure 5 as printed, for the default pair: what the rearranged loop
    // in `PartialHasher::fold` saves.
    let h = PartialHasher::new(42, Shifts::DEFAULT);
    g.bench_function(
        BenchmarkId::new("figure5_as_printed", pair_name(Shifts::DEFAULT)),
        |b| b.iter(|| figure5(&h, black_box(&page))),
    );

    g.bench_function("xxh3_64", |b| {
        b.iter(|| twox_hash::XxHash3_64::oneshot(black_box(&bytes[..])))
    });
    g.bench_function("superfasthash", |b| {
        b.iter(|| super_fast_hash(black_box(&bytes[..])))
    });

    // Two distinct but equal pages: the comparison has to read both whole.
    let twin = page.clone();
    g.bench_function("memcmp", |b| {
        b.iter(|| black_box(&page[..]) == black_box(&twin[..]))
    });
    g.finish();
}

fn config() -> Criterion {
    // Short runs keep scripts/bench-hash within a few minutes; every case
    // takes at most a microsecond or two, so 2 s still gives millions of
    // iterations.
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(50)
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench_hash
}
criterion_main!(benches);
