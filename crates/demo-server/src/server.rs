//! The demo server's connection handling: the accept loop around [`app()`](crate::app()).
//!
//! `axum::serve` is a fine default, but the demo server needs four things it does not do:
//!
//! - **the article's semantics for abandoned requests** ([`Abandoned`]): a request whose
//!   bytes reached the server is worked on to the end even when its client has gone, as in
//!   the article's Go server and most thread-pool servers;
//! - **a header read timeout**: a connection that has no request in progress must deliver a
//!   request's headers within [`ServerConfig::header_read_timeout`], or it is closed;
//! - **a cap on open connections** that keeps `/healthz` answering under a flood of idle or
//!   slow connections ([`ServerConfig::max_connections`]);
//! - counters of the connections closed by each rule ([`ConnectionStats`]).
//!
//! It keeps what `axum::serve` gives: HTTP/1 and HTTP/2 on one port (hyper-util's `auto`
//! connection builder), the client's address as [`ConnectInfo<SocketAddr>`] in every
//! request's extensions (what `into_make_service_with_connect_info` provides, and what
//! `--key ip` reads), and graceful shutdown (stop accepting, let requests in progress finish,
//! close idle connections).
//!
//! # Why requests of closed connections did not reach the model
//!
//! hyper's HTTP/1 connection calls the service as soon as it has parsed a request's headers,
//! and reads on while the response is prepared, to notice a client that goes away. When the
//! read finds the end of the stream, hyper ends the connection (unless half-close is allowed)
//! and drops the response future, and hyper-util's Tower adapter only calls the Tower service
//! from inside that future. A client that timed out while the server was stopped has closed
//! its connection, so on resume the server reads its request and its FIN together: the
//! request was parsed, and then dropped before any of the application ran. With
//! [`Abandoned::Serve`] the request is handed to its own task in the very call hyper makes, so
//! it runs to the end whatever happens to the connection; with [`Abandoned::Cancel`] (hyper's
//! own behaviour) it does not.
//!
//! # Example
//!
//! ```no_run
//! use demo_server::app::{AppConfig, app};
//! use demo_server::model::{LatencyModel, Model};
//! use demo_server::server::{Server, ServerConfig, listen};
//!
//! # #[tokio::main]
//! # async fn main() -> std::io::Result<()> {
//! let listener = listen("127.0.0.1:8070".parse().unwrap(), 4096)?;
//! let router = app(AppConfig::new(Model::new(LatencyModel::default())));
//! let server = Server::new(listener, router, ServerConfig::new());
//! server.run(async { let _ = tokio::signal::ctrl_c().await; }).await
//! # }
//! ```

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::ConnectInfo;
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use overload_core::ConfigError;
use overload_core::clock::{Clock, TokioClock};
use pin_project_lite::pin_project;
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tower::util::Oneshot;

/// Names of the connection metrics, recorded through the `metrics` facade.
pub mod metric_names {
    /// Counter of connections the server closed on its own, labelled `reason`:
    /// `header_timeout` (no complete request headers in time) or `evicted` (closed to make
    /// room under the connection cap).
    pub const CONNECTIONS_CLOSED: &str = "demo_server_connections_closed_total";
    /// Gauge: open connections, set by the `demo-server` binary once a second.
    pub const CONNECTIONS_OPEN: &str = "demo_server_connections_open";
}

/// What the server does with a request whose client went away.
///
/// - [`Abandoned::Serve`] (the default): every request whose headers reached the server is
///   worked on to the end, even when its client has closed its connection (before the server
///   read the request, while the request waited in the kernel's listen queue, or while it was
///   in the model). Its response goes nowhere. This is the article's server (Go's `net/http`,
///   whose handler runs to its end whatever the connection does) and any thread-pool server
///   whose database query outlives its caller. Abandoned work keeps counting toward the
///   model's concurrency and slows everyone else down: it is what lets fixed-interval retries
///   keep a server down after a pause.
/// - [`Abandoned::Cancel`]: hyper's behaviour. When hyper sees a connection end (an HTTP/1
///   read that finds the end of the stream while a request is in progress, an HTTP/2 stream
///   reset), it drops the request's future, and the model's work for it stops at once; a
///   request read together with its client's FIN never starts. A server that cancels
///   abandoned work is much harder to collapse: timed-out attempts leave instead of piling up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Abandoned {
    /// Work on every received request to the end. The default.
    #[default]
    Serve,
    /// Stop working on a request when its connection ends (hyper's behaviour).
    Cancel,
}

