//! The broker's replication logic as pure state machines: events in, commands out.
//!
//! Nothing in this module does I/O, reads a clock, spawns a task or owns a socket. Each core
//! is a plain value: the driver (the tokio broker server, or the seeded simulation in
//! quire-sim) feeds it inputs — a producer's message, a store's answer, a connection coming
//! up or going down, a timer tick carrying the time it read — and the core appends the
//! commands the driver must carry out to a caller-owned `Vec`. The same inputs in the same
//! order always give the same commands (no hash-map iteration order, no clock, no global
//! random source), so a simulation run is reproducible from its seed.
//!
//! ```text
//!                 driver (server / simulation)           core
//!   producer ----> propose(kind, payload) ---------------> MasterCore
//!   store/slave -> Persisted / Rejected / SlaveHas ------> MasterCore
//!   timer -------> HeartbeatTick ------------------------> MasterCore
//!   network <----- Append{slot, epoch, prev, events, hwm} <-
//!   producers <--- Stabilized{through, events} <-----------   (ack, apply, deliver)
//!   role <-------- StepDown{promised} <---------------------
//! ```
//!
//! The cores (the rules they implement are DESIGN.md's "Replication protocol", "Failover"
//! and "Store identity", checked by `shared/model/quire_mc.py`):
//! - [`master::MasterCore`]: the master's replication — next offset, per-store persisted
//!   offsets, the HWM (Qa distinct voting stores under the master's own epoch, at or after
//!   its epoch-start event), log matching per store with fast backup, pipelining and
//!   backpressure, bounded memory.
//! - [`takeover::TakeoverCore`]: a slave becoming master — persist the epoch counter,
//!   fence, count grants from F voting stores, adopt the most up-to-date log, fetch and
//!   verify its tail, then hand an [`takeover::AdoptedLog`] to a new `MasterCore`.
//! - [`follower::FollowerCore`]: a slave following the master's stream — log matching,
//!   the HWM it learns, what it applies, and the election timer that starts a takeover.
//!
//! Shared pieces: [`event::Event`] (one log entry; payload as [`bytes::Bytes`], never
//! copied), [`log::Log`] (the epochs of the whole log plus an in-memory suffix of events),
//! [`quorum`] (quorum math) and the cluster description below.
//!
//! What this module does not own: wire encoding (quire-proto), durability (quire-node and
//! quire-wal), broker state (topics, cursors), timers and connections (the driver).

pub mod event;
pub mod follower;
pub mod log;
pub mod master;
pub mod quorum;
pub mod takeover;

#[cfg(test)]
mod master_prop;
#[cfg(test)]
mod testkit;

use std::fmt;

use quire_proto::{BrokerId, Incarnation, StoreId, Voter};
use thiserror::Error;

pub use event::Event;
pub use follower::{
    ElectionConfig, FollowerCommand, FollowerConfig, FollowerCore, FollowerInput, FollowerStats,
};
pub use log::Log;
pub use master::{
    AppendCommand, AppendEvents, ConfigChangeError, MasterCommand, MasterConfig, MasterCore,
    MasterInput, MasterStats, ProposeError, ReplicationLimits, SlotLink, SlotStatus,
};
pub use takeover::{
    AbortReason, AdoptedLog, FenceRefusal, LocalLog, TakeoverCommand, TakeoverConfig, TakeoverCore,
    TakeoverInput, TakeoverStats,
};

/// Most slots (stores plus slave brokers) one cluster configuration may name. A bound, not a
/// tuning knob: quorum counting scans all slots on every ack.
pub const SLOTS_MAX: usize = 64;

/// Index of one replication target in [`ClusterConfig::slots`]: a store or a slave broker.
///
/// Slot ids are positions in a fixed list, assigned once by the cluster configuration; the
/// network layer maps each to a connection. An id at or past `slots.len()` is "an unknown
/// store": every input naming it is ignored (and counted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SlotId(pub u16);

impl SlotId {
    /// The slot's position in [`ClusterConfig::slots`].
    #[must_use]
    pub fn index(self) -> usize {
        usize::from(self.0)
    }
}

impl fmt::Display for SlotId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "slot{}", self.0)
    }
}

