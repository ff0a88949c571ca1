//! The daemon's configuration: one TOML file, every key optional.
//!
//! ## How a file becomes a [`Config`]
//! 1. The text is parsed by `toml` and deserialized with serde; every table
//!    denies unknown keys, so a typo is an error rather than a silently
//!    ignored setting. `serde_path_to_error` keeps the path of the key that
//!    failed, so the error says `ladder.v_dup: invalid type: string "x",
//!    expected f64`, not only a line number.
//! 2. Missing keys take the defaults below, which come from the UKSM paper
//!    (FAST '18) and UKSM's released kernel patch; each cites where.
//! 3. [`Config::validate`] checks ranges and names the key and the reason.
//!
//! Where the file comes from: `--config PATH` must exist; without it the
//! default path [`DEFAULT_CONFIG_PATH`] is read if it exists, and a missing
//! default file means "all defaults".
//!
//! ## Which processes are merged
//! Nothing, unless the operator says so. Merging pages across processes is
//! a known side channel (a write to a merged page is slower, which tells an
//! attacker that another process holds the same content), so the eligible
//! set is the operator's choice: `[eligible]` lists
//! what may be merged (`all = true` for every process), `[ineligible]`
//! lists what never is, and pagesift never merges itself.

use pagesift_core::Nanos;
use pagesift_core::pipeline::governor::{Governor, GovernorParams, MAX_SLEEP};
use pagesift_core::pipeline::ladder::LadderConfig;
use pagesift_core::pipeline::pacing::PacingConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Where `pagesift run` looks for its configuration by default.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/pagesift/pagesift.toml";
/// Where the status socket lives by default.
pub const DEFAULT_SOCKET_PATH: &str = "/run/pagesift.sock";

const MS: Nanos = 1_000_000;

/// A configuration that could not be used. The message names the key (as
/// a dotted path, e.g. `ladder.v_dup`) and the reason.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file named with `--config` does not exist or cannot be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Run as root, the file is one another user could change (not owned
    /// by root, writable by group or others, not a regular file).
    #[error("{path}: not trusted as root's configuration: {reason}")]
    Untrusted {
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// The text is not valid TOML.
    #[error("{path}: not valid TOML: {reason}")]
    Syntax {
        /// The file.
        path: String,
        /// What is wrong, and where.
        reason: String,
    },
    /// A key is unknown or its value has the wrong type.
    #[error("{path}: {key}: {reason}")]
    Parse {
        /// The file.
        path: String,
        /// Dotted path of the offending key.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// A value is out of range.
    #[error("{path}: {key}: {reason}")]
    Invalid {
        /// The file (or `<text>`).
        path: String,
        /// Dotted path of the key.
        key: String,
        /// What is wrong and what is accepted.
        reason: String,
    },
}

impl ConfigError {
    /// The dotted key the error is about.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. }
            | ConfigError::Syntax { .. }
            | ConfigError::Untrusted { .. } => None,
            ConfigError::Parse { key, .. } | ConfigError::Invalid { key, .. } => Some(key),
        }
    }
}

/// Everything `pagesift run` can be told. See `dist/pagesift.toml` for a
/// commented example with every key.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// CPU governor (UKSM §7): full, medium, low or quiet. Sets each
    /// level's CPU share and round time. Default full (UKSM's default
    /// `cpu_governor`).
    pub governor: Governor,
    /// The ladder's thresholds.
    pub ladder: LadderSection,
    /// Sampling cadence and limits.
    pub scan: ScanSection,
    /// Promotion, demotion and accounting.
    pub actuate: ActuateSection,
    /// ksmd pacing.
    pub ksm: KsmSection,
    /// Which processes may be merged.
    pub eligible: EligibleSection,
    /// Which processes are never merged (wins over `eligible`).
    pub ineligible: Selector,
    /// The status socket.
    pub status: StatusSection,
    /// Prometheus metrics.
    pub metrics: MetricsSection,
    /// I/O hints (XLH).
    pub hints: HintsSection,
    /// Host page-cache scrubbing (Singleton).
    pub scrub: ScrubSection,
    /// Where merged pages live on a NUMA host.
    pub numa: crate::numa::NumaSection,
    /// What status and metrics show per cgroup and per process.
    pub savings: SavingsSection,
}

/// `[ladder]`: UKSM Table 1 and §5.2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LadderSection {
    /// Number of levels (§7: 4).
    pub levels: usize,
    /// V_dup: duplication ratio (fraction) a region needs to climb (§5.2:
    /// 10 %).
    pub v_dup: f64,
    /// V_cow: COW-broken ratio (fraction of duplicates) above which a region
    /// is thrashing: it does not climb, and a promoted region is unmarked
    /// (§5.2: 50 %).
    pub v_cow: f64,
    /// V_life in ms: regions younger than this never climb (§5.2: 100 ms).
    pub v_life_ms: u64,
    /// Skip the rest of a region's round once its verdict is certain; the
    /// round still lasts its round time, so only samples are saved
    /// (`core::pipeline::ladder`, "Early decisions"). Off: UKSM's fixed
    /// sampling density.
    pub early_decision: bool,
    /// A region mapped again where its process's last region of that size
    /// was marked goes to the top level at once, on its predecessors'
    /// evidence, past V_life and the climb (`core::pipeline::recurrence`).
    /// Off: every region climbs on its own samples.
    pub raise_recurring: bool,
}

impl Default for LadderSection {
    fn default() -> Self {
        let d = LadderConfig::default();
        LadderSection {
            levels: d.levels,
            v_dup: d.v_dup,
            v_cow: d.v_cow,
            v_life_ms: d.v_life / MS,
            early_decision: d.early_decision,
            raise_recurring: true,
        }
    }
}

