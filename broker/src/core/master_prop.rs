//! Property test of the master core's HWM against a brute-force oracle.
//!
//! A master of epoch `E` leads a random adopted log over N = 3 or 5 simulated stores
//! ([`StoreSim`]: DESIGN.md's append rule, `through = prev.offset + count`), some starting
//! empty, behind, or with a divergent tail of an old epoch; one store may be a learner.
//! A random schedule proposes events, delivers appends and answers in any order, drops and
//! duplicates them, disconnects and reconnects slots, ticks the heartbeat, and injects acks
//! that must never count (and stores answering `Overloaded`): from an old epoch, from an unknown slot, from a non-voter or a
//! wrong incarnation, past anything sent. Sometimes a rival fences a store.
//!
//! The oracle recomputes, from scratch after every step, the highest `h` such that Qa
//! distinct voting store slots delivered a valid ack (epoch `E`, expected identity,
//! `voter`, `through <= ` the highest `through` the master sent that slot) with
//! `through >= h`, and `h >= epoch_start` — or the applied offset the master started from.
//! After every step the core's HWM must equal it (never exceed it, never lag it: each ack
//! is acted on at once), never go down, and every stabilized offset must be held by Qa
//! voting stores with the master's entries. After the schedule, with every slot reconnected
//! and every message delivered, the whole log must be stabilized (unless the master was
//! fenced) and still equal the oracle.

use bytes::Bytes;
use proptest::prelude::*;
use quire_proto::{Epoch, Incarnation, Offset};

use super::master::{
    AppendCommand, MasterCommand, MasterConfig, MasterCore, MasterInput, ReplicationLimits,
};
use super::takeover::AdoptedLog;
use super::testkit::{event, ident, StoreSim};
use super::{AppendId, ClusterConfig, Log, RejectReason, SlotId, SlotKind, StoreIdentity};

const E: Epoch = Epoch(100);

#[derive(Clone, Debug)]
enum Op {
    Propose(usize),
    DeliverAppend {
        pick: usize,
        keep: bool,
    },
    DropAppend(usize),
    DeliverAnswer {
        pick: usize,
        keep: bool,
    },
    DropAnswer(usize),
    Tick,
    Disconnect(u16),
    Connect(u16),
    OldEpochAck {
        slot: u16,
        pick: u64,
    },
    UnknownSlotAck {
        pick: u64,
    },
    NonVoterAck {
        slot: u16,
        pick: u64,
        wrong_incarnation: bool,
    },
    BeyondSentAck {
        slot: u16,
        extra: u64,
    },
    RivalFences(u16),
    /// The store drops the next append it gets, answering `Overloaded`.
    Overload(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0usize..40).prop_map(Op::Propose),
        8 => (any::<usize>(), prop::bool::weighted(0.15)).prop_map(|(pick, keep)| Op::DeliverAppend { pick, keep }),
        1 => any::<usize>().prop_map(Op::DropAppend),
        8 => (any::<usize>(), prop::bool::weighted(0.15)).prop_map(|(pick, keep)| Op::DeliverAnswer { pick, keep }),
        1 => any::<usize>().prop_map(Op::DropAnswer),
        2 => Just(Op::Tick),
        1 => (0u16..6).prop_map(Op::Disconnect),
        1 => (0u16..6).prop_map(Op::Connect),
        1 => (0u16..6, any::<u64>()).prop_map(|(slot, pick)| Op::OldEpochAck { slot, pick }),
        1 => any::<u64>().prop_map(|pick| Op::UnknownSlotAck { pick }),
        2 => (0u16..6, any::<u64>(), any::<bool>())
            .prop_map(|(slot, pick, wrong_incarnation)| Op::NonVoterAck { slot, pick, wrong_incarnation }),
        1 => (0u16..6, 0u64..3).prop_map(|(slot, extra)| Op::BeyondSentAck { slot, extra }),
        1 => (0u16..6).prop_map(Op::Overload),
        1 => (0u16..6, 0u8..8).prop_map(|(slot, coin)| if coin == 0 { Op::RivalFences(slot) } else { Op::Tick }),
    ]
}

/// How one store starts, relative to the adopted log.
#[derive(Clone, Debug)]
struct StoreStart {
    /// Length of the adopted log's prefix it holds (clamped).
    prefix: usize,
    /// Entries of a zombie epoch (50 + slot) after the prefix.
    divergent: usize,
}

