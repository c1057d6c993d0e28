//! Unit tests of the codec through its public API: one round trip per message, one test
//! per kind of bad input, the zero-copy and vectored paths, and the limits.

use bytes::{Bytes, BytesMut};

use crate::*;

fn pos(epoch: u64, offset: u64) -> LogPosition {
    LogPosition {
        epoch: Epoch(epoch),
        offset: Offset(offset),
    }
}

fn event(epoch: u64, offset: u64, kind: EventKind, payload: &'static [u8]) -> Event {
    Event {
        epoch: Epoch(epoch),
        offset: Offset(offset),
        kind,
        payload: Bytes::from_static(payload).into(),
    }
}

fn broker(id: u16, addr: &str) -> BrokerInfo {
    BrokerInfo {
        id: BrokerId(id),
        addr: addr.to_owned(),
    }
}

/// One sample of every body, with non-default values in every field.
pub(crate) fn samples() -> Vec<Body> {
    let big = Bytes::from(vec![0xab; 5000]);
    vec![
        ErrorResponse::new(ErrorCode::Overloaded, "too many bytes in flight").into(),
        ErrorResponse::not_voter(StoreId(3), Incarnation(9)).into(),
        ErrorResponse::not_master(Epoch(0x2_0001), Some(broker(1, "10.0.0.1:7000"))).into(),
        ErrorResponse::not_master(Epoch(5), None).into(),
        AppendRequest {
            epoch: Epoch(0x3_0002),
            prev: Some(pos(0x2_0001, 41)),
            events: vec![
                event(0x2_0001, 42, EventKind::Message, b"hello"),
                Event {
                    epoch: Epoch(0x3_0002),
                    offset: Offset(43),
                    kind: EventKind::Trim,
                    payload: big.into(),
                },
                event(0x3_0002, 44, EventKind::EpochStart, b""),
            ],
            hwm: Some(Offset(40)),
        }
        .into(),
        AppendRequest {
            epoch: Epoch(1),
            prev: None,
            events: vec![event(1, 0, EventKind::EpochStart, b"x")],
            hwm: None,
        }
        .into(),
        AppendRequest {
            epoch: Epoch(1),
            prev: Some(pos(1, 7)),
            events: vec![],
            hwm: Some(Offset(7)),
        }
        .into(),
        PersistedAck {
            epoch: Epoch(7),
            through_offset: Some(Offset(44)),
            store_id: StoreId(2),
            incarnation: Incarnation(5),
            voter: true,
            corrupt: None,
        }
        .into(),
        PersistedAck {
            epoch: Epoch(7),
            through_offset: None,
            store_id: StoreId(2),
            incarnation: Incarnation(6),
            voter: false,
            corrupt: Some(Offset(17)),
        }
        .into(),
        AppendRejected {
            reason: RejectReason::LogMismatch,
            promised: Epoch(8),
            last: Some(pos(6, 30)),
        }
        .into(),
        AppendRejected {
            reason: RejectReason::StaleEpoch,
            promised: Epoch(9),
            last: None,
        }
        .into(),
        AppendRejected {
            reason: RejectReason::LogFailed,
            promised: Epoch(9),
            last: None,
        }
        .into(),
        AppendRejected {
            reason: RejectReason::Overloaded,
            promised: Epoch(9),
            last: None,
        }
        .into(),
        AppendRejected {
            reason: RejectReason::Malformed,
            promised: Epoch(9),
            last: None,
        }
        .into(),
        FenceRequest {
            epoch: Epoch(0x4_0003),
            expected: None,
        }
        .into(),
        FenceRequest {
            epoch: Epoch(0x4_0003),
            expected: Some((StoreId(7), Incarnation(0xdead_beef))),
        }
        .into(),
        FenceGranted {
            epoch: Epoch(0x4_0003),
            last: Some(pos(0x3_0002, 99)),
            store_id: StoreId(1),
            incarnation: Incarnation(1),
            tail_cut: None,
        }
        .into(),
        FenceGranted {
            epoch: Epoch(0x4_0003),
            last: Some(pos(0x3_0002, 98)),
            store_id: StoreId(1),
            incarnation: Incarnation(1),
            tail_cut: Some(crate::TailCut {
                offset: Offset(99),
                promised: Epoch(0x3_0002),
            }),
        }
        .into(),
        FenceRefused {
            promised: Epoch(0x5_0001),
        }
        .into(),
        ReadRequest {
            from: Offset(100),
            max_events: 500,
            max_bytes: 1 << 20,
        }
        .into(),
        ReadResponse {
            first_offset: Offset(10),
            last: Some(pos(3, 102)),
            events: vec![
                event(2, 100, EventKind::CursorCommit, b"c"),
                event(3, 101, EventKind::TopicAdmin, b"t"),
                event(3, 102, EventKind::Message, b"m"),
            ],
        }
        .into(),
        ReadResponse {
            first_offset: Offset(200),
            last: None,
            events: vec![],
        }
        .into(),
        RangeDigestRequest {
            from: Offset(10),
            to: Offset(10 + RANGE_DIGEST_OFFSETS_MAX - 1),
        }
        .into(),
        RangeDigestResponse {
            first_offset: Offset(10),
            last: Some(pos(3, 102)),
            start: Offset(10),
            count: 93,
            digest: 0xdead_beef,
            last_entry: Some(EntryId {
                epoch: Epoch(3),
                offset: Offset(102),
                crc: 7,
            }),
        }
        .into(),
        RangeDigestResponse {
            first_offset: Offset(0),
            last: None,
            start: Offset(0),
            count: 0,
            digest: 0,
            last_entry: None,
        }
        .into(),
        RepairRequest {
            event: event(3, 102, EventKind::Message, b"the good copy"),
        }
        .into(),
        RepairResponse {
            offset: Offset(102),
            outcome: RepairOutcome::Repaired,
            next_corrupt: Some(Offset(400)),
        }
        .into(),
        RepairResponse {
            offset: Offset(7),
            outcome: RepairOutcome::NotHeld,
            next_corrupt: None,
        }
        .into(),
        TailRequest.into(),
        TailResponse {
            last: Some(pos(3, 102)),
            promised: Epoch(4),
            hwm: Some(Offset(101)),
            store_id: StoreId(7),
            incarnation: Incarnation(2),
            voter: true,
            first_offset: Offset(10),
        }
        .into(),
        Heartbeat {
            epoch: Epoch(0x3_0002),
            hwm: Some(Offset(17)),
            master: BrokerId(2),
        }
        .into(),
        HeartbeatAck {
            epoch: Epoch(0x3_0002),
            broker: BrokerId(1),
            last: Some(pos(3, 17)),
        }
        .into(),
        ProduceRequest {
            format: crate::MessageFormat::Raw,
            topic: "orders".to_owned(),
            producer_id: 77,
            sequence: 1000,
            messages: vec![
                Bytes::from_static(b"a"),
                Bytes::new(),
                Bytes::from(vec![1u8; 3000]),
            ],
        }
        .into(),
        ProduceResponse {
            base_offset: Offset(500),
            count: 3,
        }
        .into(),
        FetchRequest {
            records: false,
            topic: "orders".to_owned(),
            from_offset: Offset(490),
            max_messages: 100,
            max_bytes: 65536,
            wait_ms: 250,
        }
        .into(),
        FetchResponse {
            formats: Vec::new(),
            hwm: Some(Offset(502)),
            next_offset: Offset(503),
            messages: vec![
                (Offset(500), Bytes::from_static(b"a")),
                (Offset(502), Bytes::new()),
            ],
        }
        .into(),
        CommitCursorRequest {
            topic: "orders".to_owned(),
            cursor: "billing".to_owned(),
            offset: Offset(503),
        }
        .into(),
        CommitCursorResponse.into(),
        CursorRequest {
            topic: "orders".to_owned(),
            cursor: "billing".to_owned(),
        }
        .into(),
        CursorResponse {
            offset: Some(Offset(503)),
        }
        .into(),
        CursorResponse { offset: None }.into(),
        MetadataRequest::default().into(),
        HandoffRequest { to: BrokerId(2) }.into(),
        HandoffResponse {
            epoch: Epoch(0x4_0002),
            master: BrokerId(2),
            pause_us: 41_000,
        }
        .into(),
        crate::AuthenticateRequest {
            mechanism: "SCRAM-SHA-256".into(),
            message: Bytes::from_static(b"n,,n=alice,r=abc"),
        }
        .into(),
        crate::AuthenticateResponse {
            message: Bytes::from_static(b"r=abcdef,s=c2FsdA==,i=4096"),
        }
        .into(),
        crate::UserAdminRequest(crate::UserAdminEvent {
            user: "alice".into(),
            credential: Some(crate::ScramCredential {
                salt: Bytes::from_static(b"salt"),
                iterations: 4096,
                stored_key: [1; 32],
                server_key: [2; 32],
            }),
        })
        .into(),
        crate::AclAdminRequest(crate::AclAdminEvent {
            action: crate::AclAction::Add,
            entry: crate::AclEntry {
                principal: "*".into(),
                operation: crate::AclOperation::Consume,
                topic: "orders.*".into(),
            },
        })
        .into(),
        crate::AdminResponse.into(),
        crate::TopicAdminRequest {
            action: crate::TopicAction::Create,
            topic: "orders".into(),
            partitions: 1,
        }
        .into(),
        crate::VoterChangeRequest {
            action: crate::VoterChange::Remove,
            store_index: 2,
            store_id: StoreId(7),
            incarnation: Incarnation(3),
        }
        .into(),
        crate::DescribeSecurityRequest.into(),
        crate::DescribeSecurityResponse {
            authorization: true,
            users: vec![crate::UserInfo {
                user: "alice".into(),
                iterations: 4096,
            }],
            acls: vec![crate::AclEntry {
                principal: "alice".into(),
                operation: crate::AclOperation::All,
                topic: "*".into(),
            }],
        }
        .into(),
        TakeOverNowRequest {
            from_epoch: Epoch(0x3_0001),
            hwm: Some(Offset(502)),
        }
        .into(),
        TakeOverNowResponse {
            broker: BrokerId(2),
        }
        .into(),
        MetadataResponse {
            topics: Vec::new(),
            epoch: Epoch(0x3_0002),
            hwm: Some(Offset(502)),
            master: Some(broker(2, "b2:7000")),
            brokers: vec![broker(1, "b1:7000"), broker(2, "b2:7000")],
            stores: vec![
                StoreInfo {
                    store_id: StoreId(1),
                    incarnation: Incarnation(1),
                    addr: "s1:7100".to_owned(),
                    voter: true,
                    persisted: Some(Offset(502)),
                    connected: true,
                    corrupt: Some(Offset(17)),
                    lag_bytes: Some(4096),
                    catch_up_rate: Some(900),
                    catch_up_ms: None,
                },
                StoreInfo {
                    store_id: StoreId(2),
                    incarnation: Incarnation(4),
                    addr: "s2:7100".to_owned(),
                    voter: false,
                    persisted: None,
                    connected: false,
                    corrupt: None,
                    lag_bytes: None,
                    catch_up_rate: None,
                    catch_up_ms: Some(0),
                },
            ],
            applied: Some(Offset(500)),
            kafka: None,
            ack_quorum: 2,
            change_pending: None,
        }
        .into(),
        ErrorResponse::trimmed(Offset(3), Offset(0x1_0000)).into(),
        // Issue 14: Kafka records through the native frames (trailing optional fields).
        ProduceRequest {
            topic: "kafka-topic".into(),
            producer_id: 0,
            sequence: 0,
            messages: vec![Bytes::from_static(b"record-1"), Bytes::new()],
            format: MessageFormat::Kafka,
        }
        .into(),
        FetchRequest {
            topic: "kafka-topic".into(),
            from_offset: Offset(3),
            max_messages: 10,
            max_bytes: 1 << 20,
            wait_ms: 500,
            records: true,
        }
        .into(),
        FetchResponse {
            hwm: Some(Offset(9)),
            next_offset: Offset(8),
            messages: vec![
                (Offset(3), Bytes::from_static(b"raw")),
                (Offset(7), Bytes::from_static(b"rec")),
            ],
            formats: vec![MessageFormat::Raw, MessageFormat::Kafka],
        }
        .into(),
        MetadataRequest { topics: true }.into(),
        MetadataResponse {
            epoch: Epoch(3),
            hwm: None,
            master: None,
            brokers: vec![],
            stores: vec![],
            applied: None,
            kafka: Some("k1:9092".into()),
            ack_quorum: 3,
            change_pending: Some(Offset(41)),
            topics: vec!["a".into(), "b.c".into()],
        }
        .into(),
    ]
}

