//! A bounded HTTP/1.1 GET against a server's metrics port (`/metrics`, `/healthz`,
//! `/ready`; [`get`], and [`get_ok`] when anything but `200` fails the test), and the one Prometheus text parser of the tests: a sample's value
//! ([`metric`]) and the metric names in a scrape ([`metric_names`]).

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

/// `GET path` on `addr` that must succeed: the body of a `200` answer.
///
/// # Panics
/// If the server cannot be reached within [`WAIT`] or answers anything but `200` (the test
/// fails with the address, the path and what came back).
pub fn get_ok(addr: &str, path: &str) -> String {
    match get(addr, path) {
        Some((200, body)) => body,
        Some((code, body)) => panic!("GET {path} on {addr}: status {code}: {body}"),
        None => panic!("GET {path} on {addr}: no HTTP answer"),
    }
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

/// The value of the sample `sample` — a metric name with its labels exactly as the server
/// prints them (`quire_hwm`, `quire_rejected_frames_total{reason="body_checksum"}`) — in a
/// Prometheus text scrape, or `None` if no such sample is in it. Comment lines are skipped.
///
/// # Panics
/// If the sample is there but its value is not a number (a broken scrape fails the test).
pub fn metric(scrape: &str, sample: &str) -> Option<f64> {
    scrape
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' '))
        .map(|v| {
            let v = v.split_whitespace().next().unwrap_or_default();
            v.parse()
                .unwrap_or_else(|e| panic!("{sample}: value {v:?} is not a number: {e}"))
        })
}

#[cfg(test)]
mod tests {
    use super::metric;

    const SCRAPE: &str = "# HELP quire_hwm the HWM\n# TYPE quire_hwm gauge\nquire_hwm 42\n\
        quire_hwm_lag 7\nquire_rejected_frames_total{reason=\"body_checksum\"} 3\n";

    #[test]
    fn a_sample_is_found_by_its_whole_name_and_labels() {
        assert_eq!(metric(SCRAPE, "quire_hwm"), Some(42.0));
        assert_eq!(metric(SCRAPE, "quire_hwm_lag"), Some(7.0));
        assert_eq!(
            metric(
                SCRAPE,
                "quire_rejected_frames_total{reason=\"body_checksum\"}"
            ),
            Some(3.0)
        );
        assert_eq!(metric(SCRAPE, "quire_rejected_frames_total"), None);
        assert_eq!(metric(SCRAPE, "quire_missing"), None);
    }
}
