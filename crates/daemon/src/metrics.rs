//! Prometheus metrics: the numbers of `pagesift status`, in the OpenMetrics
//! text format, over HTTP (`--metrics ADDR`, off by default).
//!
//! The metric objects are `prometheus-client`'s; [`Metrics::update`] copies
//! a [`Status`] snapshot into them (counters advance by the difference to
//! the previous snapshot, so they stay monotonic), and a `tiny_http` thread
//! answers every GET with the registry's encoding, after asking the loop
//! for a fresh snapshot ([`crate::snapshots`]). Only numbers that stay
//! few go out as labels (levels, the governor): regions are counted, not
//! listed, so a host with thousands of regions does not blow up the scrape.
//! The savings per cgroup and per process are listed, but only the top N
//! of each (`[savings]`, with cgroup paths cut to a depth), the rest summed
//! under `cgroup="other"` and `pid="other"`.
//!
//! Label values that processes or users choose (command names, cgroup and
//! file paths) are escaped as the text format demands (`\\`, `\"`, `\n`):
//! `prometheus-client` writes them as they are, and a quote in a command
//! name would otherwise end the label and forge samples.

use crate::snapshots::{FRESH_WAIT, Snapshots};
use crate::status::Status;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

type G = Gauge<f64, AtomicU64>;
type C = Counter<f64, AtomicU64>;
type Labels = Vec<(String, String)>;

