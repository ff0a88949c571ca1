//! `pagesift`: the command-line front end. Argument parsing and output only;
//! the algorithms live in `pagesift-core`, the system access in
//! `pagesift-linux`.

mod demo;

use clap::{Args, Parser, Subcommand};
use pagesift_core::pipeline::governor::Governor;
use pagesift_core::research::sim::{Kind, SimConfig, Simulation};
use pagesift_daemon::run::{RunError, RunOptions};
use pagesift_linux::ProcessFilter;
use pagesift_scan::exact::ExactOptions;
use pagesift_scan::report::{Report, ScanError, TableOptions};
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Parser)]
#[command(name = "pagesift", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// A guided run on a built-in workload: starts two processes, one with
    /// 512 MiB of identical pages and one with 512 MiB of random pages, runs
    /// the daemon on them alone, shows memory saved and CPU used live, then
    /// a summary; stops them and restores KSM's settings. Needs root and a
    /// kernel with KSM.
    ///
    /// Exit codes: 0 done, 1 something missing (named) or a check failed,
    /// 2 usage error, 130 interrupted (after cleaning up).
    Demo(demo::DemoArgs),
    /// The built-in workloads (`pagesift-workload`'s command line), for
    /// `pagesift demo`.
    #[command(hide = true, disable_help_flag = true)]
    Workload {
        /// The workload's arguments.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<OsString>,
    },
    /// Time the I/O hint program's cost on a process re-reading a cached
    /// file (pread64 calls of each `--call-bytes`, 4 KiB and 64 KiB by
    /// default): without it, attached but not watching, and watching (the
    /// bench's measurement, for a guest's kernel). Needs root.
    #[command(hide = true)]
    HintOverhead {
        /// Where to write the file read.
        #[arg(long, value_name = "DIR")]
        dir: PathBuf,
        /// Its size.
        #[arg(long, default_value_t = 16)]
        mib: u64,
        /// The hook: fexit or sys-exit (default: what `auto` takes).
        #[arg(long)]
        hook: Option<String>,
        /// The pread64 call sizes to time, in bytes, comma-separated (a
        /// call under a page brings no hint: the program's cheapest path).
        #[arg(long, value_delimiter = ',', default_values_t = pagesift_bench::files::CALL_BYTES,
              value_parser = clap::value_parser!(u64).range(1..))]
        call_bytes: Vec<u64>,
        /// One JSON object per call size, one a line.
        #[arg(long)]
        json: bool,
    },
    /// Show on which NUMA node each process's merged (KSM) and unmerged
    /// anonymous pages are (reads only; needs root).
    Numa {
        /// The processes.
        #[arg(required = true)]
        pids: Vec<u32>,
        /// One JSON object per process, one a line.
        #[arg(long)]
        json: bool,
    },
    /// Run the distilling algorithms on a simulated machine with the four
    /// region kinds of the UKSM paper (static, sparse, COW-broken,
    /// short-lived) and show how their regions move through the levels.
    Simulate {
        /// Seed of the simulated machine and of the sampler.
        #[arg(long, default_value_t = 1)]
        seed: u64,
        /// Simulated seconds to run.
        #[arg(long, default_value_t = 20.0)]
        seconds: f64,
        /// CPU governor: full, medium, low or quiet.
        #[arg(long, default_value = "full")]
        governor: Governor,
        /// Regions of each kind.
        #[arg(long, default_value_t = 4)]
        regions: usize,
        /// Pages per region.
        #[arg(long, default_value_t = 4096)]
        pages: u32,
        /// One JSON object per wake-up instead of the table.
        #[arg(long)]
        json: bool,
    },
    /// Run the deduplicating daemon in the foreground: sample eligible
    /// processes, mark the ranges worth merging mergeable in their owner,
    /// pace ksmd, and back out of ranges that thrash. Needs root. SIGTERM
    /// or SIGINT stops it and restores KSM's settings; SIGHUP reloads the
    /// config.
    Run {
        /// Configuration file (TOML). Default: /etc/pagesift/pagesift.toml if
        /// it exists, else built-in defaults.
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// CPU governor: full, medium, low or quiet (overrides the config).
        #[arg(long)]
        governor: Option<Governor>,
        /// Serve Prometheus metrics on HOST:PORT, or PORT for 127.0.0.1.
        #[arg(long, value_name = "ADDR")]
        metrics: Option<String>,
        /// Status socket (overrides the config; default /run/pagesift.sock).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Only these processes are eligible (repeatable); the config's
        /// [ineligible] lists still apply.
        #[arg(long = "pid", value_name = "PID")]
        pids: Vec<u32>,
        /// On exit, unmark every range pagesift marked, which unmerges its
        /// pages. Without it merged pages stay merged.
        #[arg(long)]
        unmerge_on_exit: bool,
        /// Stop by itself after this many seconds.
        #[arg(long = "for", value_name = "SECONDS")]
        duration: Option<f64>,
        /// How long to wait for KSM if another owner (another daemon, a
        /// test) holds it.
        #[arg(long, value_name = "SECONDS", default_value_t = 30.0)]
        ksm_wait: f64,
        /// Log format.
        #[arg(long, value_enum, default_value_t = LogFormat::Text)]
        log_format: LogFormat,
    },
    /// Show what the running daemon is doing: governor, levels and their
    /// regions, top regions by saving, pages merged, COW breaks, ksmd and
    /// daemon CPU, processes skipped and why.
    Status {
        /// The daemon's status socket. Default: the one the config names
        /// (/run/pagesift.sock unless changed).
        #[arg(long, value_name = "PATH")]
        socket: Option<PathBuf>,
        /// Configuration file to take the socket from.
        #[arg(long, value_name = "PATH")]
        config: Option<PathBuf>,
        /// The status as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Run a command with PR_SET_MEMORY_MERGE set, so that KSM may merge all
    /// of its memory and its children's (for hosts that do not allow
    /// ptrace). The command's exit status is pagesift's.
    Exec {
        /// The command and its arguments (after `--`).
        #[arg(
            required = true,
            trailing_var_arg = true,
            allow_hyphen_values = true,
            value_name = "CMD"
        )]
        command: Vec<OsString>,
    },
    /// Measure how much deduplication would save on this machine, per
    /// process and per region, read-only. Needs root (CAP_SYS_ADMIN for
    /// page frame numbers, CAP_SYS_PTRACE to read other processes).
    ///
    /// Exit codes: 0 done, 1 runtime error (missing capability, no such
    /// pid), 2 usage error.
    Scan(ScanArgs),
    /// Run UKSM §8.1's experiments and a scaled VM boot (§8.2.1) with
    /// pagesift, the kernel's KSM and ksmtuned side by side; write CSV
    /// series, plots and a report. Needs root; restores KSM's settings and
    /// stops every process it started, also on Ctrl-C.
    Bench(BenchArgs),
}

