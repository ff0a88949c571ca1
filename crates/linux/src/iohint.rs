//! I/O hints from eBPF: which whole pages of which process just received
//! data from a file (or were just written to one).
//!
//! ## Why
//! A page that a read just filled from a file is a likely duplicate: of the
//! same file read by another process, or of the same disk-image block read
//! by another guest (QEMU reads guest disks with `preadv` from its worker
//! threads, straight into guest RAM). It is also likely to stay unchanged.
//! The XLH dissertation (§4.3.2) reports the target area of each read and
//! write in the VFS as a hint to its scanner; without a kernel patch, the
//! same facts are at the syscall exit.
//!
//! ## How
//! `bpf/iohint.bpf.c` (compiled by `build.rs` with clang, embedded here and
//! loaded with aya) has one small program per [`Syscall`], each attached
//! with fexit to the exit of that syscall's entry function
//! (`__x64_sys_read`, ...) and only for the syscalls enabled. That needs
//! no tracefs and no kprobes, and the data is in the buffer when it fires
//! (XLH records the hint only after the I/O for the same reason, §4.4).
//! Other syscalls pay nothing. Where the kernel refuses BPF trampolines
//! (this project's machines do), the program attaches to the raw
//! tracepoint `sys_exit` instead ([`Hook`]), which runs on every syscall
//! exit of every process, so that even a process not watched pays on every
//! syscall (docs/benchmarks.md, files experiment). For a process whose
//! tgid is in the `tgids` map
//! (the daemon keeps it equal to its eligible processes), after a syscall
//! of an enabled [`Syscall`] that moved `ret > 0` bytes, it clips the
//! buffer to `ret` (for vector calls: the iovecs in order until `ret` is
//! used up, at most [`MAX_IOVECS`] of them; more are counted), rounds it
//! inward to whole pages and, if a page is left, writes one event to a
//! ring buffer with the kernel's adaptive notification: a reader asleep on
//! the ring ([`HintSource::wake_fd`]) is woken by the first event after it
//! drained the ring, and by no later one until it drains again. (A wake-up
//! per event made the traced process pay microseconds per syscall and,
//! with a 16 MiB ring, still lost events on this kind of machine; with no
//! wake-up at all, hints waited up to a second for the daemon's next
//! wake-up.) A reservation that fails because the ring is full is counted
//! ([`HintCounters::ring_full`]), never silent.
//!
//! Only I/O of file data is hinted: the descriptor (the call's first
//! argument, looked up in the process's file table after the call) must
//! name a regular file or a block device, and a regular file must not be
//! on a filesystem whose files the kernel makes up at each read (procfs,
//! sysfs, cgroupfs, debugfs and the like; the list is in the program).
//! XLH hints I/O to the background store (§4.3.2); the buffer of a read of
//! `/proc/PID/pagemap`, a pipe or a socket holds data no other process or
//! guest holds, and hinting it costs the daemon a read and a hash of each
//! page for nothing. Such calls are counted
//! ([`HintCounters::not_file_data`]). The program reads the kernel's
//! `task_struct`, `files_struct`, `fdtable`, `file`, `inode` and
//! `super_block` through CO-RE relocations, which aya resolves against the
//! kernel's BTF at load.
//!
//! A single-buffer call that hints exactly the pages of the last hint of
//! its direction (read or write) on its CPU, from the same process, is not
//! hinted again: that is a buffer reused call after call (`cat`,
//! `sha256sum` and `cp` stream a file through one buffer), whose pages
//! hold the file's data only until the next call. The first hint names
//! the pages already, and the daemon reads what they hold when it looks
//! the hint up; the repeats would cost the reader a ring-buffer record and
//! the daemon a look-up each. They are counted ([`HintCounters::repeated`]).
//!
//! ## Invariants
//! - A hint covers only whole pages inside the bytes the syscall moved.
//! - A hint comes only from a call on a descriptor of file data (above).
//! - Only processes in the `tgids` map produce hints.
//! - The program never writes user or kernel memory; it only reads the
//!   saved registers, the iovec array and the descriptor's file.
//!
//! ## When it cannot run
//! [`HintSource::open`] checks, in order, the capabilities (`CAP_BPF` and
//! `CAP_PERFMON`, or `CAP_SYS_ADMIN`), kernel BTF, the kernel lockdown
//! (`confidentiality` forbids reading kernel memory from BPF), then loads
//! and attaches; each failure is an [`Unavailable`] naming what is
//! missing, and the caller runs on without hints.

