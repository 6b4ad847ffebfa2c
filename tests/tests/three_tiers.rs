//! Three real tiers on 127.0.0.1, each an axum server whose handler calls the next tier
//! through `backoff-layer`'s client stack (retries, a 10 % retry budget); the bottom tier is
//! overloaded (a low rate limit). With the overload layer on every tier, with its default
//! rule (`OverloadProtectionLayer::new` around the bottom tier's limit,
//! `OverloadSignalLayer::new()` on the others):
//!
//! - the bottom tier's rejections become the stop signal once its attempt histogram shows
//!   its callers retrying, and the signal reaches the top caller through both tiers above,
//!   with no handler code (the propagation marker);
//! - no tier retries a request after the stop signal came back for it;
//! - the bottom tier receives at most 1.1 times the offered load (the paper's bound).
//!
//! Regression for finding 2 of the trust issue: with the default rule the bottom tier
//! received 1.11 to 1.14 times the offered load, and only a stricter, non-default rule
//! (2 % over 100 requests) met the bound. The default rule is now sustained (see
//! `StopRule::sustain`).
//!
//! The same tiers with budgets only (no overload layer) run at the same time, as the anchor.
//! Offered load: 100 requests per second for 12 seconds; the bottom tier admits 40 per
//! second. Every figure is printed (`--nocapture`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::{Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use backoff_layer::backoff::FullJitter;
use backoff_layer::budget::RetryBudget;
use backoff_layer::{ReplayBody, Retry, RetryLayer};
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode};
use http_body_util::Empty;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use overload_signal::axum_0_8::into_make_service_with_peer_addr;
use overload_signal::protocol::{self, Attempt};
use overload_signal::{OverloadSignalLayer, is_overloaded};
use ratelimit_layer::{OverloadProtectionLayer, RateLimitLayer, TokenBucket};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tower::{Layer, ServiceExt};

/// Offered load: first tries per second from the top caller, and for how long.
const OFFERED_PER_SECOND: u64 = 100;
const OFFERED_SECONDS: u64 = 12;
/// The bottom tier admits 40 requests per second (burst 20): 40 % of the offered load.
const BOTTOM_RATE: u32 = 40;
const BOTTOM_BURST: u32 = 20;

/// Identifies one logical request of a caller, the same on all of its attempts.
const TEST_ID: HeaderName = HeaderName::from_static("x-test-id");

/// One request a tier received: who sent it, which attempt it was, and whether the tier
/// answered it with the stop signal.
#[derive(Clone, Copy, Debug)]
struct Seen {
    id: u64,
    attempt: Attempt,
    stop: bool,
}

type Log = Arc<Mutex<Vec<Seen>>>;

type HttpClient = Retry<Client<HttpConnector, ReplayBody<Empty<Bytes>>>>;

/// The client stack every caller uses: 3 attempts, full jitter between 10 and 50 ms (which
/// also caps `Retry-After`), the default 10 % retry budget, a 2 s attempt timeout.
fn client() -> HttpClient {
    RetryLayer::builder()
        .backoff(
            FullJitter::builder()
                .base(Duration::from_millis(10))
                .cap(Duration::from_millis(50))
                .build()
                .unwrap(),
        )
        .budget(RetryBudget::default())
        .attempt_timeout(Duration::from_secs(20))
        .deadline(Duration::from_secs(30))
        .build()
        .unwrap()
        .layer(Client::builder(TokioExecutor::new()).build_http())
}

fn get_request(url: &str, id: u64) -> http::Request<Empty<Bytes>> {
    http::Request::get(url)
        .header(TEST_ID, HeaderValue::from(id))
        .body(Empty::new())
        .unwrap()
}

