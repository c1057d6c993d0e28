//! Unit tests of the engine: inputs in, commands out, no runtime.

use bytes::Bytes;
use quire_proto::{
    BrokerId, CommitCursorRequest, Epoch, EpochStartEvent, ErrorCode, EventBody, Incarnation,
    Offset, ProduceRequest, StoreId,
};

use super::*;
use crate::core::{
    AdoptedLog, AppendEvents, ClusterConfig, Log, MasterCommand, MasterConfig, MasterCore,
    MasterInput, ReplicationLimits, SlotKind, StoreIdentity,
};
use crate::state::BrokerState;

const E: Epoch = Epoch(0x1_0001);

fn ident(i: u64) -> StoreIdentity {
    StoreIdentity {
        store_id: StoreId(i),
        incarnation: Incarnation(1),
    }
}

fn limits() -> WriteLimits {
    WriteLimits {
        message_bytes_max: 1024,
        inflight_bytes_max: 4096,
        produce_timeout_ms: 1000,
        blocked_requests_max: 2,
        topics_max: crate::state::TOPICS_MAX,
        cursors_max: crate::state::CURSORS_MAX,
    }
}

/// A master of three stores, its broker state, its write path, and a store model that
/// acks every append.
struct H {
    core: MasterCore,
    state: BrokerState,
    writes: Writes,
    out: Vec<WriteCommand>,
    /// Appends sent and not yet acked.
    held: Vec<MasterCommand>,
}

impl H {
    fn new() -> H {
        let cluster = ClusterConfig::with_majorities(
            (0..3).map(|i| SlotKind::voter(Some(ident(i)))).collect(),
        );
        let payload = EventBody::EpochStart(EpochStartEvent {
            epoch: E,
            broker: BrokerId(1),
            voters: Vec::new(),
        })
        .to_payload()
        .expect("invariant: a small epoch-start event encodes");
        let mut cmds = Vec::new();
        let core = MasterCore::new(
            MasterConfig {
                cluster,
                limits: ReplicationLimits {
                    inflight_bytes_max: 4096,
                    ..ReplicationLimits::default()
                },
            },
            AdoptedLog {
                epoch: E,
                log: Log::new(),
                applied: None,
                voters: None,
            },
            payload,
            &mut cmds,
        )
        .expect("valid configuration");
        let mut h = H {
            core,
            state: BrokerState::new(),
            writes: Writes::new(limits()),
            out: Vec::new(),
            held: Vec::new(),
        };
        h.deliver(cmds, true);
        h
    }

    /// Carries out the core's commands: every append is acked by its store when `ack`;
    /// stabilized events are applied and handed to the write path.
    fn deliver(&mut self, mut cmds: Vec<MasterCommand>, ack: bool) {
        while !cmds.is_empty() {
            let mut next = Vec::new();
            for c in cmds {
                match c {
                    MasterCommand::Append(a) if ack => {
                        assert!(matches!(a.events, AppendEvents::InMemory(_)));
                        self.core.handle(
                            MasterInput::Persisted {
                                slot: a.slot,
                                append: a.append,
                                epoch: a.epoch,
                                through: a.through(),
                                identity: ident(a.slot.index() as u64),
                                voter: true,
                            },
                            &mut next,
                        );
                    }
                    MasterCommand::Stabilized { through, events } => {
                        for e in &events {
                            self.state.apply(e);
                        }
                        self.writes.on_stabilized(through, &mut self.out);
                    }
                    _ => {}
                }
            }
            cmds = next;
        }
    }

    fn produce(&mut self, token: u64, producer_id: u64, sequence: u64, n: usize, at_ms: u64) {
        self.request(
            token,
            WriteRequest::Produce(produce(producer_id, sequence, n)),
            at_ms,
        );
    }

    fn request(&mut self, token: u64, request: WriteRequest, at_ms: u64) {
        self.request_gated(token, request, at_ms, Gate::Open);
    }

    fn request_gated(&mut self, token: u64, request: WriteRequest, at_ms: u64, gate: Gate) {
        self.writes.on_request(
            &mut self.core,
            &self.state,
            gate,
            Arrival {
                token: RequestToken(token),
                request,
                received_ms: at_ms,
            },
            &mut self.out,
        );
    }

    /// Sends what was proposed; stores ack it now when `ack`, at [`H::release`] otherwise.
    fn flush(&mut self, ack: bool) {
        if self.writes.take_needs_flush() {
            let mut cmds = Vec::new();
            self.core.flush(&mut cmds);
            if ack {
                self.deliver(cmds, true);
            } else {
                self.held.extend(cmds);
            }
        }
    }

