//! `quire cluster add-store`, `remove-store` and `replace-store`: change the voter set
//! through the log (DESIGN.md "Membership changes"; the broker side is
//! `Engine::change_voters` and `MasterCore::propose_config`).
//!
//! Each command finds the master, reads the stores from its `Metadata` answer (their
//! positions in the brokers' store list and the identities the master sees), and sends one
//! `VoterChangeRequest` per change, naming the store by position *and* identity, so a store
//! that changed in between is refused rather than changed by mistake. The master answers
//! once the `Config` event is stabilized. While an earlier change is in flight
//! (`ChangeInProgress`) or the store to add is still copying the log (`StoreCatchingUp`),
//! the command waits and asks again, up to `--timeout`. Every other refusal
//! (`VoterChangeRefused`: unreachable, already a voter, a learner directory, too few
//! voters left, ...) ends it with the master's reason; nothing changed then.
//!
//! `replace-store OLD --with ADDR` is two changes, one store at a time: OLD is removed,
//! then the store at ADDR is added (the same address, for a wiped disk brought back with
//! `quire-node init`, or another slot of the store list).
//!
//! # JSON (`--format json`)
//! ```json
//! {"changes":[{"action":"remove","index":2,"addr":"127.0.0.1:7103",
//!              "store_id":"00c0ffee00c0ffee","incarnation":"1234567890abcdef"}],
//!  "voters":2,"stores":3,"ack_quorum":2}
//! ```

use std::io::{self, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use quire_client::{BrokerClient, ClientError, ConnConfig, Discovery, DiscoveryConfig};
use quire_proto::{ErrorCode, Incarnation, StoreId, StoreInfo, VoterChange, VoterChangeRequest};
use serde::Serialize;

use super::master::{find_master_noting, MasterBound};
use super::{runtime, BrokersArgs};
use crate::cli::FormatArgs;
use crate::output::{OutputFormat, Report};
use crate::units::{format_duration, parse_duration};

/// How long to wait between two asks while the master says "not yet".
const RETRY_PAUSE: Duration = Duration::from_millis(300);

/// Options every membership command shares.
#[derive(Debug, Clone, Args)]
pub struct ChangeOptions {
    #[command(flatten)]
    pub brokers: BrokersArgs,

    /// How long to wait in all: finding the master, an earlier change to finish, a new
    /// store to catch up, each change to be stabilized.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "120s")]
    pub timeout: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// Arguments of `quire cluster add-store`.
#[derive(Debug, Clone, Args)]
pub struct AddStoreArgs {
    /// The store to make a voter: its address as in the brokers' store list (or its
    /// position there, from 0). It must be running, reachable from the master and
    /// initialised as a voter (`quire-node init` without --learner).
    #[arg(value_name = "ADDR")]
    pub store: String,

    #[command(flatten)]
    pub options: ChangeOptions,
}

/// Arguments of `quire cluster remove-store`.
#[derive(Debug, Clone, Args)]
pub struct RemoveStoreArgs {
    /// The voter to remove: its store id (16 hex digits, as `quire cluster status` shows
    /// it), its address, or its position in the store list.
    #[arg(value_name = "STORE")]
    pub store: String,

    #[command(flatten)]
    pub options: ChangeOptions,
}

/// Arguments of `quire cluster replace-store`.
#[derive(Debug, Clone, Args)]
pub struct ReplaceStoreArgs {
    /// The voter to replace: store id, address or position (as for remove-store).
    #[arg(value_name = "OLD")]
    pub old: String,

    /// The store that takes its place: address or position (as for add-store). The same
    /// address as OLD's is the usual case: a wiped disk re-created with `quire-node init`.
    #[arg(long = "with", value_name = "ADDR")]
    pub with: String,

    #[command(flatten)]
    pub options: ChangeOptions,
}

/// One change made.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeMade {
    /// `"add"` or `"remove"`.
    pub action: &'static str,
    /// The store's position in the brokers' store list.
    pub index: u16,
    /// Its address.
    pub addr: String,
    /// Its store id, 16 hex digits.
    pub store_id: String,
    /// Its incarnation, 16 hex digits.
    pub incarnation: String,
}

/// What a finished command reports.
#[derive(Debug, Clone, Serialize)]
pub struct MembersReport {
    /// The changes made, in order (each stabilized).
    pub changes: Vec<ChangeMade>,
    /// Voters after the changes, as the master reports them.
    pub voters: usize,
    /// Stores in the brokers' store list.
    pub stores: usize,
    /// Qa after the changes.
    pub ack_quorum: u16,
}

impl Report for MembersReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        for c in &self.changes {
            let verb = if c.action == "add" {
                "is a voter now"
            } else {
                "is no longer a voter"
            };
            writeln!(
                out,
                "store {} ({}, {}/{}) {verb}",
                c.index, c.addr, c.store_id, c.incarnation
            )?;
        }
        writeln!(
            out,
            "voters: {} of {} stores, Qa {}",
            self.voters, self.stores, self.ack_quorum
        )
    }
}

