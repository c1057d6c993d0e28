//! `quire cluster audit`: which store holds which offsets, where their logs diverge, and
//! whether a quorum of voters holds every offset at or below the high-water mark.
//!
//! # Sources
//! - **Online.** `--brokers` names the stores (their slots, voter or learner), the HWM and
//!   the master, as `quire cluster status` learns them; `--stores` adds store addresses
//!   directly. Each store is asked over the wire: a `TailRequest` (its bounds, identity,
//!   role and the HWM it heard), then `RangeDigestRequest`s (read-only, see
//!   `quire_proto::digest`).
//! - **Offline.** `--data-dir` names a store's data directory (or its `wal/`): its WAL is
//!   scanned with quire-wal's read-only recovery scan (no repair, no lock), its entries'
//!   ids kept in memory, and the same digest computed over them. Reading a running store's
//!   directory is a snapshot of a moving log. A directory whose identity matches a store
//!   the brokers name takes that store's slot (a stopped store read next to live ones).
//!
//! # Method
//! Logs are compared by range digests, never by streaming events: for every pair of
//! stores, their common range is digested in chunks of at most
//! `RANGE_DIGEST_OFFSETS_MAX` offsets; in the first chunk whose digests differ, a binary
//! search on digests of halves finds the first offset where they disagree, and the two
//! entries there are fetched. A store's epochs are found the same way (the epoch at an
//! offset is the last entry of a one-offset digest; epochs never decrease along a log, so
//! a binary search finds each boundary). The offset axis is then cut at every store's
//! start, end, epoch boundaries and divergence points; in each piece the stores that
//! agree form groups.
//!
//! Cost: nothing but digests and ids crosses the wire, but a store computes each digest
//! from its WAL, so it reads its common range with the others once (online digests are
//! remembered per store, up to [`DIGEST_CACHE_ENTRIES_MAX`], and reused across pairs), plus
//! a few records per bisection step and epoch boundary.
//!
//! # Verdict and exit status
//! - **healthy** (0): every voter answered and holds every offset up to the HWM, no
//!   two stores diverge at or below the HWM, no corruption.
//! - **degraded** ([`EXIT_DEGRADED`], 4): not healthy, but a quorum of voters agrees on
//!   every offset from the trim point to the HWM and a quorum of voters answered.
//! - **at risk** ([`EXIT_AT_RISK`], 5): some offset at or below the HWM is held (in
//!   agreement) by fewer than a quorum of voters, or fewer than a quorum of voters answered.
//!
//! An audit that could read no store at all is an error (exit 1). A store of unknown role
//! (named by `--stores` but unreachable, with no broker to say) counts as a voter.
//!
//! # JSON (`--format json`)
//! ```json
//! {"verdict":"healthy","exit_code":0,"hwm":1041,"hwm_source":"broker","epoch":65537,
//!  "master":{"id":1,"addr":"127.0.0.1:7201"},"voters":3,"quorum":2,"trim_point":0,
//!  "stores":[{"index":0,"addr":"127.0.0.1:7101","dir":null,"source":"online",
//!             "store_id":"…","role":"voter","reachable":true,"error":null,"start":0,
//!             "end":1041,"last_epoch":65537,"heard_hwm":1041,"missing":null,
//!             "corruption":null,"torn_tail":null}],
//!  "ranges":[{"from":0,"to":1041,"groups":[{"epoch":65537,"stores":[0,1,2]}]}],
//!  "divergences":[],"under_quorum":[],
//!  "takeover":{"store":0,"epoch":65537,"offset":1041,"voters_answering":3,"can_fence":true},
//!  "notes":[]}
//! ```
//! Offsets are log offsets; `end` is the last offset the store validly holds (`null`:
//! nothing); `missing` is the range `[from, to]` up to the HWM a voter lacks;
//! `under_quorum` lists ranges `[from, to]` at or below the HWM held by fewer than a
//! quorum of voters.

use std::collections::{BTreeSet, HashMap};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use quire_client::{ConnConfig, StoreClient};
use quire_proto::{EntryId, Offset, RangeDigest, RangeDigestResponse, RANGE_DIGEST_OFFSETS_MAX};
use quire_wal::scan::{RecordStatus, ScanEnd};
use quire_wal::WalError;
use serde::Serialize;
use tokio::task::JoinSet;

use super::runtime;
use super::status::{self, BrokerRef, StatusConfig};
use crate::cli::FormatArgs;
use crate::output::Report;
use crate::units::parse_duration;
use crate::wal::FindingsExit;

/// Exit status of a healthy cluster.
pub const EXIT_HEALTHY: u8 = 0;
/// Exit status of a degraded cluster (something missing, down, lagging, divergent or
/// corrupt, but a quorum of voters holds every offset up to the HWM). Chosen clear of 1
/// (error), 2 (usage), 3 (`quire wal`: could not read) and 130 (interrupted).
pub const EXIT_DEGRADED: u8 = 4;
/// Exit status of a cluster at risk (an offset up to the HWM held by fewer than a quorum of
/// voters, or fewer than a quorum of voters answering).
pub const EXIT_AT_RISK: u8 = 5;

/// Entries kept in memory per offline store: 20 bytes each, so at most 1.25 GiB.
pub const OFFLINE_ENTRIES_MAX: usize = 64 << 20;

/// Arguments of `quire cluster audit`.
#[derive(Debug, Clone, Args)]
pub struct AuditArgs {
    /// Brokers to learn the stores, the voters, the HWM and the master from (as `quire
    /// cluster status`). Without `--brokers`, `$QUIRE_BROKERS` or the profile's are used
    /// only when neither `--stores` nor `--data-dir` is given: an offline audit needs no
    /// broker and asks none.
    #[command(flatten)]
    pub brokers: super::BrokersArgs,

    /// Store addresses (`host:port`) to audit over the wire, besides those the brokers
    /// name; comma separated.
    #[arg(long, value_name = "ADDR,...", value_delimiter = ',')]
    pub stores: Vec<String>,

    /// A store's data directory (or its `wal/` directory) to audit offline; repeat it or
    /// give a comma list, one per store. Read-only: nothing is repaired or locked, so a
    /// running store's directory is read as a snapshot of a moving log.
    #[arg(long = "data-dir", value_name = "DIR,...", value_delimiter = ',')]
    pub data_dirs: Vec<PathBuf>,

    /// How long to wait for each broker and store (connect, and each request).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "2s")]
    pub timeout: Duration,

    #[command(flatten)]
    pub format: FormatArgs,
}

/// What `quire cluster audit` needs.
#[derive(Debug, Clone, Default)]
pub struct AuditConfig {
    /// Broker addresses (may be empty).
    pub brokers: Vec<String>,
    /// Store addresses given directly.
    pub stores: Vec<String>,
    /// Data directories to read offline.
    pub data_dirs: Vec<PathBuf>,
    /// Bound of each connect and request.
    pub timeout: Duration,
    /// TLS towards brokers and stores (`--tls-ca`, and a client certificate for stores
    /// that require one); `None`: plaintext.
    pub tls: Option<quire_tls::TlsConnector>,
}

impl AuditArgs {
    /// The configuration these arguments describe.
    ///
    /// # Errors
    /// No source at all was given.
    pub fn to_config(&self) -> anyhow::Result<AuditConfig> {
        let trim = |v: &[String]| -> Vec<String> {
            v.iter()
                .map(|s| s.trim().to_owned())
                .filter(|s| !s.is_empty())
                .collect()
        };
        let config = AuditConfig {
            brokers: self.brokers.addrs(),
            stores: trim(&self.stores),
            data_dirs: self
                .data_dirs
                .iter()
                .filter(|d| !d.as_os_str().is_empty())
                .cloned()
                .collect(),
            timeout: self.timeout,
            tls: self.brokers.tls()?,
        };
        if config.brokers.is_empty() && config.stores.is_empty() && config.data_dirs.is_empty() {
            bail!("nothing to audit: give --brokers, --stores or --data-dir");
        }
        Ok(config)
    }
}

