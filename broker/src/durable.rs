//! The broker's small durable state in its data directory.
//!
//! ```text
//! DIR/lock        flock()ed while a broker runs on DIR: two brokers never share a directory
//! DIR/epoch       the epoch counter: `counter = N` (the highest counter this broker used)
//! DIR/cluster     TOML: the store list, broker list and ack quorum the directory was made
//!                 for (checked at every start), and the store identities once bound
//! ```
//!
//! Every write is durable before the call returns: write a temporary file, fsync it, rename
//! it over the old one, fsync the directory. These calls block: the server runs them on a
//! blocking thread (`tokio::task::spawn_blocking`), never on the async data path.
//!
//! The epoch counter is persisted *before* any fence with the epoch it makes goes out
//! (DESIGN.md "Failover" step 2: a broker that restarts and reuses an epoch can overwrite
//! acknowledged events). It never goes down: [`store_epoch_counter`] refuses a lower value.
//! A damaged epoch file is an error, never read as 0.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use quire_proto::{BrokerId, Incarnation, StoreId};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::core::StoreIdentity;

/// Name of the epoch counter file.
pub const EPOCH_FILE_NAME: &str = "epoch";
/// Name of the cluster file.
pub const CLUSTER_FILE_NAME: &str = "cluster";
/// Name of the lock file.
pub const LOCK_FILE_NAME: &str = "lock";
/// Format version written in the cluster file.
pub const CLUSTER_FILE_FORMAT: u32 = 1;
/// Largest epoch or cluster file read, in bytes.
pub const STATE_FILE_BYTES_MAX: u64 = 1 << 20;

/// What can go wrong with the data directory.
#[derive(Debug, Error)]
pub enum DurableError {
    /// A file operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file.
        path: PathBuf,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A file's contents cannot be trusted.
    #[error("{path} is damaged: {why}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// The directory was made for another cluster.
    #[error("{path} was created for another cluster: {what} was {recorded}, now {given}. A broker's data directory belongs to one cluster; use the original settings or a new directory")]
    ClusterMismatch {
        /// The cluster file.
        path: PathBuf,
        /// Which setting differs.
        what: &'static str,
        /// What the file records.
        recorded: String,
        /// What this start was given.
        given: String,
    },
    /// Another process holds the directory.
    #[error("{path} is in use by another broker (lock held)")]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A counter would go down.
    #[error("epoch counter would go down from {current} to {new}")]
    CounterDown {
        /// The durable counter.
        current: u64,
        /// The refused one.
        new: u64,
    },
}

fn io<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> DurableError + 'a {
    move |source| DurableError::Io {
        op,
        path: path.to_owned(),
        source,
    }
}

/// Holds the data directory's lock for as long as it lives.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

/// Creates `dir` if needed and takes its lock (`flock(LOCK_EX | LOCK_NB)`).
///
/// # Errors
/// [`DurableError::Locked`] if another process holds it; I/O errors.
pub fn lock_dir(dir: &Path) -> Result<DirLock, DurableError> {
    fs::create_dir_all(dir).map_err(io("creating", dir))?;
    let path = dir.join(LOCK_FILE_NAME);
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(io("opening", &path))?;
    // SAFETY: flock on a file descriptor this function owns (kept open in the result).
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        return Err(DurableError::Locked { path });
    }
    Ok(DirLock { _file: file })
}

/// Writes `contents` to `dir/name` durably: temp file, fsync, rename, fsync the directory.
///
/// # Errors
/// I/O errors, each naming the file.
pub fn write_durably(dir: &Path, name: &str, contents: &[u8]) -> Result<(), DurableError> {
    let path = dir.join(name);
    let tmp = dir.join(format!("{name}.tmp"));
    {
        let mut f = File::create(&tmp).map_err(io("creating", &tmp))?;
        f.write_all(contents).map_err(io("writing", &tmp))?;
        f.sync_all().map_err(io("fsyncing", &tmp))?;
    }
    fs::rename(&tmp, &path).map_err(io("renaming", &path))?;
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io("fsyncing the directory of", &path))?;
    Ok(())
}

