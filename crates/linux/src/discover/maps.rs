//! Discovery from `/proc/PID/maps`, without smaps' page walk.
//!
//! Reading `/proc/PID/smaps` makes the kernel walk every present page of the
//! process to sum its RSS and PSS (about 100 ns per page on this machine),
//! and discovery needs none of that: only whether KSM would accept each VMA
//! (`ksm_compatible()` in `mm/ksm.c`) and whether it is already
//! `VM_MERGEABLE`. This module decides both from sources that cost per VMA,
//! not per page, and reads smaps for a process only where they cannot:
//!
//! 1. **`/proc/PID/ksm_stat`**, line `ksm_mergeable: no` (Linux 6.14+,
//!    `proc_pid_ksm_stat` in `fs/proc/base.c`): no VMA of the process is
//!    `VM_MERGEABLE`, so
//!    every `mg` flag is false and no KSM page is mapped (KSM pages live
//!    only in mergeable VMAs; clearing the flag unmerges them first). `yes`,
//!    or a kernel without the line: smaps.
//! 2. **`/proc/PID/maps`** (no page walk): the `s` permission is
//!    `VM_MAYSHARE`, which every `VM_SHARED` VMA has (`sh`, `ms`);
//!    `[vsyscall]` is not a VMA; `[vdso]` is a special mapping, which the
//!    kernel always marks `VM_DONTEXPAND`; `[vvar]` and `[vvar_vclock]` are
//!    `VM_PFNMAP | VM_IO` too. Other bracketed names (`[uprobes]`, ...) are
//!    special mappings we do not know: smaps.
//! 3. **Private file mappings**: `stat` and `statfs` of
//!    `/proc/PID/map_files/START-END` (root only; cached per device and
//!    inode for the whole discovery). A file on hugetlbfs (including
//!    `/anon_hugepage` and hugetlb memfds) is `VM_HUGETLB`. A regular file
//!    or block device on a filesystem whose `mmap` is plain page cache
//!    ([`PAGE_CACHE_FS`]), or `/dev/zero` (whose private mappings the kernel
//!    turns into anonymous memory), gets no special flag. Anything else (a
//!    driver's character device, an anon inode, sysfs, FUSE whose DAX mode
//!    sets `VM_MIXEDMAP`) may be `VM_PFNMAP`/`VM_IO`/`VM_MIXEDMAP`/
//!    `VM_DONTEXPAND`: smaps.
//! 4. **Private anonymous VMAs** (no file, `[heap]`, `[stack]`,
//!    `[anon:NAME]`) have no driver to set those flags; the one flag left is
//!    `VM_DROPPABLE` (`MAP_DROPPABLE`, glibc 2.41+'s vgetrandom state). Its
//!    pages are never swap-backed (`folio_add_new_anon_rmap()` leaves
//!    `PG_swapbacked` clear there), while every other anonymous page is,
//!    unless `MADV_FREE` cleared it. So the first present anonymous pages of
//!    the VMA are looked up (`PAGEMAP_SCAN` stopping after
//!    [`PROBE_PAGES`], then kpageflags): one swap-backed page proves the VMA
//!    is not droppable. Runs of small VMAs share one scan, so a process of
//!    10 000 one-page VMAs costs a few ioctls, not 20 000. If none is swap-backed (droppable, or lazily
//!    freed), or the VMA holds only zero-page mappings: smaps. A VMA with no
//!    present page at all is kept: it holds nothing a scan could count.
//! 5. **userfaultfds**: a process holding one that is not the caller's own
//!    (`/proc/PID/fd` links) may have registered ranges (`um`, `ui`) whose
//!    remote reads block forever; only smaps names them: smaps.
//!
//! The result is the smaps classification, with two differences that change
//! no count: a VMA that fails two tests may be rejected for another of them
//! (a `PROT_NONE` hugetlb file mapping is `Unreadable` here, `Hugetlb` from
//! smaps), and `thp_advised` is unknown (`None`).

