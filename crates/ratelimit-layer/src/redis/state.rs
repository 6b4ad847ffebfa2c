//! What every decision of a limit kept in Redis shares ([`RedisDeciderState`]): the
//! settings, the health of Redis and its episodes, the cap on new keys, the local
//! reservation; one script call within a deadline, the failures and the return; and the
//! recheck ticker and the probe that follows Redis while it is away (and while no request
//! asks it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use overload_core::ConfigError;
use overload_core::clock::{Clock, saturating_nanos};
use overload_core::telemetry::{Episode, LayerName, LazyMetrics, Ticker};
use redis::{Arg, Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use tokio::sync::Notify;

use super::command::{eval, evalsha};
use super::connection::RedisConnection;
use super::script::{ScriptReply, ScriptedLimit};
use super::secret::FleetSecret;
use super::store::RedisStore;
use crate::algorithm::{Limiter, TokenBucket};
use crate::keyed::KeyClass;
use crate::remote_health::{RemoteFailure, RemoteHealth};
use crate::reservation::LocalReservation;
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
    /// New keys per second this process may make in Redis (keyed limits), and networks'
    /// overflow keys.
    pub(crate) max_new_keys: u32,
    /// The secret keys are named with.
    pub(crate) secret: FleetSecret,
    /// The local reservation's largest batch and its lease, if any.
    pub(crate) reservation: Option<(u32, Duration)>,
    /// Failed decisions counted in a row that turn Redis away.
    pub(crate) away_after: u32,
    pub(crate) name: LayerName,
}

/// How long the episode of new keys over the cap lasts without one: 10 s.
pub(super) const OVERFLOW_QUIET: Duration = Duration::from_secs(10);

/// What every decision in flight, and the probes, share.
pub(super) struct RedisDeciderState<C> {
    pub(super) settings: RedisSettings,
    pub(super) clock: C,
    /// Whether Redis decides: the streak of failed decisions, with a generation per change.
    pub(super) health: RemoteHealth,
    /// Redis away: begun by the failure that turned it away (`WARN`), ended by the probe
    /// (`INFO`).
    pub(super) away: Episode,
    /// The key of the decision whose failure turned Redis away: what the probe asks about,
    /// so that a Cluster is back when that key's slot answers.
    pub(super) probe_key: Mutex<Option<Vec<u8>>>,
    /// Whether a decision met a replica (`READONLY`): a failover behind one address (a DNS
    /// name, a proxy) left the connection on the old master; the probe replaces it.
    pub(super) read_only: AtomicBool,
    /// Whether a request asked Redis since the last tick.
    pub(super) asked: AtomicBool,
    /// Whether Redis has run the script for this layer: its calls send the hash then.
    script_cached: AtomicBool,
    /// Whether a probe is under way: set when one is spawned, reset by its task's guard
    /// when the task goes, however it goes ([`ProbeGuard`]).
    pub(super) probing: AtomicBool,
    /// Whether the probe spawned last has started to run.
    probe_ran: AtomicBool,
    /// When the last probe was spawned (only the spawning path takes the lock).
    probe_spawned: Mutex<Option<tokio::time::Instant>>,
    /// Probes spawned (tests).
    #[cfg(test)]
    probes: std::sync::atomic::AtomicUsize,
    /// The recheck: started by a request, and again by a later request once the runtime
    /// that ran it has shut down.
    ticker: Ticker,
    /// The cap on new keys: a token bucket of `max_new_keys` per second.
    pub(super) new_keys: (TokenBucket, <TokenBucket as Limiter>::State),
    /// The cap on new networks' overflow keys past the cap on new keys: a token bucket of
    /// `max_new_keys` per second too.
    pub(super) new_networks: (TokenBucket, <TokenBucket as Limiter>::State),
    /// New keys over the cap: begun by the first (`WARN`), over after `OVERFLOW_QUIET`.
    pub(super) overflowing: Episode,
    pub(super) reservation: Option<LocalReservation>,
    /// Woken when a request that asked for a batch of the reservation has its answer (or
    /// gave up), so that the requests that waited for it look again.
    pub(super) refill_done: Notify,
    pub(super) metrics: LazyMetrics<RedisLimitMetrics>,
    /// This state, for the probes.
    pub(super) this: Weak<Self>,
}

