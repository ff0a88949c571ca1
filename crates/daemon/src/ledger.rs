//! The crash ledger: what pagesift has left inside other processes, kept on
//! disk so that a daemon started after a crash (SIGKILL, the OOM killer, a
//! systemd stop timeout) can take it away.
//!
//! - **What.** The ranges pagesift marked `MADV_MERGEABLE`, per process
//!   identity (pid, start time, program image), and its userfaultfd
//!   registrations (the descriptor's number in the target and its ranges).
//!   KSM's knobs are not here: the KSM lock file holds the values to put
//!   back, and the next owner of KSM restores them.
//! - **When.** Rewritten after every wake-up in which either changed, and
//!   removed on a clean stop (after the stop has undone what it undoes).
//!   Marks are also written *ahead* ([`SharedLedger`], the daemon's
//!   [`Journal`]): before a batch that marks ranges is injected, the
//!   ledger is rewritten with them (and with every range written ahead
//!   since the last save: a wake-up marks in several processes, one batch
//!   each), so that a daemon killed between the mark and the end of its
//!   wake-up still leaves them recorded. A range
//!   written ahead whose mark then failed is dropped at the next save;
//!   until then, recovery would unmark a range that was never marked,
//!   which changes nothing in the process. A write-tracking batch that may
//!   open a userfaultfd in a process is written ahead too
//!   ([`OPENING`]: the descriptor's number is known only once the batch
//!   has run), with the userfaultfds the process had before it.
//!   Atomically: a temporary file in the same directory, then `rename`.
//!   No `fsync`: the ledger has to outlive the daemon, not the kernel (the
//!   page cache keeps it through any death of ours), and after a crash of
//!   the machine the processes it lists are gone too. An `fsync` per save
//!   cost about 2 ms of the daemon's 55 in an 8 s `short-lived` window on
//!   the development machine, whose `/run` is ext4, not tmpfs (`perf
//!   record` at 20 kHz, 2026-11-27: `do_fsync` in 3.9 % of 1 096 samples).
//! - **Where.** [`LEDGER_PATH`] (tmpfs: a reboot rightly forgets it), in a
//!   directory of mode 0700, the file 0600, both root's. Daemons take the KSM
//!   lock before they touch it, so one writes it at a time.
//! - **Trust.** Read only if it is a regular file (not a link) owned by the
//!   daemon's user and writable by nobody else; otherwise refused with the
//!   path and the reason (and left alone).
//! - **Recovery** ([`recover`]), at start, before anything is marked: for
//!   each process that is still the same one, its marked ranges are unmarked
//!   (`MADV_UNMERGEABLE`, which unmerges their pages) and each registration
//!   undone (`UFFDIO_UNREGISTER` of its ranges, then `close` of the
//!   descriptor, only if it is still a userfaultfd with pagesift's features
//!   and the unregister succeeded). An entry written ahead of a
//!   descriptor's opening closes every userfaultfd of the process that is
//!   new since and has pagesift's features or none yet
//!   ([`descriptors_to_close`]). The daemon then starts afresh: what it
//!   marks again is its own, so `unmerge_on_exit` covers it.

use crate::actuate::{Journal, Marks, ProcKey};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Where the ledger lives.
pub const LEDGER_PATH: &str = "/run/pagesift/ledger";

/// One process's marked ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MarkEntry {
    /// The process.
    pub pid: u32,
    /// Its start time (clock ticks after boot).
    pub start_time: u64,
    /// Its program image (`discover::image_id`).
    pub image: u64,
    /// `[start, end)` ranges.
    pub ranges: Vec<(u64, u64)>,
}

/// One process's userfaultfd registration, or one written ahead of the
/// batch that may open its descriptor ([`OPENING`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct UffdEntry {
    /// The process.
    pub pid: u32,
    /// Its start time.
    pub start_time: u64,
    /// The descriptor's number in the process, or [`OPENING`].
    pub fd: i32,
    /// Registered `[start, end)` ranges (written ahead: to be registered).
    pub ranges: Vec<(u64, u64)>,
    /// Written ahead: the userfaultfd descriptors the process had before
    /// the batch, none of them ours to close.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<i32>,
}

/// [`UffdEntry::fd`] of an entry written ahead of a batch that may open a
/// descriptor in the process: its number is known only once the batch has
/// run. Recovery closes every userfaultfd of the process with pagesift's
/// features that is not in [`UffdEntry::before`] and not recorded under
/// its number.
pub const OPENING: i32 = -1;

