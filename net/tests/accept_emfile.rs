//! The acceptor out of file descriptors: `accept()` fails with EMFILE while a connection
//! waits in the backlog, and the loop must pause between attempts instead of spinning (the
//! listener stays readable, so a loop without the pause retries at once, forever). Once a
//! descriptor is free again, the waiting connection is accepted.
//!
//! This file holds one test on purpose: it lowers its own process's `RLIMIT_NOFILE`, and
//! each integration-test file is its own process under `cargo test` and nextest alike.

#![allow(clippy::unwrap_used, clippy::expect_used)] // test code: a panic is a test failure

use std::time::{Duration, Instant};

use quire_net::{AcceptMetrics, Acceptor, ConnectionLimit, ACCEPT_ERROR_BACKOFF};
use tokio::net::{TcpListener, TcpStream};

/// Descriptors open in this process now.
fn open_fds() -> u64 {
    std::fs::read_dir("/proc/self/fd")
        .expect("/proc/self/fd")
        .count() as u64
}

fn set_soft_nofile(soft: u64) {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `l` is a valid, writable rlimit for getrlimit to fill.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) }, 0);
    let lowered = libc::rlimit {
        rlim_cur: soft,
        rlim_max: l.rlim_max,
    };
    // SAFETY: `lowered` is a valid rlimit; setrlimit only reads it.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
}

#[test]
fn accept_out_of_descriptors_pauses_and_recovers() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let addr = listener.local_addr().expect("addr");
        let metrics = AcceptMetrics::default();
        let mut acceptor = Acceptor::new(listener, ConnectionLimit::new(10, 0, metrics.clone()));
        // The client's socket exists before the limit drops; the server side's accept then
        // needs one descriptor more than the process may have.
        let _client = TcpStream::connect(addr).await.expect("connects");
        let mut filler = Vec::new();
        set_soft_nofile(open_fds() + 8);
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => filler.push(f),
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                    break;
                }
            }
        }
        assert!(!filler.is_empty());

        // Out of descriptors: accept keeps failing; the acceptor pauses between tries.
        let started = Instant::now();
        let watch = Duration::from_millis(600);
        let outcome = tokio::time::timeout(watch, acceptor.accept()).await;
        assert!(outcome.is_err(), "accepted with no descriptor free");
        let errors = metrics.accept_errors.get();
        let elapsed = started.elapsed();
        assert!(errors >= 1, "no accept error counted");
        // A loop without the pause would fail thousands of times in this while.
        let most = elapsed.as_millis() as u64 / ACCEPT_ERROR_BACKOFF.as_millis() as u64 + 2;
        assert!(
            errors <= most,
            "{errors} failed accepts in {elapsed:?}: the loop does not pause"
        );

        // A descriptor comes free: the waiting connection is accepted.
        filler.pop();
        let (_stream, peer, permit) =
            tokio::time::timeout(Duration::from_secs(10), acceptor.accept())
                .await
                .expect("accepted once a descriptor is free");
        assert!(!permit.is_on_probation());
        assert!(peer.ip().is_loopback());
    });
}
