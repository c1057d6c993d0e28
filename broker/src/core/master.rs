//! The master's replication core: offsets, per-store progress, the HWM, log matching,
//! pipelining, backpressure and bounded memory (DESIGN.md "Replication protocol").
//!
//! # What it does
//! - [`MasterCore::propose`] gives an event the next offset in the master's epoch, or refuses
//!   it when the bytes not yet stabilized would exceed
//!   [`ReplicationLimits::inflight_bytes_max`] (backpressure).
//! - For every slot (store or slave broker) it keeps a Raft-style progress: the next offset
//!   to send, the appends in flight (at most [`ReplicationLimits::appends_inflight_max`]; one
//!   while *probing* for the match point), the highest offset the slot is known to hold.
//!   Each [`MasterCommand::Append`] names `prev` (log matching, Raft §5.3) and the range of
//!   offsets it carries, and piggybacks the HWM.
//! - A [`RejectReason::LogMismatch`] answer carries the receiver's last `(epoch, offset)`;
//!   the core backs up to the highest offset that can match (fast backup, below) and resends
//!   from there. A rejection whose promised epoch is above the master's means a newer master
//!   fenced the stores: the core emits [`MasterCommand::StepDown`] and stops.
//! - The **HWM** is the highest offset `h` such that Qa distinct *voting* store slots acked
//!   `through >= h` **in the master's own epoch**, and `h >= epoch_start` (the master's
//!   epoch-start event): Raft §5.4.2, DESIGN.md "Failover" step 4. Each raise emits
//!   [`MasterCommand::Stabilized`] with the newly stabilized events.
//!
//! # Check-quorum
//! With [`MasterCore::enable_check_quorum`] on (Raft thesis §6.2, etcd's `CheckQuorum`), a
//! master that has not had a voting ack in its epoch from Qa distinct stores within the
//! last `window` heartbeat ticks gives up: it emits [`MasterCommand::QuorumLost`] and stops
//! as after a step-down. Without the rule, a master cut off from a majority of stores but
//! not from its slaves would go on heartbeating them, so no slave would ever take over,
//! and the cluster would stay unavailable while a quorum of stores and a slave could serve.
//! The rule is for liveness only: safety never depends on it (a master that keeps going
//! stabilizes nothing without Qa stores, and a fence shuts it out).
//!
//! # Why an ack's `through` can be trusted
//! A store answers `Persisted{epoch, through}` with `through = prev.offset + count` of the
//! append it matched — not its own log end. Only this master writes entries of its epoch,
//! so an ack in this epoch says "the store holds this master's log up to `through`"
//! (DESIGN.md; acking the log end instead loses data, found by model check). The core
//! still refuses acks it cannot explain: from another epoch, from an unknown slot, past
//! anything it sent that slot. Acks from a store that is not a voter (`voter = false`) or
//! answers with another identity than the slot's expected one (a wiped store, DESIGN.md
//! "Store identity") move that slot's replication progress but never the HWM.
//!
//! # Fast backup
//! After a rejection of an append with `prev = p` from a receiver whose last entry is
//! `L = (le, lo)`, the next probe's `prev` is
//! `c = min(p.offset - 1, lo, last offset of ours whose epoch <= le)`. Entries of ours
//! above an epoch `le` cannot be in the receiver's log past `lo` (its epochs never go
//! down); if our log has entries of epoch `le`, `c` is a sure match (both logs hold the
//! same run prefix of epoch `le`). `c` is strictly below `p.offset`, so backing up ends —
//! at worst at offset 0, where `prev = None` always matches.
//!
//! # Memory
//! Events stay in memory until they are stabilized *and* every slot holds them; past
//! [`ReplicationLimits::retained_bytes_max`] of stabilized events they are trimmed even if
//! a slot lags. A slot that needs trimmed events gets an append with
//! [`AppendEvents::FromStore`]: the network layer reads that range from the named store
//! and sends it. Events above the HWM are never trimmed, and backpressure bounds them, so
//! the memory held is at most `retained_bytes_max + inflight_bytes_max` (plus the adopted
//! tail of a takeover).

use std::collections::VecDeque;

use quire_proto::{ConfigEvent, Epoch, EventBody, EventKind, LogPosition, Offset, Payload, Voter};
use thiserror::Error;

use super::event::{accounted_bytes, Event};
use super::log::Log;
use super::quorum::quorum_offset;
use super::takeover::{AdoptedLog, LocalLog};
use super::{AppendId, ClusterConfig, ConfigError, RejectReason, SlotId, SlotKind, StoreIdentity};

/// Default [`ReplicationLimits::inflight_bytes_max`]: 64 MiB.
pub const INFLIGHT_BYTES_MAX_DEFAULT: u64 = 64 << 20;
/// Default [`ReplicationLimits::append_events_max`].
pub const APPEND_EVENTS_MAX_DEFAULT: u32 = 1024;
/// Default [`ReplicationLimits::append_bytes_max`]: 1 MiB.
pub const APPEND_BYTES_MAX_DEFAULT: u64 = 1 << 20;
/// Default [`ReplicationLimits::appends_inflight_max`].
pub const APPENDS_INFLIGHT_MAX_DEFAULT: u32 = 8;
/// Default [`ReplicationLimits::append_timeout_ticks`].
pub const APPEND_TIMEOUT_TICKS_DEFAULT: u32 = 10;
/// Default [`ReplicationLimits::retained_bytes_max`]: 64 MiB.
pub const RETAINED_BYTES_MAX_DEFAULT: u64 = 64 << 20;

/// The master core's bounds. All byte counts are [`accounted_bytes`](super::event::accounted_bytes) (payload plus
/// a fixed per-event overhead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplicationLimits {
    /// Most bytes of events proposed but not yet stabilized; a proposal that would exceed it
    /// is refused with [`ProposeError::Backpressure`]. One event larger than this is refused
    /// with [`ProposeError::TooLarge`].
    pub inflight_bytes_max: u64,
    /// Most events in one append.
    pub append_events_max: u32,
    /// Most bytes in one append (an append always carries at least one event if any is due).
    pub append_bytes_max: u64,
    /// Most appends in flight (sent, unanswered) per slot while the slot's match point is
    /// known; one while probing for it.
    pub appends_inflight_max: u32,
    /// Heartbeat ticks after which an unanswered append counts as lost: the slot probes
    /// again from the oldest unanswered offset.
    pub append_timeout_ticks: u32,
    /// Most bytes of stabilized events kept in memory for slots that lag; beyond it the
    /// oldest are trimmed and lagging slots are served from stores.
    pub retained_bytes_max: u64,
}

impl Default for ReplicationLimits {
    fn default() -> Self {
        ReplicationLimits {
            inflight_bytes_max: INFLIGHT_BYTES_MAX_DEFAULT,
            append_events_max: APPEND_EVENTS_MAX_DEFAULT,
            append_bytes_max: APPEND_BYTES_MAX_DEFAULT,
            appends_inflight_max: APPENDS_INFLIGHT_MAX_DEFAULT,
            append_timeout_ticks: APPEND_TIMEOUT_TICKS_DEFAULT,
            retained_bytes_max: RETAINED_BYTES_MAX_DEFAULT,
        }
    }
}

