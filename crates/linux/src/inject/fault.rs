//! Fault injection, for the tests of the release path.
//!
//! The death-of-the-tracer invariant (see the parent module) is only
//! believed because it is tried: the tests make the tracing process kill
//! itself between every two ptrace steps of an injection in turn, and
//! check that the target resumes unharmed. [`checkpoint`] marks those
//! moments. Outside tests the variable is unset and a checkpoint costs
//! one atomic load.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

/// The index of the call before which every batch is cut, or `usize::MAX`.
static CUT_BEFORE: AtomicUsize = AtomicUsize::new(usize::MAX);

/// For tests of what callers do with a batch abandoned part-way: from now
/// on, every batch of this process with more than `call` calls is cut
/// before its `call`-th (0-based), exactly as a target frozen between two
/// calls cuts it (the thread released onto its rescue frame, the outcome
/// [`SkipReason::SyscallTimeout`](super::SkipReason::SyscallTimeout) with
/// the results of the calls that ran), only without waiting for the call
/// timeout. `None` turns it off. The setting is process-wide: a test that
/// uses it must be alone in its test binary.
pub fn cut_batches_before(call: Option<usize>) {
    CUT_BEFORE.store(call.unwrap_or(usize::MAX), Ordering::SeqCst);
}

/// Whether the batch in hand is to be cut before its call `index`.
pub(super) fn cuts_before(index: usize) -> bool {
    index == CUT_BEFORE.load(Ordering::Relaxed)
}

/// `PAGESIFT_INJECT_FAULT=N` makes the process SIGKILL itself at the N-th
/// checkpoint of its tracer threads (counted from 1 over the process's
/// life); `N:panic` panics the tracer thread there instead, `N:stall`
/// waits 100 ms before the SIGKILL (a window for a test to act in). The
/// checkpoints are the moments between two ptrace steps of an injection.
/// Unset (always, outside tests), a checkpoint is one atomic load.
pub(super) fn checkpoint() {
    use std::sync::OnceLock;
    use std::sync::atomic::AtomicU64;
    static PLAN: OnceLock<Option<(u64, u8)>> = OnceLock::new();
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let plan = PLAN.get_or_init(|| {
        let v = std::env::var("PAGESIFT_INJECT_FAULT").ok()?;
        let (n, how) = match v.split_once(':') {
            Some((n, "panic")) => (n.to_string(), 1),
            Some((n, "stall")) => (n.to_string(), 2),
            _ => (v.clone(), 0),
        };
        Some((n.parse().ok()?, how))
    });
    let Some((n, how)) = *plan else {
        return;
    };
    if COUNT.fetch_add(1, Ordering::SeqCst) + 1 != n {
        return;
    }
    if how == 1 {
        panic!("PAGESIFT_INJECT_FAULT: tracer panics at checkpoint {n}");
    }
    if how == 2 {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}