/// Identifier the master gives each append it sends, unique for the life of one
/// [`master::MasterCore`] and increasing in send order (across all slots).
///
/// The network layer carries it as (or maps it to) the request id, and hands it back with
/// the store's or slave's answer, so the core knows which append a rejection refers to and
/// never backs up twice for one mismatch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AppendId(pub u64);

/// The identity a store directory was created with (`quire-node init`), DESIGN.md "Store
/// identity". A store counts as a voter only while it answers with exactly this identity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreIdentity {
    /// The store's id, fixed for the life of its directory.
    pub store_id: StoreId,
    /// The directory's incarnation: a wiped and re-created directory has a new one and has
    /// forgotten its promises, so it never votes again under the old identity.
    pub incarnation: Incarnation,
}

/// What one slot of the cluster is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotKind {
    /// An event store (`quire-node`). While `voting`, it counts toward N, the ack quorum
    /// and the fence quorum; every store slot receives the log.
    Store {
        /// The voter identity expected at this slot, or `None` while it is not known yet: a
        /// store whose identity the broker does not know never counts toward a quorum (it
        /// still receives the log, as a learner). Set it from the durable cluster
        /// configuration or the log's voter set only — never from the store's own claim.
        identity: Option<StoreIdentity>,
        /// Whether the slot is in the voter set in force (DESIGN.md "Membership changes"):
        /// `false` for a slot a `Config` event left out. Such a slot is a learner: it is
        /// outside N and its acks and grants never count.
        voting: bool,
    },
    /// A slave broker following the master's stream. Never counts toward any quorum.
    Slave {
        /// The slave's broker id.
        broker: BrokerId,
    },
}

impl SlotKind {
    /// Whether this slot is an event store.
    #[must_use]
    pub fn is_store(self) -> bool {
        matches!(self, SlotKind::Store { .. })
    }

    /// Whether this slot is a store in the voter set.
    #[must_use]
    pub fn is_voter(self) -> bool {
        matches!(self, SlotKind::Store { voting: true, .. })
    }

    /// The store slots for the identities a broker has bound (its cluster file), by store
    /// index: before any is bound, every slot is a voter of unknown identity (a new
    /// cluster); once some are, a slot without one is outside the voter set (a voter set
    /// is always learned whole, from an epoch-start or `Config` event or a bootstrap).
    #[must_use]
    pub fn stores_from_bound(bound: &[Option<StoreIdentity>]) -> Vec<SlotKind> {
        let any = bound.iter().any(Option::is_some);
        bound
            .iter()
            .map(|&identity| SlotKind::Store {
                identity,
                voting: identity.is_some() || !any,
            })
            .collect()
    }

    /// A voting store slot, identity known or not.
    #[must_use]
    pub fn voter(identity: Option<StoreIdentity>) -> SlotKind {
        SlotKind::Store {
            identity,
            voting: true,
        }
    }
}

/// The fixed list of replication targets and the two quorums (DESIGN.md "Vocabulary",
/// "Failover" step 3).
///
/// Invariants checked by [`ClusterConfig::validate`], with N = the number of store slots:
/// `1 <= N`, `1 <= ack_quorum <= N`, `1 <= fence_quorum <= N`, and
/// `fence_quorum + ack_quorum > N` so every fence quorum intersects every ack quorum (the
/// reason a takeover cannot miss a stabilized event).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Every store and slave broker, indexed by [`SlotId`]. At most [`SLOTS_MAX`].
    pub slots: Vec<SlotKind>,
    /// Qa: distinct voting stores that must persist an event under the master's epoch
    /// before it is stabilized. Default: majority of N.
    pub ack_quorum: usize,
    /// F: distinct voting stores whose fence grants a takeover needs before it adopts a
    /// log. Default: majority of N.
    pub fence_quorum: usize,
}

impl ClusterConfig {
    /// A configuration with majority quorums (Qa = F = N/2 + 1).
    #[must_use]
    pub fn with_majorities(slots: Vec<SlotKind>) -> ClusterConfig {
        let n = slots.iter().filter(|k| k.is_voter()).count();
        ClusterConfig {
            slots,
            ack_quorum: quorum::majority(n),
            fence_quorum: quorum::majority(n),
        }
    }

