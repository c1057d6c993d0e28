//! How `quire wal dump --payload hex|utf8` shows a record's payload when it is one of the
//! broker's events: decoded with `quire_proto::EventBody::decode` (the one definition of
//! those bytes), each field apart, the message itself in the chosen mode.
//!
//! A store's record payload is an event body, not the producer's message: a message event
//! starts with a version byte, the topic (`u16` length + UTF-8), the producer id and
//! sequence (`u64` each) and the message length (`u32`) before the message bytes
//! (proto/src/event_body.rs). Printed as UTF-8 whole, that header shows up as garbage in
//! front of the text. This module owns only the presentation; it never parses bytes itself.
//!
//! # JSON (`event` of a dump record)
//! An object tagged by `kind_name` (the names of the record's own `kind_name`):
//!
//! | `kind_name` | other fields |
//! | --- | --- |
//! | `message` | `topic`, `producer_id` (16 hex digits; 0: none), `sequence`, `message_bytes`, `message` (hex, or UTF-8 with invalid sequences as U+FFFD), `message_hex` (utf8 mode, only when the message is not valid UTF-8: its exact bytes) |
//! | `cursor_commit` | `topic`, `cursor`, `cursor_offset` (the next offset the consumer wants) |
//! | `topic_admin` | `action` (`create`, `delete`), `topic` |
//! | `epoch_start` | `epoch`, `broker`, `voters` (`[{store_index, store_id, incarnation}]`, ids in 16 hex digits) |
//! | `trim` | `before`, `checkpoint` (`null`, or counts: `trim_point`, `epoch`, `master`, `voters`, `topics`, `cursors`, `producers`, `users`, `acls`) |
//! | `user_admin` | `action` (`set`, `remove`), `user`, `iterations` (`null` for a removal); never the credential's keys or salt |
//! | `acl_admin` | `action` (`add`, `remove`), `principal`, `operation`, `topic` |
//!
//! The raw `payload` of a user event, and of a trim event with a checkpoint (or a part of
//! one), is not printed in any mode: it may hold users' SCRAM keys.

use std::io::{self, Write};

use bytes::Bytes;
use quire_proto::{AclAction, EventBody, EventKind, TopicAction};
use serde::Serialize;

use super::dump::{hex, PayloadMode};

/// An event body, decoded for printing; see the module docs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind_name", rename_all = "snake_case")]
pub enum DecodedEvent {
    /// A producer's message.
    Message {
        /// Topic name.
        topic: String,
        /// Idempotent producer id, 16 hex digits (all zeros: none).
        producer_id: String,
        /// The message's sequence number for that producer.
        sequence: u64,
        /// Length of the message, bytes.
        message_bytes: usize,
        /// The message: lowercase hex, or UTF-8 (invalid sequences as U+FFFD).
        message: String,
        /// UTF-8 mode, message not valid UTF-8: its exact bytes in lowercase hex.
        #[serde(skip_serializing_if = "Option::is_none")]
        message_hex: Option<String>,
    },
    /// A durable consumer cursor.
    CursorCommit {
        /// Topic name.
        topic: String,
        /// Cursor name.
        cursor: String,
        /// The next log offset the consumer wants.
        cursor_offset: u64,
    },
    /// Topic creation or deletion.
    TopicAdmin {
        /// `"create"` or `"delete"`.
        action: &'static str,
        /// Topic name.
        topic: String,
    },
    /// The first event of a master's epoch.
    EpochStart {
        /// The new master's epoch.
        epoch: u64,
        /// The new master's broker id.
        broker: u16,
        /// The voting stores.
        voters: Vec<DecodedVoter>,
    },
    /// A new voter set (a membership change).
    Config {
        /// The voting stores from this event on.
        voters: Vec<DecodedVoter>,
    },
    /// A user added, replaced or removed (the credential's keys are never printed).
    UserAdmin {
        /// `"set"` or `"remove"`.
        action: &'static str,
        /// The user's name.
        user: String,
        /// PBKDF2 iterations of the credential set (`None` for a removal).
        iterations: Option<u32>,
    },
    /// An ACL entry added or removed.
    AclAdmin {
        /// `"add"` or `"remove"`.
        action: &'static str,
        /// The entry's principal.
        principal: String,
        /// The operation it allows.
        operation: &'static str,
        /// The topic name or pattern.
        topic: String,
    },
    /// A retention trim point.
    Trim {
        /// Offsets below this may be discarded.
        before: u64,
        /// The broker-state checkpoint it carries, in counts.
        checkpoint: Option<CheckpointSummary>,
        /// The part of a checkpoint written in parts it carries.
        part: Option<PartSummary>,
    },
}

