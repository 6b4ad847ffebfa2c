//! The pieces of the demo client stack that do not depend on the retry strategy.
//!
//! From the application down, one attempt goes through:
//!
//! ```text
//! retry (strategy) ─► Record ─► tower Timeout (per attempt) ─► Collect ─► transport
//! ```
//!
//! - [`Record`] counts every attempt, retry and stop signal into a [`Recorder`];
//! - the timeout bounds one attempt, body included, because [`Collect`] sits under it and
//!   reads the whole body before the attempt counts as answered;
//! - the transport is a hyper-util legacy [`Client`]
//!   (see [`http_transport`]) or, in the simulation, [`Loopback`], an in-process hop to a
//!   server that keeps working on a request after the client has given up on it, as a real
//!   server does.
//!
//! [`CountingBudget`] wraps a retry budget to count its refusals.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, ready};

use backoff_layer::ReplayBody;
use backoff_layer::budget::Budget;
use bytes::{BufMut, Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_signal::protocol::{self, Attempt};
use pin_project_lite::pin_project;
use tokio::sync::oneshot;
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

use crate::record::{Event, Recorder};

/// The body of every request and response in the demo stack: small and replayable.
pub type DemoBody = Full<Bytes>;

/// The hyper-util legacy client the `run` and `scenario` commands send through: under the
/// retry layer, requests carry `backoff-layer`'s replayable body.
pub type HttpTransport = Client<HttpConnector, ReplayBody<DemoBody>>;

/// A hyper-util legacy client for plain HTTP/1 on 127.0.0.1.
///
/// Connections are pooled and kept alive, as a real client's would be; connecting is not
/// bounded here because the per-attempt timeout above bounds it. Up to `max_idle` idle
/// connections are kept (the demo's clients are bursty, so keeping about one per client
/// avoids reconnecting on every request).
pub fn http_transport(max_idle: usize) -> HttpTransport {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(max_idle)
        .build(connector)
}

/// A request-scoped counter of attempts, put in the request's extensions by the load
/// generator so that [`Record`] can tell a retry from a first attempt.
#[derive(Debug, Clone, Default)]
pub struct AttemptCounter(Arc<AtomicU32>);

impl AttemptCounter {
    /// A counter at 0 attempts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one attempt; returns how many were counted before it.
    fn next(&self) -> u32 {
        self.0.fetch_add(1, Ordering::Relaxed)
    }

    /// The attempts counted so far.
    pub fn get(&self) -> u32 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counts attempts, retries and stop signals; see [`Record`].
#[derive(Debug, Clone)]
pub struct RecordLayer {
    recorder: Recorder,
}

impl RecordLayer {
    /// Records into `recorder`.
    pub const fn new(recorder: Recorder) -> Self {
        Self { recorder }
    }
}

impl<S> Layer<S> for RecordLayer {
    type Service = Record<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Record::new(inner, self.recorder.clone())
    }
}

/// Records every attempt that passes through it: [`Event::Attempt`], with `retry` set when
/// the request's [`AttemptCounter`] says an attempt went before (or, without a counter, when
/// the `X-Request-Attempt` header says it is a retry), [`Event::StopSignal`] for every
/// response that carries the stop signal, and [`Event::Timeout`] for every attempt that
/// timed out (the timeout sits under it).
#[derive(Debug, Clone)]
pub struct Record<S> {
    inner: S,
    recorder: Recorder,
}

impl<S> Record<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S, recorder: Recorder) -> Self {
        Self { inner, recorder }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Record<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: AsRef<dyn std::error::Error + Send + Sync>,
{
    type Response = Response<ResBody>;
    type Error = S::Error;
    type Future = RecordFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        let retry = match request.extensions().get::<AttemptCounter>() {
            Some(counter) => counter.next() > 0,
            None => Attempt::from_request(&request).is_retry(),
        };
        self.recorder.record(Event::Attempt { retry });
        RecordFuture {
            inner: self.inner.call(request),
            recorder: self.recorder.clone(),
        }
    }
}

pin_project! {
    /// The response future of [`Record`].
    #[derive(Debug)]
    pub struct RecordFuture<F> {
        #[pin]
        inner: F,
        recorder: Recorder,
    }
}

impl<F, B, E> Future for RecordFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: AsRef<dyn std::error::Error + Send + Sync>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let result = ready!(this.inner.poll(cx));
        match &result {
            Ok(response) if protocol::is_stop_signal(response.headers()) => {
                this.recorder.record(Event::StopSignal);
            }
            Ok(_) => {}
            Err(e) if is_timeout(e.as_ref()) => this.recorder.record(Event::Timeout),
            Err(_) => {}
        }
        Poll::Ready(result)
    }
}