/// How [`Server`] handles connections. Build with [`ServerConfig::new`] (the defaults) or
/// [`ServerConfig::builder`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerConfig {
    abandoned: Abandoned,
    max_connections: NonZeroUsize,
    header_read_timeout: Duration,
}

impl ServerConfig {
    /// The default header read timeout: 10 seconds (the project's design; hyper's own
    /// default is 30 s, Go's `net/http` has none).
    pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

    /// The default cap on open connections: 10 000. Far above what the demo needs (1000
    /// clients and a 4096-connection listen queue), and under the descriptor limits of
    /// current systems; the binary lowers it when the process may not open that many files.
    pub const DEFAULT_MAX_CONNECTIONS: NonZeroUsize = NonZeroUsize::new(10_000).unwrap();

    /// The defaults: [`Abandoned::Serve`], [`DEFAULT_MAX_CONNECTIONS`](Self::DEFAULT_MAX_CONNECTIONS)
    /// and [`DEFAULT_HEADER_READ_TIMEOUT`](Self::DEFAULT_HEADER_READ_TIMEOUT).
    pub const fn new() -> Self {
        Self {
            abandoned: Abandoned::Serve,
            max_connections: Self::DEFAULT_MAX_CONNECTIONS,
            header_read_timeout: Self::DEFAULT_HEADER_READ_TIMEOUT,
        }
    }

    /// A builder starting from the defaults.
    pub const fn builder() -> ServerConfigBuilder {
        ServerConfigBuilder {
            config: Self::new(),
        }
    }

    /// What happens to requests whose client went away.
    pub const fn abandoned(&self) -> Abandoned {
        self.abandoned
    }

    /// The most connections open at once.
    ///
    /// When a new connection arrives and this many are open, the server closes the one that
    /// has waited longest without a request in progress (idle keep-alive connections and
    /// clients that have not finished sending their headers), so a flood of slow or silent
    /// connections cannot lock out `/healthz` or anyone else. When every open connection has
    /// a request in progress, new connections wait in the listen queue until one ends.
    pub const fn max_connections(&self) -> NonZeroUsize {
        self.max_connections
    }

    /// How long a connection without a request in progress may take to deliver a complete
    /// request head, counted from its accept or from the end of its previous response.
    ///
    /// It covers HTTP/1 and HTTP/2 alike (and a client that never says which it speaks). As
    /// with hyper's own header timeout, it also bounds how long a keep-alive connection may
    /// stay idle between requests.
    pub const fn header_read_timeout(&self) -> Duration {
        self.header_read_timeout
    }
}

impl Default for ServerConfig {
    /// The same as [`ServerConfig::new`].
    fn default() -> Self {
        Self::new()
    }
}

/// Builds a [`ServerConfig`]; every setter starts from the defaults.
#[derive(Clone, Copy, Debug)]
pub struct ServerConfigBuilder {
    config: ServerConfig,
}

impl ServerConfigBuilder {
    /// What happens to requests whose client went away. Default: [`Abandoned::Serve`].
    pub const fn abandoned(mut self, abandoned: Abandoned) -> Self {
        self.config.abandoned = abandoned;
        self
    }

    /// The cap on open connections; see [`ServerConfig::max_connections`]. Default: 10 000.
    pub const fn max_connections(mut self, max: NonZeroUsize) -> Self {
        self.config.max_connections = max;
        self
    }

    /// The header read timeout; see [`ServerConfig::header_read_timeout`]. Default: 10 s.
    pub const fn header_read_timeout(mut self, timeout: Duration) -> Self {
        self.config.header_read_timeout = timeout;
        self
    }

