//! The workload: idempotent producers and consumers of the stabilized log.
//!
//! A producer sends one batch at a time, `(producer_id, sequence..sequence+n)`, to the broker
//! it believes is master, and retries the **same** batch (same id and sequences) after an
//! error or a timeout — at the hinted master, or at another broker — until one attempt is
//! answered ok. Its outcome is then `ok` (with the offsets of every ok answer), `failed` (the
//! master refused the sequences for good) or, if the run ends first, `unknown`. Only `ok`
//! batches must survive; the others may or may not be in the log.
//!
//! A consumer reads one topic from offset 0 on through the broker engine's fetch (long
//! polls included) at the broker it believes is master, and keeps what it was served for
//! the checker's end-of-run check.

use bytes::Bytes;
use quire_broker::engine::FetchReply;
use quire_proto::{FetchRequest, Offset};

use crate::checker::{CursorHistory, ProducedBatch, TopicRead};
use crate::msg::{Msg, NodeId, ProduceError};
use crate::rng::SimRng;

/// Messages a consumer asks for in one fetch.
const FETCH_MESSAGES_MAX: u32 = 32;
/// Message bytes a consumer asks for in one fetch.
const FETCH_BYTES_MAX: u32 = 4096;

/// One batch and what became of it.
#[derive(Clone, Debug)]
pub(crate) struct Batch {
    pub(crate) producer_id: u64,
    pub(crate) sequence: u64,
    pub(crate) topic: String,
    pub(crate) messages: Vec<Bytes>,
    /// When the first attempt went out (world time, ms).
    pub(crate) first_attempt_ms: u64,
    /// Request ids of every attempt.
    pub(crate) attempts: Vec<u64>,
    /// Base offsets of every ok answer.
    pub(crate) oks: Vec<Offset>,
    /// When the first ok arrived.
    pub(crate) ok_ms: Option<u64>,
    /// The master refused the sequences for good.
    pub(crate) failed: bool,
}

impl Batch {
    /// What the checker needs of it.
    pub(crate) fn as_produced(&self) -> ProducedBatch<'_> {
        ProducedBatch {
            producer_id: self.producer_id,
            sequence: self.sequence,
            topic: &self.topic,
            messages: &self.messages,
            oks: &self.oks,
        }
    }
}

/// A producer.
#[derive(Debug)]
pub(crate) struct Producer {
    pub(crate) node: u8,
    pub(crate) producer_id: u64,
    topic: String,
    next_sequence: u64,
    /// Index in the world's batch list of the batch in progress.
    pub(crate) current: Option<usize>,
    /// The attempt waited for.
    pub(crate) awaiting: Option<u64>,
    target: u8,
    next_request: u64,
}

/// An attempt to send: to which broker, what, and its request id (to time it out).
#[derive(Debug)]
pub(crate) struct Attempt {
    pub(crate) to: u8,
    pub(crate) msg: Msg,
    pub(crate) request: u64,
}

impl Producer {
    pub(crate) fn new(node: u8, producer_id: u64, brokers: usize, rng: &mut SimRng) -> Producer {
        Producer {
            node,
            producer_id,
            topic: format!("topic-{}", producer_id % 2),
            next_sequence: 1,
            current: None,
            awaiting: None,
            target: u8::try_from(rng.index(brokers)).expect("few brokers"),
            next_request: 1,
        }
    }

    /// Starts a new batch (registered by the caller in its batch list).
    pub(crate) fn new_batch(&mut self, now_ms: u64, rng: &mut SimRng) -> Batch {
        let n = rng.range(1, 3);
        let sequence = self.next_sequence;
        self.next_sequence += n;
        let messages = (0..n)
            .map(|i| {
                let seq = sequence + i;
                // A quarter of the messages span disk sectors (512 bytes), so a crash can
                // tear one: the WAL's recovery then cuts a torn tail.
                let pad = if rng.chance(0.25) {
                    rng.range(400, 1_500)
                } else {
                    rng.range(0, 40)
                } as usize;
                Bytes::from(format!(
                    "p{}-s{}-{}",
                    self.producer_id,
                    seq,
                    "x".repeat(pad)
                ))
            })
            .collect();
        Batch {
            producer_id: self.producer_id,
            sequence,
            topic: self.topic.clone(),
            messages,
            first_attempt_ms: now_ms,
            attempts: Vec::new(),
            oks: Vec::new(),
            ok_ms: None,
            failed: false,
        }
    }

