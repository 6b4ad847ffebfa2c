//! hyper-util's `Client` behind `RetryLayer`, every default, against a local axum server:
//! a request answered `503` twice is retried until it gets its `200`, and one answered with
//! the stop signal ends after a single attempt with an `Overloaded` error.
//!
//! ```text
//! cargo run --example hyper_client
//! ```
//!
//! It prints what each request came to:
//!
//! ```text
//! /flaky: 200 OK after 3 attempts; the server saw attempt 2
//! /stop: system overloaded: stop retrying, after 1 attempt
//! ```

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use axum::{Router, body::Body, extract::Request, routing::get};
use backoff_layer::{BoxError, Overloaded, RetryInfo, RetryLayer};
use bytes::Bytes;
use http::StatusCode;
use http_body_util::Empty;
use hyper_util::{client::legacy::Client, rt::TokioExecutor};
use overload_signal::protocol::{Attempt, Protocol, stop_signal_response};
use tower::{ServiceBuilder, ServiceExt};

static LAST_ATTEMPT: AtomicU32 = AtomicU32::new(0); // X-Request-Attempt, as /flaky saw it
static STOP_CALLS: AtomicU32 = AtomicU32::new(0); // attempts /stop received

/// `503` to the first two attempts of each request (`X-Request-Attempt: 0`, `1`), then `200`.
async fn flaky(request: Request) -> StatusCode {
    let attempt = Attempt::from_request(&request).number().unwrap_or(0);
    LAST_ATTEMPT.store(attempt, Relaxed);
    match attempt {
        0 | 1 => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::OK,
    }
}

/// "Stop retrying" (`503`, `X-Overloaded: stop-retrying`, `x-envoy-ratelimited: true`), as
/// a server behind `OverloadProtectionLayer` answers when its callers' retries pile up.
async fn stop() -> http::Response<Body> {
    STOP_CALLS.fetch_add(1, Relaxed);
    stop_signal_response(Protocol::Http)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let app = Router::new()
        .route("/flaky", get(flaky))
        .route("/stop", get(stop));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The client, as the README shows it.
    let client = ServiceBuilder::new()
        .layer(RetryLayer::new())
        .service(Client::builder(TokioExecutor::new()).build_http());

    let request = http::Request::get(format!("http://{addr}/flaky")).body(Empty::<Bytes>::new())?;
    let response = client.clone().oneshot(request).await?;
    let info: &RetryInfo = response.extensions().get().expect("always there");
    let (status, attempts, seen) = (response.status(), info.attempts, LAST_ATTEMPT.load(Relaxed));
    println!("/flaky: {status} after {attempts} attempts; the server saw attempt {seen}");
    let ok = status == StatusCode::OK && attempts == 3 && seen == 2;
    assert!(ok, "two 503s, then the 200: {status} after {attempts}");

    let request = http::Request::get(format!("http://{addr}/stop")).body(Empty::<Bytes>::new())?;
    match client.oneshot(request).await {
        Err(e) if e.is::<Overloaded>() => {
            let calls = STOP_CALLS.load(Relaxed);
            println!("/stop: {e}, after {calls} attempt");
            assert_eq!(calls, 1, "the stop signal is never retried");
        }
        other => panic!("expected the stop signal as an Overloaded error, got {other:?}"),
    }
    Ok(())
}
