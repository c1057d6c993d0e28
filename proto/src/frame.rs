//! Framing: the fixed 32-byte header, the frame types, [`Frame`] and [`Body`], and the
//! encode / decode entry points.
//!
//! ```text
//! off  size  field        notes
//! 0    4     length       u32 LE: whole frame, header included; 32 ≤ length ≤ FRAME_BYTES_MAX
//! 4    2     frame type   u16 LE: FrameType
//! 6    1     version      u8: PROTOCOL_VERSION (2)
//! 7    1     flags        u8: no bits defined in version 2; must be 0
//! 8    8     request id   u64 LE: chosen by the requester, echoed by the response
//! 16   4     log          u32 LE: the log the frame is about (LogId); a response echoes it
//! 20   4     reserved     must be 0
//! 24   4     body crc     u32 LE: CRC32C of the body bytes (0 for an empty body)
//! 28   4     header crc   u32 LE: CRC32C of header bytes 0..28
//! 32   n     body         length − 32 bytes, laid out per frame type
//! ```
//!
//! The log id sits in the header, not in each body, so that a peer routes a frame to its
//! log before decoding the body, and one encoded body can go out under any log's header.
//! Version 1 (until 2026-12) had a 24-byte header without the log: a decoder recognises
//! one by its own header CRC and answers [`WireError::UnsupportedVersion`] rather than a
//! checksum error.
//!
//! Every frame carries a CRC32C of its body, not only the payload-bearing ones: one rule,
//! and the hardware CRC costs little next to the copy a socket read already makes. The
//! header has its own CRC so that a corrupt length is caught before the decoder waits for,
//! or reserves memory for, the bytes it announces. The body CRC does not cover the request
//! id, so a master encodes an append's body once ([`encode_body`]) and sends the same
//! chunks to every store, each behind its own 32-byte header.
//!
//! Decoding a `BytesMut` is zero-copy: the frame is split off the buffer and frozen, and
//! every payload in the decoded body is a slice of it.

use bytes::{Bytes, BytesMut};

use crate::client::{
    CommitCursorRequest, CommitCursorResponse, CursorRequest, CursorResponse, FetchRequest,
    FetchResponse, HandoffRequest, HandoffResponse, MetadataRequest, MetadataResponse,
    ProduceRequest, ProduceResponse, TopicAdminRequest, VoterChangeRequest,
};
use crate::codec::{BodyWriter, ChunkWriter, CountingWriter, Reader};
use crate::error::WireError;
use crate::error_response::ErrorResponse;
use crate::limits::FRAME_BYTES_MAX;
use crate::replication::{
    AppendRejected, AppendRequest, FenceGranted, FenceRefused, FenceRequest, Heartbeat,
    HeartbeatAck, PersistedAck, RangeDigestRequest, RangeDigestResponse, ReadRequest, ReadResponse,
    RepairRequest, RepairResponse, TailRequest, TailResponse, TakeOverNowRequest,
    TakeOverNowResponse,
};
use crate::security::{
    AclAdminRequest, AdminResponse, AuthenticateRequest, AuthenticateResponse,
    DescribeSecurityRequest, DescribeSecurityResponse, UserAdminRequest,
};
use crate::types::LogId;

/// Size of the frame header, in bytes.
pub const HEADER_BYTES: usize = 32;

/// The protocol version this build speaks and accepts.
pub const PROTOCOL_VERSION: u8 = 2;

const LENGTH_AT: usize = 0;
const FRAME_TYPE_AT: usize = LENGTH_AT + 4;
const VERSION_AT: usize = FRAME_TYPE_AT + 2;
const FLAGS_AT: usize = VERSION_AT + 1;
const REQUEST_ID_AT: usize = FLAGS_AT + 1;
const LOG_AT: usize = REQUEST_ID_AT + 8;
const RESERVED_AT: usize = LOG_AT + 4;
const BODY_CRC_AT: usize = RESERVED_AT + 4;
const HEADER_CRC_AT: usize = BODY_CRC_AT + 4;

/// Version 1's header: 24 bytes, its CRC32C of bytes 0..20 at 20..24.
const V1_HEADER_BYTES: usize = 24;
const V1_HEADER_CRC_AT: usize = 20;

