//! Inbound connections: clients (producers, consumers, tools) and masters streaming appends
//! to this broker when it is a slave. One reader task decodes frames and hands each request
//! to the broker's actor, in order; one writer task sends the answers, gathering queued
//! frames into vectored writes.
//!
//! Bounds: at most [`CONN_REQUESTS_MAX`] requests of one connection wait for an answer (the
//! reader stops reading beyond it), and every produce holds permits of the broker-wide
//! produce byte budget until it is answered — when the master's in-flight bound is
//! reached, the actor stops taking produces, their permits are not returned, and readers
//! stop reading producer sockets instead of buffering without limit. Every fetch holds
//! [`CONN_RESPONSE_BYTES_MAX`] permits of its connection — its answer's bound (its byte
//! bound, at least the largest message applied so far, plus per-message overhead), fitted to
//! the answer's encoded length once it is known — from before it reaches the actor until
//! the answer's last byte is written to the socket (the permits travel with the answer into
//! the writer's queue as a quire-net [`OutFrame`]). So a consumer that sends fetches and
//! never reads the answers stops being read once that many bytes of answers wait for it,
//! rather than having answers queued for it without limit (`quire_response_bytes_queued`
//! counts the queued answers of all connections). A peer that does not read its answers is
//! disconnected when its writer queue of [`WRITE_QUEUE_FRAMES_MAX`] fills, or when one write
//! makes no progress for quire-net's [`WRITE_STALL_TIMEOUT`]; both are logged at warn and counted
//! in `quire_connections_dropped_slow_total`.
//!
//! Reading goes through quire-net's [`FrameReader`]: bytes buffered for incoming frames
//! count against the broker-wide read budget (`read_buffer_bytes_max`; readers pause
//! when it is used up), a frame's buffer grows as its bytes arrive, a frame must be whole
//! within `partial_frame_timeout` of its first byte, and a connection that sends
//! nothing for `idle_timeout` is closed — both with an `ErrorResponse`
//! `ConnectionTimeout` (request id 0), counted in `quire_connections_timed_out_total`.
//!
//! Connection bound: each connection holds a place in the broker's bound
//! (`connections_max`, quire-net's [`quire_net::ConnectionLimit`]) until it ends; one
//! taken from the peer reserve (the pool was full) must open with a cluster frame (a
//! master's heartbeat or append, a takeover request) within quire-net's
//! `PEER_FIRST_FRAME_TIMEOUT`, or it gets an `ErrorResponse` `Overloaded` (request id 0)
//! and is closed.
//!
//! Bad input: a frame that fails to decode after a sound header is answered with an
//! `ErrorResponse` for its request id and the connection reads on; a bad header (the
//! stream is out of sync) gets an `ErrorResponse` with request id 0 and the connection is
//! closed. Each is counted in `quire_rejected_frames_total{reason}`. None affects any
//! other connection.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use quire_net::{
    write_frames_within, BytesHeld, ConnBytes, ConnectionPermit, FrameReader, OutFrame, ReadBudget,
    ReadError, ReadSettings, IOV_MAX, WRITE_STALL_TIMEOUT,
};
use quire_proto::{
    encode_body, AuthenticateRequest, AuthenticateResponse, Body, ErrorCode, ErrorResponse,
    FetchRequest, Flags, FrameType, LogId, RequestId, FRAME_BYTES_MAX, HEADER_BYTES,
    MESSAGES_PER_FRAME_MAX,
};
use quire_tls::scram::ScramServer;
use quire_tls::Stream;
use tokio::sync::{mpsc, Notify, OwnedSemaphorePermit, Semaphore};

use crate::metrics::Metrics;
use crate::security::Principal;

/// Most requests of one connection waiting for an answer.
pub const CONN_REQUESTS_MAX: usize = 4096;
/// Most answer frames queued for one connection's writer.
pub const WRITE_QUEUE_FRAMES_MAX: usize = CONN_REQUESTS_MAX + 64;
/// Bytes of fetch answers one connection may have in the making or queued and not yet
/// written (each fetch holds its answer's bound until then; the reader stops reading
/// beyond it). Four maximal frames.
pub const CONN_RESPONSE_BYTES_MAX: usize = 4 * FRAME_BYTES_MAX;
/// Bytes of a fetch answer besides its messages: hwm (1 + 8), next offset, count.
const FETCH_RESPONSE_FIXED_BYTES: usize = 9 + 8 + 4;
/// Bytes of a fetch answer per message besides its payload: offset, length.
const FETCH_MESSAGE_OVERHEAD_BYTES: usize = 8 + 4;