/// One part of a checkpoint written across several Trim events.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PartSummary {
    /// Its place, from 0.
    pub index: u32,
    /// Parts in the checkpoint.
    pub count: u32,
    /// Snapshot bytes this part carries.
    pub bytes: usize,
    /// Snapshot bytes of all parts together.
    pub snapshot_bytes: u64,
}

/// One voter of an epoch-start event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DecodedVoter {
    /// Position in the cluster's store list.
    pub store_index: u16,
    /// Store id, 16 hex digits.
    pub store_id: String,
    /// Incarnation, 16 hex digits.
    pub incarnation: String,
}

/// What a trim event's checkpoint holds, in counts (the whole snapshot is no use in a dump).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckpointSummary {
    /// The trim point the snapshot was taken at.
    pub trim_point: u64,
    /// Epoch of its last epoch-start event (0: none).
    pub epoch: u64,
    /// Its master's broker id, if any.
    pub master: Option<u16>,
    /// Voters.
    pub voters: usize,
    /// Topics.
    pub topics: usize,
    /// Durable cursors.
    pub cursors: usize,
    /// Idempotent producers.
    pub producers: usize,
    /// Users (names only are in the checkpoint's keys; none is printed).
    pub users: usize,
    /// ACL entries.
    pub acls: usize,
}

/// Decodes `payload` as the body of an event of kind `kind`, for printing in `mode`.
/// `Ok(None)` when `kind` is no event kind (a WAL truncation marker, an unknown byte) or
/// `mode` prints no payload.
///
/// # Errors
/// Why the payload is not a valid body of that kind (the record is then shown raw).
pub fn decode(kind: u8, payload: &[u8], mode: PayloadMode) -> Result<Option<DecodedEvent>, String> {
    if mode == PayloadMode::None {
        return Ok(None);
    }
    let Some(kind) = EventKind::from_u8(kind) else {
        return Ok(None);
    };
    let body = EventBody::decode(kind, &Bytes::copy_from_slice(payload).into())
        .map_err(|e| format!("not a {} event body: {e}", super::kind_name(kind.as_u8())))?;
    Ok(Some(match body {
        EventBody::Message(m) => {
            let (message, message_hex) = match mode {
                PayloadMode::Hex => (hex(&m.message), None),
                _ => match std::str::from_utf8(&m.message) {
                    Ok(text) => (text.to_owned(), None),
                    Err(_) => (
                        String::from_utf8_lossy(&m.message).into_owned(),
                        Some(hex(&m.message)),
                    ),
                },
            };
            DecodedEvent::Message {
                topic: m.topic,
                producer_id: format!("{:016x}", m.producer_id),
                sequence: m.sequence,
                message_bytes: m.message.len(),
                message,
                message_hex,
            }
        }
        EventBody::CursorCommit(c) => DecodedEvent::CursorCommit {
            topic: c.topic,
            cursor: c.cursor,
            cursor_offset: c.offset.0,
        },
        EventBody::TopicAdmin(t) => DecodedEvent::TopicAdmin {
            action: match t.action {
                TopicAction::Create => "create",
                TopicAction::Delete => "delete",
            },
            topic: t.topic,
        },
        EventBody::EpochStart(e) => DecodedEvent::EpochStart {
            epoch: e.epoch.0,
            broker: e.broker.0,
            voters: decoded_voters(&e.voters),
        },
        EventBody::Config(c) => DecodedEvent::Config {
            voters: decoded_voters(&c.voters),
        },
        EventBody::Trim(t) => DecodedEvent::Trim {
            before: t.before.0,
            checkpoint: t.checkpoint.map(|c| CheckpointSummary {
                trim_point: c.trim_point.0,
                epoch: c.epoch.0,
                master: c.master.map(|b| b.0),
                voters: c.voters.len(),
                topics: c.topics.len(),
                cursors: c.cursors.len(),
                producers: c.producers.len(),
                users: c.users.len(),
                acls: c.acls.len(),
            }),
            part: t.part.map(|p| PartSummary {
                index: p.index,
                count: p.count,
                bytes: p.bytes.len(),
                snapshot_bytes: p.snapshot_bytes,
            }),
        },
        EventBody::UserAdmin(u) => DecodedEvent::UserAdmin {
            action: if u.credential.is_some() {
                "set"
            } else {
                "remove"
            },
            user: u.user,
            iterations: u.credential.map(|c| c.iterations),
        },
        EventBody::AclAdmin(a) => DecodedEvent::AclAdmin {
            action: match a.action {
                AclAction::Add => "add",
                AclAction::Remove => "remove",
            },
            principal: a.entry.principal,
            operation: a.entry.operation.name(),
            topic: a.entry.topic,
        },
    }))
}

