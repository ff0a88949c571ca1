//! One home for reading `/proc`: the small-file reader, the kept-open
//! reader of counters read every second ([`KeptOpen`]), the mapping of
//! its errors to [`LinuxError`], and the VMA count and limit that both the
//! injector and the daemon check, and where cgroup v2 is mounted.
//!
//! Files with a structure the `procfs` crate parses (`stat` lists,
//! `smaps`, `maps`, `smaps_rollup`, `vm.max_map_count`) are read through
//! it, and its errors go through `procfs_error`. One reader is
//! hand-written, `read_small`, for speed: the injector reads a process's
//! `stat`, a thread's `status` and `syscall` and `/proc/PID/maps` on every
//! attach, and `std::fs::read` (like `procfs`) also stats and seeks the
//! file; two syscalls more cost 2–6 µs per file on this machine, where
//! generating `status` alone takes about 10 µs.
//!
//! ## Errors, the same everywhere
//!
//! - The file is missing (ENOENT) or the process exits while it is read
//!   (ESRCH): [`LinuxError::NoSuchProcess`] if `/proc/PID` is gone too (a
//!   caller that saw the pid before treats it as gone), else
//!   [`LinuxError::Gone`] (the process is being reaped).
//! - Access refused (EPERM, EACCES): the capability that would lift it, by
//!   name ([`LinuxError::MissingCapability`]), or the refusal despite it;
//!   for the owner-only KSM files, which no capability but reading as
//!   root opens, the mode is named instead (`Access::OwnerOnly`).
//! - Anything else: an I/O error saying what was being read, of which
//!   process.

use crate::caps::Capability;
use crate::error::{LinuxError, libc_errno};
use std::io;

/// What opens a `/proc/PID` file of another user's process, for the error
/// when access is refused.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Access {
    /// Ptrace access to the target (`CAP_SYS_PTRACE`), needed for the
    /// reason given.
    Ptrace(&'static str),
    /// A mode-0400 file (`ksm_stat`, `ksm_merging_pages`): root or the
    /// process's owner.
    OwnerOnly,
}

/// The usual case: ptrace access, to read a process's memory and maps.
pub(crate) const PTRACE: Access = Access::Ptrace(crate::error::WHY_PTRACE);

/// Reads a small /proc file: open, read until EOF, close (see the module
/// header for why not `std::fs::read`). `Ok(None)` if the file (so, the
/// process or thread) is gone.
pub(crate) fn read_small(path: &str) -> io::Result<Option<Vec<u8>>> {
    use std::io::Read;
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc_errno::ENOENT | libc_errno::ESRCH)
            ) =>
        {
            return Ok(None);
        }
        Err(e) => return Err(e),
    };
    let mut buf = vec![0u8; 4096];
    let mut n = 0;
    loop {
        if n == buf.len() {
            buf.resize(2 * n, 0);
        }
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // A process that exits while its file is read.
            Err(e) if e.raw_os_error() == Some(libc_errno::ESRCH) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    buf.truncate(n);
    Ok(Some(buf))
}

/// A `/proc` or `/sys` file kept open and read again from offset 0 with
/// `pread`, for counters the daemon reads every second (ksmd's CPU time,
/// KSM's counters, `/proc/vmstat`). The kernel generates such a file's
/// text anew at every read from offset 0 (seq_file and sysfs attributes
/// both restart there), so a look costs one syscall instead of an open,
/// two reads and a close: measured on this machine (2-CPU AMD EPYC, Linux
/// 6.18, from Python, 2026-11-28) 1.7-4.3 µs against 8.8-10.9 µs for
/// ksmd's `schedstat` and `stat` and a KSM counter. `/proc/vmstat` costs
/// about 30 µs either way (the kernel sums its counters).
///
/// The file names a fixed kernel object (a kernel thread that never
/// exits, a sysfs attribute, the host's vmstat): nothing here follows a
/// process that may exit and have its pid reused.
#[derive(Debug)]
pub struct KeptOpen {
    file: std::fs::File,
    path: String,
}

impl KeptOpen {
    /// Opens `path` read-only.
    pub fn open(path: impl Into<String>) -> io::Result<KeptOpen> {
        let path = path.into();
        let file = std::fs::File::open(&path)?;
        Ok(KeptOpen { file, path })
    }

