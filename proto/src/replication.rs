//! The replication protocol's bodies: master broker ↔ event store (append, persisted ack,
//! fence, read, tail) and master ↔ slave broker (append, heartbeat). DESIGN.md
//! "Replication protocol" gives the rules; this module gives the bytes.
//!
//! Message flow (request → possible responses; `ErrorResponse` is always possible):
//!
//! | request | responses |
//! | --- | --- |
//! | [`AppendRequest`] | [`PersistedAck`] (after the fsync), [`AppendRejected`] |
//! | [`FenceRequest`] | [`FenceGranted`], [`FenceRefused`], `ErrorResponse` `NotVoter` |
//! | [`ReadRequest`] | [`ReadResponse`] |
//! | [`TailRequest`] | [`TailResponse`] |
//! | [`RangeDigestRequest`] | [`RangeDigestResponse`] (read-only, for audits) |
//! | [`RepairRequest`] | [`RepairResponse`], `ErrorResponse` `Corrupt` (the rewrite did not read back) |
//! | [`Heartbeat`] | [`HeartbeatAck`] |
//! | [`TakeOverNowRequest`] | [`TakeOverNowResponse`] (graceful handoff, master → slave) |
//!
//! Events travel without their offsets: an append's events sit at consecutive offsets
//! starting right after `prev` (at 0 when `prev` is `None`), a read response's at
//! consecutive offsets from its first event's. The encoder refuses events that are not
//! contiguous ([`WireError::EventsNotContiguous`]); the decoder rebuilds the offsets.

use crate::codec::{BodyWriter, Reader};
use crate::digest::EntryId;
use crate::error::WireError;
use crate::limits::{EVENTS_PER_FRAME_MAX, RANGE_DIGEST_OFFSETS_MAX};
use crate::payload::Payload;
use crate::types::{BrokerId, Epoch, EventKind, Incarnation, LogPosition, Offset, StoreId};

/// Bytes one event takes on the wire before its payload: epoch u64, kind u8, length u32.
pub const EVENT_OVERHEAD_BYTES: usize = 8 + 1 + 4;

/// One log entry: `(epoch, offset, kind, payload)` (DESIGN.md "Vocabulary"). The one type
/// for it everywhere: on the wire, in the broker's replication cores and engine, in the
/// store and in the WAL (which appends and reads it back).
///
/// Cloning one clones the payload's handle (a reference-count increment), never its bytes,
/// so an event received from a producer reaches every store and slave without a copy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    /// Epoch of the master that first appended this event.
    pub epoch: Epoch,
    /// The event's offset in the log.
    pub offset: Offset,
    /// What the event means to the broker (stores never interpret it).
    pub kind: EventKind,
    /// The event's body (see `event_body` for the broker's encodings), in one or two
    /// shared chunks ([`Payload`]). On decode, one slice of the frame's buffer: holding it
    /// keeps that buffer alive.
    pub payload: Payload,
}

impl Event {
    /// `(epoch, offset)` of this event: what log matching compares.
    #[must_use]
    pub fn position(&self) -> LogPosition {
        LogPosition {
            epoch: self.epoch,
            offset: self.offset,
        }
    }

    /// Bytes this event takes inside an `AppendRequest` or `ReadResponse`.
    #[must_use]
    pub fn encoded_bytes(&self) -> usize {
        EVENT_OVERHEAD_BYTES + self.payload.len()
    }
}

/// Writes `count u32` then each event (`epoch u64, kind u8, payload length u32, payload`),
/// checking that event `i` sits at `first + i`.
fn write_events<W: BodyWriter>(
    w: &mut W,
    field: &'static str,
    first: Option<u64>,
    events: &[Event],
) -> Result<(), WireError> {
    w.count(field, events.len(), EVENTS_PER_FRAME_MAX)?;
    if events.is_empty() {
        return Ok(());
    }
    let first = first.ok_or(WireError::OffsetOverflow { field })?;
    first
        .checked_add(events.len() as u64)
        .ok_or(WireError::OffsetOverflow { field })?;
    for (index, event) in events.iter().enumerate() {
        let expected = Offset(first + index as u64);
        if event.offset != expected {
            return Err(WireError::EventsNotContiguous {
                index,
                expected,
                actual: event.offset,
            });
        }
        w.u64(event.epoch.0);
        w.u8(event.kind.as_u8());
        w.payload_chunks(field, &event.payload)?;
    }
    Ok(())
}