impl ReplicationLimits {
    /// Checks every bound is non-zero.
    ///
    /// # Errors
    /// [`ConfigError::BadLimit`] naming the first zero bound.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let checks = [
            ("inflight_bytes_max", self.inflight_bytes_max == 0),
            ("append_events_max", self.append_events_max == 0),
            ("append_bytes_max", self.append_bytes_max == 0),
            ("appends_inflight_max", self.appends_inflight_max == 0),
            ("append_timeout_ticks", self.append_timeout_ticks == 0),
        ];
        match checks.iter().find(|(_, zero)| *zero) {
            Some(&(name, _)) => Err(ConfigError::BadLimit {
                name,
                why: "must be at least 1",
            }),
            None => Ok(()),
        }
    }
}

/// Everything a [`MasterCore`] is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MasterConfig {
    /// Slots and quorums.
    pub cluster: ClusterConfig,
    /// Bounds.
    pub limits: ReplicationLimits,
}

/// Where the events of an [`AppendCommand`] come from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendEvents {
    /// The events themselves (handles to the shared payloads), offsets `first..first+count`.
    /// Empty for a heartbeat or an empty probe.
    InMemory(Vec<Event>),
    /// The events were trimmed from the master's memory: read offsets `first..first+count`
    /// from the store at `source` (which holds them: it acked through at least the last one
    /// in this epoch) and send them. The network layer must check the read events carry the
    /// expected offsets; if the read fails it reports [`MasterInput::SlotDisconnected`] for
    /// the target slot, or lets the append time out.
    FromStore {
        /// The store slot to read from.
        source: SlotId,
    },
}

/// One append to send to one slot (DESIGN.md: `Append{epoch, prev, events[], hwm}`).
///
/// The receiver accepts it only if `epoch >= promised` and its entry at `prev` has `prev`'s
/// epoch (`prev = None`: the events start at offset 0, always matches). It answers with
/// `through = prev.offset + count` (`None` when that is below 0: an empty append at the
/// start of the log) and echoes `append`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendCommand {
    /// The target slot.
    pub slot: SlotId,
    /// This append's id, to echo in the answer.
    pub append: AppendId,
    /// The master's epoch.
    pub epoch: Epoch,
    /// The entry right before `first`, `None` when `first` is 0.
    pub prev: Option<LogPosition>,
    /// Offset of the first event carried (`prev.offset + 1`, or 0).
    pub first: Offset,
    /// Number of events carried: 0 for a heartbeat or an empty probe.
    pub count: u64,
    /// The events, or where to read them.
    pub events: AppendEvents,
    /// The master's HWM (`None`: nothing stabilized yet), for stores and slaves to learn.
    pub hwm: Option<Offset>,
}

impl AppendCommand {
    /// The `through` a receiver that accepts this append answers with:
    /// `prev.offset + count`, `None` for an empty append at the start of the log.
    #[must_use]
    pub fn through(&self) -> Option<Offset> {
        (self.first.0 + self.count).checked_sub(1).map(Offset)
    }
}

/// What the master core asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MasterCommand {
    /// Send this append to its slot.
    Append(AppendCommand),
    /// The HWM rose to `through`: every event up to it is stabilized. `events` are the
    /// newly stabilized ones, in order (old HWM + 1 ..= `through`): the broker acks their
    /// producers, applies them to broker state and delivers them to consumers.
    Stabilized {
        /// The new HWM.
        through: Offset,
        /// The events just stabilized.
        events: Vec<Event>,
    },
    /// A store or slave answered with a promised epoch above the master's: a newer master
    /// fenced the stores. The core has stopped: nothing new will be stabilized and every
    /// later input is ignored. The driver turns the broker into a slave and fails the
    /// producers still waiting. Emitted once.
    StepDown {
        /// The higher epoch that was seen.
        promised: Epoch,
    },
    /// Check-quorum (see the module docs): fewer than Qa voting stores acked within the
    /// window. The core has stopped as after [`MasterCommand::StepDown`]; the driver turns
    /// the broker into a slave that stops heartbeating, so a slave that reaches a quorum of
    /// stores can take over. Emitted once, never together with `StepDown`.
    QuorumLost {
        /// Distinct voting stores that acked within the window.
        voters_heard: usize,
        /// Qa.
        ack_quorum: usize,
    },
}

/// An input to [`MasterCore::handle`] (everything but proposals).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MasterInput {
    /// A store's persisted ack: "I hold, durably, your log through `through`" (DESIGN.md
    /// "persisted ack"), in answer to `append`.
    Persisted {
        /// The slot the ack came from.
        slot: SlotId,
        /// The append it answers.
        append: AppendId,
        /// The epoch of the append it answers.
        epoch: Epoch,
        /// `prev.offset + count` of that append; `None` for an empty append at offset 0.
        through: Option<Offset>,
        /// The identity the store answered with.
        identity: StoreIdentity,
        /// Whether the store says it is a voter (a wiped store rejoins as a learner).
        voter: bool,
    },
    /// A slave broker's answer: it holds the master's log through `through`. Never counts
    /// toward the HWM.
    SlaveHas {
        /// The slot the answer came from.
        slot: SlotId,
        /// The append it answers.
        append: AppendId,
        /// The epoch of the append it answers.
        epoch: Epoch,
        /// `prev.offset + count` of that append.
        through: Option<Offset>,
    },
    /// A store or slave refused `append`.
    Rejected {
        /// The slot the refusal came from.
        slot: SlotId,
        /// The append it refuses.
        append: AppendId,
        /// The receiver's promised epoch (a slave: the highest master epoch it has seen).
        promised: Epoch,
        /// The receiver's last `(epoch, offset)`, `None` if its log is empty.
        last: Option<LogPosition>,
        /// Why.
        reason: RejectReason,
    },
    /// The network layer has a (new) connection to `slot`: probe it.
    SlotConnected {
        /// The slot.
        slot: SlotId,
    },
    /// The connection to `slot` is gone: appends in flight are lost; send nothing until
    /// [`MasterInput::SlotConnected`].
    SlotDisconnected {
        /// The slot.
        slot: SlotId,
    },
    /// Store `slot` answered a read with `Corrupt`: its copy of the record at `offset` is
    /// damaged. Until the connection drops it is no read source for a range holding
    /// `offset` (a lagging slot's catch-up, a fetch below the window), and another store
    /// that holds the range serves it. Ignored for a slave slot or an unknown slot.
    ReadCorrupt {
        /// The store's slot.
        slot: SlotId,
        /// The damaged record's offset.
        offset: Offset,
    },
    /// Store `slot`'s copy of the record at `offset` was repaired (or found good): it may
    /// serve that range again.
    Repaired {
        /// The store's slot.
        slot: SlotId,
        /// The record's offset.
        offset: Offset,
    },
    /// The heartbeat timer fired (every `heartbeat_ms`): idle slots get an empty append
    /// carrying the HWM, and appends unanswered for
    /// [`ReplicationLimits::append_timeout_ticks`] ticks are resent.
    HeartbeatTick,
    /// Some other message showed that a master of `epoch` exists; if it is above ours, step
    /// down.
    RivalSeen {
        /// The epoch seen.
        epoch: Epoch,
    },
    /// Slave `slot` needs events the stores deleted (retention): send it the log from
    /// `checkpoint` on instead — the offset of a Trim event carrying a checkpoint, at or below
    /// the HWM, from which the slave rebuilds its state (docs/protocol.md "Retention").
    /// Ignored for a store slot, a point above the HWM or at 0, a slot that holds it or is
    /// already being sent from it or later, a slot that is not up.
    SlaveToCheckpoint {
        /// The slave's slot.
        slot: SlotId,
        /// Offset of the checkpoint Trim event.
        checkpoint: Offset,
    },
    /// The durable cluster configuration now names the voter identity of store `slot`
    /// (see [`ClusterConfig::learn_identity`]; an identity already known is never replaced).
    StoreIdentityKnown {
        /// The slot.
        slot: SlotId,
        /// Its identity.
        identity: StoreIdentity,
    },
}

