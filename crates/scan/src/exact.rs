//! The exact scan: every present page of the selected processes is read,
//! hashed and grouped by content with byte-exact verification. Ground
//! truth for the sampled scan, and `pagesift scan --exact`.
//!
//! ## The pipeline, before the code
//!
//! 1. **Discover** (`pagesift_linux::discover`). The processes the filter
//!    selects (`--pid`, `--comm`, `--uid`, `--cgroup`; never pagesift
//!    itself), in ascending pid order, and their merge-eligible VMAs
//!    (`ksm_compatible()`), from `/proc/PID/maps` plus per-VMA checks
//!    (`MapsDiscovery`): smaps, whose every read makes the kernel walk all
//!    present pages for RSS/PSS, only for processes maps cannot decide.
//! 2. **Look without touching.** Each VMA is walked in chunks of
//!    [`CHUNK_PAGES`] pagemap entries (one `pread` each, measured at ≈35 ns
//!    per page). A chunk with no present page in a VMA that goes on
//!    for more than [`SPARSE_SWITCH_PAGES`] switches to `PAGEMAP_SCAN`,
//!    which returns the present runs of the rest of the VMA in one ioctl
//!    (huge sparse reservations cost nothing then). `/proc/kpageflags` is
//!    read (sorted, clustered) only for the pages that can be zero-page
//!    mappings or KSM pages: those not exclusively mapped, those of
//!    `VM_MERGEABLE` VMAs (the only place KSM pages live) and those with
//!    pagemap's file/shared bit in anonymous VMAs (the huge zero page shows
//!    so). An exclusively mapped page outside a mergeable VMA is neither,
//!    so most pages need no kpageflags read at all. Zero-page mappings
//!    count as `zero` and KSM pages as `merged`; neither is read. Page-cache
//!    pages of private file mappings are not candidates and are not
//!    counted.
//! 3. **Frames once.** A page that is not exclusively mapped may share its
//!    frame with another process (after fork). Its PFN is remembered; when
//!    the frame shows up again (in a later process, scanned in pid order)
//!    the page is present there but the frame is not read or counted again.
//! 4. **Read.** Present pages are read in address order, exclusive pages of
//!    non-mergeable VMAs through `process_vm_readv` (pinned path, coalesced
//!    iovecs), all others through `/proc/PID/mem` (unpinned path): pinning
//!    a shared or KSM page makes the kernel copy it in the target
//!    (`pagesift_linux::read`). Only pages that pagemap showed present a
//!    moment before are read, so nothing is faulted in. A page unmapped in
//!    between is skipped; a process that exits is dropped and counted in
//!    `gone`.
//! 5. **Hash and group** (`group`). XXH3-64 per page, then a table of
//!    content groups with byte-exact verification against a bounded cache
//!    of representative contents, or against representatives read again.
//! 6. **Attribute** (`crate::stats::census`). Duplicate categories and
//!    savings per region (survivor: the first frame in scan order).
//! 7. **Classify** (optional, `--rescan SECS`). After the wait, every frame
//!    of a duplicated group is checked again (presence, then bytes via its
//!    hash); a region whose duplicates changed by more than the ladder's
//!    V_cow is *changing*, else its ratio net of changes decides between
//!    *statically duplicated* and *sparse* (V_dup). Without a rescan the
//!    class is `None`: one read cannot tell change. A read-only scan sees
//!    content changes only: a page rewritten with the same bytes (UKSM's
//!    COW-broken pattern) looks static, since no merge is there to break.
//!
//! With [`ExactOptions::threads`] = 2, steps 1–4 run on the calling thread
//! and steps 5–6 on a second one, with a few chunk buffers in flight.
//!
//! ## Read-only
//!
//! Nothing here writes to a target: no ptrace, no madvise, no KSM sysfs.
//! The only effects of a scan on a target are those of reading present
//! pages through the paths above, which the integration tests check
//! (memory checksums, RSS, VmPTE and, for a fork family, every pagemap
//! frame unchanged). Like any reader of `/proc/PID/mem`, a remote read
//! marks the page accessed for the kernel's reclaim (the LRU sees it as
//! used). Two windows are inherent and last microseconds: a page freed
//! between its pagemap check and its read would be faulted in as the zero
//! page, and a page that becomes shared in that window (the target forks)
//! would be unshared by a pinned read.
//!
//! ## Memory
//!
//! About 70 bytes per distinct content (a 32-byte group record, 12 bytes of
//! census, the hash table), the representative cache
//! ([`ExactOptions::cache_pages`] × 4 KiB, 32 MiB by default, filled only
//! as needed), 16 MiB of pending pages, and with `--rescan` 32 bytes per
//! frame read.

mod group;

pub use group::{GroupStats, page_hash};

use crate::report::{
    Class, Counts, Estimate, Mode, ProcessReport, RegionReport, Report, ScanError, sort_by_saving,
};
use crate::stats::census::{Census, RegionClass, RegionIx, classify};
use group::{Grouper, Loc, PageRecord, RepSource};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use pagesift_core::pipeline::ladder::LadderConfig;
use pagesift_core::{PAGE_SIZE, PageWords};
use pagesift_linux::discover::{
    self, MapsDiscovery, ProcessFilter, ProcessInfo, RegionKind, RegionsFrom,
};
use pagesift_linux::inspect::{self, PageClass};
use pagesift_linux::kpageflags::{KPageFlags, KpfFlags};
use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
use pagesift_linux::{LinuxError, PageBuffer, RemoteReader};
use std::collections::HashMap;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Pages per pagemap read and per read batch: 2 MiB of contents, which
/// stay in the L2/L3 cache between the read and the hash.
pub const CHUNK_PAGES: usize = 512;

/// A chunk with no present page switches the rest of its VMA to
/// `PAGEMAP_SCAN` when more than this many pages remain (64 MiB): below
/// that, reading pagemap linearly costs about as much as the ioctl's walk.
pub const SPARSE_SWITCH_PAGES: u64 = 16384;