/// What a decision under way needs to know besides its command.
#[derive(Clone, Copy)]
pub(super) struct Call {
    pub(super) cost: u32,
    /// The units the request may not take: its level's held-back share (0: none).
    pub(super) held: u64,
    pub(super) class: KeyClass,
    /// The health when the request started.
    pub(super) observed: u64,
    /// Whether a request waits for this call (a decision, or a batch that requests wait
    /// for): only then does its failure count towards turning Redis away. A batch asked
    /// for ahead, while the process still holds units, fails no request.
    pub(super) awaited: bool,
}

/// Owned by a probe's task from when the task is made: the probe is over when the task
/// goes, whether it ends, or is dropped unpolled by a runtime that shuts down.
struct ProbeGuard<C>(Arc<RedisDeciderState<C>>);

impl<C> Drop for ProbeGuard<C> {
    fn drop(&mut self) {
        self.0.probing.store(false, Ordering::Release);
    }
}

/// Owned by a recheck of the secret's task from when the task is made, as [`ProbeGuard`].
struct SecretCheckGuard<C>(Arc<RedisDeciderState<C>>);

impl<C> Drop for SecretCheckGuard<C> {
    fn drop(&mut self) {
        self.0.settings.secret.recheck_done();
    }
}

impl<C: Clock> RedisDeciderState<C> {
    pub(super) fn new(settings: RedisSettings, clock: C) -> Result<Arc<Self>, ConfigError> {
        let metrics = LazyMetrics::new(settings.name.clone());
        let new_keys = TokenBucket::builder(settings.max_new_keys)
            .burst(settings.max_new_keys)
            .build()
            .map_err(|e| ConfigError::new("max_new_keys", e.kind(), e.to_string()))?;
        let reservation = settings
            .reservation
            .map(|(batch, lease)| LocalReservation::new(batch, saturating_nanos(lease)));
        let health = RemoteHealth::new(settings.away_after);
        Ok(Arc::new_cyclic(|this| Self {
            settings,
            clock,
            health,
            away: Episode::new(),
            probe_key: Mutex::new(None),
            read_only: AtomicBool::new(false),
            asked: AtomicBool::new(false),
            script_cached: AtomicBool::new(false),
            probing: AtomicBool::new(false),
            probe_ran: AtomicBool::new(false),
            probe_spawned: Mutex::new(None),
            #[cfg(test)]
            probes: std::sync::atomic::AtomicUsize::new(0),
            ticker: Ticker::new(),
            new_networks: (new_keys.clone(), Default::default()),
            new_keys: (new_keys, Default::default()),
            overflowing: Episode::new(),
            reservation,
            refill_done: Notify::new(),
            metrics,
            this: Weak::clone(this),
        }))
    }

    /// On every request: starts the recheck ticker if it does not run (the layer's first
    /// request, or the first on a runtime after the one that ran it shut down).
    #[inline]
    pub(super) fn start_ticker(self: &Arc<Self>) {
        self.ticker
            .start(self, self.settings.recheck, Self::first_request, Self::tick);
    }

    fn first_request(&self) {
        // NOTE: decisions go to Redis until failures turn it away, so the gauge starts at 1.
        let up = RemoteHealth::is_up(self.health.observe());
        self.metrics.get().up.set(if up { 1.0 } else { 0.0 });
    }

    /// One script call within the deadline: its answer ends a streak of failures; its
    /// failure is counted towards turning Redis away (if a request waits for it), and its
    /// reason returned (the caller counts its request's fallback).
    pub(super) async fn ask(
        &self,
        connection: &mut RedisConnection,
        cmd: &Cmd,
        deadline: tokio::time::Instant,
        call: Call,
    ) -> Result<ScriptReply, RedisFallbackReason> {
        let reply = tokio::time::timeout_at(deadline, self.call_script(connection, cmd)).await;
        self.judge(reply.map_err(drop), cmd, call)
    }

