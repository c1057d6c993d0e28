//! The store engine: every decision of an event store — fence, append, promise before
//! write, group-commit waiters, fail-stop, heartbeats, tails, tail-cut marks, retention
//! trims — as a deterministic state machine. Inputs in, [`Command`]s out; no tokio, no
//! I/O, no clock. [`crate::store`] drives it over the real WAL; quire-sim can drive it over
//! a simulated one.
//!
//! # Inputs
//! - Requests, each identified by an opaque token `T` the driver chooses: [`Engine::append`],
//!   [`Engine::fence`], [`Engine::heartbeat`], [`Engine::tail`].
//! - Completions: [`Engine::promise_persisted`],
//!   [`Engine::resolved`] (WAL submission `seq` durable or failed),
//!   [`Engine::refused`] (the WAL refused submission `seq` at once),
//!   [`Engine::tail_cut_cleared`].
//! - The log, through [`StoreLog`], at every input: the engine keeps no copy of it.
//!
//! # Commands
//! Drained with [`Engine::take_commands`], executed in order. [`Command::PersistPromise`]
//! blocks the engine: the driver feeds no request until it reported the outcome ([`Engine::is_blocked`]). [`Command::Submit`] carries the
//! submission's sequence number (1, 2, ...): the driver reports each `seq` resolved, in
//! order.
//!
//! # Group commit
//! Answers that wait for durability are **waiters**, each tagged with the sequence number
//! of the latest submission at the time it was created: an accepted append waits for its
//! own submission; an append whose events were all present already, and a granted fence,
//! wait for the latest submission (so everything accepted before them is durable). When
//! submission `s` resolves durable, every waiter tagged `<= s` is answered. When it
//! resolves failed, the log has failed (fail-stop): those appends are answered
//! `LogFailed`, and a fence is granted with the last *durable* entry.

use std::collections::VecDeque;

use quire_proto::{
    AppendRejected, AppendRequest, Body, BrokerId, Epoch, ErrorCode, ErrorResponse, Event,
    EventBody, EventKind, FenceGranted, FenceRefused, FenceRequest, Heartbeat, HeartbeatAck,
    LogPosition, Offset, PersistedAck, RejectReason, TailCut, TailResponse,
};

use crate::identity::Role;
use crate::replica::{AcceptPlan, AppendDecision, FenceDecision, LogView, Replica};

/// Trim events remembered at most while they wait to be stabilized; beyond it the oldest
/// is forgotten (a later trim point supersedes it: the master's trim points only grow).
pub const PENDING_TRIMS_MAX: usize = 64;

/// The store's log as the engine sees it: the accepted entries ([`LogView`]), what of them
/// is durable, and whether the log has failed.
pub trait StoreLog: LogView {
    /// The last entry known durable (covered by a completed fdatasync), `None` if none.
    fn last_durable(&self) -> Option<LogPosition>;
    /// Whether the log has failed (fail-stop): it takes no more appends.
    fn is_failed(&self) -> bool;
    /// The lowest offset whose durable record a read found damaged on this disk, if any
    /// (`Wal::corrupt_records`). While there is one the store grants no fence: a grant
    /// claims the whole log through its last entry, and this store no longer holds that
    /// record.
    fn corrupt_record(&self) -> Option<Offset> {
        None
    }
}

impl<S: quire_wal::Storage> StoreLog for quire_wal::Wal<S> {
    fn last_durable(&self) -> Option<LogPosition> {
        quire_wal::Wal::last_durable(self)
    }
    fn is_failed(&self) -> bool {
        quire_wal::Wal::is_failed(self)
    }
    fn corrupt_record(&self) -> Option<Offset> {
        quire_wal::Wal::first_corrupt_record(self)
    }
}

/// Rules a test switches off on purpose (quire-sim's mutation tests). Never set outside
/// tests.
#[doc(hidden)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Mutations {
    /// Ack the store's own accepted log end instead of `prev.offset + events.len()`.
    pub through_end: bool,
    /// A wiped store votes: fenced by a broker that expects another identity (the one this
    /// directory had before it was wiped and re-initialised), the store takes that identity
    /// on instead of becoming a learner, once its durable log reaches the HWM it heard (or
    /// at once if it heard none), and grants the fence and counts toward Qa under it. Until
    /// it caught up it answers "not a voter" without recording the learner role. The
    /// model checker's `wipe-hwm` counterexample.
    pub wiped_votes: bool,
    /// Retention does not wait for a quorum: the store takes every entry it accepted from
    /// the master for stabilized, so a Trim event deletes segments as soon as the store
    /// accepts it, before a quorum holds the event (a lost, superseded Trim event has
    /// then trimmed what the stabilized log still serves).
    pub trim_unstabilized: bool,
}

/// What the driver does for the engine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Command<T> {
    /// Store the promised epoch durably, then call [`Engine::promise_persisted`].
    PersistPromise(Epoch),
    /// Submit `events` (all of epoch `<= epoch`, contiguous offsets) to the WAL as
    /// submission `seq`; `truncates`: the first replaces an entry (a suffix truncation).
    /// Report it with [`Engine::resolved`] (or [`Engine::refused`]).
    Submit {
        /// Sequence number, from 1, one higher than the previous submission's.
        seq: u64,
        /// The append's epoch.
        epoch: Epoch,
        /// The events to write.
        events: Vec<Event>,
        /// Whether writing them truncates the log first.
        truncates: bool,
    },
    /// Answer the request `token` with `body`.
    Answer {
        /// The request.
        token: T,
        /// The answer.
        body: Body,
    },
    /// Delete the whole segments below `before` (retention); a failure may be ignored.
    Trim {
        /// The trim point: entries at and above it are kept.
        before: Offset,
    },
    /// Remove the tail-cut mark durably, then call [`Engine::tail_cut_cleared`].
    ClearTailCut(TailCut),
}