/// Pages waiting for verification before a batched re-read (16 MiB).
const PENDING_PAGES: usize = 4096;

/// Chunk buffers in flight between the two threads.
const IN_FLIGHT: usize = 3;

/// Processes whose files the verifier keeps open (2 per process); others
/// are reopened on demand, after checking that the pid still names the
/// same process.
const OPEN_PROCESSES: usize = 256;

const PAGE: u64 = PAGE_SIZE as u64;

/// Options of an exact scan.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExactOptions {
    /// Which processes (pagesift's own is never scanned).
    pub filter: ProcessFilter,
    /// 1: read and hash on the calling thread; 2: hash on a second thread
    /// while the next chunk is read.
    pub threads: usize,
    /// Read duplicated frames again after this long, to classify regions
    /// (`None`: no classes).
    pub rescan: Option<Duration>,
    /// Representative contents kept for verification (4 KiB each; 0 makes
    /// every verification a re-read).
    pub cache_pages: usize,
    /// Draw a progress bar on stderr (the caller checks that stderr is a
    /// terminal).
    pub progress: bool,
}

impl Default for ExactOptions {
    fn default() -> Self {
        ExactOptions {
            filter: ProcessFilter::all(),
            threads: 1,
            rescan: None,
            // 32 MiB.
            cache_pages: 8192,
            progress: false,
        }
    }
}

/// How the scan went, beyond the report (for benchmarks and tests).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExactStats {
    /// Threads used.
    pub threads: usize,
    /// Wall time of the first pass (discovery, reads, hashing, grouping),
    /// in nanoseconds.
    pub scan_ns: u64,
    /// Wall time of the rescan (after the wait), in nanoseconds.
    pub rescan_ns: u64,
    /// Frames read and hashed in the first pass.
    pub frames: u64,
    /// Distinct contents among them (live processes).
    pub distinct: u64,
    /// Present pages whose frame was already counted in an earlier process
    /// (shared after fork).
    pub shared_pages: u64,
    /// Pages present in pagemap that were gone by the time they were read.
    pub vanished: u64,
    /// Grouping counters.
    pub group: GroupStats,
    /// Frames read again by the rescan.
    pub rescanned: u64,
    /// Processes whose VMAs came from smaps because maps could not decide
    /// (`pagesift_linux::discover::MapsDiscovery`).
    pub from_smaps: u64,
    /// Where the first pass spent its time, in nanoseconds of wall time
    /// on the thread that did it: discovery of VMAs (maps, smaps),
    /// pagemap and kpageflags, reading pages, and hashing plus grouping
    /// (on the second thread when there are two).
    pub time: PhaseTimes,
}

/// Time per phase of the first pass (nanoseconds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// Discovery of VMAs and their flags (maps, the per-VMA checks, and
    /// smaps where those cannot decide).
    pub discover_ns: u64,
    /// pagemap and kpageflags.
    pub inspect_ns: u64,
    /// Page reads (both paths).
    pub read_ns: u64,
    /// Hashing, grouping and verification re-reads (hashing included).
    pub group_ns: u64,
    /// Of which hashing alone.
    pub hash_ns: u64,
}

impl ExactStats {
    /// Frames per second of the first pass.
    pub fn pages_per_second(&self) -> f64 {
        if self.scan_ns == 0 {
            0.0
        } else {
            self.frames as f64 * 1e9 / self.scan_ns as f64
        }
    }
}

/// Runs an exact scan.
pub fn run(opts: &ExactOptions) -> Result<Report, ScanError> {
    run_with_stats(opts).map(|(r, _)| r)
}

/// Runs an exact scan and also returns its [`ExactStats`].
///
/// Errors: a missing capability (`CAP_SYS_ADMIN` for PFNs and kpageflags,
/// checked first; `CAP_SYS_PTRACE` when a target refuses access), a pid in
/// the filter that does not exist, pagesift's own pid, bad options.
/// Processes that exit during the scan are not errors: they are counted in
/// [`Report::gone`].
pub fn run_with_stats(opts: &ExactOptions) -> Result<(Report, ExactStats), ScanError> {
    if !(1..=2).contains(&opts.threads) {
        return Err(ScanError::Usage(format!(
            "threads: must be 1 or 2, got {}",
            opts.threads
        )));
    }
    let t0 = Instant::now();
    let cpu0 = pagesift_linux::host::process_cpu_ns();
    // Fail early, and by name, without CAP_SYS_ADMIN.
    let kpf = KPageFlags::open()?;
    let mut procs = discover::list_processes(&opts.filter)?;
    procs.sort_by_key(|p| p.pid);
    let bar = progress_bar(opts.progress, procs.len() as u64);
    let mut scanner = Scanner::new(kpf, bar.clone());
    let hasher = Hasher::new(opts.cache_pages, opts.rescan.is_some());
    let (res, done) = if opts.threads == 2 {
        std::thread::scope(|s| {
            let (tx, rx) = mpsc::sync_channel::<Msg>(IN_FLIGHT);
            let (back_tx, back_rx) = mpsc::channel::<Batch>();
            let h = s.spawn(move || {
                let mut hasher = hasher;
                for msg in rx {
                    if let Some(b) = hasher.handle(msg) {
                        let _ = back_tx.send(b);
                    }
                }
                hasher.finish()
            });
            let mut sink = ChannelSink {
                tx,
                back: back_rx,
                made: 0,
                spare: Vec::new(),
            };
            let res = scanner.scan_all(&procs, &mut sink);
            drop(sink);
            let done = h.join().expect("the hashing thread panicked");
            (res, done)
        })
    } else {
        let mut sink = InlineSink {
            hasher,
            spare: Vec::new(),
        };
        let res = scanner.scan_all(&procs, &mut sink);
        (res, sink.hasher.finish())
    };
    res?;
    let Finished {
        census,
        records,
        group,
        group_ns,
        hash_ns,
        mut reps,
    } = done;
    let scan_ns = t0.elapsed().as_nanos() as u64;
    let attrs = census.attribute();
    let mut stats = ExactStats {
        threads: opts.threads,
        scan_ns,
        frames: group.pages,
        distinct: census.distinct(),
        shared_pages: scanner.shared_pages,
        vanished: scanner.vanished,
        from_smaps: scanner.from_smaps,
        group,
        time: PhaseTimes {
            group_ns,
            hash_ns,
            ..scanner.time
        },
        ..ExactStats::default()
    };

    // Optional second read of every duplicated frame.
    let mut classes: Option<Vec<Option<Class>>> = None;
    if let Some(wait) = opts.rescan {
        bar.set_message(format!(
            "waiting {:.1} s for the second read",
            wait.as_secs_f64()
        ));
        std::thread::sleep(wait);
        let t1 = Instant::now();
        let mut dup: Vec<PageRecord> = records
            .into_iter()
            .filter(|r| !scanner.dropped_region(r.loc.region) && census.is_duplicated(r.group))
            .collect();
        dup.sort_unstable_by_key(|r| r.loc);
        let changed = reps.recheck(&dup);
        stats.rescanned = dup.len() as u64;
        let mut changed_in = vec![0u64; census.regions()];
        for (r, c) in dup.iter().zip(&changed) {
            if *c {
                changed_in[r.loc.region as usize] += 1;
            }
        }
        let ladder = LadderConfig::default();
        classes = Some(
            attrs
                .iter()
                .zip(&changed_in)
                .map(|(a, &c)| {
                    Some(
                        match classify(a.frames, a.duplicated(), c, ladder.v_dup, ladder.v_cow) {
                            RegionClass::StaticallyDuplicated => Class::StaticallyDuplicated,
                            RegionClass::Sparse => Class::Sparse,
                            RegionClass::Changing => Class::Changing,
                        },
                    )
                })
                .collect(),
        );
        stats.rescan_ns = t1.elapsed().as_nanos() as u64;
    }
    bar.finish_and_clear();

    let mut report = scanner.report(
        &census,
        &attrs,
        classes.as_deref(),
        t0.elapsed(),
        scanner.pages_read + reps.pages_read,
    );
    report.cpu_ms = (pagesift_linux::host::process_cpu_ns() - cpu0) / 1_000_000;
    Ok((report, stats))
}

