//! Live test of the I/O hint source: real `pagesift-workload read-files`
//! processes read real files into page-aligned buffers with read, pread64,
//! readv and preadv; the BPF program must report exactly the whole pages
//! each call filled, for the watched processes only. Needs root (CAP_BPF,
//! CAP_PERFMON) and kernel BTF, as the daemon does.

use pagesift_linux::Capability;
use pagesift_linux::caps;
use pagesift_linux::iohint::{HintSource, HintSourceConfig, Hook, IoHint, Syscall, Unavailable};
use pagesift_testkit::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

const PAGE: u64 = 4096;
const CHUNK_KIB: u64 = 64;

/// Writes a file of `len` bytes of varied content.
fn make_file(dir: &Path, name: &str, len: usize) -> PathBuf {
    let p = dir.join(name);
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    std::fs::write(&p, data).unwrap();
    p
}

/// The whole pages `[start, start + len)` covers.
fn whole(start: u64, len: u64, out: &mut BTreeMap<u64, u32>) {
    let a = start.div_ceil(PAGE) * PAGE;
    let b = (start + len) / PAGE * PAGE;
    let mut p = a;
    while p < b {
        *out.entry(p).or_default() += 1;
        p += PAGE;
    }
}

/// The pages one file's reads must hint: the workload reads `bytes` at
/// `addr` in chunks of CHUNK_KIB, each chunk split into four iovecs of
/// ceil(n/4) bytes for the vector calls (crates/workload/src/files.rs).
fn expected(addr: u64, bytes: u64, vector: bool, out: &mut BTreeMap<u64, u32>) {
    let chunk = CHUNK_KIB * 1024;
    let mut done = 0;
    while done < bytes {
        let n = (bytes - done).min(chunk);
        if vector {
            let q = n.div_ceil(4);
            let mut o = 0;
            while o < n {
                whole(addr + done + o, q.min(n - o), out);
                o += q;
            }
        } else {
            whole(addr + done, n, out);
        }
        done += n;
    }
}

fn hinted_pages(hints: &[IoHint], tgid: u32) -> BTreeMap<u64, u32> {
    let mut out = BTreeMap::new();
    for h in hints.iter().filter(|h| h.tgid == tgid) {
        for k in 0..h.pages {
            *out.entry(h.start + k * PAGE).or_default() += 1;
        }
    }
    out
}

#[test]
fn hints_are_exactly_the_whole_pages_each_read_filled() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    // Odd sizes: the last chunk of each file leaves a partial page.
    let big = make_file(dir.path(), "big", (1 << 20) + 100);
    let small = make_file(dir.path(), "small", 3 * 4096 + 5);
    let files = format!("{},{}", big.display(), small.display());
    let chunk = CHUNK_KIB.to_string();
    let start = |call: &str| {
        Workload::start(&[
            "--die-with-parent",
            "read-files",
            "--files",
            &files,
            "--syscall",
            call,
            "--chunk-kib",
            &chunk,
            "--order-seed",
            "3",
        ])
    };
    let mut source = HintSource::open(&HintSourceConfig::default()).expect("hint source");
    let calls = ["read", "pread64", "readv", "preadv"];
    let mut watched: Vec<Workload> = calls.iter().map(|c| start(c)).collect();
    let mut stranger = start("read");
    source.watch(watched.iter().map(|w| w.pid()));
    assert_eq!(source.watched().len(), calls.len());

    let mut hints = Vec::new();
    let mut want = Vec::new();
    for (w, call) in watched.iter_mut().zip(calls) {
        let reply = w.ask("read");
        let placed = reply["read"].as_array().expect("placed files").clone();
        assert_eq!(placed.len(), 2, "{reply}");
        let mut pages = BTreeMap::new();
        for f in &placed {
            let (addr, bytes) = (f["addr"].as_u64().unwrap(), f["bytes"].as_u64().unwrap());
            assert_eq!(addr % PAGE, 0);
            expected(addr, bytes, call.ends_with('v'), &mut pages);
        }
        want.push((w.pid(), call, pages));
    }
    let stranger_reply = stranger.ask("read");
    assert!(stranger_reply["read"].is_array(), "{stranger_reply}");
    source.drain(|h| hints.push(h));

    for (pid, call, pages) in &want {
        let got = hinted_pages(&hints, *pid);
        assert!(!pages.is_empty());
        assert_eq!(
            got, *pages,
            "{call}: hinted pages differ from the whole pages read"
        );
        let kinds: Vec<Syscall> = hints
            .iter()
            .filter(|h| h.tgid == *pid)
            .map(|h| h.syscall)
            .collect();
        assert!(
            kinds.iter().all(|k| k.name() == *call),
            "{call}: hinted as {kinds:?}"
        );
    }
    assert!(
        hinted_pages(&hints, stranger.pid()).is_empty(),
        "a process outside the tgid map produced hints"
    );
    let c = source.counters();
    assert_eq!(c.ring_full, 0, "{c:?}");
    assert!(c.events as usize >= hints.len() / 4, "{c:?}");

    // Unwatching stops the hints: the next read of a watched process is
    // silent.
    source.watch([]);
    let mut again = start("pread64");
    let before = hints.len();
    again.ask("read");
    source.drain(|h| hints.push(h));
    assert_eq!(hinted_pages(&hints[before..], again.pid()).len(), 0);
}

