//! What every clone of a rate limit layer, and every service it makes, shares: the local
//! decision, the cost of a request, the `RateLimit-Policy` value, the metrics, the episode
//! of the limit engaged, and (with a limit kept in Redis) the remote decision.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, Guard};
use http::HeaderValue;
use http::request::Parts;
use overload_core::sync::StripedCounter;
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, Ticker};
use overload_core::{ConfigError, ConfigErrorKind};
use overload_signal::protocol::{Criticality, RateLimitPolicy};
use overload_signal::signal::RejectionKind;

use super::decide::{LocalDecide, Parameters};
#[cfg(feature = "redis")]
use super::remote_decision::RemoteDecide;
use crate::algorithm::{Decision, Limiter, QuotaStatus};
use crate::keyed::KeyClass;
use crate::telemetry::{RateLimitMetrics, TICK};

/// A local decision: the decision, the quota status when read, and the key class (see
/// [`LocalDecide::decide`]).
pub(crate) type Decided = (Decision, Option<QuotaStatus>, KeyClass);

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
    /// The cost of every request when neither the cost nor the decision reads the request
    /// (a fixed cost, one limit for every request, no remote decider): such a request is
    /// decided without being taken apart ([`decide_unread`](Self::decide_unread)).
    unread_cost: Option<u32>,
    /// The limit advertised and answered for, formatted once per set of parameters: a live
    /// limiter's ([`LiveTokenBucket`](crate::algorithm::LiveTokenBucket),
    /// [`LiveWindow`](crate::algorithm::LiveWindow)) is formatted again after each change
    /// (see [`advertised`](Self::advertised)).
    advertised: ArcSwap<Advertised>,
    /// Whether [`advertised`](Self::advertised) follows the local limiter's parameters:
    /// `false` for a limit kept in Redis, which advertises the fleet's.
    follows_limiter: bool,
    pub(crate) admitted_headers: bool,
    pub(crate) metrics: LazyMetrics<RateLimitMetrics>,
    /// The limit rejecting: begun by a rejection, over after `quiet` without one.
    engaged: Episode,
    /// How long without a rejection before the episode is over.
    quiet: Duration,
    /// Started by the first request, which registers the metrics.
    ticker: Ticker,
    /// Admitted requests not yet added to the admitted counter: the tick adds them, so that
    /// the cores do not share one counter's cache line on every request.
    /// Indexed by [`Criticality::rank`].
    admitted: [StripedCounter; 4],
    /// A limiter that decides elsewhere (Redis, for a fleet), asked first; `decide` is then
    /// its local fallback. `None` for a local limit.
    #[cfg(feature = "redis")]
    pub(crate) remote: Option<Box<dyn RemoteDecide>>,
}