/// What the ledger holds.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Marked ranges.
    pub marks: Vec<MarkEntry>,
    /// Userfaultfd registrations.
    pub uffd: Vec<UffdEntry>,
}

impl Record {
    /// Adds every range of `marks`.
    pub fn add_marks(&mut self, marks: &Marks) {
        for key in marks.processes() {
            let ranges = marks.ranges(key);
            if !ranges.is_empty() {
                self.marks.push(entry(key, ranges));
            }
        }
    }

    /// Adds `ranges` of `key` to what is recorded for it.
    pub fn add_ranges(&mut self, key: ProcKey, ranges: &[(u64, u64)]) {
        let same = |m: &&mut MarkEntry| {
            m.pid == key.pid && m.start_time == key.start_time && m.image == key.image
        };
        match self.marks.iter_mut().find(same) {
            Some(m) => m.ranges.extend_from_slice(ranges),
            None => self.marks.push(entry(key, ranges.to_vec())),
        }
    }

    /// Whether nothing is recorded.
    pub fn is_empty(&self) -> bool {
        self.marks.is_empty() && self.uffd.is_empty()
    }
}

fn entry(key: ProcKey, ranges: Vec<(u64, u64)>) -> MarkEntry {
    MarkEntry {
        pid: key.pid,
        start_time: key.start_time,
        image: key.image,
        ranges,
    }
}

/// The ledger file, and the last bytes written to it.
#[derive(Debug)]
pub struct Ledger {
    path: PathBuf,
    last: Option<Vec<u8>>,
    last_key: Option<Vec<u8>>,
    /// The last record given to [`Ledger::save`], plus every range written
    /// ahead since: what the next write-ahead adds to.
    current: Record,
}

impl Ledger {
    /// The ledger at `path` (nothing is written yet).
    pub fn new(path: &Path) -> Ledger {
        Ledger {
            path: path.to_path_buf(),
            last: None,
            last_key: None,
            current: Record::default(),
        }
    }

    /// Whether `rec`, with its userfaultfd start times left out, differs
    /// from what was last given (so that start times are read only then).
    pub fn changed(&mut self, rec: &Record) -> bool {
        let key = serde_json::to_vec(rec).unwrap_or_default();
        if self.last_key.as_deref() == Some(&key[..]) {
            return false;
        }
        self.last_key = Some(key);
        true
    }

    /// Writes `rec` if it differs from what was last written (an empty
    /// record removes the file).
    pub fn save(&mut self, rec: &Record) -> std::io::Result<()> {
        self.current = rec.clone();
        self.write(rec)
    }

    /// Writes the last saved record plus every range written ahead since,
    /// now with `ranges` of `key`: marks about to be made (the module
    /// header, "When"). The next [`Ledger::changed`] says yes, so that the
    /// save after the marks writes what was done.
    pub fn write_ahead(&mut self, key: ProcKey, ranges: &[(u64, u64)]) -> std::io::Result<()> {
        self.current.add_ranges(key, ranges);
        self.last_key = None;
        let rec = self.current.clone();
        self.write(&rec)
    }

    /// Writes the last saved record plus everything written ahead since,
    /// now with `entry` (fd [`OPENING`]): a write-tracking batch that may
    /// open a descriptor in its process is about to run (the module
    /// header, "When").
    pub fn write_ahead_tracking(&mut self, entry: UffdEntry) -> std::io::Result<()> {
        self.current.uffd.push(entry);
        self.last_key = None;
        let rec = self.current.clone();
        self.write(&rec)
    }

    fn write(&mut self, rec: &Record) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
        if self.last.as_deref() == Some(&bytes[..]) {
            return Ok(());
        }
        if rec.is_empty() {
            match std::fs::remove_file(&self.path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(e),
            }
        } else {
            write_atomically(&self.path, &bytes)?;
        }
        self.last = Some(bytes);
        Ok(())
    }

    /// Removes the file (a clean stop).
    pub fn remove(&mut self) -> std::io::Result<()> {
        self.save(&Record::default())
    }
}

/// The ledger shared by the run loop, which saves it after each wake-up,
/// and the daemon, which writes marks ahead through it ([`Journal`]). One
/// thread uses both.
#[derive(Clone, Debug)]
pub struct SharedLedger(Rc<RefCell<Ledger>>);

impl SharedLedger {
    /// Shares `ledger`.
    pub fn new(ledger: Ledger) -> SharedLedger {
        SharedLedger(Rc::new(RefCell::new(ledger)))
    }

