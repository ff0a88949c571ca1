//! What a scan reports, and how it is shown.
//!
//! One [`Report`] type serves both scan modes (SCAN.md): the exact scan
//! fills every [`Estimate`] with `low == high == value`; the sampled scan
//! gives 95 % intervals. The report is per process and per region, both
//! sorted by saving (largest first), with totals for the system.
//!
//! ## What the numbers mean (both modes)
//!
//! - `size_pages`: pages of the merge-eligible VMAs (KSM's
//!   `ksm_compatible()` rule in `mm/ksm.c`).
//! - `present`: pages with a frame that KSM could consider: private
//!   anonymous pages, COWed pages of private file mappings, zero-page
//!   mappings and KSM pages. Page cache of private file mappings is not
//!   counted. A frame shared after fork is present in every process that
//!   maps it.
//! - `zero`, `merged`: pages mapped to the shared zero page, and pages
//!   already merged by KSM. Neither is a duplicate.
//! - `dup_in_region`, `dup_in_process`, `dup_across`: *frames* whose
//!   content another frame also holds, counted once system-wide (a frame
//!   mapped by several processes counts in the first one scanned), in the
//!   nearest category where a twin lives (same region, else same process,
//!   else another process).
//! - `saving`: frames merging every duplicate would free. Per content
//!   group one frame survives (exact mode: the first frame in scan order,
//!   i.e. in the lowest pid at the lowest address); every other frame
//!   counts one page of saving where it lives. Totals: saving = frames −
//!   distinct contents.
//!
//! Process counts are the sums of their regions' counts; totals are the
//! sums over processes.
//!
//! ## Formats
//!
//! [`Report::to_table`] is the human table (sizes in MiB and pages, a
//! totals line, then a legend); `serde_json` of the [`Report`] is the
//! `--json` format.

use pagesift_core::text::printable;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// A count, with its 95 % interval in sampled mode (`low == high == value`
/// in exact mode).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Estimate {
    /// The count (or its estimate).
    pub value: f64,
    /// Lower end of the interval.
    pub low: f64,
    /// Upper end of the interval.
    pub high: f64,
}

impl Estimate {
    /// An exact count.
    pub fn exact(v: u64) -> Estimate {
        let v = v as f64;
        Estimate {
            value: v,
            low: v,
            high: v,
        }
    }

    /// Whether this is an exact count.
    pub fn is_exact(&self) -> bool {
        self.low == self.value && self.high == self.value
    }

    /// Sum of two estimates (intervals add; fine for exact counts, an
    /// upper bound on the width for sampled ones).
    pub fn plus(&self, o: &Estimate) -> Estimate {
        Estimate {
            value: self.value + o.value,
            low: self.low + o.low,
            high: self.high + o.high,
        }
    }
}

/// The class of a region, where the scan window allows telling it (UKSM
/// §5.2, see `crate::stats::census::classify`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Class {
    /// Many duplicates, and they stayed the same.
    StaticallyDuplicated,
    /// Few duplicates.
    Sparse,
    /// Its duplicates changed while it was watched.
    Changing,
}

impl Class {
    fn short(self) -> &'static str {
        match self {
            Class::StaticallyDuplicated => "static",
            Class::Sparse => "sparse",
            Class::Changing => "changing",
        }
    }
}

/// Page counts of a region, a process or the system (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Counts {
    /// Pages of the merge-eligible VMAs.
    pub size_pages: u64,
    /// Present pages KSM could consider (zero and merged included).
    pub present: u64,
    /// Pages mapped to the zero page.
    pub zero: u64,
    /// Pages already merged by KSM.
    pub merged: u64,
    /// Duplicated frames with a twin in the same region.
    pub dup_in_region: Estimate,
    /// Duplicated frames whose nearest twin is in the same process.
    pub dup_in_process: Estimate,
    /// Duplicated frames whose twins are all in other processes.
    pub dup_across: Estimate,
    /// Pages saved if every duplicate were merged.
    pub saving: Estimate,
}

impl Counts {
    /// Adds `o` field by field.
    pub fn add(&mut self, o: &Counts) {
        self.size_pages += o.size_pages;
        self.present += o.present;
        self.zero += o.zero;
        self.merged += o.merged;
        self.dup_in_region = self.dup_in_region.plus(&o.dup_in_region);
        self.dup_in_process = self.dup_in_process.plus(&o.dup_in_process);
        self.dup_across = self.dup_across.plus(&o.dup_across);
        self.saving = self.saving.plus(&o.saving);
    }

