//! The no-loss checker: the rules every run must keep, checked online where cheap and over
//! the whole history at the end.
//!
//! Online, on every event a master stabilizes, a slave applies or a consumer reads:
//! - **one log**: an offset never maps to two events (epoch, kind, payload) across all
//!   masters' stabilized outputs, all slaves' applied events and all consumers' reads;
//!   stabilized offsets are contiguous from 0 (so every consumer sees a prefix of one total
//!   order);
//! - **one master per epoch**: at most one broker process (broker id *and* incarnation)
//!   stabilizes anything in a given epoch.
//!
//! At the end, over the recorded history of every produce attempt and its outcome:
//! - every **acknowledged** message (a batch answered ok) is served to consumers exactly
//!   once, at the offset the ok answer named, with the payload sent, in per-producer
//!   sequence order — "served" as the broker state indexes it after applying the whole
//!   stabilized log (its dedup and supersede rules decide which copy of a retried
//!   message consumers get);
//! - no message in the log was **never sent** (same producer, sequence, topic and bytes);
//! - **no future loss**: for every fence quorum of the voting stores (identity still bound,
//!   disk readable), the most up-to-date durable log among them — the log any next master
//!   would adopt — holds the whole stabilized log.
//!
//! The checker is public so that the multi-process fault tests (quire-tests) judge the real
//! binaries by literally the same rules: they record every produce attempt and its outcome,
//! read the final log back from the stores and what consumers were served, and feed the same
//! [`Checker`] ([`Checker::observed`], [`Checker::acked_in_epoch`],
//! [`Checker::consumed_messages`], [`Checker::check_history`], [`Checker::check_quorums`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use bytes::Bytes;
use quire_broker::core::Event;
use quire_broker::state::{Applied, BrokerState};
use quire_proto::{Epoch, EventBody, EventKind, LogPosition, Offset, TrimEvent};

/// One produce batch and what became of it, as the end-of-run checks see it: the
/// `(producer_id, sequence..sequence + messages.len())` sent to `topic`, and the base offset
/// of every ok answer to any attempt of it (empty: failed or unknown, which may or may not
/// be in the log).
#[derive(Clone, Copy, Debug)]
pub struct ProducedBatch<'a> {
    /// Producer id.
    pub producer_id: u64,
    /// Sequence of the first message.
    pub sequence: u64,
    /// Topic.
    pub topic: &'a str,
    /// The message bytes, in sequence order.
    pub messages: &'a [Bytes],
    /// Base offsets of every ok answer.
    pub oks: &'a [Offset],
}

