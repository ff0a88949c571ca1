// SPDX-License-Identifier: MIT OR GPL-2.0
//
// pagesift's I/O hint source (crates/linux/src/iohint.rs loads it).
//
// When a read or write syscall of an enabled kind returns in a process
// whose tgid is in `tgids`, having moved ret > 0 bytes, the program
// reports the whole pages of its user buffer that the transfer covered:
// the buffer is clipped to ret (for the vector calls, the iovecs in order
// until ret is used up, at most MAX_SEGS of them) and rounded inward to
// page boundaries, so a partly filled page is never hinted. One event per
// syscall goes to the `hints` ring buffer with the kernel's adaptive
// notification: a sleeping reader is woken only by the first event after it
// has drained the ring, so a burst of reads costs one wake-up, not one per
// syscall; a full ring is counted, never silent.
//
// Two ways in, one handler (`hint`); iohint.rs attaches one of them:
// - fexit on each enabled syscall's entry function (__x64_sys_read and its
//   nine siblings, one small program each, attached only for the syscalls
//   the daemon enables). Other syscalls pay nothing; a read pays one BPF
//   trampoline and a map lookup. Some kernels refuse tracing trampolines
//   (this project's CI machine does: EPERM before verification), hence
// - the BTF-typed raw tracepoint sys_exit (tp_btf), which runs on every
//   syscall exit of every process: it takes the syscall number from the
//   saved registers (orig_ax) and keeps the kinds enabled in
//   `syscall_mask`. Enabling it sends every syscall of every process
//   through the kernel's slow exit path, so even a process not watched
//   pays for it (docs/benchmarks.md, files experiment).
// Both see (const struct pt_regs *regs, long ret): an fexit program's
// context is the traced function's arguments and then its return value,
// and sys_exit's arguments are the same pair. The syscall's own arguments
// are read from the saved registers (x86-64: si, dx), whose layout is the
// kernel's ABI. The kernel has already copied the data into the buffer
// when either fires.

#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>

#define PAGE_SIZE 4096ULL
#define PAGE_MASK (~(PAGE_SIZE - 1))
/* Most iovecs read per vector call (a bounded loop). 64 covers a 256 KiB
   virtio-blk request of a guest, one guest page per iovec. */
#define MAX_SEGS 64

/* Syscall kinds, as iohint.rs's Syscall numbers them. */
enum kind { K_READ, K_PREAD64, K_READV, K_PREADV, K_PREADV2,
            K_WRITE, K_PWRITE64, K_WRITEV, K_PWRITEV, K_PWRITEV2, K_NONE };

/* Counter slots (iohint.rs Counter). */
enum counter { C_EVENTS, C_RING_FULL, C_IOV_BEYOND, C_NO_WHOLE_PAGE, C_NOT_FILE_DATA,
               C_REPEATED, C_COUNTERS };

/* struct pt_regs of x86-64, up to orig_ax (only dx, si and di are read). */
struct regs_x86 {
    __u64 r15, r14, r13, r12, bp, bx, r11, r10, r9, r8;
    __u64 ax, cx, dx, si, di, orig_ax;
};

/* The few kernel fields the file check reads, declared with CO-RE's
   preserve_access_index: the loader (aya, given the kernel's BTF) moves
   each access to the field's offset in the running kernel, so no kernel
   header is needed at build time. */
struct super_block {
    unsigned long s_magic;
} __attribute__((preserve_access_index));
struct inode {
    unsigned short i_mode;
    struct super_block *i_sb;
} __attribute__((preserve_access_index));
struct file {
    struct inode *f_inode;
} __attribute__((preserve_access_index));
struct fdtable {
    unsigned int max_fds;
    struct file **fd;
} __attribute__((preserve_access_index));
struct files_struct {
    struct fdtable *fdt;
} __attribute__((preserve_access_index));
struct task_struct {
    struct files_struct *files;
} __attribute__((preserve_access_index));

#define S_IFMT 0170000
#define S_IFREG 0100000
#define S_IFBLK 0060000

