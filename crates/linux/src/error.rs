//! Errors of the Linux side, and how raw OS errors become them.
//!
//! On a live machine processes exit at any moment, so "the process is gone"
//! is its own variant ([`LinuxError::Gone`]) that callers skip and count,
//! distinct from "no such pid" ([`LinuxError::NoSuchProcess`]), which is the
//! operator's mistake and is reported as such. Permission errors are turned
//! into [`LinuxError::MissingCapability`] naming the capability when the
//! calling thread lacks it, so the operator knows what to grant.

use crate::caps::{self, Capability};
use pagesift_core::RegionId;
use pagesift_core::source::SourceError;

/// Anything that can go wrong while discovering, inspecting or reading a
/// process.
#[derive(Debug, thiserror::Error)]
pub enum LinuxError {
    /// The pid names no process (it never existed, or exited before we
    /// first looked at it).
    #[error("no process with pid {0}")]
    NoSuchProcess(u32),
    /// The process existed when it was discovered and has exited since.
    /// Normal on a live machine: skip it.
    #[error("process {0} has exited")]
    Gone(u32),
    /// The pid is pagesift's own process, which is never scanned.
    #[error("pid {0} is pagesift's own process, which pagesift never scans")]
    OwnProcess(u32),
    /// The calling thread lacks a capability the operation needs.
    #[error("missing capability {cap}: it is needed {why}")]
    MissingCapability {
        /// The capability to grant.
        cap: Capability,
        /// What it is needed for.
        why: &'static str,
    },
    /// Access was refused although the capability is held (an LSM, Yama
    /// `ptrace_scope = 3`, or a process in another user namespace).
    #[error("permission denied {what} of process {pid} even with {cap}: {source}")]
    PermissionDenied {
        /// The target.
        pid: u32,
        /// What was being done.
        what: &'static str,
        /// The capability that was held.
        cap: Capability,
        /// The OS error.
        source: std::io::Error,
    },
    /// The running kernel lacks a feature.
    #[error("unsupported by this kernel: {0}")]
    Unsupported(String),
    /// Any other I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A /proc file could not be parsed.
    #[error("cannot parse {0}")]
    Parse(String),
}

impl LinuxError {
    /// Wraps an I/O error with context.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        LinuxError::Io {
            context: context.into(),
            source,
        }
    }

    /// Turns an error of an operation on process `pid`, which existed when
    /// it was discovered, into the right variant: ESRCH/ENOENT mean it has
    /// exited since; EPERM/EACCES mean a missing `cap` (if the calling
    /// thread lacks it) or a refusal despite it.
    pub fn from_process_op(
        pid: u32,
        source: std::io::Error,
        what: &'static str,
        cap: Capability,
        why: &'static str,
    ) -> Self {
        match source.raw_os_error() {
            Some(libc_errno::ESRCH) | Some(libc_errno::ENOENT) => LinuxError::Gone(pid),
            Some(libc_errno::EPERM) | Some(libc_errno::EACCES) => {
                if caps::has(cap) {
                    LinuxError::PermissionDenied {
                        pid,
                        what,
                        cap,
                        source,
                    }
                } else {
                    LinuxError::MissingCapability { cap, why }
                }
            }
            _ => LinuxError::Io {
                context: format!("{what} of process {pid}"),
                source,
            },
        }
    }

    /// Whether the process has exited (skip it and count it).
    pub fn is_gone(&self) -> bool {
        matches!(self, LinuxError::Gone(_))
    }

    /// The core's view of this error for a page of `region`.
    pub fn into_source_error(self, region: RegionId) -> SourceError {
        match self {
            LinuxError::Gone(_) => SourceError::Gone(region),
            other => SourceError::Other(other.to_string()),
        }
    }
}

/// The few errno values we distinguish (stable across Linux architectures
/// for these numbers).
pub(crate) mod libc_errno {
    pub const EPERM: i32 = 1;
    pub const ENOENT: i32 = 2;
    pub const ESRCH: i32 = 3;
    pub const EACCES: i32 = 13;
    pub const EIO: i32 = 5;
    pub const EINVAL: i32 = 22;
    pub const ENOTTY: i32 = 25;
}

/// Why reading another process needs `CAP_SYS_PTRACE`.
pub(crate) const WHY_PTRACE: &str = "to read another process's memory and page map \
     (process_vm_readv and /proc/PID/pagemap need ptrace access to the target)";

/// Why PFNs need `CAP_SYS_ADMIN`.
pub(crate) const WHY_PFN: &str = "to see page frame numbers in /proc/PID/pagemap and read \
     /proc/kpageflags (zero-page, KSM and THP bits); without it PFNs read as 0";
