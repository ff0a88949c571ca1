//! # pagesift-scan: how much would deduplication save, and where?
//!
//! `pagesift scan` answers the operator's first question on the running
//! machine, read-only. Two drivers share one [`report::Report`]:
//! - exact mode hashes every present page (ground truth);
//! - [`sampled`] mode, the default, reads a budgeted sample chosen by the
//!   ladder and reports estimates with 95 % confidence intervals (the
//!   estimator is `pagesift_core::estimate`, explained in
//!   `docs/estimator.md`).

pub mod report;
pub mod sampled;
