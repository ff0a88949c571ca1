//! `PR_SET_MEMORY_MERGE` for pagesift's own process and its children.
//!
//! With it on, every compatible VMA of the process, present and future,
//! is mergeable, and children inherit it across fork (and exec since
//! 6.7). The `prctl` calls themselves are in [`crate::sys`], with the
//! crate's other `unsafe` code; the daemon sets it in *other* processes by
//! injection ([`crate::inject`]).

use std::io;
use std::process::Command;

/// Has every process `cmd` spawns start with `PR_SET_MEMORY_MERGE` on: all
/// its anonymous private memory is mergeable, and its children inherit it;
/// since 6.7 it survives exec. The child fails to spawn if the prctl fails.
pub fn with_memory_merge(cmd: &mut Command) -> &mut Command {
    crate::sys::prctl::merge_any_before_exec(cmd)
}

/// Turns `PR_SET_MEMORY_MERGE` on or off for the calling process (off
/// unmerges its merged pages). For `pagesift exec`, which sets it and then
/// execs.
pub fn set_memory_merge(enable: bool) -> io::Result<()> {
    crate::sys::prctl::set_memory_merge(enable)
}

/// `PR_GET_MEMORY_MERGE` of the calling process.
pub fn memory_merge() -> io::Result<bool> {
    crate::sys::prctl::get_memory_merge()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_memory_merge_is_off() {
        // The test binary never asked for it.
        assert!(!memory_merge().unwrap());
    }
}
