//! KSM: typed access to `/sys/kernel/mm/ksm`, per-process KSM state, ksmd's
//! CPU time, and owning KSM safely ([`KsmGuard`]).
//!
//! ## What is read
//!
//! - **Knobs** ([`Knob`]): every writable file of mainline-ksm.md §1.1.
//!   Knobs a kernel lacks (older than 6.7 has no `smart_scan`, older than
//!   6.8 no advisor, non-NUMA kernels no `merge_across_nodes`) read as
//!   `None`; writable files this code does not know (a newer kernel's) are
//!   still found by their mode bits and saved and restored as raw text.
//! - **Counters** ([`KsmCounters`], §1.2), each `None` when absent.
//! - **Per process** ([`ProcessKsmStat`], §2.1): `/proc/PID/ksm_stat` and
//!   `/proc/PID/ksm_merging_pages` (mode 0400: root or the owner).
//! - **vmstat** ([`KsmVmstat`]): `cow_ksm`, `ksm_swpin_copy` and any other
//!   `ksm` line of `/proc/vmstat`.
//! - **ksmd** ([`Ksmd`]): the kernel thread named `ksmd` (PF_KTHREAD) and
//!   its CPU time: `/proc/<ksmd>/schedstat` field 1 (ns on CPU, exact), or
//!   utime + stime of `/proc/<ksmd>/stat` in USER_HZ ticks when schedstat
//!   is missing (ksm-baseline.md §2 uses the same two sources).
//!
//! ## Owning KSM
//!
//! KSM is one global resource. Everything that changes it (the daemon and
//! every test) goes through a [`KsmGuard`]:
//!
//! 1. **Lock.** An exclusive `flock` on [`LOCK_PATH`] (std's
//!    `File::lock`), so concurrent test binaries and a running daemon take
//!    turns. The kernel drops the lock when the holder dies, however it
//!    dies.
//! 2. **Snapshot.** The values of every writable knob are read and also
//!    written *into the lock file*. If the holder is SIGKILLed, the next
//!    [`KsmGuard::acquire`] finds them there, puts them back first (and
//!    reports it, [`KsmGuard::recovered`]), and keeps them as its own
//!    snapshot: the machine returns to the state before the *first* owner.
//!    After a complete restore the file is emptied; after a partial one it
//!    keeps only the knobs still owed.
//! 3. **Write** only through the guard ([`KsmGuard::set`] and the typed
//!    setters), so a termination signal can stop further writes.
//! 4. **Restore** on [`KsmGuard::release`], on drop (also while unwinding
//!    from a panic), and, with [`TerminationWatch`], on SIGTERM/SIGINT.
//!
//! ### Restore order
//!
//! Some knobs constrain others (mainline-ksm.md §1.1, `mm/ksm.c`):
//! - `max_page_sharing` and `merge_across_nodes` can only change while no
//!   page is merged (`pages_shared == 0`, else EBUSY). Merged pages stay
//!   merged unless the owner asked for [`KsmGuard::set_unmerge_on_restore`],
//!   which writes `run=2` first; otherwise these knobs are *reported* as not
//!   restored, with the reason, and stay owed in the lock file.
//! - Changing `advisor_mode` resets `pages_to_scan` (to 100 for `none`, to
//!   `advisor_min_pages_to_scan` for `scan-time`), and `pages_to_scan`
//!   refuses writes (EINVAL) while the advisor is on. So the advisor's own
//!   knobs go first, then `advisor_mode`, then `pages_to_scan`; an advisor
//!   -tuned `pages_to_scan` under `scan-time` cannot be written back and is
//!   reported.
//! - ksmd is stopped (`run=0`) while knobs are written, so it does not
//!   merge pages between the check and the write, and `run` goes back last.
//!   An original `run=2` ("stopped, unmerged") is rewritten as 2 only when
//!   that unmerges nothing or unmerging was asked for; otherwise ksmd is left
//!   stopped (0) and `run` is reported.
//!
//! Every knob is read back at the end; any difference is reported.
//!
//! ## Making a child's memory mergeable
//!
//! [`with_memory_merge`] sets `PR_SET_MEMORY_MERGE` (mainline-ksm.md §2.2)
//! in a child between fork and exec; the flag survives exec since 6.7 (and
//! the exec'd image is really scanned since 6.10). The `prctl` call itself
//! is in [`crate::sys`], with the crate's other `unsafe` code.

use crate::LinuxError;
use crate::error::libc_errno;
use std::collections::BTreeMap;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Where mainline exposes KSM.
pub const KSM_SYSFS: &str = "/sys/kernel/mm/ksm";
/// The lock every KSM-changing process takes (tmpfs: gone at reboot, when
/// KSM's settings are back at their defaults too).
pub const LOCK_PATH: &str = "/run/pagesift-ksm.lock";

const EBUSY: i32 = 16;

// ---------------------------------------------------------------------------
// Knobs and their values

/// A writable KSM knob (mainline-ksm.md §1.1).
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
    /// the preferred OOM victim while that runs, mainline-ksm.md §1.1).
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

    fn parse(s: &str) -> Option<Run> {
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

    fn parse(s: &str) -> Option<AdvisorMode> {
        match s {
            "none" => Some(AdvisorMode::None),
            "scan-time" => Some(AdvisorMode::ScanTime),
            _ => None,
        }
    }
}

/// A knob's text as read, normalised to what writing it back needs: trimmed,
/// and for `advisor_mode` the selected word (`[none] scan-time` → `none`).
fn normalise(name: &str, raw: &str) -> String {
    let t = raw.trim();
    if name == Knob::AdvisorMode.file_name()
        && let (Some(a), Some(b)) = (t.find('['), t.find(']'))
        && a < b
    {
        return t[a + 1..b].to_string();
    }
    t.to_string()
}

// ---------------------------------------------------------------------------
// Errors

/// What can go wrong with KSM's sysfs, the lock, or the guard.
#[derive(Debug, thiserror::Error)]
pub enum KsmError {
    /// `/sys/kernel/mm/ksm` does not exist.
    #[error("this kernel has no KSM: {0} is missing (CONFIG_KSM is off)")]
    NoKsm(PathBuf),
    /// A knob or counter this kernel lacks.
    #[error("this kernel's KSM has no {0} (too old, or not a NUMA kernel)")]
    Missing(String),
    /// The kernel refused a value because pages are merged.
    #[error(
        "{knob} = {value} refused (EBUSY): {pages_shared} KSM pages are merged; \
         this knob can only change once run=2 has unmerged everything"
    )]
    Busy {
        /// The knob.
        knob: String,
        /// The value refused.
        value: String,
        /// `pages_shared` right after the refusal.
        pages_shared: u64,
    },
    /// The kernel refused a value as invalid.
    #[error("{knob} = {value} refused (EINVAL){hint}")]
    Invalid {
        /// The knob.
        knob: String,
        /// The value refused.
        value: String,
        /// Why, when it is known (e.g. the advisor owns `pages_to_scan`).
        hint: String,
    },
    /// Writing KSM's sysfs or the lock needs root.
    #[error("{what} needs root (the file is root's): {source}")]
    NotRoot {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// No kernel thread named ksmd.
    #[error("no ksmd kernel thread found in /proc")]
    NoKsmd,
    /// The lock was not free within the wait asked for.
    #[error("the KSM lock {path} is still held (by pid {holder}) after {waited:?}")]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// The holder's pid as it recorded it, or "unknown".
        holder: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The lock file is one another user could have written (a symbolic
    /// link, not a regular file, not owned by root, writable by group or
    /// others): the knob values in it are not trusted, and it is not used.
    #[error(
        "the KSM lock {path} is not trusted: {reason}; the knob values in it are not \
         written to sysfs (remove it and let pagesift create it again)"
    )]
    UntrustedLock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A termination signal restored KSM; the guard accepts no more writes.
    #[error("KSM was restored after a termination signal; no more changes are accepted")]
    Closed,
    /// A value that does not parse.
    #[error("cannot parse {what}: {text:?}")]
    Parse {
        /// What was being parsed.
        what: String,
        /// The text.
        text: String,
    },
    /// Any other I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: io::Error,
    },
}

