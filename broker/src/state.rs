//! Broker state: a deterministic function of the stabilized events (DESIGN.md "Broker
//! state").
//!
//! Every broker — the master on [`crate::core::MasterCommand::Stabilized`], a slave on
//! [`crate::core::FollowerCommand::Apply`] — feeds the stabilized events, in offset order,
//! to [`BrokerState::apply`]; equal event sequences give equal states, so a slave that
//! takes over serves exactly what the old master served. Nothing here does I/O or reads a
//! clock, and no decision depends on a hash map's iteration order.
//!
//! What the state holds:
//! - **topics**, created by their first message (or a topic-admin create event), each with
//!   the log offsets of its messages (kept as runs of consecutive offsets, so a topic fed
//!   by one producer costs a few bytes however long it is);
//! - **durable consumer cursors** `(topic, cursor) → offset`, set by cursor-commit events;
//! - the **idempotent-producer table** `producer_id → (last sequence, recent runs)`: a run
//!   is a stretch of messages whose sequences and offsets both go up by one, so a retried
//!   batch that lies inside a remembered run gets its original offsets back
//!   ([`BrokerState::dedup`]);
//! - the voter set and master of the last epoch-start event;
//! - the **trim point**: the highest `before` of the Trim events applied (retention). Topic
//!   indexes drop every offset below it, so no message below it is served from the state;
//!   a read below it is answered "trimmed" (`ErrorCode::Trimmed`) by the server;
//! - the **checkpoints** above the trim point: offsets of applied Trim events that carry a
//!   snapshot of this state ([`BrokerState::snapshot`]); the master only ever trims to one
//!   of them, so a broker whose log starts at the trim point rebuilds its state there
//!   ([`BrokerState::from_checkpoint`], docs/protocol.md "Retention").
//!
//! # Duplicates and cut batches
//! A message whose `(producer_id, sequence)` is at or below the producer's last applied
//! sequence is a duplicate: it stays in the log (offsets are never reused) but is not
//! indexed in its topic. The master makes this rare (it answers retries from this table and
//! from its in-flight batches). The one case it cannot avoid is a batch whose prefix
//! survived a failover while its suffix did not: the retry writes the whole batch again.
//! Applying its first message *supersedes* the surviving prefix — the end of the producer's
//! last run, `sequence ..= last`: those old copies are removed from their topic and the run
//! is cut back, so the rewrite is applied as new and the offsets the producer is told are
//! where consumers find the messages. (A consumer that read the old prefix before sees
//! those messages again: delivery is at-least-once. The prefix was never acknowledged: a
//! batch is acked only when its last message is stabilized.) A retry must therefore resend
//! the same batch — same first sequence and count — and sequences must increase per
//! producer id: a producer that starts over at 0 must take a new producer id.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use quire_proto::{
    BrokerId, BrokerSnapshot, CheckpointPart, Epoch, EventBody, EventKind, Offset, SnapshotCursor,
    SnapshotProducer, SnapshotRun, TopicAction, TrimEvent, Voter,
};

use crate::core::Event;
use crate::security::SecurityTables;

/// Runs remembered per producer id (each at least one batch): retries of older batches
/// are refused ([`Dedup::Conflict`]).
pub const PRODUCER_RUNS_MAX: usize = 16;

/// Producer ids remembered; beyond it the one whose last message is oldest is forgotten
/// (deterministically: the smallest `(last offset, producer id)`).
pub const PRODUCERS_MAX: usize = 65_536;

/// Checkpoints above the trim point remembered at most (oldest dropped: the master then
/// trims to a later one).
pub const CHECKPOINTS_MAX: usize = 64;

/// Topics the state holds at most; messages to further new topics are still in the log
/// but not indexed (counted in [`StateStats::topics_refused`]).
pub const TOPICS_MAX: usize = 65_536;

/// Durable cursors the state holds at most (a checkpoint's bound,
/// `SNAPSHOT_CURSORS_MAX`); commits of further new cursors are in the log but not kept
/// (counted in [`StateStats::cursors_refused`]). The master refuses them first
/// (`cursors_max`, at most this).
pub const CURSORS_MAX: usize = quire_proto::SNAPSHOT_CURSORS_MAX;

/// A stretch of one producer's messages to one topic with consecutive sequences at
/// consecutive offsets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SequenceRun {
    /// The topic of the run's messages.
    pub topic: String,
    /// Sequence of the first message.
    pub first_sequence: u64,
    /// Offset of the first message.
    pub first_offset: Offset,
    /// Messages in the run (at least 1).
    pub count: u64,
}

impl SequenceRun {
    fn end_sequence(&self) -> u64 {
        self.first_sequence + self.count
    }

    fn end_offset(&self) -> u64 {
        self.first_offset.0 + self.count
    }
}

/// What the state remembers of one idempotent producer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProducerRecord {
    /// Highest sequence applied.
    pub last_sequence: u64,
    /// Offset of the message with the highest sequence.
    pub last_offset: Offset,
    /// The most recent runs, oldest first, at most [`PRODUCER_RUNS_MAX`].
    pub runs: VecDeque<SequenceRun>,
}

/// The answer of [`BrokerState::dedup`] for a batch `(producer_id, sequence, count)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dedup {
    /// Nothing of the batch is known: write it.
    New,
    /// The whole batch is stabilized: answer with these offsets, write nothing.
    Duplicate {
        /// Offset of the batch's first message.
        base_offset: Offset,
    },
    /// A prefix of the batch is stabilized (the batch was cut by a failover): write the
    /// whole batch again; applying it supersedes the old prefix (see the module docs).
    Partial {
        /// Messages of the batch already applied.
        present: u64,
    },
    /// The batch's sequences are at or below the last one applied but not all in a
    /// remembered run: refuse (the producer resent out of order, or a batch too old to
    /// recall).
    Conflict {
        /// The producer's last applied sequence.
        last_sequence: u64,
    },
}

/// What applying one event changed, for the caller to act on (wake consumers, learn
/// voters).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    /// A message indexed in `topic`.
    Message {
        /// The topic.
        topic: String,
    },
    /// A message skipped as a duplicate of an applied `(producer_id, sequence)`.
    DuplicateMessage,
    /// A cursor commit.
    CursorCommit,
    /// An epoch start naming its master and voters.
    EpochStart {
        /// The master's epoch.
        epoch: Epoch,
        /// The master.
        broker: BrokerId,
        /// The voters it counts.
        voters: Vec<Voter>,
    },
    /// A new voter set (DESIGN.md "Membership changes").
    Config {
        /// The voters from this event on.
        voters: Vec<Voter>,
    },
    /// Anything else (topic admin, trim), or a body this build cannot decode.
    Other,
}

/// Counters of what [`BrokerState::apply`] skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StateStats {
    /// Messages applied and indexed.
    pub messages: u64,
    /// Messages skipped as duplicates.
    pub duplicates: u64,
    /// Old copies of a cut batch's prefix no longer served after the batch was written
    /// again whole.
    pub superseded: u64,
    /// Events whose kind or body could not be decoded (kept in the log, ignored here).
    pub undecodable: u64,
    /// Messages not indexed because [`TOPICS_MAX`] topics exist.
    pub topics_refused: u64,
    /// Producer ids forgotten because of [`PRODUCERS_MAX`].
    pub producers_evicted: u64,
    /// Commits of new cursors not kept because [`CURSORS_MAX`] cursors exist (a master
    /// refuses them first with `LimitReached`; only a master with another bound lets one
    /// through).
    pub cursors_refused: u64,
    /// User or ACL additions not kept because `USERS_MAX` users or `ACLS_MAX` entries
    /// exist (the master refuses them first).
    pub security_refused: u64,
}

/// The log offsets of one topic's messages, as runs of consecutive offsets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopicIndex {
    /// `(first offset, count)`, offsets increasing, runs never adjacent.
    runs: Vec<(u64, u64)>,
    messages: u64,
}

