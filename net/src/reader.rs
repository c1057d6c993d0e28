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
//! - **One allocation per frame.** A frame is read into a buffer it shares with no other
//!   frame: its header first (into a small array the reader keeps), then its body straight
//!   from the socket into a buffer sized to the announced length, so the slices of its
//!   payloads that a server keeps (the broker chains a producer's message into its event,
//!   uncopied) hold that frame's bytes and nothing else. Each read of a body also asks for
//!   the next frame's header, so a frame takes one read when it is all there. Kafka's
//!   broker reads requests the same way (`NetworkReceive`: size first, then a buffer of
//!   that size).
//! - **Large buffers are reused.** A frame body of at least
//!   [`crate::MMAP_THRESHOLD_BYTES`] goes back to the process's [`FramePool`] once the last
//!   slice of it is dropped, and a later large frame whose whole body fits it is read into
//!   it, on pages already mapped (a fresh mapping costs a page fault and a zeroed page per
//!   4 KiB).
//! - **No allocation from a length prefix.** The room of one read is at most
//!   [`READ_ROOM_BYTES_MAX`]; a frame's buffer starts at the announced body, at most
//!   [`FRAME_BUFFER_FIRST_BYTES_MAX`] (a block that big is mapped on its own, see
//!   [`crate::return_large_buffers_to_the_os`], and its pages are not touched until bytes
//!   arrive), and grows by at most doubling what it holds, by `mremap` rather than a copy.
//!   A header that announces 16 MiB and is followed by nothing costs its 32 bytes of budget
//!   and of resident memory, and 256 KiB of address space (a break-it trial: 1,000 such
//!   connections at a 1 MiB start added ~1 GB of virtual size, which a process under an
//!   address-space limit or strict overcommit cannot afford).
//! - **Budget.** Bytes in the buffer hold budget permits; a decoded frame's permits go
//!   back. Room is taken only once the socket is readable, so an idle connection holds
//!   none.
//! - **Partial-frame clock.** From the read that brings a frame's first byte, the reader
//!   may spend at most the partial-frame timeout waiting (for the peer's bytes, or for
//!   budget) before the frame is whole. Time the server spends elsewhere — not calling
//!   [`FrameReader::next`] because its own request bounds hold the connection back — does
//!   not count against the peer. Counting budget waits is what keeps a budget used up by
//!   partial frames from stalling the server for good: their owners time out. A reader
//!   that holds at most a small share of the budget ([`ReadBudget::with_fair_share`])
//!   waits for it without its clock running: a small frame behind large ones is not
//!   timed out for their sake.
//! - **Idle clock.** A call that starts with an empty buffer waits at most the idle
//!   timeout for a first byte.
//!
//! `next` is cancel-safe: every byte read and every permit held lives in the reader, so
//! a server may `select!` it against its own shutdown signal.

use std::io;
use std::time::Duration;

use bytes::{BufMut, Bytes};
use quire_proto::{
    check_older_version, decode_frame_body, ErrorCode, ErrorResponse, Frame, FrameHeader,
    RequestId, WireError, HEADER_BYTES,
};
use quire_tls::ReadHalf;
use tokio::time::Instant;

use crate::budget::{Charge, ReadBudget};
use crate::pool::FramePool;
use crate::settings::ReadSettings;

/// Smallest room a read waits for in the budget, in bytes (less when the frame needs less):
/// a nearly used-up budget still lets readers make progress in small steps.
pub const READ_ROOM_BYTES_MIN: usize = 4 * 1024;
/// Largest room of one read, in bytes: the most memory one read can add.
pub const READ_ROOM_BYTES_MAX: usize = 1024 * 1024;
/// The most a frame's buffer starts with, in bytes, whatever its header announces: glibc's
/// mmap threshold as the servers pin it ([`crate::MMAP_THRESHOLD_BYTES`]), so a buffer
/// that must grow past it is a mapping of its own, grown by `mremap` without a copy.
pub const FRAME_BUFFER_FIRST_BYTES_MAX: usize = crate::MMAP_THRESHOLD_BYTES;

const _: () = assert!(READ_ROOM_BYTES_MIN <= READ_ROOM_BYTES_MAX);
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
        WireError::ReservedNotZero { .. } => "reserved_not_zero",
        _ => "malformed",
    }
}

