//! Where a client command's connection settings come from, and which source wins.
//!
//! For each setting, the first of these that gives it:
//! 1. the command-line flag (`--brokers`/`-b`, `--connect-timeout`);
//! 2. the `QUIRE_*` environment variable ([`BROKERS_ENV`], [`CONNECT_TIMEOUT_ENV`]);
//! 3. the profile chosen by `--profile NAME`, else [`PROFILE_ENV`], else the profiles
//!    file's `current` (see [`crate::profile`]);
//! 4. the built-in default (none for the brokers: a command that needs them and finds none
//!    fails saying where it looked).
//!
//! Each setting is resolved on its own: `quire produce -b h:1` still takes the chosen
//! profile's connect timeout. A profile named by `--profile` or `QUIRE_PROFILE` must
//! exist, even when every setting it could give came from elsewhere.
//!
//! Two more variables are read by clap itself, as the default of a flag: [`FORMAT_ENV`]
//! (`--format` of every command that has one) and [`TOPIC_ENV`] (`--topic` of produce and
//! consume). [`CONFIG_DIR_ENV`] moves the profiles file.
//!
//! The servers' variables (`QUIRE_NODE_*`, `QUIRE_BROKER_*`) and the test harness's
//! (`QUIRE_TEST_*`, `QUIRE_FAILPOINTS`) are not the client's and are ignored here. Any other
//! `QUIRE_*` variable close to a client variable's name (`QUIRE_BROKRS`) is an error naming
//! both ([`check_variables`]), so a typo never silently sends traffic to the profile's
//! cluster instead.

use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};

use crate::profile::{self, ProfileStore, ProfilesFile};
use crate::units::parse_duration;

/// Broker addresses, comma separated: the default of `--brokers`.
pub const BROKERS_ENV: &str = "QUIRE_BROKERS";
/// The profile to use: the default of `--profile`.
pub const PROFILE_ENV: &str = "QUIRE_PROFILE";
/// The default of `--connect-timeout` (a duration: `30s`, `500ms`).
pub const CONNECT_TIMEOUT_ENV: &str = "QUIRE_CONNECT_TIMEOUT";
/// The default of `--format` (`text`, `json`, `jsonl`).
pub const FORMAT_ENV: &str = "QUIRE_FORMAT";
/// The default of `--topic` of `quire produce` and `quire consume`.
pub const TOPIC_ENV: &str = "QUIRE_TOPIC";
/// The directory holding `profiles.toml` (see [`crate::profile::config_dir`]).
pub const CONFIG_DIR_ENV: &str = "QUIRE_CONFIG_DIR";

/// The default of `--tls-ca` (clap reads it: crate::cluster::BrokersArgs).
pub const TLS_CA_ENV: &str = "QUIRE_TLS_CA";
/// The default of `--tls-cert`.
pub const TLS_CERT_ENV: &str = "QUIRE_TLS_CERT";
/// The default of `--tls-key`.
pub const TLS_KEY_ENV: &str = "QUIRE_TLS_KEY";

/// The default of `--user`.
pub const USER_ENV: &str = "QUIRE_USER";
/// `--user`'s password (or give --password-file).
pub const PASSWORD_ENV: &str = "QUIRE_PASSWORD";
/// The default of `--password-file`.
pub const PASSWORD_FILE_ENV: &str = "QUIRE_PASSWORD_FILE";

/// Every variable the client reads.
pub const CLIENT_VARIABLES: [&str; 14] = [
    BROKERS_ENV,
    PROFILE_ENV,
    CONNECT_TIMEOUT_ENV,
    FORMAT_ENV,
    TOPIC_ENV,
    CONFIG_DIR_ENV,
    TLS_CA_ENV,
    TLS_CERT_ENV,
    TLS_KEY_ENV,
    USER_ENV,
    PASSWORD_ENV,
    PASSWORD_FILE_ENV,
    crate::access::NEW_PASSWORD_ENV,
    crate::access::NEW_PASSWORD_FILE_ENV,
];