    /// The ledger, for the run loop's saves.
    pub fn borrow_mut(&self) -> std::cell::RefMut<'_, Ledger> {
        self.0.borrow_mut()
    }
}

impl Journal for SharedLedger {
    fn intend(&mut self, key: ProcKey, ranges: &[(u64, u64)]) -> Result<(), String> {
        (self.0.borrow_mut().write_ahead(key, ranges))
            .map_err(|e| format!("cannot write the ledger: {e}"))
    }
}

impl crate::target::TrackJournal for SharedLedger {
    fn intend_tracking(
        &mut self,
        pid: u32,
        start_time: u64,
        before: &[i32],
        ranges: &[(u64, u64)],
    ) -> Result<(), String> {
        let entry = UffdEntry {
            pid,
            start_time,
            fd: OPENING,
            ranges: ranges.to_vec(),
            before: before.to_vec(),
        };
        (self.0.borrow_mut().write_ahead_tracking(entry))
            .map_err(|e| format!("cannot write the ledger: {e}"))
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("/"));
    match std::fs::create_dir(dir) {
        Ok(()) => std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    if !meta.is_dir() || meta.uid() != rustix::process::geteuid().as_raw() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory of ours",
            dir.display()
        )));
    }
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&tmp)?;
    f.write_all(bytes)?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// The ledger a previous daemon left at `path`: `Ok(None)` if there is
/// none; an error naming the path and the reason if it cannot be trusted
/// or read.
pub fn previous(path: &Path) -> Result<Option<Record>, String> {
    use std::io::Read;
    let f = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("cannot open the ledger {}: {e}", path.display())),
    };
    let meta = f
        .metadata()
        .map_err(|e| format!("{}: {e}", path.display()))?;
    if !meta.is_file() {
        return Err(format!("{} is not a regular file", path.display()));
    }
    if meta.uid() != rustix::process::geteuid().as_raw() || meta.mode() & 0o022 != 0 {
        return Err(format!(
            "{}: not trusted (owner uid {}, mode {:o}): it must be ours and writable by nobody else",
            path.display(),
            meta.uid(),
            meta.mode() & 0o7777
        ));
    }
    let mut text = String::new();
    (&f).read_to_string(&mut text)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// What [`recover`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Recovered {
    /// Ranges unmarked.
    pub unmarked: usize,
    /// Registrations undone (descriptors closed).
    pub closed: usize,
    /// Entries whose process is gone or is another one now.
    pub gone: usize,
    /// What could not be undone, and why.
    pub failed: Vec<String>,
}

/// Attempts at the marks of one process when its batches are cut part-way
/// (a target frozen between two calls): each attempt runs the calls the
/// last one did not reach.
const CUT_ATTEMPTS: usize = 4;

/// Takes away what `rec` lists, in the processes that are still the same.
#[cfg(target_arch = "x86_64")]
pub fn recover(rec: &Record, injector: &mut pagesift_linux::inject::Injector) -> Recovered {
    use pagesift_linux::inject::Outcome;
    let mut out = Recovered::default();
    for m in &rec.marks {
        if pagesift_linux::discover::identity(m.pid) != Some((m.start_time, m.image)) {
            out.gone += 1;
            continue;
        }
        unmark(m, injector, &mut out);
    }
    for u in &rec.uffd {
        let same =
            pagesift_linux::discover::identity(u.pid).map(|(st, _)| st) == Some(u.start_time);
        if !same {
            out.gone += 1;
            continue;
        }
        for fd in descriptors_to_close(rec, u) {
            let calls = pagesift_linux::uffd::close_calls(fd, &u.ranges);
            match injector.run(u.pid, &calls) {
                Ok(Outcome::Done(i)) if i.results.last().is_some_and(|&r| r == 0) => {
                    out.closed += 1
                }
                Ok(Outcome::Done(i)) => out
                    .failed
                    .push(format!("pid {} fd {fd}: results {:?}", u.pid, i.results)),
                Ok(Outcome::Gone(_)) => out.gone += 1,
                Ok(Outcome::Skipped(why)) => {
                    out.failed.push(format!("pid {} fd {fd}: {why}", u.pid))
                }
                Err(e) => out.failed.push(format!("pid {} fd {fd}: {e}", u.pid)),
            }
        }
    }
    out
}

