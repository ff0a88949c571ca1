//! The experiments: UKSM §8.1's emulated workloads (and controls of our
//! own), each at a quick and a full size.
//!
//! | group | what | paper |
//! |---|---|---|
//! | `static-mixed` | N MiB identical + N MiB random, two processes, identical one started (and so scanned by KSM) first | §8.1.1, Fig. 9a/b |
//! | `static-mixed-random-first` | the same, random process first: KSM's result depends on its scan order (`__ksm_enter` in `mm/ksm.c` queues a new mm just behind ksmd's cursor) | §8.1.1 |
//! | `static-mixed-not-multiple` | the same with one identical page in 1000 left untouched, so the identical pages are *not* a multiple of max_page_sharing (256) and KSM's stable chains are not all full (`stable_node_chain` in `mm/ksm.c`) | §8.1.1 |
//! | `cow-broken` | one region, one page rewritten every 10 ms; memory saved at equal CPU of 2, 10, 20 % of a core | §8.1.2, Fig. 9c |
//! | `short-lived` | map N MiB of one content, keep it T, unmap, wait T; T = 2, 1, 0.5, 0.2 s; judged on the share of each cycle merged before its unmap (`crate::cycles`) | §8.1.3 |
//! | `sparse-only` | random memory only: nothing to merge, every CPU-second is idle cost | idle-cost control |
//! | `fork-family` | a parent and 3 children sharing frames after fork, each child rewriting a quarter of the pages | — |
//! | `interpreter-workers` | real `python3` processes holding the same data file beside a private buffer they rewrite (4 × 24 + 8 MiB quick, 6 × 48 + 16 MiB full) | pagesift's real-workload goals |
//! | `vm-boot` | QEMU/TCG guests started 10 s apart (3 quick, 10 full, 512 MiB each) that read the same files from their own copy of a disk | §8.2.1, Fig. 10a |
//! | `files` | processes that read the same files, each in its own order, beside distinct memory; pagesift with and without I/O hints, and held to the CPU of ksmd at 100 pages per 100 ms; ksmd at XLH's rates | XLH Appendix B |
//! | `guest-files` | booted guests that read the same files from their own disk copies, each in its own order, at t = 0; the file data's copies in guest RAM located and their merging measured ([`crate::guest_files`]); runs only when named | XLH §5.4, issue 12 |
//!
//! Whole MiB are always multiples of max_page_sharing × 4 KiB = 1 MiB, so
//! a size like 1001 MiB would still fill every chain: the not-multiple
//! variant leaves pages untouched instead (`--hole-every 1000`).
//!
//! `--quick` (≤ 10 minutes in all on a 2-core machine): ⅛ of the sizes,
//! 8–15 s windows, and the systems that show the difference (pagesift
//! full, KSM at 1000 or 10000, plus ksmtuned on static-mixed); KSM at 100
//! pages, the advisor and pagesift's quiet governor need minutes to merge
//! anything (a page merges on ksmd's second visit: two passes at 100 pages
//! per 20 ms over the quick sizes take close to a minute; quiet's round
//! is 20 s), so they run in
//! `--full` only. `--full`: the
//! issue's sizes (2 GiB + 2 GiB, 2 GiB COW-broken as in §8.1.2, 512 MiB
//! short-lived as §8.1.3's 500 MB), 120 s windows, and every system.

use crate::interpreters::InterpreterPlan;
use crate::system::{System, Tuning};
use pagesift_core::pipeline::governor::Governor;

/// How big and how long.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// ≤ 10 minutes for everything.
    Quick,
    /// The issue's sizes and the 120 s window.
    Full,
}

/// Which series says how much is saved, for time-to-99 %.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedBy {
    /// KSM's counters (`pages_sharing` + `ksm_zero_pages`).
    KsmCounters,
    /// Σ (Anonymous − Pss_Anon) of the workload: physical frames freed, which is
    /// right when frames were already shared by fork.
    Pss,
    /// The guest-files experiment: the copies of the file data in guest
    /// RAM less the frames that back them ([`crate::guest_files`]).
    FileData,
}

impl SavedBy {
    /// The series ([`crate::sampler::metric`]) that says how much is saved.
    pub fn metric(self) -> &'static str {
        use crate::sampler::metric;
        match self {
            SavedBy::KsmCounters => metric::SAVED,
            SavedBy::Pss => metric::SAVED_PSS,
            SavedBy::FileData => metric::FILE_SAVED,
        }
    }
}

/// Guests of the VM-boot experiment (UKSM §8.2.1, scaled): started during
/// the run, `interval_s` apart from t = 0.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuestPlan {
    /// How many.
    pub count: usize,
    /// RAM of each, MiB.
    pub mem_mib: u32,
    /// Seconds between two starts.
    pub interval_s: f64,
}

