//! Each algorithm with a share held back from the lower levels, as a layer decides: the
//! level noted in a `RecentLevels`, then `check_holding_back` with what it holds back.

use overload_signal::criticality::{RecentLevels, Reserves};
use overload_signal::protocol::Criticality::{self, Critical, CriticalPlus, Sheddable};
use proptest::prelude::*;

use super::{Decision, FixedWindow, Limiter, SlidingWindow, TokenBucket};

const MS: u64 = 1_000_000;

/// What a layer does for one request: note its level, then decide with what it holds back.
fn decide<L: Limiter>(
    limiter: &L,
    state: &L::State,
    reserves: &Reserves,
    recent: &RecentLevels,
    level: Criticality,
    now: u64,
    cost: u32,
) -> Decision {
    recent.note(level, now);
    let held = recent.held_back(reserves, level, limiter.capacity(), now);
    limiter.check_holding_back(state, now, cost, held)
}

/// A flood of sheddable requests (ten every millisecond) beside critical ones sent under
/// the rate (one every `gap` ms): no critical request is rejected, and the flood is.
fn flood<L: Limiter>(limiter: &L, gap: u64) {
    let state = L::State::default();
    let (reserves, recent) = (Reserves::new(), RecentLevels::default());
    let (mut critical, mut shed_admitted, mut shed_rejected) = (0, 0, 0);
    for ms in 0..5_000 {
        let now = ms * MS;
        for _ in 0..10 {
            match decide(limiter, &state, &reserves, &recent, Sheddable, now, 1) {
                Decision::Allow => shed_admitted += 1,
                Decision::Reject { retry_after } => {
                    assert!(!retry_after.is_zero());
                    shed_rejected += 1;
                }
                Decision::OverCapacity { .. } => unreachable!("cost 1"),
            }
        }
        if ms % gap == 0 {
            let decision = decide(limiter, &state, &reserves, &recent, Critical, now, 1);
            assert_eq!(decision, Decision::Allow, "critical at {ms} ms");
            critical += 1;
        }
    }
    assert!(critical >= 5_000 / gap);
    assert!(shed_admitted > 0, "the flood is served while room is left");
    assert!(shed_rejected > 40_000, "the flood is shed: {shed_rejected}");
}

#[test]
fn a_sheddable_flood_never_rejects_critical_requests_under_the_rate() {
    // 100 per second, bursts of 100: sheddable stops at 50 left, critical at 10 per second
    // takes from the 50.
    flood(&TokenBucket::new(100).unwrap(), 100);
    // 100 per second in windows: sheddable stops at 50 of each window, critical takes at
    // most 10 of the other 50.
    flood(&FixedWindow::new(100).unwrap(), 100);
    flood(&SlidingWindow::new(100).unwrap(), 100);
}

#[test]
fn a_rejection_for_the_share_says_when_the_level_gets_in() {
    // 10 per second, bursts of 10: sheddable may not take the last 5 while critical is seen.
    let bucket = TokenBucket::builder(10).burst(10).build().unwrap();
    let state = Default::default();
    let (reserves, recent) = (Reserves::new(), RecentLevels::default());
    assert!(decide(&bucket, &state, &reserves, &recent, Critical, 0, 1).is_allowed());
    for _ in 0..4 {
        assert!(decide(&bucket, &state, &reserves, &recent, Sheddable, 0, 1).is_allowed());
    }
    // 5 left: a sheddable request would leave 4.
    let Decision::Reject { retry_after } =
        decide(&bucket, &state, &reserves, &recent, Sheddable, 0, 1)
    else {
        panic!("held back");
    };
    assert_eq!(retry_after.as_millis(), 100, "one unit back, 6 left");
    let at = u64::try_from(retry_after.as_nanos()).unwrap();
    assert!(!decide(&bucket, &state, &reserves, &recent, Sheddable, at - 1, 1).is_allowed());
    assert!(decide(&bucket, &state, &reserves, &recent, Sheddable, at, 1).is_allowed());
    // Critical still has 5.
    for _ in 0..5 {
        assert!(decide(&bucket, &state, &reserves, &recent, Critical, at, 1).is_allowed());
    }
    // The windows: the time until the next window.
    let window = FixedWindow::new(10).unwrap();
    let state = Default::default();
    assert!(decide(&window, &state, &reserves, &recent, Critical, 0, 1).is_allowed());
    for _ in 0..4 {
        assert!(decide(&window, &state, &reserves, &recent, Sheddable, 0, 1).is_allowed());
    }
    assert_eq!(
        decide(&window, &state, &reserves, &recent, Sheddable, 300 * MS, 1),
        Decision::Reject {
            retry_after: std::time::Duration::from_millis(700)
        }
    );
    // A sliding window's estimate decays: admitted exactly at its retry_after.
    let sliding = SlidingWindow::new(10).unwrap();
    let state = Default::default();
    for _ in 0..5 {
        assert!(decide(&sliding, &state, &reserves, &recent, Critical, 0, 1).is_allowed());
    }
    let now = 1_000 * MS;
    let Decision::Reject { retry_after } =
        decide(&sliding, &state, &reserves, &recent, Sheddable, now, 1)
    else {
        panic!("5 of 10 counted, 5 held back");
    };
    let at = now + u64::try_from(retry_after.as_nanos()).unwrap();
    assert!(!decide(&sliding, &state, &reserves, &recent, Sheddable, at - 1, 1).is_allowed());
    assert!(decide(&sliding, &state, &reserves, &recent, Sheddable, at, 1).is_allowed());
}

