//! What may be run inside a target, and how each call is encoded.
//!
//! [`Syscall`] is deliberately a closed list, not "any syscall": `madvise`
//! with KSM advice, `prctl(PR_{SET,GET}_MEMORY_MERGE)`, `getpid` (a probe),
//! and the userfaultfd calls of write tracking. [`Syscall::encode`] turns a
//! call into the x86-64 number, six argument registers, and the bytes of
//! its argument struct (the ioctls), which the session writes into scratch
//! memory below the stopped thread's red zone before the call. A call may
//! take its descriptor from an earlier call of the same batch ([`Fd`]);
//! when that call failed, the dependent one is not run and its result is
//! `-ECANCELED`.
//!
//! Invariant: every call in this list is harmless on its own if the tracer
//! dies while it runs (the thread finishes it and restores itself from
//! its rescue frame), and idempotent, so a `-ERESTART*` result simply
//! runs it again. [`Syscall::validate`] refuses, before any attach, ranges
//! that are unaligned, empty or outside user space, and dependencies on a
//! later call.

/// x86-64 syscall numbers (`arch/x86/entry/syscalls/syscall_64.tbl`).
pub(super) mod nr {
    pub const READ: i64 = 0;
    pub const WRITE: i64 = 1;
    pub const POLL: i64 = 7;
    pub const PREAD64: i64 = 17;
    pub const PWRITE64: i64 = 18;
    pub const READV: i64 = 19;
    pub const WRITEV: i64 = 20;
    pub const SELECT: i64 = 23;
    pub const MADVISE: i64 = 28;
    pub const PAUSE: i64 = 34;
    pub const NANOSLEEP: i64 = 35;
    pub const GETPID: i64 = 39;
    pub const WAIT4: i64 = 61;
    pub const SEMOP: i64 = 65;
    pub const MSGSND: i64 = 69;
    pub const MSGRCV: i64 = 70;
    pub const FLOCK: i64 = 73;
    pub const RT_SIGTIMEDWAIT: i64 = 128;
    pub const RT_SIGSUSPEND: i64 = 130;
    pub const PRCTL: i64 = 157;
    pub const FUTEX: i64 = 202;
    pub const IO_GETEVENTS: i64 = 208;
    pub const RESTART_SYSCALL: i64 = 219;
    pub const SEMTIMEDOP: i64 = 220;
    pub const CLOCK_NANOSLEEP: i64 = 230;
    pub const EPOLL_WAIT: i64 = 232;
    pub const WAITID: i64 = 247;
    pub const PSELECT6: i64 = 270;
    pub const PPOLL: i64 = 271;
    pub const EPOLL_PWAIT: i64 = 281;
    pub const PREADV: i64 = 295;
    pub const PWRITEV: i64 = 296;
    pub const IO_PGETEVENTS: i64 = 333;
    pub const IO_URING_ENTER: i64 = 426;
    pub const EPOLL_PWAIT2: i64 = 441;
    pub const FUTEX_WAITV: i64 = 449;
    pub const CLOSE: i64 = 3;
    pub const IOCTL: i64 = 16;
    pub const USERFAULTFD: i64 = 323;
}

/// userfaultfd ABI (`include/uapi/linux/userfaultfd.h`), for write
/// tracking ([`crate::uffd`]).
pub mod uffd_abi {
    /// `UFFD_API`.
    pub const API: u64 = 0xAA;
    /// `UFFDIO_API = _IOWR(0xAA, 0x3F, struct uffdio_api)` (24 bytes).
    pub const UFFDIO_API: u64 = 0xc018_aa3f;
    /// `UFFDIO_REGISTER = _IOWR(0xAA, 0x00, struct uffdio_register)` (32 bytes).
    pub const UFFDIO_REGISTER: u64 = 0xc020_aa00;
    /// `UFFDIO_UNREGISTER = _IOR(0xAA, 0x01, struct uffdio_range)` (16 bytes).
    pub const UFFDIO_UNREGISTER: u64 = 0x8010_aa01;
    /// `UFFDIO_WAKE = _IOR(0xAA, 0x02, struct uffdio_range)` (16 bytes).
    pub const UFFDIO_WAKE: u64 = 0x8010_aa02;
    /// `UFFDIO_REGISTER_MODE_WP`.
    pub const MODE_WP: u64 = 1 << 1;
    /// `UFFD_FEATURE_WP_UNPOPULATED`: never-touched pages are armed too.
    pub const FEATURE_WP_UNPOPULATED: u64 = 1 << 13;
    /// `UFFD_FEATURE_WP_ASYNC`: the kernel resolves write-protect faults
    /// itself (it just unprotects the page), so nobody has to read the fd.
    pub const FEATURE_WP_ASYNC: u64 = 1 << 15;
    /// `UFFD_USER_MODE_ONLY`: lets an unprivileged target create the fd
    /// with `vm.unprivileged_userfaultfd = 0`. Kernel-mode faults would get
    /// SIGBUS/EFAULT instead of a message, but in WP async mode no fault is
    /// ever handed to the fd (`do_wp_page` unprotects the page itself), and
    /// only WP mode is registered; the tests check `read()` into a tracked
    /// page.
    pub const USER_MODE_ONLY: u64 = 1;
}