    /// Checks the settings.
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming `header_read_timeout` when it is zero (every connection
    /// would be closed before its first request).
    pub fn build(self) -> Result<ServerConfig, ConfigError> {
        if self.config.header_read_timeout.is_zero() {
            return Err(ConfigError::out_of_range(
                "header_read_timeout",
                self.config.header_read_timeout,
                "greater than zero",
            ));
        }
        Ok(self.config)
    }
}

/// Binds `addr` and listens with a queue of `backlog` connections (the kernel caps it at
/// `net.core.somaxconn`, 4096 on current Linux).
///
/// # Errors
///
/// When the socket cannot be created, bound (the address is in use, or not this machine's)
/// or put in the listening state.
pub fn listen(addr: SocketAddr, backlog: u32) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // NOTE: as std's `TcpListener::bind` does on Unix; it does not let two servers listen on
    // one port, so a busy port is still an error.
    #[cfg(unix)]
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(backlog)
}

/// Counts of the connections a [`Server`] has open and has closed on its own. Clones share
/// the counts.
#[derive(Clone, Debug, Default)]
pub struct ConnectionStats {
    inner: Arc<StatsInner>,
}

#[derive(Debug, Default)]
struct StatsInner {
    open: AtomicUsize,
    header_timeouts: AtomicU64,
    evicted: AtomicU64,
}

impl ConnectionStats {
    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner.open.load(Ordering::Relaxed)
    }

    /// Connections closed because no complete request head arrived in time, since start.
    pub fn header_timeouts(&self) -> u64 {
        self.inner.header_timeouts.load(Ordering::Relaxed)
    }

    /// Connections closed to make room under the connection cap, since start.
    pub fn evicted(&self) -> u64 {
        self.inner.evicted.load(Ordering::Relaxed)
    }
}

/// The demo server: an accept loop serving a [`Router`] under a [`ServerConfig`].
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    router: Router,
    config: ServerConfig,
    registry: Arc<Registry>,
}

impl Server {
    /// A server for `router` on `listener` (see [`listen`] for a listener with a chosen
    /// listen queue).
    pub fn new(listener: TcpListener, router: Router, config: ServerConfig) -> Self {
        Self {
            listener,
            router,
            config,
            registry: Arc::new(Registry::default()),
        }
    }

