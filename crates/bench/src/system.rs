//! The deduplicating systems compared, and how each is set up.
//!
//! - **pagesift** at a governor: `pagesift run --governor G --pid ...`, a
//!   child of the harness; the workload is *not* mergeable by itself, so
//!   everything merged is pagesift's decision. Variants change its
//!   configuration file: a CPU share for the COW-broken comparison (V_cow
//!   off as in UKSM §8.1.2, "if we disable the COW-broken filtering"),
//!   UKSM §8.1.3's short-lived tuning. One variant, `-owner-marks`, runs
//!   the workload mergeable as for KSM (QEMU's default `mem-merge=on`):
//!   pagesift then only paces ksmd, and the difference from the plain
//!   variant is what pagesift's own choice of what to mark costs or saves.
//! - **KSM** the way a KSM user runs it: every workload process started
//!   with `PR_SET_MEMORY_MERGE` (all its memory mergeable), ksmd at a fixed
//!   `pages_to_scan` with the default `sleep_millisecs` = 20
//!   (`ksm_thread_sleep_millisecs` in mm/ksm.c), or with `advisor_mode = scan-time`.
//! - **KSM paced** to a CPU share: the same, with the harness closing a
//!   loop on ksmd's measured CPU through `pagesift-core`'s `Pacer` once a
//!   second (for the equal-CPU comparison of §8.1.2).
//! - **ksmtuned**, Debian's tuning script, which starts, stops and paces
//!   ksmd by itself from free memory.

use pagesift_core::pipeline::governor::Governor;

/// pagesift's configuration variants.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Tuning {
    /// The configuration's defaults.
    Default,
    /// UKSM §8.1.2: COW-broken filtering off (V_cow = 100 %), and the
    /// daemon plus ksmd held to this share of one core: ksmd gets 3/4 of
    /// it, the daemon's sampling 1/4.
    CpuShare(f64),
    /// The defaults, with the daemon plus ksmd held to this share of one
    /// core as in [`Tuning::CpuShare`] (COW-broken filtering as
    /// configured): pagesift at the CPU of a slower ksmd, for the files
    /// experiment's comparison at equal CPU.
    Capped(f64),
    /// Host page-cache scrubbing on (`[scrub]`, Singleton), periods for a
    /// run of a minute or two.
    Scrub,
    /// UKSM §8.1.3's setting for short-lived regions, as pagesift ships it
    /// (`dist/profiles/short-lived.toml`): 20 ms sleep, 50 % CPU, short
    /// round times (the paper's 50/20/10/5 ms per level; the
    /// configuration's global round time has a 100 ms floor, so 100 ms),
    /// mappings looked at every 20 ms, ksmd allowed 20 scans a second.
    ShortLived,
    /// The defaults with I/O hints off (`[hints] enabled = false`): the
    /// files experiment's comparison.
    NoHints,
    /// The defaults, with the workload making its memory mergeable itself
    /// as it does for KSM (QEMU's `mem-merge=on`, its default; processes
    /// started with `PR_SET_MEMORY_MERGE`). pagesift then has nothing to
    /// mark there: that memory is *foreign* to it, and it only paces ksmd
    /// by what its sampling finds. The configuration an operator who
    /// leaves QEMU's default alone runs.
    OwnerMarks,
}

/// A system under test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum System {
    /// The pagesift daemon.
    Pagesift {
        /// Its governor.
        governor: Governor,
        /// Its configuration variant.
        tuning: Tuning,
    },
    /// Kernel KSM at a fixed `pages_to_scan`, `sleep_millisecs` 20.
    Ksm {
        /// Pages per batch.
        pages_to_scan: u32,
    },
    /// Kernel KSM at a fixed `pages_to_scan` and `sleep_millisecs` (XLH's
    /// settings: 100 pages per 20, 100 or 200 ms).
    KsmSleep {
        /// Pages per batch.
        pages_to_scan: u32,
        /// Sleep between batches, ms.
        sleep_ms: u32,
    },
    /// Kernel KSM with `advisor_mode = scan-time` (its defaults).
    KsmAdvisor,
    /// Kernel KSM paced by the harness to a share of one core.
    KsmPaced {
        /// Fraction of one core.
        share: f64,
    },
    /// Kernel KSM driven by ksmtuned.
    Ksmtuned,
    /// Kernel KSM at a fixed `pages_to_scan` plus a periodic
    /// `POSIX_FADV_DONTNEED` of every guest disk image (Singleton §4.1's
    /// "Fadvise"); page-cache experiment only.
    KsmFadvise {
        /// Pages per batch.
        pages_to_scan: u32,
    },
}

impl System {
    /// pagesift at a governor with its defaults.
    pub fn pagesift(governor: Governor) -> System {
        System::Pagesift {
            governor,
            tuning: Tuning::Default,
        }
    }

    /// The name used in tables, CSV files and plots.
    pub fn name(&self) -> String {
        match *self {
            System::Pagesift { governor, tuning } => match tuning {
                Tuning::Default => format!("pagesift-{governor}"),
                Tuning::CpuShare(s) => format!("pagesift-{governor}@{}%", pct(s)),
                Tuning::Capped(s) => format!("pagesift-{governor}-capped@{}%", pct(s)),
                Tuning::ShortLived => format!("pagesift-{governor}-short"),
                Tuning::NoHints => format!("pagesift-{governor}-nohints"),
                Tuning::Scrub => format!("pagesift-{governor}-scrub"),
                Tuning::OwnerMarks => format!("pagesift-{governor}-owner-marks"),
            },
            System::KsmSleep {
                pages_to_scan,
                sleep_ms,
            } => format!("ksm-{pages_to_scan}@{sleep_ms}ms"),
            System::Ksm { pages_to_scan } => format!("ksm-{pages_to_scan}"),
            System::KsmAdvisor => "ksm-advisor".into(),
            System::KsmPaced { share } => format!("ksm-paced@{}%", pct(share)),
            System::Ksmtuned => "ksmtuned".into(),
            System::KsmFadvise { pages_to_scan } => format!("fadvise-ksm-{pages_to_scan}"),
        }
    }

