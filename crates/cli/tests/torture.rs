//! A short kill campaign (`scripts/torture`): the daemon SIGKILLed a dozen
//! times at random moments (some inside an injection, some with its tracer
//! thread panicking) while it marks, unmarks and write-tracks real
//! self-checking targets, then the bad-input table. Nothing may be harmed.
//! Root is needed; python3 runs the script (`scripts/setup` installs it).

mod support;

use pagesift_linux::uffd::count_userfaultfds;
use pagesift_testkit::{Daemon, Target, serial, temp_dir};

use std::process::Command;

#[test]
fn daemon_killed_at_random_moments_harms_no_target() {
    pagesift_testkit::require_root();
    let _serial = serial();
    let target = pagesift_testkit::cargo_artifact(
        &["-p", "pagesift-linux", "--example", "inject_target"],
        "examples/inject_target",
    );
    let workload = pagesift_testkit::workload_bin();
    // One directory with the binaries the script expects.
    let tmp = temp_dir("torture-bins");
    let dir = tmp.path();
    std::fs::create_dir_all(dir.join("examples")).unwrap();
    let link = |from: &std::path::Path, to: std::path::PathBuf| {
        let _ = std::fs::remove_file(&to);
        std::os::unix::fs::symlink(from, to).unwrap();
    };
    link(
        std::path::Path::new(env!("CARGO_BIN_EXE_pagesift")),
        dir.join("pagesift"),
    );
    link(&workload, dir.join("pagesift-workload"));
    link(&target, dir.join("examples/inject_target"));
    let report = dir.join("report.json");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/torture");
    let out = Command::new("python3")
        .arg(script)
        .args(["--kills", "12", "--max-life", "2", "--bin-dir"])
        .arg(dir)
        .arg("--json")
        .arg(&report)
        .output()
        .expect("python3 scripts/torture");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    let r: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&report).expect("the report")).unwrap();
    assert_eq!(r["figures"]["harmed"], 0, "{}", r["harm"]);
    assert_eq!(r["figures"]["kills"], 12);
    assert_eq!(
        r["figures"]["bad_inputs_handled"], r["figures"]["bad_inputs"],
        "{}",
        r["bad_inputs"]
    );
    assert!(r["figures"]["signals_checked"].as_u64().unwrap() > 0);
    // The daemons did inject before they died (counted from their own
    // logs): a campaign whose daemons all die before their first
    // injection proves nothing about death during one.
    let f = &r["figures"];
    let injected: u64 = ["marks", "wt_registers", "recovered_unmarks"]
        .iter()
        .map(|k| f[k].as_u64().unwrap())
        .sum();
    assert!(
        f["runs_that_injected"].as_u64().unwrap() > 0 && injected > 0,
        "{f}"
    );
    assert!(out.status.success(), "{stderr}");
}