/// An answer that waits until submission `needed` resolves.
#[derive(Debug)]
enum Waiter<T> {
    Persisted {
        needed: u64,
        token: T,
        epoch: Epoch,
        through: Option<Offset>,
    },
    Fence {
        needed: u64,
        token: T,
        epoch: Epoch,
        last: Option<LogPosition>,
        tail_cut: Option<TailCut>,
    },
}

impl<T> Waiter<T> {
    fn needed(&self) -> u64 {
        match self {
            Waiter::Persisted { needed, .. } | Waiter::Fence { needed, .. } => *needed,
        }
    }
}

/// A request held while the engine waits for a durable promise or role.
#[derive(Debug)]
enum Blocked<T> {
    Append {
        token: T,
        req: AppendRequest,
        plan: AcceptPlan,
    },
    Fence {
        token: T,
        epoch: Epoch,
        promise: Epoch,
    },
}

/// Retention on a store: Trim events seen in accepted appends wait here until they are
/// stabilized, then the WAL deletes the whole segments below their trim point.
///
/// An entry of this store's log is known stabilized when it is at or below both the HWM
/// and the end of the last append accepted from a master of the same epoch (an accepted
/// append means this log matches that master's through its end; the HWM says the
/// master's log is stabilized through it). `stable` is the highest such offset seen; it
/// only grows, since a stabilized entry is never replaced.
#[derive(Debug, Default)]
struct Retention {
    /// `(epoch, through)` of the last accepted append.
    matched: Option<(Epoch, Offset)>,
    /// Highest offset known stabilized in this log.
    stable: Option<Offset>,
    /// `(offset of the Trim event, its epoch, before)`, in log order.
    pending: VecDeque<(Offset, Epoch, Offset)>,
    /// The highest trim point handed to the WAL.
    requested: Offset,
}

impl Retention {
    /// Learns the HWM `hwm` of a master of `epoch`; returns whether `stable` rose.
    fn learn(&mut self, epoch: Epoch, hwm: Option<Offset>) -> bool {
        let (Some(h), Some((m_epoch, through))) = (hwm, self.matched) else {
            return false;
        };
        if m_epoch != epoch {
            return false;
        }
        let safe = h.min(through);
        if self.stable.is_some_and(|s| s >= safe) {
            return false;
        }
        self.stable = Some(safe);
        true
    }

    /// Remembers the Trim events among `events` (bodies that do not decode are logged and
    /// ignored: they delete nothing).
    fn note(&mut self, events: &[Event]) {
        for e in events.iter().filter(|e| e.kind == EventKind::Trim) {
            match EventBody::decode(EventKind::Trim, &e.payload) {
                Ok(EventBody::Trim(t)) => {
                    if self.pending.len() == PENDING_TRIMS_MAX {
                        self.pending.pop_front();
                    }
                    self.pending.push_back((e.offset, e.epoch, t.before));
                }
                Ok(_) | Err(_) => {
                    tracing::warn!(offset = %e.offset, "a Trim event whose body does not decode");
                }
            }
        }
    }

    /// The trim point to hand to the WAL now, if any: the highest `before` of a pending
    /// Trim event that is stabilized and still in the log (or among `fresh`, the events
    /// being submitted now), capped at `stable`.
    fn due(&mut self, log: &impl LogView, fresh: &[(Offset, Epoch)]) -> Option<Offset> {
        let stable = self.stable?;
        let mut best = None;
        while let Some(&(at, epoch, before)) = self.pending.front() {
            if at > stable {
                break;
            }
            self.pending.pop_front();
            // The event must still be the one at `at` (not replaced by a truncation).
            let fresh_here = fresh.contains(&(at, epoch));
            if fresh_here || log.entry_epoch(at) == Some(epoch) || at < log.first_offset() {
                best = best.max(Some(before.min(stable)));
            }
        }
        let point = best?;
        if point <= self.requested {
            return None;
        }
        self.requested = point;
        Some(point)
    }
}

/// The engine of one store. See the module docs.
#[derive(Debug)]
pub struct Engine<T> {
    replica: Replica,
    mutations: Mutations,
    waiters: VecDeque<Waiter<T>>,
    /// Sequence number of the latest submission (0: none yet).
    submitted: u64,
    /// Sequence number of the latest resolved submission.
    resolved: u64,
    retention: Retention,
    /// The tail-cut mark, reported in every grant until it is cleared.
    tail_cut: Option<TailCut>,
    /// A [`Command::ClearTailCut`] is out.
    clearing: bool,
    blocked: Option<Blocked<T>>,
    commands: Vec<Command<T>>,
}

impl<T> Engine<T> {
    /// The engine of a store in state `replica` (identity, role, durable promised epoch)
    /// carrying the tail-cut mark `tail_cut`.
    #[must_use]
    pub fn new(replica: Replica, tail_cut: Option<TailCut>, mutations: Mutations) -> Self {
        Engine {
            replica,
            mutations,
            waiters: VecDeque::new(),
            submitted: 0,
            resolved: 0,
            retention: Retention::default(),
            tail_cut,
            clearing: false,
            blocked: None,
            commands: Vec::new(),
        }
    }