fn progress_bar(show: bool, processes: u64) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(processes), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} {elapsed_precise} [{bar:16}] {pos}/{len} · {wide_msg}",
    ) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}

/// Files of one process, for reading pages.
struct Handles {
    pagemap: Pagemap,
    reader: RemoteReader,
}

impl Handles {
    fn open(pid: u32) -> Result<Handles, LinuxError> {
        let pagemap = Pagemap::open(pid)?;
        pagemap.require_pfns()?;
        Ok(Handles {
            pagemap,
            reader: RemoteReader::new(pid)?,
        })
    }
}

/// A read batch: up to [`CHUNK_PAGES`] pages of one region.
struct Batch {
    region: RegionIx,
    pages: PageBuffer,
    items: Vec<Item>,
}

impl Batch {
    fn new() -> Batch {
        Batch {
            region: 0,
            pages: PageBuffer::new(CHUNK_PAGES),
            items: Vec::with_capacity(CHUNK_PAGES),
        }
    }
}

/// A read page: its address and its slot in the batch buffer.
#[derive(Clone, Copy, Debug)]
struct Item {
    addr: u64,
    buf: u32,
}

/// From the reading side to the hashing side, in scan order.
enum Msg {
    /// A process starts; `handles` are its files for re-reads, opened
    /// while it was being scanned.
    Process {
        ix: u32,
        pid: u32,
        start_time: u64,
        handles: Box<Handles>,
    },
    /// A region of process `proc` starts (region numbers are consecutive).
    Region {
        ix: RegionIx,
        proc: u32,
        mergeable: bool,
        pages: u64,
    },
    /// Pages read.
    Batch(Batch),
    /// The process is done: verify what waits on it while it is open.
    EndProcess,
    /// The process exited or could not be read: forget its frames.
    DropProcess(u32),
}

/// Where the reading side sends its messages.
trait Sink {
    fn send(&mut self, msg: Msg);
    /// An empty batch buffer.
    fn batch(&mut self) -> Batch;
    /// Gives back a buffer that was not sent.
    fn recycle(&mut self, b: Batch);
}

/// One thread: hash right away.
struct InlineSink {
    hasher: Hasher,
    spare: Vec<Batch>,
}

impl Sink for InlineSink {
    fn send(&mut self, msg: Msg) {
        if let Some(b) = self.hasher.handle(msg) {
            self.spare.push(b);
        }
    }
    fn batch(&mut self) -> Batch {
        self.spare.pop().unwrap_or_else(Batch::new)
    }
    fn recycle(&mut self, b: Batch) {
        self.spare.push(b);
    }
}

/// Two threads: a bounded channel to the hasher, buffers come back.
struct ChannelSink {
    tx: mpsc::SyncSender<Msg>,
    back: mpsc::Receiver<Batch>,
    made: usize,
    spare: Vec<Batch>,
}

impl Sink for ChannelSink {
    fn send(&mut self, msg: Msg) {
        // A send fails only if the hasher panicked; the join reports it.
        let _ = self.tx.send(msg);
    }
    fn recycle(&mut self, b: Batch) {
        self.spare.push(b);
    }
    fn batch(&mut self) -> Batch {
        if let Some(b) = self.spare.pop() {
            return b;
        }
        if let Ok(b) = self.back.try_recv() {
            return b;
        }
        if self.made < IN_FLIGHT + 1 {
            self.made += 1;
            return Batch::new();
        }
        self.back.recv().unwrap_or_else(|_| Batch::new())
    }
}

/// What the hashing side hands back.
struct Finished {
    census: Census,
    records: Vec<PageRecord>,
    group: GroupStats,
    group_ns: u64,
    hash_ns: u64,
    reps: LiveReps,
}

/// The hashing side: groups pages, re-reads representatives.
struct Hasher {
    grouper: Grouper,
    reps: LiveReps,
    hashes: Vec<u64>,
    busy_ns: u64,
    hash_ns: u64,
}