fn read_small(path: &Path) -> Result<Option<String>, DurableError> {
    let meta = match fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io("reading", path)(e)),
    };
    if meta.len() > STATE_FILE_BYTES_MAX {
        return Err(DurableError::Corrupt {
            path: path.to_owned(),
            why: format!(
                "{} bytes, at most {STATE_FILE_BYTES_MAX} expected",
                meta.len()
            ),
        });
    }
    let text = fs::read_to_string(path).map_err(io("reading", path))?;
    Ok(Some(text))
}

/// The durable epoch counter: 0 if the file does not exist (a new broker).
///
/// # Errors
/// [`DurableError::Corrupt`] if the file does not hold exactly `counter = N`; I/O errors.
pub fn load_epoch_counter(dir: &Path) -> Result<u64, DurableError> {
    let path = dir.join(EPOCH_FILE_NAME);
    let Some(text) = read_small(&path)? else {
        return Ok(0);
    };
    let corrupt = |why: &str| DurableError::Corrupt {
        path: path.clone(),
        why: why.to_owned(),
    };
    let line = text.trim_end_matches('\n');
    let value = line
        .strip_prefix("counter = ")
        .ok_or_else(|| corrupt("expected `counter = N`"))?;
    if line.contains('\n') {
        return Err(corrupt("more than one line"));
    }
    value
        .parse::<u64>()
        .map_err(|_| corrupt("the counter is not a number"))
}

/// Makes `counter` the durable epoch counter. Refuses to go down (an equal value is
/// rewritten, harmlessly).
///
/// # Errors
/// [`DurableError::CounterDown`], or the errors of [`load_epoch_counter`] and
/// [`write_durably`].
pub fn store_epoch_counter(dir: &Path, counter: u64) -> Result<(), DurableError> {
    let current = load_epoch_counter(dir)?;
    if counter < current {
        return Err(DurableError::CounterDown {
            current,
            new: counter,
        });
    }
    write_durably(
        dir,
        EPOCH_FILE_NAME,
        format!("counter = {counter}\n").as_bytes(),
    )
}

/// One broker of the cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerEntry {
    /// The broker's id.
    pub id: u16,
    /// Its address (`host:port`), as clients and brokers reach it.
    pub addr: String,
}

/// A bound store identity, by position in the store list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityEntry {
    /// Position in the store list.
    pub store: u16,
    /// The store's id.
    pub store_id: u64,
    /// The store's incarnation.
    pub incarnation: u64,
}

/// The cluster file: what the directory was made for, and the identities bound since.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterFile {
    /// [`CLUSTER_FILE_FORMAT`].
    pub format: u32,
    /// Store addresses, in slot order.
    pub stores: Vec<String>,
    /// Brokers, in the order given.
    pub brokers: Vec<BrokerEntry>,
    /// Qa.
    pub ack_quorum: usize,
    /// Identities bound so far.
    #[serde(default)]
    pub identities: Vec<IdentityEntry>,
}

impl ClusterFile {
    /// A cluster file for these settings, no identity bound.
    #[must_use]
    pub fn new(
        stores: &[String],
        brokers: &[(BrokerId, String)],
        ack_quorum: usize,
    ) -> ClusterFile {
        ClusterFile {
            format: CLUSTER_FILE_FORMAT,
            stores: stores.to_vec(),
            brokers: brokers
                .iter()
                .map(|(id, addr)| BrokerEntry {
                    id: id.0,
                    addr: addr.clone(),
                })
                .collect(),
            ack_quorum,
            identities: Vec::new(),
        }
    }

    /// The identity bound to each store slot (`None`: not bound), `stores.len()` entries.
    #[must_use]
    pub fn identities_by_slot(&self) -> Vec<Option<StoreIdentity>> {
        let mut out = vec![None; self.stores.len()];
        for e in &self.identities {
            if let Some(slot) = out.get_mut(usize::from(e.store)) {
                *slot = Some(StoreIdentity {
                    store_id: StoreId(e.store_id),
                    incarnation: Incarnation(e.incarnation),
                });
            }
        }
        out
    }

    /// Records the identities bound to slots (replacing the list).
    pub fn set_identities(&mut self, by_slot: &[Option<StoreIdentity>]) {
        self.identities = by_slot
            .iter()
            .enumerate()
            .filter_map(|(i, id)| {
                let id = (*id)?;
                Some(IdentityEntry {
                    store: u16::try_from(i).ok()?,
                    store_id: id.store_id.0,
                    incarnation: id.incarnation.0,
                })
            })
            .collect();
    }
}

