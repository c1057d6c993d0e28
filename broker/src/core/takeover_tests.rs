//! Unit tests of the takeover core's rules (DESIGN.md "Failover" steps 2–4).

use bytes::Bytes;
use quire_proto::{BrokerId, Epoch, Incarnation, LogPosition, Offset};

use super::*;
use crate::core::log::tests::log_of;
use crate::core::master::{
    AppendCommand, MasterCommand, MasterConfig, MasterCore, ReplicationLimits,
};
use crate::core::testkit::{event, ident, stores, StoreSim};
use crate::core::{SlotId, SlotKind};

const ME: BrokerId = BrokerId(2);

fn pos(e: u64, o: u64) -> LogPosition {
    LogPosition {
        epoch: Epoch(e),
        offset: Offset(o),
    }
}

fn config(n: u64) -> TakeoverConfig {
    TakeoverConfig {
        broker: ME,
        cluster: stores(n),
        fetch_events_max: 64,
    }
}

/// Events with the given epochs at offsets `from..`.
fn events_from(from: u64, epochs: &[u64]) -> Vec<Event> {
    epochs
        .iter()
        .enumerate()
        .map(|(i, &e)| event(e, from + i as u64, 3))
        .collect()
}

/// Starts a takeover and runs it to the fencing phase; returns the core and its epoch.
fn fencing(config: TakeoverConfig, local: LocalLog) -> (TakeoverCore, Epoch) {
    let mut out = Vec::new();
    let mut t = TakeoverCore::start(config, 0, Epoch::ZERO, local, &mut out).expect("valid");
    let TakeoverCommand::PersistEpochCounter { counter, epoch } = out[0] else {
        panic!("{out:?}")
    };
    out.clear();
    t.handle(TakeoverInput::EpochPersisted { counter }, &mut out);
    assert!(out
        .iter()
        .all(|c| matches!(c, TakeoverCommand::SendFence { .. })));
    (t, epoch)
}

fn grant(slot: u16, epoch: Epoch, last: Option<LogPosition>) -> TakeoverInput {
    TakeoverInput::FenceGranted {
        slot: SlotId(slot),
        epoch,
        identity: ident(u64::from(slot)),
        last,
        tail_cut: None,
    }
}

/// A grant carrying a tail-cut mark (the store cut a torn tail at its last start).
fn marked_grant(slot: u16, epoch: Epoch, last: Option<LogPosition>) -> TakeoverInput {
    TakeoverInput::FenceGranted {
        slot: SlotId(slot),
        epoch,
        identity: ident(u64::from(slot)),
        last,
        tail_cut: Some(quire_proto::TailCut {
            offset: last.map_or(Offset::ZERO, |l| l.offset.next()),
            promised: Epoch(1),
        }),
    }
}

