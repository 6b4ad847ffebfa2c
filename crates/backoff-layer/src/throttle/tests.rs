//! The throttle's rules, each on a fake clock, ticked by hand every slot of time; the
//! ticker itself is tested under paused tokio time.

use std::time::Duration;

use http::Uri;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use overload_core::clock::FakeClock;

use super::scope::Target;
use super::table::ThrottleOutcome::{Accepted, Failed};
use super::*;
use crate::backoff::Seeds;

const SLOT: Duration = Duration::from_millis(200);

/// A throttle with the defaults on a fake clock, seeded.
fn throttle(clock: &FakeClock) -> Throttle {
    builder(clock).build().unwrap()
}

fn builder(clock: &FakeClock) -> ThrottleBuilder {
    Throttle::builder()
        .clock(clock.clone())
        .seeds(Seeds::from_seed(7))
}

fn uri(s: &'static str) -> Uri {
    Uri::from_static(s)
}

/// A destination under test: its requests at `rate` per second, each answered with the
/// outcome `answer` gives it, ticked every slot. Counts what was sent and refused.
struct Traffic<'a> {
    throttle: &'a Throttle,
    clock: &'a FakeClock,
    sent: u64,
    refused: u64,
    /// Nanoseconds since the start: when the next slot closes.
    next_tick: Duration,
    now: Duration,
}

impl<'a> Traffic<'a> {
    fn new(throttle: &'a Throttle, clock: &'a FakeClock) -> Self {
        Self {
            throttle,
            clock,
            sent: 0,
            refused: 0,
            next_tick: SLOT,
            now: Duration::ZERO,
        }
    }

    /// `per_second` requests a second to `to` for `secs`, each answered with `answer(i)`
    /// at once (`None`: no answer in this call, still in flight); calls `each_slot` after
    /// every tick with the time since the start.
    fn run(
        &mut self,
        to: &Uri,
        per_second: u32,
        for_: Duration,
        mut answer: impl FnMut(u64) -> Option<table::ThrottleOutcome>,
        mut each_slot: impl FnMut(Duration, f64),
    ) {
        let gap = Duration::from_secs(1) / per_second;
        let end = self.now + for_;
        let mut i = 0;
        while self.now < end {
            self.now += gap;
            self.clock.set(self.now);
            if self.now >= self.next_tick {
                self.throttle.tick();
                self.next_tick += SLOT;
                each_slot(self.now, self.throttle.probability(to));
            }
            match self.throttle.admit(Target::uri(to)) {
                Ok(ticket) => {
                    self.sent += 1;
                    if let (Some(ticket), Some(outcome)) = (ticket, answer(i)) {
                        self.throttle.record(ticket, Some(outcome));
                    }
                }
                Err(_) => self.refused += 1,
            }
            i += 1;
        }
    }
}

#[test]
fn a_healthy_destination_is_never_refused() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://healthy:80/");
    traffic.run(
        &to,
        500,
        Duration::from_secs(60),
        |_| Some(Accepted),
        |_, p| {
            assert!(p <= 0.0, "{p}");
        },
    );
    assert_eq!((traffic.sent, traffic.refused), (30_000, 0));
}

#[test]
fn twenty_percent_rejections_are_never_refused() {
    // A rate limit at 80 % of the load: one request in five fails, steadily, for ten
    // minutes at 100 requests a second.
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://limited:80/");
    traffic.run(
        &to,
        100,
        Duration::from_secs(600),
        |i| Some(if i % 5 == 4 { Failed } else { Accepted }),
        |_, _| {},
    );
    assert_eq!(traffic.refused, 0);
    // And at random, not in a neat pattern: the seeded draws decide.
    let mut rng = Seeds::from_seed(3).rng();
    let mut traffic = Traffic::new(&t, &clock);
    traffic.now = clock_now(&clock);
    traffic.next_tick = traffic.now + SLOT;
    traffic.run(
        &to,
        100,
        Duration::from_secs(600),
        |_| {
            let draw = rand::RngCore::next_u32(&mut rng);
            Some(if draw < u32::MAX / 5 {
                Failed
            } else {
                Accepted
            })
        },
        |_, _| {},
    );
    assert_eq!(traffic.refused, 0);
}

