//! Writes valid frames, encoded by the real encoder, as seed inputs for the fuzz targets:
//! random mutations rarely pass the CRC32C checks, so the fuzzer starts from sound frames.
//!
//! Run: `cd fuzz && cargo run --example make_seeds` (writes `corpus/decode_frame/` and
//! `corpus/decode_body/`, both ignored by git).

use std::fs;

use bytes::{Bytes, BytesMut};
use quire_proto::*;

fn main() -> std::io::Result<()> {
    let message = EventBody::Message(MessageEvent { format: quire_proto::MessageFormat::Raw,
        topic: "orders".into(),
        producer_id: 7,
        sequence: 1,
        message: Bytes::from_static(b"hello"),
    });
    let commit = EventBody::CursorCommit(CursorCommitEvent {
        topic: "orders".into(),
        cursor: "billing".into(),
        offset: Offset(3),
    });
    let start = EventBody::EpochStart(EpochStartEvent {
        epoch: Epoch(0x1_0001),
        broker: BrokerId(1),
        voters: Vec::new(),
    });
    let event = |offset: u64, body: &EventBody| Event {
        epoch: Epoch(0x1_0001),
        offset: Offset(offset),
        kind: body.kind(),
        payload: body.to_payload().expect("seed event encodes"),
    };
    let events = vec![event(0, &start), event(1, &message), event(2, &commit)];
    let last = Some(LogPosition {
        epoch: Epoch(0x1_0001),
        offset: Offset(2),
    });
    let bodies: Vec<Body> = vec![
        AppendRequest {
            epoch: Epoch(0x1_0001),
            prev: None,
            events: events.clone(),
            hwm: Some(Offset(0)),
        }
        .into(),
        ReadResponse {
            first_offset: Offset(0),
            last,
            events,
        }
        .into(),
        PersistedAck {
            epoch: Epoch(0x1_0001),
            through_offset: Some(Offset(2)),
            store_id: StoreId(1),
            incarnation: Incarnation(1),
            voter: true,
            corrupt: None,
        }
        .into(),
        AppendRejected {
            reason: RejectReason::LogMismatch,
            promised: Epoch(2),
            last,
        }
        .into(),
        FenceGranted {
            epoch: Epoch(3),
            last,
            store_id: StoreId(1),
            incarnation: Incarnation(1),
            tail_cut: None,
        }
        .into(),
        FenceGranted {
            epoch: Epoch(3),
            last,
            store_id: StoreId(1),
            incarnation: Incarnation(1),
            tail_cut: Some(TailCut {
                offset: Offset(2),
                promised: Epoch(2),
            }),
        }
        .into(),
        TailResponse {
            last,
            promised: Epoch(3),
            hwm: Some(Offset(1)),
            store_id: StoreId(2),
            incarnation: Incarnation(1),
            voter: false,
            first_offset: Offset(0),
        }
        .into(),
        ErrorResponse::not_master(
            Epoch(3),
            Some(BrokerInfo {
                id: BrokerId(2),
                addr: "b2:7000".into(),
            }),
        )
        .into(),
        ErrorResponse::not_voter(StoreId(4), Incarnation(2)).into(),
        ProduceRequest { format: quire_proto::MessageFormat::Raw,
            topic: "orders".into(),
            producer_id: 7,
            sequence: 1,
            messages: vec![Bytes::from_static(b"a"), Bytes::from_static(b"bc")],
        }
        .into(),
        FetchResponse { formats: Vec::new(),
            hwm: Some(Offset(2)),
            next_offset: Offset(3),
            messages: vec![(Offset(1), Bytes::from_static(b"hello"))],
        }
        .into(),
        CommitCursorRequest {
            topic: "orders".into(),
            cursor: "billing".into(),
            offset: Offset(3),
        }
        .into(),
        MetadataResponse { topics: Vec::new(),
            epoch: Epoch(3),
            hwm: Some(Offset(2)),
            master: Some(BrokerInfo {
                id: BrokerId(1),
                addr: "b1:7000".into(),
            }),
            brokers: vec![BrokerInfo {
                id: BrokerId(1),
                addr: "b1:7000".into(),
            }],
            stores: vec![StoreInfo {
                store_id: StoreId(1),
                incarnation: Incarnation(1),
                addr: "s1:7100".into(),
                voter: true,
                persisted: Some(Offset(2)),
                connected: true,
            }],
            applied: Some(Offset(2)),
        }
        .into(),
        Heartbeat {
            epoch: Epoch(3),
            hwm: Some(Offset(2)),
            master: BrokerId(1),
        }
        .into(),
        TailRequest.into(),
    ];
    fs::create_dir_all("corpus/decode_frame")?;
    fs::create_dir_all("corpus/decode_body")?;
    let mut all = BytesMut::new();
    for (i, body) in bodies.iter().enumerate() {
        let mut buf = BytesMut::new();
        encode(&Frame::new(RequestId(i as u64 + 1), body.clone()), &mut buf).expect("seed encodes");
        all.extend_from_slice(&buf);
        fs::write(format!("corpus/decode_frame/seed-{i:02}"), &buf)?;
        // decode_body: selector byte (index in FrameType::ALL) then the body.
        let selector = FrameType::ALL
            .iter()
            .position(|t| *t == body.frame_type())
            .expect("listed") as u8;
        let mut input = vec![selector];
        input.extend_from_slice(&buf[HEADER_BYTES..]);
        fs::write(format!("corpus/decode_body/seed-{i:02}"), input)?;
    }
    fs::write("corpus/decode_frame/seed-stream", &all)?;
    println!("wrote {} seeds per target", bodies.len());
    Ok(())
}
