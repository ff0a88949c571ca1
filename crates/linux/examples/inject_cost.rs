//! What one injection costs on this machine: per attach and per extra
//! syscall in the same attach (a raw C prototype measured 22–28 µs per
//! attach of a blocked thread, about 100 µs for a spinning one, and 12–13 µs
//! per extra syscall).
//!
//! Starts `inject_target` processes (one single-threaded, asleep in
//! `nanosleep`; one with a thread spinning in user space) and times, over
//! `--runs` injections each (default 300, the cases interleaved run by run
//! so that load from other processes falls on all alike), the median and
//! 90th percentile of:
//! - `run` as the caller sees it: /proc checks, thread choice, the hop to
//!   the tracer thread, seize → detach;
//! - the attach alone (`Injection::attached_for`, seize → detach; this is
//!   how long the target's thread is held);
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

    println!("runs per case: {runs}; µs; machine: {} cores", num_cpus());
    println!(
        "cases are interleaved run by run, so that load from other processes \
         falls on all of them alike"
    );
    println!("| case | run() median | run() p90 | attach median | attach p90 |");
    println!("|---|---|---|---|---|");
    let spin_tid = spinner.ready["tids"]["spin"].as_u64().unwrap() as u32;
    const CASES: [&str; 4] = [
        "blocked thread (nanosleep), 1 × getpid",
        "blocked thread, 10 × getpid",
        "blocked thread, madvise(MERGEABLE) 16 MiB + VMA count",
        "spinning thread (user space), 1 × getpid",
    ];
    let mut total: Vec<Vec<Duration>> = vec![Vec::new(); CASES.len()];
    let mut attached: Vec<Vec<Duration>> = vec![Vec::new(); CASES.len()];
    // Paired per round, so that a burst of load cancels out.
    let mut extra_total = Vec::new();
    let mut extra_attached = Vec::new();
    for _ in 0..runs {
        for (k, t, a) in (0..CASES.len()).map(|k| {
            let t0 = Instant::now();
            let i = match k {
                0 => done(inj.run(pid, &[Syscall::Getpid]).unwrap()),
                1 => done(inj.run(pid, &[Syscall::Getpid; 10]).unwrap()),
                2 => done(inj.run(pid, &[region]).unwrap()),
                _ => done(
                    inj.run_on_thread(spinner.pid(), spin_tid, &[Syscall::Getpid])
                        .unwrap(),
                ),
            };
            let t = t0.elapsed();
            // Let the targets run between injections, as a daemon would.
            std::thread::sleep(Duration::from_micros(300));
            (k, t, i.attached_for)
        }) {
            total[k].push(t);
            attached[k].push(a);
        }
        let n = total[0].len() - 1;
        let per = |v: &[Vec<Duration>]| (v[1][n].as_secs_f64() - v[0][n].as_secs_f64()) * 1e6 / 9.0;
        extra_total.push(per(&total));
        extra_attached.push(per(&attached));
    }
    for (k, name) in CASES.iter().enumerate() {
        let (tm, tp) = stats(total[k].clone());
        let (am, ap) = stats(attached[k].clone());
        println!("| {name} | {tm:.1} | {tp:.1} | {am:.1} | {ap:.1} |");
    }

    // First injection into a process: the vdso lookup and cold /proc
    // dentries (fresh small targets, started beforehand), each paired with
    // a warm injection into the sleeper right before it.
    let fresh: Vec<Target> = (0..30)
        .map(|_| Target::start("sleep", &["--ms", "50", "--mib", "1"]))
        .collect();
    let (mut cold_t, mut cold_a, mut warm_a) = (Vec::new(), Vec::new(), Vec::new());
    for f in &fresh {
        warm_a.push(done(inj.run(pid, &[Syscall::Getpid]).unwrap()).attached_for);
        std::thread::sleep(Duration::from_micros(300));
        let t0 = Instant::now();
        let i = done(inj.run(f.pid(), &[Syscall::Getpid]).unwrap());
        cold_t.push(t0.elapsed());
        cold_a.push(i.attached_for);
        std::thread::sleep(Duration::from_micros(300));
    }
    let ((tm, tp), (am, ap)) = (stats(cold_t), stats(cold_a));
    println!(
        "| first injection into a process (vdso lookup), 30 processes | {tm:.1} | {tp:.1} | {am:.1} | {ap:.1} |"
    );
    println!(
        "(warm attach into the sleeper, paired with those: median {:.1} µs)",
        stats(warm_a).0
    );
    drop(fresh);

    let med = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    println!(
        "\nper extra syscall in the same attach (median of paired (10 - 1) / 9): \
         {:.1} µs by run(), {:.1} µs by attach",
        med(extra_total),
        med(extra_attached)
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
