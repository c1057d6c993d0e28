//! The recorded history of a multi-process test and its one checker.
//!
//! Every produce attempt the harness sends ([`crate::Cluster::produce_acked`],
//! [`crate::Cluster::settle`], [`crate::LoadDriver`]) is recorded in the cluster's
//! [`History`] with its outcome: ok (the base offset), failed (an error answer) or unknown
//! (a timeout, a lost connection, no answer). At the end, [`crate::Cluster::check`] reads the
//! final log back from the stores and judges the run with **the simulation's checker**
//! ([`quire_sim::Checker`], sim/src/checker.rs) — literally the same code and rules:
//!
//! - every acknowledged message is in the final log, served exactly once, at the offset its
//!   ok answer named, in per-producer order;
//! - no message in the log was never sent;
//! - an offset never maps to two events;
//! - consumers saw a prefix of one total order;
//! - at most one broker process acked in any epoch (as far as the history can tell: the
//!   epoch is the one the broker's Metadata named when the producer connected, the
//!   incarnation how many times the test had started that broker by then);
//! - every fence quorum of the stores would adopt a log that holds the whole stabilized log.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use quire_proto::{Epoch, ErrorCode, Offset, ProduceRequest};
use quire_sim::{Checker, ProducedBatch, Violation};

use crate::client::ProduceResult;
use crate::cluster::BrokerHandle;

/// What became of one produce attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: the messages are at `base_offset..base_offset + count`.
    Ok {
        /// Offset of the first message.
        base_offset: Offset,
    },
    /// The broker answered with an error. The checker asks nothing of such a batch: an
    /// error after the master appended it (a master deposed while waiting) may leave it in
    /// the log.
    Failed {
        /// The error code.
        code: ErrorCode,
        /// Its message.
        message: String,
    },
    /// No definite answer: a `Timeout` error, a lost connection, a read timeout.
    Unknown {
        /// What happened.
        why: String,
    },
}

/// One produce attempt.
#[derive(Clone, Debug)]
pub struct Attempt {
    /// Producer id (0: not idempotent).
    pub producer_id: u64,
    /// Sequence of the first message.
    pub sequence: u64,
    /// Topic.
    pub topic: String,
    /// The message bytes, in sequence order.
    pub messages: Vec<Bytes>,
    /// The broker it was sent to (its id, from 1).
    pub broker: u16,
    /// How many times the test had started that broker when the attempt went out (1: its
    /// first process).
    pub incarnation: u32,
    /// The epoch the broker's Metadata named when the producer connected, if asked.
    pub epoch: Option<Epoch>,
    /// What came back.
    pub outcome: Outcome,
}

impl Attempt {
    /// The attempt of `req` sent to broker `to` (incarnation and epoch as the producer saw
    /// them) that came back with `answer`.
    pub fn of(
        req: &ProduceRequest,
        to: &BrokerHandle,
        incarnation: u32,
        epoch: Option<Epoch>,
        answer: &std::io::Result<ProduceResult>,
    ) -> Attempt {
        let outcome = match answer {
            Ok(Ok(r)) => Outcome::Ok {
                base_offset: r.base_offset,
            },
            Ok(Err(e)) if e.code == ErrorCode::Timeout => Outcome::Unknown {
                why: format!("{:?}: {}", e.code, e.message),
            },
            Ok(Err(e)) => Outcome::Failed {
                code: e.code,
                message: e.message.clone(),
            },
            Err(e) => Outcome::Unknown { why: e.to_string() },
        };
        Attempt {
            producer_id: req.producer_id,
            sequence: req.sequence,
            topic: req.topic.clone(),
            messages: req.messages.clone(),
            broker: to.id,
            incarnation,
            epoch,
            outcome,
        }
    }
}

/// Counts of a history's attempts by outcome.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutcomeCounts {
    /// Attempts answered ok.
    pub ok: u64,
    /// Attempts answered with an error.
    pub failed: u64,
    /// Attempts with no definite answer.
    pub unknown: u64,
    /// Messages acknowledged (each distinct `(producer, sequence)` once).
    pub messages_acked: u64,
}

/// The produce attempts of one test, shared by every thread that produces (cloning shares).
#[derive(Clone, Debug, Default)]
pub struct History {
    attempts: Arc<Mutex<Vec<Attempt>>>,
}