    /// The script's call: `EVALSHA`, or, until Redis has answered one call of this layer,
    /// `EVAL` with the code.
    pub(super) async fn call_script(
        &self,
        connection: &mut RedisConnection,
        cmd: &Cmd,
    ) -> Result<Value, RedisError> {
        let code = self.settings.scripted.code;
        // NOTE: until Redis has answered one call, the script may not be cached there:
        // `EVAL` with its code costs one round trip, where `EVALSHA` and `NOSCRIPT` would
        // cost two (and a layer's first decisions their budget, on a Redis a few
        // milliseconds away).
        if self.script_cached.load(Ordering::Relaxed) {
            evalsha(connection, cmd, code).await
        } else {
            eval(connection, cmd, code).await
        }
    }

    /// What a script call within its deadline (`Ok`), or past it (`Err`), says; see
    /// [`ask`](Self::ask).
    pub(super) fn judge(
        &self,
        reply: Result<Result<Value, RedisError>, ()>,
        cmd: &Cmd,
        call: Call,
    ) -> Result<ScriptReply, RedisFallbackReason> {
        let failure = match reply {
            Ok(Ok(value)) => match self
                .settings
                .scripted
                .read_reply_held(&value, call.cost, call.held)
            {
                Ok(reply) => {
                    if !self.script_cached.load(Ordering::Relaxed) {
                        self.script_cached.store(true, Ordering::Relaxed);
                    }
                    self.health.succeeded();
                    return Ok(reply);
                }
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
            Err(()) => (RedisFallbackReason::Timeout, self.over_budget()),
        };
        if call.awaited {
            self.failed(failure.0, &failure.1, call.observed, Some(cmd));
        } else {
            if failure.1.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
                self.read_only.store(true, Ordering::Release);
            }
            tracing::debug!(
                name = %self.settings.name,
                reason = failure.0.as_str(),
                error = %failure.1,
                "Redis did not answer a batch asked for ahead (not counted: no request \
                 waited for it)"
            );
        }
        Err(failure.0)
    }

    /// Whether a keyed request may make its key in Redis: while the cap on new keys has a
    /// unit left.
    pub(super) fn may_make_key(&self) -> bool {
        let (bucket, taken) = &self.new_keys;
        bucket.status(taken, self.clock.now()).remaining >= 1
    }

    /// Whether a network's overflow key may be made in Redis: while the cap on new
    /// networks has a unit left.
    pub(super) fn may_make_network(&self) -> bool {
        let (bucket, taken) = &self.new_networks;
        bucket.status(taken, self.clock.now()).remaining >= 1
    }

    /// Reads the secret kept in Redis again when it is due (every
    /// [`SECRET_RECHECK_TICKS`](super::secret::SECRET_RECHECK_TICKS) ticks), in a task of
    /// its own, within the store's response timeout.
    fn recheck_secret(&self) {
        if !self.settings.secret.recheck_due() {
            return;
        }
        let (Some(this), Ok(runtime)) =
            (self.this.upgrade(), tokio::runtime::Handle::try_current())
        else {
            self.settings.secret.recheck_done();
            return;
        };
        // NOTE: the guard is moved into the task when it is made, so that a runtime that
        // drops the task unpolled ends the recheck all the same.
        let guard = SecretCheckGuard(this);
        runtime.spawn(async move {
            let guard = guard;
            let state = &guard.0;
            let settings = &state.settings;
            if let Ok((mut connection, _)) = settings.store.connection() {
                let _ = tokio::time::timeout(
                    settings.store.response_timeout(),
                    settings
                        .secret
                        .recheck(&mut connection, settings.name.as_str()),
                )
                .await;
            }
        });
    }