#[test]
fn the_epoch_is_persisted_before_any_fence_is_sent() {
    let mut cluster = stores(3);
    cluster.slots.push(SlotKind::Slave {
        broker: BrokerId(7),
    });
    let cfg = TakeoverConfig {
        broker: ME,
        cluster,
        fetch_events_max: 64,
    };
    let seen = Epoch::compose(5, BrokerId(9));
    let mut out = Vec::new();
    let mut t = TakeoverCore::start(cfg, 3, seen, LocalLog::empty(), &mut out).expect("valid");
    let e = Epoch::compose(6, ME);
    assert!(e > seen);
    assert_eq!(
        out,
        vec![TakeoverCommand::PersistEpochCounter {
            counter: 6,
            epoch: e
        }]
    );
    out.clear();
    // Nothing may go out before the counter is durable: grants, a reconnect, a stale
    // confirmation for another counter all leave the core waiting.
    t.handle(grant(0, e, None), &mut out);
    t.handle(TakeoverInput::SlotConnected { slot: SlotId(1) }, &mut out);
    t.handle(TakeoverInput::EpochPersisted { counter: 5 }, &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(t.grant_count(), 0);
    t.handle(TakeoverInput::EpochPersisted { counter: 6 }, &mut out);
    assert_eq!(
        out,
        (0..3)
            .map(|s| TakeoverCommand::SendFence {
                slot: SlotId(s),
                epoch: e
            })
            .collect::<Vec<_>>(),
        "fences go to the store slots only"
    );
    assert_eq!(t.durable_counter(), 6);
}

#[test]
fn only_this_attempts_grants_from_voting_stores_count() {
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    // a grant answering an older fence of ours
    t.handle(grant(0, Epoch(e.0 - (1 << 16)), None), &mut out);
    // the right epoch, but a wiped store's new incarnation
    let reborn = StoreIdentity {
        incarnation: Incarnation(2),
        ..ident(1)
    };
    t.handle(
        TakeoverInput::FenceGranted {
            slot: SlotId(1),
            epoch: e,
            identity: reborn,
            last: None,
            tail_cut: None,
        },
        &mut out,
    );
    // a store that says it is not a voter
    t.handle(
        TakeoverInput::FenceRefused {
            slot: SlotId(2),
            epoch: e,
            promised: Epoch::ZERO,
            reason: FenceRefusal::NotVoter,
        },
        &mut out,
    );
    // an unknown slot
    t.handle(grant(7, e, None), &mut out);
    assert_eq!(t.grant_count(), 0);
    assert!(out.is_empty());
    // one real grant, repeated: still one
    t.handle(grant(0, e, None), &mut out);
    t.handle(grant(0, e, None), &mut out);
    assert_eq!(t.grant_count(), 1);
    assert!(out.is_empty(), "F = 2 not reached");
    let s = *t.stats();
    assert_eq!(
        (
            s.grants_other_epoch,
            s.grants_not_voting,
            s.grants_duplicate,
            s.refusals_not_voter
        ),
        (1, 2, 1, 1)
    );
    t.handle(grant(2, e, None), &mut out);
    assert!(
        matches!(&out[..], [TakeoverCommand::BecomeMaster(a)] if a.log.is_empty() && a.epoch == e)
    );
}

#[test]
fn adopts_the_highest_last_epoch_not_the_longest_log() {
    // S0 holds a long tail from a zombie of epoch 2 that never stabilized; S1 holds the log of
    // epoch 3, whose master may have stabilized offset 3. Adopting the longest log (S0) would
    // lose it; Raft's order (last epoch, then offset) picks S1.
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(0, e, Some(pos(2, 5))), &mut out);
    t.handle(grant(1, e, Some(pos(3, 3))), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(1),
            epoch: e,
            from: Offset(0),
            through: Offset(3)
        }]
    );
    out.clear();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(1),
            epoch: e,
            events: events_from(0, &[1, 1, 3, 3]),
        },
        &mut out,
    );
    let [TakeoverCommand::BecomeMaster(adopted)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(adopted.log.last(), Some(pos(3, 3)));
    assert_eq!(
        adopted
            .log
            .epoch_runs()
            .map(|p| p.epoch.0)
            .collect::<Vec<_>>(),
        vec![1, 3]
    );
}

#[test]
fn the_adopt_longest_mutation_is_off_by_default_and_picks_the_longest_log_when_on() {
    // The test-only hook quire-sim uses to show its checker catches this rule's absence.
    let grants = [(0, pos(2, 5)), (1, pos(3, 3))];
    for (mutation, slot, through) in [
        (TakeoverMutation::None, 1, 3),
        (TakeoverMutation::AdoptLongest, 0, 5),
    ] {
        let (mut t, e) = fencing(config(3), LocalLog::empty());
        if mutation != TakeoverMutation::default() {
            t.set_mutation(mutation);
        }
        let mut out = Vec::new();
        for (s, last) in grants {
            t.handle(grant(s, e, Some(last)), &mut out);
        }
        assert_eq!(
            out,
            vec![TakeoverCommand::Fetch {
                slot: SlotId(slot),
                epoch: e,
                from: Offset(0),
                through: Offset(through)
            }],
            "{mutation:?}"
        );
        let changed = u64::from(mutation != TakeoverMutation::None);
        assert_eq!(t.take_mutated_steps(), changed, "{mutation:?}");
        assert_eq!(t.take_mutated_steps(), 0);
    }
}

#[test]
fn equal_epochs_prefer_the_higher_offset() {
    let (mut t, e) = fencing(config(5), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(3, e, Some(pos(4, 6))), &mut out);
    t.handle(grant(0, e, Some(pos(4, 2))), &mut out);
    t.handle(grant(4, e, Some(pos(1, 9))), &mut out);
    assert!(
        matches!(
            out[..],
            [TakeoverCommand::Fetch {
                slot: SlotId(3),
                through: Offset(6),
                ..
            }]
        ),
        "{out:?}"
    );
}

