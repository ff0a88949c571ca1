//! Sampled `pagesift scan` (the default mode): estimate, within a time or
//! CPU budget, how much merging every duplicate would save, per region,
//! per process and in total, with 95 % confidence intervals.
//!
//! ## How a scan runs, before the code
//!
//! 1. **Discover** the processes the filter selects and their mergeable
//!    VMAs ([`LinuxSource`], one region per VMA).
//! 2. **Census, exactly and without touching a page.** For every VMA,
//!    `PAGEMAP_SCAN` finds the present runs (zero-page runs and page-cache
//!    runs are counted and skipped), pagemap gives each present page's PFN
//!    and whether it is mapped exclusively, and `/proc/kpageflags` is read
//!    only for pages that are not exclusive (the zero page and KSM pages
//!    never are; measured here: ≈155 ns per page for pagemap plus
//!    kpageflags, 36 ns for PAGEMAP_SCAN). Size, present, zero and
//!    merged counts are therefore exact. A frame mapped by several
//!    processes (shared after fork, or a KSM page) is one *unit*, owned by
//!    its first mapper in (pid, address) order; every other present page is
//!    a unit of its own. Units are the population the sample is drawn from.
//! 3. **Sample with the ladder** ([`crate::stats::estimate::Sampler`]):
//!    cells are 16 MiB chunks of a VMA; chunks of VMAs with the same start
//!    and length in different processes (a fork family) form one stratum.
//!    A pilot round reads every stratum lightly, the ladder moves strata
//!    whose sampled duplication ratio is at least V_dup up a level (denser
//!    reading, the top level reads everything), and budget left over goes
//!    where it cuts the variance most. Units are read in permanent-random-
//!    number order, coordinated by page offset across VMAs, in batches
//!    (`process_vm_readv`, or `/proc/PID/mem` for shared pages, through
//!    [`LinuxSource::read_pages`], which re-checks presence first: nothing
//!    is ever faulted in or unshared).
//! 4. **Group contents** with the progressive partial hash (UKSM §6.2) at
//!    the strength controller's starting strength (64 words), and the
//!    sample index ([`SampleIndex`], stable set: one representative per
//!    content). A hash hit is a candidate only: its full-page xxh3-64 (kept
//!    per representative, 8 bytes) must match, and then the bytes, against
//!    a bounded cache of representatives' contents or the representative
//!    re-read. The xxh3 filter matters on real memory: mostly-zero pages
//!    that differ outside the 64 words the partial hash reads share a
//!    bucket, and without it every such candidate cost a re-read (4 reads
//!    per sampled page in a system-wide scan of this machine). A scan of
//!    two seconds has too few rounds for the strength controller to settle,
//!    so the strength stays at its starting point.
//! 5. **Estimate** ([`Sampler::estimate`]) and build the [`Report`]. If the
//!    budget covered every unit, every unit was read: the report says so
//!    (`exhaustive`) and every interval has zero width.
//!
//! The budget is wall time from the start of the scan (discovery and
//! census included), or a CPU share over a window: the scan then paces
//! itself so its thread uses at most that share of one CPU. Page costs
//! are measured as the scan goes and turned into page budgets per round,
//! with time set aside for the estimation; a round that turns out dearer
//! than planned is shrunk evenly over its cells. If discovery and census
//! alone use up the budget, nothing is sampled and the intervals span
//! every frame: the scan never reads blind.

use crate::report::{
    Class, Counts, Estimate, Mode, ProcessReport, RegionReport, Report, ScanError,
};
use crate::stats::estimate::{
    CellSpec, DomainEstimate, Estimates, Interval, Outcome, RoundKind, Sampler, SamplerConfig, Unit,
};
use pagesift_core::pipeline::hash::{PartialHasher, Shifts};
use pagesift_core::pipeline::index::{IndexConfig, SampleIndex};
use pagesift_core::pipeline::strength::StrengthConfig;
use pagesift_core::source::MemorySource;
use pagesift_core::{PageRef, PageWords, RegionId, WORDS_PER_PAGE};
use pagesift_linux::kpageflags::{KPageFlags, KpfFlags};
use pagesift_linux::pagemap::{Pagemap, PagemapEntry, category};
use pagesift_linux::{LinuxError, LinuxSource, PageBuffer, ProcessFilter, SourceConfig};
use serde::Serialize;
use std::collections::{HashMap, HashSet};
use std::fmt;
use std::hash::BuildHasherDefault;
use std::str::FromStr;
use std::time::{Duration, Instant};

