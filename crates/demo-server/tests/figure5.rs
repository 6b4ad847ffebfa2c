//! The paper's figure 5: the M/M/10 server with and without a token bucket at 183 req/s,
//! under Poisson load slightly above it, in virtual time.
//!
//! The paper's server (10 workers, 50 ms mean service) saturates at 200 req/s. Its figure 4
//! says response times stay under 200 ms up to 183 req/s, pass 1 s at +5% and 10 s at +7.5%.
//! A limiter at 183 req/s keeps the admitted load at the good point whatever is offered.
//!
//! Figures this test prints (seeded, so every run prints the same):
//!
//! | offered | limiter | served | mean | p99 |
//! |---|---|---|---|---|
//! | 197 req/s | token bucket 183/s, burst 10 | 90.7% | 68 ms | 255 ms |
//! | 197 req/s | none | 100% | 268 ms | 629 ms |
//! | 183 req/s | token bucket 183/s, burst 10 | 95.1% | 64 ms | 249 ms |
//! | 183 req/s | none | 100% | 78 ms | 269 ms |
//!
//! Erlang C (steady state) for this server gives a mean response time of 92 ms at 183 req/s
//! (p99 343 ms), 157 ms at 192 req/s (+5%, p99 620 ms) and 365 ms at 197 req/s (+7.5%, p99
//! 1.57 s). The paper's printed thresholds (over 1 s at +5%, over 10 s at +7.5%) are far above
//! these; they match neither the mean nor the p99 of the M/M/10 steady state.

use std::time::Duration;

use demo_server::model::{LatencyModel, MmcModel, Model};
use http::{Request, StatusCode};
use rand::SeedableRng;
use rand::rngs::SmallRng;
use rand_distr::{Distribution, Exp};
use ratelimit_layer::config::RateLimitConfig;
use tokio::time::{Instant, sleep_until};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

type Server = BoxCloneSyncService<Request<()>, StatusCode, BoxError>;

fn model() -> Model {
    let mmc = MmcModel::builder().seed(5).build().unwrap();
    Model::new(LatencyModel::Mmc(mmc))
}

fn bare(model: Model) -> Server {
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .map_response(|r: http::Response<_>| r.status())
            .map_err(BoxError::from)
            .service(model),
    )
}

fn limited(model: Model, rate: u32, burst: u32) -> Server {
    let layer = RateLimitConfig {
        rate,
        burst: Some(burst),
        ..RateLimitConfig::default()
    }
    .layer()
    .unwrap();
    BoxCloneSyncService::new(
        ServiceBuilder::new()
            .map_response(|r: http::Response<_>| r.status())
            .map_err(BoxError::from)
            .layer(layer)
            .service(model),
    )
}

struct Outcome {
    offered: usize,
    served: usize,
    p99: Duration,
    mean: Duration,
}

/// `n` Poisson arrivals at `rate` per second; response times of the served requests.
async fn offer(server: &Server, rate: f64, n: usize, seed: u64) -> Outcome {
    let mut rng = SmallRng::seed_from_u64(seed);
    let gaps = Exp::new(rate).unwrap();
    let start = Instant::now();
    let mut at = 0.0;
    let mut handles = Vec::with_capacity(n);
    for _ in 0..n {
        at += gaps.sample(&mut rng);
        sleep_until(start + Duration::from_secs_f64(at)).await;
        let server = server.clone();
        handles.push(tokio::spawn(async move {
            let sent = Instant::now();
            let status = server.oneshot(Request::new(())).await.unwrap();
            (status, sent.elapsed())
        }));
    }
    let mut served = Vec::new();
    for h in handles {
        let (status, took) = h.await.unwrap();
        match status {
            StatusCode::OK => served.push(took),
            StatusCode::TOO_MANY_REQUESTS => {}
            other => panic!("unexpected status {other}"),
        }
    }
    served.sort();
    let p99 = served[served.len() * 99 / 100];
    let mean = served.iter().sum::<Duration>() / u32::try_from(served.len()).unwrap();
    Outcome {
        offered: n,
        served: served.len(),
        p99,
        mean,
    }
}

fn report(label: &str, o: &Outcome) {
    println!(
        "{label}: served {} of {} ({:.1}%), mean {:.0} ms, p99 {:.0} ms",
        o.served,
        o.offered,
        100.0 * o.served as f64 / o.offered as f64,
        o.mean.as_secs_f64() * 1e3,
        o.p99.as_secs_f64() * 1e3
    );
}

// 20 000 requests at 197 req/s: about 100 s of virtual time.
const N: usize = 20_000;

#[tokio::test(start_paused = true)]
async fn token_bucket_at_183_keeps_p99_bounded_at_197_offered() {
    let with = offer(&limited(model(), 183, 10), 197.0, N, 1).await;
    report("token bucket 183/s, 197 req/s offered", &with);
    let without = offer(&bare(model()), 197.0, N, 1).await;
    report("no limiter, 197 req/s offered", &without);

    // About 183/197 = 92.9% are served: the bucket admits at most 183/s plus its burst, and a
    // little less when Poisson gaps leave it full.
    let share = with.served as f64 / N as f64;
    assert!((0.89..=0.935).contains(&share), "served share {share}");
    // The served requests see the M/M/10 server at or below 183 req/s.
    assert!(with.p99 < Duration::from_millis(600), "{:?}", with.p99);
    // Without the limiter every request is served, and the queue at 98.5% load is long. The
    // run starts from an empty queue and lasts 100 s, shorter than the queue's relaxation
    // time at this load (about 90 s), so it is still below the Erlang C steady state (mean
    // 365 ms, p99 1.57 s); it is far above the limited server already.
    assert_eq!(without.served, N);
    assert!(
        without.p99 > with.p99 * 2,
        "{:?} vs {:?}",
        without.p99,
        with.p99
    );
    assert!(
        without.mean > with.mean * 3,
        "{:?} vs {:?}",
        without.mean,
        with.mean
    );
}

#[tokio::test(start_paused = true)]
async fn token_bucket_at_183_with_183_offered() {
    let with = offer(&limited(model(), 183, 10), 183.0, N, 2).await;
    report("token bucket 183/s, 183 req/s offered", &with);
    let without = offer(&bare(model()), 183.0, N, 2).await;
    report("no limiter, 183 req/s offered", &without);
    // At the limit, Poisson bursts above the bucket's 10 are cut: a few percent.
    let share = with.served as f64 / N as f64;
    assert!((0.9..=1.0).contains(&share), "served share {share}");
    assert!(
        with.p99 <= without.p99,
        "{:?} vs {:?}",
        with.p99,
        without.p99
    );
    assert!(with.p99 < Duration::from_millis(600), "{:?}", with.p99);
}