#[test]
fn a_fetched_tail_that_does_not_end_at_the_grant_aborts_and_a_retry_uses_a_higher_epoch() {
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(0, e, Some(pos(3, 2))), &mut out);
    t.handle(grant(1, e, Some(pos(1, 0))), &mut out);
    out.clear();
    // The store's offset 2 is of epoch 2, not the granted epoch 3.
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: events_from(0, &[1, 2, 2]),
        },
        &mut out,
    );
    assert_eq!(
        out,
        vec![TakeoverCommand::Aborted {
            epoch: e,
            reason: AbortReason::FetchedTailMismatch {
                granted: pos(3, 2),
                got: pos(2, 2)
            }
        }]
    );
    assert!(!t.is_running());
    out.clear();
    t.restart(&mut out);
    let [TakeoverCommand::PersistEpochCounter { counter, epoch }] = out[..] else {
        panic!("{out:?}")
    };
    assert!(epoch > e);
    assert_eq!(epoch, Epoch::compose(counter, ME));
    out.clear();
    // a grant for the aborted attempt's epoch no longer counts
    t.handle(TakeoverInput::EpochPersisted { counter }, &mut out);
    out.clear();
    t.handle(grant(0, e, Some(pos(3, 2))), &mut out);
    assert_eq!(t.grant_count(), 0);
}

#[test]
fn fetched_events_past_the_grant_or_out_of_order_abort() {
    for (events, reason) in [
        (
            events_from(0, &[1, 3, 3, 3]),
            AbortReason::FetchedTailMismatch {
                granted: pos(3, 2),
                got: pos(3, 3),
            },
        ),
        (
            events_from(1, &[1, 3]),
            AbortReason::FetchNotContiguous {
                expected: Offset(0),
                got: Offset(1),
            },
        ),
        (
            events_from(0, &[2, 1, 3]),
            AbortReason::FetchedTailMismatch {
                granted: pos(3, 2),
                got: pos(1, 1),
            },
        ),
        (
            Vec::new(),
            AbortReason::FetchEmpty {
                expected: Offset(0),
            },
        ),
    ] {
        let (mut t, e) = fencing(config(3), LocalLog::empty());
        let mut out = Vec::new();
        t.handle(grant(0, e, Some(pos(3, 2))), &mut out);
        t.handle(grant(1, e, None), &mut out);
        out.clear();
        t.handle(
            TakeoverInput::Fetched {
                slot: SlotId(0),
                epoch: e,
                events,
            },
            &mut out,
        );
        assert_eq!(out, vec![TakeoverCommand::Aborted { epoch: e, reason }]);
    }
}

#[test]
fn fetches_in_bounded_batches_and_ignores_stale_answers() {
    let cfg = TakeoverConfig {
        fetch_events_max: 2,
        ..config(3)
    };
    let (mut t, e) = fencing(cfg, LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(0, e, Some(pos(1, 4))), &mut out);
    t.handle(grant(2, e, Some(pos(1, 1))), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(0),
            through: Offset(1)
        }]
    );
    out.clear();
    // an answer from the wrong store, or for another epoch, is ignored
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(2),
            epoch: e,
            events: events_from(0, &[1]),
        },
        &mut out,
    );
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: Epoch(1),
            events: events_from(0, &[1]),
        },
        &mut out,
    );
    assert!(out.is_empty());
    assert_eq!(t.stats().fetches_stale, 2);
    // the store may answer with less than asked: the core asks for the rest
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: events_from(0, &[1]),
        },
        &mut out,
    );
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(1),
            through: Offset(2)
        }]
    );
    out.clear();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: events_from(1, &[1, 1]),
        },
        &mut out,
    );
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(3),
            through: Offset(4)
        }]
    );
    out.clear();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: events_from(3, &[1, 1]),
        },
        &mut out,
    );
    assert!(matches!(&out[..], [TakeoverCommand::BecomeMaster(a)] if a.log.end() == Offset(5)));
}

