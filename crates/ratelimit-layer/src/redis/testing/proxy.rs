//! A TCP proxy for tests that can add latency, and turn into a black hole:
//! [`BlackHoleProxy`].

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::time::Instant;

use super::process::pause;

/// How often an idle relay thread looks at the proxy's state.
const POLL: Duration = Duration::from_millis(10);

/// A TCP proxy on 127.0.0.1 that forwards every connection to a target, until it is told
/// to black-hole them: then it stops forwarding, in both directions, *without closing
/// anything*, as a network does when a firewall forgets a flow or a failover moves the
/// address (the client sees no error, only silence). New connections are then accepted and
/// held silent too, until the proxy is told to forward new connections to an address
/// again; the connections it black-holed stay silent for good.
///
/// It can also hold every reply for a while ([`set_latency`](Self::set_latency)), as a
/// Redis further away would: each round trip then takes that much longer, and commands
/// sent meanwhile are still forwarded at once (pipelined), as over a real network.
///
/// Each connection is relayed by three threads (one each way, and one that writes the
/// replies when they are due); every thread stops, and every socket is closed, when the
/// proxy is dropped.
///
/// ```no_run
/// use ratelimit_layer::redis::testing::{BlackHoleProxy, RedisServer};
///
/// let redis = RedisServer::start();
/// let proxy = BlackHoleProxy::start(redis.addr());
/// // ... clients connect to `proxy.url()`; then the path goes silent:
/// proxy.black_hole();
/// // ... and comes back, to another server:
/// let other = RedisServer::start();
/// proxy.forward_to(other.addr());
/// ```
#[derive(Debug)]
pub struct BlackHoleProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: Option<JoinHandle<()>>,
}

#[derive(Debug)]
struct Shared {
    /// Where new connections go; `None`: held silent.
    target: Mutex<Option<SocketAddr>>,
    /// One flag per connection forwarded so far: set, it forwards nothing more.
    silenced: Mutex<Vec<Arc<AtomicBool>>>,
    /// The threads that relay or hold connections.
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// How long every reply is held before it is forwarded, nanoseconds.
    latency: AtomicU64,
    stop: AtomicBool,
}

impl BlackHoleProxy {
    /// A proxy on a free port of 127.0.0.1 that forwards to `target`.
    ///
    /// # Panics
    ///
    /// When it cannot listen.
    pub fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .unwrap_or_else(|e| panic!("the proxy cannot listen on 127.0.0.1: {e}"));
        let addr = listener
            .local_addr()
            .expect("a bound listener has an address");
        listener
            .set_nonblocking(true)
            .expect("a listener can be made non-blocking");
        let shared = Arc::new(Shared {
            target: Mutex::new(Some(target)),
            silenced: Mutex::new(Vec::new()),
            threads: Mutex::new(Vec::new()),
            latency: AtomicU64::new(0),
            stop: AtomicBool::new(false),
        });
        let acceptor = {
            let shared = Arc::clone(&shared);
            std::thread::spawn(move || accept(&listener, &shared))
        };
        Self {
            addr,
            shared,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's address.
    pub const fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://` and the proxy's address.
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Stops forwarding on every connection open now, for good, and holds new ones silent,
    /// closing none.
    pub fn black_hole(&self) {
        *lock(&self.shared.target) = None;
        for flag in lock(&self.shared.silenced).iter() {
            flag.store(true, Ordering::Release);
        }
    }

    /// Forwards new connections to `target`; those black-holed stay silent.
    pub fn forward_to(&self, target: SocketAddr) {
        *lock(&self.shared.target) = Some(target);
    }

    /// Holds every reply read from now on for `latency` before it is forwarded, on every
    /// connection: a round trip takes `latency` longer (plus a few tens of microseconds of
    /// the threads' own, and the scheduler's delays on a loaded machine). Zero, the
    /// default, forwards at once.
    pub fn set_latency(&self, latency: Duration) {
        let nanos = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX);
        self.shared.latency.store(nanos, Ordering::Release);
    }
}

impl Drop for BlackHoleProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        let threads = std::mem::take(&mut *lock(&self.shared.threads));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

