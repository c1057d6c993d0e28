//! The broker's metrics (Prometheus text format, every name prefixed `quire_`), served on
//! `GET /metrics` by quire-net's [`quire_net::serve_metrics`] (the same responder as
//! quire-node's).
//!
//! Counters and histograms are updated where things happen (atomics, no lock). The
//! broker's role, epoch, HWM and per-store progress are read at scrape time from a
//! [`StatusSnapshot`] the server refreshes on every heartbeat tick.
//!
//! Besides its own, the broker exports quire-net's [`StandardMetrics`]: `quire_build_info`
//! and the standard `process_*` metrics. Its readiness (`GET /ready`) is set by the server
//! on every heartbeat tick too ([`Metrics::set_readiness`]) and read from a watch channel
//! (no lock the actor waits on).

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use quire_net::{
    AcceptMetrics, BudgetMetrics, MetricsText, Readiness, ResponseMetrics, StandardMetrics,
};
use tokio::sync::watch;

/// The `code` labels of `quire_produce_errors_total` exported (as 0) from start; other
/// codes appear when they first happen.
pub const PRODUCE_ERROR_CODES: [&str; 4] =
    ["no_quorum", "not_master", "overloaded", "message_too_large"];

/// A label set with one label.
pub type Label = [(&'static str, &'static str); 1];

/// Latency buckets in seconds: 50 µs .. 10 s.
const LATENCY_BUCKETS_S: [f64; 16] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// Failover duration buckets in seconds.
const FAILOVER_BUCKETS_S: [f64; 10] = [0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0];

/// One store's progress as the master sees it.
#[derive(Clone, Debug, Default)]
pub struct StoreProgress {
    /// The store's address.
    pub addr: String,
    /// Events the store lacks behind the master's log end (`None`: not the master).
    pub lag: Option<u64>,
    /// Estimated bytes it lacks ([`quire_proto::StoreInfo::lag_bytes`]).
    pub lag_bytes: Option<u64>,
    /// Estimated ms until it holds the HWM ([`quire_proto::StoreInfo::catch_up_ms`]).
    pub catch_up_ms: Option<u64>,
    /// Whether it is in the voter set in force at this broker (its expected identity
    /// known); `false`: a learner.
    pub voter: bool,
}

/// What the server reports at scrape time.
#[derive(Clone, Debug, Default)]
pub struct StatusSnapshot {
    /// 1 while this broker is the master.
    pub is_master: bool,
    /// The highest epoch this broker knows.
    pub epoch: u64,
    /// The HWM this broker knows (`None`: none).
    pub hwm: Option<u64>,
    /// Highest offset applied to broker state.
    pub applied: Option<u64>,
    /// The retention trim point applied (0: nothing trimmed): reads below it are `Trimmed`.
    pub trim_point: u64,
    /// Offset of the newest retention checkpoint above the trim point (`None`: none).
    pub last_checkpoint: Option<u64>,
    /// Qa in the voter set in force at this broker.
    pub ack_quorum: u64,
    /// Per store, in slot order.
    pub stores: Vec<StoreProgress>,
}