    /// The stores ack the appends held back.
    fn release(&mut self) {
        let cmds = std::mem::take(&mut self.held);
        self.deliver(cmds, true);
    }

    /// The answers given since the last call, by token.
    fn answers(&mut self) -> Vec<(u64, Reply)> {
        self.out
            .drain(..)
            .filter_map(|c| match c {
                WriteCommand::Answer { token, reply, .. } => Some((token.0, reply)),
                _ => None,
            })
            .collect()
    }
}

fn produce(producer_id: u64, sequence: u64, n: usize) -> ProduceRequest {
    ProduceRequest {
        format: quire_proto::MessageFormat::Raw,
        topic: "t".to_owned(),
        producer_id,
        sequence,
        messages: (0..n).map(|i| Bytes::from(vec![i as u8; 10])).collect(),
    }
}

fn code(r: &Reply) -> Option<ErrorCode> {
    match r {
        Reply::Error(e) => Some(e.code),
        _ => None,
    }
}

#[test]
fn a_produce_is_answered_when_stabilized() {
    let mut h = H::new();
    assert!(h.answers().is_empty());
    h.produce(1, 7, 0, 3, 0);
    assert!(h.answers().is_empty(), "nothing before stabilization");
    h.flush(true);
    // Offset 0 is the epoch-start event.
    assert_eq!(
        h.answers(),
        vec![(
            1,
            Reply::Produced {
                base_offset: Offset(1),
                count: 3
            }
        )]
    );
    assert_eq!(h.writes.pending_len(), 0);
}

#[test]
fn a_retry_of_an_applied_batch_is_answered_from_the_table() {
    let mut h = H::new();
    h.produce(1, 7, 0, 2, 0);
    h.flush(true);
    h.answers();
    h.produce(2, 7, 0, 2, 5);
    assert!(!h.writes.take_needs_flush(), "nothing proposed again");
    assert_eq!(
        h.answers(),
        vec![(
            2,
            Reply::Produced {
                base_offset: Offset(1),
                count: 2
            }
        )]
    );
    // Part of it is answered with the part's offsets.
    h.produce(3, 7, 1, 1, 5);
    assert_eq!(
        h.answers(),
        vec![(
            3,
            Reply::Produced {
                base_offset: Offset(2),
                count: 1
            }
        )]
    );
}

#[test]
fn a_retry_of_a_batch_in_flight_gets_the_first_attempts_answer() {
    let mut h = H::new();
    h.produce(1, 7, 0, 2, 0);
    h.flush(false);
    h.produce(2, 7, 0, 2, 1);
    assert!(
        h.answers().is_empty(),
        "the retry waits with the first attempt"
    );
    // Another count for the same sequence, or an overlap, is refused.
    h.produce(3, 7, 0, 1, 1);
    h.produce(4, 7, 1, 1, 1);
    let a = h.answers();
    assert_eq!(a.len(), 2);
    assert!(a
        .iter()
        .all(|(_, r)| code(r) == Some(ErrorCode::SequenceGap)));
    // The stores ack: both waiters get the same offsets.
    h.release();
    let mut a = h.answers();
    a.sort_by_key(|(t, _)| *t);
    let ok = Reply::Produced {
        base_offset: Offset(1),
        count: 2,
    };
    assert_eq!(a, vec![(1, ok.clone()), (2, ok)]);
}

#[test]
fn held_requests_are_released_when_the_gate_opens() {
    let mut h = H::new();
    h.request_gated(1, WriteRequest::Produce(produce(0, 0, 1)), 0, Gate::Held);
    h.request_gated(2, WriteRequest::Produce(produce(0, 0, 1)), 0, Gate::Held);
    // The bound of blocked requests is 2: the third is refused.
    h.request_gated(3, WriteRequest::Produce(produce(0, 0, 1)), 0, Gate::Held);
    assert_eq!(code(&h.answers()[0].1), Some(ErrorCode::Overloaded));
    assert_eq!(h.writes.blocked_len(), 2);
    // Still held: nothing moves.
    h.writes
        .retry_blocked(&mut h.core, &h.state, Gate::Held, &mut h.out);
    assert_eq!(h.writes.blocked_len(), 2);
    h.writes
        .retry_blocked(&mut h.core, &h.state, Gate::Open, &mut h.out);
    assert_eq!(h.writes.blocked_len(), 0);
    h.flush(true);
    let tokens: Vec<u64> = h.answers().into_iter().map(|(t, _)| t).collect();
    assert_eq!(tokens, vec![1, 2], "in order");
}

