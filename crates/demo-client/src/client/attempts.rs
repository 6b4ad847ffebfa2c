//! Counting what happens to each attempt and each request: [`Record`] under the retry
//! layer, and the [`Outcome`] of a whole request.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, ready};

use http::{Request, Response, StatusCode};
use overload_signal::protocol::{self, Attempt};
use pin_project_lite::pin_project;
use tower::BoxError;
use tower_layer::Layer;
use tower_service::Service;

use crate::record::{Event, Recorder};

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

/// Counts attempts, retries, rejections, stop signals, timeouts and refused connections;
/// see [`Record`].
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
/// the `X-Request-Attempt` header says it is a retry); then, by how the attempt ended,
/// [`Event::StopSignal`] for a response carrying the stop signal, [`Event::Rejected`] for
/// any other `429 Too Many Requests` or `503 Service Unavailable` (the rate limits' and the
/// adaptive limit's rejections), [`Event::Timeout`] for an attempt that timed out (the
/// timeout sits under it) and [`Event::Refused`] for a refused connection.
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

    overload_core::define_inner_service_accessors!();
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
        let event = match &result {
            Ok(response) if protocol::is_stop_signal(response.headers()) => Some(Event::StopSignal),
            // `429` from a rate limit, `503` from the adaptive limit: both the server's
            // rejection of an attempt it did not start.
            Ok(response)
                if matches!(
                    response.status(),
                    StatusCode::TOO_MANY_REQUESTS | StatusCode::SERVICE_UNAVAILABLE
                ) =>
            {
                Some(Event::Rejected)
            }
            Ok(_) => None,
            Err(e) if is_timeout(e.as_ref()) => Some(Event::Timeout),
            Err(e) if is_refused(e.as_ref()) => Some(Event::Refused),
            Err(_) => None,
        };
        if let Some(event) = event {
            this.recorder.record(event);
        }
        Poll::Ready(result)
    }
}

/// How a logical request ended, as the load generator counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A 2xx response.
    Ok,
    /// The last attempt timed out.
    Timeout,
    /// The client-side throttle refused it: never sent.
    Throttled,
    /// Anything else: an error status, a stop signal, a retry the budget refused, a refused
    /// connection, a body over the cap.
    Error,
}

impl Outcome {
    /// Classifies the result of a whole request.
    pub fn of<B>(result: &Result<Response<B>, BoxError>) -> Self {
        match result {
            Ok(response) if response.status().is_success() => Outcome::Ok,
            Ok(_) => Outcome::Error,
            Err(err) if is_timeout(err.as_ref()) => Outcome::Timeout,
            Err(err) if backoff_layer::is_throttled(err.as_ref()) => Outcome::Throttled,
            Err(_) => Outcome::Error,
        }
    }
}

/// Whether `err` or anything in its source chain is a tower timeout.
pub fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    chain(err).any(|e| e.is::<tower::timeout::error::Elapsed>())
}

/// Whether `err` or anything in its source chain is a refused connection (nothing listens
/// at the address).
pub fn is_refused(err: &(dyn std::error::Error + 'static)) -> bool {
    chain(err).any(|e| {
        e.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::ConnectionRefused)
    })
}

fn chain<'a>(
    err: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = &'a (dyn std::error::Error + 'static)> {
    std::iter::successors(Some(err), |e| e.source())
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http_body_util::Full;
    use tower::ServiceExt;

    type Body = Full<Bytes>;

    fn server()
    -> impl Service<Request<Body>, Response = Response<Body>, Error = BoxError, Future: Send>
    + Clone
    + Send
    + 'static {
        tower::service_fn(|req: Request<Body>| async move {
            match req.uri().path() {
                "/stop" => {
                    Ok::<_, BoxError>(protocol::stop_signal_response(protocol::Protocol::Http))
                }
                "/limited" => Ok(Response::builder()
                    .status(StatusCode::TOO_MANY_REQUESTS)
                    .body(Body::default())
                    .unwrap()),
                "/adaptive" => Ok(Response::builder()
                    .status(StatusCode::SERVICE_UNAVAILABLE)
                    .body(Body::default())
                    .unwrap()),
                "/refused" => Err(Box::new(std::io::Error::from(
                    std::io::ErrorKind::ConnectionRefused,
                )) as BoxError),
                _ => Ok(Response::new(Full::new(Bytes::from_static(b"hello")))),
            }
        })
    }

    #[tokio::test(start_paused = true)]
    async fn record_counts_attempts_retries_and_how_they_ended() {
        let recorder = Recorder::new();
        let mut svc = RecordLayer::new(recorder.clone()).layer(server());
        let counter = AttemptCounter::new();
        for path in ["/a", "/a", "/stop", "/limited", "/adaptive"] {
            let mut req = Request::get(path).body(Body::default()).unwrap();
            req.extensions_mut().insert(counter.clone());
            svc.ready().await.unwrap().call(req).await.unwrap();
        }
        // Without a counter the attempt header decides.
        let mut req = Request::get("/a").body(Body::default()).unwrap();
        Attempt::set(req.headers_mut(), 1);
        svc.ready().await.unwrap().call(req).await.unwrap();
        let req = Request::get("/refused").body(Body::default()).unwrap();
        assert!(svc.ready().await.unwrap().call(req).await.is_err());

        assert_eq!(counter.get(), 5);
        let total = recorder.totals(0, 1);
        assert_eq!(
            (
                total.attempts,
                total.retries,
                total.stop_signals,
                total.rejected,
                total.refused
            ),
            (7, 5, 1, 2, 1)
        );
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
        let timeout: Result<Response<()>, BoxError> =
            Err(Box::new(tower::timeout::error::Elapsed::new()));
        assert_eq!(Outcome::of(&timeout), Outcome::Timeout);
    }

    #[test]
    fn refused_connections_are_found_in_the_chain() {
        #[derive(Debug)]
        struct Wrap(std::io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("client error (Connect)")
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = Wrap(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(is_refused(&refused));
        let reset = Wrap(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
        assert!(!is_refused(&reset));
        assert!(!is_timeout(&refused));
    }
}
