//! The sampler: what a run measures, read a few times a second.
//!
//! Each [`Sampler::sample`] reads, through `pagesift-linux`:
//! - KSM's counters: memory saved = (`pages_sharing` + `ksm_zero_pages`)
//!   × 4 KiB (Documentation/admin-guide/mm/ksm.rst), and `pages_to_scan` (which the
//!   advisor, ksmtuned or a pacer move);
//! - the workload's footprint: Σ PSS and Σ (Anonymous − Pss_Anon) over
//!   every process of the workload's process groups (children included)
//!   from `smaps_rollup`. The growth of Σ (Anonymous − Pss_Anon) since
//!   t = 0 is the anonymous memory physically saved, which KSM's lazy
//!   counters miss after COW
//!   breaks; file pages (shared libraries of several QEMUs) stay out of
//!   it;
//! - CPU: ksmd's (`schedstat`), the pagesift daemon's (its process
//!   CPU-time clock, to the ns, all threads, from t = 0: the run starts
//!   the clock once the daemon has started and notes its start-up CPU
//!   apart), and ksmtuned's
//!   (the caller passes it in), plus their sum;
//! - COW breaks of KSM pages: `cow_ksm` of `/proc/vmstat` since t = 0.
//!
//! Every measure becomes a [`Series`] of (seconds since t = 0, value).

use crate::BenchError;
use crate::series::Series;
use pagesift_linux::ksm::{Knob, Ksm, KsmVmstat, Ksmd, KsmdWait};
use pagesift_linux::procstat;
use std::time::{Duration, Instant};

const MIB: f64 = 1024.0 * 1024.0;
const PAGE: f64 = pagesift_linux::PAGE_SIZE as f64;

/// Metric names, as in CSV file names and the report.
pub mod metric {
    /// KSM's counters: (pages_sharing + ksm_zero_pages) × 4 KiB, MiB.
    pub const SAVED: &str = "saved_mib";
    /// Σ (Anonymous − Pss_Anon) of the workload since t = 0, MiB.
    pub const SAVED_PSS: &str = "saved_pss_mib";
    /// Σ PSS of the workload, MiB.
    pub const PSS: &str = "pss_mib";
    /// Cumulative CPU of the deduplicating system (daemon + ksmd + ksmtuned), s.
    pub const CPU: &str = "cpu_seconds";
    /// Cumulative ksmd CPU since t = 0, s.
    pub const KSMD_CPU: &str = "ksmd_cpu_seconds";
    /// Cumulative pagesift daemon CPU since t = 0 (its start-up, before
    /// t = 0, is left out and noted by the run), s.
    pub const DAEMON_CPU: &str = "daemon_cpu_seconds";
    /// Cumulative ksmtuned CPU since its start, s.
    pub const KSMTUNED_CPU: &str = "ksmtuned_cpu_seconds";
    /// CPU of the system over the last second, % of one core.
    pub const CPU_PERCENT: &str = "cpu_percent";
    /// `cow_ksm` since t = 0.
    pub const COW: &str = "cow_breaks";
    /// KSM's `pages_to_scan` knob.
    pub const PAGES_TO_SCAN: &str = "pages_to_scan";
    /// Page-cache experiment: host page cache of the guests' images, MiB.
    pub const IMAGE_CACHE_MIB: &str = "image_cache_mib";
    /// Page-cache experiment: the guests' read throughput over the
    /// window, MiB/s (one point).
    pub const GUEST_READ_MIB_S: &str = "guest_read_mib_s";
    /// Page-cache experiment: host cache hit ratio of the QEMU processes'
    /// reads, 1 − read_bytes ÷ rchar (one point).
    pub const HOST_HIT_RATIO: &str = "host_hit_ratio";
    /// Page-cache experiment: 1 if every guest's md5 matched (one point).
    pub const DATA_INTACT: &str = "data_intact";
    /// Guest-files experiment: the located copies of the file data in
    /// guest RAM less the frames backing them, MiB
    /// ([`crate::guest_files::saved_pages`]).
    pub const FILE_SAVED: &str = "file_saved_mib";
}