#[test]
fn a_request_waits_for_in_flight_room_and_goes_when_there_is() {
    let mut h = H::new();
    // Three messages of 1000 bytes fill the 4096 in-flight bytes.
    let big = |seq| ProduceRequest {
        format: quire_proto::MessageFormat::Raw,
        topic: "t".to_owned(),
        producer_id: 0,
        sequence: seq,
        messages: vec![Bytes::from(vec![1u8; 1000]); 3],
    };
    h.request(1, WriteRequest::Produce(big(0)), 0);
    h.flush(false);
    h.request(2, WriteRequest::Produce(big(0)), 0);
    assert_eq!(h.writes.blocked_len(), 1, "no room: it waits");
    h.release();
    assert_eq!(h.answers().len(), 1);
    h.writes
        .retry_blocked(&mut h.core, &h.state, Gate::Open, &mut h.out);
    assert_eq!(h.writes.blocked_len(), 0);
    h.flush(true);
    assert_eq!(h.answers()[0].0, 2);
}

#[test]
fn too_large_messages_and_empty_batches_are_refused() {
    let mut h = H::new();
    let p = ProduceRequest {
        format: quire_proto::MessageFormat::Raw,
        topic: "t".to_owned(),
        producer_id: 0,
        sequence: 0,
        messages: vec![Bytes::from(vec![1u8; 1025])],
    };
    h.request(1, WriteRequest::Produce(p), 0);
    h.produce(2, 7, 0, 0, 0);
    let a = h.answers();
    assert_eq!(code(&a[0].1), Some(ErrorCode::MessageTooLarge));
    assert_eq!(code(&a[1].1), Some(ErrorCode::Malformed));
}

#[test]
fn writes_expire_with_timeout_or_no_quorum() {
    let mut h = H::new();
    h.produce(1, 7, 0, 1, 0);
    h.flush(false);
    h.request_gated(2, WriteRequest::Produce(produce(0, 0, 1)), 500, Gate::Held);
    h.writes.expire(999, 3, 2, &mut h.out);
    assert!(h.answers().is_empty(), "not yet due");
    h.writes.expire(1000, 3, 2, &mut h.out);
    let a = h.answers();
    assert_eq!(a, vec![(1, a[0].1.clone())]);
    assert_eq!(code(&a[0].1), Some(ErrorCode::Timeout));
    h.writes.expire(1500, 1, 2, &mut h.out);
    let a = h.answers();
    assert_eq!(a[0].0, 2);
    assert_eq!(code(&a[0].1), Some(ErrorCode::NoQuorum));
}

#[test]
fn a_step_down_fails_every_waiting_request() {
    let mut h = H::new();
    h.produce(1, 7, 0, 1, 0);
    h.request(
        2,
        WriteRequest::CommitCursor(CommitCursorRequest {
            topic: "t".to_owned(),
            cursor: "c".to_owned(),
            offset: Offset(1),
        }),
        0,
    );
    h.flush(false);
    h.request_gated(3, WriteRequest::Produce(produce(0, 0, 1)), 0, Gate::Held);
    let mut out = Vec::new();
    let writes = std::mem::replace(&mut h.writes, Writes::new(limits()));
    writes.fail_all(Some("lost quorum"), &mut out);
    let labels: Vec<(u64, Option<ErrorCode>, Option<&str>)> = out
        .iter()
        .filter_map(|c| match c {
            WriteCommand::Answer {
                token,
                reply,
                error_label,
                ..
            } => Some((token.0, code(reply), *error_label)),
            _ => None,
        })
        .collect();
    assert_eq!(
        labels,
        vec![
            (1, Some(ErrorCode::NoQuorum), Some("no_quorum")),
            (2, Some(ErrorCode::NoQuorum), None),
            (3, None, None),
        ]
    );
    assert!(matches!(
        out.last(),
        Some(WriteCommand::Answer {
            reply: Reply::NotMaster,
            ..
        })
    ));
}

