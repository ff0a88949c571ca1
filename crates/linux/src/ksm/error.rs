//! What can go wrong with KSM's sysfs, the lock, or the guard.
//!
//! Each variant says what the operator can do: no KSM in this kernel, a
//! knob this kernel lacks, a value refused because pages are merged
//! (EBUSY, with `pages_shared`) or as invalid (with the reason when it is
//! known), root needed, a lock held by another pid, a lock file that is
//! not trusted. [`KsmError::io`] turns EACCES/EPERM into
//! [`KsmError::NotRoot`] for every file this module touches.

use crate::error::libc_errno;
use std::io;
use std::path::PathBuf;
use std::time::Duration;

/// What can go wrong with KSM's sysfs, the lock, or the guard.
#[derive(Debug, thiserror::Error)]
pub enum KsmError {
    /// `/sys/kernel/mm/ksm` does not exist.
    #[error("this kernel has no KSM: {0} is missing (CONFIG_KSM is off)")]
    NoKsm(PathBuf),
    /// A knob or counter this kernel lacks.
    #[error("this kernel's KSM has no {0} (too old, or not a NUMA kernel)")]
    Missing(String),
    /// The kernel refused a value because pages are merged.
    #[error(
        "{knob} = {value} refused (EBUSY): {pages_shared} KSM pages are merged; \
         this knob can only change once run=2 has unmerged everything"
    )]
    Busy {
        /// The knob.
        knob: String,
        /// The value refused.
        value: String,
        /// `pages_shared` right after the refusal.
        pages_shared: u64,
    },
    /// The kernel refused a value as invalid.
    #[error("{knob} = {value} refused (EINVAL){hint}")]
    Invalid {
        /// The knob.
        knob: String,
        /// The value refused.
        value: String,
        /// Why, when it is known (e.g. the advisor owns `pages_to_scan`).
        hint: String,
    },
    /// Writing KSM's sysfs or the lock needs root.
    #[error("{what} needs root (the file is root's): {source}")]
    NotRoot {
        /// What was being done.
        what: String,
        /// The OS error.
        source: io::Error,
    },
    /// No kernel thread named ksmd.
    #[error("no ksmd kernel thread found in /proc")]
    NoKsmd,
    /// The lock was not free within the wait asked for.
    #[error("the KSM lock {path} is still held (by pid {holder}) after {waited:?}")]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// The holder's pid as it recorded it, or "unknown".
        holder: String,
        /// How long we waited.
        waited: Duration,
    },
    /// The lock file is one another user could have written (a symbolic
    /// link, not a regular file, not owned by root, writable by group or
    /// others): the knob values in it are not trusted, and it is not used.
    #[error(
        "the KSM lock {path} is not trusted: {reason}; the knob values in it are not \
         written to sysfs (remove it and let pagesift create it again)"
    )]
    UntrustedLock {
        /// The lock file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// A termination signal restored KSM; the guard accepts no more writes.
    #[error("KSM was restored after a termination signal; no more changes are accepted")]
    Closed,
    /// A value that does not parse.
    #[error("cannot parse {what}: {text:?}")]
    Parse {
        /// What was being parsed.
        what: String,
        /// The text.
        text: String,
    },
    /// Any other I/O error.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: io::Error,
    },
}

impl KsmError {
    pub(super) fn io(context: impl Into<String>, source: io::Error) -> KsmError {
        let context = context.into();
        match source.raw_os_error() {
            Some(libc_errno::EACCES) | Some(libc_errno::EPERM) => KsmError::NotRoot {
                what: context,
                source,
            },
            _ => KsmError::Io { context, source },
        }
    }
}