/// Reads the frames of one connection; see the module docs for the bounds it keeps.
#[derive(Debug)]
pub struct FrameReader {
    socket: ReadHalf,
    /// The next frame's header while it arrives: `head_len` bytes of it.
    head: [u8; HEADER_BYTES],
    head_len: usize,
    /// The frame being received, once its header is whole and sound.
    header: Option<FrameHeader>,
    /// That frame's body so far, in an allocation of its own; past the body's end, the
    /// bytes of the next header that came with it (at most `HEADER_BYTES`).
    body: Vec<u8>,
    /// Budget held for the bytes received and not handed out (always
    /// [`FrameReader::buffered_bytes`] between calls).
    held: Charge,
    budget: ReadBudget,
    partial_frame_timeout: Duration,
    idle_timeout: Option<Duration>,
    /// Time spent waiting inside `next` since the current partial frame's first byte.
    frame_waited: Duration,
    /// Budget waits of the current `fill` that did not count against the partial-frame
    /// clock (see [`ReadBudget::with_fair_share`]).
    budget_waited_shielded: Duration,
}

impl FrameReader {
    /// A reader of `socket` under `budget` and the timeouts of `settings` (taken as
    /// they are: check them with [`ReadSettings::validate`] first).
    #[must_use]
    pub fn new(socket: ReadHalf, budget: ReadBudget, settings: &ReadSettings) -> FrameReader {
        FrameReader {
            socket,
            head: [0; HEADER_BYTES],
            head_len: 0,
            header: None,
            body: Vec::new(),
            held: budget.empty_charge(),
            budget,
            partial_frame_timeout: settings.partial_frame_timeout(),
            idle_timeout: settings.idle_timeout(),
            frame_waited: Duration::ZERO,
            budget_waited_shielded: Duration::ZERO,
        }
    }

    /// Bytes received and not yet handed out as frames.
    #[must_use]
    pub fn buffered_bytes(&self) -> usize {
        self.head_len + self.header.map_or(0, |_| HEADER_BYTES) + self.body.len()
    }

    /// The next frame.
    ///
    /// # Errors
    /// [`ReadError`]: only after a [recoverable](ReadError::is_recoverable) one may `next`
    /// be called again.
    pub async fn next(&mut self) -> Result<Received, ReadError> {
        loop {
            let taken = self.take_frame();
            debug_assert_eq!(self.held.bytes(), self.buffered_bytes());
            if let Some(received) = taken? {
                return Ok(received);
            }
            self.fill().await?;
        }
    }

    /// Moves a whole header on to the frame's own buffer, and hands out the frame once its
    /// body is whole.
    fn take_frame(&mut self) -> Result<Option<Received>, ReadError> {
        let header = match self.header {
            Some(header) => header,
            None if self.head_len < HEADER_BYTES => {
                // An old peer's whole header may be shorter than ours: say so now, not
                // after the partial-frame timeout.
                check_older_version(&self.head[..self.head_len])?;
                return Ok(None);
            }
            None => {
                // An unsound header leaves the stream out of sync: the caller ends the
                // connection, and the reader with it.
                let header = FrameHeader::decode(&self.head)?;
                self.head_len = 0;
                self.header = Some(header);
                let whole = header.body_bytes() + HEADER_BYTES;
                let first = header.body_bytes().min(FRAME_BUFFER_FIRST_BYTES_MAX);
                if whole >= crate::MMAP_THRESHOLD_BYTES {
                    // A large frame: a buffer an earlier one gave back, if one fits it
                    // whole (its pages are mapped already); else a fresh one, as below.
                    self.body = FramePool::global()
                        .take(whole)
                        .unwrap_or_else(|| Vec::with_capacity(first + HEADER_BYTES));
                } else if first > 0 {
                    self.body = Vec::with_capacity(first + HEADER_BYTES);
                }
                header
            }
        };
        let body_bytes = header.body_bytes();
        if self.body.len() < body_bytes {
            return Ok(None);
        }
        // The next header's first bytes came with the end of this body.
        let ahead = self.body.len() - body_bytes;
        self.head[..ahead].copy_from_slice(&self.body[body_bytes..]);
        self.head_len = ahead;
        self.body.truncate(body_bytes);
        let body = std::mem::take(&mut self.body);
        let body = if (crate::MMAP_THRESHOLD_BYTES..=crate::POOLED_BUFFER_BYTES_MAX)
            .contains(&body.capacity())
        {
            // Back to the pool once the last slice of the frame is dropped.
            FramePool::global().freeze(body)
        } else {
            Bytes::from(body)
        };
        self.header = None;
        let frame_bytes = header.frame_bytes as usize;
        // The frame (good or bad) left the reader: its budget goes back, and the next
        // frame's clock starts now.
        self.held.release(frame_bytes);
        self.frame_waited = Duration::ZERO;
        let frame = decode_frame_body(&header, body)?;
        Ok(Some(Received { frame, frame_bytes }))
    }

