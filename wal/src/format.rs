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
//!        | crc32c | magic  |ver|knd|  length    |    tag     |      epoch        |      offset       | payload…
//!        |  u32   |  u16   |u8 |u8 |   u32      |    u32     |       u64         |       u64         | length B
//!        +--------+--------+---+---+------------+------------+-------------------+-------------------+---------
//! ```
//!
//! - `crc32c`: CRC-32C (Castagnoli, the `crc32c` crate) over header bytes `4..32` followed
//!   by the payload, continued from the segment's seed ([`SegmentTag::seed`]: 0 in version
//!   1). It does not cover itself.
//! - `magic`: [`MAGIC`] (`"QW"` as the bytes `0x51 0x57`). A zero magic means "no record
//!   here" (zero padding or preallocated space); a record can never start with it.
//! - `ver`: the segment's format version: [`VERSION_1`] in a segment without a header,
//!   [`VERSION`] (2) in a segment with one (see [`SegmentTag`]).
//! - `knd`: the event kind byte, opaque to the WAL, except [`KIND_TRUNCATE`] (`0xFF`), the
//!   WAL's own truncation marker, which no event may use.
//! - `length`: payload bytes, at most [`PAYLOAD_BYTES_MAX`].
//! - `tag` (version 2; `reserved`, zero, in version 1): the low 32 bits of the segment's
//!   [`SegmentTag`]. In version 2 the checksum also covers the whole 64-bit tag: it starts
//!   from the CRC-32C of the tag's 8 bytes. A record left in a reused file from its previous
//!   life therefore never reads as a record of the file's current life.
//! - `epoch`: the entry epoch (or, for a truncation marker, the writer epoch).
//! - `offset`: the entry's log offset (or, for a marker, the first offset it replaces).

use quire_proto::{Epoch, Event, Offset};

/// Size of a record header in bytes.
pub const HEADER_BYTES: usize = 32;

/// The two magic bytes at header bytes 4..6: `"QW"`, read as a little-endian `u16`.
pub const MAGIC: u16 = u16::from_le_bytes(*b"QW");

/// The format version of segments without a header (records from position 0, no tag).
/// Read, and continued until the segment rolls; never started anew.
pub const VERSION_1: u8 = 1;

/// The format version of the segments this crate starts: a [`SegmentHeader`] in the first
/// [`SEGMENT_HEADER_BYTES`], then records that carry the segment's tag.
pub const VERSION: u8 = 2;

/// The bytes at the start of a version-2 segment reserved for its header (the header
/// proper is [`SEGMENT_HEADER_ENCODED_BYTES`]; the rest is zero). Records start at the
/// first multiple of the write alignment at or above it.
pub const SEGMENT_HEADER_BYTES: u64 = 512;

/// The encoded size of a [`SegmentHeader`], in bytes.
pub const SEGMENT_HEADER_ENCODED_BYTES: usize = 32;

/// The two magic bytes of a segment header at bytes 4..6: `"QS"`. A record has `"QW"`
/// there, so the first bytes of a file tell a version-2 segment from a version-1 one.
pub const SEGMENT_MAGIC: u16 = u16::from_le_bytes(*b"QS");

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
const _: () = assert!(SEGMENT_MAGIC != MAGIC);
const _: () = assert!(SEGMENT_HEADER_BYTES == PAD_GRANULE_BYTES);
const _: () = assert!(PAD_GRANULE_BYTES.is_power_of_two());

/// The identity of one life of a segment file: a random 64-bit value drawn when the file
/// is prepared to become a segment (freshly zero-filled, or reused after retention), kept
/// in its [`SegmentHeader`] and mixed into every record's checksum. [`SegmentTag::V1`]
/// stands for a version-1 segment, which has no header and no tag.
///
/// Why: a reused file still holds its previous life's records. Their checksums were
/// computed from another tag, so none of them — nor a record a payload embeds, whose
/// writer could not know the tag — checks out as one of the current life's (the odds are
/// those of two 64-bit random values being equal). The idea is RocksDB's recyclable log
/// format (a log number in every record header; `db/log_format.h`), with a random value in
/// place of the number because a Quire segment's name can come back after a truncation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SegmentTag(u64);

