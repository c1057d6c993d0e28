//! [`FrameReader`]: reads the frames of one accepted connection under the partial-frame
//! timeout, the idle timeout and the server-wide [`ReadBudget`].
//!
//! ```text
//!            ┌────────── next() ───────────────────────────────────────────────┐
//!  socket ──▶│ wait readable ─▶ take room of the budget ─▶ try_read into room ─▶│─▶ Frame
//!            │ (idle / frame      (waits while the          (buffer grows as    │   (its bytes
//!            │  deadline)          budget is used up)        bytes arrive)      │    go back to
//!            └─────────────────────────────────────────────────────────────────┘    the budget)
//! ```
//!
//! - **No allocation from a length prefix.** The room of one read is at most
//!   [`READ_ROOM_BYTES_MAX`]; the buffer grows by at most doubling what it holds, and never
//!   past the announced frame's end by more than one room. A header that announces 16 MiB
//!   and is followed by nothing costs its 24 bytes.
//! - **Budget.** Bytes in the buffer hold budget permits; a decoded frame's permits go
//!   back. Room is taken only once the socket is readable, so an idle connection holds
//!   none.
//! - **Partial-frame clock.** From the read that brings a frame's first byte, the reader
//!   may spend at most the partial-frame timeout waiting (for the peer's bytes, or for
//!   budget) before the frame is whole. Time the server spends elsewhere — not calling
//!   [`FrameReader::next`] because its own request bounds hold the connection back — does
//!   not count against the peer. Counting budget waits is what keeps a budget used up by
//!   partial frames from stalling the server for good: their owners time out.
//! - **Idle clock.** A call that starts with an empty buffer waits at most the idle
//!   timeout for a first byte.
//!
//! `next` is cancel-safe: every byte read and every permit held lives in the reader, so
//! a server may `select!` it against its own shutdown signal.

use std::io;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use quire_proto::{
    decode, frame_bytes_announced, ErrorCode, ErrorResponse, Frame, RequestId, WireError,
};
use tokio::net::tcp::OwnedReadHalf;
use tokio::time::Instant;

use crate::budget::{Charge, ReadBudget};
use crate::settings::ReadSettings;

/// Largest room of a read when no frame header is known yet, in bytes: enough for many
/// small pipelined frames at once.
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Smallest room a read takes, in bytes (a reader waits for this much budget at least),
/// and the first room of a connection.
pub const READ_ROOM_BYTES_MIN: usize = 4 * 1024;
/// Largest room of one read, in bytes: the most memory one read can add.
pub const READ_ROOM_BYTES_MAX: usize = 1024 * 1024;
/// An empty buffer whose allocation is larger than this is dropped rather than kept.
const BUFFER_KEEP_BYTES_MAX: usize = READ_CHUNK_BYTES;

const _: () = assert!(READ_ROOM_BYTES_MIN <= READ_CHUNK_BYTES);
const _: () = assert!(READ_CHUNK_BYTES <= READ_ROOM_BYTES_MAX);
const _: () = assert!(READ_ROOM_BYTES_MAX <= u32::MAX as usize);

/// One decoded frame.
#[derive(Debug)]
pub struct Received {
    /// The frame (payloads are slices of the bytes received).
    pub frame: Frame,
    /// Its length on the wire, header included.
    pub frame_bytes: usize,
}

