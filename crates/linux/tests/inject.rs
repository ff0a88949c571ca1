//! Live tests of remote syscall injection: real target processes
//! (`examples/inject_target.rs`), real ptrace, real `madvise`/`prctl`.
//!
//! Every test checks that its target was not harmed: the target checksums
//! its own memory before and after and checks every syscall it makes (no
//! EINTR, no early return, no lost data), reports on its stdout pipe, and
//! must exit by itself with status 0. Each target is killed by a guard if
//! the test fails. Nothing here touches `/sys/kernel/mm/ksm`: marking a
//! range mergeable only sets `VM_MERGEABLE` (`mg`), and ksmd merges nothing
//! unless `run = 1`, which these tests leave as they find it.
//!
//! Root is needed (ptrace of other processes, /proc/PID/syscall). The
//! tests run one at a time (`pagesift_testkit::serial`), so that timing-sensitive checks of
//! the targets do not compete for the machine's two cores.

use pagesift_linux::discover;
use pagesift_linux::inject::{
    Advice, InjectConfig, Injector, Outcome, SkipReason, Syscall, ThreadRank, choose_thread,
};
use pagesift_testkit::Target;
use serde_json::Value;
use std::path::PathBuf;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

/// One test at a time (pagesift_testkit::serial), as root: the injection
/// tests ptrace other processes.
fn serial() -> pagesift_testkit::Serial {
    pagesift_testkit::require_root();
    pagesift_testkit::serial()
}

/// `VmFlags` `mg` of the VMA containing `addr`, and how many VMAs
/// `[addr, addr + len)` spans.
fn vma_state(pid: u32, addr: u64, len: u64) -> (bool, usize) {
    let r = discover::process_regions(pid).expect("smaps");
    let at = r
        .eligible
        .iter()
        .find(|v| v.start <= addr && addr < v.end)
        .expect("the target's region");
    let spans = r
        .eligible
        .iter()
        .filter(|v| v.start < addr + len && addr < v.end)
        .count();
    (at.mergeable, spans)
}

fn mergeable(pid: u32, addr: u64) -> bool {
    vma_state(pid, addr, 1).0
}

fn proc_state(pid: u32) -> char {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    s[s.rfind(')').unwrap() + 2..].chars().next().unwrap()
}

/// Whether `pid` is blocked in nanosleep or clock_nanosleep: the first
/// field of `/proc/PID/syscall` is the number of the call it sits in.
fn in_sleep_syscall(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<i64>().ok())
        .is_some_and(|nr| nr == libc::SYS_nanosleep || nr == libc::SYS_clock_nanosleep)
}

