//! Live tests of host page-cache scrubbing on a real QEMU (TCG) guest that
//! reads a file from its virtio-blk disk (`cache=writeback`): the host's
//! cache of the image shrinks by the pages the guest holds; a page the
//! guest does not hold and a dirty page are never dropped; the guest's data
//! stays byte-identical (md5 inside the guest, from its cache and again
//! from the disk after it dropped its own cache).
//!
//! Without QEMU, busybox-static or a kernel image the test passes with a
//! "skipped" line unless `PAGESIFT_REQUIRE_GUESTS=1`.

use pagesift_bench::guest::image::{PayloadFile, disk_init_with};
use pagesift_bench::guest::{Guest, GuestError, GuestImage, GuestOptions, ImageOptions};
use pagesift_daemon::config::ScrubSection;
use pagesift_daemon::scrub::Scrubber;
use pagesift_linux::page_cache::ImageCache;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

const PAGE: u64 = 4096;
const HELD_MIB: u64 = 32;
const COLD_MIB: u64 = 16;
/// Seconds the guest waits after its ready line before it checks its data
/// again: the scrub and the host-side checks happen in that window. The
/// check drops the guest's cache and reads held.bin from the disk again,
/// which fills the host cache anew, so the window must outlast everything
/// a test measures.
const VERIFY_AFTER_S: u64 = 60;
/// The daemon test's window: it boots two guests and then runs the daemon
/// for several scrubs (in CI, under load, the second guest's boot alone
/// took long enough for the first guest's check to refill the host cache
/// mid-measurement).
const DAEMON_VERIFY_AFTER_S: u64 = 150;

/// Removes the KSM pages the daemon test's guests leave counted: the test
/// calls [`UnmergeWhenDone::unmerge`] at its end and checks the count, and
/// dropping the guard during a panic does the same unchecked. QEMU marks
/// guest RAM mergeable (`mem-merge` on), so ksmd merges
/// both guests while the daemon paces it; the daemon's restore then stops
/// ksmd (run=0, as it found it) and the guests exit merged, which leaves
/// their stable-tree nodes in pages_shared, with no memory behind them,
/// until KSM next runs (777 after one run of this test). The daemon must
/// not unmerge on its own exit (that would unmerge other processes' pages),
/// so the test does it, under KSM's lock, once the daemon and the guests
/// are gone. Declared before the guests, it is dropped after them.
struct UnmergeWhenDone;

impl UnmergeWhenDone {
    /// Unmerges (run=2, then KSM's knobs as they were) and says whether a
    /// KSM page is still counted.
    fn unmerge() -> Option<u64> {
        pagesift_testkit::unmerge_all(None)
    }
}

impl Drop for UnmergeWhenDone {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let _ = UnmergeWhenDone::unmerge();
        }
    }
}

/// The guest reads held.bin (md5), says ready, waits, then checks held.bin
/// from its cache and, after dropping its own cache, from the disk. It
/// never reads cold.bin.
fn init_body(verify_after_s: u64) -> String {
    format!(
        r#"held=$(find /disk -name held.bin)
[ -n "$held" ] || fail "no held.bin on /disk"
sum=$(md5sum < "$held" | cut -d' ' -f1) || fail "reading $held"
echo "pagesift-guest: ready held-md5=$sum"
sleep {verify_after_s}
c=$(md5sum < "$held" | cut -d' ' -f1)
echo 3 > /proc/sys/vm/drop_caches
d=$(md5sum < "$held" | cut -d' ' -f1)
echo "pagesift-guest: verify cached-md5=$c disk-md5=$d"
while :; do sleep 3600; done
"#
    )
}

fn random_file(path: &Path, mib: u64, seed: u64) {
    pagesift_bench::random_file::write(path, mib << 20, seed).unwrap();
}

fn md5(path: &Path) -> String {
    let out = Command::new("md5sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The blocks (= page indices, 4 KiB blocks) of `file` inside ext2 image
/// `image`, from debugfs.
fn blocks(image: &Path, file: &Path) -> BTreeSet<u64> {
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("blocks {}", file.display()))
        .arg(image)
        .output()
        .expect("debugfs (e2fsprogs)");
    let set: BTreeSet<u64> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|b| b.parse().ok())
        .collect();
    assert!(
        !set.is_empty(),
        "debugfs found no blocks of {}",
        file.display()
    );
    set
}

