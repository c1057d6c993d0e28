//! One client connection: a reader that decodes frames and hands requests on, and a writer
//! that sends responses, both on the connection's own task.
//!
//! - **Reader.** quire-net's [`FrameReader`] decodes frames from the socket: its buffer
//!   grows as bytes arrive (never to a length a header merely announces), under the
//!   node-wide read budget (`limits.read_buffer_bytes_max`: readers pause when it is used
//!   up), a partial-frame timeout and an idle timeout (`limits.partial_frame_timeout`,
//!   `limits.idle_timeout`; the connection gets an `ErrorResponse` `ConnectionTimeout`
//!   with request id 0 and is closed, counted in `quire_connections_timed_out_total`).
//!   Appends, fences, heartbeats and tail requests go to the
//!   store actor ([`crate::store`]) in arrival order; reads and range digests (read-only,
//!   for `quire cluster audit`) are served on the blocking pool (`pread` through the WAL's
//!   reader). A frame that fails to decode after a sound header
//!   is answered with an `ErrorResponse` for its request id and the reader goes on; a bad
//!   header (the stream is out of sync) ends the connection after an `ErrorResponse` with
//!   request id 0, and a peer that closes mid-frame ends it. Each is logged and counted in
//!   `quire_rejected_frames_total{reason}`.
//! - **Place.** The connection holds a place in the node's connection bound
//!   (`limits.connections_max`, quire-net's [`quire_net::ConnectionLimit`]) until it ends.
//!   A place taken from the peer reserve (the pool was full) must open with a cluster
//!   frame (append, fence, read, tail, heartbeat) within quire-net's
//!   `PEER_FIRST_FRAME_TIMEOUT`, or the connection gets an `ErrorResponse` `Overloaded`
//!   (request id 0) and is closed.
//! - **Backpressure.** Every request holds an [`InFlight`] permit — its frame bytes (or a
//!   read's response bound: a whole frame, as one event may be that large) against `in_flight_bytes_per_connection_max`, and one of
//!   `in_flight_requests_per_connection_max` — from before it is served until its
//!   response's last byte is written to the socket: the permit travels with the response
//!   into the writer's queue as a quire-net [`OutFrame`], fitted to the response's encoded
//!   length. While none is free the reader stops reading the socket, so a peer that sends
//!   requests and never reads the answers has at most that many bytes of requests and
//!   responses held for it (`quire_response_bytes_queued` counts the queued responses of
//!   all connections), and nothing buffers without limit.
//! - **Writer.** Responses go through a bounded queue (`write_queue_frames_max`) to the
//!   writer, which gathers them into vectored writes (quire-net's [`write_frames`]).
//!   Whoever answers (the store actor, a read task) only ever `try_send`s: a full queue
//!   means the peer is not reading, and the connection is closed rather than the store
//!   stalled. A write that makes no progress for [`quire_net::WRITE_STALL_TIMEOUT`] closes the
//!   connection too, and every permit its queued responses held goes back.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use prometheus_client::metrics::counter::Counter;
use quire_net::{
    write_frames_within, BytesHeld, ConnBytes, ConnectionPermit, FrameReader, OutFrame, ReadBudget,
    ReadError, IOV_MAX, WRITE_STALL_TIMEOUT,
};
use quire_proto::{
    encode_body, Body, EntryId, ErrorCode, ErrorResponse, Flags, LogId, Offset, RangeDigest,
    RangeDigestRequest, RangeDigestResponse, ReadRequest, ReadResponse, RequestId,
    EVENT_OVERHEAD_BYTES, EVENT_PAYLOAD_BYTES_MAX, FRAME_BYTES_MAX, HEADER_BYTES,
};
use quire_tls::{ReadHalf, Stream, WriteHalf};
use quire_wal::{Wal, WalError};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, watch, OwnedSemaphorePermit, Semaphore};

use crate::config::Limits;
use crate::metrics::Metrics;
use crate::store::{Command, StoreHandle};

/// Bytes of a read response besides its events: first_offset, last, start, count.
const READ_RESPONSE_FIXED_BYTES: usize = 8 + 17 + 8 + 4;

