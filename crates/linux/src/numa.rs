//! NUMA facts and page moves: which nodes the host has, which node a page
//! of a process is on, moving pages of another process to a node, and
//! binding the calling process to one node.
//!
//! - **Nodes** come from `/sys/devices/system/node/online` (a CPU list such
//!   as `0-1`); a kernel without NUMA support has no such directory and is
//!   one node. A node's CPUs are its `cpulist`.
//! - **A page's node** is `move_pages(2)` in query mode (no target nodes):
//!   one call answers for many pages; the status of each is its node, or a
//!   negative errno (`-ENOENT` not present, `-EFAULT` the zero page).
//! - **Moving** is `move_pages(2)` with target nodes and
//!   `MPOL_MF_MOVE_ALL`: plain `MPOL_MF_MOVE` moves only pages mapped by
//!   this one process, and a merged (KSM) page is mapped by all its
//!   sharers. KSM pages migrate like any anonymous page: the frame is
//!   copied, every sharer's mapping is pointed at the copy, and the page
//!   stays merged. The caller needs ptrace access to the process and
//!   `CAP_SYS_NICE`; the target node must be in the process's cpuset.
//!   Contents never change: the kernel copies the page while every mapping
//!   of it is blocked (a migration entry), so the process only waits.
//! - **Binding** ([`bind_to_node`]) sets the calling thread's memory policy
//!   (`MPOL_BIND` to the node) and its CPU affinity (the node's CPUs),
//!   before a workload maps its memory.
//!
//! Calls are batched ([`BATCH`] pages per call).

use crate::caps::{self, Capability};
use crate::error::{LinuxError, WHY_PTRACE};
use crate::sys;
use std::path::Path;

/// A NUMA node number.
pub type Node = u16;

/// Pages per `move_pages` call.
pub const BATCH: usize = 4096;

const MPOL_MF_MOVE_ALL: i32 = 1 << 2;
const NODE_DIR: &str = "/sys/devices/system/node";
const WHY_NICE: &str = "to move pages mapped by several processes (merged pages) between \
                        NUMA nodes (move_pages with MPOL_MF_MOVE_ALL)";

/// Parses a kernel CPU/node list (`0-3,8,10-11`).
pub fn parse_list(s: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().ok()?),
        }
    }
    Some(out)
}

/// The host's online nodes; `[0]` when the kernel shows none (no NUMA).
pub fn online_nodes() -> Vec<Node> {
    online_nodes_in(Path::new(NODE_DIR))
}

fn online_nodes_in(dir: &Path) -> Vec<Node> {
    std::fs::read_to_string(dir.join("online"))
        .ok()
        .and_then(|s| parse_list(&s))
        .map(|v| {
            v.into_iter()
                .filter_map(|n| Node::try_from(n).ok())
                .collect::<Vec<_>>()
        })
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| vec![0])
}

/// How many nodes are online (1 without NUMA).
pub fn node_count() -> usize {
    online_nodes().len()
}

/// The CPUs of `node`.
pub fn node_cpus(node: Node) -> Result<Vec<u32>, LinuxError> {
    let path = format!("{NODE_DIR}/node{node}/cpulist");
    let s = std::fs::read_to_string(&path)
        .map_err(|e| LinuxError::io(format!("reading {path} (is node {node} online?)"), e))?;
    parse_list(&s).ok_or_else(|| LinuxError::Parse(format!("{path}: {s:?}")))
}

/// Where one page is, from `move_pages`' status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageNode {
    /// On this node.
    On(Node),
    /// Not present, the zero page, or otherwise not movable: the errno.
    Not(i32),
}

impl PageNode {
    fn from_status(s: i32) -> PageNode {
        match Node::try_from(s) {
            Ok(n) => PageNode::On(n),
            // Never answered (the kernel gave up before it): try again.
            Err(_) if s == UNWRITTEN => PageNode::Not(libc::EAGAIN),
            Err(_) => PageNode::Not(-s),
        }
    }

    /// The node, if the page is on one.
    pub fn node(self) -> Option<Node> {
        match self {
            PageNode::On(n) => Some(n),
            PageNode::Not(_) => None,
        }
    }
}

fn process_error(pid: u32, e: std::io::Error, what: &'static str) -> LinuxError {
    // move_pages' EPERM is either ptrace access or, with MOVE_ALL,
    // CAP_SYS_NICE: name the one the caller lacks.
    let cap = if caps::has(Capability::SysPtrace) {
        Capability::SysNice
    } else {
        Capability::SysPtrace
    };
    let why = if cap == Capability::SysNice {
        WHY_NICE
    } else {
        WHY_PTRACE
    };
    LinuxError::from_process_op(pid, e, what, cap, why)
}

