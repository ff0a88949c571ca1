//! I/O hints end to end: real `pagesift-workload read-files` processes read
//! the same file (each its own copy, in its own order) into fresh
//! page-aligned buffers while `pagesift run` watches them; the BPF hint
//! program reports the buffers, the daemon marks the hinted duplicate runs
//! and ksmd merges them. And when hints cannot be had (no kernel BTF at
//! the configured path), the daemon says what is missing and merges
//! without them. Root, real KSM, one at a time (see `daemon.rs`).

mod support;

use pagesift_testkit::{Workload, require_root, serial, temp_dir};
use std::path::Path;
use std::time::{Duration, Instant};
use support::*;

const FILE_MIB: usize = 8;

/// Writes `n` copies of one file of varied pages (distinct within it).
fn file_copies(dir: &Path, n: usize) -> Vec<String> {
    let data: Vec<u8> = (0..FILE_MIB << 20)
        .map(|i| ((i / 4096) as u8) ^ (i as u8).wrapping_mul(31) ^ ((i >> 13) as u8))
        .collect();
    (0..n)
        .map(|k| {
            let p = dir.join(format!("copy-{k}.dat"));
            std::fs::write(&p, &data).unwrap();
            p.display().to_string()
        })
        .collect()
}

/// KSM pages (smaps `KSM:`) of `pid` within `[start, start + pages)`.
fn ksm_pages(pid: u32, start: u64, pages: u64) -> u64 {
    vmas_overlapping(pid, start, pages * 4096)
        .iter()
        .map(|v| v.ksm_kb / 4)
        .sum()
}

#[test]
fn hinted_file_reads_are_merged_and_the_readers_see_nothing() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("hints");
    let dir = tmp.path();
    let files = file_copies(dir, 3);
    let mut readers: Vec<Workload> = files
        .iter()
        .enumerate()
        .map(|(k, f)| {
            Workload::start(&[
                "--die-with-parent",
                "read-files",
                "--files",
                f,
                "--syscall",
                ["read", "pread64", "preadv"][k],
                "--order-seed",
                &k.to_string(),
                "--private-mib",
                "16",
                "--seed",
                &(k + 1).to_string(),
            ])
        })
        .collect();
    let pids: Vec<String> = readers.iter().map(|w| w.pid().to_string()).collect();
    let mut args = vec!["--governor", "full"];
    for p in &pids {
        args.extend(["--pid", p]);
    }
    let mut d = start_daemon(dir, &args, true);
    d.wait_for(Duration::from_secs(60), "hints on", |s| {
        s["hints"]["state"] == "on" && s["totals"]["processes"].as_u64() == Some(3)
    });
    // The buffers receive their first content now, from the files.
    let mut sums = Vec::new();
    let mut bufs = Vec::new();
    for w in &mut readers {
        let r = w.ask("read");
        assert!(r["read"].is_array(), "{r}");
        sums.push(r["checksum"].as_str().unwrap().to_string());
        let (start, pages) = w.region();
        bufs.push((w.pid(), start, pages));
    }
    let t0 = Instant::now();
    let file_pages = (FILE_MIB << 20) as u64 / 4096;
    // Of three copies, two are saved; KSM maps all three to its page.
    let want = 3 * file_pages * 9 / 10;
    let mut merged = 0;
    while t0.elapsed() < Duration::from_secs(120) {
        merged = bufs
            .iter()
            .map(|&(p, s, n)| ksm_pages(p, s, n))
            .sum::<u64>();
        if merged >= want {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // The status is published about once a second: wait for one that
    // counts the hints (a snapshot from before the reads shows none).
    let counted = 3 * file_pages;
    let st = d.wait_for(Duration::from_secs(10), "hints counted", |s| {
        s["hints"]["received"].as_u64().unwrap_or(0) >= counted
    });
    eprintln!(
        "{merged} of {} buffer pages merged {:.1} s after the reads; hints {}",
        3 * file_pages,
        t0.elapsed().as_secs_f64(),
        st["hints"]
    );
    assert!(
        merged >= want,
        "{merged} < {want} buffer pages merged; hints {}\n{}",
        st["hints"],
        d.log()
    );
    let h = &st["hints"];
    assert!(h["received"].as_u64().unwrap() >= 3 * file_pages, "{h}");
    assert!(h["pushed"].as_u64().unwrap() > 0, "{h}");
    assert!(h["duplicates"].as_u64().unwrap() > 0, "{h}");
    assert!(h["pages_marked"].as_u64().unwrap() > 0, "{h}");
    assert_eq!(h["dropped_ring"].as_u64(), Some(0), "{h}");
    // A hook that every process on the host pays for is announced as a
    // warning; fexit, which only the hinted syscalls pay for, is not.
    let host_wide = h["hook"] == "tp_btf/sys_exit";
    assert_eq!(
        d.log()
            .contains("every syscall of every process on this host"),
        host_wide,
        "hook {}:\n{}",
        h["hook"],
        d.log()
    );
    let m = d.scrape();
    assert!(metric(&m, "pagesift_hints_pushed_total") > 0.0, "{m}");
    assert_eq!(metric(&m, "pagesift_hints_on"), 1.0);
    // The readers' memory is what they read.
    for (w, sum) in readers.iter_mut().zip(&sums) {
        assert_eq!(&w.checksum(), sum);
    }
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    for (w, sum) in readers.iter_mut().zip(&sums) {
        assert_eq!(&w.checksum(), sum);
    }
    drop(d);
}

#[test]
fn without_kernel_btf_the_daemon_says_so_and_merges_without_hints() {
    require_root();
    let _serial = serial();
    let tmp = temp_dir("hints-nobtf");
    let dir = tmp.path();
    let config = dir.join("pagesift.toml");
    std::fs::write(&config, "[hints]\nbtf = \"/nonexistent/vmlinux\"\n").unwrap();
    let mut dup = Workload::start(&["static-dup", "--mib", "64"]);
    let sum = dup.checksum();
    let (_, pages) = dup.region();
    let pid = dup.pid().to_string();
    let mut d = start_daemon(
        dir,
        &[
            "--config",
            config.to_str().unwrap(),
            "--pid",
            &pid,
            "--governor",
            "full",
        ],
        false,
    );
    let st = d.wait_for(Duration::from_secs(90), "99 % merged", |s| {
        s["totals"]["merged_pages"].as_u64().unwrap_or(0) >= pages * 99 / 100
    });
    assert_eq!(st["hints"]["state"], "unavailable", "{}", st["hints"]);
    let reason = st["hints"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("BTF") && reason.contains("/nonexistent/vmlinux"),
        "{reason}"
    );
    assert!(d.log().contains("I/O hints unavailable"), "{}", d.log());
    assert_eq!(dup.checksum(), sum);
    let st = d.stop();
    assert!(st.success(), "exit {st}:\n{}", d.log());
    drop(d);
}
