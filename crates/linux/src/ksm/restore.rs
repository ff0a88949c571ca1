//! Putting a snapshot back, in the order the knobs' constraints demand.
//!
//! [`restore_to`]: (1) stop ksmd (`run=0`) so it merges nothing while
//! knobs change; (2) `run=2` if unmerging was asked for, which lets the
//! knobs that need nothing merged change; (3) every knob but `run` in
//! restore order, skipping those already right, and reporting rather than
//! forcing `pages_to_scan` under the scan-time advisor; (4) `run` last,
//! where an original `run=2` is only rewritten when that unmerges nothing
//! or unmerging was asked for; (5) everything read back, and every
//! difference reported with its reason ([`RestoreReport`]).

use super::knobs::Knob;
use super::snapshot::KsmSnapshot;
use super::sysfs::Ksm;
use std::collections::BTreeMap;
use std::fmt;

/// A knob a restore could not put back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unrestored {
    /// The file name.
    pub knob: String,
    /// The value it should have.
    pub wanted: String,
    /// The value it has (`None` if unreadable).
    pub actual: Option<String>,
    /// Why.
    pub reason: String,
}

/// What a restore did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RestoreReport {
    /// (knob, value) written, in order, `run` writes included.
    pub written: Vec<(String, String)>,
    /// Knobs still not at their snapshot value.
    pub unrestored: Vec<Unrestored>,
}

impl RestoreReport {
    /// Whether every knob is back.
    pub fn is_complete(&self) -> bool {
        self.unrestored.is_empty()
    }
}

impl fmt::Display for RestoreReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_complete() {
            return write!(f, "KSM restored ({} writes)", self.written.len());
        }
        write!(f, "KSM not fully restored:")?;
        for u in &self.unrestored {
            write!(
                f,
                " {} is {} (wanted {}): {};",
                u.knob,
                u.actual.as_deref().unwrap_or("unreadable"),
                u.wanted,
                u.reason
            )?;
        }
        Ok(())
    }
}

/// Puts `snap` back, in the order the module header explains. With
/// `unmerge`, writes `run=2` first (unmerging everything), which lets the
/// knobs that need nothing merged change.
pub(super) fn restore_to(ksm: &Ksm, snap: &KsmSnapshot, unmerge: bool) -> RestoreReport {
    let mut report = RestoreReport::default();
    let mut failed: BTreeMap<String, String> = BTreeMap::new();
    let current = |name: &str| ksm.read_name(name).ok().flatten();
    let write = |report: &mut RestoreReport, name: &str, value: &str| -> Result<(), String> {
        match ksm.write_name(name, value) {
            Ok(()) => {
                report.written.push((name.to_string(), value.to_string()));
                Ok(())
            }
            Err(e) => Err(e.to_string()),
        }
    };

    let differs: Vec<&str> = snap
        .restore_order()
        .into_iter()
        .filter(|n| current(n).as_deref() != snap.get_name(n))
        .collect();
    if differs.is_empty() && !unmerge {
        return report;
    }
    let run_now = current("run");

    // 1. Stop ksmd while knobs change (it would merge pages meanwhile).
    if run_now.as_deref() == Some("1")
        && let Err(e) = write(&mut report, "run", "0")
    {
        failed.insert("run".into(), format!("could not stop ksmd first: {e}"));
    }
    // 2. Unmerge everything if asked.
    if unmerge && let Err(e) = write(&mut report, "run", "2") {
        failed.insert("run".into(), format!("could not unmerge (run=2): {e}"));
    }

    // 3. Every knob but run, in order.
    let advisor_first = snap.get(Knob::AdvisorMode);
    for name in snap.restore_order() {
        if name == "run" {
            continue;
        }
        let Some(wanted) = snap.get_name(name) else {
            continue;
        };
        let now = current(name);
        if now.as_deref() == Some(wanted) {
            continue;
        }
        if name == Knob::PagesToScan.file_name() && advisor_first == Some("scan-time") {
            failed.insert(
                name.into(),
                format!(
                    "advisor_mode is scan-time, which owns pages_to_scan: entering it set \
                     pages_to_scan to advisor_min_pages_to_scan ({}) and the advisor retunes \
                     it after every full scan",
                    current(Knob::AdvisorMinPagesToScan.file_name()).unwrap_or_default()
                ),
            );
            continue;
        }
        if let Err(e) = write(&mut report, name, wanted) {
            failed.insert(name.into(), e);
        }
    }

    // 4. run last.
    if let Some(wanted) = snap.get(Knob::Run) {
        let now = current("run");
        if now.as_deref() != Some(wanted) {
            let shared = ksm.pages_shared().unwrap_or(0);
            let r = if wanted == "2" && shared > 0 && !unmerge {
                // 2 would unmerge every merged page: only on request.
                if now.as_deref() != Some("0") {
                    let _ = write(&mut report, "run", "0");
                }
                Err(format!(
                    "run was 2 (stopped and unmerged); writing 2 would unmerge the {shared} KSM \
                     pages merged since, so ksmd is left stopped (0) instead"
                ))
            } else {
                write(&mut report, "run", wanted)
            };
            if let Err(e) = r {
                failed.insert("run".into(), e);
            }
        }
    }

    // 5. Read everything back.
    for name in snap.restore_order() {
        let wanted = snap.get_name(name).unwrap_or_default();
        let actual = current(name);
        if actual.as_deref() != Some(wanted) {
            report.unrestored.push(Unrestored {
                knob: name.into(),
                wanted: wanted.into(),
                actual,
                reason: failed
                    .remove(name)
                    .unwrap_or_else(|| "the value read back differs".into()),
            });
        }
    }
    report
}