fn read_events(
    r: &mut Reader<'_>,
    field: &'static str,
    first: Option<u64>,
) -> Result<Vec<Event>, WireError> {
    let count = r.count(field, EVENTS_PER_FRAME_MAX, EVENT_OVERHEAD_BYTES)?;
    if count == 0 {
        return Ok(Vec::new());
    }
    let first = first.ok_or(WireError::OffsetOverflow { field })?;
    first
        .checked_add(count as u64)
        .ok_or(WireError::OffsetOverflow { field })?;
    let mut events = Vec::with_capacity(count);
    for index in 0..count {
        let epoch = r.epoch(field)?;
        let byte = r.u8(field)?;
        let kind = EventKind::from_u8(byte).ok_or(WireError::UnknownEventKind { byte })?;
        let payload = r.payload(field)?.into();
        events.push(Event {
            epoch,
            offset: Offset(first + index as u64),
            kind,
            payload,
        });
    }
    Ok(events)
}

/// Master → store and master → slave broker: "append these events after `prev`".
///
/// A store accepts only if `epoch >= promised` and its entry at `prev` matches (log
/// matching); it keeps equal entries, truncates from the first offset whose epoch differs,
/// appends the rest, raises `promised` to `epoch`, and after the fsync answers
/// [`PersistedAck`] with `through_offset` = [`AppendRequest::through_offset`]. Otherwise it
/// answers [`AppendRejected`]. An append with no events carries only `hwm`.
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64: the sending master's epoch
/// 8     1|17   prev                  Option<LogPosition>: entry right before events[0]
/// ..    1|9    hwm                   Option<Offset>: master's high-water mark
/// ..    4      event count           u32, ≤ EVENTS_PER_FRAME_MAX
/// per event (offsets implied: prev.offset+1+i, or i when prev is none):
///       8      epoch                 u64
///       1      kind                  u8 (EventKind)
///       4      payload length        u32
///       n      payload
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRequest {
    /// The master's epoch.
    pub epoch: Epoch,
    /// The entry right before `events[0]`; `None` when the events start the log at 0.
    pub prev: Option<LogPosition>,
    /// Events at consecutive offsets after `prev`.
    pub events: Vec<Event>,
    /// The master's high-water mark (`None`: nothing stabilized yet).
    pub hwm: Option<Offset>,
}

impl AppendRequest {
    /// Offset of the first event: `prev.offset + 1`, or 0 without `prev`; `None` on
    /// overflow.
    #[must_use]
    pub fn first_offset(&self) -> Option<Offset> {
        first_after(self.prev).map(Offset)
    }

    /// The offset a store acks for this append: `prev.offset + events.len()`, the end of
    /// the range this append matched (never the store's own log end). `None` when there
    /// is nothing to ack (no `prev` and no events).
    ///
    /// # Panics
    /// If the offsets overflow u64 (impossible for a decoded request: the decoder checks).
    #[must_use]
    pub fn through_offset(&self) -> Option<Offset> {
        let n = self.events.len() as u64;
        match self.prev {
            None if n == 0 => None,
            None => Some(Offset(n - 1)),
            Some(p) => Some(Offset(
                p.offset
                    .0
                    .checked_add(n)
                    .expect("invariant: an append's offsets fit in u64"),
            )),
        }
    }
}

fn first_after(prev: Option<LogPosition>) -> Option<u64> {
    match prev {
        None => Some(0),
        Some(p) => p.offset.0.checked_add(1),
    }
}

