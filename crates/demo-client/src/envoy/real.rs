use super::*;
use bytes::Bytes;
use http::Request;
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Issue 34: with the adaptive concurrency filter, Envoy starts (the configuration is
/// valid for Envoy 1.40), serves through it, and the gradient controller's statistics
/// are there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_serves_through_its_adaptive_concurrency_filter() {
    use demo_server::app::{AppConfig, app};
    use demo_server::model::{LatencyModel, Model};

    let envoy = find_envoy(None).expect("envoy");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server_addr = listener.local_addr().unwrap();
    let router = app(AppConfig::new(Model::new(LatencyModel::Instant)));
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let dir =
        std::env::temp_dir().join(format!("demo-client-envoy-adaptive-{}", std::process::id()));
    let settings = ProxySettings {
        adaptive_concurrency: true,
        ..ProxySettings::default()
    };
    let proxy = EnvoyProxy::start(&envoy, &dir, &settings, &[server_addr])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    for _ in 0..20 {
        let url: Uri = format!("http://{}/api", proxy.addr()).parse().unwrap();
        let response = client
            .request(Request::get(url).body(Empty::new()).unwrap())
            .await
            .unwrap();
        // One request at a time never reaches the limit (at least 3).
        assert_eq!(response.status(), http::StatusCode::OK);
    }
    let stats = proxy.stats().await.unwrap();
    assert_eq!(stats.downstream_requests(), 20);
    let limit = "http.ingress.adaptive_concurrency.gradient_controller.concurrency_limit";
    assert!(
        stats.all().contains_key(limit),
        "no {limit} in Envoy's statistics: {:?}",
        stats.all().keys().collect::<Vec<_>>()
    );
    assert!(stats.get(limit) >= 1);
    proxy.shutdown().await.unwrap();
    server.abort();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server that refuses every connection: Envoy's `connect-failure` retries show on
/// its counters, one request at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn envoy_starts_retries_a_refused_connection_and_counts_it() {
    let envoy = find_envoy(None).expect("envoy");
    let dead = free_port().unwrap();
    let dir = std::env::temp_dir().join(format!("demo-client-envoy-{}", std::process::id()));
    let settings = ProxySettings {
        retry: Some(RetryPolicy::istio_default()),
        ..ProxySettings::default()
    };
    let proxy = EnvoyProxy::start(&envoy, &dir, &settings, &[dead])
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    for _ in 0..3 {
        let url: Uri = format!("http://{}/api", proxy.addr()).parse().unwrap();
        let response = client
            .request(Request::get(url).body(Empty::new()).unwrap())
            .await
            .unwrap();
        assert_eq!(response.status(), http::StatusCode::SERVICE_UNAVAILABLE);
    }
    let stats = proxy.stats().await.unwrap();
    assert_eq!(stats.downstream_requests(), 3, "{:?}", stats.all().len());
    // Istio's policy: 2 retries, so 3 attempts per request.
    assert_eq!(stats.retries(), 6);
    // NOTE: a refused connection is never a request: `upstream_rq_total` stays at 0.
    assert_eq!(stats.cluster("upstream_cx_connect_fail"), 9);
    assert_eq!(stats.upstream_requests(), 0);
    proxy.shutdown().await.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