/// The node of each page of `pid` at `addrs` (page-aligned).
pub fn page_nodes(pid: u32, addrs: &[u64]) -> Result<Vec<PageNode>, LinuxError> {
    let mut out = Vec::with_capacity(addrs.len());
    let mut status = vec![UNWRITTEN; BATCH.min(addrs.len())];
    for chunk in addrs.chunks(BATCH) {
        let st = &mut status[..chunk.len()];
        st.fill(UNWRITTEN);
        sys::move_pages(pid, chunk, None, st, 0)
            .map_err(|e| process_error(pid, e, "move_pages (query)"))?;
        out.extend(st.iter().map(|&s| PageNode::from_status(s)));
    }
    Ok(out)
}

/// What a move did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Pages now on the target node (moved, or already there).
    pub on_target: u64,
    /// Pages the kernel could not move (busy, not present, ...).
    pub failed: u64,
    /// Per page: the node it is on now, or the errno of its failure.
    pub status: Vec<PageNode>,
}

/// A status slot the kernel has not written (it writes nodes, which are
/// never negative, and negative errnos, which are small).
const UNWRITTEN: i32 = i32::MIN;

/// Moves the pages of `pid` at `addrs` to `node`, merged ones included
/// (`MPOL_MF_MOVE_ALL`, which needs `CAP_SYS_NICE`).
///
/// When the kernel fails to migrate some of the pages it collected (a
/// page busy at that moment, such as one ksmd holds), it writes no status
/// for them or for the rest of the call: those pages are asked for again
/// in query mode, so every status says where the page really is.
pub fn move_to_node(pid: u32, addrs: &[u64], node: Node) -> Result<Moved, LinuxError> {
    let mut moved = Moved::default();
    let nodes = vec![node as i32; BATCH.min(addrs.len())];
    let mut status = vec![UNWRITTEN; BATCH.min(addrs.len())];
    for chunk in addrs.chunks(BATCH) {
        let st = &mut status[..chunk.len()];
        st.fill(UNWRITTEN);
        let not_moved = sys::move_pages(
            pid,
            chunk,
            Some(&nodes[..chunk.len()]),
            st,
            MPOL_MF_MOVE_ALL,
        )
        .map_err(|e| process_error(pid, e, "move_pages (MPOL_MF_MOVE_ALL)"))?;
        if not_moved > 0 {
            let unwritten: Vec<usize> = (0..chunk.len()).filter(|&i| st[i] == UNWRITTEN).collect();
            let again: Vec<u64> = unwritten.iter().map(|&i| chunk[i]).collect();
            for (i, now) in unwritten.into_iter().zip(page_nodes(pid, &again)?) {
                st[i] = match now {
                    PageNode::On(n) => n as i32,
                    PageNode::Not(e) => -e,
                };
            }
        }
        for &s in st.iter() {
            moved.status.push(PageNode::from_status(s));
            if s == node as i32 {
                moved.on_target += 1;
            } else {
                moved.failed += 1;
            }
        }
    }
    Ok(moved)
}

/// The nice value of `pid` (`/proc/PID/stat`).
pub fn nice(pid: u32) -> Result<i32, LinuxError> {
    let p =
        procfs::process::Process::new(pid as i32).map_err(|_| LinuxError::NoSuchProcess(pid))?;
    let stat = p.stat().map_err(|_| LinuxError::Gone(pid))?;
    Ok(stat.nice as i32)
}

/// The node of the CPU `pid` last ran on (`/proc/PID/stat`'s processor).
pub fn cpu_node(pid: u32) -> Option<Node> {
    let cpu = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?
        .processor? as u32;
    online_nodes()
        .into_iter()
        .find(|&n| node_cpus(n).is_ok_and(|c| c.contains(&cpu)))
}

/// The node `pid`'s CPU affinity confines it to, if all its allowed CPUs
/// are on one node (`/proc/PID/status` `Cpus_allowed_list`).
pub fn affinity_node(pid: u32) -> Option<Node> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))?;
    let cpus = parse_list(list)?;
    let mut found = None;
    for n in online_nodes() {
        let on = node_cpus(n).ok()?;
        if cpus.iter().all(|c| on.contains(c)) {
            found = Some(n);
        }
    }
    found
}

/// Binds the calling thread (and what it later forks or execs) to `node`:
/// its CPUs and its memory. Call before mapping memory.
pub fn bind_to_node(node: Node) -> Result<(), LinuxError> {
    if node >= 64 {
        return Err(LinuxError::Unsupported(format!(
            "binding to node {node} (nodes 0..=63 only)"
        )));
    }
    let cpus = node_cpus(node)?;
    let mut set = rustix::thread::CpuSet::new();
    for c in &cpus {
        set.set(*c as usize);
    }
    rustix::thread::sched_setaffinity(None, &set).map_err(|e| {
        LinuxError::io(
            format!("sched_setaffinity to node {node}'s CPUs {cpus:?}"),
            e.into(),
        )
    })?;
    sys::bind_memory(1u64 << node)
        .map_err(|e| LinuxError::io(format!("set_mempolicy(MPOL_BIND, node {node})"), e))?;
    Ok(())
}

