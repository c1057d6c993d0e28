//! The producer and consumer against small fake brokers on loopback: a test double for
//! the network peer (quire-proto frames on a Tokio listener, one shared in-memory log
//! with exact-batch idempotent dedup), scripted to fail the ways a real cluster does —
//! the master crashing after writing a batch but before answering, `NotMaster` with a
//! hint, `Timeout` answers for batches that were written, refusals, no broker at all.
//! The real brokers are exercised in `proc_client.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use quire_client::{
    ClientError, Consumer, ConsumerConfig, DiscoveryConfig, ProduceError, Producer, ProducerConfig,
    StartFrom,
};
use quire_proto::{
    decode, encode, Body, BrokerId, BrokerInfo, CommitCursorResponse, CursorResponse, Epoch,
    ErrorCode, ErrorResponse, FetchResponse, Frame, MetadataResponse, Offset, ProduceResponse,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// Bound of every test.
const TEST_BOUND: Duration = Duration::from_secs(60);

#[derive(Debug, Default)]
struct Log {
    /// `(topic, producer id, sequence, message)` at each offset.
    entries: Vec<(String, u64, u64, Bytes)>,
    /// Exact batches written: `(producer id, sequence) -> (base offset, count)`.
    batches: HashMap<(u64, u64), (u64, u32)>,
    /// Highest sequence written per producer.
    last_sequence: HashMap<u64, u64>,
    cursors: HashMap<(String, String), Offset>,
}

/// What one fake broker does besides serving.
#[derive(Clone, Debug, Default)]
struct Script {
    /// Write the batch, then crash without answering, at this produce request (counted
    /// from 1 on this broker); the other broker becomes master.
    crash_at_produce: Option<usize>,
    /// Write the batch but answer `Timeout` for the first this many produce requests.
    timeout_answers: usize,
    /// Answer produce requests with `NotMaster` naming this broker (and metadata names
    /// itself master: a stale view).
    not_master_hint: Option<u16>,
    /// Refuse messages longer than this with `MessageTooLarge`.
    message_bytes_max: Option<usize>,
}

#[derive(Debug)]
struct ClusterState {
    log: Log,
    master: u16,
    epoch: u64,
    brokers: Vec<BrokerInfo>,
    scripts: HashMap<u16, Script>,
    produce_counts: HashMap<u16, usize>,
    /// `(broker, producer id, sequence)` of every produce request received.
    produces: Vec<(u16, u64, u64)>,
    /// Produce requests whose sequence went backwards for a batch never written.
    order_violations: usize,
    fetches: HashMap<u16, usize>,
    /// Each broker's kill switch (closes its connections and its listener).
    kills: HashMap<u16, watch::Sender<bool>>,
}

type Shared = Arc<Mutex<ClusterState>>;

struct FakeBroker {
    id: u16,
    addr: String,
    kill: watch::Sender<bool>,
    accept: JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        let _ = self.kill.send(true);
        self.accept.abort();
    }
}

struct FakeCluster {
    state: Shared,
    brokers: Vec<FakeBroker>,
}

impl FakeCluster {
    async fn start(n: u16, scripts: HashMap<u16, Script>) -> FakeCluster {
        let mut listeners = Vec::new();
        let mut infos = Vec::new();
        for id in 1..=n {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            infos.push(BrokerInfo {
                id: BrokerId(id),
                addr: l.local_addr().unwrap().to_string(),
            });
            listeners.push((id, l));
        }
        let state = Arc::new(Mutex::new(ClusterState {
            log: Log::default(),
            master: 1,
            epoch: 1 << 16 | 1,
            brokers: infos.clone(),
            scripts,
            produce_counts: HashMap::new(),
            produces: Vec::new(),
            order_violations: 0,
            fetches: HashMap::new(),
            kills: HashMap::new(),
        }));
        let mut brokers = Vec::new();
        for ((id, l), info) in listeners.into_iter().zip(infos) {
            let (kill, killed) = watch::channel(false);
            state.lock().unwrap().kills.insert(id, kill.clone());
            let st = state.clone();
            let accept = tokio::spawn(async move {
                let mut k = killed.clone();
                loop {
                    tokio::select! {
                        a = l.accept() => {
                            let Ok((s, _)) = a else { return };
                            tokio::spawn(serve(id, s, st.clone(), killed.clone()));
                        }
                        _ = k.changed() => return,
                    }
                }
            });
            brokers.push(FakeBroker {
                id,
                addr: info.addr,
                kill,
                accept,
            });
        }
        FakeCluster { state, brokers }
    }

