//! [`WireError`], the one error type of this crate, and [`ErrorCode`], the stable numbers a
//! peer puts in an `ErrorResponse`.
//!
//! `WireError` is what the codec says about bytes (they are not a valid frame, or a value
//! cannot be encoded). `ErrorCode` is what one peer tells another over the wire; a
//! `WireError` maps to one with [`WireError::error_code`].

use crate::frame::RequestId;
use crate::types::Offset;

/// Why bytes could not be decoded into a frame, or a value could not be encoded.
///
/// Decoding sorts errors into two classes (see [`WireError::is_connection_fatal`]):
/// header errors leave the byte stream out of sync, and the connection must be closed;
/// [`WireError::BadFrame`] means the header was sound, the whole frame has been consumed,
/// and the stream is still in sync, so a server may answer that request with an
/// `ErrorResponse` and go on.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The header's CRC32C does not match its first 20 bytes: nothing in it, the length
    /// least of all, can be trusted.
    #[error("frame header checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    HeaderChecksum {
        /// CRC stored in the header.
        stored: u32,
        /// CRC computed over the header bytes received.
        computed: u32,
    },
    /// The peer speaks another protocol version.
    #[error("unsupported protocol version {version} (this build speaks {supported})")]
    UnsupportedVersion {
        /// Version byte received.
        version: u8,
        /// Version this build speaks.
        supported: u8,
    },
    /// The header's length is smaller than the header itself.
    #[error("frame length {length} is below the header size {header_bytes}")]
    FrameTooShort {
        /// Length field received, in bytes.
        length: u32,
        /// Size of the header, in bytes.
        header_bytes: usize,
    },
    /// The frame's length exceeds `FRAME_BYTES_MAX` (received from a header, or the size
    /// of a frame the caller asked to encode).
    #[error("frame length {length} exceeds the maximum {max}")]
    FrameTooLarge {
        /// Frame length, header included, in bytes.
        length: u64,
        /// `FRAME_BYTES_MAX`.
        max: usize,
    },
    /// The frame type is not one this protocol version defines.
    #[error("unknown frame type {frame_type:#06x}")]
    UnknownFrameType {
        /// Frame type received.
        frame_type: u16,
    },
    /// The header sets flag bits this protocol version does not define.
    #[error("unknown flag bits {flags:#04x}")]
    UnknownFlags {
        /// Flags byte received.
        flags: u8,
    },
    /// The header's reserved word (bytes 20..24) is not zero: a later protocol version's
    /// field this build does not know.
    #[error("reserved header word is {value:#010x}, not 0")]
    ReservedNotZero {
        /// The word received.
        value: u32,
    },
    /// The body's CRC32C does not match the body received.
    #[error("frame body checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    BodyChecksum {
        /// CRC stored in the header.
        stored: u32,
        /// CRC computed over the body received.
        computed: u32,
    },
    /// The body ended inside a field.
    #[error("truncated {field}: needs {needed} bytes, {remaining} remain in the body")]
    Truncated {
        /// Field being read.
        field: &'static str,
        /// Bytes the field needs.
        needed: u64,
        /// Bytes left in the body.
        remaining: u64,
    },
    /// A list count exceeds its bound.
    #[error("{field} count {count} exceeds the maximum {max}")]
    CountTooLarge {
        /// List being read or written.
        field: &'static str,
        /// Count received or given.
        count: u64,
        /// The list's `*_MAX` bound.
        max: u64,
    },
    /// A list count is larger than the bytes left in the body could hold.
    #[error(
        "{field} count {count} needs at least {item_bytes_min} bytes each, only {remaining} remain"
    )]
    CountExceedsBody {
        /// List being read.
        field: &'static str,
        /// Count received.
        count: u64,
        /// Smallest encoded size of one item, in bytes.
        item_bytes_min: u64,
        /// Bytes left in the body.
        remaining: u64,
    },
    /// A string exceeds its bound.
    #[error("{field} is {length} bytes, the maximum is {max}")]
    StringTooLong {
        /// Field being read or written.
        field: &'static str,
        /// Length received or given, in bytes.
        length: usize,
        /// The field's `*_BYTES_MAX` bound.
        max: usize,
    },
    /// A topic or cursor name is empty.
    #[error("{field} is empty")]
    EmptyName {
        /// Field being read or written.
        field: &'static str,
    },
    /// A string is not valid UTF-8.
    #[error("{field} is not valid UTF-8")]
    InvalidUtf8 {
        /// Field being read.
        field: &'static str,
    },
    /// A payload is longer than any frame can carry.
    #[error("{field} is {length} bytes, the maximum is {max}")]
    PayloadTooLarge {
        /// Field being written.
        field: &'static str,
        /// Payload length, in bytes.
        length: usize,
        /// The bound, in bytes.
        max: usize,
    },
    /// A bool, option tag or enum byte holds a value no variant uses.
    #[error("{field} has invalid tag byte {byte}")]
    InvalidTag {
        /// Field being read.
        field: &'static str,
        /// Byte received.
        byte: u8,
    },
    /// An event's kind byte is not a known `EventKind`.
    #[error("unknown event kind {byte}")]
    UnknownEventKind {
        /// Kind byte received.
        byte: u8,
    },
    /// An `ErrorResponse` carries an error code this protocol version does not define.
    #[error("unknown error code {code}")]
    UnknownErrorCode {
        /// Code received.
        code: u16,
    },
    /// The body holds bytes after its last field.
    #[error("{count} trailing bytes after the body's last field")]
    TrailingBytes {
        /// Bytes left over.
        count: usize,
    },
    /// The events of an append or read are not at consecutive offsets starting right
    /// after `prev` (an encoding error: the caller built a malformed message).
    #[error("event {index} is at offset {actual}, expected {expected}")]
    EventsNotContiguous {
        /// Index of the first event out of place.
        index: usize,
        /// Offset it should have.
        expected: Offset,
        /// Offset it has.
        actual: Offset,
    },
    /// A range digest request's `from..=to` is empty (`from > to`) or spans more than
    /// `RANGE_DIGEST_OFFSETS_MAX` offsets.
    #[error("{field}: range {from}..={to} is empty or spans more than {max} offsets")]
    InvalidRange {
        /// Field holding the range.
        field: &'static str,
        /// First offset of the range.
        from: Offset,
        /// Last offset of the range.
        to: Offset,
        /// Most offsets one request may span.
        max: u64,
    },
    /// The offsets a message implies do not fit in a u64.
    #[error("{field}: offsets overflow u64")]
    OffsetOverflow {
        /// Field whose offsets overflow.
        field: &'static str,
    },
    /// An event body's format version is not one this build reads.
    #[error("unsupported event body version {version} (this build reads {supported})")]
    UnsupportedEventBodyVersion {
        /// Version byte found.
        version: u8,
        /// Version this build reads.
        supported: u8,
    },
    /// A frame whose header was sound failed to decode. The frame's `frame_bytes` were
    /// consumed, so the stream is still in sync.
    #[error(
        "bad frame (request {request_id}, type {frame_type:#06x}, {frame_bytes} bytes): {source}"
    )]
    BadFrame {
        /// Request id from the header, to answer with an `ErrorResponse`.
        request_id: RequestId,
        /// Frame type from the header (possibly unknown).
        frame_type: u16,
        /// Length of the whole frame, header included: what a slice decoder skips.
        frame_bytes: u32,
        /// What was wrong with the frame.
        #[source]
        source: Box<WireError>,
    },
}