struct seg {
    __u64 start; /* page-aligned user address */
    __u64 pages;
};

struct event {
    __u32 tgid;
    __u32 kind;
    __u32 segs;
    __u32 pad;
    struct seg seg[];
};

struct io_vec {
    __u64 base;
    __u64 len;
};

struct {
    __uint(type, BPF_MAP_TYPE_HASH);
    __uint(max_entries, 65536);
    __type(key, __u32);
    __type(value, __u8);
} tgids SEC(".maps");

/* The kinds the tp_btf path keeps (bit = kind); fexit attaches per kind. */
struct {
    __uint(type, BPF_MAP_TYPE_ARRAY);
    __uint(max_entries, 1);
    __type(key, __u32);
    __type(value, __u64);
} syscall_mask SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, C_COUNTERS);
    __type(key, __u32);
    __type(value, __u64);
} counters SEC(".maps");

/* The last single-buffer hint of each direction (0: reads, 1: writes) on
   this CPU: a call that hints exactly the same pages of the same process
   again is a buffer reused call after call (cat, sha256sum, cp read a
   file through one buffer), whose pages hold the file only until the next
   call. Its first hint names those pages already; the daemon reads them
   when it looks the hint up, so the repeats add nothing but their cost. */
struct last_hint {
    __u32 tgid;
    __u32 pad;
    __u64 first;
    __u64 pages;
};

struct {
    __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
    __uint(max_entries, 2);
    __type(key, __u32);
    __type(value, struct last_hint);
} last SEC(".maps");

struct {
    __uint(type, BPF_MAP_TYPE_RINGBUF);
    __uint(max_entries, 16 << 20);
} hints SEC(".maps");

static __always_inline void count(__u32 slot)
{
    __u64 *c = bpf_map_lookup_elem(&counters, &slot);
    if (c)
        *c += 1;
}

static __always_inline int kind_of(__u64 nr)
{
    switch (nr) {
    case 0: return K_READ;
    case 1: return K_WRITE;
    case 17: return K_PREAD64;
    case 18: return K_PWRITE64;
    case 19: return K_READV;
    case 20: return K_WRITEV;
    case 295: return K_PREADV;
    case 296: return K_PWRITEV;
    case 327: return K_PREADV2;
    case 328: return K_PWRITEV2;
    default: return K_NONE;
    }
}

/* Whole pages of [start, start + len): first page-aligned address and count. */
static __always_inline __u64 whole_pages(__u64 start, __u64 len, __u64 *first)
{
    __u64 a = (start + PAGE_SIZE - 1) & PAGE_MASK;
    __u64 b = (start + len) & PAGE_MASK;
    *first = a;
    return b > a ? (b - a) / PAGE_SIZE : 0;
}

/* Whether descriptor fd of the current process names file data: a
   regular file or a block device, outside the filesystems whose files the
   kernel makes up at each read (procfs, sysfs, cgroupfs, debugfs, tracefs,
   securityfs, bpffs, configfs, pstore, efivarfs). XLH hints the buffers of
   I/O to the background store (§4.3.2): data that another process or guest
   may hold too. A read of /proc/PID/pagemap, a pipe, a socket or a
   character device fills a buffer with data no one else holds, and each
   such hint costs the daemon a read and a hash of every page for nothing
   (the short-lived experiment's workload reads its pagemap and kpageflags
   each cycle: 18 236 of the daemon's 44 370 sampled pages in a 60 s run on
   2026-12-03, none a duplicate). The descriptor is looked up after the
   call: if another thread closed or replaced it meanwhile the answer is
   about that file, an error of a hint either way, never a fault. Its
   cost falls on watched calls that cover a whole page: by hand on
   2026-12-03 (2-CPU Intel Xeon, `pagesift hint-overhead --mib 64`, four
   alternating runs of each build) a watched 4 KiB pread64 of a cached
   file paid +78 to +230 ns a call before the check (median of the runs'
   figures about +215) and +259 to +341 ns with it (about +305): some
   90 ns a call, against 2-4 us of the daemon's per page wrongly hinted.
   At 64 KiB a call the runs spread by +-500 ns either way. */