/// Reads whole response bodies into [`DemoBody`]; see [`Collect`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CollectLayer;

impl<S> Layer<S> for CollectLayer {
    type Service = Collect<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Collect { inner }
    }
}

/// Reads the whole response body before answering, so that a timeout above it bounds the
/// entire exchange and the layers above see a replayable [`DemoBody`].
#[derive(Debug, Clone)]
pub struct Collect<S> {
    inner: S,
}

impl<S> Collect<S> {
    /// Wraps `inner`.
    pub const fn new(inner: S) -> Self {
        Self { inner }
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The wrapped service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the service.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for Collect<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>>,
    S::Error: Into<BoxError>,
    ResBody: Body,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<DemoBody>;
    type Error = BoxError;
    type Future = CollectFuture<S::Future, ResBody>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: Request<ReqBody>) -> Self::Future {
        CollectFuture {
            head: self.inner.call(request),
            parts: None,
            body: None,
            data: BytesMut::new(),
        }
    }
}

pin_project! {
    /// The response future of [`Collect`].
    pub struct CollectFuture<F, B> {
        #[pin]
        head: F,
        parts: Option<http::response::Parts>,
        #[pin]
        body: Option<B>,
        data: BytesMut,
    }
}

impl<F, B> std::fmt::Debug for CollectFuture<F, B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CollectFuture")
            .field("received", &self.data.len())
            .finish_non_exhaustive()
    }
}

impl<F, B, E> Future for CollectFuture<F, B>
where
    F: Future<Output = Result<Response<B>, E>>,
    E: Into<BoxError>,
    B: Body,
    B::Error: Into<BoxError>,
{
    type Output = Result<Response<DemoBody>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        if this.body.is_none() {
            let (parts, body) = ready!(this.head.poll(cx)).map_err(Into::into)?.into_parts();
            *this.parts = Some(parts);
            this.body.set(Some(body));
        }
        let Some(mut body) = this.body.as_mut().as_pin_mut() else {
            return Poll::Ready(Err("collect future polled after completion".into()));
        };
        while let Some(frame) = ready!(body.as_mut().poll_frame(cx)) {
            if let Ok(data) = frame.map_err(Into::into)?.into_data() {
                this.data.put(data);
            }
        }
        let parts = this
            .parts
            .take()
            .ok_or("collect future polled after completion")?;
        let data = std::mem::take(this.data).freeze();
        Poll::Ready(Ok(Response::from_parts(parts, Full::new(data))))
    }
}

/// What an in-process server does with a request whose client has given up (dropped the
/// response future, after a timeout).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Abandoned {
    /// Cancel it as soon as the server runs, as hyper does: a running hyper server sees the
    /// closed connection and drops the request's handler; a stopped one sees it on resume.
    /// This is what the real `demo-server` does. The default.
    #[default]
    Cancel,
    /// Serve it to the end and answer into the void, as a server that never looks at its
    /// connection while working (the article's Go server) does.
    Serve,
}

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
    paused: tokio::sync::watch::Sender<bool>,
    backlog: std::sync::atomic::AtomicUsize,
    limit: usize,
}

impl Gate {
    /// A running gate whose backlog holds at most `limit` requests.
    pub fn new(limit: usize) -> Self {
        Self {
            state: Arc::new(GateState {
                paused: tokio::sync::watch::Sender::new(false),
                backlog: std::sync::atomic::AtomicUsize::new(0),
                limit,
            }),
        }
    }

    /// Stops the server (SIGSTOP).
    pub fn pause(&self) {
        self.state.paused.send_replace(true);
    }

    /// Resumes the server (SIGCONT): the backlog enters.
    pub fn resume(&self) {
        self.state.paused.send_replace(false);
    }

    /// Whether the server is stopped.
    pub fn is_paused(&self) -> bool {
        *self.state.paused.borrow()
    }

    /// Requests waiting in the backlog.
    pub fn backlog(&self) -> usize {
        self.state.backlog.load(Ordering::Relaxed)
    }

