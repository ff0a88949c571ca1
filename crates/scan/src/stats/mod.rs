//! # The scan's statistics: pure bookkeeping behind `pagesift scan`
//!
//! - [`census`]: the exact scan's grouping of frames into content groups,
//!   and who holds which duplicate and would save what.
//! - [`estimate`]: the sampled scan's estimator of the same quantities, with
//!   honest 95 % intervals, sampling through the core's ladder.
//!
//! Invariant: like `pagesift-core`, nothing here does I/O, makes a syscall
//! or reads a clock (time is passed in), so both are property-tested against
//! brute-force counts without root. They moved here from the core because
//! the scan is their only user.

pub mod census;
pub mod estimate;
