//! [`Discovery`]: from a list of broker addresses to a connection to the master.
//!
//! One **round** ([`Discovery::find_master_once`]):
//! 1. if a `NotMaster` answer named a master (the *hint*), ask that broker first: when it
//!    names itself master, that is the answer;
//! 2. otherwise ask every known broker for `Metadata` at once (each probe — connect and
//!    request — bounded by [`DiscoveryConfig::probe_timeout_ms`]), and learn the broker
//!    list every answer carries;
//! 3. rank the masters the answers name ([`candidates`]: highest epoch first, then one that
//!    named itself) and take the first that, asked itself, names itself master.
//!
//! [`Discovery::find_master`] runs rounds with exponential backoff
//! ([`Backoff`]) until one succeeds or [`DiscoveryConfig::discovery_timeout_ms`] runs out
//! ([`ClientError::NoMaster`]). Every wait is bounded.
//!
//! A broker that names itself master may still be finishing its takeover; requests sent
//! to it then get `NotMaster` or wait, and the caller's retry loop comes back here. What
//! this module does not do: send produce or fetch requests, or decide what to retry.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use quire_proto::{BrokerInfo, Epoch, MetadataResponse, MEMBERS_MAX};
use tokio::task::JoinSet;
use tokio::time::{timeout, Instant};

use crate::broker::BrokerClient;
use crate::conn::ConnConfig;
use crate::error::ClientError;

/// Broker addresses a [`Discovery`] remembers, given and learned (learned ones beyond it are
/// ignored).
pub const KNOWN_BROKERS_MAX: usize = MEMBERS_MAX;

/// Candidate masters a round asks in turn, at most.
pub const CANDIDATES_MAX: usize = 4;

/// Bounds of discovery. Times in milliseconds.
#[derive(Clone, Debug)]
pub struct DiscoveryConfig {
    /// Bounds of every broker connection discovery opens, the master's included (the
    /// producer and consumer run their requests on it).
    pub conn: ConnConfig,
    /// One probe of one broker: connect and `Metadata` answer. Default 2000.
    pub probe_timeout_ms: u64,
    /// First wait between two rounds. Default 20.
    pub backoff_initial_ms: u64,
    /// Longest wait between two rounds (the wait doubles up to it). Default 100: a search
    /// for the master is a metadata refresh, which Kafka's clients retry every 100 ms
    /// (`retry.backoff.ms`). Measured over 20 `quire demo` master kills each (2026-12-03):
    /// with 1000, failover (kill to the first ack from the new master) took 2.30 s at the
    /// median and 2.32 s at most — the new master served from about 1.3 s, and the
    /// producers slept in a 1 s backoff until 2.3 s; with 200, 1.66 s and 1.97 s; with 100,
    /// 1.50 s and 1.82 s.
    pub backoff_max_ms: u64,
    /// Longest [`Discovery::find_master`] call. Default 30 000.
    pub discovery_timeout_ms: u64,
}

impl Default for DiscoveryConfig {
    fn default() -> Self {
        DiscoveryConfig {
            conn: ConnConfig::default(),
            probe_timeout_ms: 2_000,
            backoff_initial_ms: 20,
            backoff_max_ms: 100,
            discovery_timeout_ms: 30_000,
        }
    }
}

impl DiscoveryConfig {
    /// Checks the ranges: every time above 0, `backoff_initial_ms <= backoff_max_ms`.
    ///
    /// # Errors
    /// [`ClientError::InvalidConfig`] naming the setting.
    pub fn validate(&self) -> Result<(), ClientError> {
        for (name, v) in [
            ("probe_timeout_ms", self.probe_timeout_ms),
            ("backoff_initial_ms", self.backoff_initial_ms),
            ("backoff_max_ms", self.backoff_max_ms),
            ("discovery_timeout_ms", self.discovery_timeout_ms),
        ] {
            if v == 0 {
                return Err(ClientError::InvalidConfig(format!(
                    "{name} must be above 0"
                )));
            }
        }
        if self.backoff_initial_ms > self.backoff_max_ms {
            return Err(ClientError::InvalidConfig(format!(
                "backoff_initial_ms ({}) must not exceed backoff_max_ms ({})",
                self.backoff_initial_ms, self.backoff_max_ms
            )));
        }
        Ok(())
    }

    pub(crate) fn backoff(&self) -> Backoff {
        Backoff::new(
            Duration::from_millis(self.backoff_initial_ms),
            Duration::from_millis(self.backoff_max_ms),
        )
    }
}