impl KsmError {
    fn io(context: impl Into<String>, source: io::Error) -> KsmError {
        let context = context.into();
        match source.raw_os_error() {
            Some(libc_errno::EACCES) | Some(libc_errno::EPERM) => KsmError::NotRoot {
                what: context,
                source,
            },
            _ => KsmError::Io { context, source },
        }
    }
}

// ---------------------------------------------------------------------------
// Reading and writing sysfs

/// KSM's sysfs directory. Reads only; writes go through a [`KsmGuard`].
#[derive(Clone, Debug)]
pub struct Ksm {
    dir: PathBuf,
}

/// KSM's counters (mainline-ksm.md §1.2); `None` when the kernel lacks one.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KsmCounters {
    /// KSM pages in use (stable-tree nodes).
    pub pages_shared: Option<u64>,
    /// Further mappings of those pages: pages saved.
    pub pages_sharing: Option<u64>,
    /// Unstable-tree nodes.
    pub pages_unshared: Option<u64>,
    /// Pages changing too fast to enter a tree.
    pub pages_volatile: Option<u64>,
    /// Cumulative pages scanned (6.6).
    pub pages_scanned: Option<u64>,
    /// Pages skipped by smart scan (6.7).
    pub pages_skipped: Option<u64>,
    /// Completed passes over all mergeable memory.
    pub full_scans: Option<u64>,
    /// Bytes saved minus rmap_item metadata; can be negative (6.4).
    pub general_profit: Option<i64>,
    /// Pages mapped to the kernel zero page by KSM (6.6).
    pub ksm_zero_pages: Option<u64>,
    /// KSM pages that reached `max_page_sharing`.
    pub stable_node_chains: Option<u64>,
    /// Duplicate KSM pages chained under them.
    pub stable_node_dups: Option<u64>,
}

impl KsmCounters {
    /// Pages saved: `pages_sharing + ksm_zero_pages` (mainline-ksm.md §1.2).
    pub fn pages_saved(&self) -> u64 {
        self.pages_sharing.unwrap_or(0) + self.ksm_zero_pages.unwrap_or(0)
    }
}

impl Ksm {
    /// The mainline location, refused with [`KsmError::NoKsm`] when the
    /// kernel has no KSM.
    pub fn open() -> Result<Ksm, KsmError> {
        Ksm::at(KSM_SYSFS)
    }

    /// KSM's files in another directory (a copy, for tests).
    pub fn at(dir: impl Into<PathBuf>) -> Result<Ksm, KsmError> {
        let dir = dir.into();
        if !dir.join(Knob::Run.file_name()).exists() {
            return Err(KsmError::NoKsm(dir));
        }
        Ok(Ksm { dir })
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether this kernel has `knob`.
    pub fn has(&self, knob: Knob) -> bool {
        self.dir.join(knob.file_name()).exists()
    }

    /// The normalised text of file `name`, `None` when the kernel lacks it.
    pub fn read_name(&self, name: &str) -> Result<Option<String>, KsmError> {
        let path = self.dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(normalise(name, &s))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(KsmError::io(format!("reading {}", path.display()), e)),
        }
    }

    /// A knob's normalised text, `None` when the kernel lacks it.
    pub fn read(&self, knob: Knob) -> Result<Option<String>, KsmError> {
        self.read_name(knob.file_name())
    }

    fn read_number<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, KsmError> {
        match self.read_name(name)? {
            None => Ok(None),
            Some(s) => s.parse().map(Some).map_err(|_| KsmError::Parse {
                what: format!("{}/{name}", self.dir.display()),
                text: s,
            }),
        }
    }

    fn required<T>(&self, knob: Knob, v: Option<T>) -> Result<T, KsmError> {
        v.ok_or_else(|| KsmError::Missing(knob.file_name().into()))
    }

    /// A numeric knob (`None` when the kernel lacks it).
    pub fn number(&self, knob: Knob) -> Result<Option<u64>, KsmError> {
        self.read_number(knob.file_name())
    }

    /// A boolean knob (`use_zero_pages`, `smart_scan`,
    /// `merge_across_nodes`), `None` when the kernel lacks it.
    pub fn flag(&self, knob: Knob) -> Result<Option<bool>, KsmError> {
        Ok(self.number(knob)?.map(|v| v != 0))
    }

    /// `run`.
    pub fn run(&self) -> Result<Run, KsmError> {
        let s = self.read(Knob::Run)?;
        let s = self.required(Knob::Run, s)?;
        Run::parse(&s).ok_or(KsmError::Parse {
            what: "run".into(),
            text: s,
        })
    }

    /// `pages_to_scan`.
    pub fn pages_to_scan(&self) -> Result<u32, KsmError> {
        let v = self.read_number(Knob::PagesToScan.file_name())?;
        self.required(Knob::PagesToScan, v)
    }

    /// `sleep_millisecs`.
    pub fn sleep_millisecs(&self) -> Result<u32, KsmError> {
        let v = self.read_number(Knob::SleepMillisecs.file_name())?;
        self.required(Knob::SleepMillisecs, v)
    }

    /// `max_page_sharing`.
    pub fn max_page_sharing(&self) -> Result<u32, KsmError> {
        let v = self.read_number(Knob::MaxPageSharing.file_name())?;
        self.required(Knob::MaxPageSharing, v)
    }

    /// `advisor_mode`, `None` before 6.8.
    pub fn advisor_mode(&self) -> Result<Option<AdvisorMode>, KsmError> {
        match self.read(Knob::AdvisorMode)? {
            None => Ok(None),
            Some(s) => AdvisorMode::parse(&s).map(Some).ok_or(KsmError::Parse {
                what: "advisor_mode".into(),
                text: s,
            }),
        }
    }

    /// Every counter.
    pub fn counters(&self) -> Result<KsmCounters, KsmError> {
        Ok(KsmCounters {
            pages_shared: self.read_number("pages_shared")?,
            pages_sharing: self.read_number("pages_sharing")?,
            pages_unshared: self.read_number("pages_unshared")?,
            pages_volatile: self.read_number("pages_volatile")?,
            pages_scanned: self.read_number("pages_scanned")?,
            pages_skipped: self.read_number("pages_skipped")?,
            full_scans: self.read_number("full_scans")?,
            general_profit: self.read_number("general_profit")?,
            ksm_zero_pages: self.read_number("ksm_zero_pages")?,
            stable_node_chains: self.read_number("stable_node_chains")?,
            stable_node_dups: self.read_number("stable_node_dups")?,
        })
    }

    /// `pages_shared` (0 when absent, which it never is on a KSM kernel).
    pub fn pages_shared(&self) -> Result<u64, KsmError> {
        Ok(self.read_number("pages_shared")?.unwrap_or(0))
    }

