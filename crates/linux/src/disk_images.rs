//! Which files are a guest's disk images.
//!
//! Singleton (§3.3) takes "the file opened by the QEMU process associated
//! with the VM" as its virtual disk. Here a disk image of a process is a
//! **regular file it has open for reading and writing** (`O_RDWR` in
//! `/proc/PID/fdinfo/N`'s `flags`, octal): QEMU opens a writable drive
//! read-write, its own binaries, libraries and firmware read-only, and its
//! logs and serial-console files write-only, so the access mode tells them
//! apart without knowing QEMU's command line.
//! Files opened with `O_DIRECT` (QEMU `cache=none`/`directsync`) are
//! listed with [`DiskImage::direct`] set: their I/O bypasses the page cache,
//! so there is nothing to scrub. The operator may also name images in the
//! configuration; those are opened by path ([`crate::page_cache`]).
//!
//! An image is identified by (device, inode): the same file open on two
//! descriptors (QEMU's I/O threads may reopen it) is listed once.

use crate::error::LinuxError;
use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

/// `O_ACCMODE` and `O_RDWR` on Linux; `O_DIRECT` from libc (it differs
/// between architectures).
const O_ACCMODE: u32 = 0o3;
const O_RDWR: u32 = 0o2;
const O_DIRECT: u32 = libc::O_DIRECT as u32;

/// One disk image a process has open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiskImage {
    /// Its path as `/proc/PID/fd/N` resolves it.
    pub path: PathBuf,
    /// The descriptor in the process (the first one found).
    pub fd: u32,
    /// Device and inode: the file's identity.
    pub dev: u64,
    /// See [`DiskImage::dev`].
    pub ino: u64,
    /// Size in bytes when found.
    pub bytes: u64,
    /// Opened with `O_DIRECT`: its I/O does not go through the page cache.
    pub direct: bool,
}

/// Parses the `flags:` line of an fdinfo file (octal).
pub fn fdinfo_flags(text: &str) -> Option<u32> {
    text.lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
}

/// Whether `flags` open a file for reading and writing (a drive is both
/// read and written; a write-only file is a log, not a disk).
pub fn opened_for_writing(flags: u32) -> bool {
    flags & O_ACCMODE == O_RDWR
}

/// The disk images of `pid` (see the module header), in descriptor order.
/// Needs ptrace read access to `pid` (its fd directory).
pub fn disk_images(pid: u32) -> Result<Vec<DiskImage>, LinuxError> {
    disk_images_with(pid, true, &[])
}

/// Device and inode of `path` (for [`disk_images_with`]).
pub fn identity(path: &std::path::Path) -> std::io::Result<(u64, u64)> {
    let m = fs::metadata(path)?;
    Ok((m.dev(), m.ino()))
}

/// [`disk_images`], choosing the sources: files open read-write when
/// `writable` is set, and files whose (device, inode) is in `named`
/// whatever their access mode (images the operator named).
pub fn disk_images_with(
    pid: u32,
    writable: bool,
    named: &[(u64, u64)],
) -> Result<Vec<DiskImage>, LinuxError> {
    let dir = format!("/proc/{pid}/fd");
    let entries = fs::read_dir(&dir).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => LinuxError::NoSuchProcess(pid),
        _ => LinuxError::Io {
            context: format!("listing {dir}"),
            source: e,
        },
    })?;
    let mut fds: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    fds.sort_unstable();
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for fd in fds {
        // The descriptor may close while we look: skip it then.
        let Ok(info) = fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")) else {
            continue;
        };
        let Some(flags) = fdinfo_flags(&info) else {
            continue;
        };
        if named.is_empty() && !(writable && opened_for_writing(flags)) {
            continue;
        }
        let link = format!("/proc/{pid}/fd/{fd}");
        // metadata() follows the magic link to the open file itself.
        let Ok(meta) = fs::metadata(&link) else {
            continue;
        };
        let id = (meta.dev(), meta.ino());
        let wanted = (writable && opened_for_writing(flags)) || named.contains(&id);
        if !wanted || !meta.file_type().is_file() || !seen.insert(id) {
            continue;
        }
        let Ok(path) = fs::read_link(&link) else {
            continue;
        };
        out.push(DiskImage {
            path,
            fd,
            dev: meta.dev(),
            ino: meta.ino(),
            bytes: meta.len(),
            direct: flags & O_DIRECT != 0,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn fdinfo_flags_are_octal() {
        let text = "pos:\t0\nflags:\t0100002\nmnt_id:\t25\nino:\t12\n";
        assert_eq!(fdinfo_flags(text), Some(0o100002));
        assert!(opened_for_writing(0o100002));
        assert!(!opened_for_writing(0o1), "write-only: a log");
        assert!(!opened_for_writing(0o100000));
        assert_eq!(fdinfo_flags("pos:\t0\n"), None);
    }

    #[test]
    fn a_process_files_open_read_write_are_found_once_and_others_not() {
        // This test process: a file opened read-write twice, one opened
        // read-only and one write-only. /proc/self/fd needs no privilege.
        let dir = std::env::temp_dir().join(format!("pagesift-images-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let rw = dir.join("rw.img");
        let ro = dir.join("ro.img");
        fs::write(&rw, vec![1u8; 8192]).unwrap();
        fs::write(&ro, vec![2u8; 4096]).unwrap();
        let a = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&rw)
            .unwrap();
        let b = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&rw)
            .unwrap();
        let c = fs::File::open(&ro).unwrap();
        let log = dir.join("qemu.log");
        let d = fs::File::create(&log).unwrap();
        let found = disk_images(std::process::id()).unwrap();
        let ours: Vec<_> = found.iter().filter(|i| i.path.starts_with(&dir)).collect();
        assert_eq!(ours.len(), 1, "{found:?}");
        assert_eq!(ours[0].path, rw);
        assert_eq!(ours[0].fd, a.as_raw_fd() as u32);
        assert_eq!(ours[0].bytes, 8192);
        assert!(!ours[0].direct);
        drop((a, b, c, d));
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_process_says_so() {
        assert!(matches!(
            disk_images(u32::MAX - 1),
            Err(LinuxError::NoSuchProcess(_))
        ));
    }
}