/// `[scan]`: how often and how much pagesift samples.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScanSection {
    /// T_s, the sleep between wake-ups in ms (UKSM `sleep_millisecs = 100`;
    /// at most 1000, the code's cap).
    pub sleep_ms: u64,
    /// Global sampling round time in ms: the levels' round times are scaled
    /// so that they sum to it. Unset: the governor's (§7: 2, 4, 8, 20 s;
    /// the paper says it "can be configured in the range of 2 - 20s").
    pub round_time_ms: Option<u64>,
    /// Most CPU the daemon's sampling may use, as a fraction of one core.
    /// Unset: the governor's cap (95, 50, 20, 1 %; `core::pipeline::governor`).
    /// Kept by sleeping longer after a wake-up, at most 1 s: a cap below
    /// what one wake-up a second costs is out of reach (status:
    /// `daemon.cap_unmet`).
    pub cpu_cap: Option<f64>,
    /// VMAs larger than this (MiB) are tracked as sub-regions of this size,
    /// aligned to multiples of it, so that a VM's guest RAM or a big heap is
    /// distilled, promoted and demoted piecewise. pagesift's choice (UKSM
    /// tracks whole VMAs): 64 MiB keeps a 4 GiB guest to 64 regions and
    /// the VMA splits of promoting parts of it far below vm.max_map_count.
    pub subregion_mib: u64,
    /// Most regions (VMAs and sub-regions) tracked at once; when eligible
    /// processes map more, the smallest are left out (status:
    /// `totals.regions_left_out`). Everything the daemon keeps grows with
    /// the regions it tracks, about 2.9 KiB of resident memory each
    /// (docs/reliability.md), so this bounds its memory.
    pub max_regions: usize,
    /// Shortest interval in ms between two checks of /proc for new
    /// processes and changed mappings.
    pub refresh_ms: u64,
    /// Most CPU re-reading process maps may use (fraction of one core): a
    /// host whose maps change constantly is re-read less often, never more
    /// than this share. A one-off costly read (the smaps read once a
    /// minute) counts as at most twice the usual one
    /// (`core::pipeline::spacing`). pagesift's choice, a quarter of the
    /// bottom level's 0.2 % (§7).
    pub refresh_cpu: f64,
    /// CPU share (fraction of one core) of the exact sweep, which hashes
    /// every present page of the sampling regions, a slice per wake-up, so
    /// that duplicates are found wherever their twins live (0: off); at
    /// most `cpu_cap` (or the governor's cap).
    pub sweep_share: f64,
    /// Shortest time between the starts of two sweeps, in seconds.
    pub sweep_every_s: u64,
    /// Seconds a region must have been known before the sweep hashes it
    /// (0: at once). Hashing every page is worth it for memory that stays;
    /// memory younger than this is left to the ladder, whose V_life skips
    /// what does not last. pagesift's choice: one default sweep spacing,
    /// so that memory mapped and unmapped within seconds (UKSM §8.1.3's
    /// short-lived regions) costs no sweep under the defaults.
    pub sweep_min_age_s: f64,
    /// Pages per sample point of the ladder's walk: a point samples this
    /// many consecutive pages (1: page by page, as UKSM). Scattered pages
    /// cost the most per page to look at from user space (a page-table
    /// walk and a pinned read each); four neighbours cost about half as
    /// much per page (docs/sampling-cost.md). At most 16.
    pub cluster_pages: u32,
    /// Seed of the sampling permutations and the hash (fixed so that runs
    /// can be compared).
    pub seed: u64,
}

impl Default for ScanSection {
    fn default() -> Self {
        ScanSection {
            sleep_ms: 100,
            round_time_ms: None,
            cpu_cap: None,
            subregion_mib: 64,
            max_regions: 131_072,
            refresh_ms: 1000,
            refresh_cpu: 0.0005,
            sweep_share: 0.03,
            sweep_every_s: 5,
            sweep_min_age_s: 5.0,
            cluster_pages: 4,
            seed: 0x7061_6765_7369_6674,
        }
    }
}

/// `[actuate]`: promotion, demotion and per-region accounting.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActuateSection {
    /// Stop marking ranges in a process once its VMA count would pass this
    /// fraction of vm.max_map_count (marking part of a VMA splits it).
    pub max_map_count_fraction: f64,
    /// Seconds a region that was unmarked for thrashing is held at the
    /// bottom before it may be promoted again; doubles on every repeat (up
    /// to an hour). pagesift's choice.
    pub demote_hold_s: u64,
    /// Seconds a region whose watched writes would break its merged pages
    /// (write tracking, before marking) is held out of the ladder before
    /// it may climb again; doubles on every repeat (up to an hour). Shorter
    /// than `demote_hold_s`: nothing was merged, so nothing was broken, and
    /// memory that was written while it was being filled (a booting guest)
    /// is often quiet a few seconds later. pagesift's choice: about the
    /// time a region takes to climb back under the full governor.
    pub write_hold_s: u64,
    /// Pages of promoted regions inspected per second to count merged pages
    /// and COW breaks (pagemap + kpageflags, ≈155 ns a page measured:
    /// 131072 pages/s ≈ 2 % of a core).
    pub account_pages_per_s: u64,
    /// Fewest merged pages a region must have shown before its COW-broken
    /// ratio is trusted to unmark it.
    pub min_merged_for_demotion: u64,
    /// Seconds between two accounting passes over a promoted region whose
    /// merging has settled: COW breaks are noticed this late at worst.
    /// (Regions ksmd is still merging are passed over every second.)
    pub recheck_s: u64,
    /// Unmark (MADV_UNMERGEABLE) every range pagesift marked when it exits,
    /// which unmerges their pages. Off: merged pages stay merged.
    pub unmerge_on_exit: bool,
    /// A run of at least this many verified duplicate pages inside a
    /// region that does not climb is made mergeable on its own, with its
    /// twin run. 0 turns run promotion off.
    /// pagesift's choice: 16 pages (64 KiB) save more than the two VMA
    /// splits a side cost (about 200 bytes each).
    pub run_min_pages: u32,
    /// Pages added on each side of a sampled run when it is marked: the
    /// run was followed at most 64 pages each way from a sample, so it may
    /// go on; ksmd merges what does and skips the rest. Runs found from
    /// I/O hints are not padded: they were followed to their end.
    pub run_pad_pages: u32,
    /// Once a promoted region has settled, each stretch of at least this
    /// many pages that ksmd left present and unmerged (unique or volatile
    /// content) is unmarked, so that ksmd's later full scans skip it; the
    /// stretch is sampled again like any unmarked memory. 0 turns
    /// trimming off, the default: on three booting guests it cut ksmd's
    /// CPU by nothing measurable and added about 0.4 CPU-s of the daemon's
    /// over a minute, since the sweep hashes the trimmed stretches again
    /// (docs/trimming.md). 256 pages (1 MiB) is a sensible value to try:
    /// at most two VMA splits for pages that cost ksmd a checksum and two
    /// tree searches at every full scan.
    pub trim_min_pages: u32,
    /// Watch writes to candidate regions (level ≥ 1, not marked) with
    /// userfaultfd write-protection (injected into the owner, async: the
    /// owner never blocks) and never mark a region whose writes would
    /// break its merged pages faster than V_cow allows. Off: COW breaks
    /// are learnt only after merging, by accounting.
    pub write_tracking: bool,
    /// Leave unmarked the regions of a process whose recent large regions
    /// were unmapped young, until they outlive those (`core::pipeline::lifespan`):
    /// ksmd's two visits would come too late. Off (the short-lived profile):
    /// every region is marked as soon as the ladder says so.
    pub skip_short_lived: bool,
}

impl Default for ActuateSection {
    fn default() -> Self {
        ActuateSection {
            max_map_count_fraction: 0.5,
            demote_hold_s: 60,
            write_hold_s: 4,
            account_pages_per_s: 131_072,
            min_merged_for_demotion: 16,
            recheck_s: 30,
            unmerge_on_exit: false,
            run_min_pages: 16,
            run_pad_pages: 64,
            trim_min_pages: 0,
            write_tracking: true,
            skip_short_lived: true,
        }
    }
}

/// `[ksm]`: how ksmd is paced.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KsmSection {
    /// ksmd's CPU share while promoted memory is unmerged. Unset: the
    /// governor's top-level share (95, 50, 20, 0.75 %; `core::pipeline::governor`).
    pub merge_share: Option<f64>,
    /// ksmd's CPU share when nothing promoted is unmerged (it still
    /// revisits merged pages). Unset: 0.1 %, half of the bottom level's
    /// 0.2 % (§7); the daemon's own bottom-level sampling has the other
    /// half.
    pub trickle_share: Option<f64>,
    /// Full scans a second of the promoted (marked) memory that ksmd's
    /// merging share is capped at: a page merges on ksmd's second visit,
    /// so memory that lives `T` seconds needs more than `2/T` of them.
    /// Unset: two (`core::pipeline::pacing`), which settles a long-lived
    /// region in 1.5 s without spinning ksmd over it; the short-lived
    /// profile (`dist/profiles/short-lived.toml`) asks for 20.
    pub scans_per_s: Option<f64>,
}

