//! The files experiment's workload and the I/O hint program's measured
//! cost (see [`crate::experiment::FilesPlan`]).
//!
//! ## The files
//! [`file_set`] writes `files` files of `file_mib` MiB of ChaCha8 random
//! bytes (no page equals another or the zero page: every duplicate comes
//! from readers holding the same file) once per invocation, and gives each
//! reader its own directory of hard links to them, so that each reads "its
//! own" files by its own names. [`reader_args`] makes reader `k` read them
//! in its own shuffled order, with `read`, `pread64` or `preadv` in turn,
//! beside its own `private_mib` MiB of distinct pages.
//!
//! ## The hint program's cost
//! [`hint_overhead`] times a read-heavy process (a reader re-reading a
//! cached file in `pread64` calls of each size asked for, 4 KiB and 64 KiB
//! by default, [`CALL_BYTES`]) without the BPF
//! program, with it loaded but not watching the reader (what every other
//! process on the host pays), and with it watching the reader, alternating,
//! and compares medians. [`program_overhead`] times real programs the same
//! way ([`PROGRAMS`]: `cat`, nothing but 128 KiB reads and writes to
//! `/dev/null`, and `sha256sum`, which reads and hashes), each reading the
//! same cached files a few times per run: the pread64 loop is the worst
//! case of a syscall-bound reader, these are what a host runs;
//! the per-hint cost from the ring to the stack is the daemon's own figure
//! (`pagesift status`, hints.per_hint_ns).

use crate::BenchError;
use crate::experiment::FilesPlan;
use crate::procs::Workload;
use std::path::{Path, PathBuf};

/// Seed of file `i`'s content.
fn seed(i: usize) -> u64 {
    0x786c_6866_696c_6500 + i as u64
}

fn output_error(p: &Path, e: std::io::Error) -> BenchError {
    BenchError::Output(format!("{}: {e}", p.display()))
}

/// `files` files of `file_mib` MiB of random bytes, file `i` from
/// [`seed`]`(i)`, as `dir/xlh-files-FILESxMIBmib/data-i.bin` (written the
/// first time they are asked for): the files experiment's, and the files
/// the guest-files experiment's guests read from their disks.
pub fn data_files(dir: &Path, files: usize, file_mib: u64) -> Result<Vec<PathBuf>, BenchError> {
    let base = dir.join(format!("xlh-files-{files}x{file_mib}mib"));
    std::fs::create_dir_all(&base).map_err(|e| output_error(&base, e))?;
    let mut originals = Vec::new();
    for i in 0..files {
        let p = base.join(format!("data-{i}.bin"));
        if !p.is_file() {
            crate::random_file::write(&p, file_mib << 20, seed(i))
                .map_err(|e| output_error(&p, e))?;
        }
        originals.push(p);
    }
    Ok(originals)
}

/// The plan's files (written once) and each reader's directory of links.
pub fn file_set(dir: &Path, plan: &FilesPlan) -> Result<Vec<Vec<PathBuf>>, BenchError> {
    let out = output_error;
    let originals = data_files(dir, plan.files, plan.file_mib)?;
    let base = dir.join(format!("xlh-files-{}x{}mib", plan.files, plan.file_mib));
    let mut sets = Vec::new();
    for k in 0..plan.readers {
        let d = base.join(format!("reader-{k}"));
        std::fs::create_dir_all(&d).map_err(|e| out(&d, e))?;
        let mut names = Vec::new();
        for (i, o) in originals.iter().enumerate() {
            let link = d.join(format!("r{k}-page-{i}.html"));
            if !link.exists() {
                std::fs::hard_link(o, &link).map_err(|e| out(&link, e))?;
            }
            names.push(link);
        }
        sets.push(names);
    }
    Ok(sets)
}

/// `pagesift-workload` arguments of reader `k`.
pub fn reader_args(plan: &FilesPlan, k: usize, files: &[PathBuf]) -> Vec<String> {
    let list: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    vec![
        "read-files".into(),
        "--files".into(),
        list.join(","),
        "--order-seed".into(),
        (k + 1).to_string(),
        "--syscall".into(),
        ["read", "pread64", "preadv"][k % 3].into(),
        "--private-mib".into(),
        plan.private_mib.to_string(),
        "--seed".into(),
        (100 + k).to_string(),
    ]
}

