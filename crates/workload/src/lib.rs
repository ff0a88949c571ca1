//! `pagesift-workload`: reproducible memory patterns for pagesift's tests
//! and benchmarks.
//!
//! The library is the whole program: [`main_from`] parses a command line
//! and runs the workload. Two front ends call it: the `pagesift-workload`
//! binary (tests and benchmarks) and `pagesift`'s hidden `workload`
//! subcommand, which `pagesift demo` starts, since `cargo run -p pagesift`
//! builds only the `pagesift` binary.
//!
//! Each workload maps private anonymous memory, fills it deterministically
//! from `--seed`, prints **one JSON line** on stdout (its pid, its regions,
//! and the exact page counts it created: pages, present pages, zero-page
//! mappings, untouched pages, distinct contents, duplicate pages =
//! present − distinct), then stays alive until killed or `--seconds` pass,
//! so that tests can inspect it. It never calls `madvise(MADV_MERGEABLE)`:
//! whether its memory gets merged is pagesift's decision. `--node N` binds it to one NUMA node (CPUs and memory)
//! and `--nice N` sets its priority, for the NUMA placement experiment.
//!
//! While alive it answers commands on stdin, one per line, with one JSON
//! line each: `checksum` gives an xxh3 of every page it accessed (so a test
//! can check that a scan left its memory unchanged); `rewrite FIRST COUNT`
//! writes new, distinct content (`DIRTY_BASE + page`) into those pages, as
//! a program that modifies its data would (breaking any merge of them),
//! and answers with the new checksum, so a test can compare it with an
//! unmerged twin workload given the same command; `touch FIRST COUNT`
//! writes each of those pages' first byte back unchanged, which breaks a
//! merged page (a COW copy) without changing what it holds, so that ksmd
//! can merge it again (a region that thrashes).
//!
//! Workloads (UKSM §8.1 for the last three's originals):
//! - `static-dup`: N MiB of identical pages, or of K distinct contents.
//! - `random`: N MiB of distinct pages.
//! - `mixed`: runs of duplicated pages inside random data, at a ratio.
//! - `cow-broken` (§8.1.2): identical pages; one full page is rewritten
//!   with the same content every 10 ms, walking the region start to end,
//!   over and over.
//! - `short-lived` (§8.1.3): forever: map N MiB of same-content pages,
//!   sleep T, unmap, sleep T.
//! - `fork-family`: the parent fills memory, forks K children, and each
//!   child rewrites a fraction of the pages (the same new content per page
//!   in every child), so the family has shared frames, private copies and
//!   cross-process duplicates.
//!
//! - `read-files`: maps page-aligned buffers for the given files and,
//!   on the stdin command `read`, reads them into those buffers in an
//!   order of its own (`--order-seed`) with the chosen syscall, beside
//!   `--private-mib` MiB of distinct pages of its own (XLH's HTTPerf-like
//!   setting: many servers holding the same file data). `read` answers
//!   with where each file landed and the checksum; `checksum` covers the
//!   private memory and, once read, the buffers.
//!
//! - `random-reads`: reads random blocks of a file through the page cache
//!   for `--seconds` and prints how many (Singleton §4's random reads; the
//!   page-cache experiment runs it inside its guests). It maps nothing of
//!   its own and answers no commands.
//!
//! `--hole-every`, `--zero-every` and `--untouched-mib` leave pages
//! non-present or mapped to the zero page, so that tests can check a scan
//! never faults anything in.

mod content;
mod files;
mod layout;
mod memory;
mod random_reads;