impl SegmentTag {
    /// A version-1 segment: no header, records from position 0, checksums without a seed.
    pub const V1: SegmentTag = SegmentTag(0);

    /// The tag `value`, or `None` if it cannot be one: its low 32 bits (the field every
    /// record carries) must not be zero.
    #[must_use]
    pub fn new(value: u64) -> Option<SegmentTag> {
        (value as u32 != 0).then_some(SegmentTag(value))
    }

    /// A fresh tag from `draw` (64 random bits per call) that is not `previous` (the tag of
    /// the file's earlier life, when a file is reused).
    pub fn draw(mut draw: impl FnMut() -> u64, previous: SegmentTag) -> SegmentTag {
        loop {
            if let Some(t) = SegmentTag::new(draw()) {
                if t != previous {
                    return t;
                }
            }
        }
    }

    /// The 64-bit value (0 for [`SegmentTag::V1`]).
    #[must_use]
    pub fn get(self) -> u64 {
        self.0
    }

    /// The record format version of the segment.
    #[must_use]
    pub fn version(self) -> u8 {
        if self == SegmentTag::V1 {
            VERSION_1
        } else {
            VERSION
        }
    }

    /// The value of every record's tag field (header bytes 12..16): the low 32 bits.
    #[must_use]
    pub fn field(self) -> u32 {
        self.0 as u32
    }

    /// The CRC-32C state a record's checksum starts from: 0 in version 1, the CRC-32C of
    /// the tag's 8 little-endian bytes in version 2.
    #[must_use]
    pub fn seed(self) -> u32 {
        if self == SegmentTag::V1 {
            0
        } else {
            crc32c::crc32c(&self.0.to_le_bytes())
        }
    }

    /// Where the first record of a segment with this tag may start, for writes aligned to
    /// `align` bytes: 0 in version 1; after the header, at an aligned position, in version 2.
    #[must_use]
    pub fn data_start(self, align: u64) -> u64 {
        if self == SegmentTag::V1 {
            0
        } else {
            align_up(SEGMENT_HEADER_BYTES, align)
        }
    }
}

/// The header of a version-2 segment: the first [`SEGMENT_HEADER_ENCODED_BYTES`] of the
/// file (the rest of the first [`SEGMENT_HEADER_BYTES`] is zero). Little-endian:
///
/// ```text
///  byte 0        4        6   7   8                  16                                   32
///       +--------+--------+---+---+------------------+------------------------------------+
///       | crc32c | "QS"   |ver| 0 |    tag (u64)     |          reserved, zero            |
///       +--------+--------+---+---+------------------+------------------------------------+
/// ```
///
/// `crc32c` covers bytes 4..32; `ver` is [`VERSION`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The segment's tag.
    pub tag: SegmentTag,
}

/// Why the first bytes of a file that claims to be a version-2 segment are not a header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentHeaderProblem {
    /// The file is shorter than a header.
    Short,
    /// An unknown segment format version.
    BadVersion(u8),
    /// The checksum does not match.
    Checksum,
    /// Reserved bytes are not zero, or the tag is not one [`SegmentTag::new`] accepts.
    BadField,
    /// The magic is damaged, but the rest checksums as a version-2 header with it put back.
    BadMagic,
    /// No version-2 header (a damaged or zeroed one) in a segment that follows a
    /// version-2 segment: the format never goes back to version 1.
    Missing,
}

