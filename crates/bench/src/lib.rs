//! # pagesift-bench: `pagesift bench`
//!
//! Reproduces the UKSM paper's emulated-workload evaluation (FAST '18 §8.1)
//! on this machine, running pagesift, the kernel's KSM at several settings
//! and ksmtuned side by side in one run, and writes CSV series, PNG plots
//! and a markdown report.
//!
//! ## How a benchmark runs, before the code
//!
//! 1. **Preflight** ([`preflight`]): root, KSM, ksmd and the binaries must
//!    be there; whatever is missing is named.
//! 2. **Termination watch**: SIGINT/SIGTERM set a flag the run loop polls
//!    every sample; the run then stops its children (own process groups,
//!    [`procs::Spawned`]) and restores KSM ([`run::clean_slate`] and the
//!    `KsmGuard`s). If the loop were stuck, `TerminationWatch` restores KSM
//!    after a grace period and the children die with the harness
//!    (parent-death signal).
//! 3. **Experiments** ([`experiment`]) one after the other; each runs every
//!    system on a fresh copy of its workload ([`run::run_one`]), sampled by
//!    [`sampler::Sampler`] at 4 Hz.
//! 4. **Output** after every experiment (so an interrupted run keeps what
//!    it finished): CSV per series, plots, `report.md` ([`report`]),
//!    `results.json`; at the end, optionally, the generated section of
//!    docs/benchmarks.md.

pub mod cgroups;
pub mod cycles;
pub mod experiment;
pub mod files;
pub mod guest;
pub mod guest_files;
pub mod hints_guest;
pub mod interpreters;
pub mod ksmtuned;
pub mod measure;
pub mod numa;
pub mod page_cache;
pub mod plot;
pub mod procs;
pub mod random_file;
pub mod report;
pub mod run;
pub mod sampler;
pub mod series;
pub mod system;

use experiment::{Experiment, Mode};
use pagesift_linux::ksm::{KsmError, TerminationWatch};
use pagesift_linux::{Capability, LinuxError};
use report::{ExperimentResult, Header, Row};
use serde::Serialize;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Why a benchmark could not run or finish.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Not root, or a capability is missing.
    #[error("pagesift bench needs root: {0}")]
    NotRoot(String),
    /// A tool, binary or kernel feature is missing.
    #[error("missing: {0}")]
    Missing(String),
    /// KSM refused something.
    #[error("KSM: {0}")]
    Ksm(String),
    /// A /proc read failed.
    #[error(transparent)]
    Linux(#[from] LinuxError),
    /// A child could not be started.
    #[error("cannot start {0}")]
    Spawn(String),
    /// A workload failed.
    #[error("workload: {0}")]
    Workload(String),
    /// A system under test failed during its run.
    #[error("{0}")]
    System(String),
    /// Output could not be written.
    #[error("cannot write {0}")]
    Output(String),
    /// A bad option.
    #[error("{0}")]
    Usage(String),
    /// SIGINT or SIGTERM arrived; everything was stopped and KSM restored.
    #[error("interrupted: every workload and daemon was stopped and KSM's settings restored")]
    Interrupted,
}

impl From<KsmError> for BenchError {
    fn from(e: KsmError) -> Self {
        match e {
            KsmError::NoKsm(_) => BenchError::Missing(e.to_string()),
            KsmError::NotRoot { .. } => BenchError::NotRoot(e.to_string()),
            KsmError::Closed => BenchError::Interrupted,
            e => BenchError::Ksm(e.to_string()),
        }
    }
}

impl BenchError {
    /// The process exit code: 2 usage, 130 interrupted, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            BenchError::Usage(_) => 2,
            BenchError::Interrupted => 130,
            _ => 1,
        }
    }
}

/// Progress lines on stderr: the experiment, the system, elapsed time.
#[derive(Debug)]
pub struct Progress {
    tty: bool,
    quiet: bool,
    start: Instant,
}

