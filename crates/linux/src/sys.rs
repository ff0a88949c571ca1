//! Thin wrappers over syscalls that the well-kept crates (`nix`, `rustix`)
//! expose only as `unsafe fn`, or not at all. With [`crate::ptrace`] (the
//! raw ptrace requests), this is all the `unsafe` code of pagesift's
//! libraries; the injection tests' target program and one injection test
//! make a few raw `libc` calls of their own. Every block carries a
//! `// SAFETY:` comment (`clippy::undocumented_unsafe_blocks` is denied).
//!
//! - [`pagemap_scan`]: the `PAGEMAP_SCAN` ioctl on `/proc/PID/pagemap`
//!   (Linux 6.7+), which reports runs of pages by category (present,
//!   zero-PFN, file, THP) without faulting anything in.
//! - [`pagemap_scan_written`]: the same ioctl with `PM_SCAN_WP_MATCHING`,
//!   which reports pages written since they were last write-protected by
//!   userfaultfd and protects them again (write tracking, [`crate::uffd`]).
//! - [`procmap_query`]: the `PROCMAP_QUERY` ioctl on `/proc/PID/maps`
//!   (Linux 6.11+), one VMA at or after an address, filtered by
//!   permission in the kernel ([`crate::vma_query`]).
//! - [`same_file`]: `kcmp(KCMP_FILE)`, which rustix does not wrap.
//! - [`uffd_api`]: the `UFFDIO_API` handshake on a userfaultfd.
//! - [`move_pages`] and [`bind_memory`] (`set_mempolicy`): NUMA placement,
//!   which neither crate wraps.
//! - [`AnonMapping`]: a private anonymous mapping, used by
//!   `pagesift-workload` to build reproducible memory patterns.
//! - [`fork_single_threaded`]: `fork(2)`, refused unless the caller has
//!   exactly one thread (the only case in which the child may run arbitrary
//!   code), used by the workload's fork family.
//!
//! - [`advise_huge_pages`]: `MADV_HUGEPAGE` on a large buffer of this
//!   process (the exact scan's group tables), fewer first-touch faults.
//! - [`KindMapping`]: shared, droppable, hugetlb and file mappings, for
//!   the discovery tests that check how each kind of VMA is classified.
//! - [`prctl`]: `PR_SET_MEMORY_MERGE` for `pagesift exec` and for test
//!   children made mergeable before exec.
//! - [`die_with_parent_before_exec`]: `PR_SET_PDEATHSIG` in a child before
//!   exec, so that `pagesift bench`'s workloads and daemons die with it.
//!
//! - [`cachestat`]: `cachestat(2)` (Linux 6.5+, syscall 451 on x86-64),
//!   page-cache counts of a file range, which libc does not wrap.
//! - [`FileMapping`]: a read-only shared mapping of a file range, for
//!   `mincore` (which pages are cached, without reading the disk) and for
//!   finding the frames of cached pages through our own pagemap
//!   ([`crate::page_cache`], [`crate::folio`]).
//!
//! Everything else (process_vm_readv, capget, kill) has safe wrappers
//! in `nix`/`rustix` and is called directly by the modules that need it.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::process::Command;
use std::ptr::NonNull;

/// `struct page_region` of `<linux/fs.h>`: one run of pages with the same
/// categories.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageRegion {
    /// First address of the run.
    pub start: u64,
    /// End address of the run (exclusive).
    pub end: u64,
    /// `PAGE_IS_*` bits of every page in the run (masked by `return_mask`).
    pub categories: u64,
}

/// `struct pm_scan_arg` of `<linux/fs.h>`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct PmScanArg {
    size: u64,
    flags: u64,
    start: u64,
    end: u64,
    walk_end: u64,
    vec: u64,
    vec_len: u64,
    max_pages: u64,
    category_inverted: u64,
    category_mask: u64,
    category_anyof_mask: u64,
    return_mask: u64,
}

/// `struct uffdio_api` (`include/uapi/linux/userfaultfd.h`).
#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

/// `struct procmap_query` of `<linux/fs.h>` (Linux 6.11+), 104 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
struct ProcmapQueryArg {
    size: u64,
    query_flags: u64,
    query_addr: u64,
    vma_start: u64,
    vma_end: u64,
    vma_flags: u64,
    vma_page_size: u64,
    vma_offset: u64,
    inode: u64,
    dev_major: u32,
    dev_minor: u32,
    vma_name_size: u32,
    build_id_size: u32,
    vma_name_addr: u64,
    build_id_addr: u64,
}

