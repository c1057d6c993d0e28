//! A small fault-injecting TCP proxy for multi-process tests: it listens on a loopback port,
//! forwards every connection to one target address, and can be switched at run time, for
//! each direction, between passing bytes, delaying them, resetting the connections, and
//! black-holing them.
//!
//! ```text
//!   client (a broker) ──> 127.0.0.1:P  [proxy]  ──> target (a store)
//!                          to_target: Pass | Delay | Drop | BlackHole
//!                          to_client: Pass | Delay | Drop | BlackHole
//! ```
//!
//! What each [`Fault`] does to the bytes of one direction:
//! - [`Fault::Pass`]: forwarded as they arrive.
//! - [`Fault::Delay`]: each chunk is forwarded its delay after the proxy read it, in order.
//! - [`Fault::BlackHole`]: the connection stays open but nothing is forwarded. The bytes
//!   already read are held (at most [`CHUNKS_QUEUED_MAX`] chunks of [`CHUNK_BYTES_MAX`]),
//!   then the proxy stops reading, so the sender's socket buffers fill as they would behind
//!   a partition that drops packets: TCP retransmits and nothing is lost. When the direction
//!   passes again, the held bytes go out first — like a partition that heals before TCP
//!   gives up.
//! - [`Fault::Drop`]: TCP has no one-way reset, so `Drop` in either direction resets the
//!   whole connection (RST to both ends, `SO_LINGER` 0), and every new connection is
//!   accepted and reset at once, until no direction is `Drop` any more.
//!
//! Connections the target refuses are reset at once. EOF from one end is passed on as a
//! half-close (`shutdown(Write)`) once the bytes before it were forwarded.
//!
//! Threads: one accepting, four per connection (a reader and a writer per direction), all
//! joined when the [`Proxy`] is dropped. Every blocking call has a timeout of [`POLL`], so
//! a switch or a stop is seen within it. Not a performance tool: a few connections between
//! brokers and stores on loopback.

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::SockRef;

/// Most bytes read in one chunk.
pub const CHUNK_BYTES_MAX: usize = 64 * 1024;
/// Most chunks read and not yet forwarded, per direction of one connection.
pub const CHUNKS_QUEUED_MAX: usize = 64;
/// Most connections at once; more are reset when accepted.
pub const CONNECTIONS_MAX: usize = 256;
/// How long the proxy waits for the target to accept a connection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// The timeout of every blocking call of the proxy's threads: how soon they see a switch
/// or a stop.
pub const POLL: Duration = Duration::from_millis(10);

/// What the proxy does to the bytes of one direction. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Fault {
    /// Forward bytes as they arrive.
    #[default]
    Pass,
    /// Forward each chunk this long after it was read.
    Delay(Duration),
    /// Reset every connection (both directions) and every new one.
    Drop,
    /// Keep the connection, forward nothing; held bytes go out when the direction heals.
    BlackHole,
}

/// One direction of a proxied connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// From the client (who connected to the proxy) to the target.
    ToTarget,
    /// From the target back to the client.
    ToClient,
}

/// Counters of a [`Proxy`], for tests to see what went through.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Connections accepted from clients.
    pub connections_accepted: u64,
    /// Connections reset by the proxy (a `Drop` fault, a refused target, a limit).
    pub connections_reset: u64,
    /// Bytes forwarded to the target.
    pub bytes_to_target: u64,
    /// Bytes forwarded to clients.
    pub bytes_to_client: u64,
}

#[derive(Debug)]
struct State {
    to_target: Fault,
    to_client: Fault,
    stop: bool,
    conns: Vec<Arc<Conn>>,
    threads: Vec<JoinHandle<()>>,
}

impl State {
    fn fault(&self, d: Direction) -> Fault {
        match d {
            Direction::ToTarget => self.to_target,
            Direction::ToClient => self.to_client,
        }
    }