// ---------------------------------------------------------------------------------------
// Reading logs: one interface over a store on the wire and a scanned directory.

/// The digest of what a log holds in a range (see `RangeDigestResponse`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Digest {
    /// Entries digested.
    pub count: u64,
    /// Their digest.
    pub digest: u32,
    /// The last entry digested.
    pub last_entry: Option<EntryId>,
}

impl From<&RangeDigestResponse> for Digest {
    fn from(r: &RangeDigestResponse) -> Digest {
        Digest {
            count: r.count,
            digest: r.digest,
            last_entry: r.last_entry,
        }
    }
}

/// A log held in memory: the entries of a scanned directory, or a test's synthetic log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MemLog {
    /// Offset of `entries[0]`.
    pub start: u64,
    /// Entries at consecutive offsets from `start`.
    pub entries: Vec<EntryId>,
}

impl MemLog {
    /// The digest of the entries at offsets `from..=to` that this log holds.
    #[must_use]
    pub fn digest(&self, from: u64, to: u64) -> Digest {
        let end = self.start + self.entries.len() as u64; // one past the last
        let lo = from.max(self.start);
        let hi = to.saturating_add(1).min(end);
        let d = if lo < hi {
            let a = usize::try_from(lo - self.start).unwrap_or(usize::MAX);
            let b = usize::try_from(hi - self.start).unwrap_or(usize::MAX);
            RangeDigest::of(self.entries[a..b].iter().copied())
        } else {
            RangeDigest::new()
        };
        Digest {
            count: d.count(),
            digest: d.digest(),
            last_entry: d.last(),
        }
    }

    /// The last offset held, if any.
    #[must_use]
    pub fn end(&self) -> Option<u64> {
        self.entries.last().map(|e| e.offset.0)
    }
}

/// Digests remembered per online store: the chunks of the common range are asked once per
/// store, not once per pair of stores it is compared with.
pub const DIGEST_CACHE_ENTRIES_MAX: usize = 1 << 16;

/// Where a store's log is read from.
#[derive(Debug)]
enum Log {
    Mem(MemLog),
    Remote(StoreClient, Mutex<HashMap<(u64, u64), Digest>>),
}

impl Log {
    fn remote(client: StoreClient) -> Log {
        Log::Remote(client, Mutex::new(HashMap::new()))
    }

    /// The digest of `from..=to`, a range of at most `RANGE_DIGEST_OFFSETS_MAX` offsets.
    async fn digest(&self, from: u64, to: u64) -> Result<Digest, String> {
        debug_assert!(from <= to && to - from < RANGE_DIGEST_OFFSETS_MAX);
        match self {
            Log::Mem(m) => Ok(m.digest(from, to)),
            Log::Remote(c, cache) => {
                let lock = || {
                    cache
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                };
                if let Some(d) = lock().get(&(from, to)) {
                    return Ok(*d);
                }
                let d = c
                    .range_digest(Offset(from), Offset(to))
                    .await
                    .map(|r| Digest::from(&r))
                    .map_err(|e| e.to_string())?;
                let mut cache = lock();
                if cache.len() < DIGEST_CACHE_ENTRIES_MAX {
                    cache.insert((from, to), d);
                }
                Ok(d)
            }
        }
    }

    /// The entry at `offset`, if held.
    async fn entry(&self, offset: u64) -> Result<Option<EntryId>, String> {
        Ok(self
            .digest(offset, offset)
            .await?
            .last_entry
            .filter(|e| e.offset.0 == offset))
    }
}

/// The first offset in `from..=to` (held by both) where `a` and `b` hold different entries,
/// found by comparing digests of chunks of at most `RANGE_DIGEST_OFFSETS_MAX` offsets and
/// then halving the first chunk that differs. `None`: they agree on the whole range.
///
/// # Errors
/// `(0, why)` if reading `a` failed, `(1, why)` if reading `b` failed.
async fn first_divergence(
    a: &Log,
    b: &Log,
    from: u64,
    to: u64,
) -> Result<Option<u64>, (usize, String)> {
    if from > to {
        return Ok(None);
    }
    let da = |lo, hi| async move { a.digest(lo, hi).await.map_err(|e| (0, e)) };
    let db = |lo, hi| async move { b.digest(lo, hi).await.map_err(|e| (1, e)) };
    let mut chunk = from;
    loop {
        let chunk_end = to.min(chunk.saturating_add(RANGE_DIGEST_OFFSETS_MAX - 1));
        if da(chunk, chunk_end).await? != db(chunk, chunk_end).await? {
            // Invariant: they agree on [from, lo) and differ somewhere in [lo, hi].
            let (mut lo, mut hi) = (chunk, chunk_end);
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                if da(lo, mid).await? == db(lo, mid).await? {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            return Ok(Some(lo));
        }
        if chunk_end == to {
            return Ok(None);
        }
        chunk = chunk_end + 1;
    }
}

/// The epoch runs of `log` over `from..=to` (all held): `(first, last, epoch)`, in order.
/// Epochs never decrease along a log, so equal epochs at both ends of a range mean one run;
/// otherwise the range is halved.
async fn epoch_runs(log: &Log, from: u64, to: u64) -> Result<Vec<Run>, String> {
    let epoch_at = |o: u64| async move {
        log.entry(o)
            .await?
            .map(|e| e.epoch.0)
            .ok_or_else(|| format!("the store no longer holds offset {o}"))
    };
    let mut pieces: Vec<Run> = Vec::new();
    let mut stack = vec![(from, epoch_at(from).await?, to, epoch_at(to).await?)];
    while let Some((lo, e_lo, hi, e_hi)) = stack.pop() {
        if e_lo == e_hi {
            pieces.push(Run {
                from: lo,
                to: hi,
                epoch: e_lo,
            });
        } else if hi == lo + 1 {
            pieces.push(Run {
                from: lo,
                to: lo,
                epoch: e_lo,
            });
            pieces.push(Run {
                from: hi,
                to: hi,
                epoch: e_hi,
            });
        } else {
            let mid = lo + (hi - lo) / 2;
            let e_mid = epoch_at(mid).await?;
            // Left half first: pushed last.
            stack.push((mid + 1, epoch_at(mid + 1).await?, hi, e_hi));
            stack.push((lo, e_lo, mid, e_mid));
        }
    }
    let mut runs: Vec<Run> = Vec::new();
    for p in pieces {
        match runs.last_mut() {
            Some(r) if r.epoch == p.epoch && r.to + 1 == p.from => r.to = p.to,
            _ => runs.push(p),
        }
    }
    Ok(runs)
}

/// A run of consecutive offsets of one epoch in one store's log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Run {
    /// First offset.
    pub from: u64,
    /// Last offset.
    pub to: u64,
    /// Their epoch.
    pub epoch: u64,
}

/// What a scan of a data directory found.
#[derive(Debug)]
struct Scanned {
    log: MemLog,
    corruption: Option<Corruption>,
    torn_tail: Option<TornTailInfo>,
}