/// Why [`MasterCore::propose`] refused an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
pub enum ProposeError {
    /// The master was fenced by a newer epoch; it takes nothing new.
    #[error("this master was fenced by epoch {promised}")]
    Fenced {
        /// The epoch that fenced it.
        promised: Epoch,
    },
    /// Accepting the event would put more than `inflight_bytes_max` bytes above the HWM.
    /// Retry once some are stabilized.
    #[error("backpressure: {unstable_bytes} bytes not stabilized, {event_bytes} more would exceed {inflight_bytes_max}")]
    Backpressure {
        /// Bytes above the HWM now.
        unstable_bytes: u64,
        /// Bytes charged for the refused event.
        event_bytes: u64,
        /// The bound.
        inflight_bytes_max: u64,
    },
    /// The master gave up for lack of a store quorum ([`MasterCommand::QuorumLost`]).
    #[error("this master lost its quorum of stores and stepped down")]
    QuorumLost,
    /// The event alone is larger than `inflight_bytes_max`: it can never be accepted.
    #[error("event of {event_bytes} bytes exceeds inflight_bytes_max {inflight_bytes_max}")]
    TooLarge {
        /// Bytes charged for the refused event.
        event_bytes: u64,
        /// The bound.
        inflight_bytes_max: u64,
    },
}

/// Why [`MasterCore::propose_config`] refused a voter-set change (DESIGN.md "Membership
/// changes", rule 2). Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigChangeError {
    /// The master's epoch-start event is not stabilized yet (Ongaro's 2015 fix: a change
    /// before it can meet a change of an earlier master that this log dropped). Retry
    /// shortly.
    #[error("this master's epoch-start event (offset {epoch_start}) is not stabilized yet; retry shortly")]
    EpochStartUnstable {
        /// The epoch-start event's offset.
        epoch_start: Offset,
    },
    /// An earlier change is not stabilized yet: two changes in flight could have disjoint
    /// quorums.
    #[error("the voter-set change at offset {offset} is not stabilized yet; one change at a time")]
    ChangePending {
        /// The pending `Config` event's offset.
        offset: Offset,
    },
    /// The new set is not the one in force with exactly one store added or removed.
    #[error("a change adds or removes exactly one store; this one changes {changes} (remove a store before adding another identity at its slot)")]
    NotOneChange {
        /// Voters added plus voters removed.
        changes: usize,
    },
    /// The new set is not valid here (empty, an index that is not a store slot, a store id
    /// twice).
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The master could not take the event.
    #[error(transparent)]
    Propose(#[from] ProposeError),
}

/// Whether a slot can be sent to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotLink {
    /// Connected: appends flow.
    Up,
    /// Disconnected: nothing is sent until [`MasterInput::SlotConnected`].
    Down,
    /// The receiver refused with [`RejectReason::LogFailed`] or [`RejectReason::Malformed`]:
    /// nothing is sent until it reconnects.
    Failed,
}

/// A read-only view of one slot's progress, for status pages and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotStatus {
    /// Whether the slot is sent to.
    pub link: SlotLink,
    /// Whether the slot is probing for its match point (one append in flight at most).
    pub probing: bool,
    /// The next offset to send.
    pub next: Offset,
    /// Highest offset the slot is known to hold of this master's log (any valid ack).
    pub matched: Option<Offset>,
    /// Highest offset the slot acked as a voter with its expected identity: what the HWM
    /// counts. Never goes down.
    pub voted_through: Option<Offset>,
    /// Highest `through` of any append sent to the slot in this epoch.
    pub sent_max: Option<Offset>,
    /// Appends sent and unanswered.
    pub appends_inflight: usize,
}

/// Counters of what the core ignored or did, for observability and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MasterStats {
    /// Acks that counted toward the HWM (voter, expected identity, this epoch).
    pub acks_voted: u64,
    /// Acks from a slot the configuration does not have, or of the wrong kind.
    pub acks_unknown_slot: u64,
    /// Acks for another epoch than the master's.
    pub acks_other_epoch: u64,
    /// Acks past anything sent to that slot.
    pub acks_beyond_sent: u64,
    /// Acks from a store that is not a voter or not the expected identity (progress only).
    pub acks_not_voting: u64,
    /// Inputs ignored because the master stepped down.
    pub inputs_after_step_down: u64,
    /// Rejections of appends no longer in flight (already answered, reset, or unknown).
    pub rejections_stale: u64,
    /// Rejections that contradict themselves (fenced by an epoch not above ours).
    pub rejections_inconsistent: u64,
    /// Back-ups after a log mismatch.
    pub backups: u64,
    /// Appends given up as lost after `append_timeout_ticks`.
    pub append_timeouts: u64,
    /// Sends postponed because no store could serve a trimmed range.
    pub no_read_source: u64,
    /// `Corrupt` answers to reads recorded ([`MasterInput::ReadCorrupt`]).
    pub reads_corrupt: u64,
    /// Rejections with [`RejectReason::Overloaded`] (the slot backs off one tick).
    pub overloaded: u64,
}

/// One append in flight.
#[derive(Clone, Copy, Debug)]
struct Inflight {
    id: AppendId,
    prev: Option<LogPosition>,
    first: Offset,
    sent_tick: u64,
}

/// Per-slot replication progress (Raft's nextIndex / matchIndex, plus the voting view).
#[derive(Clone, Debug)]
struct SlotState {
    link: SlotLink,
    probing: bool,
    next: Offset,
    matched: Option<Offset>,
    voted_through: Option<Offset>,
    sent_max: Option<Offset>,
    inflight: VecDeque<Inflight>,
    /// Answers to appends with smaller ids predate the last reset.
    reset_id: AppendId,
    /// Nothing is sent before this heartbeat tick (backoff after `Overloaded`).
    resume_tick: u64,
    /// Offsets whose record this store answered `Corrupt` for (a damaged copy on its
    /// disk), ascending, at most [`CORRUPT_OFFSETS_MAX`]: it is no read source for a range
    /// holding one. Forgotten when the connection drops.
    corrupt: Vec<Offset>,
}

