//! The client ↔ broker bodies (a first cut: the broker may add to them): produce, fetch,
//! cursor commit and lookup, cluster metadata.
//!
//! | request | responses |
//! | --- | --- |
//! | [`ProduceRequest`] | [`ProduceResponse`] (after the messages are stabilized) |
//! | [`FetchRequest`] | [`FetchResponse`] (stabilized messages only) |
//! | [`CommitCursorRequest`] | [`CommitCursorResponse`] (after the commit is stabilized) |
//! | [`CursorRequest`] | [`CursorResponse`] |
//! | [`MetadataRequest`] | [`MetadataResponse`] (any broker answers) |
//! | [`HandoffRequest`] | [`HandoffResponse`] (the master, once the new master serves) |
//!
//! Every one may also be answered by an `ErrorResponse`; a broker that is not the master
//! answers produce, fetch and cursor requests with code `NotMaster` and a hint.
//! Topic and cursor names are non-empty UTF-8 of at most [`TOPIC_BYTES_MAX`] /
//! [`CURSOR_BYTES_MAX`] bytes.

use bytes::Bytes;

use crate::codec::{BodyWriter, Reader};
use crate::error::WireError;
use crate::event_body::{MessageFormat, SNAPSHOT_TOPICS_MAX};
use crate::limits::{
    ADDR_BYTES_MAX, CURSOR_BYTES_MAX, MEMBERS_MAX, MESSAGES_PER_FRAME_MAX, TOPIC_BYTES_MAX,
};
use crate::types::{BrokerId, Epoch, Incarnation, Offset, StoreId};

/// A [`MessageFormat`] byte of a produce request or fetch response.
fn read_message_format(
    r: &mut Reader<'_>,
    field: &'static str,
) -> Result<MessageFormat, WireError> {
    match r.u8(field)? {
        0 => Ok(MessageFormat::Raw),
        1 => Ok(MessageFormat::Kafka),
        byte => Err(WireError::InvalidTag { field, byte }),
    }
}

/// Checks a topic name: non-empty, at most [`TOPIC_BYTES_MAX`] bytes (a `&str` is UTF-8
/// already).
///
/// # Errors
/// [`WireError::EmptyName`] or [`WireError::StringTooLong`].
pub fn validate_topic(topic: &str) -> Result<(), WireError> {
    validate_name("topic", topic, TOPIC_BYTES_MAX)
}

/// Checks a cursor name: non-empty, at most [`CURSOR_BYTES_MAX`] bytes.
///
/// # Errors
/// [`WireError::EmptyName`] or [`WireError::StringTooLong`].
pub fn validate_cursor(cursor: &str) -> Result<(), WireError> {
    validate_name("cursor", cursor, CURSOR_BYTES_MAX)
}

fn validate_name(field: &'static str, name: &str, max: usize) -> Result<(), WireError> {
    if name.is_empty() {
        return Err(WireError::EmptyName { field });
    }
    if name.len() > max {
        return Err(WireError::StringTooLong {
            field,
            length: name.len(),
            max,
        });
    }
    Ok(())
}

/// One broker: its id and the address clients and brokers reach it at.
///
/// ```text
/// 2      id                    u16 (BrokerId)
/// 2+n    addr                  string ≤ ADDR_BYTES_MAX ("host:port")
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BrokerInfo {
    /// The broker's id.
    pub id: BrokerId,
    /// Its address, `host:port`.
    pub addr: String,
}

