//! The algorithm, as a state machine of plain numbers: what the limit becomes at the end
//! of each sampling window. No clock, no atomics: the layer feeds it, tests drive it.

use std::time::Duration;

use overload_core::clock::saturating_nanos;

/// The validated settings the controller reads.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct AdaptiveSettings {
    pub(super) initial_limit: usize,
    pub(super) min_limit: usize,
    pub(super) max_limit: usize,
    pub(super) window: Duration,
    pub(super) min_samples: u64,
    pub(super) quantile: f64,
    pub(super) tolerance: f64,
    pub(super) probe_interval: Duration,
    pub(super) probe_jitter: f64,
    pub(super) probe_samples: u64,
    pub(super) failure_threshold: f64,
    pub(super) backoff: f64,
    pub(super) seed: u64,
}

/// Windows in a row at the minimum limit after which the baseline is measured again: the
/// service may have become slower for good, and a baseline that is too low would keep the
/// limit at its floor forever. Envoy's adaptive concurrency filter uses 5.
pub(super) const WINDOWS_AT_MIN_BEFORE_PROBE: u32 = 5;

/// The bounds of the gradient in one window: the limit at most halves or doubles per
/// window, so one noisy window cannot swing it far (Envoy's gradient controller clamps the
/// same way).
const GRADIENT_MIN: f64 = 0.5;
const GRADIENT_MAX: f64 = 2.0;

/// What a closed window held, as the controller sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct AdaptiveWindowStats {
    /// Successful requests measured in the window.
    pub(super) samples: u64,
    /// Requests that failed in a way that means overload.
    pub(super) failures: u64,
    /// The configured percentile of the successes' latencies, in nanoseconds.
    pub(super) latency: Option<u64>,
    /// The most requests in flight at once during the window.
    pub(super) peak_in_flight: usize,
    /// Whether the limit rejected a request during the window.
    pub(super) rejected: bool,
}

/// The controller's phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum ControllerPhase {
    /// Measuring the baseline at the minimum limit; the limit to go back to afterwards.
    Probing { resume: f64 },
    /// Following the gradient.
    Tracking,
}

/// What the layer must do after a window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct AdaptiveLimitUpdate {
    /// The new limit.
    pub(super) limit: usize,
    /// A probe just started: requests admitted before `now` must not count in its window.
    pub(super) probe_started: bool,
}

/// The gradient controller. See the [module docs](super) for the rule and its sources.
#[derive(Clone, Debug)]
pub(super) struct GradientController {
    settings: AdaptiveSettings,
    phase: ControllerPhase,
    /// The limit as a real number: the gradient moves it by fractions.
    limit: f64,
    /// The no-load latency, in nanoseconds, from the last probe.
    baseline: Option<u64>,
    /// The latency percentile of the last window, in nanoseconds.
    last_latency: Option<u64>,
    /// When the next probe is due (clock nanoseconds).
    next_probe: u64,
    windows_at_min: u32,
    probes: u64,
}

impl GradientController {
    /// A controller that starts by measuring the baseline, as nothing is known yet.
    pub(super) fn new(settings: AdaptiveSettings) -> Self {
        Self {
            settings,
            phase: ControllerPhase::Probing {
                resume: settings.initial_limit as f64,
            },
            limit: settings.min_limit as f64,
            baseline: None,
            last_latency: None,
            next_probe: 0,
            windows_at_min: 0,
            probes: 0,
        }
    }

    /// The limit in force.
    pub(super) fn limit(&self) -> usize {
        to_limit(self.limit, &self.settings)
    }

    pub(super) fn phase(&self) -> ControllerPhase {
        self.phase
    }

    pub(super) fn baseline(&self) -> Option<u64> {
        self.baseline
    }

    pub(super) fn last_latency(&self) -> Option<u64> {
        self.last_latency
    }

    /// How many outcomes the current window needs before it may close.
    pub(super) fn samples_needed(&self) -> u64 {
        match self.phase {
            ControllerPhase::Probing { .. } => self.settings.probe_samples,
            ControllerPhase::Tracking => self.settings.min_samples,
        }
    }

    /// How long the current window must last before it may close, in nanoseconds. A probe
    /// ends on its sample count alone.
    pub(super) fn window_nanos(&self) -> u64 {
        match self.phase {
            ControllerPhase::Probing { .. } => 0,
            ControllerPhase::Tracking => saturating_nanos(self.settings.window),
        }
    }