/// Store → master (or slave → master): everything through `through_offset` is durable
/// here. Answers one [`AppendRequest`]; cumulative.
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64: the epoch of the append it answers
/// 8     1|9    through_offset        Option<Offset>: prev.offset + events.len()
/// ..    8      store_id              u64
/// ..    8      incarnation           u64
/// ..    1      voter                 bool: false on a new incarnation, never counted
/// ..    1|9    corrupt               Option<Offset>: the lowest record the store knows
///                                    damaged (docs/protocol.md, "Damaged records")
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PersistedAck {
    /// Epoch of the append this acks.
    pub epoch: Epoch,
    /// `AppendRequest::through_offset` of the append this acks.
    pub through_offset: Option<Offset>,
    /// The store's identity.
    pub store_id: StoreId,
    /// The store's incarnation.
    pub incarnation: Incarnation,
    /// `false` for a store on a new incarnation: a learner, which brokers never count
    /// toward Qa.
    pub voter: bool,
    /// The lowest offset whose record the store knows damaged, if any: the master repairs
    /// it. `None` from a slave broker.
    pub corrupt: Option<Offset>,
}

/// Why a store or a slave broker refused an append (DESIGN.md "Replication protocol"). One
/// byte on the wire (`AppendRejected.reason`); a byte no reason uses is a typed decode error
/// ([`WireError::InvalidTag`]). The same type is used on the wire and by the broker's
/// replication cores, so no reason is lost in a mapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    /// `epoch < promised`: the append's epoch is below the receiver's promised (or known
    /// master) epoch, i.e. a newer master fenced it. The rejection's `promised` field carries
    /// that epoch; a master that sees one above its own steps down.
    StaleEpoch = 1,
    /// The receiver has no entry at the append's `prev`, or its entry there has another
    /// epoch (log matching, Raft §5.3). The rejection's `last` field carries the receiver's
    /// last `(epoch, offset)` so the master can back up and resend.
    LogMismatch = 2,
    /// The receiver's log failed (a write or fsync error) and takes no more appends
    /// (fail-stop). The master sends it nothing more until it reconnects.
    LogFailed = 3,
    /// The receiver has too many bytes queued and dropped the append (and those after it).
    /// The master resends from the first unanswered offset after its next heartbeat tick.
    Overloaded = 4,
    /// The append was inconsistent in itself (events not contiguous from `prev`, epochs out
    /// of order). A correct master never sends one; it treats the answer like
    /// [`RejectReason::LogFailed`].
    Malformed = 5,
}

impl RejectReason {
    /// The reason for a byte, or `None` for a byte no reason uses (0, 6..=255).
    #[must_use]
    pub fn from_u8(byte: u8) -> Option<RejectReason> {
        Some(match byte {
            1 => RejectReason::StaleEpoch,
            2 => RejectReason::LogMismatch,
            3 => RejectReason::LogFailed,
            4 => RejectReason::Overloaded,
            5 => RejectReason::Malformed,
            _ => return None,
        })
    }

    /// The byte for this reason (1..=5).
    #[must_use]
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

/// Store → master: the append was refused.
///
/// ```text
/// off   size   field
/// 0     1      reason                u8 (RejectReason)
/// 1     8      promised              u64: the store's promised epoch
/// 9     1|17   last                  Option<LogPosition>: the store's last entry
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendRejected {
    /// Why.
    pub reason: RejectReason,
    /// The store's promised epoch.
    pub promised: Epoch,
    /// The store's last entry (`None`: empty log).
    pub last: Option<LogPosition>,
}

/// New master → store: "promise to refuse appends below `epoch`".
///
/// `expected` is the identity the fencing broker has bound to this store's address
/// (brokers keep the authoritative slot → `(store_id, incarnation)` binding); `None` while
/// the cluster is being bootstrapped and nothing is bound yet. A store whose own identity
/// differs from `expected` is a replaced or wiped store: it records durably that it is a
/// learner and answers `ErrorResponse` `NotVoter`, now and for every later fence.
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64
/// 8     1|17   expected              Option<(StoreId, Incarnation)>: tag u8 (0 none,
///                                    1 some), then store_id u64, incarnation u64
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceRequest {
    /// The new master's epoch.
    pub epoch: Epoch,
    /// The store identity the broker expects at this address (`None`: not bound yet).
    pub expected: Option<(StoreId, Incarnation)>,
}

/// Store → new master: `epoch > promised`, and `promised = epoch` is durable.
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64: the epoch granted
/// 8     1|17   last                  Option<LogPosition>: the store's last entry
/// ..    8      store_id              u64
/// ..    8      incarnation           u64
/// ..    1|17   tail_cut              Option<TailCut>: tag u8 (0 none, 1 some), then
///                                    offset u64, promised u64
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceGranted {
    /// The epoch granted (equal to the request's).
    pub epoch: Epoch,
    /// The store's last entry (`None`: empty log).
    pub last: Option<LogPosition>,
    /// The store's identity.
    pub store_id: StoreId,
    /// The store's incarnation.
    pub incarnation: Incarnation,
    /// `Some` while the store carries a *tail-cut mark*: its recovery cut a torn tail that
    /// may have been an acknowledged record with a flipped bit, and it has not caught up
    /// with a later master since. A new master counts such a grant toward its fence quorum
    /// only when every store granted (docs/protocol.md, "Tail-cut marks").
    pub tail_cut: Option<TailCut>,
}

/// A store's tail-cut mark (see [`FenceGranted::tail_cut`]): what its recovery cut, and
/// what clears the mark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TailCut {
    /// The first offset the cut may have removed (the offset the recovery scan expected
    /// at the cut point).
    pub offset: Offset,
    /// The store's promised epoch when it cut: every ack the lost records got was sent
    /// under this epoch or a lower one. The mark clears once the store durably holds an
    /// entry of a higher epoch.
    pub promised: Epoch,
}

