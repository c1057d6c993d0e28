//! The store's identity file: who this data directory is, created once by `quire-node init`.
//!
//! DESIGN.md "Store identity": a store that lost its disk must never vote again under its
//! old identity. Each directory gets a random `store_id` and `incarnation` from the OS at
//! init; brokers bind a slot to that pair. A store that is fenced with another expected
//! identity, or that was initialised with `--learner`, is a **learner**: the role byte
//! records it durably, so it survives restarts.
//!
//! File `identity` in the data directory, 36 bytes, little-endian:
//!
//! ```text
//!  byte 0        4     5      6       8             16              24             32       36
//!       +--------+-----+------+-------+-------------+---------------+--------------+--------+
//!       | "QSID" | ver | role | 0 0   | store_id    | incarnation   | created_ms   | crc32c |
//!       +--------+-----+------+-------+-------------+---------------+--------------+--------+
//! ```
//!
//! `ver` is 1; `role` is 1 (voter) or 2 (learner); `created_ms` is the Unix time of init,
//! in milliseconds (informational); `crc32c` covers bytes 0..32. The file is replaced
//! atomically: written to `identity.tmp`, fsynced, renamed over `identity`, and the
//! directory fsynced.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use quire_proto::{Incarnation, StoreId};

use quire_wal::small_file::{self, IoFailure};
use quire_wal::{OsStorage, Storage};

/// File name of the identity file inside a data directory.
pub const IDENTITY_FILE_NAME: &str = "identity";
const MAGIC: [u8; 4] = *b"QSID";
const VERSION: u8 = 1;
const FILE_BYTES: usize = 36;

/// Whether a store may vote (grant fences, count toward Qa).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// A full member: grants fences, its persisted acks count.
    Voter,
    /// Receives the log but never grants a fence; its acks say `voter: false`.
    Learner,
}

impl Role {
    fn as_u8(self) -> u8 {
        match self {
            Role::Voter => 1,
            Role::Learner => 2,
        }
    }

    fn from_u8(b: u8) -> Option<Role> {
        match b {
            1 => Some(Role::Voter),
            2 => Some(Role::Learner),
            _ => None,
        }
    }

    /// `true` for [`Role::Voter`].
    #[must_use]
    pub fn is_voter(self) -> bool {
        self == Role::Voter
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Voter => "voter",
            Role::Learner => "learner",
        })
    }
}

/// Why the identity file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The directory holds no identity file: it was never initialised.
    #[error(
        "{} was never initialised (no {IDENTITY_FILE_NAME} file): run `quire-node init --data-dir {}` first; if this directory held a store whose identity file was lost, wipe it and init it with --learner",
        dir.display(), dir.display()
    )]
    NotInitialised {
        /// The data directory.
        dir: PathBuf,
    },
    /// The identity file is damaged (bad size, magic, version, role or checksum).
    #[error("identity file {} is damaged: {problem}", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: &'static str,
    },
    /// A system call failed.
    #[error("{op} {}: {source}", path.display())]
    Io {
        /// What was being done.
        op: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl From<IoFailure> for IdentityError {
    fn from(f: IoFailure) -> Self {
        IdentityError::Io {
            op: f.op,
            path: f.path,
            source: f.source,
        }
    }
}

/// The identity of one store directory. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// Random, fixed at init.
    pub store_id: StoreId,
    /// Random, fixed at init: a re-initialised directory gets a new one.
    pub incarnation: Incarnation,
    /// Voter or learner.
    pub role: Role,
    /// Unix time of init, in milliseconds.
    pub created_ms: u64,
}

impl Identity {
    /// A new identity with a random `store_id` and `incarnation` from the OS
    /// (`getrandom(2)`), both non-zero.
    ///
    /// # Errors
    /// If the OS has no randomness to give.
    pub fn generate(role: Role) -> io::Result<Identity> {
        let created_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        Ok(Identity {
            store_id: StoreId(random_nonzero_u64()?),
            incarnation: Incarnation(random_nonzero_u64()?),
            role,
            created_ms,
        })
    }

