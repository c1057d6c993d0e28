//! Runs the real `quire` binary's `wal dump|verify|stat|repair` on a WAL this test writes
//! through quire-wal itself (several small segments, two epochs), then damages it the two
//! ways a disk can: a torn last write (the last segment cut mid-record) and a flipped bit
//! in a sealed segment. Checks the output shapes, the exit statuses (0 clean, 1 corruption,
//! 2 torn tail), that a dry run changes nothing, that `repair --yes` cuts only the torn
//! tail, and that corruption is never "repaired". A path that holds no WAL is an error
//! with exit status 3 (never a verdict), a WAL with no record yet an empty log, and a
//! store's message events dump as their topic, producer, sequence and text.

use std::collections::BTreeMap;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use bytes::Bytes;
use quire_proto::{Epoch, Event, EventKind, Offset};
use quire_wal::{Wal, WalConfig};
use serde_json::Value;

/// Upper bound for any one `quire` run in these tests; a run past it is killed and fails.
const RUN_TIME_MAX: Duration = Duration::from_secs(60);
/// Events the test log holds.
const EVENTS: u64 = 120;
/// Events written in epoch 1; the rest are in epoch 2.
const EPOCH_1_EVENTS: u64 = 50;

fn wait_bounded(child: Child) -> Output {
    quire_tests::wait_bounded(child, RUN_TIME_MAX)
}

fn quire(args: &[&str]) -> Output {
    let child = Command::new(env!("CARGO_BIN_EXE_quire"))
        .env_remove("RUST_LOG")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn quire");
    wait_bounded(child)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("utf-8 output")
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

/// The payload of event `i`: a readable string whose length varies with `i`.
fn payload(i: u64) -> String {
    format!("event-{i:04}-{}", "x".repeat((i as usize * 37) % 700))
}

/// `quire node init` of a store directory at `data` (a voter).
fn init_store(data: &Path) {
    quire_node::init(&quire_node::InitArgs {
        data_dir: data.to_path_buf(),
        learner: false,
    })
    .expect("init");
}

/// Writes back a store's WAL directory with promised epoch 0 (what `init` writes).
fn init_store_wal(data: &Path) {
    quire_wal::PromisedEpoch::create_in(quire_wal::OsStorage, &data.join("wal")).expect("create");
}

/// Opens the WAL in `dir` with the smallest segments.
fn open_small(
    dir: impl AsRef<Path>,
) -> Result<(Wal, quire_wal::RecoveryReport), quire_wal::WalError> {
    Wal::open(WalConfig {
        segment_bytes_max: quire_wal::SEGMENT_BYTES_MIN,
        ..WalConfig::new(dir.as_ref())
    })
}

/// Writes the test log into `dir`: 120 events (50 in epoch 1, 70 in epoch 2) across
/// several 64 KiB segments, appended in batches of varying size.
fn write_log(dir: &Path) {
    let config = WalConfig {
        segment_bytes_max: quire_wal::SEGMENT_BYTES_MIN,
        ..WalConfig::new(dir)
    };
    let (wal, _) = Wal::open(config).expect("open the WAL");
    let mut offset = 0u64;
    let mut batch = 1u64;
    while offset < EVENTS {
        let n = batch.min(EVENTS - offset);
        let records: Vec<Event> = (offset..offset + n)
            .map(|i| Event {
                epoch: Epoch(if i < EPOCH_1_EVENTS { 1 } else { 2 }),
                offset: Offset(i),
                kind: EventKind::Message,
                payload: Bytes::from(payload(i)).into(),
            })
            .collect();
        // A batch never mixes epochs here, so its writer epoch is its records' epoch.
        let writer = records.last().expect("non-empty").epoch;
        let split = records.iter().position(|r| r.epoch != records[0].epoch);
        match split {
            None => {
                wal.append(writer, records).wait().expect("append");
            }
            Some(k) => {
                let (a, b) = records.split_at(k);
                wal.append(a[0].epoch, a.to_vec()).wait().expect("append");
                wal.append(writer, b.to_vec()).wait().expect("append");
            }
        }
        offset += n;
        batch = batch % 7 + 1;
    }
    wal.close().expect("close");
}

/// Every file of `dir` with its bytes.
fn snapshot(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| {
            let p = e.expect("entry").path();
            let bytes = std::fs::read(&p).expect("read");
            (p, bytes)
        })
        .collect()
}