/// Damaged records remembered per store slot ([`MasterInput::ReadCorrupt`]).
pub const CORRUPT_OFFSETS_MAX: usize = 64;

impl SlotState {
    /// Whether a record in `first..=last` is known damaged on this slot's store.
    fn corrupt_in(&self, first: Offset, last: Offset) -> bool {
        let i = self.corrupt.partition_point(|&o| o < first);
        self.corrupt.get(i).is_some_and(|&o| o <= last)
    }
}

/// The master's replication state machine. See the module docs for the rules.
///
/// Drive it with [`MasterCore::propose`] and [`MasterCore::handle`]; both append the
/// commands to carry out, in order, to a caller-owned `Vec`. Deterministic: equal inputs
/// give equal commands. Cloning clones the in-memory events' handles, not their payloads.
#[derive(Clone, Debug)]
pub struct MasterCore {
    /// Test-only planted bug ([`MasterCore::set_hwm_before_epoch_start`]).
    hwm_before_epoch_start: bool,
    cluster: ClusterConfig,
    limits: ReplicationLimits,
    epoch: Epoch,
    log: Log,
    epoch_start: Offset,
    hwm: Option<Offset>,
    /// Accounted bytes of the events above the HWM (all in memory).
    unstable_bytes: u64,
    slots: Vec<SlotState>,
    next_append_id: u64,
    ticks: u64,
    fenced_by: Option<Epoch>,
    /// Check-quorum window in heartbeat ticks; `None`: the rule is off.
    check_quorum_ticks: Option<u64>,
    /// The tick the check-quorum rule was turned on: no verdict before a whole window.
    check_quorum_since: u64,
    /// Per slot, the tick of its last voting ack in this epoch (stores only).
    voted_tick: Vec<Option<u64>>,
    /// Set once [`MasterCommand::QuorumLost`] was emitted.
    quorum_lost: bool,
    /// Offset of the last `Config` event this master appended.
    last_config: Option<Offset>,
    /// Last offsets of the batches marked with [`MasterCore::end_batch`] that are still in
    /// memory, in order: the places an append may stop.
    batch_ends: VecDeque<Offset>,
    scratch: Vec<Offset>,
    stats: MasterStats,
}

impl MasterCore {
    /// Starts leading `adopted.epoch` over the adopted log: appends the epoch-start event
    /// (kind [`EventKind::EpochStart`], payload `epoch_start_payload`) at the log's end, and
    /// sends every slot a first probe carrying it (`prev` = the adopted log's last entry).
    /// Every slot starts as connected; the driver reports the ones that are not.
    ///
    /// The cluster counts in `adopted.voters` when the adopted log names a voter set.
    ///
    /// The HWM starts at `adopted.applied` (already stabilized and applied by this broker);
    /// the first [`MasterCommand::Stabilized`] covers the rest of the adopted log together
    /// with the epoch-start event (DESIGN.md "Failover" step 4: when it is stabilized,
    /// everything before it is).
    ///
    /// # Errors
    /// [`ConfigError`] if the configuration is invalid, the log holds an entry of an epoch
    /// at or above `adopted.epoch`, `applied` is past the log's end, or events above
    /// `applied` are not in memory.
    pub fn new(
        mut config: MasterConfig,
        adopted: AdoptedLog,
        epoch_start_payload: Payload,
        out: &mut Vec<MasterCommand>,
    ) -> Result<MasterCore, ConfigError> {
        let AdoptedLog {
            epoch,
            mut log,
            applied,
            voters,
        } = adopted;
        if let Some(voters) = &voters {
            config.cluster.set_voters(voters)?;
        }
        config.cluster.validate()?;
        config.limits.validate()?;
        if log.last().is_some_and(|last| last.epoch >= epoch) {
            return Err(ConfigError::BadHandover {
                why: "the log holds an entry of the new epoch or a later one",
            });
        }
        if applied.is_some_and(|a| a >= log.end()) {
            return Err(ConfigError::BadHandover {
                why: "applied offset past the log end",
            });
        }
        let first_unapplied = applied.map_or(Offset::ZERO, Offset::next);
        if first_unapplied < log.mem_start() {
            return Err(ConfigError::BadHandover {
                why: "events above the applied offset are not in memory",
            });
        }
        let epoch_start = log.end();
        log.append(Event {
            epoch,
            offset: epoch_start,
            kind: EventKind::EpochStart,
            payload: epoch_start_payload,
        });
        let unstable_bytes = log.iter_from(first_unapplied).map(accounted_bytes).sum();
        let slots = config
            .cluster
            .slots
            .iter()
            .map(|_| SlotState {
                link: SlotLink::Up,
                probing: true,
                next: epoch_start,
                matched: None,
                voted_through: None,
                sent_max: None,
                inflight: VecDeque::new(),
                reset_id: AppendId(0),
                resume_tick: 0,
                corrupt: Vec::new(),
            })
            .collect();
        let slot_count = config.cluster.slots.len();
        let mut core = MasterCore {
            hwm_before_epoch_start: false,
            scratch: Vec::with_capacity(slot_count),
            cluster: config.cluster,
            limits: config.limits,
            epoch,
            log,
            epoch_start,
            hwm: applied,
            unstable_bytes,
            slots,
            next_append_id: 0,
            ticks: 0,
            fenced_by: None,
            check_quorum_ticks: None,
            check_quorum_since: 0,
            voted_tick: vec![None; slot_count],
            quorum_lost: false,
            last_config: None,
            batch_ends: VecDeque::new(),
            stats: MasterStats::default(),
        };
        for i in 0..core.slots.len() {
            core.fill(i, out);
        }
        Ok(core)
    }

    /// Gives a new event the next offset in this master's epoch and sends it to every slot
    /// that has room in its pipeline. The event is acted on (producer acked, applied,
    /// delivered) only once a [`MasterCommand::Stabilized`] covers its offset.
    ///
    /// `kind` is the event kind byte; `payload` is shared, never copied.
    ///
    /// # Errors
    /// [`ProposeError::Fenced`] after a step-down; [`ProposeError::Backpressure`] when the
    /// bytes above the HWM would exceed `inflight_bytes_max`; [`ProposeError::TooLarge`]
    /// when the event alone would. A refused event takes no offset and changes nothing.
    pub fn propose(
        &mut self,
        kind: EventKind,
        payload: Payload,
        out: &mut Vec<MasterCommand>,
    ) -> Result<Offset, ProposeError> {
        let offset = self.propose_deferred(kind, payload)?;
        self.flush(out);
        Ok(offset)
    }

