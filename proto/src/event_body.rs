//! The payloads of the broker's events: what a message, a cursor commit, a topic change,
//! an epoch start, a trim point, a user or an ACL change look like inside an [`crate::Event`]'s `payload`.
//!
//! Stores never read these; brokers write them into the log and rebuild their state from
//! them, so they are a durable format: every body starts with a version byte
//! ([`EVENT_BODY_VERSION`]) and numbers never change meaning. Integers are little-endian;
//! strings are `u16 length + UTF-8`.
//!
//! ```text
//! Message (kind 1)           CursorCommit (kind 2)      TopicAdmin (kind 3)
//! 1    version  u8 (1|2)     1    version  u8           1    version  u8
//! 2+n  topic    string       2+n  topic    string       1    action   u8 (1 create, 2 delete)
//! 8    producer_id u64       2+n  cursor   string       2+n  topic    string
//! 8    sequence u64          8    offset   u64
//! 1    format   u8 (version 2 only: 1 a Kafka record, crate::record)
//! 4    length   u32
//! n    message bytes
//!
//! A message written by a native producer is version 1 (its bytes are opaque); one written
//! through the Kafka listener is version 2 with format 1 (its bytes are a
//! [`crate::record::KafkaRecord`]). Every other kind is version 1.
//!
//! EpochStart (kind 4)        Trim (kind 5)
//! 1    version  u8           1    version  u8
//! 8    epoch    u64          8    before   u64: offsets below may be discarded
//! 2    broker   u16          1    checkpoint u8: 0 none, 1 a BrokerSnapshot follows,
//! 4    voter count u32              2 a checkpoint part follows
//!      (≤ MEMBERS_MAX), then  n    BrokerSnapshot (below), if checkpoint = 1; if 2:
//!      per voter:                   4 index u32, 4 count u32 (2..=CHECKPOINT_PARTS_MAX),
//!      2 store_index u16,           8 snapshot_bytes u64, 4 length u32,
//!      8 store_id u64,              n a slice of the encoded BrokerSnapshot
//!      8 incarnation u64
//!
//! BrokerSnapshot: the broker state through the offset before the Trim event's own,
//! without the topics' message offsets (every one of them is below the next trim point)
//! 8    trim_point  u64
//! 8    epoch       u64            (of the last epoch-start event; 0 none)
//! 2    master      u16            (0 none)
//! 4    voter count u32 (≤ MEMBERS_MAX), voters as in EpochStart
//! 4    topic count u32 (≤ SNAPSHOT_TOPICS_MAX), then per topic: topic string
//! 4    cursor count u32 (≤ SNAPSHOT_CURSORS_MAX), then per cursor:
//!      topic string, cursor string, 8 offset u64
//! 4    producer count u32 (≤ SNAPSHOT_PRODUCERS_MAX), then per producer:
//!      8 producer_id, 8 last_sequence, 8 last_offset,
//!      4 run count u32 (≤ SNAPSHOT_RUNS_MAX), then per run:
//!        topic string, 8 first_sequence, 8 first_offset, 8 count
//! then, only when there are users or ACL entries (a snapshot ends here otherwise):
//! 4    user count u32 (≤ USERS_MAX), then per user: name string, ScramCredential
//! 4    acl count u32 (≤ ACLS_MAX), then per entry: AclEntry
//!
//! UserAdmin (kind 6)               AclAdmin (kind 7)
//! 1    version  u8                 1    version  u8
//! 2+n  user     string             1    action   u8 (1 add, 2 remove)
//! 1    tag      u8 (0 remove,      2+n  principal string
//!      1 a ScramCredential follows) 1   operation u8 (1 produce, 2 consume,
//!                                          3 commit, 4 admin, 5 all)
//!                                  2+n  topic    string (name, `*`, or `prefix*`)
//! (ScramCredential: 2+n salt, 4 iterations u32, 32 stored_key, 32 server_key; see
//! crate::security)
//!
//! Config (kind 8)
//! 1    version  u8
//! 4    voter count u32 (1..=MEMBERS_MAX), voters as in EpochStart
//! ```

use bytes::{Bytes, BytesMut};

use crate::codec::{BodyWriter, CountingWriter, Reader};
use crate::error::WireError;
use crate::limits::{CURSOR_BYTES_MAX, MEMBERS_MAX, MESSAGE_BYTES_MAX, TOPIC_BYTES_MAX};
use crate::payload::Payload;
use crate::security::{
    read_acls, write_acls, AclAdminEvent, AclEntry, ScramCredential, UserAdminEvent, ACLS_MAX,
    PRINCIPAL_BYTES_MAX, SNAPSHOT_USER_BYTES_MIN, USERS_MAX,
};
use crate::types::{BrokerId, Epoch, EventKind, Incarnation, Offset, StoreId};

