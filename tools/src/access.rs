//! `quire user add|remove|list` and `quire acl add|remove|list`: the cluster's users
//! (SCRAM-SHA-256 credentials) and ACL entries, which the brokers keep as replicated state
//! (written through the master into the log; see `quire_broker::security`).
//!
//! `quire user add` derives the credential here, from a password read from a file or
//! `$QUIRE_NEW_PASSWORD`: a random salt, 4096 iterations of PBKDF2-HMAC-SHA-256 by default
//! (RFC 7677), and the StoredKey and ServerKey of RFC 5802 §3. Neither the password nor
//! the salted password leaves this process.
//!
//! Changes go to the master and are answered once stabilized, so every broker applies
//! them; listings come from the master too, so they show the changes just made.

use std::io::{self, Write};
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, Subcommand};
use quire_client::{BrokerClient, ClientError, Discovery, DiscoveryConfig};
use quire_proto::ErrorCode;
use quire_proto::{
    AclAction, AclAdminEvent, AclEntry, AclOperation, DescribeSecurityResponse, UserAdminEvent,
    PRINCIPAL_BYTES_MAX,
};
use serde::Serialize;

use crate::cli::FormatArgs;
use crate::cluster::master::{find_master_noting, ConnectArgs};
use crate::cluster::{runtime, BrokersArgs};
use crate::output::Report;

/// The variable `quire user add` reads the new password from when no file is given.
pub const NEW_PASSWORD_ENV: &str = "QUIRE_NEW_PASSWORD";
/// The default of `quire user add --new-password-file`.
pub const NEW_PASSWORD_FILE_ENV: &str = "QUIRE_NEW_PASSWORD_FILE";

/// `quire user ...`
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user, or set a new password for one, with a SCRAM-SHA-256 credential derived
    /// here (the password never reaches the brokers).
    Add(UserAddArgs),
    /// Remove a user: its connections stay open, new ones cannot log in as it.
    Remove(UserRemoveArgs),
    /// List the users (names and iterations, never keys).
    List(ListArgs),
}

/// `quire acl ...`
#[derive(Debug, Subcommand)]
pub enum AclCommand {
    /// Allow a principal an operation on the topics a pattern matches.
    Add(AclArgs),
    /// Remove an entry added before (the same three values).
    Remove(AclArgs),
    /// List the entries, and whether the master enforces them.
    List(ListArgs),
}

/// Where to reach the cluster: brokers, TLS, user, connect timeout.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    #[command(flatten)]
    pub brokers: BrokersArgs,
    #[command(flatten)]
    pub connect: ConnectArgs,
}

/// Arguments of `quire user add`.
#[derive(Debug, Clone, Args)]
pub struct UserAddArgs {
    /// The user's name (what ACL entries and super_users name).
    pub name: String,

    /// File whose first line is the new password (`-`: standard input). Default:
    /// $QUIRE_NEW_PASSWORD_FILE, else the password in $QUIRE_NEW_PASSWORD.
    #[arg(
        long,
        value_name = "FILE",
        env = "QUIRE_NEW_PASSWORD_FILE",
        hide_env = true
    )]
    pub new_password_file: Option<PathBuf>,

    /// PBKDF2 iterations of the credential (4096..=1048576; more is slower for an attacker
    /// with a stolen credential and for every login).
    #[arg(long, value_name = "N", default_value_t = quire_tls::scram::ITERATIONS_DEFAULT)]
    pub iterations: u32,

    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Arguments of `quire user remove`.
#[derive(Debug, Clone, Args)]
pub struct UserRemoveArgs {
    /// The user's name.
    pub name: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Arguments of `quire user list` and `quire acl list`.
#[derive(Debug, Clone, Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Arguments of `quire acl add` and `quire acl remove`.
#[derive(Debug, Clone, Args)]
pub struct AclArgs {
    /// Who: a user name, a certificate's common name, ANONYMOUS, or '*' for everyone.
    #[arg(long, value_name = "NAME")]
    pub principal: String,

    /// What: produce, consume (fetch and read cursors), commit (cursors), admin (users,
    /// ACLs, handoff; with --topic '*'), or all.
    #[arg(long, value_name = "OP", value_parser = parse_operation)]
    pub operation: AclOperation,

