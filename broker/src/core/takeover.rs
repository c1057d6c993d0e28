//! A slave taking over as master: DESIGN.md "Failover" steps 2–3, handing step 4 to a new
//! [`super::master::MasterCore`].
//!
//! ```text
//!  start ──> PersistEpochCounter(c, e) ──(EpochPersisted c)──> SendFence(e) to every store
//!            grants for e from F voting stores with the expected identity
//!        ──> adopt the most up-to-date granted log: highest last epoch, then offset
//!        ──> Fetch the events this broker lacks from that store (bounded batches)
//!        ──> the fetched tail must end exactly at the granted (epoch, offset)
//!        ──> BecomeMaster(AdoptedLog)      (MasterCore::new appends the epoch-start event)
//!  any answer carrying an epoch above e ──> StepBack (a rival is master)
//!  a fetch that fails or does not end at the grant ──> Aborted; restart() tries e' > e
//! ```
//!
//! # Rules and why
//! - **Persist before fence.** The new epoch `e = counter << 16 | broker` takes
//!   `counter = max(durable counter, counter of the highest epoch seen) + 1`, and the core
//!   emits [`TakeoverCommand::PersistEpochCounter`] and sends no fence before the driver
//!   reports [`TakeoverInput::EpochPersisted`]: a broker that restarts and reuses an epoch
//!   can overwrite acked events (found by model check).
//! - **Only this takeover's grants count**, and only from store slots answering with the
//!   slot's expected identity: a store that answers "not a voter", or with an unexpected
//!   incarnation, has forgotten its promises and never counts (DESIGN.md "Store identity").
//! - **F + Qa > N**: the F granting stores include one of any Qa that stabilized an event,
//!   and Raft's up-to-date order (§5.4.1: last epoch, then last offset — *not* the longest
//!   log, found by model check) picks a log holding every stabilized event.
//! - **Tail-cut marks.** A grant that carries a tail-cut mark (the store's recovery cut a
//!   torn tail, which may have been an acked record with a flipped bit, and the store has
//!   not caught up with a later master since) may lack an event the store acked. The fence
//!   quorum is reached when F grants *without* a mark arrived, or when every store of the
//!   cluster granted (then a stabilized event is lost only if all of the Qa stores that
//!   acked it lost it: a torn write never hides an acked record). The log is adopted among
//!   every grant counted so far, marked or not (a cut log is still a log some master
//!   wrote). docs/protocol.md, "Tail-cut marks", gives the argument.
//! - **What to fetch.** Events at or below this broker's applied offset are stabilized, so
//!   the adopted log has them unchanged; the rest of the local log may diverge and is
//!   replaced by the adopted store's events `applied + 1 ..= granted offset` — unless the
//!   local log already holds the granted entry, in which case log matching says it holds
//!   the whole adopted log up to it and nothing is fetched.
//! - **Verify the tail.** The fetched events must be contiguous from the first requested
//!   offset, have epochs that never go down and never exceed the granted epoch, and end
//!   exactly at the granted `(epoch, offset)`; anything else aborts the attempt.

use quire_proto::{
    trim_part_index, BrokerId, Epoch, EventBody, EventKind, LogPosition, Offset, TailCut, Voter,
};

use super::event::Event;
use super::log::Log;
use super::{ClusterConfig, ConfigError, SlotId, SlotKind, StoreIdentity};

/// Default [`TakeoverConfig::fetch_events_max`].
pub const FETCH_EVENTS_MAX_DEFAULT: u32 = 4096;

/// Highest epoch counter [`quire_proto::Epoch::compose`] accepts (48 bits).
const EPOCH_COUNTER_MAX: u64 = (1 << 48) - 1;

/// Everything a [`TakeoverCore`] is configured with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TakeoverConfig {
    /// This broker: the low 16 bits of every epoch it takes.
    pub broker: BrokerId,
    /// Slots (only the store slots are fenced) and quorums.
    pub cluster: ClusterConfig,
    /// Most events asked for in one [`TakeoverCommand::Fetch`].
    pub fetch_events_max: u32,
}

/// The log a broker holds when it is not master: what a follower hands to a takeover, and
/// a stepped-down master to a follower.
///
/// Invariant (checked where it is consumed): `applied` is below `log.end()`, and every
/// event above `applied` is in memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LocalLog {
    /// The log: epochs of every offset and the recent events.
    pub log: Log,
    /// Highest offset applied to broker state; every event up to it is stabilized.
    /// `None`: nothing applied.
    pub applied: Option<Offset>,
}

impl LocalLog {
    /// An empty log, nothing applied (a broker that never followed anything).
    #[must_use]
    pub fn empty() -> LocalLog {
        LocalLog {
            log: Log::new(),
            applied: None,
        }
    }

    /// Checks the invariant on the type.
    ///
    /// # Errors
    /// [`ConfigError::BadHandover`] if `applied` is past the log or unapplied events are
    /// not in memory.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.applied.is_some_and(|a| a >= self.log.end()) {
            return Err(ConfigError::BadHandover {
                why: "applied offset past the log end",
            });
        }
        if self.applied.map_or(Offset::ZERO, Offset::next) < self.log.mem_start() {
            return Err(ConfigError::BadHandover {
                why: "events above the applied offset are not in memory",
            });
        }
        Ok(())
    }
}

