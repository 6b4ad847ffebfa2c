//! Per-request cost of the overload layer, side by side with its anchors in the same run:
//!
//! - `record/*`: reading the attempt counter and recording it in the histogram, against a
//!   bare atomic increment (the floor for any shared counter) and a read of the clock
//!   (which every record makes): tokio's clock (the default) and the coarse clock (the
//!   opt-in `clock::CoarseClock`), each with the histogram on that clock;
//! - `layer/*`: a request through `OverloadSignal` on the admitted path (the inner service
//!   answers 200), against the same inner service without the layer.
//!
//! Run with `cargo bench -p overload-signal --bench overload_signal -- --warm-up-time 1
//! --measurement-time 3`.

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};

use criterion::{Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use overload_signal::clock::{Clock, CoarseClock};
use overload_signal::protocol::{Attempt, X_REQUEST_ATTEMPT};
use overload_signal::{AttemptHistogram, OverloadSignalLayer};
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
    group.finish();
}

criterion_group!(benches, record, layer);
criterion_main!(benches);
