//! What an operator sees (issue 20): every metric labelled with the layer's name, registered
//! on the first request rather than when the layer is built, and state changes logged once
//! per episode, not once per request.
//!
//! Each test installs its recorder and log capture for its own thread (a `current_thread`
//! runtime under paused time), so the tests of this binary do not see each other's.

use crate::support;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use backoff_layer::backoff::Seeds;
use backoff_layer::budget::RetryBudget;
use backoff_layer::{GiveUpReason, ReplayBody, RetryLayer, is_overloaded};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Empty;
use support::{Logs, MS, Recorded, SECOND, get, info};
use tower::{Layer, ServiceExt, service_fn};
use tracing::Level;

type Req = Request<ReplayBody<Empty<Bytes>>>;

/// A response of `status`, with the stop signal when `stop`.
fn respond(status: u16, stop: bool) -> Response<Empty<Bytes>> {
    let mut response = Response::new(Empty::new());
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    if stop {
        response
            .headers_mut()
            .insert("x-overloaded", "stop-retrying".parse().unwrap());
    }
    response
}

/// Every series of one layer and its own budget, as the layer registers them.
#[allow(clippy::too_many_arguments)]
fn series(
    name: &str,
    requests: u64,
    attempts: u64,
    stop_signals: u64,
    gave_up_max_attempts: u64,
    gave_up_budget: u64,
    budget_allowed: u64,
    budget_refused: u64,
) -> BTreeMap<String, u64> {
    let retries = attempts - requests;
    let mut out: BTreeMap<String, u64> = [
        ("backoff_layer_requests_total", requests),
        ("backoff_layer_attempts_total", attempts),
        ("backoff_layer_retries_total", retries),
        ("backoff_layer_stop_signals_total", stop_signals),
        // A histogram: the number of waits recorded, one per retry.
        ("backoff_layer_retry_delay_seconds", retries),
        ("backoff_layer_budget_retries_allowed_total", budget_allowed),
    ]
    .into_iter()
    .map(|(metric, n)| (format!("{metric}{{name={name}}}"), n))
    .collect();
    // Refusals by level: these requests carry none, so they are `critical`'s.
    for level in LEVELS {
        out.insert(
            format!(
                "backoff_layer_budget_retries_refused_total{{name={name}}}{{criticality={level}}}"
            ),
            if level == "critical" {
                budget_refused
            } else {
                0
            },
        );
    }
    for (reason, n) in [
        ("max_attempts", gave_up_max_attempts),
        ("budget", gave_up_budget),
        ("deadline", 0),
        ("body_not_replayable", 0),
        ("not_retryable", 0),
        ("retry_after_too_long", 0),
    ] {
        out.insert(
            format!("backoff_layer_gave_up_total{{name={name}}}{{reason={reason}}}"),
            n,
        );
    }
    out
}

/// [`series`] and the counters of the layer's own throttle, at zero: nothing refused,
/// every destination tracked.
fn with_throttle(mut series: BTreeMap<String, u64>, name: &str) -> BTreeMap<String, u64> {
    series.insert(
        format!("backoff_layer_throttle_untracked_total{{name={name}}}"),
        0,
    );
    for level in LEVELS {
        series.insert(
            format!("backoff_layer_throttle_refused_total{{name={name}}}{{criticality={level}}}"),
            0,
        );
    }
    series
}

/// `series` and the effective and actual outcomes of the layer `name`'s requests to
/// `http://example.test/` (`[success, failure]` each).
fn with_outcomes(
    mut series: BTreeMap<String, u64>,
    name: &str,
    effective: [u64; 2],
    actual: [u64; 2],
) -> BTreeMap<String, u64> {
    for (metric, counts) in [
        ("backoff_layer_request_outcomes_total", effective),
        ("backoff_layer_attempt_outcomes_total", actual),
    ] {
        for (outcome, n) in ["success", "failure"].into_iter().zip(counts) {
            series.insert(
                format!(
                    "{metric}{{name={name}}}{{server_address=example.test}}{{outcome={outcome}}}"
                ),
                n,
            );
        }
    }
    series
}

