//! Graceful handoff (DESIGN.md "Graceful handoff", docs/protocol.md "Graceful handoff"):
//! the master hands mastership to a named slave with no producer error, only a pause.
//!
//! ```text
//!   HandoffRequest{to} ─> Draining: writes wait in `blocked`; wait until nothing is pending
//!                         and the HWM is the log's last offset
//!                      ─> Asked: TakeOverNowRequest{from_epoch, hwm} sent to `to`
//!   TakeOverNowResponse ─> SteppedDown: the master follows; waiting writes get NotMaster
//!                         with `to` as hint; `to` runs an ordinary (fast) takeover
//!   HWM learned ≥ the old log end ─> HandoffResponse (the new epoch-start is stabilized)
//! ```
//!
//! The handoff owns no safety rule of its own: the target's takeover is an ordinary takeover,
//! and the handing master proposes nothing from the moment it asks. A handoff that has not
//! finished by its deadline is answered `Timeout` with a message naming what held it up
//! (writes not stabilized; the target, by id and address, not connected to the master or
//! not answering); a master that had not stepped down yet serves again. The role changes (fenced, rival) that can happen meanwhile are handled by
//! the actor as always; this module only notices them.

use std::time::{Duration, Instant};

use quire_proto::{
    Body, BrokerId, BrokerInfo, Epoch, ErrorCode, ErrorResponse, HandoffRequest, HandoffResponse,
    Offset, RequestId, TakeOverNowRequest, TakeOverNowResponse,
};

use super::Actor;
use crate::core::SlotKind;
use crate::engine::RoleView;
use crate::server::conn::{Request, Responder};
use crate::server::slots::Internal;

/// Shortest bound on a whole handoff (the bound is twice the election timeout, at least this).
pub const HANDOFF_TIMEOUT_MIN: Duration = Duration::from_secs(2);

/// Where a handoff stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum HandoffPhase {
    /// Writes wait; the master waits for its HWM to cover all it accepted.
    Draining,
    /// `TakeOverNowRequest` sent; the master proposes nothing. `next` is the master's log
    /// end (the offset the new master's epoch-start event takes).
    Asked { next: Offset },
    /// The master stepped down and follows; waiting to learn an HWM at or past `next`.
    SteppedDown { next: Offset },
}

/// A handoff in progress (at most one per broker).
#[derive(Debug)]
pub(super) struct Handoff {
    /// The slave that is to become master.
    to: BrokerId,
    /// The handing master's epoch.
    epoch: Epoch,
    request_id: RequestId,
    reply: Responder,
    started: Instant,
    deadline: Instant,
    phase: HandoffPhase,
}

impl Actor {
    /// How long a whole handoff may take.
    fn handoff_timeout(&self) -> Duration {
        (self.cfg.election_timeout * 2).max(HANDOFF_TIMEOUT_MIN)
    }

    /// Whether produces and cursor commits must wait: a handoff is draining or has asked.
    pub(super) fn is_handing_off(&self) -> bool {
        self.handoff
            .as_ref()
            .is_some_and(|h| !matches!(h.phase, HandoffPhase::SteppedDown { .. }))
    }

    /// The master to point clients at while this broker has handed over and not yet heard
    /// from the new master.
    pub(super) fn handoff_hint(&self) -> Option<BrokerInfo> {
        let h = self.handoff.as_ref()?;
        matches!(h.phase, HandoffPhase::SteppedDown { .. })
            .then(|| self.broker_info(h.to))
            .flatten()
    }

    /// `HandoffRequest` from an operator.
    pub(super) fn on_handoff_request(&mut self, r: Request) {
        let Body::HandoffRequest(HandoffRequest { to }) = r.body else {
            return;
        };
        let epoch = match self.engine.role() {
            RoleView::Master(core, true) => core.epoch(),
            _ => {
                self.not_master(&r.reply, r.request_id);
                return;
            }
        };
        if self.handoff.is_some() {
            r.reply.error(
                r.request_id,
                ErrorResponse::new(ErrorCode::ShuttingDown, "a handoff is already running"),
            );
            return;
        }
        let is_slave = to != self.me
            && self
                .engine
                .cluster()
                .slots
                .iter()
                .any(|k| matches!(k, SlotKind::Slave { broker } if *broker == to));
        if !is_slave {
            r.reply.error(
                r.request_id,
                ErrorResponse::new(
                    ErrorCode::InvalidName,
                    format!("broker {} is not another broker of this cluster", to.0),
                ),
            );
            return;
        }
        let now = Instant::now();
        tracing::info!(%epoch, to = to.0, "handoff requested: writes wait until the log is stabilized");
        self.handoff = Some(Handoff {
            to,
            epoch,
            request_id: r.request_id,
            reply: r.reply,
            started: now,
            deadline: now + self.handoff_timeout(),
            phase: HandoffPhase::Draining,
        });
        self.sync_write_hold();
        self.advance_handoff();
    }

