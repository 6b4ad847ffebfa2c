use std::time::Duration;

use overload_core::ConfigErrorKind;
use overload_core::clock::{Clock, FakeClock};

use super::{AttemptClass, AttemptHistogram, AttemptSnapshot};
use crate::protocol::Attempt;

fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

fn h(window: u64, buckets: u32) -> (AttemptHistogram<FakeClock>, FakeClock) {
    let clock = FakeClock::new();
    let h = AttemptHistogram::builder()
        .window(secs(window))
        .buckets(buckets)
        .clock(clock.clone())
        .build()
        .unwrap();
    (h, clock)
}

fn record_n<C: Clock>(h: &AttemptHistogram<C>, attempt: Attempt, n: usize) {
    for _ in 0..n {
        h.record(attempt);
    }
}

#[test]
fn classes() {
    assert_eq!(AttemptClass::of(Attempt::Number(0)), AttemptClass::First);
    assert_eq!(AttemptClass::of(Attempt::Number(1)), AttemptClass::Retry1);
    assert_eq!(AttemptClass::of(Attempt::Number(2)), AttemptClass::Retry2);
    assert_eq!(
        AttemptClass::of(Attempt::Number(3)),
        AttemptClass::Retry3OrMore
    );
    assert_eq!(
        AttemptClass::of(Attempt::Number(Attempt::CLAMP)),
        AttemptClass::Retry3OrMore
    );
    assert_eq!(AttemptClass::of(Attempt::Unknown), AttemptClass::Unknown);
    assert_eq!(
        AttemptClass::of(Attempt::Malformed),
        AttemptClass::Malformed
    );
    for (i, c) in AttemptClass::ALL.iter().enumerate() {
        assert_eq!(c.index(), i);
    }
}

#[test]
fn invalid_configurations_are_refused_by_name() {
    let cases = [
        (
            AttemptHistogram::builder().buckets(1025),
            "buckets",
            ConfigErrorKind::OutOfRange,
            "buckets must be within 1..=1024, got 1025",
        ),
        (
            AttemptHistogram::builder().buckets(0),
            "buckets",
            ConfigErrorKind::OutOfRange,
            "buckets must be within 1..=1024, got 0",
        ),
        (
            AttemptHistogram::builder()
                .window(Duration::from_millis(10))
                .buckets(11),
            "buckets",
            ConfigErrorKind::Conflict,
            "window (10ms) divided by buckets (11) must be at least 1ms, got 909.09µs",
        ),
        (
            AttemptHistogram::builder().window(Duration::ZERO),
            "window",
            ConfigErrorKind::OutOfRange,
            "window must be more than zero, got 0ns",
        ),
        (
            AttemptHistogram::builder().window(secs(24 * 3600 + 1)),
            "window",
            ConfigErrorKind::OutOfRange,
            "window must be at most 24h, got 86401s",
        ),
    ];
    for (builder, field, kind, message) in cases {
        let e = builder.build().unwrap_err();
        assert_eq!((e.field(), e.kind()), (field, kind));
        assert_eq!(e.to_string(), message);
    }
    let ok = |window, buckets| {
        AttemptHistogram::builder()
            .window(window)
            .buckets(buckets)
            .build()
            .is_ok()
    };
    assert!(ok(Duration::from_millis(10), 10));
    assert!(ok(secs(24 * 3600), 1024));
}

#[test]
fn window_is_whole_buckets() {
    let h = AttemptHistogram::builder()
        .window(Duration::from_nanos(10_000_000_007))
        .buckets(10)
        .build()
        .unwrap();
    assert_eq!(h.bucket_width(), Duration::from_nanos(1_000_000_000));
    assert_eq!(h.window(), secs(10));
    let d = AttemptHistogram::new();
    assert_eq!(d.window(), secs(10));
    assert_eq!(d.bucket_width(), secs(1));
    assert_eq!(d.buckets(), 10);
    assert_eq!(
        format!("{d:?}"),
        "AttemptHistogram { window: 10s, buckets: 10, .. }"
    );
}