    /// [`MasterCore::propose`] without sending: the event takes its offset (or is refused,
    /// with the same errors), but no append goes out until [`MasterCore::flush`]. A driver
    /// that proposes a burst of events — many producers' messages — then flushes once gets
    /// them into shared appends (up to [`ReplicationLimits::append_events_max`] /
    /// `append_bytes_max` each) instead of one append per event while the pipelines have
    /// room.
    ///
    /// # Errors
    /// As [`MasterCore::propose`].
    pub fn propose_deferred(
        &mut self,
        kind: EventKind,
        payload: Payload,
    ) -> Result<Offset, ProposeError> {
        if let Some(promised) = self.fenced_by {
            return Err(ProposeError::Fenced { promised });
        }
        if self.quorum_lost {
            return Err(ProposeError::QuorumLost);
        }
        let event = Event {
            epoch: self.epoch,
            offset: self.log.end(),
            kind,
            payload,
        };
        let event_bytes = accounted_bytes(&event);
        let inflight_bytes_max = self.limits.inflight_bytes_max;
        if event_bytes > inflight_bytes_max {
            return Err(ProposeError::TooLarge {
                event_bytes,
                inflight_bytes_max,
            });
        }
        if self.unstable_bytes + event_bytes > inflight_bytes_max {
            return Err(ProposeError::Backpressure {
                unstable_bytes: self.unstable_bytes,
                event_bytes,
                inflight_bytes_max,
            });
        }
        let offset = event.offset;
        self.log.append(event);
        self.unstable_bytes += event_bytes;
        Ok(offset)
    }

    /// Appends a `Config` event naming `voters` (DESIGN.md "Membership changes"): the new set
    /// is in force from the moment it is appended (rule 1: the HWM is counted in it from
    /// now on, and slots whose identity changed start counting afresh).
    ///
    /// Returns the event's offset; the change is done when a [`MasterCommand::Stabilized`]
    /// covers it. Like [`MasterCore::propose_deferred`], nothing is sent until
    /// [`MasterCore::flush`].
    ///
    /// # Errors
    /// [`ConfigChangeError`]: the epoch-start event not stabilized, an earlier change
    /// pending, more or less than one store changed, an invalid set, or a refused proposal.
    pub fn propose_config(&mut self, voters: Vec<Voter>) -> Result<Offset, ConfigChangeError> {
        if self.hwm < Some(self.epoch_start) {
            return Err(ConfigChangeError::EpochStartUnstable {
                epoch_start: self.epoch_start,
            });
        }
        if let Some(offset) = self.pending_config() {
            return Err(ConfigChangeError::ChangePending { offset });
        }
        let current = self.cluster.voters();
        let changes = voters.iter().filter(|v| !current.contains(v)).count()
            + current.iter().filter(|v| !voters.contains(v)).count();
        if changes != 1 {
            return Err(ConfigChangeError::NotOneChange { changes });
        }
        let mut next = self.cluster.clone();
        next.set_voters(&voters)?;
        let payload = EventBody::Config(ConfigEvent { voters })
            .to_payload()
            .map_err(|_| ConfigError::BadLimit {
                name: "voters",
                why: "more voters than an event can name",
            })?;
        let offset = self.propose_deferred(EventKind::Config, payload)?;
        self.end_batch();
        for i in 0..self.slots.len() {
            let slot = SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX"));
            if next.expected_identity(slot) != self.cluster.expected_identity(slot) {
                self.slots[i].voted_through = None;
                self.voted_tick[i] = None;
            }
        }
        self.cluster = next;
        self.last_config = Some(offset);
        Ok(offset)
    }

    /// Offset of the last voter-set change this master appended while it is not stabilized.
    #[must_use]
    pub fn pending_config(&self) -> Option<Offset> {
        self.last_config.filter(|&c| self.hwm < Some(c))
    }

    /// Marks the events proposed so far as the end of a batch (a producer's produce, a
    /// cursor commit): an append never stops inside a batch unless the batch alone is larger
    /// than one append may be ([`ReplicationLimits::append_events_max`],
    /// `append_bytes_max`) or the append starts inside it. A store persists an append
    /// whole, so a master that dies leaves every store — and the log a takeover adopts —
    /// with each such batch whole or not at all, and a producer's retry finds its batch
    /// either stabilized (answered from the idempotent-producer table) or absent, instead
    /// of cut: a cut batch is written again and its adopted prefix may already have been
    /// served to consumers (docs/protocol.md, "A batch cut by a failover"). Kafka keeps a
    /// producer's record batch whole in its log for the same reason.
    pub fn end_batch(&mut self) {
        let Some(last) = self.log.end().0.checked_sub(1).map(Offset) else {
            return;
        };
        if self.batch_ends.back().is_none_or(|&b| b < last) {
            self.batch_ends.push_back(last);
        }
    }

    /// Sends every slot what is due within its pipeline window: the events proposed with
    /// [`MasterCore::propose_deferred`] since the last flush. Does nothing after a
    /// step-down.
    pub fn flush(&mut self, out: &mut Vec<MasterCommand>) {
        for i in 0..self.slots.len() {
            self.fill(i, out);
        }
    }

    /// Feeds one input; appends the resulting commands to `out`.
    pub fn handle(&mut self, input: MasterInput, out: &mut Vec<MasterCommand>) {
        if self.is_stopped() {
            self.stats.inputs_after_step_down += 1;
            return;
        }
        match input {
            MasterInput::Persisted {
                slot,
                append,
                epoch,
                through,
                identity,
                voter,
            } => {
                let Some(SlotKind::Store { .. }) = self.cluster.kind(slot) else {
                    self.stats.acks_unknown_slot += 1;
                    return;
                };
                let expected = self.cluster.expected_identity(slot);
                let votes = voter && expected == Some(identity);
                self.on_ack(slot, append, epoch, through, votes, out);
            }
            MasterInput::SlaveHas {
                slot,
                append,
                epoch,
                through,
            } => {
                if !matches!(self.cluster.kind(slot), Some(SlotKind::Slave { .. })) {
                    self.stats.acks_unknown_slot += 1;
                    return;
                }
                self.on_ack(slot, append, epoch, through, false, out);
            }
            MasterInput::Rejected {
                slot,
                append,
                promised,
                last,
                reason,
            } => {
                self.on_rejected(slot, append, promised, last, reason, out);
            }
            MasterInput::SlotConnected { slot } => {
                let Some(i) = self.slot_index(slot) else {
                    return;
                };
                self.slots[i].link = SlotLink::Up;
                let from = self.resend_point(i);
                self.reset_slot(i, from);
                self.fill(i, out);
            }
            MasterInput::SlotDisconnected { slot } => {
                let Some(i) = self.slot_index(slot) else {
                    return;
                };
                let from = self.resend_point(i);
                self.reset_slot(i, from);
                self.slots[i].link = SlotLink::Down;
                self.slots[i].corrupt.clear();
            }
            MasterInput::ReadCorrupt { slot, offset } => {
                let Some(i) = self.slot_index(slot) else {
                    return;
                };
                if !self.cluster.slots[i].is_store() {
                    return;
                }
                let corrupt = &mut self.slots[i].corrupt;
                if let Err(at) = corrupt.binary_search(&offset) {
                    corrupt.insert(at, offset);
                    if corrupt.len() > CORRUPT_OFFSETS_MAX {
                        // Forget the highest other one: the offset just reported must stay
                        // known, or a fetch would be planned on this store again and again.
                        let highest = corrupt.len() - 1;
                        corrupt.remove(if at == highest { highest - 1 } else { highest });
                    }
                }
                self.stats.reads_corrupt += 1;
            }
            MasterInput::Repaired { slot, offset } => {
                if let Some(s) = self.slot_index(slot).map(|i| &mut self.slots[i]) {
                    s.corrupt.retain(|&o| o != offset);
                }
            }
            MasterInput::HeartbeatTick => self.on_heartbeat(out),
            MasterInput::SlaveToCheckpoint { slot, checkpoint } => {
                let Some(i) = self.slot_index(slot) else {
                    return;
                };
                let is_slave = matches!(self.cluster.kind(slot), Some(SlotKind::Slave { .. }));
                let s = &self.slots[i];
                let past = s.matched >= Some(checkpoint)
                    || s.inflight.front().is_some_and(|a| a.first >= checkpoint);
                if !is_slave
                    || checkpoint == Offset::ZERO
                    || self.hwm < Some(checkpoint)
                    || past
                    || s.link != SlotLink::Up
                {
                    return;
                }
                self.reset_slot(i, checkpoint);
                self.fill(i, out);
            }
            MasterInput::RivalSeen { epoch } => {
                if epoch > self.epoch {
                    self.step_down(epoch, out);
                }
            }
            MasterInput::StoreIdentityKnown { slot, identity } => {
                self.cluster.learn_identity(slot, identity);
            }
        }
    }

