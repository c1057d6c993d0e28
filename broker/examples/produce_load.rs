//! A rough load generator for the broker's produce path (the real benchmark is
//! `quire bench cluster`): N producer threads, each keeping W requests of B messages of S
//! bytes in flight against the master, for D seconds; prints acknowledged messages per
//! second and the produce latency percentiles.
//!
//! ```text
//! cargo run --release -p quire-broker --example produce_load -- ADDR [N W B S D]
//! ```

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use quire_proto::{decode, encode, Body, Frame, ProduceRequest, RequestId};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:7201".into());
    let num = |i: usize, d: u64| args.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (producers, window, batch, size, secs) =
        (num(1, 4), num(2, 8), num(3, 64), num(4, 1024), num(5, 5));
    let deadline = Instant::now() + Duration::from_secs(secs);
    let start = Instant::now();
    // Producer ids unique to this run: the broker deduplicates by (producer id, sequence).
    let base = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        << 8;
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            let addr = addr.clone();
            std::thread::spawn(move || run(&addr, base + p + 1, window, batch, size, deadline))
        })
        .collect();
    let mut acked = 0u64;
    let mut lat: Vec<Duration> = Vec::new();
    for t in threads {
        let (a, l) = t.join().expect("producer thread");
        acked += a;
        lat.extend(l);
    }
    let took = start.elapsed().as_secs_f64();
    lat.sort();
    let pct = |q: f64| {
        lat.get(((lat.len() as f64 * q) as usize).min(lat.len().saturating_sub(1)))
            .copied()
            .unwrap_or_default()
    };
    println!(
        "{acked} messages of {size} B acked in {took:.2} s: {:.0} msg/s, {:.1} MB/s; latency p50 {:?} p99 {:?} p99.9 {:?}",
        acked as f64 / took,
        acked as f64 * size as f64 / took / 1e6,
        pct(0.5),
        pct(0.99),
        pct(0.999)
    );
}

fn run(
    addr: &str,
    p: u64,
    window: u64,
    batch: u64,
    size: u64,
    deadline: Instant,
) -> (u64, Vec<Duration>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_nodelay(true).expect("nodelay");
    let msg = Bytes::from(vec![b'x'; size as usize]);
    let mut inflight: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut buf = BytesMut::with_capacity(1 << 20);
    let mut out = BytesMut::new();
    let mut seq = 0u64;
    let mut id = 1u64;
    let mut acked = 0u64;
    let mut lat = Vec::new();
    loop {
        while inflight.len() < window as usize && Instant::now() < deadline {
            let req = ProduceRequest {
                format: quire_proto::MessageFormat::Raw,
                topic: format!("load{}", p % 3),
                producer_id: p,
                sequence: seq,
                messages: vec![msg.clone(); batch as usize],
            };
            seq += batch;
            out.clear();
            encode(&Frame::new(RequestId(id), req), &mut out).expect("encode");
            s.write_all(&out).expect("write");
            inflight.push_back((id, Instant::now()));
            id += 1;
        }
        let Some((want, sent)) = inflight.pop_front() else {
            return (acked, lat);
        };
        loop {
            match decode(&mut buf).expect("decode") {
                Some(f) => {
                    assert_eq!(f.request_id.0, want, "answers come in order");
                    match f.body {
                        Body::ProduceResponse(r) => acked += u64::from(r.count),
                        other => panic!("produce answered {other:?}"),
                    }
                    lat.push(sent.elapsed());
                    break;
                }
                None => {
                    let mut chunk = [0u8; 65536];
                    let n = s.read(&mut chunk).expect("read");
                    assert!(n > 0, "closed");
                    buf.extend_from_slice(&chunk[..n]);
                }
            }
        }
    }
}