fn accept(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::Acquire) {
        let client = match listener.accept() {
            Ok((client, _)) => client,
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                pause(POLL);
                continue;
            }
            Err(_) => continue,
        };
        let _ = client.set_nonblocking(false);
        // NOTE: no Nagle delay, as the client's own socket: a reply written while the one
        // before is unacknowledged would otherwise wait for the client's delayed ACK (up to
        // 40 ms), which a network does not add.
        let _ = client.set_nodelay(true);
        let target = *lock(&shared.target);
        let upstream = target.and_then(|t| TcpStream::connect_timeout(&t, POLL * 100).ok());
        let mut threads = lock(&shared.threads);
        if let Some(upstream) = &upstream {
            let _ = upstream.set_nodelay(true);
        }
        let Some(upstream) = upstream else {
            // NOTE: held open, silent, until the proxy stops.
            let shared = Arc::clone(shared);
            threads.push(std::thread::spawn(move || hold(&client, &shared)));
            continue;
        };
        let silenced = Arc::new(AtomicBool::new(false));
        lock(&shared.silenced).push(Arc::clone(&silenced));
        let (Ok(client_reader), Ok(upstream_writer), Ok(upstream_reader)) = (
            client.try_clone(),
            upstream.try_clone(),
            upstream.try_clone(),
        ) else {
            continue;
        };
        // Commands go straight through; replies through a writer that holds each one for
        // the latency.
        let (replies, due) = mpsc::channel();
        let relays: [Box<dyn FnOnce() + Send>; 3] = {
            let (s1, s2, s3) = (Arc::clone(shared), Arc::clone(shared), Arc::clone(shared));
            let (f1, f2, f3) = (
                Arc::clone(&silenced),
                Arc::clone(&silenced),
                Arc::clone(&silenced),
            );
            [
                Box::new(move || {
                    relay(client_reader, &Forward::Now(upstream_writer), &f1, &s1);
                }),
                Box::new(move || relay(upstream_reader, &Forward::Later(replies), &f2, &s2)),
                Box::new(move || write_when_due(&due, client, &f3, &s3)),
            ]
        };
        for relay in relays {
            threads.push(std::thread::spawn(relay));
        }
    }
}

/// Where a relay puts what it reads.
enum Forward {
    /// Written at once.
    Now(TcpStream),
    /// Handed to [`write_when_due`] with the time it was read.
    Later(Sender<(Instant, Vec<u8>)>),
}

/// Keeps `stream` open, reading nothing, until the proxy stops.
fn hold(stream: &TcpStream, shared: &Shared) {
    while !shared.stop.load(Ordering::Acquire) {
        pause(POLL);
    }
    let _ = stream.shutdown(Shutdown::Both);
}

/// Copies `from` to `to` until either closes, the connection is silenced (then it reads
/// nothing more, and keeps both open), or the proxy stops.
fn relay(mut from: TcpStream, to: &Forward, silenced: &AtomicBool, shared: &Shared) {
    let _ = from.set_read_timeout(Some(POLL));
    let mut buffer = [0u8; 16 * 1024];
    while !shared.stop.load(Ordering::Acquire) {
        if silenced.load(Ordering::Acquire) {
            pause(POLL);
            continue;
        }
        match from.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => {
                // NOTE: bytes read just before the silence are dropped, as a black hole
                // would.
                if silenced.load(Ordering::Acquire) {
                    continue;
                }
                let sent = match to {
                    Forward::Now(to) => (&mut &*to).write_all(&buffer[..n]).is_ok(),
                    Forward::Later(to) => to.send((Instant::now(), buffer[..n].to_vec())).is_ok(),
                };
                if !sent {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    if let Forward::Now(to) = to {
        if !silenced.load(Ordering::Acquire) {
            let _ = to.shutdown(Shutdown::Write);
        }
    }
}

/// Writes each chunk of replies to `to` once the proxy's latency has passed since it was
/// read, in order, until the relay that reads them ends (then closes `to`'s writing half,
/// unless silenced), or the proxy stops.
fn write_when_due(
    due: &Receiver<(Instant, Vec<u8>)>,
    mut to: TcpStream,
    silenced: &AtomicBool,
    shared: &Shared,
) {
    while !shared.stop.load(Ordering::Acquire) {
        let (read, bytes) = match due.recv_timeout(POLL) {
            Ok(chunk) => chunk,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => {
                if !silenced.load(Ordering::Acquire) {
                    let _ = to.shutdown(Shutdown::Write);
                }
                return;
            }
        };
        let latency = Duration::from_nanos(shared.latency.load(Ordering::Acquire));
        let wait = (read + latency).saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            pause(wait);
        }
        if silenced.load(Ordering::Acquire) {
            continue;
        }
        if to.write_all(&bytes).is_err() {
            return;
        }
    }
}
