//! Who talks to whom, and what they say: the simulated processes and the messages between
//! them.
//!
//! Broker ↔ store messages carry the real wire types of quire-proto ([`AppendRequest`],
//! [`PersistedAck`], [`AppendRejected`], [`FenceRequest`], [`FenceGranted`]) so the store side
//! runs the node's own decision rules on exactly what a broker sends. What the real network
//! layer keeps per request (the append id, its epoch and `through`, a fence's epoch) travels
//! alongside as the request's metadata and comes back with the answer, as the broker's slot
//! tasks do with a request id. Nothing is encoded to bytes: the codec is tested in
//! quire-proto.

use bytes::Bytes;
use quire_broker::core::{AppendCommand, AppendId};
use quire_broker::engine::{FetchReply, RequestToken, StoreFetch};
use quire_proto::{
    AppendRejected, AppendRequest, Epoch, FenceGranted, FenceRequest, FetchRequest, Incarnation,
    LogPosition, Offset, PersistedAck, ReadResponse, StoreId,
};

/// One simulated process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum NodeId {
    /// Broker by index (its [`quire_proto::BrokerId`] is `index + 1`).
    Broker(u8),
    /// Store by index (its slot in every broker's cluster configuration).
    Store(u8),
    /// A producer or consumer by index.
    Client(u8),
}

impl NodeId {
    /// A small number for the trace hash.
    pub(crate) fn code(self) -> u64 {
        match self {
            NodeId::Broker(i) => u64::from(i),
            NodeId::Store(i) => 0x100 | u64::from(i),
            NodeId::Client(i) => 0x200 | u64::from(i),
        }
    }
}

impl std::fmt::Display for NodeId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NodeId::Broker(i) => write!(f, "B{}", i + 1),
            NodeId::Store(i) => write!(f, "S{i}"),
            NodeId::Client(i) => write!(f, "C{i}"),
        }
    }
}

/// What the broker keeps about an append it sent (the real slot task's `AppendMeta`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AppendMeta {
    pub(crate) append: AppendId,
    pub(crate) epoch: Epoch,
    pub(crate) through: Option<Offset>,
}

/// Why a broker reads events from a store.
#[derive(Clone, Debug)]
pub(crate) enum ReadPurpose {
    /// A takeover's fetch of the adopted store's tail.
    TakeoverFetch {
        /// The takeover's epoch.
        epoch: Epoch,
    },
    /// A lagging slot's append whose events the master trimmed ([`AppendCommand`] with
    /// `FromStore`): read them, then send the append.
    ForAppend(Box<AppendCommand>),
    /// A consumer's fetch of messages older than the master's window
    /// ([`quire_broker::engine::Command::FetchFromStore`]): answer it from the read.
    ForFetch {
        /// The fetch.
        token: RequestToken,
        /// What the engine planned.
        read: Box<StoreFetch>,
    },
}

/// A produce that failed, as the producer sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProduceError {
    /// Not the master; maybe a hint where it is.
    NotMaster {
        /// The broker index this one believes is master.
        hint: Option<u8>,
    },
    /// The master gave up waiting (the events may still be stabilized later).
    Timeout,
    /// The master refused the sequence (not a batch it can place): a definite failure.
    SequenceGap,
    /// Too many requests waiting.
    Overloaded,
}

