//! reqwest transports for the demo client stack (the `reqwest` feature), for the outage
//! experiment's rows through reqwest. The demo's own client ([`http_transport`]) stays
//! reqwest-free.
//!
//! - [`reqwest_transport`]: the stack's retry layers over a `reqwest::Client` instead of
//!   hyper-util's (`full-reqwest`).
//! - [`reqwest_default_transport`]: a `reqwest::Client` retrying on its own, with reqwest's
//!   retry policy (`reqwest-default`), under no retry layer of ours.
//!
//! [`http_transport`]: crate::client::http_transport

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use backoff_layer::reqwest::Reqwest;
use http::{Request, Response, StatusCode};
use http_body::Body;
use tower::BoxError;
use tower_service::Service;

use crate::record::{Event, Recorder};

/// A reqwest client as the stack's transport, keeping up to `max_idle` idle connections per
/// host (as [`http_transport`](crate::client::http_transport) does) with `TCP_NODELAY`.
///
/// # Errors
///
/// When reqwest cannot build its client (its TLS backend or the system's resolver fails to
/// initialise).
pub fn reqwest_transport(max_idle: usize) -> Result<Reqwest, reqwest::Error> {
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(max_idle)
        .tcp_nodelay(true)
        .build()?;
    Ok(Reqwest::new(client))
}

/// A `reqwest::Client` that retries on its own, as a reqwest user sets it up: reqwest's
/// retry policy (`reqwest::retry`, 0.13) with its defaults (at most 2 retries per request, a
/// budget of 20 % extra load over 10 s, **no wait** between attempts: reqwest has no
/// backoff) and a classifier that retries what `full` retries: an error before a response
/// (a refused or reset connection), `429`, `502`, `503` and `504`. The strategy
/// `reqwest-default`, under no retry layer of ours.
///
/// Requests are sent as reqwest's own requests (method, URL, headers, no body), so that
/// reqwest can clone them for its retries: a body given to reqwest as a stream is never
/// retried (`Request::try_clone` is `None`). The demo's requests have no body; a request
/// with one fails at once, unsent.
///
/// **Counting the attempts reqwest hides.** The stack's [`Record`](crate::client::Record)
/// layer sees one call per request here, since the retries happen inside reqwest. This
/// transport records each retry into `recorder` as an [`Event::Attempt`] with `retry: true`
/// at the moment reqwest sends it: reqwest 0.13 asks its retry scope (here: every host)
/// whether a retry applies exactly once before it sends each retry, and never for a first
/// attempt, so the scope counts them (read in reqwest 0.13.5's `retry.rs`, and checked by
/// this module's tests against the attempts a real server saw). The first attempt is
/// [`Record`](crate::client::Record)'s, as under every strategy. What each retried attempt
/// was answered (a `503`, say) is not recorded: only the answer of the last attempt
/// reaches the stack.
///
/// # Errors
///
/// When reqwest cannot build its client.
pub fn reqwest_default_transport(
    max_idle: usize,
    recorder: &Recorder,
) -> Result<ReqwestDefault, reqwest::Error> {
    let policy = reqwest::retry::for_host(CountRetries(recorder.clone())).classify_fn(|attempt| {
        let retryable = attempt.error().is_some()
            || attempt.status().is_some_and(|s| {
                matches!(
                    s,
                    StatusCode::TOO_MANY_REQUESTS
                        | StatusCode::BAD_GATEWAY
                        | StatusCode::SERVICE_UNAVAILABLE
                        | StatusCode::GATEWAY_TIMEOUT
                )
            });
        if retryable {
            attempt.retryable()
        } else {
            attempt.success()
        }
    });
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(max_idle)
        .tcp_nodelay(true)
        .retry(policy)
        .build()?;
    Ok(ReqwestDefault { client })
}

/// reqwest's retry scope, covering every host (the demo's clients talk to one server), and
/// counting each retry reqwest sends (see [`reqwest_default_transport`]).
struct CountRetries(Recorder);

impl PartialEq<&str> for CountRetries {
    fn eq(&self, _: &&str) -> bool {
        self.0.record(Event::Attempt { retry: true });
        true
    }
}

/// The transport of `reqwest-default`; see [`reqwest_default_transport`].
#[derive(Clone, Debug)]
pub struct ReqwestDefault {
    client: reqwest::Client,
}

/// The response future of [`ReqwestDefault`].
pub type ReqwestDefaultFuture =
    Pin<Box<dyn Future<Output = Result<Response<reqwest::Body>, BoxError>> + Send>>;