fn clock_now(clock: &FakeClock) -> Duration {
    Duration::from_nanos(overload_core::clock::Clock::now(clock))
}

/// When a destination starts failing after a window full of successes, how long until
/// the throttle refuses: within the window (2 s) however long the successes lasted.
#[test]
fn it_reacts_within_seconds_after_a_long_run_of_successes() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://flaky:80/");
    traffic.run(
        &to,
        100,
        Duration::from_secs(300),
        |_| Some(Accepted),
        |_, _| {},
    );
    let failing_from = traffic.now;
    let mut throttled_at = None;
    traffic.run(
        &to,
        100,
        Duration::from_secs(5),
        |_| Some(Failed),
        |now, p| {
            if p > 0.0 && throttled_at.is_none() {
                throttled_at = Some(now - failing_from);
            }
        },
    );
    let after = throttled_at.expect("throttled");
    // Failures outnumber the window's successes after half the window, and the next slot
    // closes on it.
    assert!(after <= Duration::from_millis(1_200), "after {after:?}");
    assert!((t.probability(&to) - 0.9).abs() < 1e-6, "at the cap");
}

/// A destination that goes silent (its requests hang, then time out after 2 s) is
/// throttled as soon as the timeouts come: the silence has emptied the window of
/// successes.
#[test]
fn a_silent_destination_is_throttled_at_its_first_timeouts() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://stopped:80/");
    traffic.run(
        &to,
        100,
        Duration::from_secs(30),
        |_| Some(Accepted),
        |_, _| {},
    );
    // Stopped: for 2 s nothing comes back.
    let mut in_flight = Vec::new();
    let stopped_at = traffic.now;
    let mut throttled_at = None;
    for step in 1..=500u32 {
        traffic.now += Duration::from_millis(10);
        clock.set(traffic.now);
        if traffic.now >= traffic.next_tick {
            t.tick();
            traffic.next_tick += SLOT;
            if t.probability(&to) > 0.0 && throttled_at.is_none() {
                throttled_at = Some(traffic.now - stopped_at);
            }
        }
        if let Ok(Some(ticket)) = t.admit(Target::uri(&to)) {
            in_flight.push((step, ticket));
        }
        // Each attempt times out 2 s (200 steps) after it was sent.
        while in_flight
            .first()
            .is_some_and(|(sent, _)| step - sent >= 200)
        {
            let (_, ticket) = in_flight.remove(0);
            t.record(ticket, Some(Failed));
        }
    }
    let after = throttled_at.expect("throttled");
    // 2 s of silence, then the first slot that holds 10 timeouts.
    assert!(
        (Duration::from_secs(2)..=Duration::from_millis(2_400)).contains(&after),
        "after {after:?}"
    );
}

#[test]
fn it_starts_only_at_min_failures_and_stays_with_fewer() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let to = uri("http://few:80/");
    let fail = |n: u32| {
        for _ in 0..n {
            if let Ok(Some(ticket)) = t.admit(Target::uri(&to)) {
                t.record(ticket, Some(Failed));
            }
        }
    };
    fail(9);
    clock.advance(SLOT);
    t.tick();
    assert!(
        t.probability(&to) <= 0.0,
        "9 failures in the window: not yet"
    );
    fail(1);
    clock.advance(SLOT);
    t.tick();
    assert!(
        (t.probability(&to) - 0.9).abs() < 1e-6,
        "10: (10 - 0) / 11, capped"
    );
    // A window later the ten have left it; two probes failing keep it throttled.
    for _ in 0..10 {
        clock.advance(SLOT);
        t.tick();
    }
    fail(50);
    clock.advance(SLOT);
    t.tick();
    let p = t.probability(&to);
    assert!(p > 0.5, "{p}");
}

#[test]
fn refusals_stop_at_the_cap_so_probes_always_go() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://down:80/");
    traffic.run(
        &to,
        100,
        Duration::from_secs(60),
        |_| Some(Failed),
        |_, _| {},
    );
    // 6000 requests: 20 before the first slot closed, then 9 in 10 refused.
    let share = traffic.refused as f64 / 6_000.0;
    assert!((0.87..=0.91).contains(&share), "refused {share}");
    assert!(traffic.sent >= 500, "probes: {}", traffic.sent);
}