/// The steps a command takes.
enum Step<'a> {
    Add(&'a str),
    Remove(&'a str),
}

/// Runs `quire cluster add-store`.
///
/// # Errors
/// No master within the timeout, a store that the master's answer does not name, a
/// refusal from the master (its reason), a lost connection.
pub fn add(args: &AddStoreArgs) -> anyhow::Result<MembersReport> {
    run(&args.options, &[Step::Add(&args.store)])
}

/// Runs `quire cluster remove-store`.
///
/// # Errors
/// As [`add`].
pub fn remove(args: &RemoveStoreArgs) -> anyhow::Result<MembersReport> {
    run(&args.options, &[Step::Remove(&args.store)])
}

/// Runs `quire cluster replace-store`: remove, then add.
///
/// # Errors
/// As [`add`]; a failure of the add leaves the removal done (the report says so and the
/// add can be run again with `quire cluster add-store`).
pub fn replace(args: &ReplaceStoreArgs) -> anyhow::Result<MembersReport> {
    run(
        &args.options,
        &[Step::Remove(&args.old), Step::Add(&args.with)],
    )
}

fn run(options: &ChangeOptions, steps: &[Step<'_>]) -> anyhow::Result<MembersReport> {
    let rt = runtime("membership")?;
    let timeout = options.timeout.max(Duration::from_secs(1));
    let deadline = Instant::now() + timeout;
    rt.block_on(async {
        let bound = MasterBound {
            timeout,
            flag: Some("--timeout"),
            tls: options.brokers.tls()?,
            sasl: options.brokers.sasl()?,
        };
        let config = bound.discovery_config(DiscoveryConfig {
            conn: ConnConfig {
                request_timeout: timeout,
                ..ConnConfig::default()
            },
            ..DiscoveryConfig::default()
        });
        let discovery =
            Discovery::new(options.brokers.addrs(), config).context("reading --brokers")?;
        let master = find_master_noting(&discovery, bound).await?;
        let client = &master.client;
        let mut changes = Vec::new();
        for step in steps {
            let (action, named) = match step {
                Step::Add(s) => (VoterChange::Add, *s),
                Step::Remove(s) => (VoterChange::Remove, *s),
            };
            let done = change(client, action, named, deadline, timeout)
                .await
                .map_err(|e| match changes.last() {
                    Some(ChangeMade { index, addr, .. }) => e.context(format!(
                        "store {index} ({addr}) was removed from the voter set already; \
                         add a store with `quire cluster add-store`"
                    )),
                    None => e,
                })?;
            changes.push(done);
        }
        let m = client
            .metadata()
            .await
            .context("reading the cluster after the change")?;
        Ok(MembersReport {
            changes,
            voters: m.stores.iter().filter(|s| s.voter).count(),
            stores: m.stores.len(),
            ack_quorum: m.ack_quorum,
        })
    })
}

/// One change: resolve the store in the master's current answer, ask, and ask again while
/// the master says "not yet".
async fn change(
    client: &BrokerClient,
    action: VoterChange,
    named: &str,
    deadline: Instant,
    timeout: Duration,
) -> anyhow::Result<ChangeMade> {
    let mut noted = false;
    loop {
        let m = client
            .metadata()
            .await
            .context("reading the stores from the master")?;
        let (index, store) = resolve(&m.stores, named, action)?;
        let request = VoterChangeRequest {
            action,
            store_index: index,
            store_id: store.store_id,
            incarnation: store.incarnation,
        };
        let left = deadline.saturating_duration_since(Instant::now());
        let answer = tokio::time::timeout(left, client.change_voters(request)).await;
        let made = ChangeMade {
            action: match action {
                VoterChange::Add => "add",
                VoterChange::Remove => "remove",
            },
            index,
            addr: store.addr.clone(),
            store_id: format!("{:016x}", store.store_id.0),
            incarnation: format!("{:016x}", store.incarnation.0),
        };
        let e = match answer {
            Ok(Ok(())) => return Ok(made),
            Ok(Err(e)) => e,
            Err(_) => bail!(
                "the master did not confirm the change within {} (--timeout sets it); \
                 `quire cluster status` shows whether it is in progress",
                format_duration(timeout)
            ),
        };
        let retry = matches!(
            &e,
            ClientError::Remote(r)
                if matches!(r.code, ErrorCode::ChangeInProgress | ErrorCode::StoreCatchingUp)
        );
        if !retry {
            return Err(anyhow::Error::new(e).context(format!(
                "the master refused to {} store {index} ({})",
                made.action, store.addr
            )));
        }
        if Instant::now() + RETRY_PAUSE >= deadline {
            return Err(anyhow::Error::new(e).context(format!(
                "still not done after {} (--timeout sets it)",
                format_duration(timeout)
            )));
        }
        if !noted {
            eprintln!("waiting: {e}");
            noted = true;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// The store `named` (an address, a position, or a store id in hex) among the master's
/// stores, with the identity to name in the request.
///
/// # Errors
/// No store matches, or the master does not know the store's identity (it never answered).
pub fn resolve<'a>(
    stores: &'a [StoreInfo],
    named: &str,
    action: VoterChange,
) -> anyhow::Result<(u16, &'a StoreInfo)> {
    let by_index = named.parse::<usize>().ok().filter(|&i| i < stores.len());
    let by_id = (named.len() == 16)
        .then(|| u64::from_str_radix(named, 16).ok())
        .flatten();
    let found = stores.iter().enumerate().find(|(i, s)| {
        s.addr == named || Some(*i) == by_index || by_id.is_some_and(|id| s.store_id.0 == id)
    });
    let Some((i, s)) = found else {
        let known: Vec<&str> = stores.iter().map(|s| s.addr.as_str()).collect();
        bail!(
            "no store {named:?} in the brokers' store list ({}); a new address must be added to \
             every broker's `stores` setting first",
            known.join(", ")
        );
    };
    if s.store_id == StoreId(0) && s.incarnation == Incarnation(0) {
        bail!(
            "the master does not know the identity of store {i} ({}): {}",
            s.addr,
            match action {
                VoterChange::Add => "is it running, initialised and reachable from the master?",
                VoterChange::Remove => "it is not a voter",
            }
        );
    }
    let index = u16::try_from(i).context("store index")?;
    Ok((index, s))
}

/// Prints a report in the chosen format.
///
/// # Errors
/// Writing to stdout failed.
pub fn print(report: &MembersReport, format: OutputFormat) -> anyhow::Result<()> {
    crate::output::emit(report, format, &mut io::stdout().lock())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(id: u64, addr: &str) -> StoreInfo {
        StoreInfo {
            store_id: StoreId(id),
            incarnation: Incarnation(id),
            addr: addr.into(),
            voter: true,
            persisted: None,
            connected: true,
            corrupt: None,
            lag_bytes: None,
            catch_up_rate: None,
            catch_up_ms: None,
        }
    }

    #[test]
    fn a_store_is_named_by_address_position_or_id() {
        let stores = vec![store(0xab, "s0:1"), store(0xcd, "s1:1"), store(0, "s2:1")];
        let add = VoterChange::Add;
        assert_eq!(resolve(&stores, "s1:1", add).expect("by address").0, 1);
        assert_eq!(resolve(&stores, "0", add).expect("by position").0, 0);
        assert_eq!(
            resolve(&stores, "00000000000000cd", VoterChange::Remove)
                .expect("by id")
                .0,
            1
        );
        let unknown = resolve(&stores, "s9:1", add).expect_err("not listed");
        assert!(
            unknown.to_string().contains("s0:1, s1:1, s2:1"),
            "{unknown}"
        );
        let silent = resolve(&stores, "s2:1", add).expect_err("identity unknown");
        assert!(silent.to_string().contains("running"), "{silent}");
    }
}