/// One message.
#[derive(Clone, Debug)]
pub(crate) enum Msg {
    // ---------------------------------------------------------------- broker → store/slave
    /// An append (to a store or a slave broker).
    Append {
        meta: AppendMeta,
        req: AppendRequest,
    },
    /// A fence, to a store.
    Fence { req: FenceRequest },
    /// A bootstrap probe: the store's tail (the real `TailRequest`).
    Tail { generation: u64 },
    /// Read durable events `from..` (at most `max_events`).
    Read {
        purpose: ReadPurpose,
        from: Offset,
        max_events: u64,
    },
    // ---------------------------------------------------------------- store → broker
    /// A store's persisted ack.
    Persisted { meta: AppendMeta, ack: PersistedAck },
    /// A store or slave refused an append.
    Rejected {
        meta: AppendMeta,
        rejected: AppendRejected,
    },
    /// An append answered with an error frame (malformed, internal): the broker ignores it.
    AppendError { meta: AppendMeta },
    /// The store's tail, for the bootstrap probe `generation` (the real `TailResponse`'s
    /// last durable entry and voter role).
    TailAnswer {
        generation: u64,
        last: Option<LogPosition>,
        voter: bool,
    },
    /// A fence granted.
    FenceGranted(FenceGranted),
    /// A fence refused: a higher epoch is promised.
    FenceRefused { epoch: Epoch, promised: Epoch },
    /// A fence answered "not a voter".
    NotVoter {
        epoch: Epoch,
        store_id: StoreId,
        incarnation: Incarnation,
    },
    /// The node's answer to the read (`quire_node::serve_read`: durable events, the
    /// log's first offset), or `None` for an error answer.
    ReadResult {
        purpose: ReadPurpose,
        from: Offset,
        read: Option<ReadResponse>,
    },
    // ---------------------------------------------------------------- slave → master
    /// A slave holds the append (the real `HeartbeatAck` answer).
    SlaveHas {
        meta: AppendMeta,
        /// The highest master epoch the slave follows.
        epoch: Epoch,
    },
    // ---------------------------------------------------------------- handoff
    /// A master handing over asks this slave to take over now (the real
    /// `TakeOverNowRequest`).
    TakeOverNow {
        /// The handing master's epoch.
        from_epoch: Epoch,
    },
    /// The slave's answer: it takes over (`true`) or refused (it does not follow
    /// `from_epoch`).
    TakeOverAnswer {
        from_epoch: Epoch,
        taking_over: bool,
    },
    // ---------------------------------------------------------------- clients
    /// A producer's batch: messages `sequence..` of `producer_id` to `topic`.
    Produce {
        request: u64,
        producer_id: u64,
        sequence: u64,
        topic: String,
        messages: Vec<Bytes>,
    },
    /// The batch is stabilized at `base_offset..`.
    ProduceOk { request: u64, base_offset: Offset },
    /// The produce failed.
    ProduceFailed { request: u64, error: ProduceError },
    /// A consumer fetches a topic's messages (the real `FetchRequest`, a long poll when
    /// `wait_ms` > 0).
    Fetch { request: u64, req: FetchRequest },
    /// The broker engine's answer to a fetch.
    Fetched { request: u64, reply: FetchReply },
    /// A consumer commits its cursor (the real `CommitCursorRequest`).
    CommitCursor {
        request: u64,
        topic: String,
        cursor: String,
        offset: Offset,
    },
    /// The commit is stabilized (`ok`), or failed (not master, timeout, overloaded).
    CursorCommitted { request: u64, ok: bool },
    /// A consumer reads its committed cursor (the real `CursorRequest`).
    ReadCursor {
        request: u64,
        topic: String,
        cursor: String,
    },
    /// The engine's answer: `None` when the broker does not serve, else the committed
    /// offset (`None`: no commit).
    CursorValue {
        request: u64,
        offset: Option<Option<Offset>>,
    },
}

