//! `pagesift`: the command-line front end. Argument parsing and output only;
//! the algorithms live in `pagesift-core`, the system access in
//! `pagesift-linux`.

use clap::{Parser, Subcommand};
use pagesift_core::governor::Governor;
use pagesift_core::sim::{Kind, SimConfig, Simulation};
use std::io::Write;
use std::process::ExitCode;

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
    }
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
