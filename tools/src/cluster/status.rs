//! `quire cluster status`: the cluster as its brokers report it in `Metadata` answers.
//!
//! Every broker given, and every broker named in an answer, is asked once (concurrently,
//! each connect + request bounded by the timeout). The **master** is a broker that names
//! itself master in its own answer (the highest epoch wins if two do, as after a failover
//! a fenced master may still believe it leads); the epoch, the high-water mark and the
//! stores come from its answer, because only the master counts persisted acks. Without a
//! confirmed master, they come from the answer with the highest epoch, and `master` is
//! `null`.
//!
//! Each broker reports its own *applied* offset (the highest stabilized offset applied to
//! its copy of the broker state): on a slave it trails the master's HWM by the replication
//! lag. What `Metadata` does not carry, and this command therefore cannot show: the stores'
//! own log ends (only the highest offset each acked to this master).
//!
//! # JSON (`--format json`)
//! ```json
//! {"master":{"id":1,"addr":"127.0.0.1:7201"},"epoch":65537,"hwm":41,
//!  "stores":[{"index":0,"addr":"127.0.0.1:7101","store_id":"00c0ffee00c0ffee",
//!             "incarnation":"1234567890abcdef","role":"voter","voter":true,
//!             "persisted":41,"lag":0,"connected":true}],
//!  "voters":1,"ack_quorum":1,"change_pending":null,
//!  "brokers":[{"id":1,"addr":"127.0.0.1:7201","role":"master","epoch":65537,"hwm":41,
//!              "applied":41,"master_id":1,"error":null}],
//!  "view_of":{"id":1,"addr":"127.0.0.1:7201"}}
//! ```
//! `hwm` and `persisted` are log offsets or `null` (nothing yet); `lag` is the number of
//! offsets at or below the HWM the store has not acked (`null` when the HWM or the
//! store's figure is unknown); `connected` is whether the master has a live connection to
//! the store (`null` when the view is not the master's). A broker's `role` is `"master"`, `"slave"` or
//! `"unreachable"` (then `error` says why). A store's `role` is `"voter"`, `"learner"`, or
//! `"unknown"` when the answering broker does not know its identity yet (`store_id` and
//! `incarnation` are then zeros, `voter` is `null`). `view_of` names the broker whose answer gave
//! `epoch`, `hwm` and `stores`.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use quire_client::discovery::KNOWN_BROKERS_MAX;
use quire_client::{BrokerClient, ClientError, ConnConfig};
use quire_proto::{MetadataResponse, StoreInfo};
use serde::Serialize;
use tokio::task::JoinSet;

use super::{offsets_between, runtime, BrokersArgs};
use crate::cli::FormatArgs;
use crate::output::{OutputFormat, Report};
use crate::units::parse_duration;

/// Arguments of `quire cluster status`.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    #[command(flatten)]
    pub brokers: BrokersArgs,

    /// How long to wait for each broker (connect and answer).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub timeout: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// What `quire cluster status` needs.
#[derive(Debug, Clone)]
pub struct StatusConfig {
    /// Broker addresses to start from.
    pub brokers: Vec<String>,
    /// Bound of each broker's connect + answer.
    pub timeout: Duration,
    /// TLS towards the brokers; `None`: plaintext.
    pub tls: Option<quire_tls::TlsConnector>,
}

impl StatusArgs {
    /// The configuration these arguments describe.
    ///
    /// # Errors
    /// TLS files that cannot be read or used.
    pub fn to_config(&self) -> anyhow::Result<StatusConfig> {
        Ok(StatusConfig {
            brokers: self.brokers.addrs(),
            timeout: self.timeout,
            tls: self.brokers.tls()?,
        })
    }
}

/// A broker named by id and address.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerRef {
    /// Broker id.
    pub id: u16,
    /// `host:port`.
    pub addr: String,
}

