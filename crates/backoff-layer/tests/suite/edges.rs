//! The client's promises at the edges (issue 12): each test pins one way the retry layer used
//! to break them, under paused time around the scripted mock.

use crate::support;

use std::error::Error as _;
use std::io::ErrorKind;
use std::pin::pin;
use std::time::Duration;

use backoff_layer::backoff::{Exponential, Fixed, Seeds};
use backoff_layer::budget::Unlimited;
use backoff_layer::{AttemptTimedOut, GiveUpReason, RetryInfo, RetryLayer};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{Empty, Full};
use overload_signal::protocol::Attempt;
use overload_signal::{is_overloaded, propagation};
use support::{MS, Mock, Reply, SECOND, gave_up, get, info, status};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

use backoff_layer::RetryBuilder;

fn layer() -> RetryBuilder {
    RetryLayer::builder()
        .backoff(Fixed::every(100 * MS).unwrap())
        .budget(Unlimited)
        .seeds(Seeds::from_seed(1))
}

/// A unary gRPC call as tonic sends it: a `POST` with `content-type: application/grpc` and a
/// length-prefixed message.
fn grpc_call() -> Request<Full<Bytes>> {
    Request::post("http://example.test/grpc.health.v1.Health/Check")
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(Bytes::from_static(b"\0\0\0\0\x03\x0a\x01x")))
        .unwrap()
}

/// A trailers-only gRPC answer with this status and extra headers.
fn grpc(code: &'static str, extra: &[(&'static str, &'static str)]) -> Reply {
    let mut headers = vec![("content-type", "application/grpc"), ("grpc-status", code)];
    headers.extend_from_slice(extra);
    Reply::Status(200, headers)
}

// --- 1. The stop signal counts on failures only. ---------------------------------------------

/// Regression: a `200` carrying `X-Overloaded` (any proxy may set that header) became
/// `Err(Overloaded)`, dropped the body and raised the propagation marker.
#[tokio::test(start_paused = true)]
async fn a_success_carrying_the_stop_signal_headers_is_a_success() {
    let cases = [
        Reply::Status(200, vec![("x-overloaded", "stop-retrying")]),
        Reply::Status(204, vec![("x-overloaded", "")]),
        // Not a failure either: a client error is final, whatever its headers.
        Reply::Status(404, vec![("x-overloaded", "stop-retrying")]),
        // gRPC OK, even with a negative pushback and the header.
        grpc(
            "0",
            &[
                ("x-overloaded", "stop-retrying"),
                ("grpc-retry-pushback-ms", "-1"),
            ],
        ),
    ];
    for reply in cases {
        let mock = Mock::new(vec![reply.clone(), status(500)]);
        let service = layer().build().unwrap().layer(mock.clone());
        let mut call = pin!(propagation::scope(service.oneshot(get())));
        let response = call
            .as_mut()
            .await
            .unwrap_or_else(|e| panic!("{reply:?}: {e}"));
        let Reply::Status(code, _) = reply else {
            unreachable!()
        };
        assert_eq!(response.status().as_u16(), code);
        assert_eq!(
            info(&response),
            RetryInfo {
                attempts: 1,
                gave_up: None
            },
            "{reply:?}"
        );
        assert_eq!(mock.seen().len(), 1);
        assert!(
            !propagation::stop_received(call.as_mut()),
            "{reply:?}: a success must not raise the propagation marker"
        );
    }
}