    /// Whether the workload runs with all its memory mergeable (every
    /// system but pagesift, unless pagesift runs beside a workload that
    /// marks its own memory).
    pub fn workload_mergeable(&self) -> bool {
        match self {
            System::Pagesift { tuning, .. } => *tuning == Tuning::OwnerMarks,
            _ => true,
        }
    }

    /// Whether this is pagesift.
    pub fn is_pagesift(&self) -> bool {
        matches!(self, System::Pagesift { .. })
    }

    /// The `pagesift run` configuration file for this system (TOML);
    /// `None` for the kernel's systems.
    pub fn config_toml(&self) -> Option<String> {
        let System::Pagesift { tuning, .. } = *self else {
            return None;
        };
        Some(match tuning {
            Tuning::Default => "# pagesift bench: the defaults\n".into(),
            Tuning::CpuShare(s) => format!(
                "# pagesift bench: COW-broken filtering off (UKSM §8.1.2), {p} % of a core\n\
                 [ladder]\nv_cow = 1.0\n\n{cap}",
                p = pct(s),
                cap = held_to(s),
            ),
            Tuning::Capped(s) => format!(
                "# pagesift bench: the defaults, {p} % of a core\n{cap}",
                p = pct(s),
                cap = held_to(s),
            ),
            // The shipped period bounds (Singleton's 30-60 s, Algorithm 2
            // within 5-60 s): a page a guest evicts before the next scrub
            // stays in the host cache as an exclusive copy, and the guests
            // turn their caches over in tens of seconds when a host-cache
            // miss costs what a disk read does (the page-cache experiment
            // throttles them to one). Read-ahead off, as Singleton does.
            Tuning::Scrub => "# pagesift bench: host page-cache scrubbing (Singleton)\n\
                 [scrub]\nenabled = true\nhost_readahead = false\n"
                .into(),
            // The profile pagesift ships for it, as an operator would use it.
            Tuning::ShortLived => SHORT_LIVED_PROFILE.into(),
            Tuning::NoHints => "# pagesift bench: I/O hints off\n[hints]\nenabled = false\n".into(),
            Tuning::OwnerMarks => {
                "# pagesift bench: the defaults; the workload marks its own memory mergeable\n"
                    .into()
            }
        })
    }
}

/// `dist/profiles/short-lived.toml`: UKSM §8.1.3's setting for
/// short-lived memory.
pub const SHORT_LIVED_PROFILE: &str = include_str!("../../../dist/profiles/short-lived.toml");

/// The config sections that hold the daemon plus ksmd to `share` of one
/// core: ksmd gets 3/4 of it, merging or trickling, the daemon's sampling
/// 1/4.
fn held_to(share: f64) -> String {
    format!(
        "[scan]\ncpu_cap = {d}\n\n[ksm]\nmerge_share = {k}\ntrickle_share = {k}\n",
        d = share / 4.0,
        k = share * 0.75,
    )
}

/// A share as a percentage, to two decimals at most ("2", "0.15").
fn pct(share: f64) -> String {
    let p = format!("{:.2}", share * 100.0);
    p.trim_end_matches('0').trim_end_matches('.').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_stable() {
        let all = [
            System::pagesift(Governor::Full),
            System::pagesift(Governor::Quiet),
            System::Pagesift {
                governor: Governor::Full,
                tuning: Tuning::CpuShare(0.02),
            },
            System::Pagesift {
                governor: Governor::Full,
                tuning: Tuning::ShortLived,
            },
            System::Pagesift {
                governor: Governor::Full,
                tuning: Tuning::OwnerMarks,
            },
            System::Pagesift {
                governor: Governor::Full,
                tuning: Tuning::Capped(0.0015),
            },
            System::Ksm {
                pages_to_scan: 1000,
            },
            System::KsmAdvisor,
            System::KsmPaced { share: 0.1 },
            System::Ksmtuned,
        ];
        let names: Vec<String> = all.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "pagesift-full",
                "pagesift-quiet",
                "pagesift-full@2%",
                "pagesift-full-short",
                "pagesift-full-owner-marks",
                "pagesift-full-capped@0.15%",
                "ksm-1000",
                "ksm-advisor",
                "ksm-paced@10%",
                "ksmtuned"
            ]
        );
        assert!(all[0].is_pagesift() && !all[0].workload_mergeable());
        assert!(all[4].is_pagesift() && all[4].workload_mergeable());
        assert!(all[6].workload_mergeable() && all[6].config_toml().is_none());
    }

    #[test]
    fn the_configs_parse_as_the_daemon_reads_them() {
        for t in [
            Tuning::Default,
            Tuning::CpuShare(0.1),
            Tuning::Capped(0.1),
            Tuning::ShortLived,
            Tuning::NoHints,
            Tuning::OwnerMarks,
        ] {
            let s = System::Pagesift {
                governor: Governor::Full,
                tuning: t,
            };
            let text = s.config_toml().unwrap();
            let c = pagesift_daemon::config::Config::from_toml(&text, "bench").unwrap();
            if let Tuning::CpuShare(_) | Tuning::Capped(_) = t {
                assert_eq!(c.ladder.v_cow == 1.0, matches!(t, Tuning::CpuShare(_)));
                let k = c.ksm.merge_share.unwrap();
                let d = c.scan.cpu_cap.unwrap();
                assert!((k + d - 0.1).abs() < 1e-12);
            }
        }
    }
}