/// One store as the master sees it.
///
/// ```text
/// 8      store_id              u64
/// 8      incarnation           u64
/// 2+n    addr                  string ≤ ADDR_BYTES_MAX
/// 1      voter                 bool
/// 1|9    persisted             Option<Offset>: highest through_offset it acked
/// 1      connected             bool: the answering broker has a connection to it
/// 1|9    corrupt               Option<Offset>: lowest record known damaged
/// 1|9    lag_bytes             Option<u64>: bytes it lacks below the HWM (master's view)
/// 1|9    catch_up_rate         Option<u64>: offsets/s its acks advanced, last ~3 s
/// 1|9    catch_up_ms           Option<u64>: estimated ms until it holds the HWM
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreInfo {
    /// The store's identity.
    pub store_id: StoreId,
    /// Its incarnation.
    pub incarnation: Incarnation,
    /// Its address, `host:port`.
    pub addr: String,
    /// `false` for a store on a new incarnation (a learner, shown by `quire cluster status`).
    pub voter: bool,
    /// Highest `through_offset` it has acked to this master.
    pub persisted: Option<Offset>,
    /// Whether the answering broker has a live connection to the store now (`false`: down,
    /// unreachable, or not dialled by this broker).
    pub connected: bool,
    /// The lowest record of the store known damaged and not yet repaired (the master's
    /// view: from the store's `Corrupt` answers and acks; `None` from a slave).
    pub corrupt: Option<Offset>,
    /// Accounted bytes (payload plus a fixed per-event overhead) of the events at or below
    /// the master's HWM that the store has not acked: summed over the first 4,096 of them
    /// the master holds in memory, the others estimated at the mean size; `None` from a slave,
    /// or while the store has acked nothing to this master.
    pub lag_bytes: Option<u64>,
    /// Offsets per second by which the store's acked offset advanced over the master's
    /// last ~3 s of samples; `None` from a slave or before a second's worth of samples.
    pub catch_up_rate: Option<u64>,
    /// Estimated milliseconds until the store holds the master's HWM, at its
    /// `catch_up_rate` against the rate at which the HWM grows: `Some(0)` when it lacks
    /// nothing, `None` when it is not closing in (or from a slave).
    pub catch_up_ms: Option<u64>,
}

/// Producer → master: append `messages` to `topic`.
///
/// The master gives the batch consecutive log offsets. With `producer_id != 0` the produce
/// is idempotent: message `i` has sequence `sequence + i`, and the master drops a batch
/// it already holds (answering with the original offsets). `producer_id == 0` means no
/// deduplication.
///
/// ```text
/// off   size   field
/// 0     2+n    topic                 string ≤ TOPIC_BYTES_MAX
/// ..    8      producer_id           u64 (0: not idempotent)
/// ..    8      sequence              u64: sequence of messages[0]
/// ..    4      message count         u32, ≤ MESSAGES_PER_FRAME_MAX
/// per message: 4 length u32, n bytes
/// ..    0|1    format                u8, only for MessageFormat::Kafka (1): the messages
///                                    are Kafka records (crate::record); absent: opaque
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceRequest {
    /// Topic name.
    pub topic: String,
    /// Producer id for deduplication; 0 for none.
    pub producer_id: u64,
    /// Sequence number of the first message.
    pub sequence: u64,
    /// The messages, each at most `MESSAGE_BYTES_MAX` bytes.
    pub messages: Vec<Bytes>,
    /// What the messages are (the Kafka listener writes [`MessageFormat::Kafka`]).
    pub format: MessageFormat,
}

/// Master → producer: the messages are stabilized at log offsets
/// `base_offset .. base_offset + count`.
///
/// ```text
/// off   size   field
/// 0     8      base_offset           u64
/// 8     4      count                 u32
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProduceResponse {
    /// Log offset of the first message.
    pub base_offset: Offset,
    /// Number of messages.
    pub count: u32,
}

/// Consumer → master: stabilized messages of `topic` at log offsets `>= from_offset`.
///
/// If there are none yet, the master may hold the request up to `wait_ms` milliseconds.
///
/// ```text
/// off   size   field
/// 0     2+n    topic                 string ≤ TOPIC_BYTES_MAX
/// ..    8      from_offset           u64: log offset
/// ..    4      max_messages          u32
/// ..    4      max_bytes             u32: message bytes
/// ..    4      wait_ms               u32
/// ..    0|1    records               u8, only when set (1): answer Kafka records whole,
///                                    with each message's format
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchRequest {
    /// Topic name.
    pub topic: String,
    /// First log offset wanted.
    pub from_offset: Offset,
    /// Most messages to return.
    pub max_messages: u32,
    /// Most message bytes to return (at least one message is returned regardless).
    pub max_bytes: u32,
    /// Longest time to wait for a message, in milliseconds.
    pub wait_ms: u32,
    /// `false` (native consumers): a Kafka record is answered as its value alone.
    /// `true` (the Kafka listener): every message is answered as stored, and the response
    /// lists each message's format.
    pub records: bool,
}

