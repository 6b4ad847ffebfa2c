//! Retry budget cost: `RetryBudget` side by side with tower's `TpsBudget`, in the same run.
//!
//! What is compared, per operation:
//!
//! - `RetryBudget/tokio_clock` against `tower TpsBudget`: like with like. Both read tokio's
//!   clock (`tokio::time::Instant::now()`) on every call, so the difference is the budgets'
//!   own work: a striped compare-and-swap and a window sum against a mutex and a sum.
//! - `RetryBudget/coarse_clock`: the same budget on `overload_core::clock::CoarseClock`
//!   (the kernel's coarse monotonic clock, one tick of 1 to 10 ms resolution), the opt-in
//!   for callers whose clock read is most of the cost. `TpsBudget` has no such option; the
//!   `clock` group shows what each clock read costs alone.
//!
//! All three with the same settings: a 1 s window in 10 slots, no floor.
//!
//! - `clock/*`: one read of each clock, the floor under the other figures.
//! - `deposit`: one first attempt recorded, one thread.
//! - `withdraw_refused`: a withdrawal from an empty budget (the common case when a
//!   dependency is failing and the budget has run out), one thread.
//! - `deposit_withdraw`: a deposit and a withdrawal (ratio 1, so almost always granted),
//!   one thread.
//! - `deposit_2_threads`, `deposit_withdraw_2_threads`: a deposit, or the pair, on two
//!   threads sharing one budget; the time is per operation on each thread, wall clock for
//!   both threads together.
//!
//! Run with `cargo bench -p backoff-layer --bench budget -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use backoff_layer::budget::{Budget, RetryBudget};
use criterion::{Criterion, criterion_group, criterion_main};
use overload_core::clock::{Clock, CoarseClock, TokioClock};
use tower::retry::budget::{Budget as TowerBudget, TpsBudget};

/// The budgets behind one face, so every benchmark runs the same loop for each.
trait Subject: Send + Sync + 'static {
    fn put(&self);
    fn take(&self) -> bool;
}

impl<C: Clock> Subject for RetryBudget<C> {
    fn put(&self) {
        Budget::deposit(self);
    }
    fn take(&self) -> bool {
        Budget::withdraw(self)
    }
}

impl Subject for TpsBudget {
    fn put(&self) {
        TowerBudget::deposit(self);
    }
    fn take(&self) -> bool {
        TowerBudget::withdraw(self)
    }
}

/// The budgets with the same settings: a 1 s window in 10 slots, no floor, `ratio`.
///
/// One second rather than the default ten: the cost of either budget does not depend on the
/// window's length, and a tight loop of granted withdrawals stays far below `RetryBudget`'s
/// cap of 2^24 retries per slot (100 ms here).
fn subjects(ratio: f32) -> [(&'static str, Arc<dyn Subject>); 3] {
    let ours = || {
        RetryBudget::builder()
            .ratio(f64::from(ratio))
            .window(Duration::from_secs(1))
            .slots(10)
            .min_retries_per_sec(0)
    };
    let tokio_clock = ours().build().expect("valid budget");
    let coarse_clock = ours()
        .clock(CoarseClock::new())
        .build()
        .expect("valid budget");
    let tower = TpsBudget::new(Duration::from_secs(1), 0, ratio);
    [
        ("RetryBudget/tokio_clock", Arc::new(tokio_clock)),
        ("RetryBudget/coarse_clock", Arc::new(coarse_clock)),
        ("tower TpsBudget", Arc::new(tower)),
    ]
}

fn single_thread(c: &mut Criterion) {
    let mut group = c.benchmark_group("clock");
    let tokio_clock = TokioClock::new();
    group.bench_function("tokio", |bench| bench.iter(|| tokio_clock.now()));
    let coarse_clock = CoarseClock::new();
    group.bench_function("coarse", |bench| bench.iter(|| coarse_clock.now()));
    group.finish();

    let mut group = c.benchmark_group("deposit");
    for (name, b) in subjects(0.1) {
        group.bench_function(name, |bench| bench.iter(|| b.put()));
    }
    group.finish();

    let mut group = c.benchmark_group("withdraw_refused");
    for (name, b) in subjects(0.0) {
        group.bench_function(name, |bench| bench.iter(|| black_box(b.take())));
    }
    group.finish();

    let mut group = c.benchmark_group("deposit_withdraw");
    for (name, b) in subjects(1.0) {
        group.bench_function(name, |bench| {
            bench.iter(|| {
                b.put();
                // Granted, except just after a slot boundary that split a pair: the
                // deposit has left the window, its withdrawal not yet. Both budgets
                // refuse then.
                black_box(b.take())
            });
        });
    }
    group.finish();
}

/// Runs `op` `iters` times on each of two threads sharing `b`; the wall time for both.
fn on_two_threads(b: &Arc<dyn Subject>, iters: u64, op: fn(&dyn Subject)) -> Duration {
    let start = Arc::new(Barrier::new(3));
    let workers: Vec<_> = (0..2)
        .map(|_| {
            let b = Arc::clone(b);
            let start = Arc::clone(&start);
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..iters {
                    op(&*b);
                }
            })
        })
        .collect();
    start.wait();
    // Outside a runtime, tokio's clock is the wall clock.
    let began = tokio::time::Instant::now();
    for w in workers {
        w.join().expect("worker");
    }
    began.elapsed()
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("deposit_2_threads");
    for (name, b) in subjects(0.1) {
        group.bench_function(name, |bench| {
            bench.iter_custom(|iters| on_two_threads(&b, iters, |b| b.put()));
        });
    }
    group.finish();

    let mut group = c.benchmark_group("deposit_withdraw_2_threads");
    for (name, b) in subjects(1.0) {
        group.bench_function(name, |bench| {
            bench.iter_custom(|iters| {
                on_two_threads(&b, iters, |b| {
                    b.put();
                    // The other thread may take this thread's retry first; both budgets
                    // then refuse, which is part of the cost.
                    black_box(b.take());
                })
            });
        });
    }
    group.finish();
}

criterion_group!(benches, single_thread, two_threads);
criterion_main!(benches);