/// The event body format version this build writes and reads.
pub const EVENT_BODY_VERSION: u8 = 1;

/// What a message's bytes are. One byte in a version-2 message body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageFormat {
    /// Opaque bytes from a native producer (a version-1 body; never written as a byte).
    #[default]
    Raw = 0,
    /// A Kafka record: timestamp, key, headers and value ([`crate::record::KafkaRecord`]).
    Kafka = 1,
}

/// The event body version a message of `format` is written with.
#[must_use]
pub fn message_body_version(format: MessageFormat) -> u8 {
    match format {
        MessageFormat::Raw => EVENT_BODY_VERSION,
        MessageFormat::Kafka => MESSAGE_BODY_VERSION_FORMATTED,
    }
}

/// The message body version that carries a [`MessageFormat`] byte.
pub const MESSAGE_BODY_VERSION_FORMATTED: u8 = 2;

/// A producer's message, as stored in the log (kind [`EventKind::Message`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MessageEvent {
    /// Topic name.
    pub topic: String,
    /// Producer id for deduplication (0: none).
    pub producer_id: u64,
    /// The message's sequence number for that producer.
    pub sequence: u64,
    /// What the bytes are.
    pub format: MessageFormat,
    /// The message bytes (on decode, a slice of the event payload: no copy).
    pub message: Bytes,
}

/// A durable consumer cursor (kind [`EventKind::CursorCommit`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorCommitEvent {
    /// Topic name.
    pub topic: String,
    /// Cursor name.
    pub cursor: String,
    /// The next log offset the consumer wants.
    pub offset: Offset,
}

/// What a topic admin event does. One byte.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TopicAction {
    /// Create the topic.
    Create = 1,
    /// Delete the topic.
    Delete = 2,
}

/// Topic creation or deletion (kind [`EventKind::TopicAdmin`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicAdminEvent {
    /// What to do.
    pub action: TopicAction,
    /// Topic name.
    pub topic: String,
}

/// One voting store named by an [`EpochStartEvent`]: the identity bound to one position of
/// the cluster's store list (DESIGN.md "Store identity").
///
/// ```text
/// 2      store_index           u16: position in the cluster's store list
/// 8      store_id              u64
/// 8      incarnation           u64
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Voter {
    /// Position of the store in the cluster's (fixed) store list.
    pub store_index: u16,
    /// The store's id.
    pub store_id: StoreId,
    /// The store's incarnation.
    pub incarnation: Incarnation,
}

/// Bytes one [`Voter`] takes.
const VOTER_BYTES: usize = 2 + 8 + 8;

/// The first event of a master's epoch (kind [`EventKind::EpochStart`]): once it is
/// stabilized, everything before it is (DESIGN.md "Failover" step 4).
///
/// It also carries the voter set the master counts (store identities are part of the
/// replicated state): the bootstrap master binds them, and every slave learns them from
/// here.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EpochStartEvent {
    /// The new master's epoch.
    pub epoch: Epoch,
    /// The new master.
    pub broker: BrokerId,
    /// The voting stores' identities, at most `MEMBERS_MAX`, by store index.
    pub voters: Vec<Voter>,
}

/// A new voter set (kind [`EventKind::Config`]): the set in force from this event on, for
/// every broker whose log holds it, stabilized or not (DESIGN.md "Membership changes",
/// rule 1; Raft thesis §4.1). It differs from the set before it by one store added or
/// removed, or by the identity of one store rebound (a removed slot added back under a new
/// identity is two events: remove, then add).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigEvent {
    /// The voting stores, by store index (at least one, at most `MEMBERS_MAX`).
    pub voters: Vec<Voter>,
}

/// A retention trim point (kind [`EventKind::Trim`]), and optionally a checkpoint of the
/// broker state: the state through the offset right before this event's own, so a broker
/// whose log starts at this event can rebuild its state from here.
///
/// A checkpoint too large for one event is written as [`CheckpointPart`]s instead: Trim
/// events at consecutive offsets, each with the same `before` and one slice of the encoded
/// [`BrokerSnapshot`] (the state through the offset before the first part). A broker whose
/// log starts at the first part rebuilds its state once it has the last; a run of parts cut
/// short (a failover during the write) is no checkpoint and is ignored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrimEvent {
    /// Events below this offset may be discarded.
    pub before: Offset,
    /// The broker state before this event (`None`: a plain trim point, or a part).
    pub checkpoint: Option<Box<BrokerSnapshot>>,
    /// One part of a checkpoint written across several events (`None` with `checkpoint`).
    pub part: Option<CheckpointPart>,
}