/// Every metric the broker updates. Share it with `Arc`; updates are atomic.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Produce requests received.
    pub produce_requests: Counter,
    /// Messages acknowledged to producers.
    pub produce_messages_acked: Counter,
    /// Produce requests answered with an error, by code.
    pub produce_errors: Family<Label, Counter>,
    /// Produce latency: request received to acknowledgement sent, in seconds.
    pub produce_latency: Histogram,
    /// Quorum wait: event proposed to event stabilized, in seconds (one sample per batch).
    pub quorum_wait: Histogram,
    /// Fetch requests received.
    pub fetch_requests: Counter,
    /// Fetches served from a store (older than the broker keeps in memory).
    pub fetches_from_store: Counter,
    /// Repairs of damaged store records the master ran, by outcome (`repaired`: the store's
    /// copy is good again; `not_applied`: the store refused it (not its entry; retried);
    /// `failed`: no answer or an error).
    pub store_repairs: Family<Label, Counter>,
    /// Payload bytes of the good copies read from stores for repairs: one record per
    /// repair, so this grows by the damaged records' sizes, never by whole ranges.
    pub store_repair_read_bytes: Counter,
    /// Open connections (clients and brokers).
    pub connections_open: Gauge,
    /// Connections accepted.
    pub connections_accepted: Counter,
    /// Frames refused (bad header or body, unexpected type, truncated), by reason.
    pub rejected_frames: Family<Label, Counter>,
    /// Connections closed because a frame did not complete in time
    /// (`partial_frame_timeout`) or nothing arrived (`idle_timeout`), by reason.
    pub connections_timed_out: Family<Label, Counter>,
    /// Connections closed because the peer did not read its answers (its answer queue
    /// filled, or a write made no progress for quire-net's `WRITE_STALL_TIMEOUT`).
    pub connections_dropped_slow: Counter,
    /// Fetches that waited for the broker-wide budget of fetch answers
    /// (`fetch_responses_bytes_max`).
    pub fetch_response_budget_waits: Counter,
    /// The read budget: bytes held, and reads that waited for it.
    pub read_budget: BudgetMetrics,
    /// Bytes of responses queued and not yet written (`response_bytes_queued`).
    pub responses: ResponseMetrics,
    /// Connections closed at once (by reason), and failed `accept()` calls
    /// (`quire_connections_refused_total{reason}`, `quire_accept_errors_total`).
    pub accept: AcceptMetrics,
    /// Takeovers that made this broker master (the first election included).
    pub failovers: Counter,
    /// From the last message of the previous master (or the takeover's start, for the
    /// first election) to serving clients, in seconds.
    pub failover_duration: Histogram,
    /// Times this broker stepped down as master.
    pub step_downs: Counter,
    /// Graceful handoffs this broker finished as the handing master.
    pub handoffs: Counter,
    /// A graceful handoff's pause: request received to the new master serving, in seconds.
    pub handoff_duration: Histogram,
    snapshot: Arc<Mutex<StatusSnapshot>>,
    /// `quire_build_info` and the `process_*` metrics (unprefixed registry).
    standard: StandardMetrics,
    /// What `GET /ready` answers; written by the actor once per heartbeat tick.
    ready: watch::Sender<Readiness>,
}