impl RateLimitState {
    pub(crate) fn new(
        decide: Box<dyn LocalDecide>,
        cost: RequestCost,
        limit: AdvertisedLimit,
        name: LayerName,
        admitted_headers: bool,
        window: Duration,
        quiet: Duration,
    ) -> Self {
        let unread_cost = match cost {
            RequestCost::Fixed(cost) if !decide.reads_request() => Some(cost),
            _ => None,
        };
        let advertised = Advertised::new(decide.parameters(), limit, window);
        Self {
            decide,
            cost,
            unread_cost,
            advertised: ArcSwap::from_pointee(advertised),
            follows_limiter: true,
            admitted_headers,
            metrics: LazyMetrics::new(name),
            engaged: Episode::new(),
            quiet,
            ticker: Ticker::new(),
            admitted: std::array::from_fn(|_| StripedCounter::new()),
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

    /// The limit advertised (`RateLimit-Policy`) and answered for (the capacity above which a
    /// request is `413`), as of the limiter's parameters now.
    ///
    /// NOTE: only responses that carry the fields, and the `413` check, read it: one call to
    /// the decision for the parameters and one atomic load while they stay the same; it is
    /// formatted again (once, by whichever response sees the change first) when a live
    /// limiter's parameters changed.
    pub(crate) fn advertised(&self) -> Guard<Arc<Advertised>> {
        let current = self.advertised.load();
        if !self.follows_limiter {
            return current;
        }
        let parameters = self.decide.parameters();
        if parameters == current.parameters {
            return current;
        }
        let (quota, window, capacity) = parameters;
        // NOTE: the name was valid when the layer was built, so this cannot fail; if it did,
        // the fields in force stay.
        let Ok(limit) = advertise(self.name(), quota, window, capacity) else {
            return current;
        };
        self.advertised
            .store(Arc::new(Advertised::new(parameters, limit, window)));
        self.advertised.load()
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

    /// The cost and the local decision of a request, when neither reads the request (a
    /// fixed cost, one limit for every request) and no remote decider is asked: what
    /// [`cost`](Self::cost) and [`decide`](Self::decide) would return for any request, found
    /// without it. `None` for any other limit.
    #[inline]
    pub(crate) fn decide_unread(&self, level: Criticality) -> Option<(u32, Decided)> {
        let cost = self.unread_cost?;
        let decided = self
            .decide
            .decide_unread(cost, level, self.admitted_headers)?;
        Some((cost, decided))
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
    pub(crate) fn count_admitted(&self, level: Criticality) {
        if self.ticker.is_running() {
            self.admitted[level.rank()].add(1);
        } else {
            self.metrics.get().admitted(level).increment(1);
        }
    }

    /// Adds the striped admissions to the admitted counters.
    fn flush_admitted(&self) {
        for level in Criticality::ALL {
            let admitted = self.admitted[level.rank()].take();
            if admitted > 0 {
                self.metrics.get().admitted(level).increment(admitted);
            }
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

    /// Counts a rejection, records it as a `DEBUG` event of the request's span (the
    /// caller's current one), and logs it at `WARN` when it begins an episode of the limit
    /// engaged.
    pub(crate) fn rejected(&self, class: KeyClass, level: Criticality, retry_after: Duration) {
        self.metrics.get().rejected(class, level).increment(1);
        // NOTE: the key's class, never the key: a client's address or API key stays out
        // of traces.
        tracing::debug!(
            name = %self.name(),
            decision = RejectionKind::RateLimited.as_str(),
            key_class = class.as_str(),
            criticality = level.as_str(),
            retry_after_ms = u64::try_from(retry_after.as_millis()).unwrap_or(u64::MAX),
            "rate limited"
        );
        if self.engaged.seen(self.decide.now()) {
            self.engage(class, retry_after);
        }
    }

    #[cold]
    fn engage(&self, class: KeyClass, retry_after: Duration) {
        let advertised = self.advertised();
        tracing::warn!(
            name = %self.name(),
            key_class = class.as_str(),
            ?retry_after,
            quota = advertised.policy.quota(),
            window = ?advertised.policy.window(),
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

    /// The shedding of the local decision, for a remote decider to share.
    #[cfg(feature = "redis")]
    pub(crate) fn shedding(&self) -> Option<Arc<super::decide::Shedding>> {
        self.decide.shedding()
    }

    /// Asks `remote` first for every request, with the local decision as its fallback;
    /// the fields then advertise `limit` and `window` (the fleet's limit), whichever
    /// decides, and a request is too heavy ever to pass (`413`) only above the fleet's
    /// capacity: above the local share's alone, it waits for Redis (`429`).
    #[cfg(feature = "redis")]
    pub(crate) fn with_remote(
        mut self,
        remote: Box<dyn RemoteDecide>,
        limit: AdvertisedLimit,
        window: Duration,
    ) -> Self {
        let parameters = self.advertised.load().parameters;
        self.advertised = ArcSwap::from_pointee(Advertised::new(parameters, limit, window));
        self.follows_limiter = false;
        // NOTE: the remote decider reads the request.
        self.unread_cost = None;
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
            .field("policy", &self.advertised.load().policy)
            .field("cost", cost)
            .field("admitted_headers", &self.admitted_headers)
            .field("engaged", &self.engaged.is_active());
        #[cfg(feature = "redis")]
        d.field("remote", &self.remote.is_some());
        d.finish_non_exhaustive()
    }
}

/// The limit a layer advertises and answers for: its `RateLimit-Policy`, and the capacity
/// (the largest cost it admits) that tells a request too heavy ever to pass (`413`) from one
/// that must wait (`429`).
#[derive(Clone, Debug)]
pub(crate) struct AdvertisedLimit {
    pub(crate) policy: RateLimitPolicy,
    pub(crate) capacity: u64,
}

/// The limit a layer advertises now, with its `RateLimit-Policy` value formatted, and the
/// limiter's parameters it was formatted from.
#[derive(Debug)]
pub(crate) struct Advertised {
    parameters: Parameters,
    pub(crate) policy: RateLimitPolicy,
    /// The largest cost the advertised limit admits: a request above it is answered `413`.
    pub(crate) capacity: u64,
    /// The `RateLimit-Policy` value.
    pub(crate) header: HeaderValue,
    /// The limiter's window: the `Retry-After` of a request above the capacity of the local
    /// share of a limit kept in Redis (but not above the limit's own), and the reset of a
    /// rejection without a status.
    pub(crate) window: Duration,
}

impl Advertised {
    fn new(parameters: Parameters, limit: AdvertisedLimit, window: Duration) -> Self {
        Self {
            parameters,
            header: limit.policy.to_header_value(),
            policy: limit.policy,
            capacity: limit.capacity,
            window,
        }
    }
}

/// The limit `limiter` advertises under the layer's `name`, its `RateLimit-Policy` formatted
/// once. The name is a valid structured field string whenever it is a valid [`LayerName`].
///
/// The rule, for every algorithm (see [`policy_window`]): `w` is the time the limiter takes
/// to refill its whole capacity at its rate (the burst's emission time for a token bucket,
/// the window for the window algorithms), rounded up to whole seconds, at least one; `q` is
/// what the rate admits over `w`, rounded down.
pub(crate) fn rate_limit_policy<L: Limiter>(
    name: &LayerName,
    limiter: &L,
) -> Result<AdvertisedLimit, ConfigError> {
    advertise(name, limiter.quota(), limiter.window(), limiter.capacity())
}

/// What [`rate_limit_policy`] advertises for a limiter of these parameters.
fn advertise(
    name: &LayerName,
    quota: u64,
    window: Duration,
    capacity: u64,
) -> Result<AdvertisedLimit, ConfigError> {
    let (quota, window) = policy_window(quota, window, capacity);
    let policy = RateLimitPolicy::new(name.as_str(), quota, window)
        .map_err(|e| ConfigError::new("name", ConfigErrorKind::Invalid, e))?;
    Ok(AdvertisedLimit { policy, capacity })
}

/// The `q` and `w` of a limiter that admits `quota` units per `window` (its rate) and holds
/// at most `capacity` units at once: `w` is the time a drained capacity takes to refill at
/// that rate (`capacity x window / quota`), rounded up to whole seconds, at least one; `q`
/// is what the rate admits over `w`, rounded down.
///
/// Why: the draft's `q` is the quota over `w`, and the `RateLimit` field's `r` counts what
/// the limiter holds now, up to its capacity. A token bucket's `r` reaches its burst, so a
/// policy of `rate` per `period` rounded up to a second (`10 per 100 ms` as `q=10;w=1`, ten
/// times under the rate, with `r` up to the burst of 10 beside it) describes neither. Over
/// a window that long, `q >= capacity >= r` always, and the reset `t` (the time until the
/// capacity is whole again) is never longer than `w`; the window algorithms, whose capacity
/// is their quota, keep their own window, rounded up.
///
/// A custom limiter's zero window or zero quota is advertised as its quota per second.
pub(crate) fn policy_window(quota: u64, window: Duration, capacity: u64) -> (u64, Duration) {
    const NANOS_PER_SEC: u128 = 1_000_000_000;
    let window_nanos = window.as_nanos();
    if quota == 0 || window_nanos == 0 {
        return (quota, Duration::from_secs(1));
    }
    // NOTE: u64 x u128 of a Duration's nanoseconds fits in u128 only up to about 2^64
    // seconds; past it (no real limiter), the field's largest window.
    let refill = u128::from(capacity)
        .checked_mul(window_nanos)
        .map_or(u128::MAX, |n| n.div_ceil(u128::from(quota)));
    let secs = refill
        .div_ceil(NANOS_PER_SEC)
        .clamp(1, u128::from(u64::MAX));
    let secs = u64::try_from(secs).unwrap_or(u64::MAX);
    let over = u128::from(quota)
        .checked_mul(u128::from(secs) * NANOS_PER_SEC)
        .map_or(u128::MAX, |n| n / window_nanos);
    (
        u64::try_from(over).unwrap_or(u64::MAX),
        Duration::from_secs(secs),
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::policy_window;
    use crate::algorithm::Limiter;
    use crate::{FixedWindow, SlidingWindow, TokenBucket};

    fn advertised<L: Limiter>(limiter: &L) -> (u64, u64) {
        let (q, w) = policy_window(limiter.quota(), limiter.window(), limiter.capacity());
        (q, w.as_secs())
    }

    fn bucket(rate: u32, period: Duration, burst: u32) -> TokenBucket {
        TokenBucket::builder(rate)
            .period(period)
            .burst(burst)
            .build()
            .unwrap()
    }

    /// Regression (issue 30, finding 7): `RateLimit-Policy` advertised `q=rate;w=ceil(period)`
    /// while `RateLimit` counted out of the burst: a `10 per 100 ms` bucket was `q=10;w=1`,
    /// ten times under its rate. `w` is now the time the capacity takes to refill, in whole
    /// seconds, and `q` what the rate admits over it.
    #[test]
    fn the_policy_is_the_rate_over_the_time_the_capacity_takes_to_refill() {
        let ms = Duration::from_millis;
        let s = Duration::from_secs;
        // 10 per 100 ms, bursts of 10: refilled in 100 ms, so 100 per second.
        assert_eq!(advertised(&bucket(10, ms(100), 10)), (100, 1));
        // 300 per second, bursts of 30: refilled in 100 ms.
        assert_eq!(advertised(&bucket(300, s(1), 30)), (300, 1));
        // 60 per minute, bursts of 60: refilled in a minute.
        assert_eq!(advertised(&bucket(60, s(60), 60)), (60, 60));
        // 60 per minute, bursts of 5: refilled in 5 s, at one a second.
        assert_eq!(advertised(&bucket(60, s(60), 5)), (5, 5));
        // 10 per second, bursts of 5 (the crate's examples): unchanged.
        assert_eq!(advertised(&bucket(10, s(1), 5)), (10, 1));
        // 1 per hour, bursts of 10: refilled in 10 hours.
        assert_eq!(advertised(&bucket(1, s(3_600), 10)), (10, 36_000));
        // 5 per 3 s (600 ms apart), bursts of 2: refilled in 1.2 s, so over 2 s, 3.
        assert_eq!(advertised(&bucket(5, s(3), 2)), (3, 2));
        // The window algorithms keep their window, in whole seconds.
        let fixed = |quota, window| FixedWindow::builder(quota).window(window).build().unwrap();
        let sliding = |quota, window| {
            SlidingWindow::builder(quota)
                .window(window)
                .build()
                .unwrap()
        };
        assert_eq!(advertised(&fixed(10, ms(100))), (100, 1));
        assert_eq!(advertised(&fixed(3, s(10))), (3, 10));
        assert_eq!(advertised(&sliding(600, s(60))), (600, 60));
        assert_eq!(advertised(&sliding(5, ms(1_500))), (6, 2));
        // Degenerate figures of a custom limiter: per second, as given.
        assert_eq!(policy_window(7, Duration::ZERO, 7), (7, s(1)));
        assert_eq!(policy_window(0, s(10), 3), (0, s(1)));
        // The largest ones overflow nothing.
        let (q, w) = policy_window(u64::MAX, Duration::MAX, u64::MAX);
        assert!(q > 0 && w >= s(1));
    }

    /// Feeds `limiter` requests of `costs` at `gaps` apart, and checks after each that the
    /// `RateLimit` field's `r` is at most the policy's `q` and its `t` at most `w`.
    fn r_within_q<L: Limiter>(limiter: &L, costs: &[(u32, u64)]) -> Result<(), TestCaseError> {
        let (q, w) = policy_window(limiter.quota(), limiter.window(), limiter.capacity());
        prop_assert!(q >= limiter.capacity(), "q {q} below the capacity");
        let state = L::State::default();
        let mut now = 0u64;
        for &(cost, gap) in costs {
            now += gap;
            let _ = limiter.check(&state, now, cost);
            let status = limiter.status(&state, now);
            prop_assert!(status.remaining <= q, "r {} > q {q}", status.remaining);
            prop_assert!(status.reset <= w, "t {:?} > w {w:?}", status.reset);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn r_is_never_above_q_nor_t_above_w(
            rate in 1u32..2_000,
            period_ms in 1u64..4_000_000,
            burst in 1u32..2_000,
            costs in proptest::collection::vec((0u32..50, 0u64..5_000_000_000), 1..40),
        ) {
            let period = Duration::from_millis(period_ms);
            if let Ok(bucket) = TokenBucket::builder(rate).period(period).burst(burst).build() {
                r_within_q(&bucket, &costs)?;
            }
            let fixed = FixedWindow::builder(burst).window(period).build().unwrap();
            r_within_q(&fixed, &costs)?;
            let sliding = SlidingWindow::builder(burst).window(period).build().unwrap();
            r_within_q(&sliding, &costs)?;
        }
    }
}
