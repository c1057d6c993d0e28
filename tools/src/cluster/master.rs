//! Finding the master for a command that needs one (`quire produce`, `quire consume`,
//! `quire cluster handoff`, `quire bench cluster`), and telling the user at once when it
//! cannot be reached.
//!
//! A refused or unanswered connection, or brokers that name no master, are normal for a
//! moment while a cluster starts or elects a new master (a failover), so [`find_master`]
//! keeps retrying (discovery rounds with the client's backoff) until the command's bound
//! runs out. A wrong address looks exactly the same for the whole bound, though, so the
//! first failed round prints one line on stderr ([`unreachable_note`]): the broker and the
//! error (`connect to 127.0.0.1:9: Connection refused (os error 111)`), how long it keeps
//! trying and which flag sets that. When the bound runs out the command fails with the same
//! facts ([`NoMasterWithin`]).
//!
//! What this module does not do: retry requests once the master is found (the client
//! library does, bounded by its own settings), or talk to brokers other than through
//! `quire-client`'s [`Discovery`].

use std::io::{self, Write};
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use quire_client::discovery::Backoff;
use quire_client::{ClientError, Discovery, DiscoveryConfig, MasterConn};
use tokio::time::Instant;

use crate::units::{format_duration, parse_duration};

/// Longest single probe of one broker (connect and `Metadata` answer) while looking for
/// the master; a shorter bound lowers it, so one round never outlasts the bound by much.
pub const PROBE_TIMEOUT_MAX: Duration = Duration::from_secs(2);

/// The `--connect-timeout` option of `quire produce`, `quire consume` and
/// `quire bench cluster`: `None` until [`crate::cluster::BrokersArgs::resolve`] fills it in
/// (and [`crate::settings::CONNECT_TIMEOUT_DEFAULT`] if never filled).
#[derive(Debug, Clone, Copy, Args)]
pub struct ConnectArgs {
    /// How long to keep trying to reach the master before failing. Refused connections and
    /// brokers naming no master (a cluster electing one) are retried until then; the first
    /// failure is reported on stderr at once. Else $QUIRE_CONNECT_TIMEOUT, else the
    /// profile's. [default: 30s]
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub connect_timeout: Option<Duration>,
}

impl ConnectArgs {
    /// The bound these arguments describe, named after the flag.
    #[must_use]
    pub fn bound(&self) -> MasterBound {
        MasterBound {
            timeout: self
                .connect_timeout
                .unwrap_or(crate::settings::CONNECT_TIMEOUT_DEFAULT),
            flag: Some("--connect-timeout"),
            tls: None,
            sasl: None,
        }
    }
}

/// How long a command looks for the master, and the flag that sets it (named in messages
/// when there is one).
#[derive(Debug, Clone)]
pub struct MasterBound {
    /// How long to keep trying.
    pub timeout: Duration,
    /// The command-line flag that sets `timeout`, e.g. `--connect-timeout`; `None` for a
    /// fixed bound (`quire bench report`'s own cluster).
    pub flag: Option<&'static str>,
    /// TLS towards the brokers (`--tls-ca`, ...); `None`: plaintext.
    pub tls: Option<quire_tls::TlsConnector>,
    /// The user to authenticate as (`--user`, ...); `None`: none.
    pub sasl: Option<quire_client::ScramLogin>,
}

impl MasterBound {
    /// `base` with its discovery timeout set to this bound and each probe bounded by
    /// [`PROBE_TIMEOUT_MAX`] or this bound, whichever is shorter (at least 1 ms each).
    #[must_use]
    pub fn discovery_config(&self, base: DiscoveryConfig) -> DiscoveryConfig {
        let timeout_ms = millis(self.timeout).max(1);
        DiscoveryConfig {
            probe_timeout_ms: base
                .probe_timeout_ms
                .min(millis(PROBE_TIMEOUT_MAX))
                .min(timeout_ms),
            discovery_timeout_ms: timeout_ms,
            conn: quire_client::ConnConfig {
                tls: self
                    .tls
                    .clone()
                    .map(|t| t.expecting(quire_tls::Role::Broker)),
                sasl: self.sasl.clone(),
                ..base.conn
            },
            ..base
        }
    }
}