fn encoded(frame: &Frame) -> BytesMut {
    let mut buf = BytesMut::new();
    encode(frame, &mut buf).expect("sample encodes");
    buf
}

/// A frame with a sound header (both CRCs right) around arbitrary body bytes.
fn raw_frame(frame_type: u16, flags: u8, request_id: u64, body: &[u8]) -> Vec<u8> {
    let header = FrameHeader {
        frame_bytes: (HEADER_BYTES + body.len()) as u32,
        frame_type,
        flags,
        request_id: RequestId(request_id),
        log: crate::LogId::ZERO,
        reserved: 0,
        body_crc: crc32c::crc32c(body),
    };
    let mut out = header.encode().to_vec();
    out.extend_from_slice(body);
    out
}

/// Rewrites the header CRC after a test changed header bytes on purpose.
fn reseal_header(frame: &mut [u8]) {
    let crc = crc32c::crc32c(&frame[..28]);
    frame[28..32].copy_from_slice(&crc.to_le_bytes());
}

fn decode_one(bytes: &[u8]) -> Result<Option<Frame>, WireError> {
    let mut buf = BytesMut::from(bytes);
    decode(&mut buf)
}

fn bad_frame_cause(result: Result<Option<Frame>, WireError>) -> WireError {
    match result {
        Err(e @ WireError::BadFrame { .. }) => e.cause().clone(),
        other => panic!("expected BadFrame, got {other:?}"),
    }
}

#[test]
fn samples_cover_every_frame_type() {
    let types: std::collections::HashSet<FrameType> =
        samples().iter().map(Body::frame_type).collect();
    for t in FrameType::ALL {
        assert!(types.contains(t), "no sample for {t:?}");
    }
}

#[test]
fn every_message_round_trips() {
    for (i, body) in samples().into_iter().enumerate() {
        let frame = Frame::new(RequestId(1000 + i as u64), body);
        let mut buf = encoded(&frame);
        let len = buf.len();
        assert_eq!(
            len,
            HEADER_BYTES + frame.body.encoded_bytes().expect("counts")
        );
        assert_eq!(decode(&mut buf), Ok(Some(frame.clone())), "sample {i}");
        assert!(buf.is_empty());
        let bytes = encoded(&frame);
        assert_eq!(decode_slice(&bytes), Ok(Some((frame, len))));
    }
}

#[test]
fn frames_decode_back_to_back_and_wait_for_more() {
    let frames: Vec<Frame> = samples()
        .into_iter()
        .enumerate()
        .map(|(i, b)| Frame::new(RequestId(i as u64 + 1), b))
        .collect();
    let mut wire = BytesMut::new();
    for f in &frames {
        encode(f, &mut wire).expect("encodes");
    }
    // Feed the stream in 7-byte pieces: every call yields a frame or "need more bytes".
    let mut buf = BytesMut::new();
    let mut out = Vec::new();
    for piece in wire.chunks(7) {
        buf.extend_from_slice(piece);
        while let Some(f) = decode(&mut buf).expect("valid stream") {
            out.push(f);
        }
    }
    assert_eq!(out, frames);
    assert!(buf.is_empty());
}

#[test]
fn every_prefix_of_a_frame_needs_more_bytes() {
    let frame = Frame::new(RequestId(5), samples().swap_remove(4));
    let bytes = encoded(&frame);
    for n in 0..bytes.len() {
        assert_eq!(decode_one(&bytes[..n]), Ok(None), "prefix {n}");
        assert_eq!(decode_slice(&bytes[..n]), Ok(None), "prefix {n}");
    }
}

#[test]
fn unknown_frame_type_is_skipped_with_a_typed_error() {
    let mut wire = raw_frame(0x7777, 0, 42, b"whatever");
    let next = Frame::new(RequestId(43), TailRequest);
    wire.extend_from_slice(&encoded(&next));
    let mut buf = BytesMut::from(&wire[..]);
    let err = decode(&mut buf).expect_err("unknown type");
    match &err {
        WireError::BadFrame {
            request_id,
            frame_type,
            frame_bytes,
            source,
        } => {
            assert_eq!(*request_id, RequestId(42));
            assert_eq!(*frame_type, 0x7777);
            assert_eq!(*frame_bytes as usize, HEADER_BYTES + 8);
            assert_eq!(**source, WireError::UnknownFrameType { frame_type: 0x7777 });
        }
        other => panic!("expected BadFrame, got {other:?}"),
    }
    assert!(!err.is_connection_fatal());
    assert_eq!(err.error_code(), ErrorCode::UnknownFrameType);
    // The stream is still in sync.
    assert_eq!(decode(&mut buf), Ok(Some(next)));
}

