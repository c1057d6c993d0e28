//! Unit tests of the master core's rules, one rule per test.

use bytes::Bytes;
use quire_proto::{BrokerId, Epoch, Incarnation, LogPosition, Offset};

use super::*;
use crate::core::log::tests::log_of;
use crate::core::testkit::{ident, stores, StoreSim};
use crate::core::{AppendId, RejectReason, SlotId, SlotKind, StoreIdentity};

const E: Epoch = Epoch(100);

fn pos(e: u64, o: u64) -> LogPosition {
    LogPosition {
        epoch: Epoch(e),
        offset: Offset(o),
    }
}

/// A master core plus the commands it emitted and not yet looked at.
struct H {
    m: MasterCore,
    out: Vec<MasterCommand>,
}

impl H {
    fn with(
        cluster: ClusterConfig,
        limits: ReplicationLimits,
        log: Log,
        applied: Option<Offset>,
    ) -> H {
        let mut out = Vec::new();
        let adopted = AdoptedLog {
            epoch: E,
            log,
            applied,
            voters: None,
        };
        let m = MasterCore::new(
            MasterConfig { cluster, limits },
            adopted,
            Bytes::new().into(),
            &mut out,
        )
        .expect("valid configuration");
        H { m, out }
    }

    fn new(n: u64) -> H {
        H::with(stores(n), ReplicationLimits::default(), Log::new(), None)
    }

    /// Drains and returns the appends emitted since the last call (other commands stay).
    fn appends(&mut self) -> Vec<AppendCommand> {
        let mut rest = Vec::new();
        let mut appends = Vec::new();
        for c in self.out.drain(..) {
            match c {
                MasterCommand::Append(a) => appends.push(a),
                other => rest.push(other),
            }
        }
        self.out = rest;
        appends
    }

    /// Drains and returns the `through` of every `Stabilized` emitted since the last call,
    /// checking each one's events are exactly the newly stabilized offsets.
    fn stabilized(&mut self) -> Vec<Offset> {
        let mut rest = Vec::new();
        let mut got = Vec::new();
        for c in self.out.drain(..) {
            match c {
                MasterCommand::Stabilized { through, events } => {
                    assert_eq!(events.last().map(|e| e.offset), Some(through));
                    for w in events.windows(2) {
                        assert_eq!(w[0].offset.next(), w[1].offset);
                    }
                    got.push(through);
                }
                other => rest.push(other),
            }
        }
        self.out = rest;
        got
    }

    fn handle(&mut self, input: MasterInput) {
        self.m.handle(input, &mut self.out);
    }

    /// A voter ack from the store at `slot` with its expected identity.
    fn ack(&mut self, slot: u16, append: AppendId, through: u64) {
        self.handle(MasterInput::Persisted {
            slot: SlotId(slot),
            append,
            epoch: E,
            through: Some(Offset(through)),
            identity: ident(u64::from(slot)),
            voter: true,
        });
    }

    /// Acks `a` as the store at its slot would (voter, expected identity).
    fn ack_append(&mut self, a: &AppendCommand) {
        self.handle(MasterInput::Persisted {
            slot: a.slot,
            append: a.append,
            epoch: a.epoch,
            through: a.through(),
            identity: ident(u64::from(a.slot.0)),
            voter: true,
        });
    }

    fn propose(&mut self) -> Offset {
        self.m
            .propose(
                EventKind::Message,
                Bytes::from_static(b"m").into(),
                &mut self.out,
            )
            .expect("accepted")
    }
}

fn for_slot(appends: &[AppendCommand], slot: u16) -> Vec<AppendCommand> {
    appends
        .iter()
        .filter(|a| a.slot == SlotId(slot))
        .cloned()
        .collect()
}

#[test]
fn new_master_probes_every_slot_with_its_epoch_start_event() {
    let mut h = H::with(
        stores(3),
        ReplicationLimits::default(),
        log_of(&[1, 1, 2]),
        Some(Offset(1)),
    );
    assert_eq!(h.m.epoch_start(), Offset(3));
    assert_eq!(
        h.m.hwm(),
        Some(Offset(1)),
        "HWM starts at what the broker applied"
    );
    let appends = h.appends();
    assert_eq!(appends.len(), 3);
    for (i, a) in appends.iter().enumerate() {
        assert_eq!(a.slot, SlotId(i as u16));
        assert_eq!(a.prev, Some(pos(2, 2)));
        assert_eq!((a.first, a.count), (Offset(3), 1));
        let AppendEvents::InMemory(evs) = &a.events else {
            panic!("in memory")
        };
        assert_eq!(evs[0].kind, quire_proto::EventKind::EpochStart);
        assert_eq!(evs[0].epoch, E);
        assert_eq!(a.hwm, Some(Offset(1)));
    }
}

#[test]
fn hwm_needs_two_of_three_stores() {
    let mut h = H::new(3);
    let probes = h.appends();
    h.ack_append(&probes[0]);
    assert_eq!(h.m.hwm(), None, "one store of three is not a quorum");
    h.ack_append(&probes[1]);
    assert_eq!(h.stabilized(), vec![Offset(0)]);

    for _ in 0..3 {
        h.propose();
    }
    let appends = h.appends();
    let to2 = for_slot(&appends, 2);
    // slot 2 never answered its probe: it is still probing, nothing more goes to it
    assert!(to2.is_empty());
    let last0 = for_slot(&appends, 0).pop().expect("pipelined to slot 0");
    assert_eq!(last0.through(), Some(Offset(3)));
    h.ack_append(&last0);
    assert!(h.stabilized().is_empty(), "slot 0 alone holds 1..=3");
    let last1 = for_slot(&appends, 1).pop().expect("pipelined to slot 1");
    h.ack_append(&last1);
    assert_eq!(h.stabilized(), vec![Offset(3)]);
    assert_eq!(h.m.hwm(), Some(Offset(3)));
}

