//! The one copy of a payload on the write path: into a batch buffer that only the device
//! reads back (by DMA, for an O_DIRECT write), never the CPU.
//!
//! A plain `memcpy` of a large payload reads every destination cache line before it
//! writes it (read-for-ownership) and fills the cache with lines nobody will read. Measured
//! here (`quire bench wal --event-size 64KiB --appenders 64`, 2-vCPU VM, AMD EPYC): the commit
//! thread spent 40–48% of its time in `memmove`, about 4 GB/s against 12–40 GB/s for the
//! same copy in a stand-alone loop, because the batch buffers' lines were last touched on
//! the other vCPU. Non-temporal stores (`MOVNTDQ`) write whole lines without reading them:
//! the commit thread's CPU time fell by 35–40% at 64 KiB events, and the copy time of a
//! 256 KiB event lost its slow outliers (mean 24–29 µs → 13–14 µs, p50 unchanged).
//!
//! Below [`STREAM_BYTES_MIN`] bytes, and on targets other than x86_64, this is an ordinary
//! copy.

/// Payloads shorter than this are copied with ordinary stores: too few whole lines for the
/// non-temporal path to pay for its fence.
pub(crate) const STREAM_BYTES_MIN: usize = 4096;

/// Copies `src` into `dst` (same length), with non-temporal stores for large copies on
/// x86_64. The stores are fenced (`SFENCE`) before it returns, so the bytes are ordered
/// before anything the caller does next (such as handing the buffer to the kernel).
///
/// # Panics
/// If the lengths differ.
pub(crate) fn copy_for_device(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_for_device: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= STREAM_BYTES_MIN {
        stream_copy_x86_64(dst, src);
        return;
    }
    dst.copy_from_slice(src);
}

/// Bytes moved per loop iteration: one 64-byte cache line as four 16-byte stores.
#[cfg(target_arch = "x86_64")]
const LINE_BYTES: usize = 64;

/// The non-temporal copy: an ordinary copy up to the first 16-byte-aligned destination
/// byte, whole 64-byte blocks with `MOVNTDQ` (SSE2, part of the x86_64 baseline, so no
/// run-time detection is needed), an ordinary copy of the rest, then `SFENCE`.
#[cfg(target_arch = "x86_64")]
fn stream_copy_x86_64(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};

    debug_assert_eq!(dst.len(), src.len());
    let len = dst.len();
    let head = dst.as_ptr().align_offset(16).min(len);
    let body = (len - head) / LINE_BYTES * LINE_BYTES;
    dst[..head].copy_from_slice(&src[..head]);
    let blocks = body / LINE_BYTES;
    // SAFETY: `dst[head..head + body]` and `src[head..head + body]` are in bounds (head +
    // body <= len, both slices have `len` bytes) and do not overlap (`dst` is a unique
    // borrow). `d` is 16-byte aligned (align_offset above), as `_mm_stream_si128` requires;
    // the loads are unaligned loads. Each iteration moves 64 bytes = four `__m128i`, and
    // there are exactly `blocks` iterations, so no pointer leaves the ranges. SSE2 is
    // always present on x86_64.
    unsafe {
        let mut d = dst.as_mut_ptr().add(head).cast::<__m128i>();
        let mut s = src.as_ptr().add(head).cast::<__m128i>();
        for _ in 0..blocks {
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            d = d.add(4);
            s = s.add(4);
        }
        // Non-temporal stores are weakly ordered: fence them before the buffer is used.
        _mm_sfence();
    }
    dst[head + body..].copy_from_slice(&src[head + body..]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Every length and every relative alignment of source and destination copies
        /// exactly the source and touches nothing outside the destination.
        #[test]
        fn copies_exactly_at_any_alignment(
            len in 0usize..20_000,
            dst_skew in 0usize..64,
            src_skew in 0usize..64,
            seed in any::<u8>(),
        ) {
            let src_store: Vec<u8> = (0..len + 64)
                .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                .collect();
            let src = &src_store[src_skew..src_skew + len];
            let mut dst_store = vec![0xA5u8; len + 128];
            copy_for_device(&mut dst_store[dst_skew..dst_skew + len], src);
            prop_assert_eq!(&dst_store[dst_skew..dst_skew + len], src);
            prop_assert!(dst_store[..dst_skew].iter().all(|&b| b == 0xA5));
            prop_assert!(dst_store[dst_skew + len..].iter().all(|&b| b == 0xA5));
        }
    }

    #[test]
    fn large_copies_take_the_streaming_path_and_match() {
        for len in [
            STREAM_BYTES_MIN,
            STREAM_BYTES_MIN + 1,
            64 << 10,
            (256 << 10) + 37,
        ] {
            let src: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let mut dst = vec![0u8; len + 5];
            copy_for_device(&mut dst[5..], &src);
            assert_eq!(&dst[5..], &src[..]);
        }
    }
}
