//! NUMA placement of merged pages (nuKSM on a stock kernel).
//!
//! ksmd picks which copy of a page survives a merge; pagesift then moves
//! the surviving frame to the node `pagesift_core::pipeline::placement` chooses
//! (fair: the active copy, ties spread evenly; priority: nuShare from
//! nice). Only on a host with more than one node, and only if
//! `[numa] policy` is not `off`; otherwise nothing here runs at all.
//!
//! ## A pass
//! The watched ranges are the ranges pagesift marked in eligible processes
//! plus the regions of eligible processes climbing the ladder's upper
//! levels (about to be marked): a pass reads them at
//! `[numa] scan_pages_per_s` (resuming where the last wake-up stopped)
//! with pagemap + kpageflags and `move_pages` in query mode:
//! - an unmerged present page records its copy: node and whether it is on
//!   the active LRU list (`KPF_ACTIVE`), in a bounded memo keyed by
//!   (pid, address). That is the copy's activity *before* the merge: once
//!   merged, one copy is gone and the survivor's flags say nothing about
//!   the other sharers' use. A copy pagesift itself has read
//!   ([`pagesift_linux::read_record`], turned on with placement) counts as
//!   inactive whatever its flag, unless an earlier pass saw it active
//!   before pagesift read it: a remote read marks the page used, and two
//!   activate it, so the sampler's and the sweep's reads (which reach some
//!   sharers' copies more often than others', e.g. the copy the index
//!   verifies against) would otherwise decide for the process pagesift
//!   happened to read twice. Anonymous pages are activated by their own
//!   process's use only when reclaim scans them, so this loses little;
//!   the status counts such decisions (`activity_discounted`);
//! - a merged (KSM) page records the mapping under its frame number.
//!
//! A process's home node is the node its CPU affinity confines it to, else
//! where most of its unmerged pages are, else where its CPU last ran.
//! When the pass has covered every range, each merged frame whose sharers
//! were not all decided before is decided now (per merged page), from the
//! memo of each sharer's copy: its activity, its process's nice, and its
//! node. The node of a copy of a process bound to one node is that node,
//! its home: the copy stands for the process, and its frame can be
//! elsewhere. (In one run in the two-node guest, 240 of 4120 merged pages
//! had both copies on one node although their processes were bound to
//! different nodes, and were decided as if both sharers lived there: 22 %
//! local where nuShare gives 17 %. The likely way: when a merge ksmd began
//! fails, ksmd breaks it again, and the fault that makes the new copy runs
//! in ksmd, under ksmd's memory policy, not the process's.) For other
//! processes it is the node the copy was on, else the process's home.
//! Then:
//! - a frame with more mappings (`/proc/kpagecount`) than the pass saw has
//!   a sharer outside the eligible set: it is never moved;
//! - a frame not on the chosen node is moved there with
//!   `move_pages(MPOL_MF_MOVE_ALL)`, through the eligible sharer that lives
//!   on the chosen node, within the migration budget
//!   (`[numa] migrate_pages_per_s`). A frame the budget holds back stays
//!   undecided and is tried at the next pass.
//!
//! The status lists merged pages per node and, per process, its home node
//! and how many of its merged pages are there.
//!
//! Invariants: only pages of eligible processes are read or moved; a move
//! never changes contents (the kernel copies the frame while its mappings
//! wait); memory is bounded by [`MEMO_LIMIT`] and [`DECIDED_LIMIT`].

use crate::actuate::ProcKey;
use pagesift_core::Nanos;
use pagesift_core::pipeline::placement::{Copy, MigrationBudget, Node, Placer, Policy, TieRule};
use pagesift_linux::LinuxError;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use tracing::{info, warn};

/// Most unmerged copies remembered (about 24 bytes each: 96 MiB at most).
pub const MEMO_LIMIT: usize = 4 << 20;
/// Most decided mappings remembered.
pub const DECIDED_LIMIT: usize = 4 << 20;

/// `[numa]`: where merged pages live on a NUMA host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NumaSection {
    /// `fair` (the active copy, ties spread evenly), `priority` (nuShare
    /// from nice) or `off` (KSM's choice stands). Only acts on hosts with
    /// more than one node.
    pub policy: NumaPolicy,
    /// How `fair` spreads equal copies: `round-robin` or `1/K`.
    pub tie: TieRule,
    /// Most merged pages moved per second (0: none).
    pub migrate_pages_per_s: u64,
    /// Pages of watched ranges read per second (pagemap, kpageflags and a
    /// node query each, about 0.3 µs a page).
    pub scan_pages_per_s: u64,
    /// Seed of the random choices (`1/K`, `priority`).
    pub seed: u64,
}

/// `[numa] policy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NumaPolicy {
    /// Active copy first, ties spread evenly.
    Fair,
    /// Local to a sharer with probability nuShare.
    Priority,
    /// KSM's placement stands.
    Off,
}

impl Default for NumaSection {
    fn default() -> Self {
        NumaSection {
            policy: NumaPolicy::Fair,
            tie: TieRule::RoundRobin,
            migrate_pages_per_s: 8192,
            scan_pages_per_s: 65536,
            seed: 1,
        }
    }
}

impl NumaSection {
    /// Checks values; the error is (dotted key, reason).
    pub fn validate(&self) -> Result<(), (String, String)> {
        if self.migrate_pages_per_s > 1 << 22 {
            return Err((
                "numa.migrate_pages_per_s".into(),
                format!(
                    "must be at most 4194304 (16 GiB/s), got {}",
                    self.migrate_pages_per_s
                ),
            ));
        }
        if self.scan_pages_per_s == 0 || self.scan_pages_per_s > 1 << 24 {
            return Err((
                "numa.scan_pages_per_s".into(),
                format!(
                    "must be between 1 and 16777216, got {}",
                    self.scan_pages_per_s
                ),
            ));
        }
        Ok(())
    }

