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
    pub(super) probe_share: f64,
    pub(super) probe_timeout: Duration,
    pub(super) failure_threshold: f64,
    pub(super) backoff: f64,
    /// A no-load latency the user knows, in nanoseconds: the first baseline.
    pub(super) baseline: Option<u64>,
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

/// How far the limit must have fallen, as a share of a reference limit, before a latency
/// that did not fall with it shows a stale baseline: by 30 % or more.
const STALE_SHRINK: f64 = 0.7;

/// Windows in a row that must show a stale baseline (the limit fell, the latency did not)
/// before the baseline is measured again: a noisy window or two near the knee cannot start a
/// probe (on a paused-time M/M/10 at 10x and 100x, 12 runs of 40 s, two in a row started one
/// needless probe, three none), and a latency that stays put passes three in a row anyway.
const STALE_WINDOWS_BEFORE_PROBE: u32 = 3;

/// Calm windows (nobody rejected) in a row that end the doubt about a first baseline: one
/// calm window may be a lull (clients backing off), two in a row show the limit met the
/// demand.
const CALM_WINDOWS_TO_CLEAR_DOUBT: u32 = 2;

/// What a closed window held, as the controller sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(super) struct AdaptiveWindowStats {
    /// Requests measured in the window (their latencies).
    pub(super) samples: u64,
    /// Overload failures: errors of the inner service.
    pub(super) failures: u64,
    /// The configured percentile of the successes' latencies, in nanoseconds.
    pub(super) latency: Option<u64>,
    /// The most requests in flight at once during the window.
    pub(super) peak_in_flight: usize,
    /// Whether the limit rejected a request during the window.
    pub(super) rejected: bool,
    /// Whether a request was turned away at its level's part of the limit (its share held
    /// back for a higher level), the limit itself not full: that level used all of the
    /// limit it may take, so the limit was in use however few were in flight.
    pub(super) level_full: bool,
    /// Whether the window closed because a probe ran out of time, not because it had its
    /// samples.
    pub(super) timed_out: bool,
}

/// The controller's phase.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum ControllerPhase {
    /// Measuring the baseline at a reduced limit; the limit to go back to afterwards.
    Probing { resume: f64 },
    /// Following the gradient (or, before any baseline is known, measuring the first one
    /// at the limit in force).
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
    /// The no-load latency, in nanoseconds: seeded, measured at the start, or from the last
    /// probe.
    baseline: Option<u64>,
    /// The latency percentile of the last window, in nanoseconds.
    last_latency: Option<u64>,
    /// When the next probe is due (clock nanoseconds).
    next_probe: u64,
    /// The first baseline was measured with the limit full and requests turned away: it
    /// may hold a queue in front of the service (a process started into overload), or it
    /// may be right (a service that does not queue, with a demand above the initial limit).
    /// Settled by two windows in a row that reject nobody (right) or by a probe, which
    /// starts at the first overloaded window instead of an interval later; it expires when
    /// the first periodic probe falls due.
    doubtful_baseline: bool,
    /// Windows in a row that rejected nobody.
    calm_windows: u32,
    /// The limit in force and the latency of the full window (it rejected requests) with the
    /// highest limit since the baseline was last measured: what a stale baseline is judged
    /// against.
    reference: Option<(f64, u64)>,
    /// The limit in force during the previous tracking window since the last measurement.
    previous_in_force: Option<f64>,
    /// Windows in a row whose limit fell under the reference while their latency did not.
    stale_windows: u32,
    /// When a stale baseline may next start a probe (clock nanoseconds): at most once per
    /// probe interval.
    next_stale_probe: u64,
    windows_at_min: u32,
    /// Whether the previous tracking window's gradient was at its floor: only a second
    /// window there in a row halves the limit without the headroom.
    previous_at_floor: bool,
    probes: u64,
}

impl GradientController {
    /// A controller that starts at the initial limit, tracking from the seeded baseline if
    /// there is one, else measuring the first baseline at that limit (nobody is turned away
    /// to measure it). `now` is the clock's time.
    pub(super) fn new(settings: AdaptiveSettings, now: u64) -> Self {
        let mut controller = Self {
            settings,
            phase: ControllerPhase::Tracking,
            limit: settings.initial_limit as f64,
            baseline: settings.baseline,
            last_latency: None,
            next_probe: 0,
            doubtful_baseline: false,
            calm_windows: 0,
            reference: None,
            previous_in_force: None,
            stale_windows: 0,
            next_stale_probe: 0,
            windows_at_min: 0,
            previous_at_floor: false,
            probes: 0,
        };
        if controller.baseline.is_some() {
            controller.schedule_probe(now);
        }
        controller
    }

