//! The strategies' distributions, bounds and configuration rules.

use std::fmt;
use std::time::Duration;

use overload_core::ConfigError;
use proptest::prelude::*;
use rand::SeedableRng;
use rand::rngs::SmallRng;

use super::rules::{grown, secs_to_duration};
use super::*;

const MS: Duration = Duration::from_millis(1);

fn full_jitter(base: Duration, cap: Duration) -> FullJitter {
    FullJitter::builder().base(base).cap(cap).build().unwrap()
}

fn decorrelated(base: Duration, cap: Duration) -> Decorrelated {
    Decorrelated::builder().base(base).cap(cap).build().unwrap()
}

fn all_strategies() -> Vec<Box<dyn Backoff>> {
    vec![
        Box::new(Fixed::default()),
        Box::new(Exponential::default()),
        Box::new(Exponential::article_blue()),
        Box::new(
            Exponential::builder()
                .min_delay(MS)
                .max_delay(Duration::MAX)
                .factor(2.7)
                .jitter(0.5)
                .build()
                .unwrap(),
        ),
        Box::new(FullJitter::new()),
        Box::new(full_jitter(MS, Duration::MAX)),
        Box::new(EqualJitter::new()),
        Box::new(Decorrelated::new()),
        Box::new(decorrelated(MS, Duration::MAX)),
        Box::new(Ethernet::new()),
        Box::new(Ethernet::with_slot(51 * Duration::from_micros(1)).unwrap()),
    ]
}

/// Mean of `runs` samples of the delay before retry `retry`, in seconds.
fn mean_at(b: &dyn Backoff, retry: u32, runs: u32, seeds: &Seeds) -> f64 {
    let mut sum = 0.0;
    for _ in 0..runs {
        let d: Vec<Duration> = delays(b, seeds.rng()).take(retry as usize + 1).collect();
        sum += d[retry as usize].as_secs_f64();
    }
    sum / f64::from(runs)
}

#[test]
fn article_sequence_mean_matches_the_deterministic_curve() {
    let seeds = Seeds::from_seed(1);
    for b in [
        Exponential::new(),
        Exponential::article_blue(),
        Exponential::article_green(),
    ] {
        for n in 0..16 {
            let expected = (b.min_delay().as_secs_f64() * b.factor().powi(n as i32))
                .min(b.max_delay().as_secs_f64());
            let mean = mean_at(&b, n, 4_000, &seeds);
            let err = (mean - expected).abs() / expected;
            // sigma of the mean is 0.1 / sqrt(4000) = 0.16%; 2% is over 12 sigmas.
            assert!(
                err < 0.02,
                "{b:?} retry {n}: mean {mean}, expected {expected}"
            );
            assert_eq!(
                b.deterministic_delay(n),
                secs_to_duration(expected, b.max_delay())
            );
        }
    }
}

#[test]
fn article_jitter_has_the_stated_spread() {
    let b = Exponential::new();
    let seeds = Seeds::from_seed(2);
    let n = 3; // 800 ms
    let xs: Vec<f64> = (0..20_000)
        .map(|_| delays(&b, seeds.rng()).nth(n).unwrap().as_secs_f64())
        .collect();
    let mean = xs.iter().sum::<f64>() / xs.len() as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
    let sd = var.sqrt();
    assert!((sd - 0.08).abs() < 0.004, "sd {sd}, expected 0.08");
}

#[test]
fn exponential_without_jitter_is_exact() {
    let b = Exponential::builder()
        .max_delay(Duration::from_secs(1))
        .jitter(0.0)
        .build()
        .unwrap();
    let got: Vec<Duration> = b.delays(Seeds::from_seed(3).rng()).take(6).collect();
    assert_eq!(
        got,
        [100 * MS, 200 * MS, 400 * MS, 800 * MS, 1000 * MS, 1000 * MS]
    );
}

#[test]
fn exponential_is_never_negative_even_at_the_largest_jitter() {
    let b = Exponential::builder()
        .max_delay(Duration::from_secs(10))
        .jitter(1.0)
        .build()
        .unwrap();
    let seeds = Seeds::from_seed(4);
    let mut zeros = 0;
    for _ in 0..2_000 {
        let d = b.delays(seeds.rng()).nth(2).unwrap();
        if d.is_zero() {
            zeros += 1;
        }
        assert!(d <= Duration::from_secs(20));
    }
    // P(z < -1) is 15.9 %: about 317 of 2000 draws clamp at zero.
    assert!(
        zeros > 200,
        "with sigma = d some draws must clamp at zero: {zeros}"
    );
}

