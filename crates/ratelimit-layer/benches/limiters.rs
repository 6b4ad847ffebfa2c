//! The limiters side by side with governor, in the same run.
//!
//! Rows (token bucket / GCRA on both sides):
//!
//! - `clock/now`: what reading each library's default clock costs;
//! - `single/allowed`, `single/denied`: one limiter, every call admitted / rejected;
//! - `keyed/hot_key`: a keyed limiter, always the same key;
//! - `keyed/100k_keys`: 100 000 known keys in turn;
//! - `keyed/new_key`: a key never seen before on every call (a fresh limiter per sample,
//!   so governor's unbounded map is dropped between samples; ours stays at its cap);
//! - `contended/*`: both threads of the machine calling the same limiter at once; the time
//!   is per call on each thread;
//! - `levels/*` (ours only): the decision a layer makes with criticality, every call
//!   admitted: the level noted in a `RecentLevels`, its held-back units read, then
//!   `check_holding_back`; `one_level` is the common case (nothing held back, as
//!   `single/allowed`), `held_back` a sheddable request while critical ones are active.
//!
//! Each row has three functions: `governor` (its default clock: quanta, reading the TSC),
//! `ratelimit-layer` (the same TSC clock, through our `Clock` trait: the algorithms and maps
//! compared on equal terms) and `ratelimit-layer-tokio-clock` (our default `TokioClock`).
//!
//! Run: `cargo bench -p ratelimit-layer --bench limiters -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::Barrier;
use std::time::Duration;

use criterion::{
    BenchmarkGroup, Criterion, criterion_group, criterion_main, measurement::WallTime,
};
use governor::{Quota, RateLimiter};
use ratelimit_layer::clock::{Clock, TokioClock};
use ratelimit_layer::keyed::KeyedLimiter;
use ratelimit_layer::{Limiter, RateLimitLayer, TokenBucket};
// NOTE: tokio's `Instant` is std's outside a paused runtime; the workspace bans std's by name.
use tokio::time::Instant;

/// governor's default clock (quanta, reading the TSC) behind our `Clock` trait.
#[derive(Clone)]
struct Tsc {
    clock: governor::clock::QuantaClock,
    /// The clock's zero, to turn its opaque instants into nanoseconds.
    origin: governor::clock::QuantaInstant,
}

impl Default for Tsc {
    fn default() -> Self {
        use governor::clock::{Clock as _, Reference as _};
        let clock = governor::clock::QuantaClock::default();
        let origin = clock
            .now()
            .saturating_sub(governor::nanos::Nanos::from(u64::MAX));
        Self { clock, origin }
    }
}

impl Clock for Tsc {
    #[inline]
    fn now(&self) -> u64 {
        use governor::clock::{Clock as _, Reference as _};
        self.clock.now().duration_since(self.origin).as_u64()
    }
}

const OURS: &str = "ratelimit-layer";
const OURS_TOKIO: &str = "ratelimit-layer-tokio-clock";
const GOVERNOR: &str = "governor";
const ALLOW_RATE: u32 = 1_000_000_000;
const KEYS: u64 = 100_000;

fn nz(n: u32) -> NonZeroU32 {
    NonZeroU32::new(n).unwrap()
}

/// Admits everything a benchmark can send: a billion per second, bursts of a billion.
fn allowing() -> (TokenBucket, Quota) {
    (
        TokenBucket::new(ALLOW_RATE).unwrap(),
        Quota::per_second(nz(ALLOW_RATE)).allow_burst(nz(ALLOW_RATE)),
    )
}

/// Admits one request per hour: after the first, everything is denied.
fn denying() -> (TokenBucket, Quota) {
    (
        TokenBucket::builder(1)
            .period(Duration::from_secs(3_600))
            .build()
            .unwrap(),
        Quota::per_hour(nz(1)),
    )
}

fn clocks(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    let tsc = Tsc::default();
    group.bench_function(format!("now/{OURS}"), |b| b.iter(|| black_box(tsc.now())));
    let tokio = TokioClock::new();
    group.bench_function(format!("now/{OURS_TOKIO}"), |b| {
        b.iter(|| black_box(tokio.now()));
    });
    let theirs = governor::clock::QuantaClock::default();
    group.bench_function(format!("now/{GOVERNOR}"), |b| {
        b.iter(|| black_box(governor::clock::Clock::now(&theirs)));
    });
    group.finish();
}

