//! What `pagesift status` shows, and how it gets there.
//!
//! A thread serves the status on a unix socket: a client connects, the
//! server asks the loop for a fresh [`Status`] snapshot
//! ([`crate::snapshots`]: built on request, since building one is linear in
//! the number of regions), writes it as one JSON document and closes the
//! connection. The socket is
//! created with mode 0600 (it names processes and addresses) and removed
//! when the daemon stops; a stale socket left by a crashed daemon is
//! replaced, a live one (another daemon answers) is an error.
//!
//! [`render`] turns a snapshot into the human table; `--json` prints the
//! document as received.

use crate::snapshots::{FRESH_WAIT, Snapshots};
use pagesift_core::pipeline::savings::{Breakdown, Savings};
use pagesift_core::text::printable;
use serde::{Deserialize, Serialize};
use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A region in the status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RegionStatus {
    /// Region id.
    pub id: u64,
    /// Owning process.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// First address.
    pub start: u64,
    /// Length in pages.
    pub pages: u32,
    /// Mapped file or pseudo-path.
    pub name: Option<String>,
    /// Ladder level (absent while ksmd merges a promoted region).
    pub level: Option<usize>,
    /// sampling, merging (promoted, ksmd at work), promoted (merging
    /// settled), held (unmarked for thrashing), foreign (made mergeable by
    /// its process).
    pub state: String,
    /// Pages merged (KSM or zero page) at the last accounting pass.
    pub merged_pages: u64,
    /// COW breaks counted since the region was first seen.
    pub cow_breaks: u64,
    /// Seconds since the region was first seen.
    pub age_s: f64,
    /// Duplication ratio at its last judgement.
    pub dup_ratio: f64,
}

/// One ladder level.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LevelStatus {
    /// 0 = bottom.
    pub level: usize,
    /// CPU share (fraction of one core).
    pub cpu_share: f64,
    /// Round time, ms.
    pub round_time_ms: u64,
    /// Regions on it.
    pub region_count: u64,
    /// Pages on it.
    pub pages: u64,
    /// Its regions, largest first (at most [`MAX_LISTED`]).
    pub regions: Vec<RegionStatus>,
}

/// Consecutive wake-ups whose work the cap could not keep within one
/// wake-up a second before [`DaemonStatus::cap_unmet`] says so: ten
/// seconds at least, so a one-off costly wake-up (a refresh of many
/// maps) does not.
pub const CAP_UNMET_WAKES: u32 = 10;

/// Regions listed per level at most (the counts cover all).
pub const MAX_LISTED: usize = 200;

/// Totals.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Totals {
    /// Eligible processes.
    pub processes: u64,
    /// Regions tracked.
    pub regions: u64,
    /// Regions pagesift made mergeable.
    pub promoted_regions: u64,
    /// Their pages.
    pub promoted_pages: u64,
    /// Of those, regions ksmd is still merging.
    pub merging_regions: u64,
    /// Regions held back: unmarked for thrashing, or not promoted because
    /// their watched writes would make them thrash.
    pub held_regions: u64,
    /// Regions made mergeable by their own process.
    pub foreign_regions: u64,
    /// Bytes marked mergeable by pagesift.
    pub marked_bytes: u64,
    /// Pages merged in promoted and foreign regions (last pass of each).
    pub merged_pages: u64,
    /// COW breaks counted per region, summed.
    pub cow_breaks: u64,
    /// MADV_MERGEABLE calls that succeeded.
    pub marks: u64,
    /// Of the marks, those of duplicate runs inside regions that did not
    /// climb (the rest are whole regions that reached the top level).
    #[serde(default)]
    pub run_marks: u64,
    /// Regions marked around the zones their watched writes landed in
    /// (their pieces are counted in `run_marks`).
    #[serde(default)]
    pub partial_marks: u64,
    /// Times a merged region climbed back with new duplicates and ksmd was
    /// sent to merge it again.
    #[serde(default)]
    pub remerges: u64,
    /// Stretches of settled regions that ksmd left unmerged, unmarked so
    /// that its full scans skip them (`actuate.trim_min_pages`).
    #[serde(default)]
    pub trims: u64,
    /// Pages in those stretches.
    #[serde(default)]
    pub trimmed_pages: u64,
    /// Times `/proc/vmstat` `cow_ksm` rose by more COW breaks than the
    /// accounting passes had seen, and settled regions were passed over
    /// again at once.
    #[serde(default)]
    pub unseen_break_alarms: u64,
    /// Regions mapped again where their process's last region of their
    /// size was marked, raised to the top level on that evidence.
    #[serde(default)]
    pub raised_on_history: u64,
    /// MADV_UNMERGEABLE calls that succeeded.
    pub unmarks: u64,
    /// Candidate ranges whose writes are being watched (userfaultfd
    /// write-protection, `actuate.write_tracking`).
    #[serde(default)]
    pub write_tracked_ranges: u64,
    /// Injection batches (one attach each).
    pub batches: u64,
    /// VMA splits caused by marking parts of VMAs.
    pub vma_splits: u64,
    /// Regions of eligible processes not tracked at the last refresh:
    /// there were more than `scan.max_regions` (the smallest are left out).
    #[serde(default)]
    pub regions_left_out: u64,
    /// Pages sampled.
    pub sampled_pages: u64,
    /// Wake-ups.
    pub wakes: u64,
    /// Global sampling rounds.
    pub global_rounds: u64,
}