#[test]
fn hwm_needs_three_of_five_stores_and_is_the_third_largest() {
    let mut h = H::new(5);
    let probes = h.appends();
    for p in &probes {
        h.ack_append(p);
    }
    assert_eq!(h.stabilized(), vec![Offset(0)]);
    for _ in 0..4 {
        h.propose();
    }
    let appends = h.appends();
    // stores acknowledge different prefixes: 4, 4, 2, 1, nothing
    let through = |slot: u16, t: u64| {
        for_slot(&appends, slot)
            .into_iter()
            .find(|a| a.through() == Some(Offset(t)))
            .expect("sent")
    };
    let a = [through(0, 4), through(1, 4), through(2, 2), through(3, 1)];
    h.ack_append(&a[0]);
    h.ack_append(&a[1]);
    assert!(h.stabilized().is_empty(), "two of five hold 4");
    h.ack_append(&a[3]);
    assert_eq!(
        h.stabilized(),
        vec![Offset(1)],
        "third largest of {{4, 4, 1}}"
    );
    h.ack_append(&a[2]);
    assert_eq!(
        h.stabilized(),
        vec![Offset(2)],
        "third largest of {{4, 4, 2, 1}}"
    );
}

#[test]
fn duplicate_acks_count_once() {
    let mut h = H::new(3);
    let probes = h.appends();
    for _ in 0..5 {
        h.ack_append(&probes[0]);
    }
    assert_eq!(h.m.hwm(), None);
    assert_eq!(
        h.m.slot_status(SlotId(0)).map(|s| s.voted_through),
        Some(Some(Offset(0)))
    );
}

#[test]
fn acks_from_another_epoch_never_count() {
    let mut h = H::new(3);
    let probes = h.appends();
    for p in &probes {
        for epoch in [Epoch(99), Epoch(101)] {
            h.handle(MasterInput::Persisted {
                slot: p.slot,
                append: p.append,
                epoch,
                through: p.through(),
                identity: ident(u64::from(p.slot.0)),
                voter: true,
            });
        }
    }
    assert_eq!(h.m.hwm(), None);
    assert_eq!(h.m.stats().acks_other_epoch, 6);
}

#[test]
fn acks_from_non_voters_move_progress_but_never_the_hwm() {
    let mut h = H::new(3);
    let probes = h.appends();
    h.ack_append(&probes[0]);
    // slot 1 says it is not a voter (a wiped store rejoining as a learner)
    h.handle(MasterInput::Persisted {
        slot: SlotId(1),
        append: probes[1].append,
        epoch: E,
        through: Some(Offset(0)),
        identity: ident(1),
        voter: false,
    });
    // slot 2 answers as a voter but with a new incarnation: not the store that promised
    let reborn = StoreIdentity {
        incarnation: Incarnation(2),
        ..ident(2)
    };
    h.handle(MasterInput::Persisted {
        slot: SlotId(2),
        append: probes[2].append,
        epoch: E,
        through: Some(Offset(0)),
        identity: reborn,
        voter: true,
    });
    assert_eq!(h.m.hwm(), None);
    assert_eq!(h.m.stats().acks_not_voting, 2);
    let s1 = h.m.slot_status(SlotId(1)).expect("slot");
    assert_eq!(
        (s1.matched, s1.voted_through, s1.probing),
        (Some(Offset(0)), None, false)
    );
}

#[test]
fn a_store_of_unknown_identity_does_not_vote_until_the_configuration_names_it() {
    let mut cluster = stores(3);
    cluster.slots[1] = SlotKind::voter(None);
    let mut h = H::with(cluster, ReplicationLimits::default(), Log::new(), None);
    let probes = h.appends();
    h.ack_append(&probes[0]);
    h.ack_append(&probes[1]);
    assert_eq!(h.m.hwm(), None, "slot 1's identity is unknown");
    h.handle(MasterInput::StoreIdentityKnown {
        slot: SlotId(1),
        identity: ident(1),
    });
    h.handle(MasterInput::HeartbeatTick);
    let hb = for_slot(&h.appends(), 1);
    assert_eq!(hb.len(), 1);
    h.ack_append(&hb[0]);
    assert_eq!(h.stabilized(), vec![Offset(0)]);
}

#[test]
fn acks_from_unknown_slots_and_slaves_never_count() {
    let mut cluster = stores(3);
    cluster.slots.push(SlotKind::Slave {
        broker: BrokerId(2),
    });
    let mut h = H::with(cluster, ReplicationLimits::default(), Log::new(), None);
    let probes = h.appends();
    assert_eq!(probes.len(), 4, "the slave gets the stream too");
    h.ack_append(&probes[0]);
    h.ack(9, AppendId(0), 0);
    h.handle(MasterInput::SlaveHas {
        slot: SlotId(3),
        append: probes[3].append,
        epoch: E,
        through: Some(Offset(0)),
    });
    // a store-style ack from the slave's slot is not a store's vote either
    h.ack(3, probes[3].append, 0);
    assert_eq!(h.m.hwm(), None);
    assert_eq!(h.m.stats().acks_unknown_slot, 2);
    assert_eq!(
        h.m.slot_status(SlotId(3)).map(|s| s.matched),
        Some(Some(Offset(0)))
    );
}

#[test]
fn acks_beyond_what_was_sent_are_ignored() {
    let mut h = H::new(3);
    let probes = h.appends();
    h.propose();
    h.propose();
    // both stores claim offset 2 while they were only sent the probe (through 0)
    h.ack(0, probes[0].append, 2);
    h.ack(1, probes[1].append, 2);
    assert_eq!(h.m.hwm(), None);
    assert_eq!(h.m.stats().acks_beyond_sent, 2);
}

/// A master of an adopted log whose offsets 0..=2 were written by epoch 5 and never known
/// stabilized (one event per append; `mutant`: the planted HWM-before-epoch-start switch).
/// Stores 0 and 1 hold only 0..=1: they refuse the probes' prev (5, 2) and the master
/// backs up.
fn backed_up_over_old_entries(mutant: bool) -> H {
    let limits = ReplicationLimits {
        append_events_max: 1,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(3), limits, log_of(&[5, 5, 5]), None);
    if mutant {
        h.m.set_hwm_before_epoch_start();
    }
    let probes = h.appends();
    for slot in [0u16, 1] {
        h.handle(MasterInput::Rejected {
            slot: SlotId(slot),
            append: probes[slot as usize].append,
            promised: Epoch(5),
            last: Some(pos(5, 1)),
            reason: RejectReason::LogMismatch,
        });
    }
    h
}