/// `PR_SET_MEMORY_MERGE` / `PR_GET_MEMORY_MERGE` (`include/uapi/linux/prctl.h`,
/// Linux 6.4+; the injection tests run both).
const PR_SET_MEMORY_MERGE: u64 = 67;
const PR_GET_MEMORY_MERGE: u64 = 68;
/// `MADV_MERGEABLE` / `MADV_UNMERGEABLE` (`include/uapi/asm-generic/mman-common.h`).
const MADV_MERGEABLE: u64 = 12;
const MADV_UNMERGEABLE: u64 = 13;

/// Kernel-internal "restart me" codes (`include/linux/errno.h`) that a
/// syscall returns when a signal interrupted it; user space never sees them
/// unless the restart logic is bypassed.
pub(super) const ERESTARTSYS: i64 = 512;
pub(super) const ERESTARTNOINTR: i64 = 513;
pub(super) const ERESTARTNOHAND: i64 = 514;
pub(super) const ERESTART_RESTARTBLOCK: i64 = 516;

pub(super) fn is_restart(ret: i64) -> bool {
    matches!(
        -ret,
        ERESTARTSYS | ERESTARTNOINTR | ERESTARTNOHAND | ERESTART_RESTARTBLOCK
    )
}

/// KSM advice for a range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Advice {
    /// `MADV_MERGEABLE`: ksmd may merge the range's pages (sets `mg`).
    Mergeable,
    /// `MADV_UNMERGEABLE`: unmerge every merged page of the range (walks
    /// it: 0.8 ms per resident 16 MiB, measured) and clear `mg`.
    Unmergeable,
}

/// A file-descriptor argument of an injected call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fd {
    /// This descriptor number of the target.
    Number(i32),
    /// The descriptor returned by call `n` (an earlier call of the same
    /// batch). If that call failed, this one is not run and its result is
    /// `-ECANCELED`.
    ResultOf(usize),
    /// This descriptor number, but only if call `n` of the same batch
    /// succeeded (else `-ECANCELED`, not run): "close it if it proved to be
    /// a userfaultfd".
    NumberIfOk(i32, usize),
}

/// `ECANCELED`: the result of a call not run because the call it depends
/// on failed.
pub const ECANCELED: i64 = 125;

/// A call pagesift may inject. Deliberately not "any syscall": only these
/// are ever run inside another process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Syscall {
    /// `madvise(addr, len, advice)`. `addr` and `len` must be page-aligned
    /// and the range must have no holes (else `-ENOMEM`). A sub-range of a
    /// VMA splits it, which counts against `vm.max_map_count`.
    Madvise {
        /// First address.
        addr: u64,
        /// Length in bytes.
        len: u64,
        /// The advice.
        advice: Advice,
    },
    /// `prctl(PR_SET_MEMORY_MERGE, on)`: every compatible VMA of the process,
    /// present and future, mergeable (or none); inherited across fork and
    /// kept across execve (since Linux 6.7).
    SetMemoryMerge(bool),
    /// `prctl(PR_GET_MEMORY_MERGE)`: 1 if set, 0 if not.
    GetMemoryMerge,
    /// `getpid()`: does nothing; returns the target's pid. A probe, and the
    /// baseline for measuring injection cost.
    Getpid,
    /// `userfaultfd(O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY)`: a new
    /// userfaultfd in the target; returns the descriptor.
    Userfaultfd,
    /// `ioctl(fd, UFFDIO_API, {UFFD_API, features})`. The struct is written
    /// into scratch memory below the stopped thread's stack red zone.
    UffdApi {
        /// The userfaultfd.
        fd: Fd,
        /// `UFFD_FEATURE_*` bits requested.
        features: u64,
    },
    /// `ioctl(fd, UFFDIO_REGISTER, {addr, len, mode})`. `-EBUSY` when the
    /// range is already registered with another userfaultfd.
    UffdRegister {
        /// The userfaultfd.
        fd: Fd,
        /// First address (page-aligned).
        addr: u64,
        /// Length in bytes (page-aligned).
        len: u64,
        /// `UFFDIO_REGISTER_MODE_*` bits.
        mode: u64,
    },
    /// `ioctl(fd, UFFDIO_UNREGISTER, {addr, len})`: ends the registration
    /// and drops the range's write-protect bits.
    UffdUnregister {
        /// The userfaultfd.
        fd: Fd,
        /// First address (page-aligned).
        addr: u64,
        /// Length in bytes (page-aligned).
        len: u64,
    },
    /// `ioctl(fd, UFFDIO_WAKE, {addr, len})`: wakes threads waiting on
    /// faults of the range, of which a write-tracking userfaultfd has none
    /// (its registrations are asynchronous, nothing ever waits). It checks
    /// only that the range is page-aligned user space, not that it is
    /// mapped, so its success proves that `fd` is an initialised
    /// userfaultfd even when every range registered with it is gone: the
    /// proof a `close` of that number waits for ([`Fd::NumberIfOk`]).
    UffdWake {
        /// The userfaultfd.
        fd: Fd,
        /// First address (page-aligned).
        addr: u64,
        /// Length in bytes (page-aligned).
        len: u64,
    },
    /// `close(fd)`. Only for descriptors pagesift opened in the target.
    Close(Fd),
}

