//! Retention through the real binaries: 3 stores with 2 MiB segments, 2 brokers with
//! `--retention-bytes` 6 MiB, 16 KB messages. The cluster trims while a producer writes; a fetch below the
//! trim point is answered `Trimmed` with the first offset; the stores delete their segments
//! below it and answer reads there with their first offset; a slave restarted after the trim
//! rebuilds its state from a checkpoint, takes over when the master is killed, and serves
//! every acknowledged message above the trim point, the committed cursor and the
//! idempotent-producer table.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_client::{ClientError, Consumer, ConsumerConfig, StartFrom};
use quire_proto::{
    Body, CommitCursorRequest, CursorRequest, ErrorCode, ErrorDetail, FetchRequest, Offset,
    ProduceRequest, ReadRequest,
};
use quire_tests::{produce_answer, quire_bin, Client, Cluster, Timing, WAIT};

const TOPIC: &str = "t";
const PRODUCER: u64 = 11;
const BATCH: u64 = 25;
/// Message size, bytes.
const MESSAGE_BYTES: usize = 16_000;
const RETENTION_BYTES: u64 = 6 << 20;
/// Segment size of the stores: 2 MiB, above the master's largest append (1 MiB) — a store
/// refuses an append larger than its segments, and a lagging store would get one.
const STORE_CONFIG: &str = "[wal]\nsegment_bytes_max = 2097152\n";

fn payload(seq: u64) -> Bytes {
    let mut s = format!("m{seq:08}-");
    s.push_str(&"x".repeat(MESSAGE_BYTES - s.len()));
    Bytes::from(s)
}

/// The producer's state: every acknowledged sequence with its offset.
struct Producer {
    next_seq: u64,
    acked: BTreeMap<u64, Offset>,
    last_batch: Option<(u64, Offset)>,
}

impl Producer {
    fn request(seq: u64) -> ProduceRequest {
        ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: TOPIC.into(),
            producer_id: PRODUCER,
            sequence: seq,
            messages: (seq..seq + BATCH).map(payload).collect(),
        }
    }

    /// Produces one batch at the master, retried (same sequence) until acknowledged.
    fn batch(&mut self, cluster: &Cluster) {
        let seq = self.next_seq;
        let r = cluster.produce_acked(&Producer::request(seq));
        assert_eq!(u64::from(r.count), BATCH);
        for i in 0..BATCH {
            self.acked.insert(seq + i, Offset(r.base_offset.0 + i));
        }
        self.last_batch = Some((seq, r.base_offset));
        self.next_seq += BATCH;
    }
}

fn master_client(cluster: &Cluster) -> Client {
    let m = cluster.wait_for_master();
    let addr = &cluster.broker_node(m).addr;
    Client::connect(addr).expect("connect to the master")
}

fn fetch(c: &mut Client, from: Offset) -> Body {
    c.request(FetchRequest {
        records: false,
        topic: TOPIC.into(),
        from_offset: from,
        max_messages: 1000,
        max_bytes: 4 << 20,
        wait_ms: 0,
    })
    .expect("fetch answered")
}

/// The first offset a `Trimmed` answer names, `None` for any other answer.
fn trimmed_first(body: &Body) -> Option<Offset> {
    match body {
        Body::ErrorResponse(e) if e.code == ErrorCode::Trimmed => match e.detail {
            ErrorDetail::Trimmed { first_offset } => Some(first_offset),
            _ => panic!("a Trimmed answer without its detail: {e:?}"),
        },
        _ => None,
    }
}

/// Every message of the topic from `from` on, as `(offset, payload)`; `Err(first)` if the
/// cluster trimmed past the reader meanwhile (retention keeps running while it reads).
fn read_from(
    c: &mut Client,
    from: Offset,
    want_last: Offset,
) -> Result<Vec<(Offset, Bytes)>, Offset> {
    let mut out = Vec::new();
    let mut next = from;
    let deadline = Instant::now() + WAIT;
    while next <= want_last {
        assert!(
            Instant::now() < deadline,
            "could not read up to {want_last}"
        );
        let answer = fetch(c, next);
        if let Some(first) = trimmed_first(&answer) {
            assert!(first > next, "Trimmed names a first offset above the read");
            return Err(first);
        }
        match answer {
            Body::FetchResponse(r) => {
                assert!(r.next_offset >= next);
                next = r.next_offset;
                out.extend(r.messages);
            }
            other => panic!("fetch from {next} answered {other:?}"),
        }
    }
    Ok(out)
}