const _: () = assert!(CONN_RESPONSE_BYTES_MAX >= FRAME_BYTES_MAX);

/// The permits a request holds until it is answered (a fetch's answer bytes: until the
/// answer is written).
#[derive(Debug)]
pub(crate) struct Permits {
    pub(crate) request: OwnedSemaphorePermit,
    pub(crate) _produce_bytes: Option<OwnedSemaphorePermit>,
    pub(crate) response_bytes: Option<BytesHeld>,
    /// A fetch's share of the broker-wide budget of fetch answers.
    pub(crate) shared_response_bytes: Option<BytesHeld>,
}

/// Where a [`Responder`]'s answers go.
#[derive(Clone, Debug)]
enum Sink {
    /// Encoded, to the connection's writer.
    Wire(mpsc::Sender<OutFrame>),
    /// As they are, to an in-process caller ([`super::local::LocalClient`]): one answer.
    Local(mpsc::Sender<Body>),
}

/// Sends answers on one inbound connection; cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct Responder {
    id: u64,
    tx: Sink,
    kill: Arc<Notify>,
    /// Set when the connection is closed for not reading its answers, so it is counted and
    /// logged once however many answers find its queue full afterwards.
    dropped: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl Responder {
    /// A responder that hands its one answer to `tx` unencoded (an in-process request).
    pub(crate) fn local(tx: mpsc::Sender<Body>, metrics: Arc<Metrics>) -> Responder {
        Responder {
            id: NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed),
            tx: Sink::Local(tx),
            kill: Arc::new(Notify::new()),
            dropped: Arc::new(AtomicBool::new(false)),
            metrics,
        }
    }

    /// Queues `body` as the answer to `request_id`. Never waits: a connection whose queue
    /// is full (the peer does not read) is closed.
    pub(crate) fn send(&self, request_id: RequestId, body: Body) {
        self.send_holding(LogId::ZERO, request_id, body, None);
    }

    /// Queues `body` as the answer to the request that holds `permits`: its request slot
    /// and answer bytes go back once the answer is written (its produce bytes at once).
    pub(crate) fn answer(&self, request_id: RequestId, body: Body, permits: Permits) {
        self.send_holding(LogId::ZERO, request_id, body, Some(permits));
    }

    fn send_holding(
        &self,
        log: LogId,
        request_id: RequestId,
        body: Body,
        permits: Option<Permits>,
    ) {
        let tx = match &self.tx {
            Sink::Wire(tx) => tx,
            Sink::Local(tx) => {
                // The caller waits for this one answer; its permits go back now.
                let _ = tx.try_send(body);
                return;
            }
        };
        let mut scratch = BytesMut::new();
        let encoded = match encode_body(&body, &mut scratch) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(conn = self.id, error = %e, "cannot encode an answer");
                let err = ErrorResponse::new(
                    ErrorCode::Internal,
                    format!("cannot encode the answer: {e}"),
                );
                match encode_body(&err.into(), &mut scratch) {
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
        if let Some(p) = permits {
            frame = frame.holding_permit(p.request);
            if let Some(held) = p.response_bytes {
                frame = frame.holding(held);
            }
            if let Some(held) = p.shared_response_bytes {
                frame = frame.holding_shared(held);
            }
        }
        if let Err(mpsc::error::TrySendError::Full(_)) = tx.try_send(frame) {
            if !self.dropped.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    conn = self.id,
                    "the peer does not read its answers: closing the connection"
                );
                self.metrics.connections_dropped_slow.inc();
            }
            self.kill.notify_one();
        }
    }

    /// Answers `request_id` with an error.
    pub(crate) fn error(&self, request_id: RequestId, error: ErrorResponse) {
        self.send(request_id, error.into());
    }

    /// Answers a request about `log`, which this broker does not serve, with
    /// `ErrorCode::UnknownLog` under the request's own log id.
    pub(crate) fn unknown_log(&self, log: LogId, request_id: RequestId) {
        self.send_holding(
            log,
            request_id,
            ErrorResponse::unknown_log(log).into(),
            None,
        );
    }
}

