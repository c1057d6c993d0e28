//! [`KafkaRecord`]: the bytes of a message written through the Kafka listener (a message
//! event of format [`crate::MessageFormat::Kafka`]).
//!
//! A Kafka record carries a timestamp, a key, headers and a value; Quire stores each record
//! of a produced batch as one message, so each gets its own log offset (docs/kafka.md). The
//! value comes last, so a native consumer, which sees only the value, gets a slice of the
//! stored bytes without a copy ([`KafkaRecord::value_of`]). Integers are little-endian.
//!
//! ```text
//! 1    version        u8 (1)
//! 8    timestamp      i64: milliseconds since the Unix epoch, as the producer set it
//! 4    key length     u32 (u32::MAX: a null key), then the key bytes
//! 4    header count   u32 (≤ RECORD_HEADERS_MAX), then per header:
//!        4 key length u32, key bytes;  4 value length u32 (u32::MAX: null), value bytes
//! 4    value length   u32 (u32::MAX: a null value), then the value bytes: the rest
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::codec::Reader;
use crate::error::WireError;

/// The record format version this build writes and reads.
pub const RECORD_VERSION: u8 = 1;
/// Headers one record may carry, at most.
pub const RECORD_HEADERS_MAX: usize = 4096;
/// The length that stands for a null key, header value or value.
const NULL: u32 = u32::MAX;

/// One Kafka record as Quire stores it. On decode every byte field is a slice of the
/// stored bytes (no copy).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaRecord {
    /// Milliseconds since the Unix epoch (the producer's create time; -1: none).
    pub timestamp_ms: i64,
    /// The key (`None`: null).
    pub key: Option<Bytes>,
    /// Headers in the order sent: key, value (`None`: null). Keys may repeat.
    pub headers: Vec<(Bytes, Option<Bytes>)>,
    /// The value (`None`: null, a tombstone).
    pub value: Option<Bytes>,
}

fn len_of(field: &'static str, b: Option<&Bytes>) -> Result<u32, WireError> {
    match b {
        None => Ok(NULL),
        Some(b) => {
            u32::try_from(b.len())
                .ok()
                .filter(|&n| n != NULL)
                .ok_or(WireError::PayloadTooLarge {
                    field,
                    length: b.len(),
                    max: NULL as usize - 1,
                })
        }
    }
}

fn read_opt(
    r: &mut Reader<'_>,
    bytes: &Bytes,
    field: &'static str,
) -> Result<Option<Bytes>, WireError> {
    let n = r.u32(field)?;
    if n == NULL {
        return Ok(None);
    }
    let start = bytes.len() - r.remaining();
    r.take(field, n as usize)?;
    Ok(Some(bytes.slice(start..start + n as usize)))
}

impl KafkaRecord {
    /// Bytes [`KafkaRecord::encode`] appends.
    #[must_use]
    pub fn encoded_bytes(&self) -> usize {
        let opt = |b: &Option<Bytes>| 4 + b.as_ref().map_or(0, Bytes::len);
        1 + 8
            + opt(&self.key)
            + 4
            + self
                .headers
                .iter()
                .map(|(k, v)| 4 + k.len() + opt(v))
                .sum::<usize>()
            + opt(&self.value)
    }

    /// Appends the record to `out`. On error `out` is left as it was.
    ///
    /// # Errors
    /// [`WireError::CountTooLarge`] for more than [`RECORD_HEADERS_MAX`] headers;
    /// [`WireError::PayloadTooLarge`] for a field of 4 GiB or more.
    pub fn encode(&self, out: &mut BytesMut) -> Result<(), WireError> {
        if self.headers.len() > RECORD_HEADERS_MAX {
            return Err(WireError::CountTooLarge {
                field: "record headers",
                count: self.headers.len() as u64,
                max: RECORD_HEADERS_MAX as u64,
            });
        }
        let key_len = len_of("record key", self.key.as_ref())?;
        let value_len = len_of("record value", self.value.as_ref())?;
        let mut header_lens = Vec::with_capacity(self.headers.len());
        for (k, v) in &self.headers {
            header_lens.push((
                len_of("record header key", Some(k))?,
                len_of("record header value", v.as_ref())?,
            ));
        }
        out.reserve(self.encoded_bytes());
        out.put_u8(RECORD_VERSION);
        out.put_i64_le(self.timestamp_ms);
        out.put_u32_le(key_len);
        if let Some(k) = &self.key {
            out.put_slice(k);
        }
        // ≤ RECORD_HEADERS_MAX, checked above.
        out.put_u32_le(self.headers.len() as u32);
        for ((k, v), (kl, vl)) in self.headers.iter().zip(header_lens) {
            out.put_u32_le(kl);
            out.put_slice(k);
            out.put_u32_le(vl);
            if let Some(v) = v {
                out.put_slice(v);
            }
        }
        out.put_u32_le(value_len);
        if let Some(v) = &self.value {
            out.put_slice(v);
        }
        Ok(())
    }

