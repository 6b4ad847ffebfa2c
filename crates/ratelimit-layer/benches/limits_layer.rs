//! What a limits file's layer costs a request beside one `RateLimitLayer`, through the
//! layer's service, on one thread.
//!
//! Rows (group `limits_layer`), each a `call` and the poll of its ready response, the request
//! built outside the timing, every request admitted (a limit too high to reject), keyed by
//! client IP (one address):
//!
//! - `rate_limit/token_bucket`: a `RateLimitLayer` over a `TokenBucket`, keyed by client IP:
//!   the anchor;
//! - `rate_limit/live_token_bucket`: the same over a `LiveTokenBucket` (one more atomic load
//!   for the parameters, one for the key's generation);
//! - `limits_layer/default`: a `LimitsLayer` whose file has a tenant header, two prefixes,
//!   an exact route and a tenant, for a request that none of them names (the table's load,
//!   the tenant header looked up, the exact map and the prefixes searched, then the
//!   default's limit);
//! - `limits_layer/tenant`: the same layer, a request of the tenant.
//!
//! The inner service answers at once, so the rows time the limits and the future alone.
//! Run: `cargo bench -p ratelimit-layer --bench limits_layer -- --warm-up-time 1 --measurement-time 3`

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use http::{Request, Response};
use ratelimit_layer::algorithm::LiveTokenBucket;
use ratelimit_layer::clock::TokioClock;
use ratelimit_layer::key::ClientIp;
use ratelimit_layer::limits_file::{Limits, LimitsLayer};
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tower::{Layer, Service, service_fn};

const RATE: u32 = 1_000_000_000;

const FILE: &str = r#"
tenant_header = "x-tenant"
[default]
rate = 1000000000
[[route]]
prefix = "/api/"
rate = 1000000000
[[route]]
prefix = "/api/admin/"
rate = 1000000000
[[route]]
exact = "/health"
rate = 1000000000
[tenant.acme]
rate = 1000000000
"#;

#[allow(clippy::needless_pass_by_value)]
fn inner(_: Request<()>) -> Ready<Result<Response<()>, Infallible>> {
    ready(Ok(Response::new(())))
}

fn request(path: &str, tenant: Option<&str>) -> Request<()> {
    let mut request = Request::get(path).body(()).unwrap();
    request
        .extensions_mut()
        .insert(SocketAddr::from(([192, 0, 2, 1], 4000)));
    if let Some(tenant) = tenant {
        request
            .headers_mut()
            .insert("x-tenant", tenant.parse().unwrap());
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

fn row<S>(
    c: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    name: &str,
    service: &mut S,
    path: &str,
    tenant: Option<&str>,
) where
    S: Service<Request<()>, Response = Response<()>, Error = Infallible>,
{
    assert_eq!(one(service, request(path, tenant)), 200);
    c.bench_function(name, |b| {
        b.iter_batched(
            || request(path, tenant),
            |request| one(service, request),
            BatchSize::SmallInput,
        );
    });
}

fn limits_layer(c: &mut Criterion) {
    // NOTE: in a runtime, as in a server: the layers' ticks are spawned on it (and never
    // run here, the runtime being idle).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let _entered = runtime.enter();
    let mut group = c.benchmark_group("limits_layer");
    let bucket = || TokenBucket::new(RATE).unwrap();

    let layer = RateLimitLayer::builder(bucket())
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap();
    let mut service = layer.layer(service_fn(inner));
    row(
        &mut group,
        "rate_limit/token_bucket",
        &mut service,
        "/x",
        None,
    );

    let clock = TokioClock::new();
    let (live, _handle) = LiveTokenBucket::new(bucket(), clock);
    let layer = RateLimitLayer::builder(live)
        .clock(clock)
        .key_by_client_ip(ClientIp::new())
        .build()
        .unwrap();
    let mut service = layer.layer(service_fn(inner));
    row(
        &mut group,
        "rate_limit/live_token_bucket",
        &mut service,
        "/x",
        None,
    );

    let limits = Limits::parse("limits.toml", FILE).unwrap();
    let layer = LimitsLayer::builder().build(&limits).unwrap();
    let mut service = layer.layer(service_fn(inner));
    row(&mut group, "limits_layer/default", &mut service, "/x", None);
    row(
        &mut group,
        "limits_layer/tenant",
        &mut service,
        "/api/items",
        Some("acme"),
    );
    group.finish();
}

criterion_group!(benches, limits_layer);
criterion_main!(benches);
