//! [`Consumer`]: reads one topic's stabilized messages in log order, across failovers.
//!
//! A consumer **subscribes** to a topic from a [`StartFrom`]: an offset, the beginning of
//! the log, its end (the master's high-water mark + 1: only messages stabilized after
//! subscribing), or a named durable **cursor** (its committed offset, or the beginning
//! if it was never committed). It then long-polls the master with `Fetch` requests
//! (each held by the broker up to [`ConsumerConfig::fetch_wait_ms`]) and follows each
//! answer's `next_offset`, so ranges of the log holding no message of the topic are not
//! scanned twice.
//!
//! A cursor's value is the **next log offset the consumer wants** (the wire's meaning of
//! `CommitCursorRequest.offset`): [`Consumer::commit`] stores [`Consumer::position`], the
//! offset after the last message handed out, and a consumer subscribing with that cursor
//! starts exactly there. Messages handed out after the last commit are delivered again by
//! a consumer that starts from the cursor (at-least-once across sessions).
//!
//! Retention: a fetch below the log's trim point fails with [`ClientError::Trimmed`]
//! naming the first offset still held — except for a subscription from
//! [`StartFrom::Beginning`] that has handed out nothing yet: it moves to that first offset
//! (Kafka's `auto.offset.reset=earliest`). A consumer that fell behind retention later, or
//! that started from an offset or a cursor, gets the error and decides (e.g. subscribe again
//! from [`ClientError::trimmed_first_offset`]).
//!
//! Failover: when a request fails with a retriable error (see
//! [`ClientError::disposition`]: connection lost, `NotMaster`, `Timeout`, ...) the
//! consumer finds the master again ([`crate::discovery`], following a `NotMaster` hint,
//! with backoff) and sends the same request again, for at most
//! [`ConsumerConfig::retry_timeout_ms`] per call. Fetching resumes at the offset after the
//! last message received, so within one [`Consumer`] no message is skipped and none is
//! delivered twice: the new master serves the same stabilized log.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::Bytes;
use quire_proto::{
    validate_cursor, validate_topic, Body, BrokerInfo, CommitCursorRequest, CursorRequest,
    FetchRequest, FetchResponse, FrameType, MetadataRequest, MetadataResponse, Offset,
};
use tokio::time::Instant;

use crate::discovery::{millis, Backoff, Discovery, DiscoveryConfig, MasterConn};
use crate::error::{ClientError, Disposition};

/// Longest long-poll the broker grants (`quire-broker` caps `wait_ms` at 30 s).
pub const FETCH_WAIT_MS_MAX: u32 = 30_000;

/// Margin added to the long-poll time for the connection's request timeout, so a held
/// fetch is answered before the client gives up on it.
const FETCH_TIMEOUT_MARGIN: Duration = Duration::from_secs(5);

/// Where a subscription starts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartFrom {
    /// The first offset still in the log (0, or the trim point once retention deleted the
    /// oldest events): every message of the topic still held.
    Beginning,
    /// After the master's high-water mark at subscription time: only messages stabilized
    /// later.
    End,
    /// This log offset.
    Offset(Offset),
    /// A durable cursor: its committed offset, or the beginning (as [`StartFrom::Beginning`])
    /// if never committed.
    /// [`Consumer::commit`] writes this cursor.
    Cursor(String),
}

/// Settings of a [`Consumer`]. Times in milliseconds.
#[derive(Clone, Debug)]
pub struct ConsumerConfig {
    /// Most messages one fetch asks for. Default 1024.
    pub fetch_max_messages: u32,
    /// Most message bytes one fetch asks for (past the first message). Default 1 MiB.
    pub fetch_max_bytes: u32,
    /// How long the broker may hold a fetch that finds nothing. 0 ..=
    /// [`FETCH_WAIT_MS_MAX`]; default 1000.
    pub fetch_wait_ms: u32,
    /// How long one call keeps retrying (finding the master again, backing off) before it
    /// fails with [`ClientError::RetriesExhausted`]. Default 60 000.
    pub retry_timeout_ms: u64,
    /// Discovery and connection bounds (the connection's request timeout is raised to at
    /// least `fetch_wait_ms` + 5 s).
    pub discovery: DiscoveryConfig,
}

