//! KSM's writable knobs and the typed values of two of them.
//!
//! [`Knob::ALL`] lists the knobs in the order a restore writes them (see
//! the parent module: free knobs first, then those that need nothing
//! merged, the advisor's own knobs, `advisor_mode`, `pages_to_scan`, and
//! `run` last). Knobs a kernel lacks are simply absent from its sysfs;
//! writable files this code does not know are handled by name elsewhere,
//! so a newer kernel's knobs are still saved and restored.
//!
//! Values are kept as the text sysfs shows, normalised to what writing it
//! back needs ([`normalise`]): `advisor_mode` reads `[none] scan-time` but
//! accepts only the selected word.

use std::fmt;

/// A writable KSM knob (a file of `/sys/kernel/mm/ksm`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Knob {
    /// `run`: 0 stop, 1 run, 2 stop and unmerge everything.
    Run,
    /// `pages_to_scan`: pages per batch.
    PagesToScan,
    /// `sleep_millisecs`: sleep between batches.
    SleepMillisecs,
    /// `merge_across_nodes` (NUMA kernels; only while nothing is merged).
    MergeAcrossNodes,
    /// `use_zero_pages`: merge zero-filled pages with the zero page.
    UseZeroPages,
    /// `max_page_sharing` (only while nothing is merged).
    MaxPageSharing,
    /// `stable_node_chains_prune_millisecs`.
    StableNodeChainsPruneMillisecs,
    /// `smart_scan` (6.7).
    SmartScan,
    /// `advisor_mode`: `none` or `scan-time` (6.8).
    AdvisorMode,
    /// `advisor_max_cpu` (%, 6.8).
    AdvisorMaxCpu,
    /// `advisor_min_pages_to_scan` (6.8).
    AdvisorMinPagesToScan,
    /// `advisor_max_pages_to_scan` (6.8).
    AdvisorMaxPagesToScan,
    /// `advisor_target_scan_time` (s, 6.8).
    AdvisorTargetScanTime,
}

impl Knob {
    /// Every knob, in the order a restore writes them (see the module
    /// header): free knobs, the ones that need nothing merged, the
    /// advisor's, its mode, `pages_to_scan`, and `run` last.
    pub const ALL: [Knob; 13] = [
        Knob::SleepMillisecs,
        Knob::UseZeroPages,
        Knob::StableNodeChainsPruneMillisecs,
        Knob::SmartScan,
        Knob::MaxPageSharing,
        Knob::MergeAcrossNodes,
        Knob::AdvisorMaxCpu,
        Knob::AdvisorMinPagesToScan,
        Knob::AdvisorMaxPagesToScan,
        Knob::AdvisorTargetScanTime,
        Knob::AdvisorMode,
        Knob::PagesToScan,
        Knob::Run,
    ];

    /// The file name under `/sys/kernel/mm/ksm`.
    pub fn file_name(self) -> &'static str {
        match self {
            Knob::Run => "run",
            Knob::PagesToScan => "pages_to_scan",
            Knob::SleepMillisecs => "sleep_millisecs",
            Knob::MergeAcrossNodes => "merge_across_nodes",
            Knob::UseZeroPages => "use_zero_pages",
            Knob::MaxPageSharing => "max_page_sharing",
            Knob::StableNodeChainsPruneMillisecs => "stable_node_chains_prune_millisecs",
            Knob::SmartScan => "smart_scan",
            Knob::AdvisorMode => "advisor_mode",
            Knob::AdvisorMaxCpu => "advisor_max_cpu",
            Knob::AdvisorMinPagesToScan => "advisor_min_pages_to_scan",
            Knob::AdvisorMaxPagesToScan => "advisor_max_pages_to_scan",
            Knob::AdvisorTargetScanTime => "advisor_target_scan_time",
        }
    }

    /// The knob of a file name, if this code knows it.
    pub fn from_file_name(name: &str) -> Option<Knob> {
        Knob::ALL.into_iter().find(|k| k.file_name() == name)
    }

    /// Whether the kernel refuses to change it while pages are merged
    /// (EBUSY unless `pages_shared == 0`).
    pub fn needs_nothing_merged(self) -> bool {
        matches!(self, Knob::MaxPageSharing | Knob::MergeAcrossNodes)
    }
}

impl fmt::Display for Knob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.file_name())
    }
}

/// The value of `run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Run {
    /// 0: ksmd stopped, merged pages stay merged.
    Stop,
    /// 1: ksmd running.
    Run,
    /// 2: ksmd stopped and every merged page unmerged (the writer becomes
    /// the preferred OOM victim while that runs: `set_current_oom_origin`
    /// in `mm/ksm.c`).
    Unmerge,
}

impl Run {
    /// The number written to sysfs.
    pub fn as_u8(self) -> u8 {
        match self {
            Run::Stop => 0,
            Run::Run => 1,
            Run::Unmerge => 2,
        }
    }

    pub(super) fn parse(s: &str) -> Option<Run> {
        match s {
            "0" => Some(Run::Stop),
            "1" => Some(Run::Run),
            "2" => Some(Run::Unmerge),
            _ => None,
        }
    }
}

/// The value of `advisor_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AdvisorMode {
    /// No advisor: `pages_to_scan` is the operator's (pagesift's).
    None,
    /// The scan-time advisor rewrites `pages_to_scan` after each full scan.
    ScanTime,
}

impl AdvisorMode {
    /// The word sysfs uses.
    pub fn as_str(self) -> &'static str {
        match self {
            AdvisorMode::None => "none",
            AdvisorMode::ScanTime => "scan-time",
        }
    }

    pub(super) fn parse(s: &str) -> Option<AdvisorMode> {
        match s {
            "none" => Some(AdvisorMode::None),
            "scan-time" => Some(AdvisorMode::ScanTime),
            _ => None,
        }
    }
}

/// A knob's text as read, normalised to what writing it back needs: trimmed,
/// and for `advisor_mode` the selected word (`[none] scan-time` → `none`).
pub(super) fn normalise(name: &str, raw: &str) -> String {
    let t = raw.trim();
    if name == Knob::AdvisorMode.file_name()
        && let (Some(a), Some(b)) = (t.find('['), t.find(']'))
        && a < b
    {
        return t[a + 1..b].to_string();
    }
    t.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advisor_mode_is_normalised_to_the_selected_word() {
        assert_eq!(normalise("advisor_mode", "[none] scan-time\n"), "none");
        assert_eq!(normalise("advisor_mode", "none [scan-time]\n"), "scan-time");
        assert_eq!(normalise("pages_to_scan", " 100\n"), "100");
    }

    #[test]
    fn knob_names_round_trip_and_order_puts_run_last() {
        for k in Knob::ALL {
            assert_eq!(Knob::from_file_name(k.file_name()), Some(k));
        }
        assert_eq!(Knob::ALL.last(), Some(&Knob::Run));
        let pos = |k| Knob::ALL.iter().position(|x| *x == k).unwrap();
        assert!(pos(Knob::AdvisorMinPagesToScan) < pos(Knob::AdvisorMode));
        assert!(pos(Knob::AdvisorMode) < pos(Knob::PagesToScan));
        assert_eq!(Knob::from_file_name("pages_shared"), None);
    }
}