/// Exponential backoff without jitter: `initial`, `2·initial`, ... up to `max`, until
/// [`Backoff::reset`].
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    /// A backoff starting at `initial` (at least 1 ms) and capped at `max` (at least
    /// `initial`).
    #[must_use]
    pub fn new(initial: Duration, max: Duration) -> Backoff {
        let initial = initial.max(Duration::from_millis(1));
        let max = max.max(initial);
        Backoff {
            initial,
            max,
            next: initial,
        }
    }

    /// The wait to make now; the following one is twice as long (capped).
    pub fn next_delay(&mut self) -> Duration {
        let d = self.next;
        self.next = (self.next * 2).min(self.max);
        d
    }

    /// The wait [`Backoff::next_delay`] would return, without advancing.
    #[must_use]
    pub fn peek(&self) -> Duration {
        self.next
    }

    /// Starts over at `initial` (after a success).
    pub fn reset(&mut self) {
        self.next = self.initial;
    }
}

/// The master found by discovery, with an open connection to it.
#[derive(Debug)]
pub struct MasterConn {
    /// The master.
    pub master: BrokerInfo,
    /// The epoch it reported (highest it knows).
    pub epoch: Epoch,
    /// The connection to it.
    pub client: BrokerClient,
}

/// A master one or more `Metadata` answers name; see [`candidates`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The broker named master.
    pub master: BrokerInfo,
    /// Highest epoch among the answers naming it.
    pub epoch: Epoch,
    /// Index of an answer that came from the candidate's own address and names it, if
    /// any: that connection already leads to a broker that says it is the master.
    pub self_named: Option<usize>,
}

/// Ranks the masters named by `answers` (`(address asked, answer)`): highest epoch first,
/// then a candidate that named itself, then the lower broker id. Each broker appears
/// once.
#[must_use]
pub fn candidates(answers: &[(String, MetadataResponse)]) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    for (i, (addr, m)) in answers.iter().enumerate() {
        let Some(master) = &m.master else { continue };
        let self_named = (master.addr == *addr).then_some(i);
        match out.iter_mut().find(|c| c.master.id == master.id) {
            Some(c) => {
                c.epoch = c.epoch.max(m.epoch);
                c.self_named = c.self_named.or(self_named);
            }
            None => out.push(Candidate {
                master: master.clone(),
                epoch: m.epoch,
                self_named,
            }),
        }
    }
    out.sort_by(|a, b| {
        b.epoch
            .cmp(&a.epoch)
            .then(b.self_named.is_some().cmp(&a.self_named.is_some()))
            .then(a.master.id.cmp(&b.master.id))
    });
    out
}

/// Adds the addresses of `brokers` not yet in `known`, keeping at most
/// [`KNOWN_BROKERS_MAX`].
pub fn learn_brokers(known: &mut Vec<String>, brokers: &[BrokerInfo]) {
    for b in brokers {
        if known.len() >= KNOWN_BROKERS_MAX {
            return;
        }
        if !b.addr.is_empty() && !known.contains(&b.addr) {
            known.push(b.addr.clone());
        }
    }
}

/// Finds the master; cheap to clone (clones share what they learned). See the module docs.
#[derive(Clone, Debug)]
pub struct Discovery {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: DiscoveryConfig,
    known: Mutex<Vec<String>>,
}

