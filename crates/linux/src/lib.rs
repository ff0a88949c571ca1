//! # pagesift-linux: live processes as a `MemorySource`
//!
//! Every syscall, `/proc` and `/sys` access of pagesift lives in this crate;
//! the algorithms in `pagesift-core` only see the
//! [`MemorySource`](pagesift_core::source::MemorySource) trait. The
//! crate never changes what its targets' memory holds. What it changes in
//! a target, by remote syscall injection ([`inject`]), is KSM advice on its
//! mappings and userfaultfd write-protection ([`uffd`]); the only bytes it
//! writes into a target are the injector's rescue frame and argument
//! structs, in the stopped thread's stack below its red zone, and those
//! bytes are put back before the thread resumes. KSM's global state is
//! changed only through [`ksm::KsmGuard`], which restores it.
//!
//! ## How a page is reached, before the code
//!
//! 1. **Discover** ([`discover`]). Processes come from `/proc` (filters by
//!    pid, comm, uid and cgroup; pagesift's own process is never listed).
//!    Their VMAs come from `/proc/PID/smaps`, parsed by the `procfs` crate;
//!    only the VMAs that KSM could merge are kept (`ksm_compatible()` in
//!    `mm/ksm.c`: private, not hugetlb, not PFNMAP/IO/MIXEDMAP, not
//!    DONTEXPAND, not DROPPABLE). Private file mappings are kept too, but
//!    only their COWed (anonymous) pages are candidates.
//! 2. **Look without touching** ([`pagemap`], [`kpageflags`], [`inspect`]).
//!    `/proc/PID/pagemap` says, per virtual page, whether it is present and
//!    which frame (PFN) backs it; `/proc/kpageflags` says, per frame, whether
//!    it is the zero page, a KSM page or part of a THP. `PAGEMAP_SCAN` finds
//!    present runs of a large sparse VMA in one ioctl. None of these fault a
//!    page in.
//! 3. **Read** ([`read`]). Only pages known to be present are read. A
//!    remote read of a non-present page would *fault it in* in the target:
//!    it maps the zero page and allocates page tables there (verified on
//!    this machine). Exclusively mapped pages are read with
//!    `process_vm_readv`, many whole pages per call (up to `IOV_MAX`
//!    iovecs, contiguous pages coalesced). Pages shared with another
//!    process (after fork) or possibly merged by KSM are read through
//!    `/proc/PID/mem` instead: `process_vm_readv` pins pages, and pinning a
//!    shared anonymous page makes the kernel copy it in the target (measured
//!    here, see [`read`]). [`LinuxSource`] re-checks presence and
//!    exclusivity right before each read. Every read marks its pages used
//!    in the LRU; [`read_record`] remembers which, for NUMA placement.
//! 4. **Present it to the core** ([`source`]). [`LinuxSource`] maps VMAs to
//!    stable [`RegionId`](pagesift_core::RegionId)s and implements the trait.
//!
//! ## Privileges
//!
//! Reading another process's memory (`process_vm_readv`, `/proc/PID/mem`)
//! needs ptrace *attach* access: `CAP_SYS_PTRACE` for a process of another
//! user or with capabilities the caller lacks. Its smaps and pagemap need
//! ptrace *read* access, which `CAP_SYS_ADMIN` or `CAP_PERFMON` also grant
//! (observed on this kernel). PFNs in pagemap are only shown with
//! `CAP_SYS_ADMIN`, and `/proc/kpageflags` is root-only. A missing
//! capability is reported by name ([`LinuxError::MissingCapability`]).
//!
//! ## Advising a process
//!
//! 5. **Inject** ([`inject`], x86-64). `process_madvise` refuses KSM advice
//!    for another process, so [`inject::Injector`] stops one thread of the
//!    target with ptrace and makes it run `madvise(MADV_MERGEABLE /
//!    MADV_UNMERGEABLE)` or `prctl(PR_SET_MEMORY_MERGE)` itself, restoring
//!    it exactly afterwards (docs/reliability.md).
//!
//! 6. **Track writes** ([`uffd`]): userfaultfd write-protect in async
//!    mode, registered by injection and queried with `PAGEMAP_SCAN`, tells
//!    which candidate pages were written, without merging them first.
//!
//! 7. **Hear about I/O** ([`iohint`], x86-64): a BPF program on the
//!    syscall exit reports the whole pages of the user buffers that reads
//!    and writes of the eligible processes just filled (or wrote out), the
//!    XLH dissertation's I/O hints.
//! 8. **Scrub the host page cache** (Singleton): [`disk_images`] finds the
//!    files a guest's QEMU process has open read-write, [`page_cache`]
//!    finds which of their pages are cached, reads them without I/O and
//!    drops them, [`folio`] finds the folio and dirty/writeback state of a
//!    cached page, [`guest_ram`] reads the guest's RAM to match against,
//!    and [`memcg`] reads the memory cgroup limit a guest lives under.
//!
//! All `unsafe` code is in [`sys`] and [`ptrace`], each block with a
//! `// SAFETY:` comment.

pub mod access_marks;
pub mod caps;
pub mod discover;
pub mod disk_images;
pub mod error;
pub mod folio;
pub mod guest_ram;
pub mod host;
#[cfg(target_arch = "x86_64")]
pub mod inject;
pub mod inspect;
#[cfg(target_arch = "x86_64")]
pub mod iohint;
pub mod kpageflags;
pub mod ksm;
pub mod memcg;
pub mod numa;
pub mod page_cache;
pub mod pagemap;
pub mod proc;
pub mod procstat;
#[cfg(target_arch = "x86_64")]
pub mod ptrace;
pub mod read;
pub mod read_record;
pub mod readahead;
pub mod renewal;
pub mod secure;
pub mod source;
pub mod sys;
#[cfg(target_arch = "x86_64")]
pub mod uffd;
pub mod vma_counts;
pub mod vma_query;
pub mod wait;

pub use caps::Capability;
pub use discover::{ProcessFilter, ProcessInfo, Region, RegionKind};
pub use error::LinuxError;
pub use inspect::{PageClass, PageInfo, PageInspector};
pub use read::{PageBuffer, RemoteReader};
pub use source::{LinuxSource, SourceConfig};

/// Bytes in a base page (x86-64 and arm64 4K kernels; pagesift assumes it).
pub const PAGE_SIZE: u64 = pagesift_core::PAGE_SIZE as u64;

/// pagesift's own pid: never listed, never read.
pub fn own_pid() -> u32 {
    std::process::id()
}
