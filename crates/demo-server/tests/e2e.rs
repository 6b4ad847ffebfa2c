//! `app()` on real sockets on 127.0.0.1, port 0.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use axum::Router;
use bytes::Bytes;
use demo_server::app::{AppConfig, Stack, app};
use demo_server::downstream::Downstream;
use demo_server::model::{ArticleModel, LatencyModel, Model};
use demo_server::server::{Abandoned, Server, ServerConfig};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use metrics_exporter_prometheus::PrometheusBuilder;
use overload_signal::OverloadSignalLayer;
use overload_signal::protocol::{
    self, Protocol, RATELIMIT, RATELIMIT_POLICY, RateLimitStatus, is_stop_signal, parse_retry_after,
};
use ratelimit_layer::config::RateLimitConfig;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// Serves `router` on 127.0.0.1, port 0, on the test's runtime, with the server's defaults.
async fn serve(router: Router) -> SocketAddr {
    serve_with(router, ServerConfig::new()).await
}

/// Serves `router` under `config` on 127.0.0.1, port 0.
async fn serve_with(router: Router, config: ServerConfig) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = Server::new(listener, router, config);
    tokio::spawn(server.run(std::future::pending()));
    addr
}

fn abandoned(abandoned: Abandoned) -> ServerConfig {
    ServerConfig::builder()
        .abandoned(abandoned)
        .build()
        .unwrap()
}

