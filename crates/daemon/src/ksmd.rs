//! ksmd as the loop sees it: a CPU share to pace it to, and its counters.
//!
//! pagesift owns `/sys/kernel/mm/ksm` while it runs: it snapshots the
//! settings it found, starts ksmd, paces it, and writes the snapshot back
//! when it stops (merged pages stay merged). [`KsmControl`] is that
//! ownership; the loop only says which share of one core ksmd should get:
//! the governor's top-level share while promoted memory is unmerged, a
//! trickle (the bottom level's share) when everything promoted is merged
//! (issue 4, "Pace ksmd"). Turning a share into `pages_to_scan` and
//! `sleep_millisecs`, closed-loop on ksmd's measured CPU time, is the
//! implementation's job.

use pagesift_core::Nanos;

/// ksmd's counters at one moment (`/sys/kernel/mm/ksm`, mainline-ksm.md
/// §1.2) and its CPU time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KsmSample {
    /// ksmd's CPU time so far, ns.
    pub ksmd_cpu_ns: u64,
    /// KSM pages in use.
    pub pages_shared: u64,
    /// Further mappings of them: pages saved.
    pub pages_sharing: u64,
    /// Completed passes over all mergeable memory.
    pub full_scans: u64,
}

/// The settings one [`KsmControl::pace`] call wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Pacing {
    /// The share asked for (fraction of one core).
    pub share: f64,
    /// `pages_to_scan` written.
    pub pages_to_scan: u64,
    /// `sleep_millisecs` written.
    pub sleep_ms: u64,
}

/// Ownership of the kernel's KSM for the daemon's lifetime.
pub trait KsmControl {
    /// ksmd's counters now.
    fn sample(&mut self) -> Result<KsmSample, String>;
    /// Paces ksmd towards `share` of one core (called once per wake-up;
    /// the implementation closes the loop on ksmd's measured CPU).
    fn pace(&mut self, share: f64, now: Nanos) -> Result<Pacing, String>;
    /// Writes back the settings found at start. Also done on drop; calling
    /// it twice is harmless.
    fn restore(&mut self) -> Result<(), String>;
}