use super::{Ineligible, ProcessRegions, Region, RegionKind, RejectedRegion};
use crate::error::LinuxError;
use crate::kpageflags::{KPageFlags, KpfFlags};
use crate::pagemap::{PageRun, Pagemap, PagemapEntry, category};
use crate::proc::{self, PTRACE};
use pagesift_core::ranges::RangeSet;
use procfs::process::{MMPermissions, MMapPath, MemoryMap, Process};
use std::collections::HashMap;

/// Present anonymous pages of a VMA whose swap-backed bit is checked: one
/// swap-backed page decides, so more only help when the first pages were
/// lazily freed.
pub const PROBE_PAGES: u64 = 16;

/// Largest VMA whose probe shares one `PAGEMAP_SCAN` with its small
/// neighbours' (see `probe_many`): such a scan walks every present page of
/// the group, where a VMA's own scan stops after [`PROBE_PAGES`], so only
/// VMAs this small are grouped. pagesift's choice: 256 KiB.
const GROUPED_VMA_MAX: u64 = 64 * crate::PAGE_SIZE;

/// Filesystems (`statfs` `f_type`, `<linux/magic.h>`) whose `mmap` maps
/// page cache with no special VMA flag: private mappings of their regular
/// files hold page cache and COWed anonymous pages only.
pub const PAGE_CACHE_FS: &[(i64, &str)] = &[
    (0xEF53, "ext2/3/4"),
    (0x5846_5342, "xfs"),
    (0x9123_683E, "btrfs"),
    (0x0102_1994, "tmpfs, shmem, memfd"),
    (0x8584_58f6, "ramfs"),
    (0x794c_7630, "overlayfs"),
    (0x7371_7368, "squashfs"),
    (0xE0F5_E1E2, "erofs"),
    (0xF2F5_2010, "f2fs"),
    (0x6969, "nfs"),
    (0xFF53_4D42, "cifs"),
    (0xFE53_4D42, "smb2"),
    (0x0102_1997, "9p"),
    (0x00c3_6400, "ceph"),
    (0x2fc1_2fc1, "zfs"),
    (0xca45_1a4e, "bcachefs"),
    (0x4d44, "vfat"),
    (0x2011_BAB0, "exfat"),
    (0x7366_746e, "ntfs3"),
    (0x9660, "iso9660"),
];

/// `HUGETLBFS_MAGIC`.
pub const HUGETLBFS_MAGIC: i64 = 0x9584_58f6;

/// Why a process's regions came from smaps after all.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SmapsReason {
    /// Some VMA is `VM_MERGEABLE` (or `ksm_stat` could not tell): the `mg`
    /// flags are needed, and KSM pages may be mapped.
    Mergeable,
    /// The process has mergeable memory and its `mg` flags are not known
    /// yet: never read, or forgotten because a mark was undone or a
    /// region renewed (`LinuxSource::distrust_mergeable`).
    MergeableUnknown,
    /// The process has mergeable memory and the last smaps read of its
    /// `mg` flags is `SMAPS_INTERVAL` old: marks the process made itself
    /// are seen at this read.
    MergeableRecheck,
    /// The process makes all its memory mergeable by itself
    /// (`PR_SET_MEMORY_MERGE`), or its `ksm_stat` could not be read.
    MergeAny,
    /// A VMA whose flags maps cannot tell (see the module doc).
    UnknownVma,
    /// The process holds a userfaultfd that is not the caller's: its
    /// registered ranges (`um`, `ui`) must not be read.
    Userfaultfd,
    /// An anonymous VMA whose present pages are not swap-backed
    /// (`MAP_DROPPABLE`, or `MADV_FREE`d pages) or are all zero-page
    /// mappings.
    MaybeDroppable,
}