impl Syscall {
    #[cfg(test)]
    fn number_and_args(&self) -> (i64, [u64; 6]) {
        let (n, a, _) = self.encode(&[], 0).expect("no dependency");
        (n, a)
    }

    /// The syscall number, its arguments and the bytes to write at
    /// `scratch` first (the ioctl structs). `results` are the earlier calls'
    /// results; `Err(-ECANCELED)` when a call this one depends on failed.
    pub(super) fn encode(
        &self,
        results: &[i64],
        scratch: u64,
    ) -> Result<(i64, [u64; 6], Vec<u8>), i64> {
        let fd = |f: Fd| -> Result<u64, i64> {
            let ok = |i: usize| results.get(i).is_some_and(|&r| r >= 0);
            match f {
                Fd::Number(n) => Ok(n as u64),
                Fd::ResultOf(i) if ok(i) => Ok(results[i] as u64),
                Fd::NumberIfOk(n, i) if ok(i) => Ok(n as u64),
                _ => Err(-ECANCELED),
            }
        };
        let words = |w: &[u64]| w.iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<u8>>();
        use uffd_abi::*;
        Ok(match *self {
            Syscall::Userfaultfd => {
                let flags = libc::O_CLOEXEC as u64 | libc::O_NONBLOCK as u64 | USER_MODE_ONLY;
                (nr::USERFAULTFD, [flags, 0, 0, 0, 0, 0], vec![])
            }
            Syscall::UffdApi { fd: f, features } => (
                nr::IOCTL,
                [fd(f)?, UFFDIO_API, scratch, 0, 0, 0],
                words(&[API, features, 0]),
            ),
            Syscall::UffdRegister {
                fd: f,
                addr,
                len,
                mode,
            } => (
                nr::IOCTL,
                [fd(f)?, UFFDIO_REGISTER, scratch, 0, 0, 0],
                words(&[addr, len, mode, 0]),
            ),
            Syscall::UffdUnregister { fd: f, addr, len } => (
                nr::IOCTL,
                [fd(f)?, UFFDIO_UNREGISTER, scratch, 0, 0, 0],
                words(&[addr, len]),
            ),
            Syscall::UffdWake { fd: f, addr, len } => (
                nr::IOCTL,
                [fd(f)?, UFFDIO_WAKE, scratch, 0, 0, 0],
                words(&[addr, len]),
            ),
            Syscall::Close(f) => (nr::CLOSE, [fd(f)?, 0, 0, 0, 0, 0], vec![]),
            _ => {
                let (n, a) = self.plain();
                (n, a, vec![])
            }
        })
    }

    fn plain(&self) -> (i64, [u64; 6]) {
        match *self {
            Syscall::Madvise { addr, len, advice } => {
                let a = match advice {
                    Advice::Mergeable => MADV_MERGEABLE,
                    Advice::Unmergeable => MADV_UNMERGEABLE,
                };
                (nr::MADVISE, [addr, len, a, 0, 0, 0])
            }
            Syscall::SetMemoryMerge(on) => {
                (nr::PRCTL, [PR_SET_MEMORY_MERGE, on as u64, 0, 0, 0, 0])
            }
            Syscall::GetMemoryMerge => (nr::PRCTL, [PR_GET_MEMORY_MERGE, 0, 0, 0, 0, 0]),
            Syscall::Getpid => (nr::GETPID, [0; 6]),
            _ => unreachable!("encoded by `encode`"),
        }
    }

    /// Whether the call can split VMAs (a `madvise` on part of a VMA).
    pub fn may_split(&self) -> bool {
        matches!(
            self,
            Syscall::Madvise { .. } | Syscall::UffdRegister { .. } | Syscall::UffdUnregister { .. }
        )
    }

