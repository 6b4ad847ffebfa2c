//! What a layer and its services share: the limit, the in-flight count, the window being
//! sampled, the controller, the metric handles, and the episode of the limit engaged.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::Duration;

use http::request::Parts;

use overload_core::clock::{Clock, saturating_nanos};
use overload_core::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering, StripedCounter};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, Ticker};

use super::controller::{
    AdaptiveSettings, AdaptiveWindowStats, ControllerPhase, GradientController,
};
use super::sampler::LatencySampler;
use crate::telemetry::{AdaptiveLimitMetrics, TICK};

/// The shared state of one adaptive limit.
pub(crate) struct AdaptiveLimitState<C> {
    clock: C,
    /// The admission limit in force; written only when a window closes.
    limit: AtomicUsize,
    in_flight: AtomicUsize,
    /// The most in flight at once since the window started.
    peak_in_flight: AtomicUsize,
    /// Whether a request was rejected since the window started.
    rejected_in_window: AtomicBool,
    sampler: LatencySampler,
    /// When the current window may close (clock nanoseconds), and after how many outcomes.
    close_at: AtomicU64,
    close_after_outcomes: AtomicU64,
    /// When the current window closes whatever it holds (clock nanoseconds): a probe's
    /// deadline; `u64::MAX` while tracking.
    close_by: AtomicU64,
    /// Requests admitted before this time (clock nanoseconds) are not sampled: set when the
    /// limit changes, so that a window measures the limit in force.
    sample_floor: AtomicU64,
    /// A request dropped before it completed (an outer timeout fired, the client went away)
    /// after running longer than this (clock nanoseconds: the baseline times the tolerance)
    /// is sampled with the time it ran, a lower bound on its latency; `u64::MAX` while there
    /// is no baseline or one is being measured. See [`CompleteRequest::complete`].
    slow_drop: AtomicU64,
    quantile: f64,
    tolerance: f64,
    controller: Mutex<GradientController>,
    pub(super) retry_after: Duration,
    /// Requests that bypass the limit (health checks): never rejected, never counted.
    exempt: Option<Box<ExemptFn>>,
    metrics: LazyMetrics<AdaptiveLimitMetrics>,
    /// The limit rejecting: begun by a rejection, over after `quiet` without one.
    engaged: Episode,
    quiet: Duration,
    /// Windows closed so far, so that a tick can tell whether requests are completing.
    windows_closed: AtomicU64,
    /// What the last tick saw: `windows_closed` and the window's outcomes then, when they
    /// last changed (clock nanoseconds), and whether the latency gauge has fallen to zero.
    ticked_windows: AtomicU64,
    ticked_outcomes: AtomicU64,
    last_progress: AtomicU64,
    latency_idle: AtomicBool,
    /// Started by the first request, which registers the metrics.
    ticker: Ticker,
    /// Admitted requests not yet added to the admitted counter (the tick adds them).
    admitted: StripedCounter,
}

/// Which requests bypass the limit.
pub(super) type ExemptFn = dyn Fn(&Parts) -> bool + Send + Sync;

/// How an admitted request ended, as the limit counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Completion {
    /// A response that is not an overload failure: its latency is a sample.
    Served,
    /// An overload failure (see [`is_overload`](super::future::is_overload)) or an error of
    /// the inner service: counted toward the failure share.
    Overloaded,
    /// A rejection a limiting layer inside this one made (it carries a `Rejection`): the
    /// service never ran, so it is neither a sample nor a failure of the service.
    Ignored,
    /// Its future was dropped before it completed (the client went away, a timeout above
    /// fired).
    Dropped,
}

/// What an admitted request carries until it completes.
#[derive(Debug)]
pub(super) struct AdmittedRequest {
    pub(super) started: u64,
}

