//! Fuzzes the frame decoder: any bytes, read as a connection would read them, give frames,
//! "need more bytes" or a typed `WireError` — never a panic, never an allocation beyond
//! `FRAME_BYTES_MAX`. Every frame that decodes must re-encode and decode to itself, and
//! the event bodies inside it must decode without panicking.
//!
//! Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run decode_frame -- -max_total_time=60`.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use quire_proto::{decode, decode_slice, encode, Body, EventBody, Frame};

fuzz_target!(|data: &[u8]| {
    // The stream decoder, fed in two pieces to exercise "need more bytes".
    let split = data.first().map_or(0, |&b| usize::from(b)).min(data.len());
    let mut buf = BytesMut::from(&data[..split]);
    let mut frames = Vec::new();
    let mut rest = &data[split..];
    loop {
        match decode(&mut buf) {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) if rest.is_empty() => break,
            Ok(None) => {
                buf.extend_from_slice(rest);
                rest = &[];
            }
            Err(e) if e.is_connection_fatal() => break,
            Err(_) => {}
        }
    }
    // The slice decoder on the same bytes, skipping bad frames by their length.
    let mut at = 0;
    while at < data.len() {
        match decode_slice(&data[at..]) {
            Ok(Some((_, used))) => at += used,
            Ok(None) => break,
            Err(quire_proto::WireError::BadFrame { frame_bytes, .. }) => at += frame_bytes as usize,
            Err(_) => break,
        }
    }
    for frame in frames {
        check_round_trip(&frame);
        let events = match &frame.body {
            Body::AppendRequest(a) => &a.events,
            Body::ReadResponse(r) => &r.events,
            _ => continue,
        };
        for event in events {
            if let Ok(body) = EventBody::decode(event.kind, &event.payload) {
                let again = body.to_payload().expect("a decoded event body re-encodes");
                assert_eq!(EventBody::decode(event.kind, &again), Ok(body));
            }
        }
    }
});

fn check_round_trip(frame: &Frame) {
    let mut out = BytesMut::new();
    encode(frame, &mut out).expect("a decoded frame re-encodes");
    assert_eq!(decode(&mut out), Ok(Some(frame.clone())));
}
