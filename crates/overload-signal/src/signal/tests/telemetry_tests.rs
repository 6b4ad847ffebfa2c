//! What the layer reports: metrics told apart by the layer's name, registered on the first
//! request, window gauges that fall back when traffic stops, and the stop signal's episodes
//! logged once.

use super::*;
use crate::test_logs::LogCapture;

/// A layer named `name` (if given) with `rule` and the default histogram.
fn named(name: Option<&str>, rule: StopRule) -> OverloadSignalLayer {
    let builder = OverloadSignalLayer::builder()
        .rule(rule)
        .trust(Trust::everyone());
    match name {
        Some(name) => builder.name(name).build().unwrap(),
        None => builder.build().unwrap(),
    }
}

fn label<'a>(labels: &'a [(String, String)], key: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// The value of the metric `metric` whose labels include `name` = `name` and `labels`.
fn value_of<'a>(
    values: &'a [Metric],
    metric: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> &'a DebugValue {
    let found: Vec<_> = values
        .iter()
        .filter(|(n, l, _)| {
            n == metric
                && label(l, "name") == Some(name)
                && labels.iter().all(|(k, v)| label(l, k) == Some(*v))
        })
        .collect();
    assert_eq!(found.len(), 1, "{metric} {name} {labels:?}: {values:?}");
    &found[0].2
}

fn gauge_of(values: &[Metric], metric: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    match value_of(values, metric, name, labels) {
        DebugValue::Gauge(v) => v.into_inner(),
        other => panic!("{metric}: {other:?}"),
    }
}

#[test]
fn names_are_checked_by_build() {
    let err = OverloadSignalLayer::builder().name("").build().unwrap_err();
    assert_eq!(err.field(), "name");
    let err = OverloadSignalLayer::builder()
        .name("caf\u{e9}")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
    assert_eq!(OverloadSignalLayer::new().name().as_str(), "default");
    let layer = OverloadSignalLayer::builder().name("edge").build().unwrap();
    assert_eq!(layer.name().as_str(), "edge");
    let svc = tower::Layer::layer(&layer, answering(|| status(StatusCode::OK)));
    assert_eq!(svc.name().as_str(), "edge");
}

#[tokio::test(start_paused = true)]
async fn two_layers_named_apart_write_two_series() {
    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let public = named(Some("public"), rule(0.1, 10));
    let internal = named(Some("internal"), rule(0.1, 10));
    let mut public_svc = tower::Layer::layer(&public, answering(http_429));
    let mut internal_svc = tower::Layer::layer(&internal, answering(http_429));
    // A storm of retries on the public layer; first tries only on the internal one.
    send(&mut public_svc, 30, &[Some(1)]).await;
    send(&mut internal_svc, 20, &[Some(0)]).await;

    let values = metric_values(&recorder);
    for (metric, labels, _) in &values {
        let name = label(labels, "name");
        assert!(
            name == Some("public") || name == Some("internal"),
            "{metric} {labels:?}"
        );
    }
    let counter = |name, metric| match value_of(
        &values,
        metric,
        name,
        &[("scope", "server"), ("criticality", "critical")],
    ) {
        DebugValue::Counter(n) => *n,
        other => panic!("{other:?}"),
    };
    // The rule needs 10 requests: the first 9 rejections pass, the next 21 stop.
    assert_eq!(counter("public", metric_names::STOP_SIGNALS), 21);
    assert_eq!(counter("public", metric_names::REJECTIONS_PASSED), 9);
    assert_eq!(counter("internal", metric_names::STOP_SIGNALS), 0);
    assert_eq!(counter("internal", metric_names::REJECTIONS_PASSED), 20);
}

#[tokio::test(start_paused = true)]
async fn a_recorder_installed_after_the_layer_is_built_sees_every_metric() {
    let layer = named(None, rule(0.1, 10));
    // The application installs its recorder after building its router.
    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    send(&mut svc, 3, &[Some(0)]).await;

    let values = metric_values(&recorder);
    let mut series: Vec<(String, Vec<(String, String)>)> = values
        .iter()
        .map(|(metric, labels, _)| {
            let mut labels = labels.clone();
            labels.sort();
            (metric.clone(), labels)
        })
        .collect();
    series.sort();
    let with_all = |metric: &str, extra: &[(&str, &str)]| {
        let mut labels = vec![("name".to_owned(), "default".to_owned())];
        labels.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        labels.sort();
        (metric.to_owned(), labels)
    };
    let with = |metric: &str, extra: Option<(&str, &str)>| with_all(metric, extra.as_slice());
    let mut expected = Vec::new();
    for scope in ["server", "caller"] {
        // Per level too (issue 33).
        for level in Criticality::ALL {
            let labels = [("scope", scope), ("criticality", level.as_str())];
            expected.push(with_all(metric_names::STOP_SIGNALS, &labels));
            expected.push(with_all(metric_names::REJECTIONS_PASSED, &labels));
        }
    }
    for via in ["marker", "response"] {
        expected.push(with(metric_names::PROPAGATED, Some(("via", via))));
    }
    for answer in ["stop_signal", "deadline_exceeded", "throttled", "gave_up"] {
        expected.push(with(
            metric_names::ERRORS_ANSWERED,
            Some(("answer", answer)),
        ));
    }
    for class in AttemptClass::ALL {
        expected.push(with(
            metric_names::WINDOW_REQUESTS,
            Some(("attempt", class.label())),
        ));
    }
    for metric in [
        metric_names::UNKEYED_REQUESTS,
        metric_names::WINDOW_RETRY_SHARE,
        metric_names::WINDOW_RETRY_PRESSURE,
        metric_names::WINDOW_PER_CALLER_PRESSURE,
    ] {
        expected.push(with(metric, None));
    }
    expected.sort();
    assert_eq!(series, expected);
}