use crate::caps::{self, Capability};
use aya::maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::{BtfTracePoint, FExit};
use aya::{Btf, Ebpf, EbpfLoader, Endianness};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The compiled program (see `build.rs`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/iohint.bpf.o"));

/// Most iovecs read per vector call (`MAX_SEGS` in the program): 64 covers
/// a 256 KiB guest disk request with one guest page per iovec.
pub const MAX_IOVECS: usize = 64;

/// Where the kernel publishes its BTF.
pub const KERNEL_BTF: &str = "/sys/kernel/btf/vmlinux";

/// Where the kernel shows its lockdown mode (when securityfs is mounted).
const LOCKDOWN: &str = "/sys/kernel/security/lockdown";

/// A syscall the program can hint. The discriminant is the program's
/// `enum kind`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Syscall {
    Read = 0,
    Pread64 = 1,
    Readv = 2,
    Preadv = 3,
    Preadv2 = 4,
    Write = 5,
    Pwrite64 = 6,
    Writev = 7,
    Pwritev = 8,
    Pwritev2 = 9,
}

impl Syscall {
    /// Every hintable syscall, reads first.
    pub const ALL: [Syscall; 10] = [
        Syscall::Read,
        Syscall::Pread64,
        Syscall::Readv,
        Syscall::Preadv,
        Syscall::Preadv2,
        Syscall::Write,
        Syscall::Pwrite64,
        Syscall::Writev,
        Syscall::Pwritev,
        Syscall::Pwritev2,
    ];

    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Syscall::Read => "read",
            Syscall::Pread64 => "pread64",
            Syscall::Readv => "readv",
            Syscall::Preadv => "preadv",
            Syscall::Preadv2 => "preadv2",
            Syscall::Write => "write",
            Syscall::Pwrite64 => "pwrite64",
            Syscall::Writev => "writev",
            Syscall::Pwritev => "pwritev",
            Syscall::Pwritev2 => "pwritev2",
        }
    }

    /// The syscall called `name`.
    pub fn from_name(name: &str) -> Option<Syscall> {
        Syscall::ALL.into_iter().find(|s| s.name() == name)
    }

    fn from_kind(kind: u32) -> Option<Syscall> {
        Syscall::ALL.get(kind as usize).copied()
    }

    /// Whether it moves data from a file into memory.
    pub fn is_read(self) -> bool {
        (self as u32) < Syscall::Write as u32
    }
}

/// Whole pages of one buffer that one syscall filled (or wrote out).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoHint {
    /// The calling process.
    pub tgid: u32,
    pub syscall: Syscall,
    /// Page-aligned first address.
    pub start: u64,
    /// Whole pages from `start`.
    pub pages: u64,
}

/// The program's cumulative counters, summed over CPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HintCounters {
    /// Events written to the ring.
    pub events: u64,
    /// Events lost because the ring was full.
    pub ring_full: u64,
    /// Vector calls with more than [`MAX_IOVECS`] iovecs filled: the rest
    /// was not hinted.
    pub iovecs_beyond: u64,
    /// Calls that moved data but covered no whole page.
    pub no_whole_page: u64,
    /// Calls whose buffer held a whole page, from or to something other
    /// than file data (a pipe, a socket, a character device, a file of procfs,
    /// sysfs or another filesystem whose files the kernel makes up at each
    /// read): not hinted.
    pub not_file_data: u64,
    /// Single-buffer calls that hinted exactly the pages of the last hint
    /// of the same direction on their CPU, from the same process: a
    /// buffer reused call after call, whose first hint names those pages
    /// already. Not hinted again.
    pub repeated: u64,
}