/// One request handed to the actor.
#[derive(Debug)]
pub(crate) struct Request {
    /// The request's id on its connection.
    pub(crate) request_id: RequestId,
    /// The decoded body (a request frame type).
    pub(crate) body: Body,
    /// Where to answer.
    pub(crate) reply: Responder,
    /// Held until answered.
    pub(crate) permits: Permits,
    /// When the frame was decoded.
    pub(crate) received: Instant,
}

static NEXT_CONN_ID: AtomicU64 = AtomicU64::new(1);

/// What a connection needs from the broker.
#[derive(Clone, Debug)]
pub(crate) struct ConnShared {
    pub(crate) actor: mpsc::Sender<Request>,
    pub(crate) produce_bytes: Arc<Semaphore>,
    pub(crate) produce_bytes_max: usize,
    pub(crate) metrics: Arc<Metrics>,
    /// The broker-wide budget of bytes buffered for incoming frames.
    pub(crate) read_budget: ReadBudget,
    /// Timeouts of the readers.
    pub(crate) read: ReadSettings,
    /// The largest message event applied so far, in payload bytes (kept by the actor).
    pub(crate) message_event_bytes_max: Arc<AtomicUsize>,
    /// The broker-wide budget of fetch answers not yet written
    /// (`fetch_responses_bytes_max`).
    pub(crate) fetch_responses: ConnBytes,
    /// The users and ACL entries applied (SCRAM exchanges and ACL checks read them).
    pub(crate) security: crate::security::SecurityView,
    /// `authorization` and `super_users`.
    pub(crate) auth: Arc<crate::security::AuthSettings>,
    /// Failed logins by client address.
    pub(crate) login_failures: Arc<std::sync::Mutex<crate::security::LoginFailures>>,
}

