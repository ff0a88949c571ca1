//! Discovery: which processes to look at, and which of their VMAs KSM could
//! merge.
//!
//! ## Processes
//! All processes under `/proc`, narrowed by a [`ProcessFilter`]: pids,
//! command names (`/proc/PID/comm`, exact), effective uids and cgroups (a
//! path, matching the cgroup or any cgroup below it, in any hierarchy). Kinds combine with
//! AND, values of one kind with OR. pagesift's own process is never listed;
//! naming it explicitly is an error, as is naming a pid that does not
//! exist; a thread id names its process. Kernel threads (no memory) and
//! zombies are skipped, and processes that exit while being listed are
//! dropped silently.
//!
//! ## Regions
//! [`process_regions`] (the daemon's and the sampled scan's discovery):
//! `/proc/PID/smaps` is read once and parsed by `procfs`; the `VmFlags`
//! line of each VMA is kept as raw tokens because `procfs` drops flags it
//! does not know (such as `dp`, `VM_DROPPABLE`). A VMA is kept when KSM's
//! `ksm_compatible()` (`mm/ksm.c`) would accept it: not shared
//! (`sh`, `ms`), not `VM_PFNMAP`/`VM_IO` (`pf`, `io`), not `VM_DONTEXPAND`
//! (`de`), not hugetlb (`ht`), not `VM_MIXEDMAP` (`mm`), not `VM_DROPPABLE`
//! (`dp`). DAX mappings are not visible in smaps and are not filtered (KSM
//! ignores them; their pages are never anonymous). Two more rules are
//! pagesift's own: a VMA must be readable, because `process_vm_readv`
//! cannot read `PROT_NONE` memory, and `[vsyscall]` is not a real VMA.
//!
//! A kept VMA is [`RegionKind::Anonymous`] or [`RegionKind::PrivateFile`]:
//! in a private file mapping only the pages that were written (COWed, and
//! so anonymous) are merge candidates; the others are page cache, which KSM
//! never merges. The per-page distinction comes from pagemap's "file" bit.
//!
//! [`MapsDiscovery`] (the exact scan's) reaches the same classification
//! from `/proc/PID/maps` and per-VMA checks, without the per-page RSS/PSS
//! walk the kernel does for every smaps read, and reads smaps only for
//! processes where those cannot decide (module `maps`).

mod maps;

pub use maps::{
    FileKind, HUGETLBFS_MAGIC, KnownRanges, MapsDiscovery, MapsVerdict, PAGE_CACHE_FS, PROBE_PAGES,
    RegionsFrom, SmapsReason, classify_maps,
};

use crate::error::LinuxError;
use crate::proc::{self, PTRACE};
use procfs::FromBufRead;
use procfs::process::{MMapPath, MemoryMaps, Process};
use std::io::Read;
use std::path::PathBuf;

/// Which processes to look at. Empty lists do not filter.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessFilter {
    /// Only these pids (each must exist).
    pub pids: Vec<u32>,
    /// Only processes whose `comm` is one of these.
    pub comms: Vec<String>,
    /// Only processes whose effective uid is one of these.
    pub uids: Vec<u32>,
    /// Only processes in one of these cgroups (paths such as
    /// `/system.slice/foo.service`, with or without the `/sys/fs/cgroup`
    /// prefix), or in a cgroup below one of them. On cgroup v1 hosts a
    /// process matches through any of its hierarchies.
    pub cgroups: Vec<String>,
}

impl ProcessFilter {
    /// Every process except pagesift itself.
    pub fn all() -> Self {
        Self::default()
    }

    /// Exactly these pids.
    pub fn pids(pids: impl IntoIterator<Item = u32>) -> Self {
        ProcessFilter {
            pids: pids.into_iter().collect(),
            ..Self::default()
        }
    }

    fn comm_matches(&self, comm: &str) -> bool {
        self.comms.is_empty() || self.comms.iter().any(|c| c == comm)
    }

    fn uid_matches(&self, uid: u32) -> bool {
        self.uids.is_empty() || self.uids.contains(&uid)
    }

    fn cgroups_match(&self, cgroups: &[String]) -> bool {
        self.cgroups.is_empty()
            || (self.cgroups.iter()).any(|c| cgroups.iter().any(|have| cgroup_matches(c, have)))
    }
}