#[derive(Clone, Debug)]
struct Setup {
    n: u64,
    ack_quorum: usize,
    adopted_epochs: Vec<u64>,
    applied: Option<usize>,
    starts: Vec<StoreStart>,
    /// A store slot whose identity the configuration does not know, or that answers as a
    /// learner (`voter = false`).
    learner: Option<(u16, bool)>,
    limits: ReplicationLimits,
    ops: Vec<Op>,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        prop_oneof![Just(3u64), Just(5u64)],
        prop::collection::vec(1u64..4, 0..9),
    )
        .prop_flat_map(|(n, steps)| {
            // non-decreasing old epochs 1..=10
            let mut e = 1;
            let adopted: Vec<u64> = steps
                .iter()
                .map(|s| {
                    e = (e + s / 2).min(10);
                    e
                })
                .collect();
            let len = adopted.len();
            let majority = (n / 2 + 1) as usize;
            (
                Just(n),
                majority..=(n as usize),
                Just(adopted),
                prop_oneof![3 => Just(None), 1 => (0..len.max(1)).prop_map(Some)]
                    .prop_map(move |a| a.filter(|_| len > 0)),
                prop::collection::vec(
                    (0..=len, prop_oneof![3 => Just(0usize), 1 => 1usize..3])
                        .prop_map(|(prefix, divergent)| StoreStart { prefix, divergent }),
                    n as usize,
                ),
                prop::option::of((0..n as u16, any::<bool>())),
                (
                    1u32..4,
                    1u32..4,
                    prop_oneof![Just(u64::MAX), (300u64..2000)],
                    0u64..600,
                ),
                prop::collection::vec(op(), 0..160),
            )
        })
        .prop_map(
            |(
                n,
                ack_quorum,
                adopted_epochs,
                applied,
                starts,
                learner,
                (events, window, bytes, retained),
                ops,
            )| {
                Setup {
                    n,
                    ack_quorum,
                    adopted_epochs,
                    applied,
                    starts,
                    learner,
                    limits: ReplicationLimits {
                        inflight_bytes_max: bytes,
                        append_events_max: events,
                        append_bytes_max: 400,
                        appends_inflight_max: window,
                        append_timeout_ticks: 3,
                        retained_bytes_max: retained,
                    },
                    ops,
                }
            },
        )
}

/// The oracle: only what was delivered to the master and the appends it emitted.
struct Oracle {
    n: usize,
    ack_quorum: usize,
    epoch_start: Offset,
    start_hwm: Option<Offset>,
    expected: Vec<Option<StoreIdentity>>,
    sent_max: Vec<Option<Offset>>,
    voted: Vec<Option<Offset>>,
    stepped_down: bool,
}

impl Oracle {
    fn saw_append(&mut self, a: &AppendCommand) {
        let s = &mut self.sent_max[a.slot.index()];
        *s = (*s).max(a.through());
    }

    fn saw_input(&mut self, input: &MasterInput) {
        if self.stepped_down {
            return;
        }
        if let MasterInput::Persisted {
            slot,
            epoch,
            through,
            identity,
            voter,
            ..
        } = *input
        {
            let i = slot.index();
            let valid = i < self.n
                && epoch == E
                && voter
                && self.expected[i] == Some(identity)
                && through.is_some()
                && through <= self.sent_max[i];
            if valid {
                self.voted[i] = self.voted[i].max(through);
            }
        }
    }

    /// Brute force: try every candidate h.
    fn hwm(&self) -> Option<Offset> {
        let mut best = self.start_hwm;
        for h in self.voted.iter().flatten() {
            let holders = self.voted.iter().filter(|v| **v >= Some(*h)).count();
            if holders >= self.ack_quorum && *h >= self.epoch_start {
                best = best.max(Some(*h));
            }
        }
        best
    }
}

struct World {
    m: MasterCore,
    stores: Vec<StoreSim>,
    oracle: Oracle,
    appends: Vec<AppendCommand>,
    answers: Vec<MasterInput>,
    delivered: Vec<MasterInput>,
    hwm_seen: Option<Offset>,
    out: Vec<MasterCommand>,
    overloaded: Vec<bool>,
}

