//! The README's server setups, exactly as written there, on 127.0.0.1 with real clients:
//! one client forging `X-Request-Attempt: 3` among 70 honest ones must not turn any honest
//! rejection into the stop signal (finding 1 of issue 23).
//!
//! The setups, word for word:
//!
//! - axum: `Router::new().route(..).layer(OverloadProtectionLayer::new(limit))`, served with
//!   `ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app)`;
//! - tonic: `ratelimit_layer::tonic_0_14::server_builder()
//!   .layer(OverloadProtectionLayer::new(limit)).add_service(..)`.
//!
//! Nothing keys the callers but the defaults. These tests live in this crate, not in the
//! workspace's integration package, on purpose: `cargo test -p ratelimit-layer` builds
//! `overload-signal` with the features this crate turns on and nothing else, as a user who
//! depends on `ratelimit-layer` alone, with its features `axum-0_8` and `tonic-0_14`, gets
//! it. (The workspace's other packages turn on `overload-signal`'s features themselves,
//! which would hide a missing one.)
//!
//! The traffic, for 4 seconds: 70 honest clients, each from its own source address and its
//! own /24 (127.0.10.1 to 127.0.79.1: the loopback network answers on all of 127.0.0.0/8),
//! send 350 first tries per second in all; the forger, from 127.0.200.1, sends 30 requests
//! per second claiming to be third retries: 7.9 % of the traffic, over the default 5 %
//! threshold. A global token bucket admits 100 per second, so most requests are rejected.
//! Before issue 23's fix, tonic keyed no caller (its peer address is in `TcpConnectInfo`,
//! which the default key did not read) and neither did axum without `overload-signal`'s
//! axum feature: every honest rejection became the stop signal once the window filled. Since
//! issue 31 (finding 8) the layers read a plain `SocketAddr` extension, which the README's
//! one-line adapters put there.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_signal::protocol::{self, Attempt};
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const HONEST_CLIENTS: u8 = 70;
const HONEST_PER_SECOND: u64 = 350;
const FORGED_PER_SECOND: u64 = 30;
const SECONDS: u64 = 4;
/// `overload_signal::protocol::X_REQUEST_ATTEMPT`, as tonic's metadata key wants it.
const X_REQUEST_ATTEMPT_NAME: &str = "x-request-attempt";

/// What one group of clients got back.
#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    limited: AtomicU64,
    stopped: AtomicU64,
    other: AtomicU64,
}

impl Tally {
    fn add(&self, outcome: Outcome) {
        let counter = match outcome {
            Outcome::Ok => &self.ok,
            Outcome::Limited => &self.limited,
            Outcome::Stopped => &self.stopped,
            Outcome::Other => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> [u64; 4] {
        [&self.ok, &self.limited, &self.stopped, &self.other].map(|c| c.load(Ordering::Relaxed))
    }
}

#[derive(Clone, Copy, Debug)]
enum Outcome {
    Ok,
    /// `429`, or gRPC `RESOURCE_EXHAUSTED`, without the stop signal.
    Limited,
    /// The stop signal.
    Stopped,
    Other,
}

/// The README's limit: 100 requests per second, bursts of 20.
fn readme_limit() -> RateLimitLayer {
    RateLimitLayer::new(TokenBucket::builder(100).burst(20).build().unwrap())
}

/// Sends the honest and the forged traffic through `send(client index, forged)`, where
/// client `HONEST_CLIENTS` is the forger; returns (honest, forger).
async fn drive<F, Fut>(send: F) -> (Arc<Tally>, Arc<Tally>)
where
    F: Fn(usize, bool) -> Fut,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let (honest, forger) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let per_second = HONEST_PER_SECOND + FORGED_PER_SECOND;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
    let mut calls = JoinSet::new();
    let (mut next_honest, mut forged) = (0usize, 0u64);
    for i in 0..per_second * SECONDS {
        tick.tick().await;
        // The forged requests spread evenly through the honest ones.
        let forge = (i + 1) * FORGED_PER_SECOND / per_second > forged;
        let (call, tally) = if forge {
            forged += 1;
            (send(usize::from(HONEST_CLIENTS), true), Arc::clone(&forger))
        } else {
            next_honest = (next_honest + 1) % usize::from(HONEST_CLIENTS);
            (send(next_honest, false), Arc::clone(&honest))
        };
        calls.spawn(async move { tally.add(call.await) });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
    (honest, forger)
}

/// The source address of client `i` (the forger is the last): each of its own /24, so that
/// however callers are grouped by network, each client is one caller.
fn source(i: usize) -> IpAddr {
    if i == usize::from(HONEST_CLIENTS) {
        IpAddr::V4(Ipv4Addr::new(127, 0, 200, 1))
    } else {
        IpAddr::V4(Ipv4Addr::new(127, 0, 10 + i as u8, 1))
    }
}

fn check(setup: &str, honest: &Tally, forger: &Tally) {
    let [ok, limited, stopped, other] = honest.get();
    eprintln!(
        "{setup}: honest {:?} (ok, limited, stop, other), forger {:?}",
        honest.get(),
        forger.get()
    );
    assert_eq!(other, 0, "{setup}");
    assert_eq!(
        ok + limited + stopped,
        HONEST_PER_SECOND * SECONDS,
        "{setup}"
    );
    // Most honest requests were rejected: the question is how.
    assert!(limited > ok, "{setup}: {:?}", honest.get());
    assert_eq!(
        stopped, 0,
        "{setup}: every honest rejection stays a plain one ({limited} plain, {stopped} stop)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_as_the_readme_shows_keeps_honest_rejections_429() {
    // The README's axum server, word for word.
    let limit = readme_limit();
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(OverloadProtectionLayer::new(limit));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(
            listener,
            ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app),
        )
        .await
        .unwrap();
    });