/// The discovery of an admin command that talks to the master (`quire cluster handoff`,
/// `add-store`, ...): `brokers` to start from, each request and the search for the master
/// bounded by `timeout` (set by `--timeout`).
///
/// # Errors
/// TLS or login files that cannot be read; an unusable broker list.
pub fn admin_discovery(
    brokers: &super::BrokersArgs,
    timeout: std::time::Duration,
) -> anyhow::Result<(Discovery, MasterBound)> {
    let bound = MasterBound {
        timeout,
        flag: Some("--timeout"),
        tls: brokers.tls()?,
        sasl: brokers.sasl()?,
    };
    let config = bound.discovery_config(DiscoveryConfig {
        conn: quire_client::ConnConfig {
            request_timeout: timeout,
            ..quire_client::ConnConfig::default()
        },
        ..DiscoveryConfig::default()
    });
    let discovery = Discovery::new(brokers.addrs(), config).context("reading --brokers")?;
    Ok((discovery, bound))
}

/// No master was found within the bound.
#[derive(Debug, thiserror::Error)]
#[error(
    "no master reachable within {}{}: {}",
    format_duration(.bound.timeout),
    .bound.flag.map(|f| format!(" ({f} sets it)")).unwrap_or_default(),
    describe(.last, .brokers)
)]
pub struct NoMasterWithin {
    /// The bound that ran out.
    pub bound: MasterBound,
    /// The broker addresses tried (given and learned).
    pub brokers: Vec<String>,
    /// The last round's error.
    pub last: ClientError,
}

/// Rounds of discovery until one finds the master or `bound` runs out; the first failed
/// round writes [`unreachable_note`] (one line) to `notes`. Each round is bounded by the
/// discovery's probe timeout (see [`MasterBound::discovery_config`]), so the call returns
/// at most about one round after the bound.
///
/// # Errors
/// [`NoMasterWithin`] when the bound runs out; a setting refused at once
/// ([`ClientError::InvalidConfig`]) or TLS refusing the connection
/// ([`ClientError::is_tls_refusal`]), at once; writing the note failed.
pub async fn find_master(
    discovery: &Discovery,
    bound: MasterBound,
    notes: &mut dyn Write,
) -> anyhow::Result<MasterConn> {
    let deadline = Instant::now() + bound.timeout;
    let config = discovery.config();
    let mut backoff = Backoff::new(
        Duration::from_millis(config.backoff_initial_ms),
        Duration::from_millis(config.backoff_max_ms),
    );
    let mut noted = false;
    loop {
        let error = match discovery.find_master_once(None).await {
            Ok(master) => return Ok(master),
            Err(e @ ClientError::InvalidConfig(_)) => return Err(e.into()),
            // A certificate or TLS mismatch does not mend itself: say so now, not after
            // the whole bound (as Kafka's clients fail an SSL authentication at once).
            Err(e) if e.is_tls_refusal() => {
                // The refusal itself, not the master search it ended.
                let e = match e {
                    ClientError::NoMaster {
                        last: Some(last), ..
                    } => *last,
                    ClientError::RetriesExhausted { last, .. } => *last,
                    e => e,
                };
                let what = if e.to_string().contains("SASL") {
                    "the broker refused the login (check --user and the password)"
                } else {
                    "TLS refused the connection"
                };
                // As text: the error's Display already holds its source, which a chain
                // would print a second time.
                return Err(anyhow::anyhow!("{what}: {e}"));
            }
            Err(e) => e,
        };
        let now = Instant::now();
        if now >= deadline {
            return Err(NoMasterWithin {
                bound,
                brokers: discovery.brokers(),
                last: error,
            }
            .into());
        }
        if !noted {
            noted = true;
            writeln!(
                notes,
                "{}",
                unreachable_note(&error, &discovery.brokers(), &bound)
            )?;
            notes.flush()?;
        }
        tracing::debug!(%error, "no master yet");
        let wait = backoff.next_delay().min(deadline - now);
        tokio::time::sleep(wait).await;
    }
}

/// [`find_master`] writing its note to stderr.
///
/// # Errors
/// As [`find_master`].
pub async fn find_master_noting(
    discovery: &Discovery,
    bound: MasterBound,
) -> anyhow::Result<MasterConn> {
    find_master(discovery, bound, &mut io::stderr()).await
}

/// The line printed at the first failed round: what failed (naming the broker and the
/// OS error when a connection failed), for how long it keeps trying, and the flag that
/// changes that.
#[must_use]
pub fn unreachable_note(error: &ClientError, brokers: &[String], bound: &MasterBound) -> String {
    format!(
        "quire: cannot reach the master yet: {}; retrying for up to {}{}",
        describe(error, brokers),
        format_duration(bound.timeout),
        bound
            .flag
            .map(|f| format!(" (set with {f})"))
            .unwrap_or_default()
    )
}