/// ksmd.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct KsmStatus {
    /// KSM pages in use.
    pub pages_shared: u64,
    /// Pages saved (further mappings).
    pub pages_sharing: u64,
    /// Completed passes.
    pub full_scans: u64,
    /// ksmd's CPU share over the last seconds.
    pub cpu_share: f64,
    /// ksmd's CPU seconds since the daemon started.
    pub cpu_seconds: f64,
    /// Share asked for.
    pub target_share: f64,
    /// `pages_to_scan` in force.
    pub pages_to_scan: u64,
    /// `sleep_millisecs` in force.
    pub sleep_ms: u64,
    /// Share of the pacer's last tick ksmd spent waiting for a CPU
    /// (runnable, not running): the machine was too busy to give it its
    /// pace.
    #[serde(default)]
    pub wait_share: f64,
    /// `/proc/vmstat` cow_ksm since the daemon started (global cross-check
    /// of the per-region COW breaks).
    pub cow_ksm: Option<u64>,
}

/// The daemon's own CPU.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DaemonStatus {
    /// pid.
    pub pid: u32,
    /// Seconds since start.
    pub uptime_s: f64,
    /// CPU share over the last seconds (all threads).
    pub cpu_share: f64,
    /// The CPU cap in force (`scan.cpu_cap`, or the governor's), as a
    /// fraction of one core.
    #[serde(default)]
    pub cpu_cap: f64,
    /// Whether the cap is out of reach: the last [`CAP_UNMET_WAKES`]
    /// wake-ups each cost more than one wake-up a second (the longest
    /// sleep, UKSM's) can keep under the cap, so the daemon uses more.
    #[serde(default)]
    pub cap_unmet: bool,
    /// CPU seconds since start.
    pub cpu_seconds: f64,
    /// Per-page sampling cost the budgets assume, ns.
    pub per_page_ns: f64,
    /// Hash strength.
    pub strength: u32,
    /// Config file in use, if any.
    pub config: Option<String>,
    /// The exact sweep's figures.
    #[serde(default)]
    pub sweep: crate::sweep::SweepStats,
    /// The main thread's CPU seconds since start, per phase of the wake-up
    /// (refresh, distil, sweep, ...; see the loop's module header), so an
    /// operator sees what the daemon's CPU goes to.
    #[serde(default)]
    pub cpu_by_phase: std::collections::BTreeMap<String, f64>,
    /// CPU seconds since start per live thread, by name (`main` is the
    /// wake-up loop, whose phases are above; `pagesift-tracer` injects
    /// marks into targets; `status` and `metrics` serve). Threads of one
    /// name are summed; a thread that has exited is not listed.
    #[serde(default)]
    pub cpu_by_thread: std::collections::BTreeMap<String, f64>,
    /// The sample index (`core::pipeline::index`): what it holds and the
    /// memory it takes, the daemon's largest allocation.
    #[serde(default)]
    pub index: IndexStatus,
}

/// The sample index's size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexStatus {
    /// Pages in the stable set: known duplicates, kept across rounds
    /// (those of regions marked and merging too, as twins for later
    /// hints).
    pub stable: u64,
    /// Pages in the unstable set, emptied every global round.
    pub unstable: u64,
    /// Heap bytes the index holds (capacity, not only entries).
    pub heap_bytes: u64,
}

/// A process pagesift does not actuate, and why.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// pid.
    pub pid: u32,
    /// Command name, when known.
    pub comm: String,
    /// Why.
    pub reason: String,
}

/// How the eligible processes' regions were read since start: from
/// `/proc/PID/maps` (per VMA) or from `/proc/PID/smaps` (a walk of every
/// present page of the process), and why (`pagesift_linux::discover::SmapsReason`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct DiscoveryStatus {
    /// Reads from maps.
    pub maps_reads: u64,
    /// Reads from smaps, all reasons.
    pub smaps_reads: u64,
    /// Reads from smaps by reason (`mergeable_recheck`, `userfaultfd`, ...).
    pub smaps_by_reason: std::collections::BTreeMap<String, u64>,
    /// The live processes most read from smaps, most first (at most
    /// [`MAX_LISTED`]).
    pub smaps_processes: Vec<SmapsProcess>,
}

/// A live process whose regions were read from smaps.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SmapsProcess {
    /// Its pid.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Its reads from smaps.
    pub reads: u64,
    /// Why the last one was made.
    pub last_reason: String,
}