    /// The replication state (promised epoch, HWM, identity, role).
    #[must_use]
    pub fn replica(&self) -> &Replica {
        &self.replica
    }

    /// The tail-cut mark, if the store carries one.
    #[must_use]
    pub fn tail_cut(&self) -> Option<TailCut> {
        self.tail_cut
    }

    /// Whether the engine waits for a [`Command::PersistPromise`] outcome (no request may
    /// be fed until then).
    #[must_use]
    pub fn is_blocked(&self) -> bool {
        self.blocked.is_some()
    }

    /// Submissions handed out and not yet resolved.
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.submitted - self.resolved
    }

    /// The commands produced so far, in order.
    pub fn take_commands(&mut self) -> Vec<Command<T>> {
        std::mem::take(&mut self.commands)
    }

    fn answer(&mut self, token: T, body: impl Into<Body>) {
        self.commands.push(Command::Answer {
            token,
            body: body.into(),
        });
    }

    /// `AppendRejected` with `reason`, the promised epoch and the accepted log's end.
    #[must_use]
    pub fn rejected(&self, reason: RejectReason, log: &impl StoreLog) -> AppendRejected {
        AppendRejected {
            reason,
            promised: self.replica.promised(),
            last: log.last(),
        }
    }

    fn assert_ready(&self) {
        assert!(
            self.blocked.is_none(),
            "invariant: no request is fed while the engine waits for a durable write"
        );
    }

    // ------------------------------------------------------------------ requests

    /// An append request.
    pub fn append(&mut self, token: T, req: AppendRequest, log: &impl StoreLog) {
        self.assert_ready();
        if log.is_failed() {
            let body = self.rejected(RejectReason::LogFailed, log);
            self.answer(token, body);
            return;
        }
        let plan = match self.replica.decide_append(&req, log) {
            AppendDecision::Accept(plan) => plan,
            AppendDecision::Reject(reason) => {
                tracing::debug!(epoch = %req.epoch, prev = ?req.prev, ?reason, "append rejected");
                let body = self.rejected(reason, log);
                self.answer(token, body);
                return;
            }
            AppendDecision::Invalid(problem) => {
                tracing::warn!(epoch = %req.epoch, %problem, "invalid append");
                self.answer(token, ErrorResponse::new(ErrorCode::Malformed, problem));
                return;
            }
        };
        if let Some(epoch) = plan.promise {
            self.commands.push(Command::PersistPromise(epoch));
            self.blocked = Some(Blocked::Append { token, req, plan });
            return;
        }
        self.accept(token, req, plan, log);
    }

    /// A fence request.
    pub fn fence(&mut self, token: T, req: FenceRequest, log: &impl StoreLog) {
        self.assert_ready();
        if let Some(offset) = log.corrupt_record() {
            // Not a vote: like a store that cannot be reached, it neither grants nor
            // raises its promise (docs/protocol.md, "Damaged records").
            tracing::warn!(epoch = %req.epoch, %offset, "fence refused: a record of this store's log is damaged");
            self.answer(
                token,
                ErrorResponse::corrupt(
                    offset,
                    "found by a read; this store grants no fence until it is repaired",
                ),
            );
            return;
        }
        match self.replica.decide_fence(&req) {
            FenceDecision::NotVoter => {
                let body = self.not_voter();
                self.answer(token, body);
            }
            FenceDecision::OtherIdentity if self.mutations.wiped_votes => {
                self.mutant_wiped_votes(token, req, log);
            }
            FenceDecision::OtherIdentity => {
                // Not a voter for this broker: it expects the identity this address had
                // before (a wiped disk), or its voter set names another store here. The
                // store stays a voter directory, so a voter-set change can name it later
                // (DESIGN.md "Store identity", "Membership changes").
                tracing::warn!(
                    expected = ?req.expected,
                    store_id = self.replica.store_id().0,
                    incarnation = self.replica.incarnation().0,
                    "a broker expects another store identity at this address: not a voter for it"
                );
                let body = self.not_voter();
                self.answer(token, body);
            }
            FenceDecision::Refuse => {
                let body = FenceRefused {
                    promised: self.replica.promised(),
                };
                self.answer(token, body);
            }
            FenceDecision::Grant { promise: None } => self.grant(token, req.epoch, log),
            FenceDecision::Grant {
                promise: Some(promise),
            } => {
                self.commands.push(Command::PersistPromise(promise));
                self.blocked = Some(Blocked::Fence {
                    token,
                    epoch: req.epoch,
                    promise,
                });
            }
        }
    }

    /// A heartbeat: learns the HWM (and trims what became stabilized), answers with the
    /// promised epoch and the accepted log's end.
    pub fn heartbeat(&mut self, token: T, hb: &Heartbeat, log: &impl StoreLog) {
        self.assert_ready();
        self.replica.learn_hwm(hb.epoch, hb.hwm);
        self.retain(hb.epoch, hb.hwm, log, &[]);
        let body = HeartbeatAck {
            epoch: self.replica.promised(),
            broker: BrokerId(0),
            last: log.last(),
        };
        self.answer(token, body);
    }

    /// A tail request: answered at once with the last durable entry.
    pub fn tail(&mut self, token: T, log: &impl StoreLog) {
        self.assert_ready();
        let body = TailResponse {
            last: log.last_durable(),
            promised: self.replica.promised(),
            hwm: self.replica.hwm(),
            store_id: self.replica.store_id(),
            incarnation: self.replica.incarnation(),
            voter: self.replica.role().is_voter(),
            first_offset: log.first_offset(),
        };
        self.answer(token, body);
    }

    // ------------------------------------------------------------------ completions

    /// The [`Command::PersistPromise`] outcome: `Err(reason)` if the promise could not be
    /// stored (the held request is answered `Internal`, nothing changes).
    ///
    /// # Panics
    /// If no promise was asked for.
    pub fn promise_persisted(&mut self, result: Result<(), String>, log: &impl StoreLog) {
        let blocked = self.blocked.take();
        let epoch = match &blocked {
            Some(Blocked::Append { plan, .. }) => {
                plan.promise.expect("invariant: a promise was asked")
            }
            Some(Blocked::Fence { promise, .. }) => *promise,
            _ => panic!("invariant: a promise outcome answers a PersistPromise"),
        };
        if let Err(e) = result {
            tracing::error!(error = %e, %epoch, "cannot store the promised epoch");
            let body = ErrorResponse::new(
                ErrorCode::Internal,
                format!("cannot store the promised epoch: {e}"),
            );
            if let Some(Blocked::Append { token, .. } | Blocked::Fence { token, .. }) = blocked {
                self.answer(token, body);
            }
            return;
        }
        self.replica.promise(epoch);
        match blocked {
            Some(Blocked::Append { token, req, plan }) => self.accept(token, req, plan, log),
            Some(Blocked::Fence { token, epoch, .. }) => {
                tracing::info!(%epoch, "fenced: appends below this epoch are refused from now on");
                self.grant(token, epoch, log);
            }
            _ => unreachable!(),
        }
    }

    /// Submission `seq` resolved: `durable` (covered by an fdatasync) or failed (the log
    /// failed; fail-stop). Submissions resolve in order.
    ///
    /// # Panics
    /// If `seq` is not the next submission to resolve.
    pub fn resolved(&mut self, seq: u64, durable: bool, log: &impl StoreLog) {
        assert!(
            seq == self.resolved + 1 && seq <= self.submitted,
            "invariant: submissions resolve in order (resolved {}, submitted {}, got {seq})",
            self.resolved,
            self.submitted
        );
        self.resolved = seq;
        if !durable {
            tracing::error!(
                seq,
                "WAL append failed: the log is failed and takes no more appends"
            );
        }
        while self.waiters.front().is_some_and(|w| w.needed() <= seq) {
            let w = self.waiters.pop_front().expect("invariant: front exists");
            self.finish(w, durable, log);
        }
        self.check_tail_cut(log);
    }

    /// The WAL refused submission `seq` at once (nothing of it is written, or only a part
    /// the master resends): the append waiting on it is answered `body` now. The driver
    /// still reports `seq` resolved, in order.
    pub fn refused(&mut self, seq: u64, body: Body) {
        let at = self
            .waiters
            .iter()
            .rposition(|w| w.needed() == seq && matches!(w, Waiter::Persisted { .. }));
        // Only the append that made submission `seq` waits on it as a Persisted waiter
        // created right after it; fences tagged `seq` keep waiting.
        if let Some(i) = at {
            if let Some(Waiter::Persisted { token, .. }) = self.waiters.remove(i) {
                self.answer(token, body);
            }
        }
    }

    /// The [`Command::ClearTailCut`] outcome: `true` if the mark is gone from disk; a
    /// failure keeps it (the safe side) and a later completion retries.
    pub fn tail_cut_cleared(&mut self, cleared: bool) {
        self.clearing = false;
        if cleared {
            self.tail_cut = None;
        }
    }

    // ------------------------------------------------------------------ internals

    fn accept(&mut self, token: T, req: AppendRequest, plan: AcceptPlan, log: &impl StoreLog) {
        if let Some(through) = plan.through {
            self.retention.matched = Some((req.epoch, through));
        }
        self.retention.note(&req.events);
        let (epoch, hwm) = (req.epoch, req.hwm);
        self.replica.learn_hwm(epoch, hwm);
        let mut through = plan.through;
        if self.mutations.through_end {
            // MUTANT (test-only): ack the store's own accepted log end (after this append).
            let end = match plan.write_from {
                Some(_) => req.events.last().map(|e| e.offset),
                None => log.last().map(|l| l.offset),
            };
            through = end;
        }
        let Some(from) = plan.write_from else {
            // Everything is present already: answer once the accepted log is durable.
            self.wait(
                Waiter::Persisted {
                    needed: self.submitted,
                    token,
                    epoch,
                    through,
                },
                log,
            );
            self.retain(epoch, hwm, log, &[]);
            return;
        };
        if plan.truncates {
            tracing::info!(
                epoch = %epoch,
                from = %req.events[from].offset,
                "truncating the log's suffix for a higher epoch"
            );
        }
        let events: Vec<Event> = req.events.into_iter().skip(from).collect();
        let fresh: Vec<(Offset, Epoch)> = events
            .iter()
            .filter(|e| e.kind == EventKind::Trim)
            .map(|e| (e.offset, e.epoch))
            .collect();
        self.submitted += 1;
        let seq = self.submitted;
        self.commands.push(Command::Submit {
            seq,
            epoch,
            events,
            truncates: plan.truncates,
        });
        self.wait(
            Waiter::Persisted {
                needed: seq,
                token,
                epoch,
                through,
            },
            log,
        );
        // After the submission, so a Trim event in this very append counts as in the log.
        self.retain(epoch, hwm, log, &fresh);
    }

    fn grant(&mut self, token: T, epoch: Epoch, log: &impl StoreLog) {
        self.wait(
            Waiter::Fence {
                needed: self.submitted,
                token,
                epoch,
                last: log.last(),
                tail_cut: self.tail_cut,
            },
            log,
        );
    }

    /// Queues `waiter`, or answers it now if its submission resolved.
    fn wait(&mut self, waiter: Waiter<T>, log: &impl StoreLog) {
        debug_assert!(self
            .waiters
            .back()
            .is_none_or(|w| w.needed() <= waiter.needed()));
        if waiter.needed() <= self.resolved {
            self.finish(waiter, true, log);
        } else {
            self.waiters.push_back(waiter);
        }
    }

    /// Answers a waiter whose submission resolved.
    fn finish(&mut self, waiter: Waiter<T>, durable: bool, log: &impl StoreLog) {
        match waiter {
            Waiter::Persisted {
                token,
                epoch,
                through,
                ..
            } => {
                if durable {
                    let body = PersistedAck {
                        epoch,
                        through_offset: through,
                        store_id: self.replica.store_id(),
                        incarnation: self.replica.incarnation(),
                        voter: self.replica.role().is_voter(),
                        corrupt: log.corrupt_record(),
                    };
                    self.answer(token, body);
                } else {
                    let body = self.rejected(RejectReason::LogFailed, log);
                    self.answer(token, body);
                }
            }
            Waiter::Fence {
                token,
                epoch,
                last,
                tail_cut,
                ..
            } => {
                let last = if durable { last } else { log.last_durable() };
                let body = FenceGranted {
                    epoch,
                    last,
                    store_id: self.replica.store_id(),
                    incarnation: self.replica.incarnation(),
                    tail_cut,
                };
                self.answer(token, body);
            }
        }
    }

    /// The wiped-votes mutation (test-only, see [`Mutations::wiped_votes`]): a fence that
    /// expects another identity.
    fn mutant_wiped_votes(&mut self, token: T, req: FenceRequest, log: &impl StoreLog) {
        let caught_up = self
            .replica
            .hwm()
            .is_none_or(|h| log.last_durable().is_some_and(|l| l.offset >= h));
        match req.expected {
            Some((store_id, incarnation)) if caught_up => {
                // MUTANT (test-only): vote again under the identity the broker expects.
                let (promised, hwm) = (self.replica.promised(), self.replica.hwm());
                self.replica = Replica::new(store_id, incarnation, Role::Voter, promised);
                self.replica.learn_hwm(promised, hwm);
                self.fence(token, req, log);
            }
            _ => {
                let body = self.not_voter();
                self.answer(token, body);
            }
        }
    }

    fn not_voter(&self) -> ErrorResponse {
        ErrorResponse::not_voter(self.replica.store_id(), self.replica.incarnation())
    }

    /// Retention: learns what is stabilized from the HWM of a master of `epoch` and trims
    /// the log if a Trim event became stabilized.
    fn retain(
        &mut self,
        epoch: Epoch,
        hwm: Option<Offset>,
        log: &impl LogView,
        fresh: &[(Offset, Epoch)],
    ) {
        let learned = self.retention.learn(epoch, hwm);
        if self.mutations.trim_unstabilized {
            let r = &mut self.retention;
            r.stable = r.stable.max(r.matched.map(|(_, through)| through));
        } else if !learned {
            return;
        }
        if let Some(before) = self.retention.due(log, fresh) {
            self.commands.push(Command::Trim { before });
        }
    }

    /// Asks to clear the tail-cut mark once the durable log holds an entry of an epoch
    /// above the promised epoch at the cut (`crate::tail_cut::clears`).
    fn check_tail_cut(&mut self, log: &impl StoreLog) {
        let Some(cut) = self.tail_cut else {
            return;
        };
        if self.clearing || !crate::tail_cut::clears(cut, log.last_durable().map(|l| l.epoch)) {
            return;
        }
        self.clearing = true;
        self.commands.push(Command::ClearTailCut(cut));
    }
}