impl Progress {
    /// Progress on stderr (rewritten in place on a terminal); `quiet`
    /// prints nothing.
    pub fn new(quiet: bool) -> Progress {
        Progress {
            tty: std::io::stderr().is_terminal(),
            quiet,
            start: Instant::now(),
        }
    }

    /// How often a run reports its status.
    pub fn every(&self) -> Duration {
        Duration::from_secs(if self.tty { 1 } else { 10 })
    }

    fn elapsed(&self) -> String {
        let s = self.start.elapsed().as_secs();
        format!("[{:02}:{:02}]", s / 60, s % 60)
    }

    /// A line that stays.
    pub fn note(&self, msg: &str) {
        self.print(msg, true);
    }

    /// A status line (overwritten by the next on a terminal).
    pub fn status(&self, msg: &str) {
        self.print(msg, false);
    }

    fn print(&self, msg: &str, stays: bool) {
        if self.quiet {
            return;
        }
        // On a terminal: clear the status line first; a status line ends
        // without a newline so the next one overwrites it.
        let clear = if self.tty { "\r\x1b[2K" } else { "" };
        let end = if self.tty && !stays { "" } else { "\n" };
        let mut e = std::io::stderr().lock();
        let _ = write!(e, "{clear}{} {msg}{end}", self.elapsed());
        let _ = e.flush();
    }
}

/// What every run needs.
#[derive(Debug)]
pub struct Context {
    /// The `pagesift` binary (for `pagesift run`).
    pub pagesift_bin: PathBuf,
    /// The `pagesift-workload` binary.
    pub workload_bin: PathBuf,
    /// Arguments before the workload's own (`["workload"]` when
    /// `workload_bin` is the `pagesift` binary itself).
    pub workload_prefix: Vec<String>,
    /// Scratch files (daemon configs, sockets).
    pub work_dir: PathBuf,
    /// Daemon logs.
    pub log_dir: PathBuf,
    /// SIGINT/SIGTERM.
    pub term: TerminationWatch,
    /// Sampling interval.
    pub interval: Duration,
    /// How long to wait for KSM's lock when someone else holds it.
    pub ksm_wait: Duration,
    /// Progress output.
    pub progress: Progress,
    /// Where the guest image is built (and guests' serial logs go).
    pub guest_dir: PathBuf,
    /// The guest image, built on first use.
    pub guest_image: std::cell::OnceCell<guest::GuestImage>,
    /// The guest-files experiment's image and files, built on first use.
    pub guest_files_image: std::cell::OnceCell<guest_files::GuestFilesImage>,
    /// Time spent waiting for KSM's lock so far.
    pub lock_wait: std::cell::Cell<Duration>,
    /// With `--repeat`: the run under way (1, 2, …), which names its
    /// daemon log so that each run keeps its own.
    pub repetition: std::cell::Cell<Option<usize>>,
}

impl Context {
    /// Counts time spent waiting for KSM's lock (another KSM user).
    pub fn add_lock_wait(&self, d: Duration) {
        self.lock_wait.set(self.lock_wait.get() + d);
    }

    /// The interpreter workers' data file in the scratch directory,
    /// written the first time it is asked for (one per invocation).
    pub fn interpreter_data(
        &self,
        plan: &interpreters::InterpreterPlan,
    ) -> Result<PathBuf, BenchError> {
        let path = self.work_dir.join(plan.data_file_name());
        if !path.is_file() {
            self.progress.note(&format!(
                "writing {} MiB of random data to {}",
                plan.data_mib,
                path.display()
            ));
        }
        interpreters::data_file(&self.work_dir, plan)
    }

