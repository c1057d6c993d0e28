//! Users and ACLs on the real binaries: a TLS cluster (3 stores, 2 brokers) whose brokers
//! enforce ACL entries (`--authorization acl`), with the local CA's `client` certificate as
//! the super user, and the `quire` CLI as every client.
//!
//! What must hold:
//! - the super user adds a user (`quire user add`, the password from a file) and ACL
//!   entries (`quire acl add`); `quire user list` and `quire acl list` show them, and no
//!   listing or WAL record holds the password;
//! - that user, logged in with SCRAM-SHA-256 over TLS without a certificate, may produce
//!   to the topic an entry names and nothing else: a produce to another topic and a
//!   consume are refused with `Unauthorized` naming the principal, the operation and the
//!   resource, and nothing of them is written;
//! - a wrong password and an unknown user are refused at once with a clear error, and a
//!   client that proves nothing (`ANONYMOUS`) may not produce;
//! - the master is killed with SIGKILL: the users and entries are replicated state, so the
//!   new master lets the same user log in and produce; an entry removed afterwards takes
//!   the right away, and removing one that is not there is an error;
//! - an administrator who logs in (no certificate) may hand mastership over;
//! - a client certificate cannot read a store's events (which hold every topic and the
//!   users' keys), only tail it;
//! - an address that fails FAILED_LOGINS_MAX logins is refused for the rest of the minute,
//!   the right password included;
//! - a broker refuses to start with ACL entries enforced on a plaintext listener.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::process::Output;
use std::time::Duration;

use quire_tests::process::{quire_command, run_bounded};
use quire_tests::{Cluster, Timing};
use quire_tls::certs::files_for;

const CLI_BOUND: Duration = Duration::from_secs(60);

/// A client of the cluster: its TLS flags and, for a user, its name and password file.
struct Client {
    args: Vec<String>,
}