#[cfg(test)]
mod tests {
    use quire_proto::{Incarnation, StoreId};

    use super::*;
    use crate::replica::tests::append;

    /// An in-memory log: accepted entry epochs, how many are durable, failed or not.
    #[derive(Default)]
    struct MemLog {
        epochs: Vec<u64>,
        durable: usize,
        failed: bool,
        corrupt: Option<Offset>,
    }

    impl LogView for MemLog {
        fn entry_epoch(&self, offset: Offset) -> Option<Epoch> {
            self.epochs
                .get(usize::try_from(offset.0).ok()?)
                .map(|&e| Epoch(e))
        }
        fn last(&self) -> Option<LogPosition> {
            pos(&self.epochs)
        }
        fn first_offset(&self) -> Offset {
            Offset::ZERO
        }
    }

    impl StoreLog for MemLog {
        fn last_durable(&self) -> Option<LogPosition> {
            pos(&self.epochs[..self.durable])
        }
        fn is_failed(&self) -> bool {
            self.failed
        }
        fn corrupt_record(&self) -> Option<Offset> {
            self.corrupt
        }
    }

    fn pos(epochs: &[u64]) -> Option<LogPosition> {
        epochs.last().map(|&e| LogPosition {
            epoch: Epoch(e),
            offset: Offset(epochs.len() as u64 - 1),
        })
    }

