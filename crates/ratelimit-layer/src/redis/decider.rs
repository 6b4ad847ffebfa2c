//! A limit kept in Redis as the layer's remote decision ([`RedisDecider`]): the time
//! budget, the fallback to the local share, the cap on new keys, the local reservation,
//! and the probe that follows Redis while it is away (and while no request asks it).

use std::borrow::Cow;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use http::request::Parts;
use overload_core::clock::Clock;
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, spawn_ticker};
use redis::{Arg, Cmd, ErrorKind, RedisError};

use super::command::{RedisKeyName, command, evalsha};
use super::connection::RedisConnection;
use super::key::RedisKey;
use super::script::{ScriptArgs, ScriptReply, ScriptedLimit};
use super::store::RedisStore;
use crate::algorithm::{Decision, Limiter, QuotaStatus, TokenBucket};
use crate::key::{KeyExtractor, MissingKey};
use crate::keyed::KeyClass;
use crate::rate_limit::decide::MissingKeyPolicy;
use crate::rate_limit::remote_decision::{
    RemoteDecide, RemoteDecision, RemoteFallback, RemoteOutcome, RemoteStart,
};
use crate::remote_health::RemoteHealth;
use crate::reservation::{LocalReservation, ReservedDecision};
use crate::telemetry::{RedisFallbackReason, RedisLimitMetrics};

/// What a layer's Redis limit needs besides its limiter and key extractor.
pub(crate) struct RedisSettings {
    pub(crate) store: RedisStore,
    pub(crate) scripted: ScriptedLimit,
    /// `{prefix}:{name}:{algorithm}:`.
    pub(crate) namespace: Vec<u8>,
    pub(crate) budget: Duration,
    /// How often, while Redis is away, the layer probes it; and how often, while no
    /// request asks it, the layer checks it.
    pub(crate) recheck: Duration,
    pub(crate) capacity: u64,
    /// New keys per second this process may make in Redis (keyed limits).
    pub(crate) max_new_keys: u32,
    /// The local reservation's largest batch and its lease, if any.
    pub(crate) reservation: Option<(u32, Duration)>,
    pub(crate) name: LayerName,
}

/// How long the episode of new keys over the cap lasts without one: 10 s.
const OVERFLOW_QUIET: Duration = Duration::from_secs(10);

/// A limit kept in Redis: [`RemoteDecide`] for the layer.
pub(crate) struct RedisDecider<E, C> {
    state: Arc<RedisDeciderState<C>>,
    /// `None` for one global limit.
    extract: Option<E>,
    /// What to do with a request without a key (a keyed limit's, shared with the local one).
    missing: Option<Arc<MissingKeyPolicy>>,
}

/// What every decision in flight, and the probes, share.
struct RedisDeciderState<C> {
    settings: RedisSettings,
    clock: C,
    /// Whether Redis decides, with an epoch per return.
    health: RemoteHealth,
    /// Redis away: begun by the first failure (`WARN`), ended by the probe (`INFO`).
    away: Episode,
    /// The key of the decision whose failure turned Redis away: what the probe asks about,
    /// so that a Cluster is back when that key's slot answers.
    probe_key: Mutex<Option<Vec<u8>>>,
    /// Whether a request asked Redis since the last tick.
    asked: AtomicBool,
    /// Whether a probe is under way.
    probing: AtomicBool,
    /// Whether the ticker runs.
    started: AtomicBool,
    /// The cap on new keys: a token bucket of `max_new_keys` per second.
    new_keys: (TokenBucket, <TokenBucket as Limiter>::State),
    /// New keys over the cap: begun by the first (`WARN`), over after `OVERFLOW_QUIET`.
    overflowing: Episode,
    reservation: Option<LocalReservation>,
    metrics: LazyMetrics<RedisLimitMetrics>,
    /// This state, for the probes.
    this: Weak<Self>,
}

impl<E, C: Clock> RedisDecider<E, C> {
    pub(crate) fn new(
        settings: RedisSettings,
        clock: C,
        extract: Option<E>,
        missing: Option<Arc<MissingKeyPolicy>>,
    ) -> Result<Self, overload_core::ConfigError> {
        let metrics = LazyMetrics::new(settings.name.clone());
        let new_keys = TokenBucket::builder(settings.max_new_keys)
            .burst(settings.max_new_keys)
            .build()
            .map_err(|e| {
                overload_core::ConfigError::new("max_new_keys", e.kind(), e.to_string())
            })?;
        let reservation = settings.reservation.map(|(batch, lease)| {
            LocalReservation::new(batch, overload_core::clock::saturating_nanos(lease))
        });
        Ok(Self {
            state: Arc::new_cyclic(|this| RedisDeciderState {
                settings,
                clock,
                health: RemoteHealth::new(),
                away: Episode::new(),
                probe_key: Mutex::new(None),
                asked: AtomicBool::new(false),
                probing: AtomicBool::new(false),
                started: AtomicBool::new(false),
                new_keys: (new_keys, Default::default()),
                overflowing: Episode::new(),
                reservation,
                metrics,
                this: Weak::clone(this),
            }),
            extract,
            missing,
        })
    }
}

