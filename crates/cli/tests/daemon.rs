//! `pagesift run`, `status` and `exec` as a user meets them: real
//! `pagesift-workload` processes (which never call madvise themselves), the
//! real ptrace injection and the real kernel KSM.
//!
//! The daemon tests need root. They run one at a time (a lock in this
//! binary; across test binaries the daemon's own KSM lock serializes them
//! with every other KSM user), and every one of them, pass or fail, leaves
//! `/sys/kernel/mm/ksm` as it found it: [`Daemon`]'s drop stops the daemon
//! (SIGTERM, then SIGKILL), then takes KSM's lock itself, which puts back
//! whatever a killed daemon still owed, and compares the knobs with the
//! snapshot taken before the daemon started.

#[path = "../../linux/tests/common/mod.rs"]
mod common;

use common::{Workload, require_root, workload_bin};
use pagesift_linux::ksm::{GuardOptions, Ksm, KsmGuard};
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn pagesift() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pagesift"))
}

fn run(args: &[&str]) -> Output {
    pagesift().args(args).output().expect("run pagesift")
}

/// One daemon test at a time in this binary.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("pagesift-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A free loopback port (bound and released; the daemon takes it next).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The knobs a daemon may change, as they are now.
fn knobs() -> Vec<(String, Option<String>)> {
    let ksm = Ksm::open().expect("KSM");
    ["run", "pages_to_scan", "sleep_millisecs", "advisor_mode"]
        .iter()
        .map(|k| (k.to_string(), ksm.read_name(k).unwrap()))
        .collect()
}

/// A running `pagesift run`; stopped, and KSM checked, on drop.
struct Daemon {
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    metrics: Option<u16>,
    before: Vec<(String, Option<String>)>,
}

