//! Per-page write tracking in other processes, with userfaultfd
//! write-protect in *async* mode (6.7+) and `PAGEMAP_SCAN`.
//!
//! This machine's stock kernel has neither soft-dirty nor idle-page
//! tracking (`CONFIG_MEM_SOFT_DIRTY`, `CONFIG_IDLE_PAGE_TRACKING` off), so
//! the only way to know that a candidate page was written *before* it is
//! merged (UKSM's COW-broken ratio, §8.1.2 of the paper, without inducing
//! COW breaks) is to write-protect it and watch.
//!
//! ## How, before the code
//!
//! 1. **Register, inside the target** (one attach, batched, by
//!    [`Injector`]): `userfaultfd(O_CLOEXEC | O_NONBLOCK |
//!    UFFD_USER_MODE_ONLY)`, `ioctl(UFFDIO_API)` asking for `WP_ASYNC |
//!    WP_UNPOPULATED`, then one `ioctl(UFFDIO_REGISTER, MODE_WP)` per range.
//!    A registration belongs to the `mm` of the process that made it, so
//!    the target has to make it; the structs go into scratch memory below
//!    its stack red zone (see [`inject`](crate::inject)). `-EBUSY` means the
//!    range already has a userfaultfd of the application's own: that range
//!    is skipped, with the reason.
//! 2. **Keep a reference** with `pidfd_getfd`: the daemon holds a duplicate
//!    of the target's descriptor. It is used to prove, with
//!    `kcmp(KCMP_FILE)`, that descriptor number N in the target is still our
//!    file before anything is done to it (the application may close it and
//!    reuse the number), and if the application closes its copy the
//!    registration lives on until we drop ours.
//! 3. **Arm and query** from the daemon, without stopping the target:
//!    `PAGEMAP_SCAN` with `PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC` on
//!    `/proc/PID/pagemap` reports the pages written since they were last
//!    protected and protects them again (6 ns/page, measured). The first scan
//!    after registering arms the whole range (`WP_UNPOPULATED` covers pages
//!    never touched). In async mode the kernel resolves the target's write
//!    fault itself (it clears the bit; about 1 µs per first write, measured):
//!    nobody reads the fd, so no fault can ever wait for us.
//! 4. **Unregister** (one attach): `UFFDIO_UNREGISTER` for the ranges, and
//!    when none is left, `close(fd)`, after the `kcmp` check and run only
//!    if `UFFDIO_WAKE` succeeded in the same attach (so only on a
//!    userfaultfd; an unregister is no such proof, as it fails for a range
//!    the process has unmapped since: [`close_calls`]). A target that is
//!    gone, or whose descriptor is no longer ours, is just forgotten:
//!    dropping our duplicate then ends any registration left. An attach
//!    that does not run forgets nothing: it is tried again.
//!
//! Invariant: a descriptor opened in a target that is not known to be
//! closed stays in [`WriteTracker`]'s table, with the ranges still
//! registered with it, so that `untrack`, `untrack_all` and the crash
//! ledger reach it, including one opened by a batch the injector
//! abandoned part-way (a call that could not start in time: the target
//! froze), with the ranges that batch registered; if the batch stopped
//! before the handshake, pagesift does it on its duplicate
//! ([`sys::uffd_api`]). The exceptions: a target that is gone, and a
//! descriptor whose close did not run and of which no duplicate could be
//! taken (`pidfd_getfd` failed), or whose handshake ran and failed in a cut
//! batch, which stays in the target until it exits.
//!
//! If the daemon dies without unregistering, the target keeps an idle fd
//! and an async registration whose only effect is the 1 µs first-write
//! cost, until the next daemon starts: it finds the registration in the
//! crash ledger the dead one kept (`pagesift_daemon::ledger`) and undoes
//! it.
//! A child forked by the target does not inherit it (no `EVENT_FORK`).

use crate::discover;
use crate::error::LinuxError;
use crate::inject::{Fd, InjectError, Injector, Outcome, SkipReason, Syscall, uffd_abi};
use crate::sys::{self, PageRegion};
use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

/// `EBUSY`: the range is registered with another userfaultfd.
const EBUSY: i64 = 16;
/// `EINVAL` and `ENOMEM`: what `UFFDIO_REGISTER` answers for a range that
/// is not (wholly) mapped, among other refusals.
const EINVAL: i64 = 22;
const ENOMEM: i64 = 12;

