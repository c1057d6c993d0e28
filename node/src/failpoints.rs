//! Failpoints: fault injection into the real `quire-node` binary, for the multi-process
//! fault tests (docs/testing.md).
//!
//! Built only with the `failpoints` cargo feature (the workspace's fault tests enable it
//! through a dev-dependency, so `cargo test --workspace` builds the binary with it;
//! `cargo build --release` does not). With the feature, a node started with the
//! environment variable [`FAILPOINTS_ENV`] set puts its WAL on a
//! `quire_wal::disk::FaultDisk` over the configured disk, with the plan the variable
//! spells (grammar in `quire_wal::disk::FaultPlan::from_spec`), for example
//! `QUIRE_FAILPOINTS='wal_fdatasync=eio,after=20'`. Without the variable nothing changes.
//!
//! Without the feature there is no fault disk at all: a node started with the variable set
//! refuses to start rather than run a fault test without its fault.
//!
//! What it does not own: the faults themselves (`quire-wal`'s fault disk).

use quire_wal::disk::Disk;
use quire_wal::IoBackend;

/// The environment variable holding the failpoint spec.
pub const FAILPOINTS_ENV: &str = "QUIRE_FAILPOINTS";

/// Whether this binary was built with the `failpoints` feature.
#[must_use]
pub const fn compiled_in() -> bool {
    cfg!(feature = "failpoints")
}

/// The disk the WAL should use because of [`FAILPOINTS_ENV`]: `None` when the variable is
/// unset or empty (the WAL opens its configured disk itself).
///
/// # Errors
/// A spec that does not parse, a binary built without the `failpoints` feature while the
/// variable is set, or a disk that cannot be opened.
pub(crate) fn disk_from_env(io: IoBackend) -> anyhow::Result<Option<Box<dyn Disk>>> {
    let Some(spec) = std::env::var_os(FAILPOINTS_ENV).filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    let spec = spec.to_string_lossy();
    arm(&spec, io).map(Some)
}

#[cfg(feature = "failpoints")]
fn arm(spec: &str, io: IoBackend) -> anyhow::Result<Box<dyn Disk>> {
    use anyhow::Context;
    use quire_wal::disk::{open_disk, FaultDisk, FaultPlan};

    let plan = FaultPlan::from_spec(spec).with_context(|| format!("parsing {FAILPOINTS_ENV}"))?;
    let (inner, _) = open_disk(io)?;
    tracing::warn!(
        spec,
        backend = inner.name(),
        "failpoints armed: this store's WAL will fail the operations {FAILPOINTS_ENV} names"
    );
    Ok(Box::new(FaultDisk::new(inner, plan)))
}

#[cfg(not(feature = "failpoints"))]
fn arm(_spec: &str, _io: IoBackend) -> anyhow::Result<Box<dyn Disk>> {
    anyhow::bail!(
        "{FAILPOINTS_ENV} is set but this quire-node was built without the `failpoints` \
         feature; unset it, or build with `cargo build -p quire-node --features failpoints`"
    )
}
