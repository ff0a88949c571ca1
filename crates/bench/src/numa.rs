//! The `numa` experiment (nuKSM §V-A–C): where merged pages live on a
//! two-node machine under KSM alone, pagesift's fair placement and its
//! priority placement with five nice pairs.
//!
//! This host has one node, so everything runs inside one two-node QEMU/TCG
//! guest ([`crate::guest::numa`]): two processes bound to one node each
//! hold the same data (the second started later), and each scenario
//! measures, per process, the share of its merged pages on its own node,
//! KSM's `pages_sharing` (the memory saved), pagesift's migrations, and
//! whether each process's memory checksum is unchanged.
//!
//! Goals (judged from the figures, met or not met):
//! - KSM alone puts nearly all merged pages on one node (≥ 90 %: the
//!   behaviour placement corrects);
//! - fair: each process finds 50 ± 10 % of its merged pages local;
//! - priority: the process on node 0 finds its merged pages local within 5
//!   points of Table III (91, 83, 50, 17, 9 %);
//! - pagesift saves as much memory as KSM (`pages_sharing` ≥ 95 % of KSM
//!   alone's);
//! - every checksum unchanged.
//!
//! TCG emulates no remote-access latency, so a guest cannot show the
//! speed placement buys; the result is the placement itself.
//!
//! It boots its own guest, so it runs only when named (`--only numa`), on
//! its own; it writes `report.md` in the output directory and, with
//! `--write-docs`, its section of the docs file.

use crate::guest::numa::{self as guest, Mode as GuestMode, NumaPlan, Scenario, ScenarioResult};
use crate::{BenchError, BenchOptions, Summary, experiment::Mode};
use pagesift_core::pipeline::placement::local_share;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Its name for `--only`.
pub const EXPERIMENT: &str = "numa";

/// The nice pairs of Table III, as (name, nice of node 0's process, nice
/// of node 1's, the paper's local share for node 0's process).
pub const PRIORITY_PAIRS: [(&str, i32, i32, f64); 5] = [
    ("C-10:1", -17, 19, 0.91),
    ("C-5:1", -13, 19, 0.83),
    ("C-1:1", 0, 0, 0.50),
    ("C-1:5", 19, -13, 0.17),
    ("C-1:10", 19, -17, 0.09),
];

/// The plan for `mode`.
pub fn plan(mode: Mode) -> NumaPlan {
    let full = mode == Mode::Full;
    let mut scenarios = vec![
        Scenario {
            name: "ksm".into(),
            mode: GuestMode::Ksm,
            nice: (0, 0),
        },
        Scenario {
            name: "fair".into(),
            mode: GuestMode::Fair,
            nice: (0, 0),
        },
    ];
    for (name, n0, n1, _) in PRIORITY_PAIRS {
        scenarios.push(Scenario {
            name: name.into(),
            mode: GuestMode::Priority,
            nice: (n0, n1),
        });
    }
    NumaPlan {
        mib: if full { 64 } else { 16 },
        delay_s: 5,
        run_s: if full { 120 } else { 60 },
        node_mib: 1024,
        scenarios,
        hint_overhead_mib: None,
    }
}

/// Runs the experiment (see the module header).
pub fn run(opts: &BenchOptions) -> Result<Summary, BenchError> {
    let t0 = Instant::now();
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let before = pagesift_linux::procstat::machine().load_average;
    let progress = crate::Progress::new(opts.quiet);
    let plan = plan(opts.mode);
    let dir = opts.out.join("guests").join("numa");
    let missing = |e: crate::guest::GuestError| BenchError::Missing(e.to_string());
    guest::guest_kernel().map_err(missing)?;
    crate::create_dir(&opts.out)?;
    progress.note("numa: building the two-node guest's initramfs");
    let initramfs = guest::build_image(&dir, &opts.pagesift_bin, &plan).map_err(missing)?;
    let budget = plan.scenarios.len() as u64 * (plan.run_s + plan.delay_s + 60) + 300;
    progress.note(&format!(
        "numa: booting the guest (QEMU/TCG, 2 nodes); {} scenarios of {} s",
        plan.scenarios.len(),
        plan.run_s
    ));
    let results = guest::run(
        &dir,
        &initramfs,
        &plan,
        Duration::from_secs(budget),
        &mut |name| progress.note(&format!("numa: {name} done")),
    )
    .map_err(|e| BenchError::System(e.to_string()))?;
    let serial = std::fs::read_to_string(dir.join("numa.serial")).unwrap_or_default();
    let guest_line = serial
        .lines()
        .find(|l| l.starts_with("numa-guest: nodes="))
        .unwrap_or("")
        .trim_start_matches("numa-guest: ")
        .to_string();
    let header = crate::header(opts, started, t0, before, Duration::ZERO);
    let body = markdown(&plan, &results, &guest_line);
    crate::finish_own_report(
        opts,
        &progress,
        t0,
        header,
        "nuKSM's placement of merged pages on two NUMA nodes",
        &body,
    )
}

