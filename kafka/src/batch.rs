//! Kafka record batches (RecordBatch v2, KIP-98's format) to Quire messages and back.
//!
//! In: a produced batch is decoded — decompressed if gzip, snappy, lz4 or zstd — and each
//! record becomes one [`KafkaRecord`] message. Out: fetched messages become one
//! uncompressed batch whose records keep their Quire offsets (gaps where other topics'
//! messages are, as after compaction). A native producer's message (format
//! [`MessageFormat::Raw`]) is read as a record with that value, no key and no timestamp.

use bytes::{Bytes, BytesMut};
use kafka_protocol::indexmap::IndexMap;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, NO_SEQUENCE,
    NO_TIMESTAMP,
};
use quire_proto::{KafkaRecord, MessageFormat, Offset, MESSAGES_PER_FRAME_MAX};

/// Why a produced batch cannot be stored.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum BatchError {
    /// The bytes are not record batches (or decompress past the bound): Kafka's
    /// `CORRUPT_MESSAGE`.
    Corrupt(String),
    /// Transactional or control records: transactions are not supported.
    Transactional,
    /// More records than one produce may carry, or more bytes of them once decoded:
    /// Kafka's `RECORD_LIST_TOO_LARGE`.
    TooLarge(String),
}

/// Bytes of stored records one partition of one produce may decode to, at most.
pub const DECODED_BYTES_MAX: usize = 64 << 20;

/// The records of the batches in `records` (a produce's partition data) as the messages
/// Quire stores, or why they cannot be stored (for the fuzz target and tests: what a
/// produce does with a partition's bytes).
///
/// # Errors
/// A description of the refusal (`CORRUPT_MESSAGE` or transactional records).
pub fn stored_records(records: Bytes) -> Result<Vec<Bytes>, String> {
    messages_of(records)
        .map(|p| p.messages)
        .map_err(|e| format!("{e:?}"))
}

/// The idempotent producer a produced partition's records say they come from (KIP-98:
/// every record of a batch carries the batch's producer id, epoch and `baseSequence +
/// offsetDelta`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KafkaProducer {
    /// The producer id InitProducerId gave (≥ 0).
    pub id: i64,
    /// The producer epoch (≥ 0).
    pub epoch: i16,
    /// The sequence of the first record.
    pub first_sequence: i32,
}

/// A produced partition's records, decoded.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Produced {
    /// Each record as a [`KafkaRecord`] message.
    pub messages: Vec<Bytes>,
    /// The idempotent producer, `None` for records without a producer id.
    pub producer: Option<KafkaProducer>,
}

/// Checks that `r` continues the records before it: all of them with no producer id, or
/// all from one producer and epoch with consecutive sequences (Kafka's own rule for a
/// produce, which has the broker refuse the request otherwise).
fn check_producer(
    producer: &mut Option<Option<KafkaProducer>>,
    count: usize,
    r: &Record,
) -> Result<(), BatchError> {
    let this = (r.producer_id >= 0).then_some(KafkaProducer {
        id: r.producer_id,
        epoch: r.producer_epoch,
        first_sequence: r.sequence,
    });
    match (*producer, this) {
        (None, _) => {
            if this.is_some_and(|p| p.epoch < 0 || p.first_sequence < 0) {
                return Err(BatchError::Corrupt(
                    "an idempotent record needs a producer epoch and a sequence".to_owned(),
                ));
            }
            *producer = Some(this);
            Ok(())
        }
        (Some(None), None) => Ok(()),
        (Some(Some(first)), Some(p))
            if p.id == first.id
                && p.epoch == first.epoch
                && i64::from(p.first_sequence)
                    == i64::from(first.first_sequence) + count as i64 =>
        {
            Ok(())
        }
        _ => Err(BatchError::Corrupt(
            "the records of one produced partition must come from one producer, with consecutive sequences".to_owned(),
        )),
    }
}