impl SmapsReason {
    /// Every reason, in order.
    pub const ALL: [SmapsReason; 7] = [
        SmapsReason::Mergeable,
        SmapsReason::MergeableUnknown,
        SmapsReason::MergeableRecheck,
        SmapsReason::MergeAny,
        SmapsReason::UnknownVma,
        SmapsReason::Userfaultfd,
        SmapsReason::MaybeDroppable,
    ];

    /// A short name, for status lines and metric labels.
    pub fn name(self) -> &'static str {
        match self {
            SmapsReason::Mergeable => "mergeable",
            SmapsReason::MergeableUnknown => "mergeable_unknown",
            SmapsReason::MergeableRecheck => "mergeable_recheck",
            SmapsReason::MergeAny => "merge_any",
            SmapsReason::UnknownVma => "unknown_vma",
            SmapsReason::Userfaultfd => "userfaultfd",
            SmapsReason::MaybeDroppable => "maybe_droppable",
        }
    }
}

/// Where a process's regions came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionsFrom {
    /// `/proc/PID/maps` and the cheap checks of this module.
    Maps,
    /// `/proc/PID/smaps`, for this reason.
    Smaps(SmapsReason),
}

/// What is behind a private file mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FileKind {
    /// A regular file or block device on a [`PAGE_CACHE_FS`] filesystem.
    PageCache,
    /// A file on hugetlbfs.
    Hugetlbfs,
    /// `/dev/zero` (character device 1:5).
    DevZero,
    /// Anything else (device, anon inode, another filesystem).
    Other,
}

impl FileKind {
    /// Classifies a file from its `st_mode`, `st_rdev` and its
    /// filesystem's `f_type`.
    pub fn of(mode: u32, rdev: u64, fs_type: i64) -> FileKind {
        const S_IFMT: u32 = 0o170000;
        const S_IFREG: u32 = 0o100000;
        const S_IFBLK: u32 = 0o060000;
        const S_IFCHR: u32 = 0o020000;
        if fs_type == HUGETLBFS_MAGIC {
            return FileKind::Hugetlbfs;
        }
        match mode & S_IFMT {
            S_IFCHR if rustix::fs::major(rdev) == 1 && rustix::fs::minor(rdev) == 5 => {
                FileKind::DevZero
            }
            S_IFREG | S_IFBLK if PAGE_CACHE_FS.iter().any(|&(m, _)| m == fs_type) => {
                FileKind::PageCache
            }
            _ => FileKind::Other,
        }
    }
}

/// What `/proc/PID/maps` (and, for a file, its [`FileKind`]) says about
/// one VMA.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapsVerdict {
    /// Kept.
    Keep(RegionKind),
    /// Private anonymous memory: kept unless it is `VM_DROPPABLE`.
    AnonymousUnlessDroppable,
    /// Not kept.
    Reject(Ineligible),
    /// Maps cannot tell: smaps must.
    Unknown,
}

/// The rule of the module doc, steps 2–4, for one VMA. `file` is the kind
/// of the mapped file for [`MMapPath::Path`] (`None` if it could not be
/// looked up).
pub fn classify_maps(perms: MMPermissions, path: &MMapPath, file: Option<FileKind>) -> MapsVerdict {
    if matches!(path, MMapPath::Vsyscall) {
        return MapsVerdict::Reject(Ineligible::Vsyscall);
    }
    if perms.contains(MMPermissions::SHARED) {
        return MapsVerdict::Reject(Ineligible::Shared);
    }
    let readable = perms.contains(MMPermissions::READ);
    let unless_unreadable = |v: MapsVerdict| {
        if readable {
            v
        } else {
            MapsVerdict::Reject(Ineligible::Unreadable)
        }
    };
    match path {
        MMapPath::Vvar => MapsVerdict::Reject(Ineligible::PfnMapOrIo),
        MMapPath::Other(n) if n == "vvar_vclock" => MapsVerdict::Reject(Ineligible::PfnMapOrIo),
        MMapPath::Vdso => MapsVerdict::Reject(Ineligible::DontExpand),
        MMapPath::Anonymous | MMapPath::Heap | MMapPath::Stack | MMapPath::TStack(_) => {
            unless_unreadable(MapsVerdict::AnonymousUnlessDroppable)
        }
        MMapPath::Other(n) if n.starts_with("anon:") => {
            unless_unreadable(MapsVerdict::AnonymousUnlessDroppable)
        }
        MMapPath::Path(_) => match file {
            Some(FileKind::Hugetlbfs) => MapsVerdict::Reject(Ineligible::Hugetlb),
            Some(FileKind::PageCache | FileKind::DevZero) => {
                unless_unreadable(MapsVerdict::Keep(RegionKind::PrivateFile))
            }
            Some(FileKind::Other) | None => MapsVerdict::Unknown,
        },
        _ => MapsVerdict::Unknown,
    }
}