#[tokio::test(start_paused = true)]
async fn snapshot_math() {
    let h = AttemptHistogram::new();
    assert_eq!(h.snapshot().total(), 0);
    assert_eq!(h.snapshot().retry_share(), None);
    record_n(&h, Attempt::Number(0), 60);
    record_n(&h, Attempt::Number(1), 10);
    record_n(&h, Attempt::Number(2), 5);
    record_n(&h, Attempt::Number(3), 3);
    record_n(&h, Attempt::Number(40), 2);
    record_n(&h, Attempt::Unknown, 15);
    record_n(&h, Attempt::Malformed, 5);
    let s = h.snapshot();
    assert_eq!(s.count(AttemptClass::First), 60);
    assert_eq!(s.count(AttemptClass::Retry1), 10);
    assert_eq!(s.count(AttemptClass::Retry2), 5);
    assert_eq!(s.count(AttemptClass::Retry3OrMore), 5);
    assert_eq!(s.count(AttemptClass::Unknown), 15);
    assert_eq!(s.count(AttemptClass::Malformed), 5);
    assert_eq!(s.total(), 100);
    assert_eq!(s.retries(), 20);
    // Unknown and malformed dilute the share: 20 of 100, not 20 of 80.
    assert_eq!(s.retry_share(), Some(0.2));
    assert_eq!(
        s,
        AttemptSnapshot::from_counts([60, 10, 5, 5, 15, 5]),
        "from_counts is indexed as AttemptClass::ALL"
    );
}

#[test]
fn stopped_requests_count_as_pressure_in_their_bucket() {
    let (h, clock) = h(10, 10);
    record_n(&h, Attempt::Number(0), 8);
    record_n(&h, Attempt::Number(1), 2);
    h.record_stopped_in(h.bucket_now());
    h.record_stopped_in(h.bucket_now());
    let s = h.snapshot();
    assert_eq!((s.total(), s.retries(), s.stopped()), (10, 2, 2));
    assert_eq!(s.retry_share(), Some(0.2));
    assert_eq!(s.retry_pressure(), Some(0.4));
    assert_eq!(
        s,
        AttemptSnapshot::from_counts([8, 2, 0, 0, 0, 0]).with_stopped(2)
    );
    // They leave the window with their bucket.
    clock.advance(secs(10));
    assert_eq!(h.snapshot().stopped(), 0);
    assert_eq!(h.snapshot().retry_pressure(), None);
}

#[test]
fn only_unknown_is_share_zero() {
    let (h, _) = h(10, 10);
    record_n(&h, Attempt::Unknown, 3);
    assert_eq!(h.snapshot().retry_share(), Some(0.0));
}

/// The default clock follows tokio's paused time.
#[tokio::test(start_paused = true)]
async fn window_slides_one_bucket_at_a_time_in_paused_time() {
    let h = AttemptHistogram::new();
    // One request per second for 10 seconds: a retry in the first second, then first tries.
    h.record(Attempt::Number(1));
    for _ in 1..10 {
        tokio::time::advance(secs(1)).await;
        h.record(Attempt::Number(0));
    }
    let s = h.snapshot();
    assert_eq!(s.total(), 10);
    assert_eq!(s.retries(), 1);
    // 9.999 s after the start: the first bucket is still in the window.
    tokio::time::advance(Duration::from_millis(999)).await;
    assert_eq!(h.snapshot().total(), 10);
    assert_eq!(h.snapshot().retries(), 1);
    // 10 s after the start: the first bucket (and its retry) has left; nothing else.
    tokio::time::advance(Duration::from_millis(1)).await;
    let s = h.snapshot();
    assert_eq!(s.total(), 9);
    assert_eq!(s.retries(), 0);
    assert_eq!(s.retry_share(), Some(0.0));
    // Each further second drops one more bucket.
    for left in (0..9).rev() {
        tokio::time::advance(secs(1)).await;
        assert_eq!(h.snapshot().total(), left);
    }
}

#[test]
fn expired_bucket_is_reset_when_its_slot_is_reused() {
    let (h, clock) = h(4, 4);
    record_n(&h, Attempt::Number(2), 7);
    // Exactly one window later the same slot is reused: old counts must not leak in.
    clock.advance(secs(4));
    record_n(&h, Attempt::Number(2), 1);
    record_n(&h, Attempt::Number(0), 1);
    let s = h.snapshot();
    assert_eq!(s.count(AttemptClass::Retry2), 1);
    assert_eq!(s.total(), 2);
    // Many windows later, a slot whose counters were never rewritten is ignored too.
    clock.advance(secs(4 * 1000 + 1));
    assert_eq!(h.snapshot().total(), 0);
}

#[test]
fn idle_gap_longer_than_window_empties_it() {
    let (h, clock) = h(10, 10);
    record_n(&h, Attempt::Number(1), 50);
    clock.advance(secs(3600));
    assert_eq!(h.snapshot().total(), 0);
    h.record(Attempt::Number(0));
    assert_eq!(h.snapshot().total(), 1);
    assert_eq!(h.snapshot().retries(), 0);
}