/// Store → new master: `epoch <= promised`, refused.
///
/// ```text
/// off   size   field
/// 0     8      promised              u64
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FenceRefused {
    /// The store's promised epoch.
    pub promised: Epoch,
}

/// Master → store: read events from `from` (recovery, or a lagging slave).
///
/// A store answers with at least one event when it holds one at `from` (even if it alone
/// exceeds `max_bytes`), never more than `max_events` or [`EVENTS_PER_FRAME_MAX`], and
/// stops before the payload bytes would exceed `max_bytes` or the frame would exceed
/// `FRAME_BYTES_MAX`.
///
/// ```text
/// off   size   field
/// 0     8      from                  u64: first offset wanted
/// 8     4      max_events            u32
/// 12    4      max_bytes             u32: payload bytes
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// First offset wanted.
    pub from: Offset,
    /// Most events to return.
    pub max_events: u32,
    /// Most payload bytes to return (at least one event is returned regardless).
    pub max_bytes: u32,
}

/// Store → master: events from the requested offset.
///
/// `events` is empty when `from` is past the store's last entry, or when `from` is below
/// `first_offset` (trimmed: the reader sees `first_offset > from`).
///
/// ```text
/// off   size   field
/// 0     8      first_offset          u64: lowest offset the store still serves
/// 8     1|17   last                  Option<LogPosition>: the store's last entry
/// ..    8      start                 u64: offset of events[0] (0 when empty)
/// ..    4      event count           u32, ≤ EVENTS_PER_FRAME_MAX
/// per event (offsets implied: start+i): epoch u64, kind u8, length u32, payload
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadResponse {
    /// Lowest offset the store can still serve (0 if never trimmed).
    pub first_offset: Offset,
    /// The store's last entry (`None`: empty log).
    pub last: Option<LogPosition>,
    /// Events at consecutive offsets, starting at the request's `from`.
    pub events: Vec<Event>,
}

/// Master or tool → store: report your state. Empty body.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TailRequest;

/// Store → master or tool: the store's state.
///
/// ```text
/// off   size   field
/// 0     1|17   last                  Option<LogPosition>
/// ..    8      promised              u64
/// ..    1|9    hwm                   Option<Offset>: highest HWM the store has heard
/// ..    8      store_id              u64
/// ..    8      incarnation           u64
/// ..    1      voter                 bool
/// ..    8      first_offset          u64
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TailResponse {
    /// The store's last entry (`None`: empty log).
    pub last: Option<LogPosition>,
    /// The store's promised epoch.
    pub promised: Epoch,
    /// Highest HWM the store has heard from a master (`None`: none yet).
    pub hwm: Option<Offset>,
    /// The store's identity.
    pub store_id: StoreId,
    /// The store's incarnation.
    pub incarnation: Incarnation,
    /// `false` on a new incarnation (a learner).
    pub voter: bool,
    /// Lowest offset the store can still serve.
    pub first_offset: Offset,
}

