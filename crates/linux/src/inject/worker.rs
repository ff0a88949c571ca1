//! The tracer thread: the one thread that does all ptrace work of an
//! [`Injector`](super::Injector), fed one [`Job`] at a time over a channel.
//!
//! One thread, because the kernel ties a tracee to the *thread* that
//! seized it: every later ptrace request must come from that thread. It
//! blocks every signal, so no signal meant for the daemon can interrupt
//! (or, by a default action, kill) it while a target holds our registers.
//! When an attempt leaves a thread seized but not stopped (it did not stop
//! in time), the tracer thread *exits* after its reply: only the exit of
//! its tracer detaches such a thread, and it cancels the pending
//! interrupt. The injector then starts a fresh one for the next job
//! ([`Worker::retire`] waits until the kernel has let go of the tracees).

use super::tracer::{Job, Reply, Tracer};
use std::io;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The tracer thread and its channels.
pub(super) struct Worker {
    pub(super) jobs: mpsc::Sender<Job>,
    pub(super) replies: mpsc::Receiver<Reply>,
    pub(super) handle: std::thread::JoinHandle<()>,
    /// Its kernel thread id: the tracer of its tracees.
    tid: u32,
}

impl Worker {
    pub(super) fn spawn() -> io::Result<Worker> {
        let (jobs, job_rx) = mpsc::channel::<Job>();
        let (reply_tx, replies) = mpsc::channel::<Reply>();
        let (tid_tx, tid_rx) = mpsc::channel::<u32>();
        let handle = std::thread::Builder::new()
            .name("pagesift-tracer".into())
            .spawn(move || {
                let _ = tid_tx.send(rustix::thread::gettid().as_raw_nonzero().get() as u32);
                // No signal may interrupt (or kill, via a default action)
                // this thread while a target holds our registers; process
                // signals go to the daemon's other threads.
                use nix::sys::signal::{SigSet, SigmaskHow, pthread_sigmask};
                let _ = pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&SigSet::all()), None);
                let mut tracer = Tracer::default();
                while let Ok(job) = job_rx.recv() {
                    let reply = tracer.attempt(&job);
                    let exiting = reply.exiting;
                    // The caller may have stopped waiting: then just go on.
                    let _ = reply_tx.send(reply);
                    if exiting {
                        break;
                    }
                }
            })?;
        let tid = tid_rx
            .recv()
            .map_err(|_| io::Error::other("the tracer thread did not start"))?;
        Ok(Worker {
            jobs,
            replies,
            handle,
            tid,
        })
    }

    /// Joins a tracer that announced its exit and waits (bounded) until the
    /// kernel has released it: only then are its tracees detached (a join
    /// returns when the thread's stack is free, slightly earlier).
    pub(super) fn retire(self) {
        let _ = self.handle.join();
        let task = format!("/proc/self/task/{}", self.tid);
        let deadline = Instant::now() + Duration::from_millis(200);
        while std::path::Path::new(&task).exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_micros(100));
        }
    }
}
