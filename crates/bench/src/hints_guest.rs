//! The hints-guest experiment: what the I/O hint program costs a
//! read-heavy process under each of its hooks, measured inside a guest
//! whose kernel allows both.
//!
//! The hint program attaches either with fexit to the enabled syscalls'
//! functions (only those syscalls pay) or to the raw tracepoint
//! `sys_exit` (every syscall of every process pays). This project's host
//! refuses BPF trampolines, so the files experiment can only time
//! `sys_exit` there. The Debian 6.12 kernel of the NUMA guest
//! ([`crate::guest::numa`]) allows both: this experiment boots it with no
//! placement scenario and runs `pagesift hint-overhead` once per hook (the
//! same measurement as the files experiment's, [`crate::files::hint_overhead`]:
//! 4 KiB and 64 KiB `pread64` calls re-reading a cached file, without the
//! program, attached but not watching the reader, and watching it;
//! medians of alternating trials).
//!
//! Limits: QEMU/TCG emulates the guest's CPU, so absolute times are many
//! times the host's, and emulation does not slow every instruction
//! equally. The percentages compare the hooks with each other under the
//! same emulation; they are not the host's figures.

use crate::files::HintOverhead;
use crate::guest::numa::{self as guest, NumaPlan};
use crate::{BenchError, BenchOptions, Summary};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Its name for `--only`.
pub const EXPERIMENT: &str = "hints-guest";

/// The goal on the watched reader's and on everyone else's extra time.
pub const GOAL_PCT: f64 = 2.0;

/// The cached file re-read, MiB.
const FILE_MIB: u64 = 16;

/// Runs the experiment (see the module header).
pub fn run(opts: &BenchOptions) -> Result<Summary, BenchError> {
    let t0 = Instant::now();
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let before = pagesift_linux::procstat::machine().load_average;
    let progress = crate::Progress::new(opts.quiet);
    let plan = NumaPlan {
        mib: 0,
        delay_s: 0,
        run_s: 0,
        node_mib: 512,
        scenarios: Vec::new(),
        hint_overhead_mib: Some(FILE_MIB),
    };
    let dir = opts.out.join("guests").join("hints");
    let missing = |e: crate::guest::GuestError| BenchError::Missing(e.to_string());
    guest::guest_kernel().map_err(missing)?;
    crate::create_dir(&opts.out)?;
    progress.note("hints-guest: building the guest's initramfs");
    let initramfs = guest::build_image(&dir, &opts.pagesift_bin, &plan).map_err(missing)?;
    progress.note("hints-guest: booting the guest (QEMU/TCG); timing both hooks");
    guest::run(
        &dir,
        &initramfs,
        &plan,
        Duration::from_secs(1200),
        &mut |_| {},
    )
    .map_err(|e| BenchError::System(e.to_string()))?;
    let serial = std::fs::read_to_string(dir.join("numa.serial")).unwrap_or_default();
    let guest_line = serial
        .lines()
        .find_map(|l| l.strip_prefix("numa-guest: nodes="))
        .map(|l| format!("nodes={l}"))
        .unwrap_or_default();
    let costs = guest::parse_hint_overhead(&serial);
    let header = crate::header(opts, started, t0, before, Duration::ZERO);
    let body = markdown(&costs, &guest_line);
    crate::finish_own_report(
        opts,
        &progress,
        t0,
        header,
        "the I/O hint program's cost under each hook, in a guest",
        &body,
    )
}

type Costs = [(String, Result<Vec<HintOverhead>, String>)];