/// The descriptors of entry `u`'s process (still the same process) that
/// recovery closes: its own if it is still a userfaultfd with pagesift's
/// features (closed since otherwise, by us before the crash or by the
/// process); for an entry written ahead ([`OPENING`]), every such
/// userfaultfd the process did not have before the batch and that no other
/// entry of `rec` names, and every one of those not handshaken yet (the
/// batch was cut between its `userfaultfd()` and its `UFFDIO_API`: the
/// handshake is done first, so that the close's proof works). An
/// application that opens a userfaultfd with exactly pagesift's features,
/// or leaves one without a handshake, in the moment between the list and
/// the batch, and whose daemon dies in that batch, would lose it: the
/// only guess this recovery makes.
fn descriptors_to_close(rec: &Record, u: &UffdEntry) -> Vec<i32> {
    use pagesift_linux::uffd::{has_tracking_features, ready_to_close, userfaultfds};
    if u.fd != OPENING {
        return Some(u.fd)
            .filter(|&fd| has_tracking_features(u.pid, fd))
            .into_iter()
            .collect();
    }
    let first_opening = rec.uffd.iter().find(|o| o.pid == u.pid && o.fd == OPENING);
    if !first_opening.is_some_and(|o| std::ptr::eq(o, u)) {
        // Another entry written ahead for the process closes them all.
        return vec![];
    }
    let named = |fd: i32| (rec.uffd.iter()).any(|o| o.pid == u.pid && o.fd == fd);
    let mut fds: Vec<i32> = userfaultfds(u.pid)
        .into_iter()
        .filter(|&fd| !u.before.contains(&fd) && !named(fd))
        .filter(|&fd| ready_to_close(u.pid, fd))
        .collect();
    fds.sort_unstable();
    fds
}

/// Unmarks the ranges of `m` (a process that is still the same). A batch
/// cut part-way unmarked the ranges before the cut: those count, and the
/// rest are tried again, up to [`CUT_ATTEMPTS`] batches in all.
#[cfg(target_arch = "x86_64")]
fn unmark(m: &MarkEntry, injector: &mut pagesift_linux::inject::Injector, out: &mut Recovered) {
    use pagesift_linux::inject::{Advice, Outcome, SkipReason, Syscall};
    let mut left: &[(u64, u64)] = &m.ranges;
    let mut refused = Vec::new();
    for attempt in 1..=CUT_ATTEMPTS {
        let calls: Vec<Syscall> = (left.iter())
            .map(|&(s, e)| Syscall::Madvise {
                addr: s,
                len: e - s,
                advice: Advice::Unmergeable,
            })
            .collect();
        let ran = match injector.run_as(m.pid, m.image, &calls) {
            Ok(Outcome::Done(i)) => i.results,
            Ok(Outcome::Skipped(SkipReason::SyscallTimeout { completed }))
                if !completed.is_empty() && attempt < CUT_ATTEMPTS =>
            {
                completed
            }
            Ok(Outcome::Gone(_)) => {
                out.gone += 1;
                break;
            }
            Ok(Outcome::Skipped(why)) => {
                let ran: &[i64] = match &why {
                    SkipReason::SyscallTimeout { completed } => completed,
                    _ => &[],
                };
                note_results(ran, &mut refused, out);
                out.failed.push(format!(
                    "pid {}: {} of {} ranges left marked: {why}",
                    m.pid,
                    left.len() - ran.len(),
                    m.ranges.len()
                ));
                break;
            }
            Err(e) => {
                out.failed.push(format!("pid {}: {e}", m.pid));
                break;
            }
        };
        note_results(&ran, &mut refused, out);
        left = &left[ran.len().min(left.len())..];
        if left.is_empty() {
            break;
        }
    }
    if !refused.is_empty() {
        out.failed
            .push(format!("pid {}: unmark results {refused:?}", m.pid));
    }
}