/// Master → consumer: messages with their log offsets, in offset order.
///
/// ```text
/// off   size   field
/// 0     1|9    hwm                   Option<Offset>: the master's HWM
/// ..    8      next_offset           u64: where the next fetch starts
/// ..    4      message count         u32, ≤ MESSAGES_PER_FRAME_MAX
/// per message: 8 offset u64, 4 length u32, n bytes
/// then, only if the request asked for records and there are messages:
/// ..    n      formats               u8 per message (0 opaque, 1 Kafka record)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchResponse {
    /// The master's high-water mark.
    pub hwm: Option<Offset>,
    /// Log offset the next fetch of this topic should start at (past the last message
    /// returned, or past the log range scanned when no message of the topic was in it).
    pub next_offset: Offset,
    /// `(log offset, message)` pairs, offsets increasing.
    pub messages: Vec<(Offset, Bytes)>,
    /// Each message's format, in the same order, when the request asked for
    /// [`FetchRequest::records`]; empty otherwise.
    pub formats: Vec<MessageFormat>,
}

/// Consumer → master: durably set `cursor` of `topic` to `offset` (the next log offset
/// the consumer wants).
///
/// ```text
/// off   size   field
/// 0     2+n    topic                 string ≤ TOPIC_BYTES_MAX
/// ..    2+n    cursor                string ≤ CURSOR_BYTES_MAX
/// ..    8      offset                u64
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommitCursorRequest {
    /// Topic name.
    pub topic: String,
    /// Cursor name.
    pub cursor: String,
    /// Offset to store.
    pub offset: Offset,
}

/// Master → consumer: the cursor commit is stabilized. Empty body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CommitCursorResponse;

/// Consumer → master: the committed offset of `cursor` on `topic`.
///
/// ```text
/// off   size   field
/// 0     2+n    topic                 string ≤ TOPIC_BYTES_MAX
/// ..    2+n    cursor                string ≤ CURSOR_BYTES_MAX
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorRequest {
    /// Topic name.
    pub topic: String,
    /// Cursor name.
    pub cursor: String,
}

/// Master → consumer: the cursor's committed offset (`None`: never committed).
///
/// ```text
/// off   size   field
/// 0     1|9    offset                Option<Offset>
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CursorResponse {
    /// Committed offset.
    pub offset: Option<Offset>,
}

/// Operator → master: create or delete a topic (a [`crate::TopicAdminEvent`] through the
/// log), answered with [`crate::AdminResponse`] once stabilized.
///
/// Create: the topic must not exist (`TopicExists`), `partitions` must be 1 (every topic
/// is one partition for now: `InvalidPartitions`), and a new topic counts against
/// `topics_max` (`LimitReached`). Delete: the topic must exist (`UnknownTopic`); its
/// messages stay in the log until retention but are no longer served, and a message
/// produced to the name later starts it again, empty. `partitions` is 0 for a delete.
///
/// ```text
/// off   size   field
/// 0     1      action                u8: 1 create, 2 delete
/// 1     2+n    topic                 string ≤ TOPIC_BYTES_MAX
/// ..    4      partitions            u32
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicAdminRequest {
    /// Create or delete.
    pub action: crate::TopicAction,
    /// Topic name.
    pub topic: String,
    /// Partitions of a new topic (1); 0 for a delete.
    pub partitions: u32,
}

/// Add or remove one voter (DESIGN.md "Membership changes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VoterChange {
    /// Make the store a voter.
    Add = 1,
    /// Make the store a learner.
    Remove = 2,
}

