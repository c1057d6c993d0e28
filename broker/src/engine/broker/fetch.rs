//! Fetch in the broker engine: a consumer reads a topic's stabilized messages from the
//! master (docs/protocol.md "Fetch").
//!
//! ```text
//!   fetch(token, req, deadline_ms)
//!     from below the trim point ─────────────> Trimmed{first}
//!     messages at or past from in the window ─> Messages (at most max_messages, max_bytes)
//!     messages older than the window ────────> Command::FetchFromStore: the driver reads a
//!                                              voting store that holds them and answers
//!     from below where the topics are indexed > Command::FetchFromStore scanning the span
//!       (a state rebuilt at a checkpoint above    up to the index for the topic's messages
//!        the trim point)
//!     none yet, wait_ms left ────────────────> parked; woken when a message of the topic is
//!                                              applied, answered empty at its deadline
//!   the master leaves (any reason) ─────────> every parked fetch: NotMaster
//! ```
//!
//! Only stabilized events are ever served: the window holds what [`Engine`] applied.

use bytes::Bytes;
use quire_proto::{
    EventBody, EventKind, FetchRequest, FetchResponse, KafkaRecord, MessageEvent, MessageFormat,
    Offset, FRAME_BYTES_MAX, MESSAGES_PER_FRAME_MAX,
};

use super::{Command, Engine, RequestToken};
use crate::core::{SlotId, SlotLink};

/// Longest long-poll a fetch may ask for, in milliseconds.
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;
/// Fetches waiting for messages at once, at most; more are answered at once (empty).
pub const FETCH_WAITERS_MAX: usize = 4096;
/// Payload bytes one fetch response carries at most (it must fit in a frame).
pub const FETCH_BYTES_MAX: usize = FRAME_BYTES_MAX / 2;

/// The answer to a fetch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FetchReply {
    /// Messages (possibly none: the wait ran out).
    Messages(FetchResponse),
    /// `from` is below the trim point `first`: the events are gone.
    Trimmed {
        /// The offset asked for.
        from: Offset,
        /// The first offset a reader may ask for.
        first: Offset,
    },
    /// This broker is not (or no longer) a serving master.
    NotMaster,
    /// The messages are older than the window and no store can serve them now.
    Unavailable,
}

/// A fetch the master reads from a store: what the driver needs to read and answer it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreFetch {
    /// The voting store to read (connected, holding `offsets` as voter).
    pub source: SlotId,
    /// The request.
    pub req: FetchRequest,
    /// The topic's message offsets to serve, ascending (not empty unless `scan_through`).
    pub offsets: Vec<Offset>,
    /// `Some(last)`: this broker does not index the topic's offsets `req.from_offset..=last`
    /// (its state was rebuilt at a checkpoint above the trim point,
    /// [`crate::state::BrokerState::indexed_from`]): the read scans that span and serves
    /// every message of the topic in it.
    pub scan_through: Option<Offset>,
    /// Payload bytes the answer may carry.
    pub bytes_max: usize,
    /// The HWM to report.
    pub hwm: Option<Offset>,
    /// The trim point when the read was planned (a store that deleted the range since
    /// answers `Trimmed` from at least this).
    pub trim_point: Offset,
}

/// Events a store read for a [`StoreFetch`] asks for at most.
pub const STORE_FETCH_EVENTS_MAX: u32 = 4096;

impl StoreFetch {
    /// The store read to make: `(first offset, events)` — from the first wanted offset
    /// through the last, at most [`STORE_FETCH_EVENTS_MAX`] events.
    #[must_use]
    pub fn read_span(&self) -> (Offset, u32) {
        let first = self
            .offsets
            .first()
            .copied()
            .unwrap_or(self.req.from_offset);
        let last = self
            .scan_through
            .or_else(|| self.offsets.last().copied())
            .unwrap_or(first);
        let span = u32::try_from(last.0.saturating_sub(first.0).saturating_add(1))
            .unwrap_or(u32::MAX)
            .min(STORE_FETCH_EVENTS_MAX);
        (first, span)
    }