impl World {
    fn new(s: &Setup) -> World {
        let mut slots: Vec<SlotKind> = (0..s.n).map(|i| SlotKind::voter(Some(ident(i)))).collect();
        let mut stores: Vec<StoreSim> = (0..s.n)
            .map(|i| {
                let st = &s.starts[i as usize];
                let mut epochs: Vec<u64> =
                    s.adopted_epochs[..st.prefix.min(s.adopted_epochs.len())].to_vec();
                epochs.extend(std::iter::repeat_n(50 + i, st.divergent));
                StoreSim::new(ident(i), &epochs)
            })
            .collect();
        if let Some((slot, unknown)) = s.learner {
            if unknown {
                slots[slot as usize] = SlotKind::voter(None);
            } else {
                stores[slot as usize].voter = false;
            }
        }
        let cluster = ClusterConfig {
            slots,
            ack_quorum: s.ack_quorum,
            fence_quorum: s.n as usize + 1 - s.ack_quorum,
        };
        let log = Log::from_events(
            s.adopted_epochs
                .iter()
                .enumerate()
                .map(|(o, &e)| event(e, o as u64, 5)),
        );
        let applied = s.applied.map(|a| Offset(a as u64));
        let expected = cluster.slots.iter().map(|k| match k {
            SlotKind::Store { identity, .. } => *identity,
            SlotKind::Slave { .. } => None,
        });
        let oracle = Oracle {
            n: s.n as usize,
            ack_quorum: s.ack_quorum,
            epoch_start: log.end(),
            start_hwm: applied,
            expected: expected.collect(),
            sent_max: vec![None; s.n as usize],
            voted: vec![None; s.n as usize],
            stepped_down: false,
        };
        let mut out = Vec::new();
        let m = MasterCore::new(
            MasterConfig {
                cluster,
                limits: s.limits,
            },
            AdoptedLog {
                epoch: E,
                log,
                applied,
                voters: None,
            },
            Bytes::new().into(),
            &mut out,
        )
        .expect("valid setup");
        let mut w = World {
            m,
            stores,
            oracle,
            appends: Vec::new(),
            answers: Vec::new(),
            delivered: Vec::new(),
            hwm_seen: applied,
            out,
            overloaded: vec![false; s.n as usize],
        };
        w.collect();
        w
    }

    /// Moves the core's commands into the simulated network and checks each `Stabilized`.
    fn collect(&mut self) {
        for c in std::mem::take(&mut self.out) {
            match c {
                MasterCommand::Append(a) => {
                    self.oracle.saw_append(&a);
                    self.appends.push(a);
                }
                MasterCommand::Stabilized { through, events } => {
                    let from = self.hwm_seen.map_or(0, |h| h.0 + 1);
                    let offsets: Vec<u64> = events.iter().map(|e| e.offset.0).collect();
                    assert_eq!(
                        offsets,
                        (from..=through.0).collect::<Vec<_>>(),
                        "stabilized events are contiguous"
                    );
                    assert!(
                        !self.oracle.stepped_down,
                        "nothing is stabilized after a step-down"
                    );
                    self.hwm_seen = Some(through);
                }
                MasterCommand::StepDown { promised } => {
                    assert_eq!(promised, Epoch(E.0 + 1));
                    self.oracle.stepped_down = true;
                }
                MasterCommand::QuorumLost { .. } => panic!("the check-quorum rule is off here"),
            }
        }
    }

    fn feed(&mut self, input: MasterInput) {
        self.oracle.saw_input(&input);
        self.m.handle(input, &mut self.out);
        self.collect();
    }

    fn deliver_append(&mut self, i: usize, keep: bool) {
        let a = if keep {
            self.appends[i].clone()
        } else {
            self.appends.remove(i)
        };
        let log = self.m.log().clone();
        let slot = a.slot.index();
        let answer = if std::mem::take(&mut self.overloaded[slot]) {
            MasterInput::Rejected {
                slot: a.slot,
                append: a.append,
                promised: self.stores[slot].promised,
                last: self.stores[slot].last(),
                reason: RejectReason::Overloaded,
            }
        } else {
            self.stores[slot].answer(a.slot, &a, &log)
        };
        self.answers.push(answer);
    }

    fn deliver_answer(&mut self, i: usize, keep: bool) {
        let input = if keep {
            self.answers[i].clone()
        } else {
            self.answers.remove(i)
        };
        self.delivered.push(input.clone());
        self.feed(input);
    }

    /// A `through` the slot was really sent (or None if nothing was).
    fn sent_through(&self, slot: usize, pick: u64) -> Option<Offset> {
        let max = self.oracle.sent_max.get(slot).copied().flatten()?;
        Some(Offset(pick % (max.0 + 1)))
    }