#[test]
fn hwm_waits_for_the_epoch_start_event() {
    let mut h = backed_up_over_old_entries(false);
    assert_eq!(h.m.epoch_start(), Offset(3));
    let resent = h.appends();
    assert_eq!(resent.len(), 2);
    for a in &resent {
        assert_eq!((a.prev, a.first, a.count), (Some(pos(5, 1)), Offset(2), 1));
        h.ack_append(a); // through 2: old-epoch entries, acked in our epoch
    }
    assert_eq!(
        h.m.hwm(),
        None,
        "Raft §5.4.2: never stabilize by counting below the epoch start"
    );
    let next = h.appends();
    assert_eq!(next.len(), 2);
    for a in &next {
        assert_eq!((a.first, a.through()), (Offset(3), Some(Offset(3))));
        h.ack_append(a);
    }
    // Once the epoch-start event is stabilized, everything before it is too.
    let mut all = Vec::new();
    for c in h.out.drain(..) {
        if let MasterCommand::Stabilized { through, events } = c {
            assert_eq!(through, Offset(3));
            all = events;
        }
    }
    assert_eq!(
        all.iter().map(|e| e.offset.0).collect::<Vec<_>>(),
        vec![0, 1, 2, 3]
    );
}

/// The planted `hwm_before_epoch_start` switch (test-only): the same acks through the
/// adopted log's old-epoch entries stabilize them before the epoch-start event is on a
/// quorum (Raft §5.4.2's Figure 8: a later master may still hold a rival entry there).
#[test]
fn the_hwm_before_epoch_start_mutation_stabilizes_old_entries_early() {
    let mut h = backed_up_over_old_entries(true);
    for a in &h.appends() {
        h.ack_append(a);
    }
    assert_eq!(
        h.m.hwm(),
        Some(Offset(2)),
        "the mutant counts below the epoch start"
    );
}

#[test]
fn rejection_backs_up_to_the_match_point_and_resends() {
    // Ours: [1,1,2,2] + epoch start (E) at 4. Store 0 diverged: [1,1,3] (a zombie's epoch 3).
    let mut h = H::with(
        stores(3),
        ReplicationLimits::default(),
        log_of(&[1, 1, 2, 2]),
        None,
    );
    let log = h.m.log().clone();
    let mut s0 = StoreSim::new(ident(0), &[1, 1, 3]);
    let mut probe = for_slot(&h.appends(), 0).remove(0);
    let mut prevs = vec![probe.prev];
    for _ in 0..5 {
        match s0.answer(SlotId(0), &probe, &log) {
            ack @ MasterInput::Persisted { .. } => {
                h.handle(ack);
                break;
            }
            rej => h.handle(rej),
        }
        probe = for_slot(&h.appends(), 0).remove(0);
        prevs.push(probe.prev);
    }
    // (2,3) refused: last (3,2) -> our entries of epoch <= 3 end at 3, below prev: try (2,2)
    // (2,2) refused again (the store has epoch 3 there) -> (1,1) matches.
    assert_eq!(
        prevs,
        vec![Some(pos(2, 3)), Some(pos(2, 2)), Some(pos(1, 1))]
    );
    assert_eq!(
        s0.log,
        [1, 1, 2, 2, 100].map(Epoch),
        "divergent suffix replaced"
    );
    assert_eq!(h.m.stats().backups, 2);
    let st = h.m.slot_status(SlotId(0)).expect("slot");
    assert_eq!((st.matched, st.probing), (Some(Offset(4)), false));
}

#[test]
fn a_shorter_store_is_matched_in_one_step() {
    let mut h = H::with(
        stores(3),
        ReplicationLimits::default(),
        log_of(&[1, 1, 2, 2]),
        None,
    );
    let probe = for_slot(&h.appends(), 1).remove(0);
    h.handle(MasterInput::Rejected {
        slot: SlotId(1),
        append: probe.append,
        promised: Epoch(2),
        last: Some(pos(1, 1)),
        reason: RejectReason::LogMismatch,
    });
    let resent = for_slot(&h.appends(), 1);
    assert_eq!(resent.len(), 1);
    assert_eq!(
        (resent[0].prev, resent[0].first, resent[0].count),
        (Some(pos(1, 1)), Offset(2), 3)
    );
    // A duplicate of the same rejection is stale: no second backup.
    h.handle(MasterInput::Rejected {
        slot: SlotId(1),
        append: probe.append,
        promised: Epoch(2),
        last: Some(pos(1, 1)),
        reason: RejectReason::LogMismatch,
    });
    assert!(h.appends().is_empty());
    assert_eq!(h.m.stats().rejections_stale, 1);
}

#[test]
fn an_empty_store_gets_the_log_from_offset_zero() {
    let mut h = H::with(
        stores(3),
        ReplicationLimits::default(),
        log_of(&[1, 2]),
        None,
    );
    let probe = for_slot(&h.appends(), 2).remove(0);
    h.handle(MasterInput::Rejected {
        slot: SlotId(2),
        append: probe.append,
        promised: Epoch::ZERO,
        last: None,
        reason: RejectReason::LogMismatch,
    });
    let resent = for_slot(&h.appends(), 2).remove(0);
    assert_eq!(
        (resent.prev, resent.first, resent.count),
        (None, Offset(0), 3)
    );
}

#[test]
fn a_fenced_master_steps_down_and_stops_advancing() {
    let mut h = H::new(3);
    let probes = h.appends();
    h.ack_append(&probes[0]);
    h.handle(MasterInput::Rejected {
        slot: SlotId(1),
        append: probes[1].append,
        promised: Epoch(200),
        last: None,
        reason: RejectReason::StaleEpoch,
    });
    assert_eq!(
        h.out,
        vec![MasterCommand::StepDown {
            promised: Epoch(200)
        }]
    );
    h.out.clear();
    // A late ack that would have made a quorum changes nothing any more.
    h.ack_append(&probes[2]);
    assert_eq!(h.m.hwm(), None);
    assert!(h.out.is_empty());
    assert_eq!(
        h.m.propose(EventKind::Message, Bytes::new().into(), &mut h.out),
        Err(ProposeError::Fenced {
            promised: Epoch(200)
        })
    );
    h.handle(MasterInput::HeartbeatTick);
    assert!(h.out.is_empty(), "a fenced master sends nothing");
}