use clap::{Args, Parser, Subcommand};
use content::{PAGE, PageMaker};
use layout::{Counts, FamilyCounts, MixedParams, Shape, Slot};
use memory::Memory;
use pagesift_linux::sys::{Forked, HugePages};
use serde::Serialize;
use std::io::{BufRead, Read, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Reproducible memory patterns for pagesift.
#[derive(Parser, Debug)]
#[command(name = "pagesift-workload", version, about, long_about = None)]
struct Cli {
    /// Die (SIGKILL) when the process that started this one dies, so that a
    /// killed parent leaves no workload behind.
    #[arg(long, global = true)]
    die_with_parent: bool,
    #[command(subcommand)]
    workload: Workload,
}

#[derive(Subcommand, Debug)]
enum Workload {
    /// N MiB of identical pages (or of K distinct contents, page i holding
    /// content i mod K).
    StaticDup {
        #[command(flatten)]
        shape: ShapeArgs,
        /// Distinct contents.
        #[arg(long, default_value_t = 1)]
        contents: u64,
        #[command(flatten)]
        common: Common,
    },
    /// N MiB of distinct pages.
    Random {
        #[command(flatten)]
        shape: ShapeArgs,
        #[command(flatten)]
        common: Common,
    },
    /// Duplicated runs inside random data.
    Mixed {
        #[command(flatten)]
        shape: ShapeArgs,
        #[command(flatten)]
        mix: MixArgs,
        #[command(flatten)]
        common: Common,
    },
    /// UKSM §8.1.2: identical pages, one page rewritten with the same
    /// content every interval, start to end, repeatedly.
    CowBroken {
        /// Size of the region in MiB.
        #[arg(long)]
        mib: u64,
        /// Milliseconds between two page rewrites.
        #[arg(long, default_value_t = 10)]
        interval_ms: u64,
        #[command(flatten)]
        common: Common,
    },
    /// UKSM §8.1.3: repeat { map N MiB of same-content pages, sleep T,
    /// unmap, sleep T }.
    ShortLived {
        /// Size of the region in MiB.
        #[arg(long)]
        mib: u64,
        /// T, in milliseconds.
        #[arg(long, default_value_t = 1000)]
        period_ms: u64,
        /// Append a JSON line per cycle to this file, written right before
        /// the region is unmapped: when it was mapped and unmapped (Unix
        /// seconds), its pages, and how many of them were KSM pages then
        /// (from /proc/self/pagemap and /proc/kpageflags, so root).
        #[arg(long)]
        cycle_log: Option<std::path::PathBuf>,
        #[command(flatten)]
        common: Common,
    },
    /// The parent fills memory (as `mixed`), forks K children, each child
    /// rewrites a fraction of the pages.
    ForkFamily {
        #[command(flatten)]
        shape: ShapeArgs,
        #[command(flatten)]
        mix: MixArgs,
        /// Children.
        #[arg(long, default_value_t = 3)]
        children: usize,
        /// Fraction of the parent's written pages each child rewrites.
        #[arg(long, default_value_t = 0.25)]
        dirty_fraction: f64,
        #[command(flatten)]
        common: Common,
    },
    /// Many small VMAs: one region of `count` pages split into `count`
    /// one-page VMAs (alternating huge page advice), every `touch_every`-th
    /// page written with one of `contents` contents, the others untouched.
    /// For the daemon's memory bound per VMA.
    Vmas {
        /// VMAs (pages of the region).
        #[arg(long)]
        count: usize,
        /// Write every N-th page (the others stay untouched).
        #[arg(long, default_value_t = 10)]
        touch_every: usize,
        /// Distinct contents of the written pages.
        #[arg(long, default_value_t = 1)]
        contents: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Reads files into page-aligned buffers on the `read` command, beside
    /// private distinct memory.
    ReadFiles {
        /// The files, in buffer order (comma-separated).
        #[arg(long, value_delimiter = ',', required = true)]
        files: Vec<std::path::PathBuf>,
        /// Seeds the order in which the files are read.
        #[arg(long, default_value_t = 1)]
        order_seed: u64,
        /// The syscall that reads.
        #[arg(long, value_enum, default_value_t = files::ReadCall::Read)]
        syscall: files::ReadCall,
        /// Bytes per call, in KiB.
        #[arg(long, default_value_t = 256)]
        chunk_kib: usize,
        /// Bytes per call, exactly (instead of `--chunk-kib`): a call
        /// smaller than a page can bring no hint, which is what the I/O
        /// hint program's cheapest path is timed with.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        chunk_bytes: Option<u64>,
        /// Distinct private pages beside the buffers, in MiB.
        #[arg(long, default_value_t = 0)]
        private_mib: u64,
        #[command(flatten)]
        common: Common,
    },
    /// Reads random blocks of a file through the page cache for a while,
    /// then prints one JSON line: reads, bytes, seconds.
    RandomReads {
        /// The file.
        #[arg(long)]
        file: std::path::PathBuf,
        /// Bytes per read, in KiB.
        #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
        block_kib: u64,
        /// How long to read.
        #[arg(long)]
        seconds: f64,
        /// Seeds the order of the blocks.
        #[arg(long, default_value_t = 1)]
        seed: u64,
    },
}

#[derive(Args, Debug, Clone, Copy)]
struct ShapeArgs {
    /// Size of the filled part of the region, in MiB.
    #[arg(long)]
    mib: u64,
    /// Leave every H-th page of the filled part untouched (not present).
    #[arg(long, default_value_t = 0)]
    hole_every: usize,
    /// Only read every Z-th page of the filled part (zero-page mapping).
    #[arg(long, default_value_t = 0)]
    zero_every: usize,
    /// Untouched MiB after the filled part (no page tables either).
    #[arg(long, default_value_t = 0)]
    untouched_mib: u64,
    /// Back the region with transparent huge pages (MADV_HUGEPAGE; no holes
    /// or zero pages then, since a THP fault fills 2 MiB at once).
    #[arg(long, conflicts_with_all = ["hole_every", "zero_every", "untouched_mib"])]
    thp: bool,
}

impl ShapeArgs {
    fn shape(&self) -> Shape {
        let per_mib = (1 << 20) / PAGE;
        Shape {
            data_pages: self.mib as usize * per_mib,
            hole_every: self.hole_every,
            zero_every: self.zero_every,
            untouched_tail: self.untouched_mib as usize * per_mib,
        }
    }

    fn huge(&self) -> HugePages {
        if self.thp {
            HugePages::Advised
        } else {
            HugePages::Never
        }
    }
}

#[derive(Args, Debug, Clone, Copy)]
struct MixArgs {
    /// Fraction of runs that are duplicated.
    #[arg(long, default_value_t = 0.3)]
    dup_ratio: f64,
    /// Pages per run.
    #[arg(long, default_value_t = 16)]
    run_pages: usize,
    /// Distinct contents the duplicated runs cycle through (default: one
    /// run's worth, so every duplicated run is the same run of pages).
    #[arg(long)]
    dup_contents: Option<u64>,
}

impl MixArgs {
    fn params(&self) -> MixedParams {
        MixedParams {
            dup_ratio: self.dup_ratio,
            run_pages: self.run_pages.max(1),
            dup_contents: self.dup_contents.unwrap_or(self.run_pages.max(1) as u64),
        }
    }
}

#[derive(Args, Debug, Clone, Copy)]
struct Common {
    /// Seed: the same seed gives byte-identical memory.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Exit after this many seconds (default: run until killed).
    #[arg(long)]
    seconds: Option<f64>,
    /// Run on this NUMA node only: its CPUs, and memory from it alone
    /// (bound before anything is mapped).
    #[arg(long)]
    node: Option<u16>,
    /// Run at this nice value (-20..=19; lower needs CAP_SYS_NICE).
    #[arg(long, allow_hyphen_values = true)]
    nice: Option<i32>,
}

impl Common {
    /// Applies `--node` and `--nice` to this process.
    fn apply(&self) -> Result<(), String> {
        if let Some(n) = self.nice {
            rustix::process::setpriority_process(None, n)
                .map_err(|e| format!("--nice {n}: setpriority: {e}"))?;
        }
        if let Some(node) = self.node {
            pagesift_linux::numa::bind_to_node(node).map_err(|e| format!("--node {node}: {e}"))?;
        }
        Ok(())
    }
}

/// One region in the report.
#[derive(Serialize)]
struct RegionOut {
    start: u64,
    pages: u64,
}

/// The JSON line printed when the workload is ready.
#[derive(Serialize)]
struct Report {
    workload: &'static str,
    pid: u32,
    seed: u64,
    page_size: usize,
    regions: Vec<RegionOut>,
    #[serde(flatten)]
    counts: Counts,
    checksum: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    children: Vec<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    family: Option<FamilyCounts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    interval_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    period_ms: Option<u64>,
    fill_seconds: f64,
}

type Shared = Arc<Mutex<Option<Memory>>>;

/// Parses `args` (the first is the program name, as in `std::env::args_os`)
/// and runs the workload it names. Returns only when the workload ends
/// (`--seconds`) or fails; `--help` and usage errors exit as clap does.
/// Exit code 1 on failure, with the reason on stderr.
pub fn main_from<I, T>(args: I) -> std::process::ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::parse_from(args);
    if cli.die_with_parent {
        let parent = std::os::unix::process::parent_id();
        match pagesift_linux::sys::die_with_parent(parent) {
            Ok(true) => {}
            // The parent is already gone (we were reparented): nobody to
            // serve.
            Ok(false) => return std::process::ExitCode::FAILURE,
            Err(e) => {
                eprintln!("pagesift-workload: cannot ask to die with the parent: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    match run(cli.workload) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pagesift-workload: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(w: Workload) -> Result<(), String> {
    let t0 = Instant::now();
    match &w {
        Workload::StaticDup { common, .. }
        | Workload::Random { common, .. }
        | Workload::Mixed { common, .. }
        | Workload::CowBroken { common, .. }
        | Workload::ShortLived { common, .. }
        | Workload::ForkFamily { common, .. }
        | Workload::Vmas { common, .. } => common.apply()?,
        Workload::ReadFiles { .. } | Workload::RandomReads { .. } => {}
    }
    match w {
        Workload::StaticDup {
            shape,
            contents,
            common,
        } => {
            let slots = layout::static_dup(&shape.shape(), contents);
            let maker = PageMaker::new(common.seed, contents);
            static_workload("static-dup", slots, shape.huge(), maker, common, t0)
        }
        Workload::Random { shape, common } => {
            let slots = layout::random(&shape.shape());
            let maker = PageMaker::new(common.seed, 0);
            static_workload("random", slots, shape.huge(), maker, common, t0)
        }
        Workload::Mixed { shape, mix, common } => {
            let p = mix.params();
            let slots = layout::mixed(&shape.shape(), p, common.seed);
            let maker = PageMaker::new(common.seed, p.dup_contents);
            static_workload("mixed", slots, shape.huge(), maker, common, t0)
        }
        Workload::CowBroken {
            mib,
            interval_ms,
            common,
        } => cow_broken(mib, interval_ms, common, t0),
        Workload::Vmas {
            count,
            touch_every,
            contents,
            common,
        } => many_vmas(count, touch_every, contents, common, t0),
        Workload::ShortLived {
            mib,
            period_ms,
            cycle_log,
            common,
        } => short_lived(mib, period_ms, cycle_log.as_deref(), common, t0),
        Workload::ForkFamily {
            shape,
            mix,
            children,
            dirty_fraction,
            common,
        } => fork_family(shape, mix, children, dirty_fraction, common, t0),
        Workload::ReadFiles {
            files,
            order_seed,
            syscall,
            chunk_kib,
            chunk_bytes,
            private_mib,
            common,
        } => read_files(
            &files,
            order_seed,
            syscall,
            chunk_bytes.map_or(chunk_kib * 1024, |b| b as usize),
            private_mib,
            common,
            t0,
        ),
        Workload::RandomReads {
            file,
            block_kib,
            seconds,
            seed,
        } => {
            let r = random_reads::run(&file, block_kib * 1024, seconds, seed)?;
            print_line(&serde_json::json!({
                "workload": "random-reads",
                "reads": r.reads,
                "bytes": r.bytes,
                "seconds": r.seconds,
            }));
            Ok(())
        }
    }
}

/// The `read-files` workload (crate documentation).
fn read_files(
    paths: &[std::path::PathBuf],
    order_seed: u64,
    syscall: files::ReadCall,
    chunk: usize,
    private_mib: u64,
    common: Common,
    t0: Instant,
) -> Result<(), String> {
    let bufs = files::FileBuffers::map(paths)?;
    let shape = Shape {
        data_pages: private_mib as usize * ((1 << 20) / PAGE),
        hole_every: 0,
        zero_every: 0,
        untouched_tail: 0,
    };
    let private = if private_mib > 0 {
        let mut mem = Memory::map(layout::random(&shape), HugePages::Never)
            .map_err(|e| format!("mmap: {e}"))?;
        mem.fill(&PageMaker::new(common.seed, 0));
        Some(mem)
    } else {
        None
    };
    let (addr, pages) = bufs.region();
    let mut regions = vec![RegionOut { start: addr, pages }];
    if let Some(m) = &private {
        regions.push(RegionOut {
            start: m.addr(),
            pages: m.slots().len() as u64,
        });
    }
    let checksum = |b: &files::FileBuffers, p: &Option<Memory>| -> String {
        format!(
            "{}:{}",
            b.checksum().unwrap_or_default(),
            p.as_ref().map(|m| m.checksum()).unwrap_or_default()
        )
    };
    print_line(&serde_json::json!({
        "workload": "read-files",
        "pid": std::process::id(),
        "seed": common.seed,
        "page_size": PAGE,
        "regions": regions,
        "checksum": checksum(&bufs, &private),
        "fill_seconds": t0.elapsed().as_secs_f64(),
    }));
    let shared = Arc::new(Mutex::new((bufs, private)));
    let serve = shared.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let mut g = serve.lock().unwrap();
            match line.trim() {
                "read" => {
                    let t = Instant::now();
                    let r = g.0.read_all(syscall, chunk, order_seed);
                    match r {
                        Ok(placed) => print_line(&serde_json::json!({
                            "read": placed,
                            "seconds": t.elapsed().as_secs_f64(),
                            "checksum": checksum(&g.0, &g.1),
                        })),
                        Err(e) => print_line(&serde_json::json!({ "error": e })),
                    }
                }
                "checksum" => print_line(&serde_json::json!({ "checksum": checksum(&g.0, &g.1) })),
                "" => {}
                other => print_line(
                    &serde_json::json!({ "error": format!("unknown command {other:?}") }),
                ),
            }
        }
    });
    stay_alive(&common, Instant::now());
    drop(shared);
    Ok(())
}

fn report(workload: &'static str, seed: u64, mem: &Memory, t0: Instant) -> Report {
    Report {
        workload,
        pid: std::process::id(),
        seed,
        page_size: PAGE,
        regions: vec![RegionOut {
            start: mem.addr(),
            pages: mem.slots().len() as u64,
        }],
        counts: Counts::of(mem.slots()),
        checksum: mem.checksum(),
        children: Vec::new(),
        family: None,
        interval_ms: None,
        period_ms: None,
        fill_seconds: t0.elapsed().as_secs_f64(),
    }
}

fn print_line<T: Serialize>(v: &T) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (the reader went away) is not a reason to stop.
    let _ = serde_json::to_writer(&mut out, v);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

/// Answers stdin commands about `shared` (filled from `seed`) until stdin
/// closes.
fn serve_commands(shared: Shared, seed: u64) {
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["checksum"] => {
                    let sum = shared.lock().unwrap().as_ref().map(|m| m.checksum());
                    print_line(&serde_json::json!({ "checksum": sum }));
                }
                ["rewrite", first, count] => {
                    let (Ok(first), Ok(count)) = (first.parse::<usize>(), count.parse::<usize>())
                    else {
                        print_line(&serde_json::json!({ "error": "usage: rewrite FIRST COUNT" }));
                        continue;
                    };
                    let maker = PageMaker::new(seed, 0);
                    let mut guard = shared.lock().unwrap();
                    let (n, sum) = match guard.as_mut() {
                        Some(m) => {
                            let end = first.saturating_add(count).min(m.slots().len());
                            for i in first.min(end)..end {
                                m.write_page(i, layout::DIRTY_BASE + i as u64, &maker);
                            }
                            (end.saturating_sub(first), Some(m.checksum()))
                        }
                        None => (0, None),
                    };
                    print_line(&serde_json::json!({ "rewritten": n, "checksum": sum }));
                }
                ["touch", first, count] => {
                    let (Ok(first), Ok(count)) = (first.parse::<usize>(), count.parse::<usize>())
                    else {
                        print_line(&serde_json::json!({ "error": "usage: touch FIRST COUNT" }));
                        continue;
                    };
                    let mut guard = shared.lock().unwrap();
                    let (n, sum) = match guard.as_mut() {
                        Some(m) => {
                            let end = first.saturating_add(count).min(m.slots().len());
                            let n = (first.min(end)..end).filter(|&i| m.touch_page(i)).count();
                            (n, Some(m.checksum()))
                        }
                        None => (0, None),
                    };
                    print_line(&serde_json::json!({ "touched": n, "checksum": sum }));
                }
                [] => {}
                _ => print_line(
                    &serde_json::json!({ "error": format!("unknown command {:?}", line.trim()) }),
                ),
            }
        }
    });
}

