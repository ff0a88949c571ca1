//! Waiting until one of several descriptors is readable, or a time passes
//! (`poll(2)`): the daemon's sleep wakes for a signal's byte on its
//! self-pipe and for the first I/O hint after a drain.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::Duration;

/// Waits up to `timeout` until one of `fds` is readable (or hung up);
/// returns, per descriptor, whether it is. All `false`: the time passed.
/// An interrupted wait (`EINTR`) returns all `false` as well, early: the
/// caller looks at the clock and its flags anyway.
pub fn wait_readable(fds: &[BorrowedFd<'_>], timeout: Duration) -> io::Result<Vec<bool>> {
    use rustix::event::{PollFd, PollFlags, Timespec, poll};
    let mut set: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    let ts = Timespec {
        tv_sec: timeout.as_secs() as i64,
        tv_nsec: i64::from(timeout.subsec_nanos()),
    };
    match poll(&mut set, Some(&ts)) {
        Ok(_) => Ok(set
            .iter()
            .map(|p| {
                p.revents()
                    .intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR)
            })
            .collect()),
        Err(rustix::io::Errno::INTR) => Ok(vec![false; fds.len()]),
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::net::UnixStream;
    use std::time::Instant;

    #[test]
    fn the_readable_one_is_named_and_a_quiet_wait_times_out() {
        let (a_rx, mut a_tx) = UnixStream::pair().unwrap();
        let (b_rx, _b_tx) = UnixStream::pair().unwrap();
        let t = Instant::now();
        let r = wait_readable(&[a_rx.as_fd(), b_rx.as_fd()], Duration::from_millis(50)).unwrap();
        assert_eq!(r, vec![false, false]);
        assert!(t.elapsed() >= Duration::from_millis(45));
        a_tx.write_all(b"x").unwrap();
        let t = Instant::now();
        let r = wait_readable(&[a_rx.as_fd(), b_rx.as_fd()], Duration::from_secs(5)).unwrap();
        assert_eq!(r, vec![true, false]);
        assert!(t.elapsed() < Duration::from_secs(1));
    }
}
