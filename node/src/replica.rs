//! The store's replication rules as a pure state machine: what to do with an append, a
//! fence or a heartbeat, given the promised epoch, the store's role and its accepted log.
//! No I/O here; [`crate::store`] carries the decisions out (durable promise first, then
//! the WAL) and answers.
//!
//! The rules (DESIGN.md "Replication protocol", docs/protocol.md):
//!
//! - **Append** `{epoch, prev, events}`: refused with `StaleEpoch` if `epoch < promised`;
//!   refused with `LogMismatch` unless the accepted log holds `prev` (same epoch at
//!   `prev.offset`; `prev = None` means the events start the log at offset 0). Otherwise
//!   accepted: events whose offset already holds an entry of the same epoch are kept, the
//!   log is truncated from the first offset whose epoch differs, and the rest is appended.
//!   `promised` rises to `epoch` first (durably) when `epoch > promised`. The ack names
//!   `prev.offset + events.len()`, never the store's own log end.
//! - **Fence** `{epoch, expected}`: a learner answers `NotVoter`; a store whose identity
//!   differs from `expected` answers `NotVoter` to that fence (it stays a voter directory:
//!   a voter-set change may name it); otherwise
//!   granted when `epoch > promised` (promise it durably) or `epoch == promised` (the same
//!   takeover asking again), refused below.
//! - **HWM**: learned from heartbeats and appends whose epoch is at least `promised`; the
//!   highest one is kept.
//!
//! Log matching is decided against the **accepted** log (entries queued to the WAL, durable
//! or not), so several pipelined appends from one master chain onto each other.

use quire_proto::{
    AppendRequest, Epoch, FenceRequest, Incarnation, LogPosition, Offset, RejectReason, StoreId,
};

use crate::identity::Role;

/// The store's log as the decision rules see it: the accepted entries (durable or queued).
pub trait LogView {
    /// Epoch of the accepted entry at `offset`, or `None` if there is none (past the end,
    /// or trimmed below the start).
    fn entry_epoch(&self, offset: Offset) -> Option<Epoch>;
    /// The last accepted entry, `None` for an empty log.
    fn last(&self) -> Option<LogPosition>;
    /// The lowest offset the log still holds (entries below were trimmed, which only
    /// happens to stabilized entries).
    fn first_offset(&self) -> Offset;
}

impl<S: quire_wal::Storage> LogView for quire_wal::Wal<S> {
    fn entry_epoch(&self, offset: Offset) -> Option<Epoch> {
        quire_wal::Wal::entry_epoch(self, offset)
    }
    fn last(&self) -> Option<LogPosition> {
        quire_wal::Wal::last(self)
    }
    fn first_offset(&self) -> Offset {
        quire_wal::Wal::first_offset(self)
    }
}

/// What to do with an append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppendDecision {
    /// Answer `AppendRejected` with this reason (and the store's promised epoch and last
    /// entry).
    Reject(RejectReason),
    /// The append breaks the protocol (an event epoch above the append's, epochs going
    /// down, a conflict with an entry of the master's own epoch): answer an
    /// `ErrorResponse` `Malformed` and change nothing.
    Invalid(String),
    /// Accept it.
    Accept(AcceptPlan),
}

/// How to carry out an accepted append.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AcceptPlan {
    /// Raise the promised epoch to this, durably, before anything else.
    pub promise: Option<Epoch>,
    /// Index of the first event to write (`None`: every event is already present with
    /// the same epoch; answer once the accepted log is durable).
    pub write_from: Option<usize>,
    /// Whether writing from `write_from` replaces entries (a truncation).
    pub truncates: bool,
    /// The offset to ack: `prev.offset + events.len()`.
    pub through: Option<Offset>,
}

/// What to do with a fence.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FenceDecision {
    /// Grant, after raising the promised epoch to `promise` durably (if `Some`) and after
    /// every accepted append is durable.
    Grant {
        /// The new promised epoch (`None`: the same epoch asked again).
        promise: Option<Epoch>,
    },
    /// Refuse: a higher epoch is promised.
    Refuse,
    /// The store is a learner: answer `NotVoter`.
    NotVoter,
    /// The fencing broker expects another identity at this address: answer `NotVoter` to
    /// this fence and record nothing (a voter set may name this store later).
    OtherIdentity,
}

