//! One connection: its header read timeout, its eviction, and the service hyper calls for
//! each of its requests.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
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
use pin_project_lite::pin_project;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};
use tower::util::Oneshot;

use super::config::{Abandoned, ServerConfig};
use super::registry::{Busy, Registry, Track};

/// A bound on how long the idle check waits after the deadline before closing, so that a
/// process resumed after `SIGSTOP` (every timer expired at once) reads what arrived while it
/// was stopped before judging the connection idle.
const IDLE_GRACE: Duration = Duration::from_millis(20);

pub(super) struct Connection {
    pub(super) stream: TcpStream,
    pub(super) remote: SocketAddr,
    pub(super) router: Router,
    pub(super) config: ServerConfig,
    pub(super) builder: Arc<auto::Builder<TokioExecutor>>,
    pub(super) track: Arc<Track>,
    pub(super) registry: Arc<Registry>,
    pub(super) draining: watch::Receiver<bool>,
}

impl Connection {
    pub(super) async fn serve(self) {
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
            abandoned: config.abandoned(),
            track: Arc::clone(&track),
        };
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        tokio::pin!(conn);
        let timeout = config.header_read_timeout();
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
                        registry.header_timeout();
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
        // NOTE: the peer address where the layers read it (a `SocketAddr`: the overload
        // layer's caller key, `--key ip`), and as axum's `ConnectInfo` for handlers that
        // extract it, as `axum::serve` with connect info gives.
        request.extensions_mut().insert(self.remote);
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