/// Scans the WAL of data directory `dir` (or of `dir` itself if it has no `wal/`),
/// read-only, keeping the id of every entry of the log.
fn scan_dir(dir: &Path) -> Result<Scanned, String> {
    let wal = wal_dir(dir);
    let mut entries: Vec<EntryId> = Vec::new();
    let mut too_many = false;
    let report = quire_wal::scan::scan_dir(&wal, &mut |r| {
        let Some(h) = r.header else { return };
        match r.status {
            RecordStatus::Entry => {
                if entries.len() < OFFLINE_ENTRIES_MAX {
                    entries.push(EntryId {
                        epoch: h.epoch,
                        offset: h.offset,
                        // What the stores' range digests hold: the content's checksum,
                        // not the stored one (which also covers the segment's tag).
                        crc: r.content_crc().unwrap_or(h.crc),
                    });
                } else {
                    too_many = true;
                }
            }
            RecordStatus::Marker { .. } => {
                // A truncation marker at x drops every entry from x on.
                let keep = entries.partition_point(|e| e.offset < h.offset);
                entries.truncate(keep);
            }
            // The scan refuses damaged records (`DamagedRecords::Refuse`): the log ends
            // there and the report says so.
            RecordStatus::Bad(_) | RecordStatus::Damaged { .. } => {}
        }
    })
    .map_err(|e| format!("cannot scan {}: {e}", wal.display()))?;
    if too_many {
        return Err(format!(
            "{} holds more than {OFFLINE_ENTRIES_MAX} entries: audit it online",
            wal.display()
        ));
    }
    let (corruption, torn_tail) = match &report.end {
        ScanEnd::Clean => (None, None),
        ScanEnd::TornTail(t) => (
            None,
            Some(TornTailInfo {
                offset: t.offset.0,
                segment: t.segment.display().to_string(),
                position: t.position.0,
            }),
        ),
        ScanEnd::Corruption(e) => (Some(Corruption::from_wal(e)), None),
    };
    Ok(Scanned {
        log: MemLog {
            start: report.start.0,
            entries,
        },
        corruption,
        torn_tail,
    })
}

fn wal_dir(dir: &Path) -> PathBuf {
    let inner = dir.join("wal");
    if inner.is_dir() {
        inner
    } else {
        dir.to_path_buf()
    }
}

// ---------------------------------------------------------------------------------------
// The report.

/// Corruption a WAL scan found: the store does not validly hold `offset` nor anything after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Corruption {
    /// The offset the log expected where the bad record lies.
    pub offset: u64,
    /// The segment file.
    pub segment: String,
    /// Byte position of the bad record in it.
    pub position: u64,
    /// What is wrong.
    pub problem: String,
}

impl Corruption {
    fn from_wal(e: &WalError) -> Corruption {
        match e {
            WalError::Corruption {
                segment,
                position,
                offset,
                problem,
            } => Corruption {
                offset: offset.0,
                segment: segment.display().to_string(),
                position: position.0,
                problem: problem.to_string(),
            },
            other => Corruption {
                offset: 0,
                segment: String::new(),
                position: 0,
                problem: other.to_string(),
            },
        }
    }
}

/// Where a scanned log's torn tail starts (normal after a crash: records never acked).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TornTailInfo {
    /// The offset the torn record would have had.
    pub offset: u64,
    /// Its segment.
    pub segment: String,
    /// Its byte position.
    pub position: u64,
}

/// One store as the audit saw it.
#[derive(Clone, Debug, Serialize)]
pub struct StoreAudit {
    /// Its slot: in the brokers' `--stores` list when they name it, else after those.
    pub index: usize,
    /// `host:port`, when known.
    pub addr: Option<String>,
    /// The data directory read, for an offline store.
    pub dir: Option<String>,
    /// `"online"` (asked over the wire) or `"offline"` (its directory read).
    pub source: &'static str,
    /// Its store id, 16 hex digits, when known.
    pub store_id: Option<String>,
    /// `"voter"`, `"learner"` or `"unknown"` (counted as a voter).
    pub role: &'static str,
    /// Whether its log could be read.
    pub reachable: bool,
    /// Why not, or what failed while auditing it.
    pub error: Option<String>,
    /// First offset it holds (its trim point), when it holds any.
    pub start: Option<u64>,
    /// Last offset it validly holds.
    pub end: Option<u64>,
    /// Epoch of that last entry.
    pub last_epoch: Option<u64>,
    /// The HWM it heard from a master (online only).
    pub heard_hwm: Option<u64>,
    /// Offsets up to the HWM this voter lacks, `[from, to]`.
    pub missing: Option<[u64; 2]>,
    /// Its epoch runs.
    pub runs: Vec<Run>,
    /// Corruption found by the scan (offline).
    pub corruption: Option<Corruption>,
    /// A torn tail found by the scan (offline; not a fault).
    pub torn_tail: Option<TornTailInfo>,
}

impl StoreAudit {
    fn is_voter(&self) -> bool {
        self.role != "learner"
    }

    fn span(&self) -> Option<(u64, u64)> {
        match (self.start, self.end) {
            (Some(s), Some(e)) if s <= e => Some((s, e)),
            _ => None,
        }
    }

    fn epoch_at(&self, offset: u64) -> Option<u64> {
        self.runs
            .iter()
            .find(|r| r.from <= offset && offset <= r.to)
            .map(|r| r.epoch)
    }
}

/// Stores that hold the same entries over a range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Group {
    /// Their epoch there.
    pub epoch: u64,
    /// Their indexes.
    pub stores: Vec<usize>,
}

/// Who holds an offset range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RangeHolders {
    /// First offset.
    pub from: u64,
    /// Last offset.
    pub to: u64,
    /// The groups of stores that agree, largest first (more than one: they diverge).
    pub groups: Vec<Group>,
}

/// Where two stores' logs part.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Divergence {
    /// The two stores.
    pub stores: [usize; 2],
    /// The first offset where they hold different entries.
    pub offset: u64,
    /// Each one's entry there: `(epoch, offset, crc)`.
    pub entries: [Option<EntryJson>; 2],
    /// Each one's divergent suffix, `[offset, end]`.
    pub suffixes: [[u64; 2]; 2],
    /// Whether `offset` is at or below the HWM.
    pub below_hwm: bool,
}

/// An [`EntryId`] in the report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct EntryJson {
    /// Epoch.
    pub epoch: u64,
    /// Offset.
    pub offset: u64,
    /// Record CRC-32C.
    pub crc: u32,
}

impl From<EntryId> for EntryJson {
    fn from(e: EntryId) -> EntryJson {
        EntryJson {
            epoch: e.epoch.0,
            offset: e.offset.0,
            crc: e.crc,
        }
    }
}

/// A range `[from, to]` at or below the HWM and what holds it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct UnderQuorum {
    /// First offset.
    pub from: u64,
    /// Last offset.
    pub to: u64,
    /// Most voters that agree on it.
    pub voters: usize,
}

/// What a takeover would adopt now.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Takeover {
    /// The store whose log wins Raft's comparison among the voters read.
    pub store: usize,
    /// Its last epoch.
    pub epoch: u64,
    /// Its last offset.
    pub offset: u64,
    /// Voters whose log could be read.
    pub voters_answering: usize,
    /// Whether that is a quorum (a takeover needs a quorum of voters to grant its fence).
    pub can_fence: bool,
}

/// The verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Everything is where it should be.
    Healthy,
    /// Something is missing, down, lagging, divergent or corrupt, but a quorum of voters
    /// holds every offset up to the HWM.
    Degraded,
    /// Some offset up to the HWM lacks a quorum of voters, or too few voters answered.
    AtRisk,
}

impl Verdict {
    /// The exit status for it.
    #[must_use]
    pub fn exit_code(self) -> u8 {
        match self {
            Verdict::Healthy => EXIT_HEALTHY,
            Verdict::Degraded => EXIT_DEGRADED,
            Verdict::AtRisk => EXIT_AT_RISK,
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Verdict::Healthy => "healthy",
            Verdict::Degraded => "degraded",
            Verdict::AtRisk => "at risk",
        }
    }
}

