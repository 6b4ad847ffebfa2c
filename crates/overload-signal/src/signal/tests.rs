use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::Full;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tower::{Service, ServiceExt, service_fn};

use crate::Trust;

use super::state::{SignalSettings, SignalState};
use super::*;
use crate::histogram::{AttemptClass, AttemptHistogram};
use crate::metric_names;
use crate::propagation;
use crate::protocol::{self, Attempt, Criticality, Protocol};

mod levels_tests;
mod live_rule_tests;
mod proxies_tests;
mod telemetry_tests;

type Body = Full<Bytes>;

fn rule(share: f64, min: u64) -> StopRule {
    StopRule::builder()
        .retry_share(share)
        .min_requests(min)
        .build()
        .unwrap()
}

/// A layer with the default histogram and `rule`, trusting every caller's counter: these
/// tests are about the rule, not about whose word it takes (see `trust_tests`).
fn layer_with(rule: StopRule) -> OverloadSignalLayer {
    OverloadSignalLayer::builder()
        .rule(rule)
        .trust(Trust::everyone())
        .build()
        .unwrap()
}

/// The default layer, but trusting every caller's counter (see `layer_with`).
fn trusting_layer() -> OverloadSignalLayer {
    OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .build()
        .unwrap()
}

fn request(attempt: Option<u32>) -> Request<Body> {
    let mut req = Request::new(Body::default());
    if let Some(n) = attempt {
        Attempt::set(req.headers_mut(), n);
    }
    req
}

fn grpc_request(attempt: Option<u32>) -> Request<Body> {
    let mut req = request(attempt);
    req.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    req
}

fn status(code: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::from("inner body"));
    *r.status_mut() = code;
    r
}

/// Marks `response` as a rejection made by a limiting layer, of `kind`, for the whole
/// server: what the workspace's limits insert.
fn marked(mut response: Response<Body>, kind: RejectionKind) -> Response<Body> {
    response
        .extensions_mut()
        .insert(Rejection::new(kind, RejectionScope::Server));
    response
}

/// A rate limit's rejection: `429`, `Retry-After`, marked.
fn http_429() -> Response<Body> {
    marked(foreign_429(), RejectionKind::RateLimited)
}

/// The same answer, made by something that is not a limiting layer (the handler, an
/// upstream): no marker.
fn foreign_429() -> Response<Body> {
    let mut r =
        protocol::too_many_requests_response::<Body>(Protocol::Http, Duration::from_secs(1));
    *r.body_mut() = Body::from("slow down");
    r
}

/// A limiter's gRPC rejection with `code`, marked.
fn grpc_rejection(code: u16) -> Response<Body> {
    marked(grpc_status_response(code), RejectionKind::RateLimited)
}

fn grpc_status_response(code: u16) -> Response<Body> {
    let mut r = Response::new(Body::from("grpc message frame"));
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    r.headers_mut()
        .insert(protocol::GRPC_STATUS, HeaderValue::from(code));
    r.headers_mut()
        .insert(CONTENT_LENGTH, HeaderValue::from(18));
    r
}

/// A service that answers every request with `make()`.
fn answering(
    make: fn() -> Response<Body>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone {
    service_fn(move |_req: Request<Body>| async move { Ok::<_, Infallible>(make()) })
}

/// Sends `n` requests with attempt counters cycling through `attempts`.
async fn send<S>(svc: &mut S, n: usize, attempts: &[Option<u32>])
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    for i in 0..n {
        let req = request(attempts[i % attempts.len()]);
        svc.ready().await.unwrap().call(req).await.unwrap();
    }
}

async fn one<S>(svc: &mut S, req: Request<Body>) -> Response<Body>
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    svc.ready().await.unwrap().call(req).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn records_every_request_including_rejected_ones() {
    let layer = trusting_layer();
    let histogram = layer.histogram().clone();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    send(
        &mut svc,
        12,
        &[Some(0), Some(1), Some(2), Some(7), None, Some(0)],
    )
    .await;
    let mut junk = request(None);
    junk.headers_mut()
        .insert(protocol::X_REQUEST_ATTEMPT, HeaderValue::from_static("-1"));
    one(&mut svc, junk).await;
    let s = histogram.snapshot();
    assert_eq!(s.count(AttemptClass::First), 4);
    assert_eq!(s.count(AttemptClass::Retry1), 2);
    assert_eq!(s.count(AttemptClass::Retry2), 2);
    assert_eq!(s.count(AttemptClass::Retry3OrMore), 2);
    assert_eq!(s.count(AttemptClass::Unknown), 2);
    assert_eq!(s.count(AttemptClass::Malformed), 1);
}

#[tokio::test(start_paused = true)]
async fn services_from_one_layer_share_one_histogram() {
    let layer = trusting_layer();
    let mut a = tower::Layer::layer(&layer, answering(|| status(StatusCode::OK)));
    let mut b = tower::Layer::layer(&layer, answering(|| status(StatusCode::OK)));
    send(&mut a, 3, &[Some(0)]).await;
    send(&mut b, 2, &[Some(1)]).await;
    assert_eq!(layer.histogram().snapshot().total(), 5);
    assert_eq!(a.histogram().snapshot().retries(), 2);
}