/// The outcome of a successful takeover: the log to lead, for
/// [`super::master::MasterCore::new`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AdoptedLog {
    /// The epoch this broker now leads; above every epoch in `log`.
    pub epoch: Epoch,
    /// The adopted log: ends exactly at the most up-to-date granted `(epoch, offset)`
    /// (empty if every granting store was empty). Events above `applied` are in memory.
    pub log: Log,
    /// Highest offset this broker already applied (stabilized); the new master's HWM
    /// starts here.
    pub applied: Option<Offset>,
    /// The voter set the adopted log names above `applied` (its latest `Config` or
    /// epoch-start event there), or `None` if it names none there: then the set in force is
    /// the one the broker knew when it fenced. The new master counts in it (DESIGN.md
    /// "Membership changes", rule 1).
    pub voters: Option<Vec<Voter>>,
}

/// Why a store refused a fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceRefusal {
    /// The store already promised an epoch at or above the fence's (`promised` says which).
    Promised,
    /// The store lost its disk and rejoined as a learner: it never grants under its old
    /// identity (DESIGN.md "Store identity").
    NotVoter,
}

/// An input to [`TakeoverCore::handle`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeoverInput {
    /// The driver durably stored the epoch counter `counter` (answer to
    /// [`TakeoverCommand::PersistEpochCounter`]).
    EpochPersisted {
        /// The counter now durable.
        counter: u64,
    },
    /// A store granted the fence for `epoch`: it promised to refuse appends below it, and
    /// its log ends at `last`.
    FenceGranted {
        /// The store's slot.
        slot: SlotId,
        /// The fence's epoch.
        epoch: Epoch,
        /// The identity the store answered with.
        identity: StoreIdentity,
        /// The store's last `(epoch, offset)`, `None` if its log is empty.
        last: Option<LogPosition>,
        /// The store's tail-cut mark, if it carries one: the grant then counts toward F
        /// only once every store granted.
        tail_cut: Option<TailCut>,
    },
    /// A store refused the fence for `epoch`.
    FenceRefused {
        /// The store's slot.
        slot: SlotId,
        /// The fence's epoch.
        epoch: Epoch,
        /// The store's promised epoch (for [`FenceRefusal::NotVoter`], whatever the answer
        /// carried, `Epoch::ZERO` if nothing).
        promised: Epoch,
        /// Why.
        reason: FenceRefusal,
    },
    /// Events read from the adopted store in answer to [`TakeoverCommand::Fetch`].
    Fetched {
        /// The store's slot.
        slot: SlotId,
        /// The takeover epoch the fetch was issued under.
        epoch: Epoch,
        /// The events, in offset order.
        events: Vec<Event>,
    },
    /// The adopted store answered the fetch "trimmed": its log now starts at
    /// `first_offset`, above the offset asked for (retention deleted the events below).
    FetchTrimmed {
        /// The store's slot.
        slot: SlotId,
        /// The takeover epoch the fetch was issued under.
        epoch: Epoch,
        /// The first offset the store holds.
        first_offset: Offset,
    },
    /// The fetch failed (connection lost, read error, or the store refused).
    FetchFailed {
        /// The store's slot.
        slot: SlotId,
        /// The takeover epoch the fetch was issued under.
        epoch: Epoch,
        /// The store's promised epoch, if its answer carried one.
        promised: Option<Epoch>,
    },
    /// A (new) connection to `slot` is up: while fencing, a store that has not answered
    /// gets the fence again.
    SlotConnected {
        /// The slot.
        slot: SlotId,
    },
    /// Some other message showed a master or takeover of `epoch` exists.
    RivalSeen {
        /// The epoch seen.
        epoch: Epoch,
    },
    /// The broker's durable cluster configuration now names the voter identity of store
    /// `slot` (see [`ClusterConfig::learn_identity`]: an identity already known is never
    /// replaced). The bootstrap path: a broker that knows no identity fences with none
    /// expected, binds the identities of stores that all granted with an empty log, makes
    /// them durable, and only then feeds them here, each before its grant.
    StoreIdentityKnown {
        /// The store's slot.
        slot: SlotId,
        /// Its identity.
        identity: StoreIdentity,
    },
}