impl WireError {
    /// For an error returned by a decoder: `true` if the byte stream is out of sync (the
    /// header itself was bad) and the connection must be closed; `false` for
    /// [`WireError::BadFrame`], after which the next frame can be decoded.
    #[must_use]
    pub fn is_connection_fatal(&self) -> bool {
        !matches!(self, WireError::BadFrame { .. })
    }

    /// The innermost error: the one inside [`WireError::BadFrame`], or `self`.
    #[must_use]
    pub fn cause(&self) -> &WireError {
        match self {
            WireError::BadFrame { source, .. } => source.cause(),
            other => other,
        }
    }

    /// The stable code to send a peer whose bytes produced this error.
    #[must_use]
    pub fn error_code(&self) -> ErrorCode {
        match self.cause() {
            WireError::HeaderChecksum { .. } | WireError::BodyChecksum { .. } => {
                ErrorCode::ChecksumMismatch
            }
            WireError::UnsupportedVersion { .. } => ErrorCode::UnsupportedVersion,
            WireError::FrameTooLarge { .. } => ErrorCode::FrameTooLarge,
            WireError::UnknownFrameType { .. } => ErrorCode::UnknownFrameType,
            _ => ErrorCode::Malformed,
        }
    }
}

/// Stable numeric error codes carried by an `ErrorResponse` (u16, little-endian on the
/// wire). A number, once given a meaning, never changes it; new codes come with a new
/// protocol version, and a decoder refuses a code it does not know
/// ([`WireError::UnknownErrorCode`]).
///
/// Ranges: 1–99 framing and generic, 100–199 event store, 200–299 broker and client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    /// The frame's body could not be decoded (truncated, bad count, bad UTF-8, bad tag,
    /// trailing bytes, …).
    Malformed = 1,
    /// The frame's protocol version is not one this peer speaks.
    UnsupportedVersion = 2,
    /// The frame type is unknown.
    UnknownFrameType = 3,
    /// The frame's length exceeds `FRAME_BYTES_MAX`.
    FrameTooLarge = 4,
    /// A header or body CRC32C did not match.
    ChecksumMismatch = 5,
    /// A valid frame this peer does not serve (a response sent as a request, a client
    /// request sent to a store, …).
    UnexpectedFrame = 6,
    /// The peer hit a bug or an internal limit; the request may be retried elsewhere.
    Internal = 7,
    /// Too many requests or bytes in flight on this connection; or, with request id 0 just
    /// before the close, the server already holds as many connections as it may
    /// (`connections_max`). Retry later.
    Overloaded = 8,
    /// The peer is shutting down.
    ShuttingDown = 9,
    /// The connection is being closed because it held the server's resources too long: a
    /// frame did not complete within the server's partial-frame timeout, or nothing
    /// arrived within its idle timeout. Sent with request id 0 just before the close;
    /// reconnect (and send whole frames promptly).
    ConnectionTimeout = 10,
    /// The frame names a log (header field `log`) this peer does not host or serve. Until
    /// partitions land, only log 0 exists; later, the log may have been deleted or not be
    /// created yet. Refresh the metadata.
    UnknownLog = 11,
    /// The peer's verified TLS certificate does not allow this request: a fence or an
    /// append to a store, or replication or a take-over request to a broker, from a peer
    /// whose certificate does not name the broker role (or that showed none). The message
    /// names the peer and the request; nothing of the request took effect.
    Unauthorized = 12,
    /// A SASL exchange failed: an unknown user, a wrong password, an unknown mechanism or a
    /// malformed message (the message does not say which of user and password was wrong).
    /// Sent just before the broker closes the connection.
    AuthenticationFailed = 13,
    /// Store: this store is on a new incarnation (its disk was wiped or replaced) and
    /// never grants a fence or counts toward a quorum; detail `ErrorDetail::NotVoter`.
    NotVoter = 100,
    /// Store: the log failed (a write or fsync error) and takes no more appends
    /// (fail-stop); what it acknowledged before stays valid.
    LogFailed = 101,
    /// Store: a record the read asked for fails its checks on this store's disk (a bit
    /// flip, a misdirected or lost write); detail `ErrorDetail::Corrupt` names its offset.
    /// The records before it were good; other stores that hold the range hold good copies
    /// — read it from one of them. Never means "absent".
    Corrupt = 102,
    /// Broker: this broker is not the master; detail `ErrorDetail::NotMaster` names the
    /// master if known.
    NotMaster = 200,
    /// Broker: no such topic.
    UnknownTopic = 201,
    /// Broker: a topic or cursor name is not acceptable.
    InvalidName = 202,
    /// Broker: the requested offset is outside the log (trimmed, or past its end).
    OffsetOutOfRange = 203,
    /// Broker: an idempotent produce's sequence is not the next one expected for its
    /// producer id.
    SequenceGap = 204,
    /// Broker: a message exceeds `MESSAGE_BYTES_MAX` or the broker's configured bound.
    MessageTooLarge = 205,
    /// Broker: the request's messages were not stabilized in time; the outcome is
    /// unknown (retry with the same producer id and sequence).
    Timeout = 206,
    /// Broker: fewer than a quorum of voting stores are reachable.
    NoQuorum = 207,
    /// Broker: the offset asked for was deleted by retention; detail
    /// `ErrorDetail::Trimmed` names the first offset still held.
    Trimmed = 208,
    /// Broker: the request would add a topic or a cursor beyond the broker's bound
    /// (`topics_max`, `cursors_max`); not retried. Use existing names, delete topics
    /// ([`crate::TopicAdminRequest`]), or raise the bound.
    LimitReached = 209,
    /// Broker: a topic create names a topic that exists.
    TopicExists = 210,
    /// Broker: a topic create asks for a number of partitions this cluster cannot make
    /// (every topic is one partition until issue 13's partitions land).
    InvalidPartitions = 211,
    /// Broker: a Kafka-format idempotent produce whose producer the idempotent-producer
    /// table does not hold (never seen, or forgotten for newer ones) starts past sequence
    /// 0; the producer starts over (the Kafka listener's `UNKNOWN_PRODUCER_ID`).
    UnknownProducer = 212,
    /// Broker: a voter-set change was refused and nothing changed: the store is not in the
    /// brokers' store list, unreachable, a learner by its own directory
    /// (`quire-node init --learner`), already a voter (or not one, for a removal), or the
    /// change would leave fewer reachable voters than a quorum. The message says which.
    VoterChangeRefused = 213,
    /// Broker: an earlier voter-set change, or the master's epoch-start event, is not
    /// stabilized yet: one change at a time. Retry once it is.
    ChangeInProgress = 214,
    /// Broker: the store to add has not caught up with the master's HWM yet (it is copying
    /// the log as a learner). Retry once `quire cluster status` shows it caught up.
    StoreCatchingUp = 215,
}

