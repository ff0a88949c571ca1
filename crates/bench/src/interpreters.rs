//! The interpreter-workers experiment's workload (pagesift's real-workload goals): real `python3`
//! processes, not our workload binary, holding a large block of the same
//! bytes beside private memory they keep rewriting.
//!
//! ## What a run starts
//!
//! 1. **The data file**, once per `pagesift bench` invocation
//!    ([`crate::random_file::write`]): `data_mib` MiB of ChaCha8 random bytes from a
//!    fixed seed, in the run's scratch directory. Random, so that no page
//!    of it equals another (or the zero page): every duplicate the
//!    experiment offers comes from the workers holding the same file.
//! 2. **The workers** ([`start_workers`]): `count` processes of the
//!    system's interpreter, [`PYTHON`] (Debian's `python3` package; never
//!    a pyenv shim or a virtualenv: `-I` also keeps `PYTHON*` variables
//!    and the user's site directory out), each running [`WORKER_PY`]
//!    with `-c`: it reads the whole data file into one `bytes` object,
//!    fills a private `bytearray` of `private_mib` MiB with fresh random
//!    bytes, prints one JSON line, then overwrites `write_bytes` random
//!    bytes of the bytearray at a random offset every `write_every_ms`.
//!    glibc serves both large allocations with `mmap`, and the kernel
//!    usually merges the two neighbouring anonymous mappings into one VMA:
//!    the duplicate block and the hot private buffer share a region, as in
//!    the issue's measurement. KSM systems start them with
//!    `PR_SET_MEMORY_MERGE` (what `pagesift exec` does); pagesift gets
//!    them unmarked and by pid.
//! 3. **The exact saving at the start** ([`exact_saving`]): once every
//!    worker has printed its line, and before the system under test starts
//!    (ksmd stopped, no daemon), `pagesift scan --exact --json --pid ...`
//!    reads every present page of the workers; its total `saving` (frames
//!    that merging every duplicate would free: the shared block, less one
//!    copy, plus whatever the interpreters' own heaps have in common) is
//!    the target the experiment's goal is judged against.

use crate::BenchError;
use crate::procs::Workload;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The system's interpreter (Debian's `python3` package).
pub const PYTHON: &str = "/usr/bin/python3";

/// The worker's program (passed with `-c`).
pub const WORKER_PY: &str = include_str!("interpreters/worker.py");

/// Seed of the data file's content.
pub const DATA_SEED: u64 = 0x7079_7468_6f6e_0010;

/// How many workers, and what each holds and writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InterpreterPlan {
    /// Worker processes.
    pub count: usize,
    /// Size of the data file every worker reads into a `bytes` object, MiB.
    pub data_mib: u64,
    /// Private `bytearray` of each worker, MiB.
    pub private_mib: u64,
    /// One write into the private buffer every this many ms.
    pub write_every_ms: u64,
    /// Bytes of new random content per write.
    pub write_bytes: u64,
}

impl InterpreterPlan {
    /// The data file's name in the scratch directory (its size in it, so
    /// that plans of different sizes never share a file).
    pub fn data_file_name(&self) -> String {
        format!("interpreter-data-{}mib.bin", self.data_mib)
    }

    /// `python3`'s arguments for worker `index`.
    pub fn worker_args(&self, data: &Path, index: usize) -> Vec<String> {
        vec![
            "-I".into(),
            "-c".into(),
            WORKER_PY.into(),
            data.display().to_string(),
            (self.private_mib << 20).to_string(),
            self.write_every_ms.to_string(),
            self.write_bytes.to_string(),
            (index + 1).to_string(),
        ]
    }
}

/// Checks that [`PYTHON`] is there, naming the package otherwise.
pub fn check_python() -> Result<(), BenchError> {
    if Path::new(PYTHON).is_file() {
        Ok(())
    } else {
        Err(BenchError::Missing(format!(
            "{PYTHON} (Debian package python3; scripts/setup installs it), needed for the \
             interpreter-workers experiment"
        )))
    }
}

/// Starts the workers (see the module header) one after the other and
/// waits for each one's ready line; checks that each really runs
/// [`PYTHON`] and loaded the whole data file.
pub fn start_workers(
    plan: &InterpreterPlan,
    data: &Path,
    merge_any: bool,
) -> Result<Vec<Workload>, BenchError> {
    let want_data = std::fs::metadata(data)
        .map_err(|e| BenchError::Workload(format!("{}: {e}", data.display())))?
        .len();
    let mut workers = Vec::with_capacity(plan.count);
    for i in 0..plan.count {
        let name = format!("python3 worker {i}");
        let w = Workload::start_named(
            &name,
            Path::new(PYTHON),
            &plan.worker_args(data, i),
            merge_any,
        )?;
        let exe = w.report["executable"].as_str().unwrap_or("");
        let (got_data, got_private) = (w.count("data_bytes"), w.count("private_bytes"));
        if exe != PYTHON || got_data != want_data || got_private != plan.private_mib << 20 {
            return Err(BenchError::Workload(format!(
                "{name}: reported {} (want {PYTHON}, {want_data} data bytes, {} private)",
                w.report,
                plan.private_mib << 20
            )));
        }
        workers.push(w);
    }
    Ok(workers)
}

