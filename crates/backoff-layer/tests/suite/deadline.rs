//! Deadlines on the wire (issue 22), under paused time: every attempt tells the server how
//! long it is waited for (`X-Request-Deadline` for HTTP, `grpc-timeout` for gRPC), and the
//! caller's own deadline bounds the retry loop: no attempt after it, no wait past it, never
//! more time on the wire than the caller gave.

use crate::support;

use std::error::Error as _;
use std::time::{Duration, SystemTime};

use backoff_layer::backoff::{Fixed, Seeds};
use backoff_layer::budget::Unlimited;
use backoff_layer::clock::TokioWallClock;
use backoff_layer::{AttemptTimedOut, GiveUpReason, RetryBuilder, RetryLayer};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request};
use http_body_util::Full;
use overload_signal::deadline::{self, RequestDeadline};
use overload_signal::protocol::{WireDeadline, X_REQUEST_DEADLINE};
use support::{MS, Mock, Recorded, Reply, SECOND, gave_up, get, status};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// A wall clock on a whole millisecond (the field's resolution) that paused time moves.
fn wall() -> TokioWallClock {
    TokioWallClock::starting_at(SystemTime::UNIX_EPOCH + Duration::from_millis(1_767_225_600_000))
}

/// Five attempts, 100 ms apart, no budget in the way, the test's wall clock.
fn layer() -> RetryBuilder {
    RetryLayer::builder()
        .max_attempts(5)
        .backoff(Fixed::every(100 * MS).unwrap())
        .budget(Unlimited)
        .seeds(Seeds::from_seed(1))
        .wall_clock(wall())
}

/// Each attempt's `X-Request-Deadline`, as (ms since the test's start by its send time,
/// timeout in ms).
fn http_deadlines(mock: &Mock) -> Vec<(u64, u64)> {
    use backoff_layer::clock::WallClock;
    let start = wall().now();
    mock.seen()
        .iter()
        .map(|s| {
            let d = WireDeadline::from_headers(&s.headers)
                .expect("well-formed")
                .expect("on every attempt");
            let sent = d.sent().duration_since(start).unwrap();
            (sent.as_millis() as u64, d.timeout().as_millis() as u64)
        })
        .collect()
}

fn grpc_timeouts(mock: &Mock) -> Vec<Option<String>> {
    mock.seen()
        .iter()
        .map(|s| {
            s.headers
                .get("grpc-timeout")
                .map(|v| v.to_str().unwrap().to_owned())
        })
        .collect()
}

fn grpc_call() -> Request<Full<Bytes>> {
    Request::post("http://example.test/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\0")))
        .unwrap()
}

/// The server of the issue: a failure worth a retry, after 300 ms.
fn slow_failure() -> Mock {
    Mock::new(vec![Reply::Late(300 * MS, 503)])
}

/// An HTTP attempt carries its window: the default deadline's 15 s with nothing else, the
/// per-attempt timeout when it is shorter, what is left of the deadline when that is.
#[tokio::test(start_paused = true)]
async fn every_http_attempt_carries_its_window_in_x_request_deadline() {
    let mock = Mock::new(vec![status(503), status(503), status(200)]);
    layer()
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(get())
        .await
        .unwrap();
    // The default deadline (15 s), less 100 ms of backoff each time.
    assert_eq!(
        http_deadlines(&mock),
        [(0, 15_000), (100, 14_900), (200, 14_800)]
    );

    let mock = Mock::new(vec![status(503), status(200)]);
    layer()
        .attempt_timeout(2 * SECOND)
        .deadline(2050 * MS)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(get())
        .await
        .unwrap();
    // The timeout, then what is left of the deadline once it is the shorter.
    assert_eq!(http_deadlines(&mock), [(0, 2000), (100, 1950)]);

    // No deadline and no timeout: nothing to tell.
    let mock = Mock::new(vec![status(200)]);
    layer()
        .no_deadline()
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert!(!mock.seen()[0].headers.contains_key(X_REQUEST_DEADLINE));
    // A gRPC request carries gRPC's field only.
    let mock = Mock::new(vec![status(200)]);
    layer()
        .deadline(SECOND)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(grpc_call())
        .await
        .unwrap();
    assert!(!mock.seen()[0].headers.contains_key(X_REQUEST_DEADLINE));
    assert_eq!(grpc_timeouts(&mock), [Some("1000000u".to_owned())]);
}

/// The caller's deadline in the request's extensions bounds the loop of a layer whose own
/// deadline is 10 s: attempts at 0, 400 and 800 ms carry 1000, 600 and 200 ms, the third is
/// cut at 1 s, and nothing is sent after.
#[tokio::test(start_paused = true)]
async fn a_callers_deadline_bounds_the_loop_and_each_attempt_carries_what_is_left() {
    let mock = slow_failure();
    let mut request = get();
    request
        .extensions_mut()
        .insert(RequestDeadline::after(SECOND));
    let start = Instant::now();
    let err = layer()
        .deadline(10 * SECOND)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), SECOND);
    let g = gave_up(&err);
    assert_eq!((g.reason(), g.attempts()), (GiveUpReason::Deadline, 3));
    assert!(g.source().unwrap().is::<AttemptTimedOut>());
    assert_eq!(http_deadlines(&mock), [(0, 1000), (400, 600), (800, 200)]);
}

