//! How much of a process's anonymous memory the kernel's LRU believes was
//! used lately: its present pages, those with `PG_referenced` set and those
//! on the active list, read from pagemap and `/proc/kpageflags` without
//! touching a page.
//!
//! Why pagesift measures this: every remote read of a page, by either of
//! its paths (`process_vm_readv`, `/proc/PID/mem`), resolves the page with
//! `FOLL_TOUCH`, and the kernel then calls `folio_mark_accessed` on it, as
//! for a use by the process: the first read sets `PG_referenced` (and
//! clears `PG_idle`), the second moves an inactive page to the active list.
//! Reclaim and DAMON then take memory the process never used for memory in
//! use. ksmd's scan does not mark the pages it reads; it marks only the
//! page a merge keeps as the KSM page (`try_to_merge_one_page`), which is in
//! use by then. Measured on this machine
//! (2026-12-02, kernel 6.18, 4 096 pages written once and left alone, read
//! through `/proc/PID/mem`): none referenced or active before, 4 096
//! referenced after one read, 4 080 active after a second.
//!
//! Counts are of 4 KiB pages (each page of a large folio counts the
//! folio's flags). The reads race with the process and with reclaim; the
//! counts are a snapshot.

use crate::error::LinuxError;
use crate::kpageflags::{KPageFlags, KpfFlags};
use crate::pagemap::{Pagemap, PagemapEntry};
use procfs::process::{MMapPath, Process};

/// Pagemap entries read per call.
const CHUNK: usize = 4096;

/// LRU evidence over some anonymous memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AccessMarks {
    /// Present pages.
    pub present: u64,
    /// Of those, pages whose folio has `PG_referenced`.
    pub referenced: u64,
    /// Of those, pages whose folio is on an active LRU list.
    pub active: u64,
}

impl AccessMarks {
    /// Steps up the LRU's ladder of use, summed over the pages: a page
    /// counts 1 when referenced and 2 when active, the two steps a page
    /// takes as it is used (`folio_mark_accessed`: an unreferenced page
    /// gets referenced, a referenced inactive one is activated, which
    /// clears referenced).
    pub fn use_steps(&self) -> u64 {
        self.referenced + 2 * self.active
    }
}

impl std::ops::AddAssign for AccessMarks {
    fn add_assign(&mut self, o: AccessMarks) {
        self.present += o.present;
        self.referenced += o.referenced;
        self.active += o.active;
    }
}

/// The counts over every private anonymous mapping of process `pid` (no
/// file behind it: anonymous memory, the heap, stacks). Needs
/// `CAP_SYS_ADMIN` for the frame numbers and `/proc/kpageflags`.
pub fn of_process(pid: u32, flags: &mut KPageFlags) -> Result<AccessMarks, LinuxError> {
    let maps = Process::new(pid as i32)
        .and_then(|p| p.maps())
        .map_err(|e| {
            crate::proc::procfs_error(pid, e, "reading /proc/PID/maps", crate::proc::PTRACE)
        })?;
    let pagemap = Pagemap::open(pid)?;
    pagemap.require_pfns()?;
    let mut marks = AccessMarks::default();
    let mut entries = vec![PagemapEntry(0); CHUNK];
    let mut pfns = Vec::with_capacity(CHUNK);
    let mut out = Vec::with_capacity(CHUNK);
    for m in maps {
        let anonymous = matches!(
            m.pathname,
            MMapPath::Anonymous | MMapPath::Heap | MMapPath::Stack | MMapPath::TStack(_)
        );
        if !anonymous || m.perms.contains(procfs::process::MMPermissions::SHARED) {
            continue;
        }
        let (start, end) = m.address;
        let mut at = start;
        while at < end {
            let n = ((end - at) / crate::PAGE_SIZE).min(CHUNK as u64) as usize;
            pagemap.read(at, &mut entries[..n])?;
            pfns.clear();
            pfns.extend(entries[..n].iter().filter_map(|e| e.pfn()));
            out.clear();
            out.resize(pfns.len(), KpfFlags(0));
            flags.read_many(&pfns, &mut out)?;
            marks.present += pfns.len() as u64;
            marks.referenced += out.iter().filter(|f| f.referenced()).count() as u64;
            marks.active += out.iter().filter(|f| f.active()).count() as u64;
            at += n as u64 * crate::PAGE_SIZE;
        }
    }
    Ok(marks)
}
