//! What one merge costs ksmd, by what the target's threads are doing.
//!
//! A merge write-protects the page in every process that maps it
//! (`write_protect_page` in `mm/ksm.c`) and then replaces one mapping
//! with the KSM page (`replace_page`). Both change a live page-table
//! entry, so the kernel flushes that entry from the TLB of every CPU the
//! target's address space is running on, and a CPU other than ksmd's is
//! reached by an inter-processor interrupt. On a VM (this machine is one)
//! an IPI costs a trip through the hypervisor. A running guest's QEMU
//! always has a vCPU thread on some CPU, so every merge of its RAM pays
//! that price; a static test process pays none.
//!
//! This example merges `--mib` MiB of identical pages of its own memory
//! (`PR_SET_MEMORY_MERGE`), `--runs` times under each of three loads, and
//! prints ksmd's CPU per merge:
//! - **idle**: nothing else of this process runs;
//! - **own thread**: one thread of this process writes its own buffer
//!   in a loop (a vCPU's stand-in), so the address space is live on the
//!   other CPU;
//! - **other process**: a shell loop keeps the other CPU as busy, but in
//!   another address space: the same competition for CPUs, no IPIs.
//!
//! It takes KSM's lock and puts every knob back (unmerging) when done,
//! also on failure. Output is markdown (`scripts/bench-merge-cost` writes
//! it into docs/benchmarks.md).
//!
//! Run (as root):
//! ```text
//! cargo run --release -p pagesift-linux --example merge_cost -- --mib 128 --runs 3
//! ```

use pagesift_linux::PageBuffer;
use pagesift_linux::ksm::{KsmGuard, Ksmd, Run, set_memory_merge};
use std::process::{Child, Command};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// ksmd's batch while merging: large enough that the merges, not the
/// sleeps, set the pace (the figure per merge does not depend on it).
const PAGES_TO_SCAN: u32 = 2000;
/// Longest wait for one run's merges.
const RUN_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Clone, Copy, Debug, PartialEq)]
enum Load {
    Idle,
    OwnThread,
    OtherProcess,
}

impl Load {
    fn name(self) -> &'static str {
        match self {
            Load::Idle => "idle",
            Load::OwnThread => "own thread running",
            Load::OtherProcess => "other process running",
        }
    }
}

/// One run's figures.
struct Figures {
    merges: u64,
    ksmd_ns: u64,
    scanned: Option<u64>,
    wall: Duration,
}

/// Something keeping the other CPU busy, stopped on drop.
enum Busy {
    None,
    Thread(Arc<AtomicBool>, Option<std::thread::JoinHandle<()>>),
    Process(Child),
}

