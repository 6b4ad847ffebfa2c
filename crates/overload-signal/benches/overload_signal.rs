//! Per-request cost of the overload layer, side by side with its anchors in the same run:
//!
//! - `record/*`: reading the attempt counter and recording it in the histogram, against a
//!   bare atomic increment (the floor for any shared counter) and a read of the clock
//!   (which every record makes): tokio's clock (the default) and the coarse clock (the
//!   opt-in `clock::CoarseClock`), each with the histogram on that clock;
//! - `layer/*`: a request through `OverloadSignal` on the admitted path (the inner service
//!   answers 200), against the same inner service without the layer; the same with a peer
//!   address to hash into a caller class (`_keyed`); and a rejection decided in a retry
//!   storm (`rejected_in_a_storm`: the inner service answers 429, the window is all retries
//!   from 64 callers, so the plain rule fires and the per-caller verdict is consulted);
//! - `layer/deadline_*`: the same admitted path through `DeadlineLayer`, beside the overload
//!   layer's: a request without a deadline (`_none`), one with `X-Request-Deadline`
//!   (`_admitted`: the header parsed, the time of day and tokio's clock read, the deadline put
//!   in the request's extensions and made the task's current one), and one whose deadline
//!   had passed (`_expired`: answered `504` without calling the service).
//!
//! Run with `cargo bench -p overload-signal --bench overload_signal -- --warm-up-time 1
//! --measurement-time 3` (`-- layer/` for the layers alone).

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::net::SocketAddr;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response, StatusCode};
use overload_core::clock::{Clock, CoarseClock};
use overload_signal::protocol::{Attempt, WireDeadline, X_REQUEST_ATTEMPT};
use overload_signal::{AttemptHistogram, DeadlineLayer, OverloadSignalLayer};
use tower::{Layer, Service, service_fn};

/// Polls a future that is ready at once (the services here never wait).
fn ready_now<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(output) => output,
        Poll::Pending => panic!("benchmarked services are always ready"),
    }
}

fn request() -> Request<()> {
    Request::builder()
        .uri("/api")
        .header(X_REQUEST_ATTEMPT, "1")
        .body(())
        .unwrap()
}

/// A request from peer 10.0.0.`n`.
fn from_peer(n: u8) -> Request<()> {
    let mut req = request();
    req.extensions_mut()
        .insert(SocketAddr::from(([10, 0, 0, n], 40_000)));
    req
}

fn record(c: &mut Criterion) {
    let mut group = c.benchmark_group("record");
    let counter = AtomicU64::new(0);
    group.bench_function("anchor_atomic_fetch_add", |b| {
        b.iter(|| counter.fetch_add(1, Ordering::Relaxed));
    });
    // Every record reads the clock once: the part of its cost that is the clock's.
    group.bench_function("anchor_tokio_instant_now", |b| {
        b.iter(tokio::time::Instant::now);
    });
    let coarse = CoarseClock::new();
    group.bench_function("anchor_coarse_clock", |b| b.iter(|| coarse.now()));
    let histogram = AttemptHistogram::new();
    group.bench_function("histogram_record", |b| {
        b.iter(|| histogram.record(black_box(Attempt::Number(1))));
    });
    let coarse_histogram = AttemptHistogram::builder()
        .clock(CoarseClock::new())
        .build()
        .unwrap();
    group.bench_function("histogram_record_coarse_clock", |b| {
        b.iter(|| coarse_histogram.record(black_box(Attempt::Number(1))));
    });
    let req = request();
    group.bench_function("parse_header_and_record", |b| {
        b.iter(|| histogram.record(Attempt::from_request(black_box(&req))));
    });
    group.bench_function("snapshot", |b| b.iter(|| histogram.snapshot()));
    group.finish();
}

fn layer(c: &mut Criterion) {
    let mut group = c.benchmark_group("layer");
    let inner = service_fn(|_req: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
    let mut bare = inner;
    group.bench_function("anchor_bare_service", |b| {
        b.iter_batched(
            request,
            |req| ready_now(bare.call(req)).unwrap(),
            criterion::BatchSize::SmallInput,
        );
    });
    let mut layered = OverloadSignalLayer::new().layer(inner);
    group.bench_function("overload_signal_admitted", |b| {
        b.iter_batched(
            request,
            |req| ready_now(layered.call(req)).unwrap(),
            criterion::BatchSize::SmallInput,
        );
    });
    let mut deadline = DeadlineLayer::new().layer(inner);
    group.bench_function("deadline_none", |b| {
        b.iter_batched(
            request,
            |req| ready_now(deadline.call(req)).unwrap(),
            criterion::BatchSize::SmallInput,
        );
    });
    let with_deadline = |ago: std::time::Duration| {
        let mut req = request();
        WireDeadline::new(
            std::time::SystemTime::now() - ago,
            std::time::Duration::from_secs(2),
        )
        .set(req.headers_mut());
        req
    };
    group.bench_function("deadline_admitted", |b| {
        b.iter_batched(
            || with_deadline(std::time::Duration::ZERO),
            |req| ready_now(deadline.call(req)).unwrap(),
            criterion::BatchSize::SmallInput,
        );
    });
    let expired = ready_now(deadline.call(with_deadline(std::time::Duration::from_secs(5))));
    assert_eq!(expired.unwrap().status(), StatusCode::GATEWAY_TIMEOUT);
    group.bench_function("deadline_expired", |b| {
        b.iter_batched(
            || with_deadline(std::time::Duration::from_secs(5)),
            |req| ready_now(deadline.call(req)).unwrap(),
            criterion::BatchSize::SmallInput,
        );
    });
    group.bench_function("overload_signal_admitted_keyed", |b| {
        b.iter_batched(
            || from_peer(7),
            |req| ready_now(layered.call(req)).unwrap(),
            criterion::BatchSize::SmallInput,
        );
    });
    let rejecting = service_fn(|_req: Request<()>| async {
        let mut r = Response::new(());
        *r.status_mut() = StatusCode::TOO_MANY_REQUESTS;
        Ok::<_, Infallible>(r)
    });
    let mut storm = OverloadSignalLayer::new().layer(rejecting);
    for n in 0..1_000u32 {
        ready_now(storm.call(from_peer((n % 64) as u8))).unwrap();
    }
    let answer = ready_now(storm.call(from_peer(0))).unwrap();
    assert!(
        overload_signal::protocol::is_stop_signal(answer.headers()),
        "the bench measures the stop-signal path"
    );
    let mut n = 0u8;
    group.bench_function("overload_signal_rejected_in_a_storm", |b| {
        b.iter_batched(
            || {
                n = n.wrapping_add(1) % 64;
                from_peer(n)
            },
            |req| ready_now(storm.call(req)).unwrap(),
            criterion::BatchSize::SmallInput,
        );
    });
    group.finish();
}

criterion_group!(benches, record, layer);
criterion_main!(benches);
