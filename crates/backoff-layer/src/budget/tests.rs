//! The budget's arithmetic, its window, its configuration rules, its metrics and its logs.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use overload_core::clock::{CoarseClock, FakeClock};
use proptest::prelude::*;

use super::telemetry::{RETRIES_ALLOWED, RETRIES_REFUSED};
use super::*;
use overload_signal::criticality::Reserves;
use overload_signal::protocol::Criticality;

fn budget(ratio: f64, window: Duration, slots: u32, floor: u32) -> RetryBudget {
    RetryBudget::builder()
        .ratio(ratio)
        .window(window)
        .slots(slots)
        .min_retries_per_sec(floor)
        .build()
        .unwrap()
}

fn drain(b: &impl Budget) -> usize {
    let mut n = 0;
    while b.withdraw() {
        n += 1;
        assert!(n <= 100_000_000, "budget never runs out");
    }
    n
}

fn deposit(b: &impl Budget, n: usize) {
    for _ in 0..n {
        b.deposit();
    }
}

#[test]
fn unlimited_always_allows() {
    let b = Unlimited;
    for _ in 0..1000 {
        assert!(b.withdraw());
    }
    b.deposit();
    assert!(b.withdraw());
}

/// Regression for tower issue 857: `TpsBudget` with 0.6 allows 10 retries for 10
/// deposits, because it rounds the ratio to one retry per whole deposit.
#[tokio::test(start_paused = true)]
async fn exact_ratio_six_tenths_allows_six_of_ten() {
    let b = budget(0.6, Duration::from_secs(10), 10, 0);
    deposit(&b, 10);
    assert_eq!(b.remaining(), 6);
    assert_eq!(drain(&b), 6);
    assert_eq!(b.remaining(), 0);
    // One more deposit earns 0.6 of a retry: not enough for a seventh...
    b.deposit();
    assert!(!b.withdraw());
    // ...two more make 12 * 0.6 = 7.2: exactly one more.
    b.deposit();
    assert_eq!(drain(&b), 1);
}

#[tokio::test(start_paused = true)]
async fn default_is_ten_percent_plus_one_per_second() {
    let b = RetryBudget::new();
    assert!((b.ratio() - 0.1).abs() < f64::EPSILON);
    assert_eq!(b.window(), Duration::from_secs(10));
    assert_eq!(b.slots(), 10);
    assert_eq!(b.min_retries_per_sec(), 1);
    // The floor alone: 1 per second over 10 seconds.
    assert_eq!(b.remaining(), 10);
    deposit(&b, 1000);
    assert_eq!(drain(&b), 100 + 10);
}

#[tokio::test(start_paused = true)]
async fn zero_ratio_and_zero_floor_allows_nothing() {
    let b = budget(0.0, Duration::from_secs(1), 1, 0);
    deposit(&b, 1000);
    assert!(!b.withdraw());
}

#[tokio::test(start_paused = true)]
async fn floor_lets_a_quiet_client_retry() {
    let b = budget(0.1, Duration::from_secs(10), 10, 2);
    // No traffic at all: 2 retries per second of a 10 s window.
    assert_eq!(drain(&b), 20);
    // The floor is a window allowance, renewed as the window slides.
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(drain(&b), 20);
}

#[tokio::test(start_paused = true)]
async fn floor_scales_with_a_fractional_window() {
    let b = budget(0.0, Duration::from_millis(500), 5, 10);
    assert_eq!(drain(&b), 5);
}

#[tokio::test(start_paused = true)]
async fn deposits_expire_with_the_window() {
    let b = budget(0.5, Duration::from_secs(10), 10, 0);
    deposit(&b, 10); // slot 0
    tokio::time::advance(Duration::from_secs(9)).await;
    assert_eq!(b.remaining(), 5, "slot 0 is still in the window at 9 s");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert_eq!(b.remaining(), 0, "slot 0 left the window at 10 s");
    assert!(!b.withdraw());
}