    /// On which topics: a name, '*' for all, or a prefix followed by '*' ('orders.*').
    #[arg(long, value_name = "TOPIC")]
    pub topic: String,

    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

fn parse_operation(s: &str) -> Result<AclOperation, String> {
    AclOperation::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = AclOperation::ALL.iter().map(|o| o.name()).collect();
        format!("unknown operation {s:?}; one of {}", names.join(", "))
    })
}

/// The master that answered.
#[derive(Debug, Clone, Serialize)]
pub struct MasterRef {
    /// Broker id.
    pub id: u16,
    /// `host:port`.
    pub addr: String,
}

/// What a change reports.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeReport {
    /// `"user_set"`, `"user_remove"`, `"acl_add"` or `"acl_remove"`.
    pub action: &'static str,
    /// The user, for a user change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The entry, for an ACL change.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub acl: Option<AclRow>,
    /// Whether the cluster's state changed (`false`: the entry was there already).
    pub changed: bool,
    /// What was done, in words.
    pub done: String,
    /// The master that stabilized it (`None` when nothing was sent).
    pub master: Option<MasterRef>,
}

impl Report for ChangeReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        match &self.master {
            Some(m) => writeln!(out, "{} (master: broker {} at {})", self.done, m.id, m.addr),
            None => writeln!(out, "{}", self.done),
        }
    }
}

/// One user as listed.
#[derive(Debug, Clone, Serialize)]
pub struct UserRow {
    /// Its name.
    pub user: String,
    /// Its login mechanism (always `SCRAM-SHA-256`).
    pub mechanism: &'static str,
    /// Its credential's iterations.
    pub iterations: u32,
}

/// `quire user list`'s report.
#[derive(Debug, Clone, Serialize)]
pub struct UsersReport {
    /// Every user.
    pub users: Vec<UserRow>,
}

impl Report for UsersReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.users.is_empty() {
            return writeln!(out, "no users");
        }
        writeln!(out, "{:<32} {:<14} ITERATIONS", "USER", "MECHANISM")?;
        for u in &self.users {
            writeln!(out, "{:<32} {:<14} {}", u.user, u.mechanism, u.iterations)?;
        }
        Ok(())
    }
}

/// One ACL entry as listed.
#[derive(Debug, Clone, Serialize)]
pub struct AclRow {
    /// Who.
    pub principal: String,
    /// May do what.
    pub operation: &'static str,
    /// On which topics.
    pub topic: String,
}

/// `quire acl list`'s report.
#[derive(Debug, Clone, Serialize)]
pub struct AclsReport {
    /// Whether the master enforces the entries (`authorization = "acl"`).
    pub enforced: bool,
    /// Every entry.
    pub acls: Vec<AclRow>,
}

impl Report for AclsReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.enforced {
            writeln!(
                out,
                "enforced: the master checks requests against these entries"
            )?;
        } else {
            writeln!(
                out,
                "not enforced: the master's authorization is \"none\" (everyone may do everything)"
            )?;
        }
        if self.acls.is_empty() {
            return writeln!(out, "no ACL entries");
        }
        writeln!(out, "{:<24} {:<9} TOPIC", "PRINCIPAL", "OPERATION")?;
        for a in &self.acls {
            writeln!(out, "{:<24} {:<9} {}", a.principal, a.operation, a.topic)?;
        }
        Ok(())
    }
}

impl ClusterArgs {
    /// Fills in the brokers and connect timeout from flags, variables and the profile.
    pub(crate) fn resolve(&mut self, env: &crate::settings::Env) -> anyhow::Result<()> {
        self.brokers.resolve(Some(&mut self.connect), env)?;
        Ok(())
    }
}

pub(crate) fn emit(report: &impl Report, format: &FormatArgs) -> anyhow::Result<()> {
    crate::output::emit(report, format.format, &mut io::stdout().lock())?;
    Ok(())
}

/// Runs a `quire user` command, printing its report.
///
/// # Errors
/// As [`user_add`], [`user_remove`], [`user_list`]; settings that do not resolve.
pub fn run_user(command: UserCommand, env: &crate::settings::Env) -> anyhow::Result<()> {
    match command {
        UserCommand::Add(mut args) => {
            args.cluster.resolve(env)?;
            emit(&user_add(&args)?, &args.format)
        }
        UserCommand::Remove(mut args) => {
            args.cluster.resolve(env)?;
            emit(&user_remove(&args)?, &args.format)
        }
        UserCommand::List(mut args) => {
            args.cluster.resolve(env)?;
            emit(&user_list(&args)?, &args.format)
        }
    }
}