/// The registry and its metrics.
pub struct Metrics {
    registry: Registry,
    gauges: Vec<(&'static str, G)>,
    counters: Vec<(&'static str, C, f64)>,
    level_regions: Family<Labels, G>,
    level_pages: Family<Labels, G>,
    governor: Family<Labels, G>,
    image_cached: Family<Labels, G>,
    numa_node_pages: Family<Labels, G>,
    numa_process_pages: Family<Labels, G>,
    /// CPU seconds per wake-up phase, with the totals last copied in.
    phase_cpu: Family<Labels, C>,
    phase_cpu_last: std::collections::BTreeMap<Labels, f64>,
    thread_cpu: Family<Labels, C>,
    thread_cpu_last: std::collections::BTreeMap<Labels, f64>,
    /// Reads of the processes' regions, by source (`maps`, `smaps`) and
    /// reason, with the totals last copied in (key: `source/reason`).
    region_reads: Family<Labels, C>,
    region_reads_last: std::collections::BTreeMap<Labels, f64>,
    /// [`CGROUP_GAUGES`], in that order.
    cgroup_savings: Vec<Family<Labels, G>>,
    /// [`PROCESS_GAUGES`], in that order.
    process_savings: Vec<Family<Labels, G>>,
}

/// Gauges per cgroup (label `cgroup`): (name, help).
const CGROUP_GAUGES: [(&str, &str); 4] = [
    (
        "cgroup_saved_bytes",
        "Bytes KSM saves in a cgroup's eligible processes (the kernel's ksm_process_profit, summed; other: the cgroups beyond [savings] top_cgroups)",
    ),
    (
        "cgroup_merged_pages",
        "Pages of a cgroup's eligible processes merged by KSM (ksm_merging_pages + ksm_zero_pages, summed)",
    ),
    (
        "cgroup_cow_breaks",
        "COW breaks pagesift counted in a cgroup's regions (a gauge: it falls when processes exit)",
    ),
    ("cgroup_processes", "Eligible processes in a cgroup"),
];

/// Gauges per process (labels `pid`, `comm`, `cgroup`): (name, help).
const PROCESS_GAUGES: [(&str, &str); 3] = [
    (
        "process_saved_bytes",
        "Bytes KSM saves in a process (ksm_process_profit; pid other: the processes beyond [savings] top_processes)",
    ),
    (
        "process_merged_pages",
        "Pages of a process merged by KSM (ksm_merging_pages + ksm_zero_pages)",
    ),
    (
        "process_cow_breaks",
        "COW breaks pagesift counted in a process's regions",
    ),
];

/// A label value as the text format writes it: backslash, double quote and
/// line feed escaped (see the module header).
pub fn escape_label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// The figures of a savings line, in [`CGROUP_GAUGES`] order (the first
/// three are [`PROCESS_GAUGES`]'s).
fn savings_values(s: &pagesift_core::pipeline::savings::Savings, processes: u64) -> [f64; 4] {
    [
        s.saved_bytes as f64,
        s.merged_pages as f64,
        s.cow_breaks as f64,
        processes as f64,
    ]
}

/// Gauges: (name, help).
const GAUGES: &[(&str, &str)] = &[
    (
        "merged_pages",
        "Pages merged (KSM or zero page) in promoted and foreign regions",
    ),
    (
        "merged_bytes",
        "Bytes merged in promoted and foreign regions",
    ),
    ("processes", "Eligible processes"),
    ("regions", "Regions tracked"),
    (
        "regions_left_out",
        "Regions of eligible processes not tracked: more than scan.max_regions",
    ),
    ("promoted_regions", "Regions pagesift made mergeable"),
    ("promoted_pages", "Pages of regions pagesift made mergeable"),
    ("merging_regions", "Promoted regions ksmd is still merging"),
    (
        "held_regions",
        "Regions held out of the ladder (unmarked for thrashing, or written too often to mark) until their hold ends",
    ),
    (
        "foreign_regions",
        "Regions made mergeable by their own process",
    ),
    (
        "write_tracked_ranges",
        "Ranges whose writes pagesift watches (uffd-wp) before marking",
    ),
    (
        "run_marks",
        "Runs of verified duplicates marked inside poor regions",
    ),
    (
        "partial_marks",
        "Regions marked around the zones their watched writes landed in",
    ),
    (
        "remerges",
        "Merged regions that climbed back with new duplicates and were merged again",
    ),
    (
        "trims",
        "Stretches of settled regions that ksmd left unmerged, unmarked",
    ),
    ("trimmed_pages", "Pages in the unmarked unmerged stretches"),
    (
        "unseen_break_alarms",
        "Times cow_ksm rose by more COW breaks than the accounting passes saw (settled regions passed over again)",
    ),
    (
        "raised_on_history",
        "Regions mapped again where their process's last one was marked, raised to the top level at once",
    ),
    ("marked_bytes", "Bytes marked mergeable by pagesift"),
    ("skipped_processes", "Processes pagesift does not actuate"),
    ("ksm_pages_shared", "KSM pages in use"),
    (
        "ksm_pages_sharing",
        "Further mappings of KSM pages: pages saved",
    ),
    ("ksm_full_scans", "ksmd full scans"),
    ("ksm_pages_to_scan", "pages_to_scan in force"),
    ("ksm_sleep_milliseconds", "sleep_millisecs in force"),
    (
        "ksmd_cpu_share",
        "ksmd CPU over the last seconds, fraction of one core",
    ),
    (
        "ksmd_target_share",
        "CPU share ksmd is paced to, fraction of one core",
    ),
    (
        "ksmd_wait_share",
        "Share of the last pacing tick ksmd waited for a CPU",
    ),
    (
        "daemon_cpu_share",
        "pagesift CPU over the last seconds, fraction of one core",
    ),
    (
        "daemon_cpu_cap",
        "pagesift's CPU cap in force, fraction of one core",
    ),
    (
        "daemon_cpu_cap_unmet",
        "1 while the CPU cap is out of reach (a wake-up a second costs more)",
    ),
    ("hash_strength", "Words hashed per sampled page"),
    (
        "index_stable_pages",
        "Pages in the sample index's stable set (known duplicates)",
    ),
    (
        "index_unstable_pages",
        "Pages in the sample index's unstable set (emptied every global round)",
    ),
    ("index_heap_bytes", "Heap bytes the sample index holds"),
    (
        "sample_cost_nanoseconds",
        "CPU per sampled page the budgets assume",
    ),
    (
        "hints_on",
        "1 when I/O hints flow from the BPF program, else 0",
    ),
    ("hints_stacked", "Hints on the bounded stack now"),
    (
        "hint_cost_nanoseconds",
        "CPU per hint from the ring buffer to the stack",
    ),
    (
        "cow_ksm_since_start",
        "/proc/vmstat cow_ksm since the daemon started",
    ),
];

/// Counters: (name without _total, help).
const COUNTERS: &[(&str, &str)] = &[
    (
        "cow_breaks",
        "COW breaks counted in promoted and foreign regions",
    ),
    ("marks", "MADV_MERGEABLE calls that succeeded"),
    ("unmarks", "MADV_UNMERGEABLE calls that succeeded"),
    ("injection_batches", "Injection batches (one attach each)"),
    ("vma_splits", "VMA splits caused by marking parts of VMAs"),
    ("sampled_pages", "Pages sampled"),
    ("wakeups", "Wake-ups"),
    ("global_rounds", "Global sampling rounds"),
    ("sweep_epochs", "Exact sweeps finished"),
    (
        "sweep_fill_epochs",
        "Exact sweeps of only the processes that filled memory",
    ),
    ("sweep_hashed_pages", "Pages hashed by the exact sweep"),
    ("sweep_cpu_seconds", "CPU time of the exact sweep"),
    (
        "sweep_raised_regions",
        "Regions raised to the top level on the sweep's evidence",
    ),
    (
        "sweep_probed_regions",
        "Regions checked against their fingerprint when their time out was over",
    ),
    (
        "sweep_probed_unchanged_regions",
        "Of those, regions found unchanged and not walked again",
    ),
    (
        "numa_migrations",
        "Merged pages moved to the node NUMA placement chose",
    ),
    (
        "numa_decided_by_activity",
        "Merged pages NUMA placement decided among copies of which only some were active",
    ),
    (
        "numa_activity_set_aside",
        "Merged pages decided with an active copy pagesift had read, its activity not counted",
    ),
    ("daemon_cpu_seconds", "pagesift CPU time"),
    (
        "hint_events",
        "Read/write syscalls reported by the I/O hint program",
    ),
    (
        "hints_received",
        "Hinted pages received from the I/O hint program",
    ),
    (
        "hints_pushed",
        "Hinted pages of sampled regions pushed on the hint stack",
    ),
    (
        "hints_dropped_ring",
        "Hint events lost in the kernel because the ring buffer was full",
    ),
    (
        "hints_not_file_data",
        "Calls covering a whole page on no file data (pipes, sockets, procfs, sysfs, ...) left unhinted",
    ),
    (
        "hints_repeated",
        "Calls that filled the same pages as their process's last call (a reused buffer) left unhinted",
    ),
    (
        "hints_dropped_stale",
        "Hints dropped as older than the maximum age or the last round",
    ),
    (
        "hints_dropped_unmapped",
        "Hints dropped because their page left every region before it was looked up",
    ),
    ("hints_overwritten", "Hints overwritten in the full stack"),
    ("hint_duplicates", "Hinted pages found duplicated"),
    (
        "hint_pages_marked",
        "Pages marked mergeable in runs found from hints",
    ),
    ("ksmd_cpu_seconds", "ksmd CPU time since pagesift started"),
    (
        "scrub_dropped_pages",
        "Host page-cache pages dropped by scrubbing",
    ),
    ("scrubs", "Page-cache scrubs run"),
    (
        "scrub_indexed_pages",
        "Guest pages read to index guest RAM for scrubbing",
    ),
    (
        "scrub_full_indexes",
        "Index passes over a guest's whole RAM (the others read only hinted pages)",
    ),
    (
        "scrub_examined_pages",
        "Host page-cache pages read and matched against guest RAM",
    ),
    (
        "scrub_cpu_seconds",
        "CPU time spent scrubbing the host page cache",
    ),
];

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// Every metric, at zero.
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("pagesift");
        let gauges = GAUGES
            .iter()
            .map(|&(name, help)| {
                let g = G::default();
                registry.register(name, help, g.clone());
                (name, g)
            })
            .collect();
        let counters = COUNTERS
            .iter()
            .map(|&(name, help)| {
                let c = C::default();
                registry.register(name, help, c.clone());
                (name, c, 0.0)
            })
            .collect();
        let level_regions = Family::<Labels, G>::default();
        registry.register(
            "level_regions",
            "Regions on a ladder level",
            level_regions.clone(),
        );
        let level_pages = Family::<Labels, G>::default();
        registry.register(
            "level_pages",
            "Pages on a ladder level",
            level_pages.clone(),
        );
        let image_cached = Family::<Labels, G>::default();
        registry.register(
            "scrub_image_cached_pages",
            "Host page-cache pages of a guest disk image after the last scrub",
            image_cached.clone(),
        );
        let governor = Family::<Labels, G>::default();
        registry.register(
            "governor",
            "The CPU governor in force (value 1)",
            governor.clone(),
        );
        let numa_node_pages = Family::<Labels, G>::default();
        registry.register(
            "numa_node_merged_pages",
            "Merged frames on a NUMA node (placement on)",
            numa_node_pages.clone(),
        );
        let numa_process_pages = Family::<Labels, G>::default();
        registry.register(
            "numa_process_merged_pages",
            "A process's merged pages, all or only those on its home node (where=home)",
            numa_process_pages.clone(),
        );
        let phase_cpu = Family::<Labels, C>::default();
        registry.register(
            "daemon_phase_cpu_seconds",
            "pagesift main-thread CPU time per phase of its wake-up",
            phase_cpu.clone(),
        );
        let thread_cpu = Family::<Labels, C>::default();
        registry.register(
            "daemon_thread_cpu_seconds",
            "pagesift CPU time per live thread, by name (main: the wake-up loop)",
            thread_cpu.clone(),
        );
        let region_reads = Family::<Labels, C>::default();
        registry.register(
            "region_reads",
            "Reads of an eligible process's regions: from /proc/PID/maps (reason none), or from /proc/PID/smaps, a walk of every present page, and why",
            region_reads.clone(),
        );
        let family = |registry: &mut Registry, (name, help): (&str, &str)| {
            let f = Family::<Labels, G>::default();
            registry.register(name, help, f.clone());
            f
        };
        let cgroup_savings = CGROUP_GAUGES
            .iter()
            .map(|&g| family(&mut registry, g))
            .collect();
        let process_savings = PROCESS_GAUGES
            .iter()
            .map(|&g| family(&mut registry, g))
            .collect();
        Metrics {
            phase_cpu,
            phase_cpu_last: std::collections::BTreeMap::new(),
            thread_cpu,
            thread_cpu_last: std::collections::BTreeMap::new(),
            region_reads,
            region_reads_last: std::collections::BTreeMap::new(),
            cgroup_savings,
            process_savings,
            numa_node_pages,
            numa_process_pages,
            registry,
            gauges,
            counters,
            level_regions,
            level_pages,
            governor,
            image_cached,
        }
    }