    fn addrs(&self) -> Vec<String> {
        self.brokers.iter().map(|b| b.addr.clone()).collect()
    }

    fn addr(&self, id: u16) -> String {
        self.brokers
            .iter()
            .find(|b| b.id == id)
            .unwrap()
            .addr
            .clone()
    }

    /// Kills broker `id` (connections closed, listener gone) and makes `next` master.
    fn crash(&self, id: u16, next: u16) {
        crash(&self.state, &self.brokers, id, next);
    }

    fn state(&self) -> std::sync::MutexGuard<'_, ClusterState> {
        self.state.lock().unwrap()
    }
}

fn crash(state: &Shared, brokers: &[FakeBroker], id: u16, next: u16) {
    {
        let mut st = state.lock().unwrap();
        st.master = next;
        st.epoch = ((st.epoch >> 16) + 1) << 16 | u64::from(next);
    }
    if let Some(b) = brokers.iter().find(|b| b.id == id) {
        let _ = b.kill.send(true);
        b.accept.abort();
    }
}

async fn serve(id: u16, mut s: TcpStream, st: Shared, mut killed: watch::Receiver<bool>) {
    let mut buf = BytesMut::new();
    loop {
        while let Ok(Some(frame)) = decode(&mut buf) {
            if *killed.borrow() {
                return;
            }
            let answer = handle(id, frame.body, &st);
            let Some((body, hold)) = answer else {
                // Crash now: this connection closes without an answer.
                return;
            };
            if let Some(hold) = hold {
                tokio::time::sleep(hold).await;
            }
            let mut out = BytesMut::new();
            encode(&Frame::new(frame.request_id, body), &mut out).unwrap();
            if s.write_all(&out).await.is_err() {
                return;
            }
        }
        tokio::select! {
            r = s.read_buf(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            _ = killed.changed() => return,
        }
    }
}

/// The answer to one request, and how long to hold it (an empty long-poll); `None`:
/// crash without answering.
fn handle(id: u16, body: Body, st: &Shared) -> Option<(Body, Option<Duration>)> {
    let mut g = st.lock().unwrap();
    let master = g.brokers.iter().find(|b| b.id.0 == g.master).cloned();
    let script = g.scripts.get(&id).cloned().unwrap_or_default();
    let is_master = g.master == id;
    let not_master = |g: &ClusterState| -> Body {
        ErrorResponse::not_master(Epoch(g.epoch), master.clone()).into()
    };
    let body: Body = match body {
        Body::MetadataRequest(_) => {
            let named = match script.not_master_hint {
                Some(_) => g.brokers.iter().find(|b| b.id.0 == id).cloned(),
                None => master.clone(),
            };
            MetadataResponse {
                topics: Vec::new(),
                epoch: Epoch(g.epoch),
                hwm: g.log.entries.len().checked_sub(1).map(|o| Offset(o as u64)),
                master: named,
                brokers: g.brokers.clone(),
                stores: Vec::new(),
                applied: None,
                kafka: None,
                ack_quorum: 1,
                change_pending: None,
            }
            .into()
        }
        Body::ProduceRequest(p) => {
            g.produces.push((id, p.producer_id, p.sequence));
            if let Some(h) = script.not_master_hint {
                let hint = g.brokers.iter().find(|b| b.id.0 == h).cloned();
                return Some((ErrorResponse::not_master(Epoch(g.epoch), hint).into(), None));
            }
            if !is_master {
                return Some((not_master(&g), None));
            }
            if let Some(max) = script.message_bytes_max {
                if p.messages.iter().any(|m| m.len() > max) {
                    return Some((
                        ErrorResponse::new(ErrorCode::MessageTooLarge, "too large").into(),
                        None,
                    ));
                }
            }
            let n = {
                let c = g.produce_counts.entry(id).or_default();
                *c += 1;
                *c
            };
            let count = p.messages.len() as u32;
            let answer: Body = match g.log.batches.get(&(p.producer_id, p.sequence)) {
                Some(&(base, c)) if c == count => ProduceResponse {
                    base_offset: Offset(base),
                    count,
                }
                .into(),
                Some(_) => ErrorResponse::new(ErrorCode::SequenceGap, "count differs").into(),
                None if g
                    .log
                    .last_sequence
                    .get(&p.producer_id)
                    .is_some_and(|&l| p.sequence <= l) =>
                {
                    g.order_violations += 1;
                    ErrorResponse::new(ErrorCode::SequenceGap, "sequence went back").into()
                }
                None => {
                    let base = g.log.entries.len() as u64;
                    for (i, m) in p.messages.iter().enumerate() {
                        g.log.entries.push((
                            p.topic.clone(),
                            p.producer_id,
                            p.sequence + i as u64,
                            m.clone(),
                        ));
                    }
                    g.log
                        .batches
                        .insert((p.producer_id, p.sequence), (base, count));
                    g.log
                        .last_sequence
                        .insert(p.producer_id, p.sequence + u64::from(count) - 1);
                    ProduceResponse {
                        base_offset: Offset(base),
                        count,
                    }
                    .into()
                }
            };
            if script.crash_at_produce == Some(n) {
                let next = g.brokers.iter().map(|b| b.id.0).find(|&b| b != id).unwrap();
                g.master = next;
                g.epoch = ((g.epoch >> 16) + 1) << 16 | u64::from(next);
                if let Some(k) = g.kills.get(&id) {
                    let _ = k.send(true);
                }
                return None;
            }
            if n <= script.timeout_answers {
                return Some((
                    ErrorResponse::new(ErrorCode::Timeout, "not stabilized in time").into(),
                    None,
                ));
            }
            answer
        }
        Body::FetchRequest(f) => {
            if !is_master {
                return Some((not_master(&g), None));
            }
            *g.fetches.entry(id).or_default() += 1;
            let from = f.from_offset.0 as usize;
            let mut messages = Vec::new();
            for (o, (t, _, _, m)) in g.log.entries.iter().enumerate().skip(from) {
                if messages.len() >= f.max_messages as usize {
                    break;
                }
                if *t == f.topic {
                    messages.push((Offset(o as u64), m.clone()));
                }
            }
            let next = messages
                .last()
                .map_or(g.log.entries.len().max(from) as u64, |(o, _)| o.0 + 1);
            let hwm = g.log.entries.len().checked_sub(1).map(|o| Offset(o as u64));
            let hold = messages
                .is_empty()
                .then(|| Duration::from_millis(u64::from(f.wait_ms).min(20)));
            return Some((
                FetchResponse {
                    formats: Vec::new(),
                    hwm,
                    next_offset: Offset(next),
                    messages,
                }
                .into(),
                hold,
            ));
        }
        Body::CommitCursorRequest(c) => {
            if !is_master {
                return Some((not_master(&g), None));
            }
            g.log.cursors.insert((c.topic, c.cursor), c.offset);
            CommitCursorResponse.into()
        }
        Body::CursorRequest(c) => {
            if !is_master {
                return Some((not_master(&g), None));
            }
            CursorResponse {
                offset: g.log.cursors.get(&(c.topic, c.cursor)).copied(),
            }
            .into()
        }
        other => ErrorResponse::new(
            ErrorCode::UnexpectedFrame,
            format!("{:?}", other.frame_type()),
        )
        .into(),
    };
    Some((body, None))
}

fn fast_discovery() -> DiscoveryConfig {
    let mut d = DiscoveryConfig {
        probe_timeout_ms: 1_000,
        backoff_initial_ms: 5,
        backoff_max_ms: 100,
        discovery_timeout_ms: 5_000,
        ..DiscoveryConfig::default()
    };
    d.conn.request_timeout = Duration::from_secs(5);
    d
}

fn producer_config() -> ProducerConfig {
    ProducerConfig {
        batch_messages_max: 7,
        linger_ms: 1,
        in_flight_batches_max: 4,
        delivery_timeout_ms: 20_000,
        discovery: fast_discovery(),
        ..ProducerConfig::default()
    }
}

fn payload(topic: &str, i: usize) -> Bytes {
    Bytes::from(format!("{topic}-{i:05}"))
}

/// Checks the log holds each of `sent` exactly once, per topic in send order, and at the
/// offsets the deliveries reported.
fn check_log(st: &ClusterState, sent: &[(String, Bytes, Offset)]) {
    let mut seen = HashSet::new();
    for (_, _, _, m) in &st.log.entries {
        assert!(seen.insert(m.clone()), "{m:?} is in the log twice");
    }
    for (topic, m, offset) in sent {
        let (t, _, _, at) = &st.log.entries[offset.0 as usize];
        assert_eq!(
            (t, at),
            (topic, m),
            "delivery of {m:?} reported offset {offset}"
        );
    }
    assert_eq!(
        st.log.entries.len(),
        sent.len(),
        "nothing else is in the log"
    );
    let mut per_topic: HashMap<&str, Vec<&Bytes>> = HashMap::new();
    for (t, _, _, m) in &st.log.entries {
        per_topic.entry(t).or_default().push(m);
    }
    for (t, ms) in per_topic {
        let mut sorted = ms.clone();
        sorted.sort();
        assert_eq!(ms, sorted, "topic {t} out of send order");
    }
    assert_eq!(st.order_violations, 0);
}

async fn produce_all(
    p: &Producer,
    topics: &[&str],
    per_topic: usize,
) -> Vec<(String, Bytes, Offset)> {
    let mut pending = Vec::new();
    for i in 0..per_topic {
        for t in topics {
            let m = payload(t, i);
            let d = p.send(t, m.clone()).await.expect("queued");
            pending.push((t.to_string(), m, d));
        }
    }
    let mut sent = Vec::new();
    for (t, m, d) in pending {
        let offset = d.await.unwrap_or_else(|e| panic!("{m:?} failed: {e}"));
        sent.push((t, m, offset));
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn master_crash_after_write_is_resent_with_the_same_sequences_and_written_once() {
    tokio::time::timeout(TEST_BOUND, async {
        let scripts = HashMap::from([(
            1,
            Script {
                crash_at_produce: Some(9),
                ..Script::default()
            },
        )]);
        let c = FakeCluster::start(2, scripts).await;
        let p = Producer::connect(c.addrs(), producer_config())
            .await
            .unwrap();
        let sent = produce_all(&p, &["alpha", "beta"], 150).await;
        p.flush().await.unwrap();
        let st = c.state();
        check_log(&st, &sent);
        // The batch written by broker 1 just before it crashed went to broker 2 again with
        // the same producer id and sequence, and got its original offsets there.
        let on_1: HashSet<(u64, u64)> = st
            .produces
            .iter()
            .filter(|(b, _, _)| *b == 1)
            .map(|&(_, p, s)| (p, s))
            .collect();
        let resent: Vec<(u64, u64)> = st
            .produces
            .iter()
            .filter(|(b, pid, s)| *b == 2 && on_1.contains(&(*pid, *s)))
            .map(|&(_, p, s)| (p, s))
            .collect();
        assert!(
            !resent.is_empty(),
            "some batch was resent to the new master"
        );
        assert!(resent.iter().all(|(pid, _)| *pid == p.id()));
        assert!(st.produce_counts.get(&2).copied().unwrap_or(0) > 0);
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeout_answers_are_retried_and_deduplicated() {
    tokio::time::timeout(TEST_BOUND, async {
        let scripts = HashMap::from([(
            1,
            Script {
                timeout_answers: 3,
                ..Script::default()
            },
        )]);
        let c = FakeCluster::start(1, scripts).await;
        let p = Producer::connect(c.addrs(), producer_config())
            .await
            .unwrap();
        let sent = produce_all(&p, &["t"], 60).await;
        let st = c.state();
        check_log(&st, &sent);
        assert!(
            st.produces.len() > st.log.batches.len(),
            "batches answered Timeout were sent again"
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn not_master_hint_is_followed() {
    tokio::time::timeout(TEST_BOUND, async {
        // Broker 1 claims to be master in its metadata but refuses produces naming 2.
        let scripts = HashMap::from([(
            1,
            Script {
                not_master_hint: Some(2),
                ..Script::default()
            },
        )]);
        let c = FakeCluster::start(2, scripts).await;
        c.state().master = 2;
        let p = Producer::connect([c.addr(1)], producer_config())
            .await
            .unwrap();
        let sent = produce_all(&p, &["t"], 20).await;
        let st = c.state();
        check_log(&st, &sent);
        assert!(
            st.produces.iter().any(|(b, _, _)| *b == 1),
            "tried broker 1 first"
        );
        assert!(
            st.produce_counts.get(&2).copied().unwrap_or(0) > 0,
            "then its hint"
        );
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_batch_fails_alone_with_the_broker_code() {
    tokio::time::timeout(TEST_BOUND, async {
        let scripts = HashMap::from([(
            1,
            Script {
                message_bytes_max: Some(100),
                ..Script::default()
            },
        )]);
        let c = FakeCluster::start(1, scripts).await;
        let p = Producer::connect(c.addrs(), producer_config())
            .await
            .unwrap();
        let small = p.send("ok", Bytes::from_static(b"fits")).await.unwrap();
        let big = p.send("big", Bytes::from(vec![0u8; 200])).await.unwrap();
        let after = p.send("ok", Bytes::from_static(b"after")).await.unwrap();
        assert_eq!(small.await.unwrap(), Offset(0));
        let e = big.await.expect_err("refused");
        assert_eq!(e.code(), Some(ErrorCode::MessageTooLarge), "{e}");
        assert!(matches!(e, ProduceError::Rejected { .. }));
        assert!(!e.is_outcome_unknown());
        assert_eq!(after.await.unwrap(), Offset(1));
        // Invalid input is refused before anything is sent.
        assert!(matches!(
            p.send("", Bytes::from_static(b"x")).await,
            Err(ProduceError::Invalid(_))
        ));
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_master_at_all_ends_in_a_delivery_timeout() {
    tokio::time::timeout(TEST_BOUND, async {
        let c = FakeCluster::start(1, HashMap::new()).await;
        let config = ProducerConfig {
            delivery_timeout_ms: 800,
            ..producer_config()
        };
        let p = Producer::connect(c.addrs(), config).await.unwrap();
        assert_eq!(
            p.send("t", Bytes::from_static(b"a"))
                .await
                .unwrap()
                .await
                .unwrap(),
            Offset(0)
        );
        c.crash(1, 1);
        let d = p.send("t", Bytes::from_static(b"b")).await.unwrap();
        let e = d.await.expect_err("no broker left");
        assert!(e.is_outcome_unknown(), "{e}");
        match &e {
            ProduceError::DeliveryTimeout {
                last: Some(last), ..
            } => {
                assert!(
                    matches!(
                        last,
                        ClientError::NoMaster { .. } | ClientError::Closed { .. }
                    ),
                    "{last}"
                );
            }
            other => panic!("expected a delivery timeout, got {other}"),
        }
        // Connecting with no broker reachable fails in bounded time too.
        let err = Producer::connect(
            c.addrs(),
            ProducerConfig {
                discovery: DiscoveryConfig {
                    discovery_timeout_ms: 300,
                    ..fast_discovery()
                },
                ..producer_config()
            },
        )
        .await
        .expect_err("nothing listens");
        assert!(matches!(err, ClientError::NoMaster { .. }), "{err}");
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_reads_across_a_failover_without_gap_or_duplicate_and_commits_cursors() {
    tokio::time::timeout(TEST_BOUND, async {
        let c = FakeCluster::start(2, HashMap::new()).await;
        let p = Producer::connect(c.addrs(), producer_config())
            .await
            .unwrap();
        let sent = produce_all(&p, &["a", "other"], 100).await;
        let want: Vec<(Offset, Bytes)> = sent
            .iter()
            .filter(|(t, _, _)| t == "a")
            .map(|(_, m, o)| (*o, m.clone()))
            .collect();
        let config = ConsumerConfig {
            fetch_max_messages: 9,
            fetch_wait_ms: 50,
            retry_timeout_ms: 10_000,
            discovery: fast_discovery(),
            ..ConsumerConfig::default()
        };
        let mut cons = Consumer::subscribe(
            c.addrs(),
            "a",
            StartFrom::Cursor("reader".into()),
            config.clone(),
        )
        .await
        .unwrap();
        assert_eq!(
            cons.position(),
            Offset(0),
            "a cursor never committed starts at 0"
        );
        let mut got = Vec::new();
        while got.len() < want.len() {
            let m = cons.recv().await.unwrap();
            got.push((m.offset, m.payload));
            if got.len() == 40 {
                cons.commit().await.unwrap();
                c.crash(1, 2);
            }
        }
        assert_eq!(
            got, want,
            "every message once, in order, across the failover"
        );
        assert!(c.state().fetches.get(&2).copied().unwrap_or(0) > 0);
        assert_eq!(
            cons.recv_timeout(Duration::from_millis(100)).await.unwrap(),
            None
        );
        // The committed cursor names the offset after the 40th message.
        let again = Consumer::subscribe(
            [c.addr(2)],
            "a",
            StartFrom::Cursor("reader".into()),
            config.clone(),
        )
        .await
        .unwrap();
        assert_eq!(again.position(), want[40].0);
        // End: nothing old; a new message arrives.
        let mut tail = Consumer::subscribe([c.addr(2)], "a", StartFrom::End, config.clone())
            .await
            .unwrap();
        assert!(tail
            .recv_timeout(Duration::from_millis(100))
            .await
            .unwrap()
            .is_none());
        let d = p
            .send("a", Bytes::from_static(b"late"))
            .await
            .unwrap()
            .await
            .unwrap();
        let m = tail.recv().await.unwrap();
        assert_eq!((m.offset, m.payload), (d, Bytes::from_static(b"late")));
        // A consumer without a cursor cannot commit.
        let mut plain = Consumer::subscribe([c.addr(2)], "a", StartFrom::Beginning, config)
            .await
            .unwrap();
        assert!(matches!(
            plain.commit().await,
            Err(ClientError::InvalidRequest(_))
        ));
    })
    .await
    .expect("bounded");
}