/// The default budget: 2 s of wall time.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(2);

/// Window of a CPU-share budget given without one (`--budget 10%`).
pub const DEFAULT_SHARE_WINDOW: Duration = Duration::from_secs(20);

/// Pages per cell: a VMA is estimated in 16 MiB chunks, so the ladder can
/// tell a duplicate-rich part of a large VMA from the rest.
pub const CHUNK_PAGES: u32 = 4096;

/// Representatives' contents kept for verification (64 MiB); past that a
/// hash hit re-reads the representative from its process.
const CACHE_PAGES: usize = 16_384;

/// Pages read per batch (one `process_vm_readv` takes up to IOV_MAX = 1024
/// iovecs).
const BATCH_PAGES: usize = 1024;

/// Pagemap entries read per `pread` in the census.
const CENSUS_CHUNK: usize = 8192;

/// First guess of the cost of one sampled page (read, presence re-check,
/// hash, index), in ns, until measured (it only sizes the pilot):
/// a pinned read alone measured ≈0.5 µs and a `/proc/PID/mem` read
/// ≈0.8 µs; whole sampled pages measured 2–5 µs on
/// the shared development machine.
const FIRST_PAGE_NS: f64 = 2_000.0;

/// Time reserved per sampled page for computing the estimates and the
/// report (measured ≈ 0.12 µs per sample with 66 k samples on the
/// development machine, `examples/bench_sampled.rs`; rounded up).
const ESTIMATE_NS_PER_SAMPLE: f64 = 200.0;

/// Share of the budget kept back from page reads for slack.
const SAFETY: f64 = 0.95;

/// V_dup of UKSM §5.2 (10 %): a region whose saving is surely above this
/// share of its frames is statically duplicated, one surely below it
/// sparse.
const CLASS_DUP: f64 = 0.10;

/// How much a sampled scan may spend.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Budget {
    /// Wall time from the start of the scan.
    Time(Duration),
    /// At most `share` of one CPU, over at most `window` of wall time.
    CpuShare { share: f64, window: Duration },
}

impl Default for Budget {
    fn default() -> Self {
        Budget::Time(DEFAULT_BUDGET)
    }
}

impl Budget {
    /// The wall time the scan may take.
    pub fn wall(&self) -> Duration {
        match *self {
            Budget::Time(d) => d,
            Budget::CpuShare { window, .. } => window,
        }
    }

    fn validate(&self) -> Result<(), ScanError> {
        let bad = |reason: String| ScanError::InvalidOption {
            key: "budget",
            reason,
        };
        match *self {
            Budget::Time(d) if d.is_zero() => Err(bad("must be more than 0 s".into())),
            Budget::CpuShare { share, window } => {
                if !(share > 0.0 && share <= 1.0) {
                    Err(bad(format!(
                        "a CPU share must be in (0 %, 100 %], got {}",
                        share * 100.0
                    )))
                } else if window.is_zero() {
                    Err(bad("the window of a CPU share must be more than 0 s".into()))
                } else {
                    Ok(())
                }
            }
            _ => Ok(()),
        }
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    let (num, scale) = if let Some(n) = s.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        return None;
    };
    let v: f64 = num.trim().parse().ok()?;
    (v.is_finite() && v >= 0.0).then(|| Duration::from_secs_f64(v * scale))
}

impl FromStr for Budget {
    type Err = String;

    /// `2s`, `500ms`, `1.5s`, `1m`: wall time. `10%`: a tenth of one CPU
    /// for at most 20 s; `10%/30s`: the same for at most 30 s.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let budget = if let Some((share, rest)) = s.split_once('%') {
            let share: f64 = share
                .trim()
                .parse()
                .map_err(|_| format!("{s:?}: the CPU share is not a number"))?;
            let window = match rest.trim().strip_prefix('/') {
                None if rest.trim().is_empty() => DEFAULT_SHARE_WINDOW,
                Some(w) => parse_duration(w)
                    .ok_or_else(|| format!("{s:?}: the window must be like 30s or 500ms"))?,
                None => return Err(format!("{s:?}: expected P% or P%/WINDOW")),
            };
            Budget::CpuShare {
                share: share / 100.0,
                window,
            }
        } else {
            Budget::Time(parse_duration(s).ok_or_else(|| {
                format!("{s:?}: expected a duration (2s, 500ms) or a CPU share (10%, 10%/30s)")
            })?)
        };
        budget.validate().map_err(|e| e.to_string())?;
        Ok(budget)
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Budget::Time(d) => write!(f, "{}ms", d.as_millis()),
            Budget::CpuShare { share, window } => {
                write!(f, "{}%/{}ms", share * 100.0, window.as_millis())
            }
        }
    }
}