/// The signal still stops every failure form: 429, 5xx, and a non-OK gRPC status.
#[tokio::test(start_paused = true)]
async fn the_stop_signal_on_a_failure_is_never_retried() {
    let cases = [
        Reply::Status(429, vec![("x-overloaded", "1")]),
        Reply::Status(500, vec![("x-overloaded", "stop-retrying")]),
        Reply::Status(503, vec![("x-overloaded", "stop-retrying")]),
        grpc("14", &[("x-overloaded", "stop-retrying")]),
        grpc("8", &[("grpc-retry-pushback-ms", "-1")]),
    ];
    for reply in cases {
        let mock = Mock::new(vec![reply.clone(), status(200)]);
        let service = layer().build().unwrap().layer(mock.clone());
        let mut call = pin!(propagation::scope(service.oneshot(get())));
        let err = call.as_mut().await.unwrap_err();
        assert!(is_overloaded(&*err), "{reply:?}: {err}");
        assert_eq!(mock.seen().len(), 1, "{reply:?}");
        assert!(propagation::stop_received(call.as_mut()), "{reply:?}");
    }
}

// --- 2. Nested retry layers do not multiply. -------------------------------------------------

/// Regression: `GaveUp`'s source chain made an outer layer see a timeout or a connect error,
/// and a given-up `503` looked like any `503`: two nested layers of 3 attempts sent 9.
#[tokio::test(start_paused = true)]
async fn nested_retry_layers_send_exactly_the_inner_attempts() {
    let scripts = [
        vec![status(503)],
        vec![Reply::Io(ErrorKind::ConnectionRefused)],
        vec![Reply::Hang],
        vec![grpc("14", &[])],
    ];
    for script in scripts {
        let mock = Mock::new(script.clone());
        let inner = layer().attempt_timeout(SECOND).build().unwrap();
        let outer = layer().build().unwrap();
        let service = outer.layer(inner.layer(mock.clone()));
        let _ = service.oneshot(get()).await;
        assert_eq!(
            mock.attempts(),
            [Attempt::Number(0), Attempt::Number(1), Attempt::Number(2)],
            "{script:?}"
        );
    }
}

/// What the outer layer returns is the inner layer's verdict, unchanged.
#[tokio::test(start_paused = true)]
async fn an_outer_layer_returns_the_inner_verdict() {
    let mock = Mock::new(vec![status(503)]);
    let service = layer()
        .max_attempts(5)
        .build()
        .unwrap()
        .layer(layer().build().unwrap().layer(mock.clone()));
    let response = service.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(
        info(&response),
        RetryInfo {
            attempts: 3,
            gave_up: Some(GiveUpReason::MaxAttempts)
        }
    );

    let mock = Mock::new(vec![Reply::Io(ErrorKind::ConnectionRefused)]);
    let service = layer()
        .max_attempts(5)
        .build()
        .unwrap()
        .layer(layer().build().unwrap().layer(mock.clone()));
    let err = service.oneshot(get()).await.unwrap_err();
    assert_eq!(gave_up(&err).attempts(), 3);
    assert_eq!(gave_up(&err).reason(), GiveUpReason::MaxAttempts);
}

// --- 3. Server hints are capped. -------------------------------------------------------------

/// Regression: a hostile server's `Retry-After` or pushback parked the request (its buffered
/// body and a budget token) for the backoff's maximum, 15 minutes by default.
#[tokio::test(start_paused = true)]
async fn a_hostile_hint_gives_up_at_once() {
    let hostile = [
        Reply::Status(503, vec![("retry-after", "99999999999")]),
        Reply::Status(429, vec![("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")]),
        grpc("8", &[("grpc-retry-pushback-ms", "86400000")]),
        grpc("14", &[("grpc-retry-pushback-ms", "2147483647")]),
    ];
    for reply in hostile {
        let mock = Mock::new(vec![reply.clone(), status(200)]);
        // Every default but the seed: the article's backoff, up to 15 minutes.
        let service = RetryLayer::builder()
            .seeds(Seeds::from_seed(1))
            .build()
            .unwrap()
            .layer(mock.clone());
        let start = Instant::now();
        let response = service.oneshot(get()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::ZERO, "{reply:?}: must not wait");
        assert_eq!(mock.seen().len(), 1, "{reply:?}");
        assert_eq!(
            info(&response),
            RetryInfo {
                attempts: 1,
                gave_up: Some(GiveUpReason::RetryAfterTooLong)
            },
            "{reply:?}"
        );
    }
}