/// Why [`FrameReader::next`] gave no frame.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The peer closed the connection between frames.
    #[error("the peer closed the connection")]
    Closed,
    /// The peer closed the connection in the middle of a frame.
    #[error("the peer closed the connection {buffered} bytes into a frame")]
    ClosedMidFrame {
        /// Bytes of the unfinished frame received.
        buffered: usize,
    },
    /// A frame did not complete within the partial-frame timeout.
    #[error(
        "a frame did not complete within {timeout_ms} ms ({buffered} bytes received{})",
        match frame_bytes { Some(f) => format!(" of {f} announced"), None => String::new() }
    )]
    PartialFrameTimeout {
        /// Bytes of the frame received.
        buffered: usize,
        /// Its announced length, if its header was in.
        frame_bytes: Option<usize>,
        /// The timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// Nothing arrived within the idle timeout.
    #[error("nothing received for {timeout_ms} ms")]
    IdleTimeout {
        /// The timeout, in milliseconds.
        timeout_ms: u64,
    },
    /// Bytes that are not a frame: [`WireError::BadFrame`] (the frame was consumed, the
    /// stream is in sync, [`ReadError::is_recoverable`]) or a header error (the stream is
    /// out of sync).
    #[error(transparent)]
    Wire(#[from] WireError),
    /// The socket failed.
    #[error("reading the socket: {0}")]
    Io(#[from] io::Error),
}

impl ReadError {
    /// `true` when the connection can go on: a frame with a sound header whose body was
    /// bad (answer it and call [`FrameReader::next`] again). Every other error ends the
    /// connection.
    #[must_use]
    pub fn is_recoverable(&self) -> bool {
        matches!(self, ReadError::Wire(WireError::BadFrame { .. }))
    }

    /// What to send the peer: a bad frame's `ErrorResponse` under its own request id, or
    /// one about the connection (request id 0) before it is closed. `None` when the peer
    /// is gone or the socket failed.
    #[must_use]
    pub fn answer(&self) -> Option<(RequestId, ErrorResponse)> {
        match self {
            ReadError::Wire(e @ WireError::BadFrame { request_id, .. }) => {
                Some((*request_id, ErrorResponse::from_wire_error(e)))
            }
            ReadError::Wire(e) => Some((RequestId::CONNECTION, ErrorResponse::from_wire_error(e))),
            ReadError::PartialFrameTimeout { .. } | ReadError::IdleTimeout { .. } => Some((
                RequestId::CONNECTION,
                ErrorResponse::new(
                    ErrorCode::ConnectionTimeout,
                    format!("{self}: closing the connection"),
                ),
            )),
            ReadError::Closed | ReadError::ClosedMidFrame { .. } | ReadError::Io(_) => None,
        }
    }

    /// A short label for metrics and logs: `closed`, `truncated`, `partial_frame_timeout`,
    /// `idle_timeout`, `io`, or a [`wire_reject_reason`].
    #[must_use]
    pub fn reason(&self) -> &'static str {
        match self {
            ReadError::Closed => "closed",
            ReadError::ClosedMidFrame { .. } => "truncated",
            ReadError::PartialFrameTimeout { .. } => "partial_frame_timeout",
            ReadError::IdleTimeout { .. } => "idle_timeout",
            ReadError::Wire(e) => wire_reject_reason(e),
            ReadError::Io(_) => "io",
        }
    }
}

/// Why a frame was rejected, as a metrics label.
#[must_use]
pub fn wire_reject_reason(e: &WireError) -> &'static str {
    match e.cause() {
        WireError::HeaderChecksum { .. } => "header_checksum",
        WireError::BodyChecksum { .. } => "body_checksum",
        WireError::UnsupportedVersion { .. } => "unsupported_version",
        WireError::FrameTooShort { .. } => "frame_too_short",
        WireError::FrameTooLarge { .. } => "frame_too_large",
        WireError::UnknownFrameType { .. } => "unknown_frame_type",
        WireError::UnknownFlags { .. } => "unknown_flags",
        _ => "malformed",
    }
}

/// Reads the frames of one connection; see the module docs for the bounds it keeps.
#[derive(Debug)]
pub struct FrameReader {
    socket: OwnedReadHalf,
    buf: BytesMut,
    /// Budget held for the bytes in `buf` (always `buf.len()` between calls).
    held: Charge,
    budget: ReadBudget,
    partial_frame_timeout: Duration,
    idle_timeout: Option<Duration>,
    /// Time spent waiting inside `next` since the current partial frame's first byte.
    frame_waited: Duration,
    /// Room of the next read while no header says more: starts at READ_ROOM_BYTES_MIN and
    /// doubles (up to READ_CHUNK_BYTES) while reads fill it, so a connection that sends a
    /// byte at a time keeps a small buffer and a streaming one reads in chunks.
    chunk_bytes: usize,
}

impl FrameReader {
    /// A reader of `socket` under `budget` and the timeouts of `settings` (taken as
    /// they are: check them with [`ReadSettings::validate`] first).
    #[must_use]
    pub fn new(socket: OwnedReadHalf, budget: ReadBudget, settings: &ReadSettings) -> FrameReader {
        FrameReader {
            socket,
            buf: BytesMut::new(),
            held: budget.empty_charge(),
            budget,
            partial_frame_timeout: settings.partial_frame_timeout(),
            idle_timeout: settings.idle_timeout(),
            frame_waited: Duration::ZERO,
            chunk_bytes: READ_ROOM_BYTES_MIN,
        }
    }

    /// Bytes received and not yet handed out as frames.
    #[must_use]
    pub fn buffered_bytes(&self) -> usize {
        self.buf.len()
    }