/// The gauges of a storm of 30 retries in one bucket, from one caller class.
fn assert_storm_gauges(values: &[Metric]) {
    let requests = |attempt| {
        gauge_of(
            values,
            metric_names::WINDOW_REQUESTS,
            "default",
            &[("attempt", attempt)],
        )
    };
    assert_eq!(requests("1").to_bits(), 30.0f64.to_bits());
    assert_eq!(requests("0").to_bits(), 0.0f64.to_bits());
    for metric in [
        metric_names::WINDOW_RETRY_SHARE,
        metric_names::WINDOW_RETRY_PRESSURE,
        metric_names::WINDOW_PER_CALLER_PRESSURE,
    ] {
        assert_eq!(
            gauge_of(values, metric, "default", &[]).to_bits(),
            1.0f64.to_bits(),
            "{metric}"
        );
    }
}

/// Regression: the window gauges were set only by requests, so once traffic stopped they
/// kept the last storm's figures for as long as the silence lasted.
#[tokio::test(start_paused = true)]
async fn window_gauges_fall_to_zero_when_traffic_stops() {
    let recorder = DebuggingRecorder::new();
    let _metrics = metrics::set_default_local_recorder(&recorder);
    let layer = trusting_layer();
    let mut svc = tower::Layer::layer(&layer, answering(|| status(StatusCode::OK)));
    // A storm at 0 s, then nothing.
    send(&mut svc, 30, &[Some(1)]).await;

    // Without a request, each bucket's tick exports the window up to the previous bucket.
    // (A snapshot resets the gauges it reads: the next tick must set them again.)
    tokio::time::sleep(Duration::from_millis(5_500)).await;
    assert_storm_gauges(&metric_values(&recorder));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_storm_gauges(&metric_values(&recorder));

    // The storm's bucket leaves the exported window at 11 s: a window and a bucket after it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let values = metric_values(&recorder);
    for class in AttemptClass::ALL {
        let requests = gauge_of(
            &values,
            metric_names::WINDOW_REQUESTS,
            "default",
            &[("attempt", class.label())],
        );
        assert_eq!(requests.to_bits(), 0.0f64.to_bits(), "{}", class.label());
    }
    for metric in [
        metric_names::WINDOW_RETRY_SHARE,
        metric_names::WINDOW_RETRY_PRESSURE,
        metric_names::WINDOW_PER_CALLER_PRESSURE,
    ] {
        let value = gauge_of(&values, metric, "default", &[]);
        assert_eq!(value.to_bits(), 0.0f64.to_bits(), "{metric}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_storm_of_stop_signals_is_logged_once_when_it_begins_and_once_when_it_ends() {
    let logs = Arc::new(LogCapture::default());
    let _logs = tracing::subscriber::set_default(Arc::clone(&logs));
    let layer = named(Some("edge"), rule(0.1, 10));
    let mut svc = tower::Layer::layer(&layer, answering(http_429));
    let peer = honest_peer(1);

    // A storm of rejected retries for 3 seconds: the rule fires from the 10th request on.
    let mut stops = 0;
    for _ in 0..3 {
        for _ in 0..50 {
            let r = one(&mut svc, from_peer(Some(1), peer)).await;
            stops += u32::from(protocol::is_stop_signal(r.headers()));
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    assert_eq!(stops, 141);
    let engaged = logs.with_message("stop signal engaged");
    assert_eq!(engaged.len(), 1, "{engaged:?}");
    assert_eq!(engaged[0].level, tracing::Level::WARN);
    assert_eq!(engaged[0].field("name"), Some("edge"));
    assert_eq!(engaged[0].field("scope"), Some("server"));
    assert_eq!(engaged[0].field("retry_share"), Some("1.0"));
    assert_eq!(engaged[0].field("requests"), Some("10"));
    assert_eq!(engaged[0].field("threshold"), Some("0.1"));
    assert!(logs.with_message("stop signal disengaged").is_empty());

    // The last stop signal was at 2 s: quiet for a window (10 s) at 12 s, seen by the tick
    // after it.
    tokio::time::sleep(Duration::from_millis(8_500)).await;
    assert!(logs.with_message("stop signal disengaged").is_empty());
    tokio::time::sleep(Duration::from_secs(2)).await;
    let disengaged = logs.with_message("stop signal disengaged");
    assert_eq!(disengaged.len(), 1, "{disengaged:?}");
    assert_eq!(disengaged[0].level, tracing::Level::INFO);
    assert_eq!(disengaged[0].field("name"), Some("edge"));
    assert_eq!(disengaged[0].field("lasted"), Some("2s"));
    // Nothing more while it stays quiet; a new storm is a new episode.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(logs.with_message("stop signal engaged").len(), 1);
    assert_eq!(logs.with_message("stop signal disengaged").len(), 1);
    for _ in 0..20 {
        one(&mut svc, from_peer(Some(1), peer)).await;
    }
    assert_eq!(logs.with_message("stop signal engaged").len(), 2);
}
