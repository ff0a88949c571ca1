//! Small facts about processes and the host that the daemon needs besides
//! their memory: executables, per-process KSM state, VMA counts, global
//! KSM counters, and the processes that exist.
//!
//! Everything here is a read of one small `/proc` file, parsed by hand
//! because each is a line or two; none touches a target's memory. Reads of
//! a process that has exited give [`LinuxError::Gone`] (the caller saw the
//! pid before), so a vanishing process is never an error.

use crate::error::LinuxError;
use std::collections::BTreeSet;
use std::path::PathBuf;

/// Per-process KSM state from `/proc/PID/ksm_stat` (mainline-ksm.md §2.1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KsmStat {
    /// `ksm_rmap_items`: pages of this process ksmd keeps metadata for.
    pub rmap_items: u64,
    /// `ksm_zero_pages`: pages merged with the zero page (use_zero_pages).
    pub zero_pages: u64,
    /// `ksm_merging_pages`: pages mapped to KSM pages.
    pub merging_pages: u64,
    /// `ksm_merge_any: yes`: the process set PR_SET_MEMORY_MERGE (itself,
    /// or inherited across fork/exec): every VMA of it is mergeable.
    pub merge_any: bool,
    /// `ksm_mergeable: yes`: some VMA has VM_MERGEABLE.
    pub mergeable: bool,
}

impl KsmStat {
    /// Parses the text of `ksm_stat` (counters as `key value`, flags as
    /// `key: yes|no`; unknown lines are ignored, missing ones stay 0/no).
    pub fn parse(text: &str) -> KsmStat {
        let mut s = KsmStat::default();
        for line in text.lines() {
            let mut it = line.split_whitespace();
            let (Some(k), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            let n = || v.parse::<u64>().unwrap_or(0);
            match k.trim_end_matches(':') {
                "ksm_rmap_items" => s.rmap_items = n(),
                "ksm_zero_pages" => s.zero_pages = n(),
                "ksm_merging_pages" => s.merging_pages = n(),
                "ksm_merge_any" => s.merge_any = v == "yes",
                "ksm_mergeable" => s.mergeable = v == "yes",
                _ => {}
            }
        }
        s
    }
}

fn read_proc(pid: u32, file: &str, what: &'static str) -> Result<String, LinuxError> {
    std::fs::read_to_string(format!("/proc/{pid}/{file}")).map_err(|e| {
        LinuxError::from_process_op(
            pid,
            e,
            what,
            crate::Capability::SysPtrace,
            crate::error::WHY_PTRACE,
        )
    })
}

/// `/proc/PID/ksm_stat` (mode 0400: needs root or the same uid).
pub fn ksm_stat(pid: u32) -> Result<KsmStat, LinuxError> {
    read_proc(pid, "ksm_stat", "reading /proc/PID/ksm_stat").map(|t| KsmStat::parse(&t))
}

/// The executable of a process (`/proc/PID/exe`), `None` when it has none
/// (kernel threads) or cannot be read.
pub fn exe(pid: u32) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{pid}/exe")).ok()
}

/// Number of VMAs of a process (lines of `/proc/PID/maps`; reading maps
/// does not walk page tables, unlike smaps).
pub fn vma_count(pid: u32) -> Result<u64, LinuxError> {
    read_proc(pid, "maps", "reading /proc/PID/maps").map(|t| t.lines().count() as u64)
}

/// `vm.max_map_count`: the most VMAs one process may have.
pub fn max_map_count() -> Result<u64, LinuxError> {
    let t = std::fs::read_to_string("/proc/sys/vm/max_map_count")
        .map_err(|e| LinuxError::io("reading /proc/sys/vm/max_map_count", e))?;
    t.trim()
        .parse()
        .map_err(|_| LinuxError::Parse(format!("/proc/sys/vm/max_map_count: {t:?}")))
}

/// A counter of `/proc/vmstat` (e.g. `cow_ksm`, copies made by writes to
/// KSM pages), `None` if this kernel does not have it.
pub fn vmstat(key: &str) -> Result<Option<u64>, LinuxError> {
    let t = std::fs::read_to_string("/proc/vmstat")
        .map_err(|e| LinuxError::io("reading /proc/vmstat", e))?;
    Ok(vmstat_value(&t, key))
}

fn vmstat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

/// The pids under `/proc` (processes, not threads): one directory read, so
/// a caller can tell cheaply whether processes came or went.
pub fn pids() -> Result<BTreeSet<u32>, LinuxError> {
    let dir = std::fs::read_dir("/proc").map_err(|e| LinuxError::io("listing /proc", e))?;
    Ok(dir
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect())
}

/// CPU time this process has used, all threads, in ns.
pub fn process_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ProcessCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// CPU time the calling thread has used, in ns (UKSM measures its scanner
/// the same way, notes uksm-implementation.md §10).
pub fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ksm_stat_parses_both_syntaxes() {
        let s = KsmStat::parse(
            "ksm_rmap_items 12\nksm_zero_pages 3\nksm_merging_pages 7\nksm_process_profit 0\n\
             ksm_merge_any: yes\nksm_mergeable: no\n",
        );
        assert_eq!(
            s,
            KsmStat {
                rmap_items: 12,
                zero_pages: 3,
                merging_pages: 7,
                merge_any: true,
                mergeable: false
            }
        );
        assert_eq!(KsmStat::parse("garbage\n"), KsmStat::default());
    }

    #[test]
    fn own_process_facts_are_readable() {
        let me = crate::own_pid();
        assert!(vma_count(me).unwrap() > 5);
        assert!(exe(me).is_some());
        assert!(pids().unwrap().contains(&me));
        assert!(max_map_count().unwrap() >= 1024);
        let a = thread_cpu_ns();
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        assert!(thread_cpu_ns() > a);
        assert!(process_cpu_ns() >= thread_cpu_ns());
    }

    #[test]
    fn a_missing_pid_is_an_error_and_vmstat_has_cow_ksm() {
        assert!(vma_count(u32::MAX - 1).is_err());
        assert_eq!(vmstat_value("nr_free 5\ncow_ksm 42\n", "cow_ksm"), Some(42));
        assert_eq!(vmstat_value("nr_free 5\n", "cow_ksm"), None);
        // This kernel has CONFIG_KSM, so the counter exists.
        assert!(vmstat("cow_ksm").unwrap().is_some());
    }
}
