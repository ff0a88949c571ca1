//! `pagesift run`, `status` and `exec` as a user meets them: real
//! `pagesift-workload` processes (which never call madvise themselves), the
//! real ptrace injection and the real kernel KSM.
//!
//! The daemon tests need root. They run one at a time
//! (`pagesift_testkit::serial`, within and across test binaries; the
//! daemon's own KSM lock serializes them with every other KSM user
//! besides), and every one of them, pass or fail, leaves
//! `/sys/kernel/mm/ksm` as it found it: `Daemon`'s drop stops the daemon
//! (SIGTERM, then SIGKILL), then takes KSM's lock itself, which puts back
//! whatever a killed daemon still owed, and compares the knobs with the
//! snapshot taken before the daemon started.

mod support;

use pagesift_testkit::{TestCgroups, Workload, require_root, serial, temp_dir, workload_bin};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

#[test]
fn the_daemon_merges_the_identical_process_and_never_marks_the_random_one() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("mixed");
    let dir = tmp.path();
    let mut dup = Workload::start(&["static-dup", "--mib", "256"]);
    let mut rnd = Workload::start(&["random", "--mib", "256"]);
    let (dup_sum, rnd_sum) = (dup.checksum(), rnd.checksum());
    let (dup_start, dup_pages) = dup.region();
    let (rnd_start, rnd_pages) = rnd.region();
    let (dp, rp) = (dup.pid().to_string(), rnd.pid().to_string());
    let mut d = start_daemon(
        dir,
        &["--pid", &dp, "--pid", &rp, "--governor", "full"],
        true,
    );

    // ≥ 99 % of the identical pages merged (KSM keeps one of every 256
    // mappings as the shared page at max_page_sharing 256: 99.6 % at most).
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
    // Sub-regions are cut from the whole VMA, which the kernel may have
    // joined with the workload's neighbouring anonymous memory: the first
    // one can hold the region's first pages beside hundreds of pages of
    // heap, be judged on that mix and be promoted later than the rest (CI
    // on e628974 found the region's first page unmarked at this point).
    // So the kernel's flags are checked over the whole region, not at its
    // first page.
    assert!(
        mergeable_pages(dup.pid(), dup_start, dup_pages * 4096) >= want,
        "less than 99 % of the identical region is mergeable:\n{}",
        vmas_in(dup.pid(), dup_start, dup_pages * 4096)
    );
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
    // How the two processes' regions were read: from maps at least once
    // each (discovery), whatever smaps reads came on top.
    let reads = &st["discovery"];
    assert!(reads["maps_reads"].as_u64().unwrap() >= 2, "{reads}");
    assert_eq!(
        reads["smaps_reads"].as_u64(),
        Some(
            reads["smaps_by_reason"]
                .as_object()
                .unwrap()
                .values()
                .map(|v| v.as_u64().unwrap())
                .sum()
        ),
        "{reads}"
    );
    // So do the metrics, over loopback.
    let m = d.scrape();
    assert!(
        metric(
            &m,
            "pagesift_region_reads_total{source=\"maps\",reason=\"none\"}"
        ) >= 2.0,
        "{m}"
    );
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
    assert!(table.contains("regions read: "), "{table}");

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
}

#[test]
fn sighup_reloads_and_unmerge_on_exit_gives_the_memory_back() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("reload");
    let dir = tmp.path();
    let mut dup = Workload::start(&["static-dup", "--mib", "64"]);
    let sum = dup.checksum();
    let (start, pages) = dup.region();
    let config = dir.join("pagesift.toml");
    std::fs::write(&config, "governor = \"full\"\n").unwrap();
    let p = dup.pid().to_string();
    let mut d = start_daemon(
        dir,
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
    // Checked over the region, not at its first page (see the first test).
    assert!(
        mergeable_pages(dup.pid(), start, pages * 4096) >= pages * 99 / 100,
        "{}",
        vmas_in(dup.pid(), start, pages * 4096)
    );

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
}