/// One store as the master reports it.
#[derive(Debug, Clone, Serialize)]
pub struct StoreStatus {
    /// Its slot in the brokers' `--stores` list, from 0.
    pub index: usize,
    /// `host:port`.
    pub addr: String,
    /// Its store id, 16 hex digits.
    pub store_id: String,
    /// Its incarnation, 16 hex digits.
    pub incarnation: String,
    /// `"voter"`, `"learner"` (a new incarnation that never votes again), or `"unknown"`
    /// (the answering broker does not know the store's identity yet: before the first
    /// election, or a broker that never followed a master).
    pub role: &'static str,
    /// `role == "voter"`; `null` when unknown.
    pub voter: Option<bool>,
    /// Highest offset it has acked as persisted to the master, if any.
    pub persisted: Option<u64>,
    /// Offsets at or below the HWM it has not acked.
    pub lag: Option<u64>,
    /// Whether the master has a live connection to it; `None` when the view is a slave's.
    pub connected: Option<bool>,
    /// The lowest of its records the master knows damaged and not yet repaired (it grants
    /// no fence meanwhile); `None` when none is, or the view is a slave's.
    pub damaged: Option<u64>,
    /// What it is doing, in the master's view: `"down"` (no connection), `"repairing"` (a
    /// damaged record is being repaired from another store), `"catching up"` (it lacks
    /// offsets at or below the HWM), `"in sync"`; `"unknown"` in a slave's view.
    pub state: &'static str,
    /// Bytes of the offsets at or below the HWM it has not acked (the master sums the
    /// events it holds and estimates older ones at their mean size); `None` in a slave's
    /// view or while it has acked nothing to this master.
    pub lag_bytes: Option<u64>,
    /// Offsets per second its acks advanced over the master's last ~3 s.
    pub catch_up_rate: Option<u64>,
    /// Estimated ms until it holds the master's HWM: 0 in sync, `None` when it is not
    /// closing in (or unknown).
    pub catch_up_ms: Option<u64>,
}

/// One broker's answer (or why there is none).
#[derive(Debug, Clone, Serialize)]
pub struct BrokerStatus {
    /// Its id, when some answer names it.
    pub id: Option<u16>,
    /// `host:port` as asked.
    pub addr: String,
    /// `"master"`, `"slave"` or `"unreachable"`.
    pub role: &'static str,
    /// The highest epoch it knows.
    pub epoch: Option<u64>,
    /// The HWM it knows (for a slave: what it has learned from the master).
    pub hwm: Option<u64>,
    /// The highest offset it has applied to its copy of the broker state.
    pub applied: Option<u64>,
    /// The master it names, if any.
    pub master_id: Option<u16>,
    /// Its Kafka listener as Kafka clients are told it (`host:port`), if it has one.
    pub kafka: Option<String>,
    /// Why it did not answer.
    pub error: Option<String>,
}

/// The result of `quire cluster status`.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterStatus {
    /// The confirmed master, or `null`.
    pub master: Option<BrokerRef>,
    /// Epoch of the view shown.
    pub epoch: Option<u64>,
    /// High-water mark of the view shown.
    pub hwm: Option<u64>,
    /// Stores in the voter set in force (role `"voter"`), in the view shown.
    pub voters: usize,
    /// Qa in the view shown: voting stores that must persist an event before it is
    /// stabilized.
    pub ack_quorum: Option<u16>,
    /// Offset of a voter-set change the master appended and has not stabilized yet.
    pub change_pending: Option<u64>,
    /// Every store.
    pub stores: Vec<StoreStatus>,
    /// Every broker asked.
    pub brokers: Vec<BrokerStatus>,
    /// The answering brokers' Kafka addresses, comma separated in broker order: a Kafka
    /// client's `bootstrap.servers`; `null` when none has a Kafka listener.
    pub kafka_bootstrap: Option<String>,
    /// Whose answer `epoch`, `hwm` and `stores` come from.
    pub view_of: Option<BrokerRef>,
}

/// Asks the brokers and assembles the [`ClusterStatus`].
///
/// # Errors
/// No broker answered, or the runtime could not start.
pub fn run(config: &StatusConfig) -> anyhow::Result<ClusterStatus> {
    let rt = runtime("status")?;
    let answers = rt.block_on(ask_all(config))?;
    let status = assemble(&answers);
    if status.brokers.iter().all(|b| b.error.is_some()) {
        let why: Vec<String> = status
            .brokers
            .iter()
            .map(|b| format!("{}: {}", b.addr, b.error.as_deref().unwrap_or("?")))
            .collect();
        bail!("no broker answered ({})", why.join("; "));
    }
    Ok(status)
}