#[test]
fn a_cost_the_share_leaves_no_room_for_says_so() {
    // Sheddable may not take 5 of 10: a cost of 6 never passes while critical is active.
    let bucket = TokenBucket::new(10).unwrap();
    let state = Default::default();
    let decision = bucket.check_holding_back(&state, 0, 6, 5);
    assert!(
        matches!(decision, Decision::Reject { retry_after } if !retry_after.is_zero()),
        "{decision:?}"
    );
    // A free request is admitted whatever is held back.
    assert!(bucket.check_holding_back(&state, 0, 0, 9).is_allowed());
    let window = FixedWindow::new(10).unwrap();
    let state = Default::default();
    assert!(!window.check_holding_back(&state, 0, 6, 5).is_allowed());
    assert!(window.check_holding_back(&state, 0, 5, 5).is_allowed());
    let sliding = SlidingWindow::new(10).unwrap();
    let state = Default::default();
    assert!(!sliding.check_holding_back(&state, 0, 6, 5).is_allowed());
    assert!(sliding.check_holding_back(&state, 0, 5, 5).is_allowed());
}

/// The three algorithms, small enough for short random runs to reach their limits.
fn limiters() -> (TokenBucket, FixedWindow, SlidingWindow) {
    (
        TokenBucket::builder(20).burst(10).build().unwrap(),
        FixedWindow::new(10).unwrap(),
        SlidingWindow::new(10).unwrap(),
    )
}

/// Requests: (milliseconds since the previous one, level, cost).
fn requests() -> impl Strategy<Value = Vec<(u64, Criticality, u32)>> {
    let level = prop::sample::select(Criticality::ALL.to_vec());
    prop::collection::vec((0u64..40, level, 0u32..4), 1..300)
}

/// Every decision of `limiter` for `requests`, with `reserves`.
fn decisions<L: Limiter>(
    limiter: &L,
    reserves: Reserves,
    requests: &[(u64, Criticality, u32)],
) -> Vec<Decision> {
    let state = L::State::default();
    let recent = RecentLevels::default();
    let mut now = 0;
    requests
        .iter()
        .map(|&(gap, level, cost)| {
            now += gap * MS;
            decide(limiter, &state, &reserves, &recent, level, now, cost)
        })
        .collect()
}

/// Whether, at some instant, a request of a lower level was admitted after one of a higher
/// level asking no more was rejected: what shedding from the bottom never does. (A lighter
/// lower request may pass where a heavier higher one does not: that is the cost, not the
/// level.)
fn lower_admitted_after_higher_rejected(
    requests: &[(u64, Criticality, u32)],
    decisions: &[Decision],
) -> Option<usize> {
    // The rejections seen at this instant: (level, cost).
    let mut rejected: Vec<(Criticality, u32)> = Vec::new();
    for (i, (&(gap, level, cost), decision)) in requests.iter().zip(decisions).enumerate() {
        if gap > 0 {
            rejected.clear();
        }
        match decision {
            // NOTE: a free request is admitted whatever is held back.
            Decision::Allow if cost > 0 => {
                if rejected.iter().any(|&(l, c)| l > level && c <= cost) {
                    return Some(i);
                }
            }
            Decision::Allow => {}
            _ => rejected.push((level, cost)),
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Traffic of one level is limited exactly as without reserves, request by request.
    #[test]
    fn one_level_is_decided_as_without_reserves(
        requests in requests(),
        level in prop::sample::select(Criticality::ALL.to_vec()),
    ) {
        let one: Vec<_> = requests.iter().map(|&(gap, _, cost)| (gap, level, cost)).collect();
        let (bucket, fixed, sliding) = limiters();
        prop_assert_eq!(decisions(&bucket, Reserves::new(), &one), decisions(&bucket, Reserves::none(), &one));
        prop_assert_eq!(decisions(&fixed, Reserves::new(), &one), decisions(&fixed, Reserves::none(), &one));
        prop_assert_eq!(decisions(&sliding, Reserves::new(), &one), decisions(&sliding, Reserves::none(), &one));
    }

    /// `Reserves::none()` decides every mix of levels as `check` does.
    #[test]
    fn no_reserves_is_class_blind(requests in requests()) {
        let (bucket, fixed, sliding) = limiters();
        fn plain<L: Limiter>(limiter: &L, requests: &[(u64, Criticality, u32)]) -> Vec<Decision> {
            let state = L::State::default();
            let mut now = 0;
            requests.iter().map(|&(gap, _, cost)| { now += gap * MS; limiter.check(&state, now, cost) }).collect()
        }
        prop_assert_eq!(decisions(&bucket, Reserves::none(), &requests), plain(&bucket, &requests));
        prop_assert_eq!(decisions(&fixed, Reserves::none(), &requests), plain(&fixed, &requests));
        prop_assert_eq!(decisions(&sliding, Reserves::none(), &requests), plain(&sliding, &requests));
    }

    /// At no instant is a lower level admitted once a higher level asking no more has been
    /// rejected.
    #[test]
    fn a_lower_level_is_never_admitted_when_a_higher_one_is_rejected(requests in requests()) {
        let (bucket, fixed, sliding) = limiters();
        for d in [
            decisions(&bucket, Reserves::new(), &requests),
            decisions(&fixed, Reserves::new(), &requests),
            decisions(&sliding, Reserves::new(), &requests),
        ] {
            prop_assert_eq!(lower_admitted_after_higher_rejected(&requests, &d), None);
        }
    }
}

#[test]
fn critical_plus_is_held_back_from_nobody() {
    let bucket = TokenBucket::new(10).unwrap();
    let state = Default::default();
    let (reserves, recent) = (Reserves::new(), RecentLevels::default());
    recent.note(Sheddable, 0);
    recent.note(Critical, 0);
    for _ in 0..10 {
        assert!(decide(&bucket, &state, &reserves, &recent, CriticalPlus, 0, 1).is_allowed());
    }
}
