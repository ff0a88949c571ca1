//! Live test of the interpreter-workers workload: real `/usr/bin/python3`
//! workers reading the bench's data file, measured by `pagesift scan
//! --exact` as the experiment does.
//!
//! Without /usr/bin/python3 the test passes with a "skipped: ... run
//! scripts/setup" line, unless `PAGESIFT_REQUIRE_GUESTS=1` (as `.ci/run`
//! sets after `scripts/setup`).

use pagesift_bench::interpreters::{self, InterpreterPlan};

const PAGE: u64 = 4096;

/// `ksm_merge_any` of `/proc/PID/ksm_stat` (PR_SET_MEMORY_MERGE).
fn merge_any(pid: u32) -> bool {
    let s = std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).unwrap();
    s.lines().any(|l| l == "ksm_merge_any: yes")
}

#[test]
fn workers_share_the_data_file_and_nothing_else_and_ksm_runs_see_them_mergeable() {
    pagesift_testkit::require_root();
    if let Err(e) = interpreters::check_python() {
        if std::env::var("PAGESIFT_REQUIRE_GUESTS").is_ok_and(|v| v == "1") {
            panic!("PAGESIFT_REQUIRE_GUESTS=1 but {e}");
        }
        eprintln!("skipped: {e}");
        return;
    }
    let pagesift = pagesift_testkit::pagesift_bin();
    let dir = tempfile::tempdir().unwrap();
    let plan = InterpreterPlan {
        count: 3,
        data_mib: 8,
        private_mib: 2,
        write_every_ms: 5,
        write_bytes: 4096,
    };
    let data = interpreters::data_file(dir.path(), &plan).unwrap();
    assert_eq!(std::fs::metadata(&data).unwrap().len(), 8 << 20);

    for merge in [false, true] {
        let workers = interpreters::start_workers(&plan, &data, merge).unwrap();
        let pids: Vec<u32> = workers.iter().flat_map(|w| w.pids()).collect();
        assert_eq!(pids.len(), 3);
        for &p in &pids {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap();
            assert_eq!(comm.trim(), "python3");
            assert_eq!(
                std::fs::read_link(format!("/proc/{p}/exe")).unwrap(),
                std::fs::canonicalize(interpreters::PYTHON).unwrap()
            );
            // KSM systems' workers are mergeable by themselves; pagesift's
            // are not.
            assert_eq!(merge_any(p), merge, "pid {p}");
        }
        let exact = interpreters::exact_saving(&pagesift, &pids).unwrap();
        let data_pages = (plan.data_mib << 20) / PAGE;
        // Two of the three copies of the data can go (less the page of
        // each bytes object that holds its header), and the random private
        // buffers add nothing: what the interpreters' own heaps have in
        // common stays far below one private buffer.
        let low = 2 * (data_pages - 2);
        let high = 2 * data_pages + (plan.private_mib << 20) / PAGE / 2;
        eprintln!(
            "merge_any={merge}: exact saving {} pages of {} present, want {low}..={high}",
            exact.saving_pages, exact.present_pages
        );
        assert!(
            (low..=high).contains(&exact.saving_pages),
            "exact saving {} pages, want {low}..={high}",
            exact.saving_pages
        );
        assert!(exact.present_pages >= 3 * (data_pages + (plan.private_mib << 20) / PAGE));
        // They keep running (writing) until stopped.
        std::thread::sleep(std::time::Duration::from_millis(300));
        for &p in &pids {
            assert!(pagesift_linux::procstat::is_alive(p));
        }
        drop(workers);
        for &p in &pids {
            assert!(
                !pagesift_linux::procstat::is_alive(p),
                "worker {p} survived"
            );
        }
    }
}