/// Operator → master: add one store to the voter set or remove one, naming it by its
/// position in the brokers' store list and the identity expected there (what
/// `quire cluster status` shows), so a store that changed since is not changed by mistake.
///
/// The master appends a `Config` event naming the new set and answers with an empty
/// `AdminResponse` once it is stabilized. Refusals, nothing changed: `VoterChangeRefused`
/// (the message says why), `ChangeInProgress` (one change at a time; retry),
/// `StoreCatchingUp` (an added store must hold the log up to the HWM first; retry),
/// `NotMaster`. Needs the `admin` right.
///
/// ```text
/// off   size   field
/// 0     1      action                u8: 1 add, 2 remove
/// 1     2      store_index           u16: position in the store list
/// 3     8      store_id              u64
/// 11    8      incarnation           u64
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VoterChangeRequest {
    /// Add or remove.
    pub action: VoterChange,
    /// The store's position in the brokers' store list.
    pub store_index: u16,
    /// The store's id.
    pub store_id: StoreId,
    /// The store's incarnation.
    pub incarnation: Incarnation,
}

/// Anyone → any broker: who is master, and what the cluster looks like.
///
/// ```text
/// off   size   field
/// 0     0|1    topics                u8, only when set (1): list the topics too
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetadataRequest {
    /// Whether the answer lists the topics ([`MetadataResponse::topics`]).
    pub topics: bool,
}

/// Broker → anyone: the broker's view of the cluster.
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64: highest epoch this broker knows
/// 8     1|9    hwm                   Option<Offset>
/// ..    1|…    master                Option<BrokerInfo>: tag u8, then BrokerInfo
/// ..    4      broker count          u32, ≤ MEMBERS_MAX, then BrokerInfo each
/// ..    4      store count           u32, ≤ MEMBERS_MAX, then StoreInfo each
/// ..    1|9    applied               Option<Offset>: highest offset applied to this broker's state
/// ..    1|3+n  kafka                 Option<string ≤ ADDR_BYTES_MAX>: tag u8, then this
///                                    broker's advertised Kafka address ("host:port")
/// ..    2      ack_quorum            u16: Qa of the voter set in force here
/// ..    1|9    change_pending        Option<Offset>: a voter-set change not stabilized yet
/// then, only if the request asked for topics and there are any:
/// ..    4      topic count           u32, ≤ SNAPSHOT_TOPICS_MAX, then a string each
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MetadataResponse {
    /// Highest epoch this broker knows.
    pub epoch: Epoch,
    /// The HWM this broker knows.
    pub hwm: Option<Offset>,
    /// The master, if known.
    pub master: Option<BrokerInfo>,
    /// Every broker.
    pub brokers: Vec<BrokerInfo>,
    /// Every store.
    pub stores: Vec<StoreInfo>,
    /// The highest stabilized offset this broker has applied to its own copy of the broker
    /// state (topics, cursors, producer table); `None` before the first. On a slave it
    /// trails the master's HWM by the replication lag.
    pub applied: Option<Offset>,
    /// This broker's Kafka listener as Kafka clients' metadata advertises it (`host:port`,
    /// its `kafka_brokers` entry, else the bound `kafka_listen` address); `None` when it
    /// has no Kafka listener. What `quire cluster status` prints as bootstrap servers.
    pub kafka: Option<String>,
    /// Qa: voting stores that must persist an event before it is stabilized, in the voter
    /// set in force at this broker (a majority of the voters unless configured).
    pub ack_quorum: u16,
    /// Offset of a voter-set change the master appended and has not stabilized yet
    /// (`None` from a slave, or when no change is in flight).
    pub change_pending: Option<Offset>,
    /// The topics this broker's state holds, by name, when the request asked for them
    /// ([`MetadataRequest::topics`]); empty otherwise.
    pub topics: Vec<String>,
}

/// Operator → master: hand mastership to slave broker `to` (graceful handoff, DESIGN.md
/// "Graceful handoff"). The master stops taking new writes (they wait, unanswered), waits
/// until its HWM covers everything it accepted, tells `to` to take over
/// ([`crate::TakeOverNowRequest`]), steps down to slave, and answers once it has seen the
/// new master's epoch-start event stabilized. A broker that is not the master answers
/// `NotMaster` with a hint; a handoff that does not finish within the broker's bound is
/// answered `Timeout` (the old master serves again if it had not handed over yet).
///
/// ```text
/// off   size   field
/// 0     2      to                    u16 (BrokerId): the slave to hand mastership to
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandoffRequest {
    /// The slave broker that should become master.
    pub to: BrokerId,
}

