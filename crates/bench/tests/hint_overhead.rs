//! Live (root, BPF): the I/O hint program's overhead on real programs.
//! `files::program_overhead` runs `cat` and `sha256sum` over real cached
//! files without the program, with it attached but not watching, and with
//! it watching them. The watched runs must have been hinted (the program
//! saw the real programs' reads), nothing lost to a full ring, and every
//! median must be a measured time.

use pagesift_bench::files::{PROGRAMS, data_files, program_overhead};

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