/// What the takeover core asks its driver to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TakeoverCommand {
    /// Durably store the broker's epoch counter `counter` (write temp, fsync, rename, fsync
    /// dir), then feed [`TakeoverInput::EpochPersisted`]. No fence goes out before.
    PersistEpochCounter {
        /// The counter to store.
        counter: u64,
        /// The epoch it makes (`counter << 16 | broker`).
        epoch: Epoch,
    },
    /// Send `Fence{epoch}` to the store at `slot`.
    SendFence {
        /// The store's slot.
        slot: SlotId,
        /// The epoch to fence with.
        epoch: Epoch,
    },
    /// Read events `from ..= through` from the store at `slot` (it may answer with a prefix;
    /// the core asks for the rest) and feed them as [`TakeoverInput::Fetched`].
    Fetch {
        /// The adopted store's slot.
        slot: SlotId,
        /// The takeover's epoch (echo it in the answer).
        epoch: Epoch,
        /// First offset wanted.
        from: Offset,
        /// Last offset wanted.
        through: Offset,
    },
    /// The takeover succeeded: start a [`super::master::MasterCore`] with this log.
    BecomeMaster(AdoptedLog),
    /// A higher epoch exists: go back to being a slave. [`TakeoverCore::into_local_log`]
    /// gives the log back.
    StepBack {
        /// The higher epoch seen.
        rival: Epoch,
    },
    /// This attempt failed; [`TakeoverCore::restart`] tries again with a higher epoch.
    Aborted {
        /// The attempt's epoch.
        epoch: Epoch,
        /// Why.
        reason: AbortReason,
    },
}

/// Why a takeover attempt was given up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortReason {
    /// The fetched events did not end exactly at the granted `(epoch, offset)`, went past
    /// it, or had epochs out of order.
    FetchedTailMismatch {
        /// The granted last entry.
        granted: LogPosition,
        /// The event that broke the rule (or the last one fetched).
        got: LogPosition,
    },
    /// A fetched batch did not continue at the offset asked for.
    FetchNotContiguous {
        /// The offset expected.
        expected: Offset,
        /// The offset received.
        got: Offset,
    },
    /// The store answered a fetch with no event.
    FetchEmpty {
        /// The offset asked for.
        expected: Offset,
    },
    /// The fetch failed.
    FetchFailed {
        /// The store's slot.
        slot: SlotId,
    },
    /// The adopted store's log starts above this broker's log and holds no checkpoint
    /// (Trim event) from its first offset through the granted end to restart from.
    NoCheckpoint {
        /// The store's first offset.
        first_offset: Offset,
    },
    /// The most up-to-date granted log ends below an offset this broker already applied: a
    /// quorum lost stabilized data (more failures than the configuration tolerates) or a
    /// store lied. Retrying may meet a better quorum.
    GrantBelowApplied {
        /// The adopted last entry.
        granted: Option<LogPosition>,
        /// This broker's applied offset.
        applied: Offset,
    },
    /// The 48-bit epoch counter is used up; no retry can succeed.
    EpochsExhausted,
    /// The adopted log names a voter set this broker cannot use (a store index outside its
    /// store list): its store list is older than the cluster's.
    VoterSetUnusable {
        /// The index named.
        store_index: u16,
    },
}

/// A takeover rule switched off on purpose. **Test-only**: the deterministic simulation
/// (quire-sim) turns one on to show that its checker catches the data loss the rule prevents.
/// Production code never sets it; the default, [`TakeoverMutation::None`], keeps every rule.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TakeoverMutation {
    /// Every rule on.
    #[default]
    None,
    /// Adopt the longest granted log (highest last offset, then epoch), ignoring Raft's
    /// up-to-date order — the rule whose absence loses stabilized events (found by model
    /// check, `mut-adopt-longest`).
    AdoptLongest,
}

/// Counters of ignored answers, for observability and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TakeoverStats {
    /// Grants counted toward F.
    pub grants_counted: u64,
    /// Grants counted that carried a tail-cut mark (they reach F only with every store).
    pub grants_tail_cut: u64,
    /// Grants for an epoch other than the current attempt's.
    pub grants_other_epoch: u64,
    /// Grants from a slot that is unknown, a slave, or answered with another identity.
    pub grants_not_voting: u64,
    /// Repeated grants from a slot already counted.
    pub grants_duplicate: u64,
    /// Grants whose last entry is of the takeover's epoch or later (epoch reuse or a lying
    /// store): never counted.
    pub grants_inconsistent: u64,
    /// Refusals with reason "not a voter".
    pub refusals_not_voter: u64,
    /// Fetch answers for another epoch, slot or phase.
    pub fetches_stale: u64,
    /// Fetches answered "trimmed" that restarted the local log at a checkpoint.
    pub fetches_rebased: u64,
    /// Adoptions put off because the adopted log names a voter set whose majority the
    /// grants held do not contain (DESIGN.md "Membership changes", rule 3).
    pub adoptions_deferred: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    PersistingEpoch,
    Fencing,
    Fetching(Fetching),
    Done,
    SteppedBack,
    Aborted,
}

/// A fetch of the adopted log in progress.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fetching {
    /// The adopted store.
    source: SlotId,
    /// Its granted last entry.
    target: LogPosition,
    /// The next offset to fetch.
    next: Offset,
    /// `Some((first offset, last skipped))`: the adopted store's log starts there, above
    /// this broker's (retention deleted the rest); the local log restarts at the first
    /// checkpoint fetched. `last skipped`: the last event fetched before it.
    rebase: Option<(Offset, Option<LogPosition>)>,
}

/// One store's grant of the current attempt's fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grant {
    /// The store's last entry.
    last: Option<LogPosition>,
    /// Whether the grant carried a tail-cut mark.
    tail_cut: bool,
}