fn tracer_pid(pid: u32) -> u32 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    s.lines()
        .find_map(|l| l.strip_prefix("TracerPid:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn madvise(t: &Target, advice: Advice) -> Syscall {
    Syscall::Madvise {
        addr: t.addr(),
        len: t.len(),
        advice,
    }
}

fn done(o: Outcome) -> pagesift_linux::inject::Injection {
    match o {
        Outcome::Done(i) => i,
        other => panic!("expected Done, got {other:?}"),
    }
}

/// Injects in a loop for `dur`, alternating MERGEABLE/UNMERGEABLE on the
/// target's region plus a getpid; checks every batch ran fully and
/// correctly. Returns the injections.
fn hammer(inj: &mut Injector, t: &Target, dur: Duration) -> Vec<pagesift_linux::inject::Injection> {
    let pid = t.pid();
    let mut out = Vec::new();
    let end = Instant::now() + dur;
    let mut k = 0;
    while Instant::now() < end {
        let advice = if k % 2 == 0 {
            Advice::Mergeable
        } else {
            Advice::Unmergeable
        };
        let i = done(
            inj.run(pid, &[madvise(t, advice), Syscall::Getpid])
                .unwrap(),
        );
        assert_eq!(i.results, vec![0, pid as i64], "batch {k}");
        out.push(i);
        k += 1;
        std::thread::sleep(Duration::from_micros(300));
    }
    out
}

#[test]
fn madvise_sets_and_clears_mg() {
    let _g = serial();
    let t = Target::start("sleep", &[]);
    let mut inj = Injector::new(InjectConfig::default());
    assert!(!mergeable(t.pid(), t.addr()));
    let i = done(inj.run(t.pid(), &[madvise(&t, Advice::Mergeable)]).unwrap());
    assert_eq!(i.results, vec![0]);
    assert!(mergeable(t.pid(), t.addr()), "mg set by MADV_MERGEABLE");
    // Whole-VMA advice splits nothing.
    assert_eq!(i.vma_delta(), Some(0));
    let i = done(
        inj.run(t.pid(), &[madvise(&t, Advice::Unmergeable)])
            .unwrap(),
    );
    assert_eq!(i.results, vec![0]);
    assert!(
        !mergeable(t.pid(), t.addr()),
        "mg cleared by MADV_UNMERGEABLE"
    );
    // A bad range is the target's error, returned as -errno, harmlessly.
    let hole = Syscall::Madvise {
        addr: 0x1000,
        len: 0x1000,
        advice: Advice::Mergeable,
    };
    let i = done(inj.run(t.pid(), &[hole, Syscall::Getpid]).unwrap());
    assert_eq!(i.results, vec![-(libc::ENOMEM as i64), t.pid() as i64]);
    t.finish();
}

#[test]
fn sub_range_splits_are_counted_and_capped() {
    let _g = serial();
    let t = Target::start("sleep", &[]);
    let mut inj = Injector::new(InjectConfig::default());
    let third = t.len() / 3 / 4096 * 4096;
    let middle = |advice| Syscall::Madvise {
        addr: t.addr() + third,
        len: third,
        advice,
    };
    assert_eq!(vma_state(t.pid(), t.addr(), t.len()).1, 1);
    let i = done(inj.run(t.pid(), &[middle(Advice::Mergeable)]).unwrap());
    assert_eq!(i.results, vec![0]);
    assert_eq!(i.vma_delta(), Some(2), "one VMA split in three");
    assert_eq!(vma_state(t.pid(), t.addr(), t.len()).1, 3);
    assert!(!mergeable(t.pid(), t.addr()));
    assert!(mergeable(t.pid(), t.addr() + third));
    assert!(!mergeable(t.pid(), t.addr() + 2 * third));
    let i = done(inj.run(t.pid(), &[middle(Advice::Unmergeable)]).unwrap());
    assert_eq!(i.vma_delta(), Some(-2), "the three merge back");
    assert_eq!(inj.stats().vma_delta, 0);

    // A budget the process is already past: refused, nothing changed.
    let vmas = pagesift_linux::inject::map_count(t.pid()).unwrap();
    let limit = pagesift_linux::inject::max_map_count().unwrap();
    let mut tight = Injector::new(InjectConfig {
        max_map_fraction: vmas as f64 / limit as f64,
        ..InjectConfig::default()
    });
    match tight.run(t.pid(), &[middle(Advice::Mergeable)]).unwrap() {
        Outcome::Skipped(SkipReason::MapCountNearLimit {
            count, projected, ..
        }) => {
            assert_eq!(count, vmas);
            assert_eq!(projected, vmas + 2);
        }
        other => panic!("expected MapCountNearLimit, got {other:?}"),
    }
    assert_eq!(vma_state(t.pid(), t.addr(), t.len()), (false, 1));
    // The default budget is half of vm.max_map_count.
    assert!(pagesift_linux::inject::map_budget(limit / 2 - 2, 1, limit, 0.5).is_ok());
    assert!(pagesift_linux::inject::map_budget(limit / 2 - 1, 1, limit, 0.5).is_err());
    t.finish();
}

/// Without `count_vmas_after` nothing is counted after a batch: the next
/// batch's budget check stands on the bound (two splits a `madvise`) while
/// the count it grew from is fresh, and counts again after that. The
/// bound is shared: another injector's next batch stands on it too.
#[test]
fn uncounted_splits_are_bounded_until_the_count_is_stale() {
    let _g = serial();
    let t = Target::start("sleep", &[]);
    let mut inj = Injector::new(InjectConfig {
        count_vmas_after: false,
        ..InjectConfig::default()
    });
    let whole = |advice| Syscall::Madvise {
        addr: t.addr(),
        len: t.len(),
        advice,
    };
    let vmas = pagesift_linux::inject::map_count(t.pid()).unwrap();
    // The whole VMA: nothing splits, but the bound cannot know that.
    let i = done(inj.run(t.pid(), &[whole(Advice::Mergeable)]).unwrap());
    assert_eq!(i.results, vec![0]);
    assert_eq!((i.vmas_before, i.vmas_after), (Some(vmas), None));
    assert!(mergeable(t.pid(), t.addr()));
    assert_eq!(pagesift_linux::inject::map_count(t.pid()).unwrap(), vmas);
    let mut other = Injector::new(InjectConfig {
        count_vmas_after: false,
        ..InjectConfig::default()
    });
    let i = done(other.run(t.pid(), &[whole(Advice::Unmergeable)]).unwrap());
    assert_eq!(i.vmas_before, Some(vmas + 2), "the bound, not a count");
    let i = done(inj.run(t.pid(), &[whole(Advice::Mergeable)]).unwrap());
    assert_eq!(i.vmas_before, Some(vmas + 4), "the other injector's bound");
    let i = done(inj.run(t.pid(), &[whole(Advice::Unmergeable)]).unwrap());
    assert_eq!(i.results, vec![0]);
    // Past the count's freshness (2 s) it is read again.
    std::thread::sleep(std::time::Duration::from_millis(2_100));
    let i = done(inj.run(t.pid(), &[whole(Advice::Mergeable)]).unwrap());
    assert_eq!(i.vmas_before, Some(vmas), "counted again");
    let i = done(inj.run(t.pid(), &[whole(Advice::Unmergeable)]).unwrap());
    assert_eq!(i.results, vec![0]);
    assert!(!mergeable(t.pid(), t.addr()));
    t.finish();
}

#[test]
fn prctl_memory_merge_covers_every_vma() {
    let _g = serial();
    let t = Target::start("sleep", &[]);
    let mut inj = Injector::new(InjectConfig::default());
    let i = done(
        inj.run(
            t.pid(),
            &[
                Syscall::GetMemoryMerge,
                Syscall::SetMemoryMerge(true),
                Syscall::GetMemoryMerge,
            ],
        )
        .unwrap(),
    );
    assert_eq!(i.results, vec![0, 0, 1]);
    assert!(mergeable(t.pid(), t.addr()));
    let ksm = std::fs::read_to_string(format!("/proc/{}/ksm_stat", t.pid())).unwrap();
    assert!(ksm.contains("ksm_merge_any: yes"), "{ksm}");
    let i = done(inj.run(t.pid(), &[Syscall::SetMemoryMerge(false)]).unwrap());
    assert_eq!(i.results, vec![0]);
    assert!(!mergeable(t.pid(), t.addr()));
    t.finish();
}

#[test]
fn nanosleep_target_sees_no_error() {
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "20"]);
    let mut inj = Injector::new(InjectConfig::default());
    let runs = hammer(&mut inj, &t, Duration::from_millis(1200));
    // The thread was caught inside its sleep (nanosleep, clock_nanosleep or
    // restart_syscall), which the kernel must resume transparently.
    let in_sleep = runs
        .iter()
        .filter(|i| matches!(i.interrupted_syscall, Some(35 | 230 | 219)))
        .count();
    assert!(
        in_sleep > runs.len() / 2,
        "{in_sleep} of {} in a sleep",
        runs.len()
    );
    assert!(runs.iter().all(|i| !i.app_sees_eintr));
    let report = t.finish();
    // 1.2 s of 20 ms sleeps, every one complete.
    assert!(report["iterations"].as_u64().unwrap() >= 40, "{report}");
    eprintln!("nanosleep: {} injections, {report}", runs.len());
}

