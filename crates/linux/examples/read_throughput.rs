//! Read throughput of pagesift-linux on this machine, in pages per second.
//!
//! Starts `pagesift-workload random --mib N` (N MiB of distinct, resident
//! 4 KiB pages; `--thp` for THP-backed memory), then times, best of
//! `--runs`:
//! - page inspection: pagemap + kpageflags ([`PageInspector`]), and
//!   `PAGEMAP_SCAN` present runs;
//! - the pinned path (`process_vm_readv`): contiguous 4 MiB reads, and one
//!   iovec per page (every other page, so nothing coalesces: 1024 iovecs
//!   per call);
//! - the unpinned path (`/proc/PID/mem`): contiguous 4 MiB reads, and one
//!   page per call;
//! - [`LinuxSource::read_pages`] over every page in address order (what an
//!   exact scan does: presence re-check plus read) and over pages in random
//!   order;
//! - sampling scattered pages (state, then contents) page by page, in
//!   batches of 64 with [`LinuxSource::sample_pages`], and in clusters of
//!   4 neighbours, 16 clusters per call: what the sampler does.
//!
//! A raw C measurement gave 2.47 M pages/s for contiguous `process_vm_readv`
//! and 1.95 M/s with 1024 page iovecs; these figures should be close.
//!
//! Run (as root):
//! ```text
//! cargo build --release -p pagesift-workload
//! cargo run --release -p pagesift-linux --example read_throughput -- --mib 1024
//! ```

use pagesift_core::source::MemorySource;
use pagesift_core::{PageRef, WORDS_PER_PAGE};
use pagesift_linux::inspect::{PageInfo, PageInspector};
use pagesift_linux::pagemap::Pagemap;
use pagesift_linux::{LinuxSource, PageBuffer, ProcessFilter, RemoteReader, SourceConfig};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Instant;

struct Args {
    mib: u64,
    runs: usize,
    thp: bool,
    workload: std::path::PathBuf,
}

fn args() -> Args {
    let mut a = Args {
        mib: 1024,
        runs: 3,
        thp: false,
        workload: std::env::current_exe()
            .unwrap()
            .parent()
            .and_then(|d| d.parent())
            .unwrap()
            .join("pagesift-workload"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--mib" => a.mib = it.next().unwrap().parse().unwrap(),
            "--runs" => a.runs = it.next().unwrap().parse().unwrap(),
            "--thp" => a.thp = true,
            "--workload" => a.workload = it.next().unwrap().into(),
            other => panic!("unknown argument {other}; use --mib N --runs R --thp --workload PATH"),
        }
    }
    a
}

/// Kills the workload even if a measurement panics.
struct Guard(std::process::Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Best pages/s of `runs` runs of `f`, which returns the pages it handled.
fn best(runs: usize, mut f: impl FnMut() -> u64) -> f64 {
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            let n = f();
            n as f64 / t.elapsed().as_secs_f64()
        })
        .fold(0.0, f64::max)
}

fn line(what: &str, pages_per_s: f64) {
    println!(
        "{what:<58} {:>6.2} M pages/s  {:>6.2} GB/s",
        pages_per_s / 1e6,
        pages_per_s * 4096.0 / 1e9
    );
}

