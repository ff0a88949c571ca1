//! The injector's only access to a target's memory, through
//! `process_vm_readv` / `process_vm_writev` (ptrace attach access, which
//! the seize already needs).
//!
//! Reads: the executable mappings, searched for the gadgets, and the stack
//! bytes under the stopped thread's red zone before the rescue frame is
//! written over them. Writes: the rescue frame and the scratch structs of
//! the calls, in that same stack area, and at the end the saved bytes put
//! back. Nothing else of the target is ever written. A short transfer (the
//! range crossed into unmapped memory) is an error, so a caller never acts
//! on half a buffer.

use crate::error::libc_errno;
use nix::sys::uio::{RemoteIoVec, process_vm_readv, process_vm_writev};
use nix::unistd::Pid;
use std::io;

/// Reads `buf.len()` bytes of `pid` at `addr` (`process_vm_readv`).
pub(super) fn read_remote(pid: u32, addr: u64, buf: &mut [u8]) -> io::Result<()> {
    let len = buf.len();
    let n = process_vm_readv(
        pid_of(pid),
        &mut [io::IoSliceMut::new(buf)],
        &[at(addr, len)],
    )?;
    whole(n, len)
}

/// Writes `buf` into `pid` at `addr` (`process_vm_writev`).
pub(super) fn write_remote(pid: u32, addr: u64, buf: &[u8]) -> io::Result<()> {
    let len = buf.len();
    let n = process_vm_writev(pid_of(pid), &[io::IoSlice::new(buf)], &[at(addr, len)])?;
    whole(n, len)
}

fn pid_of(pid: u32) -> Pid {
    Pid::from_raw(pid as i32)
}

/// The one remote range of a transfer.
fn at(addr: u64, len: usize) -> RemoteIoVec {
    RemoteIoVec {
        base: addr as usize,
        len,
    }
}

/// A short transfer is an error (see the module header).
fn whole(done: usize, len: usize) -> io::Result<()> {
    if done == len {
        Ok(())
    } else {
        Err(io::Error::from_raw_os_error(libc_errno::EIO))
    }
}
