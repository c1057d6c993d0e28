//! Little-endian primitives shared by every body: a [`BodyWriter`] that encoders write
//! through (into one buffer, into chunks for vectored writes, or only counting bytes) and a
//! bounds-checked [`Reader`] over a frame's body.
//!
//! Encodings used by every message (all integers little-endian):
//!
//! | shape | bytes |
//! | --- | --- |
//! | `u8`/`u16`/`u32`/`u64` | 1/2/4/8 |
//! | `bool` | 1: `0` or `1`, anything else is an error |
//! | `Option<Offset>` | 1 tag (`0` none, `1` some) + 8 if some |
//! | `Option<LogPosition>` | 1 tag (`0` none, `1` some) + 16 (epoch u64, offset u64) if some |
//! | string | u16 length + UTF-8 bytes; length bounded by the field's `*_BYTES_MAX` |
//! | payload | u32 length + bytes |
//! | list | u32 count + items; count bounded by a `*_MAX` and by the bytes left |
//!
//! The reader never panics and never allocates more than the bytes it was given justify.

use bytes::{Bytes, BytesMut};

use crate::error::WireError;
use crate::limits::{FRAME_BYTES_MAX, INLINE_PAYLOAD_BYTES_MAX};
use crate::payload::Payload;
use crate::types::{Epoch, LogPosition, Offset};

/// Where an encoder writes a body's bytes.
pub(crate) trait BodyWriter {
    /// Appends bytes that belong to the body's fixed or small fields.
    fn put(&mut self, bytes: &[u8]);

    /// Appends a payload (event or message bytes). Writers that can share the payload
    /// instead of copying it override this.
    fn put_payload_bytes(&mut self, payload: &Bytes) {
        self.put(payload);
    }

