//! Deadlines on the wire, from the client (issue 22), end to end on 127.0.0.1: the caller's
//! own deadline bounds the retry loop, and every attempt tells the server what is left.
//!
//! - gRPC: a generated tonic client whose caller sets `Request::set_timeout(1 s)`, behind a
//!   retry layer with a 10 s deadline and 5 attempts, against a server that answers
//!   `UNAVAILABLE` after 300 ms. Regression for the review's finding: the caller's
//!   `grpc-timeout: 1000000u` was copied unchanged onto every retry and never bounded the
//!   loop (3 079 ms for 5 attempts, ending in `Unavailable`).
//! - HTTP: the same through hyper-util's client, with the caller's deadline in the request's
//!   extensions (`RequestDeadline`), each attempt carrying `X-Request-Deadline`.
//! - A tonic server behind `DeadlineLayer`: the service sees the caller's `grpc-timeout` as
//!   its time left.

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use backoff_layer::adapter::Tonic;
use backoff_layer::{GaveUp, GiveUpReason, ReplayBody, RetryInfo, RetryLayer};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use integration_tests::TestServer;
use overload_signal::deadline::RequestDeadline;
use overload_signal::protocol::WireDeadline;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;
use tower::{Layer, ServiceBuilder, ServiceExt};

/// How long the server takes to answer each attempt with its failure.
const SERVER_TAKES: Duration = Duration::from_millis(300);
/// The caller's own deadline.
const CALLER_WAITS: Duration = Duration::from_secs(1);
/// Slack for a loaded 2-core machine: timers fire late, threads wake late.
const SLACK: Duration = Duration::from_millis(250);

/// What the server saw of one attempt: when it came, relative to the call, and its headers.
#[derive(Clone, Debug)]
struct Seen {
    at: Instant,
    wall: SystemTime,
    headers: http::HeaderMap,
}

type Log = Arc<Mutex<Vec<Seen>>>;

/// A server that records every attempt and answers it, after [`SERVER_TAKES`], with
/// `answer()`.
async fn server(answer: fn() -> Response<Full<Bytes>>) -> (TestServer, Log) {
    let log = Log::default();
    let seen = Arc::clone(&log);
    let server = TestServer::start(move |req: Request<hyper::body::Incoming>| {
        seen.lock().unwrap().push(Seen {
            at: Instant::now(),
            wall: SystemTime::now(),
            headers: req.headers().clone(),
        });
        async move {
            tokio::time::sleep(SERVER_TAKES).await;
            answer()
        }
    })
    .await
    .unwrap();
    (server, log)
}

/// gRPC's `UNAVAILABLE`, trailers-only.
fn unavailable() -> Response<Full<Bytes>> {
    Response::builder()
        .header("content-type", "application/grpc")
        .header("grpc-status", "14")
        .header("grpc-message", "try again")
        .body(Full::default())
        .unwrap()
}

/// A `503` without the stop signal: retryable.
fn service_unavailable() -> Response<Full<Bytes>> {
    Response::builder()
        .status(503)
        .body(Full::default())
        .unwrap()
}

/// 5 attempts, a 10 s deadline of the layer's own: the caller's 1 s is what must bound the
/// loop.
fn layer() -> RetryLayer {
    RetryLayer::builder()
        .max_attempts(5)
        .deadline(Duration::from_secs(10))
        .build()
        .unwrap()
}

/// Checks that every attempt was sent before the caller's deadline and carried at most
/// what was left of it (`left` reads an attempt's time left from its headers), and that the
/// first carried (nearly) all of it.
fn assert_each_attempt_carries_what_is_left(
    seen: &[Seen],
    start: Instant,
    left: impl Fn(&Seen) -> Duration,
) {
    assert!(!seen.is_empty());
    let mut previous = CALLER_WAITS + Duration::from_millis(1);
    for (n, attempt) in seen.iter().enumerate() {
        let sent = attempt.at - start;
        let carried = left(attempt);
        assert!(
            sent < CALLER_WAITS,
            "attempt {n} reached the server {sent:?} after the call: past the deadline"
        );
        assert!(
            carried <= CALLER_WAITS.saturating_sub(sent) + Duration::from_millis(20),
            "attempt {n}, {sent:?} after the call, carried {carried:?}: more than was left"
        );
        assert!(
            carried < previous,
            "attempt {n} carried {carried:?}, no less than the one before"
        );
        previous = carried;
    }
    let first = left(&seen[0]);
    assert!(
        first > CALLER_WAITS - SLACK && first <= CALLER_WAITS,
        "the first attempt carries the caller's whole deadline: {first:?}"
    );
}

