//! The layer's metrics, recorded through the `metrics` facade, each labelled with the
//! layer's name (`"default"` here).
//!
//! One test only: it installs a global recorder for this test binary.

mod support;

use std::collections::HashMap;

use backoff_layer::RetryLayer;
use backoff_layer::backoff::{Fixed, Seeds};
use backoff_layer::budget::Budget;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use support::{MS, Mock, Reply, get, status};
use tower::{Layer, ServiceExt};

struct Refuse;

impl Budget for Refuse {
    fn deposit(&self) {}

    fn withdraw(&self) -> bool {
        false
    }
}

#[tokio::test(start_paused = true)]
async fn counters_by_name_and_reason() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();

    let builder = || {
        RetryLayer::builder()
            .backoff(Fixed::every(100 * MS).unwrap())
            .seeds(Seeds::from_seed(5))
    };
    // Three attempts, then give up on max attempts.
    let mock = Mock::new(vec![status(503)]);
    let layer = builder().build().unwrap();
    layer.layer(mock).oneshot(get()).await.unwrap();
    // The stop signal.
    let mock = Mock::new(vec![Reply::Status(
        503,
        vec![("x-overloaded", "stop-retrying")],
    )]);
    layer.layer(mock).oneshot(get()).await.unwrap_err();
    // The budget refuses.
    let mock = Mock::new(vec![status(503)]);
    let refusing = builder().budget(Refuse).build().unwrap();
    refusing.layer(mock).oneshot(get()).await.unwrap();
    // A hostile server's hint: given up on at once, no wait recorded (the 900 s wait of
    // issue 12 showed as `backoff_layer_retry_delay_seconds_sum 900`).
    let mock = Mock::new(vec![Reply::Status(
        503,
        vec![("retry-after", "99999999999")],
    )]);
    layer.layer(mock).oneshot(get()).await.unwrap();

    let mut counters: HashMap<String, u64> = HashMap::new();
    let mut delays = Vec::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let mut name = key.name().to_owned();
        for label in key.labels() {
            name.push_str(&format!("{{{}={}}}", label.key(), label.value()));
        }
        match value {
            DebugValue::Counter(n) => {
                counters.insert(name, n);
            }
            DebugValue::Histogram(values) => {
                assert_eq!(name, "backoff_layer_retry_delay_seconds{name=default}");
                delays.extend(values.into_iter().map(|v| v.into_inner()));
            }
            DebugValue::Gauge(_) => panic!("no gauges expected: {name}"),
        }
    }
    let expected: HashMap<String, u64> = [
        ("backoff_layer_requests_total{name=default}", 4),
        ("backoff_layer_attempts_total{name=default}", 6),
        ("backoff_layer_retries_total{name=default}", 2),
        ("backoff_layer_stop_signals_total{name=default}", 1),
        (
            "backoff_layer_gave_up_total{name=default}{reason=max_attempts}",
            1,
        ),
        (
            "backoff_layer_gave_up_total{name=default}{reason=budget}",
            1,
        ),
        (
            "backoff_layer_gave_up_total{name=default}{reason=retry_after_too_long}",
            1,
        ),
        // Every reason's series exists from the first request on, at zero until used.
        (
            "backoff_layer_gave_up_total{name=default}{reason=deadline}",
            0,
        ),
        (
            "backoff_layer_gave_up_total{name=default}{reason=body_not_replayable}",
            0,
        ),
        (
            "backoff_layer_gave_up_total{name=default}{reason=not_retryable}",
            0,
        ),
        // The default budget's own counters: it granted both retries of the first request
        // (the floor allows 10 per window) and refused none.
        (
            "backoff_layer_budget_retries_allowed_total{name=default}",
            2,
        ),
        // The layer's own throttle's counters, registered on the first request too: nothing
        // refused (a destination failing this little is never throttled), every destination
        // tracked.
        ("backoff_layer_throttle_untracked_total{name=default}", 0),
        // Effective and actual outcomes of `http://example.test/`: every request failed
        // (given up on, or the stop signal), and so did every one of their 6 attempts.
        (
            "backoff_layer_request_outcomes_total{name=default}{server_address=example.test}{outcome=failure}",
            4,
        ),
        (
            "backoff_layer_request_outcomes_total{name=default}{server_address=example.test}{outcome=success}",
            0,
        ),
        (
            "backoff_layer_attempt_outcomes_total{name=default}{server_address=example.test}{outcome=failure}",
            6,
        ),
        (
            "backoff_layer_attempt_outcomes_total{name=default}{server_address=example.test}{outcome=success}",
            0,
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v))
    // The refusal counters, one series per level of criticality, all at zero.
    .chain(
        ["sheddable", "sheddable-plus", "critical", "critical-plus"]
            .into_iter()
            .flat_map(|level| {
                [
                    format!(
                        "backoff_layer_budget_retries_refused_total{{name=default}}{{criticality={level}}}"
                    ),
                    format!(
                        "backoff_layer_throttle_refused_total{{name=default}}{{criticality={level}}}"
                    ),
                ]
            })
            .map(|k| (k, 0)),
    )
    .collect();
    assert_eq!(counters, expected);
    assert_eq!(delays, [0.1, 0.1]);
}