/// Matches processes. Within one kind any entry matches (OR).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Selector {
    /// cgroup paths (`/system.slice/foo.service`, with or without the
    /// `/sys/fs/cgroup` prefix); a process in the cgroup or below it
    /// matches.
    pub cgroups: Vec<String>,
    /// Effective uids.
    pub uids: Vec<u32>,
    /// Executable paths (`/proc/PID/exe`); an entry ending in `/` matches
    /// every executable below that directory.
    pub exes: Vec<PathBuf>,
    /// Command names (`/proc/PID/comm`, at most 15 bytes).
    pub comms: Vec<String>,
}

impl Selector {
    /// No entry of any kind.
    pub fn is_empty(&self) -> bool {
        self.cgroups.is_empty()
            && self.uids.is_empty()
            && self.exes.is_empty()
            && self.comms.is_empty()
    }
}

/// `[eligible]`: which processes may be merged. Kinds combine with AND
/// (a process must match every kind that has entries), entries of one kind
/// with OR. With no entry and `all = false`, no process is eligible.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EligibleSection {
    /// Every process (except pagesift and `[ineligible]`), regardless of the
    /// lists below.
    pub all: bool,
    /// cgroups (see [`Selector::cgroups`]).
    pub cgroups: Vec<String>,
    /// Effective uids.
    pub uids: Vec<u32>,
    /// Executables (see [`Selector::exes`]).
    pub exes: Vec<PathBuf>,
    /// Command names.
    pub comms: Vec<String>,
}

impl EligibleSection {
    /// The allow lists as a [`Selector`].
    pub fn selector(&self) -> Selector {
        Selector {
            cgroups: self.cgroups.clone(),
            uids: self.uids.clone(),
            exes: self.exes.clone(),
            comms: self.comms.clone(),
        }
    }
}

/// `[status]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StatusSection {
    /// Unix socket `pagesift status` talks to.
    pub socket: PathBuf,
}

impl Default for StatusSection {
    fn default() -> Self {
        StatusSection {
            socket: DEFAULT_SOCKET_PATH.into(),
        }
    }
}

/// `[metrics]`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// `HOST:PORT` (or `PORT`, meaning 127.0.0.1) to serve Prometheus
    /// metrics on; unset: off.
    pub address: Option<String>,
}

/// Most lines `[savings] top_cgroups` and `top_processes` may ask for:
/// each is a set of Prometheus labels, and a scrape of thousands of them
/// is what the bound is there to prevent.
pub const MAX_SAVINGS_LINES: usize = 1000;
/// Deepest `[savings] cgroup_depth`.
pub const MAX_CGROUP_DEPTH: usize = 32;

/// `[savings]`: the savings per cgroup and per process that `pagesift
/// status` and the metrics show, and how many lines they may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SavingsSection {
    /// Components of a cgroup path kept: processes in cgroups below are
    /// summed into their ancestor at this depth. 2 puts a libvirt guest
    /// (`/machine.slice/machine-qemu-1-vm.scope`) or a Docker container
    /// (`/system.slice/docker-ID.scope`) on one line; 0 sums everything
    /// into `/`.
    pub cgroup_depth: usize,
    /// cgroups listed, most bytes saved first; the others are summed into
    /// one `other` line.
    pub top_cgroups: usize,
    /// Processes listed, most bytes saved first; the others are summed
    /// into one `other` line (0: no per-process lines).
    pub top_processes: usize,
}

impl Default for SavingsSection {
    fn default() -> Self {
        SavingsSection {
            cgroup_depth: 2,
            top_cgroups: 20,
            top_processes: 10,
        }
    }
}

impl SavingsSection {
    /// The limits of the breakdown (`core::pipeline::savings`).
    pub fn limits(&self) -> pagesift_core::pipeline::savings::Limits {
        pagesift_core::pipeline::savings::Limits {
            cgroup_depth: self.cgroup_depth,
            top_cgroups: self.top_cgroups,
            top_processes: self.top_processes,
        }
    }

