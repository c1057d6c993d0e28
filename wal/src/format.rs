//! Record framing: the bytes of one record, encoded into and decoded from byte slices.
//!
//! This module owns the record layout and its checksum and nothing else: no files, no
//! offsets bookkeeping, no alignment decisions beyond the constants the rest of the crate
//! shares. Everything here is pure and works on `&[u8]` / `&mut [u8]`.
//!
//! # Record layout
//!
//! Every record is a 32-byte header followed by `length` payload bytes. All integers are
//! little-endian. Records are packed back to back inside a batch; the batch is padded with
//! zeros up to the write alignment (see `docs/format.md`).
//!
//! ```text
//!  byte  0        4        6   7   8            12           16                  24                  32
//!        +--------+--------+---+---+------------+------------+-------------------+-------------------+---------
//!        | crc32c | magic  |ver|knd|  length    |  reserved  |      epoch        |      offset       | payload…
//!        |  u32   |  u16   |u8 |u8 |   u32      |  u32 = 0   |       u64         |       u64         | length B
//!        +--------+--------+---+---+------------+------------+-------------------+-------------------+---------
//! ```
//!
//! - `crc32c`: CRC-32C (Castagnoli, the `crc32c` crate) over header bytes `4..32` followed
//!   by the payload. It does not cover itself.
//! - `magic`: [`MAGIC`] (`"QW"` as the bytes `0x51 0x57`). A zero magic means "no record
//!   here" (zero padding or preallocated space); a record can never start with it.
//! - `ver`: [`VERSION`].
//! - `knd`: the event kind byte, opaque to the WAL, except [`KIND_TRUNCATE`] (`0xFF`), the
//!   WAL's own truncation marker, which no event may use.
//! - `length`: payload bytes, at most [`PAYLOAD_BYTES_MAX`].
//! - `reserved`: zero in version 1; a non-zero value makes the header invalid.
//! - `epoch`: the entry epoch (or, for a truncation marker, the writer epoch).
//! - `offset`: the entry's log offset (or, for a marker, the first offset it replaces).

use quire_proto::{Epoch, Event, Offset};

/// Size of a record header in bytes.
pub const HEADER_BYTES: usize = 32;

/// The two magic bytes at header bytes 4..6: `"QW"`, read as a little-endian `u16`.
pub const MAGIC: u16 = u16::from_le_bytes(*b"QW");

/// The record format version this crate writes and reads.
pub const VERSION: u8 = 1;

/// The kind byte of a truncation marker. Owned by the WAL: an event may not use it.
pub const KIND_TRUNCATE: u8 = 0xFF;

/// The largest payload one record may carry, in bytes (16 MiB).
pub const PAYLOAD_BYTES_MAX: usize = 16 << 20;

/// The granularity at which zero padding is skipped during a scan, in bytes. Every write
/// alignment is a power-of-two multiple of it, so a batch always starts at a multiple of
/// this value whatever alignment the writer used.
pub const PAD_GRANULE_BYTES: u64 = 512;

const _: () = assert!(HEADER_BYTES == 4 + 2 + 1 + 1 + 4 + 4 + 8 + 8);
const _: () = assert!(HEADER_BYTES as u64 <= PAD_GRANULE_BYTES);
const _: () = assert!(PAYLOAD_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(MAGIC != 0);
const _: () = assert!(PAD_GRANULE_BYTES.is_power_of_two());

/// A decoded record header (the checksum is checked separately, see [`checksum_ok`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The stored CRC-32C.
    pub crc: u32,
    /// Kind byte: an event kind, or [`KIND_TRUNCATE`].
    pub kind: u8,
    /// Payload length in bytes.
    pub length: u32,
    /// Entry epoch, or the writer epoch of a truncation marker.
    pub epoch: Epoch,
    /// Entry offset, or the first offset a truncation marker replaces.
    pub offset: Offset,
}

impl Header {
    /// Header plus payload, in bytes.
    #[must_use]
    pub fn record_bytes(&self) -> u64 {
        HEADER_BYTES as u64 + u64::from(self.length)
    }

    /// Whether this is the WAL's truncation marker.
    #[must_use]
    pub fn is_truncate_marker(&self) -> bool {
        self.kind == KIND_TRUNCATE
    }
}