#[tokio::test(start_paused = true)]
async fn window_slides_slot_by_slot() {
    let b = budget(1.0, Duration::from_secs(4), 4, 0);
    deposit(&b, 1); // slot 0
    tokio::time::advance(Duration::from_secs(1)).await;
    deposit(&b, 2); // slot 1
    tokio::time::advance(Duration::from_secs(1)).await;
    deposit(&b, 4); // slot 2
    assert_eq!(b.remaining(), 7);
    tokio::time::advance(Duration::from_secs(2)).await; // slot 4: slot 0 gone
    assert_eq!(b.remaining(), 6);
    tokio::time::advance(Duration::from_secs(1)).await; // slot 5: slot 1 gone
    assert_eq!(b.remaining(), 4);
    tokio::time::advance(Duration::from_secs(1)).await; // slot 6: slot 2 gone
    assert_eq!(b.remaining(), 0);
}

/// Three slots share four records: the window's slots must still never collide.
#[tokio::test(start_paused = true)]
async fn window_slides_with_a_slot_count_that_is_not_a_power_of_two() {
    let b = budget(1.0, Duration::from_secs(3), 3, 0);
    for (slot, n) in [(0usize, 1), (1, 2), (2, 4), (3, 8), (4, 16)] {
        deposit(&b, n);
        let in_window: usize = [1, 2, 4, 8, 16][slot.saturating_sub(2)..=slot].iter().sum();
        assert_eq!(b.remaining(), in_window as u64, "slot {slot}");
        tokio::time::advance(Duration::from_secs(1)).await;
    }
    // Slot 5 holds nothing; slots 3 and 4 still count.
    assert_eq!(b.remaining(), 24);
    tokio::time::advance(Duration::from_secs(2)).await;
    assert_eq!(b.remaining(), 0);
}

#[tokio::test(start_paused = true)]
async fn withdrawals_expire_with_the_window() {
    let b = budget(1.0, Duration::from_secs(2), 2, 0);
    deposit(&b, 3); // slot 0
    assert_eq!(drain(&b), 3); // slot 0
    tokio::time::advance(Duration::from_secs(1)).await;
    deposit(&b, 3); // slot 1: the window holds 6 deposits and 3 withdrawals
    assert_eq!(drain(&b), 3);
    tokio::time::advance(Duration::from_secs(1)).await;
    // Slot 0 (3 deposits, 3 withdrawals) left; slot 1 holds 3 and 3.
    assert_eq!(b.remaining(), 0);
    deposit(&b, 2);
    assert_eq!(drain(&b), 2);
}

#[tokio::test(start_paused = true)]
async fn long_idle_gap_forgets_everything() {
    let b = budget(1.0, Duration::from_secs(10), 10, 0);
    deposit(&b, 100);
    assert_eq!(drain(&b), 100);
    tokio::time::advance(Duration::from_secs(3600 * 24 * 365)).await;
    assert_eq!(b.remaining(), 0);
    deposit(&b, 7);
    assert_eq!(drain(&b), 7);
}

#[tokio::test(start_paused = true)]
async fn refusal_does_not_consume_allowance() {
    let b = budget(0.5, Duration::from_secs(10), 10, 0);
    deposit(&b, 1);
    for _ in 0..10 {
        assert!(!b.withdraw());
    }
    b.deposit();
    assert!(b.withdraw());
}