fn pct(x: f64) -> String {
    format!("{:.1} %", 100.0 * x)
}

/// The goals, judged: (goal, met, evidence).
pub fn goals(results: &[ScenarioResult]) -> Vec<(String, Option<bool>, String)> {
    let find = |n: &str| results.iter().find(|r| r.name == n);
    let mut out = Vec::new();
    let ksm = find("ksm");
    match ksm.and_then(|k| k.processes.first()) {
        Some(p) if p.merged() > 0 => {
            let top =
                p.merged_per_node.iter().copied().max().unwrap_or(0) as f64 / p.merged() as f64;
            out.push((
                "KSM alone puts nearly all merged pages on one node (≥ 90 %)".into(),
                Some(top >= 0.9),
                format!("{} of the merged pages on one node", pct(top)),
            ));
        }
        _ => out.push((
            "KSM alone puts nearly all merged pages on one node (≥ 90 %)".into(),
            None,
            "KSM merged nothing".into(),
        )),
    }
    match find("fair") {
        Some(f) if f.processes.len() == 2 && f.processes.iter().all(|p| p.merged() > 0) => {
            let shares: Vec<f64> = f.processes.iter().map(|p| p.local_share()).collect();
            out.push((
                "fair: each process finds 50 ± 10 % of its merged pages local".into(),
                Some(shares.iter().all(|s| (s - 0.5).abs() <= 0.10)),
                format!(
                    "node 0's process {}, node 1's {}",
                    pct(shares[0]),
                    pct(shares[1])
                ),
            ));
        }
        _ => out.push((
            "fair: each process finds 50 ± 10 % of its merged pages local".into(),
            None,
            "no merged pages".into(),
        )),
    }
    // The workloads never touch their pages after filling them and
    // nothing reclaims in the guest: an active copy is pagesift's doing.
    let goal = "fair: no merged page is placed by activity (the processes never touch their pages; pagesift's own reads must not count)";
    match find("fair").and_then(|f| f.activity) {
        Some((split, aside)) => out.push((
            goal.into(),
            Some(split == 0),
            format!("{split} decided by activity, {aside} with an active copy set aside"),
        )),
        None => out.push((goal.into(), None, "no status".into())),
    }
    for (name, n0, n1, paper) in PRIORITY_PAIRS {
        let goal = format!(
            "priority {name} (nice {n0}:{n1}): node 0's process finds {:.0} ± 5 % local (Table III; nuShare gives {})",
            paper * 100.0,
            pct(local_share(n0, n1))
        );
        match find(name).and_then(|r| r.processes.first()) {
            Some(p) if p.merged() > 0 => out.push((
                goal,
                Some((p.local_share() - paper).abs() <= 0.05),
                format!("{} local", pct(p.local_share())),
            )),
            _ => out.push((goal, None, "no merged pages".into())),
        }
    }
    let ksm_saved = ksm.map_or(0, |k| k.pages_sharing);
    let worst = results
        .iter()
        .filter(|r| r.name != "ksm")
        .map(|r| (r.pages_sharing, r.name.clone()))
        .min();
    let goal =
        "pagesift saves as much memory as KSM (pages_sharing ≥ 95 % of KSM alone's in every run)"
            .to_string();
    match worst {
        Some((w, name)) if ksm_saved > 0 => out.push((
            goal,
            Some(w as f64 >= 0.95 * ksm_saved as f64),
            format!("KSM alone {ksm_saved} pages, pagesift's lowest {w} ({name})"),
        )),
        _ => out.push((goal, None, "KSM alone saved nothing".into())),
    }
    let bad: Vec<String> = results
        .iter()
        .flat_map(|r| {
            r.processes
                .iter()
                .filter(|p| !p.checksum_ok)
                .map(move |p| format!("{} node {}", r.name, p.node))
        })
        .collect();
    out.push((
        "every process's memory checksum unchanged".into(),
        Some(bad.is_empty() && !results.is_empty()),
        if bad.is_empty() {
            format!("{} processes checked", results.len() * 2)
        } else {
            format!("changed: {}", bad.join(", "))
        },
    ));
    out
}

