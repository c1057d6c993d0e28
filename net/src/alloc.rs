//! [`return_large_buffers_to_the_os`]: an allocator setting for servers that read frames
//! from untrusted peers.
//!
//! glibc's malloc serves large blocks with `mmap` and gives them back with `munmap`, but it
//! raises that threshold each time such a block is freed (up to 32 MiB on 64-bit). After a
//! few large frames, read buffers of megabytes come from malloc's arenas instead, and their
//! pages stay resident after they are freed: measured on a broker under an attack of
//! partial 16 MiB frames with a 32 MiB read budget, RSS crept from 96 to 162 MiB. Pinning
//! the threshold keeps every buffer of at least [`MMAP_THRESHOLD_BYTES`] in its own
//! mapping: it grows with `mremap` (no copy) and its pages go back to the system as soon as
//! it is dropped, so resident memory follows the read budget.

/// Blocks of at least this many bytes are mapped on their own (glibc's default before it
/// starts adapting is 128 KiB).
pub const MMAP_THRESHOLD_BYTES: usize = 256 * 1024;

/// Free bytes at the top of a malloc heap kept mapped rather than given back (glibc's
/// `M_TRIM_THRESHOLD`; pinning the mmap threshold also pins this one, at 128 KiB). At that
/// default, frames of 64–256 KiB freed at the top of the heap were given back and their
/// pages faulted in again by the next frame: most of a store's page faults under load.
pub const HEAP_TOP_KEPT_BYTES: usize = 8 << 20;

/// Pins malloc's mmap threshold at [`MMAP_THRESHOLD_BYTES`] (glibc only; elsewhere it does
/// nothing). Call once at start, before the server allocates buffers. Returns whether the
/// setting took.
pub fn return_large_buffers_to_the_os() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let bytes = libc::c_int::try_from(MMAP_THRESHOLD_BYTES)
            .expect("invariant: the threshold fits a C int");
        let trim = libc::c_int::try_from(HEAP_TOP_KEPT_BYTES)
            .expect("invariant: the trim threshold fits a C int");
        // SAFETY: mallopt only changes malloc's tuning parameters; M_MMAP_THRESHOLD with a
        // value below HEAP_MAX/2 (32 MiB) and M_TRIM_THRESHOLD with any value are valid at
        // any time, also with threads running.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, bytes) == 1
                && libc::mallopt(libc::M_TRIM_THRESHOLD, trim) == 1
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        false
    }
}