    fn validate(&self) -> Result<(), (String, String)> {
        if self.cgroup_depth > MAX_CGROUP_DEPTH {
            return Err((
                "savings.cgroup_depth".into(),
                format!(
                    "must be 0 to {MAX_CGROUP_DEPTH} path components, got {}",
                    self.cgroup_depth
                ),
            ));
        }
        // At least one cgroup line: `cgroup_depth = 0` is how to ask for
        // a single one.
        for (key, n, least) in [
            ("top_cgroups", self.top_cgroups, 1),
            ("top_processes", self.top_processes, 0),
        ] {
            if !(least..=MAX_SAVINGS_LINES).contains(&n) {
                return Err((
                    format!("savings.{key}"),
                    format!(
                        "must be {least} to {MAX_SAVINGS_LINES} lines (each is a set of metric labels; the rest is summed into `other`), got {n}"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// The syscalls `[hints] syscalls` may name (the kernel's names).
pub const HINT_SYSCALLS: [&str; 10] = [
    "read", "pread64", "readv", "preadv", "preadv2", "write", "pwrite64", "writev", "pwritev",
    "pwritev2",
];

/// `[hints]`: I/O hints from eBPF (the XLH dissertation, §4.3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HintsSection {
    /// Take hints from the syscalls below (needs CAP_BPF, CAP_PERFMON and
    /// kernel BTF; without them the daemon says what is missing and runs
    /// without hints). Default on.
    pub enabled: bool,
    /// Syscalls whose buffers are hinted. Default: the read family and the
    /// write family (XLH hints writes too, §5.4.3).
    pub syscalls: Vec<String>,
    /// Hints the bounded stack holds; default: what drains in 15 s at the
    /// scan rate the governor gives and the interleave's hint share
    /// (§5.4.1).
    pub capacity: Option<usize>,
    /// Oldest hint still used, in ms (default 15 000, §4.3.3). A hint
    /// older than the ladder's pass over the bottom level (the time its
    /// walk takes to visit every page once) is dropped too.
    pub max_age_ms: u64,
    /// Hint slots to linear slots, `"H:L"` (default `"1:1"`).
    pub interleave: String,
    /// The kernel's BTF.
    pub btf: PathBuf,
    /// Where the BPF program attaches: `auto` (fexit on each enabled
    /// syscall where the kernel allows tracing trampolines, else the raw
    /// tracepoint `sys_exit`), `fexit`, or `sys-exit`. With `sys-exit`
    /// every syscall of every process pays for the program.
    pub hook: HintHook,
}

/// `[hints] hook`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HintHook {
    /// fexit if the kernel allows it, else sys-exit.
    Auto,
    /// fexit on the syscall functions only.
    Fexit,
    /// The raw tracepoint `sys_exit` only.
    SysExit,
}

impl Default for HintsSection {
    fn default() -> Self {
        HintsSection {
            enabled: true,
            syscalls: HINT_SYSCALLS.iter().map(|s| s.to_string()).collect(),
            capacity: None,
            max_age_ms: 15_000,
            interleave: "1:1".into(),
            btf: PathBuf::from("/sys/kernel/btf/vmlinux"),
            hook: HintHook::Auto,
        }
    }
}

impl HintsSection {
    /// The interleave ratio `(hints, linear)`, or why it is not one.
    pub fn ratio(&self) -> Result<(u32, u32), String> {
        let bad = || {
            format!(
                "must be \"H:L\", hint slots to linear slots, each 0 to 1000 and not both 0 (\"1:1\", \"1:3\"), got {:?}",
                self.interleave
            )
        };
        let (h, l) = self.interleave.split_once(':').ok_or_else(bad)?;
        let (h, l) = (
            h.trim().parse::<u32>().map_err(|_| bad())?,
            l.trim().parse::<u32>().map_err(|_| bad())?,
        );
        if h > 1000 || l > 1000 || h + l == 0 {
            return Err(bad());
        }
        Ok((h, l))
    }
}

/// `[scrub]`: drop the host page-cache copies of disk blocks that an
/// eligible guest holds (Singleton; see `crate::scrub`). Off by default.
/// The frequency keys are Algorithm 2's thresholds (Singleton §3.4, §4.1).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScrubSection {
    /// Scrub at all.
    pub enabled: bool,
    /// Take the regular files an eligible guest process has open
    /// read-write as its disk images.
    pub discover_images: bool,
    /// Image files to scrub too, when an eligible guest process has them
    /// open in any mode (absolute paths).
    pub images: Vec<PathBuf>,
    /// Only eligible processes whose command name starts with one of these
    /// are guests.
    pub comm_prefixes: Vec<String>,
    /// Anonymous mappings of at least this many MiB are guest RAM.
    pub guest_ram_min_mib: u64,
    /// Leave the host's read-ahead on the guests' image descriptors as it
    /// is (true), or turn it off (`POSIX_FADV_RANDOM` on QEMU's open file,
    /// restored when pagesift stops; it outlives a SIGKILLed pagesift).
    pub host_readahead: bool,
    /// Shortest scrub period, and least time between two scrubs, seconds.
    pub period_min_s: f64,
    /// Longest scrub period, seconds.
    pub period_max_s: f64,
    /// The period before the first scrub, seconds.
    pub period_initial_s: f64,
    /// Scrub early when the page cache exceeds this fraction of memory (of
    /// the host, or of a memory cgroup limit a guest lives under).
    pub cached_frac: f64,
    /// Scrub early when free memory is below this fraction of memory (as
    /// for `cached_frac`).
    pub free_frac: f64,
}

impl Default for ScrubSection {
    fn default() -> Self {
        let f = pagesift_core::pipeline::scrub::FrequencyParams::default();
        ScrubSection {
            enabled: false,
            discover_images: true,
            images: Vec::new(),
            comm_prefixes: vec!["qemu".into()],
            guest_ram_min_mib: 64,
            host_readahead: true,
            period_min_s: f.period_min as f64 / 1e9,
            period_max_s: f.period_max as f64 / 1e9,
            period_initial_s: f.period_initial as f64 / 1e9,
            cached_frac: f.cached_frac,
            free_frac: f.free_frac,
        }
    }
}

impl ScrubSection {
    /// Algorithm 2's parameters.
    pub fn frequency(&self) -> pagesift_core::pipeline::scrub::FrequencyParams {
        let ns = |s: f64| (s * 1e9) as u64;
        pagesift_core::pipeline::scrub::FrequencyParams {
            period_min: ns(self.period_min_s),
            period_max: ns(self.period_max_s),
            period_initial: ns(self.period_initial_s),
            cached_frac: self.cached_frac,
            free_frac: self.free_frac,
        }
    }

    fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, r: String| Err((format!("scrub.{k}"), r));
        for (k, v) in [
            ("period_min_s", self.period_min_s),
            ("period_max_s", self.period_max_s),
            ("period_initial_s", self.period_initial_s),
        ] {
            if !(0.001..=86_400.0).contains(&v) {
                return bad(k, format!("must be between 0.001 and 86400 s, got {v}"));
            }
        }
        if self.period_min_s > self.period_max_s {
            return bad("period_min_s", "must not exceed period_max_s".into());
        }
        if !(self.period_min_s..=self.period_max_s).contains(&self.period_initial_s) {
            return bad(
                "period_initial_s",
                "must lie between period_min_s and period_max_s".into(),
            );
        }
        for (k, v) in [
            ("cached_frac", self.cached_frac),
            ("free_frac", self.free_frac),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return bad(k, format!("must be a fraction in 0..=1, got {v}"));
            }
        }
        if self.guest_ram_min_mib == 0 || self.guest_ram_min_mib > 1 << 30 {
            return bad(
                "guest_ram_min_mib",
                format!("must be 1..=2^30, got {}", self.guest_ram_min_mib),
            );
        }
        if let Some(p) = self.images.iter().find(|p| !p.is_absolute()) {
            return bad(
                "images",
                format!("must be absolute paths, got {}", p.display()),
            );
        }
        if self.comm_prefixes.iter().any(|p| p.is_empty()) {
            return bad(
                "comm_prefixes",
                "an empty prefix would match every process".into(),
            );
        }
        Ok(())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            governor: Governor::Full,
            ladder: LadderSection::default(),
            scan: ScanSection::default(),
            actuate: ActuateSection::default(),
            ksm: KsmSection::default(),
            eligible: EligibleSection::default(),
            ineligible: Selector::default(),
            status: StatusSection::default(),
            metrics: MetricsSection::default(),
            scrub: ScrubSection::default(),
            hints: HintsSection::default(),
            numa: crate::numa::NumaSection::default(),
            savings: SavingsSection::default(),
        }
    }
}

impl Config {
    /// Parses and validates TOML text; `origin` names it in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Syntax {
            path: origin.to_string(),
            reason: one_line(&e.to_string()),
        })?;
        let config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            ConfigError::Parse {
                path: origin.to_string(),
                key,
                reason: one_line(&e.into_inner().to_string()),
            }
        })?;
        config
            .validate()
            .map_err(|(key, reason)| ConfigError::Invalid {
                path: origin.to_string(),
                key,
                reason,
            })?;
        Ok(config)
    }

    /// Loads the configuration: `explicit` must exist; without it the
    /// default path is read if present, else the defaults are used.
    pub fn load(explicit: Option<&Path>) -> Result<(Config, Option<PathBuf>), ConfigError> {
        let (path, must_exist) = match explicit {
            Some(p) => (p.to_path_buf(), true),
            None => (PathBuf::from(DEFAULT_CONFIG_PATH), false),
        };
        match read_trusted(&path) {
            Ok(Err(reason)) => Err(ConfigError::Untrusted { path, reason }),
            Ok(Ok(text)) => Ok((
                Config::from_toml(&text, &path.display().to_string())?,
                Some(path),
            )),
            Err(e) if !must_exist && e.kind() == std::io::ErrorKind::NotFound => {
                Ok((Config::default(), None))
            }
            Err(source) => Err(ConfigError::Read { path, source }),
        }
    }

    /// Checks every value; the error is (dotted key, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        let bad = |k: &str, r: String| Err((k.to_string(), r));
        self.numa.validate()?;
        if let Err(e) = self.ladder_config().validate() {
            // LadderConfig names its field first: "v_dup: must be …".
            let (field, reason) = e.split_once(": ").unwrap_or(("levels", e.as_str()));
            // The one ladder field that is configured under [scan].
            let section = if field == "cluster_pages" {
                "scan"
            } else {
                "ladder"
            };
            return bad(&format!("{section}.{field}"), reason.to_string());
        }
        let s = &self.scan;
        if s.sleep_ms == 0 || s.sleep_ms.checked_mul(MS).is_none_or(|t| t > MAX_SLEEP) {
            return bad(
                "scan.sleep_ms",
                format!(
                    "must be between 1 and {} ms, got {}",
                    MAX_SLEEP / MS,
                    s.sleep_ms
                ),
            );
        }
        if let Some(rt) = s.round_time_ms
            && !(100..=3_600_000).contains(&rt)
        {
            return bad(
                "scan.round_time_ms",
                format!(
                    "must be between 100 ms and one hour (the paper uses 2000 to 20000), got {rt}"
                ),
            );
        }
        for (key, v) in [
            ("scan.cpu_cap", s.cpu_cap),
            ("ksm.merge_share", self.ksm.merge_share),
            ("ksm.trickle_share", self.ksm.trickle_share),
        ] {
            if let Some(v) = v
                && !(v > 0.0 && v <= 1.0)
            {
                return bad(
                    key,
                    format!(
                        "must be a fraction of one core above 0 and at most 1 (0.05 = 5 %), got {v}"
                    ),
                );
            }
        }
        if let Some(n) = self.ksm.scans_per_s
            && !(n > 0.0 && n <= 1000.0)
        {
            return bad(
                "ksm.scans_per_s",
                format!("must be above 0 and at most 1000 full scans a second, got {n}"),
            );
        }
        if s.subregion_mib == 0
            || s.subregion_mib
                .checked_mul(256)
                .is_none_or(|p| p > u32::MAX as u64)
        {
            return bad(
                "scan.subregion_mib",
                format!(
                    "must be between 1 and {} MiB, got {}",
                    u32::MAX as u64 / 256,
                    s.subregion_mib
                ),
            );
        }
        if s.max_regions == 0 || s.max_regions > 1 << 24 {
            return bad(
                "scan.max_regions",
                format!("must be between 1 and 16777216, got {}", s.max_regions),
            );
        }
        if s.refresh_ms == 0 || s.refresh_ms > 3_600_000 {
            return bad(
                "scan.refresh_ms",
                format!(
                    "must be between 1 ms and one hour (3600000), got {}",
                    s.refresh_ms
                ),
            );
        }
        if !(s.refresh_cpu > 0.0 && s.refresh_cpu <= 1.0) {
            return bad(
                "scan.refresh_cpu",
                format!(
                    "must be a fraction of one core above 0 and at most 1, got {}",
                    s.refresh_cpu
                ),
            );
        }
        if !(0.0..=1.0).contains(&s.sweep_share) {
            return bad(
                "scan.sweep_share",
                format!(
                    "must be a fraction of one core from 0 (off) to 1, got {}",
                    s.sweep_share
                ),
            );
        }
        if !(1..=86_400).contains(&s.sweep_every_s) {
            return bad(
                "scan.sweep_every_s",
                format!("must be between 1 s and a day, got {}", s.sweep_every_s),
            );
        }
        if !(0.0..=86_400.0).contains(&s.sweep_min_age_s) {
            return bad(
                "scan.sweep_min_age_s",
                format!(
                    "must be between 0 (at once) and a day, got {}",
                    s.sweep_min_age_s
                ),
            );
        }
        let a = &self.actuate;
        if !(a.max_map_count_fraction > 0.0 && a.max_map_count_fraction <= 1.0) {
            return bad(
                "actuate.max_map_count_fraction",
                format!(
                    "must be above 0 and at most 1, got {}",
                    a.max_map_count_fraction
                ),
            );
        }
        if a.run_pad_pages > 1 << 20 {
            return bad(
                "actuate.run_pad_pages",
                format!("must be at most 1048576 (4 GiB), got {}", a.run_pad_pages),
            );
        }
        if a.trim_min_pages != 0 && !(16..=1 << 20).contains(&a.trim_min_pages) {
            return bad(
                "actuate.trim_min_pages",
                format!(
                    "must be 0 (off) or 16 to 1048576 pages (64 KiB to 4 GiB), got {}",
                    a.trim_min_pages
                ),
            );
        }
        if a.recheck_s == 0 || a.recheck_s > 86_400 {
            return bad(
                "actuate.recheck_s",
                format!(
                    "must be at least 1 second and at most a day (86400), got {}",
                    a.recheck_s
                ),
            );
        }
        if a.write_hold_s == 0 {
            return bad("actuate.write_hold_s", "must be at least 1 second".into());
        }
        if a.account_pages_per_s == 0 {
            return bad(
                "actuate.account_pages_per_s",
                "must be at least 1 (merged pages and COW breaks are counted from it)".into(),
            );
        }
        for (i, e) in self
            .eligible
            .exes
            .iter()
            .chain(&self.ineligible.exes)
            .enumerate()
        {
            if !e.is_absolute() {
                let key = if i < self.eligible.exes.len() {
                    "eligible.exes"
                } else {
                    "ineligible.exes"
                };
                return bad(key, format!("must be absolute paths, got {}", e.display()));
            }
        }
        if let Some(addr) = &self.metrics.address {
            metrics_address(addr).map_err(|r| ("metrics.address".to_string(), r))?;
        }
        self.scrub.validate()?;
        self.savings.validate()?;
        let h = &self.hints;
        if let Some(bad_name) = h
            .syscalls
            .iter()
            .find(|n| !HINT_SYSCALLS.contains(&n.as_str()))
        {
            return bad(
                "hints.syscalls",
                format!(
                    "unknown syscall {bad_name:?}; known: {}",
                    HINT_SYSCALLS.join(", ")
                ),
            );
        }
        if let Some(c) = h.capacity
            && c > pagesift_core::pipeline::hints::MAX_CAPACITY
        {
            return bad(
                "hints.capacity",
                format!(
                    "must be at most {} hints, got {c}",
                    pagesift_core::pipeline::hints::MAX_CAPACITY
                ),
            );
        }
        if h.max_age_ms == 0 || h.max_age_ms > 3_600_000 {
            return bad(
                "hints.max_age_ms",
                format!(
                    "must be between 1 ms and one hour (the dissertation's is about 15 000), got {}",
                    h.max_age_ms
                ),
            );
        }
        h.ratio().map_err(|r| ("hints.interleave".to_string(), r))?;
        Ok(())
    }

    /// The ladder's configuration.
    pub fn ladder_config(&self) -> LadderConfig {
        LadderConfig {
            levels: self.ladder.levels,
            v_dup: self.ladder.v_dup,
            v_cow: self.ladder.v_cow,
            v_life: self.ladder.v_life_ms.saturating_mul(MS),
            cluster_pages: self.scan.cluster_pages,
            early_decision: self.ladder.early_decision,
        }
    }

    /// T_s.
    pub fn sleep(&self) -> Nanos {
        self.scan.sleep_ms * MS
    }

    /// Sub-region size in pages.
    pub fn subregion_pages(&self) -> u32 {
        (self.scan.subregion_mib * 256) as u32
    }

    /// How regions are cut and how many are tracked.
    pub fn region_limits(&self) -> crate::target::RegionLimits {
        crate::target::RegionLimits {
            subregion_pages: self.subregion_pages(),
            max_regions: self.scan.max_regions,
        }
    }

    /// The daemon's CPU cap: the configured one, never above the governor's.
    pub fn cpu_cap(&self) -> f64 {
        let g = self.governor.max_cpu();
        self.scan.cpu_cap.map_or(g, |c| c.min(g))
    }

    /// The per-level budgets: the governor's, with round times scaled to
    /// `scan.round_time_ms` and shares capped at [`Config::cpu_cap`].
    pub fn governor_params(&self) -> GovernorParams {
        let mut p = self.governor.params(self.ladder.levels);
        if let Some(rt) = self.scan.round_time_ms {
            let sum: u64 = p.levels.iter().map(|l| l.round_time).sum();
            if sum > 0 {
                let scale = (rt * MS) as f64 / sum as f64;
                for l in &mut p.levels {
                    l.round_time = ((l.round_time as f64 * scale) as Nanos).max(1);
                }
            }
        }
        let cap = self.cpu_cap();
        p.max_cpu = p.max_cpu.min(cap);
        for l in &mut p.levels {
            l.cpu_share = l.cpu_share.min(cap);
        }
        p
    }

    /// The exact sweep's CPU share: `scan.sweep_share`, at most the
    /// sampling cap ([`Config::cpu_cap`]), since the sweep samples too: at
    /// its default 3 % it could alone spend more than a `cpu_cap` an
    /// operator set lower (`pagesift bench`'s cow-broken at 2 % of a core
    /// sets 0.5 %), or the quiet governor's 1 %.
    pub fn sweep_share(&self) -> f64 {
        self.scan.sweep_share.min(self.cpu_cap())
    }

    /// ksmd's share while promoted memory is unmerged.
    pub fn merge_share(&self) -> f64 {
        self.ksm
            .merge_share
            .unwrap_or_else(|| self.governor.params(self.ladder.levels).top_share())
    }

    /// ksmd's share when everything promoted is merged.
    pub fn trickle_share(&self) -> f64 {
        self.ksm
            .trickle_share
            .unwrap_or(PacingConfig::default().trickle_share)
    }

    /// The ksmd pacer's configuration: its defaults (`pagesift_core::pipeline::pacing`),
    /// with the trickle share, the highest share and the scan rate from
    /// this config.
    pub fn pacing(&self) -> PacingConfig {
        let d = PacingConfig::default();
        PacingConfig {
            trickle_share: self.trickle_share().min(d.max_share),
            max_share: d.max_share.max(self.merge_share().min(0.99)),
            active_scans_per_s: self.ksm.scans_per_s.unwrap_or(d.active_scans_per_s),
            ..d
        }
    }
}