#[test]
fn a_local_log_holding_the_granted_entry_needs_no_fetch() {
    let local = LocalLog {
        log: log_of(&[1, 1, 2, 2, 2]),
        applied: Some(Offset(1)),
    };
    let (mut t, e) = fencing(config(3), local);
    let mut out = Vec::new();
    t.handle(grant(0, e, Some(pos(2, 3))), &mut out);
    t.handle(grant(1, e, Some(pos(1, 1))), &mut out);
    let [TakeoverCommand::BecomeMaster(a)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(
        (a.log.last(), a.applied),
        (Some(pos(2, 3)), Some(Offset(1))),
        "local entry 4 dropped"
    );
}

#[test]
fn the_applied_prefix_is_kept_and_the_divergent_rest_is_fetched() {
    // Local: [1,1,2,2] applied through 1; entries 2..3 of epoch 2 never stabilized.
    // Adopted store: [1,1,3] (epoch 3 replaced them).
    let local = LocalLog {
        log: log_of(&[1, 1, 2, 2]),
        applied: Some(Offset(1)),
    };
    let (mut t, e) = fencing(config(3), local);
    let mut out = Vec::new();
    t.handle(grant(0, e, Some(pos(3, 2))), &mut out);
    t.handle(grant(1, e, Some(pos(2, 3))), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(2),
            through: Offset(2)
        }]
    );
    out.clear();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: events_from(2, &[3]),
        },
        &mut out,
    );
    let [TakeoverCommand::BecomeMaster(a)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(
        a.log
            .epoch_runs()
            .map(|p| (p.epoch.0, p.offset.0))
            .collect::<Vec<_>>(),
        vec![(1, 0), (3, 2)]
    );
}

#[test]
fn a_grant_below_what_was_applied_aborts() {
    let local = LocalLog {
        log: log_of(&[1, 1, 1]),
        applied: Some(Offset(2)),
    };
    let (mut t, e) = fencing(config(3), local);
    let mut out = Vec::new();
    t.handle(grant(0, e, None), &mut out);
    t.handle(grant(1, e, Some(pos(1, 1))), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Aborted {
            epoch: e,
            reason: AbortReason::GrantBelowApplied {
                granted: Some(pos(1, 1)),
                applied: Offset(2)
            }
        }]
    );
}

#[test]
fn a_rivals_higher_epoch_in_any_answer_steps_back() {
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    // our own epoch as promised (a repeated fence) is no rival
    t.handle(
        TakeoverInput::FenceRefused {
            slot: SlotId(1),
            epoch: e,
            promised: e,
            reason: FenceRefusal::Promised,
        },
        &mut out,
    );
    assert!(out.is_empty());
    let rival = Epoch::compose(e.counter() + 1, BrokerId(1));
    t.handle(
        TakeoverInput::FenceRefused {
            slot: SlotId(0),
            epoch: e,
            promised: rival,
            reason: FenceRefusal::Promised,
        },
        &mut out,
    );
    assert_eq!(out, vec![TakeoverCommand::StepBack { rival }]);
    out.clear();
    t.handle(grant(1, e, None), &mut out);
    t.handle(grant(2, e, None), &mut out);
    t.restart(&mut out);
    assert!(out.is_empty(), "a stepped-back takeover does nothing more");
    assert_eq!(t.highest_seen(), rival);

    // a rival seen while fetching
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    t.handle(grant(0, e, Some(pos(1, 0))), &mut out);
    t.handle(grant(1, e, None), &mut out);
    out.clear();
    t.handle(
        TakeoverInput::FetchFailed {
            slot: SlotId(0),
            epoch: e,
            promised: Some(rival.max(Epoch(e.0 + 1))),
        },
        &mut out,
    );
    assert!(matches!(out[..], [TakeoverCommand::StepBack { .. }]));
}

#[test]
fn a_reconnected_store_that_has_not_answered_is_fenced_again() {
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(0, e, None), &mut out);
    t.handle(TakeoverInput::SlotConnected { slot: SlotId(0) }, &mut out);
    assert!(out.is_empty(), "slot 0 already granted");
    t.handle(TakeoverInput::SlotConnected { slot: SlotId(2) }, &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::SendFence {
            slot: SlotId(2),
            epoch: e
        }]
    );
}

