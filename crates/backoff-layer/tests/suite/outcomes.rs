//! Effective and actual outcomes per destination (issue 35, item 3): what each request's
//! caller saw, after its retries (`backoff_layer_request_outcomes_total`), beside what each
//! attempt saw on the wire (`backoff_layer_attempt_outcomes_total`), labelled `name`,
//! `server_address` and `outcome`, as Linkerd's `routes -o wide` shows EFFECTIVE_SUCCESS
//! beside ACTUAL_SUCCESS.
//!
//! Each test installs its recorder for its own thread (a `current_thread` runtime under
//! paused time), so the tests of this binary do not see each other's.

use crate::support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use backoff_layer::backoff::{Fixed, Seeds};
use backoff_layer::{ReplayBody, RetryBuilder, RetryLayer, is_throttled};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use overload_signal::deadline::RequestDeadline;
use support::{MS, Mock, Recorded, Reply, status};
use tokio::time::Instant;
use tower::{Layer, ServiceExt, service_fn};

type Req = Request<ReplayBody<Empty<Bytes>>>;

const REQUESTS: &str = "backoff_layer_request_outcomes_total";
const ATTEMPTS: &str = "backoff_layer_attempt_outcomes_total";

fn layer() -> RetryBuilder {
    RetryLayer::builder()
        .name("api")
        .backoff(Fixed::every(100 * MS).unwrap())
        .seeds(Seeds::from_seed(7))
        .no_throttle()
}

fn get(uri: &str) -> Request<Empty<Bytes>> {
    Request::get(uri).body(Empty::new()).unwrap()
}

/// A response of `status` to any request.
fn respond(status: u16) -> Response<Empty<Bytes>> {
    let mut response = Response::new(Empty::new());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    response
}

/// The outcome series of one destination of the layer `api`: effective successes and
/// failures, then actual ones.
fn outcomes(server: &str, effective: [u64; 2], actual: [u64; 2]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for (metric, counts) in [(REQUESTS, effective), (ATTEMPTS, actual)] {
        for (outcome, n) in ["success", "failure"].into_iter().zip(counts) {
            out.insert(
                format!("{metric}{{name=api}}{{server_address={server}}}{{outcome={outcome}}}"),
                n,
            );
        }
    }
    out
}

/// Only the outcome series of what was recorded.
fn recorded_outcomes(recorded: &Recorded) -> BTreeMap<String, u64> {
    recorded
        .counters()
        .into_iter()
        .filter(|(key, _)| key.starts_with(REQUESTS) || key.starts_with(ATTEMPTS))
        .collect()
}

