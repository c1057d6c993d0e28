//! [`Producer`]: batching, pipelined, idempotent produce to the master broker.
//!
//! # What a send does
//! [`Producer::send`] puts one message into the open batch of its topic and returns a
//! [`Delivery`] that resolves to the message's log [`Offset`] once the broker has
//! stabilized it (or to a [`ProduceError`]). A topic's open batch is **sealed** when it
//! holds [`ProducerConfig::batch_bytes_max`] bytes or
//! [`ProducerConfig::batch_messages_max`] messages, or [`ProducerConfig::linger_ms`] after
//! its first message, or on [`Producer::flush`]. Sealing gives the batch its
//! **sequence**: the producer's next sequence number, which then advances by the batch's
//! message count (message `i` of the batch has sequence `sequence + i`, as the broker
//! counts them). Sealed batches are sent in sequence order on one connection to the
//! master, at most [`ProducerConfig::in_flight_batches_max`] awaiting an answer.
//!
//! # Failures and resends
//! Each producer has a non-zero **producer id** (random unless given). When a batch fails
//! with a retriable error — the connection lost, no answer in time, `NotMaster`,
//! `Timeout`, `NoQuorum`, `Overloaded`, `ShuttingDown`, `Internal` (see
//! [`ClientError::disposition`]) — the producer stops sending, lets every other request in
//! flight finish (each bounded by the connection's request timeout), finds the master
//! again (following a `NotMaster` hint first, with backoff), and resends every
//! unacknowledged batch **unchanged** — same producer id, same sequence, same messages — in
//! sequence order. The broker answers a batch it already holds with its original offsets
//! and writes it once, so a batch whose first attempt did reach the log is not written
//! twice. A batch refused for good (`MessageTooLarge`, `InvalidName`, `SequenceGap`, ...)
//! fails alone with [`ProduceError::Rejected`]; the others go on.
//!
//! A batch not acknowledged within [`ProducerConfig::delivery_timeout_ms`] of its first
//! message (plus at most one request timeout, when it is in flight at that moment) fails
//! with [`ProduceError::DeliveryTimeout`]: its **outcome is unknown** — it may be in the
//! log or not. The producer never sends it again.
//!
//! # Guarantees
//! - **Exactly once in the log** for every batch that is acknowledged, and at most once
//!   for every batch that fails, as long as one producer id is used by one producer at a
//!   time and its sequences only grow (a new [`Producer`] takes a new random id, or
//!   continues an explicit id with [`ProducerConfig::first_sequence`] past every
//!   sequence it used). Consumers see each message once even in the one case the broker
//!   rewrites a batch (a batch cut by a failover: its surviving prefix is skipped as a
//!   duplicate; the offsets reported for that prefix are then those of the skipped copies).
//! - **At least once without idempotence**: a caller that sends a message again after a
//!   `DeliveryTimeout` (necessarily in a new batch, with a new sequence) may get it
//!   twice in the log.
//! - **Order**: a topic's messages enter the log in the order they were sent, except that
//!   a batch refused outright while later batches were already accepted (`Overloaded`,
//!   rare) fails with `SequenceGap` on its resend instead of being written out of order.
//!   With `in_flight_batches_max = 1` that cannot happen.
//! - **Bounded**: every wait is bounded; a [`Delivery`] always resolves.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use quire_proto::{
    validate_topic, BrokerInfo, ErrorCode, Offset, ProduceRequest, ProduceResponse,
    MESSAGES_PER_FRAME_MAX, MESSAGE_BYTES_MAX,
};
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit, Semaphore};
use tokio::task::{JoinHandle, JoinSet};
use tokio::time::{sleep_until, Instant};

use crate::discovery::{millis, Discovery, DiscoveryConfig, MasterConn};
use crate::error::{ClientError, Disposition};

/// Most batches one producer keeps awaiting an answer. The broker remembers a producer's
/// 16 most recent runs of batches (`quire_broker::state::PRODUCER_RUNS_MAX`): with no more
/// than that in flight, a resent batch that reached the log is always one it remembers.
pub const IN_FLIGHT_BATCHES_MAX: usize = 16;

/// Commands (sends, flushes) queued for a producer's task, at most.
pub const COMMAND_QUEUE_MAX: usize = 4096;

/// Bytes a message takes in a `ProduceRequest` besides its own: its u32 length.
const MESSAGE_OVERHEAD_BYTES: usize = 4;

/// Settings of a [`Producer`]. Sizes in bytes, times in milliseconds.
#[derive(Clone, Debug)]
pub struct ProducerConfig {
    /// The producer id (non-zero). `None`: a random one.
    pub producer_id: Option<u64>,
    /// Sequence of the first batch. Default 0; set it past every sequence used before
    /// when reusing an explicit `producer_id`.
    pub first_sequence: u64,
    /// A batch is sealed once its messages take this many bytes on the wire (each
    /// message's length plus 4); a message alone may exceed it. 1 ..= `MESSAGE_BYTES_MAX`;
    /// default 256 KiB.
    pub batch_bytes_max: usize,
    /// A batch is sealed once it holds this many messages. 1 ..= `MESSAGES_PER_FRAME_MAX`;
    /// default 4096.
    pub batch_messages_max: usize,
    /// A batch is sealed this long after its first message. Default 5.
    pub linger_ms: u64,
    /// Batches awaiting an answer, at most. 1 ..= [`IN_FLIGHT_BATCHES_MAX`]; default 8.
    pub in_flight_batches_max: usize,
    /// Bytes of unacknowledged messages the producer holds; [`Producer::send`] waits for
    /// room beyond it. `batch_bytes_max` ..= `u32::MAX`; default 64 MiB.
    pub buffer_bytes_max: usize,
    /// A batch not acknowledged this long after its first message fails with
    /// [`ProduceError::DeliveryTimeout`]; also the longest wait for buffer room. Above
    /// `linger_ms`; default 60 000.
    pub delivery_timeout_ms: u64,
    /// Discovery and connection bounds. The default request timeout here is 15 s, above
    /// the broker's default `produce_timeout_ms` (10 s), so the broker's own `Timeout`
    /// answer normally arrives first.
    pub discovery: DiscoveryConfig,
}

