//! Watching the loop for wake-ups that take too long.
//!
//! A wake-up normally takes milliseconds. One that takes seconds is stuck
//! on something outside pagesift: a target's mmap lock, a stop that a
//! thread does not reach, a read that a page fault holds up. Once, in a
//! bench run, the loop stalled for 26 s inside one wake-up and nothing said
//! where. So the loop publishes which phase it is in ([`WakeWatch`]), and a
//! thread of its own ([`Watchdog`]) reports a wake-up that has run longer
//! than a threshold, with its phase, then again at an interval while it
//! lasts.
//!
//! The thread does not poll. It looks, then sleeps until the earliest
//! moment a report could be due: the running wake-up's threshold (or its
//! next interval) if one runs, else one threshold from now, since a
//! wake-up that starts after the look cannot be due before then. A report
//! therefore comes on time, and between long wake-ups the thread wakes
//! about once per threshold (5 s) instead of four times a second (polling
//! was 7 % of the daemon's CPU beside a short-lived workload, by a perf
//! profile).
//!
//! Invariants: the watch is written only by the loop (begin, enter, end)
//! and read only by the watchdog; a wake-up is reported at most once per
//! interval, never after it ended.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What the loop is doing, shared with the watchdog.
#[derive(Clone, Debug)]
pub struct WakeWatch(Arc<State>);

#[derive(Debug)]
struct State {
    epoch: Instant,
    /// Start of the running wake-up, µs after `epoch`, plus one; 0 between
    /// wake-ups.
    started: AtomicU64,
    /// Index of the running phase in the names the watchdog was given.
    phase: AtomicUsize,
}

impl Default for WakeWatch {
    fn default() -> Self {
        WakeWatch::new()
    }
}

impl WakeWatch {
    /// A watch between wake-ups.
    pub fn new() -> WakeWatch {
        WakeWatch(Arc::new(State {
            epoch: Instant::now(),
            started: AtomicU64::new(0),
            phase: AtomicUsize::new(0),
        }))
    }

    /// A wake-up starts, in phase 0.
    pub fn begin(&self) {
        let us = self.0.epoch.elapsed().as_micros() as u64 + 1;
        self.0.phase.store(0, Ordering::Relaxed);
        self.0.started.store(us, Ordering::Release);
    }

    /// The wake-up moves on to phase `phase`.
    pub fn enter(&self, phase: usize) {
        self.0.phase.store(phase, Ordering::Relaxed);
    }

    /// The wake-up ended.
    pub fn end(&self) {
        self.0.started.store(0, Ordering::Release);
    }

    /// The running wake-up: its start (to tell one wake-up from the next),
    /// its phase, and how long it has run.
    fn running(&self) -> Option<(u64, usize, Duration)> {
        let started = self.0.started.load(Ordering::Acquire);
        if started == 0 {
            return None;
        }
        let now = self.0.epoch.elapsed().as_micros() as u64 + 1;
        let phase = self.0.phase.load(Ordering::Relaxed);
        Some((
            started,
            phase,
            Duration::from_micros(now.saturating_sub(started)),
        ))
    }
}

/// The watchdog thread; stopped (unparked) and joined on drop.
pub struct Watchdog {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// When the watchdog speaks.
#[derive(Clone, Copy, Debug)]
pub struct WatchdogTimes {
    /// A wake-up running this long is reported.
    pub after: Duration,
    /// Then again this often while it runs.
    pub every: Duration,
}

impl Default for WatchdogTimes {
    fn default() -> Self {
        WatchdogTimes {
            after: Duration::from_secs(5),
            every: Duration::from_secs(10),
        }
    }
}

impl Watchdog {
    /// Starts watching `watch`, whose phase indices name `phases`; calls
    /// `report(phase, running_for)` for a long wake-up.
    pub fn spawn(
        watch: WakeWatch,
        phases: &'static [&'static str],
        times: WatchdogTimes,
        report: impl Fn(&'static str, Duration) + Send + 'static,
    ) -> std::io::Result<Watchdog> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("pagesift-watchdog".into())
            .spawn(move || {
                // (wake-up start, when it was last reported)
                let mut last: Option<(u64, Duration)> = None;
                while !flag.load(Ordering::Relaxed) {
                    let wait = match watch.running() {
                        None => times.after,
                        Some((started, phase, ran)) => {
                            let due_at = match last {
                                Some((s, at)) if s == started => at + times.every,
                                _ => times.after,
                            };
                            if ran >= due_at {
                                report(phases.get(phase).copied().unwrap_or("?"), ran);
                                last = Some((started, ran));
                                times.every
                            } else {
                                due_at - ran
                            }
                        }
                    };
                    // Woken early only by `drop` (or spuriously: then it
                    // just looks again).
                    std::thread::park_timeout(wait);
                }
            })?;
        Ok(Watchdog {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    const NAMES: &[&str] = &["refresh", "distil", "sweep"];

    fn times() -> WatchdogTimes {
        WatchdogTimes {
            after: Duration::from_millis(60),
            every: Duration::from_millis(150),
        }
    }

    #[test]
    fn a_long_wake_up_is_reported_with_its_phase_and_a_short_one_is_not() {
        let watch = WakeWatch::new();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let dog = Watchdog::spawn(watch.clone(), NAMES, times(), move |p, d| {
            s.lock().unwrap().push((p, d));
        })
        .unwrap();
        // Short wake-ups: nothing.
        for _ in 0..5 {
            watch.begin();
            watch.enter(1);
            std::thread::sleep(Duration::from_millis(10));
            watch.end();
        }
        assert!(seen.lock().unwrap().is_empty());
        // A long one, stuck in phase 2: reported once past 60 ms, again
        // 150 ms later, and not after it ended.
        watch.begin();
        watch.enter(2);
        std::thread::sleep(Duration::from_millis(260));
        watch.end();
        std::thread::sleep(Duration::from_millis(200));
        drop(dog);
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 2, "{seen:?}");
        assert!(seen.iter().all(|(p, _)| *p == "sweep"));
        assert!(seen[0].1 >= Duration::from_millis(60));
        assert!(seen[1].1 >= seen[0].1 + Duration::from_millis(150));
    }
}