    /// The number of store slots, voting or not.
    #[must_use]
    pub fn store_count(&self) -> usize {
        self.slots.iter().filter(|k| k.is_store()).count()
    }

    /// N: the number of store slots in the voter set.
    #[must_use]
    pub fn voter_count(&self) -> usize {
        self.slots.iter().filter(|k| k.is_voter()).count()
    }

    /// The voter set in force, as a `Config` or epoch-start event names it: every voting
    /// slot whose identity is known, by store index.
    #[must_use]
    pub fn voters(&self) -> Vec<Voter> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(i, k)| match *k {
                SlotKind::Store {
                    identity: Some(id),
                    voting: true,
                } => Some(Voter {
                    store_index: u16::try_from(i).ok()?,
                    store_id: id.store_id,
                    incarnation: id.incarnation,
                }),
                _ => None,
            })
            .collect()
    }

    /// Makes `voters` the voter set in force (DESIGN.md "Membership changes", rule 1): the
    /// named slots vote with the named identities, every other store slot is a learner.
    /// Quorums follow the new N: majorities stay majorities (Qa = F = N/2 + 1); flexible
    /// quorums keep Qa (at most N) and take F = N + 1 - Qa.
    ///
    /// Returns `true` if anything changed.
    ///
    /// # Errors
    /// [`ConfigError::NoStores`] for an empty set, [`ConfigError::NotAStoreSlot`] for a
    /// voter whose index is not a store slot here, [`ConfigError::DuplicateStore`] for a
    /// store id named twice; nothing changes then.
    pub fn set_voters(&mut self, voters: &[Voter]) -> Result<bool, ConfigError> {
        if voters.is_empty() {
            return Err(ConfigError::NoStores);
        }
        let mut next = self.slots.clone();
        for k in &mut next {
            if let SlotKind::Store { voting, .. } = k {
                *voting = false;
            }
        }
        for v in voters {
            match next.get_mut(usize::from(v.store_index)) {
                Some(SlotKind::Store { identity, voting }) if !*voting => {
                    *identity = Some(StoreIdentity {
                        store_id: v.store_id,
                        incarnation: v.incarnation,
                    });
                    *voting = true;
                }
                _ => {
                    return Err(ConfigError::NotAStoreSlot {
                        store_index: v.store_index,
                    })
                }
            }
        }
        let mut candidate = ClusterConfig {
            slots: next,
            ack_quorum: self.ack_quorum,
            fence_quorum: self.fence_quorum,
        };
        let (old_n, n) = (self.voter_count(), candidate.voter_count());
        let majority = quorum::majority(old_n);
        if self.ack_quorum == majority && self.fence_quorum == majority {
            candidate.ack_quorum = quorum::majority(n);
            candidate.fence_quorum = quorum::majority(n);
        } else {
            candidate.ack_quorum = self.ack_quorum.min(n);
            candidate.fence_quorum = n + 1 - candidate.ack_quorum;
        }
        candidate.validate()?;
        let changed = candidate != *self;
        *self = candidate;
        Ok(changed)
    }

    /// The kind of `slot`, or `None` for an unknown slot.
    #[must_use]
    pub fn kind(&self, slot: SlotId) -> Option<SlotKind> {
        self.slots.get(slot.index()).copied()
    }

    /// The voter identity expected at a store slot: `None` for an unknown slot, a slave
    /// slot, or a store whose identity is not known yet.
    #[must_use]
    pub fn expected_identity(&self, slot: SlotId) -> Option<StoreIdentity> {
        match self.kind(slot)? {
            SlotKind::Store {
                identity,
                voting: true,
            } => identity,
            SlotKind::Store { voting: false, .. } | SlotKind::Slave { .. } => None,
        }
    }

    /// Records the voter identity of a store slot whose identity was unknown.
    ///
    /// Returns `true` if it was recorded; `false` (and nothing changes) if the slot is
    /// unknown, a slave, or already has an identity — an identity is never replaced: a new
    /// incarnation at a slot is a membership change, not an update.
    pub fn learn_identity(&mut self, slot: SlotId, identity: StoreIdentity) -> bool {
        match self.slots.get_mut(slot.index()) {
            Some(SlotKind::Store {
                identity: known @ None,
                voting: true,
            }) => {
                *known = Some(identity);
                true
            }
            _ => false,
        }
    }

    /// Checks the invariants listed on the type.
    ///
    /// # Errors
    /// [`ConfigError`] naming the first invariant that does not hold.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.slots.len() > SLOTS_MAX {
            return Err(ConfigError::TooManySlots {
                slots: self.slots.len(),
                max: SLOTS_MAX,
            });
        }
        let stores = self.voter_count();
        if stores == 0 {
            return Err(ConfigError::NoStores);
        }
        for (name, q) in [
            ("ack_quorum", self.ack_quorum),
            ("fence_quorum", self.fence_quorum),
        ] {
            if q == 0 || q > stores {
                return Err(ConfigError::QuorumOutOfRange {
                    name,
                    quorum: q,
                    stores,
                });
            }
        }
        if self.ack_quorum + self.fence_quorum <= stores {
            return Err(ConfigError::QuorumsDoNotIntersect {
                ack_quorum: self.ack_quorum,
                fence_quorum: self.fence_quorum,
                stores,
            });
        }
        let mut ids: Vec<StoreId> = self
            .slots
            .iter()
            .filter_map(|k| match k {
                SlotKind::Store {
                    identity: Some(id),
                    voting: true,
                } => Some(id.store_id),
                _ => None,
            })
            .collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(ConfigError::DuplicateStore { store_id: w[0] });
        }
        Ok(())
    }
}

