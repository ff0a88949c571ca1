//! Read-ahead on another process's open file.
//!
//! Singleton turns host read-ahead off for the guests' images (§3.3): pages
//! read ahead on the host are pages the guest never asked for, and, in a
//! large folio, they keep the pages the guest does hold from being dropped
//! (a folio goes whole or not at all). `pidfd_getfd(2)` gives this process a
//! descriptor of the *same open file description* as the target's `fd`, so
//! `posix_fadvise(POSIX_FADV_RANDOM)` on it sets the description's random
//! mode for the target too: its reads then bring in exactly the pages asked
//! for, as order-0 folios. `POSIX_FADV_NORMAL` restores the default. The
//! advice changes no data, only which pages the kernel reads; it stays on
//! the description until it is restored, including after pagesift exits,
//! which is why the scrubber only sets it when the operator asks
//! (`scrub.host_readahead = false`) and restores it when it stops.
//!
//! Needs ptrace attach access to the target (`CAP_SYS_PTRACE`).

use crate::error::LinuxError;

/// Sets (`random`) or clears the random-access mode of descriptor `fd` of
/// `pid`.
pub fn set_random(pid: u32, fd: u32, random: bool) -> Result<(), LinuxError> {
    use rustix::process::{Pid, PidfdFlags, PidfdGetfdFlags, pidfd_getfd, pidfd_open};
    let io = |what: &str, e: rustix::io::Errno| match e {
        rustix::io::Errno::SRCH => LinuxError::Gone(pid),
        e => LinuxError::io(format!("{what} (pid {pid}, fd {fd})"), e.into()),
    };
    let p = Pid::from_raw(pid as i32).ok_or(LinuxError::NoSuchProcess(pid))?;
    let pidfd = pidfd_open(p, PidfdFlags::empty()).map_err(|e| io("pidfd_open", e))?;
    let file = pidfd_getfd(&pidfd, fd as i32, PidfdGetfdFlags::empty())
        .map_err(|e| io("pidfd_getfd", e))?;
    let advice = if random {
        rustix::fs::Advice::Random
    } else {
        rustix::fs::Advice::Normal
    };
    rustix::fs::fadvise(&file, 0, None, advice).map_err(|e| io("posix_fadvise", e))
}
