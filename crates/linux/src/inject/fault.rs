//! Fault injection, for the tests of the release path.
//!
//! The death-of-the-tracer invariant (see the parent module) is only
//! believed because it is tried: the tests make the tracing process kill
//! itself between every two ptrace steps of an injection in turn, and
//! check that the target resumes unharmed. [`checkpoint`] marks those
//! moments. Outside tests the variable is unset and a checkpoint costs
//! one atomic load.

use super::calls::Syscall;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

/// Where a batch is cut: given its calls, the index of the call before
/// which it is cut, or `None` to run it whole.
pub type CutRule = Box<dyn Fn(&[Syscall]) -> Option<usize> + Send>;

/// Whether a [`CutRule`] is set: the one load a batch costs without one.
static CUTTING: AtomicBool = AtomicBool::new(false);
static CUT_RULE: Mutex<Option<CutRule>> = Mutex::new(None);

/// For tests of what callers do with a batch abandoned part-way: from now
/// on, every batch of this process is cut where `rule` says, exactly as a
/// target frozen between two calls cuts it (the thread released onto its
/// rescue frame, the outcome
/// [`SkipReason::SyscallTimeout`](super::SkipReason::SyscallTimeout) with
/// the results of the calls that ran), only without waiting for the call
/// timeout. `None` turns it off. The setting is process-wide: tests that
/// use it must not run beside other injecting tests of their binary, and
/// must turn it off even when they fail.
pub fn cut_batches(rule: Option<CutRule>) {
    let mut r = CUT_RULE.lock().unwrap_or_else(PoisonError::into_inner);
    CUTTING.store(rule.is_some(), Ordering::SeqCst);
    *r = rule;
}

/// [`cut_batches`] with the rule "before call `call` (0-based), in every
/// batch that has one"; `None` turns cutting off.
pub fn cut_batches_before(call: Option<usize>) {
    cut_batches(call.map(|i| -> CutRule { Box::new(move |calls| (calls.len() > i).then_some(i)) }));
}

/// Where the batch of `calls` is to be cut, if anywhere.
pub(super) fn cut_point(calls: &[Syscall]) -> Option<usize> {
    if !CUTTING.load(Ordering::Relaxed) {
        return None;
    }
    let r = CUT_RULE.lock().unwrap_or_else(PoisonError::into_inner);
    r.as_ref().and_then(|rule| rule(calls))
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