// The layout above and HEADER_BYTES agree, and the 8-byte request id is 8-aligned.
const _: () = assert!(HEADER_CRC_AT + 4 == HEADER_BYTES);
const _: () = assert!(REQUEST_ID_AT % 8 == 0);
const _: () = assert!(HEADER_BYTES <= FRAME_BYTES_MAX);

/// Identifies a request on one connection; its response carries the same id.
///
/// The requester picks ids unique among its requests in flight on that connection (a
/// counter from 1 will do); responses may come in any order. Id 0 ([`RequestId::CONNECTION`])
/// is reserved for an `ErrorResponse` about the connection as a whole.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestId(pub u64);

impl RequestId {
    /// Reserved: an `ErrorResponse` that answers no single request.
    pub const CONNECTION: RequestId = RequestId(0);
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The header's flag bits. Version 1 defines none, so the only value is
/// [`Flags::NONE`]; a decoder refuses unknown bits ([`WireError::UnknownFlags`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Flags(u8);

impl Flags {
    /// No flag set.
    pub const NONE: Flags = Flags(0);
    /// The bits this version defines.
    pub const KNOWN_BITS: u8 = 0;

    /// The flags for a byte, or `None` if it sets a bit this version does not define.
    #[must_use]
    pub fn from_bits(bits: u8) -> Option<Flags> {
        (bits & !Flags::KNOWN_BITS == 0).then_some(Flags(bits))
    }