/// Master (now a slave) → operator: the handoff finished.
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64: the new master's epoch
/// 8     2      master                u16 (BrokerId): the new master
/// 10    8      pause_us              u64: how long writes waited, in microseconds
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandoffResponse {
    /// The new master's epoch.
    pub epoch: Epoch,
    /// The new master.
    pub master: BrokerId,
    /// From the request's arrival to the new master serving, in microseconds: the pause
    /// producers saw.
    pub pause_us: u64,
}

// ---- encoding ----

/// Smallest `BrokerInfo` on the wire: id + empty address.
const BROKER_INFO_BYTES_MIN: usize = 2 + 2;
/// Smallest `StoreInfo` on the wire.
const STORE_INFO_BYTES_MIN: usize = 8 + 8 + 2 + 1 + 1 + 1 + 1 + 1 + 1 + 1;

impl BrokerInfo {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u16(self.id.0);
        w.string("broker addr", &self.addr, ADDR_BYTES_MAX)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(BrokerInfo {
            id: BrokerId(r.u16("broker id")?),
            addr: r.string("broker addr", ADDR_BYTES_MAX)?,
        })
    }

    pub(crate) fn write_opt<W: BodyWriter>(
        v: Option<&BrokerInfo>,
        w: &mut W,
    ) -> Result<(), WireError> {
        match v {
            None => {
                w.u8(0);
                Ok(())
            }
            Some(b) => {
                w.u8(1);
                b.write(w)
            }
        }
    }

    pub(crate) fn read_opt(r: &mut Reader<'_>) -> Result<Option<Self>, WireError> {
        if r.bool("master")? {
            Ok(Some(BrokerInfo::read(r)?))
        } else {
            Ok(None)
        }
    }
}

impl StoreInfo {
    fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.store_id.0);
        w.u64(self.incarnation.0);
        w.string("store addr", &self.addr, ADDR_BYTES_MAX)?;
        w.bool(self.voter);
        w.opt_offset(self.persisted);
        w.bool(self.connected);
        w.opt_offset(self.corrupt);
        w.opt_u64(self.lag_bytes);
        w.opt_u64(self.catch_up_rate);
        w.opt_u64(self.catch_up_ms);
        Ok(())
    }

    fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(StoreInfo {
            store_id: StoreId(r.u64("store id")?),
            incarnation: Incarnation(r.u64("store incarnation")?),
            addr: r.string("store addr", ADDR_BYTES_MAX)?,
            voter: r.bool("store voter")?,
            persisted: r.opt_offset("store persisted")?,
            connected: r.bool("store connected")?,
            corrupt: r.opt_offset("store corrupt")?,
            lag_bytes: r.opt_u64("store lag bytes")?,
            catch_up_rate: r.opt_u64("store catch-up rate")?,
            catch_up_ms: r.opt_u64("store catch-up ms")?,
        })
    }
}

impl ProduceRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.name("topic", &self.topic, TOPIC_BYTES_MAX)?;
        w.u64(self.producer_id);
        w.u64(self.sequence);
        w.count(
            "produce messages",
            self.messages.len(),
            MESSAGES_PER_FRAME_MAX,
        )?;
        for m in &self.messages {
            w.payload("produce messages", m)?;
        }
        if self.format != MessageFormat::Raw {
            w.u8(self.format as u8);
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let topic = r.name("topic", TOPIC_BYTES_MAX)?;
        let producer_id = r.u64("produce producer_id")?;
        let sequence = r.u64("produce sequence")?;
        let count = r.count("produce messages", MESSAGES_PER_FRAME_MAX, 4)?;
        let mut messages = Vec::with_capacity(count);
        for _ in 0..count {
            messages.push(r.payload("produce messages")?);
        }
        let format = if r.remaining() > 0 {
            read_message_format(r, "produce format")?
        } else {
            MessageFormat::Raw
        };
        Ok(ProduceRequest {
            format,
            topic,
            producer_id,
            sequence,
            messages,
        })
    }
}