    /// Names of every writable file: the known knobs this kernel has, then
    /// writable files this code does not know, sorted.
    pub fn writable_names(&self) -> Result<Vec<String>, KsmError> {
        let mut known: Vec<String> = Knob::ALL
            .iter()
            .filter(|k| self.has(**k))
            .map(|k| k.file_name().to_string())
            .collect();
        let mut unknown = Vec::new();
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| KsmError::io(format!("listing {}", self.dir.display()), e))?;
        for e in entries {
            let e = e.map_err(|e| KsmError::io(format!("listing {}", self.dir.display()), e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if Knob::from_file_name(&name).is_some() {
                continue;
            }
            let Ok(meta) = e.metadata() else { continue };
            if meta.is_file() && meta.permissions().mode() & 0o200 != 0 {
                unknown.push(name);
            }
        }
        unknown.sort();
        known.extend(unknown);
        Ok(known)
    }

    /// Every writable knob's value.
    pub fn snapshot(&self) -> Result<KsmSnapshot, KsmError> {
        let mut values = BTreeMap::new();
        for name in self.writable_names()? {
            if let Some(v) = self.read_name(&name)? {
                values.insert(name, v);
            }
        }
        Ok(KsmSnapshot { values })
    }

    /// Writes `value` to file `name`, turning errno into a [`KsmError`]
    /// that says why. Only the guard calls it.
    fn write_name(&self, name: &str, value: &str) -> Result<(), KsmError> {
        let path = self.dir.join(name);
        // O_TRUNC is ignored by sysfs and keeps a copy (tests) exact.
        let r = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&path)
            .and_then(|mut f| f.write_all(value.as_bytes()));
        let Err(e) = r else { return Ok(()) };
        match e.raw_os_error() {
            Some(libc_errno::ENOENT) => Err(KsmError::Missing(name.into())),
            Some(EBUSY) => Err(KsmError::Busy {
                knob: name.into(),
                value: value.into(),
                pages_shared: self.pages_shared().unwrap_or(0),
            }),
            Some(libc_errno::EINVAL) => {
                let hint = if name == Knob::PagesToScan.file_name()
                    && self.advisor_mode().ok().flatten() == Some(AdvisorMode::ScanTime)
                {
                    ": advisor_mode is scan-time, and the advisor owns pages_to_scan".into()
                } else {
                    String::new()
                };
                Err(KsmError::Invalid {
                    knob: name.into(),
                    value: value.into(),
                    hint,
                })
            }
            _ => Err(KsmError::io(
                format!("writing {value:?} to {}", path.display()),
                e,
            )),
        }
    }
}

// ---------------------------------------------------------------------------
// Snapshot

/// The values of KSM's writable knobs at one moment, as text that can be
/// written back. Knobs the kernel lacks are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KsmSnapshot {
    values: BTreeMap<String, String>,
}

/// A typed view of a [`KsmSnapshot`]; `None` where the kernel lacks the
/// knob (or its text does not parse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KsmSettings {
    /// `run`.
    pub run: Option<Run>,
    /// `pages_to_scan`.
    pub pages_to_scan: Option<u64>,
    /// `sleep_millisecs`.
    pub sleep_millisecs: Option<u64>,
    /// `merge_across_nodes`.
    pub merge_across_nodes: Option<bool>,
    /// `use_zero_pages`.
    pub use_zero_pages: Option<bool>,
    /// `max_page_sharing`.
    pub max_page_sharing: Option<u64>,
    /// `stable_node_chains_prune_millisecs`.
    pub stable_node_chains_prune_millisecs: Option<u64>,
    /// `smart_scan`.
    pub smart_scan: Option<bool>,
    /// `advisor_mode`.
    pub advisor_mode: Option<AdvisorMode>,
    /// `advisor_max_cpu` (%).
    pub advisor_max_cpu: Option<u64>,
    /// `advisor_min_pages_to_scan`.
    pub advisor_min_pages_to_scan: Option<u64>,
    /// `advisor_max_pages_to_scan`.
    pub advisor_max_pages_to_scan: Option<u64>,
    /// `advisor_target_scan_time` (s).
    pub advisor_target_scan_time: Option<u64>,
}

impl KsmSnapshot {
    /// A knob's saved text.
    pub fn get(&self, knob: Knob) -> Option<&str> {
        self.get_name(knob.file_name())
    }

    /// A file's saved text (also for knobs this code does not know).
    pub fn get_name(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(String::as_str)
    }

    /// (file name, text) pairs, sorted by name.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.values.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of saved knobs.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether nothing is saved.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Knobs whose text differs from `other`: (name, ours, theirs).
    pub fn diff(&self, other: &KsmSnapshot) -> Vec<(String, Option<String>, Option<String>)> {
        let mut names: Vec<&String> = self.values.keys().chain(other.values.keys()).collect();
        names.sort();
        names.dedup();
        names
            .into_iter()
            .filter(|n| self.values.get(*n) != other.values.get(*n))
            .map(|n| {
                (
                    n.clone(),
                    self.values.get(n).cloned(),
                    other.values.get(n).cloned(),
                )
            })
            .collect()
    }

    /// The typed view.
    pub fn settings(&self) -> KsmSettings {
        let num = |k: Knob| self.get(k).and_then(|s| s.parse::<u64>().ok());
        let flag = |k: Knob| num(k).map(|v| v != 0);
        KsmSettings {
            run: self.get(Knob::Run).and_then(Run::parse),
            pages_to_scan: num(Knob::PagesToScan),
            sleep_millisecs: num(Knob::SleepMillisecs),
            merge_across_nodes: flag(Knob::MergeAcrossNodes),
            use_zero_pages: flag(Knob::UseZeroPages),
            max_page_sharing: num(Knob::MaxPageSharing),
            stable_node_chains_prune_millisecs: num(Knob::StableNodeChainsPruneMillisecs),
            smart_scan: flag(Knob::SmartScan),
            advisor_mode: self.get(Knob::AdvisorMode).and_then(AdvisorMode::parse),
            advisor_max_cpu: num(Knob::AdvisorMaxCpu),
            advisor_min_pages_to_scan: num(Knob::AdvisorMinPagesToScan),
            advisor_max_pages_to_scan: num(Knob::AdvisorMaxPagesToScan),
            advisor_target_scan_time: num(Knob::AdvisorTargetScanTime),
        }
    }

    /// `name value` lines (the lock file's format).
    pub fn to_text(&self) -> String {
        self.values
            .iter()
            .map(|(k, v)| format!("{k} {v}\n"))
            .collect()
    }

    /// Parses [`to_text`](Self::to_text)'s format; `#` lines are comments.
    pub fn from_text(text: &str) -> Result<KsmSnapshot, KsmError> {
        let mut values = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (k, v) = line.split_once(' ').ok_or_else(|| KsmError::Parse {
                what: "a KSM snapshot line".into(),
                text: line.into(),
            })?;
            if k.is_empty() || k.contains('/') || k.starts_with('.') {
                return Err(KsmError::Parse {
                    what: "a KSM knob name".into(),
                    text: k.into(),
                });
            }
            values.insert(k.to_string(), v.trim().to_string());
        }
        Ok(KsmSnapshot { values })
    }

    /// This snapshot with `other`'s values put over it.
    fn overlaid(&self, other: &KsmSnapshot) -> KsmSnapshot {
        let mut values = self.values.clone();
        values.extend(other.values.iter().map(|(k, v)| (k.clone(), v.clone())));
        KsmSnapshot { values }
    }

    /// The order a restore writes this snapshot's knobs in: known knobs in
    /// [`Knob::ALL`]'s order with unknown ones just before `advisor_mode`.
    fn restore_order(&self) -> Vec<&str> {
        let unknown = self
            .values
            .keys()
            .filter(|k| Knob::from_file_name(k).is_none())
            .map(String::as_str);
        let known = |ks: &[Knob]| -> Vec<&str> {
            ks.iter()
                .map(|k| k.file_name())
                .filter(|n| self.values.contains_key(*n))
                .collect()
        };
        let split = Knob::ALL
            .iter()
            .position(|k| *k == Knob::AdvisorMode)
            .unwrap_or(0);
        let mut out = known(&Knob::ALL[..split]);
        out.extend(unknown);
        out.extend(known(&Knob::ALL[split..]));
        out
    }
}

// ---------------------------------------------------------------------------
// Restoring

/// A knob a restore could not put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrestored {
    /// The file name.
    pub knob: String,
    /// The value it should have.
    pub wanted: String,
    /// The value it has (`None` if unreadable).
    pub actual: Option<String>,
    /// Why.
    pub reason: String,
}