impl Hasher {
    fn new(cache_pages: usize, records: bool) -> Hasher {
        Hasher {
            grouper: Grouper::new(cache_pages, PENDING_PAGES, records),
            reps: LiveReps::default(),
            hashes: Vec::with_capacity(CHUNK_PAGES),
            busy_ns: 0,
            hash_ns: 0,
        }
    }

    fn handle(&mut self, msg: Msg) -> Option<Batch> {
        let t = Instant::now();
        let out = self.handle_timed(msg);
        self.busy_ns += t.elapsed().as_nanos() as u64;
        out
    }

    fn handle_timed(&mut self, msg: Msg) -> Option<Batch> {
        match msg {
            Msg::Process {
                ix,
                pid,
                start_time,
                handles,
            } => self.reps.add_process(ix, pid, start_time, handles),
            Msg::Region {
                ix,
                proc,
                mergeable,
                pages,
            } => {
                self.grouper.reserve(pages);
                let got = self.grouper.census_mut().add_region(proc);
                assert_eq!(got, ix, "regions are numbered alike on both sides");
                self.reps.regions.push(RegionRef { proc, mergeable });
            }
            Msg::Batch(b) => {
                let pages = b.pages.pages();
                // Hash the whole batch first: the table probes that follow
                // then run back to back, and their cache misses overlap.
                let t = Instant::now();
                self.hashes.clear();
                self.hashes.extend(
                    b.items
                        .iter()
                        .map(|it| self.grouper.hash_of(&pages[it.buf as usize])),
                );
                self.hash_ns += t.elapsed().as_nanos() as u64;
                self.grouper.prefetch(&self.hashes);
                for (it, &hash) in b.items.iter().zip(&self.hashes) {
                    let loc = Loc {
                        region: b.region,
                        addr: it.addr,
                    };
                    self.grouper
                        .add_hashed(&pages[it.buf as usize], hash, loc, &mut self.reps);
                }
                return Some(b);
            }
            Msg::EndProcess => self.grouper.flush(&mut self.reps),
            Msg::DropProcess(ix) => {
                self.grouper.census_mut().drop_process(ix);
                self.reps.forget(ix);
            }
        }
        None
    }

    fn finish(mut self) -> Finished {
        let t = Instant::now();
        let (census, records, group) = self.grouper.finish(&mut self.reps);
        Finished {
            census,
            records,
            group,
            group_ns: self.busy_ns + t.elapsed().as_nanos() as u64,
            hash_ns: self.hash_ns,
            reps: self.reps,
        }
    }
}

#[derive(Clone, Copy, Debug)]
struct RegionRef {
    proc: u32,
    mergeable: bool,
}

struct ProcRef {
    pid: u32,
    start_time: u64,
    handles: Option<Box<Handles>>,
    last_use: u64,
    gone: bool,
}

/// Reads pages of scanned processes again (verification, rescan).
#[derive(Default)]
struct LiveReps {
    regions: Vec<RegionRef>,
    procs: HashMap<u32, ProcRef>,
    open: usize,
    clock: u64,
    pages_read: u64,
}

impl LiveReps {
    fn add_process(&mut self, ix: u32, pid: u32, start_time: u64, handles: Box<Handles>) {
        self.procs.insert(
            ix,
            ProcRef {
                pid,
                start_time,
                handles: Some(handles),
                last_use: self.clock,
                gone: false,
            },
        );
        self.open += 1;
        self.clock += 1;
        self.close_excess();
    }

    fn forget(&mut self, ix: u32) {
        if let Some(p) = self.procs.get_mut(&ix) {
            p.gone = true;
            if p.handles.take().is_some() {
                self.open -= 1;
            }
        }
    }

    /// Closes the least recently used files beyond [`OPEN_PROCESSES`].
    fn close_excess(&mut self) {
        while self.open > OPEN_PROCESSES {
            let oldest = self
                .procs
                .iter()
                .filter(|(_, p)| p.handles.is_some())
                .min_by_key(|(_, p)| p.last_use)
                .map(|(&ix, _)| ix);
            match oldest {
                Some(ix) => {
                    self.procs.get_mut(&ix).expect("listed").handles = None;
                    self.open -= 1;
                }
                None => break,
            }
        }
    }

    /// The open files of process `ix`, reopened if they were closed and
    /// the pid still names the same process (same start time).
    fn handles(&mut self, ix: u32) -> Option<&mut Handles> {
        self.clock += 1;
        let clock = self.clock;
        let p = self.procs.get_mut(&ix)?;
        if p.gone {
            return None;
        }
        p.last_use = clock;
        if p.handles.is_none() {
            let same = discover::list_processes(&ProcessFilter::pids([p.pid]))
                .ok()
                .and_then(|v| v.into_iter().next())
                .is_some_and(|i| i.start_time == p.start_time);
            match same.then(|| Handles::open(p.pid)) {
                Some(Ok(h)) => {
                    p.handles = Some(Box::new(h));
                    self.open += 1;
                }
                _ => {
                    p.gone = true;
                    return None;
                }
            }
            self.close_excess();
        }
        self.procs.get_mut(&ix)?.handles.as_deref_mut()
    }

    /// Reads the pages at `locs` (sorted) process by process; `ok[i]` says
    /// which were read.
    fn read_sorted(&mut self, locs: &[Loc], out: &mut [PageWords], ok: &mut [bool]) {
        ok.fill(false);
        let mut i = 0;
        while i < locs.len() {
            let proc = self.regions[locs[i].region as usize].proc;
            let mut j = i + 1;
            while j < locs.len() && self.regions[locs[j].region as usize].proc == proc {
                j += 1;
            }
            let addrs: Vec<u64> = locs[i..j].iter().map(|l| l.addr).collect();
            let mergeable: Vec<bool> = locs[i..j]
                .iter()
                .map(|l| self.regions[l.region as usize].mergeable)
                .collect();
            let res = match self.handles(proc) {
                Some(h) => read_present(h, &addrs, &mergeable, &mut out[i..j], &mut ok[i..j]),
                None => Ok(0),
            };
            match res {
                Ok(n) => self.pages_read += n,
                Err(_) => {
                    // Gone (or unreadable now): nothing of it verifies.
                    ok[i..j].fill(false);
                    self.forget(proc);
                }
            }
            i = j;
        }
    }