/// What [`WriteTracker::track`] did for one process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TrackOutcome {
    /// `registered`: these ranges are now tracked (newly registered ones).
    /// `unmapped`: ranges the process unmapped, in whole or in part,
    /// before they could be registered. Not a refusal: memory that
    /// changes while the daemon decides (a short-lived region) loses its
    /// registration, not the process's write tracking.
    Tracking {
        registered: Vec<(u64, u64)>,
        unmapped: Vec<(u64, u64)>,
    },
    /// Nothing was registered, and a range was refused for a reason of
    /// the process (it uses userfaultfd itself, or the kernel said no to
    /// a mapped range); why (the process was not harmed).
    Skipped(String),
    /// The process exited.
    Gone,
}

#[derive(Debug)]
struct Tracked {
    /// The userfaultfd's number in the target.
    fd: i32,
    /// Our duplicate of it (`pidfd_getfd`).
    dup: OwnedFd,
    pagemap: File,
    ranges: Vec<(u64, u64)>,
}

impl Tracked {
    fn new(fd: i32, dup: OwnedFd, pagemap: File, ranges: Vec<(u64, u64)>) -> Tracked {
        Tracked {
            fd,
            dup,
            pagemap,
            ranges,
        }
    }
}

/// Write tracking of ranges in other processes (see the module header).
#[derive(Debug, Default)]
pub struct WriteTracker {
    procs: HashMap<u32, Tracked>,
    buf: Vec<PageRegion>,
}

fn errno_text(r: i64) -> String {
    std::io::Error::from_raw_os_error(-r as i32).to_string()
}

impl WriteTracker {
    /// An empty tracker.
    pub fn new() -> WriteTracker {
        WriteTracker::default()
    }

    /// How many ranges are tracked, over all processes.
    pub fn tracked_ranges(&self) -> usize {
        self.procs.values().map(|t| t.ranges.len()).sum()
    }

    /// How many processes have tracked ranges.
    pub fn tracked_processes(&self) -> usize {
        self.procs.len()
    }