#[test]
fn invalid_settings_are_refused_by_name() {
    use overload_core::ConfigErrorKind::{Conflict, NotFinite, OutOfRange};
    let cases: [(RetryBudgetBuilder, &str, _, &str); 10] = [
        (
            RetryBudget::builder().ratio(f64::NAN),
            "ratio",
            NotFinite,
            "ratio must be a finite number, got NaN",
        ),
        (
            RetryBudget::builder().ratio(f64::INFINITY),
            "ratio",
            NotFinite,
            "ratio must be a finite number, got inf",
        ),
        (
            RetryBudget::builder().ratio(-0.1),
            "ratio",
            OutOfRange,
            "ratio must be within 0..=1000, got -0.1",
        ),
        (
            RetryBudget::builder().ratio(1000.5),
            "ratio",
            OutOfRange,
            "ratio must be within 0..=1000, got 1000.5",
        ),
        (
            RetryBudget::builder().window(Duration::ZERO),
            "window",
            OutOfRange,
            "window must be more than zero and at most 1h, got 0ns",
        ),
        (
            RetryBudget::builder().window(Duration::from_secs(3601)),
            "window",
            OutOfRange,
            "window must be more than zero and at most 1h, got 3601s",
        ),
        (
            RetryBudget::builder().slots(0),
            "slots",
            OutOfRange,
            "slots must be within 1..=64, got 0",
        ),
        (
            RetryBudget::builder().slots(65),
            "slots",
            OutOfRange,
            "slots must be within 1..=64, got 65",
        ),
        (
            RetryBudget::builder()
                .window(Duration::from_millis(99))
                .slots(10),
            "slots",
            Conflict,
            "window (99ms) divided by slots (10) must be at least 10ms, got 9.9ms",
        ),
        (
            RetryBudget::builder()
                .window(Duration::from_millis(100))
                .slots(11),
            "slots",
            Conflict,
            "window (100ms) divided by slots (11) must be at least 10ms, got 9.090909ms",
        ),
    ];
    for (builder, field, kind, message) in cases {
        let shown = format!("{builder:?}");
        let err = builder.build().unwrap_err();
        assert_eq!((err.field(), err.kind()), (field, kind), "{shown}");
        assert_eq!(err.to_string(), message, "{shown}");
    }
    // The bounds themselves are valid.
    RetryBudget::builder()
        .ratio(1000.0)
        .window(Duration::from_secs(3600))
        .slots(64)
        .build()
        .unwrap();
    RetryBudget::builder()
        .ratio(0.0)
        .window(Duration::from_millis(100))
        .slots(10)
        .build()
        .unwrap();
}

#[test]
fn defaults_are_the_associated_constants() {
    let b = RetryBudget::new();
    assert_eq!(b.ratio().to_bits(), RetryBudget::DEFAULT_RATIO.to_bits());
    assert_eq!(b.window(), RetryBudget::DEFAULT_WINDOW);
    assert_eq!(b.slots(), RetryBudget::DEFAULT_SLOTS);
    assert_eq!(
        b.min_retries_per_sec(),
        RetryBudget::DEFAULT_MIN_RETRIES_PER_SEC
    );
}

/// A budget on a clock the test moves, without a tokio runtime.
#[test]
fn any_clock_moves_the_window() {
    let clock = FakeClock::new();
    let b = RetryBudget::builder()
        .ratio(0.5)
        .window(Duration::from_secs(2))
        .slots(2)
        .min_retries_per_sec(0)
        .clock(clock.clone())
        .build()
        .unwrap();
    deposit(&b, 4);
    clock.advance(Duration::from_secs(1));
    assert_eq!(b.remaining(), 2);
    assert!(b.withdraw());
    clock.advance(Duration::from_secs(1));
    // The deposits' slot left; the withdrawal's (slot 1) is still in the window.
    assert_eq!(b.remaining(), 0);
    deposit(&b, 4);
    assert_eq!(b.remaining(), 1);
    assert_eq!(
        format!("{b:?}"),
        "RetryBudget { name: \"default\", ratio: 0.5, window: 2s, slots: 2, min_retries_per_sec: 0, \
         remaining: 1 }"
    );
}

/// The opt-in coarse clock: the same exact arithmetic.
#[test]
fn coarse_clock_budget_is_exact_too() {
    let b = RetryBudget::builder()
        .ratio(0.6)
        .window(Duration::from_secs(3600))
        .min_retries_per_sec(0)
        .clock(CoarseClock::new())
        .build()
        .unwrap();
    deposit(&b, 10);
    assert_eq!(drain(&b), 6);
}

/// A tiny ratio over huge traffic: the allowance is computed in 128-bit integers.
#[test]
fn allowance_does_not_overflow() {
    let b = RetryBudget::builder()
        .ratio(1000.0)
        .min_retries_per_sec(u32::MAX)
        .window(Duration::from_secs(3600))
        .build()
        .unwrap();
    assert!(b.remaining() > u64::from(u32::MAX));
    assert!(b.withdraw());
}