/// The `criticality` label's values: the refusal counters have one series per level.
const LEVELS: [&str; 4] = ["sheddable", "sheddable-plus", "critical", "critical-plus"];

/// Two retry layers in one process, 10 requests each, one downstream failing: two series
/// per metric, told apart by `name`, each with its own layer's counts, the budgets' included
/// (each layer made its own budget, named after it). The failing one has no client-side
/// throttle, which would refuse some of its requests (`throttle.rs` tests that).
#[tokio::test(start_paused = true)]
async fn two_layers_are_told_apart_by_name() {
    let recorded = Recorded::install();
    let payments = RetryLayer::builder()
        .name("payments")
        .seeds(Seeds::from_seed(1))
        .build()
        .unwrap()
        .layer(service_fn(|_: Req| async {
            Ok::<_, Infallible>(respond(200, false))
        }));
    let search = RetryLayer::builder()
        .name("search")
        .seeds(Seeds::from_seed(2))
        .no_throttle()
        .build()
        .unwrap()
        .layer(service_fn(|_: Req| async {
            Ok::<_, Infallible>(respond(503, false))
        }));
    for _ in 0..10 {
        let ok = payments.clone().oneshot(get()).await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        let failed = search.clone().oneshot(get()).await.unwrap();
        assert_eq!(failed.status(), StatusCode::SERVICE_UNAVAILABLE);
    }
    let payments = with_throttle(series("payments", 10, 10, 0, 0, 0, 0, 0), "payments");
    let mut expected = with_outcomes(payments, "payments", [10, 0], [10, 0]);
    // The failing layer's default budget: 10% of its first attempts plus a floor of 10 per
    // 10 s window. Requests 1 to 5 take their two retries each (10, the floor) and give up
    // on max attempts; requests 6 to 9 are refused their first retry; the 10th deposit
    // earns one more retry (10 * 0.1), the 10th request's first, and its second is refused.
    // Every request of it failed, and every one of its 21 attempts.
    let search = series("search", 10, 21, 0, 5, 5, 11, 5);
    expected.extend(with_outcomes(search, "search", [0, 10], [0, 21]));
    assert_eq!(recorded.snapshot(), expected);
}

/// A recorder installed after the layer is built, before its first request, sees every
/// metric the layer and its default budget record, at zero until used.
#[tokio::test(start_paused = true)]
async fn a_recorder_installed_after_the_layer_sees_every_metric() {
    // Built before any recorder exists, as an application builds its clients first.
    let service = RetryLayer::new().layer(service_fn(|_: Req| async {
        Ok::<_, Infallible>(respond(200, false))
    }));
    let recorded = Recorded::install();
    service.oneshot(get()).await.unwrap();
    assert_eq!(
        recorded.snapshot(),
        with_outcomes(
            with_throttle(series("default", 1, 1, 0, 0, 0, 0, 0), "default"),
            "default",
            [1, 0],
            [1, 0]
        )
    );
}

