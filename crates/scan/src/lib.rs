//! # pagesift-scan: how much would deduplication save, and where?
//!
//! `pagesift scan` answers the operator's first question on the running
//! machine, read-only. Two drivers share one [`report::Report`]:
//!
//! - [`exact`]: every present page of the selected processes is read,
//!   hashed and grouped with byte-exact verification. Ground truth, at
//!   about the speed of reading memory.
//! - [`sampled`] (the default mode of the CLI): the core's ladder,
//!   progressive hash and sample index within a time budget, reporting
//!   estimates with confidence intervals.
//!
//! - [`stats`]: the statistics both drivers report, pure and property-tested
//!   without root: [`stats::census`] (exact grouping: who holds which
//!   duplicate, who would save what) and [`stats::estimate`] (the sampled
//!   estimator and its 95 % intervals). They live here, not in
//!   `pagesift-core`, because only `pagesift scan` uses them; the core keeps
//!   the algorithms the daemon runs.
//!
//! Both are read-only: they never change a target's memory, mappings or
//! KSM state (see `pagesift_linux` for how pages are reached without
//! faulting anything in or breaking sharing).

pub mod exact;
pub mod report;
pub mod sampled;
pub mod stats;

pub use report::{Report, ScanError};
