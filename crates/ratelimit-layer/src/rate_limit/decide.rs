//! The local decision: one global limit, or one per key with the missing-key policy
//! ([`LocalDecide`], type-erased so that the layer's type does not name the limiter, the
//! clock or the key extractor).

use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use overload_core::clock::{Clock, TokioClock};
use overload_core::telemetry::{LazyMetrics, LogThrottle};
use overload_signal::criticality::{RecentLevels, Reserves};
use overload_signal::protocol::Criticality;

use crate::algorithm::{Decision, Limiter, QuotaStatus};
use crate::key::{KeyExtractor, MissingKey};
use crate::keyed::{KeyClass, KeyedLimiter};
use crate::telemetry::KeyedLimitMetrics;

/// A limiter's parameters as the fields describe them: its quota, its window and its
/// capacity ([`Limiter::quota`], [`Limiter::window`], [`Limiter::capacity`]).
pub(crate) type Parameters = (u64, Duration, u64);

/// Decides a request: the limiter with its state(s) and key extractor, type-erased.
pub(crate) trait LocalDecide: Send + Sync + 'static {
    /// The decision, the quota status when a rejection (always) or an admission (when
    /// `status_on_allow`) needs it for the `RateLimit` field, and the key class; `None` when
    /// the request has no key and the [`MissingKey`] policy is to reject it.
    fn decide(
        &self,
        parts: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)>;

    /// The decision for a request of `cost` without reading the request, for a decision
    /// that reads nothing of it (one limit for every request); `None` for one that does (a
    /// keyed limit), which only [`decide`](Self::decide) decides. Whatever it returns,
    /// [`decide`](Self::decide) would return for any request.
    fn decide_unread(
        &self,
        _cost: u32,
        _level: Criticality,
        _status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        None
    }

    /// Whether [`decide`](Self::decide) reads the request: `false` when
    /// [`decide_unread`](Self::decide_unread) decides every request.
    fn reads_request(&self) -> bool {
        true
    }

    /// The limiter's clock, now.
    fn now(&self) -> u64;

    /// The limiter's parameters in force: its quota, window and capacity (a live limiter's
    /// change while it serves), from which the fields are advertised.
    fn parameters(&self) -> Parameters;

    /// The layer's first request: registers the decision's own metrics.
    fn first_request(&self) {}

    /// Once a tick: keeps the decision's own gauges true.
    fn tick(&self) {}

    /// The missing-key policy of a keyed limit, shared with a remote decider so that both
    /// apply (and log, and count) the same one.
    #[cfg(feature = "redis")]
    fn missing_key_policy(&self) -> Option<Arc<MissingKeyPolicy>> {
        None
    }

    /// The decision's shedding from the bottom, shared with a remote decider so that both
    /// see the same levels.
    #[cfg(feature = "redis")]
    fn shedding(&self) -> Option<Arc<Shedding>>;
}

/// How a limit sheds from the bottom: the share of its capacity each level may not take
/// ([`Reserves`]) while a higher level is active, and which levels were active lately
/// ([`RecentLevels`]), one for the whole limit (every key of a keyed limit).
pub(crate) struct Shedding {
    reserves: Reserves,
    recent: RecentLevels,
}

impl Shedding {
    /// `None` for [`Reserves::none`]: nothing is ever held back, so nothing is noted.
    pub(crate) fn new(reserves: Reserves) -> Option<Arc<Self>> {
        (!reserves.is_none()).then(|| {
            Arc::new(Self {
                reserves,
                recent: RecentLevels::default(),
            })
        })
    }

    /// Notes a request of `level` and returns the units it may not take now, out of
    /// `capacity`.
    #[inline]
    pub(crate) fn held_back(&self, level: Criticality, capacity: u64, now: u64) -> u64 {
        self.recent.note(level, now);
        self.recent.held_back(&self.reserves, level, capacity, now)
    }
}

/// The units `shed` holds back from a request of `level` now, out of `capacity` (0 without
/// reserves).
#[inline]
pub(crate) fn held_back(
    shed: Option<&Shedding>,
    level: Criticality,
    capacity: u64,
    now: u64,
) -> u64 {
    shed.map_or(0, |shed| shed.held_back(level, capacity, now))
}

/// A decision made with `held_back` units held back, its `retry_after` made true when no
/// wait lets the request in while they stay held (`cost + held_back` above the capacity):
/// then it waits at least until the higher levels may have gone quiet, a
/// [`RecentLevels::DEFAULT_WINDOW`] from now at the latest, if they stop now.
#[inline]
pub(crate) fn held_decision(
    decision: Decision,
    cost: u32,
    held_back: u64,
    capacity: u64,
) -> Decision {
    match decision {
        Decision::Reject { retry_after }
            if held_back > 0 && u64::from(cost).saturating_add(held_back) > capacity =>
        {
            Decision::Reject {
                retry_after: retry_after.max(RecentLevels::DEFAULT_WINDOW),
            }
        }
        decision => decision,
    }
}