/// One rule broken in a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Violation {
    /// Two different events at one offset.
    OffsetTwoEvents {
        /// The offset.
        offset: u64,
        /// The event seen first.
        first: String,
        /// The other one.
        second: String,
        /// Who reported the second one.
        by: String,
    },
    /// A stabilized offset was reported past the end of what was stabilized before.
    StabilizedGap {
        /// The offset.
        offset: u64,
        /// The length of the stabilized log.
        known: u64,
        /// Who reported it.
        by: String,
    },
    /// Two broker processes stabilized events in one epoch.
    TwoMastersInEpoch {
        /// The epoch.
        epoch: u64,
        /// `(broker, incarnation)` of the first.
        first: (u8, u32),
        /// `(broker, incarnation)` of the second.
        second: (u8, u32),
    },
    /// Two broker incarnations sent fences with one epoch (an epoch is unique per master).
    EpochReused {
        /// The epoch.
        epoch: u64,
        /// `(broker, incarnation)` that used it first.
        first: (u8, u32),
        /// `(broker, incarnation)` that used it again.
        second: (u8, u32),
    },
    /// A store acks an append through an offset where it does not hold the master's entry
    /// (a persisted ack says "I hold your log through X").
    AckClaimsUnheld {
        /// The store.
        store: u8,
        /// The master's epoch.
        epoch: u64,
        /// The acked offset.
        through: u64,
        /// The epoch of the store's entry there.
        held: Option<u64>,
        /// The epoch of the master's entry there.
        master_has: Option<u64>,
    },
    /// A store's recovery cut its log at an entry whose bits were flipped while later
    /// entries followed it: sealed data taken for a torn tail (the WAL must refuse to
    /// start on a bad record before valid ones; docs/format.md, "Recovery rules").
    SealedEntryCut {
        /// The store.
        store: u8,
        /// The flipped entry the cut dropped.
        offset: u64,
        /// Where the cut began.
        cut_from: u64,
    },
    /// An acknowledged cursor commit is not in the stabilized log.
    CursorCommitLost {
        /// The consumer.
        consumer: u8,
        /// The offset it committed.
        offset: u64,
    },
    /// A cursor read answered an offset no stabilized commit of that cursor holds.
    CursorReadNotCommitted {
        /// The consumer.
        consumer: u8,
        /// The offset the read answered.
        offset: u64,
    },
    /// A consumer was given an event that is not the stabilized one at its offset.
    ConsumerNotPrefix {
        /// The consumer.
        consumer: u8,
        /// The offset.
        offset: u64,
        /// What went wrong.
        why: String,
    },
    /// An acknowledged message is missing or different at its acked offset.
    AckedLost {
        /// Producer id.
        producer_id: u64,
        /// Sequence.
        sequence: u64,
        /// The offset the ok answer named.
        offset: u64,
        /// What is there instead.
        found: String,
    },
    /// An acknowledged message is given to consumers more or less than once.
    AckedNotExactlyOnce {
        /// Producer id.
        producer_id: u64,
        /// Sequence.
        sequence: u64,
        /// How many times consumers would see it.
        times: u64,
    },
    /// A producer's acknowledged messages are out of sequence order in the log.
    ProducerOrder {
        /// Producer id.
        producer_id: u64,
        /// The sequence that comes too early.
        sequence: u64,
        /// Its offset.
        offset: u64,
        /// The offset of a lower sequence after it.
        before_offset: u64,
    },
    /// A message in the log that no producer sent.
    NeverSent {
        /// The offset.
        offset: u64,
        /// What it holds.
        what: String,
    },
    /// A fence quorum of voting stores whose most up-to-date log lacks a stabilized event:
    /// the next master could lose it.
    QuorumLacksStabilized {
        /// The stores of the quorum.
        quorum: Vec<u8>,
        /// The store whose log would be adopted.
        adopted: u8,
        /// The first stabilized offset it lacks or holds differently.
        offset: u64,
    },
    /// The cluster did not stabilize new messages in time after the faults stopped.
    NoProgress {
        /// What was missing.
        why: String,
    },
    /// A process asserted an invariant (a panic in a core or in the simulation).
    Panic {
        /// The panic message.
        message: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::OffsetTwoEvents {
                offset,
                first,
                second,
                by,
            } => write!(
                f,
                "offset {offset} maps to two events: {first} and {second} (from {by})"
            ),
            Violation::StabilizedGap { offset, known, by } => write!(
                f,
                "{by} stabilized offset {offset} but only {known} offsets were stabilized before"
            ),
            Violation::TwoMastersInEpoch {
                epoch,
                first,
                second,
            } => write!(
                f,
                "two masters acked in epoch {epoch:#x}: B{} (incarnation {}) and B{} (incarnation {})",
                first.0 + 1,
                first.1,
                second.0 + 1,
                second.1
            ),
            Violation::EpochReused {
                epoch,
                first,
                second,
            } => write!(
                f,
                "epoch {epoch:#x} used by two takeovers: B{} (incarnation {}) and B{} (incarnation {})",
                first.0 + 1,
                first.1,
                second.0 + 1,
                second.1
            ),
            Violation::AckClaimsUnheld {
                store,
                epoch,
                through,
                held,
                master_has,
            } => write!(
                f,
                "S{store} acks epoch {epoch:#x} through {through} but holds an entry of epoch {held:x?} there, the master {master_has:x?}"
            ),
            Violation::ConsumerNotPrefix {
                consumer,
                offset,
                why,
            } => write!(f, "consumer C{consumer} at offset {offset}: {why}"),
            Violation::AckedLost {
                producer_id,
                sequence,
                offset,
                found,
            } => write!(
                f,
                "acknowledged message p{producer_id}/s{sequence} is not at its offset {offset}: found {found}"
            ),
            Violation::AckedNotExactlyOnce {
                producer_id,
                sequence,
                times,
            } => write!(
                f,
                "acknowledged message p{producer_id}/s{sequence} is delivered {times} times"
            ),
            Violation::ProducerOrder {
                producer_id,
                sequence,
                offset,
                before_offset,
            } => write!(
                f,
                "producer {producer_id}: sequence {sequence} at offset {offset} comes after a higher sequence at offset {before_offset}"
            ),
            Violation::NeverSent { offset, what } => {
                write!(f, "offset {offset} holds a message never sent: {what}")
            }
            Violation::QuorumLacksStabilized {
                quorum,
                adopted,
                offset,
            } => write!(
                f,
                "fence quorum {quorum:?} would adopt S{adopted}'s log, which lacks stabilized offset {offset}"
            ),
            Violation::SealedEntryCut {
                store,
                offset,
                cut_from,
            } => write!(
                f,
                "S{store}'s recovery cut its log from offset {cut_from}, dropping the flipped entry at {offset} and the valid entries after it"
            ),
            Violation::CursorCommitLost { consumer, offset } => write!(
                f,
                "consumer C{consumer}'s acknowledged cursor commit of offset {offset} is not in the stabilized log"
            ),
            Violation::CursorReadNotCommitted { consumer, offset } => write!(
                f,
                "consumer C{consumer}'s cursor read answered offset {offset}, which no stabilized commit holds"
            ),
            Violation::NoProgress { why } => write!(f, "liveness: {why}"),
            Violation::Panic { message } => write!(f, "panic: {message}"),
        }
    }
}