    /// The path it was opened at, for messages.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The file's whole text as of now, into `buf` (cleared first).
    pub fn read_into(&self, buf: &mut Vec<u8>) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        buf.clear();
        if buf.capacity() < 4096 {
            buf.reserve(4096);
        }
        loop {
            let n = buf.len();
            if n == buf.capacity() {
                buf.reserve(n);
            }
            buf.resize(buf.capacity(), 0);
            match self.file.read_at(&mut buf[n..], n as u64) {
                Ok(0) => {
                    buf.truncate(n);
                    return Ok(());
                }
                Ok(k) => buf.truncate(n + k),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => buf.truncate(n),
                Err(e) => {
                    buf.truncate(n);
                    return Err(e);
                }
            }
        }
    }

    /// The file's whole text as of now.
    pub fn read_text(&self) -> io::Result<String> {
        let mut buf = Vec::new();
        self.read_into(&mut buf)?;
        String::from_utf8(buf).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
    }
}

/// `/proc/PID/FILE`'s bytes, with the module's errors.
pub(crate) fn read_bytes(pid: u32, file: &str, access: Access) -> Result<Vec<u8>, LinuxError> {
    let path = format!("/proc/{pid}/{file}");
    match read_small(&path) {
        Ok(Some(b)) => Ok(b),
        Ok(None) => Err(missing(pid)),
        Err(e) => Err(error(pid, e, "reading /proc", access)),
    }
}

/// `/proc/PID/FILE` as text, with the module's errors.
pub(crate) fn read(pid: u32, file: &str, access: Access) -> Result<String, LinuxError> {
    let b = read_bytes(pid, file, access)?;
    String::from_utf8(b).map_err(|_| LinuxError::Parse(format!("/proc/{pid}/{file}: not UTF-8")))
}

/// A process whose file is not there: never seen, or gone.
fn missing(pid: u32) -> LinuxError {
    if std::path::Path::new(&format!("/proc/{pid}")).exists() {
        LinuxError::Gone(pid)
    } else {
        LinuxError::NoSuchProcess(pid)
    }
}

/// An I/O error of `what` (a read of process `pid`'s /proc files) as a
/// [`LinuxError`] (see the module header).
pub(crate) fn error(pid: u32, e: io::Error, what: &'static str, access: Access) -> LinuxError {
    match (e.raw_os_error(), access) {
        (Some(libc_errno::ENOENT | libc_errno::ESRCH), _) => missing(pid),
        (_, Access::Ptrace(why)) => {
            LinuxError::from_process_op(pid, e, what, Capability::SysPtrace, why)
        }
        (_, Access::OwnerOnly) => LinuxError::io(
            format!("{what} of process {pid} (mode 0400: root or the owner)"),
            e,
        ),
    }
}

/// A `procfs` crate error of `what` on process `pid` as a [`LinuxError`]
/// (see the module header).
pub(crate) fn procfs_error(
    pid: u32,
    e: procfs::ProcError,
    what: &'static str,
    access: Access,
) -> LinuxError {
    match e {
        procfs::ProcError::NotFound(_) => missing(pid),
        procfs::ProcError::PermissionDenied(_) => error(
            pid,
            io::Error::from_raw_os_error(libc_errno::EACCES),
            what,
            access,
        ),
        procfs::ProcError::Io(e, _) => error(pid, e, what, access),
        other => LinuxError::Parse(format!("{what} of process {pid}: {other}")),
    }
}

/// The number of VMAs of `pid` (lines of `/proc/PID/maps`; reading maps
/// does not walk page tables, unlike smaps).
pub fn map_count(pid: u32) -> Result<u64, LinuxError> {
    let text = read_bytes(pid, "maps", PTRACE)?;
    Ok(text.iter().filter(|&&b| b == b'\n').count() as u64)
}