/// What the first present pages of an anonymous VMA say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AnonProbe {
    /// A swap-backed anonymous page: not droppable.
    SwapBacked,
    /// No present page.
    Empty,
    /// Present pages, none swap-backed and anonymous.
    Undecided,
}

/// What a caller of [`MapsDiscovery::process_regions_known`] knows of a
/// process's VMAs.
#[derive(Clone, Copy, Debug)]
pub struct KnownRanges<'a> {
    /// Ranges that are `VM_MERGEABLE`.
    pub mergeable: &'a RangeSet,
    /// Ranges of private anonymous VMAs known not to be `VM_DROPPABLE`.
    pub anonymous: &'a RangeSet,
    /// userfaultfds the caller itself registered in the process (its
    /// write tracking): any other one sends discovery to smaps.
    pub own_userfaultfds: usize,
}

/// Discovery through maps, with its per-file cache. One per scan.
#[derive(Debug, Default)]
pub struct MapsDiscovery {
    files: HashMap<(i32, i32, u64), FileKind>,
    flags: Vec<KpfFlags>,
}

impl MapsDiscovery {
    /// An empty cache.
    pub fn new() -> MapsDiscovery {
        MapsDiscovery::default()
    }

    /// The eligible and rejected VMAs of `pid`, as
    /// [`process_regions`](super::process_regions) classifies them, from
    /// maps where it can decide (see the module doc) and from smaps
    /// otherwise; the second value says which. `pagemap` (the process's,
    /// showing PFNs) and `kpf` serve the droppable check.
    pub fn process_regions(
        &mut self,
        pid: u32,
        pagemap: &Pagemap,
        kpf: &mut KPageFlags,
    ) -> Result<(ProcessRegions, RegionsFrom), LinuxError> {
        if pid == crate::own_pid() {
            return Err(LinuxError::OwnProcess(pid));
        }
        if !no_mergeable_vma(pid) {
            return super::process_regions(pid)
                .map(|r| (r, RegionsFrom::Smaps(SmapsReason::Mergeable)));
        }
        self.regions_from_maps(pid, pagemap, kpf, None)
    }

    /// Like [`process_regions`](Self::process_regions) for a process some
    /// of whose VMAs are `VM_MERGEABLE`, when the caller knows which: a VMA
    /// that overlaps `known.mergeable` is. A daemon that made those ranges
    /// mergeable itself (and learned the others from an earlier smaps
    /// read) knows, and so need not pay smaps' page walk at every refresh.
    /// An anonymous VMA inside `known.anonymous` (ranges an earlier
    /// discovery found not droppable; `VM_DROPPABLE` is set at mmap time
    /// and splits inherit it) skips the droppable probe, which KSM and
    /// zero-page mappings can leave undecided. The caller must not use this
    /// for a process that makes its new VMAs mergeable by itself
    /// (`PR_SET_MEMORY_MERGE`), whose `mg` flags only smaps can tell.
    pub fn process_regions_known(
        &mut self,
        pid: u32,
        pagemap: &Pagemap,
        kpf: &mut KPageFlags,
        known: KnownRanges<'_>,
    ) -> Result<(ProcessRegions, RegionsFrom), LinuxError> {
        if pid == crate::own_pid() {
            return Err(LinuxError::OwnProcess(pid));
        }
        self.regions_from_maps(pid, pagemap, kpf, Some(known))
    }

