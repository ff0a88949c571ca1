//! # pagesift-bench: `pagesift bench`
//!
//! Reproduces the UKSM paper's emulated-workload evaluation (FAST '18 §8.1)
//! and a scaled version of its VM-boot benchmark (§8.2.1) on this machine,
//! running pagesift, the kernel's KSM at several settings and ksmtuned side
//! by side in one run, and writes CSV series, PNG plots and a markdown report.

pub mod guest;
pub mod ksmtuned;
pub mod plot;
pub mod series;
