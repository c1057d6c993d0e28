//! Unit tests of the slave follower core and its election timer.

use bytes::Bytes;
use quire_proto::{BrokerId, Epoch, LogPosition, Offset};

use super::*;
use crate::core::master::{
    AppendCommand, AppendEvents, MasterCommand, MasterConfig, MasterCore, MasterInput,
    ReplicationLimits,
};
use crate::core::takeover::AdoptedLog;
use crate::core::testkit::{event, ident, stores};
use crate::core::{SlotId, SlotKind};

fn pos(e: u64, o: u64) -> LogPosition {
    LogPosition {
        epoch: Epoch(e),
        offset: Offset(o),
    }
}

fn config() -> FollowerConfig {
    FollowerConfig {
        election: ElectionConfig {
            election_timeout_ms_min: 100,
            election_timeout_ms_jitter: 50,
            rank: 0,
            me: BrokerId(1),
            rank_step_ms: 60,
        },
        retained_bytes_max: u64::MAX,
    }
}

fn follower() -> FollowerCore {
    FollowerCore::new(config(), LocalLog::empty(), Epoch::ZERO, 7, 0).expect("valid")
}

fn append(
    id: u64,
    epoch: u64,
    prev: Option<LogPosition>,
    epochs: &[u64],
    hwm: Option<u64>,
) -> FollowerInput {
    let first = prev.map_or(0, |p| p.offset.0 + 1);
    FollowerInput::Append {
        append: AppendId(id),
        epoch: Epoch(epoch),
        prev,
        events: epochs
            .iter()
            .enumerate()
            .map(|(i, &e)| event(e, first + i as u64, 2))
            .collect(),
        hwm: hwm.map(Offset),
    }
}