impl TrimEvent {
    /// A trim point without a checkpoint.
    #[must_use]
    pub fn plain(before: Offset) -> TrimEvent {
        TrimEvent {
            before,
            checkpoint: None,
            part: None,
        }
    }
}

/// The index of the checkpoint part a Trim event's payload carries, read from its first
/// bytes without decoding the rest (a whole checkpoint can be megabytes); `None` for any
/// payload that does not start as a Trim body with a part (tag 2).
#[must_use]
pub fn trim_part_index(payload: &Payload) -> Option<u32> {
    // version u8, before u64, tag u8, index u32
    let mut head = [0u8; 14];
    let mut filled = 0;
    for chunk in payload.chunks() {
        let n = chunk.len().min(head.len() - filled);
        head[filled..filled + n].copy_from_slice(&chunk[..n]);
        filled += n;
    }
    (filled == head.len() && head[0] == EVENT_BODY_VERSION && head[9] == 2)
        .then(|| u32::from_le_bytes([head[10], head[11], head[12], head[13]]))
}

/// Most parts one checkpoint is written in: with parts of 8 MiB, 32 GiB of broker state.
pub const CHECKPOINT_PARTS_MAX: u32 = 4096;

/// One part of a checkpoint written across several Trim events (see [`TrimEvent`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointPart {
    /// This part's place in the checkpoint, from 0; part `i` sits at the first part's
    /// offset + `i`.
    pub index: u32,
    /// Parts in the checkpoint, 2..=[`CHECKPOINT_PARTS_MAX`].
    pub count: u32,
    /// Length of the whole encoded snapshot (all parts' bytes together), in bytes.
    pub snapshot_bytes: u64,
    /// This part's slice of the encoded [`BrokerSnapshot`] ([`BrokerSnapshot::to_bytes`]).
    pub bytes: Bytes,
}

impl CheckpointPart {
    /// `snapshot` (an encoded [`BrokerSnapshot`]) cut into parts of at most `part_bytes`
    /// bytes each (shared slices of `snapshot`, no copy).
    ///
    /// # Errors
    /// [`WireError::CountTooLarge`] when that takes more than [`CHECKPOINT_PARTS_MAX`]
    /// parts or fewer than 2 (a snapshot that fits one part is written whole).
    pub fn split(snapshot: &Bytes, part_bytes: usize) -> Result<Vec<CheckpointPart>, WireError> {
        let part_bytes = part_bytes.max(1);
        let count = snapshot.len().div_ceil(part_bytes);
        let max = CHECKPOINT_PARTS_MAX as usize;
        if !(2..=max).contains(&count) {
            return Err(WireError::CountTooLarge {
                field: "checkpoint parts",
                count: count as u64,
                max: max as u64,
            });
        }
        Ok((0..count)
            .map(|i| CheckpointPart {
                index: i as u32,
                count: count as u32,
                snapshot_bytes: snapshot.len() as u64,
                bytes: snapshot.slice(i * part_bytes..((i + 1) * part_bytes).min(snapshot.len())),
            })
            .collect())
    }

    /// Whether this is the last part.
    #[must_use]
    pub fn is_last(&self) -> bool {
        self.index + 1 == self.count
    }
}

/// Most topics a [`BrokerSnapshot`] holds.
pub const SNAPSHOT_TOPICS_MAX: usize = 65_536;
/// Most cursors a [`BrokerSnapshot`] holds.
pub const SNAPSHOT_CURSORS_MAX: usize = 1 << 20;
/// Most producers a [`BrokerSnapshot`] holds.
pub const SNAPSHOT_PRODUCERS_MAX: usize = 65_536;
/// Most runs per producer a [`BrokerSnapshot`] holds.
pub const SNAPSHOT_RUNS_MAX: usize = 64;

/// The broker state a checkpoint carries (see the module docs for the layout): everything
/// the broker state holds except each topic's message offsets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BrokerSnapshot {
    /// The highest trim point applied.
    pub trim_point: Offset,
    /// Epoch of the last epoch-start event (0: none).
    pub epoch: Epoch,
    /// Master of the last epoch-start event.
    pub master: Option<BrokerId>,
    /// Voters of the last epoch-start event.
    pub voters: Vec<Voter>,
    /// Every topic, by name.
    pub topics: Vec<String>,
    /// Every durable cursor.
    pub cursors: Vec<SnapshotCursor>,
    /// The idempotent-producer table.
    pub producers: Vec<SnapshotProducer>,
    /// Every user with its SCRAM credential, by name.
    pub users: Vec<(String, ScramCredential)>,
    /// Every ACL entry, sorted.
    pub acls: Vec<AclEntry>,
}

/// One cursor of a [`BrokerSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotCursor {
    /// Topic name.
    pub topic: String,
    /// Cursor name.
    pub cursor: String,
    /// The committed offset.
    pub offset: Offset,
}