/// The cap is a setting: a hint up to it is waited out, one beyond it is not.
#[tokio::test(start_paused = true)]
async fn max_retry_after_is_the_longest_hint_honoured() {
    let backoff = Exponential::builder()
        .max_delay(60 * SECOND)
        .jitter(0.0)
        .build()
        .unwrap();
    for (hint, waited) in [("5", Some(5 * SECOND)), ("6", None)] {
        let mock = Mock::new(vec![
            Reply::Status(429, vec![("retry-after", hint)]),
            status(200),
        ]);
        let start = Instant::now();
        let response = layer()
            .backoff(backoff)
            .max_retry_after(5 * SECOND)
            .build()
            .unwrap()
            .layer(mock.clone())
            .oneshot(get())
            .await
            .unwrap();
        match waited {
            Some(wait) => {
                assert_eq!(response.status(), StatusCode::OK);
                assert_eq!(start.elapsed(), wait);
            }
            None => {
                assert_eq!(start.elapsed(), Duration::ZERO);
                assert_eq!(
                    info(&response).gave_up,
                    Some(GiveUpReason::RetryAfterTooLong)
                );
            }
        }
    }
}

/// The default cap is 30 s: 31 s is refused.
#[tokio::test(start_paused = true)]
async fn the_default_cap_refuses_a_hint_of_31_seconds() {
    let mock = Mock::new(vec![
        Reply::Status(503, vec![("retry-after", "31")]),
        status(200),
    ]);
    let response = RetryLayer::new()
        .layer(mock.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(
        info(&response).gave_up,
        Some(GiveUpReason::RetryAfterTooLong)
    );
    assert_eq!(mock.seen().len(), 1);
}

/// A hint just within the cap is honoured in full (the default backoff's maximum, 15 min,
/// does not cut it) when no deadline comes first.
#[tokio::test(start_paused = true)]
async fn a_hint_within_the_cap_is_waited_out() {
    let mock = Mock::new(vec![
        Reply::Status(503, vec![("retry-after", "30")]),
        status(200),
    ]);
    let service = RetryLayer::builder()
        .seeds(Seeds::from_seed(1))
        .no_deadline()
        .build()
        .unwrap()
        .layer(mock.clone());
    let response = service.oneshot(get()).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    assert!(seen[1].at - seen[0].at >= 30 * SECOND);
    assert!(seen[1].at - seen[0].at < 31 * SECOND);
}

/// Under the default deadline (15 s), a hint within the cap that would end after the
/// deadline is given up on at once, as Envoy never waits past its route timeout.
#[tokio::test(start_paused = true)]
async fn a_hint_past_the_default_deadline_gives_up_at_once() {
    let mock = Mock::new(vec![
        Reply::Status(503, vec![("retry-after", "20")]),
        status(200),
    ]);
    let started = Instant::now();
    let response = RetryLayer::new()
        .layer(mock.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(info(&response).gave_up, Some(GiveUpReason::Deadline));
    assert_eq!(mock.seen().len(), 1);
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "no wait towards the deadline"
    );
}

// --- 4. The deadline holds while waiting for readiness. --------------------------------------

/// Regression: after the backoff, an inner service that stayed not ready (a concurrency
/// limit, a full buffer, an exhausted pool) let the deadline pass unseen, and the late
/// attempt was sent once it became ready.
#[tokio::test(start_paused = true)]
async fn the_deadline_holds_while_the_inner_service_is_not_ready() {
    let (mock, mut handle) = tower_test::mock::pair::<
        Request<backoff_layer::ReplayBody<Empty<Bytes>>>,
        Response<Empty<Bytes>>,
    >();
    handle.allow(1);
    let service = layer().deadline(2 * SECOND).build().unwrap().layer(mock);
    let start = Instant::now();
    let call = tokio::spawn(tokio::time::timeout(60 * SECOND, service.oneshot(get())));

    let (_, send) = handle.next_request().await.unwrap();
    let mut unavailable = Response::new(Empty::new());
    *unavailable.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    send.send_response(unavailable);

    let outcome = call
        .await
        .unwrap()
        .expect("the call must end at the deadline, not wait for readiness");
    assert_eq!(start.elapsed(), 2 * SECOND);
    let err = outcome.unwrap_err();
    let g = gave_up(&err);
    assert_eq!(g.reason(), GiveUpReason::Deadline);
    assert_eq!(g.attempts(), 1);
    assert!(g.source().unwrap().is::<AttemptTimedOut>());

    // Capacity comes back after the deadline: nothing is sent (the layer has dropped its
    // clone of the service, so the mock reports no request, pending or closed).
    handle.allow(1);
    tokio::task::yield_now().await;
    assert!(
        !matches!(handle.poll_request(), std::task::Poll::Ready(Some(_))),
        "no attempt may be sent after the deadline"
    );
}

/// A failure that comes back at the deadline ends the request there, even one the classifier
/// calls final: the deadline, not the race between two timers, decides.
#[tokio::test(start_paused = true)]
async fn a_failure_at_the_deadline_is_a_deadline() {
    let mock = Mock::new(vec![Reply::Late(2 * SECOND, 500), status(200)]);
    let response = layer()
        .deadline(2 * SECOND)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(get())
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(
        info(&response),
        RetryInfo {
            attempts: 1,
            gave_up: Some(GiveUpReason::Deadline)
        }
    );
}

// --- 5. gRPC is retried by gRPC's rules. -----------------------------------------------------

/// Regression: every gRPC call is a `POST`, so the default classifier never retried one: a
/// `RESOURCE_EXHAUSTED` with pushback came back at once.
#[tokio::test(start_paused = true)]
async fn grpc_resource_exhausted_is_retried_after_the_pushback() {
    let mock = Mock::new(vec![
        grpc("8", &[("grpc-retry-pushback-ms", "1500")]),
        grpc("0", &[]),
    ]);
    // The backoff alone would wait 100 ms; its maximum is large enough not to cap the hint.
    let backoff = Exponential::builder()
        .max_delay(60 * SECOND)
        .jitter(0.0)
        .build()
        .unwrap();
    let response = layer()
        .backoff(backoff)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(grpc_call())
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    let seen = mock.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        seen[1].at - seen[0].at,
        1500 * MS,
        "pushback is a lower bound"
    );
    assert_eq!(seen[0].body, seen[1].body, "the message is replayed");
    assert_eq!(seen[1].attempt, Attempt::Number(1));
}

