//! Exact-scan throughput on this machine, in present pages per second.
//!
//! Starts one `pagesift-workload` (default: `random --mib 2048`, 2 GiB of
//! distinct resident pages; `--kind static-dup` or `mixed` for other
//! contents), then measures:
//! - `pagesift scan --exact --pid PID --json` as an operator runs it, a
//!   fresh process per scan (so the scanner's own memory starts cold every
//!   time, as it does for them): its first scan of the workload apart (it
//!   pays the kernel's LRU activation of every freshly written page, once),
//!   then best and median of `--runs`, with one thread and with two
//!   (reads overlapped with hashing). Pages per second are the report's
//!   present pages over its `elapsed_ms`, and over its `cpu_ms` (what one
//!   dedicated core would do; the machine may be shared);
//! - where the time goes: the same scan in this process
//!   ([`pagesift_scan::exact::run_with_stats`]), timed per phase;
//! - what the scan is made of, on one core: the read alone (pagemap +
//!   `process_vm_readv` of the workload region in 2 MiB chunks, as the scan
//!   reads it) and the hash alone (XXH3-64 of 2 MiB chunks that are in
//!   the cache, as the scan hashes them right after reading).
//!
//! The goal is ≥ 1.5 M present pages per second on one core.
//! Every figure is printed as a `RESULT key=value ...` line, and where
//! each scan's time went (ns per page and phase) as a `PHASES` line, for
//! `scripts/bench-scan`, which writes docs/benchmarks.md.
//!
//! Run (as root):
//! ```text
//! cargo build --release -p pagesift-workload -p pagesift
//! cargo run --release -p pagesift-scan --example exact_throughput -- --mib 2048
//! ```

use pagesift_core::PAGE_SIZE;
use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
use pagesift_linux::{PageBuffer, ProcessFilter, RemoteReader};
use pagesift_scan::exact::{CHUNK_PAGES, ExactOptions, page_hash, run_with_stats};
use std::io::BufRead;
use std::process::{Command, Stdio};
use std::time::Instant;

struct Args {
    mib: u64,
    runs: usize,
    kind: String,
    workload: std::path::PathBuf,
    pagesift: std::path::PathBuf,
}

fn args() -> Args {
    // Examples live in target/<profile>/examples; the binaries one level up.
    let bin_dir = std::env::current_exe()
        .expect("current_exe")
        .parent()
        .and_then(|d| d.parent())
        .expect("examples live in target/<profile>/examples")
        .to_path_buf();
    let mut a = Args {
        mib: 2048,
        runs: 3,
        kind: "random".into(),
        workload: bin_dir.join("pagesift-workload"),
        pagesift: bin_dir.join("pagesift"),
    };
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        let mut val = || it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--mib" => a.mib = val().parse().expect("--mib N"),
            "--runs" => a.runs = val().parse().expect("--runs N"),
            "--kind" => a.kind = val(),
            "--workload" => a.workload = val().into(),
            "--pagesift" => a.pagesift = val().into(),
            other => panic!(
                "unknown argument {other}; use --mib N --runs R --kind random|static-dup|mixed --workload PATH --pagesift PATH"
            ),
        }
    }
    a
}

/// One `pagesift scan --exact` process: (present pages per second of the
/// scan's wall time, per second of its CPU time, present pages, wall
/// seconds of the whole process including its start and the report).
fn cli_scan(a: &Args, pid: u32, threads: usize) -> (f64, f64, u64, f64) {
    let t = Instant::now();
    let out = Command::new(&a.pagesift)
        .args([
            "scan",
            "--exact",
            "--json",
            "--threads",
            &threads.to_string(),
        ])
        .args(["--pid", &pid.to_string()])
        .stderr(Stdio::inherit())
        .output()
        .expect("running pagesift scan");
    let wall = t.elapsed().as_secs_f64();
    assert!(out.status.success(), "pagesift scan failed: {}", out.status);
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).expect("scan JSON");
    let present = r["totals"]["present"].as_u64().expect("totals.present");
    let secs = r["elapsed_ms"].as_f64().expect("elapsed_ms") / 1e3;
    let cpu = r["cpu_ms"].as_f64().expect("cpu_ms") / 1e3;
    println!(
        "  pagesift scan --exact --threads {threads}: {present} present pages in {secs:.3} s, {cpu:.3} CPU-s ({wall:.3} s with the process start)"
    );
    (present as f64 / secs, present as f64 / cpu, present, wall)
}

/// CPU time of this process (all threads), in seconds.
fn cpu_seconds() -> f64 {
    pagesift_linux::host::process_cpu_ns() as f64 * 1e-9
}

