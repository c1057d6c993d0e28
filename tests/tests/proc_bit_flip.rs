//! Fault: one bit flips in a sealed segment of one store of three while it is down (a
//! random bit of a random record of a segment before the one holding the last record;
//! seeded, the seed is printed, `QUIRE_TEST_SEED` replays it), under 3 continuous
//! producers.
//!
//! What must survive: `quire wal verify` reports corruption (exit 1) located at that
//! record's segment, position and offset; the store, restarted, detects it at start and
//! refuses to serve (exits non-zero naming the corruption and where it is — never starting
//! as if the range were absent), and leaves the directory as it was; the cluster keeps
//! acknowledging on the two others; every acknowledged message is in the log once, at its
//! offset, in producer order.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::process::{Command, Stdio};

use quire_tests::disk::{
    check_no_acked_loss, flip_bit, records, segments, wait_hwm_above, wait_output, wait_until,
    wal_verify, Rng,
};
use quire_tests::{node_bin, Cluster, LoadDriver, Timing, WAIT};

const SEGMENT_BYTES: u64 = 64 << 10;

#[test]
fn a_bit_flip_in_a_sealed_segment_is_reported_as_corruption_and_never_served() {
    let _t = quire_tests::proc_test();
    let mut rng = Rng::from_env_or_clock("proc_bit_flip");
    let mut c = Cluster::new(3, 2, Timing::default());
    let victim = 2;
    let config = c.root.path().join("store-small-segments.toml");
    std::fs::write(
        &config,
        format!("[wal]\nsegment_bytes_max = {SEGMENT_BYTES}\n"),
    )
    .expect("config");
    c.stores[victim].config = config.clone();
    c.start_all();
    c.settle();
    let dir = c.stores[victim].dir.clone();

    let load = LoadDriver::start(&c, 1, 3);
    wait_until("the store fills three segments", WAIT * 2, || {
        (segments(&dir).len() >= 4).then_some(())
    });
    c.stores[victim].kill9();

    // Flip a bit of a record in a sealed segment: one before the segment of the log's last
    // record (a segment just started may still be empty), so valid records follow it.
    let all = records(&dir);
    let last_segment = all.last().expect("the store holds records").segment.clone();
    let sealed: Vec<_> = all
        .into_iter()
        .filter(|r| r.segment < last_segment)
        .collect();
    assert!(!sealed.is_empty(), "sealed segments hold records");
    let r = &sealed[rng.below(sealed.len() as u64) as usize];
    let at = r.position + rng.below(r.bytes);
    let bit = rng.below(8) as u8;
    let path = dir.join("wal").join(&r.segment);
    let (before, after) = flip_bit(&path, at, bit).expect("flip");
    eprintln!(
        "flipped bit {bit} of byte {at} ({before:#04x} -> {after:#04x}) in {} (record at \
         offset {}, position {}, {} bytes)",
        r.segment, r.offset, r.position, r.bytes
    );

    let v = wal_verify(&dir);
    assert_eq!(
        v.exit_code, 1,
        "verify reports corruption: {} {}",
        v.report, v.stderr
    );
    assert_eq!(v.report["result"], "corruption");
    let end = &v.report["end"];
    assert!(
        end["segment"]
            .as_str()
            .is_some_and(|s| s.ends_with(&r.segment)),
        "located in the flipped segment: {end}"
    );
    assert_eq!(
        end["position"].as_u64(),
        Some(r.position),
        "at the flipped record: {end}"
    );
    assert_eq!(end["offset"].as_u64(), Some(r.offset), "{end}");

    // The store refuses to start on it, and says why and where.
    let child = Command::new(node_bin())
        .args(["run", "--data-dir"])
        .arg(&dir)
        .args(["--listen", &c.stores[victim].addr, "--config"])
        .arg(&config)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start quire-node");
    let out = wait_output(child, "quire-node run on a corrupt log");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a corrupt store must not run: {stdout}"
    );
    assert!(
        !stdout.contains("listening on"),
        "it never served: {stdout}"
    );
    assert!(
        stderr.contains("corruption in") && stderr.contains(&r.segment),
        "it names the corruption and where: {stderr}"
    );
    let again = wal_verify(&dir);
    assert_eq!(
        again.report["end"], v.report["end"],
        "the failed start changed nothing"
    );

    // The cluster went on without it all along.
    let hwm = wait_hwm_above(&c, None, WAIT);
    wait_hwm_above(&c, Some(hwm + 200), WAIT);
    let outcomes = load.stop();
    let checked = check_no_acked_loss(&c, &[(1, outcomes)]);
    eprintln!("checked {checked} acknowledged messages: none lost");
    assert!(checked > 0);
}