/// A target that registered part of its memory with its own userfaultfd in
/// missing mode and never answers: the daemon never reads that range (a
/// read would wait forever), keeps waking, and its status says so.
#[test]
fn a_targets_own_missing_userfaultfd_never_wedges_the_daemon() {
    pagesift_testkit::require_root();
    let _serial = serial();
    let tmp = temp_dir("own-uffd");
    let dir = tmp.path();
    let t = Target::start("uffd-missing", &["--ms", "5"]);
    let pid = t.pid();
    let uffd_addr = t.ready["tids"]["uffd_addr"].as_u64().unwrap();
    let mut d = support::start_daemon(dir, &["--pid", &pid.to_string()], false);
    let st = d.wait_for(
        std::time::Duration::from_secs(30),
        "the range reported as skipped",
        |s| {
            s["skipped"].as_array().is_some_and(|v| {
                v.iter().any(|p| {
                    p["pid"].as_u64() == Some(pid as u64)
                        && p["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains(&format!("{uffd_addr:#x}")))
                })
            })
        },
    );
    let up = st["daemon"]["uptime_s"].as_f64().unwrap();
    // It keeps waking: the status keeps answering and its clock moves on,
    // and the target's other memory is sampled.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let later = d.status().expect("the daemon answers");
    assert!(
        later["daemon"]["uptime_s"].as_f64().unwrap() >= up + 2.0,
        "{later}"
    );
    assert!(d.stop().success());
    // Never marked; still the target's own registration.
    let flags = support::vm_flags(pid, uffd_addr);
    assert!(flags.iter().any(|f| f == "um"), "{flags:?}");
    assert!(!flags.iter().any(|f| f == "mg"), "{flags:?}");
    // The target never blocked (its sleeps were all on time) and its
    // checked memory is unchanged.
    t.finish();
}

/// SIGKILL the daemon while it holds write-tracking registrations, then
/// while it holds marks; each restart takes away what the dead one left
/// (its ledger under /run), and after a clean stop with --unmerge-on-exit
/// no target holds a userfaultfd of ours or a range we marked.
#[test]
fn a_restarted_daemon_takes_away_what_its_killed_predecessor_left() {
    pagesift_testkit::require_root();
    let _serial = serial();
    let tmp = temp_dir("recovery");
    let dir = tmp.path();
    let a = Target::start("sleep", &["--ms", "5"]);
    let b = Target::start("sleep", &["--ms", "5"]);
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let args = ["--pid", pa.as_str(), "--pid", pb.as_str()];
    let kill = |d: &mut Daemon| {
        d.signal("KILL");
        d.child.take().unwrap().wait().unwrap();
    };
    let uffds = || count_userfaultfds(a.pid()) + count_userfaultfds(b.pid());
    let marked = || {
        support::any_mergeable(a.pid(), a.addr(), a.len())
            || support::any_mergeable(b.pid(), b.addr(), b.len())
    };
    let secs = std::time::Duration::from_secs;

    let mut d = support::start_daemon(dir, &args, false);
    d.wait_for(secs(60), "write tracking", |s| {
        s["totals"]["write_tracked_ranges"].as_u64().unwrap_or(0) > 0
    });
    kill(&mut d);
    assert!(uffds() > 0, "the killed daemon left its registrations");
    assert!(std::path::Path::new("/run/pagesift/ledger").exists());
    drop(d);

    let mut d = support::start_daemon(dir, &args, false);
    d.wait_for(secs(60), "marks", |s| {
        s["totals"]["marks"].as_u64().unwrap_or(0) > 0
    });
    kill(&mut d);
    assert!(marked(), "the killed daemon left its marks");
    drop(d);

    let mut d = support::start_daemon(
        dir,
        &[args.as_slice(), &["--unmerge-on-exit"]].concat(),
        false,
    );
    d.wait_for(secs(30), "a status", |_| true);
    std::thread::sleep(secs(2));
    assert!(d.stop().success(), "{}", d.log());
    let log = d.log();
    assert!(
        log.contains("took away what the previous daemon left"),
        "{log}"
    );
    assert_eq!(uffds(), 0, "a userfaultfd of ours is left:\n{log}");
    assert!(!marked(), "a range we marked is left:\n{log}");
    assert!(!std::path::Path::new("/run/pagesift/ledger").exists());
    drop(d);
    a.finish();
    b.finish();
}

/// Runs a daemon on targets `a` and `b` with `config` until it SIGKILLs
/// itself at checkpoint `n` of its injections (`PAGESIFT_INJECT_FAULT`).
fn killed_at_checkpoint(
    n: u32,
    dir: &std::path::Path,
    config: &std::path::Path,
    a: &Target,
    b: &Target,
) {
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let log = dir.join(format!("killed-{n}.log"));
    let mut killed = Command::new(env!("CARGO_BIN_EXE_pagesift"))
        .args(["run", "--ksm-wait", "600", "--pid", &pa, "--pid", &pb])
        .arg("--config")
        .arg(config)
        .arg("--socket")
        .arg(dir.join("killed.sock"))
        .env("PAGESIFT_INJECT_FAULT", n.to_string())
        .env("RUST_LOG", "info")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let status = loop {
        if let Some(s) = killed.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = killed.kill();
            let _ = killed.wait();
            panic!(
                "checkpoint {n}: the daemon did not reach it in 90 s:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "checkpoint {n}: {status:?}");
}

/// Starts a daemon on `a` and `b` with `config` and `--unmerge-on-exit`,
/// waits for its first status and stops it: it has taken away what its
/// predecessor's ledger names, and what it did itself goes at its clean
/// stop. Returns its log.
fn restart_and_stop(
    dir: &std::path::Path,
    config: &std::path::Path,
    a: &Target,
    b: &Target,
) -> String {
    let (pa, pb) = (a.pid().to_string(), b.pid().to_string());
    let args = [
        "--pid",
        &pa,
        "--pid",
        &pb,
        "--config",
        config.to_str().unwrap(),
        "--unmerge-on-exit",
    ];
    let mut d = support::start_daemon(dir, &args, false);
    d.wait_for(std::time::Duration::from_secs(30), "a status", |_| true);
    assert!(d.stop().success(), "{}", d.log());
    d.log()
}

/// A daemon SIGKILLed inside its first marking batch, at each checkpoint of
/// it in turn (`PAGESIFT_INJECT_FAULT=N`): the kills after the injected
/// `madvise` fall between the mark and the end of the wake-up, when the
/// ledger is saved. The marks must be in the ledger all the same (written
/// ahead, `pagesift_daemon::ledger`), so that the next daemon takes them
/// away; before the write-ahead they stayed in the targets for good.
#[test]
fn a_daemon_killed_right_after_marking_leaves_its_marks_in_its_ledger() {
    pagesift_testkit::require_root();
    let _serial = serial();
    let tmp = temp_dir("write-ahead");
    let dir = tmp.path();
    // No write tracking: the first injection of the daemon's life is its
    // first marking batch, so the checkpoints counted are that batch's.
    let config = dir.join("pagesift.toml");
    std::fs::write(&config, "[actuate]\nwrite_tracking = false\n").unwrap();
    let mut left_marked = 0;
    for n in 1..=12 {
        // Two targets holding the same pages: duplicates to mark.
        let a = Target::start("sleep", &["--ms", "5"]);
        let b = Target::start("sleep", &["--ms", "5"]);
        let marked = || {
            support::any_mergeable(a.pid(), a.addr(), a.len())
                || support::any_mergeable(b.pid(), b.addr(), b.len())
        };
        killed_at_checkpoint(n, dir, &config, &a, &b);
        if marked() {
            left_marked += 1;
            assert!(
                std::path::Path::new("/run/pagesift/ledger").exists(),
                "checkpoint {n}: marks left and no ledger"
            );
        }
        let log = restart_and_stop(dir, &config, &a, &b);
        assert!(
            !marked(),
            "checkpoint {n}: a range the killed daemon marked is left:\n{log}"
        );
        a.finish();
        b.finish();
    }
    // Some kills fell after a mark: the window was exercised.
    assert!(
        left_marked > 0,
        "no checkpoint of the first batch came after its mark"
    );
}

/// A daemon SIGKILLed inside its first write-tracking batches, at each
/// checkpoint in turn: the kills after the injected `userfaultfd()` fall
/// between the descriptor's opening and the end of the wake-up, when the
/// ledger is saved with its number. The batch is written ahead (with the
/// userfaultfds the target had before it, `pagesift_daemon::ledger::OPENING`),
/// so the next daemon closes the descriptor; before, it stayed in the
/// target until the target exited.
#[test]
fn a_daemon_killed_right_after_opening_a_userfaultfd_leaves_it_in_its_ledger() {
    pagesift_testkit::require_root();
    let _serial = serial();
    let tmp = temp_dir("write-ahead-uffd");
    let dir = tmp.path();
    // Write tracking (the default): a region is watched before it is
    // marked, so the first injections are the watches' batches.
    let config = dir.join("pagesift.toml");
    std::fs::write(&config, "[actuate]\nwrite_tracking = true\n").unwrap();
    let mut left_open = 0;
    for n in 1..=16 {
        let a = Target::start("sleep", &["--ms", "5"]);
        let b = Target::start("sleep", &["--ms", "5"]);
        let uffds = || count_userfaultfds(a.pid()) + count_userfaultfds(b.pid());
        killed_at_checkpoint(n, dir, &config, &a, &b);
        if uffds() > 0 {
            left_open += 1;
            assert!(
                std::path::Path::new("/run/pagesift/ledger").exists(),
                "checkpoint {n}: a userfaultfd left and no ledger"
            );
        }
        let log = restart_and_stop(dir, &config, &a, &b);
        assert_eq!(
            uffds(),
            0,
            "checkpoint {n}: a userfaultfd of ours is left:\n{log}"
        );
        a.finish();
        b.finish();
    }
    assert!(
        left_open > 0,
        "no checkpoint came after a userfaultfd was opened"
    );
}