    /// The master's epoch. Never changes.
    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// Offset of this master's epoch-start event: the HWM never stops below it once it has
    /// risen in this epoch.
    #[must_use]
    pub fn epoch_start(&self) -> Offset {
        self.epoch_start
    }

    /// The HWM: every offset up to it is stabilized. `None`: nothing yet. Never goes down.
    #[must_use]
    pub fn hwm(&self) -> Option<Offset> {
        self.hwm
    }

    /// The offset the next proposal takes.
    #[must_use]
    pub fn next_offset(&self) -> Offset {
        self.log.end()
    }

    /// Accounted bytes of the events at offsets `from..to`: summed exactly over the first
    /// `exact_events_max` of them this master holds in memory; the rest (below its memory,
    /// or past that count) estimated at the mean size of the events in memory. `None` when
    /// an estimate is needed and it holds no event. Used for the catch-up figures, not for
    /// any decision.
    #[must_use]
    pub fn bytes_between(&self, from: Offset, to: Offset, exact_events_max: usize) -> Option<u64> {
        if from >= to {
            return Some(0);
        }
        let first = from.max(self.log.mem_start()).min(to);
        let mut exact = 0u64;
        let mut counted = 0u64;
        for e in self.log.iter_from(first).take(exact_events_max) {
            if e.offset >= to {
                break;
            }
            exact += super::event::accounted_bytes(e);
            counted += 1;
        }
        let estimated = (to.0 - from.0) - counted;
        if estimated == 0 {
            return Some(exact);
        }
        let n = self.log.mem_len() as u64;
        (n > 0).then(|| exact + estimated.saturating_mul(self.log.mem_bytes() / n))
    }

    /// Accounted bytes of the events above the HWM (what backpressure bounds).
    #[must_use]
    pub fn unstable_bytes(&self) -> u64 {
        self.unstable_bytes
    }

    /// `Some(epoch)` once a higher epoch fenced this master.
    #[must_use]
    pub fn fenced_by(&self) -> Option<Epoch> {
        self.fenced_by
    }

    /// Test-only (quire-sim's `--mutate hwm-before-epoch-start`): let the HWM rise below
    /// this master's epoch-start event, counting adopted entries of older epochs as
    /// stabilized once a quorum holds them — the rule Raft §5.4.2 (Figure 8) forbids.
    /// Production code never calls it.
    #[doc(hidden)]
    pub fn set_hwm_before_epoch_start(&mut self) {
        self.hwm_before_epoch_start = true;
    }

    /// Turns the check-quorum rule on (module docs, "Check-quorum"): from now on, at every
    /// [`MasterInput::HeartbeatTick`], once a whole window has passed since this call, the
    /// master gives up if fewer than Qa distinct voting stores acked in its epoch within the
    /// last `window_ticks` ticks. Drivers set the window to the election timeout in ticks
    /// (rounded up), so a master gives up about when a slave would have taken over from a
    /// silent one. Calling it again restarts the window.
    ///
    /// # Panics
    /// If `window_ticks` is 0 (a caller's bug: the master would give up at once).
    pub fn enable_check_quorum(&mut self, window_ticks: u32) {
        assert!(window_ticks > 0, "a check-quorum window of 0 ticks");
        self.check_quorum_ticks = Some(u64::from(window_ticks));
        self.check_quorum_since = self.ticks;
    }

    /// Whether this master gave up for lack of a store quorum ([`MasterCommand::QuorumLost`]).
    #[must_use]
    pub fn is_quorum_lost(&self) -> bool {
        self.quorum_lost
    }

    /// Whether the core has stopped: fenced, or given up for lack of a store quorum.
    #[must_use]
    pub fn is_stopped(&self) -> bool {
        self.fenced_by.is_some() || self.quorum_lost
    }

    /// The master's log (epochs of every offset, in-memory suffix of events).
    #[must_use]
    pub fn log(&self) -> &Log {
        &self.log
    }

    /// The cluster configuration in force (with identities learned since the start).
    #[must_use]
    pub fn cluster(&self) -> &ClusterConfig {
        &self.cluster
    }

    /// Whether store `slot` answered `Corrupt` for a record in `first..=last` since its
    /// connection came up ([`MasterInput::ReadCorrupt`]): it must not serve that range.
    #[must_use]
    pub fn slot_corrupt_in(&self, slot: SlotId, first: Offset, last: Offset) -> bool {
        self.slots
            .get(slot.index())
            .is_some_and(|s| s.corrupt_in(first, last))
    }

    /// The damaged records known of store `slot` ([`MasterInput::ReadCorrupt`]), ascending.
    #[must_use]
    pub fn slot_corrupt(&self, slot: SlotId) -> &[Offset] {
        self.slots.get(slot.index()).map_or(&[], |s| &s.corrupt)
    }

    /// A store to read a good copy of `slot`'s damaged record at `offset` from: connected,
    /// acked this master's log through it as a voter, nothing known damaged there; the one
    /// holding the most, the lowest slot on ties. `None` if there is none now.
    #[must_use]
    pub fn repair_source(&self, slot: SlotId, offset: Offset) -> Option<SlotId> {
        self.read_source(slot.index(), offset, offset)
    }

    /// The progress of `slot`, `None` for an unknown slot.
    #[must_use]
    pub fn slot_status(&self, slot: SlotId) -> Option<SlotStatus> {
        let s = self.slots.get(slot.index())?;
        Some(SlotStatus {
            link: s.link,
            probing: s.probing,
            next: s.next,
            matched: s.matched,
            voted_through: s.voted_through,
            sent_max: s.sent_max,
            appends_inflight: s.inflight.len(),
        })
    }

    /// Counters of ignored inputs and recoveries.
    #[must_use]
    pub fn stats(&self) -> &MasterStats {
        &self.stats
    }

    /// What this broker keeps when it stops being master (after a step-down, or a handoff):
    /// its log and the HWM as the applied offset, to start a
    /// [`super::follower::FollowerCore`] from. Events above the HWM are kept; a new master's
    /// stream truncates them if they conflict.
    #[must_use]
    pub fn into_local_log(self) -> LocalLog {
        LocalLog {
            log: self.log,
            applied: self.hwm,
        }
    }