    fn set(&self, name: &str, v: f64) {
        if let Some((_, g)) = self.gauges.iter().find(|(n, _)| *n == name) {
            g.set(v);
        }
    }

    fn advance(&mut self, name: &str, total: f64) {
        if let Some((_, c, last)) = self.counters.iter_mut().find(|(n, _, _)| *n == name) {
            if total > *last {
                c.inc_by(total - *last);
            }
            *last = last.max(total);
        }
    }

    /// Copies a snapshot into the metrics.
    pub fn update(&mut self, s: &Status) {
        let t = &s.totals;
        let k = &s.ksm;
        let d = &s.daemon;
        for (name, v) in [
            ("merged_pages", t.merged_pages as f64),
            ("merged_bytes", t.merged_pages as f64 * 4096.0),
            ("processes", t.processes as f64),
            ("regions", t.regions as f64),
            ("regions_left_out", t.regions_left_out as f64),
            ("promoted_regions", t.promoted_regions as f64),
            ("promoted_pages", t.promoted_pages as f64),
            ("merging_regions", t.merging_regions as f64),
            ("held_regions", t.held_regions as f64),
            ("foreign_regions", t.foreign_regions as f64),
            ("write_tracked_ranges", t.write_tracked_ranges as f64),
            ("run_marks", t.run_marks as f64),
            ("partial_marks", t.partial_marks as f64),
            ("remerges", t.remerges as f64),
            ("trims", t.trims as f64),
            ("trimmed_pages", t.trimmed_pages as f64),
            ("unseen_break_alarms", t.unseen_break_alarms as f64),
            ("raised_on_history", t.raised_on_history as f64),
            ("marked_bytes", t.marked_bytes as f64),
            ("skipped_processes", s.skipped.len() as f64),
            ("ksm_pages_shared", k.pages_shared as f64),
            ("ksm_pages_sharing", k.pages_sharing as f64),
            ("ksm_full_scans", k.full_scans as f64),
            ("ksm_pages_to_scan", k.pages_to_scan as f64),
            ("ksm_sleep_milliseconds", k.sleep_ms as f64),
            ("ksmd_cpu_share", k.cpu_share),
            ("ksmd_target_share", k.target_share),
            ("ksmd_wait_share", k.wait_share),
            ("daemon_cpu_share", d.cpu_share),
            ("daemon_cpu_cap", d.cpu_cap),
            ("daemon_cpu_cap_unmet", f64::from(u8::from(d.cap_unmet))),
            ("hash_strength", d.strength as f64),
            ("index_stable_pages", d.index.stable as f64),
            ("index_unstable_pages", d.index.unstable as f64),
            ("index_heap_bytes", d.index.heap_bytes as f64),
            ("sample_cost_nanoseconds", d.per_page_ns),
            ("cow_ksm_since_start", k.cow_ksm.unwrap_or(0) as f64),
            ("hints_on", f64::from(u8::from(s.hints.state == "on"))),
            ("hints_stacked", s.hints.stacked as f64),
            ("hint_cost_nanoseconds", s.hints.per_hint_ns),
        ] {
            self.set(name, v);
        }
        for (name, v) in [
            ("cow_breaks", t.cow_breaks as f64),
            ("marks", t.marks as f64),
            ("unmarks", t.unmarks as f64),
            ("injection_batches", t.batches as f64),
            ("vma_splits", t.vma_splits as f64),
            ("sampled_pages", t.sampled_pages as f64),
            ("wakeups", t.wakes as f64),
            ("global_rounds", t.global_rounds as f64),
            ("sweep_epochs", d.sweep.epochs as f64),
            ("sweep_fill_epochs", d.sweep.fill_epochs as f64),
            ("sweep_hashed_pages", d.sweep.pages_hashed as f64),
            ("sweep_cpu_seconds", d.sweep.cpu_ns as f64 / 1e9),
            ("sweep_raised_regions", d.sweep.raised as f64),
            ("sweep_probed_regions", d.sweep.probed as f64),
            (
                "sweep_probed_unchanged_regions",
                d.sweep.probed_unchanged as f64,
            ),
            ("daemon_cpu_seconds", d.cpu_seconds),
            ("ksmd_cpu_seconds", k.cpu_seconds),
            ("hint_events", s.hints.events as f64),
            ("hints_received", s.hints.received as f64),
            ("hints_pushed", s.hints.pushed as f64),
            ("hints_dropped_ring", s.hints.dropped_ring as f64),
            ("hints_not_file_data", s.hints.not_file_data as f64),
            ("hints_repeated", s.hints.repeated as f64),
            ("hints_dropped_stale", s.hints.dropped_stale as f64),
            ("hints_dropped_unmapped", s.hints.dropped_unmapped as f64),
            ("hints_overwritten", s.hints.overwritten as f64),
            ("hint_duplicates", s.hints.duplicates as f64),
            ("hint_pages_marked", s.hints.pages_marked as f64),
        ] {
            self.advance(name, v);
        }
        // A thread's total can fall (a thread of that name exited and its
        // time left the sum): its counter then waits until it is passed.
        advance_each(
            &self.phase_cpu,
            &mut self.phase_cpu_last,
            labelled("phase", &d.cpu_by_phase),
        );
        advance_each(
            &self.thread_cpu,
            &mut self.thread_cpu_last,
            labelled("thread", &d.cpu_by_thread),
        );
        let reads = std::iter::once(("maps", "none", s.discovery.maps_reads))
            .chain((s.discovery.smaps_by_reason.iter()).map(|(r, n)| ("smaps", r.as_str(), *n)))
            .map(|(source, reason, n)| {
                let labels = vec![
                    ("source".to_string(), source.to_string()),
                    ("reason".to_string(), reason.to_string()),
                ];
                (labels, n as f64)
            });
        advance_each(&self.region_reads, &mut self.region_reads_last, reads);
        for l in &s.levels {
            let labels = vec![("level".to_string(), l.level.to_string())];
            self.level_regions
                .get_or_create(&labels)
                .set(l.region_count as f64);
            self.level_pages.get_or_create(&labels).set(l.pages as f64);
        }
        if let Some(sc) = &s.scrub {
            self.advance("scrub_dropped_pages", sc.dropped_pages as f64);
            self.advance("scrubs", sc.scrubs as f64);
            self.advance("scrub_indexed_pages", sc.indexed_pages as f64);
            self.advance("scrub_full_indexes", sc.full_indexes as f64);
            self.advance("scrub_examined_pages", sc.examined_pages as f64);
            self.advance("scrub_cpu_seconds", sc.cpu_seconds);
            self.image_cached.clear();
            for i in &sc.images {
                let labels = vec![
                    ("pid".to_string(), i.pid.to_string()),
                    ("image".to_string(), escape_label(&i.path)),
                ];
                self.image_cached
                    .get_or_create(&labels)
                    .set(i.cached_pages as f64);
            }
        }
        if let Some(n) = &s.numa {
            self.advance("numa_migrations", n.migrations as f64);
            self.advance("numa_decided_by_activity", n.activity_split as f64);
            self.advance("numa_activity_set_aside", n.activity_discounted as f64);
            for (node, pages) in n.merged_per_node.iter().enumerate() {
                let labels = vec![("node".to_string(), node.to_string())];
                self.numa_node_pages
                    .get_or_create(&labels)
                    .set(*pages as f64);
            }
            self.numa_process_pages.clear();
            for p in &n.processes {
                let home = p.home_node.map_or("unknown".into(), |h| h.to_string());
                for (where_, v) in [("all", p.merged_pages), ("home", p.local_pages)] {
                    let labels = vec![
                        ("pid".to_string(), p.pid.to_string()),
                        ("home_node".to_string(), home.clone()),
                        ("where".to_string(), where_.to_string()),
                    ];
                    self.numa_process_pages.get_or_create(&labels).set(v as f64);
                }
            }
        }
        self.update_savings(&s.savings);
        self.governor.clear();
        self.governor
            .get_or_create(&vec![("governor".to_string(), s.governor.clone())])
            .set(1.0);
    }