/// Why hints cannot be had; the message names what is missing.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    #[error(
        "missing capability {0}: I/O hints need CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) to load and attach their BPF program"
    )]
    MissingCapability(Capability),
    #[error(
        "no kernel BTF at {path} ({error}): I/O hints attach fexit programs to the syscall functions, which needs a kernel built with CONFIG_DEBUG_INFO_BTF"
    )]
    NoBtf { path: PathBuf, error: String },
    #[error(
        "kernel lockdown is in confidentiality mode: BPF may not read the saved syscall registers, so I/O hints are off"
    )]
    Lockdown,
    #[error("the I/O hint BPF program could not be {stage}: {error}")]
    Load { stage: &'static str, error: String },
}

/// What to load.
#[derive(Clone, Debug)]
pub struct HintSourceConfig {
    /// Syscalls that produce hints.
    pub syscalls: Vec<Syscall>,
    /// The kernel's BTF ([`KERNEL_BTF`]).
    pub btf: PathBuf,
    /// The hook to use; `None`: fexit where the kernel allows it, else
    /// `tp_btf/sys_exit`.
    pub hook: Option<Hook>,
}

/// Where the program is attached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// fexit on each enabled syscall's entry function: only those syscalls
    /// pay.
    Fexit,
    /// The raw tracepoint `sys_exit`: every syscall of every process pays.
    SysExit,
}

impl Hook {
    /// How status and logs name it.
    pub fn name(self) -> &'static str {
        match self {
            Hook::Fexit => "fexit",
            Hook::SysExit => "tp_btf/sys_exit",
        }
    }
}

impl Default for HintSourceConfig {
    fn default() -> Self {
        HintSourceConfig {
            syscalls: Syscall::ALL.to_vec(),
            btf: PathBuf::from(KERNEL_BTF),
            hook: None,
        }
    }
}

/// The loaded, attached program and its maps. Dropping it detaches the
/// program and frees the maps.
pub struct HintSource {
    ring: RingBuf<MapData>,
    tgids: BpfHashMap<MapData, u32, u8>,
    counters: PerCpuArray<MapData, u64>,
    watched: BTreeSet<u32>,
    hook: Hook,
    /// Holds the program (and its link) for as long as the source lives.
    _ebpf: Ebpf,
}

/// The first capability of the two the program needs that the calling
/// thread lacks, if any (`CAP_SYS_ADMIN` stands in for both).
pub fn missing_capability() -> Option<Capability> {
    if caps::has(Capability::SysAdmin) {
        return None;
    }
    [Capability::Bpf, Capability::Perfmon]
        .into_iter()
        .find(|&c| !caps::has(c))
}

/// Whether the kernel lockdown forbids what the program does. Unknown
/// (securityfs not mounted) counts as allowed: the load then says.
pub fn lockdown_forbids() -> bool {
    std::fs::read_to_string(LOCKDOWN).is_ok_and(|s| s.contains("[confidentiality]"))
}

fn load_err(stage: &'static str) -> impl Fn(String) -> Unavailable {
    move |error| Unavailable::Load { stage, error }
}

impl HintSource {
    /// Checks what the program needs, loads it and attaches the program of
    /// each enabled syscall. No process is watched until [`HintSource::watch`].
    pub fn open(config: &HintSourceConfig) -> Result<HintSource, Unavailable> {
        if let Some(cap) = missing_capability() {
            return Err(Unavailable::MissingCapability(cap));
        }
        let btf = read_btf(&config.btf)?;
        if lockdown_forbids() {
            return Err(Unavailable::Lockdown);
        }
        // One loader for both tries: `EbpfLoader::new` parses the kernel's
        // BTF (5.5 MB here, about 25 ms of CPU) before `btf` replaces it.
        let mut loader = EbpfLoader::new();
        loader.btf(Some(&btf));
        let mut load = || {
            loader
                .load(OBJECT)
                .map_err(|e| e.to_string())
                .map_err(load_err("loaded"))
        };
        let mut ebpf = load()?;
        let hook = match config.hook {
            Some(Hook::SysExit) => {
                attach_sys_exit(&mut ebpf, &btf, &config.syscalls)?;
                Hook::SysExit
            }
            Some(Hook::Fexit) => {
                attach_fexit(&mut ebpf, &btf, &config.syscalls)?;
                Hook::Fexit
            }
            None => match attach_fexit(&mut ebpf, &btf, &config.syscalls) {
                Ok(()) => Hook::Fexit,
                Err(fexit) => {
                    // A fresh object: nothing of the failed try stays
                    // loaded or attached.
                    drop(ebpf);
                    ebpf = load()?;
                    attach_sys_exit(&mut ebpf, &btf, &config.syscalls).map_err(|e| match e {
                        Unavailable::Load { stage, error } => Unavailable::Load {
                            stage,
                            error: format!("{error} (and fexit before it: {fexit})"),
                        },
                        other => other,
                    })?;
                    Hook::SysExit
                }
            },
        };
        let tgids = take_map(&mut ebpf, "tgids")?;
        let counters = take_map(&mut ebpf, "counters")?;
        let ring = take_map(&mut ebpf, "hints")?;
        Ok(HintSource {
            ring,
            tgids,
            counters,
            watched: BTreeSet::new(),
            hook,
            _ebpf: ebpf,
        })
    }