impl Default for ProducerConfig {
    fn default() -> Self {
        let mut discovery = DiscoveryConfig::default();
        discovery.conn.request_timeout = Duration::from_secs(15);
        ProducerConfig {
            producer_id: None,
            first_sequence: 0,
            batch_bytes_max: 256 * 1024,
            batch_messages_max: 4096,
            linger_ms: 5,
            in_flight_batches_max: 8,
            buffer_bytes_max: 64 * 1024 * 1024,
            delivery_timeout_ms: 60_000,
            discovery,
        }
    }
}

impl ProducerConfig {
    /// Checks every range documented on the fields.
    ///
    /// # Errors
    /// [`ClientError::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<(), ClientError> {
        let bad = |m: String| Err(ClientError::InvalidConfig(m));
        if self.producer_id == Some(0) {
            return bad("producer_id must not be 0 (0 means not idempotent)".into());
        }
        if !(1..=MESSAGE_BYTES_MAX).contains(&self.batch_bytes_max) {
            return bad(format!(
                "batch_bytes_max {} must be in 1..={MESSAGE_BYTES_MAX}",
                self.batch_bytes_max
            ));
        }
        if !(1..=MESSAGES_PER_FRAME_MAX).contains(&self.batch_messages_max) {
            return bad(format!(
                "batch_messages_max {} must be in 1..={MESSAGES_PER_FRAME_MAX}",
                self.batch_messages_max
            ));
        }
        if !(1..=IN_FLIGHT_BATCHES_MAX).contains(&self.in_flight_batches_max) {
            return bad(format!(
                "in_flight_batches_max {} must be in 1..={IN_FLIGHT_BATCHES_MAX}",
                self.in_flight_batches_max
            ));
        }
        if self.buffer_bytes_max < self.batch_bytes_max || self.buffer_bytes_max > u32::MAX as usize
        {
            return bad(format!(
                "buffer_bytes_max {} must be in batch_bytes_max ({})..={}",
                self.buffer_bytes_max,
                self.batch_bytes_max,
                u32::MAX
            ));
        }
        if self.delivery_timeout_ms <= self.linger_ms {
            return bad(format!(
                "delivery_timeout_ms {} must be above linger_ms {}",
                self.delivery_timeout_ms, self.linger_ms
            ));
        }
        self.discovery.validate()
    }

    fn limits(&self) -> Limits {
        Limits {
            batch_bytes_max: self.batch_bytes_max,
            batch_messages_max: self.batch_messages_max,
            linger: Duration::from_millis(self.linger_ms),
            in_flight_max: self.in_flight_batches_max,
            delivery_timeout: Duration::from_millis(self.delivery_timeout_ms),
        }
    }
}

/// Why a message was not (or may not have been) produced. `Clone`: a batch's error goes
/// to every message in it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum ProduceError {
    /// The message cannot be sent (empty or long topic name, message above
    /// `MESSAGE_BYTES_MAX`). Nothing was sent.
    #[error("invalid message: {0}")]
    Invalid(String),
    /// The broker refused the batch for good (its `ErrorCode` is in `source`, see
    /// [`ProduceError::code`]); the batch is not in the log. `SequenceGap` on a resend
    /// means the first attempt never reached the log and later batches already did.
    #[error("batch {sequence} of producer {producer_id:#018x} refused: {source}")]
    Rejected {
        /// The producer id.
        producer_id: u64,
        /// The batch's sequence.
        sequence: u64,
        /// The broker's answer (or the local error that makes sending impossible).
        #[source]
        source: ClientError,
    },
    /// The batch was not acknowledged within the delivery timeout: **outcome unknown**,
    /// it may or may not be in the log. It is never sent again.
    #[error(
        "batch {sequence} of producer {producer_id:#018x} not acknowledged within {elapsed_ms} ms \
         ({attempts} attempt(s)); outcome unknown{}",
        last_suffix(.last)
    )]
    DeliveryTimeout {
        /// The producer id.
        producer_id: u64,
        /// The batch's sequence.
        sequence: u64,
        /// Times it was sent.
        attempts: u32,
        /// Time since its first message was queued, in milliseconds.
        elapsed_ms: u64,
        /// The last error it (or the search for the master) met.
        last: Option<ClientError>,
    },
    /// The broker acknowledged the batch with another message count: a broker bug. The
    /// batch is in the log, the offsets of its messages are not known.
    #[error(
        "batch {sequence}: the broker acknowledged {count} messages, the batch holds {expected}"
    )]
    CountMismatch {
        /// The batch's sequence.
        sequence: u64,
        /// Messages in the batch.
        expected: usize,
        /// Count in the answer.
        count: u32,
    },
    /// No buffer room freed up within the delivery timeout. Nothing was sent.
    #[error("no room in the producer's buffer within {timeout_ms} ms")]
    BufferTimeout {
        /// The bound, in milliseconds.
        timeout_ms: u64,
    },
    /// The producer's task is gone (the runtime is shutting down). Nothing was sent.
    #[error("the producer is closed")]
    Closed,
}

