//! ksmd as the loop sees it: a CPU share to pace it to, and its counters.
//!
//! pagesift owns `/sys/kernel/mm/ksm` while it runs: it snapshots the
//! settings it found, starts ksmd, paces it, and writes the snapshot back
//! when it stops (merged pages stay merged). [`KsmControl`] is that
//! ownership; the loop only says which share of one core ksmd should get:
//! the governor's top-level share while promoted memory is unmerged, a
//! trickle (the bottom level's share) when everything promoted is merged
//! Turning a share into `pages_to_scan` and
//! `sleep_millisecs`, closed-loop on ksmd's measured CPU time, is the
//! implementation's job.

use pagesift_core::Nanos;
use pagesift_core::pipeline::pacing::{
    KsmdPace, KsmdTick, PaceMode, Pacer, PacingConfig, PacingDemand,
};
use pagesift_linux::ksm::{AdvisorMode, GuardOptions, Ksm, KsmGuard, Ksmd, KsmdWait, Run};
use pagesift_linux::proc::KeptOpen;

/// ksmd's counters at one moment (`/sys/kernel/mm/ksm`) and its CPU time.
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
    /// Pages ksmd visited so far: `pages_scanned` plus `pages_skipped`
    /// (`None` on a kernel without them, before 6.7): where it is in a
    /// full scan (`core::pipeline::scan_clock`).
    pub pages_visited: Option<u64>,
}

/// The settings in force after a [`KsmControl::pace`] call.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Pacing {
    /// The share aimed at (fraction of one core): the target, or the
    /// trickle.
    pub share: f64,
    /// `pages_to_scan` written.
    pub pages_to_scan: u64,
    /// `sleep_millisecs` written.
    pub sleep_ms: u64,
    /// The share of the last tick that ksmd spent waiting for a CPU,
    /// runnable but not running (0 when unknown): how busy the machine
    /// kept it from the pace above.
    #[serde(default)]
    pub wait_share: f64,
}

/// Ownership of the kernel's KSM for the daemon's lifetime.
pub trait KsmControl {
    /// ksmd's counters now.
    fn sample(&mut self) -> Result<KsmSample, String>;
    /// Paces ksmd (called once per wake-up; the implementation closes the
    /// loop on ksmd's measured CPU and may act less often): towards
    /// `target_share` of one core while `unmerged_pages` promoted pages
    /// wait for ksmd (no more than a few full scans of `scan_pages` pages
    /// a second need, see `core::pipeline::pacing`), at a trickle when there are
    /// none.
    fn pace(
        &mut self,
        target_share: f64,
        unmerged_pages: u64,
        scan_pages: u64,
        now: Nanos,
    ) -> Result<Pacing, String>;
    /// Writes back the settings found at start. Also done on drop; calling
    /// it twice is harmless.
    fn restore(&mut self) -> Result<(), String>;
}

/// The real KSM: a [`KsmGuard`] (lock + snapshot, restored on drop, on
/// SIGTERM through `TerminationWatch`, and after a SIGKILL by the next
/// owner), ksmd's CPU time, and the closed-loop [`Pacer`] of
/// `pagesift_core::pipeline::pacing`.
///
/// On the first [`KsmControl::pace`] it turns the scan-time advisor off (it
/// would overwrite `pages_to_scan`), writes the pacer's first pace and
/// starts ksmd (`run=1`). After that it ticks the pacer about once a second
/// (the interval the pacer is designed for), and at once when the demand
/// switches between merging and trickling or its full scan more than
/// doubles ([`PACE_JUMP_PAGES`]).
pub struct SysKsm {
    guard: KsmGuard,
    ksmd: Option<Ksmd>,
    /// `pages_shared`, `pages_sharing` and `full_scans`, kept open; `None`
    /// if one could not be opened (then each sample opens them).
    counters: Option<[KeptOpen; 3]>,
    /// `pages_scanned` and `pages_skipped`, kept open; `None` on a kernel
    /// without them (or if one could not be opened).
    visited: Option<[KeptOpen; 2]>,
    /// ksmd's wait for a CPU; `None` without schedstats (the pacer then
    /// counts that wait as sleep).
    wait: Option<KsmdWait>,
    pacer: Pacer,
    /// When the pacer last ticked, and ksmd's CPU time and wait then.
    last: Option<(Nanos, u64, u64)>,
    /// The share of that tick ksmd waited for a CPU.
    wait_share: f64,
    written: Option<KsmdPace>,
    /// The demand's `scan_pages` at the last tick.
    ticked_scan_pages: u64,
}