/// Everything a sampled scan needs.
#[derive(Clone, Debug)]
pub struct SampledOptions {
    /// Which processes.
    pub filter: ProcessFilter,
    /// How much to spend.
    pub budget: Budget,
    /// Fixes the sample (permanent random numbers, ladder choices): the
    /// same seed on unchanged memory draws the same pages.
    pub seed: u64,
    /// The sampler's settings (ladder, pilot share, minimum per cell).
    pub sampler: SamplerConfig,
}

impl Default for SampledOptions {
    fn default() -> Self {
        SampledOptions {
            filter: ProcessFilter::all(),
            budget: Budget::default(),
            seed: 0x7061_6765_7369_6674,
            sampler: SamplerConfig::default(),
        }
    }
}

/// The budget's clock: wall time, or this thread's CPU time.
struct Clock {
    budget: Budget,
    start: Instant,
    cpu0: Duration,
}

fn thread_cpu() -> Duration {
    Duration::from_nanos(pagesift_linux::host::thread_cpu_ns())
}

impl Clock {
    fn new(budget: Budget) -> Clock {
        Clock {
            budget,
            start: Instant::now(),
            cpu0: thread_cpu(),
        }
    }

    fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }

    /// What page costs are measured in: wall time, or CPU time.
    fn spent(&self) -> Duration {
        match self.budget {
            Budget::Time(_) => self.elapsed(),
            Budget::CpuShare { .. } => thread_cpu().saturating_sub(self.cpu0),
        }
    }

    /// Budget left, in the unit of [`spent`](Self::spent).
    fn left(&self) -> Duration {
        match self.budget {
            Budget::Time(d) => d.saturating_sub(self.elapsed()),
            Budget::CpuShare { share, window } => {
                let cpu_left = window.mul_f64(share).saturating_sub(self.spent());
                let wall_left = window.saturating_sub(self.elapsed()).mul_f64(share);
                cpu_left.min(wall_left)
            }
        }
    }

    fn expired(&self) -> bool {
        self.left().is_zero()
    }

    /// Sleeps while the CPU used runs ahead of the share.
    fn pace(&self) {
        if let Budget::CpuShare { share, window } = self.budget {
            let ahead = self.spent().div_f64(share).saturating_sub(self.elapsed());
            let room = window.saturating_sub(self.elapsed());
            if !ahead.is_zero() {
                std::thread::sleep(ahead.min(room));
            }
        }
    }
}

/// A VMA as the census found it.
#[derive(Clone, Debug)]
struct RegionCensus {
    id: RegionId,
    pid: u32,
    start: u64,
    pages: u32,
    name: String,
    present: u64,
    zero: u64,
    merged: u64,
    /// Page indices of its units (frames it owns), ascending.
    units: Vec<u32>,
    /// The KSM frames among them, ascending.
    ksm: Vec<u32>,
    /// Representatives re-read for verification, and how many had changed.
    rechecked: u64,
    changed: u64,
}