/// Prefixes and names of `QUIRE_*` variables that belong to others (the servers, the test
/// harness) and are never taken for typos.
pub const FOREIGN_VARIABLES: [&str; 4] = [
    "QUIRE_NODE_",
    "QUIRE_BROKER_",
    "QUIRE_TEST_",
    "QUIRE_FAILPOINTS",
];

/// Most edits (insert, delete, replace, swap two neighbours) between an unknown `QUIRE_*`
/// name and a client one for it to count as a typo.
pub const TYPO_EDITS_MAX: usize = 2;

/// The connect timeout when no source gives one.
pub const CONNECT_TIMEOUT_DEFAULT: Duration = Duration::from_secs(30);

/// A snapshot of the process environment (or, in tests, any set of variables).
#[derive(Debug, Clone, Default)]
pub struct Env {
    vars: Vec<(OsString, OsString)>,
}

impl Env {
    /// The current process's environment.
    #[must_use]
    pub fn from_process() -> Env {
        Env {
            vars: std::env::vars_os().collect(),
        }
    }

    /// An environment of exactly these variables.
    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Env {
        Env {
            vars: pairs
                .into_iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                .collect(),
        }
    }

    /// The value of `name`, `None` when unset or empty.
    #[must_use]
    pub fn os(&self, name: &str) -> Option<&OsStr> {
        self.vars
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_os_str())
            .filter(|v| !v.is_empty())
    }

    /// The value of `name` as text, `None` when unset or empty.
    ///
    /// # Errors
    /// It is set to bytes that are not UTF-8.
    pub fn text(&self, name: &str) -> anyhow::Result<Option<&str>> {
        match self.os(name) {
            None => Ok(None),
            Some(v) => match v.to_str() {
                Some(s) => Ok(Some(s)),
                None => bail!("{name} is not UTF-8 text"),
            },
        }
    }

    /// The value of `name` as a path, `None` when unset or empty.
    #[must_use]
    pub fn path(&self, name: &str) -> Option<PathBuf> {
        self.os(name).map(PathBuf::from)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.vars.iter().filter_map(|(k, _)| k.to_str())
    }
}

/// Fails on a `QUIRE_*` variable that is not one the client reads, belongs to no one else
/// ([`FOREIGN_VARIABLES`]) and is within [`TYPO_EDITS_MAX`] edits of a client variable's
/// name (case ignored).
///
/// # Errors
/// Such a variable: the message names it and the accepted name.
pub fn check_variables(env: &Env) -> anyhow::Result<()> {
    for name in env.names() {
        let upper = name.to_ascii_uppercase();
        if !upper.starts_with("QUIRE_")
            || CLIENT_VARIABLES.contains(&name)
            || FOREIGN_VARIABLES.iter().any(|f| upper.starts_with(f))
        {
            continue;
        }
        let closest = CLIENT_VARIABLES
            .iter()
            .map(|known| (edits(&upper, known), *known))
            .min();
        if let Some((n, known)) = closest {
            if n <= TYPO_EDITS_MAX {
                bail!(
                    "environment variable {name} is not one quire reads: did you mean {known}? \
                     (client variables: {})",
                    CLIENT_VARIABLES.join(", ")
                );
            }
        }
    }
    Ok(())
}

/// Optimal-string-alignment distance: insertions, deletions, substitutions and swaps of
/// two neighbouring characters, each one edit.
fn edits(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut v = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                v = v.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = v;
        }
    }
    d[a.len()][b.len()]
}

/// Addresses trimmed, empty entries dropped.
#[must_use]
pub fn clean_addrs(addrs: &[String]) -> Vec<String> {
    addrs
        .iter()
        .map(|b| b.trim().to_owned())
        .filter(|b| !b.is_empty())
        .collect()
}

