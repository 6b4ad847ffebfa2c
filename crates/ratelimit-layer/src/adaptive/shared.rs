//! What a layer and its services share: the limit, the in-flight count, the window being
//! sampled, the controller, and the metric handles.

use std::fmt;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge};
use overload_core::clock::Clock;

use super::controller::{Controller, Phase, Settings, WindowStats};
use super::sampler::Sampler;
use crate::metric_names;
use overload_core::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// The shared state of one adaptive limit.
pub(crate) struct Shared<C> {
    clock: C,
    /// The admission limit in force; written only when a window closes.
    limit: AtomicUsize,
    in_flight: AtomicUsize,
    /// The most in flight at once since the window started.
    peak_in_flight: AtomicUsize,
    /// Whether a request was rejected since the window started.
    rejected_in_window: AtomicBool,
    sampler: Sampler,
    /// When the current window may close (clock nanoseconds), and after how many outcomes.
    close_at: AtomicU64,
    close_after_outcomes: AtomicU64,
    /// Requests admitted before this time (clock nanoseconds) are not sampled: set when the
    /// limit changes, so that a window measures the limit in force.
    sample_floor: AtomicU64,
    /// A request dropped before it completed (an outer timeout fired, the client went away)
    /// after running longer than this (clock nanoseconds: the baseline times the tolerance)
    /// is sampled with the time it ran, a lower bound on its latency; `u64::MAX` while there
    /// is no baseline or one is being measured. See [`Complete::complete`].
    slow_drop: AtomicU64,
    quantile: f64,
    tolerance: f64,
    controller: Mutex<Controller>,
    pub(super) retry_after: Duration,
    metrics: Metrics,
}

/// What an admitted request carries until it completes.
#[derive(Debug)]
pub(super) struct Admitted {
    pub(super) started: u64,
}

impl<C: Clock> Shared<C> {
    pub(super) fn new(
        settings: Settings,
        clock: C,
        retry_after: Duration,
        policy_name: &str,
    ) -> Self {
        let controller = Controller::new(settings);
        let now = clock.now();
        Self {
            limit: AtomicUsize::new(controller.limit()),
            in_flight: AtomicUsize::new(0),
            peak_in_flight: AtomicUsize::new(0),
            rejected_in_window: AtomicBool::new(false),
            sampler: Sampler::new(),
            close_at: AtomicU64::new(now.saturating_add(controller.window_nanos())),
            close_after_outcomes: AtomicU64::new(controller.samples_needed()),
            sample_floor: AtomicU64::new(0),
            slow_drop: AtomicU64::new(u64::MAX),
            quantile: settings.quantile,
            tolerance: settings.tolerance,
            controller: Mutex::new(controller),
            retry_after,
            metrics: Metrics::new(policy_name),
            clock,
        }
    }

    /// Admits a request if fewer than the limit are in flight.
    #[inline]
    pub(super) fn try_admit(&self) -> Option<Admitted> {
        let limit = self.limit.load(Ordering::Relaxed);
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < limit).then_some(n + 1)
            });
        match admitted {
            Ok(before) => {
                self.peak_in_flight.fetch_max(before + 1, Ordering::Relaxed);
                self.metrics.handles().admitted.increment(1);
                Some(Admitted {
                    started: self.clock.now(),
                })
            }
            Err(_) => {
                self.metrics.handles().rejected.increment(1);
                // NOTE: read first: under overload every rejection would otherwise write the
                // shared cache line.
                if !self.rejected_in_window.load(Ordering::Relaxed) {
                    self.rejected_in_window.store(true, Ordering::Relaxed);
                }
                None
            }
        }
    }
}

/// Ends admitted requests; what a response future needs of [`Shared`], without its clock
/// type.
pub(super) trait Complete: Send + Sync + 'static {
    /// Ends an admitted request: `Some(failed)` when it completed, `None` when it was
    /// dropped before.
    ///
    /// A dropped request's latency is unknown. One dropped early (a client that went away)
    /// says nothing about the service and is not sampled. One dropped after running longer
    /// than the baseline times the tolerance is sampled with the time it ran: under a
    /// timeout layer above this one, a slowing service's requests are dropped, not
    /// completed, and without these samples only the fast completions would be measured and
    /// the limit would hold while most requests time out.
    fn complete(&self, admitted: &Admitted, outcome: Option<bool>);
}

impl<C: Clock> Complete for Shared<C> {
    #[inline]
    fn complete(&self, admitted: &Admitted, outcome: Option<bool>) {
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let now = self.clock.now();
        if admitted.started < self.sample_floor.load(Ordering::Relaxed) {
            return;
        }
        let elapsed = now.saturating_sub(admitted.started);
        match outcome {
            Some(true) => self.sampler.record_failure(),
            Some(false) => self.sampler.record(elapsed),
            None if elapsed > self.slow_drop.load(Ordering::Relaxed) => {
                self.sampler.record(elapsed);
            }
            None => return,
        }
        if now >= self.close_at.load(Ordering::Relaxed)
            && self.sampler.outcomes() >= self.close_after_outcomes.load(Ordering::Relaxed)
        {
            self.close_window(now);
        }
    }
}