/// What a connection needs from the node.
#[derive(Clone, Debug)]
pub(crate) struct ConnContext {
    pub store: StoreHandle,
    pub wal: Wal,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    /// The node-wide budget of bytes buffered for incoming frames.
    pub read_budget: ReadBudget,
    /// The node-wide budget of read responses served and not yet written
    /// (`limits.read_responses_bytes_max`).
    pub read_responses: ConnBytes,
}

/// The permits one request holds until its response is written to the socket.
#[derive(Debug)]
pub(crate) struct InFlight {
    bytes: BytesHeld,
    request: OwnedSemaphorePermit,
    /// A read's share of the node-wide read-response budget.
    shared: Option<BytesHeld>,
}

/// Sends responses to one connection's writer without ever waiting.
#[derive(Clone, Debug)]
pub(crate) struct Responder {
    tx: mpsc::Sender<OutFrame>,
    close: Arc<watch::Sender<bool>>,
    metrics: Arc<Metrics>,
    peer: SocketAddr,
}

impl Responder {
    /// Queues `body` as the response to `request_id` about `log`, holding `in_flight`
    /// (fitted to the response's length) until it is written. If the queue is full (the
    /// peer does not read), closes the connection instead.
    pub(crate) fn send(
        &self,
        log: LogId,
        request_id: RequestId,
        body: Body,
        in_flight: Option<InFlight>,
    ) {
        let mut scratch = BytesMut::new();
        let encoded = match encode_body(&body, &mut scratch) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(peer = %self.peer, error = %e, frame_type = ?body.frame_type(), "cannot encode a response");
                let fallback: Body = ErrorResponse::new(
                    ErrorCode::Internal,
                    format!("cannot encode the response: {e}"),
                )
                .into();
                match encode_body(&fallback, &mut scratch) {
                    Ok(e) => e,
                    Err(_) => return,
                }
            }
        };
        let mut parts = Vec::with_capacity(1 + encoded.chunks().len());
        parts.push(Bytes::copy_from_slice(&encoded.header(
            log,
            request_id,
            Flags::NONE,
        )));
        parts.extend(encoded.chunks().iter().cloned());
        let mut frame = OutFrame::new(parts, &self.metrics.responses);
        if let Some(InFlight {
            bytes,
            request,
            shared,
        }) = in_flight
        {
            frame = frame.holding(bytes).holding_permit(request);
            if let Some(shared) = shared {
                frame = frame.holding_shared(shared);
            }
        }
        match self.tx.try_send(frame) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                tracing::warn!(peer = %self.peer, "the peer does not read its responses: closing the connection");
                self.metrics.connections_dropped_slow.inc();
                self.close.send_replace(true);
            }
            Err(TrySendError::Closed(_)) => {}
        }
    }
}

/// Where one request's response goes; holds the request's in-flight permits, and hands
/// them to the writer with the response.
#[derive(Debug)]
pub(crate) struct Reply {
    log: LogId,
    request_id: RequestId,
    to: Responder,
    in_flight: Option<InFlight>,
}

impl Reply {
    /// Queues the response; the request's permits go back once it is written.
    pub(crate) fn send(self, body: impl Into<Body>) {
        self.to
            .send(self.log, self.request_id, body.into(), self.in_flight);
    }

    /// The peer's address.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.to.peer
    }
}

/// Serves one accepted connection until it closes; `permit` holds its place in the
/// connection bound (a reserve place must open with a cluster frame, see quire-net's
/// [`ConnectionPermit`]).
pub(crate) async fn serve(
    stream: Stream,
    auth: quire_tls::PeerAuth,
    peer: SocketAddr,
    permit: ConnectionPermit,
    ctx: ConnContext,
) {
    let (read_half, write_half) = stream.into_split();
    let (tx, rx) = mpsc::channel(ctx.limits.write_queue_frames_max);
    let (close, closed) = watch::channel(false);
    let responder = Responder {
        tx,
        close: Arc::new(close),
        metrics: ctx.metrics.clone(),
        peer,
    };
    let close = responder.close.clone();
    let dropped_slow = ctx.metrics.connections_dropped_slow.clone();
    let reader = Reader {
        bytes: ConnBytes::new(ctx.limits.in_flight_bytes_per_connection_max),
        requests: Arc::new(Semaphore::new(
            ctx.limits.in_flight_requests_per_connection_max,
        )),
        responder,
        closed: closed.clone(),
        ctx,
        peer,
        permit,
        auth,
    };
    tokio::join!(
        reader.run(read_half),
        write_loop(
            write_half,
            rx,
            close,
            closed,
            peer,
            WRITE_STALL_TIMEOUT,
            dropped_slow
        )
    );
}