/// Why 32 bytes are not a record header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeaderProblem {
    /// Fewer than [`HEADER_BYTES`] bytes were available.
    Short,
    /// All 32 bytes are zero: padding or preallocated space, not a record.
    Zero,
    /// The magic bytes are wrong.
    BadMagic,
    /// An unknown format version.
    BadVersion(u8),
    /// The reserved field is not zero.
    BadReserved,
    /// The payload length exceeds [`PAYLOAD_BYTES_MAX`].
    TooLong(u32),
}

/// Encoded size of a record with `payload_len` payload bytes.
#[must_use]
pub const fn record_bytes(payload_len: usize) -> usize {
    HEADER_BYTES + payload_len
}

/// Writes one record (header and payload) at the start of `dst` and returns the bytes
/// written (`HEADER_BYTES + payload.len()`). This is the only copy of the payload the
/// write path makes.
///
/// # Panics
/// If `dst` is shorter than the record or `payload` exceeds [`PAYLOAD_BYTES_MAX`]; callers
/// size their buffers from [`record_bytes`] and validate payloads first.
pub fn encode(dst: &mut [u8], epoch: Epoch, offset: Offset, kind: u8, payload: &[u8]) -> usize {
    let crc = record_crc(epoch, offset, kind, payload);
    encode_with_crc(dst, epoch, offset, kind, payload, crc)
}

/// The header fields after the checksum (bytes `4..32`) of a record.
fn header_tail(epoch: Epoch, offset: Offset, kind: u8, length: u32) -> [u8; HEADER_BYTES - 4] {
    let mut t = [0u8; HEADER_BYTES - 4];
    t[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    t[2] = VERSION;
    t[3] = kind;
    t[4..8].copy_from_slice(&length.to_le_bytes());
    // t[8..12]: reserved, zero.
    t[12..20].copy_from_slice(&epoch.0.to_le_bytes());
    t[20..28].copy_from_slice(&offset.0.to_le_bytes());
    t
}

/// The CRC-32C a record with these fields carries (over header bytes `4..32`, then the
/// payload). Pure, so an appender can compute it on its own thread before it hands the
/// record to the commit thread, which then only copies ([`encode_with_crc`]).
///
/// # Panics
/// If `payload` exceeds [`PAYLOAD_BYTES_MAX`].
#[must_use]
pub fn record_crc(epoch: Epoch, offset: Offset, kind: u8, payload: &[u8]) -> u32 {
    crc_of_chunks(epoch, offset, kind, [payload, &[]])
}

/// [`record_crc`] of the record that holds `event` (its payload's chunks in order).
///
/// # Panics
/// If the payload exceeds [`PAYLOAD_BYTES_MAX`].
#[must_use]
pub fn event_crc(event: &Event) -> u32 {
    crc_of_chunks(
        event.epoch,
        event.offset,
        event.kind.as_u8(),
        event.payload.chunks(),
    )
}

fn crc_of_chunks(epoch: Epoch, offset: Offset, kind: u8, chunks: [&[u8]; 2]) -> u32 {
    let len = chunks[0].len() + chunks[1].len();
    assert!(
        len <= PAYLOAD_BYTES_MAX,
        "payload of {len} bytes exceeds the maximum"
    );
    let length = u32::try_from(len).expect("invariant: PAYLOAD_BYTES_MAX fits in u32");
    let tail = header_tail(epoch, offset, kind, length);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&tail), chunks[0]);
    crc32c::crc32c_append(crc, chunks[1])
}

/// [`encode`] with the checksum already computed by [`record_crc`] for the same fields:
/// writes the record at the start of `dst` and returns its size. The payload is copied
/// once (with non-temporal stores when large: `copy.rs`) and not read again.
///
/// # Panics
/// As [`encode`]. A `crc` that does not match the fields is not detected here: the record
/// would read back as corrupt, so callers pass exactly what `record_crc` returned.
pub fn encode_with_crc(
    dst: &mut [u8],
    epoch: Epoch,
    offset: Offset,
    kind: u8,
    payload: &[u8],
    crc: u32,
) -> usize {
    encode_chunks(dst, epoch, offset, kind, [payload, &[]], crc)
}

