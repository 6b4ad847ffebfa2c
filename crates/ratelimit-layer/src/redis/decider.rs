//! A limit kept in Redis as the layer's remote decision ([`RedisDecider`]): the time
//! budget, the fallback to the local share, the way back, and the health of Redis followed
//! while no request asks it.

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use http::request::Parts;
use overload_core::clock::{Clock, saturating_nanos};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, spawn_ticker};
use redis::aio::ConnectionManager;
use redis::{Cmd, ErrorKind, RedisError};

use super::command::{RedisKeyName, command, evalsha};
use super::key::RedisKey;
use super::script::ScriptedLimit;
use super::store::RedisStore;
use crate::key::{KeyExtractor, MissingKey};
use crate::keyed::KeyClass;
use crate::rate_limit::decide::MissingKeyPolicy;
use crate::rate_limit::remote_decision::{
    RemoteDecide, RemoteDecision, RemoteFallback, RemoteOutcome,
};
use crate::telemetry::{RedisFallbackReason, RedisLimitMetrics};

/// What a layer's Redis limit needs besides its limiter and key extractor.
pub(crate) struct RedisSettings {
    pub(crate) store: RedisStore,
    pub(crate) scripted: ScriptedLimit,
    /// `{prefix}:{name}:{algorithm}:`.
    pub(crate) namespace: Vec<u8>,
    pub(crate) budget: Duration,
    /// How often, while Redis is away, one request asks it again; and how often, while no
    /// request asks it, the layer checks it.
    pub(crate) recheck: Duration,
    pub(crate) capacity: u64,
    pub(crate) name: LayerName,
}

/// A limit kept in Redis: [`RemoteDecide`] for the layer.
pub(crate) struct RedisDecider<E, C> {
    state: Arc<RedisDeciderState<C>>,
    /// `None` for one global limit.
    extract: Option<E>,
    /// What to do with a request without a key (a keyed limit's, shared with the local one).
    missing: Option<Arc<MissingKeyPolicy>>,
}

/// What every decision in flight, and the health checks, share.
struct RedisDeciderState<C> {
    settings: RedisSettings,
    clock: C,
    /// `UP` while Redis decides; otherwise the clock time (nanoseconds) from which one
    /// request may ask Redis again.
    health: AtomicU64,
    /// Redis away: begun by the first failure (`WARN`), ended by the first answer (`INFO`).
    away: Episode,
    /// Whether a request asked Redis since the last tick.
    asked: AtomicBool,
    /// Whether a health check is under way.
    checking: AtomicBool,
    /// Whether the ticker runs.
    started: AtomicBool,
    metrics: LazyMetrics<RedisLimitMetrics>,
    /// This state, for the health checks the ticker spawns.
    this: Weak<Self>,
}

const UP: u64 = 0;

impl<E, C: Clock> RedisDecider<E, C> {
    pub(crate) fn new(
        settings: RedisSettings,
        clock: C,
        extract: Option<E>,
        missing: Option<Arc<MissingKeyPolicy>>,
    ) -> Self {
        let metrics = LazyMetrics::new(settings.name.clone());
        Self {
            state: Arc::new_cyclic(|this| RedisDeciderState {
                settings,
                clock,
                health: AtomicU64::new(UP),
                away: Episode::new(),
                asked: AtomicBool::new(false),
                checking: AtomicBool::new(false),
                started: AtomicBool::new(false),
                metrics,
                this: Weak::clone(this),
            }),
            extract,
            missing,
        }
    }
}

