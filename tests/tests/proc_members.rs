//! Voter-set changes through the log (issue 15, DESIGN.md "Membership changes") on the
//! real binaries: `quire-node` stores, `quire-broker` brokers and the `quire` CLI on
//! loopback, under 4 producers and a consumer, judged by the one checker
//! (quire_tests::history).
//!
//! - **A wiped store replaced.** 3 stores, 2 brokers. Store 2's process is killed -9 and its
//!   directory deleted (a dead disk); a new directory is initialised with `quire-node init`
//!   and started at the same address; the master is killed -9 and restarted (the new
//!   master fences the new store expecting its old identity: it refuses, and must stay
//!   addable). `quire cluster replace-store 2 --with ADDR` removes the old identity and adds
//!   the new one, one change at a time, without any file edited.
//!   Then store 0 is killed -9: producing must go on (the 2 remaining voters are a quorum
//!   of 3 only because the new store votes), and after that the master is killed -9: the
//!   slave takes over with the voter set the log names.
//! - **Shrink 5 → 3 and grow 3 → 5.** 5 stores, 2 brokers: stores 4 and 3 are removed one
//!   at a time (Qa 3 → 3 → 2, shown by `quire cluster status`), wiped and re-created, and
//!   added back as new identities (Qa 2 → 3 → 3).
//! - **Refusals.** Adding a store that is already a voter, removing a voter when the
//!   remaining ones that acked recently would be fewer than their quorum, and naming an
//!   address outside the store list are refused with a reason, and nothing changes.
//!
//! What must survive, each: every acknowledged message exactly once at its offset in each
//! producer's order, the consumer's reads a prefix of one order, every fence quorum holding
//! the stabilized log; no producer error other than a retriable one. The longest pause
//! between two acknowledgements is printed, not asserted (timing on a shared machine).

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::process::Output;
use std::time::{Duration, Instant};

use quire_tests::{run_bounded, Cluster, ConsumerDriver, LoadDriver, ProducerOutcome, Timing};

/// Producers of the load.
const PRODUCERS: u64 = 4;
/// Load between two steps: batches each producer must have acknowledged.
const UNDER_LOAD_BATCHES: u64 = 20;
/// Bound of one CLI command (it waits for catch-up and stabilization itself).
const CLI_BOUND: Duration = Duration::from_secs(150);

fn timing() -> Timing {
    Timing {
        heartbeat_ms: 100,
        election_timeout_ms: 1000,
        produce_timeout_ms: 10_000,
    }
}

fn under_load(cluster: &Cluster) {
    cluster.wait_load_acked(1..PRODUCERS + 1, None, UNDER_LOAD_BATCHES);
}

fn brokers(cluster: &Cluster) -> String {
    cluster
        .brokers
        .iter()
        .map(|b| b.addr.clone())
        .collect::<Vec<_>>()
        .join(",")
}

/// `quire cluster ARGS --brokers B --format json`, bounded.
fn cli(cluster: &Cluster, args: &[&str]) -> Output {
    run_bounded(
        quire_tests::process::quire_command()
            .arg("cluster")
            .args(args)
            .args(["--brokers", &brokers(cluster), "--format", "json"]),
        CLI_BOUND,
    )
}