/// [`encode_with_crc`] of the record that holds `event`, with `crc` from [`event_crc`]: the
/// payload's chunks are copied one after the other (the only copy the write path makes).
///
/// # Panics
/// As [`encode`].
pub fn encode_event_with_crc(dst: &mut [u8], event: &Event, crc: u32) -> usize {
    encode_chunks(
        dst,
        event.epoch,
        event.offset,
        event.kind.as_u8(),
        event.payload.chunks(),
        crc,
    )
}

fn encode_chunks(
    dst: &mut [u8],
    epoch: Epoch,
    offset: Offset,
    kind: u8,
    chunks: [&[u8]; 2],
    crc: u32,
) -> usize {
    let len = chunks[0].len() + chunks[1].len();
    assert!(
        len <= PAYLOAD_BYTES_MAX,
        "payload of {len} bytes exceeds the maximum"
    );
    let total = record_bytes(len);
    assert!(
        dst.len() >= total,
        "record of {total} bytes does not fit in {} bytes",
        dst.len()
    );
    let length = u32::try_from(len).expect("invariant: PAYLOAD_BYTES_MAX fits in u32");
    let (head, rest) = dst.split_at_mut(HEADER_BYTES);
    head[4..].copy_from_slice(&header_tail(epoch, offset, kind, length));
    let (first, second) = rest[..len].split_at_mut(chunks[0].len());
    crate::copy::copy_for_device(first, chunks[0]);
    crate::copy::copy_for_device(second, chunks[1]);
    head[0..4].copy_from_slice(&crc.to_le_bytes());
    total
}

/// Decodes the header at the start of `bytes` without checking the checksum.
///
/// # Errors
/// A [`HeaderProblem`] saying why these bytes are not a header.
pub fn decode_header(bytes: &[u8]) -> Result<Header, HeaderProblem> {
    let Some(head) = bytes.get(..HEADER_BYTES) else {
        return Err(HeaderProblem::Short);
    };
    if head.iter().all(|&b| b == 0) {
        return Err(HeaderProblem::Zero);
    }
    let u32_at = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[i..i + 8]);
        u64::from_le_bytes(b)
    };
    if u16::from_le_bytes([head[4], head[5]]) != MAGIC {
        return Err(HeaderProblem::BadMagic);
    }
    if head[6] != VERSION {
        return Err(HeaderProblem::BadVersion(head[6]));
    }
    if u32_at(12) != 0 {
        return Err(HeaderProblem::BadReserved);
    }
    let length = u32_at(8);
    if length as usize > PAYLOAD_BYTES_MAX {
        return Err(HeaderProblem::TooLong(length));
    }
    Ok(Header {
        crc: u32_at(0),
        kind: head[7],
        length,
        epoch: Epoch(u64_at(16)),
        offset: Offset(u64_at(24)),
    })
}

/// Whether `record` (header followed by exactly the payload) carries a correct checksum.
///
/// # Panics
/// If `record` is shorter than a header.
#[must_use]
pub fn checksum_ok(record: &[u8]) -> bool {
    assert!(
        record.len() >= HEADER_BYTES,
        "a record is at least a header"
    );
    let stored = u32::from_le_bytes([record[0], record[1], record[2], record[3]]);
    crc32c::crc32c(&record[4..]) == stored
}

/// Rounds `value` up to a multiple of `align` (a power of two).
///
/// # Panics
/// If `align` is not a power of two.
#[must_use]
pub const fn align_up(value: u64, align: u64) -> u64 {
    assert!(align.is_power_of_two());
    (value + align - 1) & !(align - 1)
}