struct Reader {
    ctx: ConnContext,
    responder: Responder,
    bytes: ConnBytes,
    requests: Arc<Semaphore>,
    closed: watch::Receiver<bool>,
    peer: SocketAddr,
    permit: ConnectionPermit,
    /// What the peer's certificate allows.
    auth: quire_tls::PeerAuth,
}

impl Reader {
    async fn run(mut self, socket: ReadHalf) {
        if let Err(e) = self.permit.admit_peer(&self.auth, self.peer) {
            self.responder
                .send(LogId::ZERO, RequestId::CONNECTION, e.into(), None);
            return;
        }
        let mut reader = FrameReader::new(
            socket,
            self.ctx.read_budget.clone(),
            &self.ctx.limits.read_settings(),
        );
        loop {
            let next = tokio::select! {
                biased;
                _ = self.closed.wait_for(|c| *c) => return,
                next = reader.next() => next,
                () = self.permit.first_frame_overdue() => {
                    let e = self.permit.first_frame_timed_out(self.peer);
                    self.responder
                            .send(LogId::ZERO, RequestId::CONNECTION, e.into(), None);
                    return;
                }
            };
            match next {
                Ok(received) => {
                    if let Err(e) = self
                        .permit
                        .check_frame(received.frame.frame_type(), self.peer)
                    {
                        self.responder
                            .send(LogId::ZERO, RequestId::CONNECTION, e.into(), None);
                        return;
                    }
                    let Some(in_flight) = self.acquire(received.frame_bytes).await else {
                        return;
                    };
                    let frame = received.frame;
                    if let Err(refusal) = quire_net::authorize(&self.auth, frame.frame_type()) {
                        // A fence or an append from a peer whose certificate is not a
                        // broker's: answered, counted, and nothing of it done.
                        self.ctx.metrics.reject_frame("unauthorized");
                        quire_net::log_unauthorized(
                            &self.peer.to_string(),
                            frame.frame_type(),
                            &refusal.message,
                        );
                        self.reply(frame.log, frame.request_id, in_flight)
                            .send(refusal);
                        continue;
                    }
                    if frame.log != LogId::ZERO {
                        // One log per store until partitions land (docs/partitions.md).
                        self.ctx.metrics.reject_frame("unknown_log");
                        self.reply(frame.log, frame.request_id, in_flight)
                            .send(ErrorResponse::unknown_log(frame.log));
                        continue;
                    }
                    self.dispatch(frame.request_id, frame.body, in_flight).await;
                }
                Err(e) => {
                    self.note_read_error(&e);
                    if let Some((request_id, answer)) = e.answer() {
                        self.responder
                            .send(LogId::ZERO, request_id, answer.into(), None);
                    }
                    if !e.is_recoverable() {
                        return;
                    }
                }
            }
        }
    }

    /// Logs and counts why the reader gave no frame.
    fn note_read_error(&self, e: &ReadError) {
        let reason = e.reason();
        let metrics = &self.ctx.metrics;
        match e {
            ReadError::Closed => {}
            ReadError::Io(_) => tracing::debug!(peer = %self.peer, error = %e, "read failed"),
            // What a peer sends wrong is counted (`quire_rejected_frames_total`,
            // `quire_connections_timed_out_total`) and logged at debug, as the broker does:
            // a warning per connection let one attacker write a log line per connection.
            ReadError::PartialFrameTimeout { .. } | ReadError::IdleTimeout { .. } => {
                tracing::info!(peer = %self.peer, error = %e, reason, "closing the connection");
                metrics.time_out_connection(reason);
            }
            ReadError::ClosedMidFrame { .. } => {
                tracing::debug!(peer = %self.peer, error = %e, "the peer closed the connection in the middle of a frame");
                metrics.reject_frame(reason);
            }
            ReadError::Wire(w) if w.is_connection_fatal() => {
                tracing::debug!(peer = %self.peer, error = %e, reason, "bad frame header: closing the connection");
                metrics.reject_frame(reason);
            }
            ReadError::Wire(_) => {
                tracing::debug!(peer = %self.peer, error = %e, reason, "bad frame");
                metrics.reject_frame(reason);
            }
        }
    }