impl ErrorCode {
    /// Every code, in numeric order (for tables and tests).
    pub const ALL: [ErrorCode; 32] = [
        ErrorCode::Malformed,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnknownFrameType,
        ErrorCode::FrameTooLarge,
        ErrorCode::ChecksumMismatch,
        ErrorCode::UnexpectedFrame,
        ErrorCode::Internal,
        ErrorCode::Overloaded,
        ErrorCode::ShuttingDown,
        ErrorCode::ConnectionTimeout,
        ErrorCode::UnknownLog,
        ErrorCode::Unauthorized,
        ErrorCode::AuthenticationFailed,
        ErrorCode::NotVoter,
        ErrorCode::LogFailed,
        ErrorCode::Corrupt,
        ErrorCode::NotMaster,
        ErrorCode::UnknownTopic,
        ErrorCode::InvalidName,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::SequenceGap,
        ErrorCode::MessageTooLarge,
        ErrorCode::Timeout,
        ErrorCode::NoQuorum,
        ErrorCode::Trimmed,
        ErrorCode::LimitReached,
        ErrorCode::TopicExists,
        ErrorCode::InvalidPartitions,
        ErrorCode::UnknownProducer,
        ErrorCode::VoterChangeRefused,
        ErrorCode::ChangeInProgress,
        ErrorCode::StoreCatchingUp,
    ];

