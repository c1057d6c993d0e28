//! The broker's roles as one deterministic state machine: follower, takeover (and the
//! cluster's bootstrap), master, and the changes between them (DESIGN.md "Failover").
//!
//! ```text
//!   Follower (FollowerCore) --election timeout--> TakingOver (TakeoverCore)
//!       no identity known and every store an empty voter: the takeover is a bootstrap
//!   TakingOver --BecomeMaster--> Master (MasterCore) --epoch-start stabilized--> serving
//!   TakingOver --StepBack / Aborted / takeover timeout--> Follower
//!   Master --StepDown (a higher epoch fenced the stores) / a rival's append--> Follower
//!   Master --check-quorum: too few voters acked in the election timeout--> Follower
//!   Master --hand_over (graceful handoff)--> Follower
//! ```
//!
//! The [`Engine`] owns the role with its pure core, the broker state every role applies
//! stabilized events to, the cluster configuration (with the store identities it learns)
//! and the master's write path ([`Writes`]). Its driver calls one method per input — each
//! carries `now_ms`, the driver's monotonic clock in milliseconds — and then takes the
//! [`Command`]s queued meanwhile ([`Engine::take_commands`]) and carries them out: send a
//! fence or an append, read from a store, make the epoch counter or the identities durable,
//! answer a write. Completions come back as inputs. Nothing here reads a clock, draws a
//! random number (the follower's election jitter is seeded by [`EngineConfig::seed`]) or
//! touches a socket or a file, so quire-sim drives this very code.
//!
//! Retention (trim points with checkpoints, `retention.rs`), graceful handoff
//! (`handoff.rs`) and fetch with its long-poll waiters (`fetch.rs`) are the engine's too.

use std::collections::BTreeSet;

use quire_proto::{
    AppendRejected, AppendRequest, BrokerId, Epoch, EpochStartEvent, ErrorCode, ErrorResponse,
    EventBody, FenceGranted, LogPosition, Offset, Voter, VoterChange, VoterChangeRequest,
};

use super::recent::RecentEvents;
use super::{Arrival, Gate, RequestToken, WriteCommand, WriteLimits, WriteRequest, Writes};
use crate::core::takeover::TakeoverMutation;
use crate::core::{
    AdoptedLog, AppendCommand, AppendId, ClusterConfig, ElectionConfig, Event, FenceRefusal,
    FollowerCommand, FollowerConfig, FollowerCore, FollowerInput, LocalLog, MasterCommand,
    MasterConfig, MasterCore, MasterInput, RejectReason, ReplicationLimits, SlotId, SlotKind,
    StoreIdentity, TakeoverCommand, TakeoverConfig, TakeoverCore, TakeoverInput,
};
use crate::retention::RetentionPolicy;
use crate::state::{Applied, BrokerState, CheckpointParts};
use quire_net::Readiness;

mod fetch;
mod handoff;
mod repair;
mod retention;

pub use fetch::{
    FetchReply, StoreFetch, FETCH_BYTES_MAX, FETCH_WAITERS_MAX, FETCH_WAIT_MS_MAX,
    STORE_FETCH_EVENTS_MAX,
};

pub use handoff::{HandoffDone, HandoffFailure, HANDOFF_TIMEOUT_MIN_MS};
pub use retention::{
    CHECKPOINT_PARTS_WRITE_MS_MAX, CHECKPOINT_PART_BYTES_DEFAULT, CHECKPOINT_PART_BYTES_MAX,
    CHECKPOINT_RETRY_AFTER_MS, TRIM_BARRIER_MIN_MS,
};

/// A slave counts as ready (`GET /ready`) while its applied state is at most this many
/// events behind the HWM its master last sent.
pub const SLAVE_READY_LAG_EVENTS_MAX: u64 = 4096;

/// Everything an [`Engine`] is configured with. Times are in milliseconds.
#[derive(Clone, Debug)]
pub struct EngineConfig {
    /// This broker.
    pub me: BrokerId,
    /// Every broker of the cluster, this one included (the election rank is this broker's
    /// place among them, [`ElectionConfig::rank_of`]).
    pub brokers: Vec<BrokerId>,
    /// The slots — the stores first, in store-index order, then the other brokers — with
    /// the identities bound so far and the quorums.
    pub cluster: ClusterConfig,
    /// Shortest election timeout; the jitter is half of it, the rank step a quarter.
    pub election_timeout_ms: u64,
    /// The heartbeat tick: [`Engine::tick`] is called about this often.
    pub heartbeat_ms: u64,
    /// A takeover that makes no progress for this long is abandoned.
    pub takeover_timeout_ms: u64,
    /// Whether a master steps down when too few voters acked within the election timeout
    /// (the check-quorum rule, Raft thesis §6.2).
    pub check_quorum: bool,
    /// The master's write bounds.
    pub write_limits: WriteLimits,
    /// The master's replication bounds.
    pub limits: ReplicationLimits,
    /// Most events a takeover reads from a store at once.
    pub takeover_fetch_events_max: u32,
    /// Most bytes of not-yet-stabilized events a follower keeps.
    pub follower_retained_bytes_max: u64,
    /// Seeds the follower's election jitter.
    pub seed: u64,
    /// Retention: how much of the log the master keeps before it proposes a trim point.
    pub retention: RetentionPolicy,
    /// Bound of the window of recent stabilized events fetches are served from, in
    /// accounted bytes ([`super::recent::RECENT_BYTES_MAX_DEFAULT`]).
    pub recent_bytes_max: u64,
    /// A checkpoint whose encoded snapshot is longer than this is written as Trim events of
    /// at most this many snapshot bytes each ([`CHECKPOINT_PART_BYTES_DEFAULT`]; at most
    /// [`CHECKPOINT_PART_BYTES_MAX`]), in bytes.
    pub checkpoint_part_bytes: usize,
    /// Planted bugs for the simulator's mutation tests; all off in a real broker.
    #[doc(hidden)]
    pub mutations: Mutations,
}

/// Test-only planted bugs (quire-sim's `--mutate`): each must be found by the simulator.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// A takeover adopts the longest log instead of the one of the highest epoch.
    pub adopt_longest: bool,
    /// A new master forgets the idempotent-producer table (not rebuilt on takeover).
    pub forget_dedup: bool,
    /// The master counts older epochs' entries toward the HWM before its epoch-start
    /// event is on a quorum (Raft §5.4.2).
    pub hwm_before_epoch_start: bool,
    /// A graceful handoff does not wait for the log to drain: the master asks the target
    /// at once and, stepping down, acks its pending produces as if stabilized.
    pub handoff_acks_early: bool,
}

/// What the engine asks its driver to do. The driver carries each out and feeds the
/// completion back as the input named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command {
    /// Make the epoch counter `counter` durable; then [`Engine::epoch_persisted`].
    PersistEpochCounter {
        /// The counter.
        counter: u64,
    },
    /// Make the store identities durable (the cluster file); then
    /// [`Engine::identities_persisted`] with `bootstrap_epoch`.
    PersistIdentities {
        /// By store index; `None` for a store not bound yet.
        identities: Vec<Option<StoreIdentity>>,
        /// `Some` when the bootstrap of this epoch waits on the write.
        bootstrap_epoch: Option<Epoch>,
    },
    /// Ask the store at `slot` for its tail (bootstrap probe); then [`Engine::tail_answer`].
    ReadTail {
        /// The store slot.
        slot: SlotId,
        /// The probe this belongs to.
        generation: u64,
    },
    /// Send a fence; then [`Engine::fence_answer`] (or nothing if the store is unreachable).
    SendFence {
        /// The store slot.
        slot: SlotId,
        /// The epoch to fence with.
        epoch: Epoch,
        /// The identity the store must have, if bound.
        expected: Option<StoreIdentity>,
    },
    /// Read `from..=through` from the store at `slot` for the takeover; then
    /// [`Engine::takeover_read`].
    ReadForTakeover(TakeoverRead),
    /// Send this append (its events in memory, or to read from a store first); the
    /// answer comes back through [`Engine::append_answer`].
    Append(AppendCommand),
    /// These stabilized events were applied to the broker state, in order; `master` is
    /// this broker's epoch when it stabilized them as master (`None` on a follower).
    Applied {
        /// The events.
        events: Vec<Event>,
        /// The master epoch that stabilized them here.
        master: Option<Epoch>,
    },
    /// Answer the fetch `token`.
    FetchAnswer {
        /// The request.
        token: RequestToken,
        /// The answer.
        reply: FetchReply,
    },
    /// Repair store `slot`'s damaged copy of the record at `offset`: read the record from
    /// store `source`, send it to `slot` in a `RepairRequest`, and report the answer with
    /// [`Engine::repair_done`] (docs/protocol.md, "Damaged records").
    RepairRecord {
        /// The store whose copy is damaged.
        slot: SlotId,
        /// The record's offset.
        offset: Offset,
        /// The store to read a good copy from.
        source: SlotId,
    },
    /// Answer the fetch `token` by reading a store (the messages are older than the
    /// window).
    FetchFromStore {
        /// The request.
        token: RequestToken,
        /// What to read and how to answer.
        read: StoreFetch,
    },
    /// A write-path command (answers and metrics).
    Write(WriteCommand),
    /// A takeover started.
    TakingOver {
        /// Its epoch.
        epoch: Epoch,
        /// Whether it bootstraps a new cluster.
        bootstrap: bool,
    },
    /// A takeover was given up; the broker follows again.
    Abandoned {
        /// The takeover's epoch.
        epoch: Epoch,
        /// Why.
        why: String,
    },
    /// The broker became master of `epoch` (not serving until its epoch-start event is
    /// stabilized).
    BecameMaster {
        /// The epoch.
        epoch: Epoch,
    },
    /// The master serves: its epoch-start event is stabilized. `failover_ms` runs from the
    /// last contact with the previous master (or the takeover's start).
    Serving {
        /// The epoch.
        epoch: Epoch,
        /// The failover's duration.
        failover_ms: u64,
    },
    /// Ask broker `to` to take over now (graceful handoff: `TakeOverNowRequest{from_epoch:
    /// epoch, hwm}`); then [`Engine::take_over_answer`].
    AskTakeOver {
        /// The target.
        to: BrokerId,
        /// The handing master's epoch.
        epoch: Epoch,
        /// Its HWM.
        hwm: Option<Offset>,
    },
    /// Answer the handoff request `token`.
    HandoffDone {
        /// The request.
        token: RequestToken,
        /// The new master, or why the handoff failed.
        outcome: Result<HandoffDone, HandoffFailure>,
    },
    /// The broker stopped being master of `epoch` and follows (`promised` is the epoch it
    /// now knows). Waiting writes and fetches have been answered.
    LeftMaster {
        /// The master's epoch.
        epoch: Epoch,
        /// The epoch followed now.
        promised: Epoch,
    },
}

