//! Retention in the broker engine (docs/protocol.md "Retention"): the master proposes trim
//! points as Trim events through the ordinary quorum path, each carrying a **checkpoint** of
//! the broker state; reads below the applied trim point are answered `Trimmed`; a broker
//! whose log starts at a checkpoint rebuilds its state there.
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

use quire_proto::{
    CheckpointPart, EventBody, EventKind, Offset, Payload, TrimEvent, CHECKPOINT_PARTS_MAX,
    EVENT_PAYLOAD_BYTES_MAX,
};

use super::{Engine, Role};
use crate::core::event::EVENT_OVERHEAD_BYTES;
use crate::core::{AppendCommand, Event, MasterInput, ProposeError};
use crate::retention::TrimPlanner;

/// Shortest time a checkpoint barrier may hold writes before it is given up (it is retried
/// at a later tick), in ms; the bound is ten heartbeats, at least this.
pub const TRIM_BARRIER_MIN_MS: u64 = 1000;

/// How long a master waits before it plans a trim again after a checkpoint that could not
/// be proposed (the broker state too large for one event), in ms. Without it the master
/// paused writes, encoded the whole state and logged an error at every heartbeat tick.
pub const CHECKPOINT_RETRY_AFTER_MS: u64 = 60_000;

/// Default [`super::EngineConfig::checkpoint_part_bytes`]: 8 MiB of snapshot per event.
pub const CHECKPOINT_PART_BYTES_DEFAULT: usize = 8 * 1024 * 1024;

/// Largest [`super::EngineConfig::checkpoint_part_bytes`]: a part's event (its snapshot
/// bytes and a few dozen bytes of header) still fits in `EVENT_PAYLOAD_BYTES_MAX`.
pub const CHECKPOINT_PART_BYTES_MAX: usize = EVENT_PAYLOAD_BYTES_MAX - 1024;

/// Longest a master keeps proposing one checkpoint's parts (writes held) before it gives
/// the checkpoint up, in ms.
pub const CHECKPOINT_PARTS_WRITE_MS_MAX: u64 = 30_000;

/// A checkpoint being proposed: its events (one, or its parts) not proposed yet.
#[derive(Debug)]
pub(super) struct PartsWriter {
    /// The trim point its events carry.
    before: Offset,
    /// Events still to propose, in order.
    payloads: std::collections::VecDeque<Payload>,
    /// Events in all.
    count: usize,
    /// Payload bytes of all its events.
    bytes: u64,
    /// Offset of its first event, once proposed.
    first: Option<Offset>,
    /// When its barrier started (ms).
    since_ms: u64,
    /// When the barrier let it start (ms).
    parts_since_ms: u64,
}

/// A checkpoint the master is waiting to take: writes wait until nothing is in flight.
#[derive(Clone, Copy, Debug)]
pub(super) struct TrimBarrier {
    /// The trim point the Trim event will carry.
    before: Offset,
    /// When the barrier started (ms).
    since_ms: u64,
}

/// The master's retention bookkeeping.
#[derive(Debug)]
pub(super) struct Retention {
    /// Where the master may trim the log (fed by every applied event, on every broker).
    planner: TrimPlanner,
    /// The master holds writes until nothing is in flight, to take a checkpoint.
    barrier: Option<TrimBarrier>,
    /// After a checkpoint too large to propose: no trim is planned before this (ms).
    retry_at_ms: Option<u64>,
    /// The checkpoint being proposed (writes held until it is).
    writing: Option<PartsWriter>,
    /// `retention_write_parts` runs (it dispatches commands, which call back).
    proposing: bool,
    /// Offset of the last event of the last checkpoint this master proposed.
    proposed: Option<Offset>,
    /// Store slots already reported as unable to catch up (logged once per process).
    unrepairable: std::collections::BTreeSet<crate::core::SlotId>,
}