/// Throttled at the cap, its window full of failures: once the probes succeed, the
/// throttle lets everything through within a second.
#[test]
fn it_reopens_within_a_second_of_recovery() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://back:80/");
    traffic.run(
        &to,
        100,
        Duration::from_secs(20),
        |_| Some(Failed),
        |_, _| {},
    );
    assert!((t.probability(&to) - 0.9).abs() < 1e-6);
    let recovered_at = traffic.now;
    let mut open_at = None;
    traffic.run(
        &to,
        100,
        Duration::from_secs(3),
        |_| Some(Accepted),
        |now, p| {
            if p <= 0.0 && open_at.is_none() {
                open_at = Some(now - recovered_at);
            }
        },
    );
    let after = open_at.expect("reopened");
    assert!(after <= Duration::from_secs(1), "after {after:?}");
}

#[test]
fn a_destination_half_up_is_not_forgiven_and_stays_throttled() {
    // A third of what is sent is accepted: under 1 / K, so the throttle refuses some, and
    // no slot forgives the failures (it would need K accepts per failure).
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://third:80/");
    let mut seen = Vec::new();
    traffic.run(
        &to,
        100,
        Duration::from_secs(30),
        |i| Some(if i % 3 == 0 { Accepted } else { Failed }),
        |now, p| {
            if now > Duration::from_secs(10) {
                seen.push(p);
            }
        },
    );
    let mean = seen.iter().sum::<f64>() / seen.len() as f64;
    // (sent - 2 * sent / 3) / sent = 1 / 3 at the sent outcomes' share, whatever is
    // refused.
    assert!((0.25..=0.4).contains(&mean), "mean probability {mean}");
    assert!(seen.iter().all(|p| *p > 0.0), "{seen:?}");
}

#[test]
fn no_evidence_keeps_the_probability_and_an_idle_destination_is_released() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://quiet:80/");
    traffic.run(
        &to,
        100,
        Duration::from_secs(5),
        |_| Some(Failed),
        |_, _| {},
    );
    assert!((t.probability(&to) - 0.9).abs() < 1e-6);
    // Requests still go (90 % refused) but none comes back: the failures leave the window
    // (the probability follows them down to (1 - 0) / 2), then, with no outcome in the
    // window, it holds.
    let mut seen = Vec::new();
    traffic.run(
        &to,
        100,
        Duration::from_secs(5),
        |_| None,
        |_, p| seen.push(p),
    );
    let emptied = &seen[10..];
    assert!(
        emptied.iter().all(|p| (p - emptied[0]).abs() < 1e-12),
        "{seen:?}"
    );
    assert!(emptied[0] >= 0.5, "{seen:?}");
    // No request at all for 10 windows (20 s): the slot is given up, and with it the
    // probability. (The first tick closes the slot of the last requests.)
    clock.advance(SLOT);
    t.tick();
    let mut released = 0;
    for _ in 0..99 {
        clock.advance(SLOT);
        released += t.tick().released;
    }
    assert_eq!(released, 0, "not before 100 idle slots");
    assert!(t.probability(&to) > 0.0);
    clock.advance(SLOT);
    assert_eq!(t.tick().released, 1);
    assert!(t.probability(&to) <= 0.0);
}

#[test]
fn a_failing_destination_never_throttles_a_healthy_one() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let (bad, good) = (uri("http://bad:80/x"), uri("http://good:80/y"));
    let mut refused_good = 0;
    let mut refused_bad = 0;
    for step in 1..=6_000u32 {
        clock.advance(Duration::from_millis(10));
        if step % 20 == 0 {
            t.tick();
        }
        match t.admit(Target::uri(&bad)) {
            Ok(Some(ticket)) => t.record(ticket, Some(Failed)),
            Ok(None) => unreachable!("room for two"),
            Err(_) => refused_bad += 1,
        }
        match t.admit(Target::uri(&good)) {
            Ok(Some(ticket)) => t.record(ticket, Some(Accepted)),
            Ok(None) => unreachable!("room for two"),
            Err(_) => refused_good += 1,
        }
    }
    assert_eq!(refused_good, 0);
    assert!(refused_bad > 5_000, "{refused_bad}");
}

