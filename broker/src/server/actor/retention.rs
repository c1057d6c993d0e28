//! Retention on the broker (docs/protocol.md "Retention"): the master proposes trim points
//! as Trim events through the ordinary quorum path, each carrying a **checkpoint** of the
//! broker state; reads below the applied trim point are answered `Trimmed`; a broker whose
//! log starts at a checkpoint rebuilds its state there.
//!
//! ```text
//!   apply_events ──> planner.stabilized (every broker, every applied event)
//!   heartbeat tick ─> master serving: planner.plan(now) = p
//!                       c = the highest checkpoint <= p above the trim point
//!                       c found, or no checkpoint above the trim point yet:
//!                         barrier: writes wait until nothing is in flight (HWM = log end)
//!                         then propose Trim{before: c (or the trim point), checkpoint:
//!                         the state through the offset before this event}
//!                     otherwise: planner.mark(now)
//!   Trim stabilized ─> BrokerState::trim_point rises ─> Fetch below it: Trimmed{first}
//!                   ─> stores delete whole segments below min(before, their HWM)
//!   a slave needs events a store deleted ─> the master sends it the log from the trim
//!                     point (a checkpoint) ─> the slave rebuilds its state from it
//! ```
//!
//! Why trim points are checkpoints: a store deletes only whole segments below the point, so
//! the event at the point is always still held; a broker that starts there loads the
//! state before it and applies the rest, and the topics' message offsets it lacks are all
//! below the point, where no broker serves them. Why the barrier: a checkpoint must be the
//! state through exactly the offset before its own event, so nothing may be in flight when
//! it is taken; the pause lasts one quorum round trip, once per trim.

use std::time::{Duration, Instant};

use quire_proto::{
    ErrorResponse, EventBody, EventKind, Offset, TrimEvent, EVENT_PAYLOAD_BYTES_MAX,
};

use super::Actor;
use crate::core::event::EVENT_OVERHEAD_BYTES;
use crate::core::{AppendCommand, Event, MasterInput};
use crate::engine::RoleView;
use crate::retention::TrimPlanner;

/// Shortest time a checkpoint barrier may hold writes before it is given up (it is retried
/// at a later tick); the bound is ten heartbeats, at least this.
pub const TRIM_BARRIER_MIN: Duration = Duration::from_secs(1);

/// How long a master waits before it plans a trim again after a checkpoint that could not
/// be proposed (the broker state too large for one event). Without it the master paused
/// writes, encoded the whole state and logged an error at every heartbeat tick.
pub const CHECKPOINT_RETRY_AFTER: Duration = Duration::from_secs(60);

/// A checkpoint the master is waiting to take: writes wait until nothing is in flight.
#[derive(Debug)]
pub(super) struct TrimBarrier {
    /// The trim point the Trim event will carry.
    before: Offset,
    /// When the barrier started.
    since: Instant,
}

impl Actor {
    /// Feeds one applied event to the trim planner (call right after applying it).
    pub(super) fn retention_applied(&mut self, event: &Event) {
        self.planner
            .stabilized(event.offset, event.payload.len() as u64);
        let trim_point = self.engine.state().trim_point();
        if trim_point > self.planner.trim_point() {
            self.planner.trimmed(trim_point);
        }
    }

    /// The engine rebuilt the broker state from the checkpoint at `checkpoint` (the log
    /// now starts there): the planner starts over from it.
    pub(super) fn retention_rebuilt(&mut self, checkpoint: Offset) {
        let mut planner = TrimPlanner::new(self.cfg.retention, checkpoint);
        planner.trimmed(self.engine.state().trim_point());
        self.planner = planner;
    }

    /// On a heartbeat tick: a serving master starts a checkpoint barrier when the policy
    /// allows a higher trim point; every other broker only takes the planner's mark.
    pub(super) fn retention_tick(&mut self, now_ms: u64) {
        let handing_off = self.is_handing_off();
        let RoleView::Master(_, serving) = self.engine.role() else {
            self.trim_barrier = None;
            self.planner.mark(now_ms);
            return;
        };
        if !serving || handing_off {
            self.planner.mark(now_ms);
            return;
        }
        if let Some(b) = &self.trim_barrier {
            let bound = (self.cfg.heartbeat * 10).max(TRIM_BARRIER_MIN);
            if b.since.elapsed() >= bound {
                tracing::warn!(before = %b.before, "retention: writes stayed in flight too long for a checkpoint; retried later");
                self.trim_barrier = None;
                self.retry_blocked();
            }
            self.planner.mark(now_ms);
            return;
        }
        if self.checkpoint_retry_at.is_some_and(|t| Instant::now() < t) {
            // The last checkpoint could not be proposed: wait before building another.
            self.planner.mark(now_ms);
            return;
        }
        let state = self.engine.state();
        if self.trim_proposed > state.applied() {
            // The last checkpoint is not applied yet.
            self.planner.mark(now_ms);
            return;
        }
        let Some(point) = self.planner.plan(now_ms) else {
            return;
        };
        let trim_point = state.trim_point();
        let to = state
            .checkpoint_at_or_below(point)
            .filter(|&c| c > trim_point);
        let before = match (to, state.last_checkpoint()) {
            (Some(c), _) => c,
            // No checkpoint above the trim point: take one, trimming nothing more yet.
            (None, None) => trim_point,
            // A checkpoint waits for the planner's point to pass it.
            (None, Some(_)) => return,
        };
        self.trim_barrier = Some(TrimBarrier {
            before,
            since: Instant::now(),
        });
        self.sync_write_hold();
        self.retention_barrier_check();
    }