impl TopicIndex {
    fn push(&mut self, offset: Offset) {
        if let Some((first, count)) = self.runs.last_mut() {
            assert!(offset.0 >= *first + *count, "topic offsets only grow");
            if *first + *count == offset.0 {
                *count += 1;
                self.messages += 1;
                return;
            }
        }
        self.runs.push((offset.0, 1));
        self.messages += 1;
    }

    /// Removes `offset` from the topic (nothing if it is not there).
    fn remove(&mut self, offset: Offset) {
        let i = self.runs.partition_point(|&(f, c)| f + c <= offset.0);
        let Some(&(f, c)) = self.runs.get(i) else {
            return;
        };
        if offset.0 < f {
            return;
        }
        self.messages -= 1;
        let before = offset.0 - f;
        let after = f + c - offset.0 - 1;
        match (before, after) {
            (0, 0) => {
                self.runs.remove(i);
            }
            (0, _) => self.runs[i] = (offset.0 + 1, after),
            (_, 0) => self.runs[i] = (f, before),
            _ => {
                self.runs[i] = (f, before);
                self.runs.insert(i + 1, (offset.0 + 1, after));
            }
        }
    }

    /// Drops every offset below `before` (a retention trim).
    fn trim_below(&mut self, before: Offset) {
        let whole = self.runs.partition_point(|&(f, c)| f + c <= before.0);
        let dropped: u64 = self.runs.drain(..whole).map(|(_, c)| c).sum();
        self.messages -= dropped;
        if let Some((f, c)) = self.runs.first_mut() {
            if *f < before.0 {
                let cut = before.0 - *f;
                *f = before.0;
                *c -= cut;
                self.messages -= cut;
            }
        }
    }

    /// Number of messages in the topic.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.messages
    }

    /// Whether the topic has no message.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.messages == 0
    }

    /// Offset of the topic's last message.
    #[must_use]
    pub fn last(&self) -> Option<Offset> {
        self.runs.last().map(|&(f, c)| Offset(f + c - 1))
    }

    /// Up to `max` offsets of the topic's messages at or after `from`, increasing.
    #[must_use]
    pub fn offsets_from(&self, from: Offset, max: usize) -> Vec<Offset> {
        let mut out = Vec::new();
        // First run that ends after `from`.
        let start = self.runs.partition_point(|&(f, c)| f + c <= from.0);
        for &(f, c) in &self.runs[start..] {
            let mut o = f.max(from.0);
            while o < f + c {
                if out.len() >= max {
                    return out;
                }
                out.push(Offset(o));
                o += 1;
            }
        }
        out
    }
}

/// The broker state. See the module docs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerState {
    applied: Option<Offset>,
    topics: BTreeMap<String, TopicIndex>,
    cursors: BTreeMap<(String, String), Offset>,
    producers: BTreeMap<u64, ProducerRecord>,
    /// `(last offset, producer id)` of every record: the eviction order.
    producer_age: BTreeSet<(Offset, u64)>,
    epoch: Epoch,
    master: Option<BrokerId>,
    voters: Vec<Voter>,
    /// Highest `before` of the Trim events applied (0: nothing trimmed).
    trim_point: Offset,
    /// The topics' message offsets are indexed from here on (0: all of them above the
    /// trim point). A state rebuilt at a checkpoint above the trim point lacks the offsets
    /// between the two: [`BrokerState::indexed_from`].
    indexed_from: Offset,
    /// Offsets of applied checkpoints above `trim_point`, increasing: a whole checkpoint's
    /// Trim event, or the first part of a checkpoint whose parts were all applied.
    checkpoints: VecDeque<Offset>,
    /// The checkpoint being written in parts, if the last event applied was one of its
    /// parts but not its last.
    parts: Option<PartsRun>,
    /// Users and ACL entries; shared with the connections (replaced, never changed in
    /// place, while shared: `Arc::make_mut`), so a change shows as a new pointer.
    security: std::sync::Arc<SecurityTables>,
    stats: StateStats,
}

/// Where a checkpoint written in parts stands (see [`quire_proto::CheckpointPart`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct PartsRun {
    /// Offset of its first part: the checkpoint's offset.
    first: Offset,
    /// Index of the part expected next.
    next: u32,
    /// Parts in the checkpoint.
    count: u32,
}

impl PartsRun {
    /// The run after applying `part` at `offset`, given the run before it (if any):
    /// `Ok(None)` a run goes on, `Ok(Some(first))` `part` completed the checkpoint at
    /// `first`, `Err(())` `part` belongs to no run (a run cut short, or parts out of order).
    fn step(
        run: Option<PartsRun>,
        part: &CheckpointPart,
        offset: Offset,
    ) -> Result<Result<PartsRun, Offset>, ()> {
        let run = if part.index == 0 {
            PartsRun {
                first: offset,
                next: 0,
                count: part.count,
            }
        } else {
            run.ok_or(())?
        };
        if run.next != part.index
            || run.count != part.count
            || run.first.0.checked_add(u64::from(part.index)) != Some(offset.0)
        {
            return Err(());
        }
        if part.is_last() {
            Ok(Err(run.first))
        } else {
            Ok(Ok(PartsRun {
                next: run.next + 1,
                ..run
            }))
        }
    }
}

impl BrokerState {
    /// The state before any event.
    #[must_use]
    pub fn new() -> BrokerState {
        BrokerState::default()
    }

    /// Highest offset applied (`None`: nothing yet).
    #[must_use]
    pub fn applied(&self) -> Option<Offset> {
        self.applied
    }

    /// Applies the next stabilized event.
    ///
    /// # Panics
    /// If `event.offset` is not the one right after [`BrokerState::applied`] (events are
    /// applied exactly once, in order: a driver bug otherwise).
    pub fn apply(&mut self, event: &Event) -> Applied {
        let expected = self.applied.map_or(Offset::ZERO, Offset::next);
        assert_eq!(
            event.offset, expected,
            "broker state applies events in order, exactly once"
        );
        self.applied = Some(event.offset);
        // Only the next part of a checkpoint continues a run of parts.
        let parts = self.parts.take();
        let Ok(body) = EventBody::decode(event.kind, &event.payload) else {
            self.stats.undecodable += 1;
            return Applied::Other;
        };
        match body {
            EventBody::Message(m) => {
                self.apply_message(event.offset, m.topic, m.producer_id, m.sequence)
            }
            EventBody::CursorCommit(c) => {
                let key = (c.topic, c.cursor);
                if self.cursors.len() < CURSORS_MAX || self.cursors.contains_key(&key) {
                    self.cursors.insert(key, c.offset);
                } else {
                    self.stats.cursors_refused += 1;
                }
                Applied::CursorCommit
            }
            EventBody::TopicAdmin(t) => {
                match t.action {
                    TopicAction::Create => {
                        if self.topics.len() < TOPICS_MAX {
                            self.topics.entry(t.topic).or_default();
                        }
                    }
                    TopicAction::Delete => {
                        self.topics.remove(&t.topic);
                    }
                }
                Applied::Other
            }
            EventBody::UserAdmin(u) => {
                if !std::sync::Arc::make_mut(&mut self.security).apply_user(u) {
                    self.stats.security_refused += 1;
                }
                Applied::Other
            }
            EventBody::AclAdmin(a) => {
                if !std::sync::Arc::make_mut(&mut self.security).apply_acl(a) {
                    self.stats.security_refused += 1;
                }
                Applied::Other
            }
            EventBody::EpochStart(s) => {
                self.epoch = s.epoch;
                self.master = Some(s.broker);
                self.voters.clone_from(&s.voters);
                Applied::EpochStart {
                    epoch: s.epoch,
                    broker: s.broker,
                    voters: s.voters,
                }
            }
            EventBody::Config(c) => {
                self.voters.clone_from(&c.voters);
                Applied::Config { voters: c.voters }
            }
            EventBody::Trim(t) => {
                // Trim points only grow; a stale lower one changes nothing.
                if t.before > self.trim_point {
                    self.trim_point = t.before;
                    if self.indexed_from <= t.before {
                        // Everything not indexed is trimmed now.
                        self.indexed_from = Offset::ZERO;
                    }
                    for index in self.topics.values_mut() {
                        index.trim_below(t.before);
                    }
                    while self.checkpoints.front().is_some_and(|&c| c < t.before) {
                        self.checkpoints.pop_front();
                    }
                }
                let checkpoint = match (&t.checkpoint, &t.part) {
                    (Some(_), _) => Some(event.offset),
                    (None, Some(part)) => match PartsRun::step(parts, part, event.offset) {
                        Ok(Ok(run)) => {
                            self.parts = Some(run);
                            None
                        }
                        Ok(Err(first)) => Some(first),
                        Err(()) => None,
                    },
                    (None, None) => None,
                };
                if let Some(c) = checkpoint.filter(|&c| c >= self.trim_point) {
                    if self.checkpoints.len() == CHECKPOINTS_MAX {
                        self.checkpoints.pop_front();
                    }
                    self.checkpoints.push_back(c);
                }
                Applied::Other
            }
        }
    }

