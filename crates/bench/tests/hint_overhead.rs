//! Live (root, BPF): the I/O hint program's overhead on real programs.
//! `files::program_overhead` runs `cat` and `sha256sum` over real cached
//! files without the program, with it attached but not watching, and with
//! it watching them. The watched runs must have been hinted (the program
//! saw the real programs' reads), nothing lost to a full ring, and every
//! median must be a measured time. `files::hint_overhead` times the
//! pread64 loop per call size, and a sub-page call must bring no hint.

use pagesift_bench::files::{PROGRAMS, data_files, hint_overhead, program_overhead};

#[test]
fn real_programs_are_timed_and_their_reads_are_hinted() {
    pagesift_testkit::require_root();
    let dir = tempfile::tempdir().unwrap();
    let files = data_files(dir.path(), 2, 4).unwrap();
    let costs = program_overhead(&files, None).expect("the hint program loads here");
    assert_eq!(
        costs.len(),
        PROGRAMS.len(),
        "coreutils' cat and sha256sum are in PATH: {costs:?}"
    );
    for c in &costs {
        assert!(!c.hook.is_empty(), "{c:?}");
        assert!(
            c.without_ms > 0.0 && c.idle_ms > 0.0 && c.watching_ms > 0.0,
            "{c:?}"
        );
        // 8 MiB read several times a run, 7 watched runs: whole pages in
        // every read of a few KiB or more.
        assert!(c.events > 0, "no hint from {}: {c:?}", c.program);
        assert_eq!(c.ring_full, 0, "{c:?}");
        assert!((c.file_mib - 8.0).abs() < 1e-9, "{c:?}");
        eprintln!("{}", c.line());
    }
}

/// `files::hint_overhead` times the pread64 loop at each call size asked
/// for. A watched reader's whole-page calls are hinted; its sub-page calls
/// can carry no whole page, so the program (which drops them before
/// anything else) writes no event for them.
#[test]
fn the_pread_loop_is_timed_per_call_size_and_sub_page_calls_bring_no_hint() {
    pagesift_testkit::require_root();
    let dir = tempfile::tempdir().unwrap();
    let files = data_files(dir.path(), 1, 2).unwrap();
    let workload = pagesift_testkit::workload_bin();
    let costs = hint_overhead((&workload, &[]), &files, None, &[512, 4096])
        .expect("the hint program loads here");
    let sizes: Vec<u64> = costs.iter().map(|c| c.chunk_bytes).collect();
    assert_eq!(sizes, [512, 4096], "{costs:?}");
    for c in &costs {
        assert!(
            c.without_ms > 0.0 && c.idle_ms > 0.0 && c.watching_ms > 0.0,
            "{c:?}"
        );
        assert_eq!(c.calls, c.passes * (2 << 20) / c.chunk_bytes, "{c:?}");
        assert_eq!(c.ring_full, 0, "{c:?}");
        eprintln!("{}", c.line());
    }
    assert_eq!(
        costs[0].events, 0,
        "a 512 B read was hinted: {:?}",
        costs[0]
    );
    assert!(
        costs[1].events > 0,
        "no 4 KiB read was hinted: {:?}",
        costs[1]
    );
}
