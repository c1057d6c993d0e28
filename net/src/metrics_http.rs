//! [`serve_metrics`]: the tiny HTTP/1.1 responder behind `GET /metrics`, one home for
//! quire-node and quire-broker (each passes its own registry as a [`MetricsText`]).
//!
//! It answers one request per connection (`Connection: close`), reads at most
//! [`HTTP_REQUEST_BYTES_MAX`] bytes of request head, gives a request at most
//! [`HTTP_TIMEOUT`] end to end, and serves at most [`HTTP_CONNECTIONS_MAX`] connections at
//! once (more wait in the listen backlog). `GET /metrics` gets the text; another path 404,
//! another method 405, an oversized head 431.

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

/// A set of metrics that renders itself in the Prometheus text format (version 0.0.4).
pub trait MetricsText: Send + Sync + 'static {
    /// The whole set, as text.
    ///
    /// # Errors
    /// Only if formatting fails.
    fn encode_text(&self) -> Result<String, fmt::Error>;
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
            respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                TEXT,
                "request head too large\n",
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
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => match metrics.encode_text() {
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
        ("GET", _) => (
            "404 Not Found",
            TEXT,
            "only /metrics is served here\n".to_owned(),
        ),
        _ => (
            "405 Method Not Allowed",
            TEXT,
            "only GET is served here\n".to_owned(),
        ),
    };
    respond(&mut stream, status, content_type, &body).await;
}

const TEXT: &str = "text/plain; charset=utf-8";

async fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
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