/// DESIGN.md "Failover" end to end on three simulated stores: an event stabilized by the old
/// master on S0+S1 survives, a zombie's divergent entry on S2 is replaced, and the new
/// master's HWM covers the old log once its epoch-start event is on two stores.
#[test]
fn takeover_then_master_recovers_every_stabilized_event() {
    let old = 1 << 16 | 1;
    let zombie_only = 2 << 16 | 3; // an epoch whose master wrote to S2 only
    let mut s = [
        StoreSim::new(ident(0), &[old, old]),
        StoreSim::new(ident(1), &[old, old]),
        StoreSim::new(ident(2), &[old, zombie_only, zombie_only]),
    ];
    // our slave applied offset 0 only
    let local = LocalLog {
        log: Log::from_events(events_from(0, &[old, old])),
        applied: Some(Offset(0)),
    };
    let (mut t, e) = fencing(config(3), local);
    for st in &mut s {
        st.promised = e;
    }
    let mut out = Vec::new();
    // S1 and S0 grant first (F = 2): the adopted log ends at (old, 1), the stabilized event.
    t.handle(grant(1, e, s[1].last()), &mut out);
    t.handle(grant(0, e, s[0].last()), &mut out);
    let [TakeoverCommand::BecomeMaster(adopted)] = &out[..] else {
        panic!("{out:?}")
    };
    let adopted = adopted.clone();
    assert_eq!(
        adopted.log.last(),
        Some(LogPosition {
            epoch: Epoch(old),
            offset: Offset(1)
        })
    );

    let mut mout = Vec::new();
    let cfg = MasterConfig {
        cluster: stores(3),
        limits: ReplicationLimits::default(),
    };
    let mut m = MasterCore::new(cfg, adopted, Bytes::from_static(b"start").into(), &mut mout)
        .expect("valid");
    let mut stabilized = Vec::new();
    for _ in 0..20 {
        let cmds: Vec<MasterCommand> = std::mem::take(&mut mout);
        if cmds.is_empty() {
            break;
        }
        for c in cmds {
            match c {
                MasterCommand::Append(a) => {
                    let a: AppendCommand = a;
                    let log = m.log().clone();
                    let answer = s[a.slot.index()].answer(a.slot, &a, &log);
                    m.handle(answer, &mut mout);
                }
                MasterCommand::Stabilized { events, .. } => {
                    stabilized.extend(events.into_iter().map(|e| e.offset.0))
                }
                MasterCommand::StepDown { .. } => panic!("no rival here"),
                MasterCommand::QuorumLost { .. } => panic!("the check-quorum rule is off here"),
            }
        }
    }
    assert_eq!(
        stabilized,
        vec![1, 2],
        "offset 1 (applied by nobody yet) and the epoch start"
    );
    for st in &s {
        assert_eq!(
            st.log,
            [old, old, e.0].map(Epoch),
            "every store holds the recovered log"
        );
    }
}

#[test]
fn a_grant_whose_log_already_holds_the_takeover_epoch_never_counts() {
    // The local log's epochs count as seen: the takeover's epoch is above them.
    let local = LocalLog {
        log: log_of(&[Epoch::compose(9, BrokerId(1)).0]),
        applied: None,
    };
    let mut out = Vec::new();
    let t = TakeoverCore::start(config(3), 0, Epoch::ZERO, local, &mut out).expect("valid");
    assert_eq!(t.epoch(), Epoch::compose(10, ME));

    let (mut t, e) = fencing(config(3), LocalLog::empty());
    out.clear();
    t.handle(
        grant(
            0,
            e,
            Some(LogPosition {
                epoch: e,
                offset: Offset(4),
            }),
        ),
        &mut out,
    );
    assert_eq!((t.grant_count(), t.stats().grants_inconsistent), (0, 1));
    assert!(out.is_empty());
}