/// A budget that refuses every retry.
struct Spent;

impl backoff_layer::budget::Budget for Spent {
    fn deposit(&self) {}
    fn withdraw(&self) -> bool {
        false
    }
}

/// Issue 30 (a proxy's answers): a retry layer that gives up because its budget is spent
/// (the paper's retry storm) raises the stop-signal mark, so that a server above answers
/// its caller with the stop signal and the tier above does not retry in turn; one that
/// gives up for another reason raises the give-up mark only.
#[tokio::test(start_paused = true)]
async fn a_spent_budget_tells_the_tier_above_to_stop() {
    use overload_signal::propagation::{Downstream, scope, take_marks};
    for (budget_spent, stop) in [(true, true), (false, false)] {
        let mock = Mock::new(vec![status(503), status(503), status(503)]);
        let builder = layer().max_attempts(2);
        let builder = if budget_spent {
            builder.budget(Spent)
        } else {
            builder
        };
        let service = builder.build().unwrap().layer(mock.clone());
        let mut call = pin!(scope(service.oneshot(get())));
        let response = call.as_mut().await.unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        let marks = take_marks(call.as_mut());
        assert_eq!(marks.stop_signal(), stop, "budget spent: {budget_spent}");
        assert_eq!(marks.contains(Downstream::GaveUp), !stop);
    }
}