    fn regions_from_maps(
        &mut self,
        pid: u32,
        pagemap: &Pagemap,
        kpf: &mut KPageFlags,
        known: Option<KnownRanges<'_>>,
    ) -> Result<(ProcessRegions, RegionsFrom), LinuxError> {
        let smaps = |why| super::process_regions(pid).map(|r| (r, RegionsFrom::Smaps(why)));
        // A range the process registered with a userfaultfd of its own may
        // block a remote read forever (MISSING mode); only smaps' `um`/`ui`
        // flags tell which ranges those are.
        if foreign_userfaultfds(pid, known.map_or(0, |k| k.own_userfaultfds)) {
            return smaps(SmapsReason::Userfaultfd);
        }
        let p = Process::new(pid as i32).map_err(|_| LinuxError::NoSuchProcess(pid))?;
        let maps = p
            .maps()
            .map_err(|e| proc::procfs_error(pid, e, "opening /proc/PID/maps", PTRACE))?;
        let mut verdicts = Vec::with_capacity(maps.len());
        for m in maps.iter() {
            let file = match m.pathname {
                MMapPath::Path(_) if !m.perms.contains(MMPermissions::SHARED) => {
                    self.file_kind(pid, m)
                }
                _ => None,
            };
            match classify_maps(m.perms, &m.pathname, file) {
                MapsVerdict::Unknown => return smaps(SmapsReason::UnknownVma),
                v => verdicts.push(v),
            }
        }
        let spans: Vec<(u64, u64)> = maps.iter().map(|m| m.address).collect();
        let needs_probe: Vec<bool> = spans
            .iter()
            .zip(&verdicts)
            .map(|(&(start, end), v)| {
                *v == MapsVerdict::AnonymousUnlessDroppable
                    && !known.is_some_and(|k| k.anonymous.covers(start, end))
            })
            .collect();
        let probes = self.probe_many(pagemap, kpf, &spans, &needs_probe)?;
        let mut out = ProcessRegions::default();
        for ((m, v), probe) in maps.iter().zip(verdicts).zip(probes) {
            let (start, end) = m.address;
            let kind = match (v, probe) {
                (MapsVerdict::Keep(kind), _) => kind,
                (MapsVerdict::AnonymousUnlessDroppable, None) => RegionKind::Anonymous,
                (MapsVerdict::AnonymousUnlessDroppable, Some(p)) => match p {
                    AnonProbe::SwapBacked | AnonProbe::Empty => RegionKind::Anonymous,
                    AnonProbe::Undecided => return smaps(SmapsReason::MaybeDroppable),
                },
                (MapsVerdict::Reject(reason), _) => {
                    out.rejected.push(RejectedRegion { start, end, reason });
                    continue;
                }
                (MapsVerdict::Unknown, _) => unreachable!("returned above"),
            };
            out.eligible.push(Region {
                start,
                end,
                kind,
                path: super::region_path(&m.pathname),
                mergeable: known.is_some_and(|k| k.mergeable.overlaps(start, end)),
                thp_advised: None,
            });
        }
        Ok((out, RegionsFrom::Maps))
    }

    /// The kind of the file behind VMA `m` of `pid` (`None` if it cannot
    /// be looked up now, e.g. the VMA changed).
    fn file_kind(&mut self, pid: u32, m: &MemoryMap) -> Option<FileKind> {
        let key = (m.dev.0, m.dev.1, m.inode);
        if let Some(&k) = self.files.get(&key) {
            return Some(k);
        }
        // The magic link names the mapped file itself, even if it was
        // deleted or lives in another mount namespace.
        let link = format!("/proc/{pid}/map_files/{:x}-{:x}", m.address.0, m.address.1);
        let st = rustix::fs::stat(link.as_str()).ok()?;
        let fs = rustix::fs::statfs(link.as_str()).ok()?;
        let kind = FileKind::of(st.st_mode, st.st_rdev, fs.f_type as i64);
        self.files.insert(key, kind);
        Some(kind)
    }