    /// The limit in force.
    /// Puts the bounds `min..=max` in force (`1 <= min <= max`), clamping the limit into
    /// them; returns the limit in force.
    pub(super) fn set_bounds(&mut self, min: usize, max: usize) -> usize {
        self.settings.min_limit = min;
        self.settings.max_limit = max;
        self.limit = self.limit.clamp(min as f64, max as f64);
        self.limit()
    }

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

    /// Whether the current window measures the baseline: a probe, or the first measurement.
    pub(super) fn measures_baseline(&self) -> bool {
        matches!(self.phase, ControllerPhase::Probing { .. }) || self.baseline.is_none()
    }

    /// How many outcomes the current window needs before it may close: a measurement of the
    /// baseline takes `probe_samples`, a tracking window `min_samples`.
    pub(super) fn samples_needed(&self) -> u64 {
        match (self.phase, self.baseline) {
            (ControllerPhase::Probing { .. }, _) | (ControllerPhase::Tracking, None) => {
                self.settings.probe_samples
            }
            (ControllerPhase::Tracking, Some(_)) => self.settings.min_samples,
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

    /// How long the current window may last before it closes whatever it holds, in
    /// nanoseconds: a probe's time budget, so that a probe whose requests never complete
    /// (an outer timeout drops them all) ends; no bound otherwise.
    pub(super) fn deadline_nanos(&self) -> Option<u64> {
        match self.phase {
            ControllerPhase::Probing { .. } => Some(saturating_nanos(self.settings.probe_timeout)),
            ControllerPhase::Tracking => None,
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
                // NOTE: a probe that ran out of time with fewer than half its samples keeps
                // the baseline it had: a few fast completions among requests an outer
                // timeout dropped would make one too low.
                let enough = stats.samples >= (self.settings.probe_samples / 2).max(1);
                match stats.latency {
                    Some(latency) if enough || !stats.timed_out => {
                        self.baseline = Some(latency.max(1));
                        self.last_latency = Some(latency);
                    }
                    _ if stats.timed_out => {}
                    // Only failures so far: no baseline can be read. Keep probing, until the
                    // probe's time runs out.
                    _ => return self.update(false),
                }
                self.phase = ControllerPhase::Tracking;
                // The next window's first completions were admitted under the probe's limit.
                self.previous_in_force = Some(self.limit);
                self.limit = resume;
                self.doubtful_baseline = false;
                self.reference = None;
                self.stale_windows = 0;
                self.previous_at_floor = false;
                self.schedule_probe(now);
                self.windows_at_min = 0;
                self.update(false)
            }
            ControllerPhase::Tracking => {
                self.last_latency = stats.latency.or(self.last_latency);
                if self.baseline.is_none() {
                    return self.first_baseline(now, stats);
                }
                let in_force = self.limit;
                let gradient = self.track(stats);
                if self.limit() <= self.settings.min_limit {
                    self.windows_at_min += 1;
                } else {
                    self.windows_at_min = 0;
                }
                // NOTE: a periodic probe runs only when the limit is holding back more than
                // the service takes at its target latency: the window rejected requests and
                // its latency was above the target. While nothing is rejected the baseline
                // decides nothing, and while the latency is under the target a rejection only
                // means the limit has not grown to the demand yet: a probe then would turn away
                // a load the service can take. It is put off by one interval instead.
                //
                // A first baseline measured with the limit full and requests turned away is
                // measured again at the first overloaded window, due or not: the service may
                // have queued at the initial limit already, and a baseline that holds a queue
                // keeps the limit above the service's knee until the next probe. A window that
                // rejects nobody shows the limit has met the demand, so the baseline was
                // measured at a concurrency the service takes: two in a row end the doubt
                // (one may be a lull, clients backing off). The doubt also ends when the first
                // periodic probe falls due: from then on `due` decides.
                if stats.rejected {
                    self.calm_windows = 0;
                } else {
                    self.calm_windows = self.calm_windows.saturating_add(1);
                }
                let due = now >= self.next_probe;
                if due || self.calm_windows >= CALM_WINDOWS_TO_CLEAR_DOUBT {
                    self.doubtful_baseline = false;
                }
                let overloaded = stats.rejected && self.above_target(stats.latency);
                let stale = self.stale_baseline(now, in_force, gradient, stats);
                if due && !overloaded {
                    self.schedule_probe(now);
                }
                if ((due || self.doubtful_baseline) && overloaded)
                    || self.windows_at_min >= WINDOWS_AT_MIN_BEFORE_PROBE
                {
                    return self.start_probe();
                }
                if stale && overloaded {
                    self.next_stale_probe =
                        now.saturating_add(saturating_nanos(self.settings.probe_interval));
                    return self.start_probe();
                }
                self.update(false)
            }
        }
    }

    /// The first window without a baseline: its latency, measured at the limit in force,
    /// is the first baseline, and the window then moves the limit as any other (its
    /// latency is at the baseline, so the limit grows if it was in use, by the tolerance and
    /// `sqrt(L)`).
    fn first_baseline(&mut self, now: u64, stats: AdaptiveWindowStats) -> AdaptiveLimitUpdate {
        if let Some(latency) = stats.latency {
            // NOTE: if the service already queued at the initial limit, this baseline is
            // high, and the limit would settle above the service's knee. That can only
            // happen when the limit was full and turned requests away (the demand exceeded
            // it); such a baseline is doubted, and measured again at the first overloaded
            // window (see `on_window`), not an interval later.
            self.baseline = Some(latency.max(1));
            self.doubtful_baseline = stats.rejected && stats.peak_in_flight >= self.limit();
            self.schedule_probe(now);
        }
        self.track(stats);
        self.update(false)
    }

    /// Whether a tracking window (`in_force` the limit during it, `gradient` its step, if the
    /// gradient moved the limit) shows a baseline that has gone stale, and records the window
    /// as the reference if its limit is the highest since the last measurement.
    ///
    /// NOTE: while the limit is full (the window rejected requests), Little's law ties its
    /// latency to the limit: `latency = L / throughput`. A service that queues is at its
    /// throughput ceiling there, so its latency falls in proportion as the limit falls; a
    /// service that became slower (a stale baseline: the limit shrinks only because the
    /// target is too low) keeps its latency whatever the limit, its throughput falling
    /// instead. With `ρ` the limit over the reference's, the queue predicts a latency of `ρ`
    /// times the reference's and the stale baseline 1 times; the test splits them at the
    /// geometric middle, `sqrt(ρ)`. A stale baseline that holds the limit between the
    /// target and twice it (the `sqrt(L)` headroom's fixed point) is then measured again
    /// within a few windows, not when the periodic probe falls due. Judged only when the
    /// gradient moved the limit and is above its floor (at the floor the limit halves to
    /// the minimum, where the at-floor probe takes over), on three windows in a row, and at
    /// most once per probe interval: one probe that finds the same baseline (a real loss of
    /// capacity: fewer workers) is all a false alarm costs.
    fn stale_baseline(
        &mut self,
        now: u64,
        in_force: f64,
        gradient: Option<f64>,
        stats: AdaptiveWindowStats,
    ) -> bool {
        // NOTE: a window's latencies are those of requests admitted up to a latency
        // earlier, under the previous window's limit too: a window just after the limit fell
        // still shows the queue of the higher limit. So the window is judged at the higher of
        // the two limits, and recorded as a reference at the lower: both ways, a latency that
        // lags its limit cannot pass for one that did not fall.
        let previous = self.previous_in_force.replace(in_force).unwrap_or(in_force);
        let (Some(latency), Some(gradient), true) = (stats.latency, gradient, stats.rejected)
        else {
            self.stale_windows = 0;
            return false;
        };
        let judged = in_force.max(previous);
        let stale = match self.reference {
            Some((limit, reference)) if judged <= limit * STALE_SHRINK => {
                gradient > GRADIENT_MIN
                    && latency as f64 >= reference as f64 * (judged / limit).sqrt()
            }
            _ => false,
        };
        let recorded = in_force.min(previous);
        if self.reference.is_none_or(|(limit, _)| recorded >= limit) {
            self.reference = Some((recorded, latency));
        }
        if stale {
            self.stale_windows = self.stale_windows.saturating_add(1);
        } else {
            self.stale_windows = 0;
        }
        self.stale_windows >= STALE_WINDOWS_BEFORE_PROBE && now >= self.next_stale_probe
    }

    /// Whether a window's latency is above the target (the baseline times the tolerance).
    fn above_target(&self, latency: Option<u64>) -> bool {
        match (latency, self.baseline) {
            (Some(latency), Some(baseline)) => {
                latency as f64 > baseline as f64 * self.settings.tolerance
            }
            _ => false,
        }
    }

    /// Starts a probe: the limit drops to its share of the limit in force (at least the
    /// minimum) until the probe has its samples or its time runs out.
    fn start_probe(&mut self) -> AdaptiveLimitUpdate {
        let s = &self.settings;
        self.phase = ControllerPhase::Probing { resume: self.limit };
        self.limit = (self.limit * s.probe_share)
            .round()
            .clamp(s.min_limit as f64, s.max_limit as f64);
        self.windows_at_min = 0;
        self.update(true)
    }

    /// One window's step of the limit while tracking; returns the gradient if it moved the
    /// limit (not a back-off, not a window without latency).
    fn track(&mut self, stats: AdaptiveWindowStats) -> Option<f64> {
        let s = &self.settings;
        let outcomes = stats.samples + stats.failures;
        if outcomes > 0 && stats.failures as f64 >= s.failure_threshold * outcomes as f64 {
            // Errors of the inner service itself: back off, whatever the latency.
            self.limit = (self.limit * s.backoff).max(s.min_limit as f64);
            return None;
        }
        let (Some(latency), Some(baseline)) = (stats.latency, self.baseline) else {
            return None;
        };
        let target = baseline as f64 * s.tolerance;
        let gradient = (target / latency.max(1) as f64).clamp(GRADIENT_MIN, GRADIENT_MAX);
        // NOTE: the headroom of sqrt(limit) (Netflix's Gradient2 and Envoy add the same
        // square root) makes the limit grow even when the gradient is exactly 1, so it keeps
        // looking for more capacity, and it settles where the gradient is 1 - 1/sqrt(limit),
        // a little above the target. It is also added while shrinking (as Envoy does), or a
        // noisy window just above the target cuts the limit by its full gradient: on a
        // service whose latency is noisy near its knee (M/M/10: a window median of 50
        // exponential service times varies by about 20 %), the limit then swings under the
        // knee and the workers idle (issue 34). It is not added when the gradient is at its
        // floor (0.5) in two windows in a row: a limit under a persistently and much slower
        // service then still halves to its floor (with the headroom it would settle at 4,
        // 0.5 * 4 + sqrt(4)), where a stale baseline is detected. One window there keeps
        // it: the median of 50 exponential service times is 2 standard errors high about
        // one window in forty, which read as twice the target would halve a limit sitting a
        // few requests above an M/M/10's knee (16 to 8) and idle its workers until the
        // limit grew back (issue 34: 190 to 200 req/s of 200 at 10x, run to run); with the
        // headroom it falls by a quarter (16 to 12), and a second window confirms a real
        // collapse.
        let at_floor = gradient <= GRADIENT_MIN;
        let headroom = if at_floor && self.previous_at_floor {
            0.0
        } else {
            self.limit.sqrt()
        };
        self.previous_at_floor = at_floor;
        let mut next = gradient * self.limit + headroom;
        // NOTE: a limit that traffic never reached says nothing about the service: growing
        // it then would let a later burst in all at once. Grow only when at least half of
        // it was in use, or when a level was turned away at its part of it: a low level
        // that may take only `limit × (1 − share)` while a higher one is active then fills
        // its part, and the latency at that concurrency is what decides whether its part,
        // and so the limit, grows (until the concurrency admitted fills the service).
        if next > self.limit
            && (stats.peak_in_flight as f64) < self.limit / 2.0
            && !stats.level_full
        {
            next = self.limit;
        }
        self.limit = next.clamp(s.min_limit as f64, s.max_limit as f64);
        Some(gradient)
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
mod tests;