/// Whether cgroup path `have` is `want` or below it. `want` may carry the
/// `/sys/fs/cgroup` mount prefix.
fn cgroup_matches(want: &str, have: &str) -> bool {
    let want = want.strip_prefix("/sys/fs/cgroup").unwrap_or(want);
    let want = want.trim_end_matches('/');
    if want.is_empty() {
        return true; // the root cgroup contains everything
    }
    have == want || have.strip_prefix(want).is_some_and(|r| r.starts_with('/'))
}

/// A process that was selected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessInfo {
    /// Its pid (thread-group id).
    pub pid: u32,
    /// `/proc/PID/comm`.
    pub comm: String,
    /// Effective uid.
    pub uid: u32,
    /// Its cgroup v2 path; on a host without cgroup v2, its path in
    /// systemd's named v1 hierarchy (`name=systemd`), which mirrors the
    /// same slices and scopes; empty if it has neither.
    pub cgroup: String,
    /// Its cgroup path in every hierarchy (v2 and v1), deduplicated.
    pub cgroups: Vec<String>,
    /// Start time in clock ticks after boot; with the pid it identifies the
    /// process even if the pid is reused later.
    pub start_time: u64,
    /// Which program image the process runs: changes when it calls execve
    /// (see [`image_id`]); with pid and start time it identifies what
    /// pagesift marked.
    pub image: u64,
}

/// An identity of the program image process `pid` runs, which changes on
/// execve (the pid and start time do not). It hashes
/// - `start_code`, `end_code` and `start_stack` of `/proc/PID/stat`: the
///   new image's text and stack. With ASLR (the default, and always for a
///   setuid or file-capability exec, which clears ADDR_NO_RANDOMIZE) the
///   stack top is randomized on every exec, so even the same program
///   exec'd again gets a new identity;
/// - the device and inode of `/proc/PID/exe`: a different program gets a
///   new identity even with ASLR off.
///
/// Both are cheap (the stat line is read anyway, plus one `stat`) and need
/// no access to the target's memory, which a process could rewrite. What
/// it misses: the same executable exec'd again by a process that turned
/// ASLR off for itself, which gets the very same layout of the very same
/// program of the same user. Zero when the fields are hidden (a zombie).
pub fn image_id(pid: u32, stat: &procfs::process::Stat) -> u64 {
    use std::hash::{Hash, Hasher};
    use std::os::unix::fs::MetadataExt;
    let exe = std::fs::metadata(format!("/proc/{pid}/exe"))
        .map(|m| (m.dev(), m.ino()))
        .unwrap_or((0, 0));
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (stat.startcode, stat.endcode, stat.startstack, exe).hash(&mut h);
    h.finish()
}

/// Why a process is not listed when it is looked at.
enum Skip {
    /// Kernel thread or zombie: no user memory.
    NoMemory,
    /// It exited while being read.
    Gone,
    /// The filter does not select it.
    NotSelected,
}

/// What `/proc` says of process `pid`, or why it is not listed: with no
/// memory, gone, or (`Skip::NotSelected`) refused by `filter` on the first
/// fact it names. The facts are read cheapest first and the filter is
/// applied as each arrives, so a process the filter refuses by its name
/// costs one read of `stat`, not four: a refresh looks at every process
/// of the host.
fn process_info(pid: u32, filter: &ProcessFilter) -> Result<ProcessInfo, Skip> {
    let p = Process::new(pid as i32).map_err(|_| Skip::Gone)?;
    let stat = p.stat().map_err(|_| Skip::Gone)?;
    const PF_KTHREAD: u32 = 0x0020_0000;
    if stat.flags & PF_KTHREAD != 0 || stat.state == 'Z' || stat.state == 'X' {
        return Err(Skip::NoMemory);
    }
    if !filter.comm_matches(&stat.comm) {
        return Err(Skip::NotSelected);
    }
    let status = p.status().map_err(|_| Skip::Gone)?;
    if !filter.uid_matches(status.euid) {
        return Err(Skip::NotSelected);
    }
    let all: Vec<_> = p.cgroups().map_err(|_| Skip::Gone)?.into_iter().collect();
    let cgroup = all
        .iter()
        .find(|c| c.hierarchy == 0)
        .or_else(|| {
            all.iter()
                .find(|c| c.controllers.iter().any(|n| n == "name=systemd"))
        })
        .map(|c| c.pathname.clone())
        .unwrap_or_default();
    let mut cgroups: Vec<String> = all.into_iter().map(|c| c.pathname).collect();
    cgroups.sort();
    cgroups.dedup();
    if !filter.cgroups_match(&cgroups) {
        return Err(Skip::NotSelected);
    }
    let image = image_id(pid, &stat);
    Ok(ProcessInfo {
        pid,
        comm: stat.comm,
        uid: status.euid,
        cgroup,
        cgroups,
        start_time: stat.starttime,
        image,
    })
}