#[test]
fn bootstrap_grants_count_only_after_the_identities_are_known() {
    // A broker that knows no store identity: grants cannot count until the driver binds
    // the identities (after making them durable) and feeds them in.
    let unknown = TakeoverConfig {
        broker: ME,
        cluster: crate::core::ClusterConfig::with_majorities(
            (0..3).map(|_| SlotKind::voter(None)).collect(),
        ),
        fetch_events_max: 64,
    };
    let (mut t, e) = fencing(unknown, LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(0, e, None), &mut out);
    assert_eq!((t.grant_count(), t.stats().grants_not_voting), (0, 1));
    for slot in 0..3u16 {
        t.handle(
            TakeoverInput::StoreIdentityKnown {
                slot: SlotId(slot),
                identity: ident(u64::from(slot)),
            },
            &mut out,
        );
    }
    assert_eq!(
        t.cluster().expected_identity(SlotId(1)),
        Some(ident(1)),
        "learned"
    );
    // A second identity for a slot is never taken.
    t.handle(
        TakeoverInput::StoreIdentityKnown {
            slot: SlotId(1),
            identity: ident(9),
        },
        &mut out,
    );
    assert_eq!(t.cluster().expected_identity(SlotId(1)), Some(ident(1)));
    t.handle(grant(0, e, None), &mut out);
    assert!(out.is_empty());
    t.handle(grant(1, e, None), &mut out);
    let Some(TakeoverCommand::BecomeMaster(adopted)) = out.pop() else {
        panic!("{out:?}")
    };
    assert!(adopted.log.is_empty());
    assert_eq!(adopted.epoch, e);
}

#[test]
fn the_fence_quorum_counts_marked_grants_only_when_every_store_granted() {
    // (unmarked, granted, stores, F) -> reached
    let table = [
        ((0, 0, 3, 2), false),
        ((1, 1, 3, 2), false),
        ((2, 2, 3, 2), true),
        ((1, 2, 3, 2), false), // one grant is marked: F unmarked not reached
        ((2, 3, 3, 2), true),
        ((0, 3, 3, 2), true), // every store granted, all marked (a whole-cluster power loss)
        ((1, 3, 3, 2), true),
        ((0, 2, 3, 2), false),
        ((3, 4, 5, 3), true),
        ((2, 4, 5, 3), false), // 5 stores, one down, two marked: no quorum
        ((2, 5, 5, 3), true),
        ((1, 1, 1, 1), true),
        ((0, 1, 1, 1), true), // a one-store cluster: its grant is every grant
    ];
    for ((unmarked, granted, stores, f), reached) in table {
        assert_eq!(
            fence_quorum_reached(unmarked, granted, stores, f),
            reached,
            "unmarked {unmarked}, granted {granted}, stores {stores}, F {f}"
        );
    }
}

#[test]
fn a_marked_grant_does_not_complete_the_fence_quorum() {
    // quire-sim seed 805 (tail flips): B1 stabilized its epoch-start at offset 0 on S0 and
    // S2; a bit flipped in S2's only record and S2 cut it at restart as a torn tail. S1 and
    // S2 (both empty now) are a fence quorum of two: adopting their empty log would let the
    // new master overwrite the stabilized offset 0. S2 reports its mark, so the takeover
    // waits for S0 and adopts S0's log.
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(1, e, None), &mut out);
    t.handle(marked_grant(2, e, None), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!((t.grant_count(), t.unmarked_grant_count()), (2, 1));
    t.handle(grant(0, e, Some(pos(0x1_0001, 0))), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(0),
            through: Offset(0)
        }]
    );
    assert_eq!(t.stats().grants_tail_cut, 1);
    assert_eq!(t.stats().grants_counted, 3);
}

#[test]
fn every_store_granting_completes_the_quorum_even_when_all_are_marked() {
    // A whole-cluster power loss: every store may have cut a torn tail at start. With every
    // store's grant in, a stabilized event survives unless all its Qa ackers lost it, and the
    // most up-to-date log among them all is adopted.
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(marked_grant(0, e, Some(pos(1, 4))), &mut out);
    t.handle(marked_grant(1, e, Some(pos(1, 6))), &mut out);
    assert!(out.is_empty(), "{out:?}");
    t.handle(marked_grant(2, e, Some(pos(1, 5))), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(1),
            epoch: e,
            from: Offset(0),
            through: Offset(6)
        }]
    );
}

#[test]
fn the_adopted_log_may_come_from_a_marked_grant() {
    // F unmarked grants complete the quorum; the log is the most up-to-date among every
    // grant counted, a marked one too (a cut log is a prefix some master wrote).
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(marked_grant(0, e, Some(pos(3, 2))), &mut out);
    t.handle(grant(1, e, Some(pos(2, 7))), &mut out);
    assert!(out.is_empty(), "{out:?}");
    t.handle(grant(2, e, None), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(0),
            through: Offset(2)
        }]
    );
}