    /// Waits for the in-flight permits of a request of `cost` bytes (the reader does not
    /// read meanwhile). `None` if the connection closed while waiting.
    async fn acquire(&mut self, cost: usize) -> Option<InFlight> {
        let permits = async {
            let bytes = self.bytes.acquire(cost).await;
            let request = self.requests.clone().acquire_owned().await.ok()?;
            Some(InFlight {
                bytes,
                request,
                shared: None,
            })
        };
        tokio::select! {
            biased;
            p = permits => p,
            _ = self.closed.wait_for(|c| *c) => None,
        }
    }

    fn reply(&self, log: LogId, request_id: RequestId, in_flight: InFlight) -> Reply {
        Reply {
            log,
            request_id,
            to: self.responder.clone(),
            in_flight: Some(in_flight),
        }
    }

    async fn dispatch(&mut self, request_id: RequestId, body: Body, in_flight: InFlight) {
        let metrics = &self.ctx.metrics;
        let command = match body {
            Body::AppendRequest(r) => {
                metrics.request("append");
                Command::Append(r, self.reply(LogId::ZERO, request_id, in_flight))
            }
            Body::FenceRequest(r) => {
                metrics.request("fence");
                Command::Fence(r, self.reply(LogId::ZERO, request_id, in_flight))
            }
            Body::Heartbeat(h) => {
                metrics.request("heartbeat");
                Command::Heartbeat(h, self.reply(LogId::ZERO, request_id, in_flight))
            }
            Body::TailRequest(_) => {
                metrics.request("tail");
                Command::Tail(self.reply(LogId::ZERO, request_id, in_flight))
            }
            Body::ReadRequest(r) => {
                metrics.request("read");
                // A read's response may be far larger than its request: hold its bound
                // instead (the frame's permits are swapped for the bigger ones).
                drop(in_flight);
                let cost = read_response_bytes_max(&r, &self.ctx.limits);
                let Some(mut in_flight) = self.acquire(cost).await else {
                    return;
                };
                // And the node-wide bound, so that many peers that never read their
                // answers hold no more than it together (a per-connection bound alone let
                // 16 such peers hold 869 MiB of a store).
                let shared = self.ctx.read_responses.clone();
                if shared.available_bytes() < cost.min(shared.bytes_max()) {
                    self.ctx.metrics.read_response_budget_waits.inc();
                }
                tokio::select! {
                    biased;
                    held = shared.acquire(cost) => in_flight.shared = Some(held),
                    _ = self.closed.wait_for(|c| *c) => return,
                }
                let reply = self.reply(LogId::ZERO, request_id, in_flight);
                let wal = self.ctx.wal.clone();
                let limits = self.ctx.limits.clone();
                tokio::spawn(async move {
                    let peer = reply.peer();
                    let body =
                        match tokio::task::spawn_blocking(move || serve_read(&wal, &r, &limits))
                            .await
                        {
                            Ok(body) => body,
                            Err(e) => {
                                tracing::error!(%peer, error = %e, "read task failed");
                                ErrorResponse::new(ErrorCode::Internal, "the read failed").into()
                            }
                        };
                    reply.send(body);
                });
                return;
            }
            Body::RepairRequest(r) => {
                metrics.request("repair");
                // The response is small (a fixed size): the request's permits cover it.
                let reply = self.reply(LogId::ZERO, request_id, in_flight);
                let wal = self.ctx.wal.clone();
                let node_metrics = self.ctx.metrics.clone();
                tokio::spawn(async move {
                    let peer = reply.peer();
                    let body =
                        match tokio::task::spawn_blocking(move || serve_repair(&wal, &r.event))
                            .await
                        {
                            Ok(body) => body,
                            Err(e) => {
                                tracing::error!(%peer, error = %e, "repair task failed");
                                ErrorResponse::new(ErrorCode::Internal, "the repair failed").into()
                            }
                        };
                    node_metrics.repair(match &body {
                        Body::RepairResponse(r) => repair_outcome_label(r.outcome),
                        _ => "error",
                    });
                    reply.send(body);
                });
                return;
            }
            Body::RangeDigestRequest(r) => {
                metrics.request("range_digest");
                // The response is small (a fixed size): the request's permits cover it.
                let reply = self.reply(LogId::ZERO, request_id, in_flight);
                let wal = self.ctx.wal.clone();
                let limits = self.ctx.limits.clone();
                tokio::spawn(async move {
                    let peer = reply.peer();
                    let body = match tokio::task::spawn_blocking(move || {
                        serve_range_digest(&wal, &r, &limits)
                    })
                    .await
                    {
                        Ok(body) => body,
                        Err(e) => {
                            tracing::error!(%peer, error = %e, "range digest task failed");
                            ErrorResponse::new(ErrorCode::Internal, "the range digest failed")
                                .into()
                        }
                    };
                    reply.send(body);
                });
                return;
            }
            other => {
                let frame_type = other.frame_type();
                tracing::warn!(peer = %self.peer, ?frame_type, "a frame the store does not serve");
                metrics.reject_frame("unexpected_frame");
                self.reply(LogId::ZERO, request_id, in_flight)
                    .send(ErrorResponse::new(
                        ErrorCode::UnexpectedFrame,
                        format!("a store does not serve {frame_type:?}"),
                    ));
                return;
            }
        };
        if let Err(command) = self.ctx.store.send(command).await {
            command.into_reply().send(ErrorResponse::new(
                ErrorCode::ShuttingDown,
                "the store is shutting down",
            ));
        }
    }
}