impl<C: Clock> Shared<C> {
    /// Closes the window if no other thread is doing it, and applies the controller's
    /// answer.
    #[cold]
    fn close_window(&self, now: u64) {
        // NOTE: `try_lock`: a thread that finds the window being closed goes on at once;
        // the admitted path never waits for the controller.
        let Ok(mut controller) = self.controller.try_lock() else {
            return;
        };
        // Another thread may have closed it between our check and the lock.
        if now < self.close_at.load(Ordering::Relaxed)
            || self.sampler.outcomes() < self.close_after_outcomes.load(Ordering::Relaxed)
        {
            return;
        }
        let taken = self.sampler.take(self.quantile);
        let in_flight = self.in_flight.load(Ordering::Relaxed);
        let peak = self.peak_in_flight.swap(in_flight, Ordering::Relaxed);
        let stats = WindowStats {
            samples: taken.samples,
            failures: taken.failures,
            latency: taken.percentile,
            peak_in_flight: peak.max(in_flight),
            rejected: self.rejected_in_window.swap(false, Ordering::Relaxed),
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
        // NOTE: no dropped request is sampled while the baseline is measured: its samples
        // must be completed requests at the minimum limit.
        let slow_drop = match (controller.baseline(), controller.phase()) {
            (Some(baseline), phase) if !matches!(phase, Phase::Probing { .. }) => {
                // Float to integer casts saturate: a huge product is `u64::MAX`, never sampled.
                (baseline as f64 * self.tolerance) as u64
            }
            _ => u64::MAX,
        };
        self.slow_drop.store(slow_drop, Ordering::Relaxed);
        self.close_after_outcomes
            .store(controller.samples_needed(), Ordering::Relaxed);
        self.close_at.store(
            now.saturating_add(controller.window_nanos()),
            Ordering::Relaxed,
        );
        tracing::trace!(
            limit = update.limit,
            before,
            samples = stats.samples,
            failures = stats.failures,
            latency_ns = stats.latency,
            peak_in_flight = stats.peak_in_flight,
            probing = update.probe_started,
            "adaptive limit window closed"
        );
        let handles = self.metrics.handles();
        handles.limit.set(update.limit as f64);
        if let Some(baseline) = controller.baseline() {
            handles.baseline.set(baseline as f64 / 1e9);
        }
        if let Some(latency) = stats.latency {
            handles.latency.set(latency as f64 / 1e9);
        }
    }

    /// Outcomes recorded in the current window.
    #[cfg(all(test, loom))]
    pub(super) fn outcomes(&self) -> u64 {
        self.sampler.outcomes()
    }

    /// A reading for people and tests.
    pub(super) fn status(&self) -> Status {
        let controller = self
            .controller
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        Status {
            limit: self.limit.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            baseline: controller.baseline().map(Duration::from_nanos),
            latency: controller.last_latency().map(Duration::from_nanos),
            probing: matches!(controller.phase(), Phase::Probing { .. }),
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

/// The metric handles, registered on first use (the first request) and kept.
struct Metrics {
    policy: String,
    handles: OnceLock<Handles>,
}

struct Handles {
    admitted: Counter,
    rejected: Counter,
    limit: Gauge,
    baseline: Gauge,
    latency: Gauge,
}

impl Metrics {
    fn new(policy: &str) -> Self {
        Self {
            policy: policy.to_owned(),
            handles: OnceLock::new(),
        }
    }

    #[inline]
    fn handles(&self) -> &Handles {
        self.handles.get_or_init(|| {
            let policy = &self.policy;
            Handles {
                admitted: metrics::counter!(metric_names::ADAPTIVE_ADMITTED, "policy" => policy.clone()),
                rejected: metrics::counter!(metric_names::ADAPTIVE_REJECTED, "policy" => policy.clone()),
                limit: metrics::gauge!(metric_names::ADAPTIVE_LIMIT, "policy" => policy.clone()),
                baseline: metrics::gauge!(metric_names::ADAPTIVE_BASELINE, "policy" => policy.clone()),
                latency: metrics::gauge!(metric_names::ADAPTIVE_LATENCY, "policy" => policy.clone()),
            }
        })
    }
}

impl<C> fmt::Debug for Shared<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("limit", &self.limit.load(Ordering::Relaxed))
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("retry_after", &self.retry_after)
            .finish_non_exhaustive()
    }
}