fn last_suffix(last: &Option<ClientError>) -> String {
    match last {
        Some(e) => format!("; last error: {e}"),
        None => String::new(),
    }
}

impl ProduceError {
    /// The broker's error code behind this error, if a broker answered with one.
    #[must_use]
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ProduceError::Rejected { source, .. } => source.code(),
            ProduceError::DeliveryTimeout { last, .. } => last.as_ref().and_then(|e| e.code()),
            _ => None,
        }
    }

    /// `true` when the message may be in the log (only [`ProduceError::DeliveryTimeout`]
    /// and [`ProduceError::CountMismatch`]); `false` when it certainly is not.
    #[must_use]
    pub fn is_outcome_unknown(&self) -> bool {
        matches!(
            self,
            ProduceError::DeliveryTimeout { .. } | ProduceError::CountMismatch { .. }
        )
    }
}

// ---------------------------------------------------------------- pure bookkeeping

/// The producer's bounds, as the bookkeeping uses them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub(crate) batch_bytes_max: usize,
    pub(crate) batch_messages_max: usize,
    pub(crate) linger: Duration,
    pub(crate) in_flight_max: usize,
    pub(crate) delivery_timeout: Duration,
}

#[derive(Debug)]
struct OpenBatch<W> {
    messages: Vec<Bytes>,
    waiters: Vec<W>,
    bytes: usize,
    created: Instant,
}

#[derive(Debug)]
struct Batch<W> {
    topic: String,
    sequence: u64,
    messages: Vec<Bytes>,
    waiters: Vec<W>,
    created: Instant,
    attempts: u32,
    last_error: Option<ClientError>,
    in_flight: bool,
}

/// A batch to put on the wire.
#[derive(Debug)]
pub(crate) struct Outgoing {
    pub(crate) sequence: u64,
    pub(crate) request: ProduceRequest,
}

/// A batch finished: `result` is the offset of its first message (message `i` is at
/// `offset + i`), or its error.
#[derive(Debug)]
pub(crate) struct Done<W> {
    pub(crate) sequence: u64,
    pub(crate) waiters: Vec<W>,
    pub(crate) result: Result<Offset, ProduceError>,
}

/// The producer's state without I/O: open batches per topic, sealed batches in sequence
/// order (those in flight first), the recovery flag. `W` is what waits for a message's
/// outcome. Time comes in as arguments.
#[derive(Debug)]
pub(crate) struct Pipeline<W> {
    producer_id: u64,
    limits: Limits,
    next_sequence: u64,
    open: BTreeMap<String, OpenBatch<W>>,
    /// Sealed, unfinished batches, in sequence order. Invariant: the in-flight ones form
    /// a prefix (sending takes the first queued one; recovery starts only once none is in
    /// flight).
    batches: VecDeque<Batch<W>>,
    in_flight: usize,
    /// `Some(hint)` while the master must be found again before sending.
    recovery: Option<Option<BrokerInfo>>,
    /// The last error of the search for the master.
    last_error: Option<ClientError>,
}

impl<W> Pipeline<W> {
    /// A pipeline that must find the master before its first send.
    pub(crate) fn new(producer_id: u64, first_sequence: u64, limits: Limits) -> Pipeline<W> {
        assert!(producer_id != 0, "an idempotent producer id is non-zero");
        Pipeline {
            producer_id,
            limits,
            next_sequence: first_sequence,
            open: BTreeMap::new(),
            batches: VecDeque::new(),
            in_flight: 0,
            recovery: Some(None),
            last_error: None,
        }
    }

    /// Adds a message to its topic's open batch, sealing that batch first if the message
    /// would overflow it, and after if it is full.
    pub(crate) fn push(&mut self, topic: &str, message: Bytes, waiter: W, now: Instant) {
        let size = MESSAGE_OVERHEAD_BYTES + message.len();
        if let Some(b) = self.open.get(topic) {
            if b.messages.len() + 1 > self.limits.batch_messages_max
                || b.bytes + size > self.limits.batch_bytes_max
            {
                self.seal(topic);
            }
        }
        let b = self
            .open
            .entry(topic.to_owned())
            .or_insert_with(|| OpenBatch {
                messages: Vec::new(),
                waiters: Vec::new(),
                bytes: 0,
                created: now,
            });
        b.messages.push(message);
        b.waiters.push(waiter);
        b.bytes += size;
        if b.bytes >= self.limits.batch_bytes_max
            || b.messages.len() >= self.limits.batch_messages_max
        {
            self.seal(topic);
        }
    }

    fn seal(&mut self, topic: &str) {
        let Some(b) = self.open.remove(topic) else {
            return;
        };
        let count = b.messages.len() as u64;
        let sequence = self.next_sequence;
        self.next_sequence = sequence
            .checked_add(count)
            .expect("invariant: a producer's sequences never reach u64::MAX");
        self.batches.push_back(Batch {
            topic: topic.to_owned(),
            sequence,
            messages: b.messages,
            waiters: b.waiters,
            created: b.created,
            attempts: 0,
            last_error: None,
            in_flight: false,
        });
    }