/// The most bytes a response to `req` takes on the wire (header included): its payload,
/// each event's overhead and the fixed fields, never more than a frame (`serve_read` builds
/// none larger). A read returns at least one event whatever its byte bound, and one event
/// may carry up to `EVENT_PAYLOAD_BYTES_MAX`, so any read that may return an event is
/// bounded by a whole frame; its charge shrinks to the response's real length once encoded.
fn read_response_bytes_max(req: &ReadRequest, limits: &Limits) -> usize {
    let max_events = (req.max_events as usize).min(limits.read_events_max);
    if max_events == 0 {
        return HEADER_BYTES + READ_RESPONSE_FIXED_BYTES;
    }
    let max_bytes = (req.max_bytes as usize)
        .min(limits.read_bytes_max)
        .max(EVENT_PAYLOAD_BYTES_MAX);
    (HEADER_BYTES + READ_RESPONSE_FIXED_BYTES)
        .saturating_add(max_bytes)
        .saturating_add(max_events.saturating_mul(EVENT_OVERHEAD_BYTES))
        .min(FRAME_BYTES_MAX)
}

/// Serves a [`quire_proto::RepairRequest`]: rewrites the WAL's damaged copy of `good`'s
/// entry with it ([`Wal::repair_record`]; blocking: call on the blocking pool) and answers
/// what was done, with the lowest record still known damaged. A rewrite that does not read
/// back is answered `Corrupt`, a failed log `LogFailed`, an I/O error `Internal`.
pub fn serve_repair<S: quire_wal::Storage>(wal: &Wal<S>, good: &quire_proto::Event) -> Body {
    match wal.repair_record(good) {
        Ok(outcome) => {
            let next_corrupt = wal.corrupt_records().first().copied();
            if outcome == quire_proto::RepairOutcome::Repaired && next_corrupt.is_none() {
                tracing::info!(offset = %good.offset, "no damaged record is known any more: this store grants fences again");
            }
            quire_proto::RepairResponse {
                offset: good.offset,
                outcome,
                next_corrupt,
            }
            .into()
        }
        Err(WalError::Corruption {
            offset, problem, ..
        }) => {
            tracing::error!(%offset, %problem, "a repaired record does not read back: the disk is bad there");
            ErrorResponse::corrupt(offset, problem).into()
        }
        Err(e @ WalError::Failed { .. }) => {
            ErrorResponse::new(ErrorCode::LogFailed, e.to_string()).into()
        }
        Err(e) => {
            tracing::error!(error = %e, offset = %good.offset, "repair failed");
            ErrorResponse::new(ErrorCode::Internal, format!("repair failed: {e}")).into()
        }
    }
}

/// The `outcome` label of `quire_repairs_total` for `outcome`.
fn repair_outcome_label(outcome: quire_proto::RepairOutcome) -> &'static str {
    match outcome {
        quire_proto::RepairOutcome::Repaired => "repaired",
        quire_proto::RepairOutcome::AlreadyGood => "already_good",
        quire_proto::RepairOutcome::OtherEntry => "other_entry",
        quire_proto::RepairOutcome::NotHeld => "not_held",
    }
}

