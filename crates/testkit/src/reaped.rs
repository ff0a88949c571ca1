//! A child process that is SIGKILLed and reaped when its guard drops.
//!
//! For children a test starts by hand (a `pagesift run` with unusual
//! arguments, a helper program): dropped also when the test panics, so a
//! daemon left behind never keeps the test runner's output pipe open or
//! holds KSM.

use std::process::Child;

/// A child killed (if still running) and reaped on drop.
pub struct Reaped(pub Child);

impl Reaped {
    /// Waits for the child to exit by itself.
    pub fn wait(&mut self) -> std::io::Result<std::process::ExitStatus> {
        self.0.wait()
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}
