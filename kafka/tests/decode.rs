//! The request decoder against bytes a client chooses: random bytes, and valid requests of
//! every served API and version cut short, with a byte changed, or with a count made huge.
//! None may panic, and none may make the decoder ask for a large block of memory (the
//! allocator below records the largest request; CVE-2022-34917's pattern is a few bytes
//! asking for gigabytes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, FetchRequest, FindCoordinatorRequest, ListOffsetsRequest,
    MetadataRequest, ProduceRequest, RequestHeader,
};
use kafka_protocol::protocol::Encodable;
use proptest::prelude::*;
use quire_kafka::{decode_request, stored_records, SUPPORTED_APIS};

/// The system allocator, recording the largest single allocation asked for.
struct Recording;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        // SAFETY: the caller's obligations are passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Recording = Recording;

/// The largest allocation a decode of a request of a few kilobytes may ask for: the
/// patched decoder reserves at most 1,024 elements up front.
const LARGEST_ALLOWED: usize = 4 << 20;

fn decode_bounded(bytes: Vec<u8>) {
    LARGEST.store(0, Ordering::Relaxed);
    let _ = decode_request(Bytes::from(bytes));
    let largest = LARGEST.load(Ordering::Relaxed);
    assert!(
        largest <= LARGEST_ALLOWED,
        "a decode asked for {largest} bytes at once"
    );
}

/// A valid request of `key` at `version`, header included (no size prefix).
fn valid(key: ApiKey, version: i16) -> Vec<u8> {
    let mut buf = BytesMut::new();
    RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .encode(&mut buf, key.request_header_version(version))
        .unwrap();
    let ok = match key {
        ApiKey::Metadata => MetadataRequest::default().encode(&mut buf, version),
        ApiKey::Produce => ProduceRequest::default()
            .with_acks(-1)
            .encode(&mut buf, version),
        ApiKey::Fetch => FetchRequest::default().encode(&mut buf, version),
        ApiKey::ListOffsets => ListOffsetsRequest::default().encode(&mut buf, version),
        ApiKey::FindCoordinator => FindCoordinatorRequest::default().encode(&mut buf, version),
        ApiKey::ApiVersions => ApiVersionsRequest::default().encode(&mut buf, version),
        _ => Ok(()),
    };
    // Versions the codec itself cannot write (Produce below 3) stay header-only.
    if ok.is_err() {
        buf.truncate(0);
    }
    buf.to_vec()
}

fn served() -> Vec<(ApiKey, i16)> {
    SUPPORTED_APIS
        .iter()
        .flat_map(|&(k, lo, hi)| (lo..=hi).map(move |v| (k, v)))
        .collect()
}

#[test]
fn every_served_request_decodes_and_every_cut_of_it_is_refused_or_decodes() {
    for (key, version) in served() {
        let bytes = valid(key, version);
        if bytes.is_empty() {
            continue;
        }
        assert!(
            decode_request(Bytes::from(bytes.clone())).is_ok(),
            "{key:?} v{version}"
        );
        for cut in 0..bytes.len() {
            decode_bounded(bytes[..cut].to_vec());
        }
    }
}

#[test]
fn a_huge_count_after_any_prefix_is_refused_without_a_large_allocation() {
    for (key, version) in served() {
        let bytes = valid(key, version);
        for at in 8..=bytes.len() {
            for count in [
                i32::MAX.to_be_bytes().to_vec(),
                vec![0xff, 0xff, 0xff, 0x7f],
            ] {
                let mut b = bytes[..at].to_vec();
                b.extend_from_slice(&count);
                b.extend_from_slice(&[0u8; 16]);
                decode_bounded(b);
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        decode_bounded(bytes);
    }

    #[test]
    fn valid_requests_with_a_byte_changed_never_panic(
        which in 0usize..64,
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
    ) {
        let all = served();
        let (key, version) = all[which % all.len()];
        let mut bytes = valid(key, version);
        if !bytes.is_empty() {
            let i = at.index(bytes.len());
            bytes[i] = byte;
            decode_bounded(bytes);
        }
    }

    #[test]
    fn random_record_batches_never_panic(
        head in proptest::collection::vec(any::<u8>(), 61..62),
        tail in proptest::collection::vec(any::<u8>(), 0..512),
        magic_v2 in any::<bool>(),
    ) {
        let mut b = BytesMut::new();
        b.put_slice(&head);
        b.put_slice(&tail);
        if magic_v2 {
            b[16] = 2;
        }
        LARGEST.store(0, Ordering::Relaxed);
        let _ = stored_records(b.freeze());
        // A batch may decompress to at most 64 MiB; random bytes never get near.
        prop_assert!(LARGEST.load(Ordering::Relaxed) <= LARGEST_ALLOWED);
    }
}