/// A short description of an event, for violations.
pub(crate) fn describe(e: &Event) -> String {
    let what = match EventBody::decode(e.kind, &e.payload) {
        Ok(EventBody::Message(m)) => format!("message p{}/s{}", m.producer_id, m.sequence),
        Ok(EventBody::EpochStart(s)) => format!("epoch-start of B{}", s.broker.0),
        Ok(other) => format!("{:?}", other.kind()),
        Err(_) => "undecodable".into(),
    };
    format!("{what} (epoch {:#x})", e.epoch.0)
}

/// The checker's state. See the module docs.
#[derive(Debug, Default)]
pub struct Checker {
    /// The stabilized log, by offset.
    log: Vec<Event>,
    ackers: BTreeMap<Epoch, (u8, u32)>,
    fencers: BTreeMap<Epoch, (u8, u32)>,
    pub(crate) violations: Vec<Violation>,
    /// Messages verified at the end.
    pub(crate) messages_checked: u64,
    /// Reads consumers were served of a copy the topic no longer indexes at the end: the
    /// adopted prefix of a batch a failover cut, served before the batch was written again
    /// (at-least-once).
    pub(crate) superseded_reads: u64,
    /// What consumers of a topic were served: `(consumer, topic, reads)`, checked at the
    /// end against the broker state's index of the stabilized log.
    topic_reads: Vec<TopicReads>,
    /// `(consumer, topic, its cursor's history)`.
    cursors: Vec<(u8, String, CursorHistory)>,
}

/// What one consumer read of one topic: `(consumer, topic, reads in order)`.
type TopicReads = (u8, String, Vec<TopicRead>);

/// One thing a consumer of a topic was served, in the order it was served.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TopicRead {
    /// The message at log offset `offset`.
    Message {
        /// Its log offset.
        offset: Offset,
        /// Its bytes.
        message: Bytes,
    },
    /// "Trimmed": the offsets asked for are gone; `first` is the first one still held. The
    /// consumer goes on from there: the messages it skips must all be below the trim point
    /// of the stabilized log.
    Trimmed {
        /// The first offset the broker still serves.
        first: Offset,
    },
    /// The consumer restarted and resumes at `from` (its committed cursor, or 0): what it
    /// reads next is checked from there.
    Resume {
        /// Where it resumes.
        from: Offset,
    },
}

