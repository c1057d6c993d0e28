//! [`serve_metrics`]: the tiny HTTP/1.1 responder behind `GET /metrics`, `/healthz` and
//! `/ready`, one home for quire-node and quire-broker (each passes its own registry and
//! readiness as a [`MetricsText`]).
//!
//! It answers one request per connection (`Connection: close`), reads at most
//! [`HTTP_REQUEST_BYTES_MAX`] bytes of request head, gives a request at most
//! [`HTTP_TIMEOUT`] end to end, and serves at most [`HTTP_CONNECTIONS_MAX`] connections at
//! once (more wait in the listen backlog).
//!
//! | request | answer |
//! | --- | --- |
//! | `GET /metrics` | 200, the metrics text |
//! | `GET /healthz` | 200 `ok` while the process serves this port (liveness) |
//! | `GET /ready` | 200 `ready`, or 503 with a one-line reason ([`MetricsText::readiness`]) |
//! | `HEAD` of those | the same status and headers, no body |
//! | another path | 404 |
//! | another method | 405 |
//! | a head over the bound | 431 |

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Longest HTTP request head read, in bytes.
pub const HTTP_REQUEST_BYTES_MAX: usize = 8 * 1024;
/// How long one metrics request may take, end to end.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(5);
/// Metrics connections served at once; more wait in the listen backlog.
pub const HTTP_CONNECTIONS_MAX: usize = 16;

/// Longest readiness reason sent, in bytes (longer ones are cut at a character boundary).
pub const READY_REASON_BYTES_MAX: usize = 512;

/// Whether a server should be sent traffic (`GET /ready`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Ready: `/ready` answers 200.
    Ready,
    /// Not ready, and why (one short line of plain text): `/ready` answers 503.
    NotReady(String),
}

/// A set of metrics that renders itself in the Prometheus text format (version 0.0.4), and
/// the server's readiness.
pub trait MetricsText: Send + Sync + 'static {
    /// The whole set, as text.
    ///
    /// # Errors
    /// Only if formatting fails.
    fn encode_text(&self) -> Result<String, fmt::Error>;

    /// Whether the server is ready, for `GET /ready`. Called on each request: keep it to an
    /// atomic or watch read, never a lock the data path holds. The default: always ready.
    fn readiness(&self) -> Readiness {
        Readiness::Ready
    }
}

/// The answer to one request line: status, content type, body (the body is not sent for
/// `HEAD`, but its length is).
fn route<M: MetricsText>(
    method: &str,
    path: &str,
    metrics: &M,
) -> (&'static str, &'static str, String) {
    let head = method == "HEAD";
    if method != "GET" && !head {
        return (
            "405 Method Not Allowed",
            TEXT,
            "only GET and HEAD are served here\n".to_owned(),
        );
    }
    match path {
        "/metrics" => match metrics.encode_text() {
            Ok(body) => (
                "200 OK",
                prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
                body,
            ),
            Err(_) => (
                "500 Internal Server Error",
                TEXT,
                "encoding failed\n".to_owned(),
            ),
        },
        "/healthz" => ("200 OK", TEXT, "ok\n".to_owned()),
        "/ready" => match metrics.readiness() {
            Readiness::Ready => ("200 OK", TEXT, "ready\n".to_owned()),
            Readiness::NotReady(reason) => {
                let mut reason = reason.replace(['\r', '\n'], " ");
                if reason.len() > READY_REASON_BYTES_MAX {
                    let mut cut = READY_REASON_BYTES_MAX;
                    while !reason.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    reason.truncate(cut);
                }
                (
                    "503 Service Unavailable",
                    TEXT,
                    format!("not ready: {reason}\n"),
                )
            }
        },
        _ => (
            "404 Not Found",
            TEXT,
            "served here: /metrics, /healthz, /ready\n".to_owned(),
        ),
    }
}

/// Serves `GET /metrics` on `listener` until the task is dropped.
pub async fn serve_metrics<M: MetricsText>(listener: TcpListener, metrics: Arc<M>) {
    let slots = Arc::new(Semaphore::new(HTTP_CONNECTIONS_MAX));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else {
            return;
        };
        let stream = match listener.accept().await {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::warn!(error = %e, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let _permit = permit;
            if tokio::time::timeout(HTTP_TIMEOUT, answer(stream, &*metrics))
                .await
                .is_err()
            {
                tracing::debug!("metrics request timed out");
            }
        });
    }
}

async fn answer<M: MetricsText>(mut stream: TcpStream, metrics: &M) {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() >= HTTP_REQUEST_BYTES_MAX {
            let body = "request head too large\n";
            respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                TEXT,
                (body.len(), body),
            )
            .await;
            return;
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    // A query string does not change the answer (`/ready?verbose` is `/ready`).
    let path = path.split('?').next().unwrap_or_default();
    let (status, content_type, body) = route(method, path, metrics);
    let body = if method == "HEAD" {
        (body.len(), "")
    } else {
        (body.len(), body.as_str())
    };
    respond(&mut stream, status, content_type, body).await;
}