fn single_ours<C: Clock>(
    group: &mut BenchmarkGroup<'_, WallTime>,
    id: String,
    limiter: &TokenBucket,
    clock: &C,
    expect: bool,
) {
    let state = Default::default();
    let _ = limiter.check(&state, clock.now(), 1);
    assert_eq!(limiter.check(&state, clock.now(), 1).is_allowed(), expect);
    group.bench_function(id, |b| {
        b.iter(|| black_box(limiter.check(&state, clock.now(), 1)));
    });
}

fn single(c: &mut Criterion) {
    let mut group = c.benchmark_group("single");
    for (name, (ours, theirs), expect) in
        [("allowed", allowing(), true), ("denied", denying(), false)]
    {
        single_ours(
            &mut group,
            format!("{name}/{OURS}"),
            &ours,
            &Tsc::default(),
            expect,
        );
        let governor = RateLimiter::direct(theirs);
        let _ = governor.check();
        assert_eq!(governor.check().is_ok(), expect);
        group.bench_function(format!("{name}/{GOVERNOR}"), |b| {
            b.iter(|| black_box(governor.check()));
        });
        single_ours(
            &mut group,
            format!("{name}/{OURS_TOKIO}"),
            &ours,
            &TokioClock::new(),
            expect,
        );
    }
    group.finish();
}

fn ours_keyed<C: Clock>(clock: C, max_keys: usize) -> KeyedLimiter<TokenBucket, u64, C> {
    KeyedLimiter::builder(allowing().0)
        .clock(clock)
        .max_keys(max_keys)
        .build()
        .unwrap()
}

fn governor_keyed() -> governor::DefaultKeyedRateLimiter<u64> {
    RateLimiter::keyed(allowing().1)
}

fn next(i: &mut u64) -> u64 {
    *i = if *i + 1 == KEYS { 0 } else { *i + 1 };
    *i
}

fn new_key_ours<C: Clock + Clone>(group: &mut BenchmarkGroup<'_, WallTime>, name: &str, clock: &C) {
    group.bench_function(format!("new_key/{name}"), |b| {
        b.iter_custom(|iters| {
            let limiter = ours_keyed(clock.clone(), RateLimitLayer::DEFAULT_MAX_KEYS);
            let start = Instant::now();
            for k in 0..iters {
                let _ = black_box(limiter.check(&k, 1));
            }
            let elapsed = start.elapsed();
            drop(limiter);
            elapsed
        });
    });
}

// NOTE: in every row the three functions run back to back, so that they see the same load
// on a machine shared with other work.
fn keyed(c: &mut Criterion) {
    let mut group = c.benchmark_group("keyed");
    let (tsc, tokio) = (Tsc::default(), TokioClock::new());
    let ours = ours_keyed(tsc.clone(), 2 * KEYS as usize);
    let ours_tokio = ours_keyed(tokio, 2 * KEYS as usize);
    let theirs = governor_keyed();

    group.bench_function(format!("hot_key/{OURS}"), |b| {
        b.iter(|| black_box(ours.check(black_box(&42), 1)));
    });
    group.bench_function(format!("hot_key/{GOVERNOR}"), |b| {
        b.iter(|| black_box(theirs.check_key(black_box(&42))));
    });
    group.bench_function(format!("hot_key/{OURS_TOKIO}"), |b| {
        b.iter(|| black_box(ours_tokio.check(black_box(&42), 1)));
    });

    for k in 0..KEYS {
        let _ = ours.check(&k, 1);
        let _ = ours_tokio.check(&k, 1);
        let _ = theirs.check_key(&k);
    }
    let mut i = 0;
    group.bench_function(format!("100k_keys/{OURS}"), |b| {
        b.iter(|| black_box(ours.check(&next(&mut i), 1)));
    });
    group.bench_function(format!("100k_keys/{GOVERNOR}"), |b| {
        b.iter(|| black_box(theirs.check_key(&next(&mut i))));
    });
    group.bench_function(format!("100k_keys/{OURS_TOKIO}"), |b| {
        b.iter(|| black_box(ours_tokio.check(&next(&mut i), 1)));
    });
    drop((ours, ours_tokio, theirs));

    new_key_ours(&mut group, OURS, &tsc);
    group.bench_function(format!("new_key/{GOVERNOR}"), |b| {
        b.iter_custom(|iters| {
            let limiter = governor_keyed();
            let start = Instant::now();
            for k in 0..iters {
                let _ = black_box(limiter.check_key(&k));
            }
            let elapsed = start.elapsed();
            drop(limiter);
            elapsed
        });
    });
    new_key_ours(&mut group, OURS_TOKIO, &tokio);
    group.finish();
}