impl Default for ConsumerConfig {
    fn default() -> Self {
        ConsumerConfig {
            fetch_max_messages: 1024,
            fetch_max_bytes: 1024 * 1024,
            fetch_wait_ms: 1_000,
            retry_timeout_ms: 60_000,
            discovery: DiscoveryConfig::default(),
        }
    }
}

impl ConsumerConfig {
    /// Checks the ranges documented on the fields.
    ///
    /// # Errors
    /// [`ClientError::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<(), ClientError> {
        if self.fetch_max_messages == 0 || self.fetch_max_bytes == 0 {
            return Err(ClientError::InvalidConfig(
                "fetch_max_messages and fetch_max_bytes must be above 0".to_owned(),
            ));
        }
        if self.fetch_wait_ms > FETCH_WAIT_MS_MAX {
            return Err(ClientError::InvalidConfig(format!(
                "fetch_wait_ms {} must be at most {FETCH_WAIT_MS_MAX}",
                self.fetch_wait_ms
            )));
        }
        if self.retry_timeout_ms == 0 {
            return Err(ClientError::InvalidConfig(
                "retry_timeout_ms must be above 0".to_owned(),
            ));
        }
        self.discovery.validate()
    }
}

/// One message as a consumer receives it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    /// Its log offset.
    pub offset: Offset,
    /// Its bytes.
    pub payload: Bytes,
}

/// Requests to whichever broker is the master, retried across failovers.
#[derive(Debug)]
pub(crate) struct MasterLink {
    discovery: Discovery,
    master: Option<MasterConn>,
    backoff: Backoff,
    retry_timeout: Duration,
}

impl MasterLink {
    pub(crate) fn new(discovery: Discovery, retry_timeout: Duration) -> MasterLink {
        MasterLink {
            backoff: discovery.config().backoff(),
            discovery,
            master: None,
            retry_timeout,
        }
    }

    pub(crate) fn master(&self) -> Option<&BrokerInfo> {
        self.master.as_ref().map(|m| &m.master)
    }

    /// Sends `body` to the master and returns the answer's body (never an
    /// `ErrorResponse`), finding the master again and resending on retriable errors for at
    /// most the retry timeout.
    ///
    /// # Errors
    /// A fatal error at once; [`ClientError::RetriesExhausted`] with the last retriable
    /// one.
    pub(crate) async fn request(
        &mut self,
        op: &'static str,
        body: Body,
    ) -> Result<Body, ClientError> {
        let start = Instant::now();
        let deadline = start + self.retry_timeout;
        let mut hint: Option<BrokerInfo> = None;
        let mut attempts = 0u32;
        loop {
            attempts += 1;
            let error = match self.connected(hint.take()).await {
                Err(e) => e,
                Ok(m) => match m.client.request(body.clone()).await {
                    Ok(frame) => match frame.body {
                        Body::ErrorResponse(e) => ClientError::Remote(Box::new(e)),
                        other => {
                            self.backoff.reset();
                            return Ok(other);
                        }
                    },
                    Err(e) => e,
                },
            };
            match error.disposition() {
                Disposition::Fatal => return Err(error),
                Disposition::Retry { hint: h } => {
                    tracing::debug!(op, %error, "retrying against the master found anew");
                    self.master = None;
                    hint = h;
                }
            }
            let wait = self.backoff.next_delay();
            if Instant::now() + wait >= deadline {
                return Err(ClientError::RetriesExhausted {
                    op,
                    attempts,
                    elapsed_ms: millis(start.elapsed()),
                    last: Box::new(error),
                });
            }
            tokio::time::sleep(wait).await;
        }
    }

    async fn connected(&mut self, hint: Option<BrokerInfo>) -> Result<&MasterConn, ClientError> {
        if self.master.is_none() {
            let m = self.discovery.find_master_once(hint).await?;
            tracing::debug!(master = m.master.id.0, addr = %m.master.addr, "consuming from the master");
            self.master = Some(m);
        }
        self.master
            .as_ref()
            .ok_or_else(|| ClientError::InvalidRequest("no master".to_owned()))
    }
}