    /// `TakeOverNowRequest` from the master this slave follows: take over at once.
    pub(super) fn on_take_over_now(&mut self, r: Request) {
        let Body::TakeOverNowRequest(TakeOverNowRequest { from_epoch, .. }) = r.body else {
            return;
        };
        let follows =
            matches!(self.engine.role(), RoleView::Follower(f) if f.master_epoch() == from_epoch);
        let knows_identities = (0..self.store_count).any(|i| {
            self.engine
                .cluster()
                .expected_identity(Self::slot_of(i))
                .is_some()
        });
        if !follows || !knows_identities {
            self.not_master(&r.reply, r.request_id);
            return;
        }
        tracing::info!(%from_epoch, "the master hands over: taking over now");
        r.reply
            .send(r.request_id, TakeOverNowResponse { broker: self.me }.into());
        let now = self.now_ms();
        self.engine.take_over_now(now);
        self.run_commands();
    }

    /// Moves a handoff on. Called after stabilization, after an inbound append, on every
    /// tick and after the target's answer.
    pub(super) fn advance_handoff(&mut self) {
        let Some(h) = &self.handoff else {
            return;
        };
        let now = Instant::now();
        let (epoch, to) = (h.epoch, h.to);
        match h.phase {
            HandoffPhase::Draining => {
                let Some(core) = self
                    .engine
                    .master_core()
                    .filter(|core| core.epoch() == epoch)
                else {
                    self.finish_handoff(Err(ErrorResponse::new(
                        ErrorCode::NotMaster,
                        "this broker stopped being master during the handoff",
                    )));
                    return;
                };
                let next = core.next_offset();
                let drained =
                    self.engine.writes_pending() == 0 && core.hwm().map(Offset::next) == Some(next);
                let hwm = core.hwm();
                let slot = self
                    .engine
                    .cluster()
                    .slots
                    .iter()
                    .position(|k| matches!(k, SlotKind::Slave { broker } if *broker == to));
                let client = slot
                    .and_then(|i| self.slots.get(i))
                    .and_then(|s| s.client());
                if now >= h.deadline {
                    // Say what held the handoff up: a target the master has no connection
                    // to (down, or unreachable from it) is the usual cause, and the one an
                    // operator can act on.
                    let message = if !drained {
                        "the master's accepted writes were not stabilized in time; it serves again"
                            .to_owned()
                    } else {
                        format!(
                            "{} is not connected to the master (down, or unreachable from it), \
                             so it cannot take over; the master serves again",
                            self.broker_name(to)
                        )
                    };
                    self.finish_handoff(Err(ErrorResponse::new(ErrorCode::Timeout, message)));
                    self.retry_blocked();
                    return;
                }
                if !drained {
                    return;
                }
                let Some(client) = client else {
                    // Not connected to the target yet: try again on the next tick.
                    return;
                };
                tracing::info!(%epoch, to = to.0, next = %next.0, "log stabilized: asking the target to take over");
                let tx = self.internal_tx.clone();
                tokio::spawn(async move {
                    let body = TakeOverNowRequest {
                        from_epoch: epoch,
                        hwm,
                    };
                    let outcome = match client.connection().send(body.into()).await {
                        Ok(pending) => pending.wait().await.map(|f| f.body),
                        Err(e) => Err(e),
                    };
                    let _ = tx
                        .send(Internal::HandoffAnswer {
                            epoch,
                            outcome: outcome.map_err(|e| e.to_string()),
                        })
                        .await;
                });
                if let Some(h) = &mut self.handoff {
                    h.phase = HandoffPhase::Asked { next };
                }
            }
            HandoffPhase::Asked { .. } => {
                if now >= h.deadline {
                    let message = format!(
                        "{} did not answer the take-over request in time; the master serves again",
                        self.broker_name(to)
                    );
                    self.finish_handoff(Err(ErrorResponse::new(ErrorCode::Timeout, message)));
                    self.retry_blocked();
                }
            }
            HandoffPhase::SteppedDown { next } => {
                if let RoleView::Follower(f) = self.engine.role() {
                    let new = f.master_epoch();
                    if new > epoch && f.hwm() >= Some(next) {
                        self.finish_handoff(Ok(new));
                        return;
                    }
                }
                if now >= h.deadline {
                    self.finish_handoff(Err(ErrorResponse::new(
                        ErrorCode::Timeout,
                        "handed over, but no new master was seen serving in time",
                    )));
                }
            }
        }
    }

