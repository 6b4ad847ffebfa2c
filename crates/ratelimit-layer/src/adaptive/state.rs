//! What a layer and its services share: the limit, the in-flight count, the requests held
//! too long, the window being sampled, the controller, the metric handles, and the episode
//! of the limit engaged.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError, TryLockError};
use std::time::Duration;

use http::request::Parts;

use overload_core::clock::{Clock, saturating_nanos};
use overload_core::sync::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, Ticker};
use overload_signal::criticality::Reserves;
use overload_signal::protocol::Criticality;

use super::controller::{
    AdaptiveSettings, AdaptiveWindowStats, ControllerPhase, GradientController,
};
use super::held::{HeldRequests, Released};
use super::levels::Levels;
use super::measurement::{Measurement, release_after, slow_drop};
use super::sampler::LatencySampler;
use crate::telemetry::AdaptiveLimitMetrics;

/// How often the layer's tick runs: 100 ms, the default window. It releases requests held
/// too long (at most one tick late), closes a window whose limit is held full while nothing
/// completes (see [`AdaptiveLimitState::tick`]), adds the striped admissions to their
/// counter, and ends an episode of the limit engaged.
pub(super) const TICK: Duration = Duration::from_millis(100);

/// The shared state of one adaptive limit.
pub(crate) struct AdaptiveLimitState<C> {
    clock: C,
    /// The admission limit in force; written only when a window closes.
    limit: AtomicUsize,
    /// Requests admitted and neither completed nor released.
    in_flight: AtomicUsize,
    /// The ceiling of the limit, and of the requests in flight and released together.
    /// Changed by [`set_bounds`](Self::set_bounds).
    max_limit: AtomicUsize,
    /// Requests by generation of admission, and those released for being held too long.
    held: HeldRequests,
    /// How long a request may be in flight before it is released (clock nanoseconds): the
    /// setting, or ten times the target latency within 1..=30 s (5 s without a baseline);
    /// set when a window closes. See [`release_after`].
    release_after: AtomicU64,
    fixed_release_after: Option<u64>,
    /// The shortest window (clock nanoseconds), for the tick's closing of a held window.
    window: u64,
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
    /// The requests a baseline measurement samples.
    measurement: Measurement,
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
    /// The levels' parts of the limit, and the admissions per level not yet added to the
    /// admitted counters (the tick adds them).
    levels: Levels,
}

/// Which requests bypass the limit.
pub(super) type ExemptFn = dyn Fn(&Parts) -> bool + Send + Sync;

/// How an admitted request ended, as the limit counts it (the "adaptive limit" column of
/// the workspace's outcome table; see [`completion_of`](super::future::completion_of)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Completion {
    /// A response the service made, whatever its status: its latency is a sample.
    Served,
    /// An error of the inner service (no response), not the stop signal and not after a
    /// marked downstream call: counted toward the failure share.
    Overloaded,
    /// Left out, neither a sample nor a failure: a rejection a limiting layer inside this
    /// one made (the service never ran), the stop signal, or anything that ended a request
    /// during which a downstream call was marked (it measures the downstream).
    LeftOut,
    /// Its future was dropped before it completed (the client went away, a timeout above
    /// fired).
    Dropped,
}

/// What an admitted request carries until it completes.
#[derive(Debug)]
pub(super) struct AdmittedRequest {
    pub(super) started: u64,
    /// The generation it was admitted in (see [`HeldRequests`]).
    pub(super) generation: u64,
    /// Whether it is one of the requests a baseline measurement samples.
    pub(super) measured: bool,
}

impl<C: Clock> AdaptiveLimitState<C> {
    pub(super) fn new(
        settings: AdaptiveSettings,
        clock: C,
        retry_after: Duration,
        name: LayerName,
        quiet: Duration,
        exempt: Option<Box<ExemptFn>>,
        fixed_release_after: Option<Duration>,
    ) -> Self {
        let now = clock.now();
        let controller = GradientController::new(settings, now);
        let slow_drop = slow_drop(&controller, settings.tolerance);
        let fixed_release_after = fixed_release_after.map(saturating_nanos);
        let release_after = release_after(fixed_release_after, &controller, settings.tolerance);
        Self {
            limit: AtomicUsize::new(controller.limit()),
            in_flight: AtomicUsize::new(0),
            max_limit: AtomicUsize::new(settings.max_limit),
            held: HeldRequests::new(now),
            release_after: AtomicU64::new(release_after),
            fixed_release_after,
            window: saturating_nanos(settings.window),
            peak_in_flight: AtomicUsize::new(0),
            rejected_in_window: AtomicBool::new(false),
            sampler: LatencySampler::new(),
            close_at: AtomicU64::new(now.saturating_add(controller.window_nanos())),
            close_after_outcomes: AtomicU64::new(controller.samples_needed()),
            close_by: AtomicU64::new(u64::MAX),
            sample_floor: AtomicU64::new(0),
            measurement: Measurement::new(&controller),
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
            levels: Levels::new(Reserves::none()),
            clock,
        }
    }