#[test]
fn late_record_for_a_bucket_already_rolled_over_is_dropped() {
    let (h, clock) = h(2, 2);
    let then = h.bucket_now();
    clock.advance(secs(2));
    h.record(Attempt::Number(0)); // bucket 2 takes bucket 0's counters
    h.record_in(then, AttemptClass::Retry1); // bucket 0: left the window
    let s = h.snapshot();
    assert_eq!(s.total(), 1);
    assert_eq!(s.retries(), 0);
}

#[test]
fn bucket_numbers_past_the_tag_wrap() {
    let (h, _) = h(10, 10);
    let near = (1u64 << 32) - 1;
    // Steady traffic up to the wrap.
    for bucket in near - 30..near {
        h.record_in(bucket, AttemptClass::First);
        h.record_in(bucket, AttemptClass::Retry1);
    }
    assert_eq!(h.snapshot_of(near - 1).total(), 20);
    h.record_in(near, AttemptClass::Retry1);
    h.record_in(near + 1, AttemptClass::First);
    let s = h.snapshot_of(near + 1);
    // Buckets near-8 ..= near-1 (2 each), near (1) and near+1 (1).
    assert_eq!(s.total(), 18);
    assert_eq!(s.retries(), 9);
    // Window near+1 ..= near+10: only near+1's request.
    assert_eq!(h.snapshot_of(near + 10).total(), 1);
    assert_eq!(h.snapshot_of(near + 11).total(), 0);
}

#[test]
fn slot_idle_for_more_than_2_pow_31_buckets_is_reset_not_ignored() {
    // Regression: comparing tags on the bare wrapping circle judged such a slot "newer"
    // and dropped every record into it.
    let (h, _) = h(10, 10);
    let later = (1u64 << 31) + 10;
    h.record_in(later, AttemptClass::Retry1);
    let s = h.snapshot_of(later);
    assert_eq!(s.total(), 1);
    assert_eq!(s.retries(), 1);
}

proptest::proptest! {
    /// Against a naive model (every event kept with its bucket number), for any number
    /// of buckets and any sequence of records with gaps (including gaps longer than the
    /// window), every snapshot counts exactly the events of its window.
    #[test]
    fn snapshots_match_a_naive_model(
        slots in 1u32..12,
        events in proptest::collection::vec((0u64..30, 0usize..6), 0..200),
        lookahead in 0u64..30,
    ) {
        let h = AttemptHistogram::builder()
            .window(Duration::from_millis(u64::from(slots) * 10))
            .buckets(slots)
            .clock(FakeClock::new())
            .build()
            .unwrap();
        let mut bucket = 0u64;
        let mut model: Vec<(u64, AttemptClass)> = Vec::new();
        for (gap, class) in events {
            // Mostly small steps, sometimes a jump past the window.
            bucket += if gap < 25 { gap / 5 } else { gap };
            let class = AttemptClass::ALL[class];
            h.record_in(bucket, class);
            model.push((bucket, class));
            for at in [bucket, bucket + lookahead] {
                let oldest = at.saturating_sub(u64::from(slots) - 1);
                let mut expected = [0u64; 6];
                for &(b, c) in &model {
                    if (oldest..=at).contains(&b) {
                        expected[c.index()] += 1;
                    }
                }
                proptest::prop_assert_eq!(
                    h.snapshot_of(at),
                    AttemptSnapshot::from_counts(expected)
                );
            }
        }
    }
}

#[test]
fn concurrent_recording_loses_nothing() {
    let (h, _) = h(10, 10);
    std::thread::scope(|s| {
        for t in 0..4u32 {
            let h = h.clone();
            s.spawn(move || {
                for _ in 0..10_000 {
                    h.record(Attempt::Number(t % 2));
                }
            });
        }
    });
    let s = h.snapshot();
    assert_eq!(s.total(), 40_000);
    assert_eq!(s.retries(), 20_000);
}

#[test]
fn concurrent_rollover_loses_nothing_in_the_new_bucket() {
    // Threads race to reset a slot from bucket 0 to bucket 10 (same slot): whoever
    // resets counts itself, the others increment; nothing is lost or double-reset.
    let (h, clock) = h(10, 10);
    for _ in 0..100 {
        h.record(Attempt::Number(0));
    }
    clock.advance(secs(16)); // bucket 16 reuses bucket 0's counters (a ring of 16)
    std::thread::scope(|s| {
        for _ in 0..4 {
            let h = h.clone();
            s.spawn(move || {
                for _ in 0..5_000 {
                    h.record(Attempt::Number(0));
                }
            });
        }
    });
    assert_eq!(h.snapshot().total(), 20_000);
}
