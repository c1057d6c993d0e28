//! SCRAM-SHA-256 (RFC 5802, with SHA-256 per RFC 7677): a client proves it knows a user's
//! password, and the broker proves it holds the user's credential, in two round trips,
//! without the password crossing the wire or resting on the broker.
//!
//! ```text
//! client                                         broker
//!   client-first  n,,n=USER,r=CNONCE        -->
//!                                           <--  server-first  r=CNONCE+SNONCE,s=SALT,i=ITER
//!   client-final  c=biws,r=NONCE,p=PROOF    -->  (checks H(PROOF ^ HMAC(StoredKey, AuthMessage))
//!                                                 == StoredKey)
//!                                           <--  server-final  v=HMAC(ServerKey, AuthMessage)
//! ```
//!
//! Channel binding (`-PLUS`) is not offered: the gs2 header is always `n,,`. Over plaintext
//! the exchange keeps the password secret but not the session; use it with TLS. An unknown
//! user gets a server-first with a made-up salt and fails at the proof, like a wrong
//! password (RFC 5802 §5.1), so the answer does not tell which names exist.

use aws_lc_rs::{constant_time, digest, hmac, pbkdf2, rand};
use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use bytes::Bytes;
use quire_proto::{ScramCredential, SCRAM_KEY_BYTES};
use std::num::NonZeroU32;

/// The SASL mechanism name.
pub const MECHANISM: &str = "SCRAM-SHA-256";
/// Iterations `quire user add` uses by default (RFC 7677's minimum, and Kafka's default).
pub const ITERATIONS_DEFAULT: u32 = 4096;
/// Fewest iterations a credential may have (RFC 7677 §4).
pub const ITERATIONS_MIN: u32 = 4096;
/// Most iterations a client accepts from a server-first message (a server asking for more
/// would make every login slow), and a credential may have.
pub const ITERATIONS_MAX: u32 = 1 << 20;
/// Bytes of salt a new credential gets.
const SALT_BYTES: usize = 16;
/// Bytes of randomness in a nonce (before base64).
const NONCE_BYTES: usize = 18;

/// Why a SCRAM exchange failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    /// A message is not what RFC 5802 says it should be.
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    /// The proof does not match: an unknown user or a wrong password.
    #[error("authentication failed: unknown user or wrong password")]
    BadProof,
    /// The server's signature does not match: it does not hold the user's credential (an
    /// impostor, or a credential changed in between).
    #[error("the server's SCRAM signature is wrong: it does not hold this user's credential")]
    BadServerSignature,
    /// The server answered with an `e=` error attribute.
    #[error("the server refused the exchange: {0}")]
    ServerError(String),
    /// A credential's iterations are out of bounds.
    #[error("SCRAM iterations {0} out of bounds ({ITERATIONS_MIN}..={ITERATIONS_MAX})")]
    Iterations(u32),
    /// The system's random source failed.
    #[error("no randomness for a SCRAM nonce or salt")]
    Random,
}

fn random<const N: usize>() -> Result<[u8; N], ScramError> {
    let mut out = [0u8; N];
    rand::fill(&mut out).map_err(|_| ScramError::Random)?;
    Ok(out)
}

fn salted_password(password: &str, salt: &[u8], iterations: u32) -> Result<[u8; 32], ScramError> {
    if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
        return Err(ScramError::Iterations(iterations));
    }
    let n = NonZeroU32::new(iterations).ok_or(ScramError::Iterations(iterations))?;
    let mut out = [0u8; 32];
    pbkdf2::derive(
        pbkdf2::PBKDF2_HMAC_SHA256,
        n,
        salt,
        password.as_bytes(),
        &mut out,
    );
    Ok(out)
}

fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; SCRAM_KEY_BYTES] {
    let tag = hmac::sign(&hmac::Key::new(hmac::HMAC_SHA256, key), data);
    let mut out = [0u8; SCRAM_KEY_BYTES];
    out.copy_from_slice(tag.as_ref());
    out
}