type Answer = (String, Result<MetadataResponse, String>);

/// Asks every broker given, then every broker named in the answers, once each.
async fn ask_all(config: &StatusConfig) -> anyhow::Result<Vec<Answer>> {
    if config.brokers.is_empty() {
        bail!("no broker address given");
    }
    let conn = ConnConfig {
        connect_timeout: config.timeout,
        request_timeout: config.timeout,
        tls: config
            .tls
            .clone()
            .map(|t| t.expecting(quire_tls::Role::Broker)),
        ..ConnConfig::default()
    };
    let mut asked: Vec<String> = Vec::new();
    let mut answers: Vec<Answer> = Vec::new();
    let mut to_ask: Vec<String> = config.brokers.clone();
    while !to_ask.is_empty() && asked.len() < KNOWN_BROKERS_MAX {
        let mut set = JoinSet::new();
        for addr in to_ask.drain(..) {
            if asked.contains(&addr) || asked.len() >= KNOWN_BROKERS_MAX {
                continue;
            }
            asked.push(addr.clone());
            let conn = conn.clone();
            let bound = config.timeout;
            set.spawn(async move {
                let result = tokio::time::timeout(bound * 2, ask(&addr, conn)).await;
                let result = match result {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {} ms", bound.as_millis() * 2)),
                };
                (addr, result)
            });
        }
        while let Some(joined) = set.join_next().await {
            let (addr, result) = joined?;
            if let Ok(m) = &result {
                for b in &m.brokers {
                    if !b.addr.is_empty() && !asked.contains(&b.addr) && !to_ask.contains(&b.addr) {
                        to_ask.push(b.addr.clone());
                    }
                }
            }
            answers.push((addr, result));
        }
    }
    Ok(answers)
}

async fn ask(addr: &str, conn: ConnConfig) -> Result<MetadataResponse, ClientError> {
    let client = BrokerClient::connect(addr, conn).await?;
    client.metadata().await
}

/// The status from the answers: pure, so it is tested without a cluster.
#[must_use]
pub fn assemble(answers: &[Answer]) -> ClusterStatus {
    // Ids by address, from every broker list in every answer.
    let mut ids: BTreeMap<&str, u16> = BTreeMap::new();
    for (_, r) in answers {
        if let Ok(m) = r {
            for b in &m.brokers {
                ids.insert(b.addr.as_str(), b.id.0);
            }
        }
    }
    let id_of = |addr: &str| ids.get(addr).copied();
    // A broker is master when its own answer names itself; the highest epoch wins.
    let master = answers
        .iter()
        .filter_map(|(addr, r)| {
            let m = r.as_ref().ok()?;
            let named = m.master.as_ref()?;
            (Some(named.id.0) == id_of(addr) || named.addr == *addr).then_some((addr, m))
        })
        .max_by_key(|(_, m)| m.epoch);
    let view = master.or_else(|| {
        answers
            .iter()
            .filter_map(|(addr, r)| r.as_ref().ok().map(|m| (addr, m)))
            .max_by_key(|(_, m)| (m.epoch, m.hwm))
    });
    let master_ref = master.map(|(addr, m)| BrokerRef {
        id: m.master.as_ref().map_or(0, |b| b.id.0),
        addr: addr.clone(),
    });
    let hwm = view.and_then(|(_, m)| m.hwm.map(|o| o.0));
    let stores = view.map_or_else(Vec::new, |(_, m)| {
        m.stores
            .iter()
            .enumerate()
            .map(|(i, s)| store_status(i, s, hwm, master.is_some()))
            .collect()
    });
    let mut brokers: Vec<BrokerStatus> = answers
        .iter()
        .map(|(addr, r)| match r {
            Ok(m) => {
                let id = id_of(addr);
                let is_master = master_ref.as_ref().is_some_and(|b| b.addr == *addr);
                BrokerStatus {
                    id,
                    addr: addr.clone(),
                    role: if is_master { "master" } else { "slave" },
                    epoch: Some(m.epoch.0),
                    hwm: m.hwm.map(|o| o.0),
                    applied: m.applied.map(|o| o.0),
                    master_id: m.master.as_ref().map(|b| b.id.0),
                    kafka: m.kafka.clone(),
                    error: None,
                }
            }
            Err(e) => BrokerStatus {
                id: id_of(addr),
                addr: addr.clone(),
                role: "unreachable",
                epoch: None,
                hwm: None,
                applied: None,
                master_id: None,
                kafka: None,
                error: Some(e.clone()),
            },
        })
        .collect();
    brokers.sort_by(|a, b| (a.id, &a.addr).cmp(&(b.id, &b.addr)));
    let kafka: Vec<&str> = brokers.iter().filter_map(|b| b.kafka.as_deref()).collect();
    let kafka_bootstrap = (!kafka.is_empty()).then(|| kafka.join(","));
    ClusterStatus {
        kafka_bootstrap,
        master: master_ref,
        epoch: view.map(|(_, m)| m.epoch.0),
        hwm,
        voters: stores.iter().filter(|s| s.role == "voter").count(),
        ack_quorum: view.map(|(_, m)| m.ack_quorum),
        change_pending: view.and_then(|(_, m)| m.change_pending.map(|o| o.0)),
        stores,
        brokers,
        view_of: view.map(|(addr, _)| BrokerRef {
            id: id_of(addr).unwrap_or(0),
            addr: addr.clone(),
        }),
    }
}

