//! `pagesift run` on real interpreter processes whose memory changes while
//! it works: the system's `python3`, not a workload we wrote in Rust.
//!
//! Each worker maps one private anonymous region (one VMA) and fills it
//! with a block read from a shared data file followed by a hot buffer it
//! rewrites every millisecond. The hot buffer holds duplicate content (the
//! same bytes in every worker, rewritten unchanged, as in UKSM §8.1.2), so
//! merging it would make it thrash: every write would be a COW fault. The
//! daemon must merge the file block and leave the hot buffer alone, which
//! it can only do by judging writes by where they land
//! (`core::pipeline::write_watch`).
//!
//! Root is needed. Without `/usr/bin/python3` (`scripts/setup` installs it)
//! the test passes with a "skipped" line, unless `PAGESIFT_REQUIRE_GUESTS=1`
//! (as `.ci/run` sets), when it fails.

mod support;

use pagesift_linux::inspect::{PageClass, PageInfo, PageInspector};
use pagesift_testkit::{Daemon, Reaped, require_root, serial, temp_dir};
use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};
use support::*;

const PYTHON: &str = "/usr/bin/python3";
const PAGE: u64 = 4096;
const DATA_MIB: u64 = 16;
const HOT_MIB: u64 = 4;

/// The worker: one private anonymous mapping, the data file's bytes, then
/// the hot buffer (a 64-byte pattern repeated: the same in every worker)
/// rewritten with the same bytes at a random place every millisecond.
/// "check" on stdin answers with the SHA-256 of the whole mapping.
const WORKER: &str = r#"
import hashlib, mmap, os, random, select, sys, time
data = open(sys.argv[1], 'rb').read()
hot = int(sys.argv[2]) << 20
m = mmap.mmap(-1, len(data) + hot, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m[:len(data)] = data
pattern = bytes(range(64))
m[len(data):] = pattern * (hot // 64)
import ctypes
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
print('ready', addr, len(data), hot, hashlib.sha256(m).hexdigest(), flush=True)
r = random.Random(os.getpid())
while True:
    if select.select([sys.stdin], [], [], 0.001)[0]:
        line = sys.stdin.readline()
        if not line:
            break
        print('sum', hashlib.sha256(m).hexdigest(), flush=True)
        continue
    i = len(data) + r.randrange(0, hot // 64) * 64
    m[i:i + 64] = pattern
"#;

/// A worker whose mapping holds the data file's bytes, then a block of
/// its own random bytes (no twin anywhere), never written after. Same
/// protocol as [`WORKER`].
const UNIQUE_WORKER: &str = r#"
import hashlib, mmap, os, select, sys
data = open(sys.argv[1], 'rb').read()
own = int(sys.argv[2]) << 20
m = mmap.mmap(-1, len(data) + own, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
m[:len(data)] = data
m[len(data):] = os.urandom(own)
import ctypes
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
print('ready', addr, len(data), own, hashlib.sha256(m).hexdigest(), flush=True)
while True:
    line = sys.stdin.readline()
    if not line:
        break
    print('sum', hashlib.sha256(m).hexdigest(), flush=True)
"#;

/// A running worker; killed and reaped on drop (its `Reaped`).
struct Worker {
    child: Reaped,
    stdin: ChildStdin,
    out: BufReader<ChildStdout>,
    addr: u64,
    data: u64,
    hot: u64,
    sum: String,
}

impl Worker {
    fn start(script: &Path, data: &Path) -> Worker {
        let mut child = Command::new(PYTHON)
            .arg(script)
            .arg(data)
            .arg(HOT_MIB.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start python3");
        let stdin = child.stdin.take().unwrap();
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f.first(), Some(&"ready"), "worker said {line:?}");
        Worker {
            child: Reaped(child),
            stdin,
            out,
            addr: f[1].parse().unwrap(),
            data: f[2].parse().unwrap(),
            hot: f[3].parse().unwrap(),
            sum: f[4].to_string(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The SHA-256 of its mapping now, computed by the worker itself.
    fn checksum(&mut self) -> String {
        self.stdin.write_all(b"check\n").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.strip_prefix("sum ")
            .unwrap_or_else(|| panic!("worker said {line:?}"))
            .trim()
            .to_string()
    }

    /// KSM pages in `[start, start + len)` of the worker.
    fn ksm_pages(&self, start: u64, len: u64) -> u64 {
        let mut insp = PageInspector::open(self.pid()).unwrap();
        let mut infos = vec![PageInfo::default(); (len / PAGE) as usize];
        insp.inspect(start, &mut infos).unwrap();
        infos
            .iter()
            .filter(|i| i.class() == PageClass::Merged)
            .count() as u64
    }
}

/// Without python3: a pass with a "skipped" line, or a failure when
/// `PAGESIFT_REQUIRE_GUESTS=1`. Whether to go on.
fn have_python() -> bool {
    if Path::new(PYTHON).exists() {
        return true;
    }
    // .ci/run installs it first and sets PAGESIFT_REQUIRE_GUESTS=1.
    if std::env::var("PAGESIFT_REQUIRE_GUESTS").is_ok_and(|v| v == "1") {
        panic!("PAGESIFT_REQUIRE_GUESTS=1 but {PYTHON} is missing");
    }
    eprintln!("skipped: {PYTHON} is missing (run scripts/setup)");
    false
}

/// `DATA_MIB` of distinct pages (nothing to merge within one worker).
fn data_file(dir: &Path) -> std::path::PathBuf {
    let data = dir.join("data.bin");
    let mut bytes = vec![0u8; (DATA_MIB << 20) as usize];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for chunk in bytes.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
    std::fs::write(&data, &bytes).unwrap();
    data
}

/// `pagesift run --governor full`, `extra` arguments, and a `--pid` per
/// worker.
fn daemon_for(dir: &Path, workers: &[Worker], extra: &[String]) -> Daemon {
    let mut args: Vec<String> = vec!["--governor".into(), "full".into()];
    args.extend(extra.iter().cloned());
    for w in workers {
        args.extend(["--pid".into(), w.pid().to_string()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    start_daemon(dir, &args, false)
}

/// Polls every 250 ms (calling `poll` first) until every worker has 90 %
/// of its file block merged; fails after `limit`.
fn wait_for_file_blocks(d: &Daemon, workers: &[Worker], limit: Duration, mut poll: impl FnMut()) {
    let data_pages = DATA_MIB << 20 >> 12;
    let t0 = Instant::now();
    loop {
        poll();
        let merged: Vec<u64> = workers
            .iter()
            .map(|w| w.ksm_pages(w.addr, w.data))
            .collect();
        if merged.iter().all(|&m| m >= data_pages * 9 / 10) {
            eprintln!(
                "python3 workers: file block merged ({merged:?} of {data_pages} pages) after {:.1} s",
                t0.elapsed().as_secs_f64()
            );
            return;
        }
        assert!(
            t0.elapsed() < limit,
            "after {limit:?} only {merged:?} of {data_pages} pages merged\nstatus: {}\nlog:\n{}",
            d.status().map(|s| s.to_string()).unwrap_or_default(),
            d.log()
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The workers' memory is what they wrote and they run, before and after
/// the daemon stops.
fn stop_and_check(mut d: Daemon, workers: &mut [Worker], sums: &[String]) {
    for (w, sum) in workers.iter_mut().zip(sums) {
        assert_eq!(&w.checksum(), sum, "worker {} memory changed", w.pid());
        assert!(w.child.try_wait().unwrap().is_none(), "worker exited");
    }
    let stopped = d.stop();
    assert!(stopped.success(), "exit {stopped}:\n{}", d.log());
    drop(d);
    for (w, sum) in workers.iter_mut().zip(sums) {
        assert_eq!(&w.checksum(), sum);
    }
}

/// The real-workloads goal: a mixed region (a duplicate block plus a hot
/// buffer) of real python3 processes is merged without a single COW fault
/// on its hot part, and the workers' memory is unchanged.
#[test]
fn python_workers_duplicate_block_is_merged_and_their_hot_buffer_never() {
    require_root();
    if !have_python() {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir("real-python");
    let dir = tmp.path();
    let script = dir.join("worker.py");
    std::fs::write(&script, WORKER).unwrap();
    let data = data_file(dir);

    let mut workers: Vec<Worker> = (0..3).map(|_| Worker::start(&script, &data)).collect();
    let sums: Vec<String> = workers.iter().map(|w| w.sum.clone()).collect();
    assert!(sums.iter().all(|s| *s == sums[0]));
    let d = daemon_for(dir, &workers, &[]);
    let mut hot_ksm_seen = 0;
    wait_for_file_blocks(&d, &workers, Duration::from_secs(30), || {
        for w in &workers {
            hot_ksm_seen += w.ksm_pages(w.addr + w.data, w.hot);
        }
    });
    // A few more seconds of writes: the hot buffers never hold a KSM page,
    // so no write of theirs is a COW fault.
    let until = Instant::now() + Duration::from_secs(5);
    while Instant::now() < until {
        for w in &workers {
            hot_ksm_seen += w.ksm_pages(w.addr + w.data, w.hot);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        hot_ksm_seen,
        0,
        "hot buffer pages were merged:\n{}",
        d.log()
    );
    let st = d.status().expect("status");
    assert!(
        st["totals"]["partial_marks"].as_u64().unwrap_or(0) >= 1,
        "{st}"
    );
    stop_and_check(d, &mut workers, &sums);
}

/// A region the sweep found duplicated in part is marked around its
/// unique zone: python3 workers hold the shared file's bytes and then
/// 4 MiB of their own random bytes in one mapping; the file block is
/// merged, the random block is never made mergeable (ksmd would visit it
/// every full scan for nothing), and the workers' memory is unchanged.
///
/// The ladder's rounds are stretched to a minute, so that the sweep (every
/// second, from a region's first second) is what raises the regions and
/// its map of their unique zones is there when they are marked.
#[test]
fn python_workers_random_block_is_left_out_of_the_marked_region() {
    require_root();
    if !have_python() {
        return;
    }
    let _serial = serial();
    let tmp = temp_dir("real-python-unique");
    let dir = tmp.path();
    let script = dir.join("unique_worker.py");
    std::fs::write(&script, UNIQUE_WORKER).unwrap();
    let data = data_file(dir);
    let config = dir.join("pagesift.toml");
    std::fs::write(
        &config,
        "[scan]\nround_time_ms = 60000\nsweep_every_s = 1\nsweep_min_age_s = 0.0\n",
    )
    .unwrap();

    let mut workers: Vec<Worker> = (0..3).map(|_| Worker::start(&script, &data)).collect();
    let sums: Vec<String> = workers.iter().map(|w| w.sum.clone()).collect();
    let d = daemon_for(
        dir,
        &workers,
        &["--config".into(), config.display().to_string()],
    );
    wait_for_file_blocks(&d, &workers, Duration::from_secs(40), || {});
    for w in &workers {
        let (own_start, own_end) = (w.addr + w.data, w.addr + w.data + w.hot);
        let marked: Vec<(u64, u64)> = vmas(w.pid())
            .into_iter()
            .filter(|v| v.mergeable() && v.start < own_end && v.end > own_start)
            .map(|v| (v.start, v.end))
            .collect();
        assert!(
            marked.is_empty(),
            "worker {}: its random block [{own_start:#x}, {own_end:#x}) overlaps mergeable VMAs {marked:x?}\n{}",
            w.pid(),
            d.log()
        );
        assert_eq!(w.ksm_pages(own_start, w.hot), 0);
    }
    assert!(
        d.log().contains("written or unique in places"),
        "{}",
        d.log()
    );
    stop_and_check(d, &mut workers, &sums);
}