/// The result of `quire cluster audit`.
#[derive(Clone, Debug, Serialize)]
pub struct AuditReport {
    /// The verdict.
    pub verdict: Verdict,
    /// Its exit status.
    pub exit_code: u8,
    /// The HWM the checks use.
    pub hwm: Option<u64>,
    /// `"broker"` (the master's, or the highest epoch's view), `"stores"` (the highest a
    /// store heard) or `"estimate"` (the highest offset a quorum of voters holds).
    pub hwm_source: &'static str,
    /// The epoch of the brokers' view.
    pub epoch: Option<u64>,
    /// The master, if confirmed.
    pub master: Option<BrokerRef>,
    /// Voters (including unreachable ones and stores of unknown role).
    pub voters: usize,
    /// A majority of them.
    pub quorum: usize,
    /// The highest start among the voters read: offsets below it were trimmed by
    /// retention and are not checked.
    pub trim_point: u64,
    /// Every store.
    pub stores: Vec<StoreAudit>,
    /// Who holds what.
    pub ranges: Vec<RangeHolders>,
    /// Where logs part.
    pub divergences: Vec<Divergence>,
    /// Ranges up to the HWM held by fewer than a quorum of voters.
    pub under_quorum: Vec<UnderQuorum>,
    /// What a takeover would adopt.
    pub takeover: Option<Takeover>,
    /// Why the verdict is not healthy, and other remarks.
    pub notes: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Gathering.

/// A store being audited, with its log.
struct Probe {
    audit: StoreAudit,
    log: Option<Log>,
}

/// Audits the cluster `config` describes.
///
/// # Errors
/// No store could be read at all, or the runtime could not start. A store that cannot be
/// read is a finding, not an error.
pub fn run(config: &AuditConfig) -> anyhow::Result<AuditReport> {
    let view = if config.brokers.is_empty() {
        None
    } else {
        match status::run(&StatusConfig {
            brokers: config.brokers.clone(),
            timeout: config.timeout,
            tls: config.tls.clone(),
        }) {
            Ok(s) => Some(s),
            Err(e) if !config.stores.is_empty() || !config.data_dirs.is_empty() => {
                tracing::warn!("{e:#}; auditing the stores given without the brokers' view");
                None
            }
            Err(e) => return Err(e),
        }
    };
    let rt = runtime("audit")?;
    let report = rt.block_on(gather_and_audit(config, view.as_ref()))?;
    Ok(report)
}

async fn gather_and_audit(
    config: &AuditConfig,
    view: Option<&status::ClusterStatus>,
) -> anyhow::Result<AuditReport> {
    let mut probes: Vec<Probe> = Vec::new();
    let mut notes = Vec::new();
    if view.is_none() {
        notes.push(
            "no broker answered (or none was named): the voter set is taken to be the stores \
             audited here, so a store left out is not counted; name the brokers (-b, \
             QUIRE_BROKERS or a profile) to audit against the cluster's own voter set"
                .to_owned(),
        );
    }
    // Slots the brokers name, then stores given directly.
    let mut addrs: Vec<(String, Option<&status::StoreStatus>)> = Vec::new();
    if let Some(v) = view {
        for s in &v.stores {
            addrs.push((s.addr.clone(), Some(s)));
        }
    }
    for a in &config.stores {
        if !addrs.iter().any(|(x, _)| x == a) {
            addrs.push((a.clone(), None));
        }
    }
    let conn = ConnConfig {
        connect_timeout: config.timeout,
        request_timeout: config.timeout,
        tls: config
            .tls
            .clone()
            .map(|t| t.expecting(quire_tls::Role::Store)),
        ..ConnConfig::default()
    };
    let mut set = JoinSet::new();
    for (i, (addr, _)) in addrs.iter().enumerate() {
        let conn = conn.clone();
        let addr = addr.clone();
        set.spawn(async move {
            let answer = async {
                let c = StoreClient::connect_with(addr.as_str(), conn)
                    .await
                    .map_err(|e| e.to_string())?;
                let tail = c.tail().await.map_err(|e| e.to_string())?;
                Ok::<_, String>((c, tail))
            }
            .await;
            (i, answer)
        });
    }
    let mut answers: Vec<Option<Result<_, String>>> = addrs.iter().map(|_| None).collect();
    while let Some(joined) = set.join_next().await {
        let (i, answer) = joined?;
        answers[i] = Some(answer);
    }
    let answers = answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err("not asked".to_owned())));
    for (index, ((addr, slot), answer)) in addrs.iter().zip(answers).enumerate() {
        let known_role = slot.map(|s| s.role).filter(|r| *r != "unknown");
        let mut audit = StoreAudit {
            index,
            addr: Some(addr.clone()),
            dir: None,
            source: "online",
            store_id: slot
                .filter(|s| s.role != "unknown")
                .map(|s| s.store_id.clone()),
            role: known_role.unwrap_or("unknown"),
            reachable: false,
            error: None,
            start: None,
            end: None,
            last_epoch: None,
            heard_hwm: None,
            missing: None,
            runs: Vec::new(),
            corruption: None,
            torn_tail: None,
        };
        let log = match answer {
            Ok((client, tail)) => {
                audit.reachable = true;
                audit.store_id = Some(format!("{:016x}", tail.store_id.0));
                audit.role = if tail.voter { "voter" } else { "learner" };
                audit.heard_hwm = tail.hwm.map(|o| o.0);
                audit.start = Some(tail.first_offset.0);
                audit.end = tail.last.map(|l| l.offset.0);
                audit.last_epoch = tail.last.map(|l| l.epoch.0);
                Some(Log::remote(client))
            }
            Err(e) => {
                audit.error = Some(e);
                None
            }
        };
        probes.push(Probe { audit, log });
    }
    for dir in &config.data_dirs {
        let identity = quire_node::Identity::load(dir).ok();
        let store_id = identity.map(|i| format!("{:016x}", i.store_id.0));
        let role = identity.map_or("unknown", |i| {
            if i.role.is_voter() {
                "voter"
            } else {
                "learner"
            }
        });
        let scanned = tokio::task::spawn_blocking({
            let dir = dir.clone();
            move || scan_dir(&dir)
        })
        .await
        .map_err(|e| anyhow::anyhow!("scan task failed: {e}"))?;
        let mut audit = StoreAudit {
            index: probes.len(),
            addr: None,
            dir: Some(dir.display().to_string()),
            source: "offline",
            store_id: store_id.clone(),
            role,
            reachable: false,
            error: None,
            start: None,
            end: None,
            last_epoch: None,
            heard_hwm: None,
            missing: None,
            runs: Vec::new(),
            corruption: None,
            torn_tail: None,
        };
        let log = match scanned {
            Ok(s) => {
                audit.reachable = true;
                audit.start = Some(s.log.start);
                audit.end = s.log.end();
                audit.last_epoch = s.log.entries.last().map(|e| e.epoch.0);
                audit.corruption = s.corruption;
                audit.torn_tail = s.torn_tail;
                Some(Log::Mem(s.log))
            }
            Err(e) => {
                audit.error = Some(e);
                None
            }
        };
        // The slot of the same store, if the brokers name it.
        let same = store_id.as_ref().and_then(|id| {
            probes
                .iter()
                .position(|p| p.audit.source == "online" && p.audit.store_id.as_ref() == Some(id))
        });
        match same {
            Some(i) if !probes[i].audit.reachable => {
                audit.index = probes[i].audit.index;
                audit.addr.clone_from(&probes[i].audit.addr);
                probes[i] = Probe { audit, log };
            }
            Some(i) => {
                notes.push(format!(
                    "{} is store {}, which answered online: its online view is used",
                    dir.display(),
                    probes[i].audit.index
                ));
            }
            None => probes.push(Probe { audit, log }),
        }
    }
    if !probes.iter().any(|p| p.audit.reachable) {
        let why: Vec<String> = probes
            .iter()
            .map(|p| {
                format!(
                    "{}: {}",
                    p.audit
                        .addr
                        .as_deref()
                        .or(p.audit.dir.as_deref())
                        .unwrap_or("?"),
                    p.audit.error.as_deref().unwrap_or("?")
                )
            })
            .collect();
        if why.is_empty() {
            bail!("no store to audit: the brokers named none");
        }
        bail!("no store could be read ({})", why.join("; "));
    }

    // Epoch runs of every store read.
    for p in &mut probes {
        let (Some(log), Some((s, e))) = (&p.log, p.audit.span()) else {
            continue;
        };
        match epoch_runs(log, s, e).await {
            Ok(runs) => p.audit.runs = runs,
            Err(err) => {
                p.audit.error = Some(format!("reading its epochs: {err}"));
                p.log = None;
            }
        }
    }
    // Divergence of every pair, over their common range.
    let mut pair_divergence: Vec<(usize, usize, u64)> = Vec::new();
    for i in 0..probes.len() {
        for j in i + 1..probes.len() {
            let (Some(a), Some(b)) = (&probes[i].log, &probes[j].log) else {
                continue;
            };
            let (Some((sa, ea)), Some((sb, eb))) = (probes[i].audit.span(), probes[j].audit.span())
            else {
                continue;
            };
            match first_divergence(a, b, sa.max(sb), ea.min(eb)).await {
                Ok(Some(d)) => pair_divergence.push((i, j, d)),
                Ok(None) => {}
                // A store whose read failed (a damaged record answers `Corrupt`: it does not
                // vote until repaired) is a fault of that store, not a note: it is no
                // longer counted as holding the range.
                Err((side, e)) => {
                    let who = if side == 0 { i } else { j };
                    let other = probes[if side == 0 { j } else { i }].audit.index;
                    probes[who].audit.error.get_or_insert_with(|| {
                        format!("reading it to compare with store {other}: {e}")
                    });
                }
            }
        }
    }
    let mut divergences = Vec::new();
    for &(i, j, d) in &pair_divergence {
        let ea = match &probes[i].log {
            Some(l) => l.entry(d).await.ok().flatten(),
            None => None,
        };
        let eb = match &probes[j].log {
            Some(l) => l.entry(d).await.ok().flatten(),
            None => None,
        };
        divergences.push(Divergence {
            stores: [probes[i].audit.index, probes[j].audit.index],
            offset: d,
            entries: [ea.map(EntryJson::from), eb.map(EntryJson::from)],
            suffixes: [
                [d, probes[i].audit.end.unwrap_or(d)],
                [d, probes[j].audit.end.unwrap_or(d)],
            ],
            below_hwm: false,
        });
    }
    let stores: Vec<StoreAudit> = probes.into_iter().map(|p| p.audit).collect();
    let hwm = view.and_then(|v| v.hwm).map(|h| (h, "broker")).or_else(|| {
        stores
            .iter()
            .filter_map(|s| s.heard_hwm)
            .max()
            .map(|h| (h, "stores"))
    });
    let mut report = assess(Assessment {
        stores,
        divergences,
        hwm,
        epoch: view.and_then(|v| v.epoch),
        master: view.and_then(|v| v.master.clone()),
    });
    report.notes.extend(notes);
    Ok(report)
}

