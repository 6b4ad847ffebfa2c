//! Retry budget cost: `RetryBudget` side by side with tower's `TpsBudget`, in the same run.
//!
//! - `clock`: `tokio::time::Instant::now()` alone, which both budgets read on every call:
//!   the floor under every other figure.
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
use tower::retry::budget::{Budget as TowerBudget, TpsBudget};

/// Both budgets behind one face, so every benchmark runs the same loop for each.
trait Subject: Send + Sync + 'static {
    fn put(&self);
    fn take(&self) -> bool;
}

impl Subject for RetryBudget {
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

/// Both budgets with the same settings: a 1 s window in 10 slots, no floor, `ratio`.
///
/// One second rather than the default ten: a tight loop of granted withdrawals would
/// otherwise reach `RetryBudget`'s cap of 2^27 retries per window on a fast machine, and
/// the cost of either budget does not depend on the window's length.
fn subjects(ratio: f32) -> [(&'static str, Arc<dyn Subject>); 2] {
    let ours = RetryBudget::builder()
        .ratio(f64::from(ratio))
        .window(Duration::from_secs(1))
        .slots(10)
        .min_retries_per_sec(0)
        .build()
        .expect("valid budget");
    let tower = TpsBudget::new(Duration::from_secs(1), 0, ratio);
    [
        ("RetryBudget", Arc::new(ours)),
        ("tower TpsBudget", Arc::new(tower)),
    ]
}

fn single_thread(c: &mut Criterion) {
    c.bench_function("clock", |bench| bench.iter(tokio::time::Instant::now));

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