/// Loads the cluster file if it exists and checks it against `given` (stores, brokers,
/// ack quorum); creates it (durably) from `given` if it does not. Returns the file as it
/// is on disk (with the identities bound so far).
///
/// # Errors
/// A store list that only grew at its end, with majority quorums before and after, is no
/// mismatch: the file takes the longer list (the new stores are learners until a voter-set
/// change names them).
///
/// [`DurableError::ClusterMismatch`] naming the first setting that differs;
/// [`DurableError::Corrupt`] for a file that does not parse or names a slot outside the
/// store list; I/O errors.
pub fn load_or_create_cluster(
    dir: &Path,
    given: &ClusterFile,
) -> Result<ClusterFile, DurableError> {
    let path = dir.join(CLUSTER_FILE_NAME);
    let Some(text) = read_small(&path)? else {
        store_cluster(dir, given)?;
        return Ok(given.clone());
    };
    let recorded: ClusterFile = toml::from_str(&text).map_err(|e| DurableError::Corrupt {
        path: path.clone(),
        why: e.to_string(),
    })?;
    if recorded.format != CLUSTER_FILE_FORMAT {
        return Err(DurableError::Corrupt {
            path,
            why: format!(
                "format {} (this build reads {CLUSTER_FILE_FORMAT})",
                recorded.format
            ),
        });
    }
    let mismatch = |what, recorded: String, given: String| DurableError::ClusterMismatch {
        path: path.clone(),
        what,
        recorded,
        given,
    };
    // A store list that grew at its end (stores that join as learners, then voters through
    // `quire cluster add-store`) is taken, with the majority quorum of the longer list.
    let majority = |n: usize| n / 2 + 1;
    let grown = given.stores.len() > recorded.stores.len()
        && given.stores.starts_with(&recorded.stores)
        && recorded.ack_quorum == majority(recorded.stores.len())
        && given.ack_quorum == majority(given.stores.len());
    if grown && recorded.brokers == given.brokers {
        let mut updated = given.clone();
        updated.identities.clone_from(&recorded.identities);
        store_cluster(dir, &updated)?;
        return Ok(updated);
    }
    if recorded.stores != given.stores {
        return Err(mismatch(
            "the store list",
            recorded.stores.join(","),
            given.stores.join(","),
        ));
    }
    if recorded.brokers != given.brokers {
        let show = |b: &[BrokerEntry]| {
            b.iter()
                .map(|e| format!("{}={}", e.id, e.addr))
                .collect::<Vec<_>>()
                .join(",")
        };
        return Err(mismatch(
            "the broker list",
            show(&recorded.brokers),
            show(&given.brokers),
        ));
    }
    if recorded.ack_quorum != given.ack_quorum {
        return Err(mismatch(
            "the ack quorum",
            recorded.ack_quorum.to_string(),
            given.ack_quorum.to_string(),
        ));
    }
    if let Some(bad) = recorded
        .identities
        .iter()
        .find(|e| usize::from(e.store) >= recorded.stores.len())
    {
        return Err(DurableError::Corrupt {
            path,
            why: format!(
                "an identity names store {} of {}",
                bad.store,
                recorded.stores.len()
            ),
        });
    }
    Ok(recorded)
}

