//! [`KsmGuard`]: exclusive ownership of KSM (steps 1 to 4 of the parent
//! module's header).
//!
//! Acquiring takes the lock, reads what a dead owner left owed, puts it
//! back first (the machine returns to the state before the *first*
//! owner), snapshots the rest and records the snapshot in the lock file.
//! Every write then goes through the guard, which refuses them once a
//! termination signal has restored KSM. Release, drop and unwinding all
//! restore; what could not be restored stays recorded as owed.
//!
//! The state is shared (`Arc<Mutex<Owner>>`) with a process-wide list of
//! live guards, so the signal thread can restore every guard and hold it
//! closed. The mutex is taken ignoring poison: a panic inside one restore
//! must not prevent the next.

use super::error::KsmError;
use super::knobs::{AdvisorMode, Knob, Run};
use super::lock::LockFile;
use super::restore::{RestoreReport, restore_to};
use super::snapshot::KsmSnapshot;
use super::sysfs::Ksm;
use super::{KSM_SYSFS, LOCK_PATH};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

/// Where a [`KsmGuard`] locks and what it owns; [`Default`] is the
/// machine's KSM and [`LOCK_PATH`], waiting as long as it takes.
#[derive(Clone, Debug)]
pub struct GuardOptions {
    /// KSM's sysfs directory.
    pub sysfs: PathBuf,
    /// The lock file.
    pub lock_path: PathBuf,
    /// How long to wait for the lock (`None`: until it is free).
    pub wait: Option<Duration>,
}

impl Default for GuardOptions {
    fn default() -> Self {
        GuardOptions {
            sysfs: KSM_SYSFS.into(),
            lock_path: LOCK_PATH.into(),
            wait: None,
        }
    }
}

#[derive(Debug)]
pub(super) struct Owner {
    ksm: Ksm,
    lock: Option<LockFile>,
    snapshot: KsmSnapshot,
    unmerge_on_restore: bool,
    /// A termination signal restored KSM: no more writes.
    pub(super) closed: bool,
}

impl Owner {
    /// Restores, records what is still owed, and keeps the lock.
    fn restore(&mut self) -> RestoreReport {
        let report = restore_to(&self.ksm, &self.snapshot, self.unmerge_on_restore);
        let owed = KsmSnapshot {
            values: report
                .unrestored
                .iter()
                .map(|u| (u.knob.clone(), u.wanted.clone()))
                .collect(),
        };
        if let Some(lock) = self.lock.as_mut()
            && let Err(e) = lock.record(&owed)
        {
            eprintln!("pagesift: {e}");
        }
        report
    }

    /// Restores and unlocks (once).
    pub(super) fn release(&mut self) -> Option<RestoreReport> {
        self.lock.as_ref()?;
        let report = self.restore();
        self.lock = None; // closing the file drops the flock
        Some(report)
    }
}

/// Every live guard of this process, for
/// [`TerminationWatch`](super::TerminationWatch).
pub(super) static LIVE: Mutex<Vec<Weak<Mutex<Owner>>>> = Mutex::new(Vec::new());

pub(super) fn lock_owner(o: &Mutex<Owner>) -> MutexGuard<'_, Owner> {
    // A panic while holding it (inside a restore) must not stop later
    // restores.
    o.lock().unwrap_or_else(|e| e.into_inner())
}

/// Exclusive ownership of KSM: holds the lock and the snapshot, and puts
/// the snapshot back when released or dropped (also during a panic). See
/// the module header.
#[derive(Debug)]
pub struct KsmGuard {
    owner: Arc<Mutex<Owner>>,
    ksm: Ksm,
    snapshot: KsmSnapshot,
    recovered: Option<RestoreReport>,
}

impl KsmGuard {
    /// Takes the lock on [`LOCK_PATH`] (waiting for it) and snapshots the
    /// machine's KSM.
    pub fn acquire() -> Result<KsmGuard, KsmError> {
        KsmGuard::acquire_with(GuardOptions::default())
    }