#[test]
fn oversize_length_is_refused_from_the_header_before_allocating() {
    let mut header = raw_frame(FrameType::TailRequest.as_u16(), 0, 1, b"");
    header[0..4].copy_from_slice(&((FRAME_BYTES_MAX + 1) as u32).to_le_bytes());
    reseal_header(&mut header);
    let mut buf = BytesMut::with_capacity(64);
    buf.extend_from_slice(&header);
    let err = decode(&mut buf).expect_err("too large");
    assert_eq!(
        err,
        WireError::FrameTooLarge {
            length: FRAME_BYTES_MAX as u64 + 1,
            max: FRAME_BYTES_MAX
        }
    );
    assert!(err.is_connection_fatal());
    assert!(
        buf.capacity() < 1024,
        "decoder reserved {} bytes for a refused frame",
        buf.capacity()
    );
    assert_eq!(decode_slice(&header), Err(err));

    header[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
    reseal_header(&mut header);
    assert!(matches!(
        decode_one(&header),
        Err(WireError::FrameTooLarge { .. })
    ));
}

/// The story: `decode` used to reserve a frame's whole announced length as soon as its
/// header was in, so a peer that sent 24 bytes announcing 16 MiB made the server allocate
/// 16 MiB; 20 such connections pushed a broker to 488 MB RSS. The decoder now leaves the
/// buffer alone and readers grow it as bytes arrive.
#[test]
fn largest_frame_is_announced_but_never_reserved_from_its_header() {
    let mut header = raw_frame(FrameType::TailRequest.as_u16(), 0, 1, b"");
    header[0..4].copy_from_slice(&(FRAME_BYTES_MAX as u32).to_le_bytes());
    reseal_header(&mut header);
    let mut buf = BytesMut::from(&header[..]);
    assert_eq!(decode(&mut buf), Ok(None));
    assert!(
        buf.capacity() < 1024,
        "decoder reserved {} bytes from an untrusted length",
        buf.capacity()
    );
    assert_eq!(frame_bytes_announced(&buf), Ok(Some(FRAME_BYTES_MAX)));
    assert_eq!(frame_bytes_announced(&buf[..HEADER_BYTES - 1]), Ok(None));
    header[28] ^= 1;
    assert!(matches!(
        frame_bytes_announced(&header),
        Err(WireError::HeaderChecksum { .. })
    ));
}

#[test]
fn length_below_header_is_refused() {
    for length in [0u32, 1, 31] {
        let mut header = raw_frame(FrameType::TailRequest.as_u16(), 0, 1, b"");
        header[0..4].copy_from_slice(&length.to_le_bytes());
        reseal_header(&mut header);
        let err = decode_one(&header).expect_err("too short");
        assert_eq!(
            err,
            WireError::FrameTooShort {
                length,
                header_bytes: HEADER_BYTES
            }
        );
        assert!(err.is_connection_fatal());
    }
}

#[test]
fn header_corruption_is_caught_by_the_header_crc() {
    let bytes = encoded(&Frame::new(
        RequestId(9),
        FenceRequest {
            epoch: Epoch(3),
            expected: None,
        },
    ));
    for i in 0..HEADER_BYTES {
        for bit in 0..8 {
            let mut bad = bytes.to_vec();
            bad[i] ^= 1 << bit;
            let err = decode_one(&bad).expect_err("flipped header bit");
            assert!(
                matches!(err, WireError::HeaderChecksum { .. }),
                "byte {i} bit {bit}: {err:?}"
            );
            assert!(err.is_connection_fatal());
            assert_eq!(err.error_code(), ErrorCode::ChecksumMismatch);
        }
    }
}

#[test]
fn body_corruption_is_caught_by_the_body_crc() {
    let frame = Frame::new(RequestId(9), samples().swap_remove(4));
    let bytes = encoded(&frame);
    for i in HEADER_BYTES..bytes.len() {
        let mut bad = bytes.to_vec();
        bad[i] ^= 0x10;
        let cause = bad_frame_cause(decode_one(&bad));
        assert!(
            matches!(cause, WireError::BodyChecksum { .. }),
            "byte {i}: {cause:?}"
        );
    }
}

#[test]
fn unsupported_version_is_refused() {
    let mut bytes = encoded(&Frame::new(RequestId(1), TailRequest)).to_vec();
    bytes[6] = 3;
    reseal_header(&mut bytes);
    let err = decode_one(&bytes).expect_err("version 3");
    assert_eq!(
        err,
        WireError::UnsupportedVersion {
            version: 3,
            supported: PROTOCOL_VERSION
        }
    );
    assert_eq!(err.error_code(), ErrorCode::UnsupportedVersion);
}

/// Version 1's 24-byte header (no log id): a peer of that version gets
/// `UnsupportedVersion`, not a checksum error, and at once, even when its whole frame
/// is shorter than this version's header (an empty-bodied request).
#[test]
fn a_version_1_peer_is_told_its_version_is_unsupported() {
    let mut v1 = Vec::new();
    v1.extend_from_slice(&24u32.to_le_bytes()); // length: an empty body
    v1.extend_from_slice(&FrameType::MetadataRequest.as_u16().to_le_bytes());
    v1.push(1); // version
    v1.push(0); // flags
    v1.extend_from_slice(&7u64.to_le_bytes()); // request id
    v1.extend_from_slice(&0u32.to_le_bytes()); // body crc
    let crc = crc32c::crc32c(&v1);
    v1.extend_from_slice(&crc.to_le_bytes()); // header crc over 0..20
    let unsupported = WireError::UnsupportedVersion {
        version: 1,
        supported: PROTOCOL_VERSION,
    };
    assert_eq!(
        decode(&mut BytesMut::from(&v1[..])),
        Err(unsupported.clone())
    );
    assert_eq!(decode_slice(&v1), Err(unsupported.clone()));
    assert_eq!(frame_bytes_announced(&v1), Err(unsupported.clone()));
    assert_eq!(check_older_version(&v1[..23]), Ok(()), "not whole yet");
    // Followed by the next frame: the 32-byte header decoder sees it the same way.
    v1.extend_from_slice(&v1.clone());
    assert_eq!(decode_one(&v1), Err(unsupported.clone()));
    assert!(unsupported.is_connection_fatal());
    // A version-2 header is never taken for a version-1 one.
    let v2 = encoded(&Frame::new(RequestId(7), MetadataRequest::default()));
    assert_eq!(check_older_version(&v2), Ok(()));
}

#[test]
fn the_log_id_round_trips_and_a_set_reserved_word_is_refused() {
    let frame = Frame::on_log(crate::LogId(u32::MAX), RequestId(3), TailRequest);
    let bytes = encoded(&frame);
    assert_eq!(&bytes[16..20], &u32::MAX.to_le_bytes());
    assert_eq!(decode_one(&bytes), Ok(Some(frame)));

    let mut reserved = bytes.to_vec();
    reserved[21] = 1;
    reseal_header(&mut reserved);
    let mut buf = BytesMut::from(&reserved[..]);
    buf.extend_from_slice(&bytes);
    let cause = bad_frame_cause(decode(&mut buf));
    assert_eq!(cause, WireError::ReservedNotZero { value: 0x100 });
    // The stream is still in sync.
    assert_eq!(
        decode(&mut buf).map(|f| f.map(|f| f.log)),
        Ok(Some(crate::LogId(u32::MAX)))
    );
}

#[test]
fn unknown_flags_are_refused() {
    let bytes = raw_frame(FrameType::TailRequest.as_u16(), 0x80, 1, b"");
    assert_eq!(
        bad_frame_cause(decode_one(&bytes)),
        WireError::UnknownFlags { flags: 0x80 }
    );
}

/// Body of an `AppendRequest` with no prev and no hwm, then `count` and `rest`.
fn append_body(count: u32, rest: &[u8]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&7u64.to_le_bytes()); // epoch
    b.push(0); // prev: none
    b.push(0); // hwm: none
    b.extend_from_slice(&count.to_le_bytes());
    b.extend_from_slice(rest);
    b
}

