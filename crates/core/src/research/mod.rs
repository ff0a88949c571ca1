//! # Research tools: the papers' baselines and a seeded simulation
//!
//! Nothing here runs in the daemon or the scan. These modules reproduce
//! the papers' evaluation, so they sit behind the `research` cargo feature
//! (off by default) and a production build does not carry them:
//!
//! - [`sim`]: a deterministic simulation of UKSM §5.1's four region kinds
//!   run through the real [`crate::pipeline::distill::Distiller`] and a model
//!   of ksmd (`pagesift simulate`, the daemon's loop tests).
//! - [`superfasthash`]: the baseline UKSM §6 measures its partial hash
//!   against (`benches/hash.rs`).
//! - [`avalanche`]: UKSM §6.2's avalanche bias matrix, used to judge a hash
//!   (`examples/avalanche.rs`).
//!
//! Same invariant as the rest of the crate: no `unsafe`, no I/O, no clock.

pub mod avalanche;
pub mod sim;
pub mod superfasthash;
