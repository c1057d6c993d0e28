//! Prints a store's log: one line per event with its epoch, offset, kind and, for messages
//! and epoch starts, what they carry. A debugging aid.
//!
//! ```text
//! cargo run -p quire-broker --example dump_log -- STORE_ADDR [FROM [COUNT]]
//! ```

use quire_client::StoreClient;
use quire_proto::{EventBody, Offset};

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let addr = args
        .first()
        .cloned()
        .unwrap_or_else(|| "127.0.0.1:7101".into());
    let mut next = Offset(args.get(1).and_then(|s| s.parse().ok()).unwrap_or(0));
    let count: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(u64::MAX);
    let end = next.0.saturating_add(count);
    let store = StoreClient::connect(addr.as_str()).await?;
    let tail = store.tail().await?;
    println!(
        "# {addr}: last {:?} promised {} hwm {:?}",
        tail.last, tail.promised, tail.hwm
    );
    while next.0 < end {
        let r = store.read(next, 4096, 8 << 20).await?;
        if r.events.is_empty() {
            break;
        }
        for e in &r.events {
            if e.offset.0 >= end {
                break;
            }
            let what = match EventBody::decode(e.kind, &e.payload) {
                Ok(EventBody::Message(m)) => format!(
                    "message topic={} producer={} seq={} {:?}",
                    m.topic,
                    m.producer_id,
                    m.sequence,
                    String::from_utf8_lossy(&m.message)
                ),
                Ok(EventBody::EpochStart(s)) => {
                    format!(
                        "epoch-start epoch={} broker={} voters={}",
                        s.epoch,
                        s.broker.0,
                        s.voters.len()
                    )
                }
                Ok(other) => format!("{other:?}"),
                Err(err) => format!("undecodable: {err}"),
            };
            println!("{:>8} e={:<8} {what}", e.offset.0, e.epoch.0);
        }
        next = Offset(r.events.last().map_or(next.0, |e| e.offset.0) + 1);
    }
    Ok(())
}
