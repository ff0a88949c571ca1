//! The lock file: an exclusive `flock` that serialises every process that
//! changes KSM, and the record of the settings owed to the machine.
//!
//! The kernel drops a `flock` when its holder dies, however it dies, so a
//! SIGKILLed owner cannot leave the lock held; what it owed stays in the
//! file, and the next owner restores it. Because that next owner writes
//! the file's values into sysfs as root, the file is opened without
//! following a symbolic link and used only if it is a regular file owned
//! by root (or us) that group and others cannot write.

use super::error::KsmError;
use super::snapshot::KsmSnapshot;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The exclusive advisory lock on the lock file, which also holds the
/// settings owed to the machine.
#[derive(Debug)]
pub(super) struct LockFile {
    file: File,
    path: PathBuf,
}

impl LockFile {
    /// Opens (creating it 0600 if missing) and locks the lock file. The
    /// next owner writes the knob values it holds to sysfs, so it is opened
    /// without following a symbolic link (O_NOFOLLOW) and used only if it
    /// is a regular file owned by root (or by us) that group and others
    /// cannot write ([`crate::secure::check_trusted`]).
    pub(super) fn acquire(path: &Path, wait: Option<Duration>) -> Result<LockFile, KsmError> {
        use std::os::unix::fs::OpenOptionsExt;
        let untrusted = |reason: String| KsmError::UntrustedLock {
            path: path.into(),
            reason,
        };
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| match e.raw_os_error() {
                Some(libc::ELOOP) => untrusted("it is a symbolic link".into()),
                _ => KsmError::io(format!("opening the KSM lock {}", path.display()), e),
            })?;
        let meta = file
            .metadata()
            .map_err(|e| KsmError::io(format!("reading the KSM lock {}", path.display()), e))?;
        let euid = rustix::process::geteuid().as_raw();
        crate::secure::check_trusted(&meta, euid).map_err(untrusted)?;
        let start = Instant::now();
        match wait {
            None => file
                .lock()
                .map_err(|e| KsmError::io(format!("locking {}", path.display()), e))?,
            Some(limit) => loop {
                match file.try_lock() {
                    Ok(()) => break,
                    Err(std::fs::TryLockError::WouldBlock) => {
                        if start.elapsed() >= limit {
                            let holder = std::fs::read_to_string(path)
                                .ok()
                                .and_then(|t| holder_pid(&t))
                                .unwrap_or_else(|| "unknown".into());
                            return Err(KsmError::LockTimeout {
                                path: path.into(),
                                holder,
                                waited: start.elapsed(),
                            });
                        }
                        std::thread::sleep(Duration::from_millis(20));
                    }
                    Err(std::fs::TryLockError::Error(e)) => {
                        return Err(KsmError::io(format!("locking {}", path.display()), e));
                    }
                }
            },
        }
        Ok(LockFile {
            file,
            path: path.into(),
        })
    }

    /// What a previous owner left owed (empty after a clean release).
    pub(super) fn owed(&mut self) -> Result<KsmSnapshot, KsmError> {
        let mut text = String::new();
        self.file
            .rewind()
            .and_then(|_| self.file.read_to_string(&mut text))
            .map_err(|e| KsmError::io(format!("reading {}", self.path.display()), e))?;
        KsmSnapshot::from_text(&text)
    }

    /// Replaces the file's content with `owed`, under a header naming us.
    pub(super) fn record(&mut self, owed: &KsmSnapshot) -> Result<(), KsmError> {
        let text = if owed.is_empty() {
            String::new()
        } else {
            format!(
                "# pagesift KSM lock: owner pid {}\n\
                 # KSM settings owed to the machine if the owner dies:\n{}",
                std::process::id(),
                owed.to_text()
            )
        };
        self.file
            .set_len(0)
            .and_then(|_| self.file.rewind())
            .and_then(|_| self.file.write_all(text.as_bytes()))
            .and_then(|_| self.file.sync_data())
            .map_err(|e| KsmError::io(format!("writing {}", self.path.display()), e))
    }
}