/// Reads the measures of one run.
pub struct Sampler {
    ksm: Ksm,
    ksmd: Ksmd,
    /// ksmd's wait for a CPU (schedstat), and its value at t = 0; `None`
    /// without schedstats.
    ksmd_wait: Option<(KsmdWait, u64)>,
    t0: Instant,
    groups: Vec<u32>,
    members: Vec<u32>,
    members_at: Option<Instant>,
    daemon: Option<u32>,
    base_ksmd_ns: u64,
    base_scanned: Option<u64>,
    /// The hypervisor's steal at t = 0, ms (`None` when not counted).
    base_stolen_ms: Option<u64>,
    base_cow: u64,
    base_shared_kib: Option<f64>,
    /// The daemon's CPU at t = 0 (its start-up), left out of the window.
    base_daemon_ns: u64,
    last_daemon_s: f64,
    /// saved, saved_pss, pss, cpu, ksmd, daemon, ksmtuned, cow, pages_to_scan.
    series: [Series; 9],
}

impl Sampler {
    /// A sampler for `system` whose t = 0 is now, watching the workload
    /// process groups `groups` and, if given, the daemon `daemon`.
    pub fn start(
        system: &str,
        groups: Vec<u32>,
        daemon: Option<u32>,
    ) -> Result<Sampler, BenchError> {
        let ksm = Ksm::open()?;
        let ksmd = Ksmd::find()?;
        let base_ksmd_ns = ksmd.cpu_ns()?;
        let ksmd_wait = ksmd.wait_reader().ok().and_then(|mut w| {
            let base = w.ns().ok()?;
            Some((w, base))
        });
        let base_scanned = ksm.counters()?.pages_scanned;
        let base_cow = KsmVmstat::read()?.cow_ksm.unwrap_or(0);
        let names = [
            (metric::SAVED, "MiB"),
            (metric::SAVED_PSS, "MiB"),
            (metric::PSS, "MiB"),
            (metric::CPU, "CPU-s"),
            (metric::KSMD_CPU, "CPU-s"),
            (metric::DAEMON_CPU, "CPU-s"),
            (metric::KSMTUNED_CPU, "CPU-s"),
            (metric::COW, "breaks"),
            (metric::PAGES_TO_SCAN, "pages"),
        ];
        Ok(Sampler {
            ksm,
            ksmd,
            ksmd_wait,
            t0: Instant::now(),
            groups,
            members: Vec::new(),
            members_at: None,
            daemon,
            base_ksmd_ns,
            base_scanned,
            base_stolen_ms: pagesift_linux::host::stolen_ms(),
            base_cow,
            base_shared_kib: None,
            base_daemon_ns: daemon.and_then(|p| procstat::cpu_ns(p).ok()).unwrap_or(0),
            last_daemon_s: 0.0,
            series: names.map(|(m, u)| Series::new(system, m, u)),
        })
    }

    /// Watches one more process group (a guest started during the run).
    pub fn add_group(&mut self, pgid: u32) {
        self.groups.push(pgid);
        self.members_at = None;
    }

    /// When t = 0 was.
    pub fn t0(&self) -> Instant {
        self.t0
    }

    /// Seconds since t = 0.
    pub fn elapsed(&self) -> f64 {
        self.t0.elapsed().as_secs_f64()
    }

    /// Pages ksmd scanned since t = 0 (`pages_scanned`, Linux 6.6+).
    pub fn ksmd_pages_scanned(&self) -> Result<Option<u64>, BenchError> {
        let now = self.ksm.counters()?.pages_scanned;
        Ok(now.zip(self.base_scanned).map(|(n, b)| n.saturating_sub(b)))
    }