#[tokio::test(start_paused = true)]
async fn rejection_passes_through_when_few_requests_are_retries() {
    let layer = layer_with(rule(0.1, 10));
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    // 100 requests, 5 % retries: under the 10 % threshold.
    let mut attempts = vec![Some(0); 19];
    attempts.push(Some(1));
    send(&mut svc, 100, &attempts).await;
    let r = one(&mut svc, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(!protocol::is_stop_signal(r.headers()));
    assert_eq!(r.headers()[RETRY_AFTER], "1");
}

#[tokio::test(start_paused = true)]
async fn rejection_passes_through_below_the_minimum_count() {
    let layer = layer_with(rule(0.1, 50));
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    // Every request a retry, but only 49 of them (the 50th is the one judged).
    send(&mut svc, 48, &[Some(2)]).await;
    let r = one(&mut svc, request(Some(2))).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
    // The 50th request reaches the minimum.
    let r = one(&mut svc, request(Some(2))).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test(start_paused = true)]
async fn storm_turns_429_into_the_stop_signal() {
    let layer = layer_with(rule(0.1, 10));
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    send(&mut svc, 30, &[Some(0), Some(1), Some(2)]).await;
    // The judged request itself may be a first try: the window decides, not the request.
    let r = one(&mut svc, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(protocol::is_stop_signal(r.headers()));
    assert!(
        r.headers().get(RETRY_AFTER).is_none(),
        "retry invitation removed"
    );
}

#[tokio::test(start_paused = true)]
async fn storm_turns_a_load_shedders_503_into_the_stop_signal() {
    let layer = layer_with(rule(0.1, 10));
    let mut svc = tower::Layer::layer(
        &layer,
        answering(|| {
            marked(
                status(StatusCode::SERVICE_UNAVAILABLE),
                RejectionKind::AtCapacity,
            )
        }),
    );
    send(&mut svc, 30, &[Some(1)]).await;
    let r = one(&mut svc, request(Some(1))).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(protocol::is_stop_signal(r.headers()));
    // Marked as the stop signal for whatever shapes answers outside.
    let rejection = r.extensions().get::<Rejection>().unwrap();
    assert_eq!(rejection.kind(), RejectionKind::StopRetrying);
    assert_eq!(rejection.layer().as_str(), "default");
}

/// Regression (issue 23, finding 2): every 429/503 was judged as the server's own
/// rejection, so under retry pressure a handler's own 503 and an upstream's 429 passed on by
/// a gateway were rewritten to the stop signal, their `Retry-After` and `RateLimit` fields
/// removed. Only what a limiting layer marked is judged now; the rest passes untouched.
#[tokio::test(start_paused = true)]
async fn a_storm_leaves_rejections_no_limiter_made_untouched() {
    let layer = layer_with(rule(0.1, 10));
    let foreign: [fn() -> Response<Body>; 3] = [
        foreign_429,
        || {
            let mut r = status(StatusCode::SERVICE_UNAVAILABLE);
            r.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_static("30"));
            r.headers_mut().insert(
                protocol::RATELIMIT,
                HeaderValue::from_static("\"up\";r=0;t=30"),
            );
            r
        },
        || grpc_status_response(protocol::GRPC_UNAVAILABLE),
    ];
    for make in foreign {
        let mut svc = tower::Layer::layer(&layer, answering(make));
        send(&mut svc, 30, &[Some(1)]).await;
        let expected = make();
        let r = one(&mut svc, request(Some(1))).await;
        assert_eq!(r.status(), expected.status());
        assert_eq!(r.headers(), expected.headers(), "headers untouched");
        assert!(!protocol::is_stop_signal(r.headers()));
        assert!(r.extensions().get::<Rejection>().is_none());
        let body = http_body_util::BodyExt::collect(r.into_body())
            .await
            .unwrap();
        let want = http_body_util::BodyExt::collect(expected.into_body())
            .await
            .unwrap();
        assert_eq!(body.to_bytes(), want.to_bytes(), "body untouched");
    }
    // The window was a storm all along: a limiter's marked rejection is the stop signal.
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    assert!(protocol::is_stop_signal(
        one(&mut svc, request(Some(1))).await.headers()
    ));
}

/// The opt-in for limiters that cannot mark their answers: every 429/503 is judged.
#[tokio::test(start_paused = true)]
async fn judging_every_rejection_rewrites_unmarked_ones_too() {
    let layer = OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .rule(rule(0.1, 10))
        .judge_every_rejection(true)
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(foreign_429));
    send(&mut svc, 30, &[Some(1)]).await;
    let r = one(&mut svc, request(Some(1))).await;
    assert!(protocol::is_stop_signal(r.headers()));
    assert!(r.headers().get(RETRY_AFTER).is_none());
    assert_eq!(
        r.extensions().get::<Rejection>().map(Rejection::kind),
        Some(RejectionKind::StopRetrying)
    );
    // A missing-key refusal is marked, and never judged.
    let mut svc = tower::Layer::layer(
        &layer,
        answering(|| {
            marked(
                status(StatusCode::SERVICE_UNAVAILABLE),
                RejectionKind::MissingKey,
            )
        }),
    );
    let r = one(&mut svc, request(Some(1))).await;
    assert!(!protocol::is_stop_signal(r.headers()));
    // Issue 30 (review): a timeout's `504` (the deadline layer's own, say) is no rejection:
    // judging every rejection leaves it as it is, as before the outcome vocabulary.
    let mut svc = tower::Layer::layer(&layer, answering(|| status(StatusCode::GATEWAY_TIMEOUT)));
    let r = one(&mut svc, request(Some(1))).await;
    assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
    assert!(!protocol::is_stop_signal(r.headers()));
}

/// Issue 30, finding 7: a request too heavy for a rate limit's capacity is answered `413`
/// (gRPC `INVALID_ARGUMENT`), marked [`RejectionKind::ExceedsCapacity`]; the overload layer
/// never turns it into the stop signal, even in a storm and judging every rejection.
#[tokio::test(start_paused = true)]
async fn a_request_too_heavy_for_the_limit_is_never_the_stop_signal() {
    fn too_heavy(protocol: Protocol) -> Response<Body> {
        marked(
            protocol::exceeds_capacity_response(protocol),
            RejectionKind::ExceedsCapacity,
        )
    }
    type Answer = fn() -> Response<Body>;
    type MakeRequest = fn(Option<u32>) -> Request<Body>;
    let answers: [(Answer, MakeRequest, Protocol); 2] = [
        (|| too_heavy(Protocol::Http), request, Protocol::Http),
        (|| too_heavy(Protocol::Grpc), grpc_request, Protocol::Grpc),
    ];
    for judge_every in [false, true] {
        let layer = OverloadSignalLayer::builder()
            .trust(Trust::everyone())
            .rule(rule(0.1, 10))
            .judge_every_rejection(judge_every)
            .build()
            .unwrap();
        let mut storm = tower::Layer::layer(&layer, answering(http_429));
        send(&mut storm, 30, &[Some(1)]).await;
        for (answer, make_request, protocol) in answers {
            let mut svc = tower::Layer::layer(&layer, answering(answer));
            let r = one(&mut svc, make_request(Some(1))).await;
            assert!(!protocol::is_stop_signal(r.headers()), "{protocol:?}");
            let expected = protocol::exceeds_capacity_response::<Body>(protocol);
            assert_eq!(r.status(), expected.status());
            assert_eq!(r.headers(), expected.headers());
            assert_eq!(
                r.extensions().get::<Rejection>().map(Rejection::kind),
                Some(RejectionKind::ExceedsCapacity)
            );
        }
        // The window was a storm all along.
        assert!(protocol::is_stop_signal(
            one(&mut storm, request(Some(1))).await.headers()
        ));
    }
}

/// gRPC-Web requests (finding 4) get the stop signal in gRPC form, in gRPC-Web's content
/// type.
#[tokio::test(start_paused = true)]
async fn grpc_web_rejections_become_a_grpc_web_stop_signal() {
    let layer = layer_with(rule(0.1, 10));
    let mut svc = tower::Layer::layer(&layer, answering(|| grpc_rejection(8)));
    let web = |attempt| {
        let mut req = request(Some(attempt));
        req.headers_mut().insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/grpc-web-text"),
        );
        req
    };
    for _ in 0..30 {
        one(&mut svc, web(1)).await;
    }
    let r = one(&mut svc, web(1)).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[CONTENT_TYPE], "application/grpc-web-text+proto");
    assert_eq!(
        protocol::grpc_status(r.headers()),
        Some(protocol::GRPC_UNAVAILABLE)
    );
    assert!(protocol::is_stop_signal(r.headers()));
    assert!(r.headers().get(CONTENT_LENGTH).is_none(), "trailers-only");
}