#[test]
fn a_rival_epoch_seen_anywhere_steps_the_master_down_once() {
    let mut h = H::new(3);
    h.appends();
    h.handle(MasterInput::RivalSeen { epoch: Epoch(50) });
    assert!(h.out.is_empty(), "a lower epoch is no rival");
    h.handle(MasterInput::RivalSeen { epoch: Epoch(300) });
    h.handle(MasterInput::RivalSeen { epoch: Epoch(400) });
    assert_eq!(
        h.out,
        vec![MasterCommand::StepDown {
            promised: Epoch(300)
        }]
    );
}

#[test]
fn backpressure_refuses_proposals_until_bytes_are_stabilized() {
    let per = crate::core::event::EVENT_OVERHEAD_BYTES + 1;
    let limits = ReplicationLimits {
        inflight_bytes_max: 4 * per,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(3), limits, Log::new(), None);
    // the epoch-start event (empty payload) uses EVENT_OVERHEAD_BYTES of the budget
    let probes = h.appends();
    h.ack_append(&probes[0]);
    h.ack_append(&probes[1]);
    assert_eq!(h.m.unstable_bytes(), 0);
    for _ in 0..4 {
        h.propose();
    }
    let refused = h.m.propose(
        EventKind::Message,
        Bytes::from_static(b"x").into(),
        &mut h.out,
    );
    assert_eq!(
        refused,
        Err(ProposeError::Backpressure {
            unstable_bytes: 4 * per,
            event_bytes: per,
            inflight_bytes_max: 4 * per
        })
    );
    assert_eq!(
        h.m.next_offset(),
        Offset(5),
        "a refused event takes no offset"
    );
    let too_large = h.m.propose(
        EventKind::Message,
        Bytes::from(vec![0u8; 4 * per as usize]).into(),
        &mut h.out,
    );
    assert!(matches!(too_large, Err(ProposeError::TooLarge { .. })));
    for a in h.appends() {
        if a.slot.0 < 2 {
            h.ack_append(&a);
        }
    }
    assert_eq!(h.m.hwm(), Some(Offset(4)));
    assert_eq!(h.m.unstable_bytes(), 0);
    assert_eq!(h.propose(), Offset(5));
}

#[test]
fn pipeline_is_bounded_and_probing_sends_one_append() {
    let limits = ReplicationLimits {
        append_events_max: 1,
        appends_inflight_max: 3,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(3), limits, Log::new(), None);
    let probes = h.appends();
    for _ in 0..10 {
        h.propose();
    }
    assert!(
        h.appends().is_empty(),
        "probing: one append in flight, the probe"
    );
    h.ack_append(&probes[0]);
    let a = h.appends();
    assert_eq!(a.len(), 3, "pipelined: appends_inflight_max appends");
    assert!(a.iter().all(|x| x.slot == SlotId(0) && x.count == 1));
    assert_eq!(
        a.iter().map(|x| x.first.0).collect::<Vec<_>>(),
        vec![1, 2, 3]
    );
    h.ack_append(&a[0]);
    let b = h.appends();
    assert_eq!(b.iter().map(|x| x.first.0).collect::<Vec<_>>(), vec![4]);
    // an ack for a later append answers the earlier ones too: the window refills
    h.ack_append(&b[0]);
    assert_eq!(
        h.appends().iter().map(|x| x.first.0).collect::<Vec<_>>(),
        vec![5, 6, 7]
    );
}

#[test]
fn batches_respect_event_and_byte_bounds() {
    let per = crate::core::event::EVENT_OVERHEAD_BYTES + 1;
    let limits = ReplicationLimits {
        append_events_max: 4,
        append_bytes_max: 2 * per,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(1), limits, Log::new(), None);
    let probe = h.appends().remove(0);
    for _ in 0..5 {
        h.propose();
    }
    h.ack_append(&probe);
    let counts: Vec<u64> = h.appends().iter().map(|a| a.count).collect();
    assert_eq!(counts, vec![2, 2, 1]);
}

/// An append stops at the end of a marked batch, not inside it, unless the batch alone
/// is larger than an append may be (then it is cut at the bound, as before).
#[test]
fn appends_keep_marked_batches_whole() {
    let limits = ReplicationLimits {
        append_events_max: 4,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(1), limits, Log::new(), None);
    let probe = h.appends().remove(0);
    for batch in [3, 3, 5] {
        for _ in 0..batch {
            h.propose();
        }
        h.m.end_batch();
    }
    h.ack_append(&probe);
    let counts: Vec<u64> = h.appends().iter().map(|a| a.count).collect();
    assert_eq!(counts, vec![3, 3, 4, 1]);
}

#[test]
fn heartbeats_carry_the_hwm_and_lost_appends_are_resent() {
    let limits = ReplicationLimits {
        append_timeout_ticks: 3,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(3), limits, Log::new(), None);
    let probes = h.appends();
    h.ack_append(&probes[0]);
    h.ack_append(&probes[1]);
    assert_eq!(h.m.hwm(), Some(Offset(0)));
    h.handle(MasterInput::HeartbeatTick);
    let hb = h.appends();
    // slots 0 and 1 are idle: an empty append with prev = their last entry and the HWM.
    // slot 2's probe is still in flight: nothing yet.
    assert_eq!(hb.len(), 2);
    for a in &hb {
        assert_eq!(
            (a.prev, a.count, a.hwm, a.through()),
            (Some(pos(100, 0)), 0, Some(Offset(0)), Some(Offset(0)))
        );
    }
    h.handle(MasterInput::HeartbeatTick);
    h.handle(MasterInput::HeartbeatTick);
    let resend = for_slot(&h.appends(), 2);
    assert_eq!(resend.len(), 1, "slot 2's probe timed out and went again");
    assert_eq!(
        (resend[0].prev, resend[0].first, resend[0].count),
        (None, Offset(0), 1)
    );
    assert!(resend[0].append > probes[2].append);
    assert_eq!(h.m.stats().append_timeouts, 1);
}