/// Waits (at most 10 s, so a broken server fails the test instead of hanging it) until
/// `done` holds.
async fn eventually(mut done: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tokio::time::Instant::now() < deadline {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    done()
}

#[tokio::test]
async fn a_burst_above_the_limit_gets_429s_with_headers_and_metrics_count_them() {
    let recorder = PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    // NOTE: a current-thread runtime runs the server on this thread, so the thread-local
    // recorder sees everything the server records.
    let _local = metrics::set_default_local_recorder(&recorder);
    let stack = Stack::Full {
        overload: OverloadSignalLayer::new(),
        rate_limit: RateLimitConfig {
            rate: 5,
            burst: Some(5),
            ..RateLimitConfig::default()
        }
        .layer()
        .unwrap()
        .into(),
    };
    let config = AppConfig::new(Model::new(LatencyModel::Instant))
        .stack(stack)
        .metrics(handle);
    let stats = config.stats().clone();
    let addr = serve(app(config)).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();

    let burst = 40;
    let calls = (0..burst).map(|_| {
        let client = client.clone();
        async move {
            let request = Request::get(format!("http://{addr}/api"))
                .body(Full::default())
                .unwrap();
            client.request(request).await.unwrap()
        }
    });
    let responses = futures_join_all(calls).await;
    let ok = responses
        .iter()
        .filter(|r| r.status() == StatusCode::OK)
        .count();
    let rejected: Vec<_> = responses
        .iter()
        .filter(|r| r.status() == StatusCode::TOO_MANY_REQUESTS)
        .collect();
    // The burst of 5, plus at most a few tokens refilled at 5/s while the burst is sent.
    assert!((5..=10).contains(&ok), "{ok} served");
    assert_eq!(ok + rejected.len(), burst, "every response is 200 or 429");
    for r in &rejected {
        let h = r.headers();
        let retry_after = parse_retry_after(&h[http::header::RETRY_AFTER], SystemTime::now())
            .expect("Retry-After in whole seconds");
        assert!(retry_after >= Duration::from_secs(1), "{retry_after:?}");
        assert_eq!(h[RATELIMIT_POLICY], "\"default\";q=5;w=1");
        let status = RateLimitStatus::parse(&h[RATELIMIT]).expect("a RateLimit field");
        assert_eq!((status.name(), status.remaining()), ("default", 0));
        assert!(!is_stop_signal(h), "first tries never get the stop signal");
    }

    let s = stats.snapshot();
    assert_eq!((s.served, s.rejected), (ok as u64, rejected.len() as u64));
    let metrics = client
        .request(
            Request::get(format!("http://{addr}/metrics"))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(metrics.status(), StatusCode::OK);
    let text = String::from_utf8(
        metrics
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    let served_line = format!("demo_server_requests_total{{outcome=\"served\"}} {ok}");
    let rejected_line = format!(
        "demo_server_requests_total{{outcome=\"rejected\"}} {}",
        rejected.len()
    );
    for line in [served_line.as_str(), rejected_line.as_str()] {
        assert!(text.lines().any(|l| l == line), "{line} missing in\n{text}");
    }
    // The limiter's own metric agrees (summed over its key classes).
    let limiter: u64 = text
        .lines()
        .filter(|l| l.starts_with("ratelimit_layer_requests_rejected_total{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(limiter, rejected.len() as u64, "{text}");
}

/// `futures::future::join_all` without the dependency: spawn each and await in order.
async fn futures_join_all<F>(calls: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = calls.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test]
async fn with_abandoned_cancel_a_client_that_goes_away_stops_counting() {
    // A request would take a minute: only the closed connection can end it early.
    let slow = ArticleModel::builder()
        .base(Duration::from_secs(60))
        .max_delay(Duration::from_secs(60))
        .build()
        .unwrap();
    let model = Model::new(slow.into());
    let addr = serve_with(
        app(AppConfig::new(model.clone())),
        abandoned(Abandoned::Cancel),
    )
    .await;

    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /api HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    assert!(eventually(|| model.concurrency() == 1).await);
    drop(stream);
    // hyper sees the end of the stream and drops the handler's future; its guard leaves.
    assert!(
        eventually(|| model.concurrency() == 0).await,
        "the abandoned request still counts"
    );
}

#[tokio::test]
async fn with_abandoned_serve_a_client_that_goes_away_still_counts() {
    let slow = ArticleModel::builder()
        .base(Duration::from_secs(60))
        .max_delay(Duration::from_secs(60))
        .build()
        .unwrap();
    let model = Model::new(slow.into());
    let addr = serve_with(
        app(AppConfig::new(model.clone())),
        abandoned(Abandoned::Serve),
    )
    .await;

    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /api HTTP/1.1\r\nhost: test\r\n\r\n")
        .await
        .unwrap();
    assert!(eventually(|| model.concurrency() == 1).await);
    drop(stream);
    // The cancelling server lets go within milliseconds (the test above); this one keeps the
    // request for the model's full minute.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        model.concurrency(),
        1,
        "the abandoned request is still served"
    );
}

#[tokio::test]
async fn a_downstream_stop_signal_reaches_the_caller_without_retries() {
    // The bottom tier: always overloaded, always says stop.
    let hits = Arc::new(AtomicUsize::new(0));
    let bottom = Router::new().route(
        "/api",
        axum::routing::get({
            let hits = Arc::clone(&hits);
            move || {
                hits.fetch_add(1, Ordering::Relaxed);
                async { protocol::stop_signal_response::<axum::body::Body>(Protocol::Http) }
            }
        }),
    );
    let bottom = serve(bottom).await;
    let downstream = || Downstream::new(format!("http://{bottom}/api").parse().unwrap()).unwrap();

    // A middle tier with the full stack, and one without: both answer with the stop signal.
    let full = Stack::Full {
        overload: OverloadSignalLayer::new(),
        rate_limit: RateLimitConfig::default().layer().unwrap().into(),
    };
    for stack in [full, Stack::None] {
        let config = AppConfig::new(Model::new(LatencyModel::Instant))
            .stack(stack)
            .downstream(downstream());
        let stats = config.stats().clone();
        let middle = serve(app(config)).await;
        let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
        let before = hits.load(Ordering::Relaxed);
        let response = client
            .request(
                Request::get(format!("http://{middle}/api"))
                    .body(Full::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(is_stop_signal(response.headers()));
        assert_eq!(
            hits.load(Ordering::Relaxed) - before,
            1,
            "no retry after stop"
        );
        assert_eq!(stats.snapshot().stop_signals, 1);
    }
}

#[tokio::test]
async fn a_healthy_downstream_chain_answers_ok() {
    let bottom = serve(app(AppConfig::new(Model::new(LatencyModel::Instant)))).await;
    let config = AppConfig::new(Model::new(LatencyModel::Instant))
        .downstream(Downstream::new(format!("http://{bottom}/api").parse().unwrap()).unwrap());
    let middle = serve(app(config)).await;
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let response = client
        .request(
            Request::get(format!("http://{middle}/api"))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // A downstream that is not there: 502 after the retries the budget allows.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let config = AppConfig::new(Model::new(LatencyModel::Instant))
        .downstream(Downstream::new(format!("http://{closed}/api").parse().unwrap()).unwrap());
    let lonely = serve(app(config)).await;
    let response = client
        .request(
            Request::get(format!("http://{lonely}/api"))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
}
