//! Range digests: a short fingerprint of what a log holds over a range of offsets, so two
//! stores' logs can be compared without sending their events (`quire cluster audit`).
//!
//! A log entry is identified by its [`EntryId`]: its epoch, its offset and the CRC-32C its
//! WAL record carries (which covers the record's header and payload, see docs/format.md).
//! Two stores that hold the same event at an offset hold the same `EntryId` there. The
//! digest of a run of consecutive entries is the CRC-32C of their ids laid end to end, each
//! 20 bytes, little-endian:
//!
//! ```text
//! off  size  field
//! 0    8     epoch     u64
//! 8    8     offset    u64
//! 16   4     crc       u32: the record's CRC-32C
//! ```
//!
//! The empty run's digest is 0. This is a fingerprint, not a cryptographic hash: two
//! different runs collide with probability about 2⁻³², which is why an audit confirms a
//! divergence it found by bisection on the single entry's id, not on a digest.
//!
//! The one implementation: stores answer `RangeDigestRequest`s with it and the offline
//! audit of a data directory computes it over the WAL's scan.

use crate::types::{Epoch, LogPosition, Offset};

/// Bytes one [`EntryId`] contributes to a digest.
pub const ENTRY_ID_BYTES: usize = 8 + 8 + 4;

/// One log entry as a digest sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EntryId {
    /// Epoch of the master that created the event.
    pub epoch: Epoch,
    /// Its offset in the log.
    pub offset: Offset,
    /// The CRC-32C of its WAL record.
    pub crc: u32,
}

impl EntryId {
    /// The 20 bytes this id adds to a digest.
    #[must_use]
    pub fn to_bytes(self) -> [u8; ENTRY_ID_BYTES] {
        let mut b = [0u8; ENTRY_ID_BYTES];
        b[0..8].copy_from_slice(&self.epoch.0.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.0.to_le_bytes());
        b[16..20].copy_from_slice(&self.crc.to_le_bytes());
        b
    }

    /// Its `(epoch, offset)`.
    #[must_use]
    pub fn position(self) -> LogPosition {
        LogPosition {
            epoch: self.epoch,
            offset: self.offset,
        }
    }
}

/// A digest being built over consecutive entries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RangeDigest {
    count: u64,
    digest: u32,
    first: Option<EntryId>,
    last: Option<EntryId>,
}

impl RangeDigest {
    /// The digest of no entry.
    #[must_use]
    pub fn new() -> RangeDigest {
        RangeDigest::default()
    }

    /// The digest of `entries`, which must be at consecutive offsets.
    ///
    /// # Panics
    /// As [`RangeDigest::push`].
    #[must_use]
    pub fn of(entries: impl IntoIterator<Item = EntryId>) -> RangeDigest {
        let mut d = RangeDigest::new();
        for e in entries {
            d.push(e);
        }
        d
    }

    /// Adds the next entry.
    ///
    /// # Panics
    /// If `entry` is not at the offset right after the last one pushed (a caller bug: a
    /// log's entries are contiguous).
    pub fn push(&mut self, entry: EntryId) {
        if let Some(last) = self.last {
            assert_eq!(
                entry.offset.0,
                last.offset.0.wrapping_add(1),
                "range digest entries must be contiguous"
            );
        } else {
            self.first = Some(entry);
        }
        self.digest = crc32c::crc32c_append(self.digest, &entry.to_bytes());
        self.count += 1;
        self.last = Some(entry);
    }

    /// Entries pushed.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count
    }

    /// The digest (0 for no entry).
    #[must_use]
    pub fn digest(&self) -> u32 {
        self.digest
    }

    /// The first entry pushed.
    #[must_use]
    pub fn first(&self) -> Option<EntryId> {
        self.first
    }

    /// The last entry pushed.
    #[must_use]
    pub fn last(&self) -> Option<EntryId> {
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(epoch: u64, offset: u64, crc: u32) -> EntryId {
        EntryId {
            epoch: Epoch(epoch),
            offset: Offset(offset),
            crc,
        }
    }

    #[test]
    fn the_digest_is_the_crc_of_the_ids_end_to_end() {
        assert_eq!(RangeDigest::new().digest(), 0);
        let a = id(1, 7, 0xAABB_CCDD);
        let b = id(2, 8, 1);
        let mut bytes = a.to_bytes().to_vec();
        bytes.extend_from_slice(&b.to_bytes());
        let d = RangeDigest::of([a, b]);
        assert_eq!(d.digest(), crc32c::crc32c(&bytes));
        assert_eq!((d.count(), d.first(), d.last()), (2, Some(a), Some(b)));
        assert_eq!(
            &a.to_bytes(),
            &[1, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 0xDD, 0xCC, 0xBB, 0xAA]
        );
    }

    #[test]
    fn any_field_changes_the_digest() {
        let base = RangeDigest::of([id(1, 0, 5), id(1, 1, 6)]).digest();
        assert_ne!(base, RangeDigest::of([id(1, 0, 5), id(2, 1, 6)]).digest());
        assert_ne!(base, RangeDigest::of([id(1, 0, 5), id(1, 1, 7)]).digest());
        assert_ne!(base, RangeDigest::of([id(1, 1, 5), id(1, 2, 6)]).digest());
    }

    #[test]
    #[should_panic(expected = "contiguous")]
    fn a_gap_is_a_bug() {
        let _ = RangeDigest::of([id(1, 0, 5), id(1, 2, 6)]);
    }
}