/// The size of `pid`'s address space in pages (`/proc/PID/statm`'s first
/// field, `mm->total_vm`). Reading it takes no mmap lock and walks nothing,
/// so it is the cheap way to notice that a process mapped or unmapped
/// something since the last look: every `mmap`, `munmap`, `mremap` and
/// `brk` that changes the mapped size changes it. (A `munmap` and an
/// `mmap` of the same size between two looks leave it unchanged.)
pub fn vm_pages(pid: u32) -> Result<u64, LinuxError> {
    statm(pid).map(|s| s.size)
}

/// The first two fields of `/proc/PID/statm`, in pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Statm {
    /// The address space's size (`mm->total_vm`, see [`vm_pages`]).
    pub size: u64,
    /// Resident pages (file, anonymous and shmem RSS counters): read as
    /// cheaply as the size, no page table walked.
    pub resident: u64,
}

/// `/proc/PID/statm`'s size and resident set, one read.
pub fn statm(pid: u32) -> Result<Statm, LinuxError> {
    let text = read_bytes(pid, "statm", PTRACE)?;
    let mut fields = text.split(|&b| b == b' ').map(|f| {
        std::str::from_utf8(f)
            .ok()
            .and_then(|s| s.trim().parse().ok())
    });
    match (fields.next().flatten(), fields.next().flatten()) {
        (Some(size), Some(resident)) => Ok(Statm { size, resident }),
        _ => Err(LinuxError::Parse(format!(
            "/proc/{pid}/statm: no size and resident set in {text:?}"
        ))),
    }
}