/// Master → store: a good copy, read from another store, of a record this store answered
/// `Corrupt` for (docs/protocol.md, "Damaged records"). The store rewrites its damaged
/// copy in place with it — only if its own index holds an entry at `event.offset` of
/// `event.epoch` and the same size (an epoch and an offset name one entry in the whole
/// cluster) — makes it durable, reads it back, and answers [`RepairResponse`].
///
/// ```text
/// off   size   field
/// 0     8      offset                u64: the record's offset
/// 8     8      epoch                 u64: its entry epoch
/// 16    1      kind                  u8: its event kind
/// 17    4+n    payload               u32 length, then the bytes (≤ EVENT_PAYLOAD_BYTES_MAX)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairRequest {
    /// The good copy.
    pub event: Event,
}

/// What a store did with a [`RepairRequest`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum RepairOutcome {
    /// The damaged copy was rewritten, made durable and read back good.
    Repaired = 1,
    /// The store's copy reads back good already and is byte for byte the one offered
    /// (repaired before, or never damaged): nothing was written.
    AlreadyGood = 2,
    /// The copy offered is not the store's entry: another epoch or size, or it differs
    /// from what the store's damaged (or good) record still shows of it: nothing written.
    OtherEntry = 3,
    /// The store holds no entry at that offset (trimmed, or past its end): nothing written.
    NotHeld = 4,
}

impl RepairOutcome {
    /// Every outcome, in numeric order.
    pub const ALL: [RepairOutcome; 4] = [
        RepairOutcome::Repaired,
        RepairOutcome::AlreadyGood,
        RepairOutcome::OtherEntry,
        RepairOutcome::NotHeld,
    ];

    /// Whether the store's copy is good now.
    #[must_use]
    pub fn is_good(self) -> bool {
        matches!(self, RepairOutcome::Repaired | RepairOutcome::AlreadyGood)
    }

    fn from_u8(byte: u8) -> Option<RepairOutcome> {
        RepairOutcome::ALL.into_iter().find(|o| *o as u8 == byte)
    }
}

/// Store → master: the answer to a [`RepairRequest`].
///
/// ```text
/// off   size   field
/// 0     8      offset                u64: the record's offset (the request's)
/// 8     1      outcome               u8: RepairOutcome (1 Repaired, 2 AlreadyGood,
///                                    3 OtherEntry, 4 NotHeld)
/// 9     1|9    next_corrupt          Option<u64>: the lowest record still known damaged
///                                    on this store, if any (the master repairs it next)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairResponse {
    /// The record's offset.
    pub offset: Offset,
    /// What the store did.
    pub outcome: RepairOutcome,
    /// The lowest record still known damaged on the store, if any.
    pub next_corrupt: Option<Offset>,
}

/// Tool → store: the digest of the entries the store holds at offsets `from..=to`
/// (`quire cluster audit`). Read-only: it changes no state of the store (no promise, no
/// append, no HWM), and it is served from the WAL's durable records like a read.
///
/// The range must not be empty and may span at most [`RANGE_DIGEST_OFFSETS_MAX`] offsets
/// (`to - from + 1`); the codec refuses any other ([`WireError::InvalidRange`], answered
/// with `ErrorResponse` `Malformed`).
///
/// ```text
/// off   size   field
/// 0     8      from                  u64: first offset of the range
/// 8     8      to                    u64: last offset of the range (inclusive)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeDigestRequest {
    /// First offset of the range.
    pub from: Offset,
    /// Last offset of the range, inclusive.
    pub to: Offset,
}

impl RangeDigestRequest {
    /// Offsets the range spans, or `None` if it is empty or longer than
    /// [`RANGE_DIGEST_OFFSETS_MAX`].
    #[must_use]
    pub fn span(&self) -> Option<u64> {
        let span = self.to.0.checked_sub(self.from.0)?.checked_add(1)?;
        (span <= RANGE_DIGEST_OFFSETS_MAX).then_some(span)
    }

    fn check(&self) -> Result<(), WireError> {
        match self.span() {
            Some(_) => Ok(()),
            None => Err(WireError::InvalidRange {
                field: "range digest",
                from: self.from,
                to: self.to,
                max: RANGE_DIGEST_OFFSETS_MAX,
            }),
        }
    }
}

