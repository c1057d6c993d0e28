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
use quire_proto::{Body, BrokerId, ErrorCode, HandoffRequest};
use serde::Serialize;

use super::master::{admin_discovery, find_master_noting};
use super::{runtime, BrokersArgs};
use crate::cli::FormatArgs;
use crate::output::{OutputFormat, Report};
use crate::units::{format_duration, parse_duration};

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
        let (discovery, bound) = admin_discovery(&args.brokers, timeout)?;
        let master = find_master_noting(&discovery, bound).await?;
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
            .with_context(|| {
                format!(
                    "no answer from the master, broker {} ({}), within {} (--timeout sets it)",
                    from.id,
                    from.addr,
                    format_duration(timeout)
                )
            })?
            .with_context(|| format!("handoff request to broker {} ({})", from.id, from.addr))?;
        match answer.body {
            Body::HandoffResponse(r) => Ok(HandoffReport {
                from,
                to: args.to,
                epoch: r.epoch.0,
                master: r.master.0,
                pause_us: r.pause_us,
            }),
            Body::ErrorResponse(e) => bail!("{}", failure(&from, args.to, e.code, &e.message)),
            other => bail!(
                "unexpected answer to a handoff request: {:?}",
                other.frame_type()
            ),
        }
    })
}

/// The error for a handoff the master answered with an error: who answered, about which
/// target, the master's own explanation and code, and for a `Timeout` (the master gave up
/// waiting, usually for the target) what to check.
#[must_use]
pub fn failure(from: &BrokerRef, to: u16, code: ErrorCode, message: &str) -> String {
    let master = format!("the master, broker {} ({}),", from.id, from.addr);
    let timed_out = code == ErrorCode::Timeout;
    let code = format!("{code:?}, code {}", code.as_u16());
    if timed_out {
        format!(
            "handoff to broker {to} failed: {master} gave up: {message} [{code}]; check that \
             broker {to} is running and reachable from the master (`quire cluster status` \
             shows which brokers answer)"
        )
    } else {
        format!("{master} refused the handoff to broker {to}: {message} [{code}]")
    }
}

/// Prints a report in the chosen format.
///
/// # Errors
/// Writing to stdout failed.
pub fn print(report: &HandoffReport, format: OutputFormat) -> anyhow::Result<()> {
    crate::output::emit(report, format, &mut io::stdout().lock())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn master() -> BrokerRef {
        BrokerRef {
            id: 1,
            addr: "127.0.0.1:7201".into(),
        }
    }

    #[test]
    fn a_timed_out_handoff_names_the_target_and_what_to_check() {
        let text = failure(
            &master(),
            2,
            ErrorCode::Timeout,
            "broker 2 (127.0.0.1:7202) is not connected to the master",
        );
        assert!(
            text.starts_with("handoff to broker 2 failed: the master, broker 1 (127.0.0.1:7201), gave up: broker 2 (127.0.0.1:7202) is not connected"),
            "{text}"
        );
        assert!(text.contains("[Timeout, code 206]"), "{text}");
        assert!(text.contains("check that broker 2 is running"), "{text}");
    }

    #[test]
    fn a_refusal_says_who_refused_and_why() {
        let text = failure(
            &master(),
            9,
            ErrorCode::InvalidName,
            "broker 9 is not another broker of this cluster",
        );
        assert_eq!(
            text,
            format!(
                "the master, broker 1 (127.0.0.1:7201), refused the handoff to broker 9: broker 9 \
                 is not another broker of this cluster [InvalidName, code {}]",
                ErrorCode::InvalidName.as_u16()
            )
        );
    }
}