fn store_status(index: usize, s: &StoreInfo, hwm: Option<u64>, from_master: bool) -> StoreStatus {
    let persisted = s.persisted.map(|o| o.0);
    // Only the master counts acks: a slave's view has no persisted figures.
    let lag = (from_master && hwm.is_some()).then(|| offsets_between(persisted, hwm));
    let known = s.store_id.0 != 0 || s.incarnation.0 != 0;
    let (role, voter) = match (known, s.voter) {
        (false, _) => ("unknown", None),
        (true, true) => ("voter", Some(true)),
        (true, false) => ("learner", Some(false)),
    };
    let state = match (from_master, s.connected, s.corrupt, lag) {
        (false, ..) => "unknown",
        (true, false, ..) => "down",
        (true, true, Some(_), _) => "repairing",
        (true, true, None, Some(l)) if l > 0 => "catching up",
        (true, true, None, _) => "in sync",
    };
    StoreStatus {
        index,
        addr: s.addr.clone(),
        store_id: format!("{:016x}", s.store_id.0),
        incarnation: format!("{:016x}", s.incarnation.0),
        role,
        voter,
        persisted,
        lag,
        connected: from_master.then_some(s.connected),
        damaged: s.corrupt.map(|o| o.0),
        state,
        lag_bytes: s.lag_bytes,
        catch_up_rate: s.catch_up_rate,
        catch_up_ms: s.catch_up_ms,
    }
}

/// A store's catch-up estimate for the table: `0s` in sync, `~12s`, `~3m`, `never` when
/// the master has rates and the store does not close in, `-` without figures.
fn eta(s: &StoreStatus) -> String {
    match (s.catch_up_ms, s.catch_up_rate) {
        (Some(0), _) => "0s".to_owned(),
        (Some(ms), _) if ms < 120_000 => format!("~{}s", ms.div_ceil(1000)),
        (Some(ms), _) => format!("~{}m", ms.div_ceil(60_000)),
        (None, Some(_)) => "never".to_owned(),
        (None, None) => "-".to_owned(),
    }
}

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