impl<B> Service<Request<B>> for ReqwestDefault
where
    B: Body + Send + 'static,
{
    type Response = Response<reqwest::Body>;
    type Error = BoxError;
    type Future = ReqwestDefaultFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let (parts, body) = request.into_parts();
        let has_body = body.size_hint().exact() != Some(0);
        let client = self.client.clone();
        Box::pin(async move {
            if has_body {
                // NOTE: reqwest would send a streamed body once and never retry it: not what
                // this row measures.
                return Err("reqwest-default sends requests without a body".into());
            }
            // NOTE: a body reqwest holds whole, so that its `try_clone` succeeds and it can
            // retry.
            let request = Request::from_parts(parts, reqwest::Body::from(Vec::new()));
            let request = reqwest::Request::try_from(request)?;
            Ok(Response::from(client.execute(request).await?))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use http::Request;
    use overload_core::clock::{SystemWallClock, WallClock};
    use tower::ServiceExt;

    use crate::client::{AttemptCounter, CollectLayer, DemoBody};
    use crate::record::Recorder;
    use crate::stack::network_stack;
    use crate::strategy::Strategy;

    /// `full-reqwest` (the `full` layer over reqwest) against a real server failing twice: three attempts on the
    /// wire, numbered, and the success returned; the stack's recorder counts them.
    #[tokio::test]
    async fn full_runs_over_reqwest() {
        let seen = Arc::new(AtomicU32::new(0));
        let count = Arc::clone(&seen);
        let app = Router::new().fallback(move |headers: HeaderMap| {
            let n = count.fetch_add(1, Ordering::SeqCst);
            async move {
                assert_eq!(headers["x-request-attempt"], n.to_string().as_str());
                if n < 2 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

        let recorder = Recorder::new();
        // `full-reqwest`: the strategy the scenario's runs name for this stack.
        let stack = network_stack(
            Strategy::FullReqwest,
            1,
            Duration::from_secs(2),
            CollectLayer::DEFAULT_MAX_BODY,
            1,
            &(Arc::new(SystemWallClock) as Arc<dyn WallClock>),
            &recorder,
        )
        .unwrap();
        let mut request = Request::get(format!("http://{addr}/api"))
            .body(DemoBody::default())
            .unwrap();
        let attempts = AttemptCounter::new();
        request.extensions_mut().insert(attempts.clone());
        let response = stack.oneshot(request).await.unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        assert_eq!(attempts.get(), 3);
    }

    /// The recorder's totals over every second so far.
    fn totals(recorder: &Recorder) -> crate::record::Second {
        recorder.totals(0, usize::MAX)
    }

    /// A server on 127.0.0.1 whose `n`-th request (from 0) gets `answer(n)` after
    /// `delay(n)`; it counts the requests and checks that none carries an attempt header.
    async fn server(
        answer: fn(u32) -> StatusCode,
        delay: fn(u32) -> Duration,
    ) -> (std::net::SocketAddr, Arc<AtomicU32>) {
        let seen = Arc::new(AtomicU32::new(0));
        let count = Arc::clone(&seen);
        let app = Router::new().fallback(move |headers: HeaderMap| {
            let n = count.fetch_add(1, Ordering::SeqCst);
            async move {
                assert!(headers.get("x-request-attempt").is_none());
                tokio::time::sleep(delay(n)).await;
                answer(n)
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (addr, seen)
    }

    fn stack(
        strategy: Strategy,
        recorder: &Recorder,
        timeout: Duration,
    ) -> crate::stack::DemoService {
        network_stack(
            strategy,
            1,
            timeout,
            CollectLayer::DEFAULT_MAX_BODY,
            1,
            &(Arc::new(SystemWallClock) as Arc<dyn WallClock>),
            recorder,
        )
        .unwrap()
    }

    fn get(addr: std::net::SocketAddr) -> Request<DemoBody> {
        Request::get(format!("http://{addr}/api"))
            .body(DemoBody::default())
            .unwrap()
    }

    /// `reqwest-default`: reqwest retries a `503` on its own, at once and with no attempt
    /// header, at most twice; the recorder counts every attempt on the wire, the two
    /// retries reqwest hides included.
    #[tokio::test]
    async fn reqwest_default_retries_on_its_own_and_every_attempt_is_counted() {
        let (addr, seen) = server(
            |n| {
                if n < 2 {
                    StatusCode::SERVICE_UNAVAILABLE
                } else {
                    StatusCode::OK
                }
            },
            |_| Duration::ZERO,
        )
        .await;
        let recorder = Recorder::new();
        let response = stack(Strategy::ReqwestDefault, &recorder, Duration::from_secs(2))
            .oneshot(get(addr))
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        let t = totals(&recorder);
        assert_eq!((t.attempts, t.retries), (3, 2));

        // Always failing: 3 attempts (2 retries), then reqwest returns the last `503`.
        let (addr, seen) = server(|_| StatusCode::SERVICE_UNAVAILABLE, |_| Duration::ZERO).await;
        let recorder = Recorder::new();
        let response = stack(Strategy::ReqwestDefault, &recorder, Duration::from_secs(2))
            .oneshot(get(addr))
            .await
            .unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(seen.load(Ordering::SeqCst), 3);
        let t = totals(&recorder);
        assert_eq!((t.attempts, t.retries, t.rejected), (3, 2, 1));
    }

    /// A request cut off by the per-attempt timeout while reqwest's retry is in flight:
    /// the retry was counted when it was sent, once.
    #[tokio::test]
    async fn a_retry_in_flight_when_the_request_is_cut_off_is_counted() {
        let (addr, seen) = server(
            |_| StatusCode::SERVICE_UNAVAILABLE,
            |n| {
                if n == 0 {
                    Duration::ZERO
                } else {
                    Duration::from_secs(30)
                }
            },
        )
        .await;
        let recorder = Recorder::new();
        let result = stack(
            Strategy::ReqwestDefault,
            &recorder,
            Duration::from_millis(500),
        )
        .oneshot(get(addr))
        .await;
        assert!(result.is_err(), "the second attempt never ends: timed out");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        let t = totals(&recorder);
        assert_eq!((t.attempts, t.retries, t.timeouts), (2, 1, 1));
    }
}
