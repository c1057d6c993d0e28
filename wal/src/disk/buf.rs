//! [`AlignedBuf`]: a heap buffer whose address and capacity are multiples of the direct-I/O
//! alignment, as O_DIRECT requires.
//!
//! A buffer moves into a disk operation and comes back with its completion (the
//! tokio-uring ownership rule), so the kernel never reads memory the WAL could reuse.
//!
//! Large buffers that live long (the commit thread's batch buffers, the preallocator's
//! zeros) come from [`AlignedBuf::zeroed_huge`]: their own anonymous mapping, aligned to
//! and sized in [`HUGE_PAGE_BYTES`], marked `MADV_HUGEPAGE`. Where transparent huge pages
//! are available, every O_DIRECT write from such a buffer pins one page per 2 MiB instead
//! of one per 4 KiB, and its bio is a few physically contiguous segments instead of one per
//! page (a 1 MiB write from 4 KiB pages has 256 segments, more than many devices take in
//! one request, so it is split). Where they are not, the buffer is an ordinary one.

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
    /// Where the memory comes from (and how it is given back).
    source: Source,
}

/// The size and alignment of a transparent huge page on x86-64 and arm64 (4 KiB base
/// pages), in bytes; what [`AlignedBuf::zeroed_huge`] rounds to.
pub const HUGE_PAGE_BYTES: usize = 2 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Source {
    /// The global allocator, with `layout`.
    Heap,
    /// An anonymous mapping of exactly `layout.size()` bytes at `ptr`.
    Mapped,
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
            source: Source::Heap,
        }
    }

    /// A zero-filled buffer of at least `capacity` bytes, rounded up to a multiple of
    /// [`HUGE_PAGE_BYTES`] and at that alignment (so also at `align`), backed by
    /// transparent huge pages where the kernel grants them (see the module docs). Falls
    /// back to [`AlignedBuf::zeroed`] when the mapping cannot be made.
    ///
    /// # Panics
    /// If `align` is not a power of two, or is above [`HUGE_PAGE_BYTES`].
    #[must_use]
    pub fn zeroed_huge(capacity: usize, align: usize) -> AlignedBuf {
        assert!(
            align.is_power_of_two() && align <= HUGE_PAGE_BYTES,
            "bad alignment {align}"
        );
        let cap = align_up(capacity.max(1) as u64, HUGE_PAGE_BYTES as u64) as usize;
        let reserve = cap + HUGE_PAGE_BYTES;
        // SAFETY: an anonymous private mapping at an address of the kernel's choice; no
        // existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reserve,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return AlignedBuf::zeroed(capacity, align);
        }
        let start = raw as usize;
        let aligned = align_up(start as u64, HUGE_PAGE_BYTES as u64) as usize;
        let head = aligned - start;
        let tail = reserve - head - cap;
        // SAFETY: both ranges lie inside the mapping just made, are page-aligned (mmap
        // returns page-aligned addresses and HUGE_PAGE_BYTES is a multiple of the page
        // size), and nothing refers to them. Failures only leave the slack mapped.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + cap) as *mut libc::c_void, tail);
            }
            // Advisory: without it (or without THP) the pages are ordinary ones.
            libc::madvise(aligned as *mut libc::c_void, cap, libc::MADV_HUGEPAGE);
        }
        let ptr = NonNull::new(aligned as *mut u8).expect("invariant: mmap never returns null");
        // Fault the pages in now (as huge pages, after the madvise), not on the write path.
        // SAFETY: [aligned, aligned + cap) is our mapping, readable and writable.
        unsafe { std::ptr::write_bytes(ptr.as_ptr(), 0, cap) };
        AlignedBuf {
            ptr,
            len: 0,
            layout: Layout::from_size_align(cap, HUGE_PAGE_BYTES).expect("invariant: valid layout"),
            source: Source::Mapped,
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
        match self.source {
            // SAFETY: ptr was allocated with exactly this layout and is freed once.
            Source::Heap => unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) },
            // SAFETY: ptr starts a mapping of exactly layout.size() bytes that this buffer
            // owns and unmaps once; no operation holds it any more (buffers come back with
            // their completion).
            Source::Mapped => unsafe {
                libc::munmap(self.ptr.as_ptr().cast(), self.layout.size());
            },
        }
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

    #[test]
    fn huge_buffers_are_aligned_zeroed_and_usable() {
        let mut b = AlignedBuf::zeroed_huge(1 << 20, 4096);
        assert_eq!(b.capacity(), HUGE_PAGE_BYTES);
        assert_eq!(b.as_ptr() as usize % HUGE_PAGE_BYTES, 0);
        assert!(b.spare_mut().iter().all(|&x| x == 0));
        b.spare_mut()[..3].copy_from_slice(b"abc");
        b.advance(3);
        assert_eq!(b.pad_to(4096), 4093);
        assert_eq!(&b.as_slice()[..4], b"abc\0");
        let c = AlignedBuf::zeroed_huge(HUGE_PAGE_BYTES + 1, 512);
        assert_eq!(c.capacity(), 2 * HUGE_PAGE_BYTES);
    }
}