    /// The core policy, or `None` when off.
    pub fn core_policy(&self) -> Option<Policy> {
        match self.policy {
            NumaPolicy::Fair => Some(Policy::Fair(self.tie)),
            NumaPolicy::Priority => Some(Policy::Priority),
            NumaPolicy::Off => None,
        }
    }
}

/// One present page of a watched range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageFact {
    /// Its address.
    pub addr: u64,
    /// Its frame.
    pub pfn: u64,
    /// Merged by KSM.
    pub ksm: bool,
    /// On the active LRU list.
    pub active: bool,
    /// pagesift has read it (then its activity may be pagesift's).
    pub read_by_us: bool,
    /// Its node, if `move_pages` could say.
    pub node: Option<Node>,
}

/// What placement needs from the machine.
pub trait NumaHost {
    /// Online nodes.
    fn nodes(&self) -> Vec<Node>;
    /// The present, anonymous pages of `[start, end)` of `pid`.
    fn pages(&mut self, pid: u32, start: u64, end: u64) -> Result<Vec<PageFact>, LinuxError>;
    /// How many mappings each frame has.
    fn map_counts(&mut self, pfns: &[u64]) -> Result<Vec<u64>, LinuxError>;
    /// The nice value of `pid`.
    fn nice(&self, pid: u32) -> Option<i32>;
    /// The node the process's CPU affinity confines it to, if one.
    fn affinity_node(&self, _pid: u32) -> Option<Node> {
        None
    }
    /// The node of the CPU the process last ran on.
    fn cpu_node(&self, _pid: u32) -> Option<Node> {
        None
    }
    /// Drops what is kept about processes that are gone (`eligible` says
    /// which pids are still watched).
    fn forget_gone(&mut self, _eligible: &HashMap<u32, ProcKey>) {}
    /// Moves pages of `pid` to `node`; per page, `Ok` if it is there now,
    /// else why not.
    fn move_to(
        &mut self,
        pid: u32,
        addrs: &[u64],
        node: Node,
    ) -> Result<Vec<Result<(), Refused>>, LinuxError>;
}

/// Why a page did not move.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The kernel took the page but it stayed where it was: its migration
    /// failed (the page was busy, e.g. ksmd or a fault held it).
    Stayed,
    /// The kernel refused the page: this errno.
    Errno(i32),
}

/// The real machine.
pub struct LinuxNumaHost {
    flags: pagesift_linux::kpageflags::KPageFlags,
    counts: pagesift_linux::kpageflags::KPageCount,
}

impl LinuxNumaHost {
    /// Opens `/proc/kpageflags` and `/proc/kpagecount` (needs
    /// `CAP_SYS_ADMIN`).
    pub fn open() -> Result<LinuxNumaHost, LinuxError> {
        Ok(LinuxNumaHost {
            flags: pagesift_linux::kpageflags::KPageFlags::open()?,
            counts: pagesift_linux::kpageflags::KPageCount::open()?,
        })
    }
}

impl NumaHost for LinuxNumaHost {
    fn nodes(&self) -> Vec<Node> {
        pagesift_linux::numa::online_nodes()
    }

    fn pages(&mut self, pid: u32, start: u64, end: u64) -> Result<Vec<PageFact>, LinuxError> {
        use pagesift_linux::pagemap::{Pagemap, PagemapEntry};
        let pm = Pagemap::open(pid)?;
        pm.require_pfns()?;
        let page = pagesift_linux::PAGE_SIZE;
        let mut entries = vec![PagemapEntry::default(); ((end - start) / page) as usize];
        pm.read(start, &mut entries)?;
        let mut out: Vec<PageFact> = entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let pfn = e.pfn().filter(|&p| p != 0 && !e.file_or_shared())?;
                Some(PageFact {
                    addr: start + i as u64 * page,
                    pfn,
                    ksm: false,
                    active: false,
                    read_by_us: false,
                    node: None,
                })
            })
            .collect();
        let pfns: Vec<u64> = out.iter().map(|f| f.pfn).collect();
        let mut flags = vec![pagesift_linux::kpageflags::KpfFlags(0); pfns.len()];
        self.flags.read_many(&pfns, &mut flags)?;
        let addrs: Vec<u64> = out.iter().map(|f| f.addr).collect();
        let nodes = pagesift_linux::numa::page_nodes(pid, &addrs)?;
        for ((f, fl), n) in out.iter_mut().zip(&flags).zip(&nodes) {
            f.ksm = fl.ksm();
            f.active = fl.active();
            f.read_by_us = pagesift_linux::read_record::was_read(pid, f.addr);
            // Zero pages have no node; huge pages are not placed here.
            f.node = n.node().filter(|_| !fl.thp() && !fl.zero_page());
        }
        out.retain(|f| f.node.is_some());
        Ok(out)
    }

    fn map_counts(&mut self, pfns: &[u64]) -> Result<Vec<u64>, LinuxError> {
        let mut out = vec![0; pfns.len()];
        self.counts.read_many(pfns, &mut out)?;
        Ok(out)
    }

    fn forget_gone(&mut self, eligible: &HashMap<u32, ProcKey>) {
        // A process that left the eligible set but lives keeps its marks:
        // the LRU flags pagesift's reads set stay with its pages.
        pagesift_linux::read_record::retain(|pid| {
            eligible.contains_key(&pid) || std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
    }

    fn nice(&self, pid: u32) -> Option<i32> {
        pagesift_linux::numa::nice(pid).ok()
    }

    fn affinity_node(&self, pid: u32) -> Option<Node> {
        pagesift_linux::numa::affinity_node(pid)
    }

    fn cpu_node(&self, pid: u32) -> Option<Node> {
        pagesift_linux::numa::cpu_node(pid)
    }

    fn move_to(
        &mut self,
        pid: u32,
        addrs: &[u64],
        node: Node,
    ) -> Result<Vec<Result<(), Refused>>, LinuxError> {
        use pagesift_linux::numa::PageNode;
        let m = pagesift_linux::numa::move_to_node(pid, addrs, node)?;
        Ok(m.status
            .iter()
            .map(|s| match s {
                PageNode::On(n) if *n == node => Ok(()),
                PageNode::On(_) => Err(Refused::Stayed),
                PageNode::Not(e) => Err(Refused::Errno(*e)),
            })
            .collect())
    }
}

/// A watched range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Watched {
    /// Its process (eligible).
    pub proc: ProcKey,
    /// First address.
    pub start: u64,
    /// End (exclusive).
    pub end: u64,
}