/// Sends `read` to a reader and checks that it read every byte.
pub fn read_now(w: &mut Workload, plan: &FilesPlan) -> Result<f64, BenchError> {
    let r = w.ask("read")?;
    let placed = r["read"].as_array().cloned().unwrap_or_default();
    let bytes: u64 = placed.iter().filter_map(|f| f["bytes"].as_u64()).sum();
    let want = plan.files as u64 * (plan.file_mib << 20);
    if bytes != want {
        return Err(BenchError::Workload(format!(
            "a reader read {bytes} bytes, not {want}: {r}"
        )));
    }
    Ok(r["seconds"].as_f64().unwrap_or(0.0))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Alternating trials of each kind in [`hint_overhead`].
#[cfg(target_arch = "x86_64")]
const TRIALS: usize = 7;
/// Passes over the files per trial: one pass of 64 KiB calls over 16 MiB
/// takes about 3 ms, short enough for a fixed cost to look like a per-call
/// one.
#[cfg(target_arch = "x86_64")]
const READS_PER_TRIAL: u64 = 4;

/// The hint program's cost on a read-heavy process, for one call size.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct HintOverhead {
    /// Where the program was attached (`fexit`, `tp_btf/sys_exit`).
    pub hook: String,
    /// The `pread64` call size, bytes.
    pub chunk_bytes: u64,
    /// The cached files read, MiB.
    pub file_mib: f64,
    /// Alternating trials of each case (the medians are compared).
    pub trials: usize,
    /// Passes over the files per trial.
    pub passes: u64,
    /// Median trial without the program, ms.
    pub without_ms: f64,
    /// With it attached but not watching the reader, ms.
    pub idle_ms: f64,
    /// With it watching the reader, ms.
    pub watching_ms: f64,
    /// `pread64` calls per trial.
    pub calls: u64,
    /// Events the program wrote, and those lost to a full ring.
    pub events: u64,
    pub ring_full: u64,
}

/// The files' sizes, summed.
#[cfg(target_arch = "x86_64")]
fn total_bytes(files: &[PathBuf]) -> Result<u64, BenchError> {
    let mut bytes = 0;
    for f in files {
        bytes += std::fs::metadata(f)
            .map_err(|e| BenchError::Output(format!("{}: {e}", f.display())))?
            .len();
    }
    Ok(bytes)
}

/// How much longer `with_ms` took than `without_ms`, in %.
fn extra_pct(with_ms: f64, without_ms: f64) -> f64 {
    (with_ms / without_ms - 1.0) * 100.0
}

/// The call sizes [`hint_overhead`] times unless told otherwise: a page,
/// the smallest call a hint can come from, and 64 KiB.
pub const CALL_BYTES: [u64; 2] = [4096, 65536];

/// A call size as the report writes it: `512 B`, `4 KiB`.
pub fn call_size(bytes: u64) -> String {
    if bytes >= 1024 && bytes.is_multiple_of(1024) {
        format!("{} KiB", bytes / 1024)
    } else {
        format!("{bytes} B")
    }
}

impl HintOverhead {
    /// Extra time with the program attached, not watching, in %.
    pub fn idle_pct(&self) -> f64 {
        extra_pct(self.idle_ms, self.without_ms)
    }

    /// Extra time with the program watching the reader, in %.
    pub fn watching_pct(&self) -> f64 {
        extra_pct(self.watching_ms, self.without_ms)
    }

    /// Extra time per call with the program watching, ns.
    pub fn watching_ns_per_call(&self) -> f64 {
        (self.watching_ms - self.without_ms) * 1e6 / self.calls as f64
    }

    /// The report's line.
    pub fn line(&self) -> String {
        format!(
            "I/O hint program overhead ({}), {} pread64 calls over cached files of {:.0} MiB \
             (median of {} alternating trials of {} passes): {:.2} ms without the program, {:.2} ms \
             with it attached but not watching the reader ({:+.1} %), {:.2} ms with it watching \
             the reader: {:+.1} % ({:+.0} ns per call; {} events read, {} lost to a full ring)",
            self.hook,
            call_size(self.chunk_bytes),
            self.file_mib,
            self.trials,
            self.passes,
            self.without_ms,
            self.idle_ms,
            self.idle_pct(),
            self.watching_ms,
            self.watching_pct(),
            self.watching_ns_per_call(),
            self.events,
            self.ring_full
        )
    }
}

