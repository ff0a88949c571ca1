//! The cgroups the page-cache experiment puts its QEMU processes in, each
//! made for one run and removed on drop:
//!
//! - [`MemoryCgroup`]: a memory limit, so that the host's cache of the
//!   guests' images competes with guest RAM (the machine has no swap);
//! - [`ReadThrottle`]: a limit on the reads per second the processes issue
//!   to the block device under the images, so that a read the host cache
//!   misses costs what it costs on a disk like Singleton's, not what this
//!   machine's virtual disk charges (served from the hypervisor's memory,
//!   it answers a random 64 KiB read in tens of microseconds; see
//!   [`crate::page_cache`]).
//!
//! Both work on cgroup v2 (`memory.max`, `io.max` in one directory) and
//! on v1 (`memory.limit_in_bytes` and `blkio.throttle.read_iops_device`
//! in their controllers' own hierarchies). Nothing global changes: the
//! limits live in the run's own directories, which go when the run does.

use crate::BenchError;
use std::path::{Path, PathBuf};
use std::time::Duration;

const UNIFIED: &str = "/sys/fs/cgroup";

/// Whether the unified (v2) hierarchy has `controller`.
fn on_v2(controller: &str) -> bool {
    std::fs::read_to_string(Path::new(UNIFIED).join("cgroup.controllers"))
        .is_ok_and(|c| c.split_whitespace().any(|c| c == controller))
}

/// Removes a run's cgroup directory once its processes are gone (a
/// guest's exit can take a moment).
fn remove_when_empty(dir: &Path) {
    for _ in 0..50 {
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A memory cgroup made for one run, removed on drop.
pub struct MemoryCgroup {
    dir: PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    /// `name` under the memory controller, limited to `limit_bytes`.
    pub fn create(name: &str, limit_bytes: u64) -> Result<MemoryCgroup, BenchError> {
        let unified = Path::new(UNIFIED);
        let v2 = on_v2("memory");
        let dir = if v2 {
            unified.join(name)
        } else {
            unified.join("memory").join(name)
        };
        let shown = dir.display().to_string();
        let io = |what: &str, e: std::io::Error| {
            BenchError::Missing(format!("a memory cgroup ({what} {shown}): {e}"))
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).map_err(|e| io("creating", e))?;
        let cg = MemoryCgroup { dir, v2 };
        let (file, value) = if v2 {
            ("memory.max", limit_bytes.to_string())
        } else {
            ("memory.limit_in_bytes", limit_bytes.to_string())
        };
        std::fs::write(cg.dir.join(file), value).map_err(|e| io(file, e))?;
        Ok(cg)
    }

    /// Moves `pid` (all its threads) into the cgroup.
    pub fn add(&self, pid: u32) -> Result<(), BenchError> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).map_err(|e| {
            BenchError::System(format!("moving {pid} into {}: {e}", self.dir.display()))
        })
    }

    /// How the limit is set, for the report.
    pub fn describe(&self) -> String {
        if self.v2 {
            "cgroup v2 memory.max".into()
        } else {
            "cgroup v1 memory.limit_in_bytes (this machine mounts the memory controller on v1)"
                .into()
        }
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        remove_when_empty(&self.dir);
    }
}

/// The whole disk under `path`'s file system, as `(major, minor)`: the
/// device itself, or the disk a partition belongs to (throttles apply to
/// disks). `None` when the file system is on no block device (tmpfs,
/// overlayfs, NFS).
pub fn disk_of(path: &Path) -> Option<(u32, u32)> {
    use std::os::unix::fs::MetadataExt;
    let dev = std::fs::metadata(path).ok()?.dev();
    let (major, minor) = (rustix::fs::major(dev), rustix::fs::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if !sys.exists() {
        return None;
    }
    if !sys.join("partition").exists() {
        return Some((major, minor));
    }
    let parent = std::fs::read_to_string(sys.join("../dev")).ok()?;
    let (ma, mi) = parent.trim().split_once(':')?;
    Some((ma.parse().ok()?, mi.parse().ok()?))
}

/// A limit on the reads per second that the processes in a cgroup issue
/// to one disk. Reads the page cache serves are not counted: only those
/// that reach the device.
pub struct ReadThrottle {
    dir: PathBuf,
    /// The file the limit is written to and the line that lifts it.
    file: &'static str,
    lift: String,
    /// Its own directory (v1), removed on drop; on v2 the memory
    /// cgroup's, which that removes.
    own: bool,
}

impl ReadThrottle {
    /// At most `iops` reads a second to `disk` for the processes of the
    /// v2 cgroup `memory` (v2: the io controller sits in the same
    /// directory) or of a new v1 blkio cgroup `name`.
    pub fn create(
        name: &str,
        memory: &MemoryCgroup,
        disk: (u32, u32),
        iops: u32,
    ) -> Result<ReadThrottle, BenchError> {
        let (major, minor) = disk;
        let (dir, file, limit, lift, own) = if memory.v2 {
            let controllers =
                std::fs::read_to_string(memory.dir.join("cgroup.controllers")).unwrap_or_default();
            if !controllers.split_whitespace().any(|c| c == "io") {
                return Err(BenchError::Missing(format!(
                    "the io controller in {} (enable it in its parent's cgroup.subtree_control)",
                    memory.dir.display()
                )));
            }
            (
                memory.dir.clone(),
                "io.max",
                format!("{major}:{minor} riops={iops}"),
                format!("{major}:{minor} riops=max"),
                false,
            )
        } else {
            let dir = Path::new(UNIFIED).join("blkio").join(name);
            let _ = std::fs::remove_dir(&dir);
            std::fs::create_dir(&dir).map_err(|e| {
                BenchError::Missing(format!("a blkio cgroup (creating {}): {e}", dir.display()))
            })?;
            (
                dir,
                "blkio.throttle.read_iops_device",
                format!("{major}:{minor} {iops}"),
                format!("{major}:{minor} 0"),
                true,
            )
        };
        let t = ReadThrottle {
            dir,
            file,
            lift,
            own,
        };
        std::fs::write(t.dir.join(file), &limit).map_err(|e| {
            BenchError::Missing(format!(
                "a read throttle ({limit:?} into {}): {e}",
                t.dir.join(file).display()
            ))
        })?;
        Ok(t)
    }

    /// Moves `pid` into the throttled cgroup (v1; on v2 it is there once
    /// it is in the memory cgroup).
    pub fn add(&self, pid: u32) -> Result<(), BenchError> {
        if !self.own {
            return Ok(());
        }
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string()).map_err(|e| {
            BenchError::System(format!("moving {pid} into {}: {e}", self.dir.display()))
        })
    }

    /// Takes the limit away (the processes stay where they are).
    pub fn lift(&self) -> Result<(), BenchError> {
        std::fs::write(self.dir.join(self.file), &self.lift).map_err(|e| {
            BenchError::System(format!(
                "lifting {}: {e}",
                self.dir.join(self.file).display()
            ))
        })
    }
}

impl Drop for ReadThrottle {
    fn drop(&mut self) {
        let _ = self.lift();
        if self.own {
            remove_when_empty(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_disk_of_a_file_on_a_block_device_is_a_whole_disk() {
        // /proc is on no block device.
        assert_eq!(disk_of(Path::new("/proc/self/status")), None);
        let here = std::env::current_dir().unwrap();
        if let Some((major, minor)) = disk_of(&here) {
            let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
            assert!(sys.exists(), "{}", sys.display());
            assert!(
                !sys.join("partition").exists(),
                "a partition: {}",
                sys.display()
            );
        }
    }
}