/// The counters [`KsmControl::sample`] reads, in [`KsmSample`]'s order.
const COUNTERS: [&str; 3] = ["pages_shared", "pages_sharing", "full_scans"];
/// The counters whose sum is [`KsmSample::pages_visited`].
const VISITED: [&str; 2] = ["pages_scanned", "pages_skipped"];

/// How often the pacer ticks while the demand does not change regime.
const PACE_TICK: Nanos = 1_000_000_000;
/// A demand whose full scan grew past twice its size at the last tick, by
/// more than this many pages (a large promotion), is paced for at once.
/// Below it the pacer's quick rate for small sets
/// (`PacingConfig::quick_scans_per_s`) already covers the new pages.
/// pagesift's choice: 4 MiB.
pub(crate) const PACE_JUMP_PAGES: u64 = 1024;

/// Whether a full scan of `scan_pages` pages is such a jump from
/// `before` ([`PACE_JUMP_PAGES`]).
pub(crate) fn demand_jumped(scan_pages: u64, before: u64) -> bool {
    scan_pages > before.saturating_mul(2).saturating_add(PACE_JUMP_PAGES)
}

/// The counters `names`, each kept open; `None` if one cannot be (a
/// kernel without it).
fn keep_open_all<const N: usize>(ksm: &Ksm, names: [&str; N]) -> Option<[KeptOpen; N]> {
    let files = names
        .map(|name| ksm.keep_open(name))
        .into_iter()
        .collect::<Result<Vec<_>, _>>()
        .ok()?;
    <[KeptOpen; N]>::try_from(files).ok()
}

impl SysKsm {
    /// Takes ownership of KSM, waiting at most `wait` for the lock (another
    /// pagesift daemon, or a test, may hold it).
    ///
    /// Giving KSM back never writes `run=2`: that would unmerge every KSM
    /// page of the machine, other processes' too. `--unmerge-on-exit` is
    /// done by the loop instead, by unmarking exactly what pagesift marked.
    pub fn acquire(
        pacing: PacingConfig,
        wait: Option<std::time::Duration>,
    ) -> Result<SysKsm, String> {
        let pacer = Pacer::new(pacing).map_err(|e| e.to_string())?;
        let guard = KsmGuard::acquire_with(GuardOptions {
            wait,
            ..GuardOptions::default()
        })
        .map_err(|e| format!("cannot take ownership of KSM: {e}"))?;
        if let Some(r) = guard.recovered() {
            tracing::warn!(report = %r, "a previous owner of KSM died without restoring it: restored its settings first");
        }
        guard.set_unmerge_on_restore(false);
        let ksmd = Ksmd::find().ok();
        if ksmd.is_none() {
            tracing::warn!("no ksmd thread found: its CPU time is not measured");
        }
        let wait = ksmd.and_then(|k| match k.wait_reader() {
            Ok(w) => Some(w),
            Err(e) => {
                tracing::info!(error = %e, "ksmd's wait for a CPU is not measured: the pacer counts it as sleep");
                None
            }
        });
        let counters = keep_open_all(guard.ksm(), COUNTERS);
        let visited = keep_open_all(guard.ksm(), VISITED);
        Ok(SysKsm {
            guard,
            ksmd,
            counters,
            visited,
            wait,
            pacer,
            last: None,
            wait_share: 0.0,
            written: None,
            ticked_scan_pages: 0,
        })
    }

    /// The guard (read access to KSM, the snapshot).
    pub fn guard(&self) -> &KsmGuard {
        &self.guard
    }

    fn ksmd_cpu(&self) -> u64 {
        self.ksmd.and_then(|k| k.cpu_ns().ok()).unwrap_or(0)
    }

    fn ksmd_wait(&mut self) -> u64 {
        self.wait.as_mut().and_then(|w| w.ns().ok()).unwrap_or(0)
    }

    fn write(&mut self, pace: KsmdPace) -> Result<(), String> {
        if self.written != Some(pace) {
            self.guard.set_pace(pace).map_err(|e| e.to_string())?;
            self.written = Some(pace);
        }
        Ok(())
    }
}