/// The start time (clock ticks after boot) and [`image_id`] of the
/// process `pid` now, if it lives and has memory: with the pid, what tells
/// a process from a later one that reuses its pid, and an image from the
/// one it exec'd.
pub fn identity(pid: u32) -> Option<(u64, u64)> {
    let p = Process::new(pid as i32).ok()?;
    let stat = p.stat().ok()?;
    if stat.state == 'Z' || stat.state == 'X' {
        return None;
    }
    Some((stat.starttime, image_id(pid, &stat)))
}

/// Whether `[start, end)` of `pid` lies wholly inside its VMAs now, read
/// from `/proc/PID/maps` (false if they cannot be read: the process is
/// gone). What tells a range unmapped between a decision and a syscall
/// made for it from a range the process refuses.
pub fn range_mapped(pid: u32, start: u64, end: u64) -> bool {
    let Ok(maps) = Process::new(pid as i32).and_then(|p| p.maps()) else {
        return false;
    };
    let mut at = start;
    for m in maps.iter() {
        let (s, e) = m.address;
        if s <= at && at < e {
            at = e;
        }
        if at >= end {
            return true;
        }
    }
    false
}

/// Lists the processes `filter` selects, never pagesift's own. A pid named
/// in `filter.pids` that does not exist is an error
/// ([`LinuxError::NoSuchProcess`]), as is naming pagesift's own pid; a
/// thread id selects its process.
pub fn list_processes(filter: &ProcessFilter) -> Result<Vec<ProcessInfo>, LinuxError> {
    let own = crate::own_pid();
    let mut out = Vec::new();
    if !filter.pids.is_empty() {
        for &pid in &filter.pids {
            if pid == own {
                return Err(LinuxError::OwnProcess(pid));
            }
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                return Err(LinuxError::NoSuchProcess(pid));
            }
            // A thread id names its process.
            let pid = Process::new(pid as i32)
                .and_then(|p| p.status())
                .map(|s| s.tgid as u32)
                .map_err(|_| LinuxError::NoSuchProcess(pid))?;
            if pid == own {
                return Err(LinuxError::OwnProcess(pid));
            }
            if out.iter().any(|p: &ProcessInfo| p.pid == pid) {
                continue;
            }
            match process_info(pid, filter) {
                Ok(info) => out.push(info),
                Err(Skip::NoMemory | Skip::NotSelected) => {}
                Err(Skip::Gone) => return Err(LinuxError::NoSuchProcess(pid)),
            }
        }
        return Ok(out);
    }
    let all = procfs::process::all_processes()
        .map_err(|e| LinuxError::io("listing /proc", std::io::Error::other(e.to_string())))?;
    for p in all.flatten() {
        let pid = p.pid() as u32;
        if pid == own {
            continue;
        }
        if let Ok(info) = process_info(pid, filter) {
            out.push(info);
        }
    }
    out.sort_by_key(|p| p.pid);
    Ok(out)
}

/// How a kept VMA's pages can be merge candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionKind {
    /// Private anonymous memory (heap, stacks, anonymous mmaps): every
    /// present page is a candidate.
    Anonymous,
    /// A private file mapping: only its COWed (anonymous) pages are
    /// candidates; unmodified pages are page cache.
    PrivateFile,
}

/// Why a VMA is not kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Ineligible {
    /// `VM_SHARED`/`VM_MAYSHARE` (shared file, shmem, shared anonymous).
    Shared,
    /// `VM_HUGETLB`.
    Hugetlb,
    /// `VM_PFNMAP` or `VM_IO` (device memory).
    PfnMapOrIo,
    /// `VM_DONTEXPAND` (special mappings such as the vDSO, driver buffers).
    DontExpand,
    /// `VM_MIXEDMAP`.
    MixedMap,
    /// `VM_DROPPABLE` (MAP_DROPPABLE, e.g. vgetrandom state).
    Droppable,
    /// Not readable (`PROT_NONE` guard areas): `process_vm_readv` cannot
    /// read it.
    Unreadable,
    /// `[vsyscall]`, which is not a VMA of the process.
    Vsyscall,
    /// Registered with the process's own userfaultfd in missing or minor
    /// mode (`um`, `ui`): reading a page it has not supplied yet waits for
    /// the process to answer, perhaps forever, so such a VMA is never read
    /// (nor marked).
    OwnUserfaultfd,
}

