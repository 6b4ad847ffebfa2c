//! What the full stack costs per request, in process: `app()` with the `instant` model, bare
//! and behind the overload layer and the rate limiter, side by side in one run.
//!
//! `cargo bench -p demo-server --bench stack`

use std::hint::black_box;
use std::net::SocketAddr;

use axum::Router;
use axum::body::Body;
use criterion::{Criterion, criterion_group, criterion_main};
use demo_server::app::{AppConfig, Stack, app};
use demo_server::model::{LatencyModel, Model};
use http::Request;
use overload_signal::OverloadSignalLayer;
use ratelimit_layer::config::RateLimitConfig;
use tower::ServiceExt;

fn router(stack: Stack) -> Router {
    app(AppConfig::new(Model::new(LatencyModel::Instant)).stack(stack))
}

fn full(rate: u32, burst: u32) -> Stack {
    Stack::Full {
        overload: OverloadSignalLayer::default(),
        rate_limit: RateLimitConfig {
            rate,
            burst: Some(burst),
            ..RateLimitConfig::default()
        }
        .layer()
        .expect("valid limit")
        .into(),
    }
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut group = c.benchmark_group("api");
    let peer: SocketAddr = "127.0.0.1:40000".parse().expect("an address");
    let cases = [
        ("bare", router(Stack::None)),
        (
            "full stack, admitted",
            router(full(100_000_000, 100_000_000)),
        ),
        // One token a second: after the first request every call is rejected.
        ("full stack, rejected", router(full(1, 1))),
    ];
    for (name, router) in cases {
        group.bench_function(name, |b| {
            b.iter(|| {
                let mut request = Request::get("/api").body(Body::empty()).expect("request");
                // What the demo server's connections insert: the overload layer keys by it.
                request.extensions_mut().insert(peer);
                let response = runtime
                    .block_on(router.clone().oneshot(request))
                    .expect("infallible");
                black_box(response.status())
            });
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