/// The `jsonl` dump of `dir`: record objects and the end object.
fn dump_jsonl(dir: &Path, extra: &[&str]) -> (Vec<Value>, Value) {
    let mut args = vec!["wal", "dump", path_str(dir), "--format", "jsonl"];
    args.extend_from_slice(extra);
    let out = quire(&args);
    assert!(out.status.success(), "dump failed: {out:?}");
    let mut lines: Vec<Value> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    let end = lines.pop().expect("an end line");
    assert_eq!(end["type"], "end", "{end}");
    for r in &lines {
        assert_eq!(r["type"], "record", "{r}");
    }
    (lines, end)
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    let mut s: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    s.sort();
    s
}

#[test]
fn dump_prints_every_record_in_text_jsonl_and_json() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write_log(dir);

    let (records, end) = dump_jsonl(dir, &[]);
    assert_eq!(records.len() as u64, EVENTS);
    for (i, r) in records.iter().enumerate() {
        let i = i as u64;
        assert_eq!(r["offset"], i, "{r}");
        assert_eq!(r["epoch"], if i < EPOCH_1_EVENTS { 1 } else { 2 }, "{r}");
        assert_eq!(r["kind"], 1);
        assert_eq!(r["kind_name"], "message");
        assert_eq!(r["length"], payload(i).len());
        assert_eq!(r["record_bytes"], payload(i).len() + 32);
        assert_eq!(r["checksum_ok"], true);
        assert_eq!(r["status"], "entry");
        assert!(r["segment"].as_str().expect("segment").ends_with(".log"));
        assert!(r["position"].is_u64());
        assert!(r.get("payload").is_none(), "no payload by default: {r}");
    }
    let segment_names: std::collections::BTreeSet<&str> = records
        .iter()
        .map(|r| r["segment"].as_str().expect("segment"))
        .collect();
    assert!(
        segment_names.len() >= 2,
        "the log spans segments: {segment_names:?}"
    );
    assert_eq!(end["records_printed"], EVENTS);
    assert_eq!(end["entries"], EVENTS);
    assert_eq!(end["next_offset"], EVENTS);
    assert_eq!(end["last_offset"], EVENTS - 1);
    assert_eq!(end["last_epoch"], 2);
    assert_eq!(end["end"]["result"], "clean");
    assert_eq!(end["live_holder"], Value::Null);

    // --from / --count choose the printed records.
    let (some, end) = dump_jsonl(dir, &["--from", "60", "--count", "3"]);
    let offsets: Vec<u64> = some
        .iter()
        .map(|r| r["offset"].as_u64().expect("offset"))
        .collect();
    assert_eq!(offsets, [60, 61, 62]);
    assert_eq!(end["records_printed"], 3);
    assert_eq!(end["records_scanned"], EVENTS);

    // Payload modes.
    let (hex, _) = dump_jsonl(dir, &["--from", "7", "--count", "1", "--payload", "hex"]);
    let expected: String = payload(7).bytes().map(|b| format!("{b:02x}")).collect();
    assert_eq!(hex[0]["payload"], expected);
    let (utf8, _) = dump_jsonl(dir, &["--from", "7", "--count", "1", "--payload", "utf8"]);
    assert_eq!(utf8[0]["payload"], payload(7));

    // Text: a header, one row per record, an end line.
    let out = quire(&[
        "wal",
        "dump",
        path_str(dir),
        "--count",
        "5",
        "--payload",
        "utf8",
    ]);
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1 + 5 + 1, "{stdout}");
    for column in [
        "OFFSET", "EPOCH", "KIND", "LENGTH", "SEGMENT", "POSITION", "CRC", "PAYLOAD",
    ] {
        assert!(
            lines[0].contains(column),
            "header lacks {column}: {}",
            lines[0]
        );
    }
    let row: Vec<&str> = lines[3].split_whitespace().collect();
    assert_eq!(row[0], "2", "{}", lines[3]);
    assert_eq!(row[1], "1");
    assert_eq!(row[2], "message(1)");
    assert_eq!(row[3], payload(2).len().to_string());
    assert_eq!(row[6], "ok");
    assert_eq!(row[7], "entry");
    assert!(
        lines[3].contains(&format!("{:?}", payload(2))),
        "{}",
        lines[3]
    );
    assert!(
        lines[6].starts_with("-- 5 record(s) printed"),
        "{}",
        lines[6]
    );
    assert!(lines[6].contains("clean"), "{}", lines[6]);

    // json: one object holding everything.
    let out = quire(&["wal", "dump", path_str(dir), "--format", "json"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert_eq!(stdout.lines().count(), 1);
    let json: Value = serde_json::from_str(&stdout).expect("json");
    assert_eq!(
        json["records"].as_array().expect("records").len() as u64,
        EVENTS
    );
    assert_eq!(json["end"]["end"]["result"], "clean");
}

/// Retention as a store applies it: a Trim event appended to the log, then every whole
/// segment below its point deleted. `quire wal stat` shows the log's first offset as the
/// trim point and the point the Trim event asked for.
#[test]
fn stat_shows_the_trim_point() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write_log(tmp.path());
    let (wal, _) = open_small(tmp.path()).expect("open the WAL");
    let trim = quire_proto::EventBody::Trim(quire_proto::TrimEvent::plain(Offset(60)))
        .to_payload()
        .expect("encodes");
    wal.append(
        Epoch(2),
        vec![Event {
            epoch: Epoch(2),
            offset: Offset(EVENTS),
            kind: EventKind::Trim,
            payload: trim,
        }],
    )
    .wait()
    .expect("append the Trim event");
    wal.trim_before(Offset(60)).expect("trim");
    wal.close().expect("close");

    let out = quire(&["wal", "stat", path_str(tmp.path()), "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    let first = json["segments"][0]["base_offset"]
        .as_u64()
        .expect("a segment");
    assert!(
        first > 0 && first <= 60,
        "whole segments below 60 go: {json}"
    );
    assert_eq!(json["trim_point"], first, "{json}");
    assert_eq!(json["totals"]["first_offset"], first);
    assert_eq!(json["last_trim_before"], 60, "{json}");
    assert_eq!(json["end"]["result"], "clean", "{json}");

    let out = quire(&["wal", "stat", path_str(tmp.path())]);
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains(&format!(
            "offset {first} (offsets below were deleted by retention); the last Trim event asks for 60"
        )),
        "{stdout}"
    );
}

#[test]
fn stat_summarizes_segments_and_totals() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write_log(tmp.path());
    // A store's data directory: the WAL is in DIR/wal.
    let data = tempfile::tempdir().expect("tempdir");
    std::fs::rename(tmp.path(), data.path().join("wal")).expect("move the WAL");

    let out = quire(&["wal", "stat", path_str(data.path()), "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    let segs = json["segments"].as_array().expect("segments");
    assert!(segs.len() >= 2, "{json}");
    let mut records = 0;
    let mut epochs = Vec::new();
    let mut expected_base = 0;
    for s in segs {
        assert_eq!(s["base_offset"], expected_base, "{s}");
        assert!(s["name"].as_str().expect("name").ends_with(".log"));
        assert!(s["used_bytes"].as_u64().expect("used") > 0);
        assert!(s["file_bytes"].as_u64().expect("file") >= s["used_bytes"].as_u64().expect("used"));
        assert_eq!(s["markers"], 0);
        let last = s["last_offset"].as_u64().expect("last");
        records += s["records"].as_u64().expect("records");
        expected_base = last + 1;
        for e in s["epochs"].as_array().expect("epochs") {
            let e = e.as_u64().expect("epoch");
            if epochs.last() != Some(&e) {
                epochs.push(e);
            }
        }
        assert_eq!(
            s["epochs_count"],
            s["epochs"].as_array().expect("epochs").len()
        );
    }
    assert_eq!(records, EVENTS);
    assert_eq!(epochs, [1, 2]);
    let t = &json["totals"];
    assert_eq!(t["segments"], segs.len());
    assert_eq!(t["records"], EVENTS);
    assert_eq!(t["entries"], EVENTS);
    assert_eq!(t["first_offset"], 0);
    assert_eq!(t["next_offset"], EVENTS);
    assert_eq!(t["last_offset"], EVENTS - 1);
    assert_eq!(t["last_epoch"], 2);
    assert_eq!(t["max_epoch"], 2);
    assert_eq!(json["promised_epoch"], 0);
    assert_eq!(json["trim_point"], 0);
    assert_eq!(json["last_trim_before"], Value::Null);
    assert_eq!(json["end"]["result"], "clean");
    assert!(
        json["dir"].as_str().expect("dir").ends_with("/wal"),
        "{json}"
    );

    // The text form is a table ("table" is accepted as the format's name).
    let out = quire(&["wal", "stat", path_str(data.path()), "--format", "table"]);
    assert!(out.status.success());
    let stdout = text(&out.stdout);
    assert!(stdout.starts_with("SEGMENT"), "{stdout}");
    assert!(stdout.contains("end         clean"), "{stdout}");
}

#[test]
fn verify_is_0_clean_2_torn_and_repair_cuts_only_the_torn_tail() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write_log(dir);

    let out = quire(&["wal", "verify", path_str(dir)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out.stdout).contains("result      clean (exit 0)"),
        "{}",
        text(&out.stdout)
    );

    // Tear the last record: cut the last segment in the middle of it.
    let (records, _) = dump_jsonl(dir, &[]);
    let last = records.last().expect("records");
    let seg = dir.join(last["segment"].as_str().expect("segment"));
    let position = last["position"].as_u64().expect("position");
    let cut_at = position + last["record_bytes"].as_u64().expect("bytes") / 2;
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open segment")
        .set_len(cut_at)
        .expect("truncate");

    let out = quire(&["wal", "verify", path_str(dir), "--format", "json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    assert_eq!(json["result"], "torn_tail");
    assert_eq!(json["exit_code"], 2);
    assert_eq!(json["end"]["segment"], path_str(&seg));
    assert_eq!(json["end"]["position"], position);
    assert_eq!(json["end"]["offset"], EVENTS - 1);
    assert_eq!(json["last_offset"], EVENTS - 2);
    assert!(
        text(&out.stderr).contains("torn tail"),
        "{}",
        text(&out.stderr)
    );

    // A dry run reports the cut and changes nothing.
    let before = snapshot(dir);
    let out = quire(&["wal", "repair", path_str(dir), "--truncate-torn-tail"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("dry run: would cut the torn tail"),
        "{stdout}"
    );
    assert!(stdout.contains("--yes"), "{stdout}");
    assert_eq!(snapshot(dir), before, "a dry run changed the directory");

    // Without --truncate-torn-tail there is nothing to do: a usage error (a `wal`
    // command's is 3).
    let out = quire(&["wal", "repair", path_str(dir), "--yes"]);
    assert_eq!(out.status.code(), Some(EXIT_NO_LOG), "{out:?}");
    assert_eq!(snapshot(dir), before);

    // --yes cuts it; the log then verifies clean and ends one entry earlier.
    let out = quire(&[
        "wal",
        "repair",
        path_str(dir),
        "--truncate-torn-tail",
        "--yes",
        "--format",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    assert_eq!(json["dry_run"], false);
    assert_eq!(json["changed"], true);
    assert_eq!(json["result"], "torn_tail");
    assert_eq!(json["cut"]["position"], position);
    assert_eq!(json["last_offset"], EVENTS - 2);
    let out = quire(&["wal", "verify", path_str(dir)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let (records, end) = dump_jsonl(dir, &[]);
    assert_eq!(records.len() as u64, EVENTS - 1);
    assert_eq!(end["end"]["result"], "clean");

    // A second repair has nothing to cut.
    let out = quire(&[
        "wal",
        "repair",
        path_str(dir),
        "--truncate-torn-tail",
        "--yes",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out.stdout).contains("nothing to cut"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_flipped_bit_in_a_sealed_segment_is_corruption_and_never_repaired() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write_log(dir);
    let first_segment = segments(dir)[0].clone();
    let (records, _) = dump_jsonl(dir, &[]);
    let victim = &records[10];
    assert_eq!(
        victim["segment"].as_str(),
        first_segment.file_name().and_then(|n| n.to_str()),
        "record 10 is in the first (sealed) segment"
    );
    let position = victim["position"].as_u64().expect("position");
    // Flip one bit in the payload.
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&first_segment)
        .expect("open");
    let mut byte = [0u8; 1];
    file.read_exact_at(&mut byte, position + 40).expect("read");
    byte[0] ^= 0x10;
    file.write_all_at(&byte, position + 40).expect("write");
    drop(file);

    let out = quire(&["wal", "verify", path_str(dir)]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    for needle in [
        "CORRUPTION".to_owned(),
        path_str(&first_segment).to_owned(),
        format!("position {position}"),
        "expected offset 10".to_owned(),
    ] {
        assert!(
            stdout.contains(&needle),
            "stdout lacks {needle:?}:\n{stdout}"
        );
        assert!(
            stderr.contains(&needle),
            "stderr lacks {needle:?}:\n{stderr}"
        );
    }
    let out = quire(&["wal", "verify", path_str(dir), "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    assert_eq!(json["result"], "corruption");
    assert_eq!(json["end"]["segment"], path_str(&first_segment));
    assert_eq!(json["end"]["position"], position);
    assert_eq!(json["end"]["offset"], 10);
    // A store starting on it places the record and repairs it from its peers; the text
    // says so.
    assert_eq!(json["repaired_at_start"], serde_json::json!([10]), "{json}");
    assert!(
        stdout.contains("quire-node starts with offset(s) 10 marked damaged"),
        "{stdout}"
    );

    // The dump shows the bad record with a failed checksum.
    let (dumped, end) = dump_jsonl(dir, &[]);
    let bad = dumped.last().expect("records");
    assert_eq!(bad["status"], "bad");
    assert_eq!(bad["checksum_ok"], false);
    assert_eq!(bad["offset"], 10);
    assert_eq!(end["end"]["result"], "corruption");

    // Repair refuses, dry run or not, and changes nothing.
    let before = snapshot(dir);
    for extra in [&[][..], &["--yes"][..]] {
        let mut args = vec!["wal", "repair", path_str(dir), "--truncate-torn-tail"];
        args.extend_from_slice(extra);
        let out = quire(&args);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            text(&out.stdout).contains("REFUSED"),
            "{}",
            text(&out.stdout)
        );
        assert!(
            text(&out.stderr).contains("refusing to repair"),
            "{}",
            text(&out.stderr)
        );
        assert_eq!(snapshot(dir), before, "repair changed a corrupt log");
    }

    // A second flip, in the length field of the next record: two damaged records in a
    // row, which no store places: it would refuse to start.
    let next = &records[11];
    let position = next["position"].as_u64().expect("position");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(first_segment.with_file_name(next["segment"].as_str().expect("segment")))
        .expect("open");
    file.read_exact_at(&mut byte, position + 9).expect("read");
    byte[0] ^= 0x01;
    file.write_all_at(&byte, position + 9).expect("write");
    drop(file);
    let out = quire(&["wal", "verify", path_str(dir), "--format", "json"]);
    assert_eq!(out.status.code(), Some(1));
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    assert_eq!(json["repaired_at_start"], Value::Null, "{json}");
    let out = quire(&["wal", "verify", path_str(dir)]);
    assert!(
        text(&out.stdout).contains("quire-node refuses to start on this log"),
        "{}",
        text(&out.stdout)
    );
}

#[test]
fn a_wal_held_open_is_read_but_not_repaired() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write_log(dir);
    // This process plays the running node. Other tests of this binary spawn `quire`
    // children at the same time, and a child holds a copy of every open descriptor until
    // it execs (close-on-exec applies only then), so the lock `write_log` just released
    // can stay taken for a moment: retry, bounded.
    let started = Instant::now();
    let wal = loop {
        match open_small(dir) {
            Ok((wal, _)) => break wal,
            Err(quire_wal::WalError::Locked { .. }) if started.elapsed() < RUN_TIME_MAX => {
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("reopen: {e}"),
        }
    };

    let out = quire(&["wal", "stat", path_str(dir), "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    if Path::new("/proc/locks").exists() {
        assert_eq!(json["live_holder"]["pid"], std::process::id(), "{json}");
        assert!(
            text(&out.stderr).contains("open by a running process"),
            "{}",
            text(&out.stderr)
        );
    }
    let out = quire(&[
        "wal",
        "repair",
        path_str(dir),
        "--truncate-torn-tail",
        "--yes",
    ]);
    assert_eq!(out.status.code(), Some(EXIT_NO_LOG), "{out:?}");
    assert!(
        text(&out.stderr).contains("is locked by"),
        "{}",
        text(&out.stderr)
    );
    wal.close().expect("close");
}

/// Exit status of every `quire wal` command that read no log (tools/README.md).
const EXIT_NO_LOG: i32 = 3;

/// Runs every `quire wal` command on `dir` and checks each refuses it: exit 3 (never 0,
/// 1 or 2, which are verdicts on a log), nothing on stdout, and an error on stderr that
/// names `dir` and contains `says`.
fn assert_refused(dir: &Path, says: &str) {
    let d = path_str(dir);
    for args in [
        vec!["wal", "verify", d],
        vec!["wal", "verify", d, "--format", "json"],
        vec!["wal", "dump", d, "--payload", "utf8"],
        vec!["wal", "dump", d, "--format", "jsonl"],
        vec!["wal", "stat", d, "--format", "json"],
        vec!["wal", "repair", d, "--truncate-torn-tail"],
    ] {
        let out = quire(&args);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(EXIT_NO_LOG), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", text(&out.stdout));
        assert!(stderr.contains("quire: error: "), "{args:?}: {stderr}");
        assert!(stderr.contains(d), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
}

/// A usage error of a `wal` command is no verdict either: 3, not clap's usual 2 (which is
/// verify's "torn tail"); help still exits 0, and other commands keep clap's 2.
#[test]
fn a_wal_usage_error_exits_3() {
    let tmp = tempfile::tempdir().expect("tempdir");
    write_log(tmp.path());
    let d = path_str(tmp.path());
    for args in [
        vec!["wal", "verify", d, "--format", "jsn"],
        vec!["wal", "verify", d, "--bogus"],
        vec!["-q", "wal", "dump", d, "--payload", "latin1"],
        vec!["wal", "repair", d],
        vec!["wal"],
    ] {
        let out = quire(&args);
        assert_eq!(out.status.code(), Some(EXIT_NO_LOG), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert!(text(&out.stderr).contains("error"), "{args:?}: {out:?}");
    }
    let out = quire(&["wal", "verify", "--help"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(text(&out.stdout).contains("torn tail"), "{out:?}");
    let out = quire(&["bench", "wal", "--bogus"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn a_missing_directory_is_an_error() {
    let tmp = tempfile::tempdir().expect("tempdir");
    assert_refused(&tmp.path().join("nope"), "does not exist");
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"x").expect("write");
    assert_refused(&file, "is not a directory");
}

/// A newcomer pointed `quire wal verify` at directories that hold no WAL — an empty one,
/// `/etc`, the parent of a store's data directory — and was told "clean", exit 0: the tool
/// found no segment and took that for an empty log. Each is now an error that says what
/// was expected, with a status that is no verdict.
#[test]
fn a_directory_without_a_wal_is_an_error_not_a_clean_log() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let empty = tmp.path().join("empty");
    std::fs::create_dir(&empty).expect("mkdir");
    assert_refused(
        &empty,
        "holds no WAL: expected segment files named <20 digits>.log",
    );
    assert_refused(&empty, "it is empty");

    // The parent of a real store's data directory (and of a log file).
    let parent = tmp.path().join("cluster");
    let data = parent.join("store0");
    std::fs::create_dir(&parent).expect("mkdir");
    init_store(&data);
    write_log(&data.join("wal"));
    std::fs::write(parent.join("store0.log"), b"a log file, not a segment").expect("write");
    assert_refused(&parent, "it holds: store0, store0.log");

    // A directory of some other program's files.
    if Path::new("/etc/hostname").exists() {
        assert_refused(Path::new("/etc"), "holds no WAL");
    }

    // The store's data directory and its WAL directory themselves are fine.
    for dir in [&data, &data.join("wal")] {
        let out = quire(&["wal", "verify", path_str(dir)]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}

/// What a store's WAL directory holds before its first record (a node that started and
/// was fenced, no event yet): the lock, the promised epoch and the zero-filled spare
/// segment. That is an empty log — clean, exit 0 — not a wrong directory. `init` writes
/// the WAL directory with its promised epoch; a store whose `wal/` is gone gets an error
/// that says the node refuses it.
#[test]
fn a_store_with_no_record_yet_is_an_empty_log() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("store");
    init_store(&data);
    let out = quire(&["wal", "verify", path_str(&data)]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "a store just initialised: {out:?}"
    );
    std::fs::remove_dir_all(data.join("wal")).expect("rm wal");
    assert_refused(&data, "has no wal/");
    init_store_wal(&data);

    let wal_dir = data.join("wal");
    let (wal, _) = open_small(&wal_dir).expect("open the WAL");
    wal.close().expect("close");
    let mut promised = quire_wal::PromisedEpoch::load(&wal_dir).expect("load");
    promised.store(Epoch(7)).expect("promise");
    let names: Vec<String> = std::fs::read_dir(&wal_dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.iter().all(|n| !n.ends_with(".log")),
        "no segment before the first record: {names:?}"
    );

    for dir in [&data, &wal_dir] {
        let out = quire(&["wal", "verify", path_str(dir), "--format", "json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
        assert_eq!(json["result"], "clean", "{json}");
        assert_eq!(json["segments"], 0, "{json}");
        assert_eq!(json["promised_epoch"], 7, "{json}");
        let (records, end) = dump_jsonl(dir, &["--payload", "utf8"]);
        assert!(records.is_empty(), "{records:?}");
        assert_eq!(end["entries"], 0, "{end}");
        let out = quire(&["wal", "stat", path_str(dir), "--format", "json"]);
        assert_eq!(out.status.code(), Some(0), "{out:?}");
    }
}

/// The payload of a store's record is the broker's event body, binary header first; a
/// newcomer's `quire wal dump --payload utf8` showed that header as garbage before each
/// message. A store directory holding message events (written with the broker's own
/// encoding) now dumps each message's topic, producer, sequence and text apart.
#[test]
fn dump_of_a_store_shows_the_message_text() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("store");
    init_store(&data);
    let messages: Vec<Vec<u8>> = vec![
        b"hello".to_vec(),
        "wörld".as_bytes().to_vec(),
        b"tab\there\n".to_vec(),
        vec![b'a', 0xff, b'b'],
    ];
    {
        let (wal, _) = open_small(data.join("wal")).expect("open the WAL");
        let records: Vec<Event> = messages
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let mut body = bytes::BytesMut::new();
                quire_proto::encode_message_event("greetings", 0x1234, i as u64, m, &mut body)
                    .expect("encode");
                Event {
                    epoch: Epoch(1),
                    offset: Offset(i as u64),
                    kind: EventKind::Message,
                    payload: body.freeze().into(),
                }
            })
            .collect();
        wal.append(Epoch(1), records).wait().expect("append");
        wal.close().expect("close");
    }

    let (records, end) = dump_jsonl(&data, &["--payload", "utf8"]);
    assert_eq!(records.len(), messages.len(), "{end}");
    for (i, r) in records.iter().enumerate() {
        let event = &r["event"];
        assert_eq!(event["kind_name"], "message", "{r}");
        assert_eq!(event["topic"], "greetings", "{r}");
        assert_eq!(event["producer_id"], "0000000000001234", "{r}");
        assert_eq!(event["sequence"], i, "{r}");
        assert_eq!(event["message_bytes"], messages[i].len(), "{r}");
        assert_eq!(
            event["message"],
            String::from_utf8_lossy(&messages[i]).as_ref(),
            "{r}"
        );
        // The record's own fields are unchanged; `payload` is still the whole body.
        assert_eq!(r["offset"], i, "{r}");
        assert_eq!(r["kind_name"], "message", "{r}");
        assert!(r["payload"].as_str().expect("payload").len() > messages[i].len());
    }
    assert!(records[0]["event"].get("message_hex").is_none());
    assert_eq!(records[3]["event"]["message_hex"], "61ff62");

    let (hex, _) = dump_jsonl(&data, &["--payload", "hex", "--count", "1"]);
    assert_eq!(hex[0]["event"]["message"], "68656c6c6f");

    // Text: the message alone, quoted, control characters escaped; no header bytes.
    let out = quire(&["wal", "dump", path_str(&data), "--payload", "utf8"]);
    assert!(out.status.success(), "{out:?}");
    let stdout = text(&out.stdout);
    let rows: Vec<&str> = stdout.lines().collect();
    assert_eq!(rows.len(), 1 + messages.len() + 1, "{stdout}");
    assert!(
        rows[1].ends_with(
            r#"entry topic="greetings" producer_id=0000000000001234 sequence=0 message_bytes=5 message="hello""#
        ),
        "{}",
        rows[1]
    );
    assert!(rows[2].ends_with(r#"message="wörld""#), "{}", rows[2]);
    assert!(rows[3].ends_with(r#"message="tab\there\n""#), "{}", rows[3]);
    assert!(
        rows[4].ends_with("message=\"a\u{fffd}b\" message_hex=61ff62"),
        "{}",
        rows[4]
    );
}

/// On a store's data directory, `repair --yes` writes the store's tail-cut mark before it
/// cuts (docs/protocol.md, "Tail-cut marks"): the cut may have removed an acked record with
/// a flipped bit, so the store's grants must count only when every store grants.
#[test]
fn repair_of_a_store_directory_marks_the_store_before_it_cuts() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("store");
    init_store(&data);
    let wal_dir = data.join("wal");
    write_log(&wal_dir);
    let (records, _) = dump_jsonl(&wal_dir, &[]);
    let last = records.last().expect("records");
    let seg = wal_dir.join(last["segment"].as_str().expect("segment"));
    let position = last["position"].as_u64().expect("position");
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open segment")
        .set_len(position + 3)
        .expect("truncate");
    assert_eq!(quire_node::tail_cut::load(&data).expect("load"), None);

    let out = quire(&[
        "wal",
        "repair",
        path_str(&data),
        "--truncate-torn-tail",
        "--yes",
    ]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let mark = quire_node::tail_cut::load(&data)
        .expect("load")
        .expect("the store is marked");
    assert_eq!(mark.offset, Offset(EVENTS - 1));
    let out = quire(&["wal", "verify", path_str(&data)]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// A last segment cut at a record boundary scans clean record by record, but the WAL never
/// leaves a segment shorter than it preallocated: `verify` calls it a torn tail (exit 2),
/// naming the cut, as the store's own start does (which marks the store). Found by the
/// break-it trial: `truncate` on a store's last segment passed as "clean".
#[test]
fn verify_calls_a_last_segment_cut_at_a_record_boundary_a_torn_tail() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path();
    write_log(dir);
    let (records, _) = dump_jsonl(dir, &[]);
    let last = records.last().expect("records");
    let seg = dir.join(last["segment"].as_str().expect("segment"));
    let position = last["position"].as_u64().expect("position");
    OpenOptions::new()
        .write(true)
        .open(&seg)
        .expect("open segment")
        .set_len(position)
        .expect("truncate");
    let out = quire(&["wal", "verify", path_str(dir), "--format", "json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let json: Value = serde_json::from_str(&text(&out.stdout)).expect("json");
    assert_eq!(json["result"], "torn_tail", "{json}");
    assert_eq!(json["end"]["offset"], EVENTS - 1, "{json}");
    assert!(json.to_string().contains("cut to"), "{json}");
}

/// A log whose segments are reused files (retention handed trimmed segments back as
/// spares): `verify` calls it clean and `stat` shows each segment's version and tag, a new
/// tag for every life of a file.
#[test]
fn verify_and_stat_read_reused_and_version_1_segments() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (wal, _) = open_small(dir.path()).expect("open");
    let mut next = 0u64;
    let deadline = Instant::now() + RUN_TIME_MAX;
    // 3000-byte events take a 4 KiB block each; trim to keep about two segments.
    while wal.stats().spares_reused < 2 {
        assert!(
            Instant::now() < deadline,
            "no spare was made from a reused file"
        );
        let e = Event {
            epoch: Epoch(1),
            offset: Offset(next),
            kind: EventKind::Message,
            payload: Bytes::from(vec![b'r'; 3000]).into(),
        };
        wal.append(Epoch(1), vec![e]).wait().expect("append");
        next += 1;
        wal.trim_before(Offset(next.saturating_sub(20)))
            .expect("trim");
    }
    wal.close().expect("close");
    let out = quire(&["wal", "verify", path_str(dir.path())]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = quire(&["wal", "stat", path_str(dir.path()), "--format", "json"]);
    assert!(out.status.success(), "{out:?}");
    let v: Value = serde_json::from_slice(&out.stdout).expect("json");
    let segs = v["segments"].as_array().expect("segments");
    assert!(segs.iter().all(|s| s["version"] == 2), "{v}");
    let tags: std::collections::BTreeSet<&str> = segs
        .iter()
        .map(|s| s["tag"].as_str().expect("a tag"))
        .collect();
    assert_eq!(
        tags.len(),
        segs.len(),
        "every segment has a tag of its own: {v}"
    );
    assert_eq!(v["totals"]["next_offset"].as_u64(), Some(next), "{v}");
    let out = quire(&["wal", "stat", path_str(dir.path())]);
    assert!(text(&out.stdout).contains(" VER "), "{out:?}");
}