    /// [`acquire`](Self::acquire) with other paths or a bounded wait.
    pub fn acquire_with(opts: GuardOptions) -> Result<KsmGuard, KsmError> {
        let ksm = Ksm::at(&opts.sysfs)?;
        let mut lock = LockFile::acquire(&opts.lock_path, opts.wait)?;
        let owed = lock.owed()?;
        let now = ksm.snapshot()?;
        // Settings a dead owner did not put back are the real originals.
        let snapshot = now.overlaid(&owed);
        let recovered = if owed.is_empty() {
            None
        } else {
            Some(restore_to(&ksm, &snapshot, false))
        };
        lock.record(&snapshot)?;
        let owner = Arc::new(Mutex::new(Owner {
            ksm: ksm.clone(),
            lock: Some(lock),
            snapshot: snapshot.clone(),
            unmerge_on_restore: false,
            closed: false,
        }));
        let mut live = LIVE.lock().unwrap_or_else(|e| e.into_inner());
        live.retain(|w| w.strong_count() > 0);
        live.push(Arc::downgrade(&owner));
        Ok(KsmGuard {
            owner,
            ksm,
            snapshot,
            recovered,
        })
    }

    /// Read access to KSM.
    pub fn ksm(&self) -> &Ksm {
        &self.ksm
    }

    /// The settings that will be put back.
    pub fn snapshot(&self) -> &KsmSnapshot {
        &self.snapshot
    }

    /// When a previous owner died without restoring, what putting its
    /// originals back did at acquire.
    pub fn recovered(&self) -> Option<&RestoreReport> {
        self.recovered.as_ref()
    }

    /// With `true`, restoring first writes `run=2`, unmerging every merged
    /// page (the daemon's `--unmerge-on-exit`); this also lets
    /// `max_page_sharing` and `merge_across_nodes` be put back.
    pub fn set_unmerge_on_restore(&self, unmerge: bool) {
        lock_owner(&self.owner).unmerge_on_restore = unmerge;
    }

    /// Writes raw `value` to knob file `name` (also one this code does not
    /// know, if the snapshot has it).
    pub fn set_name(&self, name: &str, value: &str) -> Result<(), KsmError> {
        let o = lock_owner(&self.owner);
        if o.closed || o.lock.is_none() {
            return Err(KsmError::Closed);
        }
        o.ksm.write_name(name, value)
    }

    /// Writes raw `value` to `knob`.
    pub fn set(&self, knob: Knob, value: &str) -> Result<(), KsmError> {
        if !self.ksm.has(knob) {
            return Err(KsmError::Missing(knob.file_name().into()));
        }
        self.set_name(knob.file_name(), value)
    }

    /// Writes a number.
    pub fn set_number(&self, knob: Knob, value: u64) -> Result<(), KsmError> {
        self.set(knob, &value.to_string())
    }

    /// Writes a boolean as 0/1.
    pub fn set_flag(&self, knob: Knob, value: bool) -> Result<(), KsmError> {
        self.set(knob, if value { "1" } else { "0" })
    }

    /// Writes `run`.
    pub fn set_run(&self, run: Run) -> Result<(), KsmError> {
        self.set_number(Knob::Run, run.as_u8() as u64)
    }

    /// Writes `advisor_mode` (which resets `pages_to_scan` when it changes).
    pub fn set_advisor_mode(&self, mode: AdvisorMode) -> Result<(), KsmError> {
        self.set(Knob::AdvisorMode, mode.as_str())
    }

    /// Writes `pages_to_scan` (refused while the advisor is on).
    pub fn set_pages_to_scan(&self, pages: u32) -> Result<(), KsmError> {
        self.set_number(Knob::PagesToScan, pages as u64)
    }

    /// Writes `sleep_millisecs` (which wakes ksmd).
    pub fn set_sleep_millisecs(&self, ms: u32) -> Result<(), KsmError> {
        self.set_number(Knob::SleepMillisecs, ms as u64)
    }

    /// Writes a pacer's output: `pages_to_scan`, then `sleep_millisecs`
    /// (whose write wakes ksmd, so the new batch size is used at once).
    pub fn set_pace(
        &self,
        pace: pagesift_core::pipeline::pacing::KsmdPace,
    ) -> Result<(), KsmError> {
        self.set_pages_to_scan(pace.pages_to_scan)?;
        self.set_sleep_millisecs(pace.sleep_millisecs)
    }