impl Retention {
    pub(super) fn new(policy: crate::retention::RetentionPolicy) -> Retention {
        Retention {
            planner: TrimPlanner::new(policy, Offset::ZERO),
            barrier: None,
            retry_at_ms: None,
            writing: None,
            proposing: false,
            proposed: None,
            unrepairable: std::collections::BTreeSet::new(),
        }
    }

    /// Whether a checkpoint barrier holds writes.
    pub(super) fn holds_writes(&self) -> bool {
        self.barrier.is_some() || self.writing.is_some()
    }
}

impl Engine {
    /// Feeds one applied event to the trim planner (right after applying it).
    pub(super) fn retention_applied(&mut self, event: &Event) {
        let planner = &mut self.retention.planner;
        // Checkpoints do not count toward retention_bytes: a state larger than the bound
        // made every checkpoint pass the planner's point at once, so an idle cluster wrote
        // checkpoints without end (a break-it trial: 1,290 parts 5-10 times a second).
        let bytes = if event.kind == EventKind::Trim {
            0
        } else {
            event.payload.len() as u64
        };
        planner.stabilized(event.offset, bytes);
        let trim_point = self.state.trim_point();
        if trim_point > planner.trim_point() {
            planner.trimmed(trim_point);
        }
    }

    /// The state was rebuilt from the checkpoint at `checkpoint`: the planner starts over.
    pub(super) fn retention_rebuilt(&mut self, checkpoint: Offset) {
        let mut planner = TrimPlanner::new(self.cfg.retention, checkpoint);
        planner.trimmed(self.state.trim_point());
        self.retention.planner = planner;
    }

    /// On a heartbeat tick: a serving master starts a checkpoint barrier when the policy
    /// allows a higher trim point; every other broker only takes the planner's mark.
    pub(super) fn retention_tick(&mut self) {
        let now = self.now_ms;
        let serving = self.is_serving();
        let handing_off = self.is_handing_off();
        let r = &mut self.retention;
        if !matches!(self.role, Role::Master(_)) {
            r.barrier = None;
            r.writing = None;
            r.planner.mark(now);
            return;
        }
        if r.writing.is_some() {
            r.planner.mark(now);
            self.retention_barrier_check();
            return;
        }
        if !serving || handing_off {
            r.planner.mark(now);
            return;
        }
        if let Some(b) = r.barrier {
            let bound = (self.cfg.heartbeat_ms * 10).max(TRIM_BARRIER_MIN_MS);
            if now.saturating_sub(b.since_ms) >= bound {
                tracing::warn!(before = %b.before, "retention: writes stayed in flight too long for a checkpoint; retried later");
                r.barrier = None;
                r.planner.mark(now);
                self.retry_blocked(now);
                return;
            }
            r.planner.mark(now);
            return;
        }
        if r.retry_at_ms.is_some_and(|t| now < t) {
            // The last checkpoint could not be proposed: wait before building another.
            r.planner.mark(now);
            return;
        }
        if r.proposed > self.state.applied() {
            // The last checkpoint is not applied yet.
            r.planner.mark(now);
            return;
        }
        let Some(point) = r.planner.plan(now) else {
            return;
        };
        let trim_point = self.state.trim_point();
        let to = self
            .state
            .checkpoint_at_or_below(point)
            .filter(|&c| c > trim_point);
        let before = match (to, self.state.last_checkpoint()) {
            (Some(c), _) => c,
            // No checkpoint above the trim point: take one, trimming nothing more yet.
            (None, None) => trim_point,
            // A checkpoint waits for the planner's point to pass it.
            (None, Some(_)) => return,
        };
        r.barrier = Some(TrimBarrier {
            before,
            since_ms: now,
        });
        self.retention_barrier_check();
    }