#[test]
fn the_syscall_mask_limits_what_is_hinted() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let f = make_file(dir.path(), "f", 256 * 1024);
    let files = f.display().to_string();
    let config = HintSourceConfig {
        syscalls: vec![Syscall::Preadv],
        ..HintSourceConfig::default()
    };
    let mut source = HintSource::open(&config).expect("hint source");
    let mut r = Workload::start(&["--die-with-parent", "read-files", "--files", &files]);
    let mut v = Workload::start(&[
        "--die-with-parent",
        "read-files",
        "--files",
        &files,
        "--syscall",
        "preadv",
    ]);
    source.watch([r.pid(), v.pid()]);
    r.ask("read");
    v.ask("read");
    let mut hints = Vec::new();
    source.drain(|h| hints.push(h));
    assert!(hinted_pages(&hints, r.pid()).is_empty(), "read was masked");
    assert_eq!(hinted_pages(&hints, v.pid()).len(), 64);
}

/// Both hooks give the same hints where the kernel allows them, and
/// `auto` takes fexit exactly when the kernel allows it. (This project's CI
/// machine refuses tracing trampolines, so there `auto` must fall back to
/// `tp_btf/sys_exit` and forcing fexit must say why it failed.)
#[test]
fn auto_takes_fexit_where_allowed_and_both_hooks_hint_the_same_pages() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let f = make_file(dir.path(), "f", 256 * 1024);
    let files = f.display().to_string();
    let with = |hook| {
        HintSource::open(&HintSourceConfig {
            syscalls: vec![Syscall::Pread64],
            hook,
            ..HintSourceConfig::default()
        })
    };
    let fexit = with(Some(Hook::Fexit));
    let auto = with(None).expect("auto hook");
    match &fexit {
        Ok(_) => assert_eq!(auto.hook(), Hook::Fexit),
        Err(e) => {
            assert_eq!(auto.hook(), Hook::SysExit);
            assert!(e.to_string().contains("fexit/__x64_sys_pread64"), "{e}");
        }
    }
    drop(auto);
    let mut sources = vec![with(Some(Hook::SysExit)).expect("tp_btf/sys_exit")];
    sources.extend(fexit);
    for mut source in sources {
        let mut w = Workload::start(&[
            "--die-with-parent",
            "read-files",
            "--files",
            &files,
            "--syscall",
            "pread64",
        ]);
        source.watch([w.pid()]);
        w.ask("read");
        let mut hints = Vec::new();
        source.drain(|h| hints.push(h));
        assert_eq!(
            hinted_pages(&hints, w.pid()).len(),
            64,
            "{:?}: 64 whole pages read",
            source.hook()
        );
    }
}

