//! A target process for remote syscall injection: `tests/inject.rs` and
//! `examples/inject_cost.rs` start it and inject into it.
//!
//! It maps `--mib` MiB (default 16) of private anonymous memory filled with
//! a pseudo-random pattern, prints one JSON line
//! `{"pid", "addr", "len", "checksum", "tids"}`, then runs its MODE, checking
//! its own results: every syscall it makes must return what it would
//! without a tracer (no EINTR, no early return, no lost data). Each failed
//! check is kept; when the mode ends (stdin closed, or end of the data on
//! stdin) it prints `{"final": true, "iterations", "errors", "checksum",
//! ...}` with the checksum recomputed, and exits with status 0.
//!
//! Modes (MODE):
//! - `sleep`: `nanosleep(--ms)` in a loop; each must return 0 after at
//!   least the requested time.
//! - `futex`: `futex(FUTEX_WAIT, timeout --ms)` on a word nobody changes;
//!   each must time out (ETIMEDOUT) after at least the timeout.
//! - `read`: reads 8-byte sequence numbers from stdin until EOF; each read
//!   must return exactly the next number.
//! - `epoll`: `epoll_wait(--ms)` on stdin; a timeout or stdin's EOF are the
//!   only acceptable results (EINTR is counted as an error).
//! - `rseq`: spins inside a restartable-sequence critical section (on
//!   glibc's registered `struct rseq`) of 2^20 iterations, restarting it
//!   after each abort; a pass that commits on another CPU than it started
//!   on is an error (the kernel aborts a preempted section, so that can
//!   only happen if the section was forgotten). `aborts` counts aborts.
//! - `epoll-uring`: `epoll` with an io_uring in SQPOLL mode set up first,
//!   so the process also has the kernel's `iou-sqp-PID` thread (an I/O
//!   worker: ptrace refuses it, and it never returns to user space). `tids`
//!   has `uring_fd`.
//! - `sleep-reader`: the main thread as in `sleep`, and one more blocked in
//!   `read(2)` on a pipe until the end (each read must return data or the
//!   end, never EINTR).
//! - `threads`: five threads: one spinning in user space, one in `sleep`, one
//!   in `futex`, one in `epoll` (on an idle eventfd-less epoll set), and the
//!   main thread reading commands from stdin (`progress` prints the
//!   per-thread counters). `tids` names them.
//! - `exit-after`: the main thread and two others in `sleep` (5 ms); a
//!   timer thread prints `{"bye": true}` after `--ms` and exits the process
//!   with status 0.
//! - `seccomp`: installs a seccomp filter that kills the process on
//!   `madvise` or `prctl`, then `sleep`.
//! - `spawn-blocked`: prints its line, then `posix_spawn`s itself (`noop`)
//!   with a file action opening the FIFO `--fifo` for reading: glibc's
//!   `posix_spawn` is a vfork, so the main thread waits uninterruptibly
//!   (`D`) until someone opens the FIFO for writing. Then `sleep`.
//! - `signals`: counts `SIGRTMIN+1` in an `SA_SIGINFO` handler (each must
//!   carry `si_code == SI_TKILL`, as `tgkill` sends it), while `sleep`ing
//!   (EINTR is expected here and retried).
//! - `registers`: spins in a loop written in assembly that holds known
//!   values in every general-purpose register (`rsp` aside) and a known
//!   double in `xmm0`, checking them all on every pass: an injection that
//!   does not put back every register (or the FPU state) exactly is seen.
//! - `sigqueue`: counts `SIGRTMIN+2` in an `SA_SIGINFO` handler; each must
//!   carry `si_code == SI_QUEUE`, the sender's pid (`--sender`, if given)
//!   and an integer value below 4096, each value exactly once (the final
//!   line reports `received`, `duplicates`, `bad_siginfo`, `values`).
//! - `uffd-missing`: registers a second, never-touched 4 MiB region with
//!   its own userfaultfd in missing mode and never answers a fault (a read
//!   of it would wait forever), then `sleep`; the ready line gives the
//!   region as `uffd_addr`, `uffd_len`.
//! - `noop`: exits at once.
//!
//! `--churn-ms N`: every N ms the mode's own loop (the sleeping thread in
//! `threads`) maps a fresh 8 MiB region with the same fill in every target,
//! then unmaps the previous one, so that a daemon keeps finding new
//! duplicate regions to mark (the checked region is never touched).
#![allow(unsafe_code)] // only in `mod handler` below: installing a signal handler.

