//! The simulation's transport: an in-process hop to a server service, behind a [`Gate`]
//! that stops and resumes the whole server like SIGSTOP and SIGCONT.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, ready};

use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tower::BoxError;
use tower_service::Service;

use super::DemoBody;

/// What the in-process server does with a request whose client has given up (dropped the
/// response future, after a timeout): the same choice, with the same default, as
/// `demo-server --abandoned`. [`Abandoned::Serve`] works on it to the end and answers into
/// the void; [`Abandoned::Cancel`] drops it as soon as the server runs, as hyper does when it
/// sees the connection close (a stopped server sees it on resume).
pub use demo_server::server::Abandoned;

/// The listen queue and the process state of an in-process server: pausing it behaves like
/// SIGSTOP on a server process, in front of all its middleware.
///
/// While paused, a new request waits in a backlog of at most `limit` requests, like a
/// connection in the kernel's listen queue; a request arriving to a full backlog is never
/// seen by the server (the kernel drops the SYN) and waits until its client gives up. On
/// resume the backlog enters the server at once. Clones share the gate.
#[derive(Debug, Clone)]
pub struct Gate {
    state: Arc<GateState>,
}

#[derive(Debug)]
struct GateState {
    paused: std::sync::atomic::AtomicBool,
    // NOTE: a `Notify`, whose `notify_waiters` wakes the requests in the order they queued,
    // as the kernel's listen queue hands connections over; a `watch` channel spreads its
    // waiters over shards picked at random, and the order they entered on resume (which of
    // them get a rate limit's first tokens, or expire first) changed from run to run.
    resumed: tokio::sync::Notify,
    backlog: std::sync::atomic::AtomicUsize,
    limit: usize,
}

impl Gate {
    /// A running gate whose backlog holds at most `limit` requests.
    pub fn new(limit: usize) -> Self {
        Self {
            state: Arc::new(GateState {
                paused: std::sync::atomic::AtomicBool::new(false),
                resumed: tokio::sync::Notify::new(),
                backlog: std::sync::atomic::AtomicUsize::new(0),
                limit,
            }),
        }
    }

    /// Stops the server (SIGSTOP).
    pub fn pause(&self) {
        self.state.paused.store(true, Ordering::Release);
    }

    /// Resumes the server (SIGCONT): the backlog enters.
    pub fn resume(&self) {
        self.state.paused.store(false, Ordering::Release);
        self.state.resumed.notify_waiters();
    }

    /// Whether the server is stopped.
    pub fn is_paused(&self) -> bool {
        self.state.paused.load(Ordering::Acquire)
    }

    /// Requests waiting in the backlog.
    pub fn backlog(&self) -> usize {
        self.state.backlog.load(Ordering::Relaxed)
    }

    async fn running(&self) {
        loop {
            // NOTE: registered before the flag is read, so a resume between the two is not
            // missed.
            let resumed = self.state.resumed.notified();
            tokio::pin!(resumed);
            resumed.as_mut().enable();
            if !self.is_paused() {
                return;
            }
            resumed.await;
        }
    }

    /// Takes a place in the backlog, or `false` when it is full.
    fn enqueue(&self) -> bool {
        self.state
            .backlog
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.state.limit).then_some(n + 1)
            })
            .is_ok()
    }

    fn dequeue(&self) {
        self.state.backlog.fetch_sub(1, Ordering::AcqRel);
    }
}

/// An in-process hop to a server service, for the simulation.
///
/// Each request is served on its own task, as a connection would be, behind a [`Gate`] that
/// stops and resumes the whole server. Its body is read at once, as it would be sent at once
/// over a socket, so the client side never waits on the server to release it (a retry
/// layer's replayable body needs the previous attempt's copy back). What happens to a request whose client gives up is
/// chosen by [`Abandoned`].
#[derive(Debug, Clone)]
pub struct Loopback<S> {
    inner: S,
    gate: Gate,
    abandoned: Abandoned,
}

impl<S> Loopback<S> {
    /// A hop to `server` behind `gate`.
    pub const fn new(server: S, gate: Gate, abandoned: Abandoned) -> Self {
        Self {
            inner: server,
            gate,
            abandoned,
        }
    }

