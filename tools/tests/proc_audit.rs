//! `quire cluster audit` against a real cluster (3 stores, 2 brokers, the quire-tests
//! harness), where the test knows the ground truth, in four acts on one cluster:
//!
//! (a) after producing messages and waiting until every store holds the HWM: healthy
//!     (exit 0), every range held by stores 0, 1 and 2 in one group;
//! (b) store 2 killed: degraded (exit 4), store 2 unreachable, no range up to the HWM
//!     short of a quorum;
//! (c) a bit flipped in a sealed segment of the stopped store 2 (small segments on that
//!     store), its directory audited offline next to the live stores: the corruption is
//!     named at the flipped record's offset, store 2 validly ends just before it, degraded;
//!     the same read wholly offline (all three directories), the HWM then an estimate;
//! (d) the bit flipped back and store 2 restarted; store 1 SIGSTOPped while more is
//!     produced, the brokers killed (so nothing but what its socket buffered reaches store 1)
//!     and store 1 continued:
//!     audited over `--stores` only, degraded, store 1's end behind and the range it lacks
//!     named, held by stores 0 and 2.
//!
//! Every wait is bounded; the harness kills every process and removes the directory on drop.

#![allow(clippy::unwrap_used, clippy::expect_used)] // a test: a panic is a clear failure

use std::process::Command;
use std::time::Duration;

use bytes::Bytes;
use quire_proto::{Offset, ProduceRequest};
use quire_tests::disk::{flip_bit, records, segments, wal_dir};
use quire_tests::{run_bounded, signal, stop, Cluster, Timing, WAIT};
use serde_json::Value;

const SEGMENT_BYTES: u64 = 64 << 10;
const PRODUCER_ID: u64 = 4242;

struct Audit {
    exit_code: i32,
    report: Value,
}

fn audit(args: &[&str]) -> Audit {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_quire"));
    quire_tests::process::no_client_config(&mut cmd);
    cmd.args(["cluster", "audit", "--format", "json", "--timeout", "2s"])
        .args(args)
        .env("RUST_LOG", "warn");
    let out = run_bounded(&mut cmd, WAIT);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "audit printed no JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    eprintln!("audit {args:?} -> {}", report["verdict"]);
    Audit {
        exit_code: out.status.code().unwrap_or(-1),
        report,
    }
}

/// Produces `count` messages of 1 KiB, 20 per request, acknowledged; returns the last offset.
fn produce(c: &Cluster, sequence: &mut u64, count: u64) -> u64 {
    let mut last = 0;
    for _ in 0..count / 20 {
        let r = c.produce_acked(&ProduceRequest {
            format: quire_proto::MessageFormat::Raw,
            topic: "audit".into(),
            producer_id: PRODUCER_ID,
            sequence: *sequence,
            messages: (0..20)
                .map(|i| Bytes::from(vec![b'a' + (i % 26) as u8; 1024]))
                .collect(),
        });
        *sequence += 20;
        last = r.base_offset.0 + u64::from(r.count) - 1;
    }
    last
}

fn store(report: &Value, index: u64) -> &Value {
    report["stores"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["index"] == index)
        .unwrap_or_else(|| panic!("no store {index} in {report}"))
}

fn hwm(c: &Cluster) -> u64 {
    c.master_metadata().hwm.expect("an HWM after producing").0
}

fn brokers(c: &Cluster) -> String {
    c.brokers
        .iter()
        .map(|b| b.addr.clone())
        .collect::<Vec<_>>()
        .join(",")
}

