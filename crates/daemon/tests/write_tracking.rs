//! `LinuxTarget`'s write tracking across a reconfigure (a SIGHUP that
//! changes which processes are eligible), against a real target
//! (`examples/inject_target.rs` of pagesift-linux, which checks its own
//! memory and syscalls): what the old tracker could not take out of a
//! process, because its attach was skipped, is taken out by the next sync
//! under the new configuration, and no userfaultfd of ours is left in the
//! process. Root is needed (ptrace, pagemap).

#![cfg(target_arch = "x86_64")]

use pagesift_daemon::target::{LinuxTarget, RegionLimits, Target};
use pagesift_linux::ProcessFilter;
use pagesift_linux::uffd::count_userfaultfds;
use pagesift_testkit::{Reaped, SeizedHold, Target as InjectTarget};
use std::process::Command;

const LIMITS: RegionLimits = RegionLimits {
    subregion_pages: 16_384,
    max_regions: 1024,
};

#[test]
fn a_reconfigure_that_cannot_untrack_a_process_leaves_it_for_the_next_sync() {
    pagesift_testkit::require_root();
    let _g = pagesift_testkit::serial();
    let t = InjectTarget::start("sleep", &["--ms", "20"]);
    let (pid, addr, len) = (t.pid(), t.addr(), t.len());
    let mut target = LinuxTarget::new(ProcessFilter::pids([pid]), LIMITS).expect("target");
    assert_eq!(target.sync_write_tracking(&[(pid, addr, addr + len)]), 1);
    assert_eq!(count_userfaultfds(pid), 1, "tracked");

    // Another tracer holds the process while the configuration changes to
    // one that does not select it: the untrack cannot attach.
    let hold = SeizedHold::new(pid);
    let other = Reaped(Command::new("sleep").arg("60").spawn().expect("sleep"));
    target
        .reconfigure(ProcessFilter::pids([other.0.id()]), LIMITS)
        .expect("reconfigure");
    assert_eq!(count_userfaultfds(pid), 1, "the attach was skipped");
    hold.release();

    // The next sync, which wants nothing of it, takes it out.
    assert_eq!(target.sync_write_tracking(&[]), 0);
    assert_eq!(count_userfaultfds(pid), 0, "a userfaultfd was left behind");
    let report = t.finish();
    assert!(report["iterations"].as_u64().unwrap() > 0, "{report}");
}