/// Store → tool: the digest ([`crate::digest`]) of the entries it holds in the requested
/// range, and its own bounds.
///
/// The digest covers the store's durable entries at offsets in
/// `max(from, first_offset) ..= min(to, last.offset)`: `count` entries starting at
/// `start`. `count` is 0 (and `digest` 0, `last_entry` `None`) when the store holds
/// nothing in the range (trimmed below `first_offset`, or past its end).
///
/// ```text
/// off   size   field
/// 0     8      first_offset          u64: lowest offset the store still serves
/// 8     1|17   last                  Option<LogPosition>: the store's last durable entry
/// ..    8      start                 u64: first offset digested (0 when count is 0)
/// ..    8      count                 u64: entries digested, ≤ RANGE_DIGEST_OFFSETS_MAX
/// ..    4      digest                u32: CRC-32C over the entries' 20-byte ids
/// ..    1|21   last_entry            Option<EntryId>: tag u8, then epoch u64, offset u64,
///                                    crc u32 of the last entry digested
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RangeDigestResponse {
    /// Lowest offset the store can still serve (0 if never trimmed).
    pub first_offset: Offset,
    /// The store's last durable entry (`None`: empty log).
    pub last: Option<LogPosition>,
    /// First offset digested (0 when `count` is 0).
    pub start: Offset,
    /// Entries digested.
    pub count: u64,
    /// Their digest.
    pub digest: u32,
    /// The last entry digested.
    pub last_entry: Option<EntryId>,
}

/// Master → slave broker, every `heartbeat_ms`.
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64: the master's epoch
/// 8     1|9    hwm                   Option<Offset>
/// ..    2      master                u16 (BrokerId)
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Heartbeat {
    /// The master's epoch.
    pub epoch: Epoch,
    /// The master's high-water mark.
    pub hwm: Option<Offset>,
    /// The master's broker id.
    pub master: BrokerId,
}

/// Slave → master: answers a [`Heartbeat`] (and, from a slave, an [`AppendRequest`]).
///
/// ```text
/// off   size   field
/// 0     8      epoch                 u64: highest epoch the slave has seen
/// 8     2      broker                u16 (BrokerId): the slave
/// 10    1|17   last                  Option<LogPosition>: the slave's last entry
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HeartbeatAck {
    /// Highest epoch the slave has seen (above the master's: the master is deposed).
    pub epoch: Epoch,
    /// The slave's broker id.
    pub broker: BrokerId,
    /// The slave's last entry.
    pub last: Option<LogPosition>,
}

/// Master → the slave it hands mastership to (graceful handoff): "I have stopped taking
/// writes and everything I accepted is stabilized; take over now". The slave starts its
/// takeover at once, without waiting for its election timeout, if it still follows the
/// master of `from_epoch`; otherwise it answers `ErrorResponse` `NotMaster`.
///
/// ```text
/// off   size   field
/// 0     8      from_epoch            u64: the handing master's epoch
/// 8     1|9    hwm                   Option<Offset>: the master's HWM, which now covers
///                                    everything it ever accepted
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeOverNowRequest {
    /// The epoch of the master handing over.
    pub from_epoch: Epoch,
    /// The master's HWM when it handed over.
    pub hwm: Option<Offset>,
}

/// Slave → master: the slave has started its takeover (it has not fenced anything yet).
///
/// ```text
/// off   size   field
/// 0     2      broker                u16 (BrokerId): the slave taking over
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeOverNowResponse {
    /// The slave taking over.
    pub broker: BrokerId,
}

// ---- encoding ----

impl AppendRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        w.opt_position(self.prev);
        w.opt_offset(self.hwm);
        write_events(w, "append events", first_after(self.prev), &self.events)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let epoch = r.epoch("append epoch")?;
        let prev = r.opt_position("append prev")?;
        let hwm = r.opt_offset("append hwm")?;
        let events = read_events(r, "append events", first_after(prev))?;
        Ok(AppendRequest {
            epoch,
            prev,
            events,
            hwm,
        })
    }
}