use pagesift_linux::sys::{AnonMapping, HugePages};
use rustix::event::Timespec;
use rustix::thread::{NanosleepRelativeResult, futex};
use serde_json::json;
use std::io::BufRead;
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn ts(d: Duration) -> Timespec {
    Timespec {
        tv_sec: d.as_secs() as i64,
        tv_nsec: d.subsec_nanos() as i64,
    }
}

/// Failed checks, shared by all threads.
#[derive(Clone, Default)]
struct Errors(Arc<Mutex<Vec<String>>>);

impl Errors {
    fn push(&self, e: String) {
        let mut v = self.0.lock().unwrap();
        if v.len() < 100 {
            v.push(e);
        }
    }
    fn list(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Whether stdin has reached EOF (poll without waiting).
fn stdin_closed() -> bool {
    use rustix::event::{PollFd, PollFlags, poll};
    let stdin = std::io::stdin();
    let mut fds = [PollFd::new(&stdin, PollFlags::IN)];
    matches!(poll(&mut fds, Some(&ts(Duration::ZERO))), Ok(n) if n > 0)
}

/// One checked `nanosleep(d)`; `eintr_ok` retries an interruption.
fn checked_sleep(d: Duration, eintr_ok: bool, errors: &Errors) {
    churn_tick();
    let t0 = Instant::now();
    let mut req = ts(d);
    loop {
        match rustix::thread::nanosleep(&req) {
            NanosleepRelativeResult::Ok => break,
            NanosleepRelativeResult::Interrupted(rem) if eintr_ok => req = rem,
            NanosleepRelativeResult::Interrupted(rem) => {
                errors.push(format!("nanosleep: EINTR with {rem:?} left"));
                return;
            }
            NanosleepRelativeResult::Err(e) => {
                errors.push(format!("nanosleep: {e}"));
                return;
            }
        }
    }
    let el = t0.elapsed();
    if el < d {
        errors.push(format!("nanosleep returned early: {el:?} < {d:?}"));
    }
}

/// One checked futex wait that must time out.
fn checked_futex(word: &AtomicU32, d: Duration, errors: &Errors) {
    let t0 = Instant::now();
    match futex::wait(word, futex::Flags::PRIVATE, 0, Some(&ts(d))) {
        Err(rustix::io::Errno::TIMEDOUT) => {
            let el = t0.elapsed();
            if el < d {
                errors.push(format!("futex timed out early: {el:?} < {d:?}"));
            }
        }
        other => errors.push(format!("futex wait returned {other:?}")),
    }
}

/// Registers `len` bytes at `addr` with a new userfaultfd in missing mode;
/// returns the descriptor (kept open, never read).
fn own_missing_userfaultfd(addr: u64, len: u64) -> i32 {
    // struct uffdio_api / uffdio_register (include/uapi/linux/userfaultfd.h).
    const UFFDIO_API: u64 = 0xc018_aa3f;
    const UFFDIO_REGISTER: u64 = 0xc020_aa00;
    const MODE_MISSING: u64 = 1;
    // SAFETY: a raw syscall with integer flags; it reads no memory of ours.
    let fd =
        unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) } as i32;
    assert!(fd >= 0, "userfaultfd: {}", std::io::Error::last_os_error());
    let mut api = [0xaau64, 0, 0];
    // SAFETY: `api` is a valid, writable `struct uffdio_api` (24 bytes) for
    // the duration of the call.
    let rc = unsafe { libc::ioctl(fd, UFFDIO_API, api.as_mut_ptr()) };
    assert_eq!(rc, 0, "UFFDIO_API: {}", std::io::Error::last_os_error());
    let mut reg = [addr, len, MODE_MISSING, 0];
    // SAFETY: `reg` is a valid, writable `struct uffdio_register` (32
    // bytes) for the duration of the call; the range is our own mapping.
    let rc = unsafe { libc::ioctl(fd, UFFDIO_REGISTER, reg.as_mut_ptr()) };
    assert_eq!(
        rc,
        0,
        "UFFDIO_REGISTER: {}",
        std::io::Error::last_os_error()
    );
    fd
}