/// Everything `pagesift status` shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    /// The governor.
    pub governor: String,
    /// The levels and their regions.
    pub levels: Vec<LevelStatus>,
    /// Regions by pages merged, most first.
    pub top_regions: Vec<RegionStatus>,
    /// Regions held out of the ladder (thrashing, or written too often to
    /// mark), largest first: not sampled until their hold ends.
    #[serde(default)]
    pub held_regions: Vec<RegionStatus>,
    /// Totals.
    pub totals: Totals,
    /// ksmd.
    pub ksm: KsmStatus,
    /// The daemon.
    pub daemon: DaemonStatus,
    /// Processes skipped, and why.
    pub skipped: Vec<Skipped>,
    /// Host page-cache scrubbing, when enabled.
    #[serde(default)]
    pub scrub: Option<crate::scrub::ScrubStatus>,
    /// I/O hints.
    #[serde(default)]
    pub hints: HintsStatus,
    /// NUMA placement of merged pages (hosts with several nodes only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub numa: Option<crate::numa::NumaStatus>,
    /// What each cgroup and the top processes save (`[savings]`).
    #[serde(default)]
    pub savings: Breakdown,
    /// How the processes' regions were read (maps or smaps, and why).
    #[serde(default)]
    pub discovery: DiscoveryStatus,
}

/// I/O hints (XLH): where they come from and what became of them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HintsStatus {
    /// `on`, `off` (configured so) or `unavailable`.
    pub state: String,
    /// Why hints are unavailable: names what is missing.
    pub reason: Option<String>,
    /// Where the BPF program is attached (`fexit`, `tp_btf/sys_exit`).
    #[serde(default)]
    pub hook: Option<String>,
    /// Syscall events received from the BPF program.
    pub events: u64,
    /// Hinted pages received (whole pages of those buffers).
    pub received: u64,
    /// Hinted pages of tracked, unmerged regions pushed on the stack.
    pub pushed: u64,
    /// Hinted pages outside any region the loop knows.
    pub untracked: u64,
    /// Hinted pages of regions already mergeable (promoted or foreign):
    /// ksmd scans them anyway.
    #[serde(default)]
    pub mergeable: u64,
    /// Pages written out to a file from regions held for their writes: not
    /// pushed (a buffer a process writes from is what the hold is about).
    #[serde(default)]
    pub held_writes: u64,
    /// Events the kernel dropped because the ring was full.
    pub dropped_ring: u64,
    /// Calls covering a whole page on something other than file data (pipes,
    /// sockets, procfs and sysfs files, ...) that the program left
    /// unhinted.
    #[serde(default)]
    pub not_file_data: u64,
    /// Calls that filled the same pages as their process's last call (a
    /// buffer reused call after call) that the program left unhinted.
    #[serde(default)]
    pub repeated: u64,
    /// Hints dropped as stale (older than the maximum age, or than the
    /// ladder's pass over the bottom level).
    pub dropped_stale: u64,
    /// Hints dropped because their page left every region (unmapped
    /// before it was looked up).
    #[serde(default)]
    pub dropped_unmapped: u64,
    /// Hints overwritten in the full stack (the oldest go first).
    pub overwritten: u64,
    /// Hints looked up by the distiller.
    pub sampled: u64,
    /// Hinted pages found duplicated (verified).
    pub duplicates: u64,
    /// Pages marked mergeable in runs found from hints (both sides).
    pub pages_marked: u64,
    /// The stack's capacity and current length.
    pub capacity: u64,
    pub stacked: u64,
    /// The oldest hint used, in ms, now.
    pub max_age_ms: u64,
    /// CPU per hint from the ring to the stack (drain, map, push), in ns.
    pub per_hint_ns: f64,
}

/// Whether `path` can become the status socket: `Ok(false)` if nothing is
/// there, `Ok(true)` if a stale socket is (nobody listens: it may be
/// replaced), an error naming the path and the reason if a daemon listens
/// on it or it is anything but a socket (a regular file, a link, a
/// directory), which is never deleted.
pub fn check_socket_path(path: &Path) -> std::io::Result<bool> {
    match std::fs::symlink_metadata(path) {
        Ok(meta) if !meta.file_type().is_socket() => Err(std::io::Error::new(
            std::io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket ({}): refusing to replace it; \
                 remove it or choose another --socket",
                path.display(),
                file_kind(&meta.file_type())
            ),
        )),
        Ok(_) if UnixStream::connect(path).is_ok() => Err(std::io::Error::new(
            std::io::ErrorKind::AddrInUse,
            format!(
                "{} is in use: another pagesift daemon is running",
                path.display()
            ),
        )),
        Ok(_) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// What a file that is not a socket is, for the error.
fn file_kind(t: &std::fs::FileType) -> &'static str {
    if t.is_symlink() {
        "a symbolic link"
    } else if t.is_dir() {
        "a directory"
    } else if t.is_file() {
        "a regular file"
    } else {
        "a special file"
    }
}

