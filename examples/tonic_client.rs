//! A generated tonic client (`tonic-health`'s) over a `Channel` behind
//! `RetryLayer::new().for_tonic()`, every default, against a local tonic health server that
//! answers `UNAVAILABLE` to its first two calls, then serves, then says "stop retrying".
//!
//! ```text
//! cargo run --example tonic_client
//! ```
//!
//! It prints what each call came to:
//!
//! ```text
//! check: SERVING after 3 attempts; the server saw attempt 2
//! check: Unavailable "overloaded" (the stop signal: true) after 1 attempt
//! ```

use std::sync::atomic::{AtomicU32, Ordering::Relaxed};

use backoff_layer::adapter::Tonic;
use backoff_layer::{BoxError, Retry, RetryInfo, RetryLayer, is_overloaded};
use overload_signal::protocol::{Attempt, STOP_RETRYING, X_OVERLOADED};
use tonic::metadata::MetadataMap;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Server, server::TcpIncoming};
use tonic::{Code, Request, Status};
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};
use tower::ServiceBuilder;

static CALLS: AtomicU32 = AtomicU32::new(0); // calls the server received
static LAST_ATTEMPT: AtomicU32 = AtomicU32::new(0); // X-Request-Attempt, as the server saw it

/// In front of the health service: `UNAVAILABLE` to the first two calls, then the service's
/// answer, then the stop signal (`UNAVAILABLE` with `x-overloaded: stop-retrying`).
fn script(request: Request<()>) -> Result<Request<()>, Status> {
    let attempt = Attempt::from_headers(&request.metadata().clone().into_headers());
    LAST_ATTEMPT.store(attempt.number().unwrap_or(0), Relaxed);
    match CALLS.fetch_add(1, Relaxed) {
        0 | 1 => Err(Status::unavailable("warming up")),
        2 => Ok(request),
        _ => {
            let mut headers = http::HeaderMap::new();
            headers.insert(X_OVERLOADED, http::HeaderValue::from_static(STOP_RETRYING));
            let stop = MetadataMap::from_headers(headers);
            Err(Status::with_metadata(Code::Unavailable, "overloaded", stop))
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let (_reporter, health) = tonic_health::server::health_reporter();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server = Server::builder().add_service(InterceptedService::new(health, script));
    tokio::spawn(server.serve_with_incoming(TcpIncoming::from(listener)));

    // The client, as the README shows it.
    let uri = format!("http://{addr}");
    let channel = Channel::from_shared(uri)?.connect().await?;
    let mut client: HealthClient<Retry<Channel, Tonic>> = HealthClient::new(
        ServiceBuilder::new()
            .layer(RetryLayer::new().for_tonic())
            .service(channel),
    );

    let response = client.check(HealthCheckRequest::default()).await?;
    let info: &RetryInfo = response.extensions().get().expect("always there");
    let (serving, attempts) = (response.get_ref().status().as_str_name(), info.attempts);
    let seen = LAST_ATTEMPT.load(Relaxed);
    println!("check: {serving} after {attempts} attempts; the server saw attempt {seen}");
    let ok = serving == "SERVING" && attempts == 3 && seen == 2;
    assert!(ok, "two UNAVAILABLEs retried, then served");

    let Err(status) = client.check(HealthCheckRequest::default()).await else {
        panic!("expected the stop signal");
    };
    let (code, message) = (status.code(), status.message());
    let (stop, attempts) = (is_overloaded(&status), Tonic::attempts(&status));
    println!("check: {code:?} {message:?} (the stop signal: {stop}) after {attempts} attempt");
    assert!(stop && attempts == 1, "never retried: {status:?}");
    assert_eq!(CALLS.load(Relaxed), 4, "3 attempts, then 1");
    Ok(())
}