/// The profile named explicitly: `flag` (`--profile`), else [`PROFILE_ENV`]; with what
/// named it. `None` when neither does (the file's `current` then applies).
///
/// # Errors
/// `QUIRE_PROFILE` is not UTF-8.
pub fn chosen_profile(
    flag: Option<&str>,
    env: &Env,
) -> anyhow::Result<Option<(String, &'static str)>> {
    if let Some(name) = flag.filter(|n| !n.is_empty()) {
        return Ok(Some((name.to_owned(), "--profile")));
    }
    Ok(env
        .text(PROFILE_ENV)?
        .map(|name| (name.to_owned(), PROFILE_ENV)))
}

/// Where a resolved setting came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// The command line.
    Flag,
    /// This environment variable.
    Env(&'static str),
    /// This profile (name) in this file.
    Profile(String, PathBuf),
    /// The built-in default.
    Default,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Flag => f.write_str("the command line"),
            Source::Env(name) => f.write_str(name),
            Source::Profile(name, file) => write!(f, "profile {name} in {}", file.display()),
            Source::Default => f.write_str("the default"),
        }
    }
}

/// What the command line gave for the connection settings.
#[derive(Debug, Clone, Default)]
pub struct Flags<'a> {
    /// `--brokers` (maybe empty).
    pub brokers: &'a [String],
    /// `--profile`.
    pub profile: Option<&'a str>,
    /// `--connect-timeout`, for commands that have it.
    pub connect_timeout: Option<Duration>,
    /// Whether the command has `--connect-timeout` (if not, the profile is not read for it).
    pub wants_connect_timeout: bool,
}

/// A command's connection settings and where each came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSettings {
    /// Broker addresses, never empty.
    pub brokers: Vec<String>,
    /// Where they came from.
    pub brokers_from: Source,
    /// How long to look for the master.
    pub connect_timeout: Duration,
    /// Where it came from.
    pub connect_timeout_from: Source,
}

/// The profile a command uses, once read.
enum Chosen {
    /// No configuration directory at all.
    NoDir,
    /// The file and, if one was chosen, the profile's name (present in the file).
    File {
        store: ProfileStore,
        file: ProfilesFile,
        name: Option<String>,
    },
}

impl Chosen {
    fn profile(&self) -> Option<(&str, &profile::Profile, &ProfileStore)> {
        match self {
            Chosen::NoDir => None,
            Chosen::File { store, file, name } => name
                .as_deref()
                .and_then(|n| file.profiles.get(n).map(|p| (n, p, store))),
        }
    }

    fn source(&self) -> Source {
        match self.profile() {
            Some((name, _, store)) => Source::Profile(name.to_owned(), store.path().to_owned()),
            None => Source::Default,
        }
    }
}

