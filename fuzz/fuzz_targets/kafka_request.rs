//! Fuzzes the Kafka listener's request decoder (quire-kafka's `decode_request`: header and
//! body through the patched kafka-protocol codec) and, for a produce that decodes, what the
//! listener does with each partition's bytes (`stored_records`: record batches,
//! decompression). Neither may panic or abort; kafka/tests/decode.rs checks the same
//! inputs' allocations in CI.
//!
//! Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run kafka_request -- -max_total_time=60 -rss_limit_mb=512`.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use quire_kafka::{decode_request, stored_records, Decoded, KafkaRequest};

fuzz_target!(|data: &[u8]| {
    if let Ok(Decoded::Request { request, .. }) = decode_request(Bytes::copy_from_slice(data)) {
        let KafkaRequest::Produce(p) = *request else {
            return;
        };
        for topic in p.topic_data {
            for part in topic.partition_data {
                let _ = stored_records(part.records.unwrap_or_default());
            }
        }
    }
});
