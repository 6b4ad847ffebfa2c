//! A TCP proxy for tests that can turn into a black hole: [`BlackHoleProxy`].

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

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
/// Each connection is relayed by two threads; every thread stops, and every socket is
/// closed, when the proxy is dropped.
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
        let target = *lock(&shared.target);
        let upstream = target.and_then(|t| TcpStream::connect_timeout(&t, POLL * 100).ok());
        let mut threads = lock(&shared.threads);
        let Some(upstream) = upstream else {
            // NOTE: held open, silent, until the proxy stops.
            let shared = Arc::clone(shared);
            threads.push(std::thread::spawn(move || hold(&client, &shared)));
            continue;
        };
        let silenced = Arc::new(AtomicBool::new(false));
        lock(&shared.silenced).push(Arc::clone(&silenced));
        for (from, to) in [
            (client.try_clone(), upstream.try_clone()),
            (upstream.try_clone(), client.try_clone()),
        ] {
            let (Ok(from), Ok(to)) = (from, to) else {
                continue;
            };
            let (shared, silenced) = (Arc::clone(shared), Arc::clone(&silenced));
            threads.push(std::thread::spawn(move || {
                relay(from, to, &silenced, &shared);
            }));
        }
    }
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
fn relay(mut from: TcpStream, mut to: TcpStream, silenced: &AtomicBool, shared: &Shared) {
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
                if to.write_all(&buffer[..n]).is_err() {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
    }
    if !silenced.load(Ordering::Acquire) {
        let _ = to.shutdown(Shutdown::Write);
    }
}
