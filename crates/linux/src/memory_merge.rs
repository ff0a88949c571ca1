//! `PR_SET_MEMORY_MERGE` on the calling process (Linux 6.4+, prctl 67/68).
//!
//! Setting it makes every KSM-compatible VMA of the process mergeable, and
//! every VMA it creates later; the flag is inherited across fork and kept
//! across execve (6.7+, and scanned after exec since 6.10; mainline-ksm.md
//! §2.2). `pagesift exec` sets it and then executes the command, for hosts
//! where ptrace injection is not allowed.
//!
//! Neither `rustix` nor `nix` wraps these two prctl options, so this module
//! calls `libc::prctl` itself: the only `unsafe` here, with its `SAFETY`
//! comments.
#![allow(unsafe_code)]

use nix::libc;
use std::io;

/// `PR_SET_MEMORY_MERGE`.
pub const PR_SET_MEMORY_MERGE: i32 = 67;
/// `PR_GET_MEMORY_MERGE`.
pub const PR_GET_MEMORY_MERGE: i32 = 68;

/// Turns merge-any on or off for the calling process. Turning it off
/// unmerges every merged page of the process (a copy each).
///
/// Errors: `EINVAL` on kernels without the option (before 6.4) or without
/// CONFIG_KSM.
pub fn set(on: bool) -> io::Result<()> {
    // SAFETY: prctl(PR_SET_MEMORY_MERGE, arg2, 0, 0, 0) takes plain integer
    // arguments (the kernel requires arg3..arg5 to be 0) and touches no
    // memory of ours.
    let r = unsafe {
        libc::prctl(
            PR_SET_MEMORY_MERGE,
            libc::c_ulong::from(on),
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether merge-any is set for the calling process.
pub fn get() -> io::Result<bool> {
    // SAFETY: prctl(PR_GET_MEMORY_MERGE, 0, 0, 0, 0) takes plain integer
    // arguments, touches no memory of ours and returns 0 or 1.
    let r = unsafe {
        libc::prctl(
            PR_GET_MEMORY_MERGE,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r == 1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_test_process_does_not_merge_by_default() {
        // Setting it is tested through `pagesift exec`, in a child, so the
        // test process itself never becomes mergeable.
        assert!(!super::get().unwrap());
    }
}