#[test]
fn count_larger_than_the_body_is_refused_before_allocating() {
    let append = FrameType::AppendRequest.as_u16();
    // 1000 events announced, room for none.
    let bytes = raw_frame(append, 0, 1, &append_body(1000, &[]));
    assert_eq!(
        bad_frame_cause(decode_one(&bytes)),
        WireError::CountExceedsBody {
            field: "append events",
            count: 1000,
            item_bytes_min: EVENT_OVERHEAD_BYTES as u64,
            remaining: 0
        }
    );
    // A count over the bound is refused whatever follows.
    let bytes = raw_frame(append, 0, 1, &append_body(u32::MAX, &[0; 64]));
    assert_eq!(
        bad_frame_cause(decode_one(&bytes)),
        WireError::CountTooLarge {
            field: "append events",
            count: u64::from(u32::MAX),
            max: EVENTS_PER_FRAME_MAX as u64
        }
    );
    // Produce: messages announced beyond the body.
    let mut body = Vec::new();
    body.extend_from_slice(&1u16.to_le_bytes());
    body.push(b't');
    body.extend_from_slice(&[0; 16]);
    body.extend_from_slice(&100u32.to_le_bytes());
    let bytes = raw_frame(FrameType::ProduceRequest.as_u16(), 0, 1, &body);
    assert!(matches!(
        bad_frame_cause(decode_one(&bytes)),
        WireError::CountExceedsBody {
            field: "produce messages",
            count: 100,
            ..
        }
    ));
}

/// `body` without its optional trailing fields (issue 14's Kafka format and topic list).
fn without_trailing(body: &Body) -> Body {
    let mut b = body.clone();
    match &mut b {
        Body::ProduceRequest(p) => p.format = MessageFormat::Raw,
        Body::FetchRequest(f) => f.records = false,
        Body::FetchResponse(f) => f.formats.clear(),
        Body::MetadataRequest(m) => m.topics = false,
        Body::MetadataResponse(m) => m.topics.clear(),
        _ => {}
    }
    b
}

#[test]
fn truncated_body_is_refused_with_the_field() {
    // Every strict prefix of every sample's body, in a sound frame, is a typed error.
    for body in samples() {
        let frame = Frame::new(RequestId(3), body);
        let bytes = encoded(&frame);
        let body_bytes = &bytes[HEADER_BYTES..];
        let base = without_trailing(&frame.body);
        for n in 0..body_bytes.len() {
            let raw = raw_frame(frame.frame_type().as_u16(), 0, 3, &body_bytes[..n]);
            let decoded = decode_one(&raw);
            // A body cut right before its optional trailing fields is that body without
            // them (how older peers' bodies read).
            if base != frame.body && matches!(&decoded, Ok(Some(f)) if f.body == base) {
                continue;
            }
            let cause = bad_frame_cause(decoded);
            // Cutting inside a payload can also make a count exceed what is left.
            assert!(
                matches!(
                    cause,
                    WireError::Truncated { .. } | WireError::CountExceedsBody { .. }
                ),
                "{:?} cut at {n}: {cause:?}",
                frame.frame_type()
            );
        }
    }
    // A payload length beyond the body.
    let mut rest = Vec::new();
    rest.extend_from_slice(&1u64.to_le_bytes());
    rest.push(EventKind::Message.as_u8());
    rest.extend_from_slice(&100u32.to_le_bytes());
    rest.extend_from_slice(b"short");
    let raw = raw_frame(
        FrameType::AppendRequest.as_u16(),
        0,
        1,
        &append_body(1, &rest),
    );
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::Truncated {
            field: "append events",
            needed: 100,
            remaining: 5
        }
    );
}

#[test]
fn fence_expected_tag_is_checked() {
    let mut body = 5u64.to_le_bytes().to_vec();
    body.push(2);
    let raw = raw_frame(FrameType::FenceRequest.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::InvalidTag {
            field: "fence expected",
            byte: 2
        }
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let mut body = 5u64.to_le_bytes().to_vec();
    body.push(0); // expected: none
    body.push(0); // one byte too many
    let raw = raw_frame(FrameType::FenceRequest.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::TrailingBytes { count: 1 }
    );
}

fn topic_body(topic: &[u8]) -> Vec<u8> {
    // A CursorRequest: topic string, then cursor "c".
    let mut b = (topic.len() as u16).to_le_bytes().to_vec();
    b.extend_from_slice(topic);
    b.extend_from_slice(&1u16.to_le_bytes());
    b.push(b'c');
    b
}

#[test]
fn bad_strings_are_refused() {
    let t = FrameType::CursorRequest.as_u16();
    let raw = raw_frame(t, 0, 1, &topic_body(&[0xff, 0xfe]));
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::InvalidUtf8 { field: "topic" }
    );
    let raw = raw_frame(t, 0, 1, &topic_body(b""));
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::EmptyName { field: "topic" }
    );
    let long = vec![b'a'; TOPIC_BYTES_MAX + 1];
    let raw = raw_frame(t, 0, 1, &topic_body(&long));
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::StringTooLong {
            field: "topic",
            length: TOPIC_BYTES_MAX + 1,
            max: TOPIC_BYTES_MAX
        }
    );
    let exact = vec![b'a'; TOPIC_BYTES_MAX];
    assert!(matches!(
        decode_one(&raw_frame(t, 0, 1, &topic_body(&exact))),
        Ok(Some(_))
    ));
}

#[test]
fn bad_tags_kinds_and_codes_are_refused() {
    // A bool that is neither 0 nor 1 (PersistedAck.voter).
    let mut body = Vec::new();
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(0);
    body.extend_from_slice(&[0; 16]);
    body.push(2);
    let raw = raw_frame(FrameType::PersistedAck.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::InvalidTag {
            field: "persisted voter",
            byte: 2
        }
    );
    // An option tag of 7 (FenceGranted.last).
    let mut body = 1u64.to_le_bytes().to_vec();
    body.push(7);
    let raw = raw_frame(FrameType::FenceGranted.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::InvalidTag {
            field: "granted last",
            byte: 7
        }
    );
    // A tail-cut tag of 2 (FenceGranted.tail_cut).
    let mut body = 1u64.to_le_bytes().to_vec();
    body.push(0);
    body.extend_from_slice(&[0; 16]);
    body.push(2);
    let raw = raw_frame(FrameType::FenceGranted.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::InvalidTag {
            field: "granted tail_cut",
            byte: 2
        }
    );
    // Every reason's byte is pinned (docs/protocol.md "AppendRejected").
    for (reason, byte) in [
        (RejectReason::StaleEpoch, 1u8),
        (RejectReason::LogMismatch, 2),
        (RejectReason::LogFailed, 3),
        (RejectReason::Overloaded, 4),
        (RejectReason::Malformed, 5),
    ] {
        assert_eq!(reason.as_u8(), byte);
        assert_eq!(RejectReason::from_u8(byte), Some(reason));
    }
    assert_eq!(RejectReason::from_u8(0), None);
    assert_eq!(RejectReason::from_u8(6), None);
    // A reject reason nobody defined.
    let mut body = vec![9u8];
    body.extend_from_slice(&[0; 9]);
    let raw = raw_frame(FrameType::AppendRejected.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::InvalidTag {
            field: "reject reason",
            byte: 9
        }
    );
    // An event kind nobody defined.
    let mut rest = 1u64.to_le_bytes().to_vec();
    rest.push(0xee);
    rest.extend_from_slice(&0u32.to_le_bytes());
    let raw = raw_frame(
        FrameType::AppendRequest.as_u16(),
        0,
        1,
        &append_body(1, &rest),
    );
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::UnknownEventKind { byte: 0xee }
    );
    // An error code nobody defined.
    let mut body = 999u16.to_le_bytes().to_vec();
    body.extend_from_slice(&0u16.to_le_bytes());
    body.push(0);
    let raw = raw_frame(FrameType::ErrorResponse.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::UnknownErrorCode { code: 999 }
    );
}

#[test]
fn offsets_that_overflow_are_refused() {
    let mut body = 1u64.to_le_bytes().to_vec();
    body.push(1);
    body.extend_from_slice(&1u64.to_le_bytes());
    body.extend_from_slice(&u64::MAX.to_le_bytes()); // prev.offset = u64::MAX
    body.push(0);
    body.extend_from_slice(&1u32.to_le_bytes());
    body.extend_from_slice(&1u64.to_le_bytes());
    body.push(1);
    body.extend_from_slice(&0u32.to_le_bytes());
    let raw = raw_frame(FrameType::AppendRequest.as_u16(), 0, 1, &body);
    assert_eq!(
        bad_frame_cause(decode_one(&raw)),
        WireError::OffsetOverflow {
            field: "append events"
        }
    );
}

#[test]
fn a_bad_frame_is_skipped_by_decode_slice() {
    let mut wire = raw_frame(0x7777, 0, 1, b"abc");
    let next = Frame::new(RequestId(2), TailRequest);
    wire.extend_from_slice(&encoded(&next));
    let err = decode_slice(&wire).expect_err("unknown type");
    let WireError::BadFrame { frame_bytes, .. } = err else {
        panic!("expected BadFrame: {err:?}")
    };
    let (frame, used) = decode_slice(&wire[frame_bytes as usize..])
        .expect("ok")
        .expect("whole");
    assert_eq!(frame, next);
    assert_eq!(frame_bytes as usize + used, wire.len());
}