#[test]
fn fixed_is_fixed() {
    let b = Fixed::every(250 * MS).unwrap();
    assert!(
        b.delays(Seeds::from_seed(5).rng())
            .take(100)
            .all(|d| d == 250 * MS)
    );
    assert_eq!(Fixed::new().interval(), 100 * MS);
}

#[test]
fn full_jitter_bounds_and_mean() {
    let b = full_jitter(100 * MS, Duration::from_secs(2));
    let seeds = Seeds::from_seed(6);
    for n in 0..8u32 {
        let t = (0.1 * 2f64.powi(n as i32)).min(2.0);
        for _ in 0..500 {
            let d = delays(&b, seeds.rng())
                .nth(n as usize)
                .unwrap()
                .as_secs_f64();
            assert!((0.0..=t).contains(&d), "retry {n}: {d} not in [0, {t}]");
        }
        let mean = mean_at(&b, n, 4_000, &seeds);
        assert!(
            (mean - t / 2.0).abs() / (t / 2.0) < 0.05,
            "retry {n}: mean {mean}"
        );
    }
}

#[test]
fn equal_jitter_bounds_and_mean() {
    let b = EqualJitter::builder()
        .base(100 * MS)
        .cap(Duration::from_secs(2))
        .build()
        .unwrap();
    let seeds = Seeds::from_seed(7);
    for n in 0..8u32 {
        let t = (0.1 * 2f64.powi(n as i32)).min(2.0);
        for _ in 0..500 {
            let d = delays(&b, seeds.rng())
                .nth(n as usize)
                .unwrap()
                .as_secs_f64();
            assert!(d >= t / 2.0 - 1e-9 && d <= t + 1e-9, "retry {n}: {d}");
        }
        let mean = mean_at(&b, n, 4_000, &seeds);
        assert!((mean - 0.75 * t).abs() / t < 0.03, "retry {n}: mean {mean}");
    }
}

#[test]
fn decorrelated_bounds_follow_the_previous_delay() {
    let base = 100 * MS;
    let cap = Duration::from_secs(5);
    let b = decorrelated(base, cap);
    let seeds = Seeds::from_seed(8);
    for _ in 0..200 {
        let mut prev = base;
        for d in b.delays(seeds.rng()).take(30) {
            assert!(d >= base, "{d:?} below base");
            assert!(d <= cap, "{d:?} above cap");
            assert!(
                d <= prev * 3 + Duration::from_nanos(1),
                "{d:?} above 3 x {prev:?}"
            );
            prev = d;
        }
    }
    // From the base, the first draw is U(base, 3 base): mean 2 base.
    let mean = mean_at(&b, 0, 4_000, &seeds);
    assert!((mean - 0.2).abs() < 0.01, "mean {mean}");
}

#[test]
fn ethernet_slots_have_the_expected_mean_and_range() {
    let slot = Duration::from_micros(51_200) / 1000; // 51.2 us
    let b = Ethernet::with_slot(slot).unwrap();
    let seeds = Seeds::from_seed(9);
    for c in 1..=12u32 {
        let hi = (1u32 << c.min(10)) - 1;
        let mut rng = seeds.rng();
        let runs = 20_000;
        let mut sum = 0u64;
        let mut seen_hi = false;
        for _ in 0..runs {
            let k = b.slots(c - 1, &mut rng);
            assert!(k <= hi);
            seen_hi |= k == hi;
            sum += u64::from(k);
        }
        let mean = sum as f64 / f64::from(runs);
        let expected = f64::from(hi) / 2.0; // (2^c - 1) / 2
        assert!(
            (mean - expected).abs() <= 0.03 * expected.max(1.0),
            "c = {c}: mean {mean} slots, expected {expected}"
        );
        if c <= 6 {
            assert!(seen_hi, "c = {c}: the top slot {hi} never drawn");
        }
    }
    assert_eq!(b.max_delay(), slot * 1023);
    let mut rng = seeds.rng();
    assert_eq!(
        b.next_delay(0, None, &mut rng).as_nanos() % slot.as_nanos(),
        0
    );
}

#[test]
fn no_overflow_or_panic_at_huge_retry_numbers() {
    let seeds = Seeds::from_seed(10);
    for b in all_strategies() {
        let mut rng = seeds.rng();
        for retry in [10_000, 1 << 20, i32::MAX as u32, u32::MAX - 1, u32::MAX] {
            for previous in [None, Some(Duration::ZERO), Some(Duration::MAX)] {
                let d = b.next_delay(retry, previous, &mut rng);
                assert!(
                    d <= b.max_delay().saturating_mul(2),
                    "{b:?} at {retry}: {d:?}"
                );
            }
        }
    }
    let b = Exponential::article_blue();
    let d = b.next_delay(10_000, None, &mut seeds.rng());
    assert!(
        d >= Duration::from_secs(300) && d <= Duration::from_secs(900),
        "{d:?}"
    );
}