    let clients: Vec<Client<HttpConnector, Empty<Bytes>>> = (0..=usize::from(HONEST_CLIENTS))
        .map(|i| {
            let mut connector = HttpConnector::new();
            connector.set_local_address(Some(source(i)));
            Client::builder(TokioExecutor::new()).build(connector)
        })
        .collect();
    let (honest, forger) = tokio::time::timeout(
        Duration::from_secs(60),
        drive(|i, forged| {
            let client = clients[i].clone();
            let mut request = Request::get(&url).body(Empty::new()).unwrap();
            Attempt::set(request.headers_mut(), if forged { 3 } else { 0 });
            async move {
                let response = client.request(request).await.expect("the server answers");
                match response.status() {
                    StatusCode::OK => Outcome::Ok,
                    _ if protocol::is_stop_signal(response.headers()) => Outcome::Stopped,
                    StatusCode::TOO_MANY_REQUESTS => Outcome::Limited,
                    _ => Outcome::Other,
                }
            }
        }),
    )
    .await
    .expect("the test is bounded");
    check("axum", &honest, &forger);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_as_the_readme_shows_keeps_honest_rejections_resource_exhausted() {
    // The README's tonic server, word for word (the health service stands for yours).
    let limit = readme_limit();
    let (_reporter, greeter) = tonic_health::server::health_reporter();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        ratelimit_layer::tonic_0_14::server_builder()
            .layer(OverloadProtectionLayer::new(limit))
            .add_service(greeter)
            .serve_with_incoming(TcpIncoming::from(listener))
            .await
            .unwrap();
    });

    let mut clients: Vec<HealthClient<Channel>> = Vec::new();
    for i in 0..=usize::from(HONEST_CLIENTS) {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .local_address(Some(source(i)))
            .connect_timeout(Duration::from_secs(10))
            .connect()
            .await
            .unwrap();
        clients.push(HealthClient::new(channel));
    }
    let (honest, forger) = tokio::time::timeout(
        Duration::from_secs(60),
        drive(|i, forged| {
            let mut client = clients[i].clone();
            let mut request = tonic::Request::new(HealthCheckRequest::default());
            let attempt = if forged { "3" } else { "0" };
            request.metadata_mut().insert(
                tonic::metadata::MetadataKey::from_static(X_REQUEST_ATTEMPT_NAME),
                attempt.parse().unwrap(),
            );
            async move {
                match client.check(request).await {
                    Ok(_) => Outcome::Ok,
                    Err(status) if status.metadata().contains_key("x-overloaded") => {
                        Outcome::Stopped
                    }
                    Err(status) if status.code() == tonic::Code::ResourceExhausted => {
                        Outcome::Limited
                    }
                    Err(status) => {
                        eprintln!("unexpected: {status:?}");
                        Outcome::Other
                    }
                }
            }
        }),
    )
    .await
    .expect("the test is bounded");
    check("tonic", &honest, &forger);
}
