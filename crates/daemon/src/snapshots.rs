//! Status snapshots built when someone asks, not every second.
//!
//! A [`Status`] is linear in the number of regions and reads the daemon's
//! own threads' CPU from `/proc/self/task`. Built once a second whether or
//! not anyone looked, it was 30 % of the CPU of a daemon with nothing to do
//! (a `perf record` of `pagesift run` on 256 MiB of distinct pages at the
//! capped bench setting, by hand, 2026-12-05: 14 of 46 samples), and about
//! 8 % of one sampling a GiB. Nobody reads most of those snapshots: the
//! status socket and the metrics endpoint are read when an operator or a
//! scraper asks.
//!
//! So a reader asks for one:
//!
//! 1. The reader (the status or the metrics server's thread) notes the
//!    generation of the latest snapshot, sets `wanted` and writes a byte
//!    into the bell, a socket pair whose other end the loop waits on
//!    while it sleeps.
//! 2. The loop, asleep or at the end of its wake-up, clears `wanted`,
//!    builds the snapshot and [`publish`](Snapshots::publish)es it, which
//!    bumps the generation and wakes the readers. The wake-up itself is
//!    not brought forward: answering costs a snapshot, not a wake-up.
//! 3. The reader waits for a generation newer than the one it noted, at
//!    most [`FRESH_WAIT`], and serves the latest snapshot (an older one if
//!    the loop was busy that long, none before the first).
//!
//! Invariants: the generation counts the snapshots published and only
//! grows; `latest` is the one published last. `wanted` is cleared before a
//! snapshot is built, so a request that arrives while one is being built
//! gets another.

use crate::status::Status;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Longest a reader waits for the loop to answer before serving the
/// snapshot it has: a wake-up in a long injection can take seconds, and a
/// `pagesift status` should not.
pub const FRESH_WAIT: Duration = Duration::from_secs(2);

/// The latest snapshot and how many came before it.
#[derive(Default)]
struct Published {
    latest: Option<Arc<Status>>,
    generation: u64,
}

/// The snapshots shared between the loop and the servers (see the module
/// header).
pub struct Snapshots {
    published: Mutex<Published>,
    changed: Condvar,
    wanted: AtomicBool,
    /// The readers' end of the bell.
    ring: UnixStream,
}

/// The loop's end of the bell: readable when a reader asked.
pub struct Bell {
    rx: UnixStream,
}

impl Snapshots {
    /// A new set with no snapshot yet, and the bell the loop waits on.
    pub fn new() -> std::io::Result<(Arc<Snapshots>, Bell)> {
        let (ring, rx) = UnixStream::pair()?;
        // A reader never blocks on a full bell: one unread byte is enough.
        ring.set_nonblocking(true)?;
        rx.set_nonblocking(true)?;
        let s = Snapshots {
            published: Mutex::new(Published::default()),
            changed: Condvar::new(),
            wanted: AtomicBool::new(false),
            ring,
        };
        Ok((Arc::new(s), Bell { rx }))
    }

    /// How many snapshots have been published.
    pub fn generation(&self) -> u64 {
        self.lock().generation
    }

    /// Asks the loop for a snapshot and waits for it, at most `wait`;
    /// returns the latest then (see the module header, steps 1 and 3).
    pub fn fresh(&self, wait: Duration) -> Option<Arc<Status>> {
        let seen = self.generation();
        self.wanted.store(true, Ordering::SeqCst);
        // WouldBlock: bytes are waiting already, the loop will look.
        let _ = (&self.ring).write(&[1]);
        let deadline = Instant::now() + wait;
        let mut p = self.lock();
        while p.generation == seen {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            p = match self.changed.wait_timeout(p, left) {
                Ok((g, _)) => g,
                Err(e) => e.into_inner().0,
            };
        }
        p.latest.clone()
    }