    fn step(&mut self, op: &Op) {
        let n = self.oracle.n as u16;
        match *op {
            Op::Propose(len) => {
                let _ = self.m.propose(
                    quire_proto::EventKind::Message,
                    Bytes::from(vec![1u8; len]).into(),
                    &mut self.out,
                );
                self.collect();
            }
            Op::DeliverAppend { pick, keep } if !self.appends.is_empty() => {
                let i = pick % self.appends.len();
                self.deliver_append(i, keep);
            }
            Op::DropAppend(pick) if !self.appends.is_empty() => {
                let i = pick % self.appends.len();
                self.appends.remove(i);
            }
            Op::DeliverAnswer { pick, keep } if !self.answers.is_empty() => {
                let i = pick % self.answers.len();
                self.deliver_answer(i, keep);
            }
            Op::DropAnswer(pick) if !self.answers.is_empty() => {
                let i = pick % self.answers.len();
                self.answers.remove(i);
            }
            Op::Tick => self.feed(MasterInput::HeartbeatTick),
            Op::Disconnect(slot) => self.feed(MasterInput::SlotDisconnected {
                slot: SlotId(slot % n),
            }),
            Op::Connect(slot) => self.feed(MasterInput::SlotConnected {
                slot: SlotId(slot % n),
            }),
            Op::OldEpochAck { slot, pick } => {
                let slot = slot % n;
                let through = self.sent_through(slot.into(), pick);
                self.feed(MasterInput::Persisted {
                    slot: SlotId(slot),
                    append: AppendId(pick),
                    epoch: Epoch(pick % E.0),
                    through,
                    identity: ident(slot.into()),
                    voter: true,
                });
            }
            Op::UnknownSlotAck { pick } => self.feed(MasterInput::Persisted {
                slot: SlotId(n + (pick % 3) as u16),
                append: AppendId(pick),
                epoch: E,
                through: Some(Offset(pick % 8)),
                identity: ident(u64::from(n)),
                voter: true,
            }),
            Op::NonVoterAck {
                slot,
                pick,
                wrong_incarnation,
            } => {
                let slot = slot % n;
                let through = self.sent_through(slot.into(), pick);
                let identity = if wrong_incarnation {
                    StoreIdentity {
                        incarnation: Incarnation(2),
                        ..ident(slot.into())
                    }
                } else {
                    ident(slot.into())
                };
                self.feed(MasterInput::Persisted {
                    slot: SlotId(slot),
                    append: AppendId(pick),
                    epoch: E,
                    through,
                    identity,
                    voter: wrong_incarnation,
                });
            }
            Op::BeyondSentAck { slot, extra } => {
                let slot = slot % n;
                let beyond = self.oracle.sent_max[slot as usize].map_or(0, |m| m.0 + 1) + extra;
                self.feed(MasterInput::Persisted {
                    slot: SlotId(slot),
                    append: AppendId(u64::MAX),
                    epoch: E,
                    through: Some(Offset(beyond)),
                    identity: ident(slot.into()),
                    voter: true,
                });
            }
            Op::Overload(slot) => self.overloaded[usize::from(slot % n)] = true,
            Op::RivalFences(slot) => {
                let s = &mut self.stores[usize::from(slot % n)];
                s.promised = s.promised.max(Epoch(E.0 + 1));
            }
            _ => {}
        }
    }

    /// The invariants checked after every step.
    fn check(&mut self) -> Result<(), TestCaseError> {
        let hwm = self.m.hwm();
        prop_assert_eq!(hwm, self.oracle.hwm(), "core HWM vs oracle");
        prop_assert_eq!(
            hwm,
            self.hwm_seen,
            "HWM only moves through Stabilized commands"
        );
        if let Some(h) = hwm.filter(|h| Some(*h) > self.oracle.start_hwm) {
            // stabilized => held by Qa voting stores with the master's entries
            let log = self.m.log();
            let holders = self
                .stores
                .iter()
                .enumerate()
                .filter(|(i, s)| {
                    s.voter
                        && self.oracle.expected[*i].is_some()
                        && (0..=h.0)
                            .all(|o| s.log.get(o as usize).copied() == log.epoch_at(Offset(o)))
                })
                .count();
            prop_assert!(
                holders >= self.oracle.ack_quorum,
                "HWM {} held by {} stores",
                h,
                holders
            );
        }
        Ok(())
    }

    /// Reconnects everything and delivers every message until the network is quiet.
    fn drain(&mut self) {
        for s in 0..self.oracle.n as u16 {
            self.feed(MasterInput::SlotConnected { slot: SlotId(s) });
        }
        for _ in 0..400 {
            if self.appends.is_empty() && self.answers.is_empty() {
                self.feed(MasterInput::HeartbeatTick);
            }
            while !self.appends.is_empty() {
                self.deliver_append(0, false);
            }
            while !self.answers.is_empty() {
                self.deliver_answer(0, false);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn hwm_matches_the_brute_force_oracle(s in setup()) {
        let mut w = World::new(&s);
        w.check()?;
        for op in &s.ops {
            w.step(op);
            w.check()?;
        }
        w.drain();
        w.check()?;
        let voters = (0..w.oracle.n).filter(|&i| w.stores[i].voter && w.oracle.expected[i].is_some()).count();
        if !w.oracle.stepped_down && voters >= s.ack_quorum {
            let last = w.m.log().last().map(|p| p.offset);
            prop_assert_eq!(w.m.hwm(), last, "with everything delivered the whole log is stabilized");
        }
        // the invariants counted what they ignored
        let st = *w.m.stats();
        prop_assert!(st.acks_voted <= w.delivered.len() as u64 + s.ops.len() as u64);
    }
}
