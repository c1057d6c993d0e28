//! `quire topic create|delete|list`: topics as replicated state, created and deleted
//! through the master (a topic-admin event in the log, answered once stabilized) and
//! listed from the master's state. A topic is also created by its first message; `create`
//! makes one before any is produced (as Kafka's CreateTopics), so that consumers and ACLs
//! can name it.

use std::io::{self, Write};

use clap::{Args, Subcommand};
use quire_proto::{TopicAction, TopicAdminRequest};
use serde::Serialize;

use crate::access::{emit, with_master, ClusterArgs, MasterRef};
use crate::cli::FormatArgs;
use crate::output::Report;

/// `quire topic ...`
#[derive(Debug, Subcommand)]
pub enum TopicCommand {
    /// Create a topic (an error if it exists).
    Create(TopicCreateArgs),
    /// Delete a topic: its messages are no longer served (retention removes them from the
    /// log); a later message to the name starts it again, empty.
    Delete(TopicNameArgs),
    /// List the topics, by name.
    List(TopicListArgs),
}

/// Arguments of `quire topic create`.
#[derive(Debug, Clone, Args)]
pub struct TopicCreateArgs {
    /// The topic's name.
    pub name: String,
    /// Partitions (every topic is one partition in this version: only 1 is taken).
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub partitions: u32,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Arguments of `quire topic delete`.
#[derive(Debug, Clone, Args)]
pub struct TopicNameArgs {
    /// The topic's name.
    pub name: String,
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// Arguments of `quire topic list`.
#[derive(Debug, Clone, Args)]
pub struct TopicListArgs {
    #[command(flatten)]
    pub cluster: ClusterArgs,
    #[command(flatten)]
    pub format: FormatArgs,
}

/// What `create` and `delete` report.
#[derive(Debug, Clone, Serialize)]
pub struct TopicChangeReport {
    /// `"topic_create"` or `"topic_delete"`.
    pub action: &'static str,
    /// The topic.
    pub topic: String,
    /// The master that stabilized the change.
    pub master: MasterRef,
}

impl Report for TopicChangeReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let done = if self.action == "topic_create" {
            "created"
        } else {
            "deleted"
        };
        writeln!(
            out,
            "topic {:?} {done} (master: broker {} at {})",
            self.topic, self.master.id, self.master.addr
        )
    }
}

/// What `list` reports.
#[derive(Debug, Clone, Serialize)]
pub struct TopicsReport {
    /// Every topic, by name.
    pub topics: Vec<String>,
}

impl Report for TopicsReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        if self.topics.is_empty() {
            return writeln!(out, "no topics");
        }
        for t in &self.topics {
            writeln!(out, "{t}")?;
        }
        Ok(())
    }
}

/// Runs a `quire topic` command, printing its report.
///
/// # Errors
/// A bad name, no master, a refusal (`TopicExists`, `InvalidPartitions`, `UnknownTopic`,
/// `LimitReached`, `Unauthorized`), a lost connection; settings that do not resolve.
pub fn run(command: TopicCommand, env: &crate::settings::Env) -> anyhow::Result<()> {
    match command {
        TopicCommand::Create(mut args) => {
            args.cluster.resolve(env)?;
            let r = change(
                &args.cluster,
                TopicAction::Create,
                &args.name,
                args.partitions,
            )?;
            emit(&r, &args.format)
        }
        TopicCommand::Delete(mut args) => {
            args.cluster.resolve(env)?;
            let r = change(&args.cluster, TopicAction::Delete, &args.name, 0)?;
            emit(&r, &args.format)
        }
        TopicCommand::List(mut args) => {
            args.cluster.resolve(env)?;
            let (mut topics, _) = with_master(&args.cluster, "topic", async |c| c.topics().await)?;
            topics.sort();
            emit(&TopicsReport { topics }, &args.format)
        }
    }
}

fn change(
    cluster: &ClusterArgs,
    action: TopicAction,
    name: &str,
    partitions: u32,
) -> anyhow::Result<TopicChangeReport> {
    quire_proto::validate_topic(name)?;
    let req = TopicAdminRequest {
        action,
        topic: name.to_owned(),
        partitions,
    };
    let ((), master) = with_master(cluster, "topic", async |c| c.topic_admin(req).await)?;
    Ok(TopicChangeReport {
        action: match action {
            TopicAction::Create => "topic_create",
            TopicAction::Delete => "topic_delete",
        },
        topic: name.to_owned(),
        master,
    })
}
