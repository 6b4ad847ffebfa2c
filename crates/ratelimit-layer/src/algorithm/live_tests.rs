use std::time::Duration;

use overload_core::clock::FakeClock;
use proptest::prelude::*;

use super::*;

const MS: u64 = 1_000_000;

fn bucket(rate: u32, burst: u32) -> TokenBucket {
    TokenBucket::builder(rate).burst(burst).build().unwrap()
}

/// A client sending one unit whenever the limiter would admit it, from `from` until `until`
/// (inclusive): at each rejection it comes back exactly at the `retry_after`. Returns the
/// units admitted.
fn greedy<L: Limiter>(limiter: &L, state: &L::State, from: u64, until: u64) -> u64 {
    let (mut t, mut admitted) = (from, 0);
    while t <= until {
        match limiter.check(state, t, 1) {
            Decision::Allow => admitted += 1,
            Decision::Reject { retry_after } => t += u64::try_from(retry_after.as_nanos()).unwrap(),
            Decision::OverCapacity { .. } => panic!("a unit is never over capacity"),
        }
    }
    admitted
}

#[test]
fn carry_over_keeps_the_units_in_use_up_to_the_new_burst() {
    let (old, at) = (bucket(10, 10), 1_000 * MS); // T = 100 ms
    // 4 units in use at `at`.
    let tat = at + 400 * MS;
    // A lowered rate: the 4 units come back at 200 ms each.
    assert_eq!(carry_over(&old, &bucket(5, 10), tat, at), at + 800 * MS);
    // A raised rate: at 50 ms each.
    assert_eq!(carry_over(&old, &bucket(20, 10), tat, at), at + 200 * MS);
    // A burst lowered below the units in use: the bucket is empty, no more.
    assert_eq!(carry_over(&old, &bucket(10, 2), tat, at), at + 200 * MS);
    // Idle keys stay as they are, fresh ones included.
    assert_eq!(carry_over(&old, &bucket(1, 1), at, at), at);
    assert_eq!(carry_over(&old, &bucket(1, 1), 0, at), 0);
}

#[test]
fn a_lowered_rate_admits_no_burst() {
    let clock = FakeClock::new();
    let (live, handle) = LiveTokenBucket::new(bucket(100, 100), clock.clone());
    let state = LiveTokenBucketState::default();
    // The whole burst is taken at 0; at 500 ms half of it is back.
    assert_eq!(greedy(&live, &state, 0, 0), 100);
    clock.advance(Duration::from_millis(500));
    handle.set_rate(10).unwrap();
    // 50 units free, then one per 100 ms: 50 + 10 in the next second, not 100 + 10.
    let c = 500 * MS;
    assert_eq!(greedy(&live, &state, c, c), 50);
    assert_eq!(greedy(&live, &state, c + 1, c + 1_000 * MS), 10);
}

#[test]
fn a_raised_rate_rejects_nothing_the_new_rate_admits() {
    let clock = FakeClock::new();
    let (live, handle) = LiveTokenBucket::new(bucket(10, 5), clock.clone());
    let state = LiveTokenBucketState::default();
    // A client pacing itself at the old rate, one unit every 100 ms for 10 s...
    let mut t = 0;
    while t < 10_000 * MS {
        assert!(live.check(&state, t, 1).is_allowed(), "old pace at {t}");
        t += 100 * MS;
    }
    clock.set(Duration::from_nanos(t));
    handle.set_rate(100).unwrap();
    // ... then at the new one, 100 per second, with its burst of 5 on top at once.
    for _ in 0..4 {
        assert!(live.check(&state, t, 1).is_allowed(), "burst at {t}");
    }
    let end = t + 10_000 * MS;
    while t < end {
        t += 10 * MS;
        assert!(live.check(&state, t, 1).is_allowed(), "new pace at {t}");
    }
}

#[test]
fn a_key_untouched_through_several_changes_converts_through_each() {
    let clock = FakeClock::new();
    let (live, handle) = LiveTokenBucket::new(bucket(10, 10), clock.clone());
    let state = LiveTokenBucketState::default();
    assert_eq!(greedy(&live, &state, 0, 0), 10); // TAT = 1 s
    clock.set(Duration::from_millis(200)); // 8 in use
    handle.set_rate(20).unwrap(); // 8 in use at 50 ms: TAT = 600 ms
    clock.set(Duration::from_millis(400)); // 4 in use
    handle.set_burst(2).unwrap(); // capped at 2 in use: TAT = 500 ms
    clock.set(Duration::from_millis(450)); // 1 in use
    // One unit free now, the next at 500 ms.
    assert_eq!(greedy(&live, &state, 450 * MS, 450 * MS), 1);
    assert_eq!(
        live.check(&state, 450 * MS, 1),
        Decision::Reject {
            retry_after: Duration::from_millis(50)
        }
    );
    assert_eq!(live.current(), bucket(20, 2));
}