#[test]
fn a_disconnected_slot_gets_nothing_and_is_probed_on_reconnect() {
    let mut h = H::new(3);
    let probes = h.appends();
    h.ack_append(&probes[0]);
    h.ack_append(&probes[1]);
    h.handle(MasterInput::SlotDisconnected { slot: SlotId(2) });
    h.propose();
    h.handle(MasterInput::HeartbeatTick);
    assert!(for_slot(&h.appends(), 2).is_empty());
    // its late answer is still a fact about what it holds
    h.ack_append(&probes[2]);
    assert_eq!(
        h.m.slot_status(SlotId(2)).map(|s| s.matched),
        Some(Some(Offset(0)))
    );
    h.handle(MasterInput::SlotConnected { slot: SlotId(2) });
    let a = for_slot(&h.appends(), 2);
    assert_eq!(a.len(), 1);
    assert_eq!(
        (a[0].prev, a[0].first, a[0].count),
        (Some(pos(100, 0)), Offset(1), 1),
        "resent past what it holds"
    );
}

#[test]
fn a_failed_store_is_left_alone_until_it_reconnects() {
    let mut h = H::new(3);
    let probes = h.appends();
    h.handle(MasterInput::Rejected {
        slot: SlotId(2),
        append: probes[2].append,
        promised: E,
        last: None,
        reason: RejectReason::LogFailed,
    });
    h.propose();
    h.handle(MasterInput::HeartbeatTick);
    assert!(for_slot(&h.appends(), 2).is_empty());
    assert_eq!(
        h.m.slot_status(SlotId(2)).map(|s| s.link),
        Some(SlotLink::Failed)
    );
    h.handle(MasterInput::SlotConnected { slot: SlotId(2) });
    assert_eq!(for_slot(&h.appends(), 2).len(), 1);
}

/// Bytes one one-byte event is accounted in memory.
const ONE_BYTE_EVENT: u64 = crate::core::event::EVENT_OVERHEAD_BYTES + 1;

/// Three stores, two events per append, memory for two one-byte events; slot 2 is down
/// while eight events are proposed and stabilized by slots 0 and 1 (offsets 0..=8 with the
/// epoch start), so memory has dropped what slot 2 will lack.
fn lagging_slot_behind_memory() -> H {
    let limits = ReplicationLimits {
        append_events_max: 2,
        retained_bytes_max: 2 * ONE_BYTE_EVENT,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(3), limits, Log::new(), None);
    let probes = h.appends();
    h.handle(MasterInput::SlotDisconnected { slot: SlotId(2) });
    h.ack_append(&probes[0]);
    h.ack_append(&probes[1]);
    for _ in 0..8 {
        h.propose();
        for a in h.appends() {
            h.ack_append(&a);
        }
    }
    h
}

#[test]
fn memory_is_trimmed_and_a_lagging_slot_is_served_from_a_store() {
    let per = ONE_BYTE_EVENT;
    let mut h = lagging_slot_behind_memory();
    assert_eq!(h.m.hwm(), Some(Offset(8)));
    // slot 2 holds nothing: only the retention bound limits memory.
    assert!(
        h.m.log().mem_bytes() <= 2 * per,
        "stabilized bytes kept: {}",
        h.m.log().mem_bytes()
    );
    let mem_start = h.m.log().mem_start();
    assert!(mem_start > Offset(0));
    h.handle(MasterInput::SlotConnected { slot: SlotId(2) });
    let a = for_slot(&h.appends(), 2).remove(0);
    assert_eq!((a.prev, a.first, a.count), (None, Offset(0), 2));
    assert_eq!(a.events, AppendEvents::FromStore { source: SlotId(0) });
    // once every slot holds everything, nothing stabilized stays in memory
    let log = h.m.log().clone();
    let mut s2 = StoreSim::new(ident(2), &[]);
    let mut queue = std::collections::VecDeque::from([a]);
    while let Some(a) = queue.pop_front() {
        let answer = s2.answer(SlotId(2), &a, &log);
        h.handle(answer);
        queue.extend(for_slot(&h.appends(), 2));
    }
    assert_eq!(s2.log.len(), 9);
    assert_eq!(h.m.log().mem_len(), 0);
}

/// A store that answered `Corrupt` for a record is no catch-up source for a range holding
/// it: another store that holds the range is read instead; with none left the send waits
/// (counted), and a store's damaged records are forgotten when its connection drops.
#[test]
fn a_store_with_a_damaged_record_is_no_read_source_for_its_range() {
    let mut h = lagging_slot_behind_memory();
    assert!(h.m.log().mem_start() > Offset(1));
    // Slot 0 is damaged past the first read's range: still the source.
    h.handle(MasterInput::ReadCorrupt {
        slot: SlotId(0),
        offset: Offset(5),
    });
    assert!(!h.m.slot_corrupt_in(SlotId(0), Offset(0), Offset(1)));
    assert!(h.m.slot_corrupt_in(SlotId(0), Offset(4), Offset(5)));
    // ... and inside it: slot 1 serves.
    h.handle(MasterInput::ReadCorrupt {
        slot: SlotId(0),
        offset: Offset(1),
    });
    h.handle(MasterInput::SlotConnected { slot: SlotId(2) });
    let a = for_slot(&h.appends(), 2).remove(0);
    assert_eq!((a.first, a.count), (Offset(0), 2));
    assert_eq!(a.events, AppendEvents::FromStore { source: SlotId(1) });
    assert_eq!(h.m.stats().reads_corrupt, 2);
    // Both copies damaged: nothing is sent; the attempt is counted.
    h.handle(MasterInput::ReadCorrupt {
        slot: SlotId(1),
        offset: Offset(0),
    });
    h.handle(MasterInput::SlotDisconnected { slot: SlotId(2) });
    h.handle(MasterInput::SlotConnected { slot: SlotId(2) });
    assert!(for_slot(&h.appends(), 2).is_empty());
    assert!(h.m.stats().no_read_source > 0);
    // A slave slot's or unknown slot's report changes nothing; a drop forgets.
    h.handle(MasterInput::ReadCorrupt {
        slot: SlotId(9),
        offset: Offset(0),
    });
    h.handle(MasterInput::SlotDisconnected { slot: SlotId(0) });
    assert!(!h.m.slot_corrupt_in(SlotId(0), Offset(0), Offset(9)));
    h.handle(MasterInput::SlotConnected { slot: SlotId(0) });
    h.handle(MasterInput::HeartbeatTick);
    let a = for_slot(&h.appends(), 2);
    assert!(
        a.iter()
            .any(|a| a.events == AppendEvents::FromStore { source: SlotId(0) }),
        "slot 0 serves again once its damaged records are forgotten: {a:?}"
    );
}