    pub(super) fn over_budget(&self) -> RedisError {
        RedisError::from((
            ErrorKind::Io,
            "no answer within the time budget",
            format!("{:?}", self.settings.budget),
        ))
    }

    /// A request asks Redis: the next tick need not check it.
    #[inline]
    pub(super) fn mark_asked(&self) {
        // NOTE: read first, so that a busy layer does not write the shared flag per request.
        if !self.asked.load(Ordering::Relaxed) {
            self.asked.store(true, Ordering::Relaxed);
        }
    }

    /// A request decided locally instead of in Redis, counted.
    pub(super) fn fell_back(&self, reason: RedisFallbackReason) {
        self.metrics.get().fallback(reason).increment(1);
    }

    /// A decision (or a batch of the reservation) that started at `observed` got no answer
    /// within its budget, or an error: one more failure in the streak, unless the health
    /// changed since it started; the one that completes the streak turns Redis away.
    pub(super) fn failed(
        &self,
        reason: RedisFallbackReason,
        error: &RedisError,
        observed: u64,
        cmd: Option<&Cmd>,
    ) {
        if error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly) {
            self.read_only.store(true, Ordering::Release);
        }
        match self.health.fail(observed) {
            RemoteFailure::TurnedAway => {
                // NOTE: the key (the command's fourth argument) is what the probe asks about.
                let key = cmd.and_then(|cmd| match cmd.args_iter().nth(3) {
                    Some(Arg::Simple(key)) => Some(key.to_vec()),
                    _ => None,
                });
                *self
                    .probe_key
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = key;
                self.went_away(reason, error);
                self.spawn_probe();
            }
            RemoteFailure::Counted => tracing::debug!(
                name = %self.settings.name,
                reason = reason.as_str(),
                error = %error,
                streak = RemoteHealth::streak(self.health.observe()),
                away_after = self.settings.away_after,
                "Redis did not decide a request; Redis is left after more in a row"
            ),
            RemoteFailure::Ignored => tracing::debug!(
                name = %self.settings.name,
                reason = reason.as_str(),
                error = %error,
                "Redis did not decide a request (away already, or a failure or an answer \
                 was counted since it started)"
            ),
        }
    }

    /// The probe that started at `observed` met an error, or no answer within the response
    /// timeout: Redis is away at once, unless the health changed since.
    fn probe_failed(&self, reason: RedisFallbackReason, error: &RedisError, observed: u64) {
        if self.health.turn_away(observed) {
            self.went_away(reason, error);
        }
    }

    /// Redis was just turned away: the gauge, and the episode's `WARN`.
    fn went_away(&self, reason: RedisFallbackReason, error: &RedisError) {
        self.metrics.get().up.set(0.0);
        if self.away.seen(self.clock.now()) {
            tracing::warn!(
                name = %self.settings.name,
                redis = %self.settings.store.addr(),
                reason = reason.as_str(),
                error = %error,
                "Redis cannot decide the rate limit: each process applies its local share \
                 until Redis answers again (logged once; `INFO` when it does)"
            );
        }
    }

    /// Redis answered the probe: decisions go to Redis again, and the episode of Redis away
    /// ends.
    pub(super) fn recovered(&self) {
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
    pub(super) fn tick(&self) {
        let asked = self.asked.swap(false, Ordering::Relaxed);
        self.recheck_secret();
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

    /// Spawns a probe on the current runtime, unless one is under way; and at most one per
    /// recheck interval on a runtime that drops what is spawned on it before running it
    /// (one shutting down), never one per request.
    pub(super) fn spawn_probe(&self) {
        if self.probing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (Some(this), Ok(runtime)) =
            (self.this.upgrade(), tokio::runtime::Handle::try_current())
        else {
            self.probing.store(false, Ordering::Release);
            return;
        };
        let mut spawned = self
            .probe_spawned
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let now = tokio::time::Instant::now();
        // NOTE: a probe spawned less than a recheck interval ago that never ran: the
        // runtime dropped it unpolled (it is shutting down). Wait for the interval.
        if !self.probe_ran.load(Ordering::Acquire)
            && spawned.is_some_and(|at| now < at + self.settings.recheck)
        {
            drop(spawned);
            self.probing.store(false, Ordering::Release);
            return;
        }
        self.probe_ran.store(false, Ordering::Release);
        *spawned = Some(now);
        drop(spawned);
        #[cfg(test)]
        self.probes.fetch_add(1, Ordering::Relaxed);
        // NOTE: the guard is moved into the future when it is made, not when it is first
        // polled: a runtime that drops the task unpolled resets the flag all the same.
        let guard = ProbeGuard(this);
        runtime.spawn(async move {
            let guard = guard;
            guard.0.probe_ran.store(true, Ordering::Release);
            guard.0.probe().await;
        });
    }

    /// Asks Redis about the key whose decision failed (`EXISTS`, which goes to that key's
    /// node in a Cluster), or `PING`s it: an answer within the response timeout brings it
    /// back (the decisions' budget then judges whether it is fast enough). A connection
    /// that does not answer within the response timeout (by this probe's timer, or by a
    /// Cluster client's own) is replaced at once (a black hole, a Cluster client stuck),
    /// and the new one asked.
    pub(super) async fn probe(&self) {
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
        if self.read_only.swap(false, Ordering::AcqRel) {
            // NOTE: a new connection, to whatever the address names now.
            if let Ok((_, generation)) = store.connection() {
                let _ = store.replace(generation);
            }
        }
        // NOTE: at most two rounds: the connection in place, and a new one in its place.
        for round in 0..2 {
            let (mut connection, generation) = match store.connection() {
                Ok(connection) => connection,
                Err(e) => {
                    self.probe_failed(RedisFallbackReason::Error, &e, observed);
                    return;
                }
            };
            let reply = tokio::time::timeout(response_timeout, connection.send(&probe)).await;
            let e = match reply.map(|r| r.and_then(Value::extract_error)) {
                Ok(Ok(_)) => {
                    self.recovered();
                    if store.is_cluster() {
                        // NOTE: the nodes as they are now, for a connection made anew.
                        let slots = redis::cmd("CLUSTER").arg("SLOTS").to_owned();
                        let reply =
                            tokio::time::timeout(response_timeout, connection.send(&slots)).await;
                        if let Ok(Ok(reply)) = reply {
                            store.learn_nodes(&reply);
                        }
                    }
                    return;
                }
                Ok(Err(e)) if !e.is_timeout() => {
                    self.probe_failed(RedisFallbackReason::Error, &e, observed);
                    return;
                }
                // NOTE: redis-rs's Cluster client times a command out itself, after the
                // same response timeout: both timers end within the same millisecond, and
                // the command, polled first, nearly always reports the client's. That error
                // is the silence this probe looks for, not an answer, and replaces the
                // connection as this probe's own timeout does. A Cluster client may stop
                // answering for good (redis-rs 1.2, under a failover: its task can wait
                // forever for a lock that a request it no longer polls holds), and only a
                // new one helps.
                Ok(Err(_)) | Err(_) => RedisError::from((
                    ErrorKind::Io,
                    "no answer within the response timeout: connection replaced",
                    format!("{response_timeout:?}"),
                )),
            };
            self.probe_failed(RedisFallbackReason::Timeout, &e, observed);
            if round == 1 {
                return;
            }
            tracing::info!(
                name = %self.settings.name,
                redis = %store.addr(),
                ?response_timeout,
                "ratelimit-layer: the connection to Redis left a command unanswered for the \
                 response timeout; a new connection replaces it"
            );
            if let Err(e) = store.replace(generation) {
                self.probe_failed(RedisFallbackReason::Error, &e, observed);
                return;
            }
        }
    }
}

#[cfg(test)]
#[path = "state_tests.rs"]
mod tests;
