//! The retry layer as a tonic user meets it, end to end on 127.0.0.1: a generated client
//! (`tonic-health`) over a real `Channel` wrapped in `RetryLayer::new().for_tonic()`, against
//! a real tonic server behind this project's server layers (`OverloadSignalLayer` outside
//! `RateLimitLayer`).
//!
//! The limiter runs on a fake clock, so what it admits is decided by the test, not by the
//! machine's speed; the waits the server asks for (`grpc-retry-pushback-ms`) are real.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use backoff_layer::adapter::Tonic;
use backoff_layer::backoff::{Exponential, Fixed};
use backoff_layer::{Retry, RetryInfo, RetryLayer, is_overloaded};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use overload_signal::protocol::Attempt;
use overload_signal::{OverloadSignalLayer, StopRule};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, health_check_response};
use tower::{Layer, Service, ServiceBuilder};

/// The retrying client: its type can be named, to keep it in a struct.
type RetryingClient = HealthClient<Retry<Channel, Tonic>>;

/// A service registered as not serving: a check that reaches the server whole gets
/// `NOT_SERVING`; one whose message was lost would ask about the server as a whole ("")
/// and get `SERVING`.
const NOT_SERVING: &str = "backoff.test.NotServing";

/// What the server saw of one attempt, before any of its layers ran.
#[derive(Clone, Debug)]
struct Seen {
    attempt: Attempt,
    grpc_timeout: Option<String>,
    body: Bytes,
    at: Instant,
}

/// Records every request, outermost, and can move the limiter's clock before a retry
/// reaches it (so that the retry is admitted and the first attempt was not).
#[derive(Clone)]
struct Record {
    seen: Arc<Mutex<Vec<Seen>>>,
    advance_on_retry: Option<FakeClock>,
}

impl<S> Layer<S> for Record {
    type Service = Recorded<S>;

    fn layer(&self, inner: S) -> Recorded<S> {
        Recorded {
            inner,
            record: self.clone(),
        }
    }
}

#[derive(Clone)]
struct Recorded<S> {
    inner: S,
    record: Record,
}

type Req = http::Request<tonic::body::Body>;

impl<S> Service<Req> for Recorded<S>
where
    S: Service<Req> + Clone + Send + 'static,
    S::Future: Send,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Req) -> Self::Future {
        // NOTE: the ready service serves this request; a fresh clone takes its place.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let record = self.record.clone();
        Box::pin(async move {
            let at = Instant::now();
            let (parts, body) = request.into_parts();
            let body = body.collect().await.expect("request body").to_bytes();
            let attempt = Attempt::from_headers(&parts.headers);
            record.seen.lock().unwrap().push(Seen {
                attempt,
                grpc_timeout: parts
                    .headers
                    .get("grpc-timeout")
                    .map(|v| v.to_str().unwrap().to_owned()),
                body: body.clone(),
                at,
            });
            if let (Some(clock), true) = (&record.advance_on_retry, attempt.is_retry()) {
                clock.advance(Duration::from_secs(1));
            }
            let request = http::Request::from_parts(parts, tonic::body::Body::new(Full::new(body)));
            inner.call(request).await
        })
    }
}

struct TestServer {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    /// A health server that admits one request per fake second (`rate` per second, so it
    /// asks for a wait of `1/rate`), behind the overload layer with `rule`.
    async fn start(rate: u32, rule: StopRule, advance_on_retry: bool) -> Self {
        let clock = FakeClock::new();
        let bucket = TokenBucket::builder(rate).burst(1).build().unwrap();
        let limit = RateLimitLayer::builder(bucket)
            .clock(clock.clone())
            .build()
            .unwrap();
        let signal = OverloadSignalLayer::builder().rule(rule).build().unwrap();
        let seen = Arc::default();
        let record = Record {
            seen: Arc::clone(&seen),
            advance_on_retry: advance_on_retry.then_some(clock),
        };
        let (reporter, health) = tonic_health::server::health_reporter();
        reporter
            .set_service_status(NOT_SERVING, ServingStatus::NotServing)
            .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let task = tokio::spawn(async move {
            let _reporter = reporter;
            // NOTE: the overload layer must sit outside the limiter. tonic's
            // `Server::builder().layer(..)` nests the other way round from axum's
            // `Router::layer` (the first layer added is the outermost), so the order is
            // spelled out in one `ServiceBuilder`, outermost first. A combined server layer
            // that gets the order right by construction is on its way; until it lands, the
            // order is kept by hand here. `server_builder` puts the peer address where the
            // overload layer reads it.
            overload_signal::tonic_0_14::server_builder()
                .layer(
                    ServiceBuilder::new()
                        .layer(record)
                        .layer(signal)
                        .layer(limit),
                )
                .add_service(health)
                .serve_with_incoming(TcpIncoming::from(listener))
                .await
                .unwrap();
        });
        Self { addr, seen, task }
    }

    async fn channel(&self) -> Channel {
        Channel::from_shared(format!("http://{}", self.addr))
            .unwrap()
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap()
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }

    /// Spends the limiter's only token with a plain (not retrying) call.
    async fn spend_the_token(&self) {
        let mut plain = HealthClient::new(self.channel().await);
        plain.check(check("")).await.unwrap();
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn check(service: &str) -> HealthCheckRequest {
    HealthCheckRequest {
        service: service.to_owned(),
    }
}

/// A rule that never fires within these tests.
fn never() -> StopRule {
    StopRule::builder()
        .retry_share(0.99)
        .min_requests(1_000_000)
        .build()
        .unwrap()
}

#[tokio::test]
async fn resource_exhausted_is_retried_after_the_pushback_with_the_body_replayed() {
    // 10 per second: a rejection asks for 100 ms.
    let server = TestServer::start(10, never(), true).await;
    server.spend_the_token().await;
    let mut client: RetryingClient = HealthClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new().for_tonic())
            .service(server.channel().await),
    );