const TEXT: &str = "text/plain; charset=utf-8";

/// Writes the response; `body` is `(Content-Length, bytes sent)` (no bytes for `HEAD`).
async fn respond(
    stream: &mut TcpStream,
    status: &str,
    content_type: &str,
    (length, body): (usize, &str),
) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {length}\r\nConnection: close\r\n\r\n"
    );
    if stream.write_all(head.as_bytes()).await.is_ok()
        && stream.write_all(body.as_bytes()).await.is_ok()
    {
        let _ = stream.shutdown().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed;
    impl MetricsText for Fixed {
        fn encode_text(&self) -> Result<String, fmt::Error> {
            Ok("quire_up 1\n".to_owned())
        }
    }

    /// Readiness switched by the test.
    struct Switch(std::sync::Mutex<Readiness>);
    impl MetricsText for Switch {
        fn encode_text(&self) -> Result<String, fmt::Error> {
            Ok(String::new())
        }
        fn readiness(&self) -> Readiness {
            self.0.lock().expect("not poisoned").clone()
        }
    }

    #[test]
    fn routes_answer_healthz_ready_and_404() {
        let (status, _, body) = route("GET", "/healthz", &Fixed);
        assert_eq!((status, body.as_str()), ("200 OK", "ok\n"));
        let (status, _, body) = route("HEAD", "/healthz", &Fixed);
        assert_eq!((status, body.as_str()), ("200 OK", "ok\n"));
        let (status, _, body) = route("GET", "/ready", &Fixed);
        assert_eq!((status, body.as_str()), ("200 OK", "ready\n"));
        let not = Switch(std::sync::Mutex::new(Readiness::NotReady(
            "the log has failed:\nEIO".into(),
        )));
        let (status, _, body) = route("GET", "/ready", &not);
        assert_eq!(status, "503 Service Unavailable");
        assert_eq!(body, "not ready: the log has failed: EIO\n");
        let long = Switch(std::sync::Mutex::new(Readiness::NotReady(
            "é".repeat(READY_REASON_BYTES_MAX),
        )));
        let (_, _, body) = route("GET", "/ready", &long);
        assert!(body.len() <= READY_REASON_BYTES_MAX + "not ready: \n".len());
        for path in ["/", "/health", "/readyz", "/metrics/x"] {
            assert_eq!(route("GET", path, &Fixed).0, "404 Not Found", "{path}");
        }
        assert_eq!(route("PUT", "/ready", &Fixed).0, "405 Method Not Allowed");
    }

    #[tokio::test]
    async fn ready_follows_the_server_and_head_has_no_body() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = l.local_addr().expect("addr");
        let state = Arc::new(Switch(std::sync::Mutex::new(Readiness::NotReady(
            "no master known".into(),
        ))));
        let task = tokio::spawn(serve_metrics(l, state.clone()));
        let not = get(addr, "GET /ready HTTP/1.1\r\n\r\n").await;
        assert!(
            not.starts_with("HTTP/1.1 503 Service Unavailable\r\n"),
            "{not}"
        );
        assert!(
            not.ends_with("\r\n\r\nnot ready: no master known\n"),
            "{not}"
        );
        *state.0.lock().expect("not poisoned") = Readiness::Ready;
        let ready = get(addr, "GET /ready?x=1 HTTP/1.1\r\n\r\n").await;
        assert!(ready.starts_with("HTTP/1.1 200 OK\r\n"), "{ready}");
        let head = get(addr, "HEAD /healthz HTTP/1.1\r\n\r\n").await;
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(head.contains("Content-Length: 3\r\n"), "{head}");
        assert!(head.ends_with("\r\n\r\n"), "{head}");
        task.abort();
    }

    async fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut s = TcpStream::connect(addr).await.expect("connects");
        s.write_all(request.as_bytes()).await.expect("writes");
        let mut out = String::new();
        s.read_to_string(&mut out).await.expect("reads");
        out
    }

    #[tokio::test]
    async fn serves_metrics_and_refuses_the_rest() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = l.local_addr().expect("addr");
        let task = tokio::spawn(serve_metrics(l, Arc::new(Fixed)));
        let ok = get(addr, "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with("\r\n\r\nquire_up 1\n"), "{ok}");
        let other = get(addr, "GET /x HTTP/1.1\r\n\r\n").await;
        assert!(other.starts_with("HTTP/1.1 404"), "{other}");
        let post = get(addr, "POST /metrics HTTP/1.1\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405"), "{post}");
        let huge = format!(
            "GET /metrics HTTP/1.1\r\nX: {}",
            "a".repeat(HTTP_REQUEST_BYTES_MAX)
        );
        let mut s = TcpStream::connect(addr).await.expect("connects");
        s.write_all(huge.as_bytes()).await.expect("writes");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out).await;
        assert!(out.starts_with("HTTP/1.1 431"), "{out}");
        task.abort();
    }
}
