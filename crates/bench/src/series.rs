//! Time series, the harness's one data type: every measure of every run is
//! a [`Series`] of (seconds since the run started, value) points, sampled at
//! ≥ 2 Hz. CSV files, plots and the report are all made from these.

use serde::{Deserialize, Serialize};

/// One measure of one system in one experiment, over time.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// The system measured, as the report names it: `pagesift-full`,
    /// `ksm-1000`, `ksm-advisor`, `ksmtuned`, ...
    pub system: String,
    /// What is measured: `saved_mib`, `cpu_percent`, `cpu_seconds`,
    /// `cow_breaks`, `pss_mib`, ...
    pub metric: String,
    /// Unit of the values, for axis labels (`MiB`, `% of a core`, `s`).
    pub unit: String,
    /// (seconds since the run started, value), in time order.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// An empty series.
    pub fn new(system: &str, metric: &str, unit: &str) -> Self {
        Series {
            system: system.to_string(),
            metric: metric.to_string(),
            unit: unit.to_string(),
            points: Vec::new(),
        }
    }

    /// Appends a point; time must not go backwards.
    pub fn push(&mut self, seconds: f64, value: f64) {
        debug_assert!(self.points.last().is_none_or(|&(t, _)| t <= seconds));
        self.points.push((seconds, value));
    }

    /// The last value, if any.
    pub fn last(&self) -> Option<f64> {
        self.points.last().map(|&(_, v)| v)
    }
}