#[test]
fn two_requests_get_different_sequences() {
    let seeds = Seeds::from_seed(11);
    for b in all_strategies() {
        if format!("{b:?}").starts_with("Fixed") {
            continue;
        }
        let a: Vec<Duration> = delays(&*b, seeds.rng()).take(8).collect();
        let c: Vec<Duration> = delays(&*b, seeds.rng()).take(8).collect();
        assert_ne!(a, c, "{b:?}");
    }
}

#[test]
fn seeds_are_reproducible_and_distinct() {
    let a = Seeds::from_seed(42);
    let b = Seeds::from_seed(42);
    let xs: Vec<u64> = (0..1000).map(|_| a.next_seed()).collect();
    let ys: Vec<u64> = (0..1000).map(|_| b.next_seed()).collect();
    assert_eq!(xs, ys);
    let mut sorted = xs.clone();
    sorted.sort_unstable();
    sorted.dedup();
    assert_eq!(sorted.len(), xs.len());
    assert_ne!(Seeds::from_seed(43).next_seed(), xs[0]);
    // Two OS-keyed sources differ (a 2^-64 chance of a false failure).
    assert_ne!(Seeds::from_os().next_seed(), Seeds::from_os().next_seed());
}

#[test]
fn new_gives_the_documented_defaults() {
    assert_eq!(Fixed::new().interval(), 100 * MS);
    assert_eq!(Fixed::new(), Fixed::default());

    let e = Exponential::new();
    assert_eq!(
        (e.min_delay(), e.max_delay(), e.factor(), e.jitter()),
        (100 * MS, Duration::from_secs(900), 2.0, 0.1)
    );
    assert_eq!(e, Exponential::default());
    assert_eq!(Exponential::builder().build().unwrap(), e);
    let blue = Exponential::article_blue();
    assert_eq!(
        (
            blue.min_delay(),
            blue.max_delay(),
            blue.factor(),
            blue.jitter()
        ),
        (100 * MS, Duration::from_secs(600), 2.7, 0.1)
    );
    let green = Exponential::article_green();
    assert_eq!(
        (
            green.min_delay(),
            green.max_delay(),
            green.factor(),
            green.jitter()
        ),
        (Duration::from_secs(1), Duration::from_secs(300), 1.5, 0.1)
    );

    let twenty = Duration::from_secs(20);
    let f = FullJitter::new();
    assert_eq!((f.base(), f.cap()), (100 * MS, twenty));
    assert_eq!(FullJitter::builder().build().unwrap(), f);
    let q = EqualJitter::new();
    assert_eq!((q.base(), q.cap()), (500 * MS, twenty));
    assert_eq!(EqualJitter::builder().build().unwrap(), q);
    let d = Decorrelated::new();
    assert_eq!((d.base(), d.cap()), (100 * MS, twenty));
    assert_eq!(Decorrelated::builder().build().unwrap(), d);
    assert_eq!(Ethernet::new().slot(), 100 * MS);
    assert_eq!(Ethernet::new().max_delay(), 102_300 * MS);
}

/// The error's field, kind and message.
fn refused<T: fmt::Debug>(r: Result<T, ConfigError>) -> (&'static str, ConfigErrorKind, String) {
    let e = r.unwrap_err();
    (e.field(), e.kind(), e.to_string())
}

use overload_core::ConfigErrorKind::{self, Conflict, NotFinite, OutOfRange};