    async fn running(&self) {
        let mut rx = self.state.paused.subscribe();
        // NOTE: the sender lives in `self`, so the channel cannot close while we wait.
        let _ = rx.wait_for(|paused| !paused).await;
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

    /// The server service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The server service, mutably.
    pub fn get_mut(&mut self) -> &mut S {
        &mut self.inner
    }

    /// Unwraps the server service.
    pub fn into_inner(self) -> S {
        self.inner
    }
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

/// A retry budget that records every refusal of the budget it wraps as
/// [`Event::BudgetRefusal`].
#[derive(Debug, Clone)]
pub struct CountingBudget<B> {
    inner: B,
    recorder: Recorder,
}

impl<B> CountingBudget<B> {
    /// Wraps `budget`, recording into `recorder`.
    pub const fn new(budget: B, recorder: Recorder) -> Self {
        Self {
            inner: budget,
            recorder,
        }
    }

    /// The wrapped budget.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: Budget> Budget for CountingBudget<B> {
    fn deposit(&self) {
        self.inner.deposit();
    }

    fn withdraw(&self) -> bool {
        let allowed = self.inner.withdraw();
        if !allowed {
            self.recorder.record(Event::BudgetRefusal);
        }
        allowed
    }
}

/// How a logical request ended, as the load generator counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx response.
    Ok,
    /// The last attempt timed out.
    Timeout,
    /// Anything else: an error status, a stop signal, a refused connection.
    Error,
}

impl Outcome {
    /// Classifies the result of a whole request.
    pub fn of<B>(result: &Result<Response<B>, BoxError>) -> Self {
        match result {
            Ok(response) if response.status().is_success() => Outcome::Ok,
            Ok(_) => Outcome::Error,
            Err(err) if is_timeout(err.as_ref()) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        }
    }
}

/// Whether `err` or anything in its source chain is a tower timeout.
pub fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if e.is::<tower::timeout::error::Elapsed>() {
            return true;
        }
        cur = e.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::convert::Infallible;
    use std::time::Duration;
    use tower::ServiceExt;

    fn ok_server()
    -> impl Service<Request<DemoBody>, Response = Response<DemoBody>, Error = BoxError, Future: Send>
    + Clone
    + Send
    + 'static {
        tower::service_fn(|req: Request<DemoBody>| async move {
            if req.uri().path() == "/stop" {
                Ok::<_, BoxError>(protocol::stop_signal_response(protocol::Protocol::Http))
            } else {
                Ok(Response::new(Full::new(Bytes::from_static(b"hello"))))
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn record_counts_attempts_retries_and_stop_signals() {
        let recorder = Recorder::new();
        let mut svc = RecordLayer::new(recorder.clone()).layer(ok_server());
        let counter = AttemptCounter::new();
        for path in ["/a", "/a", "/stop"] {
            let mut req = Request::get(path).body(DemoBody::default()).unwrap();
            req.extensions_mut().insert(counter.clone());
            svc.ready().await.unwrap().call(req).await.unwrap();
        }
        // Without a counter the attempt header decides.
        let mut req = Request::get("/a").body(DemoBody::default()).unwrap();
        Attempt::set(req.headers_mut(), 1);
        svc.ready().await.unwrap().call(req).await.unwrap();
        let req = Request::get("/a").body(DemoBody::default()).unwrap();
        svc.ready().await.unwrap().call(req).await.unwrap();

        assert_eq!(counter.get(), 3);
        let total = recorder.totals(0, 1);
        assert_eq!(
            (total.attempts, total.retries, total.stop_signals),
            (5, 3, 1)
        );
    }

    #[tokio::test]
    async fn collect_reads_the_whole_body() {
        let svc = CollectLayer.layer(ok_server());
        let response = svc
            .oneshot(Request::get("/").body(DemoBody::default()).unwrap())
            .await
            .unwrap();
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"hello");
    }

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

    #[test]
    fn counting_budget_counts_refusals_only() {
        struct Alternate(AtomicU32);
        impl Budget for Alternate {
            fn deposit(&self) {}
            fn withdraw(&self) -> bool {
                self.0.fetch_add(1, Ordering::Relaxed) % 2 == 0
            }
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        let _guard = rt.enter();
        let recorder = Recorder::new();
        let budget = CountingBudget::new(Alternate(AtomicU32::new(0)), recorder.clone());
        budget.deposit();
        let allowed = (0..4).filter(|_| budget.withdraw()).count();
        assert_eq!(allowed, 2);
        assert_eq!(recorder.totals(0, 1).budget_refusals, 2);
    }

    #[test]
    fn outcomes() {
        let ok: Result<Response<()>, BoxError> = Ok(Response::new(()));
        assert_eq!(Outcome::of(&ok), Outcome::Ok);
        let unavailable: Result<Response<()>, BoxError> =
            Ok(protocol::stop_signal_response(protocol::Protocol::Http));
        assert_eq!(Outcome::of(&unavailable), Outcome::Error);
        let refused: Result<Response<()>, BoxError> = Err("connection refused".into());
        assert_eq!(Outcome::of(&refused), Outcome::Error);
    }
}
