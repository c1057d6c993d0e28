//! Test helpers shared by the core's unit and property tests: a store that follows
//! DESIGN.md's append rules exactly (log matching, truncation of a divergent suffix,
//! `through = prev.offset + count`), minus durability.

use bytes::Bytes;
use quire_proto::{Epoch, Incarnation, LogPosition, Offset, StoreId};

use super::event::Event;
use super::log::Log;
use super::master::{AppendCommand, AppendEvents, MasterInput};
use super::{ClusterConfig, RejectReason, SlotId, SlotKind, StoreIdentity};

/// Identity of the store at slot `i` (incarnation 1).
pub(crate) fn ident(i: u64) -> StoreIdentity {
    StoreIdentity {
        store_id: StoreId(i),
        incarnation: Incarnation(1),
    }
}

/// N store slots with known identities and majority quorums.
pub(crate) fn stores(n: u64) -> ClusterConfig {
    ClusterConfig::with_majorities((0..n).map(|i| SlotKind::voter(Some(ident(i)))).collect())
}

/// An event with a payload of `len` bytes.
pub(crate) fn event(epoch: u64, offset: u64, len: usize) -> Event {
    Event {
        epoch: Epoch(epoch),
        offset: Offset(offset),
        kind: quire_proto::EventKind::Message,
        payload: Bytes::from(vec![7u8; len]).into(),
    }
}

/// A store's log (epochs by offset) and promised epoch.
#[derive(Clone, Debug)]
pub(crate) struct StoreSim {
    pub(crate) log: Vec<Epoch>,
    pub(crate) promised: Epoch,
    pub(crate) identity: StoreIdentity,
    pub(crate) voter: bool,
}

impl StoreSim {
    pub(crate) fn new(identity: StoreIdentity, epochs: &[u64]) -> StoreSim {
        StoreSim {
            log: epochs.iter().map(|&e| Epoch(e)).collect(),
            promised: Epoch::ZERO,
            identity,
            voter: true,
        }
    }

    pub(crate) fn last(&self) -> Option<LogPosition> {
        let o = self.log.len().checked_sub(1)?;
        Some(LogPosition {
            epoch: self.log[o],
            offset: Offset(o as u64),
        })
    }

    /// Applies DESIGN.md's acceptance rule and returns the store's answer.
    pub(crate) fn answer(
        &mut self,
        slot: SlotId,
        cmd: &AppendCommand,
        master_log: &Log,
    ) -> MasterInput {
        let reject = |s: &StoreSim, reason| MasterInput::Rejected {
            slot,
            append: cmd.append,
            promised: s.promised,
            last: s.last(),
            reason,
        };
        if cmd.epoch < self.promised {
            return reject(self, RejectReason::StaleEpoch);
        }
        if let Some(p) = cmd.prev {
            if self.log.get(p.offset.0 as usize) != Some(&p.epoch) {
                return reject(self, RejectReason::LogMismatch);
            }
        }
        let epochs: Vec<Epoch> = match &cmd.events {
            AppendEvents::InMemory(evs) => evs.iter().map(|e| e.epoch).collect(),
            AppendEvents::FromStore { .. } => (cmd.first.0..cmd.first.0 + cmd.count)
                .map(|o| {
                    master_log
                        .epoch_at(Offset(o))
                        .expect("master knows every epoch")
                })
                .collect(),
        };
        for (i, e) in epochs.into_iter().enumerate() {
            let o = cmd.first.0 as usize + i;
            if o < self.log.len() && self.log[o] != e {
                self.log.truncate(o);
            }
            if o >= self.log.len() {
                self.log.push(e);
            }
        }
        self.promised = self.promised.max(cmd.epoch);
        MasterInput::Persisted {
            slot,
            append: cmd.append,
            epoch: cmd.epoch,
            through: cmd.through(),
            identity: self.identity,
            voter: self.voter,
        }
    }
}