/// A VMA's `VmFlags` tokens as smaps prints them (`rd wr mr mw me ac ...`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmaFlags(Vec<String>);

impl VmaFlags {
    /// Parses the text after `VmFlags:`.
    pub fn parse(line: &str) -> Self {
        VmaFlags(line.split_whitespace().map(str::to_owned).collect())
    }

    /// Whether the two-letter flag is set.
    pub fn has(&self, flag: &str) -> bool {
        self.0.iter().any(|f| f == flag)
    }
}

/// Applies KSM's `ksm_compatible()` rule (`mm/ksm.c`) plus
/// pagesift's readability rule to one VMA.
pub fn classify(
    flags: &VmaFlags,
    readable: bool,
    path: &MMapPath,
) -> Result<RegionKind, Ineligible> {
    if matches!(path, MMapPath::Vsyscall) {
        return Err(Ineligible::Vsyscall);
    }
    if flags.has("sh") || flags.has("ms") {
        return Err(Ineligible::Shared);
    }
    if flags.has("ht") {
        return Err(Ineligible::Hugetlb);
    }
    if flags.has("pf") || flags.has("io") {
        return Err(Ineligible::PfnMapOrIo);
    }
    if flags.has("de") {
        return Err(Ineligible::DontExpand);
    }
    if flags.has("mm") {
        return Err(Ineligible::MixedMap);
    }
    if flags.has("dp") {
        return Err(Ineligible::Droppable);
    }
    if !readable || !flags.has("rd") {
        return Err(Ineligible::Unreadable);
    }
    if flags.has("um") || flags.has("ui") {
        return Err(Ineligible::OwnUserfaultfd);
    }
    Ok(match path {
        MMapPath::Path(_) => RegionKind::PrivateFile,
        _ => RegionKind::Anonymous,
    })
}

/// A VMA KSM could merge.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Region {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Whether every present page or only COWed pages are candidates.
    pub kind: RegionKind,
    /// The mapped file, for [`RegionKind::PrivateFile`]; the pseudo-path
    /// (`[heap]`, `[stack]`, `[anon:name]`) or none for anonymous memory.
    pub path: Option<PathBuf>,
    /// Already `VM_MERGEABLE` (`mg`).
    pub mergeable: bool,
    /// `MADV_HUGEPAGE` was advised (`hg`); `None` when discovery did not
    /// read smaps ([`MapsDiscovery`]).
    pub thp_advised: Option<bool>,
}

impl Region {
    /// Length in pages.
    pub fn pages(&self) -> u64 {
        (self.end - self.start) / crate::PAGE_SIZE
    }
}

/// A VMA that was not kept, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedRegion {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// Why KSM (or pagesift) cannot use it.
    pub reason: Ineligible,
}

/// A process's VMAs, split into kept and rejected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessRegions {
    /// VMAs KSM could merge, in address order.
    pub eligible: Vec<Region>,
    /// The others, in address order.
    pub rejected: Vec<RejectedRegion>,
}

/// Reads `/proc/PID/smaps` and classifies every VMA. A process that does not
/// exist gives [`LinuxError::NoSuchProcess`]; the caller that discovered it
/// earlier may treat that as [`LinuxError::Gone`].
pub fn process_regions(pid: u32) -> Result<ProcessRegions, LinuxError> {
    if pid == crate::own_pid() {
        return Err(LinuxError::OwnProcess(pid));
    }
    let p = Process::new(pid as i32).map_err(|_| LinuxError::NoSuchProcess(pid))?;
    let mut text = String::new();
    p.open_relative("smaps")
        .map_err(|e| proc::procfs_error(pid, e, "opening /proc/PID/smaps", PTRACE))?
        .read_to_string(&mut text)
        .map_err(|e| proc::error(pid, e, "reading /proc/PID/smaps", PTRACE))?;
    parse_smaps(&text)
}

