//! The stack the README shows, exactly as it is written there, on 127.0.0.1: an axum server
//! with the overload layer outside the rate limiter (one `OverloadProtectionLayer`), served
//! with the peer address, and a hyper-util client behind the retry layer with every default.
//! If this test has to change, so does the README.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use axum::Router;
use axum::extract::Request as AxumRequest;
use axum::routing::get;
use backoff_layer::{RetryInfo, RetryLayer};
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use overload_signal::Overloaded;
use overload_signal::protocol::Attempt;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tower::{ServiceBuilder, ServiceExt};

#[tokio::test]
async fn readme_stack_rejects_then_the_client_retries_after_retry_after() {
    // The highest attempt counter the handler saw.
    let max_attempt = Arc::new(AtomicU32::new(0));
    let seen = Arc::clone(&max_attempt);
    let handler = move |request: AxumRequest| async move {
        if let Some(n) = Attempt::from_request(&request).number() {
            seen.fetch_max(n, Ordering::Relaxed);
        }
        "hello"
    };

    // Server (README): the overload layer outside the rate limiter, as one layer. One request
    // per second, bursts of 2, so the third request in a row is rejected.
    let limit = RateLimitLayer::new(TokenBucket::builder(1).burst(2).build().unwrap());
    let protection = OverloadProtectionLayer::new(limit);
    let histogram = protection.signal().histogram().clone();
    let app = Router::new().route("/api", get(handler)).layer(protection);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    // With the peer address, so that the overload layer tells callers apart.
    let server = tokio::spawn(async move {
        axum::serve(
            listener,
            ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app),
        )
        .await
    });

    // Client (README): hyper-util behind the retry layer, every default.
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new())
        .service(Client::builder(TokioExecutor::new()).build_http());

    let mut attempts = Vec::new();
    for _ in 0..3 {
        let request = Request::get(&url).body(Empty::<Bytes>::new()).unwrap();
        match client.clone().oneshot(request).await {
            Ok(response) => {
                assert_eq!(response.status(), StatusCode::OK);
                let info = response.extensions().get::<RetryInfo>().unwrap();
                assert_eq!(info.gave_up, None);
                attempts.push(info.attempts);
            }
            Err(e) if e.is::<Overloaded>() => panic!("no storm here, so no stop signal"),
            Err(e) => panic!("request failed: {e}"),
        }
    }
    // The burst admits two; the third is rejected with `Retry-After: 1`, and the client
    // waits at least that long before its retry, which the bucket then admits.
    assert_eq!(attempts, [1, 1, 2]);
    assert_eq!(max_attempt.load(Ordering::Relaxed), 1);
    // The overload layer, outside, saw all four requests, the rejected one too.
    assert_eq!(histogram.snapshot().total(), 4);
    assert_eq!(histogram.snapshot().retries(), 1);
    server.abort();
}
