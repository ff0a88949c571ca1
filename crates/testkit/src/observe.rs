//! What a test reads about a process without touching it: RSS and page
//! table size (`/proc/PID/status`), pagemap entries (read as root, never
//! faulting anything in), which of its VMAs carry a flag, and its cgroup. The harm checks compare these
//! before and after pagesift looked at a process.

use pagesift_linux::pagemap::{Pagemap, PagemapEntry};

/// A pid that cannot exist (above the kernel's pid_max limit of 2^22).
pub const NO_SUCH_PID: u32 = 999_999_999;

/// `VmRSS` and `VmPTE` of a process, in kB.
pub fn rss_and_pte(pid: u32) -> (u64, u64) {
    let s = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.status())
        .expect("status");
    (s.vmrss.unwrap_or(0), s.vmpte.unwrap_or(0))
}

/// pagemap entries of `pages` pages from `start` (read as root, never
/// faulting anything).
pub fn pagemap_entries(pid: u32, start: u64, pages: u64) -> Vec<PagemapEntry> {
    let pm = Pagemap::open(pid).expect("pagemap");
    let mut v = vec![PagemapEntry(0); pages as usize];
    pm.read(start, &mut v).expect("pagemap read");
    v
}

/// How many of those pages are present.
pub fn present_count(pid: u32, start: u64, pages: u64) -> usize {
    pagemap_entries(pid, start, pages)
        .iter()
        .filter(|e| e.present())
        .count()
}

/// The cgroup v2 path of process `pid` (`0::PATH` of `/proc/PID/cgroup`).
pub fn cgroup_of(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string()
}

/// The VMAs of `pid` whose `VmFlags` (`/proc/PID/smaps`) hold the
/// two-letter `flag` (`mg`: advised mergeable; `uw`: registered for
/// userfaultfd write protection), as `(start, end)` in address order.
pub fn vmas_flagged(pid: u32, flag: &str) -> Vec<(u64, u64)> {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).expect("smaps");
    let mut out = Vec::new();
    let mut vma = (0, 0);
    for line in smaps.lines() {
        let head = line.split_whitespace().next().unwrap_or("");
        if let Some((s, e)) = head.split_once('-')
            && let (Ok(s), Ok(e)) = (u64::from_str_radix(s, 16), u64::from_str_radix(e, 16))
        {
            vma = (s, e);
        } else if let Some(flags) = line.strip_prefix("VmFlags:")
            && flags.split_whitespace().any(|f| f == flag)
        {
            out.push(vma);
        }
    }
    out
}