impl DecodedEvent {
    /// Writes the fields as `name=value` pairs separated by spaces, for the text dump:
    /// strings quoted with control characters escaped (`"a\nb"`, `"\u{1b}"`), a message
    /// in hex unquoted (`mode` is the mode it was decoded in). The kind is not repeated
    /// (the dump's KIND column has it).
    ///
    /// # Errors
    /// Any error of `out`.
    pub fn write_text(&self, out: &mut dyn Write, mode: PayloadMode) -> io::Result<()> {
        match self {
            DecodedEvent::Message {
                topic,
                producer_id,
                sequence,
                message_bytes,
                message,
                message_hex,
            } => {
                write!(
                    out,
                    "topic={topic:?} producer_id={producer_id} sequence={sequence} \
                     message_bytes={message_bytes} message="
                )?;
                if mode == PayloadMode::Hex {
                    write!(out, "{message}")
                } else {
                    write!(out, "{message:?}")?;
                    if let Some(h) = message_hex {
                        write!(out, " message_hex={h}")?;
                    }
                    Ok(())
                }
            }
            DecodedEvent::CursorCommit {
                topic,
                cursor,
                cursor_offset,
            } => write!(
                out,
                "topic={topic:?} cursor={cursor:?} cursor_offset={cursor_offset}"
            ),
            DecodedEvent::TopicAdmin { action, topic } => {
                write!(out, "action={action} topic={topic:?}")
            }
            DecodedEvent::UserAdmin {
                action,
                user,
                iterations,
            } => {
                write!(out, "action={action} user={user:?}")?;
                if let Some(i) = iterations {
                    write!(out, " iterations={i}")?;
                }
                Ok(())
            }
            DecodedEvent::AclAdmin {
                action,
                principal,
                operation,
                topic,
            } => write!(
                out,
                "action={action} principal={principal:?} operation={operation} topic={topic:?}"
            ),
            DecodedEvent::EpochStart {
                epoch,
                broker,
                voters,
            } => {
                write!(out, "epoch={epoch} broker={broker} ")?;
                write_voters(out, voters)
            }
            DecodedEvent::Config { voters } => write_voters(out, voters),
            DecodedEvent::Trim {
                before,
                checkpoint,
                part,
            } => {
                write!(out, "before={before} checkpoint=")?;
                match (checkpoint, part) {
                    (None, Some(p)) => write!(
                        out,
                        "part:{}/{},bytes:{},of:{}",
                        p.index + 1,
                        p.count,
                        p.bytes,
                        p.snapshot_bytes
                    ),
                    (None, None) => write!(out, "none"),
                    (Some(c), _) => write!(
                        out,
                        "trim_point:{},epoch:{},voters:{},topics:{},cursors:{},producers:{},users:{},acls:{}",
                        c.trim_point, c.epoch, c.voters, c.topics, c.cursors, c.producers, c.users, c.acls
                    ),
                }
            }
        }
    }
}

fn decoded_voters(voters: &[quire_proto::Voter]) -> Vec<DecodedVoter> {
    voters
        .iter()
        .map(|v| DecodedVoter {
            store_index: v.store_index,
            store_id: format!("{:016x}", v.store_id.0),
            incarnation: format!("{:016x}", v.incarnation.0),
        })
        .collect()
}

