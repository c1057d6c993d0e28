//! Unit tests of the broker engine's roles: every role change, driven by inputs alone, with
//! a small model of three stores and one slave broker answering by hand.

use bytes::Bytes;
use quire_proto::{
    AppendRejected, AppendRequest, BrokerId, Epoch, ErrorCode, FenceGranted, Incarnation,
    LogPosition, Offset, ProduceRequest, RejectReason as WireReason, StoreId,
};

use super::*;
use crate::core::{
    AppendCommand, AppendEvents, AppendId, ClusterConfig, ReplicationLimits, SlotId, SlotKind,
    StoreIdentity,
};
use quire_net::Readiness;

const STORES: usize = 3;
const ELECTION_MS: u64 = 300;
const HEARTBEAT_MS: u64 = 50;
/// The slave broker's slot (after the stores).
const SLAVE: SlotId = SlotId(3);

fn ident(i: usize) -> StoreIdentity {
    StoreIdentity {
        store_id: StoreId(0x100 + i as u64),
        incarnation: Incarnation(7),
    }
}

fn store(i: usize) -> SlotId {
    SlotId(u16::try_from(i).expect("few stores"))
}

/// Broker 1 of two, with three stores; `known` says whether its cluster file names the
/// stores' identities (false: a new cluster, bootstrap).
fn config(known: bool) -> EngineConfig {
    let mut slots: Vec<SlotKind> = (0..STORES)
        .map(|i| SlotKind::voter(known.then(|| ident(i))))
        .collect();
    slots.push(SlotKind::Slave {
        broker: BrokerId(2),
    });
    EngineConfig {
        me: BrokerId(1),
        brokers: vec![BrokerId(1), BrokerId(2)],
        cluster: ClusterConfig::with_majorities(slots),
        election_timeout_ms: ELECTION_MS,
        heartbeat_ms: HEARTBEAT_MS,
        takeover_timeout_ms: 1000,
        check_quorum: true,
        write_limits: WriteLimits {
            message_bytes_max: 8192,
            inflight_bytes_max: 1 << 20,
            // Longer than a handoff's bound: a write held by a failed handoff goes out.
            produce_timeout_ms: 5000,
            blocked_requests_max: 16,
            topics_max: crate::state::TOPICS_MAX,
            cursors_max: crate::state::CURSORS_MAX,
        },
        limits: ReplicationLimits::default(),
        takeover_fetch_events_max: 64,
        follower_retained_bytes_max: 1 << 20,
        seed: 42,
        retention: crate::retention::RetentionPolicy::default(),
        recent_bytes_max: 1 << 20,
        checkpoint_part_bytes: crate::engine::CHECKPOINT_PART_BYTES_DEFAULT,
        mutations: Mutations::default(),
    }
}

/// The engine, its clock, and every command it gave out so far (in order).
struct H {
    engine: Engine,
    now: u64,
    seen: Vec<Command>,
}

impl H {
    fn new(known: bool) -> H {
        let mut engine = Engine::new(config(known), 0, 0);
        for i in 0..=STORES {
            engine.link(SlotId(u16::try_from(i).expect("few")), true, 0);
        }
        H {
            engine,
            now: 0,
            seen: Vec::new(),
        }
    }

    /// Commands queued since the last call (also kept in `seen`).
    fn take(&mut self) -> Vec<Command> {
        let c = self.engine.take_commands();
        self.seen.extend(c.iter().cloned());
        c
    }

    /// Ticks until a command matching `want` comes out; returns every command of that
    /// step. Panics after 100 ticks.
    fn tick_until(&mut self, want: impl Fn(&Command) -> bool) -> Vec<Command> {
        for _ in 0..100 {
            self.now += HEARTBEAT_MS;
            self.engine.tick(self.now);
            let out = self.take();
            if out.iter().any(&want) {
                return out;
            }
        }
        panic!("no wanted command in 100 ticks: {:?}", self.seen);
    }

    /// From a fresh follower with identities known to a takeover whose fences are out.
    /// Returns the takeover's epoch.
    fn start_fencing(&mut self) -> Epoch {
        let out = self.tick_until(|c| matches!(c, Command::PersistEpochCounter { .. }));
        let counter = out
            .iter()
            .find_map(|c| match c {
                Command::PersistEpochCounter { counter } => Some(*counter),
                _ => None,
            })
            .expect("a counter to persist");
        assert!(
            out.iter().any(|c| matches!(c, Command::TakingOver { .. })),
            "{out:?}"
        );
        assert!(
            !out.iter().any(|c| matches!(c, Command::SendFence { .. })),
            "no fence before the epoch counter is durable: {out:?}"
        );
        self.engine.epoch_persisted(counter, true, self.now);
        let out = self.take();
        let fences: Vec<Epoch> = out
            .iter()
            .filter_map(|c| match c {
                Command::SendFence { epoch, .. } => Some(*epoch),
                _ => None,
            })
            .collect();
        assert_eq!(fences.len(), STORES, "{out:?}");
        fences[0]
    }

