//! TLS on every link, on the real binaries: 3 stores that require client certificates of
//! the cluster's CA (mutual TLS), 2 brokers that speak TLS to clients, stores and each
//! other, and the `quire` CLI as the client (`Cluster::new_tls`; the certificates come from
//! `quire_tls::certs::write_local`, as for `quire cluster up --tls`).
//!
//! Faults and what must hold:
//! - a plaintext client, a TLS client without a certificate and one with a certificate of
//!   another CA each send a Fence with an epoch near the top of the range to a store: each
//!   is refused at the handshake; a client with a certificate of the cluster's CA that
//!   names the client role is answered `Unauthorized`; no store's promised epoch moves,
//!   and only a broker's certificate may audit the stores (`quire cluster audit` reads range
//!   digests, which would let a guesser test an event's contents);
//! - a plaintext client of a broker is refused at once (not retried for its connect
//!   timeout) with an error that says the broker serves TLS;
//! - the master is killed with SIGKILL: the slave fences the stores over TLS and takes
//!   over, and every message acknowledged before and after is consumed.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::Duration;

use quire_client::{ConnConfig, StoreClient};
use quire_proto::{BrokerId, Epoch};
use quire_tests::process::{quire_command, run_bounded};
use quire_tests::{Cluster, Timing};
use quire_tls::certs::{files_for, write_local};
use quire_tls::{Role, TlsFiles};

const CLI_BOUND: Duration = Duration::from_secs(60);

/// The quire CLI's flags for a client with `files`.
fn flags(files: &TlsFiles) -> Vec<String> {
    let names = ["--tls-cert", "--tls-key", "--tls-ca"];
    [&files.cert, &files.key, &files.ca]
        .into_iter()
        .zip(names)
        .filter_map(|(p, f)| p.as_ref().map(|p| [f.to_owned(), p.display().to_string()]))
        .flatten()
        .collect()
}

/// Runs `quire ARGS` with the client's TLS flags; its output.
fn quire(args: &[&str], tls: &[String]) -> std::process::Output {
    run_bounded(quire_command().args(args).args(tls), CLI_BOUND)
}

fn stdout(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `quire cluster status --format json`, once it names a master other than `not`.
fn wait_master(brokers: &str, tls: &[String], not: Option<u64>) -> serde_json::Value {
    quire_tests::process::wait_cli_master(tls, brokers, not)
}

fn promised_epochs(stores: &[String], tls: &TlsFiles) -> Vec<Epoch> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = ConnConfig {
        tls: tls.connector().unwrap(),
        ..ConnConfig::default()
    };
    rt.block_on(async {
        let mut epochs = Vec::new();
        for s in stores {
            let c = StoreClient::connect_with(s.as_str(), config.clone())
                .await
                .unwrap();
            epochs.push(c.tail().await.unwrap().promised);
        }
        epochs
    })
}

/// A Fence near the top of the epoch range from a client with `tls` (`None`: plaintext):
/// the error it gets, or `Ok` if the store answered at all.
fn forged_fence(store: &str, tls: Option<&TlsFiles>) -> Result<(), String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = ConnConfig {
        tls: tls.map(|t| t.connector().unwrap().unwrap()),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(5),
        ..ConnConfig::default()
    };
    rt.block_on(async {
        let c = StoreClient::connect_with(store, config)
            .await
            .map_err(|e| e.to_string())?;
        c.fence(Epoch::compose(u64::from(u32::MAX) - 1, BrokerId(9)), None)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
}

/// Serves TLS with `files` on `addr` for `for_how_long`: the handshakes completed and the
/// bytes received after them.
fn impostor(addr: &str, files: &TlsFiles, for_how_long: Duration) -> (usize, usize) {
    use tokio::io::AsyncReadExt;
    let rt = tokio::runtime::Runtime::new().unwrap();
    let acceptor = files
        .acceptor(quire_tls::ClientAuth::None)
        .unwrap()
        .unwrap();
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
        let deadline = tokio::time::Instant::now() + for_how_long;
        let mut conns = tokio::task::JoinSet::new();
        while let Ok(Ok((tcp, _))) = tokio::time::timeout_at(deadline, listener.accept()).await {
            let acceptor = acceptor.clone();
            conns.spawn(async move {
                let Ok(stream) = acceptor.accept(tcp, Duration::from_secs(2)).await else {
                    return (0, 0);
                };
                let (mut r, _w) = stream.into_split();
                let mut got = 0;
                let mut buf = [0u8; 4096];
                while let Ok(Ok(n)) = tokio::time::timeout_at(deadline, r.read(&mut buf)).await {
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                (1, got)
            });
        }
        let mut total = (0, 0);
        while let Some(Ok((h, b))) = conns.join_next().await {
            total.0 += h;
            total.1 += b;
        }
        total
    })
}

/// Most connections one principal may hold on the brokers here.
const PER_PRINCIPAL: usize = 3;

/// Opens `n` connections to `broker` with `files` and asks each for the metadata; the
/// clients (held open while the result lives) or each one's error.
fn hold_connections(
    broker: &str,
    files: &TlsFiles,
    n: usize,
) -> Vec<Result<(tokio::runtime::Runtime, quire_client::BrokerClient), String>> {
    let config = ConnConfig {
        tls: files.connector().unwrap(),
        connect_timeout: Duration::from_secs(5),
        request_timeout: Duration::from_secs(5),
        ..ConnConfig::default()
    };
    (0..n)
        .map(|_| {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let client = rt.block_on(async {
                let c = quire_client::BrokerClient::connect(broker, config.clone())
                    .await
                    .map_err(|e| e.to_string())?;
                c.metadata().await.map_err(|e| e.to_string())?;
                Ok::<_, String>(c)
            });
            client.map(|c| (rt, c))
        })
        .collect()
}