impl<E, C> RemoteDecide for RedisDecider<E, C>
where
    E: KeyExtractor,
    E::Lookup: RedisKey,
    C: Clock,
{
    fn start(&self, parts: &Parts, cost: u32) -> Option<RemoteDecision> {
        let state = &*self.state;
        let settings = &state.settings;
        if cost == 0 || u64::from(cost) > settings.capacity {
            // NOTE: free, or never admissible: the local decision is the same as Redis's,
            // without the round trip. Not a fallback.
            return None;
        }
        // NOTE: the key first: a request that the missing-key policy decides without a
        // limit (rejected, or admitted) never asks Redis, so it is not a fallback either
        // when Redis is away.
        let target = match &self.extract {
            None => RedisTarget::Global,
            Some(extract) => match extract.extract(parts) {
                Some(key) => RedisTarget::Keyed(key),
                None => match self.missing.as_deref() {
                    // The local decision applies the policy (and logs and counts it, once).
                    Some(m) if m.policy() != MissingKey::Shared => return None,
                    _ => RedisTarget::Unkeyed,
                },
            },
        };
        if !state.may_ask() {
            state
                .metrics
                .get()
                .fallback(RedisFallbackReason::Unavailable)
                .increment(1);
            return None;
        }
        let connection = match settings.store.connection() {
            Ok(connection) => connection,
            Err(e) => {
                state.failed(RedisFallbackReason::Error, &e);
                return None;
            }
        };
        let (scripted, namespace) = (&settings.scripted, settings.namespace.as_slice());
        let (cmd, class) = match target {
            RedisTarget::Global => (
                command::<()>(scripted, namespace, RedisKeyName::Global, cost, None),
                KeyClass::Global,
            ),
            RedisTarget::Keyed(key) => (
                command(scripted, namespace, RedisKeyName::Keyed(&*key), cost, None),
                KeyClass::Keyed,
            ),
            RedisTarget::Unkeyed => {
                // NOTE: counted here; if Redis then fails to answer, the local fallback
                // counts the request a second time.
                if let Some(missing) = self.missing.as_deref() {
                    missing.apply();
                }
                (
                    command::<()>(scripted, namespace, RedisKeyName::Unkeyed, cost, None),
                    KeyClass::Unkeyed,
                )
            }
        };
        // NOTE: read first, so that a busy layer does not write the shared flag per request.
        if !state.asked.load(Ordering::Relaxed) {
            state.asked.store(true, Ordering::Relaxed);
        }
        Some(RemoteDecision::new(decide(
            Arc::clone(&self.state),
            connection,
            cmd,
            cost,
            class,
        )))
    }

    fn first_request(&self) {
        let state = &self.state;
        if state
            .started
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            return;
        }
        // NOTE: decisions go to Redis until one fails, so the gauge starts at 1.
        let up = state.health.load(Ordering::Acquire) == UP;
        state.metrics.get().up.set(if up { 1.0 } else { 0.0 });
        if !spawn_ticker(state, state.settings.recheck, RedisDeciderState::tick) {
            state.started.store(false, Ordering::Release);
        }
    }
}

/// What a request's decision is asked of Redis about.
enum RedisTarget<'a, L: ?Sized + ToOwned> {
    /// The layer's one global limit.
    Global,
    /// The request's key.
    Keyed(Cow<'a, L>),
    /// A keyed limit's request without a key, under `MissingKey::Shared`: one bucket for all.
    Unkeyed,
}

/// One decision: the script within the budget, its reply read, the health updated.
async fn decide<C: Clock>(
    state: Arc<RedisDeciderState<C>>,
    mut connection: ConnectionManager,
    cmd: Cmd,
    cost: u32,
    class: KeyClass,
) -> RemoteOutcome {
    let settings = &state.settings;
    let reply = tokio::time::timeout(
        settings.budget,
        evalsha(&mut connection, &cmd, settings.scripted.code),
    )
    .await;
    match reply {
        Ok(Ok(value)) => match settings.scripted.read_reply(&value, cost) {
            Ok((decision, status)) => {
                state.answered();
                Ok((decision, status, class))
            }
            Err(unexpected) => {
                let e = RedisError::from((
                    ErrorKind::Client,
                    "unexpected reply from the rate limit script",
                    unexpected.0,
                ));
                state.failed(RedisFallbackReason::Error, &e);
                Err(RemoteFallback)
            }
        },
        Ok(Err(e)) => {
            state.failed(RedisFallbackReason::Error, &e);
            Err(RemoteFallback)
        }
        Err(_elapsed) => {
            state.failed(RedisFallbackReason::Timeout, &state.over_budget());
            Err(RemoteFallback)
        }
    }
}

