//! The scan report shared by exact and sampled mode (SCAN.md's types).
//!
//! This is the sampled helper's minimal copy; exact mode owns the real
//! `report.rs` (human table, `--json`). The one addition here is
//! [`Mode::Sampled`]'s `exhaustive` flag: the budget covered every present
//! page, so the sampled scan fell back to reading all of them and every
//! interval has zero width.

use serde::Serialize;

/// A value with its 95 % interval (`low == high == value` when exact).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub value: f64,
    pub low: f64,
    pub high: f64,
}

impl Estimate {
    /// A value known exactly.
    pub fn exact(value: f64) -> Self {
        Estimate {
            value,
            low: value,
            high: value,
        }
    }
}

/// What a region's memory looks like over the scan window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Class {
    StaticallyDuplicated,
    Sparse,
    Changing,
}

/// Page counts of a region, a process or the system.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Counts {
    /// Virtual pages.
    pub size_pages: u64,
    /// Present pages that KSM could look at: anonymous pages (COWed pages
    /// of private file mappings included), zero-page mappings and KSM
    /// pages.
    pub present: u64,
    /// Mappings of the shared zero page.
    pub zero: u64,
    /// Pages already merged by KSM.
    pub merged: u64,
    /// Pages with a twin in the same region.
    pub dup_in_region: Estimate,
    /// Pages with a twin in the same process, none in the region.
    pub dup_in_process: Estimate,
    /// Pages whose twins are all in other processes.
    pub dup_across: Estimate,
    /// Pages saved if every duplicate were merged: frames − distinct
    /// contents.
    pub saving: Estimate,
}

/// One region (VMA).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RegionReport {
    pub start: u64,
    pub end: u64,
    pub name: String,
    pub counts: Counts,
    pub class: Option<Class>,
}

/// One process; `regions` sorted by saving.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ProcessReport {
    pub pid: u32,
    pub comm: String,
    pub counts: Counts,
    pub regions: Vec<RegionReport>,
}

/// How the numbers were obtained.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub enum Mode {
    Exact,
    Sampled {
        budget_ms: u64,
        sampled_pages: u64,
        seed: u64,
        /// The budget covered every present page: all were read and the
        /// intervals have zero width.
        exhaustive: bool,
    },
}

/// A scan's result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub mode: Mode,
    /// Sorted by saving.
    pub processes: Vec<ProcessReport>,
    pub totals: Counts,
    /// Processes that could not be opened, with why.
    pub skipped: Vec<(u32, String)>,
    /// Processes that exited during the scan.
    pub gone: u64,
    pub elapsed_ms: u64,
    /// Pages read from targets (sampled pages and verification reads).
    pub pages_read: u64,
}

/// Why a scan failed as a whole.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// Discovery or access failed: a missing capability (named), a pid
    /// that does not exist, pagesift's own pid, an unsupported kernel.
    #[error(transparent)]
    Linux(#[from] pagesift_linux::LinuxError),
    /// An option has a value that cannot work.
    #[error("invalid option {key}: {reason}")]
    InvalidOption { key: &'static str, reason: String },
}