    /// Closes a window at `now` with `stats`; returns the new limit.
    pub(super) fn on_window(
        &mut self,
        now: u64,
        stats: AdaptiveWindowStats,
    ) -> AdaptiveLimitUpdate {
        match self.phase {
            ControllerPhase::Probing { resume } => {
                let Some(latency) = stats.latency else {
                    // Only failures: no baseline can be read. Keep probing.
                    return self.update(false);
                };
                self.baseline = Some(latency.max(1));
                self.last_latency = Some(latency);
                self.phase = ControllerPhase::Tracking;
                self.limit = resume;
                self.schedule_probe(now);
                self.windows_at_min = 0;
                self.update(false)
            }
            ControllerPhase::Tracking => {
                self.last_latency = stats.latency.or(self.last_latency);
                self.track(stats);
                if self.limit() <= self.settings.min_limit {
                    self.windows_at_min += 1;
                } else {
                    self.windows_at_min = 0;
                }
                // NOTE: a periodic probe runs only while the limit rejects: otherwise nobody is
                // turned away whatever the baseline, and a probe would reject traffic that a
                // healthy service can take (every minute, at its minimum limit). It is put off
                // by one interval instead.
                let due = now >= self.next_probe;
                if due && !stats.rejected {
                    self.schedule_probe(now);
                }
                if (due && stats.rejected) || self.windows_at_min >= WINDOWS_AT_MIN_BEFORE_PROBE {
                    self.phase = ControllerPhase::Probing { resume: self.limit };
                    self.limit = self.settings.min_limit as f64;
                    self.windows_at_min = 0;
                    return self.update(true);
                }
                self.update(false)
            }
        }
    }

    /// One window's step of the limit while tracking.
    fn track(&mut self, stats: AdaptiveWindowStats) {
        let s = &self.settings;
        let outcomes = stats.samples + stats.failures;
        if outcomes > 0 && stats.failures as f64 >= s.failure_threshold * outcomes as f64 {
            // Overload failures from the service itself: back off, whatever the latency.
            self.limit = (self.limit * s.backoff).max(s.min_limit as f64);
            return;
        }
        let (Some(latency), Some(baseline)) = (stats.latency, self.baseline) else {
            return;
        };
        let target = baseline as f64 * s.tolerance;
        let gradient = (target / latency.max(1) as f64).clamp(GRADIENT_MIN, GRADIENT_MAX);
        // NOTE: while the latency is at or under the target, the headroom of sqrt(limit)
        // (Netflix's Gradient2 and Envoy add the same square root) makes the limit grow
        // even when the gradient is exactly 1, so it keeps looking for more capacity. It is
        // not added when shrinking: with it, a limit under a persistently slow service
        // would settle at 4 (0.5 * 4 + sqrt(4)) instead of reaching its floor, where a
        // stale baseline is detected.
        let headroom = if gradient >= 1.0 {
            self.limit.sqrt()
        } else {
            0.0
        };
        let mut next = gradient * self.limit + headroom;
        // NOTE: a limit that traffic never reached says nothing about the service: growing
        // it then would let a later burst in all at once. Grow only when at least half of
        // it was in use.
        if next > self.limit && (stats.peak_in_flight as f64) < self.limit / 2.0 {
            next = self.limit;
        }
        self.limit = next.clamp(s.min_limit as f64, s.max_limit as f64);
    }

    fn update(&self, probe_started: bool) -> AdaptiveLimitUpdate {
        AdaptiveLimitUpdate {
            limit: self.limit(),
            probe_started,
        }
    }

    /// Sets the next probe `interval * (1 + jitter * u)` after `now`, `u` in `0..1` drawn
    /// from the seed and the probe count, so that servers started together drift apart.
    fn schedule_probe(&mut self, now: u64) {
        self.probes += 1;
        let u = unit(splitmix64(self.settings.seed ^ self.probes));
        let interval = self
            .settings
            .probe_interval
            .mul_f64(1.0 + self.settings.probe_jitter * u);
        self.next_probe = now.saturating_add(saturating_nanos(interval));
    }
}

/// A real limit as a whole number of requests within the bounds.
fn to_limit(limit: f64, s: &AdaptiveSettings) -> usize {
    // NOTE: the float is within min..=max (both usize) by construction; `as` saturates anyway.
    (limit.round() as usize).clamp(s.min_limit, s.max_limit)
}