#[tokio::test(start_paused = true)]
async fn storm_leaves_successes_and_other_errors_alone() {
    let layer = layer_with(rule(0.1, 10));
    for code in [
        StatusCode::OK,
        StatusCode::NOT_FOUND,
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::BAD_GATEWAY,
    ] {
        let mut svc = tower::Layer::layer(
            &layer,
            service_fn(move |_req: Request<Body>| async move { Ok::<_, Infallible>(status(code)) }),
        );
        send(&mut svc, 30, &[Some(1)]).await;
        let r = one(&mut svc, request(Some(1))).await;
        assert_eq!(r.status(), code);
        assert!(!protocol::is_stop_signal(r.headers()), "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn storm_ends_when_the_window_slides_past_it() {
    let histogram = AttemptHistogram::builder()
        .window(Duration::from_secs(10))
        .buckets(10)
        .build()
        .unwrap();
    let layer = OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .histogram(histogram)
        .rule(rule(0.1, 10))
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    send(&mut svc, 30, &[Some(1)]).await;
    assert!(protocol::is_stop_signal(
        one(&mut svc, request(Some(1))).await.headers()
    ));
    tokio::time::advance(Duration::from_secs(10)).await;
    // A fresh window: first tries only.
    send(&mut svc, 30, &[Some(0)]).await;
    let r = one(&mut svc, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
}

#[tokio::test(start_paused = true)]
async fn grpc_resource_exhausted_becomes_a_trailers_only_stop_signal() {
    let layer = layer_with(rule(0.1, 10));
    for code in [
        protocol::GRPC_RESOURCE_EXHAUSTED,
        protocol::GRPC_UNAVAILABLE,
    ] {
        let mut svc = tower::Layer::layer(
            &layer,
            service_fn(move |_req: Request<Body>| async move {
                Ok::<_, Infallible>(grpc_rejection(code))
            }),
        );
        for _ in 0..30 {
            one(&mut svc, grpc_request(Some(1))).await;
        }
        let r = one(&mut svc, grpc_request(Some(1))).await;
        assert_eq!(r.status(), StatusCode::OK);
        assert_eq!(
            protocol::grpc_status(r.headers()),
            Some(protocol::GRPC_UNAVAILABLE)
        );
        assert_eq!(r.headers()[protocol::GRPC_RETRY_PUSHBACK_MS], "-1");
        assert!(protocol::is_stop_signal(r.headers()));
        assert!(r.headers().get(CONTENT_LENGTH).is_none());
        assert_eq!(
            http_body::Body::size_hint(r.body()).exact(),
            Some(0),
            "body emptied"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn grpc_attempts_are_read_from_grpc_previous_rpc_attempts() {
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(&layer, answering(|| grpc_status_response(0)));
    let mut req = grpc_request(None);
    req.headers_mut().insert(
        protocol::GRPC_PREVIOUS_RPC_ATTEMPTS,
        HeaderValue::from_static("2"),
    );
    let r = one(&mut svc, req).await;
    assert_eq!(protocol::grpc_status(r.headers()), Some(0));
    assert_eq!(layer.histogram().snapshot().count(AttemptClass::Retry2), 1);
}

#[tokio::test(start_paused = true)]
async fn grpc_ok_and_caller_errors_are_not_rejections() {
    let layer = layer_with(rule(0.0, 1));
    for code in [0, 3, 5, 13] {
        let mut svc = tower::Layer::layer(
            &layer,
            service_fn(move |_req: Request<Body>| async move {
                Ok::<_, Infallible>(grpc_status_response(code))
            }),
        );
        let r = one(&mut svc, grpc_request(Some(2))).await;
        assert_eq!(protocol::grpc_status(r.headers()), Some(code));
        assert!(!protocol::is_stop_signal(r.headers()));
    }
}

/// A handler whose downstream call "received the stop signal": it raises the marker as the
/// retry layer does, then answers with `answer`.
fn marking(
    answer: fn() -> Response<Body>,
) -> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone {
    service_fn(move |_req: Request<Body>| async move {
        tokio::task::yield_now().await;
        assert!(
            propagation::mark_stop_received(),
            "the layer installs a scope"
        );
        tokio::task::yield_now().await;
        Ok::<_, Infallible>(answer())
    })
}

#[tokio::test(start_paused = true)]
async fn marker_turns_a_handler_failure_into_the_stop_signal() {
    // The rule could never fire: propagation does not depend on the histogram.
    let layer = layer_with(rule(0.999, u64::MAX));
    for code in [
        StatusCode::INTERNAL_SERVER_ERROR,
        StatusCode::BAD_GATEWAY,
        StatusCode::SERVICE_UNAVAILABLE,
        StatusCode::GATEWAY_TIMEOUT,
        StatusCode::TOO_MANY_REQUESTS,
    ] {
        let mut svc = tower::Layer::layer(
            &layer,
            service_fn(move |_req: Request<Body>| async move {
                assert!(propagation::mark_stop_received());
                Ok::<_, Infallible>(status(code))
            }),
        );
        let r = one(&mut svc, request(Some(0))).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{code}");
        assert!(protocol::is_stop_signal(r.headers()), "{code}");
    }
}

#[tokio::test(start_paused = true)]
async fn marker_leaves_a_recovered_or_deliberate_answer_alone() {
    let layer = trusting_layer();
    let mut ok = tower::Layer::layer(&layer, marking(|| status(StatusCode::OK)));
    let r = one(&mut ok, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert!(!protocol::is_stop_signal(r.headers()));
    let mut not_found = tower::Layer::layer(&layer, marking(|| status(StatusCode::NOT_FOUND)));
    let r = one(&mut not_found, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(start_paused = true)]
async fn marker_does_not_leak_between_requests() {
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(
        &layer,
        service_fn(|req: Request<Body>| async move {
            if req.headers().contains_key("x-mark") {
                propagation::mark_stop_received();
            }
            Ok::<_, Infallible>(status(StatusCode::INTERNAL_SERVER_ERROR))
        }),
    );
    let mut marked = request(Some(0));
    marked
        .headers_mut()
        .insert("x-mark", HeaderValue::from_static("1"));
    assert!(protocol::is_stop_signal(
        one(&mut svc, marked).await.headers()
    ));
    let r = one(&mut svc, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::INTERNAL_SERVER_ERROR);
    assert!(!protocol::is_stop_signal(r.headers()));
}

#[tokio::test(start_paused = true)]
async fn marker_from_a_spawned_task_is_not_seen() {
    // The documented limit: spawned tasks are outside the scope; use the typed error there.
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(
        &layer,
        service_fn(|_req: Request<Body>| async move {
            let marked = tokio::spawn(async { propagation::mark_stop_received() })
                .await
                .unwrap();
            assert!(!marked);
            Ok::<_, Infallible>(status(StatusCode::BAD_GATEWAY))
        }),
    );
    let r = one(&mut svc, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
}

#[tokio::test(start_paused = true)]
async fn marker_with_a_grpc_failure_answers_in_grpc_form() {
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(&layer, marking(|| grpc_status_response(13)));
    let r = one(&mut svc, grpc_request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(
        protocol::grpc_status(r.headers()),
        Some(protocol::GRPC_UNAVAILABLE)
    );
    assert!(protocol::is_stop_signal(r.headers()));
    assert_eq!(http_body::Body::size_hint(r.body()).exact(), Some(0));
    // A deliberate gRPC answer (NOT_FOUND) is left alone.
    let mut svc = tower::Layer::layer(&layer, marking(|| grpc_status_response(5)));
    let r = one(&mut svc, grpc_request(Some(0))).await;
    assert_eq!(protocol::grpc_status(r.headers()), Some(5));
}

#[tokio::test(start_paused = true)]
async fn a_handlers_own_stop_signal_passes_unchanged() {
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(
        &layer,
        answering(|| {
            let mut r = protocol::stop_signal_response::<Body>(Protocol::Http);
            *r.body_mut() = Body::from("handler says stop");
            r
        }),
    );
    let r = one(&mut svc, request(Some(0))).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(protocol::is_stop_signal(r.headers()));
    assert_eq!(http_body::Body::size_hint(r.body()).exact(), Some(17));
}

#[tokio::test(start_paused = true)]
async fn inner_errors_pass_through() {
    let layer = layer_with(rule(0.0, 1));
    let mut svc = tower::Layer::layer(
        &layer,
        service_fn(|_req: Request<Body>| async {
            Err::<Response<Body>, _>(std::io::Error::other("boom"))
        }),
    );
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request(Some(1)))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "boom");
    assert_eq!(layer.histogram().snapshot().retries(), 1);
}

/// Issue 30 (review): an `Overloaded` error that reaches the layer without a mark (a retry
/// layer behind a `Buffer`, whose task runs outside the request's scope; a service that
/// returns it) is answered with the stop signal too, boxed or not.
#[tokio::test(start_paused = true)]
async fn an_unmarked_overloaded_error_is_answered_with_the_stop_signal() {
    type BoxError = Box<dyn std::error::Error + Send + Sync>;
    let layer = trusting_layer();
    let mut boxed = tower::Layer::layer(
        &layer,
        service_fn(|_req: Request<Body>| async {
            Err::<Response<Body>, BoxError>(Box::new(crate::Overloaded::new()))
        }),
    );
    let r = boxed
        .ready()
        .await
        .unwrap()
        .call(request(Some(0)))
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(protocol::is_stop_signal(r.headers()));
    let mut bare = tower::Layer::layer(
        &layer,
        service_fn(|_req: Request<Body>| async {
            Err::<Response<Body>, _>(crate::Overloaded::new())
        }),
    );
    let r = bare
        .ready()
        .await
        .unwrap()
        .call(request(Some(0)))
        .await
        .unwrap();
    assert!(protocol::is_stop_signal(r.headers()));
}

/// Regression (issue 30, finding 2): in a proxy (`OverloadProtectionLayer -> RetryLayer ->
/// hyper client`), the retry layer returns a downstream stop signal as `Err(Overloaded)`,
/// and gives up or is throttled as `Err` too; the overload layer read the marker only on
/// `Ok`, so the error reached the HTTP server, which reset the caller's connection. An error
/// after a marked downstream call is answered as the protocol says.
#[tokio::test(start_paused = true)]
async fn an_error_after_a_marked_downstream_call_is_answered_not_passed_on() {
    use crate::propagation::Downstream;
    let cases = [
        (
            vec![Downstream::StopSignal],
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            true,
        ),
        (
            vec![Downstream::DeadlineExceeded],
            StatusCode::GATEWAY_TIMEOUT,
            4,
            false,
        ),
        (
            vec![Downstream::Throttled],
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            false,
        ),
        (vec![Downstream::GaveUp], StatusCode::BAD_GATEWAY, 14, false),
        // The stop signal wins over what else was marked.
        (
            vec![Downstream::GaveUp, Downstream::StopSignal],
            StatusCode::SERVICE_UNAVAILABLE,
            14,
            true,
        ),
    ];
    for (marks, http_status, grpc_code, stop) in cases {
        for grpc in [false, true] {
            let layer = trusting_layer();
            let marks = marks.clone();
            let mut svc = tower::Layer::layer(
                &layer,
                service_fn(move |_req: Request<Body>| {
                    let marks = marks.clone();
                    async move {
                        for mark in marks {
                            assert!(propagation::mark_downstream(mark));
                        }
                        Err::<Response<Body>, _>(std::io::Error::other("downstream"))
                    }
                }),
            );
            let mut req = request(Some(0));
            if grpc {
                req.headers_mut()
                    .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            }
            let response = svc.ready().await.unwrap().call(req).await.unwrap();
            if grpc {
                assert_eq!(response.status(), StatusCode::OK);
                assert_eq!(protocol::grpc_status(response.headers()), Some(grpc_code));
            } else {
                assert_eq!(response.status(), http_status);
            }
            assert_eq!(protocol::is_stop_signal(response.headers()), stop, "{grpc}");
            if http_status == StatusCode::SERVICE_UNAVAILABLE && !stop && !grpc {
                assert_eq!(response.headers()[RETRY_AFTER], "1");
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn readiness_is_the_inner_services() {
    let (mut svc, mut handle) =
        tower_test::mock::spawn_layer::<Request<Body>, Response<Body>, _>(trusting_layer());
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(1);
    assert!(svc.poll_ready().is_ready());
    let response = svc.call(request(Some(3)));
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(
        Attempt::from_request(&req),
        Attempt::Number(3),
        "request unchanged"
    );
    send.send_response(status(StatusCode::OK));
    assert_eq!(response.await.unwrap().status(), StatusCode::OK);
}

#[test]
fn layer_and_service_are_clone_send_sync() {
    fn assert_traits<T: Clone + Send + Sync + 'static>() {}
    assert_traits::<OverloadSignalLayer>();
    assert_traits::<
        OverloadSignal<tower::util::BoxCloneSyncService<Request<Body>, Response<Body>, Infallible>>,
    >();
    fn assert_send<T: Send>() {}
    assert_send::<future::ResponseFuture<std::future::Ready<Result<Response<Body>, Infallible>>>>();
}

#[test]
fn get_ref_get_mut_into_inner() {
    let mut svc = OverloadSignal::new(7u8);
    assert_eq!(svc.rule(), StopRule::new());
    assert_eq!(svc.histogram().window(), Duration::from_secs(10));
    assert_eq!(*svc.get_ref(), 7);
    *svc.get_mut() = 8;
    assert_eq!(svc.into_inner(), 8);
}

/// A metric's name, labels and value.
type Metric = (String, Vec<(String, String)>, DebugValue);

/// Every metric of one recorder snapshot, as (name, labels, value). A snapshot resets the
/// recorder's values, so take one and read everything from it.
fn metric_values(recorder: &DebuggingRecorder) -> Vec<Metric> {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.key().name().to_owned(), labels, value)
        })
        .collect()
}

fn find<'a>(values: &'a [Metric], name: &str, label: Option<(&str, &str)>) -> &'a DebugValue {
    find_labelled(values, name, label.as_slice())
}

/// The one metric `name` that carries every label of `wanted`.
fn find_labelled<'a>(values: &'a [Metric], name: &str, wanted: &[(&str, &str)]) -> &'a DebugValue {
    let found: Vec<_> = values
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && wanted
                    .iter()
                    .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{name} {wanted:?}: {values:?}");
    &found[0].2
}

/// A layer's state with the default histogram, `rule`, the default key and no trust
/// predicate.
fn shared_with(rule: StopRule) -> Arc<SignalState> {
    Arc::new(SignalState::new(SignalSettings {
        rule,
        hashing: callers::KeyHashing::seeded(1),
        ..SignalSettings::new()
    }))
}

/// `shared`'s answer to `response`.
fn respond(
    shared: &SignalState,
    mut response: Response<Body>,
    protocol: Protocol,
    downstream_stop: bool,
    caller: callers::Caller,
) -> Response<Body> {
    shared.respond(
        &mut response,
        protocol,
        downstream_stop,
        caller,
        Criticality::default(),
    );
    response
}

/// A request head with attempt counter `attempt`, from peer `peer` if given.
fn head(attempt: Option<u32>, peer: Option<&str>) -> http::request::Parts {
    let mut req = request(attempt);
    if let Some(peer) = peer {
        req.extensions_mut()
            .insert(peer.parse::<SocketAddr>().unwrap());
    }
    req.into_parts().0
}

fn caller_scoped(mut response: Response<Body>) -> Response<Body> {
    response.extensions_mut().insert(Rejection::new(
        RejectionKind::RateLimited,
        RejectionScope::Caller,
    ));
    response
}

#[test]
fn decisions_are_counted() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let shared = shared_with(rule(0.1, 2));
            // One request in the window: the rejection passes.
            let first = shared.record(&head(Some(0), None), Protocol::Http, || true);
            respond(&shared, http_429(), Protocol::Http, false, first);
            let mut retry = first;
            for _ in 0..3 {
                retry = shared.record(&head(Some(1), None), Protocol::Http, || true);
            }
            respond(&shared, http_429(), Protocol::Http, false, retry);
            respond(&shared, http_429(), Protocol::Http, false, retry);
            // On the caller's own class: the same requests, so the same verdict.
            respond(
                &shared,
                caller_scoped(http_429()),
                Protocol::Http,
                false,
                retry,
            );
            respond(
                &shared,
                status(StatusCode::BAD_GATEWAY),
                Protocol::Http,
                true,
                retry,
            );
            respond(
                &shared,
                protocol::stop_signal_response::<Body>(Protocol::Http),
                Protocol::Http,
                false,
                retry,
            );
            // Neither a rejection nor a failure: not counted at all.
            respond(&shared, status(StatusCode::OK), Protocol::Http, true, retry);
        });
    });
    let values = metric_values(&recorder);
    assert_eq!(
        find_labelled(
            &values,
            metric_names::REJECTIONS_PASSED,
            &[("scope", "server"), ("criticality", "critical")]
        ),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        find_labelled(
            &values,
            metric_names::STOP_SIGNALS,
            &[("scope", "server"), ("criticality", "critical")]
        ),
        &DebugValue::Counter(2)
    );
    assert_eq!(
        find_labelled(
            &values,
            metric_names::STOP_SIGNALS,
            &[("scope", "caller"), ("criticality", "critical")]
        ),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        find(&values, metric_names::PROPAGATED, Some(("via", "marker"))),
        &DebugValue::Counter(1)
    );
    assert_eq!(
        find(&values, metric_names::PROPAGATED, Some(("via", "response"))),
        &DebugValue::Counter(1)
    );
}