    /// Reads once, under the deadline that applies.
    async fn fill(&mut self) -> Result<(), ReadError> {
        let partial = self.buffered_bytes() > 0;
        let started = Instant::now();
        let deadline = if partial {
            Some(started + self.partial_frame_timeout.saturating_sub(self.frame_waited))
        } else {
            self.idle_timeout.map(|d| started + d)
        };
        self.budget_waited_shielded = Duration::ZERO;
        let result = self.fill_until(partial, deadline).await;
        if partial {
            self.frame_waited += started
                .elapsed()
                .saturating_sub(self.budget_waited_shielded);
        }
        result
    }

    async fn fill_until(
        &mut self,
        partial: bool,
        mut deadline: Option<Instant>,
    ) -> Result<(), ReadError> {
        loop {
            if until(deadline, self.socket.readable()).await.is_none() {
                return Err(self.timeout_error(partial));
            }
            let readable_at = Instant::now();
            let room = self.room();
            // Take what is free, and at least READ_ROOM_BYTES_MIN of it (waiting for it).
            let want = room.min(self.budget.available_bytes().max(READ_ROOM_BYTES_MIN));
            // A partial frame's clock runs while it waits for budget, unless it holds no
            // more than a small share of it (`ReadBudget::with_fair_share`); a connection
            // with nothing buffered holds no budget and may wait without bound.
            let shielded = self.held.bytes() <= self.budget.small_holder_bytes();
            let wait_deadline = if partial && !shielded { deadline } else { None };
            let wait_started = Instant::now();
            let Some(mut room_charge) = until(wait_deadline, self.budget.acquire(want)).await
            else {
                return Err(self.timeout_error(partial));
            };
            if partial && shielded {
                let waited = wait_started.elapsed();
                self.budget_waited_shielded += waited;
                deadline = deadline.map(|d| d + waited);
            }
            let want = room_charge.bytes();
            let read = if let Some(header) = self.header {
                self.reserve(want, header.body_bytes());
                self.socket.try_read_buf(&mut (&mut self.body).limit(want))
            } else {
                let to = (self.head_len + want).min(HEADER_BYTES);
                let read = self.socket.try_read(&mut self.head[self.head_len..to]);
                if let Ok(n) = read {
                    self.head_len += n;
                }
                read
            };
            match read {
                Ok(0) => {
                    return Err(match self.buffered_bytes() {
                        0 => ReadError::Closed,
                        buffered => ReadError::ClosedMidFrame { buffered },
                    })
                }
                Ok(n) => {
                    self.held.take_from(&mut room_charge, n);
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

    /// How many bytes the next read may bring: the rest of the header, or the rest of the
    /// body and the next header, at most READ_ROOM_BYTES_MAX.
    fn room(&self) -> usize {
        match self.header {
            None => HEADER_BYTES - self.head_len,
            Some(header) => {
                (header.body_bytes() + HEADER_BYTES - self.body.len()).min(READ_ROOM_BYTES_MAX)
            }
        }
    }

    /// Makes room in the body's buffer for `want` more bytes, growing it by at most
    /// doubling what it holds and never past the body's end and the next header. The
    /// buffer is the frame's own, so the allocator grows it in place or by remapping
    /// (blocks of at least [`crate::MMAP_THRESHOLD_BYTES`]) instead of copying it.
    fn reserve(&mut self, want: usize, body_bytes: usize) {
        let len = self.body.len();
        if self.body.capacity() - len < want {
            let end = body_bytes + HEADER_BYTES;
            self.body.reserve_exact(want.max(len).min(end - len));
        }
    }

    fn timeout_error(&self, partial: bool) -> ReadError {
        if partial {
            ReadError::PartialFrameTimeout {
                buffered: self.buffered_bytes(),
                frame_bytes: self.header.map(|h| h.frame_bytes as usize),
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