#[tokio::test]
async fn a_tonic_callers_timeout_bounds_the_loop_and_each_attempt_carries_what_is_left() {
    let (server, log) = server(unavailable).await;
    let channel = Channel::from_shared(format!("http://{}", server.addr()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(
        ServiceBuilder::new()
            .layer(layer().for_tonic())
            .service(channel),
    );

    let mut request = tonic::Request::new(HealthCheckRequest::default());
    request.set_timeout(CALLER_WAITS);
    let start = Instant::now();
    let status = client.check(request).await.unwrap_err();
    let took = start.elapsed();
    let seen = log.lock().unwrap().clone();
    eprintln!(
        "gRPC: {took:?}, {} attempts, grpc-timeout {:?}",
        seen.len(),
        seen.iter()
            .map(|s| s.headers.get("grpc-timeout").cloned())
            .collect::<Vec<_>>()
    );

    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(
        took >= CALLER_WAITS - 2 * SLACK && took <= CALLER_WAITS + SLACK,
        "the call ends by the caller's deadline: {took:?}"
    );
    assert!(seen.len() <= 3, "no attempt after the deadline: {seen:?}");
    assert_eq!(Tonic::attempts(&status) as usize, seen.len());
    assert_each_attempt_carries_what_is_left(&seen, start, |seen| {
        grpc_timeout(
            seen.headers
                .get("grpc-timeout")
                .expect("grpc-timeout on every attempt")
                .to_str()
                .unwrap(),
        )
    });
}

#[tokio::test]
async fn an_http_callers_deadline_bounds_the_loop_and_each_attempt_carries_what_is_left() {
    let (server, log) = server(service_unavailable).await;
    let client: Client<HttpConnector, ReplayBody<Empty<Bytes>>> =
        Client::builder(TokioExecutor::new()).build_http();
    let client = layer().layer(client);

    let mut request = Request::get(server.url("/api"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    request
        .extensions_mut()
        .insert(RequestDeadline::after(CALLER_WAITS));
    let start = Instant::now();
    let outcome = client.oneshot(request).await;
    let took = start.elapsed();
    let seen = log.lock().unwrap().clone();
    eprintln!(
        "HTTP: {took:?}, {} attempts, X-Request-Deadline {:?}",
        seen.len(),
        seen.iter()
            .map(|s| s.headers.get("x-request-deadline").cloned())
            .collect::<Vec<_>>()
    );

    // The deadline's outcome: the last attempt cut at the deadline (an error), or, when the
    // next wait would pass it, the last failure with the reason.
    let reason = match &outcome {
        Err(e) => e.downcast_ref::<GaveUp>().expect("a GaveUp").reason(),
        Ok(response) => response
            .extensions()
            .get::<RetryInfo>()
            .and_then(|info| info.gave_up)
            .expect("given up on"),
    };
    assert_eq!(reason, GiveUpReason::Deadline, "{outcome:?}");
    assert!(
        took >= CALLER_WAITS - 2 * SLACK && took <= CALLER_WAITS + SLACK,
        "the call ends by the caller's deadline: {took:?}"
    );
    assert!(seen.len() <= 3, "no attempt after the deadline: {seen:?}");
    assert_each_attempt_carries_what_is_left(&seen, start, |seen| {
        let wire = WireDeadline::from_headers(&seen.headers)
            .expect("a well-formed X-Request-Deadline")
            .expect("X-Request-Deadline on every attempt");
        // Sent just before it arrived, on this machine's clock: the server can place the
        // deadline (the send time is truncated to the millisecond).
        let since_sent = seen
            .wall
            .duration_since(wire.sent())
            .expect("sent before it arrived");
        assert!(since_sent < SLACK, "{since_sent:?}");
        wire.timeout()
    });
}

/// Parses a `grpc-timeout` value (`<digits><unit>`).
fn grpc_timeout(value: &str) -> Duration {
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().unwrap();
    match unit {
        "n" => Duration::from_nanos(n),
        "u" => Duration::from_micros(n),
        "m" => Duration::from_millis(n),
        "S" => Duration::from_secs(n),
        "M" => Duration::from_secs(n * 60),
        "H" => Duration::from_secs(n * 3600),
        other => panic!("unexpected unit {other}"),
    }
}

/// A tonic server behind `DeadlineLayer` (in `Server::layer`): what runs inside it reads the
/// caller's `grpc-timeout` as its time left. (tonic's server enforces `grpc-timeout` itself,
/// outside every user layer; the deadline layer adds the time left, for the handler and its
/// own downstream calls.)
#[tokio::test]
async fn a_tonic_service_behind_the_deadline_layer_reads_the_callers_timeout_as_its_time_left() {
    use overload_signal::DeadlineLayer;
    use overload_signal::deadline;
    use tonic::transport::Server;
    use tonic::transport::server::TcpIncoming;

    let seen: Arc<Mutex<Vec<Option<Duration>>>> = Arc::default();
    let record = {
        let seen = Arc::clone(&seen);
        tower::layer::layer_fn(move |inner| {
            let seen = Arc::clone(&seen);
            tower::util::MapRequest::new(inner, move |request: Request<tonic::body::Body>| {
                seen.lock().unwrap().push(deadline::time_left());
                request
            })
        })
    };
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        Server::builder()
            .layer(
                ServiceBuilder::new()
                    .layer(DeadlineLayer::new())
                    .layer(record),
            )
            .add_service(health)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut request = tonic::Request::new(HealthCheckRequest::default());
    request.set_timeout(Duration::from_millis(800));
    client.check(request).await.unwrap();
    // Without a timeout: no deadline.
    client.check(HealthCheckRequest::default()).await.unwrap();
    server.abort();

    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:?}");
    let left = seen[0].expect("a deadline from grpc-timeout");
    assert!(
        left <= Duration::from_millis(800) && left > Duration::from_millis(800) - SLACK,
        "{left:?}"
    );
    assert_eq!(seen[1], None);
}

/// A wall clock whose reader loses the CPU around each reading, as a thread preempted on a
/// loaded host does: it sleeps before and after reading the time of day.
struct PreemptedWallClock;

/// How long [`PreemptedWallClock`]'s reader is away, each side of the reading.
const PREEMPTED: Duration = Duration::from_millis(50);

impl overload_core::clock::WallClock for PreemptedWallClock {
    // NOTE: blocks the test's own thread on purpose: the pause is the point.
    #[allow(clippy::disallowed_methods)]
    fn now(&self) -> SystemTime {
        std::thread::sleep(PREEMPTED);
        let now = SystemTime::now();
        std::thread::sleep(PREEMPTED);
        now
    }
}

/// Issue 30, finding 7, on the sending side: `deadline_tiers` still failed once in 60 runs
/// under load after the deadline layer's fix ("told 754.5 ms, the top caller had 751.9 ms
/// left"). The retry layer reads tokio's clock (the attempt's start, from which `timeout`
/// is counted) before the wall clock (`t`), so a pause between the two reads moves the
/// field's deadline later by that much. This pins it: the field's deadline, placed on
/// tokio's clock, must not be after the caller's. It failed until `backoff-layer` read the
/// wall clock first (`crates/backoff-layer/src/retry/deadline.rs`, `attempt_window`):
/// "the field's deadline is 49.38ms after the caller's".
#[tokio::test]
async fn a_pause_between_the_senders_clock_reads_never_moves_the_field_later() {
    let fields = Arc::new(Mutex::new(Vec::new()));
    let seen = Arc::clone(&fields);
    let client = RetryLayer::builder()
        .wall_clock(PreemptedWallClock)
        .build()
        .unwrap()
        .layer(tower::service_fn(
            move |req: Request<ReplayBody<Empty<Bytes>>>| {
                seen.lock()
                    .unwrap()
                    .push(WireDeadline::from_headers(req.headers()));
                async { Ok::<_, std::convert::Infallible>(Response::new(Empty::<Bytes>::new())) }
            },
        ));
    // The two clocks side by side: the wall clock read after tokio's, so `wall` is at or
    // after `tokio` (by a microsecond or so).
    let tokio = Instant::now();
    let wall = SystemTime::now();
    let callers = tokio + CALLER_WAITS;
    let mut request = Request::new(Empty::<Bytes>::new());
    request
        .extensions_mut()
        .insert(RequestDeadline::at(callers));
    client.oneshot(request).await.unwrap();
    let field = fields.lock().unwrap()[0]
        .expect("well-formed")
        .expect("a field");
    // On tokio's clock, at most a microsecond or so late: in the sender's favour.
    let placed = tokio
        + (field.sent() + field.timeout())
            .duration_since(wall)
            .unwrap();
    assert!(
        placed <= callers + Duration::from_millis(1),
        "the field's deadline is {:?} after the caller's",
        placed - callers
    );
}
