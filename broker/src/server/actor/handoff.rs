//! Graceful handoff, the driver's side: the decisions are the engine's
//! (`crate::engine::broker`, `handoff.rs`); here the operator's `HandoffRequest` is held by
//! a token, the `TakeOverNowRequest` goes to the target over its slot's connection, and a
//! failure is worded with the target's id and address.

use quire_proto::{
    Body, BrokerId, ErrorCode, ErrorResponse, HandoffRequest, HandoffResponse, TakeOverNowRequest,
    TakeOverNowResponse,
};

use super::{not_connected, Actor};
use crate::core::SlotKind;
use crate::engine::{HandoffDone, HandoffFailure, RequestToken};
use crate::server::conn::Request;
use crate::server::slots::Internal;

impl Actor {
    /// `HandoffRequest` from an operator.
    pub(super) fn on_handoff_request(&mut self, r: Request) {
        let Body::HandoffRequest(HandoffRequest { to }) = r.body else {
            return;
        };
        let token = RequestToken(self.next_token);
        self.next_token += 1;
        self.handoff_requests.insert(token, (r.request_id, r.reply));
        let now = self.now_ms();
        self.engine.handoff_request(token, to, now);
        self.run_commands();
    }

    /// `TakeOverNowRequest` from the master this slave follows: take over at once.
    pub(super) fn on_take_over_now(&mut self, r: Request) {
        let Body::TakeOverNowRequest(TakeOverNowRequest { from_epoch, .. }) = r.body else {
            return;
        };
        let now = self.now_ms();
        if !self.engine.take_over_now(from_epoch, now) {
            self.not_master(&r.reply, r.request_id);
            return;
        }
        r.reply
            .send(r.request_id, TakeOverNowResponse { broker: self.me }.into());
        self.run_commands();
    }

    /// Sends `TakeOverNowRequest` to `to` ([`crate::engine::Command::AskTakeOver`]).
    pub(super) fn ask_take_over(
        &mut self,
        to: BrokerId,
        epoch: quire_proto::Epoch,
        hwm: Option<quire_proto::Offset>,
    ) {
        let client = self
            .engine
            .cluster()
            .slots
            .iter()
            .position(|k| matches!(k, SlotKind::Slave { broker } if *broker == to))
            .and_then(|i| self.slots.get(i))
            .and_then(|s| s.client());
        let tx = self.internal_tx.clone();
        tokio::spawn(async move {
            let outcome = match client {
                Some(c) => match c
                    .connection()
                    .send(
                        TakeOverNowRequest {
                            from_epoch: epoch,
                            hwm,
                        }
                        .into(),
                    )
                    .await
                {
                    Ok(pending) => pending.wait().await.map(|f| f.body),
                    Err(e) => Err(e),
                },
                None => Err(not_connected()),
            };
            let _ = tx
                .send(Internal::HandoffAnswer {
                    to,
                    epoch,
                    outcome: outcome.map_err(|e| e.to_string()),
                })
                .await;
        });
    }

    /// The target's answer to `TakeOverNowRequest`.
    pub(super) fn on_handoff_answer(
        &mut self,
        to: BrokerId,
        epoch: quire_proto::Epoch,
        outcome: Result<Body, String>,
    ) {
        let outcome = match outcome {
            Ok(Body::TakeOverNowResponse(_)) => Ok(()),
            Ok(Body::ErrorResponse(e)) => Err(HandoffFailure::TargetRefused(e)),
            Ok(other) => Err(HandoffFailure::TargetRefused(ErrorResponse::new(
                ErrorCode::Internal,
                format!(
                    "the target answered {:?} to a take-over request",
                    other.frame_type()
                ),
            ))),
            Err(e) => Err(HandoffFailure::TargetSilent(to, Some(e))),
        };
        let now = self.now_ms();
        self.engine.take_over_answer(epoch, outcome, now);
    }

    /// Answers the handoff request `token` ([`crate::engine::Command::HandoffDone`]).
    pub(super) fn handoff_done(
        &mut self,
        token: RequestToken,
        outcome: Result<HandoffDone, HandoffFailure>,
    ) {
        let Some((request_id, reply)) = self.handoff_requests.remove(&token) else {
            return;
        };
        match outcome {
            Ok(done) => {
                self.metrics.handoffs.inc();
                self.metrics
                    .handoff_duration
                    .observe(done.pause_ms as f64 / 1000.0);
                reply.send(
                    request_id,
                    HandoffResponse {
                        epoch: done.epoch,
                        master: done.epoch.broker(),
                        pause_us: done.pause_ms.saturating_mul(1000),
                    }
                    .into(),
                );
            }
            Err(f) => {
                let e = self.handoff_error(f);
                tracing::warn!(code = %e.code, message = %e.message, "handoff failed");
                reply.error(request_id, e);
            }
        }
    }

    /// The error an operator reads for a failed handoff.
    fn handoff_error(&self, f: HandoffFailure) -> ErrorResponse {
        let timeout = |m: String| ErrorResponse::new(ErrorCode::Timeout, m);
        match f {
            HandoffFailure::NotMaster => {
                let (epoch, master) = self.master_hint();
                ErrorResponse::not_master(epoch, master)
            }
            HandoffFailure::AlreadyRunning => {
                ErrorResponse::new(ErrorCode::ShuttingDown, "a handoff is already running")
            }
            HandoffFailure::NotABroker(to) => ErrorResponse::new(
                ErrorCode::InvalidName,
                format!("broker {} is not another broker of this cluster", to.0),
            ),
            HandoffFailure::Stopped => ErrorResponse::new(
                ErrorCode::NotMaster,
                "this broker stopped being master during the handoff",
            ),
            HandoffFailure::NotDrained => timeout(
                "the master's accepted writes were not stabilized in time; it serves again"
                    .to_owned(),
            ),
            // A target the master has no connection to (down, or unreachable from it) is
            // the usual cause, and the one an operator can act on.
            HandoffFailure::TargetUnreachable(to) => timeout(format!(
                "{} is not connected to the master (down, or unreachable from it), \
                 so it cannot take over; the master serves again",
                self.broker_name(to)
            )),
            HandoffFailure::TargetSilent(to, None) => timeout(format!(
                "{} did not answer the take-over request in time; the master serves again",
                self.broker_name(to)
            )),
            HandoffFailure::TargetSilent(to, Some(e)) => timeout(format!(
                "{} did not answer the take-over request ({e}); the master serves again",
                self.broker_name(to)
            )),
            HandoffFailure::TargetRefused(e) => e,
            HandoffFailure::NoNewMaster => {
                timeout("handed over, but no new master was seen serving in time".to_owned())
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
}