/// `vm.max_map_count`: the most VMAs a process may have (65530 by default);
/// past it `mmap` and VMA splits fail with ENOMEM.
pub fn max_map_count() -> Result<u64, LinuxError> {
    procfs::sys::vm::max_map_count()
        .map_err(|e| LinuxError::io("reading /proc/sys/vm/max_map_count", io::Error::other(e)))
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup`, or
/// `/sys/fs/cgroup/unified` on hybrid hosts), from `/proc/self/mountinfo`;
/// read once. `None` on a host without cgroup v2.
pub fn cgroup2_mount() -> Option<&'static str> {
    static ROOT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    ROOT.get_or_init(|| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
        parse_cgroup2_root(&info)
    })
    .as_deref()
}

/// The mount point of the first `cgroup2` line of a mountinfo text (the
/// fifth field; the file system type follows the ` - ` separator).
fn parse_cgroup2_root(mountinfo: &str) -> Option<String> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| left.split_whitespace().nth(4).map(str::to_string))?
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_vmas_are_counted_and_the_limit_read() {
        let me = crate::own_pid();
        let n = std::fs::read_to_string("/proc/self/maps")
            .unwrap()
            .lines()
            .count() as u64;
        assert!(n > 5);
        // Our own maps change a little between two reads (allocations).
        let counted = map_count(me).unwrap();
        assert!(counted.abs_diff(n) < 16, "{counted} against {n}");
        let limit = max_map_count().unwrap();
        assert!(limit >= 1024 && limit > n, "vm.max_map_count {limit}");
    }

    #[test]
    fn a_kept_open_file_is_generated_anew_at_every_read() {
        // /proc/self/io's rchar counts the bytes this process read: a
        // second read of the same descriptor must see the 1 MiB read in
        // between (a stale copy of the first text would not).
        let rchar = |t: &str| -> u64 {
            let line = t.lines().find(|l| l.starts_with("rchar:")).unwrap();
            line["rchar:".len()..].trim().parse().unwrap()
        };
        let io = KeptOpen::open("/proc/self/io").unwrap();
        let before = rchar(&io.read_text().unwrap());
        let path = std::env::temp_dir().join(format!("pagesift-kept-{}", std::process::id()));
        std::fs::write(&path, vec![7u8; 1 << 20]).unwrap();
        assert_eq!(std::fs::read(&path).unwrap().len(), 1 << 20);
        std::fs::remove_file(&path).unwrap();
        let after = rchar(&io.read_text().unwrap());
        assert!(after >= before + (1 << 20), "{before} → {after}");
        // A text longer than the first buffer is read whole: smaps (a
        // dozen lines per mapping) ends with a mapping's VmFlags line.
        let kept = KeptOpen::open("/proc/self/smaps").unwrap();
        let mut buf = Vec::new();
        kept.read_into(&mut buf).unwrap();
        assert!(buf.len() > 8192, "{}", buf.len());
        let text = String::from_utf8(buf).unwrap();
        assert!(text.lines().last().unwrap().starts_with("VmFlags:"));
        assert_eq!(kept.path(), "/proc/self/smaps");
    }

    #[test]
    fn the_address_space_size_follows_an_mmap_and_its_munmap() {
        let me = crate::own_pid();
        let before = vm_pages(me).unwrap();
        assert!(before > 0);
        // 1 GiB (plus guard pages), never touched: the size moves by its
        // pages. Other tests' threads map and unmap meanwhile, far less
        // than the 64 MiB of slack allowed for them.
        let (len, slack) = (1u64 << 30, (64u64 << 20) / 4096);
        let mut m =
            crate::sys::AnonMapping::new(len as usize, crate::sys::HugePages::Never).unwrap();
        let mapped = vm_pages(me).unwrap();
        assert!(mapped + slack >= before + len / 4096, "{before} → {mapped}");
        // Touched, its pages join the resident set; the size stays.
        let touched = (256u64 << 20) / 4096;
        let rss = statm(me).unwrap();
        for p in 0..touched {
            m.as_mut_slice()[(p * 4096) as usize] = 1;
        }
        let filled = statm(me).unwrap();
        assert!(
            filled.resident + slack >= rss.resident + touched,
            "{rss:?} → {filled:?}"
        );
        assert!(
            filled.size.abs_diff(rss.size) < slack,
            "{rss:?} → {filled:?}"
        );
        drop(m);
        let after = vm_pages(me).unwrap();
        assert!(after + len / 4096 <= mapped + slack, "{mapped} → {after}");
        // What a look costs (docs/ARCHITECTURE.md quotes it): printed, not
        // asserted.
        let t = std::time::Instant::now();
        for _ in 0..1000 {
            vm_pages(me).unwrap();
        }
        eprintln!(
            "/proc/PID/statm read: {:.1} us",
            t.elapsed().as_secs_f64() * 1e3
        );
    }

    #[test]
    fn a_missing_process_is_no_such_process() {
        let pid = u32::MAX - 1;
        assert!(matches!(vm_pages(pid), Err(LinuxError::NoSuchProcess(p)) if p == pid));
        assert!(matches!(map_count(pid), Err(LinuxError::NoSuchProcess(p)) if p == pid));
        assert!(matches!(
            read(pid, "stat", Access::OwnerOnly),
            Err(LinuxError::NoSuchProcess(_))
        ));
        assert_eq!(read_small(&format!("/proc/{pid}/stat")).unwrap(), None);
        let own = read(crate::own_pid(), "stat", Access::OwnerOnly).unwrap();
        assert!(own.starts_with(&format!("{} (", crate::own_pid())));
    }

    #[test]
    fn procfs_errors_map_like_io_errors() {
        let pid = u32::MAX - 1;
        let e = procfs::process::Process::new(pid as i32).unwrap_err();
        assert!(matches!(
            procfs_error(pid, e, "opening /proc", Access::OwnerOnly),
            LinuxError::NoSuchProcess(_)
        ));
        let refused = error(
            crate::own_pid(),
            io::Error::from_raw_os_error(libc_errno::EACCES),
            "reading /proc/PID/ksm_stat",
            Access::OwnerOnly,
        );
        assert!(refused.to_string().contains("mode 0400"), "{refused}");
    }

    #[test]
    fn cgroup2_mount_is_found() {
        let hybrid = "25 30 0:23 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs rw,mode=755
26 25 0:24 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
27 25 0:25 / /sys/fs/cgroup/unified rw,relatime shared:9 - cgroup2 cgroup2 rw
";
        assert_eq!(
            parse_cgroup2_root(hybrid).as_deref(),
            Some("/sys/fs/cgroup/unified")
        );
        let pure = "30 1 0:26 / /sys/fs/cgroup rw,nosuid,nodev - cgroup2 cgroup2 rw,nsdelegate\n";
        assert_eq!(parse_cgroup2_root(pure).as_deref(), Some("/sys/fs/cgroup"));
        assert_eq!(
            parse_cgroup2_root("1 0 0:1 / / rw - ext4 /dev/vda rw\n"),
            None
        );
    }
}
