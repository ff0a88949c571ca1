//! Helpers shared by the cli crate's live tests: run this crate's own
//! `pagesift` binary (`env!("CARGO_BIN_EXE_pagesift")`, which only this
//! crate's tests can name), start it as a daemon guard
//! (`pagesift_testkit::Daemon`), and read what the kernel says about a
//! target's VMAs and KSM pages. The rest (serialization, workloads, temp
//! directories) comes from pagesift-testkit.

#![allow(dead_code)]

use pagesift_testkit::Daemon;
use std::path::Path;
use std::process::{Command, Output};

pub fn pagesift() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pagesift"))
}

pub fn run(args: &[&str]) -> Output {
    pagesift().args(args).output().expect("run pagesift")
}

/// `pagesift run` on this crate's own binary, as a guard
/// (`pagesift_testkit::Daemon`: stopped, and KSM checked, on drop).
pub fn start_daemon(dir: &Path, args: &[&str], metrics: bool) -> Daemon {
    Daemon::start(
        Path::new(env!("CARGO_BIN_EXE_pagesift")),
        dir,
        args,
        metrics,
    )
}

/// One VMA of a process, as /proc/PID/smaps shows it.
pub struct Vma {
    pub start: u64,
    pub end: u64,
    /// Its KSM line, in kB.
    pub ksm_kb: u64,
    pub flags: Vec<String>,
}

impl Vma {
    pub fn mergeable(&self) -> bool {
        self.flags.iter().any(|f| f == "mg")
    }
}

/// The VMAs of `pid`, from /proc/PID/smaps (empty if it is gone).
pub fn vmas(pid: u32) -> Vec<Vma> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let mut out: Vec<Vma> = Vec::new();
    for line in text.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            out.push(Vma {
                start: a,
                end: b,
                ksm_kb: 0,
                flags: Vec::new(),
            });
        } else if let Some(v) = out.last_mut() {
            if let Some(k) = line.strip_prefix("KSM:") {
                v.ksm_kb = k.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
            } else if let Some(f) = line.strip_prefix("VmFlags:") {
                v.flags = f.split_whitespace().map(String::from).collect();
            }
        }
    }
    out
}

/// The VMAs of `pid` that overlap `[start, start + len)`.
pub fn vmas_overlapping(pid: u32, start: u64, len: u64) -> Vec<Vma> {
    vmas(pid)
        .into_iter()
        .filter(|v| v.start < start + len && start < v.end)
        .collect()
}

/// The VmFlags of the VMA of `pid` that contains `addr`.
pub fn vm_flags(pid: u32, addr: u64) -> Vec<String> {
    vmas_overlapping(pid, addr, 1)
        .pop()
        .unwrap_or_else(|| panic!("no VMA of {pid} contains {addr:#x}"))
        .flags
}

/// The VMAs of `pid` that overlap `[start, start + len)`, one line each:
/// range, pages, KSM kB and VmFlags (for failure messages).
pub fn vmas_in(pid: u32, start: u64, len: u64) -> String {
    vmas_overlapping(pid, start, len)
        .iter()
        .map(|v| {
            format!(
                "{:#x}-{:#x} {} pages, KSM {} kB, flags {}\n",
                v.start,
                v.end,
                (v.end - v.start) / 4096,
                v.ksm_kb,
                v.flags.join(" ")
            )
        })
        .collect()
}

/// Pages of `[start, start + len)` in mergeable VMAs of `pid`.
pub fn mergeable_pages(pid: u32, start: u64, len: u64) -> u64 {
    vmas_overlapping(pid, start, len)
        .iter()
        .filter(|v| v.mergeable())
        .map(|v| (v.end.min(start + len) - v.start.max(start)) / 4096)
        .sum()
}

/// Whether any VMA of `pid` overlapping `[start, start + len)` is mergeable.
pub fn any_mergeable(pid: u32, start: u64, len: u64) -> bool {
    mergeable_pages(pid, start, len) > 0
}

/// Pages of `pid` mapped to KSM pages now: the `KSM:` line of
/// `/proc/PID/smaps_rollup`, counted by a page-table walk. (Its
/// `ksm_merging_pages` is not used: ksmd updates it lazily, so it stays
/// stale after MADV_UNMERGEABLE once ksmd is stopped.)
pub fn merging_pages(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("KSM:"))
        .expect("smaps_rollup has a KSM line on this kernel")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 4
}

pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}