/// The no-overdraw property: many tasks on a multi-threaded runtime race to withdraw
/// from one budget; exactly the allowance succeeds, never one more.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_withdrawals_never_overdraw() {
    for round in 0..20 {
        // A window far longer than the test, so nothing expires while it runs.
        let b = Arc::new(budget(0.6, Duration::from_secs(3600), 10, 0));
        deposit(&*b, 1000 + round);
        let allowance = (1000 + round) * 6 / 10;
        let granted = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..64)
            .map(|_| {
                let b = Arc::clone(&b);
                let granted = Arc::clone(&granted);
                tokio::spawn(async move {
                    for i in 0..50 {
                        if b.withdraw() {
                            granted.fetch_add(1, Ordering::Relaxed);
                        }
                        if i % 8 == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(granted.load(Ordering::Relaxed), allowance, "round {round}");
    }
}

/// Deposits and withdrawals racing on real threads: at every moment the withdrawals
/// granted stay within the allowance of the deposits made before them.
#[test]
fn concurrent_deposits_and_withdrawals_never_overdraw() {
    let b = Arc::new(budget(0.25, Duration::from_secs(3600), 10, 0));
    let deposited = Arc::new(AtomicUsize::new(0));
    let granted = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let b = Arc::clone(&b);
            let deposited = Arc::clone(&deposited);
            let granted = Arc::clone(&granted);
            std::thread::spawn(move || {
                for i in 0..20_000 {
                    if (i + t) % 2 == 0 {
                        b.deposit();
                        deposited.fetch_add(1, Ordering::SeqCst);
                    } else if b.withdraw() {
                        // Counted after the grant: `granted` may lag, never lead.
                        let g = granted.fetch_add(1, Ordering::SeqCst) + 1;
                        // `deposited` may lag too (counted after the deposit), by at
                        // most one per other thread.
                        let d = deposited.load(Ordering::SeqCst) + 3;
                        assert!(g * 4 <= d, "granted {g} with {d} deposits");
                    }
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let (d, g) = (
        deposited.load(Ordering::SeqCst),
        granted.load(Ordering::SeqCst),
    );
    assert_eq!(d, 40_000);
    assert!(g <= d / 4, "granted {g} of {d}");
    // Whatever was refused during the race is still there, exactly.
    assert_eq!(g + drain(&*b), d / 4);
}

/// The counters carry the budget's name, and are registered on the first deposit rather
/// than when the budget is built: a recorder installed in between sees them.
#[tokio::test(start_paused = true)]
async fn metrics_are_registered_on_first_use_and_carry_the_name() {
    // Built before any recorder exists.
    let b = RetryBudget::builder()
        .name("payments")
        .ratio(0.5)
        .min_retries_per_sec(0)
        .build()
        .unwrap();
    assert_eq!(b.name(), "payments");
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        deposit(&b, 4);
        for _ in 0..5 {
            b.withdraw();
        }
    });
    let mut counters: Vec<(String, u64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                panic!("only counters expected")
            };
            let mut shown = key.key().name().to_owned();
            for label in key.key().labels() {
                shown.push_str(&format!("{{{}={}}}", label.key(), label.value()));
            }
            (shown, n)
        })
        .collect();
    counters.sort();
    assert_eq!(
        counters,
        [
            (format!("{RETRIES_ALLOWED}{{name=payments}}"), 2),
            (
                format!("{RETRIES_REFUSED}{{name=payments}}{{criticality=critical-plus}}"),
                0
            ),
            (
                format!("{RETRIES_REFUSED}{{name=payments}}{{criticality=critical}}"),
                3
            ),
            (
                format!("{RETRIES_REFUSED}{{name=payments}}{{criticality=sheddable-plus}}"),
                0
            ),
            (
                format!("{RETRIES_REFUSED}{{name=payments}}{{criticality=sheddable}}"),
                0
            ),
        ]
    );
    assert_eq!(RetryBudget::new().name(), "default");
}

#[test]
fn a_name_is_checked() {
    let err = RetryBudget::builder().name("").build().unwrap_err();
    assert_eq!(err.field(), "name");
    let err = RetryBudget::builder()
        .name("caf\u{e9}")
        .build()
        .unwrap_err();
    assert_eq!(err.field(), "name");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The allowance is exactly floor(ratio * deposits + floor * window), computed
    /// here in integers from a ratio given in thousandths.
    #[test]
    fn allowance_is_exact(
        ratio_millis in 0u64..5_000,
        deposits in 0u64..2_000,
        floor in 0u32..20,
        window_secs in 1u64..60,
    ) {
        let b = budget(
            ratio_millis as f64 / 1000.0,
            Duration::from_secs(window_secs),
            1,
            floor,
        );
        deposit(&b, deposits as usize);
        let expected = (ratio_millis * deposits + 1000 * u64::from(floor) * window_secs) / 1000;
        prop_assert_eq!(b.remaining(), expected);
        prop_assert_eq!(drain(&b) as u64, expected);
        prop_assert!(!b.withdraw());
    }
}

/// A budget on a fake clock, with `reserves`: ratio 0.2, 10 s in 10 slots, floor 1 per
/// second.
fn levelled(clock: &FakeClock, reserves: Reserves) -> RetryBudget<FakeClock> {
    RetryBudget::builder()
        .ratio(0.2)
        .reserves(reserves)
        .clock(clock.clone())
        .build()
        .unwrap()
}

/// One step of a client's life: time passes, a request's first attempt, a retry.
#[derive(Clone, Copy, Debug)]
enum Step {
    Wait(u64),
    Deposit,
    Withdraw,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            1 => (1u64..3_000).prop_map(Step::Wait),
            3 => Just(Step::Deposit),
            2 => Just(Step::Withdraw),
        ],
        1..600,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// A client whose requests are all of one level is limited exactly as without levels:
    /// the same decision at every withdrawal as a budget without reserves, and as the
    /// calls without a level, whichever the level.
    #[test]
    fn one_level_is_limited_exactly_as_without_levels(steps in steps(), rank in 0usize..4) {
        let level = Criticality::ALL[rank];
        let clock = FakeClock::new();
        let with_levels = levelled(&clock, Reserves::new());
        let without = levelled(&clock, Reserves::none());
        let plain = levelled(&clock, Reserves::new());
        for (i, step) in steps.into_iter().enumerate() {
            match step {
                Step::Wait(ms) => clock.advance(Duration::from_millis(ms)),
                Step::Deposit => {
                    with_levels.deposit_at(level);
                    without.deposit_at(level);
                    plain.deposit();
                }
                Step::Withdraw => {
                    let decided = with_levels.withdraw_at(level);
                    prop_assert_eq!(decided, without.withdraw_at(level), "step {}", i);
                    prop_assert_eq!(decided, plain.withdraw(), "step {}", i);
                }
            }
        }
    }

    /// Mixed levels without reserves: every level draws from the whole allowance, as one.
    #[test]
    fn without_reserves_levels_change_nothing(steps in steps(), seed in any::<u64>()) {
        let clock = FakeClock::new();
        let mixed = levelled(&clock, Reserves::none());
        let plain = levelled(&clock, Reserves::none());
        use rand::Rng;
        let mut rng = crate::backoff::Seeds::from_seed(seed).rng();
        for step in steps {
            let level = Criticality::ALL[rng.random_range(0..4)];
            match step {
                Step::Wait(ms) => clock.advance(Duration::from_millis(ms)),
                Step::Deposit => {
                    mixed.deposit_at(level);
                    plain.deposit();
                }
                Step::Withdraw => prop_assert_eq!(mixed.withdraw_at(level), plain.withdraw()),
            }
        }
    }
}

/// A storm: 100 requests a second, half `sheddable` and half `critical`, every one failing
/// and asking for a retry, one of each level in turn. The `sheddable` retries stop first:
/// at every moment a `critical` retry is refused, the `sheddable` retry just before it was
/// refused too; over the storm, `critical` gets far more retries.
#[test]
fn in_a_storm_sheddable_retries_stop_before_critical_ones() {
    use Criticality::{Critical, Sheddable};
    let clock = FakeClock::new();
    let b = levelled(&clock, Reserves::new());
    let (mut granted, mut refused) = ([0u32; 4], [0u32; 4]);
    let mut first_refusal = [None; 4];
    for ms in (0..30_000u64).step_by(20) {
        clock.set(Duration::from_millis(ms));
        // Two first attempts and two retries every 20 ms.
        b.deposit_at(Sheddable);
        b.deposit_at(Critical);
        let sheddable = b.withdraw_at(Sheddable);
        let critical = b.withdraw_at(Critical);
        assert!(
            critical || !sheddable,
            "at {ms} ms a critical retry was refused right after a sheddable one was granted"
        );
        for (level, ok) in [(Sheddable, sheddable), (Critical, critical)] {
            if ok {
                granted[level.rank()] += 1;
            } else {
                refused[level.rank()] += 1;
                first_refusal[level.rank()].get_or_insert(ms);
            }
        }
    }
    let (s, c) = (Sheddable.rank(), Critical.rank());
    assert!(
        first_refusal[s] < first_refusal[c],
        "sheddable first: {first_refusal:?}"
    );
    // The allowance (0.2 * 100 + 1 per second = 21 retries a second) split: critical may
    // take up to 90 % of it, sheddable only what is left below 50 %.
    assert!(
        granted[c] > 3 * granted[s],
        "granted {granted:?}, refused {refused:?}"
    );
    // Together they still spend the allowance: about 21 a second for 30 s.
    let total = granted[s] + granted[c];
    assert!((560..=680).contains(&total), "{total}");
}

/// The reserve holds only while a higher level is active: once `critical` has sent nothing
/// for a window, `sheddable` draws from the whole allowance again.
#[test]
fn a_reserve_lapses_a_window_after_the_higher_level_went_quiet() {
    use Criticality::{Critical, Sheddable};
    let clock = FakeClock::new();
    let b = RetryBudget::builder()
        .ratio(0.0)
        .min_retries_per_sec(1)
        .clock(clock.clone())
        .build()
        .unwrap();
    b.deposit_at(Critical);
    // The floor: 10 retries in the window; sheddable may take 5 while critical is active.
    let taken = (0..10).filter(|_| b.withdraw_at(Sheddable)).count();
    assert_eq!(taken, 5);
    assert!(b.withdraw_at(Critical), "critical takes the reserve");
    // 10 s later critical's note has aged out of the window, and so have the withdrawals.
    clock.advance(Duration::from_secs(11));
    let taken = (0..12).filter(|_| b.withdraw_at(Sheddable)).count();
    assert_eq!(taken, 10, "the whole allowance");
}

#[test]
fn refusals_are_counted_by_level() {
    use Criticality::{Critical, Sheddable};
    let clock = FakeClock::new();
    let b = RetryBudget::builder()
        .name("levels")
        .ratio(0.0)
        .min_retries_per_sec(1)
        .clock(clock)
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        b.deposit_at(Critical);
        for _ in 0..8 {
            b.withdraw_at(Sheddable); // 5 granted, 3 refused
        }
        for _ in 0..7 {
            b.withdraw_at(Critical); // 5 granted (no level above it), 2 refused
        }
    });
    let refused: std::collections::BTreeMap<String, u64> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == RETRIES_REFUSED)
        .map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                panic!("a counter")
            };
            let level = key
                .key()
                .labels()
                .find(|l| l.key() == "criticality")
                .map(|l| l.value().to_owned())
                .unwrap();
            (level, n)
        })
        .collect();
    assert_eq!(refused["sheddable"], 3);
    assert_eq!(refused["critical"], 2);
    assert_eq!(refused["sheddable-plus"] + refused["critical-plus"], 0);
}