    // ---------------------------------------------------------------- inputs

    fn slot_index(&self, slot: SlotId) -> Option<usize> {
        (slot.index() < self.slots.len()).then_some(slot.index())
    }

    fn on_ack(
        &mut self,
        slot: SlotId,
        append: AppendId,
        epoch: Epoch,
        through: Option<Offset>,
        votes: bool,
        out: &mut Vec<MasterCommand>,
    ) {
        let i = slot.index();
        if epoch != self.epoch {
            // An ack under another epoch says nothing about this master's log (§5.4.2).
            self.stats.acks_other_epoch += 1;
            return;
        }
        let s = &mut self.slots[i];
        if through > s.sent_max {
            self.stats.acks_beyond_sent += 1;
            return;
        }
        // Answers on one connection come in send order: earlier appends are answered too.
        s.inflight.retain(|a| a.id > append);
        let fresh = append >= s.reset_id;
        if fresh && s.probing {
            s.probing = false;
        }
        if let Some(t) = through {
            s.matched = s.matched.max(Some(t));
            if !s.probing {
                s.next = s.next.max(t.next());
            }
            if votes {
                s.voted_through = s.voted_through.max(Some(t));
                self.voted_tick[i] = Some(self.ticks);
                self.stats.acks_voted += 1;
            } else {
                self.stats.acks_not_voting += 1;
            }
            self.advance_hwm(out);
            self.trim();
        }
        self.fill(i, out);
    }

    fn on_rejected(
        &mut self,
        slot: SlotId,
        append: AppendId,
        promised: Epoch,
        last: Option<LogPosition>,
        reason: RejectReason,
        out: &mut Vec<MasterCommand>,
    ) {
        let Some(i) = self.slot_index(slot) else {
            self.stats.acks_unknown_slot += 1;
            return;
        };
        if promised > self.epoch {
            self.step_down(promised, out);
            return;
        }
        let Some(rejected) = self.slots[i]
            .inflight
            .iter()
            .find(|a| a.id == append)
            .copied()
        else {
            self.stats.rejections_stale += 1;
            return;
        };
        match reason {
            RejectReason::LogMismatch => {
                self.stats.backups += 1;
                let point = self.backup_point(rejected.prev, last);
                let s = &mut self.slots[i];
                // The receiver may have lost what it acked (a wiped store): replication
                // progress follows what it holds now; its votes stay counted.
                s.matched = s.matched.min(point);
                self.reset_slot(i, point.map_or(Offset::ZERO, Offset::next));
                self.fill(i, out);
            }
            RejectReason::LogFailed | RejectReason::Malformed => {
                let from = self.resend_point(i);
                self.reset_slot(i, from);
                self.slots[i].link = SlotLink::Failed;
            }
            RejectReason::Overloaded => {
                // Back off: resend from the first unanswered offset at the next tick.
                self.stats.overloaded += 1;
                let from = self.resend_point(i);
                self.reset_slot(i, from);
                self.slots[i].resume_tick = self.ticks + 1;
            }
            RejectReason::StaleEpoch => {
                // Fenced by an epoch not above ours: only a confused receiver says this.
                // Leave the append to time out.
                self.stats.rejections_inconsistent += 1;
            }
        }
    }

    fn on_heartbeat(&mut self, out: &mut Vec<MasterCommand>) {
        self.ticks += 1;
        let timeout = u64::from(self.limits.append_timeout_ticks);
        for i in 0..self.slots.len() {
            if self.slots[i].link != SlotLink::Up {
                continue;
            }
            if let Some(oldest) = self.slots[i].inflight.front() {
                if self.ticks - oldest.sent_tick >= timeout {
                    self.stats.append_timeouts += 1;
                    let from = self.resend_point(i);
                    self.reset_slot(i, from);
                }
            }
            self.fill(i, out);
            if self.slots[i].inflight.is_empty() && self.ticks >= self.slots[i].resume_tick {
                let next = self.slots[i].next;
                self.send(i, next, 0, AppendEvents::InMemory(Vec::new()), out);
            }
        }
        self.check_quorum(out);
    }

    /// The check-quorum rule (module docs): gives up when fewer than Qa voting stores acked
    /// within the last window.
    fn check_quorum(&mut self, out: &mut Vec<MasterCommand>) {
        let Some(window) = self.check_quorum_ticks else {
            return;
        };
        if self.ticks - self.check_quorum_since < window {
            return;
        }
        let since = self.ticks - window;
        let voters_heard = self
            .voted_tick
            .iter()
            .zip(&self.cluster.slots)
            .filter(|(t, kind)| kind.is_voter() && t.is_some_and(|t| t >= since))
            .count();
        let ack_quorum = self.cluster.ack_quorum;
        if voters_heard >= ack_quorum {
            return;
        }
        self.quorum_lost = true;
        for s in &mut self.slots {
            s.inflight.clear();
        }
        out.push(MasterCommand::QuorumLost {
            voters_heard,
            ack_quorum,
        });
    }

    // ---------------------------------------------------------------- rules

    /// The highest offset the receiver can match after refusing `prev` with last entry
    /// `last`, or `None` to resend from offset 0. See the module docs ("Fast backup").
    fn backup_point(&self, prev: Option<LogPosition>, last: Option<LogPosition>) -> Option<Offset> {
        let p = prev?;
        let l = last?;
        let below_prev = p.offset.0.checked_sub(1)?;
        let ours = self.log.last_offset_with_epoch_at_most(l.epoch)?;
        let c = below_prev.min(l.offset.0).min(ours.0);
        debug_assert!(
            c < p.offset.0,
            "backup must go strictly below the refused prev"
        );
        Some(Offset(c))
    }

    /// Raft §5.4.2 / DESIGN.md: the HWM is the Qa-th largest voted offset among the store
    /// slots, counted only at or after the epoch-start event. Emits `Stabilized` on a rise.
    fn advance_hwm(&mut self, out: &mut Vec<MasterCommand>) {
        self.scratch.clear();
        for (s, kind) in self.slots.iter().zip(&self.cluster.slots) {
            if let (true, Some(v)) = (kind.is_voter(), s.voted_through) {
                self.scratch.push(v);
            }
        }
        assert!(
            self.scratch.len() <= self.cluster.store_count(),
            "more votes than stores: {} > {}",
            self.scratch.len(),
            self.cluster.store_count()
        );
        let Some(h) = quorum_offset(&mut self.scratch, self.cluster.ack_quorum) else {
            return;
        };
        if (h < self.epoch_start && !self.hwm_before_epoch_start) || Some(h) <= self.hwm {
            return;
        }
        assert!(
            h < self.log.end(),
            "HWM {h} past the log end {}",
            self.log.end()
        );
        let from = self.hwm.map_or(Offset::ZERO, Offset::next);
        let events: Vec<Event> = self
            .log
            .iter_from(from)
            .take_while(|e| e.offset <= h)
            .cloned()
            .collect();
        assert_eq!(
            events.len() as u64,
            h.0 + 1 - from.0,
            "invariant: events above the HWM stay in memory"
        );
        for e in &events {
            self.unstable_bytes -= accounted_bytes(e);
        }
        assert!(Some(h) > self.hwm, "the HWM never goes down");
        self.hwm = Some(h);
        out.push(MasterCommand::Stabilized { through: h, events });
    }