/// A subscription to one topic; see the module docs.
#[derive(Debug)]
pub struct Consumer {
    link: MasterLink,
    topic: String,
    cursor: Option<String>,
    config: ConsumerConfig,
    /// Where the next fetch starts.
    fetch_offset: Offset,
    /// Fetched, not yet handed out; offsets increasing, all below `fetch_offset`.
    buffered: VecDeque<Message>,
    /// Started from [`StartFrom::Beginning`] and nothing fetched yet: a `Trimmed` answer
    /// moves the position to the first offset held instead of failing.
    reset_on_trimmed: bool,
}

impl Consumer {
    /// Subscribes to `topic` from `start`, finding the master among `brokers`.
    ///
    /// # Errors
    /// [`ClientError::InvalidRequest`] for a bad topic or cursor name,
    /// [`ClientError::InvalidConfig`], and the errors of the first request (`Metadata`
    /// for [`StartFrom::End`], the cursor lookup for [`StartFrom::Cursor`]), including
    /// [`ClientError::RetriesExhausted`] when no master answers in time.
    pub async fn subscribe<I, S>(
        brokers: I,
        topic: &str,
        start: StartFrom,
        config: ConsumerConfig,
    ) -> Result<Consumer, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        validate_topic(topic).map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        if let StartFrom::Cursor(c) = &start {
            validate_cursor(c).map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        }
        config.validate()?;
        let mut discovery_config = config.discovery.clone();
        let needed = Duration::from_millis(u64::from(config.fetch_wait_ms)) + FETCH_TIMEOUT_MARGIN;
        discovery_config.conn.request_timeout = discovery_config.conn.request_timeout.max(needed);
        let discovery = Discovery::new(brokers, discovery_config)?;
        let mut link = MasterLink::new(discovery, Duration::from_millis(config.retry_timeout_ms));
        let mut reset_on_trimmed = start == StartFrom::Beginning;
        let (fetch_offset, cursor) = match start {
            StartFrom::Beginning => (Offset::ZERO, None),
            StartFrom::Offset(o) => (o, None),
            StartFrom::End => {
                let m = metadata(&mut link).await?;
                (m.hwm.map_or(Offset::ZERO, Offset::next), None)
            }
            StartFrom::Cursor(name) => {
                let body = link
                    .request(
                        "cursor lookup",
                        CursorRequest {
                            topic: topic.to_owned(),
                            cursor: name.clone(),
                        }
                        .into(),
                    )
                    .await?;
                match body {
                    Body::CursorResponse(r) => {
                        // A cursor never committed starts at the beginning, like Beginning.
                        reset_on_trimmed = r.offset.is_none();
                        (r.offset.unwrap_or(Offset::ZERO), Some(name))
                    }
                    other => {
                        return Err(ClientError::UnexpectedResponse {
                            request: FrameType::CursorRequest,
                            response: other.frame_type(),
                        })
                    }
                }
            }
        };
        tracing::debug!(topic, from = %fetch_offset, "subscribed");
        Ok(Consumer {
            link,
            topic: topic.to_owned(),
            cursor,
            config,
            fetch_offset,
            buffered: VecDeque::new(),
            reset_on_trimmed,
        })
    }

    /// The topic.
    #[must_use]
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The cursor this subscription started from and [`Consumer::commit`] writes, if any.
    #[must_use]
    pub fn cursor(&self) -> Option<&str> {
        self.cursor.as_deref()
    }

    /// The offset after the last message handed out: where a consumer started from a
    /// commit of it would begin.
    #[must_use]
    pub fn position(&self) -> Offset {
        self.buffered
            .front()
            .map_or(self.fetch_offset, |m| m.offset)
    }

    /// The master of the last successful request, if connected.
    #[must_use]
    pub fn master(&self) -> Option<&BrokerInfo> {
        self.link.master()
    }

    /// The messages already fetched, or else those of one fetch (which the broker may hold
    /// up to `fetch_wait_ms`; empty when none arrived). In offset order; each message is
    /// handed out once.
    ///
    /// # Errors
    /// [`ClientError::Trimmed`] when retention deleted the position (see the module docs for
    /// the beginning's exception); another fatal error, or
    /// [`ClientError::RetriesExhausted`] when the master could not be
    /// reached within the retry timeout. The position is unchanged by a failed call.
    pub async fn poll(&mut self) -> Result<Vec<Message>, ClientError> {
        if self.buffered.is_empty() {
            self.fetch().await?;
        }
        Ok(self.buffered.drain(..).collect())
    }

    /// The next message, waiting for one as long as it takes (each fetch bounded).
    ///
    /// # Errors
    /// As [`Consumer::poll`].
    pub async fn recv(&mut self) -> Result<Message, ClientError> {
        loop {
            if let Some(m) = self.buffered.pop_front() {
                return Ok(m);
            }
            self.fetch().await?;
        }
    }

    /// The next message, or `None` if none arrived within `wait` (fetches in progress
    /// at the deadline are finished first: the call can take up to one long-poll more).
    ///
    /// # Errors
    /// As [`Consumer::poll`].
    pub async fn recv_timeout(&mut self, wait: Duration) -> Result<Option<Message>, ClientError> {
        let deadline = Instant::now() + wait;
        loop {
            if let Some(m) = self.buffered.pop_front() {
                return Ok(Some(m));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            self.fetch().await?;
        }
    }

    /// Commits [`Consumer::position`] to this subscription's cursor; returns once the
    /// commit is stabilized.
    ///
    /// # Errors
    /// [`ClientError::InvalidRequest`] if the subscription has no cursor; otherwise as
    /// [`Consumer::commit_cursor`].
    pub async fn commit(&mut self) -> Result<(), ClientError> {
        let Some(cursor) = self.cursor.clone() else {
            return Err(ClientError::InvalidRequest(
                "this consumer was not started from a cursor; use commit_cursor".to_owned(),
            ));
        };
        let offset = self.position();
        self.commit_cursor(&cursor, offset).await
    }

    /// Durably sets `cursor` of this topic to `offset` (the next offset wanted); returns
    /// once the commit is stabilized. Retried across failovers like a fetch (setting a
    /// cursor twice to one value is harmless).
    ///
    /// # Errors
    /// [`ClientError::InvalidRequest`] for a bad cursor name; a fatal broker error
    /// ([`ClientError::Remote`]); [`ClientError::RetriesExhausted`].
    pub async fn commit_cursor(&mut self, cursor: &str, offset: Offset) -> Result<(), ClientError> {
        validate_cursor(cursor).map_err(|e| ClientError::InvalidRequest(e.to_string()))?;
        let body = self
            .link
            .request(
                "commit cursor",
                CommitCursorRequest {
                    topic: self.topic.clone(),
                    cursor: cursor.to_owned(),
                    offset,
                }
                .into(),
            )
            .await?;
        match body {
            Body::CommitCursorResponse(_) => Ok(()),
            other => Err(ClientError::UnexpectedResponse {
                request: FrameType::CommitCursorRequest,
                response: other.frame_type(),
            }),
        }
    }

    async fn fetch(&mut self) -> Result<(), ClientError> {
        let answer = self
            .link
            .request(
                "fetch",
                FetchRequest {
                    records: false,
                    topic: self.topic.clone(),
                    from_offset: self.fetch_offset,
                    max_messages: self.config.fetch_max_messages,
                    max_bytes: self.config.fetch_max_bytes,
                    wait_ms: self.config.fetch_wait_ms,
                }
                .into(),
            )
            .await;
        let body = match answer {
            Ok(body) => body,
            Err(ClientError::Remote(e)) => {
                let e = ClientError::from_read_error(self.fetch_offset, *e);
                return match e {
                    ClientError::Trimmed { first_offset, .. }
                        if self.reset_on_trimmed && first_offset > self.fetch_offset =>
                    {
                        tracing::info!(topic = %self.topic, from = %self.fetch_offset, %first_offset, "the beginning of the log was trimmed: starting at the first offset held");
                        self.fetch_offset = first_offset;
                        Ok(())
                    }
                    e => Err(e),
                };
            }
            Err(e) => return Err(e),
        };
        match body {
            Body::FetchResponse(r) => {
                self.fetch_offset = accept_fetch(self.fetch_offset, r, &mut self.buffered);
                if !self.buffered.is_empty() {
                    self.reset_on_trimmed = false;
                }
                Ok(())
            }
            other => Err(ClientError::UnexpectedResponse {
                request: FrameType::FetchRequest,
                response: other.frame_type(),
            }),
        }
    }
}