/// The ranges to watch: what pagesift marked in eligible processes, and
/// the regions of eligible processes on the ladder's two upper levels
/// (about to be marked: their copies are read before ksmd merges them).
/// Overlapping ranges of one process are joined, so no page is read twice
/// in a pass.
pub fn watched(
    marks: &crate::actuate::Marks,
    eligible: &HashMap<u32, ProcKey>,
    ladder: &pagesift_core::pipeline::ladder::Ladder,
    span: impl Fn(pagesift_core::RegionId) -> Option<crate::target::Span>,
) -> Vec<Watched> {
    let mut all: Vec<Watched> = Vec::new();
    for key in eligible.values() {
        for (start, end) in marks.ranges(*key) {
            all.push(Watched {
                proc: *key,
                start,
                end,
            });
        }
    }
    let levels = ladder.levels();
    for level in levels.saturating_sub(2).max(1)..levels {
        for id in ladder.regions_at(level) {
            if let Some(sp) = span(id)
                && eligible.get(&sp.proc.pid) == Some(&sp.proc)
            {
                all.push(Watched {
                    proc: sp.proc,
                    start: sp.start,
                    end: sp.end(),
                });
            }
        }
    }
    all.sort();
    let mut out: Vec<Watched> = Vec::with_capacity(all.len());
    for w in all {
        match out.last_mut() {
            Some(last) if last.proc == w.proc && w.start <= last.end => {
                last.end = last.end.max(w.end);
            }
            _ => out.push(w),
        }
    }
    out
}

/// A mapping of a merged frame seen in a pass: (pid, address, node).
type Mapping = (u32, u64, Node);
/// A copy by its place: (pid, address).
type CopyKey = (u32, u64);

/// A merged frame's placement, decided this pass (recorded once its move
/// is done, or at once when it is already on the chosen node).
struct Decision {
    /// Its mappings.
    keys: Vec<CopyKey>,
    /// How many.
    sharers: u16,
    /// The chosen node.
    target: Node,
    /// Every copy was on one node: no choice was made.
    unanimous: bool,
    /// A sharer's copy was never seen unmerged.
    memo_missing: bool,
    /// Some copies were on the active LRU list and some not (the fair
    /// policy's first rule decides then).
    activity_split: bool,
    /// A copy was active but pagesift had read it: taken as inactive.
    activity_discounted: bool,
}

/// One sharer's copy before the merge.
#[derive(Clone, Copy, Debug)]
struct CopyMemo {
    node: Node,
    /// On the active list, and not read by pagesift.
    active: bool,
    /// On the active list, but read by pagesift: not counted as active.
    discounted: bool,
}

/// Placement per process, in the status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NumaProcess {
    /// pid.
    pub pid: u32,
    /// Where most of its unmerged pages are.
    pub home_node: Option<Node>,
    /// Its mappings of merged pages seen in the last pass.
    pub merged_pages: u64,
    /// Of those, on its home node.
    pub local_pages: u64,
}

/// NUMA placement, in the status.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NumaStatus {
    /// `fair`, `priority`.
    pub policy: String,
    /// `round-robin`, `1/k`.
    pub tie: String,
    /// Online nodes.
    pub nodes: u64,
    /// Merged frames per node (index = node), last complete pass.
    pub merged_per_node: Vec<u64>,
    /// Per process.
    pub processes: Vec<NumaProcess>,
    /// Merged pages moved to their chosen node since start.
    pub migrations: u64,
    /// Moves the kernel refused or that failed.
    pub migration_failures: u64,
    /// Failed page moves the kernel refused, by errno.
    #[serde(default)]
    pub failure_errnos: BTreeMap<i32, u64>,
    /// Failed page moves the kernel took but could not complete (the page
    /// was busy, and stayed on its node); tried again at the next pass.
    #[serde(default)]
    pub migrations_stayed: u64,
    /// Merged pages left where they are (that pass) because a sharer was
    /// not seen: not eligible, or merged while the pass ran.
    pub foreign_sharers: u64,
    /// Complete passes.
    pub passes: u64,
    /// Merged pages decided since start, by the node chosen (index =
    /// node): the policy's outcome, whether or not a move was needed.
    #[serde(default)]
    pub decided_per_node: Vec<u64>,
    /// Of those, decided without a choice: every sharer's copy was on one
    /// node.
    #[serde(default)]
    pub unanimous: u64,
    /// Of those, decided with a sharer's copy never seen unmerged (its
    /// process's home node stood in for the copy's node).
    #[serde(default)]
    pub without_memo: u64,
    /// Of those, decided among copies of which some were on the active
    /// LRU list and some not: the fair policy keeps an active copy's node
    /// then, so these are not spread evenly. (Kept to tell, when the
    /// split between nodes is uneven, whether activity did it: the
    /// daemon's own remote reads mark the pages they read accessed.)
    #[serde(default)]
    pub activity_split: u64,
    /// Of those decided, with a copy on the active list that pagesift had
    /// read, whose activity was therefore not counted (it may be
    /// pagesift's own).
    #[serde(default)]
    pub activity_discounted: u64,
}