/// Sleeps until the deadline, or forever.
fn stay_alive(common: &Common, t_ready: Instant) {
    match common.seconds {
        Some(s) => {
            let end = t_ready + Duration::from_secs_f64(s.max(0.0));
            let now = Instant::now();
            if end > now {
                std::thread::sleep(end - now);
            }
        }
        None => loop {
            std::thread::sleep(Duration::from_secs(3600));
        },
    }
}

fn deadline_passed(common: &Common, t_ready: Instant) -> bool {
    common
        .seconds
        .is_some_and(|s| t_ready.elapsed().as_secs_f64() >= s)
}

fn static_workload(
    name: &'static str,
    slots: Vec<Slot>,
    huge: HugePages,
    maker: PageMaker,
    common: Common,
    t0: Instant,
) -> Result<(), String> {
    let mut mem = Memory::map(slots, huge).map_err(|e| format!("mmap: {e}"))?;
    mem.fill(&maker);
    let r = report(name, common.seed, &mem, t0);
    let shared: Shared = Arc::new(Mutex::new(Some(mem)));
    serve_commands(shared.clone(), common.seed);
    print_line(&r);
    stay_alive(&common, Instant::now());
    Ok(())
}

fn many_vmas(
    count: usize,
    touch_every: usize,
    contents: u64,
    common: Common,
    t0: Instant,
) -> Result<(), String> {
    let every = touch_every.max(1);
    let slots: Vec<Slot> = (0..count.max(1))
        .map(|i| {
            if i % every == 0 {
                Slot::Data((i / every) as u64 % contents.max(1))
            } else {
                Slot::Untouched
            }
        })
        .collect();
    let maker = PageMaker::new(common.seed, contents.max(1));
    let mut mem = Memory::map(slots, HugePages::Never).map_err(|e| format!("mmap: {e}"))?;
    mem.fill(&maker);
    mem.split_vmas(1)
        .map_err(|e| format!("splitting into {count} VMAs: {e}"))?;
    let r = report("vmas", common.seed, &mem, t0);
    let shared: Shared = Arc::new(Mutex::new(Some(mem)));
    serve_commands(shared.clone(), common.seed);
    print_line(&r);
    stay_alive(&common, Instant::now());
    Ok(())
}