/// The status socket. Dropping it stops serving and removes the socket.
pub struct StatusServer {
    path: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
    /// The listener the thread accepts on, to wake it on drop.
    waker: Option<UnixListener>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl StatusServer {
    /// Binds `path` (replacing a stale socket, refusing a live one and
    /// anything that is not a socket) and serves fresh snapshots of
    /// `snapshots` from a thread. The socket file is created with mode
    /// 0600, never looser.
    pub fn start(path: &Path, snapshots: Arc<Snapshots>) -> std::io::Result<StatusServer> {
        if check_socket_path(path)? {
            // A stale socket (its daemon died): ours to replace.
            std::fs::remove_file(path)?;
        }
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir)?;
        }
        let listener = pagesift_linux::secure::bind_unix_listener(path, 0o600)?;
        let waker = listener.try_clone().ok();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("status".into())
            .spawn(move || serve(listener, snapshots, stop2))?;
        Ok(StatusServer {
            path: path.to_path_buf(),
            stop,
            waker,
            thread: Some(thread),
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        // The thread blocks in accept. Shutting the listener down wakes it
        // even when the socket's path is gone (its directory was removed
        // under us); a connection is the fallback should that fail.
        let woken = self
            .waker
            .as_ref()
            .is_some_and(|l| pagesift_linux::secure::stop_accepting(l).is_ok());
        if !woken {
            let _ = UnixStream::connect(&self.path);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn serve(
    listener: UnixListener,
    snapshots: Arc<Snapshots>,
    stop: Arc<std::sync::atomic::AtomicBool>,
) {
    // A blocking accept: an idle daemon's status thread costs nothing.
    while !stop.load(std::sync::atomic::Ordering::SeqCst) {
        match listener.accept() {
            Ok((mut conn, _)) => {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let _ = conn.set_write_timeout(Some(Duration::from_secs(2)));
                let snap = snapshots.fresh(FRESH_WAIT);
                let body = match snap {
                    Some(s) => {
                        serde_json::to_string(&*s).unwrap_or_else(|e| error_json(&e.to_string()))
                    }
                    None => error_json("the daemon is starting; no status yet"),
                };
                let _ = conn.write_all(body.as_bytes());
                let _ = conn.write_all(b"\n");
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn error_json(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

/// Why `pagesift status` could not get a status.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// Nothing listens on the socket.
    #[error(
        "no pagesift daemon is listening on {path}: {source} (is `pagesift run` running, with the same --socket?)"
    )]
    NotRunning {
        /// The socket.
        path: PathBuf,
        /// The connect error.
        source: std::io::Error,
    },
    /// The daemon answered something unexpected.
    #[error("bad answer from the daemon on {path}: {reason}")]
    BadAnswer {
        /// The socket.
        path: PathBuf,
        /// What was wrong.
        reason: String,
    },
}

/// Asks the daemon on `path`; returns the JSON text and the parsed status.
pub fn query(path: &Path) -> Result<(String, Status), QueryError> {
    let mut conn = UnixStream::connect(path).map_err(|source| QueryError::NotRunning {
        path: path.to_path_buf(),
        source,
    })?;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let mut text = String::new();
    conn.read_to_string(&mut text)
        .map_err(|e| QueryError::BadAnswer {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| QueryError::BadAnswer {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if let Some(msg) = v.get("error").and_then(|m| m.as_str()) {
        return Err(QueryError::BadAnswer {
            path: path.to_path_buf(),
            reason: msg.to_string(),
        });
    }
    let status: Status = serde_json::from_value(v).map_err(|e| QueryError::BadAnswer {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok((text.trim_end().to_string(), status))
}

fn mib(pages: u64) -> f64 {
    pages as f64 * 4096.0 / (1 << 20) as f64
}

fn region_line(r: &RegionStatus) -> String {
    format!(
        "  {:>6}  {:>7}  {:<15}  {:#014x}  {:>9.1}  {:>5}  {:<9}  {:>10.1}  {:>8}  {:>7.1}  {}",
        r.id,
        r.pid,
        printable(&r.comm),
        r.start,
        mib(r.pages as u64),
        r.level.map_or("-".to_string(), |l| l.to_string()),
        r.state,
        mib(r.merged_pages),
        r.cow_breaks,
        r.age_s,
        printable(r.name.as_deref().unwrap_or(""))
    )
}

/// MiB of a signed byte count (a profit can be negative).
fn mib_signed(bytes: i64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// `name value` pairs, the largest first (ties by name); floats with two
/// decimals (CPU-seconds), integers as they are (counts).
fn largest_first<T: Copy + PartialOrd + std::fmt::Display>(
    m: &std::collections::BTreeMap<String, T>,
) -> String {
    let mut v: Vec<(&String, &T)> = m.iter().collect();
    v.sort_by(|a, b| {
        (b.1.partial_cmp(a.1))
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(a.0.cmp(b.0))
    });
    let list: Vec<String> = v.iter().map(|(name, s)| format!("{name} {s:.2}")).collect();
    list.join(", ")
}

/// The discovery line: how often the processes' regions were read from
/// maps and from smaps, why, and the processes read from smaps most (the
/// first five). Nothing before the first read.
fn render_discovery(d: &DiscoveryStatus) -> String {
    if d.maps_reads + d.smaps_reads == 0 {
        return String::new();
    }
    let mut line = format!(
        "regions read: {} times from maps, {} from smaps",
        d.maps_reads, d.smaps_reads
    );
    if d.smaps_reads > 0 {
        line.push_str(&format!(" ({})", largest_first(&d.smaps_by_reason)));
        let most: Vec<String> = (d.smaps_processes.iter().take(5))
            .map(|p| {
                format!(
                    "{} ({}) {}× (last: {})",
                    printable(&p.comm),
                    p.pid,
                    p.reads,
                    p.last_reason
                )
            })
            .collect();
        if !most.is_empty() {
            line.push_str(&format!("; most: {}", most.join(", ")));
        }
    }
    line.push('\n');
    line
}

/// The savings per cgroup and per process: one line each, then `other`
/// for what the limits summed.
fn render_savings(b: &Breakdown) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let figures = |s: &Savings| {
        format!(
            "{:>10.1}  {:>10.1}  {:>8}",
            mib(s.merged_pages),
            mib_signed(s.saved_bytes),
            s.cow_breaks
        )
    };
    let _ = writeln!(
        o,
        "\nsavings per cgroup (cgroup paths cut to depth {}; merged and saved as the kernel counts them per process):",
        b.cgroup_depth
    );
    let _ = writeln!(
        o,
        "  {:<40}  {:>5}  merged MiB   saved MiB  COW brks",
        "cgroup", "procs"
    );
    let mut cgroup_line = |name: &str, processes: u64, s: &Savings| {
        let _ = writeln!(o, "  {name:<40}  {processes:>5}  {}", figures(s));
    };
    for c in &b.cgroups.top {
        cgroup_line(&printable(&c.cgroup), c.processes, &c.savings);
    }
    if let Some(r) = &b.cgroups.rest {
        cgroup_line(
            &format!("other ({} cgroups)", r.entries),
            r.processes,
            &r.savings,
        );
    }
    if b.processes.top.is_empty() && b.processes.rest.is_none() {
        return o;
    }
    let _ = writeln!(o, "\ntop processes by saving:");
    let _ = writeln!(
        o,
        "  {:>7}  {:<15}  merged MiB   saved MiB  COW brks  cgroup",
        "pid", "comm"
    );
    for p in &b.processes.top {
        let _ = writeln!(
            o,
            "  {:>7}  {:<15}  {}  {}",
            p.pid,
            printable(&p.comm),
            figures(&p.savings),
            printable(&p.cgroup)
        );
    }
    if let Some(r) = &b.processes.rest {
        let _ = writeln!(
            o,
            "  {:>7}  {:<15}  {}",
            "other",
            format!("({} processes)", r.entries),
            figures(&r.savings)
        );
    }
    o
}

const REGION_HEADER: &str = "  region      pid  comm             start            size MiB  level  state      merged MiB  COW brks    age s  name";

/// The human view of a status.
pub fn render(s: &Status) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let t = &s.totals;
    let d = &s.daemon;
    let k = &s.ksm;
    let _ = writeln!(
        o,
        "pagesift daemon pid {}, up {:.0} s, governor {}{}",
        d.pid,
        d.uptime_s,
        s.governor,
        d.config
            .as_ref()
            .map(|c| format!(", config {c}"))
            .unwrap_or_default()
    );
    let _ = writeln!(
        o,
        "saved: {} pages merged ({:.1} MiB) in {} promoted + {} foreign regions; {} COW breaks (cow_ksm {})",
        t.merged_pages,
        mib(t.merged_pages),
        t.promoted_regions,
        t.foreign_regions,
        t.cow_breaks,
        k.cow_ksm.map_or("n/a".into(), |c| c.to_string())
    );
    let _ = writeln!(
        o,
        "promoted: {} regions ({:.1} MiB), {} still merging, {} held back; {} marks, {} unmarks in {} injection batches, {} VMA splits; {} ranges write-tracked",
        t.promoted_regions,
        mib(t.promoted_pages),
        t.merging_regions,
        t.held_regions,
        t.marks,
        t.unmarks,
        t.batches,
        t.vma_splits,
        t.write_tracked_ranges
    );
    if t.regions_left_out > 0 {
        let _ = writeln!(
            o,
            "left out: {} regions of eligible processes, the smallest, above scan.max_regions",
            t.regions_left_out
        );
    }
    let _ = writeln!(
        o,
        "CPU: daemon {:.2} % ({:.1} s; cap {}), ksmd {:.2} % ({:.1} s) of one core; ksmd target {:.2} %, pages_to_scan {}, sleep {} ms, waited for a CPU {:.1} % of the time",
        d.cpu_share * 100.0,
        d.cpu_seconds,
        if d.cap_unmet {
            format!(
                "{:.3} %, out of reach: a wake-up a second costs more",
                d.cpu_cap * 100.0
            )
        } else {
            format!("{:.3} %", d.cpu_cap * 100.0)
        },
        k.cpu_share * 100.0,
        k.cpu_seconds,
        k.target_share * 100.0,
        k.pages_to_scan,
        k.sleep_ms,
        k.wait_share * 100.0
    );
    let _ = writeln!(
        o,
        "KSM: {} shared, {} sharing, {} full scans; sampling: {} pages in {} wake-ups, {} global rounds, strength {}, {:.0} ns/page",
        k.pages_shared,
        k.pages_sharing,
        k.full_scans,
        t.sampled_pages,
        t.wakes,
        t.global_rounds,
        d.strength,
        d.per_page_ns
    );
    let _ = writeln!(
        o,
        "Sample index: {} stable + {} unstable pages, {:.1} MiB",
        d.index.stable,
        d.index.unstable,
        d.index.heap_bytes as f64 / (1 << 20) as f64
    );
    for (what, cpu) in [("phase", &d.cpu_by_phase), ("thread", &d.cpu_by_thread)] {
        if !cpu.is_empty() {
            let _ = writeln!(o, "daemon CPU-s by {what}: {}", largest_first(cpu));
        }
    }
    let w = &d.sweep;
    let _ = writeln!(
        o,
        "sweep: {} epochs (last {:.1} s), {} pages hashed of {} walked, {:.0} ns/page walked, {:.2} CPU-s; {} regions raised, {} duplicate runs found; {} regions checked by fingerprint, {} of them unchanged",
        w.epochs,
        w.last_epoch_ns as f64 / 1e9,
        w.pages_hashed,
        w.pages_walked,
        w.cpu_ns as f64 / w.pages_walked.max(1) as f64,
        w.cpu_ns as f64 / 1e9,
        w.raised,
        w.runs,
        w.probed,
        w.probed_unchanged
    );
    o.push_str(&render_discovery(&s.discovery));
    o.push_str(&render_savings(&s.savings));
    let _ = writeln!(
        o,
        "\nlevels ({} processes, {} regions):",
        t.processes, t.regions
    );
    let _ = writeln!(o, "  level  CPU share  round ms  regions    size MiB");
    for l in s.levels.iter().rev() {
        let _ = writeln!(
            o,
            "  {:>5}  {:>8.2} %  {:>8}  {:>7}  {:>10.1}",
            l.level,
            l.cpu_share * 100.0,
            l.round_time_ms,
            l.region_count,
            mib(l.pages)
        );
    }
    if !s.top_regions.is_empty() {
        let _ = writeln!(o, "\ntop regions by saving:");
        let _ = writeln!(o, "{REGION_HEADER}");
        for r in &s.top_regions {
            let _ = writeln!(o, "{}", region_line(r));
        }
    }
    if !s.held_regions.is_empty() {
        let _ = writeln!(
            o,
            "\nheld regions (not sampled until their hold ends; {} in all):",
            t.held_regions
        );
        let _ = writeln!(o, "{REGION_HEADER}");
        for r in &s.held_regions {
            let _ = writeln!(o, "{}", region_line(r));
        }
    }
    let upper: Vec<&LevelStatus> = s
        .levels
        .iter()
        .filter(|l| l.level > 0 && l.region_count > 0)
        .collect();
    if !upper.is_empty() {
        let _ = writeln!(o, "\nregions above the bottom level:");
        let _ = writeln!(o, "{REGION_HEADER}");
        for l in upper.iter().rev() {
            for r in l.regions.iter().take(20) {
                let _ = writeln!(o, "{}", region_line(r));
            }
        }
    }
    if !s.skipped.is_empty() {
        let _ = writeln!(o, "\nprocesses skipped:");
        for p in &s.skipped {
            let _ = writeln!(
                o,
                "  {:>7}  {:<15}  {}",
                p.pid,
                printable(&p.comm),
                printable(&p.reason)
            );
        }
    }
    let h = &s.hints;
    let _ = match h.state.as_str() {
        "on" => writeln!(
            o,
            "\nI/O hints: on ({}): {} syscall events, {} pages hinted, {} stacked for sampling, {} found duplicated, {} pages marked from them; {} events lost to a full ring; {} calls on no file data and {} repeats of a reused buffer left out",
            h.hook.as_deref().unwrap_or("?"),
            h.events,
            h.received,
            h.pushed,
            h.duplicates,
            h.pages_marked,
            h.dropped_ring,
            h.not_file_data,
            h.repeated
        ),
        "off" => writeln!(o, "\nI/O hints: off ([hints] enabled = false)"),
        "unavailable" => writeln!(
            o,
            "\nI/O hints: unavailable: {}",
            printable(h.reason.as_deref().unwrap_or("no reason given"))
        ),
        _ => writeln!(o, "\nI/O hints: starting"),
    };
    if let Some(n) = &s.numa {
        o.push_str(&crate::numa::render(n));
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshots::testing::Answering;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::Mutex;

    fn sample() -> Status {
        let r = RegionStatus {
            id: 3,
            pid: 42,
            comm: "qemu".into(),
            start: 0x7f00_0000_0000,
            pages: 16384,
            name: Some("[heap]".into()),
            level: None,
            state: "promoted".into(),
            merged_pages: 16000,
            cow_breaks: 2,
            age_s: 12.0,
            dup_ratio: 0.9,
        };
        Status {
            governor: "full".into(),
            levels: vec![
                LevelStatus {
                    level: 0,
                    cpu_share: 0.002,
                    round_time_ms: 1000,
                    region_count: 1,
                    pages: 16384,
                    regions: vec![],
                },
                LevelStatus {
                    level: 1,
                    cpu_share: 0.004,
                    round_time_ms: 500,
                    region_count: 1,
                    pages: 16384,
                    regions: vec![r.clone()],
                },
            ],
            top_regions: vec![r.clone()],
            held_regions: vec![RegionStatus {
                id: 9,
                state: "held".into(),
                comm: "writer".into(),
                ..r
            }],
            totals: Totals {
                merged_pages: 16000,
                promoted_regions: 1,
                held_regions: 1,
                ..Totals::default()
            },
            skipped: vec![Skipped {
                pid: 7,
                comm: "strace".into(),
                reason: "already traced".into(),
            }],
            savings: sample_savings(),
            ..Status::default()
        }
    }

    fn sample_savings() -> Breakdown {
        use pagesift_core::pipeline::savings::{CgroupSavings, ProcessSavings, Ranked, Rest};
        let vm = Savings {
            merged_pages: 16000,
            saved_bytes: 65_000_000,
            cow_breaks: 2,
        };
        Breakdown {
            cgroup_depth: 2,
            cgroups: Ranked {
                top: vec![CgroupSavings {
                    cgroup: "/machine.slice/vm1.scope".into(),
                    processes: 1,
                    savings: vm,
                }],
                rest: Some(Rest {
                    entries: 3,
                    processes: 4,
                    savings: Savings {
                        saved_bytes: -4096,
                        ..Savings::default()
                    },
                }),
            },
            processes: Ranked {
                top: vec![ProcessSavings {
                    pid: 42,
                    comm: "qemu".into(),
                    cgroup: "/machine.slice/vm1.scope".into(),
                    savings: vm,
                }],
                rest: Some(Rest {
                    entries: 4,
                    processes: 4,
                    savings: Savings::default(),
                }),
            },
            total: vm,
        }
    }

    #[test]
    fn the_text_says_why_regions_were_read_from_smaps_and_for_whom() {
        let mut s = sample();
        assert!(!render(&s).contains("regions read:"), "nothing read yet");
        s.discovery = DiscoveryStatus {
            maps_reads: 340,
            smaps_reads: 12,
            smaps_by_reason: [
                ("mergeable_recheck".to_string(), 2),
                ("userfaultfd".to_string(), 10),
            ]
            .into_iter()
            .collect(),
            smaps_processes: vec![SmapsProcess {
                pid: 4242,
                comm: "qemu\x1b[2J".into(),
                reads: 10,
                last_reason: "userfaultfd".into(),
            }],
        };
        let t = render(&s);
        let line = t
            .lines()
            .find(|l| l.starts_with("regions read:"))
            .expect(&t);
        assert_eq!(
            line,
            "regions read: 340 times from maps, 12 from smaps (userfaultfd 10, mergeable_recheck 2); \
             most: qemu\\x1b[2J (4242) 10× (last: userfaultfd)"
        );
        let back: Status = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back.discovery, s.discovery);
    }

    #[test]
    fn names_chosen_by_processes_are_escaped_in_the_table() {
        let mut s = sample();
        let evil = "x\x1b]0;owned\x07\x1b[2J\r\u{202e}";
        s.top_regions[0].comm = evil.into();
        s.top_regions[0].name = Some(format!("/tmp/{evil}\nfake line"));
        s.levels[1].regions[0].comm = evil.into();
        s.skipped[0].comm = evil.into();
        s.savings.cgroups.top[0].cgroup = format!("/{evil}");
        s.savings.processes.top[0].comm = evil.into();
        s.savings.processes.top[0].cgroup = format!("/{evil}");
        let t = render(&s);
        assert!(
            t.chars()
                .all(|c| c == '\n' || !(c.is_control() || c == '\u{202e}')),
            "{t:?}"
        );
        assert!(t.contains("x\\x1b]0;owned\\x07"), "{t}");
        assert!(t.contains("/tmp/x\\x1b"), "{t}");
        assert!(t.contains("\\x0afake line"), "{t}");
        assert_eq!(t.lines().count(), render(&sample()).lines().count());
    }

    #[test]
    fn the_text_says_where_hints_come_from_or_why_not() {
        let mut s = sample();
        s.hints.state = "on".into();
        s.hints.hook = Some("tp_btf/sys_exit".into());
        s.hints.events = 96;
        s.hints.received = 6144;
        let t = render(&s);
        assert!(
            t.contains("I/O hints: on (tp_btf/sys_exit): 96 syscall events, 6144 pages hinted"),
            "{t}"
        );
        s.hints.state = "unavailable".into();
        s.hints.reason = Some("missing capability CAP_BPF".into());
        assert!(
            render(&s).contains("I/O hints: unavailable: missing capability CAP_BPF"),
            "{}",
            render(&s)
        );
    }

    #[test]
    fn the_table_shows_the_numbers() {
        let t = render(&sample());
        assert!(t.contains("16000 pages merged (62.5 MiB)"), "{t}");
        assert!(t.contains("qemu"), "{t}");
        assert!(
            t.contains("held regions (not sampled until their hold ends; 1 in all)"),
            "{t}"
        );
        assert!(t.contains("writer"), "{t}");
        assert!(t.contains("already traced"), "{t}");
        assert!(t.contains("governor full"), "{t}");
        // Savings: the cgroup line, the summed rest, the top process.
        assert!(t.contains("cut to depth 2"), "{t}");
        let vm = t
            .lines()
            .find(|l| l.trim_start().starts_with("/machine.slice/vm1.scope"))
            .unwrap_or_else(|| panic!("no cgroup line in\n{t}"));
        assert_eq!(
            vm.split_whitespace().collect::<Vec<_>>(),
            ["/machine.slice/vm1.scope", "1", "62.5", "62.0", "2"],
            "{t}"
        );
        assert!(t.contains("other (3 cgroups)"), "{t}");
        assert!(
            t.lines()
                .any(|l| l.contains("42  qemu") && l.ends_with("/machine.slice/vm1.scope")),
            "{t}"
        );
        assert!(t.contains("(4 processes)"), "{t}");
        // Where the daemon's CPU went, the largest first.
        let mut s = sample();
        s.daemon.cpu_by_thread = [
            ("main".to_string(), 2.0),
            ("pagesift-tracer".to_string(), 0.5),
        ]
        .into_iter()
        .collect();
        let t = render(&s);
        assert!(
            t.contains("daemon CPU-s by thread: main 2.00, pagesift-tracer 0.50"),
            "{t}"
        );
    }

    #[test]
    fn a_status_round_trips_through_the_socket() {
        let dir = std::env::temp_dir().join(format!("pagesift-status-{}", std::process::id()));
        let path = dir.join("s.sock");
        // No snapshot yet (a loop that does not answer): a clear error.
        let mute = Answering::start(Arc::new(Mutex::new(None)));
        let server = StatusServer::start(&path, mute.snapshots.clone()).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let e = query(&path).unwrap_err();
        assert!(e.to_string().contains("starting"), "{e}");
        drop(server);
        drop(mute);
        // A loop that answers: its snapshot is what the client gets, and
        // each query asks for one.
        let answering = Answering::start(Arc::new(Mutex::new(Some(sample()))));
        let snaps = answering.snapshots.clone();
        let server = StatusServer::start(&path, snaps.clone()).unwrap();
        let (text, got) = query(&path).unwrap();
        assert_eq!(got, sample());
        assert!(text.starts_with('{'));
        let _ = query(&path).unwrap();
        assert_eq!(snaps.generation(), 2, "one snapshot per query");
        // A second daemon cannot take the socket.
        let again = StatusServer::start(&path, snaps.clone());
        assert!(again.is_err());
        drop(server);
        drop(answering);
        assert!(!path.exists(), "the socket is removed on stop");
        let e = query(&path).unwrap_err();
        assert!(matches!(e, QueryError::NotRunning { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_file_that_is_not_a_socket_is_refused_and_kept() {
        let dir = std::env::temp_dir().join(format!("pagesift-notsock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (shared, _bell) = Snapshots::new().unwrap();
        let file = dir.join("precious.txt");
        std::fs::write(&file, "do not delete").unwrap();
        let e = StatusServer::start(&file, shared.clone())
            .err()
            .expect("a regular file taken as the socket");
        let msg = e.to_string();
        assert!(
            msg.contains(&file.display().to_string())
                && msg.contains("not a socket (a regular file)")
                && msg.contains("refusing to replace it"),
            "{msg}"
        );
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "do not delete");
        // A symbolic link (even to a socket path) and a directory too.
        let link = dir.join("link.sock");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let e = StatusServer::start(&link, shared.clone()).err().unwrap();
        assert!(e.to_string().contains("a symbolic link"), "{e}");
        assert!(std::fs::symlink_metadata(&link).is_ok());
        let e = StatusServer::start(&dir, shared).err().unwrap();
        assert!(e.to_string().contains("a directory"), "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "do not delete");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_stale_socket_is_replaced() {
        let dir = std::env::temp_dir().join(format!("pagesift-stale-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        drop(UnixListener::bind(&path).unwrap()); // leaves the file, nobody listens
        assert!(path.exists());
        let answering = Answering::start(Arc::new(Mutex::new(Some(sample()))));
        let server = StatusServer::start(&path, answering.snapshots.clone()).unwrap();
        assert!(query(&path).is_ok());
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The daemon stops even when its socket's directory was removed while
    /// it ran (a test's temporary directory, an operator's cleanup): the
    /// status thread used to wait in `accept` forever.
    #[test]
    fn the_server_stops_after_its_directory_is_gone() {
        let dir = std::env::temp_dir().join(format!("pagesift-gone-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.sock");
        let (snaps, _bell) = Snapshots::new().unwrap();
        let server = StatusServer::start(&path, snaps).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(server);
            let _ = tx.send(());
        });
        rx.recv_timeout(Duration::from_secs(10))
            .expect("the status server stopped");
    }
}