    /// Makes the set of processes that produce hints exactly `tgids`.
    /// Returns how many could not be added (the map holds 65 536).
    pub fn watch(&mut self, tgids: impl IntoIterator<Item = u32>) -> usize {
        let want: BTreeSet<u32> = tgids.into_iter().collect();
        for &gone in self.watched.difference(&want) {
            let _ = self.tgids.remove(&gone);
        }
        let mut failed = 0;
        let mut now = BTreeSet::new();
        for &t in &want {
            if self.watched.contains(&t) || self.tgids.insert(t, 1, 0).is_ok() {
                now.insert(t);
            } else {
                failed += 1;
            }
        }
        self.watched = now;
        failed
    }

    /// The ring's descriptor: readable while events wait, and it wakes a
    /// `poll` on it when the first event after a drain arrives.
    pub fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.ring.as_fd()
    }

    /// Where the program is attached.
    pub fn hook(&self) -> Hook {
        self.hook
    }

    /// Processes that produce hints now.
    pub fn watched(&self) -> &BTreeSet<u32> {
        &self.watched
    }

    /// Hands every hint in the ring to `f`, oldest first; returns how many
    /// events (syscalls) were read.
    pub fn drain(&mut self, mut f: impl FnMut(IoHint)) -> u64 {
        let mut events = 0;
        while let Some(item) = self.ring.next() {
            events += 1;
            parse_event(&item, &mut f);
        }
        events
    }

    /// The program's counters.
    pub fn counters(&self) -> HintCounters {
        let slot = |i: u32| -> u64 {
            self.counters
                .get(&i, 0)
                .map(|v| v.iter().sum())
                .unwrap_or(0)
        };
        HintCounters {
            events: slot(0),
            ring_full: slot(1),
            iovecs_beyond: slot(2),
            no_whole_page: slot(3),
            not_file_data: slot(4),
            repeated: slot(5),
        }
    }
}

/// Attaches one fexit program per enabled syscall.
fn attach_fexit(ebpf: &mut Ebpf, btf: &Btf, syscalls: &[Syscall]) -> Result<(), Unavailable> {
    for &sc in syscalls {
        let name = format!("iohint_{}", sc.name());
        let function = format!("__x64_sys_{}", sc.name());
        let prog: &mut FExit = ebpf
            .program_mut(&name)
            .ok_or_else(|| format!("no program {name} in the object"))
            .map_err(load_err("loaded"))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| e.to_string())
            .map_err(load_err("loaded"))?;
        prog.load(&function, btf)
            .map_err(|e| format!("{name} for fexit/{function}: {}", verbose(&e)))
            .map_err(load_err("loaded"))?;
        prog.attach()
            .map_err(|e| format!("fexit/{function}: {}", verbose(&e)))
            .map_err(load_err("attached"))?;
    }
    Ok(())
}