/// The hint program's overhead on a read-heavy process (module header),
/// for each call size in `call_bytes` (bytes). `workload` is the workload
/// program and the arguments before its own; `hook` forces one of the
/// program's hooks (`None`: the one `[hints] hook = "auto"` takes).
#[cfg(target_arch = "x86_64")]
pub fn hint_overhead(
    workload: (&Path, &[String]),
    files: &[PathBuf],
    hook: Option<pagesift_linux::iohint::Hook>,
    call_bytes: &[u64],
) -> Result<Vec<HintOverhead>, BenchError> {
    use pagesift_linux::iohint::{HintSource, HintSourceConfig};
    let bytes = total_bytes(files)?;
    let list: Vec<String> = files.iter().map(|p| p.display().to_string()).collect();
    let list = list.join(",");
    let mut out = Vec::new();
    for &chunk_bytes in call_bytes {
        let args: Vec<String> = workload
            .1
            .iter()
            .map(String::as_str)
            .chain([
                "read-files",
                "--files",
                &list,
                "--syscall",
                "pread64",
                "--chunk-bytes",
                &chunk_bytes.to_string(),
            ])
            .map(|s| s.to_string())
            .collect();
        let mut w = Workload::start(workload.0, &args, false)?;
        let pid = w.pgid();
        // One trial: READS_PER_TRIAL passes over the files, seconds.
        let trial = |w: &mut Workload| -> Result<f64, BenchError> {
            let mut seconds = 0.0;
            for _ in 0..READS_PER_TRIAL {
                seconds += w.ask("read")?["seconds"].as_f64().unwrap_or(0.0);
            }
            Ok(seconds)
        };
        trial(&mut w)?; // warm the page cache and the buffer
        let (mut absent, mut idle, mut on) = (Vec::new(), Vec::new(), Vec::new());
        let mut hints = 0u64;
        let mut ring_full = 0u64;
        let mut attached = "";
        for _ in 0..TRIALS {
            absent.push(trial(&mut w)?);
            let mut src = HintSource::open(&HintSourceConfig {
                hook,
                ..HintSourceConfig::default()
            })
            .map_err(|e| BenchError::Missing(format!("I/O hint program: {e}")))?;
            // Loading ran the verifier and the JIT on this machine's two
            // cores just now: one untimed pass lets the caches settle, so
            // the trials time the program, not its loading.
            trial(&mut w)?;
            idle.push(trial(&mut w)?);
            attached = src.hook().name();
            src.watch([pid]);
            on.push(trial(&mut w)?);
            hints += src.drain(|_| {});
            ring_full += src.counters().ring_full;
        }
        out.push(HintOverhead {
            hook: attached.to_string(),
            chunk_bytes,
            file_mib: bytes as f64 / 1048576.0,
            trials: TRIALS,
            passes: READS_PER_TRIAL,
            without_ms: median(&mut absent) * 1e3,
            idle_ms: median(&mut idle) * 1e3,
            watching_ms: median(&mut on) * 1e3,
            calls: READS_PER_TRIAL * bytes.div_ceil(chunk_bytes),
            events: hints,
            ring_full,
        });
    }
    Ok(out)
}

/// The real programs [`program_overhead`] times, looked up in `PATH`, and
/// how many times one run reads each file: `cat` copies a cached MiB in
/// about 0.15 ms here, so that a run lasts tens of milliseconds, not the
/// few that its exec's own jitter would swamp (by hand, 2026-12-02, the
/// live test on this 2-CPU AMD EPYC: 4 passes over 8 MiB took 4.7 ms, and
/// read +20 % attached but not watching against +6 % watching in the same
/// trials).
pub const PROGRAMS: [(&str, u64); 2] = [("cat", 32), ("sha256sum", 4)];

/// The hint program's cost on one real program reading the cached files.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ProgramOverhead {
    /// Where the program was attached (`fexit`, `tp_btf/sys_exit`).
    pub hook: String,
    /// The program, as found in `PATH`.
    pub program: String,
    /// The cached files it reads, MiB.
    pub file_mib: f64,
    /// Times it reads each file in one run.
    pub passes: u64,
    /// Alternating trials of each case (the medians are compared).
    pub trials: usize,
    /// Median run without the hint program, ms.
    pub without_ms: f64,
    /// With it attached but not watching the program, ms.
    pub idle_ms: f64,
    /// With it watching the program, ms.
    pub watching_ms: f64,
    /// Events the program wrote while watched, and those lost to a full ring.
    pub events: u64,
    pub ring_full: u64,
}

impl ProgramOverhead {
    /// Extra time with the hint program attached, not watching, in %.
    pub fn idle_pct(&self) -> f64 {
        extra_pct(self.idle_ms, self.without_ms)
    }

    /// Extra time with the hint program watching, in %.
    pub fn watching_pct(&self) -> f64 {
        extra_pct(self.watching_ms, self.without_ms)
    }

