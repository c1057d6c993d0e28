//! Damaged store records in the broker engine: reading around them and repairing them from
//! another store (docs/protocol.md, "Damaged records").
//!
//! ```text
//!   read_corrupt(slot, offset)     a store answered a read (or a fence) `Corrupt`
//!     master ─────────────────────> MasterInput::ReadCorrupt: no read source for that range;
//!                                   Command::RepairRecord{slot, offset, source}: a store
//!                                   that acked the offset in this epoch
//!     not master ─────────────────> remembered (replayed when this broker becomes master);
//!                                   Command::RepairRecord from another connected store,
//!                                   a different one at each attempt
//!   repair_done(slot, offset, r)   the store's RepairResponse (or the failure)
//!     good (repaired, already) ───> forgotten (MasterInput::Repaired); the store's next
//!                                   damaged record, if it named one, is repaired next
//!     anything else ──────────────> retried at a later tick
//!   tick ─────────────────────────> every damaged record known and not being repaired
//!                                   gets a RepairRecord, if a source is connected
//! ```
//!
//! Any broker repairs, not only the master: a store that knows a damaged record grants no
//! fence, so with two such stores of three no takeover could succeed, and no master would
//! come to repair them. A broker taking over learns of them from their fence refusals and
//! repairs them itself; its next attempt then has their grants.
//!
//! The engine never rewrites anything itself: the store checks that the copy is the same
//! entry (same epoch at that offset, same size) before it writes, so a wrong source can
//! waste a repair but never damage a store.

use quire_proto::{Offset, RepairResponse};

use super::{Command, Engine, Role};
use crate::core::{MasterInput, SlotId};

/// Damaged records reported while this broker was not master, remembered at most.
pub const CORRUPT_REPORTS_MAX: usize = 64;

/// The engine's repair bookkeeping.
#[derive(Debug, Default)]
pub(super) struct Repairs {
    /// `(slot, offset)` with a [`Command::RepairRecord`] out.
    in_flight: Vec<(SlotId, Offset)>,
    /// `(slot, offset)` reported `Corrupt` while this broker was not master (a fence
    /// refused during a takeover); repaired from any store, and fed to the master core
    /// once this broker is master.
    reported: Vec<(SlotId, Offset)>,
    /// Turns the source a non-master picks (a different store at each attempt).
    rotation: usize,
    /// `(slot, offset)` for which no store could give a good copy at the last attempt
    /// (said once, as a warning, until a source appears).
    unsourced: Vec<(SlotId, Offset)>,
    /// `(slot, offset)` whose store refused a copy (not its entry, or no longer held):
    /// said once, as a warning, since a refusal that repeats leaves the store a non-voter.
    refused: Vec<(SlotId, Offset)>,
}

impl Engine {
    /// Store `slot` answered a read or a fence with `Corrupt` for its record at `offset`:
    /// while this broker is master, that range is read from other stores
    /// ([`MasterInput::ReadCorrupt`]) and the record is repaired from one of them
    /// ([`Command::RepairRecord`]); otherwise it is remembered until this broker is master.
    pub fn read_corrupt(&mut self, slot: SlotId, offset: Offset, now_ms: u64) {
        self.at(now_ms);
        tracing::warn!(%slot, %offset, "a store's copy of a record is damaged: reading that range from the other stores");
        match &mut self.role {
            Role::Master(m) => {
                let mut out = Vec::new();
                m.core
                    .handle(MasterInput::ReadCorrupt { slot, offset }, &mut out);
                self.dispatch_master(out);
                self.start_repair(slot, offset);
            }
            _ => {
                let r = &mut self.repairs.reported;
                if !r.contains(&(slot, offset)) && r.len() < CORRUPT_REPORTS_MAX {
                    r.push((slot, offset));
                }
                self.start_repair(slot, offset);
            }
        }
    }

    /// Store `slot`'s ack named `offset` as the lowest record it knows damaged (every ack
    /// of such a store does): news only the first time, then as
    /// [`Engine::read_corrupt`]. So damage that another reader found (an audit, a slave)
    /// reaches the master.
    pub fn ack_names_corrupt(&mut self, slot: SlotId, offset: Offset, now_ms: u64) {
        let known = self.repairs.in_flight.contains(&(slot, offset))
            || match self.master_core() {
                Some(core) => core.slot_corrupt(slot).contains(&offset),
                None => self.repairs.reported.contains(&(slot, offset)),
            };
        if !known {
            self.read_corrupt(slot, offset, now_ms);
        }
    }