    /// The guest-files experiment's image (its files on the disk), built
    /// the first time it is asked for.
    pub fn guest_files_image(
        &self,
        plan: &experiment::GuestFilesPlan,
    ) -> Result<&guest_files::GuestFilesImage, BenchError> {
        if let Some(i) = self.guest_files_image.get() {
            return Ok(i);
        }
        let dir = self.guest_dir.join(experiment::GUEST_FILES);
        self.progress.note(&format!(
            "writing {} files of {} MiB and the guest-files image in {}",
            plan.files,
            plan.file_mib,
            dir.display()
        ));
        let image = guest_files::build_image(&dir, &self.work_dir, plan)?;
        Ok(self.guest_files_image.get_or_init(|| image))
    }

    /// The guest image, built the first time it is asked for.
    pub fn guest_image(&self) -> Result<&guest::GuestImage, BenchError> {
        if let Some(i) = self.guest_image.get() {
            return Ok(i);
        }
        self.progress.note(&format!(
            "building the guest image in {}",
            self.guest_dir.display()
        ));
        let image = guest::GuestImage::build(&self.guest_dir).map_err(|e| match e {
            guest::GuestError::Missing { .. } | guest::GuestError::Unsuitable(_) => {
                BenchError::Missing(e.to_string())
            }
            e => BenchError::System(e.to_string()),
        })?;
        Ok(self.guest_image.get_or_init(|| image))
    }
}

/// Options of `pagesift bench`.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Quick or full sizes.
    pub mode: Mode,
    /// Experiments by name or group (empty: all).
    pub only: Vec<String>,
    /// Systems by name (empty: each experiment's own list).
    pub systems: Vec<String>,
    /// Output directory.
    pub out: PathBuf,
    /// Also write the report into this docs file between the bench markers.
    pub write_docs: Option<PathBuf>,
    /// The `pagesift` binary.
    pub pagesift_bin: PathBuf,
    /// The `pagesift-workload` binary.
    pub workload_bin: PathBuf,
    /// Arguments before the workload's own: `["workload"]` when
    /// `workload_bin` is the `pagesift` binary, whose hidden `workload`
    /// subcommand runs the same code (so `cargo run -p pagesift` suffices).
    pub workload_prefix: Vec<String>,
    /// Sampling interval (≤ 500 ms: the issue asks for ≥ 2 Hz).
    pub interval: Duration,
    /// The command line, for the report.
    pub command_line: String,
    /// Experiments to run instead of the built-in ones (tests).
    pub experiments: Option<Vec<Experiment>>,
    /// No progress output.
    pub quiet: bool,
    /// Runs of every experiment (≥ 1), its systems interleaved.
    pub repeat: u32,
}

impl BenchOptions {
    /// Options with the defaults: quick, everything, `out` as given, 250 ms.
    pub fn new(out: PathBuf, pagesift_bin: PathBuf, workload_bin: PathBuf) -> BenchOptions {
        BenchOptions {
            mode: Mode::Quick,
            only: Vec::new(),
            systems: Vec::new(),
            out,
            write_docs: None,
            pagesift_bin,
            workload_bin,
            workload_prefix: Vec::new(),
            interval: Duration::from_millis(250),
            command_line: "pagesift bench".into(),
            experiments: None,
            quiet: false,
            repeat: 1,
        }
    }
}

/// What `pagesift bench --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Machine, date, command.
    pub header: Header,
    /// Per experiment, its table.
    pub experiments: Vec<ExperimentSummary>,
    /// The output directory.
    pub out: PathBuf,
}

/// One experiment's table, for JSON.
#[derive(Clone, Debug, Serialize)]
pub struct ExperimentSummary {
    /// Its name.
    pub name: String,
    /// The reference system.
    pub reference: String,
    /// The rows.
    pub rows: Vec<Row>,
    /// Its goals, judged on the first run.
    pub goals: Vec<report::Verdict>,
    /// With `--repeat`: the goals judged on every run, first run first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub goals_by_run: Vec<Vec<report::Verdict>>,
}