    /// Seals the open batches whose linger time is over.
    pub(crate) fn seal_due(&mut self, now: Instant) {
        let due: Vec<String> = self
            .open
            .iter()
            .filter(|(_, b)| b.created + self.limits.linger <= now)
            .map(|(t, _)| t.clone())
            .collect();
        for t in due {
            self.seal(&t);
        }
    }

    /// Seals every open batch (flush, close).
    pub(crate) fn seal_all(&mut self) {
        let all: Vec<String> = self.open.keys().cloned().collect();
        for t in all {
            self.seal(&t);
        }
    }

    /// The sequence the next sealed batch gets.
    pub(crate) fn next_sequence(&self) -> u64 {
        self.next_sequence
    }

    /// The sequence of the oldest unfinished sealed batch.
    pub(crate) fn oldest_unfinished(&self) -> Option<u64> {
        self.batches.front().map(|b| b.sequence)
    }

    /// Nothing open, nothing sealed.
    pub(crate) fn is_idle(&self) -> bool {
        self.open.is_empty() && self.batches.is_empty()
    }

    /// Batches awaiting an answer.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// The next batch to send, in sequence order, if sending is allowed (no recovery
    /// pending, room in flight); it counts as in flight from now on.
    pub(crate) fn take_next(&mut self) -> Option<Outgoing> {
        if self.recovery.is_some() || self.in_flight >= self.limits.in_flight_max {
            return None;
        }
        let producer_id = self.producer_id;
        let b = self.batches.iter_mut().find(|b| !b.in_flight)?;
        b.in_flight = true;
        b.attempts += 1;
        self.in_flight += 1;
        Some(Outgoing {
            sequence: b.sequence,
            request: ProduceRequest {
                format: quire_proto::MessageFormat::Raw,
                topic: b.topic.clone(),
                producer_id,
                sequence: b.sequence,
                messages: b.messages.clone(),
            },
        })
    }

    /// Takes the broker's answer (or the error) for the batch `sequence` sent last.
    /// Returns the finished batch, or `None` if it is to be resent (then recovery is due
    /// once nothing is in flight) or is unknown.
    pub(crate) fn on_response(
        &mut self,
        sequence: u64,
        result: Result<ProduceResponse, ClientError>,
    ) -> Option<Done<W>> {
        let idx = self
            .batches
            .iter()
            .position(|b| b.sequence == sequence && b.in_flight)?;
        self.batches[idx].in_flight = false;
        self.in_flight -= 1;
        let outcome = match result {
            Ok(r) => {
                let expected = self.batches[idx].messages.len();
                if r.count as usize == expected {
                    Ok(r.base_offset)
                } else {
                    Err(ProduceError::CountMismatch {
                        sequence,
                        expected,
                        count: r.count,
                    })
                }
            }
            Err(e) => match e.disposition() {
                Disposition::Fatal => Err(ProduceError::Rejected {
                    producer_id: self.producer_id,
                    sequence,
                    source: e,
                }),
                Disposition::Retry { hint } => {
                    tracing::debug!(sequence, error = %e, "batch will be resent");
                    self.batches[idx].last_error = Some(e);
                    self.recovery = Some(match self.recovery.take() {
                        Some(Some(h)) => Some(h),
                        _ => hint,
                    });
                    return None;
                }
            },
        };
        let b = self.batches.remove(idx)?;
        Some(Done {
            sequence,
            waiters: b.waiters,
            result: outcome,
        })
    }

    /// `Some(hint)` when the master must be found again and nothing is in flight any more.
    pub(crate) fn recovery_due(&self) -> Option<Option<BrokerInfo>> {
        if self.in_flight == 0 {
            self.recovery.clone()
        } else {
            None
        }
    }

    /// The master is found: sending may resume (unfinished batches go first, in order).
    pub(crate) fn recovered(&mut self) {
        self.recovery = None;
        self.last_error = None;
    }

    /// The search for the master failed with `error` (reported by a later timeout).
    pub(crate) fn discovery_failed(&mut self, error: ClientError) {
        self.last_error = Some(error);
    }

    /// Fails every batch not in flight whose delivery timeout is over.
    pub(crate) fn expire(&mut self, now: Instant) -> Vec<Done<W>> {
        let timeout = self.limits.delivery_timeout;
        let mut done = Vec::new();
        let mut i = 0;
        while i < self.batches.len() {
            let b = &self.batches[i];
            if b.in_flight || b.created + timeout > now {
                i += 1;
                continue;
            }
            let Some(b) = self.batches.remove(i) else {
                break;
            };
            done.push(Done {
                sequence: b.sequence,
                result: Err(ProduceError::DeliveryTimeout {
                    producer_id: self.producer_id,
                    sequence: b.sequence,
                    attempts: b.attempts,
                    elapsed_ms: millis(now.saturating_duration_since(b.created)),
                    last: b.last_error.or_else(|| self.last_error.clone()),
                }),
                waiters: b.waiters,
            });
        }
        done
    }

    /// When [`Pipeline::seal_due`] or [`Pipeline::expire`] next has something to do.
    pub(crate) fn next_wakeup(&self) -> Option<Instant> {
        let linger = self.open.values().map(|b| b.created + self.limits.linger);
        let expiry = self
            .batches
            .iter()
            .filter(|b| !b.in_flight)
            .map(|b| b.created + self.limits.delivery_timeout);
        linger.chain(expiry).min()
    }
}