#[test]
fn targets_that_exit_or_come_and_go_do_not_upset_the_daemon() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("exit");
    let dir = tmp.path();
    let mut a = Workload::start(&["static-dup", "--mib", "32", "--seed", "3"]);
    let mut b = Workload::start(&["static-dup", "--mib", "32", "--seed", "4"]);
    let flicker = Workload::start(&["short-lived", "--mib", "16", "--period-ms", "200"]);
    let b_sum = b.checksum();
    let (pa, pb, pf) = (
        a.pid().to_string(),
        b.pid().to_string(),
        flicker.pid().to_string(),
    );
    let mut d = start_daemon(dir, &["--pid", &pa, "--pid", &pb, "--pid", &pf], false);
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
}

#[test]
fn a_process_that_uses_ksm_itself_keeps_its_settings() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("selfmanaged");
    let dir = tmp.path();
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
    let mut d = start_daemon(dir, &["--pid", &p, "--unmerge-on-exit"], false);
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
}

#[test]
fn a_bad_config_names_the_key_and_nothing_starts() {
    let tmp = temp_dir("badcfg");
    let dir = tmp.path();
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
}

#[test]
fn the_systemd_unit_starts_a_command_line_pagesift_accepts() {
    let unit = include_str!("../../../dist/pagesift.service");
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let mut words = exec.split_whitespace();
    // Where the Debian package puts the binary (crates/cli/Cargo.toml).
    assert_eq!(words.next(), Some("/usr/bin/pagesift"));
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

/// A workload whose command name is `name` (it runs through a symlink of
/// that name), as `uid` (and gid) when given, through `setpriv`.
fn named_workload(dir: &std::path::Path, name: &str, uid: Option<u32>, args: &[&str]) -> Workload {
    let link = dir.join(name);
    if !link.exists() {
        std::os::unix::fs::symlink(workload_bin(), &link).unwrap();
    }
    let cmd = match uid {
        Some(uid) => {
            let mut c = Command::new("setpriv");
            c.args([
                &format!("--reuid={uid}"),
                &format!("--regid={uid}"),
                "--clear-groups",
            ])
            .arg(&link)
            .args(args);
            c
        }
        None => {
            let mut c = Command::new(&link);
            c.args(args);
            c
        }
    };
    Workload::spawn(cmd, args)
}

/// `ksm_merging_pages` of /proc/PID/ksm_stat.
fn ksm_stat_merging(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("ksm_merging_pages"))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or_else(|| panic!("no ksm_merging_pages in {text}"))
}

fn uid_of(pid: u32) -> u32 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().nth(1))
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn a_name_alone_does_not_let_another_users_process_in() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("trust");
    let dir = tmp.path();
    // A name no other test uses, so the daemon sees these two only.
    let name = format!("pstrust{}", std::process::id() % 100_000);
    let args = ["static-dup", "--mib", "32", "--seed", "11"];
    let mut root = named_workload(dir, &name, None, &args);
    let mut nobody = named_workload(dir, &name, Some(65534), &args);
    assert_eq!(uid_of(nobody.pid()), 65534);
    assert_eq!(uid_of(root.pid()), 0);
    let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm(root.pid()).trim(), name);
    assert_eq!(comm(nobody.pid()).trim(), name);
    let (root_sum, nobody_sum) = (root.checksum(), nobody.checksum());
    assert_eq!(root_sum, nobody_sum, "the same content");
    let (root_start, pages) = root.region();
    let (nobody_start, _) = nobody.region();
    let config = dir.join("pagesift.toml");
    std::fs::write(
        &config,
        format!("governor = \"full\"\n[eligible]\ncomms = [\"{name}\"]\n"),
    )
    .unwrap();
    let mut d = start_daemon(dir, &["--config", config.to_str().unwrap()], false);
    let want = pages * 99 / 100;
    let st = d.wait_for(Duration::from_secs(90), "root's process merged", |s| {
        s["totals"]["merged_pages"].as_u64().unwrap_or(0) >= want
    });
    // Root's process is in; nobody's is refused, and status says why.
    assert!(
        mergeable_pages(root.pid(), root_start, pages * 4096) >= want,
        "{}",
        vmas_in(root.pid(), root_start, pages * 4096)
    );
    assert!(merging_pages(root.pid()) >= want - 256);
    let skipped = st["skipped"].as_array().unwrap();
    let entry = skipped
        .iter()
        .find(|s| s["pid"].as_u64() == Some(nobody.pid() as u64))
        .unwrap_or_else(|| panic!("uid 65534 not listed as skipped: {st}"));
    let reason = entry["reason"].as_str().unwrap();
    assert!(
        reason.contains("untrusted uid 65534") && reason.contains("eligible.uids"),
        "{reason}"
    );
    // A few more wake-ups and refreshes: still nothing of nobody's is
    // mergeable, so ksmd cannot merge any of it.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        vmas(nobody.pid()).iter().all(|v| !v.mergeable()),
        "a VMA of uid 65534's process was marked:\n{}",
        vmas_in(nobody.pid(), nobody_start, pages * 4096)
    );
    assert_eq!(ksm_stat_merging(nobody.pid()), 0);
    assert_eq!(merging_pages(nobody.pid()), 0);
    assert!(ksm_stat_merging(root.pid()) > 0);
    // Both ran on, memory as it was.
    assert_eq!(root.checksum(), root_sum);
    assert_eq!(nobody.checksum(), nobody_sum);
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    drop(d);
}