/// Checks what a run needs and names what is missing.
pub fn preflight(opts: &BenchOptions, experiments: &[Experiment]) -> Result<(), BenchError> {
    for cap in [Capability::SysAdmin, Capability::SysPtrace] {
        if !pagesift_linux::caps::has(cap) {
            return Err(BenchError::NotRoot(format!(
                "{cap} is missing (run it as root: it changes /sys/kernel/mm/ksm, and the \
                 daemon reads and advises other processes)"
            )));
        }
    }
    pagesift_linux::ksm::Ksm::open()?;
    pagesift_linux::ksm::Ksmd::find()?;
    for (what, p) in [
        ("the pagesift binary", &opts.pagesift_bin),
        (
            "the pagesift-workload binary (cargo build -p pagesift-workload)",
            &opts.workload_bin,
        ),
    ] {
        if !p.is_file() {
            return Err(BenchError::Missing(format!(
                "{what}: {} not found",
                p.display()
            )));
        }
    }
    if experiments
        .iter()
        .any(|e| e.systems.contains(&system::System::Ksmtuned))
        && !Path::new(ksmtuned::KSMTUNED).is_file()
    {
        return Err(BenchError::Missing(format!(
            "{} (Debian package ksmtuned; scripts/setup installs it), needed for the ksmtuned \
             runs (or leave them out with --systems)",
            ksmtuned::KSMTUNED
        )));
    }
    if experiments.iter().any(|e| e.interpreters.is_some()) {
        interpreters::check_python()?;
    }
    if experiments
        .iter()
        .any(|e| e.guests.is_some() || e.guest_files.is_some())
    {
        guest::HostTools::find().map_err(|e| BenchError::Missing(e.to_string()))?;
        if guest::host::find_in_path("mke2fs").is_none() {
            return Err(BenchError::Missing(
                "mke2fs (Debian package e2fsprogs; scripts/setup installs it), needed for the \
                 guests' disk image"
                    .into(),
            ));
        }
    }
    Ok(())
}

fn create_dir(p: &Path) -> Result<(), BenchError> {
    std::fs::create_dir_all(p).map_err(|e| BenchError::Output(format!("{}: {e}", p.display())))
}

fn write_file(p: &Path, text: &str) -> Result<(), BenchError> {
    std::fs::write(p, text).map_err(|e| BenchError::Output(format!("{}: {e}", p.display())))
}

