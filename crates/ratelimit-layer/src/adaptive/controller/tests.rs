//! The controller's rules, driven window by window with plain numbers.

use super::*;

const MS: u64 = 1_000_000;

fn settings() -> AdaptiveSettings {
    AdaptiveSettings {
        initial_limit: 20,
        min_limit: 3,
        max_limit: 1000,
        window: Duration::from_millis(100),
        min_samples: 50,
        quantile: 0.5,
        tolerance: 1.25,
        probe_interval: Duration::from_secs(60),
        probe_jitter: 0.15,
        probe_samples: 50,
        probe_share: 0.25,
        probe_timeout: Duration::from_secs(5),
        failure_threshold: 0.1,
        backoff: 0.9,
        baseline: None,
        seed: 7,
    }
}

fn window(latency_ms: u64, peak: usize) -> AdaptiveWindowStats {
    AdaptiveWindowStats {
        samples: 100,
        failures: 0,
        latency: Some(latency_ms * MS),
        peak_in_flight: peak,
        rejected: true,
        timed_out: false,
    }
}

/// The same window, in which the limit rejected nobody.
fn calm(latency_ms: u64, peak: usize) -> AdaptiveWindowStats {
    AdaptiveWindowStats {
        rejected: false,
        ..window(latency_ms, peak)
    }
}

/// A controller past its first window, with a baseline of `baseline_ms`.
fn tracking(baseline_ms: u64) -> GradientController {
    let mut c = GradientController::new(settings(), 0);
    assert_eq!(c.limit(), 20, "starts at the initial limit");
    let u = c.on_window(0, window(baseline_ms, 3));
    assert_eq!(
        u.limit, 20,
        "3 in flight: the limit was not in use, it holds"
    );
    assert_eq!(c.baseline(), Some(baseline_ms * MS));
    assert_eq!(c.phase(), ControllerPhase::Tracking);
    c
}

/// A controller with a seeded baseline of `baseline_ms` whose first probe is overdue.
fn overdue(baseline_ms: u64) -> GradientController {
    let mut s = settings();
    s.baseline = Some(baseline_ms * MS);
    let mut c = GradientController::new(s, 0);
    c.next_probe = 0;
    c
}

/// Regression (issue 23, finding 3): a fresh limit started at its minimum (3) and held
/// it until 50 requests had completed, so a new process turned most of its first
/// traffic away. It starts at the initial limit and measures its first baseline there.
#[test]
fn starts_at_the_initial_limit_and_measures_its_first_baseline_there() {
    let mut c = GradientController::new(settings(), 0);
    assert_eq!(c.limit(), 20);
    assert_eq!(c.phase(), ControllerPhase::Tracking);
    assert_eq!(c.baseline(), None);
    assert_eq!(c.samples_needed(), 50);
    assert_eq!(
        c.deadline_nanos(),
        None,
        "nothing to time out: the limit is not cut"
    );
    let u = c.on_window(100 * MS, window(100, 20));
    assert_eq!(
        (u.limit, u.probe_started),
        (29, false),
        "20 * 1.25 + sqrt(20)"
    );
    assert_eq!(c.baseline(), Some(100 * MS));
    // Failures in the first window back off as they would later.
    let mut c = GradientController::new(settings(), 0);
    let stats = AdaptiveWindowStats {
        samples: 10,
        failures: 40,
        ..window(100, 20)
    };
    assert_eq!(c.on_window(100 * MS, stats).limit, 18, "20 * 0.9");
    // Only failures: no baseline yet, the next window tries again.
    let mut c = GradientController::new(settings(), 0);
    let stats = AdaptiveWindowStats {
        samples: 0,
        failures: 50,
        latency: None,
        ..window(100, 20)
    };
    c.on_window(100 * MS, stats);
    assert_eq!(c.baseline(), None);
    assert_eq!(c.phase(), ControllerPhase::Tracking);
}

#[test]
fn a_seeded_baseline_tracks_from_the_first_window() {
    let mut s = settings();
    s.baseline = Some(100 * MS);
    let mut c = GradientController::new(s, 0);
    assert_eq!(c.samples_needed(), 50);
    let u = c.on_window(100 * MS, window(100, 20));
    assert!(u.limit > 20, "{}", u.limit);
    assert!(!u.probe_started);
}

