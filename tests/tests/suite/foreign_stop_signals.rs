//! Finding 7 of issue 31, end to end on 127.0.0.1: a third-party API that adds the stop
//! signal to its `503` (`X-Overloaded`, or gRPC's `grpc-retry-pushback-ms: -1`) must not make
//! our server tell its own callers to stop, unless we say we trust it to.
//!
//! Our server is the README's setup, `OverloadProtectionLayer` around a rate limit (generous:
//! nothing here is the limit's doing), in axum and in tonic; its handler calls the third
//! party through a `RetryLayer` client and passes what it gets back **verbatim** (the
//! response, or the tonic `Status`), as a gateway does.
//!
//! | the retry layer's `stop_signals` | the third party is retried | our callers get |
//! |---|---|---|
//! | `PassUp` (the default) | never | the stop signal (the mark, and the signal in what is passed back) |
//! | `HonourOnly` | never | a plain `503` / `UNAVAILABLE`, without the stop signal |
//!
//! Before the fix there was no switch: every run was the first row, whatever the server
//! trusted (10 calls of 10 answered with the stop signal).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use axum::Router;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use backoff_layer::adapter::Tonic;
use backoff_layer::{ReplayBody, Retry, RetryLayer, StopSignals};
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use overload_signal::protocol;
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;
use tonic::Code;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::{Layer, ServiceExt};

/// Calls our callers make in each run.
const CALLS: usize = 10;

