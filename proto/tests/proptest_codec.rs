//! Property tests of the codec: arbitrary messages round-trip through both encoders and
//! both decoders; arbitrary bytes, truncations and bit flips never panic the decoder.

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use quire_proto::*;

fn offset() -> impl Strategy<Value = Offset> {
    prop_oneof![0u64..1000, any::<u64>()].prop_map(Offset)
}

fn epoch() -> impl Strategy<Value = Epoch> {
    any::<u64>().prop_map(Epoch)
}

fn position() -> impl Strategy<Value = LogPosition> {
    // Offsets below u64::MAX / 2 so that appends after them cannot overflow.
    (epoch(), 0u64..u64::MAX / 2).prop_map(|(epoch, o)| LogPosition {
        epoch,
        offset: Offset(o),
    })
}

fn payload() -> impl Strategy<Value = Bytes> {
    prop_oneof![
        4 => prop::collection::vec(any::<u8>(), 0..48),
        1 => prop::collection::vec(any::<u8>(), 1000..3000),
    ]
    .prop_map(Bytes::from)
}

fn kind() -> impl Strategy<Value = EventKind> {
    (1u8..=5).prop_map(|b| EventKind::from_u8(b).expect("kinds 1..=5 exist"))
}

fn name(max: usize) -> impl Strategy<Value = String> {
    prop_oneof!["[a-z0-9._-]{1,24}", "\\PC{1,12}"]
        .prop_filter("fits the bound", move |s| !s.is_empty() && s.len() <= max)
}

fn text(max: usize) -> impl Strategy<Value = String> {
    "\\PC{0,40}".prop_filter("fits the bound", move |s| s.len() <= max)
}

/// Events at consecutive offsets from `first`.
fn events_from(first: u64) -> impl Strategy<Value = Vec<Event>> {
    prop::collection::vec((epoch(), kind(), payload()), 0..6).prop_map(move |v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (epoch, kind, payload))| Event {
                epoch,
                offset: Offset(first + i as u64),
                kind,
                payload: payload.into(),
            })
            .collect()
    })
}

fn broker_info() -> impl Strategy<Value = BrokerInfo> {
    (any::<u16>(), text(ADDR_BYTES_MAX)).prop_map(|(id, addr)| BrokerInfo {
        id: BrokerId(id),
        addr,
    })
}

fn error_detail() -> impl Strategy<Value = ErrorDetail> {
    prop_oneof![
        Just(ErrorDetail::None),
        (any::<u64>(), any::<u64>()).prop_map(|(s, i)| ErrorDetail::NotVoter {
            store_id: StoreId(s),
            incarnation: Incarnation(i)
        }),
        (epoch(), proptest::option::of(broker_info()))
            .prop_map(|(epoch, master)| ErrorDetail::NotMaster { epoch, master }),
        offset().prop_map(|first_offset| ErrorDetail::Trimmed { first_offset }),
        offset().prop_map(|offset| ErrorDetail::Corrupt { offset }),
    ]
}

