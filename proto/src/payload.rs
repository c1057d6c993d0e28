//! [`Payload`]: an event's bytes, held as at most two shared chunks.
//!
//! A master broker builds a message event from a producer's message: the event's body is a
//! small header (version, topic, producer id, sequence, length: `event_body`'s Message
//! layout) followed by the message bytes. With the payload in two chunks the header is
//! written into a buffer of its own and the message bytes stay where the produce frame was
//! decoded: the broker never copies them. They are copied once, where they must be: into a
//! socket's vectored write when small ([`crate::INLINE_PAYLOAD_BYTES_MAX`]) and into a
//! store's O_DIRECT buffer.
//!
//! Everything that looks at a payload sees its bytes, not its chunks: equality, length, the wire encoding (one `u32` length, then the bytes) and the WAL record (one
//! CRC over the bytes) are the same however the bytes are split.

use std::fmt;

use bytes::{Bytes, BytesMut};

/// An event's payload: the bytes of `head` followed by the bytes of `tail`.
///
/// A payload decoded from a frame or read from the WAL is one chunk (`tail` empty), a
/// slice of that buffer. Cloning one clones two handles, never the bytes.
#[derive(Clone, Default)]
pub struct Payload {
    head: Bytes,
    tail: Bytes,
}

impl Payload {
    /// The empty payload.
    #[must_use]
    pub const fn new() -> Payload {
        Payload {
            head: Bytes::new(),
            tail: Bytes::new(),
        }
    }

    /// `head` then `tail`, kept as they are (no copy).
    #[must_use]
    pub fn chained(head: Bytes, tail: Bytes) -> Payload {
        if head.is_empty() {
            return Payload {
                head: tail,
                tail: Bytes::new(),
            };
        }
        Payload { head, tail }
    }

    /// Length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.head.len() + self.tail.len()
    }

    /// Whether the payload has no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The first chunk (all the bytes when the payload is one chunk).
    #[must_use]
    pub fn head(&self) -> &Bytes {
        &self.head
    }

    /// The second chunk (empty when the payload is one chunk).
    #[must_use]
    pub fn tail(&self) -> &Bytes {
        &self.tail
    }

    /// The two chunks, `head` first; their concatenation is the payload.
    #[must_use]
    pub fn chunks(&self) -> [&[u8]; 2] {
        [&self.head, &self.tail]
    }

    /// The bytes in one buffer: the first chunk's handle when there is one chunk (no copy),
    /// otherwise a new buffer with both (one copy).
    #[must_use]
    pub fn to_bytes(&self) -> Bytes {
        if self.tail.is_empty() {
            return self.head.clone();
        }
        let mut b = BytesMut::with_capacity(self.len());
        b.extend_from_slice(&self.head);
        b.extend_from_slice(&self.tail);
        b.freeze()
    }

    /// Whether the bytes equal `other`.
    fn eq_bytes(&self, other: &[u8]) -> bool {
        self.len() == other.len() && {
            let (a, b) = other.split_at(self.head.len());
            a == &self.head[..] && b == &self.tail[..]
        }
    }
}

impl PartialEq for Payload {
    fn eq(&self, other: &Payload) -> bool {
        if other.tail.is_empty() {
            return self.eq_bytes(&other.head);
        }
        if self.tail.is_empty() {
            return other.eq_bytes(&self.head);
        }
        self.len() == other.len() && self.to_bytes() == other.to_bytes()
    }
}

impl Eq for Payload {}

impl PartialEq<[u8]> for Payload {
    fn eq(&self, other: &[u8]) -> bool {
        self.eq_bytes(other)
    }
}

impl fmt::Debug for Payload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.to_bytes(), f)
    }
}

impl From<Bytes> for Payload {
    fn from(bytes: Bytes) -> Payload {
        Payload {
            head: bytes,
            tail: Bytes::new(),
        }
    }
}

impl From<BytesMut> for Payload {
    fn from(bytes: BytesMut) -> Payload {
        Payload::from(bytes.freeze())
    }
}

impl From<Vec<u8>> for Payload {
    fn from(bytes: Vec<u8>) -> Payload {
        Payload::from(Bytes::from(bytes))
    }
}

impl From<&'static [u8]> for Payload {
    fn from(bytes: &'static [u8]) -> Payload {
        Payload::from(Bytes::from_static(bytes))
    }
}

impl From<&'static str> for Payload {
    fn from(text: &'static str) -> Payload {
        Payload::from(Bytes::from_static(text.as_bytes()))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn an_empty_head_leaves_one_chunk() {
        let p = Payload::chained(Bytes::new(), Bytes::from_static(b"abc"));
        assert_eq!(p.head(), &Bytes::from_static(b"abc"));
        assert!(p.tail().is_empty());
    }

    #[test]
    fn one_chunk_is_handed_out_without_a_copy() {
        let b = Bytes::from(vec![1u8; 100]);
        let p = Payload::from(b.clone());
        assert_eq!(p.to_bytes().as_ptr(), b.as_ptr());
    }

    proptest! {
        /// However the bytes are split, payloads compare and flatten as their bytes.
        #[test]
        fn the_split_is_invisible(
            bytes in proptest::collection::vec(any::<u8>(), 0..64),
            a in 0usize..64,
            b in 0usize..64,
        ) {
            let all = Bytes::from(bytes.clone());
            let (a, b) = (a.min(all.len()), b.min(all.len()));
            let x = Payload::chained(all.slice(..a), all.slice(a..));
            let y = Payload::chained(all.slice(..b), all.slice(b..));
            prop_assert_eq!(&x, &y);
            prop_assert_eq!(x.len(), bytes.len());
            prop_assert_eq!(&x.to_bytes()[..], &bytes[..]);
            prop_assert!(x == bytes[..]);
            if !bytes.is_empty() {
                let mut other = bytes.clone();
                other[0] ^= 1;
                prop_assert_ne!(x, Payload::from(other));
            }
        }
    }
}