    /// For each record (sorted by location), whether its page changed
    /// since it was read: not present or unreadable now, or other bytes.
    fn recheck(&mut self, recs: &[PageRecord]) -> Vec<bool> {
        let mut changed = Vec::with_capacity(recs.len());
        for chunk in recs.chunks(PENDING_PAGES) {
            let locs: Vec<Loc> = chunk.iter().map(|r| r.loc).collect();
            let mut out = PageBuffer::new(locs.len());
            let mut ok = vec![false; locs.len()];
            self.read_sorted(&locs, out.pages_mut(), &mut ok);
            for (k, r) in chunk.iter().enumerate() {
                changed.push(!ok[k] || page_hash(&out.pages()[k]) != r.hash);
            }
        }
        changed
    }
}

impl RepSource for LiveReps {
    fn read_reps(&mut self, locs: &[Loc], out: &mut [PageWords], ok: &mut [bool]) {
        self.read_sorted(locs, out, ok);
    }
}

/// Reads the pages at the sorted addresses `addrs` of one process that
/// pagemap shows present *now* (private, not page cache), each by its safe
/// path; `ok[i]` says which were read. Returns how many were read.
fn read_present(
    h: &mut Handles,
    addrs: &[u64],
    mergeable: &[bool],
    out: &mut [PageWords],
    ok: &mut [bool],
) -> Result<u64, LinuxError> {
    // Current pagemap entries, clustered reads: a gap of up to 32 pages
    // costs less than another syscall (≈0.7 µs a call, ≈35 ns an entry).
    const GAP: u64 = 32;
    const SPAN: u64 = 4096;
    let mut entries = vec![PagemapEntry(0); addrs.len()];
    let mut scratch: Vec<PagemapEntry> = Vec::new();
    let mut k = 0;
    while k < addrs.len() {
        let first = addrs[k];
        let mut j = k + 1;
        while j < addrs.len()
            && (addrs[j] - addrs[j - 1]) / PAGE <= GAP
            && (addrs[j] - first) / PAGE < SPAN
        {
            j += 1;
        }
        let count = ((addrs[j - 1] - first) / PAGE + 1) as usize;
        scratch.clear();
        scratch.resize(count, PagemapEntry(0));
        h.pagemap.read(first, &mut scratch)?;
        for i in k..j {
            entries[i] = scratch[((addrs[i] - first) / PAGE) as usize];
        }
        k = j;
    }
    let mut pinned = Vec::new();
    let mut unpinned = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        if !e.present() || e.swapped() || e.file_or_shared() {
            continue;
        }
        if pagesift_linux::read::safe_to_pin(*e, mergeable[i]) {
            pinned.push(i);
        } else {
            unpinned.push(i);
        }
    }
    let mut n = 0;
    for (idx, unpin) in [(pinned, false), (unpinned, true)] {
        if idx.is_empty() {
            continue;
        }
        let a: Vec<u64> = idx.iter().map(|&i| addrs[i]).collect();
        let mut buf = PageBuffer::new(a.len());
        let mut got = vec![false; a.len()];
        read_all(&mut h.reader, &a, buf.pages_mut(), unpin, &mut got)?;
        for (k, &i) in idx.iter().enumerate() {
            if got[k] {
                out[i] = buf.pages()[k];
                ok[i] = true;
                n += 1;
            }
        }
    }
    Ok(n)
}

/// Reads the present pages at `addrs` into `out` by one path, skipping a
/// page that was unmapped since it was seen; `ok[i]` says which were read.
fn read_all(
    reader: &mut RemoteReader,
    addrs: &[u64],
    out: &mut [PageWords],
    unpinned: bool,
    ok: &mut [bool],
) -> Result<(), LinuxError> {
    let mut done = 0;
    while done < addrs.len() {
        let got = if unpinned {
            reader.read_pages_unpinned(&addrs[done..], &mut out[done..addrs.len()])?
        } else {
            reader.read_pages(&addrs[done..], &mut out[done..addrs.len()])?
        };
        ok[done..done + got].fill(true);
        done += got;
        if done < addrs.len() {
            // Page `done` was unmapped since pagemap showed it: skip it.
            ok[done] = false;
            done += 1;
        }
    }
    Ok(())
}

/// What the scan does with one page: its class
/// (`pagesift_linux::inspect::classify`, the one classification of pages)
/// turned into counting, skipping or reading, and how to read it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PageAction {
    /// Not present, swapped, or not something KSM merges (page cache of a
    /// private file mapping, shared memory).
    NotCandidate,
    /// Mapped to the zero page (or the huge zero page).
    Zero,
    /// A KSM page.
    Merged,
    /// A frame to read: through the pinned path if `pinned`; `shared` when
    /// it may be mapped by other processes too (count it once).
    Frame { pinned: bool, shared: bool },
}

/// The scan's decision for one page (see [`PageAction`]). `flags` must be
/// given when `inspect::flags_needed` says so.
fn page_action(e: PagemapEntry, flags: Option<KpfFlags>, mergeable: bool) -> PageAction {
    match inspect::classify(e, flags) {
        PageClass::NotPresent | PageClass::Swapped | PageClass::File => PageAction::NotCandidate,
        PageClass::Zero => PageAction::Zero,
        PageClass::Merged => PageAction::Merged,
        PageClass::Anon => PageAction::Frame {
            // Pinning copies a page that is shared or may be a KSM page in
            // the target (pagesift_linux::read): only exclusive pages
            // outside mergeable VMAs, where no KSM page can be, take the
            // fast path.
            pinned: e.exclusive() && !mergeable,
            shared: !e.exclusive(),
        },
    }
}

