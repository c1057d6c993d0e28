//! `quire cluster handoff`: ask the master to hand mastership to a named slave broker
//! (DESIGN.md "Graceful handoff"; the broker side is `broker/src/server/actor/handoff.rs`).
//!
//! The master is found through `Metadata` from any broker given (following `NotMaster`
//! hints), then sent one `HandoffRequest { to }`. The master stops taking new producer
//! batches, waits until its HWM covers everything it accepted, tells the target to take
//! over, steps down, and answers once the new master's epoch-start event is stabilized.
//! Producers see a short pause and a retriable `NotMaster`, never a failed message.
//!
//! # JSON (`--format json`)
//! ```json
//! {"from":{"id":1,"addr":"127.0.0.1:7201"},"to":2,"epoch":131074,"master":2,"pause_us":23000}
//! ```
//! `epoch` is the new master's epoch, `pause_us` the time from the request's arrival at the
//! old master to the new master serving, in microseconds (it can overstate the pause by up
//! to one heartbeat).

use std::io::{self, Write};
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Args;
use quire_client::{ConnConfig, Discovery, DiscoveryConfig};
use quire_proto::{Body, BrokerId, HandoffRequest};
use serde::Serialize;

use super::{runtime, BrokersArgs};
use crate::cli::FormatArgs;
use crate::output::{OutputFormat, Report};
use crate::units::parse_duration;

/// Arguments of `quire cluster handoff`.
#[derive(Debug, Clone, Args)]
pub struct HandoffArgs {
    #[command(flatten)]
    pub brokers: BrokersArgs,

    /// Id of the slave broker that should become master.
    #[arg(long, value_name = "ID")]
    pub to: u16,

    /// How long to wait for the handoff to finish (finding the master included). The
    /// master itself gives up after twice its election timeout (at least 2 s).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "15s")]
    pub timeout: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// A broker as the report names it.
#[derive(Debug, Clone, Serialize)]
pub struct BrokerRef {
    /// Broker id.
    pub id: u16,
    /// `host:port`.
    pub addr: String,
}

/// What a finished handoff reports.
#[derive(Debug, Clone, Serialize)]
pub struct HandoffReport {
    /// The master that handed over.
    pub from: BrokerRef,
    /// The broker asked to take over.
    pub to: u16,
    /// The new master's epoch.
    pub epoch: u64,
    /// The new master (equals `to`).
    pub master: u16,
    /// Producers' pause, in microseconds.
    pub pause_us: u64,
}

impl Report for HandoffReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "handoff done: broker {} ({}) -> broker {}; new epoch {}; producers paused {:.1} ms",
            self.from.id,
            self.from.addr,
            self.master,
            self.epoch,
            self.pause_us as f64 / 1000.0
        )
    }
}

/// Runs `quire cluster handoff`.
///
/// # Errors
/// No master could be found within the timeout; the master refused (unknown target, the
/// target is the master itself, a handoff already running) or timed out (the target did
/// not answer: the old master then serves again); a lost connection.
pub fn run(args: &HandoffArgs) -> anyhow::Result<HandoffReport> {
    let rt = runtime("handoff")?;
    let timeout = args.timeout.max(Duration::from_secs(1));
    rt.block_on(async {
        let config = DiscoveryConfig {
            conn: ConnConfig {
                request_timeout: timeout,
                ..ConnConfig::default()
            },
            discovery_timeout_ms: u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX),
            ..DiscoveryConfig::default()
        };
        let discovery =
            Discovery::new(args.brokers.addrs(), config).context("reading --brokers")?;
        let master = discovery
            .find_master(None)
            .await
            .context("finding the master")?;
        let from = BrokerRef {
            id: master.master.id.0,
            addr: master.master.addr.clone(),
        };
        if from.id == args.to {
            bail!("broker {} is already the master", args.to);
        }
        let request = HandoffRequest {
            to: BrokerId(args.to),
        };
        let answer = tokio::time::timeout(timeout, master.client.request(request.into()))
            .await
            .with_context(|| format!("no answer from the master within {timeout:?}"))?
            .with_context(|| format!("handoff request to broker {} ({})", from.id, from.addr))?;
        match answer.body {
            Body::HandoffResponse(r) => Ok(HandoffReport {
                from,
                to: args.to,
                epoch: r.epoch.0,
                master: r.master.0,
                pause_us: r.pause_us,
            }),
            Body::ErrorResponse(e) => bail!(
                "the master refused the handoff: {:?} ({}): {}",
                e.code,
                e.code.as_u16(),
                e.message
            ),
            other => bail!(
                "unexpected answer to a handoff request: {:?}",
                other.frame_type()
            ),
        }
    })
}

/// Prints a report in the chosen format.
///
/// # Errors
/// Writing to stdout failed.
pub fn print(report: &HandoffReport, format: OutputFormat) -> anyhow::Result<()> {
    crate::output::emit(report, format, &mut io::stdout().lock())?;
    Ok(())
}