#[test]
fn read_target_sees_no_error() {
    let _g = serial();
    let mut t = Target::start("read", &[]);
    let pid = t.pid();
    let mut inj = Injector::new(InjectConfig::default());
    let mut runs = Vec::new();
    let mut sent = 0u64;
    let end = Instant::now() + Duration::from_millis(1200);
    while Instant::now() < end {
        t.send(&sent.to_le_bytes());
        sent += 1;
        runs.extend(hammer(&mut inj, &t, Duration::from_millis(2)));
    }
    let in_read = runs
        .iter()
        .filter(|i| i.interrupted_syscall == Some(0))
        .count();
    assert!(
        in_read > runs.len() / 2,
        "{in_read} of {} in read",
        runs.len()
    );
    let report = t.finish();
    assert_eq!(
        report["iterations"].as_u64(),
        Some(sent),
        "every record read once"
    );
    eprintln!("read: {} injections into {pid}, {sent} records", runs.len());
}

#[test]
fn futex_target_sees_no_error() {
    let _g = serial();
    let t = Target::start("futex", &["--ms", "20"]);
    let mut inj = Injector::new(InjectConfig::default());
    let runs = hammer(&mut inj, &t, Duration::from_millis(1200));
    let in_futex = runs
        .iter()
        .filter(|i| matches!(i.interrupted_syscall, Some(202 | 219)))
        .count();
    assert!(in_futex > runs.len() / 2, "{in_futex} of {}", runs.len());
    let report = t.finish();
    assert!(report["iterations"].as_u64().unwrap() >= 40, "{report}");
}

#[test]
fn multi_threaded_target_keeps_running() {
    let _g = serial();
    let mut t = Target::start("threads", &[]);
    let pid = t.pid();
    let mut inj = Injector::new(InjectConfig::default());
    let progress = |t: &mut Target| {
        t.send(b"progress\n");
        t.line(Duration::from_secs(5)).expect("progress")
    };
    let before = progress(&mut t);
    // A quiet thread is chosen (main in read, sleep or futex), never the
    // epoll one.
    for _ in 0..50 {
        let c = choose_thread(pid, false).unwrap();
        assert_eq!(c.rank, ThreadRank::Quiet);
        assert_ne!(c.tid, t.tid("epoll"));
    }
    let mut runs = hammer(&mut inj, &t, Duration::from_millis(500));
    // Every thread but the epoll one, forced: the spinning one (stopped by
    // an IPI), the sleeping and the futex-waiting ones.
    for name in ["spin", "sleep", "futex", "main"] {
        let tid = t.tid(name);
        for _ in 0..30 {
            let i = done(
                inj.run_on_thread(pid, tid, &[madvise(&t, Advice::Mergeable), Syscall::Getpid])
                    .unwrap(),
            );
            assert_eq!(i.tid, tid);
            assert_eq!(i.results, vec![0, pid as i64]);
            runs.push(i);
        }
    }
    std::thread::sleep(Duration::from_millis(50));
    let after = progress(&mut t);
    for k in ["spin", "sleep", "futex", "epoll"] {
        assert!(
            after[k].as_u64() > before[k].as_u64(),
            "thread {k} made no progress: {before} -> {after}"
        );
    }
    assert_eq!(after["errors"], serde_json::json!([]));
    assert_eq!(inj.stats().eintr_caused, 0);
    t.finish();
    eprintln!("threads: {} injections", runs.len());
}