    fn apply_message(
        &mut self,
        offset: Offset,
        topic: String,
        producer_id: u64,
        sequence: u64,
    ) -> Applied {
        if producer_id != 0
            && self
                .producers
                .get(&producer_id)
                .is_some_and(|rec| sequence <= rec.last_sequence)
            && !self.supersede(producer_id, sequence)
        {
            self.stats.duplicates += 1;
            return Applied::DuplicateMessage;
        }
        if !self.topics.contains_key(&topic) && self.topics.len() >= TOPICS_MAX {
            self.stats.topics_refused += 1;
        } else {
            self.topics.entry(topic.clone()).or_default().push(offset);
        }
        self.stats.messages += 1;
        if producer_id != 0 {
            self.record_producer(producer_id, &topic, sequence, offset);
        }
        Applied::Message { topic }
    }

    /// A message `(producer_id, sequence)` at or below the producer's last applied
    /// sequence: if `sequence ..= last` is the end of the producer's last run — the prefix of
    /// a batch a failover cut, now written again whole — the old copies stop being served
    /// (removed from their topic) and the run is cut back to before `sequence`, so the
    /// rewrite is applied as new and the producer's offsets are where consumers find the
    /// messages. Returns `false` (a plain duplicate) otherwise.
    fn supersede(&mut self, producer_id: u64, sequence: u64) -> bool {
        let Some(rec) = self.producers.get_mut(&producer_id) else {
            return false;
        };
        let Some(run) = rec.runs.back() else {
            return false;
        };
        let cut_tail = run.first_sequence <= sequence
            && sequence <= rec.last_sequence
            && run.end_sequence() == rec.last_sequence + 1;
        if !cut_tail {
            return false;
        }
        let keep = sequence - run.first_sequence;
        let old_first = run.first_offset.0 + keep;
        let old_end = run.end_offset();
        if let Some(t) = self.topics.get_mut(&run.topic) {
            for o in old_first..old_end {
                t.remove(Offset(o));
            }
        }
        self.stats.superseded += old_end - old_first;
        self.producer_age.remove(&(rec.last_offset, producer_id));
        if keep == 0 {
            rec.runs.pop_back();
        } else if let Some(run) = rec.runs.back_mut() {
            run.count = keep;
        }
        match rec.runs.back() {
            Some(r) => {
                rec.last_sequence = r.end_sequence() - 1;
                rec.last_offset = Offset(r.end_offset() - 1);
                self.producer_age.insert((rec.last_offset, producer_id));
            }
            None => {
                self.producers.remove(&producer_id);
            }
        }
        true
    }

    fn record_producer(&mut self, producer_id: u64, topic: &str, sequence: u64, offset: Offset) {
        let rec = self
            .producers
            .entry(producer_id)
            .or_insert_with(|| ProducerRecord {
                last_sequence: sequence,
                last_offset: offset,
                runs: VecDeque::new(),
            });
        self.producer_age.remove(&(rec.last_offset, producer_id));
        match rec.runs.back_mut() {
            Some(run)
                if run.end_sequence() == sequence
                    && run.end_offset() == offset.0
                    && run.topic == topic =>
            {
                run.count += 1;
            }
            _ => {
                rec.runs.push_back(SequenceRun {
                    topic: topic.to_owned(),
                    first_sequence: sequence,
                    first_offset: offset,
                    count: 1,
                });
                if rec.runs.len() > PRODUCER_RUNS_MAX {
                    rec.runs.pop_front();
                }
            }
        }
        rec.last_sequence = sequence;
        rec.last_offset = offset;
        self.producer_age.insert((offset, producer_id));
        while self.producers.len() > PRODUCERS_MAX {
            let Some(&(o, oldest)) = self.producer_age.iter().next() else {
                break;
            };
            self.producer_age.remove(&(o, oldest));
            self.producers.remove(&oldest);
            self.stats.producers_evicted += 1;
        }
    }

    /// Test-only (quire-sim's `--mutate forget-dedup`): forgets every producer's record,
    /// as a new master that did not rebuild the table would. Production code never calls it.
    #[doc(hidden)]
    pub fn forget_producers(&mut self) {
        self.producers.clear();
    }

    /// Whether the batch `sequence .. sequence + count` of `producer_id` is already
    /// applied. `producer_id` 0 (not idempotent) and an empty batch are always
    /// [`Dedup::New`].
    #[must_use]
    pub fn dedup(&self, producer_id: u64, sequence: u64, count: u64) -> Dedup {
        if producer_id == 0 || count == 0 {
            return Dedup::New;
        }
        let Some(rec) = self.producers.get(&producer_id) else {
            return Dedup::New;
        };
        if sequence > rec.last_sequence {
            return Dedup::New;
        }
        let Some(end) = sequence.checked_add(count) else {
            return Dedup::Conflict {
                last_sequence: rec.last_sequence,
            };
        };
        let run = rec
            .runs
            .iter()
            .find(|r| r.first_sequence <= sequence && sequence < r.end_sequence());
        match run {
            Some(r) if end <= r.end_sequence() => Dedup::Duplicate {
                base_offset: Offset(r.first_offset.0 + (sequence - r.first_sequence)),
            },
            // A prefix up to the last applied sequence, the rest never written.
            Some(r) if r.end_sequence() == rec.last_sequence + 1 => Dedup::Partial {
                present: r.end_sequence() - sequence,
            },
            _ => Dedup::Conflict {
                last_sequence: rec.last_sequence,
            },
        }
    }

    /// The last applied sequence of `producer_id`, if it is remembered.
    #[must_use]
    pub fn last_sequence(&self, producer_id: u64) -> Option<u64> {
        self.producers.get(&producer_id).map(|r| r.last_sequence)
    }

    /// The topic's index, `None` for a topic that does not exist (yet).
    #[must_use]
    pub fn topic(&self, topic: &str) -> Option<&TopicIndex> {
        self.topics.get(topic)
    }

    /// Topics the state holds.
    #[must_use]
    pub fn topic_count(&self) -> usize {
        self.topics.len()
    }

    /// Durable cursors the state holds.
    #[must_use]
    pub fn cursor_count(&self) -> usize {
        self.cursors.len()
    }