#[test]
fn without_cap_bpf_the_error_names_the_capability() {
    require_root();
    // Capabilities are per thread: drop them in one, load from there.
    let err = std::thread::spawn(|| {
        caps::drop_from_this_thread(&[Capability::SysAdmin, Capability::Bpf]).unwrap();
        HintSource::open(&HintSourceConfig::default()).err()
    })
    .join()
    .unwrap()
    .expect("loading without CAP_BPF must fail");
    assert!(
        matches!(err, Unavailable::MissingCapability(Capability::Bpf)),
        "{err}"
    );
    assert!(err.to_string().contains("CAP_BPF"), "{err}");
}

#[test]
fn without_btf_the_error_names_it() {
    require_root();
    let config = HintSourceConfig {
        btf: PathBuf::from("/nonexistent/btf/vmlinux"),
        ..HintSourceConfig::default()
    };
    let err = HintSource::open(&config).err().expect("no BTF must fail");
    assert!(matches!(err, Unavailable::NoBtf { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("/nonexistent/btf/vmlinux") && msg.contains("BTF"),
        "{msg}"
    );
}

/// Only I/O of file data is hinted: a read of a sysfs file (the kernel's
/// BTF, made up at each read) gives no hint and is counted, while the same
/// reads of a regular file on disk and of one on tmpfs are hinted page for
/// page.
#[test]
fn reads_of_kernel_made_files_are_not_hinted_and_are_counted() {
    require_root();
    let sysfs = Path::new("/sys/kernel/btf/vmlinux");
    let len = std::fs::metadata(sysfs).expect("kernel BTF").len();
    assert!(len >= 64 * PAGE, "{len}");
    let disk = tempfile::tempdir().unwrap();
    let shm = tempfile::tempdir_in("/dev/shm").unwrap();
    let on_disk = make_file(disk.path(), "f", 256 * 1024);
    let on_tmpfs = make_file(shm.path(), "f", 256 * 1024);
    let mut source = HintSource::open(&HintSourceConfig::default()).expect("hint source");
    let start = |file: &Path| {
        Workload::start(&[
            "--die-with-parent",
            "read-files",
            "--files",
            &file.display().to_string(),
            "--syscall",
            "read",
            "--chunk-kib",
            &CHUNK_KIB.to_string(),
        ])
    };
    let mut readers: Vec<Workload> = [sysfs, &on_disk, &on_tmpfs]
        .iter()
        .map(|f| start(f))
        .collect();
    source.watch(readers.iter().map(|w| w.pid()));
    let before = source.counters();
    let mut placed = Vec::new();
    for w in &mut readers {
        let reply = w.ask("read");
        let f = &reply["read"][0];
        placed.push((f["addr"].as_u64().unwrap(), f["bytes"].as_u64().unwrap()));
    }
    let mut hints = Vec::new();
    source.drain(|h| hints.push(h));
    let after = source.counters();
    assert_eq!(placed[0].1, len, "the sysfs file was not read whole");
    assert!(
        hinted_pages(&hints, readers[0].pid()).is_empty(),
        "a read of a sysfs file was hinted"
    );
    // The reader asks for CHUNK_KIB a call into a page-aligned buffer, so
    // every call that moved data moved whole pages: at least this many
    // calls were left out (sysfs returns at most a page a call, so there
    // were more).
    let calls = len / (CHUNK_KIB * 1024);
    assert!(
        after.not_file_data - before.not_file_data >= calls,
        "{before:?} -> {after:?}, {calls} calls"
    );
    for (w, &(addr, bytes)) in readers.iter().zip(&placed).skip(1) {
        let mut want = BTreeMap::new();
        expected(addr, bytes, false, &mut want);
        assert_eq!(want.len(), 64);
        assert_eq!(hinted_pages(&hints, w.pid()), want, "pid {}", w.pid());
    }
}

/// Unmounts its path when dropped, also when the test fails.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).status();
    }
}