impl ProduceResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.base_offset.0);
        w.u32(self.count);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(ProduceResponse {
            base_offset: r.offset("produce base_offset")?,
            count: r.u32("produce count")?,
        })
    }
}

impl FetchRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.name("topic", &self.topic, TOPIC_BYTES_MAX)?;
        w.u64(self.from_offset.0);
        w.u32(self.max_messages);
        w.u32(self.max_bytes);
        w.u32(self.wait_ms);
        if self.records {
            w.u8(1);
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(FetchRequest {
            topic: r.name("topic", TOPIC_BYTES_MAX)?,
            from_offset: r.offset("fetch from_offset")?,
            max_messages: r.u32("fetch max_messages")?,
            max_bytes: r.u32("fetch max_bytes")?,
            wait_ms: r.u32("fetch wait_ms")?,
            records: r.remaining() > 0 && r.bool("fetch records")?,
        })
    }
}

impl FetchResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.opt_offset(self.hwm);
        w.u64(self.next_offset.0);
        w.count(
            "fetch messages",
            self.messages.len(),
            MESSAGES_PER_FRAME_MAX,
        )?;
        for (offset, m) in &self.messages {
            w.u64(offset.0);
            w.payload("fetch messages", m)?;
        }
        if !self.formats.is_empty() {
            if self.formats.len() != self.messages.len() {
                return Err(WireError::CountTooLarge {
                    field: "fetch formats",
                    count: self.formats.len() as u64,
                    max: self.messages.len() as u64,
                });
            }
            for f in &self.formats {
                w.u8(*f as u8);
            }
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let hwm = r.opt_offset("fetch hwm")?;
        let next_offset = r.offset("fetch next_offset")?;
        let count = r.count("fetch messages", MESSAGES_PER_FRAME_MAX, 8 + 4)?;
        let mut messages = Vec::with_capacity(count);
        for _ in 0..count {
            let offset = r.offset("fetch messages")?;
            messages.push((offset, r.payload("fetch messages")?));
        }
        let mut formats = Vec::new();
        if r.remaining() > 0 {
            formats.reserve(count);
            for _ in 0..count {
                formats.push(read_message_format(r, "fetch formats")?);
            }
        }
        Ok(FetchResponse {
            formats,
            hwm,
            next_offset,
            messages,
        })
    }
}

impl CommitCursorRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.name("topic", &self.topic, TOPIC_BYTES_MAX)?;
        w.name("cursor", &self.cursor, CURSOR_BYTES_MAX)?;
        w.u64(self.offset.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(CommitCursorRequest {
            topic: r.name("topic", TOPIC_BYTES_MAX)?,
            cursor: r.name("cursor", CURSOR_BYTES_MAX)?,
            offset: r.offset("commit offset")?,
        })
    }
}

impl CommitCursorResponse {
    pub(crate) fn write<W: BodyWriter>(&self, _w: &mut W) -> Result<(), WireError> {
        Ok(())
    }

    pub(crate) fn read(_r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(CommitCursorResponse)
    }
}

impl CursorRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.name("topic", &self.topic, TOPIC_BYTES_MAX)?;
        w.name("cursor", &self.cursor, CURSOR_BYTES_MAX)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(CursorRequest {
            topic: r.name("topic", TOPIC_BYTES_MAX)?,
            cursor: r.name("cursor", CURSOR_BYTES_MAX)?,
        })
    }
}

impl CursorResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.opt_offset(self.offset);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(CursorResponse {
            offset: r.opt_offset("cursor offset")?,
        })
    }
}

impl TopicAdminRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u8(self.action as u8);
        w.name("topic", &self.topic, TOPIC_BYTES_MAX)?;
        w.u32(self.partitions);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let field = "topic admin action";
        let action = match r.u8(field)? {
            1 => crate::TopicAction::Create,
            2 => crate::TopicAction::Delete,
            byte => return Err(WireError::InvalidTag { field, byte }),
        };
        Ok(TopicAdminRequest {
            action,
            topic: r.name("topic", TOPIC_BYTES_MAX)?,
            partitions: r.u32("topic admin partitions")?,
        })
    }
}