/// The third party: answers every request with the stop signal, in HTTP (`503`,
/// `X-Overloaded`) or, to a gRPC request, trailers-only `UNAVAILABLE` with
/// `grpc-retry-pushback-ms: -1` and `x-overloaded`; counts what it receives.
async fn third_party() -> (SocketAddr, Arc<AtomicUsize>) {
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
                let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                    count.fetch_add(1, Ordering::SeqCst);
                    let grpc = protocol::Protocol::of_request(&req).is_grpc();
                    async move {
                        let mut response = Response::new(Full::new(Bytes::new()));
                        let headers = response.headers_mut();
                        headers.insert(
                            protocol::X_OVERLOADED,
                            HeaderValue::from_static(protocol::STOP_RETRYING),
                        );
                        if grpc {
                            headers.insert(
                                "content-type",
                                HeaderValue::from_static("application/grpc"),
                            );
                            headers.insert("grpc-status", HeaderValue::from_static("14"));
                            headers.insert("grpc-message", HeaderValue::from_static("busy"));
                            headers
                                .insert("grpc-retry-pushback-ms", HeaderValue::from_static("-1"));
                        } else {
                            *response.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
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

/// The retry layer our server calls the third party with: the defaults (3 attempts, the
/// default budget and throttle), and the switch.
fn retry(stop_signals: StopSignals) -> RetryLayer {
    RetryLayer::builder()
        .stop_signals(stop_signals)
        .build()
        .unwrap()
}

/// The README's server stack: the overload layer around a (generous) rate limit.
fn protection() -> OverloadProtectionLayer<RateLimitLayer> {
    OverloadProtectionLayer::new(RateLimitLayer::new(
        TokenBucket::builder(100_000).build().unwrap(),
    ))
}

type HttpClient = Retry<Client<HttpConnector, ReplayBody<Empty<Bytes>>>>;

#[derive(Clone)]
struct Gateway {
    client: HttpClient,
    url: String,
}

/// The handler: calls the third party, passes its answer back verbatim (status, headers,
/// body); an error is a `502`.
async fn pass_through(State(gateway): State<Gateway>) -> Response {
    let request = Request::get(&gateway.url).body(Empty::new()).unwrap();
    match gateway.client.oneshot(request).await {
        Ok(response) => {
            let (parts, body) = response.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            Response::from_parts(parts, axum::body::Body::from(body))
        }
        Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

/// Our axum server, calling the third party at `third_party` with `stop_signals`.
async fn http_server(third_party: SocketAddr, stop_signals: StopSignals) -> SocketAddr {
    let gateway = Gateway {
        client: retry(stop_signals).layer(Client::builder(TokioExecutor::new()).build_http()),
        url: format!("http://{third_party}/hook"),
    };
    let app = Router::new()
        .route("/api", get(pass_through))
        .with_state(gateway)
        .layer(protection());
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// What our callers get: per call, the status and whether it carried the stop signal.
async fn call_http(server: SocketAddr) -> Vec<(StatusCode, bool)> {
    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let mut answers = Vec::new();
    for _ in 0..CALLS {
        let request = Request::get(format!("http://{server}/api"))
            .body(Empty::new())
            .unwrap();
        let response = client.request(request).await.expect("an answer");
        answers.push((
            response.status(),
            protocol::is_stop_signal(response.headers()),
        ));
    }
    answers
}

#[tokio::test]
async fn a_third_party_stop_signal_reaches_our_http_callers_only_when_passed_up() {
    // The default: honoured and passed up, as inside one organisation.
    let (third, seen) = third_party().await;
    let server = http_server(third, StopSignals::PassUp).await;
    let answers = call_http(server).await;
    assert_eq!(
        answers,
        vec![(StatusCode::SERVICE_UNAVAILABLE, true); CALLS],
        "passed up"
    );
    assert_eq!(seen.load(Ordering::SeqCst), CALLS, "never retried");

    // Honoured only: not retried, not passed up.
    let (third, seen) = third_party().await;
    let server = http_server(third, StopSignals::HonourOnly).await;
    let answers = call_http(server).await;
    assert_eq!(
        answers,
        vec![(StatusCode::SERVICE_UNAVAILABLE, false); CALLS],
        "honoured only"
    );
    assert_eq!(seen.load(Ordering::SeqCst), CALLS, "never retried");
}

/// Our gRPC service: `Check` calls the third party's `Check` and returns what it got,
/// response or `Status`, verbatim.
struct PassThrough {
    client: HealthClient<Retry<Channel, Tonic>>,
}

#[tonic::async_trait]
impl Health for PassThrough {
    async fn check(
        &self,
        request: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<HealthCheckResponse>, tonic::Status> {
        self.client.clone().check(request.into_inner()).await
    }

    type WatchStream =
        tonic::codegen::tokio_stream::Empty<Result<HealthCheckResponse, tonic::Status>>;

    async fn watch(
        &self,
        _: tonic::Request<HealthCheckRequest>,
    ) -> Result<tonic::Response<Self::WatchStream>, tonic::Status> {
        Err(tonic::Status::unimplemented("watch"))
    }
}

/// Our tonic server, calling the third party at `third_party` with `stop_signals`.
async fn grpc_server(third_party: SocketAddr, stop_signals: StopSignals) -> SocketAddr {
    let channel = Channel::from_shared(format!("http://{third_party}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = HealthClient::new(retry(stop_signals).for_tonic().layer(channel));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        Server::builder()
            .layer(protection())
            .add_service(HealthServer::new(PassThrough { client }))
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });
    addr
}

/// What our gRPC callers get: per call, the code and whether its metadata carried the stop
/// signal.
async fn call_grpc(server: SocketAddr) -> Vec<(Code, bool)> {
    let channel = Channel::from_shared(format!("http://{server}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut answers = Vec::new();
    for _ in 0..CALLS {
        let status = client
            .check(HealthCheckRequest::default())
            .await
            .expect_err("the third party fails every call");
        let headers = status.metadata().clone().into_headers();
        answers.push((status.code(), protocol::is_stop_signal(&headers)));
    }
    answers
}

#[tokio::test]
async fn a_third_party_stop_signal_reaches_our_grpc_callers_only_when_passed_up() {
    let (third, seen) = third_party().await;
    let server = grpc_server(third, StopSignals::PassUp).await;
    let answers = call_grpc(server).await;
    assert_eq!(answers, vec![(Code::Unavailable, true); CALLS], "passed up");
    assert_eq!(seen.load(Ordering::SeqCst), CALLS, "never retried");

    let (third, seen) = third_party().await;
    let server = grpc_server(third, StopSignals::HonourOnly).await;
    let answers = call_grpc(server).await;
    assert_eq!(
        answers,
        vec![(Code::Unavailable, false); CALLS],
        "honoured only"
    );
    assert_eq!(seen.load(Ordering::SeqCst), CALLS, "never retried");
}