impl<C: Clock> AdaptiveLimitState<C> {
    pub(super) fn new(
        settings: AdaptiveSettings,
        clock: C,
        retry_after: Duration,
        name: LayerName,
        quiet: Duration,
        exempt: Option<Box<ExemptFn>>,
    ) -> Self {
        let now = clock.now();
        let controller = GradientController::new(settings, now);
        let slow_drop = slow_drop(&controller, settings.tolerance);
        Self {
            limit: AtomicUsize::new(controller.limit()),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
            rejected_in_window: AtomicBool::new(false),
            sampler: LatencySampler::new(),
            close_at: AtomicU64::new(now.saturating_add(controller.window_nanos())),
            close_after_outcomes: AtomicU64::new(controller.samples_needed()),
            close_by: AtomicU64::new(u64::MAX),
            sample_floor: AtomicU64::new(0),
            slow_drop: AtomicU64::new(slow_drop),
            quantile: settings.quantile,
            tolerance: settings.tolerance,
            controller: Mutex::new(controller),
            retry_after,
            exempt,
            metrics: LazyMetrics::new(name),
            engaged: Episode::new(),
            quiet,
            windows_closed: AtomicU64::new(0),
            ticked_windows: AtomicU64::new(0),
            ticked_outcomes: AtomicU64::new(0),
            last_progress: AtomicU64::new(now),
            latency_idle: AtomicBool::new(false),
            ticker: Ticker::new(),
            admitted: StripedCounter::new(),
            clock,
        }
    }

    /// The layer's name: its metrics' `name` label and its logs' `name` field.
    pub(super) const fn name(&self) -> &LayerName {
        self.metrics.name()
    }

    /// Every request: the first one registers the metrics and starts the ticker.
    #[inline]
    pub(super) fn on_request(self: &Arc<Self>) {
        self.ticker
            .start(self, TICK, Self::first_request, Self::tick);
    }

    fn first_request(&self) {
        // NOTE: the gauges read what is known now: the limit in force (the initial one,
        // while the first baseline is measured), the baseline once one was measured.
        let metrics = self.metrics.get();
        metrics.limit.set(self.limit.load(Ordering::Relaxed) as f64);
        if let Some(baseline) = self.lock_controller().baseline() {
            metrics.baseline.set(baseline as f64 / 1e9);
        }
    }

    fn lock_controller(&self) -> std::sync::MutexGuard<'_, GradientController> {
        self.controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Once a [`TICK`] while the layer lives: ends the episode of a limit that has
    /// rejected nothing for the quiet period, and sets the latency gauge to zero once no
    /// request has completed for the quiet period (it describes a window of requests, and
    /// none has been measured).
    fn tick(&self) {
        self.flush_admitted();
        let now = self.clock.now();
        if now >= self.close_by.load(Ordering::Relaxed) {
            // A probe whose requests stopped completing (or coming) ends here.
            self.close_window(now);
        }
        if let Some(ended) = self.engaged.quiet_for(self.quiet, now) {
            tracing::info!(
                name = %self.name(),
                lasted = ?ended.lasted,
                quiet = ?self.quiet,
                limit = self.limit.load(Ordering::Relaxed),
                "adaptive limit released: no request rejected for the quiet period"
            );
        }
        let windows = self.windows_closed.load(Ordering::Relaxed);
        let outcomes = self.sampler.outcomes();
        let windows_moved = self.ticked_windows.swap(windows, Ordering::Relaxed) != windows;
        let outcomes_moved = self.ticked_outcomes.swap(outcomes, Ordering::Relaxed) != outcomes;
        if windows_moved || outcomes_moved {
            self.last_progress.store(now, Ordering::Relaxed);
            self.latency_idle.store(false, Ordering::Relaxed);
        } else if now.saturating_sub(self.last_progress.load(Ordering::Relaxed))
            >= saturating_nanos(self.quiet)
            && !self.latency_idle.swap(true, Ordering::Relaxed)
        {
            self.metrics.get().latency.set(0.0);
        }
    }

    /// Whether `parts` bypasses the limit (an exempt route, such as a health check).
    #[inline]
    pub(super) fn exempts(&self, parts: &Parts) -> bool {
        self.exempt.as_ref().is_some_and(|exempt| exempt(parts))
    }

    /// Whether some requests bypass the limit.
    #[inline]
    pub(super) fn has_exemptions(&self) -> bool {
        self.exempt.is_some()
    }