    /// The savings lines of a snapshot, replacing the previous ones (a
    /// cgroup or process that left the top N leaves the scrape).
    fn update_savings(&mut self, b: &pagesift_core::pipeline::savings::Breakdown) {
        for f in self.cgroup_savings.iter().chain(&self.process_savings) {
            f.clear();
        }
        let set = |families: &[Family<Labels, G>], labels: Labels, values: [f64; 4]| {
            for (f, v) in families.iter().zip(values) {
                f.get_or_create(&labels).set(v);
            }
        };
        let cgroup = |name: &str| vec![("cgroup".to_string(), escape_label(name))];
        for c in &b.cgroups.top {
            let v = savings_values(&c.savings, c.processes);
            set(&self.cgroup_savings, cgroup(&c.cgroup), v);
        }
        if let Some(r) = &b.cgroups.rest {
            let v = savings_values(&r.savings, r.processes);
            set(&self.cgroup_savings, cgroup("other"), v);
        }
        for p in &b.processes.top {
            let labels = vec![
                ("pid".to_string(), p.pid.to_string()),
                ("comm".to_string(), escape_label(&p.comm)),
                ("cgroup".to_string(), escape_label(&p.cgroup)),
            ];
            set(&self.process_savings, labels, savings_values(&p.savings, 1));
        }
        if let Some(r) = &b.processes.rest {
            let labels = vec![("pid".to_string(), "other".to_string())];
            let v = savings_values(&r.savings, r.processes);
            set(&self.process_savings, labels, v);
        }
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// The HTTP endpoint. Dropping it stops the server.
pub struct MetricsServer {
    server: Arc<tiny_http::Server>,
    addr: SocketAddr,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` and serves the metrics of a fresh snapshot of
    /// `snapshots` on every path.
    pub fn start(addr: SocketAddr, snapshots: Arc<Snapshots>) -> std::io::Result<MetricsServer> {
        let server = Arc::new(
            tiny_http::Server::http(addr)
                .map_err(|e| std::io::Error::other(format!("cannot listen on {addr}: {e}")))?,
        );
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| std::io::Error::other("metrics server has no IP address"))?;
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || {
                let mut metrics = Metrics::new();
                // `recv` returns an error once `unblock` is called.
                while let Ok(req) = s.recv() {
                    // Each scrape asks the loop for a snapshot
                    // (`crate::snapshots`); the counters advance by what
                    // changed since the last one.
                    if let Some(snap) = snapshots.fresh(FRESH_WAIT) {
                        metrics.update(&snap);
                    }
                    let body = metrics.encode();
                    let header = tiny_http::Header::from_bytes(
                        &b"Content-Type"[..],
                        &b"application/openmetrics-text; version=1.0.0; charset=utf-8"[..],
                    )
                    .expect("a valid header");
                    let _ = req.respond(tiny_http::Response::from_string(body).with_header(header));
                }
            })?;
        Ok(MetricsServer {
            server,
            addr,
            thread: Some(thread),
        })
    }

    /// The address it listens on (with the real port when 0 was asked).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Totals keyed by name, as totals labelled `label=name`.
fn labelled<'m>(
    label: &'static str,
    m: &'m std::collections::BTreeMap<String, f64>,
) -> impl Iterator<Item = (Labels, f64)> + 'm {
    (m.iter()).map(move |(k, &v)| (vec![(label.to_string(), k.clone())], v))
}

/// Moves each labelled counter of `family` up to its total in `totals`,
/// remembering the totals in `last`; a total below the last one moves
/// nothing.
fn advance_each(
    family: &Family<Labels, C>,
    last: &mut std::collections::BTreeMap<Labels, f64>,
    totals: impl Iterator<Item = (Labels, f64)>,
) {
    for (labels, total) in totals {
        let seen = last.entry(labels.clone()).or_insert(0.0);
        if total > *seen {
            family.get_or_create(&labels).inc_by(total - *seen);
            *seen = total;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshots::testing::Answering;
    use crate::status::{LevelStatus, Totals};
    use std::io::{Read, Write};
    use std::sync::Mutex;

    fn status(merged: u64, cow: u64) -> Status {
        Status {
            governor: "medium".into(),
            levels: vec![LevelStatus {
                level: 0,
                region_count: 3,
                pages: 300,
                ..LevelStatus::default()
            }],
            totals: Totals {
                merged_pages: merged,
                cow_breaks: cow,
                write_tracked_ranges: 2,
                ..Totals::default()
            },
            daemon: crate::status::DaemonStatus {
                index: crate::status::IndexStatus {
                    stable: 7,
                    unstable: 9,
                    heap_bytes: 4096,
                },
                ..Default::default()
            },
            ..Status::default()
        }
    }

    fn scrape(addr: SocketAddr) -> String {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    fn value(text: &str, metric: &str) -> f64 {
        text.lines()
            .find(|l| l.starts_with(metric) && l[metric.len()..].starts_with(' '))
            .unwrap_or_else(|| panic!("{metric} missing in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse()
            .unwrap()
    }

    #[test]
    fn a_scrape_over_loopback_shows_the_snapshot() {
        let cell = Arc::new(Mutex::new(Some(status(1000, 5))));
        let answering = Answering::start(cell.clone());
        let server =
            MetricsServer::start("127.0.0.1:0".parse().unwrap(), answering.snapshots.clone())
                .unwrap();
        let text = scrape(server.addr());
        assert!(
            text.starts_with("HTTP/1.0 200") || text.starts_with("HTTP/1.1 200"),
            "{text}"
        );
        assert_eq!(value(&text, "pagesift_merged_pages"), 1000.0);
        assert_eq!(value(&text, "pagesift_cow_breaks_total"), 5.0);
        assert_eq!(value(&text, "pagesift_index_stable_pages"), 7.0);
        assert_eq!(value(&text, "pagesift_index_heap_bytes"), 4096.0);
        assert_eq!(value(&text, "pagesift_level_regions{level=\"0\"}"), 3.0);
        assert_eq!(value(&text, "pagesift_write_tracked_ranges"), 2.0);
        assert_eq!(value(&text, "pagesift_governor{governor=\"medium\"}"), 1.0);
        // Each scrape asks for a snapshot; counters follow the totals and
        // never go back.
        *cell.lock().unwrap() = Some(status(2000, 9));
        let _ = scrape(server.addr());
        *cell.lock().unwrap() = Some(status(2000, 7));
        let text = scrape(server.addr());
        assert_eq!(value(&text, "pagesift_merged_pages"), 2000.0);
        assert_eq!(value(&text, "pagesift_cow_breaks_total"), 9.0);
        drop(server);
    }

    #[test]
    fn thread_cpu_is_a_counter_per_thread_name() {
        let mut m = Metrics::new();
        let mut s = status(10, 0);
        s.daemon.cpu_by_thread = [
            ("main".to_string(), 2.5),
            ("pagesift-tracer".to_string(), 0.5),
        ]
        .into_iter()
        .collect();
        m.update(&s);
        s.daemon
            .cpu_by_thread
            .insert("pagesift-tracer".into(), 0.75);
        m.update(&s);
        let text = m.encode();
        let v = |t: &str| {
            value(
                &text,
                &format!("pagesift_daemon_thread_cpu_seconds_total{{thread=\"{t}\"}}"),
            )
        };
        assert_eq!(v("main"), 2.5);
        assert_eq!(v("pagesift-tracer"), 0.75);
    }

    #[test]
    fn region_reads_count_maps_and_smaps_by_reason() {
        let mut m = Metrics::new();
        let mut s = status(10, 0);
        s.discovery.maps_reads = 7;
        s.discovery.smaps_reads = 3;
        s.discovery.smaps_by_reason = [
            ("mergeable_recheck".to_string(), 1),
            ("userfaultfd".to_string(), 2),
        ]
        .into_iter()
        .collect();
        m.update(&s);
        s.discovery.maps_reads = 9;
        m.update(&s);
        let text = m.encode();
        let v = |source: &str, reason: &str| {
            value(
                &text,
                &format!("pagesift_region_reads_total{{source=\"{source}\",reason=\"{reason}\"}}"),
            )
        };
        assert_eq!(v("maps", "none"), 9.0);
        assert_eq!(v("smaps", "userfaultfd"), 2.0);
        assert_eq!(v("smaps", "mergeable_recheck"), 1.0);
    }

    #[test]
    fn numa_placement_shows_what_activity_decided_and_what_was_set_aside() {
        let mut m = Metrics::new();
        let mut s = status(10, 0);
        s.numa = Some(crate::numa::NumaStatus {
            migrations: 40,
            activity_split: 3,
            activity_discounted: 192,
            merged_per_node: vec![2048, 2048],
            ..Default::default()
        });
        m.update(&s);
        let text = m.encode();
        assert_eq!(value(&text, "pagesift_numa_migrations_total"), 40.0);
        assert_eq!(value(&text, "pagesift_numa_decided_by_activity_total"), 3.0);
        assert_eq!(
            value(&text, "pagesift_numa_activity_set_aside_total"),
            192.0
        );
        assert_eq!(
            value(&text, "pagesift_numa_node_merged_pages{node=\"1\"}"),
            2048.0
        );
    }

    #[test]
    fn savings_lines_are_labelled_bounded_and_escaped() {
        use pagesift_core::pipeline::savings::{Limits, ProcessSavings, Savings, breakdown};
        let proc_ = |pid: u32, comm: &str, cgroup: &str, merged: u64, cow: u64| ProcessSavings {
            pid,
            comm: comm.into(),
            cgroup: cgroup.into(),
            savings: Savings {
                merged_pages: merged,
                saved_bytes: merged as i64 * 4096 - 64,
                cow_breaks: cow,
            },
        };
        // A command name that tries to end its label and forge a sample.
        let evil = "x\"} 1\npagesift_forged 1\n#";
        let procs = [
            proc_(10, "qemu", "/machine.slice/vm1.scope/emulator", 1000, 3),
            proc_(20, evil, "/machine.slice/vm2.scope", 500, 0),
            proc_(30, "sshd", "/system.slice/ssh.service", 0, 0),
            proc_(31, "cron", "/system.slice/cron.service", 0, 0),
        ];
        let limits = Limits {
            cgroup_depth: 2,
            top_cgroups: 2,
            top_processes: 2,
        };
        let mut s = status(0, 0);
        s.savings = breakdown(&procs, limits);
        let mut m = Metrics::new();
        m.update(&s);
        let text = m.encode();
        for (name, want) in [
            ("merged_pages", 1000.0),
            ("saved_bytes", 4_095_936.0),
            ("cow_breaks", 3.0),
            ("processes", 1.0),
        ] {
            let sample = format!("pagesift_cgroup_{name}{{cgroup=\"/machine.slice/vm1.scope\"}}");
            assert_eq!(value(&text, &sample), want, "{sample}");
        }
        // Two system.slice services, cut to depth 2, are beyond the top 2.
        assert_eq!(
            value(&text, "pagesift_cgroup_processes{cgroup=\"other\"}"),
            2.0
        );
        assert_eq!(
            value(
                &text,
                "pagesift_process_merged_pages{pid=\"10\",comm=\"qemu\",cgroup=\"/machine.slice/vm1.scope\"}"
            ),
            1000.0
        );
        assert_eq!(
            value(&text, "pagesift_process_merged_pages{pid=\"other\"}"),
            0.0
        );
        assert!(
            !text.lines().any(|l| l.starts_with("pagesift_forged")),
            "{text}"
        );
        assert!(
            text.contains("comm=\"x\\\"} 1\\npagesift_forged 1\\n#\""),
            "{text}"
        );
        // Lines are replaced, not accumulated: a process that left is gone.
        s.savings = breakdown(&procs[..1], limits);
        m.update(&s);
        let text = m.encode();
        assert!(!text.contains("vm2.scope"), "{text}");
        assert!(!text.contains("cgroup=\"other\""), "{text}");
    }

    #[test]
    fn label_values_are_escaped_as_the_text_format_says() {
        assert_eq!(escape_label("plain /a.b-c"), "plain /a.b-c");
        assert_eq!(escape_label("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
    }
}
