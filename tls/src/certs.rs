//! A throw-away CA and certificates for a local cluster, so that `quire cluster up --tls` and
//! `quire demo --tls` show the secure setup with one command. Not for production: the CA's
//! key is not kept, so nothing can be added to the cluster later, and every certificate
//! names only this machine (`localhost`, `127.0.0.1`, `::1`).

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

use crate::{Role, TlsFiles};

/// What can go wrong making the certificates.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen could not make a key or a certificate.
    #[error("cannot make a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
    /// A file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// The names every local certificate is valid for.
const LOCAL_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The CA's file in `dir`.
#[must_use]
pub fn ca_path(dir: &Path) -> PathBuf {
    dir.join("ca.pem")
}

/// The files of the identity `name` made by [`write_local`] in `dir`, with the CA.
#[must_use]
pub fn files_for(dir: &Path, name: &str) -> TlsFiles {
    TlsFiles {
        cert: Some(dir.join(format!("{name}.pem"))),
        key: Some(dir.join(format!("{name}.key"))),
        ca: Some(ca_path(dir)),
    }
}

fn write(path: &Path, text: &str, private: bool) -> Result<(), CertError> {
    let open = || {
        let mut options = fs::OpenOptions::new();
        options.write(true).create(true).truncate(true);
        #[cfg(unix)]
        if private {
            use std::os::unix::fs::OpenOptionsExt;
            options.mode(0o600);
        }
        let mut f = options.open(path)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()
    };
    open().map_err(|source| CertError::Write {
        path: path.to_owned(),
        source,
    })
}

