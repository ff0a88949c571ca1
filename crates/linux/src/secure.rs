//! Files pagesift trusts as root, and the status socket it creates.
//!
//! pagesift runs as root and acts on what some files say: the config says
//! which processes to merge, the KSM lock file holds knob values that the
//! next owner writes to sysfs. A file that another user can write (or
//! replace through a symbolic link) would let that user decide. So such a
//! file must be a regular file, owned by root (or by the euid we run as),
//! and writable by nobody else: [`check_trusted`] says why not.
//!
//! The status socket must never be reachable by others, not even between
//! `bind` and a later `chmod`: [`bind_unix_listener`] sets the mode on the
//! socket before `bind`, which Linux uses for the file it creates (less the
//! umask), so the file appears with its final mode.

use rustix::fs::Mode;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};
use std::fs::Metadata;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::os::unix::net::UnixListener;
use std::path::Path;

/// Why a file (its metadata, from `fstat` of the opened file or `lstat`)
/// cannot be trusted by a process running as `euid`, or `Ok`.
pub fn check_trusted(meta: &Metadata, euid: u32) -> Result<(), String> {
    let ft = meta.file_type();
    if !ft.is_file() {
        let kind = if ft.is_symlink() {
            "a symbolic link"
        } else if ft.is_dir() {
            "a directory"
        } else if ft.is_socket() {
            "a socket"
        } else if ft.is_fifo() {
            "a FIFO"
        } else {
            "not a regular file"
        };
        return Err(format!("it is {kind}, not a regular file"));
    }
    let uid = meta.uid();
    if uid != 0 && uid != euid {
        return Err(format!(
            "it is owned by uid {uid}, not by root: another user could change it"
        ));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "its mode {mode:04o} lets group or others write it (chmod go-w)"
        ));
    }
    Ok(())
}

/// A listening unix stream socket at `path` (which must not exist) whose
/// file is created with `mode` (less the umask): the mode is set on the
/// socket before `bind`, so no other user can ever connect through a
/// looser mode.
pub fn bind_unix_listener(path: &Path, mode: u32) -> io::Result<UnixListener> {
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )?;
    rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
    let addr = SocketAddrUnix::new(path)?;
    rustix::net::bind(&fd, &addr)?;
    rustix::net::listen(&fd, 64)?;
    Ok(UnixListener::from(fd))
}

/// Wakes every thread blocked in `accept` on `listener` (and makes later
/// calls fail at once): `shutdown` on a listening socket does that on
/// Linux. A server's stop path needs it because waking `accept` by
/// connecting to the socket's path fails once that path is gone (its
/// directory was removed under a running daemon), and the join waits
/// forever.
pub fn stop_accepting(listener: &UnixListener) -> io::Result<()> {
    rustix::net::shutdown(listener, rustix::net::Shutdown::Both)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("pagesift-secure-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn stop_accepting_wakes_a_blocked_accept_after_the_path_is_gone() {
        let d = dir("stop");
        let p = d.join("s.sock");
        let l = bind_unix_listener(&p, 0o600).unwrap();
        let waker = l.try_clone().unwrap();
        let t = std::thread::spawn(move || l.accept().map(|_| ()));
        std::thread::sleep(std::time::Duration::from_millis(100));
        std::fs::remove_dir_all(&d).unwrap();
        stop_accepting(&waker).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(t.join().unwrap()).unwrap());
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(5))
            .expect("accept returned");
        assert!(r.is_err(), "accept fails once the listener is shut down");
    }

    #[test]
    fn the_socket_file_is_born_with_its_mode() {
        let d = dir("sock");
        let p = d.join("s.sock");
        let l = bind_unix_listener(&p, 0o600).unwrap();
        // No chmod after bind: this is the mode bind created it with (a
        // plain bind under umask 022 gives 0755).
        let mode = std::fs::symlink_metadata(&p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert!(std::os::unix::net::UnixStream::connect(&p).is_ok());
        drop(l);
        // It does not replace anything.
        assert!(
            bind_unix_listener(&p, 0o600).is_err(),
            "bound over an existing file"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn untrusted_files_are_named_with_the_reason() {
        let d = dir("trust");
        let f = d.join("f");
        std::fs::write(&f, "x").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        let euid = rustix::process::geteuid().as_raw();
        let meta = || std::fs::symlink_metadata(&f).unwrap();
        assert_eq!(check_trusted(&meta(), euid), Ok(()));
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).unwrap();
        let e = check_trusted(&meta(), euid).unwrap_err();
        assert!(e.contains("0666") && e.contains("group or others"), "{e}");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert!(check_trusted(&meta(), euid).is_err());
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Another owner (a file as root cannot be given away otherwise).
        let e = check_trusted(&meta(), euid.wrapping_add(1).max(1)).map(|_| ());
        if euid == 0 {
            assert_eq!(
                e,
                Ok(()),
                "root's file, checked for another euid, is root's"
            );
            std::os::unix::fs::chown(&f, Some(65534), None).unwrap();
            let e = check_trusted(&meta(), 0).unwrap_err();
            assert!(e.contains("uid 65534"), "{e}");
        }
        let l = d.join("l");
        std::os::unix::fs::symlink(&f, &l).unwrap();
        let e = check_trusted(&std::fs::symlink_metadata(&l).unwrap(), euid).unwrap_err();
        assert!(e.contains("symbolic link"), "{e}");
        let e = check_trusted(&std::fs::symlink_metadata(&d).unwrap(), euid).unwrap_err();
        assert!(e.contains("directory"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }
}