    /// The state with `reserves` (none by default): the share of the limit each level may
    /// not take while a higher level is active.
    pub(super) fn with_reserves(mut self, reserves: Reserves) -> Self {
        self.levels = Levels::new(reserves);
        self
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

    /// Once a [`TICK`] while the layer lives: ends a probe past its deadline; releases the
    /// requests held too long; closes a window whose limit is held full while nothing
    /// completes; ends the episode of a limit that has rejected nothing for the quiet
    /// period; and sets the latency gauge to zero once no request has completed for the
    /// quiet period (it describes a window of requests, and none has been measured).
    fn tick(&self) {
        self.flush_admitted();
        let now = self.clock.now();
        if now >= self.close_by.load(Ordering::Relaxed) {
            // A probe whose requests stopped completing (or coming) ends here.
            self.close_window(now, Close::Deadline);
        }
        self.release_held(now);
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
            return;
        }
        let still = now.saturating_sub(self.last_progress.load(Ordering::Relaxed));
        if self.is_held_full(now, still) {
            self.close_window(now, Close::HeldFull);
        }
        if still >= saturating_nanos(self.quiet) && !self.latency_idle.swap(true, Ordering::Relaxed)
        {
            self.metrics.get().latency.set(0.0);
        }
    }

    /// Whether the window (tracking, with a baseline) has been held full for a while: it has
    /// lasted twice its length, the limit turned requests away in it, and nothing has
    /// completed for `still` nanoseconds, at least twice the window and the target latency.
    ///
    /// Then the window closes whatever it holds, so that the controller moves without
    /// completions: the requests that completed before say whether the service was fine
    /// with the limit in use (it grows the limit if so), and the held ones are released at
    /// their bound. A window that is not held full waits for its outcomes, as before: the
    /// percentile of a handful of samples is noise, and at a low rate every window would
    /// hold a handful.
    fn is_held_full(&self, now: u64, still: u64) -> bool {
        let target = self.slow_drop.load(Ordering::Relaxed);
        target != u64::MAX
            && self.rejected_in_window.load(Ordering::Relaxed)
            && now
                >= self
                    .close_at
                    .load(Ordering::Relaxed)
                    .saturating_add(self.window)
            && still >= target.max(self.window.saturating_mul(2))
    }

    /// Once per `release_after`, releases the requests in flight for longer: their slots
    /// come back, and each is a latency sample of the least time it has run (not while a
    /// baseline is measured, whose samples must be completed requests).
    pub(super) fn release_held(&self, now: u64) {
        let release_after = self.release_after.load(Ordering::Relaxed);
        if let Some(released) = self.held.advance(now, release_after) {
            self.release(released, release_after);
        }
    }