fn main() {
    let a = args();
    assert!(
        a.workload.exists(),
        "{} not found: cargo build --release -p pagesift-workload (or pass --workload)",
        a.workload.display()
    );
    let mut cmd = Command::new(&a.workload);
    cmd.args(["random", "--mib", &a.mib.to_string()]);
    if a.thp {
        cmd.arg("--thp");
    }
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let guard = Guard(child);
    let mut report = String::new();
    std::io::BufReader::new(out).read_line(&mut report).unwrap();
    let pid = guard.0.id();
    let v = |k: &str| -> u64 {
        let i = report.find(&format!("\"{k}\":")).unwrap() + k.len() + 3;
        report[i..]
            .split([',', '}'])
            .next()
            .unwrap()
            .parse()
            .unwrap()
    };
    let start = v("start");
    let pages = v("pages") as usize;
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l[13..].to_string())
        })
        .unwrap_or_default();
    println!(
        "target: {} MiB random{} = {pages} pages; kernel {}; cpu {cpu}",
        a.mib,
        if a.thp { " (THP)" } else { "" },
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap()
            .trim()
    );

    // Inspection.
    let mut ins = PageInspector::open(pid).unwrap();
    let mut infos = vec![PageInfo::default(); 512];
    line(
        "inspect: pagemap + kpageflags, 512 pages per call",
        best(a.runs, || {
            for k in (0..pages).step_by(512) {
                let n = (pages - k).min(512);
                ins.inspect(start + (k * 4096) as u64, &mut infos[..n])
                    .unwrap();
            }
            pages as u64
        }),
    );
    let pm = Pagemap::open(pid).unwrap();
    line(
        "inspect: PAGEMAP_SCAN present runs",
        best(a.runs, || {
            let runs = pm
                .present_runs(start, start + (pages * 4096) as u64)
                .unwrap();
            runs.iter().map(|r| (r.end - r.start) / 4096).sum()
        }),
    );

    // The two read paths.
    let chunk = 1024;
    let mut buf = PageBuffer::new(chunk);
    let mut r = RemoteReader::new(pid).unwrap();
    line(
        "pinned (process_vm_readv), contiguous 4 MiB per call",
        best(a.runs, || {
            let mut n = 0;
            for k in (0..pages).step_by(chunk) {
                let m = (pages - k).min(chunk);
                n += r
                    .read_range(start + (k * 4096) as u64, &mut buf.pages_mut()[..m])
                    .unwrap();
            }
            n as u64
        }),
    );
    let strided: Vec<u64> = (0..pages)
        .step_by(2)
        .map(|i| start + (i * 4096) as u64)
        .collect();
    line(
        "pinned (process_vm_readv), 1 iovec per page, 1024 per call",
        best(a.runs, || {
            let mut n = 0;
            for batch in strided.chunks(chunk) {
                n += r
                    .read_pages(batch, &mut buf.pages_mut()[..batch.len()])
                    .unwrap();
            }
            n as u64
        }),
    );
    line(
        "unpinned (/proc/PID/mem), contiguous 4 MiB per call",
        best(a.runs, || {
            let mut n = 0;
            for k in (0..pages).step_by(chunk) {
                let m = (pages - k).min(chunk);
                n += r
                    .read_range_unpinned(start + (k * 4096) as u64, &mut buf.pages_mut()[..m])
                    .unwrap();
            }
            n as u64
        }),
    );
    line(
        "unpinned (/proc/PID/mem), 1 page per call",
        best(a.runs, || {
            let mut n = 0;
            for batch in strided.chunks(chunk) {
                n += r
                    .read_pages_unpinned(batch, &mut buf.pages_mut()[..batch.len()])
                    .unwrap();
            }
            n as u64
        }),
    );

    // Through the MemorySource, as the scan will use it.
    let mut src = LinuxSource::new(ProcessFilter::pids([pid]), SourceConfig::default()).unwrap();
    let region = src.linux_regions().find(|r| r.start == start).unwrap().id;
    let all: Vec<PageRef> = (0..pages as u32)
        .map(|page| PageRef { region, page })
        .collect();
    let mut out = vec![[0u32; WORDS_PER_PAGE]; chunk];
    line(
        "LinuxSource::read_pages, all pages in order, 1024 per call",
        best(a.runs, || {
            let mut n = 0;
            for batch in all.chunks(chunk) {
                n += src.read_pages(batch, &mut out[..batch.len()]);
            }
            n as u64
        }),
    );
    let mut shuffled = all.clone();
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for i in (1..shuffled.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        shuffled.swap(i, (x % (i as u64 + 1)) as usize);
    }
    let sample = &shuffled[..shuffled.len().min(65536)];
    line(
        "LinuxSource::read_pages, random pages, 64 per call",
        best(a.runs, || {
            let mut n = 0;
            for batch in sample.chunks(64) {
                n += src.read_pages(batch, &mut out[..batch.len()]);
            }
            n as u64
        }),
    );
    // What the sampler does: state and contents of scattered pages, page
    // by page (before batching) and 64 per call (`sample_pages`).
    let sample = &shuffled[..shuffled.len().min(16384)];
    line(
        "sampling page by page: page_state + read_page, random pages",
        best(a.runs, || {
            for &p in sample {
                let _ = src.page_state(p);
                let _ = src.read_page(p, &mut out[0]);
            }
            sample.len() as u64
        }),
    );
    let mut states = vec![Ok(pagesift_core::source::PageState::NotPresent); 64];
    let mut read = vec![false; 64];
    line(
        "sampling in batches: LinuxSource::sample_pages, random pages, 64 per call",
        best(a.runs, || {
            let mut n = 0;
            for batch in sample.chunks(64) {
                src.sample_pages(batch, &mut out[..64], &mut states, &mut read);
                n += read[..batch.len()].iter().filter(|&&r| r).count();
            }
            n as u64
        }),
    );
    // Clusters of 4 neighbours at scattered places (scan.cluster_pages).
    let clustered: Vec<PageRef> = sample
        .iter()
        .filter(|p| (p.page as usize) + 4 <= pages)
        .flat_map(|p| {
            let first = p.page / 4 * 4;
            (first..first + 4).map(move |page| PageRef {
                region: p.region,
                page,
            })
        })
        .collect();
    line(
        "sampling in clusters of 4: sample_pages, 16 clusters per call",
        best(a.runs, || {
            let mut n = 0;
            for batch in clustered.chunks(64) {
                src.sample_pages(batch, &mut out[..64], &mut states, &mut read);
                n += read[..batch.len()].iter().filter(|&&r| r).count();
            }
            n as u64
        }),
    );
    drop(guard);
}