impl Client {
    /// `quire ARGS` as this client; its output.
    fn run(&self, args: &[&str]) -> Output {
        run_bounded(
            quire_command()
                .args(args)
                .args(&self.args)
                .env_remove("QUIRE_PASSWORD")
                .env_remove("QUIRE_USER"),
            CLI_BOUND,
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(out.status.success(), "quire {args:?}: {}", stderr(&out));
        stdout(&out)
    }

    fn refused(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            !out.status.success(),
            "quire {args:?} succeeded: {}",
            stdout(&out)
        );
        stderr(&out)
    }
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The id of the master `quire cluster status` names, once it is not `not`.
fn wait_master(admin: &Client, brokers: &str, not: Option<u64>) -> u64 {
    let status = quire_tests::process::wait_cli_master(&admin.args, brokers, not);
    status["master"]["id"].as_u64().expect("a master id")
}

#[test]
fn a_broker_enforces_acl_entries_only_with_client_certificates_checked() {
    let dir = tempfile::tempdir().unwrap();
    let out = run_bounded(
        quire_command().args([
            "broker",
            "run",
            "--id",
            "1",
            "--data-dir",
            &dir.path().display().to_string(),
            "--stores",
            "127.0.0.1:9",
            "--brokers",
            "1=127.0.0.1:0",
            "--authorization",
            "acl",
        ]),
        CLI_BOUND,
    );
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(
        err.contains("authorization") && err.contains("needs TLS with client certificates"),
        "{err}"
    );
}

#[test]
fn users_and_acls_decide_who_may_do_what_and_survive_a_master_kill() {
    let _guard = quire_tests::serial::proc_test();
    let mut cluster = Cluster::new_tls(3, 2, Timing::default());
    cluster.add_broker_args(&["--authorization", "acl", "--super-users", "client"]);
    cluster.start_all();
    let tls_dir = cluster.root.path().join("tls");
    let ca = files_for(&tls_dir, "client");
    let path = |p: &Option<std::path::PathBuf>| p.as_ref().unwrap().display().to_string();
    let brokers = cluster
        .broker_handles()
        .iter()
        .map(|b| b.addr.clone())
        .collect::<Vec<_>>()
        .join(",");
    let base = vec![
        "--brokers".to_owned(),
        brokers.clone(),
        "--tls-ca".to_owned(),
        path(&ca.ca),
    ];
    // The super user: the local CA's client certificate (common name "client").
    let admin = Client {
        args: [
            base.clone(),
            vec![
                "--tls-cert".into(),
                path(&ca.cert),
                "--tls-key".into(),
                path(&ca.key),
            ],
        ]
        .concat(),
    };
    let secrets = cluster.root.path().join("secrets");
    std::fs::create_dir_all(&secrets).unwrap();
    let user = |name: &str, password: &str| {
        let file = secrets.join(format!("{name}-{password}"));
        std::fs::write(&file, format!("{password}\n")).unwrap();
        Client {
            args: [
                base.clone(),
                vec![
                    "--user".into(),
                    name.into(),
                    "--password-file".into(),
                    file.display().to_string(),
                ],
            ]
            .concat(),
        }
    };
    let anonymous = Client { args: base.clone() };
    let first = wait_master(&admin, &brokers, None);

    // The super user adds alice and lets her produce to orders.
    let password = "correct horse battery staple";
    let alice = user("alice", password);
    let new_password = secrets.join("new");
    std::fs::write(&new_password, format!("{password}\n")).unwrap();
    let np = new_password.display().to_string();
    admin.ok(&["user", "add", "alice", "--new-password-file", &np]);
    for (op, topic) in [("produce", "orders"), ("all", "alice.*")] {
        admin.ok(&[
            "acl",
            "add",
            "--principal",
            "alice",
            "--operation",
            op,
            "--topic",
            topic,
        ]);
    }
    let users = admin.ok(&["user", "list", "--format", "json"]);
    assert!(users.contains("\"alice\""), "{users}");
    assert!(!users.contains(password), "a listing shows the password");
    let acls = admin.ok(&["acl", "list"]);
    assert!(acls.contains("alice") && acls.contains("orders"), "{acls}");

    // alice may produce to orders, and read and write her own prefix.
    let produce = |c: &Client, topic: &str| {
        c.run(&["produce", "--topic", topic, "--count", "50", "--size", "64"])
    };
    let out = produce(&alice, "orders");
    assert!(out.status.success(), "alice's produce: {}", stderr(&out));
    assert!(produce(&alice, "alice.scratch").status.success());

    // Not another topic, and not a consume of orders: refused, naming who, what, where.
    let refused = stderr(&produce(&alice, "payroll"));
    assert!(
        refused.contains("Unauthorized")
            && refused.contains("\"alice\" has no produce right on topic \"payroll\""),
        "{refused}"
    );
    let refused = alice.refused(&[
        "consume",
        "--topic",
        "orders",
        "--from",
        "beginning",
        "--timeout",
        "2s",
    ]);
    assert!(
        refused.contains("\"alice\" has no consume right on topic \"orders\""),
        "{refused}"
    );
    // Nor may she administer users.
    let refused = alice.refused(&["user", "add", "mallory", "--new-password-file", &np]);
    assert!(
        refused.contains("has no admin right on the cluster"),
        "{refused}"
    );
    // Nothing of the refused produce was written: the super user reads orders and payroll.
    let count = |topic: &str| {
        admin
            .ok(&[
                "consume",
                "--topic",
                topic,
                "--from",
                "beginning",
                "--timeout",
                "3s",
            ])
            .lines()
            .filter(|l| !l.is_empty())
            .count()
    };
    assert_eq!(count("orders"), 50);
    assert_eq!(count("payroll"), 0);

    // A wrong password, an unknown user and no login at all.
    for (who, client) in [
        ("a wrong password", user("alice", "guess")),
        ("an unknown user", user("mallory", password)),
    ] {
        let refused = client.refused(&["produce", "--topic", "orders", "--count", "1"]);
        assert!(
            refused.contains("refused the login")
                && refused.contains("unknown user or wrong password"),
            "{who}: {refused}"
        );
    }
    let refused = stderr(&produce(&anonymous, "orders"));
    assert!(
        refused.contains("\"ANONYMOUS\" has no produce right"),
        "{refused}"
    );

    // SIGKILL the master: the new one knows alice and her entries.
    cluster.broker(u16::try_from(first).unwrap()).kill9();
    let second = wait_master(&admin, &brokers, Some(first));
    assert_ne!(second, first);
    let out = produce(&alice, "orders");
    assert!(
        out.status.success(),
        "alice after the failover: {}",
        stderr(&out)
    );
    assert_eq!(count("orders"), 100);

    // An entry removed takes the right away; removing it again is an error.
    let remove = [
        "acl",
        "remove",
        "--principal",
        "alice",
        "--operation",
        "produce",
        "--topic",
        "orders",
    ];
    admin.ok(&remove);
    let refused = stderr(&produce(&alice, "orders"));
    assert!(refused.contains("has no produce right"), "{refused}");
    let again = admin.refused(&remove);
    assert!(again.contains("no such entry, nothing removed"), "{again}");

    // An administrator who logs in, without a certificate, may hand mastership over.
    admin.ok(&["user", "add", "ops", "--new-password-file", &np]);
    admin.ok(&[
        "acl",
        "add",
        "--principal",
        "ops",
        "--operation",
        "admin",
        "--topic",
        "*",
    ]);
    let ops = user("ops", password);
    cluster.broker(u16::try_from(first).unwrap()).start();
    cluster.wait_rejoined(u16::try_from(first).unwrap(), None);
    let to = first.to_string();
    let handoff = [
        "cluster",
        "handoff",
        "--to",
        to.as_str(),
        "--timeout",
        "20s",
    ];
    let mut out = ops.run(&handoff);
    for _ in 0..5 {
        if out.status.success() {
            break;
        }
        // The restarted broker may still be catching up: the master then gives up and
        // serves on; ask again.
        std::thread::sleep(Duration::from_secs(1));
        out = ops.run(&handoff);
    }
    assert!(
        out.status.success(),
        "handoff by a logged-in admin: {}",
        stderr(&out)
    );
    assert_eq!(wait_master(&admin, &brokers, Some(second)), first);

    // A client certificate may tail a store, not read its events.
    let stores: Vec<String> = cluster.stores.iter().map(|s| s.addr.clone()).collect();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let config = quire_client::ConnConfig {
        tls: ca.connector().unwrap(),
        ..quire_client::ConnConfig::default()
    };
    let (tail, read) = rt.block_on(async {
        let c = quire_client::StoreClient::connect_with(stores[0].as_str(), config)
            .await
            .unwrap();
        let tail = c.tail().await.map(|_| ());
        let read = c
            .read(quire_proto::Offset(0), 10, 1 << 20)
            .await
            .map(|_| ());
        (tail, read)
    });
    assert!(tail.is_ok(), "{tail:?}");
    let read = format!("{:?}", read.expect_err("a client certificate read a store"));
    assert!(read.contains("Unauthorized"), "{read}");
    // And a user removed can no longer log in.
    admin.ok(&["user", "remove", "alice"]);
    let refused = alice.refused(&["produce", "--topic", "alice.x", "--count", "1"]);
    assert!(refused.contains("refused the login"), "{refused}");

    // An address that keeps guessing is held back, the right password included (last: it
    // holds this machine's logins back for a minute).
    // One broker address only, so every login goes to that broker first.
    let first_addr = brokers.split(',').next().unwrap().to_owned();
    let one_broker = |c: Client| Client {
        args: c
            .args
            .iter()
            .map(|a| {
                if *a == brokers {
                    first_addr.clone()
                } else {
                    a.clone()
                }
            })
            .collect(),
    };
    let guesser = one_broker(user("ops", "guess"));
    for _ in 0..quire_broker::security::FAILED_LOGINS_MAX {
        let refused = guesser.refused(&["user", "list"]);
        assert!(refused.contains("refused the login"), "{refused}");
    }
    let refused = one_broker(user("ops", password)).refused(&["user", "list"]);
    assert!(refused.contains("too many failed logins"), "{refused}");
}
