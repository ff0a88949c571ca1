//! The memory a process's memory cgroup lets it use: its limit, usage and
//! page cache, on cgroup v2 or v1.
//!
//! The scrubber's pressure test (Singleton's Algorithm 2) compares the page
//! cache and free memory with "the total memory available". For a guest
//! confined by a memory cgroup that is the cgroup's limit, not the host's
//! RAM: its QEMU process's anonymous memory and the host page cache of its
//! images are charged to the same cgroup and reclaimed against each other,
//! while the host as a whole may be far from any threshold (measured: two
//! guests under a 1168 MiB limit on a 24 GiB host kept their images' cache
//! at 500 MiB, and the host-wide test never fired).
//!
//! - **Which cgroup**: the `memory` controller's line of
//!   `/proc/PID/cgroup` (v1), else the unified line (`0::`, v2), with the
//!   controller's mount point from `/proc/self/mountinfo`.
//! - **v2**: `memory.max` (`max` = no limit), `memory.current`, and
//!   `file` of `memory.stat`.
//! - **v1**: `memory.limit_in_bytes` (a value at or past the host's RAM =
//!   no limit: v1 reports "none" as a page-rounded `i64::MAX`),
//!   `memory.usage_in_bytes`, and `total_cache` of `memory.stat` (the
//!   hierarchical count, else `cache`).
//!
//! Only the process's own cgroup's limit is read, not its ancestors'; a
//! limit set higher up is missed, which only means no early scrub.
//! Nothing here writes.

use crate::error::LinuxError;
use pagesift_core::pipeline::scrub::MemoryStats;
use std::io;
use std::path::{Path, PathBuf};

/// The directory of `pid`'s memory cgroup, if the host has a memory
/// controller it is attached to.
pub fn memory_cgroup_dir(pid: u32) -> Result<Option<PathBuf>, LinuxError> {
    let cgroups = procfs::process::Process::new(pid as i32)
        .and_then(|p| p.cgroups())
        .map_err(|e| {
            crate::proc::procfs_error(pid, e, "reading /proc/PID/cgroup", crate::proc::PTRACE)
        })?
        .0;
    let info = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| LinuxError::io("reading /proc/self/mountinfo", e))?;
    let v1 = cgroups
        .iter()
        .find(|c| c.hierarchy != 0 && c.controllers.iter().any(|n| n == "memory"));
    if let Some(c) = v1 {
        return Ok(v1_memory_root(&info).map(|root| join(&root, &c.pathname)));
    }
    let v2 = cgroups.iter().find(|c| c.hierarchy == 0);
    Ok(match (v2, crate::proc::cgroup2_mount()) {
        (Some(c), Some(root)) => Some(join(Path::new(root), &c.pathname)),
        _ => None,
    })
}