    /// Drops from memory what every slot holds and is stabilized, then the oldest stabilized
    /// events beyond `retained_bytes_max` — but only events a voting store acked in this
    /// epoch (with its expected identity), so a lagging slot can always be served from a
    /// store ([`AppendEvents::FromStore`]) and a non-voter's claim never makes the master
    /// drop what it may still need. Once the HWM rose in this epoch, Qa voting stores hold
    /// everything up to it.
    fn trim(&mut self) {
        let Some(h) = self.hwm else { return };
        let voted_max = self
            .slots
            .iter()
            .zip(&self.cluster.slots)
            .filter(|(_, kind)| kind.is_voter())
            .filter_map(|(s, _)| s.voted_through)
            .max();
        let Some(limit) = voted_max.map(|v| v.min(h)) else {
            return;
        };
        let held_by_all = self
            .slots
            .iter()
            .map(|s| s.matched.map_or(Offset::ZERO, Offset::next))
            .min();
        let upto = held_by_all.unwrap_or(Offset::ZERO).min(limit.next());
        self.log.trim_before(upto);
        assert!(
            self.log.mem_bytes() >= self.unstable_bytes,
            "unstable events must be in memory"
        );
        while self.log.mem_bytes() - self.unstable_bytes > self.limits.retained_bytes_max {
            if self.log.trim_one_at_most(limit).is_none() {
                break;
            }
        }
    }

    fn step_down(&mut self, promised: Epoch, out: &mut Vec<MasterCommand>) {
        assert!(
            promised > self.epoch,
            "only a higher epoch fences this master"
        );
        self.fenced_by = Some(promised);
        for s in &mut self.slots {
            s.inflight.clear();
        }
        out.push(MasterCommand::StepDown { promised });
    }

    // ---------------------------------------------------------------- sending

    /// The offset to resend from after losing the appends in flight: the first offset of
    /// the oldest unanswered append (`next` when none is in flight), but not below what the
    /// slot is known to hold. If the slot lost that since (a wiped store), the probe is
    /// refused and the core backs up.
    fn resend_point(&self, i: usize) -> Offset {
        let s = &self.slots[i];
        let unanswered = s.inflight.front().map_or(s.next, |a| a.first);
        unanswered.max(s.matched.map_or(Offset::ZERO, Offset::next))
    }

    /// Forgets the appends in flight and probes again from `next`.
    fn reset_slot(&mut self, i: usize, next: Offset) {
        let s = &mut self.slots[i];
        s.next = next.min(self.log.end());
        s.inflight.clear();
        s.probing = true;
        s.reset_id = AppendId(self.next_append_id);
    }

    /// Sends slot `i` what is due, within its window: one append while probing (an empty
    /// one if nothing is left to send), up to `appends_inflight_max` otherwise.
    fn fill(&mut self, i: usize, out: &mut Vec<MasterCommand>) {
        if self.is_stopped() {
            return;
        }
        loop {
            let s = &self.slots[i];
            let window = if s.probing {
                1
            } else {
                self.limits.appends_inflight_max as usize
            };
            if s.link != SlotLink::Up || s.inflight.len() >= window || self.ticks < s.resume_tick {
                return;
            }
            let first = s.next;
            if first >= self.log.end() {
                if s.probing && s.inflight.is_empty() {
                    self.send(i, first, 0, AppendEvents::InMemory(Vec::new()), out);
                }
                return;
            }
            let events_max = u64::from(self.limits.append_events_max);
            if first >= self.log.mem_start() {
                let mut events =
                    self.log
                        .batch(first, events_max as usize, self.limits.append_bytes_max);
                self.cut_at_batch_end(first, &mut events);
                let count = events.len() as u64;
                assert!(count > 0, "an in-memory batch below the end is never empty");
                self.send(i, first, count, AppendEvents::InMemory(events), out);
            } else {
                let count = (self.log.mem_start().0 - first.0).min(events_max);
                let last = Offset(first.0 + count - 1);
                let Some(source) = self.read_source(i, first, last) else {
                    self.stats.no_read_source += 1;
                    return;
                };
                self.send(i, first, count, AppendEvents::FromStore { source }, out);
            }
        }
    }

    /// Shortens `events` (from `first` on, not empty) to end at the last batch end inside
    /// it, when it stops before the log's end and one is there ([`MasterCore::end_batch`]).
    fn cut_at_batch_end(&mut self, first: Offset, events: &mut Vec<Event>) {
        let mem_start = self.log.mem_start();
        while self.batch_ends.front().is_some_and(|&b| b < mem_start) {
            self.batch_ends.pop_front();
        }
        let last = Offset(first.0 + events.len() as u64 - 1);
        if last.next() >= self.log.end() {
            return;
        }
        let after = self.batch_ends.partition_point(|&b| b <= last);
        if let Some(&end) = after.checked_sub(1).and_then(|i| self.batch_ends.get(i)) {
            if end >= first {
                events.truncate(usize::try_from(end.0 - first.0 + 1).unwrap_or(usize::MAX));
            }
        }
    }

    /// A connected store slot other than `target` that acked this master's log through
    /// `last` as a voter and has no record of `first..=last` known damaged: the one holding
    /// the most, the lowest slot on ties.
    fn read_source(&self, target: usize, first: Offset, last: Offset) -> Option<SlotId> {
        self.slots
            .iter()
            .zip(&self.cluster.slots)
            .enumerate()
            .filter(|&(j, (s, kind))| {
                j != target
                    && kind.is_voter()
                    && s.link == SlotLink::Up
                    && s.voted_through >= Some(last)
                    && !s.corrupt_in(first, last)
            })
            .max_by(|(ja, (a, _)), (jb, (b, _))| {
                a.voted_through.cmp(&b.voted_through).then(jb.cmp(ja))
            })
            .map(|(j, _)| SlotId(u16::try_from(j).expect("invariant: slots <= SLOTS_MAX")))
    }

    fn send(
        &mut self,
        i: usize,
        first: Offset,
        count: u64,
        events: AppendEvents,
        out: &mut Vec<MasterCommand>,
    ) {
        let id = AppendId(self.next_append_id);
        self.next_append_id += 1;
        let prev = self.log.prev_of(first);
        let cmd = AppendCommand {
            slot: SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX")),
            append: id,
            epoch: self.epoch,
            prev,
            first,
            count,
            events,
            hwm: self.hwm,
        };
        let through = cmd.through();
        let s = &mut self.slots[i];
        s.inflight.push_back(Inflight {
            id,
            prev,
            first,
            sent_tick: self.ticks,
        });
        s.sent_max = s.sent_max.max(through);
        s.next = Offset(first.0 + count);
        out.push(MasterCommand::Append(cmd));
    }
}

#[cfg(test)]
#[path = "master_tests.rs"]
mod tests;