/// Writes the cluster file durably.
///
/// # Errors
/// I/O errors.
pub fn store_cluster(dir: &Path, file: &ClusterFile) -> Result<(), DurableError> {
    let text = toml::to_string(file).map_err(|e| DurableError::Corrupt {
        path: dir.join(CLUSTER_FILE_NAME),
        why: format!("cannot encode: {e}"),
    })?;
    write_durably(dir, CLUSTER_FILE_NAME, text.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn given() -> ClusterFile {
        ClusterFile::new(
            &[
                "127.0.0.1:1".into(),
                "127.0.0.1:2".into(),
                "127.0.0.1:3".into(),
            ],
            &[
                (BrokerId(1), "127.0.0.1:11".into()),
                (BrokerId(2), "127.0.0.1:12".into()),
            ],
            2,
        )
    }

    #[test]
    fn epoch_counter_is_zero_then_durable_and_never_goes_down() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert_eq!(load_epoch_counter(dir.path()).expect("loads"), 0);
        store_epoch_counter(dir.path(), 3).expect("stores");
        assert_eq!(load_epoch_counter(dir.path()).expect("loads"), 3);
        store_epoch_counter(dir.path(), 3).expect("equal is fine");
        store_epoch_counter(dir.path(), 7).expect("stores");
        assert!(matches!(
            store_epoch_counter(dir.path(), 6),
            Err(DurableError::CounterDown { current: 7, new: 6 })
        ));
        assert_eq!(load_epoch_counter(dir.path()).expect("loads"), 7);
        assert!(
            !dir.path().join("epoch.tmp").exists(),
            "the temp file was renamed"
        );
    }

    #[test]
    fn a_damaged_epoch_file_is_an_error_never_zero() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in [
            "",
            "counter = x\n",
            "epoch = 3\n",
            "counter = 3\ncounter = 4\n",
        ] {
            fs::write(dir.path().join(EPOCH_FILE_NAME), bad).expect("writes");
            assert!(
                matches!(
                    load_epoch_counter(dir.path()),
                    Err(DurableError::Corrupt { .. })
                ),
                "{bad:?}"
            );
            assert!(store_epoch_counter(dir.path(), 9).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cluster_file_is_created_then_checked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let g = given();
        assert_eq!(load_or_create_cluster(dir.path(), &g).expect("creates"), g);
        assert_eq!(load_or_create_cluster(dir.path(), &g).expect("matches"), g);

        let mut other = g.clone();
        other.stores.pop();
        let err = load_or_create_cluster(dir.path(), &other).expect_err("mismatch");
        assert!(
            matches!(
                err,
                DurableError::ClusterMismatch {
                    what: "the store list",
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("127.0.0.1:3"), "{err}");
        let mut other = g.clone();
        other.ack_quorum = 3;
        assert!(matches!(
            load_or_create_cluster(dir.path(), &other),
            Err(DurableError::ClusterMismatch {
                what: "the ack quorum",
                ..
            })
        ));
        let mut other = g.clone();
        other.brokers[1].addr = "127.0.0.1:99".into();
        assert!(matches!(
            load_or_create_cluster(dir.path(), &other),
            Err(DurableError::ClusterMismatch {
                what: "the broker list",
                ..
            })
        ));
    }

    #[test]
    fn a_store_list_grown_at_its_end_is_taken_with_the_identities() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut f = load_or_create_cluster(dir.path(), &given()).expect("creates");
        let bound = Some(StoreIdentity {
            store_id: StoreId(7),
            incarnation: Incarnation(1),
        });
        f.set_identities(&[bound, bound, bound]);
        store_cluster(dir.path(), &f).expect("stores");
        let mut longer = given();
        longer.stores.push("127.0.0.1:4".into());
        longer.stores.push("127.0.0.1:5".into());
        longer.ack_quorum = 3;
        let taken = load_or_create_cluster(dir.path(), &longer).expect("grown");
        assert_eq!(taken.stores.len(), 5);
        assert_eq!(
            taken.identities_by_slot(),
            vec![bound, bound, bound, None, None]
        );
        assert_eq!(
            load_or_create_cluster(dir.path(), &longer).expect("recorded"),
            taken
        );
        // Reordered, or with a flexible quorum: still a mismatch.
        let mut reordered = longer.clone();
        reordered.stores.swap(0, 4);
        assert!(load_or_create_cluster(dir.path(), &reordered).is_err());
    }

    #[test]
    fn identities_survive_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut f = load_or_create_cluster(dir.path(), &given()).expect("creates");
        assert_eq!(f.identities_by_slot(), vec![None, None, None]);
        let id = |s, i| {
            Some(StoreIdentity {
                store_id: StoreId(s),
                incarnation: Incarnation(i),
            })
        };
        f.set_identities(&[id(10, 1), None, id(30, 3)]);
        store_cluster(dir.path(), &f).expect("stores");
        let again = load_or_create_cluster(dir.path(), &given()).expect("matches");
        assert_eq!(again.identities_by_slot(), vec![id(10, 1), None, id(30, 3)]);
    }

    #[test]
    fn a_directory_is_locked_by_one_broker() {
        let dir = tempfile::tempdir().expect("tempdir");
        let held = lock_dir(dir.path()).expect("first lock");
        assert!(matches!(
            lock_dir(dir.path()),
            Err(DurableError::Locked { .. })
        ));
        drop(held);
        lock_dir(dir.path()).expect("free again");
    }
}