/// The section's body: setup, table, goals, limits.
pub fn markdown(plan: &NumaPlan, results: &[ScenarioResult], guest_line: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Inside one QEMU/TCG guest with two NUMA nodes (2 vCPUs, {} MiB per node; guest: {guest_line}): \
         two processes, one bound to each node (CPUs and memory), each holding the same {} MiB of \
         distinct pages (`pagesift workload random --seed 7`), the second started {} s after the first. \
         Each scenario runs {} s: KSM alone (both processes under `pagesift exec`, ksmd at 1000 pages per \
         20 ms), or `pagesift run --pid A --pid B` with `[numa] policy` fair or priority (nice pairs as in \
         nuKSM's Table III). \"Local\" is the share of a process's merged pages on its own node, counted \
         by `pagesift numa` (pagemap, kpageflags, move_pages queries) at the end.\n",
        plan.node_mib, plan.mib, plan.delay_s, plan.run_s
    );
    let _ = writeln!(
        s,
        "| scenario | nice (node 0 : node 1) | merged pages, node 0's process | local, node 0's process | local, node 1's process | merged frames on node 0 / node 1 | pages_sharing (saved) | pages moved by pagesift | moves that failed (errno×count, busy×count: retried) | decided by activity / active copy read by pagesift, set aside | checksums |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|---|---|---|---|");
    for r in results {
        let sc = plan.scenarios.iter().find(|x| x.name == r.name);
        let nice = sc.map_or("?".into(), |x| format!("{} : {}", x.nice.0, x.nice.1));
        let p0 = r.processes.iter().find(|p| p.node == 0);
        let p1 = r.processes.iter().find(|p| p.node == 1);
        let frames = p0.map_or("?".into(), |p| {
            p.merged_per_node
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" / ")
        });
        let _ = writeln!(
            s,
            "| {} | {nice} | {} | {} | {} | {frames} | {} | {} | {} | {} | {} |",
            r.name,
            p0.map_or(0, |p| p.merged()),
            p0.map_or("?".into(), |p| pct(p.local_share())),
            p1.map_or("?".into(), |p| pct(p.local_share())),
            r.pages_sharing,
            r.migrations.map_or("–".into(), |m| m.to_string()),
            r.failures
                .as_ref()
                .map_or("–".into(), |(n, e)| if e.is_empty() {
                    n.to_string()
                } else {
                    format!("{n} ({e})")
                }),
            r.activity
                .map_or("–".into(), |(split, aside)| format!("{split} / {aside}")),
            if r.processes.iter().all(|p| p.checksum_ok) {
                "unchanged"
            } else {
                "CHANGED"
            }
        );
    }
    s.push_str(&crate::goal_list(&goals(results)));
    let _ = writeln!(
        s,
        "\nLimits: QEMU's TCG emulates no remote-memory latency (a guest's two nodes are one host \
         memory), so these runs cannot show the speed a placement buys or costs; the result is the \
         placement itself. The guest turns the multi-generational LRU off so that `KPF_ACTIVE` is the \
         classic active list's; the processes' data is read-mostly and never under memory pressure, so \
         copies are mostly equal and the tie rule decides. Single runs."
    );
    s
}