    /// Every topic with its message count, in name order.
    pub fn topics(&self) -> impl Iterator<Item = (&str, u64)> + '_ {
        self.topics.iter().map(|(n, t)| (n.as_str(), t.len()))
    }

    /// Up to `max` offsets of `topic`'s messages at or after `from` (empty for an unknown
    /// topic).
    #[must_use]
    pub fn topic_offsets(&self, topic: &str, from: Offset, max: usize) -> Vec<Offset> {
        self.topics
            .get(topic)
            .map(|t| t.offsets_from(from, max))
            .unwrap_or_default()
    }

    /// The committed offset of `cursor` on `topic`.
    #[must_use]
    pub fn cursor(&self, topic: &str, cursor: &str) -> Option<Offset> {
        self.cursors
            .get(&(topic.to_owned(), cursor.to_owned()))
            .copied()
    }

    /// Epoch and master of the last epoch-start event applied.
    #[must_use]
    pub fn last_epoch_start(&self) -> Option<(Epoch, BrokerId)> {
        self.master.map(|m| (self.epoch, m))
    }

    /// The voters named by the last epoch-start event applied.
    #[must_use]
    pub fn voters(&self) -> &[Voter] {
        &self.voters
    }

    /// The trim point: the highest `before` of the Trim events applied; every offset
    /// below it may have been deleted from the stores (0: nothing trimmed).
    #[must_use]
    pub fn trim_point(&self) -> Offset {
        self.trim_point
    }

    /// Where the topics' message offsets start being indexed: above the trim point, a
    /// state rebuilt at a checkpoint (`from_checkpoint`) knows no message offsets below
    /// the checkpoint; the messages between the trim point and it are still on the stores
    /// and are found by scanning the log there. `Offset::ZERO` when every offset above the
    /// trim point is indexed.
    #[must_use]
    pub fn indexed_from(&self) -> Offset {
        self.indexed_from.max(self.trim_point)
    }

    /// The highest checkpoint at or below `point` and above the trim point: where the
    /// master may trim to (docs/protocol.md "Retention").
    #[must_use]
    pub fn checkpoint_at_or_below(&self, point: Offset) -> Option<Offset> {
        self.checkpoints
            .iter()
            .rev()
            .find(|&&c| c <= point)
            .copied()
    }

    /// The newest checkpoint above the trim point.
    #[must_use]
    pub fn last_checkpoint(&self) -> Option<Offset> {
        self.checkpoints.back().copied()
    }

    /// This state as a checkpoint: everything but the topics' message offsets.
    #[must_use]
    pub fn snapshot(&self) -> BrokerSnapshot {
        BrokerSnapshot {
            trim_point: self.trim_point,
            epoch: self.epoch,
            master: self.master,
            voters: self.voters.clone(),
            topics: self.topics.keys().cloned().collect(),
            cursors: self
                .cursors
                .iter()
                .map(|((topic, cursor), &offset)| SnapshotCursor {
                    topic: topic.clone(),
                    cursor: cursor.clone(),
                    offset,
                })
                .collect(),
            producers: self
                .producers
                .iter()
                .map(|(&producer_id, rec)| SnapshotProducer {
                    producer_id,
                    last_sequence: rec.last_sequence,
                    last_offset: rec.last_offset,
                    runs: rec
                        .runs
                        .iter()
                        .map(|r| SnapshotRun {
                            topic: r.topic.clone(),
                            first_sequence: r.first_sequence,
                            first_offset: r.first_offset,
                            count: r.count,
                        })
                        .collect(),
                })
                .collect(),
            users: self
                .security
                .users()
                .map(|(u, c)| (u.to_owned(), c.clone()))
                .collect(),
            acls: self.security.acls().cloned().collect(),
        }
    }

    /// The users and ACL entries applied (a shared handle: a change replaces it).
    #[must_use]
    pub fn security(&self) -> &std::sync::Arc<SecurityTables> {
        &self.security
    }

    /// The state rebuilt at a checkpoint: `event` is a Trim event carrying a snapshot
    /// (the state through `event.offset - 1`); the returned state has applied `event` too.
    ///
    /// Equal to the state of a broker that applied the whole log, except for the topics'
    /// message offsets below `event.offset` — all below the trim point when the master
    /// sends a slave the log from it, since the master only ever trims to a checkpoint —
    /// and the counters. When the checkpoint is above the trim point (a slave given the
    /// log from a later checkpoint), [`BrokerState::indexed_from`] says where the index
    /// starts: the messages between the trim point and the checkpoint are read by scanning
    /// the stores' log (the fetch path), never skipped as if they were trimmed or absent
    /// (quire-sim `--retention`, seeds 13065 and 2838).
    /// `None` if `event` is not a checkpoint (or sits at offset 0).
    #[must_use]
    pub fn from_checkpoint(event: &Event) -> Option<BrokerState> {
        if event.kind != EventKind::Trim || event.offset == Offset::ZERO {
            return None;
        }
        let Ok(EventBody::Trim(TrimEvent {
            checkpoint: Some(snapshot),
            ..
        })) = EventBody::decode(EventKind::Trim, &event.payload)
        else {
            return None;
        };
        let mut state = BrokerState::from_snapshot(*snapshot, event.offset);
        state.apply(event);
        Some(state)
    }

    /// The state `snapshot` describes, as the state through `at - 1` (`at` > 0), with no
    /// message offsets indexed below `at`.
    fn from_snapshot(snapshot: BrokerSnapshot, at: Offset) -> BrokerState {
        let mut state = BrokerState {
            applied: Some(Offset(at.0 - 1)),
            topics: snapshot
                .topics
                .into_iter()
                .map(|t| (t, TopicIndex::default()))
                .collect(),
            cursors: snapshot
                .cursors
                .into_iter()
                .map(|c| ((c.topic, c.cursor), c.offset))
                .collect(),
            producers: BTreeMap::new(),
            producer_age: BTreeSet::new(),
            epoch: snapshot.epoch,
            master: snapshot.master,
            voters: snapshot.voters,
            trim_point: snapshot.trim_point,
            // Nothing below the checkpoint is indexed here: say so rather than serve the
            // topics from the checkpoint on as if nothing were missing.
            indexed_from: at,
            checkpoints: VecDeque::new(),
            parts: None,
            security: std::sync::Arc::new(SecurityTables::from_snapshot(
                snapshot.users,
                snapshot.acls,
            )),
            stats: StateStats::default(),
        };
        for p in snapshot.producers {
            state.producer_age.insert((p.last_offset, p.producer_id));
            state.producers.insert(
                p.producer_id,
                ProducerRecord {
                    last_sequence: p.last_sequence,
                    last_offset: p.last_offset,
                    runs: p
                        .runs
                        .into_iter()
                        .map(|r| SequenceRun {
                            topic: r.topic,
                            first_sequence: r.first_sequence,
                            first_offset: r.first_offset,
                            count: r.count,
                        })
                        .collect(),
                },
            );
        }
        state
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> &StateStats {
        &self.stats
    }
}

/// A checkpoint written in parts, gathered by a broker whose log starts at its first part
/// (the master sent it the log from the trim point): [`CheckpointParts::start`] at the
/// first part, [`CheckpointParts::push`] each next event until the last part gives the
/// state.
#[derive(Debug)]
pub struct CheckpointParts {
    /// The parts so far, in order.
    events: Vec<Event>,
    /// Their slices of the encoded snapshot.
    bytes: Vec<bytes::Bytes>,
    /// The run they make.
    run: PartsRun,
    /// Length of the whole encoded snapshot, in bytes.
    snapshot_bytes: u64,
}

impl CheckpointParts {
    /// Starts gathering at `event` if it is a checkpoint's first part (not at offset 0).
    #[must_use]
    pub fn start(event: &Event) -> Option<CheckpointParts> {
        if event.offset == Offset::ZERO {
            return None;
        }
        let part = trim_part(event)?;
        let Ok(Ok(run)) = PartsRun::step(None, &part, event.offset) else {
            return None;
        };
        Some(CheckpointParts {
            events: vec![event.clone()],
            snapshot_bytes: part.snapshot_bytes,
            bytes: vec![part.bytes],
            run,
        })
    }

    /// Offset of the first part: the checkpoint's.
    #[must_use]
    pub fn first(&self) -> Offset {
        self.run.first
    }