impl Daemon {
    fn start(dir: &Path, args: &[&str], metrics: bool) -> Daemon {
        let before = knobs();
        let socket = dir.join("pagesift.sock");
        let log = dir.join("daemon.log");
        let port = metrics.then(free_port);
        let mut cmd = pagesift();
        cmd.arg("run")
            .arg("--socket")
            .arg(&socket)
            .args(["--ksm-wait", "600"])
            .args(args)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        if let Some(p) = port {
            cmd.args(["--metrics", &p.to_string()]);
        }
        let child = cmd.spawn().expect("spawning pagesift run");
        Daemon {
            child: Some(child),
            socket,
            log,
            metrics: port,
            before,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// `pagesift status --json`, or `None` while it has no answer.
    fn status(&self) -> Option<Value> {
        let out = run(&[
            "status",
            "--json",
            "--socket",
            self.socket.to_str().unwrap(),
        ]);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Polls the status until `pred` holds; panics with the log after
    /// `timeout`.
    fn wait_for(&mut self, timeout: Duration, what: &str, pred: impl Fn(&Value) -> bool) -> Value {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.status()
                && pred(&s)
            {
                return s;
            }
            if let Some(c) = self.child.as_mut()
                && let Ok(Some(st)) = c.try_wait()
            {
                panic!("the daemon exited ({st}) before {what}:\n{}", self.log());
            }
            if t0.elapsed() > timeout {
                panic!(
                    "no {what} within {timeout:?}; last status {:?}\n{}",
                    self.status(),
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    fn scrape(&self) -> String {
        let port = self.metrics.expect("started with --metrics");
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.as_ref().unwrap().id().to_string();
        assert!(
            Command::new("kill")
                .args(["-s", sig, &pid])
                .status()
                .unwrap()
                .success()
        );
    }

    /// SIGTERM and wait (at most a minute).
    fn stop(&mut self) -> ExitStatus {
        self.signal("TERM");
        let mut child = self.child.take().unwrap();
        let t0 = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            if t0.elapsed() > Duration::from_secs(60) {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the daemon ignored SIGTERM for a minute:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = Command::new("kill")
                .args(["-s", "TERM", &c.id().to_string()])
                .status();
            let t0 = Instant::now();
            while c.try_wait().ok().flatten().is_none() && t0.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        // Whatever happened, KSM goes back: taking the lock restores what a
        // killed daemon still owed; releasing restores the snapshot.
        match KsmGuard::acquire_with(GuardOptions {
            wait: Some(Duration::from_secs(600)),
            ..GuardOptions::default()
        }) {
            Ok(g) => {
                let report = g.release();
                assert!(report.is_complete(), "{report}");
            }
            Err(e) => panic!("cannot check KSM after the test: {e}"),
        }
        if !std::thread::panicking() {
            assert_eq!(knobs(), self.before, "KSM's settings were not restored");
        }
    }
}

/// The VmFlags of the VMA of `pid` that contains `addr`.
fn vm_flags(pid: u32, addr: u64) -> Vec<String> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut inside = false;
    for line in text.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            inside = a <= addr && addr < b;
        } else if inside && let Some(f) = line.strip_prefix("VmFlags:") {
            return f.split_whitespace().map(String::from).collect();
        }
    }
    panic!("no VMA of {pid} contains {addr:#x}");
}

/// Whether any VMA of `pid` overlapping `[start, start + len)` is mergeable.
fn any_mergeable(pid: u32, start: u64, len: u64) -> bool {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let mut overlaps = false;
    for line in text.lines() {
        if let Some((range, _)) = line.split_once(' ')
            && let Some((a, b)) = range.split_once('-')
            && let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16))
        {
            overlaps = a < start + len && start < b;
        } else if overlaps
            && let Some(f) = line.strip_prefix("VmFlags:")
            && f.split_whitespace().any(|x| x == "mg")
        {
            return true;
        }
    }
    false
}

/// Pages of `pid` mapped to KSM pages now: the `KSM:` line of
/// `/proc/PID/smaps_rollup`, counted by a page-table walk. (Its
/// `ksm_merging_pages` is not used: ksmd updates it lazily, so it stays
/// stale after MADV_UNMERGEABLE once ksmd is stopped.)
fn merging_pages(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("KSM:"))
        .expect("smaps_rollup has a KSM line on this kernel")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb / 4
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))
        .unwrap_or_else(|| panic!("{name} missing from\n{text}"))
        .rsplit(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn the_daemon_merges_the_identical_process_and_never_marks_the_random_one() {
    require_root();
    let _serial = serial();
    let dir = tmpdir("mixed");
    let mut dup = Workload::start(&["static-dup", "--mib", "256"]);
    let mut rnd = Workload::start(&["random", "--mib", "256"]);
    let (dup_sum, rnd_sum) = (dup.checksum(), rnd.checksum());
    let (dup_start, dup_pages) = dup.region();
    let (rnd_start, rnd_pages) = rnd.region();
    let (dp, rp) = (dup.pid().to_string(), rnd.pid().to_string());
    let mut d = Daemon::start(
        &dir,
        &["--pid", &dp, "--pid", &rp, "--governor", "full"],
        true,
    );

    // ≥ 99 % of the identical pages merged (KSM keeps one of every 256
    // mappings as the shared page: 99.6 % at most, ksm-baseline.md §9).
    let want = dup_pages * 99 / 100;
    let t0 = Instant::now();
    let st = d.wait_for(Duration::from_secs(90), "99 % merged", |s| {
        s["totals"]["merged_pages"].as_u64().unwrap_or(0) >= want
    });
    eprintln!(
        "99 % of 256 MiB merged {:.1} s after start",
        t0.elapsed().as_secs_f64()
    );

    // The kernel agrees.
    assert!(
        merging_pages(dup.pid()) >= want - 256,
        "ksm_merging_pages {}",
        merging_pages(dup.pid())
    );
    assert_eq!(merging_pages(rnd.pid()), 0);
    assert!(vm_flags(dup.pid(), dup_start).contains(&"mg".to_string()));
    assert!(
        !any_mergeable(rnd.pid(), rnd_start, rnd_pages * 4096),
        "the random region was marked mergeable"
    );
    // The status says so. The 256 MiB VMA is four 64 MiB sub-regions;
    // marking them split the VMA at sub-region boundaries, and they kept
    // their identity through it (a renumbered region would show up as
    // "foreign": mergeable, but not in pagesift's ledger).
    assert!(
        st["totals"]["promoted_regions"].as_u64().unwrap() >= 4,
        "{st}"
    );
    assert_eq!(st["totals"]["foreign_regions"].as_u64(), Some(0), "{st}");
    assert!(st["ksm"]["pages_sharing"].as_u64().unwrap() > 0);
    assert_eq!(st["totals"]["unmarks"].as_u64(), Some(0));
    assert!(st["totals"]["marks"].as_u64().unwrap() >= 1);
    let top = st["top_regions"].as_array().unwrap();
    assert!(!top.is_empty());
    assert!(
        top.iter()
            .all(|r| r["pid"].as_u64() == Some(dup.pid() as u64))
    );
    let states: Vec<&str> = st["levels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|l| l["regions"].as_array().unwrap())
        .filter(|r| r["pid"].as_u64() == Some(rnd.pid() as u64))
        .map(|r| r["state"].as_str().unwrap())
        .collect();
    assert!(
        !states.is_empty() && states.iter().all(|s| *s == "sampling"),
        "{states:?}"
    );
    // So do the metrics, over loopback.
    let m = d.scrape();
    assert!(metric(&m, "pagesift_merged_pages") >= want as f64, "{m}");
    assert!(metric(&m, "pagesift_ksm_pages_sharing") > 0.0);
    assert!(metric(&m, "pagesift_marks_total") >= 1.0);
    // And the table.
    let out = run(&["status", "--socket", d.socket.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && table.contains("pages merged"),
        "{table}"
    );

    // The targets saw nothing.
    assert_eq!(dup.checksum(), dup_sum);
    assert_eq!(rnd.checksum(), rnd_sum);

    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    assert!(!d.socket.exists(), "the socket is removed on exit");
    assert!(d.log().contains("KSM settings restored"), "{}", d.log());
    // Merged pages stay merged without --unmerge-on-exit.
    assert!(merging_pages(dup.pid()) >= want - 256);
    assert_eq!(dup.checksum(), dup_sum);
    drop(d); // checks KSM's knobs
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sighup_reloads_and_unmerge_on_exit_gives_the_memory_back() {
    require_root();
    let _serial = serial();
    let dir = tmpdir("reload");
    let mut dup = Workload::start(&["static-dup", "--mib", "64"]);
    let sum = dup.checksum();
    let (start, pages) = dup.region();
    let config = dir.join("pagesift.toml");
    std::fs::write(&config, "governor = \"full\"\n").unwrap();
    let p = dup.pid().to_string();
    let mut d = Daemon::start(
        &dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--pid",
            &p,
            "--unmerge-on-exit",
        ],
        false,
    );
    d.wait_for(Duration::from_secs(90), "merging", |s| {
        s["totals"]["merged_pages"].as_u64().unwrap_or(0) >= pages * 99 / 100
    });
    assert!(vm_flags(dup.pid(), start).contains(&"mg".to_string()));

    // A bad file is refused and the old configuration kept.
    std::fs::write(&config, "governor = \"turbo\"\n").unwrap();
    d.signal("HUP");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(d.status().unwrap()["governor"], "full");
    // A good one is applied.
    std::fs::write(&config, "governor = \"low\"\n").unwrap();
    d.signal("HUP");
    d.wait_for(Duration::from_secs(10), "the reloaded governor", |s| {
        s["governor"] == "low"
    });
    assert!(
        d.log().contains("configuration not reloaded"),
        "{}",
        d.log()
    );

    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    // Unmarked and unmerged, memory intact.
    assert!(
        !any_mergeable(dup.pid(), start, pages * 4096),
        "still marked after exit"
    );
    assert_eq!(merging_pages(dup.pid()), 0);
    assert_eq!(dup.checksum(), sum);
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn targets_that_exit_or_come_and_go_do_not_upset_the_daemon() {
    require_root();
    let _serial = serial();
    let dir = tmpdir("exit");
    let mut a = Workload::start(&["static-dup", "--mib", "32", "--seed", "3"]);
    let mut b = Workload::start(&["static-dup", "--mib", "32", "--seed", "4"]);
    let flicker = Workload::start(&["short-lived", "--mib", "16", "--period-ms", "200"]);
    let b_sum = b.checksum();
    let (pa, pb, pf) = (
        a.pid().to_string(),
        b.pid().to_string(),
        flicker.pid().to_string(),
    );
    let mut d = Daemon::start(&dir, &["--pid", &pa, "--pid", &pb, "--pid", &pf], false);
    d.wait_for(Duration::from_secs(90), "both merged", |s| {
        s["totals"]["merged_pages"].as_u64().unwrap_or(0) >= 2 * 8192 * 99 / 100
    });
    a.kill();
    a.wait();
    d.wait_for(Duration::from_secs(90), "the exit noticed", |s| {
        s["totals"]["processes"].as_u64() == Some(2)
    });
    // Still serving, still merged, B untouched.
    let s = d.status().unwrap();
    assert!(s["totals"]["merged_pages"].as_u64().unwrap() >= 8192 * 99 / 100);
    assert_eq!(b.checksum(), b_sum);
    drop(flicker); // killed while the daemon runs
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        d.status().is_some(),
        "the daemon stopped answering:\n{}",
        d.log()
    );
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    assert!(!d.log().contains("panicked"), "{}", d.log());
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_process_that_uses_ksm_itself_keeps_its_settings() {
    require_root();
    let _serial = serial();
    let dir = tmpdir("selfmanaged");
    // Started through `pagesift exec`: merge-any, every VMA already `mg`.
    let mut own = pagesift()
        .arg("exec")
        .arg("--")
        .arg(workload_bin())
        .args([
            "static-dup",
            "--mib",
            "32",
            "--seed",
            "5",
            "--seconds",
            "120",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(own.stdout.as_mut().unwrap()),
        &mut line,
    )
    .unwrap();
    let report: Value = serde_json::from_str(&line).unwrap();
    let start = report["regions"][0]["start"].as_u64().unwrap();
    let pages = report["regions"][0]["pages"].as_u64().unwrap();
    let pid = own.id();
    let p = pid.to_string();
    let mut d = Daemon::start(&dir, &["--pid", &p, "--unmerge-on-exit"], false);
    let st = d.wait_for(Duration::from_secs(90), "its pages merged by ksmd", |s| {
        s["totals"]["merged_pages"].as_u64().unwrap_or(0) >= pages * 99 / 100
    });
    // Accounted as foreign, listed as managing KSM itself, never injected.
    assert!(st["totals"]["foreign_regions"].as_u64().unwrap() >= 1);
    assert_eq!(st["totals"]["batches"].as_u64(), Some(0), "{st}");
    assert!(
        st["skipped"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["pid"].as_u64() == Some(pid as u64)
                && s["reason"].as_str().unwrap().contains("ksm_merge_any")),
        "{st}"
    );
    let stopped = d.stop();
    assert!(stopped.success(), "exit {stopped}:\n{}", d.log());
    // --unmerge-on-exit only undoes pagesift's own marks: these stay.
    assert!(vm_flags(pid, start).contains(&"mg".to_string()));
    assert!(merging_pages(pid) >= pages * 99 / 100);
    let stat = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).unwrap();
    assert!(stat.contains("ksm_merge_any: yes"), "{stat}");
    let _ = own.kill();
    let _ = own.wait();
    drop(d);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_config_names_the_key_and_nothing_starts() {
    let dir = tmpdir("badcfg");
    let p = dir.join("bad.toml");
    std::fs::write(&p, "[ladder]\nv_dup = 1.5\n").unwrap();
    let out = run(&["run", "--config", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ladder.v_dup") && err.contains("between 0 and 1"),
        "{err}"
    );
    std::fs::write(&p, "[scan]\nsleep_millis = 10\n").unwrap();
    let out = run(&["run", "--config", p.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("sleep_millis") && err.contains("unknown field"),
        "{err}"
    );
    let out = run(&["run", "--config", "/nonexistent/pagesift.toml"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/pagesift.toml"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_systemd_unit_starts_a_command_line_pagesift_accepts() {
    let unit = include_str!("../../../dist/pagesift.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let mut words = exec.split_whitespace();
    assert_eq!(words.next(), Some("/usr/local/bin/pagesift"));
    let mut args: Vec<&str> = words.collect();
    assert_eq!(args.first(), Some(&"run"));
    args.push("--help");
    let out = run(&args);
    assert!(out.status.success(), "{out:?}");
    assert!(unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
}

#[test]
fn status_without_a_daemon_says_so() {
    let out = run(&["status", "--socket", "/nonexistent/pagesift.sock"]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no pagesift daemon is listening"), "{err}");
}

#[test]
fn exec_sets_memory_merge_for_the_command_and_its_children() {
    // The flag is inherited by the shell's child (cat).
    let out = run(&["exec", "--", "sh", "-c", "cat /proc/self/ksm_stat"]);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("ksm_merge_any: yes"), "{text}");
}

#[test]
fn exec_propagates_the_exit_status_and_names_a_missing_command() {
    let out = run(&["exec", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.status.code(), Some(7));
    let out = run(&["exec", "--", "/nonexistent/tool", "--flag"]);
    assert_eq!(out.status.code(), Some(127));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/nonexistent/tool: command not found"),
        "{err}"
    );
    let out = run(&["exec"]);
    assert_eq!(out.status.code(), Some(2), "a command is required");
}

#[test]
fn an_execd_workload_is_mergeable_and_its_memory_is_what_it_would_be() {
    // The same workload with and without exec: same memory (checksum in
    // its report), and only the exec'd one has merge-any.
    let start = |via_exec: bool| {
        let bin = workload_bin();
        let mut cmd = if via_exec {
            let mut c = pagesift();
            c.arg("exec").arg("--").arg(&bin);
            c
        } else {
            Command::new(&bin)
        };
        let mut child = cmd
            .args(["static-dup", "--mib", "8", "--seconds", "30"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.as_mut().unwrap()),
            &mut line,
        )
        .unwrap();
        let report: Value = serde_json::from_str(&line).unwrap();
        (child, report)
    };
    let (mut plain, plain_report) = start(false);
    let (mut execd, execd_report) = start(true);
    // exec replaced pagesift: the child's pid is the workload's.
    assert_eq!(execd_report["pid"].as_u64(), Some(execd.id() as u64));
    let stat = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).unwrap();
    assert!(
        stat(execd.id()).contains("ksm_merge_any: yes"),
        "{}",
        stat(execd.id())
    );
    assert!(stat(plain.id()).contains("ksm_merge_any: no"));
    assert_eq!(execd_report["checksum"], plain_report["checksum"]);
    // Closing stdin ends a workload normally.
    drop(execd.stdin.take());
    drop(plain.stdin.take());
    for c in [&mut execd, &mut plain] {
        let _ = c.kill();
        let _ = c.wait();
    }
}
