//! A bounded HTTP/1.1 GET against a server's metrics port (`/metrics`, `/healthz`,
//! `/ready`), and the metric names in a Prometheus text scrape.

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::TcpStream;

use crate::WAIT;

/// `GET path` on `addr`; `(status code, body)`, or `None` if the server cannot be reached
/// or answers something that is not HTTP. Each step is bounded by [`WAIT`].
pub fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(WAIT)).ok()?;
    s.set_write_timeout(Some(WAIT)).ok()?;
    s.write_all(format!("GET {path} HTTP/1.1\r\nHost: quire\r\n\r\n").as_bytes())
        .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_owned()))
}

/// The names in a Prometheus text scrape: every sample's name and every family named by a
/// `# TYPE` line (a labelled family with no sample yet still has its `# TYPE` line).
pub fn metric_names(scrape: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in scrape.lines() {
        let name = match line.strip_prefix("# TYPE ") {
            Some(rest) => rest.split_whitespace().next(),
            None if line.starts_with('#') => None,
            None => line.split(['{', ' ']).next(),
        };
        if let Some(n) = name.filter(|n| !n.is_empty()) {
            names.insert(n.to_owned());
        }
    }
    names
}
