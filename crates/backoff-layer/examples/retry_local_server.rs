//! Retries against a local server that is briefly unavailable.
//!
//! Starts a hyper server on 127.0.0.1 (a free port) that answers the first two requests with
//! `503 Service Unavailable` and `Retry-After: 1`, then `200 OK`; sends one request through
//! hyper-util's client wrapped in the retry layer; prints what each side saw; and exits.
//!
//! ```text
//! cargo run -p backoff-layer --example retry_local_server
//! ```

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backoff_layer::backoff::Exponential;
use backoff_layer::{BoxError, RetryInfo, RetryLayer};
use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use overload_signal::protocol::Attempt;
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let served = Arc::new(AtomicUsize::new(0));
    let server = tokio::spawn({
        let served = Arc::clone(&served);
        async move {
            while let Ok((stream, _)) = listener.accept().await {
                let served = Arc::clone(&served);
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let n = served.fetch_add(1, Ordering::Relaxed);
                        println!("server: attempt {}", Attempt::from_request(&req));
                        let response = if n < 2 {
                            Response::builder()
                                .status(StatusCode::SERVICE_UNAVAILABLE)
                                .header(RETRY_AFTER, "1")
                                .body(Full::new(Bytes::from_static(b"busy")))
                        } else {
                            Response::builder().body(Full::new(Bytes::from_static(b"hello")))
                        };
                        async move { Ok::<_, Infallible>(response.expect("valid response")) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        }
    });

    // The article's backoff, but short enough for a demo; a server's Retry-After (1 s) is a
    // lower bound on each wait, so both retries wait about a second.
    let backoff = Exponential::builder()
        .max_delay(Duration::from_secs(5))
        .build()?;
    let client = ServiceBuilder::new()
        .layer(
            RetryLayer::builder()
                .backoff(backoff)
                .attempt_timeout(Duration::from_secs(2))
                .deadline(Duration::from_secs(10))
                .build()?,
        )
        .service(Client::builder(TokioExecutor::new()).build_http());

    let request = Request::get(format!("http://{addr}/api")).body(Full::new(Bytes::new()))?;
    let started = tokio::time::Instant::now();
    let response = client.oneshot(request).await?;
    let info = response.extensions().get::<RetryInfo>().copied();
    let status = response.status();
    let body = response.into_body().collect().await?.to_bytes();
    println!(
        "client: {status} {body:?} after {:.1?}, {info:?}",
        started.elapsed()
    );

    server.abort();
    Ok(())
}