/// The `--churn-ms` region and its period.
static CHURN: Mutex<Option<(Duration, Instant, Option<AnonMapping>)>> = Mutex::new(None);

/// Replaces the churn region if its period has passed: the new one is
/// mapped before the old one goes, so it gets a new address.
fn churn_tick() {
    let mut c = CHURN.lock().unwrap();
    if let Some((period, last, region)) = c.as_mut()
        && last.elapsed() >= *period
    {
        let mut fresh = AnonMapping::new(8 << 20, HugePages::Never).expect("mmap");
        fill(&mut fresh, 0xc0ffee);
        *region = Some(fresh);
        *last = Instant::now();
    }
}

fn sleep_loop(d: Duration, eintr_ok: bool, errors: &Errors) -> u64 {
    let mut n = 0;
    while !stdin_closed() {
        checked_sleep(d, eintr_ok, errors);
        n += 1;
    }
    n
}

fn fill(region: &mut AnonMapping, seed: u64) {
    for (i, chunk) in region.as_mut_slice().chunks_exact_mut(8).enumerate() {
        let v = twox_hash::XxHash3_64::oneshot_with_seed(seed, &(i as u64).to_le_bytes());
        chunk.copy_from_slice(&v.to_le_bytes());
    }
}

fn checksum(region: &AnonMapping) -> String {
    format!("{:016x}", twox_hash::XxHash3_64::oneshot(region.as_slice()))
}

mod handler {
    //! The `signals` mode's handler for `SIGRTMIN+1` (nix's `sigaction`
    //! takes only non-real-time signals, so this uses libc directly).
    use std::sync::atomic::{AtomicU64, Ordering};

    pub static RECEIVED: AtomicU64 = AtomicU64::new(0);
    pub static BAD_CODE: AtomicU64 = AtomicU64::new(0);