    /// The byte on the wire.
    #[must_use]
    pub fn bits(self) -> u8 {
        self.0
    }
}

macro_rules! bodies {
    ($( $(#[$doc:meta])* $variant:ident = $code:literal, $role:ident; )*) => {
        /// The frame type: which body follows the header. A u16 on the wire; numbers are
        /// stable. Ranges: `0x00xx` generic, `0x01xx` broker ↔ store, `0x02xx` broker ↔
        /// broker, `0x03xx` client ↔ broker.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[repr(u16)]
        pub enum FrameType {
            $( $(#[$doc])* $variant = $code, )*
        }

        impl FrameType {
            /// Every frame type, in numeric order.
            pub const ALL: &'static [FrameType] = &[$( FrameType::$variant, )*];

            /// The type for a number, or `None` for a number no type uses.
            #[must_use]
            pub fn from_u16(v: u16) -> Option<FrameType> {
                match v {
                    $( $code => Some(FrameType::$variant), )*
                    _ => None,
                }
            }

            /// The number on the wire.
            #[must_use]
            pub fn as_u16(self) -> u16 {
                self as u16
            }

            /// `true` for a response (it answers a request and carries its id), `false`
            /// for a request.
            #[must_use]
            pub fn is_response(self) -> bool {
                match self {
                    $( FrameType::$variant => bodies!(@role $role), )*
                }
            }
        }

        /// A frame's body: one variant per [`FrameType`], each holding the message struct
        /// of the same name.
        #[derive(Clone, Debug, PartialEq, Eq)]
        pub enum Body {
            $( $(#[$doc])* $variant($variant), )*
        }

        impl Body {
            /// The frame type this body is sent as.
            #[must_use]
            pub fn frame_type(&self) -> FrameType {
                match self {
                    $( Body::$variant(_) => FrameType::$variant, )*
                }
            }

            fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
                match self {
                    $( Body::$variant(b) => b.write(w), )*
                }
            }

            fn read(frame_type: FrameType, r: &mut Reader<'_>) -> Result<Body, WireError> {
                Ok(match frame_type {
                    $( FrameType::$variant => Body::$variant($variant::read(r)?), )*
                })
            }
        }

        $(
            impl From<$variant> for Body {
                fn from(b: $variant) -> Body {
                    Body::$variant(b)
                }
            }
        )*
    };
    (@role request) => { false };
    (@role response) => { true };
}

bodies! {
    /// [`ErrorResponse`]: any request failed.
    ErrorResponse = 0x0001, response;
    /// [`AppendRequest`]: master → store / slave.
    AppendRequest = 0x0101, request;
    /// [`PersistedAck`]: store → master.
    PersistedAck = 0x0102, response;
    /// [`AppendRejected`]: store → master.
    AppendRejected = 0x0103, response;
    /// [`FenceRequest`]: new master → store.
    FenceRequest = 0x0104, request;
    /// [`FenceGranted`]: store → new master.
    FenceGranted = 0x0105, response;
    /// [`FenceRefused`]: store → new master.
    FenceRefused = 0x0106, response;
    /// [`ReadRequest`]: master → store.
    ReadRequest = 0x0107, request;
    /// [`ReadResponse`]: store → master.
    ReadResponse = 0x0108, response;
    /// [`TailRequest`]: master or tool → store.
    TailRequest = 0x0109, request;
    /// [`TailResponse`]: store → master or tool.
    TailResponse = 0x010A, response;
    /// [`RangeDigestRequest`]: tool → store (audit; read-only).
    RangeDigestRequest = 0x010B, request;
    /// [`RangeDigestResponse`]: store → tool.
    RangeDigestResponse = 0x010C, response;
    /// [`RepairRequest`]: master → store (a good copy of a damaged record).
    RepairRequest = 0x010D, request;
    /// [`RepairResponse`]: store → master.
    RepairResponse = 0x010E, response;
    /// [`Heartbeat`]: master → slave.
    Heartbeat = 0x0201, request;
    /// [`HeartbeatAck`]: slave → master.
    HeartbeatAck = 0x0202, response;
    /// [`TakeOverNowRequest`]: master → slave (graceful handoff).
    TakeOverNowRequest = 0x0203, request;
    /// [`TakeOverNowResponse`]: slave → master.
    TakeOverNowResponse = 0x0204, response;
    /// [`ProduceRequest`]: producer → master.
    ProduceRequest = 0x0301, request;
    /// [`ProduceResponse`]: master → producer.
    ProduceResponse = 0x0302, response;
    /// [`FetchRequest`]: consumer → master.
    FetchRequest = 0x0303, request;
    /// [`FetchResponse`]: master → consumer.
    FetchResponse = 0x0304, response;
    /// [`CommitCursorRequest`]: consumer → master.
    CommitCursorRequest = 0x0305, request;
    /// [`CommitCursorResponse`]: master → consumer.
    CommitCursorResponse = 0x0306, response;
    /// [`CursorRequest`]: consumer → master.
    CursorRequest = 0x0307, request;
    /// [`CursorResponse`]: master → consumer.
    CursorResponse = 0x0308, response;
    /// [`MetadataRequest`]: anyone → any broker.
    MetadataRequest = 0x0309, request;
    /// [`MetadataResponse`]: broker → anyone.
    MetadataResponse = 0x030A, response;
    /// [`HandoffRequest`]: operator → master.
    HandoffRequest = 0x030B, request;
    /// [`HandoffResponse`]: master → operator.
    HandoffResponse = 0x030C, response;
    /// [`AuthenticateRequest`]: client → any broker (a SASL step).
    AuthenticateRequest = 0x030D, request;
    /// [`AuthenticateResponse`]: broker → client.
    AuthenticateResponse = 0x030E, response;
    /// [`UserAdminRequest`]: operator → master.
    UserAdminRequest = 0x030F, request;
    /// [`AclAdminRequest`]: operator → master.
    AclAdminRequest = 0x0310, request;
    /// [`AdminResponse`]: master → operator.
    AdminResponse = 0x0311, response;
    /// [`DescribeSecurityRequest`]: operator → any broker.
    DescribeSecurityRequest = 0x0312, request;
    /// [`DescribeSecurityResponse`]: broker → operator.
    DescribeSecurityResponse = 0x0313, response;
    /// [`TopicAdminRequest`]: operator → master (answered with [`AdminResponse`]).
    TopicAdminRequest = 0x0314, request;
    /// [`VoterChangeRequest`]: operator → master (answered with [`AdminResponse`]).
    VoterChangeRequest = 0x0315, request;
}

impl Body {
    /// Bytes this body takes on the wire (header not included). Walks the structure but
    /// not the payload bytes.
    ///
    /// # Errors
    /// The same as [`encode`]'s for a value that cannot be encoded.
    pub fn encoded_bytes(&self) -> Result<usize, WireError> {
        let mut counter = CountingWriter::default();
        self.write(&mut counter)?;
        Ok(counter.bytes)
    }
}

/// One frame: the header's request id, log and flags, and a body (whose variant gives the
/// frame type).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    /// Request id (see [`RequestId`]).
    pub request_id: RequestId,
    /// The log the frame is about ([`LogId::ZERO`] for frames that name none).
    pub log: LogId,
    /// Header flags.
    pub flags: Flags,
    /// The message.
    pub body: Body,
}

impl Frame {
    /// A frame about log 0 ([`LogId::ZERO`]) with no flags.
    #[must_use]
    pub fn new(request_id: RequestId, body: impl Into<Body>) -> Frame {
        Frame::on_log(LogId::ZERO, request_id, body)
    }

    /// A frame about `log` with no flags.
    #[must_use]
    pub fn on_log(log: LogId, request_id: RequestId, body: impl Into<Body>) -> Frame {
        Frame {
            request_id,
            log,
            flags: Flags::NONE,
            body: body.into(),
        }
    }

    /// The frame type of its body.
    #[must_use]
    pub fn frame_type(&self) -> FrameType {
        self.body.frame_type()
    }
}

/// A decoded header. `frame_type` stays a raw number so that a frame of an unknown type
/// can still be skipped (its length is trustworthy once the header CRC holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// Whole frame, header included, in bytes: `HEADER_BYTES..=FRAME_BYTES_MAX`.
    pub frame_bytes: u32,
    /// Frame type number (see [`FrameType::from_u16`]).
    pub frame_type: u16,
    /// Flag bits.
    pub flags: u8,
    /// Request id.
    pub request_id: RequestId,
    /// The log the frame is about.
    pub log: LogId,
    /// The reserved word: 0 from every sender of this version; checked by
    /// [`decode_frame_body`] ([`WireError::ReservedNotZero`]).
    pub reserved: u32,
    /// CRC32C of the body.
    pub body_crc: u32,
}

impl FrameHeader {
    /// The header's 32 bytes, version [`PROTOCOL_VERSION`], header CRC computed.
    #[must_use]
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut h = [0u8; HEADER_BYTES];
        h[LENGTH_AT..FRAME_TYPE_AT].copy_from_slice(&self.frame_bytes.to_le_bytes());
        h[FRAME_TYPE_AT..VERSION_AT].copy_from_slice(&self.frame_type.to_le_bytes());
        h[VERSION_AT] = PROTOCOL_VERSION;
        h[FLAGS_AT] = self.flags;
        h[REQUEST_ID_AT..LOG_AT].copy_from_slice(&self.request_id.0.to_le_bytes());
        h[LOG_AT..RESERVED_AT].copy_from_slice(&self.log.0.to_le_bytes());
        h[RESERVED_AT..BODY_CRC_AT].copy_from_slice(&self.reserved.to_le_bytes());
        h[BODY_CRC_AT..HEADER_CRC_AT].copy_from_slice(&self.body_crc.to_le_bytes());
        let crc = crc32c::crc32c(&h[..HEADER_CRC_AT]);
        h[HEADER_CRC_AT..].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Parses and checks a header: its CRC, its version, and its length against
    /// `HEADER_BYTES..=FRAME_BYTES_MAX`. The frame type and flags are checked later, by
    /// [`decode_frame_body`], once the whole frame has been consumed.
    ///
    /// # Errors
    /// [`WireError::HeaderChecksum`], [`WireError::UnsupportedVersion`],
    /// [`WireError::FrameTooShort`] or [`WireError::FrameTooLarge`]; all leave the stream
    /// out of sync (the connection must be closed).
    pub fn decode(h: &[u8; HEADER_BYTES]) -> Result<FrameHeader, WireError> {
        let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
        let stored = u32_at(HEADER_CRC_AT);
        let computed = crc32c::crc32c(&h[..HEADER_CRC_AT]);
        if stored != computed {
            check_older_version(h)?;
            return Err(WireError::HeaderChecksum { stored, computed });
        }
        let version = h[VERSION_AT];
        if version != PROTOCOL_VERSION {
            return Err(WireError::UnsupportedVersion {
                version,
                supported: PROTOCOL_VERSION,
            });
        }
        let frame_bytes = u32_at(LENGTH_AT);
        if (frame_bytes as usize) < HEADER_BYTES {
            return Err(WireError::FrameTooShort {
                length: frame_bytes,
                header_bytes: HEADER_BYTES,
            });
        }
        if frame_bytes as usize > FRAME_BYTES_MAX {
            return Err(WireError::FrameTooLarge {
                length: u64::from(frame_bytes),
                max: FRAME_BYTES_MAX,
            });
        }
        let mut request_id = [0u8; 8];
        request_id.copy_from_slice(&h[REQUEST_ID_AT..LOG_AT]);
        Ok(FrameHeader {
            frame_bytes,
            frame_type: u16::from_le_bytes([h[FRAME_TYPE_AT], h[FRAME_TYPE_AT + 1]]),
            flags: h[FLAGS_AT],
            request_id: RequestId(u64::from_le_bytes(request_id)),
            log: LogId(u32_at(LOG_AT)),
            reserved: u32_at(RESERVED_AT),
            body_crc: u32_at(BODY_CRC_AT),
        })
    }

    /// Body length, in bytes (0 for a hand-built header shorter than `HEADER_BYTES`,
    /// which [`FrameHeader::decode`] never returns).
    #[must_use]
    pub fn body_bytes(&self) -> usize {
        (self.frame_bytes as usize).saturating_sub(HEADER_BYTES)
    }
}

/// Checks the first bytes a peer sent (fewer than a whole header may have arrived) for a
/// header of an older protocol version that this build does not speak: version 1's
/// 24-byte header, recognised by its version byte and its own CRC (a version-2 header
/// never matches: its version byte is 2). Lets a reader answer an old peer with a typed
/// error at once instead of waiting for bytes that never come (an old client's empty
/// request is 24 bytes, shorter than this version's header).
///
/// # Errors
/// [`WireError::UnsupportedVersion`] for a version-1 header; the connection must be closed.
pub fn check_older_version(prefix: &[u8]) -> Result<(), WireError> {
    let Some(h) = prefix.first_chunk::<V1_HEADER_BYTES>() else {
        return Ok(());
    };
    let stored = u32::from_le_bytes([
        h[V1_HEADER_CRC_AT],
        h[V1_HEADER_CRC_AT + 1],
        h[V1_HEADER_CRC_AT + 2],
        h[V1_HEADER_CRC_AT + 3],
    ]);
    if h[VERSION_AT] == 1 && stored == crc32c::crc32c(&h[..V1_HEADER_CRC_AT]) {
        return Err(WireError::UnsupportedVersion {
            version: 1,
            supported: PROTOCOL_VERSION,
        });
    }
    Ok(())
}

/// Decodes the body of a frame whose header [`FrameHeader::decode`] accepted. `body` must
/// be exactly `header.body_bytes()` long; payloads in the result are slices of it.
///
/// For readers that read the header and the body separately.
///
/// # Errors
/// [`WireError::BadFrame`] (the stream stays in sync) wrapping the cause:
/// [`WireError::BodyChecksum`], [`WireError::UnknownFlags`], [`WireError::ReservedNotZero`],
/// [`WireError::UnknownFrameType`], or a body error (`Truncated`, `CountTooLarge`,
/// `CountExceedsBody`, `StringTooLong`, `InvalidUtf8`, `InvalidTag`, `TrailingBytes`, …).
///
/// # Panics
/// If `body.len() != header.body_bytes()` (a caller bug).
pub fn decode_frame_body(header: &FrameHeader, body: Bytes) -> Result<Frame, WireError> {
    assert_eq!(
        body.len(),
        header.body_bytes(),
        "body length must match the header"
    );
    decode_checked_body(header, &body).map_err(|source| WireError::BadFrame {
        request_id: header.request_id,
        frame_type: header.frame_type,
        frame_bytes: header.frame_bytes,
        source: Box::new(source),
    })
}

fn decode_checked_body(header: &FrameHeader, body: &Bytes) -> Result<Frame, WireError> {
    let computed = crc32c::crc32c(body);
    if computed != header.body_crc {
        return Err(WireError::BodyChecksum {
            stored: header.body_crc,
            computed,
        });
    }
    let flags = Flags::from_bits(header.flags).ok_or(WireError::UnknownFlags {
        flags: header.flags,
    })?;
    if header.reserved != 0 {
        return Err(WireError::ReservedNotZero {
            value: header.reserved,
        });
    }
    let frame_type = FrameType::from_u16(header.frame_type).ok_or(WireError::UnknownFrameType {
        frame_type: header.frame_type,
    })?;
    let mut reader = Reader::new(body);
    let body = Body::read(frame_type, &mut reader)?;
    reader.finish()?;
    Ok(Frame {
        request_id: header.request_id,
        log: header.log,
        flags,
        body,
    })
}

/// Decodes the first frame in `buf`, zero-copy.
///
/// Returns `Ok(None)` when `buf` does not yet hold a whole frame; `Ok(Some(frame))` with
/// the frame's bytes split off the front of `buf`. It never reserves memory: the length
/// prefix is the peer's word, so a reader grows `buf` as bytes actually arrive (servers do
/// so under a byte budget, see quire-net's `FrameReader`), and [`frame_bytes_announced`]
/// tells a reader that trusts its peer how much room the frame at the front wants.
///
/// # Errors
/// A header error ([`WireError::is_connection_fatal`]): nothing is consumed and the
/// connection must be closed. [`WireError::BadFrame`]: the frame was consumed and the
/// next call decodes the next one.
pub fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
    let Some(header_bytes) = buf.first_chunk::<HEADER_BYTES>() else {
        check_older_version(buf)?;
        return Ok(None);
    };
    let header = FrameHeader::decode(header_bytes)?;
    let frame_bytes = header.frame_bytes as usize;
    if buf.len() < frame_bytes {
        return Ok(None);
    }
    let body = buf.split_to(frame_bytes).freeze().split_off(HEADER_BYTES);
    decode_frame_body(&header, body).map(Some)
}

/// The length, header included, of the frame at the front of `buf`, once its whole header
/// is there: `Ok(None)` before that. The value is bounded by `FRAME_BYTES_MAX` but is
/// still only what the peer announced.
///
/// # Errors
/// As [`FrameHeader::decode`]: the header is bad and the connection must be closed.
pub fn frame_bytes_announced(buf: &[u8]) -> Result<Option<usize>, WireError> {
    let Some(header_bytes) = buf.first_chunk::<HEADER_BYTES>() else {
        check_older_version(buf)?;
        return Ok(None);
    };
    Ok(Some(
        FrameHeader::decode(header_bytes)?.frame_bytes as usize,
    ))
}

/// Decodes the first frame in `buf`, returning it with the number of bytes it took.
/// Payloads are copied once (the frame's bytes into one new `Bytes`).
///
/// # Errors
/// As [`decode`]; after [`WireError::BadFrame`] the caller skips its `frame_bytes`.
pub fn decode_slice(buf: &[u8]) -> Result<Option<(Frame, usize)>, WireError> {
    let Some(header_bytes) = buf.first_chunk::<HEADER_BYTES>() else {
        check_older_version(buf)?;
        return Ok(None);
    };
    let header = FrameHeader::decode(header_bytes)?;
    let frame_bytes = header.frame_bytes as usize;
    let Some(frame) = buf.get(HEADER_BYTES..frame_bytes) else {
        return Ok(None);
    };
    let frame = decode_frame_body(&header, Bytes::copy_from_slice(frame))?;
    Ok(Some((frame, frame_bytes)))
}

/// Appends `frame` to `buf` as one contiguous frame: one copy of each payload. Returns
/// the frame's length in bytes. On error `buf` is left as it was.
///
/// # Errors
/// [`WireError::FrameTooLarge`] if the frame would exceed `FRAME_BYTES_MAX`;
/// [`WireError::StringTooLong`], [`WireError::EmptyName`], [`WireError::CountTooLarge`],
/// [`WireError::EventsNotContiguous`] or [`WireError::OffsetOverflow`] for a value the
/// protocol cannot carry. Everything is checked before a byte is written.
pub fn encode(frame: &Frame, buf: &mut BytesMut) -> Result<usize, WireError> {
    let body_bytes = frame.body.encoded_bytes()?;
    let frame_bytes = check_frame_bytes(body_bytes)?;
    buf.reserve(frame_bytes as usize);
    let start = buf.len();
    buf.extend_from_slice(&[0u8; HEADER_BYTES]);
    if let Err(e) = frame.body.write(buf) {
        buf.truncate(start);
        return Err(e);
    }
    assert_eq!(
        buf.len() - start,
        frame_bytes as usize,
        "invariant: counted and written sizes agree"
    );
    let header = FrameHeader {
        frame_bytes,
        frame_type: frame.frame_type().as_u16(),
        flags: frame.flags.bits(),
        request_id: frame.request_id,
        log: frame.log,
        reserved: 0,
        body_crc: crc32c::crc32c(&buf[start + HEADER_BYTES..]),
    };
    buf[start..start + HEADER_BYTES].copy_from_slice(&header.encode());
    Ok(frame_bytes as usize)
}

fn check_frame_bytes(body_bytes: usize) -> Result<u32, WireError> {
    let frame_bytes = body_bytes.saturating_add(HEADER_BYTES);
    if frame_bytes > FRAME_BYTES_MAX {
        return Err(WireError::FrameTooLarge {
            length: frame_bytes as u64,
            max: FRAME_BYTES_MAX,
        });
    }
    // FRAME_BYTES_MAX fits in u32 (asserted in limits.rs).
    u32::try_from(frame_bytes).map_err(|_| WireError::FrameTooLarge {
        length: frame_bytes as u64,
        max: FRAME_BYTES_MAX,
    })
}

/// A body encoded once, ready to be sent behind any number of headers: the fan-out and
/// vectored-write path.
///
/// The body is a list of chunks: small fields (and payloads of at most
/// `INLINE_PAYLOAD_BYTES_MAX` bytes) copied into runs of the scratch buffer, and each
/// larger payload as its own shared `Bytes` (no copy). A sender writes
/// `header(log, request_id, flags)` then `chunks()` with one vectored write (mind
/// `IOV_MAX`, 1024 on Linux); a master sends the same `EncodedBody` to every store, each
/// with its own request id. Cloning is cheap (reference counts).
#[derive(Clone, Debug)]
pub struct EncodedBody {
    frame_type: FrameType,
    chunks: Vec<Bytes>,
    frame_bytes: u32,
    body_crc: u32,
}

/// Encodes `body` once for [`EncodedBody`]'s vectored, fan-out path. `scratch` holds the
/// small fields; it is cleared first and may be reused (its spare capacity is kept).
///
/// # Errors
/// As [`encode`].
pub fn encode_body(body: &Body, scratch: &mut BytesMut) -> Result<EncodedBody, WireError> {
    let body_bytes = body.encoded_bytes()?;
    let frame_bytes = check_frame_bytes(body_bytes)?;
    let mut writer = ChunkWriter::new(scratch);
    body.write(&mut writer)?;
    let chunks = writer.finish();
    let mut body_crc = 0;
    let mut written = 0;
    for chunk in &chunks {
        body_crc = crc32c::crc32c_append(body_crc, chunk);
        written += chunk.len();
    }
    assert_eq!(
        written, body_bytes,
        "invariant: counted and written sizes agree"
    );
    Ok(EncodedBody {
        frame_type: body.frame_type(),
        chunks,
        frame_bytes,
        body_crc,
    })
}

impl EncodedBody {
    /// The frame type.
    #[must_use]
    pub fn frame_type(&self) -> FrameType {
        self.frame_type
    }

    /// The body's chunks, in order.
    #[must_use]
    pub fn chunks(&self) -> &[Bytes] {
        &self.chunks
    }

    /// The whole frame's length, header included, in bytes.
    #[must_use]
    pub fn frame_bytes(&self) -> usize {
        self.frame_bytes as usize
    }

    /// The header that puts this body on the wire as request (or response) `request_id`
    /// about `log`.
    #[must_use]
    pub fn header(&self, log: LogId, request_id: RequestId, flags: Flags) -> [u8; HEADER_BYTES] {
        FrameHeader {
            frame_bytes: self.frame_bytes,
            frame_type: self.frame_type.as_u16(),
            flags: flags.bits(),
            request_id,
            log,
            reserved: 0,
            body_crc: self.body_crc,
        }
        .encode()
    }

    /// Appends the whole frame (header and chunks) to `out`, copying: for senders without
    /// vectored writes, and for tests.
    pub fn write_frame(&self, log: LogId, request_id: RequestId, flags: Flags, out: &mut BytesMut) {
        out.reserve(self.frame_bytes());
        out.extend_from_slice(&self.header(log, request_id, flags));
        for chunk in &self.chunks {
            out.extend_from_slice(chunk);
        }
    }
}