    /// Every store grants `epoch` with an empty log.
    fn grant_all(&mut self, epoch: Epoch) -> Vec<Command> {
        for i in 0..STORES {
            self.engine.fence_answer(
                store(i),
                epoch,
                FenceAnswer::Granted(FenceGranted {
                    epoch,
                    last: None,
                    store_id: ident(i).store_id,
                    incarnation: ident(i).incarnation,
                    tail_cut: None,
                }),
                self.now,
            );
        }
        self.take()
    }

    /// Acks every append in `out` from every store (persisted through what it carried)
    /// and from the slave.
    fn ack(&mut self, out: &[Command]) -> Vec<Command> {
        let appends: Vec<&AppendCommand> = out
            .iter()
            .filter_map(|c| match c {
                Command::Append(a) => Some(a),
                _ => None,
            })
            .collect();
        for a in appends {
            let answer = if a.slot == SLAVE {
                SlotAnswer::SlaveHas { epoch: a.epoch }
            } else {
                let id = ident(a.slot.index());
                SlotAnswer::Persisted {
                    epoch: a.epoch,
                    through: a.through(),
                    identity: id,
                    voter: true,
                }
            };
            self.engine
                .append_answer(a.slot, a.append, a.epoch, a.through(), answer, self.now);
        }
        self.take()
    }

    /// A fresh broker all the way to a serving master. Returns its epoch.
    fn become_serving(&mut self) -> Epoch {
        let epoch = self.start_fencing();
        let out = self.grant_all(epoch);
        assert!(
            out.iter()
                .any(|c| matches!(c, Command::BecameMaster { epoch: e } if *e == epoch)),
            "{out:?}"
        );
        assert!(
            !self.engine.is_serving(),
            "not serving before the epoch start is stabilized"
        );
        let out = self.ack(&out);
        assert!(
            out.iter()
                .any(|c| matches!(c, Command::Serving { epoch: e, .. } if *e == epoch)),
            "{out:?}"
        );
        assert!(self.engine.is_serving());
        epoch
    }

    fn produce(&mut self, token: u64, sequence: u64) -> Vec<Command> {
        let req = WriteRequest::Produce(ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: "t".into(),
            producer_id: 9,
            sequence,
            messages: vec![Bytes::from_static(b"m")],
        });
        let role = format!("{:?}", self.engine.role());
        assert!(
            self.engine
                .write(RequestToken(token), req, self.now, self.now),
            "{role}"
        );
        self.engine.flush(self.now);
        self.take()
    }
}

fn answers(out: &[Command]) -> Vec<(RequestToken, Reply)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Write(WriteCommand::Answer { token, reply, .. }) => {
                Some((*token, reply.clone()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn a_silent_follower_takes_over_only_after_its_epoch_counter_is_durable() {
    let mut h = H::new(true);
    assert!(matches!(h.engine.role(), RoleView::Follower(_)));
    let epoch = h.start_fencing();
    assert_eq!(epoch.broker(), BrokerId(1));
    assert!(matches!(h.engine.role(), RoleView::TakingOver(e) if e == epoch));
    assert_eq!(h.engine.durable_counter(), epoch.0 >> 16);
}

#[test]
fn a_takeover_becomes_master_and_serves_once_its_epoch_start_is_stabilized() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    assert_eq!(h.engine.master_epoch(), Some(epoch));
    let applied = h.engine.state().applied();
    assert_eq!(
        applied,
        Some(Offset::ZERO),
        "the epoch-start event is applied"
    );
    assert_eq!(h.engine.master_hint(h.now), (epoch, Some(BrokerId(1))));
}

#[test]
fn a_produce_is_answered_only_once_a_quorum_persisted_it() {
    let mut h = H::new(true);
    h.become_serving();
    let out = h.produce(1, 0);
    assert!(
        answers(&out).is_empty(),
        "no answer before the quorum: {out:?}"
    );
    let out = h.ack(&out);
    assert_eq!(
        answers(&out),
        vec![(
            RequestToken(1),
            Reply::Produced {
                base_offset: Offset(1),
                count: 1
            }
        )]
    );
}

/// The master does not copy a producer's message, large or small: the message event it
/// sends to every store and slave is a header of its own chained to the produce's message
/// buffer itself (the reader gives that frame a buffer of its own, so this keeps nothing
/// else alive: `net/tests/reader.rs`).
#[test]
fn a_produced_message_reaches_the_appends_without_a_copy() {
    let mut h = H::new(true);
    h.become_serving();
    let large = Bytes::from(vec![5u8; quire_proto::INLINE_PAYLOAD_BYTES_MAX + 1]);
    let small = Bytes::from(vec![6u8; 10]);
    let req = WriteRequest::Produce(ProduceRequest {
        format: quire_proto::MessageFormat::Raw,
        topic: "t".into(),
        producer_id: 9,
        sequence: 0,
        messages: vec![large.clone(), small.clone()],
    });
    assert!(h.engine.write(RequestToken(1), req, h.now, h.now));
    h.engine.flush(h.now);
    let out = h.take();
    let mut appends = 0;
    for c in &out {
        if let Command::Append(AppendCommand {
            events: AppendEvents::InMemory(events),
            ..
        }) = c
        {
            let [l, s] = &events[..] else {
                panic!("two events: {events:?}")
            };
            for (e, message) in [(l, &large), (s, &small)] {
                assert_eq!(e.payload.tail().as_ptr(), message.as_ptr(), "shared");
                assert_eq!(e.payload.tail().len(), message.len());
                let Ok(quire_proto::EventBody::Message(m)) =
                    quire_proto::EventBody::decode(e.kind, &e.payload)
                else {
                    panic!("a message event")
                };
                assert_eq!((m.topic.as_str(), &m.message), ("t", message));
            }
            appends += 1;
        }
    }
    assert_eq!(appends, STORES + 1, "to every store and the slave: {out:?}");
}

#[test]
fn a_takeover_that_does_not_finish_in_time_is_abandoned() {
    let mut h = H::new(true);
    let epoch = h.start_fencing();
    // No store answers.
    let out = h.tick_until(|c| matches!(c, Command::Abandoned { .. }));
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::Abandoned { epoch: e, why } if *e == epoch && why == "timed out")),
        "{out:?}"
    );
    assert!(matches!(h.engine.role(), RoleView::Follower(_)));
}

