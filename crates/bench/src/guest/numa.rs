//! A guest with two NUMA nodes, for the placement experiment: this host
//! has one node, so placement is exercised inside QEMU/TCG.
//!
//! ## The guest
//! ```text
//! qemu-system-x86_64 -accel tcg -machine pc -m <2·node_mib>M -smp 2
//!   -object memory-backend-ram,id=m0,size=<node_mib>M   (and m1)
//!   -numa node,nodeid=0,cpus=0,memdev=m0                (and node 1: cpu 1)
//!   -nodefaults -no-user-config -display none -no-reboot
//!   -serial file:<dir>/numa.serial -kernel <6.12 vmlinuz> -initrd <dir>/numa.cpio
//! ```
//! The kernel is Debian's 6.12 image that `scripts/setup` unpacks into
//! [`GUEST_KERNEL_DIR`] (pagesift needs `PAGEMAP_SCAN`, uffd-wp async and
//! `PR_SET_MEMORY_MERGE`: Linux 6.7 or later). The initramfs holds
//! busybox, the `pagesift` binary (stripped) with the shared libraries
//! `ldd` names, and an `/init` that runs every [`Scenario`] in turn:
//!
//! 1. process A: `pagesift workload random --mib M --seed 7 --node 0
//!    --nice N0` (CPU and memory bound to node 0), then after `delay_s`
//!    process B, the same data on node 1 (the second instance starts
//!    later, as in nuKSM's evaluation);
//! 2. KSM alone (both started under `pagesift exec`, i.e.
//!    `PR_SET_MEMORY_MERGE`, ksmd at 1000 pages per 20 ms), or
//!    `pagesift run --pid A --pid B` with `[numa] policy = fair|priority`,
//!    for `run_s` seconds (its status, one line of JSON, just before the
//!    end);
//! 3. `pagesift numa --json A` and `B`: each process's merged and
//!    unmerged pages per node; KSM's `pages_sharing`; each workload's
//!    checksum of its memory, compared with the one it printed when it
//!    filled it; then both are killed.
//!
//! The multi-generational LRU is turned off in the guest, so that
//! `KPF_ACTIVE` means what the fair policy reads. Every result is a line
//! on the serial console (`numa-census`, `numa-saving`, `numa-checksum`,
//! `numa-status`); [`run`] parses them. TCG emulates no remote-access
//! latency: the experiment measures placement, not speed.

use super::image::{Content, program_payload, write_initramfs};
use super::{FAILED_MARKER, GuestError, HostTools};
use crate::guest::disk::KernelModules;
use std::collections::BTreeMap;
use std::fs;
use std::io::BufWriter;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `scripts/setup` unpacks the guest kernel (`boot/vmlinuz-6.12*`).
pub const GUEST_KERNEL_DIR: &str = "/var/cache/pagesift/guest-kernel";

/// The line `/init` prints when every scenario is done.
pub const DONE_MARKER: &str = "numa-guest: done";

/// What a scenario runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Mainline KSM alone.
    Ksm,
    /// pagesift, `[numa] policy = "fair"`.
    Fair,
    /// pagesift, `[numa] policy = "priority"`.
    Priority,
}

impl Mode {
    fn word(self) -> &'static str {
        match self {
            Mode::Ksm => "ksm",
            Mode::Fair => "fair",
            Mode::Priority => "priority",
        }
    }
}

/// One scenario: two processes, one per node.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Its name (letters, digits, `-`, `:`).
    pub name: String,
    /// What merges.
    pub mode: Mode,
    /// Nice of the processes on node 0 and node 1.
    pub nice: (i32, i32),
}

/// The guest's plan.
#[derive(Clone, Debug, PartialEq)]
pub struct NumaPlan {
    /// Data of each process, MiB.
    pub mib: u64,
    /// Seconds between the two processes' starts.
    pub delay_s: u64,
    /// Seconds KSM or pagesift runs per scenario.
    pub run_s: u64,
    /// RAM per node, MiB.
    pub node_mib: u64,
    /// In order.
    pub scenarios: Vec<Scenario>,
    /// After the scenarios, time the I/O hint program's cost under each
    /// hook (`pagesift hint-overhead`) over a cached file of this many MiB:
    /// this 6.12 guest kernel allows BPF trampolines (fexit), which the
    /// host may not.
    pub hint_overhead_mib: Option<u64>,
}

/// One process's placement in one scenario.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProcessPlacement {
    /// Its pid in the guest.
    pub pid: u32,
    /// Its node.
    pub node: u16,
    /// Its merged pages per node.
    pub merged_per_node: Vec<u64>,
    /// Its checksum was the same after the run as after its fill.
    pub checksum_ok: bool,
}