/// Where a process's anonymous pages are: merged (KSM) and unmerged
/// pages per node (index = node).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// The process.
    pub pid: u32,
    /// Its merged pages per node.
    pub merged_per_node: Vec<u64>,
    /// Its unmerged present pages per node.
    pub unmerged_per_node: Vec<u64>,
}

/// Counts the present pages of `pid`'s private writable anonymous
/// mappings by node and by merged (KSM) or not: pagemap for the frames,
/// kpageflags for `KPF_KSM`, `move_pages` in query mode for the nodes.
/// Reads only; needs `CAP_SYS_ADMIN` (frames) and ptrace access.
pub fn census(pid: u32) -> Result<Census, LinuxError> {
    use crate::kpageflags::{KPageFlags, KpfFlags};
    use crate::pagemap::{Pagemap, PagemapEntry};
    let maps = crate::proc::read(pid, "maps", crate::proc::PTRACE)?;
    let pm = Pagemap::open(pid)?;
    pm.require_pfns()?;
    let mut flags = KPageFlags::open()?;
    let mut out = Census {
        pid,
        ..Census::default()
    };
    let bump = |v: &mut Vec<u64>, n: Node| {
        if v.len() <= n as usize {
            v.resize(n as usize + 1, 0);
        }
        v[n as usize] += 1;
    };
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(3);
        if !perms.starts_with("rw")
            || !perms.ends_with('p')
            || path.is_some_and(|p| !p.starts_with('[') || p == "[vvar]" || p == "[vsyscall]")
        {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut at = start;
        while at < end {
            let n = ((end - at) / crate::PAGE_SIZE).min(65536) as usize;
            let mut entries = vec![PagemapEntry::default(); n];
            pm.read(at, &mut entries)?;
            let present: Vec<(u64, u64)> = entries
                .iter()
                .enumerate()
                .filter_map(|(i, e)| {
                    Some((
                        at + i as u64 * crate::PAGE_SIZE,
                        e.pfn().filter(|&p| p != 0)?,
                    ))
                })
                .collect();
            let pfns: Vec<u64> = present.iter().map(|p| p.1).collect();
            let mut fl = vec![KpfFlags(0); pfns.len()];
            flags.read_many(&pfns, &mut fl)?;
            let addrs: Vec<u64> = present.iter().map(|p| p.0).collect();
            let nodes = page_nodes(pid, &addrs)?;
            for (fl, node) in fl.iter().zip(nodes) {
                let Some(node) = node.node() else { continue };
                if fl.ksm() {
                    bump(&mut out.merged_per_node, node);
                } else {
                    bump(&mut out.unmerged_per_node, node);
                }
            }
            at += n as u64 * crate::PAGE_SIZE;
        }
    }
    let width = out.merged_per_node.len().max(out.unmerged_per_node.len());
    out.merged_per_node.resize(width, 0);
    out.unmerged_per_node.resize(width, 0);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse() {
        assert_eq!(parse_list("0-1\n"), Some(vec![0, 1]));
        assert_eq!(parse_list("0,2-4,7"), Some(vec![0, 2, 3, 4, 7]));
        assert_eq!(parse_list("0"), Some(vec![0]));
        assert_eq!(parse_list(""), Some(vec![]));
        assert_eq!(parse_list("3-1"), None);
        assert_eq!(parse_list("x"), None);
    }

    #[test]
    fn no_node_directory_is_one_node() {
        let d = std::env::temp_dir().join(format!("pagesift-numa-{}", std::process::id()));
        assert_eq!(online_nodes_in(&d), vec![0]);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("online"), "0-1\n").unwrap();
        assert_eq!(online_nodes_in(&d), vec![0, 1]);
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// This host's nodes agree with the node directories, and a page of a
    /// child process is on one of them (query only: nothing moves).
    #[test]
    fn a_childs_page_is_on_an_online_node() {
        let nodes = online_nodes();
        assert!(!nodes.is_empty());
        for n in &nodes {
            assert!(Path::new(&format!("{NODE_DIR}/node{n}")).exists() || nodes == [0]);
        }
        // Our own stack page, through our own pid.
        let x = [7u8; 4096];
        let addr = (x.as_ptr() as u64) & !4095;
        let got = page_nodes(std::process::id(), &[addr]).unwrap();
        assert!(
            matches!(got[0], PageNode::On(n) if nodes.contains(&n)),
            "{got:?}"
        );
        std::hint::black_box(&x);
    }
}
