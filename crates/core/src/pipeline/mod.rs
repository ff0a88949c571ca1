//! # The daemon's algorithms, one module per stage of the pipeline
//!
//! `pagesift run` repeats one wake-up: discover → sample → index → ladder →
//! actuate → account (docs/ARCHITECTURE.md). Discovery is the operating
//! system's job (`pagesift-linux`, behind [`crate::source::MemorySource`]);
//! every decision after it is here, in the order a page meets them:
//!
//! | stage | modules |
//! |---|---|
//! | **sample** | [`governor`] (CPU share → page budget per level), [`hints`] (XLH's stack of pages that just received file data, interleaved with the walk), [`ladder`] (levels, per-region permutations, judgement) |
//! | **index** | [`hash`] (progressive partial hash), [`strength`] (how many words it reads), [`index`] (sharded stable/unstable tables) |
//! | **one wake-up** | [`distill`] (sample → index → ladder, with the budgets above) |
//! | **sweep** | [`sweep`] (every present page hashed once per epoch: duplicates wherever their twins live) |
//! | **actuate** | [`write_watch`] (mark a region, around its written zones, or not at all), [`lifecycle`] (a region's modes: sampling, promoted and merging, settled, held, foreign; its COW accounting; which regions the ladder must not see), [`lifespan`] (regions of a process whose large regions die young wait before they are marked), [`recurrence`] (a region mapped again where its process's last one was marked goes to the top at once), [`pacing`] (ksmd's closed loop), [`scan_clock`] (where ksmd is in its full scan, which spaces the looks at merging regions), [`placement`] (nuKSM: which NUMA node a merged page lives on) |
//! | **account** | [`savings`] (per-process figures grouped by cgroup, top N) |
//! | **beside the loop** | [`scrub`] (Singleton: drop the host's page-cache copy of what a guest holds), [`spacing`] (how long a costly look at the system waits before the next, at a CPU share) |
//!
//! Invariant (the crate's): no `unsafe`, no I/O, no syscalls, no clock.
//! Time and measured costs come in as arguments, so the same code runs the
//! live daemon, the read-only sampled scan and the seeded simulation.

pub mod distill;
pub mod governor;
pub mod hash;
pub mod hints;
pub mod index;
pub mod ladder;
pub mod lifecycle;
pub mod lifespan;
pub mod pacing;
pub mod placement;
pub mod recurrence;
pub mod savings;
pub mod scan_clock;
pub mod scrub;
pub mod spacing;
pub mod strength;
pub mod sweep;
pub mod write_watch;