/// The guarded value; a poisoned lock still guards it (what a panicking holder left is
/// a count, never half of one).
fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Serves one inbound connection until the peer closes it, it breaks, or the broker stops.
/// `permit` holds its place in the connection bound until then (a reserve place must open
/// with a cluster frame, see quire-net's [`ConnectionPermit`]).
pub(crate) async fn serve(
    stream: Stream,
    auth: quire_tls::PeerAuth,
    peer_addr: SocketAddr,
    mut permit: ConnectionPermit,
    shared: ConnShared,
) {
    let id = NEXT_CONN_ID.fetch_add(1, Ordering::Relaxed);
    let _ = stream.tcp().set_nodelay(true);
    let peer = peer_addr.to_string();
    tracing::debug!(conn = id, %peer, reserve = permit.is_on_probation(), "connection accepted");
    shared.metrics.connections_accepted.inc();
    shared.metrics.connections_open.inc();
    let (r, w) = stream.into_split();
    let (tx, rx) = mpsc::channel(WRITE_QUEUE_FRAMES_MAX);
    let kill = Arc::new(Notify::new());
    let writer = tokio::spawn(write_loop(
        w,
        rx,
        kill.clone(),
        id,
        WRITE_STALL_TIMEOUT,
        shared.metrics.connections_dropped_slow.clone(),
    ));
    let reply = Responder {
        id,
        tx: Sink::Wire(tx),
        kill: kill.clone(),
        dropped: Arc::new(AtomicBool::new(false)),
        metrics: shared.metrics.clone(),
    };
    let requests = Arc::new(Semaphore::new(CONN_REQUESTS_MAX));
    let response_bytes = ConnBytes::new(CONN_RESPONSE_BYTES_MAX);
    let mut reader = FrameReader::new(r, shared.read_budget.clone(), &shared.read);
    // A principal over its connection bound gets one error and the close; the loop runs
    // for nothing then, so the ending below is the same for every connection.
    // Who the connection acts as: its certificate's holder, or the user of a SCRAM
    // exchange completed on it.
    let mut principal = Principal::of(&auth);
    let mut sasl: Option<ScramServer> = None;
    let admitted = match permit.admit_peer(&auth, peer_addr) {
        Ok(()) => true,
        Err(e) => {
            reply.error(RequestId::CONNECTION, e);
            false
        }
    };
    loop {
        if !admitted {
            break;
        }
        let next = tokio::select! {
            next = reader.next() => next,
            () = kill.notified() => break,
            () = permit.first_frame_overdue() => {
                reply.error(RequestId::CONNECTION, permit.first_frame_timed_out(peer_addr));
                break;
            }
        };
        let frame = match next {
            Ok(received) => {
                if let Err(e) = permit.check_frame(received.frame.frame_type(), peer_addr) {
                    reply.error(RequestId::CONNECTION, e);
                    break;
                }
                received.frame
            }
            Err(e) => {
                note_read_error(id, &peer, &e, &shared.metrics);
                if let Some((request_id, answer)) = e.answer() {
                    reply.error(request_id, answer);
                }
                if e.is_recoverable() {
                    continue;
                }
                break;
            }
        };
        let received = Instant::now();
        if frame.frame_type().is_response() {
            shared.metrics.reject_frame("unexpected_frame");
            reply.error(
                frame.request_id,
                ErrorResponse::new(
                    ErrorCode::UnexpectedFrame,
                    format!(
                        "a broker does not take a {:?} as a request",
                        frame.frame_type()
                    ),
                ),
            );
            continue;
        }
        // With ACL entries enforced, they decide who may hand mastership away (the admin
        // operation), a SCRAM login included; the certificate rule is for clusters without.
        let acl_decides =
            shared.auth.authorization && frame.frame_type() == FrameType::HandoffRequest;
        if let Err(refusal) = quire_net::authorize(&auth, frame.frame_type()).or_else(|e| {
            if acl_decides {
                Ok(())
            } else {
                Err(e)
            }
        }) {
            // Replication or a take-over request from a peer whose certificate is not a
            // broker's: answered, counted, and nothing of it done.
            shared.metrics.reject_frame("unauthorized");
            quire_net::log_unauthorized(&peer, frame.frame_type(), &refusal.message);
            reply.error(frame.request_id, refusal);
            continue;
        }
        if let Body::AuthenticateRequest(a) = &frame.body {
            // Checked at every step, the proof's included: a client that staged many
            // exchanges before its address was blocked gets no more guesses from them
            // (found by a break-it trial on the Kafka listener, which shares the window).
            let blocked =
                lock(&shared.login_failures).blocked(peer_addr.ip(), std::time::Instant::now());
            let step = match blocked {
                Some(left) => Err(format!(
                    "too many failed logins from this address: try again in {} s",
                    left.as_secs() + 1
                )),
                None => authenticate_step(a, &mut sasl, &shared.security),
            };
            if step.is_err() && blocked.is_none() {
                lock(&shared.login_failures).failed(peer_addr.ip(), std::time::Instant::now());
            }
            match step {
                Ok(Step::Continue(message)) => {
                    reply.send(frame.request_id, AuthenticateResponse { message }.into());
                }
                Ok(Step::Done(user, message)) => {
                    tracing::debug!(conn = id, %peer, %user, "authenticated");
                    principal = Principal::User(user);
                    reply.send(frame.request_id, AuthenticateResponse { message }.into());
                }
                Err(why) => {
                    // As Kafka: a failed exchange is answered after a delay and the
                    // connection closed, so guessing passwords takes a reconnect and
                    // AUTHENTICATION_FAILURE_DELAY per guess (Kafka's
                    // connection.failed.authentication.delay.ms); the log line is
                    // throttled, as a flood of failures must not fill the disk.
                    shared.metrics.reject_frame("authentication_failed");
                    log_authentication_failure(&peer, &why);
                    tokio::select! {
                        () = tokio::time::sleep(AUTHENTICATION_FAILURE_DELAY) => {}
                        () = kill.notified() => break,
                    }
                    reply.error(
                        frame.request_id,
                        ErrorResponse::new(ErrorCode::AuthenticationFailed, why),
                    );
                    break;
                }
            }
            continue;
        }
        if shared.auth.authorization {
            let tables = crate::security::current(&shared.security);
            if let Err(refusal) =
                crate::security::authorize(&shared.auth, &tables, &principal, &frame.body)
            {
                shared.metrics.reject_frame("unauthorized");
                quire_net::log_unauthorized(&peer, frame.frame_type(), &refusal.message);
                reply.error(frame.request_id, refusal);
                continue;
            }
        }
        if let Body::ProduceRequest(p) = &frame.body {
            // A message that says it is a Kafka record must be one: Kafka consumers read
            // it as such (the Kafka listener writes only records it encoded).
            if p.format == quire_proto::MessageFormat::Kafka
                && p.messages
                    .iter()
                    .any(|m| quire_proto::KafkaRecord::decode(m).is_err())
            {
                shared.metrics.reject_frame("malformed");
                reply.error(
                    frame.request_id,
                    ErrorResponse::new(
                        ErrorCode::Malformed,
                        "a message of format Kafka is not a Kafka record (docs/protocol.md, Event bodies)",
                    ),
                );
                continue;
            }
        }
        if frame.log != LogId::ZERO {
            // One log per cluster until partitions land (docs/partitions.md).
            shared.metrics.reject_frame("unknown_log");
            reply.unknown_log(frame.log, frame.request_id);
            continue;
        }
        let Ok(request) = requests.clone().acquire_owned().await else {
            break;
        };
        let (response_bytes, shared_response_bytes) = match &frame.body {
            Body::FetchRequest(f) => {
                let bound = fetch_response_bytes_max(
                    f,
                    shared.message_event_bytes_max.load(Ordering::Relaxed),
                );
                let held = tokio::select! {
                    held = response_bytes.acquire(bound) => held,
                    () = kill.notified() => break,
                };
                // And the broker-wide bound, so that many consumers that never read
                // their answers hold no more than it together.
                let budget = &shared.fetch_responses;
                if budget.available_bytes() < bound.min(budget.bytes_max()) {
                    shared.metrics.fetch_response_budget_waits.inc();
                }
                let shared_held = tokio::select! {
                    held = budget.acquire(bound) => held,
                    () = kill.notified() => break,
                };
                (Some(held), Some(shared_held))
            }
            _ => (None, None),
        };
        let bytes = match &frame.body {
            Body::ProduceRequest(p) => {
                let want = produce_permit_bytes(p, shared.produce_bytes_max);
                tokio::select! {
                    p = shared.produce_bytes.clone().acquire_many_owned(want) => match p {
                        Ok(p) => Some(p),
                        Err(_) => break,
                    },
                    () = kill.notified() => break,
                }
            }
            _ => None,
        };
        let req = Request {
            request_id: frame.request_id,
            body: frame.body,
            reply: reply.clone(),
            permits: Permits {
                request,
                _produce_bytes: bytes,
                response_bytes,
                shared_response_bytes,
            },
            received,
        };
        if shared.actor.send(req).await.is_err() {
            break;
        }
    }
    drop(reader);
    drop(reply);
    // Let the writer flush what is queued (an error frame before closing, say), bounded.
    let _ = tokio::time::timeout(std::time::Duration::from_secs(1), writer).await;
    shared.metrics.connections_open.dec();
    tracing::debug!(conn = id, %peer, "connection closed");
}

