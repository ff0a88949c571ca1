//! The short-lived experiments' measure: how much of each cycle's region
//! was merged before it was unmapped (UKSM §8.1.3).
//!
//! The smaps samples the bench takes every 250 ms catch a 200 ms region
//! once at best, so they cannot tell "merged before it went" from "not
//! merged". The workload knows: right before each unmap it counts its
//! region's KSM pages (pagemap + kpageflags) and appends a line to its
//! cycle log (`pagesift-workload short-lived --cycle-log FILE`). A run
//! keeps the cycles that were mapped at or after its t = 0 and unmapped
//! within its window, so that a region mapped before the system started,
//! or cut off by the window's end, counts for nothing either way.
//!
//! Invariants: every kept cycle has `0 ≤ mapped_s ≤ unmapped_s ≤ window`,
//! `pages > 0` and `merged ≤ pages`.

use pagesift_workload::CycleRecord;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One cycle of a short-lived workload, within a run's window.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cycle {
    /// When the region was mapped, s from the run's t = 0.
    pub mapped_s: f64,
    /// When it was counted, right before its unmap, s from t = 0.
    pub unmapped_s: f64,
    /// Its pages.
    pub pages: u64,
    /// Those that were KSM pages when it was counted.
    pub merged: u64,
}

impl Cycle {
    /// The share of its pages that were merged, 0..=1.
    pub fn share(&self) -> f64 {
        self.merged as f64 / self.pages as f64
    }
}

/// Whether a workload's arguments are a short-lived workload's (the ones
/// given a cycle log).
pub fn logs_cycles(args: &[String]) -> bool {
    args.first().is_some_and(|a| a == "short-lived")
}

/// Reads a cycle log (the workload's [`CycleRecord`] lines); keeps the cycles inside `[t0, t0 + window_s]` (Unix
/// seconds), in order. Lines that do not parse are an error: the workload
/// writes every one whole.
pub fn read_log(path: &Path, t0: f64, window_s: f64) -> Result<Vec<Cycle>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut kept = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let l: CycleRecord = serde_json::from_str(line)
            .map_err(|e| format!("{} line {}: {e}", path.display(), i + 1))?;
        let c = Cycle {
            mapped_s: l.mapped_at - t0,
            unmapped_s: l.unmapped_at - t0,
            pages: l.pages,
            merged: l.merged.min(l.pages),
        };
        if c.pages > 0 && c.mapped_s >= 0.0 && c.unmapped_s <= window_s {
            kept.push(c);
        }
    }
    Ok(kept)
}

/// Summary of a run's cycles.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CycleStats {
    /// Cycles counted.
    pub count: usize,
    /// The least merged share of any cycle.
    pub min: f64,
    /// The mean merged share.
    pub mean: f64,
    /// Cycles with at least 90 % of their pages merged.
    pub at_least_90: usize,
}

impl CycleStats {
    /// `None` for no cycle.
    pub fn of(cycles: &[Cycle]) -> Option<CycleStats> {
        if cycles.is_empty() {
            return None;
        }
        let shares = cycles.iter().map(Cycle::share);
        Some(CycleStats {
            count: cycles.len(),
            min: shares.clone().fold(1.0, f64::min),
            mean: shares.clone().sum::<f64>() / cycles.len() as f64,
            at_least_90: shares.filter(|&s| s >= 0.9).count(),
        })
    }

    /// One line for a run's notes.
    pub fn note(&self) -> String {
        format!(
            "cycles mapped and unmapped within the window: {}; merged before their unmap: \
             mean {:.1} %, least {:.1} %; {} of {} with ≥ 90 %",
            self.count,
            self.mean * 100.0,
            self.min * 100.0,
            self.at_least_90,
            self.count
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cycles_outside_the_window_are_dropped_and_shares_summarised() {
        let dir = std::env::temp_dir().join(format!("pagesift-cycles-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("c.jsonl");
        let t0 = 1000.0;
        let lines = [
            // Mapped before t = 0: not this system's.
            (999.5, 1000.5, 100, 0),
            (1001.0, 1002.0, 100, 100),
            (1003.0, 1004.0, 100, 50),
            // Cut off by the window's end (10 s).
            (1009.5, 1010.5, 100, 0),
        ];
        let text: String = lines
            .iter()
            .enumerate()
            .map(|(i, (m, u, p, k))| {
                format!(
                    "{{\"cycle\":{i},\"mapped_at\":{m},\"unmapped_at\":{u},\"pages\":{p},\"merged\":{k}}}\n"
                )
            })
            .collect();
        std::fs::write(&path, text).unwrap();
        let c = read_log(&path, t0, 10.0).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].mapped_s, 1.0);
        let s = CycleStats::of(&c).unwrap();
        assert_eq!((s.count, s.at_least_90), (2, 1));
        assert!((s.mean - 0.75).abs() < 1e-12 && (s.min - 0.5).abs() < 1e-12);
        assert!(s.note().contains("1 of 2"), "{}", s.note());
        assert_eq!(CycleStats::of(&[]), None);
        std::fs::write(&path, "{\"cycle\":0}\n").unwrap();
        assert!(read_log(&path, t0, 10.0).unwrap_err().contains("line 1"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_short_lived_workloads_log_cycles() {
        let args = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(logs_cycles(&args(&["short-lived", "--mib", "64"])));
        assert!(!logs_cycles(&args(&["cow-broken", "--mib", "64"])));
        assert!(!logs_cycles(&[]));
    }
}
