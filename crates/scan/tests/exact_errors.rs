//! Exact scan errors (root): each error the operator can meet, with what
//! it says and its exit code (the command line's are in `exact_cli.rs`).

mod exact_support;

use exact_support::*;
use pagesift_linux::caps::{self, Capability};
use pagesift_linux::{LinuxError, ProcessFilter};
use pagesift_scan::ScanError;
use pagesift_scan::exact::{ExactOptions, run};

fn opts(pids: &[u32]) -> ExactOptions {
    ExactOptions {
        filter: ProcessFilter::pids(pids.iter().copied()),
        ..ExactOptions::default()
    }
}

/// Runs a scan on a thread that lacks `cap`.
fn scan_without(cap: Capability, pids: Vec<u32>) -> Result<pagesift_scan::Report, ScanError> {
    std::thread::spawn(move || {
        caps::drop_from_this_thread(&[cap]).expect("dropping a capability");
        assert!(!caps::has(cap));
        run(&opts(&pids))
    })
    .join()
    .expect("scan thread")
}

#[test]
fn a_pid_that_does_not_exist_says_so() {
    require_root();
    let e = run(&opts(&[NO_SUCH_PID])).expect_err("no such pid");
    assert!(
        matches!(e, ScanError::Linux(LinuxError::NoSuchProcess(NO_SUCH_PID))),
        "{e:?}"
    );
    assert_eq!(e.to_string(), format!("no process with pid {NO_SUCH_PID}"));
    assert_eq!(e.exit_code(), 1);
}

#[test]
fn pagesift_never_scans_itself() {
    require_root();
    let own = std::process::id();
    let e = run(&opts(&[own])).expect_err("own pid");
    assert!(
        matches!(e, ScanError::Linux(LinuxError::OwnProcess(p)) if p == own),
        "{e:?}"
    );
    // A filter that matches only this process selects nothing.
    let comm = std::fs::read_to_string("/proc/self/comm").expect("own comm");
    let r = run(&ExactOptions {
        filter: ProcessFilter {
            comms: vec![comm.trim_end().to_string()],
            ..ProcessFilter::default()
        },
        ..ExactOptions::default()
    })
    .expect("scan by comm");
    assert!(r.processes.iter().all(|p| p.pid != own), "{r:?}");
}

#[test]
fn without_cap_sys_admin_the_error_names_it() {
    require_root();
    let _g = serial();
    let w = Workload::start(&["random", "--mib", "4"]);
    let e = scan_without(Capability::SysAdmin, vec![w.pid()]).expect_err("needs CAP_SYS_ADMIN");
    assert!(
        matches!(
            e,
            ScanError::Linux(LinuxError::MissingCapability {
                cap: Capability::SysAdmin,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("CAP_SYS_ADMIN"), "{e}");
    assert_eq!(e.exit_code(), 1);
}

#[test]
fn without_cap_sys_ptrace_the_error_names_it() {
    require_root();
    let _g = serial();
    // The workload runs as root with every capability: reading it needs
    // CAP_SYS_PTRACE once the scanning thread lacks it.
    let w = Workload::start(&["random", "--mib", "4"]);
    let e = scan_without(Capability::SysPtrace, vec![w.pid()]).expect_err("needs CAP_SYS_PTRACE");
    assert!(
        matches!(
            e,
            ScanError::Linux(LinuxError::MissingCapability {
                cap: Capability::SysPtrace,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("CAP_SYS_PTRACE"), "{e}");
}

#[test]
fn a_process_that_exits_mid_scan_is_skipped_and_counted() {
    require_root();
    let _g = serial();
    // The big one is scanned first (lower pid) and takes at least 0.3 s
    // (3 GiB at the read limit of ~2.5 M pages/s); the small one is killed
    // 0.1 s into the scan, after discovery listed it, before its turn.
    let big = Workload::start(&["random", "--mib", "3072", "--seed", "71"]);
    let mut small = Workload::start(&["random", "--mib", "64", "--seed", "72"]);
    assert!(big.pid() < small.pid(), "pid order (pids wrapped?)");
    let pids = [big.pid(), small.pid()];
    let scan = std::thread::spawn(move || run(&opts(&pids)));
    std::thread::sleep(std::time::Duration::from_millis(100));
    small.kill_now();
    let r = scan
        .join()
        .expect("scan thread")
        .expect("a vanishing process is no error");
    small.wait_exit();
    assert_eq!(r.gone, 1, "{r:?}");
    assert!(r.processes.iter().all(|p| p.pid != small.pid()));
    let b = region(&r, big.pid(), big.region().0);
    assert_eq!(b.counts.present, big.count("present_pages"));
    // Named after it exited (a zombie, not yet reaped): discovery skips it
    // (no memory left), without an error.
    let r = run(&opts(&[small.pid()])).expect("zombie");
    assert!(r.processes.is_empty(), "{r:?}");
}

#[test]
fn invalid_options_are_usage_errors() {
    let e = run(&ExactOptions {
        threads: 3,
        ..ExactOptions::default()
    })
    .expect_err("threads 3");
    assert_eq!(e.exit_code(), 2);
    assert!(e.to_string().contains("threads"), "{e}");
}