impl VoterChangeRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u8(self.action as u8);
        w.u16(self.store_index);
        w.u64(self.store_id.0);
        w.u64(self.incarnation.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let field = "voter change action";
        let action = match r.u8(field)? {
            1 => VoterChange::Add,
            2 => VoterChange::Remove,
            byte => return Err(WireError::InvalidTag { field, byte }),
        };
        Ok(VoterChangeRequest {
            action,
            store_index: r.u16("voter change store index")?,
            store_id: StoreId(r.u64("voter change store id")?),
            incarnation: Incarnation(r.u64("voter change incarnation")?),
        })
    }
}

impl MetadataRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        if self.topics {
            w.u8(1);
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(MetadataRequest {
            topics: r.remaining() > 0 && r.bool("metadata topics")?,
        })
    }
}

impl MetadataResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        w.opt_offset(self.hwm);
        BrokerInfo::write_opt(self.master.as_ref(), w)?;
        w.count("metadata brokers", self.brokers.len(), MEMBERS_MAX)?;
        for b in &self.brokers {
            b.write(w)?;
        }
        w.count("metadata stores", self.stores.len(), MEMBERS_MAX)?;
        for s in &self.stores {
            s.write(w)?;
        }
        w.opt_offset(self.applied);
        match &self.kafka {
            None => w.u8(0),
            Some(addr) => {
                w.u8(1);
                w.string("metadata kafka", addr, ADDR_BYTES_MAX)?;
            }
        }
        w.u16(self.ack_quorum);
        w.opt_offset(self.change_pending);
        if !self.topics.is_empty() {
            w.count("metadata topics", self.topics.len(), SNAPSHOT_TOPICS_MAX)?;
            for t in &self.topics {
                w.name("topic", t, TOPIC_BYTES_MAX)?;
            }
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let epoch = r.epoch("metadata epoch")?;
        let hwm = r.opt_offset("metadata hwm")?;
        let master = BrokerInfo::read_opt(r)?;
        let count = r.count("metadata brokers", MEMBERS_MAX, BROKER_INFO_BYTES_MIN)?;
        let mut brokers = Vec::with_capacity(count);
        for _ in 0..count {
            brokers.push(BrokerInfo::read(r)?);
        }
        let count = r.count("metadata stores", MEMBERS_MAX, STORE_INFO_BYTES_MIN)?;
        let mut stores = Vec::with_capacity(count);
        for _ in 0..count {
            stores.push(StoreInfo::read(r)?);
        }
        let applied = r.opt_offset("metadata applied")?;
        let kafka = match r.u8("metadata kafka")? {
            0 => None,
            1 => Some(r.string("metadata kafka", ADDR_BYTES_MAX)?),
            byte => {
                return Err(WireError::InvalidTag {
                    field: "metadata kafka",
                    byte,
                })
            }
        };
        let ack_quorum = r.u16("metadata ack quorum")?;
        let change_pending = r.opt_offset("metadata change pending")?;
        let mut topics = Vec::new();
        if r.remaining() > 0 {
            let count = r.count("metadata topics", SNAPSHOT_TOPICS_MAX, 3)?;
            topics.reserve(count);
            for _ in 0..count {
                topics.push(r.name("topic", TOPIC_BYTES_MAX)?);
            }
        }
        Ok(MetadataResponse {
            topics,
            epoch,
            hwm,
            master,
            brokers,
            stores,
            applied,
            kafka,
            ack_quorum,
            change_pending,
        })
    }
}

impl HandoffRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u16(self.to.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(HandoffRequest {
            to: BrokerId(r.u16("handoff to")?),
        })
    }
}

impl HandoffResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        w.u16(self.master.0);
        w.u64(self.pause_us);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(HandoffResponse {
            epoch: r.epoch("handoff epoch")?,
            master: BrokerId(r.u16("handoff master")?),
            pause_us: r.u64("handoff pause_us")?,
        })
    }
}