impl ProcessPlacement {
    /// Merged pages in all.
    pub fn merged(&self) -> u64 {
        self.merged_per_node.iter().sum()
    }

    /// Share of its merged pages on its own node (0 without merged pages).
    pub fn local_share(&self) -> f64 {
        let all = self.merged();
        if all == 0 {
            return 0.0;
        }
        self.merged_per_node
            .get(self.node as usize)
            .copied()
            .unwrap_or(0) as f64
            / all as f64
    }
}

/// What one scenario measured.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScenarioResult {
    /// Its name.
    pub name: String,
    /// The two processes, node 0's first.
    pub processes: Vec<ProcessPlacement>,
    /// KSM's `pages_sharing` at the end (pages saved).
    pub pages_sharing: u64,
    /// KSM's `pages_shared` at the end (merged frames).
    pub pages_shared: u64,
    /// Merged pages pagesift moved (its status), if it ran.
    pub migrations: Option<u64>,
    /// Moves the kernel refused, and their errnos (`errno×count`).
    pub failures: Option<(u64, String)>,
    /// Merged pages decided by activity (some copies active, some not),
    /// and those with an active copy pagesift had read, whose activity was
    /// set aside (its status), if it ran.
    pub activity: Option<(u64, u64)>,
}

/// The 6.12 kernel `scripts/setup` unpacked.
pub fn guest_kernel() -> Result<PathBuf, GuestError> {
    let boot = Path::new(GUEST_KERNEL_DIR).join("boot");
    let (kernel, release) = super::host::newest_kernel(&boot).map_err(|_| GuestError::Missing {
        what: format!(
            "a Linux 6.7+ guest kernel ({}/vmlinuz-6.12*)",
            boot.display()
        ),
        package: "linux-image-6.12-amd64 (unpacked, not installed)",
    })?;
    let newer = |r: &str| {
        let mut it = r
            .split(['.', '-', '+'])
            .map(|p| p.parse::<u32>().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0)) >= (6, 7)
    };
    if !newer(&release) {
        return Err(GuestError::Unsuitable(format!(
            "guest kernel {release} is older than 6.7 (PAGEMAP_SCAN, PR_SET_MEMORY_MERGE)"
        )));
    }
    Ok(kernel)
}

/// `/init` for `plan`, with pagesift at `pagesift` in the guest.
pub fn init_script(plan: &NumaPlan, pagesift: &str) -> String {
    let mut s = String::from(concat!(init_prelude!(), include_str!("numa_init.sh")));
    s = s
        .replace("@MIB@", &plan.mib.to_string())
        .replace("@DELAY@", &plan.delay_s.to_string())
        .replace("@RUN@", &plan.run_s.to_string())
        .replace("@PAGESIFT@", pagesift);
    for sc in &plan.scenarios {
        s.push_str(&format!(
            "scenario {} {} {} {}\n",
            sc.name,
            sc.mode.word(),
            sc.nice.0,
            sc.nice.1
        ));
    }
    if let Some(mib) = plan.hint_overhead_mib {
        s.push_str(&format!("hint_overhead {mib}\n"));
    }
    s.push_str(&format!(
        "echo \"{DONE_MARKER}\"\nreboot -f\nwhile :; do sleep 1; done\n"
    ));
    s
}

/// Builds `dir/numa.cpio` for `plan` with the `pagesift` binary at
/// `pagesift_bin`.
pub fn build_image(
    dir: &Path,
    pagesift_bin: &Path,
    plan: &NumaPlan,
) -> Result<PathBuf, GuestError> {
    let tools = HostTools::find()?;
    fs::create_dir_all(dir)
        .map_err(|e| GuestError::io(format!("creating {}", dir.display()), e))?;
    let (stripped, payload) = program_payload(pagesift_bin, dir)?;
    let applets = Command::new(&tools.busybox)
        .arg("--list-full")
        .output()
        .map_err(|e| GuestError::io("running busybox --list-full", e))?;
    let applets: Vec<String> = String::from_utf8_lossy(&applets.stdout)
        .lines()
        .map(|l| l.trim().trim_start_matches('/').to_string())
        .filter(|l| !l.is_empty() && l != "bin/busybox")
        .collect();
    let init = init_script(plan, stripped.to_str().expect("plain path"));
    let content = Content {
        init: &init,
        payload: &payload,
        modules: KernelModules::default(),
    };
    let path = dir.join("numa.cpio");
    let out = BufWriter::new(
        fs::File::create(&path)
            .map_err(|e| GuestError::io(format!("creating {}", path.display()), e))?,
    );
    write_initramfs(out, &tools.busybox, &applets, &content)
        .map_err(|e| GuestError::io(format!("writing {}", path.display()), e))?;
    Ok(path)
}