impl Discovery {
    /// Discovery over `brokers` (`host:port` addresses; any subset of the cluster's brokers
    /// will do, the others are learned from answers).
    ///
    /// # Errors
    /// [`ClientError::InvalidConfig`] for no address or a setting out of range.
    pub fn new<I, S>(brokers: I, config: DiscoveryConfig) -> Result<Discovery, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        config.validate()?;
        let mut known: Vec<String> = Vec::new();
        for b in brokers {
            let b: String = b.into();
            let b = b.trim().to_owned();
            if !b.is_empty() && !known.contains(&b) && known.len() < KNOWN_BROKERS_MAX {
                known.push(b);
            }
        }
        if known.is_empty() {
            return Err(ClientError::InvalidConfig(
                "no broker address given".to_owned(),
            ));
        }
        Ok(Discovery {
            inner: Arc::new(Inner {
                config,
                known: Mutex::new(known),
            }),
        })
    }

    /// The settings.
    #[must_use]
    pub fn config(&self) -> &DiscoveryConfig {
        &self.inner.config
    }

    /// The broker addresses known: those given, then those learned.
    #[must_use]
    pub fn brokers(&self) -> Vec<String> {
        self.inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn learn(&self, m: &MetadataResponse) {
        let mut known = self
            .inner
            .known
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        learn_brokers(&mut known, &m.brokers);
    }

    /// `Metadata` from the first known broker that answers (in the order of
    /// [`Discovery::brokers`]), each probe bounded.
    ///
    /// # Errors
    /// The last broker's error when none answers.
    pub async fn metadata(&self) -> Result<MetadataResponse, ClientError> {
        let mut last = None;
        for addr in self.brokers() {
            match probe(addr, &self.inner.config).await {
                Ok((_, m)) => {
                    self.learn(&m);
                    return Ok(m);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| ClientError::InvalidConfig("no broker address".to_owned())))
    }

    /// Rounds (see the module docs) with backoff until one finds the master, at most
    /// [`DiscoveryConfig::discovery_timeout_ms`]. `hint` is asked first in the first round.
    ///
    /// # Errors
    /// [`ClientError::NoMaster`] with the last error met.
    pub async fn find_master(&self, hint: Option<BrokerInfo>) -> Result<MasterConn, ClientError> {
        let start = Instant::now();
        let deadline = start + Duration::from_millis(self.inner.config.discovery_timeout_ms);
        let mut backoff = self.inner.config.backoff();
        let mut hint = hint;
        let mut last = None;
        let mut rounds = 0u32;
        loop {
            rounds += 1;
            if let Some(found) = self.round(hint.take(), &mut last).await {
                return Ok(found);
            }
            let wait = backoff.next_delay();
            if Instant::now() + wait >= deadline {
                return Err(self.no_master(rounds, start, last));
            }
            tokio::time::sleep(wait).await;
        }
    }

    /// One round (see the module docs).
    ///
    /// # Errors
    /// [`ClientError::NoMaster`] with the last error met.
    pub async fn find_master_once(
        &self,
        hint: Option<BrokerInfo>,
    ) -> Result<MasterConn, ClientError> {
        let start = Instant::now();
        let mut last = None;
        match self.round(hint, &mut last).await {
            Some(found) => Ok(found),
            None => Err(self.no_master(1, start, last)),
        }
    }

    fn no_master(&self, rounds: u32, start: Instant, last: Option<ClientError>) -> ClientError {
        ClientError::NoMaster {
            brokers: self.brokers().len(),
            rounds,
            elapsed_ms: millis(start.elapsed()),
            last: last.map(Box::new),
        }
    }

    async fn round(
        &self,
        hint: Option<BrokerInfo>,
        last: &mut Option<ClientError>,
    ) -> Option<MasterConn> {
        let config = &self.inner.config;
        if let Some(h) = hint {
            match self.confirm(&h).await {
                Ok(found) => return Some(found),
                Err(e) => *last = Some(e),
            }
        }
        let mut probes = JoinSet::new();
        for addr in self.brokers() {
            let config = config.clone();
            probes.spawn(async move {
                let r = probe(addr.clone(), &config).await;
                (addr, r)
            });
        }
        let mut answers: Vec<(String, MetadataResponse)> = Vec::new();
        let mut clients: Vec<Option<BrokerClient>> = Vec::new();
        while let Some(joined) = probes.join_next().await {
            let Ok((addr, result)) = joined else { continue };
            match result {
                Ok((client, m)) => {
                    self.learn(&m);
                    answers.push((addr, m));
                    clients.push(Some(client));
                }
                Err(e) => *last = Some(e),
            }
        }
        for c in candidates(&answers).into_iter().take(CANDIDATES_MAX) {
            if let Some(client) = c.self_named.and_then(|i| clients.get_mut(i)?.take()) {
                tracing::debug!(master = c.master.id.0, addr = %c.master.addr, epoch = %c.epoch, "master found");
                return Some(MasterConn {
                    master: c.master,
                    epoch: c.epoch,
                    client,
                });
            }
            match self.confirm(&c.master).await {
                Ok(found) => return Some(found),
                Err(e) => *last = Some(e),
            }
        }
        None
    }

    /// Asks `candidate` itself; succeeds if it names itself master.
    async fn confirm(&self, candidate: &BrokerInfo) -> Result<MasterConn, ClientError> {
        let (client, m) = probe(candidate.addr.clone(), &self.inner.config).await?;
        self.learn(&m);
        match &m.master {
            Some(named) if named.id == candidate.id => Ok(MasterConn {
                master: candidate.clone(),
                epoch: m.epoch,
                client,
            }),
            other => Err(ClientError::Closed {
                addr: candidate.addr.clone(),
                reason: match other {
                    Some(o) => format!(
                        "broker {} is not the master (it names broker {} at {})",
                        candidate.id.0, o.id.0, o.addr
                    ),
                    None => format!(
                        "broker {} is not the master (it knows none)",
                        candidate.id.0
                    ),
                },
            }),
        }
    }
}

/// Connects to `addr` and asks for `Metadata`, all within the probe timeout.
async fn probe(
    addr: String,
    config: &DiscoveryConfig,
) -> Result<(BrokerClient, MetadataResponse), ClientError> {
    let bound = Duration::from_millis(config.probe_timeout_ms);
    let conn = config.conn.clone();
    let name = addr.clone();
    match timeout(bound, async move {
        let client = BrokerClient::connect(addr.as_str(), conn).await?;
        let m = client.metadata().await?;
        Ok::<_, ClientError>((client, m))
    })
    .await
    {
        Ok(r) => r,
        Err(_) => Err(ClientError::Timeout {
            addr: name,
            request_id: 0,
            timeout_ms: config.probe_timeout_ms,
        }),
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use quire_proto::BrokerId;

    fn info(id: u16) -> BrokerInfo {
        BrokerInfo {
            id: BrokerId(id),
            addr: format!("b{id}:1"),
        }
    }

    fn answer(epoch: u64, master: Option<u16>) -> MetadataResponse {
        MetadataResponse {
            topics: Vec::new(),
            epoch: Epoch(epoch),
            hwm: None,
            master: master.map(info),
            brokers: vec![info(1), info(2), info(3)],
            stores: Vec::new(),
            applied: None,
            kafka: None,
            ack_quorum: 2,
            change_pending: None,
        }
    }

    #[test]
    fn candidates_rank_by_epoch_then_self_named() {
        // A slave still naming the dead master 1 (epoch 5), broker 2 naming itself at a
        // higher epoch, broker 3 naming 2 too, and one knowing no master.
        let answers = vec![
            ("b3:1".to_owned(), answer(5, Some(1))),
            ("b2:1".to_owned(), answer(9, Some(2))),
            ("b1:1".to_owned(), answer(9, None)),
            ("b3:1".to_owned(), answer(7, Some(2))),
        ];
        let c = candidates(&answers);
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].master, info(2));
        assert_eq!(c[0].epoch, Epoch(9));
        assert_eq!(c[0].self_named, Some(1));
        assert_eq!(c[1].master, info(1));
        assert_eq!(c[1].self_named, None);
    }

    #[test]
    fn candidates_prefer_self_named_at_equal_epoch() {
        let answers = vec![
            ("b1:1".to_owned(), answer(4, Some(3))),
            ("b2:1".to_owned(), answer(4, Some(2))),
        ];
        let c = candidates(&answers);
        assert_eq!(c[0].master, info(2), "self-named first at equal epochs");
        assert_eq!(c[1].master, info(3));
        assert!(candidates(&[("b1:1".to_owned(), answer(4, None))]).is_empty());
    }

    #[test]
    fn learning_brokers_is_deduplicated_and_bounded() {
        let mut known = vec!["b1:1".to_owned()];
        learn_brokers(&mut known, &[info(1), info(2), info(2)]);
        assert_eq!(known, vec!["b1:1".to_owned(), "b2:1".to_owned()]);
        let many: Vec<BrokerInfo> = (0..2 * KNOWN_BROKERS_MAX as u16).map(info).collect();
        learn_brokers(&mut known, &many);
        assert_eq!(known.len(), KNOWN_BROKERS_MAX);
    }

    #[test]
    fn backoff_doubles_to_its_cap_and_resets() {
        let mut b = Backoff::new(Duration::from_millis(20), Duration::from_millis(100));
        let got: Vec<u64> = (0..5).map(|_| millis(b.next_delay())).collect();
        assert_eq!(got, vec![20, 40, 80, 100, 100]);
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(20));
        let mut z = Backoff::new(Duration::ZERO, Duration::ZERO);
        assert_eq!(
            z.next_delay(),
            Duration::from_millis(1),
            "never a busy loop"
        );
    }

    #[test]
    fn discovery_refuses_empty_lists_and_bad_settings() {
        assert!(matches!(
            Discovery::new(Vec::<String>::new(), DiscoveryConfig::default()),
            Err(ClientError::InvalidConfig(_))
        ));
        assert!(matches!(
            Discovery::new([" "], DiscoveryConfig::default()),
            Err(ClientError::InvalidConfig(_))
        ));
        let bad = DiscoveryConfig {
            backoff_initial_ms: 500,
            backoff_max_ms: 100,
            ..DiscoveryConfig::default()
        };
        assert!(matches!(
            Discovery::new(["a:1"], bad),
            Err(ClientError::InvalidConfig(_))
        ));
        let d = Discovery::new(["a:1", "a:1", "b:2"], DiscoveryConfig::default()).expect("valid");
        assert_eq!(d.brokers(), vec!["a:1".to_owned(), "b:2".to_owned()]);
    }
}