/// Serves a read from the WAL's durable records (blocking: call on the blocking pool).
/// A range that retention deleted is answered with no events and `first_offset` above
/// `from` (docs/protocol.md, "Read").
pub fn serve_read<S: quire_wal::Storage>(wal: &Wal<S>, req: &ReadRequest, limits: &Limits) -> Body {
    let mut first_offset = wal.first_offset();
    let max_events = (req.max_events as usize).min(limits.read_events_max);
    let max_bytes = (req.max_bytes as usize).min(limits.read_bytes_max);
    let records = if max_events == 0 {
        Vec::new()
    } else {
        match wal.read(req.from, max_events, max_bytes as u64) {
            Ok(r) => r,
            Err(WalError::OffsetOutOfRange { .. }) => Vec::new(),
            Err(WalError::Trimmed { first, .. }) => {
                // A trim may have run since `first_offset` was taken.
                first_offset = first_offset.max(first);
                Vec::new()
            }
            Err(WalError::Corruption {
                offset,
                problem,
                segment,
                position,
            }) => {
                tracing::error!(%offset, segment = %segment.display(), position = position.0, %problem, "a read found a damaged record: answered Corrupt; this store grants no fence until it is repaired");
                return ErrorResponse::corrupt(offset, problem).into();
            }
            Err(e) => {
                tracing::error!(error = %e, from = %req.from, "read failed");
                return ErrorResponse::new(ErrorCode::Internal, format!("read failed: {e}")).into();
            }
        }
    };
    let mut events = Vec::with_capacity(records.len());
    let mut frame_bytes = HEADER_BYTES + READ_RESPONSE_FIXED_BYTES;
    for event in records {
        frame_bytes += event.encoded_bytes();
        if frame_bytes > FRAME_BYTES_MAX && !events.is_empty() {
            break;
        }
        events.push(event);
    }
    ReadResponse {
        first_offset,
        last: wal.last_durable(),
        events,
    }
    .into()
}

/// Serves a range digest from the WAL's durable records (blocking: call on the blocking
/// pool): reads the entries the store holds in `req.from..=req.to` (at most
/// `RANGE_DIGEST_OFFSETS_MAX`, which the codec already checked), in reads of at most
/// `limits.read_events_max` events and `limits.read_bytes_max` payload bytes, and digests
/// each one's id with the CRC its record carries (recomputed from the fields the reader
/// checked against that CRC). Changes nothing. The range is clamped to the durable log as
/// it was when the digest started, so appends meanwhile do not extend it.
fn serve_range_digest(wal: &Wal, req: &RangeDigestRequest, limits: &Limits) -> Body {
    let mut first_offset = wal.first_offset();
    let last = wal.last_durable();
    let mut digest = RangeDigest::new();
    let end = match last {
        Some(l) => l.offset.min(req.to),
        None => return range_digest_response(first_offset, last, &digest),
    };
    let mut next = req.from.max(first_offset);
    let events_max = limits.read_events_max.max(1);
    let bytes_max = limits.read_bytes_max as u64;
    while next <= end {
        let want = usize::try_from(end.0 - next.0 + 1).unwrap_or(usize::MAX);
        let records = match wal.read(next, want.min(events_max), bytes_max) {
            Ok(r) => r,
            Err(WalError::Trimmed { first, .. }) if digest.count() == 0 => {
                // A trim ran since `first_offset` was taken: start at the new trim point.
                first_offset = first_offset.max(first);
                next = next.max(first);
                continue;
            }
            Err(WalError::OffsetOutOfRange { .. }) => break,
            Err(WalError::Corruption {
                offset, problem, ..
            }) => {
                tracing::error!(%offset, %problem, "a range digest found a damaged record");
                return ErrorResponse::corrupt(offset, problem).into();
            }
            Err(e) => {
                tracing::error!(error = %e, from = %req.from, to = %req.to, "range digest failed");
                return ErrorResponse::new(
                    ErrorCode::Internal,
                    format!("range digest failed: {e}"),
                )
                .into();
            }
        };
        if records.is_empty() {
            break;
        }
        for r in records {
            if r.offset > end {
                break;
            }
            digest.push(EntryId {
                epoch: r.epoch,
                offset: r.offset,
                crc: quire_wal::format::event_crc(&r),
            });
            next = r.offset.next();
        }
    }
    range_digest_response(first_offset, last, &digest)
}