/// The pid in a lock file's header.
pub(super) fn holder_pid(text: &str) -> Option<String> {
    text.lines()
        .find_map(|l| l.strip_prefix("# pagesift KSM lock: owner pid "))
        .map(|p| p.trim().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ksm::fake::{fake_ksm, opts, tmpdir};
    use crate::ksm::{GuardOptions, Ksm, KsmGuard, Run};

    #[test]
    fn a_lock_file_another_user_could_write_is_not_trusted() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tmpdir("untrusted");
        let d = tmp.path();
        fake_ksm(&d.join("ksm"));
        let ksm = Ksm::at(d.join("ksm")).unwrap();
        // "Owed" values someone planted: run=1 and a huge pages_to_scan.
        let planted = "# pagesift KSM lock: owner pid 1\nrun 1\npages_to_scan 99999\n";
        let target = d.join("planted");
        std::fs::write(&target, planted).unwrap();
        let expect_refused = |what: &str, reason: &str| {
            let e = KsmGuard::acquire_with(opts(d)).expect_err(what);
            let msg = e.to_string();
            assert!(matches!(e, KsmError::UntrustedLock { .. }), "{what}: {e}");
            assert!(msg.contains(&d.join("lock").display().to_string()), "{msg}");
            assert!(msg.contains(reason), "{what}: {msg}");
            // Nothing planted reached sysfs.
            assert_eq!(ksm.run().unwrap(), Run::Stop, "{what}");
            assert_eq!(ksm.pages_to_scan().unwrap(), 100, "{what}");
        };
        // A symbolic link: not followed (O_NOFOLLOW).
        std::os::unix::fs::symlink(&target, d.join("lock")).unwrap();
        expect_refused("a symlinked lock", "symbolic link");
        assert_eq!(
            std::fs::read_to_string(&target).unwrap(),
            planted,
            "written through the link"
        );
        std::fs::remove_file(d.join("lock")).unwrap();
        // Writable by others.
        std::fs::write(d.join("lock"), planted).unwrap();
        std::fs::set_permissions(d.join("lock"), std::fs::Permissions::from_mode(0o666)).unwrap();
        expect_refused("a world-writable lock", "group or others");
        if rustix::process::geteuid().is_root() {
            // Owned by another user.
            std::fs::set_permissions(d.join("lock"), std::fs::Permissions::from_mode(0o600))
                .unwrap();
            std::os::unix::fs::chown(d.join("lock"), Some(65534), None).unwrap();
            expect_refused("another user's lock", "uid 65534");
        }
        // Not a file at all.
        std::fs::remove_file(d.join("lock")).unwrap();
        std::fs::create_dir(d.join("lock")).unwrap();
        let e = KsmGuard::acquire_with(opts(d)).expect_err("a directory");
        assert!(!e.to_string().is_empty());
        assert_eq!(ksm.run().unwrap(), Run::Stop);
        std::fs::remove_dir(d.join("lock")).unwrap();
        // A missing lock is created 0600, and a trusted one is used.
        let g = KsmGuard::acquire_with(opts(d)).unwrap();
        let mode = std::fs::metadata(d.join("lock"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(mode, 0o600);
        assert!(g.release().is_complete());
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn the_lock_excludes_a_second_owner_until_released() {
        let tmp = tmpdir("excl");
        let d = tmp.path();
        fake_ksm(&d.join("ksm"));
        let g = KsmGuard::acquire_with(opts(d)).unwrap();
        let o = GuardOptions {
            wait: Some(Duration::from_millis(100)),
            ..opts(d)
        };
        // flock is per open file: a second open in the same process is
        // excluded too, so threads of one test binary take turns.
        let o2 = o.clone();
        let e = std::thread::spawn(move || KsmGuard::acquire_with(o2).map(|_| ()))
            .join()
            .unwrap()
            .unwrap_err();
        match e {
            KsmError::LockTimeout { holder, .. } => {
                assert_eq!(holder, std::process::id().to_string())
            }
            other => panic!("{other}"),
        }
        g.set_run(Run::Run).unwrap();
        drop(g);
        let g2 = KsmGuard::acquire_with(o).unwrap();
        assert_eq!(g2.ksm().run().unwrap(), Run::Stop);
    }
}