#[test]
fn a_repeated_marked_grant_is_a_duplicate_and_changes_nothing() {
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(marked_grant(0, e, None), &mut out);
    t.handle(marked_grant(0, e, None), &mut out);
    t.handle(grant(1, e, None), &mut out);
    assert!(out.is_empty(), "{out:?}");
    assert_eq!(t.stats().grants_duplicate, 1);
    assert_eq!((t.grant_count(), t.unmarked_grant_count()), (2, 1));
}

/// A takeover of an empty broker whose adopted store (slot 0, last entry (2, 7)) answered
/// its fetch from 0 "trimmed, the log starts at 4"; returns the core, its epoch and the
/// commands of that answer.
fn rebasing() -> (TakeoverCore, Epoch, Vec<TakeoverCommand>) {
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(0, e, Some(pos(2, 7))), &mut out);
    t.handle(grant(1, e, Some(pos(2, 7))), &mut out);
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(0),
            through: Offset(7),
        }]
    );
    out.clear();
    t.handle(
        TakeoverInput::FetchTrimmed {
            slot: SlotId(0),
            epoch: e,
            first_offset: Offset(4),
        },
        &mut out,
    );
    (t, e, out)
}

/// Fetched events at offsets 4..=7 of the given epochs, the one at 5 a Trim event.
fn fetched_with_trim_at_5(e: Epoch, epochs: &[u64]) -> TakeoverInput {
    let mut events = events_from(4, epochs);
    events[1].kind = EventKind::Trim;
    TakeoverInput::Fetched {
        slot: SlotId(0),
        epoch: e,
        events,
    }
}

/// Retention: an empty broker adopts a log whose store deleted everything below offset 4.
/// The fetch from 0 is answered "trimmed"; the takeover fetches from 4 and restarts its
/// log after the first checkpoint (the Trim event at 5): entries up to 4 count as
/// stabilized and applied, the log holds 5 on.
#[test]
fn a_trimmed_fetch_restarts_the_log_at_the_first_checkpoint() {
    let (mut t, e, out) = rebasing();
    assert_eq!(
        out,
        vec![TakeoverCommand::Fetch {
            slot: SlotId(0),
            epoch: e,
            from: Offset(4),
            through: Offset(7),
        }]
    );
    let mut out = Vec::new();
    t.handle(fetched_with_trim_at_5(e, &[2, 2, 2, 2]), &mut out);
    let [TakeoverCommand::BecomeMaster(adopted)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(adopted.applied, Some(Offset(4)));
    assert_eq!(adopted.log.end(), Offset(8));
    assert_eq!(adopted.log.mem_start(), Offset(5));
    assert_eq!(adopted.log.position(Offset(4)), Some(pos(2, 4)));
    assert_eq!(t.stats().fetches_rebased, 1);
}

/// The first Trim event after the store's first offset is a later part of a checkpoint
/// written in parts (its first part was deleted): the log restarts at the next checkpoint's
/// first part instead (the Trim event at 6), where the state can be rebuilt.
#[test]
fn a_trimmed_fetch_skips_a_later_checkpoint_part() {
    let (mut t, e, _) = rebasing();
    let part = |index: u32| {
        quire_proto::EventBody::Trim(quire_proto::TrimEvent {
            before: Offset(2),
            checkpoint: None,
            part: Some(quire_proto::CheckpointPart {
                index,
                count: 3,
                snapshot_bytes: 3,
                bytes: bytes::Bytes::from_static(b"x"),
            }),
        })
        .to_payload()
        .expect("encodes")
    };
    let mut events = events_from(4, &[2, 2, 2, 2]);
    events[1].kind = EventKind::Trim;
    events[1].payload = part(2);
    events[2].kind = EventKind::Trim;
    events[2].payload = part(0);
    let mut out = Vec::new();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events,
        },
        &mut out,
    );
    let [TakeoverCommand::BecomeMaster(adopted)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(adopted.applied, Some(Offset(5)));
    assert_eq!(adopted.log.mem_start(), Offset(6));
    assert_eq!(adopted.log.end(), Offset(8));
}