/// One consumer's durable cursor: the offsets it asked to commit, those acknowledged
/// (stabilized), and what its cursor reads answered, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CursorHistory {
    /// The cursor's name (its topic is the consumer's).
    pub cursor: String,
    /// Offsets sent in commits.
    pub sent: Vec<Offset>,
    /// Offsets whose commits were acknowledged.
    pub acked: Vec<Offset>,
    /// What each cursor read answered (`None`: no commit yet).
    pub read: Vec<Option<Offset>>,
}

impl Checker {
    /// Keeps at most this many violations (the first ones tell the story).
    const VIOLATIONS_MAX: usize = 16;

    fn violate(&mut self, v: Violation) {
        if self.violations.len() < Self::VIOLATIONS_MAX {
            self.violations.push(v);
        }
    }

    /// A store's start cut a torn tail from `cut_from` that took the flipped sealed entry
    /// at `offset` with it.
    pub fn sealed_entry_cut(&mut self, store: u8, offset: Offset, cut_from: Offset) {
        self.violate(Violation::SealedEntryCut {
            store,
            offset: offset.0,
            cut_from: cut_from.0,
        });
    }

    /// A checker that has seen nothing.
    pub fn new() -> Checker {
        Checker::default()
    }

    /// Length of the stabilized log.
    pub fn stabilized_len(&self) -> u64 {
        self.log.len() as u64
    }

    /// The rules broken so far (at most `VIOLATIONS_MAX`, the first ones).
    pub fn violations(&self) -> &[Violation] {
        &self.violations
    }

    /// Messages verified by the end-of-run checks (each logged message and each acknowledged
    /// one counts once per check).
    pub fn messages_checked(&self) -> u64 {
        self.messages_checked
    }

    /// `events` are stabilized (reported by `by`, for messages): each must be the one
    /// event ever seen at its offset, and they extend the stabilized log contiguously.
    pub fn observed(&mut self, events: &[Event], by: &str) {
        for e in events {
            self.record(e, by);
        }
    }

    /// Broker `broker` (0-based), incarnation `boot`, acknowledged something as master of
    /// `epoch`: at most one broker process may do so per epoch.
    pub fn acked_in_epoch(&mut self, broker: u8, boot: u32, epoch: Epoch) {
        match self.ackers.get(&epoch) {
            Some(&first) if first != (broker, boot) => self.violate(Violation::TwoMastersInEpoch {
                epoch: epoch.0,
                first,
                second: (broker, boot),
            }),
            Some(_) => {}
            None => {
                self.ackers.insert(epoch, (broker, boot));
            }
        }
    }

    /// Consumer `consumer` was served `reads` — `(offset, message bytes)` in the order it
    /// read them — from `topic`, starting at the topic's first message. Checked by
    /// [`Checker::check_history`]: they must be the first messages the broker state indexes
    /// for `topic` after applying the stabilized log (a prefix of one total order).
    pub fn consumed_messages(&mut self, consumer: u8, topic: &str, reads: Vec<(Offset, Bytes)>) {
        let reads = reads
            .into_iter()
            .map(|(offset, message)| TopicRead::Message { offset, message })
            .collect();
        self.consumed_topic(consumer, topic, reads);
    }

    /// Consumer `consumer` was served `reads` from `topic`, starting at offset 0, with the
    /// "trimmed" answers among them: as [`Checker::consumed_messages`], except that after a
    /// `Trimmed { first }` the reads go on at the first message at or after `first`, and
    /// `first` may not exceed the stabilized log's trim point.
    pub fn consumed_topic(&mut self, consumer: u8, topic: &str, reads: Vec<TopicRead>) {
        self.topic_reads.push((consumer, topic.to_owned(), reads));
    }

    /// Consumer `consumer`'s cursor on `topic` did `history` (checked by
    /// [`Checker::check_history`]).
    pub fn consumed_cursor(&mut self, consumer: u8, topic: &str, history: CursorHistory) {
        self.cursors.push((consumer, topic.to_owned(), history));
    }

    /// Trim events of the stabilized log that carry a part of a checkpoint written in
    /// parts.
    #[must_use]
    pub fn checkpoint_parts(&self) -> u64 {
        self.log
            .iter()
            .filter(|e| e.kind == EventKind::Trim)
            .filter(|e| {
                matches!(
                    EventBody::decode(EventKind::Trim, &e.payload),
                    Ok(EventBody::Trim(TrimEvent { part: Some(_), .. }))
                )
            })
            .count() as u64
    }

