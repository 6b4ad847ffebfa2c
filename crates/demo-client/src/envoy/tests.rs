use super::*;

#[test]
fn stats_are_parsed_and_histograms_skipped() {
    let text = "cluster.upstream.upstream_rq_retry: 7\n\
                cluster.upstream.upstream_rq_total: 120\n\
                cluster.upstream.upstream_rq_time: P0(nan,1) P25(nan,2)\n\
                http.ingress.downstream_rq_total: 100\n";
    let stats = EnvoyStats::parse(text);
    assert_eq!(stats.retries(), 7);
    assert_eq!(stats.upstream_requests(), 120);
    assert_eq!(stats.downstream_requests(), 100);
    assert_eq!(stats.cluster("upstream_rq_time"), 0);
    assert_eq!(stats.all().len(), 3);
}

/// Issue 34: Envoy's adaptive concurrency filter, gradient controller at p50, before
/// the router (a filter after the router never sees a request).
#[test]
fn adaptive_concurrency_is_the_gradient_controller_at_p50_before_the_router() {
    let settings = ProxySettings {
        adaptive_concurrency: true,
        ..ProxySettings::default()
    };
    let c = config(
        &settings,
        "127.0.0.1:7000".parse().unwrap(),
        "127.0.0.1:7009".parse().unwrap(),
        &["127.0.0.1:7001".parse().unwrap()],
    );
    let expected = "          http_filters:\n\
        \x20         - name: envoy.filters.http.adaptive_concurrency\n\
        \x20           typed_config:\n\
        \x20             \"@type\": type.googleapis.com/envoy.extensions.filters.http.adaptive_concurrency.v3.AdaptiveConcurrency\n\
        \x20             gradient_controller_config:\n\
        \x20               sample_aggregate_percentile: { value: 50 }\n\
        \x20               concurrency_limit_params: { concurrency_update_interval: 0.1s }\n\
        \x20               min_rtt_calc_params: { interval: 60s }\n\
        \x20         - name: envoy.filters.http.router\n";
    assert!(c.contains(expected), "not in:\n{c}");
}

#[test]
fn the_configuration_carries_every_setting() {
    let settings = ProxySettings {
        retry: Some(RetryPolicy::with_rate_limits()),
        health_check: Some(Duration::from_millis(500)),
        upstream_http2: true,
        route_timeout: Duration::from_millis(1500),
        deadline_header: true,
        ..ProxySettings::default()
    };
    let servers = [
        "127.0.0.1:7001".parse().unwrap(),
        "127.0.0.1:7002".parse().unwrap(),
    ];
    let c = config(
        &settings,
        "127.0.0.1:7000".parse().unwrap(),
        "127.0.0.1:7009".parse().unwrap(),
        &servers,
    );
    for needle in [
        "port_value: 7000",
        "port_value: 7009",
        "port_value: 7001",
        "port_value: 7002",
        "include_request_attempt_count: true",
        "timeout: 1.500s",
        "retriable_status_codes: [429, 503]",
        "num_retries: 3",
        "resource-exhausted",
        "previous_hosts",
        "http2_protocol_options",
        "interval: 0.500s",
        "path: /healthz",
        "max_retries: 4294967295",
        "key: x-request-deadline, value: \"t=%START_TIME(%s%3f)%, timeout=1500\"",
        "append_action: ADD_IF_ABSENT",
    ] {
        assert!(c.contains(needle), "{needle} missing from:\n{c}");
    }
    let bare = config(
        &ProxySettings::default(),
        "127.0.0.1:7000".parse().unwrap(),
        "127.0.0.1:7009".parse().unwrap(),
        &servers[..1],
    );
    for absent in [
        "adaptive_concurrency",
        "x-request-deadline",
        "retry_policy",
        "health_checks",
        "http2_protocol_options",
        "7002",
    ] {
        assert!(!bare.contains(absent), "{absent} in:\n{bare}");
    }
}