fn count_consumed(brokers: &str, tls: &[String], want: usize) -> usize {
    let out = quire(
        &[
            "consume",
            "--brokers",
            brokers,
            "--topic",
            "t",
            "--from",
            "beginning",
            "--count",
            &want.to_string(),
            "--timeout",
            "20s",
        ],
        tls,
    );
    assert!(out.status.success(), "consume: {}", stderr(&out));
    stdout(&out).lines().filter(|l| !l.is_empty()).count()
}

fn produce(brokers: &str, tls: &[String], count: usize) {
    let out = quire(
        &[
            "produce",
            "--brokers",
            brokers,
            "--topic",
            "t",
            "--count",
            &count.to_string(),
            "--size",
            "100",
        ],
        tls,
    );
    assert!(out.status.success(), "produce: {}", stderr(&out));
}

#[test]
fn a_tls_cluster_serves_its_clients_survives_a_master_kill_and_refuses_strangers() {
    let _guard = quire_tests::serial::proc_test();
    let mut cluster = Cluster::new_tls(3, 2, Timing::default());
    let ours = cluster.root.path().join("tls");
    let theirs = cluster.root.path().join("other-ca");
    write_local(&theirs, &[("intruder", Role::Broker)]).unwrap();
    cluster.add_broker_args(&[
        "--connections-per-principal-max",
        &PER_PRINCIPAL.to_string(),
    ]);
    cluster.start_all();

    let client = files_for(&ours, "client");
    let tls = flags(&client);
    let brokers = cluster
        .broker_handles()
        .iter()
        .map(|b| b.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let stores: Vec<String> = cluster.stores.iter().map(|s| s.addr.clone()).collect();
    let first = wait_master(&brokers, &tls, None);
    produce(&brokers, &tls, 2000);

    // Strangers fence a store: refused at the handshake, no promised epoch moves.
    let before = promised_epochs(&stores, &client);
    let anonymous = TlsFiles {
        cert: None,
        key: None,
        ..client.clone()
    };
    let intruder = TlsFiles {
        ca: client.ca.clone(),
        ..files_for(&theirs, "intruder")
    };
    for (who, tls) in [
        ("plaintext", None),
        ("no certificate", Some(&anonymous)),
        ("another CA", Some(&intruder)),
    ] {
        let r = forged_fence(&stores[0], tls);
        assert!(r.is_err(), "a forged fence from {who} was answered");
    }
    // A client of the cluster's own CA may tail a store but not fence it: its certificate
    // names the client role.
    let refused = forged_fence(&stores[0], Some(&client)).expect_err("a client's fence");
    assert!(refused.contains("Unauthorized"), "{refused}");
    assert_eq!(promised_epochs(&stores, &client), before);
    // The audit reads range digests, which only a broker's certificate may: a client's is
    // refused, a broker's audits.
    let audit = quire(&["cluster", "audit", "--brokers", &brokers], &tls);
    assert!(
        !audit.status.success(),
        "a client certificate audited the stores"
    );
    let audit = quire(
        &["cluster", "audit", "--brokers", &brokers],
        &flags(&files_for(&ours, "broker")),
    );
    assert!(audit.status.success(), "audit: {}", stderr(&audit));

    // A plaintext client of a broker is told the broker serves TLS.
    let out = quire(
        &[
            "produce",
            "--brokers",
            &brokers,
            "--topic",
            "t",
            "--count",
            "1",
            "--connect-timeout",
            "10m",
        ],
        &[],
    );
    // Refused at once, not retried for the 10 minutes (run_bounded fails the test past
    // CLI_BOUND): a TLS mismatch does not mend itself.
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("TLS refused the connection"),
        "{}",
        stderr(&out)
    );

    // One principal in a reconnect loop cannot take every place: beyond its bound it is
    // refused, another principal is served, and a place it gives back is its again.
    let broker = cluster.broker_handles()[0].addr.clone();
    let held = hold_connections(&broker, &client, PER_PRINCIPAL);
    let over = hold_connections(&broker, &client, 1);
    assert!(
        over[0].is_err(),
        "a connection past the principal's bound was served"
    );
    let over = format!("{:?}", over[0]);
    assert!(over.contains("principal"), "{over}");
    let other = files_for(&ours, "client-2");
    assert!(hold_connections(&broker, &other, 1)[0].is_ok());
    drop(held);
    assert!(hold_connections(&broker, &client, 1)[0].is_ok());

    // A store dies and a server with another certificate of the cluster's CA (a broker's)
    // takes its address: the brokers' store links complete no link with it — not a frame
    // is sent to a server whose certificate does not name the store role.
    // Messages produced meanwhile (stabilized on the two real stores) are what a broker
    // would send the impostor.
    cluster.stores[2].kill9();
    let load = {
        let (brokers, tls) = (brokers.clone(), tls.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(1500));
            produce(&brokers, &tls, 500);
        })
    };
    let (handshakes, frame_bytes) = impostor(
        &cluster.stores[2].addr,
        &files_for(&ours, "broker"),
        Duration::from_secs(5),
    );
    load.join().unwrap();
    assert!(handshakes > 0, "no broker tried the store's address");
    assert_eq!(
        frame_bytes, 0,
        "a broker sent frames to a server that is no store"
    );
    cluster.stores[2].start();

    // SIGKILL the master: the slave takes over over TLS; nothing acknowledged is lost.
    let master = first["master"]["id"].as_u64().unwrap();
    cluster.broker(u16::try_from(master).unwrap()).kill9();
    let second = wait_master(&brokers, &tls, Some(master));
    assert!(second["epoch"].as_u64() > first["epoch"].as_u64());
    produce(&brokers, &tls, 1000);
    assert_eq!(count_consumed(&brokers, &tls, 3500), 3500);
}