    let response = client.check(check(NOT_SERVING)).await.unwrap();
    assert_eq!(
        response.get_ref().status,
        health_check_response::ServingStatus::NotServing as i32,
        "the retry reached the server with the caller's message"
    );
    assert_eq!(
        response.extensions().get::<RetryInfo>(),
        Some(&RetryInfo {
            attempts: 2,
            gave_up: None
        })
    );

    let seen = server.seen();
    let call = &seen[1..]; // after the plain call that spent the token
    assert_eq!(
        call.iter().map(|s| s.attempt).collect::<Vec<_>>(),
        [Attempt::Number(0), Attempt::Number(1)]
    );
    assert_eq!(
        call[0].body, call[1].body,
        "the message is replayed byte for byte"
    );
    assert!(!call[0].body.is_empty());
    let waited = call[1].at - call[0].at;
    assert!(
        waited >= Duration::from_millis(100),
        "the pushback is a lower bound on the wait; waited {waited:?}"
    );
    // No deadline, no timeout: nothing to tell the server.
    assert!(call.iter().all(|s| s.grpc_timeout.is_none()));
}

#[tokio::test]
async fn the_stop_signal_is_a_matchable_unavailable_after_one_attempt() {
    // The overload layer judges after 5 requests with more than 10 % retries.
    let rule = StopRule::builder()
        .retry_share(0.1)
        .min_requests(5)
        .build()
        .unwrap();
    let server = TestServer::start(1, rule, false).await;
    // Five retries from a plain client fill the window: the fleet is drowning in retries.
    let mut plain = HealthClient::new(server.channel().await);
    for _ in 0..5 {
        let mut request = tonic::Request::new(check(""));
        request
            .metadata_mut()
            .insert("x-request-attempt", "1".parse().unwrap());
        let _ = plain.check(request).await;
    }
    let before = server.seen().len();

    let mut client = HealthClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new().for_tonic())
            .service(server.channel().await),
    );
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        status.metadata().get("x-overloaded").unwrap(),
        "stop-retrying"
    );
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    assert_eq!(status.message(), "system overloaded, stop retrying");
    assert!(
        is_overloaded(&status),
        "still the typed outcome: {status:?}"
    );
    assert_eq!(Tonic::attempts(&status), 1);
    assert_eq!(server.seen().len(), before + 1, "exactly one attempt");
}

#[tokio::test]
async fn the_deadline_holds_and_travels_as_grpc_timeout() {
    // Never admits again (the clock does not move); asks for 200 ms each time.
    let server = TestServer::start(5, never(), false).await;
    server.spend_the_token().await;
    let deadline = Duration::from_millis(700);
    // A short backoff whose maximum does not cap the server's 200 ms.
    let backoff = Exponential::builder()
        .min_delay(Duration::from_millis(10))
        .max_delay(Duration::from_secs(10))
        .jitter(0.0)
        .build()
        .unwrap();
    let mut client = HealthClient::new(
        ServiceBuilder::new()
            .layer(
                RetryLayer::builder()
                    .max_attempts(10)
                    .backoff(backoff)
                    .deadline(deadline)
                    .build()
                    .unwrap()
                    .for_tonic(),
            )
            .service(server.channel().await),
    );

    let start = Instant::now();
    let status = client.check(check("")).await.unwrap_err();
    let elapsed = start.elapsed();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        elapsed < deadline,
        "gave up when the next wait would pass the deadline, not after it: {elapsed:?}"
    );

    let seen = server.seen();
    let call = &seen[1..];
    // 0, 200, 400, 600 ms: the next wait would end past 700 ms. Fewer on a slow machine.
    assert!((2..=4).contains(&call.len()), "{call:?}");
    assert_eq!(Tonic::attempts(&status) as usize, call.len());
    let timeouts: Vec<Duration> = call
        .iter()
        .map(|s| parse_grpc_timeout(s.grpc_timeout.as_deref().expect("grpc-timeout")))
        .collect();
    assert_eq!(
        timeouts[0], deadline,
        "the first attempt has the whole deadline"
    );
    assert!(
        timeouts.windows(2).all(|w| w[1] < w[0]),
        "each attempt has less left: {timeouts:?}"
    );
    for (s, timeout) in call.iter().zip(&timeouts) {
        let sent = s.at - start;
        assert!(sent < deadline, "an attempt was sent after the deadline");
        assert!(
            *timeout <= deadline - sent + Duration::from_millis(100),
            "grpc-timeout {timeout:?} is what is left of the deadline at {sent:?}"
        );
    }
}

#[tokio::test]
async fn connect_errors_are_retried_and_the_status_says_how_many_attempts() {
    // A port nothing listens on.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_lazy();
    let mut client = HealthClient::new(
        ServiceBuilder::new()
            .layer(
                RetryLayer::builder()
                    .backoff(Fixed::every(Duration::from_millis(10)).unwrap())
                    .build()
                    .unwrap()
                    .for_tonic(),
            )
            .service(channel),
    );
    let status = client.check(check("")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(Tonic::attempts(&status), 3);
    assert!(!is_overloaded(&status));
}

/// Parses the `grpc-timeout` values this layer sends (`<digits><unit>`).
fn parse_grpc_timeout(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "n" => Duration::from_nanos(n),
        "u" => Duration::from_micros(n),
        "m" => Duration::from_millis(n),
        "S" => Duration::from_secs(n),
        other => panic!("unexpected unit {other}"),
    }
}