#[test]
fn epoll_only_target_is_skipped_unless_allowed() {
    let _g = serial();
    let t = Target::start("epoll", &["--ms", "20"]);
    let pid = t.pid();
    let mut inj = Injector::new(InjectConfig::default());
    std::thread::sleep(Duration::from_millis(30));
    for _ in 0..20 {
        match inj.run(pid, &[Syscall::Getpid]).unwrap() {
            Outcome::Skipped(SkipReason::EintrRisk { tid, syscall }) => {
                assert_eq!(tid, pid);
                // epoll_wait or epoll_pwait, whichever the target uses.
                assert!(matches!(syscall, 232 | 281 | 441), "{syscall}");
            }
            other => panic!("expected EintrRisk, got {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(3));
    }
    // Allowed: it works, and the injector reports exactly the EINTRs the
    // target saw.
    let mut risky = Injector::new(InjectConfig {
        allow_eintr_risk: true,
        ..InjectConfig::default()
    });
    let mut flagged = 0;
    for _ in 0..20 {
        let i = done(risky.run(pid, &[Syscall::Getpid]).unwrap());
        flagged += i.app_sees_eintr as u64;
        std::thread::sleep(Duration::from_millis(3));
    }
    drop(stdin_close_and_report(t, flagged));
}

/// A process whose only user thread sleeps in `epoll_wait` also has the
/// kernel's io_uring polling thread: that thread is never chosen (ptrace
/// refuses I/O workers, and they never return to user space), so without
/// leave for EINTR the target is skipped as for epoll alone, and with it
/// the main thread is used.
#[test]
fn an_io_uring_worker_is_never_chosen() {
    let _g = serial();
    let t = Target::start("epoll-uring", &["--ms", "20"]);
    let pid = t.pid();
    let workers: Vec<u32> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|&tid: &u32| {
            std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/comm"))
                .is_ok_and(|c| c.starts_with("iou-"))
        })
        .collect();
    assert!(!workers.is_empty(), "the SQPOLL thread exists");
    std::thread::sleep(Duration::from_millis(30));
    let mut inj = Injector::new(InjectConfig::default());
    for _ in 0..10 {
        match inj.run(pid, &[Syscall::Getpid]).unwrap() {
            Outcome::Skipped(SkipReason::EintrRisk { tid, .. }) => assert_eq!(tid, pid),
            other => panic!("expected EintrRisk on the main thread, got {other:?}"),
        }
        let c = choose_thread(pid, true).unwrap();
        assert!(!workers.contains(&c.tid), "chose I/O worker {}", c.tid);
        std::thread::sleep(Duration::from_millis(3));
    }
    let mut risky = Injector::new(InjectConfig {
        allow_eintr_risk: true,
        ..InjectConfig::default()
    });
    let mut flagged = 0;
    for _ in 0..10 {
        let i = done(risky.run(pid, &[Syscall::Getpid]).unwrap());
        flagged += i.app_sees_eintr as u64;
        std::thread::sleep(Duration::from_millis(3));
    }
    drop(stdin_close_and_report(t, flagged));
}

/// For the epoll test: the target counts its EINTRs as errors, so this
/// checks the count instead of an empty error list (`Target::finish`).
fn stdin_close_and_report(mut t: Target, flagged: u64) -> Value {
    drop(t.stdin.take());
    let report = loop {
        let v = t.line(Duration::from_secs(10)).expect("final report");
        if v["final"] == true {
            break v;
        }
    };
    assert!(t.child.wait().unwrap().success());
    assert_eq!(report["checksum"], t.ready["checksum"]);
    let eintr = report["eintr"].as_u64().unwrap_or(0);
    assert!(flagged > 0, "some stops caught epoll_wait");
    assert_eq!(eintr, flagged, "EINTRs seen by the target: {report}");
    let errors = report["errors"].as_array().unwrap();
    assert!(errors.iter().all(|e| e == "epoll_wait: EINTR"), "{report}");
    report
}

#[test]
fn exit_mid_injection_is_gone_not_an_error() {
    let _g = serial();
    let mut inj = Injector::new(InjectConfig::default());
    let mut attached_gone = 0;
    for round in 0..6u64 {
        let ms = (150 + 23 * round).to_string();
        let t = Target::start("exit-after", &["--ms", &ms, "--mib", "64"]);
        let pid = t.pid();
        // Unmerging a resident 64 MiB walks every page (about 3 ms), so
        // the batch is long and the exit lands inside an attach.
        let batch = [
            madvise(&t, Advice::Mergeable),
            madvise(&t, Advice::Unmergeable),
            madvise(&t, Advice::Mergeable),
            madvise(&t, Advice::Unmergeable),
        ];
        let start = Instant::now();
        let gone = loop {
            assert!(
                start.elapsed() < Duration::from_secs(10),
                "target never went"
            );
            match inj.run(pid, &batch) {
                Ok(Outcome::Done(i)) => assert_eq!(i.results, vec![0; 4]),
                Ok(Outcome::Gone(g)) => break (g.attached, g.completed),
                // Exited between two attaches and not yet reaped by us, its
                // parent: a zombie is skipped, which is just as harmless.
                Ok(Outcome::Skipped(SkipReason::Zombie)) => break (false, Vec::new()),
                other => panic!("round {round}: unexpected {other:?}"),
            }
        };
        attached_gone += gone.0 as u32;
        assert!(gone.1.iter().all(|&r| r == 0));
        // It exited by itself: its timer thread said goodbye, no errors.
        let bye = t
            .line(Duration::from_secs(5))
            .expect("the target's goodbye");
        assert_eq!(bye["bye"], true);
        assert_eq!(bye["errors"], serde_json::json!([]));
        drop(t);
        // Gone stays gone (reaped by the drop above).
        assert!(matches!(
            inj.run(pid, &[Syscall::Getpid]).unwrap(),
            Outcome::Gone(_) | Outcome::Skipped(SkipReason::Zombie)
        ));
    }
    assert!(attached_gone >= 1, "no exit landed inside an attach");
    eprintln!(
        "exit: {attached_gone} of 6 exits landed inside an attach; {:?}",
        inj.stats()
    );
    // The injector is unharmed.
    let t = Target::start("sleep", &[]);
    assert_eq!(
        done(inj.run(t.pid(), &[Syscall::Getpid]).unwrap()).results,
        vec![t.pid() as i64]
    );
    t.finish();
}

#[test]
fn seccomp_target_is_skipped_not_killed() {
    let _g = serial();
    let t = Target::start("seccomp", &[]);
    let mut inj = Injector::new(InjectConfig::default());
    assert_eq!(
        inj.run(t.pid(), &[madvise(&t, Advice::Mergeable)]).unwrap(),
        Outcome::Skipped(SkipReason::Seccomp { mode: 2 })
    );
    assert!(!mergeable(t.pid(), t.addr()));
    // Alive, unharmed, and exits by itself (a SIGSYS kill would fail this).
    t.finish();
}

#[test]
fn traced_target_is_skipped() {
    let _g = serial();
    let t = Target::start("sleep", &[]);
    let pid = t.pid();
    // Another tracer (a thread of this test) seizes it without stopping it;
    // when that thread exits the kernel detaches it.
    let (seized_tx, seized_rx) = channel();
    let (release_tx, release_rx) = channel::<()>();
    let tracer = std::thread::spawn(move || {
        pagesift_linux::ptrace::seize(pid).unwrap();
        seized_tx
            .send(rustix::thread::gettid().as_raw_nonzero().get() as u32)
            .unwrap();
        let _ = release_rx.recv();
    });
    let tracer_tid = seized_rx.recv().unwrap();
    let mut inj = Injector::new(InjectConfig::default());
    assert_eq!(
        inj.run(pid, &[madvise(&t, Advice::Mergeable)]).unwrap(),
        Outcome::Skipped(SkipReason::Traced { tracer: tracer_tid })
    );
    assert!(!mergeable(pid, t.addr()));
    release_tx.send(()).unwrap();
    tracer.join().unwrap();
    wait_for("the other tracer to go", Duration::from_secs(2), || {
        tracer_pid(pid) == 0
    });
    assert_eq!(
        done(inj.run(pid, &[madvise(&t, Advice::Mergeable)]).unwrap()).results,
        vec![0]
    );
    t.finish();
}

#[test]
fn group_stopped_target_stays_stopped() {
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "5"]);
    let pid = t.pid();
    let stop = |sig| {
        rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig)
            .unwrap()
    };
    stop(rustix::process::Signal::STOP);
    wait_for("the group stop", Duration::from_secs(2), || {
        proc_state(pid) == 'T'
    });
    let mut inj = Injector::new(InjectConfig::default());
    for _ in 0..10 {
        let i = done(
            inj.run(pid, &[madvise(&t, Advice::Mergeable), Syscall::Getpid])
                .unwrap(),
        );
        assert_eq!(i.results, vec![0, pid as i64]);
        assert_eq!(i.signals_redelivered, 0);
    }
    assert!(mergeable(pid, t.addr()));
    // Still stopped after the detaches.
    for _ in 0..10 {
        std::thread::sleep(Duration::from_millis(10));
        assert_eq!(proc_state(pid), 'T');
    }
    stop(rustix::process::Signal::CONT);
    wait_for("the target to run", Duration::from_secs(2), || {
        proc_state(pid) != 'T'
    });
    t.finish();
}