/// The raw ioctls, kept private: only [`pagemap_scan`], [`procmap_query`]
/// and [`uffd_api`] call them.
mod raw {
    // PAGEMAP_SCAN = _IOWR('f', 16, struct pm_scan_arg) (<linux/fs.h>).
    nix::ioctl_readwrite!(pagemap_scan_ioctl, b'f', 16, super::PmScanArg);
    // PROCMAP_QUERY = _IOWR('f', 17, struct procmap_query) (<linux/fs.h>).
    nix::ioctl_readwrite!(procmap_query_ioctl, b'f', 17, super::ProcmapQueryArg);
    // UFFDIO_API = _IOWR(0xAA, 0x3F, struct uffdio_api).
    nix::ioctl_readwrite!(uffdio_api_ioctl, 0xAA, 0x3F, super::UffdioApi);
}

/// `UFFDIO_API` with `features` on userfaultfd `fd`: the handshake that
/// makes a new userfaultfd answer its other ioctls. The context is the
/// open file's, not the process's: done on a duplicate of a descriptor in
/// another process (`pidfd_getfd`), it completes that descriptor's
/// handshake (checked on this machine: a child's `UFFDIO_API` on an
/// inherited descriptor made `UFFDIO_WAKE` work in the parent). Write
/// tracking ([`crate::uffd`]) uses it for a descriptor it opened in a
/// target whose handshake did not run. Fails with `EINVAL` if the
/// handshake was done already.
pub fn uffd_api(fd: BorrowedFd<'_>, features: u64) -> io::Result<()> {
    let mut arg = UffdioApi {
        api: crate::inject::uffd_abi::API,
        features,
        ioctls: 0,
    };
    // SAFETY: `arg` is a live, exclusively borrowed `repr(C)`
    // `uffdio_api`, the struct this ioctl number reads and writes, and
    // `fd` is an open descriptor for the call's duration. The handshake
    // changes only the userfaultfd's own context (its features), nothing
    // of any process's memory.
    unsafe { raw::uffdio_api_ioctl(fd.as_raw_fd(), &mut arg) }.map_err(io::Error::from)?;
    Ok(())
}

/// Which pages a [`pagemap_scan`] reports, in the kernel's terms: a page
/// matches when all `required` categories are set and none of `excluded`.
#[derive(Clone, Copy, Debug, Default)]
pub struct ScanQuery {
    /// `PAGE_IS_*` bits that must be set.
    pub required: u64,
    /// `PAGE_IS_*` bits that must be clear.
    pub excluded: u64,
    /// `PAGE_IS_*` bits reported in [`PageRegion::categories`]; runs are
    /// split where these differ.
    pub returned: u64,
    /// Stop after this many matching pages (0: no limit).
    pub max_pages: u64,
}

/// Runs `PAGEMAP_SCAN` over `[start, end)` of the process whose pagemap is
/// `fd`, writing matching runs into `out`. Returns the number of runs
/// written and the address where the walk stopped (`< end` when `out`
/// filled up; call again from there).
pub fn pagemap_scan(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    query: ScanQuery,
    out: &mut [PageRegion],
) -> io::Result<(usize, u64)> {
    scan(fd, start, end, query, out, 0)
}

/// `PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC` (`<linux/fs.h>`).
const PM_SCAN_WP_MATCHING: u64 = 1 << 0;
const PM_SCAN_CHECK_WPASYNC: u64 = 1 << 1;
/// `PAGE_IS_WRITTEN` (`<linux/fs.h>`): not write-protected by
/// userfaultfd, i.e. written (or never armed) since the last arming.
pub const PAGE_IS_WRITTEN: u64 = 1 << 1;

/// Reports the runs of pages in `[start, end)` written since they were last
/// write-protected, and write-protects them again, in one `PAGEMAP_SCAN`
/// (`PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC`). The
/// range must be registered with userfaultfd in write-protect *async* mode
/// by its owner (else `EPERM`): the kernel then resolves the target's next
/// write fault itself, so arming never blocks the target. Returns the runs
/// written into `out` and where the walk stopped (`< end`: call again).
pub fn pagemap_scan_written(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    out: &mut [PageRegion],
) -> io::Result<(usize, u64)> {
    let query = ScanQuery {
        required: PAGE_IS_WRITTEN,
        excluded: 0,
        returned: PAGE_IS_WRITTEN,
        max_pages: 0,
    };
    scan(
        fd,
        start,
        end,
        query,
        out,
        PM_SCAN_WP_MATCHING | PM_SCAN_CHECK_WPASYNC,
    )
}