/// Containers read their files through overlayfs: those reads are file data
/// and must be hinted like reads of the ext4 file underneath (the program
/// tells file data by the filesystem's magic, and overlayfs is not one of
/// the kernel-made ones it leaves out).
#[test]
fn reads_through_overlayfs_are_hinted() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let [lower, upper, work, merged] = ["lower", "upper", "work", "merged"].map(|d| {
        let p = dir.path().join(d);
        std::fs::create_dir(&p).unwrap();
        p
    });
    make_file(&lower, "f", 256 * 1024);
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let ok = std::process::Command::new("mount")
        .args(["-t", "overlay", "overlay", "-o", &options])
        .arg(&merged)
        .status()
        .expect("mount");
    assert!(ok.success(), "mounting overlayfs failed");
    let _mounted = Mounted(merged.clone());
    let file = merged.join("f");
    assert_eq!(
        rustix::fs::statfs(&file).unwrap().f_type as u64,
        0x794c_7630,
        "the file is on overlayfs"
    );
    let mut source = HintSource::open(&HintSourceConfig::default()).expect("hint source");
    let mut w = Workload::start(&[
        "--die-with-parent",
        "read-files",
        "--files",
        &file.display().to_string(),
        "--syscall",
        "pread64",
        "--chunk-kib",
        &CHUNK_KIB.to_string(),
    ]);
    source.watch([w.pid()]);
    let before = source.counters();
    let reply = w.ask("read");
    let f = &reply["read"][0];
    let (addr, bytes) = (f["addr"].as_u64().unwrap(), f["bytes"].as_u64().unwrap());
    let mut hints = Vec::new();
    source.drain(|h| hints.push(h));
    let after = source.counters();
    let mut want = BTreeMap::new();
    expected(addr, bytes, false, &mut want);
    assert_eq!(want.len(), 64);
    assert_eq!(hinted_pages(&hints, w.pid()), want);
    assert_eq!(
        after.not_file_data, before.not_file_data,
        "{before:?} -> {after:?}"
    );
    w.kill();
}

/// `cat` streams a file through one page-aligned buffer: every read fills
/// the same pages. The first read of each CPU the process runs on is
/// hinted; the repeats are counted, not hinted (the pages hold the file
/// only until the next read, and the first hint names them already). A
/// reader of fresh buffers is hinted call by call whatever came before it
/// (`hints_are_exactly_the_whole_pages_each_read_filled`).
#[test]
fn a_buffer_reused_call_after_call_is_hinted_once_per_cpu() {
    require_root();
    let dir = tempfile::tempdir().unwrap();
    let file = make_file(dir.path(), "streamed", 16 << 20);
    // Warm the page cache, so that cat's reads are whole.
    std::fs::read(&file).unwrap();
    let mut source = HintSource::open(&HintSourceConfig::default()).expect("hint source");
    // The shell waits for a line, then becomes cat (exec keeps its pid),
    // so the pid is watched before the first read.
    let mut sh = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!(
            "read go; exec cat '{}' > /dev/null",
            file.display()
        ))
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("sh");
    let pid = sh.id();
    source.watch([pid]);
    let before = source.counters();
    {
        use std::io::Write;
        let mut stdin = sh.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }
    let status = sh.wait().unwrap();
    assert!(status.success(), "{status}");
    let mut hints = Vec::new();
    source.drain(|h| hints.push(h));
    let after = source.counters();
    let mine: Vec<&IoHint> = hints.iter().filter(|h| h.tgid == pid).collect();
    assert!(!mine.is_empty(), "cat's reads gave no hint");
    let ranges: std::collections::BTreeSet<(u64, u64)> =
        mine.iter().map(|h| (h.start, h.pages)).collect();
    assert_eq!(ranges.len(), 1, "cat read into one buffer: {ranges:?}");
    let (_, pages) = *ranges.iter().next().unwrap();
    let reads = (16u64 << 20) / (pages * PAGE);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert!(
        mine.len() as u64 <= cpus + 2,
        "{} hints for {reads} reads of one buffer on {cpus} CPUs",
        mine.len()
    );
    let repeated = after.repeated - before.repeated;
    assert!(
        repeated + mine.len() as u64 >= reads,
        "{repeated} repeats and {} hints for {reads} reads",
        mine.len()
    );
}