/// How long a failed login waits before its answer and the close.
pub const AUTHENTICATION_FAILURE_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// Logs a failed login at most once per `quire_net::REFUSAL_LOG_INTERVAL` for the whole
/// process, with how many were held back.
fn log_authentication_failure(peer: &str, why: &str) {
    static LOG: std::sync::Mutex<Option<quire_net::Throttle>> = std::sync::Mutex::new(None);
    let held_back = {
        let mut log = LOG
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        log.get_or_insert_with(|| quire_net::Throttle::new(quire_net::REFUSAL_LOG_INTERVAL))
            .tick(std::time::Instant::now())
    };
    if let Some(held_back) = held_back {
        tracing::warn!(%peer, failed_since_last_line = held_back, "SASL authentication failed: {why}");
    }
}

/// `name` cut to at most 64 bytes (at a character boundary) for messages and logs: a
/// client chooses it, up to the SASL message's 4 KiB.
fn shown_name(name: &str) -> String {
    if name.len() <= 64 {
        return format!("{name:?}");
    }
    let mut end = 64;
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}…", &name[..end])
}

/// Where a SASL exchange stands after one step.
enum Step {
    /// Send this message; another step follows.
    Continue(Bytes),
    /// The user proved who it is: send this last message.
    Done(String, Bytes),
}

