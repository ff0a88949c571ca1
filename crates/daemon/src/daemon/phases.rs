//! Where the main thread's CPU goes: its CPU time per phase of
//! [`Daemon::wake`], which `status`, the metrics and the watchdog report.
//!
//! A [`Lap`] reads the thread's CPU clock at each phase boundary and adds
//! the time since the previous boundary to that phase's total. Invariant:
//! the phases of [`PHASES`] run in that order in every wake-up, so the
//! watchdog's phase index and the totals name the same phase.

use super::*;

/// The main thread's CPU time per phase of [`Daemon::wake`], ns since
/// start: what `status` and the metrics break the daemon's CPU down by.
/// The wake-up's phases in the order [`Daemon::wake`] runs them (the
/// names of [`PhaseCpu`]'s fields), as the watchdog reports them.
pub const PHASES: [&str; 10] = [
    "refresh", "hints", "distil", "sweep", "account", "numa", "watch", "actuate", "pace", "scrub",
];

#[derive(Clone, Copy, Debug, Default)]
pub(super) struct PhaseCpu {
    pub(super) refresh: u64,
    pub(super) hints: u64,
    pub(super) distil: u64,
    pub(super) sweep: u64,
    pub(super) account: u64,
    pub(super) numa: u64,
    pub(super) watch: u64,
    pub(super) actuate: u64,
    pub(super) pace: u64,
    pub(super) scrub: u64,
}

impl PhaseCpu {
    pub(super) fn seconds(&self) -> BTreeMap<String, f64> {
        [
            ("refresh", self.refresh),
            ("hints", self.hints),
            ("distil", self.distil),
            ("sweep", self.sweep),
            ("account", self.account),
            ("numa", self.numa),
            ("watch", self.watch),
            ("actuate", self.actuate),
            ("pace", self.pace),
            ("scrub", self.scrub),
        ]
        .into_iter()
        .map(|(name, ns)| (name.to_string(), ns as f64 / 1e9))
        .collect()
    }
}

/// A stopwatch over the thread's CPU clock: each [`Lap::to`] adds the CPU
/// time since the previous lap to a phase's total, and tells the watch
/// that the next phase of [`PHASES`] runs.
pub(super) struct Lap {
    pub(super) cpu: u64,
    pub(super) next: usize,
    pub(super) watch: WakeWatch,
}

impl Lap {
    pub(super) fn start(cpu: u64, watch: WakeWatch) -> Lap {
        watch.begin();
        Lap {
            cpu,
            next: 1,
            watch,
        }
    }

    pub(super) fn to(&mut self, total: &mut u64) {
        let t = host::thread_cpu_ns();
        *total += t.saturating_sub(self.cpu);
        self.cpu = t;
        self.watch.enter(self.next);
        self.next += 1;
    }
}
