//! `app()` through `oneshot`, in process.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use demo_server::app::{AppConfig, Stack, StatsSnapshot, app};
use demo_server::model::{LatencyModel, Model};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use metrics_exporter_prometheus::PrometheusBuilder;
use overload_signal::OverloadSignalLayer;
use overload_signal::protocol::{Attempt, RATELIMIT, RATELIMIT_POLICY, is_stop_signal};
use ratelimit_layer::config::RateLimitConfig;
use tower::ServiceExt;

/// `GET path` from a client on this host: the peer address the server's connections put in
/// every request (whose counters and deadlines the default trust takes).
fn get(path: &str) -> Request<Body> {
    from_this_host(Request::get(path).body(Body::empty()).unwrap())
}

fn from_this_host(mut request: Request<Body>) -> Request<Body> {
    request
        .extensions_mut()
        .insert(std::net::SocketAddr::from(([127, 0, 0, 1], 40_000)));
    request
}

async fn body_text(response: http::Response<Body>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

fn full_stack(rate: u32, burst: u32) -> Stack {
    Stack::Full {
        overload: OverloadSignalLayer::new(),
        rate_limit: RateLimitConfig {
            rate,
            burst: Some(burst),
            ..RateLimitConfig::default()
        }
        .layer()
        .unwrap()
        .into(),
    }
}

#[tokio::test]
async fn healthz_answers_ok() {
    let router = app(AppConfig::new(Model::new(LatencyModel::Instant)));
    let response = router.oneshot(get("/healthz")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body_text(response).await, "ok\n");
}

#[tokio::test(start_paused = true)]
async fn api_is_served_by_the_model() {
    let model = Model::new(LatencyModel::default());
    let config = AppConfig::new(model.clone());
    let stats = config.stats().clone();
    let router = app(config);
    let started = tokio::time::Instant::now();
    let response = router.oneshot(get("/api")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(started.elapsed(), Duration::from_millis(100));
    assert_eq!(body_text(response).await, "ok\n");
    assert_eq!(model.last_delay(), Duration::from_millis(100));
    assert_eq!(
        stats.snapshot(),
        StatsSnapshot {
            served: 1,
            ..StatsSnapshot::default()
        }
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_are_refused() {
    let router = app(AppConfig::new(Model::new(LatencyModel::Instant)));
    let missing = router.clone().oneshot(get("/nope")).await.unwrap();
    assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    let post = from_this_host(Request::post("/api").body(Body::empty()).unwrap());
    let response = router.clone().oneshot(post).await.unwrap();
    assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
    // Without a metrics handle there is no /metrics route.
    let metrics = router.oneshot(get("/metrics")).await.unwrap();
    assert_eq!(metrics.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(start_paused = true)]
async fn metrics_report_outcomes_and_concurrency() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let model = Model::new(LatencyModel::Instant);
    let router: Router = app(AppConfig::new(model)
        .stack(full_stack(1, 1))
        .metrics(handle));
    assert_eq!(
        router.clone().oneshot(get("/api")).await.unwrap().status(),
        StatusCode::OK
    );
    assert_eq!(
        router.clone().oneshot(get("/api")).await.unwrap().status(),
        StatusCode::TOO_MANY_REQUESTS
    );
    let response = router.oneshot(get("/metrics")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let text = body_text(response).await;
    for line in [
        "demo_server_requests_total{outcome=\"served\"} 1",
        "demo_server_requests_total{outcome=\"rejected\"} 1",
        "demo_server_concurrency 0",
        "demo_server_concurrency_peak 1",
        "demo_server_last_delay_seconds 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
}

#[tokio::test(start_paused = true)]
async fn the_limiter_rejects_with_the_protocols_headers() {
    let config = AppConfig::new(Model::new(LatencyModel::Instant)).stack(full_stack(10, 2));
    let stats = config.stats().clone();
    let router = app(config);
    let mut statuses = Vec::new();
    let mut rejection = None;
    for _ in 0..5 {
        let response = router.clone().oneshot(get("/api")).await.unwrap();
        statuses.push(response.status());
        if response.status() == StatusCode::TOO_MANY_REQUESTS {
            rejection = Some(response);
        }
    }
    // The burst of 2 passes; the rest is rejected before the model runs.
    assert_eq!(&statuses[..2], &[StatusCode::OK; 2]);
    assert!(
        statuses[2..]
            .iter()
            .all(|s| *s == StatusCode::TOO_MANY_REQUESTS)
    );
    let rejection = rejection.unwrap();
    let headers = rejection.headers();
    assert_eq!(headers[http::header::RETRY_AFTER], "1");
    assert_eq!(headers[RATELIMIT_POLICY], "\"default\";q=10;w=1");
    assert!(
        headers[RATELIMIT]
            .to_str()
            .unwrap()
            .starts_with("\"default\";r=0;"),
        "{:?}",
        headers[RATELIMIT]
    );
    assert_eq!(stats.snapshot().served, 2);
    assert_eq!(stats.snapshot().rejected, 3);
}

#[tokio::test(start_paused = true)]
async fn a_retry_storm_turns_rejections_into_the_stop_signal() {
    let config = AppConfig::new(Model::new(LatencyModel::Instant)).stack(full_stack(10, 10));
    let stats = config.stats().clone();
    let router = app(config);
    let mut last = None;
    // Most requests are retries, far above the limit: the fleet is drowning.
    for n in 0..300u32 {
        let mut request = get("/api");
        Attempt::set(request.headers_mut(), n % 4);
        last = Some(router.clone().oneshot(request).await.unwrap());
    }
    let last = last.unwrap();
    assert_eq!(last.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(is_stop_signal(last.headers()));
    assert!(last.headers().get(http::header::RETRY_AFTER).is_none());
    let s = stats.snapshot();
    assert_eq!(s.served, 10);
    assert!(s.stop_signals > 0, "{s}");
    assert_eq!(s.served + s.rejected + s.stop_signals, 300, "{s}");
}

#[test]
fn default_rate_limits_follow_the_models() {
    use demo_server::app::default_rate_limit;
    use demo_server::model::{ArticleModel, MmcModel};
    let article = LatencyModel::Article(ArticleModel::default());
    let (rate, burst) = default_rate_limit(&article);
    // rate x 100 ms + burst stays at the knee.
    assert_eq!(rate / 10 + burst, 30);
    let mmc = LatencyModel::Mmc(MmcModel::builder().seed(1).build().unwrap());
    assert_eq!(default_rate_limit(&mmc), (183, 10));
}

#[tokio::test]
async fn admin_capacity_is_off_by_default_and_changes_the_model_when_on() {
    let model = Model::new(LatencyModel::default());
    let router = app(AppConfig::new(model.clone()));
    let response = router.oneshot(get("/admin/capacity")).await.unwrap();
    assert_eq!(response.status(), StatusCode::NOT_FOUND);

    let router = app(AppConfig::new(model.clone()).admin(true));
    let response = router
        .clone()
        .oneshot(get("/admin/capacity"))
        .await
        .unwrap();
    assert_eq!(body_text(response).await, "30\n");
    let put = |body: &'static str| {
        Request::put("/admin/capacity")
            .body(Body::from(body))
            .unwrap()
    };
    let response = router.clone().oneshot(put("15\n")).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(body_text(response).await, "30 -> 15\n");
    assert_eq!(model.capacity().unwrap().get(), 15);
    for junk in ["0", "-3", "half", ""] {
        let response = router.clone().oneshot(put(junk)).await.unwrap();
        assert_eq!(response.status(), StatusCode::BAD_REQUEST, "{junk:?}");
    }
    assert_eq!(model.capacity().unwrap().get(), 15);

    let instant = app(AppConfig::new(Model::new(LatencyModel::Instant)).admin(true));
    let response = instant.oneshot(put("5")).await.unwrap();
    assert_eq!(response.status(), StatusCode::CONFLICT);
}

#[tokio::test(start_paused = true)]
async fn the_adaptive_stack_rejects_above_its_limit_and_counts_rejections() {
    let adaptive = ratelimit_layer::AdaptiveLimitLayer::new();
    let stack = Stack::Adaptive {
        overload: OverloadSignalLayer::default(),
        adaptive: adaptive.clone(),
    };
    assert_eq!(stack.name(), "adaptive");
    let model = Model::new(LatencyModel::default());
    let config = AppConfig::new(model).stack(stack);
    let stats = config.stats().clone();
    let router = app(config);
    // While the first baseline is measured the limit is the initial one: that many are
    // served, the rest rejected with 503 and Retry-After, at once.
    let limit = ratelimit_layer::AdaptiveLimitLayer::DEFAULT_INITIAL_LIMIT;
    let handles: Vec<_> = (0..limit + 7)
        .map(|_| tokio::spawn(router.clone().oneshot(get("/api"))))
        .collect();
    let mut statuses = Vec::new();
    for h in handles {
        let response = h.await.unwrap().unwrap();
        if response.status() == StatusCode::SERVICE_UNAVAILABLE {
            assert_eq!(response.headers()[http::header::RETRY_AFTER], "1");
            assert!(!is_stop_signal(response.headers()));
        }
        statuses.push(response.status());
    }
    let served = statuses.iter().filter(|s| **s == StatusCode::OK).count();
    assert_eq!(served, limit, "{statuses:?}");
    assert_eq!(
        stats.snapshot(),
        StatsSnapshot {
            served: limit as u64,
            rejected: 7,
            stop_signals: 0,
            expired: 0,
            failed: 0
        }
    );
    assert_eq!(adaptive.status().in_flight, 0);
}

/// A request sent `ago` before now (the system's clock, which the default deadline layer
/// reads) whose caller waits `timeout`.
fn with_deadline(ago: Duration, timeout: Duration) -> Request<Body> {
    let mut request = get("/api");
    overload_signal::protocol::WireDeadline::new(std::time::SystemTime::now() - ago, timeout)
        .set(request.headers_mut());
    request
}

/// `--stack deadline`: the deadline layer alone. A request that queued past its caller's
/// deadline is answered `504` at once and the model never sees it; a live one is served.
#[tokio::test(start_paused = true)]
async fn the_deadline_stack_answers_an_expired_request_at_once_without_the_model() {
    let model = Model::new(LatencyModel::default());
    let config = AppConfig::new(model.clone()).stack(Stack::Deadline);
    let stats = config.stats().clone();
    let router = app(config);
    assert_eq!(Stack::Deadline.name(), "deadline");
    assert!(Stack::Deadline.overload().is_none());

    let started = tokio::time::Instant::now();
    let expired = router
        .clone()
        .oneshot(with_deadline(
            Duration::from_secs(5),
            Duration::from_secs(2),
        ))
        .await
        .unwrap();
    assert_eq!(expired.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(model.take_peak_concurrency(), 0, "the model never saw it");

    let live = router
        .oneshot(with_deadline(Duration::ZERO, Duration::from_secs(2)))
        .await
        .unwrap();
    assert_eq!(live.status(), StatusCode::OK);
    assert_eq!(
        stats.snapshot(),
        StatsSnapshot {
            served: 1,
            expired: 1,
            ..StatsSnapshot::default()
        }
    );
}

/// In `--stack full` the deadline layer sits between the overload layer and the rate limit:
/// an expired request spends no token.
#[tokio::test(start_paused = true)]
async fn in_the_full_stack_an_expired_request_spends_no_token() {
    let model = Model::new(LatencyModel::Instant);
    let router = app(AppConfig::new(model).stack(full_stack(1, 1)));
    for _ in 0..5 {
        let expired = router
            .clone()
            .oneshot(with_deadline(
                Duration::from_secs(5),
                Duration::from_secs(2),
            ))
            .await
            .unwrap();
        assert_eq!(expired.status(), StatusCode::GATEWAY_TIMEOUT);
    }
    let live = router.oneshot(get("/api")).await.unwrap();
    assert_eq!(
        live.status(),
        StatusCode::OK,
        "the bucket's one token is left"
    );
}

/// Issue 33: the handler counts each `/api` request under the level it ran in, the task's
/// current one (here set by `criticality::scope`, as a server layer does), and under
/// `critical`, the default, when none is set. The `X-Request-Criticality` header alone, with
/// no layer to resolve it, is not read by the handler.
#[tokio::test(start_paused = true)]
async fn the_handler_counts_requests_by_the_level_it_ran_in() {
    use overload_signal::criticality;
    use overload_signal::protocol::{Criticality, X_REQUEST_CRITICALITY};

    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    let router: Router = app(AppConfig::new(Model::new(LatencyModel::Instant)).metrics(handle));
    for _ in 0..3 {
        let scoped =
            criticality::scope(Criticality::Sheddable, router.clone().oneshot(get("/api")));
        assert_eq!(scoped.await.unwrap().status(), StatusCode::OK);
    }
    let mut with_header = get("/api");
    with_header.headers_mut().insert(
        X_REQUEST_CRITICALITY,
        Criticality::SheddablePlus.header_value(),
    );
    assert_eq!(
        router.clone().oneshot(with_header).await.unwrap().status(),
        StatusCode::OK
    );
    let text = body_text(router.oneshot(get("/metrics")).await.unwrap()).await;
    for line in [
        "demo_server_handler_criticality_total{criticality=\"sheddable\"} 3",
        "demo_server_handler_criticality_total{criticality=\"sheddable-plus\"} 0",
        "demo_server_handler_criticality_total{criticality=\"critical\"} 1",
        "demo_server_handler_criticality_total{criticality=\"critical-plus\"} 0",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
}