#[test]
fn a_key_older_than_the_history_converts_from_the_oldest_kept() {
    let clock = FakeClock::new();
    let (live, handle) = LiveTokenBucket::new(bucket(1_000, 1_000), clock.clone());
    let state = LiveTokenBucketState::default();
    assert!(live.check(&state, 0, 1_000).is_allowed()); // TAT = 1 s
    // More changes than the history holds, alternating, each 1 ms apart.
    for i in 0..(HISTORY as u64 * 2) {
        clock.set(Duration::from_millis(i));
        handle
            .set_burst(if i % 2 == 0 { 500 } else { 1_000 })
            .unwrap();
    }
    // Whatever the conversion, the new limit's bound holds: at most its burst at once.
    let now = 40 * MS;
    let admitted = greedy(&live, &state, now, now);
    assert!(admitted <= 1_000, "{admitted}");
    // And the key keeps state: its backlog was not forgotten.
    assert!(admitted < 1_000, "{admitted}");
}

#[test]
fn setting_the_parameters_in_force_changes_nothing() {
    let clock = FakeClock::new();
    let (live, handle) = LiveTokenBucket::new(bucket(10, 5), clock);
    handle.set_rate(10).unwrap();
    handle.set(bucket(10, 5));
    assert_eq!(handle.params.load().generation, 0);
    // An invalid setting is refused by name, and changes nothing either.
    assert_eq!(handle.set_burst(0).unwrap_err().field(), "burst");
    assert_eq!(live.current(), bucket(10, 5));
    assert_eq!((live.quota(), live.capacity()), (10, 5));
}

#[test]
fn changes_under_contention_never_exceed_the_bound() {
    // Threads take units while the rate is lowered from 1 000 to 1 per second at 0: no
    // more than the burst is ever admitted at that instant.
    let clock = FakeClock::new();
    let (live, handle) = LiveTokenBucket::new(bucket(1_000, 100), clock);
    let state = LiveTokenBucketState::default();
    let admitted = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                for _ in 0..200 {
                    if live.check(&state, 0, 1).is_allowed() {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        }
        s.spawn(|| {
            handle.set_rate(1).unwrap();
            handle.set_burst(50).unwrap();
        });
    });
    assert!(admitted.into_inner() <= 100);
    // After the changes, the key's backlog is at most the new burst's.
    assert!(state.inner.tat.load(Ordering::Relaxed) <= 50_000 * MS);
}

proptest! {
    /// Over any interval of length `L` from the change, a greedy client gets exactly what the
    /// new limit leaves it with the units in use carried over (nothing the new limit admits
    /// is rejected), and never more than `L / T' + B'` (no burst).
    #[test]
    fn after_a_change_the_new_limit_holds(
        old_rate in 1u32..2_000,
        old_burst in 1u32..200,
        new_rate in 1u32..2_000,
        new_burst in 1u32..200,
        taken_share in 0.0f64..=1.0,
        change_ms in 0u64..2_000,
        length_ms in 0u64..3_000,
    ) {
        let (old, new) = (bucket(old_rate, old_burst), bucket(new_rate, new_burst));
        let clock = FakeClock::new();
        let (live, handle) = LiveTokenBucket::new(old.clone(), clock.clone());
        let state = LiveTokenBucketState::default();
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let taken = (f64::from(old_burst) * taken_share) as u32;
        if taken > 0 {
            prop_assert!(live.check(&state, 0, taken).is_allowed());
        }
        let c = change_ms * MS;
        clock.set(Duration::from_nanos(c));
        handle.set(new.clone());
        let (t_new, b_new) = (new.emission, new.tolerance);
        let backlog = (u64::from(taken) * old.emission).saturating_sub(c);
        let kept = u64::try_from(
            (u128::from(backlog) * u128::from(t_new) / u128::from(old.emission))
                .min(u128::from(b_new)),
        )
        .unwrap();
        let l = length_ms * MS;
        let admitted = greedy(&live, &state, c, c + l);
        prop_assert_eq!(admitted, (b_new - kept + l) / t_new);
        prop_assert!(admitted <= l / t_new + u64::from(new_burst));
    }
}
