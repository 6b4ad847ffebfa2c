//! Finding 1 of the trust issue, end to end on 127.0.0.1: one client that forges its attempt
//! counter among many honest ones must not turn the honest clients' rejections into the
//! stop signal.
//!
//! The issue measured it as one client sending 60 req/s with `X-Request-Attempt: 3` next to
//! 700 req/s of first tries, which turned the honest clients' rejections into `503
//! X-Overloaded` (6 780 stop signals against 117 plain `429`s in 15 s). Here at half the
//! rates (the same 8 % of forged retries, over the 5 % threshold) for 4 seconds, with a
//! 2-second window so that the window fills within the run: 70 honest clients, each from
//! a network of its own (127.0.10.1 to 127.0.79.1: the loopback network answers on all of
//! 127.0.0.0/8, and the overload layer keys IPv4 callers by their /24), send 5 first tries
//! per second; the forger, from 127.200.0.1, sends 30 requests per second claiming to be
//! third retries. The server is axum, served with the peer address
//! (`into_make_service_with_peer_addr`), behind `OverloadProtectionLayer` around a global token bucket that admits
//! 100 req/s, so most requests are rejected.
//!
//! Two servers run side by side: one with the default overload layer (callers keyed by peer
//! address), one whose overload layer keys nothing, which is how every request was counted
//! before (the anchor: it must reproduce the finding).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use bytes::Bytes;
use http::request::Parts;
use http::{Request, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_signal::axum_0_8::into_make_service_with_peer_addr;
use overload_signal::protocol::{self, Attempt};
use overload_signal::{AttemptHistogram, OverloadSignalLayer};
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

const HONEST_CLIENTS: u8 = 70;
const HONEST_PER_SECOND: u64 = 350;
const FORGED_PER_SECOND: u64 = 30;
const SECONDS: u64 = 4;

/// What one group of clients got back.
#[derive(Debug, Default)]
struct Tally {
    ok: AtomicU64,
    limited: AtomicU64,
    stopped: AtomicU64,
    other: AtomicU64,
}

impl Tally {
    fn count(&self, status: StatusCode, stop: bool) {
        let counter = match status {
            StatusCode::OK => &self.ok,
            StatusCode::TOO_MANY_REQUESTS => &self.limited,
            StatusCode::SERVICE_UNAVAILABLE if stop => &self.stopped,
            _ => &self.other,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn get(&self) -> [u64; 4] {
        [&self.ok, &self.limited, &self.stopped, &self.other].map(|c| c.load(Ordering::Relaxed))
    }
}

/// Serves the protected API on 127.0.0.1 with the peer address; returns its URL and the
/// overload layer's histogram.
async fn server(signal: OverloadSignalLayer) -> (String, AttemptHistogram) {
    let histogram = signal.histogram().clone();
    let limit = RateLimitLayer::new(TokenBucket::builder(100).burst(10).build().unwrap());
    let protection = OverloadProtectionLayer::builder(limit)
        .signal(signal)
        .build()
        .unwrap();
    let app = Router::new()
        .route("/api", get(|| async { "ok" }))
        .layer(protection);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/api", listener.local_addr().unwrap());
    tokio::spawn(async move {
        axum::serve(listener, into_make_service_with_peer_addr(app))
            .await
            .unwrap();
    });
    (url, histogram)
}

/// A 2-second window in 10 buckets, the default rule.
fn signal() -> overload_signal::OverloadSignalLayerBuilder {
    let histogram = AttemptHistogram::builder()
        .window(Duration::from_secs(2))
        .buckets(10)
        .build()
        .unwrap();
    OverloadSignalLayer::builder().histogram(histogram)
}

type HttpClient = Client<HttpConnector, Empty<Bytes>>;

/// A client whose connections come from `source`.
fn client_from(source: Ipv4Addr) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_local_address(Some(IpAddr::V4(source)));
    Client::builder(TokioExecutor::new()).build(connector)
}

/// The honest clients: each on a /24 of its own.
fn honest_clients() -> Vec<HttpClient> {
    (0..HONEST_CLIENTS)
        .map(|i| client_from(Ipv4Addr::new(127, 0, 10 + i, 1)))
        .collect()
}

/// Drives the honest clients and the forger against `url`; returns (honest, forger).
async fn drive(url: &str) -> (Arc<Tally>, Arc<Tally>) {
    let forger = client_from(Ipv4Addr::new(127, 200, 0, 1));
    drive_with(url, &[forger], FORGED_PER_SECOND).await
}

/// Drives the honest clients and `forgers` (taking turns, `forged_per_second` in all)
/// against `url`; returns (honest, forgers).
async fn drive_with(
    url: &str,
    forgers: &[HttpClient],
    forged_per_second: u64,
) -> (Arc<Tally>, Arc<Tally>) {
    let honest = honest_clients();
    let (honest_tally, forger_tally) = (Arc::new(Tally::default()), Arc::new(Tally::default()));
    let per_second = HONEST_PER_SECOND + forged_per_second;
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / per_second));
    let mut calls = JoinSet::new();
    let (mut next_honest, mut forged) = (0usize, 0u64);
    for i in 0..per_second * SECONDS {
        tick.tick().await;
        // The forged requests spread evenly through the honest ones.
        let forge = (i + 1) * forged_per_second / per_second > forged;
        let (client, attempt, tally) = if forge {
            let forger = forgers[(forged % forgers.len() as u64) as usize].clone();
            forged += 1;
            (forger, 3, Arc::clone(&forger_tally))
        } else {
            next_honest = (next_honest + 1) % honest.len();
            (honest[next_honest].clone(), 0, Arc::clone(&honest_tally))
        };
        let mut request = Request::get(url).body(Empty::new()).unwrap();
        Attempt::set(request.headers_mut(), attempt);
        calls.spawn(async move {
            let response = client.request(request).await.expect("the server answers");
            tally.count(
                response.status(),
                protocol::is_stop_signal(response.headers()),
            );
        });
    }
    while let Some(done) = calls.join_next().await {
        done.unwrap();
    }
    (honest_tally, forger_tally)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_forging_client_cannot_stop_the_honest_ones() {
    // A fixed hashing key: the same clients share classes on every run.
    let (keyed_url, keyed_window) = server(signal().caller_seed(13).build().unwrap()).await;
    let (unkeyed_url, _) = server(signal().key_by(|_: &Parts| None::<()>).build().unwrap()).await;
    let ((honest, forger), (honest_unkeyed, _)) =
        tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(drive(&keyed_url), drive(&unkeyed_url))
        })
        .await
        .expect("the test is bounded");
    let [ok, limited, stopped, other] = honest.get();
    let [_, unkeyed_limited, unkeyed_stopped, _] = honest_unkeyed.get();
    eprintln!(
        "keyed by peer: honest {:?} (ok, 429, stop, other), forger {:?}; one class: honest {:?}",
        honest.get(),
        forger.get(),
        honest_unkeyed.get()
    );
    assert_eq!(other, 0);
    assert_eq!(ok + limited + stopped, HONEST_PER_SECOND * SECONDS);
    // The honest clients were mostly rejected: the question is how.
    assert!(limited + stopped > ok, "{:?}", honest.get());
    // Their rejections stay node-local 429s (the issue asks for at least 95 %).
    assert!(
        limited * 100 >= (limited + stopped) * 95,
        "honest rejections: {limited} x 429, {stopped} x stop"
    );
    // Although the plain figure the forger aimed at is over the threshold.
    let window = keyed_window.snapshot();
    assert!(window.retry_share().unwrap() > 0.05, "{window:?}");
    // With every request in one class, the forger decides for everyone: finding 1.
    assert!(
        unkeyed_stopped > unkeyed_limited,
        "the anchor reproduces the finding: {:?}",
        honest_unkeyed.get()
    );
}