/// Runs the benchmark: every selected experiment and system, then the
/// report. See the module header.
pub fn run(opts: &BenchOptions) -> Result<Summary, BenchError> {
    if opts.interval.is_zero() || opts.interval > Duration::from_millis(500) {
        return Err(BenchError::Usage(
            "the sampling interval must be between 1 and 500 ms (≥ 2 Hz)".into(),
        ));
    }
    let page_cache = opts.only.iter().any(|o| o == "page-cache");
    let alone = [numa::EXPERIMENT, hints_guest::EXPERIMENT];
    if opts.repeat > 1 && opts.only.iter().any(|o| alone.contains(&o.as_str())) {
        return Err(BenchError::Usage(
            "--repeat applies to the experiments that compare systems; numa and hints-guest \
             run once"
                .into(),
        ));
    }
    if page_cache && (opts.only.len() > 1 || !opts.systems.is_empty()) {
        return Err(BenchError::Usage(
            "--only page-cache runs alone (its three systems are fixed)".into(),
        ));
    }
    // The hints-guest experiment boots its own guest: it runs on its own.
    if opts.only.iter().any(|o| o == hints_guest::EXPERIMENT) && opts.experiments.is_none() {
        if opts.only.len() > 1 || !opts.systems.is_empty() {
            return Err(BenchError::Usage(
                "--only hints-guest runs on its own (it boots its own guest and times the I/O \
                 hint program under each hook): leave out the other --only and --systems"
                    .into(),
            ));
        }
        return hints_guest::run(opts);
    }
    // The NUMA experiment boots its own two-node guest: it runs on its own.
    if opts.only.iter().any(|o| o == numa::EXPERIMENT) && opts.experiments.is_none() {
        if opts.only.len() > 1 || !opts.systems.is_empty() {
            return Err(BenchError::Usage(
                "--only numa runs on its own (it boots its own two-node guest and compares KSM \
                 alone with pagesift's placement policies): leave out the other --only and \
                 --systems"
                    .into(),
            ));
        }
        return numa::run(opts);
    }
    let mut experiments = match &opts.experiments {
        Some(e) => e.clone(),
        None if page_cache => Vec::new(),
        None => {
            experiment::select(experiment::all(opts.mode), &opts.only).map_err(BenchError::Usage)?
        }
    };
    if !opts.systems.is_empty() {
        for e in &mut experiments {
            e.systems.retain(|s| opts.systems.contains(&s.name()));
        }
        experiments.retain(|e| !e.systems.is_empty());
        if experiments.is_empty() {
            return Err(BenchError::Usage(format!(
                "--systems {}: no selected experiment runs any of them",
                opts.systems.join(",")
            )));
        }
    }
    preflight(opts, &experiments)?;
    let term = TerminationWatch::install(Duration::from_secs(60))?;
    create_dir(&opts.out)?;
    let log_dir = opts.out.join("logs");
    create_dir(&log_dir)?;
    let work_dir = std::env::temp_dir().join(format!("pagesift-bench-{}", std::process::id()));
    create_dir(&work_dir)?;
    let ctx = Context {
        pagesift_bin: opts.pagesift_bin.clone(),
        workload_bin: opts.workload_bin.clone(),
        workload_prefix: opts.workload_prefix.clone(),
        work_dir: work_dir.clone(),
        log_dir,
        term,
        interval: opts.interval,
        ksm_wait: Duration::from_secs(900),
        progress: Progress::new(opts.quiet),
        guest_dir: opts.out.join("guests"),
        guest_image: std::cell::OnceCell::new(),
        guest_files_image: std::cell::OnceCell::new(),
        lock_wait: std::cell::Cell::new(Duration::ZERO),
        repetition: std::cell::Cell::new(None),
    };
    let result = if page_cache {
        run_page_cache(&ctx, opts)
    } else {
        run_all(&ctx, opts, &experiments)
    };
    let _ = std::fs::remove_dir_all(&work_dir);
    result
}

/// `--only page-cache` ([`page_cache`]): its own table and goals, written
/// like the other experiments' (report.md, results.json, csv/, docs).
fn run_page_cache(ctx: &Context, opts: &BenchOptions) -> Result<Summary, BenchError> {
    let t0 = Instant::now();
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let before = pagesift_linux::procstat::machine().load_average;
    let outcome = page_cache::run(ctx, opts.mode, opts.repeat as usize)?;
    let section = outcome.section;
    report::write_csv(&opts.out, &outcome.runs[0])?;
    let h = header(opts, started, t0, before, ctx.lock_wait.get());
    let head = report::markdown(&h, &[], false);
    write_file(
        &opts.out.join("report.md"),
        &format!("# pagesift bench report\n\n{head}\n{section}"),
    )?;
    let summary = Summary {
        header: h,
        experiments: vec![ExperimentSummary {
            name: "page-cache".into(),
            reference: page_cache::PageCachePlan::systems()[0].name(),
            rows: Vec::new(),
            goals: outcome.goals[0].clone(),
            goals_by_run: if outcome.goals.len() > 1 {
                outcome.goals
            } else {
                Vec::new()
            },
        }],
        out: opts.out.clone(),
    };
    let json = serde_json::to_string_pretty(&summary).expect("a summary serializes");
    write_file(&opts.out.join("results.json"), &json)?;
    write_docs_section(
        opts,
        "Singleton §4's page-cache experiment",
        &format!("{head}\n{section}"),
    )?;
    ctx.progress.note(&format!(
        "done in {:.0} s: {}",
        t0.elapsed().as_secs_f64(),
        opts.out.join("report.md").display()
    ));
    Ok(summary)
}