fn scan(
    fd: BorrowedFd<'_>,
    start: u64,
    end: u64,
    query: ScanQuery,
    out: &mut [PageRegion],
    flags: u64,
) -> io::Result<(usize, u64)> {
    let mut arg = PmScanArg {
        size: std::mem::size_of::<PmScanArg>() as u64,
        flags,
        start,
        end,
        walk_end: 0,
        vec: out.as_mut_ptr() as u64,
        vec_len: out.len() as u64,
        max_pages: query.max_pages,
        // A page matches when ((categories ^ inverted) & mask) == mask.
        category_inverted: query.excluded,
        category_mask: query.required | query.excluded,
        category_anyof_mask: 0,
        return_mask: query.returned,
    };
    // SAFETY: `arg` is a properly laid-out `pm_scan_arg` whose `size` field
    // tells the kernel its size; `vec`/`vec_len` describe `out`, a live,
    // exclusively borrowed buffer of `repr(C)` `page_region`s that the
    // kernel writes at most `vec_len` entries into. `flags` is 0 or, from
    // [`pagemap_scan_written`], the write-protect flags that only change
    // the uffd-wp bit of pages of a range its owner registered in async
    // mode (the kernel refuses otherwise): the target's memory is unchanged.
    let n =
        unsafe { raw::pagemap_scan_ioctl(fd.as_raw_fd(), &mut arg) }.map_err(io::Error::from)?;
    Ok((n as usize, arg.walk_end))
}

/// `PROCMAP_QUERY_VMA_*` permission bits (`<linux/fs.h>`): in a query's
/// flags, the VMA must have them; in [`QueriedVma::perms`], the ones it
/// has.
pub const PROCMAP_VMA_READABLE: u64 = 0x01;
/// See [`PROCMAP_VMA_READABLE`].
pub const PROCMAP_VMA_WRITABLE: u64 = 0x02;
/// See [`PROCMAP_VMA_READABLE`].
pub const PROCMAP_VMA_EXECUTABLE: u64 = 0x04;
/// See [`PROCMAP_VMA_READABLE`].
pub const PROCMAP_VMA_SHARED: u64 = 0x08;
/// `PROCMAP_QUERY_COVERING_OR_NEXT_VMA`: the VMA covering the address, or
/// else the next one that matches.
const PROCMAP_COVERING_OR_NEXT_VMA: u64 = 0x10;

/// One VMA as `PROCMAP_QUERY` describes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QueriedVma {
    /// First address.
    pub start: u64,
    /// End address (exclusive).
    pub end: u64,
    /// `PROCMAP_VMA_*` bits it has.
    pub perms: u64,
    /// File offset of `start` (0 for anonymous memory).
    pub offset: u64,
    /// Device of the file, major and minor (0, 0 for anonymous memory).
    pub dev: (u32, u32),
    /// Inode of the file (0 for anonymous memory).
    pub inode: u64,
    /// The name `/proc/PID/maps` prints (a path, `[heap]`, ...), or empty;
    /// cut at the buffer the caller gave.
    pub name: String,
}