impl History {
    /// An empty history.
    pub fn new() -> History {
        History::default()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Attempt>> {
        // A producer thread that panicked left a complete entry or none: the data is fine.
        self.attempts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one attempt.
    pub fn record(&self, attempt: Attempt) {
        self.lock().push(attempt);
    }

    /// A copy of every attempt so far, in the order they were recorded.
    pub fn attempts(&self) -> Vec<Attempt> {
        self.lock().clone()
    }

    /// How many batches of producer `producer_id` were answered ok by broker `by` (by any
    /// broker if `None`): attempts, so a batch acknowledged twice (a retry) counts twice.
    pub fn ok_batches(&self, producer_id: u64, by: Option<u16>) -> u64 {
        self.lock()
            .iter()
            .filter(|a| a.producer_id == producer_id)
            .filter(|a| matches!(a.outcome, Outcome::Ok { .. }))
            .filter(|a| by.is_none_or(|b| a.broker == b))
            .count() as u64
    }

    /// Counts by outcome.
    pub fn counts(&self) -> OutcomeCounts {
        let attempts = self.lock();
        let mut c = OutcomeCounts::default();
        let mut acked = std::collections::BTreeSet::new();
        for a in attempts.iter() {
            match a.outcome {
                Outcome::Ok { .. } => {
                    c.ok += 1;
                    for i in 0..a.messages.len() as u64 {
                        acked.insert((a.producer_id, a.sequence + i, a.topic.as_str()));
                    }
                }
                Outcome::Failed { .. } => c.failed += 1,
                Outcome::Unknown { .. } => c.unknown += 1,
            }
        }
        c.messages_acked = acked.len() as u64;
        c
    }
}

/// One batch: every attempt of one `(producer, sequence, topic)`, with the base offsets of
/// its ok answers.
#[derive(Debug)]
struct BatchRecord {
    producer_id: u64,
    sequence: u64,
    topic: String,
    messages: Vec<Bytes>,
    oks: Vec<Offset>,
}

/// Groups attempts into batches (a retry resends the same batch).
///
/// # Panics
/// If two attempts of one `(producer, sequence, topic)` carry different messages: the test
/// broke the idempotent-produce contract, not the broker.
fn batches(attempts: &[Attempt]) -> Vec<BatchRecord> {
    let mut by_key: BTreeMap<(u64, u64, &str), BatchRecord> = BTreeMap::new();
    for a in attempts {
        let b = by_key
            .entry((a.producer_id, a.sequence, &a.topic))
            .or_insert_with(|| BatchRecord {
                producer_id: a.producer_id,
                sequence: a.sequence,
                topic: a.topic.clone(),
                messages: a.messages.clone(),
                oks: Vec::new(),
            });
        assert_eq!(
            b.messages, a.messages,
            "producer {} resent sequence {} with other messages",
            a.producer_id, a.sequence
        );
        if let Outcome::Ok { base_offset } = a.outcome {
            if !b.oks.contains(&base_offset) {
                b.oks.push(base_offset);
            }
        }
    }
    by_key.into_values().collect()
}

/// The final state of a run, read back after it: the stabilized log and each store's log.
#[derive(Debug)]
pub struct FinalLog {
    /// Every offset at and below this one is stabilized (the offset of a marker message
    /// acknowledged after the workload stopped).
    pub stabilized_through: Offset,
    /// `(store index, its whole log from offset 0)` of every store read.
    pub stores: Vec<(u8, Vec<quire_proto::Event>)>,
    /// How many stores a fence needs (majority).
    pub fence_quorum: usize,
}

/// What consumers read: `(topic, [(offset, message)])` per consumer, in read order from
/// the topic's first message.
pub type ConsumerReads = Vec<(String, Vec<(Offset, Bytes)>)>;

/// The checker's verdict on a run.
#[derive(Debug)]
pub struct CheckReport {
    /// The rules broken (empty: none).
    pub violations: Vec<Violation>,
    /// Messages verified (logged and acknowledged messages, each counted per check).
    pub messages_checked: u64,
    /// Length of the stabilized log that was checked (events, all kinds).
    pub stabilized_events: u64,
    /// The attempts by outcome.
    pub counts: OutcomeCounts,
    /// Consumer reads checked (messages).
    pub consumed: u64,
}

impl CheckReport {
    /// Panics with every violation if there is one.
    pub fn assert_clean(&self) {
        assert!(
            self.violations.is_empty(),
            "the checker found {} violation(s):\n{}\n({self})",
            self.violations.len(),
            self.violations
                .iter()
                .map(|v| format!("  - {v}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }
}

impl fmt::Display for CheckReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "checked {} stabilized events, {} messages ({} acknowledged; attempts: {} ok, {} \
             failed, {} unknown; {} consumer reads): {} violations",
            self.stabilized_events,
            self.messages_checked,
            self.counts.messages_acked,
            self.counts.ok,
            self.counts.failed,
            self.counts.unknown,
            self.consumed,
            self.violations.len()
        )
    }
}

/// Judges a run: `history` against `log`, with what `consumers` read. See the module docs.
pub fn check(history: &History, log: &FinalLog, consumers: &ConsumerReads) -> CheckReport {
    let mut checker = Checker::new();
    let through = log.stabilized_through.0;
    // The stabilized log: the prefix through the marker of the log every fence quorum would
    // adopt first (the most up-to-date: highest last epoch, then offset; lowest store on
    // ties). `check_quorums` then checks that every quorum's choice holds it.
    let adopted = log
        .stores
        .iter()
        .filter(|(_, events)| events.len() as u64 > through)
        .max_by_key(|(store, events)| {
            (
                events.last().map(|e| (e.epoch, e.offset)),
                std::cmp::Reverse(*store),
            )
        });
    match adopted {
        Some((store, events)) => {
            let prefix: Vec<quire_broker::core::Event> = events[..=through as usize].to_vec();
            checker.observed(&prefix, &format!("store {store}"));
        }
        None => panic!("no store holds the stabilized log through offset {through}"),
    }
    let attempts = history.attempts();
    for a in &attempts {
        if let (Outcome::Ok { .. }, Some(epoch)) = (&a.outcome, a.epoch) {
            let broker = u8::try_from(a.broker.saturating_sub(1)).expect("few brokers");
            checker.acked_in_epoch(broker, a.incarnation, epoch);
        }
    }
    let mut consumed = 0;
    for (i, (topic, reads)) in consumers.iter().enumerate() {
        consumed += reads.len() as u64;
        let consumer = u8::try_from(i).expect("few consumers");
        checker.consumed_messages(consumer, topic, reads.clone());
    }
    let records = batches(&attempts);
    let produced: Vec<ProducedBatch<'_>> = records
        .iter()
        .map(|b| ProducedBatch {
            producer_id: b.producer_id,
            sequence: b.sequence,
            topic: &b.topic,
            messages: &b.messages,
            oks: &b.oks,
        })
        .collect();
    checker.check_history(&produced);
    // Every store counts as unmarked (no tail-cut mark): every set of F of them is a
    // quorum, the strictest form of the check. (A store's mark is in its `DIR/tail_cut`.)
    let voters: Vec<(u8, &[quire_proto::Event], bool)> = log
        .stores
        .iter()
        .map(|(s, events)| (*s, events.as_slice(), false))
        .collect();
    let stores = voters.len().max(log.fence_quorum);
    checker.check_quorums(&voters, log.fence_quorum, stores);
    CheckReport {
        violations: checker.violations().to_vec(),
        messages_checked: checker.messages_checked(),
        stabilized_events: checker.stabilized_len(),
        counts: history.counts(),
        consumed,
    }
}

#[cfg(test)]
mod tests {
    //! The adapter feeds the simulation's checker: a history and a log that break a rule
    //! must give that rule's violation, and a clean pair none.

    use bytes::BytesMut;
    use quire_proto::{encode_message_event, EventKind};

    use super::*;

    fn message(epoch: u64, offset: u64, producer: u64, sequence: u64) -> quire_proto::Event {
        let mut payload = BytesMut::new();
        encode_message_event(
            "t",
            producer,
            sequence,
            &bytes_of(producer, sequence),
            &mut payload,
        )
        .expect("a valid message event");
        quire_proto::Event {
            epoch: Epoch(epoch),
            offset: Offset(offset),
            kind: EventKind::Message,
            payload: payload.freeze().into(),
        }
    }

    fn bytes_of(producer: u64, sequence: u64) -> Bytes {
        Bytes::from(format!("p{producer}-m{sequence}"))
    }

    fn handle() -> BrokerHandle {
        BrokerHandle::for_tests(1)
    }

    fn attempt(producer: u64, sequence: u64, incarnation: u32, outcome: Outcome) -> Attempt {
        Attempt {
            producer_id: producer,
            sequence,
            topic: "t".into(),
            messages: vec![bytes_of(producer, sequence)],
            broker: handle().id,
            incarnation,
            epoch: Some(Epoch(1 << 16 | 1)),
            outcome,
        }
    }

    fn ok(offset: u64) -> Outcome {
        Outcome::Ok {
            base_offset: Offset(offset),
        }
    }

    /// Three stores holding the same log of `n` messages of producer 1 (epoch 0x10001).
    fn log_of(n: u64) -> FinalLog {
        let events: Vec<quire_proto::Event> = (0..n).map(|i| message(0x1_0001, i, 1, i)).collect();
        FinalLog {
            stabilized_through: Offset(n - 1),
            stores: (0..3).map(|s| (s, events.clone())).collect(),
            fence_quorum: 2,
        }
    }

    fn history(attempts: Vec<Attempt>) -> History {
        let h = History::new();
        for a in attempts {
            h.record(a);
        }
        h
    }

    #[test]
    fn a_clean_run_has_no_violation() {
        let h = history((0..4).map(|i| attempt(1, i, 1, ok(i))).collect());
        let reads = vec![(
            "t".to_owned(),
            (0..4).map(|i| (Offset(i), bytes_of(1, i))).collect(),
        )];
        let report = check(&h, &log_of(4), &reads);
        assert!(report.violations.is_empty(), "{:?}", report.violations);
        assert_eq!(report.counts.messages_acked, 4);
    }

    #[test]
    fn an_acknowledged_message_missing_from_the_log_is_a_loss() {
        let h = history((0..5).map(|i| attempt(1, i, 1, ok(i))).collect());
        let report = check(&h, &log_of(4), &Vec::new());
        assert!(
            report
                .violations
                .iter()
                .any(|v| matches!(v, Violation::AckedLost { sequence: 4, .. })),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn a_message_nobody_sent_is_caught() {
        // Sequence 3 was never attempted.
        let h = history((0..3).map(|i| attempt(1, i, 1, ok(i))).collect());
        let report = check(&h, &log_of(4), &Vec::new());
        assert!(
            report
                .violations
                .iter()
                .any(|v| matches!(v, Violation::NeverSent { offset: 3, .. })),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn two_broker_processes_acking_in_one_epoch_are_caught() {
        // A restarted broker (incarnation 2) acking in its previous process's epoch.
        let h = history(vec![attempt(1, 0, 1, ok(0)), attempt(1, 1, 2, ok(1))]);
        let report = check(&h, &log_of(2), &Vec::new());
        assert!(
            report
                .violations
                .iter()
                .any(|v| matches!(v, Violation::TwoMastersInEpoch { .. })),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn a_consumer_read_off_the_total_order_is_caught() {
        let h = history((0..3).map(|i| attempt(1, i, 1, ok(i))).collect());
        let reads = vec![(
            "t".to_owned(),
            vec![(Offset(0), bytes_of(1, 0)), (Offset(2), bytes_of(1, 2))],
        )];
        let report = check(&h, &log_of(3), &reads);
        assert!(
            report
                .violations
                .iter()
                .any(|v| matches!(v, Violation::ConsumerNotPrefix { offset: 2, .. })),
            "{:?}",
            report.violations
        );
    }

    #[test]
    fn a_quorum_of_stores_missing_the_stabilized_tail_is_caught() {
        let mut log = log_of(4);
        // Two of three stores lost offset 3 (a fence quorum of them would lose it).
        for (_, events) in log.stores.iter_mut().skip(1) {
            events.truncate(3);
        }
        let h = history((0..4).map(|i| attempt(1, i, 1, ok(i))).collect());
        let report = check(&h, &log, &Vec::new());
        assert!(
            report
                .violations
                .iter()
                .any(|v| matches!(v, Violation::QuorumLacksStabilized { offset: 3, .. })),
            "{:?}",
            report.violations
        );
    }
}