/// Ends an experiment that boots its own guest and writes its own report
/// (numa, hints-guest): report.md in the output directory and, when
/// asked, its section of the docs file (titled `title`), then the closing
/// progress line.
pub(crate) fn finish_own_report(
    opts: &BenchOptions,
    progress: &Progress,
    t0: Instant,
    header: report::Header,
    title: &str,
    body: &str,
) -> Result<Summary, BenchError> {
    let h = &header;
    let first = format!(
        "Generated by `{}` ({} mode) on {}, {:.0} s in all. Host: {}, {} CPUs, {:.1} GiB RAM, Linux {}; load average before {:.2}, after {:.2}.\n",
        h.command,
        h.mode,
        h.started,
        h.wall_s,
        h.cpu_model,
        h.cpus,
        h.ram_gib,
        h.kernel,
        h.load_before[0],
        h.load_after[0]
    );
    let text = format!("# pagesift bench report\n\n{first}\n{body}");
    write_file(&opts.out.join("report.md"), &text)?;
    write_docs_section(opts, title, &format!("{first}\n{body}"))?;
    progress.note(&format!(
        "done in {:.0} s: {}",
        t0.elapsed().as_secs_f64(),
        opts.out.join("report.md").display()
    ));
    Ok(Summary {
        header,
        experiments: Vec::new(),
        out: opts.out.clone(),
    })
}

/// "Goals:" and one line a goal, judged: (goal, met, evidence), `None`
/// for not judged (the guest experiments' reports).
pub(crate) fn goal_list(goals: &[(String, Option<bool>, String)]) -> String {
    let mut s = String::from("\nGoals:\n\n");
    for (goal, met, evidence) in goals {
        let verdict = match met {
            Some(true) => "met",
            Some(false) => "**not met**",
            None => "not judged",
        };
        s.push_str(&format!("- {goal}: {verdict} ({evidence}).\n"));
    }
    s
}

/// With `--write-docs`, puts `text` into the docs file as this
/// invocation's section (between its markers, [`docs_key`]), headed
/// "pagesift bench (KEY): `title`".
fn write_docs_section(opts: &BenchOptions, title: &str, text: &str) -> Result<(), BenchError> {
    let Some(doc) = &opts.write_docs else {
        return Ok(());
    };
    let old = std::fs::read_to_string(doc)
        .map_err(|e| BenchError::Output(format!("{}: {e}", doc.display())))?;
    let key = docs_key(opts);
    let section = format!(
        "## pagesift bench ({}): {title}\n\n{text}",
        key.trim_start_matches("bench-"),
    );
    write_file(doc, &report::splice_docs(&old, &key, &section))
}

/// The docs section an invocation writes: `bench-quick`, `bench-full`,
/// or with `--only`/`--systems` e.g. `bench-full-static-mixed`.
pub fn docs_key(opts: &BenchOptions) -> String {
    let mut key = match opts.mode {
        Mode::Quick => "bench-quick".to_string(),
        Mode::Full => "bench-full".to_string(),
    };
    for part in opts.only.iter().chain(&opts.systems) {
        key.push('-');
        key.extend(
            part.chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '-'),
        );
    }
    key
}

fn header(
    opts: &BenchOptions,
    started: String,
    t0: Instant,
    before: [f64; 3],
    lock_wait: Duration,
) -> Header {
    let m = pagesift_linux::procstat::machine();
    Header {
        command: opts.command_line.clone(),
        mode: match opts.mode {
            Mode::Quick => "quick",
            Mode::Full => "full",
        }
        .into(),
        started,
        wall_s: t0.elapsed().as_secs_f64(),
        lock_wait_s: lock_wait.as_secs_f64(),
        cpu_model: m.cpu_model,
        cpus: m.cpus,
        ram_gib: m.mem_total_kib as f64 / (1024.0 * 1024.0),
        kernel: m.kernel,
        load_before: before,
        load_after: m.load_average,
        interval_s: opts.interval.as_secs_f64(),
        debug_build: cfg!(debug_assertions),
        repeat: opts.repeat.max(1),
    }
}