/// The files experiment (XLH's HTTPerf, dissertation Appendix B, on
/// processes): `readers` processes each hold `private_mib` MiB of distinct
/// pages and, at t = 0, read the same `files` files of `file_mib` MiB (each
/// under its own names, hard links in a directory of its own, in its own
/// shuffled order) into fresh page-aligned anonymous buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FilesPlan {
    /// Reader processes.
    pub readers: usize,
    /// Files each reads.
    pub files: usize,
    /// Size of each file, MiB.
    pub file_mib: u64,
    /// Distinct private memory of each reader, MiB.
    pub private_mib: u64,
}

/// The guest-files experiment (XLH's I/O hints for guests, issue 12):
/// `guests` QEMU/TCG guests of `mem_mib` MiB, each with its own copy of an
/// ext2 disk holding `files` files of `file_mib` MiB of random bytes, boot
/// before t = 0 and, at t = 0, read every file (`md5sum`), each guest in
/// its own shuffled order ([`crate::guest_files`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GuestFilesPlan {
    /// Guests.
    pub guests: usize,
    /// RAM of each, MiB.
    pub mem_mib: u32,
    /// Files on the disk.
    pub files: usize,
    /// Size of each file, MiB.
    pub file_mib: u64,
}

impl GuestFilesPlan {
    /// Pages of file data one guest reads.
    pub fn file_pages(&self) -> u64 {
        self.files as u64 * (self.file_mib << 20) / 4096
    }

    /// Pages merging can save if every guest holds one copy of each file
    /// page: all guests' copies but one. (The run's target is the copies
    /// it located, [`crate::guest_files::FileCopies::target_pages`].)
    pub fn target_pages(&self) -> u64 {
        (self.guests as u64 - 1) * self.file_pages()
    }
}

impl FilesPlan {
    /// Pages merging can save: every reader's copy of the file data but
    /// one.
    pub fn target_pages(&self) -> u64 {
        (self.readers as u64 - 1) * self.files as u64 * (self.file_mib << 20) / 4096
    }
}

/// A goal an issue sets for one experiment, judged from the figures
/// measured in the same run (the report prints it as met or not met,
/// [`crate::report::judge`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Goal {
    /// `system`'s saving (PSS) reaches `fraction` of the exact saving at
    /// the start (the run's target) within `within_s` seconds, with at
    /// most `max_cpu_ratio` × `against`'s CPU-seconds over the window.
    ReachExact {
        /// The system judged.
        system: System,
        /// The system its CPU is compared with.
        against: System,
        /// Share of the exact saving, 0..=1.
        fraction: f64,
        /// Seconds from t = 0.
        within_s: f64,
        /// Largest CPU-seconds ratio system ÷ against over the window.
        max_cpu_ratio: f64,
    },
    /// `system` saves (PSS, mean of the window's 2nd half) at least
    /// `min_saved_ratio` × what `against` saves, with at most
    /// `max_cpu_ratio` × its CPU-seconds over the window.
    SaveAsMuch {
        /// The system judged.
        system: System,
        /// The system it is compared with.
        against: System,
        /// Smallest saving ratio system ÷ against.
        min_saved_ratio: f64,
        /// Largest CPU-seconds ratio system ÷ against over the window.
        max_cpu_ratio: f64,
    },
    /// `system` reaches each of `fractions` of the run's target at least
    /// `min_speedup` × sooner than `against` (a target `against` never
    /// reaches counts as reached at the window's end, a lower bound).
    Sooner {
        /// The system judged.
        system: System,
        /// The system it is compared with.
        against: System,
        /// Shares of the target, 0..=1.
        fractions: [f64; 2],
        /// Smallest ratio time(against) ÷ time(system).
        min_speedup: f64,
        /// Largest CPU-seconds ratio system ÷ against over the window
        /// (`None`: CPU not judged).
        max_cpu_ratio: Option<f64>,
    },
    /// The page-cache experiment: `system`'s host cache of the guests'
    /// images (mean over the window's 2nd half) is at least `factor` ×
    /// smaller than `against`'s.
    CacheSmaller {
        /// The system judged.
        system: System,
        /// The system it is compared with.
        against: System,
        /// Smallest ratio against ÷ system.
        factor: f64,
    },
    /// The page-cache experiment: the guests' read throughput under
    /// `system` is at least `min_ratio` × `against`'s (strictly above it
    /// when `strictly`).
    Throughput {
        /// The system judged.
        system: System,
        /// The system it is compared with.
        against: System,
        /// Smallest ratio system ÷ against.
        min_ratio: f64,
        /// Require strictly more.
        strictly: bool,
    },
    /// The page-cache experiment: every guest's data was byte-identical
    /// (its md5 inside the guest) under `system`.
    DataIntact {
        /// The system judged.
        system: System,
    },
    /// The short-lived experiments: under `system`, every cycle mapped and
    /// unmapped within the window had at least `share` of its pages merged
    /// before its unmap ([`crate::cycles`]).
    EachCycle {
        /// The system judged.
        system: System,
        /// Least merged share of any cycle, 0..=1.
        share: f64,
    },
    /// The short-lived experiments: `system` merges a larger share of its
    /// cycles' pages before their unmap, on average, than `against`.
    MoreOfEachCycle {
        /// The system judged.
        system: System,
        /// The system it is compared with.
        against: System,
    },
    /// The short-lived experiments: `system` (a default config) leaves the
    /// cycles alone (under 10 % of their pages merged on average) at
    /// ≤ `max_cpu_share` of one core over the window.
    SkipsCycles {
        /// The system judged.
        system: System,
        /// Most mean CPU, as a fraction of one core.
        max_cpu_share: f64,
    },
}

