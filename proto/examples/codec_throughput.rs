//! Measures the codec's throughput on one core: encode (contiguous and vectored) and
//! decode of append frames, next to the two physical limits of this work — a memcpy and a
//! CRC32C pass over the same bytes.
//!
//! Run: `cargo run --release -p quire-proto --example codec_throughput`.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quire_proto::{
    decode, encode, encode_body, AppendRequest, Body, Epoch, Event, EventKind, Frame, LogPosition,
    Offset, RequestId,
};

const RUN: Duration = Duration::from_millis(700);

/// Runs `f` repeatedly for about `RUN`; returns bytes per second given `bytes` per call.
fn rate(bytes: usize, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < RUN {
        for _ in 0..16 {
            f();
        }
        calls += 16;
    }
    (bytes as f64 * calls as f64) / start.elapsed().as_secs_f64()
}

fn append(events: usize, payload_bytes: usize) -> AppendRequest {
    let payload = Bytes::from(vec![0x5a; payload_bytes]);
    AppendRequest {
        epoch: Epoch(0x1_0001),
        prev: Some(LogPosition {
            epoch: Epoch(0x1_0001),
            offset: Offset(999),
        }),
        events: (0..events)
            .map(|i| Event {
                epoch: Epoch(0x1_0001),
                offset: Offset(1000 + i as u64),
                kind: EventKind::Message,
                payload: payload.clone().into(),
            })
            .collect(),
        hwm: Some(Offset(998)),
    }
}

fn main() {
    let gb = |r: f64| r / 1e9;
    let block = vec![0x5au8; 1 << 20];
    let mut dst = vec![0u8; 1 << 20];
    let memcpy = rate(block.len(), || {
        dst.copy_from_slice(black_box(&block));
        black_box(&dst);
    });
    let crc = rate(block.len(), || {
        black_box(crc32c::crc32c(black_box(&block)));
    });
    println!(
        "baseline  memcpy {:6.2} GB/s   crc32c {:6.2} GB/s",
        gb(memcpy),
        gb(crc)
    );

    for (events, payload_bytes) in [(1000usize, 100usize), (64, 16 * 1024)] {
        let body: Body = append(events, payload_bytes).into();
        let frame = Frame::new(RequestId(1), body.clone());
        let mut wire = BytesMut::new();
        let frame_bytes = encode(&frame, &mut wire).expect("encodes");
        let wire = wire.freeze();

        let mut out = BytesMut::with_capacity(frame_bytes);
        let enc = rate(frame_bytes, || {
            out.clear();
            encode(black_box(&frame), &mut out).expect("encodes");
            black_box(&out);
        });
        let mut scratch = BytesMut::with_capacity(frame_bytes);
        let vec_enc = rate(frame_bytes, || {
            let e = encode_body(black_box(&body), &mut scratch).expect("encodes");
            black_box(e.header(
                quire_proto::LogId::ZERO,
                RequestId(2),
                quire_proto::Flags::NONE,
            ));
            black_box(&e);
        });
        let mut chunks = 0;
        if let Ok(e) = encode_body(&body, &mut scratch) {
            chunks = e.chunks().len();
        }
        // Decode from a read buffer; the timing includes copying the frame into it, as a
        // socket read would.
        let mut buf = BytesMut::with_capacity(frame_bytes);
        let dec = rate(frame_bytes, || {
            buf.clear();
            buf.extend_from_slice(&wire);
            let f = decode(&mut buf).expect("decodes").expect("whole");
            black_box(f);
        });
        println!(
            "append {events:5} x {payload_bytes:5} B ({:.2} MB frame): encode {:5.2} GB/s  \
             encode_body {:5.2} GB/s ({chunks} chunks)  decode {:5.2} GB/s  \
             = {:.1} M events/s decoded",
            frame_bytes as f64 / 1e6,
            gb(enc),
            gb(vec_enc),
            gb(dec),
            dec / frame_bytes as f64 * events as f64 / 1e6,
        );
    }
}