#[test]
fn encode_refuses_what_cannot_be_carried_and_leaves_the_buffer_alone() {
    let mut buf = BytesMut::from(&b"prefix"[..]);
    let long_topic = "x".repeat(TOPIC_BYTES_MAX + 1);
    let cases: Vec<(Body, WireError)> = vec![
        (
            CursorRequest {
                topic: long_topic.clone(),
                cursor: "c".into(),
            }
            .into(),
            WireError::StringTooLong {
                field: "topic",
                length: TOPIC_BYTES_MAX + 1,
                max: TOPIC_BYTES_MAX,
            },
        ),
        (
            CursorRequest {
                topic: "t".into(),
                cursor: String::new(),
            }
            .into(),
            WireError::EmptyName { field: "cursor" },
        ),
        (
            AppendRequest {
                epoch: Epoch(1),
                prev: Some(pos(1, 9)),
                events: vec![
                    event(1, 10, EventKind::Message, b""),
                    event(1, 12, EventKind::Message, b""),
                ],
                hwm: None,
            }
            .into(),
            WireError::EventsNotContiguous {
                index: 1,
                expected: Offset(11),
                actual: Offset(12),
            },
        ),
        (
            AppendRequest {
                epoch: Epoch(1),
                prev: Some(pos(1, u64::MAX)),
                events: vec![event(1, 0, EventKind::Message, b"")],
                hwm: None,
            }
            .into(),
            WireError::OffsetOverflow {
                field: "append events",
            },
        ),
        (
            ProduceRequest {
                format: crate::MessageFormat::Raw,
                topic: "t".into(),
                producer_id: 0,
                sequence: 0,
                messages: vec![Bytes::from(vec![0u8; FRAME_BYTES_MAX])],
            }
            .into(),
            WireError::FrameTooLarge {
                length: (FRAME_BYTES_MAX + HEADER_BYTES + 2 + 1 + 16 + 4 + 4) as u64,
                max: FRAME_BYTES_MAX,
            },
        ),
        (
            ProduceRequest {
                format: crate::MessageFormat::Raw,
                topic: "t".into(),
                producer_id: 0,
                sequence: 0,
                messages: vec![Bytes::new(); MESSAGES_PER_FRAME_MAX + 1],
            }
            .into(),
            WireError::CountTooLarge {
                field: "produce messages",
                count: MESSAGES_PER_FRAME_MAX as u64 + 1,
                max: MESSAGES_PER_FRAME_MAX as u64,
            },
        ),
    ];
    for (body, expected) in cases {
        assert_eq!(
            encode(&Frame::new(RequestId(1), body.clone()), &mut buf),
            Err(expected.clone())
        );
        assert_eq!(&buf[..], b"prefix");
        let mut scratch = BytesMut::new();
        assert_eq!(encode_body(&body, &mut scratch).map(|_| ()), Err(expected));
    }
}

#[test]
fn decoded_payloads_are_slices_of_the_read_buffer() {
    let frame = Frame::new(RequestId(1), samples().swap_remove(4));
    let mut buf = encoded(&frame);
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let Some(Frame {
        body: Body::AppendRequest(append),
        ..
    }) = decode(&mut buf).expect("ok")
    else {
        panic!("expected an append");
    };
    for e in &append.events {
        if !e.payload.is_empty() {
            assert!(
                range.contains(&(e.payload.head().as_ptr() as usize)),
                "payload was copied"
            );
        }
    }
}

#[test]
fn vectored_encoding_matches_contiguous_and_shares_large_payloads() {
    let mut scratch = BytesMut::new();
    for (i, body) in samples().into_iter().enumerate() {
        let frame = Frame::new(RequestId(i as u64 + 1), body);
        let contiguous = encoded(&frame);
        let enc = encode_body(&frame.body, &mut scratch).expect("encodes");
        assert_eq!(enc.frame_bytes(), contiguous.len());
        assert_eq!(enc.frame_type(), frame.frame_type());
        let mut joined = BytesMut::new();
        enc.write_frame(frame.log, frame.request_id, frame.flags, &mut joined);
        assert_eq!(joined, contiguous, "sample {i}");
        let mut gathered = enc
            .header(frame.log, frame.request_id, frame.flags)
            .to_vec();
        for c in enc.chunks() {
            gathered.extend_from_slice(c);
        }
        assert_eq!(&gathered[..], &contiguous[..]);
    }
    // The 5000-byte payload of the first append sample is a chunk of its own, not a copy.
    let Body::AppendRequest(append) = samples().swap_remove(4) else {
        panic!("sample 4 is an append")
    };
    let big = &append.events[1].payload;
    let enc = encode_body(&append.clone().into(), &mut scratch).expect("encodes");
    assert!(enc
        .chunks()
        .iter()
        .any(|c| c.as_ptr() == big.head().as_ptr() && c.len() == big.len()));
    // One body, many destinations: only the header differs, and each decodes.
    for id in [7u64, 8, 9] {
        let mut out = BytesMut::new();
        enc.write_frame(crate::LogId::ZERO, RequestId(id), Flags::NONE, &mut out);
        let f = decode(&mut out).expect("ok").expect("whole");
        assert_eq!(f, Frame::new(RequestId(id), append.clone()));
    }
}

/// A master's message event is a header chained to the producer's bytes: the append that
/// carries it shares those bytes (a chunk of its own, not a copy), its bytes are the same
/// as a contiguous body's, and it decodes to the same event with the message as a slice of
/// the produce's buffer.
#[test]
fn a_chained_message_event_goes_out_without_a_copy() {
    let message = Bytes::from(vec![9u8; 8192]);
    let mut header = BytesMut::new();
    encode_message_header("orders", 4, 17, message.len(), &mut header).expect("encodes");
    let chained = Payload::chained(header.freeze(), message.clone());
    let mut contiguous = BytesMut::new();
    encode_message_event("orders", 4, 17, &message, &mut contiguous).expect("encodes");
    assert_eq!(chained, Payload::from(contiguous.clone()));

    let Ok(EventBody::Message(m)) = EventBody::decode(EventKind::Message, &chained) else {
        panic!("a message event");
    };
    assert_eq!(
        (m.topic.as_str(), m.producer_id, m.sequence),
        ("orders", 4, 17)
    );
    assert_eq!(
        m.message.as_ptr(),
        message.as_ptr(),
        "the message is shared"
    );
    let body = EventBody::Message(m);
    assert_eq!(body.to_payload().expect("encodes"), chained);

    let event = |payload: Payload| Event {
        epoch: Epoch(3),
        offset: Offset(0),
        kind: EventKind::Message,
        payload,
    };
    let append = |payload| AppendRequest {
        epoch: Epoch(3),
        prev: None,
        events: vec![event(payload)],
        hwm: None,
    };
    let mut scratch = BytesMut::new();
    let enc = encode_body(&append(chained.clone()).into(), &mut scratch).expect("encodes");
    assert!(enc
        .chunks()
        .iter()
        .any(|c| c.as_ptr() == message.as_ptr() && c.len() == message.len()));
    let mut out = BytesMut::new();
    enc.write_frame(crate::LogId::ZERO, RequestId(1), Flags::NONE, &mut out);
    assert_eq!(
        out,
        encoded(&Frame::new(
            RequestId(1),
            append(contiguous.freeze().into())
        ))
    );
    let f = decode(&mut out).expect("ok").expect("whole");
    assert_eq!(f, Frame::new(RequestId(1), append(chained)));
}

/// The vectored write decides on a chained payload's whole length: a message of exactly
/// the inline bound goes out shared (its event is larger than the bound, as the contiguous
/// event it replaces was), with its header copied into the field run; a small event is
/// copied whole.
#[test]
fn a_chained_payload_is_copied_or_shared_by_its_whole_length() {
    let chunks_of = |message_bytes: usize| {
        let message = Bytes::from(vec![3u8; message_bytes]);
        let mut header = BytesMut::new();
        encode_message_header("t", 1, 2, message.len(), &mut header).expect("encodes");
        let header = header.freeze();
        let append = AppendRequest {
            epoch: Epoch(1),
            prev: None,
            events: vec![Event {
                epoch: Epoch(1),
                offset: Offset(0),
                kind: EventKind::Message,
                payload: Payload::chained(header.clone(), message.clone()),
            }],
            hwm: None,
        };
        let mut scratch = BytesMut::new();
        let enc = encode_body(&append.into(), &mut scratch).expect("encodes");
        let shared = |b: &Bytes| enc.chunks().iter().any(|c| c.as_ptr() == b.as_ptr());
        (shared(&header), shared(&message))
    };
    assert_eq!(chunks_of(INLINE_PAYLOAD_BYTES_MAX), (false, true));
    assert_eq!(chunks_of(INLINE_PAYLOAD_BYTES_MAX - 100), (false, false));
}

