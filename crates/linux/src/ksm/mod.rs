//! KSM: typed access to `/sys/kernel/mm/ksm`, per-process KSM state, ksmd's
//! CPU time, and owning KSM safely ([`KsmGuard`]).
//!
//! ## What is read
//!
//! - **Knobs** ([`Knob`]): every writable file of `/sys/kernel/mm/ksm`
//!   (the kernel's `Documentation/admin-guide/mm/ksm.rst` describes them).
//!   Knobs a kernel lacks (older than 6.7 has no `smart_scan`, older than
//!   6.8 no advisor, non-NUMA kernels no `merge_across_nodes`) read as
//!   `None`; writable files this code does not know (a newer kernel's) are
//!   still found by their mode bits and saved and restored as raw text.
//! - **Counters** ([`KsmCounters`]), each `None` when absent.
//! - **Per process** ([`ProcessKsmStat`]): `/proc/PID/ksm_stat` and
//!   `/proc/PID/ksm_merging_pages` (mode 0400: root or the owner).
//! - **vmstat** ([`KsmVmstat`]): `cow_ksm`, `ksm_swpin_copy` and any other
//!   `ksm` line of `/proc/vmstat`.
//! - **ksmd** ([`Ksmd`]): the kernel thread named `ksmd` (PF_KTHREAD) and
//!   its CPU time: `/proc/<ksmd>/schedstat` field 1 (ns on CPU, exact), or
//!   utime + stime of `/proc/<ksmd>/stat` in USER_HZ ticks when schedstat
//!   is missing; and its wait for a CPU ([`KsmdWait`], schedstat field 2).
//!
//! ## Owning KSM
//!
//! KSM is one global resource. Everything that changes it (the daemon and
//! every test) goes through a [`KsmGuard`]:
//!
//! 1. **Lock.** An exclusive `flock` on [`LOCK_PATH`] (std's
//!    `File::lock`), so concurrent test binaries and a running daemon take
//!    turns. The kernel drops the lock when the holder dies, however it
//!    dies.
//! 2. **Snapshot.** The values of every writable knob are read and also
//!    written *into the lock file*. If the holder is SIGKILLed, the next
//!    [`KsmGuard::acquire`] finds them there, puts them back first (and
//!    reports it, [`KsmGuard::recovered`]), and keeps them as its own
//!    snapshot: the machine returns to the state before the *first* owner.
//!    After a complete restore the file is emptied; after a partial one it
//!    keeps only the knobs still owed.
//! 3. **Write** only through the guard ([`KsmGuard::set`] and the typed
//!    setters), so a termination signal can stop further writes.
//! 4. **Restore** on [`KsmGuard::release`], on drop (also while unwinding
//!    from a panic), and, with [`TerminationWatch`], on SIGTERM/SIGINT.
//!
//! ### Restore order
//!
//! Some knobs constrain others (`mm/ksm.c`):
//! - `max_page_sharing` and `merge_across_nodes` can only change while no
//!   page is merged (`pages_shared == 0`, else EBUSY). Merged pages stay
//!   merged unless the owner asked for [`KsmGuard::set_unmerge_on_restore`],
//!   which writes `run=2` first; otherwise these knobs are *reported* as not
//!   restored, with the reason, and stay owed in the lock file.
//! - Changing `advisor_mode` resets `pages_to_scan` (to 100 for `none`, to
//!   `advisor_min_pages_to_scan` for `scan-time`), and `pages_to_scan`
//!   refuses writes (EINVAL) while the advisor is on. So the advisor's own
//!   knobs go first, then `advisor_mode`, then `pages_to_scan`; an advisor
//!   -tuned `pages_to_scan` under `scan-time` cannot be written back and is
//!   reported.
//! - ksmd is stopped (`run=0`) while knobs are written, so it does not
//!   merge pages between the check and the write, and `run` goes back last.
//!   An original `run=2` ("stopped, unmerged") is rewritten as 2 only when
//!   that unmerges nothing or unmerging was asked for; otherwise ksmd is left
//!   stopped (0) and `run` is reported.
//!
//! Every knob is read back at the end; any difference is reported.
//!
//! ## Making a child's memory mergeable
//!
//! [`with_memory_merge`] sets `PR_SET_MEMORY_MERGE` in a child between
//! fork and exec; the flag survives exec since 6.7 (and
//! the exec'd image is really scanned since 6.10). The `prctl` call itself
//! is in [`crate::sys`], with the crate's other `unsafe` code.
//!
//! ## Layout
//!
//! One module per job: `knobs` (the knobs and their values), `error`
//! ([`KsmError`]), `sysfs` (reading and writing `/sys/kernel/mm/ksm`:
//! [`Ksm`]), `snapshot` ([`KsmSnapshot`]), `restore` (putting a snapshot
//! back, in order), `lock` (the lock file), `guard` ([`KsmGuard`]),
//! `signals` ([`TerminationWatch`]), `ksmd` ([`Ksmd`]), `stats` (per
//! process, and vmstat) and `prctl` (`PR_SET_MEMORY_MERGE`).

mod error;
mod guard;
mod knobs;
mod ksmd;
mod lock;
mod prctl;
mod restore;
mod signals;
mod snapshot;
mod stats;
mod sysfs;

#[cfg(test)]
mod fake;

pub use error::KsmError;
pub use guard::{GuardOptions, KsmGuard};
pub use knobs::{AdvisorMode, Knob, Run};
pub use ksmd::{Ksmd, KsmdCpu, KsmdWait};
pub use prctl::{memory_merge, set_memory_merge, with_memory_merge};
pub use restore::{RestoreReport, Unrestored};
pub use signals::TerminationWatch;
pub use snapshot::{KsmSettings, KsmSnapshot};
pub use stats::{KsmVmstat, ProcessKsmStat, merging_pages};
pub use sysfs::{Ksm, KsmCounters};

/// Where mainline exposes KSM.
pub const KSM_SYSFS: &str = "/sys/kernel/mm/ksm";
/// The lock every KSM-changing process takes (tmpfs: gone at reboot, when
/// KSM's settings are back at their defaults too).
pub const LOCK_PATH: &str = "/run/pagesift-ksm.lock";