#[test]
fn window_gauges_are_exported_once_per_bucket() {
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async {
            let shared = shared_with(rule(0.1, 2));
            shared.record(&head(Some(0), Some("192.0.2.1:1")), Protocol::Http, || true);
            shared.record(&head(Some(2), Some("192.0.2.1:1")), Protocol::Http, || true);
            shared.record(&head(Some(0), Some("192.0.2.1:1")), Protocol::Http, || true);
            let retry = shared.record(&head(Some(1), Some("192.0.2.1:1")), Protocol::Http, || true);
            let first = shared.record(&head(Some(0), Some("192.0.2.2:1")), Protocol::Http, || true);
            shared.record(&head(Some(0), Some("192.0.2.2:1")), Protocol::Http, || true);
            shared.record(&head(Some(0), Some("192.0.2.2:1")), Protocol::Http, || true);
            shared.record(&head(Some(0), Some("192.0.2.2:1")), Protocol::Http, || true);
            // Seven requests, three retries: the first try is answered with the stop signal
            // and counts as pressure too.
            let r = respond(&shared, http_429(), Protocol::Http, false, first);
            assert!(protocol::is_stop_signal(r.headers()));
            assert!(retry.retry);
            tokio::time::advance(Duration::from_secs(1)).await;
            // The first request of the next bucket exports the window up to the last one.
            shared.record(&head(None, None), Protocol::Http, || true);
        });
    });
    let values = metric_values(&recorder);
    let gauge = |name, label| match find(&values, name, label) {
        DebugValue::Gauge(v) => v.into_inner(),
        other => panic!("{other:?}"),
    };
    let requests = |label| gauge(metric_names::WINDOW_REQUESTS, Some(("attempt", label)));
    assert_eq!(requests("0").to_bits(), 6.0f64.to_bits());
    assert_eq!(requests("1").to_bits(), 1.0f64.to_bits());
    assert_eq!(requests("2").to_bits(), 1.0f64.to_bits());
    assert_eq!(requests("3+").to_bits(), 0.0f64.to_bits());
    assert_eq!(requests("unknown").to_bits(), 0.0f64.to_bits());
    assert_eq!(requests("malformed").to_bits(), 0.0f64.to_bits());
    assert_eq!(
        gauge(metric_names::WINDOW_RETRY_SHARE, None).to_bits(),
        0.25f64.to_bits()
    );
    assert_eq!(
        gauge(metric_names::WINDOW_RETRY_PRESSURE, None).to_bits(),
        0.375f64.to_bits()
    );
    // Two callers of four requests each: 2 of 4, and 1 of 4.
    assert_eq!(
        gauge(metric_names::WINDOW_PER_CALLER_PRESSURE, None).to_bits(),
        0.375f64.to_bits()
    );
}