/// SplitMix64: one well-mixed 64-bit value from any input.
fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A value in `0..1` from the top 53 bits of `x`.
fn unit(x: u64) -> f64 {
    (x >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
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
            failure_threshold: 0.1,
            backoff: 0.9,
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
        }
    }

    /// A controller past its first probe, with a baseline of `baseline_ms`.
    fn tracking(baseline_ms: u64) -> GradientController {
        let mut c = GradientController::new(settings());
        assert_eq!(c.limit(), 3, "starts probing at the minimum");
        let u = c.on_window(0, window(baseline_ms, 3));
        assert_eq!(u.limit, 20, "resumes at the initial limit");
        assert_eq!(c.phase(), ControllerPhase::Tracking);
        c
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
        for i in 1..200 {
            limit = c
                .on_window(i * 100 * MS, window(latency(limit), limit))
                .limit;
        }
        // The limit oscillates around the point where latency meets the target, 125 ms.
        let at = latency(limit);
        assert!((115..=140).contains(&at), "limit {limit} at {at} ms");
    }

    #[test]
    fn halves_at_most_per_window_when_latency_explodes() {
        let mut c = tracking(100);
        let u = c.on_window(100 * MS, window(10_000, 20));
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
        };
        assert_eq!(c.on_window(100 * MS, stats).limit, 18, "20 * 0.9");
        // Under the threshold, failures are ignored and the gradient applies.
        let stats = AdaptiveWindowStats {
            failures: 5,
            ..stats
        };
        assert!(c.on_window(200 * MS, stats).limit > 18);
    }

    #[test]
    fn probes_again_after_the_interval_and_resumes() {
        let mut c = tracking(100);
        let limit = c.limit();
        // The first probe ended at 0; the next is due within 60 s to 69 s.
        let mut t = 0;
        let update = loop {
            t += 100 * MS;
            let u = c.on_window(t, window(125, 0));
            if u.probe_started {
                break u;
            }
            assert_eq!(u.limit, limit);
        };
        assert!((60_000 * MS..=69_000 * MS).contains(&t), "{t}");
        assert_eq!(update.limit, 3);
        assert_eq!(c.samples_needed(), 50);
        assert_eq!(c.window_nanos(), 0);
        // The service became faster: the new baseline is taken and the limit resumes.
        assert_eq!(c.on_window(t + 1, window(50, 3)).limit, limit);
        assert_eq!(c.baseline(), Some(50 * MS));
    }

    #[test]
    fn no_periodic_probe_while_the_limit_rejects_nobody() {
        // Regression: a probe every minute rejected most of a healthy service's traffic for
        // a second or two (the outage scenario's recovery never "stayed" recovered).
        let mut c = tracking(100);
        let calm = AdaptiveWindowStats {
            rejected: false,
            ..window(100, 5)
        };
        for i in 1..=2000 {
            assert!(!c.on_window(i * 100 * MS, calm).probe_started, "window {i}");
        }
        // Once it rejects again, the next due probe runs.
        let mut t = 2000 * 100 * MS;
        let started = loop {
            t += 100 * MS;
            if c.on_window(t, window(125, 0)).probe_started {
                break t;
            }
        };
        assert!(started - 2000 * 100 * MS <= 69_000 * MS, "{started}");
    }

    #[test]
    fn probes_when_stuck_at_the_minimum() {
        let mut c = tracking(100);
        // The service is now ten times slower than the baseline says.
        let mut started = None;
        for i in 1..=20 {
            if c.on_window(i * 100 * MS, window(1_000, 20)).probe_started {
                started = Some(i);
                break;
            }
        }
        let started = started.expect("a probe started");
        assert!(started <= 12, "after {started} windows");
        c.on_window(started * 100 * MS + 1, window(1_000, 3));
        assert_eq!(c.baseline(), Some(1_000 * MS));
    }

    #[test]
    fn a_probe_without_successes_keeps_probing() {
        let mut c = GradientController::new(settings());
        let stats = AdaptiveWindowStats {
            failures: 50,
            ..AdaptiveWindowStats::default()
        };
        assert_eq!(c.on_window(MS, stats).limit, 3);
        assert!(matches!(c.phase(), ControllerPhase::Probing { .. }));
        assert_eq!(c.baseline(), None);
    }

    #[test]
    fn the_limit_stays_within_its_bounds() {
        let mut s = settings();
        s.max_limit = 40;
        let mut c = GradientController::new(s);
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
            let mut c = GradientController::new(s);
            c.on_window(0, window(100, 3));
            c.next_probe
        };
        let all: std::collections::HashSet<u64> = (0..20).map(due).collect();
        assert!(all.len() > 15, "{} distinct of 20", all.len());
        assert!(
            all.iter()
                .all(|&t| (60_000 * MS..=69_000 * MS).contains(&t))
        );
    }
}