impl<C: Clock> RedisDeciderState<C> {
    /// Whether this request may ask Redis: always while it is up; while it is away, one
    /// request per recheck interval, which claims the turn.
    #[inline]
    fn may_ask(&self) -> bool {
        let health = self.health.load(Ordering::Acquire);
        if health == UP {
            return true;
        }
        let now = self.clock.now();
        now >= health
            && self
                .health
                .compare_exchange(
                    health,
                    self.next_recheck(now),
                    Ordering::AcqRel,
                    Ordering::Acquire,
                )
                .is_ok()
    }

    /// Never `UP`, so that "away" cannot be mistaken for "up" at the clock's origin.
    fn next_recheck(&self, now: u64) -> u64 {
        now.saturating_add(saturating_nanos(self.settings.recheck))
            .max(1)
    }

    fn over_budget(&self) -> RedisError {
        RedisError::from((
            ErrorKind::Io,
            "no answer within the time budget",
            format!("{:?}", self.settings.budget),
        ))
    }

    /// Redis answered: decisions go to Redis again, and the episode of Redis away ends.
    fn answered(&self) {
        // NOTE: read first, so that the usual case (already up) writes nothing shared.
        if self.health.load(Ordering::Acquire) != UP && self.health.swap(UP, Ordering::AcqRel) != UP
        {
            self.metrics.get().up.set(1.0);
            if let Some(ended) = self.away.end_now(self.clock.now()) {
                tracing::info!(
                    name = %self.settings.name,
                    redis = %self.settings.store.addr(),
                    away = ?ended.lasted,
                    "Redis answers again: the rate limit is shared by the fleet again"
                );
            }
        }
    }

    /// Redis could not decide a request: it falls back, counted, and Redis is away.
    fn failed(&self, reason: RedisFallbackReason, error: &RedisError) {
        self.metrics.get().fallback(reason).increment(1);
        self.unreachable(reason, error);
    }

    /// Redis did not answer: from now on requests are decided locally, but for one per
    /// recheck interval; the first failure of an episode is logged at `WARN`.
    fn unreachable(&self, reason: RedisFallbackReason, error: &RedisError) {
        let now = self.clock.now();
        if self
            .health
            .compare_exchange(
                UP,
                self.next_recheck(now),
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .is_ok()
        {
            self.metrics.get().up.set(0.0);
            if self.away.seen(now) {
                tracing::warn!(
                    name = %self.settings.name,
                    redis = %self.settings.store.addr(),
                    reason = reason.as_str(),
                    error = %error,
                    "Redis cannot decide the rate limit: each process applies its local share \
                     until Redis answers again (logged once; `INFO` when it does)"
                );
            }
        } else {
            tracing::debug!(
                name = %self.settings.name,
                reason = reason.as_str(),
                error = %error,
                "Redis still away"
            );
        }
    }

    /// Once a recheck interval while the layer lives: when no request asked Redis since
    /// the last tick (no traffic, or Redis away), checks it with a `PING`, so that its loss
    /// and its return are seen, logged and reported without traffic.
    fn tick(&self) {
        if self.asked.swap(false, Ordering::Relaxed) {
            // NOTE: requests asked it: their answers keep the health true.
            return;
        }
        if self.checking.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(this) = self.this.upgrade() else {
            return;
        };
        tokio::spawn(async move {
            this.check().await;
            this.checking.store(false, Ordering::Release);
        });
    }

    /// `PING` within the budget.
    async fn check(&self) {
        let mut connection = match self.settings.store.connection() {
            Ok(connection) => connection,
            Err(e) => return self.unreachable(RedisFallbackReason::Error, &e),
        };
        let ping = redis::cmd("PING");
        let reply =
            tokio::time::timeout(self.settings.budget, connection.send_packed_command(&ping)).await;
        match reply.map(|r| r.and_then(redis::Value::extract_error)) {
            Ok(Ok(_)) => self.answered(),
            Ok(Err(e)) => self.unreachable(RedisFallbackReason::Error, &e),
            Err(_elapsed) => self.unreachable(RedisFallbackReason::Timeout, &self.over_budget()),
        }
    }
}

impl<E, C> fmt::Debug for RedisDecider<E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDecider")
            .field("store", &self.state.settings.store)
            .field("budget", &self.state.settings.budget)
            .field("up", &(self.state.health.load(Ordering::Relaxed) == UP))
            .finish_non_exhaustive()
    }
}