/// 100 retries refused by the budget: one `WARN` when the refusals begin, with the budget's
/// name, and one `INFO` when a whole window has passed without one, not one per refusal.
#[tokio::test(start_paused = true)]
async fn a_hundred_refusals_log_one_warning() {
    let (logs, _guard) = Logs::capture();
    let healthy = Arc::new(AtomicBool::new(false));
    let downstream = service_fn({
        let healthy = Arc::clone(&healthy);
        move |_: Req| {
            let status = if healthy.load(Ordering::Relaxed) {
                200
            } else {
                503
            };
            async move { Ok::<_, Infallible>(respond(status, false)) }
        }
    });
    // A budget that refuses every retry, shared by name as one would share it between
    // layers: its logs carry its own name, not the layer's.
    let budget = RetryBudget::builder()
        .name("search-budget")
        .ratio(0.0)
        .min_retries_per_sec(0)
        .build()
        .unwrap();
    // No client-side throttle: it would refuse most of these requests to a downstream that
    // fails every one (and log that, once).
    let service = RetryLayer::builder()
        .name("search")
        .budget(budget)
        .seeds(Seeds::from_seed(3))
        .no_throttle()
        .build()
        .unwrap()
        .layer(downstream);
    for _ in 0..100 {
        let response = service.clone().oneshot(get()).await.unwrap();
        assert_eq!(info(&response).gave_up, Some(GiveUpReason::BudgetExhausted));
        tokio::time::advance(10 * MS).await;
    }
    let warnings = logs.at(Level::WARN);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(warnings[0].fields["name"], "search-budget");
    assert!(
        warnings[0].message.contains("retry budget"),
        "{warnings:#?}"
    );
    assert!(logs.at(Level::INFO).is_empty());

    // The downstream recovers; a window (10 s) after the last refusal, the next request
    // ends the episode, once.
    healthy.store(true, Ordering::Relaxed);
    tokio::time::advance(10 * SECOND).await;
    for _ in 0..3 {
        service.clone().oneshot(get()).await.unwrap();
    }
    let ended = logs.at(Level::INFO);
    assert_eq!(ended.len(), 1, "{ended:#?}");
    assert_eq!(ended[0].fields["name"], "search-budget");
    // From the first refusal to the last: 99 gaps of 10 ms.
    assert_eq!(ended[0].fields["lasted_ms"], "990");
    assert_eq!(logs.at(Level::WARN).len(), 1);
}

/// A downstream answering with the stop signal: one `WARN` ("downstream says stop
/// retrying") with the layer's name when the signals begin, one `INFO` when none has come
/// for `RetryLayer::STOP_SIGNAL_QUIET`; each signal still counted.
#[tokio::test(start_paused = true)]
async fn stop_signals_log_once_per_episode() {
    let (logs, _guard) = Logs::capture();
    let recorded = Recorded::install();
    let healthy = Arc::new(AtomicBool::new(false));
    let downstream = service_fn({
        let healthy = Arc::clone(&healthy);
        move |_: Req| {
            let ok = healthy.load(Ordering::Relaxed);
            async move { Ok::<_, Infallible>(respond(if ok { 200 } else { 503 }, !ok)) }
        }
    });
    // No client-side throttle: it would refuse most of these requests (see above).
    let service = RetryLayer::builder()
        .name("search")
        .seeds(Seeds::from_seed(4))
        .no_throttle()
        .build()
        .unwrap()
        .layer(downstream);
    for _ in 0..50 {
        let err = service.clone().oneshot(get()).await.unwrap_err();
        assert!(is_overloaded(&*err));
        tokio::time::advance(100 * MS).await;
    }
    let warnings = logs.at(Level::WARN);
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(warnings[0].fields["name"], "search");
    assert!(
        warnings[0]
            .message
            .contains("downstream says stop retrying")
    );
    assert!(logs.at(Level::INFO).is_empty());
    assert_eq!(
        recorded.snapshot()["backoff_layer_stop_signals_total{name=search}"],
        50
    );

    // Not quiet long enough yet: the episode goes on.
    healthy.store(true, Ordering::Relaxed);
    tokio::time::advance(RetryLayer::STOP_SIGNAL_QUIET - SECOND).await;
    service.clone().oneshot(get()).await.unwrap();
    assert!(logs.at(Level::INFO).is_empty());
    tokio::time::advance(SECOND).await;
    for _ in 0..3 {
        service.clone().oneshot(get()).await.unwrap();
    }
    let ended = logs.at(Level::INFO);
    assert_eq!(ended.len(), 1, "{ended:#?}");
    assert_eq!(ended[0].fields["name"], "search");
    assert_eq!(ended[0].fields["lasted_ms"], "4900");
}