/// What a restore did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// (knob, value) written, in order, `run` writes included.
    pub written: Vec<(String, String)>,
    /// Knobs still not at their snapshot value.
    pub unrestored: Vec<Unrestored>,
}

impl RestoreReport {
    /// Whether every knob is back.
    pub fn is_complete(&self) -> bool {
        self.unrestored.is_empty()
    }
}

impl fmt::Display for RestoreReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_complete() {
            return write!(f, "KSM restored ({} writes)", self.written.len());
        }
        write!(f, "KSM not fully restored:")?;
        for u in &self.unrestored {
            write!(
                f,
                " {} is {} (wanted {}): {};",
                u.knob,
                u.actual.as_deref().unwrap_or("unreadable"),
                u.wanted,
                u.reason
            )?;
        }
        Ok(())
    }
}

/// Puts `snap` back, in the order the module header explains. With
/// `unmerge`, writes `run=2` first (unmerging everything), which lets the
/// knobs that need nothing merged change.
fn restore_to(ksm: &Ksm, snap: &KsmSnapshot, unmerge: bool) -> RestoreReport {
    let mut report = RestoreReport::default();
    let mut failed: BTreeMap<String, String> = BTreeMap::new();
    let current = |name: &str| ksm.read_name(name).ok().flatten();
    let write = |report: &mut RestoreReport, name: &str, value: &str| -> Result<(), String> {
        match ksm.write_name(name, value) {
            Ok(()) => {
                report.written.push((name.to_string(), value.to_string()));
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    };

    let differs: Vec<&str> = snap
        .restore_order()
        .into_iter()
        .filter(|n| current(n).as_deref() != snap.get_name(n))
        .collect();
    if differs.is_empty() && !unmerge {
        return report;
    }
    let run_now = current("run");

    // 1. Stop ksmd while knobs change (it would merge pages meanwhile).
    if run_now.as_deref() == Some("1")
        && let Err(e) = write(&mut report, "run", "0")
    {
        failed.insert("run".into(), format!("could not stop ksmd first: {e}"));
    }
    // 2. Unmerge everything if asked.
    if unmerge && let Err(e) = write(&mut report, "run", "2") {
        failed.insert("run".into(), format!("could not unmerge (run=2): {e}"));
    }

    // 3. Every knob but run, in order.
    let advisor_first = snap.get(Knob::AdvisorMode);
    for name in snap.restore_order() {
        if name == "run" {
            continue;
        }
        let Some(wanted) = snap.get_name(name) else {
            continue;
        };
        let now = current(name);
        if now.as_deref() == Some(wanted) {
            continue;
        }
        if name == Knob::PagesToScan.file_name() && advisor_first == Some("scan-time") {
            failed.insert(
                name.into(),
                format!(
                    "advisor_mode is scan-time, which owns pages_to_scan: entering it set \
                     pages_to_scan to advisor_min_pages_to_scan ({}) and the advisor retunes \
                     it after every full scan",
                    current(Knob::AdvisorMinPagesToScan.file_name()).unwrap_or_default()
                ),
            );
            continue;
        }
        if let Err(e) = write(&mut report, name, wanted) {
            failed.insert(name.into(), e);
        }
    }

    // 4. run last.
    if let Some(wanted) = snap.get(Knob::Run) {
        let now = current("run");
        if now.as_deref() != Some(wanted) {
            let shared = ksm.pages_shared().unwrap_or(0);
            let r = if wanted == "2" && shared > 0 && !unmerge {
                // 2 would unmerge every merged page: only on request.
                if now.as_deref() != Some("0") {
                    let _ = write(&mut report, "run", "0");
                }
                Err(format!(
                    "run was 2 (stopped and unmerged); writing 2 would unmerge the {shared} KSM \
                     pages merged since, so ksmd is left stopped (0) instead"
                ))
            } else {
                write(&mut report, "run", wanted)
            };
            if let Err(e) = r {
                failed.insert("run".into(), e);
            }
        }
    }

    // 5. Read everything back.
    for name in snap.restore_order() {
        let wanted = snap.get_name(name).unwrap_or_default();
        let actual = current(name);
        if actual.as_deref() != Some(wanted) {
            report.unrestored.push(Unrestored {
                knob: name.into(),
                wanted: wanted.into(),
                actual,
                reason: failed
                    .remove(name)
                    .unwrap_or_else(|| "the value read back differs".into()),
            });
        }
    }
    report
}

// ---------------------------------------------------------------------------
// The lock

/// The exclusive advisory lock on the lock file, which also holds the
/// settings owed to the machine.
#[derive(Debug)]
struct LockFile {
    file: File,
    path: PathBuf,
}

impl LockFile {
    /// Opens (creating it 0600 if missing) and locks the lock file. The
    /// next owner writes the knob values it holds to sysfs, so it is opened
    /// without following a symbolic link (O_NOFOLLOW) and used only if it
    /// is a regular file owned by root (or by us) that group and others
    /// cannot write ([`crate::secure::check_trusted`]).
    fn acquire(path: &Path, wait: Option<Duration>) -> Result<LockFile, KsmError> {
        use std::os::unix::fs::OpenOptionsExt;
        let untrusted = |reason: String| KsmError::UntrustedLock {
            path: path.into(),
            reason,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => untrusted("it is a symbolic link".into()),
                _ => KsmError::io(format!("opening the KSM lock {}", path.display()), e),
            })?;
        let meta = file
            .metadata()
            .map_err(|e| KsmError::io(format!("reading the KSM lock {}", path.display()), e))?;
        let euid = rustix::process::geteuid().as_raw();
        crate::secure::check_trusted(&meta, euid).map_err(untrusted)?;
        let start = Instant::now();
        match wait {
            None => file
                .lock()
                .map_err(|e| KsmError::io(format!("locking {}", path.display()), e))?,
            Some(limit) => loop {
                match file.try_lock() {
                    Ok(()) => break,
                    Err(std::fs::TryLockError::WouldBlock) => {
                        if start.elapsed() >= limit {
                            let holder = std::fs::read_to_string(path)
                                .ok()
                                .and_then(|t| holder_pid(&t))
                                .unwrap_or_else(|| "unknown".into());
                            return Err(KsmError::LockTimeout {
                                path: path.into(),
                                holder,
                                waited: start.elapsed(),
                            });
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(std::fs::TryLockError::Error(e)) => {
                        return Err(KsmError::io(format!("locking {}", path.display()), e));
                    }
                }
            },
        }
        Ok(LockFile {
            file,
            path: path.into(),
        })
    }

    /// What a previous owner left owed (empty after a clean release).
    fn owed(&mut self) -> Result<KsmSnapshot, KsmError> {
        let mut text = String::new();
        self.file
            .rewind()
            .and_then(|_| self.file.read_to_string(&mut text))
            .map_err(|e| KsmError::io(format!("reading {}", self.path.display()), e))?;
        KsmSnapshot::from_text(&text)
    }

    /// Replaces the file's content with `owed`, under a header naming us.
    fn record(&mut self, owed: &KsmSnapshot) -> Result<(), KsmError> {
        let text = if owed.is_empty() {
            String::new()
        } else {
            format!(
                "# pagesift KSM lock: owner pid {}\n\
                 # KSM settings owed to the machine if the owner dies:\n{}",
                std::process::id(),
                owed.to_text()
            )
        };
        self.file
            .set_len(0)
            .and_then(|_| self.file.rewind())
            .and_then(|_| self.file.write_all(text.as_bytes()))
            .and_then(|_| self.file.sync_data())
            .map_err(|e| KsmError::io(format!("writing {}", self.path.display()), e))
    }
}

/// The pid in a lock file's header.
fn holder_pid(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("# pagesift KSM lock: owner pid "))
        .map(|p| p.trim().to_string())
}

// ---------------------------------------------------------------------------
// The guard

/// Where a [`KsmGuard`] locks and what it owns; [`Default`] is the
/// machine's KSM and [`LOCK_PATH`], waiting as long as it takes.
#[derive(Clone, Debug)]
pub struct GuardOptions {
    /// KSM's sysfs directory.
    pub sysfs: PathBuf,
    /// The lock file.
    pub lock_path: PathBuf,
    /// How long to wait for the lock (`None`: until it is free).
    pub wait: Option<Duration>,
}

impl Default for GuardOptions {
    fn default() -> Self {
        GuardOptions {
            sysfs: KSM_SYSFS.into(),
            lock_path: LOCK_PATH.into(),
            wait: None,
        }
    }
}

#[derive(Debug)]
struct Owner {
    ksm: Ksm,
    lock: Option<LockFile>,
    snapshot: KsmSnapshot,
    unmerge_on_restore: bool,
    /// A termination signal restored KSM: no more writes.
    closed: bool,
}

impl Owner {
    /// Restores, records what is still owed, and keeps the lock.
    fn restore(&mut self) -> RestoreReport {
        let report = restore_to(&self.ksm, &self.snapshot, self.unmerge_on_restore);
        let owed = KsmSnapshot {
            values: report
                .unrestored
                .iter()
                .map(|u| (u.knob.clone(), u.wanted.clone()))
                .collect(),
        };
        if let Some(lock) = self.lock.as_mut()
            && let Err(e) = lock.record(&owed)
        {
            eprintln!("pagesift: {e}");
        }
        report
    }

    /// Restores and unlocks (once).
    fn release(&mut self) -> Option<RestoreReport> {
        self.lock.as_ref()?;
        let report = self.restore();
        self.lock = None; // closing the file drops the flock
        Some(report)
    }
}

/// Every live guard of this process, for [`TerminationWatch`].
static LIVE: Mutex<Vec<Weak<Mutex<Owner>>>> = Mutex::new(Vec::new());

fn lock_owner(o: &Mutex<Owner>) -> MutexGuard<'_, Owner> {
    // A panic while holding it (inside a restore) must not stop later
    // restores.
    o.lock().unwrap_or_else(|e| e.into_inner())
}

/// Exclusive ownership of KSM: holds the lock and the snapshot, and puts
/// the snapshot back when released or dropped (also during a panic). See
/// the module header.
#[derive(Debug)]
pub struct KsmGuard {
    owner: Arc<Mutex<Owner>>,
    ksm: Ksm,
    snapshot: KsmSnapshot,
    recovered: Option<RestoreReport>,
}

impl KsmGuard {
    /// Takes the lock on [`LOCK_PATH`] (waiting for it) and snapshots the
    /// machine's KSM.
    pub fn acquire() -> Result<KsmGuard, KsmError> {
        KsmGuard::acquire_with(GuardOptions::default())
    }

    /// [`acquire`](Self::acquire) with other paths or a bounded wait.
    pub fn acquire_with(opts: GuardOptions) -> Result<KsmGuard, KsmError> {
        let ksm = Ksm::at(&opts.sysfs)?;
        let mut lock = LockFile::acquire(&opts.lock_path, opts.wait)?;
        let owed = lock.owed()?;
        let now = ksm.snapshot()?;
        // Settings a dead owner did not put back are the real originals.
        let snapshot = now.overlaid(&owed);
        let recovered = if owed.is_empty() {
            None
        } else {
            Some(restore_to(&ksm, &snapshot, false))
        };
        lock.record(&snapshot)?;
        let owner = Arc::new(Mutex::new(Owner {
            ksm: ksm.clone(),
            lock: Some(lock),
            snapshot: snapshot.clone(),
            unmerge_on_restore: false,
            closed: false,
        }));
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&owner));
        Ok(KsmGuard {
            owner,
            ksm,
            snapshot,
            recovered,
        })
    }

    /// Read access to KSM.
    pub fn ksm(&self) -> &Ksm {
        &self.ksm
    }

    /// The settings that will be put back.
    pub fn snapshot(&self) -> &KsmSnapshot {
        &self.snapshot
    }

    /// When a previous owner died without restoring, what putting its
    /// originals back did at acquire.
    pub fn recovered(&self) -> Option<&RestoreReport> {
        self.recovered.as_ref()
    }

    /// With `true`, restoring first writes `run=2`, unmerging every merged
    /// page (the daemon's `--unmerge-on-exit`); this also lets
    /// `max_page_sharing` and `merge_across_nodes` be put back.
    pub fn set_unmerge_on_restore(&self, unmerge: bool) {
        lock_owner(&self.owner).unmerge_on_restore = unmerge;
    }

    /// Writes raw `value` to knob file `name` (also one this code does not
    /// know, if the snapshot has it).
    pub fn set_name(&self, name: &str, value: &str) -> Result<(), KsmError> {
        let o = lock_owner(&self.owner);
        if o.closed || o.lock.is_none() {
            return Err(KsmError::Closed);
        }
        o.ksm.write_name(name, value)
    }

    /// Writes raw `value` to `knob`.
    pub fn set(&self, knob: Knob, value: &str) -> Result<(), KsmError> {
        if !self.ksm.has(knob) {
            return Err(KsmError::Missing(knob.file_name().into()));
        }
        self.set_name(knob.file_name(), value)
    }

    /// Writes a number.
    pub fn set_number(&self, knob: Knob, value: u64) -> Result<(), KsmError> {
        self.set(knob, &value.to_string())
    }

    /// Writes a boolean as 0/1.
    pub fn set_flag(&self, knob: Knob, value: bool) -> Result<(), KsmError> {
        self.set(knob, if value { "1" } else { "0" })
    }

    /// Writes `run`.
    pub fn set_run(&self, run: Run) -> Result<(), KsmError> {
        self.set_number(Knob::Run, run.as_u8() as u64)
    }

    /// Writes `advisor_mode` (which resets `pages_to_scan` when it changes).
    pub fn set_advisor_mode(&self, mode: AdvisorMode) -> Result<(), KsmError> {
        self.set(Knob::AdvisorMode, mode.as_str())
    }

    /// Writes `pages_to_scan` (refused while the advisor is on).
    pub fn set_pages_to_scan(&self, pages: u32) -> Result<(), KsmError> {
        self.set_number(Knob::PagesToScan, pages as u64)
    }

    /// Writes `sleep_millisecs` (which wakes ksmd).
    pub fn set_sleep_millisecs(&self, ms: u32) -> Result<(), KsmError> {
        self.set_number(Knob::SleepMillisecs, ms as u64)
    }

    /// Writes a pacer's output: `pages_to_scan`, then `sleep_millisecs`
    /// (whose write wakes ksmd, so the new batch size is used at once).
    pub fn set_pace(&self, pace: pagesift_core::pacing::KsmdPace) -> Result<(), KsmError> {
        self.set_pages_to_scan(pace.pages_to_scan)?;
        self.set_sleep_millisecs(pace.sleep_millisecs)
    }

    /// Puts the snapshot back now and keeps ownership (a later drop
    /// restores again). Knobs still owed stay recorded in the lock file.
    pub fn restore(&self) -> RestoreReport {
        let mut o = lock_owner(&self.owner);
        if o.closed {
            return RestoreReport::default();
        }
        o.restore()
    }

    /// Puts the snapshot back and gives up the lock.
    pub fn release(self) -> RestoreReport {
        let r = lock_owner(&self.owner).release();
        r.unwrap_or_default()
        // Drop then finds the lock gone and does nothing.
    }
}