/// `PROCMAP_QUERY` on `maps` (an open `/proc/PID/maps`): the first VMA
/// that covers or follows `addr` and has every `PROCMAP_VMA_*` bit of
/// `required`, its name read into `name_buf`. `Ok(None)`: there is none.
/// `ENOTTY` before Linux 6.11. The kernel finds it in its VMA tree, so a
/// query costs the same with ten VMAs or ten thousand, where reading
/// `maps` formats every one.
pub fn procmap_query(
    maps: BorrowedFd<'_>,
    addr: u64,
    required: u64,
    name_buf: &mut [u8],
) -> io::Result<Option<QueriedVma>> {
    let mut arg = ProcmapQueryArg {
        size: std::mem::size_of::<ProcmapQueryArg>() as u64,
        query_flags: required | PROCMAP_COVERING_OR_NEXT_VMA,
        query_addr: addr,
        vma_name_size: u32::try_from(name_buf.len()).unwrap_or(u32::MAX),
        vma_name_addr: name_buf.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `arg` is a live, exclusively borrowed `repr(C)`
    // `procmap_query` whose `size` field tells the kernel its size; its
    // only pointer, `vma_name_addr`, is `name_buf`, live and exclusively
    // borrowed, which the kernel writes at most `vma_name_size` bytes
    // into; `build_id_size` is 0, so no build id is written. The query
    // only reads the target's VMA tree.
    match unsafe { raw::procmap_query_ioctl(maps.as_raw_fd(), &mut arg) } {
        Ok(_) => {}
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(io::Error::from(e)),
    }
    // The kernel counts the name's terminating NUL in `vma_name_size`.
    let len = (arg.vma_name_size as usize)
        .min(name_buf.len())
        .saturating_sub(1);
    let name = String::from_utf8_lossy(&name_buf[..len]).into_owned();
    Ok(Some(QueriedVma {
        start: arg.vma_start,
        end: arg.vma_end,
        perms: arg.vma_flags,
        offset: arg.vma_offset,
        dev: (arg.dev_major, arg.dev_minor),
        inode: arg.inode,
        name,
    }))
}

/// `kcmp(pid1, pid2, KCMP_FILE, fd1, fd2) == 0`: whether descriptor `fd1` of
/// `pid1` and `fd2` of `pid2` are the same open file. Used to make sure a
/// descriptor number in another process still is the file we opened there
/// before we ask that process to close it.
pub fn same_file(pid1: u32, fd1: i32, pid2: u32, fd2: i32) -> io::Result<bool> {
    const KCMP_FILE: libc::c_long = 0;
    // SAFETY: kcmp takes only integers and reads nothing from our memory.
    let r = unsafe {
        libc::syscall(
            libc::SYS_kcmp,
            pid1 as libc::c_long,
            pid2 as libc::c_long,
            KCMP_FILE,
            fd1 as libc::c_long,
            fd2 as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r == 0)
    }
}

/// `move_pages(pid, addrs, nodes, status, flags)` (`<numaif.h>`): with
/// `nodes`, moves each page of `pid` at `addrs[i]` to node `nodes[i]`;
/// without, only asks where each page is. `status[i]` receives the node
/// the page is on afterwards, or a negative errno for that page. Returns
/// how many pages were not migrated: when the kernel's migration of the
/// collected pages fails for some, it stops there and writes no status for
/// them nor for the pages it had not tried yet (their slots keep what the
/// caller put there). Used by [`crate::numa`].
pub fn move_pages(
    pid: u32,
    addrs: &[u64],
    nodes: Option<&[i32]>,
    status: &mut [i32],
    flags: i32,
) -> io::Result<usize> {
    assert_eq!(addrs.len(), status.len());
    if let Some(n) = nodes {
        assert_eq!(n.len(), addrs.len());
    }
    // SAFETY: the kernel reads `addrs.len()` pointers from `addrs` and as
    // many ints from `nodes` (both slices are that long, checked above), and
    // writes as many ints into `status` (as long, exclusively borrowed).
    // The addresses are only looked up in `pid`'s page tables, never
    // dereferenced in ours.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_pages,
            pid as libc::c_long,
            addrs.len() as libc::c_ulong,
            addrs.as_ptr(),
            nodes.map_or(std::ptr::null(), |n| n.as_ptr()),
            status.as_mut_ptr(),
            flags as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

/// `set_mempolicy(MPOL_BIND, mask)` for the calling thread: its future
/// page allocations come only from the nodes set in `mask` (bit n = node n).
pub fn bind_memory(mask: u64) -> io::Result<()> {
    const MPOL_BIND: libc::c_long = 2;
    // SAFETY: the kernel reads one unsigned long from `&mask`, the mask's
    // bit count (64) is passed as maxnode + 1 so it reads no further.
    let r = unsafe {
        libc::syscall(
            libc::SYS_set_mempolicy,
            MPOL_BIND,
            &mask as *const u64,
            65 as libc::c_ulong,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Asks the kernel to back the 2 MiB-aligned pages inside
/// `[addr, addr + len)` of this process with transparent huge pages
/// (`MADV_HUGEPAGE`), so that a large buffer touched for the first time
/// takes one page fault per 2 MiB instead of one per 4 KiB. Contents and
/// access are unchanged, so any range is safe to advise; a range that is
/// not mapped gives an error. Returns whether some part was advised.
pub fn advise_huge_pages(addr: usize, len: usize) -> io::Result<bool> {
    let start = addr.next_multiple_of(HUGE_PAGE);
    let end = (addr + len) / HUGE_PAGE * HUGE_PAGE;
    if end <= start {
        return Ok(false);
    }
    // SAFETY: MADV_HUGEPAGE only changes how the kernel backs the range
    // (page size), never its contents or protection: no Rust object can
    // observe it.
    unsafe {
        rustix::mm::madvise(
            start as *mut _,
            end - start,
            rustix::mm::Advice::LinuxHugepage,
        )
    }?;
    Ok(true)
}

/// Whether a mapping should be backed by transparent huge pages.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HugePages {
    /// `MADV_NOHUGEPAGE`: 4 KiB pages only, whatever the THP setting.
    Never,
    /// `MADV_HUGEPAGE`, and the mapping is aligned to 2 MiB.
    Advised,
}

/// A private anonymous read-write mapping, unmapped on drop. Its untouched
/// pages are not present until written (or read, which maps the shared
/// zero page).
///
/// It is surrounded by `PROT_NONE` guard pages, so the kernel never merges
/// it with a neighbouring anonymous VMA of the same flags (glibc thread
/// stacks carry `MADV_NOHUGEPAGE` too): the VMA is exactly this mapping.
#[derive(Debug)]
pub struct AnonMapping {
    ptr: NonNull<u8>,
    len: usize,
    reserved: (usize, usize),
}

// SAFETY: the mapping is plain memory owned by this value; moving the owner
// to another thread is as safe as moving a `Vec<u8>`.
unsafe impl Send for AnonMapping {}
// SAFETY: shared access only hands out `&[u8]`, like `Vec<u8>`.
unsafe impl Sync for AnonMapping {}

const HUGE_PAGE: usize = 2 << 20;

impl AnonMapping {
    /// Maps `len` bytes (rounded up to whole pages; at least one page).
    pub fn new(len: usize, huge: HugePages) -> io::Result<AnonMapping> {
        use rustix::mm::{Advice, MapFlags, MprotectFlags, ProtFlags, mmap_anonymous, mprotect};
        let page = crate::PAGE_SIZE as usize;
        let len = len.max(1).div_ceil(page) * page;
        // Reserve guard pages on both sides, plus room to align to 2 MiB
        // for THP.
        let align = if huge == HugePages::Advised {
            HUGE_PAGE
        } else {
            page
        };
        let total = len + 2 * page + (align - page);
        // SAFETY: a fresh anonymous mapping at an address the kernel chooses
        // cannot alias any existing Rust object.
        let raw = unsafe {
            mmap_anonymous(
                std::ptr::null_mut(),
                total,
                ProtFlags::empty(),
                MapFlags::PRIVATE,
            )
        }?;
        let base = raw as usize;
        let start = (base + page).next_multiple_of(align);
        let unmap_on_error = |e: rustix::io::Errno| {
            // SAFETY: the reservation was created above and nothing refers to it.
            let _ = unsafe { rustix::mm::munmap(raw, total) };
            io::Error::from(e)
        };
        // SAFETY: `start..start+len` lies inside the reservation (at least
        // one guard page on each side) and nothing refers to it yet.
        unsafe {
            mprotect(
                start as *mut _,
                len,
                MprotectFlags::READ | MprotectFlags::WRITE,
            )
        }
        .map_err(unmap_on_error)?;
        let advice = match huge {
            HugePages::Never => Advice::LinuxNoHugepage,
            HugePages::Advised => Advice::LinuxHugepage,
        };
        // SAFETY: the range is inside our reservation; THP advice does not
        // change its contents.
        unsafe { rustix::mm::madvise(start as *mut _, len, advice) }.map_err(unmap_on_error)?;
        Ok(AnonMapping {
            ptr: NonNull::new(start as *mut u8).expect("mmap never returns null on success"),
            len,
            reserved: (base, total),
        })
    }

    /// The mapping's first address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Length in bytes (whole pages).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false: a mapping has at least one page.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Faults in the pages of `[offset, offset + len)` in one call
    /// (`MADV_POPULATE_WRITE`, or `MADV_POPULATE_READ` which maps the zero
    /// page): much cheaper than one page fault per page. Contents are not
    /// changed. The range must be page-aligned and inside the mapping.
    pub fn populate(&self, offset: usize, len: usize, write: bool) -> io::Result<()> {
        let page = crate::PAGE_SIZE as usize;
        if !offset.is_multiple_of(page)
            || !len.is_multiple_of(page)
            || offset.checked_add(len).is_none_or(|e| e > self.len)
        {
            return Err(io::Error::from_raw_os_error(
                crate::error::libc_errno::EINVAL,
            ));
        }
        let advice = if write {
            rustix::mm::Advice::LinuxPopulateWrite
        } else {
            rustix::mm::Advice::LinuxPopulateRead
        };
        // SAFETY: the range is inside our mapping (checked above); populate
        // advice only faults pages in, without changing their contents.
        unsafe { rustix::mm::madvise(self.ptr.as_ptr().add(offset).cast(), len, advice) }?;
        Ok(())
    }

    /// Splits the mapping into VMAs of `pages` pages each (the last one
    /// may be shorter) by giving every other run the opposite transparent
    /// huge page advice: the kernel keeps a VMA boundary wherever
    /// `VM_HUGEPAGE` / `VM_NOHUGEPAGE` changes. Contents and protection do
    /// not change. Returns the number of VMAs the mapping now has.
    pub fn split_vmas(&self, pages: usize) -> io::Result<usize> {
        let page = crate::PAGE_SIZE as usize;
        let run = pages.max(1) * page;
        let mut count = 0;
        let mut offset = 0;
        while offset < self.len {
            let len = run.min(self.len - offset);
            let advice = if count % 2 == 0 {
                rustix::mm::Advice::LinuxNoHugepage
            } else {
                rustix::mm::Advice::LinuxHugepage
            };
            // SAFETY: the range is inside our mapping; THP advice does not
            // change its contents.
            unsafe { rustix::mm::madvise(self.ptr.as_ptr().add(offset).cast(), len, advice) }?;
            offset += len;
            count += 1;
        }
        Ok(count)
    }

    /// The mapping's bytes. Reading an untouched page faults it in as the
    /// shared zero page.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr..ptr+len` is a live readable mapping owned by `self`
        // for the lifetime of the borrow; mapped anonymous memory is always
        // initialized (zero-filled).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The mapping's bytes, writable.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AnonMapping {
    fn drop(&mut self) {
        // SAFETY: the reservation is ours and no borrow of it outlives
        // `self`.
        let _ = unsafe { rustix::mm::munmap(self.reserved.0 as *mut _, self.reserved.1) };
    }
}

/// The kind of VMA a [`KindMapping`] makes.
#[derive(Debug, Clone, Copy)]
pub enum MappingKind<'a> {
    /// `MAP_SHARED | MAP_ANONYMOUS` (shmem).
    SharedAnonymous,
    /// `MAP_DROPPABLE | MAP_ANONYMOUS` (Linux 6.11+).
    Droppable,
    /// `MAP_PRIVATE | MAP_ANONYMOUS | MAP_HUGETLB` (needs free huge pages).
    HugetlbAnonymous,
    /// `MAP_PRIVATE` of this file, opened read-write.
    PrivateFile(BorrowedFd<'a>),
    /// `MAP_SHARED` of this file, opened read-write.
    SharedFile(BorrowedFd<'a>),
    /// `MAP_PRIVATE | MAP_ANONYMOUS`, then `MADV_MERGEABLE`.
    Mergeable,
}

/// A read-write mapping of one [`MappingKind`], every page written once
/// (so present) at creation, unmapped on drop. For tests of discovery.
#[derive(Debug)]
pub struct KindMapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl KindMapping {
    /// Maps `len` bytes (whole pages) of `kind` and writes `fill` into
    /// every byte.
    pub fn new(len: usize, kind: MappingKind<'_>, fill: u8) -> io::Result<KindMapping> {
        use rustix::mm::{MapFlags, ProtFlags, mmap, mmap_anonymous};
        let rw = ProtFlags::READ | ProtFlags::WRITE;
        let anon = |flags| {
            // SAFETY: a fresh mapping at an address the kernel chooses cannot
            // alias any existing Rust object.
            unsafe { mmap_anonymous(std::ptr::null_mut(), len, rw, flags) }
        };
        let file = |fd: BorrowedFd<'_>, flags| {
            // SAFETY: as above; the file is only mapped, not borrowed beyond
            // the call (the mapping keeps its own reference).
            unsafe { mmap(std::ptr::null_mut(), len, rw, flags, fd, 0) }
        };
        let raw = match kind {
            MappingKind::SharedAnonymous => anon(MapFlags::SHARED),
            // MAP_DROPPABLE is a mapping type of its own, like MAP_PRIVATE.
            MappingKind::Droppable => anon(MapFlags::DROPPABLE),
            MappingKind::HugetlbAnonymous => anon(MapFlags::PRIVATE | MapFlags::HUGETLB),
            MappingKind::PrivateFile(fd) => file(fd, MapFlags::PRIVATE),
            MappingKind::SharedFile(fd) => file(fd, MapFlags::SHARED),
            MappingKind::Mergeable => anon(MapFlags::PRIVATE),
        }?;
        let m = KindMapping {
            ptr: NonNull::new(raw.cast()).expect("mmap never returns null on success"),
            len,
        };
        if let MappingKind::Mergeable = kind {
            // SAFETY: the range is our fresh mapping; the advice only lets
            // ksmd merge identical pages copy-on-write.
            unsafe { rustix::mm::madvise(raw, len, rustix::mm::Advice::LinuxMergeable) }?;
        }
        // SAFETY: `ptr..ptr+len` is a live read-write mapping owned by `m`
        // and nothing else refers to it.
        unsafe { std::ptr::write_bytes(m.ptr.as_ptr(), fill, len) };
        Ok(m)
    }

    /// The mapping's first address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Its end address (exclusive).
    pub fn end(&self) -> u64 {
        self.addr() + self.len as u64
    }
}

impl Drop for KindMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and no borrow of it outlives `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// Which side of a fork we are on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forked {
    /// The parent, with the child's pid.
    Parent(u32),
    /// The child.
    Child,
}

/// `fork(2)`, only when the calling process has exactly one thread.
///
/// With one thread no lock (allocator, stdio) can be held by another thread
/// at the fork, so the child may run ordinary Rust code. Any other caller
/// gets an error instead of undefined behaviour.
pub fn fork_single_threaded() -> io::Result<Forked> {
    let threads = procfs::process::Process::myself()
        .and_then(|p| p.status())
        .map_err(|e| io::Error::other(format!("reading /proc/self/status: {e}")))?
        .threads;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    // SAFETY: the process has exactly one thread (checked above; only this
    // thread could start another, and it is here), so the child inherits no
    // lock held by a vanished thread and may run arbitrary code.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent(child.as_raw() as u32)),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
    }
}

/// Asks the kernel to SIGKILL the calling process when its parent dies, and
/// returns false if the parent has already gone (then the caller should
/// exit). Used by workload children so none outlives its test.
pub fn die_with_parent(parent: u32) -> io::Result<bool> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))?;
    Ok(rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) == Some(parent))
}

/// Sends SIGKILL to `pid`.
pub fn kill(pid: u32) -> io::Result<()> {
    let pid = rustix::process::Pid::from_raw(pid as i32)
        .ok_or_else(|| io::Error::from_raw_os_error(crate::error::libc_errno::EINVAL))?;
    rustix::process::kill_process(pid, rustix::process::Signal::KILL)?;
    Ok(())
}

/// `IOV_MAX`: the most iovecs one `process_vm_readv` accepts (`UIO_MAXIOV`,
/// 1024 on Linux).
pub fn iov_max() -> usize {
    nix::unistd::sysconf(nix::unistd::SysconfVar::IOV_MAX)
        .ok()
        .flatten()
        .map(|v| v as usize)
        .filter(|&v| v > 0)
        .unwrap_or(1024)
}

/// `prctl(2)` for `PR_SET_MEMORY_MERGE` / `PR_GET_MEMORY_MERGE`, which
/// neither `nix` nor `rustix` wraps.
pub mod prctl {
    use std::io;
    use std::os::unix::process::CommandExt;
    use std::process::Command;

    fn raw(option: libc::c_int, arg2: libc::c_ulong) -> io::Result<libc::c_int> {
        // SAFETY: PR_SET_MEMORY_MERGE and PR_GET_MEMORY_MERGE take integer
        // arguments only (arg3..arg5 must be 0, `kernel/sys.c`); no
        // pointer is passed, so no memory of ours is read or written. The
        // call is async-signal-safe (a bare syscall), as `pre_exec` needs.
        let r = unsafe { libc::prctl(option, arg2, 0 as libc::c_ulong, 0 as libc::c_ulong, 0) };
        if r < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(r)
        }
    }

    pub fn set_memory_merge(enable: bool) -> io::Result<()> {
        raw(libc::PR_SET_MEMORY_MERGE, enable as libc::c_ulong).map(|_| ())
    }

    pub fn get_memory_merge() -> io::Result<bool> {
        raw(libc::PR_GET_MEMORY_MERGE, 0).map(|r| r != 0)
    }

    pub fn merge_any_before_exec(cmd: &mut Command) -> &mut Command {
        // SAFETY: the closure runs in the forked child before exec, where
        // only async-signal-safe work is allowed: it makes one raw syscall
        // and builds an `io::Error` from errno (no allocation), and touches
        // no lock or state shared with the parent.
        unsafe { cmd.pre_exec(|| set_memory_merge(true)) }
    }
}

// ---------------------------------------------------------------------------
// Children that die with their parent (`pagesift bench`)

/// Which signal a child spawned with [`die_with_parent_before_exec`] gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DeathSignal {
    /// SIGTERM: lets the child clean up (the daemon restores KSM).
    Term,
    /// SIGKILL.
    Kill,
}

/// Has the child `cmd` spawns receive `sig` when the *thread* that spawned
/// it exits (`PR_SET_PDEATHSIG`), so a harness killed by SIGKILL leaves no
/// workload behind. Spawn from a thread that lives as long as the child
/// should (the main thread).
pub fn die_with_parent_before_exec(cmd: &mut Command, sig: DeathSignal) -> &mut Command {
    use std::os::unix::process::CommandExt;
    let sig = match sig {
        DeathSignal::Term => rustix::process::Signal::TERM,
        DeathSignal::Kill => rustix::process::Signal::KILL,
    };
    // SAFETY: the closure runs in the forked child before exec, where only
    // async-signal-safe work is allowed: it makes one raw prctl syscall
    // (rustix, no allocation, no lock) and converts its errno.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(sig)).map_err(io::Error::from)
        })
    }
}

/// `preadv(2)`: reads from `file` at `offset` into `bufs` in order (the
/// workload that reads files with the vector call XLH's guests use).
pub fn preadv(
    file: &std::fs::File,
    bufs: &mut [std::io::IoSliceMut<'_>],
    offset: u64,
) -> io::Result<usize> {
    rustix::io::preadv(file, bufs, offset).map_err(io::Error::from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_page_advice_covers_only_whole_huge_pages_and_keeps_contents() {
        let mut m = AnonMapping::new(6 << 20, HugePages::Never).unwrap();
        m.as_mut_slice()[..4096].fill(9);
        let (a, len) = (m.addr() as usize, m.len());
        // Less than 2 MiB can hold no aligned 2 MiB page, wherever the
        // mapping starts: nothing to advise. (2 MiB from `a + 4096` held
        // one whole huge page when `a` sat one page below a 2 MiB boundary.)
        assert!(!advise_huge_pages(a + 4096, HUGE_PAGE - 4096).unwrap());
        assert!(advise_huge_pages(a, len).unwrap());
        assert!(m.as_slice()[..4096].iter().all(|&b| b == 9));
        assert!(m.as_slice()[4096..8192].iter().all(|&b| b == 0));
        // An unmapped range is an error, not undefined behaviour.
        assert!(advise_huge_pages(HUGE_PAGE, HUGE_PAGE).is_err());
    }
}

/// `struct cachestat` of `<linux/mman.h>`: page-cache counts of a range.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheStat {
    /// Pages of the range in the page cache.
    pub cache: u64,
    /// Of which dirty.
    pub dirty: u64,
    /// Of which under writeback.
    pub writeback: u64,
    /// Pages evicted from the range.
    pub evicted: u64,
    /// Of which evicted recently (would still be in the cache with a
    /// little more memory).
    pub recently_evicted: u64,
}

/// `cachestat(fd, {offset, len}, &out, 0)`; `len == 0` means to the end of
/// the file. Never reads the disk. ENOSYS before Linux 6.5.
pub fn cachestat(fd: BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<CacheStat> {
    #[cfg(target_arch = "x86_64")]
    const SYS_CACHESTAT: libc::c_long = 451;
    #[cfg(not(target_arch = "x86_64"))]
    const SYS_CACHESTAT: libc::c_long = 451; // the generic table has the same number
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    let range = Range { off: offset, len };
    let mut out = CacheStat::default();
    // SAFETY: `range` and `out` are live, properly laid-out `repr(C)`
    // copies of the kernel's `cachestat_range` and `cachestat`; the kernel
    // reads the first and writes the second, nothing else; flags is 0.
    let r = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd.as_raw_fd() as libc::c_long,
            &range as *const Range,
            &mut out as *mut CacheStat,
            0 as libc::c_long,
        )
    };
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(out)
    }
}

/// A read-only shared mapping (`PROT_READ`, `MAP_SHARED`) of
/// `[offset, offset + len)` of a file, unmapped on drop. It is only read
/// through [`resident`](Self::resident) (`mincore`, which never faults) and
/// [`touch`](Self::touch). It must cover only bytes below the file's end:
/// touching a page past the end raises SIGBUS.
#[derive(Debug)]
pub struct FileMapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl FileMapping {
    /// Maps `len` bytes (a multiple of the page size, > 0) from page-aligned
    /// `offset` of the file open as `fd`.
    pub fn new(fd: BorrowedFd<'_>, offset: u64, len: usize) -> io::Result<FileMapping> {
        use rustix::mm::{MapFlags, ProtFlags, mmap};
        if len == 0
            || !len.is_multiple_of(crate::PAGE_SIZE as usize)
            || !offset.is_multiple_of(crate::PAGE_SIZE)
        {
            return Err(io::Error::from(io::ErrorKind::InvalidInput));
        }
        // SAFETY: a fresh read-only mapping at an address the kernel chooses
        // cannot alias any existing Rust object; it is never written.
        let raw = unsafe {
            mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ,
                MapFlags::SHARED,
                fd,
                offset,
            )
        }?;
        let map = FileMapping {
            ptr: NonNull::new(raw.cast()).expect("mmap never returns null on success"),
            len,
        };
        // No read-around and no asynchronous read-ahead on our faults: a
        // touch must map the page it names, never pull its neighbours in
        // from disk (a cached page flagged for read-ahead starts the next
        // window when faulted). Without this, each scrub's folio lookup
        // brought thousands of pages the guest did not hold back into the
        // host cache it had just shrunk.
        // SAFETY: the range is exactly the mapping made above, which no
        // Rust object aliases; MADV_RANDOM changes only fault read-ahead.
        unsafe { rustix::mm::madvise(raw, len, rustix::mm::Advice::Random) }?;
        Ok(map)
    }

    /// The mapping's first address.
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }

    /// Pages mapped.
    pub fn pages(&self) -> usize {
        self.len / crate::PAGE_SIZE as usize
    }

    /// Per page, whether it is in the page cache (`mincore` bit 0). Reads
    /// no data and faults nothing in.
    pub fn resident(&self) -> io::Result<Vec<bool>> {
        let mut vec = vec![0u8; self.pages()];
        // SAFETY: the range is exactly our live mapping and `vec` has one
        // byte per page of it, which is all the kernel writes.
        let r = unsafe { libc::mincore(self.ptr.as_ptr().cast(), self.len, vec.as_mut_ptr()) };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(vec.into_iter().map(|b| b & 1 == 1).collect())
    }

    /// Reads the first byte of page `page`, which maps it into this process
    /// (a minor fault if it is cached), so that our pagemap shows its frame.
    pub fn touch(&self, page: usize) -> u8 {
        assert!(page < self.pages(), "page {page} outside the mapping");
        // SAFETY: the address is inside our live read-only mapping; the
        // caller keeps it below the file's end (see the type's docs), so the
        // read sees the file's byte. A volatile read keeps the fault.
        unsafe {
            self.ptr
                .as_ptr()
                .add(page * crate::PAGE_SIZE as usize)
                .read_volatile()
        }
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping was created by `new` and nothing borrows it
        // beyond `self`.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}