#[test]
fn a_thread_that_does_not_stop_is_released() {
    let _g = serial();
    let dir = pagesift_testkit::temp_dir("inject");
    let fifo = dir.path().join("fifo");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
    let t = Target::start("spawn-blocked", &["--fifo", fifo.to_str().unwrap()]);
    let pid = t.pid();
    // posix_spawn (a vfork) waits uninterruptibly for the child, whose
    // open() of the FIFO blocks until we open it for writing.
    wait_for("the vfork wait", Duration::from_secs(5), || {
        proc_state(pid) == 'D'
    });
    let mut inj = Injector::new(InjectConfig {
        stop_timeout: Duration::from_millis(200),
        ..InjectConfig::default()
    });
    // Its only thread is in D: not chosen.
    assert_eq!(
        inj.run(pid, &[Syscall::Getpid]).unwrap(),
        Outcome::Skipped(SkipReason::NoStoppableThread)
    );
    // Forced: it does not stop in time; the tracer gives it up.
    let t0 = Instant::now();
    assert_eq!(
        inj.run_on_thread(pid, pid, &[madvise(&t, Advice::Mergeable)])
            .unwrap(),
        Outcome::Skipped(SkipReason::StopTimeout { tid: pid })
    );
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert_eq!(tracer_pid(pid), 0, "released at once");
    // Let it go: it leaves D and must not stop for a tracer that left.
    let w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    drop(w);
    wait_for("the target to leave D", Duration::from_secs(5), || {
        proc_state(pid) == 'S'
    });
    std::thread::sleep(Duration::from_millis(50));
    assert_ne!(proc_state(pid), 't', "no stale trap stop");
    assert!(!mergeable(pid, t.addr()), "the abandoned call never ran");
    // A fresh tracer works.
    assert_eq!(
        done(inj.run(pid, &[madvise(&t, Advice::Mergeable)]).unwrap()).results,
        vec![0]
    );
    t.finish();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn signals_during_injection_are_delivered_once_with_their_siginfo() {
    let _g = serial();
    let t = Target::start("signals", &["--ms", "5"]);
    let pid = t.pid();
    let sig = libc::SIGRTMIN() + 1;
    const N: u64 = 300;
    let sender = std::thread::spawn(move || {
        for _ in 0..N {
            pagesift_linux::ptrace::tgkill(pid, pid, sig).unwrap();
            std::thread::sleep(Duration::from_micros(700));
        }
    });
    let mut inj = Injector::new(InjectConfig::default());
    let mut k = 0;
    while !sender.is_finished() {
        let i = done(
            inj.run(pid, &[madvise(&t, Advice::Mergeable), Syscall::Getpid])
                .unwrap(),
        );
        assert_eq!(i.results, vec![0, pid as i64]);
        k += 1;
    }
    sender.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let report = t.finish();
    assert_eq!(report["signals"].as_u64(), Some(N), "{report}");
    assert_eq!(report["bad_siginfo"].as_u64(), Some(0), "{report}");
    let redelivered = inj.stats().signals_redelivered;
    eprintln!("signals: {k} injections, {redelivered} of {N} signals delivered at a stop");
}

#[test]
fn gone_and_missing_processes() {
    let _g = serial();
    let mut inj = Injector::new(InjectConfig::default());
    let t = Target::start("sleep", &[]);
    let pid = t.pid();
    drop(t); // killed and reaped
    assert!(matches!(
        inj.run(pid, &[Syscall::Getpid]).unwrap(),
        Outcome::Gone(pagesift_linux::inject::Gone {
            attached: false,
            ..
        })
    ));
    assert!(matches!(
        inj.run(999_999_999, &[Syscall::Getpid]).unwrap(),
        Outcome::Gone(_)
    ));
    // A kernel thread (kthreadd is pid 2) is skipped.
    assert_eq!(
        inj.run(2, &[Syscall::Getpid]).unwrap(),
        Outcome::Skipped(SkipReason::KernelThread)
    );
    // A thread id is not a process.
    let t = Target::start("threads", &[]);
    let err = inj.run(t.tid("sleep"), &[Syscall::Getpid]).unwrap_err();
    assert!(err.to_string().contains("is a thread of process"), "{err}");
    t.finish();
}

/// A cgroup v2 made for a test; thawed, emptied and removed on drop.
struct TestCgroup {
    root: String,
    dir: PathBuf,
}

impl TestCgroup {
    fn new(name: &str) -> TestCgroup {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let root = info
            .lines()
            .find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                (right.split_whitespace().next()? == "cgroup2")
                    .then(|| left.split_whitespace().nth(4).map(str::to_string))?
            })
            .expect("a cgroup v2 mount (for the freezer)");
        let dir = PathBuf::from(&root).join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir(&dir).expect("mkdir cgroup");
        TestCgroup { root, dir }
    }

    fn add(&self, pid: u32) {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).unwrap();
    }

    fn freeze(&self, on: bool) {
        std::fs::write(self.dir.join("cgroup.freeze"), if on { "1" } else { "0" }).unwrap();
        let want = if on { "frozen 1" } else { "frozen 0" };
        wait_for("the freezer", Duration::from_secs(5), || {
            std::fs::read_to_string(self.dir.join("cgroup.events"))
                .unwrap()
                .lines()
                .any(|l| l == want)
        });
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        let _ = std::fs::write(self.dir.join("cgroup.freeze"), "0");
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for p in procs.lines() {
                let _ = std::fs::write(PathBuf::from(&self.root).join("cgroup.procs"), p);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Waits for `pid`'s main thread to sleep in nanosleep, then stops and
/// continues the process (SIGSTOP, SIGCONT): the kernel resumes the sleep
/// through `restart_syscall`, where this returns it.
fn into_restart_syscall(pid: u32) {
    let signal = |sig| {
        rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig)
            .unwrap()
    };
    let syscall_nr = || -> Option<i64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/syscall")).ok()?;
        s.split_whitespace().next()?.parse().ok()
    };
    wait_for("the sleep", Duration::from_secs(5), || {
        matches!(syscall_nr(), Some(35 | 230))
    });
    signal(rustix::process::Signal::STOP);
    wait_for("the group stop", Duration::from_secs(2), || {
        proc_state(pid) == 'T'
    });
    signal(rustix::process::Signal::CONT);
    wait_for("restart_syscall", Duration::from_secs(2), || {
        syscall_nr() == Some(219)
    });
}