/// A set of frame numbers: one bit per PFN, grown to the largest PFN met
/// (1 MiB of bits covers 32 GiB of RAM), so a lookup is one memory access
/// and no hashing.
#[derive(Default)]
struct FrameSet {
    bits: Vec<u64>,
}

impl FrameSet {
    /// Adds `pfn`; returns whether it was new.
    fn insert(&mut self, pfn: u64) -> bool {
        let (word, bit) = ((pfn / 64) as usize, pfn % 64);
        if word >= self.bits.len() {
            self.bits.resize((word + 1).next_power_of_two(), 0);
        }
        let new = self.bits[word] >> bit & 1 == 0;
        self.bits[word] |= 1 << bit;
        new
    }
}

/// A process as the reading side saw it.
struct ProcEntry {
    info: ProcessInfo,
    regions: Vec<RegionIx>,
    dropped: bool,
}

/// A region as the reading side saw it, with its page counts.
struct RegionEntry {
    proc: u32,
    start: u64,
    end: u64,
    name: String,
    present: u64,
    zero: u64,
    merged: u64,
}

/// The reading side: discovery, pagemap, kpageflags, reads.
struct Scanner {
    kpf: KPageFlags,
    discovery: MapsDiscovery,
    /// Processes discovered through smaps.
    from_smaps: u64,
    bar: ProgressBar,
    last_draw: Instant,
    procs: Vec<ProcEntry>,
    regions: Vec<RegionEntry>,
    skipped: Vec<(u32, String)>,
    gone: u64,
    /// Frames already met that may be mapped elsewhere too.
    seen: FrameSet,
    pages_read: u64,
    shared_pages: u64,
    vanished: u64,
    started: Instant,
    time: PhaseTimes,
    // Scratch, reused per chunk.
    entries: Vec<PagemapEntry>,
    pfns: Vec<u64>,
    pfn_at: Vec<usize>,
    flags: Vec<KpfFlags>,
    pinned: Vec<u64>,
    unpinned: Vec<u64>,
    order: Vec<(u64, bool)>,
    ok_pinned: Vec<bool>,
    ok_unpinned: Vec<bool>,
}

impl Scanner {
    fn new(kpf: KPageFlags, bar: ProgressBar) -> Scanner {
        Scanner {
            kpf,
            discovery: MapsDiscovery::new(),
            from_smaps: 0,
            bar,
            last_draw: Instant::now(),
            procs: Vec::new(),
            regions: Vec::new(),
            skipped: Vec::new(),
            gone: 0,
            seen: FrameSet::default(),
            pages_read: 0,
            shared_pages: 0,
            vanished: 0,
            started: Instant::now(),
            time: PhaseTimes::default(),
            entries: Vec::new(),
            pfns: Vec::new(),
            pfn_at: Vec::new(),
            flags: Vec::new(),
            pinned: Vec::new(),
            unpinned: Vec::new(),
            order: Vec::new(),
            ok_pinned: Vec::new(),
            ok_unpinned: Vec::new(),
        }
    }

    fn dropped_region(&self, r: RegionIx) -> bool {
        self.procs[self.regions[r as usize].proc as usize].dropped
    }

    /// Scans every process; only a missing capability stops the scan.
    fn scan_all(&mut self, procs: &[ProcessInfo], sink: &mut dyn Sink) -> Result<(), LinuxError> {
        self.started = Instant::now();
        for info in procs {
            let ix = self.procs.len() as u32;
            self.procs.push(ProcEntry {
                info: info.clone(),
                regions: Vec::new(),
                dropped: false,
            });
            self.bar
                .set_message(format!("pid {} {}", info.pid, info.comm));
            match self.scan_process(ix, sink) {
                Ok(()) => {}
                Err(e) => {
                    self.procs[ix as usize].dropped = true;
                    sink.send(Msg::DropProcess(ix));
                    match e {
                        e if e.is_gone() => self.gone += 1,
                        LinuxError::NoSuchProcess(_) => self.gone += 1,
                        e @ LinuxError::MissingCapability { .. } => return Err(e),
                        e => self.skipped.push((info.pid, e.to_string())),
                    }
                }
            }
            self.bar.inc(1);
        }
        Ok(())
    }

