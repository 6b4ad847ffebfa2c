//! Decision latency, p50 / p99 / p99.9: a request through `RateLimitLayer` with the limit
//! kept in Redis on 127.0.0.1, side by side with the same layer deciding locally, in one
//! run. Batches alternate between the two so that both see the same machine.
//!
//! ```sh
//! cargo bench -p ratelimit-layer --features redis,test-util --bench redis_latency
//! cargo bench -p ratelimit-layer --features redis,test-util --bench redis_latency -- --test  # smoke run
//! ```
//!
//! It starts its own `redis-server` (as the tests do). The limit is one nobody reaches, so
//! every decision admits and writes, the costlier path in Redis.

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response};
use ratelimit_layer::redis::RedisStore;
use ratelimit_layer::redis::testing::RedisServer;
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceExt, service_fn};

type Svc = tower::util::BoxService<Request<()>, Response<()>, Infallible>;

/// Times `n` sequential requests through `svc`, in nanoseconds each.
async fn time(svc: &mut Svc, n: usize, into: &mut Vec<u64>) {
    for _ in 0..n {
        let started = Instant::now();
        let response = svc.ready().await.unwrap().call(Request::new(())).await;
        let took = started.elapsed();
        assert_eq!(response.unwrap().status(), 200);
        into.push(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX));
    }
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let index = ((sorted.len() - 1) as f64 * p).round() as usize;
    Duration::from_nanos(sorted[index])
}

fn main() {
    let smoke = std::env::args().any(|a| a == "--test");
    let (rounds, batch) = if smoke { (2, 100) } else { (20, 5_000) };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let server = RedisServer::start();
    runtime.block_on(async {
        let ok = || service_fn(|_: Request<()>| async { Ok::<_, Infallible>(Response::new(())) });
        let limit = || {
            TokenBucket::builder(1_000_000)
                .burst(1_000_000)
                .build()
                .unwrap()
        };
        let mut local = Svc::new(RateLimitLayer::new(limit()).layer(ok()));
        let store = RedisStore::new(&server.url()).unwrap();
        store.ping().await.unwrap();
        let mut redis = Svc::new(
            RateLimitLayer::builder(limit())
                .redis(store)
                // NOTE: a budget nobody reaches, so that every timed decision is Redis's.
                .budget(Duration::from_secs(1))
                .build()
                .unwrap()
                .layer(ok()),
        );
        // Warm-up: the connection, the script, the metric handles.
        let mut ignored = Vec::new();
        time(&mut local, batch, &mut ignored).await;
        time(&mut redis, batch, &mut ignored).await;
        let (mut l, mut r) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            time(&mut local, batch, &mut l).await;
            time(&mut redis, batch, &mut r).await;
        }
        l.sort_unstable();
        r.sort_unstable();
        println!("decisions per case: {}", l.len());
        println!("{:<28} {:>10} {:>10} {:>10}", "case", "p50", "p99", "p99.9");
        for (name, v) in [
            ("local token bucket", &l),
            ("redis token bucket (GCRA)", &r),
        ] {
            println!(
                "{name:<28} {:>10.1?} {:>10.1?} {:>10.1?}",
                percentile(v, 0.5),
                percentile(v, 0.99),
                percentile(v, 0.999)
            );
        }
    });
}
