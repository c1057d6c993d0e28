//! The node's metrics (Prometheus text format, every name prefixed `quire_`).
//!
//! Metrics kept by the node itself: connections, append requests accepted (persisted) and
//! their events and payload bytes, appends rejected by reason, frames rejected by reason,
//! fences by outcome, appends made durable per WAL wake-up (group commit as the node sees
//! it), and the store's state (promised epoch, voter, last durable offset, HWM heard).
//! Metrics read from the WAL at scrape time ([`quire_wal::WalStats`]): appends, records and
//! bytes made durable, batches (each one group commit: one write), fsyncs and the fsync
//! latency histogram, truncations, whether the log failed.
//!
//! Besides its own, the node exports quire-net's [`StandardMetrics`]: `quire_build_info`
//! and the standard `process_*` metrics.
//!
//! `GET /metrics`, `/healthz` and `/ready` are served by quire-net's
//! [`quire_net::serve_metrics`] (one responder for node and broker). The store is ready
//! while its WAL is open and has not failed ([`Metrics::readiness`]).

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use quire_net::{
    AcceptMetrics, BudgetMetrics, MetricsText, Readiness, ResponseMetrics, StandardMetrics,
};
use quire_wal::{Wal, FSYNC_US_BUCKETS};

/// The `reason` labels of `quire_appends_rejected_total` exported (as 0) from start.
pub const APPEND_REJECT_REASONS: [&str; 6] = [
    "stale_epoch",
    "log_mismatch",
    "log_failed",
    "overloaded",
    "invalid",
    "internal",
];

/// A label set with one label.
pub type Label = [(&'static str, &'static str); 1];

/// Every metric the node updates. Cheap to share (`Arc`); updates are atomic.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `quire_build_info` and the `process_*` metrics (unprefixed registry).
    standard: StandardMetrics,
    /// The WAL, for readiness (`None` until [`Metrics::register_wal`]).
    wal: Option<Wal>,
    /// Open client connections.
    pub connections_open: Gauge,
    /// Connections accepted since start.
    pub connections_accepted: Counter,
    /// Connections closed at once (by reason), and failed `accept()` calls
    /// (`quire_connections_refused_total{reason}`, `quire_accept_errors_total`).
    pub accept: AcceptMetrics,
    /// Connections closed by the node because the peer did not read its responses.
    pub connections_dropped_slow: Counter,
    /// Reads that waited for the node-wide read-response budget
    /// (`limits.read_responses_bytes_max`).
    pub read_response_budget_waits: Counter,
    /// Connections closed because a frame did not complete in time
    /// (`partial_frame_timeout`) or nothing arrived (`idle_timeout`), by reason.
    pub connections_timed_out: Family<Label, Counter>,
    /// The read budget: bytes held, and reads that waited for it.
    pub read_budget: BudgetMetrics,
    /// Bytes of responses queued and not yet written (`response_bytes_queued`).
    pub responses: ResponseMetrics,
    /// Appends answered with a persisted ack.
    pub appends_persisted: Counter,
    /// Events in appends answered with a persisted ack.
    pub append_events: Counter,
    /// Payload bytes in appends answered with a persisted ack.
    pub append_bytes: Counter,
    /// Appends answered with `AppendRejected` (label `reason`) or an error (`invalid`,
    /// `internal`).
    pub appends_rejected: Family<Label, Counter>,
    /// Frames the node could not serve (label `reason`).
    pub rejected_frames: Family<Label, Counter>,
    /// Fences by outcome (`granted`, `refused`, `not_voter`, `corrupt`).
    pub fences: Family<Label, Counter>,
    /// Requests received, by frame type.
    pub requests: Family<Label, Counter>,
    /// Repair requests answered, by outcome (`repaired`, `already_good`, `other_entry`,
    /// `not_held`, `error`).
    pub repairs: Family<Label, Counter>,
    /// Appends that became durable together (one WAL completion wake-up of the store).
    pub group_commit_appends: Histogram,
    /// The promised epoch.
    pub promised_epoch: Gauge<u64, AtomicU64>,
    /// 1 for a voter, 0 for a learner.
    pub voter: Gauge,
    /// 1 while the store carries a tail-cut mark (its recovery cut a torn tail and it has
    /// not caught up with a later master since), else 0.
    pub tail_cut: Gauge,
    /// Highest HWM heard from a current master (-1: none).
    pub hwm: Gauge<i64, AtomicI64>,
}

