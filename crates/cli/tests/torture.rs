//! A short kill campaign (`scripts/torture`): the daemon SIGKILLed a dozen
//! times at random moments (some inside an injection, some with its tracer
//! thread panicking) while it marks, unmarks and write-tracks real
//! self-checking targets, then the bad-input table. Nothing may be harmed.
//! Root is needed; python3 runs the script (`scripts/setup` installs it).

#[path = "../../linux/tests/common/mod.rs"]
mod common;
mod support;

use std::process::Command;

#[test]
fn daemon_killed_at_random_moments_harms_no_target() {
    common::require_root();
    let _serial = support::serial();
    let target = common::cargo_artifact(
        &["-p", "pagesift-linux", "--example", "inject_target"],
        "examples/inject_target",
    );
    let workload = common::workload_bin();
    // One directory with the binaries the script expects.
    let dir = support::tmpdir("torture-bins");
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
        .arg(&dir)
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
    assert!(out.status.success(), "{stderr}");
}
