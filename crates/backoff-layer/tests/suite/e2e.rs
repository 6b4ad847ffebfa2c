//! End to end: the retry layer around hyper-util's legacy client, against a real hyper server
//! on 127.0.0.1.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backoff_layer::backoff::{Fixed, Seeds};
use backoff_layer::{GaveUp, GiveUpReason, ReplayBody, RetryInfo, RetryLayer};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use overload_signal::Overloaded;
use overload_signal::protocol::{self, Attempt, IDEMPOTENCY_KEY, Protocol};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::{ServiceBuilder, ServiceExt};

/// What the server saw: the attempt counter and the body of each request.
type Log = Arc<Mutex<Vec<(Attempt, Bytes)>>>;

/// A server that answers the first `failures` requests with `failure`, then `200 ok`.
async fn server(
    failures: usize,
    failure: fn() -> Response<Full<Bytes>>,
) -> (SocketAddr, Log, JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let log: Log = Arc::default();
    let seen = Arc::clone(&log);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let seen = Arc::clone(&seen);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    let seen = Arc::clone(&seen);
                    async move {
                        let attempt = Attempt::from_request(&req);
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        let n = {
                            let mut seen = seen.lock().unwrap();
                            seen.push((attempt, body));
                            seen.len()
                        };
                        let response = if n <= failures {
                            failure()
                        } else {
                            Response::new(Full::new(Bytes::from_static(b"ok")))
                        };
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, log, task)
}

fn unavailable() -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(b"busy")));
    *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
    r
}

fn stop() -> Response<Full<Bytes>> {
    protocol::stop_signal_response(Protocol::Http)
}

fn client() -> Client<HttpConnector, ReplayBody<Full<Bytes>>> {
    Client::builder(TokioExecutor::new()).build_http()
}

fn layer() -> RetryLayer {
    RetryLayer::builder()
        .backoff(Fixed::every(Duration::from_millis(10)).unwrap())
        .seeds(Seeds::from_seed(3))
        .attempt_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
}

#[tokio::test]
async fn fails_twice_then_succeeds() {
    let (addr, log, task) = server(2, unavailable).await;
    let svc = ServiceBuilder::new().layer(layer()).service(client());
    let request = Request::get(format!("http://{addr}/api"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        response.extensions().get::<RetryInfo>(),
        Some(&RetryInfo {
            attempts: 3,
            gave_up: None
        })
    );
    let body = response.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, "ok");
    let attempts: Vec<Attempt> = log.lock().unwrap().iter().map(|(a, _)| *a).collect();
    assert_eq!(
        attempts,
        [Attempt::Number(0), Attempt::Number(1), Attempt::Number(2)]
    );
    task.abort();
}

#[tokio::test]
async fn a_body_is_replayed_over_the_wire_byte_for_byte() {
    let (addr, log, task) = server(2, unavailable).await;
    let svc = ServiceBuilder::new().layer(layer()).service(client());
    let payload: Bytes = (0..40_000u32)
        .map(|i| (i % 253) as u8)
        .collect::<Vec<_>>()
        .into();
    let request = Request::post(format!("http://{addr}/api"))
        .header(IDEMPOTENCY_KEY, "order-17")
        .body(Full::new(payload.clone()))
        .unwrap();
    let response = svc.oneshot(request).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let log = log.lock().unwrap();
    assert_eq!(log.len(), 3);
    for (attempt, body) in log.iter() {
        assert_eq!(body, &payload, "attempt {attempt}");
    }
    task.abort();
}

#[tokio::test]
async fn the_stop_signal_ends_the_request_after_one_attempt() {
    let (addr, log, task) = server(usize::MAX, stop).await;
    let svc = ServiceBuilder::new().layer(layer()).service(client());
    let request = Request::get(format!("http://{addr}/api"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let err = svc.oneshot(request).await.unwrap_err();
    assert!(err.is::<Overloaded>(), "{err:?}");
    assert_eq!(log.lock().unwrap().len(), 1);
    task.abort();
}

#[tokio::test]
async fn connection_refused_is_retried_then_given_up_with_the_cause() {
    // A port that was just free: nothing listens there.
    let addr = {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        l.local_addr().unwrap()
    };
    let svc = ServiceBuilder::new().layer(layer()).service(client());
    let request = Request::get(format!("http://{addr}/api"))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let err = svc.oneshot(request).await.unwrap_err();
    let gave_up = err
        .downcast_ref::<GaveUp>()
        .unwrap_or_else(|| panic!("expected GaveUp, got {err:?}"));
    assert_eq!(gave_up.reason(), GiveUpReason::MaxAttempts);
    assert_eq!(gave_up.attempts(), 3);
    assert!(backoff_layer::classify::is_connect_error(&*err));
}