/// QEMU, killed on drop.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Boots the two-node guest on `initramfs` and waits (at most `timeout`)
/// for every scenario; returns their results. `progress` gets each
/// scenario's name as its results arrive.
pub fn run(
    dir: &Path,
    initramfs: &Path,
    plan: &NumaPlan,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<ScenarioResult>, GuestError> {
    match boot(dir, initramfs, plan, timeout, progress) {
        Err(GuestError::Failed { log, .. }) if crashed_while_booting(&log) => {
            // The guest kernel died before its init ran: nothing of the
            // experiment happened yet, so a second boot loses nothing.
            // Seen once in a full test run (2026-11-27): the 6.12 kernel
            // took an int3 Oops in `sched_clock_cpu` at 1.47 s, while its
            // two TCG vCPUs patched kernel text, and QEMU exited.
            let _ = fs::rename(&log, dir.join("numa.first-boot.serial"));
            progress("the guest kernel crashed while booting; booting it again");
            boot(dir, initramfs, plan, timeout, progress)
        }
        other => other,
    }
}

/// Whether the serial log `log` shows a guest kernel Oops or panic before
/// the guest's init printed anything of its own.
fn crashed_while_booting(log: &Path) -> bool {
    let text = fs::read_to_string(log).unwrap_or_default();
    !text.contains("numa-") && (text.contains("Oops:") || text.contains("Kernel panic"))
}

/// One boot of the guest: its scenarios' results once it printed
/// [`DONE_MARKER`].
fn boot(
    dir: &Path,
    initramfs: &Path,
    plan: &NumaPlan,
    timeout: Duration,
    progress: &mut dyn FnMut(&str),
) -> Result<Vec<ScenarioResult>, GuestError> {
    let tools = HostTools::find()?;
    let kernel = guest_kernel()?;
    let serial = dir.join("numa.serial");
    let _ = fs::remove_file(&serial);
    let qemu_log = dir.join("numa.qemu.log");
    let stderr = fs::File::create(&qemu_log)
        .map_err(|e| GuestError::io(format!("creating {}", qemu_log.display()), e))?;
    let n = plan.node_mib;
    let mut cmd = Command::new(&tools.setpriv);
    cmd.args(["--pdeathsig", "KILL", "--"])
        .arg(&tools.qemu)
        .args(["-name", "pagesift-numa", "-accel", "tcg", "-machine", "pc"])
        .args(["-m", &format!("{}M", 2 * n), "-smp", "2"])
        .args(["-object", &format!("memory-backend-ram,id=m0,size={n}M")])
        .args(["-object", &format!("memory-backend-ram,id=m1,size={n}M")])
        .args(["-numa", "node,nodeid=0,cpus=0,memdev=m0"])
        .args(["-numa", "node,nodeid=1,cpus=1,memdev=m1"])
        .args([
            "-nodefaults",
            "-no-user-config",
            "-display",
            "none",
            "-no-reboot",
        ])
        .arg("-serial")
        .arg(format!("file:{}", serial.display()))
        .arg("-kernel")
        .arg(&kernel)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 panic=-1 quiet"])
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    let mut qemu = Qemu(
        cmd.spawn()
            .map_err(|e| GuestError::io(format!("starting {}", tools.qemu.display()), e))?,
    );
    let t0 = Instant::now();
    let mut seen = 0;
    loop {
        let log = fs::read_to_string(&serial).unwrap_or_default();
        let results = parse(&log);
        while seen < results.len() {
            progress(&results[seen].name);
            seen += 1;
        }
        if log.contains(DONE_MARKER) {
            return Ok(results);
        }
        let fail = |reason: String| GuestError::Failed {
            name: "numa".into(),
            reason,
            log: serial.clone(),
        };
        if let Some(line) = log
            .lines()
            .find(|l| l.starts_with(FAILED_MARKER) || l.starts_with("numa-guest: failed"))
        {
            return Err(fail(line.to_string()));
        }
        if let Ok(Some(status)) = qemu.0.try_wait() {
            return Err(fail(format!("QEMU exited ({status}) before the end")));
        }
        if t0.elapsed() > timeout {
            return Err(fail(format!("not done after {} s", timeout.as_secs())));
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The hint program's costs in a serial log: per hook asked for, the
/// figures of each call size, or why the measurement failed.
pub fn parse_hint_overhead(
    log: &str,
) -> Vec<(String, Result<Vec<crate::files::HintOverhead>, String>)> {
    let mut out: Vec<(String, Result<Vec<crate::files::HintOverhead>, String>)> = Vec::new();
    for line in log.lines().map(|l| l.trim_end_matches('\r')) {
        let mut words = line.splitn(3, ' ');
        let (Some(kind), Some(hook), rest) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        let entry = match out.iter_mut().position(|(h, _)| h == hook) {
            Some(i) => &mut out[i].1,
            None if kind.starts_with("numa-hints") => {
                out.push((hook.to_string(), Ok(Vec::new())));
                &mut out.last_mut().expect("just pushed").1
            }
            None => continue,
        };
        match kind {
            "numa-hints" => {
                let parsed = serde_json::from_str(rest.unwrap_or(""))
                    .map_err(|e| format!("unreadable figures ({e}): {line}"));
                match (entry.as_mut(), parsed) {
                    (Ok(v), Ok(c)) => v.push(c),
                    (Ok(_), Err(e)) => *entry = Err(e),
                    (Err(_), _) => {}
                }
            }
            "numa-hints-failed" => *entry = Err(rest.unwrap_or("").to_string()),
            _ => {}
        }
    }
    out
}

/// The scenarios' results in a serial log (complete scenarios only: one
/// is complete when its checksum line is there).
pub fn parse(log: &str) -> Vec<ScenarioResult> {
    let mut by_name: BTreeMap<String, (usize, ScenarioResult)> = BTreeMap::new();
    let mut complete = Vec::new();
    for line in log.lines() {
        let line = line.trim_end_matches('\r');
        let mut words = line.splitn(4, ' ');
        let (Some(kind), Some(name)) = (words.next(), words.next()) else {
            continue;
        };
        if !kind.starts_with("numa-") {
            continue;
        }
        let order = by_name.len();
        let entry = &mut by_name
            .entry(name.to_string())
            .or_insert_with(|| {
                (
                    order,
                    ScenarioResult {
                        name: name.to_string(),
                        ..ScenarioResult::default()
                    },
                )
            })
            .1;
        match kind {
            "numa-census" => {
                let (Some(node), Some(json)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(v) = serde_json::from_str::<serde_json::Value>(json) else {
                    continue;
                };
                entry.processes.push(ProcessPlacement {
                    pid: v["pid"].as_u64().unwrap_or(0) as u32,
                    node: node.parse().unwrap_or(0),
                    merged_per_node: v["merged_per_node"]
                        .as_array()
                        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
                        .unwrap_or_default(),
                    checksum_ok: false,
                });
            }
            "numa-saving" => {
                let rest = line.split_whitespace().skip(2);
                for kv in rest {
                    match kv.split_once('=') {
                        Some(("pages_sharing", v)) => entry.pages_sharing = v.parse().unwrap_or(0),
                        Some(("pages_shared", v)) => entry.pages_shared = v.parse().unwrap_or(0),
                        _ => {}
                    }
                }
            }
            "numa-status" => {
                let json = line.splitn(3, ' ').nth(2).unwrap_or("");
                if let Ok(v) = serde_json::from_str::<serde_json::Value>(json) {
                    entry.migrations = v["numa"]["migrations"].as_u64();
                    entry.activity = v["numa"]["activity_split"].as_u64().map(|split| {
                        (
                            split,
                            v["numa"]["activity_discounted"].as_u64().unwrap_or(0),
                        )
                    });
                    if let Some(f) = v["numa"]["migration_failures"].as_u64() {
                        let errnos = v["numa"]["failure_errnos"]
                            .as_object()
                            .map(|m| {
                                m.iter()
                                    .map(|(k, n)| format!("{k}×{n}"))
                                    .collect::<Vec<_>>()
                                    .join(" ")
                            })
                            .unwrap_or_default();
                        let stayed = v["numa"]["migrations_stayed"].as_u64().unwrap_or(0);
                        let errnos = if stayed > 0 {
                            format!("{errnos} busy×{stayed}").trim().to_string()
                        } else {
                            errnos
                        };
                        entry.failures = Some((f, errnos));
                    }
                }
            }
            "numa-checksum" => {
                for kv in line.split_whitespace().skip(2) {
                    if let Some((node, verdict)) = kv.split_once('=')
                        && let Some(p) = entry
                            .processes
                            .iter_mut()
                            .find(|p| p.node.to_string() == node)
                    {
                        p.checksum_ok = verdict == "ok";
                    }
                }
                complete.push(name.to_string());
            }
            _ => {}
        }
    }
    let mut out: Vec<(usize, ScenarioResult)> = by_name
        .into_iter()
        .filter(|(n, _)| complete.contains(n))
        .map(|(_, v)| v)
        .collect();
    out.sort_by_key(|(o, _)| *o);
    out.into_iter().map(|(_, r)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_crash_before_the_guests_init_spoke_is_a_boot_crash() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("numa.serial");
        fs::write(
            &log,
            "[    1.469551] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n",
        )
        .unwrap();
        assert!(crashed_while_booting(&log));
        fs::write(
            &log,
            "numa-guest: started\n[   30.1] Oops: general protection\n",
        )
        .unwrap();
        assert!(!crashed_while_booting(&log));
        fs::write(&log, "[    1.2] Run /init as init process\n").unwrap();
        assert!(!crashed_while_booting(&log));
        assert!(!crashed_while_booting(&dir.path().join("missing")));
    }

    #[test]
    fn the_log_parses_into_scenarios() {
        let log = "junk\n\
            numa-census fair 0 {\"pid\":71,\"merged_per_node\":[2048,2048],\"unmerged_per_node\":[10,0]}\n\
            numa-census fair 1 {\"pid\":80,\"merged_per_node\":[2040,2056],\"unmerged_per_node\":[0,9]}\n\
            numa-status fair {\"numa\":{\"migrations\":2050,\"activity_split\":3,\"activity_discounted\":190}}\n\
            numa-saving fair pages_sharing=4096 pages_shared=4096\n\
            numa-checksum fair 0=ok 1=changed\n\
            numa-census ksm 0 {\"pid\":90,\"merged_per_node\":[0,4096]}\n";
        let r = parse(log);
        assert_eq!(r.len(), 1, "ksm has no checksum line yet");
        let f = &r[0];
        assert_eq!(f.name, "fair");
        assert_eq!(f.pages_sharing, 4096);
        assert_eq!(f.migrations, Some(2050));
        assert_eq!(f.activity, Some((3, 190)));
        assert_eq!(f.processes[0].local_share(), 0.5);
        assert!((f.processes[1].local_share() - 2056.0 / 4096.0).abs() < 1e-9);
        assert!(f.processes[0].checksum_ok && !f.processes[1].checksum_ok);
    }

    #[test]
    fn the_hint_overhead_lines_parse_per_hook() {
        let c = crate::files::HintOverhead {
            hook: "fexit".into(),
            chunk_bytes: 4096,
            file_mib: 8.0,
            trials: 7,
            passes: 4,
            without_ms: 10.0,
            idle_ms: 10.1,
            watching_ms: 10.3,
            calls: 8192,
            events: 100,
            ring_full: 0,
        };
        let log = format!(
            "numa-hints fexit {}\r\nnuma-hints-failed sys-exit cannot attach\njunk\n",
            serde_json::to_string(&c).unwrap()
        );
        let r = parse_hint_overhead(&log);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], ("fexit".to_string(), Ok(vec![c])));
        assert_eq!(
            r[1],
            ("sys-exit".to_string(), Err("cannot attach".to_string()))
        );
    }

    #[test]
    fn the_init_runs_every_scenario_then_says_done() {
        let plan = NumaPlan {
            mib: 16,
            delay_s: 5,
            run_s: 60,
            node_mib: 1024,
            hint_overhead_mib: Some(8),
            scenarios: vec![
                Scenario {
                    name: "ksm".into(),
                    mode: Mode::Ksm,
                    nice: (0, 0),
                },
                Scenario {
                    name: "C-10:1".into(),
                    mode: Mode::Priority,
                    nice: (-17, 19),
                },
            ],
        };
        let s = init_script(&plan, "/x/pagesift");
        assert!(s.starts_with("#!/bin/sh\n"));
        assert!(s.contains("scenario ksm ksm 0 0\n"));
        assert!(s.contains("scenario C-10:1 priority -17 19\n"));
        assert!(s.contains("MIB=16") && s.contains("RUN=60") && s.contains("/x/pagesift"));
        let hints = s.find("hint_overhead 8\n").expect("the hint step");
        assert!(s.find("scenario C-10:1").unwrap() < hints);
        assert!(hints < s.find(DONE_MARKER).unwrap());
        assert!(s.contains(DONE_MARKER));
        assert!(!s.contains('@'), "every placeholder is filled");
    }
}