/// Reads the profiles file and picks the profile `explicit` (from [`chosen_profile`]) names,
/// else the file's current one.
fn choose(explicit: Option<(String, &'static str)>, env: &Env) -> anyhow::Result<Chosen> {
    let Some(dir) = profile::config_dir(env) else {
        if let Some((name, how)) = explicit {
            bail!(
                "profile {name:?} (chosen by {how}) cannot be read: no configuration \
                 directory ({CONFIG_DIR_ENV}, XDG_CONFIG_HOME and HOME are all unset)"
            );
        }
        return Ok(Chosen::NoDir);
    };
    let store = ProfileStore::in_dir(&dir);
    let file = store.load()?;
    let name = match explicit {
        Some((name, how)) => {
            if !file.profiles.contains_key(&name) {
                bail!(
                    "{} (chosen by {how})",
                    profile::not_found(&name, &store.path().display().to_string(), &file)
                );
            }
            Some(name)
        }
        None => file.current.clone(),
    };
    Ok(Chosen::File { store, file, name })
}

/// Resolves a client command's connection settings (see the module docs for the order).
/// The profiles file is read only when a setting is still missing after the flags and
/// variables, or when a profile is named explicitly.
///
/// # Errors
/// No broker addresses anywhere (the message says where it looked); a variable that is
/// not UTF-8 or not a duration; a profile named explicitly that does not exist; an
/// unreadable or corrupt profiles file.
pub fn resolve(flags: &Flags<'_>, env: &Env) -> anyhow::Result<ClientSettings> {
    let flag_brokers = clean_addrs(flags.brokers);
    let env_brokers = env
        .text(BROKERS_ENV)?
        .map(|v| clean_addrs(&v.split(',').map(str::to_owned).collect::<Vec<_>>()))
        .filter(|v| !v.is_empty());
    let env_timeout = env
        .text(CONNECT_TIMEOUT_ENV)?
        .map(|v| {
            parse_duration(v)
                .with_context(|| format!("{CONNECT_TIMEOUT_ENV}={v:?} is not a duration"))
        })
        .transpose()?;
    let explicit = chosen_profile(flags.profile, env)?;

    let brokers_known = !flag_brokers.is_empty() || env_brokers.is_some();
    let timeout_known =
        !flags.wants_connect_timeout || flags.connect_timeout.is_some() || env_timeout.is_some();
    let chosen = if explicit.is_some() || !brokers_known || !timeout_known {
        Some(choose(explicit, env)?)
    } else {
        None
    };
    let from_profile = chosen.as_ref().and_then(Chosen::profile);

    let (brokers, brokers_from) = if !flag_brokers.is_empty() {
        (flag_brokers, Source::Flag)
    } else if let Some(b) = env_brokers {
        (b, Source::Env(BROKERS_ENV))
    } else {
        match from_profile.map(|(_, p, _)| clean_addrs(&p.brokers)) {
            Some(b) if !b.is_empty() => {
                (b, chosen.as_ref().map_or(Source::Default, Chosen::source))
            }
            _ => bail!("{}", no_brokers(chosen.as_ref())),
        }
    };
    let (connect_timeout, connect_timeout_from) = if let Some(t) = flags.connect_timeout {
        (t, Source::Flag)
    } else if let Some(t) = env_timeout {
        (t, Source::Env(CONNECT_TIMEOUT_ENV))
    } else {
        match from_profile.and_then(|(_, p, _)| p.connect_timeout) {
            Some(t) => (t, chosen.as_ref().map_or(Source::Default, Chosen::source)),
            None => (CONNECT_TIMEOUT_DEFAULT, Source::Default),
        }
    };
    Ok(ClientSettings {
        brokers,
        brokers_from,
        connect_timeout,
        connect_timeout_from,
    })
}

/// "no broker addresses: ..." naming every place looked at.
fn no_brokers(chosen: Option<&Chosen>) -> String {
    let profile = match chosen {
        None | Some(Chosen::NoDir) => format!(
            "no profiles file (no configuration directory: {CONFIG_DIR_ENV}, XDG_CONFIG_HOME \
             and HOME are unset)"
        ),
        Some(Chosen::File { store, file, name }) => {
            let path = store.path().display();
            match name {
                Some(name) => format!("profile {name} in {path} has no brokers"),
                None if !store.path().exists() => format!("{path} does not exist"),
                None if file.profiles.is_empty() => format!("{path} holds no profile"),
                None => format!(
                    "no profile is current in {path} and {PROFILE_ENV} is not set \
                     (`quire profile use NAME` picks one)"
                ),
            }
        }
    };
    format!(
        "no broker addresses: none given with --brokers/-b, {BROKERS_ENV} is not set, and \
         {profile}; give --brokers ADDR,... or create a profile (`quire profile create NAME \
         --brokers ADDR,...`)"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::profile::Profile;

    /// An environment whose profiles file is in `dir`, plus `pairs`.
    fn env(dir: &std::path::Path, pairs: &[(&str, &str)]) -> Env {
        let mut all = vec![(CONFIG_DIR_ENV, dir.to_str().unwrap())];
        all.extend_from_slice(pairs);
        Env::from_pairs(all)
    }

    fn write_profiles(dir: &std::path::Path, current: Option<&str>, profiles: &[(&str, &str)]) {
        let mut file = ProfilesFile {
            current: current.map(str::to_owned),
            ..ProfilesFile::default()
        };
        for (name, broker) in profiles {
            file.profiles.insert(
                (*name).to_owned(),
                Profile {
                    brokers: vec![(*broker).to_owned()],
                    connect_timeout: Some(Duration::from_secs(7)),
                },
            );
        }
        ProfileStore::in_dir(dir).save(&file).unwrap();
    }

    fn flags<'a>(brokers: &'a [String], profile: Option<&'a str>) -> Flags<'a> {
        Flags {
            brokers,
            profile,
            connect_timeout: None,
            wants_connect_timeout: true,
        }
    }

    #[test]
    fn a_flag_beats_the_variable_which_beats_the_profile() {
        let dir = tempfile::tempdir().unwrap();
        write_profiles(dir.path(), Some("p"), &[("p", "prof:1")]);
        let flag = vec!["flag:1".to_owned()];
        let with_env = env(dir.path(), &[(BROKERS_ENV, "env:1, env:2")]);
        let without = env(dir.path(), &[]);

        let s = resolve(&flags(&flag, None), &with_env).unwrap();
        assert_eq!((s.brokers, s.brokers_from), (flag.clone(), Source::Flag));
        let s = resolve(&flags(&[], None), &with_env).unwrap();
        assert_eq!(s.brokers, vec!["env:1", "env:2"]);
        assert_eq!(s.brokers_from, Source::Env(BROKERS_ENV));
        let s = resolve(&flags(&[], None), &without).unwrap();
        assert_eq!(s.brokers, vec!["prof:1"]);
        assert_eq!(
            s.brokers_from,
            Source::Profile("p".into(), dir.path().join("profiles.toml"))
        );
        // Each setting on its own: the flag's brokers, the profile's timeout.
        let s = resolve(&flags(&flag, None), &without).unwrap();
        assert_eq!(s.brokers_from, Source::Flag);
        assert_eq!(s.connect_timeout, Duration::from_secs(7));
    }

    #[test]
    fn the_connect_timeout_follows_the_same_order_down_to_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let b = vec!["h:1".to_owned()];
        let mut f = flags(&b, None);
        let e = env(dir.path(), &[(CONNECT_TIMEOUT_ENV, "250ms")]);
        assert_eq!(
            resolve(&f, &e).unwrap().connect_timeout,
            Duration::from_millis(250)
        );
        f.connect_timeout = Some(Duration::from_secs(1));
        let s = resolve(&f, &e).unwrap();
        assert_eq!(
            (s.connect_timeout, s.connect_timeout_from),
            (Duration::from_secs(1), Source::Flag)
        );
        f.connect_timeout = None;
        let s = resolve(&f, &env(dir.path(), &[])).unwrap();
        assert_eq!(s.connect_timeout, CONNECT_TIMEOUT_DEFAULT);
        assert_eq!(s.connect_timeout_from, Source::Default);
        let err = resolve(&f, &env(dir.path(), &[(CONNECT_TIMEOUT_ENV, "soon")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("QUIRE_CONNECT_TIMEOUT=\"soon\""), "{err}");
    }

    #[test]
    fn the_profile_flag_beats_quire_profile_which_beats_current() {
        let dir = tempfile::tempdir().unwrap();
        write_profiles(
            dir.path(),
            Some("a"),
            &[("a", "a:1"), ("b", "b:1"), ("c", "c:1")],
        );
        let e = env(dir.path(), &[(PROFILE_ENV, "b")]);
        assert_eq!(
            resolve(&flags(&[], Some("c")), &e).unwrap().brokers,
            vec!["c:1"]
        );
        assert_eq!(resolve(&flags(&[], None), &e).unwrap().brokers, vec!["b:1"]);
        let e = env(dir.path(), &[]);
        assert_eq!(resolve(&flags(&[], None), &e).unwrap().brokers, vec!["a:1"]);
    }

    #[test]
    fn a_named_profile_must_exist_even_when_not_needed() {
        let dir = tempfile::tempdir().unwrap();
        write_profiles(dir.path(), None, &[("a", "a:1")]);
        let b = vec!["h:1".to_owned()];
        let err = resolve(&flags(&b, Some("nope")), &env(dir.path(), &[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"nope\" is not in") && err.contains("--profile"),
            "{err}"
        );
        assert!(err.contains("it holds: a"), "{err}");
        let err = resolve(&flags(&b, None), &env(dir.path(), &[(PROFILE_ENV, "gone")]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("QUIRE_PROFILE"), "{err}");
    }

    #[test]
    fn no_brokers_anywhere_says_where_it_looked() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("profiles.toml").display().to_string();
        let err = |e: &Env| resolve(&flags(&[], None), e).unwrap_err().to_string();

        let msg = err(&env(dir.path(), &[]));
        assert!(
            msg.contains("--brokers/-b") && msg.contains("QUIRE_BROKERS"),
            "{msg}"
        );
        assert!(msg.contains(&format!("{path} does not exist")), "{msg}");
        ProfileStore::in_dir(dir.path())
            .save(&ProfilesFile::default())
            .unwrap();
        let msg = err(&env(dir.path(), &[]));
        assert!(msg.contains(&format!("{path} holds no profile")), "{msg}");

        write_profiles(dir.path(), None, &[("a", "a:1")]);
        let msg = err(&env(dir.path(), &[]));
        assert!(
            msg.contains(&format!("no profile is current in {path}")),
            "{msg}"
        );

        let mut file = ProfileStore::in_dir(dir.path()).load().unwrap();
        file.profiles.insert("empty".into(), Profile::default());
        file.current = Some("empty".into());
        ProfileStore::in_dir(dir.path()).save(&file).unwrap();
        let msg = err(&env(dir.path(), &[(BROKERS_ENV, " , ")]));
        assert!(
            msg.contains(&format!("profile empty in {path} has no brokers")),
            "{msg}"
        );

        let msg = err(&Env::from_pairs([]));
        assert!(msg.contains("no configuration directory"), "{msg}");
    }

    #[test]
    fn flags_and_variables_alone_never_read_the_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("profiles.toml"), "not toml [").unwrap();
        let b = vec!["h:1".to_owned()];
        let f = Flags {
            brokers: &b,
            profile: None,
            connect_timeout: Some(Duration::from_secs(1)),
            wants_connect_timeout: true,
        };
        assert!(resolve(&f, &env(dir.path(), &[])).is_ok());
        let no_timeout = Flags {
            connect_timeout: None,
            wants_connect_timeout: false,
            ..f.clone()
        };
        assert!(
            resolve(&no_timeout, &env(dir.path(), &[])).is_ok(),
            "status, handoff"
        );
        let f = Flags {
            connect_timeout: None,
            ..f
        };
        let err = format!("{:#}", resolve(&f, &env(dir.path(), &[])).unwrap_err());
        assert!(
            err.contains("profiles.toml") && err.contains("not a valid"),
            "{err}"
        );
    }

    #[test]
    fn a_typo_of_a_client_variable_is_an_error_naming_both() {
        let check = |name: &str| check_variables(&Env::from_pairs([(name, "x")]));
        let err = check("QUIRE_BROKRS").unwrap_err().to_string();
        assert!(
            err.contains("QUIRE_BROKRS") && err.contains("did you mean QUIRE_BROKERS"),
            "{err}"
        );
        assert!(check("QUIRE_BROKER").is_err(), "one letter short");
        assert!(check("QUIRE_PROFLIE").is_err(), "two letters swapped");
        assert!(check("quire_format").is_err(), "case");
        for fine in [
            "QUIRE_BROKERS",
            "QUIRE_TOPIC",
            "QUIRE_NODE_LISTEN",
            "QUIRE_BROKER_ID",
            "QUIRE_BROKER_BROKERS",
            "QUIRE_TEST_KEEP",
            "QUIRE_FAILPOINTS",
            "QUIRE_SOMETHING_ELSE_ENTIRELY",
            "HOME",
        ] {
            assert!(check(fine).is_ok(), "{fine}");
        }
        assert_eq!(edits("ab", "ba"), 1);
        assert_eq!(edits("", "abc"), 3);
    }
}