/// One step of a connection's SCRAM-SHA-256 exchange (`sasl` holds the server side between
/// the two steps).
///
/// # Errors
/// Why the exchange failed, for the client (an unknown user and a wrong password read
/// alike).
fn authenticate_step(
    a: &AuthenticateRequest,
    sasl: &mut Option<ScramServer>,
    security: &crate::security::SecurityView,
) -> Result<Step, String> {
    if a.mechanism != quire_tls::scram::MECHANISM {
        return Err(format!(
            "SASL mechanism {:?} is not offered; use {}",
            a.mechanism,
            quire_tls::scram::MECHANISM
        ));
    }
    let message = std::str::from_utf8(&a.message).map_err(|_| "the SASL message is not UTF-8")?;
    match sasl.take() {
        None => {
            let tables = crate::security::current(security);
            let (server, first) =
                ScramServer::client_first(message, |u| tables.credential(u).cloned())
                    .map_err(|e| e.to_string())?;
            *sasl = Some(server);
            Ok(Step::Continue(first.into()))
        }
        Some(server) => {
            let user = shown_name(server.user());
            let (user, last) = server.client_final(message).map_err(|e| {
                tracing::debug!(%user, error = %e, "SCRAM proof refused");
                e.to_string()
            })?;
            Ok(Step::Done(user, last.into()))
        }
    }
}

/// Logs and counts why the reader gave no frame.
fn note_read_error(id: u64, peer: &str, e: &ReadError, metrics: &Metrics) {
    let reason = e.reason();
    match e {
        ReadError::Closed => {}
        ReadError::Io(_) => tracing::debug!(conn = id, %peer, error = %e, "read failed"),
        ReadError::PartialFrameTimeout { .. } | ReadError::IdleTimeout { .. } => {
            tracing::info!(conn = id, %peer, error = %e, reason, "closing the connection");
            metrics.time_out_connection(reason);
        }
        ReadError::ClosedMidFrame { .. } | ReadError::Wire(_) => {
            tracing::debug!(conn = id, %peer, error = %e, reason, "bad frame");
            metrics.reject_frame(reason);
        }
    }
}

/// The most bytes an answer to `f` takes on the wire (header included): its payload bound,
/// each message's overhead and the fixed fields, and never more than a frame. An answer
/// carries at least one message whatever its byte bound, so the payload bound is at least
/// `message_event_bytes_max`, the largest message event applied so far (a message is
/// shorter than its event). Only a message larger than any applied when the fetch arrived
/// (produced meanwhile, or older than this broker's restart) can exceed the bound.
pub(crate) fn fetch_response_bytes_max(f: &FetchRequest, message_event_bytes_max: usize) -> usize {
    let messages = (f.max_messages as usize).clamp(1, MESSAGES_PER_FRAME_MAX);
    let payload = (f.max_bytes as usize)
        .clamp(1, super::actor::FETCH_BYTES_MAX)
        .max(message_event_bytes_max);
    (HEADER_BYTES + FETCH_RESPONSE_FIXED_BYTES)
        .saturating_add(payload)
        .saturating_add(messages.saturating_mul(FETCH_MESSAGE_OVERHEAD_BYTES))
        .min(FRAME_BYTES_MAX)
}

/// The produce byte budget a request takes: its messages plus a fixed overhead per message
/// (never more than the whole budget, so one maximal request always fits).
pub(crate) fn produce_permit_bytes(p: &quire_proto::ProduceRequest, max: usize) -> u32 {
    let bytes: usize = p
        .messages
        .iter()
        .map(|m| m.len() + crate::core::event::EVENT_OVERHEAD_BYTES as usize)
        .sum::<usize>()
        .max(1);
    u32::try_from(bytes.min(max)).unwrap_or(u32::MAX)
}