/// The records of the batches in `records` (a produce's partition data), each encoded as a
/// [`KafkaRecord`] message.
///
/// Bounded before anything is decompressed: the batches' headers must announce at most
/// `MESSAGES_PER_FRAME_MAX` records together; then one batch is decoded at a time (at
/// most 64 MiB decompressed) and the stored records may take at most
/// [`DECODED_BYTES_MAX`].
pub(crate) fn messages_of(mut records: Bytes) -> Result<Produced, BatchError> {
    let corrupt = |e: anyhow::Error| BatchError::Corrupt(format!("{e:#}"));
    let infos = RecordBatchDecoder::decode_batch_info(&mut records.clone()).map_err(corrupt)?;
    let announced: i64 = infos.iter().map(|i| i64::from(i.record_count.max(0))).sum();
    if announced > MESSAGES_PER_FRAME_MAX as i64 {
        return Err(BatchError::TooLarge(format!(
            "{announced} records; at most {MESSAGES_PER_FRAME_MAX} per partition and request"
        )));
    }
    let mut out = Vec::with_capacity(usize::try_from(announced).unwrap_or(0));
    let mut producer = None;
    let mut bytes = 0usize;
    while bytes::Buf::has_remaining(&records) {
        let set = RecordBatchDecoder::decode(&mut records).map_err(corrupt)?;
        if out.len() + set.records.len() > MESSAGES_PER_FRAME_MAX {
            return Err(BatchError::TooLarge(format!(
                "more than {MESSAGES_PER_FRAME_MAX} records per partition and request"
            )));
        }
        for r in set.records {
            if r.transactional || r.control {
                return Err(BatchError::Transactional);
            }
            check_producer(&mut producer, out.len(), &r)?;
            let record = KafkaRecord {
                timestamp_ms: r.timestamp,
                key: r.key,
                headers: r
                    .headers
                    .into_iter()
                    .map(|(k, v)| (k.into_bytes(), v))
                    .collect(),
                value: r.value,
            };
            let mut buf = BytesMut::with_capacity(record.encoded_bytes());
            record
                .encode(&mut buf)
                .map_err(|e| BatchError::Corrupt(e.to_string()))?;
            bytes += buf.len();
            if bytes > DECODED_BYTES_MAX {
                return Err(BatchError::TooLarge(format!(
                    "the records take more than {DECODED_BYTES_MAX} bytes"
                )));
            }
            out.push(buf.freeze());
        }
    }
    Ok(Produced {
        messages: out,
        producer: producer.flatten(),
    })
}

/// The record batches (v2, uncompressed) answering a fetch from `from`: `messages` at
/// their offsets (`formats` says what each is; empty: every one opaque), then, if the
/// broker scanned further (`next_offset` past the last message, or past `from` with no
/// message), a control batch whose one COMMIT marker sits at the last offset scanned
/// ([`skip_marker`]). Kafka clients move their position past it, so a topic whose offsets
/// stop short of the high watermark — other topics' messages follow it in the shared log —
/// is read to its end instead of fetched from the same offset forever. Empty bytes for no
/// messages and nothing scanned.
///
/// # Errors
/// A message that says it is a Kafka record but does not decode, or an encoding failure
/// of the batch (neither happens for what the listener stored).
pub(crate) fn batches_of(
    from: Offset,
    messages: &[(Offset, Bytes)],
    formats: &[MessageFormat],
    next_offset: Offset,
) -> anyhow::Result<Bytes> {
    let mut out = BytesMut::from(&batch_of(messages, formats)?[..]);
    let covered = messages.last().map_or(from, |(o, _)| o.next());
    if next_offset > covered {
        skip_marker(next_offset, &mut out)?;
    }
    Ok(out.freeze())
}

/// Appends a control batch holding one transaction COMMIT marker at offset `end - 1`
/// (KIP-98's control records: key = version 0 and type 1, value = version 0 and
/// coordinator epoch 0): clients move their position past it to `end`, and deliver
/// nothing.
///
/// Why a marker rather than an empty batch (which Kafka writes when compaction empties
/// one): librdkafka counts a fetch answer without a record or a control record as "no
/// whole message fit", doubles its fetch size, and from 1 GiB on reports every such answer
/// to the application as `MSG_SIZE_TOO_LARGE` — which a consumer at the live end of a
/// topic, while other topics are written, met on a third of its fetches (found by a
/// break-it trial). A COMMIT marker is ignored at every isolation level, by librdkafka
/// and by the Java client, and it counts as read.
fn skip_marker(end: Offset, out: &mut BytesMut) -> anyhow::Result<()> {
    const CONTROL_COMMIT: [u8; 4] = [0, 0, 0, 1];
    const CONTROL_VALUE: [u8; 6] = [0; 6];
    let marker = Record {
        transactional: true,
        control: true,
        delete_horizon: false,
        partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
        producer_id: NO_PRODUCER_ID,
        producer_epoch: NO_PRODUCER_EPOCH,
        timestamp_type: TimestampType::Creation,
        offset: i64::try_from(end.0)? - 1,
        sequence: NO_SEQUENCE,
        timestamp: NO_TIMESTAMP,
        key: Some(Bytes::from_static(&CONTROL_COMMIT)),
        value: Some(Bytes::from_static(&CONTROL_VALUE)),
        headers: IndexMap::new(),
    };
    RecordBatchEncoder::encode(
        out,
        &[marker],
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )?;
    Ok(())
}

