//! Finding 2 of issue 23, end to end on 127.0.0.1: under a retry storm, the overload layer
//! turns its limiter's rejections into the stop signal, and leaves the rejections nobody's
//! limiter made alone: a handler's own `503` and an upstream's `429` passed on by a handler
//! acting as a gateway come back exactly as they were sent, status, headers and body.
//!
//! The server is the README's axum setup (`OverloadProtectionLayer::new(limit)` on the
//! router, served with the peer address), whose token bucket (50 req/s) counts `/api` only (a
//! cost of 0 elsewhere, so the two other routes always reach their handlers):
//!
//! - `/api` answers `ok`; most of it is rejected by the limit;
//! - `/own` answers `503 Service Unavailable` itself, with `Retry-After: 30`, a header of
//!   its own and a body (a service in maintenance);
//! - `/proxy` calls an upstream server that answers `429` with `Retry-After` and the IETF
//!   `RateLimit` fields, and returns that answer as it is.
//!
//! 40 clients, each from its own loopback address, send 200 requests per second to `/api`,
//! nine in ten of them retries, and 10 per second each to `/own` and `/proxy`, also
//! retries, for 3 seconds. Before the fix every `429` and `503` was judged as the server's
//! own: the `/own` and `/proxy` answers became `503 X-Overloaded` without their
//! `Retry-After` and `RateLimit` fields. The same server told to judge every rejection
//! (`judge_every_rejection(true)`, the old behaviour, opt-in) rewrites them: the anchor.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http::header::RETRY_AFTER;
use http::request::Parts;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_signal::OverloadSignalLayer;
use overload_signal::axum_0_8::into_make_service_with_peer_addr;
use overload_signal::protocol::{self, Attempt, RATELIMIT};
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

const CLIENTS: u8 = 40;
const API_PER_SECOND: u64 = 200;
const FOREIGN_PER_SECOND: u64 = 10;
const SECONDS: u64 = 3;

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

async fn serve(router: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, into_make_service_with_peer_addr(router))
            .await
            .unwrap();
    });
    addr
}

/// The upstream: every request is over its rate.
async fn upstream() -> SocketAddr {
    serve(Router::new().route(
        "/limited",
        get(|| async {
            (
                StatusCode::TOO_MANY_REQUESTS,
                [
                    ("retry-after", "7"),
                    ("ratelimit-policy", "\"up\";q=10;w=1"),
                    ("ratelimit", "\"up\";r=0;t=7"),
                ],
                "upstream says slow down\n",
            )
        }),
    ))
    .await
}

/// The protected server; `signal` is its overload layer.
async fn server(signal: OverloadSignalLayer, upstream: SocketAddr) -> SocketAddr {
    let limit = RateLimitLayer::builder(TokenBucket::builder(50).burst(10).build().unwrap())
        .cost_by(|parts: &Parts| u32::from(parts.uri.path() == "/api"))
        .build()
        .unwrap();
    let gateway: HttpClient = Client::builder(TokioExecutor::new()).build_http();
    let router = Router::new()
        .route("/api", get(|| async { "ok" }))
        .route(
            "/own",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    [("retry-after", "30"), ("x-maintenance", "until 14:00")],
                    "down for maintenance\n",
                )
            }),
        )
        .route(
            "/proxy",
            get(move |State(client): State<HttpClient>| async move {
                let request = Request::get(format!("http://{upstream}/limited"))
                    .body(Empty::new())
                    .unwrap();
                let answer = client.request(request).await.unwrap();
                let (parts, body) = answer.into_parts();
                let body = body.collect().await.unwrap().to_bytes();
                Response::from_parts(parts, Body::from(body)).into_response()
            }),
        )
        .with_state(gateway)
        .layer(
            OverloadProtectionLayer::builder(limit)
                .signal(signal)
                .build()
                .unwrap(),
        );
    serve(router).await
}

/// What came back: per path, every (status, headers, body) seen, and `/api`'s stop signals.
#[derive(Debug, Default)]
struct Seen {
    own: Vec<(StatusCode, HeaderMap, Bytes)>,
    proxy: Vec<(StatusCode, HeaderMap, Bytes)>,
    api_ok: u64,
    api_limited: u64,
    api_stopped: u64,
}

