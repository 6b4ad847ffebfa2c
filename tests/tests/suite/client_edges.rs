//! The retry client's promises at the edges (issue 12), over the wire: hyper-util's client
//! behind `RetryLayer`, against hyper servers on 127.0.0.1 that misbehave on purpose.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use backoff_layer::backoff::Fixed;
use backoff_layer::{GiveUpReason, ReplayBody, RetryInfo, RetryLayer};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use integration_tests::TestServer;
use overload_signal::propagation;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

type HttpClient = Client<HttpConnector, ReplayBody<ReplayBody<Empty<Bytes>>>>;

/// A server that answers every request with `make()`, and counts them.
async fn server(make: fn() -> Response<Full<Bytes>>) -> (TestServer, Arc<AtomicUsize>) {
    let count = Arc::new(AtomicUsize::new(0));
    let seen = Arc::clone(&count);
    let server = TestServer::start(move |_req: Request<hyper::body::Incoming>| {
        seen.fetch_add(1, Ordering::Relaxed);
        async move { make() }
    })
    .await
    .unwrap();
    (server, count)
}

fn get(server: &TestServer) -> Request<Empty<Bytes>> {
    Request::get(server.url("/api")).body(Empty::new()).unwrap()
}

fn fast() -> RetryLayer {
    RetryLayer::builder()
        .backoff(Fixed::every(Duration::from_millis(10)).unwrap())
        .build()
        .unwrap()
}

fn status(code: u16, headers: &[(&'static str, &'static str)]) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(b"body")));
    *r.status_mut() = StatusCode::from_u16(code).unwrap();
    for (k, v) in headers {
        r.headers_mut().insert(*k, v.parse().unwrap());
    }
    r
}

#[tokio::test]
async fn two_nested_retry_layers_of_three_attempts_send_three_on_the_wire() {
    let (server, count) = server(|| status(503, &[])).await;
    let hyper: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    // A library that retries, called by an application that retries.
    let library = fast().layer(hyper);
    let application = fast().layer(library);
    let response = application.oneshot(get(&server)).await.unwrap();
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(count.load(Ordering::Relaxed), 3);
    assert_eq!(
        response.extensions().get::<RetryInfo>(),
        Some(&RetryInfo {
            attempts: 3,
            gave_up: Some(GiveUpReason::MaxAttempts)
        }),
        "the inner layer's verdict, unchanged"
    );
}

#[tokio::test]
async fn a_hostile_hint_is_given_up_on_at_once() {
    let hostile: [fn() -> Response<Full<Bytes>>; 3] = [
        || status(503, &[("retry-after", "99999999999")]),
        || status(429, &[("retry-after", "Fri, 31 Dec 9999 23:59:59 GMT")]),
        || {
            status(
                200,
                &[
                    ("content-type", "application/grpc"),
                    ("grpc-status", "8"),
                    // A day: the largest pushback is a 32-bit count of milliseconds (gRPC
                    // A6); beyond it, a value means "do not retry" (issue 30, finding 7).
                    ("grpc-retry-pushback-ms", "86400000"),
                ],
            )
        },
    ];
    for make in hostile {
        let (server, count) = server(make).await;
        let client = RetryLayer::new()
            .layer(Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Empty<Bytes>>>());
        let start = Instant::now();
        let response = client.oneshot(get(&server)).await.unwrap();
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "{:?}: waited {:?}",
            make(),
            start.elapsed()
        );
        assert_eq!(count.load(Ordering::Relaxed), 1);
        assert_eq!(
            response.extensions().get::<RetryInfo>(),
            Some(&RetryInfo {
                attempts: 1,
                gave_up: Some(GiveUpReason::RetryAfterTooLong)
            })
        );
    }
}

#[tokio::test]
async fn a_success_carrying_x_overloaded_arrives_whole() {
    let (server, count) = server(|| status(200, &[("x-overloaded", "stop-retrying")])).await;
    let client = RetryLayer::new()
        .layer(Client::builder(TokioExecutor::new()).build_http::<ReplayBody<Empty<Bytes>>>());
    let mut call = std::pin::pin!(propagation::scope(client.oneshot(get(&server))));
    let response = call.as_mut().await.unwrap();
    assert!(!propagation::stop_received(call.as_mut()));
    assert_eq!(response.status(), StatusCode::OK);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "body");
    assert_eq!(count.load(Ordering::Relaxed), 1);
}
