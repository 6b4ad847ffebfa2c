//! A reqwest client with `backoff-layer`'s `RetryMiddleware`, every default, against a
//! local axum server: a request answered `503` with `Retry-After: 1` is retried after at
//! least that second and succeeds, and one answered with the stop signal ends after a
//! single attempt with an error that `backoff_layer::is_overloaded` recognises.
//!
//! ```text
//! cargo run --example reqwest_client
//! ```
//!
//! It prints what each request came to:
//!
//! ```text
//! /busy: 200 OK "hello" after 2 attempts, in 1.0s (Retry-After: 1)
//! /stop: system overloaded: stop retrying (is_overloaded: true) after 1 attempt
//! ```

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use axum::{Router, extract::Request, http::StatusCode, routing::get};
use backoff_layer::reqwest::RetryMiddleware;
use backoff_layer::{BoxError, RetryInfo, is_overloaded};
use overload_signal::protocol::{Attempt, Protocol, stop_signal_response};
use tokio::time::Instant;

static STOP_CALLS: AtomicU32 = AtomicU32::new(0); // attempts /stop received

/// `503` with `Retry-After: 1` to each request's first attempt, `200` to a retry.
async fn busy(request: Request) -> Response {
    if Attempt::from_request(&request).is_retry() {
        return "hello".into_response();
    }
    let retry_after = [(http::header::RETRY_AFTER, "1")];
    (StatusCode::SERVICE_UNAVAILABLE, retry_after).into_response()
}

/// "Stop retrying" (`503`, `X-Overloaded: stop-retrying`, `x-envoy-ratelimited: true`), as
/// a server behind `OverloadProtectionLayer` answers when its callers' retries pile up.
async fn stop() -> Response {
    STOP_CALLS.fetch_add(1, Relaxed);
    stop_signal_response(Protocol::Http)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let app = Router::new()
        .route("/busy", get(busy))
        .route("/stop", get(stop));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // The client, as the README shows it.
    let client = reqwest_middleware::ClientBuilder::new(reqwest::Client::new())
        .with(RetryMiddleware::new())
        .build();

    let started = Instant::now();
    let response = client.get(format!("http://{addr}/busy")).send().await?;
    let info: &RetryInfo = response.extensions().get().expect("always there");
    let (status, attempts, took) = (response.status(), info.attempts, started.elapsed());
    let text = response.text().await?;
    println!("/busy: {status} {text:?} after {attempts} attempts, in {took:.1?} (Retry-After: 1)");
    assert!(status == 200 && attempts == 2, "the 503 retried once");
    assert!(took >= Duration::from_secs(1), "Retry-After waited for");

    let Err(err) = client.get(format!("http://{addr}/stop")).send().await else {
        panic!("expected the stop signal");
    };
    let (stop, calls) = (is_overloaded(&err), STOP_CALLS.load(Relaxed));
    println!("/stop: {err} (is_overloaded: {stop}) after {calls} attempt");
    assert!(stop && calls == 1, "never retried: {err:?}");
    Ok(())
}