    fn engine(promised: u64) -> Engine<u32> {
        mutant(promised, Mutations::default())
    }

    /// A voter's engine with `mutations` switched on.
    fn mutant(promised: u64, mutations: Mutations) -> Engine<u32> {
        Engine::new(
            Replica::new(StoreId(1), Incarnation(1), Role::Voter, Epoch(promised)),
            None,
            mutations,
        )
    }

    fn fence(epoch: u64) -> FenceRequest {
        FenceRequest {
            epoch: Epoch(epoch),
            expected: None,
        }
    }

    /// Executes the Submit commands on `log` (accepted, not durable) and returns the other
    /// commands.
    fn run(e: &mut Engine<u32>, log: &mut MemLog) -> Vec<Command<u32>> {
        let mut rest = Vec::new();
        for c in e.take_commands() {
            match c {
                Command::Submit { events, .. } => {
                    let first = usize::try_from(events[0].offset.0).expect("small");
                    log.epochs.truncate(first);
                    log.epochs.extend(events.iter().map(|ev| ev.epoch.0));
                }
                c => rest.push(c),
            }
        }
        rest
    }

    fn answers(cs: &[Command<u32>]) -> Vec<(u32, &Body)> {
        cs.iter()
            .filter_map(|c| match c {
                Command::Answer { token, body } => Some((*token, body)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_fence_above_the_promise_is_granted_after_the_promise_is_durable() {
        let mut e = engine(3);
        let log = MemLog::default();
        e.fence(1, fence(5), &log);
        assert_eq!(e.take_commands(), vec![Command::PersistPromise(Epoch(5))]);
        assert!(e.is_blocked());
        e.promise_persisted(Ok(()), &log);
        assert_eq!(e.replica().promised(), Epoch(5));
        let cs = e.take_commands();
        assert!(matches!(
            answers(&cs)[..],
            [(
                1,
                Body::FenceGranted(FenceGranted {
                    epoch: Epoch(5),
                    last: None,
                    ..
                })
            )]
        ));
        // The same epoch again is granted without a new promise; a lower one is refused.
        e.fence(2, fence(5), &log);
        let cs = e.take_commands();
        assert!(matches!(answers(&cs)[..], [(2, Body::FenceGranted(_))]));
        e.fence(3, fence(4), &log);
        let cs = e.take_commands();
        assert!(matches!(
            answers(&cs)[..],
            [(3, Body::FenceRefused(FenceRefused { promised: Epoch(5) }))]
        ));
    }

    /// A store whose reads found a damaged record does not vote: a fence, even above its
    /// promise, is answered `Corrupt` naming the record, and the promise stays; once the
    /// record is no longer known damaged, fences are granted again.
    #[test]
    fn a_store_with_a_damaged_record_grants_no_fence() {
        let mut e = engine(3);
        let mut log = MemLog {
            epochs: vec![1, 1, 1],
            durable: 3,
            corrupt: Some(Offset(1)),
            ..MemLog::default()
        };
        e.fence(1, fence(5), &log);
        let cs = e.take_commands();
        match answers(&cs)[..] {
            [(1, Body::ErrorResponse(r))] => {
                assert_eq!(r.code, ErrorCode::Corrupt);
                assert_eq!(
                    r.detail,
                    quire_proto::ErrorDetail::Corrupt { offset: Offset(1) }
                );
            }
            ref other => panic!("expected Corrupt, got {other:?}"),
        }
        assert!(!e.is_blocked());
        assert_eq!(e.replica().promised(), Epoch(3));
        log.corrupt = None;
        e.fence(2, fence(5), &log);
        assert_eq!(e.take_commands(), vec![Command::PersistPromise(Epoch(5))]);
    }

    #[test]
    fn a_promise_that_cannot_be_stored_answers_internal_and_changes_nothing() {
        let mut e = engine(1);
        let log = MemLog::default();
        e.append(7, append(2, None, &[2]), &log);
        assert_eq!(e.take_commands(), vec![Command::PersistPromise(Epoch(2))]);
        e.promise_persisted(Err("disk full".into()), &log);
        let cs = e.take_commands();
        assert!(matches!(
            answers(&cs)[..],
            [(
                7,
                Body::ErrorResponse(ErrorResponse {
                    code: ErrorCode::Internal,
                    ..
                })
            )]
        ));
        assert_eq!(e.replica().promised(), Epoch(1));
        assert_eq!(e.in_flight(), 0);
    }

    #[test]
    fn a_higher_epochs_write_comes_after_its_durable_promise() {
        let mut e = engine(1);
        let mut log = MemLog::default();
        e.append(1, append(2, None, &[2, 2]), &log);
        // Nothing is submitted before the promise is persisted.
        assert_eq!(e.take_commands(), vec![Command::PersistPromise(Epoch(2))]);
        e.promise_persisted(Ok(()), &log);
        let cs = e.take_commands();
        assert!(matches!(
            &cs[..],
            [Command::Submit { seq: 1, epoch: Epoch(2), truncates: false, events }] if events.len() == 2
        ));
        run(&mut e, &mut log);
        e.fence(2, fence(2), &log);
        assert!(
            run(&mut e, &mut log).is_empty(),
            "the grant waits for the write"
        );
    }

    #[test]
    fn group_commit_waiters_are_answered_only_once_their_submission_is_durable() {
        let mut e = engine(1);
        let mut log = MemLog::default();
        e.append(1, append(1, None, &[1]), &log);
        assert!(
            run(&mut e, &mut log).is_empty(),
            "no answer before durability"
        );
        e.append(2, append(1, Some((1, 0)), &[1]), &log);
        assert!(run(&mut e, &mut log).is_empty());
        assert_eq!(e.in_flight(), 2);
        log.durable = 1;
        e.resolved(1, true, &log);
        let cs = run(&mut e, &mut log);
        assert!(matches!(
            answers(&cs)[..],
            [(
                1,
                Body::PersistedAck(PersistedAck {
                    through_offset: Some(Offset(0)),
                    ..
                })
            )]
        ));
        log.durable = 2;
        e.resolved(2, true, &log);
        let cs = run(&mut e, &mut log);
        assert!(matches!(
            answers(&cs)[..],
            [(
                2,
                Body::PersistedAck(PersistedAck {
                    through_offset: Some(Offset(1)),
                    ..
                })
            )]
        ));
    }

    #[test]
    fn an_append_already_present_waits_for_the_latest_submission() {
        let mut e = engine(1);
        let mut log = MemLog::default();
        e.append(1, append(1, None, &[1, 1]), &log);
        run(&mut e, &mut log);
        // A resend of offset 0 only: present already, but the log is not durable yet.
        e.append(2, append(1, None, &[1]), &log);
        assert!(
            run(&mut e, &mut log).is_empty(),
            "no new submission, no answer"
        );
        assert_eq!(e.in_flight(), 1);
        log.durable = 2;
        e.resolved(1, true, &log);
        let cs = run(&mut e, &mut log);
        let tokens: Vec<u32> = answers(&cs).iter().map(|a| a.0).collect();
        assert_eq!(tokens, vec![1, 2]);
        // Nothing in flight: a present-already append is answered at once.
        e.append(3, append(1, None, &[1]), &log);
        let cs = run(&mut e, &mut log);
        assert!(matches!(
            answers(&cs)[..],
            [(
                3,
                Body::PersistedAck(PersistedAck {
                    through_offset: Some(Offset(0)),
                    ..
                })
            )]
        ));
    }

    #[test]
    fn a_failed_submission_fails_its_appends_and_grants_fences_with_the_durable_end() {
        let mut e = engine(1);
        let mut log = MemLog::default();
        e.append(1, append(1, None, &[1]), &log);
        run(&mut e, &mut log);
        log.durable = 1;
        e.resolved(1, true, &log);
        run(&mut e, &mut log);
        e.append(2, append(1, Some((1, 0)), &[1]), &log);
        run(&mut e, &mut log);
        e.fence(3, fence(1), &log);
        assert!(
            run(&mut e, &mut log).is_empty(),
            "the grant waits for submission 2"
        );
        // The WAL fails: its accepted view falls back to the durable one.
        log.failed = true;
        log.epochs.truncate(1);
        e.resolved(2, false, &log);
        let cs = run(&mut e, &mut log);
        let a = answers(&cs);
        assert!(matches!(
            a[0],
            (
                2,
                Body::AppendRejected(AppendRejected {
                    reason: RejectReason::LogFailed,
                    ..
                })
            )
        ));
        let (3, Body::FenceGranted(g)) = a[1] else {
            panic!("{a:?}")
        };
        assert_eq!(g.last, pos(&[1]));
        // Every later append is refused LogFailed at once.
        e.append(4, append(1, Some((1, 0)), &[1]), &log);
        let cs = run(&mut e, &mut log);
        assert!(matches!(
            answers(&cs)[..],
            [(
                4,
                Body::AppendRejected(AppendRejected {
                    reason: RejectReason::LogFailed,
                    ..
                })
            )]
        ));
    }

    #[test]
    fn appends_below_the_promise_or_off_the_log_are_rejected() {
        let mut e = engine(2);
        let mut log = MemLog::default();
        e.append(1, append(1, None, &[1]), &log);
        e.append(2, append(2, Some((2, 5)), &[2]), &log);
        let cs = run(&mut e, &mut log);
        assert!(matches!(
            answers(&cs)[..],
            [
                (
                    1,
                    Body::AppendRejected(AppendRejected {
                        reason: RejectReason::StaleEpoch,
                        promised: Epoch(2),
                        ..
                    })
                ),
                (
                    2,
                    Body::AppendRejected(AppendRejected {
                        reason: RejectReason::LogMismatch,
                        ..
                    })
                ),
            ]
        ));
    }

    #[test]
    fn heartbeats_and_tails_are_answered_at_once() {
        let mut e = engine(1);
        let mut log = MemLog::default();
        e.append(1, append(1, None, &[1, 1]), &log);
        run(&mut e, &mut log);
        log.durable = 1;
        let hb = Heartbeat {
            epoch: Epoch(1),
            hwm: Some(Offset(0)),
            master: BrokerId(1),
        };
        e.heartbeat(2, &hb, &log);
        e.tail(3, &log);
        let cs = run(&mut e, &mut log);
        let a = answers(&cs);
        assert!(matches!(a[0], (2, Body::HeartbeatAck(h)) if h.last == pos(&[1, 1])));
        let (3, Body::TailResponse(t)) = a[1] else {
            panic!("{a:?}")
        };
        assert_eq!(t.last, pos(&[1]), "a tail names the durable end");
        assert_eq!(t.hwm, Some(Offset(0)));
    }

    #[test]
    fn a_stabilized_trim_event_trims_the_log() {
        let mut e = engine(1);
        let mut log = MemLog::default();
        let mut req = append(1, None, &[1, 1, 1]);
        let trim = EventBody::Trim(quire_proto::TrimEvent::plain(Offset(2)));
        let mut payload = bytes::BytesMut::new();
        trim.encode(&mut payload).expect("encodes");
        req.events[1].kind = EventKind::Trim;
        req.events[1].payload = payload.freeze().into();
        e.append(1, req, &log);
        run(&mut e, &mut log);
        log.durable = 3;
        e.resolved(1, true, &log);
        run(&mut e, &mut log);
        // The HWM reaches the Trim event at offset 1: trim below 2 (its point, under the HWM
        // cap of 2).
        let hb = Heartbeat {
            epoch: Epoch(1),
            hwm: Some(Offset(2)),
            master: BrokerId(1),
        };
        e.heartbeat(2, &hb, &log);
        let cs = run(&mut e, &mut log);
        assert_eq!(cs[0], Command::Trim { before: Offset(2) });
    }

    #[test]
    fn the_trim_unstabilized_mutation_trims_before_the_hwm_covers_the_trim_event() {
        let trim_append = || {
            let mut req = append(1, None, &[1, 1, 1]);
            let trim = EventBody::Trim(quire_proto::TrimEvent::plain(Offset(1)));
            let mut payload = bytes::BytesMut::new();
            trim.encode(&mut payload).expect("encodes");
            req.events[2].kind = EventKind::Trim;
            req.events[2].payload = payload.freeze().into();
            req
        };
        // With every rule on, no HWM has covered the Trim event: nothing is trimmed.
        let mut e = engine(1);
        let mut log = MemLog::default();
        e.append(1, trim_append(), &log);
        let cs = run(&mut e, &mut log);
        assert!(
            !cs.iter().any(|c| matches!(c, Command::Trim { .. })),
            "{cs:?}"
        );
        // The mutant trims as it accepts the append.
        let mut e = mutant(
            1,
            Mutations {
                trim_unstabilized: true,
                ..Mutations::default()
            },
        );
        let mut log = MemLog::default();
        e.append(1, trim_append(), &log);
        let cs = run(&mut e, &mut log);
        assert!(cs.contains(&Command::Trim { before: Offset(1) }), "{cs:?}");
    }

    #[test]
    fn the_through_end_mutation_acks_the_log_end() {
        let mut e = mutant(
            1,
            Mutations {
                through_end: true,
                ..Mutations::default()
            },
        );
        let mut log = MemLog::default();
        e.append(1, append(1, None, &[1, 1, 1]), &log);
        run(&mut e, &mut log);
        log.durable = 3;
        e.resolved(1, true, &log);
        run(&mut e, &mut log);
        e.append(2, append(1, None, &[1]), &log);
        let cs = run(&mut e, &mut log);
        assert!(matches!(
            answers(&cs)[..],
            [(
                2,
                Body::PersistedAck(PersistedAck {
                    through_offset: Some(Offset(2)),
                    ..
                })
            )]
        ));
    }

    #[test]
    fn the_wiped_votes_mutation_votes_under_the_expected_identity_once_caught_up() {
        let expected = Some((StoreId(7), Incarnation(7)));
        let other = |epoch| FenceRequest {
            epoch: Epoch(epoch),
            expected,
        };
        // Every rule on: a fence that expects another identity is answered "not a voter",
        // and the store stays a voter directory (a voter-set change may name it later).
        let mut e = engine(1);
        let log = MemLog::default();
        e.fence(1, other(2), &log);
        assert!(
            matches!(
                &e.take_commands()[..],
                [Command::Answer { body: Body::ErrorResponse(r), .. }] if r.code == ErrorCode::NotVoter
            ),
            "not a voter"
        );
        let mine = FenceRequest {
            epoch: Epoch(3),
            expected: Some((StoreId(1), Incarnation(1))),
        };
        e.fence(2, mine, &log);
        assert_eq!(e.take_commands(), vec![Command::PersistPromise(Epoch(3))]);

        let mut e = mutant(
            1,
            Mutations {
                wiped_votes: true,
                ..Mutations::default()
            },
        );
        let mut log = MemLog::default();
        // It heard an HWM its empty log does not reach: "not a voter", no learner role.
        let hb = Heartbeat {
            epoch: Epoch(1),
            hwm: Some(Offset(0)),
            master: BrokerId(1),
        };
        e.heartbeat(1, &hb, &log);
        e.fence(2, other(2), &log);
        let cs = run(&mut e, &mut log);
        assert!(matches!(
            answers(&cs)[..],
            [
                (1, Body::HeartbeatAck(_)),
                (
                    2,
                    Body::ErrorResponse(ErrorResponse {
                        code: ErrorCode::NotVoter,
                        ..
                    })
                )
            ]
        ));
        assert_eq!(e.replica().role(), Role::Voter);
        // Caught up: it takes the expected identity on and grants the fence under it.
        e.append(3, append(1, None, &[1]), &log);
        run(&mut e, &mut log);
        log.durable = 1;
        e.resolved(1, true, &log);
        run(&mut e, &mut log);
        e.fence(4, other(2), &log);
        assert_eq!(e.take_commands(), vec![Command::PersistPromise(Epoch(2))]);
        e.promise_persisted(Ok(()), &log);
        let cs = e.take_commands();
        let [(4, Body::FenceGranted(g))] = answers(&cs)[..] else {
            panic!("{cs:?}")
        };
        assert_eq!((g.store_id, g.incarnation), (StoreId(7), Incarnation(7)));
        assert_eq!(g.last, pos(&[1]));
    }
}