    /// Sends (again) the batch in progress.
    pub(crate) fn attempt(&mut self, batch: &mut Batch) -> Attempt {
        let request = self.next_request;
        self.next_request += 1;
        batch.attempts.push(request);
        self.awaiting = Some(request);
        Attempt {
            to: self.target,
            request,
            msg: Msg::Produce {
                request,
                producer_id: batch.producer_id,
                sequence: batch.sequence,
                topic: batch.topic.clone(),
                messages: batch.messages.clone(),
            },
        }
    }

    /// An answer to request `request` of the batch in progress (late answers to earlier
    /// attempts count too). Returns whether the batch is finished.
    pub(crate) fn on_answer(
        &mut self,
        batch: &mut Batch,
        request: u64,
        answer: Result<Offset, ProduceError>,
        now_ms: u64,
        brokers: usize,
        rng: &mut SimRng,
    ) -> bool {
        if !batch.attempts.contains(&request) {
            return false;
        }
        match answer {
            Ok(base) => {
                batch.oks.push(base);
                batch.ok_ms.get_or_insert(now_ms);
                self.awaiting = None;
                true
            }
            Err(e) => {
                if self.awaiting != Some(request) {
                    return false;
                }
                self.awaiting = None;
                match e {
                    ProduceError::NotMaster { hint: Some(h) } if usize::from(h) < brokers => {
                        self.target = h;
                    }
                    ProduceError::SequenceGap => {
                        batch.failed = true;
                        return true;
                    }
                    _ => self.retarget(brokers, rng),
                }
                false
            }
        }
    }

    /// The attempt `request` timed out: try another broker.
    pub(crate) fn on_timeout(&mut self, request: u64, brokers: usize, rng: &mut SimRng) -> bool {
        if self.awaiting != Some(request) {
            return false;
        }
        self.awaiting = None;
        self.retarget(brokers, rng);
        true
    }

    fn retarget(&mut self, brokers: usize, rng: &mut SimRng) {
        self.target = u8::try_from(rng.index(brokers)).expect("few brokers");
    }

    /// This producer's process id on the network.
    pub(crate) fn node_id(&self) -> NodeId {
        NodeId::Client(self.node)
    }
}

/// A consumer of one topic: fetches its messages through the broker engine's fetch path
/// (window, store reads, long polls), from offset 0 on, at the broker it believes is
/// master; on a `Trimmed` answer it goes on from the first offset still held. With
/// `--cursors` it also commits its position as a durable cursor now and then, and
/// "restarts": reads its committed cursor and resumes from there (from 0 if none).
#[derive(Debug)]
pub(crate) struct Consumer {
    pub(crate) node: u8,
    pub(crate) topic: String,
    /// The next log offset it wants.
    pub(crate) next: Offset,
    pub(crate) awaiting: Option<u64>,
    next_request: u64,
    /// The broker it fetches from.
    pub(crate) target: u8,
    /// What it was served, in order (for the checker).
    pub(crate) reads: Vec<TopicRead>,
    /// Its cursor's commits and reads (for the checker).
    pub(crate) cursor: CursorHistory,
    /// The commit in flight: its request and offset.
    pub(crate) committing: Option<(u64, Offset)>,
    /// The cursor read in flight (a restart): no fetch until it is answered.
    pub(crate) resuming: Option<u64>,
}

impl Consumer {
    pub(crate) fn new(node: u8, topic: String) -> Consumer {
        Consumer {
            node,
            topic,
            next: Offset::ZERO,
            awaiting: None,
            next_request: 1,
            target: 0,
            reads: Vec::new(),
            cursor: CursorHistory {
                cursor: format!("cursor-{node}"),
                ..CursorHistory::default()
            },
            committing: None,
            resuming: None,
        }
    }