/// Makes a CA (`dir/ca.pem`) and, for each `(name, role)` of `holders`, a certificate it
/// signs (`dir/NAME.pem`, key `dir/NAME.key`, mode 0600) whose common name is the name and
/// whose subject alternative names hold the role's URI ([`Role::uri`]), valid for this
/// machine as a server and as a client (mutual TLS). ECDSA P-256 keys. The CA's key is
/// dropped once they are signed.
///
/// # Errors
/// [`CertError`]: key generation, signing, or a file that cannot be written.
pub fn write_local(dir: &Path, holders: &[(&str, Role)]) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| CertError::Write {
        path: dir.to_owned(),
        source,
    })?;
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "Quire local cluster");
    // A name of its own per CA, so that a certificate of another local cluster is an
    // unknown issuer to this one, not a bad signature by a CA of the same name.
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
        ^ u128::from(std::process::id());
    dn.push(
        DnType::CommonName,
        format!("Quire local cluster CA {:08x}", stamp as u32),
    );
    ca.distinguished_name = dn;
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key)?;
    write(&ca_path(dir), &ca_cert.pem(), false)?;
    let issuer = Issuer::new(ca, ca_key);
    for (name, role) in holders {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(
            LOCAL_NAMES
                .iter()
                .map(|s| (*s).to_owned())
                .collect::<Vec<_>>(),
        )?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::OrganizationName, "Quire local cluster");
        dn.push(DnType::CommonName, *name);
        params.distinguished_name = dn;
        params
            .subject_alt_names
            .push(SanType::URI(role.uri().try_into()?));
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        // A client's certificate cannot serve: no server authentication in its usages.
        params.extended_key_usages = if *role == Role::Client {
            vec![ExtendedKeyUsagePurpose::ClientAuth]
        } else {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        params.use_authority_key_identifier_extension = true;
        let cert = params.signed_by(&key, &issuer)?;
        let files = files_for(dir, name);
        if let (Some(c), Some(k)) = (&files.cert, &files.key) {
            write(c, &cert.pem(), false)?;
            write(k, &key.serialize_pem(), true)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use rustls_pki_types::pem::PemObject;

    use super::*;
    use crate::ClientAuth;

    const HANDSHAKE: Duration = Duration::from_secs(10);

    /// A server under `auth` and a client with `client`'s files: what the client reads back
    /// from an echo of "ping", or the error on either side.
    async fn echo(
        server: &TlsFiles,
        auth: ClientAuth,
        client: &TlsFiles,
    ) -> Result<Vec<u8>, String> {
        let acceptor = server
            .acceptor(auth)
            .map_err(|e| e.to_string())?
            .ok_or("no acceptor")?;
        let connector = client
            .connector()
            .map_err(|e| e.to_string())?
            .ok_or("no connector")?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| e.to_string())?;
        let addr = listener
            .local_addr()
            .map_err(|e| e.to_string())?
            .to_string();
        let served = tokio::spawn(async move {
            let (tcp, _) = listener.accept().await.map_err(|e| e.to_string())?;
            let stream = acceptor
                .accept(tcp, HANDSHAKE)
                .await
                .map_err(|e| e.to_string())?;
            let (mut r, mut w) = stream.into_split();
            r.readable().await.map_err(|e| e.to_string())?;
            let mut buf = [0u8; 4];
            let mut got = 0;
            while got < 4 {
                match r.try_read(&mut buf[got..]) {
                    Ok(0) => return Err("closed".to_owned()),
                    Ok(n) => got += n,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        r.readable().await.map_err(|e| e.to_string())?;
                    }
                    Err(e) => return Err(e.to_string()),
                }
            }
            w.write_all(&buf).await.map_err(|e| e.to_string())?;
            w.flush().await.map_err(|e| e.to_string())?;
            Ok::<_, String>(())
        });
        let tcp = TcpStream::connect(&addr).await.map_err(|e| e.to_string())?;
        let stream = connector
            .connect(&addr, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let (mut r, mut w) = stream.into_split();
        w.write_all(b"ping").await.map_err(|e| e.to_string())?;
        w.flush().await.map_err(|e| e.to_string())?;
        let mut back = vec![0u8; 4];
        let read = r.read_exact(&mut back).await.map_err(|e| e.to_string());
        let served = served.await.map_err(|e| e.to_string())?;
        served?;
        read?;
        Ok(back)
    }

    #[tokio::test]
    async fn mutual_tls_admits_the_clusters_certificates_and_no_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let other = tempfile::tempdir().expect("tempdir");
        write_local(
            dir.path(),
            &[("store-0", Role::Store), ("broker-1", Role::Broker)],
        )
        .expect("certificates");
        write_local(other.path(), &[("intruder", Role::Broker)]).expect("certificates");
        let store = files_for(dir.path(), "store-0");
        let broker = files_for(dir.path(), "broker-1");

        assert_eq!(
            echo(&store, ClientAuth::Required, &broker).await,
            Ok(b"ping".to_vec())
        );

        // A client with no certificate, and one of another CA, are refused.
        let anonymous = TlsFiles {
            cert: None,
            key: None,
            ..broker.clone()
        };
        assert!(echo(&store, ClientAuth::Required, &anonymous)
            .await
            .is_err());
        let intruder = TlsFiles {
            ca: broker.ca.clone(),
            ..files_for(other.path(), "intruder")
        };
        assert!(echo(&store, ClientAuth::Required, &intruder).await.is_err());
        // Without client authentication an anonymous client is served.
        assert_eq!(
            echo(&store, ClientAuth::None, &anonymous).await,
            Ok(b"ping".to_vec())
        );
        // A client that trusts another CA does not accept the server.
        let wrong_trust = TlsFiles {
            ca: Some(ca_path(other.path())),
            ..broker.clone()
        };
        assert!(echo(&store, ClientAuth::None, &wrong_trust).await.is_err());
    }

    #[tokio::test]
    async fn a_reload_presents_the_new_certificate_to_later_handshakes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let next = tempfile::tempdir().expect("tempdir");
        write_local(
            dir.path(),
            &[("store-0", Role::Store), ("broker-1", Role::Broker)],
        )
        .expect("certificates");
        write_local(
            next.path(),
            &[("store-0", Role::Store), ("broker-1", Role::Broker)],
        )
        .expect("certificates");
        let store = files_for(dir.path(), "store-0");
        let acceptor = store
            .acceptor(ClientAuth::None)
            .expect("acceptor")
            .expect("tls");
        let old_client = files_for(dir.path(), "broker-1");
        let new_client = files_for(next.path(), "broker-1");
        let handshake = |client: TlsFiles| {
            let acceptor = acceptor.clone();
            async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let addr = listener.local_addr().expect("addr").to_string();
                let served = tokio::spawn(async move {
                    let (tcp, _) = listener.accept().await.expect("accept");
                    acceptor.accept(tcp, HANDSHAKE).await.is_ok()
                });
                let tcp = TcpStream::connect(&addr).await.expect("connect");
                let connector = client.connector().expect("connector").expect("tls");
                let ok = connector.connect(&addr, tcp).await.is_ok();
                let _ = served.await;
                ok
            }
        };
        assert!(handshake(old_client.clone()).await);
        assert!(!handshake(new_client.clone()).await);
        // The operator puts the new certificate and key in place and sends SIGHUP.
        for (from, to) in [
            (files_for(next.path(), "store-0").cert, store.cert.clone()),
            (files_for(next.path(), "store-0").key, store.key.clone()),
        ] {
            fs::copy(from.expect("file"), to.expect("file")).expect("copy");
        }
        acceptor.reload().expect("reload");
        assert!(handshake(new_client).await);
        assert!(!handshake(old_client).await);
        // A file that cannot be read leaves the certificate in use.
        fs::write(store.key.as_ref().expect("key"), "garbage").expect("write");
        assert!(acceptor.reload().is_err());
    }

    #[tokio::test]
    async fn a_link_takes_only_a_server_of_the_role_it_expects() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_local(
            dir.path(),
            &[
                ("broker-1", Role::Broker),
                ("broker-2", Role::Broker),
                ("tool", Role::Client),
            ],
        )
        .expect("certificates");
        let broker = files_for(dir.path(), "broker-1");
        // A broker expecting a store refuses a server that shows a broker's certificate.
        let serve = |name: &str| {
            let acceptor = files_for(dir.path(), name)
                .acceptor(ClientAuth::None)
                .expect("acceptor")
                .expect("tls");
            async move {
                let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
                let addr = listener.local_addr().expect("addr").to_string();
                tokio::spawn(async move {
                    let (tcp, _) = listener.accept().await.expect("accept");
                    let _ = acceptor.accept(tcp, HANDSHAKE).await;
                });
                addr
            }
        };
        let connector = broker.connector().expect("connector").expect("tls");
        let addr = serve("broker-2").await;
        let tcp = TcpStream::connect(&addr).await.expect("connect");
        let e = connector
            .clone()
            .expecting(Role::Store)
            .connect(&addr, tcp)
            .await
            .expect_err("a broker is no store");
        assert_eq!(e.kind(), std::io::ErrorKind::PermissionDenied, "{e}");
        let addr = serve("broker-2").await;
        let tcp = TcpStream::connect(&addr).await.expect("connect");
        connector
            .clone()
            .expecting(Role::Broker)
            .connect(&addr, tcp)
            .await
            .expect("a broker link to a broker");
        // A client's certificate cannot serve at all (no server authentication usage).
        let addr = serve("tool").await;
        let tcp = TcpStream::connect(&addr).await.expect("connect");
        assert!(connector.connect(&addr, tcp).await.is_err());
    }

    #[test]
    fn a_certificate_naming_two_roles_names_none() {
        let key = KeyPair::generate().expect("key");
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).expect("params");
        for role in [Role::Client, Role::Broker] {
            params
                .subject_alt_names
                .push(SanType::URI(role.uri().try_into().expect("ia5")));
        }
        let cert = params.self_signed(&key).expect("cert");
        let (_, role) = crate::certificate_identity(cert.der()).expect("a certificate");
        assert_eq!(role, None);
    }

    #[test]
    fn a_certificate_names_its_holder_and_role() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_local(
            dir.path(),
            &[("broker-2", Role::Broker), ("tool", Role::Client)],
        )
        .expect("certificates");
        for (name, role) in [("broker-2", Role::Broker), ("tool", Role::Client)] {
            let path = files_for(dir.path(), name).cert.expect("cert");
            let der = rustls_pki_types::CertificateDer::from_pem_file(&path).expect("pem");
            assert_eq!(
                crate::certificate_identity(&der),
                Some((Some(name.to_owned()), Some(role)))
            );
        }
        assert_eq!(crate::certificate_identity(b"not a certificate"), None);
    }

    #[test]
    fn half_given_files_are_refused_with_the_missing_setting() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_local(dir.path(), &[("store-0", Role::Store)]).expect("certificates");
        let full = files_for(dir.path(), "store-0");
        let no_key = TlsFiles {
            key: None,
            ..full.clone()
        };
        let e = no_key.acceptor(ClientAuth::None).expect_err("refused");
        assert!(e.to_string().contains("key_file"), "{e}");
        let no_ca = TlsFiles {
            ca: None,
            ..full.clone()
        };
        let e = no_ca.acceptor(ClientAuth::Required).expect_err("refused");
        assert!(e.to_string().contains("ca_file"), "{e}");
        assert!(TlsFiles::default()
            .acceptor(ClientAuth::None)
            .expect("plaintext")
            .is_none());
        let garbage = dir.path().join("garbage.pem");
        fs::write(&garbage, "not a certificate").expect("write");
        let bad = TlsFiles {
            cert: Some(garbage),
            ..full
        };
        let e = bad.acceptor(ClientAuth::None).expect_err("refused");
        assert!(e.to_string().contains("garbage.pem"), "{e}");
    }
}