impl Goal {
    /// The system judged and the one it is compared with (itself when the
    /// goal compares with nothing).
    pub fn systems(&self) -> (System, System) {
        match *self {
            Goal::ReachExact {
                system, against, ..
            }
            | Goal::SaveAsMuch {
                system, against, ..
            }
            | Goal::Sooner {
                system, against, ..
            }
            | Goal::CacheSmaller {
                system, against, ..
            }
            | Goal::Throughput {
                system, against, ..
            }
            | Goal::MoreOfEachCycle { system, against } => (system, against),
            Goal::DataIntact { system }
            | Goal::EachCycle { system, .. }
            | Goal::SkipsCycles { system, .. } => (system, system),
        }
    }
}

/// The real-workload goal 3 (UKSM §8.1.3): under the short-lived profile
/// ≥ 90 % of each cycle's pages merged at T ≥ 0.5 s, more than ksm-10000
/// merges at T = 0.2 s; under the defaults the cycles are skipped at
/// ≤ 0.5 % of a core.
fn short_lived_goals(t_ms: u64, tuned: System, default: System, ksm: System) -> Vec<GoalSpec> {
    let source = "real-workload goal 3, UKSM §8.1.3";
    let first = if t_ms >= 500 {
        Goal::EachCycle {
            system: tuned,
            share: 0.9,
        }
    } else {
        Goal::MoreOfEachCycle {
            system: tuned,
            against: ksm,
        }
    };
    vec![
        GoalSpec {
            source,
            goal: first,
        },
        GoalSpec {
            source,
            goal: Goal::SkipsCycles {
                system: default,
                max_cpu_share: 0.005,
            },
        },
    ]
}

/// A goal and where it was set (`UKSM §8.2.1`, `real-workload goal 2`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GoalSpec {
    /// Where the goal comes from.
    pub source: &'static str,
    /// The goal.
    pub goal: Goal,
}

/// One experiment: the workload processes (started in order), the systems
/// run on fresh copies of it, and how long each run is watched.
#[derive(Clone, Debug)]
pub struct Experiment {
    /// Unique name (`static-mixed`, `cow-broken-10pct`, ...).
    pub name: String,
    /// The group `--only` also accepts (`cow-broken` for all three).
    pub group: &'static str,
    /// Paper section it follows.
    pub paper: &'static str,
    /// One sentence: workload and sizes.
    pub about: String,
    /// `pagesift-workload` arguments of each process, in start order.
    pub workloads: Vec<Vec<String>>,
    /// QEMU guests started during the run (VM boot), besides or instead of
    /// `workloads`.
    pub guests: Option<GuestPlan>,
    /// `python3` workers started before t = 0, after `workloads`; their
    /// exact saving at the start becomes the run's target.
    pub interpreters: Option<InterpreterPlan>,
    /// Processes that read the same files at t = 0 (the files experiment).
    pub files: Option<FilesPlan>,
    /// Guests that read the same files at t = 0 (the guest-files
    /// experiment).
    pub guest_files: Option<GuestFilesPlan>,
    /// The report count (summed over the workloads) that is the mergeable
    /// page total; `None`: no time-to-99 % (nothing to merge, or a
    /// workload that never settles).
    pub target: Option<&'static str>,
    /// Which series time-to-99 % reads.
    pub saved_by: SavedBy,
    /// Systems, each on a fresh copy of the workload.
    pub systems: Vec<System>,
    /// Seconds each run is watched (the CPU window).
    pub window_s: f64,
    /// The system ratios are taken against.
    pub reference: System,
    /// Goals the report judges as met or not met.
    pub goals: Vec<GoalSpec>,
}

