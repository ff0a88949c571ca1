//! # pagesift-testkit: what every live test of pagesift needs, once
//!
//! pagesift's tests run real processes against the real kernel (DEVELOPERS.md:
//! no stubs). The support they share lives here, as a `publish = false`
//! dev-dependency of the crates whose tests use it:
//!
//! - [`serial`]: one test at a time, within a test binary and across test
//!   binaries running in parallel (a mutex and an `flock`).
//! - [`binaries`]: the workspace's binaries (`pagesift`, `pagesift-workload`,
//!   the injection target), built on first use with the test's profile.
//! - [`workload`]: a `pagesift-workload` process as a guard: its report,
//!   its commands, killed with its children on drop.
//! - [`reaped`]: any child (a daemon a test starts by hand) killed and reaped
//!   on drop.
//! - [`daemon`]: `pagesift run` as a guard that stops it and checks that
//!   `/sys/kernel/mm/ksm` is as it found it.
//! - [`inject_target`]: the self-checking target of the injection tests.
//! - [`cgroups`]: cgroup v2 directories made for one test and removed after.
//! - [`observe`]: what a test reads about a process without touching it
//!   (RSS, page tables, pagemap, cgroup).
//! - [`tracer`]: a second tracer held on a target, so that pagesift's
//!   attach is skipped.
//! - [`temp_dir`]: a scratch directory removed on drop (`tempfile`).
//!
//! Invariant: every guard here cleans up on drop, also when the test
//! panics, so a failed test leaves no process, cgroup or KSM setting behind.
//! Nothing here is a stub: the kit only starts and observes real processes.

pub mod binaries;
pub mod cgroups;
pub mod daemon;
pub mod inject_target;
pub mod observe;
pub mod reaped;
pub mod serial;
pub mod tracer;
pub mod workload;

pub use binaries::{bin, cargo_artifact, pagesift_bin, workload_bin};
pub use cgroups::TestCgroups;
pub use daemon::{Daemon, free_port, knobs};
pub use inject_target::Target;
pub use observe::{NO_SUCH_PID, cgroup_of, pagemap_entries, present_count, rss_and_pte};
pub use reaped::Reaped;
pub use serial::{Serial, serial, unmerge_all};
pub use tracer::SeizedHold;
pub use workload::{HOLEY_STATIC_DUP, Workload};

/// Panics unless running as root: the live tests read other processes'
/// page maps (CAP_SYS_PTRACE), PFNs (CAP_SYS_ADMIN) and ptrace them.
/// (Checked as those capabilities, so that the test crates need no syscall
/// crate of their own.)
pub fn require_root() {
    use pagesift_linux::caps::{Capability, has};
    assert!(
        has(Capability::SysAdmin) && has(Capability::SysPtrace),
        "the live tests need root (CAP_SYS_ADMIN for PFNs, CAP_SYS_PTRACE to read and \
         ptrace processes)"
    );
}

/// A scratch directory named `pagesift-<name>-…`, removed with everything
/// in it when the guard drops.
pub fn temp_dir(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("pagesift-{name}-"))
        .tempdir()
        .expect("creating a temporary directory")
}
