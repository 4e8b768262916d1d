//! This process's id without a syscall per call: glibc no longer caches `getpid`, and the wake
//! hub asks on every native await (2-3% of a memory turn's samples). A fork handler installed on
//! first use refreshes it in the child, so a forked child never sees its parent's id.

use std::sync::Once;
use std::sync::atomic::{AtomicU32, Ordering};

static PID: AtomicU32 = AtomicU32::new(0);
static HANDLER: Once = Once::new();

extern "C" fn in_child() {
    // Async-signal-safe: one syscall and an atomic store.
    PID.store(std::process::id(), Ordering::Relaxed);
}

/// The calling process's id (as `std::process::id()`).
pub fn current() -> u32 {
    HANDLER.call_once(|| {
        // SAFETY: registers a handler that only reads the process id and stores it in an atomic.
        // Should registering fail, the id stays unset (0) and every call asks the kernel.
        let registered = unsafe { libc::pthread_atfork(None, None, Some(in_child)) } == 0;
        if registered {
            PID.store(std::process::id(), Ordering::Relaxed);
        }
    });
    match PID.load(Ordering::Relaxed) {
        0 => std::process::id(),
        pid => pid,
    }
}