/// `limiter.check_holding_back`, plus its status when the response will report it.
#[inline]
fn check_and_status<L: Limiter>(
    limiter: &L,
    state: &L::State,
    now: u64,
    cost: u32,
    held_back: u64,
    status_on_allow: bool,
) -> (Decision, Option<QuotaStatus>) {
    let decision = limiter.check_holding_back(state, now, cost, held_back);
    let decision = held_decision(decision, cost, held_back, limiter.capacity());
    let want = !decision.is_allowed() || status_on_allow;
    (decision, want.then(|| limiter.status(state, now)))
}

/// One limit for every request.
pub(crate) struct GlobalDecider<L: Limiter, C> {
    pub(crate) limiter: L,
    pub(crate) clock: C,
    pub(crate) state: L::State,
    pub(crate) shed: Option<Arc<Shedding>>,
}

impl<L: Limiter, C: Clock> LocalDecide for GlobalDecider<L, C> {
    #[inline]
    fn decide(
        &self,
        parts: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        self.decide_unread(cost, Criticality::of(&parts.extensions), status_on_allow)
    }

    #[inline]
    fn decide_unread(
        &self,
        cost: u32,
        level: Criticality,
        status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        let now = self.clock.now();
        let held = held_back(self.shed.as_deref(), level, self.limiter.capacity(), now);
        let (decision, status) =
            check_and_status(&self.limiter, &self.state, now, cost, held, status_on_allow);
        Some((decision, status, KeyClass::Global))
    }

    fn reads_request(&self) -> bool {
        false
    }

    #[cfg(feature = "redis")]
    fn shedding(&self) -> Option<Arc<Shedding>> {
        self.shed.clone()
    }

    fn now(&self) -> u64 {
        self.clock.now()
    }

    fn parameters(&self) -> Parameters {
        parameters(&self.limiter)
    }
}

/// `limiter`'s quota, window and capacity.
fn parameters<L: Limiter>(limiter: &L) -> Parameters {
    (limiter.quota(), limiter.window(), limiter.capacity())
}

/// One limit per key, in a [`KeyedLimiter`], and what to do with a request without one.
pub(crate) struct KeyedDecider<L: Limiter, C, E: KeyExtractor> {
    pub(crate) map: KeyedLimiter<L, E::Key, C>,
    pub(crate) extract: E,
    /// The shared limit of requests without a key, under [`MissingKey::Shared`].
    pub(crate) unkeyed: L::State,
    pub(crate) missing: Arc<MissingKeyPolicy>,
    /// One for the whole layer: a level active on any key holds back on every key.
    pub(crate) shed: Option<Arc<Shedding>>,
}

impl<L: Limiter, C: Clock, E: KeyExtractor> LocalDecide for KeyedDecider<L, C, E> {
    #[inline]
    fn decide(
        &self,
        parts: &Parts,
        cost: u32,
        status_on_allow: bool,
    ) -> Option<(Decision, Option<QuotaStatus>, KeyClass)> {
        let level = Criticality::of(&parts.extensions);
        let capacity = self.map.limiter().capacity();
        match self.extract.extract(parts) {
            // NOTE: a borrowed key (a header's bytes) is looked up in place; only a key seen
            // for the first time is copied into the map.
            // The client's address only for a new key past the cap (its network's overflow).
            Some(key) => {
                let mut held = 0;
                let (decision, status, class) = self.map.check_lazy(
                    &*key,
                    || self.extract.client_addr(parts),
                    cost,
                    |now| {
                        held = held_back(self.shed.as_deref(), level, capacity, now);
                        held
                    },
                    status_on_allow,
                );
                let decision = held_decision(decision, cost, held, capacity);
                Some((decision, status, class))
            }
            None => match self.missing.apply() {
                MissingKey::Reject => None,
                // NOTE: no status: nothing limits it, so no `RateLimit` field describes it.
                MissingKey::Bypass => Some((Decision::Allow, None, KeyClass::Unkeyed)),
                MissingKey::Shared => {
                    let now = self.map.clock().now();
                    let held = held_back(self.shed.as_deref(), level, capacity, now);
                    let (decision, status) = check_and_status(
                        self.map.limiter(),
                        &self.unkeyed,
                        now,
                        cost,
                        held,
                        status_on_allow,
                    );
                    Some((decision, status, KeyClass::Unkeyed))
                }
            },
        }
    }

    fn now(&self) -> u64 {
        self.map.clock().now()
    }

    fn parameters(&self) -> Parameters {
        parameters(self.map.limiter())
    }