/// Census of every selected VMA: exact page classes, frames deduplicated
/// by PFN (module header, step 2). Processes that vanish are returned.
fn census(src: &LinuxSource) -> Result<(Vec<RegionCensus>, Vec<u32>), ScanError> {
    let mut flags = KPageFlags::open()?;
    let mut seen_pfns: HashSet<u64, BuildHasherDefault<PfnHasher>> = HashSet::default();
    let mut out = Vec::new();
    let mut gone = Vec::new();
    let mut pids: Vec<u32> = src.processes().map(|p| p.pid).collect();
    pids.sort_unstable();
    let mut entries = vec![PagemapEntry(0); CENSUS_CHUNK];
    let mut pending: Vec<(u32, u64)> = Vec::new();
    let mut pfns: Vec<u64> = Vec::new();
    let mut kpf: Vec<KpfFlags> = Vec::new();
    for pid in pids {
        let pagemap = match Pagemap::open(pid) {
            Ok(p) => p,
            Err(e) if e.is_gone() || matches!(e, LinuxError::NoSuchProcess(_)) => {
                gone.push(pid);
                continue;
            }
            Err(e) => return Err(e.into()),
        };
        let mut regions: Vec<_> = src.linux_regions().filter(|r| r.pid == pid).collect();
        regions.sort_by_key(|r| r.start);
        let mut mine = Vec::new();
        let result: Result<(), LinuxError> = (|| {
            for r in regions {
                let end = r.start + u64::from(r.pages) * pagesift_linux::PAGE_SIZE;
                let mut rc = RegionCensus {
                    id: r.id,
                    pid,
                    start: r.start,
                    pages: r.pages,
                    name: region_name(r),
                    present: 0,
                    zero: 0,
                    merged: 0,
                    units: Vec::new(),
                    ksm: Vec::new(),
                    rechecked: 0,
                    changed: 0,
                };
                // Present runs first: a sparse VMA costs its runs, not its
                // length.
                let runs = if r.pages > 512 {
                    match pagemap.present_runs(r.start, end) {
                        Ok(v) => v
                            .into_iter()
                            .map(|x| (x.start, x.end, x.categories))
                            .collect(),
                        Err(LinuxError::Unsupported(_)) => vec![(r.start, end, 0)],
                        Err(e) => return Err(e),
                    }
                } else {
                    vec![(r.start, end, 0)]
                };
                for (a, b, cat) in runs {
                    let n = (b - a) / pagesift_linux::PAGE_SIZE;
                    // PAGEMAP_SCAN put zero-page mappings in runs of their
                    // own; outside VM_MERGEABLE there are no KSM pages, so
                    // a shared page there is an ordinary frame.
                    let plain = cat & category::PRESENT != 0 && !r.mergeable;
                    if cat & category::PFNZERO != 0 {
                        rc.present += n;
                        rc.zero += n;
                        continue;
                    }
                    if cat & category::FILE != 0 {
                        continue; // page cache: KSM never merges it
                    }
                    let mut at = a;
                    while at < b {
                        let k = (((b - at) / pagesift_linux::PAGE_SIZE) as usize).min(CENSUS_CHUNK);
                        pagemap.read(at, &mut entries[..k])?;
                        let first = ((at - r.start) / pagesift_linux::PAGE_SIZE) as u32;
                        pending.clear();
                        for (i, e) in entries[..k].iter().enumerate() {
                            if !e.present() || e.swapped() || e.file_or_shared() {
                                continue;
                            }
                            rc.present += 1;
                            let page = first + i as u32;
                            // KSM pages and the zero page are never
                            // exclusive, and KSM pages live only in
                            // VM_MERGEABLE VMAs: only the rest needs flags.
                            if e.exclusive() && !r.mergeable {
                                rc.units.push(page);
                            } else if let Some(pfn) = e.pfn() {
                                if !plain {
                                    pending.push((page, pfn));
                                } else if seen_pfns.insert(pfn) {
                                    rc.units.push(page);
                                }
                            }
                        }
                        if !pending.is_empty() {
                            pfns.clear();
                            pfns.extend(pending.iter().map(|p| p.1));
                            kpf.clear();
                            kpf.resize(pfns.len(), KpfFlags(0));
                            flags.read_many(&pfns, &mut kpf)?;
                            for (&(page, pfn), f) in pending.iter().zip(&kpf) {
                                if f.zero_page() {
                                    rc.zero += 1;
                                    continue;
                                }
                                if f.ksm() {
                                    rc.merged += 1;
                                }
                                if seen_pfns.insert(pfn) {
                                    rc.units.push(page);
                                    if f.ksm() {
                                        rc.ksm.push(page);
                                    }
                                }
                            }
                            // Units must stay ascending.
                            rc.units.sort_unstable();
                        }
                        at += k as u64 * pagesift_linux::PAGE_SIZE;
                    }
                }
                mine.push(rc);
            }
            Ok(())
        })();
        match result {
            Ok(()) => out.append(&mut mine),
            Err(e) if e.is_gone() => gone.push(pid),
            Err(e) => return Err(e.into()),
        }
    }
    Ok((out, gone))
}