fn sha256(data: &[u8]) -> [u8; SCRAM_KEY_BYTES] {
    let d = digest::digest(&digest::SHA256, data);
    let mut out = [0u8; SCRAM_KEY_BYTES];
    out.copy_from_slice(d.as_ref());
    out
}

fn xor(a: &[u8; SCRAM_KEY_BYTES], b: &[u8; SCRAM_KEY_BYTES]) -> [u8; SCRAM_KEY_BYTES] {
    std::array::from_fn(|i| a[i] ^ b[i])
}

/// The credential of `password` with `salt` and `iterations` (RFC 5802 §3).
///
/// # Errors
/// [`ScramError::Iterations`] outside `ITERATIONS_MIN..=ITERATIONS_MAX`.
pub fn credential_with_salt(
    password: &str,
    salt: &[u8],
    iterations: u32,
) -> Result<ScramCredential, ScramError> {
    let salted = salted_password(password, salt, iterations)?;
    let client_key = hmac_sha256(&salted, b"Client Key");
    Ok(ScramCredential {
        salt: Bytes::copy_from_slice(salt),
        iterations,
        stored_key: sha256(&client_key),
        server_key: hmac_sha256(&salted, b"Server Key"),
    })
}

/// A new credential for `password`: a random 16-byte salt and `iterations` of PBKDF2.
///
/// # Errors
/// [`ScramError::Iterations`], or [`ScramError::Random`].
pub fn new_credential(password: &str, iterations: u32) -> Result<ScramCredential, ScramError> {
    credential_with_salt(password, &random::<SALT_BYTES>()?, iterations)
}

