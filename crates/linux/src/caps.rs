//! Capabilities of the calling thread.
//!
//! The kernel checks capabilities per *thread*, and `/proc/self/status`
//! shows the main thread's, so the check uses `capget` on the calling thread
//! (through `rustix`). pagesift needs:
//! - `CAP_SYS_PTRACE` to read processes of other users (pagemap and
//!   `process_vm_readv` both need ptrace access to the target);
//! - `CAP_SYS_ADMIN` (in the initial user namespace) to see PFNs in pagemap;
//!   without it they read as 0 and `/proc/kpageflags` is useless;
//! - `CAP_BPF` and `CAP_PERFMON` (or `CAP_SYS_ADMIN`) for the I/O hint
//!   program ([`crate::iohint`]).
//! - `CAP_SYS_NICE` to move merged pages between NUMA nodes.

use rustix::thread::{CapabilitySet, capabilities, set_capabilities};

/// A capability pagesift may need.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Capability {
    /// `CAP_SYS_PTRACE`: read another process's memory and page map.
    SysPtrace,
    /// `CAP_SYS_ADMIN`: see PFNs in pagemap (and stands in for the two
    /// below, as the kernel's `bpf_capable`/`perfmon_capable` accept it).
    SysAdmin,
    /// `CAP_BPF`: load BPF programs and create their maps (I/O hints).
    Bpf,
    /// `CAP_PERFMON`: attach a tracing BPF program (I/O hints).
    Perfmon,
    /// `CAP_SYS_NICE`: move pages mapped by several processes (KSM pages)
    /// with `move_pages(MPOL_MF_MOVE_ALL)`.
    SysNice,
}

impl Capability {
    fn set(self) -> CapabilitySet {
        match self {
            Capability::SysPtrace => CapabilitySet::SYS_PTRACE,
            Capability::SysAdmin => CapabilitySet::SYS_ADMIN,
            Capability::Bpf => CapabilitySet::BPF,
            Capability::Perfmon => CapabilitySet::PERFMON,
            Capability::SysNice => CapabilitySet::SYS_NICE,
        }
    }

    /// The kernel's name for it.
    pub fn name(self) -> &'static str {
        match self {
            Capability::SysPtrace => "CAP_SYS_PTRACE",
            Capability::SysAdmin => "CAP_SYS_ADMIN",
            Capability::Bpf => "CAP_BPF",
            Capability::Perfmon => "CAP_PERFMON",
            Capability::SysNice => "CAP_SYS_NICE",
        }
    }
}

impl std::fmt::Display for Capability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Whether the calling thread has `cap` in its effective set. If the query
/// itself fails (it cannot for the calling thread), assume not.
pub fn has(cap: Capability) -> bool {
    capabilities(None)
        .map(|s| s.effective.contains(cap.set()))
        .unwrap_or(false)
}

/// Removes `caps` from the calling thread's effective and permitted sets,
/// irreversibly for this thread. For running an operation with fewer
/// privileges (and for testing the errors pagesift gives without them); the
/// process's other threads are not affected.
pub fn drop_from_this_thread(caps: &[Capability]) -> std::io::Result<()> {
    let mut sets = capabilities(None)?;
    for c in caps {
        sets.effective.remove(c.set());
        sets.permitted.remove(c.set());
    }
    set_capabilities(None, sets)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_the_kernels() {
        assert_eq!(Capability::SysPtrace.to_string(), "CAP_SYS_PTRACE");
        assert_eq!(Capability::SysAdmin.to_string(), "CAP_SYS_ADMIN");
    }

    #[test]
    fn dropping_in_a_thread_leaves_other_threads_alone() {
        let before = has(Capability::SysAdmin);
        let in_thread = std::thread::spawn(|| {
            drop_from_this_thread(&[Capability::SysAdmin]).unwrap();
            has(Capability::SysAdmin)
        })
        .join()
        .unwrap();
        assert!(!in_thread);
        assert_eq!(has(Capability::SysAdmin), before);
    }
}