/// A takeover's read of `from..=through` from one store ([`Command::ReadForTakeover`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TakeoverRead {
    /// The store slot.
    pub slot: SlotId,
    /// The takeover's epoch.
    pub epoch: Epoch,
    /// First offset.
    pub from: Offset,
    /// Last offset (at or above `from`).
    pub through: Offset,
}

impl TakeoverRead {
    /// Events in `from..=through`.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.through.0 - self.from.0 + 1
    }
}

/// The answer to an append another broker (the master) sent to this one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InboundAnswer {
    /// Accepted: the follower holds the log through `last` (heartbeat ack).
    Has {
        /// The master epoch followed.
        epoch: Epoch,
        /// The follower's last entry.
        last: Option<LogPosition>,
    },
    /// Refused.
    Rejected(AppendRejected),
    /// Between two roles (never seen by a driver that waits for commands): not following.
    NotFollowing,
}

/// An answer from a slot to an append this master sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SlotAnswer {
    /// A store's persisted ack.
    Persisted {
        /// The epoch the store acked under.
        epoch: Epoch,
        /// Through where it holds the master's log.
        through: Option<Offset>,
        /// The store's identity.
        identity: StoreIdentity,
        /// Whether it is a voter.
        voter: bool,
    },
    /// A slave broker's heartbeat ack: it follows `epoch`.
    SlaveHas {
        /// The epoch the slave follows.
        epoch: Epoch,
    },
    /// Refused.
    Rejected(AppendRejected),
}

/// A store's answer to a fence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceAnswer {
    /// Granted.
    Granted(FenceGranted),
    /// Refused: the store promised `promised`, which is not below the fence's epoch.
    Refused {
        /// The store's promised epoch.
        promised: Epoch,
    },
    /// The store is not a voter (a learner).
    NotVoter,
}

/// A store's answer to a bootstrap probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TailAnswer {
    /// The store's last entry.
    pub last: Option<LogPosition>,
    /// Whether it is a voter.
    pub voter: bool,
}

/// A takeover in progress.
#[derive(Debug)]
struct TakeoverRun {
    core: TakeoverCore,
    deadline_ms: u64,
    failover_from_ms: u64,
    /// The master epoch followed before (the follower goes back to it).
    known_epoch: Epoch,
    /// `Some` while bootstrapping: the grants collected, by store slot.
    bootstrap: Option<Vec<Option<FenceGranted>>>,
    /// The bootstrap's identities are being made durable.
    binding: bool,
}

/// The master's bookkeeping around its core.
#[derive(Debug)]
struct MasterRun {
    core: MasterCore,
    serving: bool,
    failover_from_ms: u64,
    writes: Writes,
    /// Per store slot: the identity and voter flag of its last ack.
    store_answers: Vec<Option<(StoreIdentity, bool)>>,
    /// Per store slot: when it last acked as a voter with its bound identity.
    voted_at_ms: Vec<Option<u64>>,
}

#[derive(Debug)]
enum Role {
    Follower(Box<FollowerCore>),
    TakingOver(Box<TakeoverRun>),
    Master(Box<MasterRun>),
    /// Only between two roles, inside one method.
    Switching,
}

/// What a broker is now, for status and routing (borrowed from the engine).
#[derive(Clone, Copy, Debug)]
pub enum RoleView<'a> {
    /// A slave.
    Follower(&'a FollowerCore),
    /// Taking over with this epoch.
    TakingOver(Epoch),
    /// Master: its core, and whether it serves.
    Master(&'a MasterCore, bool),
}

/// The broker engine. See the module docs.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    cluster: ClusterConfig,
    store_count: usize,
    role: Role,
    state: BrokerState,
    /// The state missed events it could not rebuild (no checkpoint yet): no takeover until
    /// a checkpoint repairs it.
    state_gap: bool,
    /// A checkpoint written in parts being gathered to rebuild the state (with `state_gap`).
    checkpoint_parts: Option<CheckpointParts>,
    durable_counter: u64,
    highest_epoch_seen: Epoch,
    last_master_contact_ms: Option<u64>,
    /// The HWM the master's last accepted append carried.
    master_hwm_heard: Option<Offset>,
    slot_up: Vec<bool>,
    seed: u64,
    persisting_identities: bool,
    identities_dirty: bool,
    /// A bootstrap probe in progress: its generation and, per store, an "empty voter" answer.
    bootstrap_probe: Option<(u64, Vec<Option<bool>>)>,
    probe_generation: u64,
    probe_started_ms: u64,
    bootstrap_refusal_logged: bool,
    /// A graceful handoff this broker runs as the handing master.
    handoff: Option<handoff::Handoff>,
    retention: retention::Retention,
    /// Stabilized events kept in memory for fetches.
    recent: RecentEvents,
    /// Fetches waiting for messages.
    parked: Vec<fetch::Parked>,
    /// Damaged store records: being repaired, and reported while not master.
    repairs: repair::Repairs,
    /// The latest `now_ms` an input carried.
    now_ms: u64,
    /// Steps a planted mutation changed (test-only; 0 with every rule on).
    mutated_steps: u64,
    out: Vec<Command>,
}

impl Engine {
    /// Steps a planted mutation ([`Mutations`]) changed so far: a stabilization below the
    /// epoch-start event, a handoff asked before the log drained. Test-only; 0 with every
    /// rule on.
    #[doc(hidden)]
    #[must_use]
    pub fn mutated_steps(&self) -> u64 {
        self.mutated_steps
    }

    /// A follower with an empty log. `durable_counter` is the epoch counter read back from
    /// disk; `now_ms` starts the election timer.
    #[must_use]
    pub fn new(cfg: EngineConfig, durable_counter: u64, now_ms: u64) -> Engine {
        let cluster = cfg.cluster.clone();
        let cfg_retention = cfg.retention;
        let cfg_recent = cfg.recent_bytes_max;
        let store_count = cluster
            .slots
            .iter()
            .filter(|k| matches!(k, SlotKind::Store { .. }))
            .count();
        let mut engine = Engine {
            slot_up: vec![false; cluster.slots.len()],
            seed: cfg.seed,
            cfg,
            cluster,
            store_count,
            role: Role::Switching,
            state: BrokerState::new(),
            state_gap: false,
            checkpoint_parts: None,
            durable_counter,
            highest_epoch_seen: Epoch::ZERO,
            last_master_contact_ms: None,
            master_hwm_heard: None,
            persisting_identities: false,
            identities_dirty: false,
            bootstrap_probe: None,
            probe_generation: 0,
            probe_started_ms: now_ms,
            bootstrap_refusal_logged: false,
            handoff: None,
            retention: retention::Retention::new(cfg_retention),
            recent: RecentEvents::new(cfg_recent),
            parked: Vec::new(),
            repairs: repair::Repairs::default(),
            now_ms,
            mutated_steps: 0,
            out: Vec::new(),
        };
        engine.role = Role::Follower(Box::new(
            engine.new_follower(LocalLog::empty(), Epoch::ZERO),
        ));
        engine
    }