    /// Takes the checkpoint a barrier waits for once nothing is in flight: proposes the Trim
    /// event with the state through the offset right before it (or, for a state larger
    /// than `checkpoint_part_bytes`, starts writing it in parts), then lets writes go.
    pub(super) fn retention_barrier_check(&mut self) {
        if self.retention.writing.is_some() {
            // Proposing parts dispatches commands, which come back here: once is enough.
            if !self.retention.proposing {
                self.retention.proposing = true;
                self.retention_write_parts();
                self.retention.proposing = false;
            }
            return;
        }
        let Some(barrier) = self.retention.barrier else {
            return;
        };
        let now = self.now_ms;
        if self.is_handing_off() {
            // A handing master proposes nothing more; the new master trims later.
            self.retention.barrier = None;
            return;
        }
        let Role::Master(m) = &mut self.role else {
            self.retention.barrier = None;
            return;
        };
        let next = m.core.next_offset();
        let applied_next = self.state.applied().map_or(Offset::ZERO, Offset::next);
        if m.core.hwm().map_or(Offset::ZERO, Offset::next) != next || applied_next != next {
            return;
        }
        let r = &mut self.retention;
        r.barrier = None;
        let part_bytes = self
            .cfg
            .checkpoint_part_bytes
            .clamp(1, CHECKPOINT_PART_BYTES_MAX);
        let snapshot = self.state.snapshot();
        let encoded = snapshot.to_bytes().and_then(|bytes| {
            if bytes.len() <= part_bytes {
                let whole = EventBody::Trim(TrimEvent {
                    before: barrier.before,
                    checkpoint: Some(Box::new(snapshot)),
                    part: None,
                });
                return Ok(vec![whole.to_payload()?]);
            }
            // A part grows past the setting rather than the state outgrowing
            // CHECKPOINT_PARTS_MAX parts (a break-it trial: 4 KiB parts stopped retention
            // at a 16 MiB state).
            let part_bytes = part_bytes
                .max(bytes.len().div_ceil(CHECKPOINT_PARTS_MAX as usize))
                .min(CHECKPOINT_PART_BYTES_MAX);
            CheckpointPart::split(&bytes, part_bytes)?
                .into_iter()
                .map(|part| {
                    EventBody::Trim(TrimEvent {
                        before: barrier.before,
                        checkpoint: None,
                        part: Some(part),
                    })
                    .to_payload()
                })
                .collect()
        });
        let payloads = match encoded {
            Ok(payloads) => payloads,
            Err(e) => {
                tracing::error!(error = %e, retry_after_s = CHECKPOINT_RETRY_AFTER_MS / 1000, "retention: cannot encode a checkpoint; nothing is trimmed");
                r.retry_at_ms = Some(now.saturating_add(CHECKPOINT_RETRY_AFTER_MS));
                self.retry_blocked(now);
                return;
            }
        };
        r.proposing = true;
        r.writing = Some(PartsWriter {
            before: barrier.before,
            count: payloads.len(),
            bytes: payloads.iter().map(|p| p.len() as u64).sum(),
            payloads: payloads.into(),
            first: None,
            since_ms: barrier.since_ms,
            parts_since_ms: now,
        });
        self.retention_write_parts();
        self.retention.proposing = false;
    }

