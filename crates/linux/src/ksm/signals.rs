//! SIGTERM/SIGINT for a process that owns KSM: a graceful shutdown first,
//! then, if it does not come in time (or on a second signal), every live
//! guard restored and the process killed by the signal as it would have
//! been without a handler.
//!
//! The handler is a `signal-hook` iterator on its own thread, so the
//! restore runs as ordinary code, not in a signal handler. SIGKILL cannot
//! be caught; the lock file's record covers it.

use super::error::KsmError;
use super::guard::{LIVE, Owner, lock_owner};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

/// SIGTERM/SIGINT handling for a process that owns KSM.
///
/// After [`install`](Self::install), the first SIGTERM or SIGINT sets
/// [`requested`](Self::requested), so the daemon can shut down gracefully
/// and drop its guard. If the process is still alive `grace` later, or on a
/// second signal, every live [`KsmGuard`](super::KsmGuard) of the process is
/// restored (their writes refused from then on) and the process dies of the
/// signal, as it would have without a handler. With a zero grace this happens at once.
/// SIGKILL cannot be caught: the lock file's record covers it.
#[derive(Clone, Debug)]
pub struct TerminationWatch {
    requested: Arc<AtomicBool>,
}

static WATCH: OnceLock<TerminationWatch> = OnceLock::new();

impl TerminationWatch {
    /// Installs the handler (once per process; later calls return the
    /// first watch and ignore their `grace`).
    pub fn install(grace: Duration) -> Result<TerminationWatch, KsmError> {
        if let Some(w) = WATCH.get() {
            return Ok(w.clone());
        }
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
            .map_err(|e| KsmError::io("installing SIGTERM/SIGINT handlers", e))?;
        let watch = TerminationWatch {
            requested: Arc::new(AtomicBool::new(false)),
        };
        let w = WATCH.get_or_init(|| watch.clone()).clone();
        let requested = w.requested.clone();
        std::thread::Builder::new()
            .name("pagesift-ksm-signals".into())
            .spawn(move || {
                for sig in signals.forever() {
                    if requested.swap(true, Ordering::SeqCst) || grace.is_zero() {
                        restore_all_and_die(sig);
                    }
                    std::thread::spawn(move || {
                        std::thread::sleep(grace);
                        restore_all_and_die(sig);
                    });
                }
            })
            .map_err(|e| KsmError::io("starting the signal thread", e))?;
        Ok(w)
    }

    /// Whether SIGTERM or SIGINT has arrived.
    pub fn requested(&self) -> bool {
        self.requested.load(Ordering::SeqCst)
    }
}

/// Restores every live guard, refuses their further writes, and dies of
/// `sig`.
fn restore_all_and_die(sig: i32) -> ! {
    let live: Vec<Arc<Mutex<Owner>>> = LIVE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect();
    // Hold every owner until the end, so no thread writes after its
    // restore.
    let mut held = Vec::new();
    for o in &live {
        let mut g = lock_owner(o);
        if let Some(r) = g.release()
            && !r.is_complete()
        {
            eprintln!("pagesift: {r}");
        }
        g.closed = true;
        held.push(g);
    }
    let _ = signal_hook::low_level::emulate_default_handler(sig);
    std::process::exit(128 + sig);
}
