//! What it costs to learn about a process's VMAs when it has many: its
//! executable VMAs (the injector's gadget search) from the text of
//! `/proc/PID/maps` and from `PROCMAP_QUERY`, and its VMA count (the VMA
//! budget) from the text and from a `PROCMAP_QUERY` walk of every VMA.
//!
//! The process measures itself: it maps `--vmas` one-page VMAs (one
//! mapping split by alternating huge page advice, as `pagesift-workload
//! vmas` does), then times each way `--runs` times (default 50), the ways
//! interleaved run by run so that load from other processes falls on all
//! alike, and prints the median and range of each, in milliseconds, as a
//! markdown table. The kernel's work is the same for another process's
//! maps as for its own.
//!
//! Run:
//! ```text
//! cargo build --release -p pagesift-linux --examples
//! target/release/examples/vma_read_cost [--vmas N] [--runs N]
//! ```

use pagesift_linux::sys::{AnonMapping, HugePages, procmap_query};
use pagesift_linux::{proc, vma_query};
use std::os::fd::AsFd;
use std::time::Instant;

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|v| {
            v.parse()
                .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
        })
        .unwrap_or(default)
}

/// The executable VMAs from the text, as the gadget search read them
/// before `PROCMAP_QUERY`: every line read, the executable ones kept.
fn exec_from_text(pid: u32) -> usize {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .filter(|l| !l.ends_with("[vsyscall]"))
        .count()
}

/// Every VMA, one `PROCMAP_QUERY` each.
fn count_by_query(pid: u32) -> usize {
    let maps = std::fs::File::open(format!("/proc/{pid}/maps")).unwrap();
    let mut name = vec![0u8; 4096];
    let (mut at, mut n) = (0, 0);
    while let Some(v) = procmap_query(maps.as_fd(), at, 0, &mut name).unwrap() {
        at = v.end;
        n += 1;
    }
    n
}

fn main() {
    let vmas = arg("--vmas", 10_000);
    let runs = arg("--runs", 50).max(1);
    let pid = std::process::id();
    let mapping = AnonMapping::new(vmas * 4096, HugePages::Never).expect("mapping");
    let split = mapping.split_vmas(1).expect("split");
    let total = proc::map_count(pid).unwrap();
    type Way = (&'static str, Box<dyn Fn() -> usize>);
    let ways: Vec<Way> = vec![
        (
            "executable VMAs: maps text, every line",
            Box::new(move || exec_from_text(pid)),
        ),
        (
            "executable VMAs: `PROCMAP_QUERY` (`vma_query::executable_vmas`)",
            Box::new(move || {
                vma_query::executable_vmas(pid)
                    .unwrap()
                    .expect("PROCMAP_QUERY")
                    .len()
            }),
        ),
        (
            "VMA count: maps text (`proc::map_count`)",
            Box::new(move || proc::map_count(pid).unwrap() as usize),
        ),
        (
            "VMA count: `PROCMAP_QUERY`, one per VMA",
            Box::new(move || count_by_query(pid)),
        ),
    ];
    let mut times: Vec<Vec<f64>> = vec![Vec::new(); ways.len()];
    let mut found = vec![0; ways.len()];
    for _ in 0..runs {
        for (i, (_, f)) in ways.iter().enumerate() {
            let t = Instant::now();
            found[i] = std::hint::black_box(f());
            times[i].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    println!(
        "One process with {total} VMAs ({split} of them one-page VMAs of one split mapping), \
         {runs} runs of each way, interleaved (the text has one line more: the `[vsyscall]` page, which is no VMA). Example `crates/linux/examples/vma_read_cost.rs`.\n"
    );
    println!("| way | found | ms, median | range |");
    println!("|---|---:|---:|---:|");
    for (i, (name, _)) in ways.iter().enumerate() {
        let t = &mut times[i];
        t.sort_by(f64::total_cmp);
        println!(
            "| {name} | {} | {:.2} | {:.2}–{:.2} |",
            found[i],
            t[t.len() / 2],
            t[0],
            t[t.len() - 1]
        );
    }
    drop(mapping);
}