    /// The answer to the [`Command::RepairRecord`] for `(slot, offset)`: the store's
    /// response, or why none came.
    pub fn repair_done(
        &mut self,
        slot: SlotId,
        offset: Offset,
        result: Result<RepairResponse, String>,
        now_ms: u64,
    ) {
        self.at(now_ms);
        self.repairs.in_flight.retain(|r| *r != (slot, offset));
        let good = result.as_ref().is_ok_and(|r| r.outcome.is_good());
        if good {
            self.repairs.reported.retain(|r| *r != (slot, offset));
            self.repairs.refused.retain(|r| *r != (slot, offset));
        } else if let Ok(r) = &result {
            let refused = &mut self.repairs.refused;
            if !refused.contains(&(slot, offset)) && refused.len() < CORRUPT_REPORTS_MAX {
                refused.push((slot, offset));
                tracing::warn!(%slot, %offset, outcome = ?r.outcome, "a store refused the copy offered to repair its damaged record (not its entry, or no longer held); retried, and the store grants no fence meanwhile");
            }
        }
        let Role::Master(m) = &mut self.role else {
            match result {
                Ok(r) if good => {
                    tracing::info!(%slot, %offset, outcome = ?r.outcome, "a store's damaged record is good again");
                    if let Some(next) = r.next_corrupt.filter(|&n| n != offset) {
                        self.read_corrupt(slot, next, now_ms);
                    }
                }
                Ok(r) => {
                    tracing::debug!(%slot, %offset, outcome = ?r.outcome, "a repair was not applied; retried from another store")
                }
                Err(e) => {
                    tracing::warn!(%slot, %offset, error = %e, "a repair failed; retried later")
                }
            }
            return;
        };
        match result {
            Ok(r) if r.outcome.is_good() => {
                tracing::info!(%slot, %offset, outcome = ?r.outcome, "a store's damaged record is good again");
                let mut out = Vec::new();
                m.core
                    .handle(MasterInput::Repaired { slot, offset }, &mut out);
                self.dispatch_master(out);
                if let Some(next) = r.next_corrupt.filter(|&n| n != offset) {
                    self.read_corrupt(slot, next, now_ms);
                }
            }
            Ok(r) => {
                tracing::debug!(%slot, %offset, outcome = ?r.outcome, "a repair was not applied; retried later");
            }
            Err(e) => {
                tracing::warn!(%slot, %offset, error = %e, "a repair failed; retried later");
            }
        }
    }

    /// Starts a repair of every damaged record known (to the master core, or reported
    /// while not master) that has none out (each tick: a repair refused or failed is
    /// tried again).
    pub(super) fn sweep_repairs(&mut self) {
        let known: Vec<(SlotId, Offset)> = match self.master_core() {
            Some(core) => (0..self.store_count)
                .map(super::slot_of)
                .flat_map(|s| core.slot_corrupt(s).iter().map(move |&o| (s, o)))
                .collect(),
            None => self.repairs.reported.clone(),
        };
        for (slot, offset) in known {
            self.start_repair(slot, offset);
        }
    }

    /// Feeds the damaged records reported before this broker became master to its core.
    pub(super) fn replay_corrupt_reports(&mut self) {
        let now = self.now_ms;
        for (slot, offset) in std::mem::take(&mut self.repairs.reported) {
            self.read_corrupt(slot, offset, now);
        }
    }

    /// Sends one [`Command::RepairRecord`] for `(slot, offset)` unless one is out or no
    /// store can give a good copy now.
    fn start_repair(&mut self, slot: SlotId, offset: Offset) {
        if self.repairs.in_flight.contains(&(slot, offset)) {
            return;
        }
        let source = match self.master_core() {
            Some(core) => core.repair_source(slot, offset),
            None => {
                // Any other connected store: the store being repaired writes the copy only
                // if it is the same entry (model/quire_mc_damage.py: repair from any
                // same-epoch copy keeps every acknowledged entry).
                self.repairs.rotation = self.repairs.rotation.wrapping_add(1);
                let n = self.store_count;
                (0..n)
                    .map(|k| super::slot_of((self.repairs.rotation + k) % n))
                    .find(|&s| s != slot && self.slot_up(s))
            }
        };
        let Some(source) = source else {
            let unsourced = &mut self.repairs.unsourced;
            if !unsourced.contains(&(slot, offset)) && unsourced.len() < CORRUPT_REPORTS_MAX {
                unsourced.push((slot, offset));
                tracing::warn!(%slot, %offset, "no other store can give a good copy of a damaged record now: that store keeps it damaged and grants no fence until one can");
            }
            return;
        };
        if let Some(i) = self
            .repairs
            .unsourced
            .iter()
            .position(|r| *r == (slot, offset))
        {
            self.repairs.unsourced.swap_remove(i);
            tracing::info!(%slot, %offset, %source, "a store can give a good copy of the damaged record again");
        }
        self.repairs.in_flight.push((slot, offset));
        self.out.push(Command::RepairRecord {
            slot,
            offset,
            source,
        });
    }
}