impl Report for ClusterStatus {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        match &self.master {
            Some(m) => writeln!(out, "master  broker {} at {}", m.id, m.addr)?,
            None => writeln!(out, "master  none confirmed")?,
        }
        writeln!(out, "epoch   {}", opt(self.epoch))?;
        writeln!(out, "hwm     {}", opt(self.hwm))?;
        writeln!(
            out,
            "voters  {} of {} stores, Qa {}",
            self.voters,
            self.stores.len(),
            opt(self.ack_quorum)
        )?;
        if let Some(c) = self.change_pending {
            writeln!(
                out,
                "change  a voter-set change at offset {c} is not stabilized yet"
            )?;
        }
        if let Some(k) = &self.kafka_bootstrap {
            writeln!(out, "kafka   {k}  (bootstrap.servers)")?;
        }
        if let Some(v) = &self.view_of {
            if self.master.is_none() {
                writeln!(out, "(view of broker {} at {})", v.id, v.addr)?;
            }
        }
        writeln!(out)?;
        let addr_w = self
            .stores
            .iter()
            .map(|s| s.addr.len())
            .chain(self.brokers.iter().map(|b| b.addr.len()))
            .max()
            .unwrap_or(4)
            .max(4);
        writeln!(
            out,
            "{:<5}  {:<addr_w$}  {:<16}  {:<7}  {:>10}  {:>8}  {:>9}  {:>7}  {:<4}  {:<11}  {:>8}",
            "store",
            "addr",
            "store_id",
            "role",
            "persisted",
            "lag",
            "to copy",
            "eta",
            "link",
            "state",
            "damaged"
        )?;
        for s in &self.stores {
            let link = match s.connected {
                Some(true) => "up",
                Some(false) => "down",
                None => "-",
            };
            writeln!(
                out,
                "{:<5}  {:<addr_w$}  {:<16}  {:<7}  {:>10}  {:>8}  {:>9}  {:>7}  {:<4}  {:<11}  {:>8}",
                s.index,
                s.addr,
                s.store_id,
                s.role,
                opt(s.persisted),
                opt(s.lag),
                s.lag_bytes
                    .map_or_else(|| "-".to_owned(), crate::output::human_bytes),
                eta(s),
                link,
                s.state,
                opt(s.damaged)
            )?;
        }
        writeln!(out)?;
        writeln!(
            out,
            "{:<6}  {:<addr_w$}  {:<11}  {:>10}  {:>10}  {:>10}  {:>6}",
            "broker", "addr", "role", "epoch", "hwm", "applied", "master"
        )?;
        for b in &self.brokers {
            writeln!(
                out,
                "{:<6}  {:<addr_w$}  {:<11}  {:>10}  {:>10}  {:>10}  {:>6}{}",
                opt(b.id),
                b.addr,
                b.role,
                opt(b.epoch),
                opt(b.hwm),
                opt(b.applied),
                opt(b.master_id),
                b.error
                    .as_ref()
                    .map_or_else(String::new, |e| format!("  ({e})"))
            )?;
        }
        Ok(())
    }
}

