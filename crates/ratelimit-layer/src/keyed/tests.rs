use std::hash::Hash;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use overload_core::clock::FakeClock;

use super::*;
use crate::algorithm::{Decision, Limiter, QuotaStatus, SlidingWindow, TokenBucket};

fn with_clock<L: Limiter, K: Hash + Eq>(
    limiter: L,
    clock: FakeClock,
    max_keys: usize,
) -> KeyedLimiter<L, K, FakeClock> {
    KeyedLimiter::builder(limiter)
        .clock(clock)
        .max_keys(max_keys)
        .build()
        .unwrap()
}

fn bucket(rate: u32, burst: u32) -> TokenBucket {
    TokenBucket::builder(rate).burst(burst).build().unwrap()
}

fn ip(n: u32) -> IpAddr {
    IpAddr::V4(Ipv4Addr::from(n))
}

#[test]
fn status_is_read_only_when_asked() {
    let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 2), FakeClock::new(), 16);
    let (d, status, _) = keyed.check_with_status(&ip(1), 1, false);
    assert_eq!((d, status), (Decision::Allow, None));
    let (d, status, _) = keyed.check_with_status(&ip(1), 1, true);
    assert_eq!(d, Decision::Allow);
    assert_eq!(
        status,
        Some(QuotaStatus {
            remaining: 0,
            reset: Duration::from_secs(2)
        })
    );
    let (d, status, _) = keyed.check_with_status(&ip(1), 1, false);
    assert!(!d.is_allowed());
    assert_eq!(status.map(|s| s.remaining), Some(0));
}

#[test]
fn keys_have_their_own_limits() {
    let clock = FakeClock::new();
    let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 2), clock, 100);
    for _ in 0..2 {
        assert!(keyed.check(&ip(1), 1).0.is_allowed());
    }
    assert!(!keyed.check(&ip(1), 1).0.is_allowed());
    assert!(keyed.check(&ip(2), 1).0.is_allowed());
    assert_eq!(keyed.len(), 2);
}

#[test]
fn borrowed_lookups_store_owned_keys() {
    let keyed: KeyedLimiter<_, Box<[u8]>, _> = with_clock(bucket(1, 1), FakeClock::new(), 100);
    let key: &[u8] = b"api-key-1";
    assert!(keyed.check(key, 1).0.is_allowed());
    assert!(!keyed.check(key, 1).0.is_allowed());
    assert_eq!(keyed.len(), 1);
}

#[test]
fn idle_keys_are_evicted_without_changing_decisions() {
    let clock = FakeClock::new();
    let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(10, 1), clock.clone(), 100);
    for n in 0..50 {
        assert!(keyed.check(&ip(n), 1).0.is_allowed());
    }
    assert_eq!(keyed.len(), 50);
    assert_eq!(keyed.evict_idle(), 0, "nothing is idle yet");
    clock.advance(Duration::from_millis(100));
    assert_eq!(keyed.evict_idle(), 50);
    assert!(keyed.is_empty());
    // A swept key starts fresh, which is exactly the state it was in.
    assert!(keyed.check(&ip(0), 1).0.is_allowed());
}

#[test]
fn sweeps_run_on_their_own_as_new_keys_arrive() {
    let clock = FakeClock::new();
    let keyed: KeyedLimiter<_, IpAddr, _> =
        with_clock(SlidingWindow::new(5).unwrap(), clock.clone(), 1_000);
    for n in 0..200 {
        let _ = keyed.check(&ip(n), 1);
    }
    assert_eq!(keyed.len(), 200);
    clock.advance(Duration::from_secs(2));
    // NOTE: 100 new keys reach every shard (there are two) but with odds of 2^-99.
    assert_eq!(keyed.shards(), 2);
    for n in 1_000..1_100 {
        let _ = keyed.check(&ip(n), 1);
    }
    assert_eq!(keyed.len(), 100, "the 200 idle keys were swept");
}

#[test]
fn at_the_cap_new_keys_share_the_overflow_limit() {
    let clock = FakeClock::new();
    let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 3), clock.clone(), 16);
    let cap = keyed.max_keys();
    let mut classes = std::collections::HashMap::new();
    let mut overflow_admitted = 0;
    for n in 0..1_000 {
        let (decision, class) = keyed.check(&ip(n), 1);
        *classes.entry(class).or_insert(0) += 1;
        if class == KeyClass::Overflow && decision.is_allowed() {
            overflow_admitted += 1;
        }
    }
    assert_eq!(keyed.len(), cap);
    assert!(keyed.len() <= 16 + keyed.shards());
    assert_eq!(classes[&KeyClass::Keyed], cap);
    assert_eq!(classes[&KeyClass::Overflow], 1_000 - cap);
    assert_eq!(
        overflow_admitted, 3,
        "the flood as a whole gets one key's burst"
    );
    // Tracked keys keep their own limit.
    assert!(keyed.check(&ip(0), 1).0.is_allowed());
    assert_eq!(keyed.check(&ip(0), 1).1, KeyClass::Keyed);
    // Once the tracked keys are idle, a sweep makes room again.
    clock.advance(Duration::from_secs(10));
    assert_eq!(keyed.check(&ip(5_000), 1).1, KeyClass::Keyed);
}