    /// Duplicated frames, all categories.
    pub fn duplicated(&self) -> Estimate {
        self.dup_in_region
            .plus(&self.dup_in_process)
            .plus(&self.dup_across)
    }
}

/// One merge-eligible VMA (or a slice of one).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RegionReport {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Mapped file or pseudo-path (`[heap]`, `[stack]`), `[anon]` for
    /// plain anonymous memory.
    pub name: String,
    /// Its counts.
    pub counts: Counts,
    /// Its class, when the scan could tell (exact mode: with `--rescan`).
    pub class: Option<Class>,
}

/// One process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProcessReport {
    /// Its pid.
    pub pid: u32,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// Sums over its regions.
    pub counts: Counts,
    /// Its regions, sorted by saving (largest first).
    pub regions: Vec<RegionReport>,
}

/// How the numbers were obtained.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum Mode {
    /// Every present page was read and compared: exact counts.
    Exact,
    /// A sample within a budget: estimates with 95 % intervals.
    Sampled {
        /// The time budget.
        budget_ms: u64,
        /// Pages sampled.
        sampled_pages: u64,
        /// Seed of the sampler.
        seed: u64,
        /// The budget covered every present page, so all were read and
        /// every interval has zero width.
        exhaustive: bool,
    },
}

/// The result of a scan.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// Exact or sampled.
    pub mode: Mode,
    /// Processes, sorted by saving (largest first).
    pub processes: Vec<ProcessReport>,
    /// Sums over the processes.
    pub totals: Counts,
    /// Processes that could not be read, with why (e.g. refused by an LSM
    /// although the capabilities are held).
    pub skipped: Vec<(u32, String)>,
    /// Processes that exited during the scan (not in `processes`).
    pub gone: u64,
    /// Wall time of the scan.
    pub elapsed_ms: u64,
    /// CPU time the scanning process used meanwhile (all its threads).
    #[serde(default)]
    pub cpu_ms: u64,
    /// Pages whose contents were read (re-reads included).
    pub pages_read: u64,
}

/// Sorts by saving, largest first; ties by present pages (largest first),
/// then by pid or address, for a stable output.
pub fn sort_by_saving(processes: &mut [ProcessReport]) {
    let key = |c: &Counts, o: &Counts| {
        o.saving
            .value
            .total_cmp(&c.saving.value)
            .then(o.present.cmp(&c.present))
    };
    for p in processes.iter_mut() {
        p.regions
            .sort_by(|a, b| key(&a.counts, &b.counts).then(a.start.cmp(&b.start)));
    }
    processes.sort_by(|a, b| key(&a.counts, &b.counts).then(a.pid.cmp(&b.pid)));
}

/// What the human table shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableOptions {
    /// Show at most this many processes (the largest savings); `None`: all.
    pub processes: Option<usize>,
    /// Regions shown under each process (the largest savings); 0: none.
    pub regions: usize,
}

impl Default for TableOptions {
    fn default() -> Self {
        TableOptions {
            processes: None,
            regions: 3,
        }
    }
}

const MIB_PAGES: f64 = (1 << 20) as f64 / pagesift_core::PAGE_SIZE as f64;

fn mib(pages: f64) -> String {
    format!("{:.1}", pages / MIB_PAGES)
}

/// A count: the value, with `±` half the interval when it is an estimate.
fn est(e: &Estimate) -> String {
    if e.is_exact() {
        format!("{:.0}", e.value)
    } else {
        format!("{:.0}±{:.0}", e.value, (e.high - e.low) / 2.0)
    }
}

fn est_mib(e: &Estimate) -> String {
    if e.is_exact() {
        mib(e.value)
    } else {
        format!("{}±{:.1}", mib(e.value), (e.high - e.low) / 2.0 / MIB_PAGES)
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        // Keep the end: for paths it is the telling part.
        let tail: String = s
            .chars()
            .rev()
            .take(n - 1)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect();
        format!("…{tail}")
    }
}