fn run_all(
    ctx: &Context,
    opts: &BenchOptions,
    experiments: &[Experiment],
) -> Result<Summary, BenchError> {
    let t0 = Instant::now();
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let before = pagesift_linux::procstat::machine().load_average;
    let repeat = opts.repeat.max(1) as usize;
    let total: usize = experiments.iter().map(|e| e.systems.len()).sum::<usize>() * repeat;
    let mut done = 0;
    let mut results: Vec<ExperimentResult> = Vec::new();
    let mut summary = Summary {
        header: header(opts, started.clone(), t0, before, ctx.lock_wait.get()),
        experiments: Vec::new(),
        out: opts.out.clone(),
    };
    for e in experiments {
        // Repetitions interleave the systems (A, B, A, B), so that a drift
        // of the machine's load falls on both rather than on one.
        let mut by_run: Vec<Vec<run::RunResult>> = Vec::new();
        for k in 0..repeat {
            let mut runs = Vec::new();
            for &s in &e.systems {
                done += 1;
                let of = if repeat > 1 {
                    format!(", run {} of {repeat}", k + 1)
                } else {
                    String::new()
                };
                ctx.progress.note(&format!(
                    "run {done}/{total}: {} · {} ({:.0} s window{of})",
                    e.name,
                    s.name(),
                    e.window_s
                ));
                ctx.repetition.set((repeat > 1).then_some(k + 1));
                match run::run_one(ctx, e, s) {
                    Ok(r) => runs.push(r),
                    Err(err @ BenchError::System(_)) => {
                        // The system under test failed: say so in its row and go on.
                        ctx.progress
                            .note(&format!("{} · {}: FAILED: {err}", e.name, s.name()));
                        runs.push(run::RunResult {
                            experiment: e.name.clone(),
                            system: s.name(),
                            series: Vec::new(),
                            target_pages: None,
                            saved_by: e.saved_by,
                            fill_seconds: 0.0,
                            window_s: e.window_s,
                            notes: vec![format!("FAILED: {err}")],
                            cycles: Vec::new(),
                        });
                    }
                    Err(err) => return Err(err),
                }
            }
            by_run.push(runs);
        }
        let runs = by_run.remove(0);
        let mut r = ExperimentResult {
            experiment: e.clone(),
            runs,
            repeats: by_run,
            plots: Vec::new(),
        };
        report::write_csv(&opts.out, &r.runs)?;
        r.plots = plots::write(&opts.out, &r)?;
        results.push(r);
        summary.header = header(opts, started.clone(), t0, before, ctx.lock_wait.get());
        let text = format!(
            "# pagesift bench report\n\n{}",
            report::markdown(&summary.header, &results, true)
        );
        write_file(&opts.out.join("report.md"), &text)?;
    }
    summary.experiments = results
        .iter()
        .map(|r| ExperimentSummary {
            name: r.experiment.name.clone(),
            reference: r.experiment.reference.name(),
            rows: report::rows(&r.runs, &r.experiment.reference.name()),
            goals: report::verdicts(&r.experiment, &r.runs),
            goals_by_run: if r.repeats.is_empty() {
                Vec::new()
            } else {
                std::iter::once(&r.runs)
                    .chain(&r.repeats)
                    .map(|runs| report::verdicts(&r.experiment, runs))
                    .collect()
            },
        })
        .collect();
    let json = serde_json::to_string_pretty(&summary).expect("a summary serializes");
    write_file(&opts.out.join("results.json"), &json)?;
    write_docs_section(
        opts,
        "UKSM §8.1–8.2's experiments against the kernel's KSM",
        &report::markdown(&summary.header, &results, false),
    )?;
    ctx.progress.note(&format!(
        "done in {:.0} s ({:.0} s of it waiting for other KSM users): {}",
        t0.elapsed().as_secs_f64(),
        ctx.lock_wait.get().as_secs_f64(),
        opts.out.join("report.md").display()
    ));
    Ok(summary)
}