/// Why a store or a slave refused an append: the wire's type, used by the cores as is.
pub use quire_proto::RejectReason;

/// A configuration or hand-over value a core refuses to start with.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum ConfigError {
    /// More slots than [`SLOTS_MAX`].
    #[error("{slots} slots configured, at most {max} are supported")]
    TooManySlots {
        /// Slots configured.
        slots: usize,
        /// [`SLOTS_MAX`].
        max: usize,
    },
    /// No store slot at all.
    #[error("the cluster configuration names no store")]
    NoStores,
    /// A quorum of 0 or larger than N.
    #[error("{name} = {quorum} is outside 1..={stores}")]
    QuorumOutOfRange {
        /// Which quorum.
        name: &'static str,
        /// Its value.
        quorum: usize,
        /// N.
        stores: usize,
    },
    /// `fence_quorum + ack_quorum <= N`: a takeover could miss a stabilized event.
    #[error(
        "fence_quorum {fence_quorum} + ack_quorum {ack_quorum} must exceed the {stores} stores"
    )]
    QuorumsDoNotIntersect {
        /// Qa.
        ack_quorum: usize,
        /// F.
        fence_quorum: usize,
        /// N.
        stores: usize,
    },
    /// Two slots expect the same store id.
    #[error("store id {store_id:?} appears in two slots")]
    DuplicateStore {
        /// The repeated id.
        store_id: StoreId,
    },
    /// A voter set names an index that is not a store slot of this broker's store list (or
    /// names one slot twice).
    #[error("the voter set names store index {store_index}, which is not a store slot here (or is named twice)")]
    NotAStoreSlot {
        /// The index named.
        store_index: u16,
    },
    /// A bound in [`ReplicationLimits`] or another core setting is zero or inconsistent.
    #[error("setting {name} is invalid: {why}")]
    BadLimit {
        /// The setting's name.
        name: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The log handed to a new master cannot be led in the given epoch.
    #[error("cannot lead this log: {why}")]
    BadHandover {
        /// What is wrong with it.
        why: &'static str,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(id: u64) -> SlotKind {
        SlotKind::voter(Some(StoreIdentity {
            store_id: StoreId(id),
            incarnation: Incarnation(1),
        }))
    }

    #[test]
    fn majorities_and_validation() {
        let c = ClusterConfig::with_majorities(vec![store(1), store(2), store(3)]);
        assert_eq!((c.ack_quorum, c.fence_quorum), (2, 2));
        assert_eq!(c.validate(), Ok(()));
        let c5 = ClusterConfig::with_majorities((1..=5).map(store).collect());
        assert_eq!((c5.ack_quorum, c5.fence_quorum), (3, 3));

        let mut bad = c.clone();
        bad.fence_quorum = 1;
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::QuorumsDoNotIntersect { .. })
        ));
        let mut bad = c.clone();
        bad.ack_quorum = 4;
        assert!(matches!(
            bad.validate(),
            Err(ConfigError::QuorumOutOfRange { .. })
        ));
        let dup = ClusterConfig::with_majorities(vec![store(1), store(1), store(3)]);
        assert_eq!(
            dup.validate(),
            Err(ConfigError::DuplicateStore {
                store_id: StoreId(1)
            })
        );
        let none = ClusterConfig::with_majorities(vec![SlotKind::Slave {
            broker: BrokerId(1),
        }]);
        assert_eq!(none.validate(), Err(ConfigError::NoStores));
    }

    #[test]
    fn identity_is_learned_once_and_never_replaced() {
        let mut c = ClusterConfig::with_majorities(vec![SlotKind::voter(None), store(2)]);
        let id = StoreIdentity {
            store_id: StoreId(9),
            incarnation: Incarnation(4),
        };
        assert!(c.learn_identity(SlotId(0), id));
        assert_eq!(c.expected_identity(SlotId(0)), Some(id));
        let other = StoreIdentity {
            store_id: StoreId(9),
            incarnation: Incarnation(5),
        };
        assert!(!c.learn_identity(SlotId(0), other));
        assert_eq!(c.expected_identity(SlotId(0)), Some(id));
        assert!(!c.learn_identity(SlotId(7), other));
    }

    fn voter(index: u16, id: u64, incarnation: u64) -> Voter {
        Voter {
            store_index: index,
            store_id: StoreId(id),
            incarnation: Incarnation(incarnation),
        }
    }

    #[test]
    fn a_voter_set_sets_n_the_quorums_and_who_counts() {
        let mut c = ClusterConfig::with_majorities(vec![store(1), store(2), store(3)]);
        assert_eq!(c.voters().len(), 3);
        // Remove index 2: N = 2, majorities 2.
        assert_eq!(c.set_voters(&[voter(0, 1, 1), voter(1, 2, 1)]), Ok(true));
        assert_eq!((c.voter_count(), c.ack_quorum, c.fence_quorum), (2, 2, 2));
        assert_eq!(c.expected_identity(SlotId(2)), None);
        assert_eq!(c.store_count(), 3);
        // A removed slot learns nothing by itself.
        let new = StoreIdentity {
            store_id: StoreId(9),
            incarnation: Incarnation(2),
        };
        assert!(!c.learn_identity(SlotId(2), new));
        // Add it back under a new identity: N = 3.
        let back = [voter(0, 1, 1), voter(1, 2, 1), voter(2, 9, 2)];
        assert_eq!(c.set_voters(&back), Ok(true));
        assert_eq!(c.expected_identity(SlotId(2)), Some(new));
        assert_eq!((c.ack_quorum, c.fence_quorum), (2, 2));
        assert_eq!(c.set_voters(&back), Ok(false));
        assert_eq!(c.voters(), back.to_vec());
        // Bad sets change nothing.
        let before = c.clone();
        assert_eq!(c.set_voters(&[]), Err(ConfigError::NoStores));
        assert_eq!(
            c.set_voters(&[voter(5, 1, 1)]),
            Err(ConfigError::NotAStoreSlot { store_index: 5 })
        );
        assert_eq!(
            c.set_voters(&[voter(0, 1, 1), voter(0, 1, 1)]),
            Err(ConfigError::NotAStoreSlot { store_index: 0 })
        );
        assert_eq!(
            c.set_voters(&[voter(0, 1, 1), voter(1, 1, 1)]),
            Err(ConfigError::DuplicateStore {
                store_id: StoreId(1)
            })
        );
        assert_eq!(c, before);
    }

    #[test]
    fn flexible_quorums_keep_qa_and_intersect() {
        let mut c = ClusterConfig::with_majorities(vec![store(1), store(2), store(3)]);
        c.ack_quorum = 3;
        c.fence_quorum = 1;
        assert_eq!(c.set_voters(&[voter(0, 1, 1), voter(1, 2, 1)]), Ok(true));
        assert_eq!((c.ack_quorum, c.fence_quorum), (2, 1));
    }
}