impl Report {
    /// The human table (see the module doc).
    pub fn to_table(&self, opts: &TableOptions) -> String {
        let mut o = String::new();
        let secs = self.elapsed_ms as f64 / 1000.0;
        let mode = match &self.mode {
            Mode::Exact => "exact".to_string(),
            Mode::Sampled {
                budget_ms,
                sampled_pages,
                seed,
                exhaustive: true,
            } => format!(
                "sampled: the {budget_ms} ms budget covered every page ({sampled_pages} read, seed {seed}): exact"
            ),
            Mode::Sampled {
                budget_ms,
                sampled_pages,
                seed,
                exhaustive: false,
            } => format!(
                "sampled: {sampled_pages} pages in a {budget_ms} ms budget, seed {seed}; ± is the 95 % interval"
            ),
        };
        let _ = writeln!(
            o,
            "pagesift scan ({mode}): {} processes, {} pages read in {secs:.2} s ({:.2} CPU-s); {} gone, {} skipped",
            self.processes.len(),
            self.pages_read,
            self.cpu_ms as f64 / 1000.0,
            self.gone,
            self.skipped.len()
        );
        let _ = writeln!(o);
        let header = format!(
            "{:>8}  {:<32} {:>10} {:>11} {:>10} {:>8} {:>8} {:>10} {:>9} {:>10} {:>10} {:>10}  {}",
            "PID",
            "PROCESS / REGION",
            "SIZE MiB",
            "PRESENT MiB",
            "PRESENT",
            "ZERO",
            "MERGED",
            "DUP REGION",
            "DUP PROC",
            "DUP ACROSS",
            "SAVING MiB",
            "SAVING",
            "CLASS"
        );
        let _ = writeln!(o, "{}", header.trim_end());
        let row = |o: &mut String, pid: &str, name: &str, c: &Counts, class: &str| {
            let line = format!(
                "{:>8}  {:<32} {:>10} {:>11} {:>10} {:>8} {:>8} {:>10} {:>9} {:>10} {:>10} {:>10}  {}",
                pid,
                truncate(name, 32),
                mib(c.size_pages as f64),
                mib(c.present as f64),
                c.present,
                c.zero,
                c.merged,
                est(&c.dup_in_region),
                est(&c.dup_in_process),
                est(&c.dup_across),
                est_mib(&c.saving),
                est(&c.saving),
                class
            );
            let _ = writeln!(o, "{}", line.trim_end());
        };
        let shown = opts.processes.unwrap_or(usize::MAX);
        for p in self.processes.iter().take(shown) {
            // comm and mapping names are chosen by the process: escaped.
            row(
                &mut o,
                &p.pid.to_string(),
                &printable(&p.comm),
                &p.counts,
                "",
            );
            for r in p.regions.iter().take(opts.regions) {
                let addr = format!("  {:#x} ", r.start);
                let name = format!(
                    "{addr}{}",
                    truncate(&printable(&r.name), 32 - addr.chars().count())
                );
                row(
                    &mut o,
                    "",
                    &name,
                    &r.counts,
                    r.class.map_or("", Class::short),
                );
            }
            if p.regions.len() > opts.regions && opts.regions > 0 {
                let _ = writeln!(
                    o,
                    "{:>8}    … {} more regions",
                    "",
                    p.regions.len() - opts.regions
                );
            }
        }
        if self.processes.len() > shown {
            let _ = writeln!(
                o,
                "{:>8}  … {} more processes",
                "",
                self.processes.len() - shown
            );
        }
        row(
            &mut o,
            "TOTAL",
            &format!("{} processes", self.processes.len()),
            &self.totals,
            "",
        );
        let _ = writeln!(o);
        let _ = writeln!(
            o,
            "PRESENT, ZERO, MERGED, DUP and SAVING are in pages (4 KiB) unless marked MiB. DUP: frames whose content \
             another frame holds, by where the nearest twin lives (same region, same process, another process); a frame \
             shared after fork counts once. SAVING: frames freed if every duplicate were merged."
        );
        if self
            .processes
            .iter()
            .flat_map(|p| &p.regions)
            .all(|r| r.class.is_none())
            && self.mode == Mode::Exact
        {
            let _ = writeln!(
                o,
                "CLASS needs two reads: run with --rescan SECS to classify regions as static, sparse or changing."
            );
        }
        for (pid, why) in &self.skipped {
            let _ = writeln!(o, "skipped {pid}: {}", printable(why));
        }
        o
    }
}