/// Regression (issue 30, finding 7): a `grpc-retry-pushback-ms` that did not parse was
/// ignored and the call retried; by gRPC's retry design (A6), a pushback that is negative,
/// not a number, or beyond the 32-bit range means "do not retry".
#[tokio::test(start_paused = true)]
async fn a_pushback_that_does_not_parse_means_do_not_retry() {
    for junk in ["soon", "1.5", "", "+5", "2147483648", "99999999999999"] {
        let mock = Mock::new(vec![
            grpc("14", &[("grpc-retry-pushback-ms", junk)]),
            grpc("0", &[]),
        ]);
        let err = layer()
            .build()
            .unwrap()
            .layer(mock.clone())
            .oneshot(grpc_call())
            .await
            .unwrap_err();
        assert!(is_overloaded(&*err), "{junk:?}: {err}");
        assert_eq!(mock.seen().len(), 1, "{junk:?}: never retried");
    }
}

/// Regression (issue 30, finding 7): gRPC's retry design (A6) starts the backoff over after
/// a pushback; the layer went on from where it was.
#[tokio::test(start_paused = true)]
async fn a_pushback_starts_the_backoff_over() {
    let mock = Mock::new(vec![
        grpc("14", &[]),
        grpc("14", &[]),
        grpc("8", &[("grpc-retry-pushback-ms", "10")]),
        grpc("14", &[]),
        grpc("0", &[]),
    ]);
    // 100 ms, 200 ms, 400 ms, ... without jitter.
    let backoff = Exponential::builder().jitter(0.0).build().unwrap();
    let response = layer()
        .backoff(backoff)
        .max_attempts(5)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(grpc_call())
        .await
        .unwrap();
    assert_eq!(response.headers()["grpc-status"], "0");
    let seen = mock.seen();
    let gaps: Vec<Duration> = seen.windows(2).map(|w| w[1].at - w[0].at).collect();
    // 100, 200; then the backoff's 400 (above the 10 ms pushback); then from the start: 100.
    assert_eq!(gaps, [100 * MS, 200 * MS, 400 * MS, 100 * MS]);
}

#[tokio::test(start_paused = true)]
async fn grpc_default_retryable_codes_are_unavailable_and_resource_exhausted() {
    for (code, retried) in [
        ("14", true),
        ("8", true), // without pushback too
        ("13", false),
        ("4", false),
        ("2", false),
        ("3", false),
    ] {
        let mock = Mock::new(vec![grpc(code, &[]), grpc("0", &[])]);
        let response = layer()
            .build()
            .unwrap()
            .layer(mock.clone())
            .oneshot(grpc_call())
            .await
            .unwrap();
        let attempts = if retried { 2 } else { 1 };
        assert_eq!(mock.seen().len(), attempts, "grpc-status {code}");
        assert_eq!(
            info(&response),
            RetryInfo {
                attempts: attempts as u32,
                gave_up: None
            },
            "grpc-status {code}"
        );
    }
}

/// The retryable codes are a setting.
#[tokio::test(start_paused = true)]
async fn grpc_retryable_codes_are_a_builder_setting() {
    for (code, retried) in [("13", true), ("14", false), ("8", false)] {
        let mock = Mock::new(vec![grpc(code, &[]), grpc("0", &[])]);
        layer()
            .grpc_retryable_codes(&[13])
            .build()
            .unwrap()
            .layer(mock.clone())
            .oneshot(grpc_call())
            .await
            .unwrap();
        assert_eq!(mock.seen().len(), if retried { 2 } else { 1 }, "{code}");
    }
}

/// gRPC's deadline travels with each attempt: `grpc-timeout` carries the time the attempt
/// may still take.
#[tokio::test(start_paused = true)]
async fn grpc_timeout_carries_the_remaining_deadline_on_each_attempt() {
    let mock = Mock::new(vec![grpc("14", &[]), grpc("14", &[]), grpc("0", &[])]);
    layer()
        .deadline(10 * SECOND)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(grpc_call())
        .await
        .unwrap();
    let timeouts: Vec<String> = mock
        .seen()
        .iter()
        .map(|s| s.headers["grpc-timeout"].to_str().unwrap().to_owned())
        .collect();
    // 10 s, then 10 s less 100 ms of backoff, then less 200 ms.
    assert_eq!(timeouts, ["10000000u", "9900000u", "9800000u"]);
}