    fn scan_process(&mut self, ix: u32, sink: &mut dyn Sink) -> Result<(), LinuxError> {
        let pid = self.procs[ix as usize].info.pid;
        let mut mine = Handles::open(pid)?;
        // A second pair for the verifier, opened now so that it names this
        // very process (both files pin its mm).
        let theirs = Handles::open(pid)?;
        let t = Instant::now();
        let maps = self
            .discovery
            .process_regions(pid, &mine.pagemap, &mut self.kpf);
        self.time.discover_ns += t.elapsed().as_nanos() as u64;
        let (maps, from) = maps?;
        if from != RegionsFrom::Maps {
            self.from_smaps += 1;
        }
        if maps.eligible.is_empty() {
            // A zombie (exited, not yet reaped) has no VMAs left but its
            // files still open: it is gone, not empty.
            let alive =
                discover::list_processes(&ProcessFilter::pids([pid])).is_ok_and(|v| !v.is_empty());
            if !alive {
                return Err(LinuxError::Gone(pid));
            }
        }
        sink.send(Msg::Process {
            ix,
            pid,
            start_time: self.procs[ix as usize].info.start_time,
            handles: Box::new(theirs),
        });
        for r in maps.eligible {
            let rix = self.regions.len() as RegionIx;
            self.regions.push(RegionEntry {
                proc: ix,
                start: r.start,
                end: r.end,
                name: r
                    .path
                    .as_ref()
                    .map_or_else(|| "[anon]".to_string(), |p| p.display().to_string()),
                present: 0,
                zero: 0,
                merged: 0,
            });
            self.procs[ix as usize].regions.push(rix);
            sink.send(Msg::Region {
                ix: rix,
                proc: ix,
                mergeable: r.mergeable,
                pages: r.pages(),
            });
            let anon = r.kind == RegionKind::Anonymous;
            self.scan_region(&mut mine, r.start, r.end, rix, r.mergeable, anon, sink)?;
        }
        sink.send(Msg::EndProcess);
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn scan_region(
        &mut self,
        h: &mut Handles,
        start: u64,
        end: u64,
        rix: RegionIx,
        mergeable: bool,
        anon: bool,
        sink: &mut dyn Sink,
    ) -> Result<(), LinuxError> {
        let chunk = CHUNK_PAGES as u64 * PAGE;
        let mut pos = start;
        let mut can_jump = true;
        while pos < end {
            let b = (pos + chunk).min(end);
            let present = self.scan_chunk(h, pos, b, rix, mergeable, anon, sink)?;
            pos = b;
            if present == 0 && can_jump && (end - pos) / PAGE > SPARSE_SWITCH_PAGES {
                match h.pagemap.present_runs(pos, end) {
                    Ok(runs) => {
                        for run in runs {
                            let mut a = run.start.max(pos);
                            while a < run.end {
                                let b = (a + chunk).min(run.end);
                                self.scan_chunk(h, a, b, rix, mergeable, anon, sink)?;
                                a = b;
                            }
                        }
                        return Ok(());
                    }
                    // Before Linux 6.7: keep walking pagemap.
                    Err(LinuxError::Unsupported(_)) => can_jump = false,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Inspects and reads `[a, b)`; returns how many pages were present.
    #[allow(clippy::too_many_arguments)]
    fn scan_chunk(
        &mut self,
        h: &mut Handles,
        a: u64,
        b: u64,
        rix: RegionIx,
        mergeable: bool,
        anon: bool,
        sink: &mut dyn Sink,
    ) -> Result<u64, LinuxError> {
        let n = ((b - a) / PAGE) as usize;
        let t_inspect = Instant::now();
        self.entries.clear();
        self.entries.resize(n, PagemapEntry(0));
        h.pagemap.read(a, &mut self.entries)?;
        // Which pages need their frame's flags (zero page, KSM)? Only
        // those: not `PageInspector`, which reads every present page's flags
        // and costs ~46x more per page on a private anonymous region
        // (pagesift_linux::inspect's header has the measurement).
        self.pfns.clear();
        self.pfn_at.clear();
        let mut present_entries = 0;
        for (i, e) in self.entries.iter().enumerate() {
            if !e.present() || e.swapped() {
                continue;
            }
            present_entries += 1;
            if inspect::flags_needed(*e, anon, mergeable) {
                match e.pfn() {
                    Some(pfn) if pfn != 0 => {
                        self.pfns.push(pfn);
                        self.pfn_at.push(i);
                    }
                    _ => {
                        return Err(LinuxError::MissingCapability {
                            cap: pagesift_linux::Capability::SysAdmin,
                            why: "to see page frame numbers in /proc/PID/pagemap (without them \
                                  shared, zero and KSM pages cannot be told apart)",
                        });
                    }
                }
            }
        }
        if present_entries == 0 {
            self.time.inspect_ns += t_inspect.elapsed().as_nanos() as u64;
            return Ok(0);
        }
        self.flags.clear();
        self.flags.resize(self.pfns.len(), KpfFlags(0));
        if !self.pfns.is_empty() {
            self.kpf.read_many(&self.pfns, &mut self.flags)?;
        }
        self.time.inspect_ns += t_inspect.elapsed().as_nanos() as u64;
        // Classify in address order; collect the pages to read.
        let (mut present, mut zero, mut merged) = (0u64, 0u64, 0u64);
        self.pinned.clear();
        self.unpinned.clear();
        self.order.clear();
        let mut k = 0;
        for (i, e) in self.entries.iter().enumerate() {
            let flags = if k < self.pfn_at.len() && self.pfn_at[k] == i {
                k += 1;
                Some(self.flags[k - 1])
            } else {
                None
            };
            let addr = a + i as u64 * PAGE;
            match page_action(*e, flags, mergeable) {
                PageAction::NotCandidate => {}
                PageAction::Zero => {
                    zero += 1;
                    present += 1;
                }
                PageAction::Merged => {
                    merged += 1;
                    present += 1;
                }
                PageAction::Frame { pinned, shared } => {
                    if shared && !self.seen.insert(self.pfns[k - 1]) {
                        // A frame already counted in an earlier process.
                        present += 1;
                        self.shared_pages += 1;
                        continue;
                    }
                    if pinned {
                        self.pinned.push(addr);
                    } else {
                        self.unpinned.push(addr);
                    }
                    self.order.push((addr, pinned));
                }
            }
        }
        // Read: pinned pages first in the buffer, then unpinned ones.
        let mut batch = sink.batch();
        batch.region = rix;
        batch.items.clear();
        let np = self.pinned.len();
        let nu = self.unpinned.len();
        self.ok_pinned.clear();
        self.ok_pinned.resize(np, false);
        self.ok_unpinned.clear();
        self.ok_unpinned.resize(nu, false);
        let t_read = Instant::now();
        {
            let bufs = batch.pages.pages_mut();
            let (bp, bu) = bufs.split_at_mut(np);
            if np > 0 {
                read_all(&mut h.reader, &self.pinned, bp, false, &mut self.ok_pinned)?;
            }
            if nu > 0 {
                read_all(
                    &mut h.reader,
                    &self.unpinned,
                    &mut bu[..nu],
                    true,
                    &mut self.ok_unpinned,
                )?;
            }
        }
        self.time.read_ns += t_read.elapsed().as_nanos() as u64;
        let (mut ip, mut iu) = (0, 0);
        for &(addr, pin) in &self.order {
            let (buf, ok) = if pin {
                ip += 1;
                (ip - 1, self.ok_pinned[ip - 1])
            } else {
                iu += 1;
                (np + iu - 1, self.ok_unpinned[iu - 1])
            };
            if ok {
                batch.items.push(Item {
                    addr,
                    buf: buf as u32,
                });
            } else {
                self.vanished += 1;
            }
        }
        let read = batch.items.len() as u64;
        present += read;
        self.pages_read += read;
        let r = &mut self.regions[rix as usize];
        r.present += present;
        r.zero += zero;
        r.merged += merged;
        if read > 0 {
            sink.send(Msg::Batch(batch));
        } else {
            sink.recycle(batch);
        }
        if self.last_draw.elapsed() >= Duration::from_millis(100) {
            self.last_draw = Instant::now();
            let secs = self.started.elapsed().as_secs_f64().max(1e-9);
            let info = &self.procs[self.regions[rix as usize].proc as usize].info;
            self.bar.set_message(format!(
                "pid {} {} · {:.0} MiB · {:.2} M pages/s",
                info.pid,
                info.comm,
                self.pages_read as f64 * PAGE as f64 / (1 << 20) as f64,
                self.pages_read as f64 / secs / 1e6
            ));
        }
        Ok(present_entries)
    }

    /// Builds the report from the census and the counts.
    fn report(
        &self,
        census: &Census,
        attrs: &[crate::stats::census::Attribution],
        classes: Option<&[Option<Class>]>,
        elapsed: Duration,
        pages_read: u64,
    ) -> Report {
        debug_assert_eq!(census.regions(), self.regions.len());
        let mut processes = Vec::new();
        for p in self.procs.iter().filter(|p| !p.dropped) {
            let mut regions = Vec::new();
            let mut total = Counts::default();
            for &rix in &p.regions {
                let r = &self.regions[rix as usize];
                let a = &attrs[rix as usize];
                let counts = Counts {
                    size_pages: (r.end - r.start) / PAGE,
                    present: r.present,
                    zero: r.zero,
                    merged: r.merged,
                    dup_in_region: Estimate::exact(a.in_region),
                    dup_in_process: Estimate::exact(a.in_process),
                    dup_across: Estimate::exact(a.across),
                    saving: Estimate::exact(a.saving),
                };
                total.add(&counts);
                regions.push(RegionReport {
                    start: r.start,
                    end: r.end,
                    name: r.name.clone(),
                    counts,
                    class: classes.and_then(|c| c[rix as usize]),
                });
            }
            processes.push(ProcessReport {
                pid: p.info.pid,
                comm: p.info.comm.clone(),
                counts: total,
                regions,
            });
        }
        sort_by_saving(&mut processes);
        let mut totals = Counts::default();
        for p in &processes {
            totals.add(&p.counts);
        }
        Report {
            mode: Mode::Exact,
            processes,
            totals,
            skipped: self.skipped.clone(),
            gone: self.gone,
            elapsed_ms: elapsed.as_millis() as u64,
            cpu_ms: 0, // set by the caller, which started the clock
            pages_read,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PRESENT: u64 = 1 << 63;
    const EXCLUSIVE: u64 = 1 << 56;
    const FILE: u64 = 1 << 61;
    const SWAPPED: u64 = 1 << 62;
    const KPF_KSM: u64 = 1 << 21;
    const KPF_ZERO: u64 = 1 << 24;
    const KPF_ANON: u64 = 1 << 12;

    fn kind(entry: u64, flags: Option<u64>, anon: bool, mergeable: bool) -> PageAction {
        let e = PagemapEntry(entry | 0x1234);
        assert_eq!(
            inspect::flags_needed(e, anon, mergeable),
            flags.is_some(),
            "flags are read exactly when needed: {entry:#x} anon {anon} mergeable {mergeable}"
        );
        page_action(e, flags.map(KpfFlags), mergeable)
    }

    #[test]
    fn each_page_is_read_counted_or_left_alone_by_the_rules() {
        use PageAction::*;
        let frame = |pinned, shared| Frame { pinned, shared };
        // Not there: never read.
        assert_eq!(kind(0, None, true, false), NotCandidate);
        assert_eq!(kind(SWAPPED, None, true, false), NotCandidate);
        // Exclusive anonymous page outside a mergeable VMA: pinned read,
        // no flags needed (it can be neither the zero page nor KSM's).
        assert_eq!(
            kind(PRESENT | EXCLUSIVE, None, true, false),
            frame(true, false)
        );
        // Shared after fork: unpinned, counted once.
        assert_eq!(
            kind(PRESENT, Some(KPF_ANON), true, false),
            frame(false, true)
        );
        // The zero page is never exclusive.
        assert_eq!(kind(PRESENT, Some(KPF_ZERO), true, false), Zero);
        // The huge zero page shows pagemap's file bit.
        assert_eq!(kind(PRESENT | FILE, Some(KPF_ZERO), true, false), Zero);
        assert_eq!(
            kind(PRESENT | FILE, Some(KPF_ANON), true, false),
            NotCandidate
        );
        // In a mergeable VMA every page's flags are read; KSM pages count
        // as merged, even the rare exclusive ones, and nothing is pinned.
        assert_eq!(kind(PRESENT, Some(KPF_KSM | KPF_ANON), true, true), Merged);
        assert_eq!(kind(PRESENT | EXCLUSIVE, Some(KPF_KSM), true, true), Merged);
        assert_eq!(
            kind(PRESENT | EXCLUSIVE, Some(KPF_ANON), true, true),
            frame(false, false)
        );
        // Private file mapping: page cache is not a candidate, COWed pages
        // are.
        assert_eq!(kind(PRESENT | FILE, None, false, false), NotCandidate);
        assert_eq!(
            kind(PRESENT | EXCLUSIVE, None, false, false),
            frame(true, false)
        );
        assert_eq!(
            kind(PRESENT, Some(KPF_ANON), false, false),
            frame(false, true)
        );
    }

    #[test]
    fn frame_set_remembers_each_frame_once() {
        let mut s = FrameSet::default();
        let firsts: Vec<bool> = [0u64, 63, 64, 5, 63, 0, 64]
            .iter()
            .map(|&p| s.insert(p))
            .collect();
        assert_eq!(firsts, [true, true, true, true, false, false, false]);
        let mut s = FrameSet::default();
        assert!(s.insert(1 << 22));
        assert!(!s.insert(1 << 22));
        assert!(s.insert((1 << 22) + 1));
        assert!(s.insert(0));
        assert!(!s.insert(0));
    }
}