/// Every acknowledged message at or above the trim point (at least `first`) is served
/// once, at its offset, with its payload; nothing below it is. Returns the trim point read
/// at.
fn check_served(c: &mut Client, producer: &Producer, first: Offset) -> Offset {
    let last = *producer.acked.values().last().expect("acked messages");
    let mut first = first;
    let served = loop {
        match read_from(c, first, last) {
            Ok(served) => break served,
            Err(later) => first = later,
        }
    };
    let by_offset: BTreeMap<Offset, Bytes> = served.iter().cloned().collect();
    assert_eq!(by_offset.len(), served.len(), "an offset served twice");
    assert!(served.iter().all(|(o, _)| *o >= first));
    let mut expected = 0;
    for (&seq, &offset) in producer.acked.range(..) {
        if offset < first {
            continue;
        }
        expected += 1;
        assert_eq!(
            by_offset.get(&offset),
            Some(&payload(seq)),
            "acked message {seq} at {offset} is not served (first offset {first})"
        );
    }
    assert!(expected > 0, "some acked messages lie above the trim point");
    assert_eq!(served.len(), expected, "only acked messages are served");
    first
}

/// The master answers cursor "c1" of the topic with `at`.
fn assert_cursor(c: &mut Client, at: Offset) {
    match c
        .request(CursorRequest {
            topic: TOPIC.into(),
            cursor: "c1".into(),
        })
        .expect("cursor answered")
    {
        Body::CursorResponse(r) => assert_eq!(r.offset, Some(at)),
        other => panic!("cursor lookup answered {other:?}"),
    }
}

/// Base offsets of the store's segment files, increasing.
fn segment_bases(store_dir: &Path) -> Vec<u64> {
    let mut bases: Vec<u64> = std::fs::read_dir(store_dir.join("wal"))
        .expect("the store's wal directory")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    bases.sort_unstable();
    bases
}

#[allow(clippy::cast_possible_truncation)] // the gauges it reads are whole numbers
fn metric(text: &str, name: &str) -> Option<i64> {
    quire_tests::http::metric(text, name).map(|v| v as i64)
}

/// quire-client: a consumer at a trimmed offset gets the typed error; one subscribed from
/// the beginning starts at the first offset held.
fn check_consumers(cluster: &Cluster, producer: &Producer, first: Offset) {
    let brokers: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut at_zero = Consumer::subscribe(
            brokers.clone(),
            TOPIC,
            StartFrom::Offset(Offset::ZERO),
            ConsumerConfig::default(),
        )
        .await
        .expect("subscribe");
        match at_zero.poll().await {
            Err(ClientError::Trimmed {
                requested,
                first_offset,
            }) => {
                assert_eq!(requested, Offset::ZERO);
                assert!(first_offset >= first, "{first_offset} < {first}");
            }
            other => panic!("a fetch from 0 after a trim gave {other:?}"),
        }
        let mut beginning = Consumer::subscribe(
            brokers,
            TOPIC,
            StartFrom::Beginning,
            ConsumerConfig::default(),
        )
        .await
        .expect("subscribe");
        let m = tokio::time::timeout(WAIT, beginning.recv())
            .await
            .expect("a message in time")
            .expect("the beginning starts at the first offset held");
        assert!(m.offset >= first);
        let seq = producer
            .acked
            .iter()
            .find_map(|(&s, &o)| (o == m.offset).then_some(s))
            .expect("an acked message");
        assert_eq!(m.payload, payload(seq));
    });
}