    /// The address the server listens on.
    ///
    /// # Errors
    ///
    /// When the operating system cannot tell (it always can for a bound TCP socket).
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The connection counts, shared with the running server.
    pub fn stats(&self) -> ConnectionStats {
        self.registry.stats.clone()
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets requests in progress
    /// finish (closing idle connections at once) and returns once every connection is
    /// closed. Requests detached by [`Abandoned::Serve`] whose connection is already gone are
    /// not waited for.
    ///
    /// # Errors
    ///
    /// None today: accept errors (a full descriptor table, a connection reset before it was
    /// accepted) are logged and retried, as a server must. The `Result` leaves room for
    /// fatal errors.
    pub async fn run<F>(self, shutdown: F) -> std::io::Result<()>
    where
        F: Future<Output = ()> + Send,
    {
        let Self {
            listener,
            router,
            config,
            registry,
        } = self;
        let (draining, drain_rx) = watch::channel(false);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        // NOTE: the header timeout is enforced per connection below, for HTTP/1 and HTTP/2
        // alike; hyper's own applies to HTTP/1 only and needs a timer, which is not set.
        builder.http1().keep_alive(true);
        let builder = Arc::new(builder);
        let clock = TokioClock::new();
        tokio::pin!(shutdown);
        loop {
            let accepted = tokio::select! {
                biased;
                () = &mut shutdown => break,
                accepted = listener.accept() => accepted,
            };
            let (stream, remote) = match accepted {
                Ok(accepted) => accepted,
                Err(e) if is_per_connection_error(&e) => continue,
                Err(e) => {
                    // Out of descriptors or memory: wait a little for connections to close
                    // rather than spin.
                    tracing::warn!(error = %e, "accept failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // NOTE: at the cap, the new connection waits here, accepted but not read, until
            // an idle one is closed or a busy one ends; meanwhile nothing else is accepted,
            // so later ones wait in the listen queue.
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                () = registry.make_room(config.max_connections.get()) => {}
            }
            let track = registry.register(clock);
            let connection = Connection {
                stream,
                remote,
                router: router.clone(),
                config,
                builder: Arc::clone(&builder),
                track,
                registry: Arc::clone(&registry),
                draining: drain_rx.clone(),
            };
            tokio::spawn(connection.serve());
        }
        drop(listener);
        draining.send_replace(true);
        registry.closed_all().await;
        Ok(())
    }
}

fn is_per_connection_error(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{ConnectionAborted, ConnectionRefused, ConnectionReset};
    matches!(
        e.kind(),
        ConnectionAborted | ConnectionRefused | ConnectionReset
    )
}

/// The open connections, for the cap and for shutdown.
#[derive(Debug, Default)]
struct Registry {
    conns: Mutex<HashMap<u64, Arc<Track>>>,
    next_id: AtomicU64,
    /// Signalled when a connection closes or has no request in progress any more.
    changed: Arc<Changes>,
    stats: ConnectionStats,
}

/// A signal for the accept loop and the shutdown, cheap for the requests that raise it.
#[derive(Debug, Default)]
struct Changes {
    notify: Notify,
    /// Tasks waiting for a change. Requests end far more often than anyone waits (only at
    /// the connection cap and at shutdown), so they skip `Notify`'s lock when none does.
    waiting: AtomicUsize,
}

impl Changes {
    /// Wakes the waiting tasks, if any. `SeqCst`, with the waiter's side: either the waiter
    /// sees the change, or this sees the waiter.
    fn raise(&self) {
        if self.waiting.load(Ordering::SeqCst) > 0 {
            self.notify.notify_waiters();
        }
    }

    /// Returns once `done` holds, checking it again after every change.
    async fn until(&self, mut done: impl FnMut() -> bool) {
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        loop {
            let changed = self.notify.notified();
            tokio::pin!(changed);
            // NOTE: registered before the check, so a change between the check and the
            // wait is not missed.
            changed.as_mut().enable();
            if done() {
                return;
            }
            changed.await;
        }
    }
}

/// Counts a task in [`Changes::waiting`] while it lives (also when its future is dropped).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Registry {
    fn register(self: &Arc<Self>, clock: TokioClock) -> Arc<Track> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let track = Arc::new(Track {
            id,
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(clock.now()),
            clock,
            evict: Notify::new(),
            changes: Arc::clone(&self.changed),
        });
        let mut conns = self.lock();
        conns.insert(id, Arc::clone(&track));
        self.stats.inner.open.store(conns.len(), Ordering::Relaxed);
        track
    }

    fn remove(&self, id: u64) {
        let mut conns = self.lock();
        conns.remove(&id);
        self.stats.inner.open.store(conns.len(), Ordering::Relaxed);
        drop(conns);
        self.changed.raise();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Track>>> {
        // NOTE: no code path panics while holding the lock, and the map stays consistent
        // at every step anyway.
        self.conns.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Returns once fewer than `max` connections are open, closing the connection idle the
    /// longest when there is one to make room.
    async fn make_room(&self, max: usize) {
        self.changed
            .until(|| self.lock().len() < max || self.evict_one())
            .await;
    }

    /// Closes the connection without a request in progress that has been idle longest;
    /// `false` if every open connection has a request in progress.
    fn evict_one(&self) -> bool {
        let mut conns = self.lock();
        let victim = conns
            .values()
            .filter(|t| t.in_flight.load(Ordering::SeqCst) == 0)
            .min_by_key(|t| t.idle_since.load(Ordering::Acquire))
            .map(|t| t.id);
        let Some(id) = victim else {
            return false;
        };
        // NOTE: removed now, not when its task ends, so the next accept does not evict
        // another one for the same room.
        if let Some(track) = conns.remove(&id) {
            self.stats.inner.open.store(conns.len(), Ordering::Relaxed);
            // `notify_one` stores a permit if the task is not waiting right now.
            track.evict.notify_one();
            self.stats.inner.evicted.fetch_add(1, Ordering::Relaxed);
            metrics::counter!(metric_names::CONNECTIONS_CLOSED, "reason" => "evicted").increment(1);
        }
        true
    }

    async fn closed_all(&self) {
        self.changed.until(|| self.lock().is_empty()).await;
    }
}

/// One connection's state, shared between its task, its requests and the registry.
#[derive(Debug)]
struct Track {
    id: u64,
    /// Requests in progress: from the call hyper makes until their response body is done.
    in_flight: AtomicUsize,
    /// When the connection last had no request in progress (clock nanoseconds).
    idle_since: AtomicU64,
    clock: TokioClock,
    evict: Notify,
    changes: Arc<Changes>,
}

impl Track {
    fn begin(self: &Arc<Self>) -> Busy {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        Busy {
            track: Arc::clone(self),
        }
    }

    /// How long the connection has had no request in progress; `None` while it has one.
    fn idle_for(&self) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let since = self.idle_since.load(Ordering::Acquire);
        Some(Duration::from_nanos(self.clock.now().saturating_sub(since)))
    }
}

/// A request in progress on a connection; ends when dropped.
#[derive(Debug)]
struct Busy {
    track: Arc<Track>,
}

impl Drop for Busy {
    fn drop(&mut self) {
        let t = &self.track;
        // NOTE: the time is stored before the count drops, so a reader that sees the
        // connection idle also sees when it became idle.
        t.idle_since.store(t.clock.now(), Ordering::Release);
        if t.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            t.changes.raise();
        }
    }
}

/// A bound on how long the idle check waits after the deadline before closing, so that a
/// process resumed after `SIGSTOP` (every timer expired at once) reads what arrived while it
/// was stopped before judging the connection idle.
const IDLE_GRACE: Duration = Duration::from_millis(20);

struct Connection {
    stream: TcpStream,
    remote: SocketAddr,
    router: Router,
    config: ServerConfig,
    builder: Arc<auto::Builder<TokioExecutor>>,
    track: Arc<Track>,
    registry: Arc<Registry>,
    draining: watch::Receiver<bool>,
}

impl Connection {
    async fn serve(self) {
        let Self {
            stream,
            remote,
            router,
            config,
            builder,
            track,
            registry,
            mut draining,
        } = self;
        let _registered = Registered {
            registry: &registry,
            id: track.id,
        };
        let _ = stream.set_nodelay(true);
        let service = ConnectionService {
            router,
            remote,
            abandoned: config.abandoned,
            track: Arc::clone(&track),
        };
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(conn);
        let timeout = config.header_read_timeout;
        let mut shutting_down = *draining.borrow();
        if shutting_down {
            conn.as_mut().graceful_shutdown();
        }
        let mut grace = false;
        loop {
            let now = Instant::now();
            let wake = match track.idle_for() {
                _ if grace => now + IDLE_GRACE,
                Some(idle) => now + timeout.saturating_sub(idle),
                // A request is in progress: look again one timeout from now.
                None => now + timeout,
            };
            tokio::select! {
                // NOTE: the connection first, so that bytes already read are parsed (and make
                // the connection busy) before the idle check can close it.
                biased;
                _ = conn.as_mut() => return,
                () = track.evict.notified() => return,
                changed = draining.changed(), if !shutting_down => {
                    if changed.is_err() || *draining.borrow() {
                        conn.as_mut().graceful_shutdown();
                        shutting_down = true;
                    }
                }
                () = sleep_until(wake) => {
                    let expired = track.idle_for().is_some_and(|idle| idle >= timeout);
                    if expired && grace {
                        registry.stats.inner.header_timeouts.fetch_add(1, Ordering::Relaxed);
                        metrics::counter!(metric_names::CONNECTIONS_CLOSED, "reason" => "header_timeout")
                            .increment(1);
                        tracing::debug!(%remote, "no request head within the header read timeout; closing");
                        return;
                    }
                    grace = expired;
                }
            }
        }
    }
}

/// Removes a connection from the registry when its task ends, however it ends.
struct Registered<'a> {
    registry: &'a Registry,
    id: u64,
}