    /// The trim point of the stabilized log: the highest `before` of its Trim events (0:
    /// nothing trimmed). Stores may delete whole segments below it.
    #[must_use]
    pub fn trim_point(&self) -> Offset {
        self.log
            .iter()
            .filter(|e| e.kind == EventKind::Trim)
            .filter_map(|e| match EventBody::decode(EventKind::Trim, &e.payload) {
                Ok(EventBody::Trim(t)) => Some(t.before),
                _ => None,
            })
            .max()
            .unwrap_or(Offset::ZERO)
    }

    fn record(&mut self, e: &Event, by: &str) {
        let known = self.log.len() as u64;
        if e.offset.0 < known {
            let have = &self.log[e.offset.0 as usize];
            if have.epoch != e.epoch || have.kind != e.kind || have.payload != e.payload {
                let v = Violation::OffsetTwoEvents {
                    offset: e.offset.0,
                    first: describe(have),
                    second: describe(e),
                    by: by.to_owned(),
                };
                self.violate(v);
            }
        } else if e.offset.0 == known {
            self.log.push(e.clone());
        } else {
            self.violate(Violation::StabilizedGap {
                offset: e.offset.0,
                known,
                by: by.to_owned(),
            });
        }
    }

    /// A master (broker `broker`, incarnation `boot`) of `epoch` stabilized `events`.
    pub(crate) fn stabilized(&mut self, broker: u8, boot: u32, epoch: Epoch, events: &[Event]) {
        self.acked_in_epoch(broker, boot, epoch);
        let by = format!("master B{} of epoch {:#x}", broker + 1, epoch.0);
        for e in events {
            self.record(e, &by);
        }
    }

    /// Broker `broker` (incarnation `boot`) fences with `epoch`.
    pub(crate) fn fencing(&mut self, broker: u8, boot: u32, epoch: Epoch) {
        match self.fencers.get(&epoch) {
            Some(&first) if first != (broker, boot) => {
                self.violate(Violation::EpochReused {
                    epoch: epoch.0,
                    first,
                    second: (broker, boot),
                });
                self.fencers.insert(epoch, (broker, boot));
            }
            Some(_) => {}
            None => {
                self.fencers.insert(epoch, (broker, boot));
            }
        }
    }

    /// A store claims to hold a master's entry at `through` (an entry of epoch `held`),
    /// where the master's log has an entry of epoch `master_has`.
    pub(crate) fn ack_claim(
        &mut self,
        store: u8,
        epoch: Epoch,
        through: Offset,
        held: Option<Epoch>,
        master_has: Option<Epoch>,
    ) {
        if held != master_has || held.is_none() {
            self.violate(Violation::AckClaimsUnheld {
                store,
                epoch: epoch.0,
                through: through.0,
                held: held.map(|e| e.0),
                master_has: master_has.map(|e| e.0),
            });
        }
    }

    /// A slave applied `events`.
    pub(crate) fn applied(&mut self, broker: u8, events: &[Event]) {
        let by = format!("slave B{}", broker + 1);
        for e in events {
            self.record(e, &by);
        }
    }