/// The most telling part of a discovery error: the last broker's own error rather than
/// the round's summary; "named no master" spelled out when every broker answered.
fn describe(error: &ClientError, brokers: &[String]) -> String {
    match error {
        ClientError::NoMaster { last: Some(e), .. }
        | ClientError::RetriesExhausted { last: e, .. } => describe(e, brokers),
        ClientError::NoMaster { last: None, .. } => format!(
            "{} answered but named no master (normal for a moment while one is elected)",
            brokers.join(", ")
        ),
        other => other.to_string(),
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::sync::Arc;

    fn bound(ms: u64) -> MasterBound {
        MasterBound {
            timeout: Duration::from_millis(ms),
            flag: Some("--connect-timeout"),
            tls: None,
            sasl: None,
        }
    }

    fn refused(addr: &str) -> ClientError {
        ClientError::Connect {
            addr: addr.to_owned(),
            source: Arc::new(io::Error::from(io::ErrorKind::ConnectionRefused)),
        }
    }

    #[test]
    fn the_note_names_the_broker_the_error_the_bound_and_the_flag() {
        let error = ClientError::NoMaster {
            brokers: 1,
            rounds: 1,
            elapsed_ms: 0,
            last: Some(Box::new(refused("127.0.0.1:9"))),
        };
        let note = unreachable_note(&error, &["127.0.0.1:9".to_owned()], &bound(30_000));
        assert_eq!(
            note,
            "quire: cannot reach the master yet: connect to 127.0.0.1:9: connection refused; \
             retrying for up to 30s (set with --connect-timeout)"
        );
    }

    #[test]
    fn brokers_answering_without_a_master_are_said_to_be_electing() {
        let error = ClientError::NoMaster {
            brokers: 2,
            rounds: 1,
            elapsed_ms: 0,
            last: None,
        };
        let brokers = ["a:1".to_owned(), "b:2".to_owned()];
        let note = unreachable_note(&error, &brokers, &bound(1500));
        assert!(
            note.contains("a:1, b:2 answered but named no master"),
            "{note}"
        );
        assert!(note.contains("up to 1500ms"), "{note}");
    }

    #[test]
    fn the_final_error_says_the_same() {
        let e = NoMasterWithin {
            bound: MasterBound {
                timeout: Duration::from_secs(15),
                flag: Some("--timeout"),
                tls: None,
                sasl: None,
            },
            brokers: vec!["127.0.0.1:9".to_owned()],
            last: refused("127.0.0.1:9"),
        };
        assert_eq!(
            e.to_string(),
            "no master reachable within 15s (--timeout sets it): connect to 127.0.0.1:9: \
             connection refused"
        );
    }

    #[test]
    fn a_fixed_bound_names_no_flag() {
        let fixed = MasterBound {
            timeout: Duration::from_secs(60),
            flag: None,
            tls: None,
            sasl: None,
        };
        let note = unreachable_note(&refused("a:1"), &["a:1".to_owned()], &fixed);
        assert!(note.ends_with("retrying for up to 1m"), "{note}");
    }

    #[test]
    fn probes_are_bounded_by_the_shorter_of_two_seconds_and_the_bound() {
        let c = bound(500).discovery_config(DiscoveryConfig::default());
        assert_eq!((c.probe_timeout_ms, c.discovery_timeout_ms), (500, 500));
        let c = bound(60_000).discovery_config(DiscoveryConfig::default());
        assert_eq!(
            (c.probe_timeout_ms, c.discovery_timeout_ms),
            (2_000, 60_000)
        );
        let c = bound(0).discovery_config(DiscoveryConfig::default());
        assert!(
            c.validate().is_ok(),
            "a zero bound still makes a valid config"
        );
    }

    /// A real socket nobody listens on: the search notes the refusal once, keeps trying
    /// until the bound, then fails naming the address.
    #[test]
    fn a_port_with_nothing_listening_is_noted_once_and_fails_after_the_bound() {
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").expect("binding a loopback port");
            l.local_addr().expect("its address").to_string()
        };
        let b = bound(300);
        let discovery = Discovery::new([addr.clone()], b.discovery_config(Default::default()))
            .expect("a valid discovery");
        let rt = crate::cluster::runtime("test").expect("a runtime");
        let mut notes = Vec::new();
        let result = rt.block_on(find_master(&discovery, b, &mut notes));
        let error = format!("{:#}", result.expect_err("nothing listens there"));
        assert!(error.contains(&addr), "{error}");
        assert!(error.to_lowercase().contains("refused"), "{error}");
        let notes = String::from_utf8(notes).expect("UTF-8");
        assert_eq!(
            notes.lines().count(),
            1,
            "one note, not one per round: {notes}"
        );
        assert!(notes.contains(&addr), "{notes}");
        assert!(notes.to_lowercase().contains("refused"), "{notes}");
    }
}