impl Drop for KsmGuard {
    fn drop(&mut self) {
        if let Some(report) = lock_owner(&self.owner).release()
            && !report.is_complete()
        {
            eprintln!("pagesift: {report}");
        }
    }
}

// ---------------------------------------------------------------------------
// Termination signals

/// SIGTERM/SIGINT handling for a process that owns KSM.
///
/// After [`install`](Self::install), the first SIGTERM or SIGINT sets
/// [`requested`](Self::requested), so the daemon can shut down gracefully
/// and drop its guard. If the process is still alive `grace` later, or on a
/// second signal, every live [`KsmGuard`] of the process is restored (their
/// writes refused from then on) and the process dies of the signal, as it
/// would have without a handler. With a zero grace this happens at once.
/// SIGKILL cannot be caught: the lock file's record covers it.
#[derive(Clone, Debug)]
pub struct TerminationWatch {
    requested: Arc<AtomicBool>,
}

static WATCH: OnceLock<TerminationWatch> = OnceLock::new();

impl TerminationWatch {
    /// Installs the handler (once per process; later calls return the
    /// first watch and ignore their `grace`).
    pub fn install(grace: Duration) -> Result<TerminationWatch, KsmError> {
        if let Some(w) = WATCH.get() {
            return Ok(w.clone());
        }
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
            .map_err(|e| KsmError::io("installing SIGTERM/SIGINT handlers", e))?;
        let watch = TerminationWatch {
            requested: Arc::new(AtomicBool::new(false)),
        };
        let w = WATCH.get_or_init(|| watch.clone()).clone();
        let requested = w.requested.clone();
        std::thread::Builder::new()
            .name("pagesift-ksm-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if requested.swap(true, Ordering::SeqCst) || grace.is_zero() {
                        restore_all_and_die(sig);
                    }
                    std::thread::spawn(move || {
                        std::thread::sleep(grace);
                        restore_all_and_die(sig);
                    });
                }
            })
            .map_err(|e| KsmError::io("starting the signal thread", e))?;
        Ok(w)
    }

    /// Whether SIGTERM or SIGINT has arrived.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }
}