#[test]
fn a_takeover_refused_with_a_higher_epoch_steps_back_and_remembers_it() {
    let mut h = H::new(true);
    let epoch = h.start_fencing();
    let rival = Epoch(epoch.0 + (5 << 16) + 1);
    for i in 0..STORES {
        h.engine.fence_answer(
            store(i),
            epoch,
            FenceAnswer::Refused { promised: rival },
            h.now,
        );
    }
    let out = h.take();
    assert!(
        out.iter().any(|c| matches!(c, Command::Abandoned { .. })),
        "{out:?}"
    );
    assert!(matches!(h.engine.role(), RoleView::Follower(_)));
    assert_eq!(h.engine.highest_epoch_seen(), rival);
    // The next takeover goes above the rival.
    let next = h.start_fencing();
    assert!(next > rival, "{next} above {rival}");
}

#[test]
fn a_failed_epoch_counter_write_sends_no_fence() {
    let mut h = H::new(true);
    let out = h.tick_until(|c| matches!(c, Command::PersistEpochCounter { .. }));
    let Some(Command::PersistEpochCounter { counter }) = out
        .iter()
        .find(|c| matches!(c, Command::PersistEpochCounter { .. }))
    else {
        unreachable!("tick_until found it")
    };
    h.engine.epoch_persisted(*counter, false, h.now);
    let out = h.take();
    assert!(
        !out.iter().any(|c| matches!(c, Command::SendFence { .. })),
        "{out:?}"
    );
    assert!(
        out.iter().any(|c| matches!(c, Command::Abandoned { .. })),
        "{out:?}"
    );
    assert!(matches!(h.engine.role(), RoleView::Follower(_)));
}

#[test]
fn a_fenced_master_steps_down_and_its_waiting_writes_get_not_master() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    let out = h.produce(1, 0);
    let a = out
        .iter()
        .find_map(|c| match c {
            Command::Append(a) if a.slot == store(0) => Some(a.clone()),
            _ => None,
        })
        .expect("an append to store 0");
    let higher = Epoch(epoch.0 + (1 << 16) + 1);
    h.engine.append_answer(
        a.slot,
        a.append,
        a.epoch,
        a.through(),
        SlotAnswer::Rejected(AppendRejected {
            reason: WireReason::StaleEpoch,
            promised: higher,
            last: None,
        }),
        h.now,
    );
    let out = h.take();
    assert_eq!(answers(&out), vec![(RequestToken(1), Reply::NotMaster)]);
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::LeftMaster { epoch: e, promised } if *e == epoch && *promised == higher)),
        "{out:?}"
    );
    assert!(matches!(h.engine.role(), RoleView::Follower(_)));
    assert!(!h.engine.write(
        RequestToken(2),
        WriteRequest::Produce(ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: "t".into(),
            producer_id: 9,
            sequence: 1,
            messages: vec![Bytes::from_static(b"m")],
        }),
        h.now,
        h.now
    ));
}

#[test]
fn a_master_that_hears_too_few_stores_for_an_election_timeout_steps_down_with_no_quorum() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    let _ = h.produce(1, 0); // never acked
    let out = h.tick_until(|c| matches!(c, Command::LeftMaster { .. }));
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::LeftMaster { epoch: e, promised } if *e == epoch && *promised == epoch)),
        "{out:?}"
    );
    let codes: Vec<ErrorCode> = answers(&out)
        .into_iter()
        .filter_map(|(_, r)| match r {
            Reply::Error(e) => Some(e.code),
            _ => None,
        })
        .collect();
    assert!(
        codes == vec![ErrorCode::NoQuorum] || codes.is_empty(),
        "the waiting write gets NoQuorum (or timed out before): {out:?}"
    );
    assert!(matches!(h.engine.role(), RoleView::Follower(_)));
}

