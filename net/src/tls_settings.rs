//! The `[tls]` table that quire-node and quire-broker share: which PEM files a server
//! presents and trusts, and whether it asks clients for certificates.
//!
//! ```toml
//! [tls]
//! cert_file = "/etc/quire/store-1.pem"   # this server's certificate chain, leaf first
//! key_file = "/etc/quire/store-1.key"    # its private key
//! ca_file = "/etc/quire/ca.pem"          # the cluster's CA: peers' certificates chain to it
//! client_auth = "required"               # "none", "optional"
//! ```
//!
//! Unset `cert_file` and `key_file`: the listener is plaintext (the server says so at start).
//! A broker also speaks TLS on its outgoing links (to stores and other brokers) when
//! `ca_file` is set, showing `cert_file`/`key_file` as its client certificate.

use quire_tls::{ClientAuth, TlsFiles};

use crate::layers::{Kind, Resolved, Setting, SettingsError, Value};

/// A server's TLS settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    /// The PEM files.
    pub files: TlsFiles,
    /// Whether the listener asks clients for a certificate of `ca_file`.
    pub client_auth: ClientAuth,
}

impl TlsSettings {
    /// The settings of the `[tls]` table, with `client_auth` defaulting to `default_auth`
    /// (a store requires client certificates; a broker asks for them optionally).
    #[must_use]
    pub fn schema(default_auth: ClientAuth) -> Vec<Setting> {
        vec![
            Setting::new(
                "cert_file",
                Kind::Text,
                "PEM file of this server's TLS certificate chain, leaf first; with key_file, the listener speaks TLS 1.3 (unset: plaintext)",
            )
            .in_table("tls"),
            Setting::new("key_file", Kind::Text, "PEM file of the private key of cert_file")
                .in_table("tls"),
            Setting::new(
                "ca_file",
                Kind::Text,
                "PEM file of the CA certificates peers' certificates must chain to (client certificates; a broker's outgoing links)",
            )
            .in_table("tls"),
            Setting::new(
                "client_auth",
                Kind::Choice(ClientAuth::CHOICES),
                "Whether TLS clients must show a certificate of ca_file (required: mutual TLS), may (optional), or are not asked (none)",
            )
            .in_table("tls")
            .default_value(Value::Text(default_auth.as_str().to_owned())),
        ]
    }

    /// The settings out of resolved layers.
    ///
    /// # Errors
    /// A half-given pair (`cert_file` without `key_file`), a TLS listener that asks for
    /// client certificates without a `ca_file`, or files that cannot be used (checked here, so a bad file
    /// stops the server at start with the setting named).
    pub fn from_resolved(r: &Resolved) -> Result<TlsSettings, SettingsError> {
        let path = |key: &str| r.text(key).filter(|t| !t.is_empty()).map(Into::into);
        let settings = TlsSettings {
            files: TlsFiles {
                cert: path("cert_file"),
                key: path("key_file"),
                ca: path("ca_file"),
            },
            client_auth: r
                .text("client_auth")
                .and_then(ClientAuth::parse)
                .unwrap_or_default(),
        };
        let serving = settings.files.cert.is_some() || settings.files.key.is_some();
        // client_auth applies to a TLS listener only: without cert_file and key_file it is
        // moot (both servers default it to something other than none).
        if serving {
            settings
                .files
                .acceptor(settings.client_auth)
                .map_err(|e| r.invalid(setting_of(&settings.files, &e), e.to_string()))?;
        }
        settings
            .files
            .connector()
            .map_err(|e| r.invalid(setting_of(&settings.files, &e), e.to_string()))?;
        Ok(settings)
    }

    /// The listener's TLS side: `None` for plaintext.
    ///
    /// # Errors
    /// As [`TlsFiles::acceptor`].
    pub fn acceptor(&self) -> Result<Option<quire_tls::TlsAcceptor>, quire_tls::TlsError> {
        if self.files.cert.is_none() && self.files.key.is_none() {
            return Ok(None);
        }
        self.files.acceptor(self.client_auth)
    }
}

/// The setting a TLS error is about, for the message.
fn setting_of(files: &TlsFiles, e: &quire_tls::TlsError) -> &'static str {
    use quire_tls::TlsError;
    match e {
        TlsError::Pem { path, .. } | TlsError::Empty { path, .. }
            if files.ca.as_ref() == Some(path) =>
        {
            "ca_file"
        }
        TlsError::Incomplete { what, .. } if what.starts_with("client_auth") => "client_auth",
        TlsError::Incomplete { what, .. } if what.starts_with("key_file") => "key_file",
        TlsError::KeyMismatch { .. } => "key_file",
        TlsError::BadCa { .. } => "ca_file",
        TlsError::Pem { what, .. } if *what == "a private key" => "key_file",
        _ => "cert_file",
    }
}

/// Waits for SIGINT or SIGTERM (a server's cue to shut down); on each SIGHUP meanwhile,
/// calls `reload_tls` and logs what came of it (the certificate files read again, nothing
/// to read without TLS, or why not, the old certificate staying in use).
///
/// # Errors
/// The signal handlers could not be installed.
pub async fn until_shutdown<F>(reload_tls: F) -> std::io::Result<()>
where
    F: Fn() -> Result<bool, quire_tls::TlsError>,
{
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    loop {
        tokio::select! {
            r = tokio::signal::ctrl_c() => return r,
            _ = term.recv() => return Ok(()),
            _ = hup.recv() => match reload_tls() {
                Ok(true) => tracing::info!("SIGHUP: TLS certificate and key read again; new connections get them"),
                Ok(false) => tracing::info!("SIGHUP: nothing to reload (no TLS certificate: [tls] cert_file is unset)"),
                Err(e) => tracing::error!(error = %e, "SIGHUP: cannot reload the TLS certificate; the one in use stays"),
            },
        }
    }
}
