//! The limiters side by side with governor, in the same run.
//!
//! Rows (each `ratelimit-layer` vs `governor`, token bucket / GCRA on both sides, each with
//! its default real clock):
//!
//! - `single/allowed`, `single/denied`: one limiter, every call admitted / rejected;
//! - `keyed/hot_key`: a keyed limiter, always the same key;
//! - `keyed/100k_keys`: 100 000 known keys in turn;
//! - `keyed/new_key`: a key never seen before on every call (a fresh limiter per sample,
//!   so governor's unbounded map is dropped between samples);
//! - `contended/*`: both threads of the machine calling the same limiter at once; the time
//!   is per call on each thread.
//!
//! Run: `cargo bench -p ratelimit-layer --bench limiters -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::Duration;

// NOTE: tokio's `Instant` is std's outside a paused runtime; the workspace bans std's by name.
use tokio::time::Instant;

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use governor::{Quota, RateLimiter};
use ratelimit_layer::{Clock, KeyedLimiter, Limiter, RealClock, TokenBucket};

const ALLOW_RATE: u32 = 1_000_000_000;
const KEYS: u64 = 100_000;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// Admits everything a benchmark can send: a billion per second, bursts of a billion.
fn allowing() -> (TokenBucket, Quota) {
    (
        TokenBucket::per_second(ALLOW_RATE, ALLOW_RATE).unwrap(),
        Quota::per_second(nz(ALLOW_RATE)).allow_burst(nz(ALLOW_RATE)),
    )
}

/// Admits one request per hour: after the first, everything is denied.
fn denying() -> (TokenBucket, Quota) {
    (
        TokenBucket::new(1, Duration::from_secs(3_600), 1).unwrap(),
        Quota::per_hour(nz(1)),
    )
}

fn single(c: &mut Criterion) {
    let mut group = c.benchmark_group("single");
    for (name, (ours, theirs), expect) in
        [("allowed", allowing(), true), ("denied", denying(), false)]
    {
        let clock = RealClock::new();
        let state = Default::default();
        ours.check(&state, clock.now(), 1);
        assert_eq!(ours.check(&state, clock.now(), 1).is_allowed(), expect);
        group.bench_function(format!("{name}/ratelimit-layer"), |b| {
            b.iter(|| black_box(ours.check(&state, clock.now(), black_box(1))))
        });
        let governor = RateLimiter::direct(theirs);
        let _ = governor.check();
        assert_eq!(governor.check().is_ok(), expect);
        group.bench_function(format!("{name}/governor"), |b| {
            b.iter(|| black_box(governor.check()))
        });
    }
    group.finish();
}

fn ours_keyed(max_keys: usize) -> KeyedLimiter<TokenBucket, u64> {
    KeyedLimiter::new(allowing().0, max_keys)
}

fn governor_keyed() -> governor::DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(allowing().1)
}

fn keyed(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed");

    let ours = ours_keyed(2 * KEYS as usize);
    let theirs = governor_keyed();
    group.bench_function("hot_key/ratelimit-layer", |b| {
        b.iter(|| black_box(ours.check(black_box(&42), 1)))
    });
    group.bench_function("hot_key/governor", |b| {
        b.iter(|| black_box(theirs.check_key(black_box(&42))))
    });

    for k in 0..KEYS {
        ours.check(&k, 1);
        let _ = theirs.check_key(&k);
    }
    let mut i = 0u64;
    group.bench_function("100k_keys/ratelimit-layer", |b| {
        b.iter(|| {
            i = if i + 1 == KEYS { 0 } else { i + 1 };
            black_box(ours.check(&i, 1))
        })
    });
    let mut i = 0u64;
    group.bench_function("100k_keys/governor", |b| {
        b.iter(|| {
            i = if i + 1 == KEYS { 0 } else { i + 1 };
            black_box(theirs.check_key(&i))
        })
    });

    new_key(&mut group);
    group.finish();
}

fn new_key(group: &mut BenchmarkGroup<'_, WallTime>) {
    group.bench_function("new_key/ratelimit-layer", |b| {
        b.iter_custom(|iters| {
            let limiter = ours_keyed(ratelimit_layer::DEFAULT_MAX_KEYS);
            let start = Instant::now();
            for k in 0..iters {
                black_box(limiter.check(&k, 1));
            }
            let elapsed = start.elapsed();
            drop(limiter);
            elapsed
        })
    });
    group.bench_function("new_key/governor", |b| {
        b.iter_custom(|iters| {
            let limiter = governor_keyed();
            let start = Instant::now();
            for k in 0..iters {
                let _ = black_box(limiter.check_key(&k));
            }
            let elapsed = start.elapsed();
            drop(limiter);
            elapsed
        })
    });
}

/// Runs `op(thread, i)` for `i in 0..iters` on two threads at once; the time of the slower.
fn on_two_threads(iters: u64, op: impl Fn(u64, u64) + Sync) -> Duration {
    let barrier = Barrier::new(3);
    std::thread::scope(|s| {
        for t in 0..2 {
            let (barrier, op) = (&barrier, &op);
            s.spawn(move || {
                barrier.wait();
                for i in 0..iters {
                    op(t, i);
                }
            });
        }
        barrier.wait();
        let start = Instant::now();
        // The scope joins both threads before returning.
        start
    })
    .elapsed()
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended");
    let (ours, theirs) = allowing();
    let clock = RealClock::new();
    let state = Default::default();
    group.bench_function("single_allowed/ratelimit-layer", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                black_box(ours.check(&state, clock.now(), 1));
            })
        })
    });
    let governor = RateLimiter::direct(theirs);
    group.bench_function("single_allowed/governor", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(governor.check());
            })
        })
    });

    let ours = ours_keyed(2 * KEYS as usize);
    let theirs = governor_keyed();
    group.bench_function("hot_key/ratelimit-layer", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                black_box(ours.check(&42, 1));
            })
        })
    });
    group.bench_function("hot_key/governor", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(theirs.check_key(&42));
            })
        })
    });
    for k in 0..KEYS {
        ours.check(&k, 1);
        let _ = theirs.check_key(&k);
    }
    group.bench_function("100k_keys/ratelimit-layer", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |t, i| {
                black_box(ours.check(&((i + t * KEYS / 2) % KEYS), 1));
            })
        })
    });
    group.bench_function("100k_keys/governor", |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |t, i| {
                let _ = black_box(theirs.check_key(&((i + t * KEYS / 2) % KEYS)));
            })
        })
    });
    group.finish();
}

criterion_group!(benches, single, keyed, contended);
criterion_main!(benches);
