//! Reading (and, for the guard only, writing) `/sys/kernel/mm/ksm`.
//!
//! [`Ksm`] reads knobs and counters as typed values, `None` where the
//! kernel lacks a file, and finds every writable file by its mode bits
//! ([`Ksm::writable_names`]), known or not, for a snapshot. Writing is
//! private to this module's parent: only a [`KsmGuard`](super::KsmGuard)
//! writes, so every change is recorded and restored. A refused write is
//! turned into the reason: EBUSY (pages are merged; `pages_shared` is read
//! right after), EINVAL (with the advisor named when it owns
//! `pages_to_scan`), ENOENT (a knob this kernel lacks).

use super::KSM_SYSFS;
use super::error::KsmError;
use super::knobs::{AdvisorMode, Knob, Run, normalise};
use super::snapshot::KsmSnapshot;
use crate::error::libc_errno;
use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// `EBUSY`: a knob that needs nothing merged, written while pages are.
const EBUSY: i32 = 16;

/// KSM's sysfs directory. Reads only; writes go through a
/// [`KsmGuard`](super::KsmGuard).
#[derive(Clone, Debug)]
pub struct Ksm {
    dir: PathBuf,
}

/// KSM's counters; `None` when the kernel lacks one.
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
    /// Pages saved: `pages_sharing + ksm_zero_pages` (merges with the zero
    /// page are not counted in `pages_sharing`).
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

    /// File `name` kept open, to read a counter every second with one
    /// syscall ([`crate::proc::KeptOpen`]); parse its text with
    /// [`Ksm::parse_count`].
    pub fn keep_open(&self, name: &str) -> Result<crate::proc::KeptOpen, KsmError> {
        let path = self.dir.join(name);
        crate::proc::KeptOpen::open(path.display().to_string())
            .map_err(|e| KsmError::io(format!("opening {}", path.display()), e))
    }

    /// A kept-open counter's value now.
    pub fn parse_count(file: &crate::proc::KeptOpen) -> Result<u64, KsmError> {
        let text =
            (file.read_text()).map_err(|e| KsmError::io(format!("reading {}", file.path()), e))?;
        text.trim().parse().map_err(|_| KsmError::Parse {
            what: file.path().to_string(),
            text,
        })
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
    pub(super) fn write_name(&self, name: &str, value: &str) -> Result<(), KsmError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ksm::fake::{fake_ksm, tmpdir};

    #[test]
    fn reads_knobs_counters_and_unknown_writable_files() {
        let tmp = tmpdir("read");
        let d = tmp.path();
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
}