#[test]
fn a_master_meeting_a_higher_epochs_append_follows_it() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    let rival = Epoch(epoch.0 + (1 << 16) + 1);
    let applied = h.engine.state().applied();
    let log_last = h.engine.master_core().and_then(|c| c.log().last());
    let answer = h.engine.inbound_append(
        AppendId(77),
        AppendRequest {
            epoch: rival,
            prev: log_last,
            events: Vec::new(),
            hwm: applied,
        },
        h.now,
    );
    assert!(
        matches!(answer, InboundAnswer::Has { epoch: e, .. } if e == rival),
        "{answer:?}"
    );
    let out = h.take();
    assert!(
        out.iter().any(|c| matches!(c, Command::LeftMaster { .. })),
        "{out:?}"
    );
    assert_eq!(h.engine.master_hint(h.now), (rival, Some(rival.broker())));
}

#[test]
fn an_older_masters_append_is_refused_with_the_masters_epoch() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    let answer = h.engine.inbound_append(
        AppendId(1),
        AppendRequest {
            epoch: Epoch(1),
            prev: None,
            events: Vec::new(),
            hwm: None,
        },
        h.now,
    );
    let InboundAnswer::Rejected(r) = answer else {
        panic!("{answer:?}")
    };
    assert_eq!((r.reason, r.promised), (WireReason::StaleEpoch, epoch));
    assert_eq!(h.engine.master_epoch(), Some(epoch));
}

#[test]
fn a_handoff_steps_the_master_down_to_a_follower_of_its_own_epoch() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    assert!(
        !h.engine.hand_over(Epoch(epoch.0 + 1), h.now),
        "only for its own epoch"
    );
    assert!(h.engine.hand_over(epoch, h.now));
    let out = h.take();
    assert!(
        out.iter().any(|c| matches!(c, Command::LeftMaster { .. })),
        "{out:?}"
    );
    let RoleView::Follower(f) = h.engine.role() else {
        panic!("a follower after a handoff")
    };
    assert_eq!(f.master_epoch(), epoch);
}

#[test]
fn a_new_cluster_bootstraps_only_when_every_store_is_an_empty_voter() {
    let mut h = H::new(false);
    let out = h.tick_until(|c| matches!(c, Command::ReadTail { .. }));
    let generation = out
        .iter()
        .find_map(|c| match c {
            Command::ReadTail { generation, .. } => Some(*generation),
            _ => None,
        })
        .expect("a probe");
    assert!(
        !out.iter().any(|c| matches!(c, Command::SendFence { .. })),
        "{out:?}"
    );
    for i in 0..STORES {
        h.engine.tail_answer(
            store(i),
            generation,
            Ok(TailAnswer {
                last: None,
                voter: true,
            }),
            h.now,
        );
    }
    let out = h.take();
    assert!(
        out.iter().any(|c| matches!(
            c,
            Command::TakingOver {
                bootstrap: true,
                ..
            }
        )),
        "{out:?}"
    );
    let counter = out
        .iter()
        .find_map(|c| match c {
            Command::PersistEpochCounter { counter } => Some(*counter),
            _ => None,
        })
        .expect("a counter");
    h.engine.epoch_persisted(counter, true, h.now);
    let out = h.take();
    let epoch = out
        .iter()
        .find_map(|c| match c {
            Command::SendFence {
                epoch,
                expected: None,
                ..
            } => Some(*epoch),
            _ => None,
        })
        .expect("fences that expect no identity");
    let out = h.grant_all(epoch);
    let Some(Command::PersistIdentities {
        identities,
        bootstrap_epoch,
    }) = out
        .iter()
        .find(|c| matches!(c, Command::PersistIdentities { .. }))
    else {
        panic!("the identities are made durable first: {out:?}")
    };
    assert_eq!(*bootstrap_epoch, Some(epoch));
    assert_eq!(
        identities,
        &(0..STORES).map(|i| Some(ident(i))).collect::<Vec<_>>()
    );
    assert!(
        !out.iter()
            .any(|c| matches!(c, Command::BecameMaster { .. })),
        "{out:?}"
    );
    h.engine.identities_persisted(Some(epoch), true, h.now);
    let out = h.take();
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::BecameMaster { .. })),
        "{out:?}"
    );
}

#[test]
fn a_broker_that_knows_no_voter_never_fences_a_non_empty_store() {
    let mut h = H::new(false);
    let out = h.tick_until(|c| matches!(c, Command::ReadTail { .. }));
    let generation = out
        .iter()
        .find_map(|c| match c {
            Command::ReadTail { generation, .. } => Some(*generation),
            _ => None,
        })
        .expect("a probe");
    h.engine.tail_answer(
        store(0),
        generation,
        Ok(TailAnswer {
            last: Some(LogPosition {
                epoch: Epoch(0x1_0002),
                offset: Offset(4),
            }),
            voter: true,
        }),
        h.now,
    );
    for i in 1..STORES {
        h.engine.tail_answer(
            store(i),
            generation,
            Ok(TailAnswer {
                last: None,
                voter: true,
            }),
            h.now,
        );
    }
    let out = h.take();
    assert!(
        !out.iter()
            .any(|c| matches!(c, Command::TakingOver { .. } | Command::SendFence { .. })),
        "{out:?}"
    );
    assert!(matches!(h.engine.role(), RoleView::Follower(_)));
}