/// Options of `pagesift bench`.
#[derive(Args, Debug)]
struct BenchArgs {
    /// Smaller sizes and shorter windows: all experiments in ≤ 10 minutes
    /// (the default).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// The experiments' full sizes (2 GiB + 2 GiB static-mixed, ...), 120 s
    /// windows, more systems (all ten on static-mixed and sparse-only).
    #[arg(long)]
    full: bool,
    /// Only these experiments (names or groups, comma-separated). Four run
    /// only when named: page-cache (Singleton's guests), numa (a two-node
    /// guest) and hints-guest (the I/O hint program's cost per hook, in a
    /// guest), each on its own, and guest-files (guests reading the same
    /// files, pagesift with and without I/O hints against KSM).
    #[arg(long, value_delimiter = ',', value_name = "EXP")]
    only: Vec<String>,
    /// Only these systems (e.g. pagesift-full,ksm-1000).
    #[arg(long, value_delimiter = ',', value_name = "SYSTEM")]
    systems: Vec<String>,
    /// Run every selected experiment N times, its systems interleaved
    /// (A, B, A, B, ...): the report adds each run's figures, their median
    /// and range, and how many runs met each goal. Not for numa or
    /// hints-guest.
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=10))]
    repeat: u32,
    /// Output directory (CSV, plots, report.md, results.json).
    #[arg(long, value_name = "DIR", default_value = "pagesift-bench")]
    out: PathBuf,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Also write the report into this file (default docs/benchmarks.md)
    /// between the markers of this invocation's section.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = "docs/benchmarks.md")]
    write_docs: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Options of `pagesift scan`.