    /// The processes with tracked ranges.
    pub fn pids(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.procs.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// The tracked ranges of `pid`.
    pub fn ranges(&self, pid: u32) -> &[(u64, u64)] {
        self.procs.get(&pid).map_or(&[], |t| &t.ranges)
    }

    /// The target's descriptor number of `pid`'s userfaultfd, if tracked.
    pub fn target_fd(&self, pid: u32) -> Option<i32> {
        self.procs.get(&pid).map(|t| t.fd)
    }

    /// Whether `[start, end)` of `pid` is tracked (inside one range).
    pub fn covers(&self, pid: u32, start: u64, end: u64) -> bool {
        self.ranges(pid)
            .iter()
            .any(|&(s, e)| s <= start && end <= e)
    }

    /// Whether descriptor `fd` of `pid` is still the file we hold.
    fn still_ours(pid: u32, t: &Tracked) -> bool {
        sys::same_file(pid, t.fd, crate::own_pid(), t.dup.as_raw_fd()).unwrap_or(false)
    }

    /// Whether the next [`track`](Self::track) of `pid` opens a descriptor
    /// in it: none is known, or the one known is no longer ours (the
    /// process exec'd or closed it).
    pub fn opens_descriptor(&self, pid: u32) -> bool {
        self.procs
            .get(&pid)
            .is_none_or(|t| !Self::still_ours(pid, t))
    }

    /// Registers `ranges` (page-aligned `[start, end)`, not yet tracked) of
    /// `pid` for write tracking in one attach and arms them.
    pub fn track(
        &mut self,
        inj: &mut Injector,
        pid: u32,
        ranges: &[(u64, u64)],
    ) -> Result<TrackOutcome, InjectError> {
        let ranges: Vec<(u64, u64)> = ranges
            .iter()
            .copied()
            .filter(|&(s, e)| e > s && !self.covers(pid, s, e))
            .collect();
        if ranges.is_empty() {
            return Ok(TrackOutcome::Tracking {
                registered: vec![],
                unmapped: vec![],
            });
        }
        if let Some(t) = self.procs.get(&pid)
            && !Self::still_ours(pid, t)
        {
            // Gone, exec'd or closed our fd: start afresh.
            self.procs.remove(&pid);
        }
        let existing = self.procs.get(&pid).map(|t| t.fd);
        let fd = match existing {
            Some(n) => Fd::Number(n),
            None => Fd::ResultOf(0),
        };
        let mut calls = Vec::new();
        if existing.is_none() {
            calls.push(Syscall::Userfaultfd);
            calls.push(Syscall::UffdApi {
                fd,
                features: TRACK_FEATURES,
            });
        }
        let first = calls.len();
        for &(s, e) in &ranges {
            calls.push(Syscall::UffdRegister {
                fd,
                addr: s,
                len: e - s,
                mode: uffd_abi::MODE_WP,
            });
        }
        let pagemap = match File::open(format!("/proc/{pid}/pagemap")) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(TrackOutcome::Gone),
            Err(e) => {
                return Err(LinuxError::io("opening /proc/PID/pagemap", e).into());
            }
        };
        let done = match inj.run(pid, &calls)? {
            Outcome::Done(d) => d,
            Outcome::Skipped(why) => {
                // A batch the injector abandoned part-way (a call could not
                // start in time) may have opened the descriptor and
                // registered ranges: they are kept known, to be closed
                // like any other, not left in the target.
                if let SkipReason::SyscallTimeout { completed } = &why {
                    self.keep_cut(pid, existing, completed, first, &ranges, pagemap);
                }
                return Ok(TrackOutcome::Skipped(why.to_string()));
            }
            Outcome::Gone(_) => {
                self.procs.remove(&pid);
                return Ok(TrackOutcome::Gone);
            }
        };
        let r = &done.results;
        let target_fd = match existing {
            Some(n) => n,
            None if r[0] < 0 => {
                return Ok(TrackOutcome::Skipped(format!(
                    "userfaultfd: {}",
                    errno_text(r[0])
                )));
            }
            None => r[0] as i32,
        };
        let registered: Vec<(u64, u64)> = ranges
            .iter()
            .zip(&r[first..])
            .filter(|(_, res)| **res >= 0)
            .map(|(range, _)| *range)
            .collect();
        // A failed range that is no longer mapped was unmapped after it
        // was chosen: the maps say so (read only when a register failed).
        let (mut unmapped, mut refused) = (Vec::new(), Vec::new());
        for (&range, &res) in ranges.iter().zip(&r[first..]) {
            if res >= 0 {
                continue;
            }
            if matches!(-res, EINVAL | ENOMEM) && !discover::range_mapped(pid, range.0, range.1) {
                unmapped.push(range);
            } else {
                refused.push(res);
            }
        }
        let why_not = refused.first().map(|&res| match -res {
            EBUSY => "the range already uses userfaultfd".to_string(),
            _ => format!("UFFDIO_REGISTER: {}", errno_text(res)),
        });
        if existing.is_none() {
            let api_failed = r[1] < 0;
            let dup = if api_failed || registered.is_empty() {
                None
            } else {
                dup_fd(pid, target_fd).ok()
            };
            let Some(dup) = dup else {
                // Nothing to keep: close the fd we just opened. Once its
                // API handshake succeeded, the close runs in one stop after
                // `close_calls`' proof that the number is still that
                // userfaultfd (the target may have closed it and opened a
                // file of its own under the number since the first stop).
                // A userfaultfd whose handshake failed answers no other
                // ioctl, so it has only the fd link's word.
                let calls = if api_failed {
                    if fd_is_userfaultfd(pid, target_fd) {
                        vec![Syscall::Close(Fd::Number(target_fd))]
                    } else {
                        vec![]
                    }
                } else {
                    close_calls(target_fd, &registered)
                };
                let closed = calls.is_empty()
                    || matches!(
                        inj.run(pid, &calls),
                        Ok(Outcome::Done(_)) | Ok(Outcome::Gone(_))
                    );
                // A close that did not run (the attach was skipped or
                // failed) leaves the descriptor known, to be closed later
                // like any other (`untrack`, the crash ledger), not lost.
                if !closed
                    && fd_is_userfaultfd(pid, target_fd)
                    && let Ok(dup) = dup_fd(pid, target_fd)
                {
                    self.procs.insert(
                        pid,
                        Tracked::new(target_fd, dup, pagemap, registered.clone()),
                    );
                }
                let why = if api_failed {
                    format!("UFFDIO_API: {}", errno_text(r[1]))
                } else if registered.is_empty() && refused.is_empty() {
                    // Every range had gone: nothing refused.
                    return Ok(TrackOutcome::Tracking {
                        registered,
                        unmapped,
                    });
                } else {
                    why_not.unwrap_or_else(|| "pidfd_getfd failed".into())
                };
                return Ok(TrackOutcome::Skipped(why));
            };
            (self.procs).insert(pid, Tracked::new(target_fd, dup, pagemap, vec![]));
        } else if registered.is_empty() {
            return Ok(match why_not {
                Some(why) => TrackOutcome::Skipped(why),
                None => TrackOutcome::Tracking {
                    registered,
                    unmapped,
                },
            });
        }
        // Arm: the first scan reports every page as written and protects it.
        for &(s, e) in &registered {
            let _ = self.scan(pid, s, e);
        }
        let t = self.procs.get_mut(&pid).expect("inserted above");
        t.ranges.extend_from_slice(&registered);
        Ok(TrackOutcome::Tracking {
            registered,
            unmapped,
        })
    }

