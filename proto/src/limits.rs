//! Every bound of the wire protocol, as named constants.
//!
//! The decoder checks each of these before it allocates: a frame's length against
//! [`FRAME_BYTES_MAX`] from the header alone, a string's length against its `*_BYTES_MAX`,
//! and a count against both its `*_MAX` and the bytes actually left in the body. The encoder
//! checks the same bounds, so a frame that encodes is a frame that decodes.

/// Largest frame on the wire, header included, in bytes (16 MiB).
pub const FRAME_BYTES_MAX: usize = 16 * 1024 * 1024;

/// Longest topic name, in bytes of UTF-8. Topic names are also non-empty.
pub const TOPIC_BYTES_MAX: usize = 255;

/// Longest consumer cursor name, in bytes of UTF-8. Cursor names are also non-empty.
pub const CURSOR_BYTES_MAX: usize = 255;

/// Longest network address string (`host:port`), in bytes of UTF-8.
pub const ADDR_BYTES_MAX: usize = 255;

/// Longest human-readable message in an `ErrorResponse`, in bytes of UTF-8.
/// `ErrorResponse::new` truncates longer text at a character boundary.
pub const ERROR_MESSAGE_BYTES_MAX: usize = 1024;

/// Most events in one `AppendRequest` or `ReadResponse`.
pub const EVENTS_PER_FRAME_MAX: usize = 65_536;

/// Most offsets one `RangeDigestRequest` may span (`to - from + 1`). A store reads every
/// record of the range from its WAL to answer, so this bounds one request's work (at most
/// this many records, read in chunks of bounded bytes); a longer range is asked as several.
pub const RANGE_DIGEST_OFFSETS_MAX: u64 = 65_536;

/// Most messages in one `ProduceRequest` or `FetchResponse`.
pub const MESSAGES_PER_FRAME_MAX: usize = 65_536;

/// Most brokers, or most stores, listed in one `MetadataResponse`.
pub const MEMBERS_MAX: usize = 256;

/// Largest event payload, in bytes: an `AppendRequest` or a `ReadResponse` carrying one
/// event of this size still fits in [`FRAME_BYTES_MAX`].
pub const EVENT_PAYLOAD_BYTES_MAX: usize = FRAME_BYTES_MAX - 1024;

/// Largest producer message, in bytes: a message event (topic of [`TOPIC_BYTES_MAX`]
/// included) built from it still fits in [`EVENT_PAYLOAD_BYTES_MAX`], and a
/// `ProduceRequest` or `FetchResponse` carrying it fits in [`FRAME_BYTES_MAX`].
pub const MESSAGE_BYTES_MAX: usize = EVENT_PAYLOAD_BYTES_MAX - 1024;

/// Vectored encoding ([`crate::encode_body`]): a payload of at most this many bytes is
/// copied into the scratch buffer; a longer one becomes its own chunk (shared, not copied).
/// Below about a kilobyte, one more `iovec` costs more than the copy.
pub const INLINE_PAYLOAD_BYTES_MAX: usize = 1024;

const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);
const _: () = assert!(TOPIC_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(CURSOR_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(ADDR_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(ERROR_MESSAGE_BYTES_MAX <= u16::MAX as usize);
const _: () = assert!(EVENTS_PER_FRAME_MAX <= u32::MAX as usize);
const _: () = assert!(MESSAGES_PER_FRAME_MAX <= u32::MAX as usize);