/// Regression (issue 31, finding 5): what a client reaches is often chosen by its users (a
/// webhook, a forward proxy), credentials in the URI included. 1 000 destinations, each
/// `http://user:secret@hostN.test:8080/`, each failing until it is throttled, 100 at a time
/// (the table holds 256; a destination idle for 20 s gives its place up): the recorder keeps
/// a bounded set of series (each destination's gauge used to stay, one series per
/// destination ever throttled), and no label, log field, span or error names the user
/// information.
#[tokio::test(start_paused = true)]
async fn a_thousand_throttled_destinations_leave_a_bounded_set_of_series_and_no_secret() {
    let (logs, _guard) = Logs::capture();
    let recorded = Recorded::install();
    // Even hosts answer 503 with the stop signal, odd ones a plain 503.
    let downstream = service_fn(|r: Req| {
        let host = r.uri().host().unwrap_or_default().to_owned();
        let n: u32 = host
            .trim_start_matches("host")
            .trim_end_matches(".test")
            .parse()
            .unwrap();
        async move { Ok::<_, Infallible>(respond(503, n % 2 == 0)) }
    });
    let service = RetryLayer::builder()
        .name("webhooks")
        .seeds(Seeds::from_seed(31))
        .build()
        .unwrap()
        .layer(downstream);
    let mut errors = Vec::new();
    let mut next = 0u32;
    let throttled = |logs: &Logs| {
        logs.at(Level::WARN)
            .iter()
            .filter(|w| w.message.contains("client-side throttling refuses"))
            .count()
    };
    // NOTE: destinations whose bucket of the table is full are sent unthrottled (keys are
    // hashed with a random seed): more destinations are tried until 1 000 were throttled.
    while throttled(&logs) < 1_000 {
        let wave = next..next + 100;
        next += 100;
        for _ in 0..15 {
            for n in wave.clone() {
                let uri = format!("http://user:secret@host{n}.test:8080/hook?token=1");
                // GET for the even, POST (not retried) for the odd.
                let method = if n % 2 == 0 { "GET" } else { "POST" };
                let request = Request::builder()
                    .method(method)
                    .uri(uri)
                    .body(Empty::<Bytes>::new())
                    .unwrap();
                match service.clone().oneshot(request).await {
                    Ok(response) => assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE),
                    Err(e) => errors.push(format!("{e} {e:?}")),
                }
            }
        }
        // Throttled at the next tick; idle for 10 windows, released, throttling ended.
        tokio::time::advance(400 * MS).await;
        tokio::time::advance(21 * SECOND).await;
        assert!(next <= 2_000, "{} throttled of {next}", throttled(&logs));
    }
    let throttled_total = throttled(&logs);
    assert!(throttled_total >= 1_000);

    let series = recorded.series();
    for line in series.iter().chain(&errors) {
        assert!(!line.contains("secret") && !line.contains("user"), "{line}");
    }
    let everything = logs.everything();
    assert!(everything.len() > 2_000, "{}", everything.len());
    for logged in &everything {
        let line = format!("{logged:?}");
        assert!(!line.contains("secret") && !line.contains("user"), "{line}");
    }
    let gauges: Vec<&String> = series
        .iter()
        .filter(|s| s.starts_with("backoff_layer_throttle_probability"))
        .collect();
    // The bound: 32 destinations with a series of their own (the first throttled), and
    // one for every other, `(other)`.
    assert_eq!(
        gauges.len(),
        32 + 1,
        "{throttled_total} throttled: {gauges:#?}"
    );
    assert!(
        gauges.iter().any(|g| g.ends_with("{destination=(other)}")),
        "{gauges:#?}"
    );
    // NOTE: which 32: those throttled first (the first wave's, in the table's order).
    let own = gauges
        .iter()
        .filter(|g| g.contains("{destination=http://host") && g.ends_with(".test:8080}"))
        .count();
    assert_eq!(own, 32, "{gauges:#?}");

    // The logs still name each destination, by scheme, host and port.
    assert!(logs.at(Level::WARN).iter().any(|w| {
        w.fields
            .get("destination")
            .is_some_and(|d| d.starts_with("http://host") && d.ends_with(".test:8080"))
    }));
}