    fn drops(&self) -> bool {
        self.to_target == Fault::Drop || self.to_client == Fault::Drop
    }
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    reset: AtomicU64,
    to_target: AtomicU64,
    to_client: AtomicU64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    /// Notified on every switch and at stop.
    changed: Condvar,
    counters: Counters,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A proxy thread that panicked holds no invariant the others rely on.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// One proxied connection: the client's socket and the target's.
#[derive(Debug)]
struct Conn {
    client: TcpStream,
    target: TcpStream,
    dead: AtomicBool,
}

impl Conn {
    fn side(&self, d: Direction) -> (&TcpStream, &TcpStream) {
        match d {
            Direction::ToTarget => (&self.client, &self.target),
            Direction::ToClient => (&self.target, &self.client),
        }
    }

    /// Resets both ends: `SO_LINGER` 0 (the close sends RST) and `shutdown(Read)`, which
    /// wakes this connection's threads; the sockets close when the last of them exits.
    /// Counted in `reset` (before the reset goes out) unless it was dead already.
    fn kill(&self, counters: &Counters) {
        if self.dead.swap(true, Ordering::SeqCst) {
            return;
        }
        counters.reset.fetch_add(1, Ordering::SeqCst);
        for s in [&self.client, &self.target] {
            reset(s);
        }
    }