    /// Admits a request if fewer than the limit are in flight.
    #[inline]
    pub(super) fn try_admit(&self) -> Option<AdmittedRequest> {
        let limit = self.limit.load(Ordering::Relaxed);
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            });
        match admitted {
            Ok(before) => {
                // NOTE: read first: a write to this shared word on every admission would move
                // its cache line between the cores even when the peak does not change.
                if self.peak_in_flight.load(Ordering::Relaxed) <= before {
                    self.peak_in_flight.fetch_max(before + 1, Ordering::Relaxed);
                }
                // NOTE: striped while the tick runs (it adds the stripes to the counter once a
                // second), so the cores do not share the counter's cache line per request.
                if self.ticker.is_running() {
                    self.admitted.add(1);
                } else {
                    self.metrics.get().admitted.increment(1);
                }
                Some(AdmittedRequest {
                    started: self.clock.now(),
                })
            }
            Err(_) => {
                self.metrics.get().rejected.increment(1);
                // NOTE: read first: under overload every rejection would otherwise write the
                // shared cache line.
                if !self.rejected_in_window.load(Ordering::Relaxed) {
                    self.rejected_in_window.store(true, Ordering::Relaxed);
                }
                tracing::trace!(name = %self.name(), limit, "adaptive limit reached");
                if self.engaged.seen(self.clock.now()) {
                    self.engage(limit);
                }
                None
            }
        }
    }
}

impl<C> AdaptiveLimitState<C> {
    /// Adds the striped admissions to the admitted counter.
    fn flush_admitted(&self) {
        let admitted = self.admitted.take();
        if admitted > 0 {
            self.metrics.get().admitted.increment(admitted);
        }
    }
}

impl<C> Drop for AdaptiveLimitState<C> {
    /// The admissions counted since the last tick reach the counter when the layer goes.
    fn drop(&mut self) {
        if self.metrics.registered().is_some() {
            self.flush_admitted();
        }
    }
}

/// Ends admitted requests; what a response future needs of [`AdaptiveLimitState`], without
/// its clock type.
pub(super) trait CompleteRequest: Send + Sync + 'static {
    /// Ends an admitted request with `outcome`.
    ///
    /// A dropped request's latency is unknown. One dropped early (a client that went away)
    /// says nothing about the service and is not sampled. One dropped after running longer
    /// than the baseline times the tolerance is sampled with the time it ran: under a
    /// timeout layer above this one, a slowing service's requests are dropped, not
    /// completed, and without these samples only the fast completions would be measured and
    /// the limit would hold while most requests time out.
    fn complete(&self, admitted: &AdmittedRequest, outcome: Completion);
}

impl<C: Clock> CompleteRequest for AdaptiveLimitState<C> {
    #[inline]
    fn complete(&self, admitted: &AdmittedRequest, outcome: Completion) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let now = self.clock.now();
        if admitted.started >= self.sample_floor.load(Ordering::Relaxed) {
            let elapsed = now.saturating_sub(admitted.started);
            match outcome {
                Completion::Overloaded => self.sampler.record_failure(),
                Completion::Served => self.sampler.record(elapsed),
                Completion::Dropped if elapsed > self.slow_drop.load(Ordering::Relaxed) => {
                    self.sampler.record(elapsed);
                }
                Completion::Dropped | Completion::Ignored => {}
            }
        }
        // NOTE: checked whatever the outcome, so that a probe whose requests are all
        // dropped (or rejected inside) still ends at its deadline.
        let due = now >= self.close_at.load(Ordering::Relaxed)
            && self.sampler.outcomes() >= self.close_after_outcomes.load(Ordering::Relaxed);
        if due || now >= self.close_by.load(Ordering::Relaxed) {
            self.close_window(now);
        }
    }
}

/// The time after which a dropped request is sampled, for the controller's state: the
/// baseline times the tolerance, or never (`u64::MAX`) while there is no baseline or one is
/// being measured (its samples must be completed requests).
fn slow_drop(controller: &GradientController, tolerance: f64) -> u64 {
    match (controller.baseline(), controller.phase()) {
        (Some(baseline), ControllerPhase::Tracking) => {
            // Float to integer casts saturate: a huge product is `u64::MAX`, never sampled.
            (baseline as f64 * tolerance) as u64
        }
        _ => u64::MAX,
    }
}

impl<C: Clock> AdaptiveLimitState<C> {
    #[cold]
    fn engage(&self, limit: usize) {
        tracing::warn!(
            name = %self.name(),
            limit,
            in_flight = self.in_flight.load(Ordering::Relaxed),
            "adaptive limit engaged: rejecting requests above the concurrency limit (logged \
             once; `INFO` once no request has been rejected for {:?})",
            self.quiet
        );
    }

