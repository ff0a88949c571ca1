//! # pagesift-daemon: `pagesift run`, the deduplicating daemon
//!
//! UKSM's design (FAST '18) on a stock kernel, whose only page-merging
//! primitive is KSM: ksmd merges `VM_MERGEABLE` ranges. pagesift samples
//! memory itself with UKSM's hierarchical region distilling
//! (`pagesift-core`), decides which ranges deserve merging, marks exactly
//! those mergeable inside their owner process, paces ksmd to the governor's
//! CPU budget, backs out of ranges that thrash, and reports what it saved
//! and where.
//!
//! ## Pieces, before the code
//! - [`config`]: the TOML file (every threshold of the paper, eligibility,
//!   socket, metrics) with errors that name the key.
//! - [`eligibility`]: which processes may be merged: the operator's allow
//!   and deny lists; pagesift never merges itself.
//! - [`target`]: the machine as the loop sees it (regions, where they live,
//!   page states), over `pagesift-linux`.
//! - [`actuate`]: the [`actuate::Actuator`] that runs `madvise` batches in a
//!   target (ptrace injection), and the ledger of what pagesift marked.
//! - [`ksmd`]: the [`ksmd::KsmControl`] that owns `/sys/kernel/mm/ksm` and
//!   paces ksmd to a CPU share.
//! - [`daemon`]: the loop itself (its header explains one wake-up).
//! - [`ksm_stat_reads`]: the kernel's per-process KSM figures for the
//!   status, read at a bounded share of a core.
//! - [`status`] and [`metrics`]: `pagesift status` over a unix socket and
//!   Prometheus metrics over HTTP.
//! - [`run`]: `pagesift run` wired to the real machine: signals, reload,
//!   servers, shutdown.

pub mod actuate;
pub mod config;
pub mod daemon;
pub mod eligibility;
pub mod ksm_stat_reads;
pub mod ksmd;
pub mod ledger;
pub mod metrics;
pub mod numa;
pub mod run;
pub mod scrub;
pub mod snapshots;
pub mod status;
pub mod sweep;
pub mod target;
pub mod watchdog;

#[cfg(test)]
mod loop_tests;
#[cfg(test)]
mod sim;