/// One producer of a [`BrokerSnapshot`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotProducer {
    /// The producer id.
    pub producer_id: u64,
    /// Highest sequence applied.
    pub last_sequence: u64,
    /// Offset of that message.
    pub last_offset: Offset,
    /// Recent runs, oldest first.
    pub runs: Vec<SnapshotRun>,
}

/// One run of consecutive sequences at consecutive offsets of a [`SnapshotProducer`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotRun {
    /// Topic of the run's messages.
    pub topic: String,
    /// Sequence of the first message.
    pub first_sequence: u64,
    /// Offset of the first message.
    pub first_offset: Offset,
    /// Messages in the run.
    pub count: u64,
}

/// Least bytes one snapshot cursor, producer or run takes in a body.
const SNAPSHOT_CURSOR_BYTES_MIN: usize = 2 + 1 + 2 + 1 + 8;
const SNAPSHOT_PRODUCER_BYTES_MIN: usize = 8 + 8 + 8 + 4;
const SNAPSHOT_RUN_BYTES_MIN: usize = 2 + 1 + 8 + 8 + 8;

fn read_voters(r: &mut Reader<'_>, field: &'static str) -> Result<Vec<Voter>, WireError> {
    let count = r.count(field, MEMBERS_MAX, VOTER_BYTES)?;
    let mut voters = Vec::with_capacity(count);
    for _ in 0..count {
        voters.push(Voter {
            store_index: r.u16(field)?,
            store_id: StoreId(r.u64(field)?),
            incarnation: Incarnation(r.u64(field)?),
        });
    }
    Ok(voters)
}

fn write_voters<W: BodyWriter>(
    w: &mut W,
    field: &'static str,
    voters: &[Voter],
) -> Result<(), WireError> {
    w.count(field, voters.len(), MEMBERS_MAX)?;
    for v in voters {
        w.u16(v.store_index);
        w.u64(v.store_id.0);
        w.u64(v.incarnation.0);
    }
    Ok(())
}

fn read_part(r: &mut Reader<'_>) -> Result<CheckpointPart, WireError> {
    let field = "checkpoint part";
    let index = r.u32(field)?;
    let count = r.u32(field)?;
    let snapshot_bytes = r.u64(field)?;
    let bytes = r.payload(field)?;
    if !(2..=CHECKPOINT_PARTS_MAX).contains(&count) {
        return Err(WireError::CountTooLarge {
            field: "checkpoint parts",
            count: u64::from(count),
            max: u64::from(CHECKPOINT_PARTS_MAX),
        });
    }
    if index >= count || bytes.len() as u64 > snapshot_bytes {
        return Err(WireError::InvalidTag {
            field: "checkpoint part index or length",
            byte: 0,
        });
    }
    Ok(CheckpointPart {
        index,
        count,
        snapshot_bytes,
        bytes,
    })
}

fn write_part<W: BodyWriter>(w: &mut W, part: &CheckpointPart) -> Result<(), WireError> {
    w.u32(part.index);
    w.u32(part.count);
    w.u64(part.snapshot_bytes);
    w.payload("checkpoint part", &part.bytes)
}

impl BrokerSnapshot {
    /// The snapshot's encoding (the layout in the module docs, without a version byte):
    /// what [`CheckpointPart`]s carry in slices.
    ///
    /// # Errors
    /// A list or name above its bound ([`WireError::CountTooLarge`],
    /// [`WireError::StringTooLong`], …).
    pub fn to_bytes(&self) -> Result<Bytes, WireError> {
        let mut out = BytesMut::new();
        self.write(&mut out)?;
        Ok(out.freeze())
    }

    /// A snapshot from [`BrokerSnapshot::to_bytes`]'s encoding (all of `bytes`).
    ///
    /// # Errors
    /// Any [`WireError`] of a malformed or truncated snapshot, or trailing bytes.
    pub fn from_bytes(bytes: &Bytes) -> Result<BrokerSnapshot, WireError> {
        let mut r = Reader::new(bytes);
        let snapshot = BrokerSnapshot::read(&mut r)?;
        r.finish()?;
        Ok(snapshot)
    }