    /// The answer to the fetch from the store's read of [`StoreFetch::read_span`]:
    /// `first_offset` is the store's log start and `events` what it returned (durable
    /// entries from the span's first offset on). A read that came back empty with the log
    /// starting past the span — retention deleted the range since the fetch was planned —
    /// is answered `Trimmed`; otherwise the wanted topic messages among `events`, at most
    /// `bytes_max` payload bytes (always at least one), with `next_offset` past the last
    /// message returned or, if none, past the entries scanned.
    #[must_use]
    pub fn answer(&self, first_offset: Offset, events: &[quire_proto::Event]) -> FetchReply {
        let (first, span) = self.read_span();
        let last = Offset(first.0 + u64::from(span.max(1)) - 1);
        if events.is_empty() && first_offset > first {
            return FetchReply::Trimmed {
                from: self.req.from_offset,
                first: first_offset.max(self.trim_point),
            };
        }
        let mut gathered = Gathered::new(self.req.records, self.bytes_max);
        let mut scanned: Option<Offset> = None;
        // A scan (below the state's index) may cross a deletion of the topic: only what
        // follows the last one in the span read is served (the index path needs no such
        // care: applying the deletion emptied the topic's index).
        let after_delete = self
            .scan_through
            .and_then(|_| self.last_delete(events, last));
        for e in events {
            if after_delete.is_some_and(|d| e.offset <= d) {
                scanned = Some(e.offset);
                continue;
            }
            if e.offset > last {
                break;
            }
            scanned = Some(e.offset);
            let wanted = match self.scan_through {
                Some(_) => e.offset >= self.req.from_offset,
                None => self.offsets.binary_search(&e.offset).is_ok(),
            };
            if e.kind != EventKind::Message || !wanted {
                continue;
            }
            let Ok(EventBody::Message(msg)) = EventBody::decode(EventKind::Message, &e.payload)
            else {
                continue;
            };
            if self.scan_through.is_some() && msg.topic != self.req.topic {
                continue;
            }
            if !gathered.add(e.offset, msg) {
                break;
            }
        }
        let next_offset = gathered.messages.last().map_or_else(
            || {
                scanned
                    .map_or(self.req.from_offset, Offset::next)
                    .max(self.req.from_offset)
            },
            |(o, _)| o.next(),
        );
        FetchReply::Messages(gathered.into_response(self.hwm, next_offset))
    }

    /// The offset of the last deletion of the requested topic among `events` up to
    /// `last`, if any.
    fn last_delete(&self, events: &[quire_proto::Event], last: Offset) -> Option<Offset> {
        events
            .iter()
            .take_while(|e| e.offset <= last)
            .filter(|e| e.kind == EventKind::TopicAdmin)
            .filter(|e| {
                matches!(
                    EventBody::decode(EventKind::TopicAdmin, &e.payload),
                    Ok(EventBody::TopicAdmin(t))
                        if t.action == quire_proto::TopicAction::Delete && t.topic == self.req.topic
                )
            })
            .map(|e| e.offset)
            .last()
    }
}

/// The messages of a fetch answer, gathered in offset order within its byte bound.
struct Gathered {
    /// The request's [`FetchRequest::records`].
    records: bool,
    bytes_max: usize,
    bytes: usize,
    messages: Vec<(Offset, Bytes)>,
    formats: Vec<MessageFormat>,
}

impl Gathered {
    fn new(records: bool, bytes_max: usize) -> Gathered {
        Gathered {
            records,
            bytes_max,
            bytes: 0,
            messages: Vec::new(),
            formats: Vec::new(),
        }
    }