#[test]
fn destinations_beyond_the_table_are_sent_unthrottled_and_counted() {
    let clock = FakeClock::new();
    let t = builder(&clock).max_destinations(8).build().unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let untracked = metrics::with_local_recorder(&recorder, || {
        let uris: Vec<Uri> = (0..9)
            .map(|i| format!("http://host{i}:80/").parse().unwrap())
            .collect();
        // One bucket of 8: the ninth destination finds no room.
        let tickets: Vec<_> = uris
            .iter()
            .map(|u| t.admit(Target::uri(u)).unwrap())
            .collect();
        let untracked: Vec<usize> = (0..9).filter(|&i| tickets[i].is_none()).collect();
        // Failing, the untracked one is never refused.
        for _ in 0..10 {
            for _ in 0..100 {
                let u = &uris[untracked[0]];
                assert!(matches!(t.admit(Target::uri(u)), Ok(None)));
            }
            clock.advance(SLOT);
            t.tick();
        }
        untracked
    });
    assert_eq!(untracked.len(), 1);
    let counted = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .find(|(key, ..)| key.key().name() == "backoff_layer_throttle_untracked_total")
        .map(|(.., value)| value);
    assert_eq!(counted, Some(DebugValue::Counter(1_001)));
}

/// Regression (issue 30, finding 1): a ticker that had not ticked for ten slots was taken
/// for a dead one, and every request let through; but a client starved of CPU (the storm
/// itself) ticks late. The throttle keeps refusing at the last probability.
#[test]
fn a_late_ticker_keeps_the_throttle_refusing() {
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let mut traffic = Traffic::new(&t, &clock);
    let to = uri("http://down:80/");
    traffic.run(
        &to,
        100,
        Duration::from_secs(5),
        |_| Some(Failed),
        |_, _| {},
    );
    assert!((t.probability(&to) - 0.9).abs() < 1e-6);
    // No tick for a hundred slots.
    clock.advance(SLOT * 100);
    let refused = (0..1_000)
        .filter(|_| t.admit(Target::uri(&to)).is_err())
        .count();
    assert!((850..=950).contains(&refused), "{refused} of 1000 refused");
}

/// Regression (issue 30, finding 1): the ticker was spawned on the runtime of the first
/// request, behind a flag that never reset; a client used from a second runtime after the
/// first was dropped (a `static` client, a runtime per call) never throttled again.
#[test]
fn a_throttle_used_from_a_second_runtime_throttles() {
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    };
    // NOTE: a fake clock moved with tokio's paused time: each paused runtime's time starts
    // anew, the fake clock's goes on.
    let clock = FakeClock::new();
    let t = throttle(&clock);
    let to = uri("http://flaky:80/");
    let step = |ms: u64| {
        clock.advance(Duration::from_millis(ms));
        tokio::time::sleep(Duration::from_millis(ms))
    };
    let send = |t: &Throttle, outcome| match t.admit(Target::uri(&to)) {
        Ok(Some(ticket)) => {
            t.record(ticket, Some(outcome));
            true
        }
        Ok(None) => unreachable!("room for one"),
        Err(_) => false,
    };
    // The first runtime: a healthy destination, then the runtime goes.
    let first = runtime();
    first.block_on(async {
        for _ in 0..50 {
            assert!(send(&t, Accepted));
            step(20).await;
        }
    });
    drop(first);
    // The second runtime: the destination fails; once the window has forgotten the
    // successes (2 s), it is throttled at the most.
    let second = runtime();
    let refused = second.block_on(async {
        let mut refused = 0;
        for _ in 0..300 {
            if !send(&t, Failed) {
                refused += 1;
            }
            step(10).await;
        }
        refused
    });
    assert!(
        (t.probability(&to) - 0.9).abs() < 1e-6,
        "{}",
        t.probability(&to)
    );
    assert!(refused > 100, "{refused} of 300 refused");
}