// ---------------------------------------------------------------- the producer task

/// What waits for one message's outcome: the caller's channel and the message's share of
/// the buffer budget (released when the outcome is known).
#[derive(Debug)]
struct Waiter {
    reply: oneshot::Sender<Result<Offset, ProduceError>>,
    _budget: OwnedSemaphorePermit,
}

#[derive(Debug)]
enum Command {
    Send {
        topic: String,
        message: Bytes,
        waiter: Waiter,
    },
    Flush(oneshot::Sender<()>),
}

/// The outcome of one [`Producer::send`]: a future of the message's log offset.
///
/// Resolves at most [`ProducerConfig::delivery_timeout_ms`] plus one request timeout after
/// the send. Dropping it does not cancel the send.
#[derive(Debug)]
pub struct Delivery {
    rx: oneshot::Receiver<Result<Offset, ProduceError>>,
}

impl Future for Delivery {
    type Output = Result<Offset, ProduceError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match Pin::new(&mut self.rx).poll(cx) {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(_)) => Poll::Ready(Err(ProduceError::Closed)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[derive(Debug)]
struct Shared {
    id: u64,
    tx: mpsc::Sender<Command>,
    budget: Arc<Semaphore>,
    buffer_bytes_max: usize,
    wait_bound: Duration,
}

/// An idempotent, batching producer; see the module docs. Cheap to clone (clones share one
/// producer id and one connection). Its work runs in a Tokio task that ends once every
/// clone is dropped and what was sent is finished.
#[derive(Clone, Debug)]
pub struct Producer {
    shared: Arc<Shared>,
}

impl Producer {
    /// Finds the master among `brokers` (bounded by the discovery timeout) and starts the
    /// producer's task. Needs a Tokio runtime.
    ///
    /// # Errors
    /// [`ClientError::InvalidConfig`]; [`ClientError::NoMaster`] if no master was found.
    pub async fn connect<I, S>(brokers: I, config: ProducerConfig) -> Result<Producer, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        config.validate()?;
        let discovery = Discovery::new(brokers, config.discovery.clone())?;
        let master = discovery.find_master(None).await?;
        Ok(Producer::start(discovery, Some(master), config))
    }

    /// Starts the producer's task with `discovery` (and, if known, an open connection to
    /// the master); it finds the master itself otherwise. Needs a Tokio runtime.
    ///
    /// # Panics
    /// If `config` is out of range (see [`ProducerConfig::validate`]).
    #[must_use]
    pub fn start(
        discovery: Discovery,
        master: Option<MasterConn>,
        config: ProducerConfig,
    ) -> Producer {
        if let Err(e) = config.validate() {
            panic!("Producer::start with a bad configuration: {e}");
        }
        let id = config.producer_id.unwrap_or_else(random_producer_id);
        let (tx, rx) = mpsc::channel(COMMAND_QUEUE_MAX);
        let pipeline = Pipeline::new(id, config.first_sequence, config.limits());
        tokio::spawn(drive(pipeline, rx, discovery, master));
        Producer {
            shared: Arc::new(Shared {
                id,
                tx,
                budget: Arc::new(Semaphore::new(config.buffer_bytes_max)),
                buffer_bytes_max: config.buffer_bytes_max,
                wait_bound: Duration::from_millis(config.delivery_timeout_ms),
            }),
        }
    }

    /// The producer id (non-zero).
    #[must_use]
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// Queues `message` for `topic` and returns the [`Delivery`] of its offset. Waits
    /// while the buffer is full (at most the delivery timeout). Messages sent one after
    /// the other to one topic enter the log in that order.
    ///
    /// # Errors
    /// [`ProduceError::Invalid`] (bad topic, message above `MESSAGE_BYTES_MAX`),
    /// [`ProduceError::BufferTimeout`], [`ProduceError::Closed`].
    pub async fn send(
        &self,
        topic: &str,
        message: impl Into<Bytes>,
    ) -> Result<Delivery, ProduceError> {
        let message: Bytes = message.into();
        validate_topic(topic).map_err(|e| ProduceError::Invalid(e.to_string()))?;
        if message.len() > MESSAGE_BYTES_MAX {
            return Err(ProduceError::Invalid(format!(
                "message of {} bytes, the maximum is {MESSAGE_BYTES_MAX}",
                message.len()
            )));
        }
        let s = &self.shared;
        let deadline = Instant::now() + s.wait_bound;
        let permits = (MESSAGE_OVERHEAD_BYTES + message.len()).min(s.buffer_bytes_max);
        let permits = u32::try_from(permits).expect("invariant: buffer_bytes_max <= u32::MAX");
        let budget =
            match tokio::time::timeout_at(deadline, s.budget.clone().acquire_many_owned(permits))
                .await
            {
                Ok(Ok(p)) => p,
                Ok(Err(_)) => return Err(ProduceError::Closed),
                Err(_) => {
                    return Err(ProduceError::BufferTimeout {
                        timeout_ms: millis(s.wait_bound),
                    })
                }
            };
        let (reply, rx) = oneshot::channel();
        let command = Command::Send {
            topic: topic.to_owned(),
            message,
            waiter: Waiter {
                reply,
                _budget: budget,
            },
        };
        match tokio::time::timeout_at(deadline, s.tx.send(command)).await {
            Ok(Ok(())) => Ok(Delivery { rx }),
            Ok(Err(_)) => Err(ProduceError::Closed),
            Err(_) => Err(ProduceError::BufferTimeout {
                timeout_ms: millis(s.wait_bound),
            }),
        }
    }

    /// Seals every open batch and waits until every message sent before this call has
    /// its outcome (each [`Delivery`] resolved). Bounded by the delivery timeout plus
    /// one request timeout.
    ///
    /// # Errors
    /// [`ProduceError::Closed`] if the producer's task is gone.
    pub async fn flush(&self) -> Result<(), ProduceError> {
        let (tx, rx) = oneshot::channel();
        self.shared
            .tx
            .send(Command::Flush(tx))
            .await
            .map_err(|_| ProduceError::Closed)?;
        rx.await.map_err(|_| ProduceError::Closed)
    }

    /// [`Producer::flush`], then drops this handle (the task ends once every clone is
    /// dropped).
    ///
    /// # Errors
    /// As [`Producer::flush`].
    pub async fn close(self) -> Result<(), ProduceError> {
        self.flush().await
    }
}

/// A random non-zero producer id (SipHash with a random key over the time, the process id
/// and a counter).
fn random_producer_id() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let mut h = RandomState::new().build_hasher();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        h.write_u128(now);
        h.write_u32(std::process::id());
        h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
        let id = h.finish();
        if id != 0 {
            return id;
        }
    }
}