    /// The probe of each VMA `spans[i]` with `needs[i]` (`None` for the
    /// others), in maps order. A VMA larger than [`GROUPED_VMA_MAX`] is
    /// probed alone, its scan stopping at the first [`PROBE_PAGES`]
    /// present anonymous pages. Consecutive VMAs no larger share one scan
    /// of their present runs, which walks at most their own pages: a
    /// process of thousands of small anonymous VMAs costs a few ioctls
    /// rather than one or two per VMA.
    fn probe_many(
        &mut self,
        pagemap: &Pagemap,
        kpf: &mut KPageFlags,
        spans: &[(u64, u64)],
        needs: &[bool],
    ) -> Result<Vec<Option<AnonProbe>>, LinuxError> {
        let small = |j: usize| spans[j].1 - spans[j].0 <= GROUPED_VMA_MAX;
        let mut out = vec![None; spans.len()];
        let mut i = 0;
        while i < spans.len() {
            if !needs[i] {
                i += 1;
                continue;
            }
            // The group: from `i`, the small VMAs that follow it, up to the
            // last of them that needs a probe.
            let mut last = i;
            if small(i) {
                let mut j = i + 1;
                while j < spans.len() && small(j) {
                    if needs[j] {
                        last = j;
                    }
                    j += 1;
                }
            }
            if last == i {
                let (start, end) = spans[i];
                out[i] = Some(self.probe_anonymous(pagemap, kpf, start, end)?);
                i += 1;
                continue;
            }
            let runs = pagemap.present_runs(spans[i].0, spans[last].1)?;
            for k in (i..=last).filter(|&k| needs[k]) {
                let (start, end) = spans[k];
                let (anon, any) = pages_of(&runs, start, end);
                out[k] = Some(self.decide(pagemap, kpf, &anon, any)?);
            }
            i = last + 1;
        }
        Ok(out)
    }

    /// Looks at the first present anonymous pages of `[start, end)`.
    fn probe_anonymous(
        &mut self,
        pagemap: &Pagemap,
        kpf: &mut KPageFlags,
        start: u64,
        end: u64,
    ) -> Result<AnonProbe, LinuxError> {
        let runs = pagemap.first_pages(
            start,
            end,
            category::PRESENT,
            category::FILE | category::PFNZERO,
            PROBE_PAGES,
        )?;
        let anon: Vec<(u64, u64)> = runs.iter().map(|r| (r.start, r.end)).collect();
        // No present anonymous page: empty, or zero-page mappings only.
        let any = !anon.is_empty()
            || !pagemap
                .first_pages(start, end, category::PRESENT, 0, 1)?
                .is_empty();
        self.decide(pagemap, kpf, &anon, any)
    }

    /// The probe's verdict from the VMA's first present anonymous runs
    /// (`anon`, [`PROBE_PAGES`] looked at) and whether any page of it is
    /// present at all.
    fn decide(
        &mut self,
        pagemap: &Pagemap,
        kpf: &mut KPageFlags,
        anon: &[(u64, u64)],
        any_present: bool,
    ) -> Result<AnonProbe, LinuxError> {
        let mut pfns = Vec::with_capacity(PROBE_PAGES as usize);
        let mut entries = Vec::new();
        for &(start, end) in anon {
            let n = ((end - start) / crate::PAGE_SIZE).min(PROBE_PAGES) as usize;
            entries.clear();
            entries.resize(n, PagemapEntry(0));
            pagemap.read(start, &mut entries)?;
            pfns.extend(entries.iter().filter_map(|e| e.pfn()));
        }
        if !pfns.is_empty() {
            self.flags.clear();
            self.flags.resize(pfns.len(), KpfFlags(0));
            kpf.read_many(&pfns, &mut self.flags)?;
            if self.flags.iter().any(|f| f.anon() && f.swapbacked()) {
                return Ok(AnonProbe::SwapBacked);
            }
            return Ok(AnonProbe::Undecided);
        }
        Ok(if any_present {
            AnonProbe::Undecided
        } else {
            AnonProbe::Empty
        })
    }
}