#[derive(Args, Debug)]
struct ScanArgs {
    /// Read and compare every present page: exact counts (ground truth),
    /// at about the speed of reading memory. Without it the scan samples
    /// within --budget and reports estimates with 95 % intervals.
    #[arg(long)]
    exact: bool,
    /// Sampled mode: how much to spend, as wall time (`2s`, `500ms`) or a
    /// share of one CPU over a window (`10%`, `10%/30s`).
    #[arg(long, default_value = "2s", conflicts_with = "exact")]
    budget: pagesift_scan::sampled::Budget,
    /// Sampled mode: seed of the sample (the same seed on unchanged memory
    /// draws the same pages).
    #[arg(long, conflicts_with = "exact")]
    seed: Option<u64>,
    /// Only these processes (repeat the option or separate with commas).
    #[arg(long = "pid", value_name = "PID", value_delimiter = ',')]
    pids: Vec<u32>,
    /// Only processes with this command name (/proc/PID/comm, exact).
    #[arg(long = "comm", value_name = "NAME", value_delimiter = ',')]
    comms: Vec<String>,
    /// Only processes with this effective uid.
    #[arg(long = "uid", value_name = "UID", value_delimiter = ',')]
    uids: Vec<u32>,
    /// Only processes in this cgroup or below it (e.g.
    /// /system.slice/foo.service).
    #[arg(long = "cgroup", value_name = "PATH")]
    cgroups: Vec<String>,
    /// Print one JSON object (the full report) instead of the table.
    #[arg(long)]
    json: bool,
    /// With --exact: read the duplicated pages again after SECS seconds
    /// and classify each region as statically duplicated, sparse or
    /// changing. Without it regions have no class.
    #[arg(long, value_name = "SECS")]
    rescan: Option<f64>,
    /// With --exact: 1 reads and hashes on one core; 2 hashes on a second
    /// thread while the next pages are read.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=2))]
    threads: u8,
    /// Processes shown in the table (largest saving first; default all).
    #[arg(long, value_name = "N")]
    top: Option<usize>,
    /// Regions shown under each process in the table.
    #[arg(long, value_name = "N", default_value_t = 3)]
    regions: usize,
}

