//! Finding 2 of issue 30, end to end on 127.0.0.1: a server that is a tower proxy
//! (`OverloadProtectionLayer -> RetryLayer -> hyper-util client`, served by hyper) answers
//! its caller when its retry layer ends with an error, instead of letting the error reach
//! hyper, which resets the caller's connection: the most retryable failure there is.
//!
//! | the upstream | the retry layer returns | the gateway answers |
//! |---|---|---|
//! | `503` with the stop signal | `Err(Overloaded)` | the stop signal: `503`, `X-Overloaded` |
//! | refuses connections (3 attempts) | `Err(GaveUp)` | `502 Bad Gateway` |
//! | answers after the caller's deadline | `Err(GaveUp)`, reason `Deadline` | `504 Gateway Timeout` |
//! | kept refusing connections: the throttle refuses | `Err(Throttled)` | `503` with `Retry-After: 1` |
//!
//! Before the fix every row was a reset connection: the test's client saw an error
//! ("connection closed before message completed") instead of a response.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use backoff_layer::backoff::Fixed;
use backoff_layer::{ReplayBody, RetryLayer};
use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use overload_signal::protocol;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::{TcpListener, TcpSocket};
use tower::{BoxError, ServiceBuilder, ServiceExt};

/// An upstream that answers every request with `status` (and the stop signal if asked)
/// after `delay`; and the count of requests it received.
async fn upstream(
    status: StatusCode,
    stop_signal: bool,
    delay: Duration,
) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let count = Arc::clone(&seen);
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_req: Request<Incoming>| {
                    count.fetch_add(1, Ordering::SeqCst);
                    async move {
                        tokio::time::sleep(delay).await;
                        let mut response =
                            Response::new(Full::new(Bytes::from_static(b"upstream")));
                        *response.status_mut() = status;
                        if stop_signal {
                            response.headers_mut().insert(
                                protocol::X_OVERLOADED,
                                http::HeaderValue::from_static(protocol::STOP_RETRYING),
                            );
                        }
                        Ok::<_, Infallible>(response)
                    }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (addr, seen)
}

/// A port bound but not listening: connections to it are refused, and no other test can
/// take the port while the socket lives.
fn closed_port() -> (SocketAddr, TcpSocket) {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    (socket.local_addr().unwrap(), socket)
}

/// The gateway: every request goes to `upstream` through the retry layer (3 attempts, 10 ms
/// apart, a 300 ms deadline), behind the server stack as the README sets it up in a tower
/// server (a generous global rate, so that nothing here is the limit's doing).
async fn gateway(upstream: SocketAddr) -> SocketAddr {
    let client: Client<HttpConnector, ReplayBody<Incoming>> =
        Client::builder(TokioExecutor::new()).build_http();
    let retry = RetryLayer::builder()
        .backoff(Fixed::every(Duration::from_millis(10)).unwrap())
        .deadline(Duration::from_millis(300))
        .build()
        .unwrap();
    let limit = RateLimitLayer::new(TokenBucket::builder(100_000).build().unwrap());
    let proxy = ServiceBuilder::new()
        .layer(OverloadProtectionLayer::new(limit))
        .map_response(|r: Response<Incoming>| r.map(|b| b.map_err(BoxError::from).boxed()))
        .layer(retry)
        .map_request(move |r: Request<ReplayBody<Incoming>>| {
            let (mut parts, body) = r.into_parts();
            parts.uri = format!("http://{upstream}/").parse().unwrap();
            Request::from_parts(parts, body)
        })
        .service(client);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, peer)) = listener.accept().await else {
                return;
            };
            let proxy = proxy.clone().map_request(move |mut r: Request<Incoming>| {
                r.extensions_mut().insert(peer);
                r
            });
            tokio::spawn(async move {
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), TowerToHyperService::new(proxy))
                    .await;
            });
        }
    });
    addr
}

/// What the test's client gets from the gateway: a response's status and headers, or the
/// error it met instead (a reset connection).
async fn call(gateway: SocketAddr) -> Result<Response<()>, String> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let request = Request::get(format!("http://{gateway}/"))
        .body(Empty::new())
        .unwrap();
    let response = client
        .request(request)
        .await
        .map_err(|e| format!("{e:?}"))?;
    let (parts, body) = response.into_parts();
    let _ = body.collect().await;
    Ok(Response::from_parts(parts, ()))
}

fn retry_after(response: &Response<()>) -> Option<&str> {
    response
        .headers()
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_stop_signal_is_answered_as_the_stop_signal() {
    let (up, seen) = upstream(StatusCode::SERVICE_UNAVAILABLE, true, Duration::ZERO).await;
    let response = call(gateway(up).await)
        .await
        .expect("an answer, not a reset");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(protocol::is_stop_signal(response.headers()));
    assert_eq!(
        seen.load(Ordering::SeqCst),
        1,
        "a stop signal is never retried"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_that_refuses_connections_is_a_bad_gateway() {
    let (closed, _socket) = closed_port();
    let gw = gateway(closed).await;
    let response = call(gw).await.expect("an answer, not a reset");
    assert_eq!(response.status(), StatusCode::BAD_GATEWAY);
    assert!(!protocol::is_stop_signal(response.headers()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_downstream_past_the_deadline_is_a_gateway_timeout() {
    let (up, _) = upstream(StatusCode::OK, false, Duration::from_secs(5)).await;
    let response = call(gateway(up).await)
        .await
        .expect("an answer, not a reset");
    assert_eq!(response.status(), StatusCode::GATEWAY_TIMEOUT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throttled_downstream_is_a_503_with_retry_after() {
    let (closed, _socket) = closed_port();
    let gw = gateway(closed).await;
    // The upstream refuses every connection: after enough failures, the gateway's throttle
    // refuses most calls without sending them.
    let mut statuses = Vec::new();
    for _ in 0..60 {
        let response = call(gw).await.expect("an answer, not a reset");
        statuses.push((response.status(), retry_after(&response).map(str::to_owned)));
        if statuses.len() > 20 && response.status() == StatusCode::SERVICE_UNAVAILABLE {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let throttled = statuses
        .iter()
        .filter(|(status, after)| {
            *status == StatusCode::SERVICE_UNAVAILABLE && after.as_deref() == Some("1")
        })
        .count();
    assert!(throttled >= 1, "{statuses:?}");
    assert!(
        statuses
            .iter()
            .all(|(s, _)| *s == StatusCode::BAD_GATEWAY || *s == StatusCode::SERVICE_UNAVAILABLE),
        "{statuses:?}"
    );
}

/// What passes untouched: the last answer a retry layer gave up on is a response, not an
/// error, and reaches the caller as the upstream sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_answer_given_up_on_passes_as_it_was_sent() {
    let (up, seen) = upstream(StatusCode::SERVICE_UNAVAILABLE, false, Duration::ZERO).await;
    let response = call(gateway(up).await)
        .await
        .expect("an answer, not a reset");
    assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!protocol::is_stop_signal(response.headers()));
    assert_eq!(retry_after(&response), None);
    assert_eq!(
        seen.load(Ordering::SeqCst),
        3,
        "the gateway's three attempts, no more"
    );
}