/// A thread asleep in `restart_syscall` (its nanosleep was stopped by
/// SIGSTOP and continued), stopped by a tracer that never saw the sleep
/// start: nothing but the kernel's own restart state can resume it, which
/// the rescue frame's `rt_sigreturn` would discard if the call were
/// abandoned or the tracer died (the sleep would return EINTR, as the
/// frozen-target test once saw). It is released untouched (this test
/// fails without that: the injection went ahead), and the target sees no
/// error. (A tracer that saw the sleep start restarts it itself:
/// `nanosleep_target_sees_no_error`.)
#[test]
fn a_thread_continuing_a_sleep_it_was_not_seen_starting_is_released_untouched() {
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "1500"]);
    let pid = t.pid();
    let mut skipped = 0;
    for _ in 0..3 {
        into_restart_syscall(pid);
        // A fresh injector: it never saw this sleep start.
        let mut inj = Injector::new(InjectConfig::default());
        match inj.run(pid, &[Syscall::Getpid]).unwrap() {
            Outcome::Skipped(SkipReason::UnknownRestart { tid }) => {
                assert_eq!(tid, pid);
                skipped += 1;
            }
            // The sleep ended between the look and the stop.
            Outcome::Done(i) => assert_ne!(i.interrupted_syscall, Some(219), "{i:?}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(tracer_pid(pid), 0);
    }
    assert!(skipped >= 2, "skipped {skipped} of 3");
    // The sleeps were resumed by the kernel, none cut short: the target
    // checks each one's result (`finish` fails on any error it saw).
    t.finish();
}

/// The same with a second thread blocked in `read(2)` on a pipe: the
/// thread continuing an unknown sleep is passed over for it, and the
/// injection runs there. Neither thread sees an error.
#[test]
fn a_thread_blocked_elsewhere_is_chosen_over_one_continuing_an_unknown_sleep() {
    let _g = serial();
    let t = Target::start("sleep-reader", &["--ms", "1500"]);
    let pid = t.pid();
    into_restart_syscall(pid);
    let mut inj = Injector::new(InjectConfig::default());
    let i = done(inj.run(pid, &[Syscall::Getpid]).unwrap());
    assert_eq!(i.results, vec![pid as i64]);
    assert_ne!(
        i.tid, pid,
        "the main thread, in restart_syscall, was chosen"
    );
    assert_eq!(i.interrupted_syscall, Some(0), "{i:?}");
    t.finish();
}

#[test]
fn frozen_target_is_skipped_and_a_call_that_cannot_start_is_abandoned() {
    let _g = serial();
    let cg_a = TestCgroup::new("pagesift-inject-a");
    let cg_b = TestCgroup::new("pagesift-inject-b");
    let t = Target::start("sleep", &["--ms", "5"]);
    let pid = t.pid();
    cg_a.add(pid);
    let mut inj = Injector::new(InjectConfig {
        syscall_timeout: Duration::from_millis(300),
        ..InjectConfig::default()
    });
    // Seen once in cgroup a (not frozen): works, and a's path is cached.
    assert_eq!(
        done(inj.run(pid, &[Syscall::Getpid]).unwrap()).results,
        vec![pid as i64]
    );
    cg_a.freeze(true);
    assert_eq!(
        inj.run(pid, &[madvise(&t, Advice::Mergeable)]).unwrap(),
        Outcome::Skipped(SkipReason::Frozen)
    );
    cg_a.freeze(false);
    // Moved into frozen cgroup b behind the cache's back: the thread stops
    // (a ptrace trap beats the freezer) but never runs the call; after the
    // call timeout the batch is abandoned and the thread released intact.
    cg_b.freeze(true);
    cg_b.add(pid);
    wait_for("the target to freeze", Duration::from_secs(5), || {
        std::fs::read_to_string(cg_b.dir.join("cgroup.events"))
            .unwrap()
            .lines()
            .any(|l| l == "frozen 1")
    });
    let t0 = Instant::now();
    assert_eq!(
        inj.run(pid, &[madvise(&t, Advice::Mergeable)]).unwrap(),
        Outcome::Skipped(SkipReason::SyscallTimeout { completed: vec![] })
    );
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(tracer_pid(pid), 0);
    assert!(!mergeable(pid, t.addr()), "the abandoned call never ran");
    // The cache was dropped: now b is seen frozen.
    assert_eq!(
        inj.run(pid, &[Syscall::Getpid]).unwrap(),
        Outcome::Skipped(SkipReason::Frozen)
    );
    cg_b.freeze(false);
    assert_eq!(
        done(inj.run(pid, &[madvise(&t, Advice::Mergeable)]).unwrap()).results,
        vec![0]
    );
    t.finish();
}

// ---------------------------------------------------------------------------
// The tracer dies mid-injection

fn inject_once_bin() -> PathBuf {
    static BIN: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BIN.get_or_init(|| {
        pagesift_testkit::cargo_artifact(
            &["-p", "pagesift-linux", "--example", "inject_once"],
            "examples/inject_once",
        )
    })
    .clone()
}

/// Every thread of `pid` untraced and not in a stop (`t`/`T`).
fn all_threads_free(pid: u32) -> Result<(), String> {
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).map_err(|e| e.to_string())? {
        let tid = e.map_err(|e| e.to_string())?.file_name();
        let tid = tid.to_string_lossy();
        let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
            .map_err(|e| e.to_string())?;
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .map(|v| v.trim().to_string())
                .unwrap_or_default()
        };
        if field("TracerPid:") != "0" {
            return Err(format!("thread {tid} still traced"));
        }
        let state = field("State:");
        if state.starts_with('t') || state.starts_with('T') {
            return Err(format!("thread {tid} left stopped ({state})"));
        }
    }
    Ok(())
}