async fn storm(addr: SocketAddr) -> Seen {
    let clients: Vec<HttpClient> = (0..CLIENTS)
        .map(|i| {
            let mut connector = HttpConnector::new();
            connector.set_local_address(Some(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 10 + i))));
            Client::builder(TokioExecutor::new()).build(connector)
        })
        .collect();
    let seen = Arc::new(Mutex::new(Seen::default()));
    let per_second = API_PER_SECOND + 2 * FOREIGN_PER_SECOND;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
    let mut calls = JoinSet::new();
    for i in 0..per_second * SECONDS {
        tick.tick().await;
        let path = match i % (per_second / FOREIGN_PER_SECOND) {
            0 => "/own",
            1 => "/proxy",
            _ => "/api",
        };
        // Nine in ten requests are retries.
        let attempt = if i % 10 == 0 { 0 } else { 1 + (i % 2) as u32 };
        let client = clients[i as usize % clients.len()].clone();
        let seen = Arc::clone(&seen);
        let mut request = Request::get(format!("http://{addr}{path}"))
            .body(Empty::new())
            .unwrap();
        Attempt::set(request.headers_mut(), attempt);
        calls.spawn(async move {
            let response = client.request(request).await.expect("the server answers");
            let (parts, body) = response.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let mut seen = seen.lock().unwrap();
            match path {
                "/own" => seen.own.push((parts.status, parts.headers, body)),
                "/proxy" => seen.proxy.push((parts.status, parts.headers, body)),
                _ if parts.status == StatusCode::OK => seen.api_ok += 1,
                _ if protocol::is_stop_signal(&parts.headers) => seen.api_stopped += 1,
                _ => seen.api_limited += 1,
            }
        });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
    Arc::try_unwrap(seen).unwrap().into_inner().unwrap()
}

/// Whether an answer is the one its handler (or the upstream) sent, untouched.
fn untouched(
    (status, headers, body): &(StatusCode, HeaderMap, Bytes),
    want: StatusCode,
    fields: &[(&str, &str)],
    text: &str,
) -> bool {
    *status == want
        && !protocol::is_stop_signal(headers)
        && fields
            .iter()
            .all(|(k, v)| headers.get(*k).is_some_and(|h| h == v))
        && body == text.as_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn foreign_rejections_pass_untouched_while_the_limits_own_become_the_stop_signal() {
    let upstream = upstream().await;
    let (default, judging_all) = (
        server(OverloadSignalLayer::new(), upstream).await,
        server(
            OverloadSignalLayer::builder()
                .judge_every_rejection(true)
                .build()
                .unwrap(),
            upstream,
        )
        .await,
    );
    let (seen, anchor) = tokio::time::timeout(Duration::from_secs(60), async {
        tokio::join!(storm(default), storm(judging_all))
    })
    .await
    .expect("the test is bounded");
    eprintln!(
        "/api: {} ok, {} plain 429, {} stop signals; /own and /proxy: {} and {}",
        seen.api_ok,
        seen.api_limited,
        seen.api_stopped,
        seen.own.len(),
        seen.proxy.len()
    );
    // Retries dominate: the limit's own rejections are answered with the stop signal.
    assert!(
        seen.api_stopped > seen.api_limited,
        "the storm is judged a storm: {seen:?}"
    );
    let own = |a| {
        untouched(
            a,
            StatusCode::SERVICE_UNAVAILABLE,
            &[("retry-after", "30"), ("x-maintenance", "until 14:00")],
            "down for maintenance\n",
        )
    };
    let proxied = |a| {
        untouched(
            a,
            StatusCode::TOO_MANY_REQUESTS,
            &[
                ("retry-after", "7"),
                ("ratelimit-policy", "\"up\";q=10;w=1"),
                ("ratelimit", "\"up\";r=0;t=7"),
            ],
            "upstream says slow down\n",
        )
    };
    assert_eq!(seen.own.len() as u64, FOREIGN_PER_SECOND * SECONDS);
    assert_eq!(seen.proxy.len() as u64, FOREIGN_PER_SECOND * SECONDS);
    assert!(seen.own.iter().all(own), "{:?}", seen.own);
    assert!(seen.proxy.iter().all(proxied), "{:?}", seen.proxy);
    // The anchor, told to judge every rejection, rewrites them once the storm is judged.
    assert!(
        anchor.own.iter().any(|a| !own(a)) && anchor.proxy.iter().any(|a| !proxied(a)),
        "the anchor reproduces the finding"
    );
    assert!(
        anchor.proxy.iter().filter(|a| !proxied(a)).all(
            |(_, headers, _)| protocol::is_stop_signal(headers)
                && !headers.contains_key(RETRY_AFTER)
                && !headers.contains_key(RATELIMIT)
        ),
    );
}