    /// The commands queued since the last call, in order.
    pub fn take_commands(&mut self) -> Vec<Command> {
        std::mem::take(&mut self.out)
    }

    // ------------------------------------------------------------------ accessors

    /// The role now.
    #[must_use]
    pub fn role(&self) -> RoleView<'_> {
        match &self.role {
            Role::Follower(f) => RoleView::Follower(f),
            Role::TakingOver(t) => RoleView::TakingOver(t.core.epoch()),
            Role::Master(m) => RoleView::Master(&m.core, m.serving),
            Role::Switching => unreachable!("invariant: Switching never outlives a method"),
        }
    }

    /// Whether this broker is master and serves (its epoch-start event is stabilized).
    #[must_use]
    pub fn is_serving(&self) -> bool {
        matches!(&self.role, Role::Master(m) if m.serving)
    }

    /// This broker's epoch if it is master.
    #[must_use]
    pub fn master_epoch(&self) -> Option<Epoch> {
        match &self.role {
            Role::Master(m) => Some(m.core.epoch()),
            _ => None,
        }
    }

    /// The master's core, if master.
    #[must_use]
    pub fn master_core(&self) -> Option<&MasterCore> {
        match &self.role {
            Role::Master(m) => Some(&m.core),
            _ => None,
        }
    }

    /// Writes the master accepted and has not answered (0 when not master).
    #[must_use]
    pub fn writes_pending(&self) -> usize {
        match &self.role {
            Role::Master(m) => m.writes.pending_len(),
            _ => 0,
        }
    }

    /// Per store slot: the identity and voter flag of its last ack to this master.
    #[must_use]
    pub fn store_answer(&self, slot: SlotId) -> Option<(StoreIdentity, bool)> {
        match &self.role {
            Role::Master(m) => m.store_answers.get(slot.index()).copied().flatten(),
            _ => None,
        }
    }

    /// The broker state (every role applies stabilized events to it).
    #[must_use]
    pub fn state(&self) -> &BrokerState {
        &self.state
    }

    /// A consumer's read of its committed cursor `cursor` on `topic`: `None` when this
    /// broker does not serve (not master, or its epoch-start event not stabilized yet: the
    /// client asks another broker); else the offset of the last stabilized commit, `None`
    /// if none was ever stabilized. A deposed master that has not heard of its successor
    /// yet may answer an older commit (cursors are at-least-once positions, as Kafka's
    /// committed offsets are).
    #[must_use]
    pub fn read_cursor(&self, topic: &str, cursor: &str) -> Option<Option<Offset>> {
        self.is_serving().then(|| self.state.cursor(topic, cursor))
    }

    /// The cluster configuration, with the identities learned so far.
    #[must_use]
    pub fn cluster(&self) -> &ClusterConfig {
        &self.cluster
    }

    /// Number of store slots.
    #[must_use]
    pub fn store_count(&self) -> usize {
        self.store_count
    }

    /// Whether the driver's link to `slot` is up.
    #[must_use]
    pub fn slot_up(&self, slot: SlotId) -> bool {
        self.slot_up.get(slot.index()).copied().unwrap_or(false)
    }

    /// The highest epoch this broker has seen anywhere.
    #[must_use]
    pub fn highest_epoch_seen(&self) -> Epoch {
        self.highest_epoch_seen
    }

    /// The epoch counter known durable.
    #[must_use]
    pub fn durable_counter(&self) -> u64 {
        self.durable_counter
    }

    /// When the master last spoke to this broker (ms), if ever.
    #[must_use]
    pub fn last_master_contact_ms(&self) -> Option<u64> {
        self.last_master_contact_ms
    }

    /// The HWM the master's last accepted append carried.
    #[must_use]
    pub fn master_hwm_heard(&self) -> Option<Offset> {
        self.master_hwm_heard
    }

    /// The epoch a client should address and the master, as far as this broker knows:
    /// itself when master, the followed master while it spoke within two election
    /// timeouts, nobody otherwise.
    #[must_use]
    pub fn master_hint(&self, now_ms: u64) -> (Epoch, Option<BrokerId>) {
        match &self.role {
            Role::Master(_) => (self.highest_epoch_seen, Some(self.cfg.me)),
            Role::Follower(_) if self.handed_over_to().is_some() => {
                (self.highest_epoch_seen, self.handed_over_to())
            }
            Role::Follower(f) => {
                let recent = self.last_master_contact_ms.is_some_and(|t| {
                    now_ms.saturating_sub(t) < self.cfg.election_timeout_ms.saturating_mul(2)
                });
                let e = f.master_epoch();
                let master = (e != Epoch::ZERO && recent).then(|| e.broker());
                (self.highest_epoch_seen.max(e), master)
            }
            Role::TakingOver(_) | Role::Switching => (self.highest_epoch_seen, None),
        }
    }

    /// Whether this broker should get client traffic (`GET /ready`; docs/operations.md
    /// "Health checks"):
    /// - a master is ready once it serves (its epoch-start event is stabilized) and while it
    ///   is not handing off;
    /// - a slave is ready while it heard from a master within the election timeout and its
    ///   applied state is at most [`SLAVE_READY_LAG_EVENTS_MAX`] events behind the HWM that
    ///   master last sent;
    /// - a broker taking over is not ready.
    #[must_use]
    pub fn readiness(&self, now_ms: u64) -> Readiness {
        match self.role() {
            RoleView::Master(core, false) => Readiness::NotReady(format!(
                "master of epoch {}, not serving yet: its epoch-start event is not stabilized",
                core.epoch()
            )),
            RoleView::Master(core, true) if self.is_handing_off() => Readiness::NotReady(format!(
                "master of epoch {}, handing off to another broker",
                core.epoch()
            )),
            RoleView::Master(..) => Readiness::Ready,
            RoleView::TakingOver(epoch) => {
                Readiness::NotReady(format!("taking over (epoch {epoch}): no master serves"))
            }
            RoleView::Follower(f) => {
                let Some(heard) = self.last_master_contact_ms else {
                    return Readiness::NotReady("slave: no master known yet".to_owned());
                };
                let silent = now_ms.saturating_sub(heard);
                let timeout = self.cfg.election_timeout_ms;
                if silent >= timeout {
                    return Readiness::NotReady(format!(
                        "slave: the master of epoch {} has been silent for {silent} ms (election timeout {timeout} ms)",
                        f.master_epoch(),
                    ));
                }
                let behind = match (self.master_hwm_heard, f.applied()) {
                    (None, _) => 0,
                    (Some(h), None) => h.0 + 1,
                    (Some(h), Some(a)) => h.0.saturating_sub(a.0),
                };
                if behind > SLAVE_READY_LAG_EVENTS_MAX {
                    return Readiness::NotReady(format!(
                        "slave: catching up, {behind} events behind the master's HWM (ready within {SLAVE_READY_LAG_EVENTS_MAX})"
                    ));
                }
                Readiness::Ready
            }
        }
    }

    /// The answer to a heartbeat from a broker of epoch `epoch`: the epoch this broker
    /// knows and its last entry.
    pub fn heartbeat(&mut self, epoch: Epoch) -> (Epoch, Option<LogPosition>) {
        let (known, last) = match &self.role {
            Role::Follower(f) => (f.master_epoch(), f.log().last()),
            _ => (self.highest_epoch_seen, None),
        };
        self.see_epoch(epoch);
        (known.max(self.highest_epoch_seen), last)
    }

    // ------------------------------------------------------------------ inputs

    /// The heartbeat timer fired.
    pub fn tick(&mut self, now_ms: u64) {
        self.at(now_ms);
        match &mut self.role {
            Role::Follower(f) => {
                let mut out = Vec::new();
                f.handle(FollowerInput::Tick { now_ms }, &mut out);
                let followed = f.master_epoch();
                if out
                    .iter()
                    .any(|c| matches!(c, FollowerCommand::StartTakeover { .. }))
                {
                    if self.knows_identities() {
                        self.start_takeover();
                    } else if followed == Epoch::ZERO {
                        self.probe_bootstrap();
                    } else {
                        // A master existed: the cluster is not new, and this broker has not
                        // learned its voters yet. Only a master's stream can teach it.
                        tracing::debug!("no master heard, no voters known: waiting for a master");
                    }
                }
            }
            Role::TakingOver(t) => {
                if now_ms >= t.deadline_ms {
                    tracing::info!(epoch = %t.core.epoch(), "takeover did not finish in time");
                    self.abandon_takeover("timed out");
                }
            }
            Role::Master(m) => {
                let mut out = Vec::new();
                m.core.handle(MasterInput::HeartbeatTick, &mut out);
                self.dispatch_master(out);
                self.expire_writes();
                self.sweep_repairs();
            }
            Role::Switching => {}
        }
        self.retention_tick();
        self.advance_handoff();
        self.expire_fetches();
        if !matches!(self.role, Role::Master(_)) {
            // The master sweeps after its heartbeat tick, above.
            self.sweep_repairs();
        }
    }

    /// The driver's link to `slot` came up or went down.
    pub fn link(&mut self, slot: SlotId, up: bool, now_ms: u64) {
        self.at(now_ms);
        let Some(known) = self.slot_up.get_mut(slot.index()) else {
            return;
        };
        *known = up;
        match &mut self.role {
            Role::Master(m) => {
                let input = if up {
                    MasterInput::SlotConnected { slot }
                } else {
                    MasterInput::SlotDisconnected { slot }
                };
                let mut out = Vec::new();
                m.core.handle(input, &mut out);
                self.dispatch_master(out);
            }
            Role::TakingOver(t) if up => {
                let mut out = Vec::new();
                t.core
                    .handle(TakeoverInput::SlotConnected { slot }, &mut out);
                self.dispatch_takeover(out);
            }
            _ => {}
        }
    }

    /// An append from another broker, `append` naming it. Returns the answer to send back.
    pub fn inbound_append(
        &mut self,
        append: AppendId,
        req: AppendRequest,
        now_ms: u64,
    ) -> InboundAnswer {
        self.at(now_ms);
        self.see_epoch(req.epoch);
        // A master or a takeover meets a higher epoch: it stops and follows.
        match &mut self.role {
            Role::Master(m) if req.epoch > m.core.epoch() => {
                let mut out = Vec::new();
                m.core
                    .handle(MasterInput::RivalSeen { epoch: req.epoch }, &mut out);
                self.dispatch_master(out);
            }
            Role::Master(m) => {
                return InboundAnswer::Rejected(AppendRejected {
                    reason: quire_proto::RejectReason::StaleEpoch,
                    promised: m.core.epoch(),
                    last: m.core.log().last(),
                });
            }
            Role::TakingOver(t) if req.epoch > t.core.epoch() => {
                let mut out = Vec::new();
                t.core
                    .handle(TakeoverInput::RivalSeen { epoch: req.epoch }, &mut out);
                self.dispatch_takeover(out);
            }
            Role::TakingOver(t) => {
                return InboundAnswer::Rejected(AppendRejected {
                    reason: quire_proto::RejectReason::StaleEpoch,
                    promised: t.core.epoch(),
                    last: None,
                });
            }
            Role::Follower(_) | Role::Switching => {}
        }
        let Role::Follower(f) = &mut self.role else {
            return InboundAnswer::NotFollowing;
        };
        let mut out = Vec::new();
        let heard_hwm = req.hwm;
        let events = req.events;
        f.handle(
            FollowerInput::Append {
                append,
                epoch: req.epoch,
                prev: req.prev,
                events,
                hwm: req.hwm,
            },
            &mut out,
        );
        let master_epoch = f.master_epoch();
        let last = f.log().last();
        let mut answer = InboundAnswer::NotFollowing;
        for c in out {
            match c {
                FollowerCommand::Has { .. } => {
                    self.last_master_contact_ms = Some(now_ms);
                    self.master_hwm_heard = self.master_hwm_heard.max(heard_hwm);
                    answer = InboundAnswer::Has {
                        epoch: master_epoch,
                        last,
                    };
                }
                FollowerCommand::Refuse {
                    known_epoch,
                    last,
                    reason,
                    ..
                } => {
                    if reason != RejectReason::StaleEpoch {
                        self.last_master_contact_ms = Some(now_ms);
                    }
                    answer = InboundAnswer::Rejected(AppendRejected {
                        reason,
                        promised: known_epoch,
                        last,
                    });
                }
                FollowerCommand::Apply { events } => self.apply_events(&events, None),
                FollowerCommand::StartTakeover { .. } => {}
            }
        }
        self.advance_handoff();
        answer
    }

    /// The answer of the store at `slot` to the bootstrap probe `generation` (`Err`: no
    /// answer).
    pub fn tail_answer(
        &mut self,
        slot: SlotId,
        generation: u64,
        answer: Result<TailAnswer, ()>,
        now_ms: u64,
    ) {
        self.at(now_ms);
        let Some((g, answers)) = &mut self.bootstrap_probe else {
            return;
        };
        if *g != generation || slot.index() >= answers.len() {
            return;
        }
        // The answers are stale if a master spoke since the probe began (it may have
        // written its epoch-start event after a store answered).
        let heard = self
            .last_master_contact_ms
            .is_some_and(|t| t >= self.probe_started_ms);
        let follows = matches!(&self.role, Role::Follower(f) if f.master_epoch() != Epoch::ZERO);
        if heard || follows || !matches!(self.role, Role::Follower(_)) {
            self.bootstrap_probe = None;
            return;
        }
        match answer {
            Ok(t) => {
                if t.last.is_some() || !t.voter {
                    if !self.bootstrap_refusal_logged {
                        tracing::warn!(%slot, last = ?t.last, voter = t.voter, "a store is not an empty voter but this broker knows no store identity: it will not bootstrap a cluster; waiting to learn the voters from a master");
                        self.bootstrap_refusal_logged = true;
                    } else {
                        tracing::debug!(%slot, last = ?t.last, "still no voters known and a store is not empty");
                    }
                    self.bootstrap_probe = None;
                    return;
                }
                answers[slot.index()] = Some(true);
                if answers.iter().all(Option::is_some) {
                    self.bootstrap_probe = None;
                    self.start_takeover();
                }
            }
            Err(()) => tracing::debug!(%slot, "bootstrap probe: no tail"),
        }
    }

    /// The master of `from_epoch`, handing off, asks this broker to take over now
    /// (graceful handoff). Starts an ordinary takeover and returns `true` if this broker
    /// follows that master and knows the voters; otherwise does nothing and returns `false`
    /// (the driver answers `NotMaster`).
    pub fn take_over_now(&mut self, from_epoch: Epoch, now_ms: u64) -> bool {
        self.at(now_ms);
        let follows = matches!(&self.role, Role::Follower(f) if f.master_epoch() == from_epoch);
        if !follows || !self.knows_identities() {
            return false;
        }
        tracing::info!(%from_epoch, "the master hands over: taking over now");
        self.start_takeover();
        true
    }

    /// The epoch counter write for `counter` completed (`ok`) or failed.
    pub fn epoch_persisted(&mut self, counter: u64, ok: bool, now_ms: u64) {
        self.at(now_ms);
        if !ok {
            tracing::error!(
                counter,
                "cannot make the epoch counter durable: no fence goes out"
            );
            self.abandon_takeover("the epoch counter is not durable");
            return;
        }
        self.durable_counter = self.durable_counter.max(counter);
        if let Role::TakingOver(t) = &mut self.role {
            let mut out = Vec::new();
            t.core
                .handle(TakeoverInput::EpochPersisted { counter }, &mut out);
            self.dispatch_takeover(out);
        }
    }

    /// The identities write asked by [`Command::PersistIdentities`] completed (`ok`) or
    /// failed.
    pub fn identities_persisted(&mut self, bootstrap_epoch: Option<Epoch>, ok: bool, now_ms: u64) {
        self.at(now_ms);
        self.persisting_identities = false;
        if !ok {
            tracing::error!("cannot write the cluster file with the store identities");
        }
        if let Some(epoch) = bootstrap_epoch {
            self.finish_bootstrap(epoch, ok);
        }
        self.persist_identities(None);
    }

    /// A store's answer to the fence of `epoch`.
    pub fn fence_answer(&mut self, slot: SlotId, epoch: Epoch, answer: FenceAnswer, now_ms: u64) {
        self.at(now_ms);
        let Role::TakingOver(t) = &mut self.role else {
            return;
        };
        if epoch != t.core.epoch() {
            return;
        }
        let mut out = Vec::new();
        match answer {
            FenceAnswer::Granted(g) => {
                if let Some(cut) = g.tail_cut {
                    tracing::warn!(%slot, cut_offset = %cut.offset, cut_promised = %cut.promised, "the store grants with a tail-cut mark: it counts toward the fence quorum only if every store grants");
                }
                if let Some(grants) = &mut t.bootstrap {
                    if g.last.is_some() {
                        tracing::warn!(%slot, last = ?g.last, "a store holds events but this broker knows no store identity: it will not bootstrap a cluster; waiting to learn the voters from a master");
                        self.abandon_takeover("a store is not empty");
                        return;
                    }
                    if g.epoch == epoch {
                        if let Some(s) = grants.get_mut(slot.index()) {
                            *s = Some(g);
                        }
                    }
                    if grants.iter().all(Option::is_some) && !t.binding {
                        t.binding = true;
                        for (i, g) in grants.iter().enumerate() {
                            if let Some(g) = g {
                                self.cluster.learn_identity(
                                    slot_of(i),
                                    StoreIdentity {
                                        store_id: g.store_id,
                                        incarnation: g.incarnation,
                                    },
                                );
                            }
                        }
                        tracing::info!(%epoch, "every store granted with an empty log: binding their identities (bootstrap)");
                        self.persist_identities(Some(epoch));
                    }
                    return;
                }
                t.core.handle(
                    TakeoverInput::FenceGranted {
                        slot,
                        epoch: g.epoch,
                        identity: StoreIdentity {
                            store_id: g.store_id,
                            incarnation: g.incarnation,
                        },
                        last: g.last,
                        tail_cut: g.tail_cut,
                    },
                    &mut out,
                );
            }
            FenceAnswer::Refused { promised } => {
                self.highest_epoch_seen = self.highest_epoch_seen.max(promised);
                t.core.handle(
                    TakeoverInput::FenceRefused {
                        slot,
                        epoch,
                        promised,
                        reason: FenceRefusal::Promised,
                    },
                    &mut out,
                );
            }
            FenceAnswer::NotVoter => {
                tracing::warn!(%slot, "store answered the fence: not a voter");
                if t.bootstrap.is_some() {
                    self.abandon_takeover("a store is a learner");
                    return;
                }
                t.core.handle(
                    TakeoverInput::FenceRefused {
                        slot,
                        epoch,
                        promised: Epoch::ZERO,
                        reason: FenceRefusal::NotVoter,
                    },
                    &mut out,
                );
            }
        }
        self.dispatch_takeover(out);
    }

    /// The takeover read of `epoch` from `slot` was answered "trimmed": the store's log
    /// starts at `first_offset`, above the offset asked for. The takeover restarts its log
    /// at the first checkpoint from there (`TakeoverCore`, docs/protocol.md "Retention").
    pub fn takeover_read_trimmed(
        &mut self,
        slot: SlotId,
        epoch: Epoch,
        first_offset: Offset,
        now_ms: u64,
    ) {
        self.at(now_ms);
        let Role::TakingOver(t) = &mut self.role else {
            return;
        };
        if epoch == t.core.epoch() {
            t.deadline_ms = now_ms.saturating_add(self.cfg.takeover_timeout_ms);
        }
        tracing::info!(%slot, %first_offset, "takeover: the adopted store deleted the log below its first offset; restarting the log at its first checkpoint");
        let mut out = Vec::new();
        t.core.handle(
            TakeoverInput::FetchTrimmed {
                slot,
                epoch,
                first_offset,
            },
            &mut out,
        );
        self.dispatch_takeover(out);
    }

    /// The takeover read of `epoch` from `slot` brought `events` (`Err`: it failed).
    pub fn takeover_read(
        &mut self,
        slot: SlotId,
        epoch: Epoch,
        events: Result<Vec<Event>, ()>,
        now_ms: u64,
    ) {
        self.at(now_ms);
        let Role::TakingOver(t) = &mut self.role else {
            return;
        };
        let input = match events {
            Ok(events) => {
                // Progress: a long tail may take many reads; the deadline bounds a stall,
                // not the length of the log.
                if epoch == t.core.epoch() && !events.is_empty() {
                    t.deadline_ms = now_ms.saturating_add(self.cfg.takeover_timeout_ms);
                }
                TakeoverInput::Fetched {
                    slot,
                    epoch,
                    events,
                }
            }
            Err(()) => TakeoverInput::FetchFailed {
                slot,
                epoch,
                promised: None,
            },
        };
        let mut out = Vec::new();
        t.core.handle(input, &mut out);
        self.dispatch_takeover(out);
    }

    /// The answer of `slot` to the append `append` of epoch `epoch` covering through
    /// `through` (as sent: [`AppendCommand::through`]).
    pub fn append_answer(
        &mut self,
        slot: SlotId,
        append: AppendId,
        epoch: Epoch,
        through: Option<Offset>,
        answer: SlotAnswer,
        now_ms: u64,
    ) {
        self.at(now_ms);
        let is_store = self.is_store(slot);
        let Role::Master(m) = &mut self.role else {
            if let SlotAnswer::Rejected(r) = &answer {
                self.highest_epoch_seen = self.highest_epoch_seen.max(r.promised);
            }
            return;
        };
        if epoch != m.core.epoch() {
            return;
        }
        let input = match answer {
            SlotAnswer::Persisted {
                epoch: acked,
                through: acked_through,
                identity,
                voter,
            } if is_store => {
                m.store_answers[slot.index()] = Some((identity, voter));
                if voter && self.cluster.expected_identity(slot) == Some(identity) {
                    m.voted_at_ms[slot.index()] = Some(now_ms);
                }
                MasterInput::Persisted {
                    slot,
                    append,
                    epoch: acked,
                    through: acked_through,
                    identity,
                    voter,
                }
            }
            SlotAnswer::SlaveHas { epoch: followed } if !is_store => {
                if followed > m.core.epoch() {
                    MasterInput::RivalSeen { epoch: followed }
                } else {
                    MasterInput::SlaveHas {
                        slot,
                        append,
                        epoch,
                        through,
                    }
                }
            }
            SlotAnswer::Rejected(r) => {
                self.highest_epoch_seen = self.highest_epoch_seen.max(r.promised);
                MasterInput::Rejected {
                    slot,
                    append,
                    promised: r.promised,
                    last: r.last,
                    reason: r.reason,
                }
            }
            other => {
                tracing::warn!(%slot, answer = ?other, "an answer of the wrong kind for this slot");
                return;
            }
        };
        let mut out = Vec::new();
        m.core.handle(input, &mut out);
        self.dispatch_master(out);
    }

    /// Runs `f` on the master's core (if master) and carries out the core's commands as
    /// the engine's own: for the parts of the broker not in the engine yet (retention
    /// proposes its checkpoints and answers trimmed reads through it).
    pub fn with_master(
        &mut self,
        now_ms: u64,
        f: impl FnOnce(&mut MasterCore, &BrokerState, &mut Vec<MasterCommand>),
    ) {
        self.at(now_ms);
        let Role::Master(m) = &mut self.role else {
            return;
        };
        let mut out = Vec::new();
        f(&mut m.core, &self.state, &mut out);
        self.dispatch_master(out);
    }

    /// A write request (produce or cursor commit) for this master. Returns `false` (and
    /// keeps nothing) when this broker is not master: the driver answers `NotMaster`.
    pub fn write(
        &mut self,
        token: RequestToken,
        request: WriteRequest,
        received_ms: u64,
        now_ms: u64,
    ) -> bool {
        self.at(now_ms);
        let gate = self.write_gate();
        let Role::Master(m) = &mut self.role else {
            return false;
        };
        let mut out = Vec::new();
        m.writes.on_request(
            &mut m.core,
            &self.state,
            gate,
            Arrival::new(token, request, received_ms),
            &mut out,
        );
        self.push_writes(out);
        true
    }

    /// An operator's voter-set change for this master (DESIGN.md "Membership changes"):
    /// checked against what the master sees of the store, then appended as a `Config` event
    /// through the write path ([`WriteRequest::Voters`]) and answered once stabilized.
    /// Refusals are answered at once: `VoterChangeRefused` (not a store slot, unreachable,
    /// another identity, a learner directory, already or not a voter, too few reachable
    /// voters left), `StoreCatchingUp` (an added store must hold the log up to the HWM
    /// first), `ChangeInProgress`. Returns `false` (and keeps nothing) when this broker is
    /// not master.
    pub fn change_voters(
        &mut self,
        token: RequestToken,
        change: VoterChangeRequest,
        received_ms: u64,
        now_ms: u64,
    ) -> bool {
        self.at(now_ms);
        let Role::Master(m) = &self.role else {
            return false;
        };
        match self.plan_voter_change(m, change) {
            Ok(voters) => {
                tracing::info!(action = ?change.action, store_index = change.store_index, store_id = %format_args!("{:016x}", change.store_id.0), voters = voters.len(), "appending a voter-set change");
                self.write(token, WriteRequest::Voters(voters), received_ms, now_ms);
                self.sync_master_cluster();
            }
            Err(e) => self.push_writes(vec![WriteCommand::Answer {
                token,
                kind: super::WriteKind::Voters,
                reply: super::Reply::Error(e),
                error_label: None,
            }]),
        }
        true
    }

    /// The voter set `change` asks for, or why it is refused.
    fn plan_voter_change(
        &self,
        m: &MasterRun,
        change: VoterChangeRequest,
    ) -> Result<Vec<Voter>, ErrorResponse> {
        let refuse = |why: String| ErrorResponse::new(ErrorCode::VoterChangeRefused, why);
        let cluster = m.core.cluster();
        let i = usize::from(change.store_index);
        if i >= self.store_count {
            return Err(refuse(format!(
                "store index {i} is not in the brokers' store list ({} stores): add its address to every broker's `stores` first",
                self.store_count
            )));
        }
        if let Some(offset) = m.core.pending_config() {
            return Err(ErrorResponse::new(
                ErrorCode::ChangeInProgress,
                format!("the voter-set change at offset {offset} is not stabilized yet; one change at a time"),
            ));
        }
        let slot = slot_of(i);
        let identity = StoreIdentity {
            store_id: change.store_id,
            incarnation: change.incarnation,
        };
        let named = format!(
            "store {i} ({:016x}/{:016x})",
            identity.store_id.0, identity.incarnation.0
        );
        let mut voters = cluster.voters();
        match change.action {
            VoterChange::Add => {
                match cluster.expected_identity(slot) {
                    Some(v) if v == identity => {
                        return Err(refuse(format!("{named} is already a voter")))
                    }
                    Some(v) => {
                        return Err(refuse(format!(
                            "store index {i} holds the voter {:016x}/{:016x}: remove it first (one store per change)",
                            v.store_id.0, v.incarnation.0
                        )))
                    }
                    None => {}
                }
                match m.store_answers.get(i).copied().flatten() {
                    None => {
                        return Err(refuse(format!(
                            "{named} has not answered this master (is it running and reachable?)"
                        )))
                    }
                    Some((answered, _)) if answered != identity => {
                        return Err(refuse(format!(
                            "the store at index {i} answers as {:016x}/{:016x}, not as {named}",
                            answered.store_id.0, answered.incarnation.0
                        )))
                    }
                    Some((_, false)) => {
                        return Err(refuse(format!(
                            "{named} was initialised as a learner (quire-node init --learner): it never grants a fence"
                        )))
                    }
                    Some((_, true)) => {}
                }
                if !self.slot_up(slot) {
                    return Err(refuse(format!("{named} is not connected")));
                }
                let held = m.core.slot_status(slot).and_then(|s| s.matched);
                let hwm = m.core.hwm();
                if held < hwm {
                    return Err(ErrorResponse::new(
                        ErrorCode::StoreCatchingUp,
                        format!(
                            "{named} holds the log through {}, the HWM is {}: it is still catching up as a learner",
                            held.map_or_else(|| "nothing".to_owned(), |o| o.to_string()),
                            hwm.map_or_else(|| "-".to_owned(), |o| o.to_string())
                        ),
                    ));
                }
                voters.push(Voter {
                    store_index: change.store_index,
                    store_id: identity.store_id,
                    incarnation: identity.incarnation,
                });
                voters.sort_by_key(|v| v.store_index);
            }
            VoterChange::Remove => {
                if cluster.expected_identity(slot) != Some(identity) {
                    return Err(refuse(format!("{named} is not a voter")));
                }
                voters.retain(|v| v.store_index != change.store_index);
                if voters.is_empty() {
                    return Err(refuse(format!("{named} is the last voter")));
                }
                // Reachable: connected now and acked as a voter within the election timeout
                // (etcd's strict reconfiguration check does the same).
                let recent = self.cfg.election_timeout_ms;
                let reachable = voters
                    .iter()
                    .filter(|v| {
                        let j = usize::from(v.store_index);
                        self.slot_up(slot_of(j))
                            && m.voted_at_ms
                                .get(j)
                                .copied()
                                .flatten()
                                .is_some_and(|t| self.now_ms.saturating_sub(t) < recent)
                    })
                    .count();
                let quorum = crate::core::quorum::majority(voters.len());
                if reachable < quorum {
                    return Err(refuse(format!(
                        "removing {named} leaves {} voters of which {reachable} are connected and acked recently; a quorum of them is {quorum}",
                        voters.len()
                    )));
                }
            }
        }
        Ok(voters)
    }

    /// A master's voter set changes when it proposes a change: this broker's copy follows.
    fn sync_master_cluster(&mut self) {
        let Role::Master(m) = &self.role else {
            return;
        };
        if m.core.cluster() != &self.cluster {
            self.cluster = m.core.cluster().clone();
            tracing::info!(
                voters = self.cluster.voter_count(),
                ack_quorum = self.cluster.ack_quorum,
                "the master counts in a new voter set (not stabilized yet)"
            );
            self.identities_dirty = true;
            self.persist_identities(None);
        }
    }

    /// Retries the blocked write requests in order while they fit (after the driver
    /// released a hold).
    pub fn retry_blocked(&mut self, now_ms: u64) {
        self.at(now_ms);
        let gate = self.write_gate();
        let Role::Master(m) = &mut self.role else {
            return;
        };
        let mut out = Vec::new();
        m.writes
            .retry_blocked(&mut m.core, &self.state, gate, &mut out);
        self.push_writes(out);
        self.sync_master_cluster();
    }

    /// Sends the proposals deferred to the end of a batch of inputs (call once the
    /// driver's queue of inputs is drained).
    pub fn flush(&mut self, now_ms: u64) {
        self.at(now_ms);
        let Role::Master(m) = &mut self.role else {
            return;
        };
        if !m.writes.take_needs_flush() {
            return;
        }
        let mut out = Vec::new();
        m.core.flush(&mut out);
        self.dispatch_master(out);
    }

    /// Steps down voluntarily if still master of `epoch` (graceful handoff): follow with
    /// the whole log. Every waiting write is answered `NotMaster` (the driver names the
    /// target in it). Returns whether it stepped down.
    ///
    /// # Panics
    /// If writes are pending: a master hands over only once its HWM covers all it accepted.
    pub fn hand_over(&mut self, epoch: Epoch, now_ms: u64) -> bool {
        self.at(now_ms);
        if self.master_epoch() != Some(epoch) {
            return false;
        }
        let Role::Master(m) = std::mem::replace(&mut self.role, Role::Switching) else {
            return false;
        };
        let MasterRun {
            core, mut writes, ..
        } = *m;
        let mut out = Vec::new();
        if self.cfg.mutations.handoff_acks_early {
            writes.on_stabilized(Offset(u64::MAX), &mut out);
        }
        assert!(
            writes.pending_len() == 0,
            "invariant: a master hands over only with nothing pending"
        );
        let local = core.into_local_log();
        self.role = Role::Follower(Box::new(self.new_follower(local, epoch)));
        writes.fail_all(None, &mut out);
        self.push_writes(out);
        self.refuse_parked_fetches();
        self.out.push(Command::LeftMaster {
            epoch,
            promised: epoch,
        });
        true
    }

    // ------------------------------------------------------------------ internals

    fn at(&mut self, now_ms: u64) {
        self.now_ms = self.now_ms.max(now_ms);
    }

    fn see_epoch(&mut self, e: Epoch) {
        self.highest_epoch_seen = self.highest_epoch_seen.max(e);
    }

    fn is_store(&self, slot: SlotId) -> bool {
        slot.index() < self.store_count
    }

    fn knows_identities(&self) -> bool {
        (0..self.store_count).any(|i| self.cluster.expected_identity(slot_of(i)).is_some())
    }

    fn write_gate(&self) -> Gate {
        if self.is_serving() && !self.is_handing_off() && !self.retention.holds_writes() {
            Gate::Open
        } else {
            Gate::Held
        }
    }

    fn push_writes(&mut self, out: Vec<WriteCommand>) {
        self.out.extend(out.into_iter().map(Command::Write));
    }

    fn follower_config(&self) -> FollowerConfig {
        let min = self.cfg.election_timeout_ms;
        FollowerConfig {
            election: ElectionConfig {
                election_timeout_ms_min: min,
                election_timeout_ms_jitter: min / 2,
                rank: ElectionConfig::rank_of(&self.cfg.brokers, self.cfg.me),
                me: self.cfg.me,
                rank_step_ms: min / 4,
            },
            retained_bytes_max: self.cfg.follower_retained_bytes_max,
        }
    }

    fn new_follower(&mut self, local: LocalLog, known_epoch: Epoch) -> FollowerCore {
        // A broker that is not master counts in the set of what it applied; a set named
        // above it (a master's change not stabilized) is read from the log a takeover
        // adopts (DESIGN.md "Membership changes", rule 3).
        let applied_set = self.state.voters().to_vec();
        self.learn_voters(&applied_set);
        self.seed = self
            .seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1);
        let now = self.now_ms;
        match FollowerCore::new(self.follower_config(), local, known_epoch, self.seed, now) {
            Ok(f) => f,
            Err(e) => {
                // Only a core bug gets here; start over from an empty log and state, which
                // the master's stream rebuilds.
                tracing::error!(error = %e, "cannot follow with this log: starting from an empty one");
                self.state = BrokerState::new();
                self.recent.clear();
                FollowerCore::new(
                    self.follower_config(),
                    LocalLog::empty(),
                    known_epoch,
                    self.seed,
                    now,
                )
                .expect("invariant: an empty local log is valid")
            }
        }
    }

    /// The check-quorum window: the election timeout in heartbeat ticks, rounded up.
    fn check_quorum_ticks(&self) -> u32 {
        let hb = self.cfg.heartbeat_ms.max(1);
        let ticks = self.cfg.election_timeout_ms.div_ceil(hb);
        u32::try_from(ticks).unwrap_or(u32::MAX).max(1)
    }

    /// Applies stabilized events to the broker state (any role) and learns voters from
    /// epoch-start events; `master` is this broker's epoch when it stabilized them.
    fn apply_events(&mut self, events: &[Event], master: Option<Epoch>) {
        let mut applied: Vec<Event> = Vec::with_capacity(events.len());
        let mut topics: BTreeSet<String> = BTreeSet::new();
        for e in events {
            let expected = self.state.applied().map_or(Offset::ZERO, Offset::next);
            let outcome = if e.offset == expected {
                self.state.apply(e)
            } else {
                match self.rebuild_at(e) {
                    Some(a) => {
                        self.retention_rebuilt(e.offset);
                        self.recent.clear();
                        a
                    }
                    None => continue,
                }
            };
            match outcome {
                Applied::Message { topic } => {
                    topics.insert(topic);
                }
                Applied::EpochStart { voters, .. } | Applied::Config { voters } => {
                    self.learn_voters(&voters);
                }
                _ => {}
            }
            self.retention_applied(e);
            self.recent.push(e.clone());
            applied.push(e.clone());
        }
        if !applied.is_empty() {
            self.out.push(Command::Applied {
                events: applied,
                master,
            });
        }
        self.wake_fetches(&topics);
    }

    /// The next event to apply is not the one after the state's last: the log now starts
    /// at a checkpoint (a slave sent the log from the trim point). Rebuilds the state from
    /// `event` if it is a checkpoint and returns what applying it did; otherwise the state
    /// has a gap until a later checkpoint, and `None`.
    fn rebuild_at(&mut self, event: &Event) -> Option<Applied> {
        let expected = self.state.applied().map_or(Offset::ZERO, Offset::next);
        if event.offset < expected {
            tracing::error!(offset = %event.offset, %expected, "an event below the applied offset was given to apply again; ignored");
            return None;
        }
        if let Some(parts) = &mut self.checkpoint_parts {
            match parts.push(event) {
                Ok(None) => return None,
                Ok(Some(state)) => {
                    let first = parts.first();
                    self.checkpoint_parts = None;
                    tracing::info!(checkpoint = %first, parts = event.offset.0 - first.0 + 1, trim_point = %state.trim_point(), "broker state rebuilt from a retention checkpoint written in parts");
                    self.state = state;
                    self.state_gap = false;
                    return Some(Applied::Config {
                        voters: self.state.voters().to_vec(),
                    });
                }
                Err(e) => {
                    tracing::warn!(checkpoint = %parts.first(), offset = %event.offset, error = %e, "a checkpoint in parts could not be gathered: the broker state waits for the next checkpoint");
                    self.checkpoint_parts = None;
                }
            }
        }
        if let Some(state) = BrokerState::from_checkpoint(event) {
            tracing::info!(checkpoint = %event.offset, trim_point = %state.trim_point(), "broker state rebuilt from a retention checkpoint");
            self.state = state;
            self.state_gap = false;
            return Some(Applied::Config {
                voters: self.state.voters().to_vec(),
            });
        }
        if let Some(parts) = CheckpointParts::start(event) {
            // The state is rebuilt once the last part is here.
            self.checkpoint_parts = Some(parts);
        } else if !self.state_gap {
            tracing::error!(offset = %event.offset, %expected, "the log skips events and this one is not a checkpoint: the broker state waits for the next checkpoint");
        }
        self.state_gap = true;
        None
    }

    /// Makes the voter set named by an applied epoch-start or `Config` event (or a
    /// checkpoint) the one in force here (DESIGN.md "Membership changes", rule 1; a master
    /// applies its own changes when it proposes them). An empty list (no identity known to
    /// the master that wrote it) changes nothing.
    fn learn_voters(&mut self, voters: &[Voter]) {
        if voters.is_empty() {
            return;
        }
        let before = self.cluster.clone();
        match self.cluster.set_voters(voters) {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(error = %e, "the log names a voter set this broker cannot use (is its store list older than the cluster's?); keeping the one it has");
                return;
            }
        }
        for i in 0..self.store_count {
            let slot = slot_of(i);
            let (was, now) = (
                before.expected_identity(slot),
                self.cluster.expected_identity(slot),
            );
            if was == now {
                continue;
            }
            if let (None, Some(identity), Role::Master(m)) = (was, now, &mut self.role) {
                let mut out = Vec::new();
                m.core
                    .handle(MasterInput::StoreIdentityKnown { slot, identity }, &mut out);
            }
            match now {
                Some(identity) => {
                    tracing::info!(%slot, store_id = identity.store_id.0, incarnation = identity.incarnation.0, "the store is a voter")
                }
                None => tracing::info!(%slot, "the store is no longer a voter"),
            }
        }
        self.identities_dirty = true;
        self.persist_identities(None);
    }

    /// Asks for the identities known in memory to be made durable (one write at a time; a
    /// change during a write is written after it).
    fn persist_identities(&mut self, bootstrap_epoch: Option<Epoch>) {
        if bootstrap_epoch.is_none() && (!self.identities_dirty || self.persisting_identities) {
            return;
        }
        self.identities_dirty = false;
        self.persisting_identities = true;
        let identities = (0..self.store_count)
            .map(|i| self.cluster.expected_identity(slot_of(i)))
            .collect();
        self.out.push(Command::PersistIdentities {
            identities,
            bootstrap_epoch,
        });
    }

    /// A broker that knows no voter asks every store for its tail before it fences
    /// anything: it bootstraps only if every store is an empty voter, and otherwise never
    /// raises a store's promised epoch (which would disturb a running cluster).
    fn probe_bootstrap(&mut self) {
        self.probe_generation += 1;
        let generation = self.probe_generation;
        self.bootstrap_probe = Some((generation, vec![None; self.store_count]));
        self.probe_started_ms = self.now_ms;
        for i in 0..self.store_count {
            self.out.push(Command::ReadTail {
                slot: slot_of(i),
                generation,
            });
        }
    }

    fn start_takeover(&mut self) {
        if self.state_gap {
            tracing::warn!(
                "not taking over: the broker state has a gap (waiting for a retention checkpoint)"
            );
            return;
        }
        let Role::Follower(f) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        let known_epoch = f.master_epoch();
        let highest = self.highest_epoch_seen.max(known_epoch);
        let local = f.into_local_log();
        let bootstrap = !self.knows_identities();
        let config = TakeoverConfig {
            broker: self.cfg.me,
            cluster: self.cluster.clone(),
            fetch_events_max: self.cfg.takeover_fetch_events_max,
        };
        let mut out = Vec::new();
        let fallback = local.clone();
        match TakeoverCore::start(config, self.durable_counter, highest, local, &mut out) {
            Ok(mut core) => {
                if self.cfg.mutations.adopt_longest {
                    core.set_mutation(TakeoverMutation::AdoptLongest);
                }
                let now = self.now_ms;
                tracing::info!(
                    epoch = %core.epoch(),
                    bootstrap,
                    silent_ms = self.last_master_contact_ms.map(|t| now.saturating_sub(t)),
                    "no master heard: taking over"
                );
                self.out.push(Command::TakingOver {
                    epoch: core.epoch(),
                    bootstrap,
                });
                self.role = Role::TakingOver(Box::new(TakeoverRun {
                    core,
                    deadline_ms: now.saturating_add(self.cfg.takeover_timeout_ms),
                    failover_from_ms: self.last_master_contact_ms.unwrap_or(now),
                    known_epoch,
                    bootstrap: bootstrap.then(|| vec![None; self.store_count]),
                    binding: false,
                }));
                self.dispatch_takeover(out);
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot start a takeover");
                self.role = Role::Follower(Box::new(self.new_follower(fallback, known_epoch)));
            }
        }
    }

    /// Gives a takeover up and follows again (the election timer starts over).
    fn abandon_takeover(&mut self, why: &str) {
        let Role::TakingOver(t) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        self.see_epoch(t.core.highest_seen());
        tracing::info!(epoch = %t.core.epoch(), why, "takeover abandoned: following again");
        self.out.push(Command::Abandoned {
            epoch: t.core.epoch(),
            why: why.to_owned(),
        });
        let known = t.known_epoch;
        let local = t.core.into_local_log();
        self.role = Role::Follower(Box::new(self.new_follower(local, known)));
    }

    fn dispatch_takeover(&mut self, out: Vec<TakeoverCommand>) {
        if let Role::TakingOver(t) = &mut self.role {
            self.mutated_steps += t.core.take_mutated_steps();
        }
        for c in out {
            if !matches!(self.role, Role::TakingOver(_)) {
                return;
            }
            match c {
                TakeoverCommand::PersistEpochCounter { counter, epoch } => {
                    tracing::debug!(counter, %epoch, "persisting the epoch counter");
                    self.out.push(Command::PersistEpochCounter { counter });
                }
                TakeoverCommand::SendFence { slot, epoch } => {
                    let expected = self.cluster.expected_identity(slot);
                    self.out.push(Command::SendFence {
                        slot,
                        epoch,
                        expected,
                    });
                }
                TakeoverCommand::Fetch {
                    slot,
                    epoch,
                    from,
                    through,
                } => self.out.push(Command::ReadForTakeover(TakeoverRead {
                    slot,
                    epoch,
                    from,
                    through,
                })),
                TakeoverCommand::BecomeMaster(adopted) => {
                    self.become_master(adopted);
                    return;
                }
                TakeoverCommand::StepBack { rival } => {
                    self.see_epoch(rival);
                    tracing::info!(%rival, "a higher epoch exists: stepping back");
                    self.abandon_takeover("a rival has a higher epoch");
                    return;
                }
                TakeoverCommand::Aborted { epoch, reason } => {
                    tracing::warn!(%epoch, ?reason, "takeover attempt aborted");
                    self.abandon_takeover(&format!("aborted: {reason:?}"));
                    return;
                }
            }
        }
    }

    fn finish_bootstrap(&mut self, epoch: Epoch, durable: bool) {
        let Role::TakingOver(t) = &mut self.role else {
            return;
        };
        if t.core.epoch() != epoch || t.bootstrap.is_none() {
            return;
        }
        if !durable {
            self.abandon_takeover("the store identities are not durable");
            return;
        }
        let grants = t.bootstrap.take().unwrap_or_default();
        let mut out = Vec::new();
        for (i, g) in grants.into_iter().enumerate() {
            let Some(g) = g else { continue };
            let slot = slot_of(i);
            let identity = StoreIdentity {
                store_id: g.store_id,
                incarnation: g.incarnation,
            };
            t.core.handle(
                TakeoverInput::StoreIdentityKnown { slot, identity },
                &mut out,
            );
            t.core.handle(
                TakeoverInput::FenceGranted {
                    slot,
                    epoch: g.epoch,
                    identity,
                    last: g.last,
                    tail_cut: g.tail_cut,
                },
                &mut out,
            );
        }
        self.dispatch_takeover(out);
    }

    fn become_master(&mut self, adopted: AdoptedLog) {
        let Role::TakingOver(t) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        let epoch = adopted.epoch;
        self.see_epoch(epoch);
        if let Some(named) = &adopted.voters {
            // Rule 1: the adopted log's set is in force for the new master.
            self.learn_voters(named);
        }
        let voters = self.cluster.voters();
        let payload = EventBody::EpochStart(EpochStartEvent {
            epoch,
            broker: self.cfg.me,
            voters,
        })
        .to_payload();
        let fallback = LocalLog {
            log: adopted.log.clone(),
            applied: adopted.applied,
        };
        let mut out = Vec::new();
        let core = payload.map_err(|e| e.to_string()).and_then(|payload| {
            MasterCore::new(
                MasterConfig {
                    cluster: self.cluster.clone(),
                    limits: self.cfg.limits,
                },
                adopted,
                payload,
                &mut out,
            )
            .map_err(|e| e.to_string())
        });
        match core {
            Ok(mut core) => {
                if self.cfg.check_quorum {
                    core.enable_check_quorum(self.check_quorum_ticks());
                }
                if self.cfg.mutations.hwm_before_epoch_start {
                    core.set_hwm_before_epoch_start();
                }
                if self.cfg.mutations.forget_dedup {
                    self.state.forget_producers();
                }
                tracing::info!(%epoch, log_end = %core.next_offset(), "became master; waiting for the epoch-start event to be stabilized");
                for (i, up) in self.slot_up.iter().enumerate() {
                    if !up {
                        core.handle(MasterInput::SlotDisconnected { slot: slot_of(i) }, &mut out);
                    }
                }
                self.out.push(Command::BecameMaster { epoch });
                self.role = Role::Master(Box::new(MasterRun {
                    core,
                    serving: false,
                    failover_from_ms: t.failover_from_ms,
                    writes: Writes::new(self.cfg.write_limits),
                    store_answers: vec![None; self.store_count],
                    voted_at_ms: vec![None; self.store_count],
                }));
                self.dispatch_master(out);
                self.replay_corrupt_reports();
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot lead the adopted log");
                self.role = Role::Follower(Box::new(self.new_follower(fallback, t.known_epoch)));
            }
        }
    }

    fn dispatch_master(&mut self, out: Vec<MasterCommand>) {
        for c in out {
            if !matches!(self.role, Role::Master(_)) {
                return;
            }
            match c {
                MasterCommand::Append(cmd) => self.out.push(Command::Append(cmd)),
                MasterCommand::Stabilized { through, events } => {
                    if let Role::Master(m) = &self.role {
                        if through < m.core.epoch_start() {
                            // Only the planted `hwm_before_epoch_start` stabilizes there.
                            self.mutated_steps += 1;
                        }
                    }
                    self.on_stabilized(through, &events);
                }
                MasterCommand::StepDown { promised } => self.leave_master(promised, None),
                MasterCommand::QuorumLost {
                    voters_heard,
                    ack_quorum,
                } => self.lose_quorum(voters_heard, ack_quorum),
            }
        }
        self.retention_barrier_check();
    }

    fn on_stabilized(&mut self, through: Offset, events: &[Event]) {
        let epoch = self.master_epoch();
        self.apply_events(events, epoch);
        let now = self.now_ms;
        let Role::Master(m) = &mut self.role else {
            return;
        };
        let mut out = Vec::new();
        m.writes.on_stabilized(through, &mut out);
        if !m.serving && m.core.hwm() >= Some(m.core.epoch_start()) {
            m.serving = true;
            let took = now.saturating_sub(m.failover_from_ms);
            tracing::info!(epoch = %m.core.epoch(), hwm = ?m.core.hwm(), took_ms = took, "master is serving");
            self.out.push(Command::Serving {
                epoch: m.core.epoch(),
                failover_ms: took,
            });
        }
        self.push_writes(out);
        self.retry_blocked(now);
        self.advance_handoff();
    }

    /// The check-quorum rule gave up ([`MasterCommand::QuorumLost`]): step down without a
    /// higher epoch, so the slaves stop hearing heartbeats and one that reaches a quorum of
    /// stores takes over. The writes that were waiting get `NoQuorum` (outcome unknown).
    fn lose_quorum(&mut self, voters_heard: usize, ack_quorum: usize) {
        let Some(own) = self.master_epoch() else {
            return;
        };
        tracing::warn!(
            epoch = %own,
            voters_heard,
            ack_quorum,
            window_ms = self.cfg.election_timeout_ms,
            "check-quorum: too few voting stores acked within the election timeout; stepping down so a slave that reaches them can take over; nothing more is acked"
        );
        let why = format!(
            "the master lost its quorum of stores ({voters_heard} voting stores acked within the election timeout, {ack_quorum} needed) and stepped down; the outcome is unknown (retry with the same producer id and sequence)"
        );
        self.leave_master(own, Some(why));
    }

    /// Leaves the master role for a follower that knows epoch `promised`. Waiting writes get
    /// `NoQuorum` with `no_quorum` as the message when given, `NotMaster` otherwise.
    fn leave_master(&mut self, promised: Epoch, no_quorum: Option<String>) {
        let Role::Master(m) = std::mem::replace(&mut self.role, Role::Switching) else {
            return;
        };
        self.see_epoch(promised);
        let epoch = m.core.epoch();
        if no_quorum.is_none() {
            tracing::warn!(%epoch, %promised, "fenced by a higher epoch: stepping down to slave; nothing more is acked");
        }
        let MasterRun { core, writes, .. } = *m;
        let local = core.into_local_log();
        self.role = Role::Follower(Box::new(self.new_follower(local, promised)));
        let mut out = Vec::new();
        writes.fail_all(no_quorum.as_deref(), &mut out);
        self.push_writes(out);
        self.refuse_parked_fetches();
        self.out.push(Command::LeftMaster { epoch, promised });
    }

    /// Fails the writes that waited past their deadline (see [`Writes::expire`]).
    fn expire_writes(&mut self) {
        let now = self.now_ms;
        let window = self.cfg.write_limits.produce_timeout_ms;
        let Role::Master(m) = &mut self.role else {
            return;
        };
        // A voter is reachable if it is connected and acked (heartbeats included) within
        // the produce timeout: a stopped store keeps its connection but acks nothing.
        let up_voters = (0..self.store_count)
            .filter(|&i| {
                self.slot_up[i] && m.voted_at_ms[i].is_some_and(|t| now.saturating_sub(t) < window)
            })
            .count();
        let mut out = Vec::new();
        m.writes
            .expire(now, up_voters, self.cluster.ack_quorum, &mut out);
        self.push_writes(out);
    }
}

/// The slot of store index `i`.
fn slot_of(i: usize) -> SlotId {
    SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX"))
}