/// Prints `status` in `format` to stdout.
///
/// # Errors
/// Writing to stdout failed.
pub fn print(status: &ClusterStatus, format: OutputFormat) -> io::Result<()> {
    crate::output::emit(status, format, &mut io::stdout().lock())
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::{BrokerId, BrokerInfo, Epoch, Incarnation, Offset, StoreId};

    fn brokers() -> Vec<BrokerInfo> {
        vec![
            BrokerInfo {
                id: BrokerId(1),
                addr: "b1:1".into(),
            },
            BrokerInfo {
                id: BrokerId(2),
                addr: "b2:2".into(),
            },
        ]
    }

    fn store(i: u64, voter: bool, persisted: Option<u64>) -> StoreInfo {
        StoreInfo {
            store_id: StoreId(i),
            incarnation: Incarnation(100 + i),
            addr: format!("s{i}:1"),
            voter,
            persisted: persisted.map(Offset),
            connected: persisted.is_some(),
            corrupt: None,
            lag_bytes: None,
            catch_up_rate: None,
            catch_up_ms: None,
        }
    }

    #[test]
    fn the_master_is_the_broker_naming_itself_and_its_view_is_shown() {
        let master_view = MetadataResponse {
            topics: Vec::new(),
            epoch: Epoch(0x1_0001),
            hwm: Some(Offset(41)),
            master: Some(brokers()[0].clone()),
            brokers: brokers(),
            stores: vec![
                StoreInfo {
                    lag_bytes: Some(0),
                    catch_up_rate: Some(500),
                    catch_up_ms: Some(0),
                    ..store(1, true, Some(41))
                },
                StoreInfo {
                    lag_bytes: Some(11 << 20),
                    catch_up_rate: Some(800),
                    catch_up_ms: Some(37_400),
                    ..store(2, true, Some(30))
                },
                StoreInfo {
                    lag_bytes: Some(42 << 20),
                    catch_up_rate: Some(0),
                    ..store(3, false, None)
                },
                StoreInfo {
                    corrupt: Some(Offset(7)),
                    ..store(4, true, Some(41))
                },
            ],
            applied: Some(Offset(41)),
            kafka: Some("k1:9092".into()),
            ack_quorum: 3,
            change_pending: Some(Offset(40)),
        };
        let slave_view = MetadataResponse {
            topics: Vec::new(),
            hwm: Some(Offset(40)),
            stores: vec![
                store(1, true, None),
                store(2, true, None),
                store(3, false, None),
                store(4, true, None),
            ],
            applied: Some(Offset(39)),
            kafka: Some("k2:9092".into()),
            ..master_view.clone()
        };
        let answers = vec![
            ("b2:2".to_owned(), Ok(slave_view)),
            ("b1:1".to_owned(), Ok(master_view)),
            ("b3:3".to_owned(), Err("connect refused".to_owned())),
        ];
        let s = assemble(&answers);
        assert_eq!(
            s.master,
            Some(BrokerRef {
                id: 1,
                addr: "b1:1".into()
            })
        );
        assert_eq!(s.epoch, Some(0x1_0001));
        assert_eq!(s.hwm, Some(41));
        let lags: Vec<Option<u64>> = s.stores.iter().map(|x| x.lag).collect();
        assert_eq!(lags, vec![Some(0), Some(11), Some(42), Some(0)]);
        let states: Vec<&str> = s.stores.iter().map(|x| x.state).collect();
        assert_eq!(states, vec!["in sync", "catching up", "down", "repairing"]);
        assert_eq!(s.stores[3].damaged, Some(7));
        assert_eq!(s.stores[2].role, "learner");
        assert_eq!(
            (s.voters, s.ack_quorum, s.change_pending),
            (3, Some(3), Some(40))
        );
        let roles: Vec<&str> = s.brokers.iter().map(|b| b.role).collect();
        assert_eq!(roles, vec!["unreachable", "master", "slave"]);
        assert_eq!(s.brokers[2].hwm, Some(40));
        assert_eq!(
            s.brokers[2].applied,
            Some(39),
            "a slave's own applied offset"
        );
        let links: Vec<Option<bool>> = s.stores.iter().map(|x| x.connected).collect();
        assert_eq!(links, vec![Some(true), Some(true), Some(false), Some(true)]);
        let mut text = Vec::new();
        s.write_text(&mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(text.contains("master  broker 1 at b1:1"), "{text}");
        assert!(text.contains("voters  3 of 4 stores, Qa 3"), "{text}");
        assert!(
            text.contains("change at offset 40 is not stabilized"),
            "{text}"
        );
        let etas: Vec<String> = s.stores.iter().map(eta).collect();
        assert_eq!(etas, vec!["0s", "~38s", "never", "-"]);
        assert!(text.contains("11 MiB"), "{text}");
        assert_eq!(s.stores[1].catch_up_rate, Some(800));
        assert!(text.contains("connect refused"), "{text}");
        assert_eq!(s.kafka_bootstrap.as_deref(), Some("k1:9092,k2:9092"));
        assert!(
            text.contains("kafka   k1:9092,k2:9092  (bootstrap.servers)"),
            "{text}"
        );
    }

    #[test]
    fn without_a_confirmed_master_the_highest_epoch_is_shown_and_master_is_null() {
        let stale = MetadataResponse {
            topics: Vec::new(),
            epoch: Epoch(5),
            hwm: Some(Offset(3)),
            master: Some(brokers()[0].clone()),
            brokers: brokers(),
            stores: vec![store(1, true, None)],
            applied: None,
            kafka: None,
            ack_quorum: 2,
            change_pending: None,
        };
        let mut stale = stale;
        stale.stores.push(StoreInfo {
            store_id: StoreId(0),
            incarnation: Incarnation(0),
            addr: "s9:1".into(),
            ..store(9, false, None)
        });
        let s = assemble(&[("b2:2".to_owned(), Ok(stale))]);
        assert_eq!(s.stores[1].role, "unknown");
        assert_eq!(s.stores[1].voter, None);
        assert_eq!(s.master, None);
        assert_eq!(s.view_of.as_ref().map(|b| b.id), Some(2));
        assert_eq!(s.stores[0].lag, None, "a slave's view has no lag figures");
        let json = serde_json::to_string(&s).unwrap();
        assert!(
            json.starts_with("{\"master\":null,\"epoch\":5,\"hwm\":3,"),
            "{json}"
        );
    }
}