    fn u8(&mut self, v: u8) {
        self.put(&[v]);
    }
    fn u16(&mut self, v: u16) {
        self.put(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.put(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.put(&v.to_le_bytes());
    }
    fn bool(&mut self, v: bool) {
        self.u8(u8::from(v));
    }
    fn opt_offset(&mut self, v: Option<Offset>) {
        match v {
            None => self.u8(0),
            Some(o) => {
                self.u8(1);
                self.u64(o.0);
            }
        }
    }
    fn opt_u64(&mut self, v: Option<u64>) {
        match v {
            None => self.u8(0),
            Some(x) => {
                self.u8(1);
                self.u64(x);
            }
        }
    }
    fn opt_position(&mut self, v: Option<LogPosition>) {
        match v {
            None => self.u8(0),
            Some(p) => {
                self.u8(1);
                self.u64(p.epoch.0);
                self.u64(p.offset.0);
            }
        }
    }

    /// A string of at most `max` bytes.
    fn string(&mut self, field: &'static str, s: &str, max: usize) -> Result<(), WireError> {
        if s.len() > max {
            return Err(WireError::StringTooLong {
                field,
                length: s.len(),
                max,
            });
        }
        // `max` is at most u16::MAX (asserted in limits.rs for every bound used here).
        let length = u16::try_from(s.len()).map_err(|_| WireError::StringTooLong {
            field,
            length: s.len(),
            max,
        })?;
        self.u16(length);
        self.put(s.as_bytes());
        Ok(())
    }

    /// A non-empty string of at most `max` bytes (topic and cursor names).
    fn name(&mut self, field: &'static str, s: &str, max: usize) -> Result<(), WireError> {
        if s.is_empty() {
            return Err(WireError::EmptyName { field });
        }
        self.string(field, s, max)
    }

    /// A u32-length-prefixed payload.
    fn payload(&mut self, field: &'static str, payload: &Bytes) -> Result<(), WireError> {
        self.payload_length(field, payload.len())?;
        self.put_payload_bytes(payload);
        Ok(())
    }

    /// A u32-length-prefixed [`Payload`]: the length of its bytes, then each chunk (shared
    /// by writers that share payloads).
    fn payload_chunks(&mut self, field: &'static str, payload: &Payload) -> Result<(), WireError> {
        self.payload_length(field, payload.len())?;
        self.put_payload(payload);
        Ok(())
    }

    /// Appends a [`Payload`]'s chunks. Writers that can share chunks instead of copying
    /// them override this.
    fn put_payload(&mut self, payload: &Payload) {
        for chunk in payload.chunks() {
            self.put(chunk);
        }
    }

    /// The u32 length of a payload of `bytes` bytes, checked against `FRAME_BYTES_MAX`.
    fn payload_length(&mut self, field: &'static str, bytes: usize) -> Result<(), WireError> {
        let length = u32::try_from(bytes)
            .ok()
            .filter(|&l| l as usize <= FRAME_BYTES_MAX)
            .ok_or(WireError::PayloadTooLarge {
                field,
                length: bytes,
                max: FRAME_BYTES_MAX,
            })?;
        self.u32(length);
        Ok(())
    }

    /// A u32 list count of at most `max`.
    fn count(&mut self, field: &'static str, count: usize, max: usize) -> Result<(), WireError> {
        if count > max {
            return Err(WireError::CountTooLarge {
                field,
                count: count as u64,
                max: max as u64,
            });
        }
        let count = u32::try_from(count).map_err(|_| WireError::CountTooLarge {
            field,
            count: count as u64,
            max: max as u64,
        })?;
        self.u32(count);
        Ok(())
    }
}

impl BodyWriter for BytesMut {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Counts the bytes an encoder would write; used to size and bound a frame before any
/// byte of it is written.
#[derive(Debug, Default)]
pub(crate) struct CountingWriter {
    pub(crate) bytes: usize,
}

impl BodyWriter for CountingWriter {
    fn put(&mut self, bytes: &[u8]) {
        self.bytes += bytes.len();
    }
}

/// Writes small fields into a scratch buffer and hands large payloads on as their own
/// chunks, so a body is a list of `Bytes` ready for a vectored write with each payload
/// shared rather than copied.
#[derive(Debug)]
pub(crate) struct ChunkWriter<'a> {
    scratch: &'a mut BytesMut,
    chunks: Vec<Bytes>,
}

impl<'a> ChunkWriter<'a> {
    pub(crate) fn new(scratch: &'a mut BytesMut) -> ChunkWriter<'a> {
        scratch.clear();
        ChunkWriter {
            scratch,
            chunks: Vec::new(),
        }
    }

    /// The chunks, in order; their concatenation is the body.
    pub(crate) fn finish(mut self) -> Vec<Bytes> {
        self.flush();
        self.chunks
    }

    fn flush(&mut self) {
        if !self.scratch.is_empty() {
            self.chunks.push(self.scratch.split().freeze());
        }
    }
}

impl BodyWriter for ChunkWriter<'_> {
    fn put(&mut self, bytes: &[u8]) {
        self.scratch.extend_from_slice(bytes);
    }

    fn put_payload_bytes(&mut self, payload: &Bytes) {
        if payload.len() <= INLINE_PAYLOAD_BYTES_MAX {
            self.scratch.extend_from_slice(payload);
        } else {
            self.flush();
            self.chunks.push(payload.clone());
        }
    }

    /// A payload of at most [`INLINE_PAYLOAD_BYTES_MAX`] bytes is copied into the scratch
    /// buffer whole; a larger one goes out as its chunks, each shared unless it is small
    /// (a message event's header, chained to a message of 1 KiB or more, is copied; the
    /// message is not). Deciding on the whole payload, not on each chunk, keeps a message of
    /// exactly the inline bound as uncopied as the contiguous event it replaces.
    fn put_payload(&mut self, payload: &Payload) {
        if payload.len() <= INLINE_PAYLOAD_BYTES_MAX {
            for chunk in payload.chunks() {
                self.scratch.extend_from_slice(chunk);
            }
            return;
        }
        for chunk in [payload.head(), payload.tail()] {
            if chunk.len() <= CHUNK_COPY_BYTES_MAX {
                self.scratch.extend_from_slice(chunk);
            } else {
                self.flush();
                self.chunks.push(chunk.clone());
            }
        }
    }
}

/// A chunk of a large payload at most this long is copied into the scratch buffer rather
/// than given a buffer of the vectored write of its own (a message event's header with a
/// topic of up to 249 bytes is below it).
const CHUNK_COPY_BYTES_MAX: usize = 512;

/// A bounds-checked cursor over one body. Payloads it returns are slices of the body's
/// `Bytes` (no copy).
#[derive(Debug)]
pub(crate) struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a Bytes) -> Reader<'a> {
        Reader { buf, pos: 0 }
    }

    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    pub(crate) fn take(&mut self, field: &'static str, n: usize) -> Result<&'a [u8], WireError> {
        let remaining = self.remaining();
        if n > remaining {
            return Err(WireError::Truncated {
                field,
                needed: n as u64,
                remaining: remaining as u64,
            });
        }
        let start = self.pos;
        self.pos += n;
        Ok(&self.buf[start..self.pos])
    }

    pub(crate) fn array<const N: usize>(
        &mut self,
        field: &'static str,
    ) -> Result<[u8; N], WireError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(field, N)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, field: &'static str) -> Result<u8, WireError> {
        Ok(self.array::<1>(field)?[0])
    }
    pub(crate) fn u16(&mut self, field: &'static str) -> Result<u16, WireError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn u32(&mut self, field: &'static str) -> Result<u32, WireError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn u64(&mut self, field: &'static str) -> Result<u64, WireError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }
    pub(crate) fn offset(&mut self, field: &'static str) -> Result<Offset, WireError> {
        self.u64(field).map(Offset)
    }
    pub(crate) fn epoch(&mut self, field: &'static str) -> Result<Epoch, WireError> {
        self.u64(field).map(Epoch)
    }

    pub(crate) fn bool(&mut self, field: &'static str) -> Result<bool, WireError> {
        match self.u8(field)? {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(WireError::InvalidTag { field, byte }),
        }
    }

    pub(crate) fn tag(&mut self, field: &'static str) -> Result<bool, WireError> {
        self.bool(field)
    }

    pub(crate) fn opt_offset(&mut self, field: &'static str) -> Result<Option<Offset>, WireError> {
        if self.tag(field)? {
            Ok(Some(self.offset(field)?))
        } else {
            Ok(None)
        }
    }

    pub(crate) fn opt_u64(&mut self, field: &'static str) -> Result<Option<u64>, WireError> {
        if self.tag(field)? {
            Ok(Some(self.u64(field)?))
        } else {
            Ok(None)
        }
    }

    pub(crate) fn opt_position(
        &mut self,
        field: &'static str,
    ) -> Result<Option<LogPosition>, WireError> {
        if self.tag(field)? {
            let epoch = self.epoch(field)?;
            let offset = self.offset(field)?;
            Ok(Some(LogPosition { epoch, offset }))
        } else {
            Ok(None)
        }
    }

    pub(crate) fn string(&mut self, field: &'static str, max: usize) -> Result<String, WireError> {
        let length = usize::from(self.u16(field)?);
        if length > max {
            return Err(WireError::StringTooLong { field, length, max });
        }
        let bytes = self.take(field, length)?;
        std::str::from_utf8(bytes)
            .map(str::to_owned)
            .map_err(|_| WireError::InvalidUtf8 { field })
    }

    pub(crate) fn name(&mut self, field: &'static str, max: usize) -> Result<String, WireError> {
        let s = self.string(field, max)?;
        if s.is_empty() {
            return Err(WireError::EmptyName { field });
        }
        Ok(s)
    }

    /// A u32-length-prefixed payload, returned as a slice of the body (no copy).
    pub(crate) fn payload(&mut self, field: &'static str) -> Result<Bytes, WireError> {
        let length = self.u32(field)? as usize;
        let remaining = self.remaining();
        if length > remaining {
            return Err(WireError::Truncated {
                field,
                needed: length as u64,
                remaining: remaining as u64,
            });
        }
        let start = self.pos;
        self.pos += length;
        Ok(self.buf.slice(start..self.pos))
    }

    /// A u32 list count, checked against `max` and against the bytes left: every item
    /// takes at least `item_bytes_min` bytes, so a count the body cannot hold is refused
    /// before any `Vec::with_capacity(count)`.
    pub(crate) fn count(
        &mut self,
        field: &'static str,
        max: usize,
        item_bytes_min: usize,
    ) -> Result<usize, WireError> {
        assert!(item_bytes_min > 0, "invariant: every list item has a size");
        let count = self.u32(field)? as usize;
        if count > max {
            return Err(WireError::CountTooLarge {
                field,
                count: count as u64,
                max: max as u64,
            });
        }
        let remaining = self.remaining();
        if count > remaining / item_bytes_min {
            return Err(WireError::CountExceedsBody {
                field,
                count: count as u64,
                item_bytes_min: item_bytes_min as u64,
                remaining: remaining as u64,
            });
        }
        Ok(count)
    }

    /// Ends the body: every byte must have been used.
    pub(crate) fn finish(self) -> Result<(), WireError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(WireError::TrailingBytes { count }),
        }
    }
}