/// A produce to one topic more than `topics_max`, or a commit of one cursor more than
/// `cursors_max`, is refused with `LimitReached` — counting the new names in flight, not
/// only those applied — while writes to existing topics and recommits of existing cursors
/// go on.
#[test]
fn new_topics_and_cursors_beyond_their_bounds_are_refused() {
    let mut h = H::new();
    h.writes = Writes::new(WriteLimits {
        topics_max: 2,
        cursors_max: 2,
        ..limits()
    });
    let to = |topic: &str| {
        WriteRequest::Produce(ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: topic.to_owned(),
            ..produce(0, 0, 1)
        })
    };
    let commit = |cursor: &str| {
        WriteRequest::CommitCursor(CommitCursorRequest {
            topic: "a".to_owned(),
            cursor: cursor.to_owned(),
            offset: Offset(1),
        })
    };
    // Two new topics in flight (not applied yet): a third is refused at once, a second
    // write to a topic in flight is not.
    h.request(1, to("a"), 0);
    h.request(2, to("b"), 0);
    h.request(3, to("c"), 0);
    h.request(4, to("a"), 0);
    let refused = h.answers();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0].0, 3);
    assert_eq!(code(&refused[0].1), Some(ErrorCode::LimitReached));
    h.flush(true);
    assert_eq!(h.answers().len(), 3);
    assert_eq!(h.state.topic_count(), 2);
    // Applied: still two; an existing topic is fine, a new one is not.
    h.request(5, to("b"), 0);
    h.request(6, to("d"), 0);
    h.flush(true);
    let answers = h.answers();
    assert!(answers
        .iter()
        .any(|(t, r)| *t == 5 && matches!(r, Reply::Produced { .. })));
    assert!(answers
        .iter()
        .any(|(t, r)| *t == 6 && code(r) == Some(ErrorCode::LimitReached)));
    // Cursors likewise; a recommit of an existing cursor always goes.
    h.request(7, commit("x"), 0);
    h.request(8, commit("y"), 0);
    h.request(9, commit("z"), 0);
    h.flush(true);
    h.request(10, commit("x"), 0);
    h.request(11, commit("w"), 0);
    h.flush(true);
    let answers = h.answers();
    let refused: Vec<u64> = answers
        .iter()
        .filter(|(_, r)| code(r) == Some(ErrorCode::LimitReached))
        .map(|(t, _)| *t)
        .collect();
    assert_eq!(refused, vec![9, 11], "{answers:?}");
    assert!(answers
        .iter()
        .any(|(t, r)| *t == 10 && matches!(r, Reply::CursorCommitted)));
    assert_eq!(h.state.cursor_count(), 2);
}

/// A Kafka producer's batches must follow each other (KIP-98): a batch that overtook one
/// that failed is refused, so it is never applied over a gap; a native producer may skip
/// ahead. Retries of written or in-flight batches are answered as for any producer.
#[test]
fn a_kafka_producer_may_not_skip_sequences() {
    let kafka = |producer_id, sequence, n| {
        let mut p = produce(producer_id, sequence, n);
        p.format = quire_proto::MessageFormat::Kafka;
        WriteRequest::Produce(p)
    };
    let mut h = H::new();
    // A producer the table does not hold starts at 0.
    h.request(1, kafka(9, 3, 1), 0);
    assert_eq!(code(&h.answers()[0].1), Some(ErrorCode::UnknownProducer));
    h.request(2, kafka(9, 0, 2), 0);
    h.flush(false);
    // In flight: the next batch starts at 2, not 3; a retry of 0 joins the first.
    h.request(3, kafka(9, 3, 1), 0);
    assert_eq!(code(&h.answers()[0].1), Some(ErrorCode::SequenceGap));
    h.request(4, kafka(9, 2, 1), 0);
    h.request(5, kafka(9, 0, 2), 0);
    h.flush(false);
    h.release();
    let mut a = h.answers();
    a.sort_by_key(|(t, _)| *t);
    assert_eq!(
        a.iter().map(|(t, r)| (*t, code(r))).collect::<Vec<_>>(),
        vec![(2, None), (4, None), (5, None)]
    );
    // Applied through 2: 4 is a gap, 3 is next, and a retry of 2 gets its offset.
    h.request(6, kafka(9, 4, 1), 0);
    h.request(7, kafka(9, 2, 1), 0);
    h.request(8, kafka(9, 3, 1), 0);
    h.flush(true);
    let mut a = h.answers();
    a.sort_by_key(|(t, _)| *t);
    assert_eq!(code(&a[0].1), Some(ErrorCode::SequenceGap));
    assert_eq!(
        a[1].1,
        Reply::Produced {
            base_offset: Offset(3),
            count: 1
        }
    );
    assert_eq!(code(&a[2].1), None);
    // A native producer may skip ahead.
    h.produce(9, 5, 10, 1, 0);
    h.flush(true);
    assert_eq!(code(&h.answers()[0].1), None);
}

