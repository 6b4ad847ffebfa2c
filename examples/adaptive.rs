//! The adaptive limit: overload protection with no rate configured. An axum server whose
//! handler has a real capacity (4 workers, 20 ms a request: 200 requests a second) behind
//! `AdaptiveLimitLayer`, which finds that capacity itself, driven at 2.5 times it for 4 s.
//!
//! Run from the repository's root: `cargo run --example adaptive`. Each second it prints the
//! requests served and rejected (at once, with `503` and `Retry-After`, rather than queued),
//! the limit the layer found, the latency it keeps (unlimited, the queue would grow by 300
//! requests a second) and the answer to a health check, which the limit exempts; then the
//! served rate. It fails if nothing was rejected, the served rate fell under half the
//! capacity, or a health check was refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode, header::RETRY_AFTER, request::Parts};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use ratelimit_layer::{AdaptiveLimitLayer, OverloadProtectionLayer};
use tokio::{net::TcpListener, sync::Semaphore, task::JoinSet, time::Instant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The service's capacity, which nothing below is told: 4 workers, 20 ms a request.
    let workers = Arc::new(Semaphore::new(4));
    let api = get(move || async move {
        let _worker = workers.acquire().await.expect("never closed");
        tokio::time::sleep(Duration::from_millis(20)).await;
        "done"
    });
    let adaptive = AdaptiveLimitLayer::builder()
        .exempt(|parts: &Parts| parts.uri.path() == "/healthz")
        .build()?;
    let app = Router::new()
        .route("/api", api)
        .route("/healthz", get(|| async { "ok" }))
        .layer(OverloadProtectionLayer::new(adaptive.clone()));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    tokio::spawn(async move {
        let app = ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app);
        axum::serve(listener, app).await.expect("the server runs");
    });

    // 500 requests a second (2.5 times the capacity), each on its own, for 4 seconds.
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = |path: &str| Request::get(format!("{base}{path}")).body(Empty::new());
    let counts = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]); // served, rejected
    let mut tick = tokio::time::interval(Duration::from_millis(2));
    let (mut calls, mut total, start) = (JoinSet::new(), [0; 2], Instant::now());
    for second in 1..=4 {
        for _ in 0..500 {
            tick.tick().await;
            let (call, counts) = (client.request(request("/api")?), Arc::clone(&counts));
            calls.spawn(async move {
                let response = call.await.expect("the server answers");
                let (status, headers) = (response.status(), response.headers());
                let rejected = status == 503 && headers.contains_key(RETRY_AFTER);
                assert!(rejected || status == 200, "unexpected answer: {status}");
                counts[usize::from(rejected)].fetch_add(1, Relaxed);
            });
        }
        let [served, rejected] = counts.each_ref().map(|count| count.swap(0, Relaxed));
        let health = client.request(request("/healthz")?).await?.status();
        // The limit in force, and the served requests' median latency (the last window's).
        let status = adaptive.status();
        let latency = status.latency.unwrap_or_default().as_millis();
        println!(
            "{second} s: served {served}, rejected {rejected}, limit {}, latency {latency} ms, \
             /healthz {health}",
            status.limit
        );
        assert_eq!(health, StatusCode::OK, "health checks are never refused");
        total = [total[0] + served, total[1] + rejected];
    }
    while let Some(call) = calls.join_next().await {
        call?;
    }
    let [served, rejected] = counts.each_ref().map(|count| count.load(Relaxed));
    let [served, rejected] = [total[0] + served, total[1] + rejected];
    let per_second = served as f64 / start.elapsed().as_secs_f64();
    println!("served {per_second:.0}/s (capacity 200/s), rejected {rejected} at once");
    assert!(rejected > 0, "the excess is rejected");
    assert!(per_second > 100.0, "served near the capacity");
    Ok(())
}