/// Restores every live guard, refuses their further writes, and dies of
/// `sig`.
fn restore_all_and_die(sig: i32) -> ! {
    let live: Vec<Arc<Mutex<Owner>>> = LIVE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    // Hold every owner until the end, so no thread writes after its
    // restore.
    let mut held = Vec::new();
    for o in &live {
        let mut g = lock_owner(o);
        if let Some(r) = g.release()
            && !r.is_complete()
        {
            eprintln!("pagesift: {r}");
        }
        g.closed = true;
        held.push(g);
    }
    let _ = signal_hook::low_level::emulate_default_handler(sig);
    std::process::exit(128 + sig);
}

// ---------------------------------------------------------------------------
// ksmd

/// The ksmd kernel thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ksmd {
    pid: u32,
}

/// ksmd's CPU time from both sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KsmdCpu {
    /// `/proc/<ksmd>/schedstat` field 1 (exact ns), when the kernel has it.
    pub schedstat_ns: Option<u64>,
    /// (utime + stime) of `/proc/<ksmd>/stat`, converted from USER_HZ
    /// ticks to ns.
    pub ticks_ns: u64,
}

impl KsmdCpu {
    /// The best figure: schedstat, else ticks.
    pub fn ns(&self) -> u64 {
        self.schedstat_ns.unwrap_or(self.ticks_ns)
    }
}

/// PF_KTHREAD in `/proc/PID/stat`'s flags.
const PF_KTHREAD: u32 = 0x0020_0000;

impl Ksmd {
    /// Finds the kernel thread named `ksmd` (a user process called ksmd is
    /// not it).
    pub fn find() -> Result<Ksmd, KsmError> {
        let all = procfs::process::all_processes()
            .map_err(|e| KsmError::io("listing /proc", io::Error::other(e)))?;
        for p in all.flatten() {
            let Ok(stat) = p.stat() else { continue };
            if stat.comm == "ksmd" && stat.flags & PF_KTHREAD != 0 {
                return Ok(Ksmd {
                    pid: stat.pid as u32,
                });
            }
        }
        Err(KsmError::NoKsmd)
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Its CPU time from both sources.
    pub fn cpu(&self) -> Result<KsmdCpu, LinuxError> {
        let p = procfs::process::Process::new(self.pid as i32)
            .map_err(|e| LinuxError::io("opening ksmd's /proc entry", io::Error::other(e)))?;
        let stat = p
            .stat()
            .map_err(|e| LinuxError::io("reading ksmd's stat", io::Error::other(e)))?;
        let tick_ns = 1_000_000_000 / procfs::ticks_per_second().max(1);
        Ok(KsmdCpu {
            schedstat_ns: p.schedstat().ok().map(|s| s.sum_exec_runtime),
            ticks_ns: (stat.utime + stat.stime) * tick_ns,
        })
    }

    /// Its CPU time, ns (schedstat, else ticks).
    pub fn cpu_ns(&self) -> Result<u64, LinuxError> {
        self.cpu().map(|c| c.ns())
    }
}

// ---------------------------------------------------------------------------
// Per process and vmstat

/// `/proc/PID/ksm_stat` (mainline-ksm.md §2.1); fields newer than 6.1 are
/// `None` on kernels that lack them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessKsmStat {
    /// rmap_items allocated for the mm: pages ksmd has looked at.
    pub rmap_items: u64,
    /// Pages merged with the kernel zero page (6.6).
    pub zero_pages: Option<u64>,
    /// Pages mapped to KSM pages, zero pages excluded (the same number as
    /// `/proc/PID/ksm_merging_pages`).
    pub merging_pages: Option<u64>,
    /// Bytes saved minus rmap_item metadata; can be negative (6.4).
    pub process_profit: Option<i64>,
    /// `MMF_VM_MERGE_ANY`: PR_SET_MEMORY_MERGE is on.
    pub merge_any: Option<bool>,
    /// Whether any VMA is VM_MERGEABLE.
    pub mergeable: Option<bool>,
}

fn read_proc(pid: u32, file: &str) -> Result<String, LinuxError> {
    let path = format!("/proc/{pid}/{file}");
    std::fs::read_to_string(&path).map_err(|e| {
        if !Path::new(&format!("/proc/{pid}")).exists() {
            LinuxError::NoSuchProcess(pid)
        } else if e.raw_os_error() == Some(libc_errno::ESRCH) {
            LinuxError::Gone(pid)
        } else {
            LinuxError::io(format!("reading {path} (mode 0400: root or the owner)"), e)
        }
    })
}

impl ProcessKsmStat {
    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<ProcessKsmStat, LinuxError> {
        let mut s = ProcessKsmStat::default();
        let mut saw_rmap = false;
        for line in text.lines() {
            // `key value` for counters, `key: yes|no` for flags.
            let mut it = line.split_whitespace();
            let (Some(key), Some(val)) = (it.next(), it.next()) else {
                continue;
            };
            let key = key.trim_end_matches(':');
            let bad = || LinuxError::Parse(format!("ksm_stat line {line:?}"));
            let yes = || match val {
                "yes" => Ok(true),
                "no" => Ok(false),
                _ => Err(bad()),
            };
            match key {
                "ksm_rmap_items" => {
                    s.rmap_items = val.parse().map_err(|_| bad())?;
                    saw_rmap = true;
                }
                "ksm_zero_pages" => s.zero_pages = Some(val.parse().map_err(|_| bad())?),
                "ksm_merging_pages" => s.merging_pages = Some(val.parse().map_err(|_| bad())?),
                "ksm_process_profit" => s.process_profit = Some(val.parse().map_err(|_| bad())?),
                "ksm_merge_any" => s.merge_any = Some(yes()?),
                "ksm_mergeable" => s.mergeable = Some(yes()?),
                _ => {}
            }
        }
        if !saw_rmap {
            return Err(LinuxError::Parse(format!(
                "ksm_stat without ksm_rmap_items: {text:?}"
            )));
        }
        Ok(s)
    }