/// Rounds `value` down to a multiple of `align` (a power of two).
///
/// # Panics
/// If `align` is not a power of two.
#[must_use]
pub const fn align_down(value: u64, align: u64) -> u64 {
    assert!(align.is_power_of_two());
    value & !(align - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn encoded(epoch: u64, offset: u64, kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; record_bytes(payload.len())];
        let n = encode(&mut buf, Epoch(epoch), Offset(offset), kind, payload);
        assert_eq!(n, buf.len());
        buf
    }

    /// The marker's kind byte can never be an event's: every event is a
    /// `quire_proto::Event`, whose kind is an `EventKind`.
    #[test]
    fn no_event_kind_uses_the_marker_byte() {
        assert_eq!(quire_proto::EventKind::from_u8(KIND_TRUNCATE), None);
    }

    #[test]
    fn layout_is_as_documented() {
        let buf = encoded(0x0102_0304_0506_0708, 0x1112_1314_1516_1718, 7, b"hello");
        assert_eq!(&buf[4..6], b"QW");
        assert_eq!(buf[6], VERSION);
        assert_eq!(buf[7], 7);
        assert_eq!(&buf[8..12], &5u32.to_le_bytes());
        assert_eq!(&buf[12..16], &[0, 0, 0, 0]);
        assert_eq!(&buf[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&buf[24..32], &0x1112_1314_1516_1718u64.to_le_bytes());
        assert_eq!(&buf[32..], b"hello");
        let crc = crc32c::crc32c(&buf[4..]);
        assert_eq!(&buf[0..4], &crc.to_le_bytes());
    }

    #[test]
    fn a_checksum_computed_ahead_matches_the_one_encode_computes() {
        let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        let (e, o) = (Epoch(9), Offset(1234));
        let crc = record_crc(e, o, 5, &payload);
        let mut a = vec![0u8; record_bytes(payload.len())];
        let mut b = a.clone();
        encode(&mut a, e, o, 5, &payload);
        encode_with_crc(&mut b, e, o, 5, &payload, crc);
        assert_eq!(a, b);
        assert!(checksum_ok(&a));
        assert_ne!(crc, record_crc(e, Offset(1235), 5, &payload));
    }

    #[test]
    fn zero_bytes_are_padding_not_a_record() {
        assert_eq!(decode_header(&[0u8; 32]), Err(HeaderProblem::Zero));
        assert_eq!(decode_header(&[0u8; 31]), Err(HeaderProblem::Short));
    }

    #[test]
    fn bad_fields_are_rejected() {
        let good = encoded(1, 2, 3, b"x");
        let mut b = good.clone();
        b[4] ^= 1;
        assert_eq!(decode_header(&b), Err(HeaderProblem::BadMagic));
        let mut b = good.clone();
        b[6] = 9;
        assert_eq!(decode_header(&b), Err(HeaderProblem::BadVersion(9)));
        let mut b = good.clone();
        b[13] = 1;
        assert_eq!(decode_header(&b), Err(HeaderProblem::BadReserved));
        let mut b = good;
        b[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_header(&b), Err(HeaderProblem::TooLong(u32::MAX)));
    }

    #[test]
    fn alignment_helpers() {
        assert_eq!(align_up(0, 4096), 0);
        assert_eq!(align_up(1, 4096), 4096);
        assert_eq!(align_up(4096, 4096), 4096);
        assert_eq!(align_down(4097, 512), 4096);
    }

    proptest! {
        #[test]
        fn round_trip(epoch: u64, offset: u64, kind: u8, payload in proptest::collection::vec(any::<u8>(), 0..300)) {
            let buf = encoded(epoch, offset, kind, &payload);
            let h = decode_header(&buf).unwrap();
            prop_assert_eq!(h.epoch, Epoch(epoch));
            prop_assert_eq!(h.offset, Offset(offset));
            prop_assert_eq!(h.kind, kind);
            prop_assert_eq!(h.length as usize, payload.len());
            prop_assert_eq!(h.record_bytes() as usize, buf.len());
            prop_assert!(checksum_ok(&buf));
        }

        #[test]
        fn any_bit_flip_is_detected(payload in proptest::collection::vec(any::<u8>(), 0..64), bit in 0usize..(96 * 8)) {
            let mut buf = encoded(5, 6, 1, &payload);
            let bit = bit % (buf.len() * 8);
            buf[bit / 8] ^= 1 << (bit % 8);
            // Either the header no longer parses, or the checksum catches the flip.
            match decode_header(&buf) {
                Err(_) => {}
                Ok(h) => {
                    let end = h.record_bytes() as usize;
                    prop_assert!(end > buf.len() || !checksum_ok(&buf[..end]));
                }
            }
        }
    }
}