/// `mib` MiB of one content, every page written (cow-broken, short-lived).
fn identical_slots(mib: u64) -> Vec<Slot> {
    let shape = Shape {
        data_pages: mib as usize * ((1 << 20) / PAGE),
        hole_every: 0,
        zero_every: 0,
        untouched_tail: 0,
    };
    layout::static_dup(&shape, 1)
}

fn cow_broken(mib: u64, interval_ms: u64, common: Common, t0: Instant) -> Result<(), String> {
    let slots = identical_slots(mib);
    let maker = PageMaker::new(common.seed, 1);
    let mut mem = Memory::map(slots, HugePages::Never).map_err(|e| format!("mmap: {e}"))?;
    mem.fill(&maker);
    let mut r = report("cow-broken", common.seed, &mem, t0);
    r.interval_ms = Some(interval_ms);
    let n = mem.slots().len();
    let shared: Shared = Arc::new(Mutex::new(Some(mem)));
    serve_commands(shared.clone(), common.seed);
    print_line(&r);
    let ready = Instant::now();
    let mut next = 0usize;
    while !deadline_passed(&common, ready) {
        std::thread::sleep(Duration::from_millis(interval_ms));
        if let Some(m) = shared.lock().unwrap().as_mut() {
            // The same content again: a write that breaks any merge of the
            // page but leaves the memory's contents unchanged.
            m.write_page(next, 0, &maker);
        }
        next = (next + 1) % n;
    }
    Ok(())
}