    /// Whether a reader asked since the last call; clears the request (the
    /// loop calls this right before it builds a snapshot).
    pub fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::SeqCst)
    }

    /// Makes `snap` the latest and wakes the readers waiting for one.
    pub fn publish(&self, snap: Arc<Status>) {
        let mut p = self.lock();
        p.latest = Some(snap);
        p.generation += 1;
        drop(p);
        self.changed.notify_all();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.published.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Bell {
    /// The descriptor to wait on.
    pub fn as_fd(&self) -> BorrowedFd<'_> {
        self.rx.as_fd()
    }

    /// Empties the bell (after it turned readable).
    pub fn drain(&self) {
        let mut buf = [0u8; 64];
        while matches!((&self.rx).read(&mut buf), Ok(n) if n > 0) {}
    }
}

/// A stand-in for the loop in the servers' tests.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// A loop that answers every request with what `cell` holds then (none:
    /// it does not answer), until dropped.
    pub(crate) struct Answering {
        pub snapshots: Arc<Snapshots>,
        stop: Arc<AtomicBool>,
    }

    impl Answering {
        pub(crate) fn start(cell: Arc<Mutex<Option<Status>>>) -> Answering {
            let (snapshots, bell) = Snapshots::new().unwrap();
            let stop = Arc::new(AtomicBool::new(false));
            let (s2, stop2) = (snapshots.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop2.load(Ordering::SeqCst) {
                    let ready = pagesift_linux::wait::wait_readable(
                        &[bell.as_fd()],
                        Duration::from_millis(50),
                    )
                    .unwrap_or_default();
                    if ready.first() == Some(&true) {
                        bell.drain();
                        let snap = cell.lock().unwrap().clone();
                        if let Some(s) = snap
                            && s2.take_wanted()
                        {
                            s2.publish(Arc::new(s));
                        }
                    }
                }
            });
            Answering { snapshots, stop }
        }
    }

    impl Drop for Answering {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(pid: u32) -> Arc<Status> {
        let mut s = Status::default();
        s.daemon.pid = pid;
        Arc::new(s)
    }

    /// A reader's request rings the bell and sets `wanted`; the snapshot
    /// the loop publishes then is the one the reader gets.
    #[test]
    fn a_reader_gets_the_snapshot_its_request_caused() {
        let (snaps, bell) = Snapshots::new().unwrap();
        snaps.publish(status(1));
        let loop_side = {
            let snaps = snaps.clone();
            std::thread::spawn(move || {
                let ready =
                    pagesift_linux::wait::wait_readable(&[bell.as_fd()], Duration::from_secs(10))
                        .unwrap();
                assert!(ready[0], "the bell rang");
                bell.drain();
                assert!(snaps.take_wanted());
                snaps.publish(status(2));
                assert!(!snaps.take_wanted(), "one request, one snapshot");
            })
        };
        let got = snaps.fresh(Duration::from_secs(10)).unwrap();
        assert_eq!(got.daemon.pid, 2);
        loop_side.join().unwrap();
        assert_eq!(snaps.generation(), 2);
    }

    /// A loop that does not answer leaves the reader with what there was,
    /// after the wait and not much later.
    #[test]
    fn a_busy_loop_leaves_the_reader_with_the_latest_after_the_wait() {
        let (snaps, _bell) = Snapshots::new().unwrap();
        assert!(snaps.fresh(Duration::from_millis(10)).is_none());
        snaps.publish(status(7));
        let t = Instant::now();
        let got = snaps.fresh(Duration::from_millis(50)).unwrap();
        assert_eq!(got.daemon.pid, 7);
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(50) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert!(snaps.take_wanted(), "the request is still there");
    }

    /// Many requests before the loop looks ring the bell without blocking
    /// the readers, and one drain empties it.
    #[test]
    fn requests_never_block_on_a_full_bell() {
        let (snaps, bell) = Snapshots::new().unwrap();
        for _ in 0..100_000 {
            let _ = (&snaps.ring).write(&[1]);
        }
        assert!(snaps.fresh(Duration::from_millis(1)).is_none());
        bell.drain();
        let ready =
            pagesift_linux::wait::wait_readable(&[bell.as_fd()], Duration::from_millis(1)).unwrap();
        assert!(!ready[0], "drained");
    }
}