fn serial_line(guest: &Guest, prefix: &str, timeout: Duration) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let log = fs::read_to_string(guest.serial_log()).unwrap_or_default();
        if let Some(l) = log.lines().find(|l| l.starts_with(prefix)) {
            return l.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "no {prefix:?} line in {timeout:?}:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// Builds the image (held.bin + cold.bin, the init above) in `dir`, or
/// says why the test is skipped (`None`).
fn image_or_skip(dir: &Path, verify_after_s: u64) -> Option<GuestImage> {
    pagesift_testkit::require_root();
    let held = dir.join("held.bin");
    let cold = dir.join("cold.bin");
    random_file(&held, HELD_MIB, 0x5eed);
    random_file(&cold, COLD_MIB, 0xc01d);
    let files = [&held, &cold]
        .iter()
        .map(|p| PayloadFile {
            source: p.to_path_buf(),
            bytes: fs::metadata(p).unwrap().len(),
        })
        .collect();
    let opts = ImageOptions {
        files: Some(files),
        init: Some(disk_init_with(&init_body(verify_after_s))),
        ..ImageOptions::default()
    };
    match GuestImage::build_with(dir, &opts) {
        Ok(i) => Some(i),
        Err(e @ GuestError::Missing { .. }) => {
            if std::env::var("PAGESIFT_REQUIRE_GUESTS").is_ok_and(|v| v == "1") {
                panic!("PAGESIFT_REQUIRE_GUESTS=1 but {e}");
            }
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("building the guest image: {e}"),
    }
}

/// Starts guest `name` and waits until it has read held.bin.
fn ready_guest(image: &GuestImage, name: &str, held: &Path) -> Guest {
    let mut guest = start_guest(image, name);
    wait_guest(&mut guest, held);
    guest
}

fn start_guest(image: &GuestImage, name: &str) -> Guest {
    let mut gopts = GuestOptions::new(name, false);
    gopts.mem_mib = 256;
    Guest::start(image, gopts).unwrap()
}

/// Waits until `guest` has read held.bin, and checks what it read.
fn wait_guest(guest: &mut Guest, held: &Path) {
    guest.wait_ready(Duration::from_secs(180)).unwrap();
    let ready = serial_line(guest, "pagesift-guest: ready", Duration::from_secs(1));
    assert_eq!(
        field(&ready, "held-md5"),
        md5(held),
        "the guest read its file right"
    );
}

#[test]
fn scrubbing_drops_what_the_guest_holds_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let Some(image) = image_or_skip(dir.path(), VERIFY_AFTER_S) else {
        return;
    };
    let held = dir.path().join("held.bin");
    let cold = dir.path().join("cold.bin");
    let mut guest = ready_guest(&image, "scrub", &held);
    let want = md5(&held);

    let disk = guest.disk().unwrap().to_path_buf();
    let held_blocks = blocks(&disk, &held);
    let cold_blocks = blocks(&disk, &cold);
    // debugfs lists the indirect blocks too.
    assert!(held_blocks.len() as u64 >= HELD_MIB * 256);
    let cache = ImageCache::open(&disk).unwrap();

    // The guest never read cold.bin: the host reads it into its cache here.
    let host = fs::File::open(&disk).unwrap();
    let mut page = vec![0u8; PAGE as usize];
    for &b in &cold_blocks {
        host.read_exact_at(&mut page, b * PAGE).unwrap();
    }
    // A dirty page whose content the guest holds: one block of held.bin
    // rewritten with the bytes it has (the guest sees no change).
    let dirty_block = *held_blocks.iter().nth(held_blocks.len() / 2).unwrap();
    let rw = fs::OpenOptions::new().write(true).open(&disk).unwrap();
    let mut same = vec![0u8; PAGE as usize];
    host.read_exact_at(&mut same, dirty_block * PAGE).unwrap();
    rw.write_all_at(&same, dirty_block * PAGE).unwrap();
    let st = cache.stat(dirty_block * PAGE, PAGE).unwrap();
    assert_eq!((st.cache, st.dirty), (1, 1), "the rewritten page is dirty");

    let cached_before: BTreeSet<u64> = cache.cached_pages().unwrap().into_iter().collect();
    let held_cached = held_blocks.intersection(&cached_before).count();
    let before = cache.stat(0, 0).unwrap().cache;

    let mut scrubber = Scrubber::new(
        ScrubSection {
            enabled: true,
            ..ScrubSection::default()
        },
        0,
    );
    let passes = scrubber.scrub_guest(guest.pid()).unwrap();
    let (_, pass) = passes
        .iter()
        .find(|(p, _)| fs::canonicalize(p).ok() == fs::canonicalize(&disk).ok())
        .unwrap_or_else(|| panic!("the disk is not among the images found: {passes:?}"));
    let after = cache.stat(0, 0).unwrap().cache;
    let dropped: BTreeSet<u64> = pass
        .dropped_ranges
        .iter()
        .flat_map(|r| r.first_page()..r.first_page() + r.pages())
        .collect();
    eprintln!(
        "image cache {before} -> {after} pages; held.bin {} pages, {held_cached} cached on the host; \
         scrub: cached {} held {} hash-only {} dropped {} busy {}",
        held_blocks.len(),
        pass.cached,
        pass.held,
        pass.hash_only,
        pass.dropped,
        pass.busy
    );

    // Never a page the guest does not hold, never the dirty page.
    assert!(
        cold_blocks.is_disjoint(&dropped),
        "dropped {} pages of cold.bin",
        cold_blocks.intersection(&dropped).count()
    );
    assert!(
        !dropped.contains(&dirty_block),
        "the dirty page was dropped"
    );
    assert_eq!(cache.stat(dirty_block * PAGE, PAGE).unwrap().cache, 1);
    let cold_cached_after = cache.cached_pages().unwrap();
    let cold_still = cold_blocks
        .iter()
        .filter(|b| cold_cached_after.binary_search(b).is_ok())
        .count();
    // DAMON on this host may reclaim a few cold pages itself.
    assert!(
        cold_still * 10 >= cold_blocks.len() * 9,
        "{cold_still} of cold.bin left"
    );
    // The cache shrank by (at least most of) the pages of held.bin the
    // guest holds and the host had cached.
    let held_dropped = held_blocks.intersection(&dropped).count();
    assert!(
        held_dropped * 10 >= (held_cached - 1) * 9,
        "dropped {held_dropped} of {held_cached} cached pages of held.bin"
    );
    assert!(before - after >= held_dropped as u64 * 9 / 10);

    // The guest's data is unchanged, from its cache and from the disk.
    let verify = serial_line(
        &guest,
        "pagesift-guest: verify",
        Duration::from_secs(VERIFY_AFTER_S + 180),
    );
    assert_eq!(field(&verify, "cached-md5"), want);
    assert_eq!(field(&verify, "disk-md5"), want);
    assert!(guest.is_running(), "the guest runs on");
    guest.stop().unwrap();
}

/// `pagesift run` with `[scrub]` on and one of two guests named with
/// `--pid`: the eligible guest's image cache shrinks, the other's is left
/// alone, and status and metrics report the drops.
#[test]
fn the_daemon_scrubs_eligible_guests_only() {
    let dir = tempfile::tempdir().unwrap();
    let Some(image) = image_or_skip(dir.path(), DAEMON_VERIFY_AFTER_S) else {
        return;
    };
    let held = dir.path().join("held.bin");
    let _unmerge = UnmergeWhenDone;
    // Both boot at once, so that their check windows start together.
    let mut eligible = start_guest(&image, "eligible");
    let mut other = start_guest(&image, "other");
    wait_guest(&mut eligible, &held);
    wait_guest(&mut other, &held);
    let eligible_cache = ImageCache::open(eligible.disk().unwrap()).unwrap();
    let other_cache = ImageCache::open(other.disk().unwrap()).unwrap();
    let other_before = other_cache.stat(0, 0).unwrap().cache;
    let before = eligible_cache.stat(0, 0).unwrap().cache;
    // The pages of held.bin the host has cached: what the scrubs are to
    // drop (the guest holds them all).
    let held_blocks = blocks(eligible.disk().unwrap(), &held);
    let held_cached = |cache: &ImageCache| {
        let cached = cache.cached_pages().unwrap();
        held_blocks
            .iter()
            .filter(|b| cached.binary_search(b).is_ok())
            .count() as u64
    };
    let held_before = held_cached(&eligible_cache);
    assert!(
        held_before >= HELD_MIB * 256 / 2,
        "the host cached the guest's reads of held.bin: {held_before} pages"
    );

    let config = dir.path().join("pagesift.toml");
    fs::write(
        &config,
        "[scrub]\nenabled = true\nperiod_min_s = 1.0\nperiod_max_s = 5.0\nperiod_initial_s = 1.0\n",
    )
    .unwrap();
    let socket = dir.path().join("pagesift.sock");
    let pagesift = pagesift_testkit::pagesift_bin();
    let mut daemon = pagesift_testkit::Reaped(
        Command::new(&pagesift)
            .args(["run", "--for", "40", "--ksm-wait", "600"])
            .arg("--pid")
            .arg(eligible.pid().to_string())
            .arg("--config")
            .arg(&config)
            .arg("--socket")
            .arg(&socket)
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    let status = loop {
        assert!(Instant::now() < deadline, "the daemon reported no scrub");
        assert!(
            daemon.try_wait().unwrap().is_none(),
            "the daemon exited early"
        );
        std::thread::sleep(Duration::from_secs(1));
        let out = Command::new(&pagesift)
            .args(["status", "--json", "--socket"])
            .arg(&socket)
            .output()
            .unwrap();
        if !out.status.success() {
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // Judge once the held pages are (nearly) all gone from the host
        // cache, or after a few scrubs: the first scrubs may find the
        // guest's RAM only partly indexed, and the guest's reads may bring
        // a few pages back meanwhile.
        let scrubs = v["scrub"]["scrubs"].as_u64().unwrap_or(0);
        if held_cached(&eligible_cache) * 10 <= held_before || scrubs >= 6 {
            break v;
        }
    };
    let after = eligible_cache.stat(0, 0).unwrap().cache;
    let held_after = held_cached(&eligible_cache);
    // The guest's own check rereads held.bin from the disk: a measurement
    // taken after it would count the reread, not the scrubs.
    assert!(
        !fs::read_to_string(eligible.serial_log())
            .unwrap_or_default()
            .contains("pagesift-guest: verify"),
        "the guest checked its data before the scrubs were judged: raise DAEMON_VERIFY_AFTER_S"
    );
    let dropped = status["scrub"]["dropped_pages"].as_u64().unwrap();
    eprintln!(
        "eligible image cache {before} -> {after} pages, held.bin {held_before} -> {held_after} \
         cached pages, {dropped} dropped; scrub status {}",
        status["scrub"]
    );
    // Not all: a few cached blocks of held.bin (indirect blocks, pages the
    // guest's RAM no longer holds) are not the guest's (measured with the
    // daemon: 8201 -> 11 cached pages).
    assert!(
        held_after * 4 <= held_before,
        "held.bin still cached on the host: {held_before} -> {held_after} pages"
    );
    assert!(dropped * 4 >= held_before * 3, "dropped {dropped}");
    assert!(after + dropped / 2 <= before, "{before} -> {after}");
    let images = status["scrub"]["images"].as_array().unwrap();
    assert!(
        images
            .iter()
            .all(|i| i["pid"].as_u64() == Some(u64::from(eligible.pid()))),
        "only the eligible guest's images: {images:?}"
    );
    // The guest pagesift was not given is not touched (DAMON may take a
    // little on its own).
    let other_after = other_cache.stat(0, 0).unwrap().cache;
    assert!(
        other_after * 10 >= other_before * 9,
        "the other guest's image cache {other_before} -> {other_after}"
    );
    let _ = daemon.wait();
    // Both guests' data is intact.
    for g in [&eligible, &other] {
        let verify = serial_line(
            g,
            "pagesift-guest: verify",
            Duration::from_secs(DAEMON_VERIFY_AFTER_S + 300),
        );
        assert_eq!(field(&verify, "cached-md5"), md5(&held));
        assert_eq!(field(&verify, "disk-md5"), md5(&held));
    }
    assert!(eligible.is_running() && other.is_running());
    drop(eligible);
    drop(other);
    assert_eq!(
        UnmergeWhenDone::unmerge(),
        Some(0),
        "no KSM page of the guests left counted"
    );
}