    /// The end-of-run checks over the produce history. What consumers are served is what
    /// the broker state indexes after applying the whole stabilized log (its dedup and
    /// supersede rules decide which copy of a retried message is served).
    pub fn check_history(&mut self, batches: &[ProducedBatch<'_>]) {
        // What was sent: (producer, sequence) -> (topic, bytes).
        let mut sent: BTreeMap<(u64, u64), (&str, &Bytes)> = BTreeMap::new();
        for b in batches {
            for (i, m) in b.messages.iter().enumerate() {
                sent.insert((b.producer_id, b.sequence + i as u64), (b.topic, m));
            }
        }
        let mut problems = Vec::new();
        // Every message in the log was sent; offset -> (producer, sequence).
        let mut at: Vec<Option<(u64, u64)>> = Vec::with_capacity(self.log.len());
        // Applied with every Trim event made a no-op (trim point 0, no checkpoint): the
        // index then holds every message, the trimmed ones too (consumers' reads are checked
        // against it, with trimmed gaps allowed below the trim point).
        let mut state = BrokerState::new();
        let trim_point = self.trim_point();
        // Every offset each topic indexed at some point (a superseded copy of a cut batch's
        // prefix was served until the rewrite: a consumer may have read it).
        let mut ever_indexed: BTreeMap<String, BTreeSet<Offset>> = BTreeMap::new();
        let no_trim = {
            let mut b = bytes::BytesMut::new();
            EventBody::Trim(TrimEvent::plain(Offset::ZERO))
                .encode(&mut b)
                .expect("invariant: a plain trim event encodes");
            b.freeze()
        };
        for e in &self.log {
            if e.kind == EventKind::Trim {
                let mut plain = e.clone();
                plain.payload = no_trim.clone().into();
                state.apply(&plain);
            } else if let Applied::Message { topic } = state.apply(e) {
                ever_indexed.entry(topic).or_default().insert(e.offset);
            }
            let Ok(EventBody::Message(m)) = EventBody::decode(e.kind, &e.payload) else {
                at.push(None);
                continue;
            };
            at.push(Some((m.producer_id, m.sequence)));
            self.messages_checked += 1;
            match sent.get(&(m.producer_id, m.sequence)) {
                Some(&(topic, bytes)) if topic == m.topic && *bytes == m.message => {}
                _ => problems.push(Violation::NeverSent {
                    offset: e.offset.0,
                    what: describe(e),
                }),
            }
        }
        // What consumers are served: (producer, sequence) -> offsets.
        let mut served: BTreeMap<(u64, u64), Vec<u64>> = BTreeMap::new();
        let topics: Vec<String> = state.topics().map(|(t, _)| t.to_owned()).collect();
        for t in &topics {
            for o in state.topic_offsets(t, Offset::ZERO, usize::MAX) {
                if let Some(Some(key)) = at.get(o.0 as usize) {
                    served.entry(*key).or_default().push(o.0);
                }
            }
        }
        let mut by_producer: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
        for b in batches.iter().filter(|b| !b.oks.is_empty()) {
            let oks: &[Offset] = b.oks;
            for i in 0..b.messages.len() as u64 {
                let key = (b.producer_id, b.sequence + i);
                self.messages_checked += 1;
                let offsets = served.get(&key).map_or(&[][..], Vec::as_slice);
                for base in oks {
                    let offset = base.0 + i;
                    if !offsets.contains(&offset) {
                        problems.push(Violation::AckedLost {
                            producer_id: key.0,
                            sequence: key.1,
                            offset,
                            found: match self.log.get(offset as usize) {
                                Some(e) if at[offset as usize] == Some(key) => {
                                    format!("{}, not served to consumers", describe(e))
                                }
                                Some(e) => describe(e),
                                None => "nothing (not stabilized)".into(),
                            },
                        });
                    }
                }
                if offsets.len() != 1 {
                    problems.push(Violation::AckedNotExactlyOnce {
                        producer_id: key.0,
                        sequence: key.1,
                        times: offsets.len() as u64,
                    });
                }
                if let Some(&o) = offsets.first() {
                    by_producer.entry(key.0).or_default().push((key.1, o));
                }
            }
        }
        // Cursors: every acknowledged commit is a stabilized CursorCommit event, and every
        // value a cursor read answered is one (a master answers from its applied state).
        let mut commits: BTreeMap<(&str, &str), BTreeSet<Offset>> = BTreeMap::new();
        for e in self
            .log
            .iter()
            .filter(|e| e.kind == EventKind::CursorCommit)
        {
            if let Ok(EventBody::CursorCommit(c)) =
                EventBody::decode(EventKind::CursorCommit, &e.payload)
            {
                let key = self
                    .cursors
                    .iter()
                    .find(|(_, t, h)| *t == c.topic && h.cursor == c.cursor)
                    .map(|(_, t, h)| (t.as_str(), h.cursor.as_str()));
                if let Some(key) = key {
                    commits.entry(key).or_default().insert(c.offset);
                }
            }
        }
        let none = BTreeSet::new();
        for (consumer, topic, h) in &self.cursors {
            let stabilized = commits
                .get(&(topic.as_str(), h.cursor.as_str()))
                .unwrap_or(&none);
            if let Some(&offset) = h.acked.iter().find(|o| !stabilized.contains(o)) {
                problems.push(Violation::CursorCommitLost {
                    consumer: *consumer,
                    offset: offset.0,
                });
            }
            if let Some(&Some(offset)) = h
                .read
                .iter()
                .find(|r| r.is_some_and(|o| !stabilized.contains(&o)))
            {
                problems.push(Violation::CursorReadNotCommitted {
                    consumer: *consumer,
                    offset: offset.0,
                });
            }
        }
        // Consumers of a topic read what the state indexes for it, in order, from the start,
        // skipping only what a trimmed answer skipped (below the trim point).
        for (consumer, topic, reads) in std::mem::take(&mut self.topic_reads) {
            let index = state.topic_offsets(&topic, Offset::ZERO, usize::MAX);
            let empty = BTreeSet::new();
            let ever = ever_indexed.get(&topic).unwrap_or(&empty);
            self.superseded_reads += reads
                .iter()
                .filter(|r| {
                    matches!(r, TopicRead::Message { offset, .. } if index.binary_search(offset).is_err())
                })
                .count() as u64;
            if let Some(v) = self.check_reads(consumer, &topic, &reads, (&index, ever), trim_point)
            {
                problems.push(v);
            }
        }
        // Per-producer order of acknowledged messages.
        for (producer_id, mut seqs) in by_producer {
            seqs.sort_unstable();
            for w in seqs.windows(2) {
                if w[1].1 < w[0].1 {
                    problems.push(Violation::ProducerOrder {
                        producer_id,
                        sequence: w[0].0,
                        offset: w[0].1,
                        before_offset: w[1].1,
                    });
                }
            }
        }
        for v in problems {
            self.violate(v);
        }
    }

    /// One consumer's reads of `topic` against `index` (the topic's message offsets once
    /// the whole log is applied, in log order) and `ever` (every offset the topic indexed
    /// at some point); the first rule broken. The reads must go up in offset, each an
    /// offset the topic indexed with the bytes sent, skipping no offset of `index` except
    /// below a trimmed answer's `first` (itself at most the trim point). A read not in
    /// `index` is a superseded copy, served until the rewrite (at-least-once).
    fn check_reads(
        &self,
        consumer: u8,
        topic: &str,
        reads: &[TopicRead],
        (index, ever): (&[Offset], &BTreeSet<Offset>),
        trim_point: Offset,
    ) -> Option<Violation> {
        let broken = |offset: Offset, why: String| {
            Some(Violation::ConsumerNotPrefix {
                consumer,
                offset: offset.0,
                why,
            })
        };
        let mut at = 0usize;
        let mut last: Option<Offset> = None;
        for read in reads {
            let (offset, message) = match read {
                TopicRead::Trimmed { first } => {
                    if *first > trim_point {
                        return broken(
                            *first,
                            format!(
                                "told {topic:?} is trimmed below {} but the stabilized log's trim point is {}",
                                first.0, trim_point.0
                            ),
                        );
                    }
                    at = at.max(index.partition_point(|o| o < first));
                    continue;
                }
                TopicRead::Resume { from } => {
                    last = None;
                    at = index.partition_point(|o| o < from);
                    continue;
                }
                TopicRead::Message { offset, message } => (*offset, message),
            };
            if last.is_some_and(|l| offset <= l) {
                return broken(
                    offset,
                    format!("read after offset {}", last.map_or(0, |l| l.0)),
                );
            }
            last = Some(offset);
            if let Some(skipped) = index.get(at).filter(|&&o| o < offset) {
                return broken(
                    offset,
                    format!("skipped message {at} of {topic:?} at offset {}", skipped.0),
                );
            }
            if !ever.contains(&offset) {
                return broken(offset, format!("{topic:?} never indexed this offset"));
            }
            let ok = self.log.get(offset.0 as usize).is_some_and(|e| {
                matches!(
                    EventBody::decode(e.kind, &e.payload),
                    Ok(EventBody::Message(m)) if m.topic == topic && m.message == *message
                )
            });
            if !ok {
                return broken(offset, "served other bytes than the log holds".to_owned());
            }
            if index.get(at) == Some(&offset) {
                at += 1;
            }
        }
        None
    }

    /// The end-of-run durability check: `voters` are `(store index, durable log, marked)`
    /// of the stores that may still vote (`marked`: carries a tail-cut mark, or will at its
    /// next start), out of `stores` stores. Every set of voters a takeover may complete
    /// with — at least `fence_quorum` unmarked ones, or every store — must adopt a log
    /// holding the stabilized log.
    ///
    /// # Panics
    /// If `voters` has more entries than `stores`.
    pub fn check_quorums(
        &mut self,
        voters: &[(u8, &[quire_proto::Event], bool)],
        fence_quorum: usize,
        stores: usize,
    ) {
        if fence_quorum == 0 {
            return;
        }
        let trim_point = self.trim_point();
        let n = voters.len();
        for mask in 1u32..(1 << n) {
            let members: Vec<usize> = (0..n).filter(|i| mask & (1 << i) != 0).collect();
            let unmarked = members.iter().filter(|&&i| !voters[i].2).count();
            if !quire_broker::core::takeover::fence_quorum_reached(
                unmarked,
                members.len(),
                stores,
                fence_quorum,
            ) {
                continue;
            }
            // Raft's order, the lowest store on ties (as the takeover core picks).
            let key = |i: usize| {
                voters[i].1.last().map(|e| {
                    LogPosition {
                        epoch: e.epoch,
                        offset: e.offset,
                    }
                    .up_to_date_key()
                })
            };
            let mut best = members[0];
            for &i in &members[1..] {
                if key(i) > key(best) {
                    best = i;
                }
            }
            let (store, entries, _) = voters[best];
            // A store's log starts where its retention deleted up to (never above the trim
            // point); what is below the trim point may be gone.
            let base = entries.first().map_or(0, |e| e.offset.0);
            let lacks = self.log[trim_point.0.min(self.log.len() as u64) as usize..]
                .iter()
                .find(|s| {
                    s.offset
                        .0
                        .checked_sub(base)
                        .and_then(|i| entries.get(usize::try_from(i).ok()?))
                        .is_none_or(|e| {
                            e.epoch != s.epoch || e.kind != s.kind || e.payload != s.payload
                        })
                });
            if let Some(s) = lacks {
                let v = Violation::QuorumLacksStabilized {
                    quorum: members.iter().map(|&i| voters[i].0).collect(),
                    adopted: store,
                    offset: s.offset.0,
                };
                self.violate(v);
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use quire_proto::{CursorCommitEvent, Epoch};

    use super::*;

    fn commit_event(offset: u64, committed: u64) -> Event {
        let mut payload = BytesMut::new();
        EventBody::CursorCommit(CursorCommitEvent {
            topic: "t".to_owned(),
            cursor: "c".to_owned(),
            offset: Offset(committed),
        })
        .encode(&mut payload)
        .expect("encodes");
        Event {
            epoch: Epoch(1),
            offset: Offset(offset),
            kind: EventKind::CursorCommit,
            payload: payload.freeze().into(),
        }
    }

    #[test]
    fn cursor_commits_must_be_stabilized_and_reads_must_answer_a_stabilized_commit() {
        let mut checker = Checker::new();
        checker.stabilized(0, 1, Epoch(1), &[commit_event(0, 5)]);
        checker.consumed_cursor(
            0,
            "t",
            CursorHistory {
                cursor: "c".to_owned(),
                sent: vec![Offset(5), Offset(7), Offset(9)],
                acked: vec![Offset(5), Offset(7)],
                read: vec![None, Some(Offset(5)), Some(Offset(9))],
            },
        );
        checker.check_history(&[]);
        let v = checker.violations();
        assert!(
            v.contains(&Violation::CursorCommitLost {
                consumer: 0,
                offset: 7
            }),
            "{v:?}"
        );
        assert!(
            v.contains(&Violation::CursorReadNotCommitted {
                consumer: 0,
                offset: 9
            }),
            "{v:?}"
        );
        assert_eq!(
            v.len(),
            2,
            "commit 5 and the reads of None and 5 are fine: {v:?}"
        );
    }
}