fn args(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn mib(n: u64) -> String {
    n.to_string()
}

/// Every experiment for `mode`, in run order.
pub fn all(mode: Mode) -> Vec<Experiment> {
    let full = mode == Mode::Full;
    let scale = |n: u64| if full { n } else { n / 8 };
    let window = |quick: f64| if full { 120.0 } else { quick };
    let pagesift = System::pagesift(Governor::Full);
    let ksm = |p| System::Ksm { pages_to_scan: p };
    let every_system = vec![
        System::pagesift(Governor::Full),
        System::pagesift(Governor::Medium),
        System::pagesift(Governor::Low),
        System::pagesift(Governor::Quiet),
        ksm(100),
        ksm(1000),
        ksm(2000),
        ksm(10000),
        System::KsmAdvisor,
        System::Ksmtuned,
    ];
    let few = if full {
        vec![pagesift, ksm(1000), ksm(10000)]
    } else {
        vec![pagesift, ksm(10000)]
    };
    let n = scale(2048);
    let identical = args(&["static-dup", "--mib", &mib(n), "--seed", "1"]);
    let random = args(&["random", "--mib", &mib(n), "--seed", "2"]);
    let mut holed = identical.clone();
    holed.extend(args(&["--hole-every", "1000"]));
    let static_about = |order: &str| {
        format!("{n} MiB of identical pages + {n} MiB of random pages in two processes, {order}")
    };
    let mut v = vec![
        Experiment {
            name: "static-mixed".into(),
            group: "static-mixed",
            paper: "UKSM §8.1.1",
            about: static_about(&format!(
                "the identical one started first; {} identical pages, a multiple of max_page_sharing",
                n * 256
            )),
            guests: None,
            interpreters: None,
            files: None,
            guest_files: None,
            workloads: vec![identical.clone(), random.clone()],
            target: Some("duplicate_pages"),
            saved_by: SavedBy::Pss,
            systems: if full {
                every_system.clone()
            } else {
                vec![pagesift, ksm(1000), ksm(10000), System::Ksmtuned]
            },
            window_s: window(15.0),
            reference: pagesift,
            goals: Vec::new(),
        },
        Experiment {
            name: "static-mixed-random-first".into(),
            group: "static-mixed-random-first",
            paper: "UKSM §8.1.1",
            about: static_about("the random one started first"),
            guests: None,
            interpreters: None,
            files: None,
            guest_files: None,
            workloads: vec![random.clone(), identical.clone()],
            target: Some("duplicate_pages"),
            saved_by: SavedBy::Pss,
            systems: few.clone(),
            window_s: window(15.0),
            reference: pagesift,
            goals: Vec::new(),
        },
        Experiment {
            name: "static-mixed-not-multiple".into(),
            group: "static-mixed-not-multiple",
            paper: "UKSM §8.1.1",
            about: static_about(
                "the identical one first, with every 1000th page left untouched so that the \
                 identical pages are not a multiple of max_page_sharing",
            ),
            guests: None,
            interpreters: None,
            files: None,
            guest_files: None,
            workloads: vec![holed, random.clone()],
            target: Some("duplicate_pages"),
            saved_by: SavedBy::Pss,
            systems: few.clone(),
            window_s: window(15.0),
            reference: pagesift,
            goals: Vec::new(),
        },
    ];
    let cow = scale(2048);
    for share in [0.02, 0.10, 0.20] {
        let p = (share * 100.0f64).round() as u32;
        let me = System::Pagesift {
            governor: Governor::Full,
            tuning: Tuning::CpuShare(share),
        };
        v.push(Experiment {
            name: format!("cow-broken-{p}pct"),
            group: "cow-broken",
            paper: "UKSM §8.1.2",
            about: format!(
                "{cow} MiB of one content, one page rewritten (same content) every 10 ms, \
                 start to end; both systems held to {p} % of one core"
            ),
            guests: None,
            interpreters: None,
            files: None,
            guest_files: None,
            workloads: vec![args(&["cow-broken", "--mib", &mib(cow), "--seed", "3"])],
            target: Some("duplicate_pages"),
            saved_by: SavedBy::Pss,
            systems: vec![me, System::KsmPaced { share }],
            window_s: window(12.0),
            reference: me,
            // UKSM §8.1.2: KSM saves "only about 1/3 to 1/5" of what UKSM
            // saves at the same CPU. Where KSM merges everything within
            // the window (the quick sizes at 10 and 20 %) three times its
            // saving is more than there is: not met there, whatever
            // pagesift does.
            goals: vec![GoalSpec {
                source: "real-workload goal 4 (UKSM §8.1.2: 3-5×)",
                goal: Goal::SaveAsMuch {
                    system: me,
                    against: System::KsmPaced { share },
                    min_saved_ratio: 3.0,
                    max_cpu_ratio: 1.0,
                },
            }],
        });
    }
    let short = scale(512);
    let tuned = System::Pagesift {
        governor: Governor::Full,
        tuning: Tuning::ShortLived,
    };
    for t_ms in [2000u64, 1000, 500, 200] {
        v.push(Experiment {
            name: format!("short-lived-{t_ms}ms"),
            group: "short-lived",
            paper: "UKSM §8.1.3",
            about: format!(
                "forever: map {short} MiB of one content, keep it {t_ms} ms, unmap, wait {t_ms} ms"
            ),
            guests: None,
            interpreters: None,
            files: None,
            guest_files: None,
            workloads: vec![args(&[
                "short-lived",
                "--mib",
                &mib(short),
                "--period-ms",
                &t_ms.to_string(),
                "--seed",
                "4",
            ])],
            target: None,
            saved_by: SavedBy::Pss,
            systems: if full {
                vec![pagesift, tuned, ksm(2000), ksm(10000), System::KsmAdvisor]
            } else {
                vec![tuned, pagesift, ksm(10000)]
            },
            window_s: if full { 60.0 } else { 8.0 },
            reference: tuned,
            goals: short_lived_goals(t_ms, tuned, pagesift, ksm(10000)),
        });
    }
    let sparse = if full { 4096 } else { 256 };
    v.push(Experiment {
        name: "sparse-only".into(),
        group: "sparse-only",
        paper: "idle-cost control",
        about: format!("{sparse} MiB of distinct pages: nothing to merge, all CPU is idle cost"),
        guests: None,
        interpreters: None,
        files: None,
        guest_files: None,
        workloads: vec![args(&["random", "--mib", &mib(sparse), "--seed", "5"])],
        target: None,
        saved_by: SavedBy::Pss,
        systems: if full {
            every_system.clone()
        } else {
            vec![pagesift, ksm(1000)]
        },
        window_s: window(10.0),
        reference: pagesift,
        goals: Vec::new(),
    });
    let fam = scale(1024);
    v.push(Experiment {
        name: "fork-family".into(),
        group: "fork-family",
        paper: "—",
        about: format!(
            "a parent fills {fam} MiB (30 % of 16-page runs duplicated, the rest random), forks 3 \
             children, each rewrites a quarter of the pages; saved = frames freed (PSS)"
        ),
        guests: None,
        interpreters: None,
        files: None,
        guest_files: None,
        workloads: vec![args(&[
            "fork-family",
            "--mib",
            &mib(fam),
            "--children",
            "3",
            "--dirty-fraction",
            "0.25",
            "--seed",
            "6",
        ])],
        target: Some("family.duplicate_pages"),
        saved_by: SavedBy::Pss,
        systems: few,
        window_s: window(12.0),
        reference: pagesift,
        goals: Vec::new(),
    });
    // Real workloads: six python3 interpreters, each holding the same 48 MiB
    // file and 16 MiB of private data rewritten every 5 ms; quick: 4 × (24
    // + 8) MiB, which KSM at 1000 pages merges well inside the window.
    let workers = InterpreterPlan {
        count: if full { 6 } else { 4 },
        data_mib: if full { 48 } else { 24 },
        private_mib: if full { 16 } else { 8 },
        write_every_ms: 5,
        write_bytes: 4096,
    };
    let ksm1000 = ksm(1000);
    v.push(Experiment {
        name: "interpreter-workers".into(),
        group: "interpreter-workers",
        paper: "pagesift's real-workload goals",
        about: format!(
            "{} python3 processes ({}) each read the same {} MiB file of random bytes into a \
             bytes object and keep a private bytearray of {} MiB, {} bytes of which they rewrite \
             with new random bytes every {} ms; the target is the exact saving of `pagesift scan \
             --exact` on the loaded workers before t = 0; saved = Σ (Anonymous − Pss_Anon) of \
             the workers",
            workers.count,
            crate::interpreters::PYTHON,
            workers.data_mib,
            workers.private_mib,
            workers.write_bytes,
            workers.write_every_ms
        ),
        guests: None,
        interpreters: Some(workers),
        files: None,
        guest_files: None,
        workloads: Vec::new(),
        target: None,
        saved_by: SavedBy::Pss,
        systems: if full {
            vec![pagesift, ksm1000, ksm(10000)]
        } else {
            vec![pagesift, ksm1000]
        },
        window_s: window(40.0),
        reference: pagesift,
        goals: vec![GoalSpec {
            source: "real-workload goal 2",
            goal: Goal::ReachExact {
                system: pagesift,
                against: ksm1000,
                fraction: 0.9,
                within_s: 30.0,
                max_cpu_ratio: 0.5,
            },
        }],
    });
    // The same guests with QEMU's default mem-merge=on: guest RAM is
    // mergeable before pagesift sees it, and pagesift only paces ksmd.
    let owner_marks = System::Pagesift {
        governor: Governor::Full,
        tuning: Tuning::OwnerMarks,
    };
    // UKSM §8.2.1 boots 25 VMs of 512 MB 10 s apart; scaled to this
    // machine (guest.rs measured the sizes).
    let guests = GuestPlan {
        count: if full {
            crate::guest::FULL_GUESTS
        } else {
            crate::guest::QUICK_GUESTS - 1
        },
        mem_mib: crate::guest::DEFAULT_MEM_MIB,
        interval_s: crate::guest::START_INTERVAL.as_secs_f64(),
    };
    v.push(Experiment {
        name: "vm-boot".into(),
        group: "vm-boot",
        paper: "UKSM §8.2.1",
        about: format!(
            "{} QEMU/TCG guests of {} MiB booting Debian's kernel with a busybox initramfs, \
             each reading the same files from its own copy of an ext2 disk image (virtio-blk), \
             copying them into tmpfs and running the same programs (gzip of a tar of the disk, \
             sort), started {:.0} s apart from t = 0 (mem-merge=on for KSM and for {}, off for \
             {}); saved = Σ (Anonymous − Pss_Anon) of the QEMUs",
            guests.count,
            guests.mem_mib,
            guests.interval_s,
            owner_marks.name(),
            pagesift.name()
        ),
        workloads: Vec::new(),
        guests: Some(guests),
        interpreters: None,
        files: None,
        guest_files: None,
        target: None,
        saved_by: SavedBy::Pss,
        systems: if full {
            vec![pagesift, owner_marks, ksm(100), ksm(1000), System::Ksmtuned]
        } else {
            vec![pagesift, owner_marks, ksm(1000)]
        },
        // Quick: 40 s after the last start. A guest that reads and copies
        // its disk and runs its programs is ready 10-20 s after its start
        // on a quiet machine, 30 s or more on a loaded one; the mean of the
        // window's second half should see every guest ready.
        window_s: (guests.count - 1) as f64 * guests.interval_s + if full { 120.0 } else { 40.0 },
        reference: pagesift,
        goals: vec![
            GoalSpec {
                source: "real-workload goal 1",
                goal: Goal::SaveAsMuch {
                    system: pagesift,
                    against: ksm1000,
                    min_saved_ratio: 1.0,
                    max_cpu_ratio: 1.0,
                },
            },
            GoalSpec {
                source: "real-workload goal 1 (UKSM §8.2.1's 3×: twice)",
                goal: Goal::SaveAsMuch {
                    system: pagesift,
                    against: ksm1000,
                    min_saved_ratio: 2.0,
                    max_cpu_ratio: 1.0,
                },
            },
            GoalSpec {
                source: "real-workload goal 1, QEMU marking guest RAM itself",
                goal: Goal::SaveAsMuch {
                    system: owner_marks,
                    against: ksm1000,
                    min_saved_ratio: 1.0,
                    max_cpu_ratio: 1.0,
                },
            },
        ],
    });
    // XLH's HTTPerf (Appendix B) on processes: readers of the same files
    // beside distinct memory; ksmd at XLH's 100 pages per 20, 100 and
    // 200 ms against pagesift with and without hints.
    let plan = FilesPlan {
        readers: if full { 8 } else { 4 },
        files: if full { 8 } else { 4 },
        file_mib: if full { 16 } else { 4 },
        private_mib: if full { 256 } else { 32 },
    };
    let ksm_at = |sleep_ms| System::KsmSleep {
        pages_to_scan: 100,
        sleep_ms,
    };
    let nohints = System::Pagesift {
        governor: Governor::Full,
        tuning: Tuning::NoHints,
    };
    // Equal CPU, as UKSM §8.1.2 compares: pagesift held to a little less
    // than ksmd takes at 100 pages per 100 ms (0.17 % of a core, 0.05
    // CPU-s over the quick window, in `pagesift bench --quick` on
    // 2026-12-03, this project's 2-CPU Xeon).
    let capped = System::Pagesift {
        governor: Governor::Full,
        tuning: Tuning::Capped(0.0015),
    };
    v.push(Experiment {
        name: "files".into(),
        group: "files",
        paper: "XLH Appendix B",
        about: format!(
            "{} processes each hold {} MiB of distinct pages and, at t = 0, read the same {} files of {} MiB (each under its own names, in its own shuffled order, with read, pread64 or preadv) into fresh page-aligned anonymous buffers; target = the file data of all readers but one; saved = Σ (Anonymous − Pss_Anon) of the readers",
            plan.readers, plan.private_mib, plan.files, plan.file_mib
        ),
        guests: None,
        interpreters: None,
        files: Some(plan),
        guest_files: None,
        workloads: Vec::new(),
        target: None,
        saved_by: SavedBy::Pss,
        systems: vec![
            pagesift,
            nohints,
            capped,
            ksm_at(20),
            ksm_at(100),
            ksm_at(200),
        ],
        window_s: window(30.0),
        reference: pagesift,
        goals: vec![
            GoalSpec {
                source: "XLH HTTPerf: > 8× KSM's saving at the same scan rate",
                goal: Goal::SaveAsMuch {
                    system: pagesift,
                    against: ksm_at(100),
                    min_saved_ratio: 8.0,
                    max_cpu_ratio: 1.0,
                },
            },
            GoalSpec {
                source: "XLH HTTPerf at equal CPU: pagesift held to ksmd's share",
                goal: Goal::SaveAsMuch {
                    system: capped,
                    against: ksm_at(100),
                    min_saved_ratio: 8.0,
                    max_cpu_ratio: 1.0,
                },
            },
            GoalSpec {
                source: "hints: file data merged sooner",
                goal: Goal::Sooner {
                    system: pagesift,
                    against: nohints,
                    fractions: [0.5, 0.9],
                    min_speedup: 2.0,
                    max_cpu_ratio: None,
                },
            },
        ],
    });
    // XLH's I/O hints for guests (issue 12): booted guests read the same
    // files from their own disk copies at t = 0, each in its own order.
    // Quick: 3 guests of 256 MiB (page-cache's quick size) and 16 MiB of
    // files, so that three boots and three windows stay near 5 minutes.
    let plan = GuestFilesPlan {
        guests: if full { 4 } else { 3 },
        mem_mib: if full { 512 } else { 256 },
        files: if full { 8 } else { 4 },
        file_mib: if full { 16 } else { 4 },
    };
    v.push(Experiment {
        name: GUEST_FILES.into(),
        group: GUEST_FILES,
        paper: "XLH §5.4, issue 12",
        about: format!(
            "{} QEMU/TCG guests of {} MiB, booted before t = 0, each with its own copy of an ext2 \
             disk image (virtio-blk, cache=writeback, aio=threads) holding {} files of {} MiB of \
             random bytes; at t = 0 every guest reads every file (md5sum, checked against the \
             host's), each in its own shuffled order (mem-merge=on for KSM, off for pagesift); \
             *file data* = the guest-RAM pages whose 4 KiB equal a page of the files, located \
             byte for byte once the guests have read them; saved (file data) = those copies less \
             the frames backing them (pagemap), counting only frames that back nothing but \
             copies of one file page; target = the copies less one per file page",
            plan.guests, plan.mem_mib, plan.files, plan.file_mib
        ),
        guests: None,
        interpreters: None,
        files: None,
        guest_files: Some(plan),
        workloads: Vec::new(),
        target: None,
        saved_by: SavedBy::FileData,
        systems: if full {
            vec![pagesift, nohints, ksm1000, ksm(100)]
        } else {
            vec![pagesift, nohints, ksm1000]
        },
        window_s: window(40.0),
        reference: pagesift,
        goals: vec![GoalSpec {
            source: "issue 12: file data in guest RAM merged ≥ 2× sooner with hints, at equal CPU",
            goal: Goal::Sooner {
                system: pagesift,
                against: nohints,
                fractions: [0.5, 0.9],
                min_speedup: 2.0,
                max_cpu_ratio: Some(1.0),
            },
        }],
    });
    v
}

/// The guest-files experiment's name.
pub const GUEST_FILES: &str = "guest-files";

impl Experiment {
    /// Whether it runs only when `--only` names it: the guest-files
    /// experiment boots its guests for every system and takes minutes, as
    /// page-cache, numa and hints-guest do.
    pub fn only_when_named(&self) -> bool {
        self.guest_files.is_some()
    }
}

/// The experiments `only` names (by name or group), in run order; an
/// unknown name is an error that lists the known ones.
pub fn select(all: Vec<Experiment>, only: &[String]) -> Result<Vec<Experiment>, String> {
    if only.is_empty() {
        return Ok(all.into_iter().filter(|e| !e.only_when_named()).collect());
    }
    for o in only {
        if !all.iter().any(|e| e.name == *o || e.group == o) {
            let mut names: Vec<&str> = all.iter().map(|e| e.group).collect();
            names.extend(all.iter().map(|e| e.name.as_str()));
            names.dedup();
            names.sort();
            names.dedup();
            return Err(format!(
                "--only: no experiment {o:?}; known: {}",
                names.join(", ")
            ));
        }
    }
    Ok(all
        .into_iter()
        .filter(|e| only.iter().any(|o| e.name == *o || e.group == o))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quick_and_full_hold_the_same_experiments() {
        let q = all(Mode::Quick);
        let f = all(Mode::Full);
        let names = |v: &[Experiment]| v.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&q), names(&f));
        // Names are unique, and every reference system runs.
        let mut n = names(&q);
        n.sort();
        n.dedup();
        assert_eq!(n.len(), q.len());
        for e in q.iter().chain(&f) {
            assert!(e.systems.contains(&e.reference), "{}", e.name);
            // A goal compares systems that both run.
            for g in &e.goals {
                let (system, against) = g.goal.systems();
                assert!(e.systems.contains(&system), "{}", e.name);
                assert!(e.systems.contains(&against), "{}", e.name);
            }
        }
    }

    #[test]
    fn full_is_the_issues_static_mixed() {
        let f = all(Mode::Full);
        let s = &f[0];
        assert_eq!(s.name, "static-mixed");
        assert_eq!(s.window_s, 120.0);
        assert!(s.workloads[0].windows(2).any(|w| w == ["--mib", "2048"]));
        assert!(s.workloads[0][0] == "static-dup" && s.workloads[1][0] == "random");
        let names: Vec<String> = s.systems.iter().map(|s| s.name()).collect();
        for want in [
            "pagesift-full",
            "pagesift-medium",
            "pagesift-low",
            "pagesift-quiet",
            "ksm-100",
            "ksm-1000",
            "ksm-2000",
            "ksm-10000",
            "ksm-advisor",
        ] {
            assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
        }
    }

    #[test]
    fn interpreter_workers_follow_issue_10() {
        for (mode, count, data, private) in [(Mode::Full, 6, 48, 16), (Mode::Quick, 4, 24, 8)] {
            let all = all(mode);
            let e = all
                .iter()
                .find(|e| e.name == "interpreter-workers")
                .unwrap();
            let p = e.interpreters.unwrap();
            assert_eq!(
                (p.count, p.data_mib, p.private_mib, p.write_every_ms),
                (count, data, private, 5)
            );
            assert!(e.workloads.is_empty() && e.guests.is_none());
            // The goal's 30 s must fit in the window.
            assert!(e.window_s >= 30.0);
            let names: Vec<String> = e.systems.iter().map(|s| s.name()).collect();
            assert!(names.contains(&"pagesift-full".to_string()));
            assert!(names.contains(&"ksm-1000".to_string()));
            assert!(matches!(
                e.goals[0].goal,
                Goal::ReachExact {
                    fraction: 0.9,
                    within_s: 30.0,
                    max_cpu_ratio: 0.5,
                    ..
                }
            ));
        }
    }

    #[test]
    fn guest_files_runs_only_when_named_with_hints_on_off_and_ksm() {
        for mode in [Mode::Quick, Mode::Full] {
            assert!(
                select(all(mode), &[])
                    .unwrap()
                    .iter()
                    .all(|e| e.name != GUEST_FILES),
                "the default run boots no guest-files guests"
            );
            let got = select(all(mode), &[GUEST_FILES.into()]).unwrap();
            assert_eq!(got.len(), 1);
            let e = &got[0];
            assert!(e.only_when_named() && e.saved_by == SavedBy::FileData);
            let p = e.guest_files.unwrap();
            assert!(p.guests >= 3 && p.files >= 4, "{p:?}");
            assert_eq!(p.target_pages(), (p.guests as u64 - 1) * p.file_pages());
            let names: Vec<String> = e.systems.iter().map(|s| s.name()).collect();
            for want in ["pagesift-full", "pagesift-full-nohints", "ksm-1000"] {
                assert!(names.iter().any(|n| n == want), "{want}: {names:?}");
            }
            assert!(matches!(
                e.goals[0].goal,
                Goal::Sooner {
                    min_speedup: 2.0,
                    max_cpu_ratio: Some(1.0),
                    ..
                }
            ));
        }
        // Every other experiment still runs by default.
        assert_eq!(
            select(all(Mode::Quick), &[]).unwrap().len(),
            all(Mode::Quick).len() - 1
        );
    }

    #[test]
    fn only_selects_by_name_or_group() {
        let got = select(
            all(Mode::Quick),
            &["cow-broken".into(), "sparse-only".into()],
        )
        .unwrap();
        let names: Vec<&str> = got.iter().map(|e| e.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "cow-broken-2pct",
                "cow-broken-10pct",
                "cow-broken-20pct",
                "sparse-only"
            ]
        );
        let one = select(all(Mode::Quick), &["static-mixed".into()]).unwrap();
        assert_eq!(one.len(), 1);
        let e = select(all(Mode::Quick), &["nope".into()]).unwrap_err();
        assert!(e.contains("nope") && e.contains("fork-family"), "{e}");
    }
}