/// Records every request and the tier's final answer to it (outermost, so it sees what the
/// caller gets).
async fn log_requests(State(log): State<Log>, request: Request, next: Next) -> Response {
    let id = request
        .headers()
        .get(TEST_ID)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .expect("every test request carries an id");
    let attempt = Attempt::from_request(&request);
    let response = next.run(request).await;
    let stop = protocol::is_stop_signal(response.headers());
    log.lock().unwrap().push(Seen { id, attempt, stop });
    response
}

/// What a middle tier's handler needs: its client and the next tier's URL.
#[derive(Clone)]
struct Downstream {
    client: HttpClient,
    url: String,
    next_id: Arc<AtomicU64>,
}

/// A middle tier's handler: calls the tier below and answers `200 ok` or `502`. It has no
/// code for the stop signal: the retry layer returns `Err(Overloaded)` and raises the
/// propagation marker, the handler fails like for any other error, and the overload layer
/// turns the failure into the stop signal.
async fn proxy(State(down): State<Downstream>) -> Response {
    let id = down.next_id.fetch_add(1, Ordering::Relaxed);
    match down.client.oneshot(get_request(&down.url, id)).await {
        Ok(response) if response.status().is_success() => "ok".into_response(),
        Ok(_) | Err(_) => StatusCode::BAD_GATEWAY.into_response(),
    }
}

struct Tier {
    addr: SocketAddr,
    log: Log,
    task: JoinHandle<()>,
}

impl Tier {
    fn url(&self) -> String {
        format!("http://{}/api", self.addr)
    }

    fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().clone()
    }
}

impl Drop for Tier {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Serves `router` on 127.0.0.1 behind the request log (outermost, so it sees what the
/// caller gets).
async fn serve(router: Router) -> Tier {
    let log = Log::default();
    let router = router.layer(middleware::from_fn_with_state(
        Arc::clone(&log),
        log_requests,
    ));
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        axum::serve(listener, into_make_service_with_peer_addr(router))
            .await
            .unwrap();
    });
    Tier { addr, log, task }
}

/// The bottom tier: its rate limit, and with `signal` the default overload layer outside it.
async fn bottom(signal: bool) -> Tier {
    let bucket = TokenBucket::builder(BOTTOM_RATE).burst(BOTTOM_BURST);
    let limit = RateLimitLayer::new(bucket.build().unwrap());
    let api = Router::new().route("/api", get(|| async { "ok" }));
    serve(if signal {
        api.layer(OverloadProtectionLayer::new(limit))
    } else {
        api.layer(limit)
    })
    .await
}

async fn middle(below: &Tier, signal: bool) -> Tier {
    let down = Downstream {
        client: client(),
        url: below.url(),
        next_id: Arc::default(),
    };
    let router = Router::new().route("/api", get(proxy)).with_state(down);
    serve(if signal {
        router.layer(OverloadSignalLayer::new())
    } else {
        router
    })
    .await
}

/// What one run saw.
#[derive(Debug)]
struct Run {
    offered: u64,
    top_ok: u64,
    top_overloaded: u64,
    top_other_failures: u64,
    /// Requests each tier received, top (a) to bottom (c).
    received: [u64; 3],
    /// Responses each tier answered with the stop signal.
    stops_sent: [u64; 3],
    /// Retries a caller sent after the stop signal came back for the same request, per tier.
    retries_after_stop: [u64; 3],
}

impl Run {
    fn bottom_ratio(&self) -> f64 {
        self.received[2] as f64 / self.offered as f64
    }
}

/// For each request id, attempts numbered after the lowest attempt that got the stop
/// signal: retries that should never have been sent.
fn retries_after_stop(seen: &[Seen]) -> u64 {
    let mut by_id: BTreeMap<u64, Vec<Seen>> = BTreeMap::new();
    for s in seen {
        by_id.entry(s.id).or_default().push(*s);
    }
    by_id
        .values()
        .map(|attempts| {
            let first_stop = attempts
                .iter()
                .filter(|s| s.stop)
                .filter_map(|s| s.attempt.number())
                .min();
            first_stop.map_or(0, |k| {
                attempts
                    .iter()
                    .filter(|s| s.attempt.number().is_some_and(|n| n > k))
                    .count() as u64
            })
        })
        .sum()
}