/// A produce proposed after a delete of its topic creates the topic again when both are
/// applied: it counts as a new topic, and the delete as done, so at `topics_max` (here the
/// state's own bound would be the same) no other new topic slips in to be acknowledged and
/// not indexed.
#[test]
fn a_produce_after_a_delete_of_its_topic_counts_as_a_new_topic() {
    use quire_proto::TopicAction::Delete;
    let mut h = H::new();
    h.writes = Writes::new(WriteLimits {
        topics_max: 2,
        ..limits()
    });
    let to = |topic: &str| {
        WriteRequest::Produce(ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: topic.to_owned(),
            ..produce(0, 0, 1)
        })
    };
    h.request(1, to("a"), 0);
    h.request(2, to("b"), 0);
    h.flush(true);
    assert_eq!(h.answers().len(), 2);
    assert_eq!(h.state.topic_count(), 2);
    // Delete a, then a produce to a (a again once both apply). The delete stabilizes
    // first: the state holds one topic, but the produce in flight will make it two, so a
    // produce to new topic c is refused.
    h.request(
        3,
        WriteRequest::TopicAdmin(quire_proto::TopicAdminRequest {
            action: Delete,
            topic: "a".to_owned(),
            partitions: 0,
        }),
        0,
    );
    h.flush(false);
    let delete_appends = h.held.len();
    h.request(4, to("a"), 0);
    h.flush(false);
    let first: Vec<_> = h.held.drain(..delete_appends).collect();
    h.deliver(first, true);
    assert_eq!(h.answers(), [(3, Reply::TopicChanged)]);
    assert_eq!(h.state.topic_count(), 1);
    h.request(5, to("c"), 0);
    let refused = h.answers();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(code(&refused[0].1), Some(ErrorCode::LimitReached));
    h.release();
    h.flush(true);
    let answers = h.answers();
    assert!(
        matches!(answers[..], [(4, Reply::Produced { .. })]),
        "{answers:?}"
    );
    assert_eq!(h.state.topic_count(), 2);
    assert_eq!(
        h.state.stats().topics_refused,
        0,
        "every acknowledged message indexed"
    );
    assert_eq!(h.state.topic("a").map(|t| t.len()), Some(1));
    // Once applied, the count is exact again: b and a exist, c is still one too many.
    h.request(6, to("c"), 0);
    h.flush(true);
    assert_eq!(code(&h.answers()[0].1), Some(ErrorCode::LimitReached));
}

/// Topics are created and deleted through the log; each refusal is typed.
#[test]
fn topics_are_created_and_deleted_with_typed_refusals() {
    let admin = |action, topic: &str, partitions| {
        WriteRequest::TopicAdmin(quire_proto::TopicAdminRequest {
            action,
            topic: topic.to_owned(),
            partitions,
        })
    };
    use quire_proto::TopicAction::{Create, Delete};
    let mut h = H::new();
    h.request(1, admin(Create, "orders", 1), 0);
    // Being created: a second create is refused already.
    h.request(2, admin(Create, "orders", 1), 0);
    h.request(3, admin(Create, "wide", 4), 0);
    h.request(4, admin(Delete, "missing", 0), 0);
    h.request(5, admin(Create, "", 1), 0);
    h.flush(true);
    let mut a = h.answers();
    a.sort_by_key(|(t, _)| *t);
    assert_eq!(a[0], (1, Reply::TopicChanged));
    assert_eq!(
        a[1..]
            .iter()
            .map(|(t, r)| (*t, code(r)))
            .collect::<Vec<_>>(),
        vec![
            (2, Some(ErrorCode::TopicExists)),
            (3, Some(ErrorCode::InvalidPartitions)),
            (4, Some(ErrorCode::UnknownTopic)),
            (5, Some(ErrorCode::InvalidName)),
        ]
    );
    assert!(h.state.topic("orders").is_some());
    h.request(6, admin(Create, "orders", 1), 0);
    h.request(7, admin(Delete, "orders", 0), 0);
    h.flush(true);
    let mut a = h.answers();
    a.sort_by_key(|(t, _)| *t);
    assert_eq!(code(&a[0].1), Some(ErrorCode::TopicExists));
    assert_eq!(a[1], (7, Reply::TopicChanged));
    assert!(h.state.topic("orders").is_none());
}