    fn is_dead(&self) -> bool {
        self.dead.load(Ordering::SeqCst)
    }
}

fn reset(s: &TcpStream) {
    // Errors mean the socket is already gone: nothing more to reset.
    let _ = SockRef::from(s).set_linger(Some(Duration::ZERO));
    let _ = s.shutdown(std::net::Shutdown::Read);
}

/// A running proxy. Dropping it stops it: connections are reset, threads joined.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    target: String,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

impl Proxy {
    /// Listens on `127.0.0.1:0` and forwards connections to `target` (`host:port`), every
    /// direction passing.
    ///
    /// # Errors
    /// The listener cannot be bound or configured, or the thread cannot be spawned.
    pub fn start(target: &str) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                to_target: Fault::Pass,
                to_client: Fault::Pass,
                stop: false,
                conns: Vec::new(),
                threads: Vec::new(),
            }),
            changed: Condvar::new(),
            counters: Counters::default(),
        });
        let target_addr = target.to_owned();
        let sh = shared.clone();
        let acceptor = std::thread::Builder::new()
            .name(format!("proxy-{}", addr.port()))
            .spawn(move || accept_loop(&listener, &target_addr, &sh))?;
        Ok(Proxy {
            addr,
            target: target.to_owned(),
            shared,
            acceptor: Some(acceptor),
        })
    }

    /// The address clients connect to (`127.0.0.1:port`).
    #[must_use]
    pub fn addr(&self) -> String {
        self.addr.to_string()
    }

    /// The address connections are forwarded to.
    #[must_use]
    pub fn target(&self) -> &str {
        &self.target
    }

    /// Switches one direction. A `Drop` resets the live connections at once; any other
    /// switch applies to the bytes not yet forwarded.
    pub fn set(&self, direction: Direction, fault: Fault) {
        let mut st = self.shared.lock();
        match direction {
            Direction::ToTarget => st.to_target = fault,
            Direction::ToClient => st.to_client = fault,
        }
        self.apply(&mut st);
    }

    /// Switches both directions.
    pub fn set_both(&self, fault: Fault) {
        let mut st = self.shared.lock();
        st.to_target = fault;
        st.to_client = fault;
        self.apply(&mut st);
    }

    /// Both directions pass again.
    pub fn heal(&self) {
        self.set_both(Fault::Pass);
    }

    /// The fault of one direction now.
    #[must_use]
    pub fn fault(&self, direction: Direction) -> Fault {
        self.shared.lock().fault(direction)
    }

    /// Connections open now.
    #[must_use]
    pub fn connections_live(&self) -> usize {
        self.shared
            .lock()
            .conns
            .iter()
            .filter(|c| !c.is_dead())
            .count()
    }

    /// What went through so far.
    #[must_use]
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            connections_accepted: c.accepted.load(Ordering::SeqCst),
            connections_reset: c.reset.load(Ordering::SeqCst),
            bytes_to_target: c.to_target.load(Ordering::SeqCst),
            bytes_to_client: c.to_client.load(Ordering::SeqCst),
        }
    }

    fn apply(&self, st: &mut State) {
        if st.drops() {
            for c in st.conns.drain(..) {
                c.kill(&self.shared.counters);
            }
        }
        self.shared.changed.notify_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let threads = {
            let mut st = self.shared.lock();
            st.stop = true;
            for c in st.conns.drain(..) {
                c.kill(&self.shared.counters);
            }
            std::mem::take(&mut st.threads)
        };
        self.shared.changed.notify_all();
        if let Some(a) = self.acceptor.take() {
            let _ = a.join();
        }
        // The acceptor may have spawned more before it saw the stop.
        let late = std::mem::take(&mut self.shared.lock().threads);
        for t in threads.into_iter().chain(late) {
            let _ = t.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, target: &str, shared: &Arc<Shared>) {
    loop {
        if shared.lock().stop {
            return;
        }
        match listener.accept() {
            Ok((client, _)) => {
                shared.counters.accepted.fetch_add(1, Ordering::SeqCst);
                serve(client, target, shared);
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                std::thread::sleep(POLL);
            }
            Err(_) => std::thread::sleep(POLL),
        }
    }
}

/// Connects `client` to the target and starts its four threads, or resets it (a `Drop`
/// fault, the connection limit, the target refusing).
fn serve(client: TcpStream, target: &str, shared: &Arc<Shared>) {
    let refuse = |s: &TcpStream| {
        shared.counters.reset.fetch_add(1, Ordering::SeqCst);
        reset(s);
    };
    {
        let st = shared.lock();
        if st.drops() || st.stop || st.conns.len() >= CONNECTIONS_MAX {
            refuse(&client);
            return;
        }
    }
    let upstream = target
        .parse::<SocketAddr>()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, CONNECT_TIMEOUT).ok());
    let Some(upstream) = upstream else {
        refuse(&client);
        return;
    };
    let configured = [&client, &upstream].iter().all(|s| {
        s.set_nonblocking(false).is_ok()
            && s.set_nodelay(true).is_ok()
            && s.set_read_timeout(Some(POLL)).is_ok()
            && s.set_write_timeout(Some(POLL)).is_ok()
    });
    if !configured {
        refuse(&client);
        reset(&upstream);
        return;
    }
    let conn = Arc::new(Conn {
        client,
        target: upstream,
        dead: AtomicBool::new(false),
    });
    let mut st = shared.lock();
    // A switch to Drop may have come while connecting: it must reset this one too.
    if st.drops() || st.stop {
        conn.kill(&shared.counters);
        return;
    }
    st.threads.retain(|t| !t.is_finished());
    st.conns.retain(|c| !c.is_dead());
    for d in [Direction::ToTarget, Direction::ToClient] {
        let (tx, rx) = sync_channel::<Chunk>(CHUNKS_QUEUED_MAX);
        let (c1, c2, s1, s2) = (conn.clone(), conn.clone(), shared.clone(), shared.clone());
        let reader = std::thread::Builder::new()
            .name("proxy-read".into())
            .spawn(move || pump_in(&c1, d, &tx, &s1));
        let writer = std::thread::Builder::new()
            .name("proxy-write".into())
            .spawn(move || pump_out(&c2, d, &rx, &s2));
        match (reader, writer) {
            (Ok(r), Ok(w)) => st.threads.extend([r, w]),
            (r, w) => {
                conn.kill(&shared.counters);
                st.threads.extend(r.into_iter().chain(w));
                return;
            }
        }
    }
    st.conns.push(conn);
}

/// Bytes read from one end, with when they were read.
struct Chunk {
    read_at: Instant,
    bytes: Vec<u8>,
}

/// Reads one direction's source into the queue until EOF (the queue closes: the writer
/// half-closes its end) or an error (the connection is reset).
fn pump_in(conn: &Conn, d: Direction, tx: &SyncSender<Chunk>, shared: &Shared) {
    let (mut src, _) = conn.side(d);
    let mut buf = vec![0u8; CHUNK_BYTES_MAX];
    while !conn.is_dead() {
        match src.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                let chunk = Chunk {
                    read_at: Instant::now(),
                    bytes: buf[..n].to_vec(),
                };
                if send_chunk(conn, tx, chunk).is_err() {
                    return;
                }
            }
            Err(e) if is_timeout(&e) => {}
            Err(_) => {
                conn.kill(&shared.counters);
                return;
            }
        }
    }
}