#[test]
fn grows_while_latency_is_at_the_baseline() {
    let mut c = tracking(100);
    let mut last = c.limit();
    for i in 1..=5 {
        let u = c.on_window(i * 100 * MS, window(100, last));
        assert!(u.limit > last, "{} after {last}", u.limit);
        last = u.limit;
    }
    // 20 -> 1.25 * 20 + sqrt(20) = 29.5 -> ... at most doubling per window.
    assert!(last <= 20 << 5);
}

#[test]
fn does_not_grow_a_limit_that_traffic_does_not_use() {
    let mut c = tracking(100);
    let u = c.on_window(100 * MS, window(100, 9));
    assert_eq!(u.limit, 20, "9 in flight is under half of 20");
}

#[test]
fn settles_where_latency_meets_the_target() {
    // A service whose latency grows with the concurrency beyond 30 (the article's
    // model's shape): 100 ms up to 30, then 1.05 per 15 more.
    let latency = |c: usize| {
        let over = c.saturating_sub(30) as f64 / 15.0;
        (100.0 * 1.05f64.powf(over)) as u64
    };
    let mut c = tracking(100);
    let mut limit = c.limit();
    let mut probes = 0;
    for i in 1..200 {
        let u = c.on_window(i * 100 * MS, window(latency(limit), limit));
        probes += usize::from(u.probe_started);
        limit = u.limit;
    }
    // The limit oscillates around the point where latency meets the target, 125 ms.
    let at = latency(limit);
    assert!((115..=140).contains(&at), "limit {limit} at {at} ms");
    assert_eq!(probes, 0, "none due within 20 s");
    // The probes of the next minutes measure at a quarter of the limit, under the knee:
    // the baseline stays the no-load latency.
    for i in 200..3_000 {
        let u = c.on_window(i * 100 * MS, window(latency(limit), limit));
        probes += usize::from(u.probe_started);
        limit = u.limit;
    }
    // A probe due while the latency is under the target waits an interval more.
    assert!((1..=5).contains(&probes), "{probes} probes in 5 minutes");
    assert_eq!(c.baseline(), Some(100 * MS));
    let at = latency(limit);
    assert!((100..=140).contains(&at), "limit {limit} at {at} ms");
}

#[test]
fn halves_at_most_per_window_when_latency_explodes() {
    let mut c = tracking(100);
    let u = c.on_window(100 * MS, calm(10_000, 20));
    assert_eq!(u.limit, 10, "0.5 * 20");
}

#[test]
fn backs_off_on_overload_failures() {
    let mut c = tracking(100);
    let stats = AdaptiveWindowStats {
        samples: 80,
        failures: 20,
        latency: Some(50 * MS),
        peak_in_flight: 20,
        rejected: false,
        timed_out: false,
    };
    assert_eq!(c.on_window(100 * MS, stats).limit, 18, "20 * 0.9");
    // Under the threshold, failures are ignored and the gradient applies.
    let stats = AdaptiveWindowStats {
        failures: 5,
        ..stats
    };
    assert!(c.on_window(200 * MS, stats).limit > 18);
}

/// A probe measures at a share of the limit (here a quarter of 19), not at the
/// minimum: under overload it turns away a quarter of what a probe at 3 did.
#[test]
fn overload_probes_at_a_share_of_the_limit_then_every_interval() {
    let mut c = overdue(100);
    // The first window above the target, with a probe due, probes.
    let t = 0;
    let u = c.on_window(t + 100 * MS, window(130, 20));
    assert!(u.probe_started);
    // 20 * 125 / 130 = 19.2 in force when it started: a quarter is 5.
    assert_eq!(u.limit, 5);
    assert_eq!(c.samples_needed(), 50);
    assert_eq!(c.window_nanos(), 0);
    assert_eq!(c.deadline_nanos(), Some(5_000 * MS));
    // The service is faster than the start-up baseline said: measured, and resumed.
    let t0 = t + 300 * MS;
    assert_eq!(c.on_window(t0, window(80, 5)).limit, 19);
    assert_eq!(c.baseline(), Some(80 * MS));
    // At the target (100 ms), rejecting: no probe, whatever the time.
    let mut t = t0;
    while t < t0 + 59_000 * MS {
        t += 100 * MS;
        assert!(!c.on_window(t, window(100, 0)).probe_started, "at {t}");
    }
    // Above it (the limit shrinking slowly), the next probe comes when it is due.
    let started = loop {
        t += 100 * MS;
        if c.on_window(t, window(102, 0)).probe_started {
            break t;
        }
    };
    let after = started - t0;
    assert!((60_000 * MS..=69_000 * MS).contains(&after), "{after}");
}