    #[cold]
    fn release(&self, released: Released, release_after: u64) {
        if released.count == 0 {
            let metrics = self.metrics.get();
            metrics.held_running.set(self.held.released() as f64);
            return;
        }
        // NOTE: the count the tick took off the generation's word is the number of those
        // requests' admissions still in `in_flight` (each admission adds to `in_flight`
        // before it adds to its word): this never takes off more than was added.
        self.in_flight
            .fetch_sub(released.count as usize, Ordering::AcqRel);
        if self.slow_drop.load(Ordering::Relaxed) != u64::MAX {
            self.sampler.record_many(released.age, released.count);
        } else {
            // NOTE: released requests never complete here: those a baseline measurement
            // sampled count toward closing it (all of them, measured or not, which at worst
            // closes it a little early), or it could wait for them for ever.
            self.measurement.lose(released.count);
        }
        let metrics = self.metrics.get();
        metrics.held.increment(released.count);
        metrics.held_running.set(self.held.released() as f64);
        tracing::debug!(
            name = %self.name(),
            released = released.count,
            release_after = ?Duration::from_nanos(release_after),
            still_running = self.held.released(),
            "adaptive limit released requests held longer than their bound"
        );
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

    /// Admits a request of `level` if, once it is, the requests in flight are at most the
    /// limit less what `level` may not take of it (its share while a higher level is
    /// active: see [`Levels`]), and fewer than the maximum limit with the released requests
    /// still running.
    #[inline]
    pub(super) fn try_admit(&self, level: Criticality) -> Option<AdmittedRequest> {
        let now = self.clock.now();
        let limit = self.limit.load(Ordering::Relaxed);
        // NOTE: released requests no longer count toward the limit, but they still run: a
        // service that never answers must not take an unbounded pile of them.
        let ceiling = self
            .max_limit
            .load(Ordering::Relaxed)
            .saturating_sub(self.held.released());
        let held_back = self.levels.held_back(level, limit, now);
        let open = (limit - held_back).min(ceiling);
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |n| {
                (n < open).then_some(n + 1)
            });
        match admitted {
            Ok(before) => {
                // NOTE: read first: a write to this shared word on every admission would move
                // its cache line between the cores even when the peak does not change.
                if self.peak_in_flight.load(Ordering::Relaxed) <= before {
                    self.peak_in_flight.fetch_max(before + 1, Ordering::Relaxed);
                }
                // NOTE: striped while the tick runs (it adds the stripes to the counters once
                // a tick), so the cores do not share the counter's cache line per request.
                if self.ticker.is_running() {
                    self.levels.count_admitted(level);
                } else {
                    self.metrics.get().admitted[level.rank()].increment(1);
                }
                let measured = self.measurement.admit(now, &self.sample_floor);
                // NOTE: after the in-flight count, never before: the tick takes a released
                // generation's count off `in_flight`, which must already hold it.
                let generation = self.held.admit();
                Some(AdmittedRequest {
                    started: now,
                    generation,
                    measured,
                })
            }
            Err(in_flight) => {
                self.metrics.get().rejected[level.rank()].increment(1);
                // NOTE: read first: under overload every rejection would otherwise write the
                // shared cache line.
                if !self.rejected_in_window.load(Ordering::Relaxed) {
                    self.rejected_in_window.store(true, Ordering::Relaxed);
                }
                if in_flight < limit.min(ceiling) {
                    // NOTE: turned away at its level's part, the limit itself not full: the
                    // level used all it may take, which the controller counts as a limit in
                    // use (see `AdaptiveWindowStats::level_full`).
                    self.levels.turned_away_below_the_limit();
                }
                tracing::trace!(name = %self.name(), limit, %level, held_back, "adaptive limit reached");
                if self.engaged.seen(now) {
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
        let admitted = self.levels.take_admitted();
        if admitted.iter().any(|&n| n > 0) {
            let metrics = self.metrics.get();
            for (counter, n) in metrics.admitted.iter().zip(admitted) {
                if n > 0 {
                    counter.increment(n);
                }
            }
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
    /// Ends an admitted request with `completion`.
    ///
    /// A request the tick released (held longer than its bound) was counted then, once:
    /// its completion counts nothing more.
    ///
    /// A dropped request's latency is unknown. One dropped early (a client that went away)
    /// says nothing about the service and is not sampled. One dropped after running longer
    /// than the baseline times the tolerance is sampled with the time it ran: under a
    /// timeout layer above this one, a slowing service's requests are dropped, not
    /// completed, and without these samples only the fast completions would be measured and
    /// the limit would hold while most requests time out.
    fn complete(&self, admitted: &AdmittedRequest, completion: Completion);
}

impl<C: Clock> CompleteRequest for AdaptiveLimitState<C> {
    #[inline]
    fn complete(&self, admitted: &AdmittedRequest, completion: Completion) {
        if !self.held.complete(admitted.generation) {
            // NOTE: released by the tick, which gave its slot back and sampled it.
            return;
        }
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
        let now = self.clock.now();
        if admitted.started >= self.sample_floor.load(Ordering::Relaxed)
            && self.measurement.samples(admitted.measured)
        {
            let elapsed = now.saturating_sub(admitted.started);
            match completion {
                Completion::Overloaded => self.sampler.record_failure(),
                Completion::Served => self.sampler.record(elapsed),
                Completion::Dropped if elapsed > self.slow_drop.load(Ordering::Relaxed) => {
                    self.sampler.record(elapsed);
                }
                Completion::Dropped | Completion::LeftOut => self.measurement.lose(1),
            }
        }
        // NOTE: checked whatever the outcome, so that a probe whose requests are all
        // dropped (or rejected inside) still ends at its deadline.
        let due = now >= self.close_at.load(Ordering::Relaxed)
            && self.closing_outcomes() >= self.close_after_outcomes.load(Ordering::Relaxed);
        if due {
            self.close_window(now, Close::Due);
        } else if now >= self.close_by.load(Ordering::Relaxed) {
            self.close_window(now, Close::Deadline);
        }
    }
}

/// Why a window closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Close {
    /// It has lasted its length and holds its outcomes (checked again under the lock).
    Due,
    /// A probe's deadline passed (checked again under the lock).
    Deadline,
    /// The tick found it held full while nothing completes: it closes whatever it holds.
    HeldFull,
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
    fn close_window(&self, now: u64, close: Close) {
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
        let close_at = self.close_at.load(Ordering::Relaxed);
        let still_open = match close {
            Close::Due | Close::Deadline => {
                timed_out
                    || (now >= close_at
                        && self.closing_outcomes()
                            >= self.close_after_outcomes.load(Ordering::Relaxed))
            }
            // NOTE: the window the tick found held full, not a fresh one opened since.
            Close::HeldFull => {
                self.rejected_in_window.load(Ordering::Relaxed)
                    && now >= close_at.saturating_add(self.window)
            }
        };
        if !still_open {
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
            level_full: self.levels.take_level_full(),
            timed_out,
        };
        let before = controller.limit();
        let was_probing = matches!(controller.phase(), ControllerPhase::Probing { .. });
        let update = controller.on_window(now, stats);
        // NOTE: a probe that could read no latency yet (its sampled requests all ended with
        // no outcome) goes on, within the deadline it started with.
        let probe_goes_on = was_probing
            && !update.probe_started
            && matches!(controller.phase(), ControllerPhase::Probing { .. });
        // NOTE: the next window samples only requests admitted from now on, under the new
        // limit: a request admitted under the previous one measures the previous decision,
        // and counting it makes the limit overshoot (it would see no queue for a whole
        // latency after raising the limit). A probe needs the same, for its baseline.
        if update.limit != before || update.probe_started {
            self.sample_floor.store(now, Ordering::Relaxed);
        }
        // NOTE: after the floor: an admission that counts toward the quota reads the new
        // floor.
        self.measurement.open(&controller);
        self.limit.store(update.limit, Ordering::Relaxed);
        self.slow_drop
            .store(slow_drop(&controller, self.tolerance), Ordering::Relaxed);
        self.release_after.store(
            release_after(self.fixed_release_after, &controller, self.tolerance),
            Ordering::Relaxed,
        );
        self.close_after_outcomes
            .store(controller.samples_needed(), Ordering::Relaxed);
        self.close_at.store(
            now.saturating_add(controller.window_nanos()),
            Ordering::Relaxed,
        );
        if !probe_goes_on {
            let close_by = controller
                .deadline_nanos()
                .map_or(u64::MAX, |deadline| now.saturating_add(deadline));
            self.close_by.store(close_by, Ordering::Relaxed);
        }
        tracing::trace!(
            limit = update.limit,
            before,
            samples = stats.samples,
            failures = stats.failures,
            latency_ns = stats.latency,
            peak_in_flight = stats.peak_in_flight,
            probing = update.probe_started,
            timed_out,
            held_full = close == Close::HeldFull,
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

    /// What counts toward closing the window: its outcomes, and the requests a baseline
    /// measurement sampled that ended with none.
    #[inline]
    fn closing_outcomes(&self) -> u64 {
        self.sampler.outcomes() + self.measurement.lost()
    }

    /// Outcomes recorded in the current window.
    #[cfg(all(test, loom))]
    pub(super) fn outcomes(&self) -> u64 {
        self.sampler.outcomes()
    }

    /// A reading for people and tests.
    /// Puts the bounds `min..=max` in force (validated by the caller): the limit is clamped
    /// into them now, and the next windows move it within them.
    pub(super) fn set_bounds(&self, min: usize, max: usize) {
        let mut controller = self.lock_controller();
        let before = controller.limit();
        let limit = controller.set_bounds(min, max);
        self.max_limit.store(max, Ordering::Relaxed);
        if limit != before {
            // NOTE: as when a window moves the limit: the next window measures this one.
            self.sample_floor.store(self.clock.now(), Ordering::Relaxed);
        }
        self.limit.store(limit, Ordering::Relaxed);
    }

    pub(super) fn status(&self) -> Status {
        let controller = self.lock_controller();
        Status {
            limit: self.limit.load(Ordering::Relaxed),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            released: self.held.released(),
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
    /// Requests admitted and not yet completed, but those released.
    pub in_flight: usize,
    /// Requests released from the limit for being in flight longer than
    /// [`release_after`](super::AdaptiveLimitBuilder::release_after), and still running:
    /// they no longer count toward the limit, only toward its ceiling
    /// ([`max_limit`](super::AdaptiveLimitBuilder::max_limit)), with those in flight.
    pub released: usize,
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
            .field("held", &self.held)
            .field("retry_after", &self.retry_after)
            .field("reserves", self.levels.reserves())
            .finish_non_exhaustive()
    }
}