/// Reads the config file; run as root (effective uid 0), only if it is a
/// file no other user can change (`pagesift_linux::secure::check_trusted`
/// on the opened file: owned by root, not writable by group or others),
/// else `Ok(Err(reason))`. The config decides which processes are merged,
/// so a file another user can write would let them into the trust set.
fn read_trusted(path: &Path) -> std::io::Result<Result<String, String>> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let euid = rustix::process::geteuid().as_raw();
    if euid == 0
        && let Err(reason) = pagesift_linux::secure::check_trusted(&f.metadata()?, euid)
    {
        return Ok(Err(reason));
    }
    let mut text = String::new();
    f.read_to_string(&mut text)?;
    Ok(Ok(text))
}

/// Parses a metrics address: `HOST:PORT`, `[V6]:PORT`, or a bare `PORT`
/// (then 127.0.0.1, so metrics are not exposed beyond the host by
/// accident).
pub fn metrics_address(addr: &str) -> Result<std::net::SocketAddr, String> {
    use std::net::ToSocketAddrs;
    let a = addr.trim();
    let full = if a.parse::<u16>().is_ok() {
        format!("127.0.0.1:{a}")
    } else if let Some(port) = a.strip_prefix(':') {
        format!("127.0.0.1:{port}")
    } else {
        a.to_string()
    };
    full.to_socket_addrs()
        .map_err(|e| format!("`{addr}` is not HOST:PORT or PORT: {e}"))?
        .next()
        .ok_or_else(|| format!("`{addr}` resolves to no address"))
}