/// The experiment's charts, laid out like UKSM's Figure 9.
mod plots {
    use super::*;
    use crate::experiment::SavedBy;
    use crate::sampler::metric;

    /// Writes `plots/<exp>-saved.png` (9a), `-cpu.png` (9b) and
    /// `-saved-vs-cpu.png` (9c); returns their paths relative to `dir`.
    pub fn write(dir: &Path, r: &ExperimentResult) -> Result<Vec<String>, BenchError> {
        let e = &r.experiment;
        let (saved, what) = match e.saved_by {
            SavedBy::KsmCounters => (metric::SAVED, "KSM counters"),
            SavedBy::Pss => (metric::SAVED_PSS, "Σ (Anonymous − Pss_Anon) growth"),
            SavedBy::FileData => (
                metric::FILE_SAVED,
                "file data in guest RAM: its copies less their frames",
            ),
        };
        let pick = |m: &str| -> Vec<&series::Series> {
            r.runs.iter().filter_map(|x| x.series(m)).collect()
        };
        let err = |e: plot::PlotError| BenchError::Output(e.to_string());
        let mut out = Vec::new();
        let rel = |s: &str| format!("plots/{}-{s}.png", e.name);
        let p = rel("saved");
        plot::line_chart(
            &dir.join(&p),
            &format!("{}: memory saved ({what})", e.name),
            "time since start [s]",
            "saved [MiB]",
            &pick(saved),
        )
        .map_err(err)?;
        out.push(p);
        if e.saved_by == SavedBy::FileData {
            // Beside the file data: everything the guests have in common.
            let p = rel("saved-pss");
            plot::line_chart(
                &dir.join(&p),
                &format!(
                    "{}: memory saved in the QEMU processes (Σ (Anonymous − Pss_Anon) growth)",
                    e.name
                ),
                "time since start [s]",
                "saved [MiB]",
                &pick(metric::SAVED_PSS),
            )
            .map_err(err)?;
            out.push(p);
        }
        let p = rel("cpu");
        plot::line_chart(
            &dir.join(&p),
            &format!("{}: CPU of the deduplicating system", e.name),
            "time since start [s]",
            "CPU [% of one core]",
            &pick(metric::CPU_PERCENT),
        )
        .map_err(err)?;
        out.push(p);
        let points: Vec<(String, f64, f64)> = r
            .runs
            .iter()
            .filter(|x| !x.series.is_empty())
            .map(|x| {
                let f = report::Figures::of(x);
                (x.system.clone(), f.cpu_window_s, f.saved_pss_mean_mib)
            })
            .collect();
        let p = rel("saved-vs-cpu");
        plot::scatter_chart(
            &dir.join(&p),
            &format!("{}: saving vs CPU over {:.0} s", e.name, e.window_s),
            "CPU-seconds over the window",
            "saved, PSS, mean of 2nd half [MiB]",
            &points,
        )
        .map_err(err)?;
        out.push(p);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_invocation_kind_has_its_docs_section() {
        let mut o = BenchOptions::new("out".into(), "p".into(), "w".into());
        assert_eq!(docs_key(&o), "bench-quick");
        o.mode = Mode::Full;
        o.only = vec!["static-mixed".into()];
        assert_eq!(docs_key(&o), "bench-full-static-mixed");
        o.systems = vec!["ksm-paced@2%".into()];
        assert_eq!(docs_key(&o), "bench-full-static-mixed-ksm-paced2");
    }
}
