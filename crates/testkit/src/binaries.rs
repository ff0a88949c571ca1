//! The workspace's binaries, for tests of other packages.
//!
//! Cargo builds a package's own binaries for its integration tests
//! (`env!("CARGO_BIN_EXE_<name>")`), but not those of other packages. So
//! [`bin`] runs `cargo build -p PACKAGE` once per test binary (a no-op
//! when fresh) with the test's profile and target directory, and returns
//! `target/<profile>/<name>`: the binary the tests exercise is always the
//! current source.
//!
//! Inside the cli crate's own tests, use `env!("CARGO_BIN_EXE_pagesift")`
//! instead of [`pagesift_bin`]: cargo has built it for them, and a nested
//! `cargo build -p pagesift` would resolve the package's features without
//! its dev-dependencies and could rebuild what the test run just built.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

/// Path of binary `name` of workspace package `package`, built on first
/// use (`cargo build -p`, a no-op when fresh) with this test's profile.
pub fn bin(package: &'static str, name: &'static str) -> PathBuf {
    static BINS: Mutex<Vec<(&'static str, PathBuf)>> = Mutex::new(Vec::new());
    let mut bins = BINS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, p)) = bins.iter().find(|(n, _)| *n == name) {
        return p.clone();
    }
    let path = cargo_artifact(&["-p", package], name);
    bins.push((name, path.clone()));
    path
}

/// Runs `cargo build --quiet ARGS` with this test's profile and returns
/// `target/<profile>/<artifact>`, which must exist afterwards.
pub fn cargo_artifact(args: &[&str], artifact: &str) -> PathBuf {
    // target/<profile>/deps/<test> -> target/<profile>
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(|d| d.parent())
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| env!("CARGO").to_string());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet"]).args(args);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("running cargo build");
    assert!(status.success(), "cargo build {args:?} failed");
    let path = dir.join(artifact);
    assert!(path.exists(), "{} missing after build", path.display());
    path
}

/// The `pagesift-workload` binary.
pub fn workload_bin() -> PathBuf {
    bin("pagesift-workload", "pagesift-workload")
}

/// The `pagesift` binary, for tests outside the cli crate (see the module
/// header for the cli crate's own tests).
pub fn pagesift_bin() -> PathBuf {
    bin("pagesift", "pagesift")
}