impl Msg {
    /// A compact digest of the message for the trace hash: its kind and the numbers that
    /// steer the protocol.
    pub(crate) fn digest(&self) -> [u64; 4] {
        fn pos(p: Option<LogPosition>) -> u64 {
            p.map_or(u64::MAX, |p| p.epoch.0.rotate_left(20) ^ p.offset.0)
        }
        fn off(o: Option<Offset>) -> u64 {
            o.map_or(u64::MAX, |o| o.0)
        }
        match self {
            Msg::Append { meta, req } => [1, meta.append.0, req.epoch.0 ^ pos(req.prev), {
                req.events.len() as u64 ^ off(req.hwm).rotate_left(32)
            }],
            Msg::Fence { req } => [2, req.epoch.0, 0, 0],
            Msg::Tail { generation } => [22, *generation, 0, 0],
            Msg::TailAnswer {
                generation,
                last,
                voter,
            } => [23, *generation, pos(*last), u64::from(*voter)],
            Msg::Read {
                from, max_events, ..
            } => [3, from.0, *max_events, 0],
            Msg::Persisted { meta, ack } => [
                4,
                meta.append.0,
                ack.epoch.0,
                off(ack.through_offset) ^ u64::from(ack.voter),
            ],
            Msg::Rejected { meta, rejected } => [
                5,
                meta.append.0,
                rejected.promised.0,
                pos(rejected.last) ^ u64::from(rejected.reason.as_u8()),
            ],
            Msg::AppendError { meta } => [6, meta.append.0, 0, 0],
            Msg::FenceGranted(g) => [7, g.epoch.0, pos(g.last), g.incarnation.0],
            Msg::FenceRefused { epoch, promised } => [8, epoch.0, promised.0, 0],
            Msg::NotVoter {
                epoch,
                store_id,
                incarnation,
            } => [9, epoch.0, store_id.0, incarnation.0],
            Msg::ReadResult { from, read, .. } => [
                10,
                from.0,
                read.as_ref().map_or(u64::MAX, |r| r.events.len() as u64),
                read.as_ref().map_or(u64::MAX, |r| r.first_offset.0),
            ],
            Msg::SlaveHas { meta, epoch } => [11, meta.append.0, epoch.0, 0],
            Msg::TakeOverNow { from_epoch } => [17, from_epoch.0, 0, 0],
            Msg::TakeOverAnswer {
                from_epoch,
                taking_over,
            } => [18, from_epoch.0, u64::from(*taking_over), 0],
            Msg::Produce {
                request,
                producer_id,
                sequence,
                messages,
                ..
            } => [
                12,
                *request,
                *producer_id,
                sequence ^ (messages.len() as u64),
            ],
            Msg::ProduceOk {
                request,
                base_offset,
            } => [13, *request, base_offset.0, 0],
            Msg::ProduceFailed { request, error } => [
                14,
                *request,
                match error {
                    ProduceError::NotMaster { hint } => hint.map_or(100, u64::from),
                    ProduceError::Timeout => 200,
                    ProduceError::SequenceGap => 300,
                    ProduceError::Overloaded => 400,
                },
                0,
            ],
            Msg::Fetch { request, req } => {
                [15, *request, req.from_offset.0, u64::from(req.wait_ms)]
            }
            Msg::Fetched { request, reply } => match reply {
                FetchReply::Messages(m) => [16, *request, m.next_offset.0, m.messages.len() as u64],
                FetchReply::Trimmed { first, .. } => [16, *request, first.0, u64::MAX],
                FetchReply::NotMaster => [16, *request, u64::MAX, 1],
                FetchReply::Unavailable => [16, *request, u64::MAX, 2],
            },
            Msg::CommitCursor {
                request, offset, ..
            } => [24, *request, offset.0, 0],
            Msg::CursorCommitted { request, ok } => [25, *request, u64::from(*ok), 0],
            Msg::ReadCursor { request, .. } => [26, *request, 0, 0],
            Msg::CursorValue { request, offset } => [
                27,
                *request,
                match offset {
                    None => u64::MAX,
                    Some(None) => u64::MAX - 1,
                    Some(Some(o)) => o.0,
                },
                0,
            ],
        }
    }
}

/// A message in flight: who sent it to whom, and the process incarnations (boots) of both
/// ends when it was sent. A message reaches only the incarnation it was sent to (a
/// restarted process has new connections); one sent by an incarnation that died since is
/// still delivered (its bytes were already on the wire), but the answer goes nowhere.
#[derive(Clone, Debug)]
pub(crate) struct Envelope {
    pub(crate) from: NodeId,
    pub(crate) to: NodeId,
    pub(crate) from_boot: u32,
    pub(crate) to_boot: u32,
    pub(crate) msg: Msg,
}