/// Runs `inject_once` against `t` with `PAGESIFT_INJECT_FAULT = fault`;
/// returns its report, or `None` if it was killed (the fault fired).
fn inject_once(t: &Target, rounds: u32, fault: Option<&str>) -> Option<Value> {
    let mut cmd = std::process::Command::new(inject_once_bin());
    cmd.args([
        t.pid().to_string(),
        format!("{:#x}", t.addr()),
        format!("{:#x}", t.len()),
        rounds.to_string(),
    ]);
    if let Some(f) = fault {
        cmd.env("PAGESIFT_INJECT_FAULT", f);
    }
    let out = cmd.output().expect("running inject_once");
    if !out.status.success() {
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGKILL), "{out:?}");
        return None;
    }
    Some(serde_json::from_slice(&out.stdout).expect("its report"))
}

/// Kills the injector at every step of one injection, in turn, into a
/// sleeping, a spinning (registers checked), a multi-threaded and a
/// signal-receiving target: each must keep running untraced and unstopped,
/// with its memory and registers intact, its sleeps and signals correct.
#[test]
fn tracer_death_at_any_step_leaves_the_target_whole() {
    let _g = serial();
    let mut kills = 0;
    for mode in ["sleep", "registers", "threads", "signals"] {
        let t = Target::start(mode, &["--ms", "3"]);
        let pid = t.pid();
        let stop_signals = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sender = (mode == "signals").then(|| {
            let stop = stop_signals.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    pagesift_linux::ptrace::tgkill(pid, pid, libc::SIGRTMIN() + 1).unwrap();
                    n += 1;
                    std::thread::sleep(Duration::from_micros(300));
                }
                n
            })
        });
        let mut step = 1;
        loop {
            let report = inject_once(&t, 1, Some(&step.to_string()));
            std::thread::sleep(Duration::from_millis(5));
            if let Err(e) = all_threads_free(pid) {
                panic!("{mode}: after a death at step {step}: {e}");
            }
            match report {
                None => kills += 1,
                // The fault lies past the last step: the round completed.
                Some(r) => {
                    assert_eq!(r["done"], 1, "{mode}: {r}");
                    break;
                }
            }
            step += 1;
            assert!(step < 100, "{mode}: more steps than expected");
        }
        assert!(step > 15, "{mode}: only {step} steps seen");
        // A panic of the tracer thread at a few steps: the injector goes on.
        for step in [3, 6, 9, 14] {
            let r = inject_once(&t, 2, Some(&format!("{step}:panic"))).expect("not killed");
            assert_eq!(r["tracer_died"].as_u64(), Some(1), "{mode}: {r}");
            assert_eq!(r["done"].as_u64(), Some(1), "{mode}: {r}");
            all_threads_free(pid).unwrap();
        }
        stop_signals.store(true, std::sync::atomic::Ordering::Relaxed);
        let sent = sender.map(|h| h.join().unwrap());
        std::thread::sleep(Duration::from_millis(30));
        assert!(!mergeable(pid, t.addr()), "{mode}: the last round unmarked");
        let report = t.finish();
        if let Some(sent) = sent {
            assert_eq!(report["signals"].as_u64(), Some(sent), "{report}");
            assert_eq!(report["bad_siginfo"].as_u64(), Some(0), "{report}");
        }
        eprintln!("{mode}: killed at each of {} steps, intact", step - 1);
    }
    assert!(kills >= 60, "{kills} kills");
}