// ---------------------------------------------------------------------------------------
// Judging: pure, so it is tested without a cluster.

/// What the judging step needs: every store's facts (spans and epoch runs), the
/// divergences found, and the HWM with where it came from.
#[derive(Clone, Debug)]
pub struct Assessment {
    /// Every store, `runs` filled for those read.
    pub stores: Vec<StoreAudit>,
    /// Pairwise divergences (`below_hwm` is filled in here).
    pub divergences: Vec<Divergence>,
    /// The HWM and its source (`"broker"` or `"stores"`); `None`: estimate it.
    pub hwm: Option<(u64, &'static str)>,
    /// Epoch of the brokers' view.
    pub epoch: Option<u64>,
    /// The master.
    pub master: Option<BrokerRef>,
}

/// Cuts the offset axis into ranges, groups the stores that agree in each, checks the
/// quorum up to the HWM, picks the takeover candidate, and gives the verdict.
#[must_use]
pub fn assess(a: Assessment) -> AuditReport {
    let Assessment {
        mut stores,
        mut divergences,
        hwm,
        epoch,
        master,
    } = a;
    let mut notes = Vec::new();
    let voters = stores.iter().filter(|s| s.is_voter()).count();
    let quorum = voters / 2 + 1;
    let read_voters: Vec<&StoreAudit> = stores
        .iter()
        .filter(|s| s.is_voter() && s.reachable && s.error.is_none())
        .collect();
    let trim_point = read_voters
        .iter()
        .filter(|s| s.span().is_some())
        .filter_map(|s| s.start)
        .max()
        .unwrap_or(0);
    // Position in `stores` by index, for the divergence lookup.
    let pos_of = |index: usize| stores.iter().position(|s| s.index == index);
    let diverge_at = |i: usize, j: usize| -> Option<u64> {
        divergences
            .iter()
            .find(|d| {
                let (a, b) = (pos_of(d.stores[0]), pos_of(d.stores[1]));
                (a, b) == (Some(i), Some(j)) || (a, b) == (Some(j), Some(i))
            })
            .map(|d| d.offset)
    };
    // Cut points.
    let mut cuts: BTreeSet<u64> = BTreeSet::new();
    for s in &stores {
        if s.error.is_some() {
            continue;
        }
        if let Some((from, to)) = s.span() {
            cuts.insert(from);
            cuts.insert(to + 1);
            for r in &s.runs {
                cuts.insert(r.from);
                cuts.insert(r.to + 1);
            }
        }
    }
    for d in &divergences {
        cuts.insert(d.offset);
    }
    let cuts: Vec<u64> = cuts.into_iter().collect();
    // Pieces with their groups.
    let mut pieces: Vec<RangeHolders> = Vec::new();
    for w in cuts.windows(2) {
        let (from, to) = (w[0], w[1] - 1);
        let holders: Vec<usize> = (0..stores.len())
            .filter(|&i| {
                stores[i].error.is_none()
                    && stores[i].span().is_some_and(|(s, e)| s <= from && to <= e)
            })
            .collect();
        let mut groups: Vec<Vec<usize>> = Vec::new();
        for &i in &holders {
            let agrees = |j: usize| diverge_at(i, j).is_none_or(|d| d > from);
            match groups.iter_mut().find(|g| agrees(g[0])) {
                Some(g) => g.push(i),
                None => groups.push(vec![i]),
            }
        }
        groups.sort_by_key(|g| std::cmp::Reverse(g.len()));
        let groups: Vec<Group> = groups
            .into_iter()
            .map(|g| Group {
                epoch: stores[g[0]].epoch_at(from).unwrap_or(0),
                stores: g.iter().map(|&i| stores[i].index).collect(),
            })
            .collect();
        match pieces.last_mut() {
            Some(p) if p.groups == groups && p.to + 1 == from => p.to = to,
            _ => pieces.push(RangeHolders { from, to, groups }),
        }
    }
    let ranges: Vec<RangeHolders> = pieces
        .iter()
        .filter(|p| !p.groups.is_empty())
        .cloned()
        .collect();
    let voters_agreeing = |p: &RangeHolders| -> usize {
        p.groups
            .iter()
            .map(|g| {
                g.stores
                    .iter()
                    .filter(|&&i| pos_of(i).is_some_and(|k| stores[k].is_voter()))
                    .count()
            })
            .max()
            .unwrap_or(0)
    };
    // The HWM, or an estimate: the highest offset a quorum of voters agrees on.
    let (hwm, hwm_source) = match hwm {
        Some((h, src)) => (Some(h), src),
        None => (
            pieces
                .iter()
                .rev()
                .find(|p| voters_agreeing(p) >= quorum)
                .map(|p| p.to),
            "estimate",
        ),
    };
    if hwm_source == "estimate" {
        notes.push(
            "no broker or store named a high-water mark: it is estimated as the highest \
             offset a quorum of voters holds"
                .to_owned(),
        );
    }
    // Quorum from the trim point to the HWM, gaps included.
    let mut under_quorum: Vec<UnderQuorum> = Vec::new();
    if let Some(h) = hwm {
        let mut push = |from: u64, to: u64, voters: usize| match under_quorum.last_mut() {
            Some(u) if u.voters == voters && u.to + 1 == from => u.to = to,
            _ => under_quorum.push(UnderQuorum { from, to, voters }),
        };
        let mut next = trim_point;
        for p in &pieces {
            if next > h {
                break;
            }
            if p.to < next {
                continue;
            }
            if p.from > next {
                push(next, (p.from - 1).min(h), 0);
                next = p.from;
                if next > h {
                    break;
                }
            }
            let v = voters_agreeing(p);
            if v < quorum {
                push(next, p.to.min(h), v);
            }
            next = p.to + 1;
        }
        if next <= h {
            push(next, h, 0);
        }
    }
    // Each voter's missing range up to the HWM.
    if let Some(h) = hwm {
        for s in &mut stores {
            if !s.is_voter() || !s.reachable || s.error.is_some() {
                continue;
            }
            let from = s.end.map_or(trim_point, |e| e + 1).max(trim_point);
            if from <= h {
                s.missing = Some([from, h]);
            }
        }
    }
    for d in &mut divergences {
        d.below_hwm = hwm.is_some_and(|h| d.offset <= h);
    }
    // The takeover: Raft's comparison among the voters read.
    let answering: Vec<&StoreAudit> = stores
        .iter()
        .filter(|s| s.is_voter() && s.reachable && s.error.is_none())
        .collect();
    let takeover = answering
        .iter()
        .filter_map(|s| Some((s, s.last_epoch?, s.end?)))
        .max_by_key(|(s, e, o)| (*e, *o, std::cmp::Reverse(s.index)))
        .map(|(s, e, o)| Takeover {
            store: s.index,
            epoch: e,
            offset: o,
            voters_answering: answering.len(),
            can_fence: answering.len() >= quorum,
        });
    if stores.iter().any(|s| s.source == "offline" && s.reachable) {
        notes.push(
            "stores read offline count as answering voters here, but must be running to \
             grant a takeover's fence"
                .to_owned(),
        );
    }

    // The verdict.
    let mut risk = Vec::new();
    let mut faults = Vec::new();
    if answering.len() < quorum {
        risk.push(format!(
            "only {} of {voters} voters could be read (a quorum is {quorum})",
            answering.len()
        ));
    }
    for u in &under_quorum {
        risk.push(format!(
            "offsets {}..={} are held by {} voter(s), fewer than a quorum of {quorum}",
            u.from, u.to, u.voters
        ));
    }
    for s in &stores {
        let name = format!("store {}", s.index);
        if !s.reachable {
            faults.push(format!(
                "{name} is unreachable{}",
                s.error
                    .as_ref()
                    .map_or_else(String::new, |e| format!(" ({e})"))
            ));
        } else if let Some(e) = &s.error {
            faults.push(format!("{name}: {e}"));
        }
        if let Some(c) = &s.corruption {
            faults.push(format!(
                "{name} has corruption at offset {} ({}, position {}: {})",
                c.offset, c.segment, c.position, c.problem
            ));
        }
        if let Some([from, to]) = s.missing {
            faults.push(format!("{name} lacks offsets {from}..={to}"));
        }
    }
    for d in &divergences {
        if d.below_hwm {
            faults.push(format!(
                "stores {} and {} diverge at offset {}, at or below the HWM",
                d.stores[0], d.stores[1], d.offset
            ));
        }
    }
    let verdict = if !risk.is_empty() {
        Verdict::AtRisk
    } else if !faults.is_empty() {
        Verdict::Degraded
    } else {
        Verdict::Healthy
    };
    let mut all_notes = risk;
    all_notes.extend(faults);
    all_notes.extend(notes);
    AuditReport {
        verdict,
        exit_code: verdict.exit_code(),
        hwm,
        hwm_source,
        epoch,
        master,
        voters,
        quorum,
        trim_point,
        stores,
        ranges,
        divergences,
        under_quorum,
        takeover,
        notes: all_notes,
    }
}

/// The error that makes the binary exit with the verdict's status after the report was
/// printed (`None` for a healthy cluster).
#[must_use]
pub fn verdict_exit(report: &AuditReport) -> Option<FindingsExit> {
    (report.verdict != Verdict::Healthy).then(|| FindingsExit {
        exit_code: report.exit_code,
        message: format!(
            "cluster audit: {}{}",
            report.verdict.as_str(),
            report
                .notes
                .first()
                .map_or_else(String::new, |n| format!(": {n}"))
        ),
    })
}

// ---------------------------------------------------------------------------------------
// Text.

fn opt<T: ToString>(v: Option<T>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn list(v: &[usize]) -> String {
    v.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

impl Report for AuditReport {
    fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(
            out,
            "verdict   {} (exit {})",
            self.verdict.as_str(),
            self.exit_code
        )?;
        let source = match self.hwm_source {
            "broker" => "from the brokers",
            "stores" => "the highest a store heard",
            _ => "estimate: highest offset a quorum of voters holds",
        };
        writeln!(out, "hwm       {} ({source})", opt(self.hwm))?;
        if let Some(m) = &self.master {
            writeln!(
                out,
                "master    broker {} at {}, epoch {}",
                m.id,
                m.addr,
                opt(self.epoch)
            )?;
        }
        writeln!(
            out,
            "voters    {} (quorum {}), trim point {}",
            self.voters, self.quorum, self.trim_point
        )?;
        writeln!(out)?;
        writeln!(
            out,
            "{:<5}  {:<7}  {:<7}  {:<9}  {:>10}  {:>10}  {:>12}  where",
            "store", "role", "source", "state", "start", "end", "last epoch"
        )?;
        for s in &self.stores {
            let state = if !s.reachable {
                "down"
            } else if s.corruption.is_some() {
                "corrupt"
            } else if s.error.is_some() {
                "error"
            } else if s.missing.is_some() {
                "lagging"
            } else {
                "ok"
            };
            let place = s.addr.as_deref().or(s.dir.as_deref()).unwrap_or("-");
            writeln!(
                out,
                "{:<5}  {:<7}  {:<7}  {:<9}  {:>10}  {:>10}  {:>12}  {place}",
                s.index,
                s.role,
                s.source,
                state,
                opt(s.start),
                opt(s.end),
                opt(s.last_epoch)
            )?;
            if let Some(c) = &s.corruption {
                writeln!(
                    out,
                    "       corruption at offset {}: {} (segment {}, position {})",
                    c.offset, c.problem, c.segment, c.position
                )?;
            }
            if let Some([from, to]) = s.missing {
                writeln!(out, "       lacks {from}..={to}")?;
            }
            if let Some(e) = &s.error {
                writeln!(out, "       {e}")?;
            }
        }
        writeln!(out)?;
        writeln!(out, "ranges")?;
        for r in &self.ranges {
            let groups: Vec<String> = r
                .groups
                .iter()
                .map(|g| format!("epoch {}: stores {}", g.epoch, list(&g.stores)))
                .collect();
            writeln!(out, "  {}..={}  {}", r.from, r.to, groups.join("  |  "))?;
        }
        if self.ranges.is_empty() {
            writeln!(out, "  (no store holds any offset)")?;
        }
        for d in &self.divergences {
            let side = |k: usize| {
                d.entries[k].map_or_else(
                    || "-".to_owned(),
                    |e| {
                        format!(
                            "(epoch {}, offset {}, crc {:#010x})",
                            e.epoch, e.offset, e.crc
                        )
                    },
                )
            };
            writeln!(
                out,
                "diverge   stores {} and {} at offset {}{}: store {} holds {} and on through {}, \
                 store {} holds {} and on through {}",
                d.stores[0],
                d.stores[1],
                d.offset,
                if d.below_hwm {
                    " (at or below the HWM)"
                } else {
                    " (above the HWM)"
                },
                d.stores[0],
                side(0),
                d.suffixes[0][1],
                d.stores[1],
                side(1),
                d.suffixes[1][1],
            )?;
        }
        match &self.takeover {
            Some(t) => writeln!(
                out,
                "takeover  would adopt store {}'s log (last epoch {}, offset {}); {} of {} voters \
                 answer{}",
                t.store,
                t.epoch,
                t.offset,
                t.voters_answering,
                self.voters,
                if t.can_fence {
                    ", a quorum: a fence can succeed"
                } else {
                    ", fewer than a quorum: no fence can succeed"
                }
            )?,
            None => writeln!(out, "takeover  no voter's log could be read")?,
        }
        for n in &self.notes {
            writeln!(out, "note      {n}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use quire_proto::Epoch;

    use super::*;

    fn entry(epoch: u64, offset: u64, crc: u32) -> EntryId {
        EntryId {
            epoch: Epoch(epoch),
            offset: Offset(offset),
            crc,
        }
    }

    /// A log of `len` entries from `start`, epoch 1, crc = offset.
    fn log(start: u64, len: u64) -> MemLog {
        MemLog {
            start,
            entries: (start..start + len)
                .map(|o| entry(1, o, o as u32))
                .collect(),
        }
    }

    fn block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn diverge(a: &MemLog, b: &MemLog) -> Option<u64> {
        let from = a.start.max(b.start);
        let to = a.end().unwrap_or(0).min(b.end().unwrap_or(0));
        if a.entries.is_empty() || b.entries.is_empty() {
            return None;
        }
        block_on(first_divergence(
            &Log::Mem(a.clone()),
            &Log::Mem(b.clone()),
            from,
            to,
        ))
        .unwrap()
    }

    /// `b` is `a` with the entry at `at` and everything after it in epoch 2.
    fn rewritten_from(a: &MemLog, at: u64) -> MemLog {
        let mut b = a.clone();
        for e in &mut b.entries {
            if e.offset.0 >= at {
                *e = entry(2, e.offset.0, e.crc ^ 0xffff);
            }
        }
        b
    }

    #[test]
    fn bisection_finds_the_first_offset_that_differs() {
        let a = log(0, 1000);
        assert_eq!(diverge(&a, &a.clone()), None, "equal logs");
        for at in [0, 1, 499, 500, 998, 999] {
            assert_eq!(diverge(&a, &rewritten_from(&a, at)), Some(at), "at {at}");
        }
        // One flipped crc in the middle only, the rest equal.
        let mut b = a.clone();
        b.entries[617].crc ^= 1;
        assert_eq!(diverge(&a, &b), Some(617));
    }

    #[test]
    fn bisection_spans_more_than_one_request() {
        let len = RANGE_DIGEST_OFFSETS_MAX * 2 + 10;
        let a = log(0, len);
        let at = RANGE_DIGEST_OFFSETS_MAX + 3;
        assert_eq!(diverge(&a, &rewritten_from(&a, at)), Some(at));
        assert_eq!(diverge(&a, &rewritten_from(&a, len - 1)), Some(len - 1));
        assert_eq!(diverge(&a, &a.clone()), None);
    }

    #[test]
    fn bisection_compares_only_the_common_range() {
        let a = log(0, 100);
        // A store trimmed to 40 and one behind at 60: the same entries where both hold.
        let trimmed = log(40, 60);
        let behind = log(0, 61);
        assert_eq!(diverge(&a, &trimmed), None);
        assert_eq!(diverge(&trimmed, &behind), None);
        assert_eq!(diverge(&rewritten_from(&a, 70), &trimmed), Some(70));
        assert_eq!(
            diverge(&rewritten_from(&a, 10), &trimmed),
            Some(40),
            "first held"
        );
        // Disjoint retention: nothing in common, nothing to compare.
        let late = log(200, 10);
        assert_eq!(
            block_on(first_divergence(
                &Log::Mem(a.clone()),
                &Log::Mem(late),
                200,
                99
            ))
            .unwrap(),
            None
        );
        // Empty logs digest to nothing.
        let empty = MemLog::default();
        assert_eq!(empty.digest(0, 10).count, 0);
        assert_eq!(
            block_on(first_divergence(
                &Log::Mem(empty.clone()),
                &Log::Mem(empty),
                0,
                10
            ))
            .unwrap(),
            None
        );
    }

    #[test]
    fn epoch_runs_are_found_by_halving() {
        let mut l = log(5, 100);
        for e in &mut l.entries {
            let o = e.offset.0;
            e.epoch = Epoch(if o < 17 {
                1
            } else if o < 18 {
                3
            } else if o < 90 {
                4
            } else {
                9
            });
        }
        let runs = block_on(epoch_runs(&Log::Mem(l), 5, 104)).unwrap();
        assert_eq!(
            runs,
            vec![
                Run {
                    from: 5,
                    to: 16,
                    epoch: 1
                },
                Run {
                    from: 17,
                    to: 17,
                    epoch: 3
                },
                Run {
                    from: 18,
                    to: 89,
                    epoch: 4
                },
                Run {
                    from: 90,
                    to: 104,
                    epoch: 9
                },
            ]
        );
        let one = block_on(epoch_runs(&Log::Mem(log(0, 1)), 0, 0)).unwrap();
        assert_eq!(
            one,
            vec![Run {
                from: 0,
                to: 0,
                epoch: 1
            }]
        );
    }

    fn store(index: usize, span: Option<(u64, u64)>, epoch: u64) -> StoreAudit {
        StoreAudit {
            index,
            addr: Some(format!("s{index}:1")),
            dir: None,
            source: "online",
            store_id: None,
            role: "voter",
            reachable: true,
            error: None,
            start: span.map(|s| s.0),
            end: span.map(|s| s.1),
            last_epoch: span.map(|_| epoch),
            heard_hwm: None,
            missing: None,
            runs: span
                .map(|(from, to)| vec![Run { from, to, epoch }])
                .unwrap_or_default(),
            corruption: None,
            torn_tail: None,
        }
    }

    fn assess_with(
        stores: Vec<StoreAudit>,
        divergences: Vec<Divergence>,
        hwm: Option<u64>,
    ) -> AuditReport {
        assess(Assessment {
            stores,
            divergences,
            hwm: hwm.map(|h| (h, "broker")),
            epoch: None,
            master: None,
        })
    }

    #[test]
    fn every_voter_holding_everything_is_healthy() {
        let r = assess_with(
            (0..3).map(|i| store(i, Some((0, 1041)), 7)).collect(),
            vec![],
            Some(1041),
        );
        assert_eq!(r.verdict, Verdict::Healthy, "{:?}", r.notes);
        assert_eq!(r.exit_code, 0);
        assert_eq!(
            r.ranges,
            vec![RangeHolders {
                from: 0,
                to: 1041,
                groups: vec![Group {
                    epoch: 7,
                    stores: vec![0, 1, 2]
                }],
            }]
        );
        assert_eq!(
            r.takeover
                .as_ref()
                .map(|t| (t.store, t.offset, t.can_fence)),
            Some((0, 1041, true))
        );
    }

    #[test]
    fn one_voter_down_or_behind_is_degraded() {
        let mut down = store(2, None, 0);
        down.reachable = false;
        down.error = Some("connection refused".into());
        let r = assess_with(
            vec![
                store(0, Some((0, 100)), 1),
                store(1, Some((0, 100)), 1),
                down,
            ],
            vec![],
            Some(100),
        );
        assert_eq!(r.verdict, Verdict::Degraded);
        assert_eq!(r.exit_code, EXIT_DEGRADED);
        assert!(r.under_quorum.is_empty());

        let r = assess_with(
            vec![
                store(0, Some((0, 100)), 1),
                store(1, Some((0, 100)), 1),
                store(2, Some((0, 60)), 1),
            ],
            vec![],
            Some(100),
        );
        assert_eq!(r.verdict, Verdict::Degraded);
        assert_eq!(r.stores[2].missing, Some([61, 100]));
        assert_eq!(r.ranges.len(), 2);
        assert_eq!(r.ranges[1].from, 61);
        assert_eq!(r.ranges[1].groups[0].stores, vec![0, 1]);
    }

    #[test]
    fn an_offset_below_the_hwm_on_one_voter_only_is_at_risk() {
        let r = assess_with(
            vec![
                store(0, Some((0, 100)), 1),
                store(1, Some((0, 50)), 1),
                store(2, Some((0, 50)), 1),
            ],
            vec![],
            Some(80),
        );
        assert_eq!(r.verdict, Verdict::AtRisk);
        assert_eq!(r.exit_code, EXIT_AT_RISK);
        assert_eq!(
            r.under_quorum,
            vec![UnderQuorum {
                from: 51,
                to: 80,
                voters: 1
            }]
        );
        // Too few voters answering.
        let mut a = store(1, None, 0);
        a.reachable = false;
        let mut b = store(2, None, 0);
        b.reachable = false;
        let r = assess_with(vec![store(0, Some((0, 10)), 1), a, b], vec![], Some(10));
        assert_eq!(r.verdict, Verdict::AtRisk);
        assert!(!r.takeover.unwrap().can_fence);
    }

    #[test]
    fn divergence_splits_the_range_and_below_the_hwm_degrades() {
        let mut s2 = store(2, Some((0, 120)), 1);
        s2.runs = vec![
            Run {
                from: 0,
                to: 89,
                epoch: 1,
            },
            Run {
                from: 90,
                to: 120,
                epoch: 5,
            },
        ];
        s2.last_epoch = Some(5);
        let d = Divergence {
            stores: [0, 2],
            offset: 90,
            entries: [None, None],
            suffixes: [[90, 100], [90, 120]],
            below_hwm: false,
        };
        let d12 = Divergence {
            stores: [1, 2],
            ..d.clone()
        };
        let stores = vec![store(0, Some((0, 100)), 1), store(1, Some((0, 100)), 1), s2];
        // Divergent above the HWM: an unacknowledged tail, not a fault.
        let r = assess_with(stores.clone(), vec![d.clone(), d12.clone()], Some(85));
        assert_eq!(r.verdict, Verdict::Healthy, "{:?}", r.notes);
        let split = r.ranges.iter().find(|x| x.from == 90).unwrap();
        assert_eq!(split.to, 100);
        assert_eq!(
            split.groups,
            vec![
                Group {
                    epoch: 1,
                    stores: vec![0, 1]
                },
                Group {
                    epoch: 5,
                    stores: vec![2]
                }
            ]
        );
        // Raft's comparison: the highest last epoch wins over the longer log.
        assert_eq!(r.takeover.unwrap().store, 2);
        // At or below the HWM: degraded (a quorum still agrees).
        let r = assess_with(stores, vec![d, d12], Some(95));
        assert_eq!(r.verdict, Verdict::Degraded);
        assert!(r.divergences.iter().all(|d| d.below_hwm));
    }

    #[test]
    fn corruption_degrades_and_the_hwm_is_estimated_without_a_broker() {
        let mut c = store(2, Some((0, 40)), 1);
        c.source = "offline";
        c.corruption = Some(Corruption {
            offset: 41,
            segment: "x".into(),
            position: 0,
            problem: "bad".into(),
        });
        let r = assess_with(
            vec![store(0, Some((0, 100)), 1), store(1, Some((0, 100)), 1), c],
            vec![],
            None,
        );
        assert_eq!(r.hwm, Some(100));
        assert_eq!(r.hwm_source, "estimate");
        assert_eq!(r.verdict, Verdict::Degraded);
        assert_eq!(r.stores[2].missing, Some([41, 100]));
    }

    #[test]
    fn the_text_names_ranges_divergences_and_the_verdict() {
        let mut s2 = store(2, Some((0, 120)), 1);
        s2.runs = vec![
            Run {
                from: 0,
                to: 89,
                epoch: 1,
            },
            Run {
                from: 90,
                to: 120,
                epoch: 5,
            },
        ];
        s2.last_epoch = Some(5);
        let d = Divergence {
            stores: [0, 2],
            offset: 90,
            entries: [
                Some(EntryJson {
                    epoch: 1,
                    offset: 90,
                    crc: 0xab,
                }),
                None,
            ],
            suffixes: [[90, 100], [90, 120]],
            below_hwm: false,
        };
        let d12 = Divergence {
            stores: [1, 2],
            ..d.clone()
        };
        let r = assess_with(
            vec![store(0, Some((0, 100)), 1), store(1, Some((0, 100)), 1), s2],
            vec![d, d12],
            Some(95),
        );
        let mut out = Vec::new();
        r.write_text(&mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("verdict   degraded (exit 4)"), "{text}");
        assert!(text.contains("  0..=89  epoch 1: stores 0,1,2"), "{text}");
        assert!(
            text.contains("  90..=100  epoch 1: stores 0,1  |  epoch 5: stores 2"),
            "{text}"
        );
        assert!(text.contains("  101..=120  epoch 5: stores 2"), "{text}");
        assert!(
            text.contains("diverge   stores 0 and 2 at offset 90 (at or below the HWM)"),
            "{text}"
        );
        assert!(
            text.contains("(epoch 1, offset 90, crc 0x000000ab)"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["verdict"], "degraded");
        assert_eq!(json["exit_code"], 4);
    }

    #[test]
    fn retention_below_the_trim_point_is_not_counted() {
        // Two voters trimmed to 50, one still holds 0..: 0..49 is retention's, not a risk.
        let r = assess_with(
            vec![
                store(0, Some((50, 100)), 1),
                store(1, Some((50, 100)), 1),
                store(2, Some((0, 100)), 1),
            ],
            vec![],
            Some(100),
        );
        assert_eq!(r.trim_point, 50);
        assert_eq!(r.verdict, Verdict::Healthy, "{:?}", r.notes);
        assert_eq!(
            r.ranges[0],
            RangeHolders {
                from: 0,
                to: 49,
                groups: vec![Group {
                    epoch: 1,
                    stores: vec![2]
                }]
            }
        );
    }
}