    extern "C" fn on_signal(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        RECEIVED.fetch_add(1, Ordering::Relaxed);
        // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo for the
        // duration of the handler; reading a field is async-signal-safe.
        let code = unsafe { (*info).si_code };
        if code != libc::SI_TKILL {
            BAD_CODE.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Installs the handler (no `SA_RESTART`: sleeps return EINTR).
    pub fn install() {
        // SAFETY: `sigaction` is a plain C struct for which all-zero bytes
        // are a valid value (no handler, empty mask, no flags).
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `on_signal` only touches atomics and the siginfo the
        // kernel hands it, so it is async-signal-safe; `act` is a valid
        // sigaction for the duration of the call; the old action is not
        // requested.
        let rc = unsafe { libc::sigaction(libc::SIGRTMIN() + 1, &act, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "sigaction: {}", std::io::Error::last_os_error());
    }
}

mod queued {
    //! The `sigqueue` mode's handler for `SIGRTMIN+2`.
    use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

    pub const VALUES: usize = 4096;
    pub static SEEN: [AtomicU32; VALUES] = [const { AtomicU32::new(0) }; VALUES];
    pub static BAD: AtomicU64 = AtomicU64::new(0);
    pub static SENDER: AtomicU32 = AtomicU32::new(0);

    extern "C" fn on_signal(_sig: i32, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
        // SAFETY: with SA_SIGINFO the kernel passes a valid siginfo for the
        // duration of the handler; for SI_QUEUE its union holds the
        // sender's pid, uid and value, which these accessors read.
        let (code, pid, value) = unsafe {
            (
                (*info).si_code,
                (*info).si_pid(),
                (*info).si_value().sival_ptr as usize,
            )
        };
        let sender = SENDER.load(Ordering::Relaxed);
        if code != libc::SI_QUEUE || (sender != 0 && pid as u32 != sender) || value >= VALUES {
            BAD.fetch_add(1, Ordering::Relaxed);
            return;
        }
        SEEN[value].fetch_add(1, Ordering::Relaxed);
    }

    /// Installs the handler (no `SA_RESTART`).
    pub fn install() {
        // SAFETY: all-zero bytes are a valid `sigaction` (no handler, empty
        // mask, no flags).
        let mut act: libc::sigaction = unsafe { std::mem::zeroed() };
        act.sa_sigaction = on_signal as *const () as usize;
        act.sa_flags = libc::SA_SIGINFO;
        // SAFETY: `on_signal` only touches atomics and the siginfo, so it
        // is async-signal-safe; `act` is valid for the call.
        let rc = unsafe { libc::sigaction(libc::SIGRTMIN() + 2, &act, std::ptr::null_mut()) };
        assert_eq!(rc, 0, "sigaction: {}", std::io::Error::last_os_error());
    }
}

/// One pass of the `registers` mode: `passes` rounds of checking every
/// general-purpose register and `xmm0` against the values loaded at the
/// start; false if any differed.
fn registers_hold(passes: u64) -> bool {
    let failed: u64;
    // SAFETY: the block saves and restores rbx and rbp (which the compiler
    // may rely on) with push/pop, declares every other register it writes
    // as clobbered, keeps the stack balanced on every path, and touches no
    // memory but the three stack words it pushes.
    unsafe {
        std::arch::asm!(
            "push rbx",
            "push rbp",
            "push rax",
            "mov rax, 0x3ff80000",
            "shl rax, 32",
            "push rax",
            "movq xmm0, rax",
            "mov rax, 0x11111111",
            "mov rbx, 0x22222222",
            "mov rcx, 0x33333333",
            "mov rdx, 0x44444444",
            "mov rsi, 0x55555555",
            "mov rdi, 0x66666666",
            "mov rbp, 0x77777777",
            "mov r8, 0x08080808",
            "mov r9, 0x09090909",
            "mov r10, 0x10101010",
            "mov r11, 0x11112222",
            "mov r12, 0x12121212",
            "mov r13, 0x13131313",
            "mov r14, 0x14141414",
            "mov r15, 0x15151515",
            "2:",
            "cmp rax, 0x11111111",
            "jne 3f",
            "cmp rbx, 0x22222222",
            "jne 3f",
            "cmp rcx, 0x33333333",
            "jne 3f",
            "cmp rdx, 0x44444444",
            "jne 3f",
            "cmp rsi, 0x55555555",
            "jne 3f",
            "cmp rdi, 0x66666666",
            "jne 3f",
            "cmp rbp, 0x77777777",
            "jne 3f",
            "cmp r8, 0x08080808",
            "jne 3f",
            "cmp r9, 0x09090909",
            "jne 3f",
            "cmp r10, 0x10101010",
            "jne 3f",
            "cmp r11, 0x11112222",
            "jne 3f",
            "cmp r12, 0x12121212",
            "jne 3f",
            "cmp r13, 0x13131313",
            "jne 3f",
            "cmp r14, 0x14141414",
            "jne 3f",
            "cmp r15, 0x15151515",
            "jne 3f",
            "ucomisd xmm0, qword ptr [rsp]",
            "jne 3f",
            "jp 3f",
            "dec qword ptr [rsp + 8]",
            "jnz 2b",
            "xor eax, eax",
            "jmp 4f",
            "3:",
            "mov eax, 1",
            "4:",
            "add rsp, 16",
            "pop rbp",
            "pop rbx",
            inout("rax") passes => failed,
            out("rcx") _, out("rdx") _, out("rsi") _, out("rdi") _,
            out("r8") _, out("r9") _, out("r10") _, out("r11") _,
            out("r12") _, out("r13") _, out("r14") _, out("r15") _,
            out("xmm0") _,
        );
    }
    failed == 0
}

/// A restartable-sequence critical section to spin in (mode `rseq`), on
/// the `struct rseq` glibc registered for the thread.
mod rseq_cs {
    unsafe extern "C" {
        /// glibc 2.35+: offset of the thread's `struct rseq` from the
        /// thread pointer, and its size (0: glibc registered none).
        static __rseq_offset: isize;
        static __rseq_size: u32;
    }

    /// The calling thread's `struct rseq`, if glibc registered one.
    pub fn area() -> Option<u64> {
        // SAFETY: plain reads of two constants glibc sets before main.
        let (offset, size) = unsafe { (__rseq_offset, __rseq_size) };
        if size == 0 {
            return None;
        }
        let tp: u64;
        // SAFETY: reads the thread pointer (the TCB's self pointer at
        // fs:0 on x86-64), nothing else.
        unsafe { std::arch::asm!("mov {}, fs:0", out(reg) tp) };
        Some(tp.wrapping_add(offset as u64))
    }

    /// Spins `n` iterations inside one critical section, restarting it
    /// after each abort; returns the aborts and whether a committed pass
    /// found its CPU changed since it started (which the kernel must
    /// prevent by aborting: a preemption inside the section aborts it).
    pub fn spin(area: u64, n: u64) -> (u64, bool) {
        let aborts: u64;
        let moved: u64;
        // SAFETY: the section's descriptor is static; the asm writes only
        // `rseq_cs` of this thread's own registered `struct rseq` (offset
        // 8), as the rseq ABI intends, and reads its `cpu_id` (offset 4).
        // Every register it changes is declared.
        unsafe {
            std::arch::asm!(
                ".pushsection .data.rel.ro.pagesift_rseq, \"aw\"",
                ".balign 32",
                "3:",
                ".long 0, 0",
                ".quad 5f, (6f - 5f), 4f",
                ".popsection",
                "xor {aborts}, {aborts}",
                "2:",
                "lea {tmp}, [rip + 3b]",
                "mov qword ptr [{area} + 8], {tmp}",
                "5:",
                "mov {cpu:e}, dword ptr [{area} + 4]",
                "mov {left}, {n}",
                "7:",
                "dec {left}",
                "jnz 7b",
                "mov {tmp:e}, dword ptr [{area} + 4]",
                "6:",
                "mov qword ptr [{area} + 8], 0",
                "xor {moved}, {moved}",
                "cmp {tmp:e}, {cpu:e}",
                "setne {moved:l}",
                "jmp 8f",
                // The abort handler, preceded by glibc's signature
                // (RSEQ_SIG 0x53053053, as `ud1` bytes before it).
                ".byte 0x0f, 0xb9, 0x3d",
                ".long 0x53053053",
                "4:",
                "inc {aborts}",
                "jmp 2b",
                "8:",
                area = in(reg) area,
                n = in(reg) n,
                aborts = out(reg) aborts,
                moved = out(reg) moved,
                tmp = out(reg) _,
                cpu = out(reg) _,
                left = out(reg) _,
            );
        }
        (aborts, moved != 0)
    }
}

/// Sets up an io_uring with a submission-queue polling thread and returns
/// its descriptor (kept open for the process's life). The kernel starts the
/// `iou-sqp-PID` thread in this process at once.
fn sqpoll_uring() -> i32 {
    // struct io_uring_params: sq_entries, cq_entries, flags, sq_thread_cpu,
    // sq_thread_idle, features, wq_fd, resv[3], then two 40-byte offset
    // structs the kernel fills: 120 bytes.
    let mut params = [0u32; 30];
    const IORING_SETUP_SQPOLL: u32 = 1 << 1;
    params[2] = IORING_SETUP_SQPOLL;
    params[4] = 60_000; // idle ms before the thread sleeps
    // SAFETY: io_uring_setup(2) reads and writes exactly the 120-byte
    // parameter block passed, which lives on this stack frame.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4, params.as_mut_ptr()) };
    assert!(
        fd >= 0,
        "io_uring_setup: {}",
        std::io::Error::last_os_error()
    );
    // The polling thread names itself ("iou-sqp-PID") only when it first
    // runs; until then it carries this process's name. On a busy machine
    // that can be after setup returns, so "ready" waits for the name: the
    // test looks the thread up by it.
    let named = || {
        std::fs::read_dir("/proc/self/task").is_ok_and(|d| {
            d.filter_map(|e| e.ok()).any(|e| {
                std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.starts_with("iou-"))
            })
        })
    };
    let start = std::time::Instant::now();
    while !named() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(10),
            "the SQPOLL thread never named itself"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    fd as i32
}

struct Args {
    mode: String,
    ms: u64,
    mib: usize,
    fifo: Option<String>,
    sender: u32,
    churn_ms: u64,
}

fn args() -> Args {
    let mut it = std::env::args().skip(1);
    let mut a = Args {
        mode: it.next().expect("MODE"),
        ms: 20,
        mib: 16,
        fifo: None,
        sender: 0,
        churn_ms: 0,
    };
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| panic!("{k} needs a value"));
        match k.as_str() {
            "--ms" => a.ms = v.parse().unwrap(),
            "--mib" => a.mib = v.parse().unwrap(),
            "--fifo" => a.fifo = Some(v),
            "--sender" => a.sender = v.parse().unwrap(),
            "--churn-ms" => a.churn_ms = v.parse().unwrap(),
            _ => panic!("unknown option {k}"),
        }
    }
    a
}

