//! The binary as a user meets it: help, output formats, exit codes.

use std::process::Command;

fn pagesift(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_pagesift"))
        .args(args)
        .output()
        .expect("run pagesift")
}

#[test]
fn help_lists_the_commands() {
    let out = pagesift(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("simulate"), "{text}");
}

#[test]
fn simulate_json_is_one_object_per_wakeup() {
    let out = pagesift(&["simulate", "--seconds", "3", "--pages", "512", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert!(
        lines.len() >= 20,
        "3 s at 100 ms per wake-up: {} lines",
        lines.len()
    );
    let last = lines.last().unwrap();
    assert!(last["now"].as_u64().unwrap() >= 3_000_000_000);
    assert_eq!(last["levels"]["static"].as_array().unwrap().len(), 4);
}

#[test]
fn simulate_table_ends_with_a_summary() {
    let out = pagesift(&["simulate", "--seconds", "3", "--pages", "512"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("global rounds"), "{text}");
}

#[test]
fn a_bad_governor_is_a_usage_error_that_names_it() {
    let out = pagesift(&["simulate", "--governor", "turbo"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("turbo") && err.contains("--governor"), "{err}");
}

#[test]
fn a_bad_duration_is_a_usage_error() {
    let out = pagesift(&["simulate", "--seconds", "-1"]);
    assert_eq!(out.status.code(), Some(2));
}
