//! A second tracer held on a process, so that pagesift's attach to it is
//! skipped (a thread can have one tracer only): the way a test makes an
//! injection fail without harming the target.
//!
//! A thread of the test `PTRACE_SEIZE`s every thread of the target (a
//! seize does not stop anything) and holds them until [`SeizedHold::release`]
//! or drop. Its exit detaches, and the release waits until the kernel says
//! so (`TracerPid: 0`), so that the next attach is not skipped by a
//! detach still under way.

use nix::sys::ptrace;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Every thread of a process seized by a thread of this test, until
/// released (see the module header).
pub struct SeizedHold {
    pid: u32,
    release: Option<mpsc::Sender<()>>,
    holder: Option<JoinHandle<()>>,
}

impl SeizedHold {
    /// Seizes every thread `pid` has now; returns once they are seized.
    pub fn new(pid: u32) -> SeizedHold {
        let tids: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the target's threads")
            .map(|e| e.unwrap().file_name().to_string_lossy().parse().unwrap())
            .collect();
        let (seized_tx, seized_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            for &tid in &tids {
                ptrace::seize(nix::unistd::Pid::from_raw(tid), ptrace::Options::empty())
                    .expect("seize");
            }
            seized_tx.send(()).unwrap();
            // A send or the sender's drop ends the hold.
            let _ = release_rx.recv();
        });
        seized_rx.recv().expect("the holder seized the target");
        SeizedHold {
            pid,
            release: Some(release_tx),
            holder: Some(holder),
        }
    }

    /// Ends the hold and waits (at most 5 s) until the target has no tracer.
    pub fn release(mut self) {
        self.end();
        let deadline = Instant::now() + Duration::from_secs(5);
        while traced(self.pid) {
            assert!(Instant::now() < deadline, "the seize outlived its thread");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn end(&mut self) {
        drop(self.release.take());
        if let Some(h) = self.holder.take() {
            let _ = h.join();
        }
    }
}

impl Drop for SeizedHold {
    fn drop(&mut self) {
        self.end();
    }
}

/// Whether `pid` has a tracer now (`/proc/PID/status`).
fn traced(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .any(|l| l.starts_with("TracerPid:") && l.split_whitespace().nth(1) != Some("0"))
}
