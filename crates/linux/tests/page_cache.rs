//! The page-cache mechanisms the scrubber relies on, measured on the real
//! kernel with a real file: which pages are cached (mincore against
//! cachestat), their content without I/O (RWF_NOWAIT), their folios and
//! dirty state (own mapping + pagemap + kpageflags), and what
//! POSIX_FADV_DONTNEED does with part of a folio, a whole folio, and a
//! dirty page. docs/page-cache-scrubbing.md quotes what these assert.

use pagesift_linux::folio::FolioFinder;
use pagesift_linux::page_cache::{DropOutcome, ImageCache};
use std::fs::{self, File};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

const PAGE: u64 = 4096;
const PAGES: u64 = 4096; // 16 MiB

fn content(i: u64) -> Vec<u8> {
    // Distinct pages: the index and a simple generator.
    let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..PAGE / 8)
        .flat_map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()
        })
        .collect()
}

/// A file of `PAGES` distinct pages in the temporary directory, not cached;
/// removed when the `TempPath` drops.
fn make_file(name: &str) -> (tempfile::TempPath, File) {
    assert!(
        rustix::process::geteuid().is_root(),
        "the page-cache tests need root (kpageflags)"
    );
    let (f, path) = tempfile::Builder::new()
        .prefix(&format!("pagesift-{name}-"))
        .tempfile()
        .unwrap()
        .into_parts();
    let all: Vec<u8> = (0..PAGES).flat_map(content).collect();
    f.write_all_at(&all, 0).unwrap();
    f.sync_all().unwrap();
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed).unwrap();
    (path, f)
}

#[test]
fn cached_pages_are_found_read_and_foliated_without_io() {
    let (tmp, f) = make_file("cache");
    let cache = ImageCache::open(&tmp).unwrap();
    assert_eq!(cache.stat(0, 0).unwrap().cache, 0, "dropped after writing");
    // Scattered single-page reads with FADV_RANDOM: order-0 folios.
    rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::Random).unwrap();
    let scattered: Vec<u64> = (0..PAGES / 2).step_by(7).collect();
    let mut buf = vec![0u8; PAGE as usize];
    for &i in &scattered {
        f.read_exact_at(&mut buf, i * PAGE).unwrap();
    }
    // A sequential read of the second half with normal read-ahead: large
    // folios (ext4 here).
    let seq = File::open(&tmp).unwrap();
    let mut big = vec![0u8; ((PAGES / 2) * PAGE) as usize];
    seq.read_exact_at(&mut big, PAGES / 2 * PAGE).unwrap();

    let cached = cache.cached_pages().unwrap();
    let stat = cache.stat(0, 0).unwrap();
    // mincore and cachestat agree (DAMON may evict a few between the two).
    assert!(
        (cached.len() as i64 - stat.cache as i64).abs() <= 16,
        "mincore {} cachestat {}",
        cached.len(),
        stat.cache
    );
    let scattered_cached = scattered
        .iter()
        .filter(|i| cached.binary_search(i).is_ok())
        .count();
    assert!(
        scattered_cached * 10 >= scattered.len() * 9,
        "{scattered_cached}"
    );

    // Content without I/O equals the file's.
    let mut page = vec![0u8; PAGE as usize];
    for &i in cached.iter().take(200) {
        if cache.read_cached(i, &mut page).unwrap() == 1 {
            assert_eq!(page, content(i), "page {i}");
        }
    }
    // RWF_NOWAIT on a page that is not cached: measured, not assumed. On
    // this kernel the flag does not keep the read from starting I/O (it
    // starts read-ahead and may find the page ready), which is why the
    // scrubber reads only pages mincore has just reported cached.
    let uncached = (0..PAGES)
        .find(|i| cached.binary_search(i).is_err())
        .unwrap();
    assert_eq!(cache.stat(uncached * PAGE, PAGE).unwrap().cache, 0);
    let got = cache.read_cached(uncached, &mut page).unwrap();
    let after = cache.stat(uncached * PAGE, PAGE).unwrap().cache;
    eprintln!("RWF_NOWAIT read of an uncached page: {got} page(s) read, cached after: {after}");
    if got == 1 {
        assert_eq!(page, content(uncached));
    }
    let cached = cache.cached_pages().unwrap();

    // Folios: order 0 in the scattered half, larger in the sequential one.
    let mut finder = FolioFinder::open().unwrap();
    let folios = finder.folios(&cache, &cached).unwrap();
    let low: Vec<_> = folios
        .iter()
        .filter(|f| f.folio.first < PAGES / 2)
        .collect();
    let high: Vec<_> = folios
        .iter()
        .filter(|f| f.folio.first >= PAGES / 2)
        .collect();
    assert!(low.iter().all(|f| f.folio.pages == 1), "{low:?}");
    let largest = high.iter().map(|f| f.folio.pages).max().unwrap_or(0);
    eprintln!(
        "folios: {} order-0 in the scattered half; sequential half: {} folios, largest {} pages",
        low.len(),
        high.len(),
        largest
    );
    assert!(folios.iter().all(|f| !f.dirty && !f.writeback));
    for f in &folios {
        assert!(f.folio.first.is_multiple_of(f.folio.pages));
    }

    // DONTNEED of one page inside a large folio evicts nothing; of the
    // whole folio, all of it. Whether the kernel forms large folios
    // depends on free high-order memory at the time (on this busy machine
    // often none), so this part runs when one formed.
    if let Some(fo) = high.iter().find(|f| f.folio.pages > 1).map(|f| f.folio) {
        match cache.drop_range((fo.first + 1) * PAGE, PAGE).unwrap() {
            DropOutcome::Dropped { evicted } => assert_eq!(evicted, 0, "part of a folio"),
            DropOutcome::Busy => panic!("clean"),
        }
        let before = cache.stat(fo.first * PAGE, fo.pages * PAGE).unwrap().cache;
        assert_eq!(before, fo.pages);
        match cache.drop_range(fo.first * PAGE, fo.pages * PAGE).unwrap() {
            DropOutcome::Dropped { evicted } => assert_eq!(evicted, fo.pages, "a whole folio"),
            DropOutcome::Busy => panic!("clean"),
        }
    }
    // An order-0 page drops alone, its neighbours stay.
    let lone = low[low.len() / 2].folio.first;
    match cache.drop_range(lone * PAGE, PAGE).unwrap() {
        DropOutcome::Dropped { evicted } => assert_eq!(evicted, 1),
        DropOutcome::Busy => panic!("clean"),
    }
}