fn applied_offsets(out: &[FollowerCommand]) -> Vec<u64> {
    out.iter()
        .filter_map(|c| match c {
            FollowerCommand::Apply { events } => {
                Some(events.iter().map(|e| e.offset.0).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn answers_prev_plus_count_and_applies_up_to_what_the_append_vouched_for() {
    let mut f = follower();
    let mut out = Vec::new();
    f.handle(append(1, 5, None, &[5, 5, 5], None), &mut out);
    assert_eq!(
        out,
        vec![FollowerCommand::Has {
            append: AppendId(1),
            epoch: Epoch(5),
            through: Some(Offset(2))
        }]
    );
    out.clear();
    // The master's HWM is 2 but this heartbeat only vouches for the log through offset 0.
    f.handle(append(2, 5, Some(pos(5, 0)), &[], Some(2)), &mut out);
    assert_eq!(
        out[0],
        FollowerCommand::Has {
            append: AppendId(2),
            epoch: Epoch(5),
            through: Some(Offset(0))
        }
    );
    assert_eq!(applied_offsets(&out), vec![0]);
    out.clear();
    f.handle(append(3, 5, Some(pos(5, 2)), &[5], Some(2)), &mut out);
    assert_eq!(applied_offsets(&out), vec![1, 2]);
    assert_eq!((f.hwm(), f.applied()), (Some(Offset(2)), Some(Offset(2))));
    // an empty append at the start of an empty log answers "nothing"
    let mut g = follower();
    out.clear();
    g.handle(append(9, 5, None, &[], Some(4)), &mut out);
    assert_eq!(
        out,
        vec![FollowerCommand::Has {
            append: AppendId(9),
            epoch: Epoch(5),
            through: None
        }]
    );
}

#[test]
fn refuses_an_older_master_and_a_prev_it_does_not_hold() {
    let mut f = follower();
    let mut out = Vec::new();
    f.handle(append(1, 7, None, &[3, 7], None), &mut out);
    out.clear();
    f.handle(append(2, 6, Some(pos(7, 1)), &[6], None), &mut out);
    assert_eq!(
        out,
        vec![FollowerCommand::Refuse {
            append: AppendId(2),
            known_epoch: Epoch(7),
            last: Some(pos(7, 1)),
            reason: RejectReason::StaleEpoch
        }]
    );
    out.clear();
    f.handle(append(3, 7, Some(pos(7, 4)), &[7], None), &mut out);
    assert!(matches!(
        out[..],
        [FollowerCommand::Refuse {
            reason: RejectReason::LogMismatch,
            ..
        }]
    ));
    out.clear();
    f.handle(append(4, 7, Some(pos(5, 1)), &[7], None), &mut out);
    assert!(matches!(
        out[..],
        [FollowerCommand::Refuse {
            reason: RejectReason::LogMismatch,
            ..
        }]
    ));
    assert_eq!(f.stats().refused_mismatch, 2);
}

#[test]
fn a_new_master_replaces_the_unapplied_divergent_suffix_but_never_an_applied_event() {
    let mut f = follower();
    let mut out = Vec::new();
    f.handle(append(1, 3, None, &[3, 3, 3, 3], Some(1)), &mut out);
    assert_eq!(f.applied(), Some(Offset(1)));
    out.clear();
    // epoch 9 holds [3,3,9]: offsets 2 and 3 of epoch 3 are replaced
    f.handle(append(2, 9, Some(pos(3, 1)), &[9], None), &mut out);
    assert_eq!(
        out,
        vec![FollowerCommand::Has {
            append: AppendId(2),
            epoch: Epoch(9),
            through: Some(Offset(2))
        }]
    );
    assert_eq!(f.log().last(), Some(pos(9, 2)));
    // equal entries are kept: a resend of what it holds changes nothing
    let before = f.log().clone();
    f.handle(append(3, 9, Some(pos(3, 0)), &[3, 9], None), &mut out);
    assert_eq!(f.log(), &before);
    // a master asking to overwrite an applied event is refused and nothing changes
    out.clear();
    f.handle(append(4, 11, None, &[11], None), &mut out);
    assert!(matches!(
        out[..],
        [FollowerCommand::Refuse {
            reason: RejectReason::Malformed,
            ..
        }]
    ));
    assert_eq!(f.log(), &before);
    assert_eq!(f.stats().refused_truncate_applied, 1);
}

#[test]
fn malformed_appends_are_refused() {
    let mut f = follower();
    let mut out = Vec::new();
    for bad in [
        // offsets not starting at prev + 1
        FollowerInput::Append {
            append: AppendId(1),
            epoch: Epoch(4),
            prev: None,
            events: vec![event(4, 1, 0)],
            hwm: None,
        },
        // an event of a higher epoch than the append's
        append(2, 4, None, &[5], None),
        // epochs going down
        append(3, 4, None, &[4, 2], None),
    ] {
        f.handle(bad, &mut out);
    }
    assert_eq!(f.stats().refused_malformed, 3);
    assert!(f.log().is_empty());
}

#[test]
fn the_election_timer_fires_after_silence_and_valid_appends_rearm_it() {
    let mut f = follower();
    let mut out = Vec::new();
    let d0 = f.deadline_ms();
    assert!(
        (100..=150).contains(&d0),
        "min 100 + rank 0 + jitter <= 50: {d0}"
    );
    f.handle(FollowerInput::Tick { now_ms: d0 - 1 }, &mut out);
    assert!(out.is_empty());
    // an append from the master re-arms the timer from the last tick's time
    f.handle(append(1, 5, None, &[5], None), &mut out);
    out.clear();
    let d1 = f.deadline_ms();
    assert!(d1 >= d0 - 1 + 100);
    f.handle(FollowerInput::Tick { now_ms: d1 - 1 }, &mut out);
    assert!(out.is_empty());
    // a refused append from a deposed master does not
    f.handle(append(2, 4, None, &[4], None), &mut out);
    out.clear();
    assert_eq!(f.deadline_ms(), d1);
    f.handle(FollowerInput::Tick { now_ms: d1 }, &mut out);
    assert_eq!(
        out,
        vec![FollowerCommand::StartTakeover {
            highest_epoch_seen: Epoch(5)
        }]
    );
    assert!(f.deadline_ms() > d1, "re-armed");
    // time never goes back
    out.clear();
    f.handle(FollowerInput::Tick { now_ms: 0 }, &mut out);
    assert!(out.is_empty());
}

#[test]
fn the_timer_is_deterministic_per_seed_and_ranked_by_broker_id() {
    let deadlines = |seed: u64, rank: u32| -> Vec<u64> {
        let mut cfg = config();
        cfg.election.rank = rank;
        let mut f = FollowerCore::new(cfg, LocalLog::empty(), Epoch::ZERO, seed, 0).expect("valid");
        let mut out = Vec::new();
        let mut ds = vec![f.deadline_ms()];
        for _ in 0..20 {
            let now = f.deadline_ms();
            f.handle(FollowerInput::Tick { now_ms: now }, &mut out);
            ds.push(f.deadline_ms() - now);
        }
        ds
    };
    assert_eq!(deadlines(42, 0), deadlines(42, 0));
    assert_ne!(deadlines(42, 0), deadlines(43, 0));
    // jitter (<= 50) is below the rank step (60): rank 0 always fires before rank 1
    let r0 = deadlines(1, 0);
    let r1 = deadlines(2, 1);
    assert!(r0.iter().max() < r1.iter().min(), "{r0:?} vs {r1:?}");
    let brokers = [BrokerId(9), BrokerId(3), BrokerId(5)];
    assert_eq!(
        brokers.map(|b| ElectionConfig::rank_of(&brokers, b)),
        [2, 0, 1]
    );
}

#[test]
fn applied_events_beyond_the_retention_bound_are_trimmed() {
    let per = accounted_bytes(&event(1, 0, 2));
    let mut cfg = config();
    cfg.retained_bytes_max = 2 * per;
    let mut f = FollowerCore::new(cfg, LocalLog::empty(), Epoch::ZERO, 1, 0).expect("valid");
    let mut out = Vec::new();
    f.handle(append(1, 1, None, &[1; 6], Some(3)), &mut out);
    // 0..=3 applied: two of them kept; 4 and 5 unapplied: always kept
    assert_eq!(f.log().mem_start(), Offset(2));
    assert_eq!(f.log().mem_len(), 4);
    let local = f.local_log();
    assert_eq!(local.applied, Some(Offset(3)));
    assert_eq!(local.validate(), Ok(()));
}

/// The master core's stream to a slave slot, carried straight into a follower core and
/// its answers carried back, ends with the slave holding and applying the stabilized log.
#[test]
fn a_slave_follows_a_master_core() {
    let mut cluster = stores(1);
    cluster.slots.push(SlotKind::Slave {
        broker: BrokerId(4),
    });
    let adopted = AdoptedLog {
        epoch: Epoch(8),
        log: crate::core::Log::new(),
        applied: None,
        voters: None,
    };
    let mut mout = Vec::new();
    let cfg = MasterConfig {
        cluster,
        limits: ReplicationLimits {
            append_events_max: 2,
            ..ReplicationLimits::default()
        },
    };
    let mut m = MasterCore::new(cfg, adopted, Bytes::new().into(), &mut mout).expect("valid");
    for _ in 0..5 {
        m.propose(
            EventKind::Message,
            Bytes::from_static(b"hi").into(),
            &mut mout,
        )
        .expect("accepted");
    }
    let mut f = follower();
    let mut applied = Vec::new();
    for round in 0..50 {
        if round % 5 == 4 {
            m.handle(MasterInput::HeartbeatTick, &mut mout);
        }
        for c in std::mem::take(&mut mout) {
            let MasterCommand::Append(a) = c else {
                continue;
            };
            let AppendCommand {
                slot,
                append,
                epoch,
                prev,
                events,
                hwm,
                ..
            } = a;
            let AppendEvents::InMemory(events) = events else {
                panic!("nothing trimmed here")
            };
            if slot == SlotId(0) {
                let through =
                    (prev.map_or(0, |p| p.offset.0 + 1) + events.len() as u64).checked_sub(1);
                let ack = MasterInput::Persisted {
                    slot,
                    append,
                    epoch,
                    through: through.map(Offset),
                    identity: ident(0),
                    voter: true,
                };
                m.handle(ack, &mut mout);
                continue;
            }
            let mut fout = Vec::new();
            f.handle(
                FollowerInput::Append {
                    append,
                    epoch,
                    prev,
                    events,
                    hwm,
                },
                &mut fout,
            );
            for fc in fout {
                match fc {
                    FollowerCommand::Has {
                        append,
                        epoch,
                        through,
                    } => {
                        m.handle(
                            MasterInput::SlaveHas {
                                slot,
                                append,
                                epoch,
                                through,
                            },
                            &mut mout,
                        );
                    }
                    FollowerCommand::Apply { events } => {
                        applied.extend(events.iter().map(|e| e.offset.0))
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
        }
    }
    assert_eq!(m.hwm(), Some(Offset(5)));
    assert_eq!(applied, vec![0, 1, 2, 3, 4, 5]);
    assert_eq!(
        m.slot_status(SlotId(1)).and_then(|s| s.matched),
        Some(Offset(5))
    );
    assert_eq!(f.log().last(), Some(pos(8, 5)));
}

/// A slave restarted after retention deleted the start of the log: the master sends it
/// the log from a checkpoint (a Trim event) whose `prev` the slave does not hold. The
/// slave starts its log there only if `prev` is stabilized (at or below the HWM), above
/// what it applied, beyond its log's end, and the first event is a Trim event.
#[test]
fn a_follower_starts_its_log_at_a_checkpoint_only_when_it_may() {
    let at = |id: u64, prev: LogPosition, kind: EventKind, hwm: Option<u64>| {
        let mut e = event(2, prev.offset.0 + 1, 4);
        e.kind = kind;
        FollowerInput::Append {
            append: AppendId(id),
            epoch: Epoch(2),
            prev: Some(prev),
            events: vec![e, event(2, prev.offset.0 + 2, 4)],
            hwm: hwm.map(Offset),
        }
    };
    let trim = EventKind::Trim;
    let refused = |out: &[FollowerCommand]| {
        matches!(
            out,
            [FollowerCommand::Refuse {
                reason: RejectReason::LogMismatch,
                ..
            }]
        )
    };
    let mut f = follower();
    let mut out = Vec::new();
    // Not a Trim event first, or prev above the HWM: refused as a mismatch.
    f.handle(at(1, pos(2, 99), EventKind::Message, Some(150)), &mut out);
    assert!(refused(&out), "{out:?}");
    out.clear();
    f.handle(at(2, pos(2, 99), trim, Some(98)), &mut out);
    assert!(refused(&out), "{out:?}");
    out.clear();
    // The Trim event itself not stabilized (HWM = prev): a fresh Trim event at the head
    // of an ordinary append, not the log from a checkpoint — refused (quire-sim
    // --retention seed 13065: a jump there skipped the topics' offsets below it).
    f.handle(at(5, pos(2, 99), trim, Some(99)), &mut out);
    assert!(refused(&out), "{out:?}");
    out.clear();
    // A later part of a checkpoint written in parts first: no state can be rebuilt from
    // it, so it is refused like any other event (a break-it trial: a restarted slave
    // started at part 250 of 645 and never caught up).
    let mut later = at(6, pos(2, 99), trim, Some(150));
    if let FollowerInput::Append { events, .. } = &mut later {
        events[0].payload = quire_proto::EventBody::Trim(quire_proto::TrimEvent {
            before: Offset(0),
            checkpoint: None,
            part: Some(quire_proto::CheckpointPart {
                index: 250,
                count: 645,
                snapshot_bytes: 645,
                bytes: bytes::Bytes::from_static(b"x"),
            }),
        })
        .to_payload()
        .expect("encodes");
    }
    f.handle(later, &mut out);
    assert!(refused(&out), "{out:?}");
    out.clear();
    // A checkpoint at 100 after a stabilized prev: the log starts there; both events are
    // applied (HWM 150, vouched through 101), the checkpoint first.
    f.handle(at(3, pos(2, 99), trim, Some(150)), &mut out);
    assert!(
        matches!(
            out[0],
            FollowerCommand::Has {
                through: Some(Offset(101)),
                ..
            }
        ),
        "{out:?}"
    );
    assert_eq!(applied_offsets(&out), vec![100, 101]);
    assert_eq!(f.applied(), Some(Offset(101)));
    assert_eq!(f.log().mem_start(), Offset(100));
    assert_eq!(f.stats().started_at_checkpoint, 1);
    assert!(f.local_log().validate().is_ok());
    // Once it has applied past it, a checkpoint behind it is an ordinary mismatch.
    out.clear();
    f.handle(at(4, pos(2, 49), trim, Some(150)), &mut out);
    assert!(
        matches!(out[..], [FollowerCommand::Has { .. }, ..]),
        "prev 49 is held (below the start): accepted as equal entries: {out:?}"
    );
}

/// With brokers 1, 2 and 3 following master 1, broker 2 is the first candidate (rank 0,
/// no rank step) and broker 3 the second; following master 2, broker 1 stays first and
/// broker 3 second; following master 3, brokers 1 and 2 keep their ranks. Before, broker 2
/// always waited one rank step, so a dead broker 1 cost every failover 250 ms more.
#[test]
fn the_timer_ranks_brokers_without_the_followed_master() {
    let brokers = [BrokerId(1), BrokerId(2), BrokerId(3)];
    let cfg = |me| ElectionConfig::with_rank(&brokers, BrokerId(me));
    let master = |b: u16| Epoch((1 << 16) | u64::from(b));
    assert_eq!(cfg(2).rank_without(master(1)), 0);
    assert_eq!(cfg(3).rank_without(master(1)), 1);
    assert_eq!(cfg(1).rank_without(master(2)), 0);
    assert_eq!(cfg(3).rank_without(master(2)), 1);
    assert_eq!(cfg(1).rank_without(master(3)), 0);
    assert_eq!(cfg(2).rank_without(master(3)), 1);
    // No master followed yet: the plain rank.
    assert_eq!(cfg(3).rank_without(Epoch::ZERO), 2);
    // The timer uses it: broker 2 following master 1 fires within the minimum plus jitter.
    let mut c = config();
    c.election = ElectionConfig {
        election_timeout_ms_jitter: 50,
        election_timeout_ms_min: 100,
        rank_step_ms: 60,
        ..cfg(2)
    };
    let mut f = FollowerCore::new(c, LocalLog::empty(), Epoch::ZERO, 3, 0).expect("valid");
    let mut out = Vec::new();
    f.handle(append(1, master(1).0, None, &[1], None), &mut out);
    assert!(f.deadline_ms() <= 150, "{}", f.deadline_ms());
}