/// Why a scan failed.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// A system error that stops the whole scan: a missing capability
    /// (named), a pid that does not exist, pagesift's own pid, an
    /// unsupported kernel.
    #[error(transparent)]
    Linux(#[from] pagesift_linux::LinuxError),
    /// Bad options (the message names the option and the reason).
    #[error("{0}")]
    Usage(String),
    /// An option has a value that cannot work.
    #[error("invalid option {key}: {reason}")]
    InvalidOption { key: &'static str, reason: String },
}

impl ScanError {
    /// The process exit code: 2 for a usage error, 1 for anything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            ScanError::Usage(_) | ScanError::InvalidOption { .. } => 2,
            ScanError::Linux(_) => 1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(present: u64, saving: u64) -> Counts {
        Counts {
            size_pages: present * 2,
            present,
            saving: Estimate::exact(saving),
            dup_in_region: Estimate::exact(saving + 1),
            ..Default::default()
        }
    }

    fn report() -> Report {
        let region = |start, saving| RegionReport {
            start,
            end: start + 4096 * 10,
            name: "[anon]".into(),
            counts: counts(10, saving),
            class: None,
        };
        let mut processes = vec![
            ProcessReport {
                pid: 10,
                comm: "small".into(),
                counts: counts(20, 3),
                regions: vec![region(0x1000, 1), region(0x9000, 2)],
            },
            ProcessReport {
                pid: 20,
                comm: "big".into(),
                counts: counts(512, 256),
                regions: vec![region(0x4000, 256)],
            },
        ];
        sort_by_saving(&mut processes);
        let mut totals = Counts::default();
        for p in &processes {
            totals.add(&p.counts);
        }
        Report {
            mode: Mode::Exact,
            processes,
            totals,
            skipped: vec![(7, "refused".into())],
            gone: 1,
            elapsed_ms: 1500,
            cpu_ms: 1400,
            pages_read: 3_000_000,
        }
    }

    #[test]
    fn names_chosen_by_processes_are_escaped_in_the_table() {
        let mut r = report();
        r.processes[0].comm = "a\x1b[2Jb".into();
        r.processes[0].regions[0].name = "/x\x07\ny".into();
        r.skipped[0].1 = "gone\x1b[31m".into();
        let t = r.to_table(&TableOptions::default());
        assert!(t.chars().all(|c| c == '\n' || !c.is_control()), "{t:?}");
        assert!(t.contains("a\\x1b[2Jb"), "{t}");
        assert!(t.contains("/x\\x07\\x0ay"), "{t}");
        assert!(t.contains("gone\\x1b[31m"), "{t}");
        assert_eq!(
            t.lines().count(),
            report().to_table(&TableOptions::default()).lines().count()
        );
    }

    #[test]
    fn sorted_by_saving_and_totals_add_up() {
        let r = report();
        assert_eq!(r.processes[0].pid, 20);
        assert_eq!(r.processes[1].regions[0].start, 0x9000);
        assert_eq!(r.totals.saving, Estimate::exact(259));
        assert_eq!(r.totals.present, 532);
        assert_eq!(r.totals.duplicated().value, 261.0);
    }

    #[test]
    fn table_shows_processes_regions_and_totals() {
        let t = report().to_table(&TableOptions::default());
        let lines: Vec<&str> = t.lines().collect();
        assert!(
            lines[0].contains("2 processes")
                && lines[0].contains("3000000 pages read in 1.50 s (1.40 CPU-s)"),
            "{t}"
        );
        assert!(lines[0].contains("1 gone, 1 skipped"));
        let big = lines.iter().position(|l| l.contains("big")).unwrap();
        let small = lines.iter().position(|l| l.contains("small")).unwrap();
        assert!(big < small, "largest saving first:\n{t}");
        // 256 pages = 1.0 MiB.
        assert!(
            lines[big].contains(" 1.0 ") && lines[big].contains(" 256"),
            "{}",
            lines[big]
        );
        let total = lines
            .iter()
            .find(|l| l.trim_start().starts_with("TOTAL"))
            .unwrap();
        assert!(total.contains(" 259"), "{total}");
        assert!(t.contains("--rescan"));
        assert!(t.contains("skipped 7: refused"));
        let t = report().to_table(&TableOptions {
            processes: Some(1),
            regions: 0,
        });
        assert!(
            !t.contains("small") && t.contains("1 more processes"),
            "{t}"
        );
        assert!(!t.contains("0x4000"));
    }

    #[test]
    fn json_round_trips() {
        let r = report();
        let s = serde_json::to_string(&r).unwrap();
        let back: Report = serde_json::from_str(&s).unwrap();
        assert_eq!(back, r);
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["mode"], "Exact");
        assert_eq!(v["processes"][0]["counts"]["saving"]["value"], 256.0);
    }

    #[test]
    fn estimates_show_their_interval() {
        let e = Estimate {
            value: 100.0,
            low: 90.0,
            high: 110.0,
        };
        assert_eq!(est(&e), "100±10");
        assert_eq!(est(&Estimate::exact(5)), "5");
        assert!(!e.is_exact() && Estimate::exact(5).is_exact());
        assert_eq!(
            truncate("/usr/lib/x86_64-linux-gnu/libc.so.6", 12),
            "…u/libc.so.6"
        );
        assert_eq!(truncate("[heap]", 12), "[heap]");
    }
}