impl PersistedAck {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        w.opt_offset(self.through_offset);
        w.u64(self.store_id.0);
        w.u64(self.incarnation.0);
        w.bool(self.voter);
        w.opt_offset(self.corrupt);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(PersistedAck {
            epoch: r.epoch("persisted epoch")?,
            through_offset: r.opt_offset("persisted through_offset")?,
            store_id: StoreId(r.u64("persisted store_id")?),
            incarnation: Incarnation(r.u64("persisted incarnation")?),
            voter: r.bool("persisted voter")?,
            corrupt: r.opt_offset("persisted corrupt")?,
        })
    }
}

impl AppendRejected {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u8(self.reason.as_u8());
        w.u64(self.promised.0);
        w.opt_position(self.last);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let field = "reject reason";
        let byte = r.u8(field)?;
        let reason = RejectReason::from_u8(byte).ok_or(WireError::InvalidTag { field, byte })?;
        Ok(AppendRejected {
            reason,
            promised: r.epoch("reject promised")?,
            last: r.opt_position("reject last")?,
        })
    }
}

impl FenceRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        match self.expected {
            None => w.u8(0),
            Some((store_id, incarnation)) => {
                w.u8(1);
                w.u64(store_id.0);
                w.u64(incarnation.0);
            }
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let epoch = r.epoch("fence epoch")?;
        let field = "fence expected";
        let expected = match r.u8(field)? {
            0 => None,
            1 => Some((StoreId(r.u64(field)?), Incarnation(r.u64(field)?))),
            byte => return Err(WireError::InvalidTag { field, byte }),
        };
        Ok(FenceRequest { epoch, expected })
    }
}

impl FenceGranted {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        w.opt_position(self.last);
        w.u64(self.store_id.0);
        w.u64(self.incarnation.0);
        match self.tail_cut {
            None => w.u8(0),
            Some(cut) => {
                w.u8(1);
                w.u64(cut.offset.0);
                w.u64(cut.promised.0);
            }
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let epoch = r.epoch("granted epoch")?;
        let last = r.opt_position("granted last")?;
        let store_id = StoreId(r.u64("granted store_id")?);
        let incarnation = Incarnation(r.u64("granted incarnation")?);
        let field = "granted tail_cut";
        let tail_cut = if r.tag(field)? {
            Some(TailCut {
                offset: r.offset(field)?,
                promised: r.epoch(field)?,
            })
        } else {
            None
        };
        Ok(FenceGranted {
            epoch,
            last,
            store_id,
            incarnation,
            tail_cut,
        })
    }
}

impl FenceRefused {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.promised.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(FenceRefused {
            promised: r.epoch("refused promised")?,
        })
    }
}

impl ReadRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.from.0);
        w.u32(self.max_events);
        w.u32(self.max_bytes);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(ReadRequest {
            from: r.offset("read from")?,
            max_events: r.u32("read max_events")?,
            max_bytes: r.u32("read max_bytes")?,
        })
    }
}

impl ReadResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.first_offset.0);
        w.opt_position(self.last);
        let start = self.events.first().map_or(0, |e| e.offset.0);
        w.u64(start);
        write_events(w, "read events", Some(start), &self.events)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let first_offset = r.offset("read first_offset")?;
        let last = r.opt_position("read last")?;
        let start = r.u64("read start")?;
        let events = read_events(r, "read events", Some(start))?;
        Ok(ReadResponse {
            first_offset,
            last,
            events,
        })
    }
}

impl TailRequest {
    pub(crate) fn write<W: BodyWriter>(&self, _w: &mut W) -> Result<(), WireError> {
        Ok(())
    }

    pub(crate) fn read(_r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(TailRequest)
    }
}

impl TailResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.opt_position(self.last);
        w.u64(self.promised.0);
        w.opt_offset(self.hwm);
        w.u64(self.store_id.0);
        w.u64(self.incarnation.0);
        w.bool(self.voter);
        w.u64(self.first_offset.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(TailResponse {
            last: r.opt_position("tail last")?,
            promised: r.epoch("tail promised")?,
            hwm: r.opt_offset("tail hwm")?,
            store_id: StoreId(r.u64("tail store_id")?),
            incarnation: Incarnation(r.u64("tail incarnation")?),
            voter: r.bool("tail voter")?,
            first_offset: r.offset("tail first_offset")?,
        })
    }
}

