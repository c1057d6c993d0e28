//! Fuzzes the body parsers behind a sound header. Random bytes rarely pass the header and
//! body CRC32C, so `decode_frame` mostly exercises the header checks; here the first byte
//! picks a frame type, the rest is the body, and the header (CRCs included) is computed,
//! so every input reaches a body parser. A body that parses must re-encode and decode to
//! the same frame; one that does not must be a `BadFrame` (never a panic).
//!
//! Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run decode_body -- -max_total_time=60`.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use quire_proto::{
    decode, decode_frame_body, encode, EventBody, FrameHeader, FrameType, RequestId, WireError,
    HEADER_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else {
        return;
    };
    let frame_type = FrameType::ALL[usize::from(selector) % FrameType::ALL.len()];
    let Ok(frame_bytes) = u32::try_from(HEADER_BYTES + body.len()) else {
        return;
    };
    let header = FrameHeader {
        frame_bytes,
        frame_type: frame_type.as_u16(),
        flags: 0,
        request_id: RequestId(1),
        log: quire_proto::LogId::ZERO,
        reserved: 0,
        body_crc: crc32c::crc32c(body),
    };
    // Through the header decoder too, as a reader that reads header and body apart would.
    let header = match FrameHeader::decode(&header.encode()) {
        Ok(h) => h,
        Err(WireError::FrameTooLarge { .. }) => return,
        Err(e) => panic!("a sealed header was refused: {e:?}"),
    };
    match decode_frame_body(&header, Bytes::copy_from_slice(body)) {
        Ok(frame) => {
            let mut out = BytesMut::new();
            encode(&frame, &mut out).expect("a decoded frame re-encodes");
            assert_eq!(decode(&mut out), Ok(Some(frame)));
        }
        Err(e) => assert!(!e.is_connection_fatal(), "body error was fatal: {e:?}"),
    }
    // The same bytes as an event payload of every kind.
    let payload: quire_proto::Payload = Bytes::copy_from_slice(body).into();
    for kind in 1..=5u8 {
        if let Some(kind) = quire_proto::EventKind::from_u8(kind) {
            if let Ok(b) = EventBody::decode(kind, &payload) {
                let again = b.to_payload().expect("a decoded event body re-encodes");
                assert_eq!(EventBody::decode(kind, &again), Ok(b));
            }
        }
    }
});