    /// The file's 36 bytes.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; FILE_BYTES] {
        let mut b = [0u8; FILE_BYTES];
        b[5] = self.role.as_u8();
        b[8..16].copy_from_slice(&self.store_id.0.to_le_bytes());
        b[16..24].copy_from_slice(&self.incarnation.0.to_le_bytes());
        b[24..32].copy_from_slice(&self.created_ms.to_le_bytes());
        small_file::seal(&mut b, MAGIC, VERSION);
        b
    }

    /// Parses the file's bytes.
    ///
    /// # Errors
    /// The problem found, for [`IdentityError::Corrupt`].
    pub fn from_bytes(b: &[u8]) -> Result<Identity, &'static str> {
        let b = small_file::check::<FILE_BYTES>(b, MAGIC, VERSION)?;
        let u64_at = |at| small_file::u64_at(b, at);
        let role = Role::from_u8(b[5]).ok_or("unknown role")?;
        Ok(Identity {
            store_id: StoreId(u64_at(8)),
            incarnation: Incarnation(u64_at(16)),
            role,
            created_ms: u64_at(24),
        })
    }

    /// Loads the identity of data directory `dir`.
    ///
    /// # Errors
    /// [`IdentityError::NotInitialised`] if there is no identity file;
    /// [`IdentityError::Corrupt`]; I/O errors.
    pub fn load(dir: &Path) -> Result<Identity, IdentityError> {
        Identity::load_in(&OsStorage, dir)
    }

    /// [`Identity::load`] on `storage` (the simulator's crash-tracking disk).
    ///
    /// # Errors
    /// As [`Identity::load`].
    pub fn load_in<S: Storage>(storage: &S, dir: &Path) -> Result<Identity, IdentityError> {
        let Some(bytes) = small_file::read_in(storage, dir, IDENTITY_FILE_NAME)? else {
            return Err(IdentityError::NotInitialised {
                dir: dir.to_path_buf(),
            });
        };
        Identity::from_bytes(&bytes).map_err(|problem| IdentityError::Corrupt {
            path: dir.join(IDENTITY_FILE_NAME),
            problem,
        })
    }

    /// Writes this identity as `dir`'s identity file, durably (temp file, fsync, rename,
    /// fsync of the directory). When it returns `Ok`, the file survives a crash.
    ///
    /// # Errors
    /// I/O errors (the old file, if any, is then unchanged).
    pub fn store(&self, dir: &Path) -> Result<(), IdentityError> {
        self.store_in(&OsStorage, dir)
    }

    /// [`Identity::store`] on `storage`.
    ///
    /// # Errors
    /// As [`Identity::store`].
    pub fn store_in<S: Storage>(&self, storage: &S, dir: &Path) -> Result<(), IdentityError> {
        Ok(small_file::replace_in(
            storage,
            dir,
            IDENTITY_FILE_NAME,
            &self.to_bytes(),
        )?)
    }
}

/// fsyncs a directory, so that a rename or a new entry in it is durable.
///
/// # Errors
/// I/O errors.
pub fn fsync_dir(dir: &Path) -> Result<(), IdentityError> {
    Ok(small_file::fsync_dir(dir)?)
}

fn random_nonzero_u64() -> io::Result<u64> {
    loop {
        let mut b = [0u8; 8];
        let mut filled = 0;
        while filled < b.len() {
            let rest = &mut b[filled..];
            // SAFETY: `rest` is a valid, writable buffer of `rest.len()` bytes for the
            // duration of the call; getrandom writes at most that many bytes into it.
            let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            filled += usize::try_from(n).expect("invariant: n >= 0 here");
        }
        let v = u64::from_le_bytes(b);
        if v != 0 {
            return Ok(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    #[test]
    fn round_trips_and_survives_reload() {
        let dir = tempfile::tempdir().unwrap();
        let id = Identity::generate(Role::Voter).unwrap();
        assert_ne!(id.store_id.0, 0);
        assert_ne!(id.incarnation.0, 0);
        id.store(dir.path()).unwrap();
        assert_eq!(Identity::load(dir.path()).unwrap(), id);
        let learner = Identity {
            role: Role::Learner,
            ..id
        };
        learner.store(dir.path()).unwrap();
        assert_eq!(Identity::load(dir.path()).unwrap().role, Role::Learner);
        assert!(!dir.path().join("identity.tmp").exists());
    }

    #[test]
    fn two_identities_differ() {
        let a = Identity::generate(Role::Voter).unwrap();
        let b = Identity::generate(Role::Voter).unwrap();
        assert_ne!((a.store_id, a.incarnation), (b.store_id, b.incarnation));
    }

    #[test]
    fn missing_and_damaged_files_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let err = Identity::load(dir.path()).unwrap_err();
        assert!(matches!(err, IdentityError::NotInitialised { .. }));
        assert!(err.to_string().contains("quire-node init"), "{err}");

        Identity::generate(Role::Voter)
            .unwrap()
            .store(dir.path())
            .unwrap();
        let path = dir.path().join(IDENTITY_FILE_NAME);
        let good = fs::read(&path).unwrap();
        for i in 0..FILE_BYTES {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            fs::write(&path, &bad).unwrap();
            assert!(
                matches!(
                    Identity::load(dir.path()),
                    Err(IdentityError::Corrupt { .. })
                ),
                "flipped byte {i}"
            );
        }
        fs::write(&path, &good[..20]).unwrap();
        assert!(matches!(
            Identity::load(dir.path()),
            Err(IdentityError::Corrupt {
                problem: "wrong size",
                ..
            })
        ));
    }
}
