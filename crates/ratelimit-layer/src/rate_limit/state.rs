//! What every clone of a rate limit layer, and every service it makes, shares: the local
//! decision, the cost of a request, the `RateLimit-Policy` value, the metrics, the episode
//! of the limit engaged, and (with a limit kept in Redis) the remote decision.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderValue;
use http::request::Parts;
use overload_core::sync::StripedCounter;
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, Ticker};
use overload_core::{ConfigError, ConfigErrorKind};
use overload_signal::protocol::RateLimitPolicy;

use super::decide::LocalDecide;
#[cfg(feature = "redis")]
use super::remote_decision::RemoteDecide;
use crate::algorithm::{Decision, Limiter, QuotaStatus};
use crate::keyed::KeyClass;
use crate::telemetry::{RateLimitMetrics, TICK};

/// What a request costs.
pub(crate) enum RequestCost {
    Fixed(u32),
    By(Box<CostFn>),
}

pub(crate) type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

/// What every clone of a layer and its services shares.
pub(crate) struct RateLimitState {
    decide: Box<dyn LocalDecide>,
    cost: RequestCost,
    pub(crate) policy: RateLimitPolicy,
    /// The `RateLimit-Policy` value, formatted once: it never changes.
    pub(crate) policy_header: HeaderValue,
    pub(crate) admitted_headers: bool,
    /// The limiter's window: the `Retry-After` of an over-capacity request.
    pub(crate) window: Duration,
    pub(crate) metrics: LazyMetrics<RateLimitMetrics>,
    /// The limit rejecting: begun by a rejection, over after `quiet` without one.
    engaged: Episode,
    /// How long without a rejection before the episode is over.
    quiet: Duration,
    /// Started by the first request, which registers the metrics.
    ticker: Ticker,
    /// Admitted requests not yet added to the admitted counter: the tick adds them, so that
    /// the cores do not share one counter's cache line on every request.
    admitted: StripedCounter,
    /// A limiter that decides elsewhere (Redis, for a fleet), asked first; `decide` is then
    /// its local fallback. `None` for a local limit.
    #[cfg(feature = "redis")]
    pub(crate) remote: Option<Box<dyn RemoteDecide>>,
}

impl RateLimitState {
    pub(crate) fn new(
        decide: Box<dyn LocalDecide>,
        cost: RequestCost,
        policy: RateLimitPolicy,
        name: LayerName,
        admitted_headers: bool,
        window: Duration,
        quiet: Duration,
    ) -> Self {
        Self {
            decide,
            cost,
            policy_header: policy.to_header_value(),
            policy,
            admitted_headers,
            window,
            metrics: LazyMetrics::new(name),
            engaged: Episode::new(),
            quiet,
            ticker: Ticker::new(),
            admitted: StripedCounter::new(),
            #[cfg(feature = "redis")]
            remote: None,
        }
    }

    /// The layer's name: its metrics' `name` label, its logs' `name` field, and its
    /// `RateLimit-Policy` name.
    pub(crate) const fn name(&self) -> &LayerName {
        self.metrics.name()
    }

    #[inline]
    pub(crate) fn cost(&self, parts: &Parts) -> u32 {
        match &self.cost {
            RequestCost::Fixed(cost) => *cost,
            RequestCost::By(f) => f(parts),
        }
    }

    /// The local decision; see [`LocalDecide::decide`].
    #[inline]
    pub(crate) fn decide(
        &self,
        parts: &Parts,
        cost: u32,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        self.decide.decide(parts, cost, self.admitted_headers)
    }

    /// Every request: the first one registers the metrics and starts the ticker.
    #[inline]
    pub(crate) fn on_request(self: &Arc<Self>) {
        self.ticker
            .start(self, TICK, Self::first_request, Self::tick);
    }

    fn first_request(&self) {
        // NOTE: every metric of the layer is registered now, with the recorder installed
        // at the first request, whatever the request does.
        self.metrics.get();
        self.decide.first_request();
        #[cfg(feature = "redis")]
        if let Some(remote) = &self.remote {
            remote.first_request();
        }
    }

    /// Counts an admitted request: in a stripe of its core while the tick runs (which adds
    /// the stripes to the counter once a second), straight into the counter otherwise.
    #[inline]
    pub(crate) fn count_admitted(&self) {
        if self.ticker.is_running() {
            self.admitted.add(1);
        } else {
            self.metrics.get().admitted.increment(1);
        }
    }

