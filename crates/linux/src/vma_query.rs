//! A process's VMAs of one kind, asked of the kernel one at a time
//! (`PROCMAP_QUERY`, Linux 6.11+) instead of read from the whole text of
//! `/proc/PID/maps`.
//!
//! Reading `maps` makes the kernel format every VMA, so its cost grows
//! with the process's VMA count. The injector needs only the executable
//! VMAs (where its syscall gadgets are), usually a dozen, and a process
//! may have tens of thousands of others: guest RAM split by KSM advice,
//! or the 10 000 one-page VMAs a process of `scripts/vma-bound` maps.
//! `PROCMAP_QUERY` with `COVERING_OR_NEXT_VMA` and the executable bit
//! required returns the next executable VMA at or after an address, found
//! in the kernel's VMA tree, so the walk below costs one ioctl per
//! executable VMA, whatever else the process maps.
//!
//! The walk starts at address 0 and asks again from each answer's end;
//! the answers are therefore strictly increasing and disjoint. A process
//! that maps or unmaps code while it is walked gives a list that mixes
//! before and after, as a `maps` read that spans two pages of text can:
//! its users check the bytes they rely on before relying on them.

use std::fs::File;
use std::os::fd::AsFd;

use crate::error::LinuxError;
use crate::proc::{PTRACE, error};
use crate::sys::{PROCMAP_VMA_EXECUTABLE, QueriedVma, procmap_query};

/// Longest name read for a VMA (a path); the kernel refuses a longer one
/// with `ENAMETOOLONG`, which ends the walk with an error.
const NAME_MAX: usize = 4096;

/// Most executable VMAs walked: a bound on the ioctls, far above what a
/// program maps (a QEMU process maps about 150 executable VMAs).
const MOST: usize = 65_536;

/// The executable VMAs of `pid`, in address order, or `Ok(None)` if this
/// kernel has no `PROCMAP_QUERY` (the caller reads `maps` instead).
/// Needs the same access as reading `/proc/PID/maps`.
pub fn executable_vmas(pid: u32) -> Result<Option<Vec<QueriedVma>>, LinuxError> {
    const WHAT: &str = "querying /proc/PID/maps";
    let maps = File::open(format!("/proc/{pid}/maps")).map_err(|e| error(pid, e, WHAT, PTRACE))?;
    let mut name = vec![0u8; NAME_MAX];
    let mut out = Vec::new();
    let mut at = 0u64;
    while out.len() < MOST {
        let vma = match procmap_query(maps.as_fd(), at, PROCMAP_VMA_EXECUTABLE, &mut name) {
            Ok(Some(v)) => v,
            Ok(None) => break,
            Err(e) if e.raw_os_error() == Some(libc::ENOTTY) && out.is_empty() => {
                return Ok(None);
            }
            Err(e) => return Err(error(pid, e, WHAT, PTRACE)),
        };
        at = vma.end;
        out.push(vma);
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sys::{PROCMAP_VMA_READABLE, PROCMAP_VMA_SHARED, PROCMAP_VMA_WRITABLE};

    /// This process's executable VMAs by query are exactly the executable
    /// lines of its maps (the `[vsyscall]` gate aside, which is outside
    /// the VMA tree), with the same offsets, devices, inodes and names.
    #[test]
    fn queried_executable_vmas_match_the_maps_text() {
        let pid = std::process::id();
        let Some(queried) = executable_vmas(pid).unwrap() else {
            eprintln!("skipped: no PROCMAP_QUERY on this kernel");
            return;
        };
        let text = std::fs::read_to_string("/proc/self/maps").unwrap();
        let from_text: Vec<QueriedVma> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                if !f[1].contains('x') || f.get(5) == Some(&"[vsyscall]") {
                    return None;
                }
                let (s, e) = f[0].split_once('-').unwrap();
                let (ma, mi) = f[3].split_once(':').unwrap();
                let perm = |c: char, bit: u64| if f[1].contains(c) { bit } else { 0 };
                Some(QueriedVma {
                    start: u64::from_str_radix(s, 16).unwrap(),
                    end: u64::from_str_radix(e, 16).unwrap(),
                    perms: perm('r', PROCMAP_VMA_READABLE)
                        | perm('w', PROCMAP_VMA_WRITABLE)
                        | perm('x', PROCMAP_VMA_EXECUTABLE)
                        | perm('s', PROCMAP_VMA_SHARED),
                    offset: u64::from_str_radix(f[2], 16).unwrap(),
                    dev: (
                        u32::from_str_radix(ma, 16).unwrap(),
                        u32::from_str_radix(mi, 16).unwrap(),
                    ),
                    inode: f[4].parse().unwrap(),
                    name: f.get(5).map(|n| n.to_string()).unwrap_or_default(),
                })
            })
            .collect();
        assert!(!queried.is_empty(), "a running test has executable code");
        assert_eq!(queried, from_text);
    }

    #[test]
    fn a_process_that_does_not_exist_is_named() {
        let err = executable_vmas(u32::MAX >> 1).unwrap_err();
        assert!(matches!(err, LinuxError::NoSuchProcess(_)), "{err:?}");
    }
}