/// A request with attempt counter `attempt` from peer `peer` (a `SocketAddr` extension, the
/// default caller key).
fn from_peer(attempt: Option<u32>, peer: SocketAddr) -> Request<Body> {
    let mut req = request(attempt);
    req.extensions_mut().insert(peer);
    req
}

/// Honest caller `i` of many, each on a network of its own: 10.x.y.1.
fn honest_peer(i: u32) -> SocketAddr {
    SocketAddr::from(([10, (i >> 8) as u8, i as u8, 1], 40_000))
}

const FORGER: SocketAddr = SocketAddr::new(
    std::net::IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 66)),
    6666,
);

/// What callers got back: (plain rejections, stop signals).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Answers {
    rejected: u64,
    stopped: u64,
}

impl Answers {
    fn count(&mut self, r: &Response<Body>) {
        if protocol::is_stop_signal(r.headers()) {
            self.stopped += 1;
        } else {
            assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
            self.rejected += 1;
        }
    }
}

/// Finding 1 of the trust issue, per second for 15 s: 70 honest callers send 10 first tries
/// each (700 in all), one forger sends 60 requests claiming `X-Request-Attempt: 3`; the
/// server rejects everything (a global limit under overload). Returns what the honest
/// callers and the forger got.
async fn forged_storm<S>(svc: &mut S) -> (Answers, Answers)
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let (mut honest_answers, mut forger_answers) = (Answers::default(), Answers::default());
    for _ in 0..15 {
        for i in 0..760u32 {
            // One forged request in every 12 or 13, spread through the second.
            if i % 38 < 3 {
                let r = one(svc, from_peer(Some(3), FORGER)).await;
                forger_answers.count(&r);
            } else {
                let r = one(svc, from_peer(Some(0), honest_peer(i % 70))).await;
                honest_answers.count(&r);
            }
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    (honest_answers, forger_answers)
}

#[tokio::test(start_paused = true)]
async fn one_forging_caller_among_many_cannot_make_the_server_say_stop() {
    // Regression for finding 1: with every request in one class (no caller key), the forger
    // alone turned the honest callers' rejections into the stop signal.
    let unkeyed = OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .key_by(|_: &http::request::Parts| None::<()>)
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&unkeyed, answering(http_429));
    let (honest, _) = forged_storm(&mut svc).await;
    assert!(
        honest.stopped > honest.rejected,
        "one class: the forger decides for everyone: {honest:?}"
    );

    // Keyed by peer address (the default): the forger weighs as one caller of 71.
    let layer = OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .caller_seed(7)
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    let (honest, forger) = forged_storm(&mut svc).await;
    assert_eq!(honest.stopped, 0, "{honest:?}");
    assert_eq!(honest.rejected, 15 * 700);
    assert_eq!(
        forger.stopped, 0,
        "server-wide rejections are judged server-wide"
    );
    // The plain figure is what the forger wanted: 60 of 760.
    let window = layer.histogram().snapshot();
    assert!(window.retry_share().unwrap() > 0.07, "{window:?}");
}