fn userfaultfds(pid: u32) -> usize {
    pagesift_linux::uffd::count_userfaultfds(pid)
}

/// Polls `pred` every 50 ms for at most `timeout`; how long it took.
fn within(timeout: Duration, mut pred: impl FnMut() -> bool) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < timeout {
        if pred() {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn leaving_the_eligible_set_unmarks_and_a_new_source_unregisters_write_tracking() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("leave");
    let dir = tmp.path();
    let name = format!("psleave{}", std::process::id() % 100_000);
    let mut dup = named_workload(
        dir,
        &name,
        None,
        &["static-dup", "--mib", "32", "--seed", "12"],
    );
    let mut cow = Workload::start(&["cow-broken", "--mib", "64"]);
    let (dup_sum, cow_sum) = (dup.checksum(), cow.checksum());
    let (start, pages) = dup.region();
    let config = dir.join("pagesift.toml");
    std::fs::write(&config, "governor = \"full\"\n[actuate]\nrecheck_s = 1\n").unwrap();
    let (pd, pc) = (dup.pid().to_string(), cow.pid().to_string());
    let mut d = start_daemon(
        dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--pid",
            &pd,
            "--pid",
            &pc,
        ],
        false,
    );
    let want = pages * 99 / 100;
    let cow_pid = cow.pid();
    d.wait_for(
        Duration::from_secs(120),
        "the dup merged and the cow-broken one write-tracked",
        |s| {
            s["totals"]["merged_pages"].as_u64().unwrap_or(0) >= want
                && s["totals"]["write_tracked_ranges"].as_u64().unwrap_or(0) >= 1
                && userfaultfds(cow_pid) >= 1
        },
    );
    assert!(mergeable_pages(dup.pid(), start, pages * 4096) == pages);
    assert!(merging_pages(dup.pid()) >= want - 256);

    // The dup becomes ineligible; in the same reload the sub-region size
    // changes (a new source) and write tracking is turned off.
    std::fs::write(
        &config,
        format!(
            "governor = \"full\"\n[scan]\nsubregion_mib = 32\n[actuate]\nrecheck_s = 1\n\
             write_tracking = false\n[ineligible]\ncomms = [\"{name}\"]\n"
        ),
    )
    .unwrap();
    d.signal("HUP");
    // A refresh follows a reload at the next wake-up (at most 1 s).
    let took = within(Duration::from_secs(5), || {
        !any_mergeable(dup.pid(), start, pages * 4096)
    })
    .unwrap_or_else(|| {
        panic!(
            "still marked 5 s after the reload:\n{}\n{}",
            vmas_in(dup.pid(), start, pages * 4096),
            d.log()
        )
    });
    eprintln!("unmarked {:.2} s after SIGHUP", took.as_secs_f64());
    // MADV_UNMERGEABLE broke its KSM pages: nothing of it is merged. The
    // whole batch (the region and any run the sweep marked elsewhere in
    // the process) may still be running when the region's flag is seen
    // cleared, so its end is waited for, briefly.
    if within(Duration::from_secs(5), || merging_pages(dup.pid()) == 0).is_none() {
        panic!(
            "{} KSM pages left in the process 5 s after its region was unmarked:\n{}\n{}",
            merging_pages(dup.pid()),
            vmas_in(dup.pid(), 0, 1 << 47)
                .lines()
                .filter(|l| !l.contains("KSM 0 kB"))
                .collect::<Vec<_>>()
                .join("\n"),
            d.log()
        );
    }
    assert!(
        within(Duration::from_secs(5), || userfaultfds(cow_pid) == 0).is_some(),
        "the old source's userfaultfd is still in the target:\n{}",
        d.log()
    );
    // Status (published about once a second) lists it as excluded.
    let dup_pid = dup.pid() as u64;
    d.wait_for(Duration::from_secs(5), "the dup listed as excluded", |st| {
        st["skipped"].as_array().unwrap().iter().any(|s| {
            s["pid"].as_u64() == Some(dup_pid) && s["reason"] == "excluded by ineligible.comms"
        })
    });
    assert!(
        d.log().contains("left the eligible set: unmarked"),
        "{}",
        d.log()
    );
    // Never marked again while ineligible.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!any_mergeable(dup.pid(), start, pages * 4096));
    // Both ran on, memory as it was.
    assert_eq!(dup.checksum(), dup_sum);
    assert_eq!(cow.checksum(), cow_sum);
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    drop(d);
}