/// Sets the syscall mask and attaches the program on `tp_btf/sys_exit`.
fn attach_sys_exit(ebpf: &mut Ebpf, btf: &Btf, syscalls: &[Syscall]) -> Result<(), Unavailable> {
    let mask: u64 = syscalls.iter().map(|&s| 1u64 << s as u32).sum();
    let mut mask_map: Array<&mut MapData, u64> = ebpf
        .map_mut("syscall_mask")
        .ok_or_else(|| "no map syscall_mask in the object".to_string())
        .map_err(load_err("loaded"))?
        .try_into()
        .map_err(|e: aya::maps::MapError| e.to_string())
        .map_err(load_err("loaded"))?;
    mask_map
        .set(0, mask, 0)
        .map_err(|e| e.to_string())
        .map_err(load_err("configured"))?;
    let prog: &mut BtfTracePoint = ebpf
        .program_mut("iohint_sys_exit")
        .ok_or_else(|| "no program iohint_sys_exit in the object".to_string())
        .map_err(load_err("loaded"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| e.to_string())
        .map_err(load_err("loaded"))?;
    prog.load("sys_exit", btf)
        .map_err(|e| verbose(&e))
        .map_err(load_err("loaded"))?;
    prog.attach()
        .map_err(|e| verbose(&e))
        .map_err(load_err("attached to tp_btf/sys_exit"))?;
    Ok(())
}

fn read_btf(path: &Path) -> Result<Btf, Unavailable> {
    Btf::parse_file(path, Endianness::default()).map_err(|e| Unavailable::NoBtf {
        path: path.to_path_buf(),
        error: e.to_string(),
    })
}

fn take_map<M>(ebpf: &mut Ebpf, name: &str) -> Result<M, Unavailable>
where
    M: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| format!("no map {name} in the object"))
        .map_err(load_err("loaded"))?;
    M::try_from(map)
        .map_err(|e| e.to_string())
        .map_err(load_err("loaded"))
}

/// An error with its causes (an errno, the verifier log's last lines).
fn verbose(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        s.push_str(": ");
        s.push_str(&c.to_string());
        src = c.source();
    }
    // A verifier log runs to megabytes; its end says why.
    const KEEP: usize = 2000;
    if s.len() > 2 * KEEP {
        let mut head = KEEP;
        while !s.is_char_boundary(head) {
            head -= 1;
        }
        let mut tail = s.len() - KEEP;
        while !s.is_char_boundary(tail) {
            tail += 1;
        }
        s = format!("{} … {}", &s[..head], &s[tail..]);
    }
    s
}

/// One ring event: `{u32 tgid, u32 kind, u32 segs, u32 pad}` then `segs`
/// × `{u64 start, u64 pages}`, native-endian.
fn parse_event(buf: &[u8], f: &mut impl FnMut(IoHint)) {
    let u32_at = |o: usize| {
        buf.get(o..o + 4)
            .map(|b| u32::from_ne_bytes(b.try_into().unwrap()))
    };
    let u64_at = |o: usize| {
        buf.get(o..o + 8)
            .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
    };
    let (Some(tgid), Some(kind), Some(segs)) = (u32_at(0), u32_at(4), u32_at(8)) else {
        return;
    };
    let Some(syscall) = Syscall::from_kind(kind) else {
        return;
    };
    for i in 0..(segs as usize).min(MAX_IOVECS) {
        let o = 16 + i * 16;
        let (Some(start), Some(pages)) = (u64_at(o), u64_at(o + 8)) else {
            return;
        };
        // An iovec that held no whole page.
        if pages == 0 {
            continue;
        }
        f(IoHint {
            tgid,
            syscall,
            start,
            pages,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn syscall_names_round_trip_and_reads_come_first() {
        for s in Syscall::ALL {
            assert_eq!(Syscall::from_name(s.name()), Some(s));
            assert_eq!(Syscall::from_kind(s as u32), Some(s));
        }
        assert_eq!(Syscall::from_name("mmap"), None);
        assert!(Syscall::Preadv2.is_read() && !Syscall::Write.is_read());
    }

    #[test]
    fn events_parse_and_truncated_ones_stop() {
        let mut buf = Vec::new();
        for w in [7u32, Syscall::Preadv as u32, 2, 0] {
            buf.extend_from_slice(&w.to_ne_bytes());
        }
        for w in [0x1000u64, 3, 0x9000, 1] {
            buf.extend_from_slice(&w.to_ne_bytes());
        }
        let mut got = Vec::new();
        parse_event(&buf, &mut |h| got.push(h));
        assert_eq!(got.len(), 2);
        assert_eq!((got[1].tgid, got[1].start, got[1].pages), (7, 0x9000, 1));
        got.clear();
        parse_event(&buf[..40], &mut |h| got.push(h));
        assert_eq!(got.len(), 1, "a cut event yields its whole segments only");
    }
}