/// The human view of the placement status (a section of `pagesift
/// status`).
pub fn render(n: &NumaStatus) -> String {
    use std::fmt::Write as _;
    let mut o = String::new();
    let per_node = |counts: &[u64]| -> String {
        let v: Vec<String> = (counts.iter().enumerate())
            .map(|(node, c)| format!("node {node}: {c}"))
            .collect();
        v.join(", ")
    };
    let _ = writeln!(
        o,
        "\nNUMA placement: {} ({}), {} nodes; merged pages {}; {} moved, {} failed, {} left for a sharer not seen (not eligible, or merged mid-pass)",
        n.policy,
        n.tie,
        n.nodes,
        per_node(&n.merged_per_node),
        n.migrations,
        n.migration_failures,
        n.foreign_sharers
    );
    if !n.failure_errnos.is_empty() {
        let e: Vec<String> = n
            .failure_errnos
            .iter()
            .map(|(errno, c)| format!("errno {errno}: {c}"))
            .collect();
        let _ = writeln!(o, "  moves refused by the kernel: {}", e.join(", "));
    }
    if n.migrations_stayed > 0 {
        let _ = writeln!(
            o,
            "  moves that left the page where it was (busy during migration, retried): {}",
            n.migrations_stayed
        );
    }
    if !n.decided_per_node.is_empty() {
        let _ = writeln!(
            o,
            "  decided: {}; {} with every copy on one node, {} with a copy never seen unmerged, {} with only some copies active, {} with an active copy pagesift had read (activity not counted)",
            per_node(&n.decided_per_node),
            n.unanimous,
            n.without_memo,
            n.activity_split,
            n.activity_discounted
        );
    }
    for p in &n.processes {
        let home = p.home_node.map_or("?".into(), |h| h.to_string());
        let pct = if p.merged_pages > 0 {
            100.0 * p.local_pages as f64 / p.merged_pages as f64
        } else {
            0.0
        };
        let _ = writeln!(
            o,
            "  pid {:>7}  home node {home}  merged {:>9}  on its home node {:>9} ({pct:.0} %)",
            p.pid, p.merged_pages, p.local_pages
        );
    }
    o
}

/// The placement loop's state.
pub struct NumaPlacement {
    host: Box<dyn NumaHost>,
    placer: Placer,
    budget: MigrationBudget,
    scan_rate: u64,
    nodes: Vec<Node>,
    section: NumaSection,
    ranges: Vec<Watched>,
    cursor: usize,
    last_wake: Option<Nanos>,
    memo: HashMap<(u32, u64), CopyMemo>,
    /// Mappings decided, with the sharer count at the decision.
    decided: HashMap<(u32, u64), u16>,
    /// Choices the migration budget deferred, by the frame's first
    /// mapping: kept, so that waiting does not redraw a random choice.
    deferred: HashMap<(u32, u64), Node>,
    /// This pass: merged frame -> (pid, addr, node) mappings.
    frames: HashMap<u64, Vec<(u32, u64, Node)>>,
    /// This pass: per pid, unmerged pages per node.
    homes_now: HashMap<u32, BTreeMap<Node, u64>>,
    homes: HashMap<u32, Node>,
    /// Processes whose CPU affinity confines them to one node (their home).
    bound: HashSet<u32>,
    status: NumaStatus,
}

impl NumaPlacement {
    /// Placement on this machine, or `None` when it has one node or the
    /// policy is off (nothing is opened or read then). A failure to open
    /// what it needs is logged and leaves placement off.
    pub fn for_host(section: &NumaSection) -> Option<NumaPlacement> {
        section.core_policy()?;
        if pagesift_linux::numa::node_count() < 2 {
            return None;
        }
        match LinuxNumaHost::open() {
            Ok(h) => {
                // From now on the daemon's remote reads are recorded, so
                // that the activity they cause is not taken for use.
                pagesift_linux::read_record::enable();
                NumaPlacement::new(section, Box::new(h))
            }
            Err(e) => {
                warn!(error = %e, "NUMA placement is off");
                None
            }
        }
    }

    /// Placement over `host`, or `None` when the policy is off or the
    /// host has one node.
    pub fn new(section: &NumaSection, host: Box<dyn NumaHost>) -> Option<NumaPlacement> {
        let policy = section.core_policy()?;
        let nodes = host.nodes();
        if nodes.len() < 2 {
            return None;
        }
        info!(policy = ?policy, nodes = nodes.len(), "NUMA placement on");
        Some(NumaPlacement {
            host,
            placer: Placer::new(policy, section.seed),
            budget: MigrationBudget::new(section.migrate_pages_per_s),
            scan_rate: section.scan_pages_per_s,
            status: NumaStatus {
                policy: format!("{:?}", section.policy).to_lowercase(),
                tie: match section.tie {
                    TieRule::RoundRobin => "round-robin".into(),
                    TieRule::OneOverK => "1/k".into(),
                },
                nodes: nodes.len() as u64,
                ..NumaStatus::default()
            },
            nodes,
            section: section.clone(),
            ranges: Vec::new(),
            cursor: 0,
            last_wake: None,
            memo: HashMap::new(),
            decided: HashMap::new(),
            deferred: HashMap::new(),
            frames: HashMap::new(),
            homes_now: HashMap::new(),
            homes: HashMap::new(),
            bound: HashSet::new(),
        })
    }

    /// The section it was built from (a reload rebuilds it when changed).
    pub fn section(&self) -> &NumaSection {
        &self.section
    }

    /// The status snapshot.
    pub fn status(&self) -> NumaStatus {
        self.status.clone()
    }