    fn read(r: &mut Reader<'_>) -> Result<BrokerSnapshot, WireError> {
        let trim_point = r.offset("snapshot trim point")?;
        let epoch = r.epoch("snapshot epoch")?;
        let master = match r.u16("snapshot master")? {
            0 => None,
            b => Some(BrokerId(b)),
        };
        let voters = read_voters(r, "snapshot voters")?;
        let field = "snapshot topics";
        let count = r.count(field, SNAPSHOT_TOPICS_MAX, 3)?;
        let mut topics = Vec::with_capacity(count);
        for _ in 0..count {
            topics.push(r.name("topic", TOPIC_BYTES_MAX)?);
        }
        let field = "snapshot cursors";
        let count = r.count(field, SNAPSHOT_CURSORS_MAX, SNAPSHOT_CURSOR_BYTES_MIN)?;
        let mut cursors = Vec::with_capacity(count);
        for _ in 0..count {
            cursors.push(SnapshotCursor {
                topic: r.name("topic", TOPIC_BYTES_MAX)?,
                cursor: r.name("cursor", CURSOR_BYTES_MAX)?,
                offset: r.offset(field)?,
            });
        }
        let field = "snapshot producers";
        let count = r.count(field, SNAPSHOT_PRODUCERS_MAX, SNAPSHOT_PRODUCER_BYTES_MIN)?;
        let mut producers = Vec::with_capacity(count);
        for _ in 0..count {
            let producer_id = r.u64(field)?;
            let last_sequence = r.u64(field)?;
            let last_offset = r.offset(field)?;
            let runs_field = "snapshot producer runs";
            let n = r.count(runs_field, SNAPSHOT_RUNS_MAX, SNAPSHOT_RUN_BYTES_MIN)?;
            let mut runs = Vec::with_capacity(n);
            for _ in 0..n {
                runs.push(SnapshotRun {
                    topic: r.name("topic", TOPIC_BYTES_MAX)?,
                    first_sequence: r.u64(runs_field)?,
                    first_offset: r.offset(runs_field)?,
                    count: r.u64(runs_field)?,
                });
            }
            producers.push(SnapshotProducer {
                producer_id,
                last_sequence,
                last_offset,
                runs,
            });
        }
        // Users and ACLs follow only when there are any (a snapshot of a build before
        // them ends here, and one without them is written as it was).
        let mut users = Vec::new();
        let mut acls = Vec::new();
        if r.remaining() > 0 {
            let count = r.count("snapshot users", USERS_MAX, SNAPSHOT_USER_BYTES_MIN)?;
            users.reserve(count);
            for _ in 0..count {
                let user = r.name("user", PRINCIPAL_BYTES_MAX)?;
                users.push((user, ScramCredential::read(r)?));
            }
            acls = read_acls(r)?;
        }
        Ok(BrokerSnapshot {
            trim_point,
            epoch,
            master,
            voters,
            topics,
            cursors,
            producers,
            users,
            acls,
        })
    }

    fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.trim_point.0);
        w.u64(self.epoch.0);
        w.u16(self.master.map_or(0, |b| b.0));
        write_voters(w, "snapshot voters", &self.voters)?;
        w.count("snapshot topics", self.topics.len(), SNAPSHOT_TOPICS_MAX)?;
        for t in &self.topics {
            w.name("topic", t, TOPIC_BYTES_MAX)?;
        }
        w.count("snapshot cursors", self.cursors.len(), SNAPSHOT_CURSORS_MAX)?;
        for c in &self.cursors {
            w.name("topic", &c.topic, TOPIC_BYTES_MAX)?;
            w.name("cursor", &c.cursor, CURSOR_BYTES_MAX)?;
            w.u64(c.offset.0);
        }
        w.count(
            "snapshot producers",
            self.producers.len(),
            SNAPSHOT_PRODUCERS_MAX,
        )?;
        for p in &self.producers {
            w.u64(p.producer_id);
            w.u64(p.last_sequence);
            w.u64(p.last_offset.0);
            w.count("snapshot producer runs", p.runs.len(), SNAPSHOT_RUNS_MAX)?;
            for run in &p.runs {
                w.name("topic", &run.topic, TOPIC_BYTES_MAX)?;
                w.u64(run.first_sequence);
                w.u64(run.first_offset.0);
                w.u64(run.count);
            }
        }
        if !self.users.is_empty() || !self.acls.is_empty() {
            w.count("snapshot users", self.users.len(), USERS_MAX)?;
            for (user, credential) in &self.users {
                w.name("user", user, PRINCIPAL_BYTES_MAX)?;
                credential.write(w)?;
            }
            if self.acls.len() > ACLS_MAX {
                return Err(WireError::CountTooLarge {
                    field: "snapshot acls",
                    count: self.acls.len() as u64,
                    max: ACLS_MAX as u64,
                });
            }
            write_acls(w, &self.acls)?;
        }
        Ok(())
    }
}

/// Any event body, by kind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventBody {
    /// [`MessageEvent`].
    Message(MessageEvent),
    /// [`CursorCommitEvent`].
    CursorCommit(CursorCommitEvent),
    /// [`TopicAdminEvent`].
    TopicAdmin(TopicAdminEvent),
    /// [`EpochStartEvent`].
    EpochStart(EpochStartEvent),
    /// [`TrimEvent`].
    Trim(TrimEvent),
    /// [`UserAdminEvent`].
    UserAdmin(UserAdminEvent),
    /// [`AclAdminEvent`].
    AclAdmin(AclAdminEvent),
    /// [`ConfigEvent`].
    Config(ConfigEvent),
}