fn complete(done: Done<Waiter>) {
    if let Err(e) = &done.result {
        tracing::warn!(sequence = done.sequence, error = %e, "batch failed");
    }
    for (i, w) in done.waiters.into_iter().enumerate() {
        let r = done.result.clone().map(|base| Offset(base.0 + i as u64));
        let _ = w.reply.send(r);
    }
}

type Answer = (u64, Result<ProduceResponse, ClientError>);

/// The producer's task: feeds commands, timers, answers and discovery results to the
/// pipeline and carries out what it says.
async fn drive(
    mut pipeline: Pipeline<Waiter>,
    mut rx: mpsc::Receiver<Command>,
    discovery: Discovery,
    mut master: Option<MasterConn>,
) {
    let mut answers: JoinSet<Answer> = JoinSet::new();
    let mut answer_of: HashMap<tokio::task::Id, u64> = HashMap::new();
    let mut finding: Option<JoinHandle<Result<MasterConn, ClientError>>> = None;
    let mut find_at: Option<Instant> = None;
    let mut backoff = discovery.config().backoff();
    let mut flushes: Vec<(u64, oneshot::Sender<()>)> = Vec::new();
    let mut closed = false;
    if master.is_some() {
        pipeline.recovered();
    }
    loop {
        let now = Instant::now();
        pipeline.seal_due(now);
        for d in pipeline.expire(now) {
            complete(d);
        }
        if let Some(m) = &master {
            while let Some(out) = pipeline.take_next() {
                let sequence = out.sequence;
                match m.client.start_produce(out.request).await {
                    Ok(pending) => {
                        let handle = answers.spawn(async move { (sequence, pending.wait().await) });
                        answer_of.insert(handle.id(), sequence);
                    }
                    Err(e) => {
                        if let Some(d) = pipeline.on_response(sequence, Err(e)) {
                            complete(d);
                        }
                    }
                }
            }
        }
        if let Some(hint) = pipeline.recovery_due() {
            if finding.is_none() {
                if let Some(m) = master.take() {
                    tracing::info!(master = m.master.id.0, addr = %m.master.addr, "looking for the master again");
                }
                let now = Instant::now();
                match find_at {
                    None => find_at = Some(now + backoff.next_delay()),
                    Some(t) if t <= now => {
                        find_at = None;
                        let d = discovery.clone();
                        finding = Some(tokio::spawn(async move { d.find_master_once(hint).await }));
                    }
                    Some(_) => {}
                }
            }
        }
        // Resolve the flushes whose batches are all finished.
        let oldest = pipeline.oldest_unfinished();
        let mut i = 0;
        while i < flushes.len() {
            if oldest.is_none_or(|o| o >= flushes[i].0) {
                let (_, tx) = flushes.swap_remove(i);
                let _ = tx.send(());
            } else {
                i += 1;
            }
        }
        if closed && pipeline.is_idle() && answers.is_empty() {
            return;
        }
        let wakeup = [pipeline.next_wakeup(), find_at]
            .into_iter()
            .flatten()
            .min();
        tokio::select! {
            joined = answers.join_next_with_id(), if !answers.is_empty() => {
                let (sequence, result) = match joined {
                    Some(Ok((id, answer))) => {
                        answer_of.remove(&id);
                        answer
                    }
                    Some(Err(e)) => {
                        let Some(sequence) = answer_of.remove(&e.id()) else { continue };
                        (sequence, Err(ClientError::Closed {
                            addr: String::new(),
                            reason: format!("the task awaiting the answer failed: {e}"),
                        }))
                    }
                    None => continue,
                };
                if result.is_ok() {
                    backoff.reset();
                }
                if let Some(d) = pipeline.on_response(sequence, result) {
                    complete(d);
                }
            }
            found = async { match finding.as_mut() { Some(h) => h.await, None => std::future::pending().await } } => {
                finding = None;
                match found {
                    Ok(Ok(m)) => {
                        tracing::info!(master = m.master.id.0, addr = %m.master.addr, epoch = %m.epoch, "producing to the master");
                        master = Some(m);
                        pipeline.recovered();
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(error = %e, "no master yet");
                        pipeline.discovery_failed(e);
                        find_at = Some(Instant::now() + backoff.next_delay());
                    }
                    Err(e) => {
                        pipeline.discovery_failed(ClientError::Closed {
                            addr: String::new(),
                            reason: format!("the discovery task failed: {e}"),
                        });
                        find_at = Some(Instant::now() + backoff.next_delay());
                    }
                }
            }
            command = rx.recv(), if !closed => match command {
                Some(Command::Send { topic, message, waiter }) => {
                    pipeline.push(&topic, message, waiter, Instant::now());
                }
                Some(Command::Flush(tx)) => {
                    pipeline.seal_all();
                    flushes.push((pipeline.next_sequence(), tx));
                }
                None => {
                    closed = true;
                    pipeline.seal_all();
                }
            },
            () = sleep_until_opt(wakeup) => {}
        }
    }
}