#[test]
fn config_and_handover_are_validated() {
    let mut out = Vec::new();
    let bad_quorum = ClusterConfig {
        ack_quorum: 1,
        ..stores(3)
    };
    let r = MasterCore::new(
        MasterConfig {
            cluster: bad_quorum,
            limits: ReplicationLimits::default(),
        },
        AdoptedLog {
            epoch: E,
            log: Log::new(),
            applied: None,
            voters: None,
        },
        Bytes::new().into(),
        &mut out,
    );
    assert!(matches!(r, Err(ConfigError::QuorumsDoNotIntersect { .. })));
    let newer = MasterCore::new(
        MasterConfig {
            cluster: stores(3),
            limits: ReplicationLimits::default(),
        },
        AdoptedLog {
            epoch: E,
            log: log_of(&[100]),
            applied: None,
            voters: None,
        },
        Bytes::new().into(),
        &mut out,
    );
    assert!(matches!(newer, Err(ConfigError::BadHandover { .. })));
    let zero = MasterCore::new(
        MasterConfig {
            cluster: stores(3),
            limits: ReplicationLimits {
                appends_inflight_max: 0,
                ..ReplicationLimits::default()
            },
        },
        AdoptedLog {
            epoch: E,
            log: Log::new(),
            applied: None,
            voters: None,
        },
        Bytes::new().into(),
        &mut out,
    );
    assert!(matches!(
        zero,
        Err(ConfigError::BadLimit {
            name: "appends_inflight_max",
            ..
        })
    ));
    assert!(out.is_empty());
}

/// Regression (found by the oracle proptest): a store answered the first probe with a
/// non-voting ack claiming offset 0. Trimming trusted any ack, so with `retained_bytes_max`
/// 0 the master dropped offset 0 from memory although no voting store had acked it; when
/// every store then turned out to be empty, no store could serve offset 0 and replication
/// stalled forever. Trimming now only drops events a voting store acked in this epoch.
#[test]
fn a_non_voters_claim_never_makes_the_master_drop_what_a_lagging_store_needs() {
    let limits = ReplicationLimits {
        append_events_max: 1,
        retained_bytes_max: 0,
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(3), limits, log_of(&[1, 1, 2]), Some(Offset(1)));
    let probes = h.appends();
    h.handle(MasterInput::Persisted {
        slot: SlotId(0),
        append: probes[0].append,
        epoch: E,
        through: Some(Offset(0)),
        identity: ident(0),
        voter: false,
    });
    assert_eq!(
        h.m.log().mem_start(),
        Offset(0),
        "nothing a voter acked: nothing trimmed"
    );
    let mut s: Vec<StoreSim> = (0..3).map(|i| StoreSim::new(ident(i), &[])).collect();
    let mut queue: std::collections::VecDeque<AppendCommand> = probes.into_iter().collect();
    queue.extend(h.appends());
    let mut steps = 0;
    while let Some(a) = queue.pop_front() {
        steps += 1;
        assert!(steps < 200, "replication stalled");
        let log = h.m.log().clone();
        let answer = s[a.slot.index()].answer(a.slot, &a, &log);
        h.handle(answer);
        queue.extend(h.appends());
    }
    assert_eq!(h.m.hwm(), Some(Offset(3)));
    assert_eq!(h.m.stats().no_read_source, 0);
}

#[test]
fn an_overloaded_store_is_retried_after_the_next_tick() {
    let mut h = H::new(3);
    let probes = h.appends();
    h.handle(MasterInput::Rejected {
        slot: SlotId(2),
        append: probes[2].append,
        promised: E,
        last: None,
        reason: RejectReason::Overloaded,
    });
    h.propose();
    assert!(
        for_slot(&h.appends(), 2).is_empty(),
        "backing off until the next tick"
    );
    assert_eq!(h.m.stats().overloaded, 1);
    h.handle(MasterInput::HeartbeatTick);
    let a = for_slot(&h.appends(), 2);
    assert_eq!(a.len(), 1);
    assert_eq!((a[0].prev, a[0].first, a[0].count), (None, Offset(0), 2));
}

#[test]
fn deferred_proposals_share_one_append_per_slot_after_a_flush() {
    let mut h = H::new(3);
    let probes = h.appends();
    for a in &probes {
        h.ack_append(a);
    }
    assert_eq!(h.stabilized(), vec![Offset(0)]);
    let offsets: Vec<Offset> = (0..5)
        .map(|_| {
            h.m.propose_deferred(EventKind::Message, Bytes::from_static(b"m").into())
                .expect("accepted")
        })
        .collect();
    assert_eq!(offsets, (1..=5).map(Offset).collect::<Vec<_>>());
    assert!(h.appends().is_empty(), "nothing is sent before the flush");
    h.m.flush(&mut h.out);
    let appends = h.appends();
    assert_eq!(appends.len(), 3, "one append per slot: {appends:?}");
    for a in &appends {
        assert_eq!((a.first, a.count), (Offset(1), 5));
    }
    for a in &appends {
        h.ack_append(a);
    }
    assert_eq!(h.stabilized(), vec![Offset(5)]);
    // A flush with nothing due sends nothing.
    h.m.flush(&mut h.out);
    assert!(h.appends().is_empty());
}

#[test]
fn deferred_proposals_obey_backpressure_like_propose() {
    let limits = ReplicationLimits {
        inflight_bytes_max: 3 * (crate::core::event::EVENT_OVERHEAD_BYTES + 1),
        ..ReplicationLimits::default()
    };
    let mut h = H::with(stores(3), limits, Log::new(), None);
    // The epoch-start event (empty payload) is unstable too.
    h.m.propose_deferred(EventKind::Message, Bytes::from_static(b"m").into())
        .expect("fits");
    h.m.propose_deferred(EventKind::Message, Bytes::from_static(b"m").into())
        .expect("fits");
    assert!(matches!(
        h.m.propose_deferred(EventKind::Message, Bytes::from_static(b"m").into()),
        Err(ProposeError::Backpressure { .. })
    ));
    assert_eq!(
        h.m.next_offset(),
        Offset(3),
        "a refused event takes no offset"
    );
}

// ------------------------------------------------------------------ check-quorum