fn main() {
    let a = args();
    if a.mode == "noop" {
        return;
    }
    let d = Duration::from_millis(a.ms);
    let mut region = AnonMapping::new(a.mib << 20, HugePages::Never).expect("mmap");
    fill(&mut region, 0x5eed);
    let start_sum = checksum(&region);
    if a.churn_ms > 0 {
        *CHURN.lock().unwrap() = Some((
            Duration::from_millis(a.churn_ms),
            Instant::now() - Duration::from_millis(a.churn_ms),
            None,
        ));
    }
    let errors = Errors::default();
    let mut tids = json!({"main": rustix::thread::gettid().as_raw_nonzero().get()});
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    let mut pipe_writer: Option<std::io::PipeWriter> = None;
    let counters: Arc<[AtomicU64; 4]> = Arc::new(Default::default());

    let spawn_thread = |name: &'static str,
                        handles: &mut Vec<std::thread::JoinHandle<()>>,
                        tids: &mut serde_json::Value,
                        body: Box<dyn FnOnce() + Send>| {
        let (tx, rx) = std::sync::mpsc::channel();
        handles.push(
            std::thread::Builder::new()
                .name(name.into())
                .spawn(move || {
                    tx.send(rustix::thread::gettid().as_raw_nonzero().get())
                        .unwrap();
                    body()
                })
                .unwrap(),
        );
        tids[name] = json!(rx.recv().unwrap());
    };

    match a.mode.as_str() {
        "seccomp" => {
            use seccompiler::{SeccompAction, SeccompFilter, TargetArch};
            let rules = [(libc::SYS_madvise, vec![]), (libc::SYS_prctl, vec![])]
                .into_iter()
                .collect();
            let filter = SeccompFilter::new(
                rules,
                SeccompAction::Allow,
                SeccompAction::KillProcess,
                TargetArch::x86_64,
            )
            .expect("filter");
            let prog: seccompiler::BpfProgram = filter.try_into().expect("compile");
            seccompiler::apply_filter(&prog).expect("seccomp");
        }
        "signals" => handler::install(),
        "epoll-uring" => tids["uring_fd"] = json!(sqpoll_uring()),
        "uffd-missing" => {
            let blocked = AnonMapping::new(4 << 20, HugePages::Never).expect("mmap");
            let fd = own_missing_userfaultfd(blocked.addr(), blocked.len() as u64);
            tids["uffd_addr"] = json!(blocked.addr());
            tids["uffd_len"] = json!(blocked.len());
            tids["uffd_fd"] = json!(fd);
            std::mem::forget(blocked);
        }
        "sigqueue" => {
            queued::SENDER.store(a.sender, Ordering::Relaxed);
            queued::install();
        }
        "threads" => {
            let (s, c) = (stop.clone(), counters.clone());
            spawn_thread(
                "spin",
                &mut handles,
                &mut tids,
                Box::new(move || {
                    while !s.load(Ordering::Relaxed) {
                        for _ in 0..10_000 {
                            std::hint::spin_loop();
                        }
                        c[0].fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
            let (s, c, e) = (stop.clone(), counters.clone(), errors.clone());
            spawn_thread(
                "sleep",
                &mut handles,
                &mut tids,
                Box::new(move || {
                    while !s.load(Ordering::Relaxed) {
                        checked_sleep(Duration::from_millis(5), false, &e);
                        c[1].fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
            let (s, c, e) = (stop.clone(), counters.clone(), errors.clone());
            spawn_thread(
                "futex",
                &mut handles,
                &mut tids,
                Box::new(move || {
                    let word = AtomicU32::new(0);
                    while !s.load(Ordering::Relaxed) {
                        checked_futex(&word, Duration::from_millis(5), &e);
                        c[2].fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
            let (s, c, e) = (stop.clone(), counters.clone(), errors.clone());
            spawn_thread(
                "epoll",
                &mut handles,
                &mut tids,
                Box::new(move || {
                    use rustix::event::epoll;
                    let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
                    let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 4];
                    while !s.load(Ordering::Relaxed) {
                        match epoll::wait(&ep, &mut buf, Some(&ts(Duration::from_millis(5)))) {
                            Ok(_) => {}
                            Err(err) => e.push(format!("epoll_wait: {err}")),
                        }
                        c[3].fetch_add(1, Ordering::Relaxed);
                    }
                }),
            );
        }
        "sleep-reader" => {
            let (mut r, w) = std::io::pipe().expect("pipe");
            pipe_writer = Some(w);
            let e = errors.clone();
            spawn_thread(
                "reader",
                &mut handles,
                &mut tids,
                Box::new(move || {
                    use std::io::Read;
                    let mut b = [0u8; 1];
                    loop {
                        match r.read(&mut b) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(err) => {
                                e.push(format!("read: {err}"));
                                break;
                            }
                        }
                    }
                }),
            );
        }
        "exit-after" => {
            for name in ["sleep1", "sleep2"] {
                let (s, e) = (stop.clone(), errors.clone());
                spawn_thread(
                    name,
                    &mut handles,
                    &mut tids,
                    Box::new(move || {
                        while !s.load(Ordering::Relaxed) {
                            checked_sleep(Duration::from_millis(5), false, &e);
                        }
                    }),
                );
            }
            let e = errors.clone();
            spawn_thread(
                "timer",
                &mut handles,
                &mut tids,
                Box::new(move || {
                    std::thread::sleep(d);
                    println!("{}", json!({"bye": true, "errors": e.list()}));
                    std::process::exit(0);
                }),
            );
        }
        _ => {}
    }

    println!(
        "{}",
        json!({
            "pid": std::process::id(),
            "addr": region.addr(),
            "len": region.len(),
            "checksum": start_sum,
            "tids": tids,
        })
    );

    let mut extra = json!({});
    let iterations = match a.mode.as_str() {
        "sleep" | "seccomp" | "uffd-missing" | "sleep-reader" => sleep_loop(d, false, &errors),
        "signals" => {
            let n = sleep_loop(d, true, &errors);
            extra["signals"] = json!(handler::RECEIVED.load(Ordering::Relaxed));
            extra["bad_siginfo"] = json!(handler::BAD_CODE.load(Ordering::Relaxed));
            n
        }
        "registers" => {
            let mut n = 0;
            while !stdin_closed() {
                churn_tick();
                if !registers_hold(1 << 20) {
                    errors.push("a register changed under the spinning loop".into());
                }
                n += 1;
            }
            n
        }
        "rseq" => {
            let area = rseq_cs::area().expect("glibc registered no rseq area");
            let mut n = 0;
            while !stdin_closed() {
                let (aborts, moved) = rseq_cs::spin(area, 1 << 20);
                extra["aborts"] = json!(extra["aborts"].as_u64().unwrap_or(0) + aborts);
                if moved {
                    errors.push("an rseq critical section committed on another CPU".into());
                }
                n += 1;
            }
            n
        }
        "sigqueue" => {
            let n = sleep_loop(d, true, &errors);
            let counts: Vec<u32> = queued::SEEN
                .iter()
                .map(|c| c.load(Ordering::Relaxed))
                .collect();
            extra["received"] = json!(counts.iter().map(|&c| c as u64).sum::<u64>());
            extra["duplicates"] = json!(counts.iter().filter(|&&c| c > 1).count());
            extra["bad_siginfo"] = json!(queued::BAD.load(Ordering::Relaxed));
            extra["values"] = json!(
                counts
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| **c > 0)
                    .map(|(v, _)| v)
                    .collect::<Vec<_>>()
            );
            n
        }
        "futex" => {
            let word = AtomicU32::new(0);
            let mut n = 0;
            while !stdin_closed() {
                checked_futex(&word, d, &errors);
                n += 1;
            }
            n
        }
        "read" => {
            let stdin = std::io::stdin();
            let mut n = 0u64;
            loop {
                let mut b = [0u8; 8];
                match rustix::io::read(stdin.as_fd(), &mut b) {
                    Ok(0) => break,
                    Ok(8) => {
                        let v = u64::from_le_bytes(b);
                        if v != n {
                            errors.push(format!("read {v}, expected {n}"));
                        }
                        n += 1;
                    }
                    Ok(k) => errors.push(format!("short read of {k} bytes")),
                    Err(e) => errors.push(format!("read: {e}")),
                }
            }
            n
        }
        "epoll" | "epoll-uring" => {
            use rustix::event::epoll;
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
            let stdin = std::io::stdin();
            epoll::add(
                &ep,
                &stdin,
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN,
            )
            .unwrap();
            let mut buf = [std::mem::MaybeUninit::<epoll::Event>::uninit(); 4];
            let mut n = 0;
            loop {
                match epoll::wait(&ep, &mut buf, Some(&ts(d))) {
                    Ok((ready, _)) if !ready.is_empty() => break, // stdin readable or closed
                    Ok(_) => {}
                    Err(rustix::io::Errno::INTR) => {
                        errors.push("epoll_wait: EINTR".into());
                        extra["eintr"] = json!(extra["eintr"].as_u64().unwrap_or(0) + 1);
                    }
                    Err(e) => errors.push(format!("epoll_wait: {e}")),
                }
                n += 1;
            }
            n
        }
        "threads" => {
            let mut n = 0;
            for line in std::io::stdin().lock().lines() {
                let Ok(line) = line else { break };
                if line.trim() == "progress" {
                    let c: Vec<u64> = counters.iter().map(|c| c.load(Ordering::Relaxed)).collect();
                    println!(
                        "{}",
                        json!({"spin": c[0], "sleep": c[1], "futex": c[2], "epoll": c[3], "errors": errors.list()})
                    );
                }
                n += 1;
            }
            n
        }
        "exit-after" => {
            // Until the timer thread exits the process.
            loop {
                checked_sleep(Duration::from_millis(5), false, &errors);
            }
        }
        "spawn-blocked" => {
            use nix::spawn::{PosixSpawnAttr, PosixSpawnFileActions, posix_spawn};
            let fifo = a.fifo.as_deref().expect("--fifo");
            let mut fa = PosixSpawnFileActions::init().unwrap();
            fa.add_open(
                3,
                fifo,
                nix::fcntl::OFlag::O_RDONLY,
                nix::sys::stat::Mode::empty(),
            )
            .unwrap();
            let exe = std::env::current_exe().unwrap();
            let exe = std::ffi::CString::new(exe.to_str().unwrap()).unwrap();
            let argv = [exe.clone(), std::ffi::CString::new("noop").unwrap()];
            let env: [std::ffi::CString; 0] = [];
            match posix_spawn(
                exe.as_c_str(),
                &fa,
                &PosixSpawnAttr::init().unwrap(),
                &argv,
                &env,
            ) {
                Ok(child) => {
                    let _ = nix::sys::wait::waitpid(child, None);
                }
                Err(e) => errors.push(format!("posix_spawn: {e}")),
            }
            sleep_loop(d, false, &errors)
        }
        m => panic!("unknown mode {m}"),
    };
    stop.store(true, Ordering::Relaxed);
    // The reader's end of the data.
    drop(pipe_writer.take());
    for h in handles {
        let _ = h.join();
    }
    extra["final"] = json!(true);
    extra["iterations"] = json!(iterations);
    extra["errors"] = json!(errors.list());
    extra["checksum"] = json!(checksum(&region));
    println!("{extra}");
}