#[test]
fn a_socket_path_that_is_not_a_socket_is_refused_and_kept() {
    let tmp = temp_dir("notsock");
    let dir = tmp.path();
    let file = dir.join("notes.txt");
    std::fs::write(&file, "keep me").unwrap();
    let me = std::process::id().to_string();
    let out = run(&["run", "--socket", file.to_str().unwrap(), "--pid", &me]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(file.to_str().unwrap())
            && err.contains("is not a socket (a regular file)")
            && err.contains("refusing to replace it"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

#[test]
fn as_root_a_config_file_others_could_change_is_refused() {
    require_root();
    use std::os::unix::fs::PermissionsExt;
    let tmp = temp_dir("cfgmode");
    let dir = tmp.path();
    let p = dir.join("pagesift.toml");
    std::fs::write(&p, "[eligible]\nall = true\n").unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = run(&["run", "--config", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(p.to_str().unwrap())
            && err.contains("not trusted")
            && err.contains("0666 lets group or others write it"),
        "{err}"
    );
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
    let out = run(&["run", "--config", p.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("owned by uid 65534, not by root"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&p).unwrap(),
        "[eligible]\nall = true\n"
    );
}

/// The line of cgroup `path` in a status's savings, if listed.
fn cgroup_line<'a>(s: &'a Value, path: &str) -> Option<&'a Value> {
    s["savings"]["cgroups"]["top"]
        .as_array()?
        .iter()
        .find(|c| c["cgroup"] == path)
}

/// Whether status lists the region that starts at a workload's block
/// (`(start, pages)`) and ksmd has settled it.
fn settled(s: &Value, (start, _): (u64, u64)) -> bool {
    let levels = s["levels"].as_array().into_iter().flatten();
    levels
        .flat_map(|l| l["regions"].as_array().into_iter().flatten())
        .any(|r| r["start"].as_u64() == Some(start) && r["state"] == "promoted")
}

fn figure(line: Option<&Value>, key: &str) -> i64 {
    line.and_then(|l| l[key].as_i64()).unwrap_or(0)
}

/// Two cgroups, each with a workload of its own duplicate content and size:
/// status and metrics show each cgroup's own merged pages, bytes saved and
/// COW breaks, with the deeper cgroup folded into its ancestor at
/// `cgroup_depth`.
#[test]
fn each_cgroup_shows_its_own_savings() {
    require_root();
    let _serial = serial();
    let begin = Instant::now();
    let tmp = temp_dir("cgroups");
    let dir = tmp.path();
    // Declared before the workloads: removed after they are killed, also
    // when the test fails.
    let mut cgroups = TestCgroups::new("pagesift-savings");
    let vm = cgroups.create("a/vm");
    let b = cgroups.create("b");
    let a = format!("{}/a", cgroups.parent());
    let wa = cgroups.spawn(&vm, &["static-dup", "--mib", "48", "--seed", "11"]);
    let mut wb = cgroups.spawn(&b, &["static-dup", "--mib", "16", "--seed", "22"]);
    let (a_pages, b_pages) = (wa.region().1 as i64, wb.region().1 as i64);
    let config = dir.join("pagesift.toml");
    // Settled regions are accounted every second, so the COW breaks below
    // show at once.
    std::fs::write(
        &config,
        "[savings]\ncgroup_depth = 2\n[actuate]\nrecheck_s = 1\n",
    )
    .unwrap();
    let (pa, pb) = (wa.pid().to_string(), wb.pid().to_string());
    let mut d = start_daemon(
        dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--pid",
            &pa,
            "--pid",
            &pb,
            "--governor",
            "full",
        ],
        true,
    );
    let t0 = Instant::now();
    eprintln!(
        "daemon started after {:.1} s (KSM's lock)",
        begin.elapsed().as_secs_f64()
    );
    // Merged as the kernel counts it, and settled: an accounting pass saw
    // the pages merged (a COW break is a page seen merged, then not).
    // Settled means the workloads' own regions: a run of a dozen pages
    // elsewhere in a workload, marked late beside the merged set, waits
    // for ksmd's paced scans and may still be merging (one full test run,
    // 2026-11-27: a 13-page run marked at 5 s was unsettled at 45 s).
    let (ra, rb) = (wa.region(), wb.region());
    let st = d.wait_for(Duration::from_secs(45), "both cgroups merged", |s| {
        figure(cgroup_line(s, &a), "merged_pages") >= a_pages * 99 / 100
            && figure(cgroup_line(s, &b), "merged_pages") >= b_pages * 99 / 100
            && s["totals"]["merged_pages"].as_i64().unwrap_or(0) >= (a_pages + b_pages) * 99 / 100
            && settled(s, ra)
            && settled(s, rb)
    });
    let (la, lb) = (cgroup_line(&st, &a).unwrap(), cgroup_line(&st, &b).unwrap());
    eprintln!(
        "merged after {:.1} s: {a} {la}, {b} {lb}",
        t0.elapsed().as_secs_f64()
    );
    // Exactly the two cgroups, one process each, the deeper one under its
    // ancestor at depth 2; nothing summed away.
    let lines = st["savings"]["cgroups"]["top"].as_array().unwrap();
    assert_eq!(lines.len(), 2, "{}", st["savings"]);
    assert!(
        st["savings"]["cgroups"]["rest"].is_null(),
        "{}",
        st["savings"]
    );
    assert_eq!(
        (la["processes"].as_u64(), lb["processes"].as_u64()),
        (Some(1), Some(1))
    );
    // Each its own figures: its workload's pages and no more than a little
    // of its other memory (heap and stack pages that match each other:
    // 70 pages measured), and the kernel's profit (merged pages' bytes less
    // KSM's metadata, 64 bytes per page looked at) within 3 % of a page per
    // merged page.
    for (line, pages) in [(la, a_pages), (lb, b_pages)] {
        let merged = line["merged_pages"].as_i64().unwrap();
        let saved = line["saved_bytes"].as_i64().unwrap();
        assert!(
            merged <= pages + 512,
            "{line}: its workload holds {pages} pages"
        );
        assert!(
            saved <= merged * 4096 && saved >= merged * 4096 * 97 / 100,
            "{line}"
        );
    }
    // The larger cgroup saves about three times the smaller one.
    let ratio = figure(Some(la), "saved_bytes") as f64 / figure(Some(lb), "saved_bytes") as f64;
    assert!((2.8..3.2).contains(&ratio), "{ratio}: {la} {lb}");
    // The kernel agrees. process by process.
    assert!(merging_pages(wa.pid()) as i64 >= a_pages * 99 / 100);
    assert!(merging_pages(wb.pid()) as i64 >= b_pages * 99 / 100);

    // 64 pages of b's rewritten with new content: COW breaks in b only.
    wb.ask("rewrite 0 64");
    let st = d.wait_for(Duration::from_secs(20), "b's COW breaks", |s| {
        figure(cgroup_line(s, &b), "cow_breaks") >= 56
    });
    let (la, lb) = (cgroup_line(&st, &a).unwrap(), cgroup_line(&st, &b).unwrap());
    assert!((56..=64).contains(&figure(Some(lb), "cow_breaks")), "{lb}");
    assert_eq!(figure(Some(la), "cow_breaks"), 0, "{la}");
    eprintln!("after rewriting 64 of b's pages: {a} {la}, {b} {lb}");
    // The top processes carry their cut cgroup.
    let procs = st["savings"]["processes"]["top"].as_array().unwrap();
    assert_eq!(procs.len(), 2, "{}", st["savings"]);
    assert_eq!(procs[0]["pid"].as_u64(), Some(wa.pid() as u64));
    assert_eq!(procs[0]["cgroup"], a.as_str());
    assert_eq!(procs[1]["cgroup"], b.as_str());

    // The metrics say the same.
    let m = d.scrape();
    let cg = |name: &str, path: &str| metric(&m, &format!("pagesift_{name}{{cgroup=\"{path}\"}}"));
    assert_eq!(
        cg("cgroup_merged_pages", &a),
        la["merged_pages"].as_f64().unwrap(),
        "{m}"
    );
    assert!(
        cg("cgroup_saved_bytes", &b) >= (b_pages * 4096 * 9 / 10) as f64,
        "{m}"
    );
    assert_eq!(cg("cgroup_processes", &a), 1.0);
    assert!((56.0..=64.0).contains(&cg("cgroup_cow_breaks", &b)), "{m}");
    assert_eq!(cg("cgroup_cow_breaks", &a), 0.0);
    // And the table.
    let out = run(&["status", "--socket", d.socket.to_str().unwrap()]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("savings per cgroup"), "{table}");
    assert!(
        table.lines().any(|l| l.trim_start().starts_with(&a)),
        "{table}"
    );
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    drop(d); // checks KSM's knobs
    eprintln!("done after {:.1} s", begin.elapsed().as_secs_f64());
}

/// The daemon's resident memory in KiB, peak (VmHWM).
fn peak_rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// 20 processes of 10 000 one-page VMAs each (200 000 regions) under a
/// cap of 20 000: the daemon tracks exactly the cap, says how many it left
/// out, and its memory stays within the cap's bound (docs/reliability.md
/// measures about 3 KiB per region; 6 KiB per region plus 64 MiB is
/// allowed here). Without the cap it held 2.2 KiB per VMA (1.1 GiB for
/// 500 000 one-page VMAs), which would be about 430 MiB for
/// these processes.
#[test]
fn a_daemon_over_more_regions_than_its_cap_stays_bounded() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("vma-bound");
    let dir = tmp.path();
    const CAP: u64 = 20_000;
    let procs: Vec<Workload> = (0..20)
        .map(|i| {
            let seed = (i + 1).to_string();
            Workload::start(&["vmas", "--count", "10000", "--seed", &seed])
        })
        .collect();
    let config = dir.join("cap.toml");
    std::fs::write(&config, format!("[scan]\nmax_regions = {CAP}\n")).unwrap();
    let pids: Vec<String> = procs.iter().map(|p| p.pid().to_string()).collect();
    let mut args = vec!["--config", config.to_str().unwrap()];
    for p in &pids {
        args.extend(["--pid", p.as_str()]);
    }
    let mut d = start_daemon(dir, &args, false);
    let st = d.wait_for(Duration::from_secs(120), "regions left out", |s| {
        s["totals"]["regions_left_out"].as_u64().unwrap_or(0) > 0
    });
    // Let it run a while: marks, refreshes, write watching.
    std::thread::sleep(Duration::from_secs(15));
    let st = d.status().unwrap_or(st);
    let regions = st["totals"]["regions"].as_u64().unwrap();
    let left_out = st["totals"]["regions_left_out"].as_u64().unwrap();
    assert_eq!(regions, CAP, "{}", st["totals"]);
    assert!(left_out >= 200_000 - CAP, "left out {left_out}");
    let pid = d.child.as_ref().unwrap().id();
    let peak = peak_rss_kib(pid);
    eprintln!(
        "{regions} regions tracked, {left_out} left out: peak {} MiB ({:.2} KiB per region)",
        peak / 1024,
        peak as f64 / regions as f64
    );
    assert!(
        peak <= CAP * 6 + 64 * 1024,
        "peak resident {peak} KiB for {regions} regions"
    );
    assert!(d.log().contains("left out"), "the log says so");
    assert!(d.stop().success());
}

/// Trimming (`actuate.trim_min_pages`, docs/trimming.md) on a real
/// process: a region of 2 MiB runs, about half of them one repeated run
/// and the rest distinct, is marked whole: no sweep to leave the distinct
/// runs out first, and no run promotion (`run_min_pages = 0`). With run
/// promotion on, the duplicate runs were marked first, one by one, and
/// the rest was promoted in pieces that the kernel joined back to the
/// marked runs, each join merging the region again: in CI no trim came
/// within 90 s (eba518c), and by hand 1 run in 6 had none after 60 s.
/// Once ksmd has settled the region, its distinct stretches are unmarked
/// (`MADV_UNMERGEABLE` injected into the process, splitting its VMA)
/// while the merged runs stay marked and merged; the process's
/// memory is what it was, and it keeps running.
#[test]
fn a_settled_region_is_trimmed_of_its_unmerged_stretches_and_its_process_sees_nothing() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("trim");
    let dir = tmp.path();
    let mut w = Workload::start(&[
        "mixed",
        "--mib",
        "32",
        "--dup-ratio",
        "0.5",
        "--run-pages",
        "512",
        "--seed",
        "3",
    ]);
    let sum = w.checksum();
    let (start, pages) = w.region();
    let len = pages * 4096;
    let config = dir.join("pagesift.toml");
    std::fs::write(
        &config,
        "governor = \"full\"\n[scan]\nsweep_share = 0.0\n[actuate]\ntrim_min_pages = 256\nrun_min_pages = 0\n",
    )
    .unwrap();
    let p = w.pid().to_string();
    let mut d = start_daemon(
        dir,
        &["--config", config.to_str().unwrap(), "--pid", &p],
        false,
    );
    let st = d.wait_for(Duration::from_secs(90), "a trim", |s| {
        s["totals"]["trims"].as_u64().unwrap_or(0) >= 1
    });
    let trimmed = st["totals"]["trimmed_pages"].as_u64().unwrap();
    assert!(trimmed >= 256, "{st}");
    // The kernel agrees. part of the region is no longer mergeable, the
    // rest still is, and its merged pages stayed merged.
    let vmas = vmas_overlapping(w.pid(), start, len);
    let unmarked: u64 = (vmas.iter())
        .filter(|v| !v.mergeable())
        .map(|v| (v.end.min(start + len) - v.start.max(start)) / 4096)
        .sum();
    assert!(
        unmarked >= 256 && vmas.iter().any(|v| v.mergeable()),
        "{}",
        vmas_in(w.pid(), start, len)
    );
    assert!(
        merging_pages(w.pid()) > 0,
        "{}",
        vmas_in(w.pid(), start, len)
    );
    // And the stretch the daemon says it trimmed is the one unmarked.
    let log = d.log();
    let trim_start: u64 = (log.lines())
        .find(|l| l.contains("trimmed:"))
        .and_then(|l| l.split(" start=").nth(1))
        .and_then(|v| v.split(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no trimmed stretch in the log:\n{log}"));
    assert!(
        (start..start + len).contains(&trim_start)
            && !vm_flags(w.pid(), trim_start).contains(&"mg".to_string()),
        "{trim_start:#x}: {}",
        vmas_in(w.pid(), start, len)
    );
    // The process saw nothing and keeps running.
    assert_eq!(w.checksum(), sum);
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    assert_eq!(w.checksum(), sum);
    drop(d);
}