/// One uncompressed record batch (v2) holding `messages` at their offsets; `formats` says
/// what each message is (empty: every one opaque). Empty bytes for no messages.
fn batch_of(messages: &[(Offset, Bytes)], formats: &[MessageFormat]) -> anyhow::Result<Bytes> {
    if messages.is_empty() {
        return Ok(Bytes::new());
    }
    let mut records = Vec::with_capacity(messages.len());
    for (i, (offset, bytes)) in messages.iter().enumerate() {
        let format = formats.get(i).copied().unwrap_or(MessageFormat::Raw);
        let record = match format {
            MessageFormat::Kafka => KafkaRecord::decode(bytes).ok(),
            MessageFormat::Raw => None,
        };
        // A message that says it is a record but is none (brokers refuse such produces)
        // is served as opaque bytes rather than stop the partition.
        let stored = match record {
            Some(r) => r,
            None => KafkaRecord {
                timestamp_ms: NO_TIMESTAMP,
                key: None,
                headers: Vec::new(),
                value: Some(bytes.clone()),
            },
        };
        let mut headers = IndexMap::with_capacity(stored.headers.len());
        for (k, v) in stored.headers {
            // Keys stored from a decoded record are UTF-8. A repeated key keeps the last
            // value: the codec's header map has one entry per key (docs/kafka.md).
            let k = StrBytes::from_string(String::from_utf8_lossy(&k).into_owned());
            headers.insert(k, v);
        }
        records.push(Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset: i64::try_from(offset.0)?,
            sequence: NO_SEQUENCE,
            timestamp: stored.timestamp_ms,
            key: stored.key,
            value: stored.value,
            headers,
        });
    }
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(
        &mut buf,
        &records,
        &RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        },
    )?;
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is a test failure

    use super::*;

    fn record(offset: i64, key: &'static [u8], value: &'static [u8]) -> Record {
        let mut headers = IndexMap::new();
        headers.insert(
            StrBytes::from_static_str("h"),
            Some(Bytes::from_static(b"v")),
        );
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: NO_PRODUCER_ID,
            producer_epoch: NO_PRODUCER_EPOCH,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: NO_SEQUENCE,
            timestamp: 1_700_000_000_000 + offset,
            key: Some(Bytes::from_static(key)),
            value: Some(Bytes::from_static(value)),
            headers,
        }
    }

    fn produced(compression: Compression) -> Bytes {
        let records = [record(0, b"k0", b"v0"), record(1, b"k1", b"v1")];
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &records,
            &RecordEncodeOptions {
                version: 2,
                compression,
            },
        )
        .unwrap();
        buf.freeze()
    }

    /// Every codec a client may send decodes to the same records, and the records come
    /// back out at the offsets they were stored at, with their keys, values, headers and
    /// timestamps.
    #[test]
    fn records_survive_the_round_trip_through_every_codec() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let messages = messages_of(produced(c)).unwrap().messages;
            assert_eq!(messages.len(), 2, "{c:?}");
            let stored: Vec<(Offset, Bytes)> = vec![
                (Offset(10), messages[0].clone()),
                (Offset(13), messages[1].clone()),
            ];
            let batch = batch_of(&stored, &[MessageFormat::Kafka, MessageFormat::Kafka]).unwrap();
            let back = RecordBatchDecoder::decode_all(&mut batch.clone()).unwrap();
            let back: Vec<Record> = back.into_iter().flat_map(|s| s.records).collect();
            assert_eq!(back.len(), 2);
            assert_eq!(back[0].offset, 10);
            assert_eq!(back[1].offset, 13, "a gap stays a gap");
            assert_eq!(back[1].key.as_deref(), Some(&b"k1"[..]));
            assert_eq!(back[1].value.as_deref(), Some(&b"v1"[..]));
            assert_eq!(back[1].timestamp, 1_700_000_000_001);
            assert_eq!(
                back[0]
                    .headers
                    .get(&StrBytes::from_static_str("h"))
                    .cloned()
                    .flatten()
                    .as_deref(),
                Some(&b"v"[..])
            );
        }
    }

    /// A fetch that scanned past its last record ends with a COMMIT marker at the last
    /// offset scanned, which the codec reads as a valid control record.
    #[test]
    fn a_scan_past_the_records_ends_with_a_commit_marker() {
        let stored = vec![(Offset(5), Bytes::from_static(b"raw"))];
        let bytes = batches_of(Offset(3), &stored, &[], Offset(20)).unwrap();
        let sets = RecordBatchDecoder::decode_all(&mut bytes.clone()).unwrap();
        let records: Vec<&Record> = sets.iter().flat_map(|s| &s.records).collect();
        assert_eq!(records.len(), 2, "the CRCs hold");
        assert!(!records[0].control);
        // The marker sits at 19: the client fetches from 20 next, and delivers nothing.
        let marker = records[1];
        assert!(marker.control && marker.transactional);
        assert_eq!(marker.offset, 19);
        assert_eq!(marker.key.as_deref(), Some(&[0u8, 0, 0, 1][..]), "COMMIT");
        // No record and nothing scanned: nothing.
        assert!(batches_of(Offset(3), &[], &[], Offset(3))
            .unwrap()
            .is_empty());
        // No record but a scanned span: the marker alone.
        let only = batches_of(Offset(3), &[], &[], Offset(9)).unwrap();
        let sets = RecordBatchDecoder::decode_all(&mut only.clone()).unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0].records[0].offset, 8);
    }

    #[test]
    fn a_native_message_reads_as_a_record_with_its_value() {
        let batch = batch_of(&[(Offset(4), Bytes::from_static(b"raw"))], &[]).unwrap();
        let back = RecordBatchDecoder::decode_all(&mut batch.clone()).unwrap();
        let r = &back[0].records[0];
        assert_eq!(
            (r.offset, r.key.clone(), r.value.as_deref()),
            (4, None, Some(&b"raw"[..]))
        );
    }

    /// A compressed batch that announces more records than a produce may carry is refused
    /// from its header, before it is decompressed (a few kilobytes of zstd announced nine
    /// million 7-byte records and took 1.75 GB to decode before this bound).
    #[test]
    fn a_batch_announcing_too_many_records_is_refused_before_decoding() {
        let many: Vec<Record> = (0..70_000).map(|i| record(i, b"", b"")).collect();
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &many,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::Zstd,
            },
        )
        .unwrap();
        assert!(matches!(
            messages_of(buf.freeze()),
            Err(BatchError::TooLarge(_))
        ));
    }

    fn encoded(records: &[Record]) -> Bytes {
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            records,
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        buf.freeze()
    }

    fn idempotent(offset: i64, id: i64, epoch: i16, sequence: i32) -> Record {
        let mut r = record(offset, b"k", b"v");
        r.producer_id = id;
        r.producer_epoch = epoch;
        r.sequence = sequence;
        r
    }

    /// An idempotent batch names its producer, epoch and first sequence; batches of one
    /// partition must continue each other (one producer, consecutive sequences).
    #[test]
    fn idempotent_batches_name_their_producer() {
        let one = encoded(&[idempotent(0, 9, 2, 40), idempotent(1, 9, 2, 41)]);
        let two = encoded(&[idempotent(0, 9, 2, 42)]);
        let both = Bytes::from([one.clone(), two].concat());
        let got = messages_of(both).unwrap();
        assert_eq!(got.messages.len(), 3);
        assert_eq!(
            got.producer,
            Some(KafkaProducer {
                id: 9,
                epoch: 2,
                first_sequence: 40
            })
        );
        assert_eq!(
            messages_of(produced(Compression::None)).unwrap().producer,
            None
        );
        for bad in [
            encoded(&[idempotent(0, 9, 2, 44)]), // a gap after 41
            encoded(&[idempotent(0, 8, 2, 42)]), // another producer
            encoded(&[idempotent(0, 9, 3, 42)]), // another epoch
            encoded(&[record(0, b"k", b"v")]),   // no producer
        ] {
            let mixed = Bytes::from([one.clone(), bad].concat());
            assert!(
                matches!(messages_of(mixed), Err(BatchError::Corrupt(_))),
                "mixed batches are refused"
            );
        }
    }

    #[test]
    fn garbage_and_transactions_are_refused() {
        assert!(matches!(
            messages_of(Bytes::from_static(b"not a batch at all, no")),
            Err(BatchError::Corrupt(_))
        ));
        let mut t = record(0, b"k", b"v");
        t.transactional = true;
        t.producer_id = 7;
        t.producer_epoch = 0;
        t.sequence = 0;
        let mut buf = BytesMut::new();
        RecordBatchEncoder::encode(
            &mut buf,
            &[t],
            &RecordEncodeOptions {
                version: 2,
                compression: Compression::None,
            },
        )
        .unwrap();
        assert_eq!(messages_of(buf.freeze()), Err(BatchError::Transactional));
    }
}