    /// The runs of pages of `[start, end)` of `pid` written since they were
    /// last reported (or armed), re-arming them. `None` if the range is not
    /// tracked or the process is gone.
    pub fn written(&mut self, pid: u32, start: u64, end: u64) -> Option<Vec<(u64, u64)>> {
        if !self.covers(pid, start, end) {
            return None;
        }
        self.scan(pid, start, end).ok()
    }

    /// Pages written in `[start, end)` of `pid` since last reported: the
    /// count of [`written`](Self::written).
    pub fn written_pages(&mut self, pid: u32, start: u64, end: u64) -> Option<u64> {
        let runs = self.written(pid, start, end)?;
        Some(runs.iter().map(|(s, e)| (e - s) / crate::PAGE_SIZE).sum())
    }

    /// Whether the page at `addr` of `pid` was written since it was last
    /// asked about (or armed); re-arms it. `None` if it is not tracked.
    pub fn take_written(&mut self, pid: u32, addr: u64) -> Option<bool> {
        let page = addr & !(crate::PAGE_SIZE - 1);
        self.written(pid, page, page + crate::PAGE_SIZE)
            .map(|runs| !runs.is_empty())
    }

    fn scan(&mut self, pid: u32, start: u64, end: u64) -> std::io::Result<Vec<(u64, u64)>> {
        let t = self
            .procs
            .get(&pid)
            .ok_or_else(|| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        if self.buf.is_empty() {
            self.buf = vec![PageRegion::default(); 512];
        }
        let mut out = Vec::new();
        let mut at = start;
        // The walk stops early when `buf` fills: go on from `walk_end`.
        while at < end {
            let (n, walk_end) =
                sys::pagemap_scan_written(t.pagemap.as_fd(), at, end, &mut self.buf)?;
            out.extend(self.buf[..n].iter().map(|r| (r.start, r.end)));
            if walk_end <= at {
                break;
            }
            at = walk_end;
        }
        Ok(out)
    }

    /// Stops tracking `ranges` of `pid` (exactly as tracked): one attach
    /// that unregisters them and, when none is left, closes the target's
    /// userfaultfd. A process that is gone or whose descriptor is no longer
    /// ours is forgotten without an attach. An attach that does not run
    /// (skipped, or an error) changes nothing here: the ranges stay
    /// tracked and the descriptor known, so that the next call, the next
    /// daemon's crash ledger or [`untrack_all`](Self::untrack_all) at exit
    /// takes them out; forgotten first, they stayed in the target for
    /// good (seen once by hand, 2026-12-04: a userfaultfd left in a
    /// short-lived workload after the daemon had exited).
    pub fn untrack(
        &mut self,
        inj: &mut Injector,
        pid: u32,
        ranges: &[(u64, u64)],
    ) -> Result<Outcome, InjectError> {
        let Some(t) = self.procs.get(&pid) else {
            return Ok(Outcome::Gone(crate::inject::Gone {
                attached: false,
                completed: vec![],
            }));
        };
        if !Self::still_ours(pid, t) {
            self.procs.remove(&pid);
            return Ok(Outcome::Gone(crate::inject::Gone {
                attached: false,
                completed: vec![],
            }));
        }
        let drop_ranges: Vec<(u64, u64)> = t
            .ranges
            .iter()
            .copied()
            .filter(|r| ranges.contains(r))
            .collect();
        let last = t.ranges.len() == drop_ranges.len();
        let fd = t.fd;
        // The last range out closes the descriptor too, once proved a
        // userfaultfd in the attach itself (the kcmp check above was made
        // before the target stopped).
        let calls = if last {
            close_calls(fd, &drop_ranges)
        } else {
            unregister_calls(fd, &drop_ranges)
        };
        if calls.is_empty() {
            return Ok(Outcome::Done(crate::inject::Injection::default()));
        }
        let out = inj.run(pid, &calls)?;
        match &out {
            Outcome::Done(_) if last => {
                self.procs.remove(&pid);
            }
            Outcome::Done(_) => {
                if let Some(t) = self.procs.get_mut(&pid) {
                    t.ranges.retain(|r| !drop_ranges.contains(r));
                }
            }
            Outcome::Gone(_) => {
                self.procs.remove(&pid);
            }
            Outcome::Skipped(_) => {}
        }
        Ok(out)
    }

    /// Records what a cut batch of [`track`](Self::track) did: the
    /// descriptor it opened (`completed[0]`, when there was none:
    /// `existing` is `None`) if it is still that userfaultfd, and the
    /// ranges whose registration completed (`completed[first..]`).
    fn keep_cut(
        &mut self,
        pid: u32,
        existing: Option<i32>,
        completed: &[i64],
        first: usize,
        ranges: &[(u64, u64)],
        pagemap: File,
    ) {
        let registered: Vec<(u64, u64)> = (ranges.iter())
            .zip(completed.iter().skip(first))
            .filter(|(_, r)| **r >= 0)
            .map(|(range, _)| *range)
            .collect();
        match existing {
            Some(_) => {
                if let Some(t) = self.procs.get_mut(&pid) {
                    t.ranges.extend(registered);
                }
            }
            None => {
                let Some(&fd) = completed.first().filter(|&&fd| fd >= 0) else {
                    return;
                };
                let fd = fd as i32;
                if !fd_is_userfaultfd(pid, fd) {
                    return;
                }
                let Ok(dup) = dup_fd(pid, fd) else {
                    return;
                };
                // Cut before its handshake ran: done here, on the
                // duplicate (the same open file), so that the close's proof
                // (`UFFDIO_WAKE`) works on it as on any other. A handshake
                // that ran and failed leaves a descriptor no ioctl
                // answers: the module header's exception.
                let handshaken = match completed.get(1) {
                    Some(&r) => r >= 0,
                    None => sys::uffd_api(dup.as_fd(), TRACK_FEATURES).is_ok(),
                };
                if handshaken {
                    self.procs
                        .insert(pid, Tracked::new(fd, dup, pagemap, registered));
                }
            }
        }
    }

    /// Stops tracking everything of `pid`.
    pub fn untrack_process(
        &mut self,
        inj: &mut Injector,
        pid: u32,
    ) -> Result<Outcome, InjectError> {
        let ranges = self.ranges(pid).to_vec();
        self.untrack(inj, pid, &ranges)
    }

    /// Stops tracking everything. Errors are per process and ignored: a
    /// process that cannot be attached now stays listed (its registration
    /// and descriptor, for the crash ledger, whose next reader takes them
    /// out) and keeps an idle async registration meanwhile, which cannot
    /// block it.
    pub fn untrack_all(&mut self, inj: &mut Injector) {
        let pids: Vec<u32> = self.procs.keys().copied().collect();
        for pid in pids {
            let _ = self.untrack_process(inj, pid);
        }
    }

    /// Forgets `pid` without touching it (it exited): drops our duplicate.
    pub fn forget(&mut self, pid: u32) {
        self.procs.remove(&pid);
    }
}

/// Our duplicate of descriptor `fd` of `pid` (`pidfd_open` + `pidfd_getfd`;
/// needs ptrace attach access, which the injection already proved).
fn dup_fd(pid: u32, fd: i32) -> std::io::Result<OwnedFd> {
    use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let p = Pid::from_raw(pid as i32).ok_or_else(|| std::io::Error::other("pid 0"))?;
    let pidfd = pidfd_open(p, PidfdFlags::empty())?;
    Ok(pidfd_getfd(pidfd.as_fd(), fd, PidfdGetfdFlags::empty())?)
}

/// The features write tracking asks for in its handshake: the kernel
/// resolves write-protect faults itself, and untouched pages are armed too.
const TRACK_FEATURES: u64 = uffd_abi::FEATURE_WP_ASYNC | uffd_abi::FEATURE_WP_UNPOPULATED;

/// Whether descriptor `fd` of `pid` is a userfaultfd (its `/proc` link).
pub fn fd_is_userfaultfd(pid: u32, fd: i32) -> bool {
    std::fs::read_link(format!("/proc/{pid}/fd/{fd}"))
        .is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]")
}