/// Counts the successful unmarks among `results` and keeps the errors.
fn note_results(results: &[i64], refused: &mut Vec<i64>, out: &mut Recovered) {
    out.unmarked += results.iter().filter(|&&r| r >= 0).count();
    refused.extend(results.iter().filter(|&&r| r < 0));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_written_ahead_join_what_was_saved_until_the_next_save() {
        let dir = std::env::temp_dir().join(format!("pagesift-ahead-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("ledger");
        let mut l = Ledger::new(&path);
        let (a, b) = (
            ProcKey {
                pid: 7,
                start_time: 9,
                image: 11,
            },
            ProcKey {
                pid: 8,
                start_time: 9,
                image: 11,
            },
        );
        let mut marks = Marks::new();
        marks.add(a, 0x1000, 0x3000);
        let mut saved = Record::default();
        saved.add_marks(&marks);
        assert!(l.changed(&saved));
        l.save(&saved).unwrap();
        assert!(!l.changed(&saved));
        // Ahead of marks in a, then in b (two batches of one wake-up): the
        // file holds both besides the saved ones, a's too once b's are
        // written (a's marks are made by then).
        l.write_ahead(a, &[(0x5000, 0x6000)]).unwrap();
        l.write_ahead(b, &[(0x1000, 0x2000)]).unwrap();
        let on_disk = previous(&path).unwrap().unwrap();
        assert_eq!(on_disk.marks.len(), 2, "{on_disk:?}");
        assert_eq!(
            on_disk.marks[0].ranges,
            vec![(0x1000, 0x3000), (0x5000, 0x6000)]
        );
        assert_eq!(on_disk.marks[1].ranges, vec![(0x1000, 0x2000)]);
        // The marks failed: the next save, of what is left, is written
        // although the record did not change since the last save.
        assert!(l.changed(&saved));
        l.save(&saved).unwrap();
        assert_eq!(previous(&path).unwrap(), Some(saved));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tracking_written_ahead_stays_until_the_next_save_and_old_ledgers_still_read() {
        let dir = std::env::temp_dir().join(format!("pagesift-ahead-uffd-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("ledger");
        let mut l = Ledger::new(&path);
        let registered = UffdEntry {
            pid: 7,
            start_time: 9,
            fd: 5,
            ranges: vec![(0x1000, 0x3000)],
            before: vec![],
        };
        let saved = Record {
            marks: vec![],
            uffd: vec![registered.clone()],
        };
        l.save(&saved).unwrap();
        let opening = UffdEntry {
            pid: 8,
            start_time: 9,
            fd: OPENING,
            ranges: vec![(0x4000, 0x5000)],
            before: vec![3, 4],
        };
        l.write_ahead_tracking(opening.clone()).unwrap();
        // A mark written ahead after it keeps it.
        let key = ProcKey {
            pid: 8,
            start_time: 9,
            image: 11,
        };
        l.write_ahead(key, &[(0x8000, 0x9000)]).unwrap();
        let on_disk = previous(&path).unwrap().unwrap();
        assert_eq!(on_disk.uffd, vec![registered.clone(), opening]);
        assert_eq!(on_disk.marks.len(), 1);
        // The save at the wake-up's end holds what was done instead.
        let done = Record {
            marks: vec![],
            uffd: vec![
                registered,
                UffdEntry {
                    pid: 8,
                    start_time: 9,
                    fd: 6,
                    ranges: vec![(0x4000, 0x5000)],
                    before: vec![],
                },
            ],
        };
        assert!(l.changed(&done));
        l.save(&done).unwrap();
        assert_eq!(previous(&path).unwrap(), Some(done.clone()));
        // A registration is written without `before`, and a ledger
        // written before the field existed reads the same.
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("before"), "{text}");
        let old =
            r#"{"marks":[],"uffd":[{"pid":7,"start_time":9,"fd":5,"ranges":[[4096,12288]]}]}"#;
        let rec: Record = serde_json::from_str(old).unwrap();
        assert_eq!(rec.uffd[0], done.uffd[0]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn saves_atomically_reads_back_and_refuses_what_others_can_write() {
        let dir = std::env::temp_dir().join(format!("pagesift-ledger-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let path = dir.join("ledger");
        let mut l = Ledger::new(&path);
        assert_eq!(previous(&path).unwrap(), None);
        let mut marks = Marks::new();
        let key = ProcKey {
            pid: 7,
            start_time: 9,
            image: 11,
        };
        marks.add(key, 0x1000, 0x3000);
        let mut rec = Record::default();
        rec.add_marks(&marks);
        rec.uffd.push(UffdEntry {
            pid: 7,
            start_time: 9,
            fd: 5,
            ranges: vec![(0x8000, 0x9000)],
            before: vec![],
        });
        l.save(&rec).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        assert_eq!(previous(&path).unwrap(), Some(rec.clone()));
        // Writable by others: refused, named, left alone.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        let err = previous(&path).unwrap_err();
        assert!(
            err.contains("ledger") && err.contains("not trusted"),
            "{err}"
        );
        assert!(path.exists());
        // A link is refused.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let link = dir.join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(previous(&link).is_err());
        // An empty record removes the file.
        l.remove().unwrap();
        assert!(!path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