    fn first_request(&self) {
        self.report_keys();
    }

    /// Sweeps the shards that are due, so that the keys of clients that went away are
    /// forgotten even when no new key arrives, and reports how many are left.
    fn tick(&self) {
        self.map.sweep_due();
        self.report_keys();
    }

    #[cfg(feature = "redis")]
    fn missing_key_policy(&self) -> Option<Arc<MissingKeyPolicy>> {
        Some(Arc::clone(&self.missing))
    }

    #[cfg(feature = "redis")]
    fn shedding(&self) -> Option<Arc<Shedding>> {
        self.shed.clone()
    }
}

impl<L: Limiter, C: Clock, E: KeyExtractor> KeyedDecider<L, C, E> {
    fn report_keys(&self) {
        // NOTE: a gauge is a float; a key count is exact in it up to 2^53.
        #[allow(clippy::cast_precision_loss)]
        self.missing.metrics.get().keys.set(self.map.len() as f64);
    }
}

/// The [`MissingKey`] policy of a keyed layer, with its log, and the keyed layer's metrics
/// (its counter, and the keys gauge).
pub(crate) struct MissingKeyPolicy {
    policy: MissingKey,
    /// Whether the key is the peer address ([`ClientIp`](crate::key::ClientIp)): a key missing
    /// then means the server does not put the peer address in its requests.
    peer_keyed: bool,
    /// Logged at the first request without a key, then at most once a minute while they
    /// keep coming.
    log: LogThrottle,
    /// The throttle's time (tokio's, so that it follows paused time in tests).
    clock: TokioClock,
    metrics: LazyMetrics<KeyedLimitMetrics>,
}

/// How often a keyed layer that keeps finding requests without a key logs it again: at
/// most once a minute, each line with the count since the previous one.
pub(crate) const MISSING_KEY_LOG_INTERVAL: Duration = Duration::from_secs(60);

impl MissingKeyPolicy {
    pub(crate) fn new(
        policy: MissingKey,
        metrics: LazyMetrics<KeyedLimitMetrics>,
        peer_keyed: bool,
    ) -> Self {
        Self {
            policy,
            peer_keyed,
            log: LogThrottle::new(MISSING_KEY_LOG_INTERVAL),
            clock: TokioClock::new(),
            metrics,
        }
    }

    /// The policy, without applying it.
    #[cfg(feature = "redis")]
    pub(crate) const fn policy(&self) -> MissingKey {
        self.policy
    }

    /// Counts a request without a key, logs it (at the first, then at most once a minute),
    /// and says what to do with it.
    pub(crate) fn apply(&self) -> MissingKey {
        self.metrics.get().missing_key(self.policy).increment(1);
        if let Some(count) = self.log.note(self.clock.now()) {
            self.log(count);
        }
        self.policy
    }

    /// Logs that `count` requests without a key came since the last line: at `ERROR` with
    /// the fix when the key is the peer address (the server is set up wrong, which no client
    /// can cause); at `WARN` otherwise (a client can leave out a header).
    #[cold]
    fn log(&self, count: u64) {
        let action = match self.policy {
            MissingKey::Reject => "answering 500 without calling the service",
            MissingKey::Shared => "limiting every request without a key together, as one key",
            MissingKey::Bypass => "admitting every request without a key, unlimited",
        };
        if self.peer_keyed {
            tracing::error!(
                name = %self.metrics.name(),
                missing_key = self.policy.as_str(),
                requests = count,
                "ratelimit-layer: requests without a peer address: the server does not put the \
                 connection's peer in its requests, so a client-IP limit cannot tell its \
                 clients apart; {action} (the layer's missing-key policy). The layers read a \
                 `SocketAddr` request extension. Fix: axum 0.8, serve with \
                 `ratelimit_layer::axum_0_8::into_make_service_with_peer_addr(app)` (feature \
                 `axum-0_8`); tonic 0.14, build the server with \
                 `ratelimit_layer::tonic_0_14::server_builder()` (feature `tonic-0_14`); any \
                 other server (another major version of axum or tonic, hyper), insert the \
                 peer's `SocketAddr` in each request's extensions, outside this layer. Logged \
                 again at most every {MISSING_KEY_LOG_INTERVAL:?} while it lasts; \
                 `ratelimit_layer_missing_key_total` counts every such request."
            );
        } else {
            tracing::warn!(
                name = %self.metrics.name(),
                missing_key = self.policy.as_str(),
                requests = count,
                "ratelimit-layer: requests without a rate-limit key; {action} (the layer's \
                 missing-key policy). Logged again at most every {MISSING_KEY_LOG_INTERVAL:?} \
                 while it lasts; `ratelimit_layer_missing_key_total` counts every such request."
            );
        }
    }
}