#[tokio::test(start_paused = true)]
async fn a_storm_from_many_callers_still_makes_the_server_say_stop() {
    // The same 70 callers, each retrying its rejected requests twice (attempts 0, 1, 2).
    let layer = OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .caller_seed(7)
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    let mut answers = Answers::default();
    for _ in 0..5 {
        for i in 0..300u32 {
            for attempt in 0..3 {
                let r = one(&mut svc, from_peer(Some(attempt), honest_peer(i % 70))).await;
                answers.count(&r);
                if protocol::is_stop_signal(r.headers()) {
                    break;
                }
            }
        }
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    assert!(answers.stopped > 1_000, "{answers:?}");
}

#[tokio::test(start_paused = true)]
async fn caller_scoped_rejections_are_judged_on_the_callers_own_class() {
    // A keyed limit rejects both the forger and the honest callers (each over its own
    // quota), and says so: only the forger, whose own traffic is all retries, is told to stop.
    let layer = OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .caller_seed(7)
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(|| caller_scoped(http_429())));
    let (honest, forger) = forged_storm(&mut svc).await;
    assert_eq!(honest.stopped, 0, "{honest:?}");
    assert!(
        forger.rejected < 200 && forger.stopped == 15 * 60 - forger.rejected,
        "the forger is told to stop once its class holds 200 requests: {forger:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn untrusted_callers_counters_do_not_count() {
    // Only 10.0.0.0/8 is trusted: the forger's counters are read as unknown.
    let layer = OverloadSignalLayer::builder()
        .trust(Trust::when(|_, extensions| {
            extensions.get::<SocketAddr>().is_some_and(
                |peer| matches!(peer.ip(), std::net::IpAddr::V4(v4) if v4.octets()[0] == 10),
            )
        }))
        .key_by(|_: &http::request::Parts| None::<()>)
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    let (honest, forger) = forged_storm(&mut svc).await;
    assert_eq!((honest.stopped, forger.stopped), (0, 0));
    let window = layer.histogram().snapshot();
    assert_eq!(window.retries(), 0);
    // The window ends with the (empty) second after the run: its last 9 seconds.
    assert_eq!(window.count(AttemptClass::Unknown), 9 * 60);
    // A trusted caller's retries still count, in a fresh window.
    tokio::time::advance(Duration::from_secs(10)).await;
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    send_from(&mut svc, 300, Some(2), honest_peer(1)).await;
    let r = one(&mut svc, from_peer(Some(2), honest_peer(1))).await;
    assert!(protocol::is_stop_signal(r.headers()));
}

async fn send_from<S>(svc: &mut S, n: usize, attempt: Option<u32>, peer: SocketAddr)
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    for _ in 0..n {
        one(svc, from_peer(attempt, peer)).await;
    }
}

