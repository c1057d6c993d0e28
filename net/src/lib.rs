//! quire-net: the server side of a Quire TCP connection, shared by quire-node and
//! quire-broker (both serve peers they cannot trust to behave).
//!
//! What it owns:
//! - [`FrameReader`]: reads frames from one accepted connection under three bounds — a
//!   **partial-frame timeout** (a frame whose first byte has arrived must be whole within
//!   it), an **idle timeout** (a connection that sends nothing for that long is closed),
//!   and a server-wide **read budget** ([`ReadBudget`]): the bytes buffered for incoming
//!   frames across all connections. When the budget is used up, readers stop reading
//!   (TCP pushes back on the peers) instead of allocating. A frame's buffer grows as its
//!   bytes arrive, never to the length its header announces.
//! - [`ReadSettings`]: those bounds as settings, with their defaults and limits.
//! - [`ConnBytes`], [`OutFrame`], [`write_frames`]: the answering side. A connection's
//!   byte bound covers each request from before it is served until its response's last
//!   byte is written to the socket, so a peer that does not read its answers stops being
//!   read instead of having responses queued for it without limit; a write that makes no
//!   progress for [`WRITE_STALL_TIMEOUT`] fails.
//! - [`ConnectionLimit`] and [`Acceptor`]: the bound on open connections
//!   (`connections_max` plus a small reserve for cluster peers), the refusal of
//!   connections beyond it, and an accept loop that never spins on `accept()` errors;
//!   [`fit_open_files_limit`] checks it against `RLIMIT_NOFILE` at start.
//! - [`layers`]: server settings read from flags, `QUIRE_NODE_*`/`QUIRE_BROKER_*`
//!   variables, a TOML file and defaults under one naming rule, with `--print-config`;
//!   [`units`]: the duration and size parsers (`50ms`, `64KiB`) they and the `quire` CLI use.
//! - [`serve_metrics`]: the tiny HTTP/1.1 responder for `GET /metrics`, `/healthz` and
//!   `/ready` ([`Readiness`]).
//! - [`build_info`]: version, commit and rustc of the build (from `build.rs`), for
//!   `--version` and `quire_build_info`; [`StandardMetrics`]: that metric and the standard
//!   process metrics read from `/proc/self` ([`ProcessCollector`]).
//! - [`return_large_buffers_to_the_os`]: the allocator setting that keeps resident memory
//!   following the read budget (large buffers mapped on their own, unmapped when freed),
//!   and [`FramePool`], which keeps up to [`POOLED_BYTES_MAX`] of them mapped for later
//!   frames so a busy connection does not fault in fresh pages per frame.
//!
//! What it does not own: wire bytes (`quire-proto`, a pure codec), what a server does with
//! a frame, who answers it and through which queue (each server's), and which metrics it
//! keeps.

mod alloc;
mod budget;
pub mod build_info;
mod connections;
pub mod layers;
mod metrics_http;
mod pool;
mod process;
mod reader;
mod settings;
mod tls_settings;
pub mod units;
mod writer;

pub use alloc::{return_large_buffers_to_the_os, HEAP_TOP_KEPT_BYTES, MMAP_THRESHOLD_BYTES};
pub use budget::{BudgetMetrics, ReadBudget};
pub use connections::{
    authorize, fit_open_files_limit, is_broker_only_frame, is_peer_frame, log_unauthorized,
    peer_reserve_error, per_address_error, per_principal_error, plan_open_files, refusal_error,
    AcceptMetrics, Acceptor, ConnectionLimit, ConnectionPermit, OpenFilesPlan, Throttle,
    ACCEPT_ERROR_BACKOFF, ANONYMOUS_PRINCIPAL, CONNECTIONS_MAX_DEFAULT, CONNECTIONS_MAX_LIMIT,
    OWN_FDS_RESERVE, PEER_CONNECTIONS_RESERVE, PEER_FIRST_FRAME_TIMEOUT, REFUSAL_LOG_INTERVAL,
    REFUSED_CONNECTIONS_MAX, REFUSED_PEER_RESERVE, REFUSED_PER_ADDRESS, REFUSED_PER_PRINCIPAL,
    REFUSED_TLS_HANDSHAKE, TLS_HANDSHAKES_MAX, TLS_HANDSHAKE_TIMEOUT,
};
pub use metrics_http::{
    serve_metrics, MetricsText, Readiness, HTTP_CONNECTIONS_MAX, HTTP_REQUEST_BYTES_MAX,
    HTTP_TIMEOUT, READY_REASON_BYTES_MAX,
};
pub use pool::{FramePool, POOLED_BUFFER_BYTES_MAX, POOLED_BYTES_MAX};
pub use process::{
    open_fds, parse_boot_time_seconds, parse_max_open_files, parse_stat, ProcError, ProcStat,
    ProcessCollector, StandardMetrics,
};
pub use reader::{
    wire_reject_reason, FrameReader, ReadError, Received, FRAME_BUFFER_FIRST_BYTES_MAX,
    READ_ROOM_BYTES_MAX, READ_ROOM_BYTES_MIN,
};
pub use settings::{
    ReadSettings, SettingError, IDLE_TIMEOUT_MS_DEFAULT, IDLE_TIMEOUT_MS_MIN,
    PARTIAL_FRAME_TIMEOUT_MS_DEFAULT, PARTIAL_FRAME_TIMEOUT_MS_MAX, PARTIAL_FRAME_TIMEOUT_MS_MIN,
    READ_BUFFER_BYTES_MAX_DEFAULT,
};
pub use tls_settings::{until_shutdown, TlsSettings};
pub use writer::{
    write_frames, write_frames_within, BytesHeld, ConnBytes, OutFrame, ResponseMetrics, IOV_MAX,
    WRITE_STALL_TIMEOUT,
};