    /// Adds the message at `offset`, or returns `false` if it would take the answer past
    /// its byte bound (the first message is always added). A Kafka record is answered
    /// whole when the request asked for records, and as its value otherwise (a slice, no
    /// copy; a record that does not decode, which the listener never writes, whole).
    fn add(&mut self, offset: Offset, msg: MessageEvent) -> bool {
        let bytes = if msg.format == MessageFormat::Kafka && !self.records {
            KafkaRecord::value_of(&msg.message).unwrap_or(msg.message)
        } else {
            msg.message
        };
        if !self.messages.is_empty() && self.bytes + bytes.len() > self.bytes_max {
            return false;
        }
        self.bytes += bytes.len();
        self.messages.push((offset, bytes));
        if self.records {
            self.formats.push(msg.format);
        }
        true
    }

    fn into_response(self, hwm: Option<Offset>, next_offset: Offset) -> FetchResponse {
        FetchResponse {
            hwm,
            next_offset,
            messages: self.messages,
            formats: self.formats,
        }
    }
}

/// A fetch waiting for messages.
#[derive(Clone, Debug)]
pub(super) struct Parked {
    token: RequestToken,
    req: FetchRequest,
    deadline_ms: u64,
}

impl Engine {
    /// A fetch (`token`) that may wait until `received_ms + req.wait_ms` (bounded by
    /// [`FETCH_WAIT_MS_MAX`]). Answered through [`Command::FetchAnswer`] or
    /// [`Command::FetchFromStore`], at once or later.
    pub fn fetch(&mut self, token: RequestToken, req: FetchRequest, received_ms: u64, now_ms: u64) {
        self.at(now_ms);
        if !self.is_serving() {
            self.out.push(Command::FetchAnswer {
                token,
                reply: FetchReply::NotMaster,
            });
            return;
        }
        let deadline_ms = received_ms.saturating_add(u64::from(req.wait_ms.min(FETCH_WAIT_MS_MAX)));
        self.serve_fetch(token, req, deadline_ms, false);
    }

    /// Answers a fetch from the window, from a store, or parks it until messages arrive.
    fn serve_fetch(
        &mut self,
        token: RequestToken,
        req: FetchRequest,
        deadline_ms: u64,
        expired: bool,
    ) {
        if let Some(first) = self.trimmed_below(req.from_offset) {
            self.out.push(Command::FetchAnswer {
                token,
                reply: FetchReply::Trimmed {
                    from: req.from_offset,
                    first,
                },
            });
            return;
        }
        let hwm = match self.master_core() {
            Some(core) => core.hwm(),
            None => self.state.applied(),
        };
        let indexed_from = self.state.indexed_from();
        if req.from_offset < indexed_from {
            // Not indexed here (rebuilt at a checkpoint above the trim point): scan the
            // stores' log up to the index.
            let bytes_max = (req.max_bytes as usize).clamp(1, FETCH_BYTES_MAX);
            let through = Offset(indexed_from.0 - 1);
            self.fetch_from_store(token, req, Vec::new(), Some(through), bytes_max, hwm);
            return;
        }
        let max_messages = (req.max_messages as usize).clamp(1, MESSAGES_PER_FRAME_MAX);
        let offsets = self
            .state
            .topic_offsets(&req.topic, req.from_offset, max_messages);
        if offsets.is_empty() {
            if !expired && deadline_ms > self.now_ms && self.parked.len() < FETCH_WAITERS_MAX {
                self.parked.push(Parked {
                    token,
                    req,
                    deadline_ms,
                });
                return;
            }
            let next = req
                .from_offset
                .max(self.state.applied().map_or(Offset::ZERO, Offset::next));
            self.out.push(Command::FetchAnswer {
                token,
                reply: FetchReply::Messages(FetchResponse {
                    formats: Vec::new(),
                    hwm,
                    next_offset: next,
                    messages: Vec::new(),
                }),
            });
            return;
        }
        let bytes_max = (req.max_bytes as usize).clamp(1, FETCH_BYTES_MAX);
        let mut gathered = Gathered::new(req.records, bytes_max);
        let mut missed = false;
        for &o in &offsets {
            let Some(e) = self.recent.get(o) else {
                missed = true;
                break;
            };
            let Ok(EventBody::Message(msg)) = EventBody::decode(EventKind::Message, &e.payload)
            else {
                continue;
            };
            if !gathered.add(o, msg) {
                break;
            }
        }
        if gathered.messages.is_empty() && missed {
            self.fetch_from_store(token, req, offsets, None, bytes_max, hwm);
            return;
        }
        let next_offset = gathered
            .messages
            .last()
            .map_or(req.from_offset, |(o, _)| o.next());
        self.out.push(Command::FetchAnswer {
            token,
            reply: FetchReply::Messages(gathered.into_response(hwm, next_offset)),
        });
    }