/// A range for [`close_calls`]' proof when no range is given: page-aligned
/// user space above any `mmap_min_addr`, mapped or not.
const PROOF_RANGE: (u64, u64) = (1 << 30, crate::PAGE_SIZE);

/// The calls that end write tracking in a target: unregister `ranges` of
/// descriptor `fd`, prove `fd` a userfaultfd with `UFFDIO_WAKE` (which
/// succeeds whether or not the ranges are still mapped, and wakes nobody:
/// see [`Syscall::UffdWake`]), and close it only then. The close used to
/// wait for the last unregister instead, which fails (EINVAL) for a range
/// the process has unmapped since: the descriptor then stayed open in the
/// target after pagesift had forgotten it (seen by hand, 2026-12-04, in a
/// short-lived workload after the daemon exited).
pub fn close_calls(fd: i32, ranges: &[(u64, u64)]) -> Vec<Syscall> {
    let mut calls = unregister_calls(fd, ranges);
    let (addr, len) = ranges.first().map_or(PROOF_RANGE, |&(s, e)| (s, e - s));
    calls.push(Syscall::UffdWake {
        fd: Fd::Number(fd),
        addr,
        len,
    });
    calls.push(Syscall::Close(Fd::NumberIfOk(fd, calls.len() - 1)));
    calls
}