/// A shorter per-attempt timeout, or what is left of a shorter `grpc-timeout` of the
/// caller's, is what the server is told; a plain HTTP request gets no `grpc-timeout`.
#[tokio::test(start_paused = true)]
async fn grpc_timeout_is_the_shortest_promise() {
    let timeouts = async |layer: RetryBuilder, request: Request<Full<Bytes>>| {
        let mock = Mock::new(vec![grpc("14", &[]), grpc("0", &[])]);
        layer
            .build()
            .unwrap()
            .layer(mock.clone())
            .oneshot(request)
            .await
            .unwrap();
        mock.seen()
            .iter()
            .map(|s| {
                s.headers
                    .get("grpc-timeout")
                    .map(|v| v.to_str().unwrap().to_owned())
            })
            .collect::<Vec<_>>()
    };
    let some = |v: &[&str]| v.iter().map(|v| Some((*v).to_owned())).collect::<Vec<_>>();

    let per_attempt = layer().deadline(10 * SECOND).attempt_timeout(2 * SECOND);
    assert_eq!(
        timeouts(per_attempt, grpc_call()).await,
        some(&["2000000u", "2000000u"])
    );

    // The caller's own, shorter timeout is folded into the deadline: each attempt carries
    // what is left of it. (Regression, issue 22: the caller's value was kept verbatim, so
    // after 100 ms of backoff the retry told the server 9.9 s, the layer's deadline, when
    // the caller had 9.85 s left.)
    let mut callers = grpc_call();
    callers
        .headers_mut()
        .insert("grpc-timeout", "9950m".parse().unwrap());
    assert_eq!(
        timeouts(layer().deadline(10 * SECOND), callers).await,
        some(&["9950000u", "9850000u"])
    );

    let plain = Request::get("http://example.test/")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let mock = Mock::new(vec![status(503), status(200)]);
    layer()
        .deadline(10 * SECOND)
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(plain)
        .await
        .unwrap();
    assert!(
        mock.seen()
            .iter()
            .all(|s| !s.headers.contains_key("grpc-timeout"))
    );

    // No deadline, no timeout: nothing to tell.
    assert_eq!(timeouts(layer(), grpc_call()).await, [None, None]);
}

/// A gRPC stop signal nested two layers deep is still one attempt.
#[tokio::test(start_paused = true)]
async fn a_stop_signal_below_is_final_above() {
    let mock = Mock::new(vec![grpc(
        "14",
        &[
            ("x-overloaded", "stop-retrying"),
            ("grpc-retry-pushback-ms", "-1"),
        ],
    )]);
    let service = layer()
        .build()
        .unwrap()
        .layer(layer().build().unwrap().layer(mock.clone()));
    let err = service.oneshot(grpc_call()).await.unwrap_err();
    assert!(is_overloaded(&*err));
    assert_eq!(mock.seen().len(), 1);
}

/// Regression: a deadline or a timeout too far away to represent as an instant panicked on
/// overflow; it is no deadline.
#[tokio::test(start_paused = true)]
async fn a_deadline_past_the_end_of_time_is_no_deadline() {
    for builder in [
        layer().deadline(Duration::MAX),
        layer().attempt_timeout(Duration::MAX),
        layer()
            .deadline(Duration::MAX)
            .attempt_timeout(Duration::MAX),
    ] {
        let mock = Mock::new(vec![status(503), grpc("0", &[])]);
        let response = builder
            .build()
            .unwrap()
            .layer(mock.clone())
            .oneshot(grpc_call())
            .await
            .unwrap();
        assert_eq!(info(&response).attempts, 2);
    }
}