/// `pagesift numa`: each process's pages per node.
fn numa_census(pids: &[u32], json: bool) -> ExitCode {
    let mut code = ExitCode::SUCCESS;
    for &pid in pids {
        match pagesift_linux::numa::census(pid) {
            Ok(c) if json => println!(
                "{}",
                serde_json::json!({
                    "pid": c.pid,
                    "merged_per_node": c.merged_per_node,
                    "unmerged_per_node": c.unmerged_per_node,
                })
            ),
            Ok(c) => println!(
                "pid {}: merged pages per node {:?}, unmerged {:?}",
                c.pid, c.merged_per_node, c.unmerged_per_node
            ),
            Err(e) => {
                eprintln!("pagesift numa: process {pid}: {e}");
                code = ExitCode::FAILURE;
            }
        }
    }
    code
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Workload { args } => {
            // Named for `ps` and the daemon's status ("pagesift" otherwise).
            let _ = rustix::thread::set_name(c"pagesift-wkld");
            pagesift_workload::main_from(
                std::iter::once(OsString::from("pagesift workload")).chain(args),
            )
        }
        Command::Numa { pids, json } => numa_census(&pids, json),
        Command::HintOverhead {
            dir,
            mib,
            hook,
            call_bytes,
            json,
        } => hint_overhead(&dir, mib, hook.as_deref(), &call_bytes, json),
        Command::Simulate {
            seed,
            seconds,
            governor,
            regions,
            pages,
            json,
        } => simulate(seed, seconds, governor, regions, pages, json),
        Command::Scan(args) => scan(args),
        Command::Run {
            config,
            governor,
            metrics,
            socket,
            pids,
            unmerge_on_exit,
            duration,
            ksm_wait,
            log_format,
        } => {
            let duration = match duration {
                Some(d) if !(d.is_finite() && d > 0.0) => {
                    eprintln!("pagesift: --for must be a positive number of seconds, got {d}");
                    return ExitCode::from(2);
                }
                d => d.map(std::time::Duration::from_secs_f64),
            };
            if !(ksm_wait.is_finite() && ksm_wait >= 0.0) {
                eprintln!("pagesift: --ksm-wait must be a number of seconds, got {ksm_wait}");
                return ExitCode::from(2);
            }
            init_logs(log_format);
            run(RunOptions {
                config,
                governor,
                metrics,
                socket,
                pids,
                unmerge_on_exit,
                duration,
                ksm_wait: Some(std::time::Duration::from_secs_f64(ksm_wait)),
            })
        }
        Command::Status {
            socket,
            config,
            json,
        } => {
            let socket = match socket {
                Some(s) => s,
                None => match pagesift_daemon::config::Config::load(config.as_deref()) {
                    Ok((c, _)) => c.status.socket,
                    Err(e) => {
                        eprintln!("pagesift: {e}");
                        return ExitCode::from(2);
                    }
                },
            };
            status(&socket, json)
        }
        Command::Exec { command } => exec(&command),
        Command::Bench(args) => bench(args),
    }
}

