//! Ctrl-C (SIGINT) and SIGTERM as a flag that long-running synchronous commands poll, so
//! they can stop cleanly (finish in-flight I/O, delete temporary files) instead of dying
//! mid-operation.
//!
//! The first signal sets the flag and restores the default action, so a second Ctrl-C
//! kills the process at once. Async commands (tokio) should use `tokio::signal` instead.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Installs the SIGINT and SIGTERM handlers. Idempotent. Blocking system calls in any
/// thread may then fail with `EINTR` when a signal arrives; callers retry or stop.
///
/// # Errors
/// `sigaction` failing (only for invalid arguments, i.e. never in practice).
pub fn install() -> io::Result<()> {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: sigaction is plain old data; all-zero is a valid starting value (empty
        // mask, no flags).
        let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
        action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
        // No SA_RESTART: a blocked io_uring_enter returns EINTR so the loop sees the flag.
        action.sa_flags = libc::SA_RESETHAND;
        // SAFETY: `action.sa_mask` is a valid sigset_t owned by this frame.
        unsafe { libc::sigemptyset(&mut action.sa_mask) };
        // SAFETY: `action` is fully initialized and the handler only performs an atomic
        // store, which is async-signal-safe; the old action is not requested.
        let rc = unsafe { libc::sigaction(signal, &action, std::ptr::null_mut()) };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// True once SIGINT or SIGTERM arrived after [`install`].
pub fn is_interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// The error a command returns when it stopped because of a signal; the binary maps it to
/// exit status 130 (128 + SIGINT), as shells do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("interrupted by a signal")]
pub struct Interrupted;