/// Writes the connection's answers until it closes. A peer that takes no bytes for
/// `stall` ([`WRITE_STALL_TIMEOUT`] outside tests) is logged, counted in `dropped_slow`
/// (`quire_connections_dropped_slow_total`) and disconnected.
async fn write_loop(
    mut w: quire_tls::WriteHalf,
    mut rx: mpsc::Receiver<OutFrame>,
    kill: Arc<Notify>,
    id: u64,
    stall: std::time::Duration,
    dropped_slow: prometheus_client::metrics::counter::Counter,
) {
    let mut queue: VecDeque<OutFrame> = VecDeque::new();
    while let Some(frame) = rx.recv().await {
        queue.push_back(frame);
        while queue.len() < IOV_MAX {
            match rx.try_recv() {
                Ok(frame) => queue.push_back(frame),
                Err(_) => break,
            }
        }
        if let Err(e) = write_frames_within(&mut w, &mut queue, stall).await {
            if e.kind() == std::io::ErrorKind::TimedOut {
                let queued_bytes: usize = queue.iter().map(OutFrame::bytes_left).sum();
                tracing::warn!(
                    conn = id,
                    stall_ms = stall.as_millis() as u64,
                    queued_bytes,
                    "the peer took no answer bytes for too long: closing the connection"
                );
                dropped_slow.inc();
            } else {
                tracing::debug!(conn = id, error = %e, "write failed: closing");
            }
            kill.notify_one();
            // Refuse further answers, and give back the permits of those never written.
            rx.close();
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::{encode, FetchResponse, Frame, Offset};

    fn answer_bytes(messages: usize, payload_bytes: usize) -> usize {
        let body = FetchResponse {
            formats: Vec::new(),
            hwm: Some(Offset(u64::MAX)),
            next_offset: Offset(1),
            messages: (0..messages)
                .map(|i| (Offset(i as u64), Bytes::from(vec![3u8; payload_bytes])))
                .collect(),
        };
        let mut out = BytesMut::new();
        encode(&Frame::new(RequestId(1), body), &mut out).expect("encodes");
        out.len()
    }

    /// A peer that sends fetches and never reads the answers is disconnected once a write
    /// makes no progress for the stall bound, and that is counted (before, it went out with
    /// a debug line only).
    #[tokio::test]
    async fn a_peer_that_reads_nothing_is_dropped_and_counted() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("binds");
        let addr = listener.local_addr().expect("has an address");
        let client = tokio::net::TcpStream::connect(addr)
            .await
            .expect("connects");
        let (server, _peer) = listener.accept().await.expect("accepts");
        let (_read_half, w) = quire_tls::Stream::Plain(server).into_split();
        let (tx, rx) = mpsc::channel(64);
        let metrics = quire_net::ResponseMetrics::default();
        // Far more than the two sockets' buffers hold: the writer must stall.
        for _ in 0..64 {
            let frame = OutFrame::new(vec![Bytes::from(vec![0u8; 1 << 20])], &metrics);
            tx.try_send(frame).expect("the queue has room");
        }
        let dropped = prometheus_client::metrics::counter::Counter::default();
        let ended = tokio::time::timeout(
            std::time::Duration::from_secs(20),
            write_loop(
                w,
                rx,
                Arc::new(Notify::new()),
                1,
                std::time::Duration::from_millis(200),
                dropped.clone(),
            ),
        )
        .await;
        assert!(ended.is_ok(), "the writer gave up on the stalled peer");
        assert_eq!(dropped.get(), 1, "the stalled peer is counted");
        drop(client);
    }

    /// A fetch holds its answer's bound until the answer is written, so the bound must
    /// cover what the actor can answer within the request's limits.
    #[test]
    fn a_fetch_answer_fits_its_bound() {
        let req = |max_messages: u32, max_bytes: u32| FetchRequest {
            records: false,
            topic: "t".to_owned(),
            from_offset: Offset(0),
            max_messages,
            max_bytes,
            wait_ms: 0,
        };
        assert!(answer_bytes(1000, 1) <= fetch_response_bytes_max(&req(1000, 1000), 1));
        assert!(answer_bytes(4, 4096) <= fetch_response_bytes_max(&req(4, 4 * 4096), 4096));
        assert!(answer_bytes(0, 0) <= fetch_response_bytes_max(&req(0, 0), 0));
        // One message larger than the byte bound is still served (alone): the story of a
        // fetch asking for 1 byte over 1 MiB messages, whose tiny charge let a consumer that
        // never read pile up whole answers.
        assert!(answer_bytes(1, 1 << 20) <= fetch_response_bytes_max(&req(10, 1), 1 << 20));
        let big = fetch_response_bytes_max(&req(u32::MAX, u32::MAX), usize::MAX);
        assert!((super::super::actor::FETCH_BYTES_MAX..=FRAME_BYTES_MAX).contains(&big));
    }
}