fn short_lived(
    mib: u64,
    period_ms: u64,
    cycle_log: Option<&std::path::Path>,
    common: Common,
    t0: Instant,
) -> Result<(), String> {
    let slots = identical_slots(mib);
    let maker = PageMaker::new(common.seed, 1);
    let period = Duration::from_millis(period_ms);
    let shared: Shared = Arc::new(Mutex::new(None));
    let mut log = match cycle_log {
        Some(path) => Some(CycleLog::create(path)?),
        None => None,
    };
    let mut first = true;
    let mut ready = Instant::now();
    for cycle in 0u64.. {
        let mut mem =
            Memory::map(slots.clone(), HugePages::Never).map_err(|e| format!("mmap: {e}"))?;
        let mapped_at = unix_now();
        mem.fill(&maker);
        if first {
            let mut r = report("short-lived", common.seed, &mem, t0);
            r.period_ms = Some(period_ms);
            serve_commands(shared.clone(), common.seed);
            print_line(&r);
            ready = Instant::now();
            first = false;
        }
        let (addr, pages) = (mem.addr(), mem.slots().len());
        *shared.lock().unwrap() = Some(mem);
        std::thread::sleep(period);
        if let Some(log) = log.as_mut() {
            log.record(cycle, mapped_at, addr, pages)?;
        }
        // Unmap (drop) the region.
        *shared.lock().unwrap() = None;
        if deadline_passed(&common, ready) {
            return Ok(());
        }
        std::thread::sleep(period);
        if deadline_passed(&common, ready) {
            return Ok(());
        }
    }
    Ok(())
}

