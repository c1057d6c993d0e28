//! Choosing a topic's partition for a message, as a Kafka producer does (issue 13, item 5),
//! so that keys land where a Kafka client would put them.
//!
//! - A message with a key goes to `toPositive(murmur2(key)) % partitions`: Kafka's
//!   `BuiltInPartitioner.partitionForKey` (`Utils.murmur2`, seed `0x9747b28c`, and
//!   `toPositive` = `h & 0x7fffffff`), which librdkafka also offers as its `murmur2`
//!   partitioner. The same key always lands in the same partition while the partition
//!   count stays the same.
//! - A message without a key goes to a *sticky* partition: one partition takes keyless
//!   messages until about a batch's worth of bytes went to it, then another is chosen at
//!   random (KIP-480, "sticky partitioner"), so keyless traffic fills whole batches
//!   instead of spreading one message per partition.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// Kafka's 32-bit murmur2 of `data` (Austin Appleby's MurmurHash2, as
/// `org.apache.kafka.common.utils.Utils.murmur2` computes it: seed `0x9747b28c`, little-endian
/// 4-byte blocks, the tail mixed in the Java `switch`'s fall-through order).
#[must_use]
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;
    // Kafka mixes in the length as a Java int; longer keys wrap as they do there.
    #[allow(clippy::cast_possible_truncation)]
    let mut h = SEED ^ (data.len() as u32);
    let mut blocks = data.chunks_exact(4);
    for block in &mut blocks {
        let mut k = u32::from_le_bytes([block[0], block[1], block[2], block[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = blocks.remainder();
    if tail.len() >= 3 {
        h ^= u32::from(tail[2]) << 16;
    }
    if tail.len() >= 2 {
        h ^= u32::from(tail[1]) << 8;
    }
    if !tail.is_empty() {
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    i32::from_ne_bytes(h.to_ne_bytes())
}

/// The partition, in `0..partitions`, of a message with `key` in a topic of `partitions`
/// partitions: Kafka's `toPositive(murmur2(key)) % partitions`.
///
/// # Panics
/// If `partitions` is 0 (a topic has at least one partition; callers check the metadata).
#[must_use]
pub fn partition_for_key(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    let positive = u32::from_ne_bytes(murmur2(key).to_ne_bytes()) & 0x7fff_ffff;
    positive % partitions
}

/// Chooses partitions for keyless messages: sticks to one until `batch_bytes` went to it,
/// then moves to another chosen at random (KIP-480). One per producer and topic.
#[derive(Debug)]
pub struct StickyPartitioner {
    batch_bytes: u64,
    current: Option<u32>,
    sent_to_current: u64,
    rng: u64,
}

impl StickyPartitioner {
    /// A partitioner that moves on after `batch_bytes` bytes of messages (Kafka's
    /// `batch.size`, 16 KiB by default there); at least one message goes to each choice.
    #[must_use]
    pub fn new(batch_bytes: u64) -> StickyPartitioner {
        let seed = RandomState::new().build_hasher().finish() | 1;
        StickyPartitioner::with_seed(batch_bytes, seed)
    }

    /// As [`StickyPartitioner::new`], with the random choices drawn from `seed` (tests,
    /// the simulation).
    #[must_use]
    pub fn with_seed(batch_bytes: u64, seed: u64) -> StickyPartitioner {
        StickyPartitioner {
            batch_bytes,
            current: None,
            sent_to_current: 0,
            rng: seed | 1,
        }
    }

    /// The partition, in `0..partitions`, for the next keyless message of `message_bytes`
    /// bytes. A change in the partition count (or a first call) chooses afresh.
    ///
    /// # Panics
    /// If `partitions` is 0.
    pub fn partition(&mut self, partitions: u32, message_bytes: u64) -> u32 {
        assert!(partitions > 0, "a topic has at least one partition");
        let p = match self.current {
            Some(p) if p < partitions && self.sent_to_current < self.batch_bytes => p,
            previous => {
                self.sent_to_current = 0;
                self.choose(partitions, previous)
            }
        };
        self.current = Some(p);
        self.sent_to_current += message_bytes.max(1);
        p
    }

    /// A random partition other than `previous` (when there are two or more).
    fn choose(&mut self, partitions: u32, previous: Option<u32>) -> u32 {
        // xorshift64: uniform enough to spread batches; not for anything secret.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        match previous {
            Some(prev) if prev < partitions && partitions > 1 => {
                let step = 1 + (self.rng % u64::from(partitions - 1));
                // `step` < partitions, so the sum fits u64 and the result fits u32.
                u32::try_from((u64::from(prev) + step) % u64::from(partitions))
                    .expect("invariant: a value below a u32 fits u32")
            }
            _ => u32::try_from(self.rng % u64::from(partitions))
                .expect("invariant: a value below a u32 fits u32"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Kafka's own vectors (`UtilsTest.testMurmur2` in apache/kafka's clients module).
    #[test]
    fn murmur2_matches_kafka() {
        for (key, expected) in [
            (&b"21"[..], -973_932_308),
            (b"foobar", -790_332_482),
            (b"a-little-bit-long-string", -985_981_536),
            (b"a-little-bit-longer-string", -1_486_304_829),
            (
                b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
                -58_897_971,
            ),
            (b"abc", 479_470_107),
        ] {
            assert_eq!(murmur2(key), expected, "{}", String::from_utf8_lossy(key));
        }
    }

    /// The partition is `toPositive(murmur2) % n`: a negative hash is masked, not negated.
    #[test]
    fn partition_for_key_masks_the_sign_bit() {
        // murmur2("21") = -973932308; & 0x7fffffff = 1173551340.
        assert_eq!(partition_for_key(b"21", 1), 0);
        assert_eq!(partition_for_key(b"21", 6), 1_173_551_340 % 6);
        assert_eq!(partition_for_key(b"abc", 7), 479_470_107 % 7);
        for n in 1..50 {
            assert!(partition_for_key(b"foobar", n) < n);
        }
    }

    /// Keyless messages stay on one partition for a batch's worth of bytes, then move to
    /// another; over many batches every partition gets some.
    #[test]
    fn sticky_partitions_fill_a_batch_then_move() {
        let mut s = StickyPartitioner::with_seed(4096, 7);
        let first = s.partition(6, 1000);
        for _ in 0..4 {
            // 1000 + 3 x 1000 = 4000 < 4096: the fifth message still fits the batch.
            assert_eq!(s.partition(6, 1000), first);
        }
        let second = s.partition(6, 1000);
        assert_ne!(second, first);
        let mut seen = [false; 6];
        for _ in 0..2000 {
            seen[s.partition(6, 1000) as usize] = true;
        }
        assert!(seen.iter().all(|&x| x), "{seen:?}");
        // Fewer partitions than the current one: chooses afresh, in range.
        assert!(s.partition(1, 10) == 0);
    }
}
