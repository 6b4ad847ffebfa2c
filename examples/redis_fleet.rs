//! One limit for a fleet, kept in Redis: two servers (two processes of one service, here in
//! one program) share a limit of 50 requests a second, and together admit about that much,
//! not twice it.
//!
//! Needs a Redis: `REDIS_URL`, by default `redis://127.0.0.1:6379`. Start one with
//! `redis-server --save "" --appendonly no`, then, from the repository's root:
//! `cargo run --example redis_fleet`. It prints what each server admitted of the traffic
//! sent to it, their total, and what one limit and a limit per process would allow. It fails
//! if the two together admitted more than one and a half times the one limit.

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use ratelimit_layer::redis::RedisStore;
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tokio::{net::TcpListener, task::JoinSet, time::Instant};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    // A name of its own for each run, so that a Redis used before holds nothing of it.
    let name = format!("fleet-example-{}", std::process::id());
    let mut servers = Vec::new();
    for _ in 0..2 {
        let store = RedisStore::new(&url)?;
        // Optional: the first request would connect anyway; this says early if Redis is away.
        if let Err(e) = store.ping().await {
            let why = std::error::Error::source(&e).map(ToString::to_string);
            eprintln!("cannot reach Redis at {url}: {}", why.unwrap_or_default());
            eprintln!("start one: redis-server --save \"\" --appendonly no");
            eprintln!("(or set REDIS_URL to the URL of yours)");
            std::process::exit(1);
        }
        // 50 requests a second (bursts of 10) for the fleet; while Redis is away, each of
        // the two processes applies half of it alone.
        let limit = RateLimitLayer::builder(TokenBucket::builder(50).burst(10).build()?)
            .redis(store)
            .name(&name)
            .local_share(0.5)
            .build()?;
        let app = Router::new()
            .route("/api", get(|| async { "hello" }))
            .layer(limit);
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        servers.push(format!("http://{}/api", listener.local_addr()?));
        tokio::spawn(async move { axum::serve(listener, app).await.expect("the server runs") });
    }

    // 100 requests a second to each server for 3 seconds: four times the fleet's limit.
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(10));
    let (start, mut calls) = (Instant::now(), JoinSet::new());
    for _ in 0..300 {
        tick.tick().await;
        for (server, url) in servers.iter().enumerate() {
            let call = client.request(Request::get(url).body(Empty::new())?);
            calls.spawn(async move { (server, call.await.map(|response| response.status())) });
        }
    }
    let mut admitted = [0_u32; 2];
    while let Some(call) = calls.join_next().await {
        let (server, status) = call?;
        match status.map_err(|e| format!("the server did not answer: {e}"))? {
            StatusCode::OK => admitted[server] += 1,
            StatusCode::TOO_MANY_REQUESTS => {}
            other => return Err(format!("unexpected status {other}").into()),
        }
    }
    // A token bucket admits at most its burst and its rate over the time: 10 + 50/s.
    let one_limit = 10.0 + 50.0 * start.elapsed().as_secs_f64();
    let ([a, b], twice) = (admitted, 2.0 * one_limit);
    println!(
        "admitted: server A {a} of 300, server B {b} of 300, together {}",
        a + b
    );
    println!("one limit allows {one_limit:.0}; a limit per process would allow {twice:.0}");
    assert!(a > 0 && b > 0, "each server admits some");
    assert!(f64::from(a + b) <= 1.5 * one_limit, "one limit for both");
    Ok(())
}