/// Takes a fetch answer for a fetch from `from`: appends its messages at offsets `>= from`
/// in increasing order to `out` (dropping, with a warning, any a faulty broker sent
/// below or out of order) and returns where the next fetch starts — never below `from`
/// or the last message taken + 1.
pub(crate) fn accept_fetch(from: Offset, r: FetchResponse, out: &mut VecDeque<Message>) -> Offset {
    let mut next = from;
    for (offset, payload) in r.messages {
        if offset < next {
            tracing::warn!(%offset, expected = %next, "fetch answer holds a message below the fetch position: dropped");
            continue;
        }
        next = offset.next();
        out.push_back(Message { offset, payload });
    }
    next.max(r.next_offset)
}

async fn metadata(link: &mut MasterLink) -> Result<MetadataResponse, ClientError> {
    match link
        .request("metadata", MetadataRequest::default().into())
        .await?
    {
        Body::MetadataResponse(m) => Ok(m),
        other => Err(ClientError::UnexpectedResponse {
            request: FrameType::MetadataRequest,
            response: other.frame_type(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msgs(offsets: &[u64]) -> Vec<(Offset, Bytes)> {
        offsets
            .iter()
            .map(|&o| (Offset(o), Bytes::from(format!("m{o}"))))
            .collect()
    }

    #[test]
    fn fetch_follows_next_offset_and_never_goes_back() {
        let mut out = VecDeque::new();
        // Messages at 5 and 9; the broker scanned through 20.
        let next = accept_fetch(
            Offset(3),
            FetchResponse {
                formats: Vec::new(),
                hwm: Some(Offset(20)),
                next_offset: Offset(21),
                messages: msgs(&[5, 9]),
            },
            &mut out,
        );
        assert_eq!(next, Offset(21));
        assert_eq!(
            out.iter().map(|m| m.offset.0).collect::<Vec<_>>(),
            vec![5, 9]
        );
        // An empty answer naming an older next_offset does not move the position back.
        let next = accept_fetch(
            Offset(21),
            FetchResponse {
                formats: Vec::new(),
                hwm: None,
                next_offset: Offset(4),
                messages: Vec::new(),
            },
            &mut out,
        );
        assert_eq!(next, Offset(21));
    }

    #[test]
    fn fetch_drops_messages_below_the_position_or_out_of_order() {
        let mut out = VecDeque::new();
        let next = accept_fetch(
            Offset(10),
            FetchResponse {
                formats: Vec::new(),
                hwm: None,
                // A faulty answer: 8 is below the position, 12 comes after 14.
                next_offset: Offset(0),
                messages: msgs(&[8, 10, 14, 12, 15]),
            },
            &mut out,
        );
        assert_eq!(
            out.iter().map(|m| m.offset.0).collect::<Vec<_>>(),
            vec![10, 14, 15]
        );
        assert_eq!(next, Offset(16), "past the last message taken");
    }

    #[test]
    fn config_ranges_are_checked() {
        assert!(ConsumerConfig::default().validate().is_ok());
        let c = ConsumerConfig {
            fetch_wait_ms: FETCH_WAIT_MS_MAX + 1,
            ..ConsumerConfig::default()
        };
        assert!(matches!(c.validate(), Err(ClientError::InvalidConfig(_))));
        let c = ConsumerConfig {
            fetch_max_messages: 0,
            ..ConsumerConfig::default()
        };
        assert!(matches!(c.validate(), Err(ClientError::InvalidConfig(_))));
    }
}