impl EventBody {
    /// The event kind this body is stored under.
    #[must_use]
    pub fn kind(&self) -> EventKind {
        match self {
            EventBody::Message(_) => EventKind::Message,
            EventBody::CursorCommit(_) => EventKind::CursorCommit,
            EventBody::TopicAdmin(_) => EventKind::TopicAdmin,
            EventBody::EpochStart(_) => EventKind::EpochStart,
            EventBody::Trim(_) => EventKind::Trim,
            EventBody::UserAdmin(_) => EventKind::UserAdmin,
            EventBody::AclAdmin(_) => EventKind::AclAdmin,
            EventBody::Config(_) => EventKind::Config,
        }
    }

    /// Bytes the encoded body takes.
    ///
    /// # Errors
    /// As [`EventBody::encode`].
    pub fn encoded_bytes(&self) -> Result<usize, WireError> {
        let mut counter = CountingWriter::default();
        self.write(&mut counter)?;
        Ok(counter.bytes)
    }

    /// Appends the encoded body to `out`. On error `out` is left as it was.
    ///
    /// # Errors
    /// [`WireError::EmptyName`] or [`WireError::StringTooLong`] for a bad topic or cursor
    /// name; [`WireError::PayloadTooLarge`] for a message over `MESSAGE_BYTES_MAX`.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), WireError> {
        let bytes = self.encoded_bytes()?;
        out.reserve(bytes);
        let start = out.len();
        if let Err(e) = self.write(out) {
            out.truncate(start);
            return Err(e);
        }
        Ok(())
    }

    /// The encoded body as a new `Bytes`, ready to be an event's payload.
    ///
    /// # Errors
    /// As [`EventBody::encode`].
    /// A message's payload is two chunks: its header, then the message bytes themselves
    /// (shared, not copied; see [`Payload`]).
    pub fn to_payload(&self) -> Result<Payload, WireError> {
        let mut out = BytesMut::new();
        if let EventBody::Message(m) = self {
            encode_message_header_as(
                m.format,
                &m.topic,
                m.producer_id,
                m.sequence,
                m.message.len(),
                &mut out,
            )?;
            return Ok(Payload::chained(out.freeze(), m.message.clone()));
        }
        self.encode(&mut out)?;
        Ok(out.freeze().into())
    }

    /// Decodes an event's payload by its kind. A message's bytes are a slice of `payload`
    /// (of its second chunk when the payload is a message header followed by the message,
    /// as [`EventBody::to_payload`] and [`encode_message_header`] build it).
    ///
    /// # Errors
    /// [`WireError::UnsupportedEventBodyVersion`], or a body error (`Truncated`,
    /// `StringTooLong`, `EmptyName`, `InvalidUtf8`, `InvalidTag`, `TrailingBytes`, …).
    pub fn decode(kind: EventKind, payload: &Payload) -> Result<EventBody, WireError> {
        if payload.tail().is_empty() {
            return EventBody::decode_bytes(kind, payload.head());
        }
        if kind == EventKind::Message {
            if let Some(m) = MessageEvent::decode_split(payload.head(), payload.tail()) {
                return Ok(EventBody::Message(m));
            }
        }
        EventBody::decode_bytes(kind, &payload.to_bytes())
    }

    /// [`EventBody::decode`] of one contiguous buffer.
    fn decode_bytes(kind: EventKind, payload: &Bytes) -> Result<EventBody, WireError> {
        let mut r = Reader::new(payload);
        let version = r.u8("event body version")?;
        let formatted = kind == EventKind::Message && version == MESSAGE_BODY_VERSION_FORMATTED;
        if version != EVENT_BODY_VERSION && !formatted {
            return Err(WireError::UnsupportedEventBodyVersion {
                version,
                supported: EVENT_BODY_VERSION,
            });
        }
        let body = match kind {
            EventKind::Message => {
                let topic = r.name("topic", TOPIC_BYTES_MAX)?;
                let producer_id = r.u64("message producer_id")?;
                let sequence = r.u64("message sequence")?;
                let format = if formatted {
                    read_format(&mut r)?
                } else {
                    MessageFormat::Raw
                };
                EventBody::Message(MessageEvent {
                    topic,
                    producer_id,
                    sequence,
                    format,
                    message: r.payload("message")?,
                })
            }
            EventKind::CursorCommit => EventBody::CursorCommit(CursorCommitEvent {
                topic: r.name("topic", TOPIC_BYTES_MAX)?,
                cursor: r.name("cursor", CURSOR_BYTES_MAX)?,
                offset: r.offset("cursor commit offset")?,
            }),
            EventKind::TopicAdmin => {
                let field = "topic action";
                let action = match r.u8(field)? {
                    1 => TopicAction::Create,
                    2 => TopicAction::Delete,
                    byte => return Err(WireError::InvalidTag { field, byte }),
                };
                EventBody::TopicAdmin(TopicAdminEvent {
                    action,
                    topic: r.name("topic", TOPIC_BYTES_MAX)?,
                })
            }
            EventKind::EpochStart => {
                let epoch = r.epoch("epoch start epoch")?;
                let broker = BrokerId(r.u16("epoch start broker")?);
                let voters = read_voters(&mut r, "epoch start voters")?;
                EventBody::EpochStart(EpochStartEvent {
                    epoch,
                    broker,
                    voters,
                })
            }
            EventKind::Trim => {
                let before = r.offset("trim before")?;
                let field = "trim checkpoint tag";
                let (checkpoint, part) = match r.u8(field)? {
                    0 => (None, None),
                    1 => (Some(Box::new(BrokerSnapshot::read(&mut r)?)), None),
                    2 => (None, Some(read_part(&mut r)?)),
                    byte => return Err(WireError::InvalidTag { field, byte }),
                };
                EventBody::Trim(TrimEvent {
                    before,
                    checkpoint,
                    part,
                })
            }
            EventKind::UserAdmin => EventBody::UserAdmin(UserAdminEvent::read(&mut r)?),
            EventKind::AclAdmin => EventBody::AclAdmin(AclAdminEvent::read(&mut r)?),
            EventKind::Config => {
                let voters = read_voters(&mut r, "config voters")?;
                if voters.is_empty() {
                    return Err(WireError::EmptyName {
                        field: "config voters",
                    });
                }
                EventBody::Config(ConfigEvent { voters })
            }
        };
        r.finish()?;
        Ok(body)
    }

    fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        match self {
            EventBody::Message(m) => w.u8(message_body_version(m.format)),
            _ => w.u8(EVENT_BODY_VERSION),
        }
        match self {
            EventBody::Message(m) => {
                w.name("topic", &m.topic, TOPIC_BYTES_MAX)?;
                w.u64(m.producer_id);
                w.u64(m.sequence);
                if m.format != MessageFormat::Raw {
                    w.u8(m.format as u8);
                }
                message(w, &m.message)?;
            }
            EventBody::CursorCommit(c) => {
                w.name("topic", &c.topic, TOPIC_BYTES_MAX)?;
                w.name("cursor", &c.cursor, CURSOR_BYTES_MAX)?;
                w.u64(c.offset.0);
            }
            EventBody::TopicAdmin(t) => {
                w.u8(t.action as u8);
                w.name("topic", &t.topic, TOPIC_BYTES_MAX)?;
            }
            EventBody::EpochStart(e) => {
                w.u64(e.epoch.0);
                w.u16(e.broker.0);
                write_voters(w, "epoch start voters", &e.voters)?;
            }
            EventBody::Trim(t) => {
                w.u64(t.before.0);
                match (&t.checkpoint, &t.part) {
                    (None, None) => w.u8(0),
                    (Some(snapshot), None) => {
                        w.u8(1);
                        snapshot.write(w)?;
                    }
                    (None, Some(part)) => {
                        w.u8(2);
                        write_part(w, part)?;
                    }
                    (Some(_), Some(_)) => {
                        return Err(WireError::InvalidTag {
                            field: "trim checkpoint tag: a snapshot and a part",
                            byte: 3,
                        })
                    }
                }
            }
            EventBody::UserAdmin(u) => u.write(w)?,
            EventBody::AclAdmin(a) => a.write(w)?,
            EventBody::Config(c) => write_voters(w, "config voters", &c.voters)?,
        }
        Ok(())
    }
}

