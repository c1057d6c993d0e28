//! The shared vocabulary of DESIGN.md as newtypes.
//!
//! An [`Offset`] is a position in the *log* (an event index), never a byte location in a
//! file: the WAL calls that a `Position`. An [`Epoch`] is the term of one master.

use std::fmt;

/// Index of an event in the log. Offsets are contiguous and start at 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Offset(pub u64);

impl Offset {
    /// The first offset of every log.
    pub const ZERO: Offset = Offset(0);

    /// The offset right after this one.
    ///
    /// # Panics
    /// On overflow of `u64` (a log of 2^64 events cannot exist).
    #[must_use]
    pub fn next(self) -> Offset {
        Offset(
            self.0
                .checked_add(1)
                .expect("invariant: offsets never reach u64::MAX"),
        )
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Term of one master: strictly increasing across masters, unique per broker
/// (`counter << 16 | broker_id`, see [`Epoch::compose`]). Epoch 0 is "no master yet".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The epoch before any master existed.
    pub const ZERO: Epoch = Epoch(0);

    /// Builds the epoch `counter << 16 | broker_id`, unique to one broker.
    ///
    /// # Panics
    /// If `counter` does not fit in 48 bits.
    #[must_use]
    pub fn compose(counter: u64, broker: BrokerId) -> Epoch {
        assert!(
            counter < (1 << 48),
            "epoch counter {counter} exceeds 48 bits"
        );
        Epoch(counter << 16 | u64::from(broker.0))
    }

    /// The counter part (`self >> 16`).
    #[must_use]
    pub fn counter(self) -> u64 {
        self.0 >> 16
    }

    /// The broker that owns this epoch (the low 16 bits).
    #[must_use]
    pub fn broker(self) -> BrokerId {
        BrokerId((self.0 & 0xffff) as u16)
    }
}

impl fmt::Display for Epoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// `(epoch, offset)` of one log entry: what log matching compares (Raft §5.3) and what a
/// store reports as its last entry. `LogPosition { epoch: Epoch::ZERO, offset: None }`
/// style "empty log" is expressed by `Option<LogPosition>` at the use site.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LogPosition {
    /// Epoch the entry was written in.
    pub epoch: Epoch,
    /// Offset of the entry.
    pub offset: Offset,
}

impl LogPosition {
    /// Raft's "more up to date" order (§5.4.1): higher epoch first, then higher offset.
    #[must_use]
    pub fn up_to_date_key(self) -> (Epoch, Offset) {
        (self.epoch, self.offset)
    }
}

/// Which replicated log a frame is about: every frame's header carries one
/// (docs/protocol.md, "Frame header"). Each log has its own offsets, epochs, master, HWM
/// and promised epoch on every store (docs/partitions.md). Log 0 ([`LogId::ZERO`]) is the
/// log a cluster without partitions replicates; frames that name no log (metadata,
/// heartbeats, connection errors) carry it too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogId(pub u32);

impl LogId {
    /// The first log: the one every cluster has, and the only one served until partitions
    /// land (a request for another gets `ErrorCode::UnknownLog`).
    pub const ZERO: LogId = LogId(0);
}

impl fmt::Display for LogId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Identity of one store directory, created once by `quire-node init`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StoreId(pub u64);

/// Incarnation of a store directory: a new one each time the directory is created, so a
/// wiped and re-initialised store is told apart from the one that made promises.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Incarnation(pub u64);

/// Identity of one broker in the cluster (the low 16 bits of its epochs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BrokerId(pub u16);

/// What an event means to the broker. Stored as one byte in the WAL record header and on
/// the wire; the WAL itself never interprets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum EventKind {
    /// A producer's message to a topic.
    Message = 1,
    /// A durable consumer cursor commit.
    CursorCommit = 2,
    /// Topic creation or deletion.
    TopicAdmin = 3,
    /// The first event a new master appends in its epoch (DESIGN.md "Failover" step 4).
    EpochStart = 4,
    /// A retention trim point chosen by the master.
    Trim = 5,
    /// A user added, replaced or removed (`quire user`).
    UserAdmin = 6,
    /// An ACL entry added or removed (`quire acl`).
    AclAdmin = 7,
    /// A new voter set: one store added or removed (DESIGN.md "Membership changes").
    Config = 8,
}

impl EventKind {
    /// The kind for a stored or received byte, or `None` for a byte no kind uses.
    #[must_use]
    pub fn from_u8(byte: u8) -> Option<EventKind> {
        Some(match byte {
            1 => EventKind::Message,
            2 => EventKind::CursorCommit,
            3 => EventKind::TopicAdmin,
            4 => EventKind::EpochStart,
            5 => EventKind::Trim,
            6 => EventKind::UserAdmin,
            7 => EventKind::AclAdmin,
            8 => EventKind::Config,
            _ => return None,
        })
    }

    /// The byte stored for this kind.
    #[must_use]
    pub fn as_u8(self) -> u8 {
        self as u8
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn epoch_compose_round_trips() {
        let e = Epoch::compose(7, BrokerId(3));
        assert_eq!(e.counter(), 7);
        assert_eq!(e.broker(), BrokerId(3));
        assert!(Epoch::compose(8, BrokerId(0)) > Epoch::compose(7, BrokerId(65535)));
    }

    #[test]
    fn event_kind_round_trips() {
        for b in 0..=255u8 {
            if let Some(k) = EventKind::from_u8(b) {
                assert_eq!(k.as_u8(), b);
            }
        }
        assert_eq!(EventKind::from_u8(0), None);
    }
}
