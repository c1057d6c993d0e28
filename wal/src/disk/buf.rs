//! [`AlignedBuf`]: a heap buffer whose address and capacity are multiples of the direct-I/O
//! alignment, as O_DIRECT requires.
//!
//! A buffer moves into a disk operation and comes back with its completion (the
//! tokio-uring ownership rule), so the kernel never reads memory the WAL could reuse.

use std::alloc::{self, Layout};
use std::fmt;
use std::ptr::NonNull;

use crate::format::align_up;

/// A fixed-capacity byte buffer aligned for O_DIRECT.
///
/// `len()` bytes are filled; `capacity()` is a multiple of `align()`, and so is the
/// address of the first byte.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    layout: Layout,
}

// SAFETY: AlignedBuf owns its allocation exclusively (like a Vec<u8>); nothing else holds
// the pointer except a disk operation that owns the buffer while it runs.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only reads through `&self`, as for `Vec<u8>`.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zero-filled buffer of at least `capacity` bytes (rounded up to `align`), whose
    /// address is a multiple of `align`.
    ///
    /// # Panics
    /// If `align` is not a power of two, or the allocation fails.
    #[must_use]
    pub fn zeroed(capacity: usize, align: usize) -> AlignedBuf {
        assert!(
            align.is_power_of_two(),
            "alignment {align} is not a power of two"
        );
        let cap = align_up(capacity.max(1) as u64, align as u64) as usize;
        let layout = Layout::from_size_align(cap, align).expect("invariant: valid layout");
        // SAFETY: the layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf {
            ptr,
            len: 0,
            layout,
        }
    }

    /// Bytes filled so far.
    #[must_use]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is filled.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Total bytes the buffer holds (a multiple of [`AlignedBuf::align`]).
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.layout.size()
    }

    /// The alignment of the address and capacity, in bytes.
    #[must_use]
    pub fn align(&self) -> usize {
        self.layout.align()
    }

    /// Pointer to the first byte (for the kernel).
    #[must_use]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The filled bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity() initialised bytes (zeroed at allocation) and
        // len <= capacity.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The unfilled bytes after `len()`, to encode into; then call [`AlignedBuf::advance`].
    pub fn spare_mut(&mut self) -> &mut [u8] {
        let cap = self.capacity();
        // SAFETY: the range [len, cap) lies inside the allocation, which is initialised,
        // and &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(self.len), cap - self.len) }
    }

    /// Marks `n` more bytes as filled.
    ///
    /// # Panics
    /// If that would exceed the capacity.
    pub fn advance(&mut self, n: usize) {
        assert!(
            self.len + n <= self.capacity(),
            "advance past the buffer's capacity"
        );
        self.len += n;
    }

    /// Writes zeros up to the next multiple of `align` (which must divide the buffer's
    /// alignment) and returns the number of padding bytes.
    ///
    /// # Panics
    /// If `align` does not divide the buffer's alignment.
    pub fn pad_to(&mut self, align: usize) -> usize {
        assert!(
            align.is_power_of_two() && align <= self.align(),
            "bad padding alignment {align}"
        );
        let end = align_up(self.len as u64, align as u64) as usize;
        let pad = end - self.len;
        self.spare_mut()[..pad].fill(0);
        self.len = end;
        pad
    }

    /// Empties the buffer (the bytes are overwritten by the next use).
    pub fn clear(&mut self) {
        self.len = 0;
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout and is freed once.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

impl fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AlignedBuf")
            .field("len", &self.len)
            .field("capacity", &self.capacity())
            .field("align", &self.align())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_padded() {
        let mut b = AlignedBuf::zeroed(5000, 4096);
        assert_eq!(b.capacity(), 8192);
        assert_eq!(b.as_ptr() as usize % 4096, 0);
        b.spare_mut()[..3].copy_from_slice(b"abc");
        b.advance(3);
        assert_eq!(b.pad_to(4096), 4093);
        assert_eq!(b.len(), 4096);
        assert_eq!(&b.as_slice()[..4], b"abc\0");
        b.clear();
        assert!(b.is_empty());
    }
}