    /// The next frame.
    ///
    /// # Errors
    /// [`ReadError`]: only after a [recoverable](ReadError::is_recoverable) one may `next`
    /// be called again.
    pub async fn next(&mut self) -> Result<Received, ReadError> {
        loop {
            let before = self.buf.len();
            let decoded = decode(&mut self.buf);
            let consumed = before - self.buf.len();
            if consumed > 0 {
                // A frame (good or bad) left the buffer: its budget goes back, and the next
                // frame's clock starts now.
                self.held.release(consumed);
                self.frame_waited = Duration::ZERO;
                if self.buf.is_empty() && self.buf.capacity() > BUFFER_KEEP_BYTES_MAX {
                    self.buf = BytesMut::new();
                }
            }
            debug_assert_eq!(self.held.bytes(), self.buf.len());
            match decoded {
                Ok(Some(frame)) => {
                    return Ok(Received {
                        frame,
                        frame_bytes: consumed,
                    })
                }
                Ok(None) => {}
                Err(e) => return Err(ReadError::Wire(e)),
            }
            self.fill().await?;
        }
    }

    /// Reads once into the buffer, under the deadline that applies.
    async fn fill(&mut self) -> Result<(), ReadError> {
        let partial = !self.buf.is_empty();
        let started = Instant::now();
        let deadline = if partial {
            Some(started + self.partial_frame_timeout.saturating_sub(self.frame_waited))
        } else {
            self.idle_timeout.map(|d| started + d)
        };
        let result = self.fill_until(partial, deadline).await;
        if partial {
            self.frame_waited += started.elapsed();
        }
        result
    }

    async fn fill_until(
        &mut self,
        partial: bool,
        deadline: Option<Instant>,
    ) -> Result<(), ReadError> {
        loop {
            if until(deadline, self.socket.readable()).await.is_none() {
                return Err(self.timeout_error(partial));
            }
            let readable_at = Instant::now();
            let room = self.room();
            // Take what is free, and at least READ_ROOM_BYTES_MIN (waiting for it): a
            // nearly used-up budget still lets readers make progress in small steps.
            let want = room
                .min(self.budget.available_bytes())
                .max(READ_ROOM_BYTES_MIN);
            // A partial frame's clock runs while it waits for budget; a connection with
            // nothing buffered holds no budget and may wait without bound.
            let wait_deadline = if partial { deadline } else { None };
            let Some(mut room_charge) = until(wait_deadline, self.budget.acquire(want)).await
            else {
                return Err(self.timeout_error(partial));
            };
            let want = room_charge.bytes();
            self.reserve(want);
            let read = self.socket.try_read_buf(&mut (&mut self.buf).limit(want));
            match read {
                Ok(0) => {
                    return Err(if self.buf.is_empty() {
                        ReadError::Closed
                    } else {
                        ReadError::ClosedMidFrame {
                            buffered: self.buf.len(),
                        }
                    })
                }
                Ok(n) => {
                    self.held.take_from(&mut room_charge, n);
                    self.chunk_bytes = if n == want {
                        (self.chunk_bytes * 2).min(READ_CHUNK_BYTES)
                    } else if n < want / 2 {
                        (self.chunk_bytes / 2).max(READ_ROOM_BYTES_MIN)
                    } else {
                        self.chunk_bytes
                    };
                    if !partial {
                        // The first bytes of a frame: its clock starts when they arrived.
                        self.frame_waited = Instant::now().saturating_duration_since(readable_at);
                    }
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
    }

    /// How many bytes the next read may bring: up to the announced frame's end (at least
    /// the current chunk, so small pipelined frames come in together), at most
    /// READ_ROOM_BYTES_MAX.
    fn room(&self) -> usize {
        match frame_bytes_announced(&self.buf) {
            Ok(Some(frame_bytes)) => frame_bytes
                .saturating_sub(self.buf.len())
                .clamp(self.chunk_bytes, READ_ROOM_BYTES_MAX),
            _ => self.chunk_bytes,
        }
    }

    /// Makes room for `want` more bytes, growing by at most doubling what is buffered
    /// (and never past the announced frame's end by more than `want`).
    fn reserve(&mut self, want: usize) {
        if self.buf.capacity() - self.buf.len() >= want {
            return;
        }
        let frame_rest = match frame_bytes_announced(&self.buf) {
            Ok(Some(frame_bytes)) => frame_bytes.saturating_sub(self.buf.len()),
            _ => 0,
        };
        self.buf.reserve(want.max(self.buf.len().min(frame_rest)));
    }

    fn timeout_error(&self, partial: bool) -> ReadError {
        if partial {
            ReadError::PartialFrameTimeout {
                buffered: self.buf.len(),
                frame_bytes: frame_bytes_announced(&self.buf).ok().flatten(),
                timeout_ms: millis(self.partial_frame_timeout),
            }
        } else {
            ReadError::IdleTimeout {
                timeout_ms: self.idle_timeout.map_or(0, millis),
            }
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `f`'s output, or `None` if `deadline` passes first (no deadline: wait for `f`).
async fn until<F: std::future::Future>(deadline: Option<Instant>, f: F) -> Option<F::Output> {
    match deadline {
        Some(d) => tokio::time::timeout_at(d, f).await.ok(),
        None => Some(f.await),
    }
}
