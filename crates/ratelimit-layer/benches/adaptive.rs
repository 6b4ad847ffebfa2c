//! What the adaptive limit costs a request, through the layer's service, on one thread.
//!
//! Rows (group `adaptive`), each a `call` and the poll of its ready response, the request
//! built outside the timing:
//!
//! - `admitted/no_level`: requests with no `Criticality` (all `critical`): the path of a
//!   server that sets no levels;
//! - `admitted/sheddable_beside_critical`: `sheddable` and `critical` requests in turn
//!   (each level active, so each `sheddable` request is decided against its part of the
//!   limit);
//! - `rejected/full`: the limit held full (20 requests in flight), every request rejected.
//!
//! The inner service answers at once, so the rows time the limit and the future alone.
//! Run: `cargo bench -p ratelimit-layer --bench adaptive -- --warm-up-time 1 --measurement-time 3`

use std::convert::Infallible;
use std::future::Future;
use std::hint::black_box;
use std::pin::{Pin, pin};
use std::task::{Context, Poll, Waker};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use overload_signal::protocol::Criticality;
use ratelimit_layer::AdaptiveLimitLayer;
use tower::{Layer, Service, service_fn};

/// Marks a request the inner service never answers: it holds its slot.
#[derive(Clone, Copy)]
struct Hold;

type Inner = Pin<Box<dyn Future<Output = Result<Response<()>, Infallible>> + Send>>;

// NOTE: by value, as a service takes its request: dropping it is part of every row.
#[allow(clippy::needless_pass_by_value)]
fn inner(request: Request<()>) -> Inner {
    let hold = request.extensions().get::<Hold>().is_some();
    Box::pin(async move {
        if hold {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(()))
    })
}

fn request(level: Option<Criticality>) -> Request<()> {
    let mut request = Request::new(());
    if let Some(level) = level {
        request.extensions_mut().insert(level);
    }
    request
}

/// Calls `service` with `request` and polls its response once; returns its status.
fn one<S>(service: &mut S, request: Request<()>) -> u16
where
    S: Service<Request<()>, Response = Response<()>, Error = Infallible>,
{
    let mut cx = Context::from_waker(Waker::noop());
    let future = pin!(service.call(request));
    match future.poll(&mut cx) {
        Poll::Ready(Ok(response)) => response.status().as_u16(),
        _ => unreachable!("the inner service answers at once"),
    }
}

fn adaptive(c: &mut Criterion) {
    // NOTE: in a runtime, as in a server: the layer's tick is spawned on it (and never runs
    // here, the runtime being idle), so admissions are counted on their stripes.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let mut group = c.benchmark_group("adaptive");

    let layer = AdaptiveLimitLayer::new();
    let mut service = layer.layer(service_fn(inner));
    assert_eq!(one(&mut service, request(None)), 200);
    group.bench_function("admitted/no_level", |b| {
        b.iter_batched(
            || request(None),
            |request| black_box(one(&mut service, request)),
            BatchSize::SmallInput,
        );
    });

    let layer = AdaptiveLimitLayer::new();
    let mut service = layer.layer(service_fn(inner));
    let mut turn = 0_u64;
    group.bench_function("admitted/sheddable_beside_critical", |b| {
        b.iter_batched(
            || {
                turn += 1;
                request(Some(if turn % 2 == 0 {
                    Criticality::Sheddable
                } else {
                    Criticality::Critical
                }))
            },
            |request| black_box(one(&mut service, request)),
            BatchSize::SmallInput,
        );
    });

    let layer = AdaptiveLimitLayer::new();
    let mut service = layer.layer(service_fn(inner));
    let held: Vec<_> = (0..AdaptiveLimitLayer::DEFAULT_INITIAL_LIMIT)
        .map(|_| {
            let mut request = request(None);
            request.extensions_mut().insert(Hold);
            Box::pin(service.call(request))
        })
        .collect();
    assert_eq!(one(&mut service, request(None)), 503);
    group.bench_function("rejected/full", |b| {
        b.iter_batched(
            || request(None),
            |request| black_box(one(&mut service, request)),
            BatchSize::SmallInput,
        );
    });
    drop(held);
    group.finish();
}

criterion_group!(benches, adaptive);
criterion_main!(benches);