    /// The target's answer to `TakeOverNowRequest`.
    pub(super) fn on_handoff_answer(&mut self, epoch: Epoch, outcome: Result<Body, String>) {
        let Some(h) = &self.handoff else {
            return;
        };
        let HandoffPhase::Asked { next } = h.phase else {
            return;
        };
        if h.epoch != epoch {
            return;
        }
        let to = h.to;
        match outcome {
            Ok(Body::TakeOverNowResponse(_)) => {
                self.hand_over(to, epoch);
                if let Some(h) = &mut self.handoff {
                    h.phase = HandoffPhase::SteppedDown { next };
                }
                self.advance_handoff();
            }
            Ok(Body::ErrorResponse(e)) => {
                tracing::warn!(code = %e.code, message = %e.message, "the target refused to take over; serving again");
                self.finish_handoff(Err(e));
                self.retry_blocked();
            }
            Ok(other) => {
                self.finish_handoff(Err(ErrorResponse::new(
                    ErrorCode::Internal,
                    format!(
                        "the target answered {:?} to a take-over request",
                        other.frame_type()
                    ),
                )));
                self.retry_blocked();
            }
            Err(e) => {
                tracing::warn!(error = %e, "no answer from the target; serving again");
                let message = format!(
                    "{} did not answer the take-over request ({e}); the master serves again",
                    self.broker_name(to)
                );
                self.finish_handoff(Err(ErrorResponse::new(ErrorCode::Timeout, message)));
                self.retry_blocked();
            }
        }
    }

    /// `broker 2 (127.0.0.1:7202)`, or `broker 2` when its address is not configured: how
    /// handoff errors name the target.
    fn broker_name(&self, id: BrokerId) -> String {
        match self.broker_info(id) {
            Some(b) => format!("broker {} ({})", id.0, b.addr),
            None => format!("broker {}", id.0),
        }
    }

    /// Steps down voluntarily (if still master of `epoch`): follow with the whole log, and
    /// send every waiting write to the target.
    fn hand_over(&mut self, to: BrokerId, epoch: Epoch) {
        let hint = self.broker_info(to);
        self.not_master_override = Some(ErrorResponse::not_master(
            self.engine.highest_epoch_seen(),
            hint,
        ));
        let now = self.now_ms();
        if self.engine.hand_over(epoch, now) {
            tracing::info!(%epoch, to = to.0, "handed over: following");
        }
        self.run_commands();
        self.not_master_override = None;
    }

    /// Answers the requester and forgets the handoff.
    fn finish_handoff(&mut self, outcome: Result<Epoch, ErrorResponse>) {
        let Some(h) = self.handoff.take() else {
            return;
        };
        self.sync_write_hold();
        match outcome {
            Ok(new) => {
                let pause = h.started.elapsed();
                self.metrics.handoffs.inc();
                self.metrics.handoff_duration.observe(pause.as_secs_f64());
                tracing::info!(epoch = %new, master = new.broker().0, pause_ms = pause.as_millis() as u64, "handoff finished: the new master serves");
                h.reply.send(
                    h.request_id,
                    HandoffResponse {
                        epoch: new,
                        master: new.broker(),
                        pause_us: u64::try_from(pause.as_micros()).unwrap_or(u64::MAX),
                    }
                    .into(),
                );
            }
            Err(e) => {
                tracing::warn!(code = %e.code, message = %e.message, "handoff failed");
                h.reply.error(h.request_id, e);
            }
        }
    }
}