impl H {
    /// One heartbeat tick; then the stores in `answering` ack every append due to them (as
    /// voters with their expected identity). Returns the `QuorumLost` commands emitted.
    fn tick_with(&mut self, answering: &[u16]) -> Vec<MasterCommand> {
        self.handle(MasterInput::HeartbeatTick);
        for a in self.appends() {
            if answering.contains(&a.slot.0) {
                self.ack_append(&a);
            }
        }
        let (lost, rest): (Vec<_>, Vec<_>) = self
            .out
            .drain(..)
            .partition(|c| matches!(c, MasterCommand::QuorumLost { .. }));
        self.out = rest;
        lost
    }
}

#[test]
fn check_quorum_is_off_unless_enabled() {
    let mut h = H::new(3);
    h.appends();
    for _ in 0..100 {
        assert!(h.tick_with(&[]).is_empty(), "no rule, no verdict");
    }
    assert!(!h.m.is_quorum_lost());
    assert!(!h.m.is_stopped());
}

#[test]
fn check_quorum_keeps_a_master_that_hears_qa_stores() {
    let mut h = H::new(3);
    h.m.enable_check_quorum(4);
    for a in h.appends() {
        if a.slot.0 < 2 {
            h.ack_append(&a);
        }
    }
    for _ in 0..50 {
        assert!(h.tick_with(&[0, 1]).is_empty(), "2 of 3 voters answer: Qa");
        h.propose();
    }
    assert!(!h.m.is_stopped());
    assert!(
        h.m.hwm().is_some(),
        "the minority cut does not stop stabilizing"
    );
}

#[test]
fn check_quorum_gives_up_once_when_fewer_than_qa_stores_ack_within_the_window() {
    let mut h = H::new(3);
    h.m.enable_check_quorum(4);
    let probes = h.appends();
    for a in &probes {
        h.ack_append(a);
    }
    // Everyone answers for a while, then only store 0 does (the master is cut from 1, 2).
    for _ in 0..10 {
        assert!(h.tick_with(&[0, 1, 2]).is_empty());
    }
    let mut verdicts = Vec::new();
    let mut ticks_to_verdict = 0;
    while verdicts.is_empty() {
        ticks_to_verdict += 1;
        assert!(ticks_to_verdict <= 10, "a verdict within a window or so");
        verdicts = h.tick_with(&[0]);
    }
    assert_eq!(
        verdicts,
        vec![MasterCommand::QuorumLost {
            voters_heard: 1,
            ack_quorum: 2
        }]
    );
    assert!(
        ticks_to_verdict > 4,
        "the last acks of stores 1 and 2 count for a whole window: gave up after {ticks_to_verdict} ticks"
    );
    assert!(h.m.is_quorum_lost() && h.m.is_stopped());
    assert_eq!(h.m.fenced_by(), None, "not fenced: nobody took over yet");
    let hwm = h.m.hwm();
    assert_eq!(
        h.m.propose(EventKind::Message, Bytes::new().into(), &mut h.out),
        Err(ProposeError::QuorumLost)
    );
    h.out.clear();
    for _ in 0..20 {
        h.handle(MasterInput::HeartbeatTick);
        assert!(h.out.is_empty(), "a master that gave up sends nothing");
    }
    assert_eq!(h.m.hwm(), hwm, "and stabilizes nothing more");
}

#[test]
fn check_quorum_gives_a_whole_window_from_when_it_is_enabled() {
    let mut h = H::new(3);
    h.appends();
    for _ in 0..10 {
        assert!(h.tick_with(&[]).is_empty());
    }
    h.m.enable_check_quorum(5);
    for _ in 0..4 {
        assert!(
            h.tick_with(&[]).is_empty(),
            "no verdict within the first window"
        );
    }
    assert_eq!(
        h.tick_with(&[]),
        vec![MasterCommand::QuorumLost {
            voters_heard: 0,
            ack_quorum: 2
        }]
    );
}

#[test]
fn check_quorum_counts_only_voting_acks_of_its_own_epoch() {
    let mut h = H::new(3);
    h.m.enable_check_quorum(3);
    let mut lost = Vec::new();
    for _ in 0..10 {
        for a in h.appends() {
            let input = match a.slot.0 {
                0 => MasterInput::Persisted {
                    slot: a.slot,
                    append: a.append,
                    epoch: a.epoch,
                    through: a.through(),
                    identity: ident(0),
                    voter: true,
                },
                // A wiped store: another incarnation, answering as a learner.
                1 => MasterInput::Persisted {
                    slot: a.slot,
                    append: a.append,
                    epoch: a.epoch,
                    through: a.through(),
                    identity: StoreIdentity {
                        store_id: ident(1).store_id,
                        incarnation: Incarnation(9),
                    },
                    voter: false,
                },
                // An answer under another epoch says nothing about this master's log.
                _ => MasterInput::Persisted {
                    slot: a.slot,
                    append: a.append,
                    epoch: Epoch(E.0 - 1),
                    through: a.through(),
                    identity: ident(2),
                    voter: true,
                },
            };
            h.handle(input);
        }
        h.handle(MasterInput::HeartbeatTick);
        lost.extend(
            h.out
                .drain(..)
                .filter(|c| matches!(c, MasterCommand::QuorumLost { .. })),
        );
    }
    assert_eq!(
        lost,
        vec![MasterCommand::QuorumLost {
            voters_heard: 1,
            ack_quorum: 2
        }]
    );
}

#[test]
fn a_fenced_master_never_reports_a_lost_quorum_too() {
    let mut h = H::new(3);
    h.m.enable_check_quorum(2);
    let probes = h.appends();
    h.handle(MasterInput::RivalSeen { epoch: Epoch(300) });
    assert_eq!(
        h.out,
        vec![MasterCommand::StepDown {
            promised: Epoch(300)
        }]
    );
    h.out.clear();
    for _ in 0..10 {
        assert!(h.tick_with(&[]).is_empty());
    }
    assert!(!h.m.is_quorum_lost());
    drop(probes);
}