/// Kills the workload even if a measurement panics.
struct Guard(std::process::Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Best and median of `runs` runs of `f`, which returns pages/s.
fn measure(runs: usize, mut f: impl FnMut() -> f64) -> (f64, f64) {
    let mut v: Vec<f64> = (0..runs.max(1)).map(|_| f()).collect();
    v.sort_by(f64::total_cmp);
    (v[v.len() - 1], v[v.len() / 2])
}

fn result(what: &str, a: &Args, extra: &str, (best, median): (f64, f64)) {
    println!(
        "{what:<44} best {:>5.2} M pages/s  median {:>5.2} M pages/s",
        best / 1e6,
        median / 1e6
    );
    println!(
        "RESULT what={what} kind={} mib={} runs={} best={best:.0} median={median:.0}{extra}",
        a.kind, a.mib, a.runs
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
    cmd.args([a.kind.as_str(), "--mib", &a.mib.to_string()]);
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::piped())
        .spawn()
        .expect("spawning the workload");
    let out = child.stdout.take().expect("stdout");
    let guard = Guard(child);
    let mut line = String::new();
    std::io::BufReader::new(out)
        .read_line(&mut line)
        .expect("workload report");
    let report: serde_json::Value = serde_json::from_str(&line).expect("workload JSON");
    let pid = guard.0.id();
    let start = report["regions"][0]["start"]
        .as_u64()
        .expect("region start");
    let pages = report["regions"][0]["pages"]
        .as_u64()
        .expect("region pages") as usize;
    println!(
        "workload: {} --mib {} (pid {pid}): {pages} pages, {} present",
        a.kind, a.mib, report["present_pages"]
    );

    // The first scan of memory the workload has just written is measured
    // apart: process_vm_readv touches every page it reads (FOLL_TOUCH), and
    // a page touched a second time since it was written (the workload's
    // MADV_POPULATE_WRITE was the first) is moved to the active LRU list,
    // under the LRU lock. That is paid once per page, not once per scan;
    // the runs that follow read pages already active, as memory that lives
    // long enough to be worth deduplicating mostly is.
    let (first, first_cpu, present, _) = cli_scan(&a, pid, 1);
    let extra = |threads: usize| format!(" threads={threads} frames={present}");
    result(
        "first exact scan of freshly written memory, 1 thread",
        &a,
        &extra(1),
        (first, first),
    );
    result(
        "first exact scan, 1 thread, per CPU-second",
        &a,
        &extra(1),
        (first_cpu, first_cpu),
    );

    // `pagesift scan --exact`, one and two threads, best and median.
    for threads in [1usize, 2] {
        let mut per_cpu = Vec::new();
        let mut with_start = Vec::new();
        let r = measure(a.runs, || {
            let (pps, cpu, present, wall) = cli_scan(&a, pid, threads);
            per_cpu.push(cpu);
            with_start.push(present as f64 / wall);
            pps
        });
        let name = format!(
            "exact scan, {threads} thread{}",
            if threads == 1 { "" } else { "s" }
        );
        let best_median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            (v[v.len() - 1], v[v.len() / 2])
        };
        result(&name, &a, &extra(threads), r);
        result(
            &format!("{name}, per CPU-second"),
            &a,
            &extra(threads),
            best_median(per_cpu),
        );
        result(
            &format!("{name}, with the process start and report"),
            &a,
            &extra(threads),
            best_median(with_start),
        );
    }

    // Where the time goes: the same scans in this process, timed per phase
    // (PHASES lines only).
    for threads in [1usize, 2] {
        for _ in 0..a.runs {
            let (_, s) = run_with_stats(&ExactOptions {
                filter: ProcessFilter::pids([pid]),
                threads,
                ..ExactOptions::default()
            })
            .expect("exact scan");
            let per_page = |ns: u64| ns as f64 / s.frames as f64;
            let t = &s.time;
            println!(
                "PHASES kind={} threads={threads} total={:.0} discovery={:.0} inspect={:.0} reads={:.0} hash={:.0} group={:.0}",
                a.kind,
                per_page(s.scan_ns),
                per_page(t.discover_ns),
                per_page(t.inspect_ns),
                per_page(t.read_ns),
                per_page(t.hash_ns),
                per_page(t.group_ns - t.hash_ns),
            );
        }
    }

    // Its parts on one core: reading (pagemap + process_vm_readv) ...
    let pagemap = Pagemap::open(pid).expect("pagemap");
    let mut reader = RemoteReader::new(pid).expect("reader");
    let mut buf = PageBuffer::new(CHUNK_PAGES);
    let mut entries = vec![PagemapEntry(0); CHUNK_PAGES];
    let mut per_cpu = Vec::new();
    let r = measure(a.runs, || {
        let t = Instant::now();
        let cpu0 = cpu_seconds();
        let mut done = 0;
        while done < pages {
            let n = (pages - done).min(CHUNK_PAGES);
            let at = start + (done * PAGE_SIZE) as u64;
            pagemap.read(at, &mut entries[..n]).expect("pagemap read");
            assert!(entries[..n].iter().all(|e| e.present()), "all present");
            let got = reader
                .read_range(at, &mut buf.pages_mut()[..n])
                .expect("read");
            assert_eq!(got, n);
            done += n;
        }
        per_cpu.push(pages as f64 / (cpu_seconds() - cpu0));
        pages as f64 / t.elapsed().as_secs_f64()
    });
    result("read only (pagemap + process_vm_readv)", &a, "", r);
    per_cpu.sort_by(f64::total_cmp);
    result(
        "read only, per CPU-second",
        &a,
        "",
        (per_cpu[per_cpu.len() - 1], per_cpu[per_cpu.len() / 2]),
    );

    // ... and hashing 2 MiB chunks that are in the cache.
    reader
        .read_range(start, buf.pages_mut())
        .expect("read one chunk");
    let r = measure(a.runs, || {
        let t = Instant::now();
        let mut acc = 0u64;
        for _ in 0..pages.div_ceil(CHUNK_PAGES) {
            for p in buf.pages() {
                acc ^= page_hash(std::hint::black_box(p));
            }
        }
        std::hint::black_box(acc);
        (pages.div_ceil(CHUNK_PAGES) * CHUNK_PAGES) as f64 / t.elapsed().as_secs_f64()
    });
    result("hash only (XXH3-64, cached chunk)", &a, "", r);
    drop(guard);
}
