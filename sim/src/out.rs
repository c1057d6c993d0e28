//! What a simulated process asks the world to do after handling one input: messages to
//! send, disk and timer completions to schedule, and what the checker should see.

use quire_broker::core::{Event, StoreIdentity};
use quire_proto::Epoch;

use crate::msg::{Msg, NodeId};

/// One message to send.
#[derive(Debug)]
pub(crate) struct Send {
    pub(crate) to: NodeId,
    /// The incarnation it must reach: `Some(boot)` for an answer (it goes back on the
    /// requester's connection), `None` for a request (whatever incarnation is up now).
    pub(crate) to_boot: Option<u32>,
    pub(crate) msg: Msg,
}

/// A completion the world schedules after a simulated latency.
#[derive(Debug)]
pub(crate) enum Later {
    /// A store's fdatasync covering what it submitted so far completes.
    Fsync {
        store: u8,
        boot: u32,
        generation: u64,
    },
    /// A broker's epoch counter write (temp file, fsync, rename, fsync dir) completes.
    CounterPersisted { broker: u8, boot: u32, counter: u64 },
    /// A broker's cluster-file write (temp file, fsync, rename, fsync dir) completes.
    IdentitiesPersisted {
        broker: u8,
        boot: u32,
        identities: Vec<Option<StoreIdentity>>,
        bootstrap_epoch: Option<Epoch>,
    },
}

/// Something the checker must see.
#[derive(Debug)]
pub(crate) enum Seen {
    /// A master stabilized these events (and acks their producers).
    Stabilized {
        broker: u8,
        boot: u32,
        epoch: Epoch,
        events: Vec<Event>,
    },
    /// A slave applied these stabilized events.
    Applied { broker: u8, events: Vec<Event> },
    /// A broker became master of `epoch`.
    BecameMaster { broker: u8, epoch: Epoch },
    /// A broker (incarnation `boot`) sends fences for `epoch`: the epoch is used.
    Fencing { broker: u8, boot: u32, epoch: Epoch },
    /// A store accepted an append from master `(broker, boot)` of `epoch` and will ack
    /// `through`; its accepted log holds an entry of `held` epoch there.
    AckClaim {
        store: u8,
        broker: u8,
        boot: u32,
        epoch: Epoch,
        through: quire_proto::Offset,
        held: Option<Epoch>,
    },
    /// A graceful handoff `broker` was asked for ended: `Ok` with the new master's epoch,
    /// or why it failed.
    HandoffDone {
        broker: u8,
        outcome: Result<Epoch, String>,
    },
    /// A free-form line for the trace.
    Note(String),
}

/// Everything one handler produced.
#[derive(Debug, Default)]
pub(crate) struct Out {
    pub(crate) sends: Vec<Send>,
    pub(crate) later: Vec<Later>,
    pub(crate) seen: Vec<Seen>,
}

impl Out {
    /// Queues a request to `to`'s current incarnation.
    pub(crate) fn request(&mut self, to: NodeId, msg: Msg) {
        self.sends.push(Send {
            to,
            to_boot: None,
            msg,
        });
    }

    /// Queues an answer to the incarnation `to_boot` of `to`.
    pub(crate) fn answer(&mut self, to: NodeId, to_boot: u32, msg: Msg) {
        self.sends.push(Send {
            to,
            to_boot: Some(to_boot),
            msg,
        });
    }
}