impl Drop for Registered<'_> {
    fn drop(&mut self) {
        self.registry.remove(self.id);
    }
}

/// The service hyper calls for each request of one connection.
#[derive(Clone)]
struct ConnectionService {
    router: Router,
    remote: SocketAddr,
    abandoned: Abandoned,
    track: Arc<Track>,
}

impl hyper::service::Service<Request<Incoming>> for ConnectionService {
    type Response = Response<TrackedBody>;
    type Error = Infallible;
    type Future = ResponseFuture;

    fn call(&self, mut request: Request<Incoming>) -> Self::Future {
        let busy = self.track.begin();
        request.extensions_mut().insert(ConnectInfo(self.remote));
        let request = request.map(Body::new);
        let work = Oneshot::new(self.router.clone(), request);
        let answer = match self.abandoned {
            Abandoned::Cancel => Answer::Inline { work },
            // NOTE: spawned here, in the call hyper makes when it has parsed the request head,
            // not when the response future is first polled: hyper may drop that future
            // unpolled (see the module docs).
            Abandoned::Serve => Answer::Detached {
                task: tokio::spawn(work),
            },
        };
        ResponseFuture {
            answer,
            busy: Some(busy),
        }
    }
}

pin_project! {
    #[project = AnswerProj]
    enum Answer {
        Inline { #[pin] work: Oneshot<Router, Request<Body>> },
        Detached { #[pin] task: JoinHandle<Result<Response<Body>, Infallible>> },
    }
}

pin_project! {
    /// The response future of one request: the router's answer, with the connection marked
    /// busy until the response body is done.
    struct ResponseFuture {
        #[pin]
        answer: Answer,
        busy: Option<Busy>,
    }
}

impl Future for ResponseFuture {
    type Output = Result<Response<TrackedBody>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let response = match this.answer.project() {
            AnswerProj::Inline { work } => match ready!(work.poll(cx)) {
                Ok(response) => response,
                Err(never) => match never {},
            },
            AnswerProj::Detached { task } => match ready!(task.poll(cx)) {
                Ok(Ok(response)) => response,
                Ok(Err(never)) => match never {},
                Err(e) => {
                    tracing::warn!(error = %e, "a request's task failed");
                    let mut response = Response::new(Body::from("request task failed\n"));
                    *response.status_mut() = StatusCode::INTERNAL_SERVER_ERROR;
                    response
                }
            },
        };
        let busy = this.busy.take();
        Poll::Ready(Ok(response.map(|inner| TrackedBody { inner, busy })))
    }
}

pin_project! {
    /// A response body that keeps its connection marked busy until hyper is done with it.
    struct TrackedBody {
        #[pin]
        inner: Body,
        busy: Option<Busy>,
    }
}

impl hyper::body::Body for TrackedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = ready!(this.inner.poll_frame(cx));
        if frame.is_none() {
            // NOTE: the connection is idle from the end of the body, not from when hyper
            // drops it (it may keep it until the next request).
            this.busy.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.inner.size_hint()
    }
}