#[test]
fn proc_retention_trims_while_producing_and_brokers_rebuild_from_checkpoints() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, Timing::default());
    cluster.set_store_config(STORE_CONFIG);
    cluster.add_broker_args(&["--retention-bytes", &RETENTION_BYTES.to_string()]);
    cluster.start_all();
    let master = cluster.settle();
    let slave = if master == 1 { 2 } else { 1 };
    let mut producer = Producer {
        next_seq: 0,
        acked: BTreeMap::new(),
        last_batch: None,
    };

    // Produce until the master answers a fetch from 0 with Trimmed (bounded).
    for _ in 0..20 {
        producer.batch(&cluster);
    }
    let cursor_at = *producer.acked.values().last().expect("acked");
    let mut c = master_client(&cluster);
    match c
        .request(CommitCursorRequest {
            topic: TOPIC.into(),
            cursor: "c1".into(),
            offset: cursor_at,
        })
        .expect("commit answered")
    {
        Body::CommitCursorResponse(_) => {}
        other => panic!("commit answered {other:?}"),
    }
    let deadline = Instant::now() + WAIT;
    let first = loop {
        assert!(Instant::now() < deadline, "the cluster never trimmed");
        producer.batch(&cluster);
        if let Some(f) = trimmed_first(&fetch(&mut c, Offset::ZERO)) {
            break f;
        }
    };
    assert!(first > Offset::ZERO);
    let produced_bytes = producer.acked.len() as u64 * MESSAGE_BYTES as u64;
    assert!(
        produced_bytes > RETENTION_BYTES,
        "trimmed before {RETENTION_BYTES} bytes were written"
    );
    // Every acked message from the trim point on is served; below it, Trimmed again.
    let first = check_served(&mut c, &producer, first);
    assert!(trimmed_first(&fetch(&mut c, Offset(first.0 - 1))) >= Some(first));
    check_consumers(&cluster, &producer, first);

    // The stores delete their whole segments below the trim point, and answer a read
    // below their first offset with that offset.
    for store in &cluster.stores {
        let deadline = Instant::now() + WAIT;
        loop {
            let bases = segment_bases(&store.dir);
            if bases.first().is_some_and(|&b| b > 0) {
                // A store trims only after the master applied the point (read it after).
                let now = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("trimmed");
                assert!(
                    bases[0] <= now.0,
                    "a store trimmed above the trim point {now}: {bases:?}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "{} kept {bases:?}", store.addr);
            std::thread::sleep(Duration::from_millis(100));
        }
        let mut s = Client::connect(&store.addr).expect("connect to a store");
        match s
            .request(ReadRequest {
                from: Offset::ZERO,
                max_events: 10,
                max_bytes: 1 << 20,
            })
            .expect("read answered")
        {
            Body::ReadResponse(r) => {
                assert!(r.events.is_empty(), "events below the store's first offset");
                let now = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("trimmed");
                assert!(r.first_offset > Offset::ZERO && r.first_offset <= now);
            }
            other => panic!("read answered {other:?}"),
        }
    }

    // A slave restarted after the trim: its log starts at a checkpoint.
    cluster.broker(slave).kill9();
    for _ in 0..20 {
        producer.batch(&cluster);
    }
    cluster.broker(slave).start();
    let deadline = Instant::now() + WAIT;
    loop {
        let hwm = metric(&cluster.broker(master).scrape(), "quire_hwm");
        let applied = metric(&cluster.broker(slave).scrape(), "quire_applied_offset");
        if hwm.is_some() && applied >= hwm {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted slave did not catch up: applied {applied:?}, hwm {hwm:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let log = cluster
        .broker(slave)
        .proc
        .as_ref()
        .expect("runs")
        .log_tail(10_000);
    assert!(
        log.contains("broker state rebuilt from a retention checkpoint"),
        "the slave did not rebuild from a checkpoint:\n{}",
        cluster
            .broker(slave)
            .proc
            .as_ref()
            .expect("runs")
            .log_tail(40)
    );

    // The master dies: the rebuilt slave takes over with nothing acknowledged above the trim
    // point lost, the cursor and the producer table intact.
    cluster.broker(master).kill9();
    let new_master = cluster.wait_for_master();
    assert_eq!(new_master, slave);
    let mut c = master_client(&cluster);
    let first_now = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("still trimmed");
    assert!(first_now >= first);
    let first_now = check_served(&mut c, &producer, first_now);
    assert_cursor(&mut c, cursor_at);
    let (seq, base) = producer.last_batch.expect("a batch");
    let retry = produce_answer(c.request(Producer::request(seq)).expect("retry answered"))
        .expect("a retried batch is acked");
    assert_eq!(retry.base_offset, base, "a retry gets its original offsets");
    // The new master keeps producing and trimming.
    for _ in 0..20 {
        producer.batch(&cluster);
    }
    let first_end = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("still trimmed");
    assert!(first_end >= first_now);
    check_served(&mut c, &producer, first_end);

    // Every broker restarts (kill -9, empty logs): a takeover fetches the adopted log from
    // offset 0, the store answers trimmed, and the takeover starts its log at the first
    // checkpoint the store holds. Nothing acknowledged above the trim point is lost; the
    // cursor survives.
    drop(c);
    for b in 1..=2 {
        cluster.broker(b).kill9();
    }
    for b in 1..=2 {
        cluster.broker(b).start();
    }
    let restarted = cluster.wait_for_master();
    let mut c = master_client(&cluster);
    let first_after = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("still trimmed");
    assert!(first_after >= first_end);
    check_served(&mut c, &producer, first_after);
    assert_cursor(&mut c, cursor_at);
    let log = cluster
        .broker(restarted)
        .proc
        .as_ref()
        .expect("runs")
        .log_tail(10_000);
    assert!(
        log.contains("restarting the log at its first checkpoint"),
        "the new master did not start at a checkpoint:\n{}",
        cluster
            .broker(restarted)
            .proc
            .as_ref()
            .expect("runs")
            .log_tail(40)
    );
    for _ in 0..5 {
        producer.batch(&cluster);
    }
    check_served(&mut c, &producer, first_after);
}

/// Retention by age: with `--retention-age 1500ms` and a producer that keeps writing, the
/// cluster trims events older than that; the trim point shows in `quire_trim_point`, a
/// fetch below it is `Trimmed`, and the newest acknowledged messages are all served.
#[test]
fn proc_retention_by_age_trims_old_events() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 1, Timing::default());
    cluster.set_store_config(STORE_CONFIG);
    // Long enough that the fresh batch produced before the CLI checks outlives a `quire
    // consume` started on a loaded machine (the cluster trims while idle too).
    cluster.add_broker_args(&["--retention-age", "1500ms"]);
    cluster.start_all();
    let master = cluster.settle();
    let mut producer = Producer {
        next_seq: 0,
        acked: BTreeMap::new(),
        last_batch: None,
    };
    let mut c = master_client(&cluster);
    let deadline = Instant::now() + WAIT;
    let first = loop {
        assert!(
            Instant::now() < deadline,
            "the cluster never trimmed by age"
        );
        producer.batch(&cluster);
        // A sleep on purpose: retention trims by age, so time must pass between batches.
        std::thread::sleep(Duration::from_millis(20));
        if let Some(f) = trimmed_first(&fetch(&mut c, Offset::ZERO)) {
            break f;
        }
    };
    assert!(first > Offset::ZERO);
    // The metric is refreshed on the broker's heartbeat tick.
    let deadline = Instant::now() + WAIT;
    loop {
        let metrics = cluster.broker(master).scrape();
        let trim_point = metric(&metrics, "quire_trim_point").expect("quire_trim_point");
        if trim_point >= i64::try_from(first.0).expect("small") {
            break;
        }
        assert!(Instant::now() < deadline, "{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let first_now = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("trimmed");
    let first_now = check_served(&mut c, &producer, first_now);
    // Messages younger than the retention period for the CLI to find.
    producer.batch(&cluster);
    check_cli(&cluster, &producer, first_now);
}

/// Runs `quire ARGS` to completion (killed past [`WAIT`]): `(success, stdout, stderr)`.
fn run_quire(args: &[&str]) -> (bool, String, String) {
    let mut child = std::process::Command::new(quire_bin())
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .stdin(std::process::Stdio::null())
        .spawn()
        .expect("quire starts");
    let deadline = Instant::now() + WAIT;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("quire {args:?} did not finish within {WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The CLI after a trim: `quire consume --from beginning` starts at the first offset held,
/// `--from 0` fails naming the trim, `quire wal stat` shows each store's trim point (not
/// compared with `first`: by age, the cluster keeps trimming while idle, one checkpoint per
/// retention period).
fn check_cli(cluster: &Cluster, producer: &Producer, first: Offset) {
    let brokers: Vec<String> = cluster.brokers.iter().map(|b| b.addr.clone()).collect();
    let brokers = brokers.join(",");
    let (ok, stdout, stderr) = run_quire(&[
        "consume",
        "--brokers",
        &brokers,
        "--topic",
        TOPIC,
        "--from",
        "beginning",
        "-n",
        "3",
        "--format",
        "jsonl",
    ]);
    assert!(ok, "quire consume --from beginning failed: {stderr}");
    let offsets: Vec<u64> = stdout
        .lines()
        .map(|l| {
            let at = l.find("\"offset\":").expect("an offset field") + "\"offset\":".len();
            let digits: String = l[at..].chars().take_while(char::is_ascii_digit).collect();
            digits.parse().expect("an offset")
        })
        .collect();
    assert_eq!(offsets.len(), 3, "{stdout}");
    assert!(offsets[0] >= first.0, "{stdout}");
    let seq = producer
        .acked
        .iter()
        .find_map(|(&s, &o)| (o.0 == offsets[0]).then_some(s))
        .expect("the first message consumed was acked");
    let text = String::from_utf8_lossy(&payload(seq)).into_owned();
    assert!(
        stdout.lines().next().is_some_and(|l| l.contains(&text)),
        "{stdout}"
    );

    let (ok, _, stderr) = run_quire(&[
        "consume",
        "--brokers",
        &brokers,
        "--topic",
        TOPIC,
        "--from",
        "0",
        "-n",
        "1",
    ]);
    assert!(!ok, "a consume from a trimmed offset must fail");
    assert!(stderr.contains("trimmed"), "{stderr}");

    // Each store trims once it learns the Trim event is stabilized: wait for it (bounded).
    for store in &cluster.stores {
        let deadline = Instant::now() + WAIT;
        loop {
            let (ok, stdout, stderr) = run_quire(&[
                "wal",
                "stat",
                store.dir.to_str().expect("utf-8 path"),
                "--format",
                "json",
            ]);
            assert!(ok, "quire wal stat failed: {stderr}");
            let at = stdout.find("\"trim_point\":").expect("trim_point") + "\"trim_point\":".len();
            let digits: String = stdout[at..]
                .trim_start()
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            let trim_point: u64 = digits.parse().expect("a number");
            if trim_point > 0 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} never trimmed: {stdout}",
                store.addr
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The last `lines` lines of broker `b`'s log.
fn log_of(cluster: &Cluster, b: u16, lines: usize) -> String {
    cluster
        .broker_node(b)
        .proc
        .as_ref()
        .expect("runs")
        .log_tail(lines)
}

/// Cursors the checkpoint-in-parts test commits (255-byte topic and cursor names: about
/// 530 bytes of broker state each, 1.6 MB in all).
const PARTS_CURSORS: u64 = 3_000;
/// `--checkpoint-part-bytes` of that test: the state takes about 25 parts.
const PART_BYTES: u64 = 64 * 1024;

/// A broker state larger than one checkpoint event is checkpointed in parts, and retention
/// goes on. Before, a state above one event (40,000 long cursor names, committed by any
/// client in seconds) could not be checkpointed, so nothing was ever trimmed again and the
/// disk filled. Here the bound is lowered instead (`--checkpoint-part-bytes` 64 KiB, 3,000
/// such cursors: ~25 parts) so the test runs in seconds.
///
/// The faults: the slave is killed (kill -9) and restarted after the trims, so it has to
/// rebuild its state from a checkpoint written in parts; then the master is killed. What must
/// hold: the master proposes checkpoints in parts and the trim point rises; the restarted
/// slave rebuilds from the parts; as the new master it serves every cursor as committed and
/// keeps trimming.
#[test]
fn proc_retention_a_state_larger_than_one_event_is_checkpointed_in_parts() {
    let _t = quire_tests::proc_test();
    // This test is about checkpoints, not failover timing: a 3 s election timeout keeps a
    // slow fdatasync on a throttled virtual disk from costing an election per stall.
    let timing = Timing {
        heartbeat_ms: 100,
        election_timeout_ms: 3_000,
        produce_timeout_ms: 20_000,
    };
    let mut cluster = Cluster::new(3, 2, timing);
    cluster.set_store_config(STORE_CONFIG);
    cluster.add_broker_args(&[
        "--retention-bytes",
        "1000000",
        "--checkpoint-part-bytes",
        &PART_BYTES.to_string(),
    ]);
    cluster.start_all();
    cluster.settle();
    let topic = "T".repeat(255);
    let cursor = |n: u64| format!("{n:010}{}", "c".repeat(245));
    let commit = |n: u64| CommitCursorRequest {
        topic: topic.clone(),
        cursor: cursor(n),
        offset: Offset(n),
    };
    // Pipelined in chunks of 500; a chunk that meets an error (a busy machine can make the
    // master step down) is sent again to the master, bounded.
    let deadline = Instant::now() + 4 * WAIT;
    let mut next = 0u64;
    let mut last_error = String::new();
    while next < PARTS_CURSORS {
        assert!(
            Instant::now() < deadline,
            "could not commit the cursors: {next} committed, last error {last_error}"
        );
        let mut c = master_client(&cluster);
        let Ok(ids) = (next..next + 500)
            .map(|n| c.send(commit(n)))
            .collect::<Result<Vec<u64>, _>>()
        else {
            continue;
        };
        let mut all_ok = true;
        for id in ids {
            match c.recv(id) {
                Ok(Body::CommitCursorResponse(_)) => {}
                other => {
                    last_error = format!("{other:?}");
                    all_ok = false;
                }
            }
        }
        if all_ok {
            next += 500;
        }
    }
    let master = cluster.wait_for_master();
    let slave = if master == 1 { 2 } else { 1 };
    let mut producer = Producer {
        next_seq: 0,
        acked: BTreeMap::new(),
        last_batch: None,
    };
    // Produce until a checkpoint in parts is proposed and the trim point reaches one.
    let mut c = master_client(&cluster);
    let deadline = Instant::now() + 2 * WAIT;
    let first = loop {
        assert!(
            Instant::now() < deadline,
            "no trim with a checkpoint in parts:\n{}",
            log_of(&cluster, master, 40)
        );
        producer.batch(&cluster);
        if let Some(f) = trimmed_first(&fetch(&mut c, Offset::ZERO)) {
            break f;
        }
    };
    let log = log_of(&cluster, master, 1 << 20);
    let line = log
        .lines()
        .find(|l| l.contains("proposed a trim point with a checkpoint"))
        .expect("the master logged its checkpoint");
    assert!(
        line.contains("parts=") && !line.contains("parts=1 "),
        "not in parts: {line}"
    );
    eprintln!("trim point {first}; {line}");
    check_served(&mut c, &producer, first);

    // The slave restarts with nothing: it is sent the log from the trim point and rebuilds
    // its state from the checkpoint's parts.
    drop(c);
    cluster.broker(slave).kill9();
    for _ in 0..5 {
        producer.batch(&cluster);
    }
    cluster.broker(slave).start();
    let deadline = Instant::now() + WAIT;
    loop {
        let hwm = metric(&cluster.broker(master).scrape(), "quire_hwm");
        let applied = metric(&cluster.broker(slave).scrape(), "quire_applied_offset");
        if hwm.is_some() && applied >= hwm {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the restarted slave did not catch up: applied {applied:?}, hwm {hwm:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        log_of(&cluster, slave, 1 << 20)
            .contains("rebuilt from a retention checkpoint written in parts"),
        "the slave did not rebuild from a checkpoint in parts:\n{}",
        log_of(&cluster, slave, 40)
    );

    // The master dies: the rebuilt slave serves every cursor and keeps trimming.
    cluster.broker(master).kill9();
    assert_eq!(cluster.wait_for_master(), slave);
    let mut c = master_client(&cluster);
    for n in [0, 1, PARTS_CURSORS / 2, PARTS_CURSORS - 1] {
        match c
            .request(CursorRequest {
                topic: topic.clone(),
                cursor: cursor(n),
            })
            .expect("cursor answered")
        {
            Body::CursorResponse(r) => assert_eq!(r.offset, Some(Offset(n)), "cursor {n}"),
            other => panic!("cursor lookup answered {other:?}"),
        }
    }
    let before = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("still trimmed");
    let deadline = Instant::now() + 2 * WAIT;
    loop {
        producer.batch(&cluster);
        let now = trimmed_first(&fetch(&mut c, Offset::ZERO)).expect("still trimmed");
        if now > before {
            check_served(&mut c, &producer, now);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new master never trimmed past {before}:\n{}",
            log_of(&cluster, slave, 40)
        );
    }
}