/// The fence quorum rule with tail-cut marks: `unmarked` grants without a mark and
/// `granted` grants in all from a cluster of `stores` stores, fence quorum `fence_quorum`.
/// Reached when F grants carry no mark, or when every store granted.
#[must_use]
pub fn fence_quorum_reached(
    unmarked: usize,
    granted: usize,
    stores: usize,
    fence_quorum: usize,
) -> bool {
    assert!(unmarked <= granted, "unmarked grants are grants");
    assert!(granted <= stores, "grants never exceed the store count");
    unmarked >= fence_quorum || granted == stores
}

/// The takeover state machine. See the module docs for the rules.
#[derive(Clone, Debug)]
pub struct TakeoverCore {
    config: TakeoverConfig,
    local: LocalLog,
    /// The counter known durable (from the driver, or confirmed by `EpochPersisted`).
    durable_counter: u64,
    counter: u64,
    epoch: Epoch,
    highest_seen: Epoch,
    phase: Phase,
    /// Per slot: the store's grant of this attempt's fence and the identity it answered
    /// with, once it granted.
    grants: Vec<Option<(StoreIdentity, Grant)>>,
    /// Voter sets named by logs this takeover adopted, besides the one it fenced with: the
    /// grants must hold a majority of each (rule 3).
    named_sets: Vec<ClusterConfig>,
    stats: TakeoverStats,
    mutation: TakeoverMutation,
    /// Adoptions the mutation changed (a log other than the one Raft's rule picks).
    mutated_steps: u64,
}

impl TakeoverCore {
    /// Starts a takeover: picks `e` above `durable_counter` and `highest_seen` and emits
    /// [`TakeoverCommand::PersistEpochCounter`] (or [`TakeoverCommand::Aborted`] with
    /// [`AbortReason::EpochsExhausted`]).
    ///
    /// `durable_counter` is the broker's epoch counter as last persisted (0 if never);
    /// `highest_seen` the highest epoch it has seen anywhere; `local` its log (from
    /// [`super::follower::FollowerCore::local_log`]).
    ///
    /// # Errors
    /// [`ConfigError`] for an invalid cluster configuration, `fetch_events_max == 0`, or a
    /// `local` log that breaks its invariant.
    pub fn start(
        config: TakeoverConfig,
        durable_counter: u64,
        highest_seen: Epoch,
        local: LocalLog,
        out: &mut Vec<TakeoverCommand>,
    ) -> Result<TakeoverCore, ConfigError> {
        config.cluster.validate()?;
        if config.fetch_events_max == 0 {
            return Err(ConfigError::BadLimit {
                name: "fetch_events_max",
                why: "must be at least 1",
            });
        }
        local.validate()?;
        // Every epoch in the local log was seen too: the new epoch must be above all of them.
        let highest_seen = highest_seen.max(local.log.last().map_or(Epoch::ZERO, |l| l.epoch));
        let mut core = TakeoverCore {
            grants: vec![None; config.cluster.slots.len()],
            named_sets: Vec::new(),
            config,
            local,
            durable_counter,
            counter: durable_counter,
            epoch: Epoch::ZERO,
            highest_seen,
            phase: Phase::Aborted,
            stats: TakeoverStats::default(),
            mutation: TakeoverMutation::None,
            mutated_steps: 0,
        };
        core.begin_attempt(out);
        Ok(core)
    }

    /// Starts a new attempt with an epoch above every one used or seen so far. Does nothing
    /// once the takeover succeeded or stepped back.
    pub fn restart(&mut self, out: &mut Vec<TakeoverCommand>) {
        if matches!(self.phase, Phase::Done | Phase::SteppedBack) {
            return;
        }
        self.begin_attempt(out);
    }

    /// Feeds one input; appends the resulting commands to `out`.
    pub fn handle(&mut self, input: TakeoverInput, out: &mut Vec<TakeoverCommand>) {
        if matches!(self.phase, Phase::Done | Phase::SteppedBack) {
            return;
        }
        match input {
            TakeoverInput::EpochPersisted { counter } => self.on_persisted(counter, out),
            TakeoverInput::FenceGranted {
                slot,
                epoch,
                identity,
                last,
                tail_cut,
            } => {
                if let Some(l) = last {
                    self.see(l.epoch, out);
                }
                let grant = Grant {
                    last,
                    tail_cut: tail_cut.is_some(),
                };
                self.on_grant(slot, epoch, identity, grant, out);
            }
            TakeoverInput::FenceRefused {
                slot: _,
                epoch: _,
                promised,
                reason,
            } => {
                if reason == FenceRefusal::NotVoter {
                    self.stats.refusals_not_voter += 1;
                }
                // promised == our epoch: a repeated fence of ours, not a rival.
                self.see(promised, out);
            }
            TakeoverInput::Fetched {
                slot,
                epoch,
                events,
            } => self.on_fetched(slot, epoch, events, out),
            TakeoverInput::FetchTrimmed {
                slot,
                epoch,
                first_offset,
            } => self.on_fetch_trimmed(slot, epoch, first_offset, out),
            TakeoverInput::FetchFailed {
                slot,
                epoch,
                promised,
            } => {
                if let Some(p) = promised {
                    self.see(p, out);
                }
                match self.phase {
                    Phase::Fetching(Fetching { source, .. })
                        if source == slot && epoch == self.epoch =>
                    {
                        self.abort(AbortReason::FetchFailed { slot }, out);
                    }
                    _ => self.stats.fetches_stale += 1,
                }
            }
            TakeoverInput::SlotConnected { slot } => {
                let pending = self.phase == Phase::Fencing
                    && self
                        .config
                        .cluster
                        .kind(slot)
                        .is_some_and(SlotKind::is_store)
                    && self.grants[slot.index()].is_none();
                if pending {
                    out.push(TakeoverCommand::SendFence {
                        slot,
                        epoch: self.epoch,
                    });
                }
            }
            TakeoverInput::RivalSeen { epoch } => self.see(epoch, out),
            TakeoverInput::StoreIdentityKnown { slot, identity } => {
                self.config.cluster.learn_identity(slot, identity);
            }
        }
    }