static __always_inline int file_data(__u64 fd)
{
    /* A BTF-typed task: the loads down to the descriptor table are plain
       loads the verifier guards, not helper calls. */
    struct task_struct *task = bpf_get_current_task_btf();
    struct files_struct *files = task->files;
    if (!files)
        return 0;
    struct fdtable *fdt = files->fdt;
    if (!fdt || fd >= fdt->max_fds)
        return 0;
    struct file *f = 0;
    if (bpf_probe_read_kernel(&f, sizeof(f), fdt->fd + fd) || !f)
        return 0;
    struct inode *inode = BPF_CORE_READ(f, f_inode);
    if (!inode)
        return 0;
    unsigned short type = BPF_CORE_READ(inode, i_mode) & S_IFMT;
    if (type == S_IFBLK)
        return 1;
    if (type != S_IFREG)
        return 0;
    switch (BPF_CORE_READ(inode, i_sb, s_magic)) {
    case 0x9fa0:     /* PROC_SUPER_MAGIC */
    case 0x62656572: /* SYSFS_MAGIC */
    case 0x27e0eb:   /* CGROUP_SUPER_MAGIC */
    case 0x63677270: /* CGROUP2_SUPER_MAGIC */
    case 0x64626720: /* DEBUGFS_MAGIC */
    case 0x74726163: /* TRACEFS_MAGIC */
    case 0x73636673: /* SECURITYFS_MAGIC */
    case 0xcafe4a11: /* BPF_FS_MAGIC */
    case 0x62656570: /* CONFIGFS_MAGIC */
    case 0x6165676c: /* PSTOREFS_MAGIC */
    case 0xde5e81e4: /* EFIVARFS_MAGIC */
        return 0;
    default:
        return 1;
    }
}

/* The hint of one syscall exit: ctx is (regs, ret). */
static __always_inline int hint(__u64 *ctx, int kind)
{
    __u32 tgid = bpf_get_current_pid_tgid() >> 32;
    if (!bpf_map_lookup_elem(&tgids, &tgid))
        return 0;
    long ret = (long)ctx[1];
    /* Fewer bytes than a page cannot cover a whole page. */
    if (ret < (long)PAGE_SIZE)
        return 0;
    /* dx, si and di are adjacent in struct pt_regs: one read of all. */
    struct { __u64 dx, si, di; } regs;
    if (bpf_probe_read_kernel(&regs, sizeof(regs),
                              (char *)ctx[0] + __builtin_offsetof(struct regs_x86, dx)))
        return 0;

    int vector = kind == K_READV || kind == K_PREADV || kind == K_PREADV2 ||
                 kind == K_WRITEV || kind == K_PWRITEV || kind == K_PWRITEV2;
    if (!vector) {
        __u64 first;
        __u64 pages = whole_pages(regs.si, (__u64)ret, &first);
        if (!pages) {
            count(C_NO_WHOLE_PAGE);
            return 0;
        }
        /* The same pages as this CPU's last hint of this direction, from
           the same process: a reused buffer (see `last`). */
        __u32 dir = kind >= K_WRITE;
        struct last_hint *l = bpf_map_lookup_elem(&last, &dir);
        if (l && l->tgid == tgid && l->first == first && l->pages == pages) {
            count(C_REPEATED);
            return 0;
        }
        /* The descriptor (di) is looked up only for a call that would be
           hinted: a read of a page into a buffer that is not page-aligned
           covers no whole page and skips it. */
        if (!file_data(regs.di)) {
            count(C_NOT_FILE_DATA);
            return 0;
        }
        struct event *e = bpf_ringbuf_reserve(&hints, sizeof(*e) + sizeof(struct seg), 0);
        if (!e) {
            count(C_RING_FULL);
            return 0;
        }
        e->tgid = tgid;
        e->kind = kind;
        e->segs = 1;
        e->pad = 0;
        e->seg[0].start = first;
        e->seg[0].pages = pages;
        bpf_ringbuf_submit(e, 0); /* adaptive wake-up, see the header */
        if (l) {
            l->tgid = tgid;
            l->first = first;
            l->pages = pages;
        }
        count(C_EVENTS);
        return 0;
    }

    struct event *e = bpf_ringbuf_reserve(&hints, sizeof(*e) + MAX_SEGS * sizeof(struct seg), 0);
    if (!e) {
        count(C_RING_FULL);
        return 0;
    }
    __u64 iov = regs.si;
    __u64 iovcnt = regs.dx;
    __u64 left = (__u64)ret;
    __u64 any = 0;
    __u32 i;
    /* Segment i is iovec i (pages 0 when it holds no whole page): one
       index keeps the verifier's states few. */
    for (i = 0; i < MAX_SEGS; i++) {
        if ((__u64)i >= iovcnt || left == 0)
            break;
        struct io_vec v;
        if (bpf_probe_read_user(&v, sizeof(v), (void *)(iov + i * sizeof(v))))
            break;
        __u64 len = v.len < left ? v.len : left;
        left -= len;
        __u64 first;
        __u64 pages = whole_pages(v.base, len, &first);
        e->seg[i].start = first;
        e->seg[i].pages = pages;
        any |= pages;
    }
    if (left > 0 && i == MAX_SEGS)
        count(C_IOV_BEYOND);
    if (!any) {
        bpf_ringbuf_discard(e, BPF_RB_NO_WAKEUP);
        count(C_NO_WHOLE_PAGE);
        return 0;
    }
    if (!file_data(regs.di)) {
        bpf_ringbuf_discard(e, BPF_RB_NO_WAKEUP);
        count(C_NOT_FILE_DATA);
        return 0;
    }
    e->tgid = tgid;
    e->kind = kind;
    e->segs = i;
    e->pad = 0;
    bpf_ringbuf_submit(e, 0);
    count(C_EVENTS);
    return 0;
}