    /// One wake-up at `now`: reads watched pages within the scan budget;
    /// at the end of a pass, decides and moves. `watch` gives the ranges
    /// to watch (only called when a pass starts); `eligible` is the
    /// eligible set now (pid -> identity).
    pub fn wake(
        &mut self,
        now: Nanos,
        eligible: &HashMap<u32, ProcKey>,
        watch: impl FnOnce() -> Vec<Watched>,
    ) {
        let dt = self
            .last_wake
            .map_or(1_000_000_000, |t| now.saturating_sub(t));
        self.last_wake = Some(now);
        let mut budget = (self.scan_rate as f64 * dt.min(1_000_000_000) as f64 / 1e9) as u64;
        if self.cursor == 0 {
            self.ranges = watch();
            self.ranges.sort();
            self.frames.clear();
            self.homes_now.clear();
            if self.ranges.is_empty() {
                return;
            }
        }
        let page = pagesift_linux::PAGE_SIZE;
        while self.cursor < self.ranges.len() && budget > 0 {
            let r = self.ranges[self.cursor];
            self.cursor += 1;
            if eligible.get(&r.proc.pid) != Some(&r.proc) {
                continue;
            }
            budget = budget.saturating_sub((r.end - r.start) / page);
            match self.host.pages(r.proc.pid, r.start, r.end) {
                Ok(pages) => self.record(r.proc.pid, &pages),
                Err(e) if e.is_gone() => {}
                Err(e) => warn!(pid = r.proc.pid, error = %e, "NUMA placement cannot read pages"),
            }
        }
        if self.cursor >= self.ranges.len() {
            self.cursor = 0;
            self.end_pass(now, eligible);
        }
    }

    fn record(&mut self, pid: u32, pages: &[PageFact]) {
        for f in pages {
            let Some(node) = f.node else { continue };
            if f.ksm {
                self.frames
                    .entry(f.pfn)
                    .or_default()
                    .push((pid, f.addr, node));
            } else {
                *self
                    .homes_now
                    .entry(pid)
                    .or_default()
                    .entry(node)
                    .or_default() += 1;
                let before = self.memo.get(&(pid, f.addr));
                if self.memo.len() < MEMO_LIMIT || before.is_some() {
                    // Activity seen before pagesift read the copy is the
                    // process's, and still counts while the page stays
                    // active; activity that first showed after a read of
                    // ours may be ours.
                    let active = f.active && (!f.read_by_us || before.is_some_and(|m| m.active));
                    self.memo.insert(
                        (pid, f.addr),
                        CopyMemo {
                            node,
                            active,
                            discounted: f.active && !active,
                        },
                    );
                }
            }
        }
    }