    /// The cluster configuration in force (with the identities learned since the start).
    #[must_use]
    pub fn cluster(&self) -> &ClusterConfig {
        &self.config.cluster
    }

    /// The current attempt's epoch.
    #[must_use]
    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    /// The highest epoch seen in any answer (including the current attempt's).
    #[must_use]
    pub fn highest_seen(&self) -> Epoch {
        self.highest_seen.max(self.epoch)
    }

    /// The epoch counter known durable: persist nothing lower next time.
    #[must_use]
    pub fn durable_counter(&self) -> u64 {
        self.durable_counter
    }

    /// Number of distinct voting stores that granted this attempt's fence.
    #[must_use]
    pub fn grant_count(&self) -> usize {
        self.granted_in(&self.config.cluster).0
    }

    /// Number of distinct voting stores that granted this attempt's fence without a
    /// tail-cut mark.
    #[must_use]
    pub fn unmarked_grant_count(&self) -> usize {
        self.granted_in(&self.config.cluster).1
    }

    /// Whether the current attempt is waiting for something (not done, stepped back or
    /// aborted).
    #[must_use]
    pub fn is_running(&self) -> bool {
        matches!(
            self.phase,
            Phase::PersistingEpoch | Phase::Fencing | Phase::Fetching(_)
        )
    }

    /// Counters.
    #[must_use]
    pub fn stats(&self) -> &TakeoverStats {
        &self.stats
    }

    /// **Test-only**: switches a rule off (see [`TakeoverMutation`]). Set it right after
    /// [`TakeoverCore::start`], before any grant is fed.
    #[doc(hidden)]
    pub fn set_mutation(&mut self, mutation: TakeoverMutation) {
        self.mutation = mutation;
    }

    /// **Test-only**: adoptions the mutation changed since the last call (it picked a log
    /// whose last position differs from the one Raft's rule picks); then 0 until the next.
    #[doc(hidden)]
    pub fn take_mutated_steps(&mut self) -> u64 {
        std::mem::take(&mut self.mutated_steps)
    }

    /// Gives the broker's log back (after [`TakeoverCommand::StepBack`] or an abort). Its
    /// applied prefix is unchanged; above it the log may hold part of the adopted store's
    /// log, which a master's stream corrects. After [`TakeoverCommand::BecomeMaster`] the
    /// log has moved into the [`AdoptedLog`] and this returns an empty one.
    #[must_use]
    pub fn into_local_log(self) -> LocalLog {
        self.local
    }

    // ----------------------------------------------------------------

    /// Grants held from voters of `set` with the identity it names: (all, without a
    /// tail-cut mark).
    fn granted_in(&self, set: &ClusterConfig) -> (usize, usize) {
        let mut counts = (0, 0);
        for (i, g) in self.grants.iter().enumerate() {
            let Some((identity, grant)) = g else { continue };
            let slot = SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX"));
            if set.expected_identity(slot) == Some(*identity) {
                counts.0 += 1;
                counts.1 += usize::from(!grant.tail_cut);
            }
        }
        counts
    }

    /// Whether a grant from `slot` answering as `identity` counts: its identity is the
    /// slot's in the set fenced with or in a set an adopted log named.
    fn counts(&self, slot: SlotId, identity: StoreIdentity) -> bool {
        std::iter::once(&self.config.cluster)
            .chain(&self.named_sets)
            .any(|set| set.expected_identity(slot) == Some(identity))
    }

    /// Rule 3 and the tail-cut rule: the grants held reach the fence quorum of the set
    /// fenced with and a majority of every set an adopted log named.
    fn quorum_reached(&self) -> bool {
        std::iter::once(&self.config.cluster)
            .chain(&self.named_sets)
            .all(|set| {
                let (granted, unmarked) = self.granted_in(set);
                fence_quorum_reached(unmarked, granted, set.voter_count(), set.fence_quorum)
            })
    }