/// The same with the caller's `grpc-timeout`, as tonic's `Request::set_timeout` writes it.
/// Regression for the review's finding: it was copied unchanged onto every retry
/// (`1000000u` three times) and never bounded the loop.
#[tokio::test(start_paused = true)]
async fn a_callers_grpc_timeout_bounds_the_loop_and_is_rewritten_on_each_attempt() {
    let mock = slow_failure();
    let mut request = grpc_call();
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("1000000u"));
    let start = Instant::now();
    let err = layer()
        .deadline(10 * SECOND)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), SECOND);
    assert_eq!(gave_up(&err).reason(), GiveUpReason::Deadline);
    let some = |v: &[&str]| v.iter().map(|v| Some((*v).to_owned())).collect::<Vec<_>>();
    assert_eq!(
        grpc_timeouts(&mock),
        some(&["1000000u", "600000u", "200000u"])
    );

    // Under the default deadline, which is never sent to a gRPC server, the caller's own
    // still is: what is left of it.
    let mock = Mock::new(vec![status(503), status(200)]);
    let mut request = grpc_call();
    request
        .headers_mut()
        .insert("grpc-timeout", HeaderValue::from_static("3S"));
    layer()
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(grpc_timeouts(&mock), some(&["3000000u", "2900000u"]));
}

/// A handler behind `overload-signal`'s deadline layer calls a downstream service through
/// the retry layer: the task's current deadline is passed on without code.
#[tokio::test(start_paused = true)]
async fn the_current_deadline_of_the_task_is_passed_on() {
    let mock = slow_failure();
    let service = layer()
        .deadline(10 * SECOND)
        .build()
        .unwrap()
        .layer(mock.clone());
    let handler = async move { service.oneshot(get()).await };
    let start = Instant::now();
    let err = deadline::scope(Some(RequestDeadline::after(650 * MS)), handler)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), 650 * MS);
    assert_eq!(gave_up(&err).reason(), GiveUpReason::Deadline);
    assert_eq!(http_deadlines(&mock), [(0, 650), (400, 250)]);
}

/// The caller's own `X-Request-Deadline` (a request forwarded as it came) is placed with its
/// send time and replaced by what is left.
#[tokio::test(start_paused = true)]
async fn a_callers_x_request_deadline_is_folded_in_and_replaced() {
    use backoff_layer::clock::WallClock;
    let mock = Mock::new(vec![status(503), status(200)]);
    let mut request = get();
    // Sent 500 ms ago with 2 s: 1.5 s left.
    WireDeadline::new(wall().now() - 500 * MS, 2 * SECOND).set(request.headers_mut());
    layer()
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(http_deadlines(&mock), [(0, 1500), (100, 1400)]);

    // A malformed one is no deadline of the caller's, and is replaced.
    let mock = Mock::new(vec![status(200)]);
    let mut request = get();
    request
        .headers_mut()
        .insert(X_REQUEST_DEADLINE, HeaderValue::from_static("soon"));
    layer()
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap();
    assert_eq!(http_deadlines(&mock), [(0, 15_000)]);
}

/// A caller whose deadline has passed gets the deadline outcome at once, and nothing is
/// sent: no attempt after the deadline.
#[tokio::test(start_paused = true)]
async fn nothing_is_sent_once_the_callers_deadline_has_passed() {
    let recorded = Recorded::install();
    let mock = Mock::new(vec![status(200)]);
    let mut request = get();
    request
        .extensions_mut()
        .insert(RequestDeadline::at(Instant::now()));
    let start = Instant::now();
    let err = layer()
        .name("late")
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(request)
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), Duration::ZERO);
    assert!(mock.seen().is_empty(), "nothing was sent");
    let g = gave_up(&err);
    assert_eq!((g.reason(), g.attempts()), (GiveUpReason::Deadline, 0));
    assert_eq!(
        g.source().unwrap().to_string(),
        "the caller's deadline had passed before the request was sent"
    );
    let counts = recorded.snapshot();
    assert_eq!(counts["backoff_layer_requests_total{name=late}"], 1);
    assert_eq!(counts["backoff_layer_attempts_total{name=late}"], 0);
    assert_eq!(
        counts["backoff_layer_gave_up_total{name=late}{reason=deadline}"],
        1
    );
}

/// The wall clock is a setting: the send time is read from it, as a server reads its own.
#[tokio::test(start_paused = true)]
async fn the_send_time_comes_from_the_wall_clock() {
    let mock = Mock::new(vec![status(200)]);
    let ahead = SystemTime::UNIX_EPOCH + Duration::from_millis(2_000_000_000_000);
    RetryLayer::builder()
        .wall_clock(TokioWallClock::starting_at(ahead))
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(get())
        .await
        .unwrap();
    let headers: HeaderMap = mock.seen()[0].headers.clone();
    assert_eq!(
        headers[X_REQUEST_DEADLINE],
        "t=2000000000000, timeout=15000"
    );
}