    pub(super) fn validate(&self, index: usize) -> Result<(), String> {
        let dep = match *self {
            Syscall::UffdApi { fd, .. }
            | Syscall::UffdRegister { fd, .. }
            | Syscall::UffdUnregister { fd, .. }
            | Syscall::UffdWake { fd, .. }
            | Syscall::Close(fd) => match fd {
                Fd::ResultOf(i) | Fd::NumberIfOk(_, i) => Some(i),
                Fd::Number(_) => None,
            },
            _ => None,
        };
        if dep.is_some_and(|i| i >= index) {
            return Err(format!("call {index} depends on a later call"));
        }
        let range = match *self {
            Syscall::Madvise { addr, len, .. }
            | Syscall::UffdRegister { addr, len, .. }
            | Syscall::UffdUnregister { addr, len, .. }
            | Syscall::UffdWake { addr, len, .. } => Some((addr, len)),
            _ => None,
        };
        if let Some((addr, len)) = range {
            let page = crate::PAGE_SIZE;
            if addr % page != 0 || len % page != 0 {
                return Err(format!(
                    "madvise range {addr:#x}+{len:#x} is not page-aligned"
                ));
            }
            if len == 0 {
                return Err("madvise of an empty range".into());
            }
            // The x86-64 user address space ends below 2^47 (4-level paging)
            // or 2^56 (5-level); anything past that is a caller's bug.
            if addr.checked_add(len).is_none_or(|end| end > 1 << 56) {
                return Err(format!(
                    "madvise range {addr:#x}+{len:#x} is outside user space"
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inject::{InjectConfig, InjectError, Injector};

    #[test]
    fn calls_encode_as_the_kernel_expects() {
        let m = Syscall::Madvise {
            addr: 0x1000,
            len: 0x2000,
            advice: Advice::Mergeable,
        };
        assert_eq!(m.number_and_args(), (28, [0x1000, 0x2000, 12, 0, 0, 0]));
        let u = Syscall::Madvise {
            addr: 0x1000,
            len: 0x2000,
            advice: Advice::Unmergeable,
        };
        assert_eq!(u.number_and_args().1[2], 13);
        assert_eq!(
            Syscall::SetMemoryMerge(true).number_and_args(),
            (157, [67, 1, 0, 0, 0, 0])
        );
        assert_eq!(Syscall::GetMemoryMerge.number_and_args().1[0], 68);
        assert_eq!(Syscall::Getpid.number_and_args().0, 39);
        // The numbers agree with libc's table for this target.
        assert_eq!(nr::MADVISE, libc::SYS_madvise);
        assert_eq!(nr::PRCTL, libc::SYS_prctl);
        assert_eq!(nr::EPOLL_WAIT, libc::SYS_epoll_wait);
        assert_eq!(nr::CLOCK_NANOSLEEP, libc::SYS_clock_nanosleep);
        assert_eq!(nr::FUTEX_WAITV, libc::SYS_futex_waitv);
        assert_eq!(MADV_MERGEABLE, libc::MADV_MERGEABLE as u64);
        assert!(m.may_split() && !Syscall::SetMemoryMerge(true).may_split());
        // UFFDIO_WAKE: the uffdio_range struct in scratch, after a proof.
        let w = Syscall::UffdWake {
            fd: Fd::Number(7),
            addr: 0x4000,
            len: 0x1000,
        };
        let (n, a, bytes) = w.encode(&[], 0x9000).unwrap();
        assert_eq!((n, a), (16, [7, 0x8010_aa02, 0x9000, 0, 0, 0]));
        assert_eq!(bytes.len(), 16);
        assert!(!w.may_split());
        let close = Syscall::Close(Fd::NumberIfOk(7, 0));
        assert_eq!(close.encode(&[0], 0).unwrap().1[0], 7);
        assert_eq!(close.encode(&[-22], 0).unwrap_err(), -ECANCELED);
    }

    #[test]
    fn bad_ranges_are_refused() {
        let mk = |addr, len| Syscall::Madvise {
            addr,
            len,
            advice: Advice::Mergeable,
        };
        assert!(mk(0x1000, 0x1000).validate(0).is_ok());
        assert!(mk(0x1001, 0x1000).validate(0).is_err());
        assert!(mk(0x1000, 0x10).validate(0).is_err());
        assert!(mk(0x1000, 0).validate(0).is_err());
        assert!(mk(u64::MAX - 0xfff, 0x2000).validate(0).is_err());
        let mut inj = Injector::new(InjectConfig::default());
        let err = inj.run(1, &[Syscall::Getpid, mk(3, 4096)]).unwrap_err();
        assert!(
            matches!(err, InjectError::InvalidCall { index: 1, .. }),
            "{err}"
        );
    }

    #[test]
    fn restart_codes() {
        for r in [-512, -513, -514, -516] {
            assert!(is_restart(r));
        }
        for r in [0, 1, -4, -515, 512] {
            assert!(!is_restart(r));
        }
    }
}
