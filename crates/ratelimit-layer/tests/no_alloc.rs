//! The admitted path allocates nothing: for the global limit and every built-in key (client
//! IP, client IP behind trusted proxies, header value), with each algorithm, and with a
//! metrics recorder installed (so the metric handles must be registered once and kept: a
//! lookup per request would allocate its key).
//!
//! A counting global allocator (dhat's, in testing mode) sees every allocation of the
//! process, so this binary runs without the test harness and its threads.

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use http::{HeaderName, Request, Response, StatusCode};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use ratelimit_layer::clock::FakeClock;
use ratelimit_layer::key::{ClientIp, ForwardedHeader, HeaderKey};
use ratelimit_layer::{
    AdaptiveLimitLayer, FixedWindow, Limiter, RateLimitBuilder, RateLimitLayer, SlidingWindow,
    TokenBucket,
};
use tower::{Layer, Service};

#[global_allocator]
static ALLOCATOR: dhat::Alloc = dhat::Alloc;

/// Requests per case in the measured run.
const REQUESTS: usize = 1_000;

/// An inner service that allocates nothing either: an empty `HeaderMap` and `Extensions`
/// hold no heap.
#[derive(Clone, Copy)]
struct Ok200;

impl Service<Request<()>> for Ok200 {
    type Response = Response<()>;
    type Error = Infallible;
    type Future = Ready<Result<Response<()>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(())))
    }
}

/// Requests from four clients, with an API key each; the peer is a trusted proxy that
/// forwarded them, so `ClientIp` with trusted proxies walks `X-Forwarded-For`.
fn requests(n: usize) -> Vec<Request<()>> {
    (0..n)
        .map(|i| {
            let client = i % 4;
            let mut request = Request::builder()
                .header("x-api-key", format!("key-{client}"))
                .header("x-forwarded-for", format!("198.51.100.{client}, 10.0.0.1"))
                .body(())
                .unwrap();
            request
                .extensions_mut()
                .insert(SocketAddr::from(([10, 0, 0, 2], 4000 + client as u16)));
            request
        })
        .collect()
}

/// Calls `service` with each request, polling each response future once (they are ready),
/// and checks every one is admitted.
fn call_all<S>(service: &mut S, requests: Vec<Request<()>>)
where
    S: Service<Request<()>, Response = Response<()>, Error = Infallible>,
{
    let mut cx = Context::from_waker(Waker::noop());
    for request in requests {
        assert!(service.poll_ready(&mut cx).is_ready());
        let future = pin!(service.call(request));
        match future.poll(&mut cx) {
            Poll::Ready(Ok(response)) => assert_eq!(response.status(), StatusCode::OK),
            _ => panic!("the response was not ready"),
        }
    }
}

/// The allocations (count and bytes) made while the layer admits `REQUESTS` requests whose
/// keys it has already seen.
fn admitted_allocations(name: &str, layer: &RateLimitLayer) -> (u64, u64) {
    let mut service = layer.layer(Ok200);
    // Warm-up: registers the metric handles and stores the four keys.
    call_all(&mut service, requests(8));
    let batch = requests(REQUESTS);
    let before = dhat::HeapStats::get();
    call_all(&mut service, batch);
    let after = dhat::HeapStats::get();
    let counted = (
        after.total_blocks - before.total_blocks,
        after.total_bytes - before.total_bytes,
    );
    println!("{name}: {counted:?} (blocks, bytes) for {REQUESTS} admitted requests");
    counted
}

/// Builds the same layer for each key; a limit nobody reaches, on a clock that stands
/// still.
fn layers<L: Limiter + Clone>(limiter: &L) -> Vec<(&'static str, RateLimitLayer)> {
    let base = || -> RateLimitBuilder<L, FakeClock> {
        RateLimitLayer::builder(limiter.clone()).clock(FakeClock::new())
    };
    let trusted = ClientIp::builder()
        .trust_proxies(
            ForwardedHeader::XForwardedFor,
            ["10.0.0.0/8".parse().unwrap()],
        )
        .build()
        .unwrap();
    vec![
        ("global", base().build().unwrap()),
        (
            "client ip",
            base().key_by_client_ip(ClientIp::new()).build().unwrap(),
        ),
        (
            "client ip behind trusted proxies",
            base().key_by_client_ip(trusted).build().unwrap(),
        ),
        (
            "header value",
            base()
                .key_by(HeaderKey::new(HeaderName::from_static("x-api-key")))
                .build()
                .unwrap(),
        ),
    ]
}

/// The allocations the adaptive limit makes while it admits `REQUESTS` requests, each
/// lasting 1 ms on a fake clock, so that sampling windows close (and the limit moves) during
/// the measured run too.
fn adaptive_allocations() -> (u64, u64) {
    let clock = FakeClock::new();
    let layer = AdaptiveLimitLayer::builder()
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut service = layer.layer(Ok200);
    let mut run = |requests: Vec<Request<()>>| {
        let mut cx = Context::from_waker(Waker::noop());
        for request in requests {
            assert!(service.poll_ready(&mut cx).is_ready());
            let mut future = pin!(service.call(request));
            clock.advance(std::time::Duration::from_millis(1));
            match future.as_mut().poll(&mut cx) {
                Poll::Ready(Ok(response)) => assert_eq!(response.status(), StatusCode::OK),
                _ => panic!("the response was not ready"),
            }
        }
    };
    // Warm-up: registers the metric handles; ends the first baseline measurement.
    run(requests(60));
    assert!(!layer.status().probing);
    let batch = requests(REQUESTS);
    let before = dhat::HeapStats::get();
    run(batch);
    let after = dhat::HeapStats::get();
    let counted = (
        after.total_blocks - before.total_blocks,
        after.total_bytes - before.total_bytes,
    );
    println!("adaptive: {counted:?} (blocks, bytes) for {REQUESTS} admitted requests");
    counted
}

fn main() {
    let _profiler = dhat::Profiler::builder().testing().build();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _guard = metrics::set_default_local_recorder(&recorder);

    let big = 1_000_000;
    let mut cases = layers(&TokenBucket::new(big).unwrap());
    cases.extend(layers(&FixedWindow::new(big).unwrap()));
    cases.extend(layers(&SlidingWindow::new(big).unwrap()));
    let mut failed = Vec::new();
    for (name, layer) in &cases {
        let (blocks, bytes) = admitted_allocations(name, layer);
        if blocks != 0 {
            failed.push(format!("{name}: {blocks} allocations ({bytes} bytes)"));
        }
    }

    let (blocks, bytes) = adaptive_allocations();
    if blocks != 0 {
        failed.push(format!("adaptive: {blocks} allocations ({bytes} bytes)"));
    }

    // The recorder did see every request, so the handles were live, not no-ops.
    let admitted: u64 = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == ratelimit_layer::metric_names::REQUESTS_ADMITTED)
        .map(|(.., value)| match value {
            DebugValue::Counter(n) => n,
            _ => 0,
        })
        .sum();
    let expected = (cases.len() * (REQUESTS + 8)) as u64;
    assert_eq!(
        admitted, expected,
        "admitted requests counted by the recorder"
    );

    assert!(
        failed.is_empty(),
        "the admitted path allocated:\n{}",
        failed.join("\n")
    );
    println!("no_alloc: {} passed, 0 failed", cases.len() + 1);
}