#[test]
fn refusals_and_the_probability_are_reported_by_name_and_destination() {
    let clock = FakeClock::new();
    let t = builder(&clock).name("inventory").build().unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let (sent, refused) = metrics::with_local_recorder(&recorder, || {
        let mut traffic = Traffic::new(&t, &clock);
        let to = uri("http://10.0.0.7:8080/api");
        traffic.run(
            &to,
            100,
            Duration::from_secs(5),
            |_| Some(Failed),
            |_, _| {},
        );
        (traffic.sent, traffic.refused)
    });
    assert!(refused > 0 && sent > 0);
    let mut seen = std::collections::BTreeMap::new();
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let labels: Vec<String> = key
            .key()
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        seen.insert(format!("{}{labels:?}", key.key().name()), value);
    }
    assert_eq!(
        seen.get(
            "backoff_layer_throttle_refused_total[\"name=inventory\", \"criticality=critical\"]"
        ),
        Some(&DebugValue::Counter(refused))
    );
    for level in ["sheddable", "sheddable-plus", "critical-plus"] {
        assert_eq!(
            seen.get(&format!(
                "backoff_layer_throttle_refused_total[\"name=inventory\", \"criticality={level}\"]"
            )),
            Some(&DebugValue::Counter(0)),
            "{level}"
        );
    }
    assert_eq!(
        seen.get("backoff_layer_throttle_untracked_total[\"name=inventory\"]"),
        Some(&DebugValue::Counter(0))
    );
    let gauge = seen.get(
        "backoff_layer_throttle_probability[\"name=inventory\", \"destination=http://10.0.0.7:8080\"]",
    );
    assert!(
        matches!(gauge, Some(DebugValue::Gauge(p)) if (p.into_inner() - 0.9).abs() < 1e-6),
        "{seen:?}"
    );
}

/// Issue 31, finding 5: beyond `max_labelled_destinations`, destinations share the series
/// `(other)`, which shows the highest probability among them, and 0 once none is
/// throttled; a labelled destination throttled again after its slot was released is set in
/// its own series again.
#[test]
fn destinations_beyond_the_labelled_ones_share_one_series() {
    let clock = FakeClock::new();
    let t = builder(&clock)
        .name("hooks")
        .max_labelled_destinations(1)
        .build()
        .unwrap();
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let gauges = || {
        let mut seen = std::collections::BTreeMap::new();
        for (key, _, _, value) in snapshotter.snapshot().into_vec() {
            if let DebugValue::Gauge(p) = value {
                let destination = key
                    .key()
                    .labels()
                    .find(|l| l.key() == "destination")
                    .map(|l| l.value().to_owned())
                    .unwrap();
                seen.insert(destination, (p.into_inner() * 100.0).round() as u32);
            }
        }
        seen
    };
    let (a, b, c) = (uri("http://a:1/"), uri("http://b:1/"), uri("http://c:1/"));
    metrics::with_local_recorder(&recorder, || {
        let mut traffic = Traffic::new(&t, &clock);
        // `a` is throttled first: its own series; then `b`, in `(other)`.
        traffic.run(&a, 100, Duration::from_secs(3), |_| Some(Failed), |_, _| {});
        traffic.run(&b, 100, Duration::from_secs(3), |_| Some(Failed), |_, _| {});
    });
    // (`a`'s window, without requests while `b` runs, keeps its last probes' outcome.)
    let seen = gauges();
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["(other)", "http://a:1"]);
    assert_eq!(seen["(other)"], 90);
    assert!(seen["http://a:1"] > 0, "{seen:?}");
    metrics::with_local_recorder(&recorder, || {
        let mut traffic = Traffic::new(&t, &clock);
        traffic.now = clock_now(&clock);
        traffic.next_tick = traffic.now + SLOT;
        // `b` recovers, then `c` fails: `(other)` follows them; `a` is left idle, released.
        traffic.run(
            &b,
            100,
            Duration::from_secs(3),
            |_| Some(Accepted),
            |_, _| {},
        );
        assert_eq!(gauges()["(other)"], 0);
        traffic.run(
            &c,
            100,
            Duration::from_secs(30),
            |_| Some(Failed),
            |_, _| {},
        );
        assert_eq!(gauges()["(other)"], 90);
        assert_eq!(gauges()["http://a:1"], 0, "released");
        // `a` again: its own series, not `(other)`.
        traffic.run(&a, 100, Duration::from_secs(3), |_| Some(Failed), |_, _| {});
    });
    let seen = gauges();
    assert_eq!(seen.keys().collect::<Vec<_>>(), ["(other)", "http://a:1"]);
    assert_eq!(seen["http://a:1"], 90);
}