    fn begin_attempt(&mut self, out: &mut Vec<TakeoverCommand>) {
        let base = self
            .durable_counter
            .max(self.counter)
            .max(self.highest_seen().counter());
        let Some(counter) = base.checked_add(1).filter(|&c| c <= EPOCH_COUNTER_MAX) else {
            self.phase = Phase::Aborted;
            out.push(TakeoverCommand::Aborted {
                epoch: self.epoch,
                reason: AbortReason::EpochsExhausted,
            });
            return;
        };
        let epoch = Epoch::compose(counter, self.config.broker);
        assert!(epoch > self.epoch, "epochs of one broker never go down");
        assert!(
            epoch > self.highest_seen,
            "a takeover's epoch is above every epoch seen"
        );
        self.counter = counter;
        self.epoch = epoch;
        self.grants.iter_mut().for_each(|g| *g = None);
        self.phase = Phase::PersistingEpoch;
        out.push(TakeoverCommand::PersistEpochCounter { counter, epoch });
    }

    /// Notes an epoch seen in an answer; above ours, a rival exists: step back.
    fn see(&mut self, epoch: Epoch, out: &mut Vec<TakeoverCommand>) {
        self.highest_seen = self.highest_seen.max(epoch);
        if epoch > self.epoch && !matches!(self.phase, Phase::Done | Phase::SteppedBack) {
            self.phase = Phase::SteppedBack;
            out.push(TakeoverCommand::StepBack { rival: epoch });
        }
    }

    fn on_persisted(&mut self, counter: u64, out: &mut Vec<TakeoverCommand>) {
        self.durable_counter = self.durable_counter.max(counter);
        if self.phase != Phase::PersistingEpoch || counter != self.counter {
            return;
        }
        assert!(
            self.durable_counter >= self.counter,
            "fence only after the epoch is durable"
        );
        self.phase = Phase::Fencing;
        for (i, kind) in self.config.cluster.slots.iter().enumerate() {
            if kind.is_store() {
                let slot = SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX"));
                out.push(TakeoverCommand::SendFence {
                    slot,
                    epoch: self.epoch,
                });
            }
        }
    }

    fn on_grant(
        &mut self,
        slot: SlotId,
        epoch: Epoch,
        identity: StoreIdentity,
        grant: Grant,
        out: &mut Vec<TakeoverCommand>,
    ) {
        let last = grant.last;
        if !matches!(self.phase, Phase::Fencing | Phase::Fetching(_)) {
            // Late grants (after adopting, or for an attempt not yet fencing) change nothing.
            self.stats.grants_other_epoch += u64::from(epoch != self.epoch);
            return;
        }
        if epoch != self.epoch {
            self.stats.grants_other_epoch += 1;
            return;
        }
        if self.config.cluster.expected_identity(slot) != Some(identity) {
            // Kept: a set an adopted log names may count it.
            self.stats.grants_not_voting += 1;
        }
        if !self
            .config
            .cluster
            .kind(slot)
            .is_some_and(SlotKind::is_store)
        {
            return;
        }
        if last.is_some_and(|l| l.epoch >= self.epoch) {
            // A store that granted `e` holds an entry of epoch `e` or later: some broker
            // reused an epoch (or the store lies). Such a log cannot be led in `e`; above
            // `e` it has already made this takeover step back.
            self.stats.grants_inconsistent += 1;
            return;
        }
        let g = &mut self.grants[slot.index()];
        if g.is_some_and(|(held, _)| held == identity) {
            self.stats.grants_duplicate += 1;
            return;
        }
        *g = Some((identity, grant));
        if self.counts(slot, identity) {
            self.stats.grants_counted += 1;
            self.stats.grants_tail_cut += u64::from(grant.tail_cut);
        }
        // A grant that arrives while fetching is kept: rule 3 may need it if the adopted
        // log names a newer voter set.
        if self.phase == Phase::Fencing && self.quorum_reached() {
            self.adopt(out);
        }
    }

    /// DESIGN.md "Failover" step 3: adopt the most up-to-date granted log.
    fn adopt(&mut self, out: &mut Vec<TakeoverCommand>) {
        let mut best: Option<(SlotId, Option<LogPosition>)> = None;
        for (i, g) in self.grants.iter().enumerate() {
            let Some((identity, Grant { last, .. })) = *g else {
                continue;
            };
            let slot = SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX"));
            if !self.counts(slot, identity) {
                continue;
            }
            let key = last.map(|l| self.adopt_key(l));
            if best.is_none_or(|(_, b)| key > b.map(|l| self.adopt_key(l))) {
                best = Some((
                    SlotId(u16::try_from(i).expect("invariant: slots <= SLOTS_MAX")),
                    last,
                ));
            }
        }
        let (source, target) = best.expect("invariant: adopt runs with F >= 1 grants");
        if self.mutation != TakeoverMutation::None {
            let raft = self
                .grants
                .iter()
                .flatten()
                .map(|(_, g)| g.last)
                .max_by_key(|l| l.map(LogPosition::up_to_date_key));
            if raft != Some(target) {
                self.mutated_steps += 1;
            }
        }
        let applied = self.local.applied;
        let Some(target) = target else {
            // Every granting store is empty: nothing was ever stabilized.
            if let Some(applied) = applied {
                self.abort(
                    AbortReason::GrantBelowApplied {
                        granted: None,
                        applied,
                    },
                    out,
                );
                return;
            }
            self.local.log.truncate_from(Offset::ZERO);
            self.become_master(out);
            return;
        };
        if let Some(a) = applied.filter(|&a| a > target.offset) {
            self.abort(
                AbortReason::GrantBelowApplied {
                    granted: Some(target),
                    applied: a,
                },
                out,
            );
            return;
        }
        if self.local.log.contains(target) {
            // Log matching: the local log equals the adopted one up to the granted entry.
            self.local.log.truncate_from(target.offset.next());
            self.become_master(out);
            return;
        }
        let from = applied.map_or(Offset::ZERO, Offset::next);
        if from > target.offset {
            // applied == target.offset but with another epoch: stabilized data differs.
            let got = self.local.log.position(target.offset).unwrap_or(target);
            self.abort(
                AbortReason::FetchedTailMismatch {
                    granted: target,
                    got,
                },
                out,
            );
            return;
        }
        self.local.log.truncate_from(from);
        self.phase = Phase::Fetching(Fetching {
            source,
            target,
            next: from,
            rebase: None,
        });
        self.request_fetch(out);
    }

