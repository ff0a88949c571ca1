//! `pagesift`: the command-line front end. Argument parsing and output only;
//! the algorithms live in `pagesift-core`, the system access in
//! `pagesift-linux`.

use clap::{Args, Parser, Subcommand};
use pagesift_core::governor::Governor;
use pagesift_core::sim::{Kind, SimConfig, Simulation};
use pagesift_linux::ProcessFilter;
use pagesift_scan::exact::ExactOptions;
use pagesift_scan::report::{Report, ScanError, TableOptions};
use std::io::{IsTerminal, Write};
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
    /// Measure how much deduplication would save on this machine, per
    /// process and per region, read-only. Needs root (CAP_SYS_ADMIN for
    /// page frame numbers, CAP_SYS_PTRACE to read other processes).
    ///
    /// Exit codes: 0 done, 1 runtime error (missing capability, no such
    /// pid), 2 usage error.
    Scan(ScanArgs),
}

/// Options of `pagesift scan`.
#[derive(Args, Debug)]
struct ScanArgs {
    /// Read and compare every present page: exact counts (ground truth),
    /// at about the speed of reading memory.
    #[arg(long)]
    exact: bool,
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Simulate {
            seed,
            seconds,
            governor,
            regions,
            pages,
            json,
        } => simulate(seed, seconds, governor, regions, pages, json),
        Command::Scan(args) => scan(args),
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
        Err(ScanError::Usage(
            "the sampled scan is not in this build yet: use --exact".into(),
        ))
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