/// `saslname` of RFC 5802 §5.1: `=` and `,` escaped.
fn escape_name(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

fn unescape_name(name: &str) -> Result<String, ScramError> {
    let mut out = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=3D") => out.push('='),
            Some("=2C") => out.push(','),
            _ => return Err(ScramError::Malformed("bad escape in the user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The value of attribute `key` (`k=value`) in a comma-separated SCRAM message.
fn attribute(message: &str, key: char) -> Option<&str> {
    message.split(',').find_map(|part| {
        let mut chars = part.chars();
        (chars.next() == Some(key) && chars.next() == Some('=')).then(|| &part[2..])
    })
}

fn nonce() -> Result<String, ScramError> {
    Ok(BASE64.encode(random::<NONCE_BYTES>()?))
}

/// The salt a server shows for `user` when it has no such user: the same for the same
/// name every time (HMAC-SHA-256 of the name under a key drawn once per process), so asking
/// twice does not tell a made-up salt from a real one (RFC 5802 §5.1). Another process
/// shows another one: comparing the salts two brokers show still tells an unknown user
/// (docs/operations.md says so).
///
/// # Errors
/// [`ScramError::Random`] when the key cannot be drawn.
fn fake_salt(user: &str) -> Result<[u8; SALT_BYTES], ScramError> {
    static KEY: std::sync::OnceLock<Option<[u8; 32]>> = std::sync::OnceLock::new();
    let key = KEY
        .get_or_init(|| random::<32>().ok())
        .ok_or(ScramError::Random)?;
    let mac = hmac_sha256(&key, user.as_bytes());
    let mut salt = [0u8; SALT_BYTES];
    salt.copy_from_slice(&mac[..SALT_BYTES]);
    Ok(salt)
}

/// The client side, before the server-first message.
#[derive(Debug)]
pub struct ScramClient {
    password: String,
    client_first_bare: String,
    client_nonce: String,
}

/// The client side, after sending client-final: what the server must prove.
#[derive(Debug)]
pub struct ScramClientFinal {
    server_signature: [u8; SCRAM_KEY_BYTES],
}

impl ScramClient {
    /// Starts an exchange for `user` with `password`; returns the client and the
    /// client-first message to send.
    ///
    /// # Errors
    /// [`ScramError::Random`].
    pub fn start(user: &str, password: &str) -> Result<(ScramClient, String), ScramError> {
        ScramClient::with_nonce(user, password, nonce()?)
    }

    fn with_nonce(
        user: &str,
        password: &str,
        client_nonce: String,
    ) -> Result<(ScramClient, String), ScramError> {
        let client_first_bare = format!("n={},r={client_nonce}", escape_name(user));
        let first = format!("n,,{client_first_bare}");
        Ok((
            ScramClient {
                password: password.to_owned(),
                client_first_bare,
                client_nonce,
            },
            first,
        ))
    }

    /// Takes the server-first message; returns the client-final message to send.
    ///
    /// # Errors
    /// [`ScramError::Malformed`] (a nonce that does not extend ours, a bad salt),
    /// [`ScramError::Iterations`], [`ScramError::ServerError`].
    pub fn server_first(self, message: &str) -> Result<(ScramClientFinal, String), ScramError> {
        if let Some(e) = attribute(message, 'e') {
            return Err(ScramError::ServerError(e.to_owned()));
        }
        let nonce = attribute(message, 'r').ok_or(ScramError::Malformed("no nonce"))?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(ScramError::Malformed(
                "the server nonce does not extend ours",
            ));
        }
        let salt = attribute(message, 's')
            .and_then(|s| BASE64.decode(s).ok())
            .ok_or(ScramError::Malformed("no salt, or not base64"))?;
        let iterations = attribute(message, 'i')
            .and_then(|i| i.parse::<u32>().ok())
            .ok_or(ScramError::Malformed("no iteration count"))?;
        let salted = salted_password(&self.password, &salt, iterations)?;
        let client_key = hmac_sha256(&salted, b"Client Key");
        let stored_key = sha256(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{message},{without_proof}", self.client_first_bare);
        let signature = hmac_sha256(&stored_key, auth_message.as_bytes());
        let proof = xor(&client_key, &signature);
        let server_key = hmac_sha256(&salted, b"Server Key");
        Ok((
            ScramClientFinal {
                server_signature: hmac_sha256(&server_key, auth_message.as_bytes()),
            },
            format!("{without_proof},p={}", BASE64.encode(proof)),
        ))
    }
}

impl ScramClientFinal {
    /// Checks the server-final message.
    ///
    /// # Errors
    /// [`ScramError::ServerError`] (`e=`), [`ScramError::Malformed`],
    /// [`ScramError::BadServerSignature`].
    pub fn server_final(self, message: &str) -> Result<(), ScramError> {
        if let Some(e) = attribute(message, 'e') {
            return Err(ScramError::ServerError(e.to_owned()));
        }
        let v = attribute(message, 'v')
            .and_then(|v| BASE64.decode(v).ok())
            .ok_or(ScramError::Malformed("no server signature"))?;
        constant_time::verify_slices_are_equal(&v, &self.server_signature)
            .map_err(|_| ScramError::BadServerSignature)
    }
}

/// The server side, after the client-first message: waits for client-final.
#[derive(Debug)]
pub struct ScramServer {
    user: String,
    /// `None`: the user is unknown; the exchange fails at the proof.
    credential: Option<ScramCredential>,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl ScramServer {
    /// Takes the client-first message and looks its user up with `credential_of`;
    /// returns the server and the server-first message to send.
    ///
    /// # Errors
    /// [`ScramError::Malformed`] (channel binding asked for, an authorization identity,
    /// no user or nonce), [`ScramError::Random`].
    pub fn client_first(
        message: &str,
        credential_of: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<(ScramServer, String), ScramError> {
        ScramServer::client_first_with(message, credential_of, nonce()?, fake_salt)
    }

    fn client_first_with(
        message: &str,
        credential_of: impl FnOnce(&str) -> Option<ScramCredential>,
        server_nonce: String,
        fake_salt: impl FnOnce(&str) -> Result<[u8; SALT_BYTES], ScramError>,
    ) -> Result<(ScramServer, String), ScramError> {
        let bare = message.strip_prefix("n,,").ok_or(ScramError::Malformed(
            "the gs2 header must be \"n,,\" (no channel binding, no authzid)",
        ))?;
        let user = bare
            .strip_prefix("n=")
            .and_then(|rest| rest.split(',').next())
            .ok_or(ScramError::Malformed("no user name"))?;
        let user = unescape_name(user)?;
        if user.is_empty() {
            return Err(ScramError::Malformed("empty user name"));
        }
        let client_nonce = attribute(bare, 'r')
            .filter(|r| !r.is_empty())
            .ok_or(ScramError::Malformed("no client nonce"))?;
        let credential = credential_of(&user);
        let (salt, iterations) = match &credential {
            Some(c) => (c.salt.to_vec(), c.iterations),
            None => (fake_salt(&user)?.to_vec(), ITERATIONS_DEFAULT),
        };
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!("r={nonce},s={},i={iterations}", BASE64.encode(salt));
        Ok((
            ScramServer {
                user,
                credential,
                client_first_bare: bare.to_owned(),
                server_first: server_first.clone(),
                nonce,
            },
            server_first,
        ))
    }

    /// The user the client claims to be.
    #[must_use]
    pub fn user(&self) -> &str {
        &self.user
    }

    /// Takes the client-final message; on a good proof returns the user and the
    /// server-final message to send.
    ///
    /// # Errors
    /// [`ScramError::BadProof`] (an unknown user or a wrong password),
    /// [`ScramError::Malformed`] (a nonce not the one sent, channel binding data other
    /// than `biws`).
    pub fn client_final(self, message: &str) -> Result<(String, String), ScramError> {
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or(ScramError::Malformed("no proof"))?;
        if attribute(without_proof, 'c') != Some("biws") {
            return Err(ScramError::Malformed(
                "channel binding must be \"biws\" (n,,)",
            ));
        }
        // The nonce must end with the one sent: RFC 5802 asks for equality, but librdkafka
        // (2.0 through 2.16 at least) puts its own nonce in front of the server's whole
        // nonce (which already begins with it), and Kafka's broker accepts that by the
        // same `endsWith` test. Freshness is the same: the server's part is there, and the
        // proof covers the client-final message as sent.
        if !attribute(without_proof, 'r').is_some_and(|r| r.ends_with(self.nonce.as_str())) {
            return Err(ScramError::Malformed("the nonce is not the one sent"));
        }
        let proof = BASE64
            .decode(proof)
            .ok()
            .and_then(|p| <[u8; SCRAM_KEY_BYTES]>::try_from(p).ok())
            .ok_or(ScramError::Malformed("the proof is not 32 bytes of base64"))?;
        let Some(credential) = self.credential else {
            return Err(ScramError::BadProof);
        };
        let auth_message = format!(
            "{},{},{without_proof}",
            self.client_first_bare, self.server_first
        );
        let signature = hmac_sha256(&credential.stored_key, auth_message.as_bytes());
        let client_key = xor(&proof, &signature);
        constant_time::verify_slices_are_equal(&sha256(&client_key), &credential.stored_key)
            .map_err(|_| ScramError::BadProof)?;
        let server_signature = hmac_sha256(&credential.server_key, auth_message.as_bytes());
        Ok((self.user, format!("v={}", BASE64.encode(server_signature))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 §3's example exchange, message for message.
    #[test]
    fn rfc7677_example() {
        let (client, first) =
            ScramClient::with_nonce("user", "pencil", "rOprNGfwEbeRWgbNEkqO".into()).unwrap();
        assert_eq!(first, "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = credential_with_salt("pencil", &salt, 4096).unwrap();
        let (server, server_first) = ScramServer::client_first_with(
            &first,
            |u| (u == "user").then(|| credential.clone()),
            "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".into(),
            |_| Ok([0; SALT_BYTES]),
        )
        .unwrap();
        assert_eq!(
            server_first,
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
        );
        let (client, client_final) = client.server_first(&server_first).unwrap();
        assert_eq!(
            client_final,
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        let (user, server_final) = server.client_final(&client_final).unwrap();
        assert_eq!(user, "user");
        assert_eq!(
            server_final,
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
        );
        client.server_final(&server_final).unwrap();
    }

    fn exchange(
        user: &str,
        password: &str,
        stored: &ScramCredential,
    ) -> Result<String, ScramError> {
        let (client, first) = ScramClient::start(user, password)?;
        let (server, server_first) =
            ScramServer::client_first(&first, |u| (u == "alice").then(|| stored.clone()))?;
        let (client, fin) = client.server_first(&server_first)?;
        let (user, server_final) = server.client_final(&fin)?;
        client.server_final(&server_final)?;
        Ok(user)
    }

    #[test]
    fn wrong_password_and_unknown_user_fail_alike() {
        let stored = new_credential("s3cret", ITERATIONS_DEFAULT).unwrap();
        assert_eq!(exchange("alice", "s3cret", &stored).unwrap(), "alice");
        assert_eq!(
            exchange("alice", "guess", &stored),
            Err(ScramError::BadProof)
        );
        assert_eq!(
            exchange("mallory", "s3cret", &stored),
            Err(ScramError::BadProof)
        );
    }

    #[test]
    fn an_unknown_user_gets_the_same_salt_every_time() {
        let salt_of = |user: &str| {
            let (_, first) = ScramClient::start(user, "x").unwrap();
            let (_, server_first) = ScramServer::client_first(&first, |_| None).unwrap();
            attribute(&server_first, 's').unwrap().to_owned()
        };
        assert_eq!(salt_of("mallory"), salt_of("mallory"));
        assert_ne!(salt_of("mallory"), salt_of("eve"));
    }

    #[test]
    fn a_server_without_the_credential_is_caught() {
        let real = new_credential("s3cret", ITERATIONS_DEFAULT).unwrap();
        let (client, first) = ScramClient::start("alice", "s3cret").unwrap();
        let (_, server_first) = ScramServer::client_first(&first, |_| Some(real.clone())).unwrap();
        let (client, _) = client.server_first(&server_first).unwrap();
        assert_eq!(
            client.server_final("v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
            Err(ScramError::BadServerSignature)
        );
    }

    #[test]
    fn names_with_commas_and_equals_round_trip() {
        assert_eq!(unescape_name(&escape_name("a=b,c")).unwrap(), "a=b,c");
        assert!(unescape_name("a=4").is_err());
    }

    #[test]
    fn malformed_messages_are_refused_not_panicked_on() {
        for m in [
            "",
            "y,,n=a,r=x",
            "n,,",
            "n,,n=,r=x",
            "n,,n=a",
            "n,,n=a=,r=x",
            "p=x,,n=a,r=b",
        ] {
            assert!(matches!(
                ScramServer::client_first(m, |_| None),
                Err(ScramError::Malformed(_))
            ));
        }
        let (_, first) = ScramClient::start("alice", "x").unwrap();
        let (server, _) = ScramServer::client_first(&first, |_| None).unwrap();
        assert!(server.client_final("garbage").is_err());
        let (client, _) = ScramClient::start("alice", "x").unwrap();
        assert!(client.server_first("r=other,s=AAAA,i=4096").is_err());
        let (client, first) = ScramClient::start("alice", "x").unwrap();
        let nonce = attribute(&first[3..], 'r').unwrap().to_owned();
        assert_eq!(
            client
                .server_first(&format!("r={nonce}x,s=AAAA,i=4294967295"))
                .unwrap_err(),
            ScramError::Iterations(u32::MAX)
        );
    }
}