#[cfg(target_arch = "x86_64")]
fn hint_overhead(
    dir: &std::path::Path,
    mib: u64,
    hook: Option<&str>,
    call_bytes: &[u64],
    json: bool,
) -> ExitCode {
    use pagesift_linux::iohint::Hook;
    let hook = match hook {
        None => None,
        Some("fexit") => Some(Hook::Fexit),
        Some("sys-exit") => Some(Hook::SysExit),
        Some(other) => {
            eprintln!("pagesift: --hook must be fexit or sys-exit, got {other:?}");
            return ExitCode::from(2);
        }
    };
    let file = dir.join(format!("hint-overhead-{mib}mib.bin"));
    let made = std::fs::create_dir_all(dir)
        .and_then(|()| pagesift_bench::random_file::write(&file, mib << 20, 7));
    if let Err(e) = made {
        eprintln!("pagesift: writing {}: {e}", file.display());
        return ExitCode::FAILURE;
    }
    let exe = std::env::current_exe().unwrap_or_else(|_| "pagesift".into());
    let workload = (exe.as_path(), &["workload".to_string()][..]);
    match pagesift_bench::files::hint_overhead(workload, &[file], hook, call_bytes) {
        Ok(costs) => {
            for c in costs {
                if json {
                    println!("{}", serde_json::to_string(&c).expect("plain data"));
                } else {
                    println!("{}", c.line());
                }
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pagesift: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn hint_overhead(
    _dir: &std::path::Path,
    _mib: u64,
    _hook: Option<&str>,
    _call_bytes: &[u64],
    _json: bool,
) -> ExitCode {
    eprintln!("pagesift: the I/O hint program is x86-64 only");
    ExitCode::FAILURE
}

fn bench(a: BenchArgs) -> ExitCode {
    let exe = std::env::current_exe().unwrap_or_else(|_| "pagesift".into());
    // The separate pagesift-workload binary when it was built beside us,
    // else our own hidden `workload` subcommand (the same library), so that
    // `cargo run -p pagesift -- bench` works on a fresh checkout.
    let beside = exe.with_file_name("pagesift-workload");
    let (workload, prefix) = if beside.is_file() {
        (beside, Vec::new())
    } else {
        (exe.clone(), vec!["workload".to_string()])
    };
    let mut opts = pagesift_bench::BenchOptions::new(a.out, exe, workload);
    opts.workload_prefix = prefix;
    if a.full {
        opts.mode = pagesift_bench::experiment::Mode::Full;
    }
    opts.only = a.only;
    opts.systems = a.systems;
    opts.repeat = a.repeat;
    opts.write_docs = a.write_docs;
    opts.command_line = std::env::args()
        .enumerate()
        .map(|(i, s)| if i == 0 { "pagesift".into() } else { s })
        .collect::<Vec<_>>()
        .join(" ");
    match pagesift_bench::run(&opts) {
        Ok(summary) => {
            if a.json {
                let s = serde_json::to_string(&summary).expect("a summary serializes");
                let _ = writeln!(std::io::stdout().lock(), "{s}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pagesift: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Structured logs on stderr (journald keeps them under systemd); the
/// level comes from `RUST_LOG`, `info` by default.
fn init_logs(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

fn run(opts: RunOptions) -> ExitCode {
    match pagesift_daemon::run::run(opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ (RunError::Config(_) | RunError::Usage(_))) => {
            eprintln!("pagesift: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("pagesift: {e}");
            ExitCode::FAILURE
        }
    }
}

fn status(socket: &Path, json: bool) -> ExitCode {
    match pagesift_daemon::status::query(socket) {
        Ok((text, st)) => {
            let out = if json {
                text
            } else {
                pagesift_daemon::status::render(&st)
            };
            let mut stdout = std::io::stdout().lock();
            let _ = writeln!(stdout, "{}", out.trim_end());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("pagesift: {e}");
            // 3: the daemon is not running (as `systemctl status` does).
            ExitCode::from(3)
        }
    }
}

/// Sets PR_SET_MEMORY_MERGE and replaces this process with the command.
/// Exit codes follow env(1): 125 when pagesift itself fails, 126 when the
/// command cannot be run, 127 when it is not found; otherwise the command's
/// own status, since it *is* this process.
fn exec(command: &[OsString]) -> ExitCode {
    use std::os::unix::process::CommandExt;
    let (prog, args) = command.split_first().expect("clap requires a command");
    if let Err(e) = pagesift_linux::ksm::set_memory_merge(true) {
        let why = if e.raw_os_error() == Some(22) {
            "this kernel does not support it (Linux 6.4 or later with CONFIG_KSM is needed)"
                .to_string()
        } else {
            e.to_string()
        };
        eprintln!("pagesift: cannot set PR_SET_MEMORY_MERGE: {why}");
        return ExitCode::from(125);
    }
    let e = std::process::Command::new(prog).args(args).exec();
    let name = prog.to_string_lossy();
    if e.kind() == std::io::ErrorKind::NotFound {
        eprintln!("pagesift: {name}: command not found");
        ExitCode::from(127)
    } else {
        eprintln!("pagesift: cannot run {name}: {e}");
        ExitCode::from(126)
    }
}

fn scan(args: ScanArgs) -> ExitCode {
    let usage = |msg: String| {
        eprintln!("pagesift: {msg}");
        ExitCode::from(2)
    };
    let rescan = match args.rescan {
        None => None,
        Some(s) if !args.exact => {
            return usage(format!("--rescan {s} needs --exact"));
        }
        Some(s) if s.is_finite() && (0.0..=86_400.0).contains(&s) => {
            Some(Duration::from_secs_f64(s))
        }
        Some(s) => {
            return usage(format!(
                "--rescan: must be a number of seconds between 0 and 86400, got {s}"
            ));
        }
    };
    let filter = ProcessFilter {
        pids: args.pids,
        comms: args.comms,
        uids: args.uids,
        cgroups: args.cgroups,
    };
    let result: Result<Report, ScanError> = if args.exact {
        pagesift_scan::exact::run(&ExactOptions {
            filter,
            threads: args.threads as usize,
            rescan,
            progress: std::io::stderr().is_terminal(),
            ..ExactOptions::default()
        })
    } else {
        let defaults = pagesift_scan::sampled::SampledOptions::default();
        pagesift_scan::sampled::run(&pagesift_scan::sampled::SampledOptions {
            filter,
            budget: args.budget,
            seed: args.seed.unwrap_or(defaults.seed),
            ..defaults
        })
    };
    let report = match result {
        Ok(r) => r,
        Err(e) => {
            eprintln!("pagesift: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let text = if args.json {
        let mut s = serde_json::to_string(&report).expect("a report serializes");
        s.push('\n');
        s
    } else {
        report.to_table(&TableOptions {
            processes: args.top,
            regions: args.regions,
        })
    };
    // A closed stdout (piped into head) is not an error.
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
    ExitCode::SUCCESS
}

fn simulate(
    seed: u64,
    seconds: f64,
    governor: Governor,
    regions: usize,
    pages: u32,
    json: bool,
) -> ExitCode {
    if !(seconds.is_finite() && seconds > 0.0) {
        eprintln!("pagesift: --seconds must be a positive number, got {seconds}");
        return ExitCode::from(2);
    }
    if regions == 0 || pages == 0 {
        eprintln!("pagesift: --regions and --pages must be at least 1");
        return ExitCode::from(2);
    }
    let mut config = SimConfig {
        seed,
        regions_per_kind: regions,
        region_pages: pages,
        ..SimConfig::default()
    };
    config.distiller.seed = seed;
    config.distiller.governor = governor;
    let mut sim = Simulation::new(config);
    let until = (seconds * 1e9) as u64;
    let mut out = std::io::stdout().lock();
    if !json {
        let _ = writeln!(
            out,
            "{:>7}  {:>8}  {:>14}  {:>14}  {:>14}  {:>14}  {:>8}",
            "time s", "strength", "static", "sparse", "cow-broken", "short-lived", "merged"
        );
        let _ = writeln!(
            out,
            "{:>7}  {:>8}  {:>14}  {:>14}  {:>14}  {:>14}  {:>8}",
            "", "", "(regions per level, bottom → top)", "", "", "", "pages"
        );
    }
    let mut sampled = 0u64;
    let mut wakes = 0u64;
    while sim.now() < until {
        let step = sim.step();
        wakes += 1;
        sampled += step.wake.sampled.iter().sum::<u64>();
        let line = if json {
            serde_json::to_string(&step).expect("a step serializes")
        } else if step.wake.global_round_ended {
            let cell = |k: Kind| format!("{:?}", step.levels[&k]);
            format!(
                "{:>7.2}  {:>8}  {:>14}  {:>14}  {:>14}  {:>14}  {:>8}",
                step.now as f64 / 1e9,
                step.wake.strength,
                cell(Kind::Static),
                cell(Kind::Sparse),
                cell(Kind::CowBroken),
                cell(Kind::ShortLived),
                step.merged_pages
            )
        } else {
            continue;
        };
        if writeln!(out, "{line}").is_err() {
            return ExitCode::SUCCESS; // stdout closed (e.g. piped into head)
        }
    }
    if !json {
        let _ = writeln!(
            out,
            "\n{wakes} wake-ups, {sampled} pages sampled, {} global rounds, final strength {}",
            sim.distiller().global_rounds(),
            sim.distiller().controller().strength()
        );
    }
    ExitCode::SUCCESS
}