    /// The report's line.
    pub fn line(&self) -> String {
        format!(
            "I/O hint program overhead ({}) on `{}` reading cached files of {:.0} MiB {} times \
             (median of {} alternating runs): {:.2} ms without the program, {:.2} ms with it attached but not \
             watching ({:+.1} %), {:.2} ms with it watching: {:+.1} % ({} events read, {} lost to \
             a full ring)",
            self.hook,
            self.program,
            self.file_mib,
            self.passes,
            self.trials,
            self.without_ms,
            self.idle_ms,
            self.idle_pct(),
            self.watching_ms,
            self.watching_pct(),
            self.events,
            self.ring_full
        )
    }
}

/// One run of `program` over `files`, each `passes` times, in seconds: it
/// is started held (a shell waiting for a line on its stdin, then exec'ing
/// the program, so the pid stays), `watch` is told its pid, and the clock
/// runs from its release to its exit.
#[cfg(target_arch = "x86_64")]
fn run_program(
    program: &Path,
    passes: u64,
    files: &[PathBuf],
    watch: Option<&mut pagesift_linux::iohint::HintSource>,
) -> Result<f64, BenchError> {
    use std::io::Write as _;
    use std::process::{Command, Stdio};
    let err = |e: std::io::Error| BenchError::Output(format!("{}: {e}", program.display()));
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("read _ && exec \"$0\" \"$@\"")
        .arg(program);
    for _ in 0..passes {
        cmd.args(files);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .map_err(err)?;
    if let Some(src) = watch {
        src.watch([child.id()]);
    }
    let t = std::time::Instant::now();
    let mut stdin = child.stdin.take().expect("piped");
    let wrote = stdin.write_all(b"\n");
    drop(stdin);
    let status = child.wait().map_err(err)?;
    let seconds = t.elapsed().as_secs_f64();
    wrote.map_err(err)?;
    if !status.success() {
        return Err(BenchError::Output(format!(
            "{} over the files: {status}",
            program.display()
        )));
    }
    Ok(seconds)
}

/// The hint program's overhead on the real [`PROGRAMS`] found in `PATH`
/// (module header), as [`hint_overhead`] measures it.
#[cfg(target_arch = "x86_64")]
pub fn program_overhead(
    files: &[PathBuf],
    hook: Option<pagesift_linux::iohint::Hook>,
) -> Result<Vec<ProgramOverhead>, BenchError> {
    use pagesift_linux::iohint::{HintSource, HintSourceConfig};
    let bytes = total_bytes(files)?;
    let mut out = Vec::new();
    let found = PROGRAMS
        .iter()
        .filter_map(|&(name, passes)| Some((crate::guest::host::find_in_path(name)?, passes)));
    for (program, passes) in found {
        let run = |src: Option<&mut HintSource>| run_program(&program, passes, files, src);
        run(None)?; // warm the page cache
        let (mut absent, mut idle, mut on) = (Vec::new(), Vec::new(), Vec::new());
        let (mut events, mut ring_full) = (0u64, 0u64);
        let mut attached = "";
        for _ in 0..TRIALS {
            absent.push(run(None)?);
            let mut src = HintSource::open(&HintSourceConfig {
                hook,
                ..HintSourceConfig::default()
            })
            .map_err(|e| BenchError::Missing(format!("I/O hint program: {e}")))?;
            // After loading, one untimed run (see hint_overhead).
            run(None)?;
            idle.push(run(None)?);
            attached = src.hook().name();
            on.push(run(Some(&mut src))?);
            events += src.drain(|_| {});
            ring_full += src.counters().ring_full;
        }
        out.push(ProgramOverhead {
            hook: attached.to_string(),
            program: program.display().to_string(),
            file_mib: bytes as f64 / 1048576.0,
            passes,
            trials: TRIALS,
            without_ms: median(&mut absent) * 1e3,
            idle_ms: median(&mut idle) * 1e3,
            watching_ms: median(&mut on) * 1e3,
            events,
            ring_full,
        });
    }
    Ok(out)
}

/// Only x86-64 has the hint program.
#[cfg(not(target_arch = "x86_64"))]
pub fn program_overhead(
    _files: &[PathBuf],
    _hook: Option<()>,
) -> Result<Vec<ProgramOverhead>, BenchError> {
    Err(BenchError::Missing(
        "the I/O hint program (x86-64 only)".into(),
    ))
}

/// Only x86-64 has the hint program.
#[cfg(not(target_arch = "x86_64"))]
pub fn hint_overhead(
    _workload: (&Path, &[String]),
    _files: &[PathBuf],
    _hook: Option<()>,
) -> Result<Vec<HintOverhead>, BenchError> {
    Err(BenchError::Missing(
        "the I/O hint program (x86-64 only)".into(),
    ))
}