    /// The fetch in progress if an answer from `slot` under `epoch` is for it; otherwise
    /// the answer is stale (counted) and `None`.
    fn current_fetch(&mut self, slot: SlotId, epoch: Epoch) -> Option<Fetching> {
        match self.phase {
            Phase::Fetching(f) if slot == f.source && epoch == self.epoch => Some(f),
            _ => {
                self.stats.fetches_stale += 1;
                None
            }
        }
    }

    /// The adopted store deleted the events from the offset fetched (retention): fetch from
    /// its first offset and restart the local log at the first checkpoint there.
    ///
    /// Why that is safe (docs/protocol.md "Retention"): a store deletes only whole segments
    /// below `min(before, stable)` of a Trim event it knows is stabilized, where `before` is
    /// an earlier checkpoint's offset. So a checkpoint sits between the store's first
    /// offset and `before`, and the first one from the first offset on is stabilized, with
    /// everything below it: the same on every log that holds it, which is what a log
    /// starting there assumes ([`Log::starting_after`]). Its predecessor's epoch is its
    /// own: a master proposes a Trim only once it serves, after its epoch-start event, so
    /// the entries between the two are all of its epoch; a fetched predecessor of another
    /// epoch gives the attempt up. The new master then sends `prev = (that epoch, c - 1)`
    /// and a store holding `c - 1` checks it as usual. Model-checked in
    /// `model/quire_mc_retention.py` (`retention-fix-k3-known`, docs/testing.md): assuming
    /// instead that every store matches below the new master's start lets a lagging store
    /// keep a stale entry at a stabilized offset (`scenarios/r1-hidden-divergence.txt`).
    fn on_fetch_trimmed(
        &mut self,
        slot: SlotId,
        epoch: Epoch,
        first_offset: Offset,
        out: &mut Vec<TakeoverCommand>,
    ) {
        let Some(Fetching {
            source,
            target,
            next,
            rebase,
        }) = self.current_fetch(slot, epoch)
        else {
            return;
        };
        if rebase.is_some() || first_offset <= next || first_offset > target.offset {
            // Not what a trim of the adopted log looks like: give the attempt up.
            self.abort(AbortReason::FetchEmpty { expected: next }, out);
            return;
        }
        self.stats.fetches_rebased += 1;
        self.phase = Phase::Fetching(Fetching {
            source,
            target,
            next: first_offset,
            rebase: Some((first_offset, None)),
        });
        self.request_fetch(out);
    }

    /// The order `adopt` picks the most up-to-date log by: Raft's (last epoch, then last
    /// offset), unless a test switched the rule off.
    fn adopt_key(&self, last: LogPosition) -> (u64, u64) {
        let (epoch, offset) = last.up_to_date_key();
        match self.mutation {
            TakeoverMutation::None => (epoch.0, offset.0),
            TakeoverMutation::AdoptLongest => (offset.0, epoch.0),
        }
    }

    fn request_fetch(&mut self, out: &mut Vec<TakeoverCommand>) {
        let Phase::Fetching(Fetching {
            source,
            target,
            next,
            ..
        }) = self.phase
        else {
            return;
        };
        let through = Offset(
            target.offset.0.min(
                next.0
                    .saturating_add(u64::from(self.config.fetch_events_max) - 1),
            ),
        );
        out.push(TakeoverCommand::Fetch {
            slot: source,
            epoch: self.epoch,
            from: next,
            through,
        });
    }