/// TOML errors span several lines (a snippet with a caret); the key path
/// already says where, so keep the message on one line.
fn one_line(s: &str) -> String {
    let lines: Vec<&str> = s
        .lines()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with('|')
                && !l.chars().next().is_some_and(|c| c.is_ascii_digit())
        })
        .collect();
    // "TOML parse error at line 2, column 9; <reason>" -> "<reason> (line 2, column 9)"
    match lines.split_first() {
        Some((first, rest)) if first.starts_with("TOML parse error at ") && !rest.is_empty() => {
            format!(
                "{} ({})",
                rest.join("; "),
                &first["TOML parse error at ".len()..]
            )
        }
        _ => lines.join("; "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> ConfigError {
        Config::from_toml(text, "t.toml").expect_err("should be rejected")
    }

    #[test]
    fn empty_text_is_the_paper_defaults() {
        let c = Config::from_toml("", "t.toml").unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.ladder.v_dup, 0.10);
        assert_eq!(c.ladder.v_cow, 0.50);
        assert_eq!(c.ladder.v_life_ms, 100);
        assert_eq!(c.ladder.levels, 4);
        assert_eq!(c.scan.sleep_ms, 100);
        assert_eq!(c.governor, Governor::Full);
        assert_eq!(c.cpu_cap(), 0.95);
        assert!(!c.eligible.all && c.eligible.selector().is_empty());
    }

    #[test]
    fn every_section_is_read() {
        let c = Config::from_toml(
            r#"
governor = "low"
[ladder]
levels = 3
v_dup = 0.2
v_cow = 1.0
v_life_ms = 500
early_decision = false
raise_recurring = false
[scan]
sleep_ms = 50
round_time_ms = 4000
cpu_cap = 0.1
subregion_mib = 16
[actuate]
unmerge_on_exit = true
[ksm]
trickle_share = 0.001
[eligible]
cgroups = ["/machine.slice"]
exes = ["/usr/bin/"]
[ineligible]
uids = [0]
[status]
socket = "/tmp/p.sock"
[metrics]
address = "9100"
"#,
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.governor, Governor::Low);
        assert_eq!(c.ladder_config().v_life, 500 * MS);
        assert!(!c.ladder_config().early_decision);
        assert!(!c.ladder.raise_recurring);
        assert_eq!(c.subregion_pages(), 16 * 256);
        assert_eq!(c.cpu_cap(), 0.1);
        assert_eq!(c.trickle_share(), 0.001);
        assert_eq!(c.ineligible.uids, vec![0]);
        assert!(c.actuate.unmerge_on_exit);
        let p = c.governor_params();
        let sum: u64 = p.levels.iter().map(|l| l.round_time).sum();
        assert!((sum as i64 - 4000 * MS as i64).abs() < 10, "{sum}");
        assert!(p.levels.iter().all(|l| l.cpu_share <= 0.1));
    }

    #[test]
    fn the_sweep_share_stays_within_the_sampling_cap() {
        let default = Config::from_toml("", "t").unwrap();
        assert_eq!(default.sweep_share(), 0.03);
        let quiet = Config::from_toml("governor = \"quiet\"\n", "t").unwrap();
        assert!(quiet.sweep_share() <= quiet.cpu_cap() && quiet.cpu_cap() < 0.03);
        let capped = Config::from_toml("[scan]\ncpu_cap = 0.005\n", "t").unwrap();
        assert_eq!(capped.sweep_share(), 0.005);
    }

    #[test]
    fn the_scrub_section_is_read_and_checked_by_key() {
        let c = Config::from_toml(
            "[scrub]\nenabled = true\nimages = [\"/var/lib/vm/a.img\"]\nperiod_min_s = 2\nperiod_max_s = 40\nperiod_initial_s = 10\ncached_frac = 0.4\nfree_frac = 0.2\n",
            "t",
        )
        .unwrap();
        assert!(c.scrub.enabled);
        let f = c.scrub.frequency();
        assert_eq!(
            (f.period_min, f.period_max),
            (2_000_000_000, 40_000_000_000)
        );
        assert_eq!((f.cached_frac, f.free_frac), (0.4, 0.2));
        assert!(f.check().is_ok());
        for (text, key) in [
            (
                "[scrub]\nperiod_min_s = 90\nperiod_initial_s = 90\n",
                "scrub.period_min_s",
            ),
            ("[scrub]\nperiod_initial_s = 1\n", "scrub.period_initial_s"),
            ("[scrub]\ncached_frac = 2\n", "scrub.cached_frac"),
            ("[scrub]\nfree_frac = -0.1\n", "scrub.free_frac"),
            ("[scrub]\nimages = [\"a.img\"]\n", "scrub.images"),
            ("[scrub]\ncomm_prefixes = [\"\"]\n", "scrub.comm_prefixes"),
            ("[scrub]\nenabeld = true\n", "scrub"),
        ] {
            let e = err(text);
            assert!(e.to_string().contains(key), "{text}: {e}");
        }
    }

    #[test]
    fn the_savings_section_is_read_and_checked_by_key() {
        let c = Config::from_toml(
            "[savings]\ncgroup_depth = 3\ntop_cgroups = 5\ntop_processes = 0\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            c.savings.limits(),
            pagesift_core::pipeline::savings::Limits {
                cgroup_depth: 3,
                top_cgroups: 5,
                top_processes: 0
            }
        );
        assert_eq!(Config::default().savings.cgroup_depth, 2);
        for (text, key, says) in [
            (
                "[savings]\ncgroup_depth = 33\n",
                "savings.cgroup_depth",
                "0 to 32",
            ),
            (
                "[savings]\ntop_cgroups = 0\n",
                "savings.top_cgroups",
                "1 to 1000",
            ),
            (
                "[savings]\ntop_cgroups = 1001\n",
                "savings.top_cgroups",
                "1 to 1000",
            ),
            (
                "[savings]\ntop_processes = 5000\n",
                "savings.top_processes",
                "0 to 1000",
            ),
            (
                "[savings]\ncgroup_depth = -1\n",
                "savings.cgroup_depth",
                "invalid value",
            ),
            (
                "[savings]\ntop_process = 3\n",
                "savings.top_process",
                "unknown field",
            ),
        ] {
            let e = err(text);
            assert_eq!(e.key(), Some(key), "{text}: {e}");
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
    }

    #[test]
    fn an_unknown_key_is_named() {
        let e = err("[ladder]\nv_dupp = 0.2\n");
        let msg = e.to_string();
        assert!(msg.contains("v_dupp"), "{msg}");
        assert!(msg.contains("unknown field"), "{msg}");
        let e = err("governer = \"full\"\n");
        assert!(e.to_string().contains("governer"), "{e}");
    }

    #[test]
    fn a_wrong_type_names_the_dotted_key() {
        let e = err("[ladder]\nv_dup = \"ten\"\n");
        assert_eq!(e.key(), Some("ladder.v_dup"), "{e}");
        assert!(e.to_string().contains("expected f64"), "{e}");
        let e = err("[eligible]\nuids = [\"root\"]\n");
        assert!(e.key().unwrap().starts_with("eligible.uids"), "{e}");
        let e = err("[hints]\nsyscalls = [\"read\", \"mmap\"]\n");
        assert_eq!(e.key(), Some("hints.syscalls"), "{e}");
        assert!(e.to_string().contains("mmap"), "{e}");
        let e = err("[hints]\ninterleave = \"2\"\n");
        assert_eq!(e.key(), Some("hints.interleave"), "{e}");
        let e = err("[hints]\ninterleave = \"0:0\"\n");
        assert_eq!(e.key(), Some("hints.interleave"), "{e}");
        let e = err("[hints]\nmax_age_ms = 0\n");
        assert_eq!(e.key(), Some("hints.max_age_ms"), "{e}");
        let e = err("[hints]\ncapacity = 99999999\n");
        assert_eq!(e.key(), Some("hints.capacity"), "{e}");
        let e = err("[hints]\nenable = true\n");
        assert_eq!(e.key(), Some("hints.enable"), "{e}");
        let e = err("[hints]\nhook = \"kprobe\"\n");
        assert_eq!(e.key(), Some("hints.hook"), "{e}");
        assert!(e.to_string().contains("sys-exit"), "{e}");
        let e = err("[actuate]\nwrite_tracking = \"yes\"\n");
        assert_eq!(e.key(), Some("actuate.write_tracking"), "{e}");
        assert!(e.to_string().contains("expected a boolean"), "{e}");
    }

    #[test]
    fn an_out_of_range_value_names_the_key_and_the_reason() {
        let e = err("[ladder]\nv_cow = 1.5\n");
        assert_eq!(e.key(), Some("ladder.v_cow"));
        assert!(e.to_string().contains("between 0 and 1"), "{e}");
        let e = err("[ladder]\nlevels = 0\n");
        assert_eq!(e.key(), Some("ladder.levels"), "{e}");
        let e = err("[scan]\nsleep_ms = 5000\n");
        assert_eq!(e.key(), Some("scan.sleep_ms"), "{e}");
        let e = err("[scan]\ncpu_cap = 0\n");
        assert_eq!(e.key(), Some("scan.cpu_cap"), "{e}");
        let e = err("[scan]\nsubregion_mib = 0\n");
        assert_eq!(e.key(), Some("scan.subregion_mib"), "{e}");
        for n in [0, 17] {
            let e = err(&format!("[scan]\ncluster_pages = {n}\n"));
            assert_eq!(e.key(), Some("scan.cluster_pages"), "{e}");
            assert!(e.to_string().contains("between 1 and 16"), "{e}");
        }
        for n in ["-1.0", "nan", "1e9"] {
            let e = err(&format!("[scan]\nsweep_min_age_s = {n}\n"));
            assert_eq!(e.key(), Some("scan.sweep_min_age_s"), "{e}");
        }
        for n in ["0", "-1", "1001", "nan"] {
            let e = err(&format!("[ksm]\nscans_per_s = {n}\n"));
            assert_eq!(e.key(), Some("ksm.scans_per_s"), "{e}");
        }
        for n in [1, 15, (1 << 20) + 1] {
            let e = err(&format!("[actuate]\ntrim_min_pages = {n}\n"));
            assert_eq!(e.key(), Some("actuate.trim_min_pages"), "{e}");
            assert!(e.to_string().contains("0 (off) or 16"), "{e}");
        }
        let e = err("[actuate]\nwrite_hold_s = 0\n");
        assert_eq!(e.key(), Some("actuate.write_hold_s"), "{e}");
        assert!(e.to_string().contains("at least 1 second"), "{e}");
        let e = err("[eligible]\nexes = [\"bin/qemu\"]\n");
        assert_eq!(e.key(), Some("eligible.exes"), "{e}");
        let e = err("[metrics]\naddress = \"nonsense:port\"\n");
        assert_eq!(e.key(), Some("metrics.address"), "{e}");
        let e = err("governor = \"turbo\"\n");
        assert_eq!(e.key(), Some("governor"), "{e}");
    }

    #[test]
    fn sizes_and_times_that_would_overflow_are_refused_with_the_key() {
        for (text, key) in [
            // 2^56 MiB: 2^64 pages, which wrapped to 0 and was accepted.
            (
                "[scan]\nsubregion_mib = 72057594037927936\n",
                "scan.subregion_mib",
            ),
            (
                "[scan]\nsubregion_mib = 9223372036854775807\n",
                "scan.subregion_mib",
            ),
            ("[scan]\nsubregion_mib = 16777216\n", "scan.subregion_mib"),
            ("[scan]\nsleep_ms = 9223372036854775807\n", "scan.sleep_ms"),
            ("[scan]\nsleep_ms = 18446744073710\n", "scan.sleep_ms"),
            (
                "[scan]\nrefresh_ms = 9223372036854775807\n",
                "scan.refresh_ms",
            ),
            (
                "[actuate]\nrecheck_s = 9223372036854775807\n",
                "actuate.recheck_s",
            ),
        ] {
            let e = err(text);
            assert_eq!(e.key(), Some(key), "{text}: {e}");
            assert!(e.to_string().contains("must be"), "{e}");
        }
        // The largest sub-region that fits is accepted.
        let c = Config::from_toml("[scan]\nsubregion_mib = 16777215\n", "t").unwrap();
        assert_eq!(c.subregion_pages(), 16_777_215 * 256);
    }

    #[test]
    fn as_root_a_config_another_user_could_change_is_refused() {
        if !rustix::process::geteuid().is_root() {
            eprintln!("skipped: needs root (the check applies to root only)");
            return;
        }
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("pagesift-cfgmode-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("p.toml");
        std::fs::write(&p, "governor = \"quiet\"\n").unwrap();
        let set = |m| std::fs::set_permissions(&p, std::fs::Permissions::from_mode(m)).unwrap();
        set(0o644);
        assert!(Config::load(Some(&p)).is_ok());
        set(0o666);
        let e = Config::load(Some(&p)).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, ConfigError::Untrusted { .. }), "{e}");
        assert!(
            msg.contains(&p.display().to_string()) && msg.contains("group or others"),
            "{msg}"
        );
        set(0o640);
        std::os::unix::fs::chown(&p, Some(65534), None).unwrap();
        let msg = Config::load(Some(&p)).unwrap_err().to_string();
        assert!(msg.contains("owned by uid 65534"), "{msg}");
        // The file is read, never changed.
        std::os::unix::fs::chown(&p, Some(0), None).unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "governor = \"quiet\"\n"
        );
        assert!(Config::load(Some(&p)).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn broken_toml_is_an_error_not_defaults() {
        let e = err("[ladder\nv_dup = 0.1\n");
        assert!(matches!(e, ConfigError::Syntax { .. }), "{e}");
        assert!(e.to_string().contains("line 1"), "{e}");
    }

    #[test]
    fn a_missing_explicit_file_is_an_error() {
        let e = Config::load(Some(Path::new("/nonexistent/pagesift.toml"))).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }), "{e}");
        assert!(e.to_string().contains("/nonexistent/pagesift.toml"));
    }

    #[test]
    fn an_explicit_file_is_read() {
        let dir = std::env::temp_dir().join(format!("pagesift-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("p.toml");
        std::fs::write(&p, "governor = \"quiet\"\n").unwrap();
        let (c, from) = Config::load(Some(&p)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.governor, Governor::Quiet);
        assert_eq!(from.as_deref(), Some(p.as_path()));
    }

    #[test]
    fn metrics_address_defaults_to_loopback() {
        assert_eq!(
            metrics_address("9100").unwrap().to_string(),
            "127.0.0.1:9100"
        );
        assert_eq!(
            metrics_address(":9100").unwrap().to_string(),
            "127.0.0.1:9100"
        );
        assert_eq!(
            metrics_address("0.0.0.0:9").unwrap().to_string(),
            "0.0.0.0:9"
        );
        assert!(metrics_address("x").is_err());
    }

    #[test]
    fn the_short_lived_profile_is_valid_and_paces_ksmd_for_it() {
        let text = include_str!("../../../dist/profiles/short-lived.toml");
        let c = Config::from_toml(text, "dist/profiles/short-lived.toml").unwrap();
        assert_eq!(c.scan.sleep_ms, 20);
        assert_eq!(c.scan.refresh_ms, 20);
        assert!(!c.actuate.write_tracking);
        assert!(!c.actuate.skip_short_lived);
        assert!(Config::default().actuate.skip_short_lived);
        // Two visits of a 200 ms region's pages fit in its life.
        assert!(c.pacing().active_scans_per_s >= 2.0 / 0.2);
        assert_eq!(
            Config::default().pacing().active_scans_per_s,
            PacingConfig::default().active_scans_per_s
        );
    }

    #[test]
    fn the_example_config_is_valid_and_documents_every_key() {
        let text = include_str!("../../../dist/pagesift.toml");
        let c = Config::from_toml(text, "dist/pagesift.toml").unwrap();
        // Every key the defaults serialize to appears in the example.
        let defaults = toml::to_string(&Config::default()).unwrap();
        let mut section = String::new();
        for line in defaults.lines() {
            if let Some(s) = line.strip_prefix('[') {
                section = s.trim_end_matches(']').to_string();
                assert!(
                    text.contains(&format!("[{section}]")),
                    "[{section}] missing"
                );
            } else if let Some((k, _)) = line.split_once(" = ") {
                assert!(
                    text.contains(&format!("{k} =")),
                    "{section}.{k} is not documented in dist/pagesift.toml"
                );
            }
        }
        for k in [
            "round_time_ms",
            "cpu_cap",
            "merge_share",
            "trickle_share",
            "address",
        ] {
            assert!(text.contains(&format!("{k} =")), "{k} missing");
        }
        let _ = c;
    }
}
