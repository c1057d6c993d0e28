//! [`FramePool`]: large frame buffers kept for the next frames instead of going back to the
//! system, so the bytes of a busy connection land on pages already mapped.
//!
//! A frame body of at least [`crate::MMAP_THRESHOLD_BYTES`] lives in a mapping of its own
//! (see [`crate::return_large_buffers_to_the_os`]). Mapping a fresh one per frame costs a
//! page fault per 4 KiB the socket copies in, and the kernel zeroes every page first:
//! measured on a store at capacity (1 KiB messages, appends of up to 1 MiB), 84% of its page
//! faults were in `tcp_recvmsg` copying into fresh frame buffers, 0.13–0.17 faults per
//! message. So a frame's buffer, once the last slice of it is dropped, comes back here (its
//! pages still mapped) and the reader takes it for a later large frame.
//!
//! Bounds: a buffer is kept only if its capacity is at most [`POOLED_BUFFER_BYTES_MAX`] and
//! the pool then holds at most [`POOLED_BYTES_MAX`] bytes of capacity; everything else is
//! freed as before. So the pool adds at most `POOLED_BYTES_MAX` of resident memory to a
//! process, whatever its peers send. A buffer is only taken for a frame whose whole body
//! fits it with at most a quarter to spare: a header that announces a large body does not
//! make the reader allocate, and a slice a server keeps of a frame pins at most 1.25 times
//! the frame's bytes.

use std::sync::{Mutex, OnceLock, PoisonError};

use bytes::Bytes;

/// Largest buffer capacity kept for reuse, in bytes: a 1 MiB append frame and its
/// overhead, with room to spare.
pub const POOLED_BUFFER_BYTES_MAX: usize = 2 << 20;
/// Most bytes of capacity the pool keeps, in bytes.
pub const POOLED_BYTES_MAX: usize = 16 << 20;

/// Buffers waiting for a frame. One per process ([`FramePool::global`]).
#[derive(Debug, Default)]
pub struct FramePool {
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    buffers: Vec<Vec<u8>>,
    bytes: usize,
}

impl FramePool {
    /// The process's pool.
    pub fn global() -> &'static FramePool {
        static POOL: OnceLock<FramePool> = OnceLock::new();
        POOL.get_or_init(FramePool::default)
    }

    /// An empty buffer of capacity at least `bytes` and at most a quarter more (the
    /// smallest that fits) from the pool, or `None`. The bound keeps what a kept slice of
    /// a frame pins close to the frame's own size.
    pub fn take(&self, bytes: usize) -> Option<Vec<u8>> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let most = bytes.saturating_add(bytes / 4);
        let i = st
            .buffers
            .iter()
            .enumerate()
            .filter(|(_, b)| (bytes..=most).contains(&b.capacity()))
            .min_by_key(|(_, b)| b.capacity())
            .map(|(i, _)| i)?;
        let b = st.buffers.swap_remove(i);
        st.bytes -= b.capacity();
        Some(b)
    }

    /// Keeps `buffer` for a later frame if the bounds allow, else frees it.
    pub fn give(&self, mut buffer: Vec<u8>) {
        let cap = buffer.capacity();
        if !(crate::MMAP_THRESHOLD_BYTES..=POOLED_BUFFER_BYTES_MAX).contains(&cap) {
            return;
        }
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if st.bytes + cap > POOLED_BYTES_MAX {
            return;
        }
        buffer.clear();
        st.bytes += cap;
        st.buffers.push(buffer);
    }

    /// Bytes of capacity kept now.
    pub fn bytes(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .bytes
    }

    /// `body` as shared bytes that give their buffer back to the pool when the last slice
    /// of them is dropped.
    pub fn freeze(&'static self, body: Vec<u8>) -> Bytes {
        Bytes::from_owner(Pooled { body, pool: self })
    }
}

/// A frame body that returns to its pool when dropped.
#[derive(Debug)]
struct Pooled {
    body: Vec<u8>,
    pool: &'static FramePool,
}

impl AsRef<[u8]> for Pooled {
    fn as_ref(&self) -> &[u8] {
        &self.body
    }
}

impl Drop for Pooled {
    fn drop(&mut self) {
        self.pool.give(std::mem::take(&mut self.body));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_frame_gives_its_buffer_back_within_the_bounds() {
        let pool: &'static FramePool = Box::leak(Box::default());
        let mut body = Vec::with_capacity(1 << 20);
        body.resize(1000, 7);
        let ptr = body.as_ptr();
        let bytes = pool.freeze(body);
        let slice = bytes.slice(10..20);
        drop(bytes);
        assert_eq!(pool.bytes(), 0, "a slice still holds it");
        drop(slice);
        assert_eq!(pool.bytes(), 1 << 20);
        // Larger than what is kept, or much smaller: none; then the same buffer, empty.
        assert!(pool.take(2 << 20).is_none());
        assert!(pool.take(4096).is_none());
        let again = pool.take(900 << 10).expect("pooled");
        assert_eq!((again.as_ptr(), again.len()), (ptr, 0));
        assert_eq!(pool.bytes(), 0);
        // Small and huge buffers are freed, and the pool stops at its byte bound.
        pool.give(Vec::with_capacity(4096));
        pool.give(Vec::with_capacity(POOLED_BUFFER_BYTES_MAX + 1));
        assert_eq!(pool.bytes(), 0);
        for _ in 0..(POOLED_BYTES_MAX / (2 << 20) + 3) {
            pool.give(Vec::with_capacity(2 << 20));
        }
        assert_eq!(pool.bytes(), POOLED_BYTES_MAX);
    }
}