/// Callers that obey: 100 requests per second, each retried (attempt 1) after a plain
/// rejection, never after the stop signal; the server rejects a share `reject` of first
/// tries and every retry. Returns, per second, the retries the server received and the
/// stop signals it sent.
async fn obeying_callers<S>(svc: &mut S, seconds: u32, reject: f64) -> (Vec<u64>, Vec<u64>)
where
    S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
{
    let (mut retries, mut stops) = (Vec::new(), Vec::new());
    for _ in 0..seconds {
        let (mut retried, mut stopped) = (0, 0);
        for i in 0..100u32 {
            let rejected = f64::from(i) < reject * 100.0;
            let r = one(svc, tagged(Some(0), rejected)).await;
            if protocol::is_stop_signal(r.headers()) {
                stopped += 1;
            } else if rejected {
                retried += 1;
                let r = one(svc, tagged(Some(1), true)).await;
                stopped += u64::from(protocol::is_stop_signal(r.headers()));
            }
        }
        retries.push(retried);
        stops.push(stopped);
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    (retries, stops)
}

/// A request the test's inner service will reject (`x-reject`) or admit.
fn tagged(attempt: Option<u32>, reject: bool) -> Request<Body> {
    let mut req = request(attempt);
    if reject {
        req.headers_mut()
            .insert("x-reject", HeaderValue::from_static("1"));
    }
    req
}

fn rejecting_tagged()
-> impl Service<Request<Body>, Response = Response<Body>, Error = Infallible> + Clone {
    service_fn(|req: Request<Body>| async move {
        Ok::<_, Infallible>(if req.headers().contains_key("x-reject") {
            http_429()
        } else {
            status(StatusCode::OK)
        })
    })
}

#[tokio::test(start_paused = true)]
async fn a_sustained_stop_signal_lasts_while_the_server_keeps_rejecting() {
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(&layer, rejecting_tagged());
    // 60 % of first tries rejected and retried: once the window holds 200 requests (in the
    // second second) the retries are far above 5 %, and from then on every rejection
    // carries the stop signal, for 30 s, although the callers obey and no retry reaches the
    // server any more.
    let (retries, stops) = obeying_callers(&mut svc, 30, 0.6).await;
    assert_eq!(stops[0], 0, "{stops:?}");
    assert!(stops[2..].iter().all(|&s| s == 60), "{stops:?}");
    assert!(retries[2..].iter().all(|&r| r == 0), "{retries:?}");
    // Load falls: 3 % of first tries rejected. The window still holds the storm's stop
    // signals, then slides past them; from then on rejections are plain again, and their
    // retries (3 %) stay under the threshold.
    let (retries, stops) = obeying_callers(&mut svc, 20, 0.03).await;
    assert!(stops[..9].iter().all(|&s| s == 3), "{stops:?}");
    assert!(stops[10..].iter().all(|&s| s == 0), "{stops:?}");
    assert!(retries[10..].iter().all(|&r| r == 3), "{retries:?}");
}

#[tokio::test(start_paused = true)]
async fn an_unsustained_stop_signal_lapses_when_callers_obey() {
    // The paper's rule: retries alone. The callers obey, their retries leave the window, the
    // signal lapses, their retries come back, and so on.
    let layer = OverloadSignalLayer::builder()
        .trust(Trust::everyone())
        .rule(StopRule::builder().sustain(false).build().unwrap())
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, rejecting_tagged());
    let (retries, stops) = obeying_callers(&mut svc, 30, 0.6).await;
    assert!(stops[2..].contains(&60), "{stops:?}");
    // Once a window has passed, the retries come back each time the signal lapses: more
    // than the sustained rule's none.
    assert!(
        retries[10..].iter().sum::<u64>() > 30,
        "{retries:?} {stops:?}"
    );
}

/// Counts the events logged at `WARN` and at `ERROR`.
#[derive(Default)]
struct LevelCounter {
    warn: std::sync::atomic::AtomicUsize,
    error: std::sync::atomic::AtomicUsize,
}

impl LevelCounter {
    /// (`WARN` lines, `ERROR` lines) so far.
    fn get(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.warn.load(Relaxed), self.error.load(Relaxed))
    }
}