fn message<W: BodyWriter>(w: &mut W, message: &[u8]) -> Result<(), WireError> {
    if message.len() > MESSAGE_BYTES_MAX {
        return Err(WireError::PayloadTooLarge {
            field: "message",
            length: message.len(),
            max: MESSAGE_BYTES_MAX,
        });
    }
    // MESSAGE_BYTES_MAX < FRAME_BYTES_MAX ≤ u32::MAX (asserted in limits.rs).
    w.u32(message.len() as u32);
    w.put(message);
    Ok(())
}

impl MessageEvent {
    /// The message event whose header is all of `head` and whose message bytes are all of
    /// `tail` (a handle to `tail`, no copy), or `None` if the payload is not split there
    /// (or `head` is not a well-formed header for `tail.len()` bytes).
    fn decode_split(head: &Bytes, tail: &Bytes) -> Option<MessageEvent> {
        let mut r = Reader::new(head);
        let version = r.u8("event body version").ok()?;
        if version != EVENT_BODY_VERSION && version != MESSAGE_BODY_VERSION_FORMATTED {
            return None;
        }
        let topic = r.name("topic", TOPIC_BYTES_MAX).ok()?;
        let producer_id = r.u64("message producer_id").ok()?;
        let sequence = r.u64("message sequence").ok()?;
        let format = if version == MESSAGE_BODY_VERSION_FORMATTED {
            read_format(&mut r).ok()?
        } else {
            MessageFormat::Raw
        };
        let length = r.u32("message length").ok()? as usize;
        (r.remaining() == 0 && length == tail.len() && length <= MESSAGE_BYTES_MAX).then(|| {
            MessageEvent {
                topic,
                producer_id,
                sequence,
                format,
                message: tail.clone(),
            }
        })
    }
}

