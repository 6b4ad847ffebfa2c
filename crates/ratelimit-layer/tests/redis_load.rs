//! The local reservation under load, through a Redis further away: a real `redis-server`
//! behind the tests' proxy, with latency added to every round trip, in real time.
//!
//! Its own test binary: it installs a global metrics recorder (the requests run on the
//! runtime's worker threads).

mod redis_support;

use std::convert::Infallible;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use metrics_util::debugging::DebuggingRecorder;
use ratelimit_layer::redis::RedisStore;
use ratelimit_layer::redis::testing::{BlackHoleProxy, RedisServer};
use ratelimit_layer::{RateLimitLayer, TokenBucket};
use redis_support::{Svc, read};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// The run, and the part of it counted as warm-up (reported apart).
const RUN: Duration = Duration::from_secs(10);
const WARM_UP: Duration = Duration::from_secs(1);
/// The requests in flight.
const CONCURRENCY: usize = 64;

/// Regression (issue 30, finding 6): with the reservation on, a request that waited for
/// another request's batch and found it spent then asked Redis itself with what was left
/// of its budget; that timeout was booked as a Redis failure, and one failure sent the
/// whole process local for a recheck interval. A Redis at 3 ms with the default 5 ms
/// budget flapped with the reservation, where it was fine without.
///
/// Redis behind the proxy with 3 ms added to every round trip; the default budget (5 ms)
/// and recheck interval; a limit nobody reaches (a million a second). 64 tasks each send
/// requests one after the other for 10 s, to a handler that takes a millisecond (a timer:
/// one to two), so that 64 requests are in flight, as a load generator at concurrency 64
/// keeps them: about 28 000 a second here, 100 in a 3.5 ms round trip. The reservation is
/// 2 000 units, what the module docs tell a user to choose: at least twice what the
/// process spends in a round trip (the next batch is asked for when half of the last is
/// left), for its slow round trips too (on this loaded machine, a round trip through the
/// proxy's threads takes up to 30 ms now and then: 1 000 units' worth); 0.2 % of the
/// limit per process. (With 1 000, one run in ten lost one round of the 64 requests to
/// such a stall.)
///
/// No request falls back after the first second, and Redis is never turned away. In the
/// first second, at most the 64 requests that wait for the first batch may fall back: that
/// round trip carries the script's code (`EVAL`), and on a machine loaded enough it passes
/// the 5 ms its waiters have (measured on a 2-core machine shared with other builds: one
/// timeout in one run of ten, none in the others; the code before the fix turned Redis
/// away in the first second of every run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_through_a_redis_at_3_ms_does_not_fall_back() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder.install().unwrap();
    let server = RedisServer::start();
    let proxy = BlackHoleProxy::start(server.addr());
    proxy.set_latency(Duration::from_millis(3));
    let store = RedisStore::new(&proxy.url()).unwrap();
    store.ping().await.unwrap();
    let limit = TokenBucket::builder(1_000_000)
        .burst(100_000)
        .build()
        .unwrap();
    let svc = Svc::new(
        RateLimitLayer::builder(limit)
            .redis(store)
            .reservation(2_000)
            .build()
            .unwrap()
            .layer(handler()),
    );
    let _ = read(&snapshotter);
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let svc = svc.clone();
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                while started.elapsed() < RUN {
                    let sent = Instant::now();
                    let response = svc.clone().oneshot(Request::new(())).await.unwrap();
                    assert_eq!(response.status(), StatusCode::OK);
                    latencies.push(sent.elapsed());
                }
                latencies
            })
        })
        .collect();
    tokio::time::sleep(WARM_UP).await;
    let warm_up = read(&snapshotter).fallbacks;
    let mut latencies = Vec::new();
    for task in tasks {
        latencies.extend(task.await.unwrap());
    }
    let after = read(&snapshotter).fallbacks;
    latencies.sort_unstable();
    let at = |q: f64| {
        let index = (latencies.len() - 1) as f64 * q;
        latencies[index as usize]
    };
    println!(
        "{} requests in {:?}, {} script calls; round trip with the layer p50 {:?}, p99 {:?}, \
         p99.9 {:?}, max {:?}; fallbacks (timeout, error, unavailable) in the first {WARM_UP:?} \
         {warm_up:?}, after {after:?}",
        latencies.len(),
        started.elapsed(),
        script_calls(&server),
        at(0.5),
        at(0.99),
        at(0.999),
        latencies.last().unwrap(),
    );
    assert_eq!(after, [0, 0, 0], "no fallback after the warm-up");
    assert_eq!(
        warm_up[1..],
        [0, 0],
        "no error, and Redis never turned away, in the warm-up"
    );
    assert!(
        warm_up[0] <= CONCURRENCY as u64,
        "in the warm-up, at most the requests waiting for the first batch fall back"
    );
}

/// A handler that takes a millisecond (a timer of the runtime: one to two), as one that
/// reads a cache or a database would.
fn handler() -> Svc {
    Svc::new(tower::service_fn(|_: Request<()>| async {
        tokio::time::sleep(Duration::from_millis(1)).await;
        Ok::<_, Infallible>(Response::new("ok".to_owned()))
    }))
}

/// The calls of `EVALSHA` (and `EVAL`) a server has run, from `INFO commandstats`.
fn script_calls(server: &RedisServer) -> u64 {
    server
        .info("commandstats")
        .lines()
        .filter(|line| line.starts_with("cmdstat_evalsha:") || line.starts_with("cmdstat_eval:"))
        .filter_map(|line| line.split("calls=").nth(1))
        .filter_map(|rest| rest.split(',').next())
        .filter_map(|n| n.parse::<u64>().ok())
        .sum()
}