impl tracing::Subscriber for LevelCounter {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let counter = match *event.metadata().level() {
            tracing::Level::WARN => &self.warn,
            tracing::Level::ERROR => &self.error,
            _ => return,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Regression (issue 23, finding 1): a request without a caller key was logged once per
/// layer, then never again, while every such request let one caller forge a storm for all
/// of them. Each is counted, and logged again at most once a minute while they keep coming.
/// Issue 31, finding 8: a request without a peer address means the server does not provide
/// it (no client can cause that), so the line is an `ERROR` (it was a `WARN`), with the fix.
#[test]
fn requests_without_a_caller_key_are_counted_and_logged_again_every_minute() {
    crate::test_logs::anchor_interest();
    let levels = Arc::new(LevelCounter::default());
    let errors = || levels.get().1;
    let dispatch = tracing::Dispatch::from(Arc::clone(&levels));
    let recorder = DebuggingRecorder::new();
    metrics::with_local_recorder(&recorder, || {
        tracing::dispatcher::with_default(&dispatch, || {
            tracing::callsite::rebuild_interest_cache();
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap();
            rt.block_on(async {
                let layer = trusting_layer();
                let mut svc = tower::Layer::layer(&layer, answering(|| status(StatusCode::OK)));
                send_from(&mut svc, 3, Some(0), honest_peer(1)).await;
                assert_eq!(levels.get(), (0, 0));
                send(&mut svc, 5, &[Some(0)]).await;
                assert_eq!(levels.get(), (0, 1), "the first at once, at ERROR");
                for _ in 0..59 {
                    tokio::time::advance(Duration::from_secs(1)).await;
                    send(&mut svc, 1, &[None]).await;
                }
                assert_eq!(errors(), 1, "not once per request");
                tokio::time::advance(Duration::from_secs(1)).await;
                send(&mut svc, 1, &[None]).await;
                assert_eq!(errors(), 2, "again a minute later, while they keep coming");
                // Another layer logs its own.
                let other = trusting_layer();
                let mut svc = tower::Layer::layer(&other, answering(|| status(StatusCode::OK)));
                send(&mut svc, 2, &[None]).await;
                assert_eq!(levels.get(), (0, 3));
                // A key of the user's own that finds none in a request that has a peer: a
                // client can cause that (by leaving out what the key reads), so a `WARN`.
                let keyed = OverloadSignalLayer::builder()
                    .key_by(|_: &http::request::Parts| None::<u8>)
                    .build()
                    .unwrap();
                let mut svc = tower::Layer::layer(&keyed, answering(|| status(StatusCode::OK)));
                send_from(&mut svc, 2, Some(0), honest_peer(1)).await;
                assert_eq!(levels.get(), (1, 3));
            });
        });
    });
    let values = metric_values(&recorder);
    let unkeyed = find(&values, metric_names::UNKEYED_REQUESTS, None);
    assert_eq!(unkeyed, &DebugValue::Counter(5 + 60 + 2 + 2));
}

/// The threat model's "one caller can also hold the signal back": 1 000 honest first tries
/// and 100 honest retries in the window (9 %, a storm: the server answers them with the
/// stop signal), and the same with one caller adding 2 000 first tries: the plain figure
/// falls to 3.2 %, and the signal does not fire.
#[tokio::test(start_paused = true)]
async fn one_caller_with_most_of_the_traffic_holds_the_signal_back() {
    // 1 100 honest requests from 50 networks, one retry in eleven; returns the stop
    // signals among the last 100.
    async fn storm<S>(svc: &mut S, diluter: bool) -> u64
    where
        S: Service<Request<Body>, Response = Response<Body>, Error = Infallible>,
    {
        let mut stopped = 0;
        for i in 0..1_100u32 {
            let attempt = if i % 11 == 10 { 1 } else { 0 };
            if diluter && i < 1_000 {
                for _ in 0..2 {
                    one(svc, from_peer(Some(0), FORGER)).await;
                }
            }
            let r = one(svc, from_peer(Some(attempt), honest_peer(i % 50))).await;
            if i >= 1_000 {
                stopped += u64::from(protocol::is_stop_signal(r.headers()));
            }
        }
        stopped
    }
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    assert_eq!(storm(&mut svc, false).await, 100);
    let share = layer.histogram().snapshot().retry_share().unwrap();
    assert!((share - 100.0 / 1_100.0).abs() < 1e-9, "{share}");

    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    assert_eq!(storm(&mut svc, true).await, 0);
    let share = layer.histogram().snapshot().retry_share().unwrap();
    assert!((share - 100.0 / 3_100.0).abs() < 1e-9, "{share}");
    assert!((0.032..0.033).contains(&share), "{share}");
}

/// The threat model's "fewer callers, fewer classes": one caller that sends only retries,
/// as much as any honest caller, among 15 honest networks (16 classes in use) fires the
/// rule alone (its class weighs 1/16, 6.25 %, over the 5 % threshold); among 40 (41 classes,
/// 2.4 %) it cannot.
#[tokio::test(start_paused = true)]
async fn one_caller_among_few_fires_the_rule_alone_and_among_many_cannot() {
    async fn stops_with(honest: u32) -> u64 {
        let layer = OverloadSignalLayer::builder()
            .caller_seed(3)
            .trust(Trust::everyone())
            .build()
            .unwrap();
        let mut svc = tower::Layer::layer(&layer, answering(http_429));
        let mut stopped = 0;
        for round in 0..30u32 {
            for i in 0..honest {
                let r = one(&mut svc, from_peer(Some(0), honest_peer(i))).await;
                if round >= 20 {
                    stopped += u64::from(protocol::is_stop_signal(r.headers()));
                }
            }
            one(&mut svc, from_peer(Some(2), FORGER)).await;
        }
        stopped
    }
    // NOTE: with a fixed seed, 16 networks fill 16 distinct classes (a collision would
    // merge two honest networks, which the assertions would show).
    assert_eq!(stops_with(15).await, 10 * 15);
    assert_eq!(stops_with(40).await, 0);
}

/// A request from `peer` whose counters say: our client's attempt `ours`, Envoy's
/// (1-based) attempt count `envoy`.
fn through_envoy(ours: Option<u32>, envoy: &'static str, peer: &str) -> Request<Body> {
    let mut req = from_peer(ours, peer.parse().unwrap());
    req.headers_mut().insert(
        protocol::X_ENVOY_ATTEMPT_COUNT,
        HeaderValue::from_static(envoy),
    );
    req
}

/// Issue 32: a retry by an Envoy sidecar or gateway (`x-envoy-attempt-count`, 1-based)
/// counts as a retry, even of our client's first try (`X-Request-Attempt: 0`), under the
/// same trust rules as ours: with the default trust, from Envoy on loopback or a private
/// address without configuration; from an address on the Internet, not at all.
#[tokio::test(start_paused = true)]
async fn envoy_attempt_counts_count_under_the_same_trust_rules() {
    let layer = OverloadSignalLayer::new();
    let mut svc = tower::Layer::layer(&layer, answering(|| status(StatusCode::OK)));
    one(&mut svc, through_envoy(Some(0), "2", "127.0.0.1:40000")).await;
    one(&mut svc, through_envoy(None, "3", "10.1.2.3:40000")).await;
    one(&mut svc, through_envoy(None, "1", "10.1.2.3:40000")).await;
    let s = layer.histogram().snapshot();
    assert_eq!(s.count(AttemptClass::Retry1), 1);
    assert_eq!(s.count(AttemptClass::Retry2), 1);
    assert_eq!(s.count(AttemptClass::First), 1);
    // Claimed by a client on the Internet, whichever header claims it: not a retry.
    one(&mut svc, through_envoy(Some(0), "2", "203.0.113.9:40000")).await;
    one(&mut svc, through_envoy(None, "0", "203.0.113.9:40000")).await;
    let s = layer.histogram().snapshot();
    assert_eq!(s.retries(), 2);
    assert_eq!(s.count(AttemptClass::Unknown), 1);
    assert_eq!(s.count(AttemptClass::Malformed), 1);
}

/// Issue 32: a storm of retries that only Envoy counts (our client's counter says first
/// try every time) makes the server say stop, in a form Envoy obeys.
#[tokio::test(start_paused = true)]
async fn a_storm_of_envoy_retries_gets_a_stop_signal_envoy_obeys() {
    let layer = OverloadSignalLayer::builder()
        .rule(rule(0.1, 10))
        .build()
        .unwrap();
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    for envoy in ["1", "2", "3"].into_iter().cycle().take(30) {
        one(&mut svc, through_envoy(Some(0), envoy, "127.0.0.1:40000")).await;
    }
    let r = one(&mut svc, through_envoy(Some(0), "1", "127.0.0.1:40000")).await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(protocol::is_stop_signal(r.headers()));
    assert_eq!(r.headers()[protocol::X_ENVOY_RATELIMITED], "true");
}

/// Issue 32: a stop signal the handler made itself, or relayed (an `X-Overloaded` of ours
/// without Envoy's header, or Envoy's own `x-envoy-overloaded`), leaves the server as the
/// whole stop signal: with `X-Overloaded` and `x-envoy-ratelimited: true`, so that an
/// Envoy above does not retry it; its status and body are kept.
#[tokio::test(start_paused = true)]
async fn a_handlers_partial_stop_signal_leaves_complete() {
    let layer = trusting_layer();
    for header in [protocol::X_OVERLOADED, protocol::X_ENVOY_OVERLOADED] {
        let mut svc = tower::Layer::layer(
            &layer,
            service_fn(move |_req: Request<Body>| {
                let header = header.clone();
                async move {
                    let mut r = status(StatusCode::SERVICE_UNAVAILABLE);
                    r.headers_mut()
                        .insert(header, HeaderValue::from_static("true"));
                    Ok::<_, Infallible>(r)
                }
            }),
        );
        let r = one(&mut svc, request(Some(0))).await;
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(r.headers().contains_key(protocol::X_OVERLOADED));
        assert_eq!(r.headers()[protocol::X_ENVOY_RATELIMITED], "true");
        assert_eq!(http_body::Body::size_hint(r.body()).exact(), Some(10));
    }
    // gRPC: a trailers-only UNAVAILABLE with our header gains Envoy's and the pushback.
    let mut svc = tower::Layer::layer(
        &layer,
        answering(|| {
            let mut r = grpc_status_response(14);
            r.headers_mut().insert(
                protocol::X_OVERLOADED,
                HeaderValue::from_static("stop-retrying"),
            );
            r
        }),
    );
    let r = one(&mut svc, grpc_request(Some(0))).await;
    assert_eq!(protocol::grpc_status(r.headers()), Some(14));
    assert_eq!(r.headers()[protocol::X_ENVOY_RATELIMITED], "true");
    assert_eq!(r.headers()[protocol::GRPC_RETRY_PUSHBACK_MS], "-1");
}