/// [`cli`] that must succeed; its JSON report.
fn cli_ok(cluster: &Cluster, args: &[&str]) -> serde_json::Value {
    let out = cli(cluster, args);
    assert!(
        out.status.success(),
        "quire cluster {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("a JSON report")
}

/// [`cli`] that must fail; its stderr.
fn cli_refused(cluster: &Cluster, args: &[&str]) -> String {
    let out = cli(cluster, args);
    assert!(!out.status.success(), "quire cluster {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The master's view: (voters, Qa), from `quire cluster status`.
fn voters_and_qa(cluster: &Cluster) -> (u64, u64) {
    let s = quire_tests::process::wait_cli_master(&[], &brokers(cluster), None);
    (
        s["voters"].as_u64().expect("voters"),
        s["ack_quorum"].as_u64().expect("Qa"),
    )
}

/// Kills store `i`, deletes its directory (a dead disk), initialises a new one and starts
/// it at the same address. Returns the new store id (16 hex digits).
fn wipe_and_replace_disk(cluster: &mut Cluster, i: usize) -> String {
    cluster.stores[i].kill9();
    let dir = cluster.stores[i].dir.clone();
    std::fs::remove_dir_all(&dir).expect("delete the store's directory");
    let out = run_bounded(
        std::process::Command::new(quire_tests::node_bin())
            .args(["init", "--data-dir"])
            .arg(&dir),
        Duration::from_secs(30),
    );
    assert!(out.status.success(), "init: {out:?}");
    cluster.stores[i].start();
    let tail = quire_tests::wait_for(Duration::from_secs(30), "the new store answering", || {
        cluster.store_tail(i).ok()
    });
    format!("{:016x}", tail.store_id.0)
}

/// The longest time between two acknowledgements of the whole load.
fn longest_pause(outcomes: &[ProducerOutcome]) -> Duration {
    let mut times: Vec<Instant> = outcomes
        .iter()
        .flat_map(|o| o.ack_times.iter().map(|&(t, _)| t))
        .collect();
    times.sort();
    times
        .windows(2)
        .map(|w| w[1] - w[0])
        .max()
        .unwrap_or_default()
}

/// Stops the load, checks it with the checker and prints the longest pause.
fn stop_and_check(cluster: &Cluster, load: LoadDriver, consumer: ConsumerDriver, what: &str) {
    under_load(cluster);
    let outcomes = load.stop();
    let reads = consumer.stop();
    for (i, o) in outcomes.iter().enumerate() {
        assert!(
            o.errors.iter().all(|(c, _)| c.as_u16() >= 200),
            "producer {}: {:?}",
            i + 1,
            o.errors
        );
    }
    eprintln!(
        "{what}: longest pause between two acknowledgements {:?}",
        longest_pause(&outcomes)
    );
    let report = cluster.check(&vec![("t".to_owned(), reads)]);
    eprintln!("{what}: {report}");
    report.assert_clean();
    assert!(report.counts.messages_acked > 0, "the load made progress");
}

#[test]
fn proc_a_wiped_store_is_replaced_under_load_and_the_cluster_survives_the_next_loss() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(3, 2, timing());
    cluster.start_all();
    cluster.settle();
    let load = LoadDriver::start(&cluster, 1, PRODUCERS);
    let consumer = ConsumerDriver::start(&cluster, "t");
    under_load(&cluster);

    // The fault: store 2's disk dies; a new one is initialised at the same address.
    let new_id = wipe_and_replace_disk(&mut cluster, 2);
    under_load(&cluster);
    // A failover before the replacement: the new master fences the new store expecting
    // its old identity; the store refuses that fence and must stay addable (a break-it
    // trial found it made itself a learner for good).
    let master = cluster.wait_for_master();
    cluster.broker(master).kill9();
    under_load(&cluster);
    cluster.broker(master).start();
    cluster.wait_rejoined(master, None);
    // A replacement naming a store that is already a voter removes nothing.
    let voter_addr = cluster.stores[1].addr.clone();
    let typo = cli_refused(&cluster, &["replace-store", "2", "--with", &voter_addr]);
    assert!(typo.contains("nothing was removed"), "{typo}");
    let status = quire_tests::process::wait_cli_master(&[], &brokers(&cluster), None);
    assert_eq!(status["stores"][2]["role"], "learner", "{status}");
    assert_eq!(
        status["voters"], 2,
        "the old identity no longer acks: {status}"
    );

    let addr = cluster.stores[2].addr.clone();
    let report = cli_ok(&cluster, &["replace-store", "2", "--with", &addr]);
    let changes = report["changes"].as_array().expect("changes");
    assert_eq!(changes.len(), 2, "{report}");
    assert_eq!(changes[0]["action"], "remove");
    assert_eq!(changes[1]["action"], "add");
    assert_eq!(changes[1]["store_id"], new_id.as_str());
    assert_eq!(report["voters"], 3, "{report}");
    let status = quire_tests::process::wait_cli_master(&[], &brokers(&cluster), None);
    assert_eq!(status["stores"][2]["store_id"], new_id.as_str(), "{status}");
    assert_eq!(status["stores"][2]["role"], "voter", "{status}");
    assert_eq!(voters_and_qa(&cluster), (3, 2));

    // Refused, nothing changed.
    let again = cli_refused(&cluster, &["add-store", &addr]);
    assert!(again.contains("already a voter"), "{again}");
    let elsewhere = cli_refused(&cluster, &["add-store", "127.0.0.1:1"]);
    assert!(elsewhere.contains("store list"), "{elsewhere}");
    under_load(&cluster);

    // The next loss: store 0. Stores 1 and the new 2 are a quorum of the 3 voters.
    cluster.stores[0].kill9();
    under_load(&cluster);
    let refused = cli_refused(&cluster, &["remove-store", "1"]);
    assert!(refused.contains("quorum"), "{refused}");
    assert_eq!(voters_and_qa(&cluster), (3, 2));

    // And the master: the slave takes over counting in the set the log names.
    let master = cluster.wait_for_master();
    cluster.broker(master).kill9();
    under_load(&cluster);
    assert_ne!(cluster.wait_for_master(), master);
    cluster.broker(master).start();
    cluster.wait_rejoined(master, None);
    stop_and_check(&cluster, load, consumer, "a wiped store replaced");
}

#[test]
fn proc_five_stores_shrink_to_three_and_grow_back_under_four_producers() {
    let _t = quire_tests::proc_test();
    let mut cluster = Cluster::new(5, 2, timing());
    cluster.start_all();
    cluster.settle();
    let load = LoadDriver::start(&cluster, 1, PRODUCERS);
    let consumer = ConsumerDriver::start(&cluster, "t");
    under_load(&cluster);
    assert_eq!(voters_and_qa(&cluster), (5, 3));

    for (i, qa) in [(4usize, 3u64), (3, 2)] {
        let r = cli_ok(&cluster, &["remove-store", &cluster.stores[i].addr.clone()]);
        assert_eq!(r["ack_quorum"], qa, "{r}");
        under_load(&cluster);
    }
    assert_eq!(voters_and_qa(&cluster), (3, 2));

    // The removed stores' disks are replaced by new ones, which join as new voters.
    for i in [3usize, 4] {
        wipe_and_replace_disk(&mut cluster, i);
    }
    under_load(&cluster);
    for (i, qa) in [(3usize, 3u64), (4, 3)] {
        let r = cli_ok(&cluster, &["add-store", &cluster.stores[i].addr.clone()]);
        assert_eq!(r["ack_quorum"], qa, "{r}");
        under_load(&cluster);
    }
    assert_eq!(voters_and_qa(&cluster), (5, 3));
    stop_and_check(&cluster, load, consumer, "shrink 5 -> 3 and grow 3 -> 5");
}
