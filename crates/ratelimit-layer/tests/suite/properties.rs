//! Property tests of the algorithms' promises over arbitrary arrival sequences.

use std::time::Duration;

use proptest::prelude::*;
use ratelimit_layer::{Decision, FixedWindow, Limiter, SlidingWindow, TokenBucket};

/// One arrival: a gap after the previous one, a cost, and whether to probe `retry_after`
/// exactly if it is rejected.
fn arrivals() -> impl Strategy<Value = Vec<(u64, u32, bool)>> {
    proptest::collection::vec((0u64..300_000_000, 0u32..8, any::<bool>()), 1..300)
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap()
}

/// Runs `arrivals` through `limiter`, checking on every rejection that the same request is
/// still rejected one nanosecond before `retry_after` and, when probed, admitted at it.
/// Returns the admitted `(time, cost)` pairs.
fn run<L: Limiter>(limiter: &L, arrivals: &[(u64, u32, bool)]) -> Vec<(u64, u64)> {
    let state = L::State::default();
    let mut now = 0u64;
    let mut admitted = Vec::new();
    for &(gap, cost, probe) in arrivals {
        now += gap;
        match limiter.check(&state, now, cost) {
            Decision::Allow => {
                assert!(limiter.status(&state, now).remaining <= limiter.capacity());
                admitted.push((now, u64::from(cost)));
            }
            Decision::Reject { retry_after } => {
                assert!(cost > 0, "a free request is never rejected");
                let remaining = limiter.status(&state, now).remaining;
                assert!(
                    remaining < u64::from(cost),
                    "rejected with {remaining} left for {cost}"
                );
                let wait = nanos(retry_after);
                assert!(wait > 0);
                assert!(
                    !limiter.check(&state, now + wait - 1, cost).is_allowed(),
                    "admitted before retry_after"
                );
                if probe {
                    now += wait;
                    assert!(
                        limiter.check(&state, now, cost).is_allowed(),
                        "rejected at retry_after"
                    );
                    admitted.push((now, u64::from(cost)));
                }
            }
            Decision::OverCapacity { capacity } => {
                assert!(u64::from(cost) > capacity);
            }
        }
    }
    admitted
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Issue 5: over any arrival sequence, the admitted cost in any interval of length `L`
    /// is at most `R * L + B` (with `R = 1 / T`).
    #[test]
    fn token_bucket_admits_at_most_rate_times_length_plus_burst(
        rate in 1u32..50,
        burst in 1u32..10,
        arrivals in arrivals(),
    ) {
        let bucket = TokenBucket::builder(rate).burst(burst).build().unwrap();
        let t = nanos(bucket.emission_interval());
        let admitted = run(&bucket, &arrivals);
        for i in 0..admitted.len() {
            let mut cost = 0u64;
            for &(at, c) in &admitted[i..] {
                cost += c;
                let length = at - admitted[i].0;
                // cost <= length / T + B, in integers.
                prop_assert!(
                    cost * t <= length + u64::from(burst) * t,
                    "{cost} units in {length} ns at T = {t} ns, B = {burst}"
                );
            }
        }
    }

    /// The fixed window never admits more than its quota within one window.
    #[test]
    fn fixed_window_admits_at_most_quota_per_window(
        quota in 1u32..10,
        window_ms in 1u64..2_000,
        arrivals in arrivals(),
    ) {
        let limiter = FixedWindow::builder(quota)
            .window(Duration::from_millis(window_ms))
            .build()
            .unwrap();
        let w = window_ms * 1_000_000;
        let admitted = run(&limiter, &arrivals);
        let mut per_window = std::collections::HashMap::new();
        for (at, cost) in admitted {
            *per_window.entry(at / w).or_insert(0u64) += cost;
        }
        for (_, cost) in per_window {
            prop_assert!(cost <= u64::from(quota));
        }
    }

    /// The sliding window admits at most twice its quota in any window-long interval
    /// (its worst case: a previous window's requests bunched at its end), and at most its
    /// quota within one fixed window.
    #[test]
    fn sliding_window_bounds(
        quota in 1u32..10,
        window_ms in 1u64..2_000,
        arrivals in arrivals(),
    ) {
        let limiter = SlidingWindow::builder(quota)
            .window(Duration::from_millis(window_ms))
            .build()
            .unwrap();
        let w = window_ms * 1_000_000;
        let admitted = run(&limiter, &arrivals);
        for i in 0..admitted.len() {
            let start = admitted[i].0;
            let in_window: u64 = admitted[i..]
                .iter()
                .take_while(|(at, _)| *at < start + w)
                .map(|(_, c)| c)
                .sum();
            prop_assert!(in_window <= 2 * u64::from(quota));
            let same_fixed: u64 = admitted
                .iter()
                .filter(|(at, _)| at / w == start / w)
                .map(|(_, c)| c)
                .sum();
            prop_assert!(same_fixed <= u64::from(quota));
        }
    }
}