/// `sigqueue` bursts with values while injections run, with
/// RLIMIT_SIGPENDING at 8 on the target: every value the sender queued
/// successfully arrives exactly once, with `SI_QUEUE` and the sender's pid.
#[test]
#[allow(unsafe_code)] // sigqueue(3): no safe wrapper takes real-time signals.
fn queued_signals_keep_their_values_under_rlimit_sigpending() {
    let _g = serial();
    let me = std::process::id().to_string();
    let t = Target::start("sigqueue", &["--ms", "2", "--sender", &me]);
    let pid = t.pid();
    let limit = rustix::process::Rlimit {
        current: Some(8),
        maximum: Some(8),
    };
    rustix::process::prlimit(
        rustix::process::Pid::from_raw(pid as i32),
        rustix::process::Resource::Sigpending,
        limit,
    )
    .unwrap();
    let sig = libc::SIGRTMIN() + 2;
    let sender = std::thread::spawn(move || {
        let mut queued = Vec::new();
        let mut eagain = 0u64;
        for value in 0..3000usize {
            // Bursts of 20, then a pause.
            if value % 20 == 0 {
                std::thread::sleep(Duration::from_millis(1));
            }
            let v = libc::sigval {
                sival_ptr: value as *mut libc::c_void,
            };
            // SAFETY: sigqueue takes a pid, a signal number and a sigval by
            // value; it reads no memory of ours.
            let rc = unsafe { libc::sigqueue(pid as i32, sig, v) };
            if rc == 0 {
                queued.push(value);
            } else {
                let e = std::io::Error::last_os_error();
                assert_eq!(e.raw_os_error(), Some(libc::EAGAIN), "{e}");
                eagain += 1;
            }
        }
        (queued, eagain)
    });
    let mut inj = Injector::new(InjectConfig::default());
    let mut k = 0;
    while !sender.is_finished() {
        let i = done(
            inj.run(pid, &[madvise(&t, Advice::Mergeable), Syscall::Getpid])
                .unwrap(),
        );
        assert_eq!(i.results, vec![0, pid as i64]);
        k += 1;
    }
    let (queued, eagain) = sender.join().unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let report = t.finish();
    let got: Vec<usize> = serde_json::from_value(report["values"].clone()).unwrap();
    assert_eq!(report["bad_siginfo"].as_u64(), Some(0), "{report}");
    assert_eq!(report["duplicates"].as_u64(), Some(0), "{report}");
    assert_eq!(got, queued, "every queued value exactly once");
    eprintln!(
        "sigqueue: {k} injections, {} values queued and received, {eagain} refused by RLIMIT_SIGPENDING",
        queued.len()
    );
    assert!(k > 20, "only {k} injections");
}

/// The spinning `registers` target under many normal injections: every
/// register and the FPU state come back exactly.
#[test]
fn registers_come_back_exactly() {
    let _g = serial();
    let t = Target::start("registers", &[]);
    let r = inject_once(&t, 300, None).unwrap();
    assert_eq!(r["done"].as_u64(), Some(300), "{r}");
    t.finish();
}

/// A thread stopped inside a restartable-sequence critical section is
/// released untouched (running a call from elsewhere would make the kernel
/// forget the section, which would then commit after a preemption it never
/// saw); stopped outside one, it gets its call. The target's sections all
/// either abort or commit on the CPU they started on.
#[test]
fn a_thread_inside_an_rseq_critical_section_is_left_untouched() {
    let _g = serial();
    let t = Target::start("rseq", &[]);
    let pid = t.pid();
    let mut inj = Injector::new(InjectConfig::default());
    let (mut inside, mut ran) = (0, 0);
    for _ in 0..100 {
        match inj.run(pid, &[Syscall::Getpid]).unwrap() {
            Outcome::Skipped(SkipReason::RseqCriticalSection) => inside += 1,
            Outcome::Done(i) => {
                assert_eq!(i.results, vec![pid as i64]);
                ran += 1;
            }
            other => panic!("expected a call or an rseq skip, got {other:?}"),
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let report = t.finish();
    eprintln!(
        "rseq: {inside} stops inside a section, {ran} calls run, {} aborts",
        report["aborts"]
    );
    // The loop spends nearly all its time inside the section.
    assert!(inside >= 50, "only {inside} of 100 stops were inside");
    // Each stop inside was a preemption the kernel saw: the section
    // aborted. (Injecting there instead made the kernel forget the
    // sections: measured, 100 calls run and 3 aborts in all.)
    let aborts = report["aborts"].as_u64().unwrap_or(0);
    assert!(
        aborts >= inside,
        "{aborts} aborts for {inside} stops inside"
    );
}

/// The identity is checked again once the thread is stopped: a process
/// that exec'd after the caller took its identity gets nothing injected
/// (the exec race), while the same process unchanged does.
#[test]
fn an_exec_after_the_identity_check_gets_nothing_injected() {
    let _g = serial();
    let t = Target::start("sleep", &["--ms", "5"]);
    let pid = t.pid();
    let (_, image) = discover::identity(pid).expect("identity");
    let mut inj = Injector::new(InjectConfig::default());
    // The same image: runs.
    let i = done(inj.run_as(pid, image, &[Syscall::Getpid]).unwrap());
    assert_eq!(i.results, vec![pid as i64]);
    // Another image (as after an exec): nothing runs.
    assert_eq!(
        inj.run_as(pid, image ^ 1, &[madvise(&t, Advice::Mergeable)])
            .unwrap(),
        Outcome::Skipped(SkipReason::ImageChanged)
    );
    assert!(!mergeable(pid, t.addr()), "nothing ran");
    assert_eq!(tracer_pid(pid), 0);
    t.finish();

    // A real exec: identity taken from the shell, then it execs sleep.
    // The shell's "ready" says its own exec is complete (a state check
    // alone can catch the child between the vfork release and the end of
    // its exec, on a loaded machine), and
    // sleep is known to be running its image once it sits in its sleep
    // syscall.
    let mut sh = std::process::Command::new("/bin/sh")
        .args(["-c", "echo ready; read x; exec /bin/sleep 30"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = sh.id();
    let mut line = String::new();
    use std::io::BufRead;
    std::io::BufReader::new(sh.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    let (_, before) = discover::identity(pid).expect("identity");
    use std::io::Write;
    writeln!(sh.stdin.as_mut().unwrap()).unwrap();
    wait_for("sleep to sleep", Duration::from_secs(5), || {
        in_sleep_syscall(pid)
    });
    assert_eq!(
        inj.run_as(pid, before, &[Syscall::Getpid]).unwrap(),
        Outcome::Skipped(SkipReason::ImageChanged)
    );
    let (_, after) = discover::identity(pid).unwrap();
    assert_eq!(
        done(inj.run_as(pid, after, &[Syscall::Getpid]).unwrap()).results,
        vec![pid as i64]
    );
    sh.kill().unwrap();
    sh.wait().unwrap();
}