    /// Reads `/proc/PID/ksm_stat`.
    pub fn of(pid: u32) -> Result<ProcessKsmStat, LinuxError> {
        ProcessKsmStat::parse(&read_proc(pid, "ksm_stat")?)
    }
}

/// `/proc/PID/ksm_merging_pages`: pages of the process mapped to KSM pages.
pub fn merging_pages(pid: u32) -> Result<u64, LinuxError> {
    let t = read_proc(pid, "ksm_merging_pages")?;
    t.trim()
        .parse()
        .map_err(|_| LinuxError::Parse(format!("ksm_merging_pages {t:?}")))
}

/// KSM's lines of `/proc/vmstat`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KsmVmstat {
    /// Writes to KSM pages that made a copy (COW breaks).
    pub cow_ksm: Option<u64>,
    /// KSM pages copied on swap-in.
    pub ksm_swpin_copy: Option<u64>,
    /// Every vmstat line whose name contains `ksm`, these two included.
    pub all: BTreeMap<String, u64>,
}

impl KsmVmstat {
    /// Parses `/proc/vmstat` text.
    pub fn parse(text: &str) -> KsmVmstat {
        let all: BTreeMap<String, u64> = text
            .lines()
            .filter_map(|l| l.split_once(' '))
            .filter(|(k, _)| k.contains("ksm"))
            .filter_map(|(k, v)| Some((k.to_string(), v.trim().parse().ok()?)))
            .collect();
        KsmVmstat {
            cow_ksm: all.get("cow_ksm").copied(),
            ksm_swpin_copy: all.get("ksm_swpin_copy").copied(),
            all,
        }
    }

    /// Reads `/proc/vmstat`.
    pub fn read() -> Result<KsmVmstat, LinuxError> {
        std::fs::read_to_string("/proc/vmstat")
            .map(|t| KsmVmstat::parse(&t))
            .map_err(|e| LinuxError::io("reading /proc/vmstat", e))
    }
}

// ---------------------------------------------------------------------------
// PR_SET_MEMORY_MERGE

/// Has every process `cmd` spawns start with `PR_SET_MEMORY_MERGE` on: all
/// its anonymous private memory is mergeable, and its children inherit it
/// (mainline-ksm.md §2.2). The child fails to spawn if the prctl fails.
pub fn with_memory_merge(cmd: &mut Command) -> &mut Command {
    crate::sys::prctl::merge_any_before_exec(cmd)
}

/// Turns `PR_SET_MEMORY_MERGE` on or off for the calling process (off
/// unmerges its merged pages). For `pagesift exec`, which sets it and then
/// execs.
pub fn set_memory_merge(enable: bool) -> io::Result<()> {
    crate::sys::prctl::set_memory_merge(enable)
}