fn range_digest_response(
    first_offset: Offset,
    last: Option<quire_proto::LogPosition>,
    digest: &RangeDigest,
) -> Body {
    RangeDigestResponse {
        first_offset,
        last,
        start: digest.first().map_or(Offset::ZERO, |e| e.offset),
        count: digest.count(),
        digest: digest.digest(),
        last_entry: digest.last(),
    }
    .into()
}

/// Writes the connection's responses until it closes. A peer that takes no bytes for
/// `stall` ([`WRITE_STALL_TIMEOUT`] outside tests) is logged, counted in `dropped_slow`
/// (`quire_connections_dropped_slow_total`) and disconnected.
async fn write_loop(
    mut socket: WriteHalf,
    mut rx: mpsc::Receiver<OutFrame>,
    close: Arc<watch::Sender<bool>>,
    mut closed: watch::Receiver<bool>,
    peer: SocketAddr,
    stall: Duration,
    dropped_slow: Counter,
) {
    let mut queue: VecDeque<OutFrame> = VecDeque::new();
    loop {
        let frame = tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => break,
            f = rx.recv() => match f {
                Some(f) => f,
                // Every sender is gone: the reader ended and every request is answered.
                None => break,
            },
        };
        queue.push_back(frame);
        while queue.len() < IOV_MAX {
            match rx.try_recv() {
                Ok(f) => queue.push_back(f),
                Err(_) => break,
            }
        }
        let written = tokio::select! {
            biased;
            _ = closed.wait_for(|c| *c) => break,
            r = write_frames_within(&mut socket, &mut queue, stall) => r,
        };
        if let Err(e) = written {
            if e.kind() == std::io::ErrorKind::TimedOut {
                let queued_bytes: usize = queue.iter().map(OutFrame::bytes_left).sum();
                tracing::warn!(%peer, stall_ms = stall.as_millis() as u64, queued_bytes, "the peer took no response bytes for too long: closing the connection");
                dropped_slow.inc();
            } else {
                tracing::debug!(%peer, error = %e, "write failed: closing the connection");
            }
            break;
        }
    }
    // Stop the reader too (it may be waiting for permits or bytes), refuse further
    // responses, and give back the permits of those never written.
    close.send_replace(true);
    rx.close();
    queue.clear();
    while rx.try_recv().is_ok() {}
    let _ = tokio::time::timeout(Duration::from_secs(1), socket.shutdown()).await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::{encode, Epoch, Event, EventKind, Frame, Offset};

    fn response(events: usize, payload_bytes: usize) -> usize {
        let events = (0..events)
            .map(|i| Event {
                epoch: Epoch(1),
                offset: Offset(i as u64),
                kind: EventKind::Message,
                payload: Bytes::from(vec![7u8; payload_bytes]).into(),
            })
            .collect();
        let body = ReadResponse {
            first_offset: Offset(0),
            last: Some(quire_proto::LogPosition {
                epoch: Epoch(1),
                offset: Offset(1),
            }),
            events,
        };
        let mut out = BytesMut::new();
        encode(&Frame::new(RequestId(1), body), &mut out).expect("encodes");
        out.len()
    }

    /// A range digest covers what the store holds of the range, clamped to its log, and
    /// its ids carry the CRCs the WAL records hold (the offline audit reads those from the
    /// scan: both must give the same digest).
    #[test]
    fn a_range_digest_covers_the_held_part_with_the_records_crcs() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut config = quire_wal::WalConfig::new(dir.path());
        config.segment_bytes_max = quire_wal::SEGMENT_BYTES_MIN;
        let (wal, _) = Wal::open(config).expect("opens");
        let records: Vec<Event> = (0..10u64)
            .map(|o| Event {
                epoch: Epoch(if o < 6 { 3 } else { 4 }),
                offset: Offset(o),
                kind: EventKind::Message,
                payload: Bytes::from(vec![o as u8; 100 + o as usize]).into(),
            })
            .collect();
        wal.append(Epoch(4), records).wait().expect("appends");
        let mut scanned = Vec::new();
        quire_wal::scan::scan_dir(dir.path(), &mut |r| {
            if let (Some(h), Some(crc)) = (r.header, r.content_crc()) {
                // The digest holds content checksums: without the segment's tag.
                scanned.push(EntryId {
                    epoch: h.epoch,
                    offset: h.offset,
                    crc,
                });
            }
        })
        .expect("scans");
        let limits = Limits::default();
        let ask = |from: u64, to: u64| match serve_range_digest(
            &wal,
            &RangeDigestRequest {
                from: Offset(from),
                to: Offset(to),
            },
            &limits,
        ) {
            Body::RangeDigestResponse(r) => r,
            other => panic!("not a digest: {other:?}"),
        };
        let r = ask(2, 20);
        let expected = RangeDigest::of(scanned[2..].iter().copied());
        assert_eq!((r.start, r.count), (Offset(2), 8));
        assert_eq!(r.digest, expected.digest());
        assert_eq!(r.last_entry, expected.last());
        assert_eq!(r.last.map(|l| l.offset), Some(Offset(9)));
        let one = ask(5, 5);
        assert_eq!(one.last_entry, Some(scanned[5]));
        let past = ask(10, 30);
        assert_eq!((past.count, past.digest, past.last_entry), (0, 0, None));
        wal.close().expect("closes");
    }

    /// A peer that sends requests and never reads the answers is disconnected once a write
    /// makes no progress for the stall bound, and that is counted (before, it went out with
    /// a debug line only: an operator saw connections vanish with no metric or warning).
    #[tokio::test]
    async fn a_peer_that_reads_nothing_is_dropped_and_counted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("has an address");
        let client = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let (server, peer) = listener.accept().await.expect("accepts");
        let (_read_half, write_half) = quire_tls::Stream::Plain(server).into_split();
        let (tx, rx) = mpsc::channel(64);
        let (close, closed) = watch::channel(false);
        let metrics = quire_net::ResponseMetrics::default();
        // Far more than the two sockets' buffers hold: the writer must stall.
        for _ in 0..64 {
            let frame = OutFrame::new(vec![Bytes::from(vec![0u8; 1 << 20])], &metrics);
            tx.try_send(frame).expect("the queue has room");
        }
        let dropped = Counter::default();
        let ended = tokio::time::timeout(
            Duration::from_secs(20),
            write_loop(
                write_half,
                rx,
                Arc::new(close),
                closed,
                peer,
                Duration::from_millis(200),
                dropped.clone(),
            ),
        )
        .await;
        assert!(ended.is_ok(), "the writer gave up on the stalled peer");
        assert_eq!(dropped.get(), 1, "the stalled peer is counted");
        drop(client);
    }

    /// A read holds its response's bound until the response is written, so the bound must
    /// cover what `serve_read` can produce within the request's limits.
    #[test]
    fn a_read_response_fits_its_bound() {
        let limits = Limits::default();
        let req = |max_events: u32, max_bytes: u32| ReadRequest {
            from: Offset(0),
            max_events,
            max_bytes,
        };
        // Many tiny events: the per-event overhead dominates.
        let r = req(4096, 4096);
        assert!(response(4096, 1) <= read_response_bytes_max(&r, &limits));
        // Payload up to the byte bound.
        let r = req(8, 8 * 1024);
        assert!(response(8, 1024) <= read_response_bytes_max(&r, &limits));
        // One event larger than the byte bound is still served (alone): the story of a
        // read asking for 1 byte over 1 MiB events, whose tiny charge let a peer that never
        // read pile up whole responses.
        let r = req(1, 1);
        assert!(response(1, EVENT_PAYLOAD_BYTES_MAX) <= read_response_bytes_max(&r, &limits));
        // The limits cap what the request asks, and a frame caps everything.
        let r = req(u32::MAX, u32::MAX);
        let bound = read_response_bytes_max(&r, &limits);
        assert_eq!(bound, FRAME_BYTES_MAX);
        assert_eq!(
            read_response_bytes_max(&req(0, 0), &limits),
            HEADER_BYTES + READ_RESPONSE_FIXED_BYTES
        );
        assert!(response(0, 0) <= HEADER_BYTES + READ_RESPONSE_FIXED_BYTES);
    }
}