impl RepairRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.event.offset.0);
        w.u64(self.event.epoch.0);
        w.u8(self.event.kind.as_u8());
        w.payload_chunks("repair payload", &self.event.payload)
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let offset = r.offset("repair offset")?;
        let epoch = r.epoch("repair epoch")?;
        let byte = r.u8("repair kind")?;
        let kind = EventKind::from_u8(byte).ok_or(WireError::UnknownEventKind { byte })?;
        let payload = r.payload("repair payload")?.into();
        Ok(RepairRequest {
            event: Event {
                epoch,
                offset,
                kind,
                payload,
            },
        })
    }
}

impl RepairResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.offset.0);
        w.u8(self.outcome as u8);
        w.opt_offset(self.next_corrupt);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let offset = r.offset("repair offset")?;
        let field = "repair outcome";
        let byte = r.u8(field)?;
        let outcome = RepairOutcome::from_u8(byte).ok_or(WireError::InvalidTag { field, byte })?;
        let next_corrupt = r.opt_offset("repair next_corrupt")?;
        Ok(RepairResponse {
            offset,
            outcome,
            next_corrupt,
        })
    }
}

impl RangeDigestRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        self.check()?;
        w.u64(self.from.0);
        w.u64(self.to.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let req = RangeDigestRequest {
            from: r.offset("range digest from")?,
            to: r.offset("range digest to")?,
        };
        req.check()?;
        Ok(req)
    }
}

impl RangeDigestResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        if self.count > RANGE_DIGEST_OFFSETS_MAX {
            return Err(WireError::CountTooLarge {
                field: "range digest count",
                count: self.count,
                max: RANGE_DIGEST_OFFSETS_MAX,
            });
        }
        w.u64(self.first_offset.0);
        w.opt_position(self.last);
        w.u64(self.start.0);
        w.u64(self.count);
        w.u32(self.digest);
        match self.last_entry {
            None => w.u8(0),
            Some(e) => {
                w.u8(1);
                w.u64(e.epoch.0);
                w.u64(e.offset.0);
                w.u32(e.crc);
            }
        }
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        let first_offset = r.offset("range digest first_offset")?;
        let last = r.opt_position("range digest last")?;
        let start = r.offset("range digest start")?;
        let count = r.u64("range digest count")?;
        if count > RANGE_DIGEST_OFFSETS_MAX {
            return Err(WireError::CountTooLarge {
                field: "range digest count",
                count,
                max: RANGE_DIGEST_OFFSETS_MAX,
            });
        }
        let digest = r.u32("range digest digest")?;
        let field = "range digest last_entry";
        let last_entry = if r.tag(field)? {
            Some(EntryId {
                epoch: r.epoch(field)?,
                offset: r.offset(field)?,
                crc: r.u32(field)?,
            })
        } else {
            None
        };
        Ok(RangeDigestResponse {
            first_offset,
            last,
            start,
            count,
            digest,
            last_entry,
        })
    }
}

impl Heartbeat {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        w.opt_offset(self.hwm);
        w.u16(self.master.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(Heartbeat {
            epoch: r.epoch("heartbeat epoch")?,
            hwm: r.opt_offset("heartbeat hwm")?,
            master: BrokerId(r.u16("heartbeat master")?),
        })
    }
}

impl HeartbeatAck {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.epoch.0);
        w.u16(self.broker.0);
        w.opt_position(self.last);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(HeartbeatAck {
            epoch: r.epoch("heartbeat ack epoch")?,
            broker: BrokerId(r.u16("heartbeat ack broker")?),
            last: r.opt_position("heartbeat ack last")?,
        })
    }
}

impl TakeOverNowRequest {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u64(self.from_epoch.0);
        w.opt_offset(self.hwm);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(TakeOverNowRequest {
            from_epoch: r.epoch("take over now from_epoch")?,
            hwm: r.opt_offset("take over now hwm")?,
        })
    }
}

impl TakeOverNowResponse {
    pub(crate) fn write<W: BodyWriter>(&self, w: &mut W) -> Result<(), WireError> {
        w.u16(self.broker.0);
        Ok(())
    }

    pub(crate) fn read(r: &mut Reader<'_>) -> Result<Self, WireError> {
        Ok(TakeOverNowResponse {
            broker: BrokerId(r.u16("take over now broker")?),
        })
    }
}