/// `voters=[index:store_id/incarnation,...]`.
fn write_voters(out: &mut dyn Write, voters: &[DecodedVoter]) -> io::Result<()> {
    write!(out, "voters=[")?;
    for (i, v) in voters.iter().enumerate() {
        let sep = if i == 0 { "" } else { "," };
        write!(
            out,
            "{sep}{}:{}/{}",
            v.store_index, v.store_id, v.incarnation
        )?;
    }
    write!(out, "]")
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use quire_proto::{
        encode_message_event, BrokerId, CursorCommitEvent, Epoch, EpochStartEvent, Incarnation,
        Offset, StoreId, TrimEvent, Voter,
    };

    use super::*;

    fn message_payload(topic: &str, producer_id: u64, sequence: u64, message: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        encode_message_event(topic, producer_id, sequence, message, &mut out).unwrap();
        out.to_vec()
    }

    fn text(event: &DecodedEvent, mode: PayloadMode) -> String {
        let mut out = Vec::new();
        event.write_text(&mut out, mode).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_message_event_shows_its_fields_and_the_text_alone() {
        let payload = message_payload("orders", 0xab, 7, b"hello\n\x1bworld");
        let event = decode(1, &payload, PayloadMode::Utf8).unwrap().unwrap();
        assert_eq!(
            event,
            DecodedEvent::Message {
                topic: "orders".into(),
                producer_id: "00000000000000ab".into(),
                sequence: 7,
                message_bytes: 12,
                message: "hello\n\u{1b}world".into(),
                message_hex: None,
            }
        );
        assert_eq!(
            text(&event, PayloadMode::Utf8),
            r#"topic="orders" producer_id=00000000000000ab sequence=7 message_bytes=12 message="hello\n\u{1b}world""#
        );
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind_name"], "message");
        assert_eq!(json["topic"], "orders");
        assert_eq!(json["message"], "hello\n\u{1b}world");
        assert!(json.get("message_hex").is_none(), "{json}");

        let event = decode(1, &payload, PayloadMode::Hex).unwrap().unwrap();
        assert_eq!(
            text(&event, PayloadMode::Hex),
            "topic=\"orders\" producer_id=00000000000000ab sequence=7 message_bytes=12 \
             message=68656c6c6f0a1b776f726c64"
        );
    }

    #[test]
    fn a_message_that_is_not_utf8_keeps_its_exact_bytes_in_hex() {
        let payload = message_payload("t", 0, 0, &[b'a', 0xff, b'b']);
        let event = decode(1, &payload, PayloadMode::Utf8).unwrap().unwrap();
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["message"], "a\u{fffd}b");
        assert_eq!(json["message_hex"], "61ff62");
        assert!(
            text(&event, PayloadMode::Utf8).ends_with(r#"message="a�b" message_hex=61ff62"#),
            "{}",
            text(&event, PayloadMode::Utf8)
        );
    }

    #[test]
    fn what_is_not_an_event_body_is_left_raw() {
        // Not the body of a message (its first byte is no known version).
        let err = decode(1, b"event-0001-xxx", PayloadMode::Utf8).unwrap_err();
        assert!(err.starts_with("not a message event body"), "{err}");
        // A message body with bytes after its end.
        let mut payload = message_payload("t", 0, 0, b"x");
        payload.push(0);
        assert!(decode(1, &payload, PayloadMode::Utf8).is_err());
        // Truncated.
        let payload = message_payload("t", 0, 0, b"hello");
        assert!(decode(1, &payload[..payload.len() - 1], PayloadMode::Utf8).is_err());
        // The WAL's truncation marker and unknown kinds are not events; no payload mode,
        // nothing to decode.
        assert_eq!(decode(0xFF, b"", PayloadMode::Utf8), Ok(None));
        assert_eq!(decode(77, b"\x01", PayloadMode::Utf8), Ok(None));
        let payload = message_payload("t", 0, 0, b"x");
        assert_eq!(decode(1, &payload, PayloadMode::None), Ok(None));
    }

    #[test]
    fn the_other_kinds_decode_too() {
        let body = EventBody::CursorCommit(CursorCommitEvent {
            topic: "t".into(),
            cursor: "reader".into(),
            offset: Offset(42),
        });
        let payload = body.to_payload().unwrap().to_bytes();
        let event = decode(2, &payload, PayloadMode::Utf8).unwrap().unwrap();
        assert_eq!(
            text(&event, PayloadMode::Utf8),
            r#"topic="t" cursor="reader" cursor_offset=42"#
        );
        assert_eq!(
            serde_json::to_value(&event).unwrap()["kind_name"],
            "cursor_commit"
        );

        let body = EventBody::EpochStart(EpochStartEvent {
            epoch: Epoch(0x2_0001),
            broker: BrokerId(1),
            voters: vec![Voter {
                store_index: 0,
                store_id: StoreId(0xc0ffee),
                incarnation: Incarnation(5),
            }],
        });
        let payload = body.to_payload().unwrap().to_bytes();
        let event = decode(4, &payload, PayloadMode::Hex).unwrap().unwrap();
        assert_eq!(
            text(&event, PayloadMode::Hex),
            "epoch=131073 broker=1 voters=[0:0000000000c0ffee/0000000000000005]"
        );

        let body = EventBody::Trim(TrimEvent::plain(Offset(100)));
        let event = decode(5, &body.to_payload().unwrap().to_bytes(), PayloadMode::Utf8)
            .unwrap()
            .unwrap();
        assert_eq!(
            text(&event, PayloadMode::Utf8),
            "before=100 checkpoint=none"
        );
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["kind_name"], "trim");
        assert!(json["checkpoint"].is_null(), "{json}");

        let body = EventBody::Trim(TrimEvent {
            before: Offset(100),
            checkpoint: None,
            part: Some(quire_proto::CheckpointPart {
                index: 1,
                count: 3,
                snapshot_bytes: 20,
                bytes: bytes::Bytes::from_static(b"seven b"),
            }),
        });
        let event = decode(5, &body.to_payload().unwrap().to_bytes(), PayloadMode::Utf8)
            .unwrap()
            .unwrap();
        assert_eq!(
            text(&event, PayloadMode::Utf8),
            "before=100 checkpoint=part:2/3,bytes:7,of:20"
        );
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["part"]["count"], 3, "{json}");
    }
}