    /// Plans a read of offsets older than the window from a voting store that holds them:
    /// `offsets` (the topic's, indexed) or, with `scan_through`, every offset from the
    /// fetch's first through it.
    fn fetch_from_store(
        &mut self,
        token: RequestToken,
        req: FetchRequest,
        offsets: Vec<Offset>,
        scan_through: Option<Offset>,
        bytes_max: usize,
        hwm: Option<Offset>,
    ) {
        let Some(first) = scan_through.or_else(|| offsets.first().copied()) else {
            return;
        };
        // The span the store read covers (StoreFetch::read_span): a store with a record
        // of it known damaged is passed over.
        let span_first = offsets.first().copied().unwrap_or(req.from_offset);
        let span_last = scan_through
            .or_else(|| offsets.last().copied())
            .unwrap_or(span_first)
            .min(Offset(
                span_first
                    .0
                    .saturating_add(u64::from(STORE_FETCH_EVENTS_MAX) - 1),
            ));
        let source = self.master_core().and_then(|core| {
            (0..self.store_count).map(super::slot_of).find(|&s| {
                self.slot_up(s)
                    && core.slot_status(s).is_some_and(|st| {
                        st.link == SlotLink::Up && st.voted_through >= Some(first)
                    })
                    && !core.slot_corrupt_in(s, span_first, span_last)
            })
        });
        let Some(source) = source else {
            self.out.push(Command::FetchAnswer {
                token,
                reply: FetchReply::Unavailable,
            });
            return;
        };
        let trim_point = self.state.trim_point();
        self.out.push(Command::FetchFromStore {
            token,
            read: StoreFetch {
                source,
                req,
                offsets,
                scan_through,
                bytes_max,
                hwm,
                trim_point,
            },
        });
    }

