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
use quire_client::{ClientError, Discovery};
use quire_proto::{ErrorCode, Incarnation, StoreId, StoreInfo, VoterChange, VoterChangeRequest};
use serde::Serialize;

use super::master::{admin_discovery, find_master_noting, MasterBound};
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
        let (discovery, bound) = admin_discovery(&options.brokers, timeout)?;
        let ask = Ask {
            discovery: &discovery,
            bound: &bound,
            deadline,
            timeout,
        };
        if let [Step::Remove(old), Step::Add(with)] = steps {
            // A replacement checks what it can of the store to add before it removes
            // anything, so a typo does not leave the cluster a voter short.
            let master = find_master_noting(&discovery, bound.clone()).await?;
            let m = master
                .client
                .metadata()
                .await
                .context("reading the stores")?;
            let (old_index, _) = resolve(&m.stores, old, VoterChange::Remove)?;
            let by_index = with.parse::<usize>().ok();
            let with_index = m
                .stores
                .iter()
                .position(|s| s.addr == *with)
                .or(by_index.filter(|&i| i < m.stores.len()));
            match with_index {
                None => {
                    resolve(&m.stores, with, VoterChange::Add)?;
                }
                Some(i) if i == usize::from(old_index) => {}
                Some(_) => {
                    let (i, s) = resolve(&m.stores, with, VoterChange::Add)?;
                    if s.voter {
                        bail!(
                            "store {i} ({}) is already a voter: nothing was removed",
                            s.addr
                        );
                    }
                }
            }
        }
        let mut changes: Vec<ChangeMade> = Vec::new();
        for step in steps {
            let (action, named) = match step {
                Step::Add(s) => (VoterChange::Add, *s),
                Step::Remove(s) => (VoterChange::Remove, *s),
            };
            let done = ask
                .change(action, named)
                .await
                .map_err(|e| match changes.last() {
                    Some(ChangeMade { index, addr, .. }) => e.context(format!(
                        "this command removed store {index} ({addr}) from the voter set; \
                     add a store with `quire cluster add-store`"
                    )),
                    None => e,
                })?;
            changes.push(done);
        }
        let master = find_master_noting(&discovery, bound.clone()).await?;
        let m = master
            .client
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

/// What every change needs to find the master and to give up.
struct Ask<'a> {
    discovery: &'a Discovery,
    bound: &'a MasterBound,
    deadline: Instant,
    timeout: Duration,
}

impl Ask<'_> {
    /// One change: resolve the store in the master's current answer, ask, and ask again
    /// while the master says "not yet" or the outcome is unknown (a lost connection, a
    /// master that stepped down, a timeout), at the master found then. A retried change
    /// that the master finds already made ("already a voter", "not a voter") was made by an
    /// earlier attempt.
    async fn change(&self, action: VoterChange, named: &str) -> anyhow::Result<ChangeMade> {
        let mut noted = false;
        let mut sent: Option<VoterChangeRequest> = None;
        loop {
            let left = self.deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!(
                    "not done within {} (--timeout sets it); `quire cluster status` shows \
                     whether a change is in progress",
                    format_duration(self.timeout)
                );
            }
            let master = find_master_noting(
                self.discovery,
                MasterBound {
                    timeout: left,
                    ..self.bound.clone()
                },
            )
            .await?;
            let client = &master.client;
            let m = match client.metadata().await {
                Ok(m) => m,
                Err(e) => {
                    self.pause(&mut noted, &e).await;
                    continue;
                }
            };
            let request = match sent {
                Some(r) => r,
                None => {
                    let (index, store) = resolve(&m.stores, named, action)?;
                    VoterChangeRequest {
                        action,
                        store_index: index,
                        store_id: store.store_id,
                        incarnation: store.incarnation,
                    }
                }
            };
            let addr = m
                .stores
                .get(usize::from(request.store_index))
                .map_or_else(String::new, |s| s.addr.clone());
            let made = ChangeMade {
                action: match action {
                    VoterChange::Add => "add",
                    VoterChange::Remove => "remove",
                },
                index: request.store_index,
                addr,
                store_id: format!("{:016x}", request.store_id.0),
                incarnation: format!("{:016x}", request.incarnation.0),
            };
            let answer = tokio::time::timeout(left, client.change_voters(request)).await;
            let e = match answer {
                Ok(Ok(())) => return Ok(made),
                Ok(Err(e)) => e,
                Err(_) => {
                    sent = Some(request);
                    continue;
                }
            };
            let code = match &e {
                ClientError::Remote(r) => Some((r.code, r.message.clone())),
                _ => None,
            };
            match code {
                Some((ErrorCode::ChangeInProgress | ErrorCode::StoreCatchingUp, _)) => {}
                Some((ErrorCode::VoterChangeRefused, message)) if sent.is_some() => {
                    let already = match action {
                        VoterChange::Add => message.contains("is already a voter"),
                        VoterChange::Remove => message.contains("is not a voter"),
                    };
                    if already {
                        return Ok(made);
                    }
                    return Err(anyhow::Error::new(e).context(format!(
                        "the master refused to {} store {}",
                        made.action, made.index
                    )));
                }
                Some((ErrorCode::NotMaster | ErrorCode::NoQuorum | ErrorCode::Timeout, _))
                | None => {
                    // The outcome is unknown: ask again, at whichever master there is.
                    sent = Some(request);
                }
                Some(_) => {
                    return Err(anyhow::Error::new(e).context(format!(
                        "the master refused to {} store {} ({})",
                        made.action, made.index, made.addr
                    )));
                }
            }
            self.pause(&mut noted, &e).await;
        }
    }

    /// Waits before the next attempt; says why once.
    async fn pause(&self, noted: &mut bool, why: &ClientError) {
        if !*noted {
            eprintln!("waiting: {why}");
            *noted = true;
        }
        tokio::time::sleep(RETRY_PAUSE).await;
    }
}

/// The store `named` (an address, a position, or a store id in hex) among the master's
/// stores, with the identity to name in the request.
///
/// # Errors
/// No store matches (the message says which kind of name was not found), or the master
/// does not know the store's identity (it never answered).
pub fn resolve<'a>(
    stores: &'a [StoreInfo],
    named: &str,
    action: VoterChange,
) -> anyhow::Result<(u16, &'a StoreInfo)> {
    let position = named.parse::<usize>().ok();
    let by_id = (named.len() == 16)
        .then(|| u64::from_str_radix(named, 16).ok())
        .flatten();
    let found = stores.iter().enumerate().find(|(i, s)| {
        s.addr == named || Some(*i) == position || by_id.is_some_and(|id| s.store_id.0 == id)
    });
    let Some((i, s)) = found else {
        if let Some(p) = position {
            bail!(
                "there is no store at position {p}: the store list has {} (0..={})",
                stores.len(),
                stores.len().saturating_sub(1)
            );
        }
        if by_id.is_some() {
            let ids: Vec<String> = stores
                .iter()
                .map(|s| format!("{:016x}", s.store_id.0))
                .collect();
            bail!(
                "no store has id {named} (the master knows {}); `quire cluster status` shows them",
                ids.join(", ")
            );
        }
        let known: Vec<&str> = stores.iter().map(|s| s.addr.as_str()).collect();
        bail!(
            "no store {named:?} in the brokers' store list ({}); name a store by its address, \
             its position or its 16-hex-digit id; a new address must be added to every \
             broker's `stores` setting first",
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