/// Seconds since the Unix epoch: the clock of the cycle log, which the
/// bench compares with its own t = 0.
pub fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// One line of the short-lived workload's cycle log (`--cycle-log`),
/// written right before the cycle's region is unmapped; the bench and the
/// tests read it back with this type.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct CycleRecord {
    /// The cycle's number, from 0.
    pub cycle: u64,
    /// When the region was mapped ([`unix_now`]).
    pub mapped_at: f64,
    /// When its KSM pages were counted, right before its unmap.
    pub unmapped_at: f64,
    /// Its pages.
    pub pages: u64,
    /// Those that were KSM pages then.
    pub merged: u64,
}

/// The short-lived workload's record of each cycle: how much of the
/// region was merged by the time it was unmapped.
struct CycleLog {
    file: std::fs::File,
    inspector: pagesift_linux::inspect::PageInspector,
    infos: Vec<pagesift_linux::inspect::PageInfo>,
}

impl CycleLog {
    fn create(path: &std::path::Path) -> Result<CycleLog, String> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .map_err(|e| format!("--cycle-log {}: {e}", path.display()))?;
        let inspector = pagesift_linux::inspect::PageInspector::open_own()
            .map_err(|e| format!("--cycle-log: {e}"))?;
        Ok(CycleLog {
            file,
            inspector,
            infos: Vec::new(),
        })
    }

    /// Counts the KSM pages of `pages` pages at `addr` and appends the line.
    fn record(
        &mut self,
        cycle: u64,
        mapped_at: f64,
        addr: u64,
        pages: usize,
    ) -> Result<(), String> {
        use pagesift_linux::inspect::{PageClass, PageInfo};
        use std::io::Write;
        self.infos.clear();
        self.infos.resize(pages, PageInfo::default());
        self.inspector
            .inspect(addr, &mut self.infos)
            .map_err(|e| format!("--cycle-log: inspecting the region: {e}"))?;
        let merged = (self.infos.iter())
            .filter(|i| i.class() == PageClass::Merged)
            .count();
        let line = serde_json::to_string(&CycleRecord {
            cycle,
            mapped_at,
            unmapped_at: unix_now(),
            pages: pages as u64,
            merged: merged as u64,
        })
        .map_err(|e| format!("--cycle-log: {e}"))?;
        writeln!(self.file, "{line}").map_err(|e| format!("--cycle-log: {e}"))
    }
}