/// Raises the process's soft limit on open files to its hard limit, as Go's runtime does
/// at startup (so the article's server could hold as many connections), and returns the
/// limit now in force; `None` when there is no limit.
///
/// # Errors
///
/// When the limit cannot be raised (the current one stays in force).
pub fn raise_open_files_limit() -> std::io::Result<Option<u64>> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    if limit.current == limit.maximum {
        return Ok(limit.current);
    }
    let raised = rustix::process::Rlimit {
        current: limit.maximum,
        maximum: limit.maximum,
    };
    setrlimit(Resource::Nofile, raised)?;
    Ok(limit.maximum)
}

/// The most connections a process allowed `open_files` descriptors should hold: the
/// limit minus a reserve for everything else (the listener, standard streams, logs, the
/// `--downstream` client's connections): a tenth of the limit, at least 64. At least 1.
pub fn connections_within(open_files: u64) -> usize {
    let reserve = (open_files / 10).max(64);
    usize::try_from(open_files.saturating_sub(reserve))
        .unwrap_or(usize::MAX)
        .max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_stated() {
        let c = ServerConfig::default();
        assert_eq!(c.abandoned(), Abandoned::Serve);
        assert_eq!(c.max_connections().get(), 10_000);
        assert_eq!(c.header_read_timeout(), Duration::from_secs(10));
        assert_eq!(ServerConfig::builder().build().unwrap(), c);
    }

    #[test]
    fn a_zero_header_timeout_is_refused_by_name() {
        let err = ServerConfig::builder()
            .header_read_timeout(Duration::ZERO)
            .build()
            .unwrap_err();
        assert_eq!(err.field(), "header_read_timeout");
        assert!(err.to_string().contains("greater than zero"), "{err}");
    }

    #[test]
    fn the_connection_cap_leaves_room_for_other_descriptors() {
        assert_eq!(connections_within(20_000), 18_000);
        assert_eq!(connections_within(1024), 922);
        assert_eq!(connections_within(10), 1);
    }
}
