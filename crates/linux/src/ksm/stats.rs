//! KSM's figures per process (`/proc/PID/ksm_stat`,
//! `/proc/PID/ksm_merging_pages`) and system-wide in `/proc/vmstat`.
//!
//! `ksm_stat` grew fields over kernel versions (6.1 has only
//! `ksm_rmap_items`); each later field is `None` where absent, and both
//! line syntaxes (`key value` for counters, `key: yes|no` for flags) are
//! parsed. Both per-process files are mode 0400: root or the process's
//! owner reads them ([`crate::proc`] names the mode when refused).

use crate::LinuxError;
use crate::proc::{self, Access};
use std::collections::BTreeMap;

/// `/proc/PID/ksm_stat`; fields newer than 6.1 are
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
        ProcessKsmStat::parse(&proc::read(pid, "ksm_stat", Access::OwnerOnly)?)
    }
}

/// `/proc/PID/ksm_merging_pages`: pages of the process mapped to KSM pages.
pub fn merging_pages(pid: u32) -> Result<u64, LinuxError> {
    let t = proc::read(pid, "ksm_merging_pages", Access::OwnerOnly)?;
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

    /// Reads `/proc/vmstat` from a descriptor kept open
    /// ([`crate::proc::KeptOpen`], opened on `/proc/vmstat`).
    pub fn read_from(file: &crate::proc::KeptOpen) -> Result<KsmVmstat, LinuxError> {
        (file.read_text())
            .map(|t| KsmVmstat::parse(&t))
            .map_err(|e| LinuxError::io("reading /proc/vmstat", e))
    }

    /// Reads `/proc/vmstat`.
    pub fn read() -> Result<KsmVmstat, LinuxError> {
        std::fs::read_to_string("/proc/vmstat")
            .map(|t| KsmVmstat::parse(&t))
            .map_err(|e| LinuxError::io("reading /proc/vmstat", e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let kept = crate::proc::KeptOpen::open("/proc/vmstat").unwrap();
        assert!(KsmVmstat::read_from(&kept).unwrap().cow_ksm.is_some());
    }
}
