//! The Debian package, installed on this machine: `scripts/deb` (which
//! installs cargo-deb when it is missing) packages the `pagesift` binary
//! this test run built, `dpkg -i` installs it, and the installed binary,
//! unit, config and dashboard are checked: `pagesift --version` runs, and
//! `systemd-analyze verify` accepts the unit where Debian put it. The
//! package is purged at the end, also when the test fails.
//!
//! The package is built from the test profile's binary (`--no-build
//! --profile dev`), not a release build: what is checked is where the
//! package puts things and that they work, and a release build of the
//! whole binary would add minutes to every test run. `scripts/deb` with no
//! arguments builds the release package.
//!
//! Needs root (dpkg), `systemd-analyze` (Debian's `systemd` package) and
//! cargo-deb; `scripts/setup` installs the last two.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const PACKAGE: &str = "pagesift";
const UNIT: &str = "/usr/lib/systemd/system/pagesift.service";
const CONFIG: &str = "/etc/pagesift/pagesift.toml";
const DASHBOARD: &str = "/usr/share/pagesift/grafana/pagesift-dashboard.json";
const SHORT_LIVED: &str = "/usr/share/pagesift/profiles/short-lived.toml";

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("running {cmd:?}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// `dpkg ARGS`, waiting (up to two minutes) while another package tool
/// holds dpkg's lock.
fn dpkg(args: &[&str]) -> Output {
    let t0 = Instant::now();
    loop {
        let out = run(Command::new("dpkg").args(args));
        let locked = text(&out.stderr).contains("lock");
        if out.status.success() || !locked || t0.elapsed() > Duration::from_secs(120) {
            return out;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// Whether Debian's package database has `pagesift` installed.
fn installed() -> bool {
    let out = run(Command::new("dpkg-query").args(["-W", "-f=${Status}", PACKAGE]));
    text(&out.stdout).contains("install ok installed")
}

/// The package, installed by this test: purged on drop, also on failure.
struct Installed;

impl Drop for Installed {
    fn drop(&mut self) {
        let out = dpkg(&["--purge", PACKAGE]);
        if !out.status.success() {
            eprintln!("dpkg --purge {PACKAGE} failed: {}", text(&out.stderr));
        }
    }
}

#[test]
fn the_deb_installs_a_pagesift_that_runs_and_a_unit_that_verifies() {
    assert!(
        pagesift_linux::caps::has(pagesift_linux::Capability::SysAdmin),
        "installing a package needs root"
    );
    assert!(
        !installed(),
        "a {PACKAGE} package is already installed on this machine: this test installs \
         and purges its own, so it leaves that one alone (dpkg --purge {PACKAGE} to run it)"
    );
    let out_dir = tempfile::tempdir().unwrap();
    // The binary this run built (target/debug/pagesift).
    let binary = Path::new(env!("CARGO_BIN_EXE_pagesift"));
    assert!(binary.ends_with("debug/pagesift"), "{}", binary.display());
    let t0 = Instant::now();
    let built = run(Command::new(workspace().join("scripts/deb"))
        .args(["--no-build", "--profile", "dev", "--output"])
        .arg(out_dir.path()));
    assert!(
        built.status.success(),
        "scripts/deb failed:\n{}{}",
        text(&built.stdout),
        text(&built.stderr)
    );
    let deb = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "deb"))
        .expect("a .deb in the output directory");
    eprintln!(
        "built {} in {:.1} s",
        deb.display(),
        t0.elapsed().as_secs_f64()
    );

    // What it holds, before it is installed.
    let contents = text(&run(Command::new("dpkg-deb").arg("--contents").arg(&deb)).stdout);
    for path in [
        "./usr/bin/pagesift",
        &format!(".{UNIT}"),
        &format!(".{CONFIG}"),
        &format!(".{DASHBOARD}"),
        &format!(".{SHORT_LIVED}"),
        "./usr/share/doc/pagesift/README.md",
        "./usr/share/doc/pagesift/copyright",
    ] {
        assert!(
            contents.lines().any(|l| l.ends_with(&format!(" {path}"))),
            "{path} missing from the package:\n{contents}"
        );
    }
    let field = |name: &str| {
        text(
            &run(Command::new("dpkg-deb")
                .args(["--field"])
                .arg(&deb)
                .arg(name))
            .stdout,
        )
        .trim()
        .to_string()
    };
    assert_eq!(field("Package"), PACKAGE);
    assert_eq!(field("Version"), format!("{}-1", env!("CARGO_PKG_VERSION")));

    // verify has teeth: before the install, the unit's ExecStart names a
    // binary that is not there.
    let unpacked = tempfile::tempdir().unwrap();
    assert!(
        run(Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(unpacked.path()))
        .status
        .success()
    );
    let early = run(Command::new("systemd-analyze")
        .arg("verify")
        .arg(unpacked.path().join(UNIT.trim_start_matches('/'))));
    assert!(
        !early.status.success() && text(&early.stderr).contains("/usr/bin/pagesift"),
        "systemd-analyze verify passed a unit whose binary is missing: {early:?}"
    );

    let _installed = Installed;
    let out = dpkg(&["-i", deb.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "dpkg -i failed:\n{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(installed());

    // The installed binary runs.
    let version = run(Command::new("/usr/bin/pagesift").arg("--version"));
    assert!(version.status.success(), "{version:?}");
    assert_eq!(
        text(&version.stdout).trim(),
        format!("pagesift {}", env!("CARGO_PKG_VERSION"))
    );
    // The unit verifies where Debian put it (its ExecStart names the
    // installed binary, which verify checks is executable).
    let verify = run(Command::new("systemd-analyze").args(["verify", UNIT]));
    let said = format!("{}{}", text(&verify.stdout), text(&verify.stderr));
    eprintln!("systemd-analyze verify {UNIT}: {:?}", said.trim());
    assert!(verify.status.success(), "{said}");
    assert!(
        !said.contains("pagesift"),
        "warnings about the unit: {said}"
    );
    // Installed, not enabled: nothing is merged before the operator says
    // which processes may be, so the operator enables it.
    assert!(!Path::new("/etc/systemd/system/multi-user.target.wants/pagesift.service").exists());
    // The config with its comments, as a conffile (kept on upgrade, the
    // operator's edits respected), and the dashboard, as in dist/.
    let dist = |f: &str| std::fs::read_to_string(workspace().join("dist").join(f)).unwrap();
    assert_eq!(
        std::fs::read_to_string(CONFIG).unwrap(),
        dist("pagesift.toml")
    );
    assert_eq!(
        std::fs::read_to_string(DASHBOARD).unwrap(),
        dist("pagesift-dashboard.json")
    );
    assert_eq!(
        std::fs::read_to_string(SHORT_LIVED).unwrap(),
        dist("profiles/short-lived.toml")
    );
    assert_eq!(
        std::fs::read_to_string(UNIT).unwrap(),
        dist("pagesift.service")
    );
    let conffiles = run(Command::new("dpkg-query").args(["-W", "-f=${Conffiles}", PACKAGE]));
    assert!(text(&conffiles.stdout).contains(CONFIG), "{conffiles:?}");
    // Root's own, writable by root only: the daemon trusts it.
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(CONFIG).unwrap();
    assert_eq!((meta.uid(), meta.mode() & 0o022), (0, 0));

    drop(_installed);
    assert!(!installed(), "still installed after the purge");
    for path in ["/usr/bin/pagesift", UNIT, CONFIG, DASHBOARD, SHORT_LIVED] {
        assert!(!Path::new(path).exists(), "{path} left after the purge");
    }
}