#[test]
fn largest_event_and_message_fit_in_their_frames() {
    let payload = Bytes::from(vec![7u8; EVENT_PAYLOAD_BYTES_MAX]);
    let ev = Event {
        epoch: Epoch(u64::MAX),
        offset: Offset(11),
        kind: EventKind::Message,
        payload: payload.into(),
    };
    let append = AppendRequest {
        epoch: Epoch(u64::MAX),
        prev: Some(pos(u64::MAX, 10)),
        events: vec![ev.clone()],
        hwm: Some(Offset(10)),
    };
    let read = ReadResponse {
        first_offset: Offset(0),
        last: Some(pos(1, 11)),
        events: vec![ev],
    };
    let topic = "t".repeat(TOPIC_BYTES_MAX);
    let message = Bytes::from(vec![1u8; MESSAGE_BYTES_MAX]);
    let produce = ProduceRequest {
        format: crate::MessageFormat::Raw,
        topic: topic.clone(),
        producer_id: 1,
        sequence: 1,
        messages: vec![message.clone()],
    };
    let fetch = FetchResponse {
        formats: Vec::new(),
        hwm: Some(Offset(1)),
        next_offset: Offset(2),
        messages: vec![(Offset(1), message.clone())],
    };
    for body in [
        Body::from(append),
        read.into(),
        produce.into(),
        fetch.into(),
    ] {
        let frame_bytes = HEADER_BYTES + body.encoded_bytes().expect("counts");
        assert!(
            frame_bytes <= FRAME_BYTES_MAX,
            "{:?} takes {frame_bytes}",
            body.frame_type()
        );
    }
    let mut out = BytesMut::new();
    encode_message_event(&topic, 1, 1, &message, &mut out).expect("fits");
    assert!(out.len() <= EVENT_PAYLOAD_BYTES_MAX);
    assert_eq!(out.len(), message_event_bytes(topic.len(), message.len()));
}

#[test]
fn through_offset_is_prev_plus_event_count() {
    let Body::AppendRequest(a) = samples().swap_remove(4) else {
        panic!("sample 4 is an append")
    };
    assert_eq!(a.first_offset(), Some(Offset(42)));
    assert_eq!(a.through_offset(), Some(Offset(44)));
    let from_zero = AppendRequest {
        epoch: Epoch(1),
        prev: None,
        events: vec![
            event(1, 0, EventKind::EpochStart, b""),
            event(1, 1, EventKind::Message, b""),
        ],
        hwm: None,
    };
    assert_eq!(from_zero.through_offset(), Some(Offset(1)));
    let empty = AppendRequest {
        epoch: Epoch(1),
        prev: None,
        events: vec![],
        hwm: None,
    };
    assert_eq!(empty.through_offset(), None);
    let heartbeat_like = AppendRequest {
        epoch: Epoch(1),
        prev: Some(pos(1, 5)),
        events: vec![],
        hwm: None,
    };
    assert_eq!(heartbeat_like.through_offset(), Some(Offset(5)));
}

#[test]
fn error_response_constructors() {
    let long = "é".repeat(ERROR_MESSAGE_BYTES_MAX);
    let e = ErrorResponse::new(ErrorCode::Internal, long);
    assert!(e.message.len() <= ERROR_MESSAGE_BYTES_MAX);
    assert!(e.message.len() >= ERROR_MESSAGE_BYTES_MAX - 1);
    let frame = Frame::new(RequestId::CONNECTION, e);
    assert_eq!(decode(&mut encoded(&frame)), Ok(Some(frame)));

    let err = bad_frame_cause(decode_one(&raw_frame(0x7777, 0, 1, b"")));
    let r = ErrorResponse::from_wire_error(&err);
    assert_eq!(r.code, ErrorCode::UnknownFrameType);
    assert!(r.message.contains("0x7777"), "{}", r.message);
    assert_eq!(
        ErrorResponse::not_voter(StoreId(1), Incarnation(2)).code,
        ErrorCode::NotVoter
    );
}

#[test]
fn event_bodies_round_trip() {
    let bodies = vec![
        EventBody::Message(MessageEvent {
            format: crate::MessageFormat::Raw,
            topic: "orders".into(),
            producer_id: 3,
            sequence: 99,
            message: Bytes::from_static(b"payload"),
        }),
        EventBody::CursorCommit(CursorCommitEvent {
            topic: "orders".into(),
            cursor: "billing".into(),
            offset: Offset(12),
        }),
        EventBody::TopicAdmin(TopicAdminEvent {
            action: TopicAction::Create,
            topic: "orders".into(),
        }),
        EventBody::TopicAdmin(TopicAdminEvent {
            action: TopicAction::Delete,
            topic: "old".into(),
        }),
        EventBody::EpochStart(EpochStartEvent {
            epoch: Epoch(0x2_0001),
            broker: BrokerId(1),
            voters: vec![],
        }),
        EventBody::EpochStart(EpochStartEvent {
            epoch: Epoch(0x2_0001),
            broker: BrokerId(1),
            voters: vec![
                Voter {
                    store_index: 0,
                    store_id: StoreId(7),
                    incarnation: Incarnation(8),
                },
                Voter {
                    store_index: 2,
                    store_id: StoreId(9),
                    incarnation: Incarnation(10),
                },
            ],
        }),
        EventBody::Config(ConfigEvent {
            voters: vec![Voter {
                store_index: 3,
                store_id: StoreId(11),
                incarnation: Incarnation(12),
            }],
        }),
        EventBody::Trim(TrimEvent::plain(Offset(1000))),
        EventBody::Trim(TrimEvent {
            before: Offset(1000),
            checkpoint: Some(Box::new(BrokerSnapshot {
                trim_point: Offset(900),
                epoch: Epoch(0x2_0001),
                master: Some(BrokerId(1)),
                voters: vec![Voter {
                    store_index: 0,
                    store_id: StoreId(7),
                    incarnation: Incarnation(8),
                }],
                topics: vec!["orders".into(), "empty".into()],
                cursors: vec![SnapshotCursor {
                    topic: "orders".into(),
                    cursor: "billing".into(),
                    offset: Offset(950),
                }],
                producers: vec![SnapshotProducer {
                    producer_id: 42,
                    last_sequence: 9,
                    last_offset: Offset(999),
                    runs: vec![SnapshotRun {
                        topic: "orders".into(),
                        first_sequence: 5,
                        first_offset: Offset(995),
                        count: 5,
                    }],
                }],
                users: vec![],
                acls: vec![],
            })),
            part: None,
        }),
        EventBody::Trim(TrimEvent {
            before: Offset(0),
            checkpoint: Some(Box::default()),
            part: None,
        }),
        EventBody::Trim(TrimEvent {
            before: Offset(77),
            checkpoint: None,
            part: Some(CheckpointPart {
                index: 1,
                count: 3,
                snapshot_bytes: 40,
                bytes: Bytes::from_static(b"a slice of a snapshot"),
            }),
        }),
    ];
    for body in bodies {
        let payload = body.to_payload().expect("encodes");
        assert_eq!(payload.len(), body.encoded_bytes().expect("counts"));
        assert_eq!(EventBody::decode(body.kind(), &payload), Ok(body.clone()));
        // Every strict prefix is a typed error, never a panic.
        for n in 0..payload.len() {
            assert!(EventBody::decode(body.kind(), &payload.to_bytes().slice(..n).into()).is_err());
        }
    }
    // Users and ACLs: their events, and a snapshot that holds them (its users and ACL
    // section is optional, so the one prefix that ends right before it decodes, as a
    // snapshot without them; WAL records are checksummed whole, so no prefix is ever read).
    let credential = crate::ScramCredential {
        salt: Bytes::from_static(b"0123456789abcdef"),
        iterations: 4096,
        stored_key: [7; 32],
        server_key: [9; 32],
    };
    let entry = crate::AclEntry {
        principal: "alice".into(),
        operation: crate::AclOperation::Produce,
        topic: "orders.*".into(),
    };
    let secured = vec![
        EventBody::UserAdmin(crate::UserAdminEvent {
            user: "alice".into(),
            credential: Some(credential.clone()),
        }),
        EventBody::UserAdmin(crate::UserAdminEvent {
            user: "a,b=c".into(),
            credential: None,
        }),
        EventBody::AclAdmin(crate::AclAdminEvent {
            action: crate::AclAction::Remove,
            entry: entry.clone(),
        }),
        EventBody::Trim(TrimEvent {
            before: Offset(5),
            checkpoint: Some(Box::new(BrokerSnapshot {
                users: vec![("alice".into(), credential)],
                acls: vec![entry],
                ..BrokerSnapshot::default()
            })),
            part: None,
        }),
    ];
    for body in secured {
        let payload = body.to_payload().expect("encodes");
        assert_eq!(payload.len(), body.encoded_bytes().expect("counts"));
        assert_eq!(EventBody::decode(body.kind(), &payload), Ok(body.clone()));
        for n in 0..payload.len() {
            let prefix = EventBody::decode(body.kind(), &payload.to_bytes().slice(..n).into());
            assert_ne!(prefix, Ok(body.clone()));
        }
    }
    // The hot-path encoder writes the same bytes as the struct, and decoding shares them.
    let mut out = BytesMut::new();
    encode_message_event("orders", 3, 99, b"payload", &mut out).expect("encodes");
    let payload = out.freeze();
    let Ok(EventBody::Message(m)) = EventBody::decode(EventKind::Message, &payload.clone().into())
    else {
        panic!("a message event");
    };
    assert_eq!(m.message, Bytes::from_static(b"payload"));
    assert_eq!(m.message.as_ptr(), payload[payload.len() - 7..].as_ptr());
}