    /// ksmd's wait for a CPU since t = 0, ns: runnable but not running
    /// (`None` without schedstats).
    pub fn ksmd_wait_ns(&mut self) -> Option<u64> {
        let (w, base) = self.ksmd_wait.as_mut()?;
        Some(w.ns().ok()?.saturating_sub(*base))
    }

    /// CPU time the hypervisor took from the machine since t = 0, ms, all
    /// CPUs together (`None` when the kernel does not count it).
    pub fn stolen_ms(&self) -> Option<u64> {
        let now = pagesift_linux::host::stolen_ms()?;
        Some(now.saturating_sub(self.base_stolen_ms?))
    }

    /// ksmd's CPU since t = 0, ns (for a pacer).
    pub fn ksmd_cpu_ns(&self) -> Result<u64, BenchError> {
        Ok(self.ksmd.cpu_ns()?.saturating_sub(self.base_ksmd_ns))
    }

    /// Takes one sample; `ksmtuned_cpu_s` is ksmtuned's CPU so far when it
    /// runs.
    pub fn sample(&mut self, ksmtuned_cpu_s: Option<f64>) -> Result<(), BenchError> {
        let t = self.elapsed();
        let c = self.ksm.counters()?;
        let saved = c.pages_saved() as f64 * PAGE / MIB;
        let pages_to_scan = self.ksm.number(Knob::PagesToScan)?.unwrap_or(0) as f64;
        // Group members change rarely (fork-family children appear before
        // the report); refresh the list once a second.
        if self
            .members_at
            .is_none_or(|at| at.elapsed() >= Duration::from_secs(1))
        {
            self.members = self
                .groups
                .iter()
                .flat_map(|&g| procstat::group_members(g).unwrap_or_default())
                .collect();
            self.members_at = Some(Instant::now());
        }
        let (mut pss_kib, mut shared_kib) = (0u64, 0u64);
        for &pid in &self.members {
            // A member that exits meanwhile simply stops counting.
            if let Ok(r) = procstat::memory_rollup(pid) {
                pss_kib += r.pss_kib;
                shared_kib += r.anonymous_kib.saturating_sub(r.pss_anon_kib);
            }
        }
        let base = *self.base_shared_kib.get_or_insert(shared_kib as f64);
        let saved_pss = (shared_kib as f64 - base) / 1024.0;
        let ksmd_s = self.ksmd_cpu_ns()? as f64 / 1e9;
        let daemon_s = match self.daemon {
            // Keep the last reading once it has exited (its CPU is spent).
            Some(pid) => procstat::cpu_ns(pid)
                .map(|ns| ns.saturating_sub(self.base_daemon_ns) as f64 / 1e9)
                .unwrap_or(self.last_daemon_s),
            None => 0.0,
        };
        self.last_daemon_s = daemon_s;
        let tuned_s = ksmtuned_cpu_s.unwrap_or(0.0);
        let cow = KsmVmstat::read()?
            .cow_ksm
            .unwrap_or(0)
            .saturating_sub(self.base_cow) as f64;
        let values = [
            saved,
            saved_pss,
            pss_kib as f64 / 1024.0,
            ksmd_s + daemon_s + tuned_s,
            ksmd_s,
            daemon_s,
            tuned_s,
            cow,
            pages_to_scan,
        ];
        for (s, v) in self.series.iter_mut().zip(values) {
            s.push(t, v);
        }
        Ok(())
    }

    /// The last value of a metric.
    pub fn last(&self, metric: &str) -> Option<f64> {
        self.series.iter().find(|s| s.metric == metric)?.last()
    }

    /// The series, the system's CPU % over the last second added.
    pub fn finish(self) -> Vec<Series> {
        let mut v: Vec<Series> = self.series.into();
        let cpu = v.iter().find(|s| s.metric == metric::CPU).cloned();
        if let Some(cpu) = cpu {
            v.push(crate::measure::rate(
                &cpu,
                1.0,
                100.0,
                metric::CPU_PERCENT,
                "% of a core",
            ));
        }
        v
    }
}
