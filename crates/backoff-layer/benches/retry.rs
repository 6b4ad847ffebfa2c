//! The retry layer's cost on the happy path (first attempt succeeds), side by side with the
//! bare inner service in the same run.
//!
//! ```text
//! cargo bench -p backoff-layer --bench retry -- --warm-up-time 1 --measurement-time 3
//! ```

#![allow(missing_docs)]

use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use backoff_layer::RetryLayer;
use bytes::Bytes;
use criterion::{Criterion, criterion_group, criterion_main};
use futures_util::task::noop_waker_ref;
use http::{Request, Response};
use http_body::Body;
use http_body_util::{Empty, Full};
use overload_signal::criticality;
use overload_signal::protocol::Criticality;
use tower::{Layer, Service, ServiceExt};

/// An inner service that reads the whole request body (as a client would send it) and
/// answers `200` at once.
#[derive(Clone, Copy)]
struct Answer;

impl<B: Body + Unpin> Service<Request<B>> for Answer {
    type Response = Response<Empty<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let mut body = request.into_body();
        let mut cx = Context::from_waker(noop_waker_ref());
        let mut n = 0;
        while let Poll::Ready(Some(Ok(frame))) = Pin::new(&mut body).poll_frame(&mut cx) {
            if let Ok(data) = frame.into_data() {
                n += bytes::Buf::remaining(&data);
            }
        }
        black_box(n);
        ready(Ok(Response::new(Empty::new())))
    }
}

/// Drives a future that completes without waiting.
fn now<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(noop_waker_ref())) {
        Poll::Ready(out) => out,
        Poll::Pending => panic!("the happy path must not wait"),
    }
}

fn happy_path(c: &mut Criterion) {
    // A runtime context, for the timers of the layer with a deadline and a timeout.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();

    // The defaults include the 15 s deadline (issue 20): one clock read per request, and a
    // timer armed when an attempt first returns `Pending` (never here: `Answer` answers at
    // once). `no_deadline` is the layer without it, the defaults before issue 20.
    let defaults = RetryLayer::new().layer(Answer);
    // The defaults without the client-side throttle (issue 21): the defaults before it, so
    // the throttle's cost on the happy path is the difference in the same run.
    let no_throttle = RetryLayer::builder()
        .no_throttle()
        .build()
        .unwrap()
        .layer(Answer);
    let no_deadline = RetryLayer::builder()
        .no_deadline()
        .build()
        .unwrap()
        .layer(Answer);
    let timed = RetryLayer::builder()
        .attempt_timeout(Duration::from_secs(2))
        .deadline(Duration::from_secs(10))
        .build()
        .unwrap()
        .layer(Answer);

    let mut g = c.benchmark_group("retry_happy_path_get");
    let get = || {
        Request::get("http://127.0.0.1/api")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    g.bench_function("bare", |b| {
        b.iter(|| now(Answer.oneshot(black_box(get()))).unwrap());
    });
    g.bench_function("retry_defaults", |b| {
        b.iter(|| now(defaults.clone().oneshot(black_box(get()))).unwrap());
    });
    g.bench_function("retry_no_throttle", |b| {
        b.iter(|| now(no_throttle.clone().oneshot(black_box(get()))).unwrap());
    });
    g.bench_function("retry_no_deadline", |b| {
        b.iter(|| now(no_deadline.clone().oneshot(black_box(get()))).unwrap());
    });
    g.bench_function("retry_timeout_deadline", |b| {
        b.iter(|| now(timed.clone().oneshot(black_box(get()))).unwrap());
    });
    // A request asking for a level of criticality (issue 33): the level written in
    // `X-Request-Criticality`, and the throttle and budget deciding by it.
    g.bench_function("retry_defaults_with_level", |b| {
        b.iter(|| {
            let mut request = get();
            request.extensions_mut().insert(Criticality::Sheddable);
            now(defaults.clone().oneshot(black_box(request))).unwrap()
        });
    });
    // The same request sent from a task serving a request of a level (a handler behind
    // `CriticalityLayer`): the level read from the task-local scope too.
    g.bench_function("retry_defaults_in_scope", |b| {
        b.iter(|| {
            now(criticality::scope(
                Criticality::Critical,
                defaults.clone().oneshot(black_box(get())),
            ))
            .unwrap()
        });
    });
    g.finish();

    // A request that may not be retried (POST without Idempotency-Key): no copy of the
    // request's parts, no clone of the inner service.
    let mut g = c.benchmark_group("retry_happy_path_post");
    let post = || {
        Request::post("http://127.0.0.1/api")
            .body(Empty::<Bytes>::new())
            .unwrap()
    };
    g.bench_function("bare", |b| {
        b.iter(|| now(Answer.oneshot(black_box(post()))).unwrap());
    });
    g.bench_function("retry_defaults", |b| {
        b.iter(|| now(defaults.clone().oneshot(black_box(post()))).unwrap());
    });
    g.finish();

    let mut g = c.benchmark_group("retry_happy_path_put_1k");
    let payload = Bytes::from(vec![1u8; 1024]);
    let put = || {
        Request::put("http://127.0.0.1/api")
            .body(Full::new(payload.clone()))
            .unwrap()
    };
    g.bench_function("bare", |b| {
        b.iter(|| now(Answer.oneshot(black_box(put()))).unwrap());
    });
    g.bench_function("retry_defaults", |b| {
        b.iter(|| now(defaults.clone().oneshot(black_box(put()))).unwrap());
    });
    g.finish();

    // With a subscriber interested in the layer's spans (issue 35): a bare registry, which
    // keeps every span's data and discards it at its close, as any subscriber must. For
    // information only: every group above runs with no subscriber at all.
    // NOTE: last, because a subscriber set as the thread's default turns every callsite's
    // cached interest from "never" into "sometimes" for the rest of the process.
    let mut g = c.benchmark_group("retry_happy_path_get_subscribed");
    let subscriber = tracing_subscriber::registry();
    tracing::subscriber::with_default(subscriber, || {
        g.bench_function("bare", |b| {
            b.iter(|| now(Answer.oneshot(black_box(get()))).unwrap());
        });
        g.bench_function("retry_defaults", |b| {
            b.iter(|| now(defaults.clone().oneshot(black_box(get()))).unwrap());
        });
    });
    g.finish();
}

criterion_group!(benches, happy_path);
criterion_main!(benches);