    overload_core::define_inner_service_accessors!();
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Loopback<S>
where
    S: Service<Request<DemoBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError> + Send,
    ReqBody: Body + Send + 'static,
    ReqBody::Data: Send,
    ReqBody::Error: Into<BoxError>,
    ResBody: Send + 'static,
{
    type Response = Response<ResBody>;
    type Error = BoxError;
    type Future = LoopbackFuture<ResBody>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // NOTE: readiness is the server's business, on its own task, as over a network.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let (mut tx, rx) = oneshot::channel();
        let server = self.inner.clone();
        let gate = self.gate.clone();
        let abandoned = self.abandoned;
        tokio::spawn(async move {
            // The request is on the wire at once: its body is read now, and the client's
            // copy released, whatever the server does with it later.
            let (parts, body) = request.into_parts();
            let body = match http_body_util::BodyExt::collect(body).await {
                Ok(collected) => collected.to_bytes(),
                Err(e) => {
                    let _ = tx.send(Err(e.into()));
                    return;
                }
            };
            let request = Request::from_parts(parts, Full::new(body));
            if gate.is_paused() {
                if !gate.enqueue() {
                    // The listen queue is full: the kernel drops the connection attempt, the
                    // server never sees this request, and its client waits until it gives up.
                    tx.closed().await;
                    return;
                }
                gate.running().await;
                gate.dequeue();
                if abandoned == Abandoned::Cancel && tx.is_closed() {
                    // Accepted on resume, its connection already closed: dropped at once.
                    return;
                }
            }
            let serve = tower::ServiceExt::oneshot(server, request);
            let result = match abandoned {
                Abandoned::Serve => serve.await.map_err(Into::into),
                Abandoned::Cancel => {
                    tokio::pin!(serve);
                    tokio::select! {
                        biased;
                        result = &mut serve => result.map_err(Into::into),
                        () = tx.closed() => {
                            // A stopped server only notices the closed connection on resume.
                            gate.running().await;
                            return;
                        }
                    }
                }
            };
            // The client may have given up; the work is done either way.
            let _ = tx.send(result);
        });
        LoopbackFuture { rx }
    }
}

pin_project! {
    /// The response future of [`Loopback`].
    #[derive(Debug)]
    pub struct LoopbackFuture<B> {
        #[pin]
        rx: oneshot::Receiver<Result<Response<B>, BoxError>>,
    }
}

impl<B> Future for LoopbackFuture<B> {
    type Output = Result<Response<B>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match ready!(self.project().rx.poll(cx)) {
            Ok(result) => Poll::Ready(result),
            Err(_) => Poll::Ready(Err("the simulated server dropped the request".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::convert::Infallible;
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;
    use tower::ServiceExt;

    use crate::client::{Outcome, is_timeout};

    #[tokio::test(start_paused = true)]
    async fn loopback_keeps_working_after_the_client_gives_up() {
        let finished = Arc::new(AtomicU32::new(0));
        let done = Arc::clone(&finished);
        let slow = tower::service_fn(move |_req: Request<DemoBody>| {
            let done = Arc::clone(&done);
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(DemoBody::default()))
            }
        });
        let svc = tower::timeout::Timeout::new(
            Loopback::new(slow, Gate::new(8), Abandoned::Serve),
            Duration::from_secs(1),
        );
        let err = svc
            .oneshot(Request::get("/").body(DemoBody::default()).unwrap())
            .await
            .unwrap_err();
        assert!(is_timeout(err.as_ref()));
        assert_eq!(Outcome::of::<DemoBody>(&Err(err)), Outcome::Timeout);
        assert_eq!(finished.load(Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            finished.load(Ordering::SeqCst),
            1,
            "the abandoned request was served"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_gate_holds_requests_and_a_full_backlog_drops_them() {
        let served = Arc::new(AtomicU32::new(0));
        let count = Arc::clone(&served);
        let server = tower::service_fn(move |_req: Request<DemoBody>| {
            count.fetch_add(1, Ordering::SeqCst);
            async { Ok::<_, Infallible>(Response::new(DemoBody::default())) }
        });
        let gate = Gate::new(1);
        let hop = Loopback::new(server, gate.clone(), Abandoned::Cancel);
        gate.pause();
        let first = tokio::spawn(
            hop.clone()
                .oneshot(Request::get("/").body(DemoBody::default()).unwrap()),
        );
        let second = tokio::spawn(
            tower::timeout::Timeout::new(hop.clone(), Duration::from_secs(1))
                .oneshot(Request::get("/").body(DemoBody::default()).unwrap()),
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(gate.backlog(), 1);
        assert_eq!(
            served.load(Ordering::SeqCst),
            0,
            "nothing runs while paused"
        );
        // The second request found the backlog full: never seen, timed out.
        assert!(is_timeout(second.await.unwrap().unwrap_err().as_ref()));
        gate.resume();
        first.await.unwrap().unwrap();
        assert_eq!(served.load(Ordering::SeqCst), 1);
        assert_eq!(gate.backlog(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn cancel_drops_abandoned_work() {
        let finished = Arc::new(AtomicU32::new(0));
        let done = Arc::clone(&finished);
        let slow = tower::service_fn(move |_req: Request<DemoBody>| {
            let done = Arc::clone(&done);
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                done.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Infallible>(Response::new(DemoBody::default()))
            }
        });
        let gate = Gate::new(8);
        let hop = Loopback::new(slow, gate.clone(), Abandoned::Cancel);
        let svc = tower::timeout::Timeout::new(hop, Duration::from_secs(1));
        let err = svc
            .oneshot(Request::get("/").body(DemoBody::default()).unwrap())
            .await
            .unwrap_err();
        assert!(is_timeout(err.as_ref()));
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            finished.load(Ordering::SeqCst),
            0,
            "the abandoned request was dropped"
        );
    }
}