    /// Decodes a record from all of `bytes` (fields are slices of it).
    ///
    /// # Errors
    /// [`WireError::UnsupportedEventBodyVersion`] for another version; `Truncated`,
    /// `CountTooLarge`, `CountExceedsBody` or `TrailingBytes` for bytes that are not a
    /// whole record.
    pub fn decode(bytes: &Bytes) -> Result<KafkaRecord, WireError> {
        let mut r = Reader::new(bytes);
        let (timestamp_ms, key) = Self::head(&mut r, bytes)?;
        let count = r.count("record headers", RECORD_HEADERS_MAX, 8)?;
        let mut headers = Vec::with_capacity(count);
        for _ in 0..count {
            let k = read_opt(&mut r, bytes, "record header key")?.unwrap_or_default();
            let v = read_opt(&mut r, bytes, "record header value")?;
            headers.push((k, v));
        }
        let value = read_opt(&mut r, bytes, "record value")?;
        r.finish()?;
        Ok(KafkaRecord {
            timestamp_ms,
            key,
            headers,
            value,
        })
    }

    /// The value of the record in `bytes`, as a slice of it (a null value: empty), for a
    /// consumer that reads values only.
    ///
    /// # Errors
    /// As [`KafkaRecord::decode`].
    pub fn value_of(bytes: &Bytes) -> Result<Bytes, WireError> {
        Ok(Self::decode(bytes)?.value.unwrap_or_default())
    }

    fn head(r: &mut Reader<'_>, bytes: &Bytes) -> Result<(i64, Option<Bytes>), WireError> {
        let version = r.u8("record version")?;
        if version != RECORD_VERSION {
            return Err(WireError::UnsupportedEventBodyVersion {
                version,
                supported: RECORD_VERSION,
            });
        }
        let timestamp_ms = i64::from_le_bytes(r.array("record timestamp")?);
        let key = read_opt(r, bytes, "record key")?;
        Ok((timestamp_ms, key))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // test code: a panic is a test failure

    use super::*;

    fn record() -> KafkaRecord {
        KafkaRecord {
            timestamp_ms: 1_700_000_000_123,
            key: Some(Bytes::from_static(b"user-7")),
            headers: vec![
                (
                    Bytes::from_static(b"trace"),
                    Some(Bytes::from_static(b"abc")),
                ),
                (Bytes::from_static(b"trace"), None),
            ],
            value: Some(Bytes::from_static(b"hello")),
        }
    }

    #[test]
    fn a_record_round_trips_and_its_value_is_the_tail() {
        let mut out = BytesMut::new();
        record().encode(&mut out).unwrap();
        assert_eq!(out.len(), record().encoded_bytes());
        let bytes = out.freeze();
        assert_eq!(KafkaRecord::decode(&bytes).unwrap(), record());
        let value = KafkaRecord::value_of(&bytes).unwrap();
        assert_eq!(&value[..], b"hello");
        assert_eq!(value.as_ptr(), bytes[bytes.len() - 5..].as_ptr(), "no copy");
    }

    #[test]
    fn nulls_and_empties_differ() {
        let r = KafkaRecord {
            timestamp_ms: -1,
            key: Some(Bytes::new()),
            headers: vec![],
            value: None,
        };
        let mut out = BytesMut::new();
        r.encode(&mut out).unwrap();
        assert_eq!(KafkaRecord::decode(&out.freeze()).unwrap(), r);
    }

    #[test]
    fn truncated_or_padded_bytes_are_refused() {
        let mut out = BytesMut::new();
        record().encode(&mut out).unwrap();
        let bytes = out.freeze();
        for cut in 0..bytes.len() {
            assert!(
                KafkaRecord::decode(&bytes.slice(..cut)).is_err(),
                "cut at {cut}"
            );
        }
        let mut padded = BytesMut::from(&bytes[..]);
        padded.put_u8(0);
        assert!(KafkaRecord::decode(&padded.freeze()).is_err());
        // A header count no body can hold is refused before anything is reserved.
        let mut huge = BytesMut::new();
        huge.put_u8(RECORD_VERSION);
        huge.put_i64_le(0);
        huge.put_u32_le(NULL);
        huge.put_u32_le(u32::MAX - 1);
        assert!(KafkaRecord::decode(&huge.freeze()).is_err());
    }
}