impl Metrics {
    /// A fresh set of metrics, registered under the `quire` prefix.
    #[must_use]
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("quire");
        let snapshot = Arc::new(Mutex::new(StatusSnapshot::default()));
        let m = Metrics {
            produce_requests: Counter::default(),
            produce_messages_acked: Counter::default(),
            produce_errors: Family::default(),
            produce_latency: Histogram::new(LATENCY_BUCKETS_S),
            quorum_wait: Histogram::new(LATENCY_BUCKETS_S),
            fetch_requests: Counter::default(),
            fetches_from_store: Counter::default(),
            store_repairs: Family::default(),
            store_repair_read_bytes: Counter::default(),
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            rejected_frames: Family::default(),
            connections_timed_out: Family::default(),
            connections_dropped_slow: Counter::default(),
            fetch_response_budget_waits: Counter::default(),
            read_budget: BudgetMetrics::default(),
            responses: ResponseMetrics::default(),
            accept: AcceptMetrics::default(),
            failovers: Counter::default(),
            failover_duration: Histogram::new(FAILOVER_BUCKETS_S),
            step_downs: Counter::default(),
            handoffs: Counter::default(),
            handoff_duration: Histogram::new(FAILOVER_BUCKETS_S),
            snapshot: snapshot.clone(),
            standard: StandardMetrics::new(),
            ready: watch::Sender::new(Readiness::NotReady(
                "starting: no master known yet".to_owned(),
            )),
            registry: Registry::default(),
        };
        // Known codes read 0 from the start (a rate or an alert needs the series to exist
        // before the first error).
        for code in PRODUCE_ERROR_CODES {
            let _ = m.produce_errors.get_or_create(&[("code", code)]);
        }
        let r = &mut registry;
        r.register(
            "produce_requests",
            "Produce requests received",
            m.produce_requests.clone(),
        );
        r.register(
            "produce_messages_acked",
            "Messages acknowledged to producers (stabilized)",
            m.produce_messages_acked.clone(),
        );
        r.register(
            "produce_errors",
            "Produce requests answered with an error, by code",
            m.produce_errors.clone(),
        );
        r.register(
            "produce_latency_seconds",
            "Produce request received to acknowledgement sent",
            m.produce_latency.clone(),
        );
        r.register(
            "quorum_wait_seconds",
            "Event proposed to stabilized on the ack quorum (one sample per batch)",
            m.quorum_wait.clone(),
        );
        r.register(
            "fetch_requests",
            "Fetch requests received",
            m.fetch_requests.clone(),
        );
        r.register(
            "fetches_from_store",
            "Fetches served by reading a store",
            m.fetches_from_store.clone(),
        );
        r.register(
            "store_repairs",
            "Repairs of damaged store records run by this master, by outcome",
            m.store_repairs.clone(),
        );
        r.register(
            "store_repair_read_bytes",
            "Payload bytes of good copies read from stores for repairs",
            m.store_repair_read_bytes.clone(),
        );
        r.register(
            "connections_open",
            "Open connections",
            m.connections_open.clone(),
        );
        r.register(
            "connections_accepted",
            "Connections accepted",
            m.connections_accepted.clone(),
        );
        r.register(
            "rejected_frames",
            "Frames refused (bad, truncated or unexpected), by reason",
            m.rejected_frames.clone(),
        );
        r.register(
            "connections_timed_out",
            "Connections closed because a frame did not complete in time or nothing arrived, by reason",
            m.connections_timed_out.clone(),
        );
        r.register(
            "fetch_response_budget_waits",
            "Fetches that waited for the broker-wide budget of fetch answers (fetch_responses_bytes_max)",
            m.fetch_response_budget_waits.clone(),
        );
        r.register(
            "connections_dropped_slow",
            "Connections closed because the peer did not read its answers",
            m.connections_dropped_slow.clone(),
        );
        m.read_budget.register(r);
        m.responses.register(r);
        m.accept.register(r);
        r.register(
            "failovers",
            "Takeovers that made this broker master (the first election included)",
            m.failovers.clone(),
        );
        r.register(
            "failover_duration_seconds",
            "Previous master's last message (or takeover start) to serving clients",
            m.failover_duration.clone(),
        );
        r.register(
            "step_downs",
            "Times this broker stopped being master",
            m.step_downs.clone(),
        );
        r.register(
            "handoffs",
            "Graceful handoffs finished by this broker as the handing master",
            m.handoffs.clone(),
        );
        r.register(
            "handoff_duration_seconds",
            "Graceful handoff: request received to the new master serving (the write pause)",
            m.handoff_duration.clone(),
        );
        registry.register_collector(Box::new(SnapshotCollector { snapshot }));
        Metrics { registry, ..m }
    }

    /// Replaces the status read at scrape time.
    pub fn set_status(&self, status: StatusSnapshot) {
        *self.snapshot.lock().unwrap_or_else(PoisonError::into_inner) = status;
    }

    /// Sets what `GET /ready` answers (a no-op when it is unchanged).
    pub fn set_readiness(&self, readiness: Readiness) {
        self.ready.send_if_modified(|r| {
            if *r == readiness {
                return false;
            }
            *r = readiness;
            true
        });
    }

    /// What `GET /ready` answers: see `docs/operations.md` "Health checks" for the rules.
    #[must_use]
    pub fn readiness(&self) -> Readiness {
        self.ready.borrow().clone()
    }

    /// Counts a repair of a damaged store record, by outcome.
    pub fn repair(&self, outcome: &'static str) {
        self.store_repairs
            .get_or_create(&[("outcome", outcome)])
            .inc();
    }

    /// Counts a refused frame.
    pub fn reject_frame(&self, reason: &'static str) {
        self.rejected_frames
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Counts a connection closed by a timeout.
    pub fn time_out_connection(&self, reason: &'static str) {
        self.connections_timed_out
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Counts a produce error.
    pub fn produce_error(&self, code: &'static str) {
        self.produce_errors.get_or_create(&[("code", code)]).inc();
    }

    /// The whole registry in Prometheus text format.
    ///
    /// # Errors
    /// Only if formatting fails (it writes to a `String`).
    pub fn encode(&self) -> Result<String, fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &self.registry)?;
        self.standard.encode_into(&mut out)?;
        Ok(out)
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl MetricsText for Metrics {
    fn encode_text(&self) -> Result<String, fmt::Error> {
        self.encode()
    }

    fn readiness(&self) -> Readiness {
        Metrics::readiness(self)
    }
}

#[derive(Debug)]
struct SnapshotCollector {
    snapshot: Arc<Mutex<StatusSnapshot>>,
}

fn gauge(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64) -> fmt::Result {
    let g = ConstGauge::new(v);
    let m = enc.encode_descriptor(name, help, None, g.metric_type())?;
    g.encode(m)
}

fn signed(v: Option<u64>) -> i64 {
    v.map_or(-1, |v| i64::try_from(v).unwrap_or(i64::MAX))
}

impl Collector for SnapshotCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let s = self
            .snapshot
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        gauge(
            &mut enc,
            "is_master",
            "1 while this broker is the master",
            i64::from(s.is_master),
        )?;
        gauge(
            &mut enc,
            "epoch",
            "Highest epoch this broker knows",
            signed(Some(s.epoch)),
        )?;
        gauge(
            &mut enc,
            "hwm",
            "High-water mark this broker knows (-1: none)",
            signed(s.hwm),
        )?;
        gauge(
            &mut enc,
            "applied_offset",
            "Highest offset applied to broker state (-1: none)",
            signed(s.applied),
        )?;
        gauge(
            &mut enc,
            "trim_point",
            "Retention trim point applied: reads below it are answered Trimmed (0: none)",
            signed(Some(s.trim_point)),
        )?;
        gauge(
            &mut enc,
            "last_checkpoint",
            "Offset of the newest retention checkpoint above the trim point (-1: none)",
            signed(s.last_checkpoint),
        )?;
        gauge(
            &mut enc,
            "ack_quorum",
            "Qa: voting stores that must persist an event before it is stabilized, in the \
             voter set in force at this broker",
            i64::try_from(s.ack_quorum).unwrap_or(i64::MAX),
        )?;
        per_store(
            &mut enc,
            &s.stores,
            "store_voter",
            "1 while a store is in the voter set in force at this broker, 0 for a learner",
            |st| Some(u64::from(st.voter)),
        )?;
        per_store(
            &mut enc,
            &s.stores,
            "store_lag",
            "Events a store lacks behind the master's log end (-1: unknown, not master)",
            |st| st.lag,
        )?;
        per_store(
            &mut enc,
            &s.stores,
            "store_lag_bytes",
            "Bytes of the offsets at or below the HWM a store has not acked (the events the \
             master holds summed, older ones at their mean size; -1: unknown, not master)",
            |st| st.lag_bytes,
        )?;
        per_store(
            &mut enc,
            &s.stores,
            "store_catch_up_ms",
            "Estimated ms until a store holds the master's HWM at its recent ack rate \
             (0: in sync; -1: not closing in, unknown, not master)",
            |st| st.catch_up_ms,
        )
    }
}

