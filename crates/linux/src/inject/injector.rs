//! The public face of injection: [`Injector`] validates a batch, skips
//! pagesift's own process, hands the batch to its tracer thread and waits
//! for the answer within a bound, and counts outcomes.
//!
//! The caller never waits longer than the tracer's own bounds plus slack
//! (the stop timeout twice, the call timeout once per call and once more,
//! one second): past it the injection is [`InjectError::Stuck`], the
//! tracer is left to finish in the background (it keeps the target only
//! until the call in hand returns, then restores it and detaches) and a
//! new tracer thread serves the next batch. A tracer that panicked has
//! released its tracee by exiting; the next attach waits until the kernel
//! has let go of it.

use super::calls::Syscall;
use super::outcome::{InjectConfig, InjectError, InjectStats, Injection, Outcome, SkipReason};
use super::tracer::Job;
use super::worker::Worker;
use crate::error::LinuxError;
use std::fmt;
use std::sync::mpsc;
use std::time::Duration;

/// Runs syscalls inside other processes (see the module header).
///
/// ```no_run
/// use pagesift_linux::inject::{Advice, Injector, Outcome, Syscall};
/// let mut inj = Injector::new(Default::default());
/// let calls = [Syscall::Madvise { addr: 0x7f00_0000_0000, len: 1 << 20, advice: Advice::Mergeable }];
/// match inj.run(1234, &calls)? {
///     Outcome::Done(i) => println!("results {:?}", i.results),
///     Outcome::Skipped(why) => println!("skipped: {why}"),
///     Outcome::Gone(_) => println!("exited"),
/// }
/// # Ok::<(), pagesift_linux::inject::InjectError>(())
/// ```
pub struct Injector {
    config: InjectConfig,
    worker: Option<Worker>,
    stats: InjectStats,
}

impl fmt::Debug for Injector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Injector")
            .field("config", &self.config)
            .field("stats", &self.stats)
            .finish()
    }
}

impl Injector {
    /// An injector; its tracer thread starts on first use.
    pub fn new(config: InjectConfig) -> Injector {
        Injector {
            config,
            worker: None,
            stats: InjectStats::default(),
        }
    }

    /// Its configuration.
    pub fn config(&self) -> &InjectConfig {
        &self.config
    }

    /// Counters since it was made.
    pub fn stats(&self) -> &InjectStats {
        &self.stats
    }

    /// Runs `calls` in process `pid`, in order, in one attach, from a thread
    /// chosen as the module header describes.
    pub fn run(&mut self, pid: u32, calls: &[Syscall]) -> Result<Outcome, InjectError> {
        self.submit(pid, None, None, calls)
    }

    /// Like [`run`](Self::run), but only if the process still runs the
    /// program image `image` (`discover::image_id`) once its thread is
    /// stopped: a process that called `execve` between the caller's check
    /// and the attach is [`SkipReason::ImageChanged`], and nothing runs in
    /// the new image. (After the stop, an `execve` by another thread kills
    /// the stopped one: the calls then cannot run either.)
    pub fn run_as(
        &mut self,
        pid: u32,
        image: u64,
        calls: &[Syscall],
    ) -> Result<Outcome, InjectError> {
        self.submit(pid, None, Some(image), calls)
    }

    /// Like [`run`](Self::run), but stops thread `tid` of `pid` whatever its
    /// state (the caller takes the EINTR and `D`-state risks).
    pub fn run_on_thread(
        &mut self,
        pid: u32,
        tid: u32,
        calls: &[Syscall],
    ) -> Result<Outcome, InjectError> {
        self.submit(pid, Some(tid), None, calls)
    }

    fn submit(
        &mut self,
        pid: u32,
        tid: Option<u32>,
        image: Option<u64>,
        calls: &[Syscall],
    ) -> Result<Outcome, InjectError> {
        if !cfg!(target_arch = "x86_64") {
            return Err(InjectError::Unsupported);
        }
        for (index, c) in calls.iter().enumerate() {
            c.validate(index)
                .map_err(|reason| InjectError::InvalidCall { index, reason })?;
        }
        if pid == crate::own_pid() {
            return Ok(self.count(Outcome::Skipped(SkipReason::OwnProcess)));
        }
        if calls.is_empty() {
            return Ok(Outcome::Done(Injection::default()));
        }
        let worker = match &mut self.worker {
            Some(w) => w,
            None => self.worker.insert(
                Worker::spawn().map_err(|e| LinuxError::io("starting the tracer thread", e))?,
            ),
        };
        let job = Job {
            pid,
            tid,
            image,
            calls: calls.to_vec(),
            config: self.config,
        };
        if worker.jobs.send(job).is_err() {
            self.worker = None;
            return Err(InjectError::Unexpected {
                pid,
                what: "the tracer thread has died".into(),
            });
        }
        // The tracer's own bounds plus slack: the stop, then each call.
        let bound = self.config.stop_timeout * 2
            + self.config.syscall_timeout * (calls.len() as u32 + 1)
            + Duration::from_secs(1);
        match worker.replies.recv_timeout(bound) {
            Ok(reply) => {
                if reply.exiting {
                    self.worker.take().expect("present").retire();
                }
                reply.result.map(|o| self.count(o))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                // Leave it to finish in the background; start afresh.
                self.worker = None;
                self.stats.stuck += 1;
                Err(InjectError::Stuck { pid, waited: bound })
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // It panicked: its exit released its tracee (which restores
                // itself, see the module header); wait until the kernel has
                // let go of it, so that the next attach finds it free.
                if let Some(w) = self.worker.take() {
                    w.retire();
                }
                Err(InjectError::Unexpected {
                    pid,
                    what: "the tracer thread has died".into(),
                })
            }
        }
    }

    fn count(&mut self, o: Outcome) -> Outcome {
        let s = &mut self.stats;
        match &o {
            Outcome::Done(i) => {
                s.done += 1;
                s.syscalls += i.results.len() as u64;
                s.signals_redelivered += i.signals_redelivered as u64;
                s.eintr_caused += i.app_sees_eintr as u64;
                s.vma_delta += i.vma_delta().unwrap_or(0);
            }
            Outcome::Skipped(SkipReason::SyscallTimeout { completed }) => {
                s.skipped += 1;
                s.syscalls += completed.len() as u64;
            }
            Outcome::Skipped(_) => s.skipped += 1,
            Outcome::Gone(g) => {
                s.gone += 1;
                s.gone_attached += g.attached as u64;
                s.syscalls += g.completed.len() as u64;
            }
        }
        o
    }
}

impl Drop for Injector {
    fn drop(&mut self) {
        if let Some(w) = self.worker.take() {
            drop(w.jobs);
            // The tracer is idle (every run waited for its reply), so it
            // exits at once.
            let _ = w.handle.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_process_is_skipped() {
        let mut inj = Injector::new(InjectConfig::default());
        let o = inj.run(std::process::id(), &[Syscall::Getpid]).unwrap();
        assert_eq!(o, Outcome::Skipped(SkipReason::OwnProcess));
        assert_eq!(inj.stats().skipped, 1);
    }
}
