//! `pagesift scan --exact` as the operator runs it (root): exit codes,
//! messages, `--json`, the table, and the process filters.

mod exact_support;

use exact_support::*;
use std::process::Command;

fn pagesift(args: &[&str]) -> (i32, String, String) {
    let o = Command::new(pagesift_bin())
        .args(args)
        .output()
        .expect("running pagesift");
    (
        o.status.code().expect("exit code"),
        String::from_utf8_lossy(&o.stdout).to_string(),
        String::from_utf8_lossy(&o.stderr).to_string(),
    )
}

#[test]
fn the_command_line_exit_codes() {
    require_root();
    let _g = serial();
    let bin = pagesift_bin();
    let run = |args: &[&str]| {
        let o = Command::new(&bin)
            .args(args)
            .output()
            .expect("running pagesift");
        (
            o.status.code().expect("exit code"),
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        )
    };
    let (code, _, err) = run(&["scan", "--exact", "--pid", &NO_SUCH_PID.to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("no process with pid {NO_SUCH_PID}")),
        "{err}"
    );
    for bad in [
        &["scan", "--exact", "--rescan", "-1"][..],
        &["scan", "--exact", "--rescan", "nan"],
        &["scan", "--rescan", "1"],
        &["scan", "--exact", "--threads", "3"],
        &["scan", "--exact", "--no-such-option"],
        &["scan", "--exact", "--pid", "abc"],
    ] {
        let (code, _, err) = run(bad);
        assert_eq!(code, 2, "{bad:?}: {err}");
        assert!(!err.is_empty());
    }
    let w = Workload::start(&["static-dup", "--mib", "16", "--seed", "81"]);
    let (code, out, err) = run(&["scan", "--exact", "--pid", &w.pid().to_string(), "--json"]);
    assert_eq!(code, 0, "{err}");
    // Not a terminal: no progress bar on stderr.
    assert!(err.is_empty(), "{err}");
    let r: pagesift_scan::Report = serde_json::from_str(&out).expect("--json is a Report");
    let x = region(&r, w.pid(), w.region().0);
    assert_eq!(n(&x.counts.saving), w.count("duplicate_pages"));
    // One thread: its CPU time fits in the wall time (ms rounding aside).
    assert!(
        r.cpu_ms <= r.elapsed_ms + 1,
        "{} CPU ms in {} ms",
        r.cpu_ms,
        r.elapsed_ms
    );
    let (code, out, _) = run(&["scan", "--exact", "--pid", &w.pid().to_string()]);
    assert_eq!(code, 0);
    assert!(
        out.contains("TOTAL") && out.contains(&w.pid().to_string()),
        "{out}"
    );
}

#[test]
fn filters_narrow_the_named_processes() {
    require_root();
    let _g = serial();
    let w = Workload::start(&["random", "--mib", "8", "--seed", "91"]);
    let pid = w.pid().to_string();
    let cgroup = procfs::process::Process::new(w.pid() as i32)
        .and_then(|p| p.cgroups())
        .expect("cgroups")
        .into_iter()
        .find(|c| c.hierarchy == 0)
        .map(|c| c.pathname)
        .expect("a cgroup v2 path");
    let pids = |args: &[&str]| -> Vec<u32> {
        let mut a = vec!["scan", "--exact", "--json", "--pid", &pid];
        a.extend_from_slice(args);
        let (code, out, err) = pagesift(&a);
        assert_eq!(code, 0, "{args:?}: {err}");
        let r: pagesift_scan::Report = serde_json::from_str(&out).expect("JSON");
        r.processes.iter().map(|p| p.pid).collect()
    };
    assert_eq!(pids(&[]), [w.pid()]);
    assert_eq!(pids(&["--uid", "0"]), [w.pid()]);
    assert_eq!(pids(&["--uid", "4242"]), Vec::<u32>::new());
    assert_eq!(pids(&["--comm", "pagesift-worklo"]), [w.pid()]);
    assert_eq!(pids(&["--comm", "nothing-else"]), Vec::<u32>::new());
    assert_eq!(pids(&["--cgroup", &cgroup]), [w.pid()]);
    assert_eq!(pids(&["--cgroup", "/no/such/cgroup"]), Vec::<u32>::new());
}