/// Runs `op(thread, i)` for `i in 0..iters` on two threads at once; the time until both
/// are done.
fn on_two_threads(iters: u64, op: impl Fn(u64, u64) + Sync) -> Duration {
    let barrier = Barrier::new(3);
    let start = std::thread::scope(|s| {
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
        // The scope joins both threads before returning.
        Instant::now()
    });
    start.elapsed()
}

fn contended(c: &mut Criterion) {
    let mut group = c.benchmark_group("contended");
    let (tsc, tokio) = (Tsc::default(), TokioClock::new());
    let limiter = allowing().0;
    let (state, state_tokio) = (Default::default(), Default::default());
    let governor = RateLimiter::direct(allowing().1);
    group.bench_function(format!("single_allowed/{OURS}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(limiter.check(&state, tsc.now(), 1));
            })
        });
    });
    group.bench_function(format!("single_allowed/{GOVERNOR}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(governor.check());
            })
        });
    });
    group.bench_function(format!("single_allowed/{OURS_TOKIO}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(limiter.check(&state_tokio, tokio.now(), 1));
            })
        });
    });

    let ours = ours_keyed(tsc, 2 * KEYS as usize);
    let ours_tokio = ours_keyed(tokio, 2 * KEYS as usize);
    let theirs = governor_keyed();
    group.bench_function(format!("hot_key/{OURS}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(ours.check(&42, 1));
            })
        });
    });
    group.bench_function(format!("hot_key/{GOVERNOR}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(theirs.check_key(&42));
            })
        });
    });
    group.bench_function(format!("hot_key/{OURS_TOKIO}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |_, _| {
                let _ = black_box(ours_tokio.check(&42, 1));
            })
        });
    });
    for k in 0..KEYS {
        let _ = ours.check(&k, 1);
        let _ = ours_tokio.check(&k, 1);
        let _ = theirs.check_key(&k);
    }
    let key = |t: u64, i: u64| (i + t * KEYS / 2) % KEYS;
    group.bench_function(format!("100k_keys/{OURS}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |t, i| {
                let _ = black_box(ours.check(&key(t, i), 1));
            })
        });
    });
    group.bench_function(format!("100k_keys/{GOVERNOR}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |t, i| {
                let _ = black_box(theirs.check_key(&key(t, i)));
            })
        });
    });
    group.bench_function(format!("100k_keys/{OURS_TOKIO}"), |b| {
        b.iter_custom(|iters| {
            on_two_threads(iters, |t, i| {
                let _ = black_box(ours_tokio.check(&key(t, i), 1));
            })
        });
    });
    group.finish();
}

fn levels(c: &mut Criterion) {
    use overload_signal::criticality::{RecentLevels, Reserves};
    use overload_signal::protocol::Criticality;
    let mut group = c.benchmark_group("levels");
    let (ours, _) = allowing();
    let clock = Tsc::default();
    let reserves = Reserves::new();
    for (name, level, seen) in [
        ("one_level", Criticality::Critical, Criticality::Critical),
        ("held_back", Criticality::Sheddable, Criticality::Critical),
    ] {
        let state = Default::default();
        let recent = RecentLevels::default();
        recent.note(seen, clock.now());
        let decide = || {
            let now = clock.now();
            recent.note(level, now);
            let held = recent.held_back(&reserves, level, ours.capacity(), now);
            ours.check_holding_back(&state, now, 1, held)
        };
        assert!(decide().is_allowed());
        group.bench_function(format!("{name}/{OURS}"), |b| b.iter(|| black_box(decide())));
    }
    group.finish();
}

criterion_group!(benches, clocks, single, keyed, contended, levels);
criterion_main!(benches);