/// The format byte of a version-2 message body.
fn read_format(r: &mut Reader<'_>) -> Result<MessageFormat, WireError> {
    let field = "message format";
    match r.u8(field)? {
        1 => Ok(MessageFormat::Kafka),
        byte => Err(WireError::InvalidTag { field, byte }),
    }
}

/// Bytes of a message event's header: everything of [`encode_message_event`]'s body before
/// the message bytes (version, topic, producer id, sequence, length).
#[must_use]
pub fn message_header_bytes(topic_bytes: usize) -> usize {
    1 + 2 + topic_bytes + 8 + 8 + 4
}

/// [`message_header_bytes`] for a message of `format` (a Kafka record's header has its
/// format byte too).
#[must_use]
pub fn message_header_bytes_as(format: MessageFormat, topic_bytes: usize) -> usize {
    message_header_bytes(topic_bytes) + usize::from(format != MessageFormat::Raw)
}

/// The producer hot path without a copy: appends to `out` the header of a message event
/// whose message is `message_bytes` long. The event's payload is then
/// `Payload::chained(header, message)`: the message bytes stay where they are. On error
/// `out` is left as it was.
///
/// # Errors
/// [`WireError::PayloadTooLarge`] for a message above [`MESSAGE_BYTES_MAX`]; a topic error
/// (`EmptyName`, `StringTooLong`, `InvalidName`).
pub fn encode_message_header(
    topic: &str,
    producer_id: u64,
    sequence: u64,
    message_bytes: usize,
    out: &mut BytesMut,
) -> Result<(), WireError> {
    encode_message_header_as(
        MessageFormat::Raw,
        topic,
        producer_id,
        sequence,
        message_bytes,
        out,
    )
}

/// [`encode_message_header`] for a message of `format`.
///
/// # Errors
/// As [`encode_message_header`].
pub fn encode_message_header_as(
    format: MessageFormat,
    topic: &str,
    producer_id: u64,
    sequence: u64,
    message_bytes: usize,
    out: &mut BytesMut,
) -> Result<(), WireError> {
    crate::client::validate_topic(topic)?;
    if message_bytes > MESSAGE_BYTES_MAX {
        return Err(WireError::PayloadTooLarge {
            field: "message",
            length: message_bytes,
            max: MESSAGE_BYTES_MAX,
        });
    }
    out.reserve(message_header_bytes_as(format, topic.len()));
    let start = out.len();
    out.u8(message_body_version(format));
    if let Err(e) = out.name("topic", topic, TOPIC_BYTES_MAX) {
        out.truncate(start);
        return Err(e);
    }
    out.u64(producer_id);
    out.u64(sequence);
    if format != MessageFormat::Raw {
        out.u8(format as u8);
    }
    // MESSAGE_BYTES_MAX < FRAME_BYTES_MAX ≤ u32::MAX (asserted in limits.rs).
    out.u32(message_bytes as u32);
    Ok(())
}

/// The producer hot path: appends a message event body for `message` to `out` without
/// building a [`MessageEvent`] (one copy of the message bytes). On error `out` is left as
/// it was.
///
/// # Errors
/// As [`EventBody::encode`].
pub fn encode_message_event(
    topic: &str,
    producer_id: u64,
    sequence: u64,
    message_bytes: &[u8],
    out: &mut BytesMut,
) -> Result<(), WireError> {
    out.reserve(message_event_bytes(topic.len(), message_bytes.len()));
    encode_message_header(topic, producer_id, sequence, message_bytes.len(), out)?;
    out.put(message_bytes);
    Ok(())
}

/// Bytes a message event body takes for a topic of `topic_bytes` and a message of
/// `message_bytes` (for batching budgets).
#[must_use]
pub fn message_event_bytes(topic_bytes: usize, message_bytes: usize) -> usize {
    message_header_bytes(topic_bytes) + message_bytes
}