#[test]
fn invalid_configurations_are_refused_by_name_value_and_rule() {
    let s = Duration::from_secs(1);
    let owned = |(f, k, m): (&'static str, ConfigErrorKind, &str)| (f, k, m.to_owned());

    assert_eq!(
        refused(Fixed::every(Duration::ZERO)),
        owned((
            "interval",
            OutOfRange,
            "interval must be greater than zero, got 0ns"
        ))
    );

    let e = Exponential::builder;
    assert_eq!(
        refused(e().min_delay(Duration::ZERO).build()),
        owned((
            "min_delay",
            OutOfRange,
            "min_delay must be greater than zero, got 0ns"
        ))
    );
    assert_eq!(
        refused(e().min_delay(s).max_delay(MS).build()),
        owned((
            "min_delay",
            Conflict,
            "min_delay (1s) must not exceed max_delay (1ms)"
        ))
    );
    // A minimum above the default maximum (15 min) is caught too.
    assert_eq!(refused(e().min_delay(1000 * s).build()).1, Conflict);
    assert_eq!(
        refused(e().factor(0.5).build()),
        owned(("factor", OutOfRange, "factor must be at least 1, got 0.5"))
    );
    for f in [0.0, -2.0, 0.999] {
        assert_eq!(refused(e().factor(f).build()).1, OutOfRange, "{f}");
    }
    for f in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        assert_eq!(refused(e().factor(f).build()).1, NotFinite, "{f}");
    }
    assert_eq!(
        refused(e().factor(f64::NAN).build()).2,
        "factor must be a finite number, got NaN"
    );
    assert_eq!(
        refused(e().jitter(1.5).build()),
        owned(("jitter", OutOfRange, "jitter must be within 0..=1, got 1.5"))
    );
    assert_eq!(refused(e().jitter(-0.1).build()).1, OutOfRange);
    assert_eq!(refused(e().jitter(f64::INFINITY).build()).1, NotFinite);
    // Regression: the old positional `Exponential::new(min, max, factor, jitter)` took
    // a swapped factor and jitter (2.0 and 0.1 as 0.1 and 2.0) without a word only when
    // both happened to pass; by name, each setting is checked against its own rule.
    assert_eq!(refused(e().factor(0.1).jitter(2.0).build()).0, "factor");
    assert_eq!(refused(e().factor(2.0).jitter(2.0).build()).0, "jitter");
    // The bounds are inclusive.
    assert!(e().factor(1.0).jitter(0.0).build().is_ok());
    assert!(e().jitter(1.0).min_delay(s).max_delay(s).build().is_ok());

    for (field_base, r) in [
        (
            "base",
            refused(FullJitter::builder().base(Duration::ZERO).build()),
        ),
        (
            "base",
            refused(EqualJitter::builder().base(Duration::ZERO).build()),
        ),
        (
            "base",
            refused(Decorrelated::builder().base(Duration::ZERO).build()),
        ),
    ] {
        assert_eq!(
            r,
            owned((
                field_base,
                OutOfRange,
                "base must be greater than zero, got 0ns"
            ))
        );
    }
    for r in [
        refused(FullJitter::builder().base(s).cap(MS).build()),
        refused(EqualJitter::builder().base(s).cap(MS).build()),
        refused(Decorrelated::builder().base(s).cap(MS).build()),
    ] {
        assert_eq!(
            r,
            owned(("base", Conflict, "base (1s) must not exceed cap (1ms)"))
        );
    }
    // A base above the default cap (20 s) is caught too.
    assert_eq!(
        refused(FullJitter::builder().base(30 * s).build()).2,
        "base (30s) must not exceed cap (20s)"
    );

    assert_eq!(
        refused(Ethernet::with_slot(Duration::ZERO)),
        owned((
            "slot",
            OutOfRange,
            "slot must be greater than zero, got 0ns"
        ))
    );
    let (field, kind, message) = refused(Ethernet::with_slot(Duration::MAX));
    assert_eq!((field, kind), ("slot", OutOfRange));
    assert!(
        message.starts_with("slot must be short enough that 1023 slots fit in a Duration"),
        "{message}"
    );
    assert!(Ethernet::with_slot(Duration::MAX / 1023).is_ok());
}

proptest! {
    #[test]
    fn every_strategy_stays_within_bounds(
        retry in any::<u32>(),
        prev_nanos in any::<u64>(),
        seed in any::<u64>(),
        base_ms in 1u64..10_000,
        cap_factor in 1u64..1_000,
        factor in 1.0f64..10.0,
        jitter in 0.0f64..=1.0,
    ) {
        let base = Duration::from_millis(base_ms);
        let cap = base * u32::try_from(cap_factor).unwrap();
        let prev = Some(Duration::from_nanos(prev_nanos));
        let mut rng = SmallRng::seed_from_u64(seed);
        let e = Exponential::builder()
            .min_delay(base)
            .max_delay(cap)
            .factor(factor)
            .jitter(jitter)
            .build()
            .unwrap();
        prop_assert!(e.next_delay(retry, prev, &mut rng) <= cap * 2);
        let f = full_jitter(base, cap);
        prop_assert!(f.next_delay(retry, prev, &mut rng) <= cap);
        let q = EqualJitter::builder().base(base).cap(cap).build().unwrap();
        let d = q.next_delay(retry, prev, &mut rng);
        prop_assert!(d <= cap);
        prop_assert!(d.as_secs_f64() >= grown(base, 2.0, retry, cap) / 2.0 - 1e-9);
        let c = decorrelated(base, cap);
        let d = c.next_delay(retry, prev, &mut rng);
        prop_assert!(d >= base && d <= cap);
        let t = Ethernet::with_slot(base).unwrap();
        prop_assert!(t.next_delay(retry, prev, &mut rng) <= base * 1023);
    }
}