    /// Proposes the checkpoint's events still to propose, as far as the in-flight bound
    /// lets; writes stay held until the last is proposed (so the parts sit at consecutive
    /// offsets) or the write is given up (after [`CHECKPOINT_PARTS_WRITE_MS_MAX`], or a
    /// proposal refused for another reason than backpressure: the parts proposed so far
    /// are no checkpoint, and the trim is planned again later).
    fn retention_write_parts(&mut self) {
        let now = self.now_ms;
        let handing_off = self.is_handing_off();
        let Role::Master(m) = &mut self.role else {
            self.retention.writing = None;
            return;
        };
        let r = &mut self.retention;
        let Some(w) = r.writing.as_mut() else {
            return;
        };
        let mut out = Vec::new();
        let mut gave_up: Option<String> = handing_off.then(|| "a handoff began".to_owned());
        while gave_up.is_none() {
            let Some(payload) = w.payloads.front() else {
                break;
            };
            match m.core.propose_deferred(EventKind::Trim, payload.clone()) {
                Ok(offset) => {
                    let first = *w.first.get_or_insert(offset);
                    let index = (w.count - w.payloads.len()) as u64;
                    if offset.0 != first.0 + index {
                        gave_up = Some(format!("another event took offset {offset}"));
                    }
                    w.payloads.pop_front();
                }
                Err(ProposeError::Backpressure { .. }) => break,
                Err(e) => gave_up = Some(e.to_string()),
            }
        }
        m.core.flush(&mut out);
        if gave_up.is_none()
            && !w.payloads.is_empty()
            && now.saturating_sub(w.parts_since_ms) >= CHECKPOINT_PARTS_WRITE_MS_MAX
        {
            gave_up = Some(format!(
                "its parts took longer than {CHECKPOINT_PARTS_WRITE_MS_MAX} ms to propose"
            ));
        }
        if let Some(reason) = gave_up {
            tracing::warn!(before = %w.before, reason, "retention: checkpoint given up; planned again later");
            r.writing = None;
            r.retry_at_ms = Some(now.saturating_add(CHECKPOINT_RETRY_AFTER_MS));
        } else if w.payloads.is_empty() {
            let first = w.first.unwrap_or(Offset::ZERO);
            let last = Offset(first.0 + w.count as u64 - 1);
            r.proposed = Some(last);
            r.planner.trimmed(w.before);
            let paused_ms = now.saturating_sub(w.since_ms);
            tracing::info!(before = %w.before, checkpoint = %first, parts = w.count, bytes = w.bytes + w.count as u64 * EVENT_OVERHEAD_BYTES, paused_ms, "retention: proposed a trim point with a checkpoint");
            r.writing = None;
        }
        let done = r.writing.is_none();
        self.dispatch_master(out);
        if done {
            self.retry_blocked(now);
        }
    }

    /// A read for the append `cmd` found the store no longer holds the events from its
    /// first offset (retention deleted them; the store's log now starts at
    /// `first_offset`). A slave is sent the log from the trim point instead, a checkpoint it
    /// rebuilds its state from; a store that lags below what the stores still hold cannot
    /// catch up.
    pub fn read_trimmed(&mut self, cmd: &AppendCommand, first_offset: Offset, now_ms: u64) {
        self.at(now_ms);
        let slot = cmd.slot;
        let is_store = self.is_store(slot);
        let checkpoint = self.state.trim_point();
        let Role::Master(m) = &mut self.role else {
            return;
        };
        if m.core.epoch() != cmd.epoch {
            return;
        }
        if is_store {
            if self.retention.unrepairable.insert(slot) {
                tracing::error!(%slot, from = %cmd.first, %first_offset, "a store lags below the first offset the other stores hold (retention deleted it) and no broker holds the events it lacks: it cannot catch up and stays out of the quorum; the cluster runs on the other voters (docs/operations.md, Retention)");
            } else {
                tracing::debug!(%slot, from = %cmd.first, %first_offset, "a store still lags below the first offset the other stores hold");
            }
            return;
        }
        if checkpoint == Offset::ZERO || checkpoint < first_offset {
            tracing::warn!(%slot, from = %cmd.first, %first_offset, %checkpoint, "a slave needs trimmed events and no checkpoint covers them yet");
            return;
        }
        tracing::info!(%slot, from = %cmd.first, %checkpoint, "a slave needs trimmed events: sending it the log from the checkpoint at the trim point");
        let mut out = Vec::new();
        m.core.handle(
            MasterInput::SlaveToCheckpoint { slot, checkpoint },
            &mut out,
        );
        self.dispatch_master(out);
    }

    /// The `Trimmed` answer's first offset for a read from `from`, if `from` is below the
    /// applied trim point (the first offset a reader may ask for).
    #[must_use]
    pub fn trimmed_below(&self, from: Offset) -> Option<Offset> {
        let first = self.state.trim_point();
        (from < first).then_some(first)
    }
}