impl SegmentHeader {
    /// The encoded header.
    #[must_use]
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_ENCODED_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_ENCODED_BYTES];
        b[4..6].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
        b[6] = VERSION;
        b[8..16].copy_from_slice(&self.tag.0.to_le_bytes());
        let crc = crc32c::crc32c(&b[4..]);
        b[0..4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Reads the start of a segment file: `Ok(None)` if it is not a version-2 header (so the
    /// file is a version-1 segment: bytes 4..6 are not [`SEGMENT_MAGIC`]), `Ok(Some)` for a
    /// good header.
    ///
    /// # Errors
    /// A [`SegmentHeaderProblem`] if the magic says version 2 but the header is damaged.
    pub fn decode(bytes: &[u8]) -> Result<Option<SegmentHeader>, SegmentHeaderProblem> {
        if bytes.len() >= 6 && u16::from_le_bytes([bytes[4], bytes[5]]) != SEGMENT_MAGIC {
            // A version-1 segment, unless only the magic is damaged: with it put back,
            // a version-2 header's checksum holds.
            if let Some(b) = bytes.get(..SEGMENT_HEADER_ENCODED_BYTES) {
                let mut restored = [0u8; SEGMENT_HEADER_ENCODED_BYTES];
                restored.copy_from_slice(b);
                restored[4..6].copy_from_slice(&SEGMENT_MAGIC.to_le_bytes());
                let stored = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                if restored[6] == VERSION && crc32c::crc32c(&restored[4..]) == stored {
                    return Err(SegmentHeaderProblem::BadMagic);
                }
            }
            return Ok(None);
        }
        let Some(b) = bytes.get(..SEGMENT_HEADER_ENCODED_BYTES) else {
            return if bytes.len() < 6 {
                Ok(None)
            } else {
                Err(SegmentHeaderProblem::Short)
            };
        };
        if b[6] != VERSION {
            return Err(SegmentHeaderProblem::BadVersion(b[6]));
        }
        let stored = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        if crc32c::crc32c(&b[4..]) != stored {
            return Err(SegmentHeaderProblem::Checksum);
        }
        let mut t = [0u8; 8];
        t.copy_from_slice(&b[8..16]);
        let tag = SegmentTag::new(u64::from_le_bytes(t)).ok_or(SegmentHeaderProblem::BadField)?;
        if b[7] != 0 || b[16..].iter().any(|&x| x != 0) {
            return Err(SegmentHeaderProblem::BadField);
        }
        Ok(Some(SegmentHeader { tag }))
    }
}

/// A decoded record header (the checksum is checked separately, see [`checksum_ok`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The stored CRC-32C.
    pub crc: u32,
    /// The format version ([`VERSION_1`] or [`VERSION`]).
    pub version: u8,
    /// The tag field: the low 32 bits of the segment's tag in version 2, zero in version 1.
    pub tag_field: u32,
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
    /// The reserved field of a version-1 record is not zero.
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
pub fn encode(
    dst: &mut [u8],
    tag: SegmentTag,
    epoch: Epoch,
    offset: Offset,
    kind: u8,
    payload: &[u8],
) -> usize {
    let crc = record_crc(tag, epoch, offset, kind, payload);
    encode_with_crc(dst, tag, epoch, offset, kind, payload, crc)
}

/// The header fields after the checksum (bytes `4..32`) of a record.
fn header_tail(
    tag: SegmentTag,
    epoch: Epoch,
    offset: Offset,
    kind: u8,
    length: u32,
) -> [u8; HEADER_BYTES - 4] {
    let mut t = [0u8; HEADER_BYTES - 4];
    t[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    t[2] = tag.version();
    t[3] = kind;
    t[4..8].copy_from_slice(&length.to_le_bytes());
    t[8..12].copy_from_slice(&tag.field().to_le_bytes());
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
pub fn record_crc(tag: SegmentTag, epoch: Epoch, offset: Offset, kind: u8, payload: &[u8]) -> u32 {
    crc_of_chunks(tag, epoch, offset, kind, [payload, &[]])
}

/// [`record_crc`] of the record that holds `event` in a segment tagged `tag` (its
/// payload's chunks in order).
///
/// # Panics
/// If the payload exceeds [`PAYLOAD_BYTES_MAX`].
#[must_use]
pub fn event_crc_in(tag: SegmentTag, event: &Event) -> u32 {
    crc_of_chunks(
        tag,
        event.epoch,
        event.offset,
        event.kind.as_u8(),
        event.payload.chunks(),
    )
}

/// The checksum of `event`'s content, whichever segment holds it: [`event_crc_in`] with
/// [`SegmentTag::V1`] (epoch, offset, kind, length and payload; no tag). Stores compare
/// ranges of their logs by it (range digests), so it must not depend on the file.
///
/// # Panics
/// If the payload exceeds [`PAYLOAD_BYTES_MAX`].
#[must_use]
pub fn event_crc(event: &Event) -> u32 {
    event_crc_in(SegmentTag::V1, event)
}

fn crc_of_chunks(
    tag: SegmentTag,
    epoch: Epoch,
    offset: Offset,
    kind: u8,
    chunks: [&[u8]; 2],
) -> u32 {
    let len = chunks[0].len() + chunks[1].len();
    assert!(
        len <= PAYLOAD_BYTES_MAX,
        "payload of {len} bytes exceeds the maximum"
    );
    let length = u32::try_from(len).expect("invariant: PAYLOAD_BYTES_MAX fits in u32");
    let tail = header_tail(tag, epoch, offset, kind, length);
    let crc = crc32c::crc32c_append(crc32c::crc32c_append(tag.seed(), &tail), chunks[0]);
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
    tag: SegmentTag,
    epoch: Epoch,
    offset: Offset,
    kind: u8,
    payload: &[u8],
    crc: u32,
) -> usize {
    encode_chunks(dst, tag, epoch, offset, kind, [payload, &[]], crc)
}

/// [`encode_with_crc`] of the record that holds `event`, with `crc` from [`event_crc_in`]
/// for the same `tag`: the payload's chunks are copied one after the other (the only copy
/// the write path makes).
///
/// # Panics
/// As [`encode`].
pub fn encode_event_with_crc(dst: &mut [u8], tag: SegmentTag, event: &Event, crc: u32) -> usize {
    encode_chunks(
        dst,
        tag,
        event.epoch,
        event.offset,
        event.kind.as_u8(),
        event.payload.chunks(),
        crc,
    )
}

fn encode_chunks(
    dst: &mut [u8],
    tag: SegmentTag,
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
    head[4..].copy_from_slice(&header_tail(tag, epoch, offset, kind, length));
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
    let version = head[6];
    if version != VERSION_1 && version != VERSION {
        return Err(HeaderProblem::BadVersion(version));
    }
    let tag_field = u32_at(12);
    if version == VERSION_1 && tag_field != 0 {
        return Err(HeaderProblem::BadReserved);
    }
    let length = u32_at(8);
    if length as usize > PAYLOAD_BYTES_MAX {
        return Err(HeaderProblem::TooLong(length));
    }
    Ok(Header {
        crc: u32_at(0),
        version,
        tag_field,
        kind: head[7],
        length,
        epoch: Epoch(u64_at(16)),
        offset: Offset(u64_at(24)),
    })
}

/// Whether `record` (header followed by exactly the payload) is a record of a segment
/// tagged `tag`: its version and tag field are the segment's, and its checksum (from the
/// tag's seed) holds.
///
/// # Panics
/// If `record` is shorter than a header.
#[must_use]
pub fn checksum_ok(tag: SegmentTag, record: &[u8]) -> bool {
    assert!(
        record.len() >= HEADER_BYTES,
        "a record is at least a header"
    );
    let stored = u32::from_le_bytes([record[0], record[1], record[2], record[3]]);
    record[6] == tag.version()
        && record[12..16] == tag.field().to_le_bytes()
        && crc32c::crc32c_append(tag.seed(), &record[4..]) == stored
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

    const TAG: SegmentTag = SegmentTag(0x0123_4567_89ab_cdef);

    fn encoded_in(tag: SegmentTag, epoch: u64, offset: u64, kind: u8, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; record_bytes(payload.len())];
        let n = encode(&mut buf, tag, Epoch(epoch), Offset(offset), kind, payload);
        assert_eq!(n, buf.len());
        buf
    }

    fn encoded(epoch: u64, offset: u64, kind: u8, payload: &[u8]) -> Vec<u8> {
        encoded_in(TAG, epoch, offset, kind, payload)
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
        assert_eq!(&buf[12..16], &0x89ab_cdefu32.to_le_bytes());
        assert_eq!(&buf[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&buf[24..32], &0x1112_1314_1516_1718u64.to_le_bytes());
        assert_eq!(&buf[32..], b"hello");
        let seed = crc32c::crc32c(&0x0123_4567_89ab_cdefu64.to_le_bytes());
        let crc = crc32c::crc32c_append(seed, &buf[4..]);
        assert_eq!(&buf[0..4], &crc.to_le_bytes());
        let h = decode_header(&buf).unwrap();
        assert_eq!((h.version, h.tag_field), (VERSION, 0x89ab_cdef));
    }

    /// Version-1 records are what they always were: a zero reserved field and a checksum
    /// from no seed. So old segments still read, and the stores' content checksums
    /// ([`event_crc`]) did not change.
    #[test]
    fn version_1_records_are_unchanged() {
        let buf = encoded_in(SegmentTag::V1, 3, 4, 1, b"old");
        assert_eq!(buf[6], VERSION_1);
        assert_eq!(&buf[12..16], &[0, 0, 0, 0]);
        assert_eq!(&buf[0..4], &crc32c::crc32c(&buf[4..]).to_le_bytes());
        assert!(checksum_ok(SegmentTag::V1, &buf));
        assert!(!checksum_ok(TAG, &buf));
        let event = Event {
            epoch: Epoch(3),
            offset: Offset(4),
            kind: quire_proto::EventKind::Message,
            payload: bytes::Bytes::from_static(b"old").into(),
        };
        assert_eq!(
            event_crc(&event),
            record_crc(SegmentTag::V1, Epoch(3), Offset(4), 1, b"old")
        );
    }

    /// A record of one life of a file never checks out in another: neither with another
    /// tag that shares its low 32 bits (the whole tag seeds the checksum), nor as version 1.
    #[test]
    fn a_record_checks_out_only_under_its_own_tag() {
        let buf = encoded(1, 2, 1, b"payload");
        assert!(checksum_ok(TAG, &buf));
        let same_field = SegmentTag::new(TAG.get() ^ (1 << 40)).unwrap();
        assert_eq!(same_field.field(), TAG.field());
        assert!(!checksum_ok(same_field, &buf));
        assert!(!checksum_ok(SegmentTag::new(TAG.get() ^ 1).unwrap(), &buf));
        assert!(!checksum_ok(SegmentTag::V1, &buf));
    }

    #[test]
    fn segment_headers_round_trip_and_tell_the_versions_apart() {
        let h = SegmentHeader { tag: TAG };
        let b = h.encode();
        assert_eq!(&b[4..6], b"QS");
        assert_eq!(SegmentHeader::decode(&b), Ok(Some(h)));
        // A version-1 segment starts with a record, or with zeros.
        assert_eq!(
            SegmentHeader::decode(&encoded_in(SegmentTag::V1, 1, 0, 1, b"x")),
            Ok(None)
        );
        assert_eq!(SegmentHeader::decode(&[0u8; 32]), Ok(None));
        // One bit of the magic flipped: still known for a damaged version-2 header.
        let mut flipped = h.encode();
        flipped[4] ^= 1;
        assert_eq!(
            SegmentHeader::decode(&flipped),
            Err(SegmentHeaderProblem::BadMagic)
        );
        assert_eq!(SegmentHeader::decode(&[]), Ok(None));
        let mut bad = b;
        bad[9] ^= 1;
        assert_eq!(
            SegmentHeader::decode(&bad),
            Err(SegmentHeaderProblem::Checksum)
        );
        let mut bad = b;
        bad[6] = 3;
        assert_eq!(
            SegmentHeader::decode(&bad),
            Err(SegmentHeaderProblem::BadVersion(3))
        );
        assert_eq!(
            SegmentHeader::decode(&b[..20]),
            Err(SegmentHeaderProblem::Short)
        );
        assert_eq!(
            SegmentTag::new(1 << 32),
            None,
            "a tag's record field may not be zero"
        );
        assert_eq!(TAG.data_start(4096), 4096);
        assert_eq!(SegmentTag::V1.data_start(4096), 0);
    }

    #[test]
    fn a_checksum_computed_ahead_matches_the_one_encode_computes() {
        let payload: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        let (e, o) = (Epoch(9), Offset(1234));
        let crc = record_crc(TAG, e, o, 5, &payload);
        let mut a = vec![0u8; record_bytes(payload.len())];
        let mut b = a.clone();
        encode(&mut a, TAG, e, o, 5, &payload);
        encode_with_crc(&mut b, TAG, e, o, 5, &payload, crc);
        assert_eq!(a, b);
        assert!(checksum_ok(TAG, &a));
        assert_ne!(crc, record_crc(TAG, e, Offset(1235), 5, &payload));
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
        let mut b = encoded_in(SegmentTag::V1, 1, 2, 3, b"x");
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
            prop_assert!(checksum_ok(TAG, &buf));
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
                    prop_assert!(end > buf.len() || !checksum_ok(TAG, &buf[..end]));
                }
            }
        }
    }
}
