//! quire-proto: the one definition of Quire's wire bytes, and the vocabulary types every
//! Quire crate shares.
//!
//! This crate is a pure codec: no sockets, no async runtime, no file I/O. It owns
//!
//! - the frame: a fixed 32-byte header (length, frame type, version, flags, request id,
//!   log id, body CRC32C, header CRC32C) then a body, all little-endian ([`frame`]);
//! - every body exchanged between clients, brokers and stores ([`replication`],
//!   [`client`], [`ErrorResponse`]) and the stable [`ErrorCode`] numbers;
//! - the payload encodings of the broker's events in the log ([`event_body`]);
//! - the range digest that compares two stores' logs without their events ([`digest`]);
//! - every bound, as a named constant ([`limits`]);
//! - the newtypes of DESIGN.md's vocabulary ([`Offset`], [`Epoch`], …).
//!
//! It does not own what a node or a broker does with a message: the rules live in those
//! crates, and docs/protocol.md draws the bytes and the message flow.
//!
//! # Using it
//!
//! Reading: append socket bytes to a `BytesMut` and call [`decode`] until it returns
//! `Ok(None)`. Payloads in the decoded frames are slices of that buffer (zero copy). On
//! an error, [`WireError::is_connection_fatal`] says whether to close the connection or to
//! answer the request with [`ErrorResponse::from_wire_error`] and read on.
//!
//! Writing: [`encode`] appends a frame to a `BytesMut` (one copy of each payload). For
//! large payloads and fan-out, [`encode_body`] builds an [`EncodedBody`] once: its chunks
//! share the payloads, and each destination gets its own 32-byte header
//! ([`EncodedBody::header`]) in front of the same chunks, written with one vectored write.
//!
//! Nothing in this crate panics on bytes from the network: every malformed input gives a
//! [`WireError`].

mod codec;

pub mod client;
pub mod digest;
pub mod error;
pub mod error_response;
pub mod event_body;
pub mod frame;
pub mod limits;
pub mod payload;
pub mod record;
pub mod replication;
pub mod security;
pub mod types;

pub use client::{
    validate_cursor, validate_topic, BrokerInfo, CommitCursorRequest, CommitCursorResponse,
    CursorRequest, CursorResponse, FetchRequest, FetchResponse, HandoffRequest, HandoffResponse,
    MetadataRequest, MetadataResponse, ProduceRequest, ProduceResponse, StoreInfo,
    TopicAdminRequest, VoterChange, VoterChangeRequest,
};
pub use digest::{EntryId, RangeDigest};
pub use error::{ErrorCode, WireError};
pub use error_response::{ErrorDetail, ErrorResponse};
pub use event_body::{
    encode_message_event, encode_message_header, encode_message_header_as, message_body_version,
    message_event_bytes, message_header_bytes, message_header_bytes_as, trim_part_index,
    BrokerSnapshot, CheckpointPart, ConfigEvent, CursorCommitEvent, EpochStartEvent, EventBody,
    MessageEvent, MessageFormat, SnapshotCursor, SnapshotProducer, SnapshotRun, TopicAction,
    TopicAdminEvent, TrimEvent, Voter, CHECKPOINT_PARTS_MAX, EVENT_BODY_VERSION,
    SNAPSHOT_CURSORS_MAX, SNAPSHOT_PRODUCERS_MAX, SNAPSHOT_RUNS_MAX, SNAPSHOT_TOPICS_MAX,
};
pub use frame::{
    check_older_version, decode, decode_frame_body, decode_slice, encode, encode_body,
    frame_bytes_announced, Body, EncodedBody, Flags, Frame, FrameHeader, FrameType, RequestId,
    HEADER_BYTES, PROTOCOL_VERSION,
};
pub use limits::*;
pub use payload::Payload;
pub use record::KafkaRecord;
pub use replication::{
    AppendRejected, AppendRequest, Event, FenceGranted, FenceRefused, FenceRequest, Heartbeat,
    HeartbeatAck, PersistedAck, RangeDigestRequest, RangeDigestResponse, ReadRequest, ReadResponse,
    RejectReason, RepairOutcome, RepairRequest, RepairResponse, TailCut, TailRequest, TailResponse,
    TakeOverNowRequest, TakeOverNowResponse, EVENT_OVERHEAD_BYTES,
};
pub use security::{
    AclAction, AclAdminEvent, AclAdminRequest, AclEntry, AclOperation, AdminResponse,
    AuthenticateRequest, AuthenticateResponse, DescribeSecurityRequest, DescribeSecurityResponse,
    ScramCredential, UserAdminEvent, UserAdminRequest, UserInfo, ACLS_MAX, PRINCIPAL_BYTES_MAX,
    SASL_MESSAGE_BYTES_MAX, SCRAM_KEY_BYTES, SCRAM_SALT_BYTES_MAX, USERS_MAX,
};
pub use types::{BrokerId, Epoch, EventKind, Incarnation, LogId, LogPosition, Offset, StoreId};

#[cfg(test)]
mod tests;