#[test]
fn event_body_errors_are_typed() {
    let trim = EventBody::Trim(TrimEvent::plain(Offset(1)))
        .to_payload()
        .expect("encodes");
    let mut v2 = trim.to_bytes().to_vec();
    v2[0] = 2;
    assert_eq!(
        EventBody::decode(EventKind::Trim, &Payload::from(v2)),
        Err(WireError::UnsupportedEventBodyVersion {
            version: 2,
            supported: EVENT_BODY_VERSION
        })
    );
    let mut tag = trim.to_bytes().to_vec();
    *tag.last_mut().expect("non-empty") = 7;
    assert_eq!(
        EventBody::decode(EventKind::Trim, &Payload::from(tag)),
        Err(WireError::InvalidTag {
            field: "trim checkpoint tag",
            byte: 7
        })
    );
    let mut extra = trim.to_bytes().to_vec();
    extra.push(0);
    assert_eq!(
        EventBody::decode(EventKind::Trim, &Payload::from(extra)),
        Err(WireError::TrailingBytes { count: 1 })
    );
    assert_eq!(
        EventBody::decode(
            EventKind::TopicAdmin,
            &Payload::from(&[1, 9, 1, 0, b'x'][..])
        ),
        Err(WireError::InvalidTag {
            field: "topic action",
            byte: 9
        })
    );
    let mut out = BytesMut::from(&b"keep"[..]);
    assert_eq!(
        encode_message_event("", 0, 0, b"m", &mut out),
        Err(WireError::EmptyName { field: "topic" })
    );
    assert_eq!(&out[..], b"keep");
}

#[test]
fn crc_is_castagnoli() {
    // The standard check value of CRC-32C (iSCSI): a CRC32 (IEEE) here would be 0xCBF43926.
    assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
}

/// Pins the bytes docs/protocol.md draws: a change to the layout fails here first.
#[test]
fn golden_bytes_match_the_protocol_document() {
    let frame = Frame::on_log(
        crate::LogId(0x0d0c_0b0a),
        RequestId(0x0102_0304_0506_0708),
        FenceRequest {
            epoch: Epoch(0x1122_3344_5566_7788),
            expected: Some((StoreId(0x0a0b), Incarnation(0x0c0d))),
        },
    );
    let bytes = encoded(&frame);
    assert_eq!(
        &bytes[..24],
        &[
            57, 0, 0, 0, // length: 32 + 8 + 17
            0x04, 0x01, // frame type 0x0104
            2,    // version
            0,    // flags
            8, 7, 6, 5, 4, 3, 2, 1, // request id
            0x0a, 0x0b, 0x0c, 0x0d, // log
            0, 0, 0, 0, // reserved
        ]
    );
    assert_eq!(
        &bytes[24..28],
        &crc32c::crc32c(&bytes[HEADER_BYTES..]).to_le_bytes()
    );
    assert_eq!(&bytes[28..32], &crc32c::crc32c(&bytes[..28]).to_le_bytes());
    #[rustfmt::skip]
    let body: &[u8] = &[
        0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, // epoch
        1,                                              // expected: some
        0x0b, 0x0a, 0, 0, 0, 0, 0, 0,                   //   store_id
        0x0d, 0x0c, 0, 0, 0, 0, 0, 0,                   //   incarnation
    ];
    assert_eq!(&bytes[32..], body);
    let unbound = encoded(&Frame::new(
        RequestId(1),
        FenceRequest {
            epoch: Epoch(1),
            expected: None,
        },
    ));
    assert_eq!(&unbound[32..], &[1, 0, 0, 0, 0, 0, 0, 0, 0]);

    // ErrorResponse with the Trimmed detail (code 208, detail tag 3).
    let trimmed = ErrorResponse {
        message: "t".to_owned(),
        ..ErrorResponse::trimmed(Offset(1), Offset(0x0201))
    };
    let bytes = encoded(&Frame::new(RequestId(1), trimmed));
    #[rustfmt::skip]
    let body: &[u8] = &[
        208, 0,                     // code: Trimmed
        1, 0, b't',                 // message
        3,                          // detail: Trimmed
        0x01, 0x02, 0, 0, 0, 0, 0, 0, // first_offset
    ];
    assert_eq!(&bytes[32..], body);

    let append = AppendRequest {
        epoch: Epoch(5),
        prev: Some(pos(4, 9)),
        events: vec![event(4, 10, EventKind::Message, b"ab")],
        hwm: None,
    };
    let bytes = encoded(&Frame::new(RequestId(1), append));
    #[rustfmt::skip]
    let body: &[u8] = &[
        5, 0, 0, 0, 0, 0, 0, 0,     // epoch
        1,                          // prev: some
        4, 0, 0, 0, 0, 0, 0, 0,     //   prev.epoch
        9, 0, 0, 0, 0, 0, 0, 0,     //   prev.offset
        0,                          // hwm: none
        1, 0, 0, 0,                 // event count
        4, 0, 0, 0, 0, 0, 0, 0,     //   event epoch (offset 10 implied)
        1,                          //   kind: Message
        2, 0, 0, 0,                 //   payload length
        b'a', b'b',                 //   payload
    ];
    assert_eq!(&bytes[32..], body);
    assert_eq!(&bytes[4..6], &[0x01, 0x01]);

    let err = ErrorResponse::not_voter(StoreId(3), Incarnation(9));
    let bytes = encoded(&Frame::new(RequestId(2), err.clone()));
    let message_len = err.message.len();
    assert_eq!(&bytes[32..34], &[100, 0]); // code NotVoter
    assert_eq!(&bytes[34..36], &(message_len as u16).to_le_bytes());
    let detail = &bytes[36 + message_len..];
    assert_eq!(detail, &[1, 3, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0]);

    let start = EventBody::EpochStart(EpochStartEvent {
        epoch: Epoch(0x0203),
        broker: BrokerId(1),
        voters: vec![Voter {
            store_index: 2,
            store_id: StoreId(5),
            incarnation: Incarnation(6),
        }],
    })
    .to_payload()
    .expect("encodes");
    #[rustfmt::skip]
    let expected: &[u8] = &[
        1,                          // body version
        3, 2, 0, 0, 0, 0, 0, 0,     // epoch
        1, 0,                       // broker
        1, 0, 0, 0,                 // voter count
        2, 0,                       //   store_index
        5, 0, 0, 0, 0, 0, 0, 0,     //   store_id
        6, 0, 0, 0, 0, 0, 0, 0,     //   incarnation
    ];
    assert_eq!(&start.to_bytes()[..], expected);

    let handoff = encoded(&Frame::new(
        RequestId(3),
        HandoffRequest { to: BrokerId(2) },
    ));
    assert_eq!(&handoff[4..6], &[0x0B, 0x03]);
    assert_eq!(&handoff[32..], &[2, 0]);
    let done = encoded(&Frame::new(
        RequestId(3),
        HandoffResponse {
            epoch: Epoch(0x0402),
            master: BrokerId(2),
            pause_us: 0x0103,
        },
    ));
    assert_eq!(&done[4..6], &[0x0C, 0x03]);
    #[rustfmt::skip]
    let expected: &[u8] = &[
        2, 4, 0, 0, 0, 0, 0, 0,     // epoch
        2, 0,                       // master
        3, 1, 0, 0, 0, 0, 0, 0,     // pause_us
    ];
    assert_eq!(&done[32..], expected);
    let now = encoded(&Frame::new(
        RequestId(4),
        TakeOverNowRequest {
            from_epoch: Epoch(0x0301),
            hwm: Some(Offset(7)),
        },
    ));
    assert_eq!(&now[4..6], &[0x03, 0x02]);
    assert_eq!(
        &now[32..],
        &[1, 3, 0, 0, 0, 0, 0, 0, 1, 7, 0, 0, 0, 0, 0, 0, 0]
    );
    let took = encoded(&Frame::new(
        RequestId(4),
        TakeOverNowResponse {
            broker: BrokerId(2),
        },
    ));
    assert_eq!(&took[4..6], &[0x04, 0x02]);
    assert_eq!(&took[32..], &[2, 0]);
}