/// What a decision under way needs to know besides its command.
#[derive(Clone, Copy)]
struct Call {
    cost: u32,
    class: KeyClass,
    /// The health when the request started.
    observed: u64,
    /// Units asked for the local reservation.
    extra: u32,
}

impl<E, C> RemoteDecide for RedisDecider<E, C>
where
    E: KeyExtractor,
    E::Lookup: RedisKey,
    C: Clock,
{
    fn start(&self, parts: &Parts, cost: u32) -> RemoteStart {
        let state = &*self.state;
        let settings = &state.settings;
        if cost == 0 || u64::from(cost) > settings.capacity {
            // NOTE: free, or never admissible: the local decision is the same as Redis's,
            // without the round trip. Not a fallback.
            return RemoteStart::Local;
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
                    Some(m) if m.policy() != MissingKey::Shared => return RemoteStart::Local,
                    _ => RedisTarget::Unkeyed,
                },
            },
        };
        let observed = state.health.observe();
        if !RemoteHealth::is_up(observed) {
            state
                .metrics
                .get()
                .fallback(RedisFallbackReason::Unavailable)
                .increment(1);
            return RemoteStart::Local;
        }
        let mut extra = 0;
        if let (RedisTarget::Global, Some(reservation)) = (&target, &state.reservation) {
            let now = state.clock.now();
            match reservation.decide(now, cost) {
                Some(ReservedDecision::Allow { remaining, reset }) => {
                    let status = QuotaStatus {
                        remaining,
                        reset: Duration::from_nanos(reset),
                    };
                    return RemoteStart::Decided(Decision::Allow, status, KeyClass::Global);
                }
                Some(ReservedDecision::Reject { retry_after }) => {
                    let retry_after = Duration::from_nanos(retry_after);
                    let status = QuotaStatus {
                        remaining: 0,
                        reset: retry_after,
                    };
                    return RemoteStart::Decided(
                        Decision::Reject { retry_after },
                        status,
                        KeyClass::Global,
                    );
                }
                None => extra = reservation.claim_refill(now),
            }
        }
        let connection = match settings.store.connection() {
            Ok((connection, _)) => connection,
            Err(e) => {
                state.failed(RedisFallbackReason::Error, &e, observed, None);
                if extra > 0 {
                    state.refill_failed();
                }
                return RemoteStart::Local;
            }
        };
        let (scripted, namespace) = (&settings.scripted, settings.namespace.as_slice());
        let mut args = ScriptArgs::cost(cost);
        args.extra = extra;
        let (cmd, class) = match target {
            RedisTarget::Global => (
                command::<()>(scripted, namespace, &RedisKeyName::Global, args),
                KeyClass::Global,
            ),
            RedisTarget::Keyed(key) => {
                args.may_create = state.may_make_key();
                (
                    command(scripted, namespace, &RedisKeyName::Keyed(&*key), args),
                    KeyClass::Keyed,
                )
            }
            RedisTarget::Unkeyed => {
                // NOTE: counted here; if Redis then fails to answer, the local fallback
                // counts the request a second time.
                if let Some(missing) = self.missing.as_deref() {
                    missing.apply();
                }
                (
                    command::<()>(scripted, namespace, &RedisKeyName::Unkeyed, args),
                    KeyClass::Unkeyed,
                )
            }
        };
        // NOTE: read first, so that a busy layer does not write the shared flag per request.
        if !state.asked.load(Ordering::Relaxed) {
            state.asked.store(true, Ordering::Relaxed);
        }
        let call = Call {
            cost,
            class,
            observed,
            extra,
        };
        RemoteStart::Pending(RemoteDecision::new(decide(
            Arc::clone(&self.state),
            connection,
            cmd,
            call,
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
        let up = RemoteHealth::is_up(state.health.observe());
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

/// One decision: the script within the budget (and, for a new key over the cap, the
/// overflow limit's within what is left of it), its reply read.
async fn decide<C: Clock>(
    state: Arc<RedisDeciderState<C>>,
    mut connection: RedisConnection,
    cmd: Cmd,
    call: Call,
) -> RemoteOutcome {
    let settings = &state.settings;
    let deadline = tokio::time::Instant::now() + settings.budget;
    let mut class = call.class;
    let mut reply = state.ask(&mut connection, &cmd, deadline, call).await?;
    if reply == ScriptReply::NoSuchKey {
        // NOTE: a new key over the cap: the request is decided against the one overflow
        // limit, as the local map does at its cap.
        let now = state.clock.now();
        if state.overflowing.seen(now) {
            tracing::warn!(
                name = %settings.name,
                max_new_keys = settings.max_new_keys,
                "ratelimit-layer: more new rate-limit keys than the cap allows; their requests \
                 share one overflow limit in Redis (logged once; `INFO` once none has come \
                 for {OVERFLOW_QUIET:?})"
            );
        }
        class = KeyClass::Overflow;
        let overflow = command::<()>(
            &settings.scripted,
            &settings.namespace,
            &RedisKeyName::Overflow,
            ScriptArgs::cost(call.cost),
        );
        reply = state
            .ask(&mut connection, &overflow, deadline, call)
            .await?;
    }
    let ScriptReply::Decided {
        decision,
        mut status,
        extra,
        made,
    } = reply
    else {
        let e = RedisError::from((
            ErrorKind::Client,
            "the overflow key does not exist and may not be made",
        ));
        state.failed(RedisFallbackReason::Error, &e, call.observed, Some(&cmd));
        return Err(RemoteFallback);
    };
    let now = state.clock.now();
    if made && class == KeyClass::Keyed {
        let (bucket, taken) = &state.new_keys;
        // NOTE: a unit of the cap, whether there is one or not: requests that found one
        // left while others made keys overshoot the cap by at most their number.
        let _ = bucket.check(taken, now, 1);
    }
    if let Some(reservation) = &state.reservation {
        if call.extra > 0 {
            reservation.refilled(
                now,
                extra,
                status.remaining,
                overload_core::clock::saturating_nanos(status.reset),
            );
            // NOTE: the units this process now holds are the fleet's too.
            status.remaining = status.remaining.saturating_add(u64::from(extra));
        }
        if let (Decision::Reject { retry_after }, KeyClass::Global) = (decision, class) {
            reservation.rejected(
                now,
                overload_core::clock::saturating_nanos(retry_after),
                call.cost,
            );
        }
    }
    Ok((decision, status, class))
}

impl<C: Clock> RedisDeciderState<C> {
    /// One script call within the deadline; its failure is counted, and may turn Redis
    /// away.
    async fn ask(
        &self,
        connection: &mut RedisConnection,
        cmd: &Cmd,
        deadline: tokio::time::Instant,
        call: Call,
    ) -> Result<ScriptReply, RemoteFallback> {
        let scripted = &self.settings.scripted;
        let reply =
            tokio::time::timeout_at(deadline, evalsha(connection, cmd, scripted.code)).await;
        let failure = match reply {
            Ok(Ok(value)) => match scripted.read_reply(&value, call.cost) {
                Ok(reply) => return Ok(reply),
                Err(unexpected) => (
                    RedisFallbackReason::Error,
                    RedisError::from((
                        ErrorKind::Client,
                        "unexpected reply from the rate limit script",
                        unexpected.0,
                    )),
                ),
            },
            Ok(Err(e)) => (RedisFallbackReason::Error, e),
            Err(_elapsed) => (RedisFallbackReason::Timeout, self.over_budget()),
        };
        self.failed(failure.0, &failure.1, call.observed, Some(cmd));
        if call.extra > 0 {
            self.refill_failed();
        }
        Err(RemoteFallback)
    }

    /// Whether a keyed request may make its key in Redis: while the cap on new keys has a
    /// unit left.
    fn may_make_key(&self) -> bool {
        let (bucket, taken) = &self.new_keys;
        bucket.status(taken, self.clock.now()).remaining >= 1
    }

    fn refill_failed(&self) {
        if let Some(reservation) = &self.reservation {
            reservation.refill_failed();
        }
    }

    fn over_budget(&self) -> RedisError {
        RedisError::from((
            ErrorKind::Io,
            "no answer within the time budget",
            format!("{:?}", self.settings.budget),
        ))
    }

    /// A request that started at `observed` could not be decided in Redis: it falls back,
    /// counted; and Redis is away, unless it came back since the request started.
    fn failed(
        &self,
        reason: RedisFallbackReason,
        error: &RedisError,
        observed: u64,
        cmd: Option<&Cmd>,
    ) {
        self.metrics.get().fallback(reason).increment(1);
        if self.turned_away(reason, error, observed) {
            // NOTE: the key (the command's fourth argument) is what the probe asks about.
            let key = cmd.and_then(|cmd| match cmd.args_iter().nth(3) {
                Some(Arg::Simple(key)) => Some(key.to_vec()),
                _ => None,
            });
            *self
                .probe_key
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = key;
            self.spawn_probe();
        }
    }

    /// Turns Redis away after a failure seen by something that started at `observed`;
    /// `true` if this did (and logged it).
    fn turned_away(&self, reason: RedisFallbackReason, error: &RedisError, observed: u64) -> bool {
        if !self.health.fail(observed) {
            tracing::debug!(
                name = %self.settings.name,
                reason = reason.as_str(),
                error = %error,
                "Redis did not decide a request (already away, or back since it started)"
            );
            return false;
        }
        self.metrics.get().up.set(0.0);
        let now = self.clock.now();
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
        true
    }

    /// Redis answered the probe within the budget: decisions go to Redis again, and the
    /// episode of Redis away ends.
    fn recovered(&self) {
        if self.health.recover() {
            self.metrics.get().up.set(1.0);
            *self
                .probe_key
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = None;
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

    /// Once a recheck interval while the layer lives: probes Redis while it is away, and
    /// while it is up but no request asked it since the last tick, so that its loss and
    /// its return are seen, logged and reported without traffic.
    fn tick(&self) {
        let asked = self.asked.swap(false, Ordering::Relaxed);
        if let Some(ended) = self.overflowing.quiet_for(OVERFLOW_QUIET, self.clock.now()) {
            tracing::info!(
                name = %self.settings.name,
                lasted = ?ended.lasted,
                "ratelimit-layer: new rate-limit keys within the cap again"
            );
        }
        if asked && RemoteHealth::is_up(self.health.observe()) {
            // NOTE: requests asked it: their failures would have turned it away.
            return;
        }
        self.spawn_probe();
    }

    fn spawn_probe(&self) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (Some(this), Ok(runtime)) =
            (self.this.upgrade(), tokio::runtime::Handle::try_current())
        else {
            self.probing.store(false, Ordering::Release);
            return;
        };
        runtime.spawn(async move {
            this.probe().await;
            this.probing.store(false, Ordering::Release);
        });
    }

    /// Asks Redis about the key whose decision failed (`EXISTS`, which goes to that key's
    /// node in a Cluster), or `PING`s it: an answer within the budget brings it back. A
    /// connection that does not answer within the response timeout is replaced at once (a
    /// black hole), and the new one asked.
    async fn probe(&self) {
        let observed = self.health.observe();
        let key = self
            .probe_key
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let probe = match &key {
            Some(key) => {
                let mut exists = redis::cmd("EXISTS");
                exists.arg(key.as_slice());
                exists
            }
            None => redis::cmd("PING"),
        };
        let store = &self.settings.store;
        let response_timeout = store.response_timeout();
        // NOTE: at most three rounds: a silent connection replaced, a new connection's
        // first answer (which includes its set-up), and one more.
        let mut fresh = false;
        for _ in 0..3 {
            let (mut connection, generation) = match store.connection() {
                Ok(connection) => connection,
                Err(e) => {
                    self.turned_away(RedisFallbackReason::Error, &e, observed);
                    return;
                }
            };
            let sent = tokio::time::Instant::now();
            let reply = tokio::time::timeout(response_timeout, connection.send(&probe)).await;
            match reply.map(|r| r.and_then(redis::Value::extract_error)) {
                Ok(Ok(_)) if sent.elapsed() <= self.settings.budget => {
                    self.recovered();
                    return;
                }
                Ok(Ok(_)) if fresh => fresh = false,
                Ok(Ok(_)) => {
                    self.turned_away(RedisFallbackReason::Timeout, &self.over_budget(), observed);
                    return;
                }
                Ok(Err(e)) => {
                    self.turned_away(RedisFallbackReason::Error, &e, observed);
                    return;
                }
                Err(_elapsed) => {
                    let e = RedisError::from((
                        ErrorKind::Io,
                        "no answer within the response timeout: connection replaced",
                        format!("{response_timeout:?}"),
                    ));
                    self.turned_away(RedisFallbackReason::Timeout, &e, observed);
                    tracing::info!(
                        name = %self.settings.name,
                        redis = %store.addr(),
                        ?response_timeout,
                        "ratelimit-layer: the connection to Redis left a command unanswered \
                         for the response timeout; a new connection replaces it"
                    );
                    if let Err(e) = store.replace(generation) {
                        self.turned_away(RedisFallbackReason::Error, &e, observed);
                        return;
                    }
                    fresh = true;
                }
            }
        }
    }
}

impl<E, C> fmt::Debug for RedisDecider<E, C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisDecider")
            .field("store", &self.state.settings.store)
            .field("budget", &self.state.settings.budget)
            .field("up", &RemoteHealth::is_up(self.state.health.observe()))
            .field("reservation", &self.state.reservation.is_some())
            .finish_non_exhaustive()
    }
}