/// Regression (issue 23, finding 3): a steady load the service could serve, which
/// bumped into the limit now and then, had its traffic cut to the minimum limit every
/// minute by a probe. Rejections with the latency at or under the target mean the limit
/// has not grown to the demand: no probe.
#[test]
fn no_probe_while_rejections_only_mean_the_limit_is_growing() {
    let mut c = tracking(100);
    for i in 1..=3_000 {
        let u = c.on_window(i * 100 * MS, window(110, 0));
        assert!(!u.probe_started, "window {i}");
    }
}

#[test]
fn no_periodic_probe_while_the_limit_rejects_nobody() {
    // Regression: a probe every minute rejected most of a healthy service's traffic for
    // a second or two (the outage scenario's recovery never "stayed" recovered).
    let mut c = tracking(100);
    for i in 1..=2000 {
        assert!(
            !c.on_window(i * 100 * MS, calm(100, 5)).probe_started,
            "window {i}"
        );
    }
    // Once it rejects above the target again, the next due probe runs.
    let mut t = 2000 * 100 * MS;
    let started = loop {
        t += 100 * MS;
        if c.on_window(t, window(127, 0)).probe_started {
            break t;
        }
    };
    assert!(started - 2000 * 100 * MS <= 69_000 * MS, "{started}");
}

#[test]
fn probes_when_stuck_at_the_minimum() {
    let mut c = tracking(100);
    // The service is now ten times slower than the baseline says; nothing is rejected.
    let mut started = None;
    for i in 1..=20 {
        if c.on_window(i * 100 * MS, calm(1_000, 20)).probe_started {
            started = Some(i);
            break;
        }
    }
    let started = started.expect("a probe started");
    assert!((6..=12).contains(&started), "after {started} windows");
    assert_eq!(c.limit(), 3);
    c.on_window(started * 100 * MS + 1, window(1_000, 3));
    assert_eq!(c.baseline(), Some(1_000 * MS));
}

/// Regression (issue 23, finding 3): a probe waited for its samples however long it
/// took, so when an outer timeout dropped every request it admitted, the limit stayed
/// cut for good. A probe ends at its deadline, keeping the baseline it had.
#[test]
fn a_probe_that_cannot_complete_ends_at_its_deadline() {
    let mut c = overdue(100);
    assert!(c.on_window(100 * MS, window(200, 20)).probe_started);
    let probing = c.limit();
    // Only failures so far: the probe goes on.
    let failures = AdaptiveWindowStats {
        samples: 0,
        failures: 50,
        latency: None,
        ..window(0, 3)
    };
    assert_eq!(c.on_window(200 * MS, failures).limit, probing);
    assert!(matches!(c.phase(), ControllerPhase::Probing { .. }));
    // Its time runs out with three samples of 50: the old baseline stays, the limit
    // before the probe comes back.
    let few = AdaptiveWindowStats {
        samples: 3,
        latency: Some(20 * MS),
        timed_out: true,
        ..window(0, 3)
    };
    let u = c.on_window(5_200 * MS, few);
    assert_eq!(c.phase(), ControllerPhase::Tracking);
    assert_eq!(c.baseline(), Some(100 * MS));
    assert_eq!(u.limit, 13, "20 * 125 / 200 = 12.5, restored");
    // With half its samples, a late probe still measures.
    let mut c = overdue(100);
    assert!(c.on_window(100 * MS, window(200, 20)).probe_started);
    let half = AdaptiveWindowStats {
        samples: 25,
        latency: Some(90 * MS),
        timed_out: true,
        ..window(0, 3)
    };
    c.on_window(10_400 * MS, half);
    assert_eq!(c.baseline(), Some(90 * MS));
}

#[test]
fn the_limit_stays_within_its_bounds() {
    let mut s = settings();
    s.max_limit = 40;
    let mut c = GradientController::new(s, 0);
    c.on_window(0, window(10, 3));
    for i in 1..50 {
        let u = c.on_window(i * 100 * MS, window(1, 1000));
        assert!(u.limit <= 40);
    }
    assert_eq!(c.limit(), 40);
}

#[test]
fn probe_jitter_spreads_servers() {
    let due = |seed| {
        let mut s = settings();
        s.seed = seed;
        s.baseline = Some(100 * MS);
        GradientController::new(s, 0).next_probe
    };
    let all: std::collections::HashSet<u64> = (0..20).map(due).collect();
    assert!(all.len() > 15, "{} distinct of 20", all.len());
    assert!(
        all.iter()
            .all(|&t| (60_000 * MS..=69_000 * MS).contains(&t))
    );
}