/// The memory of the cgroup at `dir` in KiB, as the pressure test reads
/// it (`total` = the limit, `free` = limit − usage, `cached` = its page
/// cache), given the host's RAM in KiB; `None` when there is no limit
/// (none set, or one at or past the host's RAM).
pub fn read_limited(dir: &Path, host_total_kib: u64) -> Result<Option<MemoryStats>, LinuxError> {
    let read = |name: &str| -> Result<Option<String>, LinuxError> {
        let path = dir.join(name);
        match std::fs::read_to_string(&path) {
            Ok(s) => Ok(Some(s)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(LinuxError::io(format!("reading {}", path.display()), e)),
        }
    };
    let number = |text: &str, what: &str| -> Result<u64, LinuxError> {
        text.trim()
            .parse::<u64>()
            .map_err(|_| LinuxError::Parse(format!("{what} in {}: {text:?}", dir.display())))
    };
    // (limit file, usage file, page-cache keys of memory.stat)
    let (limit_name, usage_name, cache_keys): (&str, &str, &[&str]) =
        if read("memory.max")?.is_some() {
            ("memory.max", "memory.current", &["file"])
        } else {
            (
                "memory.limit_in_bytes",
                "memory.usage_in_bytes",
                &["total_cache", "cache"],
            )
        };
    let Some(limit) = read(limit_name)? else {
        return Ok(None);
    };
    if limit.trim() == "max" {
        return Ok(None);
    }
    let limit_kib = number(&limit, limit_name)? / 1024;
    if limit_kib == 0 || limit_kib >= host_total_kib {
        return Ok(None);
    }
    let usage = number(&read(usage_name)?.unwrap_or_default(), usage_name)?;
    let cache = stat_value(&read("memory.stat")?.unwrap_or_default(), cache_keys);
    Ok(Some(MemoryStats {
        total: limit_kib,
        cached: cache.unwrap_or(0) / 1024,
        free: limit_kib.saturating_sub(usage / 1024),
    }))
}

/// The first of `keys` present in a `memory.stat` text.
fn stat_value(stat: &str, keys: &[&str]) -> Option<u64> {
    keys.iter().find_map(|k| {
        stat.lines().find_map(|l| {
            let (name, value) = l.split_once(' ')?;
            (name == *k).then(|| value.trim().parse().ok())?
        })
    })
}

/// The mount point of the cgroup v1 hierarchy that carries the `memory`
/// controller (its super options name it), from a mountinfo text.
fn v1_memory_root(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let mut fields = right.split_whitespace();
        let is_memory = fields.next()? == "cgroup"
            && fields.nth(1)?.split(',').any(|option| option == "memory");
        is_memory.then(|| left.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

fn join(root: &Path, cgroup: &str) -> PathBuf {
    root.join(cgroup.trim_start_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_v1_memory_mount_is_found_by_its_options() {
        let info = "30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 25 0:29 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 25 0:34 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw";
        assert_eq!(
            v1_memory_root(info),
            Some(PathBuf::from("/sys/fs/cgroup/memory"))
        );
        assert_eq!(v1_memory_root(&info.replace("rw,memory", "rw,pids")), None);
    }

    #[test]
    fn stat_keys_are_matched_whole() {
        let stat = "cache 8192\nrss 4096\ntotal_cache 16384\n";
        assert_eq!(stat_value(stat, &["total_cache", "cache"]), Some(16384));
        assert_eq!(stat_value(stat, &["file"]), None);
        assert_eq!(
            stat_value("file_mapped 1\nfile 40960\n", &["file"]),
            Some(40960)
        );
    }

    fn fake(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (name, text) in files {
            std::fs::write(dir.path().join(name), text).unwrap();
        }
        dir
    }

    #[test]
    fn v2_and_v1_files_read_alike() {
        let v2 = fake(&[
            ("memory.max", "1073741824\n"),
            ("memory.current", "805306368\n"),
            ("memory.stat", "anon 268435456\nfile 536870912\n"),
        ]);
        let want = MemoryStats {
            total: 1 << 20,
            cached: 1 << 19,
            free: 1 << 18,
        };
        assert_eq!(read_limited(v2.path(), 24 << 20).unwrap(), Some(want));
        let v1 = fake(&[
            ("memory.limit_in_bytes", "1073741824\n"),
            ("memory.usage_in_bytes", "805306368\n"),
            ("memory.stat", "cache 1\ntotal_cache 536870912\n"),
        ]);
        assert_eq!(read_limited(v1.path(), 24 << 20).unwrap(), Some(want));
    }

    #[test]
    fn no_limit_is_none() {
        let v2 = fake(&[("memory.max", "max\n")]);
        assert_eq!(read_limited(v2.path(), 24 << 20).unwrap(), None);
        let v1 = fake(&[("memory.limit_in_bytes", "9223372036854771712\n")]);
        assert_eq!(read_limited(v1.path(), 24 << 20).unwrap(), None);
        let neither = fake(&[]);
        assert_eq!(read_limited(neither.path(), 24 << 20).unwrap(), None);
        let bad = fake(&[("memory.max", "lots\n")]);
        let e = read_limited(bad.path(), 24 << 20).unwrap_err().to_string();
        assert!(e.contains("memory.max"), "{e}");
    }

    #[test]
    fn own_memory_cgroup_is_found() {
        // Every process on a host with a memory controller has one.
        let dir = memory_cgroup_dir(crate::own_pid()).unwrap();
        // (The root cgroup of v2 has no limit files.)
        if let Some(dir) =
            dir.filter(|d| Some(d.as_path()) != crate::proc::cgroup2_mount().map(Path::new))
        {
            assert!(
                dir.join("memory.max").exists() || dir.join("memory.limit_in_bytes").exists(),
                "{}",
                dir.display()
            );
        }
        assert!(matches!(
            memory_cgroup_dir(u32::MAX - 1),
            Err(LinuxError::NoSuchProcess(_))
        ));
    }
}