/// Runs a `quire acl` command, printing its report.
///
/// # Errors
/// As [`acl_change`], [`acl_list`]; settings that do not resolve.
pub fn run_acl(command: AclCommand, env: &crate::settings::Env) -> anyhow::Result<()> {
    match command {
        AclCommand::Add(mut args) => {
            args.cluster.resolve(env)?;
            emit(&acl_change(&args, AclAction::Add)?, &args.format)
        }
        AclCommand::Remove(mut args) => {
            args.cluster.resolve(env)?;
            emit(&acl_change(&args, AclAction::Remove)?, &args.format)
        }
        AclCommand::List(mut args) => {
            args.cluster.resolve(env)?;
            emit(&acl_list(&args)?, &args.format)
        }
    }
}

/// Runs `f` against the master `cluster` leads to.
pub(crate) fn with_master<T>(
    cluster: &ClusterArgs,
    name: &str,
    f: impl AsyncFnOnce(&BrokerClient) -> Result<T, ClientError>,
) -> anyhow::Result<(T, MasterRef)> {
    let rt = runtime(name)?;
    rt.block_on(async {
        let bound = crate::cluster::master::MasterBound {
            tls: cluster.brokers.tls()?,
            sasl: cluster.brokers.sasl()?,
            ..cluster.connect.bound()
        };
        let config = bound.discovery_config(DiscoveryConfig::default());
        let discovery =
            Discovery::new(cluster.brokers.addrs(), config).context("reading --brokers")?;
        let master = find_master_noting(&discovery, bound).await?;
        let at = MasterRef {
            id: master.master.id.0,
            addr: master.master.addr.clone(),
        };
        let out = f(&master.client).await.map_err(|e| {
            let unknown = matches!(e.code(), Some(ErrorCode::Timeout | ErrorCode::NoQuorum))
                || e.is_connection_lost();
            let e = anyhow::Error::new(e)
                .context(format!("asking the master, broker {} at {}", at.id, at.addr));
            if unknown {
                e.context("the change may or may not have been made: check with `list`, and repeat it if it is missing (repeating a change is harmless)")
            } else {
                e
            }
        })?;
        Ok((out, at))
    })
}

/// The new password for `quire user add`: the first line of `--new-password-file` (`-`:
/// stdin), else `$QUIRE_NEW_PASSWORD`.
fn new_password(args: &UserAddArgs) -> anyhow::Result<String> {
    match &args.new_password_file {
        Some(p) if p.as_os_str() == "-" => {
            let mut line = String::new();
            io::stdin()
                .read_line(&mut line)
                .context("reading the new password from stdin")?;
            let line = line.trim_end_matches(['\n', '\r']).to_owned();
            if line.is_empty() {
                bail!("the new password on stdin is empty");
            }
            Ok(line)
        }
        Some(p) => crate::cluster::read_password_file(p),
        None => match std::env::var(NEW_PASSWORD_ENV) {
            Ok(p) if !p.is_empty() => Ok(p),
            _ => bail!(
                "no password for {}: give --new-password-file FILE (- for stdin) or set $QUIRE_NEW_PASSWORD",
                args.name
            ),
        },
    }
}

fn check_principal(what: &str, name: &str) -> anyhow::Result<()> {
    if name.is_empty() || name.len() > PRINCIPAL_BYTES_MAX {
        bail!("{what}: a name must have 1..={PRINCIPAL_BYTES_MAX} bytes");
    }
    Ok(())
}

/// Runs `quire user add`.
///
/// # Errors
/// No password, iterations out of bounds, no master, a refusal (`Unauthorized`,
/// `LimitReached`, `InvalidName`), a lost connection.
pub fn user_add(args: &UserAddArgs) -> anyhow::Result<ChangeReport> {
    check_principal("the user name", &args.name)?;
    let password = new_password(args)?;
    let credential = quire_tls::scram::new_credential(&password, args.iterations)?;
    let change = UserAdminEvent {
        user: args.name.clone(),
        credential: Some(credential),
    };
    let ((), master) = with_master(&args.cluster, "user", async |c| c.user_admin(change).await)?;
    Ok(ChangeReport {
        action: "user_set",
        user: Some(args.name.clone()),
        acl: None,
        changed: true,
        done: format!(
            "user {:?} set (SCRAM-SHA-256, {} iterations)",
            args.name, args.iterations
        ),
        master: Some(master),
    })
}