#[test]
fn a_layer_scope_throttles_every_destination_together() {
    let clock = FakeClock::new();
    let t = builder(&clock).scope(ThrottleScope::Layer).build().unwrap();
    let mut traffic = Traffic::new(&t, &clock);
    traffic.run(
        &uri("http://a:1/"),
        100,
        Duration::from_secs(5),
        |_| Some(Failed),
        |_, _| {},
    );
    assert!(t.probability(&uri("http://b:2/")) > 0.0);
}

#[test]
fn invalid_settings_are_refused_by_name() {
    let refused = |b: ThrottleBuilder| {
        let e = b.build().unwrap_err();
        (e.field(), e.to_string())
    };
    assert_eq!(
        refused(Throttle::builder().max_probability(1.0)),
        (
            "max_probability",
            "max_probability must be within 0..1, both excluded, got 1.0".to_owned()
        )
    );
    assert_eq!(
        refused(Throttle::builder().max_probability(0.0)).0,
        "max_probability"
    );
    assert_eq!(
        refused(Throttle::builder().max_probability(f64::NAN)).1,
        "max_probability must be a finite number, got NaN"
    );
    assert_eq!(
        refused(Throttle::builder().multiplier(0.5)).1,
        "multiplier must be within 1..=100, got 0.5"
    );
    assert_eq!(
        refused(Throttle::builder().multiplier(f64::INFINITY)).0,
        "multiplier"
    );
    assert_eq!(
        refused(Throttle::builder().slots(0)).1,
        "slots must be within 1..=64, got 0"
    );
    assert_eq!(
        refused(Throttle::builder().window(Duration::from_millis(50))).1,
        "window / slots must be at least 10ms, got 50ms / 10 = 5ms"
    );
    assert_eq!(
        refused(Throttle::builder().window(Duration::from_secs(601))).0,
        "window"
    );
    assert_eq!(
        refused(Throttle::builder().max_destinations(0)).0,
        "max_destinations"
    );
    assert_eq!(
        refused(Throttle::builder().max_destinations(65_537)).0,
        "max_destinations"
    );
    assert_eq!(
        refused(Throttle::builder().max_labelled_destinations(1_025)).1,
        "max_labelled_destinations must be within 0..=1024, got 1025"
    );
    assert_eq!(refused(Throttle::builder().name("")).0, "name");
    assert!(
        Throttle::builder()
            .window(Duration::from_millis(100))
            .slots(10)
            .multiplier(1.0)
            .max_probability(0.99)
            .min_failures(0)
            .max_destinations(1)
            .max_labelled_destinations(0)
            .build()
            .is_ok()
    );
}

#[test]
fn defaults_are_the_documented_ones() {
    let t = Throttle::new();
    assert_eq!(t.name(), "default");
    assert_eq!(t.window(), Duration::from_secs(2));
    assert_eq!(t.slots(), 10);
    assert!((t.multiplier() - 2.0).abs() < 1e-12);
    assert!((t.max_probability() - 0.9).abs() < 1e-12);
    assert_eq!(t.min_failures(), 10);
    assert_eq!(t.max_destinations(), 256);
    assert_eq!(t.max_labelled_destinations(), 32);
    assert_eq!(
        Throttle::DEFAULT_MAX_LABELLED_DESTINATIONS,
        t.max_labelled_destinations()
    );
    assert_eq!(t.scope(), ThrottleScope::Destination);
    assert_eq!(
        format!("{:?}", Throttle::builder().build().unwrap()),
        format!("{t:?}")
    );
}

