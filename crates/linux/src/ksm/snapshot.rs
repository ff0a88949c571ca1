//! A snapshot of KSM's writable knobs: their text at one moment, which can
//! be written back.
//!
//! Kept as (file name, text) pairs, so knobs this code does not know are
//! restored too. The same text is the lock file's content (`name value`
//! lines, [`KsmSnapshot::to_text`]); since the next owner writes what it
//! reads there into sysfs, [`KsmSnapshot::from_text`] refuses names that
//! could leave the directory (`/`, a leading `.`).

use super::error::KsmError;
use super::knobs::{AdvisorMode, Knob, Run};
use std::collections::BTreeMap;

/// The values of KSM's writable knobs at one moment, as text that can be
/// written back. Knobs the kernel lacks are absent.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KsmSnapshot {
    pub(super) values: BTreeMap<String, String>,
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
    pub(super) fn overlaid(&self, other: &KsmSnapshot) -> KsmSnapshot {
        let mut values = self.values.clone();
        values.extend(other.values.iter().map(|(k, v)| (k.clone(), v.clone())));
        KsmSnapshot { values }
    }

    /// The order a restore writes this snapshot's knobs in: known knobs in
    /// [`Knob::ALL`]'s order with unknown ones just before `advisor_mode`.
    pub(super) fn restore_order(&self) -> Vec<&str> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ksm::Ksm;
    use crate::ksm::fake::{fake_ksm, tmpdir};

    #[test]
    fn snapshot_text_round_trips_and_rejects_paths() {
        let tmp = tmpdir("text");
        let d = tmp.path();
        fake_ksm(&d.join("ksm"));
        let snap = Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap();
        let back = KsmSnapshot::from_text(&format!("# header\n{}", snap.to_text())).unwrap();
        assert_eq!(back, snap);
        assert!(KsmSnapshot::from_text("../run 1\n").is_err());
        assert!(KsmSnapshot::from_text("run\n").is_err());
    }
}