    /// The code's number on the wire.
    #[must_use]
    pub fn as_u16(self) -> u16 {
        self as u16
    }

    /// The code for a number, or `None` for a number no code uses.
    #[must_use]
    pub fn from_u16(code: u16) -> Option<ErrorCode> {
        ErrorCode::ALL.into_iter().find(|c| c.as_u16() == code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?} ({})", self.as_u16())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_are_stable_numbers() {
        // These numbers are a wire contract: this test fails if one is renumbered.
        let expected: [(ErrorCode, u16); 32] = [
            (ErrorCode::Malformed, 1),
            (ErrorCode::UnsupportedVersion, 2),
            (ErrorCode::UnknownFrameType, 3),
            (ErrorCode::FrameTooLarge, 4),
            (ErrorCode::ChecksumMismatch, 5),
            (ErrorCode::UnexpectedFrame, 6),
            (ErrorCode::Internal, 7),
            (ErrorCode::Overloaded, 8),
            (ErrorCode::ShuttingDown, 9),
            (ErrorCode::ConnectionTimeout, 10),
            (ErrorCode::UnknownLog, 11),
            (ErrorCode::Unauthorized, 12),
            (ErrorCode::AuthenticationFailed, 13),
            (ErrorCode::NotVoter, 100),
            (ErrorCode::LogFailed, 101),
            (ErrorCode::Corrupt, 102),
            (ErrorCode::NotMaster, 200),
            (ErrorCode::UnknownTopic, 201),
            (ErrorCode::InvalidName, 202),
            (ErrorCode::OffsetOutOfRange, 203),
            (ErrorCode::SequenceGap, 204),
            (ErrorCode::MessageTooLarge, 205),
            (ErrorCode::Timeout, 206),
            (ErrorCode::NoQuorum, 207),
            (ErrorCode::Trimmed, 208),
            (ErrorCode::LimitReached, 209),
            (ErrorCode::TopicExists, 210),
            (ErrorCode::InvalidPartitions, 211),
            (ErrorCode::UnknownProducer, 212),
            (ErrorCode::VoterChangeRefused, 213),
            (ErrorCode::ChangeInProgress, 214),
            (ErrorCode::StoreCatchingUp, 215),
        ];
        for (code, number) in expected {
            assert_eq!(code.as_u16(), number);
            assert_eq!(ErrorCode::from_u16(number), Some(code));
        }
        assert_eq!(ErrorCode::ALL.len(), expected.len());
        for n in [0u16, 14, 99, 103, 199, 216, 299, u16::MAX] {
            assert_eq!(ErrorCode::from_u16(n), None, "code {n}");
        }
    }

    #[test]
    fn bad_frame_maps_to_its_cause() {
        let e = WireError::BadFrame {
            request_id: RequestId(7),
            frame_type: 0x0101,
            frame_bytes: 40,
            source: Box::new(WireError::BodyChecksum {
                stored: 1,
                computed: 2,
            }),
        };
        assert!(!e.is_connection_fatal());
        assert_eq!(e.error_code(), ErrorCode::ChecksumMismatch);
        assert_eq!(
            e.cause(),
            &WireError::BodyChecksum {
                stored: 1,
                computed: 2
            }
        );
        assert!(WireError::HeaderChecksum {
            stored: 1,
            computed: 2
        }
        .is_connection_fatal());
    }
}