impl Metrics {
    /// A fresh set of metrics, registered under the `quire` prefix.
    #[must_use]
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("quire");
        let m = Metrics {
            connections_open: Gauge::default(),
            connections_accepted: Counter::default(),
            accept: AcceptMetrics::default(),
            connections_dropped_slow: Counter::default(),
            read_response_budget_waits: Counter::default(),
            connections_timed_out: Family::default(),
            read_budget: BudgetMetrics::default(),
            responses: ResponseMetrics::default(),
            appends_persisted: Counter::default(),
            append_events: Counter::default(),
            append_bytes: Counter::default(),
            appends_rejected: Family::default(),
            rejected_frames: Family::default(),
            fences: Family::default(),
            requests: Family::default(),
            repairs: Family::default(),
            group_commit_appends: Histogram::new([
                1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0,
            ]),
            promised_epoch: Gauge::default(),
            voter: Gauge::default(),
            tail_cut: Gauge::default(),
            hwm: Gauge::default(),
            registry: Registry::default(),
            standard: StandardMetrics::new(),
            wal: None,
        };
        m.hwm.set(-1);
        // Known reasons read 0 from the start (a rate or an alert needs the series to
        // exist before the first rejection).
        for reason in APPEND_REJECT_REASONS {
            let _ = m.appends_rejected.get_or_create(&[("reason", reason)]);
        }
        let r = &mut registry;
        r.register(
            "connections_open",
            "Open client connections",
            m.connections_open.clone(),
        );
        r.register(
            "connections_accepted",
            "Client connections accepted",
            m.connections_accepted.clone(),
        );
        m.accept.register(r);
        r.register(
            "connections_dropped_slow",
            "Connections closed because the peer did not read its responses",
            m.connections_dropped_slow.clone(),
        );
        r.register(
            "read_response_budget_waits",
            "Reads that waited for the node-wide read-response budget (limits.read_responses_bytes_max)",
            m.read_response_budget_waits.clone(),
        );
        r.register(
            "connections_timed_out",
            "Connections closed because a frame did not complete in time or nothing arrived, by reason",
            m.connections_timed_out.clone(),
        );
        m.read_budget.register(r);
        m.responses.register(r);
        r.register(
            "appends_persisted",
            "Append requests answered with a persisted ack",
            m.appends_persisted.clone(),
        );
        r.register(
            "append_events",
            "Events in append requests answered with a persisted ack",
            m.append_events.clone(),
        );
        r.register(
            "append_bytes",
            "Payload bytes in append requests answered with a persisted ack",
            m.append_bytes.clone(),
        );
        r.register(
            "appends_rejected",
            "Append requests refused, by reason",
            m.appends_rejected.clone(),
        );
        r.register(
            "rejected_frames",
            "Frames the node could not serve (bad or unexpected), by reason",
            m.rejected_frames.clone(),
        );
        r.register("fences", "Fence requests, by outcome", m.fences.clone());
        r.register(
            "requests",
            "Requests received, by frame type",
            m.requests.clone(),
        );
        r.register(
            "repairs",
            "Repair requests (a good copy of a damaged record) answered, by outcome",
            m.repairs.clone(),
        );
        r.register(
            "group_commit_appends",
            "Append requests made durable together (one WAL completion)",
            m.group_commit_appends.clone(),
        );
        r.register(
            "promised_epoch",
            "The store's promised epoch",
            m.promised_epoch.clone(),
        );
        r.register(
            "voter",
            "1 if the store is a voter, 0 for a learner",
            m.voter.clone(),
        );
        r.register(
            "tail_cut",
            "1 while the store carries a tail-cut mark (its grants count only when every store grants)",
            m.tail_cut.clone(),
        );
        r.register(
            "hwm",
            "Highest high-water mark heard from a current master (-1: none)",
            m.hwm.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Adds the WAL's counters, read at each scrape, and makes readiness follow it.
    pub fn register_wal(&mut self, wal: Wal) {
        self.wal = Some(wal.clone());
        self.registry
            .register_collector(Box::new(WalCollector { wal }));
    }

    /// Whether the store should get traffic (`GET /ready`): its WAL is open (registered)
    /// and has not failed. A failed log is fail-stop for the process: it stays not ready
    /// until the store is restarted on a good disk. Reads the WAL's lock-free counters; the
    /// reason (under the WAL's state lock) is read only once the log has failed, when no
    /// append takes that lock any more.
    #[must_use]
    pub fn readiness(&self) -> Readiness {
        let Some(wal) = &self.wal else {
            return Readiness::NotReady("the log is not open".into());
        };
        if !wal.stats().failed {
            return Readiness::Ready;
        }
        Readiness::NotReady(match wal.failure() {
            Some(e) => format!("the log has failed (fail-stop; restart on a good disk): {e}"),
            None => "the log has failed (fail-stop; restart on a good disk)".to_owned(),
        })
    }

    /// Counts a rejected frame.
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

    /// Counts a rejected append.
    pub fn reject_append(&self, reason: &'static str) {
        self.appends_rejected
            .get_or_create(&[("reason", reason)])
            .inc();
    }

    /// Counts a repair request answered with `outcome`.
    pub fn repair(&self, outcome: &'static str) {
        self.repairs.get_or_create(&[("outcome", outcome)]).inc();
    }

    /// Counts a request of `kind`.
    pub fn request(&self, kind: &'static str) {
        self.requests.get_or_create(&[("type", kind)]).inc();
    }

    /// Counts a fence outcome.
    pub fn fence(&self, outcome: &'static str) {
        self.fences.get_or_create(&[("outcome", outcome)]).inc();
    }

    /// The whole registry in Prometheus text format (version 0.0.4).
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

/// Reads [`quire_wal::WalStats`] at scrape time.
#[derive(Debug)]
struct WalCollector {
    wal: Wal,
}

fn counter(enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: u64) -> fmt::Result {
    let c = ConstCounter::new(v);
    let m = enc.encode_descriptor(name, help, None, c.metric_type())?;
    c.encode(m)
}

impl Collector for WalCollector {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> fmt::Result {
        let s = self.wal.stats();
        counter(
            &mut enc,
            "wal_appends",
            "WAL appends made durable.",
            s.appends,
        )?;
        counter(
            &mut enc,
            "wal_records",
            "Records (events) made durable.",
            s.records,
        )?;
        counter(
            &mut enc,
            "wal_payload_bytes",
            "Payload bytes made durable.",
            s.payload_bytes,
        )?;
        counter(
            &mut enc,
            "wal_batches",
            "Group-commit batches written (one write each).",
            s.batches,
        )?;
        counter(
            &mut enc,
            "wal_batch_bytes",
            "Bytes written by batches, padding included.",
            s.batch_bytes,
        )?;
        counter(&mut enc, "wal_fsyncs", "fdatasyncs completed.", s.fsyncs)?;
        counter(
            &mut enc,
            "wal_truncations",
            "Truncation markers written.",
            s.truncations,
        )?;
        counter(
            &mut enc,
            "wal_appends_refused",
            "WAL appends refused by validation.",
            s.appends_refused,
        )?;
        // Where append latency goes (sums; divide by wal_appends or wal_batches for means).
        for (name, help, ns) in [
            (
                "wal_append_prepare_seconds",
                "Time appenders spent before their appends were queued (checksums, validation).",
                s.stages.prepare_ns,
            ),
            (
                "wal_append_queue_seconds",
                "Time appends waited in the queue until the commit thread encoded their batch.",
                s.stages.queue_ns,
            ),
            (
                "wal_batch_encode_seconds",
                "Time the commit thread spent encoding (copying) batches.",
                s.stages.copy_ns,
            ),
            (
                "wal_write_seconds",
                "Time batch writes took, from hand-off to the disk to completion.",
                s.stages.write_ns,
            ),
        ] {
            let c = ConstCounter::new(ns as f64 / 1e9);
            let m = enc.encode_descriptor(name, help, None, c.metric_type())?;
            c.encode(m)?;
        }
        let failed = ConstGauge::new(i64::from(s.failed));
        let m = enc.encode_descriptor(
            "wal_failed",
            "1 if the WAL has failed (fail-stop).",
            None,
            failed.metric_type(),
        )?;
        failed.encode(m)?;
        let gauge =
            |enc: &mut DescriptorEncoder<'_>, name: &str, help: &str, v: i64| -> fmt::Result {
                let g = ConstGauge::new(v);
                let m = enc.encode_descriptor(name, help, None, g.metric_type())?;
                g.encode(m)
            };
        let last = self
            .wal
            .last_durable()
            .map_or(-1, |p| i64::try_from(p.offset.0).unwrap_or(i64::MAX));
        gauge(
            &mut enc,
            "log_last_durable_offset",
            "Offset of the last durable entry (-1: empty log).",
            last,
        )?;
        let first = i64::try_from(self.wal.first_offset().0).unwrap_or(i64::MAX);
        gauge(
            &mut enc,
            "log_first_offset",
            "Lowest offset the log holds.",
            first,
        )?;
        let corrupt = i64::try_from(self.wal.corrupt_records().len()).unwrap_or(i64::MAX);
        gauge(
            &mut enc,
            "log_corrupt_records",
            "Durable records a read found damaged on this disk (the store grants no fence while any is known).",
            corrupt,
        )?;

        // The fsync latency histogram, in seconds. WalStats buckets are per bucket (not
        // cumulative) with an overflow bucket last; the encoder accumulates.
        let mut buckets: Vec<(f64, u64)> = FSYNC_US_BUCKETS
            .iter()
            .zip(s.fsync_us_buckets.iter())
            .map(|(&le_us, &n)| (le_us as f64 / 1e6, n))
            .collect();
        buckets.push((f64::INFINITY, s.fsync_us_buckets[FSYNC_US_BUCKETS.len()]));
        let count: u64 = s.fsync_us_buckets.iter().sum();
        let mut m = enc.encode_descriptor(
            "wal_fsync_duration_seconds",
            "fdatasync latency, from submission (or, linked behind a write, that write's completion) to completion.",
            None,
            MetricType::Histogram,
        )?;
        m.encode_histogram::<prometheus_client::encoding::NoLabelSet>(
            s.fsync_us_sum as f64 / 1e6,
            count,
            &buckets,
            None,
        )
    }
}