/// From a scan's present runs (sorted, disjoint), the part inside
/// `[start, end)`: its first anonymous runs (neither file nor zero page),
/// [`PROBE_PAGES`] pages in all at most, as a per-VMA scan with that limit
/// reports them, and whether any page there is present.
fn pages_of(runs: &[PageRun], start: u64, end: u64) -> (Vec<(u64, u64)>, bool) {
    let first = runs.partition_point(|r| r.end <= start);
    let inside = runs[first..]
        .iter()
        .take_while(|r| r.start < end)
        .map(|r| (r.start.max(start), r.end.min(end), r.categories));
    let mut anon = Vec::new();
    let mut any = false;
    let mut left = PROBE_PAGES * crate::PAGE_SIZE;
    for (s, e, categories) in inside {
        any = true;
        if categories & (category::FILE | category::PFNZERO) != 0 || left == 0 {
            continue;
        }
        let e = e.min(s + left);
        left -= e - s;
        anon.push((s, e));
    }
    (anon, any)
}

/// Whether `/proc/PID/ksm_stat` says that no VMA of `pid` is
/// `VM_MERGEABLE` (false when it cannot tell).
/// Whether `pid` holds more userfaultfds than the `own` ones (an
/// unreadable descriptor table counts as yes).
fn foreign_userfaultfds(pid: u32, own: usize) -> bool {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return true;
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]")
        })
        .count()
        > own
}

