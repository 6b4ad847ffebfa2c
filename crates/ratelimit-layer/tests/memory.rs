//! Issue 5: a flood of 1 000 000 distinct keys keeps the key map under its documented
//! memory bound.

use std::net::{IpAddr, Ipv6Addr};
use std::time::Duration;

use overload_core::clock::FakeClock;
use ratelimit_layer::keyed::{KeyClass, KeyedLimiter};
use ratelimit_layer::{RateLimitLayer, TokenBucket};

const DEFAULT_MAX_KEYS: usize = RateLimitLayer::DEFAULT_MAX_KEYS;

const FLOOD: u32 = 1_000_000;

/// A distinct address per `n`, spread over distinct /64s.
fn key(n: u32) -> IpAddr {
    IpAddr::V6(Ipv6Addr::from(u128::from(n) << 64 | 1))
}

#[test]
fn a_million_distinct_keys_stay_under_the_bound() {
    // Keys that stay busy for a whole hour: nothing can be evicted, so only the cap holds.
    let hourly = TokenBucket::builder(1)
        .period(Duration::from_secs(3_600))
        .build()
        .unwrap();
    let keyed: KeyedLimiter<_, IpAddr, _> = KeyedLimiter::builder(hourly)
        .clock(FakeClock::new())
        .build()
        .unwrap();
    let bound = keyed.memory_bound();
    // The documented figure: about 8 MiB for the default cap with IP keys.
    assert!(bound <= 8 * 1024 * 1024, "bound {bound}");
    let mut peak = 0;
    let mut overflow = 0;
    for n in 0..FLOOD {
        let (_, class) = keyed.check(&key(n), 1);
        if class == KeyClass::Overflow {
            overflow += 1;
        }
        if n % 10_000 == 0 {
            peak = peak.max(keyed.allocated_bytes());
        }
    }
    peak = peak.max(keyed.allocated_bytes());
    assert!(peak <= bound, "peak {peak} > bound {bound}");
    assert!(keyed.len() <= keyed.max_keys());
    assert!(
        keyed.len() >= DEFAULT_MAX_KEYS * 9 / 10,
        "{} tracked",
        keyed.len()
    );
    assert_eq!(overflow, FLOOD as usize - keyed.len());
}

#[test]
fn a_flood_of_short_lived_keys_is_evicted_as_it_goes() {
    // 1 per second, bursts of 1: a key is idle one second after its request. A million
    // keys over 100 s of fake time, 10 000 per second: about 10 000 are alive at any time.
    let clock = FakeClock::new();
    let keyed: KeyedLimiter<_, IpAddr, _> = KeyedLimiter::builder(TokenBucket::new(1).unwrap())
        .clock(clock.clone())
        .build()
        .unwrap();
    let mut most = 0;
    for n in 0..FLOOD {
        if n % 100 == 0 {
            clock.advance(Duration::from_millis(10));
        }
        let (decision, class) = keyed.check(&key(n), 1);
        assert!(decision.is_allowed());
        assert_eq!(class, KeyClass::Keyed, "never at the cap");
        most = most.max(keyed.len());
    }
    // Alive: one second of keys (10 000), plus up to one sweep interval not yet swept.
    assert!(most <= 20_000 + 100, "at most {most} keys tracked");
    assert!(keyed.allocated_bytes() <= keyed.memory_bound());
}
