//! Graceful handoff in the broker engine (DESIGN.md "Graceful handoff", docs/protocol.md
//! "Graceful handoff"): the master hands mastership to a named slave with no producer
//! error, only a pause.
//!
//! ```text
//!   handoff_request{to} ─> Draining: writes wait (blocked); wait until nothing is pending
//!                          and the HWM is the log's last offset
//!                       ─> Asked: Command::AskTakeOver{to, epoch, hwm} (the driver sends
//!                          TakeOverNowRequest to `to`)
//!   take_over_answer(Ok) ─> SteppedDown: the master follows; waiting writes get NotMaster
//!                          with `to` as hint; `to` runs an ordinary (fast) takeover
//!   HWM learned ≥ the old log end under a newer epoch ─> Command::HandoffDone(Ok)
//! ```
//!
//! The handoff owns no safety rule of its own: the target's takeover is an ordinary
//! takeover, and the handing master proposes nothing from the moment it asks. A handoff
//! that has not finished by its deadline (twice the election timeout, at least
//! [`HANDOFF_TIMEOUT_MIN_MS`]) fails with a [`HandoffFailure`] naming what held it up; a
//! master that had not stepped down yet serves again.

use quire_proto::{BrokerId, Epoch, ErrorResponse, Offset};

use super::{Command, Engine, RequestToken, Role};
use crate::core::SlotKind;

/// Shortest bound on a whole handoff, in ms (the bound is twice the election timeout, at
/// least this).
pub const HANDOFF_TIMEOUT_MIN_MS: u64 = 2000;

/// Where a handoff stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Writes wait; the master waits for its HWM to cover all it accepted.
    Draining,
    /// The target was asked; the master proposes nothing. `next` is the master's log end
    /// (the offset the new master's epoch-start event takes).
    Asked { next: Offset },
    /// The master stepped down and follows; waiting to learn an HWM at or past `next`.
    SteppedDown { next: Offset },
}

/// A handoff in progress (at most one per broker).
#[derive(Clone, Copy, Debug)]
pub(super) struct Handoff {
    /// The slave that is to become master.
    to: BrokerId,
    /// The handing master's epoch.
    epoch: Epoch,
    token: RequestToken,
    started_ms: u64,
    deadline_ms: u64,
    phase: Phase,
}

/// Why a handoff request was refused or a handoff failed. The driver words the answer
/// (it knows the brokers' addresses).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandoffFailure {
    /// This broker is not a serving master (refused at once).
    NotMaster,
    /// Another handoff is running (refused at once).
    AlreadyRunning,
    /// `to` is not another broker of this cluster (refused at once).
    NotABroker(BrokerId),
    /// The master stopped being master during the handoff.
    Stopped,
    /// The master's accepted writes were not stabilized in time; it serves again.
    NotDrained,
    /// The target has no connection to the master; it serves again.
    TargetUnreachable(BrokerId),
    /// The target did not answer the take-over request in time (or the request failed:
    /// the driver's reason); the master serves again.
    TargetSilent(BrokerId, Option<String>),
    /// The target refused to take over; the master serves again.
    TargetRefused(ErrorResponse),
    /// Handed over, but no new master was seen serving in time.
    NoNewMaster,
}

/// A finished handoff.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandoffDone {
    /// The new master's epoch.
    pub epoch: Epoch,
    /// The pause: request received to the new master serving, in ms.
    pub pause_ms: u64,
}

impl Engine {
    /// A request (`token`) to hand mastership to broker `to`. Answered through
    /// [`Command::HandoffDone`], at once if refused.
    pub fn handoff_request(&mut self, token: RequestToken, to: BrokerId, now_ms: u64) {
        self.at(now_ms);
        let refuse = |e: &mut Engine, f: HandoffFailure| {
            e.out.push(Command::HandoffDone {
                token,
                outcome: Err(f),
            });
        };
        let epoch = match &self.role {
            Role::Master(m) if m.serving => m.core.epoch(),
            _ => return refuse(self, HandoffFailure::NotMaster),
        };
        if self.handoff.is_some() {
            return refuse(self, HandoffFailure::AlreadyRunning);
        }
        if self.slave_slot(to).is_none() || to == self.cfg.me {
            return refuse(self, HandoffFailure::NotABroker(to));
        }
        tracing::info!(%epoch, to = to.0, "handoff requested: writes wait until the log is stabilized");
        let timeout = self
            .cfg
            .election_timeout_ms
            .saturating_mul(2)
            .max(HANDOFF_TIMEOUT_MIN_MS);
        self.handoff = Some(Handoff {
            to,
            epoch,
            token,
            started_ms: now_ms,
            deadline_ms: now_ms.saturating_add(timeout),
            phase: Phase::Draining,
        });
        self.advance_handoff();
    }