    /// Closes the window if no other thread is doing it, and applies the controller's
    /// answer.
    #[cold]
    fn close_window(&self, now: u64) {
        // NOTE: `try_lock`: a thread that finds the window being closed goes on at once;
        // the admitted path never waits for the controller. A lock poisoned by a panic
        // while a window closed (a metrics recorder or log subscriber that panicked) is
        // taken all the same: the controller's numbers are whole after every step, and
        // giving up on it would freeze the limit for the life of the process.
        let mut controller = match self.controller.try_lock() {
            Ok(controller) => controller,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        // Another thread may have closed it between our check and the lock.
        let timed_out = now >= self.close_by.load(Ordering::Relaxed);
        if !timed_out
            && (now < self.close_at.load(Ordering::Relaxed)
                || self.sampler.outcomes() < self.close_after_outcomes.load(Ordering::Relaxed))
        {
            return;
        }
        let taken = self.sampler.take(self.quantile);
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let peak = self.peak_in_flight.swap(in_flight, Ordering::Relaxed);
        let stats = AdaptiveWindowStats {
            samples: taken.samples,
            failures: taken.failures,
            latency: taken.percentile,
            peak_in_flight: peak.max(in_flight),
            rejected: self.rejected_in_window.swap(false, Ordering::Relaxed),
            timed_out,
        };
        let before = controller.limit();
        let update = controller.on_window(now, stats);
        // NOTE: the next window samples only requests admitted from now on, under the new
        // limit: a request admitted under the previous one measures the previous decision,
        // and counting it makes the limit overshoot (it would see no queue for a whole
        // latency after raising the limit). A probe needs the same, for its baseline.
        if update.limit != before || update.probe_started {
            self.sample_floor.store(now, Ordering::Relaxed);
        }
        self.limit.store(update.limit, Ordering::Relaxed);
        self.slow_drop
            .store(slow_drop(&controller, self.tolerance), Ordering::Relaxed);
        self.close_after_outcomes
            .store(controller.samples_needed(), Ordering::Relaxed);
        self.close_at.store(
            now.saturating_add(controller.window_nanos()),
            Ordering::Relaxed,
        );
        let close_by = controller
            .deadline_nanos()
            .map_or(u64::MAX, |deadline| now.saturating_add(deadline));
        self.close_by.store(close_by, Ordering::Relaxed);
        tracing::trace!(
            limit = update.limit,
            before,
            samples = stats.samples,
            failures = stats.failures,
            latency_ns = stats.latency,
            peak_in_flight = stats.peak_in_flight,
            probing = update.probe_started,
            timed_out,
            "adaptive limit window closed"
        );
        self.windows_closed.fetch_add(1, Ordering::Relaxed);
        let metrics = self.metrics.get();
        metrics.limit.set(update.limit as f64);
        if let Some(baseline) = controller.baseline() {
            metrics.baseline.set(baseline as f64 / 1e9);
        }
        if let Some(latency) = stats.latency {
            metrics.latency.set(latency as f64 / 1e9);
        }
    }

    /// Outcomes recorded in the current window.
    #[cfg(all(test, loom))]
    pub(super) fn outcomes(&self) -> u64 {
        self.sampler.outcomes()
    }

    /// A reading for people and tests.
    pub(super) fn status(&self) -> Status {
        let controller = self.lock_controller();
        Status {
            limit: self.limit.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            baseline: controller.baseline().map(Duration::from_nanos),
            latency: controller.last_latency().map(Duration::from_nanos),
            probing: matches!(controller.phase(), ControllerPhase::Probing { .. }),
        }
    }
}

/// A reading of an adaptive limit: see
/// [`AdaptiveLimitLayer::status`](super::AdaptiveLimitLayer::status).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The concurrency limit in force: requests beyond it are rejected.
    pub limit: usize,
    /// Requests admitted and not yet completed.
    pub in_flight: usize,
    /// The no-load latency measured by the last probe (`None` before the first ends).
    pub baseline: Option<Duration>,
    /// The latency percentile of the last closed window (`None` before the first).
    pub latency: Option<Duration>,
    /// Whether the limit is held at its minimum to measure the baseline.
    pub probing: bool,
}

impl<C> fmt::Debug for AdaptiveLimitState<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveLimitState")
            .field("name", self.metrics.name())
            .field("limit", &self.limit.load(Ordering::Relaxed))
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}
