//! An axum server behind a rate limit and the overload layer, set up as the README's "Adding
//! the layers" shows, hit by a burst of 100 requests at once.
//!
//! Run from the repository's root: `cargo run --example axum_server`. It prints how many
//! requests were served (`200`) and how many rejected (`429`), and the `Retry-After`,
//! `RateLimit-Policy` and `RateLimit` headers of one rejection. It fails if the limit let the
//! whole burst through.

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 100 requests a second, bursts of 20; the overload layer outside the limit.
    let limit = RateLimitLayer::new(TokenBucket::builder(100).burst(20).build()?);
    let app = Router::new()
        .route("/api", get(|| async { "hello" }))
        .layer(OverloadProtectionLayer::new(limit));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/api", listener.local_addr()?);
    // Served with the peer address in each request: the overload layer tells callers
    // apart by it.
    tokio::spawn(async move {
        let app = ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app);
        axum::serve(listener, app).await.expect("the server runs");
    });

    // 100 requests at once, from a plain hyper-util client (no retries).
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let requests = (0..100).map(|_| {
        let request = Request::get(&url).body(Empty::new());
        client.request(request.expect("a valid request"))
    });
    let (mut served, mut rejected, mut rejection) = (0, 0, None);
    for response in futures_util::future::join_all(requests).await {
        let response = response.map_err(|e| format!("the server did not answer: {e}"))?;
        match response.status() {
            StatusCode::OK => served += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                rejected += 1;
                rejection.get_or_insert(response);
            }
            other => return Err(format!("unexpected status {other}").into()),
        }
    }
    println!("served (200): {served}, rejected (429): {rejected}");

    let rejection = rejection.ok_or("the limit let all 100 requests through")?;
    println!("one rejection's headers:");
    for name in ["Retry-After", "RateLimit-Policy", "RateLimit"] {
        let value = rejection.headers().get(name).ok_or(format!("no {name}"))?;
        println!("  {name}: {}", value.to_str()?);
    }
    // A fresh bucket admits its whole burst; the rest of an instant's burst is rejected.
    assert!(served >= 20, "the burst of 20 is served");
    assert!(rejected > 0, "requests above the limit are rejected");
    Ok(())
}
