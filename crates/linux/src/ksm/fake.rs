//! Test support: a fake KSM sysfs directory and a lock in a scratch
//! directory, so the guard's logic is tested without touching the
//! machine's KSM.

use super::GuardOptions;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

/// A fake KSM directory with the files of this machine's 6.18 kernel
/// (as listed on it): knobs 0644, counters 0444.
pub(super) fn fake_ksm(dir: &Path) {
    let knobs = [
        ("run", "0"),
        ("pages_to_scan", "100"),
        ("sleep_millisecs", "20"),
        ("merge_across_nodes", "1"),
        ("use_zero_pages", "0"),
        ("max_page_sharing", "256"),
        ("stable_node_chains_prune_millisecs", "2000"),
        ("smart_scan", "1"),
        ("advisor_mode", "[none] scan-time"),
        ("advisor_max_cpu", "70"),
        ("advisor_min_pages_to_scan", "500"),
        ("advisor_max_pages_to_scan", "30000"),
        ("advisor_target_scan_time", "200"),
        // A knob of some newer kernel.
        ("future_knob", "7"),
    ];
    let counters = [
        ("pages_shared", "3"),
        ("pages_sharing", "765"),
        ("general_profit", "-4096"),
        ("full_scans", "2"),
    ];
    std::fs::create_dir_all(dir).unwrap();
    for (n, v) in knobs {
        std::fs::write(dir.join(n), format!("{v}\n")).unwrap();
        std::fs::set_permissions(dir.join(n), std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    for (n, v) in counters {
        std::fs::write(dir.join(n), format!("{v}\n")).unwrap();
        std::fs::set_permissions(dir.join(n), std::fs::Permissions::from_mode(0o444)).unwrap();
    }
}

/// A scratch directory for one test's fake sysfs and lock file, removed
/// when the guard drops.
pub(super) fn tmpdir(tag: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("pagesift-ksm-{tag}-"))
        .tempdir()
        .unwrap()
}

pub(super) fn opts(d: &Path) -> GuardOptions {
    GuardOptions {
        sysfs: d.join("ksm"),
        lock_path: d.join("lock"),
        wait: Some(Duration::from_secs(5)),
    }
}