/// The Trim events among the appends in `out`, as (offset, body).
fn trims_sent(out: &[Command]) -> Vec<(Offset, quire_proto::TrimEvent)> {
    out.iter()
        .filter_map(|c| match c {
            Command::Append(a) if a.slot == store(0) => match &a.events {
                AppendEvents::InMemory(events) => Some(events.clone()),
                AppendEvents::FromStore { .. } => None,
            },
            _ => None,
        })
        .flatten()
        .filter(|e| e.kind == quire_proto::EventKind::Trim)
        .filter_map(|e| {
            match quire_proto::EventBody::decode(quire_proto::EventKind::Trim, &e.payload) {
                Ok(quire_proto::EventBody::Trim(t)) => Some((e.offset, t)),
                _ => None,
            }
        })
        .collect()
}

/// A serving master with a 10-byte retention bound, its config tuned by `tune`.
fn serving_with_retention(tune: impl FnOnce(&mut EngineConfig)) -> H {
    let mut cfg = config(true);
    cfg.retention = crate::retention::RetentionPolicy {
        bytes_max: Some(10),
        age_ms_max: None,
    };
    tune(&mut cfg);
    let mut h = H {
        engine: Engine::new(cfg, 0, 0),
        now: 0,
        seen: Vec::new(),
    };
    for i in 0..=STORES {
        h.engine
            .link(SlotId(u16::try_from(i).expect("few")), true, 0);
    }
    h.become_serving();
    h
}

/// Acks every append that goes out, and those that follow, until nothing more does
/// (checkpoint parts come as acks make room); returns the Trim events sent.
fn ack_until_quiet(h: &mut H) -> Vec<(Offset, quire_proto::TrimEvent)> {
    let mut trims = Vec::new();
    let mut out = h.take();
    while !out.is_empty() {
        trims.extend(trims_sent(&out));
        out = h.ack(&out);
    }
    trims
}

/// Produces one message a heartbeat tick, acking everything that goes out, until the trim
/// point rises (at most `rounds` ticks); returns the Trim events sent.
fn produce_until_trimmed(h: &mut H, rounds: u64) -> Vec<(Offset, quire_proto::TrimEvent)> {
    let mut trims = Vec::new();
    for seq in 0..rounds {
        let out = h.produce(seq, seq);
        h.ack(&out);
        h.now += HEARTBEAT_MS;
        h.engine.tick(h.now);
        h.engine.flush(h.now);
        trims.extend(ack_until_quiet(h));
        if h.engine.state().trim_point() > Offset::ZERO {
            break;
        }
    }
    trims
}

#[test]
fn a_master_past_its_retention_bound_proposes_a_checkpoint_and_the_trim_point_rises() {
    let mut h = serving_with_retention(|_| {});
    assert_eq!(h.engine.state().trim_point(), Offset::ZERO);
    // Each tick marks how far the log reached; past 10 bytes it plans a trim; the
    // checkpoint is taken once nothing is in flight (here at once) and goes out as an
    // ordinary event.
    let trims = produce_until_trimmed(&mut h, 40);
    assert!(
        !trims.is_empty(),
        "a Trim event was proposed: {:?}",
        h.seen.len()
    );
    let (offset, first) = &trims[0];
    assert!(
        first.checkpoint.is_some(),
        "every trim point carries a checkpoint"
    );
    assert!(*offset > Offset::ZERO);
    let trim_point = h.engine.state().trim_point();
    assert!(trim_point > Offset::ZERO, "a later trim point was applied");
    assert_eq!(h.engine.trimmed_below(Offset::ZERO), Some(trim_point));
    assert_eq!(h.engine.trimmed_below(trim_point), None);
}

/// A state larger than `checkpoint_part_bytes` goes out as a run of parts at consecutive
/// offsets, proposed as the in-flight bound lets (writes held meanwhile); the checkpoint
/// counts at its first part once the last is applied, and the trim point reaches it.
#[test]
fn a_checkpoint_larger_than_a_part_goes_out_in_parts_and_the_trim_point_reaches_it() {
    let mut h = serving_with_retention(|cfg| {
        cfg.checkpoint_part_bytes = 24;
        // Room for a few parts at a time: the rest wait for acks.
        cfg.limits.inflight_bytes_max = 400;
    });
    let trims = produce_until_trimmed(&mut h, 60);
    let parts: Vec<_> = trims
        .iter()
        .filter_map(|(o, t)| t.part.as_ref().map(|p| (*o, p.clone())))
        .collect();
    assert!(
        trims.iter().all(|(_, t)| t.checkpoint.is_none()),
        "{trims:?}"
    );
    let (first, head) = parts.first().expect("parts were proposed");
    assert_eq!(head.index, 0);
    assert!(head.count >= 3, "{} parts", head.count);
    for (i, (o, p)) in parts.iter().take(head.count as usize).enumerate() {
        assert_eq!(p.index as usize, i);
        assert_eq!(o.0, first.0 + i as u64, "parts at consecutive offsets");
    }
    let trim_point = h.engine.state().trim_point();
    assert_eq!(trim_point, *first, "the trim point is the first checkpoint");
    assert_eq!(h.engine.trimmed_below(Offset::ZERO), Some(trim_point));
}

