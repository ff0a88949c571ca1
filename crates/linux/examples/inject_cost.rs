//! What one injection costs on this machine: per attach and per extra
//! syscall in the same attach (mechanisms.md §1 measured 22–28 µs per
//! attach of a blocked thread, about 100 µs for a spinning one, and 12–13 µs
//! per extra syscall with raw C).
//!
//! Starts `inject_target` processes (one single-threaded, asleep in
//! `nanosleep`; one with a thread spinning in user space) and times, over
//! `--runs` injections each (default 300), the median and 90th percentile
//! of:
//! - `run` as the caller sees it: /proc checks, thread choice, the hop to
//!   the tracer thread, seize → detach;
//! - the attach alone (`Injection::attached_for`, seize → detach);
//!
//! for batches of 1 and 10 `getpid`s, a `madvise(MADV_MERGEABLE)` of a whole
//! 16 MiB VMA (with the VMA counting it implies), the spinning thread, and
//! the first injection into a process (vdso lookup; 30 fresh targets). Also
//! the /proc work alone: `choose_thread` and `map_count`.
//!
//! Run (as root):
//! ```text
//! cargo build --release -p pagesift-linux --examples
//! target/release/examples/inject_cost [--runs N]
//! ```

use pagesift_linux::inject::{
    Advice, InjectConfig, Injection, Injector, Outcome, Syscall, choose_thread, map_count,
};
use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Target {
    child: Child,
    ready: serde_json::Value,
}

impl Target {
    fn start(mode: &str, args: &[&str]) -> Target {
        let bin = std::env::current_exe()
            .unwrap()
            .parent()
            .unwrap()
            .join("inject_target");
        let mut child = Command::new(&bin)
            .arg(mode)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("{}: {e} (build the examples first)", bin.display()));
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        Target {
            child,
            ready: serde_json::from_str(&line).expect("ready line"),
        }
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Median and 90th percentile, in µs.
fn stats(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    (us(v[v.len() / 2]), us(v[v.len() * 9 / 10]))
}

fn measure(runs: usize, mut f: impl FnMut() -> Injection) -> ((f64, f64), (f64, f64)) {
    let mut total = Vec::with_capacity(runs);
    let mut attached = Vec::with_capacity(runs);
    for _ in 0..runs {
        let t0 = Instant::now();
        let i = f();
        total.push(t0.elapsed());
        attached.push(i.attached_for);
        // Let the target run between injections, as a daemon would.
        std::thread::sleep(Duration::from_micros(500));
    }
    (stats(total), stats(attached))
}

fn done(o: Outcome) -> Injection {
    match o {
        Outcome::Done(i) => i,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn main() {
    assert!(
        rustix::process::geteuid().is_root(),
        "needs root (ptrace of other processes)"
    );
    let mut runs = 300;
    let mut it = std::env::args().skip(1);
    while let Some(k) = it.next() {
        match k.as_str() {
            "--runs" => runs = it.next().unwrap().parse().unwrap(),
            _ => panic!("unknown option {k}"),
        }
    }
    let sleeper = Target::start("sleep", &["--ms", "50"]);
    let spinner = Target::start("threads", &[]);
    let pid = sleeper.pid();
    let region = Syscall::Madvise {
        addr: sleeper.ready["addr"].as_u64().unwrap(),
        len: sleeper.ready["len"].as_u64().unwrap(),
        advice: Advice::Mergeable,
    };
    let mut inj = Injector::new(InjectConfig::default());
    // Warm up: tracer thread, vdso lookup, page cache of /proc.
    for _ in 0..20 {
        done(inj.run(pid, &[Syscall::Getpid]).unwrap());
    }

    let row = |name: &str, ((tm, tp), (am, ap)): ((f64, f64), (f64, f64))| {
        println!("| {name} | {tm:.1} | {tp:.1} | {am:.1} | {ap:.1} |");
    };
    println!("runs per row: {runs}; µs; machine: {} cores", num_cpus());
    println!("| case | run() median | run() p90 | attach median | attach p90 |");
    println!("|---|---|---|---|---|");
    let one = measure(runs, || done(inj.run(pid, &[Syscall::Getpid]).unwrap()));
    row("blocked thread (nanosleep), 1 × getpid", one);
    let ten = measure(runs, || done(inj.run(pid, &[Syscall::Getpid; 10]).unwrap()));
    row("blocked thread, 10 × getpid", ten);
    let madv = measure(runs, || done(inj.run(pid, &[region]).unwrap()));
    row(
        "blocked thread, madvise(MERGEABLE) 16 MiB + VMA count",
        madv,
    );
    let spin_tid = spinner.ready["tids"]["spin"].as_u64().unwrap() as u32;
    let spin = measure(runs, || {
        done(
            inj.run_on_thread(spinner.pid(), spin_tid, &[Syscall::Getpid])
                .unwrap(),
        )
    });
    row("spinning thread (user space), 1 × getpid", spin);
    // First injection into a process: the vdso lookup and cold /proc
    // dentries (fresh small targets, started beforehand).
    let fresh: Vec<Target> = (0..30)
        .map(|_| Target::start("sleep", &["--ms", "50", "--mib", "1"]))
        .collect();
    let mut k = 0;
    let cold = measure(fresh.len(), || {
        k += 1;
        done(inj.run(fresh[k - 1].pid(), &[Syscall::Getpid]).unwrap())
    });
    row("first injection into a process (vdso lookup)", cold);
    drop(fresh);

    let per_extra = |a: f64, b: f64| (b - a) / 9.0;
    println!(
        "\nper extra syscall in the same attach: {:.1} µs (run() medians), {:.1} µs (attach medians)",
        per_extra(one.0.0, ten.0.0),
        per_extra(one.1.0, ten.1.0)
    );

    let time = |f: &mut dyn FnMut()| {
        let mut v = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t0 = Instant::now();
            f();
            v.push(t0.elapsed());
        }
        stats(v)
    };
    let (cm, cp) = time(&mut || {
        choose_thread(pid, false).unwrap();
    });
    let (mm, mp) = time(&mut || {
        map_count(pid).unwrap();
    });
    println!("choose_thread alone: median {cm:.1} µs, p90 {cp:.1} µs");
    println!(
        "map_count alone ({} VMAs): median {mm:.1} µs, p90 {mp:.1} µs",
        map_count(pid).unwrap()
    );
    println!("{:?}", inj.stats());
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