    /// Takes the checkpoint a barrier waits for once nothing is in flight: proposes the Trim
    /// event with the state through the offset right before it, then lets writes go.
    pub(super) fn retention_barrier_check(&mut self) {
        let Some(barrier) = &self.trim_barrier else {
            return;
        };
        let before = barrier.before;
        let since = barrier.since;
        if self.is_handing_off() {
            // A handing master proposes nothing more; the new master trims later.
            self.trim_barrier = None;
            return;
        }
        let Some(core) = self.engine.master_core() else {
            self.trim_barrier = None;
            self.sync_write_hold();
            return;
        };
        let state = self.engine.state();
        let next = core.next_offset();
        let applied_next = state.applied().map_or(Offset::ZERO, Offset::next);
        if core.hwm().map_or(Offset::ZERO, Offset::next) != next || applied_next != next {
            return;
        }
        self.trim_barrier = None;
        let body = EventBody::Trim(TrimEvent {
            before,
            checkpoint: Some(Box::new(state.snapshot())),
        });
        let payload = match body.to_payload() {
            Ok(p) if p.len() <= EVENT_PAYLOAD_BYTES_MAX => Some(p),
            Ok(p) => {
                tracing::error!(
                    bytes = p.len(),
                    max = EVENT_PAYLOAD_BYTES_MAX,
                    retry_after_s = CHECKPOINT_RETRY_AFTER.as_secs(),
                    "retention: the broker state is too large for a checkpoint; nothing is trimmed"
                );
                self.checkpoint_retry_at = Some(Instant::now() + CHECKPOINT_RETRY_AFTER);
                None
            }
            Err(e) => {
                tracing::error!(error = %e, retry_after_s = CHECKPOINT_RETRY_AFTER.as_secs(), "retention: cannot encode a checkpoint; nothing is trimmed");
                self.checkpoint_retry_at = Some(Instant::now() + CHECKPOINT_RETRY_AFTER);
                None
            }
        };
        if let Some(payload) = payload {
            let bytes = EVENT_OVERHEAD_BYTES + payload.len() as u64;
            let mut proposed = None;
            let now = self.now_ms();
            self.engine.with_master(now, |core, _, out| {
                proposed = Some(core.propose(EventKind::Trim.as_u8(), payload, out));
            });
            match proposed {
                Some(Ok(offset)) => {
                    self.trim_proposed = Some(offset);
                    self.planner.trimmed(before);
                    let paused_us = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
                    tracing::info!(%before, checkpoint = %offset, bytes, paused_us, "retention: proposed a trim point with a checkpoint");
                }
                Some(Err(e)) => {
                    tracing::warn!(error = %e, %before, "retention: checkpoint not proposed; planned again later");
                }
                None => {}
            }
            self.run_commands();
        }
        self.retry_blocked();
    }

    /// A read for an append found the store no longer holds the events (retention). A
    /// slave is sent the log from the trim point instead, a checkpoint it rebuilds its state
    /// from; a store that lags below what the stores still hold cannot catch up.
    pub(super) fn on_read_trimmed(&mut self, cmd: &AppendCommand, first_offset: Offset) {
        let slot = cmd.slot;
        let is_store = slot.index() < self.store_count;
        let checkpoint = self.engine.state().trim_point();
        if self.engine.master_epoch() != Some(cmd.epoch) {
            return;
        }
        if is_store {
            tracing::error!(%slot, from = %cmd.first, %first_offset, "a store lags below the first offset the other stores hold (retention deleted it): it cannot catch up; replace its data as for a lost disk (docs/operations.md)");
            return;
        }
        if checkpoint == Offset::ZERO || checkpoint < first_offset {
            tracing::warn!(%slot, from = %cmd.first, %first_offset, %checkpoint, "a slave needs trimmed events and no checkpoint covers them yet");
            return;
        }
        tracing::info!(%slot, from = %cmd.first, %checkpoint, "a slave needs trimmed events: sending it the log from the checkpoint at the trim point");
        let now = self.now_ms();
        self.engine.with_master(now, |core, _, out| {
            core.handle(MasterInput::SlaveToCheckpoint { slot, checkpoint }, out);
        });
        self.run_commands();
    }

    /// The `Trimmed` answer for a read from `from`, if `from` is below the applied trim point
    /// (the first offset a reader may ask for).
    pub(super) fn trimmed_answer(&self, from: Offset) -> Option<ErrorResponse> {
        let first = self.engine.state().trim_point();
        (from < first).then(|| ErrorResponse::trimmed(from, first))
    }
}