/// One gauge per store, labelled `store`.
fn per_store(
    enc: &mut DescriptorEncoder<'_>,
    stores: &[StoreProgress],
    name: &str,
    help: &str,
    value: impl Fn(&StoreProgress) -> Option<u64>,
) -> fmt::Result {
    let family = Family::<[(&'static str, String); 1], Gauge>::default();
    for st in stores {
        family
            .get_or_create(&[("store", st.addr.clone())])
            .set(signed(value(st)));
    }
    let m = enc.encode_descriptor(name, help, None, family.metric_type())?;
    family.encode(m)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_quire_prefix_and_the_snapshot_is_read_at_scrape_time() {
        let m = Metrics::new();
        m.produce_requests.inc();
        m.failovers.inc();
        m.failover_duration.observe(0.8);
        m.handoffs.inc();
        m.handoff_duration.observe(0.05);
        m.produce_error("no_quorum");
        m.reject_frame("frame_too_large");
        m.time_out_connection("partial_frame_timeout");
        m.set_status(StatusSnapshot {
            is_master: true,
            epoch: 65_537,
            hwm: Some(41),
            applied: Some(41),
            trim_point: 30,
            last_checkpoint: Some(35),
            ack_quorum: 2,
            stores: vec![StoreProgress {
                addr: "127.0.0.1:7001".into(),
                lag: Some(3),
                lag_bytes: Some(3_072),
                catch_up_ms: None,
                voter: true,
            }],
        });
        let text = m.encode().expect("encodes");
        for want in [
            "quire_produce_requests_total 1",
            "quire_failovers_total 1",
            "quire_failover_duration_seconds_count 1",
            "quire_handoffs_total 1",
            "quire_handoff_duration_seconds_count 1",
            "quire_is_master 1",
            "quire_epoch 65537",
            "quire_hwm 41",
            "quire_trim_point 30",
            "quire_last_checkpoint 35",
            "quire_store_lag{store=\"127.0.0.1:7001\"} 3",
            "quire_store_lag_bytes{store=\"127.0.0.1:7001\"} 3072",
            "quire_store_catch_up_ms{store=\"127.0.0.1:7001\"} -1",
            "quire_store_voter{store=\"127.0.0.1:7001\"} 1",
            "quire_ack_quorum 2",
            "quire_produce_errors_total{code=\"no_quorum\"} 1",
            "quire_quorum_wait_seconds_bucket",
            "quire_rejected_frames_total{reason=\"frame_too_large\"} 1",
            "quire_connections_timed_out_total{reason=\"partial_frame_timeout\"} 1",
            "quire_read_buffer_bytes 0",
            "quire_build_info{",
            "process_open_fds ",
        ] {
            assert!(text.contains(want), "missing {want:?} in\n{text}");
        }
    }

    #[test]
    fn readiness_starts_false_and_follows_the_server() {
        let m = Metrics::new();
        assert!(matches!(m.readiness(), Readiness::NotReady(_)));
        m.set_readiness(Readiness::Ready);
        assert_eq!(m.readiness(), Readiness::Ready);
        m.set_readiness(Readiness::NotReady("taking over".into()));
        assert_eq!(m.readiness(), Readiness::NotReady("taking over".into()));
    }
}