/// The replication state of one store. See the module docs.
#[derive(Clone, Debug)]
pub struct Replica {
    store_id: StoreId,
    incarnation: Incarnation,
    role: Role,
    promised: Epoch,
    hwm: Option<Offset>,
}

impl Replica {
    /// The state of a store with this identity and durable promised epoch, no HWM heard.
    #[must_use]
    pub fn new(store_id: StoreId, incarnation: Incarnation, role: Role, promised: Epoch) -> Self {
        Replica {
            store_id,
            incarnation,
            role,
            promised,
            hwm: None,
        }
    }

    /// The store's identity.
    #[must_use]
    pub fn store_id(&self) -> StoreId {
        self.store_id
    }

    /// The store's incarnation.
    #[must_use]
    pub fn incarnation(&self) -> Incarnation {
        self.incarnation
    }

    /// Voter or learner.
    #[must_use]
    pub fn role(&self) -> Role {
        self.role
    }

    /// The promised epoch (durable).
    #[must_use]
    pub fn promised(&self) -> Epoch {
        self.promised
    }

    /// The highest HWM heard from a master of epoch `>= promised`.
    #[must_use]
    pub fn hwm(&self) -> Option<Offset> {
        self.hwm
    }

    /// Decides an append against the accepted log `log`. Pure.
    pub fn decide_append(&self, req: &AppendRequest, log: &impl LogView) -> AppendDecision {
        if req.epoch < self.promised {
            return AppendDecision::Reject(RejectReason::StaleEpoch);
        }
        if let Err(problem) = check_epochs(req) {
            return AppendDecision::Invalid(problem);
        }
        let start = log.first_offset();
        if let Some(prev) = req.prev {
            // Below the start: trimmed, hence stabilized, hence the same on every log.
            let matches = prev.offset < start || log.entry_epoch(prev.offset) == Some(prev.epoch);
            if !matches {
                return AppendDecision::Reject(RejectReason::LogMismatch);
            }
        }
        let Some(first) = req.first_offset() else {
            return AppendDecision::Invalid("prev.offset is u64::MAX".into());
        };
        let mut write_from = None;
        let mut truncates = false;
        for (i, event) in req.events.iter().enumerate() {
            let offset = Offset(first.0 + i as u64);
            if offset < start {
                continue;
            }
            match log.entry_epoch(offset) {
                Some(e) if e == event.epoch => continue,
                Some(e) => {
                    if e >= req.epoch {
                        return AppendDecision::Invalid(format!(
                            "event at offset {offset} has epoch {} but the store holds an entry of epoch {e} there, not below the append's epoch {}",
                            event.epoch, req.epoch
                        ));
                    }
                    truncates = true;
                }
                None => {}
            }
            write_from = Some(i);
            break;
        }
        AppendDecision::Accept(AcceptPlan {
            promise: (req.epoch > self.promised).then_some(req.epoch),
            write_from,
            truncates,
            through: req.through_offset(),
        })
    }

    /// Decides a fence. Pure.
    #[must_use]
    pub fn decide_fence(&self, req: &FenceRequest) -> FenceDecision {
        if self.role == Role::Learner {
            return FenceDecision::NotVoter;
        }
        if let Some(expected) = req.expected {
            if expected != (self.store_id, self.incarnation) {
                return FenceDecision::OtherIdentity;
            }
        }
        if req.epoch > self.promised {
            FenceDecision::Grant {
                promise: Some(req.epoch),
            }
        } else if req.epoch == self.promised {
            FenceDecision::Grant { promise: None }
        } else {
            FenceDecision::Refuse
        }
    }

    /// Records that `epoch` is now durably promised.
    ///
    /// # Panics
    /// If `epoch` is below the promised epoch (an epoch never goes down).
    pub fn promise(&mut self, epoch: Epoch) {
        assert!(
            epoch >= self.promised,
            "promised epoch would go down from {} to {epoch}",
            self.promised
        );
        self.promised = epoch;
    }

