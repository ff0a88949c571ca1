//! Live test of the guest-files experiment's measurement
//! (`pagesift_bench::guest_files`) on real QEMU (TCG) guests: each guest
//! boots, waits on its input port, reads the files from its own disk copy
//! in its own order when told to, and the copies of the file data are
//! found in its RAM; with ksmd stopped nothing counts as saved, and once
//! the kernel's KSM has merged the guests' RAM (QEMU's mem-merge=on) the
//! measured saving reaches the target and never passes it.
//!
//! Without QEMU, busybox-static or a kernel image the test passes with a
//! "skipped" line unless `PAGESIFT_REQUIRE_GUESTS=1`.

use pagesift_bench::BenchError;
use pagesift_bench::experiment::GuestFilesPlan;
use pagesift_bench::guest_files::{self, FileCopies, GuestRead};
use pagesift_linux::ksm::{KsmGuard, Run};
use std::time::{Duration, Instant};

const MIB_PER_PAGE: f64 = 4096.0 / (1024.0 * 1024.0);

#[test]
fn file_data_in_guest_ram_is_located_and_its_merging_measured() {
    pagesift_testkit::require_root();
    let _serial = pagesift_testkit::serial();
    let dir = tempfile::tempdir().unwrap();
    let plan = GuestFilesPlan {
        guests: 2,
        mem_mib: 256,
        files: 3,
        file_mib: 2,
    };
    let image = match guest_files::build_image(&dir.path().join("image"), dir.path(), &plan) {
        Ok(i) => i,
        Err(BenchError::Missing(e)) => {
            if std::env::var("PAGESIFT_REQUIRE_GUESTS").is_ok_and(|v| v == "1") {
                panic!("PAGESIFT_REQUIRE_GUESTS=1 but {e}");
            }
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("building the guest-files image: {e}"),
    };
    // Own KSM with ksmd stopped before the guests boot: every merge
    // measured below happens under this test.
    let guard = KsmGuard::acquire().expect("KSM lock");
    // The guests exit with their pages merged: run=2 before the restore
    // takes their stable-tree nodes out of pages_shared.
    guard.set_unmerge_on_restore(true);
    guard.set_run(Run::Stop).unwrap();
    let mut guests = guest_files::boot(
        &image.image,
        &plan,
        "test",
        true,
        Duration::from_secs(300),
        &|| false,
    )
    .unwrap();
    let mut copies = FileCopies::new("ksm", &image.files, &mut guests).unwrap();
    let file_pages = copies.file_pages() as u64;
    assert_eq!(file_pages, plan.file_pages());
    let t0 = Instant::now();
    copies.sample(0.0).unwrap();
    guest_files::start_reading(&mut guests, plan.files).unwrap();
    let reads = loop {
        copies.sample(t0.elapsed().as_secs_f64()).unwrap();
        if let Some(r) = guest_files::reads_done(&guests, &image.md5).unwrap() {
            break r;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(180),
            "the guests did not read their files in 180 s"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    // Each guest read every file (md5 as the host's: reads_done checks)
    // in an order of its own.
    let order = |r: &GuestRead| r.sums.iter().map(|(i, _)| *i).collect::<Vec<_>>();
    assert_ne!(order(&reads[0]), order(&reads[1]));

    // Every file page is found in every guest's RAM.
    let per_guest = copies.locate().unwrap();
    eprintln!("copies per guest: {per_guest:?} of {file_pages} file pages");
    for (k, n) in per_guest.iter().enumerate() {
        assert!(*n >= file_pages, "guest {k}: {n} copies of {file_pages}");
    }
    let target = copies.target_pages().unwrap();
    assert!(target >= file_pages, "target {target}");
    // ksmd has not run: nothing saved, before or after the reads.
    copies.sample(t0.elapsed().as_secs_f64()).unwrap();
    let before: Vec<f64> = copies.series().points.iter().map(|p| p.1).collect();
    assert!(
        before.len() >= 3 && before.iter().all(|&v| v == 0.0),
        "{before:?}"
    );

    // KSM merges the guests' RAM (QEMU marked it mergeable).
    guard.set_pages_to_scan(4000).unwrap();
    guard.set_sleep_millisecs(20).unwrap();
    guard.set_run(Run::Run).unwrap();
    let target_mib = target as f64 * MIB_PER_PAGE;
    let merged_at = Instant::now();
    let mut saved = 0.0;
    while merged_at.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(500));
        copies.sample(t0.elapsed().as_secs_f64()).unwrap();
        saved = copies.series().points.last().unwrap().1;
        assert!(
            saved <= target_mib + 1e-9,
            "{saved} MiB saved of {target_mib}"
        );
        if saved >= 0.99 * target_mib {
            break;
        }
    }
    eprintln!(
        "KSM: {saved:.2} of {target_mib:.2} MiB of file data saved after {:.1} s",
        merged_at.elapsed().as_secs_f64()
    );
    drop(guests);
    let report = guard.release();
    assert!(report.is_complete(), "KSM not restored: {report}");
    let left = pagesift_linux::ksm::Ksm::open()
        .unwrap()
        .counters()
        .unwrap();
    assert_eq!(left.pages_shared, Some(0), "KSM pages left counted");
    assert!(
        saved >= 0.99 * target_mib,
        "only {saved:.2} of {target_mib:.2} MiB of file data merged"
    );
}