/// Checkpoints do not count toward the retention bound: once the trim point rose, an idle
/// master proposes no more of them, although each is larger than the 10-byte bound (a
/// break-it trial: an idle cluster with a state above retention_bytes wrote a checkpoint
/// of 1,290 parts 5-10 times a second).
#[test]
fn an_idle_master_writes_no_checkpoint_after_checkpoint() {
    let mut h = serving_with_retention(|_| {});
    assert!(!produce_until_trimmed(&mut h, 40).is_empty());
    let mut trims = Vec::new();
    for _ in 0..50 {
        h.now += HEARTBEAT_MS;
        h.engine.tick(h.now);
        h.engine.flush(h.now);
        trims.extend(ack_until_quiet(&mut h));
    }
    assert!(trims.len() <= 1, "{} checkpoints while idle", trims.len());
}

fn handoff_outcomes(out: &[Command]) -> Vec<Result<HandoffDone, HandoffFailure>> {
    out.iter()
        .filter_map(|c| match c {
            Command::HandoffDone { outcome, .. } => Some(outcome.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_handoff_drains_asks_the_target_steps_down_and_ends_when_the_new_master_serves() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    let first = h.produce(1, 0); // in flight
    h.engine
        .handoff_request(RequestToken(100), BrokerId(2), h.now);
    assert!(h.engine.is_handing_off());
    let out = h.produce(2, 1);
    assert!(
        !out.iter().any(|c| matches!(c, Command::Append(a) if matches!(&a.events, AppendEvents::InMemory(e) if !e.is_empty()))),
        "nothing new is proposed while the handoff drains: {out:?}"
    );
    // The first write stabilizes: drained, so the target is asked.
    let out = h.ack(&first);
    assert_eq!(answers(&out).len(), 1, "{out:?}");
    assert!(
        out.iter()
            .any(|c| matches!(c, Command::AskTakeOver { to, epoch: e, .. } if *to == BrokerId(2) && *e == epoch)),
        "{out:?}"
    );
    let next = h
        .engine
        .master_core()
        .map(crate::core::MasterCore::next_offset)
        .expect("still master until the target answers");
    h.engine.take_over_answer(epoch, Ok(()), h.now);
    let out = h.take();
    assert!(
        out.iter().any(|c| matches!(c, Command::LeftMaster { .. })),
        "{out:?}"
    );
    assert_eq!(answers(&out), vec![(RequestToken(2), Reply::NotMaster)]);
    assert_eq!(
        h.engine.master_hint(h.now).1,
        Some(BrokerId(2)),
        "the hint names the target"
    );
    assert!(
        handoff_outcomes(&out).is_empty(),
        "not done before the new master serves"
    );
    // The target's first append carries its epoch-start event at `next`, stabilized.
    let new = Epoch((2 << 16) | 2);
    let start = quire_proto::EventBody::EpochStart(quire_proto::EpochStartEvent {
        epoch: new,
        broker: BrokerId(2),
        voters: Vec::new(),
    })
    .to_payload()
    .expect("a small event encodes");
    let prev = Some(LogPosition {
        epoch,
        offset: Offset(next.0 - 1),
    });
    let answer = h.engine.inbound_append(
        AppendId(5),
        AppendRequest {
            epoch: new,
            prev,
            events: vec![quire_proto::Event {
                epoch: new,
                offset: next,
                kind: quire_proto::EventKind::EpochStart,
                payload: start,
            }],
            hwm: Some(next),
        },
        h.now,
    );
    assert!(matches!(answer, InboundAnswer::Has { .. }), "{answer:?}");
    let out = h.take();
    let done = handoff_outcomes(&out);
    assert!(
        matches!(done.as_slice(), [Ok(HandoffDone { epoch: e, .. })] if *e == new),
        "{out:?}"
    );
    assert!(!h.engine.is_handing_off());
}

#[test]
fn a_handoff_to_an_unreachable_target_fails_in_bounded_time_and_the_master_serves_on() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    h.engine.link(SLAVE, false, h.now);
    h.engine
        .handoff_request(RequestToken(100), BrokerId(2), h.now);
    let out = h.produce(1, 0);
    assert!(answers(&out).is_empty());
    // The stores go on acking (heartbeats included); the handoff's deadline passes.
    let mut produced = Vec::new();
    let mut done = Vec::new();
    for _ in 0..100 {
        h.now += HEARTBEAT_MS;
        h.engine.tick(h.now);
        h.engine.flush(h.now);
        let out = h.take();
        done.extend(handoff_outcomes(&out));
        let acked = h.ack(&out);
        produced.extend(answers(&acked));
        if !done.is_empty() && !produced.is_empty() {
            break;
        }
    }
    assert_eq!(
        done,
        vec![Err(HandoffFailure::TargetUnreachable(BrokerId(2)))]
    );
    assert_eq!(h.engine.master_epoch(), Some(epoch));
    // The held write went out once the handoff was over.
    assert!(
        matches!(
            produced.as_slice(),
            [(RequestToken(1), Reply::Produced { .. })]
        ),
        "{produced:?}"
    );
}

#[test]
fn a_handoff_is_refused_by_a_slave_for_a_second_one_and_to_an_unknown_broker() {
    let mut h = H::new(true);
    h.engine
        .handoff_request(RequestToken(1), BrokerId(2), h.now);
    assert_eq!(
        handoff_outcomes(&h.take()),
        vec![Err(HandoffFailure::NotMaster)]
    );
    h.become_serving();
    h.engine
        .handoff_request(RequestToken(2), BrokerId(9), h.now);
    assert_eq!(
        handoff_outcomes(&h.take()),
        vec![Err(HandoffFailure::NotABroker(BrokerId(9)))]
    );
    h.engine.link(SLAVE, false, h.now);
    h.engine
        .handoff_request(RequestToken(3), BrokerId(2), h.now);
    h.engine
        .handoff_request(RequestToken(4), BrokerId(2), h.now);
    assert_eq!(
        handoff_outcomes(&h.take()),
        vec![Err(HandoffFailure::AlreadyRunning)]
    );
}

#[test]
fn a_slave_takes_over_now_only_for_the_master_it_follows() {
    let mut h = H::new(true);
    assert!(
        !h.engine.take_over_now(Epoch(0x5_0002), h.now),
        "it follows no master"
    );
    let master = Epoch((3 << 16) | 2);
    let start = quire_proto::EventBody::EpochStart(quire_proto::EpochStartEvent {
        epoch: master,
        broker: BrokerId(2),
        voters: Vec::new(),
    })
    .to_payload()
    .expect("a small event encodes");
    let answer = h.engine.inbound_append(
        AppendId(1),
        AppendRequest {
            epoch: master,
            prev: None,
            events: vec![quire_proto::Event {
                epoch: master,
                offset: Offset::ZERO,
                kind: quire_proto::EventKind::EpochStart,
                payload: start,
            }],
            hwm: Some(Offset::ZERO),
        },
        h.now,
    );
    assert!(matches!(answer, InboundAnswer::Has { .. }), "{answer:?}");
    assert!(h.engine.take_over_now(master, h.now));
    let out = h.take();
    assert!(
        out.iter().any(|c| matches!(c, Command::TakingOver { .. })),
        "{out:?}"
    );
}

fn fetch_replies(out: &[Command]) -> Vec<(RequestToken, FetchReply)> {
    out.iter()
        .filter_map(|c| match c {
            Command::FetchAnswer { token, reply } => Some((*token, reply.clone())),
            _ => None,
        })
        .collect()
}

fn fetch_req(from: u64, wait_ms: u32) -> quire_proto::FetchRequest {
    quire_proto::FetchRequest {
        records: false,
        topic: "t".into(),
        from_offset: Offset(from),
        max_messages: 10,
        max_bytes: 1 << 20,
        wait_ms,
    }
}

#[test]
fn a_fetch_gets_stabilized_messages_and_a_slave_refuses_it() {
    let mut h = H::new(true);
    h.engine
        .fetch(RequestToken(1), fetch_req(0, 0), h.now, h.now);
    assert_eq!(
        fetch_replies(&h.take()),
        vec![(RequestToken(1), FetchReply::NotMaster)]
    );
    h.become_serving();
    let out = h.produce(2, 0);
    h.engine
        .fetch(RequestToken(3), fetch_req(0, 0), h.now, h.now);
    let replies = fetch_replies(&h.take());
    let [(RequestToken(3), FetchReply::Messages(m))] = replies.as_slice() else {
        panic!("{replies:?}")
    };
    assert!(m.messages.is_empty(), "nothing before it is stabilized");
    h.ack(&out);
    h.engine
        .fetch(RequestToken(4), fetch_req(0, 0), h.now, h.now);
    let replies = fetch_replies(&h.take());
    let [(RequestToken(4), FetchReply::Messages(m))] = replies.as_slice() else {
        panic!("{replies:?}")
    };
    assert_eq!(m.messages, vec![(Offset(1), Bytes::from_static(b"m"))]);
    assert_eq!(m.next_offset, Offset(2));
}

#[test]
fn a_long_poll_is_woken_by_a_message_answered_empty_at_its_deadline_and_refused_on_step_down() {
    let mut h = H::new(true);
    let epoch = h.become_serving();
    h.engine
        .fetch(RequestToken(1), fetch_req(0, 200), h.now, h.now);
    assert!(fetch_replies(&h.take()).is_empty(), "parked");
    let out = h.produce(2, 0);
    let out = h.ack(&out);
    let replies = fetch_replies(&out);
    assert!(
        matches!(replies.as_slice(), [(RequestToken(1), FetchReply::Messages(m))] if m.messages.len() == 1),
        "woken by the message: {replies:?}"
    );
    // A poll with nothing to read is answered empty once its wait runs out.
    h.engine
        .fetch(RequestToken(3), fetch_req(2, 120), h.now, h.now);
    let mut replies = Vec::new();
    for _ in 0..5 {
        h.now += HEARTBEAT_MS;
        h.engine.tick(h.now);
        let out = h.take();
        replies.extend(fetch_replies(&out));
        h.ack(&out);
    }
    assert!(
        matches!(replies.as_slice(), [(RequestToken(3), FetchReply::Messages(m))] if m.messages.is_empty()),
        "{replies:?}"
    );
    // A parked poll gets NotMaster when the master steps down.
    h.engine
        .fetch(RequestToken(4), fetch_req(2, 10_000), h.now, h.now);
    assert!(fetch_replies(&h.take()).is_empty());
    let rival = Epoch(epoch.0 + (1 << 16) + 1);
    h.engine.inbound_append(
        AppendId(9),
        AppendRequest {
            epoch: rival,
            prev: None,
            events: Vec::new(),
            hwm: None,
        },
        h.now,
    );
    assert_eq!(
        fetch_replies(&h.take()),
        vec![(RequestToken(4), FetchReply::NotMaster)]
    );
}

#[test]
fn readiness_follows_the_role() {
    let mut h = H::new(true);
    assert!(
        matches!(h.engine.readiness(h.now), Readiness::NotReady(_)),
        "no master known"
    );
    let epoch = h.start_fencing();
    assert!(
        matches!(h.engine.readiness(h.now), Readiness::NotReady(m) if m.contains("taking over"))
    );
    let out = h.grant_all(epoch);
    assert!(
        matches!(h.engine.readiness(h.now), Readiness::NotReady(m) if m.contains("not serving yet"))
    );
    h.ack(&out);
    assert_eq!(h.engine.readiness(h.now), Readiness::Ready);
    h.engine.link(SLAVE, false, h.now);
    h.engine
        .handoff_request(RequestToken(1), BrokerId(2), h.now);
    assert!(
        matches!(h.engine.readiness(h.now), Readiness::NotReady(m) if m.contains("handing off"))
    );
}

fn repairs(out: &[Command]) -> Vec<(SlotId, Offset, SlotId)> {
    out.iter()
        .filter_map(|c| match c {
            Command::RepairRecord {
                slot,
                offset,
                source,
            } => Some((*slot, *offset, *source)),
            _ => None,
        })
        .collect()
}

/// A damaged record reported by a store: reported while taking over, it is repaired from
/// any other store and remembered for the master; as master, the engine passes the store
/// over for that range and asks for one repair from a store that acked it, retried at
/// ticks until the store's copy is good, then chains to the next damaged record the store
/// names.
#[test]
fn a_damaged_store_record_is_repaired_from_another_store() {
    let mut h = H::new(true);
    // Reported during the takeover (a fence answered Corrupt): remembered, and repaired
    // at once from another connected store (a broker taking over may need that store's
    // grant). Here the source does not hold it yet.
    let epoch = h.start_fencing();
    h.engine.read_corrupt(store(0), Offset(0), h.now);
    let asked = repairs(&h.take());
    assert_eq!(asked.len(), 1, "{asked:?}");
    assert_eq!((asked[0].0, asked[0].1), (store(0), Offset(0)));
    assert_ne!(asked[0].2, store(0));
    h.engine.repair_done(
        store(0),
        Offset(0),
        Err("the source does not hold offset 0".into()),
        h.now,
    );
    let out = h.grant_all(epoch);
    // Once master, the report is replayed, and store 0 is no source for offset 0.
    let core = h.engine.master_core().expect("master");
    assert!(core.slot_corrupt_in(store(0), Offset(0), Offset(0)));
    // No store acked offset 0 in this epoch yet: no good copy to repair from.
    assert!(repairs(&out).is_empty());
    h.ack(&out);
    assert!(h.engine.is_serving());
    // A message at offset 1, acked by every store.
    let out = h.produce(1, 0);
    h.ack(&out);
    let out = h.tick_until(|c| matches!(c, Command::RepairRecord { .. }));
    let asked = repairs(&out);
    assert_eq!(asked.len(), 1, "{out:?}");
    let (slot, offset, source) = asked[0];
    assert_eq!((slot, offset), (store(0), Offset(0)));
    assert_ne!(source, store(0));
    // One repair out at a time: a tick asks for no second one.
    h.now += HEARTBEAT_MS;
    h.engine.tick(h.now);
    assert!(repairs(&h.take()).is_empty());
    // Not applied (the store says it no longer holds the offset): retried at a later tick.
    h.engine.repair_done(
        slot,
        offset,
        Ok(quire_proto::RepairResponse {
            offset,
            outcome: quire_proto::RepairOutcome::NotHeld,
            next_corrupt: Some(offset),
        }),
        h.now,
    );
    let out = h.tick_until(|c| matches!(c, Command::RepairRecord { .. }));
    assert_eq!(repairs(&out).len(), 1);
    // Repaired: store 0 may serve the range again; the next damaged record it names is
    // repaired next.
    h.engine.repair_done(
        slot,
        offset,
        Ok(quire_proto::RepairResponse {
            offset,
            outcome: quire_proto::RepairOutcome::Repaired,
            next_corrupt: Some(Offset(1)),
        }),
        h.now,
    );
    let core = h.engine.master_core().expect("master");
    assert!(!core.slot_corrupt_in(store(0), Offset(0), Offset(0)));
    assert!(core.slot_corrupt_in(store(0), Offset(1), Offset(1)));
    let out = h.take();
    assert_eq!(
        repairs(&out).iter().map(|r| (r.0, r.1)).collect::<Vec<_>>(),
        vec![(store(0), Offset(1))],
        "{out:?}"
    );
}