SEC("tp_btf/sys_exit")
int iohint_sys_exit(__u64 *ctx)
{
    /* The return value first: it is in the context, free to read, and most
       syscalls of most processes return less than a page (0, a small
       count, an error), which no hint can come from (hint() drops them
       too). They then skip the register read and both map lookups. By
       hand, 2026-12-03, 2-CPU Intel Xeon, a process not watched reading
       512 bytes from /dev/zero in a loop (a throwaway C program), four
       alternating rounds: the program cost it 47-95 ns a call (median 62)
       before this test came first, 29-56 ns (median 39) after. The
       project's own reader, `pagesift hint-overhead --hook sys-exit
       --call-bytes 512 --mib 128`, gave +35 to +59 ns a call not watching
       in three quiet runs the same day, but its trials swung by hundreds
       of ns a call once the host was busy, too much to resolve the
       difference. */
    if ((long)ctx[1] < (long)PAGE_SIZE)
        return 0;
    __u64 nr;
    if (bpf_probe_read_kernel(&nr, sizeof(nr),
                              (char *)ctx[0] + __builtin_offsetof(struct regs_x86, orig_ax)))
        return 0;
    int kind = kind_of(nr);
    if (kind == K_NONE)
        return 0;
    __u32 zero = 0;
    __u64 *mask = bpf_map_lookup_elem(&syscall_mask, &zero);
    if (!mask || !(*mask & (1ULL << kind)))
        return 0;
    return hint(ctx, kind);
}

#define HINT(name, kind)                             \
    SEC("fexit/__x64_sys_" #name)                    \
    int iohint_##name(__u64 *ctx) { return hint(ctx, kind); }

HINT(read, K_READ)
HINT(pread64, K_PREAD64)
HINT(readv, K_READV)
HINT(preadv, K_PREADV)
HINT(preadv2, K_PREADV2)
HINT(write, K_WRITE)
HINT(pwrite64, K_PWRITE64)
HINT(writev, K_WRITEV)
HINT(pwritev, K_PWRITEV)
HINT(pwritev2, K_PWRITEV2)

char LICENSE[] SEC("license") = "Dual MIT/GPL";