    /// The target's answer to the take-over request of the handoff of `epoch`: `Ok` if it
    /// takes over, else why not.
    pub fn take_over_answer(
        &mut self,
        epoch: Epoch,
        outcome: Result<(), HandoffFailure>,
        now_ms: u64,
    ) {
        self.at(now_ms);
        let Some(h) = self.handoff else {
            return;
        };
        let Phase::Asked { next } = h.phase else {
            return;
        };
        if h.epoch != epoch {
            return;
        }
        match outcome {
            Ok(()) => {
                if self.hand_over(epoch, now_ms) {
                    tracing::info!(%epoch, to = h.to.0, "handed over: following");
                }
                if let Some(h) = &mut self.handoff {
                    h.phase = Phase::SteppedDown { next };
                }
                self.advance_handoff();
            }
            Err(f) => {
                tracing::warn!(failure = ?f, "the target did not take over; serving again");
                self.finish_handoff(Err(f));
            }
        }
    }

    /// Whether produces and cursor commits wait for a handoff: it drains or has asked.
    #[must_use]
    pub fn is_handing_off(&self) -> bool {
        self.handoff
            .is_some_and(|h| !matches!(h.phase, Phase::SteppedDown { .. }))
    }

    /// The broker this one handed over to, while it has not heard from the new master.
    pub(super) fn handed_over_to(&self) -> Option<BrokerId> {
        self.handoff
            .filter(|h| matches!(h.phase, Phase::SteppedDown { .. }))
            .map(|h| h.to)
    }

    /// The slot of the other broker `to`.
    fn slave_slot(&self, to: BrokerId) -> Option<usize> {
        self.cluster
            .slots
            .iter()
            .position(|k| matches!(k, SlotKind::Slave { broker } if *broker == to))
    }

    /// Moves a handoff on: after stabilization, after an inbound append, on every tick and
    /// after the target's answer.
    pub(super) fn advance_handoff(&mut self) {
        let Some(h) = self.handoff else {
            return;
        };
        let now = self.now_ms;
        match h.phase {
            Phase::Draining => {
                let Some(core) = self.master_core().filter(|c| c.epoch() == h.epoch) else {
                    return self.finish_handoff(Err(HandoffFailure::Stopped));
                };
                let next = core.next_offset();
                let hwm = core.hwm();
                let really_drained =
                    self.writes_pending() == 0 && hwm.map(Offset::next) == Some(next);
                let drained = self.cfg.mutations.handoff_acks_early || really_drained;
                if drained && !really_drained {
                    self.mutated_steps += 1;
                }
                let slot = self.slave_slot(h.to);
                let reachable = slot.is_some_and(|i| self.slot_up.get(i).copied().unwrap_or(false));
                if now >= h.deadline_ms {
                    // Say what held the handoff up: a target the master has no connection
                    // to (down, or unreachable from it) is the usual cause, and the one an
                    // operator can act on.
                    let why = if drained {
                        HandoffFailure::TargetUnreachable(h.to)
                    } else {
                        HandoffFailure::NotDrained
                    };
                    return self.finish_handoff(Err(why));
                }
                if !drained || !reachable {
                    // Not drained, or not connected to the target yet: the next tick or
                    // stabilization tries again.
                    return;
                }
                tracing::info!(epoch = %h.epoch, to = h.to.0, next = %next.0, "log stabilized: asking the target to take over");
                self.out.push(Command::AskTakeOver {
                    to: h.to,
                    epoch: h.epoch,
                    hwm,
                });
                if let Some(h) = &mut self.handoff {
                    h.phase = Phase::Asked { next };
                }
            }
            Phase::Asked { .. } => {
                if now >= h.deadline_ms {
                    self.finish_handoff(Err(HandoffFailure::TargetSilent(h.to, None)));
                }
            }
            Phase::SteppedDown { next } => {
                if let Role::Follower(f) = &self.role {
                    let new = f.master_epoch();
                    if new > h.epoch && f.hwm() >= Some(next) {
                        let pause_ms = now.saturating_sub(h.started_ms);
                        tracing::info!(epoch = %new, master = new.broker().0, pause_ms, "handoff finished: the new master serves");
                        return self.finish_handoff(Ok(HandoffDone {
                            epoch: new,
                            pause_ms,
                        }));
                    }
                }
                if now >= h.deadline_ms {
                    self.finish_handoff(Err(HandoffFailure::NoNewMaster));
                }
            }
        }
    }

    /// Answers the requester and forgets the handoff; a master still serving takes writes
    /// again.
    fn finish_handoff(&mut self, outcome: Result<HandoffDone, HandoffFailure>) {
        let Some(h) = self.handoff.take() else {
            return;
        };
        if let Err(f) = &outcome {
            tracing::warn!(failure = ?f, "handoff failed");
        }
        self.out.push(Command::HandoffDone {
            token: h.token,
            outcome,
        });
        let now = self.now_ms;
        self.retry_blocked(now);
    }
}