fn body() -> impl Strategy<Value = Body> {
    let opt_pos = || proptest::option::of(position());
    let opt_off = || proptest::option::of(offset());
    prop_oneof![
        (
            prop::sample::select(ErrorCode::ALL.to_vec()),
            text(ERROR_MESSAGE_BYTES_MAX),
            error_detail()
        )
            .prop_map(|(code, message, detail)| ErrorResponse {
                code,
                message,
                detail
            }
            .into()),
        (epoch(), opt_pos(), opt_off())
            .prop_flat_map(|(epoch, prev, hwm)| {
                let first = prev.map_or(0, |p| p.offset.0 + 1);
                events_from(first).prop_map(move |events| AppendRequest {
                    epoch,
                    prev,
                    events,
                    hwm,
                })
            })
            .prop_map(Body::from),
        (
            epoch(),
            opt_off(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>(),
            opt_off()
        )
            .prop_map(|(e, t, s, i, v, c)| {
                PersistedAck {
                    epoch: e,
                    through_offset: t,
                    store_id: StoreId(s),
                    incarnation: Incarnation(i),
                    voter: v,
                    corrupt: c,
                }
                .into()
            }),
        (1u8..=5, epoch(), opt_pos()).prop_map(|(r, promised, last)| {
            AppendRejected {
                reason: RejectReason::from_u8(r).expect("1..=5"),
                promised,
                last,
            }
            .into()
        }),
        (epoch(), proptest::option::of((any::<u64>(), any::<u64>()))).prop_map(
            |(epoch, expected)| {
                FenceRequest {
                    epoch,
                    expected: expected.map(|(s, i)| (StoreId(s), Incarnation(i))),
                }
                .into()
            }
        ),
        (
            epoch(),
            opt_pos(),
            any::<u64>(),
            any::<u64>(),
            proptest::option::of((offset(), epoch()))
        )
            .prop_map(|(epoch, last, s, i, cut)| {
                FenceGranted {
                    epoch,
                    last,
                    store_id: StoreId(s),
                    incarnation: Incarnation(i),
                    tail_cut: cut.map(|(offset, promised)| TailCut { offset, promised }),
                }
                .into()
            }),
        epoch().prop_map(|promised| FenceRefused { promised }.into()),
        (offset(), any::<u32>(), any::<u32>()).prop_map(|(from, max_events, max_bytes)| {
            ReadRequest {
                from,
                max_events,
                max_bytes,
            }
            .into()
        }),
        (offset(), opt_pos(), 0u64..u64::MAX / 2)
            .prop_flat_map(|(first_offset, last, start)| {
                events_from(start).prop_map(move |events| ReadResponse {
                    first_offset,
                    last,
                    events,
                })
            })
            .prop_map(Body::from),
        (epoch(), offset(), kind(), payload()).prop_map(|(epoch, offset, kind, payload)| {
            RepairRequest {
                event: Event {
                    epoch,
                    offset,
                    kind,
                    payload: payload.into(),
                },
            }
            .into()
        }),
        (
            offset(),
            prop::sample::select(RepairOutcome::ALL.to_vec()),
            opt_off()
        )
            .prop_map(|(offset, outcome, next_corrupt)| RepairResponse {
                offset,
                outcome,
                next_corrupt,
            }
            .into()),
        Just(TailRequest.into()),
        (
            opt_pos(),
            epoch(),
            opt_off(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>(),
            offset()
        )
            .prop_map(|(last, promised, hwm, s, i, voter, first_offset)| {
                TailResponse {
                    last,
                    promised,
                    hwm,
                    store_id: StoreId(s),
                    incarnation: Incarnation(i),
                    voter,
                    first_offset,
                }
                .into()
            }),
        (epoch(), opt_off(), any::<u16>()).prop_map(|(epoch, hwm, m)| Heartbeat {
            epoch,
            hwm,
            master: BrokerId(m)
        }
        .into()),
        (epoch(), any::<u16>(), opt_pos()).prop_map(|(epoch, b, last)| HeartbeatAck {
            epoch,
            broker: BrokerId(b),
            last
        }
        .into()),
        (
            name(TOPIC_BYTES_MAX),
            any::<u64>(),
            any::<u64>(),
            prop::collection::vec(payload(), 0..6)
        )
            .prop_map(|(topic, producer_id, sequence, messages)| {
                ProduceRequest {
                    format: quire_proto::MessageFormat::Raw,
                    topic,
                    producer_id,
                    sequence,
                    messages,
                }
                .into()
            }),
        (offset(), any::<u32>()).prop_map(|(base_offset, count)| ProduceResponse {
            base_offset,
            count
        }
        .into()),
        (
            name(TOPIC_BYTES_MAX),
            offset(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>()
        )
            .prop_map(|(topic, from_offset, max_messages, max_bytes, wait_ms)| {
                FetchRequest {
                    records: false,
                    topic,
                    from_offset,
                    max_messages,
                    max_bytes,
                    wait_ms,
                }
                .into()
            }),
        (
            opt_off(),
            offset(),
            prop::collection::vec((offset(), payload()), 0..6)
        )
            .prop_map(|(hwm, next_offset, messages)| FetchResponse {
                formats: Vec::new(),
                hwm,
                next_offset,
                messages
            }
            .into()),
        (name(TOPIC_BYTES_MAX), name(CURSOR_BYTES_MAX), offset()).prop_map(
            |(topic, cursor, offset)| CommitCursorRequest {
                topic,
                cursor,
                offset
            }
            .into()
        ),
        Just(CommitCursorResponse.into()),
        (name(TOPIC_BYTES_MAX), name(CURSOR_BYTES_MAX)).prop_map(|(topic, cursor)| CursorRequest {
            topic,
            cursor
        }
        .into()),
        opt_off().prop_map(|offset| CursorResponse { offset }.into()),
        Just(MetadataRequest::default().into()),
        (
            epoch(),
            opt_off(),
            proptest::option::of(broker_info()),
            prop::collection::vec(broker_info(), 0..4),
            prop::collection::vec(
                (
                    any::<u64>(),
                    any::<u64>(),
                    text(ADDR_BYTES_MAX),
                    any::<bool>(),
                    opt_off(),
                    any::<bool>(),
                    opt_off(),
                    proptest::array::uniform3(proptest::option::of(any::<u64>()))
                ),
                0..4
            ),
            opt_off(),
            proptest::option::of(text(ADDR_BYTES_MAX)),
        )
            .prop_map(|(epoch, hwm, master, brokers, stores, applied, kafka)| {
                let stores = stores
                    .into_iter()
                    .map(
                        |(s, i, addr, voter, persisted, connected, corrupt, catch_up)| {
                            let [lag_bytes, catch_up_rate, catch_up_ms] = catch_up;
                            StoreInfo {
                                store_id: StoreId(s),
                                incarnation: Incarnation(i),
                                addr,
                                voter,
                                persisted,
                                connected,
                                corrupt,
                                lag_bytes,
                                catch_up_rate,
                                catch_up_ms,
                            }
                        },
                    )
                    .collect();
                MetadataResponse {
                    topics: Vec::new(),
                    epoch,
                    hwm,
                    master,
                    brokers,
                    stores,
                    applied,
                    kafka,
                    ack_quorum: u16::try_from(epoch.0 % 7).unwrap_or(1),
                    change_pending: hwm,
                }
                .into()
            }),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (any::<u64>(), any::<u32>(), body())
        .prop_map(|(id, log, body)| Frame::on_log(LogId(log), RequestId(id), body))
}

fn encoded(frame: &Frame) -> Vec<u8> {
    let mut buf = BytesMut::new();
    encode(frame, &mut buf).expect("generated frames encode");
    buf.to_vec()
}

/// Decodes everything in `bytes` the way a connection would. Returns the frames and the
/// first error, if any; stops at a fatal error, reads on after a `BadFrame`.
fn drain(bytes: &[u8]) -> (Vec<Frame>, Option<WireError>) {
    let mut buf = BytesMut::from(bytes);
    let mut frames = Vec::new();
    let mut first_error = None;
    loop {
        match decode(&mut buf) {
            Ok(Some(f)) => frames.push(f),
            Ok(None) => break,
            Err(e) => {
                let fatal = e.is_connection_fatal();
                first_error.get_or_insert(e);
                if fatal {
                    break;
                }
            }
        }
    }
    // The slice decoder agrees with the buffer decoder on the first frame.
    let by_slice = decode_slice(bytes);
    match (&by_slice, frames.first(), &first_error) {
        (Ok(Some((f, _))), Some(g), _) => assert_eq!(f, g),
        (Ok(None), None, None) | (Err(_), _, Some(_)) => {}
        (s, f, e) => panic!("slice decoder disagrees: {s:?} vs {f:?} / {e:?}"),
    }
    (frames, first_error)
}

/// Rewrites both CRCs so a corrupted frame gets past them and reaches the body parser.
fn reseal(frame: &mut [u8]) {
    let body_crc = crc32c::crc32c(&frame[HEADER_BYTES..]);
    frame[24..28].copy_from_slice(&body_crc.to_le_bytes());
    let header_crc = crc32c::crc32c(&frame[..28]);
    frame[28..32].copy_from_slice(&header_crc.to_le_bytes());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn any_frame_round_trips(frame in frame()) {
        let bytes = encoded(&frame);
        prop_assert_eq!(bytes.len(), HEADER_BYTES + frame.body.encoded_bytes().expect("counts"));
        let mut buf = BytesMut::from(&bytes[..]);
        prop_assert_eq!(decode(&mut buf), Ok(Some(frame.clone())));
        prop_assert!(buf.is_empty());
        prop_assert_eq!(decode_slice(&bytes), Ok(Some((frame.clone(), bytes.len()))));
        // The vectored path writes the same bytes.
        let mut scratch = BytesMut::new();
        let enc = encode_body(&frame.body, &mut scratch).expect("encodes");
        let mut joined = enc.header(frame.log, frame.request_id, frame.flags).to_vec();
        for c in enc.chunks() {
            joined.extend_from_slice(c);
        }
        prop_assert_eq!(joined, bytes);
    }

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = drain(&bytes);
    }

    #[test]
    fn random_bodies_behind_a_sound_header_never_panic(
        t in prop::sample::select(FrameType::ALL.to_vec()),
        body in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let mut raw = vec![0u8; HEADER_BYTES];
        raw.extend_from_slice(&body);
        let header = FrameHeader {
            frame_bytes: raw.len() as u32,
            frame_type: t.as_u16(),
            flags: 0,
            request_id: RequestId(1),
            log: quire_proto::LogId::ZERO,
            reserved: 0,
            body_crc: 0,
        };
        raw[..HEADER_BYTES].copy_from_slice(&header.encode());
        reseal(&mut raw);
        let (frames, error) = drain(&raw);
        // One frame's bytes: either it parsed, or it is a BadFrame (the header was sound).
        prop_assert_eq!(frames.len() + usize::from(error.is_some()), 1);
        if let Some(e) = error {
            prop_assert!(!e.is_connection_fatal(), "{:?}", e);
        }
        // Whatever parsed re-encodes to a frame that decodes to the same value.
        for f in frames {
            let again = encoded(&f);
            prop_assert_eq!(decode_slice(&again), Ok(Some((f, again.len()))));
        }
    }

    #[test]
    fn truncations_need_more_bytes(frame in frame(), cut in any::<prop::sample::Index>()) {
        let bytes = encoded(&frame);
        let n = cut.index(bytes.len());
        let (frames, error) = drain(&bytes[..n]);
        prop_assert!(frames.is_empty());
        prop_assert_eq!(error, None);
    }

    #[test]
    fn any_single_bit_flip_is_detected(frame in frame(), at in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut bytes = encoded(&frame);
        let i = at.index(bytes.len());
        bytes[i] ^= 1 << bit;
        let (frames, error) = drain(&bytes);
        // CRC32C catches every single-bit error: never a wrong frame.
        prop_assert!(frames.is_empty(), "flip at {} bit {} decoded", i, bit);
        if i < HEADER_BYTES {
            prop_assert!(matches!(error, Some(WireError::HeaderChecksum { .. })), "{:?}", error);
        } else {
            let cause = error.as_ref().map(WireError::cause);
            prop_assert!(matches!(cause, Some(WireError::BodyChecksum { .. })), "{:?}", error);
        }
    }

    #[test]
    fn resealed_flips_and_cuts_reach_the_parser_without_panics(
        frame in frame(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
        cut in any::<prop::sample::Index>(),
    ) {
        let bytes = encoded(&frame);
        // Corrupt the body, then cut it, then give it a sound header again.
        let mut body = bytes[HEADER_BYTES..].to_vec();
        if !body.is_empty() {
            for (at, mask) in flips {
                let i = at.index(body.len());
                body[i] ^= mask;
            }
            let n = cut.index(body.len() + 1);
            body.truncate(n);
        }
        let mut raw = bytes[..HEADER_BYTES].to_vec();
        raw[..4].copy_from_slice(&((HEADER_BYTES + body.len()) as u32).to_le_bytes());
        raw.extend_from_slice(&body);
        reseal(&mut raw);
        let (frames, error) = drain(&raw);
        prop_assert_eq!(frames.len() + usize::from(error.is_some()), 1);
        if let Some(e) = error {
            prop_assert!(!e.is_connection_fatal(), "{:?}", e);
        }
    }

    #[test]
    fn event_bodies_round_trip_and_random_payloads_never_panic(
        topic in name(TOPIC_BYTES_MAX),
        cursor in name(CURSOR_BYTES_MAX),
        a in any::<u64>(),
        b in any::<u64>(),
        message in payload(),
        junk in prop::collection::vec(any::<u8>(), 0..128),
    ) {
        let bodies = [
            EventBody::Message(MessageEvent { format: quire_proto::MessageFormat::Raw, topic: topic.clone(), producer_id: a, sequence: b, message: message.clone() }),
            EventBody::CursorCommit(CursorCommitEvent { topic: topic.clone(), cursor, offset: Offset(a) }),
            EventBody::TopicAdmin(TopicAdminEvent { action: TopicAction::Delete, topic: topic.clone() }),
            EventBody::EpochStart(EpochStartEvent { epoch: Epoch(a), broker: BrokerId(b as u16), voters: vec![Voter { store_index: b as u16, store_id: StoreId(a), incarnation: Incarnation(b) }] }),
            EventBody::Trim(TrimEvent::plain(Offset(b))),
        ];
        for body in bodies {
            let p = body.to_payload().expect("encodes");
            prop_assert_eq!(EventBody::decode(body.kind(), &p), Ok(body.clone()));
            let _ = EventBody::decode(body.kind(), &Payload::from(junk.clone()));
        }
        let mut hot = BytesMut::new();
        encode_message_event(&topic, a, b, &message, &mut hot).expect("encodes");
        let expected = EventBody::Message(MessageEvent { format: quire_proto::MessageFormat::Raw, topic, producer_id: a, sequence: b, message });
        prop_assert_eq!(EventBody::decode(EventKind::Message, &hot.into()), Ok(expected));
    }
}