/// A log with no checkpoint from the store's first offset through the granted end cannot
/// be restarted: the attempt is given up.
#[test]
fn a_trimmed_fetch_without_a_checkpoint_aborts() {
    let (mut t, e, _) = rebasing();
    let mut out = Vec::new();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: events_from(4, &[2, 2, 2, 2]),
        },
        &mut out,
    );
    assert_eq!(
        out,
        vec![TakeoverCommand::Aborted {
            epoch: e,
            reason: AbortReason::NoCheckpoint {
                first_offset: Offset(4)
            }
        }]
    );
}

/// A checkpoint whose fetched predecessor is of another epoch is not one a serving master
/// proposed: the attempt is given up.
#[test]
fn a_checkpoint_after_an_entry_of_another_epoch_is_not_restarted_from() {
    let (mut t, e, _) = rebasing();
    let mut out = Vec::new();
    t.handle(fetched_with_trim_at_5(e, &[1, 2, 2, 2]), &mut out);
    assert!(
        matches!(
            out[..],
            [TakeoverCommand::Aborted {
                reason: AbortReason::FetchedTailMismatch { .. },
                ..
            }]
        ),
        "{out:?}"
    );
}

fn config_event(epoch: u64, offset: u64, slots: &[u16]) -> Event {
    let voters = slots
        .iter()
        .map(|&i| quire_proto::Voter {
            store_index: i,
            store_id: ident(u64::from(i)).store_id,
            incarnation: ident(u64::from(i)).incarnation,
        })
        .collect();
    Event {
        epoch: Epoch(epoch),
        offset: Offset(offset),
        kind: EventKind::Config,
        payload: EventBody::Config(quire_proto::ConfigEvent { voters })
            .to_payload()
            .expect("encodes"),
    }
}

/// DESIGN.md "Membership changes", rule 3: a log naming a larger voter set is adopted only
/// once the grants hold a majority of that set too.
#[test]
fn an_adopted_log_naming_a_new_voter_set_needs_a_majority_of_it() {
    let mut cluster = stores(4);
    let three: Vec<_> = cluster.voters()[..3].to_vec();
    cluster.set_voters(&three).expect("valid");
    let cfg = TakeoverConfig {
        broker: ME,
        cluster,
        fetch_events_max: 64,
    };
    let (mut t, e) = fencing(cfg, LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(1, e, None), &mut out);
    t.handle(grant(0, e, Some(pos(1, 1))), &mut out);
    assert!(
        matches!(
            out[..],
            [TakeoverCommand::Fetch {
                slot: SlotId(0),
                ..
            }]
        ),
        "2 of the 3 voters fenced with: adopt slot 0's log, {out:?}"
    );
    out.clear();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: vec![event(1, 0, 3), config_event(1, 1, &[0, 1, 2, 3])],
        },
        &mut out,
    );
    assert!(
        out.is_empty(),
        "2 of the 4 voters it names is no majority: {out:?}"
    );
    assert_eq!(t.stats().adoptions_deferred, 1);
    // The store the new set added grants: 3 of 4.
    t.handle(grant(3, e, None), &mut out);
    let [TakeoverCommand::BecomeMaster(adopted)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(adopted.log.last(), Some(pos(1, 1)));
    assert_eq!(adopted.voters.as_ref().map(Vec::len), Some(4));
}

/// Rule 3 with a smaller set: a log that removed a store is adopted with a majority of
/// both the set fenced with and the set it names.
#[test]
fn an_adopted_log_naming_a_smaller_set_is_counted_in_both() {
    let (mut t, e) = fencing(config(3), LocalLog::empty());
    let mut out = Vec::new();
    t.handle(grant(2, e, None), &mut out);
    t.handle(grant(0, e, Some(pos(1, 1))), &mut out);
    out.clear();
    t.handle(
        TakeoverInput::Fetched {
            slot: SlotId(0),
            epoch: e,
            events: vec![event(1, 0, 3), config_event(1, 1, &[0, 1])],
        },
        &mut out,
    );
    assert!(out.is_empty(), "slot 2 is not in {{0, 1}}: 1 of 2: {out:?}");
    t.handle(grant(1, e, Some(pos(1, 0))), &mut out);
    let [TakeoverCommand::BecomeMaster(adopted)] = &out[..] else {
        panic!("{out:?}")
    };
    assert_eq!(adopted.voters.as_ref().map(Vec::len), Some(2));
}