/// Hashes a PFN for the census's set of shared frames (a multiply-shift
/// hash: PFNs are integers, SipHash would cost more than the pagemap
/// read per page).
#[derive(Default)]
struct PfnHasher(u64);

impl std::hash::Hasher for PfnHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }
    fn write_u64(&mut self, x: u64) {
        self.0 = (x ^ (x >> 29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

fn region_name(r: &pagesift_linux::source::LinuxRegion) -> String {
    match &r.path {
        Some(p) => p.display().to_string(),
        None => "[anon]".to_string(),
    }
}

/// Reads units, groups their contents, and keeps the statistics.
struct Reader {
    hasher: PartialHasher,
    strength: u32,
    index: SampleIndex,
    /// Representative page → content group.
    rep_group: HashMap<PageRef, u32>,
    /// Per group: its representative's region (census index) and partial
    /// hash. The index keeps its full-page xxh3-64 (the filter that spares
    /// re-reads).
    reps: Vec<(u32, u32)>,
    cache: HashMap<u32, Box<PageWords>>,
    buf: PageBuffer,
    other: Box<PageWords>,
    refs: Vec<PageRef>,
    pages_read: u64,
}

impl Reader {
    fn new(seed: u64, units: u64) -> Reader {
        let mut index = SampleIndex::new(IndexConfig::default());
        index.set_tracked_pages(units);
        Reader {
            hasher: PartialHasher::new(seed, Shifts::RELEASED),
            strength: StrengthConfig::default().initial,
            index,
            rep_group: HashMap::new(),
            reps: Vec::new(),
            cache: HashMap::new(),
            buf: PageBuffer::new(BATCH_PAGES),
            other: Box::new([0; WORDS_PER_PAGE]),
            refs: Vec::with_capacity(BATCH_PAGES),
            pages_read: 0,
        }
    }

    /// Reads `units` and records each outcome in `sampler`.
    fn read_batch(
        &mut self,
        src: &mut LinuxSource,
        regions: &mut [RegionCensus],
        cell_region: &[u32],
        units: &[Unit],
        sampler: &mut Sampler,
    ) {
        for chunk in units.chunks(BATCH_PAGES) {
            self.refs.clear();
            self.refs.extend(chunk.iter().map(|u| PageRef {
                region: regions[cell_region[u.cell as usize] as usize].id,
                page: u.key,
            }));
            let mut i = 0;
            while i < chunk.len() {
                let got =
                    src.read_pages(&self.refs[i..], &mut self.buf.pages_mut()[i..chunk.len()]);
                self.pages_read += got as u64;
                for k in i..i + got {
                    let ri = cell_region[chunk[k].cell as usize];
                    let group = self.group_of(src, regions, k, ri);
                    let merged = regions[ri as usize]
                        .ksm
                        .binary_search(&chunk[k].key)
                        .is_ok();
                    sampler.record(chunk[k], Outcome::Content { group, merged });
                }
                i += got;
                if i < chunk.len() {
                    // Freed, unmapped or its process exited since the census.
                    sampler.record(chunk[i], Outcome::Failed);
                    i += 1;
                }
            }
        }
    }

    /// The content group of the page in `buf[k]` (region `ri`), verified
    /// byte for byte; a new group if no representative matches.
    fn group_of(
        &mut self,
        src: &mut LinuxSource,
        regions: &mut [RegionCensus],
        k: usize,
        ri: u32,
    ) -> u32 {
        let Reader {
            hasher,
            strength,
            index,
            rep_group,
            reps,
            cache,
            buf,
            other,
            refs,
            pages_read,
        } = self;
        let page = &buf.pages()[k];
        let hash = hasher.hash(page, *strength);
        // Real memory has many pages that differ only outside the words a
        // partial hash reads (mostly-zero pages): they share a bucket. A
        // full-page xxh3 rejects those candidates without re-reading them.
        let strong = crate::exact::page_hash(page);
        let found = index.find_stable(hash, |cand, cand_strong| {
            if cand_strong != strong {
                return false;
            }
            let Some(&g) = rep_group.get(&cand) else {
                return false;
            };
            let (rep_region, rep_hash) = reps[g as usize];
            if let Some(c) = cache.get(&g) {
                return **c == *page;
            }
            *pages_read += 1;
            if src.read_page(cand, other).is_err() {
                return false;
            }
            let rc = &mut regions[rep_region as usize];
            rc.rechecked += 1;
            if hasher.hash(other, *strength) != rep_hash {
                rc.changed += 1;
            }
            let same = **other == *page;
            if same && cache.len() < CACHE_PAGES {
                cache.insert(g, Box::new(**other));
            }
            same
        });
        match found {
            Some(rep) => rep_group[&rep],
            None => {
                let g = reps.len() as u32;
                let me = refs[k];
                reps.push((ri, hash));
                rep_group.insert(me, g);
                index.insert_stable(hash, me, strong);
                g
            }
        }
    }
}

/// Where a sampled scan's time went (for benchmarks and `--verbose`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ScanStats {
    /// Finding processes and their VMAs.
    pub discovery: Duration,
    /// Page maps and frame flags of every VMA.
    pub census: Duration,
    /// Reading, hashing and grouping the sample.
    pub sampling: Duration,
    /// Computing the estimates and the report.
    pub estimation: Duration,
    /// Units (frames) in the population.
    pub units: u64,
    /// Units read.
    pub sampled: u64,
    /// Units that could not be read (freed, unmapped or exited since the
    /// census): they left the population.
    pub failed: u64,
    /// Sampling rounds, in order: pilot, climbs, allocations, or one
    /// complete read.
    pub rounds: Vec<RoundKind>,
    /// Measured cost of one sampled page, in the budget's unit (wall or
    /// CPU time), ns.
    pub page_ns: f64,
}

/// Runs a sampled scan (module header). Read-only: targets' memory,
/// mappings and KSM state are never changed, and only present pages are
/// read.
///
/// Errors: a missing capability (named), a pid that does not exist,
/// pagesift's own pid, a bad option. Processes that exit during the scan
/// are left out of the report and counted in `gone`.
pub fn run(opts: &SampledOptions) -> Result<Report, ScanError> {
    run_with_stats(opts).map(|(r, _)| r)
}

/// [`run`], also saying where the time went.
pub fn run_with_stats(opts: &SampledOptions) -> Result<(Report, ScanStats), ScanError> {
    opts.budget.validate()?;
    opts.sampler
        .validate()
        .map_err(|reason| ScanError::InvalidOption {
            key: "sampler",
            reason,
        })?;
    let cpu0 = pagesift_linux::host::process_cpu_ns();
    let clock = Clock::new(opts.budget);
    let mut src = LinuxSource::new(
        opts.filter.clone(),
        SourceConfig {
            max_region_pages: u32::MAX,
            private_file: true,
            max_regions: usize::MAX,
        },
    )?;
    let mut stats = ScanStats {
        discovery: clock.elapsed(),
        ..ScanStats::default()
    };
    let (mut regions, mut gone) = census(&src)?;
    stats.census = clock.elapsed() - stats.discovery;

    // Cells: 16 MiB chunks of each VMA; strata: the same chunk of VMAs with
    // the same start and length (aligned copies, e.g. a fork family).
    let mut strata: HashMap<(u64, u32, u32), u32> = HashMap::new();
    let mut cells = Vec::new();
    let mut cell_region = Vec::new();
    for (ri, r) in regions.iter().enumerate() {
        for part in r.units.chunk_by(|a, b| a / CHUNK_PAGES == b / CHUNK_PAGES) {
            let chunk = part[0] / CHUNK_PAGES;
            let next = strata.len() as u32;
            let stratum = *strata.entry((r.start, r.pages, chunk)).or_insert(next);
            cells.push(CellSpec {
                region: ri as u32,
                owner: r.pid,
                stratum,
                keys: part.to_vec(),
            });
            cell_region.push(ri as u32);
        }
    }
    let mut sampler = Sampler::new(cells, opts.sampler.clone(), opts.seed);
    let mut reader = Reader::new(opts.seed, sampler.units());

    // Rounds until the budget or the population runs out.
    let mut read_cost = Duration::ZERO;
    let mut read_units = 0u64;
    let mut batch = Vec::with_capacity(BATCH_PAGES);
    // Pages the rest of the budget buys at the cost measured so far, with
    // the estimation's own time set aside.
    let affordable = |clock: &Clock, cost: Duration, units: u64, sampled: u64| -> u64 {
        let per_page = if units > 0 {
            cost.as_nanos() as f64 / units as f64
        } else {
            FIRST_PAGE_NS
        };
        let left =
            clock.left().as_nanos() as f64 * SAFETY - ESTIMATE_NS_PER_SAMPLE * sampled as f64;
        (left / (per_page + ESTIMATE_NS_PER_SAMPLE)).max(0.0) as u64
    };
    'rounds: loop {
        let pages = affordable(&clock, read_cost, read_units, sampler.sampled());
        let planned = sampler.plan_round(pages);
        if let (true, Some(kind)) = (planned > 0, sampler.last_round()) {
            stats.rounds.push(kind);
        }
        if planned == 0 {
            break;
        }
        // The round's share of what the budget buys; if pages turn out
        // dearer than planned, the round shrinks to keep that share.
        let share = (planned as f64 / pages.max(1) as f64).min(1.0);
        loop {
            batch.clear();
            if sampler.next_batch(BATCH_PAGES, &mut batch) == 0 {
                break;
            }
            let t0 = clock.spent();
            reader.read_batch(&mut src, &mut regions, &cell_region, &batch, &mut sampler);
            read_cost += clock.spent().saturating_sub(t0);
            read_units += batch.len() as u64;
            if clock.expired() {
                sampler.end_round(clock.elapsed().as_nanos() as u64);
                break 'rounds;
            }
            clock.pace();
            let now_affordable = affordable(&clock, read_cost, read_units, sampler.sampled());
            sampler.shrink_round((now_affordable as f64 * share) as u64);
        }
        sampler.end_round(clock.elapsed().as_nanos() as u64);
    }

    // Processes that exited are reported as gone, not estimated.
    for &pid in src.gone() {
        if !gone.contains(&pid) {
            gone.push(pid);
        }
    }
    let sampled_at = clock.elapsed();
    stats.sampling = sampled_at - stats.discovery - stats.census;
    stats.units = sampler.units();
    stats.sampled = sampler.sampled();

    stats.page_ns = read_cost.as_nanos() as f64 / read_units.max(1) as f64;
    sampler.remove_owners(&gone);
    let est = sampler.estimate();
    stats.failed = est.failed;
    let mut report = build_report(opts, &clock, &src, &regions, &gone, &est, reader.pages_read);
    report.cpu_ms = (pagesift_linux::host::process_cpu_ns() - cpu0) / 1_000_000;
    stats.estimation = clock.elapsed() - sampled_at;
    Ok((report, stats))
}

fn to_estimate(i: Interval) -> Estimate {
    Estimate {
        value: i.value,
        low: i.low,
        high: i.high,
    }
}

fn counts(size: u64, present: u64, zero: u64, merged: u64, d: &DomainEstimate) -> Counts {
    Counts {
        size_pages: size,
        present,
        zero,
        merged,
        dup_in_region: to_estimate(d.dup_in_region),
        dup_in_process: to_estimate(d.dup_in_process),
        dup_across: to_estimate(d.dup_across),
        saving: to_estimate(d.saving),
    }
}

/// A region's class, when its interval is clear about it: changing if most
/// representatives re-read during the scan had changed, statically
/// duplicated if its saving is surely at least V_dup of its frames, sparse
/// if surely below.
fn classify(r: &RegionCensus, d: &DomainEstimate) -> Option<Class> {
    if r.rechecked >= 4 && 2 * r.changed >= r.rechecked {
        return Some(Class::Changing);
    }
    let frames = d.frames as f64;
    if frames == 0.0 {
        None
    } else if d.saving.low >= CLASS_DUP * frames {
        Some(Class::StaticallyDuplicated)
    } else if d.saving.high < CLASS_DUP * frames {
        Some(Class::Sparse)
    } else {
        None
    }
}

fn build_report(
    opts: &SampledOptions,
    clock: &Clock,
    src: &LinuxSource,
    regions: &[RegionCensus],
    gone: &[u32],
    est: &Estimates,
    pages_read: u64,
) -> Report {
    let zero = DomainEstimate::zero();
    let comm: HashMap<u32, String> = src.processes().map(|p| (p.pid, p.comm.clone())).collect();
    let mut procs: Vec<ProcessReport> = Vec::new();
    let mut by_pid: HashMap<u32, usize> = HashMap::new();
    let (mut size, mut present, mut zeros, mut merged) = (0, 0, 0, 0);
    for (ri, r) in regions.iter().enumerate() {
        if gone.contains(&r.pid) {
            continue;
        }
        let d = est.regions.get(ri).unwrap_or(&zero);
        let report = RegionReport {
            start: r.start,
            end: r.start + u64::from(r.pages) * pagesift_linux::PAGE_SIZE,
            name: r.name.clone(),
            counts: counts(u64::from(r.pages), r.present, r.zero, r.merged, d),
            class: classify(r, d),
        };
        size += u64::from(r.pages);
        present += r.present;
        zeros += r.zero;
        merged += r.merged;
        let i = *by_pid.entry(r.pid).or_insert_with(|| {
            procs.push(ProcessReport {
                pid: r.pid,
                comm: comm.get(&r.pid).cloned().unwrap_or_default(),
                counts: counts(0, 0, 0, 0, &zero),
                regions: Vec::new(),
            });
            procs.len() - 1
        });
        let p = &mut procs[i];
        p.counts.size_pages += report.counts.size_pages;
        p.counts.present += report.counts.present;
        p.counts.zero += report.counts.zero;
        p.counts.merged += report.counts.merged;
        p.regions.push(report);
    }
    for p in &mut procs {
        if let Ok(i) = est.owners.binary_search_by_key(&p.pid, |o| o.0) {
            let c = counts(
                p.counts.size_pages,
                p.counts.present,
                p.counts.zero,
                p.counts.merged,
                &est.owners[i].1,
            );
            p.counts = c;
        }
        p.regions
            .sort_by(|a, b| b.counts.saving.value.total_cmp(&a.counts.saving.value));
    }
    procs.sort_by(|a, b| b.counts.saving.value.total_cmp(&a.counts.saving.value));
    Report {
        mode: Mode::Sampled {
            budget_ms: opts.budget.wall().as_millis() as u64,
            sampled_pages: est.sampled,
            seed: opts.seed,
            exhaustive: est.exhaustive,
        },
        processes: procs,
        totals: counts(size, present, zeros, merged, &est.total),
        skipped: src.skipped().to_vec(),
        gone: gone.len() as u64,
        elapsed_ms: clock.elapsed().as_millis() as u64,
        cpu_ms: 0, // set by the caller, which started the clock
        pages_read,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_and_name_what_is_wrong() {
        assert_eq!("2s".parse(), Ok(Budget::Time(Duration::from_secs(2))));
        assert_eq!(
            "250ms".parse(),
            Ok(Budget::Time(Duration::from_millis(250)))
        );
        assert_eq!(
            "1.5s".parse(),
            Ok(Budget::Time(Duration::from_millis(1500)))
        );
        assert_eq!(
            "10%".parse(),
            Ok(Budget::CpuShare {
                share: 0.1,
                window: DEFAULT_SHARE_WINDOW
            })
        );
        assert_eq!(
            "5%/30s".parse(),
            Ok(Budget::CpuShare {
                share: 0.05,
                window: Duration::from_secs(30)
            })
        );
        for bad in ["", "2", "fast", "0s", "150%", "0%", "10%/x", "10%30s"] {
            let e = bad.parse::<Budget>().unwrap_err();
            assert!(e.contains("budget") || e.contains(bad), "{bad}: {e}");
        }
        assert_eq!(Budget::default().to_string(), "2000ms");
    }

    #[test]
    fn a_cpu_share_clock_paces_itself() {
        let clock = Clock::new(Budget::CpuShare {
            share: 0.5,
            window: Duration::from_secs(10),
        });
        // Burn ~20 ms of CPU, then pacing must sleep about as long.
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(20) {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        clock.pace();
        let cpu = clock.spent();
        assert!(
            clock.elapsed() >= cpu.mul_f64(1.9),
            "{:?} vs {cpu:?}",
            clock.elapsed()
        );
        assert!(clock.left() <= Duration::from_secs(5));
    }
}
