//! Network faults between brokers and stores: a fault-injecting [`Proxy`] between **each**
//! broker and **each** store, so a test can cut one broker (the master) off from a chosen
//! set of stores while the other brokers still reach them.
//!
//! ```text
//!   broker 1 ──> proxy(1,0) ──> store 0        broker 2 ──> proxy(2,0) ──> store 0
//!            ──> proxy(1,1) ──> store 1                 ──> proxy(2,1) ──> store 1
//!            ──> proxy(1,2) ──> store 2                 ──> proxy(2,2) ──> store 2
//! ```
//!
//! Each broker is started with its own proxies' addresses as `--stores`, in the same slot
//! order as its peers (the broker checks every store's identity per slot, so addresses may
//! differ: docs/protocol.md, "Data directory"). Broker-to-broker traffic is not proxied.
//! The proxies live as long as the [`StoreLinks`]; drop it after the cluster's processes,
//! or at the end of the test (a dropped proxy resets its connections).

use std::collections::BTreeMap;

use crate::cluster::Cluster;
use crate::proxy::{Direction, Fault, Proxy};

/// One proxy per (broker, store).
#[derive(Debug)]
pub struct StoreLinks {
    links: BTreeMap<(u16, usize), Proxy>,
}

impl StoreLinks {
    /// Puts a proxy between every broker of `cluster` and every store, and points each
    /// broker's `--stores` at its own proxies. Call it before the brokers first start.
    pub fn install(cluster: &mut Cluster) -> StoreLinks {
        let targets: Vec<String> = cluster.stores.iter().map(|s| s.addr.clone()).collect();
        let mut links = BTreeMap::new();
        for b in &mut cluster.brokers {
            let mut addrs = Vec::with_capacity(targets.len());
            for (i, t) in targets.iter().enumerate() {
                let p = Proxy::start(t).expect("a proxy on loopback");
                addrs.push(p.addr());
                links.insert((b.id, i), p);
            }
            b.set_stores(&addrs);
        }
        StoreLinks { links }
    }

    /// The proxy between `broker` and store `store`.
    pub fn link(&self, broker: u16, store: usize) -> &Proxy {
        self.links
            .get(&(broker, store))
            .unwrap_or_else(|| panic!("no link from broker {broker} to store {store}"))
    }

    /// Applies `fault` to both directions between `broker` and each of `stores`.
    pub fn cut(&self, broker: u16, stores: &[usize], fault: Fault) {
        for &s in stores {
            self.link(broker, s).set_both(fault);
        }
    }

    /// Applies `fault` to one direction between `broker` and each of `stores`
    /// ([`Direction::ToTarget`]: broker to store).
    pub fn cut_one_way(&self, broker: u16, stores: &[usize], direction: Direction, fault: Fault) {
        for &s in stores {
            self.link(broker, s).set(direction, fault);
        }
    }

    /// Every link passes again.
    pub fn heal_all(&self) {
        for p in self.links.values() {
            p.heal();
        }
    }

    /// Bytes forwarded so far from `broker` to store `store` and back.
    pub fn bytes(&self, broker: u16, store: usize) -> (u64, u64) {
        let st = self.link(broker, store).stats();
        (st.bytes_to_target, st.bytes_to_client)
    }
}