/// The range digest frames (docs/protocol.md, "Range digest"): golden bytes, and the
/// bounds the decoder enforces on a request's range.
#[test]
fn range_digest_frames_match_the_protocol_document() {
    let req = encoded(&Frame::new(
        RequestId(5),
        RangeDigestRequest {
            from: Offset(0x0102),
            to: Offset(0x0203),
        },
    ));
    assert_eq!(&req[4..6], &[0x0B, 0x01]);
    #[rustfmt::skip]
    let body: &[u8] = &[
        0x02, 0x01, 0, 0, 0, 0, 0, 0, // from
        0x03, 0x02, 0, 0, 0, 0, 0, 0, // to
    ];
    assert_eq!(&req[32..], body);
    let resp = encoded(&Frame::new(
        RequestId(5),
        RangeDigestResponse {
            first_offset: Offset(1),
            last: Some(pos(2, 9)),
            start: Offset(3),
            count: 4,
            digest: 0x0a0b_0c0d,
            last_entry: Some(EntryId {
                epoch: Epoch(2),
                offset: Offset(6),
                crc: 0x0102_0304,
            }),
        },
    ));
    assert_eq!(&resp[4..6], &[0x0C, 0x01]);
    #[rustfmt::skip]
    let body: &[u8] = &[
        1, 0, 0, 0, 0, 0, 0, 0,     // first_offset
        1,                          // last: some
        2, 0, 0, 0, 0, 0, 0, 0,     //   epoch
        9, 0, 0, 0, 0, 0, 0, 0,     //   offset
        3, 0, 0, 0, 0, 0, 0, 0,     // start
        4, 0, 0, 0, 0, 0, 0, 0,     // count
        0x0d, 0x0c, 0x0b, 0x0a,     // digest
        1,                          // last_entry: some
        2, 0, 0, 0, 0, 0, 0, 0,     //   epoch
        6, 0, 0, 0, 0, 0, 0, 0,     //   offset
        4, 3, 2, 1,                 //   crc
    ];
    assert_eq!(&resp[32..], body);

    // The encoder refuses an empty or too long range; so does the decoder, with the
    // stream still in sync (answered `Malformed`).
    let mut out = BytesMut::new();
    for (from, to) in [(5, 4), (0, RANGE_DIGEST_OFFSETS_MAX)] {
        let bad = Frame::new(
            RequestId(1),
            RangeDigestRequest {
                from: Offset(from),
                to: Offset(to),
            },
        );
        assert!(matches!(
            encode(&bad, &mut out),
            Err(WireError::InvalidRange { .. })
        ));
        let mut body = Vec::new();
        body.extend_from_slice(&from.to_le_bytes());
        body.extend_from_slice(&to.to_le_bytes());
        let raw = raw_frame(FrameType::RangeDigestRequest.as_u16(), 0, 9, &body);
        let cause = bad_frame_cause(decode_one(&raw));
        assert!(matches!(cause, WireError::InvalidRange { .. }), "{cause:?}");
        assert_eq!(cause.error_code(), ErrorCode::Malformed);
    }
    let max = RangeDigestRequest {
        from: Offset(u64::MAX - RANGE_DIGEST_OFFSETS_MAX + 1),
        to: Offset(u64::MAX),
    };
    assert_eq!(max.span(), Some(RANGE_DIGEST_OFFSETS_MAX));
    let all = RangeDigestRequest {
        from: Offset(0),
        to: Offset(u64::MAX),
    };
    assert_eq!(all.span(), None, "no overflow");
}

/// A part's Trim payload.
fn payload_of(part: &CheckpointPart) -> Payload {
    EventBody::Trim(TrimEvent {
        before: Offset(5),
        checkpoint: None,
        part: Some(part.clone()),
    })
    .to_payload()
    .expect("encodes")
}

/// A snapshot cut into parts and put back together is the snapshot; bad parts are typed
/// errors.
#[test]
fn a_checkpoint_split_into_parts_reassembles() {
    let snapshot = BrokerSnapshot {
        topics: (0..50).map(|i| format!("topic-{i}")).collect(),
        cursors: (0..50)
            .map(|i| SnapshotCursor {
                topic: format!("topic-{i}"),
                cursor: "c".into(),
                offset: Offset(i),
            })
            .collect(),
        ..BrokerSnapshot::default()
    };
    let bytes = snapshot.to_bytes().expect("encodes");
    let parts = CheckpointPart::split(&bytes, 100).expect("splits");
    assert_eq!(parts.len(), bytes.len().div_ceil(100));
    assert!(parts.last().is_some_and(CheckpointPart::is_last));
    let mut whole = BytesMut::new();
    for (i, part) in parts.iter().enumerate() {
        assert_eq!(part.index as usize, i);
        // Each part survives its own event's encoding.
        let body = EventBody::Trim(TrimEvent {
            before: Offset(5),
            checkpoint: None,
            part: Some(part.clone()),
        });
        let payload = body.to_payload().expect("encodes");
        assert_eq!(EventBody::decode(EventKind::Trim, &payload), Ok(body));
        whole.extend_from_slice(&part.bytes);
        assert_eq!(trim_part_index(&payload_of(part)), Some(part.index));
    }
    assert_eq!(
        trim_part_index(
            &EventBody::Trim(TrimEvent::plain(Offset(5)))
                .to_payload()
                .expect("encodes")
        ),
        None
    );
    assert_eq!(BrokerSnapshot::from_bytes(&whole.freeze()), Ok(snapshot));
    // One part, or more than CHECKPOINT_PARTS_MAX, is refused.
    assert!(CheckpointPart::split(&bytes, bytes.len()).is_err());
    let many = Bytes::from(vec![0u8; CHECKPOINT_PARTS_MAX as usize + 1]);
    assert!(CheckpointPart::split(&many, 1).is_err());
    // A part whose index is not below its count does not decode.
    let bad = EventBody::Trim(TrimEvent {
        before: Offset(5),
        checkpoint: None,
        part: Some(CheckpointPart {
            index: 2,
            count: 2,
            snapshot_bytes: 10,
            bytes: Bytes::from_static(b"x"),
        }),
    })
    .to_payload()
    .expect("encodes");
    assert!(EventBody::decode(EventKind::Trim, &bad).is_err());
    // A truncated snapshot is an error, not a smaller state.
    assert!(BrokerSnapshot::from_bytes(&bytes.slice(..bytes.len() - 1)).is_err());
}

/// A Kafka record's message event is written as body version 2 with its format byte, and
/// decodes back, whole or split at its header; a native message stays version 1.
#[test]
fn message_events_carry_their_format() {
    for format in [MessageFormat::Raw, MessageFormat::Kafka] {
        let event = EventBody::Message(MessageEvent {
            topic: "t".into(),
            producer_id: 7,
            sequence: 9,
            format,
            message: Bytes::from_static(b"bytes"),
        });
        let payload = event.to_payload().unwrap();
        assert_eq!(payload.head()[0], message_body_version(format));
        assert_eq!(
            EventBody::decode(EventKind::Message, &payload).unwrap(),
            event
        );
        let flat: Payload = payload.to_bytes().into();
        assert_eq!(EventBody::decode(EventKind::Message, &flat).unwrap(), event);
        assert_eq!(event.encoded_bytes().unwrap(), payload.len());
    }
    // Version 2 is a message's only: another kind at version 2 is refused.
    let mut cursor = BytesMut::new();
    EventBody::CursorCommit(CursorCommitEvent {
        topic: "t".into(),
        cursor: "c".into(),
        offset: Offset(1),
    })
    .encode(&mut cursor)
    .unwrap();
    cursor[0] = 2;
    assert!(EventBody::decode(EventKind::CursorCommit, &cursor.freeze().into()).is_err());
    // An unknown format byte is refused.
    let mut bad = BytesMut::new();
    encode_message_header_as(MessageFormat::Kafka, "t", 0, 0, 1, &mut bad).unwrap();
    let at = bad.len() - 5;
    bad[at] = 9;
    bad.extend_from_slice(b"x");
    assert!(EventBody::decode(EventKind::Message, &bad.freeze().into()).is_err());
}