/// Retention: a restarted slave needs the log from offset 0, which the stores deleted. The
/// driver asks the core to send it the log from the checkpoint at the trim point instead;
/// the core does so only for a slave, at or below the HWM, and not twice.
#[test]
fn a_slave_behind_the_trim_point_is_sent_the_log_from_the_checkpoint() {
    let mut cluster = stores(3);
    cluster.slots.push(SlotKind::Slave {
        broker: BrokerId(2),
    });
    let mut h = H::with(
        cluster,
        ReplicationLimits::default(),
        log_of(&[1; 10]),
        Some(Offset(9)),
    );
    // The epoch-start event (offset 10) is stabilized by two stores; the restarted slave
    // holds nothing: the core backs up to offset 0 for it.
    let slave = SlotId(3);
    for a in h.appends() {
        if a.slot.0 < 2 {
            h.ack_append(&a);
        }
        if a.slot == slave {
            h.handle(MasterInput::Rejected {
                slot: slave,
                append: a.append,
                promised: Epoch::ZERO,
                last: None,
                reason: RejectReason::LogMismatch,
            });
        }
    }
    assert_eq!(h.m.hwm(), Some(Offset(10)));
    let from_zero = for_slot(&h.appends(), 3);
    assert_eq!(from_zero[0].first, Offset(0));
    let to = |h: &mut H, slot: SlotId, checkpoint: u64| {
        h.handle(MasterInput::SlaveToCheckpoint {
            slot,
            checkpoint: Offset(checkpoint),
        });
    };
    // Above the HWM, at 0, or for a store: ignored.
    to(&mut h, slave, 11);
    to(&mut h, slave, 0);
    to(&mut h, SlotId(2), 5);
    assert!(h.appends().is_empty());
    to(&mut h, slave, 5);
    let sent = for_slot(&h.appends(), 3);
    assert_eq!(sent.len(), 1, "{sent:?}");
    assert_eq!(
        (sent[0].prev, sent[0].first, sent[0].count),
        (Some(pos(1, 4)), Offset(5), 6)
    );
    // Already being sent from there: nothing more.
    to(&mut h, slave, 5);
    assert!(h.appends().is_empty());
}

#[test]
fn bytes_between_sums_the_events_held_and_estimates_the_rest() {
    let mut h = H::new(3);
    for _ in 0..5 {
        h.propose();
    }
    let end = h.m.next_offset();
    let sizes: Vec<u64> =
        h.m.log
            .iter_from(Offset(0))
            .map(crate::core::event::accounted_bytes)
            .collect();
    assert_eq!(sizes.len() as u64, end.0, "everything is in memory");
    let all: u64 = sizes.iter().sum();
    assert_eq!(h.m.bytes_between(Offset(0), end, usize::MAX), Some(all));
    assert_eq!(h.m.bytes_between(end, end, 0), Some(0));
    assert_eq!(
        h.m.bytes_between(Offset(2), end, usize::MAX),
        Some(sizes[2..].iter().sum())
    );
    // Two exactly, the rest at the mean of the events held.
    let mean = all / sizes.len() as u64;
    let rest = end.0 - 1 - 2;
    assert_eq!(
        h.m.bytes_between(Offset(1), end, 2),
        Some(sizes[1] + sizes[2] + rest * mean)
    );
}

fn voter_of(slot: u16, identity: StoreIdentity) -> quire_proto::Voter {
    quire_proto::Voter {
        store_index: slot,
        store_id: identity.store_id,
        incarnation: identity.incarnation,
    }
}

#[test]
fn a_voter_set_change_follows_the_membership_rules() {
    let mut h = H::new(3);
    let probes = h.appends();
    let all: Vec<_> = (0..3).map(|i| voter_of(i, ident(u64::from(i)))).collect();
    let without_2 = all[..2].to_vec();
    // Rule 2: not before the epoch-start event is stabilized.
    assert_eq!(
        h.m.propose_config(without_2.clone()),
        Err(ConfigChangeError::EpochStartUnstable {
            epoch_start: Offset(0)
        })
    );
    h.ack_append(&probes[0]);
    h.ack_append(&probes[1]);
    h.ack_append(&probes[2]);
    assert_eq!(h.stabilized(), vec![Offset(0)]);
    // One store at a time.
    assert_eq!(
        h.m.propose_config(all[..1].to_vec()),
        Err(ConfigChangeError::NotOneChange { changes: 2 })
    );
    assert_eq!(
        h.m.propose_config(all.clone()),
        Err(ConfigChangeError::NotOneChange { changes: 0 })
    );
    let at =
        h.m.propose_config(without_2.clone())
            .expect("one store removed");
    h.m.flush(&mut h.out);
    assert_eq!(at, Offset(1));
    assert_eq!(h.m.pending_config(), Some(at));
    assert_eq!(h.m.cluster().voter_count(), 2);
    // Rule 2: one change at a time.
    assert_eq!(
        h.m.propose_config(all.clone()),
        Err(ConfigChangeError::ChangePending { offset: at })
    );
    // Rule 1: the new set counts at once; slot 2's acks no longer count, Qa = 2 of 2.
    let appends = h.appends();
    h.ack_append(
        &for_slot(&appends, 2)
            .pop()
            .expect("slot 2 still gets the log"),
    );
    h.ack_append(&for_slot(&appends, 0).pop().expect("to slot 0"));
    assert!(h.stabilized().is_empty(), "slot 2 is no longer a voter");
    h.ack_append(&for_slot(&appends, 1).pop().expect("to slot 1"));
    assert_eq!(h.stabilized(), vec![at]);
    assert_eq!(h.m.pending_config(), None);
    // Slot 2 comes back under a new identity: its old acks never count for it.
    let fresh = StoreIdentity {
        store_id: quire_proto::StoreId(77),
        incarnation: quire_proto::Incarnation(2),
    };
    let mut back = without_2.clone();
    back.push(voter_of(2, fresh));
    let at2 = h.m.propose_config(back).expect("one store added");
    h.m.flush(&mut h.out);
    assert_eq!(h.m.cluster().expected_identity(SlotId(2)), Some(fresh));
    assert_eq!(
        h.m.slot_status(SlotId(2)).and_then(|s| s.voted_through),
        None
    );
    let appends = h.appends();
    h.ack_append(&for_slot(&appends, 0).pop().expect("to slot 0"));
    assert!(h.stabilized().is_empty(), "Qa = 2 of 3 again");
    let to2 = for_slot(&appends, 2).pop().expect("to slot 2");
    h.handle(MasterInput::Persisted {
        slot: SlotId(2),
        append: to2.append,
        epoch: to2.epoch,
        through: to2.through(),
        identity: fresh,
        voter: true,
    });
    assert_eq!(h.stabilized(), vec![at2]);
}