/// Two failures, then a success: the caller saw one success (effective 100 %), the wire
/// carried three attempts of which one succeeded (actual 33 %). The retries hid two failures.
#[tokio::test(start_paused = true)]
async fn two_failures_then_a_success_is_one_effective_success_of_three_attempts() {
    let recorded = Recorded::install();
    let mock = Mock::new(vec![status(503), status(503), status(200)]);
    let response = layer()
        .build()
        .unwrap()
        .layer(mock.clone())
        .oneshot(get("http://example.test/orders"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(mock.seen().len(), 3);
    assert_eq!(
        recorded_outcomes(&recorded),
        outcomes("example.test", [1, 0], [1, 2])
    );
}

/// Two destinations behind one layer: one healthy, one failing every attempt; each has its
/// own series, named by host and (not the scheme's default) port.
#[tokio::test(start_paused = true)]
async fn two_destinations_are_kept_apart() {
    let recorded = Recorded::install();
    let service = layer()
        .build()
        .unwrap()
        .layer(service_fn(|request: Req| async move {
            let healthy = request.uri().host() == Some("a.test");
            Ok::<_, Infallible>(respond(if healthy { 200 } else { 503 }))
        }));
    for _ in 0..3 {
        let ok = service.clone().oneshot(get("http://a.test:8080/x")).await;
        assert_eq!(ok.unwrap().status(), StatusCode::OK);
        let failed = service.clone().oneshot(get("https://b.test/y")).await;
        assert_eq!(failed.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let mut expected = outcomes("a.test:8080", [3, 0], [3, 0]);
    // Each request to b.test: three attempts (max attempts), given up on.
    expected.extend(outcomes("b.test", [0, 3], [0, 9]));
    assert_eq!(recorded_outcomes(&recorded), expected);
}

/// Past the bound, destinations share `server_address="(other)"`; the first ones keep
/// theirs.
#[tokio::test(start_paused = true)]
async fn destinations_past_the_bound_are_counted_in_other() {
    let recorded = Recorded::install();
    let service = layer()
        .max_destination_series(2)
        .build()
        .unwrap()
        .layer(service_fn(|_: Req| async {
            Ok::<_, Infallible>(respond(200))
        }));
    for host in ["h1", "h2", "h3", "h4", "h5", "h1", "h4"] {
        let uri = format!("http://{host}.test/");
        service.clone().oneshot(get(&uri)).await.unwrap();
    }
    let mut expected = outcomes("h1.test", [2, 0], [2, 0]);
    expected.extend(outcomes("h2.test", [1, 0], [1, 0]));
    expected.extend(outcomes("(other)", [4, 0], [4, 0]));
    assert_eq!(recorded_outcomes(&recorded), expected);
}

/// A script, whether the caller gets an answer, effective and actual `[success, failure]`.
type Case = (Vec<Reply>, bool, [u64; 2], [u64; 2]);

/// A request given up on is one effective failure, whatever its attempts were: three
/// `503`s (max attempts), a refused connection each time (an error), the stop signal (one
/// attempt, never retried), a `500` (a failure the classifier does not retry). A `404` is
/// an answer the classifier would not retry and not a failure: a success, as Linkerd
/// counts it.
#[tokio::test(start_paused = true)]
async fn what_counts_as_a_failure_and_what_as_a_success() {
    // The script, whether the caller gets an answer (not an error), and the effective and
    // actual `[success, failure]` counts.
    let cases: [Case; 5] = [
        (vec![status(503)], true, [0, 1], [0, 3]),
        (
            vec![Reply::Io(std::io::ErrorKind::ConnectionRefused)],
            false,
            [0, 1],
            [0, 3],
        ),
        (
            vec![Reply::Status(503, vec![("x-overloaded", "stop-retrying")])],
            false,
            [0, 1],
            [0, 1],
        ),
        (vec![status(500)], true, [0, 1], [0, 1]),
        (vec![status(404)], true, [1, 0], [1, 0]),
    ];
    for (script, answered, effective, actual) in cases {
        let recorded = Recorded::install();
        let mock = Mock::new(script.clone());
        let result = layer()
            .build()
            .unwrap()
            .layer(mock)
            .oneshot(get("http://example.test/"))
            .await;
        assert_eq!(result.is_ok(), answered, "{script:?}");
        assert_eq!(
            recorded_outcomes(&recorded),
            outcomes("example.test", effective, actual),
            "{script:?}"
        );
    }
}

/// A request whose caller's deadline had passed is never sent: one effective failure, no
/// attempt.
#[tokio::test(start_paused = true)]
async fn a_request_not_sent_is_an_effective_failure_without_attempts() {
    let recorded = Recorded::install();
    let mock = Mock::new(vec![status(200)]);
    let mut request = get("http://example.test/");
    request
        .extensions_mut()
        .insert(RequestDeadline::at(Instant::now()));
    let service = layer().build().unwrap().layer(mock.clone());
    service.oneshot(request).await.unwrap_err();
    assert!(mock.seen().is_empty());
    assert_eq!(
        recorded_outcomes(&recorded),
        outcomes("example.test", [0, 1], [0, 0])
    );
}

/// A destination failing every attempt, behind the layer's own client-side throttle: one
/// request every 10 ms for 5 s. Every request is an effective failure, the ones the throttle
/// refused (never sent) included; the actual failures are exactly the attempts sent.
#[tokio::test(start_paused = true)]
async fn requests_the_throttle_refused_are_effective_failures_without_attempts() {
    let recorded = Recorded::install();
    let sent = Arc::new(AtomicU64::new(0));
    let service = RetryLayer::builder()
        .name("api")
        .seeds(Seeds::from_seed(35))
        .build()
        .unwrap()
        .layer(service_fn({
            let sent = Arc::clone(&sent);
            move |_: Req| {
                sent.fetch_add(1, Ordering::Relaxed);
                async { Ok::<_, Infallible>(respond(503)) }
            }
        }));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..500 {
        let service = service.clone();
        tasks.spawn(async move { service.oneshot(get("http://down.test/")).await });
        tokio::time::sleep(10 * MS).await;
    }
    let mut refused = 0;
    while let Some(done) = tasks.join_next().await {
        if done.unwrap().is_err_and(|e| is_throttled(&*e)) {
            refused += 1;
        }
    }
    assert!(refused > 250, "the throttle refused {refused} of 500");
    let sent = sent.load(Ordering::Relaxed);
    assert_eq!(
        recorded_outcomes(&recorded),
        outcomes("down.test", [0, 500], [0, sent])
    );
}

/// A client whose URLs its users choose (a webhook sender) meets 500 hosts on random ports:
/// the layer records `4 * (32 + 1)` outcome series, not 2 000.
#[tokio::test(start_paused = true)]
async fn a_flood_of_hosts_records_a_bounded_set_of_series() {
    let recorded = Recorded::install();
    let service = layer().build().unwrap().layer(service_fn(|_: Req| async {
        Ok::<_, Infallible>(respond(200))
    }));
    for i in 0..500 {
        let uri = format!("http://host-{i}.test:{}/", 1024 + i * 7);
        service.clone().oneshot(get(&uri)).await.unwrap();
    }
    let series = recorded_outcomes(&recorded);
    assert_eq!(
        series.len(),
        4 * (RetryLayer::DEFAULT_MAX_DESTINATION_SERIES + 1)
    );
    let other = outcomes("(other)", [500 - 32, 0], [500 - 32, 0]);
    for (key, n) in other {
        assert_eq!(series.get(&key), Some(&n), "{key}");
    }
}

#[test]
fn the_bound_is_checked() {
    let err = RetryLayer::builder()
        .max_destination_series(1025)
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "max_destination_series");
    assert_eq!(
        err.to_string(),
        "max_destination_series must be within 0..=1024, got 1025"
    );
    RetryLayer::builder()
        .max_destination_series(RetryLayer::MAX_DESTINATION_SERIES)
        .build()
        .unwrap();
}