/// `PR_GET_MEMORY_MERGE` of the calling process.
pub fn memory_merge() -> io::Result<bool> {
    crate::sys::prctl::get_memory_merge()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake KSM directory with the files of this machine's 6.18 kernel
    /// (ksm-baseline.md §3): knobs 0644, counters 0444.
    fn fake_ksm(dir: &Path) {
        let knobs = [
            ("run", "0"),
            ("pages_to_scan", "100"),
            ("sleep_millisecs", "20"),
            ("merge_across_nodes", "1"),
            ("use_zero_pages", "0"),
            ("max_page_sharing", "256"),
            ("stable_node_chains_prune_millisecs", "2000"),
            ("smart_scan", "1"),
            ("advisor_mode", "[none] scan-time"),
            ("advisor_max_cpu", "70"),
            ("advisor_min_pages_to_scan", "500"),
            ("advisor_max_pages_to_scan", "30000"),
            ("advisor_target_scan_time", "200"),
            // A knob of some newer kernel.
            ("future_knob", "7"),
        ];
        let counters = [
            ("pages_shared", "3"),
            ("pages_sharing", "765"),
            ("general_profit", "-4096"),
            ("full_scans", "2"),
        ];
        std::fs::create_dir_all(dir).unwrap();
        for (n, v) in knobs {
            std::fs::write(dir.join(n), format!("{v}\n")).unwrap();
            std::fs::set_permissions(dir.join(n), std::fs::Permissions::from_mode(0o644)).unwrap();
        }
        for (n, v) in counters {
            std::fs::write(dir.join(n), format!("{v}\n")).unwrap();
            std::fs::set_permissions(dir.join(n), std::fs::Permissions::from_mode(0o444)).unwrap();
        }
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "pagesift-ksm-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn opts(d: &Path) -> GuardOptions {
        GuardOptions {
            sysfs: d.join("ksm"),
            lock_path: d.join("lock"),
            wait: Some(Duration::from_secs(5)),
        }
    }

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

    #[test]
    fn reads_knobs_counters_and_unknown_writable_files() {
        let d = tmpdir("read");
        fake_ksm(&d.join("ksm"));
        let ksm = Ksm::at(d.join("ksm")).unwrap();
        assert_eq!(ksm.run().unwrap(), Run::Stop);
        assert_eq!(ksm.pages_to_scan().unwrap(), 100);
        assert_eq!(ksm.advisor_mode().unwrap(), Some(AdvisorMode::None));
        let c = ksm.counters().unwrap();
        assert_eq!(c.pages_shared, Some(3));
        assert_eq!(c.general_profit, Some(-4096));
        assert_eq!(c.ksm_zero_pages, None);
        assert_eq!(c.pages_saved(), 765);
        let snap = ksm.snapshot().unwrap();
        assert_eq!(snap.len(), 14);
        assert_eq!(snap.get_name("future_knob"), Some("7"));
        assert_eq!(snap.get_name("pages_shared"), None);
        let s = snap.settings();
        assert_eq!(s.advisor_mode, Some(AdvisorMode::None));
        assert_eq!(s.merge_across_nodes, Some(true));
        assert_eq!(s.max_page_sharing, Some(256));
        // Unknown knobs go before the advisor mode, run is last.
        let order = snap.restore_order();
        assert_eq!(order.last(), Some(&"run"));
        let pos = |n| order.iter().position(|x| *x == n).unwrap();
        assert!(pos("future_knob") < pos("advisor_mode"));
        // A kernel without smart_scan: absent, not an error.
        std::fs::remove_file(d.join("ksm/smart_scan")).unwrap();
        assert!(!ksm.has(Knob::SmartScan));
        assert_eq!(ksm.flag(Knob::SmartScan).unwrap(), None);
        assert_eq!(ksm.snapshot().unwrap().get(Knob::SmartScan), None);
        assert!(matches!(Ksm::at(d.join("nope")), Err(KsmError::NoKsm(_))));
    }

    #[test]
    fn snapshot_text_round_trips_and_rejects_paths() {
        let d = tmpdir("text");
        fake_ksm(&d.join("ksm"));
        let snap = Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap();
        let back = KsmSnapshot::from_text(&format!("# header\n{}", snap.to_text())).unwrap();
        assert_eq!(back, snap);
        assert!(KsmSnapshot::from_text("../run 1\n").is_err());
        assert!(KsmSnapshot::from_text("run\n").is_err());
    }

    #[test]
    fn guard_restores_every_knob_on_drop_and_on_panic() {
        let d = tmpdir("guard");
        fake_ksm(&d.join("ksm"));
        let before = Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap();
        {
            let g = KsmGuard::acquire_with(opts(&d)).unwrap();
            g.set_run(Run::Run).unwrap();
            g.set_pages_to_scan(5000).unwrap();
            g.set_name("future_knob", "9").unwrap();
            g.set_flag(Knob::UseZeroPages, true).unwrap();
            assert_eq!(g.ksm().pages_to_scan().unwrap(), 5000);
            // The lock file holds the snapshot while owned.
            let text = std::fs::read_to_string(d.join("lock")).unwrap();
            assert_eq!(holder_pid(&text), Some(std::process::id().to_string()));
            assert_eq!(KsmSnapshot::from_text(&text).unwrap(), before);
        }
        assert_eq!(Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap(), before);
        assert_eq!(std::fs::read_to_string(d.join("lock")).unwrap(), "");

        let o = opts(&d);
        let r = std::panic::catch_unwind(move || {
            let g = KsmGuard::acquire_with(o).unwrap();
            g.set_sleep_millisecs(1).unwrap();
            g.set_advisor_mode(AdvisorMode::ScanTime).unwrap();
            panic!("inside the guarded scope");
        });
        assert!(r.is_err());
        assert_eq!(Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap(), before);
    }

    #[test]
    fn a_dead_owners_settings_are_put_back_at_acquire() {
        let d = tmpdir("stale");
        fake_ksm(&d.join("ksm"));
        let ksm = Ksm::at(d.join("ksm")).unwrap();
        let before = ksm.snapshot().unwrap();
        // A previous owner recorded its snapshot, changed two knobs and was
        // SIGKILLed.
        std::fs::write(
            d.join("lock"),
            format!("# pagesift KSM lock: owner pid 1\n{}", before.to_text()),
        )
        .unwrap();
        std::fs::write(d.join("ksm/run"), "1\n").unwrap();
        std::fs::write(d.join("ksm/pages_to_scan"), "9999\n").unwrap();
        let g = KsmGuard::acquire_with(opts(&d)).unwrap();
        let rec = g.recovered().expect("recovery happened");
        assert!(rec.is_complete(), "{rec}");
        assert!(
            rec.written
                .contains(&("pages_to_scan".into(), "100".into()))
        );
        assert_eq!(ksm.snapshot().unwrap(), before);
        assert_eq!(g.snapshot(), &before);
        let r = g.release();
        assert!(r.is_complete());
    }

    #[test]
    fn a_lock_file_another_user_could_write_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let d = tmpdir("untrusted");
        fake_ksm(&d.join("ksm"));
        let ksm = Ksm::at(d.join("ksm")).unwrap();
        // "Owed" values someone planted: run=1 and a huge pages_to_scan.
        let planted = "# pagesift KSM lock: owner pid 1\nrun 1\npages_to_scan 99999\n";
        let target = d.join("planted");
        std::fs::write(&target, planted).unwrap();
        let expect_refused = |what: &str, reason: &str| {
            let e = KsmGuard::acquire_with(opts(&d)).expect_err(what);
            let msg = e.to_string();
            assert!(matches!(e, KsmError::UntrustedLock { .. }), "{what}: {e}");
            assert!(msg.contains(&d.join("lock").display().to_string()), "{msg}");
            assert!(msg.contains(reason), "{what}: {msg}");
            // Nothing planted reached sysfs.
            assert_eq!(ksm.run().unwrap(), Run::Stop, "{what}");
            assert_eq!(ksm.pages_to_scan().unwrap(), 100, "{what}");
        };
        // A symbolic link: not followed (O_NOFOLLOW).
        std::os::unix::fs::symlink(&target, d.join("lock")).unwrap();
        expect_refused("a symlinked lock", "symbolic link");
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            planted,
            "written through the link"
        );
        std::fs::remove_file(d.join("lock")).unwrap();
        // Writable by others.
        std::fs::write(d.join("lock"), planted).unwrap();
        std::fs::set_permissions(d.join("lock"), std::fs::Permissions::from_mode(0o666)).unwrap();
        expect_refused("a world-writable lock", "group or others");
        if rustix::process::geteuid().is_root() {
            // Owned by another user.
            std::fs::set_permissions(d.join("lock"), std::fs::Permissions::from_mode(0o600))
                .unwrap();
            std::os::unix::fs::chown(d.join("lock"), Some(65534), None).unwrap();
            expect_refused("another user's lock", "uid 65534");
        }
        // Not a file at all.
        std::fs::remove_file(d.join("lock")).unwrap();
        std::fs::create_dir(d.join("lock")).unwrap();
        let e = KsmGuard::acquire_with(opts(&d)).expect_err("a directory");
        assert!(!e.to_string().is_empty());
        assert_eq!(ksm.run().unwrap(), Run::Stop);
        std::fs::remove_dir(d.join("lock")).unwrap();
        // A missing lock is created 0600, and a trusted one is used.
        let g = KsmGuard::acquire_with(opts(&d)).unwrap();
        let mode = std::fs::metadata(d.join("lock"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(g.release().is_complete());
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn the_lock_excludes_a_second_owner_until_released() {
        let d = tmpdir("excl");
        fake_ksm(&d.join("ksm"));
        let g = KsmGuard::acquire_with(opts(&d)).unwrap();
        let o = GuardOptions {
            wait: Some(Duration::from_millis(100)),
            ..opts(&d)
        };
        // flock is per open file: a second open in the same process is
        // excluded too, so threads of one test binary take turns.
        let o2 = o.clone();
        let e = std::thread::spawn(move || KsmGuard::acquire_with(o2).map(|_| ()))
            .join()
            .unwrap()
            .unwrap_err();
        match e {
            KsmError::LockTimeout { holder, .. } => {
                assert_eq!(holder, std::process::id().to_string())
            }
            other => panic!("{other}"),
        }
        g.set_run(Run::Run).unwrap();
        drop(g);
        let g2 = KsmGuard::acquire_with(o).unwrap();
        assert_eq!(g2.ksm().run().unwrap(), Run::Stop);
    }

    #[test]
    fn writes_after_release_are_refused() {
        let d = tmpdir("closed");
        fake_ksm(&d.join("ksm"));
        let g = KsmGuard::acquire_with(opts(&d)).unwrap();
        lock_owner(&g.owner).release();
        assert!(matches!(g.set_run(Run::Run), Err(KsmError::Closed)));
    }

    #[test]
    fn ksm_stat_parses_both_syntaxes_and_old_kernels() {
        let s = ProcessKsmStat::parse(
            "ksm_rmap_items 65540\nksm_zero_pages 0\nksm_merging_pages 65536\n\
             ksm_process_profit 264241152\nksm_merge_any: yes\nksm_mergeable: yes\n",
        )
        .unwrap();
        assert_eq!(s.rmap_items, 65540);
        assert_eq!(s.merging_pages, Some(65536));
        assert_eq!(s.process_profit, Some(264241152));
        assert_eq!(s.merge_any, Some(true));
        assert_eq!(s.mergeable, Some(true));
        // 6.1: only rmap items.
        let old = ProcessKsmStat::parse("ksm_rmap_items 3\n").unwrap();
        assert_eq!(old.merging_pages, None);
        assert!(ProcessKsmStat::parse("nothing 1\n").is_err());
        assert!(ProcessKsmStat::parse("ksm_rmap_items x\n").is_err());
        assert!(ProcessKsmStat::parse("ksm_rmap_items 1\nksm_merge_any: maybe\n").is_err());
    }

    #[test]
    fn vmstat_keeps_the_ksm_lines() {
        let v = KsmVmstat::parse("nr_free_pages 5\nksm_swpin_copy 1\ncow_ksm 42\nthp_x 3\n");
        assert_eq!(v.cow_ksm, Some(42));
        assert_eq!(v.ksm_swpin_copy, Some(1));
        assert_eq!(v.all.len(), 2);
    }

    #[test]
    fn own_ksm_stat_and_vmstat_are_readable() {
        // Our own ksm_stat is readable without privileges (we own it).
        let s = ProcessKsmStat::of(std::process::id()).unwrap();
        assert!(s.merging_pages.is_some());
        assert!(matches!(
            ProcessKsmStat::of(999_999_999),
            Err(LinuxError::NoSuchProcess(999_999_999))
        ));
        assert!(KsmVmstat::read().unwrap().cow_ksm.is_some());
        assert!(!memory_merge().unwrap());
    }
}