/// The name a kept region is reported under: the mapped file, or the
/// pseudo-path (`[heap]`, `[stack]`, `anon:NAME`), or none.
fn region_path(path: &MMapPath) -> Option<PathBuf> {
    match path {
        MMapPath::Path(p) => Some(p.clone()),
        MMapPath::Heap => Some("[heap]".into()),
        MMapPath::Stack => Some("[stack]".into()),
        MMapPath::TStack(t) => Some(format!("[stack:{t}]").into()),
        MMapPath::Other(s) => Some(s.into()),
        _ => None,
    }
}

/// Classifies the VMAs of an smaps text.
pub fn parse_smaps(text: &str) -> Result<ProcessRegions, LinuxError> {
    let maps = MemoryMaps::from_buf_read(text.as_bytes())
        .map_err(|e| LinuxError::Parse(format!("smaps: {e}")))?;
    let flags: Vec<VmaFlags> = text
        .lines()
        .filter_map(|l| l.strip_prefix("VmFlags:"))
        .map(VmaFlags::parse)
        .collect();
    if flags.len() != maps.len() {
        return Err(LinuxError::Parse(format!(
            "smaps: {} VMAs but {} VmFlags lines",
            maps.len(),
            flags.len()
        )));
    }
    let mut out = ProcessRegions::default();
    for (m, f) in maps.iter().zip(flags) {
        let (start, end) = m.address;
        let readable = m.perms.contains(procfs::process::MMPermissions::READ);
        match classify(&f, readable, &m.pathname) {
            Ok(kind) => out.eligible.push(Region {
                start,
                end,
                kind,
                path: region_path(&m.pathname),
                mergeable: f.has("mg"),
                thp_advised: Some(f.has("hg")),
            }),
            Err(reason) => out.rejected.push(RejectedRegion { start, end, reason }),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> VmaFlags {
        VmaFlags::parse(s)
    }

    #[test]
    fn a_vma_with_the_processs_own_missing_or_minor_userfaultfd_is_never_read() {
        let anon = MMapPath::Anonymous;
        assert_eq!(
            classify(&f("rd wr mr mw me ac um"), true, &anon),
            Err(Ineligible::OwnUserfaultfd)
        );
        assert_eq!(
            classify(&f("rd wr mr mw me ac ui"), true, &anon),
            Err(Ineligible::OwnUserfaultfd)
        );
        // Write-protect tracking (pagesift's own, async) does not block reads.
        assert_eq!(
            classify(&f("rd wr mr mw me ac uw"), true, &anon),
            Ok(RegionKind::Anonymous)
        );
    }

    /// A shell that says "ready" on stdout, waits for a line on stdin, then
    /// execs `then`. It returns once "ready" has been read: the shell is
    /// then running its own code, so its exec is complete. `spawn` alone
    /// returns at the vfork release, before the kernel has set the new
    /// image's code and stack addresses, and on a loaded machine (CI runs
    /// tests in parallel on two cores) the child can sit there, runnable
    /// but not running, for longer than any fixed wait.
    fn exec_after_a_line(then: &str) -> std::process::Child {
        use std::io::BufRead;
        let mut c = std::process::Command::new("sh")
            .args(["-c", &format!("echo ready; read l; exec {then}")])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(c.stdout.as_mut().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        c
    }

    /// Polls until `pid`'s identity is not `old` (at most 5 s).
    fn identity_after_exec(pid: u32, old: (u64, u64)) -> Option<(u64, u64)> {
        for _ in 0..500 {
            match identity(pid) {
                Some(id) if id != old => return Some(id),
                _ => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
        identity(pid)
    }

    #[test]
    fn exec_changes_the_image_identity_but_not_the_start_time() {
        use std::io::Write;
        // Another program, and the same program again (ASLR on).
        for then in ["sleep 30", "sh -c 'read m'"] {
            let mut c = exec_after_a_line(then);
            let pid = c.id();
            let before = identity(pid).expect("the shell lives");
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert_eq!(identity(pid), Some(before), "stable while nothing happens");
            let info = process_info(pid, &ProcessFilter::all()).ok().unwrap();
            assert_eq!((info.start_time, info.image), before);
            let mut stdin = c.stdin.take().unwrap();
            writeln!(stdin, "go").unwrap();
            let after = identity_after_exec(pid, before).expect("still alive");
            let _ = c.kill();
            let _ = c.wait();
            assert_eq!(after.0, before.0, "{then}: the start time survives exec");
            assert_ne!(after.1, before.1, "{then}: exec kept the image identity");
        }
        assert_eq!(identity(u32::MAX / 2), None, "no such process");
    }

    #[test]
    fn ksm_compatible_rule() {
        let anon = MMapPath::Anonymous;
        let file = MMapPath::Path("/usr/lib/libc.so.6".into());
        assert_eq!(
            classify(&f("rd wr mr mw me ac"), true, &anon),
            Ok(RegionKind::Anonymous)
        );
        assert_eq!(
            classify(&f("rd wr mr mw me ac"), true, &file),
            Ok(RegionKind::PrivateFile)
        );
        assert_eq!(
            classify(&f("rd wr sh mr mw me ms"), true, &file),
            Err(Ineligible::Shared)
        );
        assert_eq!(
            classify(&f("rd mr me ms"), true, &file),
            Err(Ineligible::Shared)
        );
        assert_eq!(
            classify(&f("rd wr mr mw me ht"), true, &anon),
            Err(Ineligible::Hugetlb)
        );
        assert_eq!(
            classify(&f("rd wr pf io de"), true, &anon),
            Err(Ineligible::PfnMapOrIo)
        );
        assert_eq!(
            classify(&f("rd ex mr me de"), true, &MMapPath::Vdso),
            Err(Ineligible::DontExpand)
        );
        assert_eq!(
            classify(&f("rd wr mm"), true, &anon),
            Err(Ineligible::MixedMap)
        );
        assert_eq!(
            classify(&f("rd wr mr mw me ac dp"), true, &anon),
            Err(Ineligible::Droppable)
        );
        assert_eq!(
            classify(&f("mr mw me ac"), false, &anon),
            Err(Ineligible::Unreadable)
        );
        assert_eq!(
            classify(&f("ex"), true, &MMapPath::Vsyscall),
            Err(Ineligible::Vsyscall)
        );
    }

    #[test]
    fn cgroup_subtree_match() {
        assert!(cgroup_matches("/system.slice", "/system.slice/a.service"));
        assert!(cgroup_matches(
            "/sys/fs/cgroup/system.slice/",
            "/system.slice"
        ));
        assert!(!cgroup_matches("/system.slice", "/system.slicex"));
        assert!(!cgroup_matches("/user.slice", "/system.slice/a.service"));
        assert!(cgroup_matches("/", "/anything"));
    }

    const SMAPS: &str = "\
55d0c0000000-55d0c0021000 rw-p 00000000 00:00 0                          [heap]
Size:                132 kB
Rss:                   4 kB
VmFlags: rd wr mr mw me ac
7f0000000000-7f0000100000 rw-s 00000000 00:05 1234                       /dev/zero (deleted)
Size:               1024 kB
VmFlags: rd wr sh mr mw me ms
7f0000200000-7f0000201000 rw-p 00000000 00:00 0 
Size:                  4 kB
VmFlags: rd wr mr mw me ac dp
7f0000300000-7f0000310000 r--p 00001000 08:01 42                         /usr/lib/x.so
Size:                 64 kB
VmFlags: rd mr mw me mg
7ffc00000000-7ffc00002000 r--p 00000000 00:00 0                          [vvar]
Size:                  8 kB
VmFlags: rd mr pf io de dd
";

    #[test]
    fn smaps_text_is_classified_in_order() {
        let r = parse_smaps(SMAPS).unwrap();
        assert_eq!(r.eligible.len(), 2);
        assert_eq!(r.eligible[0].start, 0x55d0_c000_0000);
        assert_eq!(r.eligible[0].kind, RegionKind::Anonymous);
        assert_eq!(r.eligible[0].pages(), 0x21);
        assert_eq!(r.eligible[1].kind, RegionKind::PrivateFile);
        assert!(r.eligible[1].mergeable);
        let reasons: Vec<_> = r.rejected.iter().map(|x| x.reason).collect();
        assert_eq!(
            reasons,
            vec![
                Ineligible::Shared,
                Ineligible::Droppable,
                Ineligible::PfnMapOrIo
            ]
        );
    }

    #[test]
    fn mismatched_vmflags_is_a_parse_error() {
        let text = SMAPS.replacen("VmFlags: rd wr mr mw me ac\n", "", 1);
        assert!(matches!(parse_smaps(&text), Err(LinuxError::Parse(_))));
    }
}