#[test]
fn a_dirty_page_is_seen_dirty_and_never_dropped() {
    let (tmp, f) = make_file("dirty");
    let cache = ImageCache::open(&tmp).unwrap();
    let i = 100;
    // Rewrite page i with its own content: dirty, same bytes.
    f.write_all_at(&content(i), i * PAGE).unwrap();
    let stat = cache.stat(i * PAGE, PAGE).unwrap();
    assert_eq!((stat.cache, stat.dirty), (1, 1), "{stat:?}");
    let mut finder = FolioFinder::open().unwrap();
    let folios = finder.folios(&cache, &[i]).unwrap();
    assert_eq!(folios.len(), 1);
    let fo = folios[0];
    assert!(
        fo.dirty || fo.writeback,
        "kpageflags shows it dirty: {fo:?}"
    );
    assert_eq!(
        cache
            .drop_range(fo.folio.first * PAGE, fo.folio.pages * PAGE)
            .unwrap(),
        DropOutcome::Busy
    );
    assert_eq!(cache.stat(i * PAGE, PAGE).unwrap().cache, 1, "still cached");
    // Written back: clean, and then it drops.
    f.sync_all().unwrap();
    let folios = finder.folios(&cache, &[i]).unwrap();
    assert!(!folios[0].dirty && !folios[0].writeback, "{:?}", folios[0]);
    let fo = folios[0].folio;
    assert_eq!(
        cache.drop_range(fo.first * PAGE, fo.pages * PAGE).unwrap(),
        DropOutcome::Dropped { evicted: fo.pages }
    );
}

/// A memory cgroup made for one test (v2 where the memory controller is on
/// the unified hierarchy, else v1), removed on drop even after a failure.
struct TestCgroup(PathBuf);

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
}

/// The scrubber's pressure test reads the memory cgroup a guest lives
/// under: a process moved into a cgroup with a 256 MiB limit is found
/// there, and its limit, usage and page cache are read; a process under no
/// limit gives none.
#[test]
fn a_processs_memory_cgroup_limit_is_read() {
    use pagesift_linux::memcg::{memory_cgroup_dir, read_limited};
    let unified = std::path::Path::new("/sys/fs/cgroup");
    let v2 = fs::read_to_string(unified.join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"));
    let name = format!("pagesift-memcg-test-{}", std::process::id());
    let dir = if v2 {
        unified.join(&name)
    } else {
        unified.join("memory").join(&name)
    };
    fs::create_dir(&dir).expect("creating a memory cgroup (root)");
    let cgroup = TestCgroup(dir);
    let limit_file = if v2 {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    fs::write(cgroup.0.join(limit_file), (256u64 << 20).to_string()).unwrap();
    let mut child = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let pid = child.id();
    let host_kib = pagesift_linux::host::memory_kib().unwrap().total;
    // Before the move: the test's own cgroup, with no limit below the
    // host's RAM on this machine (or the one CI sets; either way not ours).
    let outside = memory_cgroup_dir(pid).unwrap();
    assert_ne!(outside.as_deref(), Some(cgroup.0.as_path()));
    fs::write(cgroup.0.join("cgroup.procs"), pid.to_string()).unwrap();
    let found = memory_cgroup_dir(pid).unwrap();
    let mem = found.as_deref().map(|d| read_limited(d, host_kib).unwrap());
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(found.as_deref(), Some(cgroup.0.as_path()));
    let mem = mem.flatten().expect("a 256 MiB limit is a limit");
    assert_eq!(mem.total, 256 << 10);
    assert!(mem.free <= mem.total && mem.free > 0, "{mem:?}");
    assert!(mem.cached <= mem.total, "{mem:?}");
}