/// The ticker: spawned by the first request on its runtime, it closes a slot every 200 ms
/// of (paused) time by itself.
#[tokio::test(start_paused = true)]
async fn the_ticker_closes_slots_by_itself() {
    let t = Throttle::new();
    let to = uri("http://down:80/");
    for _ in 0..20 {
        if let Ok(Some(ticket)) = t.admit(Target::uri(&to)) {
            t.record(ticket, Some(Failed));
        }
    }
    assert!(t.probability(&to) <= 0.0, "no slot closed yet");
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!((t.probability(&to) - 0.9).abs() < 1e-6);
    // Accepts reopen it, at the next slots.
    for _ in 0..200 {
        if let Ok(Some(ticket)) = t.admit(Target::uri(&to)) {
            t.record(ticket, Some(Accepted));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(t.probability(&to) <= 0.0);
}

/// A client sending one level is throttled exactly as the rule alone decides, request by
/// request: every decision is the draw of the same seeds against the destination's
/// probability (refused when a draw falls below it, no draw at 0), whichever the level.
#[test]
fn one_level_is_decided_exactly_as_the_rule_alone() {
    use overload_signal::protocol::Criticality;

    use super::rule::to_units;

    for level in Criticality::ALL {
        let clock = FakeClock::new();
        let t = throttle(&clock);
        // The same seeds as the throttle's: what it draws, the test draws.
        let draws = Seeds::from_seed(7);
        let to = uri("http://flaky:80/");
        let mut next_tick = SLOT;
        let (mut refused, mut sent) = (0, 0);
        for i in 0..4_000u64 {
            let now = Duration::from_millis(5 * i + 1);
            clock.set(now);
            if now >= next_tick {
                t.tick();
                next_tick += SLOT;
            }
            let probability = to_units(t.probability(&to));
            let expected = probability != 0 && draws.next_seed() >> 32 < probability;
            match t.admit_at(Target::uri(&to), level) {
                Ok(ticket) => {
                    assert!(!expected, "{level} request {i}: sent, the rule refuses it");
                    sent += 1;
                    // Down for 10 s, then up again.
                    let outcome = if i < 2_000 { Failed } else { Accepted };
                    t.record(ticket.unwrap(), Some(outcome));
                }
                Err(_) => {
                    assert!(expected, "{level} request {i}: refused, the rule sends it");
                    refused += 1;
                }
            }
        }
        assert!(refused > 1_000 && sent > 2_000, "{level}: {refused} {sent}");
    }
}

/// Two levels to one failing destination, on the fake clock: once throttling begins, every
/// `sheddable` request is refused while `critical` ones still go (the destination's
/// probability, 0.9, is placed on the lower level first), and the total sent is the rule's.
#[test]
fn mixed_levels_are_refused_from_the_bottom() {
    use overload_signal::protocol::Criticality::{Critical, Sheddable};

    let clock = FakeClock::new();
    let t = throttle(&clock);
    let to = uri("http://down:80/");
    let mut next_tick = SLOT;
    let mut per_slot = Vec::new();
    let mut slot = [[0u32; 2]; 2]; // [level][refused, offered]
    for i in 0..2_000u64 {
        let now = Duration::from_millis(5 * i + 1);
        clock.set(now);
        if now >= next_tick {
            t.tick();
            next_tick += SLOT;
            per_slot.push(slot);
            slot = [[0; 2]; 2];
        }
        for (n, level) in [Sheddable, Critical].into_iter().enumerate() {
            slot[n][1] += 1;
            match t.admit_at(Target::uri(&to), level) {
                Ok(ticket) => t.record(ticket.unwrap(), Some(Failed)),
                Err(_) => slot[n][0] += 1,
            }
        }
    }
    let throttled: Vec<_> = per_slot.iter().filter(|s| s[0][0] + s[1][0] > 0).collect();
    assert!(throttled.len() >= 40, "{}", throttled.len());
    for s in &throttled[1..] {
        assert_eq!(s[0][0], s[0][1], "every sheddable refused: {s:?}");
        assert!(s[1][0] < s[1][1], "critical requests still go: {s:?}");
    }
    let (refused, offered) = throttled[1..].iter().fold((0, 0), |(r, o), s| {
        (r + s[0][0] + s[1][0], o + s[0][1] + s[1][1])
    });
    let share = f64::from(refused) / f64::from(offered);
    assert!((0.86..=0.94).contains(&share), "{share}");
}