/// What `pagesift scan --exact` found in the workers at the start.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ExactSaving {
    /// Frames merging every duplicate would free.
    pub saving_pages: u64,
    /// Present pages KSM could consider.
    pub present_pages: u64,
    /// Wall time of the scan, ms.
    pub elapsed_ms: u64,
}

/// Runs `pagesift scan --exact --json --pid ...` on `pids` and reads its
/// totals.
pub fn exact_saving(pagesift: &Path, pids: &[u32]) -> Result<ExactSaving, BenchError> {
    let mut cmd = Command::new(pagesift);
    cmd.args(["scan", "--exact", "--json"]);
    for p in pids {
        cmd.arg("--pid").arg(p.to_string());
    }
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .map_err(|e| BenchError::Spawn(format!("{} scan: {e}", pagesift.display())))?;
    if !out.status.success() {
        return Err(BenchError::Workload(format!(
            "pagesift scan --exact failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    parse_exact_report(&out.stdout, pids.len())
}

/// The totals of a `pagesift scan --exact --json` report that covered
/// `processes` processes.
pub fn parse_exact_report(json: &[u8], processes: usize) -> Result<ExactSaving, BenchError> {
    let bad = |why: String| BenchError::Workload(format!("pagesift scan --exact --json: {why}"));
    let v: serde_json::Value =
        serde_json::from_slice(json).map_err(|e| bad(format!("not JSON: {e}")))?;
    if v["mode"] != "Exact" {
        return Err(bad(format!("mode {}, not Exact", v["mode"])));
    }
    let scanned = v["processes"].as_array().map_or(0, |a| a.len());
    if scanned != processes {
        return Err(bad(format!(
            "{scanned} processes scanned, not {processes} (skipped: {})",
            v["skipped"]
        )));
    }
    let count = |key: &str| -> Result<u64, BenchError> {
        let t = &v["totals"][key];
        t.as_u64()
            .or_else(|| t["value"].as_f64().map(|f| f as u64))
            .ok_or_else(|| bad(format!("no totals.{key}")))
    };
    Ok(ExactSaving {
        saving_pages: count("saving")?,
        present_pages: count("present")?,
        elapsed_ms: v["elapsed_ms"].as_u64().unwrap_or(0),
    })
}

/// The data file of `plan` in `dir`, written if it is not there yet.
pub fn data_file(dir: &Path, plan: &InterpreterPlan) -> Result<PathBuf, BenchError> {
    let path = dir.join(plan.data_file_name());
    if !path.is_file() {
        crate::random_file::write(&path, plan.data_mib << 20, DATA_SEED)
            .map_err(|e| BenchError::Output(format!("{}: {e}", path.display())))?;
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_arguments_carry_the_plan() {
        let plan = InterpreterPlan {
            count: 2,
            data_mib: 24,
            private_mib: 8,
            write_every_ms: 5,
            write_bytes: 4096,
        };
        let a = plan.worker_args(Path::new("/tmp/d.bin"), 1);
        assert_eq!(a[..3], ["-I", "-c", WORKER_PY]);
        assert_eq!(a[3..], ["/tmp/d.bin", "8388608", "5", "4096", "2"]);
        assert!(WORKER_PY.contains("sys.argv[5]"));
    }

    #[test]
    fn exact_reports_are_read_and_checked() {
        let json = br#"{"mode":"Exact","processes":[{"pid":1},{"pid":2}],
            "totals":{"size_pages":9,"present":500,"zero":0,"merged":0,
            "saving":{"value":300.0,"low":300.0,"high":300.0}},
            "skipped":[],"gone":0,"elapsed_ms":12,"pages_read":500}"#;
        let e = parse_exact_report(json, 2).unwrap();
        assert_eq!(
            e,
            ExactSaving {
                saving_pages: 300,
                present_pages: 500,
                elapsed_ms: 12
            }
        );
        let err = parse_exact_report(json, 3).unwrap_err().to_string();
        assert!(err.contains("2 processes scanned, not 3"), "{err}");
        let sampled = String::from_utf8_lossy(json).replace("\"Exact\"", "{\"Sampled\":{}}");
        assert!(parse_exact_report(sampled.as_bytes(), 2).is_err());
    }
}