    fn end_pass(&mut self, now: Nanos, eligible: &HashMap<u32, ProcKey>) {
        // Homes: the node a process's CPU affinity confines it to; else
        // where most of its unmerged pages are (kept while it has none
        // left unmerged); else where it runs.
        let pids: HashSet<u32> = (self.frames.values().flatten().map(|s| s.0))
            .chain(self.homes_now.keys().copied())
            .collect();
        for pid in pids {
            let bound = self.host.cpu_node(pid);
            let memory = self.homes_now.get(&pid).and_then(|per_node| {
                per_node
                    .iter()
                    .max_by_key(|(n, c)| (**c, std::cmp::Reverse(**n)))
                    .map(|(n, _)| *n)
            });
            let affinity = self.host.affinity_node(pid);
            if affinity.is_some() {
                self.bound.insert(pid);
            } else {
                self.bound.remove(&pid);
            }
            let home = affinity
                .or(memory)
                .or(self.homes.get(&pid).copied())
                .or(bound);
            if let Some(n) = home {
                self.homes.insert(pid, n);
            }
        }
        self.homes.retain(|pid, _| eligible.contains_key(pid));
        self.bound.retain(|pid| eligible.contains_key(pid));
        self.host.forget_gone(eligible);
        self.memo.retain(|(pid, _), _| eligible.contains_key(pid));
        self.decided
            .retain(|(pid, _), _| eligible.contains_key(pid));
        self.deferred
            .retain(|(pid, _), _| eligible.contains_key(pid));

        let mut frames: Vec<(u64, Vec<Mapping>)> = self.frames.drain().collect();
        frames.sort_unstable_by_key(|(pfn, _)| *pfn);
        let pfns: Vec<u64> = frames.iter().map(|(p, _)| *p).collect();
        let counts = match self.host.map_counts(&pfns) {
            Ok(c) => c,
            Err(e) => {
                warn!(error = %e, "NUMA placement cannot read /proc/kpagecount");
                return;
            }
        };
        let mut nices: HashMap<u32, i32> = HashMap::new();
        // (pid, node) -> addresses to move.
        let mut moves: BTreeMap<(u32, Node), Vec<u64>> = BTreeMap::new();
        let mut moved_frames: Vec<Decision> = Vec::new();
        let mut final_node: HashMap<u64, Node> = HashMap::new();
        for (i, (pfn, sharers)) in frames.iter().enumerate() {
            let k = sharers.len().min(u16::MAX as usize) as u16;
            let current = sharers[0].2;
            final_node.insert(*pfn, current);
            if sharers
                .iter()
                .all(|(p, a, _)| self.decided.get(&(*p, *a)) == Some(&k))
            {
                continue;
            }
            if counts[i] > sharers.len() as u64 {
                self.status.foreign_sharers += 1;
                continue;
            }
            let mut copies = Vec::with_capacity(sharers.len());
            let mut memo_missing = false;
            let mut activity_discounted = false;
            for (pid, addr, _) in sharers {
                let memo = self.memo.get(&(*pid, *addr)).copied();
                memo_missing |= memo.is_none();
                activity_discounted |= memo.is_some_and(|m| m.discounted);
                // A bound process's copy stands for the process: its node is
                // the home, wherever the frame happened to be (ksmd itself
                // reallocates a copy on its own node when a merge it began
                // fails and it breaks the half-made merge again).
                let home = self.homes.get(pid).copied();
                let node = if self.bound.contains(pid) {
                    home
                } else {
                    memo.map(|m| m.node).or(home)
                };
                let Some(node) = node else {
                    continue;
                };
                let host = &self.host;
                let nice = *nices
                    .entry(*pid)
                    .or_insert_with(|| host.nice(*pid).unwrap_or(0));
                copies.push(Copy {
                    node,
                    active: memo.map(|m| m.active),
                    nice,
                });
            }
            if copies.len() < sharers.len() {
                continue; // a sharer's node is unknown yet
            }
            let first = (sharers[0].0, sharers[0].1);
            let Some(target) = self
                .deferred
                .remove(&first)
                .or_else(|| self.placer.choose(&copies))
            else {
                continue;
            };
            let decision = Decision {
                keys: sharers.iter().map(|(p, a, _)| (*p, *a)).collect(),
                sharers: k,
                target,
                unanimous: copies.iter().all(|c| c.node == copies[0].node),
                memo_missing,
                activity_split: copies.iter().any(|c| c.active == Some(true))
                    && !copies.iter().all(|c| c.active == Some(true)),
                activity_discounted,
            };
            if target == current {
                moved_frames.push(decision);
                continue;
            }
            if self.budget.take(now, 1) == 0 {
                if self.deferred.len() < DECIDED_LIMIT {
                    self.deferred.insert(first, target);
                }
                continue; // next pass
            }
            // Through the sharer whose copy was on the target node, else
            // any sharer: the frame moves for every sharer at once.
            let via = sharers
                .iter()
                .zip(&copies)
                .find(|(_, c)| c.node == target)
                .map_or(sharers[0], |(s, _)| *s);
            moves.entry((via.0, target)).or_default().push(via.1);
            final_node.insert(*pfn, target);
            moved_frames.push(decision);
        }
        let mut failed: HashSet<(u32, u64)> = HashSet::new();
        for ((pid, node), addrs) in moves {
            match self.host.move_to(pid, &addrs, node) {
                Ok(there) => {
                    let n = there.iter().filter(|t| t.is_ok()).count() as u64;
                    self.status.migrations += n;
                    let lost = addrs.len() as u64 - n;
                    self.status.migration_failures += lost;
                    self.budget.refund(lost);
                    // Not there: undecided, tried again at the next pass.
                    for (a, t) in addrs.iter().zip(&there) {
                        match t {
                            Ok(()) => {}
                            Err(Refused::Stayed) => {
                                failed.insert((pid, *a));
                                self.status.migrations_stayed += 1;
                            }
                            Err(Refused::Errno(errno)) => {
                                failed.insert((pid, *a));
                                *self.status.failure_errnos.entry(*errno).or_default() += 1;
                            }
                        }
                    }
                }
                Err(e) => {
                    warn!(pid, node, error = %e, "moving merged pages failed");
                    self.status.migration_failures += addrs.len() as u64;
                    self.budget.refund(addrs.len() as u64);
                    failed.extend(addrs.iter().map(|a| (pid, *a)));
                }
            }
        }
        for d in moved_frames {
            if d.keys.iter().any(|key| failed.contains(key)) {
                if self.deferred.len() < DECIDED_LIMIT {
                    self.deferred.insert(d.keys[0], d.target);
                }
                continue;
            }
            let s = &mut self.status;
            if s.decided_per_node.len() <= d.target as usize {
                s.decided_per_node.resize(d.target as usize + 1, 0);
            }
            s.decided_per_node[d.target as usize] += 1;
            s.unanimous += u64::from(d.unanimous);
            s.without_memo += u64::from(d.memo_missing);
            s.activity_split += u64::from(d.activity_split);
            s.activity_discounted += u64::from(d.activity_discounted);
            if self.decided.len() + d.keys.len() <= DECIDED_LIMIT {
                for key in d.keys {
                    self.decided.insert(key, d.sharers);
                }
            }
        }
        // Status: where the merged frames are (after this pass's moves).
        let max_node = self.nodes.iter().copied().max().unwrap_or(0) as usize;
        let mut per_node = vec![0u64; max_node + 1];
        let mut procs: BTreeMap<u32, NumaProcess> = BTreeMap::new();
        for (pfn, sharers) in &frames {
            let node = final_node[pfn];
            if let Some(c) = per_node.get_mut(node as usize) {
                *c += 1;
            }
            for (pid, _, _) in sharers {
                let p = procs.entry(*pid).or_insert_with(|| NumaProcess {
                    pid: *pid,
                    home_node: self.homes.get(pid).copied(),
                    ..NumaProcess::default()
                });
                p.merged_pages += 1;
                if p.home_node == Some(node) {
                    p.local_pages += 1;
                }
            }
        }
        self.status.merged_per_node = per_node;
        self.status.processes = procs.into_values().collect();
        self.status.passes += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// Two nodes of simulated memory: per (pid, addr) a frame; frames have
    /// a node and an active bit; merging points two mappings at one frame.
    #[derive(Default)]
    struct World {
        map: BTreeMap<(u32, u64), u64>,
        frames: HashMap<u64, (Node, bool, bool)>, // node, active, ksm
        /// Pages pagesift has read, by (pid, addr).
        read_by_us: HashSet<(u32, u64)>,
        nice: HashMap<u32, i32>,
        /// pid -> the node its CPU affinity confines it to.
        bound: HashMap<u32, Node>,
        next_pfn: u64,
        moves: Vec<(u32, u64, Node)>,
    }

    impl World {
        fn page(&mut self, pid: u32, addr: u64, node: Node, active: bool) {
            self.next_pfn += 1;
            self.frames.insert(self.next_pfn, (node, active, false));
            self.map.insert((pid, addr), self.next_pfn);
        }
        /// ksmd merges: `from` now maps `into`'s frame.
        fn merge(&mut self, into: (u32, u64), from: (u32, u64)) {
            let keep = self.map[&into];
            let old = self.map.insert(from, keep).unwrap();
            self.frames.remove(&old);
            self.frames.get_mut(&keep).unwrap().2 = true;
        }
        fn node_of(&self, key: (u32, u64)) -> Node {
            self.frames[&self.map[&key]].0
        }
    }

    #[derive(Clone)]
    struct Fake(Arc<Mutex<World>>);

    impl NumaHost for Fake {
        fn nodes(&self) -> Vec<Node> {
            vec![0, 1]
        }
        fn pages(&mut self, pid: u32, start: u64, end: u64) -> Result<Vec<PageFact>, LinuxError> {
            let w = self.0.lock().unwrap();
            Ok(w.map
                .range((pid, start)..(pid, end))
                .map(|(&(_, addr), &pfn)| {
                    let (node, active, ksm) = w.frames[&pfn];
                    PageFact {
                        addr,
                        pfn,
                        ksm,
                        active,
                        read_by_us: w.read_by_us.contains(&(pid, addr)),
                        node: Some(node),
                    }
                })
                .collect())
        }
        fn map_counts(&mut self, pfns: &[u64]) -> Result<Vec<u64>, LinuxError> {
            let w = self.0.lock().unwrap();
            Ok(pfns
                .iter()
                .map(|p| w.map.values().filter(|v| *v == p).count() as u64)
                .collect())
        }
        fn nice(&self, pid: u32) -> Option<i32> {
            self.0.lock().unwrap().nice.get(&pid).copied()
        }
        fn affinity_node(&self, pid: u32) -> Option<Node> {
            self.0.lock().unwrap().bound.get(&pid).copied()
        }
        fn move_to(
            &mut self,
            pid: u32,
            addrs: &[u64],
            node: Node,
        ) -> Result<Vec<Result<(), Refused>>, LinuxError> {
            let mut w = self.0.lock().unwrap();
            for a in addrs {
                let pfn = w.map[&(pid, *a)];
                w.frames.get_mut(&pfn).unwrap().0 = node;
                w.moves.push((pid, *a, node));
            }
            Ok(vec![Ok(()); addrs.len()])
        }
    }

    fn key(pid: u32) -> ProcKey {
        ProcKey {
            pid,
            start_time: pid as u64,
            image: 1,
        }
    }

    const PAGES: u64 = 200;

    /// Processes 10 (node 0) and 11 (node 1) hold the same PAGES pages;
    /// process 12 (node 1, not eligible) shares one more page with 10.
    fn world(active: impl Fn(u32, u64) -> bool) -> Fake {
        let mut w = World::default();
        for i in 0..PAGES {
            w.page(10, i * 4096, 0, active(10, i));
            w.page(11, i * 4096, 1, active(11, i));
        }
        w.page(10, PAGES * 4096, 0, false);
        w.page(12, 0, 1, false);
        Fake(Arc::new(Mutex::new(w)))
    }

    fn ranges() -> Vec<Watched> {
        [10, 11]
            .map(|p| Watched {
                proc: key(p),
                start: 0,
                end: (PAGES + 1) * 4096,
            })
            .to_vec()
    }

    fn eligible() -> HashMap<u32, ProcKey> {
        [10, 11].map(|p| (p, key(p))).into_iter().collect()
    }

    /// Runs: one pass before the merge, ksmd merges keeping process 11's
    /// copy (as KSM's scan order does), then passes until placement is
    /// done.
    fn run(section: &NumaSection, fake: &Fake, passes: usize) -> NumaPlacement {
        let mut p = NumaPlacement::new(section, Box::new(fake.clone())).unwrap();
        let mut now = 0;
        p.wake(now, &eligible(), ranges);
        {
            let mut w = fake.0.lock().unwrap();
            for i in 0..PAGES {
                w.merge((11, i * 4096), (10, i * 4096));
            }
            w.merge((12, 0), (10, PAGES * 4096));
        }
        for _ in 0..passes {
            now += 1_000_000_000;
            p.wake(now, &eligible(), ranges);
        }
        p
    }

    fn local_share(fake: &Fake, pid: u32, home: Node) -> f64 {
        let w = fake.0.lock().unwrap();
        (0..PAGES)
            .filter(|i| w.node_of((pid, i * 4096)) == home)
            .count() as f64
            / PAGES as f64
    }

    #[test]
    fn fair_gives_each_process_half_and_never_moves_a_foreign_sharers_page() {
        let fake = world(|_, _| false);
        let p = run(&NumaSection::default(), &fake, 3);
        assert_eq!(local_share(&fake, 10, 0), 0.5);
        assert_eq!(local_share(&fake, 11, 1), 0.5);
        let s = p.status();
        assert_eq!(s.migrations, PAGES / 2);
        assert_eq!(s.merged_per_node, vec![PAGES / 2, PAGES / 2 + 1]);
        assert!(s.foreign_sharers >= 1);
        let w = fake.0.lock().unwrap();
        assert!(w.moves.iter().all(|(pid, _, _)| *pid == 10 || *pid == 11));
        // The page shared with process 12 stayed where KSM put it.
        assert_eq!(w.node_of((12, 0)), 1);
        let p10 = s.processes.iter().find(|p| p.pid == 10).unwrap();
        assert_eq!(
            (p10.home_node, p10.merged_pages, p10.local_pages),
            (Some(0), PAGES + 1, PAGES / 2)
        );
    }

    #[test]
    fn a_bound_process_copy_on_the_wrong_node_still_counts_as_local_to_it() {
        // Process 11 is bound to node 1, but a quarter of its copies were
        // allocated on node 0 (as when ksmd re-makes a copy after a failed
        // merge): they must not be decided as if both sharers were on
        // node 0.
        let fake = world(|_, _| false);
        {
            let mut w = fake.0.lock().unwrap();
            w.bound.extend([(10, 0), (11, 1)]);
            for i in 0..PAGES / 4 {
                let pfn = w.map[&(11, i * 4096)];
                w.frames.get_mut(&pfn).unwrap().0 = 0;
            }
        }
        let p = run(&NumaSection::default(), &fake, 3);
        assert_eq!(local_share(&fake, 10, 0), 0.5);
        assert_eq!(local_share(&fake, 11, 1), 0.5);
        assert_eq!(p.status().unanimous, 0);
        assert_eq!(p.status().activity_split, 0);
    }

    #[test]
    fn the_active_copy_wins() {
        // Process 10's copies are active for the first half of the pages.
        let fake = world(|pid, i| pid == 10 && i < PAGES / 2);
        let p = run(&NumaSection::default(), &fake, 3);
        // The status tells how many were decided by activity.
        assert_eq!(p.status().activity_split, PAGES / 2);
        let w = fake.0.lock().unwrap();
        for i in 0..PAGES / 2 {
            assert_eq!(w.node_of((10, i * 4096)), 0, "page {i}");
        }
        let rest = (PAGES / 2..PAGES)
            .filter(|i| w.node_of((10, i * 4096)) == 0)
            .count();
        assert_eq!(rest as u64, PAGES / 4, "the equal half is spread evenly");
    }

    #[test]
    fn activity_that_pagesift_may_have_caused_decides_nothing() {
        // Process 10's copies of the first half are active, but pagesift
        // read them (two remote reads activate a page): fair must spread
        // them like the inactive rest, and say why.
        let fake = world(|pid, i| pid == 10 && i < PAGES / 2);
        fake.0
            .lock()
            .unwrap()
            .read_by_us
            .extend((0..PAGES / 2).map(|i| (10, i * 4096)));
        let p = run(&NumaSection::default(), &fake, 3);
        assert_eq!(p.status().activity_split, 0);
        assert_eq!(p.status().activity_discounted, PAGES / 2);
        assert_eq!(local_share(&fake, 10, 0), 0.5);
        assert_eq!(local_share(&fake, 11, 1), 0.5);
        // Within the half pagesift read, too: round robin, not node 0.
        let w = fake.0.lock().unwrap();
        let first_half_on_0 = (0..PAGES / 2)
            .filter(|i| w.node_of((10, i * 4096)) == 0)
            .count();
        assert_eq!(first_half_on_0 as u64, PAGES / 4);
    }

    #[test]
    fn activity_seen_before_pagesift_read_the_copy_still_counts() {
        // Process 10's first-half copies are active when a pass first sees
        // them, unread; then pagesift reads all of 10's copies.
        let fake = world(|pid, i| pid == 10 && i < PAGES / 2);
        let mut p = NumaPlacement::new(&NumaSection::default(), Box::new(fake.clone())).unwrap();
        p.wake(0, &eligible(), ranges);
        {
            let mut w = fake.0.lock().unwrap();
            w.read_by_us.extend((0..PAGES).map(|i| (10, i * 4096)));
        }
        p.wake(1_000_000_000, &eligible(), ranges);
        {
            let mut w = fake.0.lock().unwrap();
            for i in 0..PAGES {
                w.merge((11, i * 4096), (10, i * 4096));
            }
        }
        for k in 2..5 {
            p.wake(k * 1_000_000_000, &eligible(), ranges);
        }
        assert_eq!(p.status().activity_split, PAGES / 2);
        assert_eq!(p.status().activity_discounted, 0);
        let w = fake.0.lock().unwrap();
        for i in 0..PAGES / 2 {
            assert_eq!(w.node_of((10, i * 4096)), 0, "page {i}");
        }
    }

    #[test]
    fn priority_follows_nice_and_the_budget_paces_moves() {
        let fake = world(|_, _| false);
        fake.0.lock().unwrap().nice.extend([(10, -17), (11, 19)]);
        let section = NumaSection {
            policy: NumaPolicy::Priority,
            migrate_pages_per_s: 40,
            ..NumaSection::default()
        };
        let p = run(&section, &fake, 2);
        // Two passes of at most 40 (plus the bank of one second) moves.
        assert!(p.status().migrations <= 80, "{}", p.status().migrations);
        let fake = world(|_, _| false);
        fake.0.lock().unwrap().nice.extend([(10, -17), (11, 19)]);
        let p = run(&section, &fake, 20);
        let share = local_share(&fake, 10, 0);
        assert!((share - 40.0 / 44.0).abs() < 0.08, "{share}");
        assert!(p.status().migrations > 80);
    }

    #[test]
    fn an_ineligible_process_is_neither_read_nor_moved() {
        let fake = world(|_, _| false);
        let mut p = NumaPlacement::new(&NumaSection::default(), Box::new(fake.clone())).unwrap();
        let only_11: HashMap<u32, ProcKey> = [(11, key(11))].into_iter().collect();
        for t in 0..4 {
            if t == 1 {
                let mut w = fake.0.lock().unwrap();
                for i in 0..PAGES {
                    w.merge((11, i * 4096), (10, i * 4096));
                }
            }
            p.wake(t * 1_000_000_000, &only_11, ranges);
        }
        assert!(fake.0.lock().unwrap().moves.is_empty());
        assert_eq!(p.status().migrations, 0);
        assert!(p.status().foreign_sharers > 0);
    }

    #[test]
    fn the_config_section_is_validated_by_key() {
        use crate::config::Config;
        let c = Config::from_toml("[numa]\npolicy = \"priority\"\ntie = \"1/K\"\n", "t").unwrap();
        assert_eq!(c.numa.policy, NumaPolicy::Priority);
        assert_eq!(c.numa.tie, TieRule::OneOverK);
        let e = Config::from_toml("[numa]\npolicy = \"fast\"\n", "t").unwrap_err();
        assert!(e.to_string().contains("numa.policy"), "{e}");
        let e = Config::from_toml("[numa]\nmigrate_pages = 1\n", "t").unwrap_err();
        assert!(e.to_string().contains("migrate_pages"), "{e}");
        let e = Config::from_toml("[numa]\nscan_pages_per_s = 0\n", "t").unwrap_err();
        assert!(e.to_string().contains("numa.scan_pages_per_s"), "{e}");
    }

    #[test]
    fn off_or_one_node_builds_nothing() {
        let fake = world(|_, _| false);
        let off = NumaSection {
            policy: NumaPolicy::Off,
            ..NumaSection::default()
        };
        assert!(NumaPlacement::new(&off, Box::new(fake)).is_none());
        // This host: one node, so nothing is built (and nothing opened).
        if pagesift_linux::numa::node_count() < 2 {
            assert!(NumaPlacement::for_host(&NumaSection::default()).is_none());
        }
        assert!(
            NumaSection {
                scan_pages_per_s: 0,
                ..NumaSection::default()
            }
            .validate()
            .is_err()
        );
    }
}