/// Finding 2 of issue 31: "a handful of addresses forge a storm". Caller classes were by
/// address, so seven addresses in seven classes carried the share over 5 %; measured against
/// the default demo server, 70 honest clients each on its own /24 and 7 forgers on addresses
/// of one /24 (`X-Request-Attempt: 3`, 30 req/s each) turned 98.2 % of the honest clients'
/// rejections into stop signals. Here the 7 forgers (127.201.0.1 to .7) send 15 req/s each
/// next to the honest 350: keyed by network (the default), they are one caller, and at most
/// 2 % of the honest rejections may become stop signals. The anchor keys callers by address,
/// as the default did before: it must reproduce the finding.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seven_forgers_of_one_network_are_one_caller() {
    const FORGERS: u8 = 7;
    const FORGED: u64 = 15 * FORGERS as u64;
    let forgers = || -> Vec<HttpClient> {
        (1..=FORGERS)
            .map(|i| client_from(Ipv4Addr::new(127, 201, 0, i)))
            .collect()
    };
    let (network_url, network_window) = server(signal().caller_seed(13).build().unwrap()).await;
    let by_address = signal()
        .caller_seed(13)
        .key_by(|parts: &Parts| overload_signal::signal::client_addr(&parts.extensions))
        .build()
        .unwrap();
    let (address_url, _) = server(by_address).await;
    let (forgers_a, forgers_b) = (forgers(), forgers());
    let ((honest, forger), (honest_by_address, _)) =
        tokio::time::timeout(Duration::from_secs(60), async {
            tokio::join!(
                drive_with(&network_url, &forgers_a, FORGED),
                drive_with(&address_url, &forgers_b, FORGED)
            )
        })
        .await
        .expect("the test is bounded");
    let [ok, limited, stopped, other] = honest.get();
    let [_, address_limited, address_stopped, _] = honest_by_address.get();
    eprintln!(
        "keyed by network: honest {:?} (ok, 429, stop, other), forgers {:?}; by address: honest {:?}",
        honest.get(),
        forger.get(),
        honest_by_address.get()
    );
    assert_eq!(other, 0);
    assert_eq!(ok + limited + stopped, HONEST_PER_SECOND * SECONDS);
    assert!(limited + stopped > ok, "{:?}", honest.get());
    // At most 2 % of the honest rejections became stop signals.
    assert!(
        stopped * 100 <= (limited + stopped) * 2,
        "honest rejections: {limited} x 429, {stopped} x stop"
    );
    let window = network_window.snapshot();
    assert!(window.retry_share().unwrap() > 0.05, "{window:?}");
    // Keyed by address, the seven are seven callers and decide for everyone: finding 2.
    assert!(
        address_stopped > address_limited,
        "the anchor reproduces the finding: {:?}",
        honest_by_address.get()
    );
}