async fn run(signal: bool) -> Run {
    let c = bottom(signal).await;
    let b = middle(&c, signal).await;
    let a = middle(&b, signal).await;

    let top = client();
    let url = a.url();
    let offered = OFFERED_PER_SECOND * OFFERED_SECONDS;
    let mut calls = JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / OFFERED_PER_SECOND));
    for id in 0..offered {
        tick.tick().await;
        let request = get_request(&url, id);
        calls.spawn(top.clone().oneshot(request));
    }
    let (mut top_ok, mut top_overloaded, mut top_other_failures) = (0, 0, 0);
    while let Some(outcome) = calls.join_next().await {
        match outcome.unwrap() {
            Ok(response) if response.status().is_success() => top_ok += 1,
            Err(e) if is_overloaded(&*e) => top_overloaded += 1,
            Ok(_) | Err(_) => top_other_failures += 1,
        }
    }

    let tiers = [a.seen(), b.seen(), c.seen()];
    Run {
        offered,
        top_ok,
        top_overloaded,
        top_other_failures,
        received: tiers.each_ref().map(|s| s.len() as u64),
        stops_sent: tiers
            .each_ref()
            .map(|s| s.iter().filter(|s| s.stop).count() as u64),
        retries_after_stop: tiers.each_ref().map(|s| retries_after_stop(s)),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_signal_crosses_three_tiers_and_caps_the_bottom_load() {
    let both = tokio::time::timeout(Duration::from_secs(90), async {
        // Side by side, at the same time, on separate servers.
        tokio::join!(run(false), run(true))
    })
    .await
    .expect("the test is bounded");
    let (budget_only, with_signal) = both;
    eprintln!(
        "budget only: bottom received {:.3}x the offered load; {budget_only:?}",
        budget_only.bottom_ratio()
    );
    eprintln!(
        "with OverloadSignalLayer: bottom received {:.3}x the offered load; {with_signal:?}",
        with_signal.bottom_ratio()
    );

    for run in [&budget_only, &with_signal] {
        assert_eq!(
            run.top_ok + run.top_overloaded + run.top_other_failures,
            run.offered,
            "every call ended: {run:?}"
        );
        assert!(
            run.top_ok > 0,
            "the bottom tier still serves its rate: {run:?}"
        );
    }
    // The bottom tier sent the stop signal, both tiers above passed it on, and the top
    // caller got it as the typed `Overloaded` error.
    let [a_stops, b_stops, c_stops] = with_signal.stops_sent;
    assert!(c_stops > 0, "{with_signal:?}");
    assert!(b_stops > 0, "{with_signal:?}");
    assert!(a_stops > 0, "{with_signal:?}");
    assert!(with_signal.top_overloaded > 0, "{with_signal:?}");
    assert_eq!(
        with_signal.top_overloaded, a_stops,
        "every stop signal the top tier sent reached the top caller as Overloaded"
    );
    // No caller retried a request after the stop signal came back for it.
    assert_eq!(with_signal.retries_after_stop, [0, 0, 0], "{with_signal:?}");
    // The bottom tier saw at most 1.1 times the offered load.
    assert!(
        with_signal.bottom_ratio() <= 1.1,
        "bottom load {:.3}x: {with_signal:?}",
        with_signal.bottom_ratio()
    );
    // Without the layer, budgets alone let more through, and nobody hears "stop".
    assert_eq!(budget_only.stops_sent, [0, 0, 0]);
    assert_eq!(budget_only.top_overloaded, 0);
    assert!(
        budget_only.bottom_ratio() > with_signal.bottom_ratio(),
        "budget only {:.3}x, with the layer {:.3}x",
        budget_only.bottom_ratio(),
        with_signal.bottom_ratio()
    );
}
