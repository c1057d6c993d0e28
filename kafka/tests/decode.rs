//! The request decoder against bytes a client chooses: random bytes, and valid requests of
//! every served API and version cut short, with a byte changed, or with a count made huge.
//! None may panic, and none may make the decoder ask for a large block of memory (the
//! allocator below records the largest request; CVE-2022-34917's pattern is a few bytes
//! asking for gigabytes).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, CreatePartitionsRequest, CreateTopicsRequest, DeleteTopicsRequest,
    DescribeClusterRequest, DescribeConfigsRequest, DescribeGroupsRequest, FetchRequest,
    FindCoordinatorRequest, HeartbeatRequest, InitProducerIdRequest, JoinGroupRequest,
    LeaveGroupRequest, ListGroupsRequest, ListOffsetsRequest, MetadataRequest, OffsetCommitRequest,
    OffsetFetchRequest, ProduceRequest, RequestHeader, SaslAuthenticateRequest,
    SaslHandshakeRequest, SyncGroupRequest,
};
use kafka_protocol::protocol::Encodable;
use proptest::prelude::*;
use quire_kafka::{decode_request, stored_records, SUPPORTED_APIS};

/// The system allocator, recording the largest single allocation asked for.
struct Recording;

thread_local! {
    /// The largest allocation this thread asked for since it was last reset: per thread,
    /// so that tests running at once (and a panic's backtrace in another test) do not count
    /// against each other. Const-initialised, with no destructor: reading it never
    /// allocates, as the allocator requires.
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    LARGEST.with(|l| l.set(l.get().max(size)));
}

// SAFETY: forwards every call to the system allocator unchanged; only records sizes.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's obligations are passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
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
    LARGEST.with(|l| l.set(0));
    let head: Vec<u8> = bytes.iter().take(4).copied().collect();
    let _ = decode_request(Bytes::from(bytes));
    let largest = LARGEST.with(Cell::get);
    assert!(
        largest <= LARGEST_ALLOWED,
        "a decode asked for {largest} bytes at once (key and version {head:?})"
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
        ApiKey::InitProducerId => InitProducerIdRequest::default().encode(&mut buf, version),
        ApiKey::JoinGroup => JoinGroupRequest::default().encode(&mut buf, version),
        ApiKey::SyncGroup => SyncGroupRequest::default().encode(&mut buf, version),
        ApiKey::Heartbeat => HeartbeatRequest::default().encode(&mut buf, version),
        ApiKey::LeaveGroup => LeaveGroupRequest::default().encode(&mut buf, version),
        ApiKey::OffsetCommit => OffsetCommitRequest::default().encode(&mut buf, version),
        ApiKey::OffsetFetch => OffsetFetchRequest::default().encode(&mut buf, version),
        ApiKey::ListGroups => ListGroupsRequest::default().encode(&mut buf, version),
        ApiKey::DescribeGroups => DescribeGroupsRequest::default().encode(&mut buf, version),
        ApiKey::CreateTopics => CreateTopicsRequest::default().encode(&mut buf, version),
        ApiKey::DeleteTopics => DeleteTopicsRequest::default().encode(&mut buf, version),
        ApiKey::CreatePartitions => CreatePartitionsRequest::default().encode(&mut buf, version),
        ApiKey::DescribeCluster => DescribeClusterRequest::default().encode(&mut buf, version),
        ApiKey::DescribeConfigs => DescribeConfigsRequest::default().encode(&mut buf, version),
        ApiKey::SaslHandshake => SaslHandshakeRequest::default().encode(&mut buf, version),
        ApiKey::SaslAuthenticate => SaslAuthenticateRequest::default().encode(&mut buf, version),
        other => panic!("no valid request of {other:?} in this test: add one"),
    };
    // Versions the codec itself cannot write (Produce below 3, CreateTopics below 2,
    // DeleteTopics and DescribeConfigs 0), and SaslHandshake 0 (raw SASL tokens follow it),
    // are announced but close the connection: they stay out of the served set here.
    if ok.is_err() || (key == ApiKey::SaslHandshake && version == 0) {
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
        LARGEST.with(|l| l.set(0));
        let _ = stored_records(b.freeze());
        // A batch may decompress to at most 64 MiB; random bytes never get near.
        prop_assert!(LARGEST.with(Cell::get) <= LARGEST_ALLOWED);
    }
}