fn fork_family(
    shape: ShapeArgs,
    mix: MixArgs,
    children: usize,
    fraction: f64,
    common: Common,
    t0: Instant,
) -> Result<(), String> {
    let p = mix.params();
    let slots = layout::mixed(&shape.shape(), p, common.seed);
    let dirty = layout::child_dirty_sets(&slots, children, fraction, common.seed);
    let family = FamilyCounts::of(&slots, &dirty);
    let maker = PageMaker::new(common.seed, p.dup_contents);
    let mut mem = Memory::map(slots, shape.huge()).map_err(|e| format!("mmap: {e}"))?;
    mem.fill(&maker);
    let parent = std::process::id();
    let (mut ready_rx, ready_tx) = std::io::pipe().map_err(|e| format!("pipe: {e}"))?;
    let mut pids = Vec::with_capacity(children);
    for set in &dirty {
        match pagesift_linux::sys::fork_single_threaded().map_err(|e| format!("fork: {e}"))? {
            Forked::Parent(pid) => pids.push(pid),
            Forked::Child => child_main(parent, &mut mem, set, &maker, &ready_tx),
        }
    }
    drop(ready_tx);
    // Wait until every child has rewritten its pages.
    let mut buf = vec![0u8; children];
    ready_rx
        .read_exact(&mut buf)
        .map_err(|e| format!("a child died before it was ready: {e}"))?;
    let mut r = report("fork-family", common.seed, &mem, t0);
    r.children = pids;
    r.family = Some(family);
    let shared: Shared = Arc::new(Mutex::new(Some(mem)));
    serve_commands(shared.clone(), common.seed);
    print_line(&r);
    stay_alive(&common, Instant::now());
    Ok(())
}

/// A fork-family child: die with the parent, rewrite the pages of `set`,
/// say so, and sleep.
fn child_main(
    parent: u32,
    mem: &mut Memory,
    set: &[usize],
    maker: &PageMaker,
    ready: &std::io::PipeWriter,
) -> ! {
    match pagesift_linux::sys::die_with_parent(parent) {
        Ok(true) => {}
        _ => std::process::exit(0),
    }
    for &i in set {
        mem.write_page(i, layout::DIRTY_BASE + i as u64, maker);
    }
    let _ = (&*ready).write_all(&[1]);
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