    fn on_fetched(
        &mut self,
        slot: SlotId,
        epoch: Epoch,
        events: Vec<Event>,
        out: &mut Vec<TakeoverCommand>,
    ) {
        let Some(Fetching {
            source,
            target,
            mut next,
            mut rebase,
        }) = self.current_fetch(slot, epoch)
        else {
            return;
        };
        if events.is_empty() {
            self.abort(AbortReason::FetchEmpty { expected: next }, out);
            return;
        }
        for ev in events {
            if ev.offset != next {
                self.abort(
                    AbortReason::FetchNotContiguous {
                        expected: next,
                        got: ev.offset,
                    },
                    out,
                );
                return;
            }
            let below = if rebase.is_some() {
                Epoch::ZERO
            } else {
                self.local.log.last().map_or(Epoch::ZERO, |l| l.epoch)
            };
            if ev.offset > target.offset || ev.epoch > target.epoch || ev.epoch < below {
                let got = ev.position();
                self.abort(
                    AbortReason::FetchedTailMismatch {
                        granted: target,
                        got,
                    },
                    out,
                );
                return;
            }
            next = next.next();
            if let Some((first_offset, skipped)) = rebase {
                // A later part of a checkpoint written in parts is no place to start: the
                // state could not be rebuilt before the next checkpoint.
                let starts_checkpoint = ev.kind == EventKind::Trim
                    && trim_part_index(&ev.payload).is_none_or(|index| index == 0);
                if !starts_checkpoint {
                    // Below the first checkpoint: not kept (see on_fetch_trimmed).
                    rebase = Some((first_offset, Some(ev.position())));
                    continue;
                }
                // The first checkpoint: the log restarts after its predecessor, which is
                // stabilized and of the checkpoint's own epoch; everything up to it counts
                // as applied (the engine rebuilds its state from the checkpoint).
                let prev = LogPosition {
                    epoch: ev.epoch,
                    offset: Offset(ev.offset.0 - 1),
                };
                if skipped.is_some_and(|p| p != prev) {
                    // Not a checkpoint a serving master proposed: do not start there.
                    self.abort(
                        AbortReason::FetchedTailMismatch {
                            granted: target,
                            got: skipped.unwrap_or(prev),
                        },
                        out,
                    );
                    return;
                }
                self.local.log = Log::starting_after(prev);
                self.local.applied = Some(prev.offset);
                rebase = None;
            }
            self.local.log.append(ev);
        }
        if next <= target.offset {
            self.phase = Phase::Fetching(Fetching {
                source,
                target,
                next,
                rebase,
            });
            self.request_fetch(out);
            return;
        }
        if let Some((first_offset, _)) = rebase {
            self.abort(AbortReason::NoCheckpoint { first_offset }, out);
            return;
        }
        let got = self
            .local
            .log
            .last()
            .expect("invariant: at least one event was appended");
        if got != target {
            self.abort(
                AbortReason::FetchedTailMismatch {
                    granted: target,
                    got,
                },
                out,
            );
            return;
        }
        self.become_master(out);
    }

    fn abort(&mut self, reason: AbortReason, out: &mut Vec<TakeoverCommand>) {
        self.phase = Phase::Aborted;
        out.push(TakeoverCommand::Aborted {
            epoch: self.epoch,
            reason,
        });
    }

    fn become_master(&mut self, out: &mut Vec<TakeoverCommand>) {
        assert!(
            self.local.log.last().is_none_or(|l| l.epoch < self.epoch),
            "the adopted log is older than the takeover's epoch"
        );
        // Rule 3: the adopted log may name a newer voter set than the one fenced with; the
        // grants must hold a majority of it too, or more grants are awaited (the same
        // epoch), and the log is adopted again among all grants held.
        let voters = self.adopted_voters();
        if let Some(voters) = &voters {
            let mut named = self.config.cluster.clone();
            if let Err(e) = named.set_voters(voters) {
                let store_index = match e {
                    ConfigError::NotAStoreSlot { store_index } => store_index,
                    _ => voters.first().map_or(0, |v| v.store_index),
                };
                self.abort(AbortReason::VoterSetUnusable { store_index }, out);
                return;
            }
            if named.voters() != self.config.cluster.voters()
                && !self.named_sets.iter().any(|s| s.voters() == named.voters())
            {
                self.named_sets.push(named);
                if !self.quorum_reached() {
                    self.stats.adoptions_deferred += 1;
                    self.phase = Phase::Fencing;
                    return;
                }
            }
        }
        self.phase = Phase::Done;
        let log = std::mem::take(&mut self.local.log);
        out.push(TakeoverCommand::BecomeMaster(AdoptedLog {
            epoch: self.epoch,
            log,
            applied: self.local.applied,
            voters,
        }));
    }

    /// The voters named by the adopted log's latest `Config` or epoch-start event above
    /// `applied` (in memory), if any.
    fn adopted_voters(&self) -> Option<Vec<Voter>> {
        let from = self.local.applied.map_or(Offset::ZERO, Offset::next);
        let mut voters = None;
        for ev in self.local.log.iter_from(from) {
            if !matches!(ev.kind, EventKind::Config | EventKind::EpochStart) {
                continue;
            }
            match EventBody::decode(ev.kind, &ev.payload) {
                Ok(EventBody::Config(c)) => voters = Some(c.voters),
                Ok(EventBody::EpochStart(e)) if !e.voters.is_empty() => voters = Some(e.voters),
                _ => {}
            }
        }
        voters
    }
}

#[cfg(test)]
#[path = "takeover_tests.rs"]
mod tests;