    /// Learns `hwm` from a master of `epoch` (heartbeat or append): kept if `epoch >=
    /// promised` and it is higher than what was heard. Returns whether it changed.
    pub fn learn_hwm(&mut self, epoch: Epoch, hwm: Option<Offset>) -> bool {
        match hwm {
            Some(h) if epoch >= self.promised && self.hwm.is_none_or(|old| h > old) => {
                self.hwm = Some(h);
                true
            }
            _ => false,
        }
    }
}

/// Event epochs never exceed the append's epoch and never go down (starting from
/// `prev.epoch`).
fn check_epochs(req: &AppendRequest) -> Result<(), String> {
    let mut floor = req.prev.map_or(Epoch::ZERO, |p| p.epoch);
    if floor > req.epoch {
        return Err(format!(
            "prev epoch {floor} is above the append's epoch {}",
            req.epoch
        ));
    }
    for e in &req.events {
        if e.epoch > req.epoch {
            return Err(format!(
                "event at offset {} has epoch {}, above the append's epoch {}",
                e.offset, e.epoch, req.epoch
            ));
        }
        if e.epoch < floor {
            return Err(format!(
                "event at offset {} has epoch {}, below the epoch {floor} before it",
                e.offset, e.epoch
            ));
        }
        floor = e.epoch;
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use bytes::Bytes;
    use quire_proto::{Event, EventKind};

    /// A log as a plain vector of entry epochs from `start`.
    struct VecLog {
        start: u64,
        epochs: Vec<u64>,
    }

    impl VecLog {
        fn new(epochs: &[u64]) -> VecLog {
            VecLog {
                start: 0,
                epochs: epochs.to_vec(),
            }
        }
    }

    impl LogView for VecLog {
        fn entry_epoch(&self, offset: Offset) -> Option<Epoch> {
            let i = offset.0.checked_sub(self.start)?;
            self.epochs
                .get(usize::try_from(i).ok()?)
                .copied()
                .map(Epoch)
        }
        fn last(&self) -> Option<LogPosition> {
            let e = *self.epochs.last()?;
            Some(LogPosition {
                epoch: Epoch(e),
                offset: Offset(self.start + self.epochs.len() as u64 - 1),
            })
        }
        fn first_offset(&self) -> Offset {
            Offset(self.start)
        }
    }

    /// An append of one-byte message events with the given epochs, after `prev` (epoch, offset).
    pub(crate) fn append(
        epoch: u64,
        prev: Option<(u64, u64)>,
        event_epochs: &[u64],
    ) -> AppendRequest {
        let first = prev.map_or(0, |(_, o)| o + 1);
        AppendRequest {
            epoch: Epoch(epoch),
            prev: prev.map(|(e, o)| LogPosition {
                epoch: Epoch(e),
                offset: Offset(o),
            }),
            events: event_epochs
                .iter()
                .enumerate()
                .map(|(i, &e)| Event {
                    epoch: Epoch(e),
                    offset: Offset(first + i as u64),
                    kind: EventKind::Message,
                    payload: Bytes::from_static(b"x").into(),
                })
                .collect(),
            hwm: None,
        }
    }

    fn replica(promised: u64) -> Replica {
        Replica::new(StoreId(1), Incarnation(2), Role::Voter, Epoch(promised))
    }

    fn accept(
        promise: Option<u64>,
        write_from: Option<usize>,
        truncates: bool,
        through: Option<u64>,
    ) -> AppendDecision {
        AppendDecision::Accept(AcceptPlan {
            promise: promise.map(Epoch),
            write_from,
            truncates,
            through: through.map(Offset),
        })
    }

    #[test]
    fn first_append_starts_the_log_and_raises_the_promise() {
        let r = replica(0);
        let log = VecLog::new(&[]);
        assert_eq!(
            r.decide_append(&append(5, None, &[5, 5, 5]), &log),
            accept(Some(5), Some(0), false, Some(2))
        );
        // The same epoch as promised: no new promise.
        assert_eq!(
            replica(5).decide_append(&append(5, None, &[5]), &log),
            accept(None, Some(0), false, Some(0))
        );
    }

    #[test]
    fn stale_epochs_are_rejected_before_anything_else() {
        let r = replica(7);
        let log = VecLog::new(&[5, 5]);
        assert_eq!(
            r.decide_append(&append(6, Some((5, 1)), &[6]), &log),
            AppendDecision::Reject(RejectReason::StaleEpoch)
        );
        // Even a well-matching one.
        assert_eq!(
            r.decide_append(&append(5, Some((5, 1)), &[5]), &log),
            AppendDecision::Reject(RejectReason::StaleEpoch)
        );
    }

    #[test]
    fn prev_must_match_the_accepted_log() {
        let r = replica(5);
        let log = VecLog::new(&[3, 3, 5]);
        // Past the end.
        assert_eq!(
            r.decide_append(&append(5, Some((5, 3)), &[5]), &log),
            AppendDecision::Reject(RejectReason::LogMismatch)
        );
        // Right offset, wrong epoch.
        assert_eq!(
            r.decide_append(&append(5, Some((4, 2)), &[5]), &log),
            AppendDecision::Reject(RejectReason::LogMismatch)
        );
        // Matches: appends after the end.
        assert_eq!(
            r.decide_append(&append(5, Some((5, 2)), &[5, 5]), &log),
            accept(None, Some(0), false, Some(4))
        );
        // An empty append that matches is acked through prev.
        assert_eq!(
            r.decide_append(&append(5, Some((3, 1)), &[]), &log),
            accept(None, None, false, Some(1))
        );
        // No prev, no events: nothing to ack.
        assert_eq!(
            r.decide_append(&append(5, None, &[]), &log),
            accept(None, None, false, None)
        );
    }

    #[test]
    fn equal_entries_are_kept_and_the_first_difference_truncates() {
        let r = replica(5);
        let log = VecLog::new(&[3, 3, 4, 4]);
        // Offsets 1 (epoch 3) equal, 2 differs (4 vs 5): truncate from index 1.
        assert_eq!(
            r.decide_append(&append(6, Some((3, 0)), &[3, 5, 5]), &log),
            accept(Some(6), Some(1), true, Some(3))
        );
        // Everything already present: write nothing, ack through the append's end, which
        // is below the store's own last offset.
        assert_eq!(
            r.decide_append(&append(5, Some((3, 0)), &[3, 4]), &log),
            accept(None, None, false, Some(2))
        );
        // Present then beyond the end: write only the new tail, no truncation.
        assert_eq!(
            r.decide_append(&append(5, Some((4, 2)), &[4, 5, 5]), &log),
            accept(None, Some(1), false, Some(5))
        );
    }

    #[test]
    fn malformed_appends_are_invalid() {
        let r = replica(5);
        let log = VecLog::new(&[5]);
        // Event epoch above the append's.
        assert!(matches!(
            r.decide_append(&append(5, Some((5, 0)), &[6]), &log),
            AppendDecision::Invalid(_)
        ));
        // Epochs going down.
        assert!(matches!(
            r.decide_append(&append(7, Some((5, 0)), &[6, 5]), &log),
            AppendDecision::Invalid(_)
        ));
        // An event below prev's epoch.
        assert!(matches!(
            r.decide_append(&append(7, Some((5, 0)), &[4]), &log),
            AppendDecision::Invalid(_)
        ));
        // A conflicting entry of the master's own epoch cannot be replaced.
        let log = VecLog::new(&[5, 7]);
        assert!(matches!(
            r.decide_append(&append(7, Some((5, 0)), &[6]), &log),
            AppendDecision::Invalid(_)
        ));
    }

    #[test]
    fn pipelined_appends_chain_on_the_accepted_log() {
        // The second append's prev is the first append's last event: it matches as soon
        // as the first is accepted (in the log view), before anything is durable.
        let r = replica(5);
        let mut log = VecLog::new(&[]);
        let a1 = append(5, None, &[5, 5]);
        let a2 = append(5, Some((5, 1)), &[5]);
        assert_eq!(
            r.decide_append(&a2, &log),
            AppendDecision::Reject(RejectReason::LogMismatch)
        );
        assert!(matches!(
            r.decide_append(&a1, &log),
            AppendDecision::Accept(_)
        ));
        log.epochs.extend([5, 5]);
        assert_eq!(
            r.decide_append(&a2, &log),
            accept(None, Some(0), false, Some(2))
        );
    }

    #[test]
    fn trimmed_offsets_count_as_matching() {
        let r = replica(5);
        let log = VecLog {
            start: 10,
            epochs: vec![4, 4],
        };
        assert_eq!(
            r.decide_append(&append(5, Some((2, 3)), &[3, 3, 3, 3, 3, 3, 4, 4, 5]), &log),
            accept(None, Some(8), false, Some(12))
        );
    }

    #[test]
    fn fences_grant_higher_and_equal_epochs_and_refuse_lower() {
        let mut r = replica(5);
        let fence = |e, expected| FenceRequest {
            epoch: Epoch(e),
            expected,
        };
        assert_eq!(
            r.decide_fence(&fence(9, None)),
            FenceDecision::Grant {
                promise: Some(Epoch(9))
            }
        );
        r.promise(Epoch(9));
        assert_eq!(
            r.decide_fence(&fence(9, Some((StoreId(1), Incarnation(2))))),
            FenceDecision::Grant { promise: None }
        );
        assert_eq!(r.decide_fence(&fence(8, None)), FenceDecision::Refuse);
        // After the fence, appends below it are stale.
        assert_eq!(
            r.decide_append(&append(8, None, &[8]), &VecLog::new(&[])),
            AppendDecision::Reject(RejectReason::StaleEpoch)
        );
    }

    #[test]
    fn identity_mismatch_refuses_that_fence_and_a_learner_never_grants() {
        let r = replica(5);
        let wrong = FenceRequest {
            epoch: Epoch(9),
            expected: Some((StoreId(1), Incarnation(3))),
        };
        assert_eq!(r.decide_fence(&wrong), FenceDecision::OtherIdentity);
        assert_eq!(r.role(), Role::Voter);
        let r = Replica::new(StoreId(1), Incarnation(2), Role::Learner, Epoch(5));
        for expected in [None, Some((StoreId(1), Incarnation(2)))] {
            let f = FenceRequest {
                epoch: Epoch(10),
                expected,
            };
            assert_eq!(r.decide_fence(&f), FenceDecision::NotVoter);
        }
        // A learner still accepts appends.
        assert!(matches!(
            r.decide_append(&append(6, None, &[6]), &VecLog::new(&[])),
            AppendDecision::Accept(_)
        ));
    }

    #[test]
    fn hwm_is_learned_only_from_current_epochs_and_only_rises() {
        let mut r = replica(5);
        assert!(!r.learn_hwm(Epoch(4), Some(Offset(100))));
        assert_eq!(r.hwm(), None);
        assert!(r.learn_hwm(Epoch(5), Some(Offset(10))));
        assert!(!r.learn_hwm(Epoch(6), Some(Offset(9))));
        assert!(!r.learn_hwm(Epoch(6), None));
        assert!(r.learn_hwm(Epoch(6), Some(Offset(11))));
        assert_eq!(r.hwm(), Some(Offset(11)));
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Clone, Debug)]
        enum Op {
            /// An append of `epoch` whose prev is at `prev_at` (clamped to the log, or
            /// none), with a wrong prev epoch if `bad_prev`, and events of these epoch
            /// steps (0: same as before, 1: one up, capped at the append's epoch).
            Append {
                epoch: u64,
                prev_at: Option<u64>,
                bad_prev: bool,
                steps: Vec<u8>,
            },
            Fence(u64),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                4 => (1u64..8, proptest::option::of(0u64..12), proptest::bool::weighted(0.15), proptest::collection::vec(0u8..2, 0..5))
                    .prop_map(|(epoch, prev_at, bad_prev, steps)| Op::Append { epoch, prev_at, bad_prev, steps }),
                1 => (0u64..8).prop_map(Op::Fence),
            ]
        }

        proptest! {
            /// Any sequence of appends and fences, applied the way the store applies an
            /// accepted plan, keeps the log-matching invariants: an accepted append's
            /// prev and events are all in the log afterwards, nothing before them moved,
            /// epochs never go down along the log, truncation only replaces lower epochs,
            /// the promise never goes down, and every refusal has its reason.
            #[test]
            fn accepted_plans_keep_the_log_invariants(ops in proptest::collection::vec(op(), 1..60)) {
                let mut r = replica(0);
                let mut log = VecLog::new(&[]);
                for op in ops {
                    match op {
                        Op::Fence(e) => {
                            if let FenceDecision::Grant { promise: Some(p) } = r.decide_fence(&FenceRequest { epoch: Epoch(e), expected: None }) {
                                r.promise(p);
                            }
                        }
                        Op::Append { epoch, prev_at, bad_prev, steps } => {
                            let len = log.epochs.len() as u64;
                            let prev = prev_at.map(|at| {
                                let at = at.min(len);
                                let e = log.epochs.get(at as usize).copied().unwrap_or(1);
                                (if bad_prev { e + 1 } else { e }, at)
                            });
                            let mut e = prev.map_or(1, |p| p.0).min(epoch);
                            let epochs: Vec<u64> = steps.iter().map(|s| { e = (e + u64::from(*s)).min(epoch); e }).collect();
                            let req = append(epoch, prev, &epochs);
                            let before = log.epochs.clone();
                            let promised = r.promised();
                            match r.decide_append(&req, &log) {
                                AppendDecision::Reject(RejectReason::StaleEpoch) => prop_assert!(req.epoch < promised),
                                AppendDecision::Reject(RejectReason::LogMismatch) => {
                                    let p = req.prev.expect("a mismatch needs a prev");
                                    prop_assert_ne!(log.entry_epoch(p.offset), Some(p.epoch));
                                }
                                AppendDecision::Reject(other) => prop_assert!(false, "unexpected {other:?}"),
                                AppendDecision::Invalid(problem) => {
                                    // Only an event conflicting with an entry of the master's
                                    // own epoch or above, or a prev epoch above the append's.
                                    prop_assert!(problem.contains("not below") || problem.contains("prev epoch"), "{problem}");
                                }
                                AppendDecision::Accept(plan) => {
                                    prop_assert!(req.epoch >= promised);
                                    prop_assert_eq!(plan.promise, (req.epoch > promised).then_some(req.epoch));
                                    prop_assert_eq!(plan.through, req.through_offset());
                                    if let Some(p) = plan.promise { r.promise(p); }
                                    let first = req.first_offset().unwrap().0 as usize;
                                    if let Some(i) = plan.write_from {
                                        let at = first + i;
                                        prop_assert_eq!(plan.truncates, at < log.epochs.len());
                                        if plan.truncates {
                                            prop_assert!(log.epochs[at] < req.epoch.0, "replaces only lower epochs");
                                        }
                                        log.epochs.truncate(at);
                                        log.epochs.extend(req.events[i..].iter().map(|e| e.epoch.0));
                                    }
                                    // The append is in the log, and nothing before it moved.
                                    if let Some(p) = req.prev {
                                        prop_assert_eq!(log.entry_epoch(p.offset), Some(p.epoch));
                                    }
                                    for ev in &req.events {
                                        prop_assert_eq!(log.entry_epoch(ev.offset), Some(ev.epoch));
                                    }
                                    prop_assert_eq!(&log.epochs[..first.min(before.len())], &before[..first.min(before.len())]);
                                    prop_assert!(log.epochs.windows(2).all(|w| w[0] <= w[1]), "epochs go down: {:?}", log.epochs);
                                }
                            }
                            prop_assert!(r.promised() >= promised);
                        }
                    }
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "promised epoch would go down")]
    fn the_promise_never_goes_down() {
        replica(5).promise(Epoch(4));
    }
}