impl KsmControl for SysKsm {
    fn sample(&mut self) -> Result<KsmSample, String> {
        // Three counters, not all eleven: this runs every second.
        let [shared, sharing, scans] = match &self.counters {
            Some(files) => {
                let read = |f: &KeptOpen| Ksm::parse_count(f).map_err(|e| e.to_string());
                [read(&files[0])?, read(&files[1])?, read(&files[2])?]
            }
            None => {
                let ksm = self.guard.ksm();
                let mut v = [0; 3];
                for (out, name) in v.iter_mut().zip(COUNTERS) {
                    *out = (ksm.read_name(name).map_err(|e| e.to_string())?)
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(0);
                }
                v
            }
        };
        let pages_visited = self.visited.as_ref().and_then(|[scanned, skipped]| {
            let read = |f: &KeptOpen| Ksm::parse_count(f).ok();
            Some(read(scanned)? + read(skipped)?)
        });
        Ok(KsmSample {
            ksmd_cpu_ns: self.ksmd_cpu(),
            pages_shared: shared,
            pages_sharing: sharing,
            full_scans: scans,
            pages_visited,
        })
    }

    fn pace(
        &mut self,
        target_share: f64,
        unmerged_pages: u64,
        scan_pages: u64,
        now: Nanos,
    ) -> Result<Pacing, String> {
        let demand = PacingDemand {
            target_share,
            unmerged_pages,
            scan_pages,
        };
        match self.last {
            None => {
                if self.guard.ksm().advisor_mode().ok().flatten() == Some(AdvisorMode::ScanTime) {
                    self.guard
                        .set_advisor_mode(AdvisorMode::None)
                        .map_err(|e| e.to_string())?;
                }
                let pace = self.pacer.start(demand);
                self.write(pace)?;
                self.ticked_scan_pages = scan_pages;
                self.guard.set_run(Run::Run).map_err(|e| e.to_string())?;
                self.last = Some((now, self.ksmd_cpu(), self.ksmd_wait()));
            }
            Some((t, cpu, wait)) => {
                let active = self.pacer.mode() == PaceMode::Active;
                let switch = active != (unmerged_pages > 0 && target_share > 0.0);
                // The caller asks between ticks only when the demand jumped
                // (a large promotion): tick then too, the pace in force so
                // far is what the shorter window measured.
                let jumped = demand_jumped(scan_pages, self.ticked_scan_pages);
                if switch || jumped || now.saturating_sub(t) >= PACE_TICK {
                    let (cpu_now, wait_now) = (self.ksmd_cpu(), self.ksmd_wait());
                    let tick = KsmdTick {
                        cpu_ns: cpu_now.saturating_sub(cpu),
                        wait_ns: wait_now.saturating_sub(wait),
                        wall_ns: now.saturating_sub(t),
                    };
                    // The kernel adds a wait to the run delay when it
                    // ends, so a short tick may be given more than its
                    // length.
                    self.wait_share = (tick.wait_ns as f64 / tick.wall_ns.max(1) as f64).min(1.0);
                    let pace = self.pacer.tick(tick, demand);
                    self.write(pace)?;
                    self.last = Some((now, cpu_now, wait_now));
                    self.ticked_scan_pages = scan_pages;
                }
            }
        }
        let pace = self.pacer.pace();
        Ok(Pacing {
            share: self.pacer.target_share(),
            pages_to_scan: pace.pages_to_scan as u64,
            sleep_ms: pace.sleep_millisecs as u64,
            wait_share: self.wait_share,
        })
    }

    fn restore(&mut self) -> Result<(), String> {
        let report = self.guard.restore();
        if report.is_complete() {
            Ok(())
        } else {
            Err(report.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_promotion_is_a_jump_and_small_growth_is_not() {
        // A 64 MiB region promoted beside a few hundred pages of heap.
        assert!(demand_jumped(16_384 + 133, 133));
        // From nothing, anything past the floor.
        assert!(demand_jumped(PACE_JUMP_PAGES + 1, 0));
        assert!(!demand_jumped(PACE_JUMP_PAGES, 0));
        // Doubling a large set is not enough; more than doubling is.
        assert!(!demand_jumped(2 * 100_000 + PACE_JUMP_PAGES, 100_000));
        assert!(demand_jumped(2 * 100_000 + PACE_JUMP_PAGES + 1, 100_000));
        // Shrinking never is, and nothing overflows.
        assert!(!demand_jumped(10, 20_000));
        assert!(!demand_jumped(u64::MAX, u64::MAX));
    }
}