    /// Serves again the parked fetches of `topics`.
    pub(super) fn wake_fetches<'a>(&mut self, topics: impl IntoIterator<Item = &'a String>) {
        if self.parked.is_empty() {
            return;
        }
        let topics: Vec<&String> = topics.into_iter().collect();
        let (woken, kept): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| topics.contains(&&p.req.topic));
        self.parked = kept;
        for p in woken {
            self.serve_fetch(p.token, p.req, p.deadline_ms, false);
        }
    }

    /// Answers the parked fetches whose wait ran out.
    pub(super) fn expire_fetches(&mut self) {
        let now = self.now_ms;
        if self.parked.iter().all(|p| p.deadline_ms > now) {
            return;
        }
        let (due, kept): (Vec<Parked>, Vec<Parked>) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| p.deadline_ms <= now);
        self.parked = kept;
        for p in due {
            self.serve_fetch(p.token, p.req, p.deadline_ms, true);
        }
    }

    /// The master left: every parked fetch is answered `NotMaster`.
    pub(super) fn refuse_parked_fetches(&mut self) {
        for p in std::mem::take(&mut self.parked) {
            self.out.push(Command::FetchAnswer {
                token: p.token,
                reply: FetchReply::NotMaster,
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::BytesMut;
    use quire_proto::{encode_message_event, Epoch};

    use super::*;

    /// Events `0..n`: messages alternating between topics "a" (even offsets) and "b".
    fn log(n: u64) -> Vec<quire_proto::Event> {
        (0..n)
            .map(|o| {
                let topic = if o % 2 == 0 { "a" } else { "b" };
                let mut payload = BytesMut::new();
                encode_message_event(topic, 0, 0, format!("m{o}").as_bytes(), &mut payload)
                    .expect("encodes");
                quire_proto::Event {
                    epoch: Epoch(1),
                    offset: Offset(o),
                    kind: EventKind::Message,
                    payload: payload.freeze().into(),
                }
            })
            .collect()
    }

    fn plan(from: u64, offsets: &[u64], scan_through: Option<u64>) -> StoreFetch {
        StoreFetch {
            source: SlotId(0),
            req: FetchRequest {
                records: false,
                topic: "a".to_owned(),
                from_offset: Offset(from),
                max_messages: 100,
                max_bytes: 1 << 20,
                wait_ms: 0,
            },
            offsets: offsets.iter().copied().map(Offset).collect(),
            scan_through: scan_through.map(Offset),
            bytes_max: 1 << 20,
            hwm: Some(Offset(20)),
            trim_point: Offset(2),
        }
    }

    fn served(reply: &FetchReply) -> (Vec<u64>, u64) {
        let FetchReply::Messages(m) = reply else {
            panic!("{reply:?}")
        };
        (
            m.messages.iter().map(|(o, _)| o.0).collect(),
            m.next_offset.0,
        )
    }

    #[test]
    fn an_indexed_read_serves_exactly_the_offsets_planned() {
        let f = plan(3, &[4, 8], None);
        assert_eq!(f.read_span(), (Offset(4), 5));
        let events = log(20);
        let reply = f.answer(Offset::ZERO, &events[4..9]);
        assert_eq!(served(&reply), (vec![4, 8], 9));
    }

    #[test]
    fn a_scan_serves_every_message_of_the_topic_up_to_the_index() {
        // Rebuilt at a checkpoint at 10 above the trim point 2: offsets 3..=9 are scanned.
        let f = plan(3, &[], Some(9));
        assert_eq!(f.read_span(), (Offset(3), 7));
        let events = log(20);
        let reply = f.answer(Offset::ZERO, &events[3..10]);
        assert_eq!(served(&reply), (vec![4, 6, 8], 9));
        // Nothing of the topic in the span: the consumer goes on past it.
        let f = plan(9, &[], Some(9));
        assert_eq!(
            served(&f.answer(Offset::ZERO, &events[9..10])),
            (vec![], 10)
        );
        // The store deleted the span since: trimmed, from at least the planned trim point.
        let reply = f.answer(Offset(12), &[]);
        assert_eq!(
            reply,
            FetchReply::Trimmed {
                from: Offset(9),
                first: Offset(12)
            }
        );
    }

    /// A scan that crosses a deletion of the topic serves only what follows it (found by a
    /// break-it trial reading the code: a master rebuilt from a checkpoint would serve a
    /// deleted topic's old records).
    #[test]
    fn a_scan_serves_nothing_from_before_a_deletion_of_the_topic() {
        let mut events = log(20);
        let delete = |topic: &str| {
            quire_proto::EventBody::TopicAdmin(quire_proto::TopicAdminEvent {
                action: quire_proto::TopicAction::Delete,
                topic: topic.to_owned(),
            })
            .to_payload()
            .expect("encodes")
        };
        events[5].kind = EventKind::TopicAdmin;
        events[5].payload = delete("a");
        events[7].kind = EventKind::TopicAdmin;
        events[7].payload = delete("b");
        let f = plan(3, &[], Some(9));
        let reply = f.answer(Offset::ZERO, &events[3..10]);
        assert_eq!(
            served(&reply),
            (vec![6, 8], 9),
            "4 preceded the deletion at 5"
        );
    }
}
