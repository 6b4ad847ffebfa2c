//! Behaviour of the retry layer around a scripted mock service, under paused time.

use crate::support;

use std::io::ErrorKind;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use backoff_layer::backoff::{Exponential, Fixed, Seeds};
use backoff_layer::budget::Budget;
use backoff_layer::{AttemptTimedOut, BoxError, GiveUpReason, RetryInfo, RetryLayer, StopSignals};
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use overload_signal::protocol::{Attempt, IDEMPOTENCY_KEY};
use overload_signal::{Overloaded, propagation};
use support::{MS, Mock, Reply, SECOND, gave_up, get, info, status};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

fn layer() -> RetryBuilder {
    RetryLayer::builder()
        .backoff(Fixed::every(100 * MS).unwrap())
        .seeds(Seeds::from_seed(1))
}

async fn send<B>(
    layer: RetryBuilder,
    mock: &Mock,
    request: Request<B>,
) -> Result<Response<Empty<Bytes>>, BoxError>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    layer
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(request)
        .await
}

use backoff_layer::RetryBuilder;

#[tokio::test(start_paused = true)]
async fn attempt_header_is_0_then_1_then_2() {
    let mock = Mock::new(vec![status(503), status(502), status(200)]);
    let r = send(layer(), &mock, get()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        mock.attempts(),
        [Attempt::Number(0), Attempt::Number(1), Attempt::Number(2)]
    );
    assert_eq!(
        info(&r),
        RetryInfo {
            attempts: 3,
            gave_up: None
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_caller_attempt_header_is_replaced_not_appended() {
    let mock = Mock::new(vec![status(200)]);
    let mut req = get();
    req.headers_mut()
        .insert("x-request-attempt", "7".parse().unwrap());
    send(layer(), &mock, req).await.unwrap();
    assert_eq!(
        mock.seen()[0]
            .headers
            .get_all("x-request-attempt")
            .iter()
            .count(),
        1
    );
    assert_eq!(mock.attempts(), [Attempt::Number(0)]);
}

#[tokio::test(start_paused = true)]
async fn success_needs_one_attempt() {
    let mock = Mock::new(vec![status(200)]);
    let start = Instant::now();
    let r = send(layer(), &mock, get()).await.unwrap();
    assert_eq!(info(&r).attempts, 1);
    assert_eq!(mock.seen().len(), 1);
    assert_eq!(start.elapsed(), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn stop_signal_means_exactly_one_attempt_and_a_typed_error() {
    let mock = Mock::new(vec![
        Reply::Status(503, vec![("x-overloaded", "stop-retrying")]),
        status(200),
    ]);
    let mut call = pin!(propagation::scope(send(layer(), &mock, get())));
    let err = call.as_mut().await.unwrap_err();
    assert!(err.is::<Overloaded>(), "{err:?}");
    assert_eq!(mock.seen().len(), 1);
    assert!(
        propagation::stop_received(call.as_mut()),
        "a server layer above must learn about the signal"
    );
}

#[tokio::test(start_paused = true)]
async fn grpc_stop_signal_is_not_retried_either() {
    let mock = Mock::new(vec![
        Reply::Status(
            200,
            vec![
                ("content-type", "application/grpc"),
                ("grpc-status", "14"),
                ("grpc-retry-pushback-ms", "-1"),
            ],
        ),
        status(200),
    ]);
    let err = send(layer(), &mock, get()).await.unwrap_err();
    assert!(overload_signal::is_overloaded(&*err));
    assert_eq!(mock.seen().len(), 1);
}

/// Issue 31, finding 7: a layer in front of a third party honours its stop signal (one
/// attempt, even for a retryable `503`) without passing it up: the failure comes back as a
/// response without the signal, given up on, and the scope is never marked with the stop
/// signal; a retry layer above does not retry it either.
#[tokio::test(start_paused = true)]
async fn honoured_only_the_stop_signal_is_not_retried_nor_passed_up() {
    for (reply, signal_headers) in [
        (
            Reply::Status(
                503,
                vec![("x-overloaded", "stop-retrying"), ("x-kept", "1")],
            ),
            &["x-overloaded"][..],
        ),
        (
            Reply::Status(
                200,
                vec![
                    ("content-type", "application/grpc"),
                    ("grpc-status", "14"),
                    ("grpc-retry-pushback-ms", "-1"),
                    ("x-overloaded", "stop-retrying"),
                    ("x-kept", "1"),
                ],
            ),
            &["x-overloaded", "grpc-retry-pushback-ms"],
        ),
    ] {
        let mock = Mock::new(vec![reply, status(200)]);
        let inner = layer()
            .stop_signals(StopSignals::HonourOnly)
            .build()
            .unwrap();
        let outer = layer().build().unwrap();
        let service = outer.layer(inner.layer(mock.clone()));
        let mut call = pin!(propagation::scope(service.oneshot(get())));
        let response = call.as_mut().await.expect("the failure, as a response");
        assert_eq!(mock.seen().len(), 1, "honoured: one attempt");
        assert!(!overload_signal::protocol::is_stop_signal(
            response.headers()
        ));
        for name in signal_headers {
            assert!(response.headers().get(*name).is_none(), "{name}");
        }
        assert_eq!(response.headers()["x-kept"], "1");
        assert_eq!(
            info(&response),
            RetryInfo {
                attempts: 1,
                gave_up: Some(GiveUpReason::StopSignal)
            }
        );
        let marks = propagation::take_marks(call.as_mut());
        assert!(!marks.stop_signal(), "{marks:?}");
        assert!(marks.contains(propagation::Downstream::GaveUp), "{marks:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn retry_after_delays_the_retry_by_at_least_its_value() {
    let mock = Mock::new(vec![
        Reply::Status(429, vec![("retry-after", "3")]),
        status(200),
    ]);
    // The backoff alone would wait 100 ms; its maximum is large enough not to cap the hint.
    let backoff = Exponential::builder()
        .max_delay(60 * SECOND)
        .jitter(0.0)
        .build()
        .unwrap();
    let r = send(layer().backoff(backoff), &mock, get()).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let seen = mock.seen();
    let waited = seen[1].at - seen[0].at;
    assert!(waited >= 3 * SECOND, "waited only {waited:?}");
    assert!(waited < 4 * SECOND, "waited {waited:?}");
}

#[tokio::test(start_paused = true)]
async fn grpc_pushback_is_a_lower_bound_too() {
    let mock = Mock::new(vec![
        Reply::Status(
            200,
            vec![
                ("content-type", "application/grpc"),
                ("grpc-status", "8"),
                ("grpc-retry-pushback-ms", "1500"),
            ],
        ),
        status(200),
    ]);
    let backoff = Exponential::builder()
        .max_delay(60 * SECOND)
        .jitter(0.0)
        .build()
        .unwrap();
    send(layer().backoff(backoff), &mock, get()).await.unwrap();
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at - seen[0].at, 1500 * MS);
}

/// A hint within `max_retry_after` (30 s by default) is a lower bound even above the
/// strategy's maximum: the server, not the client's backoff, knows when it can take the
/// request again (DESIGN.md's client rules; gRPC's retry design says pushback overrides the
/// backoff). A longer hint, or one past the deadline (15 s by default), gives up at once:
/// see `edges.rs`.
#[tokio::test(start_paused = true)]
async fn a_hint_is_honoured_above_the_strategy_maximum() {
    let mock = Mock::new(vec![
        Reply::Status(503, vec![("retry-after", "12")]),
        status(200),
    ]);
    let backoff = Exponential::builder()
        .max_delay(2 * SECOND)
        .jitter(0.0)
        .build()
        .unwrap();
    send(layer().backoff(backoff), &mock, get()).await.unwrap();
    let seen = mock.seen();
    assert_eq!(seen[1].at - seen[0].at, 12 * SECOND);
}

/// The fixed-interval strategy too: its interval is its maximum, and `Retry-After: 1` still
/// makes it wait 1 s, not 10 ms.
#[tokio::test(start_paused = true)]
async fn a_fixed_interval_waits_for_a_longer_hint() {
    let mock = Mock::new(vec![
        Reply::Status(503, vec![("retry-after", "1")]),
        status(200),
    ]);
    let backoff = Fixed::every(10 * MS).unwrap();
    send(layer().backoff(backoff), &mock, get()).await.unwrap();
    let seen = mock.seen();
    assert_eq!(seen[1].at - seen[0].at, SECOND);
}

#[tokio::test(start_paused = true)]
async fn a_wait_past_the_deadline_gives_up_at_once() {
    let mock = Mock::new(vec![
        Reply::Status(503, vec![("retry-after", "10")]),
        status(200),
    ]);
    let backoff = Exponential::builder()
        .max_delay(60 * SECOND)
        .jitter(0.0)
        .build()
        .unwrap();
    let start = Instant::now();
    let r = send(layer().backoff(backoff).deadline(5 * SECOND), &mock, get())
        .await
        .unwrap();
    assert_eq!(
        start.elapsed(),
        Duration::ZERO,
        "must not sleep towards the deadline"
    );
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        info(&r),
        RetryInfo {
            attempts: 1,
            gave_up: Some(GiveUpReason::Deadline)
        }
    );
    assert_eq!(mock.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_cuts_a_hanging_attempt() {
    let mock = Mock::new(vec![Reply::Hang]);
    let start = Instant::now();
    let err = send(layer().deadline(2 * SECOND), &mock, get())
        .await
        .unwrap_err();
    assert_eq!(start.elapsed(), 2 * SECOND);
    let g = gave_up(&err);
    assert_eq!(g.reason(), GiveUpReason::Deadline);
    assert!(
        std::error::Error::source(g)
            .unwrap()
            .is::<AttemptTimedOut>()
    );
}

#[tokio::test(start_paused = true)]
async fn post_is_not_retried_by_default() {
    let mock = Mock::new(vec![status(503), status(200)]);
    let req = Request::post("http://example.test/")
        .body(Full::new(Bytes::from_static(b"order")))
        .unwrap();
    let r = send(layer(), &mock, req).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(mock.seen().len(), 1);
    assert_eq!(mock.seen()[0].attempt, Attempt::Number(0));
    assert_eq!(info(&r).gave_up, Some(GiveUpReason::NotRetryable));
}

#[tokio::test(start_paused = true)]
async fn post_with_an_idempotency_key_is_retried() {
    let mock = Mock::new(vec![status(503), status(200)]);
    let req = Request::post("http://example.test/")
        .header(IDEMPOTENCY_KEY, "8e03978e")
        .body(Full::new(Bytes::from_static(b"order")))
        .unwrap();
    let r = send(layer(), &mock, req).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].body, "order");
}

#[tokio::test(start_paused = true)]
async fn a_body_one_byte_over_64_kib_is_sent_once_and_whole() {
    let big = Bytes::from(vec![7u8; 64 * 1024 + 1]);
    let mock = Mock::new(vec![status(503), status(200)]);
    let req = Request::put("http://example.test/")
        .body(Full::new(big.clone()))
        .unwrap();
    let r = send(layer(), &mock, req).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(info(&r).gave_up, Some(GiveUpReason::BodyNotReplayable));
    let seen = mock.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, big);
}

#[tokio::test(start_paused = true)]
async fn a_streamed_body_that_grows_over_the_limit_is_sent_once_and_whole() {
    // 17 chunks of 4 KiB: 68 KiB, with no size hint, so the layer finds out while streaming.
    let mock = Mock::new(vec![status(503), status(200)]);
    let req = Request::put("http://example.test/")
        .body(support::streamed(17, 4096))
        .unwrap();
    let r = send(layer(), &mock, req).await.unwrap();
    assert_eq!(info(&r).gave_up, Some(GiveUpReason::BodyNotReplayable));
    let seen = mock.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].body, support::expected_bytes(17, 4096));
}

#[tokio::test(start_paused = true)]
async fn a_replayed_body_is_identical_to_the_original() {
    // 16 chunks of 4 KiB: exactly 64 KiB, the largest replayable body; plus trailers.
    let mock = Mock::new(vec![
        status(503),
        Reply::Io(ErrorKind::ConnectionRefused),
        status(200),
    ]);
    let req = Request::put("http://example.test/")
        .body(support::streamed(16, 4096))
        .unwrap();
    let r = send(layer(), &mock, req).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let seen = mock.seen();
    assert_eq!(seen.len(), 3);
    let original = support::expected_bytes(16, 4096);
    for s in &seen {
        assert_eq!(s.body, original, "attempt {}", s.attempt);
        assert_eq!(s.method, Method::PUT);
    }
}

#[tokio::test(start_paused = true)]
async fn max_attempts_bounds_retries() {
    let mock = Mock::new(vec![status(503)]);
    let r = send(layer().max_attempts(4), &mock, get()).await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        info(&r),
        RetryInfo {
            attempts: 4,
            gave_up: Some(GiveUpReason::MaxAttempts)
        }
    );
    assert_eq!(mock.seen().len(), 4);
}

#[tokio::test(start_paused = true)]
async fn max_attempts_one_turns_retries_off() {
    let mock = Mock::new(vec![status(503), status(200)]);
    let r = send(layer().max_attempts(1), &mock, get()).await.unwrap();
    assert_eq!(info(&r).gave_up, Some(GiveUpReason::NotRetryable));
    assert_eq!(mock.seen().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn waits_follow_the_backoff_strategy() {
    let mock = Mock::new(vec![status(503)]);
    let backoff = Exponential::builder()
        .max_delay(60 * SECOND)
        .factor(3.0)
        .jitter(0.0)
        .build()
        .unwrap();
    send(layer().backoff(backoff).max_attempts(4), &mock, get())
        .await
        .unwrap();
    let seen = mock.seen();
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].at - w[0].at).collect();
    assert_eq!(gaps, [100 * MS, 300 * MS, 900 * MS]);
}

#[tokio::test(start_paused = true)]
async fn two_requests_draw_different_jitter() {
    let backoff = Exponential::builder()
        .max_delay(60 * SECOND)
        .jitter(0.5)
        .build()
        .unwrap();
    let layer = layer().backoff(backoff).build().unwrap();
    let mut gaps = Vec::new();
    for _ in 0..2 {
        let mock = Mock::new(vec![status(503), status(200)]);
        layer.layer(mock.clone()).oneshot(get()).await.unwrap();
        let seen = mock.seen();
        gaps.push(seen[1].at - seen[0].at);
    }
    assert_ne!(gaps[0], gaps[1]);
}

#[derive(Debug, Default)]
struct Counting {
    deposits: AtomicU32,
    withdrawals: AtomicU32,
    allow: u32,
}

impl Budget for Counting {
    fn deposit(&self) {
        self.deposits.fetch_add(1, Ordering::Relaxed);
    }

    fn withdraw(&self) -> bool {
        self.withdrawals.fetch_add(1, Ordering::Relaxed) < self.allow
    }
}

#[tokio::test(start_paused = true)]
async fn budget_refusal_is_typed_for_responses_and_errors() {
    let budget = Arc::new(Counting {
        allow: 1,
        ..Counting::default()
    });
    let layer = layer()
        .max_attempts(5)
        .shared_budget(Arc::clone(&budget) as Arc<dyn Budget>);

    let mock = Mock::new(vec![status(503)]);
    let r = send(layer, &mock, get()).await.unwrap();
    assert_eq!(
        info(&r),
        RetryInfo {
            attempts: 2,
            gave_up: Some(GiveUpReason::BudgetExhausted)
        }
    );
    assert_eq!(budget.deposits.load(Ordering::Relaxed), 1);
    assert_eq!(budget.withdrawals.load(Ordering::Relaxed), 2);

    let layer = RetryLayer::builder()
        .backoff(Fixed::every(100 * MS).unwrap())
        .shared_budget(Arc::clone(&budget) as Arc<dyn Budget>);
    let mock = Mock::new(vec![Reply::Io(ErrorKind::ConnectionRefused)]);
    let err = send(layer, &mock, get()).await.unwrap_err();
    let g = gave_up(&err);
    assert_eq!(g.reason(), GiveUpReason::BudgetExhausted);
    assert_eq!(g.attempts(), 1);
    let source = std::error::Error::source(g).unwrap();
    assert_eq!(
        source.downcast_ref::<std::io::Error>().unwrap().kind(),
        ErrorKind::ConnectionRefused
    );
}

#[tokio::test(start_paused = true)]
async fn connect_errors_are_retried_and_other_errors_returned_as_is() {
    let mock = Mock::new(vec![Reply::Io(ErrorKind::ConnectionRefused), status(200)]);
    let r = send(layer(), &mock, get()).await.unwrap();
    assert_eq!(info(&r).attempts, 2);

    let mock = Mock::new(vec![Reply::Io(ErrorKind::InvalidData), status(200)]);
    let err = send(layer(), &mock, get()).await.unwrap_err();
    assert_eq!(
        err.downcast_ref::<std::io::Error>().unwrap().kind(),
        ErrorKind::InvalidData
    );
    assert_eq!(mock.seen().len(), 1);

    let mock = Mock::new(vec![Reply::Io(ErrorKind::ConnectionRefused)]);
    let err = send(layer(), &mock, get()).await.unwrap_err();
    assert_eq!(gave_up(&err).reason(), GiveUpReason::MaxAttempts);
    assert_eq!(gave_up(&err).attempts(), 3);
}

#[tokio::test(start_paused = true)]
async fn an_attempt_timeout_is_a_retryable_failure() {
    let mock = Mock::new(vec![Reply::Hang, status(200)]);
    let start = Instant::now();
    let r = send(layer().attempt_timeout(SECOND), &mock, get())
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(info(&r).attempts, 2);
    assert_eq!(start.elapsed(), SECOND + 100 * MS);

    let mock = Mock::new(vec![Reply::Hang]);
    let err = send(layer().attempt_timeout(SECOND), &mock, get())
        .await
        .unwrap_err();
    let g = gave_up(&err);
    assert_eq!(g.reason(), GiveUpReason::MaxAttempts);
    assert!(
        std::error::Error::source(g)
            .unwrap()
            .is::<AttemptTimedOut>()
    );
    assert!(backoff_layer::classify::is_timeout(&*err));
}

#[tokio::test(start_paused = true)]
async fn final_statuses_are_returned_with_no_retry() {
    for code in [200, 404, 500] {
        let mock = Mock::new(vec![status(code), status(200)]);
        let r = send(layer(), &mock, get()).await.unwrap();
        assert_eq!(r.status().as_u16(), code);
        assert_eq!(
            info(&r),
            RetryInfo {
                attempts: 1,
                gave_up: None
            }
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_layer_is_reusable_and_clones_share_it() {
    let mock = Mock::new(vec![status(200)]);
    let svc = layer().build().unwrap().layer(mock.clone());
    for _ in 0..3 {
        svc.clone().oneshot(get()).await.unwrap();
    }
    assert_eq!(mock.seen().len(), 3);
}

/// The readiness contract (tower-test's mock panics on a call it did not say it was ready
/// for): every retry waits for the inner service to be ready again, and a retry does not
/// start while the service is not.
#[tokio::test(start_paused = true)]
async fn every_retry_waits_for_readiness() {
    let (mock, mut handle) = tower_test::mock::pair::<
        Request<backoff_layer::ReplayBody<Empty<Bytes>>>,
        Response<Empty<Bytes>>,
    >();
    handle.allow(1);
    let svc = layer().build().unwrap().layer(mock);
    let call = tokio::spawn(svc.oneshot(get()));

    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(Attempt::from_request(&req), Attempt::Number(0));
    let mut unavailable = Response::new(Empty::new());
    *unavailable.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    send.send_response(unavailable);

    // The backoff (100 ms) passes, but the service has no capacity: no retry is sent.
    tokio::time::sleep(SECOND).await;
    assert!(handle.poll_request().is_pending());

    handle.allow(1);
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(Attempt::from_request(&req), Attempt::Number(1));
    send.send_response(Response::new(Empty::new()));
    let response = call.await.unwrap().unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(info(&response).attempts, 2);
}

/// The answers Envoy makes itself when it sheds a request (`503` with
/// `x-envoy-overloaded`) or its rate limiter refuses one (`429` with
/// `x-envoy-ratelimited: true`, also what our servers' stop signal carries through Envoy).
fn envoys_stop_answers() -> [Reply; 2] {
    [
        Reply::Status(503, vec![("x-envoy-overloaded", "true")]),
        Reply::Status(429, vec![("x-envoy-ratelimited", "true")]),
    ]
}

/// Issue 32: Envoy's shedding and rate-limiting answers are the stop signal for our client:
/// one attempt, no budget spent, the caller gets `Overloaded` and the scope is marked
/// (passed up), and the throttle counts them as failures, as it counts our stop signal.
#[tokio::test(start_paused = true)]
async fn envoys_shed_and_rate_limited_answers_are_the_stop_signal() {
    for reply in envoys_stop_answers() {
        let budget = Arc::new(Counting {
            allow: u32::MAX,
            ..Counting::default()
        });
        let throttle = backoff_layer::throttle::Throttle::builder()
            .min_failures(1)
            .build()
            .unwrap();
        let layer = layer()
            .shared_budget(Arc::clone(&budget) as Arc<dyn Budget>)
            .throttle(throttle.clone())
            .build()
            .unwrap();
        let mock = Mock::new(vec![reply.clone(), status(200)]);
        let service = layer.layer(mock.clone());
        let mut call = pin!(propagation::scope(service.clone().oneshot(get())));
        let err = call.as_mut().await.unwrap_err();
        assert!(err.is::<Overloaded>(), "{reply:?}: {err:?}");
        assert_eq!(mock.seen().len(), 1, "{reply:?}: one attempt");
        assert_eq!(budget.withdrawals.load(Ordering::Relaxed), 0, "{reply:?}");
        assert!(propagation::stop_received(call.as_mut()), "{reply:?}");
        // The throttle counts them as failures: after a few, it refuses some sends.
        let mock = Mock::new(vec![reply.clone()]);
        let service = layer.layer(mock.clone());
        for _ in 0..20 {
            let _ = service.clone().oneshot(get()).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        let p = throttle.probability(&"http://example.test/".parse().unwrap());
        assert!(p > 0.5, "{reply:?}: refusal probability {p}");
    }
}

/// Issue 32: honoured only (a third party behind Envoy), Envoy's signals are taken out of
/// the failure as ours are, so that a gateway passing it back does not tell its callers
/// to stop.
#[tokio::test(start_paused = true)]
async fn honoured_only_envoys_signals_are_taken_out() {
    for reply in envoys_stop_answers() {
        let mock = Mock::new(vec![reply.clone(), status(200)]);
        let layer = layer()
            .stop_signals(StopSignals::HonourOnly)
            .build()
            .unwrap();
        let mut call = pin!(propagation::scope(layer.layer(mock.clone()).oneshot(get())));
        let response = call.as_mut().await.expect("the failure, as a response");
        assert_eq!(mock.seen().len(), 1, "{reply:?}");
        assert!(!overload_signal::protocol::is_stop_signal(
            response.headers()
        ));
        assert!(response.headers().get("x-envoy-overloaded").is_none());
        assert!(response.headers().get("x-envoy-ratelimited").is_none());
        assert!(!propagation::take_marks(call.as_mut()).stop_signal());
    }
}

/// A plain `503`, or one whose Envoy headers say nothing (`x-envoy-ratelimited: false`),
/// is still retried.
#[tokio::test(start_paused = true)]
async fn a_plain_503_behind_envoy_is_still_retried() {
    for reply in [
        status(503),
        Reply::Status(503, vec![("x-envoy-ratelimited", "false")]),
    ] {
        let mock = Mock::new(vec![reply, status(200)]);
        let r = send(layer(), &mock, get()).await.unwrap();
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(mock.seen().len(), 2);
    }
}

/// Issue 32: a request whose caller left Envoy's or gRPC's attempt counter on it (a gateway
/// forwarding its own request's headers) reaches the downstream without them: they count
/// the caller's attempts at this tier, not ours at the next, and a server reads the largest
/// counter it is sent.
#[tokio::test(start_paused = true)]
async fn a_callers_proxy_counters_are_not_forwarded() {
    let mock = Mock::new(vec![status(503), status(200)]);
    let mut req = get();
    req.headers_mut()
        .insert("x-envoy-attempt-count", "3".parse().unwrap());
    req.headers_mut()
        .insert("grpc-previous-rpc-attempts", "2".parse().unwrap());
    send(layer(), &mock, req).await.unwrap();
    assert_eq!(mock.attempts(), [Attempt::Number(0), Attempt::Number(1)]);
    for seen in mock.seen() {
        assert!(seen.headers.get("x-envoy-attempt-count").is_none());
        assert!(seen.headers.get("grpc-previous-rpc-attempts").is_none());
    }
}