    /// Puts the snapshot back now and keeps ownership (a later drop
    /// restores again). Knobs still owed stay recorded in the lock file.
    pub fn restore(&self) -> RestoreReport {
        let mut o = lock_owner(&self.owner);
        if o.closed {
            return RestoreReport::default();
        }
        o.restore()
    }

    /// Puts the snapshot back and gives up the lock.
    pub fn release(self) -> RestoreReport {
        let r = lock_owner(&self.owner).release();
        r.unwrap_or_default()
        // Drop then finds the lock gone and does nothing.
    }
}

impl Drop for KsmGuard {
    fn drop(&mut self) {
        if let Some(report) = lock_owner(&self.owner).release()
            && !report.is_complete()
        {
            eprintln!("pagesift: {report}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ksm::fake::{fake_ksm, opts, tmpdir};
    use crate::ksm::lock::holder_pid;

    #[test]
    fn guard_restores_every_knob_on_drop_and_on_panic() {
        let tmp = tmpdir("guard");
        let d = tmp.path();
        fake_ksm(&d.join("ksm"));
        let before = Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap();
        {
            let g = KsmGuard::acquire_with(opts(d)).unwrap();
            g.set_run(Run::Run).unwrap();
            g.set_pages_to_scan(5000).unwrap();
            g.set_name("future_knob", "9").unwrap();
            g.set_flag(Knob::UseZeroPages, true).unwrap();
            assert_eq!(g.ksm().pages_to_scan().unwrap(), 5000);
            // The lock file holds the snapshot while owned.
            let text = std::fs::read_to_string(d.join("lock")).unwrap();
            assert_eq!(holder_pid(&text), Some(std::process::id().to_string()));
            assert_eq!(KsmSnapshot::from_text(&text).unwrap(), before);
        }
        assert_eq!(Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap(), before);
        assert_eq!(std::fs::read_to_string(d.join("lock")).unwrap(), "");

        let o = opts(d);
        let r = std::panic::catch_unwind(move || {
            let g = KsmGuard::acquire_with(o).unwrap();
            g.set_sleep_millisecs(1).unwrap();
            g.set_advisor_mode(AdvisorMode::ScanTime).unwrap();
            panic!("inside the guarded scope");
        });
        assert!(r.is_err());
        assert_eq!(Ksm::at(d.join("ksm")).unwrap().snapshot().unwrap(), before);
    }

    #[test]
    fn a_dead_owners_settings_are_put_back_at_acquire() {
        let tmp = tmpdir("stale");
        let d = tmp.path();
        fake_ksm(&d.join("ksm"));
        let ksm = Ksm::at(d.join("ksm")).unwrap();
        let before = ksm.snapshot().unwrap();
        // A previous owner recorded its snapshot, changed two knobs and was
        // SIGKILLed.
        std::fs::write(
            d.join("lock"),
            format!("# pagesift KSM lock: owner pid 1\n{}", before.to_text()),
        )
        .unwrap();
        std::fs::write(d.join("ksm/run"), "1\n").unwrap();
        std::fs::write(d.join("ksm/pages_to_scan"), "9999\n").unwrap();
        let g = KsmGuard::acquire_with(opts(d)).unwrap();
        let rec = g.recovered().expect("recovery happened");
        assert!(rec.is_complete(), "{rec}");
        assert!(
            rec.written
                .contains(&("pages_to_scan".into(), "100".into()))
        );
        assert_eq!(ksm.snapshot().unwrap(), before);
        assert_eq!(g.snapshot(), &before);
        let r = g.release();
        assert!(r.is_complete());
    }

    #[test]
    fn writes_after_release_are_refused() {
        let tmp = tmpdir("closed");
        let d = tmp.path();
        fake_ksm(&d.join("ksm"));
        let g = KsmGuard::acquire_with(opts(d)).unwrap();
        lock_owner(&g.owner).release();
        assert!(matches!(g.set_run(Run::Run), Err(KsmError::Closed)));
    }
}