    /// Adds the next event: `Ok(None)` while parts are missing, the rebuilt state once
    /// `event` is the last part (every part applied to the snapshot's state).
    ///
    /// # Errors
    /// [`PartsError::NotTheNextPart`] or [`PartsError::NoSnapshot`] (lengths that
    /// disagree, bytes that do not decode): the gathering is over and `event` is to be
    /// looked at on its own.
    pub fn push(&mut self, event: &Event) -> Result<Option<BrokerState>, PartsError> {
        let part = trim_part(event).ok_or(PartsError::NotTheNextPart)?;
        if part.snapshot_bytes != self.snapshot_bytes {
            return Err(PartsError::NoSnapshot);
        }
        let step = PartsRun::step(Some(self.run), &part, event.offset)
            .map_err(|()| PartsError::NotTheNextPart)?;
        let first = match step {
            Ok(run) => {
                self.run = run;
                self.events.push(event.clone());
                self.bytes.push(part.bytes);
                return Ok(None);
            }
            Err(first) => first,
        };
        self.bytes.push(part.bytes);
        self.events.push(event.clone());
        let total: usize = self.bytes.iter().map(bytes::Bytes::len).sum();
        if total as u64 != self.snapshot_bytes {
            return Err(PartsError::NoSnapshot);
        }
        let mut whole = bytes::BytesMut::with_capacity(total);
        for b in self.bytes.drain(..) {
            whole.extend_from_slice(&b);
        }
        let snapshot =
            BrokerSnapshot::from_bytes(&whole.freeze()).map_err(|_| PartsError::NoSnapshot)?;
        let mut state = BrokerState::from_snapshot(snapshot, first);
        for e in &self.events {
            state.apply(e);
        }
        Ok(Some(state))
    }
}

/// Why gathering a checkpoint's parts ended without a state ([`CheckpointParts::push`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PartsError {
    /// The event is not the checkpoint's next part (the run was cut short).
    #[error("the event is not the checkpoint's next part")]
    NotTheNextPart,
    /// The parts' bytes do not make a snapshot.
    #[error("the parts' bytes do not make a broker snapshot")]
    NoSnapshot,
}

