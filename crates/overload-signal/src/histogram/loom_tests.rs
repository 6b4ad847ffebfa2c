//! Model tests of the attempt histogram under loom: no record is lost, whatever the
//! interleaving of records, a bucket move and the reset of the counters it reuses.
//!
//! `RUSTFLAGS="--cfg loom" cargo test -p overload-signal --lib --release loom`

use std::time::Duration;

use loom::sync::Arc;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::thread;

use super::{AttemptClass, AttemptHistogram};
use crate::protocol::Attempt;
use overload_core::clock::Clock;

#[derive(Clone)]
struct LoomClock(Arc<AtomicU64>);

impl Clock for LoomClock {
    fn now(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    // Every interleaving: the models are small enough (seconds in all).
    builder.preemption_bound = None;
    builder.max_branches = 10_000;
    builder.check(f);
}

/// Two buckets of 1 ms: a retry and a first try recorded at once, in the same bucket (the
/// same class counters of two stripes), while the other thread's second record starts the
/// next bucket.
#[test]
fn loom_histogram_records_across_a_bucket_move_lose_nothing() {
    model(|| {
        let clock = LoomClock(Arc::new(AtomicU64::new(0)));
        let h = AttemptHistogram::builder()
            .window(Duration::from_millis(2))
            .buckets(2)
            .clock(clock.clone())
            .build()
            .unwrap();
        let other = {
            let (h, clock) = (h.clone(), clock.clone());
            thread::spawn(move || {
                h.record(Attempt::Number(1));
                clock.0.fetch_add(1_000_000, Ordering::Release);
                h.record(Attempt::Number(2));
            })
        };
        h.record(Attempt::Number(1));
        h.record(Attempt::Unknown);
        other.join().unwrap();
        let s = h.snapshot();
        assert_eq!(s.count(AttemptClass::Retry1), 2);
        assert_eq!(s.count(AttemptClass::Retry2), 1);
        assert_eq!(s.count(AttemptClass::Unknown), 1);
        assert_eq!(s.total(), 4);
    });
}

/// A bucket of its own per window, whose counters hold an old bucket's counts: the thread that
/// starts the new bucket resets the counters of every stripe while both threads record in
/// it; the resets never lose a record, and the old counts never leak in.
#[test]
fn loom_histogram_reset_racing_a_record_loses_nothing() {
    model(|| {
        let clock = LoomClock(Arc::new(AtomicU64::new(0)));
        let h = AttemptHistogram::builder()
            .window(Duration::from_millis(1))
            .buckets(1)
            .clock(clock.clone())
            .build()
            .unwrap();
        h.record_in(0, AttemptClass::Retry1);
        h.record_in(0, AttemptClass::Retry1);
        clock.0.store(1_000_000, Ordering::Release);
        let other = {
            let h = h.clone();
            thread::spawn(move || h.record(Attempt::Number(1)))
        };
        h.record(Attempt::Number(1));
        other.join().unwrap();
        assert_eq!(h.snapshot().count(AttemptClass::Retry1), 2);
    });
}