/// `UFFDIO_UNREGISTER` of each of `ranges` with descriptor `fd`.
fn unregister_calls(fd: i32, ranges: &[(u64, u64)]) -> Vec<Syscall> {
    ranges
        .iter()
        .map(|&(s, e)| Syscall::UffdUnregister {
            fd: Fd::Number(fd),
            addr: s,
            len: e - s,
        })
        .collect()
}

/// The numbers of the userfaultfd descriptors `pid` has open (its
/// `/proc/PID/fd` links), in no particular order; none if it is gone.
pub fn userfaultfds(pid: u32) -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return vec![];
    };
    dir.flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.as_os_str() == "anon_inode:[userfaultfd]")
        })
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect()
}

/// How many userfaultfd descriptors `pid` has open.
pub fn count_userfaultfds(pid: u32) -> usize {
    userfaultfds(pid).len()
}

/// The features userfaultfd `fd` of `pid` was handshaken with (its
/// `/proc/PID/fdinfo/FD` line `API:\tAA:FEATURES:IOCTLS`; 0 before its
/// `UFFDIO_API`), or `None` if it is not a userfaultfd.
fn features(pid: u32, fd: i32) -> Option<u64> {
    if !fd_is_userfaultfd(pid, fd) {
        return None;
    }
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    info.lines()
        .filter_map(|l| l.strip_prefix("API:"))
        .filter_map(|v| v.trim().split(':').nth(1))
        .find_map(|f| u64::from_str_radix(f, 16).ok())
}

/// Whether descriptor `fd` of `pid` is a userfaultfd whose handshake asked
/// for the features write tracking asks for: one of ours, or an
/// application's with the same features.
pub fn has_tracking_features(pid: u32, fd: i32) -> bool {
    features(pid, fd).is_some_and(|f| f & TRACK_FEATURES == TRACK_FEATURES)
}

/// For the crash ledger's recovery: userfaultfd `fd` of `pid`, which a
/// write-tracking batch opened, made ready for [`close_calls`]. A batch
/// cut (its daemon killed) between the `userfaultfd()` and its handshake
/// left a descriptor that answers no ioctl but `UFFDIO_API`, so the
/// close's proof would fail: the handshake is done here, on a duplicate
/// (the same open file). Returns whether `fd` now has the tracking
/// features.
pub fn ready_to_close(pid: u32, fd: i32) -> bool {
    match features(pid, fd) {
        Some(0) => {
            dup_fd(pid, fd).is_ok_and(|dup| sys::uffd_api(dup.as_fd(), TRACK_FEATURES).is_ok())
        }
        Some(f) => f & TRACK_FEATURES == TRACK_FEATURES,
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn untracked_pages_say_nothing() {
        let mut t = WriteTracker::new();
        assert_eq!(t.take_written(1, 0x1000), None);
        assert_eq!(t.written_pages(1, 0x1000, 0x3000), None);
        assert_eq!(t.tracked_ranges(), 0);
        assert!(!fd_is_userfaultfd(std::process::id(), 0));
        assert_eq!(count_userfaultfds(std::process::id()), 0);
    }
}