/// The checkpoint part `event` carries, if it is a Trim event with one.
fn trim_part(event: &Event) -> Option<CheckpointPart> {
    if event.kind != EventKind::Trim {
        return None;
    }
    match EventBody::decode(EventKind::Trim, &event.payload) {
        Ok(EventBody::Trim(TrimEvent {
            part: Some(part), ..
        })) => Some(part),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use bytes::{Bytes, BytesMut};
    use quire_proto::{
        encode_message_event, CursorCommitEvent, EpochStartEvent, Incarnation, StoreId,
        TopicAdminEvent,
    };

    use super::*;

    /// Builds a log of events from bodies, offsets from 0.
    struct LogBuilder {
        events: Vec<Event>,
    }

    impl LogBuilder {
        fn new() -> LogBuilder {
            LogBuilder { events: Vec::new() }
        }

        fn next(&self) -> Offset {
            Offset(self.events.len() as u64)
        }

        fn push(&mut self, kind: EventKind, payload: impl Into<quire_proto::Payload>) -> Offset {
            let offset = self.next();
            self.events.push(Event {
                epoch: Epoch(1),
                offset,
                kind,
                payload: payload.into(),
            });
            offset
        }

        fn message(&mut self, topic: &str, producer_id: u64, sequence: u64, body: &[u8]) -> Offset {
            let mut b = BytesMut::new();
            encode_message_event(topic, producer_id, sequence, body, &mut b).expect("encodes");
            self.push(EventKind::Message, b.freeze())
        }

        fn body(&mut self, body: &EventBody) -> Offset {
            self.push(body.kind(), body.to_payload().expect("encodes"))
        }

        fn apply_all(&self) -> BrokerState {
            let mut s = BrokerState::new();
            for e in &self.events {
                s.apply(e);
            }
            s
        }
    }

    /// A checkpoint Trim event of the state `log` gives when applied whole.
    fn checkpoint(log: &LogBuilder, before: Offset) -> EventBody {
        EventBody::Trim(quire_proto::TrimEvent {
            before,
            checkpoint: Some(Box::new(log.apply_all().snapshot())),
            part: None,
        })
    }

    fn without_stats(mut s: BrokerState) -> BrokerState {
        s.stats = StateStats::default();
        s
    }

    /// Retention deletes the log below the trim point, so a broker that starts later
    /// rebuilds its state from the checkpoint the trim point names, then applies the rest:
    /// it must end equal to a broker that applied the whole log (counters aside).
    #[test]
    fn a_state_rebuilt_from_a_checkpoint_equals_the_state_of_the_whole_log() {
        let mut log = LogBuilder::new();
        log.body(&EventBody::EpochStart(EpochStartEvent {
            epoch: Epoch(1),
            broker: BrokerId(1),
            voters: vec![Voter {
                store_index: 0,
                store_id: StoreId(5),
                incarnation: Incarnation(6),
            }],
        }));
        for seq in 0..6 {
            log.message("a", 7, seq, b"x");
            log.message("b", 0, 0, b"y");
        }
        log.body(&EventBody::CursorCommit(CursorCommitEvent {
            topic: "a".into(),
            cursor: "c1".into(),
            offset: Offset(4),
        }));
        log.body(&EventBody::TopicAdmin(TopicAdminEvent {
            action: TopicAction::Create,
            topic: "quiet".into(),
        }));
        // Users and ACL entries ride in checkpoints too.
        let credential = quire_tls::scram::new_credential("pw", 4096).expect("a credential");
        for user in ["alice", "bob"] {
            log.body(&EventBody::UserAdmin(quire_proto::UserAdminEvent {
                user: user.into(),
                credential: Some(credential.clone()),
            }));
        }
        let entry = |principal: &str| quire_proto::AclEntry {
            principal: principal.into(),
            operation: quire_proto::AclOperation::Produce,
            topic: "a".into(),
        };
        for principal in ["alice", "bob"] {
            log.body(&EventBody::AclAdmin(quire_proto::AclAdminEvent {
                action: quire_proto::AclAction::Add,
                entry: entry(principal),
            }));
        }
        // First checkpoint (trims nothing yet).
        let c1 = log.body(&checkpoint(&log, Offset::ZERO));
        for seq in 6..9 {
            log.message("a", 7, seq, b"x");
        }
        log.message("b", 8, 0, b"y");
        // Second checkpoint, trimming to the first.
        let c2 = log.body(&checkpoint(&log, c1));
        // Changes after the checkpoint the rebuilt broker starts from.
        log.body(&EventBody::UserAdmin(quire_proto::UserAdminEvent {
            user: "bob".into(),
            credential: None,
        }));
        log.body(&EventBody::AclAdmin(quire_proto::AclAdminEvent {
            action: quire_proto::AclAction::Remove,
            entry: entry("bob"),
        }));
        log.message("b", 8, 1, b"y");
        // Third, trimming to the second.
        log.body(&checkpoint(&log, c2));
        log.message("a", 7, 9, b"x");
        let whole = log.apply_all();
        assert_eq!(whole.trim_point(), c2);
        assert_eq!(
            whole.last_checkpoint(),
            Some(Offset(log.events.len() as u64 - 2))
        );
        assert_eq!(
            whole.checkpoint_at_or_below(Offset(log.events.len() as u64)),
            whole.last_checkpoint()
        );

        // A broker whose log starts at the trim point c2 (the stores deleted below it).
        let at = usize::try_from(c2.0).expect("small");
        let mut rebuilt = BrokerState::from_checkpoint(&log.events[at]).expect("a checkpoint");
        for e in &log.events[at + 1..] {
            rebuilt.apply(e);
        }
        assert_eq!(without_stats(rebuilt.clone()), without_stats(whole.clone()));
        assert_eq!(rebuilt.cursor("a", "c1"), Some(Offset(4)));
        assert_eq!(rebuilt.last_sequence(7), Some(9));
        assert_eq!(rebuilt.dedup(7, 9, 1), whole.dedup(7, 9, 1));
        assert!(
            rebuilt.topic("quiet").is_some(),
            "an empty topic keeps its name"
        );
        assert_eq!(rebuilt.last_epoch_start(), Some((Epoch(1), BrokerId(1))));
        let security = rebuilt.security();
        assert!(security.credential("alice").is_some());
        assert!(security.credential("bob").is_none());
        assert!(security.allows("alice", quire_proto::AclOperation::Produce, Some("a")));
        assert!(!security.allows("bob", quire_proto::AclOperation::Produce, Some("a")));

        // Rebuilt at a checkpoint above the trim point (c2, trimming to c1): the topics'
        // offsets between c1 and c2 are not indexed — the trim point is c1, the index
        // starts at c2 (the fetch path scans the stores' log between them).
        let early =
            BrokerState::from_checkpoint(&log.events[usize::try_from(c2.0).expect("small")])
                .expect("a checkpoint");
        assert_eq!(early.trim_point(), c1);
        assert_eq!(early.indexed_from(), c2);
        assert!(early
            .topic_offsets("a", Offset::ZERO, 100)
            .iter()
            .all(|&o| o >= c2));
        // Once a trim point reaches the checkpoint, everything not indexed is trimmed.
        assert_eq!(
            rebuilt.indexed_from(),
            c2,
            "the trim point c2 covers the gap"
        );

        // Not a checkpoint: a plain trim, a message, offset 0.
        assert!(BrokerState::from_checkpoint(&log.events[1]).is_none());
        assert!(BrokerState::from_checkpoint(&log.events[0]).is_none());
    }

    /// The Trim events of a checkpoint of the state `log` gives, written in parts of at
    /// most `part_bytes` snapshot bytes.
    fn checkpoint_parts(log: &LogBuilder, before: Offset, part_bytes: usize) -> Vec<EventBody> {
        let bytes = log.apply_all().snapshot().to_bytes().expect("encodes");
        CheckpointPart::split(&bytes, part_bytes)
            .expect("splits")
            .into_iter()
            .map(|part| {
                EventBody::Trim(quire_proto::TrimEvent {
                    before,
                    checkpoint: None,
                    part: Some(part),
                })
            })
            .collect()
    }

    /// A checkpoint written in parts counts once all its parts are applied, at its first
    /// part's offset; a broker whose log starts there rebuilds the state the whole log
    /// gives. A run of parts cut short, or with another event inside it, is no checkpoint.
    #[test]
    fn a_checkpoint_in_parts_rebuilds_the_state_and_a_cut_run_is_none() {
        let mut log = LogBuilder::new();
        for seq in 0..20 {
            log.message(&format!("topic-{}", seq % 7), 7, seq, b"x");
            log.body(&EventBody::CursorCommit(CursorCommitEvent {
                topic: format!("topic-{}", seq % 7),
                cursor: format!("cursor-{seq}"),
                offset: Offset(seq),
            }));
        }
        // A run cut short by a message: no checkpoint.
        let cut = checkpoint_parts(&log, Offset::ZERO, 64);
        assert!(cut.len() > 3, "{} parts", cut.len());
        let cut_at = log.body(&cut[0]);
        log.body(&cut[1]);
        log.message("a", 8, 0, b"y");
        assert_eq!(log.apply_all().last_checkpoint(), None);
        // A whole run: the checkpoint is its first part.
        let parts = checkpoint_parts(&log, Offset::ZERO, 64);
        let c1 = log.next();
        for p in &parts {
            log.body(p);
        }
        assert_eq!(log.apply_all().last_checkpoint(), Some(c1));
        log.message("a", 8, 1, b"y");
        // A second one, trimming to the first.
        let parts2 = checkpoint_parts(&log, c1, 100);
        let c2 = log.next();
        for p in &parts2 {
            log.body(p);
        }
        log.message("a", 8, 2, b"y");
        let whole = log.apply_all();
        assert_eq!(whole.trim_point(), c1);
        assert_eq!(whole.last_checkpoint(), Some(c2));
        assert!(whole.checkpoint_at_or_below(cut_at.next()).is_none());

        // Rebuilt from c1's parts, then the rest: the whole log's state.
        let at = usize::try_from(c1.0).expect("small");
        let mut gather = CheckpointParts::start(&log.events[at]).expect("a first part");
        assert_eq!(gather.first(), c1);
        let mut i = at + 1;
        let mut rebuilt = loop {
            if let Some(state) = gather.push(&log.events[i]).expect("the next part") {
                break state;
            }
            i += 1;
        };
        assert_eq!(i, at + parts.len() - 1);
        for e in &log.events[i + 1..] {
            rebuilt.apply(e);
        }
        assert_eq!(without_stats(rebuilt.clone()), without_stats(whole.clone()));
        assert_eq!(rebuilt.cursor("topic-3", "cursor-10"), Some(Offset(10)));
        assert_eq!(rebuilt.last_sequence(8), Some(2));

        // Not a first part; a cut run ends the gathering.
        assert!(CheckpointParts::start(&log.events[at + 1]).is_none());
        let cut_at = usize::try_from(cut_at.0).expect("small");
        let mut gather = CheckpointParts::start(&log.events[cut_at]).expect("a first part");
        assert_eq!(gather.push(&log.events[cut_at + 1]), Ok(None));
        assert_eq!(
            gather.push(&log.events[cut_at + 2]),
            Err(PartsError::NotTheNextPart)
        );
    }

    /// Issue 16's figure: 100,000 cursors with 255-byte topic and cursor names (a ~53 MB
    /// state, more than three maximal events) are checkpointed in default-sized parts and
    /// rebuilt exactly.
    #[test]
    fn a_hundred_thousand_long_cursors_are_checkpointed_in_parts() {
        let mut log = LogBuilder::new();
        let topic = "t".repeat(255);
        for n in 0..100_000u64 {
            log.body(&EventBody::CursorCommit(CursorCommitEvent {
                topic: topic.clone(),
                cursor: format!("{n:010}{}", "c".repeat(245)),
                offset: Offset(n),
            }));
        }
        let state = log.apply_all();
        assert_eq!(state.cursor_count(), 100_000);
        let bytes = state.snapshot().to_bytes().expect("encodes");
        assert!(
            bytes.len() > 3 * quire_proto::EVENT_PAYLOAD_BYTES_MAX,
            "{}",
            bytes.len()
        );
        let parts = CheckpointPart::split(&bytes, crate::engine::CHECKPOINT_PART_BYTES_DEFAULT)
            .expect("splits");
        let first = log.next();
        for part in parts {
            log.body(&EventBody::Trim(quire_proto::TrimEvent {
                before: Offset::ZERO,
                checkpoint: None,
                part: Some(part),
            }));
        }
        let at = usize::try_from(first.0).expect("small");
        let mut gather = CheckpointParts::start(&log.events[at]).expect("a first part");
        let rebuilt = log.events[at + 1..]
            .iter()
            .find_map(|e| gather.push(e).expect("the next part"))
            .expect("the last part rebuilds the state");
        let mut whole = state;
        for e in &log.events[at..] {
            whole.apply(e);
        }
        assert_eq!(whole.last_checkpoint(), Some(first));
        assert_eq!(rebuilt.last_checkpoint(), Some(first));
        assert_eq!(rebuilt.applied(), whole.applied());
        // Above the trim point (0), the rebuilt index starts at the checkpoint.
        assert_eq!(rebuilt.indexed_from(), first);
        // Not assert_eq!: a failure would print 100,000 cursors twice.
        assert!(
            rebuilt.cursors == whole.cursors,
            "the rebuilt cursors differ from the whole log's"
        );
    }

    #[test]
    fn a_trim_event_drops_topic_offsets_below_its_point_and_never_goes_back() {
        let mut log = LogBuilder::new();
        for i in 0..6 {
            log.message("a", 0, 0, b"x"); // 0, 2, 4, 6, 8, 10
            log.message(if i < 2 { "b" } else { "c" }, 0, 0, b"y"); // b: 1, 3; c: 5, 7, 9, 11
        }
        // 12: trim below 5 (inside a's run structure and between b's and c's).
        log.body(&EventBody::Trim(quire_proto::TrimEvent::plain(Offset(5))));
        // 13: a lower, stale trim point changes nothing.
        log.body(&EventBody::Trim(quire_proto::TrimEvent::plain(Offset(2))));
        let s = log.apply_all();
        assert_eq!(s.trim_point(), Offset(5));
        assert_eq!(
            s.topic_offsets("a", Offset(0), 10),
            vec![Offset(6), Offset(8), Offset(10)]
        );
        assert_eq!(s.topic("a").map(TopicIndex::len), Some(3));
        assert_eq!(
            s.topic("b").map(TopicIndex::len),
            Some(0),
            "b keeps its name"
        );
        assert_eq!(
            s.topic_offsets("c", Offset(0), 10),
            vec![Offset(5), Offset(7), Offset(9), Offset(11)]
        );

        // Inside one run: a topic fed alone is cut in the middle of its run.
        let mut log = LogBuilder::new();
        for _ in 0..10 {
            log.message("solo", 0, 0, b"z");
        }
        log.body(&EventBody::Trim(quire_proto::TrimEvent::plain(Offset(7))));
        let s = log.apply_all();
        assert_eq!(
            s.topic_offsets("solo", Offset(0), 10),
            vec![Offset(7), Offset(8), Offset(9)]
        );
        assert_eq!(s.topic("solo").map(TopicIndex::len), Some(3));
        assert_eq!(s.topic("solo").and_then(TopicIndex::last), Some(Offset(9)));
    }

    #[test]
    fn topics_are_created_by_their_first_message_and_index_offsets() {
        let mut log = LogBuilder::new();
        log.message("a", 0, 0, b"1");
        log.message("b", 0, 0, b"2");
        log.message("a", 0, 0, b"3");
        log.message("a", 0, 0, b"4");
        let s = log.apply_all();
        assert_eq!(s.applied(), Some(Offset(3)));
        assert_eq!(s.topics().collect::<Vec<_>>(), vec![("a", 3), ("b", 1)]);
        assert_eq!(
            s.topic_offsets("a", Offset(0), 10),
            vec![Offset(0), Offset(2), Offset(3)]
        );
        assert_eq!(
            s.topic_offsets("a", Offset(1), 10),
            vec![Offset(2), Offset(3)]
        );
        assert_eq!(
            s.topic_offsets("a", Offset(0), 2),
            vec![Offset(0), Offset(2)]
        );
        assert_eq!(s.topic_offsets("a", Offset(4), 10), vec![]);
        assert_eq!(s.topic_offsets("nope", Offset(0), 10), vec![]);
        assert_eq!(s.topic("a").and_then(TopicIndex::last), Some(Offset(3)));
        assert_eq!(s.stats().messages, 4);
    }

    #[test]
    fn cursors_keep_the_last_commit() {
        let mut log = LogBuilder::new();
        let commit = |offset| {
            EventBody::CursorCommit(CursorCommitEvent {
                topic: "t".into(),
                cursor: "billing".into(),
                offset: Offset(offset),
            })
        };
        log.body(&commit(5));
        log.body(&commit(9));
        let s = log.apply_all();
        assert_eq!(s.cursor("t", "billing"), Some(Offset(9)));
        assert_eq!(s.cursor("t", "other"), None);
        assert_eq!(s.cursor("u", "billing"), None);
    }

    #[test]
    fn topic_admin_and_epoch_start_are_applied() {
        let mut log = LogBuilder::new();
        log.body(&EventBody::TopicAdmin(TopicAdminEvent {
            action: TopicAction::Create,
            topic: "empty".into(),
        }));
        let voters = vec![Voter {
            store_index: 1,
            store_id: StoreId(4),
            incarnation: Incarnation(5),
        }];
        log.body(&EventBody::EpochStart(EpochStartEvent {
            epoch: Epoch(0x1_0002),
            broker: BrokerId(2),
            voters: voters.clone(),
        }));
        let s = log.apply_all();
        assert_eq!(s.topics().collect::<Vec<_>>(), vec![("empty", 0)]);
        assert_eq!(s.last_epoch_start(), Some((Epoch(0x1_0002), BrokerId(2))));
        assert_eq!(s.voters(), &voters[..]);
    }

    #[test]
    fn a_retried_batch_gets_its_original_offsets() {
        let mut log = LogBuilder::new();
        // Producer 7: batch seq 0..3 at offsets 0..3, another producer interleaves, then
        // batch seq 3..5 at 4..6.
        for seq in 0..3 {
            log.message("t", 7, seq, b"x");
        }
        log.message("t", 8, 0, b"y");
        for seq in 3..5 {
            log.message("t", 7, seq, b"x");
        }
        let s = log.apply_all();
        assert_eq!(
            s.dedup(7, 0, 3),
            Dedup::Duplicate {
                base_offset: Offset(0)
            }
        );
        assert_eq!(
            s.dedup(7, 3, 2),
            Dedup::Duplicate {
                base_offset: Offset(4)
            }
        );
        assert_eq!(
            s.dedup(7, 1, 2),
            Dedup::Duplicate {
                base_offset: Offset(1)
            }
        );
        assert_eq!(
            s.dedup(8, 0, 1),
            Dedup::Duplicate {
                base_offset: Offset(3)
            }
        );
        assert_eq!(s.dedup(7, 5, 4), Dedup::New);
        assert_eq!(s.dedup(7, 9, 1), Dedup::New, "gaps are allowed");
        assert_eq!(s.dedup(9, 0, 1), Dedup::New, "unknown producer");
        assert_eq!(s.dedup(0, 0, 1), Dedup::New, "producer 0 is not idempotent");
        // Spanning two runs, or reaching past the last sequence from an older run.
        assert_eq!(s.dedup(7, 2, 2), Dedup::Conflict { last_sequence: 4 });
        // A batch cut by a failover: seq 3..=4 applied, 5..=6 not.
        assert_eq!(s.dedup(7, 3, 4), Dedup::Partial { present: 2 });
        assert_eq!(s.last_sequence(7), Some(4));
    }

    #[test]
    fn a_rewritten_cut_batch_supersedes_its_surviving_prefix() {
        let mut log = LogBuilder::new();
        log.message("t", 7, 0, b"a"); // batch 1: seq 0, acked
        log.message("t", 7, 1, b"b"); // batch 2: seq 1..=3, cut after seq 2 by a failover
        log.message("t", 7, 2, b"c");
        log.message("u", 8, 0, b"x"); // another producer (the new epoch's events)
        assert_eq!(
            log.apply_all().dedup(7, 1, 3),
            Dedup::Partial { present: 2 }
        );
        // The retry of batch 2, whole, at new offsets 4..=6.
        log.message("t", 7, 1, b"b");
        log.message("t", 7, 2, b"c");
        log.message("t", 7, 3, b"d");
        let s = log.apply_all();
        assert_eq!(
            s.topic_offsets("t", Offset(0), 10),
            vec![Offset(0), Offset(4), Offset(5), Offset(6)],
            "the old prefix (1, 2) is no longer served; the rewrite is"
        );
        assert_eq!(s.stats().superseded, 2);
        assert_eq!(s.stats().duplicates, 0);
        assert_eq!(
            s.dedup(7, 1, 3),
            Dedup::Duplicate {
                base_offset: Offset(4)
            }
        );
        assert_eq!(
            s.dedup(7, 0, 1),
            Dedup::Duplicate {
                base_offset: Offset(0)
            }
        );
        assert_eq!(s.topic("t").map(TopicIndex::len), Some(4));
    }

    #[test]
    fn duplicates_stay_in_the_log_but_are_not_indexed() {
        let mut log = LogBuilder::new();
        log.message("t", 7, 0, b"a");
        log.message("t", 7, 1, b"b");
        log.message("u", 8, 0, b"x");
        log.message("t", 7, 2, b"c");
        // seq 1 again: not the tail of the last run (that is seq 2 alone): a duplicate.
        log.message("t", 7, 1, b"b");
        let s = log.apply_all();
        assert_eq!(
            s.topic_offsets("t", Offset(0), 10),
            vec![Offset(0), Offset(1), Offset(3)]
        );
        assert_eq!(s.stats().duplicates, 1);
        assert_eq!(s.applied(), Some(Offset(4)));
        assert_eq!(
            s.dedup(7, 2, 1),
            Dedup::Duplicate {
                base_offset: Offset(3)
            }
        );
    }

    #[test]
    fn topic_offsets_can_be_removed_anywhere() {
        let mut t = TopicIndex::default();
        for o in [1, 2, 3, 4, 5, 9] {
            t.push(Offset(o));
        }
        t.remove(Offset(3));
        t.remove(Offset(1));
        t.remove(Offset(9));
        t.remove(Offset(7));
        assert_eq!(
            t.offsets_from(Offset(0), 10),
            vec![Offset(2), Offset(4), Offset(5)]
        );
        assert_eq!(t.len(), 3);
    }

    #[test]
    fn old_runs_are_forgotten_and_retries_of_them_refused() {
        let mut log = LogBuilder::new();
        // Each batch of producer 7 is interleaved with producer 8: one run per batch.
        for seq in 0..(PRODUCER_RUNS_MAX as u64 + 2) {
            log.message("t", 7, seq, b"x");
            log.message("t", 8, seq, b"y");
        }
        let s = log.apply_all();
        assert!(matches!(s.dedup(7, 0, 1), Dedup::Conflict { .. }));
        assert!(matches!(s.dedup(7, 2, 1), Dedup::Duplicate { .. }));
    }

    #[test]
    fn state_is_a_function_of_the_events_whatever_the_apply_batches() {
        let mut log = LogBuilder::new();
        for i in 0..50u64 {
            log.message(if i % 3 == 0 { "a" } else { "b" }, i % 4, i / 4, b"m");
            if i % 7 == 0 {
                log.body(&EventBody::CursorCommit(CursorCommitEvent {
                    topic: "a".into(),
                    cursor: "c".into(),
                    offset: Offset(i),
                }));
            }
        }
        let whole = log.apply_all();
        let mut again = BrokerState::new();
        for chunk in log.events.chunks(7) {
            for e in chunk {
                again.apply(e);
            }
        }
        assert_eq!(whole, again);
    }

    #[test]
    fn undecodable_events_are_counted_and_skipped() {
        let mut log = LogBuilder::new();
        log.push(EventKind::Message, Bytes::from_static(b"\x09garbage"));
        log.events.push(Event {
            epoch: Epoch(1),
            offset: Offset(1),
            kind: EventKind::CursorCommit,
            payload: Bytes::new().into(),
        });
        log.message("t", 0, 0, b"ok");
        let s = log.apply_all();
        assert_eq!(s.stats().undecodable, 2);
        assert_eq!(s.topic_offsets("t", Offset(0), 10), vec![Offset(2)]);
    }

    #[test]
    #[should_panic(expected = "in order")]
    fn events_apply_in_order_only() {
        let mut log = LogBuilder::new();
        log.message("t", 0, 0, b"a");
        log.message("t", 0, 0, b"b");
        let mut s = BrokerState::new();
        s.apply(&log.events[1]);
    }

    mod props {
        use std::collections::{BTreeMap, VecDeque};

        use proptest::prelude::*;

        use super::*;

        /// One step of the model: producer `p` (0..3) does something with its oldest
        /// unacked batch (a new one of `n` messages if it has none).
        #[derive(Clone, Copy, Debug)]
        enum Op {
            /// Written whole and acked.
            Send { p: u64, n: u64 },
            /// Written whole, the ack lost (the master died after stabilizing it).
            SendLostAck { p: u64, n: u64 },
            /// Only the first `keep` messages reached the adopted log (a failover cut it).
            Cut { p: u64, n: u64, keep: u64 },
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (0..3u64, 1..6u64).prop_map(|(p, n)| Op::Send { p, n }),
                1 => (0..3u64, 1..6u64).prop_map(|(p, n)| Op::SendLostAck { p, n }),
                1 => (0..3u64, 2..6u64, 1..5u64)
                    .prop_map(|(p, n, keep)| Op::Cut { p, n, keep: keep.min(n - 1) }),
            ]
        }

        /// A master deciding with [`BrokerState::dedup`], and producers that resend their
        /// oldest unacked batch unchanged.
        #[derive(Default)]
        struct Model {
            log: Option<LogBuilder>,
            state: BrokerState,
            next_seq: [u64; 3],
            queue: [VecDeque<(u64, u64)>; 3],
            acked: BTreeMap<(u64, u64), Offset>,
        }

        impl Model {
            fn log(&mut self) -> &mut LogBuilder {
                self.log.get_or_insert_with(LogBuilder::new)
            }

            fn write(&mut self, p: u64, seq: u64, n: u64) -> Offset {
                let base = self.log().next();
                for i in 0..n {
                    let topic = if p == 2 { "other" } else { "t" };
                    self.log().message(topic, p + 1, seq + i, b"m");
                    let e = self.log().events.last().expect("just pushed").clone();
                    self.state.apply(&e);
                }
                base
            }

            fn step(&mut self, op: Op) {
                let (p, n) = match op {
                    Op::Send { p, n } | Op::SendLostAck { p, n } | Op::Cut { p, n, .. } => (p, n),
                };
                let pi = p as usize;
                if self.queue[pi].is_empty() {
                    self.queue[pi].push_back((self.next_seq[pi], n));
                    self.next_seq[pi] += n;
                }
                let (seq, n) = self.queue[pi][0];
                let base = match self.state.dedup(p + 1, seq, n) {
                    Dedup::Duplicate { base_offset } => Some(base_offset),
                    Dedup::Conflict { last_sequence } => {
                        panic!("in-order same-batch retries never conflict (last {last_sequence})")
                    }
                    Dedup::New | Dedup::Partial { .. } => match op {
                        Op::Cut { keep, .. } => {
                            self.write(p, seq, keep.clamp(1, n.max(2) - 1).min(n));
                            None
                        }
                        Op::SendLostAck { .. } => {
                            self.write(p, seq, n);
                            None
                        }
                        Op::Send { .. } => Some(self.write(p, seq, n)),
                    },
                };
                if let Some(base) = base {
                    for i in 0..n {
                        self.acked.insert((p + 1, seq + i), Offset(base.0 + i));
                    }
                    self.queue[pi].pop_front();
                }
            }
        }

        proptest! {
            /// Whatever failovers cut and whatever acks are lost: every acked message is
            /// served exactly once, at the offset its producer was told, and a replay of
            /// the log gives the same state.
            #[test]
            fn acked_messages_are_served_once_where_their_producer_was_told(
                ops in proptest::collection::vec(op(), 1..60)
            ) {
                let mut m = Model::default();
                for o in ops {
                    m.step(o);
                }
                for p in 0..3u64 {
                    while !m.queue[p as usize].is_empty() {
                        m.step(Op::Send { p, n: 1 });
                    }
                }
                let log = m.log.take().unwrap_or_else(LogBuilder::new);
                prop_assert_eq!(&log.apply_all(), &m.state);
                let mut served: BTreeMap<(u64, u64), Offset> = BTreeMap::new();
                for t in ["t", "other"] {
                    for o in m.state.topic_offsets(t, Offset(0), usize::MAX) {
                        let e = &log.events[o.0 as usize];
                        let Ok(EventBody::Message(msg)) =
                            EventBody::decode(EventKind::Message, &e.payload)
                        else {
                            panic!("a served offset holds a message");
                        };
                        let key = (msg.producer_id, msg.sequence);
                        prop_assert!(served.insert(key, o).is_none(), "served twice: {:?}", key);
                    }
                }
                for (k, o) in &m.acked {
                    prop_assert_eq!(served.get(k), Some(o), "acked {:?}", k);
                }
                prop_assert_eq!(served.len(), m.acked.len());
            }
        }
    }
}