impl Busy {
    fn start(load: Load) -> std::io::Result<Busy> {
        Ok(match load {
            Load::Idle => Busy::None,
            Load::OwnThread => {
                let stop = Arc::new(AtomicBool::new(false));
                let s = stop.clone();
                let h = std::thread::spawn(move || {
                    // Written all the time: its pages never merge (their
                    // checksum changes between ksmd's visits).
                    let mut buf = vec![0u64; 1 << 17];
                    while !s.load(Ordering::Relaxed) {
                        for w in buf.iter_mut() {
                            *w = w.wrapping_add(1);
                        }
                        std::hint::black_box(&mut buf);
                    }
                });
                Busy::Thread(stop, Some(h))
            }
            Load::OtherProcess => Busy::Process(
                Command::new("sh")
                    .args(["-c", "while :; do :; done"])
                    .spawn()?,
            ),
        })
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        match self {
            Busy::None => {}
            Busy::Thread(stop, h) => {
                stop.store(true, Ordering::Relaxed);
                if let Some(h) = h.take() {
                    let _ = h.join();
                }
            }
            Busy::Process(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

fn wait_unmerged(guard: &KsmGuard) -> Result<(), Box<dyn std::error::Error>> {
    guard.set_run(Run::Unmerge)?;
    let start = Instant::now();
    while guard.ksm().counters()?.pages_shared.unwrap_or(0) > 0 {
        if start.elapsed() > RUN_TIMEOUT {
            return Err("KSM did not unmerge within the timeout".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

fn one_run(
    guard: &KsmGuard,
    ksmd: &Ksmd,
    pages: usize,
    load: Load,
) -> Result<Figures, Box<dyn std::error::Error>> {
    wait_unmerged(guard)?;
    // Mapped after PR_SET_MEMORY_MERGE, so mergeable from the start.
    let mut buf = PageBuffer::new(pages);
    for p in buf.pages_mut() {
        p.fill(0x0707_0707);
    }
    let busy = Busy::start(load)?;
    std::thread::sleep(Duration::from_millis(200));
    let c0 = guard.ksm().counters()?;
    let cpu0 = ksmd.cpu_ns()?;
    let t0 = Instant::now();
    guard.set_run(Run::Run)?;
    let want = c0.pages_sharing.unwrap_or(0) + pages as u64 * 99 / 100;
    let c1 = loop {
        let c = guard.ksm().counters()?;
        if c.pages_sharing.unwrap_or(0) + c.pages_shared.unwrap_or(0) >= want {
            break c;
        }
        if t0.elapsed() > RUN_TIMEOUT {
            return Err(format!("{} MiB did not merge within the timeout", pages / 256).into());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let cpu1 = ksmd.cpu_ns()?;
    let wall = t0.elapsed();
    guard.set_run(Run::Stop)?;
    drop(busy);
    std::hint::black_box(&buf);
    Ok(Figures {
        merges: c1
            .pages_sharing
            .unwrap_or(0)
            .saturating_sub(c0.pages_sharing.unwrap_or(0)),
        ksmd_ns: cpu1.saturating_sub(cpu0),
        scanned: c1
            .pages_scanned
            .zip(c0.pages_scanned)
            .map(|(a, b)| a.saturating_sub(b)),
        wall,
    })
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (mut mib, mut runs) = (128usize, 3usize);
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut value = |name: &str| -> Result<usize, Box<dyn std::error::Error>> {
            let v = it.next().ok_or(format!("{name} needs a value"))?;
            Ok(v.parse().map_err(|e| format!("{name} {v}: {e}"))?)
        };
        match k.as_str() {
            "--mib" => mib = value("--mib")?,
            "--runs" => runs = value("--runs")?.max(1),
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let guard = KsmGuard::acquire()?;
    guard.set_unmerge_on_restore(true);
    let ksmd = Ksmd::find()?;
    guard.set_pages_to_scan(PAGES_TO_SCAN)?;
    guard.set_sleep_millisecs(20)?;
    set_memory_merge(true)?;
    let pages = mib * 256;
    println!(
        "{mib} MiB of identical pages ({pages} pages) of one process, merged by ksmd at \
         pages_to_scan {PAGES_TO_SCAN}, sleep 20 ms, {runs} runs per load, the loads \
         interleaved. *Merges*: the growth of `pages_sharing`; *µs per merge*: ksmd's CPU \
         (its CPU-time clock) from `run = 1` until 99 % of the pages were merged, over the \
         merges, so it includes ksmd's scanning of the same pages (two visits a page: the \
         table's pages scanned per merge). The loads: *idle* (nothing else of the process runs), *own thread running* \
         (a thread of the same process writes a 1 MiB buffer in a loop, as a guest's vCPU \
         thread does: the address space is live on the other CPU), *other process running* \
         (a shell loop in another process keeps the other CPU as busy). Example \
         `crates/linux/examples/merge_cost.rs`.\n"
    );
    let loads = [Load::Idle, Load::OwnThread, Load::OtherProcess];
    let mut results: Vec<(Load, Vec<Figures>)> = loads.iter().map(|&l| (l, Vec::new())).collect();
    for _ in 0..runs {
        for (load, figs) in results.iter_mut() {
            let f = one_run(&guard, &ksmd, pages, *load)?;
            eprintln!(
                "merge_cost: {}: {} merges, ksmd {:.3} CPU-s, {:.1} s",
                load.name(),
                f.merges,
                f.ksmd_ns as f64 / 1e9,
                f.wall.as_secs_f64()
            );
            figs.push(f);
        }
    }
    wait_unmerged(&guard)?;
    set_memory_merge(false)?;
    println!(
        "| target's load | merges per run | ksmd µs per merge, median | range | pages scanned per \
         merge, median | wall s per run, median |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let mut medians = Vec::new();
    for (load, figs) in &results {
        let mut us: Vec<f64> = figs
            .iter()
            .map(|f| f.ksmd_ns as f64 / 1e3 / f.merges.max(1) as f64)
            .collect();
        let (lo, hi) = us
            .iter()
            .fold((f64::MAX, 0f64), |(a, b), &x| (a.min(x), b.max(x)));
        let mut scans: Vec<f64> = figs
            .iter()
            .filter_map(|f| f.scanned.map(|s| s as f64 / f.merges.max(1) as f64))
            .collect();
        let mut walls: Vec<f64> = figs.iter().map(|f| f.wall.as_secs_f64()).collect();
        let m = median(&mut us);
        medians.push(m);
        println!(
            "| {} | {} | {m:.1} | {lo:.1}–{hi:.1} | {} | {:.2} |",
            load.name(),
            figs[0].merges,
            if scans.is_empty() {
                "–".to_string()
            } else {
                format!("{:.2}", median(&mut scans))
            },
            median(&mut walls)
        );
    }
    println!(
        "\nA merge of a page whose address space runs on another CPU cost ksmd {:.1}× what it \
         cost with the process idle; a busy CPU in another address space, {:.1}×.",
        medians[1] / medians[0].max(f64::MIN_POSITIVE),
        medians[2] / medians[0].max(f64::MIN_POSITIVE)
    );
    let report = guard.release();
    if !report.unrestored.is_empty() {
        return Err(format!("KSM settings not restored: {:?}", report.unrestored).into());
    }
    Ok(())
}