/// Queues a chunk, waiting (a bounded step at a time) while the queue is full.
fn send_chunk(conn: &Conn, tx: &SyncSender<Chunk>, mut chunk: Chunk) -> Result<(), ()> {
    loop {
        match tx.try_send(chunk) {
            Ok(()) => return Ok(()),
            Err(std::sync::mpsc::TrySendError::Full(c)) => {
                if conn.is_dead() {
                    return Err(());
                }
                chunk = c;
                std::thread::sleep(POLL);
            }
            Err(std::sync::mpsc::TrySendError::Disconnected(_)) => return Err(()),
        }
    }
}

/// Forwards the queue to one direction's destination as the fault allows.
fn pump_out(conn: &Conn, d: Direction, rx: &Receiver<Chunk>, shared: &Shared) {
    let (_, mut dst) = conn.side(d);
    let counter = match d {
        Direction::ToTarget => &shared.counters.to_target,
        Direction::ToClient => &shared.counters.to_client,
    };
    loop {
        let chunk = match rx.recv_timeout(POLL) {
            Ok(c) => c,
            Err(RecvTimeoutError::Timeout) => {
                if conn.is_dead() || shared.lock().stop {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => {
                if !conn.is_dead() {
                    let _ = dst.shutdown(std::net::Shutdown::Write);
                }
                return;
            }
        };
        if !wait_until_due(conn, d, chunk.read_at, shared) {
            return;
        }
        let mut pos = 0;
        while pos < chunk.bytes.len() {
            if conn.is_dead() {
                return;
            }
            match dst.write(&chunk.bytes[pos..]) {
                Ok(0) => {
                    conn.kill(&shared.counters);
                    return;
                }
                Ok(n) => {
                    pos += n;
                    counter.fetch_add(n as u64, Ordering::SeqCst);
                }
                Err(e) if is_timeout(&e) => {}
                Err(_) => {
                    conn.kill(&shared.counters);
                    return;
                }
            }
        }
    }
}

/// Waits until the direction's fault lets a chunk read at `read_at` go; `false` if the
/// connection died or the proxy stopped meanwhile.
fn wait_until_due(conn: &Conn, d: Direction, read_at: Instant, shared: &Shared) -> bool {
    let mut st = shared.lock();
    loop {
        if st.stop || conn.is_dead() {
            return false;
        }
        let wait = match st.fault(d) {
            Fault::Pass => return true,
            Fault::Delay(delay) => {
                let due = read_at + delay;
                let now = Instant::now();
                if now >= due {
                    return true;
                }
                (due - now).min(POLL)
            }
            // `Drop` resets the connection as it is set; until this thread sees it, hold.
            Fault::BlackHole | Fault::Drop => POLL,
        };
        st = match shared.changed.wait_timeout(st, wait) {
            Ok((g, _)) => g,
            Err(poisoned) => poisoned.into_inner().0,
        };
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How long a test waits for something that must happen.
    const WAIT: Duration = Duration::from_secs(10);
    /// How long a test watches for something that must not happen.
    const QUIET: Duration = Duration::from_millis(300);

    /// An echo server on loopback that counts the bytes it received; stops on drop.
    struct Echo {
        addr: String,
        received: Arc<AtomicU64>,
        stop: Arc<AtomicBool>,
        thread: Option<JoinHandle<()>>,
    }

    impl Echo {
        fn start() -> Echo {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            listener.set_nonblocking(true).expect("nonblocking");
            let addr = listener.local_addr().expect("addr").to_string();
            let received = Arc::new(AtomicU64::new(0));
            let stop = Arc::new(AtomicBool::new(false));
            let (r, s) = (received.clone(), stop.clone());
            let thread = std::thread::spawn(move || {
                let mut conns = Vec::new();
                while !s.load(Ordering::SeqCst) {
                    if let Ok((c, _)) = listener.accept() {
                        let (r, s) = (r.clone(), s.clone());
                        conns.push(std::thread::spawn(move || echo(c, &r, &s)));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                for c in conns {
                    let _ = c.join();
                }
            });
            Echo {
                addr,
                received,
                stop,
                thread: Some(thread),
            }
        }

        fn received(&self) -> u64 {
            self.received.load(Ordering::SeqCst)
        }
    }

    impl Drop for Echo {
        fn drop(&mut self) {
            self.stop.store(true, Ordering::SeqCst);
            if let Some(t) = self.thread.take() {
                let _ = t.join();
            }
        }
    }

    fn echo(c: TcpStream, received: &AtomicU64, stop: &AtomicBool) {
        c.set_nonblocking(false).expect("blocking");
        c.set_read_timeout(Some(POLL)).expect("timeout");
        let mut buf = [0u8; 4096];
        let mut c = c;
        while !stop.load(Ordering::SeqCst) {
            match c.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => {
                    received.fetch_add(n as u64, Ordering::SeqCst);
                    if c.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
                Err(e) if is_timeout(&e) => {}
                Err(_) => return,
            }
        }
    }

    fn connect(addr: &str) -> TcpStream {
        let s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        s
    }

    fn read_exact_within(
        s: &mut TcpStream,
        n: usize,
        within: Duration,
    ) -> std::io::Result<Vec<u8>> {
        s.set_read_timeout(Some(within))?;
        let mut buf = vec![0u8; n];
        s.read_exact(&mut buf)?;
        Ok(buf)
    }

    fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
        let deadline = Instant::now() + WAIT;
        while !cond() {
            assert!(Instant::now() < deadline, "{what} within {WAIT:?}");
            std::thread::sleep(POLL);
        }
    }

    #[test]
    fn passes_bytes_both_ways_and_counts_them() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        assert_eq!(proxy.target(), echo.addr);
        let mut c = connect(&proxy.addr());
        let msg: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let writer = {
            let mut w = c.try_clone().expect("clone");
            let msg = msg.clone();
            std::thread::spawn(move || w.write_all(&msg).expect("write"))
        };
        let back = read_exact_within(&mut c, msg.len(), WAIT).expect("echoed");
        writer.join().expect("writer");
        assert_eq!(back, msg);
        // Counted after each write returns: the client may read before the count.
        wait_for("every byte is counted", || {
            let st = proxy.stats();
            st.bytes_to_target == msg.len() as u64 && st.bytes_to_client == msg.len() as u64
        });
        assert_eq!(proxy.stats().connections_accepted, 1);
        assert_eq!(proxy.connections_live(), 1);
    }

    #[test]
    fn delay_holds_each_chunk_at_least_its_delay() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        let delay = Duration::from_millis(250);
        proxy.set(Direction::ToTarget, Fault::Delay(delay));
        assert_eq!(proxy.fault(Direction::ToTarget), Fault::Delay(delay));
        assert_eq!(proxy.fault(Direction::ToClient), Fault::Pass);
        let mut c = connect(&proxy.addr());
        let sent = Instant::now();
        c.write_all(b"ping").expect("write");
        let back = read_exact_within(&mut c, 4, WAIT).expect("echoed");
        assert_eq!(back, b"ping");
        // A lower bound only: the proxy cannot forward a chunk before its delay.
        assert!(
            sent.elapsed() >= delay,
            "answered after {:?}",
            sent.elapsed()
        );
    }

    #[test]
    fn black_hole_to_target_holds_bytes_and_heal_delivers_them() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        let mut c = connect(&proxy.addr());
        c.write_all(b"a").expect("write");
        assert_eq!(read_exact_within(&mut c, 1, WAIT).expect("echo"), b"a");
        proxy.set(Direction::ToTarget, Fault::BlackHole);
        c.write_all(b"held").expect("write");
        let err = read_exact_within(&mut c, 4, QUIET).expect_err("nothing comes back");
        assert!(is_timeout(&err), "{err:?}");
        assert_eq!(echo.received(), 1, "the target got nothing new");
        assert_eq!(proxy.connections_live(), 1, "the connection stays open");
        proxy.heal();
        assert_eq!(read_exact_within(&mut c, 4, WAIT).expect("echo"), b"held");
        assert_eq!(echo.received(), 5);
    }

    #[test]
    fn black_hole_to_client_only_lets_requests_through() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        proxy.set(Direction::ToClient, Fault::BlackHole);
        let mut c = connect(&proxy.addr());
        c.write_all(b"one-way").expect("write");
        wait_for("the target gets the bytes", || echo.received() == 7);
        let err = read_exact_within(&mut c, 7, QUIET).expect_err("no answer comes back");
        assert!(is_timeout(&err), "{err:?}");
        assert_eq!(proxy.stats().bytes_to_client, 0);
        proxy.set(Direction::ToClient, Fault::Pass);
        assert_eq!(
            read_exact_within(&mut c, 7, WAIT).expect("echo"),
            b"one-way"
        );
    }

    #[test]
    fn black_hole_applies_to_new_connections_too() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        proxy.set_both(Fault::BlackHole);
        let mut c = connect(&proxy.addr());
        c.write_all(b"x").expect("write");
        let err = read_exact_within(&mut c, 1, QUIET).expect_err("nothing");
        assert!(is_timeout(&err), "{err:?}");
        assert_eq!(echo.received(), 0);
        proxy.heal();
        assert_eq!(read_exact_within(&mut c, 1, WAIT).expect("echo"), b"x");
    }

    /// Whether the peer of `s` closed it: a read ends with EOF or a reset, not a timeout.
    fn closed_by_peer(s: &mut TcpStream) -> bool {
        s.set_read_timeout(Some(WAIT)).expect("timeout");
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !is_timeout(&e),
        }
    }

    #[test]
    fn drop_resets_live_and_new_connections_until_healed() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        let mut live = connect(&proxy.addr());
        live.write_all(b"a").expect("write");
        assert_eq!(read_exact_within(&mut live, 1, WAIT).expect("echo"), b"a");
        // One direction is enough: TCP has no one-way reset.
        proxy.set(Direction::ToClient, Fault::Drop);
        assert!(closed_by_peer(&mut live), "the live connection is reset");
        assert_eq!(proxy.connections_live(), 0);
        let mut fresh = connect(&proxy.addr());
        assert!(closed_by_peer(&mut fresh), "a new connection is reset");
        assert!(proxy.stats().connections_reset >= 2);
        proxy.heal();
        let mut after = connect(&proxy.addr());
        after.write_all(b"b").expect("write");
        assert_eq!(read_exact_within(&mut after, 1, WAIT).expect("echo"), b"b");
    }

    #[test]
    fn a_refusing_target_resets_the_client() {
        // A port nobody listens on: bind one, then free it.
        let dead = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a port")
            .to_string();
        let proxy = Proxy::start(&dead).expect("proxy");
        let mut c = connect(&proxy.addr());
        assert!(closed_by_peer(&mut c));
        wait_for("the reset is counted", || {
            proxy.stats().connections_reset == 1
        });
    }

    #[test]
    fn eof_is_passed_on_as_a_half_close() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        let mut c = connect(&proxy.addr());
        c.write_all(b"bye").expect("write");
        c.shutdown(std::net::Shutdown::Write).expect("half-close");
        let mut all = Vec::new();
        c.read_to_end(&mut all).expect("reads to EOF");
        assert_eq!(all, b"bye", "the echo answered, then closed on our EOF");
    }

    #[test]
    fn dropping_the_proxy_closes_its_connections() {
        let echo = Echo::start();
        let proxy = Proxy::start(&echo.addr).expect("proxy");
        let mut c = connect(&proxy.addr());
        c.write_all(b"a").expect("write");
        assert_eq!(read_exact_within(&mut c, 1, WAIT).expect("echo"), b"a");
        let addr = proxy.addr();
        drop(proxy);
        assert!(closed_by_peer(&mut c));
        assert!(
            TcpStream::connect(&addr).is_err(),
            "nobody listens any more"
        );
    }
}