#[test]
fn the_audit_tells_healthy_down_corrupt_and_lagging_stores_apart() {
    let _t = quire_tests::proc_test();
    let mut c = Cluster::new(3, 2, Timing::default());
    let small = c.root.path().join("store-small-segments.toml");
    std::fs::write(
        &small,
        format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"),
    )
    .unwrap();
    c.stores[2].config = small;
    c.start_all();
    c.settle();
    let mut sequence = 0;

    // (a) Healthy.
    produce(&c, &mut sequence, 400);
    let h = hwm(&c);
    for i in 0..3 {
        c.wait_store_holds(i, Offset(h));
    }
    // The master may append an event of its own (a checkpoint) at any time, which a store
    // holds a moment later: audit again until healthy, bounded.
    let a = wait_audit(&["--brokers", &brokers(&c)], |a| {
        a.report["verdict"] == "healthy"
    });
    assert_eq!(a.report["verdict"], "healthy", "{}", a.report);
    assert_eq!(a.exit_code, 0);
    let reported = a.report["hwm"].as_u64().unwrap();
    assert!(
        reported >= h,
        "the audit's HWM {reported} is the broker's (>= {h})"
    );
    assert_eq!(a.report["hwm_source"], "broker");
    let ranges = a.report["ranges"].as_array().unwrap();
    let mut next = 0;
    for r in ranges {
        assert_eq!(
            r["from"].as_u64(),
            Some(next),
            "contiguous from 0: {ranges:?}"
        );
        assert_eq!(
            r["groups"].as_array().unwrap().len(),
            1,
            "no divergence: {r}"
        );
        assert_eq!(
            r["groups"][0]["stores"],
            serde_json::json!([0, 1, 2]),
            "{r}"
        );
        next = r["to"].as_u64().unwrap() + 1;
    }
    assert!(next > h, "the ranges reach the HWM {h}: {ranges:?}");
    assert!(a.report["under_quorum"].as_array().unwrap().is_empty());
    assert_eq!(a.report["takeover"]["can_fence"], true);

    // (b) Store 2 killed.
    c.stores[2].kill9();
    let b = audit(&["--brokers", &brokers(&c)]);
    assert_eq!(b.report["verdict"], "degraded", "{}", b.report);
    assert_eq!(b.exit_code, 4);
    assert_eq!(store(&b.report, 2)["reachable"], false);
    assert!(b.report["under_quorum"].as_array().unwrap().is_empty());
    assert!(store(&b.report, 0)["end"].as_u64() >= Some(next - 1));

    // (c) A bit flipped in a sealed segment of the stopped store 2.
    let dir = c.stores[2].dir.clone();
    assert!(segments(&dir).len() >= 3, "store 2 has sealed segments");
    let all = records(&dir);
    let last_segment = all.last().unwrap().segment.clone();
    let sealed: Vec<_> = all.iter().filter(|r| r.segment < last_segment).collect();
    let r = sealed[sealed.len() / 2];
    let at = r.position + r.bytes - 1; // the last payload byte
    let path = wal_dir(&dir).join(&r.segment);
    flip_bit(&path, at, 0).unwrap();
    let dir_arg = dir.display().to_string();
    let cc = audit(&["--brokers", &brokers(&c), "--data-dir", &dir_arg]);
    assert_eq!(cc.report["verdict"], "degraded", "{}", cc.report);
    assert_eq!(cc.exit_code, 4);
    let s2 = store(&cc.report, 2);
    assert_eq!(s2["source"], "offline", "{s2}");
    assert_eq!(s2["corruption"]["offset"].as_u64(), Some(r.offset), "{s2}");
    assert!(
        s2["corruption"]["segment"]
            .as_str()
            .is_some_and(|s| s.ends_with(&r.segment)),
        "{s2}"
    );
    assert_eq!(
        s2["end"].as_u64(),
        Some(r.offset - 1),
        "valid up to the flip: {s2}"
    );
    assert_eq!(s2["missing"][0].as_u64(), Some(r.offset), "{s2}");
    assert!(cc.report["under_quorum"].as_array().unwrap().is_empty());
    // The offline digests (over the scan) and the online ones (served by the stores) agree
    // wherever store 2 validly holds the log: one implementation.
    assert_eq!(
        cc.report["divergences"],
        serde_json::json!([]),
        "{}",
        cc.report
    );
    // Wholly offline (the running stores' directories read as snapshots, nothing
    // produced meanwhile): the same corruption, the HWM estimated from the voters' logs.
    let dirs = c
        .stores
        .iter()
        .map(|s| s.dir.display().to_string())
        .collect::<Vec<_>>()
        .join(",");
    let off = audit(&["--data-dir", &dirs]);
    assert_eq!(off.report["verdict"], "degraded", "{}", off.report);
    assert_eq!(off.report["hwm_source"], "estimate");
    assert!(off.report["hwm"].as_u64() >= Some(h), "{}", off.report);
    assert_eq!(
        store(&off.report, 2)["corruption"]["offset"].as_u64(),
        Some(r.offset)
    );
    assert_eq!(off.report["voters"], 3);
    // The text form names the same corruption (printed for the test's log).
    let text = run_bounded(
        quire_tests::process::no_client_config(&mut Command::new(env!("CARGO_BIN_EXE_quire")))
            .args([
                "cluster",
                "audit",
                "--brokers",
                &brokers(&c),
                "--data-dir",
                &dir_arg,
            ])
            .env("RUST_LOG", "warn"),
        WAIT,
    );
    let text_out = String::from_utf8_lossy(&text.stdout);
    eprintln!("{text_out}");
    assert_eq!(text.status.code(), Some(4));
    assert!(
        text_out.contains(&format!("corruption at offset {}", r.offset)),
        "{text_out}"
    );

    // (d) Store 2 repaired (the bit flipped back) and restarted; store 1 lags.
    flip_bit(&path, at, 0).unwrap();
    c.stores[2].start();
    produce(&c, &mut sequence, 20);
    let h = hwm(&c);
    c.wait_store_holds(2, Offset(h));
    let pid = c.stores[1].pid().unwrap();
    stop(pid);
    // 1 MiB: more than store 1's socket receive buffer takes while it is stopped (what the
    // kernel buffered reaches it after SIGCONT, even with the brokers gone).
    let behind = produce(&c, &mut sequence, 1000);
    // One more batch so the stores hear an HWM covering the batches above.
    produce(&c, &mut sequence, 20);
    c.wait_store_holds(0, Offset(behind));
    c.wait_store_holds(2, Offset(behind));
    for b in &mut c.brokers {
        b.kill9();
    }
    signal(pid, libc::SIGCONT);
    let stores = c
        .stores
        .iter()
        .map(|s| s.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    // Store 1 answers again once continued (bounded by the audit's own timeouts).
    let d = wait_audit(&["--stores", &stores], |d| {
        store(&d.report, 1)["reachable"] == true
    });
    assert_eq!(d.report["verdict"], "degraded", "{}", d.report);
    assert_eq!(d.exit_code, 4);
    assert_eq!(d.report["hwm_source"], "stores");
    let hwm_seen = d.report["hwm"].as_u64().unwrap();
    assert!(
        hwm_seen >= behind,
        "the stores heard {hwm_seen} >= {behind}"
    );
    let s1 = store(&d.report, 1);
    let end1 = s1["end"].as_u64().unwrap();
    assert!(end1 < behind, "store 1 is behind {behind}: {s1}");
    assert_eq!(
        s1["missing"],
        serde_json::json!([end1 + 1, hwm_seen]),
        "{s1}"
    );
    let lacking = d.report["ranges"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["from"].as_u64() == Some(end1 + 1))
        .unwrap_or_else(|| panic!("a range starts where store 1 ends: {}", d.report));
    assert_eq!(lacking["groups"][0]["stores"], serde_json::json!([0, 2]));
    assert!(d.report["under_quorum"].as_array().unwrap().is_empty());
}

/// Runs the audit until `ok` holds for its report (bounded by [`WAIT`]).
fn wait_audit(args: &[&str], ok: impl Fn(&Audit) -> bool) -> Audit {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let a = audit(args);
        if ok(&a) || std::time::Instant::now() > deadline {
            return a;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}