    fn request_id(&mut self) -> u64 {
        let request = self.next_request;
        self.next_request += 1;
        request
    }

    /// A commit of the consumer's position as its cursor.
    pub(crate) fn commit(&mut self) -> (u64, Msg) {
        let request = self.request_id();
        let offset = self.next;
        self.committing = Some((request, offset));
        self.cursor.sent.push(offset);
        let msg = Msg::CommitCursor {
            request,
            topic: self.topic.clone(),
            cursor: self.cursor.cursor.clone(),
            offset,
        };
        (request, msg)
    }

    /// The answer to commit `request`: `ok` once stabilized.
    pub(crate) fn on_committed(&mut self, request: u64, ok: bool) {
        let Some((r, offset)) = self.committing else {
            return;
        };
        if r == request {
            self.committing = None;
            if ok {
                self.cursor.acked.push(offset);
            }
        }
    }

    /// A restart: read the committed cursor, then resume from it.
    pub(crate) fn read_cursor(&mut self) -> (u64, Msg) {
        let request = self.request_id();
        self.resuming = Some(request);
        let msg = Msg::ReadCursor {
            request,
            topic: self.topic.clone(),
            cursor: self.cursor.cursor.clone(),
        };
        (request, msg)
    }

    /// The answer to cursor read `request` (`None`: that broker does not serve); returns
    /// whether it was the one awaited.
    pub(crate) fn on_cursor(
        &mut self,
        request: u64,
        offset: Option<Option<Offset>>,
        brokers: usize,
        rng: &mut SimRng,
    ) -> bool {
        if self.resuming != Some(request) {
            return false;
        }
        self.resuming = None;
        match offset {
            None => self.target = u8::try_from(rng.index(brokers)).expect("few brokers"),
            Some(committed) => {
                self.cursor.read.push(committed);
                self.next = committed.unwrap_or(Offset::ZERO);
                self.reads.push(TopicRead::Resume { from: self.next });
            }
        }
        true
    }

    /// The next fetch: a long poll of `wait_ms` (0: answered at once).
    pub(crate) fn fetch(&mut self, wait_ms: u32) -> (u64, Msg) {
        let request = self.request_id();
        self.awaiting = Some(request);
        let req = FetchRequest {
            records: false,
            topic: self.topic.clone(),
            from_offset: self.next,
            max_messages: FETCH_MESSAGES_MAX,
            max_bytes: FETCH_BYTES_MAX,
            wait_ms,
        };
        (request, Msg::Fetch { request, req })
    }

    /// The answer to fetch `request`; returns whether it was the one awaited.
    pub(crate) fn on_answer(
        &mut self,
        request: u64,
        reply: FetchReply,
        brokers: usize,
        rng: &mut SimRng,
    ) -> bool {
        if self.awaiting != Some(request) {
            return false;
        }
        self.awaiting = None;
        match reply {
            FetchReply::Messages(m) => {
                for (offset, message) in m.messages {
                    self.reads.push(TopicRead::Message { offset, message });
                }
                self.next = self.next.max(m.next_offset);
            }
            FetchReply::Trimmed { first, .. } => {
                self.reads.push(TopicRead::Trimmed { first });
                self.next = self.next.max(first);
            }
            FetchReply::NotMaster => {
                self.target = u8::try_from(rng.index(brokers)).expect("few brokers");
            }
            FetchReply::Unavailable => {}
        }
        true
    }

    /// The fetch `request` timed out: try another broker.
    pub(crate) fn on_timeout(&mut self, request: u64, brokers: usize, rng: &mut SimRng) -> bool {
        if self.committing.is_some_and(|(r, _)| r == request) {
            self.committing = None;
            return false;
        }
        if self.resuming == Some(request) {
            self.resuming = None;
        } else if self.awaiting == Some(request) {
            self.awaiting = None;
        } else {
            return false;
        }
        self.target = u8::try_from(rng.index(brokers)).expect("few brokers");
        true
    }
}