/// Runs `quire user remove`: a user that does not exist is an error (nothing is sent).
///
/// # Errors
/// No such user, no master, a refusal, a lost connection.
pub fn user_remove(args: &UserRemoveArgs) -> anyhow::Result<ChangeReport> {
    check_principal("the user name", &args.name)?;
    let change = UserAdminEvent {
        user: args.name.clone(),
        credential: None,
    };
    let name = args.name.clone();
    let (found, master) = with_master(&args.cluster, "user", async |c| {
        if !c
            .describe_security()
            .await?
            .users
            .iter()
            .any(|u| u.user == name)
        {
            return Ok(false);
        }
        c.user_admin(change).await.map(|()| true)
    })?;
    if !found {
        bail!(
            "there is no user {:?} (quire user list shows them); nothing removed",
            args.name
        );
    }
    Ok(ChangeReport {
        action: "user_remove",
        user: Some(args.name.clone()),
        acl: None,
        changed: true,
        done: format!(
            "user {:?} removed (its ACL entries stay: quire acl list)",
            args.name
        ),
        master: Some(master),
    })
}

fn describe(args: &ListArgs) -> anyhow::Result<DescribeSecurityResponse> {
    let (d, _) = with_master(&args.cluster, "list", async |c| c.describe_security().await)?;
    Ok(d)
}

/// Runs `quire user list`.
///
/// # Errors
/// No master, a refusal, a lost connection.
pub fn user_list(args: &ListArgs) -> anyhow::Result<UsersReport> {
    Ok(UsersReport {
        users: describe(args)?
            .users
            .into_iter()
            .map(|u| UserRow {
                user: u.user,
                mechanism: quire_tls::scram::MECHANISM,
                iterations: u.iterations,
            })
            .collect(),
    })
}

/// Runs `quire acl add` (`action` Add) or `quire acl remove`. Adding an entry that is
/// there, or removing one that is not, sends nothing: the first reports `changed: false`,
/// the second is an error (an operator must not believe a right was taken away).
///
/// # Errors
/// A bad pattern, no such entry to remove, no master, a refusal, a lost connection.
pub fn acl_change(args: &AclArgs, action: AclAction) -> anyhow::Result<ChangeReport> {
    check_principal("--principal", &args.principal)?;
    if args.operation == AclOperation::Admin && args.topic != "*" {
        bail!("admin is about the cluster, not a topic: give --topic '*'");
    }
    quire_proto::validate_topic(&args.topic).context("--topic")?;
    let entry = AclEntry {
        principal: args.principal.clone(),
        operation: args.operation,
        topic: args.topic.clone(),
    };
    let row = AclRow {
        principal: entry.principal.clone(),
        operation: entry.operation.name(),
        topic: entry.topic.clone(),
    };
    let wanted = entry.clone();
    let change = AclAdminEvent { action, entry };
    let (present, master) = with_master(&args.cluster, "acl", async |c| {
        let present = c.describe_security().await?.acls.contains(&wanted);
        if present == (action == AclAction::Add) {
            return Ok(present);
        }
        c.acl_admin(change).await.map(|()| present)
    })?;
    let (name, changed, done) = match (action, present) {
        (AclAction::Add, true) => ("acl_add", false, format!("already there, nothing changed: {wanted}")),
        (AclAction::Add, false) => ("acl_add", true, format!("added: {wanted}")),
        (AclAction::Remove, true) => ("acl_remove", true, format!("removed: {wanted}")),
        (AclAction::Remove, false) => bail!(
            "no such entry, nothing removed: {wanted} (quire acl list shows the entries; an entry is removed by its exact principal, operation and topic)"
        ),
    };
    Ok(ChangeReport {
        action: name,
        user: None,
        acl: Some(row),
        changed,
        done,
        master: Some(master),
    })
}

/// Runs `quire acl list`.
///
/// # Errors
/// No master, a refusal, a lost connection.
pub fn acl_list(args: &ListArgs) -> anyhow::Result<AclsReport> {
    let d = describe(args)?;
    Ok(AclsReport {
        enforced: d.authorization,
        acls: d
            .acls
            .into_iter()
            .map(|a| AclRow {
                principal: a.principal,
                operation: a.operation.name(),
                topic: a.topic,
            })
            .collect(),
    })
}