async fn sleep_until_opt(at: Option<Instant>) {
    match at {
        Some(t) => sleep_until(t).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::{BrokerId, ErrorDetail, ErrorResponse};

    fn limits() -> Limits {
        Limits {
            batch_bytes_max: 100,
            batch_messages_max: 3,
            linger: Duration::from_millis(5),
            in_flight_max: 2,
            delivery_timeout: Duration::from_secs(10),
        }
    }

    fn msg(n: usize) -> Bytes {
        Bytes::from(vec![b'x'; n])
    }

    fn ok(base: u64, count: u32) -> Result<ProduceResponse, ClientError> {
        Ok(ProduceResponse {
            base_offset: Offset(base),
            count,
        })
    }

    fn remote(code: ErrorCode) -> ClientError {
        ClientError::Remote(Box::new(ErrorResponse::new(code, "test")))
    }

    fn lost() -> ClientError {
        ClientError::Closed {
            addr: "b1:1".into(),
            reason: "the peer closed the connection".into(),
        }
    }

    /// A pipeline that has found its master.
    fn ready() -> Pipeline<u32> {
        let mut p = Pipeline::new(7, 0, limits());
        assert!(
            p.take_next().is_none(),
            "nothing is sent before the master is found"
        );
        assert_eq!(p.recovery_due(), Some(None));
        p.recovered();
        p
    }

    #[test]
    fn batches_seal_on_count_bytes_and_linger_and_take_consecutive_sequences() {
        let t0 = Instant::now();
        let mut p = ready();
        // Count: the third message of "a" seals it.
        for w in 0..3 {
            p.push("a", msg(1), w, t0);
        }
        // Bytes: 60 + 4 fits, another 60 + 4 would not: the first is sealed alone.
        p.push("b", msg(60), 10, t0);
        p.push("b", msg(60), 11, t0);
        // Linger: "c" waits.
        p.push("c", msg(1), 20, t0);
        let first = p.take_next().expect("batch a");
        assert_eq!(first.request.topic, "a");
        assert_eq!((first.request.producer_id, first.sequence), (7, 0));
        assert_eq!(first.request.messages.len(), 3);
        let second = p.take_next().expect("batch b (first)");
        assert_eq!((second.request.topic.as_str(), second.sequence), ("b", 3));
        assert_eq!(second.request.messages.len(), 1);
        assert!(p.take_next().is_none(), "in-flight bound of 2 reached");
        assert_eq!(p.in_flight(), 2);
        // Linger runs out for "b" (second message) and "c": sealed in topic order.
        assert_eq!(p.next_wakeup(), Some(t0 + Duration::from_millis(5)));
        p.seal_due(t0 + Duration::from_millis(5));
        assert_eq!(p.next_sequence(), 6);
        assert!(p.on_response(0, ok(100, 3)).is_some());
        let third = p.take_next().expect("batch b (second)");
        assert_eq!((third.request.topic.as_str(), third.sequence), ("b", 4));
        // A message alone above batch_bytes_max is its own batch at once.
        p.push("d", msg(500), 30, t0);
        assert_eq!(p.next_sequence(), 7);
    }

    #[test]
    fn an_ack_gives_each_waiter_its_offset_and_a_wrong_count_is_an_error() {
        let t0 = Instant::now();
        let mut p = ready();
        for w in 0..3 {
            p.push("a", msg(1), w, t0);
        }
        p.push("a", msg(1), 3, t0);
        p.seal_all();
        let a = p.take_next().expect("first");
        let b = p.take_next().expect("second");
        // Answers may come in any order; each finds its batch.
        let done = p.on_response(b.sequence, ok(50, 1)).expect("finished");
        assert_eq!(
            (done.waiters, done.result.ok()),
            (vec![3], Some(Offset(50)))
        );
        let done = p.on_response(a.sequence, ok(40, 2)).expect("finished");
        assert!(matches!(
            done.result,
            Err(ProduceError::CountMismatch {
                expected: 3,
                count: 2,
                ..
            })
        ));
        assert!(p.is_idle());
        assert!(
            p.on_response(a.sequence, ok(40, 3)).is_none(),
            "unknown batch"
        );
    }

    #[test]
    fn a_retriable_failure_stops_sending_until_the_rest_drains_then_resends_in_order() {
        let t0 = Instant::now();
        let mut p = ready();
        for i in 0..4 {
            p.push(&format!("t{i}"), msg(1), i, t0);
        }
        p.seal_all();
        let s0 = p.take_next().expect("0");
        let s1 = p.take_next().expect("1");
        // Batch 0: the master stepped down and names broker 2.
        let hint = BrokerInfo {
            id: BrokerId(2),
            addr: "b2:1".into(),
        };
        let not_master = ClientError::Remote(Box::new(ErrorResponse {
            detail: ErrorDetail::NotMaster {
                epoch: quire_proto::Epoch(9),
                master: Some(hint.clone()),
            },
            ..ErrorResponse::new(ErrorCode::NotMaster, "not the master")
        }));
        assert!(p.on_response(s0.sequence, Err(not_master)).is_none());
        assert!(p.take_next().is_none(), "nothing is sent while recovering");
        assert_eq!(p.recovery_due(), None, "batch 1 is still in flight");
        // Batch 1 was stabilized before the step-down: its ack counts.
        let done = p.on_response(s1.sequence, ok(7, 1)).expect("acked");
        assert_eq!(done.result.ok(), Some(Offset(7)));
        assert_eq!(p.recovery_due(), Some(Some(hint)));
        p.recovered();
        // Resend: batch 0 unchanged (same sequence, messages), then 2, then 3.
        let r0 = p.take_next().expect("resend 0");
        assert_eq!(r0.request, s0.request);
        let r2 = p.take_next().expect("2");
        assert_eq!(r2.sequence, 2);
        assert!(p.take_next().is_none());
        // A lost connection on both: recovery again, no hint.
        assert!(p.on_response(r0.sequence, Err(lost())).is_none());
        assert!(p
            .on_response(r2.sequence, Err(remote(ErrorCode::Timeout)))
            .is_none());
        assert_eq!(p.recovery_due(), Some(None));
        p.recovered();
        let order: Vec<u64> = std::iter::from_fn(|| p.take_next().map(|o| o.sequence)).collect();
        assert_eq!(
            order,
            vec![0, 2],
            "oldest first, within the in-flight bound"
        );
    }

    #[test]
    fn a_fatal_refusal_fails_that_batch_alone() {
        let t0 = Instant::now();
        let mut p = ready();
        p.push("a", msg(1), 0, t0);
        p.push("b", msg(1), 1, t0);
        p.seal_all();
        let a = p.take_next().expect("a");
        let b = p.take_next().expect("b");
        let done = p
            .on_response(a.sequence, Err(remote(ErrorCode::MessageTooLarge)))
            .expect("failed");
        let err = done.result.expect_err("refused");
        assert_eq!(err.code(), Some(ErrorCode::MessageTooLarge));
        assert!(!err.is_outcome_unknown());
        assert_eq!(p.recovery_due(), None, "no recovery for a fatal answer");
        assert!(p.on_response(b.sequence, ok(3, 1)).is_some());
        assert!(p.is_idle());
    }

    #[test]
    fn batches_expire_after_the_delivery_timeout_unless_in_flight() {
        let t0 = Instant::now();
        let mut p: Pipeline<u32> = Pipeline::new(7, 40, limits());
        p.push("a", msg(1), 0, t0);
        p.push("b", msg(1), 1, t0 + Duration::from_secs(1));
        p.seal_all();
        p.discovery_failed(ClientError::NoMaster {
            brokers: 2,
            rounds: 1,
            elapsed_ms: 5,
            last: None,
        });
        assert!(p.expire(t0 + Duration::from_millis(9_999)).is_empty());
        assert_eq!(p.next_wakeup(), Some(t0 + Duration::from_secs(10)));
        let done = p.expire(t0 + Duration::from_secs(10));
        assert_eq!(done.len(), 1);
        assert_eq!(done[0].sequence, 40);
        match &done[0].result {
            Err(
                e @ ProduceError::DeliveryTimeout {
                    attempts: 0,
                    last: Some(ClientError::NoMaster { .. }),
                    ..
                },
            ) => {
                assert!(e.is_outcome_unknown());
            }
            other => panic!("expected a delivery timeout, got {other:?}"),
        }
        // In flight at its deadline: it waits for its answer.
        p.recovered();
        let b = p.take_next().expect("b");
        assert!(p.expire(t0 + Duration::from_secs(60)).is_empty());
        assert!(p.on_response(b.sequence, Err(lost())).is_none());
        let done = p.expire(t0 + Duration::from_secs(60));
        assert!(matches!(
            done[0].result,
            Err(ProduceError::DeliveryTimeout {
                attempts: 1,
                last: Some(ClientError::Closed { .. }),
                ..
            })
        ));
        assert!(p.is_idle());
    }

    #[test]
    fn config_ranges_are_checked() {
        assert!(ProducerConfig::default().validate().is_ok());
        for bad in [
            ProducerConfig {
                producer_id: Some(0),
                ..ProducerConfig::default()
            },
            ProducerConfig {
                in_flight_batches_max: IN_FLIGHT_BATCHES_MAX + 1,
                ..ProducerConfig::default()
            },
            ProducerConfig {
                batch_bytes_max: MESSAGE_BYTES_MAX + 1,
                ..ProducerConfig::default()
            },
            ProducerConfig {
                linger_ms: 10,
                delivery_timeout_ms: 10,
                ..ProducerConfig::default()
            },
            ProducerConfig {
                buffer_bytes_max: 10,
                ..ProducerConfig::default()
            },
        ] {
            assert!(
                matches!(bad.validate(), Err(ClientError::InvalidConfig(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn random_producer_ids_are_non_zero_and_differ() {
        let a = random_producer_id();
        let b = random_producer_id();
        assert_ne!(a, 0);
        assert_ne!(a, b);
    }
}