/// The goals, judged: (goal, met, evidence).
pub fn goals(costs: &Costs) -> Vec<(String, Option<bool>, String)> {
    let fexit = costs.iter().find(|(h, _)| h == "fexit");
    let mut out = Vec::new();
    let mut judge = |what: &str, pct: &dyn Fn(&HintOverhead) -> f64| {
        let goal = format!(
            "fexit: {what} takes at most {GOAL_PCT} % longer with the program (4 KiB and 64 KiB pread64)"
        );
        match fexit {
            Some((_, Ok(v))) if !v.is_empty() => {
                let worst = v.iter().map(pct).fold(f64::MIN, f64::max);
                let each: Vec<String> = v
                    .iter()
                    .map(|c| {
                        format!(
                            "{} {:+.1} %",
                            crate::files::call_size(c.chunk_bytes),
                            pct(c)
                        )
                    })
                    .collect();
                out.push((goal, Some(worst <= GOAL_PCT), each.join(", ")));
            }
            Some((_, Err(e))) => out.push((goal, None, format!("not measured: {e}"))),
            _ => out.push((goal, None, "not measured".into())),
        }
    };
    judge("a read-heavy process the program watches", &|c| {
        c.watching_pct()
    });
    judge("a read-heavy process it does not watch", &|c| c.idle_pct());
    out
}

/// The report's body.
pub fn markdown(costs: &Costs, guest_line: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "Inside one QEMU/TCG guest ({guest_line}): `pagesift hint-overhead --hook H` for each hook H, \
         a process re-reading a cached {FILE_MIB} MiB file (tmpfs) with 4 KiB and 64 KiB `pread64` calls, \
         timed without the program, with it attached but not watching the reader (what every other \
         process pays), and with it watching the reader; medians of alternating trials. The host of \
         this project refuses BPF trampolines, so its files experiment can time only `sys_exit`.\n"
    );
    let _ = writeln!(
        s,
        "| hook | call size | without, ms | attached, not watching | watching | per call, watching | events (lost) |"
    );
    let _ = writeln!(s, "|---|---|---|---|---|---|---|");
    for (hook, r) in costs {
        match r {
            Ok(v) => {
                for c in v {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {:.2} | {:.2} ms ({:+.1} %) | {:.2} ms ({:+.1} %) | {:+.0} ns | {} ({}) |",
                        c.hook,
                        crate::files::call_size(c.chunk_bytes),
                        c.without_ms,
                        c.idle_ms,
                        c.idle_pct(),
                        c.watching_ms,
                        c.watching_pct(),
                        c.watching_ns_per_call(),
                        c.events,
                        c.ring_full
                    );
                }
            }
            Err(e) => {
                let _ = writeln!(s, "| {hook} | – | not measured: {e} | | | | |");
            }
        }
    }
    s.push_str(&crate::goal_list(&goals(costs)));
    let _ = writeln!(
        s,
        "\nLimits: TCG emulates the guest's CPU, so the times are many times the host's and \
         emulation does not slow every instruction alike; the hooks are compared with each other \
         under the same emulation. Single run."
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cost(hook: &str, kib: u64, idle: f64, watching: f64) -> HintOverhead {
        HintOverhead {
            hook: hook.into(),
            chunk_bytes: kib * 1024,
            file_mib: 16.0,
            trials: 7,
            passes: 4,
            without_ms: 100.0,
            idle_ms: idle,
            watching_ms: watching,
            calls: 16384,
            events: 10,
            ring_full: 0,
        }
    }

    #[test]
    fn the_goals_judge_the_fexit_figures_only() {
        let costs = vec![
            (
                "fexit".to_string(),
                Ok(vec![
                    cost("fexit", 4, 100.5, 101.9),
                    cost("fexit", 64, 100.1, 103.0),
                ]),
            ),
            (
                "sys-exit".to_string(),
                Ok(vec![cost("tp_btf/sys_exit", 4, 120.0, 125.0)]),
            ),
        ];
        let g = goals(&costs);
        assert_eq!(g.len(), 2);
        assert_eq!(g[0].1, Some(false), "64 KiB watching is +3 %: {g:?}");
        assert_eq!(g[1].1, Some(true), "not watching: at most +0.5 %: {g:?}");
        let failed = vec![("fexit".to_string(), Err("EPERM".to_string()))];
        assert_eq!(goals(&failed)[0].1, None);
        let md = markdown(&costs, "nodes=0-1");
        assert!(
            md.contains("| tp_btf/sys_exit | 4 KiB | 100.00 | 120.00 ms (+20.0 %)"),
            "{md}"
        );
    }
}