    /// Adds the striped admissions to the admitted counter.
    fn flush_admitted(&self) {
        let admitted = self.admitted.take();
        if admitted > 0 {
            self.metrics.get().admitted.increment(admitted);
        }
    }

    /// Once a [`TICK`] while the layer lives: adds the admissions counted since the last
    /// tick to the admitted counter, ends the episode of a limit that has rejected nothing
    /// for the quiet period, and lets the decision keep its gauges true.
    fn tick(&self) {
        self.flush_admitted();
        if let Some(ended) = self.engaged.quiet_for(self.quiet, self.decide.now()) {
            tracing::info!(
                name = %self.name(),
                lasted = ?ended.lasted,
                quiet = ?self.quiet,
                "rate limit released: no request rejected for the quiet period"
            );
        }
        self.decide.tick();
    }

    /// Counts a rejection, and logs it at `WARN` when it begins an episode of the limit
    /// engaged (at `TRACE` otherwise).
    pub(crate) fn rejected(&self, class: KeyClass, retry_after: Duration) {
        self.metrics.get().rejected(class).increment(1);
        tracing::trace!(
            name = %self.name(),
            key_class = class.as_str(),
            ?retry_after,
            "rate limited"
        );
        if self.engaged.seen(self.decide.now()) {
            self.engage(class, retry_after);
        }
    }

    #[cold]
    fn engage(&self, class: KeyClass, retry_after: Duration) {
        tracing::warn!(
            name = %self.name(),
            key_class = class.as_str(),
            ?retry_after,
            quota = self.policy.quota(),
            window = ?self.policy.window(),
            "rate limit engaged: rejecting requests above the limit (logged once; `INFO` \
             once no request has been rejected for {:?})",
            self.quiet
        );
    }

    /// The missing-key policy of a keyed limit, for a remote decider to share.
    #[cfg(feature = "redis")]
    pub(crate) fn missing_key_policy(&self) -> Option<Arc<super::decide::MissingKeyPolicy>> {
        self.decide.missing_key_policy()
    }

    /// Asks `remote` first for every request, with the local decision as its fallback;
    /// the fields then advertise `policy` and `window` (the fleet's limit), whichever
    /// decides.
    #[cfg(feature = "redis")]
    pub(crate) fn with_remote(
        mut self,
        remote: Box<dyn RemoteDecide>,
        policy: RateLimitPolicy,
        window: Duration,
    ) -> Self {
        self.policy_header = policy.to_header_value();
        self.policy = policy;
        self.window = window;
        self.remote = Some(remote);
        self
    }
}

impl Drop for RateLimitState {
    /// The admissions counted since the last tick reach the counter when the layer goes.
    fn drop(&mut self) {
        if self.metrics.registered().is_some() {
            self.flush_admitted();
        }
    }
}

impl fmt::Debug for RateLimitState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cost: &dyn fmt::Debug = match &self.cost {
            RequestCost::Fixed(cost) => cost,
            RequestCost::By(_) => &"by request",
        };
        let mut d = f.debug_struct("RateLimitState");
        d.field("name", self.name())
            .field("policy", &self.policy)
            .field("cost", cost)
            .field("admitted_headers", &self.admitted_headers)
            .field("engaged", &self.engaged.is_active());
        #[cfg(feature = "redis")]
        d.field("remote", &self.remote.is_some());
        d.finish_non_exhaustive()
    }
}

/// The `RateLimit-Policy` of `limiter` under the layer's `name`: formatted once. The name
/// is a valid structured field string whenever it is a valid [`LayerName`].
pub(crate) fn rate_limit_policy<L: Limiter>(
    name: &LayerName,
    limiter: &L,
) -> Result<RateLimitPolicy, ConfigError> {
    // NOTE: the field's `w` is whole seconds, at least 1, so a custom limiter's zero window
    // is written as `w=1` rather than refused.
    let window = limiter.window().max(Duration::from_nanos(1));
    RateLimitPolicy::new(name.as_str(), limiter.quota(), window)
        .map_err(|e| ConfigError::new("name", ConfigErrorKind::Invalid, e))
}