fn no_mergeable_vma(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/ksm_stat")).is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("ksm_mergeable:"))
            .is_some_and(|v| v.trim() == "no")
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perms(s: &str) -> MMPermissions {
        s.parse().unwrap()
    }

    #[test]
    fn maps_rule() {
        use MapsVerdict::*;
        let file = MMapPath::Path("/usr/lib/libc.so.6".into());
        let anon = MMapPath::Anonymous;
        assert_eq!(
            classify_maps(perms("rw-p"), &anon, None),
            AnonymousUnlessDroppable
        );
        assert_eq!(
            classify_maps(perms("rw-p"), &MMapPath::Heap, None),
            AnonymousUnlessDroppable
        );
        assert_eq!(
            classify_maps(perms("rw-p"), &MMapPath::Other("anon:buf".into()), None),
            AnonymousUnlessDroppable
        );
        assert_eq!(
            classify_maps(perms("---p"), &anon, None),
            Reject(Ineligible::Unreadable)
        );
        assert_eq!(
            classify_maps(perms("rw-s"), &anon, None),
            Reject(Ineligible::Shared)
        );
        assert_eq!(
            classify_maps(perms("r--s"), &file, Some(FileKind::PageCache)),
            Reject(Ineligible::Shared)
        );
        assert_eq!(
            classify_maps(perms("r--p"), &file, Some(FileKind::PageCache)),
            Keep(RegionKind::PrivateFile)
        );
        assert_eq!(
            classify_maps(perms("rw-p"), &file, Some(FileKind::DevZero)),
            Keep(RegionKind::PrivateFile)
        );
        assert_eq!(
            classify_maps(perms("rw-p"), &file, Some(FileKind::Hugetlbfs)),
            Reject(Ineligible::Hugetlb)
        );
        assert_eq!(
            classify_maps(perms("rw-p"), &file, Some(FileKind::Other)),
            Unknown
        );
        assert_eq!(classify_maps(perms("rw-p"), &file, None), Unknown);
        assert_eq!(
            classify_maps(perms("r--p"), &MMapPath::Vvar, None),
            Reject(Ineligible::PfnMapOrIo)
        );
        assert_eq!(
            classify_maps(perms("r--p"), &MMapPath::Other("vvar_vclock".into()), None),
            Reject(Ineligible::PfnMapOrIo)
        );
        assert_eq!(
            classify_maps(perms("r-xp"), &MMapPath::Vdso, None),
            Reject(Ineligible::DontExpand)
        );
        assert_eq!(
            classify_maps(perms("--xp"), &MMapPath::Vsyscall, None),
            Reject(Ineligible::Vsyscall)
        );
        assert_eq!(
            classify_maps(perms("r-xp"), &MMapPath::Other("uprobes".into()), None),
            Unknown
        );
    }

    #[test]
    fn file_kinds() {
        let dev = |maj, min| rustix::fs::makedev(maj, min);
        assert_eq!(FileKind::of(0o100644, 0, 0xEF53), FileKind::PageCache);
        assert_eq!(FileKind::of(0o100644, 0, 0x0102_1994), FileKind::PageCache);
        assert_eq!(
            FileKind::of(0o100644, 0, HUGETLBFS_MAGIC),
            FileKind::Hugetlbfs
        );
        assert_eq!(
            FileKind::of(0o020666, dev(1, 5), 0x0102_1994),
            FileKind::DevZero
        );
        assert_eq!(
            FileKind::of(0o020666, dev(1, 1), 0x0102_1994),
            FileKind::Other
        );
        assert_eq!(
            FileKind::of(0o020666, dev(226, 128), 0x0102_1994),
            FileKind::Other
        );
        // sysfs (PCI resource files are regular files mapped with
        // remap_pfn_range), FUSE (DAX), anon inodes: not page cache.
        assert_eq!(FileKind::of(0o100600, 0, 0x6265_6572), FileKind::Other);
        assert_eq!(FileKind::of(0o100600, 0, 0x6573_5546), FileKind::Other);
        assert_eq!(FileKind::of(0o000600, 0, 0x0904_1934), FileKind::Other);
    }

    /// A shared scan's runs are cut to each VMA: its anonymous pages come
    /// first-come up to PROBE_PAGES, file and zero-page runs count only as
    /// present, and a run that spans two VMAs (the kernel joins touching
    /// runs of equal categories) is split between them.
    #[test]
    fn a_shared_scan_is_cut_to_each_vma() {
        const P: u64 = crate::PAGE_SIZE;
        let run = |s: u64, e: u64, c: u64| PageRun {
            start: s * P,
            end: e * P,
            categories: c | category::PRESENT,
        };
        let runs = [
            run(0, 4, 0),
            run(6, 7, category::PFNZERO),
            run(8, 40, 0),
            run(50, 51, category::FILE),
        ];
        let pages = |s: u64, e: u64| pages_of(&runs, s * P, e * P);
        let span = |v: Vec<(u64, u64)>| v.into_iter().map(|(s, e)| (s / P, e / P)).collect();
        // A VMA over part of the first run.
        assert_eq!((span(pages(2, 6).0), pages(2, 6).1), (vec![(2, 4)], true));
        // Zero page only: present, no anonymous page.
        assert_eq!(pages(5, 8), (vec![], true));
        // The run 8..40 cut at 10 and at the limit of 16 pages.
        assert_eq!(span(pages(8, 10).0), vec![(8, 10)]);
        assert_eq!(span(pages(10, 50).0), vec![(10, 26)]);
        // Zero-page run then anonymous pages: only the latter, limited.
        assert_eq!(span(pages(6, 30).0), vec![(8, 24)]);
        // A hole, and a file page.
        assert_eq!(pages(41, 50), (vec![], false));
        assert_eq!(pages(50, 60), (vec![], true));
        assert_eq!(pages(100, 200), (vec![], false));
    }
}