/// A token bucket that counts `is_idle` calls: the work sweeps do.
struct CountingSweeps {
    inner: TokenBucket,
    idle_checks: AtomicUsize,
}

impl Limiter for CountingSweeps {
    type State = <TokenBucket as Limiter>::State;
    fn check_holding_back(
        &self,
        state: &Self::State,
        now: u64,
        cost: u32,
        held_back: u64,
    ) -> Decision {
        self.inner.check_holding_back(state, now, cost, held_back)
    }
    fn status(&self, state: &Self::State, now: u64) -> QuotaStatus {
        self.inner.status(state, now)
    }
    fn is_idle(&self, state: &Self::State, now: u64) -> bool {
        self.idle_checks.fetch_add(1, Ordering::Relaxed);
        self.inner.is_idle(state, now)
    }
    fn quota(&self) -> u64 {
        self.inner.quota()
    }
    fn window(&self) -> Duration {
        self.inner.window()
    }
    fn capacity(&self) -> u64 {
        self.inner.capacity()
    }
}

#[test]
fn a_flood_at_the_cap_does_not_sweep_on_every_request() {
    // Regression guard: sweeping a full shard for each new key would make a flood of
    // distinct keys cost O(cap) per request.
    let clock = FakeClock::new();
    let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(
        CountingSweeps {
            inner: TokenBucket::builder(1)
                .period(Duration::from_secs(3_600))
                .burst(1)
                .build()
                .unwrap(),
            idle_checks: AtomicUsize::new(0),
        },
        clock.clone(),
        100,
    );
    for n in 0..10_000 {
        let _ = keyed.check(&ip(n), 1);
    }
    let checks = keyed.limiter().idle_checks.load(Ordering::Relaxed);
    // One check per stored key (is the new state idle?), and one sweep per shard when
    // it was first used; nothing per overflowed request.
    assert!(
        checks <= 100 + 100,
        "{checks} idle checks for 10 000 requests"
    );
    clock.advance(Duration::from_secs(1));
    let _ = keyed.check(&ip(20_000), 1);
    let after = keyed.limiter().idle_checks.load(Ordering::Relaxed);
    assert!(
        after - checks <= 100 + 1,
        "one sweep of at most the cap per interval"
    );
}

#[test]
fn over_capacity_and_free_requests_store_nothing() {
    let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 3), FakeClock::new(), 16);
    assert_eq!(
        keyed.check(&ip(1), 4).0,
        Decision::OverCapacity { capacity: 3 }
    );
    assert!(keyed.check_with_status(&ip(1), 4, true).1.is_some());
    assert!(keyed.check(&ip(1), 0).0.is_allowed());
    assert!(keyed.is_empty());
}

#[test]
fn invalid_builds_name_the_setting() {
    let err = KeyedLimiter::<_, IpAddr>::builder(bucket(1, 1))
        .max_keys(0)
        .build()
        .unwrap_err();
    assert_eq!(err.to_string(), "max_keys must be at least 1, got 0");
    let err = KeyedLimiter::<_, IpAddr>::builder(bucket(1, 1))
        .sweep_interval(Duration::ZERO)
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "sweep_interval must be greater than zero, got 0ns"
    );
    let keyed = KeyedLimiter::<_, IpAddr>::new(bucket(1, 1));
    assert!(keyed.max_keys() >= DEFAULT_MAX_KEYS);
    assert_eq!(keyed.sweep_interval, 1_000_000_000);
}

#[test]
fn memory_stays_under_the_bound() {
    let keyed: KeyedLimiter<_, IpAddr, _> = with_clock(bucket(1, 1), FakeClock::new(), 1_000);
    let bound = keyed.memory_bound();
    for n in 0..20_000 {
        let _ = keyed.check(&ip(n), 1);
        if n % 997 == 0 {
            assert!(keyed.allocated_bytes() <= bound);
        }
    }
    assert!(keyed.allocated_bytes() <= bound);
    assert!(keyed.len() <= keyed.max_keys());
}
